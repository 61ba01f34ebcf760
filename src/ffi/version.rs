//! Library version, for checking at run time that the loaded library matches the header
//! (`NVFIPC_VERSION`, generated from Cargo.toml into the header by build.rs).

use std::ffi::c_char;

/// NUL-terminated copy of the crate version.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The version of the loaded library, e.g. "0.4.0"; compare with `NVFIPC_VERSION` from the
/// header. Static: never NULL, never freed. Thread-safe.
#[no_mangle]
pub extern "C" fn nvfipc_version() -> *const c_char {
    VERSION.as_ptr().cast()
}
