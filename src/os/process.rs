//! Process-level OS calls: this host's name, namespaces, and whether a pid is alive.

use std::os::unix::fs::MetadataExt;

/// The host name (`gethostname`), or `unknown-host`.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for `buf.len()` bytes; gethostname NUL-terminates on success
    // when the name fits, and we also stop at the buffer end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The kernel's id of the calling thread (what `top -H` and `gdb` show).
pub fn thread_id() -> i64 {
    // SAFETY: gettid takes no arguments, cannot fail and touches no memory.
    i64::from(unsafe { libc::gettid() })
}

/// Is `pid` a live process of this pid namespace (or one we may not signal, which also means it
/// exists)? A zombie counts as alive until its parent reaps it.
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Inode of `/proc/self/ns/<kind>` (`ipc`, `pid`, ...), 0 when unknown: equal for processes of
/// one namespace.
pub fn ns_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}")).map_or(0, |m| m.ino())
}
