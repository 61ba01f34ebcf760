use super::*;
use crate::ffi::boundary::nvfipc_last_error_message;
use std::ffi::CStr;
use std::sync::Arc;

fn message_of_last_error() -> String {
    // SAFETY: nvfipc_last_error_message never returns NULL and the string lives until the
    // next failing call on this thread; we copy it at once.
    unsafe { CStr::from_ptr(nvfipc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[derive(Clone, Debug)]
struct Apple(Arc<u32>);
impl Handle for Apple {
    const C_NAME: &'static str = "test_apple";
}
#[derive(Clone, Debug)]
struct Pear;
impl Handle for Pear {
    const C_NAME: &'static str = "test_pear";
}

#[test]
fn registry_detects_double_free_and_wrong_types() {
    let apple = into_handle(Apple(Arc::new(5)));
    let pear = into_handle(Pear);
    assert_eq!(*handle_ref(apple, "apple").unwrap().0, 5);

    let err = handle_ref(pear.cast::<Apple>(), "apple").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message
            .contains("is a live test_pear, not a test_apple"),
        "{}",
        err.message
    );
    assert!(take_handle(pear.cast::<Apple>(), "apple").is_err());

    let err = handle_ref::<Apple>(std::ptr::null(), "apple").unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);

    let kept = handle_ref(apple, "apple").unwrap();
    assert!(take_handle(apple, "apple").unwrap().is_some());
    // A clone taken before the free stays usable.
    assert_eq!(*kept.0, 5);
    let err = take_handle(apple, "apple").unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    assert!(
        err.message.contains("not a live test_apple"),
        "{}",
        err.message
    );
    assert!(handle_ref(apple, "apple").is_err());
    assert!(take_handle::<Apple>(std::ptr::null_mut(), "apple")
        .unwrap()
        .is_none());
    assert!(take_handle(pear, "pear").unwrap().is_some());
}

#[test]
fn buffers_are_nul_terminated_and_freed_once() {
    let (ptr, len) = into_buffer(b"value".to_vec());
    assert_eq!(len, 5);
    // SAFETY: into_buffer allocates len + 1 bytes.
    let all = unsafe { std::slice::from_raw_parts(ptr, len + 1) };
    assert_eq!(all, b"value\0");
    let err = free_buffer(ptr, 4).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(nvfipc_buffer_free(ptr, len), Status::Ok);
    assert_eq!(nvfipc_buffer_free(ptr, len), Status::InvalidState);
    assert!(message_of_last_error().contains("not live"));
    assert_eq!(nvfipc_buffer_free(std::ptr::null_mut(), 3), Status::Ok);

    let (empty, len) = into_buffer(Vec::new());
    assert!(!empty.is_null());
    assert_eq!(len, 0);
    let apple = into_handle(Apple(Arc::new(1)));
    assert_eq!(
        nvfipc_buffer_free(apple.cast(), 0),
        Status::InvalidState,
        "a handle is not a buffer"
    );
    assert!(message_of_last_error().contains("is a live test_apple"));
    assert!(take_handle(apple, "apple").unwrap().is_some());
    assert_eq!(nvfipc_buffer_free(empty, 0), Status::Ok);
}
