//! The examples, built and run: the C++ GCN trainer (`examples/cpp`, CMake against the
//! installed config package) on Cora under `mpirun`, and the Python ctypes module
//! (`examples/python`) checked against SciPy under `mpirun` with mpi4py.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const BUILD_TIMEOUT: Duration = Duration::from_secs(300);
const TRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Cora partitioned into `parts` chunks (as `distspmm partition --parts P`), under scratch.
fn cora_chunks(cora: &Path, parts: u32) -> PathBuf {
    let dir = common::scratch().join(format!("cora-{parts}"));
    let graph = distspmm_core::graph::load(cora).expect("read cora.npz");
    common::write_chunks(&graph, parts, &dir);
    dir
}

/// Configures and builds `examples/cpp` with `-DDISTSPMM_ROOT=<installed prefix>`.
fn build_cpp_example() -> Option<PathBuf> {
    let cmake = common::tool("cmake")?;
    let build = common::scratch().join("cpp-build");
    let source = common::repo_root().join("examples/cpp");
    let out = common::run(
        Command::new(&cmake)
            .arg("-S")
            .arg(&source)
            .arg("-B")
            .arg(&build)
            .arg(format!("-DDISTSPMM_ROOT={}", common::prefix().display()))
            .args(["-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS=-Werror"]),
        BUILD_TIMEOUT,
    );
    common::assert_success("cmake configure examples/cpp", &out);
    let out = common::run(
        Command::new(&cmake).arg("--build").arg(&build),
        BUILD_TIMEOUT,
    );
    common::assert_success("cmake --build examples/cpp", &out);
    Some(build.join("distspmm_gcn"))
}

/// The value of the last `test_acc=` on stdout.
fn test_accuracy(stdout: &str) -> f64 {
    let value = stdout
        .lines()
        .filter_map(|l| l.split("test_acc=").nth(1))
        .last()
        .unwrap_or_else(|| panic!("no test_acc= line in:\n{stdout}"));
    value
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable test_acc in:\n{stdout}"))
}

#[test]
fn cpp_gcn_trainer_links_only_libdistspmm_and_reaches_78_percent_on_cora() {
    let Some(cora) = common::cora() else { return };
    let Some(trainer) = build_cpp_example() else {
        return;
    };
    if let Some(readelf) = common::tool("readelf") {
        let out = common::run(Command::new(readelf).arg("-d").arg(&trainer), BUILD_TIMEOUT);
        let needed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .map(str::to_owned)
            .collect();
        assert!(
            needed.iter().any(|l| l.contains("libdistspmm.so.0")),
            "{needed:?}"
        );
        assert!(
            !needed.iter().any(|l| l.contains("libmpi")),
            "the trainer must link only libdistspmm: {needed:?}"
        );
    }
    for parts in [2u32, 1] {
        let chunks = cora_chunks(&cora, parts);
        let Some(out) = common::mpirun(
            parts as usize,
            &trainer,
            &[OsStr::new("--chunks"), chunks.as_os_str()],
            &[],
            TRAIN_TIMEOUT,
        ) else {
            return;
        };
        common::assert_success(&format!("distspmm_gcn at P={parts}"), &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("P={parts}:\n{stdout}");
        let accuracy = test_accuracy(&stdout);
        assert!(
            accuracy >= 0.78,
            "P={parts}: test accuracy {accuracy} < 0.78:\n{stdout}"
        );
    }
}
