//! A call's bounded waits on its peers' boards (step 4: their step; step 6: their opens), their
//! liveness checks, the errors naming who was late or gone, and the reports of a wait that lasts.

use super::batch::{Deadline, Item};
use super::board::PeerBoard;
use super::session::Session;
use crate::error::{Error, Result};
use crate::logging;
use crate::os::wait::{blocking_pace, wait_blocking};
use crate::sync::lock;
use log::Level;
use std::time::{Duration, Instant};

/// What a wait awaits of the peers: their step, or their open of this rank's buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Step,
    Open,
}

/// Reports a wait that lasts (after one second, then each time its length doubles), so that a
/// stuck exchange explains itself in the log while it hangs.
#[derive(Default)]
struct StuckReport {
    since: Option<Instant>,
    reported: u32,
}

impl StuckReport {
    /// Called now and then during a wait (not on its first poll, which usually succeeds).
    fn check(&mut self, rank: usize, items: &[Item], stage: Stage, timeout: Duration) {
        if !log::log_enabled!(target: logging::EXCHANGE, Level::Info) {
            return;
        }
        let waited = self.since.get_or_insert_with(Instant::now).elapsed();
        if waited < Duration::from_secs(1 << self.reported.min(30)) {
            return;
        }
        self.reported += 1;
        let pending: Vec<&Item> = items.iter().filter(|it| it.waiting).collect();
        for it in pending.iter().take(4) {
            let what = match stage {
                Stage::Step => format!(
                    "to reach step {} (board entry of {})",
                    it.progress.step,
                    it.ch.key.describe()
                ),
                Stage::Open => format!(
                    "to open version {} of this rank's buffer",
                    it.progress.version
                ),
            };
            log::info!(
                target: logging::EXCHANGE,
                "rank {rank}: still waiting after {:.1}s (timeout {timeout:?}) for peer rank {} \
                 on {} {what}",
                waited.as_secs_f64(),
                it.ch.peer,
                it.ch.key,
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

/// Polls of a board wait before the first liveness check of the peers (a syscall), so that a peer
/// a few microseconds late costs none; once the wait blocks, every wake-up makes one.
const FIRST_LIVENESS_POLL: u32 = 2048;
/// Polls between two liveness checks while spinning past that.
const LIVENESS_EVERY: u32 = 256;

/// How long a wait sleeps between two looks for a peer board that does not exist yet.
const NO_BOARD_SLEEP: Duration = Duration::from_millis(1);

fn liveness_check_due(polls: u32) -> bool {
    polls >= FIRST_LIVENESS_POLL && polls % LIVENESS_EVERY == 0
}

/// The waits of a call, over the cache's context.
impl Session {
    /// Step 4 (`Step`): waits until every peer has reached this call's step on its channel, and
    /// reads its version; step 6 (`Open`): until the peer has opened every buffer this rank
    /// published. Now and then (about every 100 ms once sleeping) it checks that the awaited peers
    /// still exist and have not closed their caches, so that it fails at once when one has.
    pub(super) fn wait(
        &self,
        items: &mut [Item],
        stage: Stage,
        deadline: &mut Deadline,
    ) -> Result<()> {
        let mut left = 0;
        for it in items.iter_mut() {
            it.waiting = stage == Stage::Step || it.state.publish;
            left += usize::from(it.waiting);
        }
        if left == 0 {
            return Ok(());
        }
        let mut error: Option<Error> = None;
        let mut polls: u32 = 0;
        let mut stuck = StuckReport::default();
        let timeout = deadline.timeout;
        let mut poll = |after_block: bool, items: &mut [Item]| {
            polls = polls.wrapping_add(1);
            // Checked before the entries: what a peer published before it closed or exited is
            // visible once its `closed` flag or its death is, and then it is no failure.
            let due = after_block || liveness_check_due(polls);
            let gone = if due {
                stuck.check(self.rank, items, stage, timeout);
                self.gone_peer(items, stage)
            } else {
                None
            };
            for it in items.iter_mut().filter(|it| it.waiting) {
                match self.ready(it, stage) {
                    Ok(true) => {
                        it.waiting = false;
                        left -= 1;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            // A truncated board first: a peer that failed on it may have closed since, and the
            // truncation is what the user must hear about.
            if error.is_none() {
                error = self.boards_intact(items, due).err();
            }
            if error.is_none() {
                error = gone.and_then(|(i, e)| items[i].waiting.then_some(e));
            }
            (left == 0 || error.is_some()).then_some(())
        };
        // Peers usually are there already: then the clock is never read.
        if poll(false, items).is_none() {
            let pace = blocking_pace(lock(&self.peer_boards).len() + 1);
            wait_blocking(pace, deadline.remaining(), |block| {
                let Some(max) = block else {
                    return poll(false, items);
                };
                // Blocks on the board of the first peer still awaited, until it publishes; the
                // others are checked when it wakes this rank.
                let board = items
                    .iter()
                    .find(|it| it.waiting)
                    .and_then(|it| it.progress.link.board.clone());
                let mut done = None;
                match board {
                    Some(b) => b.block(max, || {
                        done = poll(false, items);
                        done.is_none()
                    }),
                    // Its board is not there yet: nothing to block on.
                    None => std::thread::sleep(max.min(NO_BOARD_SLEEP)),
                }
                done.or_else(|| poll(true, items))
            });
        }
        if let Some(e) = error {
            return Err(e);
        }
        // A wait that timed out may have seen the last item get ready in its final check.
        let pending = items.iter().filter(|it| it.waiting).count();
        match items.iter().find(|it| it.waiting) {
            None => Ok(()),
            Some(it) => Err(self.late(it, stage, pending, deadline.timeout)),
        }
    }

    /// Whether the peer of `it` has reached `stage` (at `Step`, reading its version).
    fn ready(&self, it: &mut Item, stage: Stage) -> Result<bool> {
        let link = &mut it.progress.link;
        if stage == Stage::Open {
            return Ok(match (&link.board, link.entry) {
                (Some(b), Some(e)) => b.opened(e) >= it.progress.version,
                _ => false,
            });
        }
        if link.board.is_none() {
            link.board = self
                .peer_board(it.ch.peer)
                .map_err(|e| e.context(format!("rank {}", self.rank)))?;
        }
        let Some(board) = &link.board else {
            return Ok(false);
        };
        if link.entry.is_none() {
            link.entry = board.find(it.ch.fp);
        }
        let Some((version, at)) = link.entry.and_then(|e| board.read(e, it.progress.step)) else {
            return Ok(false);
        };
        it.peer_version = version;
        it.peer_at = at;
        Ok(true)
    }

    /// The error of a wait that timed out with `it` the first of `pending` items still late.
    fn late(&self, it: &Item, stage: Stage, pending: usize, timeout: Duration) -> Error {
        let board = self.names.board(it.ch.peer);
        let (step, key) = (it.progress.step, it.ch.key.describe());
        Error::timeout(match stage {
            Stage::Step => {
                let seen = match (self.peer_board(it.ch.peer), it.progress.link.entry) {
                    (Ok(Some(b)), Some(e)) => format!("its entry is at step {}", b.step(e)),
                    (Ok(Some(_)), None) => "it has not used this channel yet".to_string(),
                    _ => "its board does not exist yet (has it created its cache?)".to_string(),
                };
                format!(
                    "rank {} timed out after {timeout:?} waiting for peer rank {} on {} at step \
                     {step}: board entry {key} of {board} not at step {step} ({seen}); {} other \
                     channel(s) also pending. Does rank {} call exchange_handles with the \
                     matching request?",
                    self.rank,
                    it.ch.peer,
                    it.ch.key,
                    pending - 1,
                    it.ch.peer,
                )
            }
            Stage::Open => {
                let opened = match (&it.progress.link.board, it.progress.link.entry) {
                    (Some(b), Some(e)) => b.opened(e),
                    _ => 0,
                };
                format!(
                    "rank {} timed out after {timeout:?} waiting for peer rank {} to open version \
                     {} of this rank's buffer on {} at step {step} (board entry {key} of {board} \
                     shows version {opened} opened; key {:?}); did the peer fail in \
                     exchange_handles?",
                    self.rank,
                    it.ch.peer,
                    it.progress.version,
                    it.ch.key,
                    self.record_key(it, true),
                )
            }
        })
    }

    /// Fails when this rank's board, or the board of a peer still awaited, was truncated (it reads
    /// zeros from then on, so a wait on it would last until the timeout); `probe`: see `board`.
    fn boards_intact(&self, items: &[Item], probe: bool) -> Result<()> {
        self.board
            .check(probe)
            .and_then(|()| {
                items
                    .iter()
                    .filter(|it| it.waiting)
                    .filter_map(|it| it.progress.link.board.as_deref())
                    .try_for_each(|b| b.check(probe))
            })
            .map_err(|e| e.context(format!("rank {}", self.rank)))
    }

    /// The first pending item whose peer has closed its cache or exited, with the error.
    fn gone_peer(&self, items: &[Item], stage: Stage) -> Option<(usize, Error)> {
        items.iter().enumerate().find_map(|(i, it)| {
            if !it.waiting {
                return None;
            }
            let (who, key, step) = (it.ch.peer, &it.ch.key, it.progress.step);
            let waited_for = || match stage {
                Stage::Step => format!("reaching step {step} on {key}"),
                Stage::Open => format!(
                    "opening version {} of this rank's buffer on {key} at step {step}",
                    it.progress.version
                ),
            };
            let Some(board) = it.progress.link.board.as_ref() else {
                // Its board was never seen here (it may have died before this rank looked, and
                // its board gone with it): its process, as its cache published it.
                let pid = self.peer_nodes.exited(who)?;
                return Some((
                    i,
                    Error::io(format!(
                        "rank {}: peer rank {who} (pid {pid}) exited before {}; its cache had \
                         been created, its board is gone",
                        self.rank,
                        waited_for()
                    )),
                ));
            };
            if board.closed() {
                return Some((i, self.closed_peer(it, board, &waited_for())));
            }
            (board.owner().is_dead()).then(|| {
                let msg = format!(
                    "rank {}: peer rank {who} (pid {}) exited before {}",
                    self.rank,
                    board.owner().pid,
                    waited_for()
                );
                (i, Error::io(msg))
            })
        })
    }

    /// The error of a peer whose board says it closed its cache before `what`.
    pub(super) fn closed_peer(&self, it: &Item, board: &PeerBoard, what: &str) -> Error {
        Error::state(format!(
            "rank {}: peer rank {} (pid {}) closed its cache before {what}; a closed cache takes \
             no part in exchanges (create new caches on both ranks)",
            self.rank,
            it.ch.peer,
            board.owner().pid,
        ))
    }
}

#[cfg(test)]
mod tests;
