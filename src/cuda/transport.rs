//! [`Transport`] for device memory: legacy CUDA IPC export/import of `cudaMalloc` allocations
//! plus the device semaphore slab.
//!
//! Imports are refcounted per (peer, exporter buffer id); the driver-level open/close is further
//! deduplicated process-wide by [`ipc`], so a peer allocation is opened once however many
//! channels use it, and a new buffer carved from an allocation that is already mapped (PyTorch's
//! caching allocator) costs no driver call. Releases never wait for device work: the last one of
//! a mapping hands it to the releaser thread ([`super::release`]). Dropping the transport closes whatever is still imported and then frees the
//! semaphore slab; the handle cache drops it only after its teardown has waited for its peers to
//! close (see [`super::semaphore`]).

use super::driver;
use super::ipc::{self, HandleBytes};
use super::memory;
use super::semaphore::DeviceSemaphoreSlab;
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::record::{HandleType, Record};
use crate::transport::{ExportedHandle, LocalBuffer, Mapping, MemKind, SemaphoreSlab, Transport};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Imported {
    handle: HandleBytes,
    device: i32,
    base: u64,
    refs: usize,
}

/// The device transport (see the module docs).
pub struct CudaTransport {
    device: Option<i32>,
    slab: DeviceSemaphoreSlab,
    /// Peer allocations imported through this transport: (peer, exporter buffer id) -> mapping.
    imports: Mutex<HashMap<(usize, u64), Imported>>,
}

static UUIDS: Lazy<Mutex<HashMap<i32, [u8; 16]>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// The UUID of device `ordinal`, queried once per device.
pub fn cached_device_uuid(ordinal: i32) -> Result<[u8; 16]> {
    if let Some(uuid) = lock(&UUIDS).get(&ordinal) {
        return Ok(*uuid);
    }
    let uuid = driver::device_uuid(ordinal)?;
    lock(&UUIDS).insert(ordinal, uuid);
    Ok(uuid)
}

impl CudaTransport {
    /// A transport working on `device`, or on the device current at each call (`None`, the usual
    /// case under nvFuser, which selects the device itself). Fails with `CudaUnavailable` when
    /// there is no usable driver.
    pub fn new(device: Option<i32>) -> Result<Arc<CudaTransport>> {
        driver::driver()?;
        Ok(Arc::new(CudaTransport {
            device,
            slab: DeviceSemaphoreSlab::new(device),
            imports: Mutex::new(HashMap::new()),
        }))
    }
}

