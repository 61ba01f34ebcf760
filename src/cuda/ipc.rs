//! Legacy CUDA IPC: `cuIpcGetMemHandle` exports cached in the [`Runtime`] per (base, buffer id),
//! and peers' allocations opened with `cuIpcOpenMemHandle` once per (importing device, handle
//! bytes) in the runtime's import table (`super::imports`), closed on its releaser thread. A handle
//! this process exported itself resolves to the local allocation. [`open`]/[`close`] are the
//! low-level C API's references. Nothing pins the exporter's memory (see ARCHITECTURE.md,
//! "Replacing buffers"; checked by the GPU test `GpuRelease.ExporterFreesMappedBuffer`).

use super::clock::DriverCall;
use super::driver::{self, describe, ContextGuard, CudaContext};
use super::imports::{Import, ImportKind, OpenOutcome};
use super::memory::DeviceAllocation;
use super::{result, runtime, Runtime};
use crate::error::{Error, Result};
use crate::logging;
use crate::sync::lock;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Size of a `cudaIpcMemHandle_t`.
pub const HANDLE_LEN: usize = 64;
/// The raw bytes of a legacy IPC handle.
pub type HandleBytes = [u8; HANDLE_LEN];

/// A peer allocation as imported here (once per context, whatever the rank that sent it).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct IpcKey {
    device: i32,
    handle: HandleBytes,
}

impl std::fmt::Debug for IpcKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: String = self.handle[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        write!(f, "IPC handle {head}.. on device {}", self.device)
    }
}

/// Where an allocation is mapped here, and its context (`None`: our own, nothing to close).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mapped {
    base: u64,
    context: Option<CudaContext>,
}

/// Legacy IPC in the import table, with its real driver opens and closes.
#[derive(Default)]
pub(crate) struct Legacy {
    opens: AtomicU64,
    closes: AtomicU64,
}

impl ImportKind for Legacy {
    type Key = IpcKey;
    type Mapped = Mapped;
    type Side = ();
    const THREAD: &'static str = "nvfipc-ipc-close";
    const PENDING: &'static str = "peer mapping(s) were still waiting to be closed";

    fn at(&self, mapped: &Mapped) -> (u64, Option<CudaContext>) {
        (mapped.base, mapped.context)
    }

    fn close(&self, peer: usize, mapped: &Mapped) -> Result<()> {
        let (base, Some(context)) = (mapped.base, mapped.context) else {
            return Ok(());
        };
        let _guard = ContextGuard::enter(context)?;
        // SAFETY: `base` was returned by cuIpcOpenMemHandle in `context` (now current) and is
        // closed once: the import table hands a mapping to its close only when its last
        // reference went away (the entry leaves the table then), and the releaser closes only a
        // job that `import` did not take back (checked under its lock before the close starts).
        unsafe { result::ipc_close_mem_handle(base) }.map_err(|rc| {
            let what = format!("cuIpcCloseMemHandle({base:#x}) of rank {peer}'s allocation");
            driver::error(rc, &what)
        })?;
        self.closes.fetch_add(1, Ordering::Relaxed);
        log::info!(
            target: logging::CUDA,
            "cuIpcCloseMemHandle({base:#x}) of rank {peer}'s allocation done"
        );
        Ok(())
    }
}

/// A reference on an imported peer allocation (dropping it releases it).
pub(crate) type IpcImport = Import<Legacy>;

// The export registry is updated by one insert or remove at a time, so `lock` may ignore poisoning.

/// Exports the allocation that starts at `base` (cached per (base, buffer id)).
pub(crate) fn export(rt: &Runtime, base: u64, buffer_id: u64) -> Result<HandleBytes> {
    driver::driver()?;
    let mut exports = lock(&rt.exports);
    if let Some(&(_, handle)) = exports.get(&base).filter(|(id, _)| *id == buffer_id) {
        return Ok(handle);
    }
    let handle = (rt.clock)
        .time(DriverCall::Export, || result::ipc_get_mem_handle(base))
        .map_err(|rc| driver::error(rc, &format!("cuIpcGetMemHandle({base:#x})")))?;
    let handle = handle.reserved.map(|b| b as u8);
    exports.insert(base, (buffer_id, handle));
    Ok(handle)
}

/// Exports a resolved allocation (see `export`).
pub fn export_allocation(alloc: &DeviceAllocation) -> Result<HandleBytes> {
    export(runtime(), alloc.base, alloc.buffer_id)
}

/// Drops the cached export of the allocation at `base` (call before freeing it).
pub(crate) fn forget_export(rt: &Runtime, base: u64) {
    lock(&rt.exports).remove(&base);
}

/// The base of this process's own allocation that `handle` was exported from.
fn own_base(rt: &Runtime, handle: &HandleBytes) -> Option<u64> {
    lock(&rt.exports)
        .iter()
        .find(|(_, (_, h))| h == handle)
        .map(|(base, _)| *base)
}

/// A peer allocation as mapped into this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetachedImport {
    /// Where the allocation is mapped here.
    pub base: u64,
    /// The importing device; pass it to [`close`].
    pub device: i32,
}

