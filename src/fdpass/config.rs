//! The fd transport's settings (`NVFIPC_SOCKET_DIR`, `NVFIPC_FD_RUNGS`, `NVFIPC_FD_PTRACER`,
//! `NVFIPC_TRUSTED_UIDS`, named in `crate::config`), its trust boundary and its rungs.

use crate::config::{process_env_utf8, PTRACER_VAR, RUNGS_VAR, SOCKET_DIR_VAR, TRUSTED_UIDS_VAR};
use crate::error::{Error, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Most uids [`TRUSTED_UIDS_VAR`] may name.
const MAX_TRUSTED_UIDS: usize = 64;

/// The uids whose processes are inside a job's trust boundary (docs/PROTOCOL.md section 7,
/// "Trust boundary"): this process's effective uid, and those [`TRUSTED_UIDS_VAR`] adds for a
/// job whose ranks run as several users. The kernel's word about a peer (`SO_PEERCRED`, a file's
/// owner, a board's owner) is checked against it; nothing read from the store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedUids {
    own: u32,
    extra: Vec<u32>,
}

impl TrustedUids {
    /// This process's effective uid alone.
    pub fn own() -> TrustedUids {
        TrustedUids {
            own: crate::os::fd_passing::effective_uid(),
            extra: Vec::new(),
        }
    }

    /// Reads [`TRUSTED_UIDS_VAR`] from the process environment.
    pub fn from_env() -> Result<TrustedUids> {
        Self::from_lookup(crate::os::fd_passing::effective_uid(), process_env_utf8)
    }

    /// `own` and the comma-separated uids of [`TRUSTED_UIDS_VAR`] in `lookup`.
    pub fn from_lookup(own: u32, lookup: impl Fn(&str) -> Option<String>) -> Result<TrustedUids> {
        let mut extra = Vec::new();
        let Some(list) = lookup(TRUSTED_UIDS_VAR).filter(|s| !s.trim().is_empty()) else {
            return Ok(TrustedUids { own, extra });
        };
        for item in list.split(',').map(str::trim) {
            let uid = item.parse::<u32>().ok().filter(|&u| u != u32::MAX);
            let Some(uid) = uid else {
                return Err(Error::invalid(format!(
                    "{TRUSTED_UIDS_VAR}={list:?}: {item:?} is not a uid; give the numeric uids \
                     of the job's other users, comma-separated (e.g. 1001,1002)"
                )));
            };
            if uid != own && !extra.contains(&uid) {
                extra.push(uid);
            }
        }
        if extra.len() > MAX_TRUSTED_UIDS {
            return Err(Error::invalid(format!(
                "{TRUSTED_UIDS_VAR} names {} uids; at most {MAX_TRUSTED_UIDS} are allowed",
                extra.len()
            )));
        }
        Ok(TrustedUids { own, extra })
    }

    /// Whether a process (or file) of `uid` is inside the boundary.
    pub fn admits(&self, uid: u32) -> bool {
        uid == self.own || self.extra.contains(&uid)
    }

    /// This process's effective uid.
    pub fn own_uid(&self) -> u32 {
        self.own
    }

    /// The admitted uids for messages: `uid 1000`, or `uids 1000, 1001 (NVFIPC_TRUSTED_UIDS)`.
    pub fn describe(&self) -> String {
        if self.extra.is_empty() {
            return format!("uid {}", self.own);
        }
        let all: Vec<String> = std::iter::once(self.own)
            .chain(self.extra.iter().copied())
            .map(|u| u.to_string())
            .collect();
        format!("uids {} ({TRUSTED_UIDS_VAR})", all.join(", "))
    }
}

/// The fd transport's settings, from the environment or set by hand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdPassConfig {
    /// Where the path socket goes; `None`: abstract socket only.
    pub socket_dir: Option<PathBuf>,
    /// Rungs the importer tries, in order ([`Rung::Fabric`] is the VMM transport's).
    pub rungs: Vec<Rung>,
    /// [`PTRACER_VAR`]: off by default, it lets every process of this user attach.
    pub allow_ptracer: bool,
    /// How long an importer retries connecting to one socket before the next rung.
    pub connect_retry: Duration,
    /// A responder closes a connection that has been silent this long.
    pub idle_timeout: Duration,
    /// Connections a responder serves at once; more are answered "busy" and closed.
    pub max_connections: usize,
    /// Whose processes a responder serves and an importer accepts descriptors from.
    pub trusted: TrustedUids,
}

impl Default for FdPassConfig {
    fn default() -> Self {
        FdPassConfig {
            // `$XDG_RUNTIME_DIR` when it is an absolute directory, else `/tmp`.
            socket_dir: std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute() && p.is_dir())
                .or_else(|| Some(PathBuf::from("/tmp"))),
            rungs: vec![Rung::Abstract, Rung::Path, Rung::Pidfd],
            allow_ptracer: false,
            connect_retry: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(30),
            max_connections: 1024,
            trusted: TrustedUids::own(),
        }
    }
}

impl FdPassConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<FdPassConfig> {
        Self::from_lookup(process_env_utf8)
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<FdPassConfig> {
        let mut config = FdPassConfig {
            trusted: TrustedUids::from_lookup(crate::os::fd_passing::effective_uid(), &lookup)?,
            ..FdPassConfig::default()
        };
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

/// One way to obtain a peer's descriptor, in the order they are tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rung {
    /// The peer's responder on its abstract socket (same network namespace only).
    Abstract,
    /// The peer's responder on its socket file in the socket directory.
    Path,
    /// `pidfd_open` + `pidfd_getfd` (ptrace rights over the peer).
    Pidfd,
    /// A CUDA FABRIC handle: not an fd; the VMM transport tries it and adds its outcome.
    Fabric,
}

/// Each rung (in discriminant order) with its name (in `NVFIPC_FD_RUNGS`) and its title.
const RUNGS: [(Rung, &str, &str); 4] = [
    (Rung::Abstract, "abstract", "abstract socket"),
    (Rung::Path, "path", "socket path"),
    (Rung::Pidfd, "pidfd", "pidfd_getfd"),
    (Rung::Fabric, "fabric", "FABRIC handle"),
];

impl Rung {
    pub fn name(self) -> &'static str {
        RUNGS[self as usize].1
    }

    pub fn parse(s: &str) -> Option<Rung> {
        RUNGS
            .iter()
            .find(|(_, name, _)| *name == s.trim())
            .map(|(r, ..)| *r)
    }

    pub(crate) fn title(self) -> &'static str {
        RUNGS[self as usize].2
    }
}

#[cfg(test)]
mod tests;
