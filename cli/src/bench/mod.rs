//! `nvfipc bench`: the measurements of docs/BENCHMARKS.md in one run.
//!
//! The parent runs each multi-process scenario as a job of this binary (`bench-rank`, started
//! through `launch::run_job`, rank 0 hosting the store); rank 0 gathers every rank's samples
//! through the store and writes them to a file the parent reads. The store benchmark runs in
//! the parent against server processes. The parent then prints the tables and the targets and
//! writes the JSON and the SVG plots ([`report`]).

mod barrier;
mod board_floor;
mod exchange;
mod post;
mod report;
mod seed;
mod store_load;
mod svg;
mod symmetric;
mod symmetric_floor;

use crate::args::{positive, positive_count};
use crate::launch::{self, JobSpec, StoreHost};
use crate::memory::{
    enter_rank_device, kind_label, set_device_memory, DeviceMemory, TransportChoice,
};
use crate::stats::{decode_samples, encode_samples};
use nvfuser_ipc::tools::cuda::CudaTransport;
use nvfuser_ipc::tools::exchange::Transport;
use nvfuser_ipc::tools::host::HostTransport;
use nvfuser_ipc::MemKind;
use nvfuser_ipc::{Context, EnvOptions};
use nvfuser_ipc::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A named list of samples (nanoseconds).
pub type Series = (String, Vec<u64>);

/// A scenario: what `--scenario` picks, and what a `bench-rank` process runs (all but `store`,
/// which the parent measures).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Part {
    Exchange,
    Store,
    Barrier,
    Post,
    Symmetric,
}

/// The benchmarks of docs/BENCHMARKS.md
///
/// Measure, in one run: the ring exchange (cold, warm, asymmetric) against the upstream seed
/// protocol and the floor (opens + two store round trips) for 2, 4 and 8 ranks; our store server
/// against PyTorch's TCPStore (libuv and classic, hosted by the Python in $NVFIPC_PYTHON; skipped
/// with a note without it or with --no-torch) for 1 to 256 clients; barrier latency for up to 64
/// processes against a torch-style store barrier; the cost of one transfer post on an opened
/// channel and through the cache and request, between 2 ranks; on request (`--scenario
/// symmetric`), the symmetric rendezvous (every rank maps every other rank's buffer) for groups
/// of 2 to 64 ranks.
///
/// Prints tables and the ratios to the targets; writes JSON to FILE and one SVG plot per scenario
/// to DIR. Exits non-zero when a scenario could not run (a missed target is reported, not an
/// error).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
#[command(
    override_usage = "nvfipc bench [--scenario exchange|store|barrier|post|symmetric[,...]]\n               [--json FILE] [--svg-dir DIR] [--quick] [--transport auto|device|host]\n               [--device-memory legacy|vmm] [--no-torch] [--server-threads N] [--busy-poll-us US]\n               [--ranks LIST]"
)]
pub struct BenchArgs {
    /// The scenarios to run, comma-separated (default: all but symmetric)
    #[arg(
        long = "scenario",
        value_name = "S",
        value_enum,
        value_delimiter = ',',
        default_value = "exchange,store,barrier,post"
    )]
    pub parts: Vec<Part>,
    /// Write the results as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one SVG plot per scenario to DIR
    #[arg(long, value_name = "DIR")]
    pub svg_dir: Option<PathBuf>,
    /// A small version that runs in a few seconds
    #[arg(long)]
    pub quick: bool,
    /// Where the exchange's buffers live, as for demo
    #[arg(long, value_name = "T", value_enum, default_value_t = TransportChoice::Auto)]
    pub transport: TransportChoice,
    /// How device buffers are allocated: cuMemAlloc, or VMM as PyTorch's expandable segments
    #[arg(long, value_name = "M", value_enum, default_value_t = DeviceMemory::Legacy)]
    pub device_memory: DeviceMemory,
    /// Skip PyTorch's servers even when `NVFIPC_PYTHON` is set.
    #[arg(long)]
    pub no_torch: bool,
    /// Non-default settings of our server in the store scenario.
    #[command(flatten)]
    pub server: store_load::OurServer,
    /// World sizes of the exchange and symmetric scenarios, comma-separated (default: theirs)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = at_least_2_ranks)]
    pub ranks: Option<Vec<usize>>,
}

