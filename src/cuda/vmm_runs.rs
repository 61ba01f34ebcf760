//! Widened runs of exchanged VMM buffers, so that the caching-allocator pattern over PyTorch's
//! expandable segments costs no store round trip.
//!
//! A buffer carved from expandable segments lies in one or several 2 MiB (or 20 MiB) physical
//! allocations; its exact run (`vmm::resolve_run`) changes from tensor to tensor: [s1], then
//! [s1, s2] for a tensor that crosses a segment boundary, then [s2]. Each new run is a new
//! allocation to the peer, which needs a record through the store. Exchanged buffers are
//! therefore resolved to a *widened* run instead: every segment mapped contiguously with the
//! buffer's own inside the aligned windows (32 MiB unless `NVFIPC_VMM_WINDOW_MIB` says otherwise;
//! 0 turns widening off) that the buffer overlaps, and inside its reserved range. Buffers of one window then share one run, which the peer holds
//! after the first exchange, so later ones go through the board alone (`exchange::held`).
//!
//! [`WideRuns`] remembers the runs it widened (a bounded, most-recently-used list; runs of buffers
//! over other windows may overlap), so that a cached call costs no more driver calls than the
//! exact resolution (the pointer query and the walk over the buffer's own segments):
//! a remembered run serves a buffer when it holds every segment of the buffer's exact run, at
//! the same place and with the same id. Its other segments may have been unmapped since (the
//! allocator shrank); serving such a run to a peer that holds it already is still right, since
//! the buffer's bytes lie in segments just checked, and the peer's mapping holds its own
//! references. Before a run is exported (a peer that does not hold it), [`WideRuns::validate`]
//! checks every segment and widens again when one changed.

use super::vmm::{LocalSegment, Run};
use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Most segments a widened run holds, whatever the segments' size.
pub const MAX_WIDE_SEGMENTS: usize = 64;

/// Runs remembered per transport, most recently used first.
const REMEMBERED: usize = 64;

/// Widens `run`, the exact run of `[ptr, ptr + bytes)`, to the segments mapped contiguously with
/// it that overlap the aligned windows of `window` bytes (> 0; 32 MiB by default: 16 segments of
/// 2 MiB, or two of PyTorch's 20 MiB large-pool segments) the buffer overlaps, without leaving
/// `[range_lo, range_hi)` (the reserved range). `segment_at(addr)` is the exportable segment
/// mapped at `addr` with the run's handle types, or `None` (unmapped, or of another kind), which
/// ends the widening on that side. Pure: unit-tested without a GPU.
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

    /// Remembers `run` first, forgetting the least recently used beyond the bound. Runs may
    /// overlap: buffers that span other windows widen to other runs over the same segments, and
    /// each buffer of a call must find its own run again when it is exported.
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

    /// The run an exchange resolves a buffer to, given `exact`, the segments the buffer spans
    /// (just walked): a remembered run that holds them, else `widen(exact)`, remembered.
    pub fn resolve(&self, exact: Run, widen: impl FnOnce(Run) -> Run) -> Arc<Run> {
        match self.covering(&exact) {
            Some(run) => run,
            None => self.remember(widen(exact)),
        }
    }

    /// Before the run named (`base`, `id`) is exported for a buffer: `None` while it stands as
    /// resolved (remembered and every segment still `current`, or the buffer's `exact` run
    /// itself), else the run to export instead, widened afresh from the buffer's exact run and
    /// remembered (so the export finds it).
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
mod tests {
    use super::*;
    use crate::cuda::vmm::tests::{seg, MIB2};
    use crate::test_rng::Rng;
    use std::collections::BTreeMap;

    /// A reserved range at `lo` with 2 MiB segments mapped at the given indices (id = 100 +
    /// index), and the lookup `widen` takes.
    struct Space {
        mapped: BTreeMap<u64, LocalSegment>,
    }

    impl Space {
        fn new(lo: u64, indices: impl IntoIterator<Item = u64>) -> Space {
            let mapped = indices
                .into_iter()
                .map(|i| (lo + i * MIB2, seg(lo + i * MIB2, 100 + i)))
                .collect();
            Space { mapped }
        }

        fn at(&self, addr: u64) -> Option<LocalSegment> {
            let (_, s) = self.mapped.range(..=addr).next_back()?;
            (addr < s.base + s.size).then_some(*s)
        }

