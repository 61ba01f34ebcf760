//! The symmetric scenario's part of the report: its table, phase breakdown, JSON rows, plot and
//! target line. Every series holds one sample per rank (that rank's median over its rounds).

use super::report::{header, phases, phases_text, series, Target};
use super::svg::{Chart, Series as Line};
use crate::stats::{fmt_opt_ns, format_table, median};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Rank 0's gathered series of one group size.
type Samples = BTreeMap<String, Vec<u64>>;

/// The group size the target looks at (or the largest measured below it).
const TARGET_WORLD: usize = 8;

/// Per-peer cost at the target size over that at the smallest size: 1x is growth with the
/// number of peers mapped, more says the rendezvous gets slower per peer as the group grows.
const PER_PEER_GROWTH_LIMIT: f64 = 2.0;

/// What one group size measured, over ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub world: usize,
    /// First rendezvous of a fresh buffer: median over ranks, and the slowest rank.
    pub first: Option<u64>,
    pub slowest: Option<u64>,
    /// `first` over the peers mapped (W - 1).
    pub per_peer: Option<u64>,
    /// Second rendezvous of the same buffers (a cache hit), median over ranks.
    pub hit: Option<u64>,
    /// CPU time of a rank's process during its first rendezvous, over the peers mapped,
    /// median over ranks.
    pub cpu_per_peer: Option<u64>,
    /// The very first rendezvous of a rank with its peers (untimed round), median over ranks.
    pub first_contact: Option<u64>,
}

impl Row {
    pub fn of(world: usize, map: &Samples) -> Row {
        let first = median(series(map, "symm.first"));
        let peers = world.max(2) as u64 - 1;
        Row {
            world,
            first,
            slowest: series(map, "symm.first").iter().copied().max(),
            per_peer: first.map(|f| f / peers),
            cpu_per_peer: median(series(map, "symm.first_cpu")).map(|c| c / peers),
            hit: median(series(map, "symm.hit")),
            first_contact: median(series(map, "symm.first_contact")),
        }
    }
}

pub fn symmetric_text(results: &[(usize, Samples)], transport: &str, rounds: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n== Symmetric rendezvous, {transport}, every rank maps every other rank's buffer, \
         {rounds} rounds per rank (median per rank) =="
    );
    let mut rows = vec![header(&[
        "W",
        "first p50",
        "slowest rank",
        "per peer",
        "CPU per peer",
        "cache hit p50",
        "first contact p50",
    ])];
    for (w, map) in results {
        let r = Row::of(*w, map);
        rows.push(vec![
            w.to_string(),
            fmt_opt_ns(r.first),
            fmt_opt_ns(r.slowest),
            fmt_opt_ns(r.per_peer),
            fmt_opt_ns(r.cpu_per_peer),
            fmt_opt_ns(r.hit),
            fmt_opt_ns(r.first_contact),
        ]);
    }
    s.push_str(&format_table(&rows));
    for (which, what) in [
        ("phase", "the first rendezvous"),
        ("hit_phase", "the cache hit"),
        ("contact_phase", "the first contact"),
    ] {
        for (w, map) in results {
            let parts = phases_text(map, &format!("symm.{which}"));
            if !parts.is_empty() {
                let _ = writeln!(
                    s,
                    "symmetric at W={w}, where {what} goes (median over ranks, the slowest rank \
                     in brackets): {parts}"
                );
            }
        }
    }
    s.push_str(
        "first: a fresh buffer and tag on every rank, after a barrier of the bench (no start-up \
         skew); per peer: first / (W - 1); CPU per peer: CPU time of the rank's process (all its \
         threads) during the first rendezvous / (W - 1); cache hit: the same buffers again, \
         after another barrier; first contact: the untimed first round (peer boards, semaphore \
         slabs, fd connections)\n",
    );
    s
}

pub fn symmetric_json(results: &[(usize, Samples)]) -> Vec<Value> {
    results
        .iter()
        .map(|(w, map)| {
            let r = Row::of(*w, map);
            let phases = |which| -> Map<String, Value> {
                phases(map, &format!("symm.{which}"))
                    .into_iter()
                    .map(|(name, mid, max)| {
                        (name.to_string(), json!({"median_ns": mid, "max_ns": max}))
                    })
                    .collect()
            };
            json!({
                "world": w,
                "first_median_ns": r.first,
                "first_slowest_ns": r.slowest,
                "per_peer_ns": r.per_peer,
                "cpu_per_peer_ns": r.cpu_per_peer,
                "hit_median_ns": r.hit,
                "first_contact_median_ns": r.first_contact,
                "first_phases": phases("phase"),
                "hit_phases": phases("hit_phase"),
                "first_contact_phases": phases("contact_phase"),
            })
        })
        .collect()
}

pub fn symmetric_chart(results: &[(usize, Samples)], transport: &str) -> String {
    let us = |ns: u64| ns as f64 / 1e3;
    let line = |name: &str, value: fn(&Row) -> Option<u64>, dashed: bool, color: usize| Line {
        name: name.into(),
        points: results
            .iter()
            .filter_map(|(w, map)| Some((*w as f64, us(value(&Row::of(*w, map))?))))
            .collect(),
        dashed,
        color: Some(color),
    };
    Chart {
        title: format!("Symmetric rendezvous, median over ranks ({transport})"),
        x_label: "ranks (W)".into(),
        y_label: "microseconds".into(),
        series: vec![
            line("first rendezvous", |r| r.first, false, 0),
            line("slowest rank", |r| r.slowest, true, 0),
            line("per peer (first / (W-1))", |r| r.per_peer, false, 1),
            line("CPU per peer", |r| r.cpu_per_peer, true, 1),
            line("cache hit", |r| r.hit, false, 2),
        ],
    }
    .render()
}

/// Per-peer growth from the smallest group to W = 8 (or the largest below it). Indicative
/// only where the machine has fewer cores than ranks: then it reports no verdict.
pub fn symmetric_target(results: &[(usize, Samples)]) -> Option<Target> {
    let rows: Vec<Row> = results.iter().map(|(w, m)| Row::of(*w, m)).collect();
    let base = rows.iter().min_by_key(|r| r.world)?;
    let at = rows
        .iter()
        .filter(|r| r.world <= TARGET_WORLD && r.world > base.world)
        .max_by_key(|r| r.world)?;
    let ratio = match (at.per_peer, base.per_peer) {
        (Some(a), Some(b)) if b > 0 => Some(a as f64 / b as f64),
        _ => None,
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let oversubscribed = cores < at.world;
    Some(Target {
        name: format!(
            "symmetric rendezvous at W={}: per-peer cost vs W={}",
            at.world, base.world
        ),
        measured: format!(
            "{} / {}{}",
            fmt_opt_ns(at.per_peer),
            fmt_opt_ns(base.per_peer),
            if oversubscribed {
                format!(" ({cores} cores: indicative)")
            } else {
                String::new()
            }
        ),
        ratio,
        limit: PER_PEER_GROWTH_LIMIT,
        met: ratio
            .filter(|_| !oversubscribed)
            .map(|r| r <= PER_PEER_GROWTH_LIMIT),
    })
}

#[cfg(test)]
mod tests;
