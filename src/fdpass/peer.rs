//! What a responder publishes ([`PeerRecord`]), which of a peer's sockets (abstract name, file in
//! [`private_socket_dir`]) an importer tries, and the scan that reclaims dead processes' sockets.

use super::diagnose::{Gate, Rung};
use super::frame::Secret;
use crate::node::{process_alive, NodeIdentity};
use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const RECORD_TAG: &str = "fdpass2";

/// What decides which of a peer's sockets and rungs can work from here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalIdentity {
    pub pid: u32,
    /// The kernel's boot id: the same kernel or not.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/net` (0 when unknown).
    pub net_ns: u64,
    /// Inode of `/proc/self/ns/pid` (0 when unknown).
    pub pid_ns: u64,
}

impl LocalIdentity {
    pub fn current() -> LocalIdentity {
        let node = NodeIdentity::local();
        LocalIdentity {
            pid: std::process::id(),
            boot_id: node.boot_id,
            // The calling thread's: a thread can have a network namespace of its own, and it is
            // the one its connect() uses.
            net_ns: std::fs::metadata("/proc/thread-self/ns/net")
                .or_else(|_| std::fs::metadata("/proc/self/ns/net"))
                .map_or(0, |m| m.ino()),
            pid_ns: node.pid_ns,
        }
    }
}

/// What each process publishes at `<prefix>/fdpass/<rank>` once its responder listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    pub who: LocalIdentity,
    /// Random per responder; every request must carry it. Public: part of the socket names.
    pub nonce: u64,
    /// Random per responder; every request must carry it. Secret: only in this record.
    pub secret: Secret,
    /// The abstract name without its leading NUL.
    pub abstract_name: String,
    /// The path socket, or why there is none (the directory could not be used).
    pub path: Result<PathBuf, String>,
    /// What the exporter did about Yama's `PR_SET_PTRACER`.
    pub ptracer: PtracerState,
}

/// What the exporter did about Yama for the `pidfd_getfd` rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtracerState {
    /// No Yama, or `ptrace_scope=0`: nothing to do.
    NotNeeded,
    /// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)` done (`NVFIPC_FD_PTRACER=any`).
    Any,
    /// Yama needs it and it was not granted (the default: `NVFIPC_FD_PTRACER` is not `any`).
    Refused,
    /// Yama needs it but the call failed.
    Failed,
}

impl PtracerState {
    /// In discriminant order.
    const NAMES: [(PtracerState, &'static str); 4] = [
        (PtracerState::NotNeeded, "unneeded"),
        (PtracerState::Any, "any"),
        (PtracerState::Refused, "refused"),
        (PtracerState::Failed, "failed"),
    ];

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize].1
    }

    fn parse(name: &str) -> Option<PtracerState> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(s, _)| *s)
    }
}

/// `;` separates fields and `=` keys from values: both (and `%`) are escaped in values.
fn escape(s: &str) -> String {
    s.replace('%', "%25")
        .replace(';', "%3B")
        .replace('=', "%3D")
}

fn unescape(s: &str) -> String {
    s.replace("%3D", "=")
        .replace("%3B", ";")
        .replace("%25", "%")
}

impl PeerRecord {
    pub fn encode(&self) -> String {
        let (path, path_error) = match &self.path {
            Ok(p) => (p.to_string_lossy().into_owned(), String::new()),
            Err(e) => (String::new(), e.clone()),
        };
        format!(
            "{RECORD_TAG};pid={};boot={};netns={};pidns={};nonce={:016x};secret={};abstract={};\
             path={};path_error={};ptracer={}",
            self.who.pid,
            escape(&self.who.boot_id),
            self.who.net_ns,
            self.who.pid_ns,
            self.nonce,
            self.secret.to_hex(),
            escape(&self.abstract_name),
            escape(&path),
            escape(&path_error),
            self.ptracer.as_str()
        )
    }

    /// Parses [`encode`](Self::encode)'s output; `None` for anything else.
    pub fn decode(text: &str) -> Option<PeerRecord> {
        let mut fields = text.split(';');
        if fields.next()? != RECORD_TAG {
            return None;
        }
        let fields: HashMap<&str, &str> =
            fields.map(|f| f.split_once('=')).collect::<Option<_>>()?;
        let get = |key: &str| fields.get(key).copied();
        let path = unescape(get("path")?);
        let path_error = get("path_error").map(unescape).unwrap_or_default();
        Some(PeerRecord {
            who: LocalIdentity {
                pid: get("pid")?.parse().ok()?,
                boot_id: unescape(get("boot")?),
                net_ns: get("netns")?.parse().ok()?,
                pid_ns: get("pidns")?.parse().ok()?,
            },
            nonce: u64::from_str_radix(get("nonce")?, 16).ok()?,
            secret: Secret::from_hex(get("secret")?)?,
            abstract_name: unescape(get("abstract")?),
            path: if path.is_empty() {
                Err(if path_error.is_empty() {
                    "the exporter published no socket path".to_string()
                } else {
                    path_error
                })
            } else {
                Ok(PathBuf::from(path))
            },
            ptracer: PtracerState::parse(get("ptracer")?)?,
        })
    }
}

