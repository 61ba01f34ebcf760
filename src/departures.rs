//! Which ranks of this process's jobs have left, seen without the store (docs/PROTOCOL.md,
//! "Closing after the peers"): through the board the exchange registers here for each peer; peers
//! with no board here are never known to have left.

use crate::names::job_tag;
use crate::store::Liveness;
use crate::sync::lock;
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A peer whose departure can be seen from here (its board, for the exchange).
pub trait Presence: Send + Sync {
    /// Why the peer has left (for example "rank 1 (pid 42) has exited"), or `None` while it may
    /// still be there.
    fn left(&self) -> Option<String>;
}

/// What this process has seen of one job's ranks.
#[derive(Default)]
struct JobRanks {
    world_size: usize,
    /// The latest presence registered per rank (a newer cache's board replaces an older one's).
    peers: HashMap<usize, Arc<dyn Presence>>,
}

// process-wide: a job's caches, contexts and fd transports in one process share no owner, and
// each must see the ranks that any of them saw leave. Keyed by job tag (`names::job_tag`): the
// fd transport knows only the tag.
static JOBS: Lazy<Mutex<HashMap<String, JobRanks>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// Records that `job_id` has `world_size` ranks.
pub fn note_world(job_id: &str, world_size: usize) {
    // Each update is one assignment or insert: a panic elsewhere leaves the map consistent.
    lock(&JOBS).entry(job_tag(job_id)).or_default().world_size = world_size;
}

/// Registers how to see whether `rank` of `job_id` has left (replacing what was registered).
pub fn note_peer(job_id: &str, rank: usize, presence: Arc<dyn Presence>) {
    lock(&JOBS)
        .entry(job_tag(job_id))
        .or_default()
        .peers
        .insert(rank, presence);
}

/// Why every rank of `job_id` other than `me` has left, one reason per rank; `None` when one of
/// them may still be there (or cannot be seen from here, or the job's size is not known, or it
/// has no other rank).
pub fn all_left(job_id: &str, me: usize) -> Option<Vec<String>> {
    let peers: Vec<Arc<dyn Presence>> = {
        let jobs = lock(&JOBS);
        let job = jobs.get(&job_tag(job_id))?;
        // A world of one has no peer that could be seen leaving.
        if job.world_size <= 1 {
            return None;
        }
        let others = (0..job.world_size).filter(|&r| r != me);
        others
            .map(|r| job.peers.get(&r).cloned())
            .collect::<Option<_>>()?
    };
    // Asked outside the lock: a presence looks at shared memory and at processes.
    peers.iter().map(|p| p.left()).collect()
}

/// The rank that hosts a job's store wherever a rank hosts it: c10d's `env://` rendezvous and
/// nvFuser's Communicator make rank 0 the store's host, and so do this library's contexts.
const STORE_HOST_RANK: usize = 0;

/// Why a closing rank of `job_id` must make no store request that only its peers would need, if
/// it must (docs/PROTOCOL.md, "Closing after the peers").
pub fn quiet_reason(store: Liveness, job_id: &str, me: usize) -> Option<String> {
    match store {
        Liveness::Alive | Liveness::ServedHere { .. } => None,
        Liveness::Gone => Some(
            "the store's server has gone (it closed the connection, or no longer listens on \
             this machine)"
                .to_string(),
        ),
        Liveness::Unknown => {
            if let Some(left) = all_left(job_id, me) {
                return Some(format!(
                    "the store cannot tell whether it is still there and every other rank has \
                     left ({})",
                    left.join(", ")
                ));
            }
            if me == STORE_HOST_RANK {
                return None;
            }
            let host = lock(&JOBS)
                .get(&job_tag(job_id))?
                .peers
                .get(&STORE_HOST_RANK)?
                .clone();
            // Asked outside the lock, as in `all_left`.
            let host = host.left()?;
            Some(format!(
                "the store cannot tell whether it is still there and rank {STORE_HOST_RANK}, \
                 which hosts a job's store in c10d's and nvFuser's launchers, has left ({host})"
            ))
        }
    }
}

#[cfg(test)]
mod tests;
