//! Unit tests of contexts: rank claims, job ids, hosting and closing over in-memory stores.

use super::*;
use crate::store::memory::MemoryStore;
use std::net::UdpSocket;
use std::sync::atomic::AtomicUsize;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn context_is_send_and_sync() {
    assert_send_sync::<Context>();
}

fn options(rank: usize, world: usize, store: &Arc<MemoryStore>) -> ContextOptions {
    ContextOptions {
        rank,
        world_size: world,
        local_rank: rank,
        local_world_size: world,
        store: Arc::clone(store) as Arc<dyn Store>,
    }
}

#[test]
fn ranks_agree_on_one_job_id_and_barrier() {
    let store = Arc::new(MemoryStore::new());
    let handles: Vec<_> = (0..4)
        .map(|rank| {
            let opts = options(rank, 4, &store);
            std::thread::spawn(move || {
                let ctx = Context::new(opts).unwrap();
                assert_eq!(ctx.barrier(None, None).unwrap(), 0);
                assert_eq!(ctx.barrier(Some(&[1, 2]), None).ok(), {
                    if [1, 2].contains(&rank) {
                        Some(0)
                    } else {
                        None
                    }
                });
                ctx.job_id.clone()
            })
        })
        .collect();
    let ids: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(ids[0].len(), 16);
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    let keys = store.keys();
    assert!(keys
        .iter()
        .any(|k| k.starts_with(&format!("nvfipc/barrier/{}/w4/", ids[0]))));
    // Every context closed, so the last one freed the job id for the next run.
    for rank in 0..4 {
        assert!(keys.contains(&format!("nvfipc/context/default/w4/0/rank/{rank}")));
        assert!(keys.contains(&format!("nvfipc/context/default/w4/0/closed/{rank}")));
    }
    assert!(!keys.iter().any(|k| k.ends_with("/job_id")), "{keys:?}");
    assert!(keys.contains(&format!("nvfipc/context/{}/all_closed", ids[0])));
}

#[test]
fn next_run_on_the_same_store_gets_a_new_job_id() {
    let store = Arc::new(MemoryStore::new());
    let first = Context::new(options(0, 1, &store)).unwrap();
    let first_id = first.job_id.clone();
    first.close().unwrap();
    let second = Context::new(options(0, 1, &store)).unwrap();
    assert_ne!(second.job_id, first_id);
}

#[test]
fn invalid_ranks_are_rejected() {
    let store = Arc::new(MemoryStore::new());
    let err = Context::new(options(4, 4, &store)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    let err = Context::new(ContextOptions {
        local_rank: 2,
        local_world_size: 2,
        ..options(0, 4, &store)
    })
    .unwrap_err();
    assert!(err.message.contains("local rank 2"), "{err}");
}

#[test]
fn foreign_job_id_value_is_a_protocol_error() {
    let store = Arc::new(MemoryStore::new());
    store
        .set("nvfipc/context/default/w2/0/job_id", b"not an id!")
        .unwrap();
    let err = Context::new(options(0, 2, &store)).unwrap_err();
    assert_eq!(err.status, Status::Protocol);
}

/// A memory store with one behaviour changed, as another kind of store has it.
struct Altered {
    inner: Arc<MemoryStore>,
    change: Change,
}

enum Change {
    /// No COMPARE_SET, like a host-callback store whose vtable lacks it.
    NoCompareSet,
    /// A short default timeout, so a wrong wait fails the test quickly.
    ShortTimeout,
    /// Rank 0's view of a host store whose server runs in its process: so many connections of
    /// other processes are open to it.
    ServedHere(Arc<AtomicUsize>),
}

impl Altered {
    fn over(inner: &Arc<MemoryStore>, change: Change) -> Arc<dyn Store> {
        Arc::new(Altered {
            inner: Arc::clone(inner),
            change,
        })
    }
}

impl Store for Altered {
    fn set(&self, k: &str, v: &[u8]) -> Result<()> {
        self.inner.set(k, v)
    }
    fn get(&self, k: &str, t: Duration) -> Result<Vec<u8>> {
        self.inner.get(k, t)
    }
    fn add(&self, k: &str, d: i64) -> Result<i64> {
        self.inner.add(k, d)
    }
    fn check(&self, k: &[&str]) -> Result<bool> {
        self.inner.check(k)
    }
    fn wait(&self, k: &[&str], t: Duration) -> Result<()> {
        self.inner.wait(k, t)
    }
    fn delete_key(&self, k: &str) -> Result<bool> {
        self.inner.delete_key(k)
    }
    fn num_keys(&self) -> Result<i64> {
        self.inner.num_keys()
    }
    fn compare_set(&self, k: &str, e: &[u8], d: &[u8]) -> Result<Vec<u8>> {
        match self.change {
            Change::NoCompareSet => Err(Error::unsupported("no compare_set")),
            _ => self.inner.compare_set(k, e, d),
        }
    }
    fn append(&self, k: &str, v: &[u8]) -> Result<()> {
        self.inner.append(k, v)
    }
    fn default_timeout(&self) -> Duration {
        match self.change {
            Change::ShortTimeout => Duration::from_secs(2),
            _ => self.inner.default_timeout(),
        }
    }
    fn liveness(&self) -> Liveness {
        match &self.change {
            Change::ServedHere(others) => Liveness::ServedHere {
                other_clients: others.load(Ordering::SeqCst),
            },
            // As a store that cannot tell (a host's, through callbacks).
            _ => Liveness::Unknown,
        }
    }
}

#[test]
fn stores_without_compare_set_take_rank_0s_id() {
    let store = Altered::over(&Arc::new(MemoryStore::new()), Change::NoCompareSet);
    for _run in 0..2 {
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let ctx = Context::new(ContextOptions {
                        rank,
                        world_size: 3,
                        local_rank: rank,
                        local_world_size: 3,
                        store,
                    })
                    .unwrap();
                    ctx.barrier(None, Some(Duration::from_secs(20))).unwrap();
                    ctx.job_id.clone()
                })
            })
            .collect();
        let ids: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    }
}

