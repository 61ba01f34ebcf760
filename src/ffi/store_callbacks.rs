//! The C side of a store implemented by the host (e.g. nvFuser wrapping its `c10d::Store`): the
//! vtable [`nvfipc_store_callbacks`] and [`CallbackStore`], which implements the safe [`Store`]
//! trait by calling it, so every unsafe call into host code is at the C boundary. Keys go to the
//! host as callers give them (no `/` prefix, not NUL-terminated); values may contain NUL bytes.

use crate::error::{Error, Result, Status};
use crate::store::wire::MAX_REPLY_BLOB_LEN;
use crate::store::{Liveness, Store, DEFAULT_TIMEOUT};
use crate::sync::lock;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt::Display;
use std::ptr;
use std::sync::Mutex;
use std::time::Duration;

/// Host-provided store operations (a C vtable).
///
/// Return codes: every callback returns 0 on success, 2 (`NVFIPC_STATUS_TIMEOUT`) when a
/// `get`/`wait`/`multi_get` ran out of time, and any other value on failure. A failure code that
/// is an `nvfipc_status` value (for example `NVFIPC_STATUS_NOT_FOUND`) is reported as that
/// status; any other non-zero value is reported as `NVFIPC_STATUS_IO`. After a non-zero return the
/// library calls `error_message` (when set) to include the host's explanation.
///
/// Threading: the library calls these functions from any thread, possibly from several threads
/// at the same time, so they must be thread-safe, and `ctx` must stay valid until the store
/// created from this vtable has been freed. The callbacks must not unwind (throw a C++ exception
/// or longjmp) out of the call, and must not call back into the same store.
///
/// Keys: `key`/`keys[i]` point to `key_len`/`key_lens[i]` bytes, NOT NUL-terminated, valid only
/// during the call. Values: `value` points to `value_len` bytes, valid only during the call.
///
/// Returned values (`get`, `compare_set`, `multi_get`): on success the host stores in
/// `*out_value` a buffer allocated with `malloc` (or NULL when the length is 0) and its length in
/// `*out_len`; the library takes ownership and releases it with `free_value(ctx, ptr, len)` when
/// that callback is set, or with `free(ptr)` otherwise. On a non-zero return the library ignores
/// and does not free the outputs, so the host must not leave memory allocated in them.
///
/// Required: `set`, `get`, `add`, `check`, `delete_key`, `wait`. Optional (may be NULL):
/// `compare_set`, `append`, `num_keys` (the operation then fails with
/// `NVFIPC_STATUS_UNSUPPORTED`), `multi_set` and `multi_get` (then done key by key with
/// `set`, and `wait` + `get`), `free_value` and `error_message`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_store_callbacks {
    /// Passed unchanged as the first argument of every callback.
    pub ctx: *mut c_void,
    /// Upserts `key` = `value`.
    pub set: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            key_len: usize,
            value: *const u8,
            value_len: usize,
        ) -> c_int,
    >,
    /// Waits up to `timeout_ms` milliseconds for `key` to exist (0: do not wait), then returns
    /// its value in `*out_value` / `*out_len` (malloc'd, owned by the library afterwards).
    /// Returns 2 on timeout.
    pub get: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            key_len: usize,
            timeout_ms: i64,
            out_value: *mut *mut u8,
            out_len: *mut usize,
        ) -> c_int,
    >,
    /// Adds `delta` to the decimal counter at `key` (missing counts as 0) and stores the new
    /// value in `*out_value`.
    pub add: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            key_len: usize,
            delta: i64,
            out_value: *mut i64,
        ) -> c_int,
    >,
    /// Sets `*out_ready` to true when all `n` keys exist. Never blocks.
    pub check: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            keys: *const *const c_char,
            key_lens: *const usize,
            n: usize,
            out_ready: *mut bool,
        ) -> c_int,
    >,
    /// Deletes `key`; sets `*out_deleted` to whether it existed.
    pub delete_key: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            key_len: usize,
            out_deleted: *mut bool,
        ) -> c_int,
    >,
    /// Waits up to `timeout_ms` milliseconds until all `n` keys exist (0: check once). Returns 2
    /// on timeout.
    pub wait: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            keys: *const *const c_char,
            key_lens: *const usize,
            n: usize,
            timeout_ms: i64,
        ) -> c_int,
    >,
    /// Optional. c10d compare-and-set: when `key` holds `expected`, or is missing and `expected`
    /// is empty, store `desired`; return the value the key holds afterwards (for a missing key
    /// with non-empty `expected`: `expected` itself, as c10d does) in `*out_value`/`*out_len`.
    pub compare_set: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            key_len: usize,
            expected: *const u8,
            expected_len: usize,
            desired: *const u8,
            desired_len: usize,
            out_value: *mut *mut u8,
            out_len: *mut usize,
        ) -> c_int,
    >,
    /// Optional. Appends `value` to `key`, creating it when missing.
    pub append: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            key_len: usize,
            value: *const u8,
            value_len: usize,
        ) -> c_int,
    >,
    /// Optional. Stores the number of keys in `*out_count`.
    pub num_keys: Option<unsafe extern "C" fn(ctx: *mut c_void, out_count: *mut i64) -> c_int>,
    /// Optional. Sets `n` keys: `keys[i]` = `values[i]`.
    pub multi_set: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            keys: *const *const c_char,
            key_lens: *const usize,
            values: *const *const u8,
            value_lens: *const usize,
            n: usize,
        ) -> c_int,
    >,
    /// Optional. Waits up to `timeout_ms` for all `n` keys, then fills the caller's arrays
    /// `out_values[0..n]` / `out_lens[0..n]` with malloc'd copies of their values (owned by the
    /// library afterwards).
    pub multi_get: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            keys: *const *const c_char,
            key_lens: *const usize,
            n: usize,
            timeout_ms: i64,
            out_values: *mut *mut u8,
            out_lens: *mut usize,
        ) -> c_int,
    >,
    /// Optional. Releases a value returned by `get`, `compare_set` or `multi_get`; when NULL the
    /// library calls `free(ptr)`.
    pub free_value: Option<unsafe extern "C" fn(ctx: *mut c_void, ptr: *mut u8, len: usize)>,
    /// Optional. A NUL-terminated description of the last failure on the calling thread, or
    /// NULL. The library copies it at once; it only needs to stay valid until the next callback.
    pub error_message: Option<unsafe extern "C" fn(ctx: *mut c_void) -> *const c_char>,
}

