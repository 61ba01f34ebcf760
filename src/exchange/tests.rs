//! Unit tests of the handle cache with the host transport: ranks as threads of one process over
//! an in-memory store. Here, above both, because the exchange itself never names a transport.

use crate::default_transports;
use crate::error::Status;
use crate::error::{Error, Result};

use crate::exchange::{CacheConfig, CacheStats, HandleCache, Request};
use crate::host::alloc::alloc_for_job;
use crate::host::{HostBuffer, HostTransport};
use crate::store::Store;
use crate::transport::record::Record;
use crate::transport::record::{from_fixed, HandleType, Segment};
use crate::transport::{ExportedHandle, LocalBuffer, MemKind, P2pHandles, PeerMapping, Transport};
use crate::transport::{RecordSeal, SemaphoreSlab};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shared in-memory test store (blocking waits, as the exchange relies on).
use crate::store::memory::MemoryStore as MemStore;

/// A store that sees every write to it: each is recorded, and a `set` reaches the store only
/// when `keep` admits its key (a peer whose records never reach the store, or a store watched
/// for what it is told).
struct Watched {
    store: Arc<MemStore>,
    keep: fn(&str) -> bool,
    writes: std::sync::Mutex<Vec<(String, Vec<u8>)>>,
}

impl Watched {
    fn new(store: Arc<MemStore>, keep: fn(&str) -> bool) -> Watched {
        Watched {
            store,
            keep,
            writes: Default::default(),
        }
    }

    /// Only records are lost; the node identity a cache publishes arrives.
    fn losing_records(store: Arc<MemStore>) -> Watched {
        Watched::new(store, |key| key.contains("/node/"))
    }

    fn wrote(&self, key: &str, value: &[u8]) {
        crate::sync::lock(&self.writes).push((key.to_string(), value.to_vec()));
    }
}

impl Store for Watched {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.wrote(key, value);
        if (self.keep)(key) {
            return self.store.set(key, value);
        }
        Ok(())
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.store.get(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.store.add(key, delta)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.store.check(keys)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.store.wait(keys, timeout)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.store.delete_key(key)
    }
    fn num_keys(&self) -> Result<i64> {
        self.store.num_keys()
    }
    fn compare_set(&self, k: &str, e: &[u8], d: &[u8]) -> Result<Vec<u8>> {
        self.wrote(k, d);
        self.store.compare_set(k, e, d)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.wrote(key, value);
        self.store.append(key, value)
    }
}

/// Closes every cache at once, as ranks do: closed one by one, each would wait for the next.
fn close_all(c: impl IntoIterator<Item = HandleCache>) -> Vec<CacheStats> {
    let closing: Vec<_> = c
        .into_iter()
        .map(|c| std::thread::spawn(move || c.try_close()))
        .collect();
    closing
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect()
}

fn caches(job: &str, world: usize) -> (Arc<MemStore>, Vec<HandleCache>) {
    let store = Arc::new(MemStore::default());
    let caches = (0..world)
        .map(|rank| {
            default_transports::cache(CacheConfig {
                rank,
                world_size: world,
                store: store.clone(),
                job_id: format!("{job}{}", std::process::id()),
                scope: String::new(),
                timeout: Duration::from_secs(10),
            })
            .unwrap()
        })
        .collect();
    (store, caches)
}

fn buf(job: &str, fill: u8) -> HostBuffer {
    let b = alloc_for_job(job, 64).unwrap();
    b.write(0, &[fill; 64]).unwrap();
    b
}

fn peer_byte(h: &P2pHandles) -> u8 {
    // SAFETY: peer_ptr maps at least one byte of the peer's live buffer.
    unsafe { *(h.peer_ptr as *const u8) }
}

/// Runs one exchange step on both ranks (rank 1 in a thread) and returns their results.
fn step(c: &[HandleCache], r0: &[Request], r1: &[Request]) -> (Result<()>, Result<()>) {
    std::thread::scope(|s| {
        let t = s.spawn(|| c[1].exchange_handles(r1));
        let a = c[0].exchange_handles(r0);
        (a, t.join().unwrap())
    })
}

/// A symmetric rendezvous's channels carry no semaphore: the peer's buffer is mapped, its
/// semaphore slab is not, and a point-to-point exchange after it still gets both.
#[test]
fn a_symmetric_rendezvous_maps_no_semaphore_slab() {
    const T: Duration = Duration::from_secs(10);
    let (_store, c) = caches("ut_symm_slab", 2);
    let (a, b) = (buf("ut_symm_slab", 1), buf("ut_symm_slab", 2));
    let (x, y) = std::thread::scope(|s| {
        let t = s.spawn(|| c[1].symmetric_rendezvous("w", b.addr(), 64, MemKind::Host, None, T));
        let x = c[0].symmetric_rendezvous("w", a.addr(), 64, MemKind::Host, None, T);
        (x, t.join().unwrap())
    });
    let (x, y) = (x.unwrap(), y.unwrap());
    // SAFETY: each peer pointer maps at least one byte of the peer's live buffer.
    assert_eq!(unsafe { *(x[1].ptr as *const u8) }, 2);
    // SAFETY: as above, for the other rank's view.
    assert_eq!(unsafe { *(y[0].ptr as *const u8) }, 1);
    for s in [c[0].stats(), c[1].stats()] {
        assert_eq!(s.opens, 1, "the peer's buffer alone: {s:?}");
    }
    let r0 = [Request::send(1, "x", a.addr(), 64, MemKind::Host)];
    let r1 = [Request::recv(0, "x", b.addr(), 64, MemKind::Host)];
    let (x, y) = step(&c, &r0, &r1);
    x.unwrap();
    y.unwrap();
    let h = c[0].get(&r0[0]).unwrap();
    assert!(h.local_semaphore != 0 && h.peer_semaphore != 0, "{h:?}");
    for s in &close_all(c) {
        assert_eq!(s.opens, s.closes);
    }
}

