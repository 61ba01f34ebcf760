//! Every OS call of the fd transport that std does not offer (`SCM_RIGHTS`, pidfds,
//! `PR_SET_PTRACER`, `SO_PEERCRED`): `crate::fdpass` has no `libc::` and no `unsafe` of its own.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The errno values the rest of `fdpass` tells apart.
pub use libc::{EACCES, EBADF, ENOSYS, EPERM, ESRCH};

/// Room for one `cmsghdr` carrying up to 4 fds (a peer that sends more than one has them closed).
const CMSG_SPACE_FDS: usize = 4;

/// Bytes of control buffer for `n` fds (`CMSG_SPACE(n * sizeof(int))`).
fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure computation on its argument.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// An 8-byte-aligned control buffer (cmsghdr needs the alignment of `size_t`).
fn control_buffer(n: usize) -> Vec<u64> {
    vec![0u64; cmsg_space(n).div_ceil(8)]
}

/// Sends `bytes` on the stream socket `sock`, with `fd` as `SCM_RIGHTS` on the first byte when
/// given (`MSG_NOSIGNAL`: a closed peer gives EPIPE). Returns the bytes sent.
pub fn send_with_fd(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = control_buffer(1);
    // SAFETY: an all-zero msghdr is a valid "no name, no iov, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(1) as _;
        // SAFETY: msg_control points to `control`, which is at least CMSG_SPACE(sizeof(int))
        // bytes and 8-byte aligned, so CMSG_FIRSTHDR is non-null and the header and one int of
        // data fit inside it; nothing else aliases `control` while we write.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd.as_raw_fd());
        }
    }
    // SAFETY: `msg` points to `iov` (valid for `bytes.len()` readable bytes) and to `control`
    // (initialised above), both alive for the call; the kernel only reads them.
    let n = super::cvt(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })?;
    Ok(n as usize)
}

/// Receives into `buf` from the stream socket `sock`; returns the byte count (0: the peer closed)
/// and the first fd that came with them (further fds are closed; cut-off ones are an error).
pub fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = control_buffer(CMSG_SPACE_FDS);
    // SAFETY: an all-zero msghdr is a valid "no name, no iov, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = cmsg_space(CMSG_SPACE_FDS) as _;
    // SAFETY: `iov` covers `buf` (writable for its length) and msg_control covers `control`
    // (writable for msg_controllen bytes); both outlive the call.
    let n =
        super::cvt(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) })?;
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` and set msg_controllen; CMSG_FIRSTHDR/CMSG_NXTHDR walk
    // only headers inside that length, and each SCM_RIGHTS header's data holds
    // (cmsg_len - CMSG_LEN(0)) / sizeof(int) fds that the kernel installed in this process, which
    // we take ownership of exactly once here.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer attached more file descriptors than one reply carries (control data cut off)",
        ));
    }
    let first = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    Ok((n as usize, first))
}

/// `pidfd_open(pid, 0)` (Linux >= 5.3).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
    let fd = super::cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_getfd(pidfd, target, 0)` (Linux >= 5.6; needs PTRACE_MODE_ATTACH_REALCREDS).
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes two descriptors numbers and flags by value and returns a new fd
    // (close-on-exec) or -1; `pidfd` is open for the duration of the call.
    let fd =
        super::cvt(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) })?;
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`: under Yama `ptrace_scope=1`, lets any process of
/// this user `pidfd_getfd` from this one (only with `NVFIPC_FD_PTRACER=any`).
pub fn allow_any_ptracer() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_PTRACER takes its arguments by value and touches no memory.
    super::cvt(unsafe {
        libc::prctl(
            libc::PR_SET_PTRACER,
            libc::PR_SET_PTRACER_ANY as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;
    Ok(())
}

pub fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The peer of a connected Unix socket as recorded at connect (`SO_PEERCRED`): pid 0 when in a
/// pid namespace this one cannot see, ids 65534 when unmapped in this user namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// `getsockopt(SO_PEERCRED)` of the connected Unix socket `sock`.
pub fn peer_credentials(sock: BorrowedFd<'_>) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` of `len` bytes that outlives the call; the kernel
    // writes at most `len` bytes into it and stores the length it wrote in `len`; `sock` is
    // open for the call.
    super::cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "SO_PEERCRED returned a short credential record",
        ));
    }
    Ok(PeerCred {
        pid: u32::try_from(cred.pid).unwrap_or(0),
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The owner (`st_uid`) of the open file `fd`.
pub fn file_owner(fd: BorrowedFd<'_>) -> io::Result<u32> {
    Ok(super::mmap::fstat(fd)?.st_uid)
}

/// The uid process `pid` runs as: the owner of `/proc/<pid>` (its effective uid while it is
/// dumpable, root's otherwise, which is refused unless the job runs as root).
pub fn process_uid(pid: u32) -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(format!("/proc/{pid}"))?.uid())
}

/// `(st_dev, st_ino)` of the open file `fd`.
pub fn file_identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = super::mmap::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}
