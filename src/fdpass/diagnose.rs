//! The rungs of the fd ladder, the gates that close them, and the error naming each rung's gate.

use super::frame::ErrorCode;
use crate::error::{Error, Status};
use crate::os::fd_passing::{EACCES, EBADF, ENOSYS, EPERM, ESRCH};
use std::fmt;
use std::io;

pub use super::config::Rung;

/// Why one rung did not deliver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Not in `NVFIPC_FD_RUNGS`.
    Disabled,
    /// The peer runs on another kernel: no fd can cross.
    OtherHost,
    /// Abstract names live in one network namespace.
    OtherNetNamespace { here: u64, there: u64 },
    /// A pid names a process only in its pid namespace.
    OtherPidNamespace { here: u64, there: u64 },
    /// The exporter has no socket path; its reason.
    NoPath(String),
    /// The socket file does not exist here (the directory is not shared, or was cleaned).
    PathAbsent,
    /// The socket file exists but we may not connect to it.
    PathDenied(String),
    /// Connecting failed for another reason (nobody listening, ...), after retries.
    Unreachable(String),
    /// The responder answered with an error frame.
    Refused { code: ErrorCode, message: String },
    /// The conversation with the responder broke (reset, garbage, no fd attached).
    Broken(String),
    /// The time ran out on this rung.
    TimedOut(String),
    /// The kernel lacks `pidfd_open`/`pidfd_getfd` (Linux < 5.6) or a filter hides them.
    NoKernelSupport(String),
    /// `pidfd_getfd` gave EPERM; the detail says which of seccomp, capability, Yama or uid.
    PtraceDenied(String),
    /// The peer process is gone.
    ProcessGone,
    /// The descriptor number is not (or no longer) the registered object.
    NotTheObject(String),
    /// The kernel does not vouch for the process there (another uid, another pid than the
    /// record's): nothing is taken from it and no other rung is tried.
    Untrusted(String),
    /// Anything else, with its text.
    Other(String),
}

impl Gate {
    /// The gate, what it means and what to change, in one sentence or two.
    pub fn describe(&self) -> String {
        match self {
            Gate::Disabled => "not enabled (NVFIPC_FD_RUNGS)".to_string(),
            Gate::OtherHost => {
                "the peer runs on another kernel (boot id differs): descriptors cannot cross \
                 machines; only ranks on one node can pass fds"
                    .to_string()
            }
            Gate::OtherNetNamespace { here, there } => format!(
                "different network namespace (net:[{here}] here, net:[{there}] there): abstract \
                 socket names do not cross network namespaces; the socket path is tried instead \
                 (or run both with the host network)"
            ),
            Gate::OtherPidNamespace { here, there } => format!(
                "different PID namespace (pid:[{here}] here, pid:[{there}] there): the peer's \
                 pid means nothing here; run both in one PID namespace (--pid=host) or use the \
                 socket rungs"
            ),
            Gate::NoPath(why) => format!("the exporter has no socket file: {why}"),
            Gate::PathAbsent => {
                "the socket file does not exist in this mount namespace: the socket directory \
                 is not shared between the two processes; set NVFIPC_SOCKET_DIR to a directory \
                 mounted into both (e.g. a shared volume)"
                    .to_string()
            }
            Gate::PathDenied(e) => format!(
                "the socket file exists but may not be opened ({e}): give both processes the \
                 same user, or a socket directory both may write"
            ),
            Gate::Unreachable(e) => format!(
                "no responder answers ({e}): the peer has exited, or the file belongs to \
                 another mount of the same path"
            ),
            Gate::Refused { code, message } => {
                format!("the peer's responder refused: {} ({message})", code.name())
            }
            Gate::Broken(e) => format!("the exchange with the responder broke: {e}"),
            Gate::TimedOut(e) => format!("timed out: {e}"),
            Gate::NoKernelSupport(e) => format!(
                "not available ({e}): pidfd_getfd needs Linux 5.6 or newer and a seccomp \
                 profile that allows it"
            ),
            Gate::PtraceDenied(detail) => format!("EPERM: {detail}"),
            Gate::ProcessGone => "the peer process no longer exists".to_string(),
            Gate::NotTheObject(e) => e.clone(),
            Gate::Untrusted(e) => e.clone(),
            Gate::Other(e) => e.clone(),
        }
    }

