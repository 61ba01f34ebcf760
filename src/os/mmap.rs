//! Memory mappings: a descriptor's file mapped shared (for `shm` and `memfd`), reserved ranges
//! with files mapped at fixed places (host views).

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Maps the first `len` bytes of `fd`'s file read-write and shared.
pub fn map_shared(fd: BorrowedFd<'_>, len: u64, what: &str) -> Result<MappedRange> {
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
    Ok(MappedRange {
        addr: ptr as u64,
        len,
    })
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call and `st` is a valid out pointer.
    super::cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(u64::try_from(fstat(fd)?.st_size).unwrap_or(0))
}

/// The size of a page, which mappings of a file start and end on.
pub fn page_size() -> u64 {
    // SAFETY: sysconf takes no pointers and only reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// A mapped (or reserved) range, unmapped whole on drop, whatever was mapped into it.
#[derive(Debug)]
pub struct MappedRange {
    addr: u64,
    len: u64,
}

impl MappedRange {
    /// Reserves `len` bytes (a page multiple) of addresses, unusable until a file is mapped in.
    pub fn reserve(len: u64) -> Result<MappedRange> {
        let size = usize::try_from(len)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| Error::invalid(format!("cannot reserve {len} bytes of addresses")))?;
        // SAFETY: a fresh anonymous mapping (addr NULL) with no access; no memory is committed.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            return Err(Error::from_io(
                format!("reserving {len} bytes of address space"),
                &err,
            ));
        }
        Ok(MappedRange {
            addr: ptr as u64,
            len,
        })
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Maps `len` bytes of `fd`'s file from `file_offset`, read-write and shared, `at` bytes into
    /// the range (all page multiples), replacing the reservation there.
    pub fn map_file(
        &self,
        at: u64,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        len: u64,
        what: &str,
    ) -> Result<()> {
        let fits = at.checked_add(len).is_some_and(|end| end <= self.len);
        let offset = libc::off_t::try_from(file_offset).ok();
        let (true, Some(offset), Ok(size)) = (fits && len > 0, offset, usize::try_from(len)) else {
            return Err(Error::invalid(format!(
                "mapping {what}: {len} bytes at {at} do not fit the reserved {} bytes",
                self.len
            )));
        };
        // SAFETY: [addr + at, + len) lies inside this reservation (checked above), which this
        // object owns: MAP_FIXED replaces only our own PROT_NONE pages (or an earlier mapping of
        // ours there), never memory anything else uses.
        let ptr = unsafe {
            libc::mmap(
                (self.addr + at) as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            return Err(Error::from_io(
                format!("mmap({what}, {len} bytes from offset {file_offset}, fixed)"),
                &err,
            ));
        }
        Ok(())
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `reserve` or `map_shared` and is unmapped once, here;
        // what was mapped into it goes with it. Users hold raw addresses under the documented
        // contract that they stop using them once the view or buffer is released.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len as usize) };
    }
}

#[cfg(test)]
mod tests;