/// A [`Store`] over host callbacks.
#[derive(Debug)]
pub struct CallbackStore {
    cb: nvfipc_store_callbacks,
    timeout: Duration,
    /// The port of the store's server when the host said (`nvfipc_store_set_server_address`)
    /// and it is on this machine: what [`Store::liveness`] looks at.
    server_port: Mutex<Option<u16>>,
}

// SAFETY: the vtable is plain data (a context pointer and C function pointers); the host promises
// (see `nvfipc_store_callbacks`) thread-safe callbacks and a `ctx` valid for the life of the
// store, so calling them from any thread, concurrently, is sound.
unsafe impl Send for CallbackStore {}
// SAFETY: see `Send`; `&CallbackStore` only reads the vtable and calls the thread-safe callbacks.
unsafe impl Sync for CallbackStore {}

type SetFn = unsafe extern "C" fn(*mut c_void, *const c_char, usize, *const u8, usize) -> c_int;

/// Keys as the parallel pointer and length arrays the callbacks take.
fn key_arrays(keys: &[&str]) -> (Vec<*const c_char>, Vec<usize>) {
    let ptrs = keys.iter().map(|k| k.as_ptr().cast::<c_char>()).collect();
    (ptrs, keys.iter().map(|k| k.len()).collect())
}

/// A host-owned value returned through `out_value`/`out_len`; released exactly once on drop.
struct HostValue<'a> {
    cb: &'a nvfipc_store_callbacks,
    ptr: *mut u8,
    len: usize,
}

