//! Owned device memory and streams for programs that drive the exchange themselves (the CLI's
//! demo and benchmarks, tests): `cuMemAlloc`/`cuMemFree` buffers or VMM buffers laid out as
//! PyTorch's expandable segments lay them out (several physical allocations exportable as POSIX
//! fds, mapped back to back), blocking host<->device copies, and a `CUstream` that is
//! synchronised and destroyed on drop.
//!
//! Every call makes sure a context is current first (the current one, else device 0's primary
//! context, see [`driver::ensure_context`]); buffers and streams remember their context and use
//! it again when they are dropped. The library never allocates device memory: this file is the
//! CLI's, and the integration tests include it (`tests/exchange.rs`).

use cudarc::driver::sys;
use nvfuser_ipc::tools::cuda::driver::{self, ContextGuard, CudaContext};
use nvfuser_ipc::tools::cuda::result;
use nvfuser_ipc::Stream;
use nvfuser_ipc::{Error, Result};
use std::time::{Duration, Instant};

/// A device allocation, freed on drop: `cuMemAlloc`'d, or VMM.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    bytes: u64,
    ctx: CudaContext,
    /// For a VMM buffer: its physical allocations.
    vmm: Option<VmmParts>,
}

/// The physical allocations of a VMM buffer, each `segment` bytes, in a reserved range of
/// `size` bytes.
#[derive(Debug)]
struct VmmParts {
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    segment: u64,
    size: u64,
}

impl DeviceBuffer {
    /// Allocates `bytes` (uninitialised) on the current device.
    pub fn alloc(bytes: u64) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(Error::invalid("device allocation of 0 bytes"));
        }
        let ctx = driver::ensure_context(None)?;
        // A context is current (ensure_context above).
        let ptr = result::mem_alloc(bytes as usize)
            .map_err(|rc| driver::error(rc, &format!("cuMemAlloc({bytes} bytes)")))?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx,
            vmm: None,
        })
    }

    /// Allocates `bytes` (uninitialised) of VMM memory on the current device as PyTorch's
    /// expandable segments do: physical allocations of `segment` bytes (rounded up to the
    /// device's granularity) created with POSIX fd handles and mapped back to back.
    pub fn alloc_vmm(bytes: u64, segment: u64) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(Error::invalid("device allocation of 0 bytes"));
        }
        let ctx = driver::ensure_context(None)?;
        let device = ctx.device()?;
        let granularity = result::mem_granularity(device)
            .map_err(|rc| driver::error(rc, "cuMemGetAllocationGranularity"))?;
        let segment = segment.max(1).div_ceil(granularity) * granularity;
        let count = bytes.div_ceil(segment);
        let size = count * segment;
        let base = result::mem_address_reserve(size, segment)
            .map_err(|rc| driver::error(rc, &format!("cuMemAddressReserve({size})")))?;
        let mut buf = DeviceBuffer {
            ptr: base,
            bytes,
            ctx,
            vmm: Some(VmmParts {
                handles: Vec::new(),
                segment,
                size,
            }),
        };
        for i in 0..count {
            let handle = result::mem_create(segment, device, result::HANDLE_TYPE_POSIX_FD)
                .map_err(|rc| driver::error(rc, &format!("cuMemCreate({segment})")))?;
            buf.vmm.as_mut().expect("set above").handles.push(handle);
            // SAFETY: [base + i * segment, + segment) lies in the range reserved above and
            // nothing is mapped there yet.
            unsafe { result::mem_map(base + i * segment, segment, handle) }
                .map_err(|rc| driver::error(rc, "cuMemMap"))?;
        }
        result::mem_set_access_rw(base, size, device)
            .map_err(|rc| driver::error(rc, "cuMemSetAccess"))?;
        Ok(buf)
    }

    /// The device address (what requests carry).
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// A VMM buffer's physical allocations and their size each, in address order.
    #[allow(dead_code)] // the integration tests that include this file do not use it
    pub fn vmm_segments(&self) -> Option<(&[sys::CUmemGenericAllocationHandle], u64)> {
        self.vmm.as_ref().map(|v| (v.handles.as_slice(), v.segment))
    }

    fn check_range(&self, offset: u64, n: usize) -> Result<()> {
        if offset
            .checked_add(n as u64)
            .map_or(true, |end| end > self.bytes)
        {
            return Err(Error::invalid(format!(
                "range [{offset}, +{n}) is outside the {}-byte device buffer",
                self.bytes
            )));
        }
        Ok(())
    }

    /// Copies `data` to the buffer at `offset`; returns when the copy is done.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        let _guard = ContextGuard::enter(self.ctx)?;
        // SAFETY: the destination range lies inside this live allocation (checked above) and
        // the source is a valid slice of `data.len()` bytes, read before the call returns.
        unsafe { result::memcpy_htod(self.ptr + offset, data) }
            .map_err(|rc| driver::error(rc, "cuMemcpyHtoD"))?;
        // From pageable memory the call may return before the bytes reach the device; peers
        // read the buffer from their own streams, so wait until they are there.
        self.ctx.synchronize()
    }

    /// Copies `out.len()` bytes from the buffer at `offset`; returns when the copy is done.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        let _guard = ContextGuard::enter(self.ctx)?;
        // SAFETY: the source range lies inside this live allocation (checked above) and `out`
        // is a valid, exclusively borrowed slice of `out.len()` bytes; the copy is synchronous.
        unsafe { result::memcpy_dtoh(out, self.ptr + offset) }
            .map_err(|rc| driver::error(rc, "cuMemcpyDtoH"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_guard) = ContextGuard::enter(self.ctx) {
            match self.vmm.take() {
                // SAFETY: `ptr` came from cuMemAlloc in this context and is freed exactly once.
                // A failure cannot be reported from drop; the memory then stays allocated.
                None => drop(unsafe { result::mem_free(self.ptr) }),
                Some(VmmParts {
                    handles,
                    segment,
                    size,
                }) => {
                    // SAFETY: the range was reserved by alloc_vmm, each segment mapped there
                    // once (unmapping a segment that failed to map only fails), released once
                    // and the range freed once; the owner queues no more work on it.
                    unsafe {
                        for (i, handle) in handles.iter().enumerate() {
                            let _ = result::mem_unmap(self.ptr + i as u64 * segment, segment);
                            let _ = result::mem_release(*handle);
                        }
                        let _ = result::mem_address_free(self.ptr, size);
                    }
                }
            }
        }
    }
}

