//! A rank's view of the job: who it is, the store everyone shares, a job-unique id and barriers.
//! Who hosts the store: docs/ARCHITECTURE.md, "Who hosts the store"; the keys (`nvfipc/context/`)
//! are listed in docs/PROTOCOL.md section 2.

use crate::barrier::{self, BarrierState};
use crate::config;
use crate::error::{Error, Result, Status};
use crate::logging;
use crate::names::context as names;
use crate::node::NodeIdentity;
use crate::os::net::is_this_machine;
use crate::store::client::ConnectOptions;
use crate::store::server::StoreServer;
use crate::store::{Liveness, Store, DEFAULT_TIMEOUT};
use crate::sync::lock;
use claim::{agree_on_job_id, claim_rank, Hello, RankClaim, Said};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod claim;
mod collision;
mod env;

pub use env::RankInfo;
use env::{EnvConfig, StoreSource};

/// Cap of how long a hosting rank waits for the others before it stops the store (by default it
/// waits its context's timeout, capped at this).
pub const DEFAULT_HOST_LINGER: Duration = Duration::from_secs(30);

const DEFAULT_JOB_TAG: &str = "default";
/// Poll interval of the hosting rank while it waits for the others to finish.
const LINGER_POLL: Duration = Duration::from_millis(10);
/// How long a rank serving a host's store waits, once every rank closed, for the others to hang up.
const SERVED_REPLY_GRACE: Duration = Duration::from_millis(100);

/// Whether a rank hosts the store it connects to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hosting {
    Connect,
    /// Failing to listen is an error.
    Host,
    /// Host it if this rank wins the election (its bind succeeds); connect otherwise.
    Candidate,
}

/// What [`Context::new`] needs: the rank's place in the job and a store that is already there.
pub struct ContextOptions {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub store: Arc<dyn Store>,
}

/// Settings of [`Context::from_env`] that the environment does not give.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvOptions {
    /// Default timeout of store operations and barriers; `None`: `NVFIPC_TIMEOUT_MS`, else 300 s.
    pub timeout: Option<Duration>,
    /// How long a hosting rank waits for the others when it closes; `None` (the default): the
    /// context's timeout, at most [`DEFAULT_HOST_LINGER`].
    pub host_linger: Option<Duration>,
    /// Name of this run; `None`: from the launcher's environment.
    pub job_tag: Option<String>,
}

/// One rank's handle on the job. `Send + Sync`; share it with `Arc`.
pub struct Context {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    /// The store every rank of the job uses.
    pub store: Arc<dyn Store>,
    /// Unique per run of the job; names node-local resources such as shared memory.
    pub job_id: String,
    /// The store server, when this rank hosts it.
    server: Mutex<Option<StoreServer>>,
    /// The key that holds `job_id`; deleted by the last rank to close.
    job_key: String,
    /// This rank's claim of its place in the run, and what it said of the job before.
    claim: RankClaim,
    hello: Hello,
    /// Set once a barrier has checked the claim.
    claim_checked: AtomicBool,
    timeout: Duration,
    host_linger: Duration,
    barriers: BarrierState,
    closed: bool,
}

impl Context {
    /// A context over a store the caller already has. The default timeout is the store's.
    pub fn new(options: ContextOptions) -> Result<Context> {
        let ranks = RankInfo::new(
            options.rank,
            options.world_size,
            options.local_rank,
            options.local_world_size,
        )?;
        let timeout = options.store.default_timeout();
        Self::start(ranks, options.store, None, Said::caller(), timeout)
    }

    /// Connects to the store at `host:port`; with `host_store`, first hosts it here (listening
    /// on every interface; port 0 picks a free one). Local rank and size are taken to equal
    /// rank and world size (one node); use [`Context::new`] or [`Context::from_env`] otherwise.
    pub fn connect(
        rank: usize,
        world_size: usize,
        host: &str,
        port: u16,
        host_store: bool,
        timeout: Duration,
    ) -> Result<Context> {
        let ranks = RankInfo::new(rank, world_size, rank, world_size)?;
        let hosting = if host_store {
            Hosting::Host
        } else {
            Hosting::Connect
        };
        Self::open(ranks, host, port, hosting, timeout, Said::caller())
    }