impl HostValue<'_> {
    fn to_vec(&self) -> Result<Vec<u8>> {
        if self.len == 0 {
            return Ok(Vec::new());
        }
        if self.ptr.is_null() || self.len as u64 > MAX_REPLY_BLOB_LEN {
            return Err(Error::protocol(format!(
                "host store callback returned a value of {} bytes at {:p} (NULL, or above the \
                 limit of {MAX_REPLY_BLOB_LEN} bytes on what a store may return)",
                self.len, self.ptr
            )));
        }
        // SAFETY: the host promised `ptr` points to `len` readable bytes that it handed over to
        // us; we copy them before they are released in `drop`.
        let value = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        let mut copy = Vec::new();
        copy.try_reserve_exact(value.len()).map_err(|e| {
            Error::io(format!(
                "copying a host store value of {} bytes: {e}",
                value.len()
            ))
        })?;
        copy.extend_from_slice(value);
        Ok(copy)
    }
}

impl Drop for HostValue<'_> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        match self.cb.free_value {
            // SAFETY: `ptr`/`len` are exactly what the host returned; released once, here.
            Some(free_value) => unsafe { free_value(self.cb.ctx, self.ptr, self.len) },
            // SAFETY: the documented convention: without `free_value`, values are malloc'd.
            None => unsafe { libc::free(self.ptr.cast::<c_void>()) },
        }
    }
}

fn timeout_ms(timeout: Duration) -> i64 {
    timeout.as_millis().min(i64::MAX as u128) as i64
}

/// The status a non-zero callback return code stands for.
fn status_of(rc: c_int) -> Status {
    match rc {
        1 => Status::InvalidArgument,
        2 => Status::Timeout,
        4 => Status::Protocol,
        5 => Status::NotFound,
        8 => Status::Unsupported,
        9 => Status::InvalidState,
        11 => Status::Internal,
        _ => Status::Io,
    }
}

/// A required callback (checked by `new`, so the vtable a store holds has every one).
fn required<T>(f: Option<T>, name: &str) -> Result<T> {
    f.ok_or_else(|| {
        Error::invalid(format!(
            "nvfipc_store_callbacks.{name} is NULL; set, get, add, check, delete_key and wait are \
             required"
        ))
    })
}

/// An optional callback; a NULL one makes the operation (`what`) unsupported.
fn optional<T>(f: Option<T>, name: &str, what: impl Display) -> Result<T> {
    f.ok_or_else(|| Error::unsupported(format!("{what}: the host store has no {name} callback")))
}

impl CallbackStore {
    /// Wraps a host vtable after checking that every required callback is set.
    pub fn new(callbacks: nvfipc_store_callbacks) -> Result<CallbackStore> {
        let cb = &callbacks;
        required(cb.set, "set")?;
        required(cb.get, "get")?;
        required(cb.add, "add")?;
        required(cb.check, "check")?;
        required(cb.delete_key, "delete_key")?;
        required(cb.wait, "wait")?;
        Ok(CallbackStore {
            cb: callbacks,
            timeout: DEFAULT_TIMEOUT,
            server_port: Mutex::new(None),
        })
    }

    /// Records where the store's server listens (`host`, `port`: what the host's own client
    /// connects to), so that [`Store::liveness`] can tell, without a request, whether a server on
    /// this machine is still there. A host on another machine leaves it unknown.
    pub fn set_server_address(&self, host: &str, port: u16) {
        let on_this_machine = crate::os::net::is_this_machine(host);
        *lock(&self.server_port) = on_this_machine.then_some(port);
    }

