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

#[test]
fn request_counts_above_the_limit_are_refused_before_the_array_is_read() {
    use crate::ffi::context::{nvfipc_context_create, nvfipc_context_free};
    use crate::ffi::store::{nvfipc_store_free, tests::mem_store};
    let store = mem_store();
    let (mut ctx, mut cache) = (std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(
        nvfipc_context_create(0, 1, 0, 1, store, &mut ctx),
        Status::Ok
    );
    assert_eq!(nvfipc_cache_create(ctx, &mut cache), Status::Ok);
    let req = nvfipc_request {
        peer: 0,
        direction: NVFIPC_DIRECTION_SEND,
        kind: NVFIPC_MEM_HOST,
        tag: c"t".as_ptr(),
        ptr: 0x1000,
        bytes: 8,
    };
    let two = [req, req];
    for n in [1usize << 40, NVFIPC_MAX_REQUESTS + 1, usize::MAX] {
        assert_eq!(
            nvfipc_exchange_handles(cache, two.as_ptr(), n),
            Status::InvalidArgument
        );
        let message = last_error_message();
        assert!(
            message.contains(&format!(
                "`n` = {n} is above the limit of NVFIPC_MAX_REQUESTS = 4096"
            )),
            "{message}"
        );
    }
    // Within the limit the requests themselves are read and checked (peer 0 is this rank).
    assert_eq!(
        nvfipc_exchange_handles_timeout(cache, two.as_ptr(), 2, 0),
        Status::InvalidArgument
    );
    assert!(
        last_error_message().contains("peer"),
        "{}",
        last_error_message()
    );
    assert_eq!(nvfipc_cache_free(cache), Status::Ok);
    assert_eq!(nvfipc_context_free(ctx), Status::Ok);
    assert_eq!(nvfipc_store_free(store), Status::Ok);
}

#[test]
fn tags_longer_than_the_string_limit_are_refused() {
    use crate::ffi::args::NVFIPC_MAX_STRING_LEN;
    let long = std::ffi::CString::new(vec![b'a'; NVFIPC_MAX_STRING_LEN + 1]).unwrap();
    let req = nvfipc_request {
        peer: 1,
        direction: NVFIPC_DIRECTION_SEND,
        kind: NVFIPC_MEM_HOST,
        tag: long.as_ptr(),
        ptr: 0x1000,
        bytes: 8,
    };
    let err = request_arg(&req, 2, "req").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message
            .contains("`req.tag` is longer than NVFIPC_MAX_STRING_LEN = 8192"),
        "{}",
        err.message
    );
}
