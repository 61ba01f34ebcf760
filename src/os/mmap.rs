//! Shared read-write mappings of a descriptor's file, and its size: what the named segments
//! (`shm`) and the anonymous files (`memfd`) both map.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Maps the first `len` bytes of `fd`'s file read-write and shared; returns the address.
/// `what` names the file in the error.
pub fn map_shared(fd: BorrowedFd<'_>, len: u64, what: &str) -> Result<u64> {
    let size = usize::try_from(len)
        .map_err(|_| Error::invalid(format!("shared memory {what}: size {len} too large")))?;
    // SAFETY: mapping a fresh region (addr NULL) of an open descriptor; the kernel checks the rest.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        let err = io::Error::last_os_error();
        return Err(Error::from_io(format!("mmap({what}, {len} bytes)"), &err));
    }
    Ok(ptr as u64)
}

/// The size of `fd`'s file in bytes.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call and `st` is a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}
