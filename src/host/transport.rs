//! [`Transport`] for host memory: buffers from the host allocator, exported by offering their
//! file descriptor to peers through the fd transport (`crate::fdpass`), imported by fetching that
//! descriptor and mapping it, once per (peer, buffer) while a guard of it lives; the last guard
//! unmaps it at once (host memory has no device work to wait for).

use super::alloc::{self, FreeListener};
use super::{fd_handle, fd_id};
use crate::error::{Error, Result, Status};
use crate::fdpass::{FdId, FdPass, FdPassConfig};
use crate::os::memfd::SharedMapping;
use crate::os::mmap::{page_size, MappedRange};
use crate::store::Store;
use crate::sync::lock;
use crate::transport::peer_maps::PeerMaps;
use crate::transport::record::Record;
use crate::transport::view::{plan, round_up, ContiguousView, Extent, ViewMember};
use crate::transport::{
    ExportedHandle, LocalBuffer, MemKind, PeerMapping, RecordSeal, SemaphoreSlab, Transport,
};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The host transport: each owns its semaphore slab; those of one job and rank share one fd
/// responder.
pub struct HostTransport {
    fdpass: Arc<FdPass>,
    slab: SemaphoreSlab,
    /// Descriptors offered to peers, by buffer id; withdrawn when the buffer is freed.
    offered: Mutex<HashMap<u64, FdId>>,
    /// Mapped peer buffers keyed by (peer rank, exporter pid, buffer id).
    imports: PeerMaps<(usize, u32, u64)>,
}

impl HostTransport {
    /// A transport for `rank` of `job_id`, offering descriptors through the job's fd transport.
    pub fn new(store: Arc<dyn Store>, job_id: &str, rank: usize) -> Result<Arc<HostTransport>> {
        let config = FdPassConfig::from_env()?;
        Self::with_fdpass(FdPass::for_job(
            store,
            &crate::names::fdpass_prefix(job_id),
            &crate::names::job_tag(job_id),
            rank,
            config,
        ))
    }

    /// The fd transport this transport offers its buffers through.
    pub fn fdpass(&self) -> &Arc<FdPass> {
        &self.fdpass
    }

    /// A transport that shares descriptors through `fdpass`.
    pub fn with_fdpass(fdpass: Arc<FdPass>) -> Result<Arc<HostTransport>> {
        let slab = super::slab::new_slab(fdpass.job(), fdpass.clone())?;
        let transport = Arc::new(HostTransport {
            fdpass,
            slab,
            offered: Mutex::new(HashMap::new()),
            imports: PeerMaps::default(),
        });
        let listener: Weak<dyn FreeListener> = Arc::downgrade(&transport) as _;
        alloc::on_free(listener);
        Ok(transport)
    }
}

impl Drop for HostTransport {
    fn drop(&mut self) {
        // The fd transport may outlive this one: withdraw what this one offered.
        for (_, id) in lock(&self.offered).drain() {
            self.fdpass.unregister(&id);
        }
    }
}

impl FreeListener for HostTransport {
    fn freed(&self, id: u64) {
        // A freed buffer's memory is returned once no peer maps it: stop offering it.
        if let Some(fd_id) = lock(&self.offered).remove(&id) {
            self.fdpass.unregister(&fd_id);
        }
    }
}

impl Transport for HostTransport {
    fn kind(&self) -> MemKind {
        MemKind::Host
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
        let mut offered = lock(&self.offered);
        if let Some(id) = offered.get(&buf.buffer_id) {
            return Ok(fd_handle(id));
        }
        // Re-resolve so a buffer freed since `resolve` is reported instead of exported.
        let seg = alloc::lookup(buf.ptr, buf.bytes)?;
        if seg.base != buf.base || seg.id != buf.buffer_id {
            return Err(Error::invalid(format!(
                "host buffer {:#x} was freed and reallocated since it was resolved",
                buf.ptr
            )));
        }
        let id = self.fdpass.register(seg.fd)?;
        offered.insert(buf.buffer_id, id);
        drop(offered);
        // Freed between the lookup and the insertion: `freed` found nothing to withdraw.
        if alloc::locate(buf.base, 1).ok().map(|(_, _, live)| live) != Some(buf.buffer_id) {
            self.freed(buf.buffer_id);
            return Err(Error::invalid(format!(
                "host buffer {:#x} was freed while it was being exported",
                buf.ptr
            )));
        }
        Ok(fd_handle(&id))
    }

