//! With the `kaminpar` feature: compiles csrc/kaminpar_shim.cc, the C entry point into the
//! KaMinPar library that the `kaminpar` crate builds (and links, with TBB).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/kaminpar_shim.cc");
    if std::env::var_os("CARGO_FEATURE_KAMINPAR").is_none() {
        return;
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("csrc/kaminpar_shim.cc")
        .warnings(true)
        .compile("distspmm_kaminpar_shim");
    println!("cargo:rustc-link-lib=dylib=tbb");
}
