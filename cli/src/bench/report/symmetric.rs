//! The symmetric scenario's report: a row per group size, where the first contact and a fresh
//! rendezvous go, the JSON rows, the chart and the two targets (per-peer growth, first contact
//! against its floor).

use super::{driver_calls, header, parts_of, parts_text, ratio, series, Target};
use crate::bench::svg::{Chart, Series as Line};
use crate::stats::{fmt_opt_ns, format_table, median};
use nvfuser_ipc::tools::exchange::PHASES;
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

/// The first contact's rendezvous vs its floor: the process's first rendezvous at W = 8 (or the
/// largest group below it) within this many times the driver calls alone.
const FIRST_CONTACT_FLOOR_LIMIT: f64 = 2.0;

/// The parts of a process's first rendezvous: making its transports and cache, then the phases.
fn contact_parts() -> Vec<&'static str> {
    std::iter::once("setup")
        .chain(PHASES.iter().map(|p| p.name()))
        .collect()
}

/// What one group size measured, over ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub world: usize,
    /// Rendezvous of a fresh buffer after the first: median over ranks, and the slowest rank.
    pub first: Option<u64>,
    pub slowest: Option<u64>,
    /// `first` over the peers mapped (W - 1).
    pub per_peer: Option<u64>,
    /// Second rendezvous of the same buffers (a cache hit), median over ranks.
    pub hit: Option<u64>,
    /// CPU time of a rank's process during its first rendezvous, over the peers mapped,
    /// median over ranks.
    pub cpu_per_peer: Option<u64>,
    /// The process's first rendezvous (transports and cache made, first contact with every
    /// peer), median over ranks.
    pub first_contact: Option<u64>,
    /// The same sharing by the driver calls alone in fresh processes (device memory only).
    pub floor: Option<u64>,
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
            floor: median(series(map, "symm.floor")),
        }
    }
}

pub fn text(results: &[(usize, Samples)], transport: &str, rounds: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n== Symmetric rendezvous, {transport}, every rank maps every other rank's buffer, \
         {rounds} rounds per rank (median per rank) =="
    );
    let mut rows = vec![header(&[
        "W",
        "first contact p50",
        "floor p50",
        "vs floor",
        "fresh p50",
        "slowest rank",
        "per peer",
        "CPU per peer",
        "cache hit p50",
    ])];
    for (w, map) in results {
        let r = Row::of(*w, map);
        rows.push(vec![
            w.to_string(),
            fmt_opt_ns(r.first_contact),
            fmt_opt_ns(r.floor),
            ratio(r.first_contact, r.floor).map_or("-".into(), |x| format!("{x:.2}x")),
            fmt_opt_ns(r.first),
            fmt_opt_ns(r.slowest),
            fmt_opt_ns(r.per_peer),
            fmt_opt_ns(r.cpu_per_peer),
            fmt_opt_ns(r.hit),
        ]);
    }
    s.push_str(&format_table(&rows));
    let (contact, calls) = (contact_parts(), driver_calls());
    let floor_parts = crate::bench::symmetric_floor::PARTS;
    for (prefix, names, what) in [
        ("symm.contact_phase", &contact[..], "the first contact goes"),
        (
            "symm.contact_driver",
            &calls[..],
            "the first contact's driver calls go",
        ),
        ("symm.floor_part", &floor_parts[..], "the floor goes"),
        (
            "symm.phase",
            &PHASES.map(|p| p.name())[..],
            "a fresh rendezvous goes",
        ),
        (
            "symm.driver",
            &calls[..],
            "a fresh rendezvous's driver calls go",
        ),
        (
            "symm.hit_phase",
            &PHASES.map(|p| p.name())[..],
            "the cache hit goes",
        ),
    ] {
        for (w, map) in results {
            let parts = parts_text(&parts_of(map, prefix, names));
            if !parts.is_empty() {
                let _ = writeln!(
                    s,
                    "symmetric at W={w}, where {what} (median over ranks, the slowest rank in \
                     brackets): {parts}"
                );
            }
        }
    }
    for (w, map) in results {
        let counts: Vec<String> = calls
            .iter()
            .filter_map(|c| {
                let n = series(map, &format!("symm.contact_calls.{c}"))
                    .iter()
                    .max()?;
                (*n > 0).then(|| format!("{c} {n}"))
            })
            .collect();
        if !counts.is_empty() {
            let _ = writeln!(
                s,
                "symmetric at W={w}, driver calls of the first contact (most on one rank): {}",
                counts.join(", ")
            );
        }
    }
    s.push_str(
        "first contact: the process's first rendezvous, from a barrier of the bench: its \
         transports and cache made (setup), every peer's board, semaphore slab and fd responder \
         met, every peer's buffer mapped; floor: the same buffers shared by the driver calls \
         alone (export, handles over a Unix socket, import, reserve, map, set access), one fresh \
         process per rank, all at once; fresh: a fresh buffer and tag on every rank after the \
         first contact, after a barrier (no start-up skew); per peer: fresh / (W - 1); CPU per \
         peer: CPU time of the rank's process (all its threads) during the fresh rendezvous / \
         (W - 1); cache hit: the same buffers again, after another barrier\n",
    );
    s
}

