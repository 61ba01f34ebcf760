//! Exporting VMM buffers (`cuMemCreate` + `cuMemMap`: PyTorch's expandable segments, nvFuser's
//! symmetric memory): the exporter's half; the importer's is `super::vmm_map`.
//!
//! [`resolve_run`] walks the buffer's physical allocations ("segments", back to back in one
//! reserved range) in address order with `MAPPING_BASE_ADDR`/`MAPPING_SIZE`; a segment's id is its
//! `MEMORY_BLOCK_ID`. [`VmmExports`] exports each segment once, per (base, id), as a POSIX fd
//! offered through `crate::fdpass` or as a FABRIC handle; offers of segments replaced or unmapped
//! (checked on every export miss) are withdrawn, as are all when the exports are dropped.

use super::clock::DriverCall;
use super::memory::{self, DeviceAllocation, DeviceMemoryKind};
use super::result::{self, FABRIC_HANDLE_LEN, HANDLE_TYPE_FABRIC, HANDLE_TYPE_POSIX_FD};
use super::{driver, Runtime};
use crate::error::{Error, Result};
use crate::fdpass::FdPass;
use crate::hash::fnv1a64;
use crate::logging;
use crate::sync::lock;
use crate::transport::record::{HandleType, Segment, MAX_SEGMENTS, PAYLOAD_LEN};
use crate::transport::ExportedHandle;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// One physical allocation of this process, as mapped here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalSegment {
    pub base: u64,
    pub size: u64,
    /// CUDA `BUFFER_ID` of the mapping: unique for the process's lifetime.
    pub id: u64,
    /// `CU_MEM_HANDLE_TYPE_*` bits it can be exported as.
    pub handle_types: u32,
}

impl LocalSegment {
    /// The segment `alloc` is, when it is VMM memory.
    pub fn of(alloc: &DeviceAllocation) -> Option<LocalSegment> {
        match alloc.kind {
            DeviceMemoryKind::Vmm { handle_types } => Some(LocalSegment {
                base: alloc.base,
                size: alloc.size,
                id: alloc.buffer_id,
                handle_types,
            }),
            _ => None,
        }
    }
}

/// The segments that hold a VMM buffer, in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub segments: Vec<LocalSegment>,
}

impl Run {
    pub fn base(&self) -> u64 {
        self.segments[0].base
    }

    pub fn size(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// The run's identity: the segment id for one segment (as for any allocation), a hash of
    /// the ids otherwise.
    pub fn id(&self) -> u64 {
        match self.segments.as_slice() {
            [one] => one.id,
            many => {
                let bytes: Vec<u8> = many.iter().flat_map(|s| s.id.to_le_bytes()).collect();
                fnv1a64(&bytes)
            }
        }
    }
}

/// Walks the segments of the VMM buffer `alloc` from the one that holds its pointer to its end.
pub fn resolve_run(alloc: &DeviceAllocation) -> Result<Run> {
    let first = LocalSegment::of(alloc)
        .ok_or_else(|| Error::internal(format!("pointer {:#x} is not VMM memory", alloc.ptr)))?;
    walk(alloc.ptr, alloc.bytes, first, |at| {
        let next = memory::classify(&memory::query(at)?, 1)?;
        LocalSegment::of(&next).ok_or_else(|| {
            Error::unsupported(format!(
                "the buffer continues at {at:#x} into memory that is not VMM ({:?})",
                next.kind
            ))
        })
    })
}

/// The segment walk over a lookup of "the segment mapped here" (pure: unit-tested without a GPU).
fn walk(
    ptr: u64,
    bytes: u64,
    first: LocalSegment,
    mut segment_at: impl FnMut(u64) -> Result<LocalSegment>,
) -> Result<Run> {
    let end = ptr.checked_add(bytes).ok_or_else(|| {
        Error::invalid(format!(
            "range [{ptr:#x}, +{bytes}) overflows the address space"
        ))
    })?;
    // Importers tell physical allocations apart by their id: one without an id could be
    // confused with another mapped later at the same address.
    let identified = |seg: &LocalSegment| {
        if seg.id == 0 {
            Err(Error::internal(format!(
                "CUDA reported no buffer id for the VMM mapping at {:#x}",
                seg.base
            )))
        } else {
            Ok(())
        }
    };
    identified(&first)?;
    let mut segments = vec![first];
    let mut next = first.base + first.size;
    while next < end {
        if segments.len() >= MAX_SEGMENTS {
            return Err(Error::unsupported(format!(
                "range [{ptr:#x}, +{bytes}) spans more than {MAX_SEGMENTS} physical allocations"
            )));
        }
        let seg = segment_at(next).map_err(|e| {
            e.context(format!(
                "range [{ptr:#x}, +{bytes}) runs past its physical allocation at {next:#x}; the \
                 byte count may be too large"
            ))
        })?;
        if seg.base != next || seg.size == 0 {
            return Err(Error::invalid(format!(
                "range [{ptr:#x}, +{bytes}) is not contiguous VMM memory: the mapping after \
                 {next:#x} starts at {:#x} ({} bytes)",
                seg.base, seg.size
            )));
        }
        identified(&seg)?;
        next += seg.size;
        segments.push(seg);
    }
    Ok(Run { segments })
}

/// How a segment's export is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Offer {
    Fd(crate::fdpass::FdId),
    Fabric([u8; FABRIC_HANDLE_LEN]),
}

