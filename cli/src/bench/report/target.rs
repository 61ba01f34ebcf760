//! One line of the benchmark's target check: what was measured against what, and whether it met its limit.

use super::ratio;
use crate::stats::fmt_opt_ns;

/// One line of the target check.
pub struct Target {
    pub name: String,
    pub measured: String,
    pub ratio: Option<f64>,
    pub limit: f64,
    /// `None` when there was nothing to compare.
    pub met: Option<bool>,
}

impl Target {
    /// `a / b`, met at `limit` or below.
    pub(super) fn ratio(name: String, a: Option<u64>, b: Option<u64>, limit: f64) -> Target {
        let r = ratio(a, b);
        Target {
            name,
            measured: format!("{} / {}", fmt_opt_ns(a), fmt_opt_ns(b)),
            ratio: r,
            limit,
            met: r.map(|r| r <= limit),
        }
    }

    /// A duration, met at `goal_ns` or below.
    pub(super) fn at_most(name: String, value: Option<u64>, goal_ns: u64) -> Target {
        Target {
            name,
            measured: fmt_opt_ns(value),
            ratio: value.map(|v| v as f64 / goal_ns as f64),
            limit: 1.0,
            met: value.map(|v| v <= goal_ns),
        }
    }
}
