//! Compiles the generated header as strict C11 and C++17 with warnings as errors, so that a C
//! ABI change that breaks the header (a name clash, a type C cannot express) fails `cargo test`
//! rather than only the CMake suites. Skipped when no C/C++ compiler is installed.
//!
//! The tests of the C families that need nothing private are its submodules: they call the ABI
//! as C does.

mod boundary;
mod channel;
mod cuda;
mod exchange;
mod host;
mod log;
mod version;

use std::ffi::CStr;
use std::path::Path;
use std::process::Command;

/// A copy of this thread's last error message ("" when none).
pub(crate) fn last_error_message() -> String {
    // SAFETY: never NULL; the string lives until the next failing call on this thread.
    let message = unsafe { CStr::from_ptr(super::boundary::nvfipc_last_error_message()) };
    message.to_string_lossy().into_owned()
}

fn compile_header(compiler: &str, args: &[&str]) {
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/nvfuser_ipc.h");
    let output = match Command::new(compiler)
        .args(args)
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"])
        .arg(&header)
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            eprintln!("skipped: cannot run {compiler}: {e}");
            return;
        }
    };
    assert!(
        output.status.success(),
        "{compiler} {args:?} rejects {}:\n{}",
        header.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn header_compiles_as_c11() {
    compile_header("cc", &["-x", "c", "-std=c11"]);
}

#[test]
fn header_compiles_as_cxx17() {
    compile_header("c++", &["-x", "c++", "-std=c++17"]);
}
