use crate::error::Status;
use crate::ffi::channel::*;
use crate::ffi::exchange::nvfipc_p2p_handle;
use crate::ffi::tests::last_error_message;

#[test]
fn null_and_foreign_arguments_are_errors() {
    let mut out: *mut nvfipc_channel = std::ptr::null_mut();
    assert_eq!(
        nvfipc_channel_open(std::ptr::null(), std::ptr::null(), &mut out),
        Status::InvalidArgument
    );
    assert!(out.is_null());
    assert_eq!(nvfipc_channel_free(std::ptr::null_mut()), Status::Ok);
    let mut h = nvfipc_p2p_handle::default();
    assert_eq!(
        nvfipc_channel_handles(std::ptr::null(), &mut h),
        Status::InvalidArgument
    );
    assert!(
        last_error_message().contains("`ch`"),
        "{}",
        last_error_message()
    );
    let mut word = 0u64;
    let foreign = &mut word as *mut u64 as *mut nvfipc_channel;
    assert_eq!(
        nvfipc_channel_handles(foreign, &mut h),
        Status::InvalidState
    );
    assert!(last_error_message().contains("not a live nvfipc_channel"));
    assert_eq!(nvfipc_channel_free(foreign), Status::InvalidState);
}
