//! `distspmm train` end to end under a real `mpirun`: Cora accuracy at P = 1, 2, 4 and in
//! tensor mode, agreement of the losses across P and schedules, run-to-run determinism,
//! checkpoint + resume, and clear failures on bad input.

mod launch;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use launch::{cora, mpirun_available, run as run_with_timeout, summary, BIN};

fn mpirun(ranks: usize, args: &[&str]) -> Output {
    mpirun_with(ranks, args, None)
}

/// As [`mpirun`]; with `max_count`, every rank runs under `DIST_COMM_MPI_MAX_COUNT`.
fn mpirun_with(ranks: usize, args: &[&str], max_count: Option<usize>) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "-n",
        &ranks.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
        "--mca",
        "btl",
        "self,vader",
    ])
    .args(max_count.map_or(&[][..], |_| &["-x", "DIST_COMM_MPI_MAX_COUNT"][..]))
    .arg(BIN)
    .args(args)
    .envs(max_count.map(|n| ("DIST_COMM_MPI_MAX_COUNT", n.to_string())))
    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    // Two cores shared by all ranks: one kernel thread per rank.
    .env("RAYON_NUM_THREADS", "1");
    run_with_timeout(cmd, Duration::from_secs(300))
}

fn partition(input: &Path, parts: usize, out: &Path) {
    let status = Command::new(BIN)
        .args(["partition", "--input"])
        .arg(input)
        .args(["--parts", &parts.to_string(), "--out"])
        .arg(out)
        .arg("--force")
        .stdout(Stdio::null())
        .status()
        .expect("run partition");
    assert!(status.success(), "partition failed");
}

#[derive(Debug, serde::Deserialize)]
struct Summary {
    epochs: u64,
    test_acc: f64,
    final_loss: f64,
    comm_bytes_per_epoch: u64,
    spmm_bytes_per_epoch: u64,
    allreduce_bytes_per_epoch: u64,
    spmm_forward_bytes_per_epoch: u64,
    spmm_backward_bytes_per_epoch: u64,
    comm_precision: String,
    parameters: u64,
    ranks: usize,
}

fn train_json(ranks: usize, args: &[&str]) -> Summary {
    train_json_with(ranks, args, None)
}

fn train_json_with(ranks: usize, args: &[&str], max_count: Option<usize>) -> Summary {
    let out = mpirun_with(ranks, &[&["train", "--json"], args].concat(), max_count);
    let line = summary(&out);
    serde_json::from_value(line.clone()).unwrap_or_else(|e| panic!("bad summary {line}: {e}"))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn cora_reaches_the_gcn_papers_accuracy_on_1_2_and_4_ranks_with_the_same_loss() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut losses = Vec::new();
    for p in [1, 2, 4] {
        let chunks = dir.path().join(format!("p{p}"));
        partition(&cora, p, &chunks);
        let s = train_json(p, &["--chunks", chunks.to_str().unwrap()]);
        assert_eq!(s.epochs, 200);
        assert!(
            s.test_acc >= 0.80,
            "P={p}: test accuracy {} below 80%",
            s.test_acc
        );
        if p > 1 {
            assert!(s.comm_bytes_per_epoch > 0, "P={p} moved no bytes");
        }
        losses.push(s.final_loss);
    }
    for (p, l) in [2, 4].iter().zip(&losses[1..]) {
        assert!(
            close(*l, losses[0], 1e-3),
            "P={p} final loss {l} vs P=1 {}",
            losses[0]
        );
    }
}

/// Training's bytes, from the `Counting` layers: the SpMM's exchanges and the allreduces apart,
/// both 0 on one rank; in data mode an epoch's allreduces are the gradient (`parameters` f32),
/// the training step's 7 f64 loss/accuracy counts and the evaluation's 7 + 9 · classes f64
/// counts (accuracy and per-class F1 counts; Cora has 7 classes), received by every rank.
#[test]
fn allreduce_bytes_are_counted_apart_from_the_spmm_exchange() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for p in [1usize, 2] {
        let chunks = dir.path().join(format!("p{p}"));
        partition(&cora, p, &chunks);
        let s = train_json(p, &["--chunks", chunks.to_str().unwrap(), "--epochs", "3"]);
        assert_eq!(s.ranks, p);
        assert_eq!(
            s.comm_bytes_per_epoch,
            s.spmm_bytes_per_epoch + s.allreduce_bytes_per_epoch,
            "P={p}: {s:?}"
        );
        if p == 1 {
            assert_eq!(s.comm_bytes_per_epoch, 0, "one rank moves nothing: {s:?}");
            continue;
        }
        let per_rank = 4 * s.parameters + (7 + 7 + 9 * 7) * 8;
        assert_eq!(
            s.allreduce_bytes_per_epoch,
            p as u64 * per_rank,
            "P={p}: {s:?}"
        );
        assert!(s.spmm_bytes_per_epoch > 0, "P={p}: {s:?}");
    }
}

