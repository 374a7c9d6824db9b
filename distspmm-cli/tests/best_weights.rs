//! Early stopping across checkpoints under a real `mpirun`: a checkpoint records the best epoch
//! (and, with `--patience`, its weights), a resume at the same or another rank count stops where
//! an uninterrupted run does with the same best, and `predict` uses the best epoch's weights by
//! default, reproducing what `train` reported, on Cora and on multi-label targets.

mod launch;

use std::path::Path;

use launch::{cora, error_of, f64_of, mpi, mpirun_available, partition, s, succeeds, summary};

/// The final JSON line of a successful `mpi` run of `ARGS… --json`, and its stderr.
fn json(ranks: usize, args: &[&str]) -> (serde_json::Value, String) {
    let out = mpi(ranks, &[args, &["--json"]].concat());
    (
        summary(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn u64_of(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Copies the checkpoint directory `from` to `to`.
fn copy_checkpoint(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join("checkpoint.json"), to.join("checkpoint.json")).unwrap();
}

/// 100 epochs with `--patience 10` at P = 2 stop at epoch E with the best B; the same run
/// interrupted (after epoch 50, and between B and E, where the checkpoint must carry the best
/// epoch's weights and the count since it) and resumed at P = 2 stops at E with the best B and
/// the same numbers, bit for bit; resumed at P = 4 on the graph partitioned again, at the same
/// epochs with the same best and losses within 1e-4.
#[test]
fn a_resumed_run_stops_where_an_uninterrupted_one_does() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (c2, c4) = (tmp.path().join("c2"), tmp.path().join("c4"));
    partition(&cora, 2, &c2, &[]);
    partition(&cora, 4, &c4, &[]);
    let train = |ranks: usize, chunks: &Path, epochs: u64, extra: &[&str]| {
        let epochs = epochs.to_string();
        let args = [
            &[
                "train",
                "--chunks",
                s(chunks),
                "--epochs",
                &epochs,
                "--patience",
                "10",
            ][..],
            extra,
        ]
        .concat();
        json(ranks, &args)
    };
    let (straight, _) = train(2, &c2, 100, &[]);
    let (stop, best) = (u64_of(&straight, "epochs"), u64_of(&straight, "best_epoch"));
    assert_eq!(straight["stopped_early"], true, "{straight}");
    assert!(50 < best && best + 10 == stop, "{straight}");
    for split in [50, best + 5] {
        let ck = tmp.path().join(format!("ck{split}"));
        let (first, _) = train(2, &c2, split, &["--checkpoint", s(&ck)]);
        assert_eq!(u64_of(&first, "epochs"), split, "{first}");
        let ck4 = tmp.path().join(format!("ck{split}-4"));
        copy_checkpoint(&ck, &ck4);
        for (ranks, chunks, dir) in [(2, &c2, &ck), (4, &c4, &ck4)] {
            let (resumed, stderr) =
                train(ranks, chunks, 100, &["--checkpoint", s(dir), "--resume"]);
            let what = format!("split after epoch {split}, resumed at P = {ranks}: {resumed}");
            assert!(
                stderr.contains(&format!(
                    "continuing from its best epoch {}",
                    u64_of(&first, "best_epoch")
                )),
                "{what}: {stderr}"
            );
            assert_eq!(resumed["stopped_early"], true, "{what}");
            assert_eq!(u64_of(&resumed, "epochs"), stop, "{what}");
            assert_eq!(u64_of(&resumed, "best_epoch"), best, "{what}");
            for key in ["best_val", "val_acc", "test_acc", "test_f1"] {
                assert_eq!(resumed[key], straight[key], "{key}: {what}");
            }
            let (a, b) = (
                f64_of(&resumed, "final_loss"),
                f64_of(&straight, "final_loss"),
            );
            if ranks == 2 {
                assert_eq!(a.to_bits(), b.to_bits(), "{what}");
            } else {
                assert!((a - b).abs() <= 1e-4 * b.abs(), "{what}: {a} vs {b}");
            }
        }
    }
}

/// After an early stop, `predict` uses the best epoch's weights and reproduces the accuracies
/// `train` reported exactly, at the training's rank count and at another; `--weights last` the
/// last epoch's. A checkpoint trained without `--patience` keeps only the last epoch's weights:
/// `predict` uses them and says so, and `--weights best` is refused with how to keep them.
#[test]
fn predict_after_an_early_stop_reproduces_train_s_best_epoch() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (c2, c4) = (tmp.path().join("c2"), tmp.path().join("c4"));
    partition(&cora, 2, &c2, &[]);
    partition(&cora, 4, &c4, &[]);
    let ck = tmp.path().join("ck");
    let (trained, _) = json(
        2,
        &[
            "train",
            "--chunks",
            s(&c2),
            "--epochs",
            "200",
            "--patience",
            "5",
            "--checkpoint",
            s(&ck),
        ],
    );
    assert_eq!(trained["stopped_early"], true, "{trained}");
    let (epochs, best) = (u64_of(&trained, "epochs"), u64_of(&trained, "best_epoch"));
    let predict = |ranks: usize, chunks: &Path, ck: &Path, extra: &[&str]| {
        let args = [
            &["predict", "--chunks", s(chunks), "--checkpoint", s(ck)][..],
            extra,
        ]
        .concat();
        mpi(ranks, &args)
    };
    for (ranks, chunks) in [(2, &c2), (4, &c4)] {
        let report = summary(&predict(ranks, chunks, &ck, &["--json"]));
        assert_eq!(report["weights"], "best", "{report}");
        assert_eq!(u64_of(&report, "weights_epoch"), best, "{report}");
        assert_eq!(u64_of(&report, "epochs"), epochs, "{report}");
        assert_eq!(report["best_metric"], "acc", "{report}");
        assert_eq!(report["best_val"], trained["best_val"], "{report}");
        for key in ["train_acc", "val_acc", "test_acc"] {
            assert_eq!(report[key], trained[key], "{key} at P = {ranks}: {report}");
        }
    }
    let last = summary(&predict(2, &c2, &ck, &["--json", "--weights", "last"]));
    assert_eq!(last["weights"], "last", "{last}");
    assert_eq!(u64_of(&last, "weights_epoch"), epochs, "{last}");
    assert!(last.get("best_val").is_none(), "{last}");
    let text = String::from_utf8_lossy(&predict(2, &c2, &ck, &[]).stdout).into_owned();
    assert!(
        text.contains(&format!(
            "using the best epoch's weights: epoch {best} of {epochs}, validation acc"
        )),
        "{text}"
    );

    // The same training without --patience, as long: its best epoch is not its last.
    let plain = tmp.path().join("plain");
    let epochs = epochs.to_string();
    let (trained, _) = json(
        2,
        &[
            "train",
            "--chunks",
            s(&c2),
            "--epochs",
            &epochs,
            "--checkpoint",
            s(&plain),
        ],
    );
    assert_eq!(u64_of(&trained, "best_epoch"), best, "{trained}");
    let report = summary(&predict(2, &c2, &plain, &["--json"]));
    assert_eq!(report["weights"], "last", "{report}");
    assert_eq!(report["test_acc"], trained["test_acc"], "{report}");
    let text = String::from_utf8_lossy(&predict(2, &c2, &plain, &[]).stdout).into_owned();
    assert!(
        text.contains(&format!("using the last epoch's weights: epoch {epochs}")),
        "{text}"
    );
    let err = error_of(
        &predict(2, &c2, &plain, &["--weights", "best"]),
        "--weights best without --patience",
    );
    assert!(
        err.contains("was trained without --patience")
            && err.contains(&format!("its best epoch by the validation acc was {best}"))
            && err.contains("predict with --weights last, or train again with --patience N"),
        "{err}"
    );
}

/// Multi-label targets: after an early stop on the validation ROC-AUC, `predict` reproduces the
/// ROC-AUCs `train` reported (the best epoch's).
#[test]
fn predict_after_an_early_stop_on_multi_label_targets_reproduces_train() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = tmp.path().join("ml.npz");
    succeeds(&[
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
        "--out",
        s(&graph),
    ]);
    let c2 = tmp.path().join("c2");
    partition(&graph, 2, &c2, &[]);
    let ck = tmp.path().join("ck");
    let (trained, _) = json(
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
            "--checkpoint",
            s(&ck),
        ],
    );
    assert_eq!(trained["stopped_early"], true, "{trained}");
    let (report, _) = json(2, &["predict", "--chunks", s(&c2), "--checkpoint", s(&ck)]);
    assert_eq!(report["weights"], "best", "{report}");
    assert_eq!(report["best_metric"], "auc", "{report}");
    assert_eq!(report["weights_epoch"], trained["best_epoch"], "{report}");
    for key in ["train_auc", "val_auc", "test_auc"] {
        assert_eq!(report[key], trained[key], "{key}: {report}");
    }
    assert_eq!(report["val_auc"], trained["best_val"], "{report}");
}
