//! Every name the library gives a job's shared state, made here and nowhere else: the job tag,
//! the shm and memfd names of boards, segments and slabs, the store keys of contexts, barriers,
//! records, node identities and fd responders, and the fd responders' socket names.

use crate::hash::fnv1a64;
use std::path::{Path, PathBuf};

/// `sun_path` holds 108 bytes; a path name needs its NUL, an abstract name its leading NUL.
pub const MAX_SOCKET_NAME: usize = 107;
/// Job names longer than this are shortened (prefix + hash) inside socket names.
const MAX_JOB_IN_NAME: usize = 32;

/// The job id as shm names carry it: itself when it is 1 to 16 of `[A-Za-z0-9_]`, else its hash.
pub fn job_tag(job_id: &str) -> String {
    let safe = !job_id.is_empty()
        && job_id.len() <= 16
        && job_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if safe {
        job_id.to_string()
    } else {
        format!("{:016x}", fnv1a64(job_id.as_bytes()))
    }
}

/// The shm-name prefix of everything made for `job_id` (`nvfipc-job1-`, no leading slash).
pub fn job_prefix(job_id: &str) -> String {
    format!("nvfipc-{}-", job_tag(job_id))
}

/// The name of host buffer `id` of `job_id` (a memfd's name: shown in `/proc/<pid>/fd`).
pub fn host_segment(job_id: &str, id: u64) -> String {
    format!("{}{id}", job_prefix(job_id))
}

/// The name of a process's host semaphore slab for the job of tag `job_tag` (a memfd's name).
pub fn host_slab(job_tag: &str) -> String {
    format!("nvfipc-{job_tag}-slab")
}

/// The names of one cache's shared state (boards, node identity keys, record keys) for a job, a
/// scope and a generation (docs/PROTOCOL.md section 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheNames {
    job_id: String,
    scope: String,
    generation: u64,
}

impl CacheNames {
    pub fn new(job_id: &str, scope: &str, generation: u64) -> CacheNames {
        CacheNames {
            job_id: job_id.to_string(),
            scope: scope.to_string(),
            generation,
        }
    }

    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Shm name of the board of `rank` (`/nvfipc-<job>[-<scope>]-g<generation>-b<rank>`).
    pub fn board(&self, rank: usize) -> String {
        let job = job_tag(&self.job_id);
        let gen = self.generation;
        if self.scope.is_empty() {
            format!("/nvfipc-{job}-g{gen}-b{rank}")
        } else {
            format!("/nvfipc-{job}-{}-g{gen}-b{rank}", job_tag(&self.scope))
        }
    }

    /// Store key of the record `exporter` published at buffer `version` on the channel
    /// `(src, dst, tag, occurrence)`: a newer export never overwrites an unread one.
    pub fn record_key(
        &self,
        channel: (usize, usize, &str, u32),
        exporter: usize,
        version: u64,
    ) -> String {
        let (src, dst, tag, occurrence) = channel;
        format!(
            "{}/h/{src}/{dst}/{exporter}/{version}/{tag}#{occurrence}",
            self.key_prefix()
        )
    }

    pub fn node_key(&self, rank: usize) -> String {
        format!("{}/node/{rank}", self.key_prefix())
    }

    /// `nvfipc/<job>/<scope>/g<generation>`.
    fn key_prefix(&self) -> String {
        format!("nvfipc/{}/{}/g{}", self.job_id, self.scope, self.generation)
    }
}

impl std::fmt::Display for CacheNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cache generation {} of job {:?}, scope {:?}",
            self.generation, self.job_id, self.scope
        )
    }
}

/// Store keys of contexts, under `nvfipc/context/` (docs/PROTOCOL.md section 2).
pub mod context {
    const PREFIX: &str = "nvfipc/context";

    /// `<tag>/w<world>`: the base of the runs of a job of `tag` and `world` ranks.
    pub fn runs(tag: &str, world: usize) -> String {
        format!("{PREFIX}/{tag}/w{world}")
    }

    /// `hello/<space>/<rank>`: what `rank` says of its job; `space` is `tag/<tag>` or
    /// `world/<world>` (see `context::claim::Hello`).
    pub fn hello(space: &str, rank: usize) -> String {
        format!("{PREFIX}/hello/{space}/{rank}")
    }

    /// `<runs>/current`: the run rank 0 opened last.
    pub fn current(runs: &str) -> String {
        format!("{runs}/current")
    }

    /// `<runs>/<run>/<name>`: `open`, `last_close`, `collision` or `job_id`.
    pub fn run(runs: &str, run: u64, name: &str) -> String {
        format!("{runs}/{run}/{name}")
    }

    /// `<runs>/<run>/<name>/<rank>`: `rank` (the claim), `closed` or `duplicate`.
    pub fn slot(runs: &str, run: u64, name: &str, rank: usize) -> String {
        format!("{runs}/{run}/{name}/{rank}")
    }

    /// `<job>/<name>`: `closed` (a counter) or `all_closed`.
    pub fn job(job_id: &str, name: &str) -> String {
        format!("{PREFIX}/{job_id}/{name}")
    }

    /// `<job>/joined/<rank>`: the rank's node identity.
    pub fn joined(job_id: &str, rank: usize) -> String {
        format!("{PREFIX}/{job_id}/joined/{rank}")
    }
}

