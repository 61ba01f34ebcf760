//! Importing peers' VMM buffers: the importer's half of [`super::vmm`]. Each segment (physical
//! allocation) not imported yet is fetched (all of a record's missing fds in one request) and
//! imported once per (exporter pid, segment id, device) in this kind's sub-table; the run of
//! segments is mapped back to back into one reserved VA range (a partial `cuMemMap` is not
//! supported), once per (exporter pid, device, segment list), and a buffer over segments that a
//! mapped run holds is served by that mapping. The releaser unmaps a run and frees its range; a
//! segment is released when no run maps it.

use super::clock::DriverCall;
use super::driver::{self, ContextGuard, CudaContext};
use super::imports::{Import, ImportKind, OpenOutcome, Tables};
use super::{result, Runtime};
use crate::error::{Error, Result};
use crate::fdpass::{FdId, FdPass};
use crate::hash::fnv1a64;
use crate::logging;
use crate::transport::record::{HandleType, Record, Segment};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One imported physical allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SegmentKey {
    pid: u32,
    device: i32,
    id: u64,
}

struct ImportedSegment {
    handle: sys::CUmemGenericAllocationHandle,
    /// Runs that map it.
    runs: usize,
}

/// One mapped run of segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RunKey {
    pid: u32,
    device: i32,
    ids_hash: u64,
    count: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct MappedRun {
    base: u64,
    size: u64,
    context: CudaContext,
    segments: Vec<(SegmentKey, u64)>,
}

/// The peer physical allocations imported here (the VMM kind's state in the import table).
#[derive(Default)]
pub(crate) struct Segments(HashMap<SegmentKey, ImportedSegment>);

impl Segments {
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// VMM runs in the import table (see the module docs), and their [`super::VmmCounters`].
#[derive(Default)]
pub(crate) struct Vmm {
    pub segment_imports: AtomicU64,
    pub segment_releases: AtomicU64,
    pub maps: AtomicU64,
    pub unmaps: AtomicU64,
    pub inside_mapped: AtomicU64,
}

impl ImportKind for Vmm {
    type Key = RunKey;
    type Mapped = MappedRun;
    type Side = Segments;
    const THREAD: &'static str = "nvfipc-vmm-unmap";
    const PENDING: &'static str = "VMM mapping(s) were still waiting to be unmapped";

    fn at(&self, run: &MappedRun) -> (u64, Option<CudaContext>) {
        (run.base, Some(run.context))
    }

