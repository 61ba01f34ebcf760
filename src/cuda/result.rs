//! The raw driver calls of the memory, IPC and stream code, each made once here with its SAFETY
//! note (cudarc's `result` layer over its `sys`); loading the driver, contexts and devices are in
//! [`driver`](super::driver). A call returns its value or the driver's code, which the caller
//! maps to an error. Calls whose arguments the driver cannot check (addresses written, freed or
//! closed, streams destroyed) are `unsafe fn` and say what their caller must guarantee.

use cudarc::driver::sys;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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
/// Every one of the first `count` data entries (both slices are checked to have them) points to writable
/// memory large enough for its attribute.
pub unsafe fn pointer_get_attributes(
    count: usize,
    attrs: &mut [sys::CUpointer_attribute],
    data: &mut [*mut c_void],
    ptr: sys::CUdeviceptr,
) -> DriverResult<()> {
    assert!(count <= attrs.len() && count <= data.len());
    // SAFETY: the caller's guarantees above.
    let rc = unsafe {
        sys::cuPointerGetAttributes(count as u32, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr)
    };
    to_result(rc, ())
}

/// `cuMemAlloc` (v2): `bytes` of device memory in the current context.
pub fn mem_alloc(bytes: usize) -> DriverResult<sys::CUdeviceptr> {
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; the driver fails cleanly without a current context.
    let rc = unsafe { sys::cuMemAlloc_v2(&mut base, bytes) };
    to_result(rc, base)
}

/// `cuMemFree` (v2), also of a pointer imported by [`mem_pool_import_pointer`].
///
/// # Safety
/// `base` came from [`mem_alloc`] or [`mem_pool_import_pointer`], is freed once, and nothing
/// (no queued work, no peer that is still to map it) uses it any more.
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

// ---- VMM (cuMemCreate'd memory: PyTorch's expandable segments, nvFuser's symmetric memory) ----

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
pub const HANDLE_TYPE_FABRIC: u32 = 8;
/// Size of a `CUmemFabricHandle`.
pub const FABRIC_HANDLE_LEN: usize = 64;

/// A reference to the physical allocation mapped at `ptr` (`cuMemRetainAllocationHandle`),
/// dropped by [`mem_release`].
pub fn mem_retain_allocation_handle(ptr: u64) -> DriverResult<sys::CUmemGenericAllocationHandle> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out pointer; the driver only looks the address up.
    let rc = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, ptr as *mut c_void) };
    to_result(rc, handle)
}

/// `cuMemRelease`: drops one reference to a physical allocation handle.
///
/// # Safety
/// `handle` holds a reference this caller owns (from a retain, create or import), released once.
pub unsafe fn mem_release(handle: sys::CUmemGenericAllocationHandle) -> DriverResult<()> {
    // SAFETY: the caller's guarantee above.
    let rc = unsafe { sys::cuMemRelease(handle) };
    to_result(rc, ())
}

/// The fd an export call writes through its out pointer (an int for POSIX fds), owned by the
/// caller.
fn exported_fd(export: impl FnOnce(*mut c_void) -> sys::CUresult) -> DriverResult<OwnedFd> {
    let mut fd: std::ffi::c_int = -1;
    to_result(export((&mut fd as *mut std::ffi::c_int).cast()), ())?;
    // SAFETY: on success the driver returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `cuMemExportToShareableHandle` as a POSIX fd, owned by the caller.
pub fn mem_export_fd(handle: sys::CUmemGenericAllocationHandle) -> DriverResult<OwnedFd> {
    let posix = sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD);
    // SAFETY: `out` points to the int a POSIX fd is written to; the driver validates the handle.
    exported_fd(|out| unsafe { sys::cuMemExportToShareableHandle(out, handle, posix, 0) })
}