        /// The exact run of `[ptr, ptr + bytes)`, widened.
        fn wide(&self, ptr: u64, bytes: u64, range: (u64, u64)) -> Run {
            let mut exact = vec![self.at(ptr).unwrap()];
            while exact.last().unwrap().base + MIB2 < ptr + bytes {
                exact.push(self.at(exact.last().unwrap().base + MIB2).unwrap());
            }
            widen(Run { segments: exact }, ptr, bytes, WINDOW, range, |a| {
                self.at(a)
            })
        }
    }

    const LO: u64 = 0x7f00_0000_0000; // 32 MiB aligned
    const WINDOW: u64 = 32 << 20;

    #[test]
    fn buffers_of_one_window_share_one_run() {
        let space = Space::new(LO, 0..40);
        let range = (LO, LO + 40 * MIB2);
        let a = space.wide(LO + 3 * MIB2 + 256, 1 << 20, range);
        let b = space.wide(LO + 5 * MIB2 - 4096, 1 << 20, range); // crosses a segment boundary
        let c = space.wide(LO + 15 * MIB2, MIB2, range);
        assert_eq!(a.segments.len(), 16);
        assert_eq!((a.base(), a.size()), (LO, 32 << 20));
        assert_eq!(a.id(), b.id());
        assert_eq!(a.id(), c.id());
        // The next window is a run of its own; a buffer across both gets both.
        let d = space.wide(LO + 17 * MIB2, 64, range);
        assert_eq!(d.base(), LO + 16 * MIB2);
        let e = space.wide(LO + 16 * MIB2 - 64, 128, range);
        assert_eq!((e.base(), e.segments.len()), (LO, 32));
    }

    #[test]
    fn widening_stops_at_holes_the_reserved_range_and_other_kinds() {
        // Segments 0..4 and 6..10 mapped: a hole at 4..6.
        let space = Space::new(LO, (0..4).chain(6..10));
        let range = (LO, LO + 10 * MIB2);
        let left = space.wide(LO + MIB2, 64, range);
        assert_eq!((left.base(), left.segments.len()), (LO, 4));
        let right = space.wide(LO + 7 * MIB2, 64, range);
        assert_eq!((right.base(), right.segments.len()), (LO + 6 * MIB2, 4));
        // The reserved range ends the walk even where the next range's segments abut.
        let narrow = space.wide(LO + 7 * MIB2, 64, (LO + 7 * MIB2, LO + 8 * MIB2));
        assert_eq!(narrow.segments.len(), 1);
        // A segment with other handle types is not joined.
        let mut other = Space::new(LO, 0..3);
        other.mapped.get_mut(&LO).unwrap().handle_types = 0x8;
        let run = other.wide(LO + MIB2, 64, (LO, LO + 3 * MIB2));
        assert_eq!((run.base(), run.segments.len()), (LO + MIB2, 2));
    }

    #[test]
    fn widened_runs_are_bounded() {
        let space = Space::new(LO, 0..200);
        let run = space.wide(LO, 150 * MIB2, (LO, LO + 200 * MIB2));
        assert_eq!(
            run.segments.len(),
            150,
            "the buffer's own segments are never cut"
        );
        let small = space.wide(LO + 100 * MIB2, 64, (LO, LO + 200 * MIB2));
        assert!(small.segments.len() <= MAX_WIDE_SEGMENTS);
    }

    #[test]
    fn remembered_runs_serve_buffers_whose_segments_they_hold() {
        let space = Space::new(LO, 0..16);
        let range = (LO, LO + 16 * MIB2);
        let runs = WideRuns::default();
        let wide = runs.remember(space.wide(LO + MIB2, 64, range));
        let exact = |ptr, bytes| {
            let mut s = vec![space.at(ptr).unwrap()];
            while s.last().unwrap().base + MIB2 < ptr + bytes {
                s.push(space.at(s.last().unwrap().base + MIB2).unwrap());
            }
            Run { segments: s }
        };
        let got = runs.covering(&exact(LO + 7 * MIB2 - 8, 16)).unwrap();
        assert_eq!(got.id(), wide.id());
        assert!(runs.get(wide.base(), wide.id()).is_some());
        // A segment replaced by a new allocation at the same place is not served.
        let mut moved = exact(LO + 3 * MIB2, 64);
        moved.segments[0].id = 999;
        assert!(runs.covering(&moved).is_none());
        // Overlapping runs (buffers over other windows) are all kept: each buffer of one call
        // finds the run it was resolved to when it is exported.
        let mut other = space.wide(LO + MIB2, 64, range);
        other.segments.truncate(8);
        let other = runs.remember(other);
        assert!(runs.get(wide.base(), wide.id()).is_some());
        assert!(runs.get(other.base(), other.id()).is_some());
        // The most recently used run that holds the segments serves.
        assert_eq!(runs.covering(&exact(LO, 64)).unwrap().id(), other.id());
        runs.forget(other.base(), other.id());
        assert_eq!(runs.covering(&exact(LO, 64)).unwrap().id(), wide.id());
        runs.forget(wide.base(), wide.id());
        assert!(runs.covering(&exact(LO, 64)).is_none());
        // Bounded: the least recently used go.
        for i in 0..(REMEMBERED as u64 + 8) {
            runs.remember(Run {
                segments: vec![seg(LO + (100 + i) * MIB2, 1000 + i)],
            });
        }
        assert_eq!(lock(&runs.runs).len(), REMEMBERED);
        assert!(runs.get(LO + 100 * MIB2, 1000).is_none());
    }

