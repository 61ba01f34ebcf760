use crate::ffi::version::*;
use std::ffi::CStr;

#[test]
fn version_matches_cargo() {
    // SAFETY: nvfipc_version returns a pointer to a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(nvfipc_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}
