//! Where a process's responder listens, what it publishes about itself, and which socket an
//! importer tries for a given peer. Pure logic plus the directory scan that reclaims sockets of
//! dead processes.
//!
//! A responder listens on two sockets at once:
//! - an abstract name `\0nvfipc-<job>-<rank>-<nonce>`: no file, gone with the process, but it
//!   exists only inside one network namespace;
//! - a path `<dir>/nvfipc-<job>-<rank>-<pid>p<pidns>-<nonce>.sock` in the socket directory
//!   (`NVFIPC_SOCKET_DIR`, else `$XDG_RUNTIME_DIR`, else `/tmp`): reachable from any network
//!   namespace whose processes see the same directory (a shared mount). The file goes into a
//!   directory only its owner can enter: the socket directory itself when it is one (owned by
//!   this uid, no group or other permissions, as `$XDG_RUNTIME_DIR` is), else its subdirectory
//!   `nvfipc-<uid>`, created `0700` (see [`private_socket_dir`]).
//!
//! The importer reads the peer's [`PeerRecord`] and tries the abstract name only when both share
//! a kernel and a network namespace, then the path.

use super::diagnose::{Gate, Rung};
use super::frame::Secret;
use crate::node::{process_alive, NodeIdentity};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `sun_path` holds 108 bytes; a path name needs its NUL, an abstract name its leading NUL.
pub const MAX_SOCKET_NAME: usize = 107;
/// Job names longer than this are shortened (prefix + hash) inside socket names.
const MAX_JOB_IN_NAME: usize = 32;
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
    /// Whether the exporter let any process of its user attach (Yama `PR_SET_PTRACER`, only
    /// with `NVFIPC_FD_PTRACER=any`).
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
    pub fn as_str(self) -> &'static str {
        match self {
            PtracerState::NotNeeded => "unneeded",
            PtracerState::Any => "any",
            PtracerState::Refused => "refused",
            PtracerState::Failed => "failed",
        }
    }
    fn parse(s: &str) -> Option<PtracerState> {
        Some(match s {
            "unneeded" => PtracerState::NotNeeded,
            "any" => PtracerState::Any,
            "refused" => PtracerState::Refused,
            "failed" => PtracerState::Failed,
            _ => return None,
        })
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
        let (mut pid, mut boot, mut net, mut pidns, mut nonce) = (None, None, None, None, None);
        let mut secret = None;
        let (mut abs, mut path, mut path_error, mut ptracer) = (None, None, None, None);
        for field in fields {
            let (k, v) = field.split_once('=')?;
            match k {
                "pid" => pid = Some(v.parse().ok()?),
                "boot" => boot = Some(unescape(v)),
                "netns" => net = Some(v.parse().ok()?),
                "pidns" => pidns = Some(v.parse().ok()?),
                "nonce" => nonce = Some(u64::from_str_radix(v, 16).ok()?),
                "secret" => secret = Some(Secret::from_hex(v)?),
                "abstract" => abs = Some(unescape(v)),
                "path" => path = Some(unescape(v)),
                "path_error" => path_error = Some(unescape(v)),
                "ptracer" => ptracer = Some(PtracerState::parse(v)?),
                _ => {}
            }
        }
        let path = path?;
        let path_error = path_error.unwrap_or_default();
        Some(PeerRecord {
            who: LocalIdentity {
                pid: pid?,
                boot_id: boot?,
                net_ns: net?,
                pid_ns: pidns?,
            },
            nonce: nonce?,
            secret: secret?,
            abstract_name: abs?,
            path: if path.is_empty() {
                Err(if path_error.is_empty() {
                    "the exporter published no socket path".to_string()
                } else {
                    path_error
                })
            } else {
                Ok(PathBuf::from(path))
            },
            ptracer: ptracer?,
        })
    }
}

/// The job as it appears in socket names: `[A-Za-z0-9_.-]` kept, others `_`; long ones cut to a
/// prefix plus a hash of the whole.
pub fn job_in_name(job: &str) -> String {
    let clean: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_JOB_IN_NAME && !clean.is_empty() {
        return clean;
    }
    // FNV-1a of the original job: stable across processes and builds.
    let h = crate::fnv::fnv1a64(job.as_bytes());
    format!("{}~{:08x}", &clean[..clean.len().min(16)], h as u32)
}

