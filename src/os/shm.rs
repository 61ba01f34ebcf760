//! A POSIX shared-memory segment (`shm_open` + `mmap`), owned or opened. The creator unlinks the
//! name ([`ShmSegment::unlink`], or on drop); openers only unmap. Mappings outlive the name.

use super::mmap::MappedRange;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

#[derive(Debug)]
pub struct ShmSegment {
    name: String,
    map: MappedRange,
    owns_name: bool,
    /// This name's slot in the exit-time cleanup table (see `os::cleanup`).
    cleanup_slot: Option<usize>,
    /// The file's owner (`st_uid`) as the kernel reports it.
    owner: u32,
}

/// "/dev/shm has F of T bytes free", for messages.
pub fn shm_space() -> String {
    match shm_free_and_total() {
        Some((free, total)) => format!("/dev/shm has {free} of {total} bytes free"),
        None => "/dev/shm's free space is unknown".to_string(),
    }
}

/// Free and total bytes of `/dev/shm`.
pub fn shm_free_and_total() -> Option<(u64, u64)> {
    // SAFETY: an all-zero `statvfs` is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid NUL-terminated string and `st` a valid out pointer.
    if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// Longest shm name accepted (it must fit a record payload with its NUL).
pub const MAX_NAME_LEN: usize = 63;

fn c_name(name: &str) -> Result<CString> {
    if !name.starts_with('/') || name[1..].contains('/') || name.len() > MAX_NAME_LEN {
        return Err(Error::invalid(format!(
            "shared-memory name {name:?} must start with '/', contain no other '/' and be at \
             most {MAX_NAME_LEN} bytes"
        )));
    }
    CString::new(name).map_err(|_| Error::invalid(format!("shm name {name:?} contains NUL")))
}

impl ShmSegment {
    /// Creates a new zero-filled segment of `len` bytes; fails if the name exists.
    pub fn create(name: &str, len: u64) -> Result<ShmSegment> {
        let cname = c_name(name)?;
        if len == 0 {
            return Err(Error::invalid(format!("shm segment {name}: size 0")));
        }
        // SAFETY: `cname` is a valid NUL-terminated string; the flags create a new object only.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            let err = io::Error::last_os_error();
            return Err(Error::from_io(format!("shm_open({name}, create)"), &err));
        }
        // SAFETY: shm_open returned a fresh descriptor that nothing else owns; it is closed on
        // return (a mapping keeps its own reference).
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        match Self::truncate_and_map(fd.as_fd(), name, len) {
            Ok(map) => Ok(ShmSegment {
                name: name.to_string(),
                map,
                owns_name: true,
                cleanup_slot: super::cleanup::register(name),
                owner: super::fd_passing::effective_uid(),
            }),
            Err(e) => {
                // SAFETY: `cname` is valid; we created the name above and nobody else owns it.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
                Err(e)
            }
        }
    }

    fn truncate_and_map(fd: BorrowedFd<'_>, name: &str, len: u64) -> Result<MappedRange> {
        let off_len = libc::off_t::try_from(len)
            .map_err(|_| Error::invalid(format!("shm segment {name}: size {len} too large")))?;
        // SAFETY: `fd` is an open shm descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), off_len) } != 0 {
            let err = io::Error::last_os_error();
            return Err(Error::from_io(
                format!("ftruncate({name}, {len}) (is /dev/shm full?)"),
                &err,
            ));
        }
        // ftruncate is sparse: reserve every page now, so a full tmpfs is an error, not a SIGBUS.
        // SAFETY: `fd` is an open shm descriptor; the range is within the size just set.
        let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, off_len) };
        if rc != 0 {
            let err = io::Error::from_raw_os_error(rc);
            return Err(Error::from_io(
                format!(
                    "reserving {len} bytes of shared memory for {name} ({}; raise its size, \
                     e.g. docker --shm-size, or free space there)",
                    shm_space()
                ),
                &err,
            ));
        }
        super::mmap::map_shared(fd, len, name)
    }

    /// Opens and maps an existing segment, whose size must be at least `min_len` bytes.
    /// Returns `Ok(None)` when no segment of that name exists (yet).
    pub fn open(name: &str, min_len: u64) -> Result<Option<ShmSegment>> {
        Self::open_inner(name, min_len, false)
    }

    /// Like [`open`](Self::open), but a segment not yet sized to `min_len` also gives `Ok(None)`.
    pub fn open_when_sized(name: &str, min_len: u64) -> Result<Option<ShmSegment>> {
        Self::open_inner(name, min_len, true)
    }

    fn open_inner(name: &str, min_len: u64, short_is_absent: bool) -> Result<Option<ShmSegment>> {
        let cname = c_name(name)?;
        // SAFETY: `cname` is a valid NUL-terminated string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOENT) {
                return Ok(None);
            }
            return Err(Error::from_io(format!("shm_open({name})"), &err));
        }
        // SAFETY: as in `create`.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = super::mmap::fstat(fd.as_fd())
            .map_err(|e| Error::from_io(format!("fstat({name})"), &e))?;
        let len = u64::try_from(st.st_size).unwrap_or(0);
        if len < min_len || len == 0 {
            if short_is_absent {
                return Ok(None);
            }
            return Err(Error::protocol(format!(
                "shared-memory segment {name} has {len} bytes, expected at least {min_len}: it \
                 was replaced or truncated (stale segment of another job?)"
            )));
        }
        Ok(Some(ShmSegment {
            name: name.to_string(),
            map: super::mmap::map_shared(fd.as_fd(), len, name)?,
            owns_name: false,
            cleanup_slot: None,
            owner: st.st_uid,
        }))
    }

    /// The uid that owns the segment's file.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the name (idempotent); the mapping stays valid.
    pub fn unlink(&mut self) {
        if self.owns_name {
            self.owns_name = false;
            unlink_name(&self.name);
            if let Some(slot) = self.cleanup_slot.take() {
                super::cleanup::unregister(slot);
            }
        }
    }
}

/// Removes a shm name, ignoring "does not exist".
pub fn unlink_name(name: &str) {
    if let Ok(cname) = CString::new(name) {
        // SAFETY: `cname` is a valid NUL-terminated string.
        unsafe { libc::shm_unlink(cname.as_ptr()) };
    }
}

impl std::ops::Deref for ShmSegment {
    type Target = MappedRange;
    fn deref(&self) -> &MappedRange {
        &self.map
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        self.unlink();
    }
}

#[cfg(test)]
mod tests;
