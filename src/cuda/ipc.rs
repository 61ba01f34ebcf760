//! Legacy CUDA IPC: exporting allocations and opening peers' allocations, each exactly once.
//!
//! Export: `cuIpcGetMemHandle` on the allocation base, cached per (base, buffer id) so the same
//! allocation always yields the same handle bytes and a new allocation at a recycled address gets
//! a fresh one.
//!
//! Import: `cuIpcOpenMemHandle` with lazy peer access. The driver maps an allocation only once
//! per context, so opens are deduplicated process-wide per (peer, importing device, handle bytes)
//! with a reference count: importing the same peer allocation again returns the same base, and
//! `cuIpcCloseMemHandle` runs exactly once, when the last reference is closed, with the context
//! that opened it current. A handle this process exported itself cannot be opened by the driver;
//! it resolves to the local allocation instead.
//!
//! Closing does not wait for device work: callers must make sure no stream still reads or writes
//! the mapping (stream order, or a synchronize at teardown).

use super::driver::{self, check, describe, Context, ContextGuard};
use super::memory::DeviceAllocation;
use crate::error::{Error, Result};
use crate::sync::lock;
use cudarc::driver::sys;
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Size of a `cudaIpcMemHandle_t`.
pub const HANDLE_LEN: usize = 64;
/// The raw bytes of a legacy IPC handle.
pub type HandleBytes = [u8; HANDLE_LEN];

struct ExportEntry {
    buffer_id: u64,
    handle: HandleBytes,
}

/// Exported allocations by base address (one live allocation per base at a time).
static EXPORTS: Lazy<Mutex<HashMap<u64, ExportEntry>>> = Lazy::new(|| Mutex::new(HashMap::new()));

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ImportKey {
    peer: usize,
    device: i32,
    handle: HandleBytes,
}

struct ImportEntry {
    base: u64,
    /// The context the mapping was opened in; `None` for this process's own allocations.
    context: Option<Context>,
    refs: usize,
}

static IMPORTS: Lazy<Mutex<HashMap<ImportKey, ImportEntry>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));
static OPENS: AtomicU64 = AtomicU64::new(0);
static CLOSES: AtomicU64 = AtomicU64::new(0);

// Tables here are updated by one insert or remove at a time, so `lock` may ignore poisoning.

/// Exports the allocation that starts at `base` (cached per (base, buffer id)).
pub fn export(base: u64, buffer_id: u64) -> Result<HandleBytes> {
    driver::driver()?;
    let mut exports = lock(&EXPORTS);
    if let Some(entry) = exports.get(&base) {
        if entry.buffer_id == buffer_id {
            return Ok(entry.handle);
        }
    }
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: valid out pointer; `base` is a device address the driver validates.
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut handle, base) },
        &format!("cuIpcGetMemHandle({base:#x})"),
    )?;
    let handle = handle.reserved.map(|b| b as u8);
    exports.insert(base, ExportEntry { buffer_id, handle });
    Ok(handle)
}

/// Exports a resolved allocation (see [`export`]).
pub fn export_allocation(alloc: &DeviceAllocation) -> Result<HandleBytes> {
    export(alloc.base, alloc.buffer_id)
}

/// Drops the cached export of the allocation at `base` (call before freeing it).
pub fn forget_export(base: u64) {
    lock(&EXPORTS).remove(&base);
}

/// The base of this process's own allocation that `handle` was exported from.
fn own_base(handle: &HandleBytes) -> Option<u64> {
    lock(&EXPORTS)
        .iter()
        .find(|(_, e)| &e.handle == handle)
        .map(|(base, _)| *base)
}

/// A peer allocation as mapped into this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// Where the allocation is mapped here.
    pub base: u64,
    /// The importing device; pass it to [`close`].
    pub device: i32,
}

