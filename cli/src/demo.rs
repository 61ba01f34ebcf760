//! `nvfipc demo`: N ranks on this machine exchange handles in a ring (send to rank+1, receive
//! from rank-1), pull each other's data over the handles and verify it, K times: the first
//! exchange is cold, the others hit the cache, except one step where every rank swaps its send
//! buffer. Rank 0 prints a table of timings and counters.
//!
//! The parent re-executes this binary as `demo-rank` through the launcher (`launch::run_job`);
//! rank 0 hosts the store through `Context::from_env`, as under torchrun or mpirun.

use crate::args::{positive, positive_count, positive_ms, ring_size};
use crate::launch::{self, JobSpec, StoreHost};
use crate::memory::{enter_rank_device, kind_label, Buffer, Mover, TransportChoice};
use crate::stats::{fmt_ns, fmt_opt_ns, format_table, median, nanos};
use nvfuser_ipc::tools::cuda::CudaTransport;
use nvfuser_ipc::tools::exchange::Transport;
use nvfuser_ipc::tools::host::HostTransport;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind, Request};
use nvfuser_ipc::{Context, EnvOptions};
use nvfuser_ipc::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tag of both ring channels (equal on the sending and the receiving rank).
const RING_TAG: &str = "demo-ring";
const KEY_PREFIX: &str = "nvfipc-demo";
const RESULT_FIELDS: usize = 8;

/// The ring exchange demo (GPU or shared memory)
///
/// Start N ranks of this program on this machine (rank 0 hosts the store). Each exports a send and a receive buffer and exchanges handles in a ring (send to rank+1,
/// receive from rank-1); each rank pulls its predecessor's data over the handles and verifies it,
/// K times: the first exchange is cold, the others are cache hits except one step in the middle
/// where every rank swaps its send buffer. Rank 0 prints the timings and counters, one row per
/// rank (the table's legend says what each column is). Exits non-zero on any failure.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
#[command(
    override_usage = "nvfipc demo [--ranks N] [--iters K] [--bytes B] [--transport auto|device|host]\n              [--timeout-ms MS]"
)]
pub struct DemoArgs {
    /// Number of ranks
    #[arg(short = 'n', long, value_name = "N", default_value = "2", value_parser = ring_size)]
    pub ranks: usize,
    /// Iterations
    #[arg(long, value_name = "K", default_value = "10", value_parser = positive_count)]
    pub iters: usize,
    /// Bytes per buffer
    #[arg(long, value_name = "B", default_value = "1048576", value_parser = positive)]
    pub bytes: u64,
    /// Where the buffers live (auto: the GPU when a CUDA driver and a device are there, shared
    /// memory otherwise)
    #[arg(long, value_name = "T", value_enum, default_value_t = TransportChoice::Auto)]
    pub transport: TransportChoice,
    /// Timeout of every wait
    #[arg(long = "timeout-ms", value_name = "MS", default_value = "30000", value_parser = positive_ms)]
    pub timeout: Duration,
}

impl DemoArgs {
    /// The arguments of every rank: the same, with the transport already decided.
    fn rank_args(&self, kind: MemKind) -> Vec<String> {
        vec![
            "--iters".into(),
            self.iters.to_string(),
            "--bytes".into(),
            self.bytes.to_string(),
            "--transport".into(),
            kind.name().into(),
            "--timeout-ms".into(),
            self.timeout.as_millis().to_string(),
        ]
    }
}

/// The iteration where every rank swaps its send buffer (`None` for fewer than 3 iterations,
/// which leaves no cached iteration before and after it).
pub fn swap_step(iters: usize) -> Option<usize> {
    (iters >= 3).then_some(iters / 2)
}

/// The contents rank `rank` sends in iteration `iter`: 32-bit words that differ for every rank,
/// iteration and position, truncated to `bytes`.
pub fn pattern(rank: usize, iter: usize, bytes: u64) -> Vec<u8> {
    let r = (rank as u32).wrapping_mul(0x0100_0193);
    let i = (iter as u32).wrapping_mul(0x9e37_79b9);
    let mut out: Vec<u8> = (0..bytes.div_ceil(4) as u32)
        .flat_map(|w| (w.wrapping_mul(0x85eb_ca6b) ^ r ^ i).to_le_bytes())
        .collect();
    out.truncate(bytes as usize);
    out
}

/// `Ok` when `got` is what `rank` sent in `iter`; else where the first difference is.
pub fn verify(got: &[u8], rank: usize, iter: usize) -> Result<()> {
    let want = pattern(rank, iter, got.len() as u64);
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(at) => Err(Error::internal(format!(
            "iteration {iter}: the data received from rank {rank} differs at byte {at} of {} \
             (got {:#04x}, expected {:#04x})",
            got.len(),
            got[at],
            want[at]
        ))),
    }
}

