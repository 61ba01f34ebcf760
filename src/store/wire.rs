//! PyTorch TCPStore wire protocol, current generation (torch >= 2.2, `VALIDATE` = 0, through
//! torch 2.15's `BARRIER` = 18).
//!
//! Everything is little-endian; lengths and counts are u64; a string or blob is `u64 len ‖ bytes`
//! and a key list is `u64 count ‖ count × blob`. There is no framing header: a request is one
//! command byte followed by its arguments, so the parser must cope with partial and pipelined
//! requests. The limits are those of torch's default (libuv) server, which closes the connection
//! when a request exceeds them.
//!
//! - [`parse_request`] / [`parse_frame`]: incremental, zero-copy request parser.
//! - `encode_*`: request encoders (limit-checked) writing into a `Vec<u8>`.
//! - `put_*`: raw encoders for response fields.
//! - `decode_*` (byte slices, incremental) and `read_*` (blocking `Read`): response decoders.

use crate::error::{Error, Result};
use std::fmt;
use std::io::{self, Read};

/// The u32 that must follow the first `VALIDATE` byte of every connection.
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;
/// Longest key the libuv server accepts, in bytes.
pub const MAX_KEY_LEN: usize = 8192;
/// Longest value (SET/APPEND/COMPARE_SET/MULTI_SET/QUEUE_PUSH payload) the libuv server accepts.
pub const MAX_VALUE_LEN: usize = 8 * 1024 * 1024;
/// Most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET request.
pub const MAX_KEY_COUNT: usize = 131_072;
/// Largest blob the response decoders accept. A classic torch server has no value limit, so this
/// is well above [`MAX_VALUE_LEN`]; it only rejects a corrupt length before reading forever.
pub const MAX_REPLY_BLOB_LEN: u64 = 1 << 32;

/// CHECK reply: every key exists.
pub const CHECK_READY: u8 = 0x00;
/// CHECK reply: at least one key is missing.
pub const CHECK_NOT_READY: u8 = 0x01;
/// WAIT reply: every awaited key exists now.
pub const WAIT_STOP_WAITING: u8 = 0x00;
/// CANCEL_WAIT reply.
pub const WAIT_CANCELED: u8 = 0x01;

/// Command bytes (`c10d::detail::QueryType`), current numbering.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Validate = 0,
    Set = 1,
    CompareSet = 2,
    Get = 3,
    Add = 4,
    Check = 5,
    Wait = 6,
    GetNumKeys = 7,
    DeleteKey = 8,
    Append = 9,
    MultiGet = 10,
    MultiSet = 11,
    CancelWait = 12,
    Ping = 13,
    QueuePush = 14,
    QueuePop = 15,
    QueueLen = 16,
    List = 17,
    Barrier = 18,
}

impl Command {
    /// Every command, in byte order.
    pub const ALL: [Command; 19] = [
        Command::Validate,
        Command::Set,
        Command::CompareSet,
        Command::Get,
        Command::Add,
        Command::Check,
        Command::Wait,
        Command::GetNumKeys,
        Command::DeleteKey,
        Command::Append,
        Command::MultiGet,
        Command::MultiSet,
        Command::CancelWait,
        Command::Ping,
        Command::QueuePush,
        Command::QueuePop,
        Command::QueueLen,
        Command::List,
        Command::Barrier,
    ];

    /// The command for a wire byte, or `None` for an unknown byte (19 and above).
    pub fn from_byte(byte: u8) -> Option<Command> {
        Command::ALL.get(usize::from(byte)).copied()
    }

    /// The wire byte.
    pub fn byte(self) -> u8 {
        self as u8
    }

    /// The upper-case name torch uses.
    pub fn name(self) -> &'static str {
        match self {
            Command::Validate => "VALIDATE",
            Command::Set => "SET",
            Command::CompareSet => "COMPARE_SET",
            Command::Get => "GET",
            Command::Add => "ADD",
            Command::Check => "CHECK",
            Command::Wait => "WAIT",
            Command::GetNumKeys => "GETNUMKEYS",
            Command::DeleteKey => "DELETE_KEY",
            Command::Append => "APPEND",
            Command::MultiGet => "MULTI_GET",
            Command::MultiSet => "MULTI_SET",
            Command::CancelWait => "CANCEL_WAIT",
            Command::Ping => "PING",
            Command::QueuePush => "QUEUE_PUSH",
            Command::QueuePop => "QUEUE_POP",
            Command::QueueLen => "QUEUE_LEN",
            Command::List => "LIST",
            Command::Barrier => "BARRIER",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What was wrong with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The command byte is not a known command.
    UnknownCommand(u8),
    /// A length field is larger than the limit.
    TooLong { len: u64, limit: u64 },
    /// A count field is larger than the limit.
    TooMany { count: u64, limit: u64 },
    /// A signed count or length in a reply is negative.
    Negative(i64),
}

/// A malformed frame: which command, which field, and which limit it broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The command being parsed (`None` when the command byte itself is unknown).
    pub command: Option<Command>,
    /// The field that broke the rule ("key", "value", "key count", "reply value", ...).
    pub field: &'static str,
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cmd = self.command.map_or("?", Command::name);
        match self.kind {
            ParseErrorKind::UnknownCommand(byte) => write!(
                f,
                "malformed TCPStore frame: unknown command byte {byte} (known commands are 0..=17)"
            ),
            ParseErrorKind::TooLong { len, limit } => write!(
                f,
                "malformed TCPStore frame: {cmd} {} is {len} bytes, over the limit of {limit} bytes",
                self.field
            ),
            ParseErrorKind::TooMany { count, limit } => write!(
                f,
                "malformed TCPStore frame: {cmd} {} is {count}, over the limit of {limit}",
                self.field
            ),
            ParseErrorKind::Negative(v) => write!(
                f,
                "malformed TCPStore frame: {cmd} {} is negative ({v})",
                self.field
            ),
        }
    }
}

impl std::error::Error for ParseError {}

impl From<ParseError> for Error {
    fn from(e: ParseError) -> Error {
        Error::protocol(e.to_string())
    }
}

impl From<ParseError> for io::Error {
    fn from(e: ParseError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// A list of keys inside a parsed frame: `count` validated blobs, decoded lazily (no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyList<'a> {
    count: usize,
    /// `count × (u64 len ‖ bytes)`, already validated.
    raw: &'a [u8],
}

impl<'a> KeyList<'a> {
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The keys, in wire order.
    pub fn iter(&self) -> BlobIter<'a> {
        BlobIter {
            remaining: self.count,
            raw: self.raw,
        }
    }
}

impl<'a> IntoIterator for KeyList<'a> {
    type Item = &'a [u8];
    type IntoIter = BlobIter<'a>;
    fn into_iter(self) -> BlobIter<'a> {
        self.iter()
    }
}