/// Buffers carved at new offsets from allocations a peer has seen (the caching allocator's
/// pattern) are imported from the board's "where it lies" and the record already held: no store
/// operation at all (the exporter sees on the peer's board that it holds the allocation's
/// record, so it sends none), no new mapping.
#[test]
fn buffers_moving_inside_known_allocations_need_no_store_fetch() {
    let job = "ut_known";
    let (store, c) = caches(job, 2);
    let pools: Vec<[HostBuffer; 2]> = (0..2)
        .map(|rank| {
            let fill = |n: u8| {
                let b = alloc_for_job(job, 4096).unwrap();
                for off in (0..4096).step_by(64) {
                    b.write(off, &[n + (off / 64) as u8; 64]).unwrap();
                }
                b
            };
            [fill(rank * 100), fill(rank * 100 + 70)]
        })
        .collect();
    let reqs = |pool: usize, off: u64| {
        let send = Request::send(1, "x", pools[0][pool].addr() + off, 64, MemKind::Host);
        let recv = Request::recv(0, "x", pools[1][pool].addr() + off, 64, MemKind::Host);
        ([send], [recv])
    };
    let run = |pool: usize, off: u64| {
        let (r0, r1) = reqs(pool, off);
        let (x, y) = step(&c, &r0, &r1);
        x.unwrap();
        y.unwrap();
        let (h0, h1) = (c[0].get(&r0[0]).unwrap(), c[1].get(&r1[0]).unwrap());
        let expect = |rank: u8| rank * 100 + if pool == 1 { 70 } else { 0 } + (off / 64) as u8;
        assert_eq!(peer_byte(&h0), expect(1), "rank 0 sees rank 1's buffer");
        assert_eq!(peer_byte(&h1), expect(0), "rank 1 sees rank 0's buffer");
    };
    run(0, 0);
    let first = c[0].stats();
    assert_eq!((first.records_received, first.records_known), (1, 0));
    // Moved inside allocation 0: known.
    run(0, 128);
    let moved = c[0].stats();
    assert_eq!((moved.records_received, moved.records_known), (1, 1));
    assert_eq!(
        moved.store_round_trips, first.store_round_trips,
        "no record sent, none fetched"
    );
    assert_eq!(moved.records_sent, first.records_sent);
    // Into allocation 1, never seen: fetched; back to allocation 0: known again.
    run(1, 64);
    run(0, 192);
    let end = c[0].stats();
    assert_eq!((end.records_received, end.records_known), (2, 2));
    let t = c[0].transport(MemKind::Host).unwrap().clone();
    assert_eq!(t.live_mappings(), 2, "one mapping per peer allocation");
    for s in &close_all(c) {
        assert_eq!(s.opens, s.closes);
        assert_eq!(s.keys_deleted, 2, "the records written, once read, deleted");
    }
    drop(t);
    assert_eq!(store.num_keys().unwrap(), 0);
}

#[test]
fn miss_then_hit_with_no_store_traffic() {
    let (store, c) = caches("ut_hit", 2);
    let (a, b) = (buf("ut_hit", 1), buf("ut_hit", 2));
    let r0 = [Request::send(1, "x", a.addr(), 64, MemKind::Host)];
    let r1 = [Request::recv(0, "x", b.addr(), 64, MemKind::Host)];
    let (x, y) = step(&c, &r0, &r1);
    x.unwrap();
    y.unwrap();
    let s0 = c[0].stats();
    assert_eq!(s0.misses, 1);
    assert_eq!(s0.store_round_trips, 2);
    assert_eq!(s0.records_sent, 1);
    assert_eq!(s0.opens, 2, "one buffer mapping and one peer slab");
    let h0 = c[0].get(&r0[0]).unwrap();
    let h1 = c[1].get(&r1[0]).unwrap();
    assert_eq!(peer_byte(&h0), 2);
    assert_eq!(peer_byte(&h1), 1);
    for _ in 0..5 {
        let (x, y) = step(&c, &r0, &r1);
        x.unwrap();
        y.unwrap();
    }
    let s0b = c[0].stats();
    assert_eq!(s0b.hits, 5);
    assert_eq!(
        s0b.store_round_trips, s0.store_round_trips,
        "hits touch no store"
    );
    assert_eq!(s0b.opens, s0.opens);
    let t = c[0].transport(MemKind::Host).unwrap().clone();
    for s in &close_all(c) {
        assert_eq!(s.opens, s.closes);
        assert_eq!(s.keys_deleted, 1, "the importer deleted the record it read");
    }
    assert_eq!(t.live_mappings(), 0);
    // The last transport gone, its fd transport withdraws its record: the store is empty.
    drop(t);
    assert_eq!(store.num_keys().unwrap(), 0);
}

