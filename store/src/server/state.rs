//! The store itself: key-value entries, FIFO queues and WAIT registrations, with the semantics of
//! torch's libuv TCPStore server. Pure logic, no sockets: a request goes in, reply bytes come
//! out, and the connections whose WAIT completed are reported so the event loop can notify them.

pub(crate) use super::budget::{Budget, Charge, PendingLimits};
use crate::wire::{self, Request};
// FxHasher for the key maps: short keys from cluster peers, where SipHash's DoS resistance is not
// worth its cost (docs/BENCHMARKS.md).
use rustc_hash::FxHashMap as FastMap;
use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Weak};

/// Shared, so that a large reply can be streamed out of them (see [`StoreState::stream_reply`]).
pub(crate) type Value = Arc<Vec<u8>>;
pub(crate) type Key = Arc<[u8]>;

/// Replies at least this long are streamed rather than built (see [`StoreState::should_stream`]).
pub(crate) const STREAM_REPLY_MIN: usize = 32 * 1024;

/// Pending budget one key of a WAIT registration takes beyond the key's own bytes: an estimate,
/// rounded up, of its shared copy's header, its slot in the waiters' map, its waiter list and its
/// place in the wait, with the allocator's overhead.
pub(crate) const WAIT_KEY_COST: usize = 128;

/// Maps of at least this many slots give back most of their table once three quarters are free.
const SHRINK_MIN: usize = 1024;

/// Every key of the store at one moment, shared by the LIST replies of the same keys.
pub(crate) struct KeySnapshot {
    keys: Vec<Key>,
    _charge: Charge,
}

/// What a streamed reply still has to write, in units of `prefix ‖ data` (`pos` bytes written).
pub(crate) enum StreamPart {
    /// A value (or key) with its 8-byte length, as it was when the request was applied.
    Blob { data: Value, pos: usize },
    /// Up to 8 raw bytes (the count of a LIST, a STOP_WAITING owed after the reply).
    Raw {
        bytes: [u8; 8],
        len: usize,
        pos: usize,
    },
    /// The keys of a snapshot from `next` on, each with its length.
    Keys {
        list: Arc<KeySnapshot>,
        next: usize,
        pos: usize,
    },
}

/// One unit of a streamed reply: prefix (a length or raw bytes), the prefix's length, data.
type Unit<'a> = ([u8; 8], usize, &'a [u8]);

impl StreamPart {
    /// Raw reply bytes (at most 8), queued in order with the rest.
    pub fn raw(bytes: &[u8]) -> StreamPart {
        let mut b = [0u8; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        StreamPart::Raw {
            bytes: b,
            len: bytes.len(),
            pos: 0,
        }
    }

    /// The units still to write: (prefix, prefix length, data, bytes of it already written).
    pub fn units(&self) -> impl Iterator<Item = ([u8; 8], usize, &[u8], usize)> + '_ {
        let (one, keys, pos): (Option<Unit<'_>>, &[Key], usize) = match self {
            StreamPart::Blob { data, pos } => (
                Some(((data.len() as u64).to_le_bytes(), 8, data.as_slice())),
                &[],
                *pos,
            ),
            StreamPart::Raw { bytes, len, pos } => (Some((*bytes, *len, &[][..])), &[], *pos),
            StreamPart::Keys { list, next, pos } => (None, &list.keys[*next..], *pos),
        };
        let keys = keys
            .iter()
            .map(|k| ((k.len() as u64).to_le_bytes(), 8, &k[..]));
        one.into_iter()
            .chain(keys)
            .enumerate()
            .map(move |(i, (prefix, plen, data))| {
                (prefix, plen, data, if i == 0 { pos } else { 0 })
            })
    }

    /// Marks `n` more bytes written; returns the bytes of `n` beyond this part (when it ended).
    pub fn advance(&mut self, mut n: usize) -> Option<usize> {
        loop {
            let (unit_len, pos) = match self {
                StreamPart::Blob { data, pos } => (8 + data.len(), pos),
                StreamPart::Raw { len, pos, .. } => (*len, pos),
                StreamPart::Keys { list, next, pos } => match list.keys.get(*next) {
                    Some(k) => (8 + k.len(), pos),
                    None => return Some(n),
                },
            };
            let step = n.min(unit_len - *pos);
            *pos += step;
            n -= step;
            if *pos < unit_len {
                return None;
            }
            match self {
                StreamPart::Keys { next, pos, .. } => {
                    *next += 1;
                    *pos = 0;
                }
                _ => return Some(n),
            }
        }
    }
}

