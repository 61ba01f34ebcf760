//! The incremental, zero-copy request parser. Limits are checked as soon as a length is read, so
//! an over-limit request is an error before its payload arrives.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A whole request and the number of bytes it used.
    Request(Request<'a>, usize),
    /// The buffer holds only the start of a request, which needs at least `needed` bytes.
    Incomplete { needed: usize },
}

/// Parses the first request in `buf`: `Ok(Some((request, consumed)))`, `Ok(None)` when more
/// bytes are needed, `Err` when the bytes can never become a valid request.
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
