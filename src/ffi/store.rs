//! C ABI of the key-value store: every [`Store`] operation on an opaque `nvfipc_store`.
//! Creating stores (TCP client, embedded server, host callbacks) is in `store_create.rs`.

use super::args::{
    bytes_arg, c_str_arg, c_str_array_arg, optional_out_ptr, out_ptr, slice_arg, timeout_arg,
    OutPtr,
};
use super::boundary::ffi_call;
use super::registry::{free_buffer, handle_ref, into_buffer, take_handle, Handle};
use super::store_callbacks::CallbackStore;
use crate::error::{Error, Result, Status};
use crate::store::client::TcpStore;
use crate::store::Store;
use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

/// A key-value store with the semantics of PyTorch's `c10d::Store`: a TCPStore client
/// (`nvfipc_store_connect`) or a store backed by host callbacks (`nvfipc_store_from_callbacks`).
///
/// Thread safety: all operations may be called from any number of threads at once. A TCP store
/// sends one request at a time over its connection, so a blocking `get`/`wait` on one thread
/// delays other threads' calls on the same store; connect one store per thread when several
/// threads need independent blocking waits. `nvfipc_store_free` must not race with calls on the
/// same store from other threads (such races are detected where possible, never relied upon).
#[allow(non_camel_case_types)]
#[derive(Clone)]
pub struct nvfipc_store {
    pub(crate) store: Arc<dyn Store>,
    /// The same store when it is a TCP client, for the operations only TCP stores have.
    pub(crate) tcp: Option<Arc<TcpStore>>,
    /// The same store when it calls host callbacks, for the operations only those have.
    pub(crate) callback: Option<Arc<CallbackStore>>,
}

impl Handle for nvfipc_store {
    const C_NAME: &'static str = "nvfipc_store";
}

/// An input byte span: `len` bytes at `data` (`data` may be NULL when `len` is 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_bytes {
    pub data: *const u8,
    pub len: usize,
}

/// A byte buffer allocated by the library: `len` bytes at `data`, followed by a NUL byte that is
/// not counted in `len` (so text values can be used as C strings). Release it with
/// `nvfipc_buffer_free(data, len)`, or arrays of them with `nvfipc_buffers_free`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_buffer {
    pub data: *mut u8,
    pub len: usize,
}

/// Borrows the store behind a C pointer (the argument is always named `store`).
fn store_arg(store: *const nvfipc_store) -> Result<nvfipc_store> {
    handle_ref(store, "store")
}

/// How long a waiting operation may block. `timeout_ms == 0` ("do not wait") is answered here
/// with one CHECK, so that it means the same on every backend (a zero timeout handed to a store
/// may race the server's reply, or mean "forever" to a host store); when the keys exist, the
/// operation then runs with the store's default bound, which it will not need.
fn wait_bound(store: &dyn Store, keys: &[&str], timeout_ms: i64) -> Result<Duration> {
    if timeout_ms != 0 {
        return Ok(timeout_arg(timeout_ms, store.default_timeout()));
    }
    if store.check(keys)? {
        return Ok(store.default_timeout());
    }
    const SHOWN: usize = 8;
    let mut listed = keys
        .iter()
        .take(SHOWN)
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > SHOWN {
        listed.push_str(&format!(" and {} more", keys.len() - SHOWN));
    }
    Err(Error::timeout(format!(
        "not every key of {listed} is set (timeout_ms = 0: checked once without waiting)"
    )))
}

/// Hands a value to C through the `(out_value, out_len)` pair.
fn write_buffer(value: Vec<u8>, out_value: OutPtr<*mut u8>, out_len: OutPtr<usize>) {
    let (data, len) = into_buffer(value);
    out_value.write(data);
    out_len.write(len);
}

/// Sets `key` to the `value_len` bytes at `value`, replacing any previous value, and wakes
/// waiters of `key`.
#[no_mangle]
pub extern "C" fn nvfipc_store_set(
    store: *const nvfipc_store,
    key: *const c_char,
    value: *const u8,
    value_len: usize,
) -> Status {
    ffi_call("nvfipc_store_set", || {
        let store = store_arg(store)?;
        let key = c_str_arg(key, "key")?;
        let value = bytes_arg(value, value_len, "value")?;
        store.store.set(key, value)
    })
}

