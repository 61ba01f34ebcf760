//! Rank side of the symmetric benchmark: what `HandleCache::symmetric_rendezvous` costs as the
//! group grows (every rank maps every other rank's buffer, W - 1 peers).
//!
//! The process's first rendezvous first, timed from a barrier of the bench: the rank's
//! transports and cache are made then (what a process pays on its first call), and its
//! rendezvous is each rank's first contact with every peer (boards found, semaphore slabs
//! mapped, fd responders connected), reported on its own with its driver calls. Then per round:
//! a fresh buffer holding a pattern of this rank, one barrier of the bench (start-up skew is not
//! counted), the timed first rendezvous of a fresh tag (every peer's buffer is new) and the CPU
//! time the process used meanwhile, another barrier, the timed second one of the same buffers (a
//! cache hit), and a check that every peer's mapping holds
//! that peer's pattern. Every buffer stays allocated until all ranks are done: peers keep their
//! mappings of it for as long as the cache lives.

use super::{gather, RankArgs, Series};
use crate::memory::Buffer;
use crate::stats::{median, nanos};
use nvfuser_ipc::tools::cuda::DRIVER_CALLS;
use nvfuser_ipc::tools::cuda::{driver, result};
use nvfuser_ipc::tools::exchange::Transport;
use nvfuser_ipc::tools::exchange::PHASES;
use nvfuser_ipc::Context;
use nvfuser_ipc::PeerBuffer;
use nvfuser_ipc::{CacheConfig, HandleCache, MemKind};
use nvfuser_ipc::{Error, Result};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of the pattern written to each buffer and checked in every peer's mapping.
pub(super) const PATTERN_BYTES: usize = 16;

/// The pattern `rank` writes into its buffer of `round`.
pub(super) fn pattern(rank: usize, round: usize) -> [u8; PATTERN_BYTES] {
    let mut p = [0u8; PATTERN_BYTES];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (rank.wrapping_mul(31) ^ round.wrapping_mul(7) ^ i.wrapping_mul(13)) as u8;
    }
    p
}

/// Reads the first bytes of a peer's buffer through this process's mapping of it.
fn read_peer(kind: MemKind, peer: &PeerBuffer) -> Result<[u8; PATTERN_BYTES]> {
    let mut out = [0u8; PATTERN_BYTES];
    if peer.bytes < PATTERN_BYTES as u64 {
        return Err(Error::protocol(format!(
            "rank {}'s buffer has {} bytes, fewer than the {PATTERN_BYTES} checked",
            peer.rank, peer.bytes
        )));
    }
    match kind {
        // SAFETY: `peer.ptr` maps at least `peer.bytes >= PATTERN_BYTES` readable bytes of the
        // peer's shared-memory buffer, held mapped by the cache until it is closed.
        MemKind::Host => unsafe {
            std::ptr::copy_nonoverlapping(peer.ptr as *const u8, out.as_mut_ptr(), PATTERN_BYTES)
        },
        // SAFETY: `peer.ptr` is device memory of the peer mapped in this process's current
        // context (the rank's device, entered by the caller), at least PATTERN_BYTES long; the
        // copy is synchronous into `out`, borrowed for its whole length.
        MemKind::Device => unsafe { result::memcpy_dtoh(&mut out, peer.ptr) }
            .map_err(|rc| driver::error(rc, "cuMemcpyDtoH of a peer's mapping"))?,
    }
    Ok(out)
}

/// Checks that every peer's mapping holds that peer's pattern of `round`.
fn check_peers(kind: MemKind, rank: usize, round: usize, peers: &[PeerBuffer]) -> Result<()> {
    for peer in peers.iter().filter(|p| p.rank != rank) {
        let got = read_peer(kind, peer)?;
        if got != pattern(peer.rank, round) {
            return Err(Error::protocol(format!(
                "rank {rank}: round {round}: rank {}'s buffer as mapped here holds {got:?}, not \
                 that rank's pattern",
                peer.rank
            )));
        }
    }
    Ok(())
}

/// CPU time this process (every thread: the fd responder serving peers included) has used, in
/// nanoseconds.
fn process_cpu_ns() -> u64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, exclusively borrowed `rusage` that the call fills in.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// What one rank measured over the timed rounds.
#[derive(Default)]
struct Timings {
    first: Vec<u64>,
    /// CPU time of the process during the first rendezvous: wall time that grows faster than
    /// this is time spent waiting for peers (or for a core).
    first_cpu: Vec<u64>,
    hit: Vec<u64>,
    /// Per round, nanoseconds of each phase of the first rendezvous and of the cache hit
    /// (indexed like `PHASES`).
    phases: Vec<[u64; PHASES.len()]>,
    hit_phases: Vec<[u64; PHASES.len()]>,
    /// Per round, nanoseconds of each kind of driver call (indexed like `DRIVER_CALLS`).
    driver: Vec<[u64; DRIVER_CALLS.len()]>,
}

/// A rank's transports.
pub type Transports = Vec<Arc<dyn Transport>>;

/// Makes the transports a rank's cache uses, when the rank's first rendezvous starts.
pub type MakeTransports<'a> = &'a dyn Fn() -> Result<Transports>;

