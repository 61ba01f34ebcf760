//! C ABI of symmetric memory: every member of a group maps every other member's buffer, through
//! a cache, with no group-wide synchronisation.

use super::args::{c_str_arg, out_slice_arg, timeout_arg};
use super::barrier::members_arg;
use super::boundary::ffi_call;
use super::exchange::{cache_arg, kind_arg, nvfipc_cache};
use crate::error::Error;
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
/// pointers stay valid until the next rendezvous of `tag` with other buffers, or
/// `nvfipc_cache_free`. `timeout_ms` < 0: the cache's timeout; on timeout the message names the
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
) -> crate::error::Status {
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
        let out_bytes = if out_bytes.is_null() {
            None
        } else {
            Some(out_slice_arg(out_bytes, n_out, "out_bytes")?)
        };
        let timeout = timeout_arg(timeout_ms, cache.timeout());
        let peers =
            cache.symmetric_rendezvous(tag, ptr, bytes, kind, members.as_deref(), timeout)?;
        debug_assert!(peers.len() <= out_ptrs.len());
        out_ptrs.write(peers.iter().map(|p| p.ptr));
        if let Some(out) = out_bytes {
            out.write(peers.iter().map(|p| p.bytes));
        }
        Ok(())
    })
}
