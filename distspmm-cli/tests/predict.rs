//! `distspmm predict` and `train --save-predictions` end to end under a real `mpirun` on Cora:
//! agreement with training and with one process, outputs in the input graph's node order
//! (METIS renumbers the nodes of every part), refusal to overwrite a user's file, and a
//! checkpoint resumed at another rank count.

mod launch;

use std::path::Path;

use launch::{cora, mpi, mpirun_available, npy, partition, s, summary};

/// The final JSON line of a successful `mpi` run of `ARGS… --json`.
fn json(ranks: usize, args: &[&str]) -> serde_json::Value {
    summary(&mpi(ranks, &[args, &["--json"]].concat()))
}

fn f32s(path: &Path) -> Vec<f32> {
    let (header, data) = npy(path);
    assert!(header.contains("'descr': '<f4'"), "{header}");
    data.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn i64s(path: &Path) -> Vec<i64> {
    let (header, data) = npy(path);
    assert!(header.contains("'descr': '<i8'"), "{header}");
    data.chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs())
}

#[test]
fn predict_at_4_ranks_reproduces_training_and_one_process() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (c1, c4) = (tmp.path().join("c1"), tmp.path().join("c4"));
    partition(&cora, 1, &c1, &[]);
    partition(&cora, 4, &c4, &[]);
    let ck = tmp.path().join("ck");
    let saved = tmp.path().join("saved");
    let trained = json(
        4,
        &[
            "train",
            "--chunks",
            s(&c4),
            "--epochs",
            "60",
            "--checkpoint",
            s(&ck),
            "--save-predictions",
            s(&saved),
        ],
    );
    let predict = |ranks: usize, source: &[&str], out: &Path| {
        let args = [
            &["predict"][..],
            source,
            &[
                "--checkpoint",
                s(&ck),
                "--out",
                s(out),
                "--logits",
                "--labels",
            ],
        ]
        .concat();
        json(ranks, &args)
    };
    let p4 = tmp.path().join("p4");
    let report = predict(4, &["--chunks", s(&c4)], &p4);
    assert_eq!(report["test_acc"], trained["test_acc"], "{report}");
    assert_eq!(report["train_acc"], trained["train_acc"], "{report}");
    assert_eq!(report["val_acc"], trained["val_acc"], "{report}");
    assert_eq!(report["epochs"], 60);
    assert_eq!(report["nodes"], 2708);
    // The saved predictions are the same pass's.
    let logits4 = f32s(&p4.join("logits.npy"));
    assert_eq!(logits4, f32s(&saved.join("logits.npy")));
    assert_eq!(
        i64s(&p4.join("labels.npy")),
        i64s(&saved.join("labels.npy"))
    );
    // One process, and tensor mode over the graph file on two ranks.
    let p1 = tmp.path().join("p1");
    predict(1, &["--chunks", s(&c1)], &p1);
    let pt = tmp.path().join("pt");
    let tensor = predict(2, &["--mode", "tensor", "--input", s(&cora)], &pt);
    assert_eq!(tensor["mode"], "tensor");
    assert_eq!(logits4.len(), 2708 * 7);
    for other in [&p1, &pt] {
        let logits = f32s(&other.join("logits.npy"));
        let worst = logits4
            .iter()
            .zip(&logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "{}: logits differ by {worst}",
            other.display()
        );
    }
}

#[test]
fn outputs_are_in_the_input_graph_s_node_order() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let c4 = tmp.path().join("c4");
    partition(&cora, 4, &c4, &[]);
    let ck = tmp.path().join("ck");
    json(
        4,
        &[
            "train",
            "--chunks",
            s(&c4),
            "--epochs",
            "20",
            "--normalize-features",
            "false",
            "--checkpoint",
            s(&ck),
        ],
    );
    let out = tmp.path().join("out");
    let report = json(
        4,
        &[
            "predict",
            "--chunks",
            s(&c4),
            "--checkpoint",
            s(&ck),
            "--out",
            s(&out),
            "--labels",
            "--embeddings",
            "0",
        ],
    );
    let g = distspmm_prep::graph::load(&cora).unwrap();
    let x = g.features.as_ref().unwrap();
    // The input of layer 0 is the features as given (not normalised here), row for row.
    let embeddings = f32s(&out.join("embeddings.npy"));
    assert_eq!(embeddings.len(), x.data.len());
    assert!(
        embeddings.iter().zip(x.data.iter()).all(|(a, b)| a == b),
        "embeddings.npy is not x in the graph's node order"
    );
    // The predicted labels against `y`, in the graph's order: the reported accuracies.
    let labels = i64s(&out.join("labels.npy"));
    let y = g.labels.as_ref().unwrap();
    for (mask, name) in [(&g.train_mask, "train_acc"), (&g.test_mask, "test_acc")] {
        let mask = mask.as_ref().unwrap();
        let (mut ok, mut n) = (0usize, 0usize);
        for i in (0..y.len()).filter(|&i| mask[i]) {
            n += 1;
            ok += usize::from(labels[i] == i64::from(y[i]));
        }
        let reported = report[name].as_f64().unwrap();
        assert_eq!(ok as f64 / n as f64, reported, "{name}");
    }
    // A layer the model does not have is refused before anything is written.
    let refused = mpi(
        2,
        &[
            "predict",
            "--mode",
            "tensor",
            "--input",
            s(&cora),
            "--checkpoint",
            s(&ck),
            "--out",
            s(&tmp.path().join("none")),
            "--embeddings",
            "2",
        ],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("--embeddings 2: the model has 2 layers")
            && !tmp.path().join("none/embeddings.npy").exists(),
        "{stderr}"
    );
}

