//! Reusable barriers over the world or any subset of ranks, built on a [`Store`].
//!
//! Protocol for generation `g` of a member set of `n` ranks (keys under `nvfipc/barrier/...`):
//! 1. each arriving rank ADDs 1 to `<set>/count` (its only round trip before the wait);
//! 2. the counter is never reset: generation `g` owns the values `g*n+1 ..= (g+1)*n`, so the rank
//!    that reads `(g+1)*n` is the last arriver; it SETs `<set>/release/<g>` and then deletes
//!    `<set>/release/<g-1>`, which nobody can still be waiting on (every member has arrived at `g`,
//!    so every member has left `g-1`);
//! 3. everyone else WAITs for `<set>/release/<g>` with the timeout.
//!
//! A rank still waiting after [`ANNOUNCE_AFTER`] SETs `<set>/arrived/<rank>` to `g` and waits on;
//! a fast barrier therefore costs each rank one ADD and one WAIT and nothing else. On timeout the
//! counter says how many members arrived and the arrival keys say which: the error names the
//! others. The store holds at most one arrival key per member, one counter and two release keys
//! per member set, however many barriers run. A counter value outside the generation's range
//! means the members disagree on how many barriers they called (or another job shares the store
//! namespace) and is reported instead of silently mis-synchronising.

use crate::error::{Error, Result, Status};
use crate::store::{Arrival, ArrivalOutcome, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Prefix of every key the barrier writes.
pub const BARRIER_KEY_PREFIX: &str = "nvfipc/barrier";

/// How long the timeout diagnosis may block on reading a key that `check` reported present.
const DIAGNOSIS_GET_TIMEOUT: Duration = Duration::from_secs(5);

/// A rank that has waited this long announces its arrival (one SET) so that a timeout elsewhere
/// can name the absent ranks; barriers that complete sooner write no arrival key.
pub const ANNOUNCE_AFTER: Duration = Duration::from_millis(50);

/// After a timeout, how long past [`ANNOUNCE_AFTER`] the diagnosis waits for ranks that the
/// counter shows as arrived to announce themselves.
const ANNOUNCE_GRACE: Duration = Duration::from_millis(500);

/// Pause between two scans of the arrival keys during the diagnosis.
const DIAGNOSIS_POLL: Duration = Duration::from_millis(10);

/// Lists longer than this are printed as ranges (`[0-31,33]`) in messages.
const FULL_LIST_MAX: usize = 16;

/// The sorted, validated ranks of one barrier and the short stable id that names its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSet {
    ranks: Vec<usize>,
    id: String,
}

impl MemberSet {
    /// Validates `members` (the whole world when `None`) for a barrier called by `rank`: members
    /// must be unique, below `world`, and include `rank`.
    pub fn new(rank: usize, world: usize, members: Option<&[usize]>) -> Result<MemberSet> {
        if world == 0 {
            return Err(Error::invalid("barrier: world size is 0"));
        }
        if rank >= world {
            return Err(Error::invalid(format!(
                "barrier: rank {rank} is not below the world size {world}"
            )));
        }
        let ranks = match members {
            None => (0..world).collect::<Vec<_>>(),
            Some(list) => {
                let mut sorted = list.to_vec();
                sorted.sort_unstable();
                if let Some(bad) = sorted.iter().find(|&&r| r >= world) {
                    return Err(Error::invalid(format!(
                        "barrier: member rank {bad} is not below the world size {world} \
                         (members {})",
                        format_ranks(list)
                    )));
                }
                if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
                    return Err(Error::invalid(format!(
                        "barrier: rank {} is listed twice in the members {}",
                        pair[0],
                        format_ranks(list)
                    )));
                }
                if sorted.binary_search(&rank).is_err() {
                    return Err(Error::invalid(format!(
                        "barrier: rank {rank} called a barrier over ranks {} that it is not a \
                         member of",
                        format_ranks(&sorted)
                    )));
                }
                sorted
            }
        };
        let id = if ranks.len() == world {
            format!("w{world}")
        } else {
            format!("s{}-{:016x}", ranks.len(), fnv1a_ranks(&ranks))
        };
        Ok(MemberSet { ranks, id })
    }

    /// The members in increasing order.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// Short stable name of the set: `w<world>` for the whole world, else `s<n>-<hash>`.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }
}

