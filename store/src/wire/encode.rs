//! Encoders: raw fields (`put_*`, used for replies too) and whole requests (`encode_*`).

use super::*;
use crate::error::Result;

pub fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// `u64 len ‖ bytes`.
pub fn put_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Bytes that can be written as a wire string without first being copied into one buffer.
pub trait WireBytes {
    fn wire_len(&self) -> usize;
    fn write_bytes(&self, out: &mut Vec<u8>);
}

impl<T: AsRef<[u8]> + ?Sized> WireBytes for T {
    fn wire_len(&self) -> usize {
        self.as_ref().len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_ref());
    }
}

/// A key written as `prefix ‖ rest` (torch's client puts "/" before every user key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefixed<'a> {
    pub prefix: &'a [u8],
    pub rest: &'a [u8],
}

impl<'a> Prefixed<'a> {
    pub fn new(
        prefix: &'a (impl AsRef<[u8]> + ?Sized),
        rest: &'a (impl AsRef<[u8]> + ?Sized),
    ) -> Self {
        Prefixed {
            prefix: prefix.as_ref(),
            rest: rest.as_ref(),
        }
    }
}

impl WireBytes for Prefixed<'_> {
    fn wire_len(&self) -> usize {
        self.prefix.len() + self.rest.len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.prefix);
        out.extend_from_slice(self.rest);
    }
}

// Request encoders append one whole request to `out`, or check a limit and leave it untouched.

/// `u64 len ‖ bytes` of a key (`field` "key") or a value, checked against the server's limit.
pub(super) fn put_field<V: WireBytes + ?Sized>(
    out: &mut Vec<u8>,
    command: Command,
    field: &str,
    value: &V,
) -> Result<()> {
    let len = value.wire_len();
    let limit = if field == "key" {
        MAX_KEY_LEN
    } else {
        MAX_VALUE_LEN
    };
    if len > limit {
        return Err(Error::invalid(format!(
            "TCPStore {command} {field} is {len} bytes, over the server limit of {limit} bytes \
             (torch's default server closes the connection); use a shorter {field}"
        )));
    }
    put_u64(out, len as u64);
    value.write_bytes(out);
    Ok(())
}