/// The directory for this process's socket file: `dir` itself when only `uid` can enter it, else
/// `dir/nvfipc-<uid>`, created `0700` (a missing `dir` is created `0700` and used). Anything else
/// there (a symlink, a file, another user's directory) is refused, never used or removed (rules:
/// PROTOCOL.md section 7, "Trust boundary"); `Err` says why, for the published record.
pub fn private_socket_dir(dir: &Path, uid: u32) -> Result<PathBuf, String> {
    let private = |m: &std::fs::Metadata| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0;
    // The configured directory is followed if it is a symlink: whoever set it chose it.
    match std::fs::metadata(dir) {
        Ok(m) if private(&m) => return Ok(dir.to_path_buf()),
        Ok(m) if !m.is_dir() => return Err(refused(dir, "is not a directory", "one")),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| refused(dir, format!("cannot be created ({e})"), WRITABLE))
                .and_then(|()| private_socket_dir_checked(dir, uid));
        }
        Err(e) => return Err(refused(dir, format!("cannot be used ({e})"), OWN)),
    }
    let sub = dir.join(format!("nvfipc-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&sub) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refused(&sub, format!("cannot be created ({e})"), WRITABLE)),
    }
    private_socket_dir_checked(&sub, uid)
}

const WRITABLE: &str = "a writable directory";
const OWN: &str = "a directory of this user";

/// "the socket directory <dir> <why>: set NVFIPC_SOCKET_DIR to <fix>".
fn refused(dir: &Path, why: impl std::fmt::Display, fix: &str) -> String {
    let dir = dir.display();
    format!("the socket directory {dir} {why}: set NVFIPC_SOCKET_DIR to {fix}")
}

/// `dir` (not followed if a symlink) when it is a directory of `uid`, narrowed to `0700`.
fn private_socket_dir_checked(dir: &Path, uid: u32) -> Result<PathBuf, String> {
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("the socket directory {}: {e}", dir.display()))?;
    if !m.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory (a symlink or a file someone else put there): it is not \
             used; remove it, or set NVFIPC_SOCKET_DIR to a directory of this user",
            dir.display()
        ));
    }
    if m.uid() != uid {
        return Err(format!(
            "the socket directory {} belongs to uid {}, not to this process's uid {uid}: it is \
             not used; remove it, or set NVFIPC_SOCKET_DIR to a directory of this user",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            let why = format!("is open to other users and cannot be made 0700 ({e})");
            refused(dir, why, OWN)
        })?;
    }
    Ok(dir.to_path_buf())
}

/// Removes the sockets of `uid` in `dir` left by dead processes of this pid namespace (named as
/// [`crate::names::socket_path`] names them; symlinks not followed); returns how many.
pub fn reclaim_dead_sockets(dir: &Path, pid_ns: u64, uid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, ns)) = crate::names::socket_owner(&name.to_string_lossy()) else {
            continue;
        };
        if ns != pid_ns || pid_ns == 0 || process_alive(pid) {
            continue;
        }
        let ours = std::fs::symlink_metadata(entry.path())
            .is_ok_and(|m| m.file_type().is_socket() && m.uid() == uid);
        if ours {
            removed += usize::from(std::fs::remove_file(entry.path()).is_ok());
        }
    }
    removed
}

/// One way to reach a peer's responder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// An abstract name (without the leading NUL).
    Abstract(String),
    Path(PathBuf),
}

impl Route {
    pub fn rung(&self) -> Rung {
        match self {
            Route::Abstract(_) => Rung::Abstract,
            Route::Path(_) => Rung::Path,
        }
    }

    /// How messages name it: `@name` for an abstract socket (as `ss` shows them), else the path.
    pub fn describe(&self) -> String {
        match self {
            Route::Abstract(n) => format!("@{n}"),
            Route::Path(p) => p.display().to_string(),
        }
    }
}

/// Which of `peer`'s sockets to try from `local`, in order, given the enabled `rungs`; and, for
/// each socket rung that cannot work, the gate that rules it out.
pub fn socket_routes(
    local: &LocalIdentity,
    peer: &PeerRecord,
    rungs: &[Rung],
) -> (Vec<Route>, Vec<(Rung, String, Gate)>) {
    let abs = if local.net_ns != peer.who.net_ns || local.net_ns == 0 {
        Err(Gate::OtherNetNamespace {
            here: local.net_ns,
            there: peer.who.net_ns,
        })
    } else {
        Ok(Route::Abstract(peer.abstract_name.clone()))
    };
    let (path, path_name) = match &peer.path {
        Ok(p) => (Ok(Route::Path(p.clone())), p.display().to_string()),
        Err(why) => (Err(Gate::NoPath(why.clone())), "(no path)".to_string()),
    };
    let (mut routes, mut ruled_out) = (Vec::new(), Vec::new());
    let abs_name = format!("@{}", peer.abstract_name);
    for (rung, target, route) in [
        (Rung::Abstract, abs_name, abs),
        (Rung::Path, path_name, path),
    ] {
        let gate = if !rungs.contains(&rung) {
            Gate::Disabled
        } else if local.boot_id != peer.who.boot_id {
            Gate::OtherHost
        } else {
            match route {
                Ok(route) => {
                    routes.push(route);
                    continue;
                }
                Err(gate) => gate,
            }
        };
        ruled_out.push((rung, target, gate));
    }
    (routes, ruled_out)
}

/// Whether `pidfd_getfd` can name the peer from here: same kernel and same pid namespace.
pub fn pidfd_gate(local: &LocalIdentity, peer: &PeerRecord) -> Option<Gate> {
    if local.boot_id != peer.who.boot_id {
        Some(Gate::OtherHost)
    } else if local.pid_ns != peer.who.pid_ns || local.pid_ns == 0 {
        Some(Gate::OtherPidNamespace {
            here: local.pid_ns,
            there: peer.who.pid_ns,
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
