//! Rank side of the exchange benchmark: a ring (send to rank+1, receive from rank-1: two comms
//! per call) through our cache and through the seed protocol, in three scenarios, and the floor.
//!
//! - cold: every rank swaps both buffers before every call (every call misses); small buffers
//!   (the run's size), which the driver may carve from allocations mapped before;
//! - cold_large: the same with buffers of at least [`LARGE_BYTES`], each a fresh allocation the
//!   driver does not sub-allocate, so every call opens what it maps;
//! - warm: the buffers never change (every call after the first hits);
//! - asym: even ranks swap their buffers every other call, odd ranks never (one side misses);
//! - pool: nvFuser's real pattern under PyTorch's caching allocator: fresh buffers every call,
//!   carved at varying offsets from a few large allocations per rank that were exported before
//!   (every call misses on both sides, but no allocation is new: no open is needed).
//!
//! Step 0 of every scenario (new channels) is not timed; the pool scenario also leaves untimed
//! the first calls that map each segment of each peer once. Replaced buffers stay allocated for
//! [`RETIRE_AFTER`] more steps: by then every peer has dropped its mapping of them (a cache keeps
//! up to `DEFAULT_RETAINED_PER_PEER` replaced allocations of each peer mapped), so no rank frees
//! memory a peer still maps.

use super::seed::{make_record, Importer, SeedExchange};
use super::{gather, RankArgs, Series};
use crate::memory::Buffer;
use crate::stats::{median, nanos};
use nvfuser_ipc::tools::cuda::DRIVER_CALLS;
use nvfuser_ipc::tools::exchange::Transport;
use nvfuser_ipc::tools::exchange::PHASES;
use nvfuser_ipc::Context;
use nvfuser_ipc::Result;
use nvfuser_ipc::DEFAULT_RETAINED_PER_PEER;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind, Request};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Cold,
    ColdLarge,
    Warm,
    Asym,
    Pool,
}

pub const SCENARIOS: [Scenario; 5] = [
    Scenario::Cold,
    Scenario::ColdLarge,
    Scenario::Warm,
    Scenario::Asym,
    Scenario::Pool,
];

/// Steps a replaced buffer stays allocated: longer than a peer's cache keeps it mapped (two
/// allocations per step per peer at W = 2).
pub const RETIRE_AFTER: usize = DEFAULT_RETAINED_PER_PEER / 2 + 2;

/// Buffer size of the cold_large scenario (and of its floor): large enough that `cudaMalloc`
/// gives each buffer an allocation of its own.
pub const LARGE_BYTES: u64 = 8 << 20;

/// Segments (large allocations) per rank in the pool scenario.
pub const POOL_SEGMENTS: usize = 3;

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Cold => "cold",
            Scenario::ColdLarge => "cold_large",
            Scenario::Warm => "warm",
            Scenario::Asym => "asym",
            Scenario::Pool => "pool",
        }
    }

    /// Calls before the timed ones: the first (new channels) and, in the pool scenario, those
    /// that map every segment of every peer once, as a send and as a receive buffer.
    pub fn untimed(self) -> usize {
        match self {
            Scenario::Pool => POOL_SEGMENTS + 1,
            _ => 1,
        }
    }

    /// Whether `rank` swaps its buffers before call `step` (step 0 always allocates).
    pub fn swaps(self, rank: usize, step: usize) -> bool {
        match self {
            Scenario::Cold | Scenario::ColdLarge => true,
            Scenario::Warm => step == 0,
            Scenario::Asym => step == 0 || (rank % 2 == 0 && step % 2 == 1),
            Scenario::Pool => true,
        }
    }
}

