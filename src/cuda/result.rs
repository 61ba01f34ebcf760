//! The raw driver calls of the memory, IPC and stream code, each made once here with its SAFETY
//! note (as cudarc's `result` layer over its `sys`): the rest of `cuda/` calls these functions,
//! never `sys` for them. A call returns its value or the driver's code, which the caller maps to
//! an [`Error`](crate::error::Error) with [`driver::check`](super::driver::check) or its own rule
//! (some codes mean "not device memory" or "not supported", not a failure).
//!
//! Functions whose arguments the driver cannot check (device addresses written, freed or closed,
//! streams destroyed) are `unsafe fn`, and say what their caller must guarantee. Loading the
//! driver, its error texts, contexts and devices are in [`driver`](super::driver), which also holds
//! the one list of symbols the library requires.

use cudarc::driver::sys;
use std::ffi::c_void;

/// A driver call's value, or the code it failed with.
pub type DriverResult<T> = std::result::Result<T, sys::CUresult>;

fn to_result<T>(rc: sys::CUresult, value: T) -> DriverResult<T> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(value)
    } else {
        Err(rc)
    }
}

/// `cuIpcGetMemHandle`: the IPC handle of the allocation at `base`.
pub fn ipc_get_mem_handle(base: sys::CUdeviceptr) -> DriverResult<sys::CUipcMemHandle> {
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: valid out pointer; `base` is a device address the driver validates.
    let rc = unsafe { sys::cuIpcGetMemHandle(&mut handle, base) };
    to_result(rc, handle)
}

/// `cuIpcOpenMemHandle` (v2) with lazy peer access: maps a peer's allocation in the current
/// context and returns its base.
pub fn ipc_open_mem_handle(handle: sys::CUipcMemHandle) -> DriverResult<sys::CUdeviceptr> {
    let mut base: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: valid out pointer; the handle is plain bytes the driver validates.
    let rc = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, handle, flags) };
    to_result(rc, base)
}

/// `cuIpcCloseMemHandle`: unmaps a mapping opened by [`ipc_open_mem_handle`].
///
/// # Safety
/// `base` was returned by [`ipc_open_mem_handle`] in the current context, is closed once, and
/// no device work still in flight reads it.
pub unsafe fn ipc_close_mem_handle(base: sys::CUdeviceptr) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuIpcCloseMemHandle(base) };
    to_result(rc, ())
}

/// `cuPointerGetAttributes`: asks for the first `count` of `attrs`, written through `data`.
///
/// # Safety
/// `attrs` and `data` have at least `count` entries, and every data entry points to writable
/// memory large enough for its attribute.
pub unsafe fn pointer_get_attributes(
    count: usize,
    attrs: &mut [sys::CUpointer_attribute],
    data: &mut [*mut c_void],
    ptr: sys::CUdeviceptr,
) -> DriverResult<()> {
    debug_assert!(count <= attrs.len() && count <= data.len());
    // SAFETY: the caller's guarantees above.
    let rc = unsafe {
        sys::cuPointerGetAttributes(count as u32, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr)
    };
    to_result(rc, ())
}

/// Whether `ptr` lies in a VMM mapping: `cuMemRetainAllocationHandle` succeeds only there; the
/// reference it takes is dropped at once (`cuMemRelease`).
pub fn is_vmm_address(ptr: u64) -> bool {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out pointer; the driver only looks the address up.
    let rc = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, ptr as *mut c_void) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return false;
    }
    // SAFETY: the retain above succeeded, so this drops exactly the reference it took.
    unsafe { sys::cuMemRelease(handle) };
    true
}

/// `cuMemAlloc` (v2): `bytes` of device memory in the current context.
pub fn mem_alloc(bytes: usize) -> DriverResult<sys::CUdeviceptr> {
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; the driver fails cleanly without a current context.
    let rc = unsafe { sys::cuMemAlloc_v2(&mut base, bytes) };
    to_result(rc, base)
}

/// `cuMemFree` (v2).
///
/// # Safety
/// `base` came from [`mem_alloc`], is freed once, and nothing (no queued work, no peer that is
/// still to map it) uses it any more.
pub unsafe fn mem_free(base: sys::CUdeviceptr) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuMemFree_v2(base) };
    to_result(rc, ())
}

