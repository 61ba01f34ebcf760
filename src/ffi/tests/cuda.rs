use crate::cuda::driver;
use crate::error::Status;
use crate::ffi::cuda::*;
use crate::ffi::exchange::nvfipc_request;
use crate::ffi::tests::last_error_message;

#[test]
fn cache_primitives_check_their_arguments() {
    let tag = c"t";
    let req = nvfipc_request {
        peer: 1,
        direction: crate::ffi::exchange::NVFIPC_DIRECTION_SEND,
        kind: crate::ffi::exchange::NVFIPC_MEM_DEVICE,
        tag: tag.as_ptr(),
        ptr: 0x1000,
        bytes: 8,
    };
    let null = std::ptr::null_mut();
    assert_eq!(
        nvfipc_cuda_p2p_send_post(std::ptr::null(), &req, null),
        Status::InvalidArgument
    );
    assert!(last_error_message().contains("cache"));
    assert_eq!(
        nvfipc_cuda_p2p_recv_post(std::ptr::null(), &req, 8, null),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_cuda_p2p_send_wait(std::ptr::null(), std::ptr::null(), null),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_cuda_channel_send_post(std::ptr::null(), null),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_cuda_channel_recv_post(std::ptr::null(), 8, null),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_cuda_channel_send_wait(std::ptr::null(), null),
        Status::InvalidArgument
    );
}

#[test]
fn available_never_fails() {
    let mut out = true;
    assert_eq!(nvfipc_cuda_available(&mut out), Status::Ok);
    assert_eq!(out, driver::is_available());
    assert_eq!(
        nvfipc_cuda_available(std::ptr::null_mut()),
        Status::InvalidArgument
    );
}

#[test]
fn check_reports_why_cuda_is_missing() {
    let status = nvfipc_cuda_check();
    if driver::is_available() {
        assert_eq!(status, Status::Ok);
    } else {
        assert_eq!(status, Status::CudaUnavailable);
        assert!(last_error_message().contains("libcuda.so.1"));
    }
}

#[test]
fn bad_arguments_give_statuses() {
    assert_eq!(
        nvfipc_cuda_check_pointer(std::ptr::null(), 4, std::ptr::null_mut()),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_cuda_endpoint_send_post(std::ptr::null(), 1, std::ptr::null_mut()),
        Status::InvalidArgument
    );
    let ep = nvfipc_p2p_endpoint {
        local_ptr: 0x1000,
        local_bytes: 16,
        local_semaphore: 0x2000,
        peer_ptr: 0x3000,
        peer_bytes: 16,
        peer_semaphore: 0x4000,
    };
    assert_eq!(
        nvfipc_cuda_endpoint_recv_post(&ep, 1, 32, std::ptr::null_mut()),
        Status::InvalidArgument
    );
    assert!(last_error_message().contains("does not fit"));
    assert_eq!(
        nvfipc_cuda_endpoint_send_wait(&ep, 0, std::ptr::null_mut()),
        Status::InvalidArgument
    );
    let mut counters = nvfipc_cuda_ipc_counters::default();
    assert_eq!(nvfipc_cuda_ipc_counters_get(&mut counters), Status::Ok);
    assert_eq!(counters.opens, counters.closes + counters.live);
}

#[test]
fn ipc_peers_are_ranks_of_a_possible_world() {
    let handle = nvfipc_cuda_ipc_handle { bytes: [0; 64] };
    let mut base = 0u64;
    for peer in [-1i64, 1 << 40] {
        assert_eq!(
            nvfipc_cuda_ipc_open(peer, &handle, &mut base),
            Status::InvalidArgument
        );
        let expected = format!("`peer` = {peer} is not a rank of a world of size 131072");
        assert!(
            last_error_message().contains(&expected),
            "{}",
            last_error_message()
        );
        assert_eq!(
            nvfipc_cuda_ipc_close(peer, &handle),
            Status::InvalidArgument
        );
    }
}

#[test]
fn the_driver_clock_counts_only_while_on_and_restarts_at_each_read() {
    use crate::cuda::clock::DriverCall;
    let clock = &crate::cuda::runtime().clock;
    let pause = || std::thread::sleep(std::time::Duration::from_millis(2));
    assert_eq!(
        nvfipc_cuda_driver_clock(1, std::ptr::null_mut()),
        Status::Ok
    );
    clock.time(DriverCall::Map, pause);
    clock.time(DriverCall::Map, pause);
    let mut read = nvfipc_cuda_driver_time::default();
    assert_eq!(nvfipc_cuda_driver_clock(0, &mut read), Status::Ok);
    assert_eq!(read.map_calls, 2);
    assert!(read.map_ns >= 4_000_000, "{read:?}");
    // Off: nothing is counted, and the last read started again from zero.
    clock.time(DriverCall::Map, pause);
    assert_eq!(nvfipc_cuda_driver_clock(0, &mut read), Status::Ok);
    assert_eq!((read.map_calls, read.map_ns), (0, 0), "{read:?}");
}
