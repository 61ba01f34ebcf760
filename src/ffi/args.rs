//! Argument helpers of the C ABI: the one place where raw argument pointers become Rust
//! references, and C integers become ranks, counts and timeouts. They must only be given pointers
//! a C caller passed to an `nvfipc_*` function: the C contract (each pointer NULL or valid for the
//! stated length, strings NUL-terminated) makes their `unsafe` blocks sound; they check what can
//! be checked (NULL, alignment, UTF-8, lengths). Names are `impl Display`, formatted only when a
//! message needs them (a warm `nvfipc_cache_get` once spent most of its time formatting names).

use crate::cuda::p2p::Stream;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void};
use std::fmt::Display;
use std::time::Duration;

/// Fails with `InvalidArgument` naming `name` when `ptr` is NULL.
pub(crate) fn check_not_null<T>(ptr: *const T, name: impl Display) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::invalid(format!("argument `{name}` is NULL")));
    }
    Ok(())
}

/// Longest string argument (a key, tag, scope or host name), in bytes without its NUL: the
/// longest key a TCPStore server accepts. A string argument is never read beyond it.
pub const NVFIPC_MAX_STRING_LEN: usize = 8192;
const _: () = assert!(NVFIPC_MAX_STRING_LEN == crate::store::wire::MAX_KEY_LEN);

/// Most keys in one call (`nvfipc_store_check`, `_wait`, `_multi_set`, `_multi_get`,
/// `nvfipc_buffers_free`): the most a TCPStore request names.
pub const NVFIPC_MAX_KEYS: usize = 131_072;
const _: () = assert!(NVFIPC_MAX_KEYS == crate::store::wire::MAX_KEY_COUNT);

/// Borrows a NUL-terminated UTF-8 C string argument of at most `NVFIPC_MAX_STRING_LEN` bytes.
pub(crate) fn c_str_arg<'a>(ptr: *const c_char, name: impl Display) -> Result<&'a str> {
    check_not_null(ptr, &name)?;
    // SAFETY: non-NULL (checked above); the C contract says string arguments are NUL-terminated
    // and stay valid during the call; strnlen reads no further than the NUL or the limit + 1.
    let len = unsafe { libc::strnlen(ptr, NVFIPC_MAX_STRING_LEN + 1) };
    if len > NVFIPC_MAX_STRING_LEN {
        return Err(Error::invalid(format!(
            "argument `{name}` is longer than NVFIPC_MAX_STRING_LEN = {NVFIPC_MAX_STRING_LEN} \
             bytes (or lacks its NUL terminator)"
        )));
    }
    // SAFETY: the `len` bytes before the NUL that strnlen found are readable and stay valid
    // during the call, which outlives every use of the result.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    std::str::from_utf8(bytes).map_err(|e| {
        Error::invalid(format!(
            "argument `{name}` is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

/// Checks a count or length argument against its documented limit (`limit` = `max`, e.g.
/// "NVFIPC_MAX_REQUESTS"), before anything is read or allocated with it.
pub(crate) fn count_arg(value: usize, name: &str, limit: &str, max: usize) -> Result<usize> {
    if value > max {
        return Err(Error::invalid(format!(
            "argument `{name}` = {value} is above the limit of {limit} = {max}"
        )));
    }
    Ok(value)
}

/// Checks an array of `len` items (input or output): non-NULL, aligned and of a representable
/// size; anything goes when `len` is 0.
fn check_array<T>(ptr: *const T, len: usize, name: impl Display) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    check_not_null(ptr, &name)?;
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
    Ok(())
}

/// Borrows `len` items at `ptr`; NULL is accepted only when `len` is 0.
pub(crate) fn slice_arg<'a, T>(ptr: *const T, len: usize, name: impl Display) -> Result<&'a [T]> {
    check_array(ptr, len, name)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-NULL, aligned and of a representable size (checked above); the C contract says
    // `ptr` points to `len` initialised items that stay valid and unmodified during the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Borrows one `T` at `ptr` (an input struct such as a vtable).
pub(crate) fn ref_arg<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    Ok(&slice_arg(ptr, 1, name)?[0])
}

/// Borrows an array of `n` C strings (NULL allowed when `n` is 0): a list of keys, so at most
/// `NVFIPC_MAX_KEYS`, given by the argument named `count`.
pub(crate) fn c_str_array_arg<'a>(
    ptr: *const *const c_char,
    n: usize,
    name: &str,
    count: &str,
) -> Result<Vec<&'a str>> {
    let max = NVFIPC_MAX_KEYS;
    let mut strs = Vec::with_capacity(count_arg(n, count, "NVFIPC_MAX_KEYS", max)?);
    for (i, &item) in slice_arg(ptr, n, name)?.iter().enumerate() {
        strs.push(c_str_arg(item, format_args!("{name}[{i}]"))?);
    }
    Ok(strs)
}