/// The abstract socket name (without its leading NUL) of `rank`'s responder in `job`.
pub fn abstract_name(job: &str, rank: usize, nonce: u64) -> String {
    format!("nvfipc-{}-{rank}-{nonce:016x}", job_in_name(job))
}

/// The path of `rank`'s socket in `dir`, or why it cannot be one (too long for `sun_path`).
pub fn socket_path(
    dir: &Path,
    job: &str,
    rank: usize,
    who: &LocalIdentity,
    nonce: u64,
) -> Result<PathBuf, String> {
    let path = dir.join(format!(
        "nvfipc-{}-{rank}-{}p{}-{nonce:016x}.sock",
        job_in_name(job),
        who.pid,
        who.pid_ns
    ));
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_NAME {
        return Err(format!(
            "the socket path {} is {len} bytes, more than a Unix socket address holds \
             ({MAX_SOCKET_NAME}): set NVFIPC_SOCKET_DIR to a shorter directory",
            path.display()
        ));
    }
    Ok(path)
}

/// The pid and pid namespace in a socket file name made by [`socket_path`].
fn owner_of(file_name: &str) -> Option<(u32, u64)> {
    let stem = file_name.strip_prefix("nvfipc-")?.strip_suffix(".sock")?;
    let mut parts = stem.rsplitn(3, '-');
    let _nonce = parts.next()?;
    let (pid, pidns) = parts.next()?.split_once('p')?;
    Some((pid.parse().ok()?, pidns.parse().ok()?))
}

/// The directory that holds this process's socket file, given the configured socket directory
/// `dir`: `dir` itself when only `uid` can enter it (owned by `uid`, no group or other
/// permissions), else `dir/nvfipc-<uid>`, created `0700` (a missing `dir` is created `0700`
/// and used). A subdirectory that is not a real directory of `uid` (a symlink, a file, a
/// directory of another user planted in a shared `/tmp`) is refused, never used or removed;
/// one of `uid` with wider permissions is narrowed to `0700`. `Err` says why there is none,
/// for the published record.
pub fn private_socket_dir(dir: &Path, uid: u32) -> Result<PathBuf, String> {
    let private = |m: &std::fs::Metadata| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0;
    // The configured directory is followed if it is a symlink: whoever set it chose it.
    match std::fs::metadata(dir) {
        Ok(m) if private(&m) => return Ok(dir.to_path_buf()),
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "the socket directory {} is not a directory: set NVFIPC_SOCKET_DIR to one",
                dir.display()
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    format!(
                        "the socket directory {} cannot be created ({e}): set \
                         NVFIPC_SOCKET_DIR to a writable directory",
                        dir.display()
                    )
                })
                .and_then(|()| private_socket_dir_checked(dir, uid));
        }
        Err(e) => {
            return Err(format!(
                "the socket directory {} cannot be used ({e}): set NVFIPC_SOCKET_DIR to a \
                 directory of this user",
                dir.display()
            ))
        }
    }
    let sub = dir.join(format!("nvfipc-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&sub) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "the socket directory {} cannot be created ({e}): set NVFIPC_SOCKET_DIR to a \
                 writable directory",
                sub.display()
            ))
        }
    }
    private_socket_dir_checked(&sub, uid)
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
            format!(
                "the socket directory {} is open to other users and cannot be made 0700 \
                 ({e}): set NVFIPC_SOCKET_DIR to a directory of this user",
                dir.display()
            )
        })?;
    }
    Ok(dir.to_path_buf())
}

