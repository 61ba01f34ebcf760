//! Rank claims and the job id: how each rank of a job lands in one run of the store, and how
//! the ranks of a run agree on a job id.

use super::collision::{self, check_passed_over, Moment, SlotHolder, CLOCK_SKEW};
use super::*;

/// Agrees on the job id of the run `claim` belongs to; returns the key and the agreed value.
pub(super) fn agree_on_job_id(
    store: &dyn Store,
    claim: &RankClaim,
    ranks: &RankInfo,
    timeout: Duration,
) -> Result<(String, Vec<u8>)> {
    let key = names::run(&claim.base, claim.run, "job_id");
    let proposal = propose_job_id(ranks.rank);
    let agreed = match store.compare_set(&key, b"", proposal.as_bytes()) {
        Ok(value) => value,
        Err(e) if e.status == Status::Unsupported => {
            if ranks.rank == 0 {
                store.set(&key, proposal.as_bytes())?;
                proposal.into_bytes()
            } else {
                store.get(&key, timeout)?
            }
        }
        Err(e) => return Err(e),
    };
    Ok((key, agreed))
}

/// This process as its claims name it.
pub(super) struct Claimant {
    /// Random: claims of one process are told from another's by it.
    nonce: String,
    /// A moment by which this process had certainly started (see `collision`).
    pub(super) started: Option<Moment>,
    /// Contexts created by this process, numbering its claims.
    claims_made: AtomicU64,
}

// process-wide: a claim names the process that makes it, whichever of its contexts makes it.
pub(super) static THIS_PROCESS: once_cell::sync::Lazy<Claimant> =
    once_cell::sync::Lazy::new(|| Claimant {
        nonce: propose_job_id(usize::MAX),
        started: Moment::process_start(),
        claims_made: AtomicU64::new(0),
    });

/// What a rank says of its job, and where each value came from (a variable, or the caller).
pub(super) struct Said {
    pub(super) tag: String,
    pub(super) tag_from: &'static str,
    pub(super) world_from: &'static str,
}

impl Said {
    pub(super) fn caller() -> Said {
        Said {
            tag: DEFAULT_JOB_TAG.to_string(),
            tag_from: "no tag given",
            world_from: "the caller",
        }
    }
}

/// Ranks are told once they disagreed that long: two jobs starting together on one store may
/// meet under a hello key until each one's ranks hold their places.
const DISAGREEMENT_GRACE: Duration = Duration::from_secs(1);

/// This rank's word on its job under `hello/tag/<tag>/<rank>` and `hello/world/<world>/<rank>`
/// (docs/PROTOCOL.md section 2): where keys that depend on the tag or the world size never meet,
/// a waiting rank reads its mates' words, and is told at once when they disagree on the world
/// size or the library version. A word of another tag may be another job's (jobs with distinct
/// tags may share a store), so it only adds a hint to a wait that times out.
pub(super) struct Hello {
    rank: usize,
    /// `hello1|<world>|<from>|<tag>|<from>|<version>|<moment, ',' for ';'>|open;<node identity>`.
    value: String,
    timeout: Duration,
    disagreeing_since: Mutex<Option<Instant>>,
    /// The last word of another tag seen under this rank's world key.
    other_tag: Mutex<Option<String>>,
}

fn fields(value: &str) -> Vec<&str> {
    value.split(';').next().unwrap_or("").split('|').collect()
}

impl Hello {
    pub(super) fn say(
        store: &dyn Store,
        r: &RankInfo,
        s: &Said,
        timeout: Duration,
    ) -> Result<Hello> {
        let (version, moment) = (env!("CARGO_PKG_VERSION"), Moment::now().encode());
        let value = format!(
            "hello1|{}|{}|{}|{}|{version}|{}|open;{}",
            r.world_size,
            s.world_from,
            s.tag,
            s.tag_from,
            moment.replace(';', ","),
            NodeIdentity::local().encode()
        );
        let hello = Hello {
            rank: r.rank,
            value,
            timeout,
            disagreeing_since: Mutex::new(None),
            other_tag: Mutex::new(None),
        };
        for key in hello.keys(r.rank) {
            store.set(&key, hello.value.as_bytes())?;
        }
        Ok(hello)
    }

    fn keys(&self, rank: usize) -> [String; 2] {
        let f = fields(&self.value);
        [format!("tag/{}", f[3]), format!("world/{}", f[1])].map(|s| names::hello(&s, rank))
    }

