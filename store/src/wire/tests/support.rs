//! Test helpers: reply decoders over byte slices, which check the server's replies byte by byte
//! (the client reads replies from its socket with `reply.rs`; `Ok(None)` means "need more
//! bytes"), and the BARRIER encoder (the client never sends BARRIER).

use super::*;
use crate::error::Result;

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

/// `BARRIER key world_size`; reply: one byte, STOP_WAITING once `world_size` arrivals at `key`
/// were counted (a torch >= 2.15 server, or ours).
pub fn encode_barrier<K: WireBytes + ?Sized>(
    out: &mut Vec<u8>,
    key: &K,
    world_size: i64,
) -> Result<()> {
    framed(out, Command::Barrier, |out| {
        put_field(out, Command::Barrier, "key", key)?;
        put_i64(out, world_size);
        Ok(())
    })
}
