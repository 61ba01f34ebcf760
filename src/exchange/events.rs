//! The exchange's log lines (`NVFIPC_DEBUG=INFO`, subsystem `exchange`): what each call moved
//! and how long it took, and, while a call waits, which peer it waits for. Everything here is
//! behind a level check, so a call with the log off pays one atomic load per event site.

use super::request::ChannelKey;
use crate::logging;
use log::Level;
use std::time::{Duration, Instant};

/// Whether lines at `level` of the exchange subsystem are written.
pub(super) fn enabled(level: Level) -> bool {
    log::log_enabled!(target: logging::EXCHANGE, level)
}

/// The clock, read only when an exchange line at `level` will use it.
pub(super) fn clock(level: Level) -> Option<Instant> {
    logging::clock(logging::EXCHANGE, level)
}

pub(super) use logging::since;

/// At most `limit` keys, then how many more (keys can be many in a large batch).
pub(super) fn some_keys<S: AsRef<str>>(keys: &[S], limit: usize) -> String {
    let mut out: Vec<String> = keys
        .iter()
        .take(limit)
        .map(|k| format!("{:?}", k.as_ref()))
        .collect();
    if keys.len() > limit {
        out.push(format!("and {} more", keys.len() - limit));
    }
    out.join(", ")
}

/// What a peer was awaited for when it closed or exited (for messages).
#[derive(Clone, Copy)]
pub(super) enum Stage {
    Step,
    Open,
}

/// One channel a wait is still pending on.
pub(super) struct PendingWait<'a> {
    pub peer: usize,
    pub key: &'a ChannelKey,
    pub step: u64,
    pub version: u64,
}

/// Reports a wait that lasts: first after one second, then each time its length doubles, one
/// line per pending channel (at most four), so a stuck exchange explains itself in the log
/// while it hangs, not only when it times out.
pub(super) struct StuckReport {
    since: Option<Instant>,
    next: Duration,
}

impl StuckReport {
    pub fn new() -> Self {
        StuckReport {
            since: None,
            next: Duration::from_secs(1),
        }
    }

    /// Called now and then during a wait (not on its first poll, which usually succeeds).
    pub fn check<'a>(
        &mut self,
        rank: usize,
        pending: impl Iterator<Item = PendingWait<'a>>,
        stage: Stage,
        timeout: Duration,
    ) {
        if !enabled(Level::Info) {
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        let waited = since.elapsed();
        if waited < self.next {
            return;
        }
        self.next *= 2;
        let pending: Vec<PendingWait> = pending.collect();
        for it in pending.iter().take(4) {
            let what = match stage {
                Stage::Step => format!(
                    "to reach step {} (board entry of {})",
                    it.step,
                    it.key.describe()
                ),
                Stage::Open => format!("to open version {} of this rank's buffer", it.version),
            };
            log::info!(
                target: logging::EXCHANGE,
                "rank {rank}: still waiting after {:.1}s (timeout {:?}) for peer rank {} on {} \
                 {what}",
                waited.as_secs_f64(),
                timeout,
                it.peer,
                it.key,
            );
        }
        if pending.len() > 4 {
            log::info!(
                target: logging::EXCHANGE,
                "rank {rank}: and {} more channel(s) pending",
                pending.len() - 4
            );
        }
    }
}

#[cfg(test)]
mod tests;
