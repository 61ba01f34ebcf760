//! The floor of the pool scenario: what a call costs when nothing is exported, imported or
//! stored and only the ranks' signals remain. A pool call that goes through the board alone
//! still needs two signal rounds with each ring neighbour: its step (each side learns the other's
//! buffer for this call) and its "opened" (each side has mapped the other's). Here every rank
//! does exactly that over a shared-memory word per rank (published with a release store and a
//! futex wake, awaited spin-then-block at the library's own pace), with no store and no CUDA, in
//! the same run as the pool scenario.

use super::RankArgs;
use crate::stats::nanos;
use nvfuser_ipc::tools::os::ShmSegment;
use nvfuser_ipc::tools::os::{
    blocking_pace, futex_wait, futex_wake_all, wait_blocking, BlockingPace,
};
use nvfuser_ipc::Context;
use nvfuser_ipc::{Error, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Signal rounds per call: the step, then "opened".
const ROUNDS_PER_CALL: u32 = 2;
/// Untimed calls first (the pool scenario's are its mapping calls).
const WARMUP: usize = 4;

/// This rank's shared word, named for the job and rank.
fn name(ctx: &Context, rank: usize) -> String {
    // Short: shm names are bounded; the job id's first 16 characters tell jobs apart.
    let job: String = ctx.job_id.chars().take(16).collect();
    format!("/nvfipc-bf-{job}-{rank}")
}

fn word(seg: &ShmSegment) -> &AtomicU32 {
    // SAFETY: the segment is page-aligned, at least 4 bytes long and mapped for the life of
    // `seg`; every process touches the word only atomically.
    unsafe { &*(seg.addr() as *const AtomicU32) }
}

/// Per-call samples (ns) of two signal rounds with both ring neighbours, `args.steps` calls.
pub fn run(ctx: &Context, args: &RankArgs) -> Result<Vec<u64>> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let mut own = ShmSegment::create(&name(ctx, rank), 4096)?;
    ctx.barrier(None, None)?;
    let open = |peer: usize| -> Result<ShmSegment> {
        ShmSegment::open(&name(ctx, peer), 4)?.ok_or_else(|| {
            Error::internal(format!(
                "board floor: rank {peer}'s word {} is missing after the barrier",
                name(ctx, peer)
            ))
        })
    };
    let neighbours = [open((rank + 1) % world)?, open((rank + world - 1) % world)?];
    let pace = blocking_pace(world);
    let timeout = ctx.timeout();
    let mut samples = Vec::with_capacity(args.steps);
    let mut value = 0u32;
    for call in 0..WARMUP + args.steps {
        let start = Instant::now();
        for _ in 0..ROUNDS_PER_CALL {
            value += 1;
            word(&own).store(value, Ordering::Release);
            futex_wake_all(word(&own));
            for n in &neighbours {
                await_value(word(n), value, pace, timeout).ok_or_else(|| {
                    Error::timeout(format!(
                        "board floor: rank {rank} waited {timeout:?} for a neighbour's signal \
                         {value}"
                    ))
                })?;
            }
        }
        if call >= WARMUP {
            samples.push(nanos(start.elapsed()));
        }
    }
    // Nobody unlinks a word a neighbour may still read.
    ctx.barrier(None, None)?;
    own.unlink();
    Ok(samples)
}

/// Waits until `w` holds at least `value`, as the exchange waits on a board.
fn await_value(w: &AtomicU32, value: u32, pace: BlockingPace, timeout: Duration) -> Option<()> {
    wait_blocking(pace, timeout, |block| {
        let now = w.load(Ordering::Acquire);
        if now >= value {
            return Some(());
        }
        if let Some(max) = block {
            futex_wait(w, now, max);
        }
        None
    })
}
