//! C ABI of symmetric memory: every member of a group maps every other member's buffer, through
//! a cache, with no group-wide synchronisation.

use super::args::{c_str_arg, out_ptr, out_slice_arg, timeout_arg};
use super::barrier::members_arg;
use super::boundary::ffi_call;
use super::exchange::{cache_arg, kind_arg, nvfipc_cache};
use crate::error::{Error, Status};
use std::ffi::c_char;

/// Maps every other member's buffer of a symmetric allocation named `tag` (equal on every
/// member, NUL-terminated): `ptr`/`bytes` of memory kind `kind` (`NVFIPC_MEM_DEVICE`: any device
/// memory the exchange accepts, `cudaMalloc`, VMM or an IPC pool; `NVFIPC_MEM_HOST`) is this
/// rank's buffer, `ranks[0..n_ranks]` the members (this rank among them; the whole world when
/// `n_ranks` is 0, `ranks` may then be NULL). On success `out_ptrs[i]` and `out_bytes[i]` (may
/// be NULL) hold the i-th member's buffer in increasing rank order as mapped here (this rank's
/// own pointer for itself) and its size; `n_out` must be at least the number of members.
///
/// No barrier: each rank publishes its record and waits only for the records and opens of the
/// peers it maps (one exchange in which each pair of members talks over one channel, tag
/// `symm:<tag>`), so members may call in any order and ranks outside the group take no part.
/// Imports are deduplicated and released like any exchange's (when the buffer is replaced, or
/// the cache freed); a second rendezvous of the same buffers costs no store traffic. The mapped
/// pointers stay valid until the next rendezvous of `tag` with other buffers,
/// `nvfipc_symmetric_release` of `tag`, or `nvfipc_cache_free`. `timeout_ms` < 0: the cache's timeout; on timeout the message names the
/// peer that did not come.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn nvfipc_symmetric_rendezvous(
    cache: *const nvfipc_cache,
    tag: *const c_char,
    kind: i32,
    ptr: u64,
    bytes: u64,
    ranks: *const i64,
    n_ranks: usize,
    timeout_ms: i64,
    out_ptrs: *mut u64,
    out_bytes: *mut u64,
    n_out: usize,
) -> Status {
    ffi_call("nvfipc_symmetric_rendezvous", || {
        let cache = cache_arg(cache)?;
        let tag = c_str_arg(tag, "tag")?;
        let kind = kind_arg(kind, "kind")?;
        let members = members_arg(ranks, n_ranks, cache.world_size())?;
        let wanted = members.as_ref().map_or(cache.world_size(), Vec::len);
        if n_out < wanted {
            return Err(Error::invalid(format!(
                "argument `n_out` = {n_out} is smaller than the {wanted} members of the group"
            )));
        }
        let out_ptrs = out_slice_arg(out_ptrs, n_out, "out_ptrs")?;
        let n_bytes = if out_bytes.is_null() { 0 } else { n_out }; // optional
        let out_bytes = out_slice_arg(out_bytes, n_bytes, "out_bytes")?;
        let timeout = timeout_arg(timeout_ms, cache.timeout());
        let peers =
            cache.symmetric_rendezvous(tag, ptr, bytes, kind, members.as_deref(), timeout)?;
        out_ptrs.write_all(peers.iter().map(|p| p.ptr));
        out_bytes.write_all(peers.iter().map(|p| p.bytes));
        Ok(())
    })
}

/// Maps every member's buffer of the last rendezvous of `tag` (same cache) again, in increasing
/// rank order (this rank's own included), into ONE reserved virtual address range: member i's
/// buffer is at `*out_base + i * *out_stride`. Local: no store traffic, no waiting for peers.
///
/// Every member's buffer must have the same size and the same offset within its allocation
/// granule (`NVFIPC_STATUS_INVALID_ARGUMENT` names the members that differ). Device buffers must
/// be VMM allocations (`cuMemCreate` + `cuMemMap`, incl. PyTorch's expandable segments): the
/// range is reserved with `cuMemAddressReserve`, `stride` = the span of the physical
/// allocation(s) holding a buffer (its size plus its offset within its first allocation, in
/// whole allocation granules), this rank's allocations mapped through
/// `cuMemRetainAllocationHandle` and the peers' through the handles their import holds (nothing
/// is imported again), read-write for this device; `cudaMalloc` or stream-ordered pool memory
/// cannot be mapped again: `NVFIPC_STATUS_UNSUPPORTED`. Host buffers (`nvfipc_host_alloc`) are
/// mapped at page granularity (`stride` = the buffer's size plus its offset in its page, in
/// whole pages).
///
/// The view is owned by the cache: a second call returns the same view at no cost; it is
/// unmapped by the next rendezvous of `tag` with other buffers, `nvfipc_symmetric_release` or
/// `nvfipc_cache_free`. `NVFIPC_STATUS_INVALID_ARGUMENT` when `tag` was not rendezvoused.
#[no_mangle]
pub extern "C" fn nvfipc_symmetric_contiguous_view(
    cache: *const nvfipc_cache,
    tag: *const c_char,
    out_base: *mut u64,
    out_stride: *mut u64,
) -> Status {
    ffi_call("nvfipc_symmetric_contiguous_view", || {
        let cache = cache_arg(cache)?;
        let tag = c_str_arg(tag, "tag")?;
        let out_base = out_ptr(out_base, "out_base")?;
        let out_stride = out_ptr(out_stride, "out_stride")?;
        let (base, stride) = cache.symmetric_contiguous_view(tag)?;
        out_base.write(base)?;
        out_stride.write(stride)
    })
}

/// Drops, in this process, what the rendezvous of `tag` mapped: the peers' buffers (each import
/// released once: a mapping that another channel shares stays) and the contiguous view. Local
/// only: no store traffic, no waiting for peers; cheap, and it never aborts, so it may be called
/// from a destructor. Afterwards the pointers of the rendezvous and of the view are invalid
/// (finish the device work that uses them first); a later rendezvous of `tag`, with the same
/// buffers or others, works whatever the order in which the members released and came back.
/// `NVFIPC_STATUS_INVALID_ARGUMENT` when `tag` was not rendezvoused (or is released already);
/// `NVFIPC_STATUS_INVALID_STATE` while a rendezvous of `tag` runs on another thread or is
/// suspended after a timeout.
#[no_mangle]
pub extern "C" fn nvfipc_symmetric_release(
    cache: *const nvfipc_cache,
    tag: *const c_char,
) -> Status {
    ffi_call("nvfipc_symmetric_release", || {
        let cache = cache_arg(cache)?;
        let tag = c_str_arg(tag, "tag")?;
        cache.symmetric_release(tag)
    })
}
