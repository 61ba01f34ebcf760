use super::*;
use std::sync::mpsc;

/// The test's hold on a releaser's steps (no GPU involved: this tests the queue, the bounds
/// and the revival, not the driver). Each drain waits for one message on `drain` (the device
/// work before the close); the close of a job whose target is 100 or more also waits for one
/// on `close`; a target of 0 makes the close fail. Closed keys are reported on `done`.
struct Gates {
    drain: mpsc::Sender<()>,
    close: mpsc::Sender<()>,
    done: mpsc::Receiver<u32>,
}

fn gated() -> (Arc<Releaser<u32, u64>>, Gates) {
    let (drain_tx, drain_rx) = mpsc::channel::<()>();
    let (close_tx, close_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<u32>();
    let (drain_rx, close_rx, done_tx) = (
        Mutex::new(drain_rx),
        Mutex::new(close_rx),
        Mutex::new(done_tx),
    );
    let r = Releaser::new(
        "nvfipc-test-releaser",
        crate::cuda::DEFAULT_MAX_PENDING_PER_PEER,
        move |_: &ReleaseJob<u32, u64>| {
            lock(&drain_rx)
                .recv()
                .map_err(|_| Error::internal("gate closed"))
        },
        move |job: &ReleaseJob<u32, u64>| {
            if job.target >= 100 {
                lock(&close_rx)
                    .recv()
                    .map_err(|_| Error::internal("gate closed"))?;
            }
            let _ = lock(&done_tx).send(job.key);
            if job.target == 0 {
                return Err(Error::internal("close failed on purpose"));
            }
            Ok(())
        },
    );
    let gates = Gates {
        drain: drain_tx,
        close: close_tx,
        done: done_rx,
    };
    (r, gates)
}

fn wait_until_phase(r: &Releaser<u32, u64>, key: u32, phase: ReleasePhase) {
    let start = Instant::now();
    loop {
        let there = lock(&r.state)
            .running
            .as_ref()
            .is_some_and(|run| run.job.key == key && run.phase == phase);
        if there {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "key {key} never reached {phase:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn submit_returns_at_once_and_the_thread_closes_in_order() {
    let (r, g) = gated();
    r.submit(1, 7, 10).unwrap();
    r.submit(2, 7, 20).unwrap();
    // Nothing has been let through, yet submit returned.
    assert_eq!(Releaser::pending_of(&lock(&r.state), 7), 2);
    assert_eq!(r.counters().pending, 2);
    g.drain.send(()).unwrap();
    g.drain.send(()).unwrap();
    assert_eq!(g.done.recv().unwrap(), 1);
    assert_eq!(g.done.recv().unwrap(), 2);
    r.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(Releaser::pending_of(&lock(&r.state), 7), 0);
    let c = r.counters();
    assert_eq!((c.pending, c.finished, c.errors), (0, 2, 0));
}

#[test]
fn back_pressure_waits_then_names_the_peer() {
    let (r, g) = gated();
    for key in 0..3 {
        r.submit(key + 10, 4, 1).unwrap();
    }
    wait_until_phase(&r, 10, ReleasePhase::Draining);
    let err = r.wait_below(4, 1, Duration::from_millis(50)).unwrap_err();
    assert_eq!(err.status, crate::error::Status::Timeout);
    assert!(
        err.message.contains("3 replaced mappings of peer rank 4"),
        "{err}"
    );
    assert!(err.message.contains("at most 1 may wait"), "{err}");
    assert!(err.message.contains("closing a mapping of rank 4"), "{err}");
    // Another peer is not held back.
    r.wait_below(5, 1, Duration::ZERO).unwrap();
    // Let two through: now only one waits, and the bounded wait succeeds.
    g.drain.send(()).unwrap();
    g.drain.send(()).unwrap();
    assert_eq!(g.done.recv().unwrap(), 10);
    assert_eq!(g.done.recv().unwrap(), 11);
    r.wait_below(4, 1, Duration::from_secs(10)).unwrap();
    g.drain.send(()).unwrap();
    r.flush(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_mapping_opened_again_before_its_close_is_taken_back() {
    let (r, g) = gated();
    r.submit(1, 0, 11).unwrap();
    r.submit(2, 0, 22).unwrap();
    wait_until_phase(&r, 1, ReleasePhase::Draining);
    // Key 1 waits for device work, key 2 is queued: both are intact and come back.
    assert!(matches!(r.revive(&2), Revive::Queued(22)));
    assert!(matches!(r.revive(&1), Revive::Queued(11)));
    assert!(matches!(r.revive(&1), Revive::Absent), "taken back once");
    assert!(matches!(r.revive(&3), Revive::Absent));
    assert!(r.wait_not_closing(&1, Duration::ZERO));
    assert_eq!(r.counters().pending, 0);
    r.flush(Duration::ZERO).unwrap();
    // The drain ends; the thread then skips the close of the job taken back.
    g.drain.send(()).unwrap();
    r.submit(3, 0, 33).unwrap();
    g.drain.send(()).unwrap();
    assert_eq!(g.done.recv().unwrap(), 3, "key 1 was never closed");
    r.flush(Duration::from_secs(10)).unwrap();
    let c = r.counters();
    assert_eq!((c.pending, c.finished, c.revived), (0, 1, 2));
}

#[test]
fn a_mapping_inside_its_close_is_waited_for() {
    let (r, g) = gated();
    r.submit(1, 0, 100).unwrap();
    g.drain.send(()).unwrap();
    wait_until_phase(&r, 1, ReleasePhase::Closing);
    assert!(matches!(r.revive(&1), Revive::Closing));
    assert!(!r.wait_not_closing(&1, Duration::from_millis(20)));
    g.close.send(()).unwrap();
    assert!(r.wait_not_closing(&1, Duration::from_secs(10)));
    assert_eq!(g.done.recv().unwrap(), 1);
    r.flush(Duration::from_secs(10)).unwrap();
    assert!(matches!(r.revive(&1), Revive::Absent));
}

#[test]
fn flush_is_bounded_and_failed_closes_are_counted() {
    let (r, g) = gated();
    r.submit(1, 0, 0).unwrap(); // target 0: the close fails
    assert_eq!(r.flush(Duration::from_millis(20)), Err(1));
    g.drain.send(()).unwrap();
    r.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(r.counters().errors, 1);
    // Closes submitted after a flush began are not waited for by it.
    assert_eq!(r.flush(Duration::ZERO), Ok(()));
}

#[test]
fn flush_waits_for_earlier_closes_whatever_happens_to_later_ones() {
    let (r, g) = gated();
    r.submit(1, 0, 1).unwrap(); // will be draining
    r.submit(2, 0, 1).unwrap(); // stays queued
    wait_until_phase(&r, 1, ReleasePhase::Draining);
    let flusher = {
        let r = Arc::clone(&r);
        std::thread::spawn(move || r.flush(Duration::from_millis(1500)))
    };
    std::thread::sleep(Duration::from_millis(20));
    // A later close, taken back at once, must not let the flush count key 2 as done.
    r.submit(3, 0, 1).unwrap();
    assert!(matches!(r.revive(&3), Revive::Queued(1)));
    g.drain.send(()).unwrap(); // key 1 closes; key 2 then drains behind the gate
    assert_eq!(flusher.join().unwrap(), Err(1));
    g.drain.send(()).unwrap();
    r.flush(Duration::from_secs(10)).unwrap();
}

#[test]
fn the_bound_is_at_least_one() {
    let r = Releaser::<u32, u64>::new("nvfipc-test-releaser", 0, |_| Ok(()), |_| Ok(()));
    assert_eq!(r.max_pending, 1);
    assert_eq!(
        crate::cuda::runtime().ipc.wait_room(0, Duration::ZERO),
        Ok(())
    );
}
