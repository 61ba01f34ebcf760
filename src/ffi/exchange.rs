//! C ABI of the handle cache: exchange P2P handles for a batch of requests and look them up.

use super::args::{
    c_str_arg, copy_fields, count_arg, out_ptr, rank_arg, ref_arg, slice_arg, timeout_arg,
};
use super::boundary::ffi_call;
use super::context::context_arg;
use super::context::nvfipc_context;
use super::registry::{handle_ref, into_handle, take_handle, Handle};
use crate::error::{Error, Result, Status};
use crate::exchange::{
    CacheConfig, CacheStats, Direction, HandleCache, MemKind, P2pHandles, Request,
};
use std::ffi::c_char;
use std::fmt::Display;
use std::sync::Arc;

/// `nvfipc_request.direction`: this rank's buffer is the source (the peer pulls from it).
pub const NVFIPC_DIRECTION_SEND: i32 = 0;
/// `nvfipc_request.direction`: this rank's buffer is the destination (it pulls from the peer).
pub const NVFIPC_DIRECTION_RECV: i32 = 1;
/// `nvfipc_request.kind`: CUDA device memory: `cudaMalloc` (legacy IPC), VMM such as PyTorch's
/// expandable segments (POSIX fds, or FABRIC), or an IPC-capable stream-ordered pool; the
/// library picks the export per buffer (see `nvfipc_cuda_pointer_memory`).
pub const NVFIPC_MEM_DEVICE: i32 = 0;
/// `nvfipc_request.kind`: host memory from `nvfipc_host_alloc`.
pub const NVFIPC_MEM_HOST: i32 = 1;
/// Most requests in one `nvfipc_exchange_handles` call: the channels a cache can hold.
pub const NVFIPC_MAX_REQUESTS: usize = 4096;
const _: () = assert!(NVFIPC_MAX_REQUESTS == crate::exchange::board::CAPACITY as usize);

/// Caches P2P handles (own buffer and semaphore, peer's buffer and semaphore) per channel.
///
/// Thread safety: all functions may be called from several threads at once; concurrent
/// `nvfipc_exchange_handles` calls must not include the same channel (that call fails with
/// `NVFIPC_STATUS_INVALID_STATE`). `nvfipc_cache_free` must not race with other calls on it.
#[derive(Clone)]
pub struct nvfipc_cache {
    pub(crate) cache: Arc<HandleCache>,
}

impl Handle for nvfipc_cache {}

impl nvfipc_cache {
    /// Hands a cache made in Rust to C code, as `nvfipc_cache_create` would have made it; free
    /// it with `nvfipc_cache_free`.
    pub fn into_raw(cache: HandleCache) -> *mut nvfipc_cache {
        into_handle(nvfipc_cache {
            cache: Arc::new(cache),
        })
    }
}

/// One point-to-point communication of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_request {
    /// The other rank (`0..world_size`, not this rank).
    pub peer: i64,
    /// `NVFIPC_DIRECTION_SEND` or `NVFIPC_DIRECTION_RECV`.
    pub direction: i32,
    /// `NVFIPC_MEM_DEVICE` or `NVFIPC_MEM_HOST`.
    pub kind: i32,
    /// NUL-terminated name of the communication, equal on both ranks (nvFuser: its name).
    pub tag: *const c_char,
    /// Address of the local buffer (a device pointer, or a pointer into an `nvfipc_host_alloc`
    /// buffer).
    pub ptr: u64,
    /// Size of the local buffer in bytes (> 0).
    pub bytes: u64,
}

/// Handles of one channel, as nvFuser's `P2pIpcHandle`. Valid until the next
/// `nvfipc_exchange_handles` that changes the channel's buffers, or until the cache is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvfipc_p2p_handle {
    /// The local buffer and its size.
    pub local_ptr: u64,
    pub local_bytes: u64,
    /// This rank's 32-bit semaphore of the channel (written by the peer).
    pub local_semaphore: u64,
    /// The peer's buffer mapped into this process, and its size.
    pub peer_ptr: u64,
    pub peer_bytes: u64,
    /// The peer's 32-bit semaphore of the channel, mapped into this process.
    pub peer_semaphore: u64,
    /// `NVFIPC_MEM_DEVICE` or `NVFIPC_MEM_HOST`.
    pub kind: i32,
}

