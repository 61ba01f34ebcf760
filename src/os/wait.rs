//! Bounded waiting on values in shared memory: spin briefly (a peer is usually a few hundred
//! nanoseconds behind), then yield, then sleep up to [`MAX_SLEEP`] at a time until a deadline.
//!
//! Where the writer wakes its waiters (the boards: [`futex_wait`] and [`futex_wake_all`] on a
//! word of a shared mapping), [`wait_blocking`] blocks instead of sleeping, and [`blocking_pace`]
//! spins long while every runnable thread has a core, hardly at all when the node is
//! [`oversubscribed`] (a spinning waiter then takes the core its peer needs).

use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a wait polls: spins, then yields, then sleeps growing from `first_sleep` to `max_sleep`.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub spins: u32,
    pub yields: u32,
    pub first_sleep: Duration,
    pub max_sleep: Duration,
}

/// Longest sleep between two checks of [`wait_until`].
pub const MAX_SLEEP: Duration = Duration::from_micros(500);

/// For a value a peer is about to write: spin briefly, then yield, then sleep up to [`MAX_SLEEP`].
pub const SHARED_MEMORY: Pace = Pace {
    spins: 2_000,
    yields: 200,
    first_sleep: Duration::from_micros(10),
    max_sleep: MAX_SLEEP,
};

/// For what takes milliseconds (a peer closing its cache): sleep at once, up to 5 ms.
pub const SLEEPING: Pace = Pace {
    spins: 0,
    yields: 0,
    first_sleep: Duration::from_micros(50),
    max_sleep: Duration::from_millis(5),
};

/// How a blocking wait polls: `spins`, then `yields`, then blocks at most `slice` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockingPace {
    pub spins: u32,
    pub yields: u32,
    pub slice: Duration,
}

/// Longest block of a [`wait_blocking`] between two checks (how late a dead peer is noticed).
pub const BLOCK_SLICE: Duration = Duration::from_millis(20);

/// Every waiter has a core: spin for a peer tens of microseconds late, yield a little, block.
pub const SPIN_THEN_BLOCK: BlockingPace = BlockingPace {
    spins: 20_000,
    yields: 100,
    slice: BLOCK_SLICE,
};

/// More runnable threads than cores: hardly spin (it keeps the core the peer needs) but yield a
/// while before blocking, as a futex wake-up costs far more there (measured on 2 cores: 2 yields
/// put the 4-rank warm call at 11 us, 200 at 2 us).
pub const BLOCK_SOON: BlockingPace = BlockingPace {
    spins: 50,
    yields: 200,
    slice: BLOCK_SLICE,
};

/// The pace of a wait on a peer where `local_ranks` ranks share the node.
pub fn blocking_pace(local_ranks: usize) -> BlockingPace {
    if oversubscribed(local_ranks) {
        BLOCK_SOON
    } else {
        SPIN_THEN_BLOCK
    }
}

/// Calls `attempt(None)` (check now) until it returns `Some` or `timeout` has passed (then
/// `None`), spinning then yielding as `pace` says, then `attempt(Some(slice))`, which may block
/// up to `slice` before it checks. A zero timeout checks exactly once.
pub fn wait_blocking<T>(
    pace: BlockingPace,
    timeout: Duration,
    mut attempt: impl FnMut(Option<Duration>) -> Option<T>,
) -> Option<T> {
    if let Some(v) = attempt(None) {
        return Some(v);
    }
    if timeout.is_zero() {
        return None;
    }
    for _ in 0..pace.spins {
        std::hint::spin_loop();
        if let Some(v) = attempt(None) {
            return Some(v);
        }
    }
    let deadline = Instant::now() + timeout;
    for _ in 0..pace.yields {
        std::thread::yield_now();
        if let Some(v) = attempt(None) {
            return Some(v);
        }
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            return attempt(None);
        }
        if let Some(v) = attempt(Some(pace.slice.min(deadline - now))) {
            return Some(v);
        }
    }
}

/// Calls `ready` until it returns `Some` or `timeout` has passed, at the [`SHARED_MEMORY`] pace.
pub fn wait_until<T>(timeout: Duration, ready: impl FnMut() -> Option<T>) -> Option<T> {
    wait_paced(SHARED_MEMORY, timeout, ready)
}

/// [`wait_until`] at another pace: [`wait_blocking`] whose block is a sleep, growing from
/// `first_sleep` to `max_sleep`.
pub fn wait_paced<T>(
    pace: Pace,
    timeout: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Option<T> {
    let blocking = BlockingPace {
        spins: pace.spins,
        yields: pace.yields,
        slice: pace.max_sleep,
    };
    let mut sleep = pace.first_sleep;
    wait_blocking(blocking, timeout, |block| {
        if let Some(max) = block {
            std::thread::sleep(sleep.min(max));
            sleep = (sleep * 2).min(pace.max_sleep);
        }
        ready()
    })
}

/// What [`usable_cores`] and [`oversubscribed`] read once and cache.
struct Cpu {
    /// Cores in this process's affinity mask, at least 1.
    cores: usize,
    start: Instant,
    /// Bit 63: the last answer of [`oversubscribed`]; the rest: when (ns since `start`, +1).
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

/// Threads runnable on the node right now (`R` of `/proc/loadavg`'s `R/T`).
pub fn runnable_threads() -> Option<usize> {
    use std::io::Read;
    // A stack buffer: waits read this inside warm calls, which allocate nothing ("0.52 0.58
    // 0.59 3/1234 56789" is far below its size).
    let mut buf = [0u8; 256];
    let n = std::fs::File::open("/proc/loadavg")
        .ok()?
        .read(&mut buf)
        .ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
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

/// Whether more threads are runnable than this process has cores (`local_ranks` at least), read
/// at most every 50 ms.
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

/// Blocks while `word` holds `expected`, at most `max` (spurious returns are allowed).
pub fn futex_wait(word: &AtomicU32, expected: u32, max: Duration) {
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
pub fn futex_wake_all(word: &AtomicU32) {
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