#[test]
fn a_rank_joins_the_run_of_a_rank_0_that_already_closed() {
    // Rank 0 failed early and closed before rank 1 came: rank 1 still joins its run (and can
    // report its own error) instead of waiting for a run that will never open.
    let store = Arc::new(MemoryStore::new());
    let a0 = Context::new(options(0, 2, &store)).unwrap();
    let first = a0.job_id.clone();
    drop(a0);
    let mut opts = options(1, 2, &store);
    opts.store = Altered::over(&store, Change::ShortTimeout);
    let a1 = Context::new(opts).unwrap();
    assert_eq!(a1.job_id, first);
}

#[test]
fn overlapping_runs_in_one_store_get_their_own_ids() {
    // Rank 0 starts its second context before rank 1 has closed its first one.
    let store = Arc::new(MemoryStore::new());
    let a0 = Context::new(options(0, 2, &store)).unwrap();
    let a1 = Context::new(options(1, 2, &store)).unwrap();
    let first = a0.job_id.clone();
    assert_eq!(a1.job_id, first);
    drop(a0);
    let b0 = Context::new(options(0, 2, &store)).unwrap();
    drop(a1);
    let b1 = Context::new(options(1, 2, &store)).unwrap();
    assert_eq!(b0.job_id, b1.job_id);
    assert_ne!(b0.job_id, first);
}

#[test]
fn closed_store_reports_invalid_state() {
    let err = ClosedStore.get("k", Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
}

/// This machine's address towards the outside (no packet is sent), if it is not loopback.
fn non_loopback_addr() -> Option<String> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string())
}

fn master_config(rank: usize, port: u16, addr: &str) -> EnvConfig {
    EnvConfig::from_lookup(|var| match var {
        "WORLD_RANK" => Some(rank.to_string()),
        "WORLD_SIZE" => Some("2".into()),
        "WORLD_LOCAL_RANK" => Some("0".into()),
        "WORLD_LOCAL_SIZE" => Some("1".into()),
        "MASTER_ADDR" => Some(addr.to_string()),
        "MASTER_PORT" => Some(port.to_string()),
        _ => None,
    })
    .unwrap()
}

#[test]
fn the_candidate_whose_bind_fails_connects_to_the_winner() {
    let Some(addr) = non_loopback_addr() else {
        println!("SKIPPED: no non-loopback address on this machine");
        return;
    };
    // Two ranks that are both local rank 0 of a node owning the master address.
    let port = free_port_below_ephemeral();
    let options = EnvOptions {
        timeout: Some(Duration::from_secs(20)),
        ..EnvOptions::default()
    };
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (config, options) = (master_config(rank, port, &addr), options.clone());
            std::thread::spawn(move || {
                let ctx = Context::from_config(&config, &options).unwrap();
                ctx.barrier(None, None).unwrap();
                let hosts = ctx.hosted_store_port().is_some();
                ctx.close().unwrap();
                hosts
            })
        })
        .collect();
    let hosts: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(hosts.iter().filter(|&&h| h).count(), 1, "{hosts:?}");
}

