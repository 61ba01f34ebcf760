//! The registry of live objects handed to C: handles (boxed Rust values) and library-owned byte
//! buffers. A pointer is dereferenced only once the registry confirms it is a live object of the
//! expected type, so a double free, a use after free or a wrong type is an error rather than a
//! touch of freed memory (a magic field could not do that: reading it from a freed pointer is the
//! bug). Undetectable: a freed address reused by a new object of the same type.

use super::args::check_not_null;
use super::boundary::ffi_call;
use crate::error::{Error, Result, Status};
use once_cell::sync::Lazy;
use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{RwLock, RwLockWriteGuard};

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

// process-wide: a C pointer may be passed to any call from any thread, so which pointers are
// live is known only to the process. A read-write lock: every call looks up (a read), only
// creating and freeing objects write, so calls on live objects never wait for each other here.
static LIVE: Lazy<RwLock<HashMap<usize, Live>>> = Lazy::new(|| RwLock::new(HashMap::new()));

/// Locks the registry for a change. Nothing panics while holding it, but tolerate poisoning anyway.
fn live() -> RwLockWriteGuard<'static, HashMap<usize, Live>> {
    LIVE.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn describe(entry: &Live) -> String {
    match entry {
        Live::Handle { c_name, .. } => format!("a live {c_name}"),
        Live::Buffer { len } => format!("a buffer of {len} bytes"),
    }
}

/// A Rust type handed to C as an opaque pointer. Its fields should be cheap to clone (`Arc`s):
/// [`handle_ref`] clones the object under the registry lock so that a concurrent free cannot pull
/// it away during a call.
pub(crate) trait Handle: Clone + Send + Sync + 'static {
    /// The C type name, used in error messages: the Rust type's own name.
    fn c_name() -> &'static str {
        let path = std::any::type_name::<Self>();
        path.rsplit("::").next().unwrap_or(path)
    }
}

/// Boxes `obj`, registers it as live and returns the pointer for C.
pub(crate) fn into_handle<T: Handle>(obj: T) -> *mut T {
    let ptr = Box::into_raw(Box::new(obj));
    let entry = Live::Handle {
        type_id: TypeId::of::<T>(),
        c_name: T::c_name(),
    };
    live().insert(ptr as usize, entry);
    ptr
}

fn check_handle<T: Handle>(
    registry: &HashMap<usize, Live>,
    ptr: *const T,
    name: &str,
) -> Result<()> {
    match registry.get(&(ptr as usize)) {
        Some(Live::Handle { type_id, .. }) if *type_id == TypeId::of::<T>() => Ok(()),
        Some(other) => Err(Error::invalid(format!(
            "argument `{name}` ({ptr:p}) is {}, not a {}",
            describe(other),
            T::c_name()
        ))),
        None => Err(Error::state(format!(
            "argument `{name}` ({ptr:p}) is not a live {} (already freed, or not created by \
             this library)",
            T::c_name()
        ))),
    }
}

/// Returns a clone of the live handle at `ptr`, or an error when `ptr` is NULL, freed or of
/// another type.
pub(crate) fn handle_ref<T: Handle>(ptr: *const T, name: &str) -> Result<T> {
    check_not_null(ptr, name)?;
    let registry = LIVE.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    check_handle(&registry, ptr, name)?;
    // SAFETY: the registry says `ptr` came from `into_handle::<T>` and has not been freed; frees
    // remove it from the registry under the write lock before dropping, which cannot be taken
    // while we hold the read lock, so it stays valid while we clone it.
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
                other.map_or_else(
                    || "not live (already freed, or not created by this library)".into(),
                    describe
                )
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

/// Frees a buffer returned by the library (e.g. by `nvfipc_store_get`), given the length returned
/// with it. NULL is a no-op. Freeing twice, or a pointer the library did not return, gives
/// `NVFIPC_STATUS_INVALID_STATE`; a wrong length gives `NVFIPC_STATUS_INVALID_ARGUMENT` (and
/// the buffer stays allocated). Thread-safe.
#[no_mangle]
pub extern "C" fn nvfipc_buffer_free(data: *mut u8, len: usize) -> Status {
    ffi_call("nvfipc_buffer_free", || free_buffer(data, len))
}

#[cfg(test)]
mod tests;
