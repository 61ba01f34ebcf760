//! The handle record: a versioned, fixed-size, little-endian description of one exported buffer
//! (and the exporter's semaphore slot) that travels through the store.
//!
//! Nothing native is ever copied raw: every field sits at a fixed offset, unused bytes are zero,
//! and [`Record::decode`] validates every field before a transport opens anything. The layout,
//! and the segments (one per physical allocation behind a VMM buffer, one naming a pool), are in
//! docs/PROTOCOL.md section 3.

use crate::error::{Error, Result};
use crate::hash::fnv1a64;

/// Returns a `Protocol` error with a formatted message.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(Error::protocol(format!($($arg)*)))
    };
}

/// `"NVFI"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"NVFI");
/// Current format version. Decoders accept exactly this version. 4: the semaphore slot indexes a
/// slab of 4096 slots (3: 1024), so a peer of format 3 is refused rather than mapped too far.
pub const FORMAT_VERSION: u16 = 4;
/// Size of the fixed part of an encoded record in bytes (the length its header states).
pub const RECORD_LEN: usize = 256;
/// Size of one encoded [`Segment`].
pub const SEGMENT_LEN: usize = 80;
/// Most segments one record may list (NCCL's cap on a multi-segment registration too).
pub const MAX_SEGMENTS: usize = 8192;
/// Size of the opaque handle payloads (a `cudaIpcMemHandle_t` is 64 bytes).
pub const PAYLOAD_LEN: usize = 64;
/// Bytes of host name kept in a record (for error messages only; identity is `host_id`).
pub const HOST_NAME_LEN: usize = 32;

/// The semaphore slot of a channel that carries no semaphore (a symmetric rendezvous's).
pub const NO_SLOT: u32 = u32::MAX;

/// How a buffer (or a semaphore slab) is shared with peers.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandleType {
    /// `cudaIpcMemHandle_t` of a legacy `cudaMalloc` allocation; payload = the 64 handle bytes.
    CudaLegacyIpc = 1,
    /// A file descriptor of a host buffer's anonymous file (or slab), passed by the fd transport
    /// (`crate::fdpass`); payload = the exporter's encoded `FdId`, zero padded. (Value 2, named
    /// `/dev/shm` segments, belonged to format version 1.)
    PosixFd = 3,
    /// A VMM buffer (`cuMemCreate` + `cuMemMap`) whose physical allocations are exported as
    /// POSIX fds and passed by the fd transport; each segment's handle is the exporter's encoded
    /// `FdId`. The payload is zero.
    CudaVmmFd = 4,
    /// A VMM buffer whose physical allocations are exported as FABRIC handles; each segment's
    /// handle is the 64-byte `CUmemFabricHandle`. The payload is zero.
    CudaVmmFabric = 5,
    /// A buffer of a stream-ordered memory pool (`cudaMallocFromPoolAsync` from an IPC-capable
    /// pool); the payload is the pointer's `CUmemPoolPtrExportData`, the one segment names the
    /// pool (id = the exporter's pool, handle = the `FdId` of the pool's POSIX fd, size 0).
    CudaPool = 6,
}

impl HandleType {
    /// Parses the wire byte.
    pub fn from_u8(value: u8) -> Option<HandleType> {
        match value {
            1 => Some(HandleType::CudaLegacyIpc),
            3 => Some(HandleType::PosixFd),
            4 => Some(HandleType::CudaVmmFd),
            5 => Some(HandleType::CudaVmmFabric),
            6 => Some(HandleType::CudaPool),
            _ => None,
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            HandleType::CudaLegacyIpc => "CUDA legacy IPC",
            HandleType::PosixFd => "POSIX file descriptor",
            HandleType::CudaVmmFd => "CUDA VMM (POSIX fd)",
            HandleType::CudaVmmFabric => "CUDA VMM (FABRIC)",
            HandleType::CudaPool => "CUDA memory pool",
        }
    }

    /// Whether this handle type shares device memory.
    pub fn is_device(self) -> bool {
        !matches!(self, HandleType::PosixFd)
    }

    /// Whether records of this type list segments (and how many they may list).
    fn segment_counts(self) -> std::ops::RangeInclusive<usize> {
        match self {
            HandleType::CudaLegacyIpc | HandleType::PosixFd => 0..=0,
            HandleType::CudaVmmFd | HandleType::CudaVmmFabric => 1..=MAX_SEGMENTS,
            HandleType::CudaPool => 1..=1,
        }
    }
}

/// One physical allocation behind a buffer (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Size of the physical allocation (0 for a pool).
    pub bytes: u64,
    /// Its identity in the exporter, unique for its lifetime: importers open each once.
    pub id: u64,
    /// Transport-specific handle bytes (see [`HandleType`]).
    pub handle: [u8; PAYLOAD_LEN],
}

/// Flag bits of [`Record::flags`]. Unknown bits are rejected on decode.
pub mod flags {
    /// The buffer lives in device memory (otherwise host memory).
    pub const DEVICE: u8 = 1 << 0;
    /// All bits this version understands.
    pub const KNOWN: u8 = DEVICE;
}

