//! Futex waits and wakes on a 32-bit word of a shared mapping, so a waiter on a peer's board can
//! block until the peer publishes instead of polling. The words live in `MAP_SHARED` memory of
//! several processes, so the calls are the shared (not `FUTEX_PRIVATE_FLAG`) kind.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Blocks while `word` holds `expected`, at most `max` (spurious returns are allowed: callers
/// check their condition again).
pub fn wait(word: &AtomicU32, expected: u32, max: Duration) {
    let ts = libc::timespec {
        tv_sec: max.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: max.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned 32-bit word that outlives the call; the kernel only
    // reads it. FUTEX_WAIT takes a relative timeout; the other arguments are unused.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter blocked on `word` (in any process mapping it).
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned 32-bit word; FUTEX_WAKE does not access memory
    // beyond looking the word's address up.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests;
