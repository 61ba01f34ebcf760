//! A reserved range of address space (anonymous, `PROT_NONE`, no memory behind it) into which
//! files are mapped at fixed places: the contiguous views of host buffers.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The size of a page, which mappings of a file start and end on.
pub fn page_size() -> u64 {
    // SAFETY: sysconf takes no pointers and only reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// A reserved range; dropping it unmaps the whole range, whatever was mapped into it.
#[derive(Debug)]
pub struct ReservedRange {
    addr: u64,
    len: u64,
}

impl ReservedRange {
    /// Reserves `len` bytes (a multiple of the page size) that nothing can use until a file is
    /// mapped into them.
    pub fn reserve(len: u64) -> Result<ReservedRange> {
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
        Ok(ReservedRange {
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

    /// Maps `len` bytes of `fd`'s file from `file_offset` (both page multiples), read-write and
    /// shared, `at` bytes into the range (a page multiple), replacing the reservation there.
    /// `what` names the file in the error.
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

impl Drop for ReservedRange {
    fn drop(&mut self) {
        // SAFETY: the range was reserved by `reserve` and is unmapped once, here; what was mapped
        // into it goes with it. Users hold raw addresses under the documented contract that they
        // stop using them once the view is released.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len as usize) };
    }
}

#[cfg(test)]
mod tests;
