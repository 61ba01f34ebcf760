//! Loading the CUDA driver and managing contexts.
//!
//! cudarc's loader panics on a missing library or symbol, so [`driver`] first checks both; a
//! machine without a usable driver gets [`Status::CudaUnavailable`]. `cuInit(0)` runs once and its
//! outcome is remembered. nvFuser selects its device (`cudaSetDevice`) before our calls, so its
//! primary context is current and used as is; a thread without one gets the primary context of
//! the requested device (default: local rank modulo the device count, as nvFuser picks it), made
//! current as the runtime API would. Retained primary contexts are never released: the host
//! program may still use them.

use crate::error::{Error, Result, Status};
use cudarc::driver::sys;
use once_cell::sync::OnceCell;
use std::ffi::{c_char, CStr};

/// Proof that the driver library is loaded and `cuInit(0)` succeeded.
#[derive(Debug)]
pub struct Driver {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub version: i32,
}

/// Every driver symbol this crate calls, the one list (cudarc's loader panics on a missing one).
/// The last four serve only the CLI (device buffers, doctor); every supported driver has them.
const REQUIRED_SYMBOLS: &str = "\
    cuInit cuDriverGetVersion cuGetErrorName cuGetErrorString cuDeviceGet cuDeviceGetCount \
    cuDeviceGetAttribute cuDeviceGetUuid_v2 cuDevicePrimaryCtxRetain cuCtxGetCurrent \
    cuCtxSetCurrent cuCtxPushCurrent_v2 cuCtxPopCurrent_v2 cuCtxGetDevice cuCtxSynchronize \
    cuPointerGetAttributes cuMemRetainAllocationHandle cuMemRelease cuMemCreate \
    cuMemGetAllocationGranularity cuMemExportToShareableHandle cuMemImportFromShareableHandle \
    cuMemAddressReserve cuMemAddressFree cuMemMap cuMemUnmap cuMemSetAccess \
    cuMemPoolExportToShareableHandle cuMemPoolExportPointer cuMemPoolImportFromShareableHandle \
    cuMemPoolImportPointer cuMemPoolDestroy cuMemPoolSetAccess cuIpcGetMemHandle \
    cuIpcOpenMemHandle_v2 \
    cuIpcCloseMemHandle cuMemAlloc_v2 cuMemFree_v2 cuMemsetD32Async cuMemcpyDtoDAsync_v2 \
    cuStreamCreate cuStreamDestroy_v2 cuStreamSynchronize cuStreamWriteValue32_v2 \
    cuStreamWaitValue32_v2 cuMemcpyHtoD_v2 cuMemcpyDtoH_v2 cuStreamQuery cuDeviceCanAccessPeer";

/// Oldest driver with the v2 stream memory operations (enabled by default on all platforms).
pub const MIN_DRIVER_VERSION: i32 = 11070;

// process-wide: the process loads libcuda and runs cuInit once.
static DRIVER: OnceCell<Result<Driver>> = OnceCell::new();

/// The loaded and initialised driver (once per process), or why there is none.
pub fn driver() -> Result<&'static Driver> {
    match DRIVER.get_or_init(|| load(library_present, missing_symbols)) {
        Ok(driver) => Ok(driver),
        Err(err) => Err(err.clone()),
    }
}

/// True when device memory can be used in this process (driver loaded, `cuInit` succeeded).
pub fn is_available() -> bool {
    driver().is_ok()
}

fn library_present() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the candidate library names and drops what
    // it opened; it has no preconditions.
    unsafe { sys::is_culib_present() }
}

fn missing_symbols() -> Vec<&'static str> {
    // SAFETY: only called after library_present() returned true, so culib() finds the same
    // library and does not panic. Looking a symbol up has no side effects.
    let lib = unsafe { sys::culib() };
    REQUIRED_SYMBOLS
        .split_whitespace()
        // SAFETY: the symbol is only looked up, never called through this pointer type.
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(*name) }.is_err())
        .collect()
}

fn unavailable(detail: impl std::fmt::Display) -> Error {
    Error::new(Status::CudaUnavailable, detail.to_string())
}

fn load(present: impl Fn() -> bool, missing: impl Fn() -> Vec<&'static str>) -> Result<Driver> {
    if !present() {
        return Err(unavailable(
            "CUDA driver not available (libcuda.so.1 not found): install the NVIDIA driver or \
             add the directory holding libcuda.so.1 to LD_LIBRARY_PATH; host (shared-memory) \
             buffers still work without it",
        ));
    }
    let missing = missing();
    if !missing.is_empty() {
        return Err(unavailable(format!(
            "CUDA driver not usable: libcuda does not export {} (driver too old? CUDA >= 11.7 \
             is required)",
            missing.join(", ")
        )));
    }
    // SAFETY: cuInit has no pointer arguments; all symbols were checked above.
    let rc = unsafe { sys::cuInit(0) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(unavailable(format!(
            "CUDA driver found but cuInit failed: {} (is a GPU visible to this process? check \
             CUDA_VISIBLE_DEVICES and nvidia-smi)",
            describe(rc)
        )));
    }
    let mut version = 0;
    // SAFETY: `version` is a valid out pointer.
    let rc = unsafe { sys::cuDriverGetVersion(&mut version) };
    check(rc, "cuDriverGetVersion")?;
    if version < MIN_DRIVER_VERSION {
        return Err(unavailable(format!(
            "CUDA driver {} is too old: {} or newer is required",
            format_version(version),
            format_version(MIN_DRIVER_VERSION)
        )));
    }
    Ok(Driver { version })
}