#[test]
fn a_port_taken_by_another_program_is_named() {
    let Some(addr) = non_loopback_addr() else {
        println!("SKIPPED: no non-loopback address on this machine");
        return;
    };
    let squatter = std::net::TcpListener::bind("[::]:0")
        .or_else(|_| std::net::TcpListener::bind("0.0.0.0:0"))
        .unwrap();
    let port = squatter.local_addr().unwrap().port();
    // Accepts and closes at once, as a program that is no store would.
    std::thread::spawn(move || {
        for conn in squatter.incoming().take(64) {
            drop(conn);
        }
    });
    let options = EnvOptions {
        timeout: Some(Duration::from_secs(2)),
        ..EnvOptions::default()
    };
    let err = Context::from_config(&master_config(0, port, &addr), &options).unwrap_err();
    assert!(err.message.contains("was taken"), "{err}");
    assert!(err.message.contains("MASTER_PORT"), "{err}");
}

/// Rank 0 over a store it serves (`others` other clients), and rank 1 over the same keys.
fn served_pair(others: usize) -> (Context, Context, Arc<AtomicUsize>) {
    let store = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(others));
    let mut opts0 = options(0, 2, &store);
    opts0.store = Altered::over(&store, Change::ServedHere(Arc::clone(&count)));
    let mut rank0 = Context::new(opts0).unwrap();
    rank0.set_host_linger(Duration::from_secs(20));
    let rank1 = Context::new(options(1, 2, &store)).unwrap();
    (rank0, rank1, count)
}

