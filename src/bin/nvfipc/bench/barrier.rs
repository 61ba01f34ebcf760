//! Rank side of the barrier benchmark: `Context::barrier` (ours) against PyTorch's store-based
//! barrier over the same store, one after the other, each timed per call on every rank.

use super::seed::TorchStyleBarrier;
use super::{gather_samples, RankArgs, Series};
use crate::stats::nanos;
use nvfuser_ipc::context::Context;
use nvfuser_ipc::Result;
use std::time::Instant;

/// Untimed rounds first, so connections and keys exist before the clock runs.
const WARMUP: usize = 3;

pub fn run(ctx: &Context, args: &RankArgs) -> Result<Vec<Series>> {
    let mut ours = Vec::with_capacity(args.steps);
    for i in 0..WARMUP + args.steps {
        let start = Instant::now();
        ctx.barrier(None, None)?;
        if i >= WARMUP {
            ours.push(nanos(start.elapsed()));
        }
    }
    let prefix = format!("nvfipc-bench/{}/torch-barrier", ctx.job_id);
    let mut torch = TorchStyleBarrier::new(prefix, ctx.world_size, ctx.timeout());
    let mut theirs = Vec::with_capacity(args.steps);
    for i in 0..WARMUP + args.steps {
        let start = Instant::now();
        torch.wait(&*ctx.store)?;
        if i >= WARMUP {
            theirs.push(nanos(start.elapsed()));
        }
    }
    let mut out = gather_samples(ctx, "barrier.ours", &ours)?;
    out.extend(gather_samples(ctx, "barrier.torch_style", &theirs)?);
    Ok(out)
}