    /// Builds the context from the launcher's environment (docs/CONFIGURATION.md). Without
    /// `NVFIPC_STORE_ADDR`, local rank 0 on the master host hosts the store on the master port.
    pub fn from_env(options: &EnvOptions) -> Result<Context> {
        let config = EnvConfig::from_env()?;
        Self::from_config(&config, options)
    }

    /// Like [`Context::from_env`], from an already parsed environment.
    pub fn from_config(config: &EnvConfig, options: &EnvOptions) -> Result<Context> {
        let timeout = options
            .timeout
            .or(config.timeout)
            .unwrap_or(DEFAULT_TIMEOUT);
        let (tag, tag_from) = (options.job_tag.clone().map(|t| (t, "EnvOptions")))
            .or_else(|| config.job_tag.clone())
            .unwrap_or_else(|| (DEFAULT_JOB_TAG.to_string(), "no tag or launcher job id"));
        let said = Said {
            tag,
            tag_from,
            world_from: config.world_from,
        };
        let hosting = match &config.store {
            StoreSource::Master(addr)
                if config.ranks.local_rank == 0 && is_this_machine(&addr.host) =>
            {
                Hosting::Candidate
            }
            _ => Hosting::Connect,
        };
        let addr = config.store.addr();
        let mut ctx = Self::open(config.ranks, &addr.host, addr.port, hosting, timeout, said)?;
        if let Some(linger) = options.host_linger {
            ctx.host_linger = linger;
        }
        Ok(ctx)
    }

    fn open(
        ranks: RankInfo,
        host: &str,
        port: u16,
        hosting: Hosting,
        timeout: Duration,
        said: Said,
    ) -> Result<Context> {
        let who = format!("rank {} of {}", ranks.rank, ranks.world_size);
        // Election: the candidate whose bind succeeds hosts.
        let server = if hosting != Hosting::Connect {
            match crate::store::serve_embedded("", port) {
                Ok(server) => Some(server),
                Err(e) if hosting == Hosting::Candidate && port != 0 && is_addr_in_use(&e) => None,
                Err(e) => {
                    return Err(e.context(format!(
                        "{who}: hosting the store on port {port} (pick a free port with \
                         NVFUSER_MASTER_PORT/MASTER_PORT, or point {} at a running store)",
                        config::STORE_ADDR_VAR
                    )))
                }
            }
        } else {
            None
        };
        let port = server.as_ref().map_or(port, StoreServer::port);
        let connect = ConnectOptions::with_timeout(timeout);
        let lost_election = hosting == Hosting::Candidate && server.is_none();
        let store = crate::store::connect(host, port, &connect).map_err(|e| {
            let why = if lost_election {
                format!(
                    " (port {port} was taken when this rank tried to host the store there: \
                     another node's rank hosts it, or another program uses the port; if so, pick \
                     a free port with NVFUSER_MASTER_PORT/MASTER_PORT)"
                )
            } else {
                String::new()
            };
            e.context(format!(
                "{who}: connecting to the store at {host}:{port}{why}"
            ))
        })?;
        Self::start(ranks, Arc::new(store), server, said, timeout)
    }

