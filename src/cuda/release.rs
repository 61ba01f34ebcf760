//! Deferred closing of peer mappings, off the caller's thread.
//!
//! Measured on an H200 (driver 580): `cuIpcCloseMemHandle` blocks until *all* work queued in the
//! importing context has finished, not only the work that uses the mapping. Closing a replaced
//! mapping inside `exchange_handles` therefore stalled the exchange behind unrelated queued copies,
//! and deadlocked it when queued work waited (`cuStreamWaitValue32`) on a flag that is set only
//! after the exchange returns (in nvFuser: a peer's semaphore in a pipelined loop).
//!
//! So the last reference of a mapping is not closed where it is dropped: [`ipc`](super::ipc)
//! hands the mapping to one process-wide releaser thread, which makes the mapping's context
//! current, runs `cuCtxSynchronize` (all work queued in that context before this point has
//! finished, which includes every use of the mapping enqueued before it was replaced) and then
//! `cuIpcCloseMemHandle`. The caller never waits for device work, and nothing is unmapped while
//! work enqueued before the replacement may still use it.
//!
//! Bounds and release points:
//! * at most [`max_pending_per_peer`] mappings of one peer may wait to be closed; the exchange
//!   that queues one more waits for the releaser, bounded by its timeout, and then fails with a
//!   `Timeout` naming the peer and the mapping being closed (see [`Releaser::wait_below`]);
//! * a mapping that is opened again while it waits (a peer going back to a buffer it used
//!   before) is taken back from the queue, still mapped ([`Releaser::revive`]); one the releaser
//!   is closing right now is waited for, bounded, and opened afresh;
//! * freeing a handle cache waits, bounded by its linger, until every close queued so far has
//!   run ([`Releaser::flush`]); that is where the mappings of a cache are released at the latest.
//!
//! The queue logic is generic over the close operation so that it is unit-tested without a GPU.

use crate::error::{Error, Result};
use crate::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default bound of the mappings of one peer waiting to be closed.
pub const DEFAULT_MAX_PENDING_PER_PEER: usize = 32;

static MAX_PENDING_PER_PEER: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_PENDING_PER_PEER);

/// How many replaced mappings of one peer may wait to be closed before an exchange waits.
pub fn max_pending_per_peer() -> usize {
    MAX_PENDING_PER_PEER.load(Ordering::Relaxed)
}

/// Sets the bound of [`max_pending_per_peer`] (process-wide; at least 1).
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
    /// The mapping was still queued: it is taken back, still mapped.
    Queued(T),
    /// The releaser is closing it right now.
    Closing,
    /// Not in the releaser.
    Absent,
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
    closing: Option<Job<K, T>>,
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

type CloseFn<K, T> = dyn Fn(&Job<K, T>) -> Result<()> + Send + Sync;

/// A queue of mappings to close and the thread that closes them (see the module docs).
pub struct Releaser<K, T> {
    state: Mutex<State<K, T>>,
    changed: Condvar,
    close: Box<CloseFn<K, T>>,
    name: &'static str,
}

// Every update of `State` is a few field assignments with no call that can panic in between,
// so `lock` may ignore poisoning.

