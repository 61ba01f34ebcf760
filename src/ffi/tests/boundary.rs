use crate::error::{Error, Status};
use crate::ffi::boundary::*;
use std::ffi::CStr;

use crate::ffi::tests::last_error_message as message_of_last_error;

#[test]
fn last_error_is_empty_before_any_failure_and_survives_success() {
    std::thread::spawn(|| {
        assert_eq!(message_of_last_error(), "");
        assert_eq!(nvfipc_last_error_status(), Status::Ok);
        let st = ffi_call::<()>("nvfipc_x", || {
            Err(Error::timeout("waited 5 ms for key 'k'"))
        });
        assert_eq!(st, Status::Timeout);
        assert_eq!(message_of_last_error(), "nvfipc_x: waited 5 ms for key 'k'");
        assert_eq!(ffi_call::<()>("nvfipc_y", || Ok(())), Status::Ok);
        assert_eq!(nvfipc_last_error_status(), Status::Timeout);
        assert_eq!(message_of_last_error(), "nvfipc_x: waited 5 ms for key 'k'");
        nvfipc_last_error_clear();
        assert_eq!(nvfipc_last_error_status(), Status::Ok);
        assert_eq!(message_of_last_error(), "");
    })
    .join()
    .unwrap();
}

#[test]
fn last_error_is_per_thread() {
    ffi_call::<()>("nvfipc_main", || Err(Error::io("main thread failure")));
    std::thread::spawn(|| {
        assert_eq!(message_of_last_error(), "");
        ffi_call::<()>("nvfipc_other", || Err(Error::not_found("other")));
    })
    .join()
    .unwrap();
    assert_eq!(message_of_last_error(), "nvfipc_main: main thread failure");
}

#[test]
fn panics_become_status_panic_with_message() {
    let st = ffi_call::<()>("nvfipc_boom", || panic!("exploded at step {}", 3));
    assert_eq!(st, Status::Panic);
    let msg = message_of_last_error();
    assert!(
        msg.starts_with("nvfipc_boom: internal panic: exploded at step 3"),
        "{msg}"
    );
    let st = ffi_call::<()>("nvfipc_boom2", || std::panic::panic_any(17u32));
    assert_eq!(st, Status::Panic);
    assert!(message_of_last_error().contains("non-string panic payload"));
}

#[test]
fn interior_nul_in_message_is_escaped() {
    ffi_call::<()>("nvfipc_n", || Err(Error::protocol("a\0b")));
    assert_eq!(message_of_last_error(), "nvfipc_n: a\\0b");
}

#[test]
fn status_names_cover_every_status() {
    for s in ALL_STATUSES {
        // SAFETY: static NUL-terminated strings.
        let name = unsafe { CStr::from_ptr(nvfipc_status_name(s as i32)) };
        assert_eq!(name.to_str().unwrap(), s.name());
    }
    // SAFETY: as above.
    let unknown = unsafe { CStr::from_ptr(nvfipc_status_name(99)) };
    assert_eq!(unknown.to_str().unwrap(), "unknown status");
    assert_eq!(ALL_STATUSES.len(), Status::Internal as usize + 1);
}

const ALL_STATUSES: [Status; 12] = [
    Status::Ok,
    Status::InvalidArgument,
    Status::Timeout,
    Status::Io,
    Status::Protocol,
    Status::NotFound,
    Status::Cuda,
    Status::CudaUnavailable,
    Status::Unsupported,
    Status::InvalidState,
    Status::Panic,
    Status::Internal,
];
