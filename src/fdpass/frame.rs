//! The fd transport's frames (layout and error codes: docs/PROTOCOL.md section 7): encoding and
//! validation, no I/O. A malformed request is answered with an error frame (serial 0) and its
//! connection closed: a byte stream cannot be resynchronised.

/// Frame format version; a change of any layout above bumps it.
pub const VERSION: u16 = 2;
pub const HEADER_LEN: usize = 12;
/// Largest body either side accepts; anything longer is refused before it is read.
pub const MAX_BODY: usize = 1024;
/// Longest error message carried in a reply (longer ones are cut at a char boundary).
pub const MAX_MESSAGE: usize = 512;

const REQUEST_MAGIC: [u8; 4] = *b"NVFQ";
const REPLY_MAGIC: [u8; 4] = *b"NVFR";
const KIND_FETCH: u16 = 1;
const KIND_FD: u16 = 1;
const KIND_ERROR: u16 = 2;
const FETCH_BODY: usize = 40;
const FD_BODY: usize = 24;

/// A responder's 128-bit secret, published only in its store record; `Debug` never shows it.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Secret(pub u128);

impl Secret {
    /// Whether `other` is this secret, comparing every bit (no early exit).
    pub fn matches(&self, other: &Secret) -> bool {
        let diff = self.0 ^ other.0;
        (diff.to_le_bytes().iter().fold(0u8, |acc, b| acc | b)) == 0
    }

    /// 32 lower-case hex digits (the record's form).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// [`to_hex`](Self::to_hex)'s form; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Secret> {
        (text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u128::from_str_radix(text, 16).ok().map(Secret))
            .flatten()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// An importer's request for the object registered under `serial`; `rank` and `pid` are for
/// messages only (the responder trusts `SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchRequest {
    pub nonce: u64,
    pub serial: u64,
    pub rank: u32,
    pub pid: u32,
    pub secret: Secret,
}

/// Declares [`ErrorCode`] with its wire value and name.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $code:ident = $value:literal $name:literal,)*) => {
        /// Why a responder refused a request.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum ErrorCode {
            $($(#[$doc])* $code = $value,)*
        }

        impl ErrorCode {
            fn from_u16(v: u16) -> Option<ErrorCode> {
                match v {
                    $($value => Some(ErrorCode::$code),)*
                    _ => None,
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$code => $name,)*
                }
            }
        }
    };
}

error_codes! {
    /// No object was ever registered under this serial.
    UnknownId = 1 "unknown id",
    /// The object was registered and has been unregistered since.
    Revoked = 2 "revoked",
    /// The request did not parse (magic, kind, size).
    Malformed = 3 "malformed request",
    /// The request names another responder's nonce (a stale record, or another job).
    WrongNonce = 4 "wrong nonce",
    /// The request's frame version is not one this responder speaks.
    UnsupportedVersion = 5 "unsupported version",
    /// The responder has too many connections open.
    Busy = 6 "busy",
    /// The responder failed to send the descriptor.
    Internal = 7 "internal error",
    /// The requester is not a process this responder serves: another uid, or a request without
    /// the responder's secret (not a process of this job). The connection is closed.
    Denied = 8 "denied",
}

/// A responder's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The descriptor is attached; `dev`/`ino` are the responder's `fstat` of it.
    Fd { serial: u64, dev: u64, ino: u64 },
    Error {
        code: ErrorCode,
        serial: u64,
        message: String,
    },
}

/// A frame that cannot be accepted: the error code to answer with and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError {
    pub code: ErrorCode,
    pub message: String,
}

/// What the bytes received so far hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed<T> {
    /// Not a whole frame yet: at least this many bytes in total are needed.
    Incomplete(usize),
    /// A frame, and the bytes it took.
    Frame(T, usize),
}

fn header(magic: [u8; 4], kind: u16, body_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body_len);
    out.extend_from_slice(&magic);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn bad(code: ErrorCode, message: impl Into<String>) -> FrameError {
    FrameError {
        code,
        message: message.into(),
    }
}

fn malformed(message: impl Into<String>) -> FrameError {
    bad(ErrorCode::Malformed, message)
}

