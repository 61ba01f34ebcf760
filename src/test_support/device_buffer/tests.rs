use super::*;
use crate::error::Status;

#[test]
fn without_a_driver_everything_is_a_clean_error() {
    if driver::is_available() {
        let buf = DeviceBuffer::alloc(64).unwrap();
        buf.write(0, &[7u8; 64]).unwrap();
        let mut out = [0u8; 64];
        buf.read(0, &mut out).unwrap();
        assert_eq!(out, [7u8; 64]);
        assert!(buf.write(60, &[0u8; 8]).is_err());
        let stream = DeviceStream::new().unwrap();
        stream.synchronize().unwrap();
    } else {
        let err = DeviceBuffer::alloc(64).unwrap_err();
        assert_eq!(err.status, Status::CudaUnavailable);
        assert_eq!(
            DeviceStream::new().unwrap_err().status,
            Status::CudaUnavailable
        );
    }
    assert_eq!(
        DeviceBuffer::alloc(0).unwrap_err().status,
        Status::InvalidArgument
    );
}
