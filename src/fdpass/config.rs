//! The fd transport's settings, from the environment or set by hand.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `NVFIPC_SOCKET_DIR` | directory of the path sockets; `none` for no path socket | `$XDG_RUNTIME_DIR`, else `/tmp` |
//! | `NVFIPC_FD_RUNGS` | rungs an importer tries, in order, comma-separated | `abstract,path,pidfd` |
//! | `NVFIPC_FD_PTRACER` | `any`: under Yama `ptrace_scope=1`, let any process of this user attach (`PR_SET_PTRACER_ANY`) so that the pidfd rung can work; `none`: never (Yama cannot name a job's pids, so granting is an explicit choice) | `none` |

use super::diagnose::Rung;
use crate::error::{Error, Result};
use std::path::PathBuf;
use std::time::Duration;

pub const SOCKET_DIR_VAR: &str = "NVFIPC_SOCKET_DIR";
pub const RUNGS_VAR: &str = "NVFIPC_FD_RUNGS";
pub const PTRACER_VAR: &str = "NVFIPC_FD_PTRACER";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdPassConfig {
    /// Where the path socket goes; `None`: abstract socket only.
    pub socket_dir: Option<PathBuf>,
    /// Rungs the importer tries, in this order ([`Rung::Fabric`] is ignored here: the VMM
    /// transport tries it).
    pub rungs: Vec<Rung>,
    /// Under Yama `ptrace_scope=1`, call `PR_SET_PTRACER_ANY` when the responder starts (off
    /// by default: it lets every process of this user attach, not only the job's).
    pub allow_ptracer: bool,
    /// How long an importer keeps retrying to connect to one socket (within its own timeout)
    /// before it moves to the next rung.
    pub connect_retry: Duration,
    /// A responder closes a connection that has been silent this long.
    pub idle_timeout: Duration,
    /// Connections a responder serves at once; more are answered "busy" and closed.
    pub max_connections: usize,
}

impl Default for FdPassConfig {
    fn default() -> Self {
        FdPassConfig {
            socket_dir: Some(default_socket_dir()),
            rungs: vec![Rung::Abstract, Rung::Path, Rung::Pidfd],
            allow_ptracer: false,
            connect_retry: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}

fn default_socket_dir() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

impl FdPassConfig {
    pub fn from_env() -> Result<FdPassConfig> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<FdPassConfig> {
        let mut config = FdPassConfig::default();
        if let Some(dir) = lookup(SOCKET_DIR_VAR).filter(|s| !s.is_empty()) {
            config.socket_dir = if dir == "none" {
                None
            } else if !dir.starts_with('/') {
                return Err(Error::invalid(format!(
                    "{SOCKET_DIR_VAR}={dir:?} is not an absolute path: give a directory every \
                     rank of the node can reach by one path, or `none`"
                )));
            } else {
                Some(PathBuf::from(dir))
            };
        }
        if let Some(list) = lookup(RUNGS_VAR).filter(|s| !s.trim().is_empty()) {
            let mut rungs = Vec::new();
            for name in list.split(',') {
                let rung = Rung::parse(name).ok_or_else(|| {
                    Error::invalid(format!(
                        "{RUNGS_VAR}={list:?}: {name:?} is not a rung; use a comma-separated \
                         list of abstract, path, pidfd, fabric"
                    ))
                })?;
                if !rungs.contains(&rung) {
                    rungs.push(rung);
                }
            }
            config.rungs = rungs;
        }
        if let Some(v) = lookup(PTRACER_VAR).filter(|s| !s.is_empty()) {
            config.allow_ptracer = match v.as_str() {
                "any" => true,
                "none" => false,
                _ => {
                    return Err(Error::invalid(format!(
                        "{PTRACER_VAR}={v:?}: use `none` (the default) or `any` (under Yama \
                         ptrace_scope=1, let any process of this user attach, for the pidfd \
                         rung)"
                    )))
                }
            };
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests;