/// `cuStreamCreate`: a stream of the current context with `flags`.
pub fn stream_create(flags: sys::CUstream_flags) -> DriverResult<sys::CUstream> {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out pointer; the driver fails cleanly without a current context.
    let rc = unsafe { sys::cuStreamCreate(&mut stream, flags as u32) };
    to_result(rc, stream)
}

/// `cuStreamDestroy` (v2).
///
/// # Safety
/// `stream` came from [`stream_create`] and is destroyed once.
pub unsafe fn stream_destroy(stream: sys::CUstream) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuStreamDestroy_v2(stream) };
    to_result(rc, ())
}

/// `cuStreamSynchronize`.
///
/// # Safety
/// `stream` is a live stream (not destroyed).
pub unsafe fn stream_synchronize(stream: sys::CUstream) -> DriverResult<()> {
    // SAFETY: the caller's guarantee above.
    let rc = unsafe { sys::cuStreamSynchronize(stream) };
    to_result(rc, ())
}

/// `cuCtxSynchronize`: waits for all work of the current context.
pub fn ctx_synchronize() -> DriverResult<()> {
    // SAFETY: no arguments; the driver fails cleanly without a current context.
    let rc = unsafe { sys::cuCtxSynchronize() };
    to_result(rc, ())
}

/// `cuMemsetD32Async`: queues writing `value` into `words` 32-bit words at `addr` on `stream`.
///
/// # Safety
/// `[addr, addr + 4 * words)` is device memory this process owns and may overwrite, and
/// `stream` is a live stream of its context.
pub unsafe fn memset_d32_async(
    addr: sys::CUdeviceptr,
    value: u32,
    words: usize,
    stream: sys::CUstream,
) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuMemsetD32Async(addr, value, words, stream) };
    to_result(rc, ())
}

/// `cuMemcpyDtoDAsync` (v2): queues copying `bytes` from `src` to `dst` on `stream`.
///
/// # Safety
/// Both ranges are mapped device memory of at least `bytes`, `dst` may be overwritten, and
/// `stream` is a live stream.
pub unsafe fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) };
    to_result(rc, ())
}

/// `cuStreamWriteValue32` (v2, default flags): queues writing `value` at `addr` on `stream`.
///
/// # Safety
/// `addr` is a mapped 32-bit device semaphore that may be written, and `stream` a live stream.
pub unsafe fn stream_write_value32(
    stream: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u32,
) -> DriverResult<()> {
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuStreamWriteValue32_v2(stream, addr, value, flags) };
    to_result(rc, ())
}

/// `cuStreamWaitValue32` (v2, `>=`): queues a wait on `stream` until the 32-bit value at `addr`
/// is at least `value`.
///
/// # Safety
/// `addr` is a mapped 32-bit device semaphore, and `stream` a live stream.
pub unsafe fn stream_wait_value32_geq(
    stream: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u32,
) -> DriverResult<()> {
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuStreamWaitValue32_v2(stream, addr, value, flags) };
    to_result(rc, ())
}

/// `cuStreamQuery`: `Ok` when all work queued on `stream` has finished, else the code
/// (`CUDA_ERROR_NOT_READY` while work is pending).
///
/// # Safety
/// `stream` is a live stream.
pub unsafe fn stream_query(stream: sys::CUstream) -> DriverResult<()> {
    // SAFETY: the caller's guarantee above.
    let rc = unsafe { sys::cuStreamQuery(stream) };
    to_result(rc, ())
}

/// `cuMemcpyHtoD` (v2): copies `src` to device memory at `dst`.
///
/// # Safety
/// `[dst, dst + src.len())` is device memory this process may overwrite.
pub unsafe fn memcpy_htod(dst: sys::CUdeviceptr, src: &[u8]) -> DriverResult<()> {
    // SAFETY: the caller's guarantee above; `src` is a valid slice read before the call returns.
    let rc = unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) };
    to_result(rc, ())
}

/// `cuMemcpyDtoH` (v2): copies `dst.len()` bytes of device memory at `src` into `dst`
/// (synchronous).
///
/// # Safety
/// `[src, src + dst.len())` is mapped device memory.
pub unsafe fn memcpy_dtoh(dst: &mut [u8], src: sys::CUdeviceptr) -> DriverResult<()> {
    // SAFETY: the caller's guarantee above; `dst` is exclusively borrowed for its whole length.
    let rc = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) };
    to_result(rc, ())
}