/// A non-blocking `CUstream`, synchronised and destroyed on drop.
#[derive(Debug)]
pub struct DeviceStream {
    raw: usize,
    ctx: CudaContext,
}

impl DeviceStream {
    pub fn new() -> Result<DeviceStream> {
        let ctx = driver::ensure_context(None)?;
        // A context is current (ensure_context above).
        let raw = result::stream_create(sys::CUstream_flags::CU_STREAM_NON_BLOCKING)
            .map_err(|rc| driver::error(rc, "cuStreamCreate"))?;
        Ok(DeviceStream {
            raw: raw as usize,
            ctx,
        })
    }

    /// The stream as the P2P primitives take it.
    pub fn stream(&self) -> Stream {
        Stream(self.raw)
    }

    /// Waits, at most `timeout`, for everything queued on the stream. Queued semaphore waits
    /// block the stream until a peer signals, so a peer that died would otherwise hang this
    /// process for ever: past the timeout this returns `Timeout` (the queued work stays queued).
    pub fn synchronize_within(&self, timeout: Duration) -> Result<()> {
        let _guard = ContextGuard::enter(self.ctx)?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            // SAFETY: the stream was created by cuStreamCreate and is not destroyed yet.
            match unsafe { result::stream_query(self.raw as sys::CUstream) } {
                Err(sys::CUresult::CUDA_ERROR_NOT_READY) => {}
                done => return done.map_err(|rc| driver::error(rc, "cuStreamQuery")),
            }
            if start.elapsed() >= timeout {
                return Err(Error::timeout(format!(
                    "the work queued on the stream did not finish within {timeout:?}: a peer may \
                     have stopped before signalling its semaphore"
                )));
            }
            // Short transfers finish in microseconds; back off to 1 ms for long waits.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Waits for everything queued on the stream.
    #[allow(dead_code)] // the integration tests use it
    pub fn synchronize(&self) -> Result<()> {
        let _guard = ContextGuard::enter(self.ctx)?;
        // SAFETY: the stream was created by cuStreamCreate and is not destroyed yet.
        unsafe { result::stream_synchronize(self.raw as sys::CUstream) }
            .map_err(|rc| driver::error(rc, "cuStreamSynchronize"))
    }
}

impl Drop for DeviceStream {
    fn drop(&mut self) {
        if let Ok(_guard) = ContextGuard::enter(self.ctx) {
            let raw = self.raw as sys::CUstream;
            // SAFETY: the stream is live and destroyed exactly once; synchronising first keeps
            // queued work from outliving buffers the owner frees next. Failures cannot be
            // reported from drop.
            unsafe {
                let _ = result::stream_synchronize(raw);
                let _ = result::stream_destroy(raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfuser_ipc::Status;

    #[test]
    fn without_a_driver_everything_is_a_clean_error() {
        if driver::is_available() {
            let buf = DeviceBuffer::alloc(64).unwrap();
            buf.write(0, &[7u8; 64]).unwrap();
            let mut out = [0u8; 64];
            buf.read(0, &mut out).unwrap();
            assert_eq!(out, [7u8; 64]);
            assert!(buf.write(60, &[0u8; 8]).is_err());
            let stream = DeviceStream::new().unwrap();
            stream.synchronize().unwrap();
        } else {
            let err = DeviceBuffer::alloc(64).unwrap_err();
            assert_eq!(err.status, Status::CudaUnavailable);
            assert_eq!(
                DeviceStream::new().unwrap_err().status,
                Status::CudaUnavailable
            );
        }
        assert_eq!(
            DeviceBuffer::alloc(0).unwrap_err().status,
            Status::InvalidArgument
        );
    }
}
