//! Bounded waiting on values in shared memory: spin briefly (the common case is a peer that is a
//! few hundred nanoseconds behind), then yield, then sleep with a growing interval capped at
//! [`MAX_SLEEP`], always bounded by a deadline. No wake-up call is needed from the writer. Slower
//! waits (a peer closing) use the same routine at the [`SLEEPING`] pace.
//!
//! Where the writer wakes its waiters (the exchange's boards, see `os::futex`), [`wait_blocking`]
//! blocks after the spins instead of sleeping, and [`blocking_pace`] chooses how long it spins:
//! long while every runnable thread has a core (a wake-up costs far more than a peer a few
//! microseconds late), hardly at all when the node is oversubscribed (a spinning waiter then
//! takes the core its peer needs to get there).

use std::time::{Duration, Instant};

/// How a wait polls: spins, then yields, then sleeps growing from `first_sleep` to `max_sleep`.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub spins: u32,
    pub yields: u32,
    pub first_sleep: Duration,
    pub max_sleep: Duration,
}

/// Longest sleep between two checks of [`wait_until`], which bounds the extra latency of a slow
/// wait.
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

/// How a blocking wait polls: `spins`, then `yields`, then blocks at most `slice` at a time
/// (between two slices the caller's check runs again, e.g. whether the peer still lives).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockingPace {
    pub spins: u32,
    pub yields: u32,
    pub slice: Duration,
}

/// Longest block of a [`wait_blocking`] between two checks, when no wake comes: bounds how late
/// a peer that died without waking anyone is noticed.
pub const BLOCK_SLICE: Duration = Duration::from_millis(20);

/// Every waiter has a core: spin for a peer tens of microseconds late, yield a little, block.
pub const SPIN_THEN_BLOCK: BlockingPace = BlockingPace {
    spins: 20_000,
    yields: 100,
    slice: BLOCK_SLICE,
};

/// More runnable threads than cores: stop spinning almost at once (a spin keeps the core the
/// peer needs) but yield a while before blocking: a yield hands the core to a runnable peer at
/// once, while a futex wake-up costs tens to hundreds of microseconds on an oversubscribed
/// node (measured on 2 cores: 2 yields before blocking put the 4-rank warm call at 11 us, 200 at
/// 2 us, with the 8-rank pool call at 45 us either way).
pub const BLOCK_SOON: BlockingPace = BlockingPace {
    spins: 50,
    yields: 200,
    slice: BLOCK_SLICE,
};

/// The pace of a wait on a peer where `local_ranks` ranks share the node (see
/// `os::cpu::oversubscribed`, which also counts the other runnable threads of the node).
pub fn blocking_pace(local_ranks: usize) -> BlockingPace {
    if crate::os::cpu::oversubscribed(local_ranks) {
        BLOCK_SOON
    } else {
        SPIN_THEN_BLOCK
    }
}

/// Calls `attempt(None)` (check now) until it returns `Some` or `timeout` has passed (then
/// `None`), spinning then yielding as `pace` says; after that calls `attempt(Some(slice))`,
/// which may block up to `slice` (until its writer wakes it) before it checks. With a zero
/// timeout `attempt(None)` is called exactly once.
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

/// Calls `ready` until it returns `Some` or `timeout` has passed (then `None`), at the
/// [`SHARED_MEMORY`] pace. With a zero timeout `ready` is checked exactly once.
pub fn wait_until<T>(timeout: Duration, ready: impl FnMut() -> Option<T>) -> Option<T> {
    wait_paced(SHARED_MEMORY, timeout, ready)
}

/// [`wait_until`] at another pace. The one place where "a zero timeout checks once" is made.
pub fn wait_paced<T>(
    pace: Pace,
    timeout: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Option<T> {
    if let Some(v) = ready() {
        return Some(v);
    }
    if timeout.is_zero() {
        return None;
    }
    for _ in 0..pace.spins {
        std::hint::spin_loop();
        if let Some(v) = ready() {
            return Some(v);
        }
    }
    let deadline = Instant::now() + timeout;
    for _ in 0..pace.yields {
        std::thread::yield_now();
        if let Some(v) = ready() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
    let mut sleep = pace.first_sleep;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return ready();
        }
        std::thread::sleep(sleep.min(deadline - now));
        sleep = (sleep * 2).min(pace.max_sleep);
        if let Some(v) = ready() {
            return Some(v);
        }
    }
}

#[cfg(test)]
mod tests;
