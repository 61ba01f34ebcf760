use super::*;
use crate::error::Status;
use crate::transport::record::{flags, local_host, to_fixed};

#[test]
fn without_driver_the_transport_is_unavailable() {
    if driver::is_available() {
        return;
    }
    let err = CudaTransport::with_fdpass(None, None)
        .err()
        .expect("no driver here");
    assert_eq!(err.status, Status::CudaUnavailable);
    assert!(err.message.contains("libcuda.so.1"), "{err}");
}

#[test]
fn host_records_are_refused() {
    let transport = CudaTransport::unloaded(None, None, 0);
    let host = local_host();
    let rec = Record {
        handle_type: HandleType::PosixFd,
        flags: 0,
        offset: 0,
        bytes: 16,
        alloc_bytes: 4096,
        buffer_id: 1,
        host_id: host.id,
        version: 1,
        device_uuid: [0; 16],
        pid: 1,
        rank: 1,
        host_name: to_fixed(&host.name).unwrap(),
        payload: to_fixed("/seg").unwrap(),
        sem_type: HandleType::PosixFd,
        sem_slot: 0,
        sem_payload: to_fixed("/sem").unwrap(),
        segments: Vec::new(),
    };
    assert_eq!(rec.flags & flags::DEVICE, 0);
    let err = transport.import(&rec, Duration::ZERO).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(transport.live_mappings(), 0);
    assert_eq!(transport.kind(), MemKind::Device);
}