/// The ring's two requests of this rank: send `addrs[0]` to the next rank, receive into
/// `addrs[1]` from the previous one.
fn ring_requests(
    ctx: &Context,
    tag: &str,
    addrs: [u64; 2],
    bytes: u64,
    kind: MemKind,
) -> [Request; 2] {
    let (rank, world) = (ctx.rank, ctx.world_size);
    [
        Request::send((rank + 1) % world, tag, addrs[0], bytes, kind),
        Request::recv((rank + world - 1) % world, tag, addrs[1], bytes, kind),
    ]
}

/// The pool scenario's buffers: `POOL_SEGMENTS` allocations made once; call `step` sends from
/// segment `step % POOL_SEGMENTS` (first half) and receives into the next one (second half), at
/// offsets that differ from call to call, 256-byte aligned like the caching allocator's blocks.
struct PoolBuffers {
    bytes: u64,
    half: u64,
    segments: Vec<Buffer>,
}

impl PoolBuffers {
    fn new(kind: MemKind, job_id: &str, bytes: u64) -> Result<PoolBuffers> {
        let half = (4 * bytes).max(2 << 20);
        let segments = (0..POOL_SEGMENTS)
            .map(|_| Buffer::alloc(kind, job_id, 2 * half))
            .collect::<Result<Vec<_>>>()?;
        Ok(PoolBuffers {
            bytes,
            half,
            segments,
        })
    }

    /// Offset of call `step`'s buffer in a half segment (varies, fits, 256-byte aligned).
    fn offset(&self, step: usize, salt: u64) -> u64 {
        let slots = (self.half - self.bytes) / 256 + 1;
        (((step as u64).wrapping_mul(7919) + salt) % slots) * 256
    }

    /// The send and receive addresses of call `step`.
    fn step(&self, step: usize) -> [u64; 2] {
        let send_seg = &self.segments[step % POOL_SEGMENTS];
        let recv_seg = &self.segments[(step + 1) % POOL_SEGMENTS];
        [
            send_seg.addr() + self.offset(step, 0),
            recv_seg.addr() + self.half + self.offset(step, 4099),
        ]
    }
}

/// The buffers of a scenario.
enum Buffers {
    Ring(RingBuffers),
    Pool(PoolBuffers),
}

impl Buffers {
    fn new(scenario: Scenario, kind: MemKind, job_id: &str, bytes: u64) -> Result<Buffers> {
        Ok(match scenario {
            Scenario::Pool => Buffers::Pool(PoolBuffers::new(kind, job_id, bytes)?),
            Scenario::ColdLarge => {
                Buffers::Ring(RingBuffers::new(kind, job_id, bytes.max(LARGE_BYTES)))
            }
            _ => Buffers::Ring(RingBuffers::new(kind, job_id, bytes)),
        })
    }

    /// Buffer size of the scenario's requests.
    fn bytes(&self) -> u64 {
        match self {
            Buffers::Ring(r) => r.bytes,
            Buffers::Pool(p) => p.bytes,
        }
    }

    /// The send and receive addresses of call `step` (new ones when `swap`).
    fn step(&mut self, step: usize, swap: bool) -> Result<[u64; 2]> {
        match self {
            Buffers::Ring(r) => r.step(step, swap),
            Buffers::Pool(p) => Ok(p.step(step)),
        }
    }
}

/// Real driver-level IPC opens in this process so far (0 for host memory).
fn driver_opens(kind: MemKind) -> u64 {
    match kind {
        MemKind::Device => nvfuser_ipc::tools::cuda::ipc_counters().opens,
        MemKind::Host => 0,
    }
}

/// The two buffers of a rank in the ring, and the ones recently replaced.
struct RingBuffers {
    kind: MemKind,
    job_id: String,
    bytes: u64,
    send: Option<Buffer>,
    recv: Option<Buffer>,
    retired: VecDeque<(usize, Buffer)>,
}

impl RingBuffers {
    fn new(kind: MemKind, job_id: &str, bytes: u64) -> RingBuffers {
        RingBuffers {
            kind,
            job_id: job_id.to_string(),
            bytes,
            send: None,
            recv: None,
            retired: VecDeque::new(),
        }
    }