/// Store keys of one barrier member set: `nvfipc/barrier[/<scope>]/<set>/...`.
#[derive(Debug)]
pub(crate) struct BarrierKeys {
    base: String,
}

impl BarrierKeys {
    pub(crate) fn new(scope: Option<&str>, set_id: &str) -> BarrierKeys {
        let base = match scope {
            Some(scope) => format!("nvfipc/barrier/{scope}/{set_id}"),
            None => format!("nvfipc/barrier/{set_id}"),
        };
        BarrierKeys { base }
    }

    pub(crate) fn arrival(&self, gen: u64, rank: usize) -> String {
        format!("{}/arrived/{gen}/{rank}", self.base)
    }

    pub(crate) fn release(&self, gen: u64) -> String {
        format!("{}/release/{gen}", self.base)
    }
}

/// Cache generations: per (job, scope, rank), the caches this process created; a failed creation
/// gives its number back, so a retried one still pairs with the peers' caches.
pub mod generations {
    use crate::sync::lock;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    type Key = (String, String, usize);

    // process-wide: generations count the caches this process created, whoever created them.
    static LAST: Mutex<BTreeMap<Key, u64>> = Mutex::new(BTreeMap::new());

    /// A generation being created: [`Reserved::commit`] keeps it; dropping it uncommitted gives
    /// it back when no later one was handed out meanwhile.
    pub struct Reserved {
        key: Key,
        generation: u64,
        committed: bool,
    }

    impl Reserved {
        pub fn generation(&self) -> u64 {
            self.generation
        }

        pub fn commit(mut self) {
            self.committed = true;
        }
    }

    impl Drop for Reserved {
        fn drop(&mut self) {
            if self.committed {
                return;
            }
            if let Some(g) = lock(&LAST).get_mut(&self.key) {
                if *g == self.generation {
                    *g -= 1;
                }
            }
        }
    }

    /// The next generation of the caches of `job_id` and `scope` for `rank` in this process.
    pub fn reserve(job_id: &str, scope: &str, rank: usize) -> Reserved {
        let key = (job_id.to_string(), scope.to_string(), rank);
        let mut last = lock(&LAST);
        let g = last.entry(key.clone()).or_insert(0);
        *g += 1;
        Reserved {
            key,
            generation: *g,
            committed: false,
        }
    }
}

/// Whether a `/dev/shm` entry (no leading slash) is named like a board (see [`CacheNames::board`]).
pub fn is_board_name(entry: &str) -> bool {
    entry.starts_with("nvfipc-")
        && entry
            .rsplit_once("-b")
            .is_some_and(|(_, r)| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// The store prefix of a job's fd responder records.
pub fn fdpass_prefix(job_id: &str) -> String {
    format!("nvfipc/{job_id}")
}

/// The store key of `rank`'s fd responder record under `prefix`.
pub fn fdpass_record_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/fdpass/{rank}")
}

/// `text` with every character outside `[A-Za-z0-9._-]` replaced by `_`.
pub fn name_safe(text: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    text.chars()
        .map(|c| if safe(c) { c } else { '_' })
        .collect()
}

/// The job in socket names: [`name_safe`], long ones cut to a prefix plus a hash of the whole.
pub fn job_in_name(job: &str) -> String {
    let clean = name_safe(job);
    if clean.len() <= MAX_JOB_IN_NAME && !clean.is_empty() {
        return clean;
    }
    let h = fnv1a64(job.as_bytes());
    format!("{}~{:08x}", &clean[..clean.len().min(16)], h as u32)
}

/// The abstract socket name (without its leading NUL) of `rank`'s responder in `job`.
pub fn abstract_name(job: &str, rank: usize, nonce: u64) -> String {
    format!("nvfipc-{}-{rank}-{nonce:016x}", job_in_name(job))
}

/// The path of `rank`'s socket in `dir` for process `pid` of pid namespace `pid_ns`, or why it
/// cannot be one (too long for `sun_path`).
pub fn socket_path(
    dir: &Path,
    job: &str,
    rank: usize,
    (pid, pid_ns): (u32, u64),
    nonce: u64,
) -> Result<PathBuf, String> {
    let path = dir.join(format!(
        "nvfipc-{}-{rank}-{pid}p{pid_ns}-{nonce:016x}.sock",
        job_in_name(job)
    ));
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_NAME {
        return Err(format!(
            "the socket path {} is {len} bytes, more than a Unix socket address holds \
             ({MAX_SOCKET_NAME}): set NVFIPC_SOCKET_DIR to a shorter directory",
            path.display()
        ));
    }
    Ok(path)
}

/// The pid and pid namespace in a socket file name made by [`socket_path`].
pub fn socket_owner(file_name: &str) -> Option<(u32, u64)> {
    let stem = file_name.strip_prefix("nvfipc-")?.strip_suffix(".sock")?;
    let mut parts = stem.rsplitn(3, '-');
    let _nonce = parts.next()?;
    let (pid, pidns) = parts.next()?.split_once('p')?;
    Some((pid.parse().ok()?, pidns.parse().ok()?))
}

#[cfg(test)]
mod tests;
