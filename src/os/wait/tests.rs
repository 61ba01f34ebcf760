use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[test]
fn returns_immediately_when_ready() {
    assert_eq!(wait_until(Duration::ZERO, || Some(3)), Some(3));
}

#[test]
fn zero_timeout_checks_once() {
    let mut calls = 0;
    assert_eq!(
        wait_until(Duration::ZERO, || {
            calls += 1;
            None::<()>
        }),
        None
    );
    assert_eq!(calls, 1);
}

#[test]
fn times_out_within_bounds() {
    let start = Instant::now();
    assert_eq!(wait_until(Duration::from_millis(30), || None::<()>), None);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(30), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_blocking_wait_blocks_after_its_spins_and_ends_at_its_timeout() {
    let pace = BlockingPace {
        spins: 10,
        yields: 1,
        slice: Duration::from_millis(5),
    };
    let (mut checks, mut blocks) = (0, 0);
    let start = Instant::now();
    let got = wait_blocking(pace, Duration::from_millis(30), |block| {
        match block {
            Some(d) => {
                assert!(d <= pace.slice);
                blocks += 1;
                std::thread::sleep(d);
            }
            None => checks += 1,
        }
        None::<()>
    });
    assert_eq!(got, None);
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert!(
        checks >= 12,
        "first check, spins, yields and the last check: {checks}"
    );
    assert!(blocks >= 2, "{blocks}");
    let mut calls = 0;
    assert_eq!(
        wait_blocking(pace, Duration::ZERO, |_| {
            calls += 1;
            None::<()>
        }),
        None
    );
    assert_eq!(calls, 1);
}

#[test]
fn the_pace_spins_less_when_ranks_outnumber_cores() {
    let cores = usable_cores();
    assert_eq!(blocking_pace(cores + 1), BLOCK_SOON);
    const { assert!(BLOCK_SOON.spins < SPIN_THEN_BLOCK.spins) };
}

#[test]
fn sees_a_value_written_by_another_thread() {
    let flag = Arc::new(AtomicU32::new(0));
    let writer = {
        let flag = flag.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            flag.store(7, Ordering::Release);
        })
    };
    let got = wait_until(Duration::from_secs(5), || {
        let v = flag.load(Ordering::Acquire);
        (v != 0).then_some(v)
    });
    writer.join().unwrap();
    assert_eq!(got, Some(7));
}

#[test]
fn parses_the_runnable_field_of_loadavg() {
    assert_eq!(parse_runnable("0.03 0.66 1.18 3/412 9921\n"), Some(3));
    assert_eq!(parse_runnable("0.03 0.66"), None);
    assert!(runnable_threads().is_some_and(|r| r >= 1));
}

#[test]
fn more_ranks_than_cores_is_oversubscribed() {
    assert!(usable_cores() >= 1);
    assert!(oversubscribed(usable_cores() + 1));
}

#[test]
fn a_wait_on_a_changed_word_returns_at_once_and_one_times_out() {
    let w = AtomicU32::new(1);
    let start = Instant::now();
    futex_wait(&w, 0, Duration::from_secs(5));
    assert!(start.elapsed() < Duration::from_secs(4));
    let start = Instant::now();
    futex_wait(&w, 1, Duration::from_millis(20));
    assert!(start.elapsed() >= Duration::from_millis(15));
}

#[test]
fn a_wake_ends_a_wait() {
    let w = Arc::new(AtomicU32::new(0));
    let waiter = {
        let w = w.clone();
        std::thread::spawn(move || {
            while w.load(Ordering::Acquire) == 0 {
                futex_wait(&w, 0, Duration::from_secs(30));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let start = Instant::now();
    w.store(1, Ordering::Release);
    futex_wake_all(&w);
    waiter.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
}
