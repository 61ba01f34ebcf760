//! What the environment asks of the log: `NVFIPC_DEBUG` (level), `NVFIPC_DEBUG_SUBSYS` (which
//! subsystems) and `NVFIPC_DEBUG_FILE` (where). Pure parsing, so every malformed value has a
//! tested message; the sink reports those messages as the log's first lines.

use super::Subsystem;
use log::LevelFilter;

/// Level variable: `OFF`, `WARN` (the default), `INFO`, `DEBUG` or `TRACE`, any case.
pub const LEVEL_VAR: &str = "NVFIPC_DEBUG";
/// Subsystem variable: a comma list of subsystems (`store,exchange`), `ALL`, or `^` followed by
/// a list to exclude (`^server,cuda`), as `NCCL_DEBUG_SUBSYS` reads.
pub const SUBSYS_VAR: &str = "NVFIPC_DEBUG_SUBSYS";
/// File variable: lines go to this file (appended) instead of stderr; `%h` is replaced by the
/// host name and `%p` by the pid, so each process of a job can have its own file. Only a regular
/// file (created 0600 when new) or a terminal is used, never through a symbolic link; anything
/// else is refused with a warning and the log stays on stderr (see `os::logfile`).
pub const FILE_VAR: &str = "NVFIPC_DEBUG_FILE";

/// The log's configuration as read from the environment.
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
    /// Reads the configuration through `lookup` (the process environment in production).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, host: &str, pid: u32) -> Self {
        let mut problems = Vec::new();
        let level = match lookup(LEVEL_VAR) {
            None => LevelFilter::Warn,
            Some(v) => parse_level(&v).unwrap_or_else(|| {
                problems.push(format!(
                    "{LEVEL_VAR}={v:?} is not a level (OFF, WARN, INFO, DEBUG or TRACE); \
                     logging at WARN"
                ));
                LevelFilter::Warn
            }),
        };
        let subsystems = match lookup(SUBSYS_VAR) {
            None => Subsystem::ALL_MASK,
            Some(v) => parse_subsystems(&v).unwrap_or_else(|bad| {
                problems.push(format!(
                    "{SUBSYS_VAR}={v:?}: {bad:?} is not a subsystem (one of {}, or ALL); \
                     logging every subsystem",
                    Subsystem::names().join(", ")
                ));
                Subsystem::ALL_MASK
            }),
        };
        let file = match lookup(FILE_VAR) {
            Some(v) if v.trim().is_empty() => {
                problems.push(format!("{FILE_VAR} is empty; logging to stderr"));
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
    let (exclude, list) = match text.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
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
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests;