/// Iterator over validated `u64 len ‖ bytes` blobs.
#[derive(Clone, Debug)]
pub struct BlobIter<'a> {
    remaining: usize,
    raw: &'a [u8],
}

impl<'a> Iterator for BlobIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.remaining == 0 || self.raw.len() < 8 {
            return None;
        }
        let (len_bytes, rest) = self.raw.split_at(8);
        let len = usize::try_from(le_u64(len_bytes)).ok()?;
        if rest.len() < len {
            return None;
        }
        let (blob, rest) = rest.split_at(len);
        self.raw = rest;
        self.remaining -= 1;
        Some(blob)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining))
    }
}

/// The key/value pairs of a MULTI_SET, decoded lazily.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairList<'a> {
    count: usize,
    raw: &'a [u8],
}

impl<'a> PairList<'a> {
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The (key, value) pairs, in wire order.
    pub fn iter(&self) -> PairIter<'a> {
        PairIter {
            blobs: BlobIter {
                remaining: self.count.saturating_mul(2),
                raw: self.raw,
            },
        }
    }
}

impl<'a> IntoIterator for PairList<'a> {
    type Item = (&'a [u8], &'a [u8]);
    type IntoIter = PairIter<'a>;
    fn into_iter(self) -> PairIter<'a> {
        self.iter()
    }
}

/// Iterator over the pairs of a [`PairList`].
#[derive(Clone, Debug)]
pub struct PairIter<'a> {
    blobs: BlobIter<'a>,
}

impl<'a> Iterator for PairIter<'a> {
    type Item = (&'a [u8], &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        let key = self.blobs.next()?;
        let value = self.blobs.next()?;
        Some((key, value))
    }
}

/// One parsed request. Byte fields borrow from the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Validate {
        magic: u32,
    },
    Set {
        key: &'a [u8],
        value: &'a [u8],
    },
    CompareSet {
        key: &'a [u8],
        expected: &'a [u8],
        desired: &'a [u8],
    },
    Get {
        key: &'a [u8],
    },
    Add {
        key: &'a [u8],
        delta: i64,
    },
    Check {
        keys: KeyList<'a>,
    },
    Wait {
        keys: KeyList<'a>,
    },
    GetNumKeys,
    DeleteKey {
        key: &'a [u8],
    },
    Append {
        key: &'a [u8],
        value: &'a [u8],
    },
    MultiGet {
        keys: KeyList<'a>,
    },
    MultiSet {
        pairs: PairList<'a>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: &'a [u8],
        value: &'a [u8],
    },
    QueuePop {
        key: &'a [u8],
    },
    QueueLen {
        key: &'a [u8],
    },
    List,
    /// Counts one arrival at `key` (stored as decimal text, like ADD); answered with
    /// STOP_WAITING once `world_size` arrivals were counted, until then a pending wait that
    /// CANCEL_WAIT cancels.
    Barrier {
        key: &'a [u8],
        world_size: i64,
    },
}

impl<'a> Request<'a> {
    pub fn command(&self) -> Command {
        match self {
            Request::Validate { .. } => Command::Validate,
            Request::Set { .. } => Command::Set,
            Request::CompareSet { .. } => Command::CompareSet,
            Request::Get { .. } => Command::Get,
            Request::Add { .. } => Command::Add,
            Request::Check { .. } => Command::Check,
            Request::Wait { .. } => Command::Wait,
            Request::GetNumKeys => Command::GetNumKeys,
            Request::DeleteKey { .. } => Command::DeleteKey,
            Request::Append { .. } => Command::Append,
            Request::MultiGet { .. } => Command::MultiGet,
            Request::MultiSet { .. } => Command::MultiSet,
            Request::CancelWait => Command::CancelWait,
            Request::Ping { .. } => Command::Ping,
            Request::QueuePush { .. } => Command::QueuePush,
            Request::QueuePop { .. } => Command::QueuePop,
            Request::QueueLen { .. } => Command::QueueLen,
            Request::List => Command::List,
            Request::Barrier { .. } => Command::Barrier,
        }
    }

    /// Appends this request's exact wire bytes to `out`. A parsed request re-encodes to the bytes
    /// it was parsed from; no limits are checked here (use the `encode_*` functions for that).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.command().byte());
        match *self {
            Request::Validate { magic } => put_u32(out, magic),
            Request::Ping { nonce } => put_u32(out, nonce),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put_blob(out, key);
                put_blob(out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_blob(out, key);
                put_blob(out, expected);
                put_blob(out, desired);
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => put_blob(out, key),
            Request::Add { key, delta } => {
                put_blob(out, key);
                put_i64(out, delta);
            }
            Request::Barrier { key, world_size } => {
                put_blob(out, key);
                put_i64(out, world_size);
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_u64(out, keys.count as u64);
                out.extend_from_slice(keys.raw);
            }
            Request::MultiSet { pairs } => {
                put_u64(out, pairs.count as u64);
                out.extend_from_slice(pairs.raw);
            }
            Request::GetNumKeys | Request::CancelWait | Request::List => {}
        }
    }

    /// The shape of the server's reply to this request.
    pub fn reply_shape(&self) -> ReplyShape {
        match self {
            Request::MultiGet { keys } => ReplyShape::Blobs(keys.len()),
            other => other.command().reply_shape(),
        }
    }
}

/// What a server sends back for a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyShape {
    /// No reply at all (VALIDATE, SET, APPEND, MULTI_SET, QUEUE_PUSH).
    Nothing,
    /// One byte (CHECK, WAIT, CANCEL_WAIT, BARRIER).
    Byte,
    /// The ping nonce.
    U32,
    /// One i64 (ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN).
    I64,
    /// One blob (GET, COMPARE_SET).
    Blob,
    /// This many blobs (MULTI_GET).
    Blobs(usize),
    /// `i64 len_before` and, when positive, one blob (QUEUE_POP).
    QueuePop,
    /// `i64 count` and that many blobs (LIST).
    KeyList,
}

impl Command {
    /// The reply shape; MULTI_GET's count comes from its request (see [`Request::reply_shape`]),
    /// so here it is `Blobs(0)`.
    pub fn reply_shape(self) -> ReplyShape {
        match self {
            Command::Validate
            | Command::Set
            | Command::Append
            | Command::MultiSet
            | Command::QueuePush => ReplyShape::Nothing,
            Command::Check | Command::Wait | Command::CancelWait | Command::Barrier => {
                ReplyShape::Byte
            }
            Command::Ping => ReplyShape::U32,
            Command::Add | Command::GetNumKeys | Command::DeleteKey | Command::QueueLen => {
                ReplyShape::I64
            }
            Command::Get | Command::CompareSet => ReplyShape::Blob,
            Command::MultiGet => ReplyShape::Blobs(0),
            Command::QueuePop => ReplyShape::QueuePop,
            Command::List => ReplyShape::KeyList,
        }
    }
}

