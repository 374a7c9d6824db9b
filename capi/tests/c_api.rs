//! The C ABI from C and C++: installs the library (`capi/install.sh`), compiles
//! `tests/c/api_test.c`, `tests/c/edges_test.c` and `tests/c/precision_test.c` (C99) and `tests/c/api_test.cpp` (C++11, a
//! host that initialises MPI) with warnings as errors through the installed pkg-config file,
//! runs them without MPI and under `mpirun`, links the static library, and checks the shared
//! library's exports.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use distspmm_prep::graph::Graph;

const BUILD_TIMEOUT: Duration = Duration::from_secs(180);
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The chunk directories the C tests read.
struct Fixtures {
    /// The small featured graph in 2 parts.
    dir2: PathBuf,
    /// The same graph in 3 parts (opened under 2 ranks: a parts mismatch).
    dir3: PathBuf,
    /// A directed graph without node data in 2 parts (Ahat is not symmetric).
    directed: PathBuf,
    /// An existing directory without a manifest.
    empty: PathBuf,
}

/// A seeded random directed graph (duplicates and self loops included, as inputs may have).
fn directed_graph(nodes: u32, edges: usize, seed: u64) -> Graph {
    let mut state = seed;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % u64::from(nodes)) as u32
    };
    let (src, dst): (Vec<u32>, Vec<u32>) = (0..edges).map(|_| (next(), next())).unzip();
    Graph::from_edges(nodes as usize, src, dst)
}

fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let root = common::scratch().join("chunks");
        let f = Fixtures {
            dir2: root.join("csbm-2"),
            dir3: root.join("csbm-3"),
            directed: root.join("directed-2"),
            empty: root.join("empty"),
        };
        let graph = common::small_graph();
        common::write_chunks(&graph, 2, &f.dir2);
        common::write_chunks(&graph, 3, &f.dir3);
        common::write_chunks(&directed_graph(150, 700, 7), 2, &f.directed);
        std::fs::create_dir_all(&f.empty).unwrap();
        f
    })
}

/// `pkg-config --cflags --libs distspmm` (or `--static`) against the installed prefix.
fn pkg_config(static_link: bool) -> Option<Vec<String>> {
    let pkg_config = common::tool("pkg-config")?;
    let mut command = Command::new(pkg_config);
    command.env("PKG_CONFIG_PATH", common::prefix().join("lib/pkgconfig"));
    if static_link {
        command.arg("--static");
    }
    let out = common::run(
        command.args(["--cflags", "--libs", "distspmm"]),
        RUN_TIMEOUT,
    );
    common::assert_success("pkg-config distspmm", &out);
    let flags = String::from_utf8(out.stdout).unwrap();
    Some(flags.split_whitespace().map(str::to_owned).collect())
}

fn test_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// Compiles `source` into `output` with `compiler`, strict warnings, and pkg-config's flags.
fn compile(
    compiler: &str,
    standard: &str,
    source: &Path,
    output: &Path,
    static_link: bool,
) -> Option<PathBuf> {
    let compiler = common::tool(compiler)?;
    let mut flags = pkg_config(static_link)?;
    if static_link {
        // Link libdistspmm.a itself rather than the shared library next to it.
        for f in &mut flags {
            if f == "-ldistspmm" {
                *f = common::prefix()
                    .join("lib/libdistspmm.a")
                    .display()
                    .to_string();
            }
        }
    } else {
        flags.push(format!(
            "-Wl,-rpath,{}",
            common::prefix().join("lib").display()
        ));
    }
    let out = common::run(
        Command::new(&compiler)
            .args([standard, "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1"])
            .args(common::extra_cflags())
            .arg(source)
            .arg("-o")
            .arg(output)
            .args(&flags)
            .arg("-lm"),
        BUILD_TIMEOUT,
    );
    common::assert_success(&format!("compiling {}", source.display()), &out);
    Some(output.to_path_buf())
}

fn c_test_binary() -> Option<&'static Path> {
    static BINARY: OnceLock<Option<PathBuf>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            compile(
                "cc",
                "-std=c99",
                &test_source("api_test.c"),
                &common::scratch().join("api_test"),
                false,
            )
        })
        .as_deref()
}