impl From<&P2pHandles> for nvfipc_p2p_handle {
    fn from(h: &P2pHandles) -> nvfipc_p2p_handle {
        let kind = match h.kind {
            MemKind::Device => NVFIPC_MEM_DEVICE,
            MemKind::Host => NVFIPC_MEM_HOST,
        };
        copy_fields!(h => nvfipc_p2p_handle {
            local_ptr, local_bytes, local_semaphore, peer_ptr, peer_bytes, peer_semaphore
        }, kind: kind)
    }
}

pub(crate) fn cache_arg(cache: *const nvfipc_cache) -> Result<Arc<HandleCache>> {
    Ok(handle_ref(cache, "cache")?.cache)
}

pub(crate) fn kind_arg(kind: i32, name: impl Display) -> Result<MemKind> {
    match kind {
        NVFIPC_MEM_DEVICE => Ok(MemKind::Device),
        NVFIPC_MEM_HOST => Ok(MemKind::Host),
        other => Err(Error::invalid(format!(
            "`{name}` = {other} is not NVFIPC_MEM_DEVICE (0) or NVFIPC_MEM_HOST (1)"
        ))),
    }
}

/// Converts one C request (named `name` in messages).
pub(crate) fn request_arg(r: &nvfipc_request, world: usize, name: impl Display) -> Result<Request> {
    let mut out = Request::send(0, String::new(), 0, 0, MemKind::Host);
    request_arg_into(r, world, name, &mut out)?;
    Ok(out)
}

/// [`request_arg`] into `out`, whose tag's capacity it reuses: a warm call allocates nothing.
fn request_arg_into(
    r: &nvfipc_request,
    world: usize,
    name: impl Display,
    out: &mut Request,
) -> Result<()> {
    out.direction = match r.direction {
        NVFIPC_DIRECTION_SEND => Direction::Send,
        NVFIPC_DIRECTION_RECV => Direction::Recv,
        other => {
            return Err(Error::invalid(format!(
                "`{name}.direction` = {other} is not NVFIPC_DIRECTION_SEND (0) or \
                 NVFIPC_DIRECTION_RECV (1)"
            )))
        }
    };
    out.peer = rank_arg(r.peer, world, format_args!("{name}.peer"))?;
    let tag = c_str_arg(r.tag, format_args!("{name}.tag"))?;
    out.tag.clear();
    out.tag.push_str(tag);
    out.ptr = r.ptr;
    out.bytes = r.bytes;
    out.kind = kind_arg(r.kind, format_args!("{name}.kind"))?;
    Ok(())
}

/// Borrows the single request argument `req` of a cache call.
pub(crate) fn single_request(cache: &HandleCache, req: *const nvfipc_request) -> Result<Request> {
    request_arg(ref_arg(req, "req")?, cache.world_size(), "req")
}

/// The cache and the handles of `req` for a P2P call of the `kind` transport.
pub(crate) fn p2p_handles(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    kind: MemKind,
) -> Result<(Arc<HandleCache>, P2pHandles)> {
    let cache = cache_arg(cache)?;
    let req = single_request(&cache, req)?;
    if req.kind != kind {
        return Err(Error::invalid(match kind {
            MemKind::Device => {
                "the CUDA P2P primitives need a NVFIPC_MEM_DEVICE request (use nvfipc_host_p2p_* \
                 for host buffers)"
            }
            MemKind::Host => "host P2P primitives need a NVFIPC_MEM_HOST request",
        }));
    }
    let handles = cache.get(&req)?;
    Ok((cache, handles))
}

fn create(ctx: *const nvfipc_context, scope: &str, out: *mut *mut nvfipc_cache) -> Result<()> {
    let out = out_ptr(out, "out_cache")?;
    let ctx = context_arg(ctx)?;
    let cache = if scope.is_empty() {
        crate::default_transports::cache_from_context(&ctx)?
    } else {
        let mut cfg = CacheConfig::from_context(&ctx);
        cfg.scope = scope.to_string();
        crate::default_transports::cache(cfg)?
    };
    out.write(nvfipc_cache::into_raw(cache))
}

