//! The baselines the benchmarks compare against, over the same store and transports:
//!
//! - [`TorchStyleBarrier`]: PyTorch's store-based barrier (`_store_based_barrier`): ADD key 1,
//!   ADD key 0, the rank that sees the full count sets `key:last_worker`, everyone WAITs on it;
//! - [`SeedExchange`]: the upstream seed protocol of nvFuser's `ipc_handle.cpp`: per missed comm
//!   SET `dst,src,exporter` = record, a world barrier, CHECK + GET + DELETE of the peer's key and
//!   the import, and a second world barrier, which runs on cache hits too.
//!
//! The seed's cache compares buffers by value and deadlocks when only one side misses; here the
//! caller says which comms miss (both sides derive it from the same schedule), so the baseline
//! runs every scenario and only the protocol differs from ours.

use nvfuser_ipc::store::Store;
use nvfuser_ipc::tools::exchange::{flags, local_host, record, Record};
use nvfuser_ipc::tools::exchange::{LocalBuffer, PeerMapping, Transport};
use nvfuser_ipc::{Direction, MemKind, Request};
use nvfuser_ipc::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// PyTorch's store-based barrier, one generation per call (keys are never reused).
pub struct TorchStyleBarrier {
    prefix: String,
    world: usize,
    generation: u64,
    timeout: Duration,
}

impl TorchStyleBarrier {
    pub fn new(prefix: impl Into<String>, world: usize, timeout: Duration) -> Self {
        TorchStyleBarrier {
            prefix: prefix.into(),
            world,
            generation: 0,
            timeout,
        }
    }

    pub fn wait(&mut self, store: &dyn Store) -> Result<()> {
        let key = format!("{}/{}", self.prefix, self.generation);
        self.generation += 1;
        store.add(&key, 1)?;
        let count = store.add(&key, 0)?;
        let last = format!("{key}:last_worker");
        if count == self.world as i64 {
            store.set(&last, b"1")?;
        }
        store
            .wait(&[&last], self.timeout)
            .map_err(|e| e.context(format!("torch-style barrier {key} ({count} arrived)")))
    }
}

/// The record of `local` as the exchange would publish it (same layout and validation).
pub fn make_record(
    transport: &dyn Transport,
    local: &LocalBuffer,
    rank: usize,
    version: u64,
    slot: u32,
) -> Result<Record> {
    let handle = transport.export(local)?;
    let slab = transport.semaphores().export()?;
    let host = local_host();
    Ok(Record {
        handle_type: handle.handle_type,
        flags: if transport.kind() == MemKind::Device {
            flags::DEVICE
        } else {
            0
        },
        offset: local.offset(),
        bytes: local.bytes,
        alloc_bytes: local.alloc_bytes,
        buffer_id: local.buffer_id,
        host_id: host.id,
        version,
        device_uuid: local.device_uuid,
        pid: std::process::id(),
        rank: rank as u32,
        host_name: record::to_fixed(&host.name).unwrap_or([0; record::HOST_NAME_LEN]),
        payload: handle.payload,
        sem_type: slab.handle_type,
        sem_slot: slot,
        sem_payload: slab.payload,
        segments: handle.segments,
    })
}

/// Imports the peer side of a record: the buffer mapping, and the peer's semaphore slab once
/// per peer (as the exchange does), held until the importer is dropped.
pub struct Importer {
    transport: Arc<dyn Transport>,
    slabs: HashMap<usize, PeerMapping>,
    /// Bound of an import's wait for a previous mapping still being closed.
    wait: Duration,
}

impl Importer {
    pub fn new(transport: Arc<dyn Transport>) -> Importer {
        Importer {
            transport,
            slabs: HashMap::new(),
            wait: Duration::from_secs(60),
        }
    }

    /// The peer's buffer; dropping the guard releases it.
    pub fn import(&mut self, peer: usize, bytes: &[u8]) -> Result<PeerMapping> {
        let rec = Record::decode(bytes)?;
        let mapping = self.transport.import(&rec, self.wait)?;
        if let std::collections::hash_map::Entry::Vacant(slot) = self.slabs.entry(peer) {
            let handle =
                nvfuser_ipc::tools::exchange::ExportedHandle::plain(rec.sem_type, rec.sem_payload);
            slot.insert(
                self.transport
                    .semaphores()
                    .import_peer(peer, &handle, self.wait)?,
            );
        }
        Ok(mapping)
    }
}

