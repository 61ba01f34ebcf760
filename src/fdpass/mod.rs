//! Passing file descriptors between the processes of a job without ptrace rights: rungs
//! abstract socket, socket file, pidfd (`NVFIPC_FD_RUNGS`), the responder and the final error are
//! described in docs/ARCHITECTURE.md, "Passing file descriptors"; frames and who is served in
//! docs/PROTOCOL.md section 7. Every libc call is in `os::fd_passing`.

mod config;
pub mod diagnose;
pub mod frame;
pub mod peer;
pub mod registry;
pub mod responder;
pub mod sealed;
pub mod vouch;

pub use config::{FdPassConfig, TrustedUids};
pub use diagnose::{Diagnosis, Gate, Rung};
pub use peer::{LocalIdentity, PeerRecord, PtracerState};
pub use registry::FdId;

use crate::error::{Error, Result};
use crate::os::fd_passing as sys;
use crate::store::Store;
use crate::sync::lock;
use diagnose::pidfd_gate_of;
use frame::{ErrorCode, FetchRequest, Parsed, Reply, Secret, HEADER_LEN, MAX_BODY};

use once_cell::sync::Lazy;
use peer::Route;
use registry::Registry;
use responder::{Responder, ResponderStats};
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Pause before asking again a responder that answered "busy".
const BUSY_PAUSE: Duration = Duration::from_millis(10);

pub use crate::names::fdpass_record_key as record_key;

/// A random nonce (public: it names the responder) and secret (private: it admits requests).
fn random_nonce_and_secret() -> Result<(u64, Secret)> {
    let mut b = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::from_io("fd transport: reading /dev/urandom for a nonce", &e))?;
    let nonce = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let secret = u128::from_le_bytes(b[8..].try_into().expect("16 bytes"));
    Ok((nonce.max(1), Secret(secret)))
}

/// Under Yama `ptrace_scope=1`, lets any process of this user attach (for the pidfd rung) only
/// when opted in (`NVFIPC_FD_PTRACER=any`; why: PROTOCOL.md section 7, "Trust boundary").
fn set_ptracer(allow: bool) -> PtracerState {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match scope {
        Some(1) if !allow => PtracerState::Refused,
        Some(1) => match sys::allow_any_ptracer() {
            Ok(()) => PtracerState::Any,
            Err(_) => PtracerState::Failed,
        },
        _ => PtracerState::NotNeeded,
    }
}

struct Running {
    responder: Responder,
    record: PeerRecord,
}

/// One process's fd transport for one job and rank. Cheap to share (`Arc`).
pub struct FdPass {
    store: Arc<dyn Store>,
    prefix: String,
    job: String,
    rank: usize,
    config: FdPassConfig,
    local: LocalIdentity,
    registry: Arc<Registry>,
    running: Mutex<Option<Running>>,
    peers: Mutex<HashMap<usize, PeerRecord>>,
    /// One connection per peer responder (by route, which carries its nonce), kept between fetches.
    connections: Mutex<HashMap<String, UnixStream>>,
}

type InstanceKey = (String, String, usize);
// process-wide: one fd responder per process, job and rank, shared by every cache of the job.
static INSTANCES: Lazy<Mutex<HashMap<InstanceKey, Weak<FdPass>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

impl FdPass {
    /// A transport that publishes under `prefix` in `store` as `rank` of `job`; starts nothing.
    pub fn new(
        store: Arc<dyn Store>,
        prefix: &str,
        job: &str,
        rank: usize,
        config: FdPassConfig,
    ) -> FdPass {
        FdPass {
            store,
            prefix: prefix.to_string(),
            job: job.to_string(),
            rank,
            config,
            local: LocalIdentity::current(),
            registry: Arc::new(Registry::default()),
            running: Mutex::new(None),
            peers: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
        }
    }

    /// The process's one transport for (`prefix`, `job`, `rank`), made when there is none.
    pub fn for_job(
        store: Arc<dyn Store>,
        prefix: &str,
        job: &str,
        rank: usize,
        config: FdPassConfig,
    ) -> Arc<FdPass> {
        let key = (prefix.to_string(), job.to_string(), rank);
        let mut map = lock(&INSTANCES);
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let fresh = Arc::new(FdPass::new(store, prefix, job, rank, config));
        map.insert(key, Arc::downgrade(&fresh));
        fresh
    }

