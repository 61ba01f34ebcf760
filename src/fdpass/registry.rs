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

/// Turns the registry's counter (1, 2, 3, ...) into serials that look random and back: a
/// 4-round Feistel network over the two 32-bit halves, whose round function is SipHash under
/// keys drawn at random per registry (std's `RandomState`). A bijection, so each counter has one
/// serial and a serial tells which counter (if any) it came from, without a table of every
/// serial ever issued; without the keys, a serial is as hard to guess as a random 64-bit number.
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

/// Registered descriptors, shared by the owner (register/unregister) and the responder thread
/// (lookup). A lookup hands out a reference, so an unregister during a send closes the
/// descriptor only once the send is done. Serials are unguessable (see [`SerialKeys`]): knowing
/// one, or the order of registration, says nothing of the others.
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

    /// Closes the descriptor of `id` (once no send holds it); later requests get "revoked".
    /// False when it was not registered.
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
        assert_ne!(id.serial, 0);
        assert_eq!(FdId::decode(&id.encode()), Some(id));
        assert_eq!(FdId::decode(&id.encode()[..31]), None);
        let mut bad = id.encode();
        bad[0] = b'X';
        assert_eq!(FdId::decode(&bad), None);
        let held = reg.lookup(id.serial).unwrap();
        assert!(reg.unregister(&id));
        assert!(!reg.unregister(&id));
        assert_eq!(reg.lookup(id.serial).unwrap_err(), ErrorCode::Revoked);
        assert_eq!(
            reg.lookup(id.serial.wrapping_add(1)).unwrap_err(),
            ErrorCode::UnknownId
        );
        assert_eq!(reg.lookup(0).unwrap_err(), ErrorCode::UnknownId);
        // The descriptor stays open while a lookup holds it.
        assert_eq!(sys::file_identity(held.as_fd()).unwrap(), (id.dev, id.ino));
        assert!(reg.is_empty());
    }

    #[test]
    fn serials_are_not_guessable_from_small_numbers_or_from_each_other() {
        let reg = Registry::default();
        let ids: Vec<FdId> = (0..64)
            .map(|i| {
                reg.register(crate::os::memfd::create(&format!("serial-{i}")).unwrap())
                    .unwrap()
            })
            .collect();
        // What an outsider tried: the small numbers, and neighbours of a serial it saw.
        for guess in 0..=1024u64 {
            assert_eq!(
                reg.lookup(guess).unwrap_err(),
                ErrorCode::UnknownId,
                "{guess}"
            );
        }
        let serials: std::collections::HashSet<u64> = ids.iter().map(|id| id.serial).collect();
        assert_eq!(serials.len(), ids.len(), "distinct");
        for pair in ids.windows(2) {
            let (a, b) = (pair[0].serial, pair[1].serial);
            assert!(a.abs_diff(b) > 1 << 20, "{a:#x} then {b:#x}");
        }
        // Spread over the whole range: the top bits vary.
        let tops: std::collections::HashSet<u64> = ids.iter().map(|id| id.serial >> 60).collect();
        assert!(tops.len() > 4, "{tops:?}");
        // Another registry (another process) gives other serials.
        let other = Registry::default();
        let first = other
            .register(crate::os::memfd::create("serial-other").unwrap())
            .unwrap();
        assert_ne!(first.serial, ids[0].serial);
        assert!(other.lookup(ids[0].serial).is_err());
        for id in &ids {
            assert!(reg.lookup(id.serial).is_ok());
        }
        // The permutation inverts exactly.
        let t = lock(&reg.table);
        for c in [1u64, 2, 3, u64::MAX, 1 << 40] {
            assert_eq!(t.keys.counter_of(t.keys.serial_of(c)), c);
        }
    }
}
