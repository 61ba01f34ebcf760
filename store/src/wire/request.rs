//! A parsed request's key and pair lists, and its re-encoding ([`Request`] is declared with
//! [`Command`] in `mod.rs`).

use super::*;

/// A list of keys inside a parsed frame: `count` validated blobs, decoded lazily (no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyList<'a> {
    pub(super) count: usize,
    /// `count × (u64 len ‖ bytes)`, already validated.
    pub(super) raw: &'a [u8],
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
    pub(super) count: usize,
    pub(super) raw: &'a [u8],
}

impl<'a> PairList<'a> {
    /// The (key, value) pairs, in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        let mut blobs = BlobIter {
            remaining: self.count.saturating_mul(2),
            raw: self.raw,
        };
        std::iter::from_fn(move || Some((blobs.next()?, blobs.next()?)))
    }
}

impl Request<'_> {
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
}