#[test]
fn asymmetric_change_updates_only_one_side() {
    let (_store, c) = caches("ut_asym", 2);
    // Replaced mappings are released at once (none kept for reuse), as checked at the end.
    c[1].set_retained_per_peer(0);
    let bufs: Vec<HostBuffer> = (0..3).map(|i| buf("ut_asym", 10 + i)).collect();
    let mine = buf("ut_asym", 99);
    for i in 0..6usize {
        let a = &bufs[i / 2 % 3]; // rank 0 changes its buffer every other step
        let r0 = [Request::send(1, "x", a.addr(), 64, MemKind::Host)];
        let r1 = [Request::recv(0, "x", mine.addr(), 64, MemKind::Host)];
        let before = (c[0].stats(), c[1].stats());
        let (x, y) = step(&c, &r0, &r1);
        x.unwrap();
        y.unwrap();
        let after = (c[0].stats(), c[1].stats());
        assert_eq!(
            peer_byte(&c[1].get(&r1[0]).unwrap()),
            10 + (i / 2 % 3) as u8
        );
        assert_eq!(peer_byte(&c[0].get(&r0[0]).unwrap()), 99);
        let changed = i % 2 == 0;
        let rt0 = after.0.store_round_trips - before.0.store_round_trips;
        let rt1 = after.1.store_round_trips - before.1.store_round_trips;
        let expected = match (i, changed) {
            (0, _) => (2, 2),    // both sides are new
            (_, true) => (1, 1), // rank 0 publishes, rank 1 fetches
            (_, false) => (0, 0),
        };
        assert_eq!((rt0, rt1), expected, "step {i}");
        if i > 0 {
            assert_eq!(after.0.records_received, before.0.records_received);
        }
    }
    let t = c[1].transport(MemKind::Host).unwrap().clone();
    assert_eq!(t.live_mappings(), 1, "replaced mappings were released");
    close_all(c);
    assert_eq!(t.live_mappings(), 0);
}

#[test]
fn buffers_carved_from_mapped_segments_cost_no_open() {
    // Rank 0's buffer moves every step to a new offset in one of two segments (a caching
    // allocator's pattern); rank 1 keeps both segments mapped once it has seen them.
    let (_store, c) = caches("ut_pool", 2);
    let segments: Vec<HostBuffer> = (0..2)
        .map(|_| alloc_for_job("ut_pool", 4096).unwrap())
        .collect();
    let mine = buf("ut_pool", 99);
    let t = c[1].transport(MemKind::Host).unwrap().clone();
    for i in 0..12usize {
        let seg = &segments[i % 2];
        let offset = 64 * (i as u64 % 7);
        seg.write(offset, &[i as u8; 64]).unwrap();
        let r0 = [Request::send(
            1,
            "x",
            seg.addr() + offset,
            64,
            MemKind::Host,
        )];
        let r1 = [Request::recv(0, "x", mine.addr(), 64, MemKind::Host)];
        let (x, y) = step(&c, &r0, &r1);
        x.unwrap();
        y.unwrap();
        assert_eq!(peer_byte(&c[1].get(&r1[0]).unwrap()), i as u8, "step {i}");
        let mapped = t.live_mappings();
        assert_eq!(
            mapped,
            (i + 1).min(2),
            "step {i}: both segments stay mapped"
        );
    }
    let s1 = c[1].stats();
    assert_eq!(s1.misses, 12, "every step moved the buffer");
    c[1].set_retained_per_peer(0);
    let seg = &segments[0];
    let r0 = [Request::send(1, "x", seg.addr() + 512, 64, MemKind::Host)];
    let r1 = [Request::recv(0, "x", mine.addr(), 64, MemKind::Host)];
    let (x, y) = step(&c, &r0, &r1);
    x.unwrap();
    y.unwrap();
    assert_eq!(
        t.live_mappings(),
        2,
        "a kept mapping is reused, the replaced one released"
    );
    for s in &close_all(c) {
        assert_eq!(s.opens, s.closes);
    }
    assert_eq!(
        t.live_mappings(),
        0,
        "kept mappings are released with the cache"
    );
}

