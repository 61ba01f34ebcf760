//! Where a call's time goes, phase by phase, when asked for (`HandleCache::set_phase_timing`):
//! off, a call pays one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

macro_rules! phases {
    ($($phase:ident => $name:literal,)*) => {
        /// The phases of one `exchange_handles` call, in the order they run (the steps of
        /// docs/PROTOCOL.md, section 5): resolve and claim (step 1), lookup (2), export, records
        /// and publish (3), wait_peers (4), import_known (records built from allocations seen
        /// before), fetch and import (5), slabs (peers' semaphore slabs mapped), wait_opened and
        /// commit (6).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Phase {
            $($phase,)*
        }

        /// Every phase, in order.
        pub const PHASES: [Phase; Phase::Commit as usize + 1] = [$(Phase::$phase),*];

        impl Phase {
            pub fn name(self) -> &'static str {
                match self {
                    $(Phase::$phase => $name,)*
                }
            }
        }
    };
}

phases! {
    Resolve => "resolve",
    Claim => "claim",
    Lookup => "lookup",
    Export => "export",
    Records => "records",
    Publish => "publish",
    WaitPeers => "wait_peers",
    ImportKnown => "import_known",
    Fetch => "fetch",
    Import => "import",
    Slabs => "slabs",
    WaitOpened => "wait_opened",
    Commit => "commit",
}

/// Time spent per phase over the calls that ran to the end while timing was on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimes {
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

    /// A lap for one call, which marks nothing when timing is off.
    pub fn start(&self) -> Lap<'_> {
        Lap((self.enabled.load(Ordering::Relaxed)).then(|| (self, Instant::now())))
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

/// One call's timing: each mark charges the time since the previous one to a phase.
pub(crate) struct Lap<'a>(Option<(&'a PhaseClock, Instant)>);

impl Lap<'_> {
    pub fn mark(&mut self, phase: Phase) {
        if let Some((clock, at)) = &mut self.0 {
            let now = Instant::now();
            let ns = u64::try_from(now.duration_since(*at).as_nanos()).unwrap_or(u64::MAX);
            clock.nanos[phase as usize].fetch_add(ns, Ordering::Relaxed);
            *at = now;
        }
    }

    pub fn finish(self) {
        if let Some((clock, _)) = self.0 {
            clock.calls.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
