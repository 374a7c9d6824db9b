//! Multi-label targets end to end under a real `mpirun`, on a small generated graph
//! (`generate csbm --multi-label`): binary cross-entropy and ROC-AUC equal at 1 and 2 ranks and
//! in tensor mode, early stopping on the validation ROC-AUC, `predict` writing sigmoid
//! probabilities and 0/1 labels in the input graph's node order with the training's ROC-AUC,
//! and the metrics each kind of target refuses.

mod launch;

use std::path::{Path, PathBuf};

use launch::{
    csbm, error_of, f64_of, mpi, mpirun_available, npy, partition, refused, s, succeeds, summary,
};

/// The final JSON line of a successful `mpi` run of `ARGS… --json`.
fn json(ranks: usize, args: &[&str]) -> serde_json::Value {
    summary(&mpi(ranks, &[args, &["--json"]].concat()))
}

/// A CSBM graph of 500 nodes whose 4 communities are multi-label targets.
fn multi_label_graph(dir: &Path) -> PathBuf {
    let path = dir.join("ml.npz");
    let out = succeeds(&[
        "generate",
        "csbm",
        "--nodes",
        "500",
        "--multi-label",
        "4",
        "--features",
        "12",
        "--avg-degree",
        "6",
        "--seed",
        "2",
        "--json",
        "--out",
        s(&path),
    ]);
    let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (line["classes"].as_u64(), line["multi_label"].as_bool()),
        (Some(4), Some(true))
    );
    path
}

/// A float32 `[rows, 4]` output.
fn f32s(path: &Path) -> Vec<f32> {
    let (header, data) = npy(path);
    assert!(
        header.contains("'descr': '<f4'") && header.contains("'shape': (500, 4)"),
        "{header}"
    );
    data.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The ROC-AUC of one mask as OGB computes it, from logits in the graph's node order: each
/// class over the mask's labelled nodes, classes with one target value skipped, the mean.
fn ogb_auc(logits: &[f32], g: &distspmm_prep::graph::Graph, mask: &[bool]) -> f64 {
    let t = g.targets.as_ref().unwrap();
    let mut kept = Vec::new();
    for c in 0..t.classes {
        let mut pairs: Vec<(f32, bool)> = (0..g.num_nodes)
            .filter(|&v| mask[v] && t.row(v)[0] != distspmm_prep::graph::TARGET_UNLABELLED)
            .map(|v| (logits[v * t.classes + c], t.row(v)[c] == 1))
            .collect();
        if let Some(auc) = distspmm_gcn::model::roc_auc(&mut pairs) {
            kept.push(auc);
        }
    }
    kept.iter().sum::<f64>() / kept.len() as f64
}

#[test]
fn multi_label_training_agrees_across_ranks_and_predict_reproduces_it() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = multi_label_graph(tmp.path());
    let (c1, c2) = (tmp.path().join("c1"), tmp.path().join("c2"));
    partition(&graph, 1, &c1, &[]);
    partition(&graph, 2, &c2, &[]);
    let (ck, saved) = (tmp.path().join("ck"), tmp.path().join("saved"));
    let train = ["train", "--epochs", "40"];
    let one = json(1, &[&train[..], &["--chunks", s(&c1)]].concat());
    let two = json(
        2,
        &[
            &train[..],
            &[
                "--chunks",
                s(&c2),
                "--checkpoint",
                s(&ck),
                "--save-predictions",
                s(&saved),
            ],
        ]
        .concat(),
    );
    let tensor = json(
        2,
        &[&train[..], &["--mode", "tensor", "--input", s(&graph)]].concat(),
    );
    for run in [&one, &two, &tensor] {
        assert_eq!(run["metric"], "auc", "{run}");
        assert_eq!(run["config"]["multi_label"], true, "{run}");
        assert!(
            run.get("train_acc").is_none() && run.get("test_f1").is_none(),
            "{run}"
        );
        let loss = f64_of(run, "final_loss");
        let reference = f64_of(&one, "final_loss");
        assert!(
            (loss - reference).abs() <= 1e-4 * reference,
            "final loss {loss} vs {reference} at one rank"
        );
        for key in ["train_auc", "val_auc", "test_auc"] {
            let (a, b) = (f64_of(run, key), f64_of(&one, key));
            assert!((a - b).abs() <= 1e-9, "{key}: {a} vs {b} at one rank");
        }
    }
    // A model that learnt something: well above chance on the held-out nodes.
    assert!(f64_of(&two, "test_auc") > 0.65, "{two}");

    // Predict with the checkpoint (the last epoch, as the summary's model) at both rank counts.
    let predict = |ranks: usize, chunks: &Path, out: &Path| {
        json(
            ranks,
            &[
                "predict",
                "--chunks",
                s(chunks),
                "--checkpoint",
                s(&ck),
                "--out",
                s(out),
                "--logits",
                "--probabilities",
                "--labels",
            ],
        )
    };
    let (p1, p2) = (tmp.path().join("p1"), tmp.path().join("p2"));
    let report2 = predict(2, &c2, &p2);
    let report1 = predict(1, &c1, &p1);
    for key in ["train_auc", "val_auc", "test_auc"] {
        assert_eq!(report2[key], two[key], "{key}: {report2}");
        let (a, b) = (f64_of(&report1, key), f64_of(&two, key));
        assert!((a - b).abs() <= 1e-9, "{key}: {a} vs {b}");
    }
    assert!(report2.get("test_acc").is_none(), "{report2}");
    let files = report2["files"].as_array().unwrap();
    let kinds: Vec<(&str, String)> = files
        .iter()
        .map(|f| (f["dtype"].as_str().unwrap(), f["shape"].to_string()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("<f4", "[500,4]".into()),
            ("<f4", "[500,4]".into()),
            ("|u1", "[500,4]".into())
        ]
    );
    let logits = f32s(&p2.join("logits.npy"));
    assert_eq!(logits, f32s(&saved.join("logits.npy")));
    let probabilities = f32s(&p2.join("probabilities.npy"));
    let (header, labels) = npy(&p2.join("labels.npy"));
    assert!(
        header.contains("'descr': '|u1'") && header.contains("(500, 4)"),
        "{header}"
    );
    assert_eq!(labels, npy(&saved.join("labels.npy")).1);
    for ((&z, &p), &l) in logits.iter().zip(&probabilities).zip(&labels) {
        let sigmoid = 1.0 / (1.0 + (-f64::from(z)).exp());
        assert!((f64::from(p) - sigmoid).abs() < 1e-6, "{z} → {p}");
        assert_eq!(l, u8::from(z > 0.0), "logit {z}");
    }
    // Rows in the input graph's node order: the same rows at one rank (another numbering of
    // the nodes), and the per-mask ROC-AUC of the file against the graph's own targets is the
    // reported one.
    let logits1 = f32s(&p1.join("logits.npy"));
    let worst = logits
        .iter()
        .zip(&logits1)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "logits at 1 and 2 ranks differ by {worst}");
    let g = distspmm_prep::graph::load(&graph).unwrap();
    for (key, mask) in [
        ("train_auc", &g.train_mask),
        ("val_auc", &g.val_mask),
        ("test_auc", &g.test_mask),
    ] {
        let auc = ogb_auc(&logits, &g, mask.as_ref().unwrap());
        assert!(
            (auc - f64_of(&report2, key)).abs() < 1e-12,
            "{key}: {auc} vs {report2}"
        );
    }
}

