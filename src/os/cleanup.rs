//! Nothing of a finished job stays in `/dev/shm` or in the fd transport's socket directory.
//!
//! Every shm name and socket file this process creates is registered in a fixed, lock-free table
//! until it is unlinked. At exit and on SIGTERM, SIGINT or SIGHUP (where the disposition was the
//! default) the registered paths are unlinked with `unlink(2)` and the signal then takes its
//! default action. A slot holds the creating pid, so a forked child never unlinks its parent's
//! files. After a SIGKILL, others reclaim the boards and sockets by the pid they record.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Once;

/// Paths registered at once; beyond that, they are still reclaimed after death by others.
const SLOTS: usize = 2048;
/// A socket path (at most 107 bytes, `sun_path`) or `/dev/shm` + a name of 63 bytes, + NUL.
const PATH_LEN: usize = 112;
const FREE: u32 = 0;
const BUSY: u32 = 1;
const USED: u32 = 2;

struct Slot {
    state: AtomicU32,
    pid: AtomicU32,
    path: [AtomicU8; PATH_LEN],
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    state: AtomicU32::new(FREE),
    pid: AtomicU32::new(0),
    path: [const { AtomicU8::new(0) }; PATH_LEN],
};

/// The table, and the installation of its exit and signal handlers.
struct AtExit {
    install: Once,
    slots: [Slot; SLOTS],
}

// process-wide: the signal handler reads the table, lock-free; the handlers are the process's.
static AT_EXIT: AtExit = AtExit {
    install: Once::new(),
    slots: [EMPTY; SLOTS],
};

/// Signals whose default action would leave the names behind.
const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Registers the shm `name` for removal at exit or on a fatal signal; returns the slot to give
/// back to [`unregister`] once the name is unlinked.
pub fn register(name: &str) -> Option<usize> {
    register_path(Path::new(&format!("/dev/shm{name}")))
}

/// Registers the file at `path` (a socket) like [`register`].
pub fn register_path(path: &Path) -> Option<usize> {
    AT_EXIT.install.call_once(install);
    let path = path.as_os_str().as_bytes();
    if path.len() >= PATH_LEN {
        return None;
    }
    for (i, slot) in AT_EXIT.slots.iter().enumerate() {
        if slot
            .state
            .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        for (j, cell) in slot.path.iter().enumerate() {
            cell.store(*path.get(j).unwrap_or(&0), Ordering::Relaxed);
        }
        slot.pid.store(std::process::id(), Ordering::Relaxed);
        slot.state.store(USED, Ordering::Release);
        return Some(i);
    }
    None
}

/// Gives a slot back once its name was unlinked.
pub fn unregister(slot: usize) {
    if let Some(s) = AT_EXIT.slots.get(slot) {
        s.state.store(FREE, Ordering::Release);
    }
}

/// Unlinks every name this process registered. Async-signal-safe: only atomics and `unlink(2)`.
fn unlink_registered() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    for slot in &AT_EXIT.slots {
        if slot.state.load(Ordering::Acquire) != USED || slot.pid.load(Ordering::Relaxed) != me {
            continue;
        }
        let mut path = [0u8; PATH_LEN];
        for (b, cell) in path.iter_mut().zip(&slot.path) {
            *b = cell.load(Ordering::Relaxed);
        }
        path[PATH_LEN - 1] = 0;
        // SAFETY: `path` is NUL-terminated (its last byte is 0).
        unsafe { libc::unlink(path.as_ptr().cast()) };
    }
}

extern "C" fn at_exit() {
    unlink_registered();
}

extern "C" fn on_signal(sig: libc::c_int) {
    unlink_registered();
    // SA_RESETHAND restored the default action on entry; the signal is blocked while this
    // handler runs, so it is delivered, and kills the process, once the handler returns.
    // SAFETY: raise is async-signal-safe.
    unsafe { libc::raise(sig) };
}

fn install() {
    // SAFETY: registers a function with C linkage that touches only statics.
    unsafe { libc::atexit(at_exit) };
    for sig in SIGNALS {
        // SAFETY: an all-zero sigaction is a valid value to be overwritten by sigaction.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the current action into a valid out pointer.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        new.sa_flags = libc::SA_RESETHAND;
        // SAFETY: `new.sa_mask` is a valid sigset; the handler is async-signal-safe.
        unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(sig, &new, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests;
