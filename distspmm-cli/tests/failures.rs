//! Failures during `distspmm train` under a real `mpirun`: a rank killed with SIGKILL (the job
//! ends non-zero within 60 s, the checkpoint written before still resumes, nothing partial sits
//! under a final name), chunks of two partition runs (every rank refuses with one message), and
//! NaN/Inf in features and gradients (`--on-nonfinite fail|warn`).
//!
//! The wrong-rank-count case is in train.rs (`wrong_rank_count_fails_fast_on_every_rank`).

mod launch;

use launch::{cora, kill9, mpirun, mpirun_available, partition, s, summary, wait_for, Job, BIN};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// How long any single short job may take on a loaded two-core machine.
const SHORT: Duration = Duration::from_secs(180);
/// The issue's bound for a job to end after one of its ranks died.
const DEATH_TO_EXIT: Duration = Duration::from_secs(60);

fn train(ranks: usize, args: &[&str]) -> Output {
    let mut cmd = mpirun(ranks);
    cmd.args([BIN, "train"]).args(args);
    launch::run(cmd, SHORT)
}

fn checkpoint_epoch(dir: &Path) -> u64 {
    let path = dir.join("checkpoint.json");
    let text = std::fs::read_to_string(&path).expect("read the checkpoint");
    let value: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not whole JSON: {e}", path.display()));
    value["state"]["epoch"]
        .as_u64()
        .unwrap_or_else(|| panic!("no state.epoch in {}", path.display()))
}

/// Files in the checkpoint directory other than the checkpoint itself: only temporaries a
/// killed writer left (never anything else).
fn leftovers(dir: &Path) -> Vec<String> {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "checkpoint.json")
        .collect();
    for n in &names {
        assert!(
            n.starts_with("checkpoint.json.tmp-"),
            "unexpected file {n} in the checkpoint directory"
        );
    }
    names
}

/// Resumes from the checkpoint in `ck` for two more epochs: proof that it is whole and usable.
fn resume_two_more(chunks: &Path, ck: &Path) {
    let saved = checkpoint_epoch(ck);
    let target = (saved + 2).to_string();
    let out = train(
        2,
        &[
            "--chunks",
            s(chunks),
            "--checkpoint",
            s(ck),
            "--resume",
            "--epochs",
            &target,
            "--json",
        ],
    );
    let sum = summary(&out);
    assert_eq!(sum["epochs"].as_u64(), Some(saved + 2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("after epoch {saved}")));
    assert_eq!(checkpoint_epoch(ck), saved + 2);
}

/// Starts a practically endless 2-rank training that checkpoints every `every` epochs and
/// waits for the first checkpoint.
fn endless_training(chunks: &Path, ck: &Path, every: u64) -> Job {
    let mut cmd = mpirun(2);
    cmd.args([BIN, "train", "--chunks", s(chunks), "--epochs", "100000"])
        .args([
            "--checkpoint",
            s(ck),
            "--checkpoint-every",
            &every.to_string(),
        ]);
    let mut job = Job::spawn(cmd);
    let file = ck.join("checkpoint.json");
    let written = wait_for(SHORT, Duration::from_millis(50), || {
        file.exists() || job.finished().is_some()
    });
    assert!(
        written && job.finished().is_none(),
        "no checkpoint while training: {}",
        job.stderr()
    );
    job
}

/// Waits (at most [`DEATH_TO_EXIT`]) for the job to end after a kill; it must fail.
fn ends_non_zero(job: &mut Job, what: &str) -> Duration {
    let killed = Instant::now();
    let status = job.wait_until(DEATH_TO_EXIT).unwrap_or_else(|| {
        panic!(
            "mpirun still running {DEATH_TO_EXIT:?} after {what}; stderr: {}",
            job.stderr()
        )
    });
    let took = killed.elapsed();
    eprintln!("mpirun ended {took:?} after {what}: {status}");
    assert!(!status.success(), "the job succeeded after {what}");
    took
}

/// A temporary directory with Cora partitioned into 2 chunks in `c`; `None` to skip.
fn cora_in_two_parts() -> Option<(tempfile::TempDir, PathBuf)> {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    partition(&cora, 2, &chunks, &[]);
    Some((dir, chunks))
}