/// `--comm-precision`: the SpMM's bytes, counted by the operators per direction where they
/// hand them to the transport, add up to what the transport's `Counting` layer saw, and bf16
/// and f16 move exactly half of f32's bytes (the same rows, 2 bytes a value) while the
/// reductions are unchanged; the loss stays within 1 % of f32's.
#[test]
fn reduced_precision_messages_halve_the_spmm_bytes_of_training() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("p2");
    partition(&cora, 2, &chunks);
    let run = |precision: &str| {
        train_json(
            2,
            &[
                "--chunks",
                chunks.to_str().unwrap(),
                "--epochs",
                "20",
                "--comm-precision",
                precision,
            ],
        )
    };
    let f32 = run("f32");
    assert_eq!(f32.comm_precision, "f32");
    for s in [&f32, &run("bf16"), &run("f16")] {
        assert_eq!(
            s.spmm_forward_bytes_per_epoch + s.spmm_backward_bytes_per_epoch,
            s.spmm_bytes_per_epoch,
            "{s:?}"
        );
        assert!(s.spmm_backward_bytes_per_epoch > 0, "{s:?}");
        if s.comm_precision != "f32" {
            assert_eq!(
                2 * s.spmm_bytes_per_epoch,
                f32.spmm_bytes_per_epoch,
                "{s:?}"
            );
            assert_eq!(s.allreduce_bytes_per_epoch, f32.allreduce_bytes_per_epoch);
            assert!(
                close(s.final_loss, f32.final_loss, 0.01),
                "{s:?} vs {f32:?}"
            );
        }
    }
}

/// Training with every MPI message longer than 64 elements sent as a large message (derived
/// datatypes, all-reduces in pieces; in production the limit is `i32::MAX`) gives the losses of
/// the ordinary path, on both schedules, at P = 3. Equal to rounding, not bit for bit: OpenMPI
/// picks its all-reduce algorithm by message size, so a 64-element piece is summed across the
/// ranks in another order than the whole gradient (measured: 1.920278743 vs 1.920278740).
#[test]
fn large_message_paths_train_to_the_same_loss() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 3, &chunks);
    let c = chunks.to_str().unwrap();
    for schedule in ["halo", "broadcast"] {
        let args = ["--chunks", c, "--epochs", "5", "--schedule", schedule];
        let plain = train_json(3, &args);
        let split = train_json_with(3, &args, Some(64));
        assert!(
            close(split.final_loss, plain.final_loss, 1e-6),
            "{schedule}: {} with 64-element MPI calls, {} without",
            split.final_loss,
            plain.final_loss
        );
        assert_eq!(split.test_acc.to_bits(), plain.test_acc.to_bits());
        assert_eq!(split.spmm_bytes_per_epoch, plain.spmm_bytes_per_epoch);
        assert_eq!(
            split.allreduce_bytes_per_epoch,
            plain.allreduce_bytes_per_epoch
        );
    }
}

#[test]
fn same_seed_same_losses_and_both_schedules_agree() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 2, &chunks);
    let c = chunks.to_str().unwrap();
    let a = train_json(2, &["--chunks", c, "--epochs", "30"]);
    let b = train_json(2, &["--chunks", c, "--epochs", "30"]);
    assert_eq!(
        a.final_loss.to_bits(),
        b.final_loss.to_bits(),
        "two runs with one seed differ"
    );
    let bcast = train_json(
        2,
        &["--chunks", c, "--epochs", "30", "--schedule", "broadcast"],
    );
    assert!(
        close(bcast.final_loss, a.final_loss, 1e-4),
        "broadcast {} vs halo {}",
        bcast.final_loss,
        a.final_loss
    );
    assert!(
        bcast.spmm_bytes_per_epoch > a.spmm_bytes_per_epoch,
        "broadcast should move more bytes than halo"
    );
    assert_eq!(
        bcast.allreduce_bytes_per_epoch, a.allreduce_bytes_per_epoch,
        "the schedule changes the training's allreduces"
    );
    let other = train_json(2, &["--chunks", c, "--epochs", "30", "--seed", "7"]);
    assert_ne!(
        other.final_loss.to_bits(),
        a.final_loss.to_bits(),
        "the seed changes nothing"
    );
}

