//! The PyTorch / PyG integration (`python/distspmm/torch.py`, `examples/torch`), run under
//! `mpirun`: `python/tests/check_torch.py` (the autograd Function against `torch.sparse.mm`,
//! gradcheck, the model gradient against finite differences, `DistGCNConv` against PyG's
//! `GCNConv`, the loader, the device operator's refusal) at P = 1 and 2, 20 training epochs at
//! P = 2 against single-process PyG on Cora, and PyG's GCN example at P = 2 on Cora (200
//! epochs, at least 80% test accuracy). The layers over the per-edge calls:
//! `python/tests/check_torch_layers.py` (`DistSAGEConv`, `DistGINConv`, `DistGATConv` against
//! PyG's layers, gradcheck, state_dicts both ways) at P = 1 and 2 on an unweighted directed
//! graph and at P = 2 on Cora, and PyG's GAT example at P = 2 on Cora. The message precision:
//! `check_torch.py precision` (bf16 and f16 through `DistSpmm` against f32) at P = 2.
//!
//! Needs the repository's `.venv` with torch, torch_geometric, numpy and mpi4py
//! (scripts/ensure-deps.sh with `DISTSPMM_PY_EXTRAS=1`); skips with a message without it,
//! except under `CI=true`, where a torch that does not import fails the tests.

mod common;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `import torch, torch_geometric` (seconds; more on a cold page cache).
const IMPORT_TIMEOUT: Duration = Duration::from_secs(300);
/// One launch.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// The library just built; one torch thread per rank (two ranks share two cores).
fn torch_env() -> Vec<(&'static str, OsString)> {
    vec![
        (
            "DISTSPMM_LIB",
            common::prefix().join("lib/libdistspmm.so").into(),
        ),
        ("OMP_NUM_THREADS", "1".into()),
    ]
}

fn torch_python() -> Option<PathBuf> {
    let env = torch_env(); // builds the library first, outside the timing
    common::venv_python(
        "torch, torch_geometric, numpy, mpi4py",
        &env,
        IMPORT_TIMEOUT,
    )
}

fn mpirun(ranks: usize, python: &Path, args: &[OsString]) -> Option<std::process::Output> {
    let env = torch_env();
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    common::mpirun(ranks, python, &args, &env, RUN_TIMEOUT)
}

#[test]
fn torch_function_and_dist_gcn_conv_match_torch_sparse_and_pyg() {
    let Some(python) = torch_python() else {
        return;
    };
    let script = common::repo_root().join("python/tests/check_torch.py");
    common::check_on_directed_graph(
        "torch-directed",
        &python,
        &[script.into_os_string(), "ops".into()],
        &torch_env(),
        RUN_TIMEOUT,
    );
}

/// `Spmm(..., comm_precision="bf16" | "f16")` through `DistSpmm` at P = 2 on the weighted
/// directed graph: within the format's bound of f32, exactly half the bytes.
#[test]
fn torch_bf16_and_f16_messages_halve_the_bytes_within_the_bound_at_two_ranks() {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = common::scratch().join("torch-precision");
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    let npz = dir.join("graph.npz");
    let _ = std::fs::remove_file(&npz);
    distspmm_prep::graph::npz::write_npz(&npz, &common::directed_graph()).expect("write .npz");
    let graph = distspmm_prep::graph::load(&npz).expect("read .npz");
    let chunks = dir.join("chunks-2");
    common::write_chunks(&graph, 2, &chunks);
    let args = vec![
        common::repo_root()
            .join("python/tests/check_torch.py")
            .into_os_string(),
        "precision".into(),
        "--chunks".into(),
        chunks.into_os_string(),
        "--graph".into(),
        npz.into_os_string(),
    ];
    let Some(out) = mpirun(2, &python, &args) else {
        return;
    };
    common::assert_every_rank_ok("mpirun -n 2 check_torch.py precision", &out, 2);
}

#[test]
fn torch_two_ranks_follow_single_process_pyg_for_20_epochs_on_cora() {
    let Some(cora) = common::cora() else { return };
    let Some(python) = torch_python() else {
        return;
    };
    let graph = distspmm_prep::graph::load(&cora).expect("read cora.npz");
    let chunks = common::scratch().join("torch-cora-2");
    common::write_chunks(&graph, 2, &chunks);
    let args = vec![
        common::repo_root()
            .join("python/tests/check_torch.py")
            .into_os_string(),
        "train".into(),
        "--chunks".into(),
        chunks.into_os_string(),
        "--graph".into(),
        cora.into_os_string(),
        "--epochs".into(),
        "20".into(),
    ];
    let Some(out) = mpirun(2, &python, &args) else {
        return;
    };
    common::assert_every_rank_ok("mpirun -n 2 check_torch.py train", &out, 2);
}