#[test]
fn missing_peer_times_out_with_context_and_the_step_resumes() {
    let (_store, c) = caches("ut_to", 2);
    let a = buf("ut_to", 1);
    let r0 = [Request::send(1, "lonely", a.addr(), 64, MemKind::Host)];
    let start = Instant::now();
    let err = c[0]
        .exchange_handles_timeout(&r0, Duration::from_millis(100))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(err.status, Status::Timeout, "{err}");
    for needle in ["rank 0", "peer rank 1", "\"lonely\"", "step 1", "-b1"] {
        assert!(err.message.contains(needle), "{needle}: {err}");
    }
    // Still not there: the same step is checked again (not step 2), nothing is poisoned.
    let again = c[0]
        .exchange_handles_timeout(&r0, Duration::ZERO)
        .unwrap_err();
    assert_eq!(again.status, Status::Timeout, "{again}");
    assert!(again.message.contains("step 1"), "{again}");
    // A suspended step resumes with its buffer only.
    let other = buf("ut_to", 2);
    let moved = [Request::send(1, "lonely", other.addr(), 64, MemKind::Host)];
    let err = c[0]
        .exchange_handles_timeout(&moved, Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    // The peer arrives: the resumed step completes on both sides.
    let inbox = buf("ut_to", 0);
    let r1 = [Request::recv(0, "lonely", inbox.addr(), 64, MemKind::Host)];
    std::thread::scope(|s| {
        s.spawn(|| c[1].exchange_handles(&r1).unwrap());
        c[0].exchange_handles(&r0).unwrap();
    });
    assert_eq!(c[1].get(&r1[0]).unwrap().peer_bytes, 64);
    drop(other);
    for s in close_all(c) {
        assert_eq!(s.opens, s.closes);
    }
}

#[test]
fn lost_record_times_out_naming_the_key_on_both_sides() {
    let store = Arc::new(MemStore::default());
    let job = format!("ut_lost{}", std::process::id());
    let make = |rank: usize, store: Arc<dyn Store>| {
        default_transports::cache(CacheConfig {
            rank,
            world_size: 2,
            store,
            job_id: job.clone(),
            scope: String::new(),
            timeout: Duration::from_millis(300),
        })
        .unwrap()
    };
    let c = [
        make(0, store.clone()),
        make(1, Arc::new(Watched::losing_records(store.clone()))),
    ];
    let (a, b) = (buf("ut_lost", 1), buf("ut_lost", 2));
    let r0 = [Request::recv(1, "lost", a.addr(), 64, MemKind::Host)];
    let r1 = [Request::send(0, "lost", b.addr(), 64, MemKind::Host)];
    let (e0, e1) = step(&c, &r0, &r1);
    let (e0, e1) = (e0.unwrap_err(), e1.unwrap_err());
    assert_eq!(e0.status, Status::Timeout, "{e0}");
    for needle in [
        "rank 0",
        "peer rank 1",
        "step 1",
        "version 1",
        "/h/1/0/1/1/lost#0",
    ] {
        assert!(e0.message.contains(needle), "{needle}: {e0}");
    }
    assert_eq!(e1.status, Status::Timeout, "{e1}");
    for needle in ["rank 1", "peer rank 0 to open version 1", "\"lost\"", "-b0"] {
        assert!(e1.message.contains(needle), "{needle}: {e1}");
    }
    for s in close_all(c) {
        assert_eq!(s.opens, s.closes);
    }
}

#[test]
fn bad_arguments_are_reported() {
    let (_store, c) = caches("ut_bad", 2);
    let a = buf("ut_bad", 1);
    let stack = [0u8; 8];
    let cases = [
        (
            Request::send(5, "t", a.addr(), 8, MemKind::Host),
            "not a rank",
        ),
        (
            Request::send(0, "t", a.addr(), 8, MemKind::Host),
            "this rank",
        ),
        (Request::send(1, "t", 0, 8, MemKind::Host), "NULL"),
        (Request::send(1, "t", a.addr(), 0, MemKind::Host), "0"),
        (
            Request::send(1, "t", stack.as_ptr() as u64, 8, MemKind::Host),
            "not a shared-memory buffer",
        ),
        (
            Request::send(1, "t", a.addr(), 8, MemKind::Device),
            "device buffer",
        ),
    ];
    for (req, needle) in cases {
        let err = c[0]
            .exchange_handles(std::slice::from_ref(&req))
            .unwrap_err();
        assert!(
            matches!(
                err.status,
                Status::InvalidArgument | Status::Unsupported | Status::CudaUnavailable
            ),
            "{req}: {err}"
        );
        assert!(err.message.contains(needle), "{needle}: {err}");
    }
    let err = c[0]
        .get(&Request::send(1, "t", a.addr(), 8, MemKind::Host))
        .unwrap_err();
    assert_eq!(err.status, Status::NotFound);
    assert_eq!(c[0].stats().exchanges, 0);
}

/// A connected pair: rank 0 sends "x" to rank 1, both exchanged once.
fn exchanged_pair(job: &str) -> (Vec<HandleCache>, [HostBuffer; 2], [Request; 2]) {
    let (_store, c) = caches(job, 2);
    let bufs = [buf(job, 1), buf(job, 2)];
    let reqs = [
        Request::send(1, "x", bufs[0].addr(), 64, MemKind::Host),
        Request::recv(0, "x", bufs[1].addr(), 64, MemKind::Host),
    ];
    let (x, y) = step(&c, &reqs[..1], &reqs[1..]);
    x.unwrap();
    y.unwrap();
    (c, bufs, reqs)
}

#[test]
fn close_waits_until_the_peer_has_closed() {
    let (c, _bufs, _reqs) = exchanged_pair("ut_wait");
    let mut c = c.into_iter();
    let (c0, c1) = (c.next().unwrap(), c.next().unwrap());
    let peer_closing = AtomicBool::new(false);
    let start = Instant::now();
    let (s0, returned) = std::thread::scope(|s| {
        let closing = s.spawn(|| {
            let stats = c0.try_close();
            let returned = start.elapsed();
            // Rank 1 only starts closing after the sleep below.
            assert!(
                peer_closing.load(Ordering::SeqCst),
                "returned before the peer closed"
            );
            (stats, returned)
        });
        std::thread::sleep(Duration::from_millis(200));
        peer_closing.store(true, Ordering::SeqCst);
        let s1 = c1.try_close().unwrap();
        assert_eq!(s1.opens, s1.closes);
        closing.join().unwrap()
    });
    let s0 = s0.unwrap();
    assert!(returned >= Duration::from_millis(200), "{returned:?}");
    assert!(returned < Duration::from_secs(5), "{returned:?}");
    assert_eq!(
        (s0.opens, s0.peers_unclosed, s0.leaked_slabs),
        (s0.closes, 0, 0)
    );
}

#[test]
fn peers_closing_together_do_not_wait_for_each_other() {
    let (c, _bufs, _reqs) = exchanged_pair("ut_together");
    let start = Instant::now();
    for s in close_all(c) {
        assert_eq!(s.opens, s.closes);
        assert_eq!(s.peers_unclosed, 0);
    }
    // Each releases its imports before it waits, so neither waits for its linger (10 s).
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn exchange_with_a_closed_peer_fails_at_once() {
    let (c, bufs, reqs) = exchanged_pair("ut_closedpeer");
    let mut c = c.into_iter();
    let (c0, c1) = (c.next().unwrap(), c.next().unwrap());
    std::thread::scope(|s| {
        let closing = s.spawn(|| c1.try_close());
        // Wait (bounded) until rank 1 is closed and waiting for rank 0.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !c0.cx.peer_let_go(1) {
            assert!(
                Instant::now() < deadline,
                "rank 1 never marked itself closed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let start = Instant::now();
        let err = c0.exchange_handles(&reqs[..1]).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3), "{err}");
        assert_eq!(err.status, Status::InvalidState, "{err}");
        for needle in ["peer rank 1", "closed its cache", "step 2"] {
            assert!(err.message.contains(needle), "{needle}: {err}");
        }
        let s0 = c0.try_close().unwrap();
        assert_eq!(s0.opens, s0.closes);
        let s1 = closing.join().unwrap().unwrap();
        assert_eq!(s1.opens, s1.closes);
    });
    drop(bufs);
}

/// Host shared memory presented as device memory, so the teardown's device-only path (keeping
/// the slab alive) runs without a GPU. Counts its drops.
struct DeviceLike {
    inner: Arc<HostTransport>,
    drops: Arc<AtomicUsize>,
}

impl Transport for DeviceLike {
    fn kind(&self) -> MemKind {
        MemKind::Device
    }
    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        self.inner.resolve(ptr, bytes)
    }
    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle> {
        // Device records must carry a CUDA handle type; the payload stays the shm name.
        let handle = self.inner.export(buf)?;
        Ok(ExportedHandle {
            handle_type: HandleType::CudaLegacyIpc,
            ..handle
        })
    }
    fn import(&self, rec: &Record, wait: Duration) -> Result<PeerMapping> {
        let mut host = rec.clone();
        host.handle_type = HandleType::PosixFd;
        self.inner.import(&host, wait)
    }
    fn seal_record(&self, key: &str, record: &[u8]) -> Result<(Vec<u8>, RecordSeal)> {
        self.inner.seal_record(key, record)
    }
    fn open_record(
        &self,
        peer: usize,
        key: &str,
        notice: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        self.inner.open_record(peer, key, notice, wait)
    }
    fn semaphores(&self) -> &SemaphoreSlab {
        self.inner.semaphores()
    }
    fn live_mappings(&self) -> usize {
        self.inner.live_mappings()
    }
}