    fn close(&self, _peer: usize, run: &MappedRun) -> Result<()> {
        let _guard = ContextGuard::enter(run.context)?;
        // SAFETY: the run left the import table when its last reference went away and the
        // releaser runs this only for a job that was not taken back; the work queued before the
        // release has finished (the drain step synchronised the context).
        unsafe { result::mem_unmap(run.base, run.size) }.map_err(|rc| {
            driver::error(rc, &format!("cuMemUnmap({:#x}, {})", run.base, run.size))
        })?;
        // SAFETY: reserved by map_run for this run, now fully unmapped, freed once.
        let _ = unsafe { result::mem_address_free(run.base, run.size) };
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the unmapped run's references on its segments, releasing those no run maps.
    fn closed(&self, segments: &mut Segments, run: &MappedRun) {
        for (k, _) in &run.segments {
            let Some(s) = segments.0.get_mut(k) else {
                continue;
            };
            s.runs = s.runs.saturating_sub(1);
            if s.runs == 0 {
                let s = segments.0.remove(k).expect("present under the lock");
                // SAFETY: imported by this module and released once (it leaves the sub-table here);
                // the last run that mapped it is unmapped. Should that unmap have failed, releasing
                // is still allowed: the driver frees the memory once its last mapping is gone.
                let _ = unsafe { result::mem_release(s.handle) };
                self.segment_releases.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A reference on a mapped peer run (dropping it releases it).
pub(crate) type VmmImport = Import<Vmm>;

/// The key of the run a record describes, mapped on `device`.
pub(crate) fn run_key(rec: &Record, device: i32) -> RunKey {
    let bytes: Vec<u8> = rec
        .segments
        .iter()
        .flat_map(|s| s.id.to_le_bytes())
        .collect();
    RunKey {
        pid: rec.pid,
        device,
        ids_hash: fnv1a64(&bytes),
        count: rec.segments.len() as u32,
    }
}

/// Maps the VMM buffer of `rec` (from rank `peer`) on `device` (current when `None`), fetching
/// missing fds through `fdpass`.
pub(crate) fn import(
    rt: &Runtime,
    peer: usize,
    rec: &Record,
    fdpass: Option<&FdPass>,
    device: Option<i32>,
    wait: Duration,
) -> Result<VmmImport> {
    let (context, _guard) = driver::enter_device(device)?;
    let device = context.device()?;
    let key = run_key(rec, device);
    let who = format!("rank {peer} (pid {})", rec.pid);
    rt.vmm.acquire(
        key,
        peer,
        wait,
        || format!("a VMM buffer of {who}"),
        |tables| {
            let vmm = rt.vmm.kind();
            open_run(vmm, tables, peer, rec, fdpass, context, device, wait, &who)
        },
    )
}

/// Opens the run of `rec` (not mapped yet) on `device`, with `context` current.
#[allow(clippy::too_many_arguments)]
fn open_run(
    vmm: &Vmm,
    tables: &mut Tables<Vmm>,
    peer: usize,
    rec: &Record,
    fdpass: Option<&FdPass>,
    context: CudaContext,
    device: i32,
    wait: Duration,
    who: &str,
) -> Result<OpenOutcome<RunKey, MappedRun>> {
    // A tensor inside a larger buffer imported before is served by that run's mapping.
    if let Some((outer, offset)) = containing_run(tables, rec, device) {
        vmm.inside_mapped.fetch_add(1, Ordering::Relaxed);
        return Ok(OpenOutcome::Within { key: outer, offset });
    }
    // The lock is held across the fetch (one round trip): two caches never import one segment.
    let seg_key = |s: &Segment| SegmentKey {
        pid: rec.pid,
        device,
        id: s.id,
    };
    let segs = &mut tables.side.0;
    let missing: Vec<&Segment> = {
        let mut seen = std::collections::HashSet::new();
        rec.segments
            .iter()
            .filter(|s| !segs.contains_key(&seg_key(s)) && seen.insert(s.id))
            .collect()
    };
    let imported = import_segments(peer, rec, &missing, fdpass, wait, who)?;
    vmm.segment_imports
        .fetch_add(imported.len() as u64, Ordering::Relaxed);
    for (seg, handle) in missing.iter().zip(imported) {
        segs.insert(seg_key(seg), ImportedSegment { handle, runs: 0 });
    }
    let segments: Vec<(SegmentKey, u64)> =
        rec.segments.iter().map(|s| (seg_key(s), s.bytes)).collect();
    let handles: Vec<(sys::CUmemGenericAllocationHandle, u64)> = segments
        .iter()
        .map(|(k, size)| (segs[k].handle, *size))
        .collect();
    let (base, size) = map_run(&handles, device).map_err(|e| {
        release_unused_segments(vmm, segs);
        e.context(format!("mapping the VMM buffer of {who}"))
    })?;
    for (k, _) in &segments {
        if let Some(s) = segs.get_mut(k) {
            s.runs += 1;
        }
    }
    vmm.maps.fetch_add(1, Ordering::Relaxed);
    Ok(OpenOutcome::Mapped(MappedRun {
        base,
        size,
        context,
        segments,
    }))
}

/// A mapped run of `rec`'s exporter on `device` whose segments contain `rec`'s back to back, and
/// the offset of `rec`'s first segment in it.
fn containing_run(tables: &Tables<Vmm>, rec: &Record, device: i32) -> Option<(RunKey, u64)> {
    let wanted: Vec<u64> = rec.segments.iter().map(|s| s.id).collect();
    tables.entries().find_map(|(key, run)| {
        if key.pid != rec.pid || key.device != device || run.segments.len() < wanted.len() {
            return None;
        }
        let held: Vec<(u64, u64)> = run.segments.iter().map(|(k, s)| (k.id, *s)).collect();
        offset_within(&held, &wanted).map(|at| (*key, at))
    })
}

/// Where the segments `wanted` (ids) lie back to back inside `held` (id, size), as the byte
/// offset of the first one.
fn offset_within(held: &[(u64, u64)], wanted: &[u64]) -> Option<u64> {
    if wanted.is_empty() || held.len() < wanted.len() {
        return None;
    }
    let start = held
        .windows(wanted.len())
        .position(|w| w.iter().map(|(id, _)| id).eq(wanted.iter()))?;
    Some(held[..start].iter().map(|(_, size)| size).sum())
}

/// Fetches and imports `missing` segments of `rec`; nothing is left imported on failure.
fn import_segments(
    peer: usize,
    rec: &Record,
    missing: &[&Segment],
    fdpass: Option<&FdPass>,
    wait: Duration,
    who: &str,
) -> Result<Vec<sys::CUmemGenericAllocationHandle>> {
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let clock = logging::clock(logging::CUDA, log::Level::Info);
    let mut handles = Vec::with_capacity(missing.len());
    let mut import = |got: result::DriverResult<_>, how: &str, hint: &str| {
        got.map(|h| handles.push(h)).map_err(|rc| {
            let call = format!("cuMemImportFromShareableHandle({how}) of a segment of {who}{hint}");
            driver::error(rc, &call)
        })
    };
    let outcome = match rec.handle_type {
        HandleType::CudaVmmFd => {
            let fdpass = fdpass.ok_or_else(|| {
                Error::unsupported(format!(
                    "a VMM buffer of {who} is shared as POSIX fds, and this transport has no fd \
                     transport (use a handle cache, which brings one)"
                ))
            })?;
            let ids: Vec<FdId> = missing
                .iter()
                .map(|s| {
                    FdId::decode(&s.handle[..crate::fdpass::registry::FD_ID_LEN]).ok_or_else(|| {
                        Error::protocol(format!("a VMM segment record of {who} holds no fd id"))
                    })
                })
                .collect::<Result<_>>()?;
            let clock = &super::runtime().clock;
            let fds = clock
                .time(DriverCall::FdPass, || fdpass.fetch_many(peer, &ids, wait))
                .map_err(|e| e.context(format!("fetching the fds of a VMM buffer of {who}")))?;
            fds.iter().try_for_each(|fd| {
                let got = clock.time(DriverCall::Import, || result::mem_import_fd(fd.as_fd()));
                import(got, "POSIX fd", "")
            })
        }
        HandleType::CudaVmmFabric => missing.iter().try_for_each(|s| {
            let hint = " (FABRIC needs IMEX / the fabric manager on both sides)";
            import(result::mem_import_fabric(&s.handle), "FABRIC", hint)
        }),
        other => Err(Error::invalid(format!(
            "record of {who} holds a {} handle, not a VMM one",
            other.name()
        ))),
    };
    if let Err(e) = outcome {
        for h in handles {
            // SAFETY: imported above and not mapped or recorded anywhere.
            let _ = unsafe { result::mem_release(h) };
        }
        return Err(e);
    }
    if let Some(t) = clock {
        log::info!(
            target: logging::CUDA,
            "imported {} VMM segment(s) of {who} in {}",
            handles.len(),
            logging::took(t.elapsed())
        );
    }
    Ok(handles)
}

/// Reserves one VA range for `handles` (segment handle, size), maps them back to back and
/// grants `device` access; undoes everything on failure.
fn map_run(
    handles: &[(sys::CUmemGenericAllocationHandle, u64)],
    device: i32,
) -> Result<(u64, u64)> {
    let size: u64 = handles.iter().map(|(_, s)| s).sum();
    let clock = &super::runtime().clock;
    let base = (clock.time(DriverCall::Reserve, || result::mem_address_reserve(size, 0)))
        .map_err(|rc| driver::error(rc, &format!("cuMemAddressReserve({size})")))?;
    let mut mapped = 0u64;
    // SAFETY: [base, base + size) was reserved above and nothing is mapped in it yet.
    if let Err(e) = unsafe { map_back_to_back(base, handles, device, &mut mapped) } {
        // SAFETY: [base, base + mapped) was mapped above and nothing has used it yet; the
        // range was reserved above and is freed once.
        unsafe {
            if mapped > 0 {
                let _ = result::mem_unmap(base, mapped);
            }
            let _ = result::mem_address_free(base, size);
        }
        return Err(e);
    }
    Ok((base, size))
}

/// Maps `handles` (segment handle, size) back to back at `at` and grants `device` access to all
/// of them; `mapped` counts the bytes mapped from `at`, for the caller to undo on failure.
///
/// # Safety
/// `[at, at + their total size)` lies in a range reserved by this process, with nothing mapped.
pub(crate) unsafe fn map_back_to_back(
    at: u64,
    handles: &[(sys::CUmemGenericAllocationHandle, u64)],
    device: i32,
    mapped: &mut u64,
) -> Result<()> {
    let clock = &super::runtime().clock;
    for &(handle, size) in handles {
        let here = at + *mapped;
        // SAFETY: [here, here + size) lies in the caller's reserved range, where nothing is
        // mapped yet (segments are mapped in order, back to back).
        let mapped_here = || unsafe { result::mem_map(here, size, handle) };
        (clock.time(DriverCall::Map, mapped_here))
            .map_err(|rc| driver::error(rc, &format!("cuMemMap({here:#x}, {size})")))?;
        *mapped += size;
    }
    let granted = || result::mem_set_access_rw(at, *mapped, device);
    (clock.time(DriverCall::SetAccess, granted)).map_err(|rc| {
        driver::error(
            rc,
            &format!("cuMemSetAccess({at:#x}, {mapped}) for device {device}"),
        )
    })
}

/// Releases imported segments that no run maps (after a failed map).
fn release_unused_segments(vmm: &Vmm, segments: &mut HashMap<SegmentKey, ImportedSegment>) {
    let unused: Vec<SegmentKey> = segments
        .iter()
        .filter(|(_, s)| s.runs == 0)
        .map(|(k, _)| *k)
        .collect();
    for k in unused {
        if let Some(s) = segments.remove(&k) {
            // SAFETY: the handle was imported by this module and no run maps it.
            let _ = unsafe { result::mem_release(s.handle) };
            vmm.segment_releases.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `f` with a lookup of the segments imported here by (exporter pid, device, id), under the
/// import table's lock, so a handle it returns stays valid until `f` returns (for views).
pub(crate) fn with_imported_segments<R>(
    f: impl FnOnce(&dyn Fn(u32, i32, u64) -> Option<sys::CUmemGenericAllocationHandle>) -> R,
) -> R {
    super::runtime().vmm.inspect(|t, _| {
        let lookup = |pid: u32, device: i32, id: u64| {
            t.side
                .0
                .get(&SegmentKey { pid, device, id })
                .map(|s| s.handle)
        };
        f(&lookup)
    })
}

#[cfg(test)]
mod tests;
