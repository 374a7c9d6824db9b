//! The distributed commands end to end: `verify` under real `mpirun` at 2–4 ranks on Cora and
//! an RMAT graph, `plan`'s predicted bytes against what `bench dist` measures, chunks for the
//! wrong rank count failing every rank quickly, and the runs without MPI (`--local-ranks`, P=1).
//!
//! Every `mpirun` is killed after 120 s, so a hang fails the test instead of stalling it. The
//! MPI tests are skipped (with a message) where `mpirun` is missing, unless CI=true.

mod launch;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use launch::{cora, distspmm, mpirun_available, ok, one_json, s};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One `mpirun` at a time: the machine has few cores and each job oversubscribes them.
static MPI: Mutex<()> = Mutex::new(());

const LIMIT: Duration = Duration::from_secs(120);

/// `mpirun -n ranks distspmm args…`, killed after [`LIMIT`]; returns its output and run time.
fn mpirun(ranks: usize, args: &[&str]) -> (Output, Duration) {
    let _one_at_a_time = MPI.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let mut command = Command::new("mpirun");
    command
        .args(["-n", &ranks.to_string(), "--oversubscribe"])
        .args(["--mca", "btl", "self,vader"])
        .arg(env!("CARGO_BIN_EXE_distspmm"))
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("RAYON_NUM_THREADS", "1");
    let out = test_support::run(&mut command, LIMIT);
    (out, started.elapsed())
}

fn mpirun_ok(ranks: usize, args: &[&str]) -> String {
    let (out, _) = mpirun(ranks, args);
    assert!(
        out.status.success(),
        "mpirun -n {ranks} distspmm {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A small RMAT graph (1024 nodes) in `dir`.
fn rmat(dir: &Path) -> PathBuf {
    let path = dir.join("rmat10.npz");
    ok(&[
        "generate",
        "rmat",
        "--scale",
        "10",
        "--edge-factor",
        "8",
        "--out",
        s(&path),
    ]);
    path
}

/// Partitions `graph` into `parts` parts (the default method, KaMinPar, on one thread so that
/// `plan --input` can repeat it) under `dir`.
fn partition(graph: &Path, parts: usize, dir: &Path) -> PathBuf {
    let out = dir.join(format!(
        "{}-{parts}",
        graph.file_stem().unwrap().to_str().unwrap()
    ));
    ok(&[
        "partition",
        "--input",
        s(graph),
        "--parts",
        &parts.to_string(),
        "--out",
        s(&out),
        "--threads",
        "1",
        "--json",
    ]);
    out
}

fn schedule<'a>(plan: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    plan["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["schedule"] == name)
        .unwrap()
}

#[test]
fn verify_passes_under_mpirun_on_rmat_and_cora() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut graphs = vec![(rmat(tmp.path()), vec![2, 3, 4])];
    graphs.extend(cora().map(|c| (c, vec![2, 4])));
    for (graph, ranks) in graphs {
        for p in ranks {
            let chunks = partition(&graph, p, tmp.path());
            let out = mpirun_ok(
                p,
                &[
                    "verify",
                    "--chunks",
                    s(&chunks),
                    "--features",
                    "8",
                    "--json",
                ],
            );
            let v = one_json(&out);
            assert_eq!(v["pass"], true, "{out}");
            assert_eq!(v["ranks"], p);
            assert_eq!(v["checks"].as_array().unwrap().len(), 4);
        }
    }
}