/// `--isolated-kernels`: the last epoch's SpMM and GEMM calls timed apart, summed, and set
/// beside the median epoch; at P = 2 the SpMM replays are collective and must not hang.
#[test]
fn isolated_kernels_report_the_epochs_calls_and_their_sum() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for p in [1usize, 2] {
        let chunks = dir.path().join(format!("p{p}"));
        partition(&cora, p, &chunks);
        let args = [
            "train",
            "--json",
            "--chunks",
            chunks.to_str().unwrap(),
            "--epochs",
            "3",
            "--isolated-kernels",
            "--kernel-reps",
            "2",
        ];
        let s = summary(&mpirun(p, &args));
        let k = &s["isolated"];
        assert_eq!(k["reps"], 2, "P={p}: {s}");
        let calls = k["calls"].as_array().unwrap_or_else(|| panic!("{s}"));
        let count = |kernel: &str| {
            calls
                .iter()
                .filter(|c| c["kernel"] == kernel)
                .map(|c| c["count"].as_u64().unwrap())
                .sum::<u64>()
        };
        // Cora (1433 features > hidden 16 > 7 classes): both layers transform first, so the
        // training step aggregates forward at widths 16 and 7 and backward at 7 and 16, and
        // the evaluation forward at 16 and 7.
        assert_eq!(count("spmm"), 6, "P={p}: {s}");
        // Forward X·W0, H·W1 (twice: training and evaluation), backward dW1, dH, dW0.
        assert_eq!(count("gemm"), 7, "P={p}: {s}");
        let f = |key: &str| {
            k[key]
                .as_f64()
                .unwrap_or_else(|| panic!("P={p}: no {key}: {s}"))
        };
        assert!(f("spmm_seconds") > 0.0 && f("gemm_seconds") > 0.0, "{s}");
        assert!(
            (f("spmm_seconds") + f("gemm_seconds") - f("sum_seconds")).abs() < 1e-9,
            "{s}"
        );
        let epoch = s["epoch_seconds_median"].as_f64().unwrap();
        assert!(
            (f("epoch_over_sum") - epoch / f("sum_seconds")).abs() < 1e-6 * f("epoch_over_sum"),
            "{s}"
        );
        assert!(
            calls
                .iter()
                .all(|c| c["seconds"].as_f64().unwrap() > 0.0 && c["what"].is_string()),
            "{s}"
        );
    }
    let out = mpirun(
        1,
        &[
            "train",
            "--mode",
            "tensor",
            "--input",
            cora.to_str().unwrap(),
            "--isolated-kernels",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--isolated-kernels times the data-parallel"),
        "{stderr}"
    );
}

#[test]
fn tensor_parallel_mode_reaches_the_same_accuracy() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let s = train_json(2, &["--mode", "tensor", "--input", cora.to_str().unwrap()]);
    assert!(
        s.test_acc >= 0.80,
        "tensor mode test accuracy {}",
        s.test_acc
    );
}

/// `(epoch, val accuracy, test accuracy)` of each epoch line (as printed, 4 decimals).
fn epoch_lines(stderr: &str) -> Vec<(u64, String, String)> {
    stderr
        .lines()
        .filter(|l| l.starts_with("epoch "))
        .map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let after = |key: &str| {
                let at = t.iter().position(|w| *w == key).expect(key);
                t[at + 1].to_string()
            };
            (after("epoch").parse().unwrap(), after("val"), after("test"))
        })
        .collect()
}

