//! The server thread: one mio poll loop (edge-triggered) over the listener and every client.
//!
//! Each connection has an input buffer (partial and pipelined requests) and an output buffer
//! (replies not yet accepted by the kernel). Every complete request in the input is handled per
//! readable event and the replies go out in one write. A connection whose peer stops reading
//! stops being read once its unsent output passes a high-water mark, so one slow client cannot
//! grow the server's memory or starve the others.

use super::state::{ConnId, Refusal, StoreState};
use super::{ServerOptions, Shared};
use crate::store::wire::{self, Command, ParseError, Parsed, Request};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) const LISTENER: Token = Token(0);
pub(super) const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// Bytes read per read call into the shared scratch buffer.
const READ_CHUNK: usize = 64 * 1024;
/// Bytes one connection may read per turn before the others get theirs.
const READ_BUDGET: usize = 4 << 20;
/// Unsent reply bytes above which a connection's input is left unprocessed until it drains.
const OUT_HIGH_WATER: usize = 4 << 20;
/// Idle buffers larger than this are shrunk back, so a burst does not pin memory per client.
const KEEP_CAPACITY: usize = 256 * 1024;
/// How long to stop accepting after running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Why a connection was closed.
enum Close {
    PeerClosed,
    Io,
    /// First message was not VALIDATE with the right magic.
    Handshake,
    HandshakeTimeout,
    Malformed(ParseError),
    Refused(Refusal),
}

struct Conn {
    stream: TcpStream,
    id: ConnId,
    inbuf: Vec<u8>,
    /// Start of the unparsed bytes in `inbuf`.
    in_start: usize,
    /// Bytes (from `in_start`) the pending partial request needs before it is worth re-parsing.
    need: usize,
    outbuf: Vec<u8>,
    /// Bytes of `outbuf` already written.
    out_pos: usize,
    validated: bool,
    eof: bool,
    /// Already in the loop's `dirty` list.
    dirty: bool,
    /// Already in the loop's `again` list.
    again: bool,
}

impl Conn {
    fn backlog(&self) -> usize {
        self.outbuf.len() - self.out_pos
    }

    /// Writes as much pending output as the socket takes.
    fn flush(&mut self) -> io::Result<()> {
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
        if self.outbuf.capacity() > KEEP_CAPACITY {
            self.outbuf.shrink_to(READ_CHUNK);
        }
        Ok(())
    }

    /// One read. Large pending requests read straight into the input buffer; small reads go
    /// through `scratch` so the input buffer is not zero-filled ahead of every read.
    fn read_some(&mut self, scratch: &mut [u8]) -> io::Result<usize> {
        let pending = self.inbuf.len() - self.in_start;
        let missing = self.need.saturating_sub(pending);
        if missing > scratch.len() {
            let len = self.inbuf.len();
            self.inbuf.resize(len + missing.min(READ_BUDGET), 0);
            let result = self.stream.read(&mut self.inbuf[len..]);
            self.inbuf.truncate(len + *result.as_ref().unwrap_or(&0));
            return result;
        }
        let n = self.stream.read(scratch)?;
        self.inbuf.extend_from_slice(&scratch[..n]);
        Ok(n)
    }

    /// Drops parsed bytes from the front of the input buffer.
    fn compact_input(&mut self) {
        if self.in_start == self.inbuf.len() {
            self.inbuf.clear();
            if self.inbuf.capacity() > KEEP_CAPACITY {
                self.inbuf.shrink_to(READ_CHUNK);
            }
        } else if self.in_start > 0 {
            self.inbuf.drain(..self.in_start);
        }
        self.in_start = 0;
    }
}

pub(super) struct EventLoop {
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    handshake_timeout: Option<Duration>,
    conns: Vec<Option<Conn>>,
    free_slots: Vec<usize>,
    next_gen: u32,
    state: StoreState,
    /// Connections owed a STOP_WAITING byte by the request being handled.
    woken: Vec<ConnId>,
    /// Connections with output to flush at the end of this turn.
    dirty: Vec<usize>,
    /// Connections that used up their read budget and must be serviced again.
    again: Vec<usize>,
    scratch: Box<[u8]>,
    /// Unvalidated connections in accept order, with their handshake deadline.
    handshake_deadlines: VecDeque<(Instant, ConnId)>,
    accept_paused_until: Option<Instant>,
}