    /// Marks this rank's word closed where it still stands, so that later jobs pass over it.
    pub(super) fn close(&self, store: &dyn Store) {
        let closed = self.value.replacen("|open;", "|closed;", 1);
        for key in self.keys(self.rank) {
            let _ = store.compare_set(&key, self.value.as_bytes(), closed.as_bytes());
        }
    }

    /// Waits until `keys` are set, or `deadline`; fails at once when one of `peers` (the first
    /// eight) has disagreed for [`DISAGREEMENT_GRACE`] in a word that counts (see `disagreement`).
    pub(super) fn wait(
        &self,
        store: &dyn Store,
        keys: &[&str],
        peers: &[usize],
        deadline: Instant,
    ) -> Result<()> {
        let slice = Duration::from_millis(100) * (peers.len() as u32 / 64).max(1);
        loop {
            let mut found = None;
            for &peer in peers.iter().filter(|&&p| p != self.rank).take(8) {
                for key in self.keys(peer) {
                    if let (None, Some(value)) = (&found, read_if_set(store, &key)?) {
                        found = self.disagreement(store, peer, &String::from_utf8_lossy(&value))?;
                    }
                }
            }
            let mut since = lock(&self.disagreeing_since);
            match found {
                None => *since = None,
                Some(f)
                    if since.get_or_insert_with(Instant::now).elapsed() >= DISAGREEMENT_GRACE =>
                {
                    return Err(Error::invalid(f))
                }
                Some(_) => {}
            }
            drop(since);
            let left = deadline.saturating_duration_since(Instant::now());
            match store.wait(keys, left.min(slice)) {
                Err(e) if e.status == Status::Timeout && left > slice => {}
                Err(e) if e.status == Status::Timeout => {
                    let hint = lock(&self.other_tag).take();
                    return Err(match hint {
                        Some(h) => Error::new(e.status, format!("{}; {h}", e.message)),
                        None => e,
                    });
                }
                other => return other,
            }
        }
    }

    /// What `peer`'s word `value` says otherwise, if it counts: it is open, at most a timeout old
    /// and, where its tag or world differ, its job has not given this rank's place to another
    /// process (else it is another job, whose keys meet this one's here).
    fn disagreement(&self, store: &dyn Store, peer: usize, value: &str) -> Result<Option<String>> {
        let (theirs, mine) = (fields(value), fields(&self.value));
        let moment = || Moment::decode(theirs[6].replace(',', ";").as_bytes());
        let fresh = theirs.len() == mine.len()
            && theirs[0] == mine[0]
            && theirs[7] == "open"
            && moment().is_some_and(|m| m.elapsed() <= self.timeout + CLOCK_SKEW);
        let said = |f: &[&str], at: usize, from: usize| match from == at {
            true => f[at].to_string(),
            false => format!("{} (from {})", f[at], f[from]),
        };
        if fresh && theirs[3] != mine[3] {
            // Another tag may be another job sharing the store: a hint for a timeout, no error.
            *lock(&self.other_tag) = Some(format!(
                "rank {peer} ({}) of a job with tag {} was seen where this rank's tag is {}: if \
                 they are meant to be one job, give them one tag",
                Holder::parse(value.as_bytes()).describe(),
                said(&theirs, 3, 4),
                said(&mine, 3, 4)
            ));
            return Ok(None);
        }
        let differ: Vec<String> = [("world size", 1, 2), ("library version", 5, 5)]
            .into_iter()
            .filter(|&(_, at, _)| fresh && theirs[at] != mine[at])
            .map(|(what, at, from)| {
                format!(
                    "{what} {} where this rank says {}",
                    said(&theirs, at, from),
                    said(&mine, at, from)
                )
            })
            .collect();
        let base = names::runs(
            theirs.get(3).unwrap_or(&""),
            theirs.get(1).and_then(|w| w.parse().ok()).unwrap_or(0),
        );
        let other_job = (theirs.get(1), theirs.get(3)) != (mine.get(1), mine.get(3));
        let holds_me = match read_if_set(store, &names::current(&base))? {
            Some(run) if other_job && !differ.is_empty() => {
                store.check(&[&names::slot(&base, parse_run(&run), "rank", self.rank)])?
            }
            _ => false,
        };
        Ok((!differ.is_empty() && !holds_me).then(|| {
            let who = Holder::parse(value.as_bytes()).describe();
            format!(
                "rank {peer} ({who}) says {}: {DISAGREE}",
                differ.join(", and ")
            )
        }))
    }
}