    /// The job name this transport's sockets carry.
    pub fn job(&self) -> &str {
        &self.job
    }

    fn who(&self) -> String {
        format!("rank {} of job {}", self.rank, self.job)
    }

    /// Starts the responder and publishes this process's record, once.
    pub fn start(&self) -> Result<PeerRecord> {
        let mut running = lock(&self.running);
        if let Some(r) = running.as_ref() {
            return Ok(r.record.clone());
        }
        let who = self.who();
        let (nonce, secret) = random_nonce_and_secret()?;
        let abstract_name = crate::names::abstract_name(&self.job, self.rank, nonce);
        let path = match &self.config.socket_dir {
            None => Err("no socket directory (NVFIPC_SOCKET_DIR=none)".to_string()),
            Some(dir) => {
                let uid = sys::effective_uid();
                peer::private_socket_dir(dir, uid).and_then(|dir| {
                    peer::reclaim_dead_sockets(&dir, self.local.pid_ns, uid);
                    crate::names::socket_path(
                        &dir,
                        &self.job,
                        self.rank,
                        (self.local.pid, self.local.pid_ns),
                        nonce,
                    )
                })
            }
        };
        let (responder, path) = Responder::start(
            self.registry.clone(),
            nonce,
            secret,
            &abstract_name,
            path,
            &self.config,
            &who,
        )?;
        let record = PeerRecord {
            who: self.local.clone(),
            nonce,
            secret,
            abstract_name,
            path,
            ptracer: set_ptracer(self.config.allow_ptracer),
        };
        let key = record_key(&self.prefix, self.rank);
        self.store
            .set(&key, record.encode().as_bytes())
            .map_err(|e| e.context(format!("{who}: publishing the fd transport record {key}")))?;
        *running = Some(Running {
            responder,
            record: record.clone(),
        });
        Ok(record)
    }

    /// Offers `fd` to the job's importers; it stays open until [`unregister`](Self::unregister).
    pub fn register(&self, fd: OwnedFd) -> Result<FdId> {
        self.start()?;
        self.registry
            .register(fd)
            .map_err(|e| e.context(self.who()))
    }

    /// Offers a duplicate of `fd` (the caller keeps its own).
    pub fn register_dup(&self, fd: impl AsFd) -> Result<FdId> {
        let dup = fd.as_fd().try_clone_to_owned().map_err(|e| {
            Error::from_io(
                format!("{}: duplicating a descriptor to register", self.who()),
                &e,
            )
        })?;
        self.register(dup)
    }

    /// Closes the registered descriptor (later requests get "revoked"); false when unknown.
    pub fn unregister(&self, id: &FdId) -> bool {
        self.registry.unregister(id)
    }

    /// Whose processes this transport serves and takes descriptors from.
    pub fn trusted(&self) -> &TrustedUids {
        &self.config.trusted
    }

    pub fn registered(&self) -> usize {
        self.registry.len()
    }

    /// This process's published record, once started.
    pub fn record(&self) -> Option<PeerRecord> {
        lock(&self.running).as_ref().map(|r| r.record.clone())
    }

    /// Counters of this process's responder: accepted, fds sent, refused, malformed, denied
    /// (another uid, or no secret).
    pub fn responder_stats(&self) -> Option<(u64, u64, u64, u64, u64)> {
        let running = lock(&self.running);
        let s: &ResponderStats = running.as_ref()?.responder.stats();
        use std::sync::atomic::Ordering::Relaxed;
        Some((
            s.accepted.load(Relaxed),
            s.fds_sent.load(Relaxed),
            s.refused.load(Relaxed),
            s.malformed.load(Relaxed),
            s.denied.load(Relaxed),
        ))
    }

    pub fn responder_running(&self) -> bool {
        lock(&self.running)
            .as_ref()
            .is_some_and(|r| r.responder.is_running())
    }

