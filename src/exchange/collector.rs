//! Deletes consumed store records off the hot path: the importer hands the keys it has read to a
//! background thread, so garbage collection never adds a store round trip to an exchange.
//!
//! Keys of records the importer did not read may not have reached the store yet: a delete of one
//! that finds nothing is tried again every [`RETRY`], up to [`TRIES`] times (a leftover key is
//! harmless: keys are never reused).

use crate::error::{Error, Result};
use crate::store::Store;
use crossbeam::channel::RecvTimeoutError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Pause between two deletes of a key that was not there yet.
const RETRY: Duration = Duration::from_millis(5);
/// Deletes of such a key before it is given up (about 1 s).
const TRIES: u32 = 200;

/// Keys to delete, and whether they were read from the store (else they are there, or soon).
type Deletion = (Vec<String>, bool);

/// Deletes consumed records off the hot path.
pub(crate) struct Collector {
    queue: Option<crossbeam::channel::Sender<Deletion>>,
    thread: Option<JoinHandle<()>>,
    /// Set by [`abandon`](Collector::abandon): the thread deletes nothing more.
    abandoned: Arc<AtomicBool>,
}

/// The collector thread's state: the store, and keys waiting to be there.
struct Sweeper {
    store: Arc<dyn Store>,
    deleted: Arc<AtomicU64>,
    /// After a failed delete (store gone) everything is skipped, so that dropping the cache
    /// never waits on a dead store.
    healthy: bool,
    /// The cache is closing after its peers (or its store) left: nothing more is deleted.
    abandoned: Arc<AtomicBool>,
    late: Vec<(String, u32)>,
}

impl Sweeper {
    /// Deletes `key`; whether it was there.
    fn delete(&mut self, key: &str) -> bool {
        if !self.healthy || self.abandoned.load(Ordering::Acquire) {
            return true;
        }
        match self.store.delete_key(key) {
            Ok(true) => {
                self.deleted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(false) => false,
            Err(_) => {
                self.healthy = false;
                true
            }
        }
    }

    fn run(&mut self, (keys, read): Deletion) {
        for key in keys {
            if !self.delete(&key) && !read {
                self.late.push((key, 1));
            }
        }
    }

    /// Tries the late keys again; those still absent after [`TRIES`] are given up.
    fn retry_late(&mut self) {
        let late = std::mem::take(&mut self.late);
        for (key, tries) in late {
            if !self.delete(&key) && tries < TRIES {
                self.late.push((key, tries + 1));
            }
        }
    }
}

impl Collector {
    pub(crate) fn start(store: Arc<dyn Store>, deleted: Arc<AtomicU64>) -> Result<Collector> {
        let (tx, rx) = crossbeam::channel::unbounded::<Deletion>();
        let abandoned = Arc::new(AtomicBool::new(false));
        let mut sweeper = Sweeper {
            store,
            deleted,
            healthy: true,
            abandoned: abandoned.clone(),
            late: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("nvfipc-gc".into())
            .spawn(move || {
                // Off the caller's path: a connection of its own where the store can open one
                // (never holding back exchanges).
                if let Some(own) = sweeper.store.separate_connection() {
                    sweeper.store = own;
                }
                loop {
                    let job = if sweeper.late.is_empty() {
                        rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    } else {
                        rx.recv_timeout(RETRY)
                    };
                    match job {
                        Ok(job) => sweeper.run(job),
                        Err(RecvTimeoutError::Timeout) => sweeper.retry_late(),
                        Err(RecvTimeoutError::Disconnected) => {
                            // The cache is closing: one last try for what is late.
                            sweeper.retry_late();
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::from_io("starting the record collector thread", &e))?;
        Ok(Collector {
            queue: Some(tx),
            thread: Some(thread),
            abandoned,
        })
    }

    /// Deletes keys of records this rank has read.
    pub(crate) fn delete(&self, keys: Vec<String>) {
        self.send((keys, true));
    }

    /// Deletes keys of records this rank did not read, once they have reached the store.
    pub(crate) fn delete_when_written(&self, keys: Vec<String>) {
        self.send((keys, false));
    }

    fn send(&self, job: Deletion) {
        if let Some(q) = &self.queue {
            let _ = q.send(job);
        }
    }

    /// Stops without deleting what is still queued or late (no store request from now on,
    /// except one already under way): for a cache whose peers, who alone would read those keys,
    /// have left, or whose store has gone.
    pub(crate) fn abandon(&mut self) {
        self.abandoned.store(true, Ordering::Release);
        self.finish();
    }

    /// Deletes everything queued so far, then stops.
    pub(crate) fn finish(&mut self) {
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
