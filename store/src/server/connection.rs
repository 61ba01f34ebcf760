//! One client connection of the store server (socket, buffers, streamed reply) and the pool of
//! large buffers; `event_loop.rs` owns and drives them.

use super::state::{Budget, Charge, ConnId, PendingLimits, Refusal, StreamPart};
use crate::wire::ParseError;
use mio::net::TcpStream;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};

/// Smallest free space offered to a read; an idle client's input buffer stays this small.
pub(super) const MIN_READ: usize = 4096;
/// Bytes one connection may read per turn before the others get theirs.
pub(super) const READ_BUDGET: usize = 4 << 20;
/// Unsent reply bytes above which a connection's input is left unprocessed until it drains.
pub(super) const OUT_HIGH_WATER: usize = 4 << 20;
/// Unsent reply bytes a connection holds without taking any of the server's reply budget.
pub(super) const OUT_ALLOWANCE: usize = 32 * 1024;
/// Input buffer bytes a connection holds without taking any of the server's pending budget.
const IN_ALLOWANCE: usize = 32 * 1024;
/// Most slices one write of a streamed reply gathers.
const MAX_SLICES: usize = 256;
/// Bytes of lengths and small keys or values copied (on the stack) per write of a streamed reply.
const GATHER_BYTES: usize = 16 * 1024;
/// Data at least this long is written from where it is stored rather than copied.
const DIRECT_MIN: usize = 2048;
/// Most bytes offered to one write of a streamed reply.
const WRITE_MAX: usize = 4 << 20;

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
    /// Input is `inbuf[in_start..in_end]`; the zeroed tail is kept for the next read.
    pub(super) inbuf: Vec<u8>,
    pub(super) in_start: usize,
    pub(super) in_end: usize,
    /// Bytes (from `in_start`) the pending partial request needs before it is worth re-parsing.
    pub(super) need: usize,
    /// The pending budget the input buffer holds above [`IN_ALLOWANCE`].
    pub(super) in_charge: Charge,
    pub(super) outbuf: Vec<u8>,
    /// Bytes of `outbuf` already written.
    pub(super) out_pos: usize,
    /// The rest of a streamed reply, written after `outbuf`; input waits until it is empty.
    pub(super) streaming: VecDeque<StreamPart>,
    /// The reply budget the streamed reply holds (its references), until it is sent.
    pub(super) stream_charge: Option<Charge>,
    /// The reply budget the unsent output above [`OUT_ALLOWANCE`] holds.
    pub(super) out_charge: Charge,
    /// Already in the loop's list of connections waiting for reply budget.
    pub(super) parked: bool,
    pub(super) validated: bool,
    pub(super) eof: bool,
    /// The poller reported the peer's FIN or an error: read until EOF, not to a short read (no
    /// further edge may come for the FIN behind the data).
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

    /// Whether this connection's input must wait: output over the high-water mark, or over the
    /// allowance while the budget is spent, or a streamed reply still going out.
    pub(super) fn blocked(&self, budget: &Budget) -> bool {
        let backlog = self.backlog();
        backlog > OUT_HIGH_WATER
            || !self.streaming.is_empty()
            || (backlog > OUT_ALLOWANCE && budget.spent())
    }

    /// Whether its input waits for reply budget (no write readiness will resume it).
    pub(super) fn waits_for_budget(&self, budget: &Budget) -> bool {
        let backlog = self.backlog();
        self.streaming.is_empty()
            && backlog <= OUT_HIGH_WATER
            && backlog > OUT_ALLOWANCE
            && budget.spent()
    }

    /// Charges the unsent output above the allowance to the reply budget.
    pub(super) fn sync_charge(&mut self) {
        self.out_charge
            .set(self.backlog().saturating_sub(OUT_ALLOWANCE));
    }

    /// One write of the streamed reply (lengths and small data copied into a stack buffer, larger
    /// data written where it is stored); returns how many bytes the socket took.
    fn write_streamed(&mut self) -> io::Result<usize> {
        #[derive(Clone, Copy)]
        enum Piece<'a> {
            Copied(usize, usize),
            Direct(&'a [u8]),
        }
        let mut scratch = [0u8; GATHER_BYTES];
        let mut pieces = [Piece::Copied(0, 0); MAX_SLICES];
        let (mut count, mut used, mut total) = (0, 0, 0);
        'parts: for part in &self.streaming {
            for (prefix, prefix_len, data, pos) in part.units() {
                if count + 2 > MAX_SLICES || total >= WRITE_MAX {
                    break 'parts;
                }
                let head = &prefix[pos.min(prefix_len)..prefix_len];
                let data = &data[pos.saturating_sub(prefix_len)..];
                let copied = head.len()
                    + if data.len() < DIRECT_MIN {
                        data.len()
                    } else {
                        0
                    };
                if used + copied > GATHER_BYTES {
                    break 'parts;
                }
                let start = used;
                scratch[used..used + head.len()].copy_from_slice(head);
                used += head.len();
                if data.len() < DIRECT_MIN {
                    scratch[used..used + data.len()].copy_from_slice(data);
                    used += data.len();
                }
                match pieces[..count].last_mut() {
                    Some(Piece::Copied(_, end)) if *end == start => *end = used,
                    _ if used > start => {
                        pieces[count] = Piece::Copied(start, used);
                        count += 1;
                    }
                    _ => {}
                }
                if data.len() >= DIRECT_MIN {
                    pieces[count] = Piece::Direct(data);
                    count += 1;
                }
                total += head.len() + data.len();
            }
        }
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        for (slice, piece) in slices.iter_mut().zip(&pieces[..count]) {
            *slice = match *piece {
                Piece::Copied(start, end) => IoSlice::new(&scratch[start..end]),
                Piece::Direct(data) => IoSlice::new(data),
            };
        }
        if count == 0 {
            return Ok(0);
        }
        self.stream.write_vectored(&slices[..count])
    }

    fn advance_streamed(&mut self, mut n: usize) {
        while let Some(front) = self.streaming.front_mut() {
            match front.advance(n) {
                None => return,
                Some(rest) => {
                    self.streaming.pop_front();
                    n = rest;
                }
            }
        }
    }

    /// Writes what the socket takes of the output, then of the streamed reply.
    pub(super) fn flush(&mut self, pool: &mut BufPool) -> io::Result<()> {
        let result = self.write_out(pool);
        if self.streaming.is_empty() {
            self.stream_charge = None;
        }
        self.sync_charge();
        result
    }

    fn write_out(&mut self, pool: &mut BufPool) -> io::Result<()> {
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
        if self.outbuf.capacity() >= LARGE {
            pool.give(std::mem::take(&mut self.outbuf));
        }
        // A part may be empty (nothing left to write), so advance past those first.
        self.advance_streamed(0);
        while !self.streaming.is_empty() {
            match self.write_streamed() {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.advance_streamed(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Grows the input buffer (from the pool when large) when a large pending request needs
    /// room, charging what it will hold above [`IN_ALLOWANCE`] to the pending budget first.
    pub(super) fn make_room(
        &mut self,
        pool: &mut BufPool,
        limits: &PendingLimits,
    ) -> Result<(), Refusal> {
        let pending = self.in_end - self.in_start;
        let want = self
            .need
            .saturating_sub(pending)
            .clamp(MIN_READ, READ_BUDGET);
        if self.inbuf.len() - self.in_end >= want {
            return Ok(());
        }
        // At least double, so a burst of small requests grows the buffer geometrically.
        let grow = want.max(self.inbuf.len()).min(READ_BUDGET);
        let held = (self.in_end + grow).saturating_sub(IN_ALLOWANCE);
        if let Some(more) = held.checked_sub(self.in_charge.bytes()).filter(|&m| m > 0) {
            let need = self.need.max(pending);
            let what = || format!("a partly read request of at least {need} bytes");
            limits.grow(&mut self.in_charge, more, what)?;
        }
        let target = pending + grow;
        match pool.take(target).filter(|_| target >= LARGE) {
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
        self.in_charge
            .set(self.inbuf.len().saturating_sub(IN_ALLOWANCE));
        Ok(())
    }

    /// One read into the input buffer's free tail ([`Conn::make_room`] sized it). Returns the
    /// bytes read and whether the socket is drained: a short read emptied its queue and later
    /// data raises a new edge, so the read giving EAGAIN is skipped.
    pub(super) fn read_some(&mut self) -> io::Result<(usize, bool)> {
        let offered = self.inbuf.len() - self.in_end;
        let n = self.stream.read(&mut self.inbuf[self.in_end..])?;
        self.in_end += n;
        Ok((n, n > 0 && n < offered && !self.peer_closing))
    }

    pub(super) fn compact_input(&mut self, pool: &mut BufPool) {
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
            if self.inbuf.len() >= LARGE {
                pool.give(std::mem::take(&mut self.inbuf));
            }
        } else if self.in_start > 0 {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
        self.in_charge
            .set(self.inbuf.len().saturating_sub(IN_ALLOWANCE));
    }
}

/// Buffers at least this large are pooled, not kept by an idle connection (and reused mapped).
pub(super) const LARGE: usize = 256 * 1024;
/// Total capacity the pool holds at most; buffers beyond it are freed.
const POOL_BYTES: usize = 64 << 20;
/// Largest buffer pooled (a SET of the largest value fits): a larger one, read for a rare huge
/// request, is freed at once.
const POOL_BUF_MAX: usize = 16 << 20;

#[derive(Default)]
pub(super) struct BufPool {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl BufPool {
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// Keeps `buf` (with its initialized bytes) if the pool has room.
    pub fn give(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if (LARGE..=POOL_BUF_MAX).contains(&cap) && self.bytes + cap <= POOL_BYTES {
            self.bytes += cap;
            self.bufs.push(buf);
        }
    }

    /// The smallest pooled buffer with at least `min_capacity`, if any.
    pub fn take(&mut self, min_capacity: usize) -> Option<Vec<u8>> {
        let best = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= min_capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        let buf = self.bufs.swap_remove(best);
        self.bytes -= buf.capacity();
        Some(buf)
    }
}

/// Before a large reply: moves the pending output into a pooled buffer with room for it.
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

#[cfg(test)]
mod tests;
