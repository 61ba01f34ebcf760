//! nvFuser's zero-copy "get" protocol on host memory, with epoch-valued semaphores
//! (see `transport::epoch`):
//!
//! - [`send_post`] (sender): "transfer `n` is ready" into the receiver's semaphore;
//! - [`recv_post`] (receiver): wait for it, pull the bytes from the sender's buffer into the local
//!   one, then "transfer `n` is done" into the sender's semaphore;
//! - [`send_wait`] (sender): wait for "done", after which the send buffer may be reused.
//!
//! The handles come from `HandleCache::get` and stay valid until the next `exchange_handles` that
//! changes the channel, or until the cache is dropped. Calls on one channel and one side must
//! not overlap (one thread per side per channel, like a CUDA stream).

use crate::error::{Error, Result};
use crate::os::wait::wait_until;
use crate::transport::epoch::{done, posted, reached};
use crate::transport::{MemKind, P2pHandles};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Polls of a transfer wait before the first liveness check of the peer (`kill(pid, 0)`, a
/// syscall): past the spin phase of `wait_until`, so a peer a few microseconds late costs none.
const FIRST_LIVENESS_POLL: u32 = 2048;
/// Polls between two liveness checks after that (about 100 ms once sleeping).
const LIVENESS_EVERY: u32 = 256;

/// Waits until `own` has reached `target`, or the peer has exited (`Err` naming it), or the
/// timeout (`Ok(false)`).
fn wait_for(h: &P2pHandles, own: &AtomicU32, target: u32, timeout: Duration) -> Result<bool> {
    let mut polls: u32 = 0;
    let mut dead = false;
    let reached_it = wait_until(timeout, || {
        if reached(own.load(Ordering::Acquire), target) {
            return Some(true);
        }
        polls = polls.wrapping_add(1);
        if polls >= FIRST_LIVENESS_POLL && polls % LIVENESS_EVERY == 0 && h.peer.is_dead() {
            // A last look: what the peer wrote before it died still counts.
            dead = !reached(own.load(Ordering::Acquire), target);
            return Some(!dead);
        }
        None
    });
    if dead {
        return Err(Error::io(format!(
            "{}; stopped waiting for it (own semaphore {:#x} holds {}, waiting for {target})",
            h.peer.describe(),
            own as *const AtomicU32 as usize,
            own.load(Ordering::Acquire)
        )));
    }
    Ok(reached_it.unwrap_or(false))
}

fn check_host(h: &P2pHandles, what: &str) -> Result<()> {
    if h.kind != MemKind::Host {
        return Err(Error::invalid(format!(
            "{what}: the handles are for {} memory; use the device primitives",
            h.kind.name()
        )));
    }
    if h.local_semaphore == 0 || h.peer_semaphore == 0 || h.local_ptr == 0 || h.peer_ptr == 0 {
        return Err(Error::invalid(format!(
            "{what}: handles hold a NULL address"
        )));
    }
    if h.local_semaphore % 4 != 0 || h.peer_semaphore % 4 != 0 {
        return Err(Error::invalid(format!(
            "{what}: semaphores must be 4-byte aligned"
        )));
    }
    Ok(())
}

fn semaphore(addr: u64) -> &'static AtomicU32 {
    // SAFETY: `addr` is a non-NULL, 4-byte-aligned semaphore slot (checked by `check_host`) in a
    // slab mapped by the cache that produced the handles; the caller's contract keeps it mapped
    // while the handles are used. `'static` is never held beyond one call.
    unsafe { &*(addr as *const AtomicU32) }
}

/// Sender: announces the next transfer to the receiver. Returns its number.
pub fn send_post(h: &P2pHandles) -> Result<u64> {
    check_host(h, "send_post")?;
    let n = h.epochs.next_send();
    semaphore(h.peer_semaphore).store(posted(n), Ordering::Release);
    Ok(n)
}

/// Receiver: waits (at most `timeout`) for the next transfer, copies `bytes` from the peer's
/// buffer into the local one, and tells the sender it is done. Returns the transfer number.
pub fn recv_post(h: &P2pHandles, bytes: u64, timeout: Duration) -> Result<u64> {
    check_host(h, "recv_post")?;
    if bytes == 0 || bytes > h.local_bytes || bytes > h.peer_bytes {
        return Err(Error::invalid(format!(
            "recv_post: byte count {bytes} must be positive and fit both the local buffer \
             ({} bytes) and the peer's ({} bytes)",
            h.local_bytes, h.peer_bytes
        )));
    }
    let n = h.epochs.last_recv() + 1;
    let own = semaphore(h.local_semaphore);
    let target = posted(n);
    let arrived = wait_for(h, own, target, timeout)
        .map_err(|e| e.context(format!("recv_post: transfer {n} was never posted")))?;
    if !arrived {
        return Err(Error::timeout(format!(
            "recv_post: transfer {n} was not posted by the sender, {}, within {timeout:?} \
             (local semaphore {:#x} holds {}, waiting for {target}); did {} call send_post?",
            h.peer.describe(),
            h.local_semaphore,
            own.load(Ordering::Acquire),
            h.peer.describe()
        )));
    }
    // SAFETY: both ranges were checked against the buffer sizes recorded at exchange time and
    // are mapped by the cache; they live in different mappings, so they do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            h.peer_ptr as *const u8,
            h.local_ptr as *mut u8,
            bytes as usize,
        )
    };
    h.epochs.next_recv();
    semaphore(h.peer_semaphore).store(done(n), Ordering::Release);
    Ok(n)
}

/// Sender: waits (at most `timeout`) until the receiver has pulled the last posted transfer.
pub fn send_wait(h: &P2pHandles, timeout: Duration) -> Result<u64> {
    check_host(h, "send_wait")?;
    let n = h.epochs.last_send();
    if n == 0 {
        return Err(Error::state(
            "send_wait: no send was posted on this channel",
        ));
    }
    let own = semaphore(h.local_semaphore);
    let target = done(n);
    let finished = wait_for(h, own, target, timeout).map_err(|e| {
        e.context(format!(
            "send_wait: the receiver never finished transfer {n}"
        ))
    })?;
    if !finished {
        return Err(Error::timeout(format!(
            "send_wait: the receiver, {}, did not finish transfer {n} within {timeout:?} (local \
             semaphore {:#x} holds {}, waiting for {target}); did {} call recv_post?",
            h.peer.describe(),
            h.local_semaphore,
            own.load(Ordering::Acquire),
            h.peer.describe()
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
