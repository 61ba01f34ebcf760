//! The host allocator: every buffer is its own anonymous shared file (`memfd`), registered in the
//! process's segment table so that a pointer anywhere inside it can be resolved and exported, and
//! shared with peers by passing its descriptor (`crate::fdpass`).
//!
//! Buffers have no name in `/dev/shm`: nothing can leak when a process exits, and their size is
//! bounded only by memory (every page is reserved at allocation), not by `/dev/shm`. The memfd's
//! name, `nvfipc-<job>-<id>`, shows in `/proc/<pid>/fd` for debugging; `<id>` is unique in the
//! process and doubles as the buffer id of exported records. Who exported a buffer learns that
//! it was freed through [`on_free`], so a peer can no longer fetch its descriptor.

use crate::error::{Error, Result};
use crate::os::memfd::{self, SharedMapping};
use crate::sync::lock;
use once_cell::sync::Lazy;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

pub use crate::names::{job_prefix, job_tag};

/// A live buffer as the transport exports it.
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

/// The segment table and what goes with it.
#[derive(Default)]
struct Allocator {
    /// Live segments by base address, with their ids.
    segments: Mutex<BTreeMap<u64, (SharedMapping, u64)>>,
    /// Who wants to know about frees; entries whose owner is gone are dropped on the next free.
    listeners: Mutex<Vec<Weak<dyn FreeListener>>>,
    /// The id of the last buffer allocated.
    last_id: AtomicU64,
    /// The job tag in the names of new buffers; `$NVFIPC_JOB_ID` (else `nojob`) on first use.
    default_job: Mutex<Option<String>>,
}

// process-wide: the process's host heap, as cudaMalloc's (nvfipc_host_free gets a bare pointer)
static ALLOCATOR: Lazy<Allocator> = Lazy::new(Allocator::default);

/// Sets the job id used in the names of segments allocated by [`alloc`] from now on
/// (default: `$NVFIPC_JOB_ID`, else `nojob`).
pub fn set_default_job(job_id: &str) {
    *lock(&ALLOCATOR.default_job) = Some(job_tag(job_id));
}

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
        let at = self.at(offset, data.len())?;
        // SAFETY: `at` has `data.len()` bytes of the live mapping; `data` is a separate slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from the buffer at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let at = self.at(offset, out.len())?;
        // SAFETY: `at` has `out.len()` bytes of the live mapping; `out` is a separate slice.
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The address of `[offset, + n)`, which must lie inside the buffer.
    fn at(&self, offset: u64, n: usize) -> Result<*mut u8> {
        if offset
            .checked_add(n as u64)
            .map_or(true, |end| end > self.len)
        {
            return Err(Error::invalid(format!(
                "range [{offset}, +{n}) is outside the {}-byte host buffer",
                self.len
            )));
        }
        Ok((self.ptr + offset) as *mut u8)
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
    let job = lock(&ALLOCATOR.default_job)
        .get_or_insert_with(|| job_tag(&crate::config::host_job_id()))
        .clone();
    alloc_for_job(&job, bytes)
}

/// Allocates `bytes` of zero-filled shared memory named after `job_id`.
pub fn alloc_for_job(job_id: &str, bytes: u64) -> Result<HostBuffer> {
    if bytes == 0 {
        return Err(Error::invalid("host allocation of 0 bytes"));
    }
    let id = ALLOCATOR.last_id.fetch_add(1, Ordering::Relaxed) + 1;
    let name = crate::names::host_segment(job_id, id);
    let seg = memfd::create_mapped(&name, bytes)
        .map_err(|e| e.context(format!("allocating {bytes} bytes of host shared memory")))?;
    let base = seg.addr();
    lock(&ALLOCATOR.segments).insert(base, (seg, id));
    Ok(HostBuffer {
        ptr: base,
        len: bytes,
        id,
    })
}

/// Frees a buffer by its base address (what `nvfipc_host_free` does).
pub fn free(ptr: u64) -> Result<()> {
    let Some((seg, id)) = lock(&ALLOCATOR.segments).remove(&ptr) else {
        return Err(Error::invalid(format!(
            "host pointer {ptr:#x} is not the start of a live buffer from nvfipc_host_alloc \
             (already freed, or an interior pointer)"
        )));
    };
    drop(seg);
    // Without the segment table's lock: a listener may call back into this module.
    let live: Vec<_> = {
        let mut listeners = lock(&ALLOCATOR.listeners);
        listeners.retain(|l| l.strong_count() > 0);
        listeners.iter().filter_map(Weak::upgrade).collect()
    };
    for listener in live {
        listener.freed(id);
    }
    Ok(())
}

/// Registers `listener` to be told about every buffer freed from now on, while it lives.
pub fn on_free(listener: Weak<dyn FreeListener>) {
    lock(&ALLOCATOR.listeners).push(listener);
}

/// Finds the live segment containing `[ptr, ptr + bytes)`: (base, length, id).
pub fn locate(ptr: u64, bytes: u64) -> Result<(u64, u64, u64)> {
    let segments = lock(&ALLOCATOR.segments);
    find(&segments, ptr, bytes).map(|(base, seg, id)| (base, seg.len(), id))
}

/// Like [`locate`], with a descriptor of the segment's file (for exporting).
pub fn lookup(ptr: u64, bytes: u64) -> Result<SegmentInfo> {
    let segments = lock(&ALLOCATOR.segments);
    let (base, seg, id) = find(&segments, ptr, bytes)?;
    let fd = seg.fd().as_fd().try_clone_to_owned().map_err(|e| {
        Error::from_io(
            format!("duplicating the descriptor of host buffer {ptr:#x}"),
            &e,
        )
    })?;
    Ok(SegmentInfo {
        base,
        len: seg.len(),
        id,
        fd,
    })
}

fn find(
    segments: &BTreeMap<u64, (SharedMapping, u64)>,
    ptr: u64,
    bytes: u64,
) -> Result<(u64, &SharedMapping, u64)> {
    let Some((&base, (seg, id))) = segments
        .range(..=ptr)
        .next_back()
        .filter(|(&base, (seg, _))| ptr < base + seg.len())
    else {
        return Err(Error::invalid(format!(
            "host pointer {ptr:#x} is not a shared-memory buffer from nvfipc_host_alloc: was \
             it freed, or is it on the stack or from malloc? Exchange host buffers that \
             nvfipc_host_alloc made, and free them only after the exchange"
        )));
    };
    let len = seg.len();
    if ptr.checked_add(bytes).map_or(true, |end| end > base + len) {
        return Err(Error::invalid(format!(
            "host range [{ptr:#x}, +{bytes}) runs past the end of its {len}-byte buffer at \
             {base:#x}"
        )));
    }
    Ok((base, seg, *id))
}

/// Number of live buffers in this process.
pub fn live_buffers() -> usize {
    lock(&ALLOCATOR.segments).len()
}

#[cfg(test)]
mod tests;
