//! Turns the samples of a benchmark run into tables, the target check, JSON and SVG plots.

use super::exchange::floor_ns;
use super::svg::{Chart, Series as Line};
use crate::stats::{fmt_ns, fmt_opt_ns, format_table, median, quantile};
use nvfuser_ipc::tools::cuda::DRIVER_CALLS;
use nvfuser_ipc::tools::exchange::PHASES;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

mod load_point;
mod symmetric;
mod target;

pub use load_point::LoadResult;
pub use target::Target;

const MODES: [&str; 5] = ["cold", "cold_large", "warm", "asym", "pool"];
const PROTOCOLS: [&str; 2] = ["ours", "seed"];

/// Everything one run measured.
pub struct Results {
    pub quick: bool,
    pub transport: String,
    pub exchange_steps: usize,
    /// Per world size: rank 0's gathered series (`ours.cold`, `seed.warm`, `floor.opens`, ...).
    pub exchange: Vec<(usize, BTreeMap<String, Vec<u64>>)>,
    pub store_duration: Duration,
    pub store_rounds: usize,
    /// (server label, result) in the order measured.
    pub store: Vec<(String, LoadResult)>,
    pub store_notes: Vec<String>,
    /// Per world size: `barrier.ours` and `barrier.torch_style`.
    pub barrier: Vec<(usize, BTreeMap<String, Vec<u64>>)>,
    /// Rank 0's `post.channel` and `post.request` samples, and the transport they used.
    pub post: Option<BTreeMap<String, Vec<u64>>>,
    pub post_transport: String,
    /// Per group size: one sample per rank of `symm.first`, `symm.hit`, `symm.phase.<p>`, ...
    pub symmetric: Vec<(usize, BTreeMap<String, Vec<u64>>)>,
    pub symmetric_transport: String,
    pub symmetric_rounds: usize,
    pub failures: Vec<String>,
}

/// Goal of one post on an opened channel (median, host-side).
const POST_GOAL_NS: u64 = 1_000;

/// The rows of the post table: (label, series).
const POST_ROWS: [(&str, &str); 2] = [
    (
        "opened channel (nvfipc_*_channel_send_post)",
        "post.channel",
    ),
    ("cache + request (nvfipc_*_p2p_send_post)", "post.request"),
];

/// Each phase (of `PHASES`) under `prefix` that took any time: (name, median over ranks,
/// slowest rank).
pub(super) fn phases(
    map: &BTreeMap<String, Vec<u64>>,
    prefix: &str,
) -> Vec<(&'static str, u64, u64)> {
    let names: Vec<&'static str> = PHASES.iter().map(|p| p.name()).collect();
    parts_of(map, prefix, &names)
}

/// The series `<prefix>.<name>` of each of `names` that took time: (name, median, max).
pub(super) fn parts_of(
    map: &BTreeMap<String, Vec<u64>>,
    prefix: &str,
    names: &[&'static str],
) -> Vec<(&'static str, u64, u64)> {
    names
        .iter()
        .filter_map(|&name| {
            let v = series(map, &format!("{prefix}.{name}"));
            let (mid, max) = (median(v)?, v.iter().copied().max()?);
            (max > 0).then_some((name, mid, max))
        })
        .collect()
}

/// [`phases`] as "name median (slowest), ..."; empty when none took time.
pub(super) fn phases_text(map: &BTreeMap<String, Vec<u64>>, prefix: &str) -> String {
    parts_text(&phases(map, prefix))
}

/// Parts as "name median (slowest), ...".
pub(super) fn parts_text(parts: &[(&'static str, u64, u64)]) -> String {
    let parts: Vec<String> = parts
        .iter()
        .map(|(name, mid, max)| format!("{name} {} ({})", fmt_ns(*mid), fmt_ns(*max)))
        .collect();
    parts.join(", ")
}

/// A table's header row.
pub(super) fn header(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

pub(super) fn series<'a>(map: &'a BTreeMap<String, Vec<u64>>, name: &str) -> &'a [u64] {
    map.get(name).map_or(&[], Vec::as_slice)
}

/// The names of the driver calls the library times, in its order.
pub(super) fn driver_calls() -> Vec<&'static str> {
    DRIVER_CALLS.iter().map(|c| c.name()).collect()
}

pub(super) fn ratio(a: Option<u64>, b: Option<u64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => Some(a as f64 / b as f64),
        _ => None,
    }
}

