//! Records that never touch the store. A handle record names memory: a legacy CUDA IPC handle or
//! a FABRIC handle in it is a capability that any process can open, whatever its uid, and the
//! store is readable and writable by anyone who reaches its port. So an exporter writes each
//! record into an anonymous file sealed immutable and offers that file through its responder;
//! the store carries only a [`Notice`] naming it. An importer fetches the file as it fetches any
//! descriptor (the responder and the importer each check the other's uid with the kernel), checks
//! its owner and seals, and reads the record and the store key it was written for from it.
//! Docs: PROTOCOL.md section 3, "Where records travel", and section 7, "Trust boundary".

use super::registry::{FdId, FD_ID_LEN};
use super::FdPass;
use crate::error::{Error, Result};
use crate::os::memfd;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

const NOTICE_MAGIC: [u8; 4] = *b"NVFN";
const NOTICE_VERSION: u16 = 1;
/// Bytes of an encoded [`Notice`].
pub const NOTICE_LEN: usize = 56;

const FILE_MAGIC: [u8; 4] = *b"NVFS";
const FILE_HEADER: usize = 12;
/// Longest store key a sealed record carries.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest record a sealed file carries: the fixed part and the most segments (PROTOCOL.md §3).
pub const MAX_RECORD_LEN: usize = crate::transport::record::RECORD_LEN
    + crate::transport::record::SEGMENT_LEN * crate::transport::record::MAX_SEGMENTS;

/// What the store holds in place of a record: who sealed it and which of its files holds it.
/// Untrusted input to its reader: it only says where to ask; the answer is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The exporter's rank and pid.
    pub rank: u32,
    pub pid: u32,
    /// Bytes of the record in the file.
    pub record_len: u32,
    /// The sealed file, registered with the exporter's responder.
    pub id: FdId,
}

impl Notice {
    /// `NVFN | version u16 | reserved u16 | rank u32 | pid u32 | record_len u32 | reserved u32 | FdId`.
    pub fn encode(&self) -> [u8; NOTICE_LEN] {
        let mut out = [0u8; NOTICE_LEN];
        out[..4].copy_from_slice(&NOTICE_MAGIC);
        out[4..6].copy_from_slice(&NOTICE_VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&self.rank.to_le_bytes());
        out[12..16].copy_from_slice(&self.pid.to_le_bytes());
        out[16..20].copy_from_slice(&self.record_len.to_le_bytes());
        out[NOTICE_LEN - FD_ID_LEN..].copy_from_slice(&self.id.encode());
        out
    }

    /// Parses a notice read from the store under `key`, naming what is wrong with it.
    pub fn decode(bytes: &[u8], key: &str) -> Result<Notice> {
        if bytes.is_empty() {
            return Err(Error::not_found(format!(
                "the store key {key} was deleted before this rank read it (its value is \
                 empty): its exporter closed its cache or left, or another process deleted it"
            )));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let parsed = (bytes.len() == NOTICE_LEN && bytes[..4] == NOTICE_MAGIC)
            .then(|| {
                let version = u16::from_le_bytes([bytes[4], bytes[5]]);
                let id = FdId::decode(&bytes[NOTICE_LEN - FD_ID_LEN..])?;
                let record_len = u32_at(16);
                let fits = (record_len as usize) <= MAX_RECORD_LEN;
                (version == NOTICE_VERSION && fits).then_some(Notice {
                    rank: u32_at(8),
                    pid: u32_at(12),
                    record_len,
                    id,
                })
            })
            .flatten();
        parsed.ok_or_else(|| {
            let head = if bytes.len() >= 4 && bytes[..4] == *b"NVFI" {
                "a handle record itself (an nvfuser-ipc of another version published it in the \
                 store, where records no longer travel)"
            } else {
                "not a record notice of this nvfuser-ipc version"
            };
            Error::protocol(format!(
                "the store key {key} holds {} bytes that are {head}; all ranks must use the \
                 same nvfuser-ipc version (if they do, another process wrote the key)",
                bytes.len()
            ))
        })
    }
}

/// A record offered to the job's importers; withdrawn (its file closed here) on drop.
pub struct SealedRecord {
    fdpass: Arc<FdPass>,
    id: FdId,
}

impl std::fmt::Debug for SealedRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SealedRecord({})", self.id)
    }
}

