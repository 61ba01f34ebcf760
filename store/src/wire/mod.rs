//! PyTorch TCPStore wire protocol, current generation (torch >= 2.2, `VALIDATE` = 0, through
//! torch 2.15's `BARRIER` = 18).
//!
//! Everything is little-endian; lengths and counts are u64; a string or blob is `u64 len ‖ bytes`
//! and a key list is `u64 count ‖ count × blob`. There is no framing header: a request is one
//! command byte followed by its arguments, so the parser must cope with partial and pipelined
//! requests. The limits are those of torch's default (libuv) server, which closes the connection
//! when a request exceeds them.
//!
//! Files: this one (limits, reply codes, [`Command`] and [`Request`], [`ParseError`]);
//! `request.rs` (zero-copy key lists, re-encoding); `parser.rs` (the incremental parser the server runs and the fuzz
//! target drives); `encode.rs` (limit-checked `encode_*` requests, `put_*` fields for replies);
//! `reply.rs` (the client's blocking `read_*` reply readers). Tests decode replies from slices
//! with `tests/support.rs`.

mod encode;
mod parser;
mod reply;
mod request;
#[cfg(test)]
#[path = "tests/support.rs"]
mod support;
#[cfg(test)]
mod tests;

pub use encode::*;
pub use parser::*;
pub use reply::*;
pub use request::*;
#[cfg(test)]
pub(crate) use support::*;

use crate::error::Error;
use std::fmt;
use std::io;

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
pub const WAIT_CANCELED: u8 = 0x01;

/// Declares [`Command`] (wire byte, torch's upper-case name) and [`Request`] (its fields).
macro_rules! commands {
    ($($(#[$doc:meta])* $command:ident = $byte:literal $name:literal
        $({ $($field:ident: $ty:ty),* })?,)*) => {
        /// Command bytes (`c10d::detail::QueryType`), current numbering.
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Command {
            $($command = $byte,)*
        }

        impl Command {
            /// Every command, in byte order.
            pub const ALL: [Command; 19] = [$(Command::$command,)*];

            /// The upper-case name torch uses.
            pub fn name(self) -> &'static str {
                match self {
                    $(Command::$command => $name,)*
                }
            }
        }

        /// One parsed request. Byte fields borrow from the input buffer.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Request<'a> {
            $($(#[$doc])* $command $({ $($field: $ty),* })?,)*
        }

        impl Request<'_> {
            pub fn command(&self) -> Command {
                match self {
                    $(Request::$command { .. } => Command::$command,)*
                }
            }
        }
    };
}

commands! {
    Validate = 0 "VALIDATE" { magic: u32 },
    Set = 1 "SET" { key: &'a [u8], value: &'a [u8] },
    CompareSet = 2 "COMPARE_SET" { key: &'a [u8], expected: &'a [u8], desired: &'a [u8] },
    Get = 3 "GET" { key: &'a [u8] },
    Add = 4 "ADD" { key: &'a [u8], delta: i64 },
    Check = 5 "CHECK" { keys: KeyList<'a> },
    Wait = 6 "WAIT" { keys: KeyList<'a> },
    GetNumKeys = 7 "GETNUMKEYS",
    DeleteKey = 8 "DELETE_KEY" { key: &'a [u8] },
    Append = 9 "APPEND" { key: &'a [u8], value: &'a [u8] },
    MultiGet = 10 "MULTI_GET" { keys: KeyList<'a> },
    MultiSet = 11 "MULTI_SET" { pairs: PairList<'a> },
    CancelWait = 12 "CANCEL_WAIT",
    Ping = 13 "PING" { nonce: u32 },
    QueuePush = 14 "QUEUE_PUSH" { key: &'a [u8], value: &'a [u8] },
    QueuePop = 15 "QUEUE_POP" { key: &'a [u8] },
    QueueLen = 16 "QUEUE_LEN" { key: &'a [u8] },
    List = 17 "LIST",
    /// Counts one arrival at `key` (stored as decimal text, like ADD); answered with
    /// STOP_WAITING once `world_size` arrivals were counted, until then a pending wait that
    /// CANCEL_WAIT cancels.
    Barrier = 18 "BARRIER" { key: &'a [u8], world_size: i64 },
}

impl Command {
    /// The command for a wire byte, or `None` for an unknown byte (19 and above).
    pub fn from_byte(byte: u8) -> Option<Command> {
        Command::ALL.get(usize::from(byte)).copied()
    }

    /// The wire byte.
    pub fn byte(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
        let (cmd, field) = (self.command.map_or("?", Command::name), self.field);
        f.write_str("malformed TCPStore frame: ")?;
        match self.kind {
            ParseErrorKind::UnknownCommand(byte) => {
                write!(f, "unknown command byte {byte} (known commands are 0..=17)")
            }
            ParseErrorKind::TooLong { len, limit } => {
                write!(
                    f,
                    "{cmd} {field} is {len} bytes, over the limit of {limit} bytes"
                )
            }
            ParseErrorKind::TooMany { count, limit } => {
                write!(f, "{cmd} {field} is {count}, over the limit of {limit}")
            }
            ParseErrorKind::Negative(v) => write!(f, "{cmd} {field} is negative ({v})"),
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

fn le_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(b)
}

/// A malformed reply of `command` (a length over the limits, a negative count).
fn reply_error(command: Command, field: &'static str, kind: ParseErrorKind) -> ParseError {
    ParseError {
        command: Some(command),
        field,
        kind,
    }
}
