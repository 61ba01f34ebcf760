//! The host transport: CPU buffers in anonymous shared files passed between processes by file
//! descriptor (`crate::fdpass`), so the whole exchange protocol, fd passing included, runs across
//! real processes on machines without a GPU.
//! [`alloc`](mod@alloc) is the allocator, [`transport`] the transport and its views, [`slab`] the
//! semaphore slab, [`p2p`] the get-zcopy primitives; this module, host handles on the wire.

pub mod alloc;
pub mod p2p;
pub mod slab;
pub mod transport;

pub use alloc::{alloc, alloc_for_job, free, HostBuffer};
pub use transport::HostTransport;

use crate::error::{Error, Result};
use crate::fdpass::registry::FD_ID_LEN;
use crate::fdpass::FdId;
use crate::transport::record::{HandleType, PAYLOAD_LEN};
use crate::transport::ExportedHandle;

/// The handle of a descriptor registered with the fd transport as `id`: host memory travels as
/// fd ids in a record's payload.
pub fn fd_handle(id: &FdId) -> ExportedHandle {
    let mut payload = [0u8; PAYLOAD_LEN];
    payload[..FD_ID_LEN].copy_from_slice(&id.encode());
    ExportedHandle::plain(HandleType::PosixFd, payload)
}

/// The [`FdId`] in a host handle's payload; `what` names the handle for the error.
pub fn fd_id(handle_type: HandleType, payload: &[u8; PAYLOAD_LEN], what: &str) -> Result<FdId> {
    if handle_type != HandleType::PosixFd {
        return Err(Error::protocol(format!(
            "{what} is a {} handle, but host memory travels as POSIX file descriptors",
            handle_type.name()
        )));
    }
    let (id, rest) = payload.split_at(FD_ID_LEN);
    FdId::decode(id)
        .filter(|_| rest.iter().all(|&b| b == 0))
        .ok_or_else(|| {
            Error::protocol(format!(
                "{what} does not hold a valid fd id: all ranks must use the same nvfuser-ipc \
                 version"
            ))
        })
}

#[cfg(test)]
mod tests;