#[test]
fn plan_predicts_the_bytes_bench_dist_measures() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = rmat(tmp.path());
    for p in [2usize, 3, 4] {
        let chunks = partition(&graph, p, tmp.path());
        let plan = one_json(&ok(&[
            "plan",
            "--chunks",
            s(&chunks),
            "--features",
            "16",
            "--json",
        ]));
        // The dry run from the graph alone (same partitioner, same seed) plans the same.
        let mut from_graph = one_json(&ok(&[
            "plan",
            "--input",
            s(&graph),
            "--parts",
            &p.to_string(),
            "--threads",
            "1",
            "--features",
            "16",
            "--json",
        ]));
        from_graph["source"] = plan["source"].clone();
        assert_eq!(from_graph, plan, "P = {p}");
        for name in ["broadcast", "halo"] {
            let measured = one_json(&mpirun_ok(
                p,
                &[
                    "bench",
                    "dist",
                    "--chunks",
                    s(&chunks),
                    "--features",
                    "16",
                    "--schedule",
                    name,
                    "--reps",
                    "2",
                    "--json",
                ],
            ));
            let predicted = schedule(&plan, name);
            for key in ["max_recv_bytes_per_rank", "max_send_bytes_per_rank"] {
                assert_eq!(measured[key], predicted[key], "P = {p}, {name}, {key}");
            }
            assert_eq!(measured["ranks"], p);
            assert!(measured["seconds"].as_f64().unwrap() > 0.0);
        }
    }
}

/// Messages in bf16 and f16 under `mpirun`: `plan --comm-precision` predicts, per direction,
/// the bytes `bench dist --comm-precision` counts at the transport (half of f32's), and
/// `verify --comm-precision` holds within the format's bound, for both schedules.
#[test]
fn reduced_precision_messages_under_mpirun_are_planned_counted_and_verified() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = rmat(tmp.path());
    let p = 3usize;
    let chunks = partition(&graph, p, tmp.path());
    let mut f32_recv = 0;
    for precision in ["f32", "bf16", "f16"] {
        let plan = one_json(&ok(&[
            "plan",
            "--chunks",
            s(&chunks),
            "--features",
            "16",
            "--comm-precision",
            precision,
            "--json",
        ]));
        assert_eq!(plan["comm_precision"], precision);
        for name in ["broadcast", "halo"] {
            let measured = one_json(&mpirun_ok(
                p,
                &[
                    "bench",
                    "dist",
                    "--chunks",
                    s(&chunks),
                    "--features",
                    "16",
                    "--schedule",
                    name,
                    "--comm-precision",
                    precision,
                    "--reps",
                    "2",
                    "--json",
                ],
            ));
            assert_eq!(measured["comm_precision"], precision);
            let predicted = schedule(&plan, name);
            for key in ["max_recv_bytes_per_rank", "max_send_bytes_per_rank"] {
                assert_eq!(measured[key], predicted[key], "{precision} {name} {key}");
            }
            let ranks = predicted["ranks"].as_array().unwrap();
            let max = |dir: &str, side: &str| {
                ranks
                    .iter()
                    .map(|r| r[dir][side].as_u64().unwrap())
                    .max()
                    .unwrap()
            };
            assert_eq!(
                measured["max_recv_bytes_per_rank_backward"].as_u64(),
                Some(max("backward", "received")),
                "{precision} {name}"
            );
            assert_eq!(
                measured["max_send_bytes_per_rank_backward"].as_u64(),
                Some(max("backward", "sent")),
                "{precision} {name}"
            );
            let recv = measured["max_recv_bytes_per_rank"].as_u64().unwrap();
            if name == "halo" {
                if precision == "f32" {
                    f32_recv = recv;
                } else {
                    assert_eq!(2 * recv, f32_recv, "{precision}: half of f32's bytes");
                }
            }
        }
        let out = mpirun_ok(
            p,
            &[
                "verify",
                "--chunks",
                s(&chunks),
                "--features",
                "8",
                "--comm-precision",
                precision,
                "--json",
            ],
        );
        let v = one_json(&out);
        assert_eq!(v["pass"], true, "{out}");
        assert_eq!(v["comm_precision"], precision);
        if precision != "f32" {
            // The rounding is there (the f32 tolerance alone would not hold)...
            let worst = v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["max_rel_error"].as_f64().unwrap())
                .fold(0f64, f64::max);
            assert!(worst > 1e-5, "{precision}: {out}");
        }
    }
}

