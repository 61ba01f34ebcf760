//! A process-wide SIGBUS guard for shared mappings that another process may shrink (a board in
//! `/dev/shm`; docs/PROTOCOL.md §4). In a guarded range the handler replaces the whole range with
//! private zero pages (as Wayland compositors do for shm pools), marks it truncated and returns,
//! so the access is retried on the zero pages; the owner turns the mark into an error
//! ([`Guard::truncated`]). Unlike an `fstat` before each access, this is race-free and costs
//! nothing until a fault. Any other SIGBUS goes to the previous handler (or the default).
//!
//! The handler is async-signal-safe: a fixed table of atomics, `mmap`, `errno` saved and
//! restored. Each slot is a seqlock (a slot being written is skipped). A range is released before
//! it is unmapped, and a fault comes from an access to a live range, so it cannot be released
//! concurrently.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Ranges guarded at once in a process; past this, a new range is unguarded.
pub const MAX_RANGES: usize = 1024;

struct Slot {
    /// Taken by a [`Guard`].
    claimed: AtomicBool,
    /// Seqlock: odd while `start`/`len` are being written.
    seq: AtomicU64,
    start: AtomicUsize,
    /// 0: no range.
    len: AtomicUsize,
    /// Set by the handler once it has replaced the range with zero pages.
    truncated: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to initialise the table below
const EMPTY: Slot = Slot {
    claimed: AtomicBool::new(false),
    seq: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    truncated: AtomicBool::new(false),
};

/// The handler's table and what installing it found.
struct Handler {
    slots: [Slot; MAX_RANGES],
    /// Whether the handler was installed (on the first guard).
    installed: OnceLock<bool>,
    /// The SIGBUS action ours replaced (set first): where other faults go.
    previous: OnceLock<libc::sigaction>,
}

// process-wide: a signal handler's lock-free slot table and the disposition it replaced.
static HANDLER: Handler = Handler {
    slots: [EMPTY; MAX_RANGES],
    installed: OnceLock::new(),
    previous: OnceLock::new(),
};

/// A guarded range; released on drop (drop it before unmapping the range).
#[derive(Debug)]
pub struct Guard {
    slot: Option<usize>,
}

/// Guards `len` bytes at `addr` (a shared mapping of this process) against a shrinking file;
/// unguarded when the handler could not be installed or every slot is taken.
pub fn guard(addr: u64, len: u64) -> Guard {
    if !install() || len == 0 {
        return Guard { slot: None };
    }
    let slot = HANDLER.slots.iter().position(|s| {
        s.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    });
    if let Some(i) = slot {
        let s = &HANDLER.slots[i];
        s.truncated.store(false, Ordering::Relaxed);
        write_range(s, addr as usize, len as usize);
    }
    Guard { slot }
}

fn write_range(s: &Slot, start: usize, len: usize) {
    let seq = s.seq.load(Ordering::Relaxed);
    s.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
    fence(Ordering::Release);
    s.start.store(start, Ordering::Relaxed);
    s.len.store(len, Ordering::Relaxed);
    s.seq.store(seq.wrapping_add(2), Ordering::Release);
}

impl Guard {
    /// Whether a SIGBUS in the range was absorbed (the range now holds private zero pages).
    pub fn truncated(&self) -> bool {
        self.slot
            .is_some_and(|i| HANDLER.slots[i].truncated.load(Ordering::Acquire))
    }

    /// Whether the range is guarded at all (see [`guard`]).
    pub fn is_guarded(&self) -> bool {
        self.slot.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            let s = &HANDLER.slots[i];
            write_range(s, 0, 0);
            s.claimed.store(false, Ordering::Release);
        }
    }
}

fn install() -> bool {
    *HANDLER.installed.get_or_init(|| {
        // SAFETY: an all-zero `sigaction` is a valid value to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the current action into a valid out pointer.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return false;
        }
        let _ = HANDLER.previous.set(old);
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as SigInfoHandler as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: `new.sa_mask` is a valid sigset to initialise; `new` is a complete action whose
        // handler has the SA_SIGINFO signature.
        unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) == 0
        }
    })
}

/// The guarded slot whose range holds `addr`, with that range (start, len).
fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
    HANDLER.slots.iter().find_map(|s| {
        let before = s.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let start = s.start.load(Ordering::Relaxed);
        let len = s.len.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let stable = s.seq.load(Ordering::Relaxed) == before;
        (stable && len != 0 && addr >= start && addr - start < len).then_some((s, start, len))
    })
}

type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life; the
    // handler restores it so the interrupted code never sees the value mmap left.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    let saved = unsafe { *errno };
    // SAFETY: the kernel passes a valid siginfo (SA_SIGINFO); si_addr is meaningful for faults,
    // whose si_code is positive (a signal sent by kill or sigqueue has si_code <= 0).
    let fault_addr = (!info.is_null() && unsafe { (*info).si_code } > 0)
        .then(|| unsafe { (*info).si_addr() } as usize);
    if let Some((slot, start, len)) = fault_addr.and_then(find) {
        // SAFETY: [start, start+len) is a mapping of this process that its owner guarded and has
        // not released (the faulting access to it is in progress, so it cannot be released:
        // see the module docs); replacing it with private zero pages of the same protection only
        // changes what it reads, never what else is mapped.
        let remapped = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if remapped != libc::MAP_FAILED {
            slot.truncated.store(true, Ordering::Release);
            // SAFETY: restoring the value read above into this thread's errno.
            unsafe { *errno = saved };
            return;
        }
    }
    // SAFETY: forwards the arguments the kernel passed, unchanged.
    unsafe { chain(sig, info, ctx) };
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// Hands the signal to the action that was installed before ours.
///
/// # Safety
/// Only from the SIGBUS handler, with the kernel's arguments.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = HANDLER.previous.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_IGN {
        return;
    }
    if handler == libc::SIG_DFL {
        // SAFETY: a zeroed action is SIG_DFL with an empty mask; restoring it and raising the
        // signal again (pending until this handler returns, as SIGBUS is blocked in it) ends
        // the process the way it would have ended without the guard.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            libc::raise(sig);
        }
        return;
    }
    let siginfo = previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0);
    if siginfo {
        // SAFETY: the previous action declared SA_SIGINFO, so its handler has this signature.
        let f: SigInfoHandler = unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO the previous handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests;
