//! The import table of peer device memory (legacy IPC, VMM runs, pool allocations) and the
//! releaser thread that closes what it no longer holds; why a thread, and the bounds on it:
//! ARCHITECTURE.md, "Replacing buffers".
//!
//! A peer allocation is mapped at most once per key (CUDA maps an allocation once per context),
//! with a reference count. [`ImportTable::acquire`] takes a reference on a live import, else takes
//! a mapping queued for its close back from the releaser, else waits (bounded) for a close in
//! progress and opens afresh under the table lock, so two importers of one key never open it
//! twice. The last reference hands the mapping to the [`Releaser`], which waits for the context's
//! queued work ([`ReleasePhase::Draining`], still revivable) and then closes it ([`ReleasePhase::Closing`]);
//! nothing is closed on the caller's thread except by [`ImportTable::close_now`] (the low-level C
//! API). What is specific to a kind (open, close, a sub-table kept under the table's lock) is its
//! [`ImportKind`]; the queue logic is generic, so it is unit-tested without a GPU.

use super::clock::DriverCall;
use super::driver::CudaContext;
use crate::error::{Error, Result};
use crate::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What one kind of device memory adds to the import table.
pub(crate) trait ImportKind: Send + Sync + 'static {
    /// The identity of a peer allocation as imported here.
    type Key: Copy + Eq + Hash + Debug + Send + Sync + 'static;
    /// What closing a mapping needs (where it is mapped, its context, ...).
    type Mapped: Clone + Send + 'static;
    /// The kind's own state, kept under the table's lock.
    type Side: Default + Send + 'static;

    /// The releaser thread's name, and what a flush that timed out reports as still waiting.
    const THREAD: &'static str;
    const PENDING: &'static str;

    /// Where the mapping starts in this process, and the context it was opened in; `None` when
    /// nothing was opened (this process's own allocation): nothing is closed, nor counted mapped.
    fn at(&self, mapped: &Self::Mapped) -> (u64, Option<CudaContext>);

    /// Whether the last release must close the mapping.
    fn closes(&self, mapped: &Self::Mapped) -> bool {
        self.at(mapped).1.is_some()
    }

    /// Waits for the device work queued before the release (all of the mapping's context); the
    /// mapping stays intact (and may still be taken back).
    fn drain(&self, _peer: usize, mapped: &Self::Mapped) -> Result<()> {
        self.at(mapped).1.map_or(Ok(()), CudaContext::synchronize)
    }

    /// Closes the mapping (without the table's lock on the releaser thread).
    fn close(&self, peer: usize, mapped: &Self::Mapped) -> Result<()>;

    /// Bookkeeping after [`close`](Self::close), whatever its outcome, under the table's lock.
    fn closed(&self, _side: &mut Self::Side, _mapped: &Self::Mapped) {}
}

/// One imported peer allocation and its references.
pub(crate) struct Entry<M> {
    mapped: M,
    refs: usize,
}

/// The entries of a table and the kind's own state, as the open step sees them (under the lock).
pub(crate) struct Tables<K: ImportKind> {
    entries: HashMap<K::Key, Entry<K::Mapped>>,
    pub side: K::Side,
}

