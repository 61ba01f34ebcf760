//! One import table for every kind of peer device memory (legacy IPC, VMM runs, pool
//! allocations).
//!
//! A peer allocation is mapped into this process at most once per identity (its key: for legacy
//! IPC the handle bytes and the importing device; for VMM the run key, exporter pid, device and
//! segment ids; for pools the exporter pid, device and the pointer's export data). The table
//! counts references per key, and every kind gets the same lifecycle from it:
//!
//! * [`ImportTable::acquire`] finds a live import and takes another reference; else takes a
//!   mapping still queued for its close back from the releaser, still mapped; else waits (bounded)
//!   for a close in progress and opens afresh with the kind's open step, under the table lock, so
//!   two importers of one key never open it twice;
//! * it returns an [`Import`] guard: dropping it (or [`Import::release`], which reports an error)
//!   drops the reference, and the last one hands the mapping to the kind's releaser thread
//!   ([`super::release`]), which waits for the device work queued before the release and then
//!   closes it. Nothing is ever closed on the caller's thread, except by [`ImportTable::close_now`]
//!   (the low-level C API's synchronous close);
//! * [`ImportTable::wait_room`] and [`ImportTable::flush`] are the per-peer bound of closes waiting
//!   and the bounded wait for all of them.
//!
//! What is specific to a kind (how to open, how to drain and close, a sub-table such as VMM's
//! imported segments or the imported pools) lives in its module behind [`ImportKind`]; its
//! sub-table ([`ImportKind::Side`]) is kept under the same lock as the entries, so the open step
//! and the post-close bookkeeping see one consistent state.

use super::release::{Found, Job, ReleaseCounters, Releaser};
use crate::error::{Error, Result};
use crate::sync::lock;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one kind of device memory adds to the import table.
pub(crate) trait ImportKind: Send + Sync + 'static {
    /// The identity of a peer allocation as imported here.
    type Key: Copy + Eq + Hash + Debug + Send + Sync + 'static;
    /// What closing a mapping needs (where it is mapped, its context, ...).
    type Mapped: Clone + Send + 'static;
    /// The kind's own state, kept under the table's lock.
    type Side: Default + Send + 'static;

    /// Name of the releaser thread.
    const THREAD: &'static str;
    /// What a flush that timed out reports as still waiting ("... mapping(s) were still waiting
    /// to be closed").
    const PENDING: &'static str;

    /// Where the mapping starts in this process.
    fn base(&self, mapped: &Self::Mapped) -> u64;

    /// Whether the last release must close the mapping (false: nothing was opened, e.g. this
    /// process's own allocation); such entries are not counted as mapped.
    fn closes(&self, _mapped: &Self::Mapped) -> bool {
        true
    }

    /// Waits for the device work queued before the release; the mapping stays intact (and may
    /// still be taken back).
    fn drain(&self, peer: usize, mapped: &Self::Mapped) -> Result<()>;

    /// Closes the mapping (without the table's lock on the releaser thread).
    fn close(&self, peer: usize, mapped: &Self::Mapped) -> Result<()>;

    /// Bookkeeping after [`close`](Self::close), whatever its outcome, under the table's lock.
    fn closed(&self, _side: &mut Self::Side, _mapped: &Self::Mapped) {}
}