/// The end of the errors for ranks that disagree.
const DISAGREE: &str = "the ranks of one job must agree on these: start them with one launcher \
    command, one environment and one build of the library (two jobs that share a store need \
    distinct job tags or stores)";

/// One rank's claim of its place in one run of a job (`<base>/<run>/rank/<rank>`).
#[derive(Debug)]
pub(super) struct RankClaim {
    pub(super) base: String,
    pub(super) run: u64,
    pub(super) rank: usize,
    /// The job has no tag: a process of a concurrent job may mark this run (see `collision`).
    pub(super) untagged: bool,
}

/// A claim's holder, parsed from the claim key's value `<nonce>.<n>;<node identity>`.
struct Holder {
    nonce: String,
    node: Option<NodeIdentity>,
}

impl Holder {
    fn parse(value: &[u8]) -> Holder {
        let text = String::from_utf8_lossy(value);
        let (claim, node) = text.split_once(';').unwrap_or((&text, ""));
        let nonce = claim.split_once('.').map_or(claim, |(n, _)| n).to_string();
        Holder {
            nonce,
            node: NodeIdentity::decode(node),
        }
    }

    fn describe(&self) -> String {
        match &self.node {
            Some(n) => format!("pid {} on host {:?}", n.pid, n.host_name),
            None => "a process of unknown identity".to_string(),
        }
    }

    /// Whether the holder's process is alive, when its pid means something here (on this
    /// kernel and in this pid namespace); `None` when that cannot be told.
    fn alive(&self) -> Option<bool> {
        let node = self.node.as_ref()?;
        let me = NodeIdentity::local();
        let checkable = node.boot_id == me.boot_id && node.pid_ns == me.pid_ns && me.pid_ns != 0;
        checkable.then(|| crate::node::process_alive(node.pid))
    }
}

impl RankClaim {
    fn key(&self) -> String {
        names::slot(&self.base, self.run, "rank", self.rank)
    }
    pub(super) fn closed_key(&self) -> String {
        names::slot(&self.base, self.run, "closed", self.rank)
    }
    /// When a rank of the run last closed (see `collision`).
    pub(super) fn last_close_key(&self) -> String {
        names::run(&self.base, self.run, "last_close")
    }
    /// Fails, naming the other process, when another process tried to claim this rank of this
    /// run while this one held it, or (untagged jobs) a process of another job found this run
    /// taken while it was live.
    pub(super) fn check_duplicate(&self, store: &dyn Store) -> Result<()> {
        if self.untagged {
            let mark = names::run(&self.base, self.run, "collision");
            if let Some(other) = read_if_set(store, &mark)? {
                let other = Holder::parse(&other).describe();
                return Err(collision::marked_error(&other, self.rank, &mark));
            }
        }
        let key = names::slot(&self.base, self.run, "duplicate", self.rank);
        let Some(other) = read_if_set(store, &key)? else {
            return Ok(());
        };
        Err(Error::state(format!(
            "another process ({}) also claimed rank {} of this job (store key {}): {CLAIMED_TWICE}",
            Holder::parse(&other).describe(),
            self.rank,
            self.key(),
        )))
    }
}

/// The end of the errors for a rank claimed twice.
const CLAIMED_TWICE: &str = "two jobs use one store without distinct job tags, or one rank was \
    started twice; their ranks cannot be told apart, so both are refused. Give each job its own \
    NVFIPC_JOB_TAG (or its own store)";

/// `key`'s value (empty when it cannot be read), or `None` when `key` is not set.
fn read_if_set(store: &dyn Store, key: &str) -> Result<Option<Vec<u8>>> {
    let set = store.check(&[key])?;
    Ok(set.then(|| store.get(key, Duration::from_secs(1)).unwrap_or_default()))
}

