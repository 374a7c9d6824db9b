//! The Jittor integration (`python/distspmm`, `examples/jittor`), run under `mpirun`: the
//! operator against SciPy and finite differences at P = 1 and 2, `DistGATConv` against a dense
//! NumPy reference (outputs and gradients) at P = 1 and 2, and the distributed GCN example
//! on Cora (the loss falls, P = 2 follows the single-rank loss trajectory, and 200 epochs at
//! P = 2 reach 78% test accuracy).
//!
//! Needs the repository's `.venv` with jittor, numpy, scipy and mpi4py (scripts/ensure-deps.sh
//! with `DISTSPMM_PY_EXTRAS=1`); skips with a message without it, except under `CI=true`.
//! Jittor compiles its core on the first import (minutes; cached in `~/.cache/jittor`) and its
//! kernels on first use; `use_mkl=0` keeps it from downloading oneDNN.

mod common;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The first import compiles Jittor's core (about 15 minutes on two busy cores).
const IMPORT_TIMEOUT: Duration = Duration::from_secs(2400);
/// One launch; the first ones also compile Jittor's kernels for these shapes.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);

/// The venv's Python with Jittor importable (the import is timed: it is the CI cost of Jittor).
fn jittor_python() -> Option<PathBuf> {
    let env = jittor_env(); // builds the library first, outside the timing
    common::venv_python("jittor, numpy, scipy, mpi4py", &env, IMPORT_TIMEOUT)
}

/// Jittor without oneDNN (no download) and without its info logs; the library just built.
fn jittor_env() -> Vec<(&'static str, OsString)> {
    vec![
        ("use_mkl", "0".into()),
        ("log_silent", "1".into()),
        (
            "DISTSPMM_LIB",
            common::prefix().join("lib/libdistspmm.so").into(),
        ),
    ]
}

fn mpirun(ranks: usize, python: &Path, args: &[&OsStr]) -> Option<std::process::Output> {
    let env = jittor_env();
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    common::mpirun(ranks, python, args, &env, RUN_TIMEOUT)
}

fn check_script() -> PathBuf {
    common::repo_root().join("python/tests/check_jittor_op.py")
}

#[test]
fn jittor_operator_matches_scipy_and_finite_differences() {
    let Some(python) = jittor_python() else {
        return;
    };
    // Without mpirun Jittor leaves MPI alone and the library's communicator starts it.
    common::check_on_directed_graph(
        "jittor-directed",
        &python,
        &[check_script().into_os_string()],
        &jittor_env(),
        RUN_TIMEOUT,
    );
}

#[test]
fn jittor_gat_layer_matches_a_dense_reference() {
    let Some(python) = jittor_python() else {
        return;
    };
    let script = common::repo_root().join("python/tests/check_jittor_gat.py");
    common::check_on_directed_graph(
        "jittor-gat-directed",
        &python,
        &[script.into_os_string()],
        &jittor_env(),
        RUN_TIMEOUT,
    );
}

/// The `loss=` of every `epoch=` line rank 0 printed.
fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter(|l| l.starts_with("epoch="))
        .map(|l| {
            l.split_whitespace()
                .find_map(|field| field.strip_prefix("loss="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no loss= in {l:?}"))
        })
        .collect()
}

#[test]
fn jittor_dist_gcn_loss_falls_on_cora_and_follows_the_single_rank_run() {
    let Some(cora) = common::cora() else { return };
    let Some(python) = jittor_python() else {
        return;
    };
    let graph = distspmm_prep::graph::load(&cora).expect("read cora.npz");
    let example = common::repo_root().join("examples/jittor/dist_gcn.py");
    let epochs = 8;
    let mut runs = Vec::new();
    for parts in [2usize, 1] {
        let chunks = common::scratch().join(format!("jittor-cora-{parts}"));
        common::write_chunks(&graph, u32::try_from(parts).unwrap(), &chunks);
        // Dropout off: the runs are then the same computation split differently.
        let args = [
            example.clone().into_os_string(),
            "--chunks".into(),
            chunks.into_os_string(),
            "--epochs".into(),
            epochs.to_string().into(),
            "--dropout".into(),
            "0".into(),
            "--log-every".into(),
            "1".into(),
        ];
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let Some(out) = mpirun(parts, &python, &args) else {
            return;
        };
        common::assert_success(&format!("mpirun -n {parts} dist_gcn.py"), &out);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("P={parts}:\n{stdout}");
        assert!(
            stdout
                .lines()
                .last()
                .is_some_and(|l| l.contains("test_acc=")),
            "the last line must carry test_acc=:\n{stdout}"
        );
        let losses = losses(&stdout);
        assert_eq!(losses.len(), epochs, "one loss per epoch:\n{stdout}");
        assert!(
            losses.windows(2).all(|w| w[1] < w[0]),
            "P={parts}: the training loss must fall every epoch: {losses:?}"
        );
        runs.push(losses);
    }
    // The loss scaling makes Jittor's gradient averaging over 2 ranks the gradient of the
    // global mean loss: the trajectories agree to float32 rounding.
    for (epoch, (two, one)) in runs[0].iter().zip(&runs[1]).enumerate() {
        assert!(
            (two - one).abs() <= 1e-4 * one.abs(),
            "epoch {}: loss {two} at P=2 but {one} at P=1",
            epoch + 1
        );
    }
}

#[test]
fn jittor_dist_gcn_reaches_78_percent_on_cora_at_two_ranks() {
    let Some(cora) = common::cora() else { return };
    let Some(python) = jittor_python() else {
        return;
    };
    let graph = distspmm_prep::graph::load(&cora).expect("read cora.npz");
    let chunks = common::scratch().join("jittor-cora-accuracy-2");
    common::write_chunks(&graph, 2, &chunks);
    // The defaults: 200 epochs, hidden 16, dropout 0.5, Adam lr 0.01, weight decay 5e-4.
    let args = [
        common::repo_root()
            .join("examples/jittor/dist_gcn.py")
            .into_os_string(),
        "--chunks".into(),
        chunks.into_os_string(),
        "--log-every".into(),
        "50".into(),
    ];
    let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    let Some(out) = mpirun(2, &python, &args) else {
        return;
    };
    common::assert_success("mpirun -n 2 dist_gcn.py", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    let accuracy = common::test_accuracy(&stdout);
    assert!(
        accuracy >= 0.78,
        "test accuracy {accuracy} < 0.78 after 200 epochs:\n{stdout}"
    );
}
