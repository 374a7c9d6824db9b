//! Gives `libdistspmm.so` the SONAME `libdistspmm.so.<major>`, so a program linked against it
//! loads only an ABI-compatible library (see docs/c-api.md, "ABI rules").
//!
//! What the library exports is rustc's doing: its version script makes global this crate's
//! `dsp_*` functions and the `#[no_mangle]` functions of every crate linked in, and everything
//! else (the C and C++ of static libraries included) local. No dependency of this crate has
//! such functions — the one that did, the partitioner's `cxx` bridge, lives with KaMinPar in
//! distspmm-prep, which this crate does not depend on — so no linker flag is needed to hide
//! any (`--exclude-libs` would act only without LTO, where dependencies reach the linker as
//! archives, so a debug build would hide what a release build exports). tests/exports.rs
//! checks the dependency graph and the exported symbols.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libdistspmm.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
