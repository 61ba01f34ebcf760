//! C ABI of the device side: whether CUDA is usable, pointer checks, IPC counters and the
//! stream-ordered P2P primitives of nvFuser's zero-copy "get" protocol, on a cached channel
//! (`nvfipc_cuda_p2p_*`), an opened one (`nvfipc_cuda_channel_*`) or a raw endpoint with explicit
//! transfer numbers (`nvfipc_cuda_endpoint_*`). Every primitive only enqueues work on its stream.

use super::args::{
    copy_fields, optional_out_ptr, out_ptr, rank_arg, ref_arg, stream_arg, timeout_arg,
};
use super::boundary::ffi_call;
use super::channel::{channel_arg, nvfipc_channel};
use super::exchange::{nvfipc_cache, nvfipc_request, p2p_handles};
use crate::cuda::memory::DeviceMemoryKind;
use crate::cuda::p2p::{self, Endpoint};
use crate::cuda::{self, driver, ipc, memory};
use crate::error::{Error, Result, Status};
use crate::exchange::{MemKind, P2pHandles};
use crate::store::DEFAULT_TIMEOUT;
use std::ffi::c_void;

/// One side of a P2P channel as the calling rank sees it (device addresses in this process).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_p2p_endpoint {
    /// This rank's buffer (send buffer on the sender, receive buffer on the receiver).
    pub local_ptr: u64,
    /// Its size in bytes.
    pub local_bytes: u64,
    /// This rank's semaphore for the channel (in its own slab).
    pub local_semaphore: u64,
    /// The peer's buffer, mapped into this process.
    pub peer_ptr: u64,
    /// Its size in bytes.
    pub peer_bytes: u64,
    /// The peer's semaphore for the channel, mapped into this process.
    pub peer_semaphore: u64,
}

fn endpoint_arg(ptr: *const nvfipc_p2p_endpoint) -> Result<Endpoint> {
    Ok(copy_fields!(ref_arg(ptr, "endpoint")? => Endpoint {
        local_ptr, local_bytes, local_semaphore, peer_ptr, peer_bytes, peer_semaphore
    }))
}

/// Counters of real driver-level IPC opens and closes in this process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvfipc_cuda_ipc_counters {
    /// `cuIpcOpenMemHandle` calls that succeeded.
    pub opens: u64,
    /// `cuIpcCloseMemHandle` calls that succeeded.
    pub closes: u64,
    /// Peer allocations mapped right now (including those waiting for their close).
    pub live: u64,
    /// Mappings whose last reference is gone and that wait for (or are in) their close on the
    /// library's releaser thread: it closes them once the work queued on their context before
    /// they were released has finished, so an exchange never waits for device work.
    pub pending_closes: u64,
    /// Closes on the releaser thread that failed (the driver's message is kept).
    pub close_errors: u64,
}

/// `nvfipc_cuda_pointer_memory`: a `cudaMalloc` allocation, exported by legacy CUDA IPC.
pub const NVFIPC_DEVICE_MEMORY_LEGACY: i32 = 0;
/// `nvfipc_cuda_pointer_memory`: VMM memory (`cuMemCreate` + `cuMemMap`, PyTorch's expandable
/// segments), exported per physical allocation as a POSIX fd (or FABRIC handle).
pub const NVFIPC_DEVICE_MEMORY_VMM: i32 = 1;
/// `nvfipc_cuda_pointer_memory`: a stream-ordered pool allocation, exported through its pool.
pub const NVFIPC_DEVICE_MEMORY_POOL: i32 = 2;

