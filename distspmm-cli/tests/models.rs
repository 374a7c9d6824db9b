//! `distspmm train --model sage|gin|gat` end to end under a real `mpirun`: each model reaches
//! its PyG reference accuracy on Cora at P = 1, 2 and 4 with the same losses, a checkpoint of
//! one model is refused by another, and tensor-parallel training (columns split across
//! ranks) gives every model the data-parallel losses.

mod launch;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use launch::{cora, mpirun_available, run, summary, BIN};

fn mpirun(ranks: usize, args: &[&str]) -> Output {
    let mut cmd = launch::mpirun(ranks);
    cmd.arg(BIN).args(args);
    run(cmd, Duration::from_secs(600))
}

fn partition(input: &Path, parts: usize, out: &Path) {
    launch::partition(input, parts, out, &[]);
}

#[derive(Debug, serde::Deserialize)]
struct Config {
    model: String,
    hidden: usize,
    heads: usize,
    dropout: f32,
    attn_dropout: f32,
    lr: f32,
}

#[derive(Debug, serde::Deserialize)]
struct Summary {
    test_acc: f64,
    final_loss: f64,
    parameters: u64,
    config: Config,
}

fn train(ranks: usize, args: &[&str]) -> Summary {
    let out = mpirun(ranks, &[&["train", "--json"], args].concat());
    let line = summary(&out);
    serde_json::from_value(line.clone()).unwrap_or_else(|e| panic!("bad summary {line}: {e}"))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn every_model_trains_cora_to_its_reference_accuracy_with_the_same_losses_on_1_2_and_4_ranks() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks: Vec<_> = [1, 2, 4]
        .iter()
        .map(|&p| {
            let path = dir.path().join(format!("p{p}"));
            partition(&cora, p, &path);
            (p, path)
        })
        .collect();
    // PyG 2.8's test accuracies over three seeds with the reference configurations are SAGE
    // 80.1–81.1, GIN 71.9–74.9, GAT 80.2–83.2 %; seed 0 here gives 80.3, 74.6, 82.7 %.
    for (model, floor, parameters) in [
        // 1433·64·2 + 64 + 64·7·2 + 7
        ("sage", 0.79, 184_391),
        // (1433·64 + 64 + 64·64 + 64) + (64·64 + 64 + 64·7 + 7)
        ("gin", 0.72, 100_551),
        // 1433·64 + 2·64 + 64, then 64·7 + 2·7 + 7
        ("gat", 0.80, 92_373),
    ] {
        let mut losses = Vec::new();
        for (p, path) in &chunks {
            let s = train(
                *p,
                &[
                    "--model",
                    model,
                    "--seed",
                    "0",
                    "--chunks",
                    path.to_str().unwrap(),
                ],
            );
            assert_eq!(s.config.model, model);
            assert_eq!(s.parameters, parameters, "{model}: parameter count");
            assert!(
                s.test_acc >= floor,
                "{model} at P={p}: test accuracy {} below {floor}",
                s.test_acc
            );
            losses.push((*p, s.final_loss));
            if model == "gat" {
                // The GAT paper's Cora configuration is the default.
                let c = &s.config;
                assert_eq!((c.hidden, c.heads), (8, 8));
                assert_eq!((c.dropout, c.attn_dropout, c.lr), (0.6, 0.6, 0.005));
            }
        }
        if model == "gin" {
            // GIN's sums are not normalised and it fits Cora's training nodes to a loss near
            // 0, where the last bits of sums taken in another order across P grow through the
            // epochs (relative 4e-6 after 30 epochs, 3e-5 after 60, 1e-3 after 200 with seed
            // 42): its losses are compared after 30 epochs.
            losses = chunks
                .iter()
                .map(|(p, path)| {
                    let args = ["--model", model, "--seed", "0", "--epochs", "30"];
                    let s = train(
                        *p,
                        &[&args[..], &["--chunks", path.to_str().unwrap()]].concat(),
                    );
                    (*p, s.final_loss)
                })
                .collect();
        }
        for &(p, l) in &losses[1..] {
            assert!(
                close(l, losses[0].1, 1e-4),
                "{model}: P={p} final loss {l} vs P=1 {}",
                losses[0].1
            );
        }
    }
}

#[test]
fn a_checkpoint_of_one_model_is_refused_by_another() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("p2");
    partition(&cora, 2, &chunks);
    let ckpt = dir.path().join("ckpt");
    let common = [
        "--chunks",
        chunks.to_str().unwrap(),
        "--checkpoint",
        ckpt.to_str().unwrap(),
    ];
    let out = mpirun(
        2,
        &[&["train", "--model", "sage", "--epochs", "3"], &common[..]].concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read(ckpt.join("checkpoint.json")).unwrap();
    let out = mpirun(
        2,
        &[
            &["train", "--model", "gin", "--resume", "--hidden", "64"],
            &common[..],
            &["--epochs", "6"],
        ]
        .concat(),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--model is sage there, gin here"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(ckpt.join("checkpoint.json")).unwrap(),
        before,
        "the refused resume left the checkpoint as it was"
    );
    // The same model resumes.
    let out = mpirun(
        2,
        &[
            &["train", "--model", "sage", "--resume"],
            &common[..],
            &["--epochs", "6"],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_model_trains_tensor_parallel_with_the_data_parallel_losses() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("p1");
    partition(&cora, 1, &chunks);
    let input = cora.to_str().unwrap();
    // 30 epochs: GIN's unnormalised sums drift past 1e-4 later (see the test above).
    for model in ["gcn", "sage", "gin", "gat"] {
        let common = ["--model", model, "--seed", "0", "--epochs", "30"];
        let data = train(
            1,
            &[&common[..], &["--chunks", chunks.to_str().unwrap()]].concat(),
        );
        for ranks in [2, 3] {
            let tensor = train(
                ranks,
                &[&common[..], &["--mode", "tensor", "--input", input]].concat(),
            );
            assert_eq!(tensor.parameters, data.parameters, "{model}");
            assert!(
                close(tensor.final_loss, data.final_loss, 1e-4),
                "{model}: tensor mode at P={ranks} final loss {} vs data-parallel {}",
                tensor.final_loss,
                data.final_loss
            );
        }
    }
}

#[test]
fn tensor_mode_refuses_more_ranks_than_a_layer_has_columns() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let out = mpirun(
        2,
        &[
            "train",
            "--mode",
            "tensor",
            "--model",
            "sage",
            "--hidden",
            "1",
            "--input",
            cora.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("layer 2 has 1 input columns") && stderr.contains("at most 1 ranks"),
        "{stderr}"
    );
}