/// A checked output argument of `len` items at `ptr` (NULL only with `len` 0: an omitted
/// optional output). Check outputs before doing any work, so that nothing is created (and leaked)
/// when the caller gave no place to put it; write them on success only.
pub(crate) struct Out<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Out<T> {
    /// Stores `values` (at most `len`) at the start of the caller's array.
    pub(crate) fn write_all(self, values: impl IntoIterator<Item = T>) {
        for (i, v) in values.into_iter().take(self.len).enumerate() {
            // SAFETY: `i < len`; the array is non-NULL, aligned and of a representable size
            // (checked in `out_slice_arg`), and the C contract says it is writable for `len`
            // items. `write` does not drop the (possibly uninitialised) old value.
            unsafe { self.ptr.add(i).write(v) }
        }
    }

    /// Stores `value` in the caller's variable (nothing for an omitted optional output); `Ok`,
    /// so that it can end a body.
    pub(crate) fn write(self, value: T) -> Result<()> {
        self.write_all([value]);
        Ok(())
    }
}

/// Checks an output array argument of `len` items.
pub(crate) fn out_slice_arg<T>(ptr: *mut T, len: usize, name: &str) -> Result<Out<T>> {
    check_array(ptr.cast_const(), len, name)?;
    Ok(Out { ptr, len })
}

/// Checks an output pointer argument.
pub(crate) fn out_ptr<T>(ptr: *mut T, name: &str) -> Result<Out<T>> {
    out_slice_arg(ptr, 1, name)
}

/// An optional output argument: NULL means the caller does not want the value.
pub(crate) fn optional_out_ptr<T>(ptr: *mut T, name: &str) -> Result<Out<T>> {
    out_slice_arg(ptr, usize::from(!ptr.is_null()), name)
}

/// `$ty { f: $src.f, .. }` for a C struct that mirrors a Rust one field by field, plus
/// `extra: value` fields the Rust one lacks.
macro_rules! copy_fields {
    ($src:expr => $ty:ident { $($field:ident),+ $(,)? } $(, $extra:ident: $value:expr)*) => {{
        let src = $src;
        $ty { $($field: src.$field,)+ $($extra: $value,)* }
    }};
}
pub(crate) use copy_fields;

/// A stream argument (`CUstream` or `cudaStream_t`; NULL is the legacy default stream).
pub(crate) fn stream_arg(stream: *mut c_void) -> Stream {
    Stream(stream as usize)
}

/// Converts a C timeout: negative means `default`, 0 means "do not wait", otherwise milliseconds.
pub(crate) fn timeout_arg(timeout_ms: i64, default: Duration) -> Duration {
    u64::try_from(timeout_ms).map_or(default, Duration::from_millis)
}

/// Converts a C rank (`int64_t`) into an index in `0..world_size`.
pub(crate) fn rank_arg(rank: i64, world_size: usize, name: impl Display) -> Result<usize> {
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

#[cfg(test)]
mod tests;