impl Drop for DeviceLike {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn close_gives_up_after_the_linger_naming_the_peer_and_keeps_device_memory() {
    let job = format!("ut_linger{}", std::process::id());
    let store = Arc::new(MemStore::default());
    let mut inner = Vec::new();
    let mut drops = Vec::new();
    let c: Vec<HandleCache> = (0..3)
        .map(|rank| {
            let host = HostTransport::new(store.clone(), &job, rank).unwrap();
            let dropped = Arc::new(AtomicUsize::new(0));
            let device: Arc<dyn Transport> = Arc::new(DeviceLike {
                inner: host.clone(),
                drops: dropped.clone(),
            });
            inner.push(host);
            drops.push(dropped);
            let cfg = CacheConfig {
                rank,
                world_size: 3,
                store: store.clone(),
                job_id: job.clone(),
                scope: String::new(),
                timeout: Duration::from_secs(10),
            };
            HandleCache::with_transports(cfg, vec![device]).unwrap()
        })
        .collect();
    // Ranks 0 and 2 each send to rank 1.
    let bufs: Vec<HostBuffer> = (0..4).map(|i| buf("ut_linger", i)).collect();
    let to1 = |b: &HostBuffer| Request::send(1, "d", b.addr(), 64, MemKind::Device);
    let r1 = [
        Request::recv(0, "d", bufs[1].addr(), 64, MemKind::Device),
        Request::recv(2, "d", bufs[3].addr(), 64, MemKind::Device),
    ];
    std::thread::scope(|s| {
        let a = s.spawn(|| c[0].exchange_handles(&[to1(&bufs[0])]));
        let b = s.spawn(|| c[2].exchange_handles(&[to1(&bufs[2])]));
        c[1].exchange_handles(&r1).unwrap();
        a.join().unwrap().unwrap();
        b.join().unwrap().unwrap();
    });
    let slab_names: Vec<String> = inner
        .iter()
        .map(|t| from_fixed(&t.semaphores().export().unwrap().payload))
        .collect();
    let mut c = c.into_iter();
    let (c0, c1, c2) = (c.next().unwrap(), c.next().unwrap(), c.next().unwrap());
    let linger = Duration::from_millis(200);
    c0.set_linger(linger);
    c2.set_linger(linger);
    assert_eq!(c1.linger(), Duration::from_secs(10), "min(timeout, 30 s)");
    // Rank 1 keeps its mappings open: rank 0 (try_close) and rank 2 (close) give up.
    let start = Instant::now();
    let (e0, s2) = std::thread::scope(|s| {
        let t = s.spawn(|| c2.close());
        (c0.try_close().unwrap_err(), t.join().unwrap())
    });
    let took = start.elapsed();
    assert!(took >= linger && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(e0.status, Status::Timeout, "{e0}");
    let rank1 = format!("rank 1 (pid {})", std::process::id());
    for needle in ["rank 0:", &rank1, "200ms", "left allocated", "set_linger"] {
        assert!(e0.message.contains(needle), "{needle}: {e0}");
    }
    assert_eq!((s2.peers_unclosed, s2.leaked_slabs), (1, 1), "{s2:?}");
    assert_eq!(s2.opens, s2.closes, "imports are released before waiting");
    for r in [0, 2] {
        assert_eq!(
            drops[r].load(Ordering::SeqCst),
            0,
            "rank {r}'s slab was freed"
        );
        assert_eq!(inner[r].live_mappings(), 0);
        assert_eq!(inner[r].live_peer_slabs(), 0);
    }
    // Rank 1 closes last: its peers are closed, so it neither waits nor leaks.
    let start = Instant::now();
    let s1 = c1.try_close().unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!((s1.peers_unclosed, s1.leaked_slabs), (0, 0));
    assert_eq!(s1.opens, s1.closes);
    assert_eq!(drops[1].load(Ordering::SeqCst), 1);
    // The leaked slabs of ranks 0 and 2 stay mapped in this process; only their names go.
    for r in [0, 2] {
        crate::os::shm::unlink_name(&slab_names[r]);
    }
}

/// Host memory whose releases report a backlog on demand, as the device transport does while its
/// releaser thread waits for device work queued before a release.
struct Backlogged {
    inner: Arc<HostTransport>,
    backlog: Arc<AtomicBool>,
}

impl Transport for Backlogged {
    fn kind(&self) -> MemKind {
        MemKind::Host
    }
    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        self.inner.resolve(ptr, bytes)
    }
    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle> {
        self.inner.export(buf)
    }
    fn import(&self, rec: &Record, wait: Duration) -> Result<PeerMapping> {
        self.inner.import(rec, wait)
    }
    fn seal_record(&self, key: &str, record: &[u8]) -> Result<(Vec<u8>, RecordSeal)> {
        self.inner.seal_record(key, record)
    }
    fn open_record(
        &self,
        peer: usize,
        key: &str,
        notice: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        self.inner.open_record(peer, key, notice, wait)
    }
    fn wait_release_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        if self.backlog.load(Ordering::SeqCst) {
            return Err(Error::timeout(format!(
                "mappings of peer rank {peer} still wait to be closed after {timeout:?}"
            )));
        }
        Ok(())
    }
    fn flush_releases(&self, timeout: Duration) -> Result<()> {
        if self.backlog.load(Ordering::SeqCst) {
            return Err(Error::timeout(format!(
                "released mappings still wait to be closed after {timeout:?}"
            )));
        }
        Ok(())
    }
    fn semaphores(&self) -> &SemaphoreSlab {
        self.inner.semaphores()
    }
    fn live_mappings(&self) -> usize {
        self.inner.live_mappings()
    }
}

