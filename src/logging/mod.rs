//! Logs a user can turn on: `NVFIPC_DEBUG=INFO` (or `TRACE`) explains which channel waited on
//! which peer, which keys went to the store, which handles were opened or released and how long
//! each step took, one line per event.
//!
//! Built on the `log` facade: a disabled call site costs one relaxed atomic load (the facade's
//! max level), so the warm exchange path pays nothing when the log is off. In the cdylib the
//! facade is private to this library, so a host program's own Rust logging cannot clash with it.
//! Library code logs with `log::info!(target: logging::EXCHANGE, ...)`; the target names the
//! subsystem that `NVFIPC_DEBUG_SUBSYS` filters on. Lines go to stderr, to `NVFIPC_DEBUG_FILE`,
//! or to a callback the host program installs (`nvfipc_log_set_callback`).

pub mod config;
mod sink;

pub use config::LogConfig;
pub use log::Level;
pub use sink::{set_callback, set_level, set_rank, LineCallback};

/// Targets of the library's log lines, one per subsystem.
pub const STORE: &str = "nvfipc::store";
pub const BARRIER: &str = "nvfipc::barrier";
pub const EXCHANGE: &str = "nvfipc::exchange";
pub const CUDA: &str = "nvfipc::cuda";
pub const HOST: &str = "nvfipc::host";
pub const SERVER: &str = "nvfipc::server";

/// A part of the library whose lines can be selected with `NVFIPC_DEBUG_SUBSYS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Subsystem {
    /// Store client traffic: connections, keys set and read, waits.
    Store = 0,
    /// Barriers: arrivals, releases, who is missing.
    Barrier = 1,
    /// The handle exchange: channels, steps, versions, records, opens and releases.
    Exchange = 2,
    /// The CUDA transport: driver loading, IPC export/open/close, the releaser.
    Cuda = 3,
    /// The host transport: shared-memory segments and their cleanup.
    Host = 4,
    /// The embedded store server: connections accepted and refused, limits, bad frames.
    Server = 5,
}

impl Subsystem {
    pub const ALL: [Subsystem; 6] = [
        Subsystem::Store,
        Subsystem::Barrier,
        Subsystem::Exchange,
        Subsystem::Cuda,
        Subsystem::Host,
        Subsystem::Server,
    ];
    pub const ALL_MASK: u32 = (1 << Self::ALL.len()) - 1;

    pub fn name(self) -> &'static str {
        match self {
            Subsystem::Store => "store",
            Subsystem::Barrier => "barrier",
            Subsystem::Exchange => "exchange",
            Subsystem::Cuda => "cuda",
            Subsystem::Host => "host",
            Subsystem::Server => "server",
        }
    }

    pub fn target(self) -> &'static str {
        match self {
            Subsystem::Store => STORE,
            Subsystem::Barrier => BARRIER,
            Subsystem::Exchange => EXCHANGE,
            Subsystem::Cuda => CUDA,
            Subsystem::Host => HOST,
            Subsystem::Server => SERVER,
        }
    }

    pub fn bit(self) -> u32 {
        1 << self as u32
    }

    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|s| s.name()).collect()
    }

    pub fn from_name(name: &str) -> Option<Subsystem> {
        Self::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    /// The subsystem of a log target; `None` for targets outside this library (dependencies).
    pub fn from_target(target: &str) -> Option<Subsystem> {
        Self::ALL.into_iter().find(|s| s.target() == target)
    }
}

/// Reads the environment and installs the library's logger, once per process; later calls cost
/// one atomic load. Called by every constructor that can be a process's first call into the
/// library (contexts, stores, servers, caches, transports).
pub fn init() {
    sink::init_once();
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