    fn import(&self, rec: &Record, wait: Duration) -> Result<PeerMapping> {
        let peer = rec.rank as usize;
        let key = (peer, rec.pid, rec.buffer_id);
        if let Some(mapped) = self.imports.get(&key, rec.offset) {
            return Ok(mapped);
        }
        let what = format!("host buffer {} of rank {peer}", rec.buffer_id);
        let id = fd_id(rec.handle_type, &rec.payload, &what)?;
        // The fd travels only from a live buffer: a freed one is "revoked".
        let fd = self.fdpass.fetch(peer, &id, wait).map_err(|e| {
            if e.status == Status::NotFound {
                Error::not_found(format!(
                    "{what} no longer exists: it was freed before this rank opened it; keep \
                     buffers alive until both sides have exchanged handles ({})",
                    e.message
                ))
            } else {
                e.context(format!("opening {what}"))
            }
        })?;
        crate::fdpass::vouch::file_owner(fd.as_fd(), self.fdpass.trusted(), &what)?;
        let mem = SharedMapping::map_peer(fd, rec.alloc_bytes, &what)?;
        let opened = PeerMapping::new(peer, mem.addr(), rec.alloc_bytes, rec.buffer_id, mem);
        Ok(self.imports.insert(key, opened.at(rec.offset)))
    }

    fn seal_record(&self, key: &str, record: &[u8]) -> Result<(Vec<u8>, RecordSeal)> {
        let (notice, sealed) = self.fdpass.seal_record(key, record)?;
        Ok((notice.to_vec(), Box::new(sealed)))
    }

    fn open_record(
        &self,
        peer: usize,
        key: &str,
        notice: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        self.fdpass.open_record(peer, key, notice, wait)
    }

    fn semaphores(&self) -> &SemaphoreSlab {
        &self.slab
    }

    fn live_mappings(&self) -> usize {
        self.imports.live()
    }

    fn contiguous_view(&self, members: &[ViewMember<'_>]) -> Result<ContiguousView> {
        let members: Vec<HostMember> = members
            .iter()
            .map(|m| self.view_member(m))
            .collect::<Result<_>>()?;
        map_view(&members)
    }
}

impl HostTransport {
    /// The file and place of one member's buffer (a peer's from its guard, which this transport
    /// opened).
    fn view_member(&self, member: &ViewMember<'_>) -> Result<HostMember> {
        match *member {
            ViewMember::Own { rank, buffer } => {
                let seg = alloc::lookup(buffer.ptr, buffer.bytes)?;
                Ok(HostMember {
                    rank,
                    fd: seg.fd,
                    offset: buffer.ptr - seg.base,
                    bytes: buffer.bytes,
                })
            }
            ViewMember::Peer {
                rank,
                record,
                mapping,
            } => {
                let what = || format!("host buffer {} of rank {rank}", record.buffer_id);
                let mem = mapping.memory::<SharedMapping>().ok_or_else(|| {
                    Error::invalid(format!("{} was not mapped by the host transport", what()))
                })?;
                let fd = mem
                    .fd()
                    .try_clone_to_owned()
                    .map_err(|e| Error::from_io(format!("duplicating the fd of {}", what()), &e))?;
                Ok(HostMember {
                    rank,
                    fd,
                    offset: record.offset,
                    bytes: record.bytes,
                })
            }
        }
    }
}

/// One member of a host view: its buffer's file and where the buffer lies in it.
struct HostMember {
    rank: usize,
    fd: OwnedFd,
    /// Offset of the buffer in its file.
    offset: u64,
    bytes: u64,
}

/// Maps the pages of each member's file that hold its buffer into one reserved range, the view's
/// backing.
fn map_view(members: &[HostMember]) -> Result<ContiguousView> {
    let page = page_size();
    let extents: Vec<Extent> = members
        .iter()
        .map(|m| {
            let lead = m.offset % page;
            let span = round_up(lead + m.bytes, page).ok_or_else(|| {
                Error::invalid(format!(
                    "rank {}'s host buffer of {} bytes is too large",
                    m.rank, m.bytes
                ))
            })?;
            Ok(Extent {
                rank: m.rank,
                bytes: m.bytes,
                lead,
                span,
            })
        })
        .collect::<Result<_>>()?;
    let layout = plan(&extents, page)?;
    let range = MappedRange::reserve(layout.reserved_bytes())?;
    for (i, (m, e)) in members.iter().zip(&extents).enumerate() {
        let what = format!("the host buffer of rank {}", m.rank);
        range.map_file(
            layout.slot(i),
            m.fd.as_fd(),
            m.offset - e.lead,
            e.span,
            &what,
        )?;
    }
    Ok(ContiguousView::new(range.addr(), layout, range))
}

#[cfg(test)]
mod tests;