    /// `peer`'s record, from the cache or the store (waiting at most until `deadline`).
    pub fn peer_record(&self, peer: usize, deadline: Instant) -> Result<PeerRecord> {
        if let Some(r) = lock(&self.peers).get(&peer) {
            return Ok(r.clone());
        }
        let key = record_key(&self.prefix, peer);
        let left = deadline.saturating_duration_since(Instant::now());
        let bytes = self.store.get(&key, left).map_err(|e| {
            e.context(format!(
                "{}: waiting for peer rank {peer}'s fd transport record {key} (it publishes it \
                 when it first registers a descriptor; has it exported anything, or exited?)",
                self.who()
            ))
        })?;
        let record = std::str::from_utf8(&bytes)
            .ok()
            .and_then(PeerRecord::decode)
            .ok_or_else(|| {
                Error::protocol(format!(
                    "{}: the store key {key} does not hold an fd transport record of this \
                     version ({} bytes): run one nvfuser-ipc version in every rank",
                    self.who(),
                    bytes.len()
                ))
            })?;
        lock(&self.peers).insert(peer, record.clone());
        Ok(record)
    }

    /// `peer`'s descriptor `id`, within `timeout`, by the first rung that works.
    pub fn fetch(&self, peer: usize, id: &FdId, timeout: Duration) -> Result<OwnedFd> {
        let mut fds = self.fetch_many(peer, std::slice::from_ref(id), timeout)?;
        Ok(fds.remove(0))
    }

    /// Several descriptors of one peer, over one connection where a socket rung works.
    pub fn fetch_many(&self, peer: usize, ids: &[FdId], timeout: Duration) -> Result<Vec<OwnedFd>> {
        self.fetch_diagnosed(peer, ids, timeout)
            .map(|f| f.fds)
            .map_err(FetchFailure::into_error)
    }

    /// [`fetch_many`](Self::fetch_many), saying which rung delivered and which failed before it;
    /// on failure a [`Diagnosis`], to which a caller with more rungs (FABRIC) adds its own.
    pub fn fetch_diagnosed(
        &self,
        peer: usize,
        ids: &[FdId],
        timeout: Duration,
    ) -> std::result::Result<Fetched, FetchFailure> {
        let start = Instant::now();
        let deadline = start + timeout;
        let record = self
            .peer_record(peer, deadline)
            .map_err(FetchFailure::Record)?;
        let found = start.elapsed();
        let what = match ids {
            [] => "no fd ids".to_string(),
            [one] => one.to_string(),
            many => format!("{} fd ids ({} first)", many.len(), many[0]),
        };
        let diag = Diagnosis::new(format!(
            "{}: fetching {what} of peer rank {peer} (pid {})",
            self.who(),
            record.who.pid
        ));
        if ids.is_empty() {
            return Ok(Fetched {
                fds: Vec::new(),
                rung: Rung::Abstract,
                fell_back: diag,
            });
        }
        let diag = match self.climb(&record, ids, deadline, diag) {
            Ok(fetched) => {
                let (took, n) = (crate::logging::took(start.elapsed()), ids.len());
                let (rung, found) = (fetched.rung.name(), crate::logging::took(found));
                log::info!(
                    target: crate::logging::HOST,
                    "{}: fetched {n} fd(s) of rank {peer} through the {rung} rung in {took} (its \
                     record found in {found})",
                    self.who()
                );
                return Ok(fetched);
            }
            Err(diag) => diag,
        };
        // The record may be stale (the peer restarted its transport): read it again, and when it
        // changed, climb once more with the new one.
        lock(&self.peers).remove(&peer);
        let fresh = self
            .store
            .check(&[&record_key(&self.prefix, peer)])
            .unwrap_or(false)
            .then(|| self.peer_record(peer, deadline.max(Instant::now())).ok())
            .flatten();
        match fresh {
            Some(new) if new.nonce != record.nonce && Instant::now() < deadline => {
                let again = Diagnosis::new(format!("{} (after its record changed)", diag.what));
                self.climb(&new, ids, deadline, again)
                    .map_err(FetchFailure::Rungs)
            }
            _ => Err(FetchFailure::Rungs(diag)),
        }
    }