/// "13.0" for 13000.
pub fn format_version(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// `CUDA_ERROR_X (description)` for a driver result code.
pub fn describe(rc: sys::CUresult) -> String {
    let text = |f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut ptr: *const c_char = std::ptr::null();
        // SAFETY: `ptr` is a valid out pointer; the driver stores a pointer to a static string.
        let ok = unsafe { f(rc, &mut ptr) } == sys::CUresult::CUDA_SUCCESS;
        if ok && !ptr.is_null() {
            // SAFETY: non-NULL pointer to a NUL-terminated static string owned by the driver.
            Some(
                unsafe { CStr::from_ptr(ptr) }
                    .to_string_lossy()
                    .into_owned(),
            )
        } else {
            None
        }
    };
    // The error-name functions need the library; without it the enum name is all we have.
    if DRIVER.get().is_some_and(|d| d.is_ok()) {
        // A code newer than these bindings has no name here: print its number.
        let name = text(sys::cuGetErrorName).unwrap_or_else(|| format!("CUresult {}", rc as u32));
        match text(sys::cuGetErrorString) {
            Some(desc) => format!("{name} ({desc})"),
            None => name,
        }
    } else {
        format!("{rc:?}")
    }
}

/// Maps a driver result to `Ok` or a [`Status::Cuda`] error naming the call.
pub fn check(rc: sys::CUresult, call: &str) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(rc, call))
    }
}

/// The [`Status::Cuda`] error of `call` failing with `rc`.
pub fn error(rc: sys::CUresult, call: &str) -> Error {
    Error::new(Status::Cuda, format!("{call} failed: {}", describe(rc)))
}

/// A CUDA context handle. Contexts are process-wide objects usable from any thread, so the
/// handle is stored as an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaContext(usize);

impl CudaContext {
    fn raw(self) -> sys::CUcontext {
        self.0 as sys::CUcontext
    }

    fn from_raw(ctx: sys::CUcontext) -> CudaContext {
        CudaContext(ctx as usize)
    }

    pub fn device(self) -> Result<i32> {
        let _guard = ContextGuard::enter(self)?;
        let mut device = 0;
        // SAFETY: valid out pointer; the context is current (guard above).
        let rc = unsafe { sys::cuCtxGetDevice(&mut device) };
        check(rc, "cuCtxGetDevice")?;
        Ok(device)
    }

    /// Waits for all work in this context (`cuCtxSynchronize` with the context current).
    pub fn synchronize(self) -> Result<()> {
        let _guard = ContextGuard::enter(self)?;
        super::result::ctx_synchronize().map_err(|rc| error(rc, "cuCtxSynchronize"))
    }
}

/// The context current on this thread, if any.
pub fn current_context() -> Result<Option<CudaContext>> {
    driver()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok((!ctx.is_null()).then(|| CudaContext::from_raw(ctx)))
}

/// The primary context of `device`, retained once per process and never released.
pub fn primary_context(device: i32) -> Result<CudaContext> {
    driver()?;
    let count = device_count()?;
    if device < 0 || device >= count {
        return Err(Error::invalid(format!(
            "CUDA device {device} does not exist ({count} visible device(s); check \
             CUDA_VISIBLE_DEVICES)"
        )));
    }
    let mut map = crate::sync::lock(&super::runtime().primary);
    if let Some(ctx) = map.get(&device) {
        return Ok(*ctx);
    }
    let dev = device_handle(device)?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer and a device handle from cuDeviceGet.
    let rc = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
    check(rc, &format!("cuDevicePrimaryCtxRetain(device {device})"))?;
    let ctx = CudaContext::from_raw(ctx);
    map.insert(device, ctx);
    Ok(ctx)
}

/// The device for a thread that has no current context and names none: the launcher's local
/// rank modulo the number of devices (the device nvFuser selects for the rank), else device 0.
pub fn default_device() -> Result<i32> {
    let count = device_count()?.max(1) as usize;
    let local = crate::os::launcher::local_rank_from(crate::config::process_env_utf8).unwrap_or(0);
    Ok((local % count) as i32)
}

