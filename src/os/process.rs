//! Process-level OS calls: this host's name, namespaces, and whether a pid is alive.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Is `pid` a live process of this pid namespace (one we may not signal exists too)? A zombie is
/// not: it already released its memory, descriptors and device contexts (a launcher reaping its
/// ranks in order would otherwise keep an exited rank "alive").
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !is_zombie(pid)
}

/// Whether `/proc/<pid>/stat` shows `pid` exited (`Z` or `X`); false without a `/proc` of this
/// pid namespace.
fn is_zombie(pid: libc::pid_t) -> bool {
    // Stack buffers only: a wait for a peer checks its liveness inside warm calls, which
    // allocate nothing. The state follows the command name, at most 16 bytes, so 128 bytes of
    // the line hold it.
    let mut path = [0u8; 48];
    let mut stat = [0u8; 128];
    let exited = read_prefix(
        format_into(&mut path, format_args!("/proc/{pid}/stat")),
        &mut stat,
    )
    .and_then(state_of)
    .is_some_and(|state| state == 'Z' || state == 'X');
    exited && proc_is_this_namespace()
}

/// Whether `/proc` is this pid namespace's: `/proc/self` names this process's pid.
fn proc_is_this_namespace() -> bool {
    let mut link = [0u8; 24];
    // SAFETY: the path is a NUL-terminated literal and `link` is writable for its length;
    // readlink writes at most that many bytes and returns how many (or -1).
    let n = unsafe { libc::readlink(c"/proc/self".as_ptr(), link.as_mut_ptr().cast(), link.len()) };
    let mut own = [0u8; 24];
    let own = format_into(&mut own, format_args!("{}", std::process::id()));
    usize::try_from(n).is_ok_and(|n| own.is_some_and(|own| link[..n] == *own.as_bytes()))
}

/// `args` written into `buf`, or None when it does not fit.
fn format_into<'a>(buf: &'a mut [u8], args: std::fmt::Arguments<'_>) -> Option<&'a str> {
    use std::io::Write;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    cursor.write_fmt(args).ok()?;
    let len = cursor.position() as usize;
    std::str::from_utf8(&buf[..len]).ok()
}

/// The first bytes of the file at `path` (as many as `buf` holds), as text.
fn read_prefix<'a>(path: Option<&str>, buf: &'a mut [u8]) -> Option<&'a str> {
    use std::io::Read;
    let n = std::fs::File::open(path?).ok()?.read(buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

/// The state letter of a `/proc/<pid>/stat` line (field 3).
fn state_of(stat: &str) -> Option<char> {
    stat_fields(stat)?.next()?.chars().next()
}

/// The fields of a `/proc/<pid>/stat` line from the state (field 3) on, after the last `)` (the
/// command name may hold spaces and parentheses).
fn stat_fields(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    let (_, after_name) = stat.rsplit_once(')')?;
    Some(after_name.split_whitespace())
}

/// Inode of `/proc/self/ns/<kind>` (`ipc`, `pid`, ...), 0 when unknown.
pub fn ns_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}")).map_or(0, |m| m.ino())
}

/// Time since this kernel booted (`CLOCK_BOOTTIME`, suspended time included).
pub fn since_boot() -> Option<std::time::Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(std::time::Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

/// [`since_boot`] in nanoseconds when this library was loaded (0: not recorded).
// process-wide: written by the load-time constructor below, before any object exists.
static LOADED_AT: AtomicU64 = AtomicU64::new(0);

extern "C" fn record_load() {
    if let Some(now) = since_boot() {
        LOADED_AT.store(
            u64::try_from(now.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    presize_fd_table();
}

/// Descriptor numbers the table is grown to hold at load (at most `RLIMIT_NOFILE`).
const FD_TABLE_SIZE: libc::rlim_t = 4096;

/// Grows this process's descriptor table once, at load. Linux grows it by doubling, and while it
/// grows a multithreaded process waits out an RCU grace period (tens of milliseconds in a VM),
/// every thread that opens, accepts or receives a descriptor blocked meanwhile. An exchange makes
/// many (VMM exports, peers' fds, responder and store connections), so an unsized table grew in a
/// process's first rendezvous and stalled the responders and the store its peers waited on. At
/// load a process is usually single-threaded, and growing is then free.
fn presize_fd_table() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let top = limit.rlim_cur.min(FD_TABLE_SIZE) as libc::c_int - 1;
    // SAFETY: plain calls on the two descriptors made here, each closed once.
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC);
        if fd < 0 {
            return;
        }
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, top);
        if high >= 0 {
            libc::close(high);
        }
        libc::close(fd);
    }
}

/// Runs [`record_load`] when the library is loaded (it needs nothing of the Rust runtime).
// process-wide: a load-time constructor is the loader's, run once per process.
#[used]
#[link_section = ".init_array"]
static RECORD_LOAD: extern "C" fn() = record_load;

/// A time since boot by which this process had certainly started: the earlier of the library's
/// load and the end of the clock tick of `/proc/self/stat`'s `starttime` (on the boot clock from
/// Linux 5.5, before on the monotonic one).
pub fn started_by() -> Option<std::time::Duration> {
    let loaded = match LOADED_AT.load(Ordering::Relaxed) {
        0 => None,
        ns => Some(std::time::Duration::from_nanos(ns)),
    };
    let from_proc = || -> Option<std::time::Duration> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let ticks = start_ticks(&stat)?;
        // SAFETY: sysconf takes no pointers and only reads a system value.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
        if hz == 0 {
            return None;
        }
        let nanos = (u128::from(ticks) + 1) * 1_000_000_000 / u128::from(hz);
        Some(std::time::Duration::from_nanos(u64::try_from(nanos).ok()?))
    };
    match (loaded, from_proc()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `starttime` of a `/proc/<pid>/stat` line: field 22.
fn start_ticks(stat: &str) -> Option<u64> {
    stat_fields(stat)?.nth(22 - 3)?.parse().ok()
}

/// This process's cgroup directory for `controller`: v2's, or v1's of that controller.
pub fn cgroup_dir(controller: &str) -> Option<String> {
    cgroup_dir_in(
        &std::fs::read_to_string("/proc/self/cgroup").ok()?,
        controller,
    )
}

fn cgroup_dir_in(proc_self_cgroup: &str, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?.trim());
        match controllers {
            "" => Some(format!("/sys/fs/cgroup{path}")),
            c if c.split(',').any(|c| c == controller) => {
                Some(format!("/sys/fs/cgroup/{controller}{path}"))
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests;
