use crate::error::Status;
use crate::ffi::host::*;
use std::ffi::c_void;

#[test]
fn alloc_and_free_check_arguments() {
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(nvfipc_host_alloc(0, &mut p), Status::InvalidArgument);
    assert_eq!(
        nvfipc_host_alloc(16, std::ptr::null_mut()),
        Status::InvalidArgument
    );
    assert_eq!(nvfipc_host_alloc(16, &mut p), Status::Ok);
    assert!(!p.is_null());
    assert_eq!(nvfipc_host_free(p), Status::Ok);
    assert_eq!(nvfipc_host_free(p), Status::InvalidArgument, "double free");
    assert_eq!(nvfipc_host_free(std::ptr::null_mut()), Status::Ok);
    assert_eq!(
        nvfipc_host_p2p_send_post(std::ptr::null(), std::ptr::null()),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_host_channel_send_post(std::ptr::null()),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_host_channel_recv_post(std::ptr::null(), 8, 0),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_host_channel_send_wait(std::ptr::null(), 0),
        Status::InvalidArgument
    );
}