/// The context current on this thread, else the primary context of `default_device` (or of
/// [`default_device()`]) made current for good.
pub fn ensure_context(default_device: Option<i32>) -> Result<CudaContext> {
    if let Some(ctx) = current_context()? {
        return Ok(ctx);
    }
    let ctx = primary_context(default_device.map_or_else(self::default_device, Ok)?)?;
    // SAFETY: a retained primary context is a valid context handle.
    let rc = unsafe { sys::cuCtxSetCurrent(ctx.raw()) };
    check(rc, "cuCtxSetCurrent")?;
    Ok(ctx)
}

/// Enters a context for work on `device`: the current one when it belongs to `d`, else `d`'s
/// primary context (pushed until the guard drops); with `None`, [`ensure_context`]'s.
pub fn enter_device(device: Option<i32>) -> Result<(CudaContext, ContextGuard)> {
    match device {
        Some(d) => {
            let guard = ContextGuard::for_device(d)?;
            let ctx = current_context()?
                .ok_or_else(|| Error::internal("no current CUDA context after entering one"))?;
            Ok((ctx, guard))
        }
        None => Ok((ensure_context(None)?, ContextGuard { pushed: false })),
    }
}

/// Makes `ctx` current for a scope: pushes it when another (or no) context is current and pops it
/// again on drop; does nothing when `ctx` is already current.
pub struct ContextGuard {
    pushed: bool,
}

impl ContextGuard {
    pub fn enter(ctx: CudaContext) -> Result<ContextGuard> {
        if current_context()? == Some(ctx) {
            return Ok(ContextGuard { pushed: false });
        }
        // SAFETY: `ctx` came from the driver (current or retained primary context).
        let rc = unsafe { sys::cuCtxPushCurrent_v2(ctx.raw()) };
        check(rc, "cuCtxPushCurrent")?;
        Ok(ContextGuard { pushed: true })
    }

    /// Enters the primary context of `device` unless the current context already belongs to it.
    pub fn for_device(device: i32) -> Result<ContextGuard> {
        if let Some(ctx) = current_context()? {
            if ctx.device()? == device {
                return Ok(ContextGuard { pushed: false });
            }
        }
        Self::enter(primary_context(device)?)
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: we pushed a context in `enter`, so there is one to pop; valid out pointer.
            // A failure cannot be reported from drop and leaves the thread's stack as it was.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

pub fn device_count() -> Result<i32> {
    driver()?;
    let mut count = 0;
    // SAFETY: valid out pointer.
    let rc = unsafe { sys::cuDeviceGetCount(&mut count) };
    check(rc, "cuDeviceGetCount")?;
    Ok(count)
}

fn device_handle(ordinal: i32) -> Result<sys::CUdevice> {
    driver()?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out pointer.
    let rc = unsafe { sys::cuDeviceGet(&mut dev, ordinal) };
    check(rc, &format!("cuDeviceGet({ordinal})"))?;
    Ok(dev)
}

/// The device's UUID (the identity that goes into handle records).
pub fn device_uuid(ordinal: i32) -> Result<[u8; 16]> {
    let dev = device_handle(ordinal)?;
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid out pointer and device handle.
    let rc = unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) };
    check(rc, &format!("cuDeviceGetUuid(device {ordinal})"))?;
    Ok(uuid.bytes.map(|b| b as u8))
}

/// Whether device `ordinal` can access device `peer`'s memory directly (`cuDeviceCanAccessPeer`).
pub fn can_access_peer(ordinal: i32, peer: i32) -> Result<bool> {
    let dev = device_handle(ordinal)?;
    let other = device_handle(peer)?;
    let mut can = 0;
    // SAFETY: valid out pointer and device handles.
    let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, other) };
    check(
        rc,
        &format!("cuDeviceCanAccessPeer(device {ordinal}, device {peer})"),
    )?;
    Ok(can != 0)
}

/// A device attribute by number, for attributes newer than the bindings (e.g. 128, FABRIC
/// support, CUDA 12.3); an older driver answers `CUDA_ERROR_INVALID_VALUE`.
pub fn device_attribute_code(ordinal: i32, code: i32) -> Result<i32> {
    let dev = device_handle(ordinal)?;
    type GetAttribute =
        unsafe extern "C" fn(*mut std::ffi::c_int, std::ffi::c_int, sys::CUdevice) -> sys::CUresult;
    // SAFETY: `driver()` succeeded (in device_handle), so culib() finds the loaded library;
    // cuDeviceGetAttribute is in REQUIRED_SYMBOLS and has this C signature (the attribute is a C
    // enum, passed as an int).
    let get = unsafe { sys::culib().get::<GetAttribute>(b"cuDeviceGetAttribute") }
        .map_err(|e| unavailable(format!("cuDeviceGetAttribute not found: {e}")))?;
    let mut value = 0;
    // SAFETY: valid out pointer and device handle; the driver validates the attribute number.
    let rc = unsafe { get(&mut value, code, dev) };
    check(
        rc,
        &format!("cuDeviceGetAttribute({code}, device {ordinal})"),
    )?;
    Ok(value)
}

#[cfg(test)]
mod tests;
