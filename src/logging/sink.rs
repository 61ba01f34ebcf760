//! The logger behind the `log` facade: formats one line per event and writes it whole to
//! stderr, the configured file, or the host's callback.

use super::config::LogConfig;
use super::Subsystem;
use crate::sync::lock;
use log::{Level, LevelFilter, Log, Metadata, Record};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, RwLock};
use std::time::SystemTime;

/// Receives each line (without its newline) instead of stderr or the file. Called from any
/// thread of the library, the releaser's and the store server's included.
pub type LineCallback = Arc<dyn Fn(Level, Subsystem, &str) + Send + Sync>;

struct Sink {
    subsystems: AtomicU32,
    /// Rank of this process once a context or cache knows it; -1 before.
    rank: AtomicI64,
    host: String,
    pid: u32,
    file: Mutex<Option<File>>,
    callback: RwLock<Option<LineCallback>>,
}

static SINK: OnceLock<Sink> = OnceLock::new();
static INIT: Once = Once::new();

struct Logger;
static LOGGER: Logger = Logger;

pub(super) fn init_once() {
    INIT.call_once(|| {
        let host = crate::os::process::host_name();
        let pid = std::process::id();
        let LogConfig {
            level,
            subsystems,
            file,
            mut problems,
        } = LogConfig::from_lookup(|k| std::env::var(k).ok(), &host, pid);
        // Never blocks (a FIFO with no reader) and never follows a link planted at a
        // predictable `%h`/`%p` name: see `os::logfile`. A refused file leaves the log on stderr.
        let file = file.and_then(|path| {
            crate::os::logfile::open_append(&path)
                .map_err(|refused| {
                    problems.push(format!(
                        "{}={path:?} is not used: {}; logging to stderr",
                        super::config::FILE_VAR,
                        refused.0
                    ))
                })
                .ok()
        });
        let _ = SINK.set(Sink {
            subsystems: AtomicU32::new(subsystems),
            rank: AtomicI64::new(-1),
            host,
            pid,
            file: Mutex::new(file),
            callback: RwLock::new(None),
        });
        // Another logger already installed (the library linked as an rlib into a program with
        // its own): that one receives our lines and its level rules.
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(level);
        }
        for p in problems {
            log::warn!(target: super::STORE, "{p}");
        }
    });
}

fn sink() -> Option<&'static Sink> {
    SINK.get()
}

/// Records this process's rank for the lines' prefix (the last context or cache created wins).
pub fn set_rank(rank: i64) {
    init_once();
    if let Some(s) = sink() {
        s.rank.store(rank, Ordering::Relaxed);
    }
}

/// Sets the most verbose level written, overriding `NVFIPC_DEBUG`.
pub fn set_level(level: LevelFilter) {
    init_once();
    log::set_max_level(level);
}

/// Sends lines to `callback` instead of stderr or the file; `None` restores them. A line being
/// written while the callback is replaced may still reach the previous one.
pub fn set_callback(callback: Option<LineCallback>) {
    init_once();
    if let Some(s) = sink() {
        *s.callback.write().unwrap_or_else(|p| p.into_inner()) = callback;
    }
}

thread_local! {
    static TID: i64 = os_thread_id();
}

fn os_thread_id() -> i64 {
    crate::os::process::thread_id()
}

impl Log for Logger {
    fn enabled(&self, meta: &Metadata) -> bool {
        let Some(s) = sink() else { return false };
        match Subsystem::from_target(meta.target()) {
            Some(sub) => s.subsystems.load(Ordering::Relaxed) & sub.bit() != 0,
            // Dependencies' lines only at WARN and above, whatever the subsystem filter.
            None => meta.level() <= Level::Warn,
        }
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let Some(s) = sink() else { return };
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
        let mut file = lock(&s.file);
        match file.as_mut() {
            Some(f) => {
                let _ = f.write_all(&bytes);
            }
            None => {
                let _ = std::io::stderr().write_all(&bytes);
            }
        }
    }

    fn flush(&self) {
        if let Some(s) = sink() {
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
    let tid = TID.with(|t| *t);
    let rank = s.rank.load(Ordering::Relaxed);
    let rank = if rank >= 0 {
        format!(" [rank {rank}]")
    } else {
        String::new()
    };
    let what: &str = match sub {
        Some(sub) => sub.name(),
        None => target,
    };
    format!(
        "{time} {}:{}:{tid}{rank} NVFIPC {level} {what}: {args}",
        s.host, s.pid
    )
}

#[cfg(test)]
mod tests;