    /// The status this gate would give on its own.
    fn status(&self) -> Status {
        match self {
            Gate::TimedOut(_) => Status::Timeout,
            Gate::Refused { code, .. } => match code {
                ErrorCode::UnknownId | ErrorCode::Revoked => Status::NotFound,
                ErrorCode::Malformed | ErrorCode::UnsupportedVersion | ErrorCode::WrongNonce => {
                    Status::Protocol
                }
                ErrorCode::Busy | ErrorCode::Internal => Status::Io,
                ErrorCode::Denied => Status::Unsupported,
            },
            Gate::Broken(_) | Gate::Untrusted(_) => Status::Protocol,
            Gate::NotTheObject(_) => Status::NotFound,
            Gate::OtherHost | Gate::NoKernelSupport(_) => Status::Unsupported,
            _ => Status::Io,
        }
    }
}

/// What this process can see of the gates of `pidfd_getfd` (from `/proc`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtraceFacts {
    /// `Seccomp:` of `/proc/self/status`: 0 none, 1 strict, 2 filter.
    pub seccomp: u32,
    /// CAP_SYS_PTRACE in this process's effective set.
    pub cap_sys_ptrace: bool,
    /// Yama's `ptrace_scope`, when Yama is there.
    pub yama_scope: Option<u32>,
    pub my_uid: Option<u32>,
    pub peer_uid: Option<u32>,
}

fn status_field(status: &str, name: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_string())
}

fn real_uid(status: &str) -> Option<u32> {
    status_field(status, "Uid:")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl PtraceFacts {
    /// Reads this process's facts and `peer_pid`'s uid.
    pub fn observe(peer_pid: u32) -> PtraceFacts {
        let me = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        PtraceFacts {
            seccomp: status_field(&me, "Seccomp:")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            cap_sys_ptrace: status_field(&me, "CapEff:")
                .and_then(|v| u64::from_str_radix(&v, 16).ok())
                .is_some_and(|caps| caps & (1 << 19) != 0),
            yama_scope: std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            my_uid: real_uid(&me),
            peer_uid: std::fs::read_to_string(format!("/proc/{peer_pid}/status"))
                .ok()
                .and_then(|s| real_uid(&s)),
        }
    }

    /// Which of seccomp, capability, Yama (given the exporter's `ptracer`) or uid gave EPERM.
    pub fn explain_eperm(&self, exporter_ptracer: &str) -> String {
        let cap = self.cap_sys_ptrace;
        let mut why = Vec::new();
        if self.seccomp == 2 && !cap {
            why.push(
                "a seccomp filter is active and this process lacks CAP_SYS_PTRACE (Docker's \
                 default profile allows pidfd_getfd only with it): add --cap-add SYS_PTRACE, or \
                 use the socket rungs"
                    .to_string(),
            );
        }
        match self.yama_scope {
            Some(3) => why.push(
                "Yama ptrace_scope=3 forbids all attaching: only the socket rungs can work".into(),
            ),
            Some(2) if !cap => why.push(
                "Yama ptrace_scope=2 requires CAP_SYS_PTRACE: add --cap-add SYS_PTRACE, or use \
                 the socket rungs"
                    .into(),
            ),
            Some(1) if exporter_ptracer != "any" && !cap => why.push(format!(
                "Yama ptrace_scope=1 admits only ancestors unless the exporter calls \
                 PR_SET_PTRACER, and the exporter's record says ptracer={exporter_ptracer}: \
                 use the socket rungs, or set NVFIPC_FD_PTRACER=any in the exporter (it lets \
                 every process of its user attach, not only the job's)"
            )),
            _ => {}
        }
        if let (Some(me), Some(peer)) = (self.my_uid, self.peer_uid) {
            if me != peer && !cap {
                why.push(format!(
                    "the peer runs as uid {peer} and this process as uid {me} without \
                     CAP_SYS_PTRACE: run both as one user, or use the socket rungs"
                ));
            }
        }
        if !cap && why.is_empty() {
            why.push(
                "this process lacks CAP_SYS_PTRACE and the kernel refused to let it attach to \
                 the peer (a peer with capabilities this process lacks, a cleared dumpable \
                 flag, an LSM): add --cap-add SYS_PTRACE, or use the socket rungs"
                    .into(),
            );
        }
        if why.is_empty() {
            why.push(
                "refused although this process holds CAP_SYS_PTRACE: a seccomp filter or an LSM \
                 (AppArmor, SELinux) denies it; use the socket rungs"
                    .into(),
            );
        }
        why.join("; ")
    }
}

/// Maps an error of `pidfd_open`/`pidfd_getfd` to its gate.
pub fn pidfd_gate_of(err: &io::Error, exporter_ptracer: &str, peer_pid: u32) -> Gate {
    match err.raw_os_error() {
        Some(e) if e == ENOSYS => Gate::NoKernelSupport(err.to_string()),
        Some(e) if e == ESRCH => Gate::ProcessGone,
        Some(e) if e == EPERM || e == EACCES => {
            Gate::PtraceDenied(PtraceFacts::observe(peer_pid).explain_eperm(exporter_ptracer))
        }
        Some(e) if e == EBADF => Gate::NotTheObject(format!(
            "the descriptor number is not open in the peer ({err}): the object was revoked"
        )),
        _ => Gate::Other(err.to_string()),
    }
}

/// Every rung tried for one descriptor and why each failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    /// "rank 1: fetching fd 7 of peer rank 0 (pid 123) in job j" or similar.
    pub what: String,
    /// (rung, what it targeted: socket name, pid, ..., the gate).
    pub rungs: Vec<(Rung, String, Gate)>,
}

