//! Opening the log file (`NVFIPC_DEBUG_FILE`) for appending, safely in a shared directory such
//! as `/tmp`: never blocking on a FIFO (`O_NONBLOCK`, cleared once accepted), never following a
//! link in the last component (`O_NOFOLLOW`), creating with `O_EXCL` (mode 0600), and accepting
//! only a regular file or a terminal (checked with `fstat` on the opened descriptor).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// Why a log file was refused: the message says what the path is and why it is not used.
#[derive(Debug)]
pub struct Refused(pub String);

/// Opens `path` for appending (created when missing) under the rules of the module docs.
pub fn open_append(path: &str) -> Result<File, Refused> {
    let cpath = CString::new(path).map_err(|_| Refused("the path contains a NUL byte".into()))?;
    // O_NOCTTY: a terminal given as the log never becomes the controlling terminal of a session
    // leader.
    let base =
        libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    // Two rounds: a file created by someone else between "absent" and our O_EXCL create is
    // opened as an existing file in the second.
    for _ in 0..2 {
        match open(&cpath, base) {
            Ok(fd) => return accept(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(refusal(&e)),
        }
        match open(&cpath, base | libc::O_CREAT | libc::O_EXCL) {
            Ok(fd) => return accept(fd),
            // A dangling symbolic link is EEXIST too: the first round reports it as a link.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(refusal(&e)),
        }
    }
    Err(Refused(
        "it appeared and disappeared while being opened (another process is replacing it)".into(),
    ))
}

fn open(path: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string; the mode is read only with O_CREAT.
    let fd = super::cvt(unsafe {
        libc::open(
            path.as_ptr(),
            flags | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    })?;
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn refusal(e: &io::Error) -> Refused {
    Refused(match e.raw_os_error() {
        Some(libc::ELOOP) => "it is a symbolic link (links are not followed)".to_string(),
        Some(libc::ENXIO) => "it is a FIFO or socket with no reader (not a regular file)".into(),
        Some(libc::EISDIR) => "it is a directory".to_string(),
        _ => format!("it cannot be opened ({e})"),
    })
}

/// Keeps `fd` if it is a regular file or a terminal, in blocking mode.
fn accept(fd: OwnedFd) -> Result<File, Refused> {
    let st = super::mmap::fstat(fd.as_fd()).map_err(|e| Refused(format!("fstat failed ({e})")))?;
    let kind = st.st_mode & libc::S_IFMT;
    // SAFETY: isatty only inspects the open descriptor.
    let terminal = kind == libc::S_IFCHR && unsafe { libc::isatty(fd.as_raw_fd()) } == 1;
    if kind != libc::S_IFREG && !terminal {
        let what = match kind {
            libc::S_IFIFO => "a FIFO",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR => "a character device that is not a terminal",
            libc::S_IFBLK => "a block device",
            libc::S_IFDIR => "a directory",
            _ => "not a regular file",
        };
        return Err(Refused(format!(
            "it is {what} (only a regular file or a terminal is used)"
        )));
    }
    // SAFETY: F_GETFL/F_SETFL on an open descriptor; only O_NONBLOCK is changed.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests;
