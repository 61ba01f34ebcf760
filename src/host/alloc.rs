//! The host allocator: every buffer is its own anonymous shared file (`memfd`), registered in a
//! process-wide table so that a pointer anywhere inside it can be resolved and exported, and
//! shared with peers by passing its descriptor (`crate::fdpass`).
//!
//! Buffers have no name in `/dev/shm`: nothing can leak when a process exits, is terminated or
//! killed, and their size is not bounded by `/dev/shm` (64 MiB in a default Docker container),
//! only by memory, every page of which is reserved at allocation. The memfd's own name,
//! `nvfipc-<job>-<id>`, shows in `/proc/<pid>/fd` and `/proc/<pid>/maps` for debugging; `<id>` is
//! unique in the process and doubles as the buffer id of exported records. Who exported a buffer
//! learns that it was freed through [`on_free`], so a peer can no longer fetch its descriptor.

use crate::error::{Error, Result};
use crate::os::memfd::{self, SharedMapping};
use crate::sync::lock;
use once_cell::sync::Lazy;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

/// A registered segment as seen by the transport.
#[derive(Debug)]
pub struct SegmentInfo {
    pub base: u64,
    pub len: u64,
    pub id: u64,
    /// A descriptor of the buffer's file, for passing to peers.
    pub fd: OwnedFd,
}

/// Told when a buffer is freed (see [`on_free`]).
pub trait FreeListener: Send + Sync {
    /// Buffer `id` was freed in this process.
    fn freed(&self, id: u64);
}

/// Live segments by base address, with their ids.
static SEGMENTS: Lazy<Mutex<BTreeMap<u64, (SharedMapping, u64)>>> = Lazy::new(Default::default);
/// Who wants to know about frees; entries whose owner is gone are dropped on the next free.
static LISTENERS: Lazy<Mutex<Vec<Weak<dyn FreeListener>>>> = Lazy::new(Default::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static DEFAULT_JOB: Lazy<Mutex<String>> =
    Lazy::new(|| Mutex::new(job_tag(&crate::config::host_job_id())));

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

/// A host buffer in shared memory that peers can map. Freed (unmapped and closed) on drop,
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
    let name = crate::names::host_segment(job_id, id);
    let seg = memfd::create_mapped(&name, bytes)
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
        Some((seg, id)) => {
            drop(seg);
            tell_listeners(id);
            Ok(())
        }
        None => Err(Error::invalid(format!(
            "host pointer {ptr:#x} is not the start of a live buffer from nvfipc_host_alloc \
             (already freed, or an interior pointer)"
        ))),
    }
}

/// Registers `listener` to be told about every buffer freed from now on, for as long as it
/// lives.
pub fn on_free(listener: Weak<dyn FreeListener>) {
    lock(&LISTENERS).push(listener);
}

fn tell_listeners(id: u64) {
    // Called without the segment table's lock: a listener may call back into this module.
    let live: Vec<_> = {
        let mut listeners = lock(&LISTENERS);
        listeners.retain(|l| l.strong_count() > 0);
        listeners.iter().filter_map(Weak::upgrade).collect()
    };
    for listener in live {
        listener.freed(id);
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

/// Like [`locate`], with a descriptor of the segment's file (for exporting).
pub fn lookup(ptr: u64, bytes: u64) -> Result<SegmentInfo> {
    let (base, len, id) = locate(ptr, bytes)?;
    let segments = lock(&SEGMENTS);
    let (seg, _) = segments
        .get(&base)
        .filter(|(_, seg_id)| *seg_id == id)
        .ok_or_else(|| Error::invalid(format!("host buffer {ptr:#x} was freed meanwhile")))?;
    let fd = seg.fd().as_fd().try_clone_to_owned().map_err(|e| {
        Error::from_io(
            format!("duplicating the descriptor of host buffer {ptr:#x}"),
            &e,
        )
    })?;
    Ok(SegmentInfo { base, len, id, fd })
}

/// Number of live buffers in this process.
pub fn live_buffers() -> usize {
    lock(&SEGMENTS).len()
}

#[cfg(test)]
mod tests;