    /// Tries the configured rungs in order (each once), after recording those ruled out.
    fn climb(
        &self,
        record: &PeerRecord,
        ids: &[FdId],
        deadline: Instant,
        mut diag: Diagnosis,
    ) -> std::result::Result<Fetched, Diagnosis> {
        let rungs = &self.config.rungs;
        let (routes, ruled_out) = peer::socket_routes(&self.local, record, rungs);
        let request = FetchRequest {
            nonce: record.nonce,
            serial: 0,
            rank: u32::try_from(self.rank).unwrap_or(u32::MAX),
            pid: self.local.pid,
            secret: record.secret,
        };
        for (rung, target, gate) in ruled_out {
            diag.add(rung, target, gate);
        }
        for &rung in rungs {
            let fds = if rung == Rung::Pidfd {
                self.try_pidfd(record, ids, &mut diag)
            } else {
                let mut fds = None;
                for route in routes.iter().filter(|r| r.rung() == rung) {
                    match self.try_route(record, route, request, ids, deadline, &mut diag) {
                        Some(Ok(got)) => fds = Some(got),
                        Some(Err(())) => return Err(diag),
                        None => continue,
                    }
                    break;
                }
                fds
            };
            if let Some(fds) = fds {
                return Ok(Fetched {
                    fds,
                    rung,
                    fell_back: diag,
                });
            }
        }
        if !rungs.contains(&Rung::Pidfd) {
            // Every fd rung appears in the error, enabled or not.
            diag.add(
                Rung::Pidfd,
                format!("pid {}", record.who.pid),
                Gate::Disabled,
            );
        }
        Err(diag)
    }

    /// The pidfd rung: every id with `pidfd_getfd`, unless a gate rules it out.
    fn try_pidfd(
        &self,
        record: &PeerRecord,
        ids: &[FdId],
        diag: &mut Diagnosis,
    ) -> Option<Vec<OwnedFd>> {
        let pid = record.who.pid;
        if let Some(gate) = peer::pidfd_gate(&self.local, record) {
            diag.add(Rung::Pidfd, format!("pid {pid} fd {}", ids[0].fd), gate);
            return None;
        }
        ids.iter()
            .map(|id| {
                fetch_with_pidfd(pid, id, record.ptracer.as_str(), &self.config.trusted)
                    .map_err(|gate| diag.add(Rung::Pidfd, format!("pid {pid} fd {}", id.fd), gate))
            })
            .collect::<std::result::Result<Vec<_>, ()>>()
            .ok()
    }

    /// One socket route: `Some(Ok)` delivered, `Some(Err)` a definitive refusal, `None` go on.
    fn try_route(
        &self,
        record: &PeerRecord,
        route: &Route,
        request: FetchRequest,
        ids: &[FdId],
        deadline: Instant,
        diag: &mut Diagnosis,
    ) -> Option<std::result::Result<Vec<OwnedFd>, ()>> {
        // A kept connection that fails (the responder closed it when idle, or restarted) is
        // replaced by a new one; the responder's own refusal is its answer.
        let mut kept = lock(&self.connections).remove(&route.describe());
        let retry_until = Instant::now() + self.config.connect_retry;
        loop {
            let fetched = match kept.take() {
                Some(stream) => match fetch_on(stream, request, ids, deadline) {
                    Err(gate) if !is_definitive(&gate) => continue,
                    fetched => fetched,
                },
                None => connect(route, retry_until.min(deadline))
                    .and_then(|stream| {
                        vouch::responder(stream.as_fd(), record, &self.local, &self.config.trusted)
                            .map(|()| stream)
                    })
                    .and_then(|stream| fetch_on(stream, request, ids, deadline)),
            };
            match fetched {
                Ok((fds, stream)) => {
                    // In step for the next fetch from the same responder: a connect and an
                    // accept less per import.
                    if let Some(stream) = stream {
                        lock(&self.connections).insert(route.describe(), stream);
                    }
                    return Some(Ok(fds));
                }
                // A responder at its connection limit: retry like a connect that failed.
                Err(Gate::Refused {
                    code: frame::ErrorCode::Busy,
                    ..
                }) if Instant::now() + BUSY_PAUSE < retry_until.min(deadline) => {
                    std::thread::sleep(BUSY_PAUSE);
                }
                Err(gate) => {
                    let definitive = is_definitive(&gate);
                    diag.add(route.rung(), route.describe(), gate);
                    return definitive.then_some(Err(()));
                }
            }
        }
    }
}
/// What [`FdPass::fetch_diagnosed`] delivered.
#[derive(Debug)]
pub struct Fetched {
    /// One descriptor per id, in order.
    pub fds: Vec<OwnedFd>,
    /// The rung that delivered them.
    pub rung: Rung,
    /// The rungs tried or ruled out before it, with their gates (empty: the first worked).
    pub fell_back: Diagnosis,
}

