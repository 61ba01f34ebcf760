use super::*;
use crate::error::Status;

#[test]
fn string_arguments_are_checked() {
    let err = c_str_arg(std::ptr::null(), "key").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("`key` is NULL"));
    let bad = [b'a', 0xff, 0];
    let err = c_str_arg(bad.as_ptr().cast(), "key").unwrap_err();
    assert!(err.message.contains("not valid UTF-8"), "{}", err.message);
    assert_eq!(c_str_arg(c"hello".as_ptr(), "key").unwrap(), "hello");
    let arr = [c"a".as_ptr(), std::ptr::null()];
    let err = c_str_array_arg(arr.as_ptr(), 2, "keys", "n").unwrap_err();
    assert!(err.message.contains("`keys[1]` is NULL"), "{}", err.message);
    assert_eq!(
        c_str_array_arg(arr.as_ptr(), 1, "keys", "n").unwrap(),
        ["a"]
    );
    assert!(c_str_array_arg(std::ptr::null(), 0, "keys", "n")
        .unwrap()
        .is_empty());
    // The count is checked before the array is read or anything allocated for it.
    let err = c_str_array_arg(arr.as_ptr(), usize::MAX, "keys", "n").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message.contains("`n` = 18446744073709551615"),
        "{}",
        err.message
    );
}

#[test]
fn string_lengths_are_bounded() {
    let at_limit = std::ffi::CString::new(vec![b'x'; NVFIPC_MAX_STRING_LEN]).unwrap();
    assert_eq!(
        c_str_arg(at_limit.as_ptr(), "tag").unwrap().len(),
        NVFIPC_MAX_STRING_LEN
    );
    // One byte more: refused, having read no further than the limit and one byte.
    let over = std::ffi::CString::new(vec![b'x'; NVFIPC_MAX_STRING_LEN + 1]).unwrap();
    let err = c_str_arg(over.as_ptr(), "tag").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(
        err.message,
        "argument `tag` is longer than NVFIPC_MAX_STRING_LEN = 8192 bytes (or lacks its NUL \
         terminator)"
    );
    assert_eq!(count_arg(3, "n", "LIMIT", 3).unwrap(), 3);
    let err = count_arg(4, "n", "LIMIT", 3).unwrap_err();
    assert_eq!(
        err.message,
        "argument `n` = 4 is above the limit of LIMIT = 3"
    );
}

#[test]
fn spans_accept_null_only_when_empty() {
    assert!(slice_arg::<u8>(std::ptr::null(), 0, "v")
        .unwrap()
        .is_empty());
    let err = slice_arg::<u8>(std::ptr::null(), 3, "v").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(slice_arg::<u8>(b"xyz".as_ptr(), 2, "v").unwrap(), b"xy");
}

#[test]
fn out_pointers_are_checked_and_written() {
    assert!(out_ptr::<i64>(std::ptr::null_mut(), "out").is_err());
    assert!(
        optional_out_ptr::<i64>(std::ptr::null_mut(), "out")
            .unwrap()
            .len
            == 0
    );
    let mut v = 0i64;
    out_ptr(&mut v, "out").unwrap().write(42).unwrap();
    assert_eq!(v, 42);
}

#[test]
fn timeouts_and_ranks_convert() {
    let d = Duration::from_secs(9);
    assert_eq!(timeout_arg(-1, d), d);
    assert_eq!(timeout_arg(0, d), Duration::ZERO);
    assert_eq!(timeout_arg(250, d), Duration::from_millis(250));
    assert_eq!(rank_arg(3, 4, "rank").unwrap(), 3);
    for bad in [-1, 4, i64::MAX] {
        let err = rank_arg(bad, 4, "rank").unwrap_err();
        assert!(
            err.message.contains(&format!("`rank` = {bad}")),
            "{}",
            err.message
        );
    }
    assert_eq!(positive_arg(2, "n").unwrap(), 2);
    assert!(positive_arg(0, "n").is_err());
    assert!(positive_arg(-5, "n").is_err());
}