#[test]
fn a_rank_killed_mid_training_ends_the_job_and_the_checkpoint_resumes() {
    let Some((dir, chunks)) = cora_in_two_parts() else {
        return;
    };
    let ck = dir.path().join("ck");
    let mut job = endless_training(&chunks, &ck, 5);
    let ranks = job.ranks(2);
    kill9(ranks[1]);
    ends_non_zero(&mut job, "rank 1 was killed");
    let stderr = job.stderr();
    assert!(
        stderr.contains("rank 1") && stderr.contains("signal 9"),
        "mpirun names the dead rank and the signal: {stderr}"
    );
    // The survivor, blocked in a collective with the dead rank, was taken down with the job.
    assert!(
        wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
            !launch::alive(ranks[0])
        }),
        "rank 0 (pid {}) outlived mpirun",
        ranks[0]
    );
    let saved = checkpoint_epoch(&ck);
    assert!(
        saved >= 5 && saved.is_multiple_of(5),
        "checkpoint at epoch {saved}"
    );
    leftovers(&ck);
    resume_two_more(&chunks, &ck);
}

#[test]
fn the_writer_killed_mid_checkpoint_leaves_the_previous_checkpoint_whole() {
    let Some((dir, chunks)) = cora_in_two_parts() else {
        return;
    };
    let ck = dir.path().join("ck");
    // A checkpoint every epoch: many writes to catch one in the middle of.
    let mut job = endless_training(&chunks, &ck, 1);
    let writer = job.ranks(2)[0];
    // Kill rank 0 (the one that writes) as soon as a started temporary file has bytes in it.
    let mut before = 0;
    let caught = wait_for(SHORT, Duration::from_micros(200), || {
        let writing = std::fs::read_dir(&ck).unwrap().flatten().any(|e| {
            e.file_name().to_string_lossy().contains(".tmp-")
                && e.metadata().is_ok_and(|m| m.len() > 0)
        });
        if writing {
            kill9(writer);
            before = checkpoint_epoch(&ck);
        }
        writing || job.finished().is_some()
    });
    assert!(
        caught && before > 0,
        "never saw a checkpoint being written: {}",
        job.stderr()
    );
    ends_non_zero(&mut job, "rank 0 was killed while writing a checkpoint");
    // The checkpoint under the final name is a whole one (the kill may rarely land just
    // after the rename: then it is the new one and no temporary is left).
    let after = checkpoint_epoch(&ck);
    assert!(
        after == before || after == before + 1,
        "{before} -> {after}"
    );
    // Whatever the killed writer had written is only under its temporary name (complete or
    // not: the kill may land between the last write and the rename).
    let left = leftovers(&ck);
    eprintln!("checkpoint of epoch {after} kept; temporaries left: {left:?}");
    resume_two_more(&chunks, &ck);
    // The resumed run's first checkpoint write removed the killed writer's temporary.
    assert_eq!(leftovers(&ck), Vec::<String>::new());
}

/// Both ranks' stderr carry `message` (their lines may interleave, so it is counted).
fn every_rank_says(out: &Output, message: &str) {
    assert!(!out.status.success(), "the job succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches(message).count(),
        2,
        "each of the 2 ranks should say {message:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn chunks_of_two_partition_runs_are_refused_by_every_rank() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    partition(&cora, 2, &a, &["--seed", "1"]);
    partition(&cora, 2, &b, &["--seed", "2"]);
    let fingerprint = |d: &Path| {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("manifest.json")).unwrap()).unwrap();
        m["fingerprint"].as_str().unwrap().to_owned()
    };
    let (fa, fb) = (fingerprint(&a), fingerprint(&b));
    assert_ne!(fa, fb, "two seeds, one partition");

    // 1. One directory whose part 1 was copied from the other run: the manifest catches it.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    for e in std::fs::read_dir(&a).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), mixed.join(e.file_name())).unwrap();
    }
    std::fs::copy(b.join("part-00001.chunk"), mixed.join("part-00001.chunk")).unwrap();
    let t = Instant::now();
    let out = train(2, &["--chunks", s(&mixed), "--epochs", "2"]);
    every_rank_says(
        &out,
        &format!("fingerprint {fb} is not the directory's {fa}: the chunk belongs to another partition run"),
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );

    // 2. Each rank reads its own, self-consistent directory (hosts without a shared file
    //    system, one holding a stale copy): only the ranks' agreement can see it.
    let per_rank = format!("{}/rank", dir.path().display());
    std::fs::rename(&a, format!("{per_rank}0")).unwrap();
    std::fs::rename(&b, format!("{per_rank}1")).unwrap();
    let mut cmd = mpirun(2);
    cmd.args([
        "sh",
        "-c",
        r#"exec "$0" train --chunks "$1$OMPI_COMM_WORLD_RANK" --epochs 2"#,
    ])
    .args([BIN, &per_rank]);
    let t = Instant::now();
    let out = launch::run(cmd, SHORT);
    every_rank_says(
        &out,
        &format!("rank 1's chunk belongs to another partition run than rank 0's (fingerprint {fb} vs {fa})"),
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
}