    /// Swaps in new buffers when asked; frees those retired `RETIRE_AFTER` or more steps ago.
    /// Returns the send and receive addresses.
    fn step(&mut self, step: usize, swap: bool) -> Result<[u64; 2]> {
        while self
            .retired
            .front()
            .is_some_and(|(s, _)| s + RETIRE_AFTER <= step)
        {
            self.retired.pop_front();
        }
        if swap || self.send.is_none() {
            for slot in [&mut self.send, &mut self.recv] {
                let new = Buffer::alloc(self.kind, &self.job_id, self.bytes)?;
                if let Some(old) = slot.replace(new) {
                    self.retired.push_back((step, old));
                }
            }
        }
        let addr = |b: &Option<Buffer>| b.as_ref().map_or(0, Buffer::addr);
        Ok([addr(&self.send), addr(&self.recv)])
    }
}

/// Runs every scenario with both protocols, then the floor; rank 0 gets everyone's samples.
pub fn run(
    ctx: &Context,
    args: &RankArgs,
    kind: MemKind,
    transports: &[Arc<dyn Transport>],
) -> Result<Vec<Series>> {
    let transport = transports
        .iter()
        .find(|t| t.kind() == kind)
        .cloned()
        .expect("the transport of the chosen kind is created by the caller");
    let mut out: Vec<Series> = Vec::new();
    let mut add = |name: String, samples: Vec<u64>| out.push((name, samples));
    let cache = HandleCache::with_transports(CacheConfig::from_context(ctx), transports.to_vec())?;
    let clock = &nvfuser_ipc::tools::cuda::runtime().clock;
    // Every scenario once as it is timed for the targets; the pool and cold_large scenarios also
    // say where their time goes, phase by phase (mean per call and rank), and how many store
    // round trips their timed calls made. The warm call is too short to time its phases without
    // changing it, so a second warm pass, timed phase by phase and reported apart
    // (`ours.warm_phased`), says where its time goes.
    let passes = SCENARIOS
        .iter()
        .map(|&s| {
            (
                s,
                matches!(s, Scenario::Pool | Scenario::ColdLarge),
                s.name(),
            )
        })
        .chain([(Scenario::Warm, true, "warm_phased")]);
    for (scenario, phased, label) in passes {
        cache.set_phase_timing(phased);
        clock.set_enabled(phased);
        let (samples, opens, trips) = ours(ctx, &cache, args, kind, scenario)?;
        let name = format!("ours.{label}");
        add(name.clone(), samples);
        if scenario == Scenario::Pool && kind == MemKind::Device {
            add(format!("{name}.opens"), vec![opens]);
        }
        if phased {
            let t = cache.phase_times(true);
            for phase in PHASES {
                let mean = t.of(phase) / t.calls.max(1);
                add(format!("{name}.phase.{}", phase.name()), vec![mean]);
            }
            for (call, (ns, _)) in DRIVER_CALLS.iter().zip(clock.take()) {
                add(
                    format!("{name}.driver.{}", call.name()),
                    vec![ns / t.calls.max(1)],
                );
            }
            add(format!("{name}.store_round_trips"), vec![trips]);
        }
    }
    cache.set_phase_timing(false);
    clock.set_enabled(false);
    ctx.barrier(None, None)?;
    cache.close();
    for scenario in SCENARIOS {
        let (samples, opens) = seed(ctx, &transport, args, kind, scenario)?;
        let name = format!("seed.{}", scenario.name());
        add(name.clone(), samples);
        if scenario == Scenario::Pool && kind == MemKind::Device {
            add(format!("{name}.opens"), vec![opens]);
        }
    }
    // The floor of cold_large: the same fresh opens, of buffers of its size.
    let large = RankArgs {
        bytes: args.bytes.max(LARGE_BYTES),
        ..args.clone()
    };
    for (prefix, args) in [("floor", args), ("floor_large", &large)] {
        let [exports, opens, closes, rtts] = floor(ctx, &transport, args, kind)?;
        add(format!("{prefix}.exports"), exports);
        add(format!("{prefix}.opens"), opens);
        add(format!("{prefix}.closes"), closes);
        add(format!("{prefix}.rtt"), rtts);
    }
    // The floor of the pool scenario: its two signal rounds alone (no store, no CUDA).
    add("floor.pool".into(), super::board_floor::run(ctx, args)?);
    gather(ctx, out)
}