#[test]
fn torch_pyg_gcn_example_reaches_80_percent_on_cora_at_two_ranks() {
    let Some(cora) = common::cora() else { return };
    let Some(python) = torch_python() else {
        return;
    };
    let graph = distspmm_prep::graph::load(&cora).expect("read cora.npz");
    let chunks = common::scratch().join("torch-cora-example-2");
    common::write_chunks(&graph, 2, &chunks);
    // PyG's defaults: 200 epochs, hidden 16, dropout 0.5, Adam lr 0.01, weight decay 5e-4.
    let args = vec![
        common::repo_root()
            .join("examples/torch/gcn.py")
            .into_os_string(),
        "--chunks".into(),
        chunks.into_os_string(),
    ];
    let Some(out) = mpirun(2, &python, &args) else {
        return;
    };
    common::assert_success("mpirun -n 2 examples/torch/gcn.py", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("test_acc=")),
        "the last line must be test_acc=<value>:\n{stdout}"
    );
    let accuracy = common::test_accuracy(&stdout);
    assert!(
        accuracy >= 0.80,
        "test accuracy {accuracy} < 0.80 after 200 epochs:\n{stdout}"
    );
}

/// [`common::directed_graph`] without weights (PyG's SAGEConv, GINConv and GATConv ignore
/// them) and with a self loop on every seventh node (kept by SAGE and GIN, replaced by GATConv's
/// own): the graph of the layer checks. No duplicate edges (GATConv would count each).
fn layers_graph() -> distspmm_prep::graph::Graph {
    let mut graph = common::directed_graph();
    graph.weights = None;
    let n = u32::try_from(graph.num_nodes).expect("a small graph");
    let mut edges: Vec<(u32, u32)> = graph
        .src
        .iter()
        .copied()
        .zip(graph.dst.iter().copied())
        .chain((0..n).step_by(7).map(|v| (v, v)))
        .collect();
    edges.sort_unstable();
    edges.dedup();
    (graph.src, graph.dst) = edges.into_iter().unzip();
    graph
}

/// `check_torch_layers.py` on `graph`'s chunks for each of `parts` under `mpirun`.
fn check_layers(name: &str, graph: &distspmm_prep::graph::Graph, npz: &Path, parts: &[u32]) {
    let Some(python) = torch_python() else {
        return;
    };
    let script = common::repo_root().join("python/tests/check_torch_layers.py");
    for &p in parts {
        let chunks = common::scratch().join(format!("{name}-{p}"));
        common::write_chunks(graph, p, &chunks);
        let args = vec![
            script.clone().into_os_string(),
            "--chunks".into(),
            chunks.into_os_string(),
            "--graph".into(),
            npz.as_os_str().to_owned(),
        ];
        let Some(out) = mpirun(p as usize, &python, &args) else {
            return;
        };
        common::assert_every_rank_ok(
            &format!("mpirun -n {p} check_torch_layers.py ({name})"),
            &out,
            p as usize,
        );
    }
}

#[test]
fn torch_sage_gin_gat_match_pyg_at_one_and_two_ranks() {
    let dir = common::scratch().join("torch-layers");
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    let npz = dir.join("graph.npz");
    let _ = std::fs::remove_file(&npz);
    distspmm_prep::graph::npz::write_npz(&npz, &layers_graph()).expect("write .npz");
    let graph = distspmm_prep::graph::load(&npz).expect("read .npz");
    check_layers("torch-layers", &graph, &npz, &[1, 2]);
}

#[test]
fn torch_layers_match_pyg_on_cora_at_two_ranks() {
    let Some(cora) = common::cora() else { return };
    let graph = distspmm_prep::graph::load(&cora).expect("read cora.npz");
    check_layers("torch-layers-cora", &graph, &cora, &[2]);
}

#[test]
fn torch_pyg_gat_example_reaches_79_percent_on_cora_at_two_ranks() {
    let Some(cora) = common::cora() else { return };
    let Some(python) = torch_python() else {
        return;
    };
    let graph = distspmm_prep::graph::load(&cora).expect("read cora.npz");
    let chunks = common::scratch().join("torch-cora-gat-2");
    common::write_chunks(&graph, 2, &chunks);
    // PyG's (and the GAT paper's) Cora configuration: 8 heads x 8 hidden, 200 epochs.
    let args = vec![
        common::repo_root()
            .join("examples/torch/gat.py")
            .into_os_string(),
        "--chunks".into(),
        chunks.into_os_string(),
    ];
    let Some(out) = mpirun(2, &python, &args) else {
        return;
    };
    common::assert_success("mpirun -n 2 examples/torch/gat.py", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    let accuracy = common::test_accuracy(&stdout);
    assert!(
        accuracy >= 0.79,
        "test accuracy {accuracy} < 0.79 after 200 epochs:\n{stdout}"
    );
}
