//! Buffers and transfers of the demo and the benchmarks, on the device or in shared memory:
//! one type so that the ring logic does not care where the bytes live.

use crate::device_buffer::{DeviceBuffer, DeviceStream};
use nvfuser_ipc::tools::cuda::driver::{self, ContextGuard};
use nvfuser_ipc::HostBuffer;
use nvfuser_ipc::{Error, Result};
use nvfuser_ipc::{MemKind, P2pHandles};
use std::time::Duration;

/// `--transport`: where the buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportChoice {
    /// The device when a CUDA driver and a device are there, shared memory otherwise.
    Auto,
    Device,
    Host,
}

impl TransportChoice {
    pub fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Device => "device",
            TransportChoice::Host => "host",
        }
    }

    /// The memory kind to use on this machine; `device` without a usable GPU is an error.
    pub fn resolve(self) -> Result<MemKind> {
        match self {
            TransportChoice::Host => Ok(MemKind::Host),
            TransportChoice::Device => device_usable().map(|()| MemKind::Device),
            TransportChoice::Auto => Ok(if device_usable().is_ok() {
                MemKind::Device
            } else {
                MemKind::Host
            }),
        }
    }
}

/// Ok when a CUDA driver is loaded and at least one device is visible.
pub fn device_usable() -> Result<()> {
    if !driver::is_available() {
        return Err(driver::driver().err().unwrap_or_else(|| {
            Error::internal("the CUDA driver is reported unavailable without a reason")
        }));
    }
    match driver::device_count()? {
        0 => Err(Error::unsupported(
            "the CUDA driver sees no device (check CUDA_VISIBLE_DEVICES and nvidia-smi)",
        )),
        _ => Ok(()),
    }
}

/// For device memory, makes GPU `local_rank % device count` current on this thread until the
/// guard drops (one GPU per rank on a multi-GPU node, all ranks on one GPU otherwise). Hold it
/// until every device buffer, stream and transport of the rank is gone.
pub fn enter_rank_device(kind: MemKind, local_rank: usize) -> Result<Option<ContextGuard>> {
    if kind != MemKind::Device {
        return Ok(None);
    }
    let count = driver::device_count()?.max(1) as usize;
    ContextGuard::for_device((local_rank % count) as i32).map(Some)
}

/// The label printed in tables: what the transport really is.
pub fn kind_label(kind: MemKind) -> &'static str {
    match (kind, device_memory()) {
        (MemKind::Device, DeviceMemory::Legacy) => "device (CUDA IPC)",
        (MemKind::Device, DeviceMemory::Vmm) => "device (VMM, POSIX fds, 2 MiB segments)",
        (MemKind::Host, _) => "host (shared memory)",
    }
}

/// `--device-memory`: how device buffers are allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceMemory {
    /// `cuMemAlloc` (legacy CUDA IPC).
    #[default]
    Legacy,
    /// VMM as PyTorch's expandable segments: 2 MiB physical allocations exportable as POSIX fds,
    /// mapped back to back (exchanged as fds per physical allocation).
    Vmm,
}

impl DeviceMemory {
    pub fn name(self) -> &'static str {
        match self {
            DeviceMemory::Legacy => "legacy",
            DeviceMemory::Vmm => "vmm",
        }
    }
}

/// Size of one physical allocation of a VMM buffer (PyTorch's small expandable segments).
pub const VMM_SEGMENT: u64 = 2 << 20;

static DEVICE_MEMORY: std::sync::OnceLock<DeviceMemory> = std::sync::OnceLock::new();

/// Chooses how this process allocates device buffers (once, before the first allocation).
pub fn set_device_memory(choice: DeviceMemory) {
    let _ = DEVICE_MEMORY.set(choice);
}

fn device_memory() -> DeviceMemory {
    DEVICE_MEMORY.get().copied().unwrap_or_default()
}

/// A buffer that peers can map.
pub enum Buffer {
    Host(HostBuffer),
    Device(DeviceBuffer),
}

impl Buffer {
    /// A new allocation of `bytes`; host buffers are named after `job_id`.
    pub fn alloc(kind: MemKind, job_id: &str, bytes: u64) -> Result<Buffer> {
        match kind {
            MemKind::Host => nvfuser_ipc::host_alloc_for_job(job_id, bytes).map(Buffer::Host),
            MemKind::Device => match device_memory() {
                DeviceMemory::Legacy => DeviceBuffer::alloc(bytes),
                DeviceMemory::Vmm => DeviceBuffer::alloc_vmm(bytes, VMM_SEGMENT),
            }
            .map(Buffer::Device),
        }
    }

    pub fn addr(&self) -> u64 {
        match self {
            Buffer::Host(b) => b.addr(),
            Buffer::Device(b) => b.addr(),
        }
    }

    pub fn write(&self, data: &[u8]) -> Result<()> {
        match self {
            Buffer::Host(b) => b.write(0, data),
            Buffer::Device(b) => b.write(0, data),
        }
    }

    pub fn read(&self, out: &mut [u8]) -> Result<()> {
        match self {
            Buffer::Host(b) => b.read(0, out),
            Buffer::Device(b) => b.read(0, out),
        }
    }
}

/// Moves bytes over exchanged handles with nvFuser's get protocol: the sender posts, the
/// receiver pulls from the sender's buffer and signals, the sender waits for that signal.
pub enum Mover {
    Host {
        timeout: Duration,
    },
    Device {
        stream: DeviceStream,
        timeout: Duration,
    },
}

impl Mover {
    pub fn new(kind: MemKind, timeout: Duration) -> Result<Mover> {
        Ok(match kind {
            MemKind::Host => Mover::Host { timeout },
            MemKind::Device => Mover::Device {
                stream: DeviceStream::new()?,
                timeout,
            },
        })
    }

    /// One ring step: announce `send`, pull `bytes` over `recv`, wait until `send` was pulled.
    /// Returns when the received bytes are in the local receive buffer.
    pub fn ring_step(&self, send: &P2pHandles, recv: &P2pHandles, bytes: u64) -> Result<()> {
        match self {
            Mover::Host { timeout } => {
                nvfuser_ipc::host_p2p_send_post(send)?;
                nvfuser_ipc::host_p2p_recv_post(recv, bytes, *timeout)?;
                nvfuser_ipc::host_p2p_send_wait(send, *timeout)?;
            }
            Mover::Device { stream, timeout } => {
                nvfuser_ipc::cuda_p2p_send_post(send, stream.stream())?;
                nvfuser_ipc::cuda_p2p_recv_post(recv, bytes, stream.stream())?;
                nvfuser_ipc::cuda_p2p_send_wait(send, stream.stream())?;
                stream.synchronize_within(*timeout)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
