//! Rank side of the post benchmark: what one `send_post` costs the calling thread through the C
//! ABI, on an opened channel (`nvfipc_*_channel_send_post`) and through the cache and request
//! (`nvfipc_*_p2p_send_post`: request conversion and channel lookup on every call).
//!
//! Two ranks, one channel: rank 0 sends, rank 1 receives. Every transfer is completed (rank 0
//! waits for it, rank 1 pulls it), but only rank 0's post is timed, one call at a time. Host
//! posts write the peer's semaphore; device posts enqueue the write on a stream, which both
//! ranks synchronise every [`SYNC_EVERY`] transfers (untimed) so that the queue never fills. The
//! two calls alternate in blocks, so that a slow spell of the machine hits both alike.

use super::{gather, RankArgs, Series};
use crate::device_buffer::DeviceStream;
use crate::memory::Buffer;
use crate::stats::nanos;
use nvfuser_ipc::ffi::boundary::nvfipc_last_error_message;
use nvfuser_ipc::ffi::channel::*;
use nvfuser_ipc::ffi::cuda::*;
use nvfuser_ipc::ffi::exchange::*;
use nvfuser_ipc::ffi::host::*;
use nvfuser_ipc::Context;
use nvfuser_ipc::{CacheConfig, MemKind, Request};
use nvfuser_ipc::{Error, Result, Status};
use std::ffi::{c_void, CStr, CString};
use std::time::{Duration, Instant};

/// Untimed transfers first (the first ones fault pages in and warm the caches).
const WARMUP: usize = 200;
/// The two calls alternate in this many blocks.
const BLOCKS: usize = 8;
/// Device transfers between two stream synchronisations.
const SYNC_EVERY: usize = 32;

const TAG: &str = "nvfipc-bench/post";

/// A failed C call as an error with the library's message.
fn check(status: Status, call: &str) -> Result<()> {
    if status == Status::Ok {
        return Ok(());
    }
    // SAFETY: never NULL; read at once, before any other call on this thread.
    let message = unsafe { CStr::from_ptr(nvfipc_last_error_message()) }.to_string_lossy();
    Err(Error::new(status, format!("{call}: {message}")))
}

/// How a post is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Channel,
    Request,
}

/// One rank's side of the channel, through the C ABI.
struct Side {
    cache: *mut nvfipc_cache,
    req: nvfipc_request,
    ch: *mut nvfipc_channel,
    kind: MemKind,
    stream: Option<DeviceStream>,
    bytes: u64,
    timeout: Duration,
}

impl Side {
    fn raw_stream(&self) -> *mut c_void {
        self.stream
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.stream().0 as *mut c_void)
    }

    /// Sender: posts the next transfer; returns the call's time.
    fn post(&self, via: Via) -> Result<u64> {
        let stream = self.raw_stream();
        let start = Instant::now();
        let status = match (self.kind, via) {
            (MemKind::Host, Via::Channel) => nvfipc_host_channel_send_post(self.ch),
            (MemKind::Host, Via::Request) => nvfipc_host_p2p_send_post(self.cache, &self.req),
            (MemKind::Device, Via::Channel) => nvfipc_cuda_channel_send_post(self.ch, stream),
            (MemKind::Device, Via::Request) => {
                nvfipc_cuda_p2p_send_post(self.cache, &self.req, stream)
            }
        };
        let ns = nanos(start.elapsed());
        check(status, "send_post")?;
        Ok(ns)
    }

    /// Sender: waits (host) or enqueues the wait (device) for the receiver to finish.
    fn finish_send(&self) -> Result<()> {
        let status = match self.kind {
            MemKind::Host => nvfipc_host_channel_send_wait(self.ch, self.timeout_ms()),
            MemKind::Device => nvfipc_cuda_channel_send_wait(self.ch, self.raw_stream()),
        };
        check(status, "send_wait")
    }

    /// Receiver: pulls the next transfer (host) or enqueues the pull (device).
    fn receive(&self) -> Result<()> {
        let (ch, bytes) = (self.ch, self.bytes);
        let status = match self.kind {
            MemKind::Host => nvfipc_host_channel_recv_post(ch, bytes, self.timeout_ms()),
            MemKind::Device => nvfipc_cuda_channel_recv_post(ch, bytes, self.raw_stream()),
        };
        check(status, "recv_post")
    }

    fn timeout_ms(&self) -> i64 {
        self.timeout.as_millis() as i64
    }

    /// Device: waits for the queued transfers every `SYNC_EVERY` (and at `force`).
    fn sync(&self, done: usize, force: bool) -> Result<()> {
        match &self.stream {
            Some(s) if force || done % SYNC_EVERY == 0 => s.synchronize_within(self.timeout),
            _ => Ok(()),
        }
    }
}