/// A world size of `--ranks`: at least two ranks.
fn at_least_2_ranks(value: &str) -> Result<usize, String> {
    match positive_count(value)? {
        1 => Err("a group needs at least 2 ranks".into()),
        n => Ok(n),
    }
}

impl BenchArgs {
    /// The same, with each scenario once and in the order they run.
    pub fn normalized(mut self) -> BenchArgs {
        self.parts.sort();
        self.parts.dedup();
        self
    }
}

/// The sizes of one run (`--quick` or full).
#[derive(Clone, Debug)]
pub struct Plan {
    pub exchange_worlds: Vec<usize>,
    pub exchange_steps: usize,
    pub bytes: u64,
    pub store_clients: Vec<usize>,
    pub store_duration: Duration,
    /// Rounds per store point, servers interleaved within each; the median round is reported.
    pub store_rounds: usize,
    pub barrier_worlds: Vec<usize>,
    pub barrier_steps: usize,
    /// Timed posts of the post scenario (half per call).
    pub post_steps: usize,
    /// Group sizes of the symmetric scenario with host and with device memory.
    pub symmetric_worlds_host: Vec<usize>,
    pub symmetric_worlds_device: Vec<usize>,
    /// Timed rendezvous rounds per rank (each of a fresh buffer and tag).
    pub symmetric_rounds: usize,
    pub rank_timeout: Duration,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                exchange_worlds: vec![2],
                exchange_steps: 10,
                bytes: 1 << 16,
                store_clients: vec![1, 4],
                store_duration: Duration::from_millis(150),
                store_rounds: 1,
                barrier_worlds: vec![2, 4],
                barrier_steps: 10,
                post_steps: 4_000,
                symmetric_worlds_host: vec![2, 4],
                symmetric_worlds_device: vec![2, 4],
                symmetric_rounds: 3,
                rank_timeout: Duration::from_secs(30),
            }
        } else {
            Plan {
                exchange_worlds: vec![2, 4, 8],
                exchange_steps: 100,
                bytes: 1 << 20,
                store_clients: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
                store_duration: Duration::from_secs(1),
                store_rounds: 3,
                barrier_worlds: vec![2, 4, 8, 16, 32, 64],
                barrier_steps: 100,
                post_steps: 100_000,
                symmetric_worlds_host: vec![2, 4, 8, 16, 32, 64],
                symmetric_worlds_device: vec![2, 4, 8],
                symmetric_rounds: 10,
                rank_timeout: Duration::from_secs(120),
            }
        }
    }
}

impl Part {
    fn name(self) -> String {
        use clap::ValueEnum;
        let value = self.to_possible_value().expect("every scenario has a name");
        value.get_name().to_string()
    }
}

/// `--transport` of a rank: the transport its parent already decided.
fn mem_kind(value: &str) -> Result<MemKind, String> {
    match value {
        "host" => Ok(MemKind::Host),
        "device" => Ok(MemKind::Device),
        other => Err(format!("{other:?} is not host or device")),
    }
}

#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct RankArgs {
    #[arg(long, value_enum)]
    pub role: Part,
    #[arg(long, default_value = "10", value_parser = positive_count)]
    pub steps: usize,
    #[arg(long, default_value = "65536", value_parser = positive)]
    pub bytes: u64,
    #[arg(long = "transport", default_value = "host", value_parser = mem_kind)]
    pub kind: MemKind,
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    #[arg(long = "timeout-ms", default_value = "60000", value_parser = at_least_1ms)]
    pub timeout: Duration,
    #[arg(long, value_enum, default_value_t = DeviceMemory::Legacy)]
    pub device_memory: DeviceMemory,
    /// Symmetric over device memory: measure the floor (the driver calls alone) instead
    #[arg(long)]
    pub floor: bool,
}

/// Milliseconds, 0 read as 1.
fn at_least_1ms(value: &str) -> Result<Duration, String> {
    Ok(crate::args::millis(value)?.max(Duration::from_millis(1)))
}