/// Result of [`parse_frame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A whole request and the number of bytes it used.
    Request(Request<'a>, usize),
    /// The buffer holds only the start of a request; nothing can be parsed until it holds at
    /// least `needed` bytes (a lower bound, so a caller may skip re-parsing until then).
    Incomplete { needed: usize },
}

/// Parses the first request in `buf`.
///
/// `Ok(Some((request, consumed)))` for a whole request, `Ok(None)` when more bytes are needed,
/// `Err` when the bytes can never become a valid request (unknown command, over-limit length or
/// count). Limits are checked as soon as a length is read, so an over-limit request is rejected
/// before its payload arrives.
pub fn parse_request(buf: &[u8]) -> std::result::Result<Option<(Request<'_>, usize)>, ParseError> {
    match parse_frame(buf)? {
        Parsed::Request(req, used) => Ok(Some((req, used))),
        Parsed::Incomplete { .. } => Ok(None),
    }
}

/// Like [`parse_request`] but reports how many bytes an incomplete request needs at least.
pub fn parse_frame(buf: &[u8]) -> std::result::Result<Parsed<'_>, ParseError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        command: None,
    };
    match cur.request() {
        Ok(req) => Ok(Parsed::Request(req, cur.pos)),
        Err(Stop::Need(needed)) => Ok(Parsed::Incomplete { needed }),
        Err(Stop::Bad(e)) => Err(e),
    }
}

/// Why a cursor stopped: out of bytes (with the total needed), or a malformed frame.
enum Stop {
    Need(usize),
    Bad(ParseError),
}

type Step<T> = std::result::Result<T, Stop>;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    command: Option<Command>,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        let end = self.pos.saturating_add(n);
        if end > self.buf.len() {
            return Err(Stop::Need(end));
        }
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn fail(&self, field: &'static str, kind: ParseErrorKind) -> Stop {
        Stop::Bad(ParseError {
            command: self.command,
            field,
            kind,
        })
    }

    fn u8(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Step<u32> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Step<u64> {
        Ok(le_u64(self.take(8)?))
    }

    fn i64(&mut self) -> Step<i64> {
        Ok(self.u64()? as i64)
    }

    fn blob(&mut self, field: &'static str, limit: usize) -> Step<&'a [u8]> {
        let len = self.u64()?;
        if len > limit as u64 {
            return Err(self.fail(
                field,
                ParseErrorKind::TooLong {
                    len,
                    limit: limit as u64,
                },
            ));
        }
        self.take(len as usize)
    }

    fn key(&mut self) -> Step<&'a [u8]> {
        self.blob("key", MAX_KEY_LEN)
    }

    fn value(&mut self, field: &'static str) -> Step<&'a [u8]> {
        self.blob(field, MAX_VALUE_LEN)
    }

    fn count(&mut self, field: &'static str) -> Step<usize> {
        let count = self.u64()?;
        if count > MAX_KEY_COUNT as u64 {
            return Err(self.fail(
                field,
                ParseErrorKind::TooMany {
                    count,
                    limit: MAX_KEY_COUNT as u64,
                },
            ));
        }
        Ok(count as usize)
    }

    /// Each of `left` more items takes at least 8 bytes: a lower bound on the frame's end that
    /// spares a server re-parsing a long key list every time a little more of it arrives.
    fn need_items(&self, stop: Stop, left: usize) -> Stop {
        match stop {
            Stop::Need(n) => Stop::Need(n.saturating_add(left.saturating_mul(8))),
            bad => bad,
        }
    }

    fn keys(&mut self) -> Step<KeyList<'a>> {
        let count = self.count("key count")?;
        let start = self.pos;
        for i in 0..count {
            if let Err(stop) = self.key() {
                return Err(self.need_items(stop, count - i - 1));
            }
        }
        Ok(KeyList {
            count,
            raw: &self.buf[start..self.pos],
        })
    }

    fn pairs(&mut self) -> Step<PairList<'a>> {
        let count = self.count("pair count")?;
        let start = self.pos;
        for i in 0..count {
            if let Err(stop) = self.key().and_then(|_| self.value("value")) {
                return Err(self.need_items(stop, 2 * (count - i - 1)));
            }
        }
        Ok(PairList {
            count,
            raw: &self.buf[start..self.pos],
        })
    }

    fn request(&mut self) -> Step<Request<'a>> {
        let byte = self.u8()?;
        let Some(command) = Command::from_byte(byte) else {
            return Err(self.fail("command byte", ParseErrorKind::UnknownCommand(byte)));
        };
        self.command = Some(command);
        Ok(match command {
            Command::Validate => Request::Validate { magic: self.u32()? },
            Command::Ping => Request::Ping { nonce: self.u32()? },
            Command::Set => Request::Set {
                key: self.key()?,
                value: self.value("value")?,
            },
            Command::CompareSet => Request::CompareSet {
                key: self.key()?,
                expected: self.value("expected value")?,
                desired: self.value("desired value")?,
            },
            Command::Get => Request::Get { key: self.key()? },
            Command::Add => Request::Add {
                key: self.key()?,
                delta: self.i64()?,
            },
            Command::Check => Request::Check { keys: self.keys()? },
            Command::Wait => Request::Wait { keys: self.keys()? },
            Command::GetNumKeys => Request::GetNumKeys,
            Command::DeleteKey => Request::DeleteKey { key: self.key()? },
            Command::Append => Request::Append {
                key: self.key()?,
                value: self.value("value")?,
            },
            Command::MultiGet => Request::MultiGet { keys: self.keys()? },
            Command::MultiSet => Request::MultiSet {
                pairs: self.pairs()?,
            },
            Command::CancelWait => Request::CancelWait,
            Command::QueuePush => Request::QueuePush {
                key: self.key()?,
                value: self.value("value")?,
            },
            Command::QueuePop => Request::QueuePop { key: self.key()? },
            Command::QueueLen => Request::QueueLen { key: self.key()? },
            Command::List => Request::List,
            Command::Barrier => Request::Barrier {
                key: self.key()?,
                world_size: self.i64()?,
            },
        })
    }
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(b)
}

// ---------------------------------------------------------------------------------------------
// Raw field encoders (requests and replies).

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

