//! The panic boundary and the per-thread last error of the C ABI. Every exported function body
//! runs inside [`ffi_call`], which returns a [`Status`], records the message of a failure and turns
//! a panic into [`Status::Panic`] instead of unwinding into C; the readers of the last error
//! (`nvfipc_last_error_*`, `nvfipc_status_name`) are here too.

use crate::error::{Error, Result, Status, STATUS_NAMES};
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    // process-wide: errno-style, one slot per C thread; read back by the caller on its own thread.
    // Holds the status and the message of the thread's last failed call.
    static LAST_ERROR: RefCell<(Status, CString)> = RefCell::new((Status::Ok, CString::default()));
}

/// Turns a message into a C string; interior NUL bytes (from a key or tag) are made visible.
pub(crate) fn to_c_message(message: &str) -> CString {
    CString::new(message.replace('\0', "\\0")).unwrap_or_default()
}

/// Records `err` as this thread's last error.
pub(crate) fn set_last_error(err: &Error) {
    let message = to_c_message(&err.message);
    // try_with: during thread teardown (a C thread-local destructor calling in) the slot may be
    // gone; losing the message then is better than aborting.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = (err.status, message));
}

/// Extracts the text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    let text = payload.downcast_ref::<String>().map(String::as_str);
    text.or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("non-string panic payload")
}

/// Runs the body of the C function `function`: `Ok` gives [`Status::Ok`] (its value, if any, is
/// dropped: results go through output pointers); an error or a panic is recorded as the thread's
/// last error (message prefixed with `function`) and its status returned. A success leaves the
/// previous last error in place, like `errno`.
pub(crate) fn ffi_call<R>(function: &'static str, body: impl FnOnce() -> Result<R>) -> Status {
    // AssertUnwindSafe: after a panic the caller only gets a status; objects the body touched are
    // documented as possibly unusable (Status::Panic), and shared state uses poison-tolerant locks.
    let err = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(_)) => return Status::Ok,
        Ok(Err(err)) => err,
        Err(payload) => Error::new(
            Status::Panic,
            format!(
                "internal panic: {} (please report this; the object involved may be unusable)",
                panic_message(payload.as_ref())
            ),
        ),
    };
    let err = err.context(function);
    set_last_error(&err);
    err.status
}

/// The message of the last failed call on this thread, or "" when none has failed. Never NULL.
/// The pointer stays valid until the next failing `nvfipc_*` call on the same thread; copy it to
/// keep it. A successful call does not clear it (like `errno`). Thread-safe (per thread).
#[no_mangle]
pub extern "C" fn nvfipc_last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().1.as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The status of the last failed call on this thread (`NVFIPC_STATUS_OK` when none has failed).
#[no_mangle]
pub extern "C" fn nvfipc_last_error_status() -> Status {
    LAST_ERROR
        .try_with(|slot| slot.borrow().0)
        .unwrap_or(Status::Ok)
}

/// Forgets the last error of this thread, so a later check of `nvfipc_last_error_status` only
/// sees failures after this point.
#[no_mangle]
pub extern "C" fn nvfipc_last_error_clear() {
    set_last_error(&Error::new(Status::Ok, ""));
}

/// A short, static, lower-case name for a status value (e.g. "timeout"); "unknown status" for a
/// value that is not an `nvfipc_status`. Never NULL; never freed.
#[no_mangle]
pub extern "C" fn nvfipc_status_name(status: i32) -> *const c_char {
    let name = usize::try_from(status)
        .ok()
        .and_then(|i| STATUS_NAMES.get(i));
    name.map_or(c"unknown status", |name| name).as_ptr()
}