fn backlogged_caches(job: &str, backlog: &Arc<AtomicBool>) -> Vec<HandleCache> {
    let store = Arc::new(MemStore::default());
    (0..2)
        .map(|rank| {
            let t: Arc<dyn Transport> = Arc::new(Backlogged {
                inner: HostTransport::new(
                    store.clone(),
                    &format!("{job}{}", std::process::id()),
                    rank,
                )
                .unwrap(),
                backlog: backlog.clone(),
            });
            let cfg = CacheConfig {
                rank,
                world_size: 2,
                store: store.clone(),
                job_id: job.to_string(),
                scope: String::new(),
                timeout: Duration::from_secs(10),
            };
            let c = HandleCache::with_transports(cfg, vec![t]).unwrap();
            c.set_retained_per_peer(0);
            c
        })
        .collect()
}

#[test]
fn a_release_backlog_fails_the_call_but_keeps_its_handles() {
    let job = format!("ut_backlog{}", std::process::id());
    let backlog = Arc::new(AtomicBool::new(false));
    let c = backlogged_caches(&job, &backlog);
    let (a0, a1, mine) = (buf(&job, 1), buf(&job, 2), buf(&job, 9));
    let r1 = [Request::recv(0, "x", mine.addr(), 64, MemKind::Host)];
    let send = |b: &HostBuffer| [Request::send(1, "x", b.addr(), 64, MemKind::Host)];
    let (x, y) = step(&c, &send(&a0), &r1);
    x.unwrap();
    y.unwrap();
    // Rank 0 moves to a new buffer: rank 1 releases its mapping of the old one, and its
    // releases are backlogged.
    backlog.store(true, Ordering::SeqCst);
    let (x, y) = step(&c, &send(&a1), &r1);
    x.unwrap();
    let err = y.unwrap_err();
    assert_eq!(err.status, Status::Timeout, "{err}");
    for needle in ["peer rank 0", "its handles are current", "rank 1:"] {
        assert!(err.message.contains(needle), "{needle}: {err}");
    }
    // The new handles are installed and the channel is not poisoned.
    assert_eq!(peer_byte(&c[1].get(&r1[0]).unwrap()), 2);
    backlog.store(false, Ordering::SeqCst);
    let (x, y) = step(&c, &send(&a1), &r1);
    x.unwrap();
    y.unwrap();
    assert_eq!(peer_byte(&c[1].get(&r1[0]).unwrap()), 2);
    for s in &close_all(c) {
        assert_eq!(s.opens, s.closes);
    }
}

