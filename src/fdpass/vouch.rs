//! The importer's side of the trust boundary (docs/PROTOCOL.md section 7, "Trust boundary"): a
//! descriptor is taken only from a process the kernel vouches for. The responder's record in the
//! store names a socket, a pid and a secret, all of which anyone who can reach the store may have
//! written; what the kernel says about the process at the other end decides.

use super::diagnose::Gate;
use super::peer::{LocalIdentity, PeerRecord};
use super::TrustedUids;
use crate::os::fd_passing as sys;
use std::os::fd::BorrowedFd;

/// The process at the other end of the connected `stream` (`SO_PEERCRED`, recorded by the
/// kernel at connect) runs as a trusted uid and, where this rank can compare pids (one pid
/// namespace), is the process `record` names.
pub fn responder(
    stream: BorrowedFd<'_>,
    record: &PeerRecord,
    local: &LocalIdentity,
    trusted: &TrustedUids,
) -> Result<(), Gate> {
    let cred = sys::peer_credentials(stream).map_err(|e| {
        Gate::Untrusted(format!(
            "the responder's credentials cannot be read (SO_PEERCRED: {e}), so nothing it sends \
             is accepted"
        ))
    })?;
    check_responder(cred, record, local, trusted)
}

/// [`responder`] on credentials already read.
pub fn check_responder(
    cred: sys::PeerCred,
    record: &PeerRecord,
    local: &LocalIdentity,
    trusted: &TrustedUids,
) -> Result<(), Gate> {
    if !trusted.admits(cred.uid) {
        return Err(Gate::Untrusted(format!(
            "the process answering there (pid {}) runs as uid {}, not {}: it is not this job's \
             responder, although the store names it (another user may have rewritten the \
             job's store keys); nothing was taken from it. Run the job with a store only its \
             user can reach, or list the job's other users in NVFIPC_TRUSTED_UIDS",
            cred.pid,
            cred.uid,
            trusted.describe()
        )));
    }
    let same_pid_ns = local.pid_ns != 0 && local.pid_ns == record.who.pid_ns;
    if same_pid_ns && cred.pid != 0 && cred.pid != record.who.pid {
        return Err(Gate::Untrusted(format!(
            "the process answering there is pid {}, but the responder's record names pid {}: \
             another process of {} holds the socket; nothing was taken from it",
            cred.pid,
            record.who.pid,
            trusted.describe()
        )));
    }
    Ok(())
}

/// The pidfd rung takes a descriptor straight out of process `pid`: it must run as a trusted uid
/// (the owner of `/proc/<pid>`). Called with a pidfd of `pid` open, so that a later successful
/// `pidfd_getfd` proves the process checked here was still the one it took from.
pub fn process(pid: u32, trusted: &TrustedUids) -> Result<(), Gate> {
    let uid = sys::process_uid(pid).map_err(|e| {
        Gate::Untrusted(format!(
            "the owner of pid {pid} cannot be read (/proc/{pid}: {e}), so nothing is taken from \
             it"
        ))
    })?;
    if !trusted.admits(uid) {
        return Err(Gate::Untrusted(format!(
            "pid {pid}, which the responder's record names, runs as uid {uid}, not {}: it is \
             not this job's process; nothing was taken from it",
            trusted.describe()
        )));
    }
    Ok(())
}

/// A memory file received from a peer is owned by a trusted uid (a memfd belongs to the user
/// that created it).
pub fn file_owner(fd: BorrowedFd<'_>, trusted: &TrustedUids, what: &str) -> crate::Result<()> {
    let uid =
        sys::file_owner(fd).map_err(|e| crate::Error::from_io(format!("fstat of {what}"), &e))?;
    if !trusted.admits(uid) {
        return Err(crate::Error::protocol(format!(
            "{what} is a file of uid {uid}, not of {}: it was not created by this job's \
             processes; it is not mapped",
            trusted.describe()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
