//! Rank side of the exchange benchmark: a ring (send to rank+1, receive from rank-1: two comms
//! per call) through our cache and through the seed protocol, in three scenarios, and the floor.
//!
//! - cold: every rank swaps both buffers before every call (every call misses);
//! - warm: the buffers never change (every call after the first hits);
//! - asym: even ranks swap their buffers every other call, odd ranks never (one side misses).
//!
//! Step 0 of every scenario (new channels) is not timed. Replaced buffers stay allocated for two
//! more steps: by then every peer has finished the call that released its mapping of them.

use super::seed::{make_record, Importer, SeedExchange};
use super::{gather_samples, RankArgs, Series};
use crate::memory::Buffer;
use crate::stats::{median, nanos};
use nvfuser_ipc::context::Context;
use nvfuser_ipc::exchange::{CacheConfig, HandleCache, MemKind, Request, Transport};
use nvfuser_ipc::Result;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Cold,
    Warm,
    Asym,
}

pub const SCENARIOS: [Scenario; 3] = [Scenario::Cold, Scenario::Warm, Scenario::Asym];

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Cold => "cold",
            Scenario::Warm => "warm",
            Scenario::Asym => "asym",
        }
    }

    /// Whether `rank` swaps its buffers before call `step` (step 0 always allocates).
    pub fn swaps(self, rank: usize, step: usize) -> bool {
        match self {
            Scenario::Cold => true,
            Scenario::Warm => step == 0,
            Scenario::Asym => step == 0 || (rank % 2 == 0 && step % 2 == 1),
        }
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

    /// Swaps in new buffers when asked; frees those retired two or more steps ago.
    fn step(&mut self, step: usize, swap: bool) -> Result<()> {
        while self.retired.front().is_some_and(|(s, _)| s + 2 <= step) {
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
        Ok(())
    }

    fn requests(&self, rank: usize, world: usize, tag: &str) -> [Request; 2] {
        let addr = |b: &Option<Buffer>| b.as_ref().map_or(0, Buffer::addr);
        [
            Request::send(
                (rank + 1) % world,
                tag,
                addr(&self.send),
                self.bytes,
                self.kind,
            ),
            Request::recv(
                (rank + world - 1) % world,
                tag,
                addr(&self.recv),
                self.bytes,
                self.kind,
            ),
        ]
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
    let mut out = Vec::new();
    let cache = HandleCache::with_transports(CacheConfig::from_context(ctx), transports.to_vec())?;
    for scenario in SCENARIOS {
        let samples = ours(ctx, &cache, args, kind, scenario)?;
        let name = format!("ours.{}", scenario.name());
        out.extend(gather_samples(ctx, &name, &samples)?);
    }
    ctx.barrier(None, None)?;
    cache.close();
    for scenario in SCENARIOS {
        let samples = seed(ctx, &transport, args, kind, scenario)?;
        let name = format!("seed.{}", scenario.name());
        out.extend(gather_samples(ctx, &name, &samples)?);
    }
    let (opens, rtts) = floor(ctx, &transport, args, kind)?;
    out.extend(gather_samples(ctx, "floor.opens", &opens)?);
    out.extend(gather_samples(ctx, "floor.rtt", &rtts)?);
    Ok(out)
}

fn ours(
    ctx: &Context,
    cache: &HandleCache,
    args: &RankArgs,
    kind: MemKind,
    scenario: Scenario,
) -> Result<Vec<u64>> {
    let tag = format!("bench-{}", scenario.name());
    let mut buffers = RingBuffers::new(kind, &ctx.job_id, args.bytes);
    let mut samples = Vec::with_capacity(args.steps);
    ctx.barrier(None, None)?;
    for step in 0..=args.steps {
        buffers.step(step, scenario.swaps(ctx.rank, step))?;
        let requests = buffers.requests(ctx.rank, ctx.world_size, &tag);
        let start = Instant::now();
        cache.exchange_handles(&requests)?;
        if step > 0 {
            samples.push(nanos(start.elapsed()));
        }
    }
    // Nobody frees a buffer a peer may still map from its last call.
    ctx.barrier(None, None)?;
    Ok(samples)
}

fn seed(
    ctx: &Context,
    transport: &Arc<dyn Transport>,
    args: &RankArgs,
    kind: MemKind,
    scenario: Scenario,
) -> Result<Vec<u64>> {
    let (rank, world) = (ctx.rank, ctx.world_size);
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let tag = format!("seed-{}", scenario.name());
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
    let mut buffers = RingBuffers::new(kind, &ctx.job_id, args.bytes);
    let mut samples = Vec::with_capacity(args.steps);
    ctx.barrier(None, None)?;
    for step in 0..=args.steps {
        buffers.step(step, scenario.swaps(rank, step))?;
        let requests = buffers.requests(rank, world, &tag);
        // Both sides of a comm derive the same answer: it misses when either side swapped.
        let mine = scenario.swaps(rank, step);
        let miss = [
            mine || scenario.swaps(next, step),
            mine || scenario.swaps(prev, step),
        ];
        let start = Instant::now();
        seed.exchange(&requests, &miss)?;
        if step > 0 {
            samples.push(nanos(start.elapsed()));
        }
    }
    ctx.barrier(None, None)?;
    Ok(samples)
}

/// The floor of a cold call: opening the two peer records (decode, map the buffer, release the
/// previous mappings) per step, and the store round trip (ADD) measured on its own.
fn floor(
    ctx: &Context,
    transport: &Arc<dyn Transport>,
    args: &RankArgs,
    kind: MemKind,
) -> Result<(Vec<u64>, Vec<u64>)> {
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
    for step in 0..=args.steps {
        buffers.step(step, true)?;
        let [send, recv] = buffers.requests(rank, world, "floor");
        for (req, what) in [(&send, "send"), (&recv, "recv")] {
            let local = transport.resolve(req.ptr, req.bytes)?;
            let rec = make_record(&**transport, &local, rank, step as u64 + 1, slot)?;
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
        for old in std::mem::replace(&mut mapped, new) {
            importer.release(&old)?;
        }
        if step > 0 {
            opens.push(nanos(start.elapsed()));
        }
        ctx.barrier(None, None)?;
    }
    for old in mapped {
        importer.release(&old)?;
    }
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
    Ok((opens, rtts))
}

/// Floor of one call: median open cost plus two median store round trips.
pub fn floor_ns(opens: &[u64], rtts: &[u64]) -> Option<u64> {
    Some(median(opens)? + 2 * median(rtts)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules() {
        for step in 0..6 {
            assert!(Scenario::Cold.swaps(3, step));
            assert_eq!(Scenario::Warm.swaps(0, step), step == 0);
            assert_eq!(Scenario::Asym.swaps(1, step), step == 0);
        }
        assert!(Scenario::Asym.swaps(2, 1) && !Scenario::Asym.swaps(2, 2));
        assert_eq!(floor_ns(&[10, 20, 30], &[5]), Some(30));
        assert_eq!(floor_ns(&[], &[5]), None);
    }
}
