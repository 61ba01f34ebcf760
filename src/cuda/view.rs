//! Contiguous views of VMM device buffers (see `transport::view`): one VA range is reserved for
//! every member and each member's physical allocations are mapped again into its slot, whole
//! (a partial `cuMemMap` is not supported by the driver), with read-write access for this device.
//!
//! This rank's own allocations are mapped through handles taken with
//! `cuMemRetainAllocationHandle` and dropped once mapped; a peer's through the handles its VMM
//! import already holds (`vmm_map`), looked up under the import table's lock, so nothing is
//! imported twice. A mapping keeps its physical memory alive by itself, so the view stays valid
//! when the imports are released, until it is dropped: then every slot is unmapped
//! (`cuMemUnmap` waits for the device work using it, as the driver documents) and the range
//! freed. Memory that is not VMM (`cudaMalloc`, stream-ordered pools) cannot be mapped again:
//! `Unsupported`.

use super::driver::{self, Context, ContextGuard};
use super::memory::{self, DeviceMemoryKind};
use super::result;
use super::vmm;
use super::vmm_map;
use crate::error::{Error, Result};
use crate::transport::record::HandleType;
use crate::transport::view::{plan, ContiguousView, Extent, Layout, ViewMember};
use cudarc::driver::sys;

/// What is mapped for one member: this rank's segments by address, or a peer's by id.
enum Pieces {
    Own(Vec<(u64, u64)>),
    Peer { pid: u32, segments: Vec<(u64, u64)> },
}

/// Handles taken with `cuMemRetainAllocationHandle`, dropped together.
struct Retained(Vec<sys::CUmemGenericAllocationHandle>);

impl Drop for Retained {
    fn drop(&mut self) {
        for &h in &self.0 {
            // SAFETY: each handle was retained once by `retain` and is released once here;
            // mappings made with it hold the memory on their own.
            let _ = unsafe { result::mem_release(h) };
        }
    }
}

/// A device view; dropping it unmaps it.
pub struct DeviceView {
    context: Context,
    reserved: u64,
    layout: Layout,
    /// Mapped ranges (one per member once mapped).
    mapped: Vec<(u64, u64)>,
}

fn not_vmm(rank: usize, what: &str) -> Error {
    Error::unsupported(format!(
        "contiguous view: rank {rank}'s buffer is {what}, whose physical memory cannot be mapped \
         again; a VMM allocation is needed (cuMemCreate + cuMemMap, e.g. PyTorch's expandable \
         segments)"
    ))
}