/// Rank 0's samples of both calls (`post.channel`, `post.request`), gathered on rank 0.
pub fn run(ctx: &Context, args: &RankArgs) -> Result<Vec<Series>> {
    if ctx.world_size != 2 {
        return Err(Error::invalid("the post benchmark runs on 2 ranks"));
    }
    let peer = 1 - ctx.rank;
    let buffer = Buffer::alloc(args.kind, &ctx.job_id, args.bytes)?;
    let req = if ctx.rank == 0 {
        Request::send(peer, TAG, buffer.addr(), args.bytes, args.kind)
    } else {
        Request::recv(peer, TAG, buffer.addr(), args.bytes, args.kind)
    };
    let cache = nvfuser_ipc::default_cache(CacheConfig::from_context(ctx))?;
    cache.exchange_handles(std::slice::from_ref(&req))?;
    let tag = CString::new(TAG).expect("no NUL in the tag");
    let mut side = Side {
        cache: nvfipc_cache::into_raw(cache),
        req: nvfipc_request {
            peer: peer as i64,
            direction: if ctx.rank == 0 {
                NVFIPC_DIRECTION_SEND
            } else {
                NVFIPC_DIRECTION_RECV
            },
            kind: match args.kind {
                MemKind::Device => NVFIPC_MEM_DEVICE,
                MemKind::Host => NVFIPC_MEM_HOST,
            },
            tag: tag.as_ptr(),
            ptr: buffer.addr(),
            bytes: args.bytes,
        },
        ch: std::ptr::null_mut(),
        kind: args.kind,
        stream: match args.kind {
            MemKind::Device => Some(DeviceStream::new()?),
            MemKind::Host => None,
        },
        bytes: args.bytes,
        timeout: args.timeout,
    };
    let outcome = measure(ctx, &mut side, args.steps);
    let freed = check(nvfipc_channel_free(side.ch), "nvfipc_channel_free")
        .and(check(nvfipc_cache_free(side.cache), "nvfipc_cache_free"));
    let (channel, request) = outcome?;
    freed?;
    drop(buffer);
    gather(
        ctx,
        vec![
            ("post.channel".into(), channel),
            ("post.request".into(), request),
        ],
    )
}

/// Runs the warm-up and the timed transfers; returns rank 0's samples per call.
fn measure(ctx: &Context, side: &mut Side, steps: usize) -> Result<(Vec<u64>, Vec<u64>)> {
    check(
        nvfipc_channel_open(side.cache, &side.req, &mut side.ch),
        "nvfipc_channel_open",
    )?;
    let per_block = steps.div_ceil(2 * BLOCKS);
    let total = WARMUP + 2 * BLOCKS * per_block;
    let mut channel = Vec::with_capacity(BLOCKS * per_block);
    let mut request = Vec::with_capacity(BLOCKS * per_block);
    for i in 0..total {
        if ctx.rank == 0 {
            // Blocks alternate after the warm-up: channel, request, channel, ...
            let timed = i.checked_sub(WARMUP);
            let via = match timed.map(|t| (t / per_block) % 2) {
                Some(1) => Via::Request,
                _ => Via::Channel,
            };
            let ns = side.post(via)?;
            match (timed, via) {
                (Some(_), Via::Channel) => channel.push(ns),
                (Some(_), Via::Request) => request.push(ns),
                (None, _) => {}
            }
            side.finish_send()?;
        } else {
            side.receive()?;
        }
        side.sync(i + 1, i + 1 == total)?;
    }
    Ok((channel, request))
}
