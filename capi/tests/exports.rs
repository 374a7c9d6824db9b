//! The C library links no partitioner, in any build, and `libdistspmm.so` exports the C ABI's
//! `dsp_*` functions — every one the header declares — and nothing else.
//!
//! rustc exports from a cdylib the `#[no_mangle]` functions of every crate linked in, so a
//! C++ bridge in the library (the `kaminpar` crate's `cxx`, with its `cxxbridge1$…` functions)
//! would be exported, and under LTO no linker flag hides it. The partitioners (METIS, KaMinPar
//! and its TBB, PT-Scotch) therefore live in distspmm-prep and distspmm-ptscotch, which only the
//! CLI (and tests) depend on; the dependency check below looks at the whole workspace's resolved
//! graph, as `cargo build` of the workspace unifies features across its members.

mod common;

use std::process::Command;
use std::time::Duration;

const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The names `nm ARGS LIB` lists.
fn symbols(nm: &std::path::Path, args: &[&str], lib: &std::path::Path) -> Vec<String> {
    let out = common::run(Command::new(nm).args(args).arg(lib), RUN_TIMEOUT);
    common::assert_success("nm", &out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

/// The functions `include/distspmm.h` declares.
fn declared_functions() -> Vec<String> {
    let header = std::fs::read_to_string(common::repo_root().join("include/distspmm.h")).unwrap();
    header
        .lines()
        .filter(|l| {
            l.ends_with(");")
                && !l.starts_with(' ')
                && !l.starts_with("typedef")
                && !l.starts_with("//")
        })
        .map(|line| {
            line.split('(')
                .next()
                .and_then(|head| head.split_whitespace().last())
                .unwrap()
                .trim_start_matches('*')
                .to_owned()
        })
        .collect()
}

/// Packages the C library must not depend on: the preprocessing (distspmm-prep, with the graph
/// readers and the partitioners), METIS, PT-Scotch, the `kaminpar` crate and its C++ bridge
/// (`cxx`, `cxx-build`, `cxxbridge-*`).
fn is_partitioner(package: &str) -> bool {
    package.contains("kaminpar")
        || package == "distspmm-prep"
        || package.contains("metis")
        || package.contains("scotch")
        || package == "cxx"
        || package.starts_with("cxx-")
        || package.starts_with("cxxbridge")
}

#[test]
fn no_workspace_build_links_the_partitioner_into_the_c_library() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The whole workspace, as `cargo build --release` at its root builds it (features unified
    // across the members, the CLI's `kaminpar` among them), with the C library's `cuda`.
    let out = common::run(
        Command::new(cargo).current_dir(common::repo_root()).args([
            "tree",
            "--workspace",
            "--features",
            "distspmm-capi/cuda",
            "--edges",
            "normal,build",
            "--prefix",
            "depth",
            "--no-dedupe",
        ]),
        RUN_TIMEOUT,
    );
    common::assert_success("cargo tree --workspace", &out);
    let tree = String::from_utf8_lossy(&out.stdout);
    // `0<root> …` starts each member's tree; `<depth><package> v<version> …` follow.
    let capi: Vec<&str> = tree
        .lines()
        .skip_while(|l| !l.starts_with("0distspmm-capi "))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || !l.starts_with('0'))
        .filter_map(|(_, l)| {
            l.trim_start_matches(|c: char| c.is_ascii_digit())
                .split_whitespace()
                .next()
        })
        .collect();
    assert!(
        capi.contains(&"distspmm-sparse") && capi.contains(&"distspmm-op"),
        "cargo tree listed no dependency tree of distspmm-capi: {capi:?}"
    );
    // Still the partitioners: the CLI depends on them, so the check above is not vacuous.
    for partitioner in ["distspmm-prep", "kaminpar", "metis"] {
        assert!(
            tree.lines().any(|l| l
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .starts_with(&format!("{partitioner} "))),
            "the CLI lost {partitioner}"
        );
    }
    let linked: std::collections::BTreeSet<&str> =
        capi.into_iter().filter(|p| is_partitioner(p)).collect();
    assert!(
        linked.is_empty(),
        "distspmm-capi depends on the partitioner in a workspace build: {linked:?} \
         (see `cargo tree --workspace -i <package>`)"
    );
}

/// The functions added in 0.2: the per-edge operand's and the message precision's.
const CALLS_OF_0_2: [&str; 12] = [
    "dsp_spmm_edge_count",
    "dsp_spmm_edges",
    "dsp_spmm_edge_weights",
    "dsp_spmm_forward_values",
    "dsp_spmm_backward_values",
    "dsp_sddmm",
    "dsp_sddmm_backward",
    "dsp_edge_softmax",
    "dsp_edge_softmax_backward",
    "dsp_spmm_create_with_precision",
    "dsp_spmm_comm_precision",
    "dsp_spmm_create_device_with_precision",
];

#[test]
fn only_the_c_abi_is_exported() {
    let Some(nm) = common::tool("nm") else { return };
    common::build_library();
    let lib = common::profile_dir().join("libdistspmm.so");
    // No partitioner nor its bridge is in the library at all (its static symbol table names
    // none of KaMinPar's C++ functions, `libkaminpar::…`, TBB's, METIS's `METIS_…`, nor a
    // `cxxbridge` one).
    let linked = symbols(&nm, &["--defined-only"], &lib);
    let foreign: Vec<&String> = linked
        .iter()
        .filter(|s| {
            s.contains("libkaminpar")
                || s.contains("cxxbridge")
                || s.contains("METIS_")
                || s.contains("tbb")
        })
        .collect();
    assert!(
        foreign.is_empty(),
        "{} links the partitioner: {:?}",
        lib.display(),
        &foreign[..foreign.len().min(10)]
    );
    let exported = symbols(&nm, &["-D", "--defined-only"], &lib);
    let foreign: Vec<&String> = exported.iter().filter(|s| !s.starts_with("dsp_")).collect();
    assert!(
        foreign.is_empty(),
        "{} exports {} symbols besides the C ABI: {:?}",
        lib.display(),
        foreign.len(),
        &foreign[..foreign.len().min(10)]
    );
    let declared = declared_functions();
    assert!(declared.len() >= 30, "only {} declarations", declared.len());
    // The calls of 0.2 (what GraphSAGE, GIN and GAT need, and the message precision), by
    // name: the generic checks below would not notice them missing from both the header and
    // the library.
    for name in CALLS_OF_0_2 {
        assert!(
            declared.iter().any(|d| d == name),
            "{name} is not declared in include/distspmm.h"
        );
    }
    let missing: Vec<&String> = declared
        .iter()
        .filter(|name| !exported.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "declared in include/distspmm.h but not exported: {missing:?}"
    );
}