/// Runs the calls of one scenario, `call(step, requests)` making each exchange, and times
/// those after the untimed ones (`at_timed` runs before the first of them); returns the samples
/// and the driver opens of the timed calls.
fn scenario_calls(
    ctx: &Context,
    args: &RankArgs,
    kind: MemKind,
    scenario: Scenario,
    mut at_timed: impl FnMut(),
    mut call: impl FnMut(usize, &[Request; 2]) -> Result<()>,
) -> Result<(Vec<u64>, u64)> {
    let tag = format!("bench-{}", scenario.name());
    let mut buffers = Buffers::new(scenario, kind, &ctx.job_id, args.bytes)?;
    let mut samples = Vec::with_capacity(args.steps);
    let untimed = scenario.untimed();
    let mut opens = 0;
    ctx.barrier(None, None)?;
    for step in 0..untimed + args.steps {
        let addrs = buffers.step(step, scenario.swaps(ctx.rank, step))?;
        let requests = ring_requests(ctx, &tag, addrs, buffers.bytes(), kind);
        if step == untimed {
            opens = driver_opens(kind);
            at_timed();
        }
        let start = Instant::now();
        call(step, &requests)?;
        if step >= untimed {
            samples.push(nanos(start.elapsed()));
        }
    }
    let opens = driver_opens(kind) - opens;
    // Nobody frees a buffer a peer may still map from its last call.
    ctx.barrier(None, None)?;
    Ok((samples, opens))
}

/// One scenario through our cache: the timed samples, the driver opens and the store round
/// trips they made.
fn ours(
    ctx: &Context,
    cache: &HandleCache,
    args: &RankArgs,
    kind: MemKind,
    scenario: Scenario,
) -> Result<(Vec<u64>, u64, u64)> {
    let mut trips = 0;
    let at_timed = || {
        trips = cache.stats().store_round_trips;
        // The phases of the timed calls only: the untimed ones open every segment.
        cache.phase_times(true);
        nvfuser_ipc::tools::cuda::runtime().clock.take();
    };
    let exchange = |_, requests: &[Request; 2]| cache.exchange_handles(requests);
    let (samples, opens) = scenario_calls(ctx, args, kind, scenario, at_timed, exchange)?;
    Ok((samples, opens, cache.stats().store_round_trips - trips))
}

/// One scenario through the seed protocol: the timed samples and the driver opens they made.
fn seed(
    ctx: &Context,
    transport: &Arc<dyn Transport>,
    args: &RankArgs,
    kind: MemKind,
    scenario: Scenario,
) -> Result<(Vec<u64>, u64)> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let prefix = format!(
        "nvfipc-bench/{}/seed-barrier/{}",
        ctx.job_id,
        scenario.name()
    );
    let mut seed = SeedExchange::new(
        rank,
        world,
        ctx.store.clone(),
        transport.clone(),
        &prefix,
        ctx.timeout(),
    )?;
    // Upstream's cache never drops a handle before the cache itself: with the pool's few
    // segments, its opens of a segment already mapped are only reference counts.
    seed.keep_replaced(scenario == Scenario::Pool);
    let exchange = |step, requests: &[Request; 2]| {
        // Both sides of a comm derive the same answer: it misses when either side swapped.
        let mine = scenario.swaps(rank, step);
        let miss = [
            mine || scenario.swaps(next, step),
            mine || scenario.swaps(prev, step),
        ];
        seed.exchange(requests, &miss)
    };
    scenario_calls(ctx, args, kind, scenario, || {}, exchange)
}