struct Exported {
    id: u64,
    size: u64,
    offer: Offer,
}

/// The exports of one device transport (see the module docs).
pub struct VmmExports {
    /// Counts the exports.
    rt: &'static Runtime,
    fdpass: Option<Arc<FdPass>>,
    /// By segment base.
    table: Mutex<HashMap<u64, Exported>>,
}

impl VmmExports {
    /// Exports offered through `fdpass`; without one, only FABRIC exports work.
    pub fn new(rt: &'static Runtime, fdpass: Option<Arc<FdPass>>) -> VmmExports {
        VmmExports {
            rt,
            fdpass,
            table: Mutex::new(HashMap::new()),
        }
    }

    /// The record handle of `run`: every segment exported once, as POSIX fds when all allow it,
    /// else as FABRIC handles.
    pub fn export(&self, run: &Run) -> Result<ExportedHandle> {
        let all = |bit: u32| run.segments.iter().all(|s| s.handle_types & bit != 0);
        let handle_type = if all(HANDLE_TYPE_POSIX_FD) && self.fdpass.is_some() {
            HandleType::CudaVmmFd
        } else if all(HANDLE_TYPE_FABRIC) {
            HandleType::CudaVmmFabric
        } else if all(HANDLE_TYPE_POSIX_FD) {
            return Err(Error::unsupported(format!(
                "VMM buffer at {:#x} can only be shared as POSIX fds, and this transport has no \
                 fd transport (use a handle cache, which brings one)",
                run.base()
            )));
        } else {
            return Err(Error::unsupported(format!(
                "the physical allocations of the VMM buffer at {:#x} allow different handle \
                 types ({}); allocate them all with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
                run.base(),
                run.segments
                    .iter()
                    .map(|s| format!("{:#x}", s.handle_types))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let mut table = lock(&self.table);
        let mut missed = false;
        let mut segments = Vec::with_capacity(run.segments.len());
        for seg in &run.segments {
            let hit = table
                .get(&seg.base)
                .filter(|e| e.id == seg.id && e.size == seg.size)
                .map(|e| e.offer)
                .filter(|o| {
                    matches!(
                        (o, handle_type),
                        (Offer::Fd(_), HandleType::CudaVmmFd)
                            | (Offer::Fabric(_), HandleType::CudaVmmFabric)
                    )
                });
            let offer = match hit {
                Some(offer) => offer,
                None => {
                    if !missed {
                        missed = true;
                        self.withdraw_stale(&mut table);
                    }
                    let offer = self.export_segment(seg, handle_type)?;
                    if let Some(old) = table.insert(
                        seg.base,
                        Exported {
                            id: seg.id,
                            size: seg.size,
                            offer,
                        },
                    ) {
                        self.withdraw(&old.offer);
                    }
                    offer
                }
            };
            let mut handle = [0u8; PAYLOAD_LEN];
            match offer {
                Offer::Fd(id) => {
                    handle[..crate::fdpass::registry::FD_ID_LEN].copy_from_slice(&id.encode())
                }
                Offer::Fabric(bytes) => handle.copy_from_slice(&bytes),
            }
            segments.push(Segment {
                bytes: seg.size,
                id: seg.id,
                handle,
            });
        }
        Ok(ExportedHandle {
            handle_type,
            payload: [0; PAYLOAD_LEN],
            segments,
        })
    }

    fn export_segment(&self, seg: &LocalSegment, handle_type: HandleType) -> Result<Offer> {
        (self.rt.clock).time(DriverCall::Export, || self.export_once(seg, handle_type))
    }

    fn export_once(&self, seg: &LocalSegment, handle_type: HandleType) -> Result<Offer> {
        let clock = logging::clock(logging::CUDA, log::Level::Info);
        let handle = result::mem_retain_allocation_handle(seg.base).map_err(|rc| {
            driver::error(rc, &format!("cuMemRetainAllocationHandle({:#x})", seg.base))
        })?;
        let exported = if handle_type == HandleType::CudaVmmFd {
            result::mem_export_fd(handle)
                .map_err(|rc| {
                    driver::error(
                        rc,
                        &format!("cuMemExportToShareableHandle(POSIX fd) of {:#x}", seg.base),
                    )
                })
                .and_then(|fd| {
                    let fdpass = self.fdpass.as_ref().expect("checked by export");
                    fdpass.register(fd).map(Offer::Fd)
                })
        } else {
            result::mem_export_fabric(handle)
                .map(Offer::Fabric)
                .map_err(|rc| {
                    driver::error(
                        rc,
                        &format!(
                            "cuMemExportToShareableHandle(FABRIC) of {:#x}: the allocation allows \
                             only FABRIC handles, which need IMEX / the fabric manager on this \
                             node; allocate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
                            seg.base
                        ),
                    )
                })
        };
        // SAFETY: the retain above succeeded, so this drops exactly the reference it took; the
        // export (fd or fabric handle) holds its own.
        let _ = unsafe { result::mem_release(handle) };
        let offer = exported?;
        self.rt.segment_exports.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = clock {
            log::info!(
                target: logging::CUDA,
                "exported VMM segment {:#x} (+{}, id {}) as {} in {}",
                seg.base,
                seg.size,
                seg.id,
                handle_type.name(),
                logging::took(t.elapsed())
            );
        }
        Ok(offer)
    }

    /// Withdraws the offers of segments that are no longer mapped as they were exported.
    fn withdraw_stale(&self, table: &mut HashMap<u64, Exported>) {
        let stale: Vec<u64> = table
            .iter()
            .filter(|(base, e)| {
                memory::query(**base)
                    .and_then(|info| memory::classify(&info, 1))
                    .map_or(true, |now| now.base != **base || now.buffer_id != e.id)
            })
            .map(|(base, _)| *base)
            .collect();
        for base in stale {
            if let Some(e) = table.remove(&base) {
                self.withdraw(&e.offer);
            }
        }
    }

    fn withdraw(&self, offer: &Offer) {
        if let (Offer::Fd(id), Some(fdpass)) = (offer, &self.fdpass) {
            fdpass.unregister(id);
        }
    }
}

impl Drop for VmmExports {
    fn drop(&mut self) {
        let table = std::mem::take(self.table.get_mut().unwrap_or_else(|p| p.into_inner()));
        table.values().for_each(|e| self.withdraw(&e.offer));
    }
}

#[cfg(test)]
pub(crate) mod tests;
