//! Anonymous shared files (`memfd_create`) and their mappings: the memory of host buffers and
//! slabs, shared by passing the descriptor. Unlike a `/dev/shm` segment, a memfd has no name to
//! leak and is not limited by the size of `/dev/shm` (Docker's default is 64 MiB).

use super::mmap::MappedRange;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`: an empty anonymous file.
pub fn create(name: &str) -> io::Result<OwnedFd> {
    let name = CString::new(name.replace('\0', "_"))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name"))?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a NUL-terminated string alive for the call; flags by value.
    let fd = super::cvt(unsafe { libc::memfd_create(name.as_ptr(), flags) })?;
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals a file's size can never change by: a peer that maps it cannot be killed (SIGBUS) by
/// anyone shrinking it, nor made to map more than was offered.
pub const SIZE_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// Seals of a file nobody can change at all (a record).
pub const IMMUTABLE_SEALS: i32 = SIZE_SEALS | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;

/// Adds `seals` to the memfd `fd` (`F_ADD_SEALS`).
pub fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: `fd` is open for the call; F_ADD_SEALS takes an int by value.
    super::cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

/// The seals of `fd` (`F_GET_SEALS`; EINVAL for a file that is not a memfd).
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: `fd` is open for the call; F_GET_SEALS takes no argument.
    super::cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// Checks that `fd` (a file received from a peer) carries every seal in `wanted`.
pub fn check_seals(fd: BorrowedFd<'_>, wanted: i32, what: &str) -> Result<()> {
    let have = seals(fd).map_err(|e| {
        Error::from_io(
            format!("{what}: reading its seals (a memfd is expected)"),
            &e,
        )
    })?;
    if have & wanted != wanted {
        return Err(Error::protocol(format!(
            "{what} is not sealed against resizing (seals {have:#x}, expected {wanted:#x}): \
             mapping it would let its owner kill this process by truncating it; it is not mapped"
        )));
    }
    Ok(())
}

/// An anonymous file holding exactly `bytes`, sealed so that nobody can change it.
pub fn create_immutable(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    let fd = create(name)?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, bytes)?;
    let fd = OwnedFd::from(file);
    add_seals(fd.as_fd(), IMMUTABLE_SEALS)?;
    Ok(fd)
}

/// The whole content of the immutable file `fd` (sealed as [`create_immutable`] seals), at most
/// `max` bytes; `what` names it for errors.
pub fn read_immutable(fd: OwnedFd, max: usize, what: &str) -> Result<Vec<u8>> {
    check_seals(fd.as_fd(), IMMUTABLE_SEALS & !libc::F_SEAL_SEAL, what)?;
    let size = super::mmap::file_size(fd.as_fd())
        .map_err(|e| Error::from_io(format!("fstat of {what}"), &e))?;
    let len = usize::try_from(size)
        .ok()
        .filter(|&n| n <= max)
        .ok_or_else(|| {
            Error::protocol(format!(
                "{what} holds {size} bytes, more than the {max} it may hold"
            ))
        })?;
    let mut out = vec![0u8; len];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::from(fd), &mut out, 0)
        .map_err(|e| Error::from_io(format!("reading {what}"), &e))?;
    Ok(out)
}

/// An anonymous file of `bytes` bytes, every page reserved (a lack of memory is an error here,
/// not a SIGBUS later), mapped read-write and shared.
pub fn create_mapped(name: &str, bytes: u64) -> Result<SharedMapping> {
    SharedMapping::map(create_reserved(name, bytes)?, bytes, name)
}

/// An anonymous file of `bytes` bytes, every page reserved, not mapped here.
pub fn create_reserved(name: &str, bytes: u64) -> Result<OwnedFd> {
    if bytes == 0 {
        return Err(Error::invalid(format!("shared file {name}: size 0")));
    }
    check_memory_for(name, bytes)?;
    let fd = create(name).map_err(|e| Error::from_io(format!("memfd_create({name:?})"), &e))?;
    let len = libc::off_t::try_from(bytes)
        .map_err(|_| Error::invalid(format!("shared file {name}: size {bytes} too large")))?;
    // SAFETY: `fd` is an open memfd; the range starts at 0 and has a positive length.
    let rc = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return Err(Error::from_io(
            format!(
                "reserving {bytes} bytes of memory for the host buffer {name} ({})",
                memory_headroom().describe()
            ),
            &err,
        ));
    }
    add_seals(fd.as_fd(), SIZE_SEALS)
        .map_err(|e| Error::from_io(format!("sealing the size of {name}"), &e))?;
    Ok(fd)
}

/// A descriptor's file mapped read-write and shared, unmapped on drop; keeps the descriptor.
#[derive(Debug)]
pub struct SharedMapping {
    /// A peer's file: its SIGBUS guard, released (first, as fields drop in order) before the
    /// range is unmapped.
    guard: Option<super::sigbus::Guard>,
    fd: OwnedFd,
    map: MappedRange,
}

impl SharedMapping {
    /// Maps the first `len` bytes of `fd`, which must be at least that long (else a SIGBUS).
    pub fn map(fd: OwnedFd, len: u64, what: &str) -> Result<SharedMapping> {
        let size = super::mmap::file_size(fd.as_fd())
            .map_err(|e| Error::from_io(format!("fstat of the shared file {what}"), &e))?;
        if size < len || len == 0 {
            return Err(Error::protocol(format!(
                "shared file {what} has {size} bytes, expected at least {len} (it was replaced \
                 or truncated)"
            )));
        }
        let map = super::mmap::map_shared(fd.as_fd(), len, what)?;
        Ok(SharedMapping {
            guard: None,
            fd,
            map,
        })
    }

    /// Maps a file a peer sent: it must be sealed against resizing ([`SIZE_SEALS`]), so nobody
    /// can truncate it under this process, and the range is SIGBUS-guarded all the same (a
    /// fault replaces it with zero pages instead of killing the process).
    pub fn map_peer(fd: OwnedFd, len: u64, what: &str) -> Result<SharedMapping> {
        check_seals(fd.as_fd(), SIZE_SEALS, what)?;
        let mut mapping = Self::map(fd, len, what)?;
        mapping.guard = Some(super::sigbus::guard(mapping.map.addr(), len));
        Ok(mapping)
    }

    /// Whether a guarded peer file was found truncated (its range now reads zeros).
    pub fn truncated(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.truncated())
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl std::ops::Deref for SharedMapping {
    type Target = MappedRange;
    fn deref(&self) -> &MappedRange {
        &self.map
    }
}

/// Memory a new anonymous file can take: `MemAvailable`, and what is left below a cgroup limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headroom {
    pub available: Option<u64>,
    pub cgroup_left: Option<u64>,
}

impl Headroom {
    /// The smaller of the known bounds; `None` when neither is known.
    pub fn bytes(&self) -> Option<u64> {
        match (self.available, self.cgroup_left) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        }
    }

    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(a) = self.available {
            parts.push(format!("the node has {a} bytes available"));
        }
        if let Some(c) = self.cgroup_left {
            parts.push(format!(
                "{c} bytes are left below this process's cgroup memory limit"
            ));
        }
        if parts.is_empty() {
            "available memory unknown".to_string()
        } else {
            parts.join(", ")
        }
    }
}

pub fn memory_headroom() -> Headroom {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cgroup_left = super::process::cgroup_dir("memory").and_then(|dir| {
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        cgroup_left(read("memory.max")?.trim(), read("memory.current")?.trim())
    });
    Headroom {
        available: mem_available(&meminfo),
        cgroup_left,
    }
}

/// Refuses an allocation that cannot fit (reserving it would wake the OOM killer).
fn check_memory_for(name: &str, bytes: u64) -> Result<()> {
    let headroom = memory_headroom();
    match headroom.bytes() {
        Some(left) if bytes > left => Err(Error::from_io(
            format!(
                "host buffer {name}: {bytes} bytes requested, but {} (free memory or ask for \
                 less)",
                headroom.describe()
            ),
            &io::Error::from_raw_os_error(libc::ENOMEM),
        )),
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes left below a cgroup v2 `memory.max` (`max` = no limit).
fn cgroup_left(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.parse().ok()?;
    let current: u64 = current.parse().ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests;