impl Diagnosis {
    pub fn new(what: impl Into<String>) -> Diagnosis {
        Diagnosis {
            what: what.into(),
            rungs: Vec::new(),
        }
    }

    /// Adds one rung's failure (the VMM transport adds [`Rung::Fabric`] this way).
    pub fn add(&mut self, rung: Rung, target: impl Into<String>, gate: Gate) {
        self.rungs.push((rung, target.into(), gate));
    }

    /// The gate of `rung`, when it was recorded.
    pub fn gate(&self, rung: Rung) -> Option<&Gate> {
        self.rungs
            .iter()
            .find(|(r, ..)| *r == rung)
            .map(|(_, _, g)| g)
    }

    /// The error: the most telling status of the rungs tried (refusal, timeout, else the first).
    pub fn into_error(self) -> Error {
        let tried: Vec<Status> = (self.rungs.iter())
            .filter(|(_, _, g)| *g != Gate::Disabled)
            .map(|(_, _, g)| g.status())
            .collect();
        // A process the kernel does not vouch for says the most: someone forged the job's keys.
        let untrusted = (self.rungs.iter()).any(|(_, _, g)| matches!(g, Gate::Untrusted(_)));
        let first = if untrusted {
            [Status::Protocol, Status::Protocol]
        } else {
            [Status::NotFound, Status::Timeout]
        };
        let status = first
            .into_iter()
            .find(|s| tried.contains(s))
            .or(tried.first().copied())
            .unwrap_or(Status::Unsupported);
        Error::new(status, self.to_string())
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: every way to obtain the descriptor failed",
            self.what
        )?;
        if self.rungs.is_empty() {
            write!(f, " (no rung enabled: set NVFIPC_FD_RUNGS)")?;
        }
        for (rung, target, gate) in &self.rungs {
            write!(f, "; {} {}: {}", rung.title(), target, gate.describe())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
