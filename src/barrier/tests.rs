use super::*;
use crate::store::memory::MemoryStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

impl BarrierState {
    /// The generation the next barrier over `set` will use.
    fn next_generation(&self, set: &MemberSet) -> u64 {
        lock(&self.sets).get(set.id()).map_or(0, |slot| slot.0)
    }
}

const LONG: Duration = Duration::from_secs(20);

/// A small deterministic generator so every "rank" computes the same subsets.
fn next_random(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

fn random_subset(seed: &mut u64, world: usize) -> Vec<usize> {
    loop {
        let subset: Vec<usize> = (0..world).filter(|_| next_random(seed) % 2 == 0).collect();
        if subset.len() >= 2 {
            return subset;
        }
    }
}

#[test]
fn member_set_validates_and_names() {
    let world = MemberSet::new(1, 4, None).unwrap();
    assert_eq!(world.ranks(), &[0, 1, 2, 3]);
    assert_eq!(world.id(), "w4");
    let same = MemberSet::new(1, 4, Some(&[3, 2, 1, 0])).unwrap();
    assert_eq!(same.id(), "w4");
    let sub = MemberSet::new(2, 8, Some(&[5, 2])).unwrap();
    assert_eq!(sub.ranks(), &[2, 5]);
    assert!(sub.id().starts_with("s2-"));
    assert_eq!(sub.id(), MemberSet::new(5, 8, Some(&[2, 5])).unwrap().id());
    assert_ne!(
        sub.id(),
        MemberSet::new(2, 8, Some(&[2, 6])).unwrap().id(),
        "different sets must get different ids"
    );

    for (rank, world, members, needle) in [
        (0, 4, Some(&[0, 4][..]), "not below the world size 4"),
        (0, 4, Some(&[0, 1, 1][..]), "listed twice"),
        (3, 4, Some(&[0, 1][..]), "not a member"),
        (0, 4, Some(&[][..]), "not a member"),
        (4, 4, None, "rank 4 is not below"),
        (0, 0, None, "world size is 0"),
    ] {
        let err = MemberSet::new(rank, world, members).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.contains(needle), "{err}");
    }
}

#[test]
fn format_ranks_compresses_long_lists() {
    assert_eq!(format_ranks(&[0, 1, 2, 3]), "[0,1,2,3]");
    let long: Vec<usize> = (0..32).chain([33]).chain(35..64).collect();
    assert_eq!(format_ranks(&long), "[0-31,33,35-63]");
}

#[test]
fn validation_errors_touch_nothing() {
    let store = MemoryStore::new();
    let state = BarrierState::new();
    let err = barrier(&store, &state, 2, 4, Some(&[0, 1]), LONG).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(store.keys().is_empty());
}

#[test]
fn single_member_returns_at_once() {
    let store = MemoryStore::new();
    let state = BarrierState::new();
    assert_eq!(barrier(&store, &state, 0, 1, None, LONG).unwrap(), 0);
    assert_eq!(barrier(&store, &state, 3, 8, Some(&[3]), LONG).unwrap(), 0);
    assert_eq!(barrier(&store, &state, 0, 1, None, LONG).unwrap(), 1);
    assert!(store.keys().is_empty());
}

