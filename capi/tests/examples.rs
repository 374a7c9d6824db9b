//! The examples, built and run: the C++ trainer (`examples/cpp`, CMake against the installed
//! config package) under `mpirun` — the GCN on Cora, and every model (GCN, GraphSAGE, GIN,
//! GAT) on a small generated graph — and the Python ctypes module (`examples/python`) checked
//! against SciPy under `mpirun` with mpi4py.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const BUILD_TIMEOUT: Duration = Duration::from_secs(300);
const TRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Cora partitioned into `parts` chunks (as `distspmm partition --parts P`), under scratch.
fn cora_chunks(cora: &Path, parts: u32) -> PathBuf {
    let dir = common::scratch().join(format!("cora-{parts}"));
    let graph = distspmm_prep::graph::load(cora).expect("read cora.npz");
    common::write_chunks(&graph, parts, &dir);
    dir
}

/// Configures and builds `examples/cpp` with `-DDISTSPMM_ROOT=<installed prefix>`, once per
/// test binary (the tests that run it share its build tree).
fn build_cpp_example() -> Option<PathBuf> {
    static TRAINER: OnceLock<Option<PathBuf>> = OnceLock::new();
    TRAINER.get_or_init(configure_and_build).clone()
}

fn configure_and_build() -> Option<PathBuf> {
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
    Some(build.join("distspmm_train"))
}

#[test]
fn cpp_trainer_links_only_libdistspmm_and_its_gcn_reaches_78_percent_on_cora() {
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
        common::assert_success(&format!("distspmm_train at P={parts}"), &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("P={parts}:\n{stdout}");
        let accuracy = common::test_accuracy(&stdout);
        assert!(
            accuracy >= 0.78,
            "P={parts}: test accuracy {accuracy} < 0.78:\n{stdout}"
        );
    }
}

/// The `loss=` values of the trainer's epoch lines, in order.
fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter(|l| l.starts_with("epoch"))
        .filter_map(|l| l.split("loss=").nth(1))
        .map(|v| {
            v.split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("unparsable loss in:\n{stdout}"))
        })
        .collect()
}

#[test]
fn cpp_trainer_lowers_the_loss_of_every_model_at_p2() {
    let Some(trainer) = build_cpp_example() else {
        return;
    };
    let chunks = common::scratch().join("small-2");
    common::write_chunks(&common::small_graph(), 2, &chunks);
    for model in ["gcn", "sage", "gin", "gat"] {
        let args = [
            OsStr::new("--chunks"),
            chunks.as_os_str(),
            OsStr::new("--model"),
            OsStr::new(model),
            OsStr::new("--epochs"),
            OsStr::new("15"),
            OsStr::new("--log-every"),
            OsStr::new("1"),
            OsStr::new("--dropout"),
            OsStr::new("0"),
        ];
        let Some(out) = common::mpirun(2, &trainer, &args, &[], TRAIN_TIMEOUT) else {
            return;
        };
        common::assert_success(&format!("distspmm_train --model {model} at P=2"), &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("{model}:\n{stdout}");
        let losses = losses(&stdout);
        assert_eq!(losses.len(), 15, "{model}: one loss per epoch:\n{stdout}");
        let (first, last) = (losses[0], losses[14]);
        assert!(
            last.is_finite() && last < 0.9 * first,
            "{model}: the loss went from {first} to {last}:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!("model={model} ranks=2")),
            "{model}: no final line:\n{stdout}"
        );
    }
}

/// A Python with numpy, SciPy and mpi4py: the repository's `.venv` (scripts/ensure-deps.sh
/// with `DISTSPMM_PY_EXTRAS=1`), else `python3`.
fn python() -> Option<PathBuf> {
    let venv = common::repo_root().join(".venv/bin/python");
    let python = if venv.is_file() {
        venv
    } else {
        common::tool("python3")?
    };
    let out = common::run(
        Command::new(&python).args(["-c", "import numpy, scipy, mpi4py"]),
        TRAIN_TIMEOUT,
    );
    common::require(
        out.status.success().then_some(python),
        "numpy, scipy or mpi4py is missing (DISTSPMM_PY_EXTRAS=1 scripts/ensure-deps.sh)",
    )
}

/// The small featured graph with its edges replaced by random directed ones, so that Ahat is
/// not symmetric and a transposition mistake in backward shows.
fn directed_featured_graph() -> distspmm_prep::graph::Graph {
    let mut graph = common::small_graph();
    let n = graph.num_nodes as u64;
    let mut state = 99u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % n) as u32
    };
    let (src, dst): (Vec<u32>, Vec<u32>) = (0..4 * n).map(|_| (next(), next())).unzip();
    graph.src = src;
    graph.dst = dst;
    graph
}

fn run_python_check(python: &Path, chunks: &Path, graph: &Path) {
    let script = common::repo_root().join("examples/python/check_spmm.py");
    let lib = common::prefix().join("lib/libdistspmm.so");
    let args: Vec<&OsStr> = vec![
        script.as_os_str(),
        OsStr::new("--chunks"),
        chunks.as_os_str(),
        OsStr::new("--graph"),
        graph.as_os_str(),
        OsStr::new("--lib"),
        lib.as_os_str(),
    ];
    let Some(out) = common::mpirun(2, python, &args, &[], TRAIN_TIMEOUT) else {
        return;
    };
    common::assert_success("mpirun -n 2 python check_spmm.py", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert_eq!(
        stdout.matches(": ok").count(),
        2,
        "every rank must report ok:\n{stdout}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("forward err="))
            .count(),
        4,
        "two ranks x two schedules:\n{stdout}"
    );
}

#[test]
fn python_ctypes_forward_and_backward_match_scipy() {
    let Some(python) = python() else { return };
    let dir = common::scratch().join("python-directed");
    std::fs::create_dir_all(&dir).unwrap();
    let npz = dir.join("graph.npz");
    let _ = std::fs::remove_file(&npz);
    distspmm_prep::graph::npz::write_npz(&npz, &directed_featured_graph()).expect("write .npz");
    let chunks = dir.join("chunks");
    common::write_chunks(&distspmm_prep::graph::load(&npz).unwrap(), 2, &chunks);
    run_python_check(&python, &chunks, &npz);
    if let Some(cora) = common::cora() {
        run_python_check(&python, &cora_chunks(&cora, 2), &cora);
    }
}
