//! The table of descriptors a process offers to its importers, and the id that names one.

use super::frame::ErrorCode;
use super::sys;
use crate::error::{Error, Result};
use crate::sync::lock;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// Names one registered descriptor of one process. It travels inside a transport's record (see
/// [`FdId::encode`]): `serial` is what the responder looks up; `fd` (the descriptor number in
/// the exporter) and `dev`/`ino` (its `fstat`) serve the `pidfd_getfd` rung, which takes a
/// number and checks that what it got is the same file.
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

#[derive(Default)]
struct Table {
    /// Serials handed out so far are `1..next`.
    next: u64,
    entries: HashMap<u64, Arc<OwnedFd>>,
}

/// Registered descriptors, shared by the owner (register/unregister) and the responder thread
/// (lookup). A lookup hands out a reference, so an unregister during a send closes the
/// descriptor only once the send is done.
#[derive(Default)]
pub struct Registry {
    table: Mutex<Table>,
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
        t.next = t.next.max(1);
        let serial = t.next;
        t.next += 1;
        t.entries.insert(serial, Arc::new(fd));
        Ok(FdId {
            serial,
            fd: raw,
            dev,
            ino,
        })
    }

    /// Closes the descriptor of `id` (once no send holds it); later requests get "revoked".
    /// False when it was not registered.
    pub fn unregister(&self, id: &FdId) -> bool {
        lock(&self.table).entries.remove(&id.serial).is_some()
    }

    /// The descriptor registered as `serial`, or why there is none.
    pub fn lookup(&self, serial: u64) -> std::result::Result<Arc<OwnedFd>, ErrorCode> {
        let t = lock(&self.table);
        match t.entries.get(&serial) {
            Some(fd) => Ok(fd.clone()),
            None if serial != 0 && serial < t.next => Err(ErrorCode::Revoked),
            None => Err(ErrorCode::UnknownId),
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.table).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_revocation_is_told_from_unknown() {
        let reg = Registry::default();
        let fd = crate::os::memfd::create("registry-test").unwrap();
        let id = reg.register(fd).unwrap();
        assert_eq!(id.serial, 1);
        assert_eq!(FdId::decode(&id.encode()), Some(id));
        assert_eq!(FdId::decode(&id.encode()[..31]), None);
        let mut bad = id.encode();
        bad[0] = b'X';
        assert_eq!(FdId::decode(&bad), None);
        let held = reg.lookup(1).unwrap();
        assert!(reg.unregister(&id));
        assert!(!reg.unregister(&id));
        assert_eq!(reg.lookup(1).unwrap_err(), ErrorCode::Revoked);
        assert_eq!(reg.lookup(2).unwrap_err(), ErrorCode::UnknownId);
        assert_eq!(reg.lookup(0).unwrap_err(), ErrorCode::UnknownId);
        // The descriptor stays open while a lookup holds it.
        assert_eq!(sys::file_identity(held.as_fd()).unwrap(), (id.dev, id.ino));
        assert!(reg.is_empty());
    }
}