#[test]
fn a_rank_serving_the_store_closes_after_the_others() {
    let (rank0, rank1, _others) = served_pair(1);
    let closing = std::thread::spawn(move || {
        let start = Instant::now();
        rank0.close().map(|()| start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!closing.is_finished(), "rank 0 left before rank 1 closed");
    rank1.close().unwrap();
    let waited = closing.join().unwrap().unwrap();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
}

#[test]
fn a_rank_serving_the_store_stops_waiting_once_nobody_is_connected() {
    let (rank0, _rank1, others) = served_pair(2);
    let closing = std::thread::spawn(move || rank0.close());
    std::thread::sleep(Duration::from_millis(100));
    assert!(!closing.is_finished());
    // Rank 1's process went without closing its context (killed, say): its connection closed.
    others.store(0, Ordering::SeqCst);
    closing.join().unwrap().unwrap();
}

#[test]
fn a_rank_serving_the_store_waits_no_longer_than_its_host_linger() {
    let (mut rank0, _rank1, _others) = served_pair(1);
    rank0.set_host_linger(Duration::from_millis(150));
    let start = Instant::now();
    let err = rank0.close().unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(
        err.message.contains("serves the store") && err.message.contains("1 connections"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// A port free now on every address (see `crate::test_ports`).
fn free_port_below_ephemeral() -> u16 {
    crate::test_ports::port_below_ephemeral(|port| {
        std::net::TcpListener::bind(("::", port))
            .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", port)))
            .is_ok()
    })
}

/// Rank `rank` of `world` in a job tagged `tag`, as the environment would give it.
fn start(rank: usize, world: usize, tag: &str, store: &Arc<MemoryStore>) -> Result<Context> {
    start_within(rank, world, tag, store, DEFAULT_TIMEOUT)
}

fn start_within(
    rank: usize,
    world: usize,
    tag: &str,
    store: &Arc<MemoryStore>,
    timeout: Duration,
) -> Result<Context> {
    let ranks = RankInfo::new(rank, world, rank, world).unwrap();
    let said = Said {
        tag: tag.to_string(),
        tag_from: "NVFIPC_JOB_TAG",
        world_from: "WORLD_SIZE",
    };
    let store = Arc::clone(store) as Arc<dyn Store>;
    Context::start(ranks, store, None, said, timeout)
}

/// Starts each `(rank, world, tag)` on a thread over one store (each rank that gets a context
/// calls a barrier); returns each one's error, and how long the slowest took.
fn disagreeing(ranks: &[(usize, usize, &'static str)]) -> (Vec<Error>, Duration) {
    let store = Arc::new(MemoryStore::new());
    let begin = Instant::now();
    let threads: Vec<_> = (ranks.iter().copied())
        .map(|(rank, world, tag)| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let ctx = start(rank, world, tag, &store)?;
                ctx.barrier(None, None)
            })
        })
        .collect();
    let errors = threads.into_iter().map(|t| t.join().unwrap().unwrap_err());
    (errors.collect(), begin.elapsed())
}

#[test]
fn ranks_that_disagree_on_the_world_size_are_told_at_once() {
    let (errors, took) = disagreeing(&[(0, 2, "t"), (1, 3, "t")]);
    // The store's timeout is 300 s.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let [zero, one] = &errors[..] else { panic!() };
    assert_eq!(zero.status, Status::InvalidArgument, "{zero}");
    assert!(
        zero.message.contains("rank 0 of 2: rank 1 (pid ")
            && zero.message.contains(
                "says world size 3 (from WORLD_SIZE) where this rank says 2 (from WORLD_SIZE)"
            ),
        "{zero}"
    );
    assert!(
        one.message.contains("rank 1 of 3")
            && one.message.contains("rank 0 (pid ")
            && one
                .message
                .contains("world size 2 (from WORLD_SIZE) where this rank says 3"),
        "{one}"
    );
}

/// Another tag may be another job sharing the store (legitimate): a rank is not failed for it,
/// but a wait that times out names the rank of another tag it saw.
#[test]
fn a_rank_of_another_tag_is_named_when_the_wait_times_out() {
    let store = Arc::new(MemoryStore::new());
    let timeout = Duration::from_millis(2500);
    let threads: Vec<_> = [(0, "a"), (1, "b")]
        .into_iter()
        .map(|(rank, tag)| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let ctx = start_within(rank, 2, tag, &store, timeout)?;
                ctx.barrier(None, None)
            })
        })
        .collect();
    let errors: Vec<Error> = threads
        .into_iter()
        .map(|t| t.join().unwrap().unwrap_err())
        .collect();
    for e in &errors {
        assert_eq!(e.status, Status::Timeout, "{e}");
    }
    assert!(
        errors[1].message.contains(
            "of a job with tag a (from NVFIPC_JOB_TAG) was seen where this rank's tag is b"
        ),
        "{}",
        errors[1]
    );
}

#[test]
fn a_rank_of_another_library_version_is_named() {
    let store = Arc::new(MemoryStore::new());
    let other = format!(
        "hello1|2|WORLD_SIZE|t|NVFIPC_JOB_TAG|0.0.1|{}|open;{}",
        collision::Moment::now().encode().replace(';', ","),
        NodeIdentity::local().encode()
    );
    store
        .set(&names::hello("tag/t", 0), other.as_bytes())
        .unwrap();
    let begin = Instant::now();
    let err = start(1, 2, "t", &store).unwrap_err();
    assert!(begin.elapsed() < Duration::from_secs(10));
    let mine = env!("CARGO_PKG_VERSION");
    let said = format!("library version 0.0.1 where this rank says {mine}");
    assert!(err.message.contains(&said), "{err}");
    // A closed hello, or one older than the timeout, is passed over (this rank waits instead).
    for old in [
        other.replace("|open;", "|closed;"),
        other.replace("wall=", "wall=1").replace("up=", "up=1"),
    ] {
        store
            .set(&names::hello("tag/t", 0), old.as_bytes())
            .unwrap();
        let ranks = RankInfo::new(1, 2, 1, 2).unwrap();
        let said = Said::caller();
        let store = Arc::clone(&store) as Arc<dyn Store>;
        let timeout = Duration::from_millis(1500);
        let err = Context::start(ranks, store, None, said, timeout).unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
    }
}

#[test]
fn two_tagged_jobs_and_a_closed_job_of_another_size_on_one_store_are_not_taken_to_disagree() {
    let store = Arc::new(MemoryStore::new());
    // A job of two ranks that closed.
    let run = |ranks: Vec<(usize, usize, &'static str, u64)>| {
        let threads: Vec<_> = (ranks.into_iter())
            .map(|(rank, world, tag, late_ms)| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(late_ms));
                    let ctx = start(rank, world, tag, &store)?;
                    ctx.barrier(None, None)?;
                    Ok::<_, Error>(ctx)
                })
            })
            .collect();
        let contexts = threads.into_iter().map(|t| t.join().unwrap().unwrap());
        contexts.collect::<Vec<_>>()
    };
    for ctx in run(vec![(0, 2, "default", 0), (1, 2, "default", 0)]) {
        ctx.close().unwrap();
    }
    // An untagged job of three ranks whose rank 0 is late, next to a job of two ranks tagged
    // `a` (live), and a job of two ranks tagged `b` whose rank 0 is late.
    let a = run(vec![(0, 2, "a", 0), (1, 2, "a", 0)]);
    let three = (0..3).map(|r| (r, 3, "default", if r == 0 { 1500 } else { 0 }));
    let late_b = [(0, 2, "b", 1500), (1, 2, "b", 0)];
    let others = run(three.chain(late_b).collect());
    for ctx in a.into_iter().chain(others) {
        ctx.close().unwrap();
    }
}
