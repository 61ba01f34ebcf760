//! Where an exchange's time goes, phase by phase, when asked for
//! ([`HandleCache::set_phase_timing`](super::HandleCache::set_phase_timing)): off by default,
//! when the cost is one relaxed load per call; on, a clock read at each phase boundary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The phases of one `exchange_handles` call, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Step 1: each request resolved to its allocation (the buffer's identity).
    Resolve,
    /// Step 1: channels found or made, steps and versions bumped, progress taken out.
    Claim,
    /// Peers' node identities read from the store (a first exchange with a peer only).
    Lookup,
    /// Records built (the buffers exported), when a buffer changed.
    Export,
    /// Records sent (`MULTI_SET`).
    Records,
    /// `(step, version, where)` written on this rank's board.
    Publish,
    /// Waiting on the peers' boards for the same step.
    WaitPeers,
    /// Records built from allocations seen before and imported (no store).
    ImportKnown,
    /// Records fetched from the store (`WAIT` + `MULTI_GET`).
    Fetch,
    /// Fetched records imported (mapped).
    Import,
    /// Peers' semaphore slabs mapped, `opened` published.
    Slabs,
    /// Waiting until the peers opened this rank's new buffers.
    WaitOpened,
    /// New mappings installed, replaced ones released or kept, progress given back.
    Commit,
}

/// Every phase, in order.
pub const PHASES: [Phase; 13] = [
    Phase::Resolve,
    Phase::Claim,
    Phase::Lookup,
    Phase::Export,
    Phase::Records,
    Phase::Publish,
    Phase::WaitPeers,
    Phase::ImportKnown,
    Phase::Fetch,
    Phase::Import,
    Phase::Slabs,
    Phase::WaitOpened,
    Phase::Commit,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Resolve => "resolve",
            Phase::Claim => "claim",
            Phase::Lookup => "lookup",
            Phase::Export => "export",
            Phase::Records => "records",
            Phase::Publish => "publish",
            Phase::WaitPeers => "wait_peers",
            Phase::ImportKnown => "import_known",
            Phase::Fetch => "fetch",
            Phase::Import => "import",
            Phase::Slabs => "slabs",
            Phase::WaitOpened => "wait_opened",
            Phase::Commit => "commit",
        }
    }
}

/// Time spent per phase over the calls timed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Calls that ran to the end while timing was on.
    pub calls: u64,
    /// Nanoseconds per phase, indexed like [`PHASES`].
    pub nanos: [u64; PHASES.len()],
}

impl PhaseTimes {
    /// Nanoseconds of `phase` over all timed calls.
    pub fn of(&self, phase: Phase) -> u64 {
        self.nanos[phase as usize]
    }
}

/// The cache's accumulators.
#[derive(Default)]
pub(crate) struct PhaseClock {
    enabled: AtomicBool,
    calls: AtomicU64,
    nanos: [AtomicU64; PHASES.len()],
}

impl PhaseClock {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// A lap for one call, or `None` when timing is off.
    pub fn start(&self) -> Option<Lap<'_>> {
        self.enabled.load(Ordering::Relaxed).then(|| Lap {
            clock: self,
            at: Instant::now(),
        })
    }

    pub fn snapshot(&self) -> PhaseTimes {
        let mut out = PhaseTimes {
            calls: self.calls.load(Ordering::Relaxed),
            ..PhaseTimes::default()
        };
        for (o, n) in out.nanos.iter_mut().zip(&self.nanos) {
            *o = n.load(Ordering::Relaxed);
        }
        out
    }

    pub fn reset(&self) {
        self.calls.store(0, Ordering::Relaxed);
        for n in &self.nanos {
            n.store(0, Ordering::Relaxed);
        }
    }
}

/// One call's timing: each [`mark`](Lap::mark) charges the time since the previous one to a
/// phase.
pub(crate) struct Lap<'a> {
    clock: &'a PhaseClock,
    at: Instant,
}

impl Lap<'_> {
    pub fn mark(&mut self, phase: Phase) {
        let now = Instant::now();
        let ns = u64::try_from(now.duration_since(self.at).as_nanos()).unwrap_or(u64::MAX);
        self.clock.nanos[phase as usize].fetch_add(ns, Ordering::Relaxed);
        self.at = now;
    }

    /// The call ran to its end.
    pub fn finish(self) {
        self.clock.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// Marks `phase` on an optional lap.
pub(crate) fn mark(lap: &mut Option<Lap<'_>>, phase: Phase) {
    if let Some(l) = lap {
        l.mark(phase);
    }
}

#[cfg(test)]
mod tests;
