//! Regenerates include/nvfuser_ipc.h from the C ABI with cbindgen (configuration in
//! cbindgen.toml). The header is committed; CI rebuilds and fails when the build changed it.
//!
//! Only the files that define the C ABI are parsed (`ABI_SOURCES`), so public Rust constants and
//! types elsewhere in the crate never leak into the C namespace. The order is fixed, which keeps
//! the header deterministic.

use std::path::PathBuf;

/// The files cbindgen reads, in header order. cbindgen follows `mod` declarations, so
/// src/ffi/mod.rs brings in every module of the C ABI (in declaration order). The other two define
/// the `#[repr(C)]` library types the ABI hands out as they are, so that C sees the Rust type
/// itself rather than a copy kept in step by hand: `Status` and `CacheStats` (renamed to their C
/// names in cbindgen.toml). Neither defines a function or a vtable: the C boundary is src/ffi.
const ABI_SOURCES: &[&str] = &["src/error.rs", "src/exchange/session.rs", "src/ffi/mod.rs"];

/// Version macros, from Cargo.toml so that they can never disagree with `nvfipc_version()`.
fn version_defines() -> String {
    let env = |name: &str| std::env::var(name).expect("cargo sets the package version variables");
    format!(
        "\n/* Version of this header; compare with nvfipc_version() at run time. */\n\
         #define NVFIPC_VERSION \"{}\"\n\
         #define NVFIPC_VERSION_MAJOR {}\n\
         #define NVFIPC_VERSION_MINOR {}\n\
         #define NVFIPC_VERSION_PATCH {}\n",
        env("CARGO_PKG_VERSION"),
        env("CARGO_PKG_VERSION_MAJOR"),
        env("CARGO_PKG_VERSION_MINOR"),
        env("CARGO_PKG_VERSION_PATCH"),
    )
}

fn main() {
    let crate_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // A SONAME lets CMake and the dynamic loader refer to the library by name rather than by
    // the absolute path it was built at.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvfuser_ipc.so");
    }
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is readable");
    let mut after = config.after_includes.take().unwrap_or_default();
    after.push_str(&version_defines());
    config.after_includes = Some(after);

    let out = crate_dir.join("include").join("nvfuser_ipc.h");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for src in ABI_SOURCES {
        builder = builder.with_src(crate_dir.join(src));
    }
    let bindings = match builder.generate() {
        Ok(bindings) => bindings,
        Err(e) => {
            println!(
                "cargo:warning=cbindgen could not generate {}: {e}",
                out.display()
            );
            return;
        }
    };
    let mut text = Vec::new();
    bindings.write(&mut text);
    // Only touch the file when its content changes (keeps mtimes, and works on read-only trees
    // whose header is already current).
    if std::fs::read(&out).ok().as_deref() != Some(text.as_slice()) {
        if let Err(e) = std::fs::write(&out, &text) {
            println!("cargo:warning=could not write {}: {e}", out.display());
        }
    }
}