impl DeviceView {
    /// Maps `members` (in the view's order) into one reserved range, on the device of this
    /// rank's own buffer (else `device`, else the current one).
    pub fn map(members: &[ViewMember<'_>], device: Option<i32>) -> Result<DeviceView> {
        let mut pieces = Vec::with_capacity(members.len());
        let mut extents = Vec::with_capacity(members.len());
        let mut own_device = None;
        for m in members {
            match *m {
                ViewMember::Own { rank, buffer } => {
                    let alloc = memory::resolve(buffer.ptr, buffer.bytes)?;
                    match alloc.kind {
                        DeviceMemoryKind::Vmm { .. } => {}
                        DeviceMemoryKind::Legacy => return Err(not_vmm(rank, "cudaMalloc memory")),
                        DeviceMemoryKind::Pool { .. } => {
                            return Err(not_vmm(rank, "memory of a stream-ordered pool"))
                        }
                    }
                    let run = vmm::resolve_run(&alloc)?;
                    own_device = Some(alloc.device_ordinal);
                    extents.push(Extent {
                        rank,
                        bytes: buffer.bytes,
                        lead: buffer.ptr - run.base(),
                        span: run.size(),
                    });
                    pieces.push(Pieces::Own(
                        run.segments.iter().map(|s| (s.base, s.size)).collect(),
                    ));
                }
                ViewMember::Peer { rank, record, .. } => {
                    match record.handle_type {
                        HandleType::CudaVmmFd | HandleType::CudaVmmFabric => {}
                        HandleType::CudaLegacyIpc => {
                            return Err(not_vmm(rank, "cudaMalloc memory"))
                        }
                        HandleType::CudaPool => {
                            return Err(not_vmm(rank, "memory of a stream-ordered pool"))
                        }
                        HandleType::PosixFd => return Err(not_vmm(rank, "host memory")),
                    }
                    extents.push(Extent {
                        rank,
                        bytes: record.bytes,
                        lead: record.offset,
                        span: record.segments.iter().map(|s| s.bytes).sum(),
                    });
                    pieces.push(Pieces::Peer {
                        pid: record.pid,
                        segments: record.segments.iter().map(|s| (s.id, s.bytes)).collect(),
                    });
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
        let total = layout.reserved_bytes();
        let reserved = result::mem_address_reserve(total, granularity)
            .map_err(|rc| driver::error(rc, &format!("cuMemAddressReserve({total})")))?;
        // From here on, dropping the view undoes whatever was done.
        let mut view = DeviceView {
            context,
            reserved,
            layout,
            mapped: Vec::with_capacity(members.len()),
        };
        let own = Retained(
            pieces
                .iter()
                .filter_map(|p| match p {
                    Pieces::Own(segments) => Some(segments),
                    Pieces::Peer { .. } => None,
                })
                .flatten()
                .map(|&(base, _)| {
                    result::mem_retain_allocation_handle(base).map_err(|rc| {
                        driver::error(rc, &format!("cuMemRetainAllocationHandle({base:#x})"))
                    })
                })
                .collect::<Result<_>>()?,
        );
        vmm_map::with_imported_segments(|lookup| {
            let mut own_handles = own.0.iter();
            for (i, (p, e)) in pieces.iter().zip(&extents).enumerate() {
                let handles: Vec<(sys::CUmemGenericAllocationHandle, u64)> = match p {
                    Pieces::Own(segments) => segments
                        .iter()
                        .map(|&(_, size)| (*own_handles.next().expect("one per own segment"), size))
                        .collect(),
                    Pieces::Peer { pid, segments } => segments
                        .iter()
                        .map(|&(id, size)| {
                            lookup(*pid, device, id).map(|h| (h, size)).ok_or_else(|| {
                                Error::state(format!(
                                    "contiguous view: segment {id} of rank {}'s VMM buffer is \
                                     not imported on device {device} (was it released?)",
                                    e.rank
                                ))
                            })
                        })
                        .collect::<Result<_>>()?,
                };
                view.map_member(i, &handles, device)?;
            }
            Ok::<(), Error>(())
        })?;
        Ok(view)
    }

    /// Maps one member's `handles` back to back into slot `i` and grants `device` access.
    fn map_member(
        &mut self,
        i: usize,
        handles: &[(sys::CUmemGenericAllocationHandle, u64)],
        device: i32,
    ) -> Result<()> {
        let at = self.reserved + self.layout.slot(i);
        let mut len = 0u64;
        for &(handle, size) in handles {
            // SAFETY: [at + len, + size) lies in slot i of the range reserved for this view
            // (the plan made the stride at least the member's span), where nothing is mapped yet.
            if let Err(rc) = unsafe { result::mem_map(at + len, size, handle) } {
                if len > 0 {
                    self.mapped.push((at, len));
                }
                return Err(driver::error(
                    rc,
                    &format!("cuMemMap({:#x}, {size}) for the view", at + len),
                ));
            }
            len += size;
        }
        self.mapped.push((at, len));
        result::mem_set_access_rw(at, len, device).map_err(|rc| {
            driver::error(
                rc,
                &format!("cuMemSetAccess({at:#x}, {len}) for device {device}"),
            )
        })
    }
}

impl ContiguousView for DeviceView {
    fn base(&self) -> u64 {
        self.reserved + self.layout.lead
    }

    fn stride(&self) -> u64 {
        self.layout.stride
    }
}

impl Drop for DeviceView {
    fn drop(&mut self) {
        // Without the context nothing can be unmapped; the range then stays reserved.
        let Ok(_guard) = ContextGuard::enter(self.context) else {
            return;
        };
        for &(at, len) in &self.mapped {
            // SAFETY: mapped by `map_member` into this view's range and unmapped once, here.
            let _ = unsafe { result::mem_unmap(at, len) };
        }
        // SAFETY: reserved by `map` for this view, now fully unmapped, freed once.
        let _ = unsafe { result::mem_address_free(self.reserved, self.layout.reserved_bytes()) };
    }
}
