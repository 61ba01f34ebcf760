//! How many cores this process may run on, and whether the node has more runnable threads than
//! that: waits spin only while every waiter can have a core of its own.

use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What [`usable_cores`] and [`oversubscribed`] read once and cache.
struct Cpu {
    /// Cores in this process's affinity mask, at least 1.
    cores: usize,
    start: Instant,
    /// Bit 63: the last answer of [`oversubscribed`]; the rest: when it was read (ns since
    /// `start`, +1 so 0 = never).
    last: AtomicU64,
}

// process-wide: the cores of this process and the node's load, shared by every waiter.
static CPU: Lazy<Cpu> = Lazy::new(|| {
    // SAFETY: `set` is a plain bit set the kernel fills; its size is passed with it.
    let affinity = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then(|| (libc::CPU_COUNT(&set) as usize).max(1))
    };
    Cpu {
        cores: affinity
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        start: Instant::now(),
        last: AtomicU64::new(0),
    }
});

/// Cores in this process's affinity mask (`sched_getaffinity`), at least 1.
pub fn usable_cores() -> usize {
    CPU.cores
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
    let cores = CPU.cores;
    if local_ranks > cores {
        return true;
    }
    let now = CPU.start.elapsed().as_nanos() as u64 + 1;
    let last = CPU.last.load(Ordering::Relaxed);
    let at = last & !(1 << 63);
    if at != 0 && now.saturating_sub(at) < REFRESH_NS {
        return last >> 63 != 0;
    }
    // The caller is one of the runnable threads counted, so "more than cores" means others
    // want every core too.
    let over = runnable_threads().is_some_and(|r| r > cores);
    CPU.last
        .store(now | (u64::from(over) << 63), Ordering::Relaxed);
    over
}

#[cfg(test)]
mod tests;