#[test]
fn a_cache_whose_releases_do_not_finish_does_not_say_it_closed() {
    let job = format!("ut_backlog_close{}", std::process::id());
    let backlog = Arc::new(AtomicBool::new(false));
    let c = backlogged_caches(&job, &backlog);
    let (a0, mine) = (buf(&job, 1), buf(&job, 9));
    let r0 = [Request::send(1, "x", a0.addr(), 64, MemKind::Host)];
    let r1 = [Request::recv(0, "x", mine.addr(), 64, MemKind::Host)];
    let (x, y) = step(&c, &r0, &r1);
    x.unwrap();
    y.unwrap();
    for cache in &c {
        cache.set_linger(Duration::from_millis(100));
    }
    backlog.store(true, Ordering::SeqCst);
    let mut c = c.into_iter();
    let (c0, c1) = (c.next().unwrap(), c.next().unwrap());
    let closing = std::thread::spawn(move || c1.try_close());
    let e0 = c0.try_close().unwrap_err();
    let e1 = closing.join().unwrap().unwrap_err();
    // Neither rank could flush, so neither said it closed: each reports the other.
    for (e, peer) in [(&e0, 1), (&e1, 0)] {
        assert_eq!(e.status, Status::Timeout, "{e}");
        assert!(e.message.contains("had not closed their caches"), "{e}");
        assert!(e.message.contains(&format!("rank {peer} (pid")), "{e}");
    }
}

/// Host memory presented as a VMM device buffer of two physical allocations: its records list
/// segments (as `cuda::vmm` writes them), and its imports check that every record reaching them,
/// fetched from the store or built from a known allocation, carries them intact.
struct SegmentedLike {
    inner: Arc<HostTransport>,
    checked: AtomicUsize,
}

impl SegmentedLike {
    fn segments(buf_id: u64, alloc_bytes: u64, fd_payload: [u8; 64]) -> Vec<Segment> {
        let first = alloc_bytes / 2;
        vec![
            Segment {
                bytes: first,
                id: buf_id * 2,
                handle: fd_payload,
            },
            Segment {
                bytes: alloc_bytes - first,
                id: buf_id * 2 + 1,
                handle: fd_payload,
            },
        ]
    }
}

impl Transport for SegmentedLike {
    fn kind(&self) -> MemKind {
        MemKind::Device
    }
    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        self.inner.resolve(ptr, bytes)
    }
    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle> {
        let host = self.inner.export(buf)?;
        Ok(ExportedHandle {
            handle_type: HandleType::CudaVmmFd,
            payload: [0; 64],
            segments: Self::segments(buf.buffer_id, buf.alloc_bytes, host.payload),
        })
    }
    fn import(&self, rec: &Record, wait: Duration) -> Result<PeerMapping> {
        assert_eq!(rec.handle_type, HandleType::CudaVmmFd);
        let handle = rec.segments.first().expect("segments travel").handle;
        assert_eq!(
            rec.segments,
            Self::segments(rec.buffer_id, rec.alloc_bytes, handle),
            "the record's segments arrive as exported"
        );
        self.checked.fetch_add(1, Ordering::SeqCst);
        let mut host = rec.clone();
        host.handle_type = HandleType::PosixFd;
        host.payload = handle;
        host.segments.clear();
        self.inner.import(&host, wait)
    }
    fn seal_record(&self, key: &str, record: &[u8]) -> Result<(Vec<u8>, RecordSeal)> {
        self.inner.seal_record(key, record)
    }
    fn open_record(
        &self,
        peer: usize,
        key: &str,
        notice: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        self.inner.open_record(peer, key, notice, wait)
    }
    fn semaphores(&self) -> &SemaphoreSlab {
        self.inner.semaphores()
    }
    fn live_mappings(&self) -> usize {
        self.inner.live_mappings()
    }
}