/// Runs the process's first rendezvous and `args.steps` timed rounds; rank 0 gets everyone's
/// medians. Returns the transports too, which the caller drops after its last barrier.
pub fn run(
    ctx: &Context,
    args: &RankArgs,
    kind: MemKind,
    make_transports: MakeTransports<'_>,
) -> Result<(Vec<Series>, Transports)> {
    let clock = &nvfuser_ipc::tools::cuda::runtime().clock;
    let mut buffers = Vec::with_capacity(args.steps + 1);
    let first_buf = Buffer::alloc(kind, &ctx.job_id, args.bytes)?;
    first_buf.write(&pattern(ctx.rank, 0))?;
    let first_addr = first_buf.addr();
    buffers.push(first_buf);
    // The process's first rendezvous, from a context alone: the transports and the cache are
    // made (fd responder, semaphore slab), the peers' boards found, every peer's buffer mapped.
    ctx.barrier(None, None)?;
    clock.set_enabled(true);
    clock.take();
    let (start, cpu) = (Instant::now(), process_cpu_ns());
    let transports = make_transports()?;
    let cache = HandleCache::with_transports(CacheConfig::from_context(ctx), transports.clone())?;
    cache.set_phase_timing(true);
    cache.phase_times(true);
    let setup = nanos(start.elapsed());
    let peers =
        cache.symmetric_rendezvous("bench-0", first_addr, args.bytes, kind, None, args.timeout)?;
    let first_contact = nanos(start.elapsed());
    let contact_cpu = process_cpu_ns().saturating_sub(cpu);
    let contact_phases = cache.phase_times(true).nanos;
    let contact_driver = clock.take();
    check_peers(kind, ctx.rank, 0, &peers)?;
    let mut t = Timings::default();
    for round in 1..=args.steps {
        let buf = Buffer::alloc(kind, &ctx.job_id, args.bytes)?;
        buf.write(&pattern(ctx.rank, round))?;
        let (addr, tag) = (buf.addr(), format!("bench-{round}"));
        buffers.push(buf);
        ctx.barrier(None, None)?;
        cache.phase_times(true);
        clock.take();
        let (start, cpu) = (Instant::now(), process_cpu_ns());
        let peers = cache.symmetric_rendezvous(&tag, addr, args.bytes, kind, None, args.timeout)?;
        let first = nanos(start.elapsed());
        let first_cpu = process_cpu_ns().saturating_sub(cpu);
        let phases = cache.phase_times(true).nanos;
        let driver = clock.take();
        // The hit is timed from a common start too: otherwise it measures how late the slowest
        // peer finished its first rendezvous.
        ctx.barrier(None, None)?;
        let start = Instant::now();
        let again = cache.symmetric_rendezvous(&tag, addr, args.bytes, kind, None, args.timeout)?;
        let hit = nanos(start.elapsed());
        let hit_phases = cache.phase_times(true).nanos;
        if again != peers {
            return Err(Error::state(format!(
                "rank {}: round {round}: the second rendezvous mapped other buffers",
                ctx.rank
            )));
        }
        check_peers(kind, ctx.rank, round, &peers)?;
        t.first.push(first);
        t.first_cpu.push(first_cpu);
        t.hit.push(hit);
        t.phases.push(phases);
        t.hit_phases.push(hit_phases);
        t.driver.push(driver.map(|(ns, _)| ns));
    }
    clock.set_enabled(false);
    cache.set_phase_timing(false);
    let per_rank = |v: &[u64]| vec![median(v).unwrap_or(0)];
    let mut mine = vec![
        ("symm.first".to_string(), per_rank(&t.first)),
        ("symm.first_cpu".to_string(), per_rank(&t.first_cpu)),
        ("symm.hit".to_string(), per_rank(&t.hit)),
        ("symm.first_contact".to_string(), vec![first_contact]),
        ("symm.contact_cpu".to_string(), vec![contact_cpu]),
        ("symm.contact_phase.setup".to_string(), vec![setup]),
    ];
    for (i, phase) in PHASES.iter().enumerate() {
        for (which, rounds) in [("phase", &t.phases), ("hit_phase", &t.hit_phases)] {
            let of_phase: Vec<u64> = rounds.iter().map(|p| p[i]).collect();
            mine.push((
                format!("symm.{which}.{}", phase.name()),
                per_rank(&of_phase),
            ));
        }
        let contact = vec![contact_phases[i]];
        mine.push((format!("symm.contact_phase.{}", phase.name()), contact));
    }
    for (i, call) in DRIVER_CALLS.iter().enumerate() {
        let of_call: Vec<u64> = t.driver.iter().map(|d| d[i]).collect();
        mine.push((format!("symm.driver.{}", call.name()), per_rank(&of_call)));
        let (ns, calls) = contact_driver[i];
        mine.push((format!("symm.contact_driver.{}", call.name()), vec![ns]));
        mine.push((format!("symm.contact_calls.{}", call.name()), vec![calls]));
    }
    let out = gather(ctx, mine)?;
    // Nobody frees a buffer before every peer has closed its mappings of it (device mappings
    // are closed on the library's releaser threads: wait for them).
    ctx.barrier(None, None)?;
    cache.close();
    if kind == MemKind::Device {
        nvfuser_ipc::tools::cuda::flush_releases(args.timeout)?;
    }
    ctx.barrier(None, None)?;
    drop(buffers);
    Ok((out, transports))
}

#[cfg(test)]
mod tests;
