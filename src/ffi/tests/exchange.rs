use crate::error::Status;
use crate::exchange::{CacheStats, Direction};
use crate::ffi::exchange::*;
use crate::ffi::tests::last_error_message;

#[test]
fn null_and_freed_arguments_are_errors() {
    let mut out: *mut nvfipc_cache = std::ptr::null_mut();
    assert_eq!(
        nvfipc_cache_create(std::ptr::null(), &mut out),
        Status::InvalidArgument
    );
    assert!(out.is_null());
    assert_eq!(nvfipc_cache_free(std::ptr::null_mut()), Status::Ok);
    assert_eq!(
        nvfipc_exchange_handles(std::ptr::null(), std::ptr::null(), 0),
        Status::InvalidArgument
    );
    let mut stats = CacheStats::default();
    assert_eq!(
        nvfipc_cache_stats(std::ptr::null(), &mut stats),
        Status::InvalidArgument
    );
    assert!(last_error_message().contains("cache"));
}

#[test]
fn requests_are_validated() {
    let tag = c"t";
    let good = nvfipc_request {
        peer: 1,
        direction: NVFIPC_DIRECTION_RECV,
        kind: NVFIPC_MEM_HOST,
        tag: tag.as_ptr(),
        ptr: 0x1000,
        bytes: 8,
    };
    let r = request_arg(&good, 2, "r").unwrap();
    assert_eq!(r.direction, Direction::Recv);
    assert_eq!(r.tag, "t");
    let bad = [
        nvfipc_request { peer: -1, ..good },
        nvfipc_request { peer: 2, ..good },
        nvfipc_request {
            direction: 7,
            ..good
        },
        nvfipc_request { kind: 3, ..good },
        nvfipc_request {
            tag: std::ptr::null(),
            ..good
        },
    ];
    for b in bad {
        let err = request_arg(&b, 2, "r").unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
    }
}
