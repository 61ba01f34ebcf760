//! The zero-copy "get" protocol (`transport::epoch`) on host memory, run by the calling thread:
//! [`send_post`] signals the receiver, [`recv_post`] waits for it, copies the bytes from the
//! sender's buffer into the local one and signals "done", [`send_wait`] waits for that.
//!
//! The handles come from `HandleCache::get` and stay valid until the next `exchange_handles` that
//! changes the channel, or until the cache is dropped. Calls on one channel and one side must
//! not overlap (one thread per side per channel, like a CUDA stream).

use crate::error::{Error, Result};
use crate::os::wait::wait_until;
use crate::transport::epoch::{done, posted, reached, Endpoint};
use crate::transport::{MemKind, P2pHandles};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Polls of a transfer wait before the first liveness check of the peer (`kill(pid, 0)`, a
/// syscall): past the spin phase of `wait_until`, so a peer a few microseconds late costs none.
const FIRST_LIVENESS_POLL: u32 = 2048;
/// Polls between two liveness checks after that (about 100 ms once sleeping).
const LIVENESS_EVERY: u32 = 256;

/// The checked endpoint of host handles (semaphores must be 4-byte aligned to be atomics).
fn endpoint(h: &P2pHandles) -> Result<Endpoint> {
    let ep = h.endpoint(MemKind::Host)?;
    if ep.local_semaphore % 4 != 0 || ep.peer_semaphore % 4 != 0 {
        return Err(Error::invalid(
            "P2P endpoint: semaphores must be 4-byte aligned",
        ));
    }
    Ok(ep)
}

fn semaphore(addr: u64) -> &'static AtomicU32 {
    // SAFETY: `addr` is a non-NULL, 4-byte-aligned semaphore slot (checked by `endpoint`) in a
    // slab mapped by the cache that produced the handles; the caller's contract keeps it mapped
    // while the handles are used. `'static` is never held beyond one call.
    unsafe { &*(addr as *const AtomicU32) }
}

/// Waits until this side's semaphore has reached `target`: `Io` when the peer exited first,
/// `Timeout` past `timeout`; messages say `call` waits for `awaited`, made by `peer_call`.
fn wait_for(
    h: &P2pHandles,
    target: u32,
    timeout: Duration,
    (call, peer_call): (&str, &str),
    awaited: impl FnOnce() -> String,
) -> Result<()> {
    let own = semaphore(h.local_semaphore);
    let mut polls: u32 = 0;
    let mut dead = false;
    let arrived = wait_until(timeout, || {
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
    if arrived == Some(true) {
        return Ok(());
    }
    let state = format!(
        "local semaphore {:#x} holds {}, waiting for {target}",
        h.local_semaphore,
        own.load(Ordering::Acquire)
    );
    let (peer, awaited) = (h.peer.describe(), awaited());
    Err(if dead {
        Error::io(format!(
            "{call}: {peer}; stopped waiting for {awaited} ({state})"
        ))
    } else {
        Error::timeout(format!(
            "{call}: {awaited} did not come within {timeout:?} ({state}); did {peer} call \
             {peer_call}?"
        ))
    })
}

/// Sender: announces the next transfer to the receiver. Returns its number.
pub fn send_post(h: &P2pHandles) -> Result<u64> {
    let ep = endpoint(h)?;
    let n = h.epochs.next_send();
    semaphore(ep.peer_semaphore).store(posted(n), Ordering::Release);
    Ok(n)
}

/// Receiver: waits (at most `timeout`) for the next transfer, copies `bytes` (> 0) and signals
/// "done"; returns the transfer number, which advances only then.
pub fn recv_post(h: &P2pHandles, bytes: u64, timeout: Duration) -> Result<u64> {
    let ep = endpoint(h)?;
    if bytes == 0 {
        return Err(Error::invalid("recv_post: the byte count must be positive"));
    }
    ep.check_fits(bytes)?;
    let n = h.epochs.last_recv() + 1;
    wait_for(h, posted(n), timeout, ("recv_post", "send_post"), || {
        format!("transfer {n} from the sender")
    })?;
    // SAFETY: both ranges were checked against the buffer sizes recorded at exchange time and
    // are mapped by the cache; they live in different mappings, so they do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            ep.peer_ptr as *const u8,
            ep.local_ptr as *mut u8,
            bytes as usize,
        )
    };
    h.epochs.next_recv();
    semaphore(ep.peer_semaphore).store(done(n), Ordering::Release);
    Ok(n)
}

/// Sender: waits (at most `timeout`) until the receiver has pulled the last posted transfer.
pub fn send_wait(h: &P2pHandles, timeout: Duration) -> Result<u64> {
    endpoint(h)?;
    let n = h.last_posted()?;
    wait_for(h, done(n), timeout, ("send_wait", "recv_post"), || {
        format!("the receiver's end of transfer {n}")
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests;
