//! Rank claims and the job id: how each rank of a job lands in one run of the store, and how
//! the ranks of a run agree on a job id.

use super::collision::{self, check_passed_over, Moment, SlotHolder};
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
            "rank {} is already claimed in this store by another live process ({}; store key \
             {base}/{run}/rank/{}): {CLAIMED_TWICE}",
            ranks.rank,
            holder.describe(),
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
        let remaining = deadline.saturating_duration_since(Instant::now());
        let current = store.get(&current_key, remaining).map_err(|e| {
            e.context(format!(
                "waiting for rank 0 to open a run of this job (key {current_key})"
            ))
        })?;
        parse_run(&current)
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
            let remaining = deadline.saturating_duration_since(Instant::now());
            store.wait(&[&next], remaining).map_err(|e| {
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
