//! Hostile inputs of the third hardening round that only show under `mpirun` with ranks on
//! different inputs (MPMD, `mpirun -n 1 A : -n 1 B`, as two hosts with their own copies would
//! be): chunk directories of one partition of graphs that differ only in features, labels or
//! edges, and checkpoints of different epochs. Every rank must refuse with exit status 1 and
//! one message naming what differs, before a training step. Also the checkpoint reader on
//! special files (a FIFO, a link to `/dev/zero`) and a resume at another part count (it continues)
//! or on another graph (refused, naming it).

mod launch;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use distspmm_prep::graph::Graph;
use launch::{csbm, error_of, mpirun_available, run_one, s, BIN};

/// How long one short job may take on a loaded two-core machine.
const SHORT: Duration = Duration::from_secs(180);

/// `mpirun -n 1 distspmm A… : -n 1 distspmm B…` on this machine.
fn mpmd(a: &[&str], b: &[&str]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--bind-to", "none"])
        .args(["--mca", "btl", "self,vader"])
        .args(["-n", "1", BIN])
        .args(a)
        .args([":", "-n", "1", BIN])
        .args(b);
    launch::as_root_with_one_thread(&mut cmd);
    launch::run(cmd, SHORT)
}

/// `mpirun -n RANKS distspmm ARGS…`, which must succeed.
fn mpirun_ok(ranks: usize, args: &[&str]) {
    let mut cmd = launch::mpirun(ranks);
    cmd.arg(BIN).args(args);
    let out = launch::run(cmd, SHORT);
    assert!(
        out.status.success(),
        "mpirun -n {ranks} distspmm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The stderr of a job that must end with exit status 1, with `message` said `times` times
/// (once per rank) and no crash or MPI-level error.
fn refused_by_ranks(out: &Output, message: &str, times: usize) -> String {
    let stderr = error_of(out, message);
    assert_eq!(
        stderr.matches(message).count(),
        times,
        "{message:?} expected {times} times: {stderr}"
    );
    for bad in ["MPI_ERR", "MPI_Abort", "aborting the MPI job"] {
        assert!(!stderr.contains(bad), "{bad}: {stderr}");
    }
    stderr
}

/// `graph` changed by `change`, written as `dir/name`.
fn variant(graph: &Path, dir: &Path, name: &str, change: impl FnOnce(&mut Graph)) -> PathBuf {
    let mut g = distspmm_prep::graph::load(graph).unwrap();
    change(&mut g);
    let path = dir.join(name);
    distspmm_prep::graph::npz::write_npz(&path, &g).unwrap();
    path
}

/// `graph` partitioned contiguously into `parts` (one partition whatever the node data: the
/// partition fingerprints of variants match).
fn chunks(graph: &Path, parts: usize, out: &Path) -> PathBuf {
    launch::partition(graph, parts, out, &["--method", "contiguous", "--json"]);
    out.to_owned()
}

fn manifest_fingerprint(dir: &Path) -> String {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    m["fingerprint"].as_str().unwrap().to_owned()
}

const DIFFER: &str = "rank 1's chunks differ from rank 0's (content digest ";

#[test]
fn ranks_on_one_partition_of_graphs_differing_in_features_or_labels_refuse_to_train() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let g = csbm(tmp.path(), "g.npz", 400, 8, 1);
    let features = variant(&g, tmp.path(), "features.npz", |g| {
        let x = g.features.as_mut().unwrap();
        x.data[399 * x.dim + 2] += 1.0;
    });
    let labels = variant(&g, tmp.path(), "labels.npz", |g| {
        let y = g.labels.as_mut().unwrap();
        y[399] = (y[399] + 1) % 3;
    });
    let a = chunks(&g, 2, &tmp.path().join("a"));
    for (other, what) in [(features, "features"), (labels, "labels")] {
        let b = chunks(&other, 2, &tmp.path().join(what));
        assert_eq!(manifest_fingerprint(&a), manifest_fingerprint(&b), "{what}");
        let train = |dir: &Path| ["train", "--chunks", s(dir), "--epochs", "3"].map(str::to_owned);
        let (ta, tb) = (train(&a), train(&b));
        let out = mpmd(
            &ta.iter().map(String::as_str).collect::<Vec<_>>(),
            &tb.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let stderr = refused_by_ranks(&out, DIFFER, 2);
        assert!(
            stderr.contains("copy the same chunk directory to every host"),
            "{what}: {stderr}"
        );
        // Each rank names its own directory.
        for dir in [&a, &b] {
            assert!(
                stderr.contains(&format!("over the chunks in {}: {DIFFER}", dir.display())),
                "{what}: {stderr}"
            );
        }
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("epoch"),
            "{what}: trained before refusing"
        );
    }
}

#[test]
fn verify_on_one_partition_of_graphs_with_other_edges_names_the_mismatch() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let g = csbm(tmp.path(), "g.npz", 400, 8, 1);
    // One more edge between the two parts: the halo lists differ (this used to end in
    // MPI_ERR_TRUNCATE), the partition does not.
    let edges = variant(&g, tmp.path(), "edges.npz", |g| {
        let (u, v) = (3, 397);
        g.src.extend([u, v]);
        g.dst.extend([v, u]);
    });
    let a = chunks(&g, 2, &tmp.path().join("a"));
    let b = chunks(&edges, 2, &tmp.path().join("b"));
    assert_eq!(manifest_fingerprint(&a), manifest_fingerprint(&b));
    let out = mpmd(
        &["verify", "--chunks", s(&a)],
        &["verify", "--chunks", s(&b)],
    );
    let stderr = refused_by_ranks(&out, DIFFER, 2);
    for dir in [&a, &b] {
        assert!(
            stderr.contains(&format!("chunk directory {}: {DIFFER}", dir.display())),
            "{stderr}"
        );
    }
}