/// 64-bit FNV-1a over the ranks as little-endian u64: stable across processes and builds.
fn fnv1a_ranks(ranks: &[usize]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &r in ranks {
        for byte in (r as u64).to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// Formats ranks for messages: `[0,1,2,3]`, or ranges such as `[0-31,33,35-63]` for long lists.
pub fn format_ranks(ranks: &[usize]) -> String {
    if ranks.len() <= FULL_LIST_MAX {
        let items: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        return format!("[{}]", items.join(","));
    }
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        if j > i {
            parts.push(format!("{}-{}", sorted[i], sorted[j]));
        } else {
            parts.push(sorted[i].to_string());
        }
        i = j + 1;
    }
    format!("[{}]", parts.join(","))
}

/// Per-process barrier state: the next generation of every member set this rank has used.
///
/// Every rank keeps its own; they stay in step because every member calls the same barriers.
#[derive(Debug)]
pub struct BarrierState {
    prefix: String,
    sets: Mutex<HashMap<String, SetSlot>>,
}

/// What the state keeps per member set: the next generation and the set's keys, formatted once.
#[derive(Debug)]
struct SetSlot {
    next_generation: u64,
    keys: Arc<BarrierKeys>,
}

impl Default for BarrierState {
    fn default() -> Self {
        Self::new()
    }
}

impl BarrierState {
    /// State whose keys live under `nvfipc/barrier/`.
    pub fn new() -> BarrierState {
        BarrierState {
            prefix: BARRIER_KEY_PREFIX.to_string(),
            sets: Mutex::new(HashMap::new()),
        }
    }

    /// State whose keys live under `nvfipc/barrier/<scope>/`, so that several jobs (or several
    /// independent groups of barriers) can share one store without sharing counters.
    pub fn scoped(scope: &str) -> BarrierState {
        BarrierState {
            prefix: format!("{BARRIER_KEY_PREFIX}/{scope}"),
            sets: Mutex::new(HashMap::new()),
        }
    }

    /// The key prefix of this state's barriers.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The generation the next barrier over `set` will use.
    pub fn next_generation(&self, set: &MemberSet) -> u64 {
        self.lock()
            .get(set.id())
            .map_or(0, |slot| slot.next_generation)
    }

    /// Returns the generation for this call and the set's keys, and advances the counter.
    fn take_generation(&self, set: &MemberSet) -> (u64, Arc<BarrierKeys>) {
        let mut map = self.lock();
        let slot = match map.get_mut(set.id()) {
            Some(slot) => slot,
            None => map.entry(set.id().to_string()).or_insert_with(|| SetSlot {
                next_generation: 0,
                keys: Arc::new(BarrierKeys::new(&self.prefix, set)),
            }),
        };
        let gen = slot.next_generation;
        slot.next_generation += 1;
        (gen, Arc::clone(&slot.keys))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SetSlot>> {
        // The map holds plain counters, so a panic elsewhere cannot leave it inconsistent.
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Store keys of one member set.
#[derive(Debug)]
struct BarrierKeys {
    base: String,
    count: String,
}

impl BarrierKeys {
    fn new(prefix: &str, set: &MemberSet) -> BarrierKeys {
        let base = format!("{prefix}/{}", set.id());
        let count = format!("{base}/count");
        BarrierKeys { base, count }
    }
    fn arrival(&self, rank: usize) -> String {
        format!("{}/arrived/{rank}", self.base)
    }
    fn count(&self) -> &str {
        &self.count
    }
    fn release(&self, gen: u64) -> String {
        format!("{}/release/{gen}", self.base)
    }
}

/// One call's view of the barrier: who, which generation, which keys.
struct Call<'a> {
    store: &'a dyn Store,
    keys: &'a BarrierKeys,
    set: &'a MemberSet,
    gen: u64,
    rank: usize,
}

impl Call<'_> {
    fn what(&self) -> String {
        format!(
            "barrier gen {} over ranks {} on rank {}",
            self.gen,
            format_ranks(self.set.ranks()),
            self.rank
        )
    }

    /// Counter values generation `gen` owns.
    fn range(&self) -> (i64, i64) {
        let n = self.set.len() as i64;
        let gen = self.gen as i64;
        (gen * n + 1, (gen + 1) * n)
    }

    fn announce(&self) -> Result<()> {
        self.store
            .set(
                &self.keys.arrival(self.rank),
                self.gen.to_string().as_bytes(),
            )
            .map_err(|e| e.context(format!("{}: announcing arrival", self.what())))
    }

    /// After the quiet part of the wait: announces this rank (so that a timeout can name the
    /// absent ones) and waits the `rest` of the timeout for the release key.
    fn wait_announced(&self, release_key: &str, rest: Duration) -> Result<()> {
        if rest.is_zero() {
            return Err(Error::timeout("not released within the timeout"));
        }
        self.announce()?;
        self.store.wait(&[release_key], rest)
    }
}

/// Blocks until every member of `members` (the whole world when `None`) has called the same
/// barrier, or fails after `timeout` with an error naming the ranks that did not arrive.
///
/// `rank` must be a member. Returns the generation that completed (0 for the first barrier over
/// this member set, then 1, 2, ...). A zero timeout checks once and does not wait.
///
/// After a failed barrier the member set's counters may be out of step; the job should stop.
pub fn barrier(
    store: &dyn Store,
    state: &BarrierState,
    rank: usize,
    world: usize,
    members: Option<&[usize]>,
    timeout: Duration,
) -> Result<u64> {
    let set = MemberSet::new(rank, world, members)?;
    let (gen, keys) = state.take_generation(&set);
    if set.len() == 1 {
        // Nobody to wait for.
        return Ok(gen);
    }
    let call = Call {
        store,
        keys: &keys,
        set: &set,
        gen,
        rank,
    };

    let count_key = keys.count();
    let (first, last) = call.range();
    let release_key = keys.release(gen);
    let retire_key = gen.checked_sub(1).map(|old| keys.release(old));
    let arrival = Arrival {
        counter: count_key,
        owns: first..=last,
        release_key: &release_key,
        retire_key: retire_key.as_deref(),
    };
    // Stay silent for the first ANNOUNCE_AFTER: a barrier that completes by then writes only
    // the counter and the release key.
    let quiet = timeout.min(ANNOUNCE_AFTER);
    let outcome = store
        .arrive(&arrival, quiet)
        .map_err(|e| e.context(format!("{}: arriving at {count_key}", call.what())))?;
    match outcome {
        ArrivalOutcome::Released(_) | ArrivalOutcome::Arrived(_) => return Ok(gen),
        ArrivalOutcome::OutOfRange(count) => {
            return Err(Error::state(format!(
                "{}: the counter {count_key} reads {count}, outside {first}..={last} which \
                 generation {gen} owns; the members called different numbers of barriers over \
                 this set, or another job uses the same store keys (give it its own scope)",
                call.what()
            )))
        }
        ArrivalOutcome::Waiting(_) => {}
    }

    match call.wait_announced(&release_key, timeout - quiet) {
        Ok(()) => Ok(gen),
        Err(e) if e.status == Status::Timeout => {
            // The release may have landed just after the wait gave up.
            if store.check(&[&release_key]).unwrap_or(false) {
                return Ok(gen);
            }
            Err(timeout_error(&call, timeout))
        }
        Err(e) => Err(e.context(format!("{}: waiting for {release_key}", call.what()))),
    }
}

/// Builds the timeout error, naming the members that did not arrive at the generation.
fn timeout_error(call: &Call<'_>, timeout: Duration) -> Error {
    let head = format!(
        "barrier gen {} over ranks {} timed out after {} ms on rank {}",
        call.gen,
        format_ranks(call.set.ranks()),
        timeout.as_millis(),
        call.rank
    );
    match missing_ranks(call) {
        Ok(Absent::None) => Error::timeout(format!(
            "{head}: every rank arrived but the release key {} was not set; the last arriver \
             may have died or lost its store connection",
            call.keys.release(call.gen)
        )),
        Ok(Absent::Ranks { ranks, unannounced }) => {
            let list = format_ranks(&ranks);
            let list = &list[1..list.len() - 1];
            let note = if unannounced > 0 {
                format!(
                    " ({unannounced} of them reached the barrier by the counter but never \
                     announced themselves: they may have died while waiting)"
                )
            } else {
                String::new()
            };
            Error::timeout(format!(
                "{head}: ranks {list} did not arrive{note}; check that they are alive and call \
                 the same barriers, or raise the timeout"
            ))
        }
        Err(e) => Error::timeout(format!(
            "{head}; could not tell which ranks are missing: {e}"
        )),
    }
}

/// Outcome of the timeout diagnosis.
#[derive(Debug, PartialEq, Eq)]
enum Absent {
    /// The counter shows every member arrived.
    None,
    /// Members without an arrival record for the generation; `unannounced` of them did arrive
    /// by the counter but wrote no record within the grace period.
    Ranks {
        ranks: Vec<usize>,
        unannounced: usize,
    },
}

/// Members (other than the caller) that have not reached the generation.
///
/// The counter gives how many arrived; ranks that arrived announce themselves within
/// [`ANNOUNCE_AFTER`] of arriving, so the scan repeats (bounded) until the announced ranks
/// account for every arrival.
fn missing_ranks(call: &Call<'_>) -> Result<Absent> {
    // Waiters announce before they time out, but a zero or short timeout may end first.
    call.announce()?;
    let (first, last) = call.range();
    let count = call.store.add(call.keys.count(), 0)?;
    if count >= last {
        return Ok(Absent::None);
    }
    let arrived_others = usize::try_from(count - first).unwrap_or(0);
    let deadline = Instant::now() + ANNOUNCE_AFTER + ANNOUNCE_GRACE;
    loop {
        let missing = unannounced_ranks(call)?;
        let announced_others = call.set.len() - 1 - missing.len();
        let unaccounted = arrived_others.saturating_sub(announced_others);
        if unaccounted == 0 || Instant::now() >= deadline {
            return Ok(Absent::Ranks {
                ranks: missing,
                unannounced: unaccounted,
            });
        }
        std::thread::sleep(DIAGNOSIS_POLL);
    }
}

/// Members (other than the caller) whose arrival key is missing or older than the generation.
fn unannounced_ranks(call: &Call<'_>) -> Result<Vec<usize>> {
    let mut missing = Vec::new();
    for &member in call.set.ranks().iter().filter(|&&m| m != call.rank) {
        let key = call.keys.arrival(member);
        if !call.store.check(&[&key])? {
            missing.push(member);
            continue;
        }
        let value = call.store.get(&key, DIAGNOSIS_GET_TIMEOUT)?;
        let arrived = std::str::from_utf8(&value)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| {
                Error::protocol(format!(
                    "arrival key {key} holds {value:?}, not a generation number"
                ))
            })?;
        if arrived < call.gen {
            missing.push(member);
        }
    }
    Ok(missing)
}

/// A thread-safe in-memory [`Store`] with c10d semantics, for unit tests of the layers above it.
#[cfg(test)]
pub(crate) mod memory_store {
    use crate::error::{Error, Result};
    use crate::store::Store;
    use std::collections::HashMap;
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    #[derive(Default)]
    pub struct MemoryStore {
        map: Mutex<HashMap<String, Vec<u8>>>,
        changed: Condvar,
    }

    impl MemoryStore {
        pub fn new() -> Self {
            Self::default()
        }
        pub fn keys(&self) -> Vec<String> {
            let mut keys: Vec<String> = self.map.lock().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        }
    }

    impl Store for MemoryStore {
        fn set(&self, key: &str, value: &[u8]) -> Result<()> {
            self.map
                .lock()
                .unwrap()
                .insert(key.to_string(), value.to_vec());
            self.changed.notify_all();
            Ok(())
        }
        fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
            self.wait(&[key], timeout)?;
            Ok(self.map.lock().unwrap()[key].clone())
        }
        fn add(&self, key: &str, delta: i64) -> Result<i64> {
            let mut map = self.map.lock().unwrap();
            let old = map
                .get(key)
                .map(|v| String::from_utf8_lossy(v).parse::<i64>().unwrap())
                .unwrap_or(0);
            map.insert(key.to_string(), (old + delta).to_string().into_bytes());
            self.changed.notify_all();
            Ok(old + delta)
        }
        fn check(&self, keys: &[&str]) -> Result<bool> {
            let map = self.map.lock().unwrap();
            Ok(keys.iter().all(|k| map.contains_key(*k)))
        }
        fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
            let deadline = Instant::now() + timeout;
            let mut map = self.map.lock().unwrap();
            loop {
                if keys.iter().all(|k| map.contains_key(*k)) {
                    return Ok(());
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::timeout(format!("wait timeout, keys: {keys:?}")));
                }
                map = self.changed.wait_timeout(map, deadline - now).unwrap().0;
            }
        }
        fn delete_key(&self, key: &str) -> Result<bool> {
            Ok(self.map.lock().unwrap().remove(key).is_some())
        }
        fn num_keys(&self) -> Result<i64> {
            Ok(self.map.lock().unwrap().len() as i64)
        }
        fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
            let mut map = self.map.lock().unwrap();
            let result = match map.get(key) {
                None if expected.is_empty() => {
                    map.insert(key.to_string(), desired.to_vec());
                    desired.to_vec()
                }
                None => expected.to_vec(),
                Some(current) if current.as_slice() == expected => {
                    map.insert(key.to_string(), desired.to_vec());
                    desired.to_vec()
                }
                Some(current) => current.clone(),
            };
            self.changed.notify_all();
            Ok(result)
        }
        fn append(&self, key: &str, value: &[u8]) -> Result<()> {
            self.map
                .lock()
                .unwrap()
                .entry(key.to_string())
                .or_default()
                .extend_from_slice(value);
            self.changed.notify_all();
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory_store::MemoryStore;
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

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
        // Per member set: arrival keys, one counter and at most two release keys.
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
    fn short_timeout_waits_for_arrived_ranks_to_announce() {
        let store = Arc::new(MemoryStore::new());
        let early = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let state = BarrierState::new();
                barrier(&*store, &state, 0, 3, None, Duration::from_millis(400)).unwrap_err()
            })
        };
        // Rank 0 has added to the counter but, within ANNOUNCE_AFTER, written no arrival key.
        let deadline = Instant::now() + LONG;
        while store.add("nvfipc/barrier/w3/count", 0).unwrap() < 1 {
            assert!(Instant::now() < deadline, "rank 0 never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        let state = BarrierState::new();
        let err = barrier(&*store, &state, 1, 3, None, Duration::from_millis(1)).unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        assert!(err.message.contains(": ranks 2 did not arrive;"), "{err}");
        let err = early.join().unwrap();
        assert!(err.message.contains(": ranks 2 did not arrive;"), "{err}");
        assert_eq!(
            store.get("nvfipc/barrier/w3/arrived/0", LONG).unwrap(),
            b"0".to_vec()
        );
    }

    #[test]
    fn arrivals_that_never_announce_are_listed_with_a_note() {
        let store = MemoryStore::new();
        // A member that added to the counter and vanished before announcing itself.
        store.add("nvfipc/barrier/w3/count", 1).unwrap();
        let state = BarrierState::new();
        let err = barrier(&store, &state, 0, 3, None, Duration::from_millis(1)).unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        assert!(
            err.message
                .contains("ranks 1,2 did not arrive (1 of them reached the barrier"),
            "{err}"
        );
    }

    #[test]
    fn every_arrival_without_release_is_reported() {
        let store = Arc::new(MemoryStore::new());
        let count_key = "nvfipc/barrier/w3/count";
        store.add(count_key, 1).unwrap();
        let waiter = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let state = BarrierState::new();
                barrier(&*store, &state, 0, 3, None, Duration::from_millis(200)).unwrap_err()
            })
        };
        let deadline = Instant::now() + LONG;
        while store.add(count_key, 0).unwrap() < 2 {
            assert!(Instant::now() < deadline, "rank 0 never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The last arriver counts itself and dies before releasing.
        store.add(count_key, 1).unwrap();
        let err = waiter.join().unwrap();
        assert_eq!(err.status, Status::Timeout);
        assert!(err.message.contains("every rank arrived but"), "{err}");
    }

    #[test]
    fn slow_barrier_over_tcp_announces_and_completes() {
        use crate::store::client::{ConnectOptions, TcpStore};
        use crate::store::server::StoreServer;
        let server = StoreServer::bind("127.0.0.1", 0).unwrap();
        let port = server.port();
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                std::thread::spawn(move || -> Result<Vec<u8>> {
                    let store = TcpStore::connect("127.0.0.1", port, &ConnectOptions::default())?;
                    let state = BarrierState::new();
                    if rank == 2 {
                        // Arrive well after the others have started waiting.
                        let deadline = Instant::now() + LONG;
                        while store.add("nvfipc/barrier/w3/count", 0)? < 2 {
                            assert!(Instant::now() < deadline, "ranks 0 and 1 never arrived");
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        std::thread::sleep(ANNOUNCE_AFTER * 3);
                    }
                    assert_eq!(barrier(&store, &state, rank, 3, None, LONG)?, 0);
                    // The early ranks announced themselves while waiting, before the release.
                    let value = store.get("nvfipc/barrier/w3/arrived/0", LONG)?;
                    assert_eq!(barrier(&store, &state, rank, 3, None, LONG)?, 1);
                    Ok(value)
                })
            })
            .collect();
        for (rank, handle) in ranks.into_iter().enumerate() {
            let value = handle.join().unwrap().unwrap();
            // Rank 0 read its own key before arriving at generation 1; a slow generation 1 may
            // have moved it on by the time the others read it.
            let expected: &[&[u8]] = if rank == 0 { &[b"0"] } else { &[b"0", b"1"] };
            assert!(
                expected.contains(&value.as_slice()),
                "rank {rank}: {value:?}"
            );
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
    fn mismatched_generations_are_reported() {
        let store = Arc::new(MemoryStore::new());
        // Rank 1 already ran one barrier more than rank 0 thinks (e.g. state from another job).
        store.add("nvfipc/barrier/w2/count", 2).unwrap();
        let state = BarrierState::new();
        let err = barrier(&*store, &state, 0, 2, None, LONG).unwrap_err();
        assert_eq!(err.status, Status::InvalidState);
        assert!(err.message.contains("reads 3, outside 1..=2"), "{err}");
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
}