impl EventLoop {
    pub(super) fn new(
        poll: Poll,
        mut listener: TcpListener,
        shared: Arc<Shared>,
        opts: &ServerOptions,
    ) -> io::Result<EventLoop> {
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(EventLoop {
            poll,
            listener,
            shared,
            handshake_timeout: opts.handshake_timeout,
            conns: Vec::new(),
            free_slots: Vec::new(),
            next_gen: 0,
            state: StoreState::default(),
            woken: Vec::new(),
            dirty: Vec::new(),
            again: Vec::new(),
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
            handshake_deadlines: VecDeque::new(),
            accept_paused_until: None,
        })
    }

    /// Runs until the stop flag is set (or polling itself fails, which is recorded).
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        while !self.shared.stop.load(Ordering::Acquire) {
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                self.shared
                    .record_error(format!("store server: poll failed, stopping: {e}"));
                break;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    Token(t) => self.service(t - FIRST_CONN),
                }
            }
            for slot in std::mem::take(&mut self.again) {
                if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                    conn.again = false;
                    self.service(slot);
                }
            }
            self.expire_handshakes();
            if self
                .accept_paused_until
                .is_some_and(|t| t <= Instant::now())
            {
                self.accept_paused_until = None;
                self.accept_all();
            }
            self.flush_dirty();
        }
        for slot in 0..self.conns.len() {
            if self.conns[slot].is_some() {
                self.close(slot, None);
            }
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.again.is_empty() {
            return Some(Duration::ZERO);
        }
        let deadline = [
            self.handshake_deadlines.front().map(|d| d.0),
            self.accept_paused_until,
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(deadline.saturating_duration_since(Instant::now()))
    }

    fn conn(&mut self, slot: usize) -> Option<&mut Conn> {
        self.conns.get_mut(slot).and_then(Option::as_mut)
    }

    fn accept_all(&mut self) {
        if self.accept_paused_until.is_some() {
            return;
        }
        loop {
            match self.listener.accept() {
                Ok((stream, _peer)) => self.add_connection(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.shared
                        .stats
                        .accept_errors
                        .fetch_add(1, Ordering::Relaxed);
                    let out_of_resources = matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    );
                    if out_of_resources {
                        // The pending connection stays in the backlog; try again shortly.
                        self.shared.record_error(format!(
                            "store server: accept failed ({e}); raise the open-file limit"
                        ));
                        self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                        return;
                    }
                    // Per-connection failures (e.g. ECONNABORTED): move on to the next one.
                }
            }
        }
    }

    fn add_connection(&mut self, mut stream: TcpStream) {
        // Replies are small and latency-bound; never let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let token = Token(slot + FIRST_CONN);
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            self.shared
                .stats
                .accept_errors
                .fetch_add(1, Ordering::Relaxed);
            self.shared.record_error(format!(
                "store server: cannot register a client socket: {e}"
            ));
            self.free_slots.push(slot);
            return;
        }
        self.next_gen = self.next_gen.wrapping_add(1);
        let id = ConnId {
            slot: slot as u32,
            gen: self.next_gen,
        };
        self.conns[slot] = Some(Conn {
            stream,
            id,
            inbuf: Vec::new(),
            in_start: 0,
            need: 0,
            outbuf: Vec::new(),
            out_pos: 0,
            validated: false,
            eof: false,
            dirty: false,
            again: false,
        });
        if let Some(timeout) = self.handshake_timeout {
            self.handshake_deadlines
                .push_back((Instant::now() + timeout, id));
        }
        self.shared.connected.fetch_add(1, Ordering::AcqRel);
        self.shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Handles readiness of one connection: flush, handle buffered requests, read, repeat.
    fn service(&mut self, slot: usize) {
        let mut budget = READ_BUDGET;
        loop {
            let Some(conn) = self.conn(slot) else {
                return;
            };
            if conn.flush().is_err() {
                self.close(slot, Some(Close::Io));
                return;
            }
            if conn.backlog() > OUT_HIGH_WATER {
                // Resumed by the WRITABLE edge once the peer reads.
                return;
            }
            if let Err(reason) = self.process_input(slot) {
                self.deliver_wakeups();
                if let Some(conn) = self.conn(slot) {
                    // Best effort: replies to the valid requests before the bad one.
                    let _ = conn.flush();
                }
                self.close(slot, Some(reason));
                return;
            }
            self.deliver_wakeups();
            let scratch = &mut self.scratch;
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                return;
            };
            if conn.backlog() > OUT_HIGH_WATER {
                continue;
            }
            if conn.eof {
                let _ = conn.flush();
                self.close(slot, Some(Close::PeerClosed));
                return;
            }
            if budget == 0 {
                if !conn.again {
                    conn.again = true;
                    self.again.push(slot);
                }
                self.mark_dirty(slot);
                return;
            }
            match conn.read_some(scratch) {
                Ok(0) => conn.eof = true,
                Ok(n) => budget = budget.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if conn.flush().is_err() {
                        self.close(slot, Some(Close::Io));
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(slot, Some(Close::Io));
                    return;
                }
            }
        }
    }

    /// Handles every complete request in the connection's input buffer (until the output
    /// passes the high-water mark).
    fn process_input(&mut self, slot: usize) -> Result<(), Close> {
        let EventLoop {
            conns,
            state,
            woken,
            shared,
            ..
        } = self;
        let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else {
            return Ok(());
        };
        let mut pos = conn.in_start;
        let mut handled = 0u64;
        let mut result = Ok(());
        while conn.outbuf.len() - conn.out_pos <= OUT_HIGH_WATER {
            let avail = &conn.inbuf[pos..];
            if avail.is_empty() || avail.len() < conn.need {
                break;
            }
            if !conn.validated && avail[0] != Command::Validate.byte() {
                result = Err(Close::Handshake);
                break;
            }
            match wire::parse_frame(avail) {
                Ok(Parsed::Request(req, used)) => {
                    pos += used;
                    conn.need = 0;
                    handled += 1;
                    if !conn.validated {
                        if req
                            != (Request::Validate {
                                magic: wire::VALIDATE_MAGIC,
                            })
                        {
                            result = Err(Close::Handshake);
                            break;
                        }
                        conn.validated = true;
                        continue;
                    }
                    if let Err(refusal) = state.apply(conn.id, &req, &mut conn.outbuf, woken) {
                        result = Err(Close::Refused(refusal));
                        break;
                    }
                }
                Ok(Parsed::Incomplete { needed }) => {
                    conn.need = needed;
                    break;
                }
                Err(e) => {
                    result = Err(Close::Malformed(e));
                    break;
                }
            }
        }
        conn.in_start = pos;
        conn.compact_input();
        if handled > 0 {
            shared.stats.requests.fetch_add(handled, Ordering::Relaxed);
        }
        result
    }

    /// Queues one STOP_WAITING byte for every connection whose WAIT completed.
    fn deliver_wakeups(&mut self) {
        for i in 0..self.woken.len() {
            let id = self.woken[i];
            let slot = id.slot as usize;
            if let Some(conn) = self.conn(slot) {
                if conn.id == id {
                    conn.outbuf.push(wire::WAIT_STOP_WAITING);
                    self.mark_dirty(slot);
                }
            }
        }
        self.woken.clear();
    }

    fn mark_dirty(&mut self, slot: usize) {
        if let Some(conn) = self.conn(slot) {
            if !conn.dirty {
                conn.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    fn flush_dirty(&mut self) {
        for slot in std::mem::take(&mut self.dirty) {
            if let Some(conn) = self.conn(slot) {
                conn.dirty = false;
                if conn.flush().is_err() {
                    self.close(slot, Some(Close::Io));
                }
            }
        }
    }

    fn expire_handshakes(&mut self) {
        let now = Instant::now();
        while let Some(&(deadline, id)) = self.handshake_deadlines.front() {
            if deadline > now {
                break;
            }
            self.handshake_deadlines.pop_front();
            let slot = id.slot as usize;
            let expired = self
                .conn(slot)
                .is_some_and(|conn| conn.id == id && !conn.validated);
            if expired {
                self.close(slot, Some(Close::HandshakeTimeout));
            }
        }
    }

    /// Closes a connection: its WAIT registrations go, the stored data stays.
    /// `reason` is `None` at shutdown (not counted).
    fn close(&mut self, slot: usize, reason: Option<Close>) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.state.drop_connection(conn.id);
        self.free_slots.push(slot);
        self.shared.connected.fetch_sub(1, Ordering::AcqRel);
        let stats = &self.shared.stats;
        match reason {
            None => {}
            Some(Close::PeerClosed) => {
                stats.closed_by_peer.fetch_add(1, Ordering::Relaxed);
            }
            Some(Close::Io) => {
                stats.closed_io.fetch_add(1, Ordering::Relaxed);
            }
            Some(Close::Handshake) => {
                stats.closed_handshake.fetch_add(1, Ordering::Relaxed);
            }
            Some(Close::HandshakeTimeout) => {
                stats.closed_handshake.fetch_add(1, Ordering::Relaxed);
            }
            Some(Close::Malformed(e)) => {
                stats.closed_malformed.fetch_add(1, Ordering::Relaxed);
                self.shared.record_error(format!("{e}; connection closed"));
            }
            Some(Close::Refused(r)) => {
                stats.closed_malformed.fetch_add(1, Ordering::Relaxed);
                self.shared
                    .record_error(format!("store server: {r}; connection closed"));
            }
        }
    }
}