/// Runs `body` after the command byte; on error restores `out` to its previous length.
pub(super) fn framed(
    out: &mut Vec<u8>,
    command: Command,
    body: impl FnOnce(&mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let start = out.len();
    out.push(command.byte());
    let result = body(out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// `u64 count ‖ items`, each written by `put`, with the count checked against the limit.
fn put_counted<T>(
    out: &mut Vec<u8>,
    command: Command,
    what: &str,
    items: impl IntoIterator<Item = T>,
    mut put: impl FnMut(&mut Vec<u8>, T) -> Result<()>,
) -> Result<()> {
    let count_at = out.len();
    put_u64(out, 0);
    let mut count = 0usize;
    for item in items {
        put(out, item)?;
        count += 1;
    }
    if count > MAX_KEY_COUNT {
        return Err(Error::invalid(format!(
            "TCPStore {command} names {count} {what}, over the server limit of {MAX_KEY_COUNT}; \
             split the request"
        )));
    }
    out[count_at..count_at + 8].copy_from_slice(&(count as u64).to_le_bytes());
    Ok(())
}

/// `VALIDATE` with [`VALIDATE_MAGIC`]; must be the first request on a connection. No reply.
pub fn encode_validate(out: &mut Vec<u8>) {
    out.push(Command::Validate.byte());
    put_u32(out, VALIDATE_MAGIC);
}

/// `PING nonce`; the server echoes the nonce.
pub fn encode_ping(out: &mut Vec<u8>, nonce: u32) {
    out.push(Command::Ping.byte());
    put_u32(out, nonce);
}

/// Declares the encoders of requests of one shape: bare, key, key and value, or key list.
macro_rules! encoders {
    (bare: $($(#[$doc:meta])* $name:ident = $command:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(out: &mut Vec<u8>) {
            out.push(Command::$command.byte());
        }
    )*};
    (key: $($(#[$doc:meta])* $name:ident = $command:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K) -> Result<()> {
            framed(out, Command::$command, |out| {
                put_field(out, Command::$command, "key", key)
            })
        }
    )*};
    (key_value: $($(#[$doc:meta])* $name:ident = $command:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<K, V>(out: &mut Vec<u8>, key: &K, value: &V) -> Result<()>
        where
            K: WireBytes + ?Sized,
            V: WireBytes + ?Sized,
        {
            framed(out, Command::$command, |out| {
                put_field(out, Command::$command, "key", key)?;
                put_field(out, Command::$command, "value", value)
            })
        }
    )*};
    (keys: $($(#[$doc:meta])* $name:ident = $command:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<I, K>(out: &mut Vec<u8>, keys: I) -> Result<()>
        where
            I: IntoIterator<Item = K>,
            K: WireBytes,
        {
            framed(out, Command::$command, |out| {
                put_counted(out, Command::$command, "keys", keys, |out, key| {
                    put_field(out, Command::$command, "key", &key)
                })
            })
        }
    )*};
}

encoders! {bare:
    /// `GETNUMKEYS`; reply: i64.
    encode_get_num_keys = GetNumKeys;
    /// `CANCEL_WAIT`; reply: [`WAIT_CANCELED`] (possibly preceded by a late [`WAIT_STOP_WAITING`]).
    encode_cancel_wait = CancelWait;
    /// `LIST`; reply: i64 count and that many keys (wire form).
    encode_list = List;
}

encoders! {key:
    /// `GET key`; reply: a blob (empty when the key is missing on a libuv server).
    encode_get = Get;
    /// `DELETE_KEY key`; reply: i64 0 or 1.
    encode_delete_key = DeleteKey;
    /// `QUEUE_POP key`; reply: i64 length before the pop, then a blob when it was positive.
    encode_queue_pop = QueuePop;
    /// `QUEUE_LEN key`; reply: i64.
    encode_queue_len = QueueLen;
}

encoders! {key_value:
    /// `SET key value`. No reply.
    encode_set = Set;
    /// `APPEND key data`. No reply.
    encode_append = Append;
    /// `QUEUE_PUSH key value`. No reply.
    encode_queue_push = QueuePush;
}

encoders! {keys:
    /// `CHECK keys`; reply: [`CHECK_READY`] or [`CHECK_NOT_READY`].
    encode_check = Check;
    /// `WAIT keys`; reply: [`WAIT_STOP_WAITING`] once every key exists.
    encode_wait = Wait;
    /// `MULTI_GET keys`; reply: one blob per key, in order.
    encode_multi_get = MultiGet;
}

/// `COMPARE_SET key expected desired`; reply: a blob.
pub fn encode_compare_set<K, E, D>(
    out: &mut Vec<u8>,
    key: &K,
    expected: &E,
    desired: &D,
) -> Result<()>
where
    K: WireBytes + ?Sized,
    E: WireBytes + ?Sized,
    D: WireBytes + ?Sized,
{
    framed(out, Command::CompareSet, |out| {
        put_field(out, Command::CompareSet, "key", key)?;
        put_field(out, Command::CompareSet, "expected value", expected)?;
        put_field(out, Command::CompareSet, "desired value", desired)
    })
}

/// `ADD key delta`; reply: the new value as i64.
pub fn encode_add<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K, delta: i64) -> Result<()> {
    framed(out, Command::Add, |out| {
        put_field(out, Command::Add, "key", key)?;
        put_i64(out, delta);
        Ok(())
    })
}

/// `MULTI_SET pairs`. No reply.
pub fn encode_multi_set<I, K, V>(out: &mut Vec<u8>, pairs: I) -> Result<()>
where
    I: IntoIterator<Item = (K, V)>,
    K: WireBytes,
    V: WireBytes,
{
    framed(out, Command::MultiSet, |out| {
        put_counted(
            out,
            Command::MultiSet,
            "pairs",
            pairs,
            |out, (key, value)| {
                put_field(out, Command::MultiSet, "key", &key)?;
                put_field(out, Command::MultiSet, "value", &value)
            },
        )
    })
}
