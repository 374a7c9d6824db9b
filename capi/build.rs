//! Gives `libdistspmm.so` the SONAME `libdistspmm.so.<major>`, so a program linked against it
//! loads only an ABI-compatible library (see docs/c-api.md, "ABI rules"), and keeps the
//! symbols of the libraries linked into it out of its dynamic symbol table.
//!
//! rustc exports from a cdylib every `#[no_mangle]`/`#[export_name]` function of every crate
//! linked in, through a version script of its own that a second script can only add to: the
//! partitioner's C++ bridge (`cxx`, `cxxbridge1$…`) when a build unifies in the `kaminpar`
//! feature. `--exclude-libs ALL` hides whatever comes from an archive (the dependencies'
//! rlibs, the C++ static libraries), so only this crate's own `dsp_*` functions stay exported
//! (checked by tests/exports.rs). Under LTO the dependencies reach the linker as objects,
//! not archives: a `--release` build that links the partitioner still exports the bridge.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libdistspmm.so.{major}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