/// The parent: decides the transport, runs the ranks, reports failure.
pub fn run(args: &DemoArgs) -> i32 {
    if let Err(message) = launch::check_capacity(args.ranks) {
        eprintln!("nvfipc demo: {message}");
        return launch::USAGE_ERROR;
    }
    let kind = match args.transport.resolve() {
        Ok(kind) => kind,
        Err(e) => {
            // The message alone: it already says what its status name would repeat.
            let (transport, why) = (args.transport.name(), e.message);
            eprintln!("nvfipc demo: --transport {transport}: {why}");
            return 1;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe.to_string_lossy().into_owned(),
        Err(e) => {
            eprintln!("nvfipc demo: cannot find this program's path to start the ranks: {e}");
            return 1;
        }
    };
    let mut command = vec![exe, "demo-rank".to_string()];
    command.extend(args.rank_args(kind));
    let status = launch::run_job(&JobSpec {
        ranks: args.ranks,
        command,
        grace: Duration::from_secs(5),
        store: StoreHost::Rank0 { port: 0 },
        plain_rank0_stdout: true,
        env: Vec::new(),
    });
    if status != 0 {
        eprintln!(
            "nvfipc demo: FAILED ({} ranks, {}): see the rank messages above",
            args.ranks,
            kind_label(kind)
        );
    }
    status
}

/// One rank (`nvfipc demo-rank`, started by [`run`]).
pub fn run_rank(args: &DemoArgs) -> i32 {
    let kind = match args.transport {
        TransportChoice::Device => MemKind::Device,
        TransportChoice::Host => MemKind::Host,
        TransportChoice::Auto => {
            eprintln!("nvfipc demo-rank: the parent must choose --transport device or host");
            return 2;
        }
    };
    let options = EnvOptions {
        timeout: Some(args.timeout),
        ..EnvOptions::default()
    };
    let ctx = match Context::from_env(&options) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("nvfipc demo: {e}");
            return 1;
        }
    };
    let rank = ctx.rank;
    let outcome = ring(&ctx, args, kind);
    let closed = ctx.close();
    match outcome.and(closed) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("nvfipc demo: rank {rank}: {e}");
            1
        }
    }
}

/// What one rank measured.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RankResult {
    cold_ns: u64,
    warm_median_ns: Option<u64>,
    swap_ns: Option<u64>,
    verified_bytes: u64,
    store_round_trips: u64,
    hits: u64,
    misses: u64,
    opens: u64,
}

impl RankResult {
    fn encode(&self) -> String {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        format!(
            "{} {} {} {} {} {} {} {}",
            self.cold_ns,
            opt(self.warm_median_ns),
            opt(self.swap_ns),
            self.verified_bytes,
            self.store_round_trips,
            self.hits,
            self.misses,
            self.opens
        )
    }

    fn decode(text: &str) -> Option<RankResult> {
        let words: Vec<&str> = text.split_ascii_whitespace().collect();
        if words.len() != RESULT_FIELDS {
            return None;
        }
        let num = |i: usize| words[i].parse::<u64>().ok();
        let opt = |i: usize| match words[i] {
            "-" => Some(None),
            w => w.parse::<u64>().ok().map(Some),
        };
        Some(RankResult {
            cold_ns: num(0)?,
            warm_median_ns: opt(1)?,
            swap_ns: opt(2)?,
            verified_bytes: num(3)?,
            store_round_trips: num(4)?,
            hits: num(5)?,
            misses: num(6)?,
            opens: num(7)?,
        })
    }
}

/// The transports of one rank, kept alive until every peer has released its mappings.
fn transports(kind: MemKind, ctx: &Context) -> Result<Vec<Arc<dyn Transport>>> {
    let host = HostTransport::new(ctx.store.clone(), &ctx.job_id, ctx.rank)?;
    let fdpass = host.fdpass().clone();
    let mut list: Vec<Arc<dyn Transport>> = vec![host];
    if kind == MemKind::Device {
        let device: Arc<dyn Transport> = CudaTransport::with_fdpass(None, Some(fdpass))?;
        list.push(device);
    }
    Ok(list)
}

