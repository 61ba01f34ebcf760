//! The C ABI (`nvfipc_*`): a thin layer that checks arguments, calls the Rust API and maps
//! errors to [`crate::Status`] plus a thread-local message. Three modules hold everything unsafe or
//! shared: [`boundary`] (the panic boundary and the last error), [`args`] (raw argument pointers to
//! Rust references) and [`registry`] (live handles and library-owned buffers); the other modules,
//! one per C object family, only convert and call.
//!
//! Conventions shared by every function:
//! - the return value is an `nvfipc_status` (`NVFIPC_STATUS_OK` is 0); on failure
//!   `nvfipc_last_error_message()` says what failed and what to do;
//! - results go through output pointers, which are only written on success;
//! - objects are opaque pointers made by `nvfipc_X_create/connect/...` and released with
//!   `nvfipc_X_free`; freeing NULL is a no-op; a freed or wrong-type pointer is reported
//!   (`NVFIPC_STATUS_INVALID_STATE` / `NVFIPC_STATUS_INVALID_ARGUMENT`) instead of crashing,
//!   except when the library has meanwhile reused the address for a new object of the same type;
//! - ranks are `int64_t`; `timeout_ms < 0` means the object's default timeout, 0 means "check
//!   once, do not wait".

pub(crate) mod args;
pub mod barrier;
pub mod boundary;
pub mod channel;
pub mod context;
pub mod cuda;
pub mod exchange;
pub mod host;
pub mod log;
pub(crate) mod registry;
pub mod store;
pub mod store_callbacks;
pub mod symmetric;
pub mod version;

#[cfg(test)]
mod tests;