/// `cuMemExportToShareableHandle` as a FABRIC handle.
pub fn mem_export_fabric(
    handle: sys::CUmemGenericAllocationHandle,
) -> DriverResult<[u8; FABRIC_HANDLE_LEN]> {
    let mut out = [0u8; FABRIC_HANDLE_LEN];
    // SAFETY: a CUmemFabricHandle is 64 plain bytes; the driver validates the handle.
    let rc = unsafe {
        sys::cuMemExportToShareableHandle(
            out.as_mut_ptr().cast(),
            handle,
            sys::CUmemAllocationHandleType(HANDLE_TYPE_FABRIC),
            0,
        )
    };
    to_result(rc, out)
}

/// `cuMemImportFromShareableHandle` of a POSIX fd (the fd stays the caller's to close).
pub fn mem_import_fd(fd: BorrowedFd<'_>) -> DriverResult<sys::CUmemGenericAllocationHandle> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // For POSIX fds the driver takes the descriptor number itself, passed as the pointer value.
    let os_handle = fd.as_raw_fd() as isize as *mut c_void;
    // SAFETY: valid out pointer; the descriptor is open for the duration of the call.
    let rc = unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            os_handle,
            sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
        )
    };
    to_result(rc, handle)
}

/// `cuMemImportFromShareableHandle` of a FABRIC handle.
pub fn mem_import_fabric(
    fabric: &[u8; FABRIC_HANDLE_LEN],
) -> DriverResult<sys::CUmemGenericAllocationHandle> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    let mut bytes = *fabric;
    // SAFETY: for FABRIC the driver reads 64 bytes at the pointer.
    let rc = unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            bytes.as_mut_ptr().cast(),
            sys::CUmemAllocationHandleType(HANDLE_TYPE_FABRIC),
        )
    };
    to_result(rc, handle)
}

/// `cuMemAddressReserve`: `size` bytes of virtual address space, nothing mapped yet.
pub fn mem_address_reserve(size: u64, alignment: u64) -> DriverResult<u64> {
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; the driver picks the address (hint 0).
    let rc =
        unsafe { sys::cuMemAddressReserve(&mut base, size as usize, alignment as usize, 0, 0) };
    to_result(rc, base)
}

/// `cuMemAddressFree`.
///
/// # Safety
/// `[base, base + size)` was reserved by [`mem_address_reserve`], nothing is mapped in it any
/// more, and it is freed once.
pub unsafe fn mem_address_free(base: u64, size: u64) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuMemAddressFree(base, size as usize) };
    to_result(rc, ())
}

/// `cuMemMap` of a whole physical allocation of `size` bytes at `at`.
///
/// # Safety
/// `[at, at + size)` lies in a reserved range of this process with nothing mapped there.
pub unsafe fn mem_map(
    at: u64,
    size: u64,
    handle: sys::CUmemGenericAllocationHandle,
) -> DriverResult<()> {
    // SAFETY: the caller's guarantee above; the driver validates handle and size.
    let rc = unsafe { sys::cuMemMap(at, size as usize, 0, handle, 0) };
    to_result(rc, ())
}

/// `cuMemUnmap`.
///
/// # Safety
/// `[at, at + size)` is mapped by this process and no queued device work still uses it.
pub unsafe fn mem_unmap(at: u64, size: u64) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuMemUnmap(at, size as usize) };
    to_result(rc, ())
}

/// `cuMemSetAccess`: read-write access for `device` to the fully mapped `[base, base + size)`.
pub fn mem_set_access_rw(base: u64, size: u64, device: i32) -> DriverResult<()> {
    // SAFETY: an all-zero CUmemAccessDesc is a valid value (zero enums, zero id); the fields
    // that matter are set below.
    let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: one valid descriptor; the driver validates the range.
    let rc = unsafe { sys::cuMemSetAccess(base, size as usize, &desc, 1) };
    to_result(rc, ())
}

// ---- stream-ordered pools (cudaMallocAsync) ----

/// Size of a `CUmemPoolPtrExportData`.
pub const POOL_PTR_EXPORT_LEN: usize = 64;

