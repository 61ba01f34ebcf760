//! Untagged jobs that share a store, told apart by time (docs/PROTOCOL.md section 2: the
//! `collision` key and what it can and cannot tell): an untagged rank that passes over a run fails,
//! and marks the run, when its process was already running while the run was live.

use crate::error::{Error, Result};
use crate::names::context as names;
use crate::node::NodeIdentity;
use crate::os::process::{since_boot, started_by};
use crate::store::Store;
use std::time::{Duration, SystemTime};

/// How far apart the wall clocks of two hosts may be for the comparison across hosts to hold.
pub const CLOCK_SKEW: Duration = Duration::from_secs(2);

/// A moment as the clocks of one host see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Moment {
    /// The boot id of the kernel whose clock `since_boot` is.
    boot_id: String,
    since_boot: Duration,
    /// Since the Unix epoch.
    wall: Duration,
}

impl Moment {
    pub(super) fn now() -> Moment {
        Moment {
            boot_id: NodeIdentity::local().boot_id,
            since_boot: since_boot().unwrap_or_default(),
            wall: wall_now(),
        }
    }

    /// A moment by which this process had certainly started (see `os::process::started_by`); `None`
    /// where neither `/proc` nor the load time tells: then nothing is ever found to overlap.
    pub(super) fn process_start() -> Option<Moment> {
        let start = started_by()?;
        let now = since_boot()?;
        let wall = wall_now().checked_sub(now.checked_sub(start)?)?;
        Some(Moment {
            boot_id: NodeIdentity::local().boot_id,
            since_boot: start,
            wall,
        })
    }

    /// How long ago this moment was: by the boot clock on its kernel, else by the wall clocks.
    pub(super) fn elapsed(&self) -> Duration {
        let now = Moment::now();
        if !self.boot_id.is_empty() && self.boot_id == now.boot_id {
            return now.since_boot.saturating_sub(self.since_boot);
        }
        now.wall.saturating_sub(self.wall)
    }

    /// `t1;boot=<boot id>;up=<ns since boot>;wall=<ns since the epoch>`.
    pub(super) fn encode(&self) -> String {
        format!(
            "t1;boot={};up={};wall={}",
            self.boot_id,
            self.since_boot.as_nanos(),
            self.wall.as_nanos()
        )
    }

    /// Parses [`encode`](Self::encode)'s output; `None` for anything else (such as the `1` that
    /// older versions wrote into `open`).
    pub(super) fn decode(value: &[u8]) -> Option<Moment> {
        let text = std::str::from_utf8(value).ok()?;
        let mut fields = text.split(';');
        if fields.next()? != "t1" {
            return None;
        }
        let mut moment = Moment::default();
        for field in fields {
            let (k, v) = field.split_once('=')?;
            let nanos = || v.parse::<u64>().ok().map(Duration::from_nanos);
            match k {
                "boot" => moment.boot_id = v.to_string(),
                "up" => moment.since_boot = nanos()?,
                "wall" => moment.wall = nanos()?,
                _ => {}
            }
        }
        Some(moment)
    }
}

/// Since the Unix epoch.
pub(super) fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// True when this process, started at `started`, certainly started before `moment`: on this
/// kernel, by its boot clock; on another, by the wall clocks, allowing [`CLOCK_SKEW`] between them.
fn started_before(started: Option<&Moment>, moment: &Moment) -> bool {
    let Some(me) = started else {
        return false;
    };
    if !me.boot_id.is_empty() && me.boot_id == moment.boot_id {
        me.since_boot < moment.since_boot
    } else {
        me.wall + CLOCK_SKEW < moment.wall
    }
}

/// What an untagged rank knows about its slot in a run it passes over.
pub(super) enum SlotHolder<'a> {
    /// Not read (the run's rank 0 is dead, so the rank does not try that run).
    Unknown,
    /// Another process holds it; `live` when it has not closed and its pid is alive here.
    Other { describe: &'a str, live: bool },
}

/// An untagged rank passes over run `run` (it will not be part of it): fails, after marking
/// the run, when this process was already running while the run was live (see the module
/// documentation). `me` is this rank's claim value, written into the mark; `started` when this
/// process started.
pub(super) fn check_passed_over(
    store: &dyn Store,
    (base, run, rank): (&str, u64, usize),
    holder: SlotHolder<'_>,
    me: &str,
    started: Option<&Moment>,
) -> Result<()> {
    let why = match holder {
        SlotHolder::Other {
            describe,
            live: true,
        } => Some(format!(
            "its rank {rank} is held by {describe}, which is alive and has not closed"
        )),
        _ => overlap(store, base, run, started)?,
    };
    let Some(why) = why else {
        return Ok(());
    };
    let mark = names::run(base, run, "collision");
    store.set(&mark, me.as_bytes())?;
    Err(Error::state(format!(
        "this process was already running while run {run} of this untagged job on the store was \
         live ({why}), yet it is not part of that run: {MIXED} (this mark, {mark}, refuses the \
         ranks of run {run} still open). {ADVICE}"
    )))
}

/// The errors of a collision: what happened and what to do.
const MIXED: &str = "two jobs use one store without distinct job tags, and pairing their ranks \
    by order of arrival would mix them, so the ranks of both are refused";
const ADVICE: &str = "Give each job its own NVFIPC_JOB_TAG, start it with a launcher whose job id \
    the library reads (mpirun, srun, torchrun with --rdzv-id or --standalone, nvfipc launch), or \
    give it its own store";

/// Why this process overlapped run `run`, from the moments the run recorded; `None` if it did
/// not (or nothing was recorded).
fn overlap(
    store: &dyn Store,
    base: &str,
    run: u64,
    started: Option<&Moment>,
) -> Result<Option<String>> {
    for (name, what) in [
        ("last_close", "a rank of it closed"),
        ("open", "its rank 0 opened it"),
    ] {
        let key = names::run(base, run, name);
        if !store.check(&[&key])? {
            continue;
        }
        let value = store.get(&key, Duration::from_secs(1))?;
        if let Some(moment) = Moment::decode(&value) {
            if started_before(started, &moment) {
                return Ok(Some(format!(
                    "this process started before {what}: key {key}"
                )));
            }
        }
    }
    Ok(None)
}

/// The error for rank `rank` of a run that another process (`other`) marked with `mark` (see
/// [`check_passed_over`]).
pub(super) fn marked_error(other: &str, rank: usize, mark: &str) -> Error {
    Error::state(format!(
        "another process ({other}) that was already running while this run was live, as rank \
         {rank}'s job mates were, found this run taken (store key {mark}): {MIXED}. {ADVICE}"
    ))
}

#[cfg(test)]
mod tests;