/// Early stopping at P = 2: the run ends `patience` epochs after its best, before --epochs,
/// and the summary's numbers are the best epoch's (its weights restored and evaluated again
/// without dropout): its validation accuracy is the best of the epoch lines', its test accuracy
/// that epoch's. The checkpoint holds the last epoch trained, and resumes from there.
#[test]
fn patience_stops_early_and_restores_the_best_epochs_weights() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 2, &chunks);
    let (c, ck) = (chunks.to_str().unwrap(), dir.path().join("ck"));
    let ck = ck.to_str().unwrap();
    let args = [
        "train",
        "--json",
        "--chunks",
        c,
        "--epochs",
        "200",
        "--patience",
        "5",
        "--checkpoint",
        ck,
    ];
    let out = mpirun(2, &args);
    let s = summary(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let epochs = s["epochs"].as_u64().unwrap();
    let best = s["best_epoch"].as_u64().unwrap();
    assert_eq!(s["stopped_early"], true, "{s}");
    assert!(epochs < 200 && best + 5 == epochs, "{s}");
    assert_eq!(
        (s["metric"].as_str(), s["patience"].as_u64()),
        (Some("acc"), Some(5))
    );
    assert!(
        stderr.contains(&format!("stopping early after epoch {epochs}")),
        "{stderr}"
    );
    let lines = epoch_lines(&stderr);
    assert_eq!(lines.len() as u64, epochs, "{stderr}");
    let four = |key: &str| format!("{:.4}", s[key].as_f64().unwrap());
    let best_line = &lines[usize::try_from(best).unwrap() - 1];
    assert_eq!(best_line.0, best);
    assert_eq!(s["best_val"], s["val_acc"], "{s}");
    assert_eq!(best_line.1, four("val_acc"), "{s}");
    assert_eq!(best_line.2, four("test_acc"), "{s}");
    let max = lines.iter().map(|l| l.1.as_str()).max().unwrap();
    assert_eq!(max, four("best_val"));
    // Well above chance (1 in 7) though stopped early.
    assert!(s["test_acc"].as_f64().unwrap() >= 0.6, "{s}");
    let f1 = s["test_f1"].as_f64().unwrap();
    assert!(f1 > 0.4 && f1 <= 1.0, "{s}");
    // The checkpoint is the last epoch's: a resume continues after it.
    let more = (epochs + 2).to_string();
    let resumed = mpirun(
        2,
        &[
            "train",
            "--chunks",
            c,
            "--epochs",
            &more,
            "--checkpoint",
            ck,
            "--resume",
        ],
    );
    let text = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{text}");
    assert!(text.contains(&format!("after epoch {epochs}")), "{text}");
}

#[test]
fn resume_continues_to_the_same_final_numbers() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 2, &chunks);
    let c = chunks.to_str().unwrap();
    let straight = train_json(2, &["--chunks", c, "--epochs", "40"]);
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    let first = train_json(
        2,
        &[
            "--chunks",
            c,
            "--epochs",
            "20",
            "--checkpoint",
            ck,
            "--checkpoint-every",
            "5",
        ],
    );
    assert_eq!(first.epochs, 20);
    let resumed = train_json(
        2,
        &[
            "--chunks",
            c,
            "--epochs",
            "40",
            "--checkpoint",
            ck,
            "--resume",
        ],
    );
    assert_eq!(
        resumed.final_loss.to_bits(),
        straight.final_loss.to_bits(),
        "resumed run differs"
    );
    assert_eq!(resumed.test_acc, straight.test_acc);
    // A checkpoint of another model is refused.
    let out = mpirun(
        2,
        &[
            "train",
            "--chunks",
            c,
            "--epochs",
            "50",
            "--hidden",
            "8",
            "--checkpoint",
            ck,
            "--resume",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another run"));
}

#[test]
fn wrong_rank_count_fails_fast_on_every_rank() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c3");
    partition(&cora, 3, &chunks);
    let t = Instant::now();
    let out = mpirun(2, &["train", "--chunks", chunks.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Both ranks print the same message (their lines may interleave on the shared stderr).
    let message = "the chunks were made for 3 parts but 2 ranks were started: run 3 ranks (`mpirun -n 3`) or re-partition with `distspmm partition --parts 2`";
    assert_eq!(
        stderr.matches(message).count(),
        2,
        "the same message from each rank expected: {stderr}"
    );
    assert!(!stderr.contains("panicked"));
}

#[test]
fn a_graph_without_training_nodes_is_refused_with_a_reason() {
    if !mpirun_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A topology-only graph: no features, labels or masks.
    let g = dir.path().join("rmat.npz");
    let st = Command::new(BIN)
        .args([
            "generate",
            "rmat",
            "--scale",
            "8",
            "--edge-factor",
            "4",
            "--seed",
            "1",
            "--out",
        ])
        .arg(&g)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let chunks = dir.path().join("c");
    partition(&g, 2, &chunks);
    let out = mpirun(
        2,
        &[
            "train",
            "--chunks",
            chunks.to_str().unwrap(),
            "--epochs",
            "2",
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("carries no features"), "{stderr}");
    assert!(!stderr.contains("panicked"));
}

#[test]
fn a_corrupted_chunk_is_reported_by_every_rank() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 2, &chunks);
    let victim = std::fs::read_dir(&chunks)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "chunk"))
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();
    let out = mpirun(
        2,
        &[
            "train",
            "--chunks",
            chunks.to_str().unwrap(),
            "--epochs",
            "2",
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = victim.file_name().unwrap().to_str().unwrap();
    assert_eq!(stderr.matches(name).count() % 2, 0, "{stderr}");
    assert!(
        stderr.matches(name).count() >= 2,
        "every rank names the corrupted file: {stderr}"
    );
    assert!(!stderr.contains("panicked"));
}
