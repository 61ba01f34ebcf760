//! The store itself: key-value entries, FIFO queues and WAIT registrations, with the semantics of
//! torch's libuv TCPStore server. Pure logic, no sockets: a request goes in, reply bytes come
//! out, and the connections whose WAIT completed are reported so the event loop can notify them.

use crate::hash::FastMap;
use crate::store::wire::{self, Request};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// Shared, so that a large reply can be streamed out of them (see [`StoreState::stream_reply`]).
pub(crate) type Value = Arc<Vec<u8>>;
pub(crate) type Key = Arc<[u8]>;

/// Replies at least this long are streamed rather than built (see [`StoreState::should_stream`]).
pub(crate) const STREAM_REPLY_MIN: usize = 32 * 1024;

/// The reply budget of one server (docs/PROTOCOL.md §1): what replies hold beyond the stored data.
pub(crate) struct ReplyBudget {
    limit: usize,
    used: AtomicUsize,
    /// Bytes released since the last [`ReplyBudget::take_freed`] (to trim the heap after).
    freed: AtomicUsize,
    /// How many times budget was given back (parked connections then try again).
    releases: AtomicU64,
}

impl ReplyBudget {
    pub fn new(limit: usize) -> Arc<ReplyBudget> {
        Arc::new(ReplyBudget {
            limit,
            used: AtomicUsize::new(0),
            freed: AtomicUsize::new(0),
            releases: AtomicU64::new(0),
        })
    }

    /// `bytes` of the budget if they fit under the limit, or if nothing else is held (so a
    /// request larger than the whole budget is served alone rather than never).
    pub fn try_take(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used == 0 || used.saturating_add(bytes) <= self.limit).then(|| used + bytes)
            })
            .ok()?;
        Some(Charge {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// An empty charge that [`Charge::set`] grows whatever the budget holds (memory that is
    /// already there, such as unsent output).
    pub fn charge(self: &Arc<Self>) -> Charge {
        Charge {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    pub fn spent(&self) -> bool {
        self.used.load(Ordering::Acquire) >= self.limit
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub fn freed(&self) -> usize {
        self.freed.load(Ordering::Acquire)
    }

    pub fn take_freed(&self) -> usize {
        self.freed.swap(0, Ordering::AcqRel)
    }

    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Acquire)
    }

    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            self.freed.fetch_add(bytes, Ordering::AcqRel);
            self.releases.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Bytes held of a [`ReplyBudget`], given back when dropped.
pub(crate) struct Charge {
    budget: Arc<ReplyBudget>,
    bytes: usize,
}

impl Charge {
    /// Holds `bytes` from now on, whatever the budget holds.
    pub fn set(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.budget
                .used
                .fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

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
    keys: Vec<Vec<u8>>,
}

#[derive(Default)]
pub(crate) struct StoreState {
    kv: FastMap<Key, Value>,
    /// The keys LIST replies stream from, while one is being sent and no key came or went.
    keys_snapshot: Weak<KeySnapshot>,
    /// Non-empty queues only (an emptied queue is removed, so presence means "has items").
    queues: FastMap<Vec<u8>, VecDeque<Vec<u8>>>,
    waiters: FastMap<Vec<u8>, Vec<Waiter>>,
    waits: FastMap<ConnId, Vec<PendingWait>>,
    next_wait_id: u64,
    /// The value of every missing key in a streamed reply.
    empty: Value,
}

impl StoreState {
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
            Request::Wait { keys } => self.wait(keys, &mut fx),
            Request::GetNumKeys => wire::put_i64(fx.out, self.kv.len() as i64),
            Request::DeleteKey { key } => {
                let removed = self.kv.remove(key).is_some();
                if removed {
                    self.keys_changed();
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

    fn wait(&mut self, keys: wire::KeyList<'_>, fx: &mut Effects) {
        // Counted first so that a satisfied WAIT (the common case) allocates nothing.
        let missing = keys.iter().filter(|k| !self.present(k)).count();
        if missing == 0 {
            wire::put_u8(fx.out, wire::WAIT_STOP_WAITING);
            return;
        }
        let mut registered = Vec::with_capacity(missing);
        registered.extend(keys.iter().filter(|k| !self.present(k)).map(<[u8]>::to_vec));
        self.register_wait(fx.conn, registered);
    }

    fn register_wait(&mut self, conn: ConnId, keys: Vec<Vec<u8>>) {
        let id = self.next_wait_id;
        self.next_wait_id += 1;
        let waiter = Waiter { conn, wait_id: id };
        for key in &keys {
            match self.waiters.get_mut(key.as_slice()) {
                Some(list) => list.push(waiter),
                None => {
                    self.waiters.insert(key.clone(), vec![waiter]);
                }
            }
        }
        self.waits.entry(conn).or_default().push(PendingWait {
            id,
            missing: keys.len(),
            keys,
        });
    }

    /// BARRIER, as docs/PROTOCOL.md §1 describes it.
    fn barrier(&mut self, key: &[u8], world_size: i64, fx: &mut Effects) -> Result<(), Refusal> {
        let count = self.add(key, 1)?;
        if count >= world_size {
            self.notify_all(key, fx);
            wire::put_u8(fx.out, wire::WAIT_STOP_WAITING);
            return Ok(());
        }
        self.register_wait(fx.conn, vec![key.to_vec()]);
        Ok(())
    }

    /// A write to `key`: every registration under it counts down (torch's wakeupWaitingClients).
    fn notify_all(&mut self, key: &[u8], fx: &mut Effects) {
        if self.waiters.is_empty() {
            return;
        }
        if let Some(list) = self.waiters.remove(key) {
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
                .is_some_and(|pending| pending.iter().any(|p| p.id == w.wait_id))
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
        let Some(pending) = self.waits.get_mut(&waiter.conn) else {
            return;
        };
        let Some(i) = pending.iter().position(|w| w.id == waiter.wait_id) else {
            return;
        };
        pending[i].missing -= 1;
        if pending[i].missing > 0 {
            return;
        }
        // The (maybe empty) list stays for the connection's next WAIT to reuse.
        pending.remove(i);
        if waiter.conn == fx.conn {
            wire::put_u8(fx.out, wire::WAIT_STOP_WAITING);
        } else {
            fx.woken.push(waiter.conn);
        }
    }

    /// Forgets every WAIT registration of `conn` (CANCEL_WAIT, or the connection went away).
    pub fn drop_connection(&mut self, conn: ConnId) {
        let Some(pending) = self.waits.remove(&conn) else {
            return;
        };
        for wait in pending {
            for key in wait.keys {
                if let Some(list) = self.waiters.get_mut(&key) {
                    list.retain(|w| w.conn != conn);
                    if list.is_empty() {
                        self.waiters.remove(&key);
                    }
                }
            }
        }
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
        }
        wire::put_i64(out, len_before as i64);
        wire::put_blob(out, &item);
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