impl RankArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            "--role".into(),
            self.role.name(),
            "--steps".into(),
            self.steps.to_string(),
            "--bytes".into(),
            self.bytes.to_string(),
            "--transport".into(),
            self.kind.name().into(),
            "--out".into(),
            self.out.to_string_lossy().into_owned(),
            "--timeout-ms".into(),
            self.timeout.as_millis().to_string(),
            "--device-memory".into(),
            self.device_memory.name().into(),
        ]
        .into_iter()
        .chain(self.floor.then(|| "--floor".to_string()))
        .collect()
    }
}

/// Series as text, one "name sample sample ..." line each: what a rank stores for rank 0, and
/// what rank 0 writes for the parent.
fn encode_series(series: &[Series]) -> String {
    series
        .iter()
        .map(|(name, samples)| format!("{name} {}\n", encode_samples(samples)))
        .collect()
}

fn decode_series(text: &str) -> Option<Vec<Series>> {
    text.lines()
        .map(|line| {
            let (name, rest) = line.split_once(' ').unwrap_or((line, ""));
            Some((name.to_string(), decode_samples(rest)?))
        })
        .collect()
}

/// Collects every rank's series on rank 0 (through the store), each the ranks' samples in rank
/// order; other ranks get an empty list. Collective: every rank calls it with series of the same
/// names in the same order.
pub fn gather(ctx: &Context, mine: Vec<Series>) -> Result<Vec<Series>> {
    let label = mine.first().map_or("", |(name, _)| name.as_str());
    let keys: Vec<String> = (0..ctx.world_size)
        .map(|r| format!("nvfipc-bench/{}/samples/{label}/{r}", ctx.job_id))
        .collect();
    ctx.store
        .set(&keys[ctx.rank], encode_series(&mine).as_bytes())?;
    ctx.barrier(None, None)?;
    if ctx.rank != 0 {
        return Ok(Vec::new());
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = ctx.store.multi_get(&refs, ctx.timeout())?;
    let mut all = mine;
    for (r, value) in values.iter().enumerate().skip(1) {
        let theirs = decode_series(&String::from_utf8_lossy(value))
            .filter(|theirs| {
                theirs.len() == all.len() && theirs.iter().zip(&all).all(|(t, m)| t.0 == m.0)
            })
            .ok_or_else(|| Error::protocol(format!("rank {r}'s samples are malformed")))?;
        for ((_, samples), (_, more)) in all.iter_mut().zip(theirs) {
            samples.extend(more);
        }
    }
    Ok(all)
}

/// One `bench-rank` process.
pub fn run_rank(args: &RankArgs) -> i32 {
    let options = EnvOptions {
        timeout: Some(args.timeout),
        ..EnvOptions::default()
    };
    let ctx = match Context::from_env(&options) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("nvfipc bench: {e}");
            return 1;
        }
    };
    let rank = ctx.rank;
    let outcome = rank_body(&ctx, args);
    let closed = ctx.close();
    match outcome.and(closed) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("nvfipc bench: rank {rank}: {e}");
            1
        }
    }
}

fn rank_body(ctx: &Context, args: &RankArgs) -> Result<()> {
    if args.role == Part::Store {
        return Err(Error::invalid(
            "the store scenario runs in the parent, not in ranks",
        ));
    }
    set_device_memory(args.device_memory);
    let series = if args.role == Part::Barrier {
        barrier::run(ctx, args)?
    } else {
        let device = enter_rank_device(args.kind, ctx.local_rank)?;
        // The transports outlive every cache and import, and are dropped only after the last
        // barrier: peers may map this rank's semaphore slab until then.
        let make_transports = || -> Result<Vec<Arc<dyn Transport>>> {
            let host = HostTransport::new(ctx.store.clone(), &ctx.job_id, ctx.rank)?;
            let fdpass = host.fdpass().clone();
            let mut transports: Vec<Arc<dyn Transport>> = vec![host];
            if args.kind == MemKind::Device {
                transports.push(CudaTransport::with_fdpass(None, Some(fdpass))?);
            }
            Ok(transports)
        };
        let (series, transports) = match args.role {
            Part::Post => (post::run(ctx, args)?, Vec::new()),
            Part::Symmetric if args.floor => (
                symmetric_floor::run(ctx, args, args.device_memory)?,
                Vec::new(),
            ),
            Part::Symmetric => symmetric::run(ctx, args, args.kind, &make_transports)?,
            _ => {
                let transports = make_transports()?;
                let series = exchange::run(ctx, args, args.kind, &transports)?;
                (series, transports)
            }
        };
        ctx.barrier(None, None)?;
        drop(transports);
        if args.kind == MemKind::Device {
            // Released peer mappings are closed on the library's releaser threads: let them
            // finish before this process exits.
            nvfuser_ipc::tools::cuda::flush_releases(args.timeout)?;
        }
        drop(device);
        series
    };
    if ctx.rank == 0 {
        std::fs::write(&args.out, encode_series(&series))
            .map_err(|e| Error::from_io(format!("writing {}", args.out.display()), &e))?;
    }
    Ok(())
}