/// Every rank printed its summary with no failed check.
fn assert_all_ranks_passed(what: &str, out: &std::process::Output, ranks: usize) {
    common::assert_success(what, out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let passed = stdout.lines().filter(|l| l.ends_with(", 0 failed")).count();
    assert_eq!(
        passed, ranks,
        "{what}: not every rank reported success:\n{stdout}"
    );
}

#[test]
fn c99_without_mpi_null_arguments_and_statuses() {
    let Some(binary) = c_test_binary() else {
        return;
    };
    let out = common::run(Command::new(binary).arg("nompi"), RUN_TIMEOUT);
    assert_all_ranks_passed("api_test nompi", &out, 1);
}

#[test]
fn c99_under_mpirun_every_function() {
    let Some(binary) = c_test_binary() else {
        return;
    };
    let f = fixtures();
    let args: Vec<&OsStr> = vec![
        OsStr::new("mpi"),
        f.dir2.as_os_str(),
        f.dir3.as_os_str(),
        f.directed.as_os_str(),
        f.empty.as_os_str(),
    ];
    let Some(out) = common::mpirun(2, binary, &args, &[], RUN_TIMEOUT) else {
        return;
    };
    assert_all_ranks_passed("mpirun -n 2 api_test mpi", &out, 2);
}

/// The per-edge calls (`tests/c/edges_test.c`) against dense references at P = 1 and 2, on a
/// weighted directed graph, with their argument statuses; chunks without edge weights refuse
/// `dsp_spmm_edge_weights`.
#[test]
fn c99_per_edge_calls_match_dense_references_at_p1_and_p2() {
    let Some(binary) = compile(
        "cc",
        "-std=c99",
        &test_source("edges_test.c"),
        &common::scratch().join("edges_test"),
        false,
    ) else {
        return;
    };
    let graph = common::directed_graph();
    let weights = graph.weights.as_deref().expect("a weighted graph");
    let weight_sum: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    // The normalisation adds a self loop at every node without one.
    let mut looped = vec![false; graph.num_nodes];
    for (s, d) in graph.src.iter().zip(&graph.dst) {
        if s == d {
            looped[*s as usize] = true;
        }
    }
    let added_loops = looped.iter().filter(|l| !**l).count();
    for parts in [1u32, 2] {
        let dir = common::scratch().join(format!("chunks/directed-weighted-{parts}"));
        common::write_chunks(&graph, parts, &dir);
        let old = common::scratch().join(format!("chunks/directed-unweighted-{parts}"));
        common::write_chunks_without_edge_weights(&graph, parts, &old);
        let (weight_sum, added_loops) = (weight_sum.to_string(), added_loops.to_string());
        let args = [
            dir.as_os_str(),
            OsStr::new(&weight_sum),
            OsStr::new(&added_loops),
            old.as_os_str(),
        ];
        let ranks = parts as usize;
        let Some(out) = common::mpirun(ranks, &binary, &args, &[], RUN_TIMEOUT) else {
            return;
        };
        assert_all_ranks_passed(&format!("mpirun -n {parts} edges_test"), &out, ranks);
    }
}

/// The message precision (`tests/c/precision_test.c`) at P = 2 on a weighted directed graph,
/// both schedules: bf16 and f16 forward, backward and per-edge products within the format's
/// bound of f32's, exactly half of f32's bytes, the getter, and the statuses of bad or
/// different precisions.
#[test]
fn c99_bf16_and_f16_messages_within_their_bound_at_half_the_bytes_at_p2() {
    let Some(binary) = compile(
        "cc",
        "-std=c99",
        &test_source("precision_test.c"),
        &common::scratch().join("precision_test"),
        false,
    ) else {
        return;
    };
    let dir = common::scratch().join("chunks/precision-2");
    common::write_chunks(&common::directed_graph(), 2, &dir);
    let Some(out) = common::mpirun(2, &binary, &[dir.as_os_str()], &[], RUN_TIMEOUT) else {
        return;
    };
    assert_all_ranks_passed("mpirun -n 2 precision_test", &out, 2);
}

#[test]
fn cxx11_host_initialised_mpi_adoption_and_threads() {
    let Some(binary) = compile(
        "mpicxx",
        "-std=c++11",
        &test_source("api_test.cpp"),
        &common::scratch().join("api_test_cpp"),
        false,
    ) else {
        return;
    };
    let f = fixtures();
    let Some(out) = common::mpirun(2, &binary, &[f.dir2.as_os_str()], &[], RUN_TIMEOUT) else {
        return;
    };
    assert_all_ranks_passed("mpirun -n 2 api_test_cpp", &out, 2);
}

#[test]
fn static_library_links_with_pkg_config_static() {
    let Some(binary) = compile(
        "cc",
        "-std=c99",
        &test_source("api_test.c"),
        &common::scratch().join("api_test_static"),
        true,
    ) else {
        return;
    };
    let out = common::run(Command::new(&binary).arg("nompi"), RUN_TIMEOUT);
    assert_all_ranks_passed("api_test_static nompi", &out, 1);
    let Some(readelf) = common::tool("readelf") else {
        return;
    };
    let dynamic = common::run(Command::new(readelf).arg("-d").arg(&binary), RUN_TIMEOUT);
    assert!(
        !String::from_utf8_lossy(&dynamic.stdout).contains("libdistspmm"),
        "the static build must not need libdistspmm.so"
    );
}

#[test]
fn shared_library_exports_only_dsp_symbols_and_has_a_soname() {
    let lib = common::prefix().join("lib/libdistspmm.so");
    let Some(nm) = common::tool("nm") else { return };
    let out = common::run(
        Command::new(nm).args(["-D", "--defined-only"]).arg(&lib),
        RUN_TIMEOUT,
    );
    common::assert_success("nm -D", &out);
    let symbols: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    assert!(
        symbols.len() >= 30,
        "only {} exported symbols",
        symbols.len()
    );
    let foreign: Vec<&String> = symbols.iter().filter(|s| !s.starts_with("dsp_")).collect();
    assert!(
        foreign.is_empty(),
        "symbols without the dsp_ prefix: {foreign:?}"
    );
    // Every function the header declares is exported.
    let header = std::fs::read_to_string(common::prefix().join("include/distspmm.h")).unwrap();
    for line in header
        .lines()
        .filter(|l| l.ends_with(");") && !l.starts_with(' ') && !l.starts_with("//"))
    {
        let name = line
            .split('(')
            .next()
            .and_then(|h| h.split_whitespace().last())
            .unwrap()
            .trim_start_matches('*');
        assert!(
            symbols.iter().any(|s| s == name),
            "{name} is declared but not exported"
        );
    }
    let Some(readelf) = common::tool("readelf") else {
        return;
    };
    let dynamic = common::run(Command::new(readelf).arg("-d").arg(&lib), RUN_TIMEOUT);
    let text = String::from_utf8_lossy(&dynamic.stdout);
    let soname = format!("[libdistspmm.so.{}]", env!("CARGO_PKG_VERSION_MAJOR"));
    assert!(text.contains(&soname), "SONAME {soname} missing:\n{text}");
}

#[test]
fn the_minimal_example_of_the_docs_compiles_and_runs() {
    let docs = std::fs::read_to_string(common::repo_root().join("docs/c-api.md")).unwrap();
    let start = docs.find("```c\n").expect("docs/c-api.md has a C example") + 5;
    let end = start + docs[start..].find("```").expect("the C example ends");
    let source = common::scratch().join("doc_example.c");
    std::fs::write(&source, &docs[start..end]).unwrap();
    let Some(binary) = compile(
        "cc",
        "-std=c99",
        &source,
        &common::scratch().join("doc_example"),
        false,
    ) else {
        return;
    };
    let f = fixtures();
    let Some(out) = common::mpirun(2, &binary, &[f.dir2.as_os_str()], &[], RUN_TIMEOUT) else {
        return;
    };
    common::assert_success("mpirun -n 2 doc_example", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sum of Ahat X = "), "{stdout}");
}

#[test]
fn copies_of_one_partition_of_other_features_fail_dsp_chunk_open_on_every_rank() {
    let docs = std::fs::read_to_string(common::repo_root().join("docs/c-api.md")).unwrap();
    let start = docs.find("```c\n").expect("docs/c-api.md has a C example") + 5;
    let end = start + docs[start..].find("```").expect("the C example ends");
    let source = common::scratch().join("doc_example_mpmd.c");
    std::fs::write(&source, &docs[start..end]).unwrap();
    let Some(binary) = compile(
        "cc",
        "-std=c99",
        &source,
        &common::scratch().join("doc_example_mpmd"),
        false,
    ) else {
        return;
    };
    let f = fixtures();
    // The fixture's graph with one feature changed: the same partition, other content (a
    // stale copy on one host).
    let mut graph = common::small_graph();
    let x = graph.features.as_mut().unwrap();
    x.data[0] += 1.0;
    let other = common::scratch().join("chunks/csbm-2-other-features");
    common::write_chunks(&graph, 2, &other);
    // MPMD: rank 0 opens the fixture, rank 1 the copy of other content.
    let args = [
        f.dir2.as_os_str(),
        OsStr::new(":"),
        OsStr::new("-n"),
        OsStr::new("1"),
        binary.as_os_str(),
        other.as_os_str(),
    ];
    let Some(out) = common::mpirun(1, &binary, &args, &[], RUN_TIMEOUT) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the ranks ran on different data: {stderr}"
    );
    assert_eq!(
        stderr
            .matches("the ranks opened chunk directories with different contents")
            .count(),
        2,
        "every rank refuses in dsp_chunk_open: {stderr}"
    );
}