impl Transport for CudaTransport {
    fn kind(&self) -> MemKind {
        MemKind::Device
    }

    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        let alloc = memory::resolve(ptr, bytes)?;
        Ok(LocalBuffer {
            ptr,
            bytes,
            base: alloc.base,
            alloc_bytes: alloc.size,
            buffer_id: alloc.buffer_id,
            device_uuid: cached_device_uuid(alloc.device_ordinal)?,
        })
    }

    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle> {
        let payload = ipc::export(buf.base, buf.buffer_id)
            .map_err(|e| e.context(format!("exporting device buffer {:#x}", buf.ptr)))?;
        Ok(ExportedHandle {
            handle_type: HandleType::CudaLegacyIpc,
            payload,
        })
    }

    fn import(&self, rec: &Record, wait: Duration) -> Result<Mapping> {
        if rec.handle_type != HandleType::CudaLegacyIpc {
            return Err(Error::invalid(format!(
                "record of rank {} holds a {} handle; the device transport only opens CUDA IPC \
                 handles",
                rec.rank,
                rec.handle_type.name()
            )));
        }
        let peer = rec.rank as usize;
        let mut imports = lock(&self.imports);
        let key = (peer, rec.buffer_id);
        if let Some(entry) = imports.get(&key) {
            if entry.handle != rec.payload {
                return Err(Error::state(format!(
                    "rank {peer} (pid {}) re-used buffer id {} with a different IPC handle while \
                     the old mapping is still in use; release the old mapping first",
                    rec.pid, rec.buffer_id
                )));
            }
        }
        let opened =
            ipc::open(peer, Some(rec.pid), &rec.payload, self.device, wait).map_err(|e| {
                e.context(format!(
                    "importing buffer {} of rank {peer} (pid {}, host {})",
                    rec.buffer_id,
                    rec.pid,
                    rec.host_name()
                ))
            })?;
        let entry = imports.entry(key).or_insert(Imported {
            handle: rec.payload,
            device: opened.device,
            base: opened.base,
            refs: 0,
        });
        entry.refs += 1;
        Ok(Mapping {
            peer,
            base: opened.base,
            ptr: opened.base + rec.offset,
            alloc_bytes: rec.alloc_bytes,
            buffer_id: rec.buffer_id,
        })
    }

    fn release(&self, mapping: &Mapping) -> Result<()> {
        let mut imports = lock(&self.imports);
        let key = (mapping.peer, mapping.buffer_id);
        let entry = imports.get_mut(&key).ok_or_else(|| {
            Error::not_found(format!(
                "buffer {} of rank {} is not imported by this transport (released twice?)",
                mapping.buffer_id, mapping.peer
            ))
        })?;
        if entry.base != mapping.base {
            return Err(Error::invalid(format!(
                "mapping of buffer {} of rank {} has base {:#x}, but it is mapped at {:#x}",
                mapping.buffer_id, mapping.peer, mapping.base, entry.base
            )));
        }
        let (handle, device) = (entry.handle, entry.device);
        entry.refs -= 1;
        if entry.refs == 0 {
            imports.remove(&key);
        }
        ipc::release(mapping.peer, &handle, device)
    }

    fn wait_release_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        ipc::wait_release_room(peer, timeout)
    }

    fn flush_releases(&self, timeout: Duration) -> Result<()> {
        ipc::flush_releases(timeout)
    }

    fn semaphores(&self) -> &dyn SemaphoreSlab {
        &self.slab
    }

    fn live_mappings(&self) -> usize {
        lock(&self.imports).len()
    }
}

impl Drop for CudaTransport {
    fn drop(&mut self) {
        // Release what the owner did not (closed on the releaser thread); the slab frees itself
        // afterwards (field order).
        let imports = self.imports.get_mut().unwrap_or_else(|p| p.into_inner());
        for ((peer, _), entry) in imports.drain() {
            for _ in 0..entry.refs {
                let _ = ipc::release(peer, &entry.handle, entry.device);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;
    use crate::transport::record::{flags, local_host, to_fixed};

    #[test]
    fn without_driver_the_transport_is_unavailable() {
        if driver::is_available() {
            return;
        }
        let err = CudaTransport::new(None).err().expect("no driver here");
        assert_eq!(err.status, Status::CudaUnavailable);
        assert!(err.message.contains("libcuda.so.1"), "{err}");
    }

    #[test]
    fn host_records_are_refused() {
        let transport = CudaTransport {
            device: None,
            slab: DeviceSemaphoreSlab::new(None),
            imports: Mutex::new(HashMap::new()),
        };
        let host = local_host();
        let rec = Record {
            handle_type: HandleType::PosixFd,
            flags: 0,
            offset: 0,
            bytes: 16,
            alloc_bytes: 4096,
            buffer_id: 1,
            host_id: host.id,
            version: 1,
            device_uuid: [0; 16],
            pid: 1,
            rank: 1,
            host_name: to_fixed(&host.name).unwrap(),
            payload: to_fixed("/seg").unwrap(),
            sem_type: HandleType::PosixFd,
            sem_slot: 0,
            sem_payload: to_fixed("/sem").unwrap(),
        };
        assert_eq!(rec.flags & flags::DEVICE, 0);
        let err = transport.import(&rec, Duration::ZERO).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument);
        let mapping = Mapping {
            peer: 1,
            base: 0x1000,
            ptr: 0x1000,
            alloc_bytes: 16,
            buffer_id: 9,
        };
        assert_eq!(
            transport.release(&mapping).unwrap_err().status,
            Status::NotFound
        );
        assert_eq!(transport.live_mappings(), 0);
        assert_eq!(transport.kind(), MemKind::Device);
    }
}