impl<K: ImportKind> Tables<K> {
    /// The live imports (those whose close is queued are not here).
    pub fn entries(&self) -> impl Iterator<Item = (&K::Key, &K::Mapped)> {
        self.entries.iter().map(|(k, e)| (k, &e.mapped))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What a kind's open step did.
pub(crate) enum OpenOutcome<Key, M> {
    /// Opened a new mapping of the requested key.
    Mapped(M),
    /// The requested allocation is served by the live import `key` (e.g. a VMM run inside a larger
    /// mapped run), `offset` bytes into it: that import gets the reference.
    Within { key: Key, offset: u64 },
}

struct Inner<K: ImportKind> {
    kind: Arc<K>,
    state: Arc<Mutex<Tables<K>>>,
    releaser: Arc<Releaser<K::Key, K::Mapped>>,
}

/// The table of one kind's imports (clones are the same table, which the guards hold).
pub(crate) struct ImportTable<K: ImportKind> {
    inner: Arc<Inner<K>>,
}

impl<K: ImportKind> Clone for ImportTable<K> {
    fn clone(&self) -> Self {
        ImportTable {
            inner: Arc::clone(&self.inner),
        }
    }
}

// Lock order: the table's lock, then the releaser's. The releaser never holds its own lock while
// it runs a step, so its close step may take the table's lock. Updates under either lock are a
// few map operations, so `lock` may ignore poisoning.

impl<K: ImportKind> ImportTable<K> {
    /// A table whose releaser lets at most `max_pending` closes of one peer wait.
    pub fn new(kind: K, max_pending: usize) -> Self {
        let kind = Arc::new(kind);
        let state = Arc::new(Mutex::new(Tables {
            entries: HashMap::new(),
            side: K::Side::default(),
        }));
        let releaser = {
            let (drain_kind, close_kind, close_state) =
                (Arc::clone(&kind), Arc::clone(&kind), Arc::clone(&state));
            Releaser::new(
                K::THREAD,
                max_pending,
                move |job: &ReleaseJob<K::Key, K::Mapped>| drain_kind.drain(job.peer, &job.target),
                move |job: &ReleaseJob<K::Key, K::Mapped>| {
                    let close = || close_kind.close(job.peer, &job.target);
                    let closed = super::runtime().clock.time(DriverCall::Close, close);
                    close_kind.closed(&mut lock(&close_state).side, &job.target);
                    closed
                },
            )
        };
        ImportTable {
            inner: Arc::new(Inner {
                kind,
                state,
                releaser,
            }),
        }
    }

    pub fn kind(&self) -> &K {
        &self.inner.kind
    }

    /// Takes a reference on the import of `key` for rank `peer` (see the module docs): `wait`
    /// bounds the wait for a close in progress (`what` names the allocation in the timeout), and
    /// `open` runs under the table's lock, under which releases submit too.
    pub fn acquire(
        &self,
        key: K::Key,
        peer: usize,
        wait: Duration,
        what: impl Fn() -> String,
        open: impl FnOnce(&mut Tables<K>) -> Result<OpenOutcome<K::Key, K::Mapped>>,
    ) -> Result<Import<K>> {
        let (kind, releaser) = (&*self.inner.kind, &self.inner.releaser);
        let mut t = lock(&self.inner.state);
        let (held, base) = loop {
            if let Some(e) = t.entries.get_mut(&key) {
                e.refs += 1;
                break (key, kind.at(&e.mapped).0);
            }
            let mapped = match releaser.revive(&key) {
                Revive::Queued(mapped) => mapped,
                Revive::Closing => {
                    drop(t);
                    if !releaser.wait_not_closing(&key, wait) {
                        return Err(Error::timeout(format!(
                            "{} is opened again while this process is still closing its \
                             previous mapping, and the close did not finish within {wait:?} (a \
                             close waits until all work queued on the device context has \
                             finished)",
                            what()
                        )));
                    }
                    t = lock(&self.inner.state);
                    continue;
                }
                Revive::Absent => match open(&mut t)? {
                    OpenOutcome::Mapped(mapped) => mapped,
                    OpenOutcome::Within { key: outer, offset } => {
                        let e = t.entries.get_mut(&outer).ok_or_else(|| {
                            Error::internal(format!("{outer:?} serves {key:?} but is not imported"))
                        })?;
                        e.refs += 1;
                        break (outer, kind.at(&e.mapped).0 + offset);
                    }
                },
            };
            let base = kind.at(&mapped).0;
            t.entries.insert(key, Entry { mapped, refs: 1 });
            break (key, base);
        };
        Ok(Import {
            table: self.clone(),
            key: held,
            peer,
            base,
            held: true,
        })
    }

    /// Drops one reference of `key` taken for `peer`; the last one hands the mapping to the
    /// releaser.
    pub fn release(&self, key: &K::Key, peer: usize, what: impl FnOnce() -> String) -> Result<()> {
        self.drop_reference(key, peer, what, false)
    }

    /// Drops one reference of `key`, closing the last one on this thread under the table's lock;
    /// the caller promises that no device work still uses it.
    pub fn close_now(
        &self,
        key: &K::Key,
        peer: usize,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        self.drop_reference(key, peer, what, true)
    }

    /// Drops one reference of `key`; the last one is closed `now`, or handed to the releaser.
    fn drop_reference(
        &self,
        key: &K::Key,
        peer: usize,
        what: impl FnOnce() -> String,
        now: bool,
    ) -> Result<()> {
        let mut t = lock(&self.inner.state);
        let entry = t.entries.get_mut(key).ok_or_else(|| {
            Error::not_found(format!("{} is not imported (released twice?)", what()))
        })?;
        entry.refs -= 1;
        if entry.refs > 0 {
            return Ok(());
        }
        let kind = &*self.inner.kind;
        match t.entries.remove(key).map(|e| e.mapped) {
            Some(mapped) if kind.closes(&mapped) && now => {
                let closed = kind.close(peer, &mapped);
                kind.closed(&mut t.side, &mapped);
                closed
            }
            // Submitted under the table's lock: `acquire` never misses a mapping in between.
            Some(mapped) if kind.closes(&mapped) => self.inner.releaser.submit(*key, peer, mapped),
            _ => Ok(()),
        }
    }

    /// Back-pressure: [`Releaser::wait_below`] with the releaser's bound.
    pub fn wait_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        let releaser = &self.inner.releaser;
        releaser.wait_below(peer, releaser.max_pending, timeout)
    }

    /// Waits, at most `timeout`, until every close queued before this call has run; a `Timeout`
    /// saying how many are left otherwise (they stay queued).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.inner.releaser.flush(timeout).map_err(|left| {
            Error::timeout(format!(
                "{left} {} after {timeout:?}: a close waits until all work queued on the device \
                 context has finished (is a stream still waiting for a peer?); they stay mapped \
                 until that work finishes or the process exits",
                K::PENDING
            ))
        })
    }

    /// Reads the table and the releaser's counters under the table's lock (an entry is never
    /// counted both live and pending).
    pub fn inspect<R>(&self, f: impl FnOnce(&Tables<K>, ReleaseCounters) -> R) -> R {
        let t = lock(&self.inner.state);
        f(&t, self.inner.releaser.counters())
    }

    /// Entries whose last release closes something (see [`ImportKind::closes`]).
    pub fn mapped(&self, t: &Tables<K>) -> usize {
        t.entries
            .values()
            .filter(|e| self.inner.kind.closes(&e.mapped))
            .count()
    }
}

