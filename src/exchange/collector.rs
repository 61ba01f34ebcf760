//! Deletes consumed store records off the hot path: the importer hands the keys it has read to a
//! background thread, so garbage collection never adds a store round trip to an exchange.

use crate::error::{Error, Result};
use crate::store::Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Deletes consumed records off the hot path.
pub(crate) struct Collector {
    queue: Option<crossbeam::channel::Sender<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Collector {
    pub(crate) fn start(store: Arc<dyn Store>, deleted: Arc<AtomicU64>) -> Result<Collector> {
        let (tx, rx) = crossbeam::channel::unbounded::<Vec<String>>();
        let thread = std::thread::Builder::new()
            .name("nvfipc-gc".into())
            .spawn(move || {
                // After a failed delete (store gone) the rest is skipped, so that dropping the
                // cache never waits on a dead store; a leftover key is harmless (never reused).
                let mut healthy = true;
                for keys in rx {
                    for key in &keys {
                        if !healthy {
                            break;
                        }
                        match store.delete_key(key) {
                            Ok(true) => {
                                deleted.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(false) => {}
                            Err(_) => healthy = false,
                        }
                    }
                }
            })
            .map_err(|e| Error::from_io("starting the record collector thread", &e))?;
        Ok(Collector {
            queue: Some(tx),
            thread: Some(thread),
        })
    }

    pub(crate) fn delete(&self, keys: Vec<String>) {
        if let Some(q) = &self.queue {
            let _ = q.send(keys);
        }
    }

    /// Deletes everything queued so far, then stops.
    pub(crate) fn finish(&mut self) {
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
