//! The table of descriptors a process offers to its importers, and the id that names one.

use super::frame::ErrorCode;
use crate::error::{Error, Result};
use crate::os::fd_passing as sys;
use crate::sync::lock;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// Names one registered descriptor of one process, in a transport's record: the responder looks
/// up `serial`; the pidfd rung takes `fd` (the number in the exporter) and checks `dev`/`ino`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FdId {
    pub serial: u64,
    pub fd: RawFd,
    pub dev: u64,
    pub ino: u64,
}

const ID_TAG: [u8; 4] = *b"FDI1";
/// Bytes of [`FdId::encode`].
pub const FD_ID_LEN: usize = 32;

impl FdId {
    /// `FDI1 | serial u64 | fd i32 | dev u64 | ino u64`, little-endian.
    pub fn encode(&self) -> [u8; FD_ID_LEN] {
        let mut out = [0u8; FD_ID_LEN];
        out[..4].copy_from_slice(&ID_TAG);
        out[4..12].copy_from_slice(&self.serial.to_le_bytes());
        out[12..16].copy_from_slice(&self.fd.to_le_bytes());
        out[16..24].copy_from_slice(&self.dev.to_le_bytes());
        out[24..32].copy_from_slice(&self.ino.to_le_bytes());
        out
    }

    /// Parses [`encode`](Self::encode)'s bytes; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<FdId> {
        if bytes.len() != FD_ID_LEN || bytes[..4] != ID_TAG {
            return None;
        }
        let id = FdId {
            serial: u64::from_le_bytes(bytes[4..12].try_into().ok()?),
            fd: i32::from_le_bytes(bytes[12..16].try_into().ok()?),
            dev: u64::from_le_bytes(bytes[16..24].try_into().ok()?),
            ino: u64::from_le_bytes(bytes[24..32].try_into().ok()?),
        };
        (id.serial != 0 && id.fd >= 0).then_some(id)
    }
}

impl std::fmt::Display for FdId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fd id {} (fd {} there)", self.serial, self.fd)
    }
}

/// Turns the registry's counter into serials that look random, and back: a 4-round Feistel
/// network keyed at random per registry (PROTOCOL.md section 7). A bijection, so a serial tells
/// its counter without a table of every serial issued.
struct SerialKeys(RandomState);

impl SerialKeys {
    const ROUNDS: u8 = 4;

    fn round(&self, round: u8, half: u32) -> u32 {
        self.0.hash_one((round, half)) as u32
    }

    fn serial_of(&self, counter: u64) -> u64 {
        let (mut l, mut r) = ((counter >> 32) as u32, counter as u32);
        for i in 0..Self::ROUNDS {
            (l, r) = (r, l ^ self.round(i, r));
        }
        (u64::from(l) << 32) | u64::from(r)
    }

    fn counter_of(&self, serial: u64) -> u64 {
        let (mut l, mut r) = ((serial >> 32) as u32, serial as u32);
        for i in (0..Self::ROUNDS).rev() {
            (l, r) = (r ^ self.round(i, l), l);
        }
        (u64::from(l) << 32) | u64::from(r)
    }
}

struct Table {
    /// Counters handed out so far are `1..next`; serials are their images under `keys`.
    next: u64,
    keys: SerialKeys,
    /// Registered descriptors by counter.
    entries: HashMap<u64, Arc<OwnedFd>>,
}

/// Registered descriptors, shared by the owner and the responder thread. A lookup hands out a
/// reference, so an unregister during a send closes the descriptor once the send is done.
pub struct Registry {
    table: Mutex<Table>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            table: Mutex::new(Table {
                next: 1,
                keys: SerialKeys(RandomState::new()),
                entries: HashMap::new(),
            }),
        }
    }
}

impl Registry {
    /// Takes `fd` into the table; it stays open until [`unregister`](Self::unregister).
    pub fn register(&self, fd: OwnedFd) -> Result<FdId> {
        let (dev, ino) = sys::file_identity(fd.as_fd()).map_err(|e| {
            Error::from_io(
                format!("fd transport: fstat of descriptor {}", fd.as_raw_fd()),
                &e,
            )
        })?;
        let raw = fd.as_raw_fd();
        let mut t = lock(&self.table);
        // Serial 0 means "none" on the wire: the one counter that maps to it is skipped.
        let (counter, serial) = loop {
            let counter = t.next;
            t.next += 1;
            let serial = t.keys.serial_of(counter);
            if serial != 0 {
                break (counter, serial);
            }
        };
        t.entries.insert(counter, Arc::new(fd));
        Ok(FdId {
            serial,
            fd: raw,
            dev,
            ino,
        })
    }

    /// Closes the descriptor of `id` once no send holds it; false when it was not registered.
    pub fn unregister(&self, id: &FdId) -> bool {
        let mut t = lock(&self.table);
        if id.serial == 0 {
            return false;
        }
        let counter = t.keys.counter_of(id.serial);
        t.entries.remove(&counter).is_some()
    }

    /// The descriptor registered as `serial`, or why there is none.
    pub fn lookup(&self, serial: u64) -> std::result::Result<Arc<OwnedFd>, ErrorCode> {
        let t = lock(&self.table);
        if serial == 0 {
            return Err(ErrorCode::UnknownId);
        }
        let counter = t.keys.counter_of(serial);
        match t.entries.get(&counter) {
            Some(fd) => Ok(fd.clone()),
            None if counter != 0 && counter < t.next => Err(ErrorCode::Revoked),
            None => Err(ErrorCode::UnknownId),
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.table).entries.len()
    }
}

#[cfg(test)]
mod tests;