impl<K, T> Releaser<K, T>
where
    K: Copy + Eq + Hash + Send + 'static,
    T: Clone + Send + 'static,
{
    /// A releaser whose thread (named `name`, started on the first submit) runs `close`.
    pub fn new(
        name: &'static str,
        close: impl Fn(&Job<K, T>) -> Result<()> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Releaser {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                closing: None,
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
                        st.closing = Some(job.clone());
                        break job;
                    }
                    st = self
                        .changed
                        .wait(st)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            // A panic in `close` must not kill the thread and strand the queue.
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.close)(&job)))
                    .unwrap_or_else(|_| Err(Error::internal("closing a peer mapping panicked")));
            let mut st = lock(&self.state);
            st.closing = None;
            Self::retire(&mut st, job.peer);
            st.finished += 1;
            if let Err(e) = result {
                st.errors += 1;
                st.last_error = Some(e.message);
            }
            self.changed.notify_all();
        }
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

    /// Takes mapping `key` back when it is still queued (it is still mapped).
    pub fn revive(&self, key: &K) -> Revive<T> {
        let mut st = lock(&self.state);
        if let Some(i) = st.queue.iter().position(|j| &j.key == key) {
            let job = st.queue.remove(i).expect("index from position");
            Self::retire(&mut st, job.peer);
            st.revived += 1;
            self.changed.notify_all();
            return Revive::Queued(job.target);
        }
        if st.closing.as_ref().is_some_and(|j| &j.key == key) {
            return Revive::Closing;
        }
        Revive::Absent
    }

    /// Waits, at most `timeout`, until the thread is no longer closing mapping `key`.
    pub fn wait_not_closing(&self, key: &K, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        loop {
            if !st.closing.as_ref().is_some_and(|j| &j.key == key) {
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
                    .chain(st.closing.iter())
                    .filter(|j| j.peer == peer)
                    .map(|j| now.saturating_duration_since(j.queued_at))
                    .max()
                    .unwrap_or_default();
                let doing = match &st.closing {
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
                .chain(st.closing.iter())
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

    /// Whether the thread is inside a close right now.
    pub fn busy(&self) -> bool {
        lock(&self.state).closing.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A releaser whose closes block until the test lets each one through (no GPU involved:
    /// this tests the queue, the bounds and the revival, not the driver).
    fn gated() -> (
        Arc<Releaser<u32, u64>>,
        mpsc::Sender<()>,
        mpsc::Receiver<u32>,
    ) {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<u32>();
        let go_rx = Mutex::new(go_rx);
        let done_tx = Mutex::new(done_tx);
        let r = Releaser::new("nvfipc-test-releaser", move |job: &Job<u32, u64>| {
            lock(&go_rx)
                .recv()
                .map_err(|_| Error::internal("gate closed"))?;
            let _ = lock(&done_tx).send(job.key);
            if job.target == 0 {
                return Err(Error::internal("close failed on purpose"));
            }
            Ok(())
        });
        (r, go_tx, done_rx)
    }

    fn wait_busy(r: &Releaser<u32, u64>) {
        let start = Instant::now();
        while !r.busy() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "thread never started"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn submit_returns_at_once_and_the_thread_closes_in_order() {
        let (r, go, done) = gated();
        r.submit(1, 7, 100).unwrap();
        r.submit(2, 7, 200).unwrap();
        // Nothing has been let through, yet submit returned.
        assert_eq!(r.pending_for(7), 2);
        assert_eq!(r.counters().pending, 2);
        go.send(()).unwrap();
        go.send(()).unwrap();
        assert_eq!(done.recv().unwrap(), 1);
        assert_eq!(done.recv().unwrap(), 2);
        r.flush(Duration::from_secs(10)).unwrap();
        assert_eq!(r.pending_for(7), 0);
        let c = r.counters();
        assert_eq!((c.pending, c.finished, c.errors), (0, 2, 0));
    }

    #[test]
    fn back_pressure_waits_then_names_the_peer() {
        let (r, go, done) = gated();
        for key in 0..3 {
            r.submit(key + 10, 4, 1).unwrap();
        }
        wait_busy(&r);
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
        go.send(()).unwrap();
        go.send(()).unwrap();
        assert_eq!(done.recv().unwrap(), 10);
        assert_eq!(done.recv().unwrap(), 11);
        r.wait_below(4, 1, Duration::from_secs(10)).unwrap();
        go.send(()).unwrap();
        r.flush(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_queued_mapping_opened_again_is_taken_back() {
        let (r, go, _done) = gated();
        r.submit(1, 0, 11).unwrap();
        r.submit(2, 0, 22).unwrap();
        wait_busy(&r); // key 1 is being closed, key 2 waits
        assert!(matches!(r.revive(&2), Revive::Queued(22)));
        assert!(matches!(r.revive(&1), Revive::Closing));
        assert!(matches!(r.revive(&3), Revive::Absent));
        assert!(!r.wait_not_closing(&1, Duration::from_millis(20)));
        go.send(()).unwrap();
        assert!(r.wait_not_closing(&1, Duration::from_secs(10)));
        r.flush(Duration::from_secs(10)).unwrap();
        let c = r.counters();
        assert_eq!((c.pending, c.finished, c.revived), (0, 1, 1));
    }

    #[test]
    fn flush_is_bounded_and_failed_closes_are_counted() {
        let (r, go, _done) = gated();
        r.submit(1, 0, 0).unwrap(); // target 0: the close fails
        assert_eq!(r.flush(Duration::from_millis(20)), Err(1));
        go.send(()).unwrap();
        r.flush(Duration::from_secs(10)).unwrap();
        assert_eq!(r.counters().errors, 1);
        assert!(r.last_error().unwrap().contains("on purpose"));
        // Closes submitted after a flush began are not waited for by it.
        assert_eq!(r.flush(Duration::ZERO), Ok(()));
    }

    #[test]
    fn flush_waits_for_earlier_closes_whatever_happens_to_later_ones() {
        let (r, go, _done) = gated();
        r.submit(1, 0, 1).unwrap(); // will be closing
        r.submit(2, 0, 1).unwrap(); // stays queued
        wait_busy(&r);
        let flusher = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.flush(Duration::from_millis(1500)))
        };
        std::thread::sleep(Duration::from_millis(20));
        // A later close, taken back at once, must not let the flush count key 2 as done.
        r.submit(3, 0, 1).unwrap();
        assert!(matches!(r.revive(&3), Revive::Queued(1)));
        go.send(()).unwrap(); // key 1 closes; key 2 is still queued behind the gate
        assert_eq!(flusher.join().unwrap(), Err(1));
        go.send(()).unwrap();
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