/// One imported peer allocation.
pub(crate) struct Entry<M> {
    pub mapped: M,
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
pub(crate) enum Opened<Key, M> {
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

/// A process-wide table of one kind's imports (cheap to clone: all clones are the same table).
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

// Lock order: the table's lock, then the releaser's (inside `find_or_take_back` and `submit`).
// The releaser never holds its own lock while it runs a step, so its close step may take the
// table's lock. Every update under the table's lock is a few map operations, so `lock` may
// ignore poisoning.

impl<K: ImportKind> ImportTable<K> {
    pub fn new(kind: K) -> Self {
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
                move |job: &Job<K::Key, K::Mapped>| drain_kind.drain(job.peer, &job.target),
                move |job: &Job<K::Key, K::Mapped>| {
                    let closed = close_kind.close(job.peer, &job.target);
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

    #[cfg(test)]
    fn kind(&self) -> &K {
        &self.inner.kind
    }

    /// Takes a reference on the import of `key` for rank `peer`: a live one, one taken back from
    /// the releaser, or (after waiting at most `wait` for a close of `key` in progress) what
    /// `open` does under the table's lock. `what` names the allocation in a timeout.
    pub fn acquire(
        &self,
        key: K::Key,
        peer: usize,
        wait: Duration,
        what: impl Fn() -> String,
        open: impl FnOnce(&mut Tables<K>) -> Result<Opened<K::Key, K::Mapped>>,
    ) -> Result<Import<K>> {
        let kind = &*self.inner.kind;
        let found = self.inner.releaser.find_or_take_back(
            &self.inner.state,
            &key,
            wait,
            |t: &mut Tables<K>| {
                t.entries.get_mut(&key).map(|e| {
                    e.refs += 1;
                    kind.base(&e.mapped)
                })
            },
            |t: &mut Tables<K>, mapped| {
                let base = kind.base(&mapped);
                t.entries.insert(key, Entry { mapped, refs: 1 });
                base
            },
            what,
        )?;
        let (held, base) = match found {
            Found::Ready(base) => (key, base),
            Found::Open(mut t) => match open(&mut t)? {
                Opened::Mapped(mapped) => {
                    let base = kind.base(&mapped);
                    t.entries.insert(key, Entry { mapped, refs: 1 });
                    (key, base)
                }
                Opened::Within { key: outer, offset } => {
                    let e = t.entries.get_mut(&outer).ok_or_else(|| {
                        Error::internal(format!("{outer:?} serves {key:?} but is not imported"))
                    })?;
                    e.refs += 1;
                    (outer, kind.base(&e.mapped) + offset)
                }
            },
        };
        Ok(Import {
            table: self.clone(),
            key: held,
            peer,
            base,
            held: true,
        })
    }

    /// Drops one reference of `key`; the entry, removed, when it was the last one.
    fn drop_reference(
        t: &mut Tables<K>,
        key: &K::Key,
        what: impl FnOnce() -> String,
    ) -> Result<Option<K::Mapped>> {
        let entry = t.entries.get_mut(key).ok_or_else(|| {
            Error::not_found(format!("{} is not imported (released twice?)", what()))
        })?;
        entry.refs -= 1;
        if entry.refs > 0 {
            return Ok(None);
        }
        Ok(t.entries.remove(key).map(|e| e.mapped))
    }

    /// Drops one reference of `key` taken for `peer`; the last one hands the mapping to the
    /// releaser (never waits for device work).
    pub fn release(&self, key: &K::Key, peer: usize, what: impl FnOnce() -> String) -> Result<()> {
        let mut t = lock(&self.inner.state);
        match Self::drop_reference(&mut t, key, what)? {
            // Submitted under the table's lock: `acquire` never misses a mapping in between.
            Some(mapped) if self.inner.kind.closes(&mapped) => {
                self.inner.releaser.submit(*key, peer, mapped)
            }
            _ => Ok(()),
        }
    }

    /// Drops one reference of `key` and, when it was the last one, closes the mapping on this
    /// thread, under the table's lock (no import of the same key runs before it is closed). The
    /// caller promises that no device work still uses it.
    pub fn close_now(
        &self,
        key: &K::Key,
        peer: usize,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let mut t = lock(&self.inner.state);
        match Self::drop_reference(&mut t, key, what)? {
            Some(mapped) if self.inner.kind.closes(&mapped) => {
                let closed = self.inner.kind.close(peer, &mapped);
                self.inner.kind.closed(&mut t.side, &mapped);
                closed
            }
            _ => Ok(()),
        }
    }

    /// Back-pressure: waits, at most `timeout`, until at most
    /// [`max_pending_per_peer`](super::release::max_pending_per_peer) closes of `peer`'s mappings
    /// wait (see [`Releaser::wait_below`]).
    pub fn wait_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        self.inner.releaser.wait_room(peer, timeout)
    }

    /// [`wait_room`](Self::wait_room) with the bound `limit`.
    #[cfg(test)]
    fn wait_below(&self, peer: usize, limit: usize, timeout: Duration) -> Result<()> {
        self.inner.releaser.wait_below(peer, limit, timeout)
    }

    /// Waits, at most `timeout`, until every close queued before this call has run; a `Timeout`
    /// saying how many are left otherwise (they stay queued).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.inner.releaser.flush_within(timeout, K::PENDING)
    }

    /// Reads the table under its lock: live entries, the kind's state, and the releaser's counters
    /// read under the same lock (so an entry is never counted both live and pending).
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

/// One reference on an imported peer allocation. Dropping it releases the reference (the last
/// one hands the mapping to the releaser); [`release`](Self::release) does the same and reports
/// an error.
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

    /// Releases the reference now, reporting an error (the releaser thread could not start).
    pub fn release(mut self) -> Result<()> {
        self.held = false;
        self.table
            .release(&self.key, self.peer, || format!("{:?}", self.key))
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

#[cfg(test)]
mod tests;
