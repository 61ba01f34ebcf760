//! Deferred closing of peer mappings, off the caller's thread.
//!
//! Measured on an H200 (driver 580): `cuIpcCloseMemHandle` blocks until *all* work queued in the
//! importing context has finished, not only the work that uses the mapping. Closing a replaced
//! mapping inside `exchange_handles` therefore stalled the exchange behind unrelated queued copies,
//! and deadlocked it when queued work waited (`cuStreamWaitValue32`) on a flag that is set only
//! after the exchange returns (in nvFuser: a peer's semaphore in a pipelined loop).
//!
//! So the last reference of a mapping is not closed where it is dropped: the import table
//! ([`super::imports`]) hands the mapping to the releaser thread of its kind (legacy IPC, VMM,
//! pool; one per process each), which makes the mapping's context
//! current, runs `cuCtxSynchronize` (all work queued in that context before this point has
//! finished, which includes every use of the mapping enqueued before it was replaced) and then
//! `cuIpcCloseMemHandle`. The caller never waits for device work, and nothing is unmapped while
//! work enqueued before the replacement may still use it. A job runs in two phases, the wait
//! ([`Phase::Draining`]) and the close ([`Phase::Closing`]); until the close starts, the mapping is
//! intact and can be taken back.
//!
//! Bounds and release points:
//! * at most [`max_pending_per_peer`] mappings of one peer may wait to be closed; the exchange
//!   that queues one more waits for the releaser, bounded by its timeout, and then fails with a
//!   `Timeout` naming the peer and the mapping being closed (see [`Releaser::wait_below`]);
//! * a mapping that is opened again while it waits (a peer going back to a buffer it used
//!   before) is taken back, still mapped ([`Releaser::revive`], through
//!   [`Releaser::find_or_take_back`]), whether it is queued or the
//!   thread is waiting for the device work before its close (the thread then skips the close);
//!   only one inside `cuIpcCloseMemHandle` right now is waited for, bounded, and opened afresh;
//! * freeing a handle cache waits, bounded by its linger, until every close queued so far has
//!   run ([`Releaser::flush`]); that is where the mappings of a cache are released at the latest.
//!
//! The queue logic is generic over the close operation so that it is unit-tested without a GPU.

use crate::error::{Error, Result};
use crate::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default bound of the mappings of one peer waiting to be closed.
pub const DEFAULT_MAX_PENDING_PER_PEER: usize = 32;

static MAX_PENDING_PER_PEER: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_PENDING_PER_PEER);

/// How many replaced mappings of one peer may wait to be closed before an exchange waits.
pub fn max_pending_per_peer() -> usize {
    MAX_PENDING_PER_PEER.load(Ordering::Relaxed)
}

/// Sets the bound of [`max_pending_per_peer`] (process-wide; at least 1).
#[cfg(test)]
pub fn set_max_pending_per_peer(limit: usize) {
    MAX_PENDING_PER_PEER.store(limit.max(1), Ordering::Relaxed);
}

/// One mapping to close: `key` identifies it in the import table, `target` is what the close
/// operation needs (for the driver: the mapped base and its context).
#[derive(Clone, Debug)]
pub struct Job<K, T> {
    pub key: K,
    pub peer: usize,
    pub target: T,
    pub queued_at: Instant,
    /// Submission order (for `flush`).
    pub seq: u64,
}

/// What [`Releaser::revive`] found.
#[derive(Debug)]
pub enum Revive<T> {
    /// The mapping was queued, or its device work was being waited for: it is taken back, still
    /// mapped, and will not be closed.
    Queued(T),
    /// The releaser is inside its close right now.
    Closing,
    /// Not in the releaser.
    Absent,
}

/// What [`Releaser::find_or_take_back`] found.
pub enum Found<'a, G, R> {
    /// A live import, or one taken back from the releaser.
    Ready(R),
    /// Neither: open afresh, under the importer's table lock, handed back.
    Open(MutexGuard<'a, G>),
}

/// Where the thread is with the job it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the device work queued before the release; the mapping is intact.
    Draining,
    /// Inside the close.
    Closing,
}

/// The job the thread runs, and whether it was taken back meanwhile.
struct Running<K, T> {
    job: Job<K, T>,
    phase: Phase,
    revived: bool,
}

/// Counters of a releaser.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReleaseCounters {
    /// Closes queued or running now.
    pub pending: u64,
    /// Closes the releaser ran (successful or not).
    pub finished: u64,
    /// Mappings taken back from the queue because they were opened again.
    pub revived: u64,
    /// Closes that failed.
    pub errors: u64,
}

struct State<K, T> {
    queue: VecDeque<Job<K, T>>,
    /// The job the thread is running now.
    running: Option<Running<K, T>>,
    per_peer: HashMap<usize, usize>,
    /// Jobs submitted and jobs retired (closed, failed or revived) since creation.
    submitted: u64,
    retired: u64,
    finished: u64,
    revived: u64,
    errors: u64,
    thread: bool,
}

