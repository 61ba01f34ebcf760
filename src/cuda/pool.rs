//! Buffers of stream-ordered memory pools (`cudaMallocFromPoolAsync`). The exporter offers the
//! pool once per transport as a POSIX fd (only pools created with POSIX fd handles, never the
//! device's default pool) and each allocation's `CUmemPoolPtrExportData` once per (base, buffer
//! id). The importer imports a peer's pool once per (exporter pid, pool, device) in this kind's
//! sub-table and each allocation once per (exporter pid, export data, device) in the import table;
//! the releaser frees an allocation, and a pool is destroyed with its last allocation.

use super::driver::{self, ContextGuard, CudaContext};
use super::imports::{Import, ImportKind, OpenOutcome};
use super::memory::{DeviceAllocation, DeviceMemoryKind};
use super::result::{self, POOL_PTR_EXPORT_LEN};
use super::Runtime;
use crate::error::{Error, Result};
use crate::fdpass::{FdId, FdPass};
use crate::sync::lock;
use crate::transport::record::{HandleType, Record, Segment, PAYLOAD_LEN};
use crate::transport::ExportedHandle;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The pool exports of one device transport.
pub struct PoolExports {
    fdpass: Option<Arc<FdPass>>,
    pools: Mutex<HashMap<u64, FdId>>,
    /// (buffer id, export data) by allocation base.
    pointers: Mutex<HashMap<u64, (u64, [u8; POOL_PTR_EXPORT_LEN])>>,
}

impl PoolExports {
    pub fn new(fdpass: Option<Arc<FdPass>>) -> PoolExports {
        PoolExports {
            fdpass,
            pools: Mutex::new(HashMap::new()),
            pointers: Mutex::new(HashMap::new()),
        }
    }

    /// The record handle of the pool allocation `alloc`.
    pub fn export(&self, alloc: &DeviceAllocation) -> Result<ExportedHandle> {
        let DeviceMemoryKind::Pool { pool } = alloc.kind else {
            return Err(Error::internal(format!(
                "pointer {:#x} is not pool memory",
                alloc.ptr
            )));
        };
        let fdpass = self.fdpass.as_ref().ok_or_else(|| {
            Error::unsupported(format!(
                "pool allocation at {:#x} can only be shared through the fd transport, which \
                 this transport lacks (use a handle cache, which brings one)",
                alloc.base
            ))
        })?;
        let pool_id = match lock(&self.pools).entry(pool) {
            Entry::Occupied(id) => *id.get(),
            Entry::Vacant(slot) => {
                let fd = result::mem_pool_export_fd(pool).map_err(|rc| {
                    Error::unsupported(format!(
                        "allocation at {:#x} (pointer {:#x}) comes from a stream-ordered memory \
                         pool that is not IPC-capable ({}): the device's default pool \
                         (cudaMallocAsync) never is; allocate from a pool created with \
                         cudaMemPoolCreate(handleTypes = cudaMemHandleTypePosixFileDescriptor), or \
                         with cudaMalloc (PyTorch: do not set \
                         PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)",
                        alloc.base,
                        alloc.ptr,
                        driver::describe(rc)
                    ))
                })?;
                *slot.insert(fdpass.register(fd)?)
            }
        };
        let data = {
            let mut pointers = lock(&self.pointers);
            match pointers.get(&alloc.base) {
                Some(&(id, data)) if id == alloc.buffer_id => data,
                _ => {
                    let data = result::mem_pool_export_pointer(alloc.base).map_err(|rc| {
                        driver::error(rc, &format!("cuMemPoolExportPointer({:#x})", alloc.base))
                    })?;
                    pointers.insert(alloc.base, (alloc.buffer_id, data));
                    data
                }
            }
        };
        let mut handle = [0u8; PAYLOAD_LEN];
        handle[..crate::fdpass::registry::FD_ID_LEN].copy_from_slice(&pool_id.encode());
        Ok(ExportedHandle {
            handle_type: HandleType::CudaPool,
            payload: data,
            segments: vec![Segment {
                bytes: 0,
                id: pool,
                handle,
            }],
        })
    }
}