fn ring(ctx: &Context, args: &DemoArgs, kind: MemKind) -> Result<()> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    let device = enter_rank_device(kind, ctx.local_rank)?;
    let transports = transports(kind, ctx)?;
    let cache = HandleCache::with_transports(CacheConfig::from_context(ctx), transports.clone())?;
    let mover = Mover::new(kind, args.timeout)?;
    let alloc = || Buffer::alloc(kind, &ctx.job_id, args.bytes);
    let mut send = alloc()?;
    let recv = alloc()?;
    // Swapped-out buffers stay allocated until every peer has let go of them (end of the run).
    let mut retired: Vec<Buffer> = Vec::new();
    let swap = swap_step(args.iters);
    let mut received = vec![0u8; args.bytes as usize];
    let (mut cold_ns, mut swap_ns, mut warm) = (0, None, Vec::new());
    let mut verified_bytes = 0u64;
    for iter in 0..args.iters {
        if Some(iter) == swap {
            retired.push(std::mem::replace(&mut send, alloc()?));
        }
        send.write(&pattern(rank, iter, args.bytes))?;
        let requests = [
            Request::send(next, RING_TAG, send.addr(), args.bytes, kind),
            Request::recv(prev, RING_TAG, recv.addr(), args.bytes, kind),
        ];
        // Lined up first, so that the times show the exchange rather than rank skew.
        ctx.barrier(None, None)?;
        let start = Instant::now();
        cache.exchange_handles(&requests)?;
        let took = nanos(start.elapsed());
        match iter {
            0 => cold_ns = took,
            i if Some(i) == swap => swap_ns = Some(took),
            _ => warm.push(took),
        }
        let to_next = cache.get(&requests[0])?;
        let from_prev = cache.get(&requests[1])?;
        mover
            .ring_step(&to_next, &from_prev, args.bytes)
            .map_err(|e| e.context(format!("iteration {iter}: transfer in the ring")))?;
        recv.read(&mut received)?;
        verify(&received, prev, iter)?;
        verified_bytes += args.bytes;
    }
    let stats = cache.stats();
    let mine = RankResult {
        cold_ns,
        warm_median_ns: median(&warm),
        swap_ns,
        verified_bytes,
        store_round_trips: stats.store_round_trips,
        hits: stats.hits,
        misses: stats.misses,
        opens: stats.opens,
    };
    let result_key = |r: usize| format!("{KEY_PREFIX}/{}/result/{r}", ctx.job_id);
    ctx.store.set(&result_key(rank), mine.encode().as_bytes())?;
    // Every transfer is done before anyone releases mappings; every mapping is released before
    // anyone frees what others mapped (buffers, semaphore slabs).
    ctx.barrier(None, None)?;
    let closed = cache.close();
    ctx.barrier(None, None)?;
    drop((send, recv, retired, mover, transports));
    drop(device);
    if rank == 0 {
        let keys: Vec<String> = (0..world).map(result_key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = ctx.store.multi_get(&refs, ctx.timeout())?;
        let results = values
            .iter()
            .enumerate()
            .map(|(r, v)| {
                RankResult::decode(&String::from_utf8_lossy(v)).ok_or_else(|| {
                    Error::protocol(format!("the result of rank {r} is malformed: {v:?}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        print!("{}", report(args, kind, &results));
        if closed.opens != closed.closes {
            println!(
                "note: rank 0 opened {} mappings and closed {}",
                closed.opens, closed.closes
            );
        }
    }
    Ok(())
}

/// What the columns of the demo's table mean.
const LEGEND: &str = "
rank: the rank, then `all` (medians of the times, sums of the counts)
cold exchange: the first exchange_handles, nothing cached: export, store round trips, open
warm exchange (median): the median of the later exchanges with unchanged buffers (cache hits)
swap exchange: the exchange right after every rank replaced its send buffer (a miss on both
  sides of each channel), `-` when there were too few iterations for a swap
verified bytes: bytes this rank pulled from its predecessor and checked
store round trips: store requests that waited for a reply, over all exchanges
hits/misses: channel-steps served from the cache / that moved a record through the store
opens: peer buffers (and semaphore slabs) this rank mapped
";

fn report(args: &DemoArgs, kind: MemKind, results: &[RankResult]) -> String {
    let swap = swap_step(args.iters).map_or(String::new(), |s| {
        format!(", iteration {s} swaps every send buffer")
    });
    let mut out = format!(
        "nvfipc demo: {} ranks in a ring, {}, {} bytes per buffer, {} iterations{swap}\n\n",
        results.len(),
        kind_label(kind),
        args.bytes,
        args.iters
    );
    let mut rows = vec![vec![
        "rank".to_string(),
        "cold exchange".into(),
        "warm exchange (median)".into(),
        "swap exchange".into(),
        "verified bytes".into(),
        "store round trips".into(),
        "hits/misses".into(),
        "opens".into(),
    ]];
    for (r, res) in results.iter().enumerate() {
        rows.push(vec![
            r.to_string(),
            fmt_ns(res.cold_ns),
            fmt_opt_ns(res.warm_median_ns),
            fmt_opt_ns(res.swap_ns),
            res.verified_bytes.to_string(),
            res.store_round_trips.to_string(),
            format!("{}/{}", res.hits, res.misses),
            res.opens.to_string(),
        ]);
    }
    let colds: Vec<u64> = results.iter().map(|r| r.cold_ns).collect();
    let warms: Vec<u64> = results.iter().filter_map(|r| r.warm_median_ns).collect();
    let swaps: Vec<u64> = results.iter().filter_map(|r| r.swap_ns).collect();
    let sum = |f: fn(&RankResult) -> u64| results.iter().map(f).sum::<u64>();
    rows.push(vec![
        "all".into(),
        format!("{} (median)", fmt_opt_ns(median(&colds))),
        format!("{} (median)", fmt_opt_ns(median(&warms))),
        format!("{} (median)", fmt_opt_ns(median(&swaps))),
        sum(|r| r.verified_bytes).to_string(),
        sum(|r| r.store_round_trips).to_string(),
        format!("{}/{}", sum(|r| r.hits), sum(|r| r.misses)),
        sum(|r| r.opens).to_string(),
    ]);
    out.push_str(&format_table(&rows));
    out.push_str(LEGEND);
    out.push_str(&format!(
        "\nOK: {} ranks verified {} transfers of {} bytes each\n",
        results.len(),
        args.iters,
        args.bytes
    ));
    out
}

#[cfg(test)]
mod tests;
