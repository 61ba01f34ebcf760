//! The C ABI (`nvfipc_*`): a thin layer that checks arguments, calls the Rust API and maps errors
//! to [`crate::Status`] plus a thread-local message. Everything unsafe or shared is in
//! [`boundary`] (panic boundary, last error), [`args`] (argument pointers to Rust references) and
//! [`registry`] (live handles and library-owned buffers); the modules of the C object families
//! only convert and call. The conventions of every function head the generated header
//! (`after_includes` in cbindgen.toml).

// The C names of the ABI's types (`nvfipc_store`, ...) are the Rust names.
#![allow(non_camel_case_types)]

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
