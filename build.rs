//! Regenerates include/nvfuser_ipc.h from the C ABI in src/ffi with cbindgen.
//! The header is committed; CI fails when a build changes it.

use std::path::PathBuf;

fn main() {
    let crate_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is readable");
    let out = crate_dir.join("include").join("nvfuser_ipc.h");
    match cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
    {
        // write_to_file only touches the file when its content changes.
        Ok(bindings) => {
            bindings.write_to_file(&out);
        }
        Err(e) => println!(
            "cargo:warning=cbindgen could not generate {}: {e}",
            out.display()
        ),
    }
}