/// Counters of VMM and pool imports in this process (`nvfipc_cuda_vmm_counters_get`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvfipc_cuda_vmm_counters {
    /// VMM physical allocations this process exported (each once per cache).
    pub segment_exports: u64,
    /// Peer physical allocations imported (`cuMemImportFromShareableHandle`), and released.
    pub segment_imports: u64,
    pub segment_releases: u64,
    /// VA ranges mapped for peer buffers (one per run of segments), and unmapped.
    pub maps: u64,
    pub unmaps: u64,
    /// Peer physical allocations imported, and runs mapped, right now.
    pub live_segments: u64,
    pub live_maps: u64,
    /// Peer pool allocations imported (`cuMemPoolImportPointer`), and freed.
    pub pool_imports: u64,
    pub pool_frees: u64,
    /// Peer VMM buffers served by the mapping of a larger buffer that holds their physical
    /// allocations (no import, no map).
    pub inside_mapped: u64,
}

/// Writes whether the CUDA driver could be loaded and initialised into `*out`. Never fails on a
/// machine without CUDA: `*out` is then false and `nvfipc_cuda_check` tells why.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_available(out: *mut bool) -> Status {
    ffi_call("nvfipc_cuda_available", || {
        out_ptr(out, "out")?.write(driver::is_available())
    })
}

/// Loads and initialises the CUDA driver (once per process). `NVFIPC_STATUS_CUDA_UNAVAILABLE`,
/// with the reason in the last error message, when there is no usable driver.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_check() -> Status {
    ffi_call("nvfipc_cuda_check", driver::driver)
}

/// Checks that `[ptr, ptr + bytes)` is device memory that legacy CUDA IPC can export.
/// `NVFIPC_STATUS_INVALID_ARGUMENT` for NULL, host, freed or unknown pointers and ranges that
/// overrun their allocation; `NVFIPC_STATUS_UNSUPPORTED` for memory no export can share
/// (managed memory, VMM memory created without a shareable handle type, pools that are not
/// IPC-capable are refused by the exchange), with the allocator setting to change. On success
/// `*out_base` (optional, may be NULL) receives the allocation base (for VMM memory: the
/// physical allocation that holds `ptr`).
#[no_mangle]
pub extern "C" fn nvfipc_cuda_check_pointer(
    ptr: *const c_void,
    bytes: u64,
    out_base: *mut u64,
) -> Status {
    ffi_call("nvfipc_cuda_check_pointer", || {
        let alloc = memory::resolve(ptr as u64, bytes)?;
        optional_out_ptr(out_base, "out_base")?.write(alloc.base)
    })
}

/// Writes into `*out_memory` how the exchange exports the device buffer `[ptr, ptr + bytes)`
/// (`NVFIPC_DEVICE_MEMORY_*`); fails as `nvfipc_cuda_check_pointer` does, and for a VMM buffer
/// that is not contiguous or spans more than 8192 physical allocations.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_pointer_memory(
    ptr: *const c_void,
    bytes: u64,
    out_memory: *mut i32,
) -> Status {
    ffi_call("nvfipc_cuda_pointer_memory", || {
        let out = out_ptr(out_memory, "out_memory")?;
        out.write(match cuda::export_kind(ptr as u64, bytes)? {
            DeviceMemoryKind::Legacy => NVFIPC_DEVICE_MEMORY_LEGACY,
            DeviceMemoryKind::Vmm { .. } => NVFIPC_DEVICE_MEMORY_VMM,
            DeviceMemoryKind::Pool { .. } => NVFIPC_DEVICE_MEMORY_POOL,
        })
    })
}

/// Reads the process-wide VMM and pool counters (after a clean teardown: segment_imports ==
/// segment_releases, maps == unmaps, pool_imports == pool_frees, live_* == 0).
#[no_mangle]
pub extern "C" fn nvfipc_cuda_vmm_counters_get(out: *mut nvfipc_cuda_vmm_counters) -> Status {
    ffi_call("nvfipc_cuda_vmm_counters_get", || {
        let out = out_ptr(out, "out")?;
        out.write(
            copy_fields!(cuda::runtime().vmm_counters() => nvfipc_cuda_vmm_counters {
                segment_exports, segment_imports, segment_releases, maps, unmaps, live_segments,
                live_maps, pool_imports, pool_frees, inside_mapped
            }),
        )
    })
}