/// A connection: its loop, its slot there, and a generation telling apart a slot's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConnId {
    pub shard: u32,
    pub slot: u32,
    pub gen: u32,
}

/// Why a request made the server close its connection (the store itself is left intact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// VALIDATE carried the wrong magic.
    BadMagic(u32),
    /// ADD or BARRIER hit a value that `std::stoll` rejects.
    AddNotANumber { key: Vec<u8> },
    /// `what` (a request) would take the client's pending requests, or all clients' with
    /// `all_clients`, to `bytes`, over `limit` (docs/PROTOCOL.md §1, "Pending budget").
    Pending {
        what: String,
        bytes: usize,
        limit: usize,
        all_clients: bool,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::BadMagic(m) => write!(
                f,
                "VALIDATE magic {m:#010x} is not {:#010x}",
                wire::VALIDATE_MAGIC
            ),
            Refusal::AddNotANumber { key } => write!(
                f,
                "ADD or BARRIER on key {:?} whose value is not a decimal i64",
                String::from_utf8_lossy(key)
            ),
            Refusal::Pending {
                what,
                bytes,
                limit,
                all_clients,
            } => {
                let (whose, which, flag) = match all_clients {
                    true => ("all clients'", "server's pending budget", "budget"),
                    false => ("the client's", "per-client limit", "per-client"),
                };
                write!(
                    f,
                    "{what} would make {whose} pending requests {bytes} bytes, over the {which} \
                     of {limit} (raise `nvfipc serve --pending-{flag}-mib` if clients need it)"
                )
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Waiter {
    conn: ConnId,
    wait_id: u64,
}

#[derive(Debug)]
struct PendingWait {
    id: u64,
    /// Registrations not yet consumed by a write to their key.
    missing: usize,
    /// The keys it is registered under, to unregister on CANCEL_WAIT or disconnect.
    keys: Vec<Key>,
    /// Pending budget it holds (part of its connection's charge).
    cost: usize,
}

/// A connection's unsatisfied WAITs and the pending budget they hold.
struct ConnWaits {
    list: Vec<PendingWait>,
    charge: Charge,
}

#[derive(Default)]
pub(crate) struct StoreState {
    kv: FastMap<Key, Value>,
    /// The keys LIST replies stream from, while one is being sent and no key came or went.
    keys_snapshot: Weak<KeySnapshot>,
    /// Non-empty queues only (an emptied queue is removed, so presence means "has items").
    queues: FastMap<Vec<u8>, VecDeque<Vec<u8>>>,
    waiters: FastMap<Key, Vec<Waiter>>,
    waits: FastMap<ConnId, ConnWaits>,
    next_wait_id: u64,
    /// The value of every missing key in a streamed reply.
    empty: Value,
    /// What WAIT registrations may hold.
    limits: PendingLimits,
}

impl StoreState {
    /// An empty store whose WAIT registrations are charged to `limits`.
    pub fn new(limits: PendingLimits) -> StoreState {
        StoreState {
            limits,
            ..StoreState::default()
        }
    }

    /// Applies one request from `conn`. Reply bytes (including a STOP_WAITING for `conn` itself)
    /// are appended to `out`; other connections whose WAIT completed are pushed to `woken`, each
    /// owed one [`wire::WAIT_STOP_WAITING`] byte.
    pub fn apply(
        &mut self,
        conn: ConnId,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        woken: &mut Vec<ConnId>,
    ) -> Result<(), Refusal> {
        let mut fx = Effects { conn, out, woken };
        match *req {
            Request::Validate { magic } => {
                if magic != wire::VALIDATE_MAGIC {
                    return Err(Refusal::BadMagic(magic));
                }
            }
            Request::Ping { nonce } => wire::put_u32(fx.out, nonce),
            Request::Set { key, value } => {
                self.set(key, value);
                self.notify_all(key, &mut fx);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => self.compare_set(key, expected, desired, &mut fx),
            Request::Get { key } => wire::put_blob(fx.out, self.value_or_empty(key)),
            Request::Add { key, delta } => {
                let value = self.add(key, delta)?;
                self.notify_all(key, &mut fx);
                wire::put_i64(fx.out, value);
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|k| self.present(k));
                let code = if ready {
                    wire::CHECK_READY
                } else {
                    wire::CHECK_NOT_READY
                };
                wire::put_u8(fx.out, code);
            }
            Request::Wait { keys } => self.wait(keys, &mut fx)?,
            Request::GetNumKeys => wire::put_i64(fx.out, self.kv.len() as i64),
            Request::DeleteKey { key } => {
                let removed = self.kv.remove(key).is_some();
                if removed {
                    self.keys_changed();
                    shrink_sparse(&mut self.kv);
                }
                wire::put_i64(fx.out, i64::from(removed))
            }
            Request::Append { key, value } => {
                match self.kv.get_mut(key) {
                    Some(existing) => Arc::make_mut(existing).extend_from_slice(value),
                    None => {
                        self.keys_changed();
                        self.kv.insert(Key::from(key), Arc::new(value.to_vec()));
                    }
                }
                self.notify_all(key, &mut fx);
            }
            Request::MultiGet { keys } => {
                for key in keys {
                    wire::put_blob(fx.out, self.value_or_empty(key));
                }
            }
            Request::MultiSet { pairs } => {
                for (key, value) in pairs.iter() {
                    self.set(key, value);
                    self.notify_all(key, &mut fx);
                }
            }
            Request::CancelWait => {
                self.drop_connection(conn);
                wire::put_u8(fx.out, wire::WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => {
                match self.queues.get_mut(key) {
                    Some(q) => q.push_back(value.to_vec()),
                    None => {
                        self.queues
                            .insert(key.to_vec(), VecDeque::from([value.to_vec()]));
                    }
                }
                self.notify_one(key, &mut fx);
            }
            Request::QueuePop { key } => self.queue_pop(key, fx.out),
            Request::QueueLen { key } => {
                let len = self.queues.get(key).map_or(0, VecDeque::len);
                wire::put_i64(fx.out, len as i64);
            }
            Request::List => {
                wire::put_i64(fx.out, self.kv.len() as i64);
                for key in self.kv.keys() {
                    wire::put_blob(fx.out, key);
                }
            }
            Request::Barrier { key, world_size } => self.barrier(key, world_size, &mut fx)?,
        }
        Ok(())
    }

    /// Whether the reply to `req` is at least [`STREAM_REPLY_MIN`] bytes of stored keys or
    /// values (GET, MULTI_GET, LIST, a COMPARE_SET returning the stored value), to be streamed
    /// with [`StoreState::stream_reply`] (a MULTI_GET can ask for a terabyte).
    pub fn should_stream(&self, req: &Request<'_>) -> bool {
        let value_len = |key: &[u8]| 8 + self.kv.get(key).map_or(0, |v| v.len());
        match *req {
            Request::Get { key } => value_len(key) >= STREAM_REPLY_MIN,
            Request::CompareSet { key, expected, .. } => self
                .kv
                .get(key)
                .is_some_and(|v| v.as_slice() != expected && v.len() >= STREAM_REPLY_MIN),
            Request::List => {
                reaches_stream_min(std::iter::once(8).chain(self.kv.keys().map(|k| 8 + k.len())))
            }
            Request::MultiGet { keys } => reaches_stream_min(keys.iter().map(value_len)),
            _ => false,
        }
    }

    /// Budget bytes that streaming `req` takes: the references of a MULTI_GET, or a LIST's new
    /// snapshot of the keys.
    pub fn stream_cost(&self, req: &Request<'_>) -> usize {
        match *req {
            Request::MultiGet { keys } => keys.len() * std::mem::size_of::<StreamPart>(),
            Request::List if self.keys_snapshot.strong_count() == 0 => {
                std::mem::size_of::<KeySnapshot>() + self.kv.len() * std::mem::size_of::<Key>()
            }
            _ => 0,
        }
    }

    /// The reply to a request [`StoreState::should_stream`] chose, as references to the values
    /// or keys it names as they are now. `charge` holds [`StoreState::stream_cost`] bytes: a new
    /// snapshot keeps it, else it is returned for the connection to hold until the reply is
    /// sent. A COMPARE_SET streamed here writes nothing, so it wakes no one.
    pub fn stream_reply(
        &mut self,
        req: &Request<'_>,
        out: &mut VecDeque<StreamPart>,
        charge: Charge,
    ) -> Option<Charge> {
        let value = |key: &[u8]| StreamPart::Blob {
            data: Arc::clone(self.kv.get(key).unwrap_or(&self.empty)),
            pos: 0,
        };
        match *req {
            Request::Get { key } | Request::CompareSet { key, .. } => out.push_back(value(key)),
            Request::MultiGet { keys } => out.extend(keys.iter().map(value)),
            Request::List => {
                let (list, kept) = match self.keys_snapshot.upgrade() {
                    Some(list) => (list, Some(charge)),
                    None => {
                        let list = Arc::new(KeySnapshot {
                            keys: self.kv.keys().cloned().collect(),
                            _charge: charge,
                        });
                        self.keys_snapshot = Arc::downgrade(&list);
                        (list, None)
                    }
                };
                out.push_back(StreamPart::raw(&(list.keys.len() as i64).to_le_bytes()));
                out.push_back(StreamPart::Keys {
                    list,
                    next: 0,
                    pos: 0,
                });
                return kept;
            }
            _ => {}
        }
        Some(charge)
    }

    /// About how many reply bytes `req` will produce (0 for small or no replies).
    pub fn reply_len_hint(&self, req: &Request<'_>) -> usize {
        let value_len = |key: &[u8]| 8 + self.kv.get(key).map_or(0, |v| v.len());
        match *req {
            Request::Get { key } => value_len(key),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => value_len(key).max(8 + expected.len().max(desired.len())),
            Request::MultiGet { keys } => keys.iter().map(value_len).sum(),
            Request::QueuePop { key } => {
                16 + self
                    .queues
                    .get(key)
                    .and_then(VecDeque::front)
                    .map_or(0, Vec::len)
            }
            _ => 0,
        }
    }

    /// A key was added or removed: the next LIST needs a new snapshot.
    fn keys_changed(&mut self) {
        if self.keys_snapshot.strong_count() > 0 {
            self.keys_snapshot = Weak::new();
        }
    }

    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.contains_key(key)
    }

    fn value_or_empty(&self, key: &[u8]) -> &[u8] {
        self.kv.get(key).map_or(&[][..], |v| v.as_slice())
    }

    fn set(&mut self, key: &[u8], value: &[u8]) {
        match self.kv.get_mut(key) {
            Some(existing) => overwrite(existing, value),
            None => {
                self.keys_changed();
                self.kv.insert(Key::from(key), Arc::new(value.to_vec()));
            }
        }
    }

    fn compare_set(&mut self, key: &[u8], expected: &[u8], desired: &[u8], fx: &mut Effects) {
        match self.kv.get_mut(key) {
            Some(current) if current.as_slice() == expected => {
                overwrite(current, desired);
                wire::put_blob(fx.out, desired);
            }
            Some(current) => {
                wire::put_blob(fx.out, current);
                return;
            }
            None if expected.is_empty() => {
                self.keys_changed();
                self.kv.insert(Key::from(key), Arc::new(desired.to_vec()));
                wire::put_blob(fx.out, desired);
            }
            None => {
                // torch's rule: a missing key with a non-empty `expected` returns `expected`
                // and creates nothing.
                wire::put_blob(fx.out, expected);
                return;
            }
        }
        self.notify_all(key, fx);
    }

    fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, Refusal> {
        let current = match self.kv.get(key) {
            Some(text) => {
                parse_stoll(text).ok_or_else(|| Refusal::AddNotANumber { key: key.to_vec() })?
            }
            None => 0,
        };
        // C++ signed overflow wraps in practice; do the same rather than fail.
        let value = current.wrapping_add(delta);
        let mut digits = [0u8; I64_DECIMAL_MAX];
        let text = format_i64(value, &mut digits);
        self.set(key, text);
        Ok(value)
    }

    fn wait(&mut self, keys: wire::KeyList<'_>, fx: &mut Effects) -> Result<(), Refusal> {
        // Counted first so that a satisfied WAIT (the common case) allocates nothing, and one
        // over the pending limits allocates nothing either.
        let (mut missing, mut cost) = (0, 0);
        for key in keys.iter().filter(|k| !self.present(k)) {
            missing += 1;
            cost += WAIT_KEY_COST + key.len();
        }
        if missing == 0 {
            wire::put_u8(fx.out, wire::WAIT_STOP_WAITING);
            return Ok(());
        }
        let what = || format!("a WAIT on {missing} missing keys");
        self.charge_wait(fx.conn, cost, what)?;
        let mut registered = Vec::with_capacity(missing);
        registered.extend(keys.iter().filter(|k| !self.present(k)).map(Key::from));
        self.register_wait(fx.conn, registered, cost);
        Ok(())
    }

    /// Charges a WAIT registration of `cost` bytes to `conn`'s pending limits.
    fn charge_wait(
        &mut self,
        conn: ConnId,
        cost: usize,
        what: impl FnOnce() -> String,
    ) -> Result<(), Refusal> {
        let budget = &self.limits.budget;
        let waits = self.waits.entry(conn).or_insert_with(|| ConnWaits {
            list: Vec::new(),
            charge: budget.charge(),
        });
        self.limits.grow(&mut waits.charge, cost, what)
    }

    /// Registers a WAIT already charged ([`StoreState::charge_wait`]).
    fn register_wait(&mut self, conn: ConnId, keys: Vec<Key>, cost: usize) {
        let id = self.next_wait_id;
        self.next_wait_id += 1;
        let waiter = Waiter { conn, wait_id: id };
        for key in &keys {
            match self.waiters.get_mut(&key[..]) {
                Some(list) => list.push(waiter),
                None => {
                    self.waiters.insert(Arc::clone(key), vec![waiter]);
                }
            }
        }
        if let Some(waits) = self.waits.get_mut(&conn) {
            waits.list.push(PendingWait {
                id,
                missing: keys.len(),
                keys,
                cost,
            });
        }
    }

    /// BARRIER, as docs/PROTOCOL.md §1 describes it.
    fn barrier(&mut self, key: &[u8], world_size: i64, fx: &mut Effects) -> Result<(), Refusal> {
        let count = self.add(key, 1)?;
        if count >= world_size {
            self.notify_all(key, fx);
            wire::put_u8(fx.out, wire::WAIT_STOP_WAITING);
            return Ok(());
        }
        let cost = WAIT_KEY_COST + key.len();
        self.charge_wait(fx.conn, cost, || "a BARRIER arrival".to_string())?;
        self.register_wait(fx.conn, vec![Key::from(key)], cost);
        Ok(())
    }

    /// A write to `key`: every registration under it counts down (torch's wakeupWaitingClients).
    fn notify_all(&mut self, key: &[u8], fx: &mut Effects) {
        if self.waiters.is_empty() {
            return;
        }
        if let Some(list) = self.waiters.remove(key) {
            shrink_sparse(&mut self.waiters);
            for waiter in list {
                self.count_down(waiter, fx);
            }
        }
    }

    /// A queue push: the oldest live registration under `key` counts down.
    fn notify_one(&mut self, key: &[u8], fx: &mut Effects) {
        let Some(list) = self.waiters.get_mut(key) else {
            return;
        };
        let waits = &self.waits;
        let is_live = |w: &Waiter| {
            waits
                .get(&w.conn)
                .is_some_and(|pending| pending.list.iter().any(|p| p.id == w.wait_id))
        };
        let mut next = None;
        while !list.is_empty() {
            let waiter = list.remove(0);
            if is_live(&waiter) {
                next = Some(waiter);
                break;
            }
        }
        if list.is_empty() {
            self.waiters.remove(key);
        }
        if let Some(waiter) = next {
            self.count_down(waiter, fx);
        }
    }

    fn count_down(&mut self, waiter: Waiter, fx: &mut Effects) {
        let Some(waits) = self.waits.get_mut(&waiter.conn) else {
            return;
        };
        let pending = &mut waits.list;
        let Some(i) = pending.iter().position(|w| w.id == waiter.wait_id) else {
            return;
        };
        pending[i].missing -= 1;
        if pending[i].missing > 0 {
            return;
        }
        // The (maybe empty) list stays for the connection's next WAIT to reuse.
        let done = pending.remove(i);
        waits.charge.set(waits.charge.bytes() - done.cost);
        if waiter.conn == fx.conn {
            wire::put_u8(fx.out, wire::WAIT_STOP_WAITING);
        } else {
            fx.woken.push(waiter.conn);
        }
    }

    /// Forgets every WAIT registration of `conn` (CANCEL_WAIT, or the connection went away).
    pub fn drop_connection(&mut self, conn: ConnId) {
        let Some(waits) = self.waits.remove(&conn) else {
            return;
        };
        for wait in waits.list {
            for key in wait.keys {
                if let Some(list) = self.waiters.get_mut(&key) {
                    list.retain(|w| w.conn != conn);
                    if list.is_empty() {
                        self.waiters.remove(&key);
                    }
                }
            }
        }
        shrink_sparse(&mut self.waiters);
        shrink_sparse(&mut self.waits);
    }

    fn queue_pop(&mut self, key: &[u8], out: &mut Vec<u8>) {
        let Some(queue) = self.queues.get_mut(key) else {
            wire::put_i64(out, 0);
            return;
        };
        let len_before = queue.len();
        let item = queue.pop_front().unwrap_or_default();
        if queue.is_empty() {
            self.queues.remove(key);
            shrink_sparse(&mut self.queues);
        }
        wire::put_i64(out, len_before as i64);
        wire::put_blob(out, &item);
    }
}

/// Gives back most of a map's table once it is three quarters empty: a map that grew for many
/// WAITs or keys would otherwise keep its size after they have gone.
fn shrink_sparse<K: Eq + Hash, V>(map: &mut FastMap<K, V>) {
    if map.capacity() >= SHRINK_MIN && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

fn reaches_stream_min(mut lens: impl Iterator<Item = usize>) -> bool {
    let mut total = 0;
    lens.any(|len| {
        total += len;
        total >= STREAM_REPLY_MIN
    })
}

/// Replaces a stored value, reusing its allocation unless a streamed reply still holds it.
fn overwrite(stored: &mut Value, bytes: &[u8]) {
    match Arc::get_mut(stored) {
        Some(unshared) => {
            unshared.clear();
            unshared.extend_from_slice(bytes);
        }
        None => *stored = Arc::new(bytes.to_vec()),
    }
}

/// Longest decimal form of an i64 (`-9223372036854775808`).
const I64_DECIMAL_MAX: usize = 20;

/// `value` in decimal (as `std::to_string`), at the end of `buf`: ADD's hot path, without `fmt`.
fn format_i64(value: i64, buf: &mut [u8; I64_DECIMAL_MAX]) -> &[u8] {
    let mut magnitude = value.unsigned_abs();
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if value < 0 {
        start -= 1;
        buf[start] = b'-';
    }
    &buf[start..]
}

struct Effects<'a> {
    conn: ConnId,
    out: &'a mut Vec<u8>,
    woken: &'a mut Vec<ConnId>,
}

/// `std::stoll(s)` (base 10): leading whitespace, a sign, at least one digit, anything after.
pub(crate) fn parse_stoll(s: &[u8]) -> Option<i64> {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let negative = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits_start = i;
    let mut value: i64 = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        let digit = i64::from(c - b'0');
        // Accumulate towards the sign so that i64::MIN is representable.
        value = if negative {
            value.checked_mul(10)?.checked_sub(digit)?
        } else {
            value.checked_mul(10)?.checked_add(digit)?
        };
        i += 1;
    }
    (i > digits_start).then_some(value)
}

#[cfg(test)]
mod tests;
