//! Anonymous shared files (`memfd_create`) and their mappings: the memory of host buffers and
//! slabs, shared by passing the descriptor. Unlike a `/dev/shm` segment, a memfd has no name to
//! leak and is not limited by the size of `/dev/shm` (Docker's default is 64 MiB).

use super::mmap::MappedRange;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `memfd_create(name, MFD_CLOEXEC)`: an empty anonymous file.
pub fn create(name: &str) -> io::Result<OwnedFd> {
    let name = CString::new(name.replace('\0', "_"))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name"))?;
    // SAFETY: `name` is a NUL-terminated string alive for the call; flags by value.
    let fd = super::cvt(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
    Ok(fd)
}

/// A descriptor's file mapped read-write and shared, unmapped on drop; keeps the descriptor.
#[derive(Debug)]
pub struct SharedMapping {
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
        Ok(SharedMapping { fd, map })
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
