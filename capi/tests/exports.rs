//! The dynamic symbols of `libdistspmm.so`: the C ABI's `dsp_*` functions — every one the
//! header declares — and nothing else, also when the build links in the partitioner's C++
//! bridge (distspmm-core's `kaminpar` feature, which a build of the whole workspace unifies in
//! from the command line) and with it the `cxx` crate's `cxxbridge1$…` functions.

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
        .filter(|l| l.ends_with(");") && !l.starts_with(' ') && !l.starts_with("typedef"))
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

#[test]
fn only_the_c_abi_is_exported_even_with_the_partitioner_linked_in() {
    let Some(nm) = common::tool("nm") else { return };
    common::build_library_with(&["distspmm-core/kaminpar"]);
    let lib = common::profile_dir().join("libdistspmm.so");
    // The partitioner is in the library (its static symbol table names KaMinPar), so the
    // check below shows that the link keeps its bridge out of the dynamic symbol table.
    let linked = symbols(&nm, &["--defined-only"], &lib);
    assert!(
        linked.iter().any(|s| s.contains("kaminpar")),
        "{} does not link the partitioner: the test checks nothing",
        lib.display()
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
    let missing: Vec<&String> = declared
        .iter()
        .filter(|name| !exported.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "declared in include/distspmm.h but not exported: {missing:?}"
    );
}