#[test]
fn ranks_resuming_checkpoints_of_different_epochs_fail_before_training() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let g = csbm(tmp.path(), "g.npz", 400, 8, 1);
    let c = chunks(&g, 2, &tmp.path().join("c"));
    let (early, late) = (tmp.path().join("ck5"), tmp.path().join("ck10"));
    for (dir, epochs) in [(&early, "5"), (&late, "10")] {
        mpirun_ok(
            2,
            &[
                "train",
                "--chunks",
                s(&c),
                "--epochs",
                epochs,
                "--checkpoint",
                s(dir),
            ],
        );
    }
    let resume = |dir: &Path| {
        [
            "train",
            "--chunks",
            s(&c),
            "--epochs",
            "20",
            "--resume",
            "--checkpoint",
            s(dir),
        ]
        .map(str::to_owned)
    };
    let (ra, rb) = (resume(&early), resume(&late));
    let out = mpmd(
        &ra.iter().map(String::as_str).collect::<Vec<_>>(),
        &rb.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let stderr = refused_by_ranks(
        &out,
        "the ranks resume different checkpoints: rank 1's has finished 10 epochs (checksum ",
        2,
    );
    assert!(
        stderr.contains("rank 0's 5 (checksum ")
            && stderr.contains("resume every rank from a copy of one checkpoint directory"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("epoch") && !stderr.contains("resuming from"),
        "trained before refusing: {stdout}"
    );
}

#[test]
fn a_checkpoint_that_is_a_fifo_or_a_link_to_dev_zero_is_refused_at_once() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let g = csbm(tmp.path(), "g.npz", 400, 8, 1);
    let c = chunks(&g, 2, &tmp.path().join("c"));
    let (good, bad) = (tmp.path().join("good"), tmp.path().join("bad"));
    mpirun_ok(
        2,
        &[
            "train",
            "--chunks",
            s(&c),
            "--epochs",
            "2",
            "--checkpoint",
            s(&good),
        ],
    );
    std::fs::create_dir(&bad).unwrap();
    let file = bad.join("checkpoint.json");
    let resume = |dir: &Path| {
        [
            "train",
            "--chunks",
            s(&c),
            "--epochs",
            "4",
            "--resume",
            "--checkpoint",
            s(dir),
        ]
        .map(str::to_owned)
    };
    // Rank 1's host-local checkpoint directory holds the special file (rank 0 probes only its
    // own directory for writing): its reader must refuse it, not block or read forever.
    let run = || {
        let (a, b) = (resume(&good), resume(&bad));
        mpmd(
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
            &b.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };
    let made = Command::new("mkfifo").arg(&file).status().unwrap();
    assert!(made.success());
    let said = format!("rank 1 of 2: cannot read checkpoint {}", file.display());
    let stderr = refused_by_ranks(&run(), &said, 2);
    assert!(stderr.contains("FIFO"), "{stderr}");
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
    let stderr = refused_by_ranks(&run(), &said, 2);
    assert!(stderr.contains("a device"), "{stderr}");
    // One process: refused as well (by the writability probe or the reader), never a hang.
    let stderr = refused_by_ranks(
        &run_one(&resume(&bad).iter().map(String::as_str).collect::<Vec<_>>()),
        &file.display().to_string(),
        1,
    );
    assert!(stderr.contains("a device"), "{stderr}");
}

#[test]
fn a_resume_at_another_part_count_continues_and_another_graph_is_named() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let g = csbm(tmp.path(), "g.npz", 400, 8, 1);
    let c2 = chunks(&g, 2, &tmp.path().join("c2"));
    let c1 = chunks(&g, 1, &tmp.path().join("c1"));
    let ck = tmp.path().join("ck");
    mpirun_ok(
        2,
        &[
            "train",
            "--chunks",
            s(&c2),
            "--epochs",
            "2",
            "--checkpoint",
            s(&ck),
        ],
    );
    let resume = |chunks: &Path, epochs: &str| {
        run_one(&[
            "train",
            "--chunks",
            s(chunks),
            "--epochs",
            epochs,
            "--resume",
            "--checkpoint",
            s(&ck),
        ])
    };
    // The checkpoint names the graph, not its partition: one part of the same graph goes on.
    let out = resume(&c1, "4");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another graph of the same shape is named as other data.
    let other = csbm(tmp.path(), "h.npz", 400, 8, 2);
    let h1 = chunks(&other, 1, &tmp.path().join("h1"));
    let stderr = refused_by_ranks(&resume(&h1, "6"), "the data differ (content fingerprint", 1);
    assert!(
        stderr.contains(&format!("{} here: another graph", h1.display())),
        "{stderr}"
    );
}
