//! Probes of what the device transports need, made with real driver calls rather than read from
//! attributes (an attribute can say "supported" where a container, a missing IMEX channel or a
//! driver setting still refuses): a VMM allocation created, exported, imported back, mapped and
//! given access, then released. Used by `nvfipc doctor`.

use super::driver::{self, ContextGuard};
use super::result::{self, HANDLE_TYPE_FABRIC, HANDLE_TYPE_POSIX_FD};
use crate::error::Result;
use cudarc::driver::sys;

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
    // SAFETY: the range was just reserved by this probe and nothing is mapped in it.
    step(
        unsafe { result::mem_map(range.base, size, imported.0) },
        "cuMemMap",
    )?;
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
