//! Sample statistics and human-readable durations for the demo and benchmark tables.

use std::time::Duration;

/// Nanoseconds of a duration, saturating.
pub fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// The `q`-quantile (0..=1) of `samples` by the nearest-rank method; `None` when empty.
pub fn quantile(samples: &[u64], q: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub fn median(samples: &[u64]) -> Option<u64> {
    quantile(samples, 0.5)
}

/// "950 ns", "12.3 us", "4.56 ms", "1.23 s".
pub fn fmt_ns(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

/// `fmt_ns` of an optional value, "-" when absent.
pub fn fmt_opt_ns(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".to_string(), fmt_ns)
}

/// Space-separated decimal numbers (how samples travel through the store and result files).
pub fn encode_samples(samples: &[u64]) -> String {
    let mut out = String::with_capacity(samples.len() * 8);
    for (i, s) in samples.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&s.to_string());
    }
    out
}

pub fn decode_samples(text: &str) -> Option<Vec<u64>> {
    text.split_ascii_whitespace()
        .map(|w| w.parse().ok())
        .collect()
}

/// Prints rows as left-aligned columns separated by two spaces.
pub fn format_table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
