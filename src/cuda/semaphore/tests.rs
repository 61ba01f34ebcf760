use super::*;
use crate::error::Status;
use crate::transport::slab::SLAB_SLOTS;

#[test]
fn without_driver_every_call_reports_cuda_unavailable() {
    if driver::is_available() {
        return;
    }
    let slab = new_slab(crate::cuda::runtime(), None);
    assert_eq!(
        slab.allocate_slot().unwrap_err().status,
        Status::CudaUnavailable
    );
    assert_eq!(slab.local(0).unwrap_err().status, Status::CudaUnavailable);
    assert_eq!(slab.export().unwrap_err().status, Status::CudaUnavailable);
    drop(slab);
}

#[test]
fn slot_arguments_are_checked_before_the_driver() {
    let slab = new_slab(crate::cuda::runtime(), Some(0));
    let err = slab.local(SLAB_SLOTS).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("out of range"), "{err}");
    let err = slab.free_slot(3).unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    let host = ExportedHandle::plain(HandleType::PosixFd, [1; 64]);
    assert_eq!(
        slab.import_peer(1, &host, Duration::ZERO)
            .unwrap_err()
            .status,
        Status::InvalidArgument
    );
}
