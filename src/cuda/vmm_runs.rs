//! Widened runs of exchanged VMM buffers (PROTOCOL.md section 3, "Widened runs"), so that the
//! caching-allocator pattern over PyTorch's expandable segments costs no store round trip: a
//! tensor's exact run changes from tensor to tensor, a widened run (every segment mapped with the
//! buffer's inside its aligned windows) is one allocation the peer holds after the first exchange.
//!
//! [`WideRuns`] remembers the runs it widened (a bounded most-recently-used list): a remembered run
//! serves a buffer when it holds every segment of the buffer's exact run, unchanged, and
//! [`WideRuns::refresh`] checks every segment before a run is exported, widening again if one
//! changed.

use super::vmm::{LocalSegment, Run};
use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Most segments a widened run holds, whatever the segments' size.
pub const MAX_WIDE_SEGMENTS: usize = 64;

/// Runs remembered per transport, most recently used first.
const REMEMBERED: usize = 64;

/// Widens `run`, the exact run of `[ptr, ptr + bytes)`, to the segments mapped contiguously with
/// it in the aligned windows of `window` bytes the buffer overlaps, inside the reserved range
/// `[range_lo, range_hi)`. `segment_at(addr)` is the segment mapped at `addr` with the run's
/// handle types, or `None`, which ends the widening on that side. Pure: unit-tested.
pub fn widen(
    run: Run,
    ptr: u64,
    bytes: u64,
    window: u64,
    (range_lo, range_hi): (u64, u64),
    mut segment_at: impl FnMut(u64) -> Option<LocalSegment>,
) -> Run {
    let window = window.max(1);
    let window_lo = (ptr / window * window).max(range_lo);
    let window_hi = ptr
        .saturating_add(bytes)
        .div_ceil(window)
        .saturating_mul(window)
        .min(range_hi);
    let handle_types = run.segments[0].handle_types;
    let usable = |s: &LocalSegment| s.id != 0 && s.size > 0 && s.handle_types == handle_types;
    let mut segments: VecDeque<LocalSegment> = run.segments.into();
    // Backwards: a segment ending where the run starts, while the run starts inside the window.
    while segments.len() < MAX_WIDE_SEGMENTS {
        let first = segments[0];
        if first.base <= window_lo || first.base == 0 {
            break;
        }
        match segment_at(first.base - 1) {
            Some(s) if usable(&s) && s.base.checked_add(s.size) == Some(first.base) => {
                segments.push_front(s)
            }
            _ => break,
        }
    }
    // Forwards: a segment starting where the run ends, while the run ends inside the window.
    while segments.len() < MAX_WIDE_SEGMENTS {
        let last = segments[segments.len() - 1];
        let end = last.base.saturating_add(last.size);
        if end >= window_hi {
            break;
        }
        match segment_at(end) {
            Some(s) if usable(&s) && s.base == end => segments.push_back(s),
            _ => break,
        }
    }
    Run {
        segments: segments.into(),
    }
}

/// The runs one transport widened (see the module docs).
#[derive(Default)]
pub struct WideRuns {
    runs: Mutex<VecDeque<Arc<Run>>>,
}

impl WideRuns {
    /// A remembered run that holds every segment of `exact` at the same place with the same id.
    pub fn covering(&self, exact: &Run) -> Option<Arc<Run>> {
        let mut runs = lock(&self.runs);
        let i = runs.iter().position(|r| holds(r, exact))?;
        let run = runs.remove(i).expect("found above");
        runs.push_front(run.clone());
        Some(run)
    }

    /// The remembered run with this base and id.
    pub fn get(&self, base: u64, id: u64) -> Option<Arc<Run>> {
        lock(&self.runs)
            .iter()
            .find(|r| r.base() == base && r.id() == id)
            .cloned()
    }

    /// Remembers `run` first, forgetting the least recently used beyond the bound (runs may
    /// overlap: each buffer of a call must find its own again when it is exported).
    pub fn remember(&self, run: Run) -> Arc<Run> {
        let run = Arc::new(run);
        let mut runs = lock(&self.runs);
        runs.retain(|r| !(r.base() == run.base() && r.id() == run.id()));
        runs.push_front(run.clone());
        runs.truncate(REMEMBERED);
        run
    }

    /// Forgets the run with this base and id.
    pub fn forget(&self, base: u64, id: u64) {
        lock(&self.runs).retain(|r| !(r.base() == base && r.id() == id));
    }

    /// A remembered run that holds `exact` (the buffer's segments), else `widen(exact)`.
    pub fn resolve(&self, exact: Run, widen: impl FnOnce(Run) -> Run) -> Arc<Run> {
        match self.covering(&exact) {
            Some(run) => run,
            None => self.remember(widen(exact)),
        }
    }

    /// Before the run (`base`, `id`) is exported: `None` while it stands (remembered with every
    /// segment `current`, or the exact run itself), else the run widened afresh, remembered.
    pub fn refresh(
        &self,
        base: u64,
        id: u64,
        current: impl Fn(&LocalSegment) -> bool,
        exact: impl FnOnce() -> crate::error::Result<Run>,
        widen: impl FnOnce(Run) -> Run,
    ) -> crate::error::Result<Option<Arc<Run>>> {
        if let Some(run) = self.get(base, id) {
            if run.segments.iter().all(current) {
                return Ok(None);
            }
            // A neighbour was unmapped or replaced since: exported only as mapped now.
            self.forget(base, id);
        } else {
            let exact = exact()?;
            if (exact.base(), exact.id()) == (base, id) {
                return Ok(None);
            }
            // Resolved to a widened run that has been forgotten since.
            return Ok(Some(self.remember(widen(exact))));
        }
        Ok(Some(self.remember(widen(exact()?))))
    }
}

/// Whether `wide` holds every segment of `exact` (same base, size and id).
fn holds(wide: &Run, exact: &Run) -> bool {
    let Some(first) = exact.segments.first() else {
        return false;
    };
    // The address ranges first: most remembered runs are elsewhere.
    let end = |r: &Run| r.base() + r.size();
    if first.base < wide.base() || end(exact) > end(wide) {
        return false;
    }
    let Some(at) = wide.segments.iter().position(|s| s.base == first.base) else {
        return false;
    };
    wide.segments[at..].len() >= exact.segments.len()
        && wide.segments[at..]
            .iter()
            .zip(&exact.segments)
            .all(|(w, e)| w == e)
}

#[cfg(test)]
mod tests;