pub fn json(results: &[(usize, Samples)]) -> Vec<Value> {
    let (contact, calls) = (contact_parts(), driver_calls());
    results
        .iter()
        .map(|(w, map)| {
            let r = Row::of(*w, map);
            let parts = |prefix: &str, names: &[&'static str]| -> Map<String, Value> {
                parts_of(map, prefix, names)
                    .into_iter()
                    .map(|(name, mid, max)| {
                        (name.to_string(), json!({"median_ns": mid, "max_ns": max}))
                    })
                    .collect()
            };
            let phase_names = PHASES.map(|p| p.name());
            json!({
                "world": w,
                "first_median_ns": r.first,
                "first_slowest_ns": r.slowest,
                "per_peer_ns": r.per_peer,
                "cpu_per_peer_ns": r.cpu_per_peer,
                "hit_median_ns": r.hit,
                "first_contact_median_ns": r.first_contact,
                "floor_median_ns": r.floor,
                "first_phases": parts("symm.phase", &phase_names),
                "first_driver": parts("symm.driver", &calls),
                "hit_phases": parts("symm.hit_phase", &phase_names),
                "first_contact_phases": parts("symm.contact_phase", &contact),
                "first_contact_driver": parts("symm.contact_driver", &calls),
                "floor_parts": parts("symm.floor_part", &crate::bench::symmetric_floor::PARTS),
            })
        })
        .collect()
}

pub fn chart(results: &[(usize, Samples)], transport: &str) -> String {
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
            line("first contact", |r| r.first_contact, false, 3),
            line("its floor (driver calls alone)", |r| r.floor, true, 3),
            line("fresh rendezvous", |r| r.first, false, 0),
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
pub fn targets(results: &[(usize, Samples)]) -> Vec<Target> {
    [per_peer_target(results), floor_target(results)]
        .into_iter()
        .flatten()
        .collect()
}

fn per_peer_target(results: &[(usize, Samples)]) -> Option<Target> {
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

/// The process's first rendezvous at W = 8 (or the largest group below it) against its floor.
fn floor_target(results: &[(usize, Samples)]) -> Option<Target> {
    let at = results
        .iter()
        .map(|(w, m)| Row::of(*w, m))
        .filter(|r| r.world <= TARGET_WORLD && r.floor.is_some())
        .max_by_key(|r| r.world)?;
    let ratio = ratio(at.first_contact, at.floor);
    Some(Target {
        name: format!(
            "first rendezvous of a process at W={} vs its floor",
            at.world
        ),
        measured: format!(
            "{} / {}",
            fmt_opt_ns(at.first_contact),
            fmt_opt_ns(at.floor)
        ),
        ratio,
        limit: FIRST_CONTACT_FLOOR_LIMIT,
        met: ratio.map(|r| r <= FIRST_CONTACT_FLOOR_LIMIT),
    })
}

#[cfg(test)]
mod tests;