/// Cora with a NaN (node 1234, feature 7: part 0 of a contiguous split) and an infinity (node
/// 2000, feature 3: part 1), partitioned into 2 chunks by the library, as a producer of chunk
/// files other than `distspmm partition` (whose graph readers refuse such values) might.
fn cora_with_non_finite_features(cora: &Path, out: &Path) {
    use distspmm_prep::partition::Method;
    use distspmm_prep::prep::{run_graph, PrepConfig};

    let mut g = distspmm_prep::graph::load(cora).unwrap();
    let f = g.features.as_mut().unwrap();
    f.data[1234 * f.dim + 7] = f32::NAN;
    f.data[2000 * f.dim + 3] = f32::INFINITY;
    let config = PrepConfig {
        method: Method::Contiguous,
        ..PrepConfig::new(cora, 2, out)
    };
    run_graph(&config, g, &|_| {}).unwrap();
}

#[test]
fn non_finite_features_fail_naming_node_and_feature_or_are_zeroed_with_warn() {
    let (Some(cora), true) = (cora(), mpirun_available()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("c");
    cora_with_non_finite_features(&cora, &chunks);
    let c = s(&chunks);

    let out = train(2, &["--chunks", c, "--epochs", "3"]);
    // Both ranks fail with rank 0's finding (the lowest failing rank's message).
    every_rank_says(&out, "rank 0 of 2: in ");
    every_rank_says(
        &out,
        "feature 7 of node 1234 is NaN; clean the input, or pass --on-nonfinite warn",
    );

    let out = train(
        2,
        &[
            "--chunks",
            c,
            "--epochs",
            "3",
            "--on-nonfinite",
            "warn",
            "--json",
        ],
    );
    let sum = summary(&out);
    assert_eq!(sum["epochs"].as_u64(), Some(3));
    assert!(sum["final_loss"].as_f64().is_some_and(f64::is_finite));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for finding in [
        "feature 7 of node 1234 is NaN",
        "feature 3 of node 2000 is inf",
    ] {
        assert!(
            stderr.contains(finding) && stderr.contains("replacing them by 0"),
            "the warning {finding:?} is missing: {stderr}"
        );
    }
}

/// With bf16 messages the blown-up activations cross ranks as bf16 (NaN and ±Inf kept as
/// such): the non-finite check still stops the run at the same epoch on every rank.
#[test]
fn a_non_finite_value_that_crosses_the_wire_in_bf16_still_stops_training() {
    let Some((_dir, chunks)) = cora_in_two_parts() else {
        return;
    };
    let out = train(
        2,
        &[
            "--chunks",
            s(&chunks),
            "--epochs",
            "4",
            "--lr",
            "1e30",
            "--comm-precision",
            "bf16",
        ],
    );
    every_rank_says(
        &out,
        "a gradient became NaN or infinite at epoch 2 (training loss NaN)",
    );
}

#[test]
fn a_gradient_blown_up_by_a_huge_learning_rate_fails_or_is_skipped_with_warn() {
    let Some((_dir, chunks)) = cora_in_two_parts() else {
        return;
    };
    let c = s(&chunks);
    // Adam's first step moves every weight by about --lr: 1e30 overflows the second epoch's
    // forward pass, whose loss and gradient are then NaN.
    let out = train(2, &["--chunks", c, "--epochs", "4", "--lr", "1e30"]);
    every_rank_says(
        &out,
        "a gradient became NaN or infinite at epoch 2 (training loss NaN)",
    );
    every_rank_says(&out, "pass --on-nonfinite warn to skip such updates");

    let out = train(
        2,
        &[
            "--chunks",
            c,
            "--epochs",
            "4",
            "--lr",
            "1e30",
            "--on-nonfinite",
            "warn",
            "--json",
        ],
    );
    let sum = summary(&out);
    assert_eq!(sum["epochs"].as_u64(), Some(4));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("skipping this update").count(),
        1,
        "warned once (rank 0): {stderr}"
    );
    assert!(
        stderr.contains("3 of 4 updates were skipped"),
        "the count of skipped updates: {stderr}"
    );
}
