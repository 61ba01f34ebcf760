//! The log `NVFIPC_DEBUG=INFO` (or `TRACE`) turns on: one line per event (which channel waited on
//! which peer, which keys went to the store, which handles were opened or released, how long each
//! step took), to stderr, `NVFIPC_DEBUG_FILE` or the host's callback (`nvfipc_log_set_callback`).
//! Built on the `log` facade (private to the cdylib): a disabled call site costs one relaxed
//! atomic load, so the warm exchange path pays nothing. Code logs with `log::info!(target:
//! logging::EXCHANGE, ...)`; the target is the subsystem `NVFIPC_DEBUG_SUBSYS` filters on.

mod config;

use crate::config::DEBUG_FILE_VAR;
use crate::sync::lock;
use config::LogConfig;
pub use config::{Subsystem, BARRIER, CUDA, EXCHANGE, HOST, STORE};
pub use log::Level;
use log::{LevelFilter, Log, Metadata, Record};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

/// Receives each line (without its newline) instead of stderr or the file. Called from any
/// thread of the library, the releaser's and the store server's included.
pub type LineCallback = Arc<dyn Fn(Level, Subsystem, &str) + Send + Sync>;

/// The logger behind the `log` facade: formats one line per event and writes it whole to
/// stderr, the configured file, or the host's callback.
struct Logger {
    sink: OnceLock<Sink>,
}

/// The installed logger's output and settings (see [`init`]).
pub struct Sink {
    subsystems: AtomicU32,
    /// Rank of this process once a context or cache knows it; -1 before.
    rank: AtomicI64,
    host: String,
    pid: u32,
    file: Mutex<Option<File>>,
    callback: RwLock<Option<LineCallback>>,
    /// Malformed settings, written once as the log's first lines.
    problems: Mutex<Vec<String>>,
}

// process-wide: the `log` facade takes one &'static logger per process.
static LOGGER: Logger = Logger {
    sink: OnceLock::new(),
};

/// Reads the environment and installs the library's logger, once per process. Called by every
/// constructor that can be a process's first call into the library.
pub fn init() -> &'static Sink {
    let sink = LOGGER.sink.get_or_init(|| {
        let host = crate::os::process::host_name();
        let pid = std::process::id();
        let LogConfig {
            level,
            subsystems,
            file,
            mut problems,
        } = LogConfig::from_env(&host, pid);
        // Never blocks (a FIFO with no reader) and never follows a link planted at a
        // predictable `%h`/`%p` name: see `os::logfile`. A refused file leaves the log on stderr.
        let file = file.and_then(|path| {
            crate::os::logfile::open_append(&path)
                .map_err(|refused| {
                    problems.push(format!(
                        "{DEBUG_FILE_VAR}={path:?} is not used: {}; logging to stderr",
                        refused.0
                    ))
                })
                .ok()
        });
        // Another logger already installed (the library linked as an rlib into a program with
        // its own): that one receives our lines and its level rules.
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(level);
        }
        Sink {
            subsystems: AtomicU32::new(subsystems),
            rank: AtomicI64::new(-1),
            host,
            pid,
            file: Mutex::new(file),
            callback: RwLock::new(None),
            problems: Mutex::new(problems),
        }
    });
    let problems = std::mem::take(&mut *lock(&sink.problems));
    for p in problems {
        log::warn!(target: STORE, "{p}");
    }
    sink
}

/// Records this process's rank for the lines' prefix (the last context or cache created wins).
pub fn set_rank(rank: i64) {
    init().rank.store(rank, Ordering::Relaxed);
}

/// Sets the most verbose level written, overriding `NVFIPC_DEBUG`.
pub fn set_level(level: LevelFilter) {
    init();
    log::set_max_level(level);
}

/// Sends lines to `callback` instead of stderr or the file; `None` restores them. A line being
/// written while the callback is replaced may still reach the previous one.
pub fn set_callback(callback: Option<LineCallback>) {
    *init().callback.write().unwrap_or_else(|p| p.into_inner()) = callback;
}

impl Log for Logger {
    fn enabled(&self, meta: &Metadata) -> bool {
        let Some(s) = self.sink.get() else {
            return false;
        };
        match Subsystem::from_target(meta.target()) {
            Some(sub) => s.subsystems.load(Ordering::Relaxed) & sub.bit() != 0,
            // Dependencies' lines only at WARN and above, whatever the subsystem filter.
            None => meta.level() <= Level::Warn,
        }
    }

    fn log(&self, record: &Record) {
        let Some(s) = self.sink.get().filter(|_| self.enabled(record.metadata())) else {
            return;
        };
        let sub = Subsystem::from_target(record.target());
        let line = format_line(s, record.level(), sub, record.target(), record.args());
        let callback = s.callback.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let (Some(cb), Some(sub)) = (callback, sub) {
            cb(record.level(), sub, &line);
            return;
        }
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        // One write per line, so lines of concurrent threads and processes never interleave.
        let _ = match lock(&s.file).as_mut() {
            Some(f) => f.write_all(&bytes),
            None => std::io::stderr().write_all(&bytes),
        };
    }

    fn flush(&self) {
        if let Some(s) = self.sink.get() {
            if let Some(f) = lock(&s.file).as_mut() {
                let _ = f.flush();
            }
        }
    }
}

fn format_line(
    s: &Sink,
    level: Level,
    sub: Option<Subsystem>,
    target: &str,
    args: &std::fmt::Arguments,
) -> String {
    let time = humantime::format_rfc3339_micros(SystemTime::now());
    let tid = crate::os::process::thread_id();
    let rank = match s.rank.load(Ordering::Relaxed) {
        r if r >= 0 => format!(" [rank {r}]"),
        _ => String::new(),
    };
    let what = sub.map_or(target, |s| s.name());
    format!(
        "{time} {}:{}:{tid}{rank} NVFIPC {level} {what}: {args}",
        s.host, s.pid
    )
}

/// The clock, read only when a line of `target` at `level` will be written (so a site whose
/// line is off pays one atomic load, not a clock read).
pub fn clock(target: &str, level: Level) -> Option<std::time::Instant> {
    log::log_enabled!(target: target, level).then(std::time::Instant::now)
}

/// The time since `start` for a line ("?" when the clock was not read).
pub fn since(start: Option<std::time::Instant>) -> String {
    start.map_or_else(|| "?".to_string(), |t| took(t.elapsed()))
}

/// A duration for a log line, in the unit that keeps it short: `33.5us`, `12.3ms`, `2.50s`.
pub fn took(d: std::time::Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.1}us")
    } else if us < 10_000_000.0 {
        format!("{:.1}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

#[cfg(test)]
mod tests;