/// Where a bench job's store runs: in rank 0 (as under torchrun or nvFuser), or in this
/// launcher's process with `NVFIPC_BENCH_STORE=launcher` (to tell the store's host apart from
/// the rank's own work).
fn store_host() -> StoreHost {
    match std::env::var("NVFIPC_BENCH_STORE").as_deref() {
        Ok("launcher") => StoreHost::Launcher { port: 0 },
        _ => StoreHost::Rank0 { port: 0 },
    }
}

/// Runs a job of `world` bench ranks; returns rank 0's series by name.
fn run_ranks(
    exe: &str,
    world: usize,
    mut rank_args: RankArgs,
    scratch: &Path,
) -> Result<BTreeMap<String, Vec<u64>>> {
    rank_args.out = scratch.join(format!("{}-{world}.txt", rank_args.role.name()));
    let _ = std::fs::remove_file(&rank_args.out);
    let mut command = vec![exe.to_string(), "bench-rank".to_string()];
    command.extend(rank_args.to_args());
    let status = launch::run_job(&JobSpec {
        ranks: world,
        command,
        grace: Duration::from_secs(3),
        store: store_host(),
        plain_rank0_stdout: false,
        env: Vec::new(),
    });
    if status != 0 {
        return Err(Error::internal(format!(
            "the {world}-rank job failed with status {status} (see the rank messages above)"
        )));
    }
    let text = std::fs::read_to_string(&rank_args.out)
        .map_err(|e| Error::from_io(format!("reading {}", rank_args.out.display()), &e))?;
    let _ = std::fs::remove_file(&rank_args.out);
    let series = decode_series(&text)
        .ok_or_else(|| Error::protocol(format!("malformed results in {text:?}")))?;
    Ok(series.into_iter().collect())
}

/// A scratch directory for rank results, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("nvfipc-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::from_io(format!("creating {}", dir.display()), &e))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The parent: runs the chosen scenarios, prints and writes the report.
pub fn run(args: &BenchArgs) -> i32 {
    match run_parent(args) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("nvfipc bench: {e}");
            1
        }
    }
}

/// Runs a job of `rank_args` for each world size of `worlds`, with `what` in its progress line
/// and failure: a failed world is recorded and the others still run.
fn run_worlds(
    exe: &str,
    scratch: &Path,
    worlds: &[usize],
    rank_args: RankArgs,
    what: &str,
    results: &mut report::Results,
) -> Vec<(usize, BTreeMap<String, Vec<u64>>)> {
    let unit = if rank_args.role == Part::Barrier {
        "processes"
    } else {
        "ranks"
    };
    let mut measured = Vec::new();
    for &world in worlds {
        match rank_args.role {
            Part::Barrier => eprintln!("nvfipc bench: {what}, {world} {unit}"),
            _ => eprintln!(
                "nvfipc bench: {what}, {world} {unit}, {}",
                kind_label(rank_args.kind)
            ),
        }
        match run_ranks(exe, world, rank_args.clone(), scratch) {
            Ok(series) => measured.push((world, series)),
            Err(e) => results.fail(format!("{what}, {world} {unit}: {e}")),
        }
    }
    measured
}

