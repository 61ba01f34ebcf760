//! Blocking reply readers on a `Read`: a corrupt length is `InvalidData`, EOF `UnexpectedEof`.

use super::*;
use std::io::{self, Read};

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

/// Reads one blob into `out` (cleared first), growing it as bytes arrive (not by the length).
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

/// A count of a reply, which must not be negative.
fn read_count(r: &mut impl Read, command: Command, field: &'static str) -> io::Result<u64> {
    let count = read_i64(r)?;
    u64::try_from(count)
        .map_err(|_| reply_error(command, field, ParseErrorKind::Negative(count)).into())
}

/// QUEUE_POP reply: `Some(value)`, or `None` when the queue was empty.
pub fn read_queue_pop(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    match read_count(r, Command::QueuePop, "reply queue length")? {
        0 => Ok(None),
        _ => read_blob(r).map(Some),
    }
}

/// LIST reply: keys in wire form.
pub fn read_list(r: &mut impl Read) -> io::Result<Vec<Vec<u8>>> {
    let count = read_count(r, Command::List, "reply key count")?;
    let mut keys = Vec::with_capacity((count as usize).min(MAX_KEY_COUNT));
    for _ in 0..count {
        keys.push(read_blob(r)?);
    }
    Ok(keys)
}