    /// Random legal programs against a model of an allocator over one reserved range (2 MiB
    /// segments mapped, unmapped and replaced by new physical allocations at the same place, as
    /// expandable segments do) and of what a peer holds per channel: whatever the churn, a
    /// buffer resolves to a run that holds its segments as mapped now; a run it is exported as
    /// has every segment mapped now and is found again by the export; a run a peer holds serves
    /// the buffer's bytes from the segments mapped now.
    #[test]
    fn random_churn_keeps_runs_exportable_and_right() {
        const SLOTS: u64 = 48;
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut space = Space::new(LO, 0..SLOTS);
            let mut next_id = 1000;
            let range = (LO, LO + SLOTS * MIB2);
            let runs = WideRuns::default();
            let mut held: [VecDeque<u64>; 2] = Default::default();
            for step in 0..300 {
                let what = rng.below(10) as u64;
                let slot = rng.below(SLOTS as usize) as u64;
                let at = LO + slot * MIB2;
                if what < 3 {
                    // Unmap, or map a new physical allocation (a new id) at a free or used slot.
                    if what == 0 {
                        space.mapped.remove(&at);
                    } else {
                        next_id += 1;
                        space.mapped.insert(at, seg(at, next_id));
                    }
                    continue;
                }
                // An exchange of up to three buffers over mapped memory: every buffer resolved
                // first (as a call resolves its batch), then each sent as the peer needs.
                let mut batch = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let ptr = at + rng.below((MIB2 / 256) as usize) as u64 * 256;
                    let bytes = 1 + rng.below((3 * MIB2) as usize) as u64;
                    let mut exact = Vec::new();
                    let mut next = ptr;
                    while next < ptr + bytes {
                        match space.at(next) {
                            Some(s) => {
                                exact.push(s);
                                next = s.base + s.size;
                            }
                            None => break,
                        }
                    }
                    if next < ptr + bytes {
                        continue; // not all mapped: no such buffer
                    }
                    let exact = Run { segments: exact };
                    let widen = |e: Run| widen(e, ptr, bytes, WINDOW, range, |a| space.at(a));
                    let run = runs.resolve(exact.clone(), widen);
                    batch.push((ptr, bytes, exact, run));
                }
                for (b, (ptr, bytes, exact, run)) in batch.into_iter().enumerate() {
                    let ctx = format!("seed {seed} step {step} buffer {b}");
                    assert!(
                        holds(&run, &exact),
                        "{ctx}: resolved run lacks its segments"
                    );
                    let channel = &mut held[b % 2];
                    let exported = if channel.contains(&run.id()) {
                        run
                    } else {
                        let current = |s: &LocalSegment| space.at(s.base) == Some(*s);
                        let widen = |e: Run| widen(e, ptr, bytes, WINDOW, range, |a| space.at(a));
                        let fresh = runs
                            .refresh(run.base(), run.id(), current, || Ok(exact.clone()), widen)
                            .unwrap();
                        let exported = fresh.unwrap_or(run);
                        assert!(
                            runs.get(exported.base(), exported.id()).is_some()
                                || (exported.base(), exported.id()) == (exact.base(), exact.id()),
                            "{ctx}: the export would not find its run"
                        );
                        assert!(
                            exported.segments.iter().all(current),
                            "{ctx}: exporting a segment no longer mapped"
                        );
                        channel.retain(|&id| id != exported.id());
                        channel.push_front(exported.id());
                        channel.truncate(8);
                        exported
                    };
                    assert!(holds(&exported, &exact), "{ctx}: bytes from other segments");
                    let end = exported.base() + exported.size();
                    assert!(
                        exported.base() <= ptr && ptr + bytes <= end,
                        "{ctx}: outside"
                    );
                }
            }
        }
    }
}
