//! The transports a cache is handed: at most one per memory kind, each given ready or made on
//! first use (so a host-only program never loads the CUDA driver). Which exist is decided by the
//! layer that builds the cache (`crate::default_transports`, a program of its own).

use super::{MemKind, Transport};
use crate::error::{Error, Result};
use once_cell::sync::OnceCell;
use std::sync::Arc;

/// Makes a transport the first time its memory kind is used.
pub type TransportFactory = Box<dyn Fn() -> Result<Arc<dyn Transport>> + Send + Sync>;

/// At most one transport per memory kind, indexed by its discriminant.
#[derive(Default)]
pub struct Transports {
    ready: [OnceCell<Arc<dyn Transport>>; 2],
    on_first_use: [Option<TransportFactory>; 2],
}

impl Transports {
    /// The given transports; `InvalidArgument` when two are of one memory kind.
    pub fn of(list: Vec<Arc<dyn Transport>>) -> Result<Transports> {
        let set = Transports::default();
        for t in list {
            let kind = t.kind();
            if set.ready[kind as usize].set(t).is_err() {
                return Err(Error::invalid(format!(
                    "two transports given for {} memory",
                    kind.name()
                )));
            }
        }
        Ok(set)
    }

    /// Makes the transport of `kind` with `make` when first needed, unless one is given.
    pub fn set_on_first_use(&mut self, kind: MemKind, make: TransportFactory) {
        self.on_first_use[kind as usize] = Some(make);
    }

    /// The transport of `kind`, if it exists already.
    pub fn get(&self, kind: MemKind) -> Option<&Arc<dyn Transport>> {
        self.ready[kind as usize].get()
    }

    /// The transport of `kind`, made now when it is made on first use; `Unsupported` when there
    /// is none for `kind`.
    pub fn get_or_make(&self, kind: MemKind) -> Result<&Arc<dyn Transport>> {
        let cell = &self.ready[kind as usize];
        if let Some(t) = cell.get() {
            return Ok(t);
        }
        match &self.on_first_use[kind as usize] {
            Some(make) => cell.get_or_try_init(make),
            None => Err(Error::unsupported(format!(
                "this cache has no {} transport",
                kind.name()
            ))),
        }
    }

    pub fn existing(&self) -> impl Iterator<Item = &Arc<dyn Transport>> {
        self.ready.iter().filter_map(OnceCell::get)
    }
}
