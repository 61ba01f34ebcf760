//! C ABI of the host transport: shared-memory buffers and the zero-copy "get" primitives on them.

use super::args::{out_ptr, timeout_arg};
use super::boundary::ffi_call;
use super::channel::{channel_arg, nvfipc_channel};
use super::exchange::{nvfipc_cache, nvfipc_request, p2p_handles};
use crate::error::Status;
use crate::exchange::MemKind;
use crate::host::{self, p2p};
use std::ffi::c_void;

/// Allocates `bytes` (> 0) of zero-filled host memory that peers can map through
/// `nvfipc_exchange_handles` (with `NVFIPC_MEM_HOST`). `*out_ptr` receives the address; free it
/// with `nvfipc_host_free`. The memory is an anonymous shared file (memfd) whose pages are
/// reserved now (more than the node or cgroup has available is an error here, not a SIGBUS
/// later); peers receive its descriptor through the fd transport (`NVFIPC_SOCKET_DIR`,
/// `NVFIPC_FD_RUNGS`), and nothing of it can outlive the processes that use it.
#[no_mangle]
pub extern "C" fn nvfipc_host_alloc(bytes: usize, out_ptr_arg: *mut *mut c_void) -> Status {
    ffi_call("nvfipc_host_alloc", || {
        let out = out_ptr(out_ptr_arg, "out_ptr")?;
        let buf = host::alloc(bytes as u64)?;
        out.write(buf.into_raw() as *mut c_void)
    })
}

/// Frees a buffer from `nvfipc_host_alloc` (its start address); NULL is a no-op. Peers that mapped
/// it keep their mapping until they release it; a freed or foreign pointer is an error.
#[no_mangle]
pub extern "C" fn nvfipc_host_free(ptr: *mut c_void) -> Status {
    ffi_call("nvfipc_host_free", || {
        if ptr.is_null() {
            return Ok(());
        }
        host::free(ptr as u64)
    })
}

/// Sender side of a transfer on the channel of `req` (a SEND request already exchanged): tells
/// the receiver that the next transfer's data is ready. Never blocks.
#[no_mangle]
pub extern "C" fn nvfipc_host_p2p_send_post(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
) -> Status {
    ffi_call("nvfipc_host_p2p_send_post", || {
        p2p::send_post(&p2p_handles(cache, req, MemKind::Host)?.1)
    })
}

/// Receiver side (a RECV request already exchanged): waits for the sender's post, copies `bytes`
/// from the sender's buffer into the local one and signals the sender. `timeout_ms` < 0: the
/// cache's timeout; 0: check once. A sender that has exited (where its pid can be checked: same
/// pid namespace) fails the wait at once with `NVFIPC_STATUS_IO`, naming its rank and pid; a
/// timeout names them too.
#[no_mangle]
pub extern "C" fn nvfipc_host_p2p_recv_post(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    bytes: u64,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_host_p2p_recv_post", || {
        let (cache, h) = p2p_handles(cache, req, MemKind::Host)?;
        let timeout = timeout_arg(timeout_ms, cache.timeout());
        p2p::recv_post(&h, bytes, timeout)
    })
}

/// Sender side: waits until the receiver has copied the last posted transfer, after which the
/// send buffer may be reused. `timeout_ms` and a receiver that has exited as in
/// `nvfipc_host_p2p_recv_post`.
#[no_mangle]
pub extern "C" fn nvfipc_host_p2p_send_wait(
    cache: *const nvfipc_cache,
    req: *const nvfipc_request,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_host_p2p_send_wait", || {
        let (cache, h) = p2p_handles(cache, req, MemKind::Host)?;
        let timeout = timeout_arg(timeout_ms, cache.timeout());
        p2p::send_wait(&h, timeout)
    })
}

/// `nvfipc_host_p2p_send_post` on an opened channel (no lookup). `NVFIPC_STATUS_INVALID_STATE`,
/// changing nothing, when the channel is stale (see `nvfipc_channel`).
#[no_mangle]
pub extern "C" fn nvfipc_host_channel_send_post(ch: *const nvfipc_channel) -> Status {
    ffi_call("nvfipc_host_channel_send_post", || {
        p2p::send_post(channel_arg(ch)?.handles()?)
    })
}

/// `nvfipc_host_p2p_recv_post` on an opened channel (no lookup); `timeout_ms` < 0: the timeout
/// of the cache it was opened from. `NVFIPC_STATUS_INVALID_STATE`, touching no buffer, when the
/// channel is stale.
#[no_mangle]
pub extern "C" fn nvfipc_host_channel_recv_post(
    ch: *const nvfipc_channel,
    bytes: u64,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_host_channel_recv_post", || {
        let ch = channel_arg(ch)?;
        let timeout = timeout_arg(timeout_ms, ch.timeout());
        p2p::recv_post(ch.handles()?, bytes, timeout)
    })
}

/// `nvfipc_host_p2p_send_wait` on an opened channel (no lookup); `timeout_ms` as in
/// `nvfipc_host_channel_recv_post`.
#[no_mangle]
pub extern "C" fn nvfipc_host_channel_send_wait(
    ch: *const nvfipc_channel,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_host_channel_send_wait", || {
        let ch = channel_arg(ch)?;
        let timeout = timeout_arg(timeout_ms, ch.timeout());
        p2p::send_wait(ch.handles()?, timeout)
    })
}
