use super::*;
use crate::error::Status;

#[test]
fn close_of_unknown_handle_is_not_found() {
    let err = close(3, &[7; HANDLE_LEN], 0).unwrap_err();
    assert_eq!(err.status, Status::NotFound);
    assert!(err.message.contains("rank 3"), "{err}");
    assert!(err.message.contains("released twice"), "{err}");
    assert_eq!(counters().pending_closes, 0);
}

#[test]
fn with_nothing_queued_the_bounded_waits_return_at_once() {
    runtime().ipc.wait_room(5, Duration::ZERO).unwrap();
    runtime().flush_releases(Duration::ZERO).unwrap();
}

#[test]
fn without_driver_export_and_open_fail_cleanly() {
    if driver::is_available() {
        return;
    }
    assert_eq!(
        export(runtime(), 0x1000, 1).unwrap_err().status,
        Status::CudaUnavailable
    );
    assert_eq!(
        open(1, Some(1), &[1; HANDLE_LEN], None, Duration::ZERO)
            .unwrap_err()
            .status,
        Status::CudaUnavailable
    );
    assert_eq!(counters().opens, 0);
}