/// Removes the sockets in `dir` left by processes of this pid namespace that no longer exist
/// (killed before their exit handler ran): only sockets (not followed if symlinks) whose owner
/// is `uid`, named as [`socket_path`] names them. Returns how many were removed.
pub fn reclaim_dead_sockets(dir: &Path, pid_ns: u64, uid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, ns)) = owner_of(&name.to_string_lossy()) else {
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
    let mut routes = Vec::new();
    let mut ruled_out = Vec::new();
    let same_kernel = local.boot_id == peer.who.boot_id;
    let abs = format!("@{}", peer.abstract_name);
    if !rungs.contains(&Rung::Abstract) {
        ruled_out.push((Rung::Abstract, abs, Gate::Disabled));
    } else if !same_kernel {
        ruled_out.push((Rung::Abstract, abs, Gate::OtherHost));
    } else if local.net_ns != peer.who.net_ns || local.net_ns == 0 {
        ruled_out.push((
            Rung::Abstract,
            abs,
            Gate::OtherNetNamespace {
                here: local.net_ns,
                there: peer.who.net_ns,
            },
        ));
    } else {
        routes.push(Route::Abstract(peer.abstract_name.clone()));
    }
    let path_name = match &peer.path {
        Ok(p) => p.display().to_string(),
        Err(_) => "(no path)".to_string(),
    };
    if !rungs.contains(&Rung::Path) {
        ruled_out.push((Rung::Path, path_name, Gate::Disabled));
    } else if !same_kernel {
        ruled_out.push((Rung::Path, path_name, Gate::OtherHost));
    } else {
        match &peer.path {
            Ok(p) => routes.push(Route::Path(p.clone())),
            Err(why) => ruled_out.push((Rung::Path, path_name, Gate::NoPath(why.clone()))),
        }
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
mod tests {
    use super::*;

    fn me() -> LocalIdentity {
        LocalIdentity {
            pid: 100,
            boot_id: "boot-a".into(),
            net_ns: 4026531840,
            pid_ns: 4026531836,
        }
    }

    fn record(who: LocalIdentity) -> PeerRecord {
        PeerRecord {
            nonce: 0xfeed,
            secret: Secret(0x1234_5678_9abc_def0_0fed_cba9_8765_4321),
            abstract_name: abstract_name("job;1", 2, 0xfeed),
            path: socket_path(Path::new("/tmp"), "job;1", 2, &who, 0xfeed),
            who,
            ptracer: PtracerState::Any,
        }
    }

    const ALL: &[Rung] = &[Rung::Abstract, Rung::Path, Rung::Pidfd];

    #[test]
    fn records_round_trip_with_awkward_values() {
        let mut r = record(me());
        assert_eq!(PeerRecord::decode(&r.encode()), Some(r.clone()));
        r.who.boot_id = "a;b=c%d".into();
        r.path = Err("cannot create /x;y: Permission denied (os error 13)".into());
        r.ptracer = PtracerState::Refused;
        assert_eq!(PeerRecord::decode(&r.encode()), Some(r.clone()));
        let text = r.encode();
        assert!(
            text.contains("secret=123456789abcdef00fedcba987654321"),
            "{text}"
        );
        assert!(
            !format!("{r:?}").contains("123456789abcdef"),
            "Debug hides the secret"
        );
        // A record without its secret (an older version's) is not one of this version.
        let without: String = text
            .split(';')
            .filter(|f| !f.starts_with("secret="))
            .collect::<Vec<_>>()
            .join(";");
        assert_eq!(PeerRecord::decode(&without), None);
        assert_eq!(
            PeerRecord::decode(&text.replace("fdpass2", "fdpass1")),
            None
        );
        assert_eq!(PeerRecord::decode("fdpass2;pid=1"), None);
        assert_eq!(PeerRecord::decode("fdpass1;pid=x"), None);
        assert_eq!(PeerRecord::decode("fdpass1;pid=1"), None);
    }

    #[test]
    fn names_are_safe_short_and_per_job_rank_and_nonce() {
        assert_eq!(abstract_name("j", 3, 1), "nvfipc-j-3-0000000000000001");
        assert_eq!(job_in_name("a/b c"), "a_b_c");
        let long = "x".repeat(200);
        let short = job_in_name(&long);
        assert!(short.len() <= MAX_JOB_IN_NAME, "{short}");
        assert_ne!(short, job_in_name(&"x".repeat(201)));
        assert_ne!(abstract_name("j", 3, 1), abstract_name("j", 3, 2));
        assert_ne!(abstract_name("j", 3, 1), abstract_name("k", 3, 1));
        assert!(abstract_name(&long, usize::MAX, u64::MAX).len() < MAX_SOCKET_NAME);
        let p = socket_path(Path::new("/run/user/1000"), "job", 7, &me(), 0xab).unwrap();
        assert_eq!(
            p,
            Path::new("/run/user/1000/nvfipc-job-7-100p4026531836-00000000000000ab.sock")
        );
        assert_eq!(
            owner_of(&p.file_name().unwrap().to_string_lossy()),
            Some((100, 4026531836))
        );
        assert_eq!(owner_of("nvfipc-a-b-1-2.sock"), None);
        let deep = PathBuf::from(format!("/{}", "d".repeat(90)));
        let e = socket_path(&deep, "job", 7, &me(), 1).unwrap_err();
        assert!(e.contains("NVFIPC_SOCKET_DIR"), "{e}");
    }

    #[test]
    fn abstract_only_in_the_same_network_namespace() {
        let same = record(me());
        let (routes, out) = socket_routes(&me(), &same, ALL);
        assert_eq!(
            routes,
            vec![
                Route::Abstract(same.abstract_name.clone()),
                Route::Path(same.path.clone().unwrap())
            ]
        );
        assert!(out.is_empty());
        assert_eq!(pidfd_gate(&me(), &same), None);

        let other_net = record(LocalIdentity { net_ns: 1, ..me() });
        let (routes, out) = socket_routes(&me(), &other_net, ALL);
        assert_eq!(routes, vec![Route::Path(other_net.path.clone().unwrap())]);
        assert_eq!(out.len(), 1);
        assert!(matches!(out[0].2, Gate::OtherNetNamespace { there: 1, .. }));

        let other_pids = record(LocalIdentity { pid_ns: 5, ..me() });
        assert!(matches!(
            pidfd_gate(&me(), &other_pids),
            Some(Gate::OtherPidNamespace { there: 5, .. })
        ));

        let other_host = record(LocalIdentity {
            boot_id: "boot-b".into(),
            ..me()
        });
        let (routes, out) = socket_routes(&me(), &other_host, ALL);
        assert!(routes.is_empty());
        assert!(out.iter().all(|(_, _, g)| *g == Gate::OtherHost));
        assert_eq!(pidfd_gate(&me(), &other_host), Some(Gate::OtherHost));
    }

    #[test]
    fn disabled_rungs_and_missing_paths_are_reported() {
        let mut r = record(me());
        r.path = Err("no directory".into());
        let (routes, out) = socket_routes(&me(), &r, &[Rung::Path, Rung::Pidfd]);
        assert!(routes.is_empty());
        assert_eq!(
            out[0],
            (
                Rung::Abstract,
                format!("@{}", r.abstract_name),
                Gate::Disabled
            )
        );
        assert_eq!(out[1].2, Gate::NoPath("no directory".into()));
    }

    /// A socket file at `path`, left behind as a killed process leaves it.
    fn leftover_socket(path: &Path) {
        drop(std::os::unix::net::UnixListener::bind(path).unwrap());
        assert!(std::fs::symlink_metadata(path)
            .unwrap()
            .file_type()
            .is_socket());
    }

    fn temp_dir(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nvfipc-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const NOBODY: u32 = 65534;

    #[test]
    fn dead_owners_sockets_are_reclaimed_live_ones_and_others_files_kept() {
        let dir = temp_dir("naming");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let ns = me().pid_ns;
        let live = LocalIdentity::current();
        let uid = crate::os::fd_passing::effective_uid();
        let dead_id = LocalIdentity {
            pid: dead,
            ..live.clone()
        };
        let dead_path = socket_path(&dir, "j", 0, &dead_id, 1).unwrap();
        let live_path = socket_path(&dir, "j", 1, &live, 1).unwrap();
        let other_ns = socket_path(
            &dir,
            "j",
            2,
            &LocalIdentity {
                pid: dead,
                pid_ns: ns,
                ..live.clone()
            },
            1,
        )
        .unwrap();
        // Named like a dead process's socket, but a regular file, a symlink, or (when this runs
        // as root, as in CI) another user's socket: none of them is ours to remove.
        let plain = socket_path(&dir, "j", 3, &dead_id, 1).unwrap();
        let link = socket_path(&dir, "j", 4, &dead_id, 1).unwrap();
        let theirs = socket_path(&dir, "j", 5, &dead_id, 1).unwrap();
        for p in [&dead_path, &live_path, &other_ns, &theirs] {
            leftover_socket(p);
        }
        std::fs::write(&plain, b"").unwrap();
        std::os::unix::fs::symlink(&dead_path, &link).unwrap();
        let chowned = uid == 0 && std::os::unix::fs::chown(&theirs, Some(NOBODY), None).is_ok();
        let removed = reclaim_dead_sockets(&dir, live.pid_ns, uid);
        let other_ns_kept = live.pid_ns != ns;
        assert_eq!(
            removed,
            1 + usize::from(!other_ns_kept) + usize::from(!chowned)
        );
        assert!(!dead_path.exists() && live_path.exists());
        assert_eq!(other_ns.exists(), other_ns_kept);
        assert!(plain.exists(), "a regular file is not a socket");
        assert!(link.symlink_metadata().is_ok(), "a symlink is not followed");
        if chowned {
            assert!(theirs.exists(), "another uid's socket is kept");
        } else {
            println!("(not root: the other-uid case is not checked)");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn socket_files_go_where_only_their_owner_can_enter() {
        let uid = crate::os::fd_passing::effective_uid();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };

        // A private directory (as $XDG_RUNTIME_DIR is) is used as it is.
        let own = temp_dir("private");
        set(&own, 0o700);
        assert_eq!(private_socket_dir(&own, uid).unwrap(), own);

        // A shared one (as /tmp is) gets a subdirectory of this uid, 0700.
        let shared = temp_dir("shared");
        set(&shared, 0o1777);
        let sub = private_socket_dir(&shared, uid).unwrap();
        assert_eq!(sub, shared.join(format!("nvfipc-{uid}")));
        assert_eq!(mode(&sub), 0o700);
        // Found again; narrowed back to 0700 if someone widened it.
        set(&sub, 0o755);
        assert_eq!(private_socket_dir(&shared, uid).unwrap(), sub);
        assert_eq!(mode(&sub), 0o700);

        // A missing directory is created 0700 and used.
        let missing = own.join("a/b");
        assert_eq!(private_socket_dir(&missing, uid).unwrap(), missing);
        assert_eq!(mode(&missing), 0o700);

        // Planted by someone else in the shared directory: a symlink, a file, a directory of
        // another uid. None is used, none is removed.
        std::fs::remove_dir(&sub).unwrap();
        std::os::unix::fs::symlink(&own, &sub).unwrap();
        let e = private_socket_dir(&shared, uid).unwrap_err();
        assert!(
            e.contains("not a directory") && e.contains("NVFIPC_SOCKET_DIR"),
            "{e}"
        );
        assert!(sub.symlink_metadata().unwrap().file_type().is_symlink());
        std::fs::remove_file(&sub).unwrap();
        std::fs::write(&sub, b"").unwrap();
        assert!(private_socket_dir(&shared, uid).is_err());
        std::fs::remove_file(&sub).unwrap();
        if uid == 0 {
            std::fs::create_dir(&sub).unwrap();
            set(&sub, 0o777);
            std::os::unix::fs::chown(&sub, Some(NOBODY), Some(NOBODY)).unwrap();
            let e = private_socket_dir(&shared, uid).unwrap_err();
            assert!(e.contains("belongs to uid 65534"), "{e}");
            assert_eq!(mode(&sub), 0o777, "not touched");
        }
        // What it refuses becomes the record's path error; the socket name there stays short.
        let e = private_socket_dir(&own.join("f"), uid);
        assert!(e.is_ok());
        std::fs::write(own.join("file"), b"").unwrap();
        let e = private_socket_dir(&own.join("file"), uid).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let long_job = "j".repeat(200);
        let p = socket_path(
            &PathBuf::from("/tmp/nvfipc-4294967294"),
            &long_job,
            99_999,
            &LocalIdentity {
                pid: 4_194_304,
                pid_ns: u64::from(u32::MAX),
                ..me()
            },
            u64::MAX,
        );
        assert!(p.is_ok(), "{p:?}");
        let _ = std::fs::remove_dir_all(&own);
        let _ = std::fs::remove_dir_all(&shared);
    }
}