/// Claims this rank's place in a run of `<tag>/w<world>` atomically, so that all ranks of a job
/// land in one run whatever their order of arrival and a run half-claimed by a dead job is never
/// joined (the rules: docs/PROTOCOL.md section 2). A slot held by another live process means one
/// rank claimed twice: both are refused. An untagged rank passing over a run checks `collision`.
pub(super) fn claim_rank(
    store: &dyn Store,
    ranks: &RankInfo,
    tag: &str,
    hello: &Hello,
    timeout: Duration,
) -> Result<RankClaim> {
    let untagged = tag == DEFAULT_JOB_TAG;
    let base = names::runs(tag, ranks.world_size);
    let serial = THIS_PROCESS.claims_made.fetch_add(1, Ordering::Relaxed);
    let value = format!(
        "{}.{serial};{}",
        THIS_PROCESS.nonce,
        NodeIdentity::local().encode()
    );
    let current_key = names::current(&base);
    let open_key = |run: u64| names::run(&base, run, "open");
    let deadline = Instant::now() + timeout;
    let refuse = |run: u64, holder: &Holder| -> Result<RankClaim> {
        let dup = names::slot(&base, run, "duplicate", ranks.rank);
        store.set(&dup, value.as_bytes())?;
        Err(Error::state(format!(
            "rank {} is already claimed in this store by another live process ({}; this one is \
             pid {} on host {:?}; store key {base}/{run}/rank/{}): {CLAIMED_TWICE}",
            ranks.rank,
            holder.describe(),
            std::process::id(),
            NodeIdentity::local().host_name,
            ranks.rank,
        )))
    };
    let mut run: u64 = if ranks.rank == 0 {
        if store.check(&[&current_key])? {
            parse_run(&store.get(&current_key, timeout)?)
        } else {
            0
        }
    } else {
        (hello.wait(store, &[&current_key], &[0], deadline)).map_err(|e| {
            e.context(format!(
                "waiting for rank 0 to open a run of this job (key {current_key}, timeout {} ms)",
                timeout.as_millis()
            ))
        })?;
        parse_run(&store.get(&current_key, timeout)?)
    };
    loop {
        let claim = RankClaim {
            base: base.clone(),
            run,
            rank: ranks.rank,
            untagged,
        };
        let passed_over = |holder: SlotHolder<'_>| -> Result<()> {
            if !untagged {
                return Ok(());
            }
            let started = THIS_PROCESS.started.as_ref();
            check_passed_over(store, (&base, run, ranks.rank), holder, &value, started)
        };
        // Rank 0 opens the runs; the others join this one unless the rank 0 that opened it is
        // dead (a run a dead job left half claimed).
        let leader_dead = ranks.rank != 0
            && Holder::parse(&store.get(&names::slot(&base, run, "rank", 0), timeout)?).alive()
                == Some(false);
        if leader_dead {
            passed_over(SlotHolder::Unknown)?;
        } else {
            let held = try_claim(store, &claim.key(), value.as_bytes())?;
            if held == value.as_bytes() {
                if ranks.rank == 0 {
                    store.set(&open_key(run), Moment::now().encode().as_bytes())?;
                    store.set(&current_key, run.to_string().as_bytes())?;
                }
                return Ok(claim);
            }
            let holder = Holder::parse(&held);
            let mine = holder.nonce == THIS_PROCESS.nonce;
            let closed = store.check(&[&claim.closed_key()])?;
            // A rank 0 that already closed (it may have failed early) still lets its ranks join;
            // but a live holder of this slot is then the previous job finishing, not a rank
            // claimed twice.
            let leader_closed =
                ranks.rank != 0 && store.check(&[&names::slot(&base, run, "closed", 0)])?;
            if !(mine || closed || holder.alive() == Some(false) || leader_closed) {
                return refuse(run, &holder);
            }
            if !mine {
                passed_over(SlotHolder::Other {
                    describe: &holder.describe(),
                    live: !closed && holder.alive() == Some(true),
                })?;
            }
        }
        if ranks.rank != 0 {
            let next = open_key(run + 1);
            hello.wait(store, &[&next], &[0], deadline).map_err(|e| {
                e.context(format!(
                    "the last run of this job on the store ({run}) is over or taken; waiting \
                     for rank 0 to open the next one (key {next})"
                ))
            })?;
        }
        run += 1;
    }
}

fn parse_run(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Writes `value` into `key` unless it holds a value already; returns what it holds then. Atomic:
/// one COMPARE_SET, or, on stores without it, an ADD on `<key>/n` (the first adder writes).
fn try_claim(store: &dyn Store, key: &str, value: &[u8]) -> Result<Vec<u8>> {
    match store.compare_set(key, b"", value) {
        Err(e) if e.status == Status::Unsupported => {
            if store.add(&format!("{key}/n"), 1)? == 1 {
                store.set(key, value)?;
                Ok(value.to_vec())
            } else {
                // The first adder writes right after its ADD.
                store.get(key, Duration::from_secs(10))
            }
        }
        other => other,
    }
}
