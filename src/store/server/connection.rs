//! One client connection of the store server: its socket, buffers, streamed replies and why it
//! was closed. The event loop (`event_loop.rs`) owns the connections and drives them.

use super::buf_pool::{self, BufPool};
use super::state::{ConnId, Refusal, StreamedBlob};
use crate::store::wire::ParseError;
use mio::net::TcpStream;
use std::collections::VecDeque;
use std::io::{self, Read, Write};

/// Smallest free space offered to a read; an idle client's input buffer stays this small.
pub(super) const MIN_READ: usize = 4096;
/// Bytes one connection may read per turn before the others get theirs.
pub(super) const READ_BUDGET: usize = 4 << 20;
/// Unsent reply bytes above which a connection's input is left unprocessed until it drains.
pub(super) const OUT_HIGH_WATER: usize = 4 << 20;
/// Bytes of a streamed reply copied into the output buffer at a time.
pub(super) const STREAM_CHUNK: usize = 256 * 1024;

/// Why a connection was closed.
pub(super) enum Close {
    PeerClosed,
    Io,
    /// First message was not VALIDATE with the right magic.
    Handshake,
    HandshakeTimeout,
    Malformed(ParseError),
    Refused(Refusal),
}

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) id: ConnId,
    /// Input bytes live in `inbuf[in_start..in_end]`; the tail after `in_end` is zeroed space
    /// kept for the next read, so the buffer is not re-initialised before every read.
    pub(super) inbuf: Vec<u8>,
    pub(super) in_start: usize,
    pub(super) in_end: usize,
    /// Bytes (from `in_start`) the pending partial request needs before it is worth re-parsing.
    pub(super) need: usize,
    pub(super) outbuf: Vec<u8>,
    /// Bytes of `outbuf` already written.
    pub(super) out_pos: usize,
    /// The rest of a streamed reply, written after `outbuf`; nothing else of this connection is
    /// handled until it is empty.
    pub(super) streaming: VecDeque<StreamedBlob>,
    pub(super) validated: bool,
    pub(super) eof: bool,
    /// The poller reported the peer's FIN or an error: read until EOF, never stop at a short
    /// read (the FIN may sit behind the data with no further edge to come).
    pub(super) peer_closing: bool,
    /// Already in the loop's `dirty` list.
    pub(super) dirty: bool,
    /// Already in the loop's `again` list.
    pub(super) again: bool,
}

impl Conn {
    pub(super) fn backlog(&self) -> usize {
        self.outbuf.len() - self.out_pos
    }

    /// Whether this connection's input must wait: too much unsent output, or a streamed reply
    /// still going out.
    pub(super) fn blocked(&self) -> bool {
        self.backlog() > OUT_HIGH_WATER || !self.streaming.is_empty()
    }

    /// Moves up to [`STREAM_CHUNK`] bytes of the streamed reply into the (drained) output buffer.
    pub(super) fn refill(&mut self) {
        let mut room = STREAM_CHUNK;
        while room > 0 {
            let Some(blob) = self.streaming.front_mut() else {
                return;
            };
            let bytes = blob.data.bytes();
            let header = (bytes.len() as u64).to_le_bytes();
            if blob.pos < header.len() {
                self.outbuf.extend_from_slice(&header[blob.pos..]);
                room = room.saturating_sub(header.len() - blob.pos);
                blob.pos = header.len();
            }
            let data = &bytes[blob.pos - header.len()..];
            let n = data.len().min(room);
            self.outbuf.extend_from_slice(&data[..n]);
            room -= n;
            blob.pos += n;
            if n == data.len() {
                self.streaming.pop_front();
            }
        }
    }

    /// Writes as much pending output as the socket takes, continuing with the streamed reply
    /// if there is one; a large drained buffer goes back to the pool.
    pub(super) fn flush(&mut self, pool: &mut BufPool) -> io::Result<()> {
        loop {
            while self.out_pos < self.outbuf.len() {
                match self.stream.write(&self.outbuf[self.out_pos..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => self.out_pos += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.outbuf.clear();
            self.out_pos = 0;
            if self.streaming.is_empty() {
                break;
            }
            self.refill();
        }
        if self.outbuf.capacity() >= buf_pool::LARGE {
            pool.give(std::mem::take(&mut self.outbuf));
        }
        Ok(())
    }

    /// One read into the input buffer's free tail, growing it (from the pool when large) for a
    /// large pending request. Returns the bytes read and whether the socket is now drained: a
    /// short read on a stream socket emptied its receive queue, and data arriving later raises
    /// a new edge, so the usual extra read that would only return EAGAIN can be skipped.
    pub(super) fn read_some(&mut self, pool: &mut BufPool) -> io::Result<(usize, bool)> {
        let pending = self.in_end - self.in_start;
        let want = self
            .need
            .saturating_sub(pending)
            .clamp(MIN_READ, READ_BUDGET);
        if self.inbuf.len() - self.in_end < want {
            // At least double, so a burst of small requests grows the buffer geometrically.
            let grow = want.max(self.inbuf.len()).min(READ_BUDGET);
            let target = pending + grow;
            match pool.take(target).filter(|_| target >= buf_pool::LARGE) {
                Some(mut bigger) => {
                    if bigger.len() < target {
                        bigger.resize(target, 0);
                    }
                    bigger[..pending].copy_from_slice(&self.inbuf[self.in_start..self.in_end]);
                    pool.give(std::mem::replace(&mut self.inbuf, bigger));
                    self.in_start = 0;
                    self.in_end = pending;
                }
                None => self.inbuf.resize(self.in_end + grow, 0),
            }
        }
        let offered = self.inbuf.len() - self.in_end;
        let n = self.stream.read(&mut self.inbuf[self.in_end..])?;
        self.in_end += n;
        Ok((n, n > 0 && n < offered && !self.peer_closing))
    }

    /// Drops parsed bytes from the front of the input buffer; a large empty buffer goes back to
    /// the pool.
    pub(super) fn compact_input(&mut self, pool: &mut BufPool) {
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
            if self.inbuf.len() >= buf_pool::LARGE {
                pool.give(std::mem::take(&mut self.inbuf));
            }
        } else if self.in_start > 0 {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
    }
}

/// Before a request whose reply will be large: moves the pending output into a pooled buffer
/// with room for the reply, instead of growing a small buffer.
pub(super) fn reserve_output(
    outbuf: &mut Vec<u8>,
    out_pos: &mut usize,
    pool: &mut BufPool,
    reply_len: usize,
) {
    if outbuf.capacity() - outbuf.len() >= reply_len {
        return;
    }
    let pending = outbuf.len() - *out_pos;
    if let Some(mut bigger) = pool.take(pending + reply_len) {
        bigger.clear();
        bigger.extend_from_slice(&outbuf[*out_pos..]);
        pool.give(std::mem::replace(outbuf, bigger));
        *out_pos = 0;
    }
}
