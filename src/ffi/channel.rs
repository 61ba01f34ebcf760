//! C ABI of opened channels (`nvfipc_channel`): one lookup after an exchange, then transfers
//! that take the channel directly (`nvfipc_cuda_channel_*`, `nvfipc_host_channel_*`).

use super::args::out_ptr;
use super::boundary::ffi_call;
use super::exchange::{cache_arg, nvfipc_cache, nvfipc_p2p_handle, nvfipc_request, single_request};
use super::registry::{handle_ref, into_handle, take_handle, Handle};
use crate::error::{Result, Status};
use crate::exchange::OpenChannel;
use std::sync::Arc;

/// One exchanged channel, opened for its transfers (`nvfipc_channel_open`). Holds what a
/// transfer needs, so a post does no lookup. Becomes stale (every use fails with
/// `NVFIPC_STATUS_INVALID_STATE`, touching no buffer) when a later exchange replaces the
/// channel's buffers, when an exchange of it fails, and when its cache is freed; open it again
/// after the exchange. An exchange that changes nothing keeps it current.
///
/// Thread safety: as for the cache's P2P calls, one thread per side of a channel at a time, and
/// no transfer on a channel while an exchange that includes it (or `nvfipc_cache_free`) runs.
/// `nvfipc_channel_free` must not race with other calls on the same channel.
#[derive(Clone)]
pub struct nvfipc_channel {
    pub(crate) ch: Arc<OpenChannel>,
}

impl Handle for nvfipc_channel {}

/// Borrows the channel behind a C pointer (the argument is always named `ch`).
pub(crate) fn channel_arg(ch: *const nvfipc_channel) -> Result<Arc<OpenChannel>> {
    Ok(handle_ref(ch, "ch")?.ch)
}

/// Opens the channel of `req` (found as `nvfipc_cache_get` finds it: same peer, direction,
/// tag, pointer and size as in the last exchange that included it) into `*out`; free it with
/// `nvfipc_channel_free`. `NVFIPC_STATUS_NOT_FOUND` when it was not exchanged. The channel does
/// not keep the cache alive.
#[no_mangle]
pub extern "C" fn nvfipc_channel_open(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    out: *mut *mut nvfipc_channel,
) -> Status {
    ffi_call("nvfipc_channel_open", || {
        let out = out_ptr(out, "out")?;
        let cache = cache_arg(cache)?;
        let req = single_request(&cache, req)?;
        let ch = cache.open_channel(&req)?;
        out.write(into_handle(nvfipc_channel { ch: Arc::new(ch) }))
    })
}

/// Frees a channel from `nvfipc_channel_open`; NULL is a no-op. May be called before or after
/// its cache is freed; a freed channel is an error (`NVFIPC_STATUS_INVALID_STATE`).
#[no_mangle]
pub extern "C" fn nvfipc_channel_free(ch: *mut nvfipc_channel) -> Status {
    ffi_call("nvfipc_channel_free", || take_handle(ch, "ch"))
}

/// Writes the channel's handles into `*out`, as `nvfipc_cache_get` gives them, while the channel
/// is current (`NVFIPC_STATUS_INVALID_STATE` once it is stale).
#[no_mangle]
pub extern "C" fn nvfipc_channel_handles(
    ch: *const nvfipc_channel,
    out: *mut nvfipc_p2p_handle,
) -> Status {
    ffi_call("nvfipc_channel_handles", || {
        let out = out_ptr(out, "out")?;
        let ch = channel_arg(ch)?;
        out.write(nvfipc_p2p_handle::from(ch.handles()?))
    })
}