/// One exported handle plus the exporter's semaphore location, as decoded from the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub handle_type: HandleType,
    pub flags: u8,
    /// Offset of the exported pointer from its allocation base.
    pub offset: u64,
    /// Number of bytes the exporter offers, starting at `offset`.
    pub bytes: u64,
    /// Size of the whole allocation that the handle maps.
    pub alloc_bytes: u64,
    /// Identity of the allocation in the exporter (CUDA `BUFFER_ID` or shm segment id).
    pub buffer_id: u64,
    /// Hash of the exporter's host name and boot id (see [`local_host`]).
    pub host_id: u64,
    /// The exporter's buffer version on the channel this record was published for.
    pub version: u64,
    /// UUID of the exporter's device; zero for host memory.
    pub device_uuid: [u8; 16],
    pub pid: u32,
    pub rank: u32,
    /// The exporter's host name, truncated, for messages.
    pub host_name: [u8; HOST_NAME_LEN],
    /// Transport-specific handle bytes (see [`HandleType`]).
    pub payload: [u8; PAYLOAD_LEN],
    /// How the exporter's semaphore slab is shared.
    pub sem_type: HandleType,
    /// Slot of the exporter's semaphore for this channel inside its slab.
    pub sem_slot: u32,
    /// Transport-specific handle bytes of the exporter's semaphore slab.
    pub sem_payload: [u8; PAYLOAD_LEN],
    /// The physical allocations behind the buffer, in address order (see the module docs).
    pub segments: Vec<Segment>,
}

/// Identity of this node as far as mapping memory goes (a hash of `NodeIdentity::mapping_key`:
/// equal exactly where memory can be mapped, changed by a reboot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIdentity {
    pub id: u64,
    pub name: String,
}

/// This machine's identity, from the node's (`NodeIdentity::local`).
pub fn local_host() -> HostIdentity {
    let node = crate::node::NodeIdentity::local();
    HostIdentity {
        id: fnv1a64(&node.mapping_key()),
        name: node.host_name,
    }
}

/// Copies `text` into a NUL-padded fixed array, truncating at `N - 1` bytes so it stays
/// NUL-terminated. Fails when `text` contains a NUL byte.
pub fn to_fixed<const N: usize>(text: &str) -> Result<[u8; N]> {
    if text.as_bytes().contains(&0) {
        return Err(Error::invalid(format!("name {text:?} contains a NUL byte")));
    }
    let mut out = [0u8; N];
    let n = text.len().min(N - 1);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    Ok(out)
}

