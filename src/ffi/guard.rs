//! The one place where the C ABI touches raw pointers, catches panics and records errors.
//!
//! Every exported `nvfipc_*` function body runs inside [`ffi_call`]: it returns a [`Status`],
//! stores the error message in a thread-local slot on failure and turns a Rust panic into
//! [`Status::Panic`] instead of unwinding into C.
//!
//! Objects handed to C ("handles") are boxed Rust values registered in a process-wide registry of
//! live pointers together with their type. A pointer is only dereferenced after the registry has
//! confirmed that it is a live object of the expected type, so a double free, a use after free or
//! a pointer of the wrong type is reported as an error instead of touching freed memory. (A magic
//! field inside the object could not do that: reading it from a freed pointer is already the
//! bug.) The only case that cannot be detected is a freed address that a new object of the same
//! type happens to reuse.
//!
//! Safety contract of the pointer helpers: they must only be given pointers that a C caller
//! passed to an `nvfipc_*` function. The documented C contract (each pointer is NULL or valid for
//! the stated length, strings are NUL-terminated) is what makes their `unsafe` blocks sound; the
//! helpers check everything that can be checked (NULL, UTF-8, lengths, liveness of handles).

use crate::error::{Error, Result, Status};
use once_cell::sync::Lazy;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Last error
// ---------------------------------------------------------------------------------------------

struct LastError {
    status: Status,
    message: CString,
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = RefCell::new(LastError {
        status: Status::Ok,
        message: CString::default(),
    });
}

/// Turns a message into a C string; interior NUL bytes (never expected) are made visible.
fn to_c_message(message: &str) -> CString {
    CString::new(message.replace('\0', "\\0")).unwrap_or_default()
}

/// Records `err` as this thread's last error.
pub(crate) fn set_last_error(err: &Error) {
    let message = to_c_message(&err.message);
    // try_with: during thread teardown (a C thread-local destructor calling in) the slot may be
    // gone; losing the message then is better than aborting.
    let _ = LAST_ERROR.try_with(|slot| {
        *slot.borrow_mut() = LastError {
            status: err.status,
            message,
        }
    });
}

/// This thread's last error status (`Ok` when no call has failed yet, or after a clear).
pub(crate) fn last_error_status() -> Status {
    LAST_ERROR
        .try_with(|slot| slot.borrow().status)
        .unwrap_or(Status::Ok)
}