/// `import` for the low-level C API: a reference without a guard, which [`close`] drops.
pub fn open(
    peer: usize,
    pid: Option<u32>,
    handle: &HandleBytes,
    device: Option<i32>,
    wait: Duration,
) -> Result<DetachedImport> {
    let (key, base) = import(runtime(), peer, pid, handle, device, wait)?.detach();
    Ok(DetachedImport {
        base,
        device: key.device,
    })
}

/// Imports (or re-references) the allocation of rank `peer` (process `pid` when known) described
/// by `handle` on `device` (current when `None`); a handle of this process maps to its own.
pub(crate) fn import(
    rt: &Runtime,
    peer: usize,
    pid: Option<u32>,
    handle: &HandleBytes,
    device: Option<i32>,
    wait: Duration,
) -> Result<IpcImport> {
    let (context, _guard) = driver::enter_device(device)?;
    let key = IpcKey {
        device: context.device()?,
        handle: *handle,
    };
    rt.ipc.acquire(
        key,
        peer,
        wait,
        || format!("an allocation of rank {peer}"),
        |_| open_mapping(rt, peer, pid, key, context).map(OpenOutcome::Mapped),
    )
}

/// Opens the allocation of `key` (not imported yet) in `context`, the current context.
fn open_mapping(
    rt: &Runtime,
    peer: usize,
    pid: Option<u32>,
    key: IpcKey,
    context: CudaContext,
) -> Result<Mapped> {
    let own_pid = std::process::id();
    if let Some(base) = own_base(rt, &key.handle) {
        return Ok(Mapped {
            base,
            context: None,
        });
    }
    if pid == Some(own_pid) {
        return Err(Error::invalid(format!(
            "handle from rank {peer} was exported by this process (pid {own_pid}) but its \
             allocation is no longer exported here; it was freed or re-allocated"
        )));
    }
    let raw = sys::CUipcMemHandle {
        reserved: key.handle.map(|b| b as std::ffi::c_char),
    };
    let clock = logging::clock(logging::CUDA, log::Level::Info);
    let opened = (rt.clock).time(DriverCall::Import, || result::ipc_open_mem_handle(raw));
    let who = match pid {
        Some(pid) => format!("rank {peer} (pid {pid})"),
        None => format!("rank {peer}"),
    };
    let base = opened.map_err(|rc| open_error(rc, &who, key.device))?;
    rt.ipc.kind().opens.fetch_add(1, Ordering::Relaxed);
    if let Some(t) = clock {
        log::info!(
            target: logging::CUDA,
            "cuIpcOpenMemHandle of {who}'s allocation on device {}: {:#x} in {}",
            key.device,
            base,
            logging::took(t.elapsed())
        );
    }
    Ok(Mapped {
        base,
        context: Some(context),
    })
}

/// The error of a failed `cuIpcOpenMemHandle` of `who`'s allocation on `device`.
fn open_error(rc: sys::CUresult, who: &str, device: i32) -> Error {
    if rc == sys::CUresult::CUDA_ERROR_ALREADY_MAPPED {
        return Error::state(format!(
            "cuIpcOpenMemHandle: the allocation of {who} is already mapped in this process by \
             other code (e.g. PyTorch's own IPC); one process must not open the same handle \
             through two libraries ({})",
            describe(rc)
        ));
    }
    Error::new(
        crate::error::Status::Cuda,
        format!(
            "cuIpcOpenMemHandle for an allocation of {who} on device {device} failed: {}; the \
             exporter may have exited or freed the buffer, or peer access between the devices \
             is impossible",
            describe(rc)
        ),
    )
}

/// Drops one reference taken by [`open`], closing the last one on this thread (the caller
/// promises that no stream still uses the mapping).
pub fn close(peer: usize, handle: &HandleBytes, device: i32) -> Result<()> {
    let key = IpcKey {
        device,
        handle: *handle,
    };
    runtime().ipc.close_now(&key, peer, || {
        format!("this handle of rank {peer} on device {device}")
    })
}

/// Real driver opens and closes so far, and the mappings open now (process-wide).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub opens: u64,
    pub closes: u64,
    /// Peer allocations mapped now, including those waiting for their close.
    pub live: u64,
    /// Mappings whose last reference is gone, waiting for (or in) their close on the releaser.
    pub pending_closes: u64,
    /// Closes the releaser attempted that failed.
    pub close_errors: u64,
}

/// The counters of the process's runtime.
pub fn counters() -> Counters {
    let table = &runtime().ipc;
    // Entries and releaser counters are read under the table's lock, as `import` and the
    // releases change them: a mapping is never counted both live and pending.
    table.inspect(|tables, released| Counters {
        opens: table.kind().opens.load(Ordering::Relaxed),
        closes: table.kind().closes.load(Ordering::Relaxed),
        live: table.mapped(tables) as u64 + released.pending,
        pending_closes: released.pending,
        close_errors: released.errors,
    })
}

#[cfg(test)]
mod tests;