/// Reads a NUL-padded fixed array back as text (lossy for non-UTF-8).
pub fn from_fixed(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

impl Record {
    /// The exporter's host name as text.
    pub fn host_name(&self) -> String {
        from_fixed(&self.host_name)
    }

    /// Encodes to exactly [`RECORD_LEN`] + segments x [`SEGMENT_LEN`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_LEN + self.segments.len() * SEGMENT_LEN);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(RECORD_LEN as u16).to_le_bytes());
        out.push(self.handle_type as u8);
        out.push(self.flags);
        out.push(self.sem_type as u8);
        out.push(0);
        out.extend_from_slice(&self.sem_slot.to_le_bytes());
        for v in [
            self.offset,
            self.bytes,
            self.alloc_bytes,
            self.buffer_id,
            self.host_id,
            self.version,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.device_uuid);
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.host_name);
        out.extend_from_slice(&self.payload);
        out.extend_from_slice(&self.sem_payload);
        out.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(out.len(), RECORD_LEN);
        for seg in &self.segments {
            out.extend_from_slice(&seg.bytes.to_le_bytes());
            out.extend_from_slice(&seg.id.to_le_bytes());
            out.extend_from_slice(&seg.handle);
        }
        out
    }

    /// Decodes and validates a record that must be opened on this host.
    pub fn decode(bytes: &[u8]) -> Result<Record> {
        Self::decode_for_host(bytes, &local_host())
    }

    /// Decodes and validates a record that must be opened on `host`: `Protocol` for a
    /// structural problem, `Unsupported` for a record from another machine.
    pub fn decode_for_host(bytes: &[u8], host: &HostIdentity) -> Result<Record> {
        let got = bytes.len();
        if got < 8 {
            bail!("handle record truncated: {got} bytes, expected {RECORD_LEN}");
        }
        let magic = u32_at(bytes, 0);
        if magic != MAGIC {
            bail!(
                "not a handle record: magic {magic:#010x}, expected {MAGIC:#010x} (\"NVFI\"); is \
                 another program writing to the same store keys?"
            );
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != FORMAT_VERSION {
            bail!(
                "handle record format version {version} is not supported (this library speaks \
                 version {FORMAT_VERSION}); all ranks must use the same nvfuser-ipc version"
            );
        }
        let length = usize::from(u16::from_le_bytes([bytes[6], bytes[7]]));
        if length != RECORD_LEN || got < RECORD_LEN {
            bail!(
                "handle record length mismatch: header says {length} bytes, received {got}, \
                 expected {RECORD_LEN}"
            );
        }
        let count = u32_at(bytes, 248) as usize;
        if count > MAX_SEGMENTS {
            bail!("handle record lists {count} segments, more than the {MAX_SEGMENTS} allowed");
        }
        let expected = RECORD_LEN + count * SEGMENT_LEN;
        if got != expected {
            bail!(
                "handle record length mismatch: {count} segment(s) make {expected} bytes, \
                 received {got}"
            );
        }
        if u32_at(bytes, 252) != 0 || bytes[11] != 0 {
            bail!("handle record reserved bytes (11, 252..256) are not zero");
        }
        let handle_type = HandleType::from_u8(bytes[8]);
        let sem_type = HandleType::from_u8(bytes[10]);
        let (Some(handle_type), Some(sem_type)) = (handle_type, sem_type) else {
            bail!(
                "handle record has unknown handle type {} or semaphore handle type {}",
                bytes[8],
                bytes[10]
            );
        };
        let flags = bytes[9];
        if flags & !flags::KNOWN != 0 {
            bail!(
                "handle record has unknown flag bits {:#04x}",
                flags & !flags::KNOWN
            );
        }
        let rec = Record {
            handle_type,
            flags,
            sem_type,
            sem_slot: u32_at(bytes, 12),
            offset: u64_at(bytes, 16),
            bytes: u64_at(bytes, 24),
            alloc_bytes: u64_at(bytes, 32),
            buffer_id: u64_at(bytes, 40),
            host_id: u64_at(bytes, 48),
            version: u64_at(bytes, 56),
            device_uuid: array_at(bytes, 64),
            pid: u32_at(bytes, 80),
            rank: u32_at(bytes, 84),
            host_name: array_at(bytes, 88),
            payload: array_at(bytes, 120),
            sem_payload: array_at(bytes, 184),
            segments: bytes[RECORD_LEN..]
                .chunks_exact(SEGMENT_LEN)
                .map(|c| Segment {
                    bytes: u64_at(c, 0),
                    id: u64_at(c, 8),
                    handle: array_at(c, 16),
                })
                .collect(),
        };
        rec.validate(host)?;
        Ok(rec)
    }

    fn validate(&self, host: &HostIdentity) -> Result<()> {
        let who = format!("handle record of rank {} (pid {})", self.rank, self.pid);
        if self.bytes == 0 {
            bail!("{who}: byte count is zero");
        }
        if self
            .offset
            .checked_add(self.bytes)
            .map_or(true, |end| end > self.alloc_bytes)
        {
            bail!(
                "{who}: range [{}, +{}) lies outside its allocation of {} bytes",
                self.offset,
                self.bytes,
                self.alloc_bytes
            );
        }
        let is_device = self.flags & flags::DEVICE != 0;
        if is_device != self.handle_type.is_device() {
            bail!(
                "{who}: handle type {} does not match the device flag ({is_device})",
                self.handle_type.name()
            );
        }
        let n = self.segments.len();
        if !self.handle_type.segment_counts().contains(&n) {
            bail!(
                "{who}: a {} record cannot list {n} segment(s)",
                self.handle_type.name()
            );
        }
        let empty = |b: &[u8]| b.iter().all(|&b| b == 0);
        if let Some(i) = self.segments.iter().position(|s| empty(&s.handle)) {
            bail!("{who}: segment {i} has an empty handle");
        }
        let vmm = matches!(
            self.handle_type,
            HandleType::CudaVmmFd | HandleType::CudaVmmFabric
        );
        if vmm {
            if let Some(i) = self.segments.iter().position(|s| s.bytes == 0) {
                bail!("{who}: segment {i} has size 0");
            }
            let total = self
                .segments
                .iter()
                .try_fold(0u64, |t, s| t.checked_add(s.bytes));
            if total != Some(self.alloc_bytes) {
                bail!(
                    "{who}: segments add up to {} bytes, the allocation has {}",
                    total.map_or("more than 2^64".to_string(), |t| t.to_string()),
                    self.alloc_bytes
                );
            }
        }
        // A channel without a semaphore (NO_SLOT) has no slab to share.
        let no_slab = self.sem_slot == NO_SLOT;
        if (!vmm && empty(&self.payload)) || (!no_slab && empty(&self.sem_payload)) {
            bail!("{who}: empty handle payload");
        }
        if self.host_id != host.id {
            return Err(Error::unsupported(format!(
                "record exported on host {} (id {:#018x}) cannot be opened on host {} \
                 (id {:#018x}): CUDA IPC is node-local; rank {} must run on the same machine, in \
                 the same IPC namespace and with the same /dev/shm",
                self.host_name(),
                self.host_id,
                host.name,
                host.id,
                self.rank
            )));
        }
        Ok(())
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(array_at(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(array_at(bytes, at))
}

fn array_at<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes[at..at + N].try_into().expect("in-bounds slice")
}

#[cfg(test)]
mod tests;
