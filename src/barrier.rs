//! Reusable barriers over the world or any subset of ranks, built on a [`Store`]: per generation,
//! arrival keys WAITed for by the set's lowest rank and one release key (docs/PROTOCOL.md section
//! 2). The server does one read and one write per member, a third of a torch-style ADD, ADD, WAIT
//! barrier; on timeout the arrival keys name who is missing.

use crate::config::MAX_WORLD_SIZE;
use crate::error::{Error, Result, Status};
use crate::hash::Fnv1a;
use crate::logging;
use crate::names::BarrierKeys;
use crate::store::Store;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// must be unique, below `world`, and include `rank`; `world` is at most [`MAX_WORLD_SIZE`].
    pub fn new(rank: usize, world: usize, members: Option<&[usize]>) -> Result<MemberSet> {
        if world == 0 {
            return Err(Error::invalid("barrier: world size is 0"));
        }
        if world > MAX_WORLD_SIZE {
            return Err(Error::invalid(format!(
                "barrier: the world size {world} is above the limit of {MAX_WORLD_SIZE} ranks"
            )));
        }
        if let Some(list) = members.filter(|l| l.len() > world) {
            return Err(Error::invalid(format!(
                "barrier: {} members listed in a world of {world} ranks",
                list.len()
            )));
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
        // FNV-1a over the ranks as little-endian u64: stable across processes and builds.
        let mut hash = Fnv1a::new();
        ranks
            .iter()
            .for_each(|&r| hash.write(&(r as u64).to_le_bytes()));
        let id = if ranks.len() == world {
            format!("w{world}")
        } else {
            format!("s{}-{:016x}", ranks.len(), hash.finish())
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
}

/// Formats ranks for messages: `[0,1,2,3]`, or ranges such as `[0-31,33,35-63]` for long lists.
pub fn format_ranks(ranks: &[usize]) -> String {
    let parts: Vec<String> = if ranks.len() <= FULL_LIST_MAX {
        ranks.iter().map(|r| r.to_string()).collect()
    } else {
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        let runs = sorted.chunk_by(|a, b| *b == a + 1);
        runs.map(|run| match run {
            [first, .., last] => format!("{first}-{last}"),
            one => one[0].to_string(),
        })
        .collect()
    };
    format!("[{}]", parts.join(","))
}

/// Per-process barrier state: per member set this rank has used, the next generation and the
/// set's keys, formatted once. Every rank keeps its own; they stay in step because every member
/// calls the same barriers.
#[derive(Debug, Default)]
pub struct BarrierState {
    scope: Option<String>,
    sets: Mutex<HashMap<String, (u64, Arc<BarrierKeys>)>>,
}

impl BarrierState {
    /// State whose keys live under `nvfipc/barrier/`.
    pub fn new() -> BarrierState {
        Self::default()
    }

    /// State whose keys live under `nvfipc/barrier/<scope>/`, so that several jobs (or several
    /// independent groups of barriers) can share one store without sharing counters.
    pub fn scoped(scope: &str) -> BarrierState {
        let scope = Some(scope.to_string());
        BarrierState {
            scope,
            ..Self::default()
        }
    }

    /// Returns the generation for this call and the set's keys, and advances the counter.
    fn take_generation(&self, set: &MemberSet) -> (u64, Arc<BarrierKeys>) {
        // The map holds plain counters, so a panic elsewhere cannot leave it inconsistent.
        let mut map = lock(&self.sets);
        let (next, keys) = match map.get_mut(set.id()) {
            Some(slot) => slot,
            None => map.entry(set.id().to_string()).or_insert_with(|| {
                (
                    0,
                    Arc::new(BarrierKeys::new(self.scope.as_deref(), set.id())),
                )
            }),
        };
        *next += 1;
        (*next - 1, Arc::clone(keys))
    }
}

/// A member found absent, with the next generation when it was found waiting there.
type Absent = (usize, Option<u64>);

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

    /// The members other than the caller.
    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        self.set.ranks().iter().copied().filter(|&m| m != self.rank)
    }

    /// Coordinator: clears the previous generation's arrival keys while it waits for every
    /// other member, then deletes the previous release key and releases everyone.
    fn coordinate(&self, own_arrival: &str, timeout: Duration) -> Result<()> {
        let arrivals: Vec<String> = self
            .others()
            .map(|m| self.keys.arrival(self.gen, m))
            .collect();
        let waited: Vec<&str> = arrivals.iter().map(String::as_str).collect();
        let previous: Vec<String> = match self.gen.checked_sub(1) {
            Some(old) => self
                .set
                .ranks()
                .iter()
                .map(|&m| self.keys.arrival(old, m))
                .collect(),
            None => Vec::new(),
        };
        let previous: Vec<&str> = previous.iter().map(String::as_str).collect();
        let arrived =
            self.store
                .update_then_wait(&previous, Some((own_arrival, b"1")), &waited, timeout);
        match arrived {
            Ok(()) => {}
            // Everyone may have arrived just as the wait gave up.
            Err(e) if e.status == Status::Timeout && self.store.check(&waited).unwrap_or(false) => {
            }
            Err(e) if e.status == Status::Timeout => return Err(self.timeout_error(timeout)),
            Err(e) => return Err(e.context(format!("{}: waiting for the others", self.what()))),
        }
        let retire = self.gen.checked_sub(1).map(|old| self.keys.release(old));
        let retire: Vec<&str> = retire.iter().map(String::as_str).collect();
        let release = self.keys.release(self.gen);
        self.store
            .update_then_wait(&retire, Some((&release, b"1")), &[], timeout)
            .map_err(|e| e.context(format!("{}: releasing", self.what())))
    }

    /// Any other member: announces itself and waits for the coordinator's release.
    fn wait_release(&self, own_arrival: &str, timeout: Duration) -> Result<()> {
        let release = self.keys.release(self.gen);
        match self
            .store
            .update_then_wait(&[], Some((own_arrival, b"1")), &[&release], timeout)
        {
            Ok(()) => Ok(()),
            Err(e) if e.status == Status::Timeout => {
                // The release may have landed just after the wait gave up, or while the
                // diagnosis ran (once released, the coordinator may reach the next generation
                // and delete this one's arrival keys, making everyone look absent).
                if self.store.check(&[&release]).unwrap_or(false) {
                    return Ok(());
                }
                let err = self.timeout_error(timeout);
                if self.store.check(&[&release]).unwrap_or(false) {
                    return Ok(());
                }
                Err(err)
            }
            Err(e) => Err(e.context(format!("{}: waiting for {release}", self.what()))),
        }
    }

    /// The timeout error, naming the members whose arrival key is missing (as many as can be
    /// checked within a tenth of the timeout, at least 20 ms and at most 1 s, so the error
    /// comes in time whatever the number of members).
    fn timeout_error(&self, timeout: Duration) -> Error {
        let budget = (timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let deadline = Instant::now() + budget;
        let head = format!(
            "barrier gen {} over ranks {} timed out after {} ms on rank {}",
            self.gen,
            format_ranks(self.set.ranks()),
            timeout.as_millis(),
            self.rank
        );
        match self.absent(deadline) {
            Ok((absent, 0)) if absent.is_empty() => Error::timeout(format!(
                "{head}: every rank arrived but the coordinator, rank {}, did not release them; \
                 it may have died or lost its store connection",
                self.set.ranks()[0]
            )),
            Ok((absent, unchecked)) => {
                let ranks: Vec<usize> = absent.iter().map(|a| a.0).collect();
                let list = format_ranks(&ranks);
                let list = &list[1..list.len() - 1];
                let more = if unchecked == 0 {
                    String::new()
                } else {
                    format!(" ({unchecked} more members were not checked in time)")
                };
                let elsewhere: Vec<String> = absent
                    .iter()
                    .filter_map(|&(rank, gen)| gen.map(|g| format!("rank {rank} is at gen {g}")))
                    .collect();
                let note = if elsewhere.is_empty() {
                    "check that they are alive and call the same barriers, or raise the timeout"
                        .to_owned()
                } else {
                    format!(
                        "{}: the members called different numbers of barriers over this set, \
                         or another job uses the same store keys (give it its own scope)",
                        elsewhere.join(", ")
                    )
                };
                if ranks.is_empty() {
                    return Error::timeout(format!(
                        "{head}: {unchecked} members were not checked in time; {note}"
                    ));
                }
                Error::timeout(format!("{head}: ranks {list} did not arrive{more}; {note}"))
            }
            Err(e) => Error::timeout(format!(
                "{head}; could not tell which ranks are missing: {e}"
            )),
        }
    }

    /// Members (other than the caller) without an arrival key for this generation, each with the
    /// next generation when found waiting there (a different number of barriers called), and how
    /// many were left unchecked at `deadline`. The previous generation's keys say nothing.
    fn absent(&self, deadline: Instant) -> Result<(Vec<Absent>, usize)> {
        let mut absent = Vec::new();
        for (checked, member) in self.others().enumerate() {
            if Instant::now() >= deadline {
                return Ok((absent, self.set.ranks().len() - 1 - checked));
            }
            if self.store.check(&[&self.keys.arrival(self.gen, member)])? {
                continue;
            }
            let next = self.gen + 1;
            let ahead = self.store.check(&[&self.keys.arrival(next, member)])?;
            absent.push((member, ahead.then_some(next)));
        }
        Ok((absent, 0))
    }
}

/// Blocks until every member of `members` (the whole world when `None`) has called the same
/// barrier, or fails after `timeout` with an error naming the ranks that did not arrive.
///
/// `rank` must be a member. Returns the generation that completed (0 for the first barrier over
/// this member set, then 1, 2, ...). A zero timeout checks once and does not wait.
///
/// After a failed barrier the member set's keys may be out of step; the job should stop.
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
    if set.ranks().len() == 1 {
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
    let own_arrival = keys.arrival(gen, rank);
    let start = logging::clock(logging::BARRIER, log::Level::Info);
    let coordinator = rank == set.ranks()[0];
    log::debug!(
        target: logging::BARRIER,
        "{}: arriving ({}, key {own_arrival:?})",
        call.what(),
        if coordinator { "coordinator" } else { "member" }
    );
    let result = if coordinator {
        call.coordinate(&own_arrival, timeout)
    } else {
        call.wait_release(&own_arrival, timeout)
    };
    match &result {
        Ok(()) => log::info!(
            target: logging::BARRIER,
            "{}: released after {}",
            call.what(),
            logging::since(start)
        ),
        // The caller gets the error; the log records it only for those who asked for events.
        Err(e) => log::info!(
            target: logging::BARRIER,
            "{}: failed after {}: {}",
            call.what(),
            logging::since(start),
            e.message
        ),
    }
    result.map(|()| gen)
}

#[cfg(test)]
mod tests;