/// One reference on an imported peer allocation, released on drop (an error, that the releaser
/// thread could not start, is logged).
pub(crate) struct Import<K: ImportKind> {
    table: ImportTable<K>,
    key: K::Key,
    peer: usize,
    base: u64,
    held: bool,
}

impl<K: ImportKind> Import<K> {
    /// The import that holds the reference (the one that served the allocation).
    pub fn key(&self) -> K::Key {
        self.key
    }

    /// Where the requested allocation starts in this process.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Keeps the reference without a guard: it must be released by key later (the low-level C
    /// API, whose caller holds the reference).
    pub fn detach(mut self) -> (K::Key, u64) {
        self.held = false;
        (self.key, self.base)
    }
}

impl<K: ImportKind> Drop for Import<K> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        if let Err(e) = self
            .table
            .release(&self.key, self.peer, || format!("{:?}", self.key))
        {
            log::warn!(
                target: crate::logging::CUDA,
                "releasing an import of rank {}: {e}",
                self.peer
            );
        }
    }
}

impl<K: ImportKind> Debug for Import<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Import")
            .field("key", &self.key)
            .field("peer", &self.peer)
            .field("base", &format_args!("{:#x}", self.base))
            .finish()
    }
}

// ---- The releaser ----

/// One mapping to close: `key` identifies it in the import table, `target` is what the close
/// operation needs (for the driver: the mapped base and its context).
#[derive(Clone, Debug)]
pub struct ReleaseJob<K, T> {
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

/// Where the thread is with the job it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleasePhase {
    /// Waiting for the device work queued before the release; the mapping is intact.
    Draining,
    /// Inside the close.
    Closing,
}

/// The job the thread runs, and whether it was taken back meanwhile.
struct Running<K, T> {
    job: ReleaseJob<K, T>,
    phase: ReleasePhase,
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
    queue: VecDeque<ReleaseJob<K, T>>,
    /// The job the thread is running now.
    running: Option<Running<K, T>>,
    per_peer: HashMap<usize, usize>,
    /// Jobs submitted and jobs retired (closed, failed or revived) since creation.
    submitted: u64,
    retired: u64,
    /// `pending` unused: it is `submitted - retired`.
    counts: ReleaseCounters,
    thread: bool,
}

type StepFn<K, T> = dyn Fn(&ReleaseJob<K, T>) -> Result<()> + Send + Sync;

/// A queue of mappings to close and the thread that closes them (see the module docs).
pub struct Releaser<K, T> {
    state: Mutex<State<K, T>>,
    changed: Condvar,
    /// Waits for the device work queued before the release (the mapping stays intact).
    drain: Box<StepFn<K, T>>,
    close: Box<StepFn<K, T>>,
    name: &'static str,
    /// Most closes of one peer that may wait before [`ImportTable::wait_room`] waits.
    max_pending: usize,
}

