//! What a device pointer is: one `cuPointerGetAttributes` call gives the allocation range, buffer
//! id, memory type, device and export capabilities, and [`classify`] (pure, unit-tested) turns
//! them into an exportable [`DeviceAllocation`] (legacy IPC, VMM or pool) or an error that says
//! what the pointer is and which allocator setting to change.

use super::driver::{self, check};
use super::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

/// `CUmemorytype` as reported for a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// Not known to CUDA: plain host memory, a freed allocation or a garbage address.
    Unknown,
    Host,
    Device,
    Array,
    Unified,
    Other(u32),
}

impl MemoryType {
    fn from_raw(value: u32) -> MemoryType {
        match value {
            0 => MemoryType::Unknown,
            1 => MemoryType::Host,
            2 => MemoryType::Device,
            3 => MemoryType::Array,
            4 => MemoryType::Unified,
            other => MemoryType::Other(other),
        }
    }
}

/// The driver's view of one pointer (attributes CUDA does not know read as zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    pub ptr: u64,
    pub memory_type: MemoryType,
    /// The context owning the allocation (0 when unknown).
    pub context: u64,
    pub device_ordinal: i32,
    /// Unique within the process for the lifetime of the process.
    pub buffer_id: u64,
    pub is_managed: bool,
    pub legacy_ipc_capable: bool,
    pub range_start: u64,
    pub range_size: u64,
    /// Handle types a VMM allocation can be exported as (bitmask; 0 for other memory).
    pub allowed_handle_types: u64,
    /// The memory pool of stream-ordered allocations (0 otherwise).
    pub mempool: u64,
    /// For VMM memory, the mapping of one physical allocation that holds the pointer (the
    /// `RANGE_*` attributes then give the whole reserved range); 0 when unknown.
    pub mapping_base: u64,
    pub mapping_size: u64,
    /// Process-wide unique id of the physical allocation (0 when unknown).
    pub block_id: u64,
    /// The address belongs to a VMM mapping (`cuMemCreate` + `cuMemMap`, as PyTorch's
    /// expandable segments use): `cuMemRetainAllocationHandle` succeeds on it.
    pub vmm: bool,
}

/// How a device allocation is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceMemoryKind {
    /// `cudaMalloc`: one legacy IPC handle for the allocation.
    Legacy,
    /// A VMM mapping: one shareable handle per physical allocation the buffer spans.
    Vmm {
        /// `CU_MEM_HANDLE_TYPE_*` bits the physical allocation at `base` can be exported as.
        handle_types: u32,
    },
    /// A stream-ordered pool allocation.
    Pool {
        /// The pool (`CUmemoryPool`) it was allocated from.
        pool: u64,
    },
}

/// An exportable device allocation, and the user's range inside it (for VMM memory, the physical
/// allocation that holds `ptr`: `vmm::resolve_run` walks the next ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceAllocation {
    pub ptr: u64,
    pub bytes: u64,
    pub base: u64,
    pub size: u64,
    pub buffer_id: u64,
    pub device_ordinal: i32,
    pub kind: DeviceMemoryKind,
}

impl DeviceAllocation {
    pub fn offset(&self) -> u64 {
        self.ptr - self.base
    }
}

/// The attributes requested, in order; each is written into its own zeroed 8-byte slot, which
/// holds every attribute type requested here (bool, unsigned int, int, pointer, size_t, u64).
const ATTRIBUTES: [sys::CUpointer_attribute; 14] = [
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPED,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
];
/// Prefixes of [`ATTRIBUTES`] retried, in order, with a driver that does not know the newer
/// ones: without the mapping attributes, then the core set every supported driver knows.
const FALLBACK_COUNTS: [usize; 2] = [11, 8];