/// Reads the process-wide IPC counters (opens == closes, live == 0 and pending_closes == 0 after
/// a clean teardown).
#[no_mangle]
pub extern "C" fn nvfipc_cuda_ipc_counters_get(out: *mut nvfipc_cuda_ipc_counters) -> Status {
    ffi_call("nvfipc_cuda_ipc_counters_get", || {
        out_ptr(out, "out")?.write(copy_fields!(ipc::counters() => nvfipc_cuda_ipc_counters {
            opens, closes, live, pending_closes, close_errors
        }))
    })
}

/// Time this process spent in the driver's export, import and map calls (and the releaser's
/// closes), per kind of call, while the clock was on: nanoseconds and calls, over all threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvfipc_cuda_driver_time {
    /// `cuIpcGetMemHandle`, or `cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`.
    pub export_ns: u64,
    pub export_calls: u64,
    /// Peers' descriptors fetched from their fd responders.
    pub fd_pass_ns: u64,
    pub fd_pass_calls: u64,
    /// `cuIpcOpenMemHandle`, or `cuMemImportFromShareableHandle`.
    pub import_ns: u64,
    pub import_calls: u64,
    /// `cuMemAddressReserve`.
    pub reserve_ns: u64,
    pub reserve_calls: u64,
    /// `cuMemMap`.
    pub map_ns: u64,
    pub map_calls: u64,
    /// `cuMemSetAccess`.
    pub set_access_ns: u64,
    pub set_access_calls: u64,
    /// Released mappings closed (`cuIpcCloseMemHandle`, or unmap and release).
    pub close_ns: u64,
    pub close_calls: u64,
}

/// Switches the driver clock on (`on` != 0) or off (it starts off; off, a driver call pays one
/// relaxed load) and, when `out` is not NULL, writes what it counted since the last read and
/// starts again from zero. For finding where an exchange's time goes (the library's own work is
/// a call's time less this); the clock is the process's, shared by every cache.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_driver_clock(on: i32, out: *mut nvfipc_cuda_driver_time) -> Status {
    ffi_call("nvfipc_cuda_driver_clock", || {
        let out = optional_out_ptr(out, "out")?;
        let clock = &cuda::runtime().clock;
        let [export, fd_pass, import, reserve, map, set_access, close] = clock.take();
        clock.set_enabled(on != 0);
        out.write(nvfipc_cuda_driver_time {
            export_ns: export.0,
            export_calls: export.1,
            fd_pass_ns: fd_pass.0,
            fd_pass_calls: fd_pass.1,
            import_ns: import.0,
            import_calls: import.1,
            reserve_ns: reserve.0,
            reserve_calls: reserve.1,
            map_ns: map.0,
            map_calls: map.1,
            set_access_ns: set_access.0,
            set_access_calls: set_access.1,
            close_ns: close.0,
            close_calls: close.1,
        })
    })
}

/// Waits until every peer mapping released so far (by exchanges that replaced it, or by freed
/// caches) has been closed by the library's releaser thread, at most `timeout_ms` (negative: the
/// default timeout). A close waits until all work queued on the mapping's context before its
/// release has finished. `NVFIPC_STATUS_TIMEOUT` when some are still pending (they stay queued
/// and are closed later); the message says how many. Never needed for correctness:
/// `nvfipc_cache_free` does the same, bounded by the cache's linger.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_ipc_flush_releases(timeout_ms: i64) -> Status {
    ffi_call("nvfipc_cuda_ipc_flush_releases", || {
        cuda::flush_releases(timeout_arg(timeout_ms, DEFAULT_TIMEOUT))
    })
}

/// The 64 bytes of a legacy CUDA IPC handle (`cudaIpcMemHandle_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_cuda_ipc_handle {
    pub bytes: [u8; 64],
}

const _: () = assert!(std::mem::size_of::<nvfipc_cuda_ipc_handle>() == ipc::HANDLE_LEN);

