//! The zero-copy "get" protocol (`transport::epoch`) of nvFuser's `cuda_p2p.cpp` on a CUDA
//! stream: [`send_post`], [`recv_post`] (pulls the bytes with `cuMemcpyDtoDAsync`), [`send_wait`];
//! the `channel_*` forms number the transfers of a cached channel. Everything is enqueued on the
//! caller's stream: the host never blocks. Writes use the default flags (a memory barrier: work
//! queued earlier is visible before the signal); a device that refuses stream memory operations
//! (on by default from driver 11.7) gets `Unsupported`.

use super::driver::{self, describe};
use super::result;
use crate::error::{Error, Result, Status};
pub use crate::transport::epoch::Endpoint;
use crate::transport::epoch::{done, posted};
use crate::transport::{MemKind, P2pHandles};
use cudarc::driver::sys;
use std::fmt;

/// A `CUstream` (NULL is the legacy default stream of the current context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(pub usize);

impl Stream {
    fn raw(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }
}

/// `what` is formatted only on failure: a successful call allocates nothing.
fn memop_error(call: &str, rc: sys::CUresult, what: fmt::Arguments<'_>) -> Error {
    if rc == sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
        return Error::unsupported(format!(
            "{call} ({what}): stream memory operations are not supported on this device or \
             driver ({}); the CUDA P2P primitives need them (any GPU since Pascal with driver \
             11.7 or newer)",
            describe(rc)
        ));
    }
    Error::new(
        Status::Cuda,
        format!("{call} ({what}) failed: {}", describe(rc)),
    )
}

fn write(stream: Stream, addr: u64, value: u32, what: fmt::Arguments<'_>) -> Result<()> {
    // SAFETY: `addr` is a device semaphore address from the cache (own slab or a mapped peer
    // slab); the driver validates the stream and the address.
    unsafe { result::stream_write_value32(stream.raw(), addr, value) }
        .map_err(|rc| memop_error("cuStreamWriteValue32", rc, what))
}

fn wait(stream: Stream, addr: u64, value: u32, what: fmt::Arguments<'_>) -> Result<()> {
    // SAFETY: as in `write`.
    unsafe { result::stream_wait_value32_geq(stream.raw(), addr, value) }
        .map_err(|rc| memop_error("cuStreamWaitValue32", rc, what))
}

fn prepare(ep: &Endpoint, transfer: u64) -> Result<()> {
    ep.check()?;
    if transfer == 0 {
        return Err(Error::invalid("transfer numbers start at 1"));
    }
    driver::ensure_context(None)?;
    Ok(())
}

/// Sender, transfer `n`: tells the receiver that the send buffer holds the data.
pub fn send_post(ep: &Endpoint, n: u64, stream: Stream) -> Result<()> {
    prepare(ep, n)?;
    write(
        stream,
        ep.peer_semaphore,
        posted(n),
        format_args!("signal transfer {n} ready to the receiver"),
    )
}

/// Receiver, transfer `n`: waits for the sender's signal, pulls `bytes` and signals "done".
pub fn recv_post(ep: &Endpoint, n: u64, bytes: u64, stream: Stream) -> Result<()> {
    ep.check_fits(bytes)?;
    prepare(ep, n)?;
    wait(
        stream,
        ep.local_semaphore,
        posted(n),
        format_args!("wait for the sender's transfer {n}"),
    )?;
    if bytes > 0 {
        // SAFETY: both ranges were resolved and checked against their allocations by the
        // exchange, and `bytes` fits both (checked above); the copy is ordered on `stream`.
        let copied = unsafe {
            result::memcpy_dtod_async(ep.local_ptr, ep.peer_ptr, bytes as usize, stream.raw())
        };
        if let Err(rc) = copied {
            return Err(Error::new(
                Status::Cuda,
                format!(
                    "cuMemcpyDtoDAsync of {bytes} bytes from the peer buffer {:#x} to {:#x} \
                     (transfer {n}) failed: {}",
                    ep.peer_ptr,
                    ep.local_ptr,
                    describe(rc)
                ),
            ));
        }
    }
    write(
        stream,
        ep.peer_semaphore,
        done(n),
        format_args!("signal transfer {n} consumed to the sender"),
    )
}

/// Sender, transfer `n`: waits (on the stream) until the receiver has pulled the data.
pub fn send_wait(ep: &Endpoint, n: u64, stream: Stream) -> Result<()> {
    prepare(ep, n)?;
    wait(
        stream,
        ep.local_semaphore,
        done(n),
        format_args!("wait for the receiver to consume transfer {n}"),
    )
}

/// Sender, on `stream`: tells the receiver that the send buffer holds the next transfer of a
/// cached channel (`send_post`); returns its number (counted only when the arguments are valid,
/// so both sides stay in step).
pub fn channel_send_post(h: &P2pHandles, stream: Stream) -> Result<u64> {
    let ep = h.endpoint(MemKind::Device)?;
    driver::ensure_context(None)?;
    let n = h.epochs.next_send();
    send_post(&ep, n, stream).map(|()| n)
}

/// Receiver, on `stream`: waits for the sender's signal, pulls `bytes` of the next transfer of a
/// cached channel and signals "done" (`recv_post`); returns its number.
pub fn channel_recv_post(h: &P2pHandles, bytes: u64, stream: Stream) -> Result<u64> {
    let ep = h.endpoint(MemKind::Device)?;
    ep.check_fits(bytes)?;
    driver::ensure_context(None)?;
    let n = h.epochs.next_recv();
    recv_post(&ep, n, bytes, stream).map(|()| n)
}

/// Sender, on `stream`: waits until the receiver has pulled the last transfer posted on a cached
/// channel (`send_wait`).
pub fn channel_send_wait(h: &P2pHandles, stream: Stream) -> Result<u64> {
    let ep = h.endpoint(MemKind::Device)?;
    let n = h.last_posted()?;
    send_wait(&ep, n, stream).map(|()| n)
}

#[cfg(test)]
mod tests;