/// Opens (or re-references) the allocation of rank `peer` described by `handle` in the context
/// of `device` (the current context when `None`) and returns where it is mapped.
/// `pid` is the exporter's process id when known; a handle of this process maps to the local
/// allocation.
pub fn open(
    peer: usize,
    pid: Option<u32>,
    handle: &HandleBytes,
    device: Option<i32>,
) -> Result<Opened> {
    driver::driver()?;
    let (context, _guard) = driver::enter_device(device)?;
    let key = ImportKey {
        peer,
        device: context.device()?,
        handle: *handle,
    };
    let mut imports = lock(&IMPORTS);
    if let Some(entry) = imports.get_mut(&key) {
        entry.refs += 1;
        return Ok(Opened {
            base: entry.base,
            device: key.device,
        });
    }
    // SAFETY: getpid has no preconditions.
    let own_pid = unsafe { libc::getpid() } as u32;
    if let Some(base) = own_base(handle) {
        imports.insert(
            key,
            ImportEntry {
                base,
                context: None,
                refs: 1,
            },
        );
        return Ok(Opened {
            base,
            device: key.device,
        });
    }
    if pid == Some(own_pid) {
        return Err(Error::invalid(format!(
            "handle from rank {peer} was exported by this process (pid {own_pid}) but its \
             allocation is no longer exported here; it was freed or re-allocated"
        )));
    }
    let raw = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut base: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: valid out pointer; the handle is plain bytes the driver validates.
    let rc = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, raw, flags) };
    let who = match pid {
        Some(pid) => format!("rank {peer} (pid {pid})"),
        None => format!("rank {peer}"),
    };
    if rc == sys::CUresult::CUDA_ERROR_ALREADY_MAPPED {
        return Err(Error::state(format!(
            "cuIpcOpenMemHandle: the allocation of {who} is already mapped in this process by \
             other code (e.g. PyTorch's own IPC); one process must not open the same handle \
             through two libraries ({})",
            describe(rc)
        )));
    }
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::new(
            crate::error::Status::Cuda,
            format!(
                "cuIpcOpenMemHandle for an allocation of {who} on device {} failed: {}; the \
                 exporter may have exited or freed the buffer, or peer access between the devices \
                 is impossible",
                key.device,
                describe(rc)
            ),
        ));
    }
    OPENS.fetch_add(1, Ordering::Relaxed);
    imports.insert(
        key,
        ImportEntry {
            base,
            context: Some(context),
            refs: 1,
        },
    );
    Ok(Opened {
        base,
        device: key.device,
    })
}

/// Drops one reference taken by [`open`]; the mapping is closed when the last one goes.
pub fn close(peer: usize, handle: &HandleBytes, device: i32) -> Result<()> {
    let key = ImportKey {
        peer,
        device,
        handle: *handle,
    };
    let mut imports = lock(&IMPORTS);
    let entry = imports.get_mut(&key).ok_or_else(|| {
        Error::not_found(format!(
            "no open mapping of this handle from rank {peer} on device {device} (closed twice?)"
        ))
    })?;
    entry.refs -= 1;
    if entry.refs > 0 {
        return Ok(());
    }
    let entry = imports.remove(&key).expect("entry present under the lock");
    let Some(context) = entry.context else {
        return Ok(());
    };
    let _guard = ContextGuard::enter(context)?;
    // SAFETY: `base` was returned by cuIpcOpenMemHandle in `context` (now current) and is closed
    // only here, once, after its last reference went away.
    check(
        unsafe { sys::cuIpcCloseMemHandle(entry.base) },
        &format!(
            "cuIpcCloseMemHandle({:#x}) of rank {peer}'s allocation",
            entry.base
        ),
    )?;
    CLOSES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Real driver opens and closes so far, and the mappings open now (process-wide).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub opens: u64,
    pub closes: u64,
    pub live: u64,
}

pub fn counters() -> Counters {
    let live = lock(&IMPORTS)
        .values()
        .filter(|e| e.context.is_some())
        .count() as u64;
    Counters {
        opens: OPENS.load(Ordering::Relaxed),
        closes: CLOSES.load(Ordering::Relaxed),
        live,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    #[test]
    fn close_of_unknown_handle_is_not_found() {
        let err = close(3, &[7; HANDLE_LEN], 0).unwrap_err();
        assert_eq!(err.status, Status::NotFound);
        assert!(err.message.contains("rank 3"), "{err}");
    }

    #[test]
    fn without_driver_export_and_open_fail_cleanly() {
        if driver::is_available() {
            return;
        }
        assert_eq!(
            export(0x1000, 1).unwrap_err().status,
            Status::CudaUnavailable
        );
        assert_eq!(
            open(1, Some(1), &[1; HANDLE_LEN], None).unwrap_err().status,
            Status::CudaUnavailable
        );
        assert_eq!(counters().opens, 0);
    }
}