impl Results {
    pub fn new(quick: bool) -> Results {
        Results {
            quick,
            transport: String::new(),
            exchange_steps: 0,
            exchange: Vec::new(),
            store_duration: Duration::ZERO,
            store_rounds: 0,
            store: Vec::new(),
            store_notes: Vec::new(),
            barrier: Vec::new(),
            post: None,
            post_transport: String::new(),
            symmetric: Vec::new(),
            symmetric_transport: String::new(),
            symmetric_rounds: 0,
            failures: Vec::new(),
        }
    }

    pub fn fail(&mut self, what: String) {
        eprintln!("nvfipc bench: FAILED: {what}");
        self.failures.push(what);
    }

    /// The floor of the series under `prefix`: `floor` for cold, `floor_large` for cold_large
    /// (fresh opens of buffers of its size); plus two round trips.
    fn floor(map: &BTreeMap<String, Vec<u64>>, prefix: &str) -> Option<u64> {
        let part = |what: &str| series(map, &format!("{prefix}.{what}"));
        floor_ns(part("exports"), part("opens"), part("rtt"))
    }

    /// The target check (the targets of docs/BENCHMARKS.md), on the largest world / client counts measured.
    pub fn targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        if let Some((w, map)) = self.exchange.last() {
            let med = |n: &str| median(series(map, n));
            let cold = med("ours.cold");
            let check = Target::ratio;
            // Cold means fresh allocations: the targets use cold_large; small buffers, which
            // the driver carves from allocations mapped before, are reported beside it.
            let cold_large = med("ours.cold_large");
            out.push(check(
                format!("cold (fresh large allocations) at W={w} vs seed baseline"),
                cold_large,
                med("seed.cold_large"),
                0.5,
            ));
            out.push(check(
                format!("cold (fresh large allocations) at W={w} vs its floor"),
                cold_large,
                Self::floor(map, "floor_large"),
                1.5,
            ));
            out.push(check(
                format!("cold (small buffers, shared allocations) at W={w} vs seed baseline"),
                cold,
                med("seed.cold"),
                0.5,
            ));
            let warm = med("ours.warm");
            out.push(Target::at_most(
                format!("warm at W={w}, two comms per call (<= 2 us)"),
                warm,
                2000,
            ));
            out.push(check(
                format!("asym at W={w} vs cold"),
                med("ours.asym"),
                cold,
                1.0,
            ));
            let cores = nvfuser_ipc::tools::os::usable_cores();
            let (limit, whose) = pool_limit(*w, cores);
            out.push(check(
                format!("pool at W={w} vs seed baseline (segments mapped before; {whose})"),
                med("ours.pool"),
                med("seed.pool"),
                limit,
            ));
            let pool2 = self
                .exchange
                .iter()
                .find(|(w, _)| *w == 2)
                .and_then(|(_, m)| median(series(m, "ours.pool")));
            out.push(Target::at_most(
                "pool at W=2 (<= 10 us)".to_string(),
                pool2,
                10_000,
            ));
            let trips = series(map, "ours.pool.store_round_trips");
            let trips = (!trips.is_empty()).then(|| trips.iter().sum::<u64>());
            out.push(Target {
                name: format!("pool at W={w}: store round trips during the timed calls (0)"),
                measured: trips.map_or("-".to_string(), |t| t.to_string()),
                ratio: trips.map(|t| t as f64),
                limit: 0.0,
                met: trips.map(|t| t == 0),
            });
        }
        let clients: Vec<usize> = {
            let mut c: Vec<usize> = self.store.iter().map(|(_, r)| r.clients).collect();
            c.sort_unstable();
            c.dedup();
            c
        };
        // Our server's label is "nvfipc", or names a non-default setting ("nvfipc-poll0us").
        let labels = self.store_labels();
        let ours_label = labels.iter().find(|l| l.starts_with("nvfipc")).cloned();
        for label in labels.iter().filter(|l| !l.starts_with("nvfipc")) {
            let mut worst: Option<(f64, usize)> = None;
            for &c in &clients {
                let get = |l: &str| {
                    self.store
                        .iter()
                        .find(|(s, r)| s == l && r.clients == c)
                        .map(|(_, r)| r.ops_per_sec())
                };
                let ours = ours_label.as_deref().and_then(get);
                if let (Some(ours), Some(theirs)) = (ours, get(label)) {
                    // Throughput: higher is better, so compare theirs / ours against 1.
                    let r = theirs / ours;
                    match worst {
                        Some((w, _)) if w >= r => {}
                        _ => worst = Some((r, c)),
                    }
                }
            }
            out.push(Target {
                name: format!("store: {label} / ours throughput, worst client count"),
                measured: worst.map_or("-".into(), |(_, c)| format!("at {c} clients")),
                ratio: worst.map(|(r, _)| r),
                limit: 1.0,
                met: worst.map(|(r, _)| r <= 1.0),
            });
        }
        if let Some((w, map)) = self.barrier.last() {
            out.push(Target::ratio(
                format!("barrier at W={w} vs torch-style"),
                median(series(map, "barrier.ours")),
                median(series(map, "barrier.torch_style")),
                0.5,
            ));
        }
        if let Some(map) = &self.post {
            out.push(Target::at_most(
                format!(
                    "one post on an opened channel, {}, median (<= 1 us)",
                    self.post_transport
                ),
                median(series(map, "post.channel")),
                POST_GOAL_NS,
            ));
        }
        out.extend(symmetric::targets(&self.symmetric));
        out
    }

    fn store_labels(&self) -> Vec<String> {
        let mut labels: Vec<String> = Vec::new();
        for (l, _) in &self.store {
            if !labels.contains(l) {
                labels.push(l.clone());
            }
        }
        labels
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        if !self.exchange.is_empty() {
            let _ = writeln!(
                s,
                "\n== Ring exchange, {}, two comms per call, {} calls per rank ==",
                self.transport, self.exchange_steps
            );
            let mut rows = vec![vec!["W".to_string(), "protocol".into()]];
            for m in MODES {
                rows[0].push(format!("{m} p50"));
                rows[0].push(format!("{m} p90"));
            }
            for (w, map) in &self.exchange {
                for p in PROTOCOLS {
                    let mut row = vec![w.to_string(), p.to_string()];
                    for m in MODES {
                        let v = series(map, &format!("{p}.{m}"));
                        row.push(fmt_opt_ns(quantile(v, 0.5)));
                        row.push(fmt_opt_ns(quantile(v, 0.9)));
                    }
                    rows.push(row);
                }
                rows.push(vec![
                    w.to_string(),
                    "floor".into(),
                    fmt_opt_ns(Self::floor(map, "floor")),
                    String::new(),
                    fmt_opt_ns(Self::floor(map, "floor_large")),
                ]);
            }
            s.push_str(&format_table(&rows));
            for (w, map) in &self.exchange {
                let _ = writeln!(
                    s,
                    "floor at W={w}: exporting the two local buffers {} + opening the two peer \
                     records {} + 2 x store round trip {}",
                    fmt_opt_ns(median(series(map, "floor.exports"))),
                    fmt_opt_ns(median(series(map, "floor.opens"))),
                    fmt_opt_ns(median(series(map, "floor.rtt")))
                );
                if map.contains_key("floor_large.opens") {
                    let _ = writeln!(
                        s,
                        "floor of cold_large at W={w}: exporting {} + opening {} + 2 x store \
                         round trip {}",
                        fmt_opt_ns(median(series(map, "floor_large.exports"))),
                        fmt_opt_ns(median(series(map, "floor_large.opens"))),
                        fmt_opt_ns(median(series(map, "floor_large.rtt")))
                    );
                }
                if let Some(closes) = median(series(map, "floor_large.closes")) {
                    let with = Self::floor(map, "floor_large").map(|f| f + closes);
                    let cold = median(series(map, "ours.cold_large"));
                    let _ = writeln!(
                        s,
                        "closes a cold_large call causes at W={w}: the two released mappings \
                         {}, every rank at once; cold_large p50 {} vs floor + closes {}: {}",
                        fmt_ns(closes),
                        fmt_opt_ns(cold),
                        fmt_opt_ns(with),
                        ratio(cold, with).map_or("-".into(), |r| format!("{r:.2}x"))
                    );
                }
            }
            for (w, map) in &self.exchange {
                if let Some(floor) = median(series(map, "floor.pool")) {
                    let pool = median(series(map, "ours.pool"));
                    let _ = writeln!(
                        s,
                        "floor of pool at W={w}: two signal rounds with both ring neighbours through \
                         shared memory alone (no store, no CUDA) {}; the pool call is {}",
                        fmt_ns(floor),
                        pool.map_or("-".to_string(), |p| format!(
                            "{:.1}x it",
                            p as f64 / floor.max(1) as f64
                        ))
                    );
                }
            }
            for (w, map) in &self.exchange {
                let total = |n: &str| series(map, n).iter().sum::<u64>();
                if map.contains_key("ours.pool.opens") {
                    let _ = writeln!(
                        s,
                        "pool at W={w}: IPC opens during the timed calls, all ranks: ours {}, \
                         seed {}",
                        total("ours.pool.opens"),
                        total("seed.pool.opens")
                    );
                }
            }
            for scenario in ["pool", "cold_large", "warm_phased"] {
                for (w, map) in &self.exchange {
                    // The warm call's phases come from a pass of their own, whose clock reads
                    // are in its p50: both p50s stand in its name.
                    let shown = if scenario == "warm_phased" {
                        format!(
                            "warm (a second pass with phase timing on, p50 {} against the timed \
                             pass's {})",
                            fmt_opt_ns(median(series(map, "ours.warm_phased"))),
                            fmt_opt_ns(median(series(map, "ours.warm")))
                        )
                    } else {
                        scenario.to_string()
                    };
                    let phases = phases_text(map, &format!("ours.{scenario}.phase"));
                    if !phases.is_empty() {
                        let trips = series(map, &format!("ours.{scenario}.store_round_trips"))
                            .iter()
                            .sum::<u64>();
                        let _ = writeln!(
                            s,
                            "{shown} at W={w}, where a call's time goes (mean per call, median \
                             over ranks and the slowest rank in brackets): {phases}; store round \
                             trips during the timed calls, all ranks: {trips}"
                        );
                    }
                    let prefix = format!("ours.{scenario}.driver");
                    let calls = parts_text(&parts_of(map, &prefix, &driver_calls()));
                    if !calls.is_empty() {
                        let _ = writeln!(
                            s,
                            "{shown} at W={w}, time in the driver's calls (mean per call, all \
                             the process's threads, the releaser's closes included): {calls}"
                        );
                    }
                }
            }
            s.push_str(
                "ours: this library's cache; seed: upstream protocol (SET, store barrier, \
                 CHECK+GET+DELETE, store barrier) told which comms miss; cold: new buffers every \
                 call (small: the driver may carve them from allocations mapped before); \
                 cold_large: new allocations of 8 MiB or more every call (every call opens; its \
                 floor is in the floor row's second column); asym: even ranks swap \
                 buffers every other call; pool: fresh buffers every call, carved at varying \
                 offsets from 3 allocations per rank mapped before (caching-allocator pattern)\n",
            );
        }
        if !self.store.is_empty() || !self.store_notes.is_empty() {
            let _ = writeln!(
                s,
                "\n== Store server, SET/GET alternating, {} per point, median of {} interleaved \
                 rounds ==",
                fmt_ns(self.store_duration.as_nanos() as u64),
                self.store_rounds
            );
            let mut rows = vec![header(&[
                "clients", "server", "ops/s", "GET p50", "GET p90", "spread",
            ])];
            let mut sorted: Vec<&(String, LoadResult)> = self.store.iter().collect();
            sorted.sort_by_key(|(_, r)| r.clients);
            for (label, r) in sorted {
                rows.push(vec![
                    r.clients.to_string(),
                    label.clone(),
                    format!("{:.0}", r.ops_per_sec()),
                    fmt_opt_ns(r.get_p50_ns),
                    fmt_opt_ns(r.get_p90_ns),
                    format!("{:.0}%", r.spread() * 100.0),
                ]);
            }
            s.push_str(&format_table(&rows));
            for note in &self.store_notes {
                let _ = writeln!(s, "note: {note}");
            }
        }
        if !self.barrier.is_empty() {
            let _ = writeln!(s, "\n== Barrier over the world, per call ==");
            let mut rows = vec![header(&[
                "W",
                "ours p50",
                "ours p90",
                "torch-style p50",
                "torch-style p90",
                "ours/torch",
            ])];
            for (w, map) in &self.barrier {
                let (a, b) = (
                    series(map, "barrier.ours"),
                    series(map, "barrier.torch_style"),
                );
                rows.push(vec![
                    w.to_string(),
                    fmt_opt_ns(quantile(a, 0.5)),
                    fmt_opt_ns(quantile(a, 0.9)),
                    fmt_opt_ns(quantile(b, 0.5)),
                    fmt_opt_ns(quantile(b, 0.9)),
                    ratio(median(a), median(b)).map_or("-".into(), |r| format!("{r:.2}x")),
                ]);
            }
            s.push_str(&format_table(&rows));
        }
        if let Some(map) = &self.post {
            let _ = writeln!(
                s,
                "\n== One transfer post, host-side time of the call, {}, 2 ranks ==",
                self.post_transport
            );
            let mut rows = vec![header(&["call", "samples", "p50", "p99"])];
            for (label, name) in POST_ROWS {
                let v = series(map, name);
                rows.push(vec![
                    label.to_string(),
                    v.len().to_string(),
                    fmt_opt_ns(quantile(v, 0.5)),
                    fmt_opt_ns(quantile(v, 0.99)),
                ]);
            }
            s.push_str(&format_table(&rows));
            s.push_str(
                "each call timed alone on the sender (the clock read included); every transfer \
                 is completed untimed; host: a semaphore write, device: the write enqueued on a \
                 stream\n",
            );
        }
        if !self.symmetric.is_empty() {
            s.push_str(&symmetric::text(
                &self.symmetric,
                &self.symmetric_transport,
                self.symmetric_rounds,
            ));
        }
        let targets = self.targets();
        if !targets.is_empty() {
            let _ = writeln!(
                s,
                "\n== Targets{} ==",
                if self.quick {
                    " (quick run: indicative only)"
                } else {
                    ""
                }
            );
            let mut rows = vec![header(&["target", "measured", "ratio", "limit", "verdict"])];
            for t in &targets {
                rows.push(vec![
                    t.name.clone(),
                    t.measured.clone(),
                    t.ratio.map_or("-".into(), |r| format!("{r:.2}x")),
                    format!("<= {:.2}x", t.limit),
                    match t.met {
                        Some(true) => "met".into(),
                        Some(false) => "MISSED".into(),
                        None => "no data".into(),
                    },
                ]);
            }
            s.push_str(&format_table(&rows));
        }
        for f in &self.failures {
            let _ = writeln!(s, "FAILED: {f}");
        }
        s
    }

    /// The results as JSON (keys in the order written here; non-finite numbers are null).
    pub fn json(&self) -> Value {
        let stat = |v: &[u64]| {
            json!({
                "samples": v.len(),
                "median_ns": quantile(v, 0.5),
                "p90_ns": quantile(v, 0.9),
            })
        };
        let exchange: Vec<Value> = self
            .exchange
            .iter()
            .map(|(w, map)| {
                let named: Map<String, Value> =
                    map.iter().map(|(k, v)| (k.clone(), stat(v))).collect();
                json!({
                    "world": w,
                    "series": named,
                    "floor_ns": Self::floor(map, "floor"),
                    "floor_large_ns": Self::floor(map, "floor_large"),
                })
            })
            .collect();
        let store: Vec<Value> = self
            .store
            .iter()
            .map(|(label, r)| {
                json!({
                    "server": label,
                    "clients": r.clients,
                    "ops": r.ops,
                    "elapsed_ns": r.elapsed.as_nanos() as u64,
                    "ops_per_sec": r.ops_per_sec(),
                    "get_p50_ns": r.get_p50_ns,
                    "get_p90_ns": r.get_p90_ns,
                    "round_ops_per_sec": r.round_rates,
                })
            })
            .collect();
        let barrier: Vec<Value> = self
            .barrier
            .iter()
            .map(|(w, map)| {
                json!({
                    "world": w,
                    "ours": stat(series(map, "barrier.ours")),
                    "torch_style": stat(series(map, "barrier.torch_style")),
                })
            })
            .collect();
        let post = self.post.as_ref().map(|map| {
            let of = |name: &str| {
                let v = series(map, name);
                json!({
                    "samples": v.len(),
                    "median_ns": quantile(v, 0.5),
                    "p99_ns": quantile(v, 0.99),
                })
            };
            json!({
                "transport": self.post_transport,
                "channel": of("post.channel"),
                "request": of("post.request"),
            })
        });
        let targets: Vec<Value> = self
            .targets()
            .into_iter()
            .map(|t| {
                json!({
                    "target": t.name,
                    "measured": t.measured,
                    "ratio": t.ratio,
                    "limit": t.limit,
                    "met": t.met,
                })
            })
            .collect();
        json!({
            "nvfipc_version": env!("CARGO_PKG_VERSION"),
            "quick": self.quick,
            "transport": self.transport,
            "exchange_calls_per_rank": self.exchange_steps,
            "exchange": exchange,
            "store_seconds_per_point": self.store_duration.as_secs_f64(),
            "store_rounds": self.store_rounds,
            "store": store,
            "store_notes": self.store_notes,
            "barrier": barrier,
            "post": post,
            "symmetric_transport": self.symmetric_transport,
            "symmetric_rounds": self.symmetric_rounds,
            "symmetric": symmetric::json(&self.symmetric),
            "targets": targets,
            "failures": self.failures,
        })
    }

    /// [`Results::json`] pretty-printed with two-space indentation, ending in a newline.
    pub fn json_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.json()).expect("a Value always renders");
        text.push('\n');
        text
    }

    /// One chart per scenario that ran: (file stem, SVG).
    pub fn charts(&self) -> Vec<(String, String)> {
        let us = |ns: u64| ns as f64 / 1e3;
        let mut out = Vec::new();
        if !self.exchange.is_empty() {
            let mut lines = Vec::new();
            for p in PROTOCOLS {
                for (mi, m) in MODES.iter().enumerate() {
                    let points = self
                        .exchange
                        .iter()
                        .filter_map(|(w, map)| {
                            Some((*w as f64, us(median(series(map, &format!("{p}.{m}")))?)))
                        })
                        .collect();
                    lines.push(Line {
                        name: format!("{p} {m}"),
                        points,
                        dashed: p == "seed",
                        color: Some(mi),
                    });
                }
            }
            lines.push(Line {
                name: "floor".into(),
                points: self
                    .exchange
                    .iter()
                    .filter_map(|(w, map)| Some((*w as f64, us(Self::floor(map, "floor")?))))
                    .collect(),
                dashed: true,
                color: Some(7),
            });
            out.push((
                "exchange".to_string(),
                Chart {
                    title: format!("Ring exchange per call, median ({})", self.transport),
                    x_label: "ranks (W)".into(),
                    y_label: "microseconds per call".into(),
                    series: lines,
                }
                .render(),
            ));
        }
        if !self.store.is_empty() {
            let lines = self
                .store_labels()
                .into_iter()
                .map(|label| Line {
                    points: self
                        .store
                        .iter()
                        .filter(|(l, _)| *l == label)
                        .map(|(_, r)| (r.clients as f64, r.ops_per_sec()))
                        .collect(),
                    dashed: !label.starts_with("nvfipc"),
                    color: None,
                    name: label,
                })
                .collect();
            out.push((
                "store".to_string(),
                Chart {
                    title: "Store server throughput (SET/GET)".into(),
                    x_label: "clients".into(),
                    y_label: "operations per second".into(),
                    series: lines,
                }
                .render(),
            ));
        }
        if !self.barrier.is_empty() {
            let line = |name: &str, key: &str, dashed: bool| Line {
                name: name.into(),
                points: self
                    .barrier
                    .iter()
                    .filter_map(|(w, map)| Some((*w as f64, us(median(series(map, key))?))))
                    .collect(),
                dashed,
                color: None,
            };
            out.push((
                "barrier".to_string(),
                Chart {
                    title: "Barrier latency per call, median".into(),
                    x_label: "processes (W)".into(),
                    y_label: "microseconds".into(),
                    series: vec![
                        line("ours (Context::barrier)", "barrier.ours", false),
                        line("torch-style store barrier", "barrier.torch_style", true),
                    ],
                }
                .render(),
            ));
        }
        if !self.symmetric.is_empty() {
            out.push((
                "symmetric".to_string(),
                symmetric::chart(&self.symmetric, &self.symmetric_transport),
            ));
        }
        out
    }
}

/// The pool target against the seed where `w` ranks run on `cores` cores, and which case it is:
/// 0.05x where each rank has a core, 0.25x where ranks outnumber cores (waits then cost
/// scheduling, not the protocol).
fn pool_limit(w: usize, cores: usize) -> (f64, String) {
    if w <= cores {
        (0.05, format!("each rank has a core of {cores}"))
    } else {
        (0.25, format!("{w} ranks on {cores} cores"))
    }
}

#[cfg(test)]
mod tests;