/// A copy of this thread's last error message ("" when none).
#[cfg(test)]
pub(crate) fn last_error_message() -> String {
    LAST_ERROR.with(|slot| slot.borrow().message.to_string_lossy().into_owned())
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| {
        *slot.borrow_mut() = LastError {
            status: Status::Ok,
            message: CString::default(),
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Panic boundary
// ---------------------------------------------------------------------------------------------

/// Extracts the text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs the body of the C function `function`: `Ok` gives [`Status::Ok`]; an error or a panic is
/// recorded as the thread's last error (message prefixed with `function`) and its status returned.
/// A success leaves the previous last error in place, like `errno`.
pub(crate) fn ffi_call(function: &'static str, body: impl FnOnce() -> Result<()>) -> Status {
    // AssertUnwindSafe: after a panic the caller only gets a status; objects the body touched are
    // documented as possibly unusable (Status::Panic), and shared state uses poison-tolerant locks.
    let err = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return Status::Ok,
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

// ---------------------------------------------------------------------------------------------
// Argument helpers
// ---------------------------------------------------------------------------------------------

/// Fails with `InvalidArgument` naming `name` when `ptr` is NULL.
pub(crate) fn check_not_null<T>(ptr: *const T, name: &str) -> Result<()> {
    if ptr.is_null() {
        Err(Error::invalid(format!("argument `{name}` is NULL")))
    } else {
        Ok(())
    }
}

/// Borrows a NUL-terminated UTF-8 C string argument.
pub(crate) fn c_str_arg<'a>(ptr: *const c_char, name: &str) -> Result<&'a str> {
    check_not_null(ptr, name)?;
    // SAFETY: non-NULL (checked above); the C contract says string arguments are NUL-terminated
    // and stay valid for the duration of the call, which outlives every use of the result.
    let c_str = unsafe { CStr::from_ptr(ptr) };
    c_str.to_str().map_err(|e| {
        Error::invalid(format!(
            "argument `{name}` is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

/// Borrows `len` items at `ptr`; NULL is accepted only when `len` is 0.
pub(crate) fn slice_arg<'a, T>(ptr: *const T, len: usize, name: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_not_null(ptr, name)?;
    if !ptr.is_aligned() {
        return Err(Error::invalid(format!(
            "argument `{name}` ({ptr:p}) is not aligned for its element type"
        )));
    }
    if len.saturating_mul(std::mem::size_of::<T>()) > isize::MAX as usize {
        return Err(Error::invalid(format!(
            "argument `{name}`: length {len} is too large"
        )));
    }
    // SAFETY: non-NULL, aligned and of a representable size (checked above); the C contract says
    // `ptr` points to `len` initialised items that stay valid and unmodified during the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Borrows one `T` at `ptr` (an input struct such as a vtable).
pub(crate) fn ref_arg<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    Ok(&slice_arg(ptr, 1, name)?[0])
}

/// Borrows a byte span `(ptr, len)`; NULL is accepted only when `len` is 0.
pub(crate) fn bytes_arg<'a>(ptr: *const u8, len: usize, name: &str) -> Result<&'a [u8]> {
    slice_arg(ptr, len, name)
}

/// Borrows an array of `n` C strings (NULL allowed when `n` is 0).
pub(crate) fn c_str_array_arg<'a>(
    ptr: *const *const c_char,
    n: usize,
    name: &str,
) -> Result<Vec<&'a str>> {
    let items = slice_arg(ptr, n, name)?;
    items
        .iter()
        .enumerate()
        .map(|(i, &item)| c_str_arg(item, &format!("{name}[{i}]")))
        .collect()
}

/// An output argument that has been checked to be non-NULL. Check outputs before doing any work
/// so that nothing is created (and leaked) when the caller gave no place to put it.
pub(crate) struct OutPtr<T> {
    ptr: *mut T,
}

impl<T> OutPtr<T> {
    /// Stores `value` in the caller's variable.
    pub(crate) fn write(self, value: T) {
        // SAFETY: non-NULL (checked in `out_ptr`); the C contract says output pointers point to
        // writable storage for one `T`. `write` does not drop the (possibly uninitialised) old value.
        unsafe { self.ptr.write(value) }
    }
}

/// Checks an output pointer argument.
pub(crate) fn out_ptr<T>(ptr: *mut T, name: &str) -> Result<OutPtr<T>> {
    check_not_null(ptr, name)?;
    if !ptr.is_aligned() {
        return Err(Error::invalid(format!(
            "argument `{name}` ({ptr:p}) is not aligned for its type"
        )));
    }
    Ok(OutPtr { ptr })
}

/// An optional output argument: NULL means the caller does not want the value.
pub(crate) fn optional_out_ptr<T>(ptr: *mut T, name: &str) -> Result<Option<OutPtr<T>>> {
    if ptr.is_null() {
        Ok(None)
    } else {
        out_ptr(ptr, name).map(Some)
    }
}

/// Converts a C timeout: negative means `default`, 0 means "do not wait", otherwise milliseconds.
pub(crate) fn timeout_arg(timeout_ms: i64, default: Duration) -> Duration {
    if timeout_ms < 0 {
        default
    } else {
        Duration::from_millis(timeout_ms as u64)
    }
}

/// Converts a C rank (`int64_t`) into an index in `0..world_size`.
pub(crate) fn rank_arg(rank: i64, world_size: usize, name: &str) -> Result<usize> {
    usize::try_from(rank)
        .ok()
        .filter(|&r| r < world_size)
        .ok_or_else(|| {
            Error::invalid(format!(
                "argument `{name}` = {rank} is not a rank of a world of size {world_size} \
                 (expected 0..{world_size})"
            ))
        })
}

/// Converts a C count or size (`int64_t`) that must be positive.
pub(crate) fn positive_arg(value: i64, name: &str) -> Result<usize> {
    usize::try_from(value)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| Error::invalid(format!("argument `{name}` = {value} must be positive")))
}

// ---------------------------------------------------------------------------------------------
// Registry of live objects
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Live {
    /// A handle of the Rust type with this id and C name.
    Handle {
        type_id: TypeId,
        c_name: &'static str,
    },
    /// A byte buffer allocated by the library of this length (without the trailing NUL).
    Buffer { len: usize },
}

static LIVE: Lazy<Mutex<HashMap<usize, Live>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// Locks the registry. Nothing panics while holding it, but tolerate poisoning anyway.
fn live() -> MutexGuard<'static, HashMap<usize, Live>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn describe(entry: Option<&Live>) -> String {
    match entry {
        Some(Live::Handle { c_name, .. }) => format!("a live {c_name}"),
        Some(Live::Buffer { len }) => format!("a buffer of {len} bytes"),
        None => "not a live object (already freed, or not created by this library)".to_string(),
    }
}

/// A Rust type handed to C as an opaque pointer. Its fields should be cheap to clone (`Arc`s):
/// [`handle_ref`] clones the object under the registry lock so that a concurrent free cannot pull
/// it away during a call.
pub(crate) trait Handle: Clone + Send + Sync + 'static {
    /// The C type name, used in error messages.
    const C_NAME: &'static str;
}

/// Boxes `obj`, registers it as live and returns the pointer for C.
pub(crate) fn into_handle<T: Handle>(obj: T) -> *mut T {
    let ptr = Box::into_raw(Box::new(obj));
    live().insert(
        ptr as usize,
        Live::Handle {
            type_id: TypeId::of::<T>(),
            c_name: T::C_NAME,
        },
    );
    ptr
}

fn check_handle<T: Handle>(
    registry: &HashMap<usize, Live>,
    ptr: *const T,
    name: &str,
) -> Result<()> {
    match registry.get(&(ptr as usize)) {
        Some(Live::Handle { type_id, .. }) if *type_id == TypeId::of::<T>() => Ok(()),
        Some(other @ Live::Handle { .. }) | Some(other @ Live::Buffer { .. }) => {
            Err(Error::invalid(format!(
                "argument `{name}` ({ptr:p}) is {}, not a {}",
                describe(Some(other)),
                T::C_NAME
            )))
        }
        None => Err(Error::state(format!(
            "argument `{name}` ({ptr:p}) is not a live {} (already freed, or not created by \
             this library)",
            T::C_NAME
        ))),
    }
}

/// Returns a clone of the live handle at `ptr`, or an error when `ptr` is NULL, freed or of
/// another type.
pub(crate) fn handle_ref<T: Handle>(ptr: *const T, name: &str) -> Result<T> {
    check_not_null(ptr, name)?;
    let registry = live();
    check_handle(&registry, ptr, name)?;
    // SAFETY: the registry says `ptr` came from `into_handle::<T>` and has not been freed; frees
    // remove it from the registry under the same lock before dropping, so it stays valid while
    // we clone it.
    Ok(unsafe { (*ptr).clone() })
}

/// Unregisters and returns the handle at `ptr` for dropping; `Ok(None)` when `ptr` is NULL.
pub(crate) fn take_handle<T: Handle>(ptr: *mut T, name: &str) -> Result<Option<Box<T>>> {
    if ptr.is_null() {
        return Ok(None);
    }
    let mut registry = live();
    check_handle(&registry, ptr, name)?;
    registry.remove(&(ptr as usize));
    drop(registry);
    // SAFETY: `ptr` came from `Box::into_raw` in `into_handle::<T>` (registry checked above) and
    // we just removed it from the registry, so no other call can reach it again.
    Ok(Some(unsafe { Box::from_raw(ptr) }))
}

/// Hands `bytes` to C as a library-owned buffer. The buffer holds `bytes.len()` bytes followed by
/// a NUL (not counted in the length), so text values can be printed directly. Free it with
/// [`free_buffer`] (C: `nvfipc_buffer_free`).
pub(crate) fn into_buffer(mut bytes: Vec<u8>) -> (*mut u8, usize) {
    let len = bytes.len();
    bytes.push(0);
    let ptr = Box::into_raw(bytes.into_boxed_slice()) as *mut u8;
    live().insert(ptr as usize, Live::Buffer { len });
    (ptr, len)
}

/// Frees a buffer made by [`into_buffer`]; NULL is a no-op. The length must match.
pub(crate) fn free_buffer(ptr: *mut u8, len: usize) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    let mut registry = live();
    match registry.get(&(ptr as usize)) {
        Some(Live::Buffer { len: actual }) if *actual == len => {}
        Some(Live::Buffer { len: actual }) => {
            return Err(Error::invalid(format!(
                "buffer {ptr:p} has {actual} bytes but was freed with length {len}; pass the \
                 length the library returned with it"
            )))
        }
        other => {
            return Err(Error::state(format!(
                "argument `data` ({ptr:p}) is {}, not a buffer allocated by this library",
                match other {
                    None => "not live (already freed, or not created by this library)".into(),
                    some => describe(some),
                }
            )))
        }
    }
    registry.remove(&(ptr as usize));
    drop(registry);
    let slice = std::ptr::slice_from_raw_parts_mut(ptr, len + 1);
    // SAFETY: `ptr` came from `into_buffer`, which boxed a slice of exactly `len + 1` bytes (the
    // registry recorded `len`, checked above); removed from the registry, so freed exactly once.
    drop(unsafe { Box::from_raw(slice) });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Exported error functions
// ---------------------------------------------------------------------------------------------

/// The message of the last failed call on this thread, or "" when none has failed. Never NULL.
/// The pointer stays valid until the next failing `nvfipc_*` call on the same thread; copy it to
/// keep it. A successful call does not clear it (like `errno`). Thread-safe (per thread).
#[no_mangle]
pub extern "C" fn nvfipc_last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().message.as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The status of the last failed call on this thread (`NVFIPC_STATUS_OK` when none has failed).
#[no_mangle]
pub extern "C" fn nvfipc_last_error_status() -> Status {
    last_error_status()
}

/// Forgets the last error of this thread, so a later check of `nvfipc_last_error_status` only
/// sees failures after this point.
#[no_mangle]
pub extern "C" fn nvfipc_last_error_clear() {
    clear_last_error()
}

/// A short, static, lower-case name for a status value (e.g. "timeout"); "unknown status" for a
/// value that is not an `nvfipc_status`. Never NULL; never freed.
#[no_mangle]
pub extern "C" fn nvfipc_status_name(status: i32) -> *const c_char {
    static NAMES: Lazy<Vec<(i32, CString)>> = Lazy::new(|| {
        ALL_STATUSES
            .iter()
            .map(|&s| (s as i32, to_c_message(s.name())))
            .collect()
    });
    static UNKNOWN: &CStr = c"unknown status";
    NAMES
        .iter()
        .find(|(code, _)| *code == status)
        .map_or(UNKNOWN.as_ptr(), |(_, name)| name.as_ptr())
}

const ALL_STATUSES: [Status; 12] = [
    Status::Ok,
    Status::InvalidArgument,
    Status::Timeout,
    Status::Io,
    Status::Protocol,
    Status::NotFound,
    Status::Cuda,
    Status::CudaUnavailable,
    Status::Unsupported,
    Status::InvalidState,
    Status::Panic,
    Status::Internal,
];

/// Frees a buffer returned by the library (e.g. by `nvfipc_store_get`), given the length returned
/// with it. NULL is a no-op. Freeing twice, or a pointer the library did not return, gives
/// `NVFIPC_STATUS_INVALID_STATE`; a wrong length gives `NVFIPC_STATUS_INVALID_ARGUMENT` (and
/// the buffer stays allocated). Thread-safe.
#[no_mangle]
pub extern "C" fn nvfipc_buffer_free(data: *mut u8, len: usize) -> Status {
    ffi_call("nvfipc_buffer_free", || free_buffer(data, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn message_of_last_error() -> String {
        // SAFETY: nvfipc_last_error_message never returns NULL and the string lives until the
        // next failing call on this thread; we copy it at once.
        unsafe { CStr::from_ptr(nvfipc_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn last_error_is_empty_before_any_failure_and_survives_success() {
        std::thread::spawn(|| {
            assert_eq!(message_of_last_error(), "");
            assert_eq!(nvfipc_last_error_status(), Status::Ok);
            let st = ffi_call("nvfipc_x", || {
                Err(Error::timeout("waited 5 ms for key 'k'"))
            });
            assert_eq!(st, Status::Timeout);
            assert_eq!(message_of_last_error(), "nvfipc_x: waited 5 ms for key 'k'");
            assert_eq!(ffi_call("nvfipc_y", || Ok(())), Status::Ok);
            assert_eq!(nvfipc_last_error_status(), Status::Timeout);
            assert_eq!(last_error_message(), "nvfipc_x: waited 5 ms for key 'k'");
            nvfipc_last_error_clear();
            assert_eq!(nvfipc_last_error_status(), Status::Ok);
            assert_eq!(message_of_last_error(), "");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn last_error_is_per_thread() {
        ffi_call("nvfipc_main", || Err(Error::io("main thread failure")));
        std::thread::spawn(|| {
            assert_eq!(message_of_last_error(), "");
            ffi_call("nvfipc_other", || Err(Error::not_found("other")));
        })
        .join()
        .unwrap();
        assert_eq!(message_of_last_error(), "nvfipc_main: main thread failure");
    }

    #[test]
    fn panics_become_status_panic_with_message() {
        let st = ffi_call("nvfipc_boom", || panic!("exploded at step {}", 3));
        assert_eq!(st, Status::Panic);
        let msg = message_of_last_error();
        assert!(
            msg.starts_with("nvfipc_boom: internal panic: exploded at step 3"),
            "{msg}"
        );
        let st = ffi_call("nvfipc_boom2", || std::panic::panic_any(17u32));
        assert_eq!(st, Status::Panic);
        assert!(message_of_last_error().contains("non-string panic payload"));
    }

    #[test]
    fn interior_nul_in_message_is_escaped() {
        ffi_call("nvfipc_n", || Err(Error::protocol("a\0b")));
        assert_eq!(message_of_last_error(), "nvfipc_n: a\\0b");
    }

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
        let err = c_str_array_arg(arr.as_ptr(), 2, "keys").unwrap_err();
        assert!(err.message.contains("`keys[1]` is NULL"), "{}", err.message);
        assert_eq!(c_str_array_arg(arr.as_ptr(), 1, "keys").unwrap(), ["a"]);
        assert!(c_str_array_arg(std::ptr::null(), 0, "keys")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn spans_accept_null_only_when_empty() {
        assert!(bytes_arg(std::ptr::null(), 0, "v").unwrap().is_empty());
        let err = bytes_arg(std::ptr::null(), 3, "v").unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument);
        assert_eq!(bytes_arg(b"xyz".as_ptr(), 2, "v").unwrap(), b"xy");
    }

    #[test]
    fn out_pointers_are_checked_and_written() {
        assert!(out_ptr::<i64>(std::ptr::null_mut(), "out").is_err());
        assert!(optional_out_ptr::<i64>(std::ptr::null_mut(), "out")
            .unwrap()
            .is_none());
        let mut v = 0i64;
        out_ptr(&mut v, "out").unwrap().write(42);
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

    #[test]
    fn status_names_cover_every_status() {
        for s in ALL_STATUSES {
            // SAFETY: static NUL-terminated strings.
            let name = unsafe { CStr::from_ptr(nvfipc_status_name(s as i32)) };
            assert_eq!(name.to_str().unwrap(), s.name());
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(nvfipc_status_name(99)) };
        assert_eq!(unknown.to_str().unwrap(), "unknown status");
        assert_eq!(ALL_STATUSES.len(), Status::Internal as usize + 1);
    }
}