/// (kind, body length) of the header of `bytes`, `None` before [`HEADER_LEN`] bytes, or why not.
fn parse_header(bytes: &[u8], magic: [u8; 4]) -> Result<Option<(u16, usize)>, FrameError> {
    // A wrong magic is told as soon as its bytes are there, before a whole header arrives.
    let seen = bytes.len().min(4);
    if bytes[..seen] != magic[..seen] {
        return Err(malformed(format!(
            "frame magic {:02x?} is not {:?}: not an nvfuser-ipc fd transport peer",
            &bytes[..seen],
            String::from_utf8_lossy(&magic)
        )));
    }
    if bytes.len() < HEADER_LEN {
        return Ok(None);
    }
    let version = u16_at(bytes, 4);
    if version != VERSION {
        return Err(bad(
            ErrorCode::UnsupportedVersion,
            format!(
                "frame version {version}, this build speaks version {VERSION}: run one \
                 nvfuser-ipc version in every process of the job"
            ),
        ));
    }
    let body_len = u32_at(bytes, 8) as usize;
    if body_len > MAX_BODY {
        return Err(malformed(format!(
            "frame body of {body_len} bytes exceeds the limit of {MAX_BODY}"
        )));
    }
    Ok(Some((u16_at(bytes, 6), body_len)))
}

impl FetchRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = header(REQUEST_MAGIC, KIND_FETCH, FETCH_BODY);
        out.extend_from_slice(&self.nonce.to_le_bytes());
        out.extend_from_slice(&self.serial.to_le_bytes());
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.secret.0.to_le_bytes());
        out
    }

    /// Parses the first request in `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Parsed<FetchRequest>, FrameError> {
        let Some((kind, body_len)) = parse_header(bytes, REQUEST_MAGIC)? else {
            return Ok(Parsed::Incomplete(HEADER_LEN));
        };
        if kind != KIND_FETCH {
            return Err(malformed(format!(
                "request kind {kind} is not fetch ({KIND_FETCH})"
            )));
        }
        if body_len != FETCH_BODY {
            return Err(malformed(format!(
                "fetch request body of {body_len} bytes, expected {FETCH_BODY}"
            )));
        }
        let total = HEADER_LEN + body_len;
        if bytes.len() < total {
            return Ok(Parsed::Incomplete(total));
        }
        let b = &bytes[HEADER_LEN..total];
        Ok(Parsed::Frame(
            FetchRequest {
                nonce: u64_at(b, 0),
                serial: u64_at(b, 8),
                rank: u32_at(b, 16),
                pid: u32_at(b, 20),
                secret: Secret(u128::from_le_bytes(b[24..40].try_into().unwrap())),
            },
            total,
        ))
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Fd { serial, dev, ino } => {
                let mut out = header(REPLY_MAGIC, KIND_FD, FD_BODY);
                for v in [serial, dev, ino] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out
            }
            Reply::Error {
                code,
                serial,
                message,
            } => {
                let mut cut = message.len().min(MAX_MESSAGE);
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                let text = &message.as_bytes()[..cut];
                let mut out = header(REPLY_MAGIC, KIND_ERROR, 12 + text.len());
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                out.extend_from_slice(&serial.to_le_bytes());
                out.extend_from_slice(&(text.len() as u16).to_le_bytes());
                out.extend_from_slice(text);
                out
            }
        }
    }

    /// Parses the first reply in `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Parsed<Reply>, FrameError> {
        let Some((kind, body_len)) = parse_header(bytes, REPLY_MAGIC)? else {
            return Ok(Parsed::Incomplete(HEADER_LEN));
        };
        let total = HEADER_LEN + body_len;
        match kind {
            KIND_FD if body_len != FD_BODY => {
                return Err(malformed(format!(
                    "fd reply body of {body_len} bytes, expected {FD_BODY}"
                )))
            }
            KIND_ERROR if !(12..=12 + MAX_MESSAGE).contains(&body_len) => {
                return Err(malformed(format!("error reply body of {body_len} bytes")))
            }
            KIND_FD | KIND_ERROR => {}
            other => {
                return Err(malformed(format!(
                    "reply kind {other} is neither fd ({KIND_FD}) nor error ({KIND_ERROR})"
                )))
            }
        }
        if bytes.len() < total {
            return Ok(Parsed::Incomplete(total));
        }
        let b = &bytes[HEADER_LEN..total];
        let reply = if kind == KIND_FD {
            Reply::Fd {
                serial: u64_at(b, 0),
                dev: u64_at(b, 8),
                ino: u64_at(b, 16),
            }
        } else {
            let raw = u16_at(b, 0);
            let code = ErrorCode::from_u16(raw)
                .ok_or_else(|| malformed(format!("unknown error code {raw}")))?;
            let len = u16_at(b, 10) as usize;
            if 12 + len != body_len {
                return Err(malformed(format!(
                    "error message of {len} bytes in a body of {body_len}"
                )));
            }
            Reply::Error {
                code,
                serial: u64_at(b, 2),
                message: String::from_utf8_lossy(&b[12..]).into_owned(),
            }
        };
        Ok(Parsed::Frame(reply, total))
    }
}

#[cfg(test)]
mod tests;