impl WireBytes for [u8] {
    fn wire_len(&self) -> usize {
        self.len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl WireBytes for str {
    fn wire_len(&self) -> usize {
        self.len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl WireBytes for Vec<u8> {
    fn wire_len(&self) -> usize {
        self.len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl WireBytes for String {
    fn wire_len(&self) -> usize {
        self.len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl<const N: usize> WireBytes for [u8; N] {
    fn wire_len(&self) -> usize {
        N
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl<T: WireBytes + ?Sized> WireBytes for &T {
    fn wire_len(&self) -> usize {
        (**self).wire_len()
    }
    fn write_bytes(&self, out: &mut Vec<u8>) {
        (**self).write_bytes(out)
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

// ---------------------------------------------------------------------------------------------
// Request encoders. Each appends one whole request to `out`; the ones with keys or values check
// the server's limits first and leave `out` untouched when a limit is exceeded.

fn check_len(command: Command, field: &str, len: usize, limit: usize) -> Result<()> {
    if len > limit {
        return Err(Error::invalid(format!(
            "TCPStore {command} {field} is {len} bytes, over the server limit of {limit} bytes \
             (torch's default server closes the connection); use a shorter {field}"
        )));
    }
    Ok(())
}

fn put_key<K: WireBytes + ?Sized>(out: &mut Vec<u8>, command: Command, key: &K) -> Result<()> {
    check_len(command, "key", key.wire_len(), MAX_KEY_LEN)?;
    put_u64(out, key.wire_len() as u64);
    key.write_bytes(out);
    Ok(())
}

fn put_value<V: WireBytes + ?Sized>(
    out: &mut Vec<u8>,
    command: Command,
    field: &str,
    value: &V,
) -> Result<()> {
    check_len(command, field, value.wire_len(), MAX_VALUE_LEN)?;
    put_u64(out, value.wire_len() as u64);
    value.write_bytes(out);
    Ok(())
}

/// Runs `body` after the command byte; on error restores `out` to its previous length.
fn framed(
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

fn put_key_list<I, K>(out: &mut Vec<u8>, command: Command, keys: I) -> Result<()>
where
    I: IntoIterator<Item = K>,
    K: WireBytes,
{
    let count_at = out.len();
    put_u64(out, 0);
    let mut count = 0usize;
    for key in keys {
        put_key(out, command, &key)?;
        count += 1;
    }
    if count > MAX_KEY_COUNT {
        return Err(Error::invalid(format!(
            "TCPStore {command} names {count} keys, over the server limit of {MAX_KEY_COUNT}; \
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

/// `SET key value`. No reply.
pub fn encode_set<K, V>(out: &mut Vec<u8>, key: &K, value: &V) -> Result<()>
where
    K: WireBytes + ?Sized,
    V: WireBytes + ?Sized,
{
    framed(out, Command::Set, |out| {
        put_key(out, Command::Set, key)?;
        put_value(out, Command::Set, "value", value)
    })
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
        put_key(out, Command::CompareSet, key)?;
        put_value(out, Command::CompareSet, "expected value", expected)?;
        put_value(out, Command::CompareSet, "desired value", desired)
    })
}

/// `GET key`; reply: a blob (empty when the key is missing on a libuv server).
pub fn encode_get<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K) -> Result<()> {
    framed(out, Command::Get, |out| put_key(out, Command::Get, key))
}

/// `ADD key delta`; reply: the new value as i64.
pub fn encode_add<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K, delta: i64) -> Result<()> {
    framed(out, Command::Add, |out| {
        put_key(out, Command::Add, key)?;
        put_i64(out, delta);
        Ok(())
    })
}

/// `CHECK keys`; reply: [`CHECK_READY`] or [`CHECK_NOT_READY`].
pub fn encode_check<I, K>(out: &mut Vec<u8>, keys: I) -> Result<()>
where
    I: IntoIterator<Item = K>,
    K: WireBytes,
{
    framed(out, Command::Check, |out| {
        put_key_list(out, Command::Check, keys)
    })
}

/// `WAIT keys`; reply: [`WAIT_STOP_WAITING`] once every key exists.
pub fn encode_wait<I, K>(out: &mut Vec<u8>, keys: I) -> Result<()>
where
    I: IntoIterator<Item = K>,
    K: WireBytes,
{
    framed(out, Command::Wait, |out| {
        put_key_list(out, Command::Wait, keys)
    })
}

/// `GETNUMKEYS`; reply: i64.
pub fn encode_get_num_keys(out: &mut Vec<u8>) {
    out.push(Command::GetNumKeys.byte());
}

/// `DELETE_KEY key`; reply: i64 0 or 1.
pub fn encode_delete_key<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K) -> Result<()> {
    framed(out, Command::DeleteKey, |out| {
        put_key(out, Command::DeleteKey, key)
    })
}

/// `APPEND key data`. No reply.
pub fn encode_append<K, V>(out: &mut Vec<u8>, key: &K, value: &V) -> Result<()>
where
    K: WireBytes + ?Sized,
    V: WireBytes + ?Sized,
{
    framed(out, Command::Append, |out| {
        put_key(out, Command::Append, key)?;
        put_value(out, Command::Append, "value", value)
    })
}

/// `MULTI_GET keys`; reply: one blob per key, in order.
pub fn encode_multi_get<I, K>(out: &mut Vec<u8>, keys: I) -> Result<()>
where
    I: IntoIterator<Item = K>,
    K: WireBytes,
{
    framed(out, Command::MultiGet, |out| {
        put_key_list(out, Command::MultiGet, keys)
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
        let count_at = out.len();
        put_u64(out, 0);
        let mut count = 0usize;
        for (key, value) in pairs {
            put_key(out, Command::MultiSet, &key)?;
            put_value(out, Command::MultiSet, "value", &value)?;
            count += 1;
        }
        if count > MAX_KEY_COUNT {
            return Err(Error::invalid(format!(
                "TCPStore MULTI_SET has {count} pairs, over the server limit of {MAX_KEY_COUNT}; \
                 split the request"
            )));
        }
        out[count_at..count_at + 8].copy_from_slice(&(count as u64).to_le_bytes());
        Ok(())
    })
}

/// `CANCEL_WAIT`; reply: [`WAIT_CANCELED`] (possibly preceded by a late [`WAIT_STOP_WAITING`]).
pub fn encode_cancel_wait(out: &mut Vec<u8>) {
    out.push(Command::CancelWait.byte());
}

/// `QUEUE_PUSH key value`. No reply.
pub fn encode_queue_push<K, V>(out: &mut Vec<u8>, key: &K, value: &V) -> Result<()>
where
    K: WireBytes + ?Sized,
    V: WireBytes + ?Sized,
{
    framed(out, Command::QueuePush, |out| {
        put_key(out, Command::QueuePush, key)?;
        put_value(out, Command::QueuePush, "value", value)
    })
}

/// `QUEUE_POP key`; reply: i64 length before the pop, then a blob when it was positive.
pub fn encode_queue_pop<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K) -> Result<()> {
    framed(out, Command::QueuePop, |out| {
        put_key(out, Command::QueuePop, key)
    })
}

/// `QUEUE_LEN key`; reply: i64.
pub fn encode_queue_len<K: WireBytes + ?Sized>(out: &mut Vec<u8>, key: &K) -> Result<()> {
    framed(out, Command::QueueLen, |out| {
        put_key(out, Command::QueueLen, key)
    })
}

/// `LIST`; reply: i64 count and that many keys (wire form).
pub fn encode_list(out: &mut Vec<u8>) {
    out.push(Command::List.byte());
}

/// `BARRIER key world_size`; reply: one byte, STOP_WAITING once `world_size` arrivals at `key`
/// were counted (a torch >= 2.15 server, or ours).
pub fn encode_barrier<K: WireBytes + ?Sized>(
    out: &mut Vec<u8>,
    key: &K,
    world_size: i64,
) -> Result<()> {
    framed(out, Command::Barrier, |out| {
        put_key(out, Command::Barrier, key)?;
        put_i64(out, world_size);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Reply decoders over byte slices: `Ok(None)` means "need more bytes".

type Decoded<'a, T> = std::result::Result<Option<(T, usize)>, ParseError>;

pub fn decode_u8(buf: &[u8]) -> Option<(u8, usize)> {
    buf.first().map(|&b| (b, 1))
}

pub fn decode_u32(buf: &[u8]) -> Option<(u32, usize)> {
    let mut b = [0u8; 4];
    b.copy_from_slice(buf.get(..4)?);
    Some((u32::from_le_bytes(b), 4))
}

pub fn decode_i64(buf: &[u8]) -> Option<(i64, usize)> {
    Some((le_u64(buf.get(..8)?) as i64, 8))
}

fn reply_error(command: Command, field: &'static str, kind: ParseErrorKind) -> ParseError {
    ParseError {
        command: Some(command),
        field,
        kind,
    }
}

/// One reply blob (GET, COMPARE_SET, one MULTI_GET item).
pub fn decode_blob(buf: &[u8]) -> Decoded<'_, &[u8]> {
    let Some((len, _)) = decode_i64(buf) else {
        return Ok(None);
    };
    let len = len as u64;
    if len > MAX_REPLY_BLOB_LEN {
        return Err(reply_error(
            Command::Get,
            "reply value",
            ParseErrorKind::TooLong {
                len,
                limit: MAX_REPLY_BLOB_LEN,
            },
        ));
    }
    let end = 8 + len as usize;
    Ok(buf.get(8..end).map(|blob| (blob, end)))
}

/// `n` reply blobs (MULTI_GET).
pub fn decode_blobs(buf: &[u8], n: usize) -> Decoded<'_, Vec<&[u8]>> {
    let mut pos = 0;
    let mut blobs = Vec::with_capacity(n.min(MAX_KEY_COUNT));
    for _ in 0..n {
        match decode_blob(&buf[pos..])? {
            Some((blob, used)) => {
                blobs.push(blob);
                pos += used;
            }
            None => return Ok(None),
        }
    }
    Ok(Some((blobs, pos)))
}

/// QUEUE_POP reply: `Some(value)` or `None` when the queue was empty.
pub fn decode_queue_pop(buf: &[u8]) -> Decoded<'_, Option<&[u8]>> {
    let Some((len_before, used)) = decode_i64(buf) else {
        return Ok(None);
    };
    if len_before < 0 {
        return Err(reply_error(
            Command::QueuePop,
            "reply queue length",
            ParseErrorKind::Negative(len_before),
        ));
    }
    if len_before == 0 {
        return Ok(Some((None, used)));
    }
    Ok(decode_blob(&buf[used..])?.map(|(blob, n)| (Some(blob), used + n)))
}

/// LIST reply: the keys in wire form.
pub fn decode_list(buf: &[u8]) -> Decoded<'_, Vec<&[u8]>> {
    let Some((count, used)) = decode_i64(buf) else {
        return Ok(None);
    };
    if count < 0 {
        return Err(reply_error(
            Command::List,
            "reply key count",
            ParseErrorKind::Negative(count),
        ));
    }
    let mut pos = used;
    let mut keys = Vec::with_capacity((count as usize).min(MAX_KEY_COUNT));
    for _ in 0..count {
        match decode_blob(&buf[pos..])? {
            Some((key, n)) => {
                keys.push(key);
                pos += n;
            }
            None => return Ok(None),
        }
    }
    Ok(Some((keys, pos)))
}

// ---------------------------------------------------------------------------------------------
// Blocking reply readers for a client on a `Read` (a socket). Errors are `io::Error`s; a corrupt
// length is `InvalidData`, a closed connection `UnexpectedEof`.

pub fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub fn read_i64(r: &mut impl Read) -> io::Result<i64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(i64::from_le_bytes(b))
}

/// Reads one blob into `out` (cleared first), growing it as bytes arrive so that a corrupt
/// length cannot force a huge allocation up front.
pub fn read_blob_into(r: &mut impl Read, out: &mut Vec<u8>) -> io::Result<()> {
    let len = read_i64(r)? as u64;
    if len > MAX_REPLY_BLOB_LEN {
        return Err(reply_error(
            Command::Get,
            "reply value",
            ParseErrorKind::TooLong {
                len,
                limit: MAX_REPLY_BLOB_LEN,
            },
        )
        .into());
    }
    out.clear();
    out.reserve((len as usize).min(MAX_VALUE_LEN));
    let got = r.take(len).read_to_end(out)?;
    if got as u64 != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("TCPStore reply value truncated: got {got} of {len} bytes"),
        ));
    }
    Ok(())
}

pub fn read_blob(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    read_blob_into(r, &mut v)?;
    Ok(v)
}

/// MULTI_GET reply: `n` blobs.
pub fn read_blobs(r: &mut impl Read, n: usize) -> io::Result<Vec<Vec<u8>>> {
    (0..n).map(|_| read_blob(r)).collect()
}

/// QUEUE_POP reply: `Some(value)`, or `None` when the queue was empty.
pub fn read_queue_pop(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let len_before = read_i64(r)?;
    if len_before < 0 {
        return Err(reply_error(
            Command::QueuePop,
            "reply queue length",
            ParseErrorKind::Negative(len_before),
        )
        .into());
    }
    if len_before == 0 {
        return Ok(None);
    }
    read_blob(r).map(Some)
}

/// LIST reply: keys in wire form.
pub fn read_list(r: &mut impl Read) -> io::Result<Vec<Vec<u8>>> {
    let count = read_i64(r)?;
    if count < 0 {
        return Err(reply_error(
            Command::List,
            "reply key count",
            ParseErrorKind::Negative(count),
        )
        .into());
    }
    let mut keys = Vec::with_capacity((count as usize).min(MAX_KEY_COUNT));
    for _ in 0..count {
        keys.push(read_blob(r)?);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hex with `..` meaning "followed by six zero bytes", as written in the reference capture.
    fn hex(s: &str) -> Vec<u8> {
        let s: String = s
            .replace("..", "000000000000")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn parse_all(bytes: &[u8]) -> Request<'_> {
        let (req, used) = parse_request(bytes).unwrap().expect("complete request");
        assert_eq!(used, bytes.len(), "consumed every byte");
        req
    }

    fn keys_of(list: KeyList<'_>) -> Vec<&[u8]> {
        list.iter().collect()
    }

    /// Captured request bytes of a torch 2.11 client (reference section 3), with what they mean
    /// and how our encoders produce them.
    fn captured() -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut cases = Vec::new();
        let mut enc = |wire: &str, f: &dyn Fn(&mut Vec<u8>)| {
            let mut out = Vec::new();
            f(&mut out);
            cases.push((hex(wire), out));
        };
        enc("00 CEF7853C", &|o| encode_validate(o));
        enc("0D DC010000", &|o| encode_ping(o, 476));
        enc("04 0500000000000000 696e69742f 0100000000000000", &|o| {
            encode_add(o, "init/", 1).unwrap()
        });
        enc("01 0200000000000000 2f6b 0200000000000000 7631", &|o| {
            encode_set(o, &Prefixed::new("/", "k"), b"v1").unwrap()
        });
        enc("06 0100000000000000 0200000000000000 2f6b", &|o| {
            encode_wait(o, [Prefixed::new("/", "k")]).unwrap()
        });
        enc("03 0200000000000000 2f6b", &|o| {
            encode_get(o, "/k").unwrap()
        });
        enc("04 0200000000000000 2f6e 0300000000000000", &|o| {
            encode_add(o, "/n", 3).unwrap()
        });
        enc("05 0200000000000000 0200..2f6b 0300..2f7a7a", &|o| {
            encode_check(o, ["/k", "/zz"]).unwrap()
        });
        enc("02 0200..2f6b 0200..7631 0200..7632", &|o| {
            encode_compare_set(o, "/k", "v1", "v2").unwrap()
        });
        enc("09 0200..2f6b 0100..2b", &|o| {
            encode_append(o, "/k", "+").unwrap()
        });
        enc(
            "0b 0200000000000000 0200..2f61 0100..31 0200..2f62 0100..32",
            &|o| encode_multi_set(o, [("/a", "1"), ("/b", "2")]).unwrap(),
        );
        enc("06 0200.. 0200..2f61 0200..2f62", &|o| {
            encode_wait(o, ["/a", "/b"]).unwrap()
        });
        enc("0a 0200.. 0200..2f61 0200..2f62", &|o| {
            encode_multi_get(o, vec![b"/a".to_vec(), b"/b".to_vec()]).unwrap()
        });
        enc("08 0200..2f61", &|o| encode_delete_key(o, "/a").unwrap());
        enc("07", &|o| encode_get_num_keys(o));
        enc("06 0100.. 0300..2f7a7a", &|o| {
            encode_wait(o, ["/zz"]).unwrap()
        });
        enc("0c", &|o| encode_cancel_wait(o));
        enc("0e 0200..2f71 0100..65", &|o| {
            encode_queue_push(o, "/q", "e").unwrap()
        });
        enc("0f 0200..2f71", &|o| encode_queue_pop(o, "/q").unwrap());
        enc("10 0200..2f71", &|o| encode_queue_len(o, "/q").unwrap());
        enc("11", &|o| encode_list(o));
        cases
    }

    #[test]
    fn captured_bytes_parse_and_encoders_reproduce_them() {
        for (wire, encoded) in captured() {
            assert_eq!(encoded, wire, "encoder output differs from the capture");
            let req = parse_all(&wire);
            let mut again = Vec::new();
            req.encode(&mut again);
            assert_eq!(again, wire, "{} re-encodes differently", req.command());
        }
    }

    #[test]
    fn captured_bytes_decode_to_expected_fields() {
        let set = hex("01 0200000000000000 2f6b 0200000000000000 7631");
        assert_eq!(
            parse_all(&set),
            Request::Set {
                key: b"/k",
                value: b"v1"
            }
        );
        let hs = hex("00 CEF7853C");
        assert_eq!(
            parse_all(&hs),
            Request::Validate {
                magic: VALIDATE_MAGIC
            }
        );
        let ping = hex("0D DC010000");
        assert_eq!(parse_all(&ping), Request::Ping { nonce: 476 });
        let add = hex("04 0200000000000000 2f6e 0300000000000000");
        assert_eq!(
            parse_all(&add),
            Request::Add {
                key: b"/n",
                delta: 3
            }
        );
        let check = hex("05 0200000000000000 0200..2f6b 0300..2f7a7a");
        match parse_all(&check) {
            Request::Check { keys } => {
                assert_eq!(keys.len(), 2);
                assert_eq!(keys_of(keys), vec![&b"/k"[..], b"/zz"]);
            }
            other => panic!("expected CHECK, got {other:?}"),
        }
        let cas = hex("02 0200..2f6b 0200..7631 0200..7632");
        assert_eq!(
            parse_all(&cas),
            Request::CompareSet {
                key: b"/k",
                expected: b"v1",
                desired: b"v2"
            }
        );
        let mset = hex("0b 0200000000000000 0200..2f61 0100..31 0200..2f62 0100..32");
        match parse_all(&mset) {
            Request::MultiSet { pairs } => {
                let pairs: Vec<_> = pairs.iter().collect();
                assert_eq!(pairs, vec![(&b"/a"[..], &b"1"[..]), (b"/b", b"2")]);
            }
            other => panic!("expected MULTI_SET, got {other:?}"),
        }
        assert_eq!(parse_all(&hex("07")), Request::GetNumKeys);
        assert_eq!(parse_all(&hex("0c")), Request::CancelWait);
        assert_eq!(parse_all(&hex("11")), Request::List);
        assert_eq!(
            parse_all(&hex("08 0200..2f61")),
            Request::DeleteKey { key: b"/a" }
        );
    }

    /// One request of every command, with binary and empty fields.
    fn every_command() -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        let mut push = |f: &dyn Fn(&mut Vec<u8>) -> Result<()>| {
            let mut out = Vec::new();
            f(&mut out).unwrap();
            all.push(out);
        };
        push(&|o| {
            encode_validate(o);
            Ok(())
        });
        push(&|o| encode_set(o, b"/bin\x00\xff", b""));
        push(&|o| encode_compare_set(o, "/c", "", "new"));
        push(&|o| encode_get(o, ""));
        push(&|o| encode_add(o, "/n", i64::MIN));
        push(&|o| encode_check(o, Vec::<&str>::new()));
        push(&|o| encode_wait(o, ["/a", "", "/c"]));
        push(&|o| {
            encode_get_num_keys(o);
            Ok(())
        });
        push(&|o| encode_delete_key(o, "/d"));
        push(&|o| encode_append(o, "/a", &[0u8, 1, 2][..]));
        push(&|o| encode_multi_get(o, ["/x"]));
        push(&|o| encode_multi_set(o, [("/x", "1"), ("/y", ""), ("", "z")]));
        push(&|o| {
            encode_cancel_wait(o);
            Ok(())
        });
        push(&|o| {
            encode_ping(o, u32::MAX);
            Ok(())
        });
        push(&|o| encode_queue_push(o, "/q", "item"));
        push(&|o| encode_queue_pop(o, "/q"));
        push(&|o| encode_queue_len(o, "/q"));
        push(&|o| {
            encode_list(o);
            Ok(())
        });
        push(&|o| encode_barrier(o, "/b", 4));
        all
    }

    #[test]
    fn every_command_round_trips() {
        let frames = every_command();
        let seen: Vec<Command> = frames.iter().map(|f| parse_all(f).command()).collect();
        assert_eq!(seen, Command::ALL.to_vec());
        for frame in &frames {
            let req = parse_all(frame);
            let mut again = Vec::new();
            req.encode(&mut again);
            assert_eq!(&again, frame);
        }
        match parse_all(&frames[Command::Add as usize]) {
            Request::Add { key, delta } => assert_eq!((key, delta), (&b"/n"[..], i64::MIN)),
            other => panic!("{other:?}"),
        }
        match parse_all(&frames[Command::Wait as usize]) {
            Request::Wait { keys } => assert_eq!(keys_of(keys), vec![&b"/a"[..], b"", b"/c"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_split_point_needs_more_bytes() {
        for frame in every_command()
            .iter()
            .chain(captured().iter().map(|c| &c.0))
        {
            for cut in 0..frame.len() {
                match parse_frame(&frame[..cut]).unwrap() {
                    Parsed::Incomplete { needed } => {
                        assert!(
                            needed > cut && needed <= frame.len(),
                            "cut {cut} needed {needed}"
                        )
                    }
                    Parsed::Request(r, _) => {
                        panic!("{cut} of {} bytes parsed as {r:?}", frame.len())
                    }
                }
            }
        }
    }

    #[test]
    fn pipelined_requests_parse_one_after_another() {
        let frames = every_command();
        let stream: Vec<u8> = frames.concat();
        let mut pos = 0;
        for frame in &frames {
            let (req, used) = parse_request(&stream[pos..]).unwrap().unwrap();
            assert_eq!(used, frame.len());
            let mut again = Vec::new();
            req.encode(&mut again);
            assert_eq!(&again, frame);
            pos += used;
        }
        assert_eq!(pos, stream.len());
        assert_eq!(parse_request(&stream[pos..]).unwrap(), None);
    }

    fn header(cmd: Command, len: u64) -> Vec<u8> {
        let mut v = vec![cmd.byte()];
        put_u64(&mut v, len);
        v
    }

    #[test]
    fn key_limit_is_enforced_before_the_payload_arrives() {
        assert!(matches!(
            parse_frame(&header(Command::Get, MAX_KEY_LEN as u64)),
            Ok(Parsed::Incomplete { needed }) if needed == 9 + MAX_KEY_LEN
        ));
        let err = parse_request(&header(Command::Get, MAX_KEY_LEN as u64 + 1)).unwrap_err();
        assert_eq!(err.command, Some(Command::Get));
        assert_eq!(err.field, "key");
        assert_eq!(
            err.kind,
            ParseErrorKind::TooLong {
                len: 8193,
                limit: 8192
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("GET key") && msg.contains("8193") && msg.contains("8192"),
            "{msg}"
        );
        let mut out = Vec::new();
        encode_get(&mut out, &vec![b'k'; MAX_KEY_LEN]).unwrap();
        assert!(parse_request(&out).unwrap().is_some());
    }

    #[test]
    fn value_limit_is_enforced() {
        let mut frame = Vec::new();
        encode_set(&mut frame, "/k", &vec![7u8; MAX_VALUE_LEN]).unwrap();
        assert!(parse_request(&frame).unwrap().is_some());

        let mut too_big = vec![Command::Set.byte()];
        put_blob(&mut too_big, b"/k");
        put_u64(&mut too_big, MAX_VALUE_LEN as u64 + 1);
        let err = parse_request(&too_big).unwrap_err();
        assert_eq!((err.command, err.field), (Some(Command::Set), "value"));

        let mut cas = vec![Command::CompareSet.byte()];
        put_blob(&mut cas, b"/k");
        put_blob(&mut cas, b"");
        put_u64(&mut cas, u64::MAX);
        let err = parse_request(&cas).unwrap_err();
        assert_eq!(err.field, "desired value");
    }

    #[test]
    fn key_count_limit_is_enforced() {
        for cmd in [
            Command::Check,
            Command::Wait,
            Command::MultiGet,
            Command::MultiSet,
        ] {
            assert!(matches!(
                parse_frame(&header(cmd, MAX_KEY_COUNT as u64)),
                Ok(Parsed::Incomplete { .. })
            ));
            let err = parse_request(&header(cmd, MAX_KEY_COUNT as u64 + 1)).unwrap_err();
            assert_eq!(err.command, Some(cmd));
            assert!(matches!(
                err.kind,
                ParseErrorKind::TooMany {
                    count: 131_073,
                    limit: 131_072
                }
            ));
        }
    }

    #[test]
    fn unknown_command_bytes_are_errors() {
        for byte in [19u8, 20, 0x7f, 0xff] {
            let err = parse_request(&[byte, 1, 2, 3]).unwrap_err();
            assert_eq!(err.kind, ParseErrorKind::UnknownCommand(byte));
            assert!(err.to_string().contains(&format!("byte {byte}")));
        }
        assert_eq!(parse_request(&[]).unwrap(), None);
    }

    #[test]
    fn encoders_refuse_over_limit_input_and_leave_the_buffer_alone() {
        let mut out = vec![0xAA];
        let long_key = vec![b'k'; MAX_KEY_LEN + 1];
        let e = encode_set(&mut out, &long_key, "v").unwrap_err();
        assert_eq!(e.status, crate::error::Status::InvalidArgument);
        assert!(
            e.message.contains("SET key") && e.message.contains("8193"),
            "{}",
            e.message
        );
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert!(encode_append(&mut out, "/k", &big).is_err());
        assert!(encode_multi_set(&mut out, [("/a", &b"1"[..]), ("/b", &big[..])]).is_err());
        assert!(encode_wait(&mut out, ["/ok", &String::from_utf8(long_key).unwrap()]).is_err());
        let many = vec!["k"; MAX_KEY_COUNT + 1];
        let e = encode_multi_get(&mut out, &many).unwrap_err();
        assert!(e.message.contains("131073"), "{}", e.message);
        assert_eq!(out, vec![0xAA]);
    }

    #[test]
    fn reply_decoders_handle_partial_and_whole_replies() {
        let mut r = Vec::new();
        put_blob(&mut r, b"v1");
        put_blob(&mut r, b"");
        for cut in 0..r.len() {
            assert_eq!(decode_blobs(&r[..cut], 2).unwrap(), None);
        }
        let (blobs, used) = decode_blobs(&r, 2).unwrap().unwrap();
        assert_eq!((blobs, used), (vec![&b"v1"[..], b""], r.len()));

        let mut pop = Vec::new();
        put_i64(&mut pop, 3);
        put_blob(&mut pop, b"x");
        assert_eq!(decode_queue_pop(&pop).unwrap(), Some((Some(&b"x"[..]), 17)));
        assert_eq!(decode_queue_pop(&pop[..10]).unwrap(), None);
        assert_eq!(
            decode_queue_pop(&0i64.to_le_bytes()).unwrap(),
            Some((None, 8))
        );
        assert!(decode_queue_pop(&(-1i64).to_le_bytes()).is_err());

        let mut list = Vec::new();
        put_i64(&mut list, 2);
        put_blob(&mut list, b"/a");
        put_blob(&mut list, b"init/");
        assert_eq!(
            decode_list(&list).unwrap(),
            Some((vec![&b"/a"[..], b"init/"], list.len()))
        );
        assert_eq!(decode_list(&list[..list.len() - 1]).unwrap(), None);
        assert_eq!(decode_u32(&hex("DC010000")), Some((476, 4)));
        assert_eq!(decode_i64(&hex("0300000000000000")), Some((3, 8)));
        assert_eq!(decode_u8(&[]), None);

        let mut huge = Vec::new();
        put_u64(&mut huge, MAX_REPLY_BLOB_LEN + 1);
        assert!(decode_blob(&huge).is_err());
    }

    #[test]
    fn blocking_readers_match_the_slice_decoders() {
        let mut r = Vec::new();
        put_u8(&mut r, WAIT_STOP_WAITING);
        put_u32(&mut r, 476);
        put_i64(&mut r, -5);
        put_blob(&mut r, b"value");
        put_i64(&mut r, 1);
        put_blob(&mut r, b"q");
        put_i64(&mut r, 0);
        put_i64(&mut r, 1);
        put_blob(&mut r, b"/k");
        let mut c = io::Cursor::new(r);
        assert_eq!(read_u8(&mut c).unwrap(), 0);
        assert_eq!(read_u32(&mut c).unwrap(), 476);
        assert_eq!(read_i64(&mut c).unwrap(), -5);
        assert_eq!(read_blob(&mut c).unwrap(), b"value");
        assert_eq!(read_queue_pop(&mut c).unwrap(), Some(b"q".to_vec()));
        assert_eq!(read_queue_pop(&mut c).unwrap(), None);
        assert_eq!(read_list(&mut c).unwrap(), vec![b"/k".to_vec()]);
        let err = read_u8(&mut c).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);

        let mut truncated = Vec::new();
        put_u64(&mut truncated, 1 << 30);
        truncated.extend_from_slice(b"abc");
        let err = read_blob(&mut io::Cursor::new(truncated)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// xorshift64*: a tiny deterministic generator for the randomized parser check.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The requests (re-encoded) in `stream` and the error that ended parsing, parsing the whole
    /// buffer, or feeding it in random pieces like the server does.
    fn parse_stream(stream: &[u8], rng: Option<&mut Rng>) -> (Vec<Vec<u8>>, Option<ParseError>) {
        let mut found = Vec::new();
        let mut buf = Vec::new();
        let mut fed = 0;
        let mut rng = rng;
        while fed < stream.len() {
            let piece = match rng.as_deref_mut() {
                Some(r) => 1 + r.below(16),
                None => stream.len(),
            };
            let end = (fed + piece).min(stream.len());
            buf.extend_from_slice(&stream[fed..end]);
            fed = end;
            loop {
                match parse_frame(&buf) {
                    Ok(Parsed::Request(req, used)) => {
                        let mut encoded = Vec::new();
                        req.encode(&mut encoded);
                        assert_eq!(encoded, &buf[..used], "re-encoding differs");
                        assert_eq!(parse_request(&encoded), Ok(Some((req, used))));
                        found.push(encoded);
                        buf.drain(..used);
                    }
                    Ok(Parsed::Incomplete { needed }) => {
                        assert!(needed > buf.len());
                        break;
                    }
                    Err(e) => return (found, Some(e)),
                }
            }
        }
        (found, None)
    }

    /// The same property as the `frame_parser` fuzz target, bounded, on every `cargo test`:
    /// valid frames with random byte mutations, truncations and garbage, fed whole and in random
    /// pieces. Set NVFIPC_FUZZ_SEED to explore other inputs.
    #[test]
    fn random_streams_parse_the_same_whole_and_in_pieces() {
        let seeds = [0x9E37_79B9_7F4A_7C15u64].into_iter().chain(
            std::env::var("NVFIPC_FUZZ_SEED")
                .ok()
                .and_then(|s| s.parse().ok()),
        );
        let frames = every_command();
        for seed in seeds {
            let mut rng = Rng(seed | 1);
            for _ in 0..20_000 {
                let mut stream = Vec::new();
                for _ in 0..rng.below(6) {
                    stream.extend_from_slice(&frames[rng.below(frames.len())]);
                }
                for _ in 0..rng.below(4) {
                    if !stream.is_empty() {
                        let at = rng.below(stream.len());
                        stream[at] = rng.next() as u8;
                    }
                }
                if rng.below(4) == 0 {
                    stream.push(rng.next() as u8);
                }
                if rng.below(4) == 0 && !stream.is_empty() {
                    let keep = rng.below(stream.len());
                    stream.truncate(keep);
                }
                let whole = parse_stream(&stream, None);
                let pieces = parse_stream(&stream, Some(&mut rng));
                assert_eq!(whole, pieces, "seed {seed}: stream {stream:02x?}");
            }
        }
    }

    #[test]
    fn reply_shapes_follow_the_protocol_table() {
        assert_eq!(Command::Set.reply_shape(), ReplyShape::Nothing);
        assert_eq!(Command::QueuePush.reply_shape(), ReplyShape::Nothing);
        assert_eq!(Command::Wait.reply_shape(), ReplyShape::Byte);
        assert_eq!(Command::DeleteKey.reply_shape(), ReplyShape::I64);
        let mut mget = Vec::new();
        encode_multi_get(&mut mget, ["/a", "/b", "/c"]).unwrap();
        assert_eq!(parse_all(&mget).reply_shape(), ReplyShape::Blobs(3));
        for (i, c) in Command::ALL.iter().enumerate() {
            assert_eq!(Command::from_byte(i as u8), Some(*c));
        }
        assert_eq!(Command::from_byte(19), None);
    }
}