/// Exports the device allocation holding `[ptr, ptr + bytes)` as a legacy CUDA IPC handle:
/// writes the handle of the allocation base to `*out_handle` and `ptr`'s offset from that base
/// to `*out_offset`. Exports are cached per allocation. A low-level building block; the handle
/// cache does all of this itself.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_ipc_export(
    ptr: *const c_void,
    bytes: u64,
    out_handle: *mut nvfipc_cuda_ipc_handle,
    out_offset: *mut u64,
) -> Status {
    ffi_call("nvfipc_cuda_ipc_export", || {
        let out_handle = out_ptr(out_handle, "out_handle")?;
        let out_offset = out_ptr(out_offset, "out_offset")?;
        let alloc = memory::resolve(ptr as u64, bytes)?;
        if alloc.kind != DeviceMemoryKind::Legacy {
            return Err(Error::unsupported(format!(
                "pointer {:#x} is {:?} memory; legacy CUDA IPC exports cudaMalloc memory only: \
                 exchange VMM and pool buffers through a handle cache",
                alloc.ptr, alloc.kind
            )));
        }
        let bytes = ipc::export_allocation(&alloc)?;
        out_handle.write(nvfipc_cuda_ipc_handle { bytes })?;
        out_offset.write(alloc.offset())
    })
}

fn handle_arg(handle: *const nvfipc_cuda_ipc_handle) -> Result<ipc::HandleBytes> {
    Ok(ref_arg(handle, "handle")?.bytes)
}

fn peer_arg(peer: i64) -> Result<usize> {
    rank_arg(peer, crate::config::MAX_WORLD_SIZE, "peer")
}

/// Opens the legacy IPC `handle` exported by rank `peer` in the current context (with
/// lazy peer access) and writes the mapped allocation base to `*out_base`. Opening the same
/// handle again returns the same base and takes another reference; every open needs one
/// `nvfipc_cuda_ipc_close`. When the releaser thread is closing a previous mapping of the same
/// handle right now, waits for that (at most the default timeout).
#[no_mangle]
pub extern "C" fn nvfipc_cuda_ipc_open(
    peer: i64,
    handle: *const nvfipc_cuda_ipc_handle,
    out_base: *mut u64,
) -> Status {
    ffi_call("nvfipc_cuda_ipc_open", || {
        let out = out_ptr(out_base, "out_base")?;
        let peer = peer_arg(peer)?;
        out.write(ipc::open(peer, None, &handle_arg(handle)?, None, DEFAULT_TIMEOUT)?.base)
    })
}

/// Drops one reference taken by `nvfipc_cuda_ipc_open` on the current device; the mapping is
/// closed with the last one, on the calling thread: `cuIpcCloseMemHandle` then blocks until all
/// work queued on the device context has finished. No stream may still use the mapping.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_ipc_close(
    peer: i64,
    handle: *const nvfipc_cuda_ipc_handle,
) -> Status {
    ffi_call("nvfipc_cuda_ipc_close", || {
        let (peer, handle) = (peer_arg(peer)?, handle_arg(handle)?);
        let device = driver::ensure_context(None)?.device()?;
        ipc::close(peer, &handle, device)
    })
}

/// Sender, transfer number `transfer` (1, 2, ... per channel): enqueues on `stream` the signal
/// that the local send buffer holds the data.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_endpoint_send_post(
    endpoint: *const nvfipc_p2p_endpoint,
    transfer: u64,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_endpoint_send_post", || {
        p2p::send_post(&endpoint_arg(endpoint)?, transfer, stream_arg(stream))
    })
}

/// Receiver, transfer `transfer`: enqueues on `stream` a wait for the sender's signal, the copy of
/// `bytes` bytes from the peer's buffer into the local buffer, and the "consumed" signal.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_endpoint_recv_post(
    endpoint: *const nvfipc_p2p_endpoint,
    transfer: u64,
    bytes: u64,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_endpoint_recv_post", || {
        let endpoint = endpoint_arg(endpoint)?;
        p2p::recv_post(&endpoint, transfer, bytes, stream_arg(stream))
    })
}