/// Creates a handle cache for the rank of `ctx` (its store, job id and timeout). Host requests use
/// shared memory; the CUDA transport is loaded on the first device request. Free with
/// `nvfipc_cache_free`. Caches may be freed and created again (at points agreed between the
/// ranks): a rank's n-th cache of a job and scope talks to its peers' n-th (each is a new
/// *generation* with boards and store keys of its own, so nothing an older cache left behind is
/// read); for several caches alive at once, use `nvfipc_cache_create_scoped`.
#[no_mangle]
pub extern "C" fn nvfipc_cache_create(
    ctx: *const nvfipc_context,
    out_cache: *mut *mut nvfipc_cache,
) -> Status {
    ffi_call("nvfipc_cache_create", || create(ctx, "", out_cache))
}

/// Like `nvfipc_cache_create`, for one of several caches of a job in one process: `scope` (equal
/// on all ranks, NUL-terminated) separates their channels, boards and store keys.
#[no_mangle]
pub extern "C" fn nvfipc_cache_create_scoped(
    ctx: *const nvfipc_context,
    scope: *const c_char,
    out_cache: *mut *mut nvfipc_cache,
) -> Status {
    ffi_call("nvfipc_cache_create_scoped", || {
        let scope = c_str_arg(scope, "scope")?;
        create(ctx, scope, out_cache)
    })
}

/// Releases every peer mapping and the cache; NULL is a no-op.
///
/// Frees nothing a peer may still map: the cache releases its own mappings of peer memory (kept
/// ones included), waits until the releaser thread has closed them (each close waits for the
/// device work queued on its context; bounded by the linger, and the cache does not mark itself
/// closed when that runs out), marks itself closed on its board, then waits (bounded by the cache's linger, min(timeout, 30 s))
/// until every peer it exchanged with has closed its cache too, or has exited, before freeing its
/// semaphore slab. So every rank should free its cache (ranks freeing theirs at the same time do
/// not wait on each other), and a rank may free the buffers it exported once this call returns.
/// If a peer does not close within the linger, the device semaphore slab is deliberately left
/// allocated rather than freed under the peer's mapping (so should be the buffers exported to that
/// peer); the cache is still freed, and the call returns NVFIPC_STATUS_TIMEOUT naming the peers.
/// When another thread is still inside a call on this cache, teardown happens when that call
/// returns, and this call returns OK.
#[no_mangle]
pub extern "C" fn nvfipc_cache_free(cache: *mut nvfipc_cache) -> Status {
    ffi_call("nvfipc_cache_free", || {
        let Some(handle) = take_handle(cache, "cache")? else {
            return Ok(());
        };
        // When another thread holds it mid-call, the last reference tears it down.
        Arc::try_unwrap(handle.cache).map_or(Ok(()), |cache| cache.try_close().map(drop))
    })
}

fn exchange(
    cache: *const nvfipc_cache,
    reqs: *const nvfipc_request,
    n: usize,
    timeout_ms: i64,
) -> Result<()> {
    let cache = cache_arg(cache)?;
    let n = count_arg(n, "n", "NVFIPC_MAX_REQUESTS", NVFIPC_MAX_REQUESTS)?;
    let args = slice_arg(reqs, n, "reqs")?;
    let timeout = timeout_arg(timeout_ms, cache.timeout());
    REQUESTS.with(|scratch| {
        // Taken out for the call (a call that re-enters this function from a store callback
        // finds it empty and allocates its own), put back after.
        let mut requests = scratch.take();
        for (i, r) in args.iter().enumerate() {
            let name = format_args!("reqs[{i}]");
            match requests.get_mut(i) {
                Some(out) => request_arg_into(r, cache.world_size(), name, out)?,
                None => requests.push(request_arg(r, cache.world_size(), name)?),
            }
        }
        requests.truncate(n);
        let result = cache.exchange_handles_timeout(&requests, timeout);
        scratch.set(requests);
        result
    })
}