impl Drop for PoolExports {
    fn drop(&mut self) {
        if let Some(fdpass) = &self.fdpass {
            let pools = self.pools.get_mut().unwrap_or_else(|p| p.into_inner());
            for (_, id) in pools.drain() {
                fdpass.unregister(&id);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PoolKey {
    pid: u32,
    device: i32,
    pool: u64,
}

struct ImportedPool {
    handle: u64,
    pointers: usize,
}

/// One imported allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PointerKey {
    pid: u32,
    device: i32,
    data: [u8; POOL_PTR_EXPORT_LEN],
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ImportedPointer {
    ptr: u64,
    pool: PoolKey,
    context: CudaContext,
}

/// The peer pools imported here (the pool kind's state in the import table).
#[derive(Default)]
pub(crate) struct Pools(HashMap<PoolKey, ImportedPool>);

/// Pool allocations in the import table, and how many were imported and freed so far.
#[derive(Default)]
pub(crate) struct Pool {
    pub imports: AtomicU64,
    pub frees: AtomicU64,
}

impl ImportKind for Pool {
    type Key = PointerKey;
    type Mapped = ImportedPointer;
    type Side = Pools;
    const THREAD: &'static str = "nvfipc-pool-free";
    const PENDING: &'static str = "imported pool allocation(s) were still waiting to be freed";

    fn at(&self, p: &ImportedPointer) -> (u64, Option<CudaContext>) {
        (p.ptr, Some(p.context))
    }

    fn close(&self, _peer: usize, p: &ImportedPointer) -> Result<()> {
        let _guard = ContextGuard::enter(p.context)?;
        // SAFETY: imported by `import`, left the import table with its last reference, not taken
        // back, and the work queued before the release has finished (drain step).
        let freed = unsafe { result::mem_free(p.ptr) }
            .map_err(|rc| driver::error(rc, &format!("cuMemFree of imported {:#x}", p.ptr)));
        self.frees.fetch_add(1, Ordering::Relaxed);
        freed
    }

    /// Drops the freed pointer's reference on its pool, destroying the pool with its last one.
    fn closed(&self, pools: &mut Pools, p: &ImportedPointer) {
        let Some(pool) = pools.0.get_mut(&p.pool) else {
            return;
        };
        pool.pointers = pool.pointers.saturating_sub(1);
        if pool.pointers == 0 {
            let pool = pools.0.remove(&p.pool).expect("present under the lock");
            // SAFETY: imported by `import`; its last imported pointer was just freed, and it is
            // destroyed once (it leaves the sub-table here).
            let _ = unsafe { result::mem_pool_destroy(pool.handle) };
        }
    }
}

/// A reference on an imported pool allocation (dropping it releases it).
pub(crate) type PoolImport = Import<Pool>;

/// Imports the pool allocation of `rec` (rank `peer`) on `device` (current when `None`).
pub(crate) fn import(
    rt: &Runtime,
    peer: usize,
    rec: &Record,
    fdpass: Option<&FdPass>,
    device: Option<i32>,
    wait: Duration,
) -> Result<PoolImport> {
    let (context, _guard) = driver::enter_device(device)?;
    let device = context.device()?;
    let who = format!("rank {peer} (pid {})", rec.pid);
    let seg = rec
        .segments
        .first()
        .ok_or_else(|| Error::protocol(format!("pool record of {who} names no pool")))?;
    let key = PointerKey {
        pid: rec.pid,
        device,
        data: rec.payload,
    };
    let pool_key = PoolKey {
        pid: rec.pid,
        device,
        pool: seg.id,
    };
    rt.pool.acquire(
        key,
        peer,
        wait,
        || format!("a pool allocation of {who}"),
        |tables| {
            let pools = &mut tables.side.0;
            let ptr = open_pointer(pools, peer, rec, seg, pool_key, fdpass, wait, &who)?;
            rt.pool.kind().imports.fetch_add(1, Ordering::Relaxed);
            Ok(OpenOutcome::Mapped(ImportedPointer {
                ptr,
                pool: pool_key,
                context,
            }))
        },
    )
}

/// Imports the allocation of `rec` (and its pool first when needed), the context current.
#[allow(clippy::too_many_arguments)]
fn open_pointer(
    pools: &mut HashMap<PoolKey, ImportedPool>,
    peer: usize,
    rec: &Record,
    seg: &Segment,
    pool_key: PoolKey,
    fdpass: Option<&FdPass>,
    wait: Duration,
    who: &str,
) -> Result<u64> {
    let device = pool_key.device;
    if let Entry::Vacant(slot) = pools.entry(pool_key) {
        let fdpass = fdpass.ok_or_else(|| {
            Error::unsupported(format!(
                "a pool buffer of {who} is shared through the fd transport, which this transport \
                 lacks"
            ))
        })?;
        let id = FdId::decode(&seg.handle[..crate::fdpass::registry::FD_ID_LEN])
            .ok_or_else(|| Error::protocol(format!("the pool record of {who} holds no fd id")))?;
        let fd = fdpass
            .fetch(peer, &id, wait)
            .map_err(|e| e.context(format!("fetching the memory pool of {who}")))?;
        let handle = result::mem_pool_import_fd(fd.as_fd()).map_err(|rc| {
            driver::error(
                rc,
                &format!("cuMemPoolImportFromShareableHandle of {who}'s pool"),
            )
        })?;
        // Another device than the pool's needs access (a refusal to set it again is only logged).
        if let Err(rc) = result::mem_pool_set_access_rw(handle, device) {
            log::debug!(
                target: crate::logging::CUDA,
                "cuMemPoolSetAccess on {who}'s imported pool for device {device}: {}",
                driver::describe(rc)
            );
        }
        slot.insert(ImportedPool {
            handle,
            pointers: 0,
        });
    }
    let pool = pools.get_mut(&pool_key).expect("inserted above");
    let ptr = result::mem_pool_import_pointer(pool.handle, &rec.payload).map_err(|rc| {
        driver::error(
            rc,
            &format!(
                "cuMemPoolImportPointer of {who}'s allocation (freed by the exporter, or not of \
                 this pool?)"
            ),
        )
    });
    let ptr = match ptr {
        Ok(ptr) => ptr,
        Err(e) => {
            if pool.pointers == 0 {
                let pool = pools.remove(&pool_key).expect("present");
                // SAFETY: imported above or earlier, and no pointer of it is imported.
                let _ = unsafe { result::mem_pool_destroy(pool.handle) };
            }
            return Err(e);
        }
    };
    pool.pointers += 1;
    Ok(ptr)
}
