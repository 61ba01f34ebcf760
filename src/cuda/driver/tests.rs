use super::*;

#[test]
fn missing_library_is_a_clean_error() {
    let err = load(|| false, Vec::new).unwrap_err();
    assert_eq!(err.status, Status::CudaUnavailable);
    assert!(
        err.message
            .starts_with("CUDA driver not available (libcuda.so.1 not found)"),
        "{err}"
    );
}

#[test]
fn missing_symbols_are_named() {
    let err = load(|| true, || vec!["cuFoo", "cuBar"]).unwrap_err();
    assert_eq!(err.status, Status::CudaUnavailable);
    assert!(err.message.contains("cuFoo, cuBar"), "{err}");
}

#[test]
fn driver_state_is_consistent_and_never_panics() {
    // On a machine without libcuda every entry point reports CudaUnavailable; with a driver
    // they agree with `driver()`.
    let loaded = driver();
    if !library_present() {
        let err = loaded.unwrap_err();
        assert_eq!(err.status, Status::CudaUnavailable);
        assert!(!is_available());
        assert_eq!(
            current_context().unwrap_err().status,
            Status::CudaUnavailable
        );
        assert_eq!(device_count().unwrap_err().status, Status::CudaUnavailable);
        assert_eq!(device_uuid(0).unwrap_err().status, Status::CudaUnavailable);
        assert_eq!(
            ensure_context(None).unwrap_err().status,
            Status::CudaUnavailable
        );
    } else {
        assert_eq!(loaded.is_ok(), is_available());
    }
}

#[test]
fn check_names_the_call() {
    assert!(check(sys::CUresult::CUDA_SUCCESS, "cuX").is_ok());
    let err = check(
        sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        "cuIpcOpenMemHandle",
    )
    .unwrap_err();
    assert_eq!(err.status, Status::Cuda);
    assert!(
        err.message.starts_with("cuIpcOpenMemHandle failed: "),
        "{err}"
    );
    assert!(err.message.contains("CUDA_ERROR_INVALID_VALUE"), "{err}");
}

#[test]
fn versions_format() {
    assert_eq!(format_version(13000), "13.0");
    assert_eq!(format_version(12040), "12.4");
    assert_eq!(format_version(MIN_DRIVER_VERSION), "11.7");
}