/// The seed protocol's store key: `dst`, `src` and the exporting rank.
pub fn seed_key(dst: usize, src: usize, exporter: usize) -> String {
    format!("nvfuser_ipc_handle_info_P2PComm_dst={dst}_src={src}_rank={exporter}")
}

/// The upstream seed exchange over our store and transport.
pub struct SeedExchange {
    rank: usize,
    store: Arc<dyn Store>,
    transport: Arc<dyn Transport>,
    importer: Importer,
    barrier: TorchStyleBarrier,
    slot: u32,
    version: u64,
    /// Mapping of the peer buffer per (peer, direction, tag).
    mapped: HashMap<(usize, Direction, String), PeerMapping>,
    /// Replaced mappings kept until the end instead of released (see `keep_replaced`).
    kept: Vec<PeerMapping>,
    keep: bool,
    timeout: Duration,
}

impl SeedExchange {
    pub fn new(
        rank: usize,
        world: usize,
        store: Arc<dyn Store>,
        transport: Arc<dyn Transport>,
        barrier_prefix: &str,
        timeout: Duration,
    ) -> Result<SeedExchange> {
        let slot = transport.semaphores().allocate_slot()?;
        Ok(SeedExchange {
            rank,
            store,
            importer: Importer::new(transport.clone()),
            transport,
            barrier: TorchStyleBarrier::new(barrier_prefix, world, timeout),
            slot,
            version: 0,
            mapped: HashMap::new(),
            kept: Vec::new(),
            keep: false,
            timeout,
        })
    }

    /// Keeps replaced mappings until the exchange is dropped, as upstream's cache keeps every
    /// handle until it is destroyed (so re-importing a mapped allocation costs no open).
    pub fn keep_replaced(&mut self, keep: bool) {
        self.keep = keep;
    }

    fn key_of(&self, req: &Request, exporter: usize) -> String {
        let (src, dst) = match req.direction {
            Direction::Send => (self.rank, req.peer),
            Direction::Recv => (req.peer, self.rank),
        };
        seed_key(dst, src, exporter)
    }

    /// One `exchangeHandles` call; `miss[i]` says whether request `i` misses the cache.
    pub fn exchange(&mut self, requests: &[Request], miss: &[bool]) -> Result<()> {
        if requests.len() != miss.len() {
            return Err(Error::invalid("one miss flag per request is needed"));
        }
        for req in requests
            .iter()
            .zip(miss)
            .filter(|(_, &m)| m)
            .map(|(r, _)| r)
        {
            let local = self.transport.resolve(req.ptr, req.bytes)?;
            self.version += 1;
            let rec = make_record(&*self.transport, &local, self.rank, self.version, self.slot)?;
            self.store
                .set(&self.key_of(req, self.rank), &rec.encode())?;
        }
        self.barrier.wait(&*self.store)?;
        for req in requests
            .iter()
            .zip(miss)
            .filter(|(_, &m)| m)
            .map(|(r, _)| r)
        {
            let key = self.key_of(req, req.peer);
            if !self.store.check(&[&key])? {
                return Err(Error::not_found(format!(
                    "seed exchange: key {key} not found in store at rank {}",
                    self.rank
                )));
            }
            let value = self.store.get(&key, self.timeout)?;
            self.store.delete_key(&key)?;
            let mapping = self.importer.import(req.peer, &value)?;
            let id = (req.peer, req.direction, req.tag.clone());
            // A replaced mapping not kept is released as its guard drops.
            let old = self.mapped.insert(id, mapping);
            if self.keep {
                self.kept.extend(old);
            }
        }
        self.barrier.wait(&*self.store)
    }
}

impl Drop for SeedExchange {
    fn drop(&mut self) {
        // The mappings' guards go with the exchange (its fields).
        let _ = self.transport.semaphores().free_slot(self.slot);
    }
}

#[cfg(test)]
mod tests;
