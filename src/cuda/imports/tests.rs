use super::*;
use crate::error::Status;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// A stand-in for a kind's open and close steps (no GPU: this tests the table, its refcounts,
/// take-back, room, flush and guards). Keys are u32; a mapping is (base, closes?). Opens
/// count; closes wait at the gate while `gated` is set, and are recorded.
#[derive(Default)]
struct Fake {
    opens: AtomicU64,
    /// Bases opened and not closed yet.
    open_now: Mutex<std::collections::HashSet<u64>>,
    closes: Mutex<Vec<u64>>,
    gated: AtomicBool,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
}

impl ImportKind for Fake {
    type Key = u32;
    type Mapped = (u64, bool);
    /// Bases closed, as the kind's own bookkeeping sees them.
    type Side = Vec<u64>;
    const THREAD: &'static str = "nvfipc-test-imports";
    const PENDING: &'static str = "test mapping(s) were still waiting to be closed";

    fn at(&self, mapped: &(u64, bool)) -> (u64, Option<CudaContext>) {
        (mapped.0, None)
    }
    fn closes(&self, mapped: &(u64, bool)) -> bool {
        mapped.1
    }
    fn drain(&self, _peer: usize, _mapped: &(u64, bool)) -> Result<()> {
        if self.gated.load(Ordering::SeqCst) {
            if let Some(rx) = lock(&self.gate).as_ref() {
                rx.recv().map_err(|_| Error::internal("gate closed"))?;
            }
        }
        Ok(())
    }
    fn close(&self, _peer: usize, mapped: &(u64, bool)) -> Result<()> {
        lock(&self.open_now).remove(&mapped.0);
        lock(&self.closes).push(mapped.0);
        Ok(())
    }
    fn closed(&self, side: &mut Vec<u64>, mapped: &(u64, bool)) {
        side.push(mapped.0);
    }
}

fn table() -> ImportTable<Fake> {
    ImportTable::new(Fake::default(), crate::cuda::DEFAULT_MAX_PENDING_PER_PEER)
}

/// A table whose drains wait for a message on the returned sender.
fn gated() -> (ImportTable<Fake>, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel();
    let t = table();
    *lock(&t.kind().gate) = Some(rx);
    t.kind().gated.store(true, Ordering::SeqCst);
    (t, tx)
}

fn open_at(
    t: &ImportTable<Fake>,
    base: u64,
) -> impl FnOnce(&mut Tables<Fake>) -> Result<OpenOutcome<u32, (u64, bool)>> + '_ {
    move |_| {
        t.kind().opens.fetch_add(1, Ordering::SeqCst);
        Ok(OpenOutcome::Mapped((base, true)))
    }
}

fn acquire(t: &ImportTable<Fake>, key: u32, peer: usize, base: u64) -> Import<Fake> {
    t.acquire(
        key,
        peer,
        Duration::from_secs(5),
        || format!("test mapping {key}"),
        open_at(t, base),
    )
    .unwrap()
}

fn opens(t: &ImportTable<Fake>) -> u64 {
    t.kind().opens.load(Ordering::SeqCst)
}

fn closes(t: &ImportTable<Fake>) -> Vec<u64> {
    lock(&t.kind().closes).clone()
}

fn counts(t: &ImportTable<Fake>) -> (usize, u64) {
    t.inspect(|tables, c| (tables.len(), c.pending))
}

#[test]
fn one_open_per_key_and_the_last_guard_hands_it_to_the_releaser() {
    let t = table();
    let a = acquire(&t, 1, 0, 0x1000);
    let b = acquire(&t, 1, 1, 0x9999);
    assert_eq!((a.base(), b.base()), (0x1000, 0x1000), "the live mapping");
    assert_eq!(opens(&t), 1);
    drop(a);
    assert_eq!(counts(&t).0, 1, "one reference left");
    assert!(closes(&t).is_empty());
    drop(b);
    t.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(closes(&t), vec![0x1000]);
    assert_eq!(counts(&t), (0, 0));
    assert_eq!(t.inspect(|tables, _| tables.side.clone()), vec![0x1000]);
    let c = t.inspect(|_, c| c);
    assert_eq!((c.finished, c.revived, c.errors), (1, 0, 0));
    // Opened again after its close: a fresh open.
    let c = acquire(&t, 1, 0, 0x2000);
    assert_eq!((c.base(), opens(&t)), (0x2000, 2));
}

