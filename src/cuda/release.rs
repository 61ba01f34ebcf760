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
    /// Closes that failed (the driver's message is kept in `last_error`).
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
    last_error: Option<String>,
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
                last_error: None,
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
                if let Err(e) = result {
                    st.errors += 1;
                    st.last_error = Some(e.message);
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

    /// The message of the last failed close, if any.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.state).last_error.clone()
    }

    /// The job the thread runs, unless it was taken back.
    fn pending_running(st: &State<K, T>) -> Option<&Job<K, T>> {
        st.running.as_ref().filter(|r| !r.revived).map(|r| &r.job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// The test's hold on a releaser's steps (no GPU involved: this tests the queue, the bounds
    /// and the revival, not the driver). Each drain waits for one message on `drain` (the device
    /// work before the close); the close of a job whose target is 100 or more also waits for one
    /// on `close`; a target of 0 makes the close fail. Closed keys are reported on `done`.
    struct Gates {
        drain: mpsc::Sender<()>,
        close: mpsc::Sender<()>,
        done: mpsc::Receiver<u32>,
    }

    fn gated() -> (Arc<Releaser<u32, u64>>, Gates) {
        let (drain_tx, drain_rx) = mpsc::channel::<()>();
        let (close_tx, close_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<u32>();
        let (drain_rx, close_rx, done_tx) = (
            Mutex::new(drain_rx),
            Mutex::new(close_rx),
            Mutex::new(done_tx),
        );
        let r = Releaser::new(
            "nvfipc-test-releaser",
            move |_: &Job<u32, u64>| {
                lock(&drain_rx)
                    .recv()
                    .map_err(|_| Error::internal("gate closed"))
            },
            move |job: &Job<u32, u64>| {
                if job.target >= 100 {
                    lock(&close_rx)
                        .recv()
                        .map_err(|_| Error::internal("gate closed"))?;
                }
                let _ = lock(&done_tx).send(job.key);
                if job.target == 0 {
                    return Err(Error::internal("close failed on purpose"));
                }
                Ok(())
            },
        );
        let gates = Gates {
            drain: drain_tx,
            close: close_tx,
            done: done_rx,
        };
        (r, gates)
    }

    fn wait_until_phase(r: &Releaser<u32, u64>, key: u32, phase: Phase) {
        let start = Instant::now();
        loop {
            let there = lock(&r.state)
                .running
                .as_ref()
                .is_some_and(|run| run.job.key == key && run.phase == phase);
            if there {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "key {key} never reached {phase:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn find_or_take_back_hits_revives_or_hands_the_table_back() {
        let (r, g) = gated();
        let table: Mutex<HashMap<u32, u64>> = Mutex::new(HashMap::from([(5, 50)]));
        let find = |key: u32| {
            r.find_or_take_back(
                &table,
                &key,
                Duration::from_millis(50),
                |t| t.get(&key).copied(),
                |t, target| {
                    t.insert(key, target);
                    target + 1
                },
                || format!("mapping {key}"),
            )
            .unwrap()
        };
        assert!(matches!(find(5), Found::Ready(50)), "a live entry");
        // Queued (its drain has not been let through): taken back, handed to `revived`.
        r.submit(6, 1, 60).unwrap();
        r.submit(7, 1, 70).unwrap();
        assert!(
            matches!(find(7), Found::Ready(71)),
            "taken back from the queue"
        );
        assert_eq!(lock(&table).get(&7), Some(&70));
        match find(8) {
            Found::Open(mut t) => {
                t.insert(8, 80);
            }
            Found::Ready(_) => panic!("nothing to find for 8"),
        }
        assert_eq!(lock(&table).get(&8), Some(&80));
        g.drain.send(()).unwrap();
        r.flush_within(Duration::from_secs(10), "mapping(s) left")
            .unwrap();
        assert_eq!(g.done.recv().unwrap(), 6);
    }

    #[test]
    fn submit_returns_at_once_and_the_thread_closes_in_order() {
        let (r, g) = gated();
        r.submit(1, 7, 10).unwrap();
        r.submit(2, 7, 20).unwrap();
        // Nothing has been let through, yet submit returned.
        assert_eq!(r.pending_for(7), 2);
        assert_eq!(r.counters().pending, 2);
        g.drain.send(()).unwrap();
        g.drain.send(()).unwrap();
        assert_eq!(g.done.recv().unwrap(), 1);
        assert_eq!(g.done.recv().unwrap(), 2);
        r.flush(Duration::from_secs(10)).unwrap();
        assert_eq!(r.pending_for(7), 0);
        let c = r.counters();
        assert_eq!((c.pending, c.finished, c.errors), (0, 2, 0));
    }

    #[test]
    fn back_pressure_waits_then_names_the_peer() {
        let (r, g) = gated();
        for key in 0..3 {
            r.submit(key + 10, 4, 1).unwrap();
        }
        wait_until_phase(&r, 10, Phase::Draining);
        let err = r.wait_below(4, 1, Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.status, crate::error::Status::Timeout);
        assert!(
            err.message.contains("3 replaced mappings of peer rank 4"),
            "{err}"
        );
        assert!(err.message.contains("at most 1 may wait"), "{err}");
        assert!(err.message.contains("closing a mapping of rank 4"), "{err}");
        // Another peer is not held back.
        r.wait_below(5, 1, Duration::ZERO).unwrap();
        // Let two through: now only one waits, and the bounded wait succeeds.
        g.drain.send(()).unwrap();
        g.drain.send(()).unwrap();
        assert_eq!(g.done.recv().unwrap(), 10);
        assert_eq!(g.done.recv().unwrap(), 11);
        r.wait_below(4, 1, Duration::from_secs(10)).unwrap();
        g.drain.send(()).unwrap();
        r.flush(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_mapping_opened_again_before_its_close_is_taken_back() {
        let (r, g) = gated();
        r.submit(1, 0, 11).unwrap();
        r.submit(2, 0, 22).unwrap();
        wait_until_phase(&r, 1, Phase::Draining);
        // Key 1 waits for device work, key 2 is queued: both are intact and come back.
        assert!(matches!(r.revive(&2), Revive::Queued(22)));
        assert!(matches!(r.revive(&1), Revive::Queued(11)));
        assert!(matches!(r.revive(&1), Revive::Absent), "taken back once");
        assert!(matches!(r.revive(&3), Revive::Absent));
        assert!(r.wait_not_closing(&1, Duration::ZERO));
        assert_eq!(r.counters().pending, 0);
        r.flush(Duration::ZERO).unwrap();
        // The drain ends; the thread then skips the close of the job taken back.
        g.drain.send(()).unwrap();
        r.submit(3, 0, 33).unwrap();
        g.drain.send(()).unwrap();
        assert_eq!(g.done.recv().unwrap(), 3, "key 1 was never closed");
        r.flush(Duration::from_secs(10)).unwrap();
        let c = r.counters();
        assert_eq!((c.pending, c.finished, c.revived), (0, 1, 2));
    }

    #[test]
    fn a_mapping_inside_its_close_is_waited_for() {
        let (r, g) = gated();
        r.submit(1, 0, 100).unwrap();
        g.drain.send(()).unwrap();
        wait_until_phase(&r, 1, Phase::Closing);
        assert!(matches!(r.revive(&1), Revive::Closing));
        assert!(!r.wait_not_closing(&1, Duration::from_millis(20)));
        g.close.send(()).unwrap();
        assert!(r.wait_not_closing(&1, Duration::from_secs(10)));
        assert_eq!(g.done.recv().unwrap(), 1);
        r.flush(Duration::from_secs(10)).unwrap();
        assert!(matches!(r.revive(&1), Revive::Absent));
    }

    #[test]
    fn flush_is_bounded_and_failed_closes_are_counted() {
        let (r, g) = gated();
        r.submit(1, 0, 0).unwrap(); // target 0: the close fails
        assert_eq!(r.flush(Duration::from_millis(20)), Err(1));
        g.drain.send(()).unwrap();
        r.flush(Duration::from_secs(10)).unwrap();
        assert_eq!(r.counters().errors, 1);
        assert!(r.last_error().unwrap().contains("on purpose"));
        // Closes submitted after a flush began are not waited for by it.
        assert_eq!(r.flush(Duration::ZERO), Ok(()));
    }

    #[test]
    fn flush_waits_for_earlier_closes_whatever_happens_to_later_ones() {
        let (r, g) = gated();
        r.submit(1, 0, 1).unwrap(); // will be draining
        r.submit(2, 0, 1).unwrap(); // stays queued
        wait_until_phase(&r, 1, Phase::Draining);
        let flusher = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.flush(Duration::from_millis(1500)))
        };
        std::thread::sleep(Duration::from_millis(20));
        // A later close, taken back at once, must not let the flush count key 2 as done.
        r.submit(3, 0, 1).unwrap();
        assert!(matches!(r.revive(&3), Revive::Queued(1)));
        g.drain.send(()).unwrap(); // key 1 closes; key 2 then drains behind the gate
        assert_eq!(flusher.join().unwrap(), Err(1));
        g.drain.send(()).unwrap();
        r.flush(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn the_bound_is_at_least_one() {
        let before = max_pending_per_peer();
        set_max_pending_per_peer(0);
        assert_eq!(max_pending_per_peer(), 1);
        set_max_pending_per_peer(before);
    }
}
