//! Where a process's responder listens, what it publishes about itself, and which socket an
//! importer tries for a given peer. Pure logic plus the directory scan that reclaims sockets of
//! dead processes.
//!
//! A responder listens on two sockets at once:
//! - an abstract name `\0nvfipc-<job>-<rank>-<nonce>`: no file, gone with the process, but it
//!   exists only inside one network namespace;
//! - a path `<dir>/nvfipc-<job>-<rank>-<pid>p<pidns>-<nonce>.sock` in the socket directory
//!   (`NVFIPC_SOCKET_DIR`, else `$XDG_RUNTIME_DIR`, else `/tmp`): reachable from any network
//!   namespace whose processes see the same directory (a shared mount).
//!
//! The importer reads the peer's [`PeerRecord`] and tries the abstract name only when both share
//! a kernel and a network namespace, then the path.

use super::diagnose::{Gate, Rung};
use crate::node::{process_alive, NodeIdentity};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `sun_path` holds 108 bytes; a path name needs its NUL, an abstract name its leading NUL.
pub const MAX_SOCKET_NAME: usize = 107;
/// Job names longer than this are shortened (prefix + hash) inside socket names.
const MAX_JOB_IN_NAME: usize = 32;
const RECORD_TAG: &str = "fdpass1";

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
    /// Random per responder; every request must carry it.
    pub nonce: u64,
    /// The abstract name without its leading NUL.
    pub abstract_name: String,
    /// The path socket, or why there is none (the directory could not be used).
    pub path: Result<PathBuf, String>,
    /// Whether the exporter let any process of its user attach (Yama `PR_SET_PTRACER`).
    pub ptracer: PtracerState,
}

/// What the exporter did about Yama for the `pidfd_getfd` rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtracerState {
    /// No Yama, or `ptrace_scope=0`: nothing to do.
    NotNeeded,
    /// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)` done.
    Any,
    /// Yama needs it but configuration said no (`NVFIPC_FD_PTRACER=none`).
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
            "{RECORD_TAG};pid={};boot={};netns={};pidns={};nonce={:016x};abstract={};path={};\
             path_error={};ptracer={}",
            self.who.pid,
            escape(&self.who.boot_id),
            self.who.net_ns,
            self.who.pid_ns,
            self.nonce,
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
        let (mut abs, mut path, mut path_error, mut ptracer) = (None, None, None, None);
        for field in fields {
            let (k, v) = field.split_once('=')?;
            match k {
                "pid" => pid = Some(v.parse().ok()?),
                "boot" => boot = Some(unescape(v)),
                "netns" => net = Some(v.parse().ok()?),
                "pidns" => pidns = Some(v.parse().ok()?),
                "nonce" => nonce = Some(u64::from_str_radix(v, 16).ok()?),
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
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
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

/// Removes the sockets in `dir` left by processes of this pid namespace that no longer exist
/// (killed before their exit handler ran). Returns how many were removed.
pub fn reclaim_dead_sockets(dir: &Path, pid_ns: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, ns)) = owner_of(&name.to_string_lossy()) else {
            continue;
        };
        if ns == pid_ns && pid_ns != 0 && !process_alive(pid) {
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
        assert_eq!(PeerRecord::decode(&r.encode()), Some(r));
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

    #[test]
    fn dead_owners_sockets_are_reclaimed_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("nvfipc-naming-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let ns = me().pid_ns;
        let live = LocalIdentity::current();
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
        for p in [&dead_path, &live_path, &other_ns] {
            std::fs::write(p, b"").unwrap();
        }
        let removed = reclaim_dead_sockets(&dir, live.pid_ns);
        let other_ns_kept = live.pid_ns != ns;
        assert_eq!(removed, 1 + usize::from(!other_ns_kept));
        assert!(!dead_path.exists() && live_path.exists());
        assert_eq!(other_ns.exists(), other_ns_kept);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