/// Why [`FdPass::fetch_diagnosed`] failed.
#[derive(Debug)]
pub enum FetchFailure {
    /// The peer's record could not be read (not published in time, or garbled).
    Record(Error),
    /// Every rung failed; the diagnosis says how.
    Rungs(Diagnosis),
}

impl FetchFailure {
    pub fn into_error(self) -> Error {
        match self {
            FetchFailure::Record(e) => e,
            FetchFailure::Rungs(d) => d.into_error(),
        }
    }
}

impl Drop for FdPass {
    fn drop(&mut self) {
        let running = lock(&self.running).take();
        if let Some(r) = running {
            // Stop serving (the socket file goes), then withdraw the record if still ours.
            drop(r.responder);
            let key = record_key(&self.prefix, self.rank);
            // Only peers read the record (see `departures::quiet_reason`).
            if let Some(why) =
                crate::departures::quiet_reason(self.store.liveness(), &self.job, self.rank)
            {
                log::debug!(
                    target: crate::logging::HOST,
                    "{}: leaving the fd transport's record {key} in the store: {why}",
                    self.who()
                );
                return;
            }
            let ours = r.record.encode().into_bytes();
            if self.store.check(&[&key]).unwrap_or(false)
                && self.store.get(&key, Duration::from_millis(100)).ok() == Some(ours)
            {
                let _ = self.store.delete_key(&key);
            }
        }
    }
}

// The importer's side: each step is bounded by the caller's deadline; a failure is its [`Gate`].

/// Pause between connection attempts to a socket that is not (yet) there.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

fn connect_gate(route: &Route, e: &io::Error) -> Gate {
    match (route, e.kind()) {
        (Route::Path(_), io::ErrorKind::NotFound) => Gate::PathAbsent,
        (Route::Path(_), io::ErrorKind::PermissionDenied) => Gate::PathDenied(e.to_string()),
        _ => Gate::Unreachable(e.to_string()),
    }
}

