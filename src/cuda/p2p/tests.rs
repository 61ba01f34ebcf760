use super::*;

fn endpoint() -> Endpoint {
    Endpoint {
        local_ptr: 0x1000,
        local_bytes: 32,
        local_semaphore: 0x2000,
        peer_ptr: 0x3000,
        peer_bytes: 32,
        peer_semaphore: 0x4000,
    }
}

#[test]
fn arguments_are_checked_before_any_driver_call() {
    let mut ep = endpoint();
    ep.peer_semaphore = 0;
    let err = send_post(&ep, 1, Stream(0)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("peer semaphore is NULL"), "{err}");
    let err = recv_post(&endpoint(), 1, 64, Stream(0)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("does not fit"), "{err}");
    let err = send_wait(&endpoint(), 0, Stream(0)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    if !driver::is_available() {
        let err = send_post(&endpoint(), 1, Stream(0)).unwrap_err();
        assert_eq!(err.status, Status::CudaUnavailable);
    }
}

fn handles(kind: MemKind) -> P2pHandles {
    let e = endpoint();
    P2pHandles {
        kind,
        local_ptr: e.local_ptr,
        local_bytes: e.local_bytes,
        local_semaphore: e.local_semaphore,
        peer_ptr: e.peer_ptr,
        peer_bytes: e.peer_bytes,
        peer_semaphore: e.peer_semaphore,
        epochs: Default::default(),
        peer: crate::node::PeerProcess {
            rank: 1,
            pid: 0,
            checkable: false,
        },
    }
}

#[test]
fn channel_counters_move_only_on_valid_calls() {
    let host = handles(MemKind::Host);
    let err = channel_send_post(&host, Stream(0)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(host.epochs.last_send(), 0);
    let dev = handles(MemKind::Device);
    let err = channel_send_wait(&dev, Stream(0)).unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    let err = channel_recv_post(&dev, 1024, Stream(0)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(dev.epochs.last_recv(), 0);
    if !driver::is_available() {
        assert_eq!(
            channel_send_post(&dev, Stream(0)).unwrap_err().status,
            Status::CudaUnavailable
        );
        assert_eq!(dev.epochs.last_send(), 0);
    }
}

#[test]
fn unsupported_memops_are_reported_as_unsupported() {
    let err = memop_error(
        "cuStreamWaitValue32",
        sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
        format_args!("wait"),
    );
    assert_eq!(err.status, Status::Unsupported);
    assert!(err.message.contains("stream memory operations"), "{err}");
    let err = memop_error(
        "cuStreamWaitValue32",
        sys::CUresult::CUDA_ERROR_INVALID_HANDLE,
        format_args!("wait"),
    );
    assert_eq!(err.status, Status::Cuda);
}