/// Waits until `key` exists (at most `timeout_ms`; < 0: the store's default, 0: check once) and
/// returns a copy of its value in `*out_value` / `*out_len`; free it with `nvfipc_buffer_free`.
/// A missing key after the wait gives `NVFIPC_STATUS_TIMEOUT`.
#[no_mangle]
pub extern "C" fn nvfipc_store_get(
    store: *const nvfipc_store,
    key: *const c_char,
    timeout_ms: i64,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> Status {
    ffi_call("nvfipc_store_get", || {
        let store = store_arg(store)?;
        let key = c_str_arg(key, "key")?;
        let out_value = out_ptr(out_value, "out_value")?;
        let out_len = out_ptr(out_len, "out_len")?;
        let timeout = wait_bound(&*store.store, &[key], timeout_ms)?;
        let value = store.store.get(key, timeout)?;
        write_buffer(value, out_value, out_len);
        Ok(())
    })
}

/// Adds `delta` to the decimal counter at `key` (a missing key counts as 0) and writes the new
/// value to `*out_value` (`out_value` may be NULL).
#[no_mangle]
pub extern "C" fn nvfipc_store_add(
    store: *const nvfipc_store,
    key: *const c_char,
    delta: i64,
    out_value: *mut i64,
) -> Status {
    ffi_call("nvfipc_store_add", || {
        let store = store_arg(store)?;
        let key = c_str_arg(key, "key")?;
        let out_value = optional_out_ptr(out_value, "out_value")?;
        let value = store.store.add(key, delta)?;
        if let Some(out) = out_value {
            out.write(value);
        }
        Ok(())
    })
}

/// Writes to `*out_all_exist` whether every one of the `n_keys` keys exists. Never blocks.
#[no_mangle]
pub extern "C" fn nvfipc_store_check(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    n_keys: usize,
    out_all_exist: *mut bool,
) -> Status {
    ffi_call("nvfipc_store_check", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n_keys, "keys")?;
        let out = out_ptr(out_all_exist, "out_all_exist")?;
        // All of no keys exist; not every backend accepts an empty list.
        out.write(keys.is_empty() || store.store.check(&keys)?);
        Ok(())
    })
}

/// Blocks until every one of the `n_keys` keys exists, or fails with `NVFIPC_STATUS_TIMEOUT`
/// after `timeout_ms` (< 0: the store's default, 0: check once).
#[no_mangle]
pub extern "C" fn nvfipc_store_wait(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    n_keys: usize,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_store_wait", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n_keys, "keys")?;
        if keys.is_empty() {
            // Nothing to wait for; not every backend accepts an empty list.
            return Ok(());
        }
        if timeout_ms == 0 {
            // wait_bound has checked that every key exists.
            return wait_bound(&*store.store, &keys, 0).map(drop);
        }
        store.store.wait(
            &keys,
            timeout_arg(timeout_ms, store.store.default_timeout()),
        )
    })
}

/// Deletes `key`; writes to `*out_deleted` (may be NULL) whether it existed.
#[no_mangle]
pub extern "C" fn nvfipc_store_delete_key(
    store: *const nvfipc_store,
    key: *const c_char,
    out_deleted: *mut bool,
) -> Status {
    ffi_call("nvfipc_store_delete_key", || {
        let store = store_arg(store)?;
        let key = c_str_arg(key, "key")?;
        let out = optional_out_ptr(out_deleted, "out_deleted")?;
        let deleted = store.store.delete_key(key)?;
        if let Some(out) = out {
            out.write(deleted);
        }
        Ok(())
    })
}

/// Writes the number of keys in the store to `*out_num_keys` (internal keys included, as in
/// PyTorch).
#[no_mangle]
pub extern "C" fn nvfipc_store_num_keys(
    store: *const nvfipc_store,
    out_num_keys: *mut i64,
) -> Status {
    ffi_call("nvfipc_store_num_keys", || {
        let store = store_arg(store)?;
        let out = out_ptr(out_num_keys, "out_num_keys")?;
        out.write(store.store.num_keys()?);
        Ok(())
    })
}

/// Compare-and-set with `c10d::Store::compareSet` semantics: when `key` holds `expected` (or is
/// missing and `expected` is empty) it is set to `desired`. The value the key holds afterwards
/// (or the current value when the comparison failed) is returned in `*out_value`/`*out_len`;
/// free it with `nvfipc_buffer_free`.
#[no_mangle]
pub extern "C" fn nvfipc_store_compare_set(
    store: *const nvfipc_store,
    key: *const c_char,
    expected: *const u8,
    expected_len: usize,
    desired: *const u8,
    desired_len: usize,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> Status {
    ffi_call("nvfipc_store_compare_set", || {
        let store = store_arg(store)?;
        let key = c_str_arg(key, "key")?;
        let expected = bytes_arg(expected, expected_len, "expected")?;
        let desired = bytes_arg(desired, desired_len, "desired")?;
        let out_value = out_ptr(out_value, "out_value")?;
        let out_len = out_ptr(out_len, "out_len")?;
        let value = store.store.compare_set(key, expected, desired)?;
        write_buffer(value, out_value, out_len);
        Ok(())
    })
}

/// Appends `value_len` bytes to `key`, creating it when missing.
#[no_mangle]
pub extern "C" fn nvfipc_store_append(
    store: *const nvfipc_store,
    key: *const c_char,
    value: *const u8,
    value_len: usize,
) -> Status {
    ffi_call("nvfipc_store_append", || {
        let store = store_arg(store)?;
        let key = c_str_arg(key, "key")?;
        let value = bytes_arg(value, value_len, "value")?;
        store.store.append(key, value)
    })
}

/// Sets `n` keys at once (one message on a TCP store): `keys[i]` to `values[i]`.
#[no_mangle]
pub extern "C" fn nvfipc_store_multi_set(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    values: *const nvfipc_bytes,
    n: usize,
) -> Status {
    ffi_call("nvfipc_store_multi_set", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n, "keys")?;
        let spans = slice_arg(values, n, "values")?;
        let pairs = keys
            .iter()
            .zip(spans)
            .enumerate()
            .map(|(i, (&key, span))| {
                Ok((
                    key,
                    bytes_arg(span.data, span.len, &format!("values[{i}]"))?,
                ))
            })
            .collect::<Result<Vec<(&str, &[u8])>>>()?;
        store.store.multi_set(&pairs)
    })
}

