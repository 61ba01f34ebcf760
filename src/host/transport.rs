//! [`Transport`] for host memory: buffers from the shared-memory allocator, exported by segment
//! name, imported by mapping the peer's segment once per (peer, segment) with a refcount.

use super::alloc;
use super::slab::HostSlab;
use crate::error::{Error, Result};
use crate::os::shm::ShmSegment;
use crate::transport::record::{from_fixed, to_fixed, HandleType, Record};
use crate::transport::{ExportedHandle, LocalBuffer, Mapping, MemKind, SemaphoreSlab, Transport};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

struct Imported {
    seg: ShmSegment,
    refs: usize,
}

/// The host transport. One per cache is typical; each owns its semaphore slab.
pub struct HostTransport {
    slab: HostSlab,
    /// Mapped peer segments keyed by (peer rank, exporter pid, buffer id).
    imports: Mutex<HashMap<(usize, u32, u64), Imported>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostTransport {
    /// Creates a transport whose slab is named after `job_id`.
    pub fn new(job_id: &str) -> Result<Arc<HostTransport>> {
        Ok(Arc::new(HostTransport {
            slab: HostSlab::new(job_id)?,
            imports: Mutex::new(HashMap::new()),
        }))
    }

    /// Number of peer semaphore slabs currently mapped.
    pub fn live_peer_slabs(&self) -> usize {
        self.slab.live_peer_slabs()
    }
}

impl Transport for HostTransport {
    fn kind(&self) -> MemKind {
        MemKind::Host
    }

    fn reclaim_dead(&self) {
        let removed = crate::os::cleanup::reclaim_dead();
        if removed > 0 {
            log::info!(
                target: crate::logging::HOST,
                "removed {removed} shared-memory segment(s) left in /dev/shm by processes that \
                 no longer exist"
            );
        }
    }

    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        if ptr == 0 {
            return Err(Error::invalid("host buffer pointer is NULL"));
        }
        if bytes == 0 {
            return Err(Error::invalid(format!(
                "host buffer {ptr:#x}: byte count is 0"
            )));
        }
        let (base, alloc_bytes, buffer_id) = alloc::locate(ptr, bytes)?;
        Ok(LocalBuffer {
            ptr,
            bytes,
            base,
            alloc_bytes,
            buffer_id,
            device_uuid: [0; 16],
        })
    }

    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle> {
        // Re-resolve so a buffer freed since `resolve` is reported instead of exported.
        let seg = alloc::lookup(buf.ptr, buf.bytes)?;
        if seg.base != buf.base || seg.id != buf.buffer_id {
            return Err(Error::invalid(format!(
                "host buffer {:#x} was freed and reallocated since it was resolved",
                buf.ptr
            )));
        }
        Ok(ExportedHandle {
            handle_type: HandleType::PosixShm,
            payload: to_fixed(&seg.name)?,
        })
    }

    fn import(&self, rec: &Record, _wait: Duration) -> Result<Mapping> {
        if rec.handle_type != HandleType::PosixShm {
            return Err(Error::invalid(format!(
                "the host transport cannot open a {} handle from rank {}",
                rec.handle_type.name(),
                rec.rank
            )));
        }
        let peer = rec.rank as usize;
        let key = (peer, rec.pid, rec.buffer_id);
        let mut imports = lock(&self.imports);
        let base = match imports.get_mut(&key) {
            Some(imp) => {
                imp.refs += 1;
                imp.seg.addr()
            }
            None => {
                let name = from_fixed(&rec.payload);
                let seg = ShmSegment::open(&name, rec.alloc_bytes)?.ok_or_else(|| {
                    Error::not_found(format!(
                        "host buffer {name} of rank {peer} no longer exists: it was freed \
                         before this rank opened it; keep buffers alive until both sides have \
                         exchanged handles"
                    ))
                })?;
                let base = seg.addr();
                imports.insert(key, Imported { seg, refs: 1 });
                base
            }
        };
        Ok(Mapping {
            peer,
            base,
            ptr: base + rec.offset,
            alloc_bytes: rec.alloc_bytes,
            buffer_id: rec.buffer_id,
        })
    }

