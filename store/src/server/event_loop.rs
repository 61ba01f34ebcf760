//! A server thread: one edge-triggered mio loop over its share of the clients (the first loop
//! also accepts). Requests are applied under the store's mutex, one batch per connection turn;
//! streaming, the high-water mark and the reply budget are described in docs/PROTOCOL.md §1.
//!
//! A WAIT completed for a connection of another loop: its STOP_WAITING byte goes into that loop's
//! mailbox while the writer still holds the store, and every loop empties its mailbox under the
//! store before applying anything, so the byte precedes any later reply to that connection (a
//! CANCEL_WAIT answered `00 01`, never `01` then `00`).

use super::state::{ConnId, StoreState, StreamPart};
use super::{lock, ServerOptions, Shared};
use crate::wire::{self, Command, Parsed, Request};
use mio::net::{TcpListener, TcpStream};
use mio::Waker;
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::connection::{reserve_output, BufPool, Close, Conn, LARGE, READ_BUDGET};

pub(super) const LISTENER: Token = Token(0);
pub(super) const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How often connections waiting for reply budget look whether some was given back.
const PARKED_RETRY: Duration = Duration::from_millis(5);
/// Reply or pending budget given back after which freed heap memory is returned to the system.
const TRIM_AFTER: usize = 8 << 20;

// Every structure guarded here stays consistent between statements: `lock` ignores poisoning.

/// What other threads hand to one loop: STOP_WAITING bytes owed to its connections, new ones.
pub(super) struct Shard {
    /// Pushed only while holding the store's mutex (see the module docs).
    mail: Mutex<Vec<ConnId>>,
    has_mail: AtomicBool,
    arrivals: Mutex<Vec<TcpStream>>,
    pub(super) waker: Waker,
}

impl Shard {
    pub(super) fn new(waker: Waker) -> Shard {
        Shard {
            mail: Mutex::new(Vec::new()),
            has_mail: AtomicBool::new(false),
            arrivals: Mutex::new(Vec::new()),
            waker,
        }
    }
}

pub(super) struct EventLoop {
    pub(super) index: usize,
    poll: Poll,
    /// The first loop accepts and deals the connections out in turn.
    listener: Option<TcpListener>,
    next_target: usize,
    /// Loops whose mailbox this batch wrote to; woken once the store is released.
    to_wake: Vec<bool>,
    shared: Arc<Shared>,
    handshake_timeout: Option<Duration>,
    busy_poll: Duration,
    conns: Vec<Option<Conn>>,
    free_slots: Vec<usize>,
    next_gen: u32,
    pool: BufPool,
    /// Connections owed a STOP_WAITING byte by the request being handled.
    woken: Vec<ConnId>,
    /// Connections with output to flush at the end of this turn.
    dirty: Vec<usize>,
    /// Connections that used up their read budget and must be serviced again.
    again: Vec<usize>,
    /// Connections waiting for reply budget, and the budget's release count when they were
    /// last tried.
    parked: Vec<usize>,
    parked_at_release: u64,
    /// Unvalidated connections in accept order, with their handshake deadline.
    handshake_deadlines: VecDeque<(Instant, ConnId)>,
    accept_paused_until: Option<Instant>,
    /// When the last line about refused or delayed clients went to stderr.
    last_limit_log: Option<Instant>,
    last_bad_client_log: Option<Instant>,
}

impl EventLoop {
    pub(super) fn new(
        index: usize,
        poll: Poll,
        mut listener: Option<TcpListener>,
        shared: Arc<Shared>,
        opts: &ServerOptions,
    ) -> io::Result<EventLoop> {
        if let Some(listener) = listener.as_mut() {
            poll.registry()
                .register(listener, LISTENER, Interest::READABLE)?;
        }
        let shards = shared.shards.len();
        Ok(EventLoop {
            index,
            poll,
            listener,
            next_target: index,
            to_wake: vec![false; shards],
            shared,
            handshake_timeout: opts.handshake_timeout,
            busy_poll: opts.busy_poll,
            conns: Vec::new(),
            free_slots: Vec::new(),
            next_gen: 0,
            pool: BufPool::default(),
            woken: Vec::new(),
            dirty: Vec::new(),
            again: Vec::new(),
            parked: Vec::new(),
            parked_at_release: 0,
            handshake_deadlines: VecDeque::new(),
            accept_paused_until: None,
            last_limit_log: None,
            last_bad_client_log: None,
        })
    }

