//! `nvfipc barrier-test` (hidden): run by every rank of a launched job. Runs barriers over the
//! world or over pseudo-random subsets that every rank derives from the same seed, and checks
//! through the store that no barrier releases a rank before every member arrived.

use crate::args::{millis, positive_ms};
use nvfuser_ipc::Result;
use nvfuser_ipc::{Context, EnvOptions};
use std::time::{Duration, Instant};

/// Checked barriers, run by every rank of a launched job (see launch)
///
/// R barriers over the world, or over
/// pseudo-random subsets of the ranks derived from seed S, each checked through the store (no rank
/// leaves before every member arrived). Exits non-zero on any failure.
#[derive(clap::Args, Debug, PartialEq, Eq)]
#[command(
    override_usage = "nvfipc barrier-test --rounds R [--subset-seed S] [--timeout-ms MS]\n                      [--barrier-timeout-ms MS] [--absent-rank A]\n                      [--late-rank L --late-ms MS]"
)]
pub struct BarrierTestArgs {
    /// Number of barriers
    #[arg(long, value_name = "R")]
    pub rounds: usize,
    /// Barriers over seeded random subsets of the ranks instead of the world
    #[arg(long, value_name = "S")]
    pub subset_seed: Option<u64>,
    /// The context's timeout, the default of its store operations and barriers (default: the
    /// library's)
    #[arg(long = "timeout-ms", value_name = "MS", value_parser = positive_ms)]
    pub timeout: Option<Duration>,
    /// The timeout given to each round's barrier call (default: the context's)
    #[arg(long = "barrier-timeout-ms", value_name = "MS", value_parser = positive_ms)]
    pub barrier_timeout: Option<Duration>,
    /// This rank creates its context but never joins a barrier (the others must time out naming
    /// it)
    #[arg(long, value_name = "A")]
    pub absent_rank: Option<usize>,
    /// This rank arrives late at each round's barrier, by --late-ms
    #[arg(long, value_name = "L", requires = "late")]
    pub late_rank: Option<usize>,
    /// How late the late rank arrives
    #[arg(long = "late-ms", id = "late", value_name = "MS", value_parser = millis)]
    pub late: Option<Duration>,
}

/// SplitMix64: a tiny deterministic generator, identical on every rank.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The members of `round`: each rank with probability 1/2, at least two (all of a smaller world).
pub fn subset(seed: u64, round: usize, world: usize) -> Vec<usize> {
    if world < 2 {
        return (0..world).collect();
    }
    let mut state = seed ^ (round as u64).wrapping_mul(0xd6e8_feb8_6659_fd93);
    loop {
        let members: Vec<usize> = (0..world)
            .filter(|_| splitmix(&mut state) & 1 == 1)
            .collect();
        if members.len() >= 2 {
            return members;
        }
    }
}

pub fn run(args: &BarrierTestArgs) -> i32 {
    let options = EnvOptions {
        timeout: args.timeout,
        ..EnvOptions::default()
    };
    let ctx = match Context::from_env(&options) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("nvfipc barrier-test: {e}");
            return 1;
        }
    };
    if args.absent_rank == Some(ctx.rank) {
        return 0;
    }
    match rounds(&ctx, args) {
        Ok(()) => match ctx.close() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("nvfipc barrier-test: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("nvfipc barrier-test: rank {}: {e}", ctx.rank);
            1
        }
    }
}

fn rounds(ctx: &Context, args: &BarrierTestArgs) -> Result<()> {
    let start = Instant::now();
    let mut joined = 0usize;
    for round in 0..args.rounds {
        let members = args
            .subset_seed
            .map(|seed| subset(seed, round, ctx.world_size));
        if let Some(m) = &members {
            if !m.contains(&ctx.rank) {
                continue;
            }
        }
        let expected = members.as_ref().map_or(ctx.world_size, Vec::len) as i64;
        let key = format!("nvfipc-test/{}/round/{round}", ctx.job_id);
        ctx.store.add(&key, 1)?;
        if args.late_rank == Some(ctx.rank) {
            std::thread::sleep(args.late.unwrap_or_default());
        }
        ctx.barrier(members.as_deref(), args.barrier_timeout)?;
        let arrived = ctx.store.add(&key, 0)?;
        if arrived != expected {
            return Err(nvfuser_ipc::Error::internal(format!(
                "round {round}: released after {arrived} of {expected} members arrived"
            )));
        }
        joined += 1;
    }
    // Everyone is done before rank 0 reports.
    ctx.barrier(None, None)?;
    if ctx.rank == 0 {
        let elapsed = start.elapsed();
        let per = elapsed.as_secs_f64() * 1e6 / (joined + 1) as f64;
        println!(
            "barrier-test: {} ranks, {} rounds{}, rank 0 joined {joined}: {:.1} ms, {per:.0} us \
             per barrier",
            ctx.world_size,
            args.rounds,
            args.subset_seed
                .map_or(String::new(), |s| format!(" (random subsets, seed {s})")),
            elapsed.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