impl<K, T> Releaser<K, T>
where
    K: Copy + Eq + Hash + Send + 'static,
    T: Clone + Send + 'static,
{
    /// A releaser whose thread (started on the first submit) runs `drain`, then `close` unless
    /// the job was taken back meanwhile; `max_pending` bounds the closes of one peer waiting.
    pub fn new(
        name: &'static str,
        max_pending: usize,
        drain: impl Fn(&ReleaseJob<K, T>) -> Result<()> + Send + Sync + 'static,
        close: impl Fn(&ReleaseJob<K, T>) -> Result<()> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Releaser {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                running: None,
                per_peer: HashMap::new(),
                submitted: 0,
                retired: 0,
                counts: ReleaseCounters::default(),
                thread: false,
            }),
            changed: Condvar::new(),
            drain: Box::new(drain),
            close: Box::new(close),
            name,
            max_pending: max_pending.max(1),
        })
    }

    /// Queues `target` (mapping `key` of `peer`) to be closed by the thread; fails only when the
    /// thread cannot be started.
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
        st.queue.push_back(ReleaseJob {
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
                            phase: ReleasePhase::Draining,
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
                running.phase = ReleasePhase::Closing;
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
                st.counts.finished += 1;
                if result.is_err() {
                    st.counts.errors += 1;
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
        let (peer, target) = if let Some(i) = st.queue.iter().position(|j| &j.key == key) {
            let job = st.queue.remove(i).expect("index from position");
            (job.peer, job.target)
        } else {
            match st.running.as_mut() {
                Some(r) if &r.job.key == key && !r.revived => {
                    if r.phase == ReleasePhase::Closing {
                        return Revive::Closing;
                    }
                    r.revived = true;
                    (r.job.peer, r.job.target.clone())
                }
                _ => return Revive::Absent,
            }
        };
        Self::retire(&mut st, peer);
        st.counts.revived += 1;
        self.changed.notify_all();
        Revive::Queued(target)
    }

    /// Waits, at most `timeout`, until `ready` holds; on timeout, the state as it is then.
    fn wait_for(
        &self,
        timeout: Duration,
        ready: impl Fn(&State<K, T>) -> bool,
    ) -> std::result::Result<(), MutexGuard<'_, State<K, T>>> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        while !ready(&st) {
            let now = Instant::now();
            if now >= deadline {
                return Err(st);
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        Ok(())
    }

    /// Waits, at most `timeout`, until the thread is no longer inside the close of mapping `key`.
    pub fn wait_not_closing(&self, key: &K, timeout: Duration) -> bool {
        self.wait_for(timeout, |st| {
            !st.running.as_ref().is_some_and(|r| {
                &r.job.key == key && r.phase == ReleasePhase::Closing && !r.revived
            })
        })
        .is_ok()
    }

    /// Closes of `peer`'s mappings queued or running.
    fn pending_of(st: &State<K, T>, peer: usize) -> usize {
        st.per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Waits, at most `timeout`, until at most `limit` closes of `peer`'s mappings are queued or
    /// running; on timeout they stay queued and the error says how many, since when, and why.
    pub fn wait_below(&self, peer: usize, limit: usize, timeout: Duration) -> Result<()> {
        let st = match self.wait_for(timeout, |st| Self::pending_of(st, peer) <= limit) {
            Ok(()) => return Ok(()),
            Err(st) => st,
        };
        let now = Instant::now();
        let running = Self::pending_running(&st);
        let oldest = (st.queue.iter().chain(running))
            .filter(|j| j.peer == peer)
            .map(|j| now.saturating_duration_since(j.queued_at))
            .max()
            .unwrap_or_default();
        let doing = match running {
            Some(j) => format!(
                "it has been closing a mapping of rank {} for {:?}",
                j.peer,
                now.saturating_duration_since(j.queued_at)
            ),
            None => "it is idle".to_string(),
        };
        Err(Error::timeout(format!(
            "{} replaced mappings of peer rank {peer} are waiting to be closed (at most {limit} \
             may wait; the oldest for {oldest:?}) after {timeout:?}; {doing}. A close waits until \
             all work queued on this process's device context has finished: is a stream waiting \
             for something that happens only after this exchange returns?",
            Self::pending_of(&st, peer)
        )))
    }

    /// Waits, at most `timeout`, until every close submitted before this call has run or was
    /// taken back; how many are still pending on timeout.
    pub fn flush(&self, timeout: Duration) -> std::result::Result<(), usize> {
        // Jobs are numbered in submission order; those submitted later do not count.
        let target = lock(&self.state).submitted;
        let left = |st: &State<K, T>| {
            (st.queue.iter().chain(Self::pending_running(st)))
                .filter(|j| j.seq < target)
                .count()
        };
        self.wait_for(timeout, |st| left(st) == 0)
            .map_err(|st| left(&st))
    }

    pub fn counters(&self) -> ReleaseCounters {
        let st = lock(&self.state);
        let pending = st.submitted - st.retired;
        ReleaseCounters {
            pending,
            ..st.counts
        }
    }

    /// The job the thread runs, unless it was taken back.
    fn pending_running(st: &State<K, T>) -> Option<&ReleaseJob<K, T>> {
        st.running.as_ref().filter(|r| !r.revived).map(|r| &r.job)
    }
}

#[cfg(test)]
mod tests;