#[test]
fn acquire_hits_takes_back_or_opens_afresh() {
    let (t, gate) = gated();
    let live = acquire(&t, 5, 1, 0x5000);
    assert_eq!(acquire(&t, 5, 1, 0x5555).base(), 0x5000, "a live entry");
    // Queued (the drain of 6 holds the thread): 7 is taken back, still mapped, into the table.
    drop(acquire(&t, 6, 1, 0x6000));
    drop(acquire(&t, 7, 1, 0x7000));
    let opened = opens(&t);
    let back = acquire(&t, 7, 1, 0x7777);
    assert_eq!(back.base(), 0x7000, "taken back from the queue");
    assert_eq!(opens(&t), opened);
    assert!(t.inspect(|tables, _| tables.entries().any(|(k, _)| *k == 7)));
    // Nothing to find: opened afresh under the lock.
    let fresh = acquire(&t, 8, 1, 0x8000);
    assert_eq!(fresh.base(), 0x8000);
    assert_eq!(opens(&t), opened + 1);
    gate.send(()).unwrap();
    t.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(
        closes(&t),
        vec![0x6000],
        "only what was not taken back closes"
    );
    drop((live, back, fresh));
}

#[test]
fn a_mapping_waiting_for_its_close_is_taken_back_still_mapped() {
    let (t, gate) = gated();
    let a = acquire(&t, 7, 3, 0x7000);
    let other = acquire(&t, 8, 3, 0x8000);
    drop(other); // drains behind the gate: the thread holds it
    drop(a); // queued behind it
    assert_eq!(counts(&t), (0, 2));
    let b = acquire(&t, 7, 3, 0x7777);
    assert_eq!(b.base(), 0x7000, "taken back, not reopened");
    assert_eq!(opens(&t), 2);
    assert_eq!(counts(&t), (1, 1));
    // The one being drained is taken back too (its close is skipped).
    let c = acquire(&t, 8, 3, 0x8888);
    assert_eq!(c.base(), 0x8000);
    assert_eq!(counts(&t), (2, 0));
    gate.send(()).unwrap();
    t.flush(Duration::from_secs(10)).unwrap();
    assert!(closes(&t).is_empty(), "nothing taken back was closed");
    assert_eq!(t.inspect(|_, c| c.revived), 2);
    drop((b, c));
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    t.flush(Duration::from_secs(10)).unwrap();
    let mut closed = closes(&t);
    closed.sort();
    assert_eq!(closed, vec![0x7000, 0x8000]);
}

#[test]
fn room_is_per_peer_and_flush_is_bounded() {
    let (t, gate) = gated();
    let limit = 3;
    let guards: Vec<_> = (0..=limit as u32)
        .map(|k| acquire(&t, k, 2, 0x1000 * u64::from(k + 1)))
        .collect();
    drop(guards);
    let releaser = &t.inner.releaser;
    let err = releaser
        .wait_below(2, limit, Duration::from_millis(30))
        .unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(err.message.contains("peer rank 2"), "{err}");
    releaser.wait_below(3, limit, Duration::ZERO).unwrap();
    let err = t.flush(Duration::from_millis(30)).unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(err.message.contains("test mapping(s)"), "{err}");
    for _ in 0..=limit {
        gate.send(()).unwrap();
    }
    t.flush(Duration::from_secs(10)).unwrap();
    releaser.wait_below(2, limit, Duration::ZERO).unwrap();
    t.wait_room(2, Duration::ZERO).unwrap();
    assert_eq!(closes(&t).len(), limit + 1);
}

#[test]
fn entries_that_close_nothing_are_dropped_without_the_releaser() {
    let t = table();
    let own = t
        .acquire(
            5,
            0,
            Duration::ZERO,
            || "own".into(),
            |_| Ok(OpenOutcome::Mapped((0x5000, false))),
        )
        .unwrap();
    let real = acquire(&t, 6, 0, 0x6000);
    assert_eq!(t.inspect(|tables, _| t.mapped(tables)), 1);
    drop(own);
    drop(real);
    t.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(closes(&t), vec![0x6000]);
    assert_eq!(t.inspect(|_, c| c.finished), 1);
}

#[test]
fn within_gives_the_reference_to_the_serving_import() {
    let t = table();
    let outer = acquire(&t, 1, 0, 0x10_0000);
    let inner = t
        .acquire(
            2,
            0,
            Duration::ZERO,
            || "inner".into(),
            |tables| {
                assert_eq!(tables.entries().count(), 1);
                Ok(OpenOutcome::Within {
                    key: 1,
                    offset: 0x200,
                })
            },
        )
        .unwrap();
    assert_eq!((inner.key(), inner.base()), (1, 0x10_0200));
    drop(outer);
    assert_eq!(counts(&t), (1, 0), "the inner buffer keeps the run mapped");
    drop(inner);
    t.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(closes(&t), vec![0x10_0000]);
    // Within a key that is not imported is an internal error, and takes nothing.
    let err = t
        .acquire(
            3,
            0,
            Duration::ZERO,
            || "x".into(),
            |_| Ok(OpenOutcome::Within { key: 9, offset: 0 }),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::Internal);
    assert_eq!(counts(&t), (0, 0));
}