/// Asks the driver about `ptr` in one `cuPointerGetAttributes` call.
pub fn query(ptr: u64) -> Result<PointerInfo> {
    driver::driver()?;
    // Pointer queries need some context on the thread (UVA is process-wide, so any will do).
    driver::ensure_context(None)?;
    let mut slots = [0u64; ATTRIBUTES.len()];
    let mut attrs = ATTRIBUTES;
    // A fixed array, not a Vec: this runs on every cached exchange.
    let mut data = [std::ptr::null_mut::<c_void>(); ATTRIBUTES.len()];
    for (entry, slot) in data.iter_mut().zip(slots.iter_mut()) {
        *entry = (slot as *mut u64).cast::<c_void>();
    }
    let mut count = ATTRIBUTES.len();
    // SAFETY: `attrs` and `data` both have `count` entries; every data entry points to a zeroed
    // 8-byte slot, large enough for each requested attribute.
    let mut rc = unsafe { result::pointer_get_attributes(count, &mut attrs, &mut data, ptr) };
    for fewer in FALLBACK_COUNTS {
        if rc != Err(sys::CUresult::CUDA_ERROR_INVALID_VALUE) {
            break;
        }
        // An older driver that does not know the newer attributes: ask for fewer.
        count = fewer;
        // SAFETY: as above, with the first `count` entries of both arrays.
        rc = unsafe { result::pointer_get_attributes(count, &mut attrs, &mut data, ptr) };
    }
    let rc = rc.err().unwrap_or(sys::CUresult::CUDA_SUCCESS);
    if rc == sys::CUresult::CUDA_ERROR_INVALID_CONTEXT
        || rc == sys::CUresult::CUDA_ERROR_INVALID_VALUE
    {
        // Not a pointer CUDA knows about.
        slots = [0; ATTRIBUTES.len()];
    } else {
        check(rc, &format!("cuPointerGetAttributes({ptr:#x})"))?;
    }
    let legacy_ipc_capable = slots[5] & 0xff != 0;
    Ok(PointerInfo {
        ptr,
        // Shareable VMM memory says so in its attributes; only for the rest is the driver asked
        // (two more calls), so that the refusal can say what the memory is.
        vmm: !legacy_ipc_capable
            && slots[9] == 0
            && (slots[8] as u32 & (result::HANDLE_TYPE_POSIX_FD | result::HANDLE_TYPE_FABRIC) != 0
                || is_vmm(ptr)),
        memory_type: MemoryType::from_raw(slots[0] as u32),
        context: slots[1],
        device_ordinal: slots[2] as u32 as i32,
        buffer_id: slots[3],
        is_managed: slots[4] & 0xff != 0,
        legacy_ipc_capable,
        range_start: slots[6],
        range_size: slots[7],
        allowed_handle_types: slots[8],
        mempool: slots[9],
        mapping_base: slots[11],
        mapping_size: slots[12],
        block_id: slots[13],
    })
}

/// True when `ptr` lies in a VMM mapping (the only memory `cuMemRetainAllocationHandle` accepts).
fn is_vmm(ptr: u64) -> bool {
    let Ok(handle) = result::mem_retain_allocation_handle(ptr) else {
        return false;
    };
    // SAFETY: the retain above succeeded, so this drops exactly the reference it took.
    let _ = unsafe { result::mem_release(handle) };
    true
}

/// Decides whether `[info.ptr, info.ptr + bytes)` is exportable device memory.
pub fn classify(info: &PointerInfo, bytes: u64) -> Result<DeviceAllocation> {
    let ptr = info.ptr;
    if ptr == 0 {
        return Err(Error::invalid("device pointer is NULL"));
    }
    if bytes == 0 {
        return Err(Error::invalid(format!(
            "byte count for pointer {ptr:#x} is zero"
        )));
    }
    let at = if info.range_start != 0 {
        info.range_start
    } else {
        ptr
    };
    // Checked first: a VMM mapping may not report a memory type at all.
    if info.vmm && info.mempool == 0 {
        return classify_vmm(info, at).map(|a| DeviceAllocation { bytes, ..a });
    }
    match info.memory_type {
        MemoryType::Device => {}
        MemoryType::Unknown => {
            return Err(Error::invalid(format!(
                "pointer {ptr:#x} is not device memory from cudaMalloc, VMM (cuMemCreate) or a \
                 pool: was it freed, or is it on the stack or a host buffer? Pass live device \
                 memory"
            )))
        }
        MemoryType::Host => {
            return Err(Error::invalid(format!(
                "pointer {ptr:#x} is pinned host memory, not device memory; use the host \
                 transport for host buffers"
            )))
        }
        other => {
            return Err(Error::invalid(format!(
                "pointer {ptr:#x} has CUDA memory type {other:?}, not plain device memory"
            )))
        }
    }
    if info.is_managed {
        return Err(Error::unsupported(format!(
            "pointer {ptr:#x} is managed (unified) memory; legacy CUDA IPC cannot export it; \
             allocate the buffer with cudaMalloc"
        )));
    }
    let kind = match (info.legacy_ipc_capable, info.mempool) {
        (true, _) => DeviceMemoryKind::Legacy,
        (false, 0) => {
            return Err(Error::unsupported(format!(
                "allocation at {at:#x} (pointer {ptr:#x}) can be exported neither by legacy CUDA \
                 IPC nor as VMM or pool memory; allocate it with cudaMalloc, cuMemCreate (with a \
                 POSIX fd handle type) or from an IPC-capable memory pool"
            )))
        }
        (false, pool) => DeviceMemoryKind::Pool { pool },
    };
    let (base, size) = (info.range_start, info.range_size);
    if base == 0 || size == 0 || ptr < base {
        return Err(Error::internal(format!(
            "CUDA reported an empty address range (base {base:#x}, size {size}) for device \
             pointer {ptr:#x}"
        )));
    }
    let end = ptr.checked_add(bytes);
    if end.map_or(true, |end| end > base + size) {
        return Err(Error::invalid(format!(
            "range [{ptr:#x}, +{bytes}) does not fit in its allocation [{base:#x}, +{size}) \
             (offset {}); the byte count is too large",
            ptr - base
        )));
    }
    Ok(DeviceAllocation {
        ptr,
        bytes,
        base,
        size,
        buffer_id: info.buffer_id,
        device_ordinal: info.device_ordinal,
        kind,
    })
}