    /// Sets the timeout reported by [`Store::default_timeout`] (default 300 s).
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Calls a callback with the host's `ctx` and turns its return code into a result, with the
    /// host's message when it has one; `what` describes the call for that message.
    fn call(
        &self,
        what: impl FnOnce() -> String,
        call: impl FnOnce(*mut c_void) -> c_int,
    ) -> Result<()> {
        let rc = call(self.cb.ctx);
        if rc == 0 {
            return Ok(());
        }
        let mut message = format!("host store callback {} failed with code {rc}", what());
        // SAFETY: a host callback called with its own ctx; it returns NULL or a NUL-terminated
        // string valid until its next call, which we copy right away.
        let text = self
            .cb
            .error_message
            .map_or(ptr::null(), |f| unsafe { f(self.cb.ctx) });
        if !text.is_null() {
            // SAFETY: non-NULL, NUL-terminated per the contract above.
            let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
            if !text.is_empty() {
                message = format!("{message}: {text}");
            }
        }
        Err(Error::new(status_of(rc), message))
    }

    /// [`Self::call`] for a callback that returns a value through `(out_value, out_len)`: copies
    /// the value out (the host's buffer is released when it was handed over).
    fn call_value(
        &self,
        what: impl FnOnce() -> String,
        call: impl FnOnce(*mut c_void, *mut *mut u8, *mut usize) -> c_int,
    ) -> Result<Vec<u8>> {
        let (mut ptr, mut len) = (ptr::null_mut::<u8>(), 0usize);
        self.call(what, |ctx| call(ctx, &mut ptr, &mut len))?;
        let cb = &self.cb;
        HostValue { cb, ptr, len }.to_vec()
    }

    fn call_set(&self, f: SetFn, name: &str, key: &str, value: &[u8]) -> Result<()> {
        let (k, v) = (key.as_ptr().cast(), value.as_ptr());
        self.call(
            || format!("{name}(key {key:?})"),
            // SAFETY: the key and value pointers are valid for their lengths during the call;
            // ctx is the host's, per the vtable contract.
            |ctx| unsafe { f(ctx, k, key.len(), v, value.len()) },
        )
    }
}