type StepFn<K, T> = dyn Fn(&Job<K, T>) -> Result<()> + Send + Sync;

/// A queue of mappings to close and the thread that closes them (see the module docs).
pub struct Releaser<K, T> {
    state: Mutex<State<K, T>>,
    changed: Condvar,
    /// Waits for the device work queued before the release (the mapping stays intact).
    drain: Box<StepFn<K, T>>,
    close: Box<StepFn<K, T>>,
    name: &'static str,
}

// Every update of `State` is a few field assignments with no call that can panic in between,
// so `lock` may ignore poisoning.

impl<K, T> Releaser<K, T>
where
    K: Copy + Eq + Hash + Send + 'static,
    T: Clone + Send + 'static,
{
    /// A releaser whose thread (named `name`, started on the first submit) runs `drain` and
    /// then, unless the job was taken back meanwhile, `close` for every job.
    pub fn new(
        name: &'static str,
        drain: impl Fn(&Job<K, T>) -> Result<()> + Send + Sync + 'static,
        close: impl Fn(&Job<K, T>) -> Result<()> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Releaser {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                running: None,
                per_peer: HashMap::new(),
                submitted: 0,
                retired: 0,
                finished: 0,
                revived: 0,
                errors: 0,
                thread: false,
            }),
            changed: Condvar::new(),
            drain: Box::new(drain),
            close: Box::new(close),
            name,
        })
    }

    /// Queues `target` (mapping `key` of `peer`) to be closed by the thread. Never blocks on
    /// device work; fails only when the thread cannot be started.
    pub fn submit(self: &Arc<Self>, key: K, peer: usize, target: T) -> Result<()> {
        let mut st = lock(&self.state);
        if !st.thread {
            let this = Arc::clone(self);
            std::thread::Builder::new()
                .name(self.name.to_string())
                .spawn(move || this.run())
                .map_err(|e| Error::from_io("starting the IPC releaser thread", &e))?;
            st.thread = true;
        }
        let seq = st.submitted;
        st.queue.push_back(Job {
            key,
            peer,
            target,
            queued_at: Instant::now(),
            seq,
        });
        *st.per_peer.entry(peer).or_default() += 1;
        st.submitted += 1;
        self.changed.notify_all();
        Ok(())
    }

    fn run(&self) {
        loop {
            let job = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(job) = st.queue.pop_front() {
                        st.running = Some(Running {
                            job: job.clone(),
                            phase: Phase::Draining,
                            revived: false,
                        });
                        break job;
                    }
                    st = self
                        .changed
                        .wait(st)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            let drained = Self::guarded(|| (self.drain)(&job));
            let revived = {
                let mut st = lock(&self.state);
                let running = st.running.as_mut().expect("the running job is ours");
                running.phase = Phase::Closing;
                running.revived
            };
            // A job taken back while draining stays mapped: `revive` already retired it.
            let result = if revived {
                Ok(())
            } else {
                Self::guarded(|| (self.close)(&job)).and(drained)
            };
            let mut st = lock(&self.state);
            st.running = None;
            if !revived {
                Self::retire(&mut st, job.peer);
                st.finished += 1;
                if result.is_err() {
                    st.errors += 1;
                }
            }
            self.changed.notify_all();
        }
    }

    /// Runs one step; a panic in it must not kill the thread and strand the queue.
    fn guarded(step: impl FnOnce() -> Result<()>) -> Result<()> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(step))
            .unwrap_or_else(|_| Err(Error::internal("closing a peer mapping panicked")))
    }

    fn retire(st: &mut State<K, T>, peer: usize) {
        if let Some(n) = st.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                st.per_peer.remove(&peer);
            }
        }
        st.retired += 1;
    }

    /// Takes mapping `key` back while it is intact: queued, or its device work being waited for
    /// (then the thread skips its close).
    pub fn revive(&self, key: &K) -> Revive<T> {
        let mut st = lock(&self.state);
        if let Some(i) = st.queue.iter().position(|j| &j.key == key) {
            let job = st.queue.remove(i).expect("index from position");
            Self::retire(&mut st, job.peer);
            st.revived += 1;
            self.changed.notify_all();
            return Revive::Queued(job.target);
        }
        let taken = match st.running.as_mut() {
            Some(r) if &r.job.key == key && !r.revived => {
                if r.phase == Phase::Closing {
                    return Revive::Closing;
                }
                r.revived = true;
                (r.job.peer, r.job.target.clone())
            }
            _ => return Revive::Absent,
        };
        Self::retire(&mut st, taken.0);
        st.revived += 1;
        self.changed.notify_all();
        Revive::Queued(taken.1)
    }

    /// The lookup every importer starts with, under its table lock (`table`): `hit` looks for a
    /// live import of `key`; a mapping still queued for its close (or whose device work is being
    /// waited for) is taken back, still mapped, and handed to `revived`; one being closed right
    /// now is waited for, at most `wait`, with the table unlocked (a `Timeout` saying `what` is
    /// being opened otherwise). The table lock must be the one under which the importer submits
    /// its releases, so that nothing new reaches the releaser for `key` meanwhile.
    pub fn find_or_take_back<'a, G, R>(
        &self,
        table: &'a Mutex<G>,
        key: &K,
        wait: Duration,
        mut hit: impl FnMut(&mut G) -> Option<R>,
        revived: impl FnOnce(&mut G, T) -> R,
        what: impl Fn() -> String,
    ) -> Result<Found<'a, G, R>> {
        let mut guard = lock(table);
        loop {
            if let Some(found) = hit(&mut guard) {
                return Ok(Found::Ready(found));
            }
            match self.revive(key) {
                Revive::Queued(target) => return Ok(Found::Ready(revived(&mut guard, target))),
                Revive::Closing => {
                    drop(guard);
                    if !self.wait_not_closing(key, wait) {
                        return Err(Error::timeout(format!(
                            "{} is opened again while this process is still closing its \
                             previous mapping, and the close did not finish within {wait:?} (a \
                             close waits until all work queued on the device context has \
                             finished)",
                            what()
                        )));
                    }
                    guard = lock(table);
                }
                Revive::Absent => return Ok(Found::Open(guard)),
            }
        }
    }

    /// [`flush`](Self::flush) as a `Timeout` naming `what` waits (e.g. "VMM mapping(s) ... to
    /// be unmapped").
    pub fn flush_within(&self, timeout: Duration, what: &str) -> Result<()> {
        self.flush(timeout).map_err(|left| {
            Error::timeout(format!(
                "{left} {what} after {timeout:?}: a close waits until all work queued on the \
                 device context has finished (is a stream still waiting for a peer?); they stay \
                 mapped until that work finishes or the process exits"
            ))
        })
    }

    /// [`wait_below`](Self::wait_below) with the process-wide bound [`max_pending_per_peer`].
    pub fn wait_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        self.wait_below(peer, max_pending_per_peer(), timeout)
    }

    /// Whether the thread is inside the close of mapping `key`.
    fn closing(st: &State<K, T>, key: &K) -> bool {
        st.running
            .as_ref()
            .is_some_and(|r| &r.job.key == key && r.phase == Phase::Closing && !r.revived)
    }

    /// Waits, at most `timeout`, until the thread is no longer inside the close of mapping `key`.
    pub fn wait_not_closing(&self, key: &K, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        loop {
            if !Self::closing(&st, key) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Closes of `peer`'s mappings queued or running now.
    #[cfg(test)]
    pub fn pending_for(&self, peer: usize) -> usize {
        lock(&self.state).per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Back-pressure: waits, at most `timeout`, until at most `limit` closes of `peer`'s
    /// mappings are queued or running. On timeout the closes stay queued (nothing is lost) and
    /// the error says how many wait, since when, and what the thread is doing.
    pub fn wait_below(&self, peer: usize, limit: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        loop {
            let pending = st.per_peer.get(&peer).copied().unwrap_or(0);
            if pending <= limit {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let oldest = st
                    .queue
                    .iter()
                    .chain(Self::pending_running(&st))
                    .filter(|j| j.peer == peer)
                    .map(|j| now.saturating_duration_since(j.queued_at))
                    .max()
                    .unwrap_or_default();
                let doing = match Self::pending_running(&st) {
                    Some(j) => format!(
                        "it has been closing a mapping of rank {} for {:?}",
                        j.peer,
                        now.saturating_duration_since(j.queued_at)
                    ),
                    None => "it is idle".to_string(),
                };
                return Err(Error::timeout(format!(
                    "{pending} replaced mappings of peer rank {peer} are waiting to be closed \
                     (at most {limit} may wait; the oldest for {oldest:?}) after {timeout:?}; \
                     {doing}. A close waits until all work queued on this process's device \
                     context has finished: is a stream waiting for something that happens only \
                     after this exchange returns?"
                )));
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Waits, at most `timeout`, until every close submitted before this call has run (or was
    /// taken back). Returns how many are still pending on timeout.
    pub fn flush(&self, timeout: Duration) -> std::result::Result<(), usize> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        // Jobs are numbered in submission order; those submitted later do not count.
        let target = st.submitted;
        loop {
            let left = st
                .queue
                .iter()
                .chain(Self::pending_running(&st))
                .filter(|j| j.seq < target)
                .count();
            if left == 0 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(left);
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    pub fn counters(&self) -> ReleaseCounters {
        let st = lock(&self.state);
        ReleaseCounters {
            pending: (st.submitted - st.retired),
            finished: st.finished,
            revived: st.revived,
            errors: st.errors,
        }
    }

    /// The job the thread runs, unless it was taken back.
    fn pending_running(st: &State<K, T>) -> Option<&Job<K, T>> {
        st.running.as_ref().filter(|r| !r.revived).map(|r| &r.job)
    }
}

#[cfg(test)]
mod tests;
