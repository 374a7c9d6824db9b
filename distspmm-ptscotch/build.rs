//! Links Debian's 64-bit PT-Scotch statically (`libptscotch-dev`, PT-Scotch 7.0).
//!
//! The 32-bit and the 64-bit builds share a soname and an archive name, so the archives are
//! linked by path: build.rs links them into OUT_DIR under names of their own, and rustc bundles
//! them into this crate's rlib. Nothing can pick up the 32-bit `libptscotch` at link or run time.
//! `libptscotch.a` holds all of libScotch; `libptscotcherr.a` is the error handler that prints
//! and returns (never `libptscotcherrexit`, which calls `exit()`).
//!
//! `PTSCOTCH_INT64_LIB_DIR` and `PTSCOTCH_INT64_INCLUDE_DIR` override the Debian paths.

use std::path::{Path, PathBuf};

const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu/scotch-int64";
const INCLUDE_DIR: &str = "/usr/include/scotch-int64";
const INSTALL: &str = "install Debian's libptscotch-dev (apt-get install libptscotch-dev), \
                       or point PTSCOTCH_INT64_LIB_DIR and PTSCOTCH_INT64_INCLUDE_DIR at a \
                       PT-Scotch 7 built with 64-bit SCOTCH_Num (-DINTSIZE64)";

fn dir(env: &str, default: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed={env}");
    std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// Fails the build unless `scotch.h` declares SCOTCH_Num as a 64-bit integer.
fn check_num_is_64_bit(include: &Path) {
    let header = include.join("scotch.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; {INSTALL}", header.display()));
    let num = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("typedef") && l.ends_with("SCOTCH_Num;"))
        .unwrap_or_else(|| panic!("{} declares no SCOTCH_Num; {INSTALL}", header.display()));
    let words: Vec<&str> = num.split_whitespace().collect();
    assert!(
        words.len() == 3 && words[1] == "int64_t",
        "{} declares `{num}`: this crate needs the 64-bit SCOTCH_Num (int64_t); {INSTALL}",
        header.display()
    );
}

fn main() {
    let lib = dir("PTSCOTCH_INT64_LIB_DIR", LIB_DIR);
    let include = dir("PTSCOTCH_INT64_INCLUDE_DIR", INCLUDE_DIR);
    check_num_is_64_bit(&include);

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // Order matters for the static link: PT-Scotch first, then its error handler.
    for (archive, name) in [
        ("libptscotch.a", "distspmm_ptscotch_int64"),
        ("libptscotcherr.a", "distspmm_ptscotcherr_int64"),
    ] {
        let from = lib.join(archive);
        println!("cargo:rerun-if-changed={}", from.display());
        assert!(from.is_file(), "{} is missing; {INSTALL}", from.display());
        let to = out.join(format!("lib{name}.a"));
        let _ = std::fs::remove_file(&to);
        std::os::unix::fs::symlink(&from, &to)
            .unwrap_or_else(|e| panic!("cannot link {} to {}: {e}", from.display(), to.display()));
        println!("cargo:rustc-link-lib=static={name}");
    }
    println!("cargo:rustc-link-search=native={}", out.display());
    // What the archives call besides MPI (linked by rsmpi): zlib, bzip2 and xz for compressed
    // graph files (never used here) by their runtime sonames, which libptscotch-dev's runtime
    // package pulls in, so no -dev package of theirs is needed; libm; pthread for the thread
    // contexts.
    for soname in ["libz.so.1", "libbz2.so.1.0", "liblzma.so.5"] {
        println!("cargo:rustc-link-lib=dylib:+verbatim={soname}");
    }
    println!("cargo:rustc-link-lib=dylib=m");
    println!("cargo:rustc-link-lib=dylib=pthread");
}