/// Returns whether every scenario ran (targets missed are reported, not failures).
fn run_parent(args: &BenchArgs) -> Result<bool> {
    let plan = Plan::new(args.quick);
    let exe = std::env::current_exe()
        .map_err(|e| Error::from_io("finding this program's path to start the ranks", &e))?
        .to_string_lossy()
        .into_owned();
    let scratch = Scratch::create()?;
    let mut results = report::Results::new(args.quick);
    // The memory of the exchange, post and symmetric scenarios.
    let kind = || -> Result<MemKind> {
        set_device_memory(args.device_memory);
        args.transport
            .resolve()
            .map_err(|e| e.context(format!("--transport {}", args.transport.name())))
    };
    let rank_args = |role, steps, bytes, kind| RankArgs {
        role,
        steps,
        bytes,
        kind,
        out: PathBuf::new(),
        timeout: plan.rank_timeout,
        device_memory: args.device_memory,
        floor: false,
    };
    if args.parts.contains(&Part::Exchange) {
        let kind = kind()?;
        results.transport = kind_label(kind).to_string();
        let worlds = args.ranks.as_ref().unwrap_or(&plan.exchange_worlds);
        let job = rank_args(Part::Exchange, plan.exchange_steps, plan.bytes, kind);
        results.exchange = run_worlds(&exe, &scratch.0, worlds, job, "ring exchange", &mut results);
        results.exchange_steps = plan.exchange_steps;
    }
    if args.parts.contains(&Part::Store) {
        store_load::run(args, &plan, &exe, &mut results);
    }
    if args.parts.contains(&Part::Barrier) {
        let job = RankArgs {
            device_memory: DeviceMemory::Legacy,
            ..rank_args(Part::Barrier, plan.barrier_steps, 1, MemKind::Host)
        };
        let worlds = &plan.barrier_worlds;
        results.barrier = run_worlds(&exe, &scratch.0, worlds, job, "barrier", &mut results);
    }
    if args.parts.contains(&Part::Post) {
        let kind = kind()?;
        results.post_transport = kind_label(kind).to_string();
        let job = rank_args(Part::Post, plan.post_steps, 64, kind);
        let measured = run_worlds(&exe, &scratch.0, &[2], job, "one post", &mut results);
        results.post = measured.into_iter().next().map(|(_, series)| series);
    }
    if args.parts.contains(&Part::Symmetric) {
        let kind = kind()?;
        results.symmetric_transport = kind_label(kind).to_string();
        results.symmetric_rounds = plan.symmetric_rounds;
        let default = match kind {
            MemKind::Host => &plan.symmetric_worlds_host,
            MemKind::Device => &plan.symmetric_worlds_device,
        };
        let worlds = args.ranks.as_ref().unwrap_or(default);
        let job = rank_args(Part::Symmetric, plan.symmetric_rounds, plan.bytes, kind);
        let what = "symmetric rendezvous";
        results.symmetric = run_worlds(&exe, &scratch.0, worlds, job.clone(), what, &mut results);
        if kind == MemKind::Device {
            // The floor: the same buffers shared by the driver calls alone, in fresh processes.
            let floor = RankArgs { floor: true, ..job };
            let what = "symmetric floor (driver calls alone)";
            for (w, series) in run_worlds(&exe, &scratch.0, worlds, floor, what, &mut results) {
                if let Some((_, mine)) = results.symmetric.iter_mut().find(|(m, _)| *m == w) {
                    mine.extend(series);
                }
            }
        }
    }
    print!("{}", results.text());
    if let Some(path) = &args.json {
        write_file(path, &results.json_text())?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.svg_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::from_io(format!("creating {}", dir.display()), &e))?;
        for (name, svg) in results.charts() {
            let path = dir.join(format!("{name}.svg"));
            write_file(&path, &svg)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(results.failures.is_empty())
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::from_io(format!("creating {}", dir.display()), &e))?;
    }
    std::fs::write(path, text)
        .map_err(|e| Error::from_io(format!("writing {}", path.display()), &e))
}

#[cfg(test)]
mod tests;