/// Waits (at most `timeout_ms`; < 0: the store's default, 0: check once) until all `n` keys
/// exist, then fills the caller's array `out_values[0..n]` with their values in request order.
/// Release them with `nvfipc_buffers_free(out_values, n)`. On failure nothing is allocated and
/// `out_values` is left untouched.
#[no_mangle]
pub extern "C" fn nvfipc_store_multi_get(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    n: usize,
    timeout_ms: i64,
    out_values: *mut nvfipc_buffer,
) -> Status {
    ffi_call("nvfipc_store_multi_get", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n, "keys")?;
        let outs = out_array(out_values, n, "out_values")?;
        if keys.is_empty() {
            return Ok(());
        }
        let timeout = wait_bound(&*store.store, &keys, timeout_ms)?;
        let values = store.store.multi_get(&keys, timeout)?;
        if values.len() != n {
            return Err(Error::internal(format!(
                "the store returned {} values for {n} keys",
                values.len()
            )));
        }
        for (out, value) in outs.into_iter().zip(values) {
            let (data, len) = into_buffer(value);
            out.write(nvfipc_buffer { data, len });
        }
        Ok(())
    })
}

/// Checks an output array of `n` items and returns a writer for each.
fn out_array<T>(ptr: *mut T, n: usize, name: &str) -> Result<Vec<OutPtr<T>>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    out_ptr(ptr, name)?;
    (0..n)
        // wrapping_add: no dereference here; each element pointer is checked by out_ptr and is
        // inside the caller's array by the C contract (`ptr` points to `n` items).
        .map(|i| out_ptr(ptr.wrapping_add(i), name))
        .collect()
}

/// Frees the `n` buffers of `values` (as filled by `nvfipc_store_multi_get`) and sets each to
/// `{NULL, 0}`. Entries that are already `{NULL, 0}` are skipped, so calling it twice is safe.
/// Every entry is attempted; the first failure is returned.
#[no_mangle]
pub extern "C" fn nvfipc_buffers_free(values: *mut nvfipc_buffer, n: usize) -> Status {
    ffi_call("nvfipc_buffers_free", || {
        let entries = slice_arg(values.cast_const(), n, "values")?.to_vec();
        let outs = out_array(values, n, "values")?;
        let mut first_error = None;
        for (i, (entry, out)) in entries.into_iter().zip(outs).enumerate() {
            match free_buffer(entry.data, entry.len) {
                Ok(()) => out.write(nvfipc_buffer {
                    data: std::ptr::null_mut(),
                    len: 0,
                }),
                Err(e) => {
                    first_error.get_or_insert(e.context(format!("values[{i}]")));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

/// Writes the store's default timeout (used when an operation gets `timeout_ms < 0`) to
/// `*out_timeout_ms`.
#[no_mangle]
pub extern "C" fn nvfipc_store_default_timeout_ms(
    store: *const nvfipc_store,
    out_timeout_ms: *mut i64,
) -> Status {
    ffi_call("nvfipc_store_default_timeout_ms", || {
        let store = store_arg(store)?;
        let out = out_ptr(out_timeout_ms, "out_timeout_ms")?;
        let ms = store.store.default_timeout().as_millis();
        out.write(i64::try_from(ms).unwrap_or(i64::MAX));
        Ok(())
    })
}

/// Releases this reference to the store. Contexts created with the store keep their own
/// reference, so the store may be freed while they still use it; the connection closes when the
/// last user is gone. NULL is a no-op; a second free gives `NVFIPC_STATUS_INVALID_STATE`.
#[no_mangle]
pub extern "C" fn nvfipc_store_free(store: *mut nvfipc_store) -> Status {
    ffi_call("nvfipc_store_free", || {
        take_handle(store, "store")?;
        Ok(())
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
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
            crate::ffi::store_create::nvfipc_store_ping(s, std::ptr::null_mut()),
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
}
