//! The log's configuration (`NVFIPC_DEBUG`, `NVFIPC_DEBUG_SUBSYS`, `NVFIPC_DEBUG_FILE`, named in
//! `crate::config`) and its vocabulary of subsystems.

use crate::config::{process_env_utf8, DEBUG_FILE_VAR, DEBUG_SUBSYS_VAR, DEBUG_VAR};
use log::LevelFilter;

/// The log's configuration; malformed values become the log's first lines, not errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    pub level: LevelFilter,
    /// Bit `Subsystem as u32` set: that subsystem's lines are written.
    pub subsystems: u32,
    /// The file, with `%h`/`%p` already expanded; `None`: stderr.
    pub file: Option<String>,
    /// Malformed values, one message each, written as WARN lines once the sink exists.
    pub problems: Vec<String>,
}

impl LogConfig {
    /// Reads the process environment.
    pub fn from_env(host: &str, pid: u32) -> Self {
        Self::from_lookup(process_env_utf8, host, pid)
    }

    /// Reads the configuration through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, host: &str, pid: u32) -> Self {
        let mut problems = Vec::new();
        let level = match lookup(DEBUG_VAR) {
            None => LevelFilter::Warn,
            Some(v) => parse_level(&v).unwrap_or_else(|| {
                problems.push(format!(
                    "{DEBUG_VAR}={v:?} is not a level (OFF, WARN, INFO, DEBUG or TRACE); \
                     logging at WARN"
                ));
                LevelFilter::Warn
            }),
        };
        let subsystems = match lookup(DEBUG_SUBSYS_VAR) {
            None => Subsystem::ALL_MASK,
            Some(v) => parse_subsystems(&v).unwrap_or_else(|bad| {
                problems.push(format!(
                    "{DEBUG_SUBSYS_VAR}={v:?}: {bad:?} is not a subsystem (one of {}, or ALL); \
                     logging every subsystem",
                    Subsystem::ALL.map(Subsystem::name).join(", ")
                ));
                Subsystem::ALL_MASK
            }),
        };
        let file = match lookup(DEBUG_FILE_VAR) {
            Some(v) if v.trim().is_empty() => {
                problems.push(format!("{DEBUG_FILE_VAR} is empty; logging to stderr"));
                None
            }
            Some(v) => Some(expand_path(&v, host, pid)),
            None => None,
        };
        LogConfig {
            level,
            subsystems,
            file,
            problems,
        }
    }
}

/// Parses a level name; `None` when it is not one.
pub fn parse_level(text: &str) -> Option<LevelFilter> {
    match text.trim().to_ascii_uppercase().as_str() {
        "OFF" | "NONE" => Some(LevelFilter::Off),
        "WARN" | "WARNING" => Some(LevelFilter::Warn),
        "INFO" => Some(LevelFilter::Info),
        "DEBUG" => Some(LevelFilter::Debug),
        "TRACE" => Some(LevelFilter::Trace),
        _ => None,
    }
}

/// Parses a subsystem list into a mask; `Err` names the first unknown entry.
pub fn parse_subsystems(text: &str) -> Result<u32, String> {
    let text = text.trim();
    let list = text.strip_prefix('^').unwrap_or(text);
    let exclude = list.len() < text.len();
    let mut mask = 0u32;
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name.eq_ignore_ascii_case("all") {
            mask |= Subsystem::ALL_MASK;
            continue;
        }
        match Subsystem::from_name(name) {
            Some(s) => mask |= s.bit(),
            None => return Err(name.to_string()),
        }
    }
    Ok(if exclude {
        Subsystem::ALL_MASK & !mask
    } else {
        mask
    })
}

/// Expands `%h` (host name) and `%p` (pid) in a log file path; `%%` is a literal `%`.
pub fn expand_path(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match (c == '%').then(|| chars.next()).flatten() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') | None => out.push(c),
            Some(other) => out.extend(['%', other]),
        }
    }
    out
}

/// Targets of the library's log lines, one per subsystem.
pub const STORE: &str = nvfipc_store::CLIENT_LOG_TARGET;
pub const BARRIER: &str = "nvfipc::barrier";
pub const EXCHANGE: &str = "nvfipc::exchange";
pub const CUDA: &str = "nvfipc::cuda";
pub const HOST: &str = "nvfipc::host";
pub const SERVER: &str = nvfipc_store::SERVER_LOG_TARGET;

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

    /// `store`, `barrier`, ...: the target without its `nvfipc::`.
    pub fn name(self) -> &'static str {
        &self.target()["nvfipc::".len()..]
    }

    pub fn target(self) -> &'static str {
        [STORE, BARRIER, EXCHANGE, CUDA, HOST, SERVER][self as usize]
    }

    pub fn bit(self) -> u32 {
        1 << self as u32
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

#[cfg(test)]
mod tests;