/// A VMM mapping, exportable when created with a shareable handle type; its range is the physical
/// allocation holding `ptr` (the segment walk checks the following ones).
fn classify_vmm(info: &PointerInfo, at: u64) -> Result<DeviceAllocation> {
    let ptr = info.ptr;
    let handle_types = (info.allowed_handle_types as u32)
        & (super::result::HANDLE_TYPE_POSIX_FD | super::result::HANDLE_TYPE_FABRIC);
    if handle_types == 0 {
        return Err(Error::unsupported(format!(
            "allocation at {at:#x} (pointer {ptr:#x}) is VMM memory (cuMemCreate/cuMemMap, e.g. \
             PyTorch's expandable segments) created without a shareable handle type \
             (allowed handle types {:#x}); create it with requestedHandleTypes = \
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (or FABRIC), or set \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False",
            info.allowed_handle_types
        )));
    }
    // The physical allocation's mapping, not the reserved range around it.
    let (base, size) = (info.mapping_base, info.mapping_size);
    if base == 0 || size == 0 || ptr < base || ptr - base >= size {
        return Err(Error::internal(format!(
            "CUDA reported no mapping (base {base:#x}, size {size}) for VMM pointer {ptr:#x}; a \
             driver that knows CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR (CUDA >= 11.7) is needed"
        )));
    }
    let buffer_id = segment_id(base, info.buffer_id, info.block_id);
    Ok(DeviceAllocation {
        ptr,
        bytes: 0,
        base,
        size,
        buffer_id,
        device_ordinal: info.device_ordinal,
        kind: DeviceMemoryKind::Vmm { handle_types },
    })
}

/// A physical allocation's identity: its block id, else the mapping's place and buffer.
fn segment_id(mapping_base: u64, buffer_id: u64, block_id: u64) -> u64 {
    if block_id != 0 {
        return block_id;
    }
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&mapping_base.to_le_bytes());
    bytes[8..].copy_from_slice(&buffer_id.to_le_bytes());
    crate::hash::fnv1a64(&bytes)
}

/// What the allocation holding `ptr` is now, as (range start, range size, buffer id): enough to
/// tell a legacy or pool allocation from any other that may since have taken its address, at a
/// fraction of [`query`]'s cost; `None` when the driver cannot say (a freed pointer, say).
pub fn allocation_identity(ptr: u64) -> Option<(u64, u64, u64)> {
    const ASKED: [sys::CUpointer_attribute; 3] = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    ];
    let [start, size, id] = query_few(ptr, ASKED)?;
    Some((start, size, id))
}

/// What the VMM mapping holding `at` is now, as (mapping base, mapping size, segment id), the id
/// computed as `classify` computes a VMM allocation's: enough to tell a physical allocation from
/// one mapped later at its address; `None` when the driver cannot say.
pub fn segment_identity(at: u64) -> Option<(u64, u64, u64)> {
    const ASKED: [sys::CUpointer_attribute; 4] = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
    ];
    let [base, size, buffer_id, block_id] = query_few(at, ASKED)?;
    Some((base, size, segment_id(base, buffer_id, block_id)))
}

/// One `cuPointerGetAttributes` call for `N` attributes of 8 bytes or less, each read into a
/// zeroed slot; `None` on any failure (an unknown pointer, a driver without the attribute).
fn query_few<const N: usize>(ptr: u64, asked: [sys::CUpointer_attribute; N]) -> Option<[u64; N]> {
    driver::driver().ok()?;
    driver::ensure_context(None).ok()?;
    let mut slots = [0u64; N];
    let mut attrs = asked;
    let mut data = [std::ptr::null_mut::<c_void>(); N];
    for (entry, slot) in data.iter_mut().zip(slots.iter_mut()) {
        *entry = (slot as *mut u64).cast::<c_void>();
    }
    // SAFETY: `attrs` and `data` both have `N` entries; every data entry points to a zeroed
    // 8-byte slot, large enough for each attribute asked for here (pointers, sizes, u64 ids).
    let rc = unsafe { result::pointer_get_attributes(N, &mut attrs, &mut data, ptr) };
    rc.ok().map(|()| slots)
}

/// Finds the exportable device allocation that holds `[ptr, ptr + bytes)`.
pub fn resolve(ptr: u64, bytes: u64) -> Result<DeviceAllocation> {
    if ptr == 0 {
        return Err(Error::invalid("device pointer is NULL"));
    }
    classify(&query(ptr)?, bytes)
}

#[cfg(test)]
mod tests;