/// Sender, transfer `transfer`: enqueues on `stream` a wait until the receiver has consumed the
/// data (the send buffer may be overwritten by work queued after it).
#[no_mangle]
pub extern "C" fn nvfipc_cuda_endpoint_send_wait(
    endpoint: *const nvfipc_p2p_endpoint,
    transfer: u64,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_endpoint_send_wait", || {
        p2p::send_wait(&endpoint_arg(endpoint)?, transfer, stream_arg(stream))
    })
}

fn device_handles(cache: *const nvfipc_cache, req: *const nvfipc_request) -> Result<P2pHandles> {
    Ok(p2p_handles(cache, req, MemKind::Device)?.1)
}

/// Sender side of the next transfer on the channel of `req` (a SEND request already exchanged):
/// enqueues on `stream` the signal that the send buffer holds the data (nvFuser's `sendPost`).
/// Never blocks the host.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_p2p_send_post(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_p2p_send_post", || {
        p2p::channel_send_post(&device_handles(cache, req)?, stream_arg(stream))
    })
}

/// Receiver side of the next transfer (a RECV request already exchanged): enqueues on `stream` a
/// wait for the sender's signal, the copy of `bytes` bytes from the sender's buffer into the local
/// buffer, and the "consumed" signal (nvFuser's `recvPost`). Never blocks the host.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_p2p_recv_post(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    bytes: u64,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_p2p_recv_post", || {
        p2p::channel_recv_post(&device_handles(cache, req)?, bytes, stream_arg(stream))
    })
}

/// Sender side: enqueues on `stream` a wait until the receiver has consumed the last transfer
/// posted on the channel of `req`; work queued after it may overwrite the send buffer
/// (nvFuser's `sendWait`). `NVFIPC_STATUS_INVALID_STATE` before any send post.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_p2p_send_wait(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_p2p_send_wait", || {
        p2p::channel_send_wait(&device_handles(cache, req)?, stream_arg(stream))
    })
}

/// `nvfipc_cuda_p2p_send_post` on an opened channel (no lookup): enqueues on `stream` the
/// signal that the send buffer holds the next transfer. `NVFIPC_STATUS_INVALID_STATE`,
/// enqueueing nothing, when the channel is stale (see `nvfipc_channel`).
#[no_mangle]
pub extern "C" fn nvfipc_cuda_channel_send_post(
    ch: *const nvfipc_channel,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_channel_send_post", || {
        let ch = channel_arg(ch)?;
        p2p::channel_send_post(ch.handles()?, stream_arg(stream))
    })
}

/// `nvfipc_cuda_p2p_recv_post` on an opened channel (no lookup): enqueues on `stream` the wait
/// for the sender, the copy of `bytes` bytes and the "consumed" signal.
/// `NVFIPC_STATUS_INVALID_STATE`, enqueueing nothing, when the channel is stale.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_channel_recv_post(
    ch: *const nvfipc_channel,
    bytes: u64,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_channel_recv_post", || {
        let ch = channel_arg(ch)?;
        p2p::channel_recv_post(ch.handles()?, bytes, stream_arg(stream))
    })
}

/// `nvfipc_cuda_p2p_send_wait` on an opened channel (no lookup): enqueues on `stream` a wait
/// until the receiver has consumed the last transfer posted on it.
/// `NVFIPC_STATUS_INVALID_STATE` when the channel is stale or nothing was posted.
#[no_mangle]
pub extern "C" fn nvfipc_cuda_channel_send_wait(
    ch: *const nvfipc_channel,
    stream: *mut c_void,
) -> Status {
    ffi_call("nvfipc_cuda_channel_send_wait", || {
        let ch = channel_arg(ch)?;
        p2p::channel_send_wait(ch.handles()?, stream_arg(stream))
    })
}