impl Store for CallbackStore {
    fn liveness(&self) -> Liveness {
        let Some(port) = *lock(&self.server_port) else {
            return Liveness::Unknown;
        };
        match crate::os::net::server_view(port) {
            Some(view) if view.served_here => Liveness::ServedHere {
                other_clients: view.other_clients,
            },
            Some(view) if view.listening => Liveness::Alive,
            Some(_) => Liveness::Gone,
            None => Liveness::Unknown,
        }
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call_set(required(self.cb.set, "set")?, "set", key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let f = required(self.cb.get, "get")?;
        let (k, ms) = (key.as_ptr().cast(), timeout_ms(timeout));
        self.call_value(
            || format!("get(key {key:?}, timeout {ms}ms)"),
            // SAFETY: key is valid for key.len() bytes; the out-pointers are valid locals.
            |ctx, out, len| unsafe { f(ctx, k, key.len(), ms, out, len) },
        )
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let f = required(self.cb.add, "add")?;
        let mut out = 0i64;
        self.call(
            || format!("add(key {key:?}, {delta})"),
            // SAFETY: key is valid for key.len() bytes; `out` is a valid local.
            |ctx| unsafe { f(ctx, key.as_ptr().cast(), key.len(), delta, &mut out) },
        )?;
        Ok(out)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        if keys.is_empty() {
            return Ok(true);
        }
        let f = required(self.cb.check, "check")?;
        let (ptrs, lens) = key_arrays(keys);
        let mut ready = false;
        self.call(
            || format!("check(keys {keys:?})"),
            // SAFETY: both arrays hold `keys.len()` entries describing live key bytes; `ready`
            // is a valid local.
            |ctx| unsafe { f(ctx, ptrs.as_ptr(), lens.as_ptr(), keys.len(), &mut ready) },
        )?;
        Ok(ready)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let f = required(self.cb.wait, "wait")?;
        let (ptrs, lens) = key_arrays(keys);
        let ms = timeout_ms(timeout);
        self.call(
            || format!("wait(keys {keys:?}, timeout {ms}ms)"),
            // SAFETY: both arrays hold `keys.len()` entries describing live key bytes.
            |ctx| unsafe { f(ctx, ptrs.as_ptr(), lens.as_ptr(), keys.len(), ms) },
        )
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        let f = required(self.cb.delete_key, "delete_key")?;
        let mut deleted = false;
        self.call(
            || format!("delete_key(key {key:?})"),
            // SAFETY: key is valid for key.len() bytes; `deleted` is a valid local.
            |ctx| unsafe { f(ctx, key.as_ptr().cast(), key.len(), &mut deleted) },
        )?;
        Ok(deleted)
    }

    fn num_keys(&self) -> Result<i64> {
        let f = optional(self.cb.num_keys, "num_keys", "num_keys()")?;
        let mut count = 0i64;
        // SAFETY: `count` is a valid local.
        self.call(|| "num_keys()".into(), |ctx| unsafe { f(ctx, &mut count) })?;
        Ok(count)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let what = || format!("compare_set(key {key:?})");
        let f = optional(self.cb.compare_set, "compare_set", what())?;
        // SAFETY: key, expected and desired are valid for their lengths; the out-pointers are
        // valid locals.
        self.call_value(what, |ctx, out, len| unsafe {
            f(
                ctx,
                key.as_ptr().cast(),
                key.len(),
                expected.as_ptr(),
                expected.len(),
                desired.as_ptr(),
                desired.len(),
                out,
                len,
            )
        })
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let what = format_args!("append(key {key:?})");
        let f = optional(self.cb.append, "append", what)?;
        self.call_set(f, "append", key, value)
    }

    fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        let Some(f) = self.cb.multi_set else {
            return pairs.iter().try_for_each(|(k, v)| self.set(k, v));
        };
        if pairs.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| *k).collect();
        let (ptrs, lens) = key_arrays(&keys);
        let values: Vec<*const u8> = pairs.iter().map(|(_, v)| v.as_ptr()).collect();
        let value_lens: Vec<usize> = pairs.iter().map(|(_, v)| v.len()).collect();
        let (v, vl) = (values.as_ptr(), value_lens.as_ptr());
        self.call(
            || format!("multi_set({} keys, first {:?})", keys.len(), keys[0]),
            // SAFETY: all four arrays hold `pairs.len()` entries describing live bytes.
            |ctx| unsafe { f(ctx, ptrs.as_ptr(), lens.as_ptr(), v, vl, pairs.len()) },
        )
    }

    fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let Some(f) = self.cb.multi_get else {
            return crate::store::wait_then_get(self, keys, timeout);
        };
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (ptrs, lens) = key_arrays(keys);
        let mut out_ptrs = vec![ptr::null_mut::<u8>(); keys.len()];
        let mut out_lens = vec![0usize; keys.len()];
        let ms = timeout_ms(timeout);
        let what = || format!("multi_get(keys {keys:?}, timeout {ms}ms)");
        // SAFETY: the key arrays describe live bytes; the output arrays have `keys.len()`
        // writable entries.
        self.call(what, |ctx| unsafe {
            f(
                ctx,
                ptrs.as_ptr(),
                lens.as_ptr(),
                keys.len(),
                ms,
                out_ptrs.as_mut_ptr(),
                out_lens.as_mut_ptr(),
            )
        })?;
        // Take ownership of every value first, so all are released even if one is invalid.
        let cb = &self.cb;
        let owned: Vec<HostValue<'_>> = out_ptrs
            .iter()
            .zip(&out_lens)
            .map(|(&ptr, &len)| HostValue { cb, ptr, len })
            .collect();
        owned.iter().map(HostValue::to_vec).collect()
    }

    fn default_timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests;