#[test]
fn patience_follows_the_validation_auc_and_restores_the_best_epoch() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = multi_label_graph(tmp.path());
    let c2 = tmp.path().join("c2");
    partition(&graph, 2, &c2, &[]);
    let out = mpi(
        2,
        &[
            "train",
            "--chunks",
            s(&c2),
            "--epochs",
            "1000",
            "--lr",
            "0.05",
            "--patience",
            "5",
            "--json",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stopped = summary(&out);
    assert_eq!(stopped["stopped_early"], true, "{stopped}");
    assert_eq!(stopped["metric"], "auc");
    let (epochs, best) = (
        stopped["epochs"].as_u64().unwrap(),
        stopped["best_epoch"].as_u64().unwrap(),
    );
    assert!(epochs < 1000 && best + 5 == epochs, "{stopped}");
    // The summary is the restored best epoch's: its validation ROC-AUC is the best value.
    assert_eq!(stopped["val_auc"], stopped["best_val"], "{stopped}");
    assert!(
        stderr.contains(&format!("stopping early after epoch {epochs}"))
            && stderr.contains("the validation auc has not improved since epoch"),
        "{stderr}"
    );
    // The epoch lines name the ROC-AUC; the best epoch's line holds the restored value.
    let best_line = stderr
        .lines()
        .find(|l| l.starts_with(&format!("epoch {best:>4} ")))
        .unwrap_or_else(|| panic!("no line of epoch {best}: {stderr}"));
    let val = f64_of(&stopped, "val_auc");
    assert!(
        best_line.contains(&format!("val auc {val:.4}")),
        "{best_line}"
    );
}

#[test]
fn each_kind_of_target_refuses_the_other_s_metric() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let multi = multi_label_graph(tmp.path());
    let single = csbm(tmp.path(), "single.npz", 200, 4, 1);
    let (cm, cs) = (tmp.path().join("cm"), tmp.path().join("cs"));
    partition(&multi, 1, &cm, &[]);
    partition(&single, 1, &cs, &[]);
    for metric in ["acc", "f1"] {
        let err = error_of(
            &mpi(
                1,
                &[
                    "train",
                    "--chunks",
                    s(&cm),
                    "--epochs",
                    "2",
                    "--metric",
                    metric,
                ],
            ),
            metric,
        );
        assert!(
            err.contains(&format!("--metric {metric} is for one class per node"))
                && err.contains("use --metric auc"),
            "{err}"
        );
    }
    let err = error_of(
        &mpi(
            1,
            &[
                "train",
                "--chunks",
                s(&cs),
                "--epochs",
                "2",
                "--metric",
                "auc",
            ],
        ),
        "auc",
    );
    assert!(
        err.contains("--metric auc is for multi-label targets") && err.contains("acc or f1"),
        "{err}"
    );
    // The generator takes one class count: the communities of --multi-label, or --classes.
    let err = refused(
        &[
            "generate",
            "csbm",
            "--multi-label",
            "3",
            "--classes",
            "3",
            "--out",
            s(&tmp.path().join("both.npz")),
        ],
        2,
    );
    assert!(
        err.contains("--multi-label") && err.contains("--classes"),
        "{err}"
    );
}