#[test]
fn failed_opens_take_nothing_and_double_releases_are_not_found() {
    let t = table();
    let err = t
        .acquire(
            4,
            0,
            Duration::ZERO,
            || "x".into(),
            |_| Err(Error::invalid("refused")),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(counts(&t), (0, 0));
    let (key, base) = acquire(&t, 4, 1, 0x4000).detach();
    assert_eq!((key, base), (4, 0x4000));
    assert_eq!(counts(&t).0, 1, "a detached reference stays");
    t.release(&4, 1, || "mapping 4 of rank 1".into()).unwrap();
    let err = t
        .release(&4, 1, || "mapping 4 of rank 1".into())
        .unwrap_err();
    assert_eq!(err.status, Status::NotFound);
    assert!(err.message.contains("mapping 4 of rank 1"), "{err}");
    t.flush(Duration::from_secs(10)).unwrap();
}

#[test]
fn close_now_closes_on_the_caller_under_the_lock() {
    let t = table();
    let a = acquire(&t, 1, 0, 0x1000).detach();
    let b = acquire(&t, 1, 0, 0x1000).detach();
    assert_eq!(a, b);
    t.close_now(&1, 0, || "m".into()).unwrap();
    assert!(closes(&t).is_empty(), "one reference left");
    t.close_now(&1, 0, || "m".into()).unwrap();
    assert_eq!(closes(&t), vec![0x1000], "closed without the releaser");
    assert_eq!(
        t.inspect(|tables, c| (tables.side.clone(), c.finished)),
        (vec![0x1000], 0)
    );
    assert_eq!(
        t.close_now(&1, 0, || "m".into()).unwrap_err().status,
        Status::NotFound
    );
}

#[test]
fn concurrent_importers_of_one_key_open_it_once() {
    let t = table();
    let start = Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (t, start) = (t.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let mut held = Vec::new();
                for round in 0..200u64 {
                    let g = t
                        .acquire(
                            11,
                            i,
                            Duration::from_secs(10),
                            || "shared".into(),
                            |_| {
                                let n = t.kind().opens.fetch_add(1, Ordering::SeqCst);
                                // Every open maps at a fresh base, and never while the key
                                // is still mapped (the driver would refuse a second map).
                                let base = 0x1000 * (n + 1);
                                let mut open_now = lock(&t.kind().open_now);
                                assert!(open_now.is_empty(), "opened while {open_now:?} is");
                                open_now.insert(base);
                                Ok(OpenOutcome::Mapped((base, true)))
                            },
                        )
                        .unwrap();
                    held.push(g);
                    if round % 3 == 0 {
                        held.clear();
                    }
                }
                held.iter().map(|g| g.base()).collect::<Vec<_>>()
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    t.flush(Duration::from_secs(10)).unwrap();
    let c = t.inspect(|_, c| c);
    // Every open is closed exactly once, and at most one mapping of the key exists at a time
    // (revived mappings were not closed).
    assert_eq!(counts(&t), (0, 0));
    assert_eq!(opens(&t), c.finished);
    assert_eq!(closes(&t).len() as u64, opens(&t));
    let mut seen = closes(&t);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len() as u64, opens(&t), "no mapping closed twice");
}

#[test]
fn a_close_in_progress_is_waited_for_then_opened_afresh() {
    // The close step itself waits here, so the importer meets `Revive::Closing`.
    struct SlowClose {
        inner: Fake,
        in_close: AtomicBool,
    }
    impl ImportKind for SlowClose {
        type Key = u32;
        type Mapped = (u64, bool);
        type Side = ();
        const THREAD: &'static str = "nvfipc-test-imports-slow";
        const PENDING: &'static str = "slow mapping(s)";
        fn at(&self, m: &(u64, bool)) -> (u64, Option<CudaContext>) {
            (m.0, None)
        }
        fn closes(&self, _: &(u64, bool)) -> bool {
            true
        }
        fn drain(&self, _: usize, _: &(u64, bool)) -> Result<()> {
            Ok(())
        }
        fn close(&self, p: usize, m: &(u64, bool)) -> Result<()> {
            self.in_close.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            self.inner.close(p, m)
        }
    }
    let t = ImportTable::new(
        SlowClose {
            inner: Fake::default(),
            in_close: AtomicBool::new(false),
        },
        crate::cuda::DEFAULT_MAX_PENDING_PER_PEER,
    );
    let open = |base| move |_: &mut Tables<SlowClose>| Ok(OpenOutcome::Mapped((base, true)));
    let a = t
        .acquire(1, 0, Duration::ZERO, || "m".into(), open(0x1000))
        .unwrap();
    drop(a);
    let since = Instant::now();
    while !t.kind().in_close.load(Ordering::SeqCst) {
        assert!(since.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = t
        .acquire(
            1,
            0,
            Duration::from_millis(1),
            || "mapping 1".into(),
            open(0x2000),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(err.message.contains("mapping 1"), "{err}");
    let b = t
        .acquire(1, 0, Duration::from_secs(10), || "m".into(), open(0x2000))
        .unwrap();
    assert_eq!(b.base(), 0x2000, "opened afresh after the close");
    assert_eq!(lock(&t.kind().inner.closes).clone(), vec![0x1000]);
}

mod releaser;
