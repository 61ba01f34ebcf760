use super::*;
use crate::ffi::args::NVFIPC_MAX_STRING_LEN;
use crate::ffi::registry::into_handle;
use crate::store::memory::MemoryStore;
use std::ffi::CStr;

pub(crate) fn mem_store() -> *mut nvfipc_store {
    into_handle(nvfipc_store {
        store: Arc::new(MemoryStore::new()),
        tcp: None,
        callback: None,
    })
}

fn last_message() -> String {
    // SAFETY: never NULL; copied at once.
    unsafe { CStr::from_ptr(crate::ffi::boundary::nvfipc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn take(data: *mut u8, len: usize) -> Vec<u8> {
    // SAFETY: `data` is a live library buffer of `len + 1` bytes.
    let v = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
    assert_eq!(
        crate::ffi::registry::nvfipc_buffer_free(data, len),
        Status::Ok
    );
    v
}

#[test]
fn operations_round_trip() {
    let s = mem_store();
    assert_eq!(
        nvfipc_store_set(s, c"k".as_ptr(), b"v1".as_ptr(), 2),
        Status::Ok
    );
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    assert_eq!(
        nvfipc_store_get(s, c"k".as_ptr(), 0, &mut data, &mut len),
        Status::Ok
    );
    assert_eq!(take(data, len), b"v1");

    let mut n = 0i64;
    assert_eq!(nvfipc_store_add(s, c"c".as_ptr(), 5, &mut n), Status::Ok);
    assert_eq!(
        nvfipc_store_add(s, c"c".as_ptr(), -2, std::ptr::null_mut()),
        Status::Ok
    );
    assert_eq!(nvfipc_store_add(s, c"c".as_ptr(), 0, &mut n), Status::Ok);
    assert_eq!(n, 3);

    let keys = [c"k".as_ptr(), c"c".as_ptr()];
    let mut all = false;
    assert_eq!(
        nvfipc_store_check(s, keys.as_ptr(), 2, &mut all),
        Status::Ok
    );
    assert!(all);
    assert_eq!(nvfipc_store_wait(s, keys.as_ptr(), 2, 10), Status::Ok);

    assert_eq!(
        nvfipc_store_append(s, c"k".as_ptr(), b"+".as_ptr(), 1),
        Status::Ok
    );
    let values = [
        nvfipc_bytes {
            data: b"x".as_ptr(),
            len: 1,
        },
        nvfipc_bytes {
            data: std::ptr::null(),
            len: 0,
        },
    ];
    let mkeys = [c"m1".as_ptr(), c"m2".as_ptr()];
    assert_eq!(
        nvfipc_store_multi_set(s, mkeys.as_ptr(), values.as_ptr(), 2),
        Status::Ok
    );
    let empty = nvfipc_buffer {
        data: std::ptr::null_mut(),
        len: 0,
    };
    let mut outs = [empty; 3];
    let gkeys = [c"m1".as_ptr(), c"m2".as_ptr(), c"k".as_ptr()];
    assert_eq!(
        nvfipc_store_multi_get(s, gkeys.as_ptr(), 3, -1, outs.as_mut_ptr()),
        Status::Ok
    );
    // SAFETY: filled by multi_get with live buffers.
    let got: Vec<&[u8]> = outs
        .iter()
        .map(|b| unsafe { std::slice::from_raw_parts(b.data, b.len) })
        .collect();
    assert_eq!(got, [&b"x"[..], b"", b"v1+"]);
    assert_eq!(nvfipc_buffers_free(outs.as_mut_ptr(), 3), Status::Ok);
    assert!(outs.iter().all(|b| b.data.is_null() && b.len == 0));
    assert_eq!(nvfipc_buffers_free(outs.as_mut_ptr(), 3), Status::Ok);

    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    assert_eq!(
        nvfipc_store_compare_set(
            s,
            c"k".as_ptr(),
            b"v1+".as_ptr(),
            3,
            b"w".as_ptr(),
            1,
            &mut data,
            &mut len
        ),
        Status::Ok
    );
    assert_eq!(take(data, len), b"w");

    let mut deleted = false;
    assert_eq!(
        nvfipc_store_delete_key(s, c"k".as_ptr(), &mut deleted),
        Status::Ok
    );
    assert!(deleted);
    assert_eq!(
        nvfipc_store_delete_key(s, c"k".as_ptr(), &mut deleted),
        Status::Ok
    );
    assert!(!deleted);
    let mut num = 0i64;
    assert_eq!(nvfipc_store_num_keys(s, &mut num), Status::Ok);
    assert_eq!(num, 3);
    let mut ms = 0i64;
    assert_eq!(nvfipc_store_default_timeout_ms(s, &mut ms), Status::Ok);
    assert_eq!(ms, 300_000);
    assert_eq!(
        crate::ffi::store::nvfipc_store_ping(s, std::ptr::null_mut()),
        Status::Unsupported
    );
    assert_eq!(nvfipc_store_free(s), Status::Ok);
}

#[test]
fn misuse_is_reported_not_crashed() {
    let s = mem_store();
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    assert_eq!(
        nvfipc_store_get(s, c"missing".as_ptr(), 0, &mut data, &mut len),
        Status::Timeout
    );
    assert_eq!(
        last_message(),
        "nvfipc_store_get: not every key of 'missing' is set (timeout_ms = 0: checked once \
         without waiting)"
    );
    // A positive timeout is the backend's business (the in-memory store waits it out).
    assert_eq!(
        nvfipc_store_get(s, c"missing".as_ptr(), 5, &mut data, &mut len),
        Status::Timeout
    );
    assert!(last_message().starts_with("nvfipc_store_get: wait timeout, keys: [\"missing\"]"));
    assert_eq!(
        nvfipc_store_set(std::ptr::null(), c"k".as_ptr(), std::ptr::null(), 0),
        Status::InvalidArgument
    );
    assert_eq!(last_message(), "nvfipc_store_set: argument `store` is NULL");
    assert_eq!(
        nvfipc_store_set(s, std::ptr::null(), std::ptr::null(), 0),
        Status::InvalidArgument
    );
    assert_eq!(
        nvfipc_store_set(s, c"k".as_ptr(), std::ptr::null(), 4),
        Status::InvalidArgument
    );
    assert!(last_message().contains("`value` is NULL"));
    assert_eq!(
        nvfipc_store_get(s, c"k".as_ptr(), 0, std::ptr::null_mut(), &mut len),
        Status::InvalidArgument
    );
    let values = [nvfipc_bytes {
        data: std::ptr::null(),
        len: 1,
    }];
    let keys = [c"a".as_ptr()];
    assert_eq!(
        nvfipc_store_multi_set(s, keys.as_ptr(), values.as_ptr(), 1),
        Status::InvalidArgument
    );
    assert!(
        last_message().contains("`values[0]` is NULL"),
        "{}",
        last_message()
    );
    assert_eq!(
        nvfipc_store_multi_get(s, keys.as_ptr(), 1, 0, std::ptr::null_mut()),
        Status::InvalidArgument
    );
    assert_eq!(nvfipc_store_free(s), Status::Ok);
    assert_eq!(nvfipc_store_free(s), Status::InvalidState);
    assert!(
        last_message().contains("not a live nvfipc_store"),
        "{}",
        last_message()
    );
    assert_eq!(
        nvfipc_store_set(s, c"k".as_ptr(), std::ptr::null(), 0),
        Status::InvalidState
    );
    assert_eq!(nvfipc_store_free(std::ptr::null_mut()), Status::Ok);
}

#[test]
fn counts_and_lengths_above_their_limits_are_refused_before_anything_is_read() {
    let s = mem_store();
    let huge = 1usize << 40;
    let expect = |status: Status, text: &str| {
        assert_eq!(status, Status::InvalidArgument, "{text}");
        assert!(last_message().contains(text), "{}", last_message());
    };
    // Two real keys, a count that is not: the array is never read.
    let keys = [c"a".as_ptr(), c"b".as_ptr()];
    let mut all = false;
    let keys_limit = format!("`n_keys` = {huge} is above the limit of NVFIPC_MAX_KEYS = 131072");
    expect(
        nvfipc_store_check(s, keys.as_ptr(), huge, &mut all),
        &keys_limit,
    );
    expect(nvfipc_store_wait(s, keys.as_ptr(), huge, 0), &keys_limit);
    let n_limit = format!("`n` = {huge} is above the limit of NVFIPC_MAX_KEYS = 131072");
    let mut outs = [nvfipc_buffer {
        data: std::ptr::null_mut(),
        len: 0,
    }; 2];
    expect(
        nvfipc_store_multi_get(s, keys.as_ptr(), huge, 0, outs.as_mut_ptr()),
        &n_limit,
    );
    expect(nvfipc_buffers_free(outs.as_mut_ptr(), huge), &n_limit);
    let values = [nvfipc_bytes {
        data: b"x".as_ptr(),
        len: 1,
    }; 2];
    expect(
        nvfipc_store_multi_set(s, keys.as_ptr(), values.as_ptr(), NVFIPC_MAX_KEYS + 1),
        "`n` = 131073 is above the limit of NVFIPC_MAX_KEYS",
    );
    // Value lengths.
    let too_long = format!(
        "has a length of {huge} bytes, above the limit of NVFIPC_MAX_VALUE_LEN = 8388608 bytes"
    );
    let x = b"x".as_ptr();
    expect(nvfipc_store_set(s, c"k".as_ptr(), x, huge), &too_long);
    expect(nvfipc_store_append(s, c"k".as_ptr(), x, huge), &too_long);
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    expect(
        nvfipc_store_compare_set(s, c"k".as_ptr(), x, 1, x, huge, &mut data, &mut len),
        &format!("argument `desired` {too_long}"),
    );
    let spans = [nvfipc_bytes { data: x, len: huge }];
    expect(
        nvfipc_store_multi_set(s, keys.as_ptr(), spans.as_ptr(), 1),
        &format!("argument `values[0]` {too_long}"),
    );
    // Key lengths: the limit itself is accepted, one byte more is not.
    let at_limit = std::ffi::CString::new(vec![b'k'; NVFIPC_MAX_STRING_LEN]).unwrap();
    assert_eq!(nvfipc_store_set(s, at_limit.as_ptr(), x, 1), Status::Ok);
    let over = std::ffi::CString::new(vec![b'k'; NVFIPC_MAX_STRING_LEN + 1]).unwrap();
    expect(
        nvfipc_store_set(s, over.as_ptr(), x, 1),
        "argument `key` is longer than NVFIPC_MAX_STRING_LEN = 8192 bytes",
    );
    // Nothing was written by the refused calls.
    let mut num = 0i64;
    assert_eq!(nvfipc_store_num_keys(s, &mut num), Status::Ok);
    assert_eq!(num, 1);
    // A worker count is a world size (checked before any connection is tried).
    let mut out = std::ptr::null_mut();
    expect(
        nvfipc_store_connect(c"127.0.0.1".as_ptr(), 1, 10, i64::MAX, &mut out),
        "`wait_for_workers` = 9223372036854775807 is above the limit of NVFIPC_MAX_WORLD_SIZE",
    );
    assert!(out.is_null());
    assert_eq!(nvfipc_store_free(s), Status::Ok);
}