/// Runs `body(rank, state)` on `world` threads that share one store, each with its own
/// barrier state as separate processes would have.
fn run_ranks<F>(world: usize, store: Arc<MemoryStore>, body: F) -> Vec<Result<()>>
where
    F: Fn(usize, &dyn Store, &BarrierState) -> Result<()> + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = Arc::clone(&store);
            let body = Arc::clone(&body);
            std::thread::spawn(move || {
                let state = BarrierState::new();
                body(rank, &*store, &state)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn random_subsets_synchronise_and_keys_stay_bounded() {
    const WORLD: usize = 8;
    const ROUNDS: usize = 200;
    let store = Arc::new(MemoryStore::new());
    let counters: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let results = run_ranks(WORLD, Arc::clone(&store), move |rank, store, state| {
        let mut seed = 42u64;
        for round in 0..ROUNDS {
            let subset = random_subset(&mut seed, WORLD);
            if !subset.contains(&rank) {
                continue;
            }
            counters[round].fetch_add(1, Ordering::SeqCst);
            barrier(store, state, rank, WORLD, Some(&subset), LONG)?;
            // Nobody leaves before every member has arrived.
            assert_eq!(counters[round].load(Ordering::SeqCst), subset.len());
        }
        barrier(store, state, rank, WORLD, None, LONG)?;
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
    // Per member set: at most two release keys.
    let keys = store.keys();
    let mut per_set: HashMap<String, usize> = HashMap::new();
    for key in &keys {
        assert!(key.starts_with("nvfipc/barrier/"), "{key}");
        if key.contains("/release/") {
            *per_set
                .entry(key.split("/release/").next().unwrap().into())
                .or_default() += 1;
        }
    }
    assert!(per_set.values().all(|&n| n <= 2), "{per_set:?}");
    // Arrival keys of at most one generation per set are left: the coordinator removes a
    // generation's keys when it arrives at the next one.
    let mut arrival_gens: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
    for key in keys.iter().filter(|k| k.contains("/arrived/")) {
        let (set, rest) = key.split_once("/arrived/").unwrap();
        let gen = rest.split('/').next().unwrap().to_string();
        arrival_gens.entry(set.to_string()).or_default().insert(gen);
    }
    assert!(
        arrival_gens.values().all(|gens| gens.len() == 1),
        "{arrival_gens:?}"
    );
}

#[test]
fn world_barrier_is_reusable_and_counts_generations() {
    let store = Arc::new(MemoryStore::new());
    let results = run_ranks(4, Arc::clone(&store), |rank, store, state| {
        for expected in 0..50u64 {
            assert_eq!(barrier(store, state, rank, 4, None, LONG)?, expected);
        }
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
    let releases: Vec<_> = store
        .keys()
        .into_iter()
        .filter(|k| k.contains("/release/"))
        .collect();
    // The last arriver of 49 deleted the release key of 48.
    assert_eq!(releases, vec!["nvfipc/barrier/w4/release/49"]);
}

#[test]
fn timeout_names_the_missing_rank() {
    let store = Arc::new(MemoryStore::new());
    let timeout = Duration::from_millis(200);
    let results = run_ranks(4, Arc::clone(&store), move |rank, store, state| {
        // Everyone passes generation 0, then rank 3 stops coming.
        barrier(store, state, rank, 4, None, LONG)?;
        if rank == 3 {
            return Ok(());
        }
        let start = Instant::now();
        let err = barrier(store, state, rank, 4, None, timeout).unwrap_err();
        assert!(start.elapsed() >= timeout);
        assert_eq!(err.status, Status::Timeout);
        let expected = format!(
            "barrier gen 1 over ranks [0,1,2,3] timed out after 200 ms on rank {rank}: \
                 ranks 3 did not arrive"
        );
        assert!(err.message.starts_with(&expected), "{}", err.message);
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn a_coordinator_that_dies_after_arriving_is_named() {
    let store = Arc::new(MemoryStore::new());
    // Rank 0 arrived (its key is there) and died before releasing.
    store.set("nvfipc/barrier/w3/arrived/0/0", b"1").unwrap();
    let results = run_ranks(3, Arc::clone(&store), |rank, store, state| {
        if rank == 0 {
            return Ok(());
        }
        let err = barrier(store, state, rank, 3, None, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        assert!(
            err.message
                .contains("every rank arrived but the coordinator, rank 0, did not release"),
            "{err}"
        );
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn slow_barrier_over_tcp_completes_and_clears_old_arrival_keys() {
    use crate::store::client::{ConnectOptions, TcpStore};
    use crate::store::server::StoreServer;
    let server = StoreServer::bind("127.0.0.1", 0).unwrap();
    let port = server.port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(move || -> Result<()> {
                let store = TcpStore::connect("127.0.0.1", port, &ConnectOptions::default())?;
                let state = BarrierState::new();
                if rank == 2 {
                    // Arrive well after the others have started waiting.
                    let deadline = Instant::now() + LONG;
                    while !store.check(&[
                        "nvfipc/barrier/w3/arrived/0/0",
                        "nvfipc/barrier/w3/arrived/0/1",
                    ])? {
                        assert!(Instant::now() < deadline, "ranks 0 and 1 never arrived");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(150));
                }
                assert_eq!(barrier(&store, &state, rank, 3, None, LONG)?, 0);
                assert_eq!(barrier(&store, &state, rank, 3, None, LONG)?, 1);
                // The coordinator cleared generation 0's arrival keys when it arrived at
                // generation 1, before it released anyone.
                for member in 0..3 {
                    let key = format!("nvfipc/barrier/w3/arrived/0/{member}");
                    assert!(!store.check(&[&key])?, "{key} left behind");
                }
                Ok(())
            })
        })
        .collect();
    for handle in ranks {
        handle.join().unwrap().unwrap();
    }
    server.shutdown();
}

#[test]
fn zero_timeout_checks_once() {
    let store = MemoryStore::new();
    let state = BarrierState::new();
    let err = barrier(&store, &state, 0, 3, None, Duration::ZERO).unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(err.message.contains("ranks 1,2 did not arrive"), "{err}");
}

#[test]
fn a_member_in_another_generation_is_reported() {
    let store = Arc::new(MemoryStore::new());
    // Rank 1 waits in generation 1 while rank 0 (the coordinator) is at generation 0.
    store.set("nvfipc/barrier/w2/arrived/1/1", b"1").unwrap();
    let state = BarrierState::new();
    let err = barrier(&*store, &state, 0, 2, None, Duration::from_millis(50)).unwrap_err();
    assert_eq!(err.status, Status::Timeout);
    assert!(
        err.message.contains(
            "ranks 1 did not arrive; rank 1 is at gen 1: the members called different \
                 numbers of barriers"
        ),
        "{err}"
    );
}

#[test]
fn scoped_states_do_not_share_counters() {
    let store = Arc::new(MemoryStore::new());
    let results = run_ranks(2, Arc::clone(&store), |rank, store, _| {
        let a = BarrierState::scoped("jobA");
        let b = BarrierState::scoped("jobB");
        barrier(store, &a, rank, 2, None, LONG)?;
        barrier(store, &a, rank, 2, None, LONG)?;
        assert_eq!(barrier(store, &b, rank, 2, None, LONG)?, 0);
        assert_eq!(a.next_generation(&MemberSet::new(rank, 2, None)?), 2);
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
    assert!(store
        .keys()
        .iter()
        .any(|k| k.starts_with("nvfipc/barrier/jobB/w2/")));
}