    /// Runs until the stop flag is set (or polling itself fails, which is recorded).
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_activity: Option<Instant> = None;
        while !self.shared.stop.load(Ordering::Acquire) {
            let spinning = last_activity.is_some_and(|t| t.elapsed() < self.busy_poll);
            let timeout = if spinning {
                Some(Duration::ZERO)
            } else {
                self.poll_timeout()
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                self.shared
                    .record_error(format!("store server: poll failed, stopping: {e}"));
                break;
            }
            if !events.is_empty() {
                last_activity = Some(Instant::now());
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {
                        let arrivals = &self.shared.shards[self.index].arrivals;
                        let arrived = std::mem::take(&mut *lock(arrivals));
                        for stream in arrived {
                            self.add_connection(stream);
                        }
                        if self.shared.shards[self.index]
                            .has_mail
                            .load(Ordering::Acquire)
                        {
                            let shared = Arc::clone(&self.shared);
                            let state = lock(&shared.state);
                            self.collect_mail(&state);
                        }
                    }
                    Token(t) => {
                        let slot = t - FIRST_CONN;
                        if event.is_read_closed() || event.is_error() {
                            if let Some(conn) = self.conn(slot) {
                                conn.peer_closing = true;
                            }
                        }
                        self.service(slot);
                    }
                }
            }
            for slot in std::mem::take(&mut self.again) {
                if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                    conn.again = false;
                    self.service(slot);
                }
            }
            self.retry_parked();
            for budget in [&self.shared.budget, &self.shared.pending.budget] {
                if budget.freed() >= TRIM_AFTER {
                    budget.take_freed();
                    super::heap::release_free_heap();
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
        if !self.parked.is_empty() {
            return Some(PARKED_RETRY);
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

    /// Serves the connections waiting for reply budget again once some was given back, oldest
    /// first (those still short of it park again, in the same order).
    fn retry_parked(&mut self) {
        let releases = self.shared.budget.releases();
        if self.parked.is_empty() || releases == self.parked_at_release {
            return;
        }
        self.parked_at_release = releases;
        for slot in std::mem::take(&mut self.parked) {
            if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                conn.parked = false;
                self.service(slot);
            }
        }
    }

    fn conn(&mut self, slot: usize) -> Option<&mut Conn> {
        self.conns.get_mut(slot).and_then(Option::as_mut)
    }

    fn accept_all(&mut self) {
        if self.accept_paused_until.is_some() {
            return;
        }
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            match listener.accept() {
                Ok((stream, peer)) => {
                    let max = self.shared.max_connections;
                    if self.shared.connected.load(Ordering::Acquire) >= max {
                        drop(stream);
                        self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                        self.limit_log(format!(
                            "store server: refused a client from {peer}: {max} clients are \
                             connected, the most this server takes (its open-file limit); \
                             it may retry once others leave"
                        ));
                        continue;
                    }
                    self.deal(stream)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.shared
                        .stats
                        .accept_errors
                        .fetch_add(1, Ordering::Relaxed);
                    let out_of_resources = crate::net::is_out_of_descriptors(&e);
                    if out_of_resources {
                        // The pending connection stays in the backlog; try again shortly.
                        self.limit_log(format!(
                            "store server: accept failed ({e}); clients wait in the listen \
                             backlog until descriptors are free (raise `ulimit -n`)"
                        ));
                        self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                        return;
                    }
                    // Per-connection failures (e.g. ECONNABORTED): move on to the next one.
                }
            }
        }
    }

    /// A problem with the connection limit: a WARN line at most once a second (a client
    /// retrying in a loop must not flood the log), and the server's last error.
    fn limit_log(&mut self, message: String) {
        warn_at_most_every_second(&mut self.last_limit_log, &message);
        self.shared.record_error(message);
    }

    /// Gives a new connection to the next loop in turn.
    fn deal(&mut self, stream: TcpStream) {
        let shards = &self.shared.shards;
        let target = self.next_target % shards.len();
        self.next_target = self.next_target.wrapping_add(1);
        if target == self.index {
            self.add_connection(stream);
            return;
        }
        lock(&shards[target].arrivals).push(stream);
        if let Err(e) = shards[target].waker.wake() {
            self.shared
                .record_error(format!("store server: cannot wake loop {target}: {e}"));
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
            shard: self.index as u32,
            slot: slot as u32,
            gen: self.next_gen,
        };
        self.conns[slot] = Some(Conn {
            stream,
            id,
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            need: 0,
            in_charge: self.shared.pending.budget.charge(),
            outbuf: Vec::new(),
            out_pos: 0,
            streaming: VecDeque::new(),
            stream_charge: None,
            out_charge: self.shared.budget.charge(),
            parked: false,
            validated: false,
            eof: false,
            peer_closing: false,
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
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                return;
            };
            if conn.flush(&mut self.pool).is_err() {
                self.close(slot, Some(Close::Io));
                return;
            }
            if conn.blocked(&self.shared.budget) {
                // Resumed by the WRITABLE edge once the peer reads, or (parked) once budget
                // was given back.
                self.park_if_waiting(slot);
                return;
            }
            if let Err(reason) = self.process_input(slot) {
                if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                    // Best effort: replies to the valid requests before the bad one.
                    let _ = conn.flush(&mut self.pool);
                }
                self.close(slot, Some(reason));
                return;
            }
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                return;
            };
            if conn.parked {
                return;
            }
            if conn.blocked(&self.shared.budget) {
                continue;
            }
            if conn.eof {
                let _ = conn.flush(&mut self.pool);
                self.close(slot, Some(Close::PeerClosed));
                return;
            }
            if budget == 0 {
                enlist(&mut conn.again, &mut self.again, slot);
                self.mark_dirty(slot);
                return;
            }
            if let Err(refusal) = conn.make_room(&mut self.pool, &self.shared.pending) {
                self.close(slot, Some(Close::Refused(refusal)));
                return;
            }
            match conn.read_some() {
                Ok((0, _)) => conn.eof = true,
                Ok((n, drained)) => {
                    budget = budget.saturating_sub(n);
                    if drained {
                        self.drained(slot);
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if conn.flush(&mut self.pool).is_err() {
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

    /// The socket has no more input for now: handle what was read and send the replies.
    fn drained(&mut self, slot: usize) {
        let result = self.process_input(slot);
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let flushed = conn.flush(&mut self.pool);
        let blocked = conn.blocked(&self.shared.budget) || conn.parked;
        match (result, flushed) {
            (Err(reason), _) => self.close(slot, Some(reason)),
            (Ok(()), Err(_)) => self.close(slot, Some(Close::Io)),
            // Input left over the high-water mark with room to write again: keep going.
            (Ok(()), Ok(())) if !blocked && conn.in_end - conn.in_start >= conn.need.max(1) => {
                enlist(&mut conn.again, &mut self.again, slot)
            }
            (Ok(()), Ok(())) => {}
        }
    }

    /// Handles every complete request in the connection's input buffer (until the output
    /// passes the high-water mark), holding the store for the whole batch.
    fn process_input(&mut self, slot: usize) -> Result<(), Close> {
        let shared = Arc::clone(&self.shared);
        let mut state = lock(&shared.state);
        if shared.shards[self.index].has_mail.load(Ordering::Acquire) {
            self.collect_mail(&state);
        }
        let result = self.apply_batch(slot, &mut state);
        self.route_wakeups(&shared);
        drop(state);
        self.wake_loops();
        result
    }

    fn apply_batch(&mut self, slot: usize, state: &mut StoreState) -> Result<(), Close> {
        let EventLoop {
            conns,
            woken,
            shared,
            pool,
            parked,
            ..
        } = self;
        let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else {
            return Ok(());
        };
        let mut pos = conn.in_start;
        let mut handled = 0u64;
        let mut result = Ok(());
        let budget = &shared.budget;
        while !conn.blocked(budget) {
            let avail = &conn.inbuf[pos..conn.in_end];
            if avail.is_empty() || avail.len() < conn.need {
                break;
            }
            if !conn.validated && avail[0] != Command::Validate.byte() {
                result = Err(Close::Handshake);
                break;
            }
            match wire::parse_frame(avail) {
                Ok(Parsed::Request(req, used)) => {
                    let streamed = conn.validated && state.should_stream(&req);
                    let charge = if streamed {
                        let cost = state.stream_cost(&req);
                        match budget.try_take(cost) {
                            Some(charge) => Some(charge),
                            None => {
                                // Left unparsed until budget is given back.
                                enlist(&mut conn.parked, parked, slot);
                                break;
                            }
                        }
                    } else {
                        None
                    };
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
                    if let Some(charge) = charge {
                        conn.stream_charge = state.stream_reply(&req, &mut conn.streaming, charge);
                        continue;
                    }
                    if !pool.is_empty() {
                        let reply_len = state.reply_len_hint(&req);
                        if reply_len >= LARGE {
                            reserve_output(&mut conn.outbuf, &mut conn.out_pos, pool, reply_len);
                        }
                    }
                    if let Err(refusal) = state.apply(conn.id, &req, &mut conn.outbuf, woken) {
                        result = Err(Close::Refused(refusal));
                        break;
                    }
                }
                Ok(Parsed::Incomplete { needed }) => {
                    let command = Command::from_byte(avail[0]).map_or("?", Command::name);
                    if let Err(refusal) = shared.pending.frame(command, needed) {
                        result = Err(Close::Refused(refusal));
                    }
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
        conn.compact_input(pool);
        conn.sync_charge();
        if conn.waits_for_budget(budget) {
            enlist(&mut conn.parked, parked, slot);
        }
        if handled > 0 {
            shared.stats.requests.fetch_add(handled, Ordering::Relaxed);
        }
        result
    }

    /// With the store held: STOP_WAITING bytes for this loop's connections go out with their
    /// next flush; those for other loops go to their mailboxes (woken after the store is
    /// released).
    fn route_wakeups(&mut self, shared: &Shared) {
        let mut i = 0;
        while i < self.woken.len() {
            let id = self.woken[i];
            let shard = id.shard as usize;
            if shard == self.index {
                i += 1;
                continue;
            }
            self.woken.swap_remove(i);
            if let Some(target) = shared.shards.get(shard) {
                lock(&target.mail).push(id);
                target.has_mail.store(true, Ordering::Release);
                self.to_wake[shard] = true;
            }
        }
        self.deliver_wakeups();
    }

    fn wake_loops(&mut self) {
        for shard in 0..self.to_wake.len() {
            if std::mem::take(&mut self.to_wake[shard]) {
                if let Err(e) = self.shared.shards[shard].waker.wake() {
                    self.shared
                        .record_error(format!("store server: cannot wake loop {shard}: {e}"));
                }
            }
        }
    }

    /// With the store held: takes the STOP_WAITING bytes other loops owe this loop's
    /// connections.
    fn collect_mail(&mut self, _store_held: &StoreState) {
        let shard = &self.shared.shards[self.index];
        let mail = std::mem::take(&mut *lock(&shard.mail));
        shard.has_mail.store(false, Ordering::Release);
        self.woken.extend(mail);
        self.deliver_wakeups();
    }

    /// Queues one STOP_WAITING byte for every connection of this loop whose WAIT completed.
    fn deliver_wakeups(&mut self) {
        for i in 0..self.woken.len() {
            let id = self.woken[i];
            let slot = id.slot as usize;
            if let Some(conn) = self.conn(slot) {
                if conn.id == id {
                    if conn.streaming.is_empty() {
                        conn.outbuf.push(wire::WAIT_STOP_WAITING);
                    } else {
                        // Owed after the reply being streamed: queued behind it, as raw bytes
                        // (a blob whose length header counts as written).
                        conn.streaming
                            .push_back(StreamPart::raw(&[wire::WAIT_STOP_WAITING]));
                    }
                    self.mark_dirty(slot);
                }
            }
        }
        self.woken.clear();
    }

    /// Parks a connection whose input waits for reply budget (nothing else would resume it).
    fn park_if_waiting(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if conn.waits_for_budget(&self.shared.budget) {
            enlist(&mut conn.parked, &mut self.parked, slot);
        }
    }

    fn mark_dirty(&mut self, slot: usize) {
        if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
            enlist(&mut conn.dirty, &mut self.dirty, slot);
        }
    }

    fn flush_dirty(&mut self) {
        for slot in std::mem::take(&mut self.dirty) {
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            conn.dirty = false;
            let was_blocked = conn.blocked(&self.shared.budget);
            if conn.flush(&mut self.pool).is_err() {
                self.close(slot, Some(Close::Io));
                continue;
            }
            // Input left unprocessed while the output was over the mark: no further readiness
            // event may come for it, so service it on the next turn.
            if was_blocked && !conn.blocked(&self.shared.budget) {
                enlist(&mut conn.again, &mut self.again, slot);
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
        lock(&self.shared.state).drop_connection(conn.id);
        let client = conn.stream.peer_addr();
        self.free_slots.push(slot);
        self.shared.connected.fetch_sub(1, Ordering::AcqRel);
        let stats = &self.shared.stats;
        let counter = match &reason {
            None => return,
            Some(Close::PeerClosed) => &stats.closed_by_peer,
            Some(Close::Io) => &stats.closed_io,
            Some(Close::Handshake | Close::HandshakeTimeout) => &stats.closed_handshake,
            Some(Close::Malformed(_) | Close::Refused(_)) => &stats.closed_malformed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let why = match reason {
            None | Some(Close::PeerClosed | Close::Io) => return,
            Some(Close::Handshake) => "a client's first message was not the TCPStore VALIDATE \
                                       handshake (not a c10d client?)"
                .to_string(),
            Some(Close::HandshakeTimeout) => "a client sent no complete handshake in time".into(),
            Some(Close::Malformed(e)) => e.to_string(),
            Some(Close::Refused(r)) => r.to_string(),
        };
        // A broken or hostile client: logged like `limit_log`.
        let client = client.map_or_else(|e| format!("(address unknown: {e})"), |a| a.to_string());
        let message = format!("store server: client {client}: {why}; connection closed");
        warn_at_most_every_second(&mut self.last_bad_client_log, &message);
        self.shared.record_error(message);
    }
}

fn warn_at_most_every_second(last: &mut Option<Instant>, message: &str) {
    let now = Instant::now();
    if !last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
        *last = Some(now);
        log::warn!(target: crate::SERVER_LOG_TARGET, "{message}");
    }
}

fn enlist(on_list: &mut bool, list: &mut Vec<usize>, slot: usize) {
    if !std::mem::replace(on_list, true) {
        list.push(slot);
    }
}
