//! The floor of the symmetric rendezvous over device memory: what the driver calls alone cost
//! when every rank of the group, one fresh process each, shares a buffer of the same size with
//! every other rank at once. Per rank: its export (an fd per physical allocation of a VMM buffer,
//! or a legacy IPC handle), the handles handed to each peer over a Unix socket, and per peer the
//! import, the reservation, the mappings and the access grant. No store, no board, no cache: the
//! least the library's first rendezvous can cost on this machine.
//!
//! Each rank listens on an abstract socket named after the job and its rank, bound before the
//! start barrier; a server thread hands this rank's handles to each peer that connects once
//! they are exported. The mappings are checked against the peers' patterns before teardown.

use super::{RankArgs, Series};
use crate::memory::{Buffer, DeviceMemory};
use crate::stats::nanos;
use cudarc::driver::sys;
use nvfuser_ipc::tools::cuda::{driver, result};
use nvfuser_ipc::tools::os::{recv_with_fd, send_with_fd};
use nvfuser_ipc::Context;
use nvfuser_ipc::MemKind;
use nvfuser_ipc::{Error, Result};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::mpsc;
use std::time::Instant;

/// The parts of the floor, in the order they happen (summed over peers).
pub const PARTS: [&str; 6] = [
    "export",
    "fd_pass",
    "import",
    "reserve",
    "map",
    "set_access",
];

/// What a rank hands its peers.
enum Exported {
    Fds(Vec<OwnedFd>),
    Legacy([u8; 64]),
}

/// What a rank holds of one peer, undone on drop.
enum PeerMapping {
    Vmm {
        base: u64,
        size: u64,
        mapped: u64,
        handles: Vec<sys::CUmemGenericAllocationHandle>,
    },
    Legacy {
        base: u64,
    },
}

impl PeerMapping {
    fn base(&self) -> u64 {
        match self {
            PeerMapping::Vmm { base, .. } | PeerMapping::Legacy { base } => *base,
        }
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: everything here was imported, reserved, mapped or opened by this rank, once,
        // and is undone once; the mapping was only read synchronously before.
        unsafe {
            match self {
                PeerMapping::Vmm {
                    base,
                    size,
                    mapped,
                    handles,
                } => {
                    if *mapped > 0 {
                        let _ = result::mem_unmap(*base, *mapped);
                    }
                    if *size > 0 {
                        let _ = result::mem_address_free(*base, *size);
                    }
                    for h in handles.drain(..) {
                        let _ = result::mem_release(h);
                    }
                }
                PeerMapping::Legacy { base } => {
                    let _ = result::ipc_close_mem_handle(*base);
                }
            }
        }
    }
}

fn socket_name(job: &str, rank: usize) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("nvfipc-bench-floor/{job}/{rank}"))
        .map_err(|e| Error::from_io("naming the floor's socket", &e))
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::from_io(what, &e)
}

fn drv(what: &'static str) -> impl FnOnce(sys::CUresult) -> Error {
    move |rc| driver::error(rc, what)
}

/// Hands `exported` to each of `peers` connections.
fn serve(listener: UnixListener, peers: usize, exported: &Exported) -> Result<()> {
    for _ in 0..peers {
        let (mut conn, _) = listener.accept().map_err(io("accepting a peer".into()))?;
        match exported {
            Exported::Legacy(bytes) => conn.write_all(bytes),
            Exported::Fds(fds) => {
                let count = [u8::try_from(fds.len()).unwrap_or(u8::MAX)];
                conn.write_all(&count).and_then(|()| {
                    fds.iter().try_for_each(|fd| {
                        send_with_fd(conn.as_fd(), b"f", Some(fd.as_fd())).map(drop)
                    })
                })
            }
        }
        .map_err(io("handing this rank's handles to a peer".into()))?;
    }
    Ok(())
}