    fn release(&self, m: &Mapping) -> Result<()> {
        let mut imports = lock(&self.imports);
        let key = imports
            .iter()
            .find(|(k, imp)| k.0 == m.peer && k.2 == m.buffer_id && imp.seg.addr() == m.base)
            .map(|(k, _)| *k)
            .ok_or_else(|| {
                Error::state(format!(
                    "mapping {:#x} of rank {} is not open (released twice?)",
                    m.base, m.peer
                ))
            })?;
        let imp = imports.get_mut(&key).expect("key found above");
        imp.refs -= 1;
        if imp.refs == 0 {
            imports.remove(&key);
        }
        Ok(())
    }

    fn semaphores(&self) -> &dyn SemaphoreSlab {
        &self.slab
    }

    fn live_mappings(&self) -> usize {
        lock(&self.imports).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::record::local_host;

    fn record_for(buf: &LocalBuffer, handle: &ExportedHandle, slab: &ExportedHandle) -> Record {
        Record {
            handle_type: handle.handle_type,
            flags: 0,
            offset: buf.offset(),
            bytes: buf.bytes,
            alloc_bytes: buf.alloc_bytes,
            buffer_id: buf.buffer_id,
            host_id: local_host().id,
            version: 1,
            device_uuid: [0; 16],
            pid: std::process::id(),
            rank: 3,
            host_name: [0; 32],
            payload: handle.payload,
            sem_type: slab.handle_type,
            sem_slot: 0,
            sem_payload: slab.payload,
        }
    }

    #[test]
    fn export_import_dedup_release() {
        let exporter = HostTransport::new("unit_tr").unwrap();
        let importer = HostTransport::new("unit_tr").unwrap();
        let buf = alloc::alloc_for_job("unit_tr", 4096).unwrap();
        buf.write(100, b"hello").unwrap();
        let local = exporter.resolve(buf.addr() + 100, 5).unwrap();
        assert_eq!(local.offset(), 100);
        let handle = exporter.export(&local).unwrap();
        let rec = record_for(&local, &handle, &exporter.semaphores().export().unwrap());
        let rec = Record::decode(&rec.encode()).unwrap();
        let m1 = importer.import(&rec, Duration::ZERO).unwrap();
        let m2 = importer.import(&rec, Duration::ZERO).unwrap();
        assert_eq!(m1, m2);
        assert_eq!(importer.live_mappings(), 1);
        let mut got = [0u8; 5];
        // SAFETY: m1.ptr maps 5 readable bytes of the exporter's buffer.
        unsafe { std::ptr::copy_nonoverlapping(m1.ptr as *const u8, got.as_mut_ptr(), 5) };
        assert_eq!(&got, b"hello");
        importer.release(&m1).unwrap();
        assert_eq!(importer.live_mappings(), 1);
        importer.release(&m2).unwrap();
        assert_eq!(importer.live_mappings(), 0);
        assert!(importer.release(&m2).is_err());
        drop(buf);
        let err = importer.import(&rec, Duration::ZERO).unwrap_err();
        assert!(err.message.contains("no longer exists"), "{err}");
    }

    #[test]
    fn resolve_rejects_bad_pointers() {
        let t = HostTransport::new("unit_tr").unwrap();
        assert!(t.resolve(0, 4).unwrap_err().message.contains("NULL"));
        let stack = 5u64;
        let err = t.resolve(&stack as *const u64 as u64, 8).unwrap_err();
        assert!(err.message.contains("not a shared-memory buffer"), "{err}");
        let buf = alloc::alloc_for_job("unit_tr", 64).unwrap();
        assert!(t.resolve(buf.addr(), 0).is_err());
        assert!(t.resolve(buf.addr(), 65).is_err());
        let addr = buf.addr();
        drop(buf);
        assert!(t.resolve(addr, 8).unwrap_err().message.contains("freed"));
    }
}