    /// Says what this rank takes the job to be, claims its place, agrees on the job id and
    /// announces this rank.
    fn start(
        ranks: RankInfo,
        store: Arc<dyn Store>,
        server: Option<StoreServer>,
        said: Said,
        timeout: Duration,
    ) -> Result<Context> {
        logging::set_rank(ranks.rank as i64);
        let started = std::time::Instant::now();
        let who = format!("rank {} of {}", ranks.rank, ranks.world_size);
        let tag = &said.tag;
        let hello = Hello::say(&*store, &ranks, &said, timeout)
            .and_then(|hello| Ok((claim_rank(&*store, &ranks, tag, &hello, timeout)?, hello)));
        let (claim, hello) = hello.map_err(|e| e.context(who.clone()))?;
        let (job_key, agreed) = agree_on_job_id(&*store, &claim, &ranks, timeout)
            .map_err(|e| e.context(format!("{who}: agreeing on the job id")))?;
        let job_id = String::from_utf8(agreed)
            .ok()
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()))
            .ok_or_else(|| {
                Error::protocol(format!(
                    "{who}: the store key {job_key} does not hold a job id; another program \
                     uses this key"
                ))
            })?;
        store
            .set(
                &names::joined(&job_id, ranks.rank),
                NodeIdentity::local().encode().as_bytes(),
            )
            .map_err(|e| e.context(format!("{who}: announcing this rank")))?;
        crate::departures::note_world(&job_id, ranks.world_size);
        log::info!(
            target: logging::STORE,
            "context: {who} (local {} of {}), tag {tag:?}, run {}, job id {job_id}, {} store, \
             ready after {}",
            ranks.local_rank,
            ranks.local_world_size,
            claim.run,
            if server.is_some() { "hosting the" } else { "connected to the" },
            logging::took(started.elapsed())
        );
        Ok(Context {
            rank: ranks.rank,
            world_size: ranks.world_size,
            local_rank: ranks.local_rank,
            local_world_size: ranks.local_world_size,
            barriers: BarrierState::scoped(&job_id),
            store,
            job_id,
            server: Mutex::new(server),
            job_key,
            claim,
            hello,
            claim_checked: AtomicBool::new(false),
            timeout,
            host_linger: timeout.min(DEFAULT_HOST_LINGER),
            closed: false,
        })
    }

    /// Default timeout of barriers and of the store operations done for this context.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// How long a hosting rank waits for the others when it closes (by default the timeout
    /// the context was created with, at most [`DEFAULT_HOST_LINGER`]).
    pub fn set_host_linger(&mut self, linger: Duration) {
        self.host_linger = linger;
    }

    /// The port of the store server this rank hosts, if it hosts one.
    pub fn hosted_store_port(&self) -> Option<u16> {
        lock(&self.server).as_ref().map(StoreServer::port)
    }

    /// Barrier over the world (`None`) or the listed ranks, which must include this rank.
    /// `timeout` `None` uses the context's default. Returns the generation that completed.
    pub fn barrier(&self, members: Option<&[usize]>, timeout: Option<Duration>) -> Result<u64> {
        let who = format!("rank {} of {}", self.rank, self.world_size);
        let (mut skip, limit) = (false, timeout.unwrap_or(self.timeout));
        // The first barrier first waits for its members to join, reading what they said of the
        // job, so that ranks that disagree on it are told at once (see `claim::Hello`).
        if !self.claim_checked.load(Ordering::Relaxed) {
            let set = barrier::MemberSet::new(self.rank, self.world_size, members)?;
            let joined: Vec<String> =
                (set.ranks().iter().map(|r| names::joined(&self.job_id, *r))).collect();
            let keys: Vec<&str> = joined.iter().map(String::as_str).collect();
            let waited = self
                .hello
                .wait(&*self.store, &keys, set.ranks(), Instant::now() + limit);
            // A timeout is left for the barrier to diagnose (it names the missing ranks).
            match waited {
                Err(e) if e.status == Status::Timeout => skip = true,
                waited => waited.map_err(|e| e.context(&who))?,
            }
        }
        let gen = barrier::barrier(
            &*self.store,
            &self.barriers,
            self.rank,
            self.world_size,
            members,
            if skip { Duration::ZERO } else { limit },
        )
        .map_err(|e| match skip {
            true => {
                let took = format!("after {} ms", limit.as_millis()); // the wait before took it
                Error::new(e.status, e.message.replacen("after 0 ms", &took, 1)).context(&who)
            }
            false => e,
        })?;
        // A rank claimed twice (two jobs on one store without distinct job tags) before the
        // first barrier completed is seen here, on both processes, before the job goes on; one
        // claimed later is seen at close.
        if gen == 0 && !self.claim_checked.swap(true, Ordering::Relaxed) {
            self.claim
                .check_duplicate(&*self.store)
                .map_err(|e| e.context(&who))?;
        }
        Ok(gen)
    }

    /// Announces that this rank is done and, on the hosting rank, waits (bounded by the host
    /// linger) for the other ranks before stopping the store. Dropping does the same but can
    /// only print what went wrong.
    pub fn close(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let announced = self.announce_close();
        let server = lock(&self.server).take();
        let Some(server) = server else {
            return announced.and(self.keep_serving_until_others_close());
        };
        let deadline = Instant::now() + self.host_linger;
        let waited = self.wait_for_others(&server, deadline);
        // Drop this rank's connection so that the server can see the last client leave.
        self.store = Arc::new(ClosedStore);
        let idle = server.shutdown_when_idle(deadline.saturating_duration_since(Instant::now()));
        waited.and(idle.map_err(Error::from)).and(announced)
    }

    /// Counts this rank as closed; the last one marks the job finished and frees the job id key.
    /// Skipped (see [`quiet_close`](Self::quiet_close)) when the store may be gone and nobody
    /// would read it.
    fn announce_close(&self) -> Result<()> {
        let who = format!("rank {} of {}", self.rank, self.world_size);
        if let Some(why) = self.quiet_close() {
            log::debug!(
                target: logging::STORE,
                "context: {who} closes without store traffic (no close announcement, claim \
                 release or duplicate check): {why}"
            );
            return Ok(());
        }
        let duplicate = self.claim.check_duplicate(&*self.store);
        // Kept open by a rank that never met its mates: one may not have read it yet.
        if self.claim_checked.load(Ordering::Relaxed) {
            self.hello.close(&*self.store);
        }
        // The moment first: a rank that sees this slot closed finds it (see `collision`).
        let moment = collision::Moment::now().encode();
        let store = &self.store;
        let closed = (store.set(&self.claim.last_close_key(), moment.as_bytes()))
            .and_then(|()| store.set(&self.claim.closed_key(), b"1"))
            .and_then(|()| store.add(&names::job(&self.job_id, "closed"), 1))
            .map_err(|e| e.context(format!("{who}: announcing close")))?;
        if closed == self.world_size as i64 {
            // The job's last request: a rank serving the store waits for it (see
            // `keep_serving_until_others_close`).
            store.delete_key(&self.job_key)?;
            store.set(&names::job(&self.job_id, "all_closed"), b"1")?;
        }
        duplicate.map_err(|e| e.context(who))
    }

    /// Why closing must not talk to the store, if it must not (a hosting rank always talks to its
    /// own server): the store may be gone and nobody would read it (see `crate::departures`). The
    /// claim is then not released either: a later run finds its holder exited and passes over it.
    fn quiet_close(&self) -> Option<String> {
        if lock(&self.server).is_some() {
            return None;
        }
        crate::departures::quiet_reason(self.store.liveness(), &self.job_id, self.rank)
    }

    /// A host's store whose server runs in this process (nvFuser's rank 0 serves its
    /// `c10d::TCPStore`) goes when this process exits, maybe in the middle of another rank's last
    /// requests (which would fail, and print). So this rank keeps the process until every rank
    /// has announced its close, or no other process is connected, or the host linger ran out.
    fn keep_serving_until_others_close(&self) -> Result<()> {
        let all_closed = names::job(&self.job_id, "all_closed");
        let deadline = Instant::now() + self.host_linger;
        // Served elsewhere, or (on a later look) the host stopped its server: 0.
        let others = || match self.store.liveness() {
            Liveness::ServedHere { other_clients } => other_clients,
            _ => 0,
        };
        let done = poll_until(deadline, || {
            others() == 0 || self.store.check(&[&all_closed]).unwrap_or(true)
        });
        if done {
            // The server may not have written the reply to that last request yet: give the
            // others a moment to hang up (they usually exit right after closing).
            poll_until(deadline.min(Instant::now() + SERVED_REPLY_GRACE), || {
                others() == 0
            });
            return Ok(());
        }
        Err(Error::timeout(format!(
            "rank {} serves the store (its server runs in this process) and stopped waiting after \
             {} ms for the other ranks to close their contexts ({} connections of other processes \
             still open): their last store requests may fail once this process exits. Close every \
             rank's context, or raise the host linger",
            self.rank,
            self.host_linger.as_millis(),
            others()
        )))
    }

    /// Hosting rank: waits until every rank closed, or every rank joined and no other client is
    /// connected any more (ranks that ended without closing), or the deadline.
    fn wait_for_others(&self, server: &StoreServer, deadline: Instant) -> Result<()> {
        let all_closed = names::job(&self.job_id, "all_closed");
        let joined: Vec<String> = (0..self.world_size)
            .map(|r| names::joined(&self.job_id, r))
            .collect();
        let joined: Vec<&str> = joined.iter().map(String::as_str).collect();
        // This rank's own connection is the one client allowed to remain.
        let done = poll_until(deadline, || {
            self.store.check(&[&all_closed]).unwrap_or(false)
                || (server.connected_clients() <= 1 && self.store.check(&joined).unwrap_or(false))
        });
        if done {
            return Ok(());
        }
        Err(Error::timeout(format!(
            "rank {} hosts the store and stopped it after waiting {} ms for the other ranks to \
             close their contexts ({} clients still connected); raise the host linger or close \
             every rank's context",
            self.rank,
            self.host_linger.as_millis(),
            server.connected_clients().saturating_sub(1)
        )))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // `finish` takes the server this rank hosts: look before.
        let hosts_server = lock(&self.server).is_some();
        if let Err(e) = self.finish() {
            // Only the store host's problems matter here: other ranks' stores may legitimately
            // be gone already at exit. (Whether this process serves a host's store is read
            // from the socket tables only then: its server outlives `finish`.)
            if hosts_server || matches!(self.store.liveness(), Liveness::ServedHere { .. }) {
                log::warn!(target: logging::STORE, "closing the context: {e}");
            }
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("job_id", &self.job_id)
            .field("hosts_store", &lock(&self.server).is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Polls `done` until it holds (true) or `deadline` passes (false).
fn poll_until(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(LINGER_POLL);
    }
}

fn is_addr_in_use(e: &Error) -> bool {
    e.message.contains(&crate::os::net::addr_in_use_message())
}

/// A random 16-hex-digit id. `RandomState` is seeded from the OS; time, pid and rank are mixed
/// in as well so that two proposals cannot coincide even if that seed repeated.
fn propose_job_id(rank: usize) -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_usize(rank);
    hasher.write_u128(collision::wall_now().as_nanos());
    format!("{:016x}", hasher.finish())
}

/// Stands in for the store after the context closed it: every operation fails.
struct ClosedStore;

/// The [`Store`] operations of [`ClosedStore`], each failing the same way.
macro_rules! closed {
    ($($op:ident($($arg:ty),*) -> $out:ty;)*) => {$(
        fn $op(&self, $(_: $arg),*) -> Result<$out> {
            Err(Error::state("the context was closed; its store connection is gone"))
        }
    )*};
}

impl Store for ClosedStore {
    closed! {
        set(&str, &[u8]) -> ();
        get(&str, Duration) -> Vec<u8>;
        add(&str, i64) -> i64;
        check(&[&str]) -> bool;
        wait(&[&str], Duration) -> ();
        delete_key(&str) -> bool;
        num_keys() -> i64;
        compare_set(&str, &[u8], &[u8]) -> Vec<u8>;
        append(&str, &[u8]) -> ();
    }
}

#[cfg(test)]
mod tests;