thread_local! {
    // process-wide: per thread, so that a warm call's requests cross the C boundary without
    // allocating.
    /// The requests of this thread's last exchange, reused with their tags' capacity.
    static REQUESTS: std::cell::Cell<Vec<Request>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Exchanges handles for the `n` requests at `reqs` (at most `NVFIPC_MAX_REQUESTS`) with every
/// peer they name. Each peer must make the matching call (same tags; any order of requests).
/// Costs no store traffic when neither side's buffers changed, at most one multi-set and one
/// multi-get otherwise; never a barrier.
/// Fails with `NVFIPC_STATUS_TIMEOUT` (naming rank, peer, tag, step and key) when a peer does not
/// arrive within the cache's timeout. A timed-out call leaves its channels in the step it began:
/// calling again with the same requests (same buffers) resumes that step, and the peer sees
/// nothing of it. Any other failure leaves the channels unusable (`NVFIPC_STATUS_INVALID_STATE`
/// afterwards: create a new cache).
///
/// Buffer replacement: when a peer's buffer changed, the new mapping replaces the old one in the
/// cache. The old mapping stays valid for device work enqueued before this call: the cache keeps
/// up to `nvfipc_cache_set_retained_mappings` replaced allocations per peer mapped for reuse, and
/// releases the others to the library's releaser thread, which closes each once all work queued
/// on its device context before the release has finished. This call never waits for device work
/// (a stream may wait on a flag that is set only after it returns). When more than 32 released
/// mappings of one peer are still waiting to be closed, it waits for the releaser, bounded by its
/// timeout, and then fails with `NVFIPC_STATUS_TIMEOUT` naming the peer and channel; the handles
/// are installed all the same and the channels stay usable.
///
/// Exported buffers are not pinned: a rank keeps each buffer it exported allocated until every
/// peer has replaced it (an exchange with its successor returned on both sides) and finished the
/// device work that used it, or until the caches are freed.
#[no_mangle]
pub extern "C" fn nvfipc_exchange_handles(
    cache: *const nvfipc_cache,
    reqs: *const nvfipc_request,
    n: usize,
) -> Status {
    ffi_call("nvfipc_exchange_handles", || exchange(cache, reqs, n, -1))
}

/// `nvfipc_exchange_handles` with its own bound (`timeout_ms` < 0: the cache's timeout; 0 checks
/// once without waiting). A call that finds a peer not ready returns `NVFIPC_STATUS_TIMEOUT` and
/// can be retried with the same requests until it returns OK, e.g. to poll while doing other work.
#[no_mangle]
pub extern "C" fn nvfipc_exchange_handles_timeout(
    cache: *const nvfipc_cache,
    reqs: *const nvfipc_request,
    n: usize,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_exchange_handles_timeout", || {
        exchange(cache, reqs, n, timeout_ms)
    })
}

/// Looks up the handles of `req` (same peer, direction, tag, pointer and size as in the last
/// exchange that included it) into `*out`. `NVFIPC_STATUS_NOT_FOUND` when it was not exchanged.
#[no_mangle]
pub extern "C" fn nvfipc_cache_get(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    out: *mut nvfipc_p2p_handle,
) -> Status {
    ffi_call("nvfipc_cache_get", || {
        let out = out_ptr(out, "out")?;
        let cache = cache_arg(cache)?;
        let req = single_request(&cache, req)?;
        out.write(nvfipc_p2p_handle::from(&cache.get(&req)?))
    })
}

/// Copies the cache's counters into `*out`. (`nvfipc_cache_counters` is the Rust `CacheStats`
/// itself, exported by cbindgen under its C name: the two cannot drift apart.)
#[no_mangle]
pub extern "C" fn nvfipc_cache_stats(cache: *const nvfipc_cache, out: *mut CacheStats) -> Status {
    ffi_call("nvfipc_cache_stats", || {
        let out = out_ptr(out, "out")?;
        out.write(cache_arg(cache)?.stats())
    })
}

/// Sets how many replaced peer allocations the cache keeps mapped per (peer, memory kind)
/// (default 8). A buffer carved again from a kept allocation (PyTorch's caching allocator carves
/// every iteration's tensors from a few segments) then costs no IPC open. 0 releases every
/// replaced mapping at once. Kept mappings are released when the cache is freed; until then an
/// exporter that frees such an allocation does not get its memory back. May be called at any
/// time; takes effect at the next replacement.
#[no_mangle]
pub extern "C" fn nvfipc_cache_set_retained_mappings(
    cache: *const nvfipc_cache,
    per_peer: u32,
) -> Status {
    ffi_call("nvfipc_cache_set_retained_mappings", || {
        cache_arg(cache)?.set_retained_per_peer(per_peer as usize);
        Ok(())
    })
}