impl Drop for SealedRecord {
    fn drop(&mut self) {
        self.fdpass.unregister(&self.id);
    }
}

/// `NVFS | key_len u32 | record_len u32 | key | record`.
fn file_content(key: &str, record: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FILE_HEADER + key.len() + record.len());
    out.extend_from_slice(&FILE_MAGIC);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(record.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(record);
    out
}

/// The record in a sealed file's `content`, which must have been written for `key` and hold
/// `record_len` bytes.
fn record_of(content: &[u8], key: &str, record_len: u32, what: &str) -> Result<Vec<u8>> {
    let bad = |why: String| Error::protocol(format!("{what}: {why}; it is not used"));
    if content.len() < FILE_HEADER || content[..4] != FILE_MAGIC {
        return Err(bad("not a sealed record of this nvfuser-ipc version".into()));
    }
    let key_len = u32::from_le_bytes(content[4..8].try_into().expect("4")) as usize;
    let rec_len = u32::from_le_bytes(content[8..12].try_into().expect("4")) as usize;
    if content.len() != FILE_HEADER + key_len + rec_len {
        return Err(bad(format!(
            "{} bytes, but its header says {key_len} of key and {rec_len} of record",
            content.len()
        )));
    }
    let written_for = &content[FILE_HEADER..FILE_HEADER + key_len];
    if written_for != key.as_bytes() {
        return Err(bad(format!(
            "it was written for the store key {:?}, not for {key:?} (the notice in the store \
             was moved or forged)",
            String::from_utf8_lossy(written_for)
        )));
    }
    if rec_len != record_len as usize {
        return Err(bad(format!(
            "it holds a {rec_len}-byte record, the notice says {record_len}"
        )));
    }
    Ok(content[FILE_HEADER + key_len..].to_vec())
}

impl FdPass {
    /// Offers `record`, published under the store key `key`, to the job's importers: returns the
    /// notice to put in the store and the guard that keeps the record offered.
    pub fn seal_record(
        self: &Arc<Self>,
        key: &str,
        record: &[u8],
    ) -> Result<([u8; NOTICE_LEN], SealedRecord)> {
        if key.len() > MAX_KEY_LEN || record.len() > MAX_RECORD_LEN {
            return Err(Error::invalid(format!(
                "record for {key:?}: {} bytes of key and {} of record exceed the limits ({} \
                 and {})",
                key.len(),
                record.len(),
                MAX_KEY_LEN,
                MAX_RECORD_LEN
            )));
        }
        let fd = memfd::create_immutable("nvfipc-record", &file_content(key, record))
            .map_err(|e| Error::from_io(format!("sealing the record for {key}"), &e))?;
        let id = self.register(fd)?;
        let notice = Notice {
            rank: u32::try_from(self.rank).unwrap_or(u32::MAX),
            pid: std::process::id(),
            record_len: record.len() as u32,
            id,
        };
        let sealed = SealedRecord {
            fdpass: self.clone(),
            id,
        };
        Ok((notice.encode(), sealed))
    }

    /// The record `peer` sealed for the store key `key`, whose notice `notice_bytes` was read
    /// there; fetched within `wait` from the peer's responder, which the kernel vouches for.
    pub fn open_record(
        &self,
        peer: usize,
        key: &str,
        notice_bytes: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        let notice = Notice::decode(notice_bytes, key)?;
        if notice.rank as usize != peer {
            return Err(Error::protocol(format!(
                "the store key {key} names rank {} as its exporter, expected peer rank {peer} \
                 (another process wrote the key)",
                notice.rank
            )));
        }
        let what = format!("the record of peer rank {peer} for {key}");
        let fd = self
            .fetch(peer, &notice.id, wait)
            .map_err(|e| e.context(format!("fetching {what}")))?;
        super::vouch::file_owner(fd.as_fd(), &self.config.trusted, &what)?;
        let content = memfd::read_immutable(fd, FILE_HEADER + MAX_KEY_LEN + MAX_RECORD_LEN, &what)?;
        record_of(&content, key, notice.record_len, &what)
    }
}

#[cfg(test)]
mod tests;
