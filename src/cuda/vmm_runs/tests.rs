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
