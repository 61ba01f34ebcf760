//! Rank side of the barrier benchmark: `Context::barrier` (ours) against PyTorch's store-based
//! barrier over the same store, alternating in blocks, each timed per call on every rank.

use super::seed::TorchStyleBarrier;
use super::{gather, RankArgs, Series};
use crate::stats::nanos;
use nvfuser_ipc::Context;
use nvfuser_ipc::Result;
use std::time::Instant;

/// Untimed rounds first, so connections and keys exist before the clock runs.
const WARMUP: usize = 3;

/// The two barriers alternate in this many blocks, so that a slow spell of the machine hits
/// both alike.
const BLOCKS: usize = 4;

pub fn run(ctx: &Context, args: &RankArgs) -> Result<Vec<Series>> {
    let prefix = format!("nvfipc-bench/{}/torch-barrier", ctx.job_id);
    let mut torch = TorchStyleBarrier::new(prefix, ctx.world_size, ctx.timeout());
    for _ in 0..WARMUP {
        ctx.barrier(None, None)?;
        torch.wait(&*ctx.store)?;
    }
    let per_block = args.steps.div_ceil(BLOCKS);
    let mut ours = Vec::with_capacity(per_block * BLOCKS);
    let mut theirs = Vec::with_capacity(per_block * BLOCKS);
    for _ in 0..BLOCKS {
        for _ in 0..per_block {
            let start = Instant::now();
            ctx.barrier(None, None)?;
            ours.push(nanos(start.elapsed()));
        }
        for _ in 0..per_block {
            let start = Instant::now();
            torch.wait(&*ctx.store)?;
            theirs.push(nanos(start.elapsed()));
        }
    }
    gather(
        ctx,
        vec![
            ("barrier.ours".into(), ours),
            ("barrier.torch_style".into(), theirs),
        ],
    )
}
