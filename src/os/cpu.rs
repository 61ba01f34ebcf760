//! How many cores this process may run on, and whether the node has more runnable threads than
//! that: waits spin only while every waiter can have a core of its own.

use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Cores in this process's affinity mask (`sched_getaffinity`), at least 1.
pub fn usable_cores() -> usize {
    static CORES: Lazy<usize> = Lazy::new(|| {
        // SAFETY: `set` is a plain bit set the kernel fills; its size is passed with it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                return (libc::CPU_COUNT(&set) as usize).max(1);
            }
        }
        std::thread::available_parallelism().map_or(1, |n| n.get())
    });
    *CORES
}

/// Threads runnable on the node right now (the fourth field of `/proc/loadavg`, `R/T`), or
/// `None` where it cannot be read.
pub fn runnable_threads() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_runnable(&text)
}

fn parse_runnable(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// How long a reading of [`runnable_threads`] is reused (reading it costs a few microseconds).
const REFRESH_NS: u64 = 50_000_000;

/// Whether more threads are runnable than this process has cores, read at most every 50 ms.
/// `local_ranks` is a lower bound of the runnable threads (ranks sharing the node).
pub fn oversubscribed(local_ranks: usize) -> bool {
    static START: Lazy<Instant> = Lazy::new(Instant::now);
    // Bit 63: the last answer; the rest: when it was read (ns since START, +1 so 0 = never).
    static LAST: AtomicU64 = AtomicU64::new(0);
    let cores = usable_cores();
    if local_ranks > cores {
        return true;
    }
    let now = START.elapsed().as_nanos() as u64 + 1;
    let last = LAST.load(Ordering::Relaxed);
    let at = last & !(1 << 63);
    if at != 0 && now.saturating_sub(at) < REFRESH_NS {
        return last >> 63 != 0;
    }
    // The caller is one of the runnable threads counted, so "more than cores" means others
    // want every core too.
    let over = runnable_threads().is_some_and(|r| r > cores);
    LAST.store(now | (u64::from(over) << 63), Ordering::Relaxed);
    over
}

#[cfg(test)]
mod tests;
