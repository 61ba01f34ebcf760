//! The host allocator: every buffer is its own POSIX shared-memory segment, registered in a
//! process-wide table so that a pointer anywhere inside it can be resolved and exported.
//!
//! Segment names are `/nvfipc-<job>-<pid>n<pid namespace>-<id>`: the job tag keeps concurrent jobs
//! apart and lets tests check that a job left nothing in `/dev/shm`; the pid lets others reclaim
//! the segments of a dead process (`os::cleanup`); `<id>` is unique in the process and doubles
//! as the buffer id of exported records. A segment is unlinked and unmapped when it is freed, and
//! its name at the latest when the process exits or is terminated.

use crate::error::{Error, Result};
use crate::os::shm::ShmSegment;
use crate::sync::lock;
use once_cell::sync::Lazy;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A registered segment as seen by the transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base: u64,
    pub len: u64,
    pub id: u64,
    pub name: String,
}

/// Live segments by base address, with their ids.
static SEGMENTS: Lazy<Mutex<BTreeMap<u64, (ShmSegment, u64)>>> = Lazy::new(Default::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static DEFAULT_JOB: Lazy<Mutex<String>> = Lazy::new(|| {
    Mutex::new(job_tag(
        &std::env::var("NVFIPC_JOB_ID").unwrap_or_else(|_| "nojob".to_string()),
    ))
});

// Nothing panics while holding these locks; `lock` tolerates poisoning anyway.

/// Sets the job id used in the names of segments allocated by [`alloc`] from now on
/// (default: `$NVFIPC_JOB_ID`, else `nojob`).
pub fn set_default_job(job_id: &str) {
    *lock(&DEFAULT_JOB) = job_tag(job_id);
}

/// The job tag currently used by [`alloc`].
pub fn default_job() -> String {
    lock(&DEFAULT_JOB).clone()
}

pub use crate::names::{job_prefix, job_tag};

/// A host buffer in shared memory that peers can map. Freed (unlinked and unmapped) on drop,
/// unless handed over with [`HostBuffer::into_raw`].
#[derive(Debug)]
pub struct HostBuffer {
    ptr: u64,
    len: u64,
    id: u64,
}

impl HostBuffer {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    /// The address as an integer (what requests carry).
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment id, which is also the buffer id in exported records.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        // SAFETY: the range lies inside the live mapping (checked above); the source is a
        // separate Rust slice, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (self.ptr + offset) as *mut u8, data.len())
        };
        Ok(())
    }

    /// Copies `out.len()` bytes from the buffer at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len() as u64)?;
        // SAFETY: the range lies inside the live mapping (checked above); `out` is a separate
        // Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.ptr + offset) as *const u8,
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    fn check_range(&self, offset: u64, n: u64) -> Result<()> {
        if offset.checked_add(n).map_or(true, |end| end > self.len) {
            return Err(Error::invalid(format!(
                "range [{offset}, +{n}) is outside the {}-byte host buffer",
                self.len
            )));
        }
        Ok(())
    }

    /// Gives up ownership: the segment stays allocated until [`free`] is called on the address.
    pub fn into_raw(self) -> u64 {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // Cannot fail for a buffer we own: it is registered until this point.
        let _ = free(self.ptr);
    }
}

/// Allocates `bytes` of zero-filled shared memory named after the default job.
pub fn alloc(bytes: u64) -> Result<HostBuffer> {
    alloc_for_job(&default_job(), bytes)
}

/// Allocates `bytes` of zero-filled shared memory named after `job_id`.
pub fn alloc_for_job(job_id: &str, bytes: u64) -> Result<HostBuffer> {
    if bytes == 0 {
        return Err(Error::invalid("host allocation of 0 bytes"));
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "/{}{}-{id}",
        job_prefix(job_id),
        crate::os::cleanup::pid_field()
    );
    let seg = ShmSegment::create(&name, bytes)
        .map_err(|e| e.context(format!("allocating {bytes} bytes of host shared memory")))?;
    let base = seg.addr();
    lock(&SEGMENTS).insert(base, (seg, id));
    Ok(HostBuffer {
        ptr: base,
        len: bytes,
        id,
    })
}

/// Frees a buffer by its base address (what `nvfipc_host_free` does).
pub fn free(ptr: u64) -> Result<()> {
    let seg = lock(&SEGMENTS).remove(&ptr);
    match seg {
        Some(seg) => {
            drop(seg);
            Ok(())
        }
        None => Err(Error::invalid(format!(
            "host pointer {ptr:#x} is not the start of a live buffer from nvfipc_host_alloc \
             (already freed, or an interior pointer)"
        ))),
    }
}

/// Finds the live segment containing `[ptr, ptr + bytes)`: (base, length, id).
pub fn locate(ptr: u64, bytes: u64) -> Result<(u64, u64, u64)> {
    let found = lock(&SEGMENTS)
        .range(..=ptr)
        .next_back()
        .map(|(&base, (seg, id))| (base, seg.len(), *id));
    let Some((base, len, id)) = found.filter(|&(base, len, _)| ptr < base + len) else {
        return Err(Error::invalid(format!(
            "host pointer {ptr:#x} is not a shared-memory buffer from nvfipc_host_alloc or \
             already freed"
        )));
    };
    if ptr.checked_add(bytes).map_or(true, |end| end > base + len) {
        return Err(Error::invalid(format!(
            "host range [{ptr:#x}, +{bytes}) runs past the end of its {len}-byte buffer at \
             {base:#x}"
        )));
    }
    Ok((base, len, id))
}

/// Like [`locate`], with the segment's name (for exporting).
pub fn lookup(ptr: u64, bytes: u64) -> Result<SegmentInfo> {
    let (base, len, id) = locate(ptr, bytes)?;
    let name = lock(&SEGMENTS)
        .get(&base)
        .filter(|(_, seg_id)| *seg_id == id)
        .map(|(seg, _)| seg.name().to_string())
        .ok_or_else(|| Error::invalid(format!("host buffer {ptr:#x} was freed meanwhile")))?;
    Ok(SegmentInfo {
        base,
        len,
        id,
        name,
    })
}

/// Number of live buffers in this process.
pub fn live_buffers() -> usize {
    lock(&SEGMENTS).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_lookup_free() {
        let buf = alloc_for_job("unit_alloc", 1000).unwrap();
        let info = lookup(buf.addr() + 10, 100).unwrap();
        assert_eq!(info.base, buf.addr());
        assert_eq!(info.len, 1000);
        assert_eq!(info.id, buf.id());
        assert!(
            info.name.starts_with("/nvfipc-unit_alloc-"),
            "{}",
            info.name
        );
        assert!(lookup(buf.addr() + 990, 11)
            .unwrap_err()
            .message
            .contains("runs past"));
        buf.write(4, b"abc").unwrap();
        let mut out = [0u8; 3];
        buf.read(4, &mut out).unwrap();
        assert_eq!(&out, b"abc");
        assert!(buf.write(999, b"ab").is_err());
        let addr = buf.addr();
        let name = info.name.clone();
        drop(buf);
        let err = lookup(addr, 1).unwrap_err();
        assert!(err.message.contains("already freed"), "{err}");
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
    }

    #[test]
    fn free_checks_its_argument() {
        assert!(free(0x1234).is_err());
        let buf = alloc_for_job("unit_alloc", 64).unwrap();
        assert!(free(buf.addr() + 1).is_err(), "interior pointer");
        let raw = buf.into_raw();
        free(raw).unwrap();
        assert!(free(raw).unwrap_err().message.contains("already freed"));
        assert!(alloc(0).is_err());
    }
}