#[test]
fn an_existing_output_file_is_refused_and_left_intact() {
    let Some(cora) = cora() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let c1 = tmp.path().join("c1");
    partition(&cora, 1, &c1, &[]);
    let ck = tmp.path().join("ck");
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("logits.npy"), b"the user's").unwrap();
    std::fs::write(out.join("notes.txt"), b"keep").unwrap();
    let train = |force: bool| {
        let mut args = vec![
            "train",
            "--chunks",
            s(&c1),
            "--epochs",
            "2",
            "--checkpoint",
            s(&ck),
            "--save-predictions",
            s(&out),
        ];
        if force {
            args.push("--force");
        }
        launch::run_one(&args)
    };
    let stderr = launch::error_of(&train(false), "an existing logits.npy");
    assert!(
        stderr.contains("logits.npy already exists; pass --force to replace it"),
        "{stderr}"
    );
    assert!(
        !ck.exists() || std::fs::read_dir(&ck).unwrap().count() == 0,
        "trained before refusing"
    );
    assert_eq!(
        std::fs::read(out.join("logits.npy")).unwrap(),
        b"the user's"
    );
    assert!(!out.join("labels.npy").exists());
    let predict = |force: bool| {
        let mut args = vec![
            "predict",
            "--chunks",
            s(&c1),
            "--checkpoint",
            s(&ck),
            "--out",
            s(&out),
            "--logits",
        ];
        if force {
            args.push("--force");
        }
        launch::run_one(&args)
    };
    assert!(train(true).status.success());
    let stderr = launch::error_of(&predict(false), "an existing logits.npy");
    assert!(stderr.contains("already exists"), "{stderr}");
    let before = std::fs::read(out.join("logits.npy")).unwrap();
    assert_eq!(f32s(&out.join("logits.npy")).len(), 2708 * 7);
    assert!(predict(true).status.success());
    assert_eq!(std::fs::read(out.join("logits.npy")).unwrap(), before);
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"keep");
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["labels.npy", "logits.npy", "notes.txt"]);
}

/// The weights and Adam's moments are global: a checkpoint written at P = 2 resumes at P = 4 on
/// the graph partitioned again, with dropout on (its masks are keyed by original ids), to the
/// losses of an uninterrupted run.
#[test]
fn a_checkpoint_resumes_at_another_rank_count() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (c2, c4) = (tmp.path().join("c2"), tmp.path().join("c4"));
    partition(&cora, 2, &c2, &[]);
    partition(&cora, 4, &c4, &[]);
    let train = |ranks: usize, chunks: &Path, epochs: &str, extra: &[&str]| {
        let args = [
            &[
                "train",
                "--chunks",
                s(chunks),
                "--epochs",
                epochs,
                "--dropout",
                "0.5",
            ][..],
            extra,
        ]
        .concat();
        json(ranks, &args)
    };
    let straight = train(2, &c2, "100", &[]);
    let ck = tmp.path().join("ck");
    train(2, &c2, "50", &["--checkpoint", s(&ck)]);
    let resumed = train(4, &c4, "100", &["--checkpoint", s(&ck), "--resume"]);
    let (a, b) = (
        straight["final_loss"].as_f64().unwrap(),
        resumed["final_loss"].as_f64().unwrap(),
    );
    assert!(
        relative(a, b) <= 1e-4,
        "final loss {b} resumed at P = 4, {a} straight at P = 2"
    );
    assert_eq!(resumed["epochs"], 100);
    // Tensor mode keeps its own checkpoints: a data-mode one is refused naming the mode.
    let out = mpi(
        2,
        &[
            "train",
            "--mode",
            "tensor",
            "--input",
            s(&cora),
            "--epochs",
            "120",
            "--checkpoint",
            s(&ck),
            "--resume",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--mode is data there, tensor here"),
        "{stderr}"
    );
}

/// A tensor-parallel checkpoint resumes at another rank count too.
#[test]
fn a_tensor_parallel_checkpoint_resumes_at_another_rank_count() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let train = |ranks: usize, epochs: &str, extra: &[&str]| {
        let args = [
            &[
                "train",
                "--mode",
                "tensor",
                "--input",
                s(&cora),
                "--epochs",
                epochs,
            ][..],
            extra,
        ]
        .concat();
        json(ranks, &args)
    };
    let straight = train(1, "30", &[]);
    train(1, "15", &["--checkpoint", s(&ck)]);
    let resumed = train(2, "30", &["--checkpoint", s(&ck), "--resume"]);
    let (a, b) = (
        straight["final_loss"].as_f64().unwrap(),
        resumed["final_loss"].as_f64().unwrap(),
    );
    assert!(relative(a, b) <= 1e-4, "{b} resumed at P = 2, {a} straight");
}