#[test]
fn segment_lists_survive_the_store_and_known_allocations() {
    let job = format!("ut_segments{}", std::process::id());
    let store = Arc::new(MemStore::default());
    let mut devices = Vec::new();
    let c: Vec<HandleCache> = (0..2)
        .map(|rank| {
            let host = HostTransport::new(store.clone(), &job, rank).unwrap();
            let device = Arc::new(SegmentedLike {
                inner: host,
                checked: AtomicUsize::new(0),
            });
            devices.push(device.clone());
            let cfg = CacheConfig {
                rank,
                world_size: 2,
                store: store.clone(),
                job_id: job.clone(),
                scope: String::new(),
                timeout: Duration::from_secs(10),
            };
            HandleCache::with_transports(cfg, vec![device as Arc<dyn Transport>]).unwrap()
        })
        .collect();
    let pools: Vec<HostBuffer> = (0..2u8)
        .map(|rank| {
            let b = alloc_for_job(&job, 4096).unwrap();
            for off in (0..4096).step_by(64) {
                b.write(off, &[rank * 100 + (off / 64) as u8; 64]).unwrap();
            }
            b
        })
        .collect();
    for off in [0u64, 256, 1024] {
        let r0 = [Request::send(
            1,
            "seg",
            pools[0].addr() + off,
            64,
            MemKind::Device,
        )];
        let r1 = [Request::recv(
            0,
            "seg",
            pools[1].addr() + off,
            64,
            MemKind::Device,
        )];
        let (x, y) = step(&c, &r0, &r1);
        x.unwrap();
        y.unwrap();
        assert_eq!(
            peer_byte(&c[0].get(&r0[0]).unwrap()),
            100 + (off / 64) as u8
        );
        assert_eq!(peer_byte(&c[1].get(&r1[0]).unwrap()), (off / 64) as u8);
    }
    let s = c[0].stats();
    assert_eq!(
        (s.records_received, s.records_known),
        (1, 2),
        "the moves were built from the known allocation's record, segments included"
    );
    assert!(devices
        .iter()
        .all(|d| d.checked.load(Ordering::SeqCst) >= 3));
    for s in &close_all(c) {
        assert_eq!(s.opens, s.closes);
    }
    drop(pools);
}

/// An opened channel stays current through exchanges that change nothing, goes stale on both
/// sides when one side replaces its buffer (the sender's own handles and the receiver's mapping
/// of it), and for good when the cache is closed.
#[test]
fn opened_channels_go_stale_exactly_when_their_buffers_change() {
    let (c, _bufs, reqs) = exchanged_pair("ut_open");
    let send = c[0].open_channel(&reqs[0]).unwrap();
    let recv = c[1].open_channel(&reqs[1]).unwrap();
    assert_eq!(peer_byte(recv.handles().unwrap()), 1);
    assert!(send.is_send() && !recv.is_send());
    let (x, y) = step(&c, &reqs[..1], &reqs[1..]);
    x.unwrap();
    y.unwrap();
    assert!(
        send.handles().is_ok() && recv.handles().is_ok(),
        "a hit changes nothing"
    );
    let other = buf("ut_open", 7);
    let moved = Request::send(1, "x", other.addr(), 64, MemKind::Host);
    let (x, y) = step(&c, std::slice::from_ref(&moved), &reqs[1..]);
    x.unwrap();
    y.unwrap();
    for stale in [&send, &recv] {
        let err = stale.handles().unwrap_err();
        assert_eq!(err.status, Status::InvalidState, "{err}");
        assert!(err.message.contains("re-open the channel"), "{err}");
    }
    assert!(
        c[0].open_channel(&reqs[0]).is_err(),
        "the old buffer is gone"
    );
    let reopened = c[1].open_channel(&reqs[1]).unwrap();
    assert_eq!(peer_byte(reopened.handles().unwrap()), 7);
    let sender = c[0].open_channel(&moved).unwrap();
    close_all(c);
    for closed in [&reopened, &sender] {
        let err = closed.handles().unwrap_err();
        assert!(err.message.contains("was freed"), "{err}");
    }
}

/// A store that keeps a copy of every value written to it.
/// Nothing that names memory reaches the store (which anyone who reaches its port can read):
/// records travel sealed from the exporter's process, the store holds notices of them only.
#[test]
fn no_record_and_no_memory_handle_reaches_the_store() {
    let recording = Arc::new(Watched::new(Arc::new(MemStore::default()), |_| true));
    let job = format!("ut_private{}", std::process::id());
    let c: Vec<HandleCache> = (0..2)
        .map(|rank| {
            default_transports::cache(CacheConfig {
                rank,
                world_size: 2,
                store: recording.clone(),
                job_id: job.clone(),
                scope: String::new(),
                timeout: Duration::from_secs(10),
            })
            .unwrap()
        })
        .collect();
    let (a, b) = (buf(&job, 1), buf(&job, 2));
    let r0 = [Request::send(1, "x", a.addr(), 64, MemKind::Host)];
    let r1 = [Request::recv(0, "x", b.addr(), 64, MemKind::Host)];
    let (x, y) = step(&c, &r0, &r1);
    x.unwrap();
    y.unwrap();
    assert_eq!(peer_byte(&c[1].get(&r1[0]).unwrap()), 1);
    let t = c[0].transport(MemKind::Host).unwrap().clone();
    let buffer_handle = t.export(&t.resolve(a.addr(), 64).unwrap()).unwrap().payload;
    let fd_id = &buffer_handle[..crate::fdpass::registry::FD_ID_LEN];
    let written = crate::sync::lock(&recording.writes).clone();
    let records: Vec<_> = written.iter().filter(|(k, _)| k.contains("/h/")).collect();
    assert_eq!(records.len(), 2, "one record each way: {written:?}");
    for (key, value) in &written {
        assert!(
            !value.starts_with(b"NVFI"),
            "a record in the store under {key}"
        );
        assert!(
            !value.windows(fd_id.len()).any(|w| w == fd_id),
            "the buffer's handle in the store under {key}"
        );
    }
    for (key, value) in records {
        crate::fdpass::sealed::Notice::decode(value, key).unwrap();
    }
    drop(t);
    close_all(c);
}