#[test]
fn chunks_for_three_parts_under_two_ranks_fail_every_rank_quickly() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let chunks = partition(&rmat(tmp.path()), 3, tmp.path());
    for args in [
        vec!["verify", "--chunks", s(&chunks)],
        vec![
            "bench",
            "dist",
            "--chunks",
            s(&chunks),
            "--features",
            "4",
            "--schedule",
            "halo",
        ],
    ] {
        let (out, took) = mpirun(2, &args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(took < Duration::from_secs(30), "{args:?} took {took:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message = format!(
            "error: chunk directory {}: the chunks were made for 3 parts but 2 ranks were \
             started: run 3 ranks (`mpirun -n 3`) or re-partition with `distspmm partition \
             --parts 2`",
            chunks.display()
        );
        assert_eq!(
            stderr.lines().filter(|l| *l == message).count(),
            2,
            "every rank prints the same message once: {stderr}"
        );
    }
}

#[test]
fn runs_without_mpi_as_threads_or_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = rmat(tmp.path());
    let chunks = partition(&graph, 3, tmp.path());
    let v = one_json(&ok(&[
        "verify",
        "--chunks",
        s(&chunks),
        "--local-ranks",
        "3",
        "--features",
        "5",
        "--json",
    ]));
    assert_eq!(
        (v["pass"].clone(), v["ranks"].clone()),
        (true.into(), 3.into())
    );
    let bench = one_json(&ok(&[
        "bench",
        "dist",
        "--chunks",
        s(&chunks),
        "--local-ranks",
        "3",
        "--features",
        "16",
        "--schedule",
        "halo",
        "--reps",
        "2",
        "--json",
    ]));
    let plan = one_json(&ok(&[
        "plan",
        "--chunks",
        s(&chunks),
        "--features",
        "16",
        "--json",
    ]));
    assert_eq!(
        bench["max_recv_bytes_per_rank"],
        schedule(&plan, "halo")["max_recv_bytes_per_rank"]
    );
    // One part, one process, no launcher.
    let one = partition(&graph, 1, tmp.path());
    let v = one_json(&ok(&["verify", "--chunks", s(&one), "--json"]));
    assert_eq!(v["pass"], true);
    // Three parts, one process: the same message as under mpirun.
    let out = distspmm(&["verify", "--chunks", s(&chunks)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("made for 3 parts but 1 rank was started")
    );
}

#[test]
fn plan_scales_to_many_ranks_and_draws_the_matrix() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = rmat(tmp.path());
    let svg = tmp.path().join("matrix.svg");
    let plan = one_json(&ok(&[
        "plan",
        "--input",
        s(&graph),
        "--parts",
        "1000",
        "--method",
        "random",
        "--features",
        "8",
        "--json",
        "--svg",
        s(&svg),
    ]));
    assert_eq!(plan["parts"], 1000);
    let halo = schedule(&plan, "halo");
    let broadcast = schedule(&plan, "broadcast");
    assert_eq!(halo["ranks"].as_array().unwrap().len(), 1000);
    assert!(
        halo["max_recv_bytes_per_rank"].as_u64() <= broadcast["max_recv_bytes_per_rank"].as_u64()
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.ends_with("</svg>\n"));
    assert!(
        drawn.contains("cells sum 8×8 rank pairs"),
        "1000 ranks are binned"
    );
    // The halo schedule's saving on Cora at P = 2 (target: at most 0.12 of the broadcast's).
    if let Some(cora) = cora() {
        let plan = one_json(&ok(&[
            "plan",
            "--input",
            s(&cora),
            "--parts",
            "2",
            "--features",
            "64",
            "--json",
        ]));
        let ratio = schedule(&plan, "halo")["max_recv_bytes_per_rank"]
            .as_f64()
            .unwrap()
            / schedule(&plan, "broadcast")["max_recv_bytes_per_rank"]
                .as_f64()
                .unwrap();
        assert!(
            ratio <= 0.12,
            "halo/broadcast bytes on Cora at P = 2: {ratio}"
        );
    }
}