/// Runs the floor on one rank: one timed round after a barrier.
pub fn run(ctx: &Context, args: &RankArgs, memory: DeviceMemory) -> Result<Vec<Series>> {
    let rank = ctx.rank;
    let buf = Buffer::alloc(MemKind::Device, &ctx.job_id, args.bytes)?;
    buf.write(&super::symmetric::pattern(rank, 0))?;
    let Buffer::Device(dev) = &buf else {
        return Err(Error::internal("the floor needs a device buffer"));
    };
    let segments: Vec<_> = match memory {
        DeviceMemory::Vmm => {
            let (handles, size) = dev
                .vmm_segments()
                .ok_or_else(|| Error::internal("a VMM buffer without physical allocations"))?;
            handles.iter().map(|&h| (h, size)).collect()
        }
        DeviceMemory::Legacy => Vec::new(),
    };
    let listener = UnixListener::bind_addr(&socket_name(&ctx.job_id, rank)?)
        .map_err(io(format!("rank {rank}: binding the floor's socket")))?;
    let (tx, rx) = mpsc::channel::<Exported>();
    let peers = ctx.world_size - 1;
    let server = std::thread::spawn(move || -> Result<()> {
        match rx.recv() {
            Ok(exported) => serve(listener, peers, &exported),
            Err(_) => Ok(()),
        }
    });
    let device = driver::ensure_context(None)?.device()?;
    let mut parts = [0u64; PARTS.len()];
    let mut held = Vec::with_capacity(peers);
    ctx.barrier(None, None)?;

    let start = Instant::now();
    let exported = match memory {
        DeviceMemory::Vmm => Exported::Fds(
            segments
                .iter()
                .map(|&(h, _)| {
                    result::mem_export_fd(h).map_err(drv("cuMemExportToShareableHandle"))
                })
                .collect::<Result<_>>()?,
        ),
        DeviceMemory::Legacy => Exported::Legacy(
            result::ipc_get_mem_handle(dev.addr())
                .map_err(drv("cuIpcGetMemHandle"))?
                .reserved
                .map(|b| b as u8),
        ),
    };
    let _ = tx.send(exported);
    parts[0] = nanos(start.elapsed());
    for peer in (1..ctx.world_size).map(|i| (rank + i) % ctx.world_size) {
        let lap = Instant::now();
        let mut conn = UnixStream::connect_addr(&socket_name(&ctx.job_id, peer)?).map_err(io(
            format!("rank {rank}: connecting to rank {peer}'s floor socket"),
        ))?;
        let got = match memory {
            DeviceMemory::Vmm => {
                let mut count = [0u8];
                conn.read_exact(&mut count)
                    .map_err(io(format!("reading rank {peer}'s fd count")))?;
                let mut fds = Vec::with_capacity(count[0] as usize);
                for _ in 0..count[0] {
                    let mut byte = [0u8];
                    let (_, fd) = recv_with_fd(conn.as_fd(), &mut byte)
                        .map_err(io(format!("receiving rank {peer}'s fds")))?;
                    fds.push(fd.ok_or_else(|| Error::protocol("a floor message without its fd"))?);
                }
                Exported::Fds(fds)
            }
            DeviceMemory::Legacy => {
                let mut bytes = [0u8; 64];
                conn.read_exact(&mut bytes)
                    .map_err(io(format!("reading rank {peer}'s handle")))?;
                Exported::Legacy(bytes)
            }
        };
        parts[1] += nanos(lap.elapsed());
        held.push(map_peer(got, &segments, device, &mut parts)?);
    }
    let floor = nanos(start.elapsed());

    server
        .join()
        .map_err(|_| Error::internal("the floor's server thread panicked"))??;
    for (i, mapping) in held.iter().enumerate() {
        let peer = (rank + 1 + i) % ctx.world_size;
        let mut got = [0u8; super::symmetric::PATTERN_BYTES];
        // SAFETY: the mapping covers the peer's whole buffer (at least PATTERN_BYTES) in this
        // process's current context; the copy is synchronous into `got`.
        unsafe { result::memcpy_dtoh(&mut got, mapping.base()) }
            .map_err(drv("cuMemcpyDtoH of a peer's mapping"))?;
        if got != super::symmetric::pattern(peer, 0) {
            return Err(Error::protocol(format!(
                "rank {rank}: rank {peer}'s buffer as mapped by the floor holds {got:?}, not that \
                 rank's pattern"
            )));
        }
    }
    // Nobody frees its buffer before every peer has unmapped it.
    drop(held);
    ctx.barrier(None, None)?;
    drop(buf);
    let mut out = vec![("symm.floor".to_string(), vec![floor])];
    for (name, ns) in PARTS.iter().zip(parts) {
        out.push((format!("symm.floor_part.{name}"), vec![ns]));
    }
    Ok(out)
}

/// Imports, reserves, maps and grants access to one peer's buffer (the peer's segments have the
/// sizes of this rank's own: every rank allocates the same bytes the same way).
fn map_peer(
    got: Exported,
    segments: &[(sys::CUmemGenericAllocationHandle, u64)],
    device: i32,
    parts: &mut [u64; PARTS.len()],
) -> Result<PeerMapping> {
    let mut lap = Instant::now();
    let mut charge = |part: usize| {
        parts[part] += nanos(lap.elapsed());
        lap = Instant::now();
    };
    match got {
        Exported::Legacy(bytes) => {
            let handle = sys::CUipcMemHandle {
                reserved: bytes.map(|b| b as std::ffi::c_char),
            };
            let base = result::ipc_open_mem_handle(handle).map_err(drv("cuIpcOpenMemHandle"))?;
            charge(2);
            Ok(PeerMapping::Legacy { base })
        }
        Exported::Fds(fds) => {
            let mut mapping = PeerMapping::Vmm {
                base: 0,
                size: 0,
                mapped: 0,
                handles: Vec::with_capacity(fds.len()),
            };
            let PeerMapping::Vmm {
                base,
                size,
                mapped,
                handles,
            } = &mut mapping
            else {
                unreachable!("built above")
            };
            for fd in &fds {
                handles.push(
                    result::mem_import_fd(fd.as_fd())
                        .map_err(drv("cuMemImportFromShareableHandle"))?,
                );
            }
            drop(fds);
            charge(2);
            let total: u64 = segments.iter().map(|(_, s)| s).sum();
            *base = result::mem_address_reserve(total, 0).map_err(drv("cuMemAddressReserve"))?;
            *size = total;
            charge(3);
            for (h, (_, bytes)) in handles.iter().zip(segments) {
                // SAFETY: [base + mapped, + bytes) lies in the range reserved above, where
                // nothing is mapped yet (segments are mapped back to back).
                unsafe { result::mem_map(*base + *mapped, *bytes, *h) }.map_err(drv("cuMemMap"))?;
                *mapped += bytes;
            }
            charge(4);
            result::mem_set_access_rw(*base, *mapped, device).map_err(drv("cuMemSetAccess"))?;
            charge(5);
            Ok(mapping)
        }
    }
}
