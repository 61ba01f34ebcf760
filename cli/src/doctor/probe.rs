//! Probes of what the device transports need, made with real driver calls rather than read from
//! attributes (an attribute can say "supported" where a container, a missing IMEX channel or a
//! driver setting still refuses): a VMM allocation created, exported, imported back, mapped and
//! given access, then released; and the CUDA runtime this process can load. Used by `nvfipc
//! doctor`.

use cudarc::driver::sys;
use nvfuser_ipc::tools::cuda::driver::{self, ContextGuard};
use nvfuser_ipc::tools::cuda::result::{self, HANDLE_TYPE_FABRIC, HANDLE_TYPE_POSIX_FD};
use nvfuser_ipc::Result;

/// Which shareable handle a VMM probe exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmmHandle {
    /// A POSIX file descriptor (PyTorch's expandable segments; passed by the fd transport).
    PosixFd,
    /// A FABRIC handle (multi-node NVLink; needs the IMEX daemon and a channel).
    Fabric,
}

impl VmmHandle {
    fn name(self) -> &'static str {
        match self {
            VmmHandle::PosixFd => "POSIX fd",
            VmmHandle::Fabric => "FABRIC",
        }
    }
}

/// One driver reference to a physical allocation, released on drop.
struct Physical(sys::CUmemGenericAllocationHandle);

impl Drop for Physical {
    fn drop(&mut self) {
        // SAFETY: the reference came from cuMemCreate or an import and is released once, here.
        let _ = unsafe { result::mem_release(self.0) };
    }
}

/// A reserved address range, unmapped (when mapped) and freed on drop.
struct Reserved {
    base: u64,
    size: u64,
    mapped: bool,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped by this probe, and no device work was queued on it.
            let _ = unsafe { result::mem_unmap(self.base, self.size) };
        }
        // SAFETY: reserved by this probe; nothing is mapped in it any more; freed once.
        let _ = unsafe { result::mem_address_free(self.base, self.size) };
    }
}

fn step<T>(r: result::DriverResult<T>, what: &str) -> Result<T> {
    r.map_err(|rc| driver::error(rc, what))
}

/// Creates one allocation of the minimum granularity on `device` exportable as `handle`,
/// exports it, imports the handle back (a second reference, as a peer process gets), maps the
/// import, gives `device` read-write access, then releases everything. Returns what was done;
/// the error names the step that failed and the driver's code.
pub fn vmm_round_trip(device: i32, handle: VmmHandle) -> Result<String> {
    let _ctx = ContextGuard::for_device(device)?;
    let size = step(
        result::mem_granularity(device),
        "cuMemGetAllocationGranularity",
    )?;
    let types = match handle {
        VmmHandle::PosixFd => HANDLE_TYPE_POSIX_FD,
        VmmHandle::Fabric => HANDLE_TYPE_FABRIC,
    };
    let created = Physical(step(
        result::mem_create(size, device, types),
        &format!("cuMemCreate({} bytes, {})", size, handle.name()),
    )?);
    let imported = match handle {
        VmmHandle::PosixFd => {
            let fd = step(
                result::mem_export_fd(created.0),
                "cuMemExportToShareableHandle(POSIX fd)",
            )?;
            use std::os::fd::AsFd;
            Physical(step(
                result::mem_import_fd(fd.as_fd()),
                "cuMemImportFromShareableHandle(POSIX fd)",
            )?)
        }
        VmmHandle::Fabric => {
            let fabric = step(
                result::mem_export_fabric(created.0),
                "cuMemExportToShareableHandle(FABRIC)",
            )?;
            Physical(step(
                result::mem_import_fabric(&fabric),
                "cuMemImportFromShareableHandle(FABRIC)",
            )?)
        }
    };
    let mut range = Reserved {
        base: step(
            result::mem_address_reserve(size, size),
            "cuMemAddressReserve",
        )?,
        size,
        mapped: false,
    };
    // SAFETY: the range was just reserved by this probe, `size` bytes long, and nothing is
    // mapped in it; `imported` holds a physical allocation of `size` bytes.
    let mapped = unsafe { result::mem_map(range.base, size, imported.0) };
    step(mapped, "cuMemMap")?;
    range.mapped = true;
    step(
        result::mem_set_access_rw(range.base, size, device),
        "cuMemSetAccess",
    )?;
    drop(range);
    drop(imported);
    drop(created);
    Ok(format!(
        "created {size} bytes, exported as {}, imported, mapped and accessed, released",
        handle.name()
    ))
}

/// The CUDA runtime library this process can load (`libcudart.so*`, the one PyTorch and nvFuser
/// link) and its version (`cudaRuntimeGetVersion`), or why none was found. This library itself
/// needs only the driver.
pub fn runtime_version() -> std::result::Result<(String, i32), String> {
    const NAMES: &[&str] = &[
        "libcudart.so",
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so.11.0",
    ];
    for name in NAMES {
        let cname = std::ffi::CString::new(*name).expect("no NUL in the names");
        // SAFETY: a valid NUL-terminated name; RTLD_LOCAL keeps its symbols out of the global
        // scope. The handle is never closed (the runtime stays loaded, as in any CUDA program).
        let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: a valid handle and NUL-terminated symbol name.
        let sym = unsafe { libc::dlsym(handle, c"cudaRuntimeGetVersion".as_ptr()) };
        if sym.is_null() {
            continue;
        }
        type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
        // SAFETY: cudaRuntimeGetVersion has this C signature in every CUDA runtime.
        let get: GetVersion = unsafe { std::mem::transmute::<*mut libc::c_void, GetVersion>(sym) };
        let mut version = 0;
        // SAFETY: valid out pointer.
        let rc = unsafe { get(&mut version) };
        if rc != 0 {
            return Err(format!(
                "{name}: cudaRuntimeGetVersion failed with error {rc}"
            ));
        }
        return Ok((name.to_string(), version));
    }
    Err(format!(
        "no CUDA runtime found ({} not loadable from LD_LIBRARY_PATH or the system paths)",
        NAMES.join(", ")
    ))
}
