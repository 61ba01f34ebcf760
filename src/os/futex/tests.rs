use super::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

#[test]
fn a_wait_on_a_changed_word_returns_at_once_and_one_times_out() {
    let w = AtomicU32::new(1);
    let start = Instant::now();
    wait(&w, 0, Duration::from_secs(5));
    assert!(start.elapsed() < Duration::from_secs(4));
    let start = Instant::now();
    wait(&w, 1, Duration::from_millis(20));
    assert!(start.elapsed() >= Duration::from_millis(15));
}

#[test]
fn a_wake_ends_a_wait() {
    let w = Arc::new(AtomicU32::new(0));
    let waiter = {
        let w = w.clone();
        std::thread::spawn(move || {
            while w.load(Ordering::Acquire) == 0 {
                wait(&w, 0, Duration::from_secs(30));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let start = Instant::now();
    w.store(1, Ordering::Release);
    wake_all(&w);
    waiter.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
}