/// The floor of a cold call (exports, opens, closes, round trips): exporting the two fresh local buffers (`floor.exports`), opening
/// the two peer records (decode, fetch fds for VMM, import, map the buffer, release the previous
/// mappings; `floor.opens`) per step, and the store round trip (ADD) measured on its own. Also,
/// after another barrier, the closes of the released mappings (`floor.closes`), all ranks at
/// once: work a cold call of fresh allocations also causes, which the floor leaves out.
fn floor(
    ctx: &Context,
    transport: &Arc<dyn Transport>,
    args: &RankArgs,
    kind: MemKind,
) -> Result<[Vec<u64>; 4]> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let slot = transport.semaphores().allocate_slot()?;
    let mut importer = Importer::new(transport.clone());
    let mut buffers = RingBuffers::new(kind, &ctx.job_id, args.bytes);
    let key = |step: usize, r: usize, what: &str| {
        format!("nvfipc-bench/{}/floor/{step}/{r}/{what}", ctx.job_id)
    };
    let mut mapped = Vec::new();
    let mut opens = Vec::with_capacity(args.steps);
    let mut exports = Vec::with_capacity(args.steps);
    let mut closes = Vec::with_capacity(args.steps);
    for step in 0..=args.steps {
        let addrs = buffers.step(step, true)?;
        let [send, recv] = ring_requests(ctx, "floor", addrs, args.bytes, kind);
        let mut records = Vec::new();
        let start = Instant::now();
        for req in [&send, &recv] {
            let local = transport.resolve(req.ptr, req.bytes)?;
            records.push(make_record(
                &**transport,
                &local,
                rank,
                step as u64 + 1,
                slot,
            )?);
        }
        if step > 0 {
            exports.push(nanos(start.elapsed()));
        }
        for (rec, what) in records.iter().zip(["send", "recv"]) {
            ctx.store.set(&key(step, rank, what), &rec.encode())?;
        }
        ctx.barrier(None, None)?;
        // My send goes to next's receive buffer; my receive pulls from prev's send buffer.
        let wanted = [key(step, next, "recv"), key(step, prev, "send")];
        let refs: Vec<&str> = wanted.iter().map(String::as_str).collect();
        let values = ctx.store.multi_get(&refs, ctx.timeout())?;
        let start = Instant::now();
        let new = vec![
            importer.import(next, &values[0])?,
            importer.import(prev, &values[1])?,
        ];
        // The replaced mappings' guards release them.
        drop(std::mem::replace(&mut mapped, new));
        if step > 0 {
            opens.push(nanos(start.elapsed()));
        }
        ctx.barrier(None, None)?;
        let start = Instant::now();
        transport.flush_releases(ctx.timeout())?;
        if step > 0 {
            closes.push(nanos(start.elapsed()));
        }
        ctx.barrier(None, None)?;
    }
    drop(mapped);
    drop(importer);
    let _ = transport.semaphores().free_slot(slot);
    let probe = format!("nvfipc-bench/{}/floor/rtt", ctx.job_id);
    let mut rtts = Vec::with_capacity(args.steps);
    for _ in 0..args.steps.max(10) {
        let start = Instant::now();
        ctx.store.add(&probe, 0)?;
        rtts.push(nanos(start.elapsed()));
    }
    ctx.barrier(None, None)?;
    Ok([exports, opens, closes, rtts])
}

/// Floor of one call: median export cost (when measured) plus median open cost plus two median
/// store round trips.
pub fn floor_ns(exports: &[u64], opens: &[u64], rtts: &[u64]) -> Option<u64> {
    Some(median(exports).unwrap_or(0) + median(opens)? + 2 * median(rtts)?)
}

#[cfg(test)]
mod tests;