/// Connects to `route`, retrying until `retry_until` (not listening yet, or backlog full).
fn connect(route: &Route, retry_until: Instant) -> Result<UnixStream, Gate> {
    let addr = match route {
        Route::Abstract(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        Route::Path(p) => SocketAddr::from_pathname(p),
    }
    .map_err(|e| Gate::Other(format!("not a socket address: {e}")))?;
    loop {
        match mio::net::UnixStream::connect_addr(&addr) {
            Ok(s) => {
                let s = UnixStream::from(s);
                s.set_nonblocking(false)
                    .map_err(|e| Gate::Other(e.to_string()))?;
                return Ok(s);
            }
            Err(e) => {
                if Instant::now() + RETRY_PAUSE >= retry_until {
                    return Err(connect_gate(route, &e));
                }
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }
}

fn timed_out(what: &str, e: &io::Error) -> Gate {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Gate::TimedOut(format!("no reply to the request while {what}"))
        }
        _ => Gate::Broken(format!("{what}: {e}")),
    }
}

/// Asks the responder on `stream` for `ids` (pipelined): their descriptors in order, and the
/// connection when it is in step (every reply read, nothing left over) for the next request.
fn fetch_on(
    stream: UnixStream,
    request: FetchRequest,
    ids: &[FdId],
    deadline: Instant,
) -> Result<(Vec<OwnedFd>, Option<UnixStream>), Gate> {
    let mut out = Vec::with_capacity(ids.len() * (HEADER_LEN + 24));
    for id in ids {
        out.extend_from_slice(
            &FetchRequest {
                serial: id.serial,
                ..request
            }
            .encode(),
        );
    }
    let left = remaining(deadline).ok_or_else(|| Gate::TimedOut("before sending".into()))?;
    stream
        .set_write_timeout(Some(left))
        .map_err(|e| Gate::Other(e.to_string()))?;
    if let Err(e) = send_all(&stream, &out) {
        // A responder that refused the connection ("busy") wrote why before closing it.
        return Err(
            refusal_waiting(&stream).unwrap_or_else(|| timed_out("sending the request", &e))
        );
    }
    let mut fds = Vec::with_capacity(ids.len());
    let mut input: Vec<u8> = Vec::new();
    let mut pending_fds: Vec<OwnedFd> = Vec::new();
    for id in ids {
        let reply = loop {
            match Reply::decode(&input) {
                Ok(Parsed::Frame(reply, used)) => {
                    input.drain(..used);
                    break reply;
                }
                Ok(Parsed::Incomplete(_)) => {}
                Err(e) => {
                    return Err(Gate::Broken(format!(
                        "the reply does not parse ({}): not an nvfuser-ipc responder of this \
                         version",
                        e.message
                    )))
                }
            }
            let left = remaining(deadline)
                .ok_or_else(|| Gate::TimedOut("waiting for the reply".into()))?;
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| Gate::Other(e.to_string()))?;
            let mut buf = [0u8; HEADER_LEN + MAX_BODY];
            match sys::recv_with_fd(stream.as_fd(), &mut buf) {
                Ok((0, _)) => {
                    return Err(Gate::Broken(
                        "the responder closed the connection without replying".into(),
                    ))
                }
                Ok((n, fd)) => {
                    input.extend_from_slice(&buf[..n]);
                    pending_fds.extend(fd);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(timed_out("waiting for the reply", &e)),
            }
        };
        match reply {
            Reply::Fd { serial, dev, ino } => {
                if serial != id.serial {
                    return Err(Gate::Broken(format!(
                        "asked for fd id {}, the reply is for {serial}",
                        id.serial
                    )));
                }
                if pending_fds.is_empty() {
                    return Err(Gate::Broken(
                        "an fd reply came without a descriptor attached".into(),
                    ));
                }
                let fd = pending_fds.remove(0);
                if (dev, ino) != (id.dev, id.ino) {
                    return Err(Gate::NotTheObject(format!(
                        "the responder sent file {dev}:{ino} for fd id {}, registered as {}:{}",
                        id.serial, id.dev, id.ino
                    )));
                }
                fds.push(fd);
            }
            Reply::Error { code, message, .. } => return Err(Gate::Refused { code, message }),
        }
    }
    let in_step = input.is_empty() && pending_fds.is_empty();
    Ok((fds, in_step.then_some(stream)))
}

/// Writes all of `bytes` with `send(MSG_NOSIGNAL)`: a closed responder gives EPIPE, not SIGPIPE.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match sys::send_with_fd(stream.as_fd(), bytes, None) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The error frame already received on `stream`, if any (without waiting).
fn refusal_waiting(stream: &UnixStream) -> Option<Gate> {
    stream.set_nonblocking(true).ok()?;
    let mut buf = [0u8; HEADER_LEN + MAX_BODY];
    let (n, _) = sys::recv_with_fd(stream.as_fd(), &mut buf).ok()?;
    match Reply::decode(&buf[..n]) {
        Ok(Parsed::Frame(Reply::Error { code, message, .. }, _)) => {
            Some(Gate::Refused { code, message })
        }
        _ => None,
    }
}

/// Whether the exporter itself said the object is unknown or revoked: no other rung can do better.
fn is_definitive(gate: &Gate) -> bool {
    matches!(
        gate,
        Gate::Refused {
            code: ErrorCode::UnknownId | ErrorCode::Revoked,
            ..
        } | Gate::Untrusted(_)
    )
}

/// Takes descriptor `id.fd` of process `pid` with `pidfd_getfd`, checking it is the registered
/// file (a number reused after an unregister is refused).
fn fetch_with_pidfd(
    pid: u32,
    id: &FdId,
    exporter_ptracer: &str,
    trusted: &TrustedUids,
) -> Result<OwnedFd, Gate> {
    let pidfd = sys::pidfd_open(pid).map_err(|e| pidfd_gate_of(&e, exporter_ptracer, pid))?;
    // Checked with the pidfd open: a `pidfd_getfd` that then succeeds took from this process.
    vouch::process(pid, trusted)?;
    let fd = sys::pidfd_getfd(pidfd.as_fd(), id.fd)
        .map_err(|e| pidfd_gate_of(&e, exporter_ptracer, pid))?;
    let got = sys::file_identity(fd.as_fd()).map_err(|e| Gate::Other(format!("fstat: {e}")))?;
    if got != (id.dev, id.ino) {
        return Err(Gate::NotTheObject(format!(
            "descriptor {} of pid {pid} is now file {}:{}, not the registered {}:{}: the \
             object was unregistered",
            id.fd, got.0, got.1, id.dev, id.ino
        )));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests;
