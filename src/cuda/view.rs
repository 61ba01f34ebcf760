//! Contiguous views of VMM device buffers, the device backing of `transport::view` (PROTOCOL.md
//! section 5, "Symmetric memory"): each member's physical allocations mapped again, whole, into its
//! slot of one reserved range. This rank's allocations are mapped through handles retained for the
//! purpose, a peer's through the handles its VMM import holds (`vmm_map`, under the import table's
//! lock). A mapping holds its memory by itself, so the view outlives the imports; dropping it
//! unmaps every slot (`cuMemUnmap` waits for the device work using it) and frees the range.

use super::driver::{self, ContextGuard, CudaContext};
use super::memory::{self, DeviceMemoryKind};
use super::result;
use super::vmm;
use super::vmm_map;
use crate::error::{Error, Result};
use crate::transport::record::{HandleType, Record};
use crate::transport::view::{plan, ContiguousView, Extent, ViewMember};
use cudarc::driver::sys;

/// Where a member's physical allocations come from: this rank's VMM run, a peer's record.
enum Source<'a> {
    Own(vmm::Run),
    Peer(&'a Record),
}

/// The reserved range of a device view and what is mapped into it; dropping it unmaps them.
struct DeviceRange {
    context: CudaContext,
    reserved: u64,
    bytes: u64,
    /// Mapped ranges (one per member once mapped).
    mapped: Vec<(u64, u64)>,
}

/// Handles taken with `cuMemRetainAllocationHandle`, dropped together.
struct Retained(Vec<sys::CUmemGenericAllocationHandle>);

impl Drop for Retained {
    fn drop(&mut self) {
        for &h in &self.0 {
            // SAFETY: each handle was retained once by `map` and is released once here;
            // mappings made with it hold the memory on their own.
            let _ = unsafe { result::mem_release(h) };
        }
    }
}

/// `Unsupported` unless memory shared as `handle_type` is VMM memory.
fn require_vmm(rank: usize, handle_type: HandleType) -> Result<()> {
    let what = match handle_type {
        HandleType::CudaVmmFd | HandleType::CudaVmmFabric => return Ok(()),
        HandleType::CudaLegacyIpc => "cudaMalloc memory",
        HandleType::CudaPool => "memory of a stream-ordered pool",
        HandleType::PosixFd => "host memory",
    };
    Err(Error::unsupported(format!(
        "contiguous view: rank {rank}'s buffer is {what}, whose physical memory cannot be mapped \
         again; a VMM allocation is needed (cuMemCreate + cuMemMap, e.g. PyTorch's expandable \
         segments)"
    )))
}

/// Maps `members` into one reserved range, on the device of this rank's buffer (else `device`).
pub fn map(members: &[ViewMember<'_>], device: Option<i32>) -> Result<ContiguousView> {
    let mut sources = Vec::with_capacity(members.len());
    let mut extents = Vec::with_capacity(members.len());
    let mut own_device = None;
    for m in members {
        match *m {
            ViewMember::Own { rank, buffer } => {
                let alloc = memory::resolve(buffer.ptr, buffer.bytes)?;
                require_vmm(
                    rank,
                    match alloc.kind {
                        DeviceMemoryKind::Vmm { .. } => HandleType::CudaVmmFd,
                        DeviceMemoryKind::Legacy => HandleType::CudaLegacyIpc,
                        DeviceMemoryKind::Pool { .. } => HandleType::CudaPool,
                    },
                )?;
                let run = vmm::resolve_run(&alloc)?;
                own_device = Some(alloc.device_ordinal);
                extents.push(Extent {
                    rank,
                    bytes: buffer.bytes,
                    lead: buffer.ptr - run.base(),
                    span: run.size(),
                });
                sources.push(Source::Own(run));
            }
            ViewMember::Peer { rank, record, .. } => {
                require_vmm(rank, record.handle_type)?;
                extents.push(Extent {
                    rank,
                    bytes: record.bytes,
                    lead: record.offset,
                    span: record.segments.iter().map(|s| s.bytes).sum(),
                });
                sources.push(Source::Peer(record));
            }
        }
    }
    let (context, _guard) = driver::enter_device(own_device.or(device))?;
    let device = context.device()?;
    let granularity = result::mem_granularity(device).map_err(|rc| {
        driver::error(
            rc,
            &format!("cuMemGetAllocationGranularity(device {device})"),
        )
    })?;
    let layout = plan(&extents, granularity)?;
    let bytes = layout.reserved_bytes();
    let reserved = result::mem_address_reserve(bytes, granularity)
        .map_err(|rc| driver::error(rc, &format!("cuMemAddressReserve({bytes})")))?;
    // From here on, dropping the range undoes whatever was done.
    let mut range = DeviceRange {
        context,
        reserved,
        bytes,
        mapped: Vec::with_capacity(members.len()),
    };
    let mut retained = Retained(Vec::new());
    vmm_map::with_imported_segments(|lookup| {
        for (i, (source, e)) in sources.iter().zip(&extents).enumerate() {
            let handles = match source {
                Source::Own(run) => run
                    .segments
                    .iter()
                    .map(|s| {
                        let h = result::mem_retain_allocation_handle(s.base).map_err(|rc| {
                            driver::error(
                                rc,
                                &format!("cuMemRetainAllocationHandle({:#x})", s.base),
                            )
                        })?;
                        retained.0.push(h);
                        Ok((h, s.size))
                    })
                    .collect::<Result<Vec<_>>>()?,
                Source::Peer(record) => record
                    .segments
                    .iter()
                    .map(|s| {
                        let h = lookup(record.pid, device, s.id).ok_or_else(|| {
                            Error::state(format!(
                                "contiguous view: segment {} of rank {}'s VMM buffer is not \
                                 imported on device {device} (was it released?)",
                                s.id, e.rank
                            ))
                        })?;
                        Ok((h, s.bytes))
                    })
                    .collect::<Result<Vec<_>>>()?,
            };
            range.map_slot(reserved + layout.slot(i), &handles, device)?;
        }
        Ok::<(), Error>(())
    })?;
    Ok(ContiguousView::new(reserved, layout, range))
}

impl DeviceRange {
    /// Maps `handles` back to back at `at` (a slot of the range) and grants `device` access.
    fn map_slot(
        &mut self,
        at: u64,
        handles: &[(sys::CUmemGenericAllocationHandle, u64)],
        device: i32,
    ) -> Result<()> {
        let mut len = 0u64;
        // SAFETY: the slot at `at` lies in the range reserved for this view (the plan made the
        // stride at least the member's span), where nothing is mapped yet.
        let done = unsafe { vmm_map::map_back_to_back(at, handles, device, &mut len) };
        if len > 0 {
            self.mapped.push((at, len));
        }
        done
    }
}

impl Drop for DeviceRange {
    fn drop(&mut self) {
        // Without the context nothing can be unmapped; the range then stays reserved.
        let Ok(_guard) = ContextGuard::enter(self.context) else {
            return;
        };
        for &(at, len) in &self.mapped {
            // SAFETY: mapped by `map_slot` into this range and unmapped once, here.
            let _ = unsafe { result::mem_unmap(at, len) };
        }
        // SAFETY: reserved by `map` for this view, now fully unmapped, freed once.
        let _ = unsafe { result::mem_address_free(self.reserved, self.bytes) };
    }
}