/// `cuMemPoolExportToShareableHandle` as a POSIX fd, owned by the caller. Fails unless the pool
/// was created with POSIX fd handles (the device's default pool never is).
pub fn mem_pool_export_fd(pool: u64) -> DriverResult<OwnedFd> {
    let pool = pool as sys::CUmemoryPool;
    let posix = sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD);
    // SAFETY: `out` points to the int a POSIX fd is written to; the driver validates the pool.
    exported_fd(|out| unsafe { sys::cuMemPoolExportToShareableHandle(out, pool, posix, 0) })
}

/// `cuMemPoolExportPointer`: the data a peer needs to import the pool allocation at `ptr`.
pub fn mem_pool_export_pointer(ptr: u64) -> DriverResult<[u8; POOL_PTR_EXPORT_LEN]> {
    let mut data = sys::CUmemPoolPtrExportData {
        reserved: [0; POOL_PTR_EXPORT_LEN],
    };
    // SAFETY: valid out pointer; the driver validates the pointer.
    let rc = unsafe { sys::cuMemPoolExportPointer(&mut data, ptr) };
    to_result(rc, data.reserved)
}

/// `cuMemPoolImportFromShareableHandle` of a POSIX fd (the fd stays the caller's to close).
pub fn mem_pool_import_fd(fd: BorrowedFd<'_>) -> DriverResult<u64> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let os_handle = fd.as_raw_fd() as isize as *mut c_void;
    // SAFETY: valid out pointer; the descriptor is open for the duration of the call.
    let rc = unsafe {
        sys::cuMemPoolImportFromShareableHandle(
            &mut pool,
            os_handle,
            sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
            0,
        )
    };
    to_result(rc, pool as u64)
}

/// `cuMemPoolImportPointer`: maps a peer's pool allocation into this process.
pub fn mem_pool_import_pointer(pool: u64, data: &[u8; POOL_PTR_EXPORT_LEN]) -> DriverResult<u64> {
    let mut ptr: sys::CUdeviceptr = 0;
    let mut export = sys::CUmemPoolPtrExportData { reserved: *data };
    // SAFETY: valid out pointer and export data; the driver validates the pool.
    let rc =
        unsafe { sys::cuMemPoolImportPointer(&mut ptr, pool as sys::CUmemoryPool, &mut export) };
    to_result(rc, ptr)
}

/// `cuMemPoolDestroy` of an imported pool.
///
/// # Safety
/// `pool` was imported by [`mem_pool_import_fd`], every pointer imported from it was freed,
/// and it is destroyed once.
pub unsafe fn mem_pool_destroy(pool: u64) -> DriverResult<()> {
    // SAFETY: the caller's guarantees above.
    let rc = unsafe { sys::cuMemPoolDestroy(pool as sys::CUmemoryPool) };
    to_result(rc, ())
}

/// `cuMemCreate` of `size` bytes of device memory on `device`, exportable as `handle_types` (a
/// bitmask of `HANDLE_TYPE_*`). The caller owns the returned reference.
pub fn mem_create(
    size: u64,
    device: i32,
    handle_types: u32,
) -> DriverResult<sys::CUmemGenericAllocationHandle> {
    let mut prop = device_prop(device);
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType(handle_types);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out pointer and properties; the driver validates size and device.
    let rc = unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) };
    to_result(rc, handle)
}

/// The minimum granularity of [`mem_create`] allocations on `device`.
pub fn mem_granularity(device: i32) -> DriverResult<u64> {
    let prop = device_prop(device);
    let mut granularity = 0usize;
    let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: valid out pointer and properties.
    let rc = unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, minimum) };
    to_result(rc, granularity as u64)
}

fn device_prop(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is a valid value; the fields that matter are set
    // below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD);
    prop
}

/// `cuMemPoolSetAccess`: read-write access for `device` to the memory of `pool`.
pub fn mem_pool_set_access_rw(pool: u64, device: i32) -> DriverResult<()> {
    // SAFETY: an all-zero CUmemAccessDesc is a valid value; the fields that matter are set below.
    let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: one valid descriptor; the driver validates the pool.
    let rc = unsafe { sys::cuMemPoolSetAccess(pool as sys::CUmemoryPool, &desc, 1) };
    to_result(rc, ())
}
