//! What one point of the store load benchmark measured (`store_load` drives it; the report
//! tabulates it).

use std::time::Duration;

/// What one load point measured.
#[derive(Clone, Debug)]
pub struct LoadResult {
    pub clients: usize,
    pub ops: u64,
    pub elapsed: Duration,
    pub get_p50_ns: Option<u64>,
    pub get_p90_ns: Option<u64>,
    /// Throughput of every round of this point, in run order (this result is the median one).
    pub round_rates: Vec<f64>,
}

impl LoadResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The round with the median throughput, carrying every round's rate.
    pub fn median_of(mut rounds: Vec<LoadResult>) -> Option<LoadResult> {
        let rates: Vec<f64> = rounds.iter().map(LoadResult::ops_per_sec).collect();
        rounds.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
        let mid = rounds.len().checked_sub(1)? / 2;
        let mut median = rounds.swap_remove(mid);
        median.round_rates = rates;
        Some(median)
    }

    /// (max - min) / median of the round rates, e.g. 0.04 for a 4% spread.
    pub fn spread(&self) -> f64 {
        let max = self.round_rates.iter().copied().fold(f64::MIN, f64::max);
        let min = self.round_rates.iter().copied().fold(f64::MAX, f64::min);
        if self.round_rates.len() < 2 {
            return 0.0;
        }
        (max - min) / self.ops_per_sec().max(1e-9)
    }
}
