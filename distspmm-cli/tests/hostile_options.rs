//! Hostile options of the third hardening round: an output path that names an input or an
//! existing file, a FIFO or an oversized file as the hostfile, timeouts and feature counts at
//! the top of `u64`, partitioning options the chosen method (or a saved partition map) would
//! ignore, and a dropout that single precision rounds to 1. Each ends with an error that says
//! what is wrong and what to do — never a panic, a hang, a silent overwrite or an ignored option.

mod launch;

use std::path::{Path, PathBuf};
use std::process::Command;

use launch::{csbm, refused, run_one, s, succeeds};

/// A chunk directory of `graph` in two contiguous parts.
fn chunks(graph: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("chunks");
    succeeds(&[
        "partition",
        "--input",
        s(graph),
        "--parts",
        "2",
        "--method",
        "contiguous",
        "--out",
        s(&out),
    ]);
    out
}

/// `distspmm partition` of `input` into two parts in `out`, `--force` if asked,
/// then `extra`.
fn partition_args<'a>(
    input: &'a Path,
    out: &'a Path,
    force: bool,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "partition",
        "--input",
        s(input),
        "--parts",
        "2",
        "--out",
        s(out),
    ];
    if force {
        args.push("--force");
    }
    args.extend_from_slice(extra);
    args
}

#[test]
fn write_metis_graph_never_replaces_the_input_nor_an_existing_file_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // An edge list: METIS text written over it would lose it.
    let input = dir.join("g.txt");
    let edges = "0 1\n1 2\n2 3\n3 0\n0 2\n4 5\n5 6\n6 4\n";
    std::fs::write(&input, edges).unwrap();
    let out = dir.join("chunks");
    let symlink = dir.join("link.graph");
    std::os::unix::fs::symlink(&input, &symlink).unwrap();
    let hard = dir.join("hard.txt");
    std::fs::hard_link(&input, &hard).unwrap();
    let dotted = dir.join(".").join("g.txt");
    for target in [&input, &symlink, &hard, &dotted] {
        for force in [false, true] {
            let extra = ["--method", "contiguous", "--write-metis-graph", s(target)];
            let err = refused(&partition_args(&input, &out, force, &extra), 1);
            assert!(
                err.contains("--write-metis-graph") && err.contains("--input"),
                "{} (force {force}): {err}",
                target.display()
            );
            assert_eq!(std::fs::read_to_string(&input).unwrap(), edges);
        }
    }

    // Nor the partition map the run reads.
    succeeds(&partition_args(
        &input,
        &out,
        false,
        &["--method", "contiguous"],
    ));
    let map = dir.join("saved.map");
    std::fs::copy(out.join("partition.map"), &map).unwrap();
    let before = std::fs::read(&map).unwrap();
    let extra = ["--partition-map", s(&map), "--write-metis-graph", s(&map)];
    let err = refused(&partition_args(&input, &out, true, &extra), 1);
    assert!(err.contains("--partition-map"), "{err}");
    assert_eq!(std::fs::read(&map).unwrap(), before);

    // An existing file of other contents is replaced only with --force (the rule of every
    // output file), and the same contents again are left alone without it.
    let metis = dir.join("g.graph");
    std::fs::write(&metis, "precious\n").unwrap();
    let extra = ["--method", "contiguous", "--write-metis-graph", s(&metis)];
    let err = refused(
        &partition_args(&input, &dir.join("fresh"), false, &extra),
        1,
    );
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&metis).unwrap(), "precious\n");
    succeeds(&partition_args(&input, &out, true, &extra));
    let written = std::fs::read_to_string(&metis).unwrap();
    assert!(written.starts_with("7 "), "{written}");
    succeeds(&partition_args(&input, &dir.join("again"), false, &extra));
    assert_eq!(std::fs::read_to_string(&metis).unwrap(), written);
    // No candidate or temporary file is left beside it.
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("candidate") || n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn doctor_refuses_a_fifo_or_an_oversized_hostfile_without_reading_it() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("hosts");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let big = tmp.path().join("big-hosts");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((16 << 20) + 1)
        .unwrap();
    for (hostfile, says) in [(&fifo, "FIFO"), (&big, "16 MiB")] {
        // Under the deadline of `run_one`: reading a FIFO without a writer would block forever.
        let out = run_one(&[
            "doctor",
            "--hostfile",
            s(hostfile),
            "--launch-timeout",
            "20",
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let check = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "hostfile")
            .unwrap_or_else(|| panic!("no hostfile check: {stdout}"));
        assert_eq!(check["status"], "fail", "{check}");
        let detail = check["detail"].as_str().unwrap();
        assert!(
            detail.contains(says) && detail.contains(s(hostfile)),
            "{detail}"
        );
    }
}

#[test]
fn doctor_timeouts_are_bounded_on_the_command_line() {
    for (option, value) in [
        ("--launch-timeout", "18446744073709551615"),
        ("--launch-timeout", "0"),
        ("--connect-timeout", "18446744073709551615"),
        ("--connect-timeout", "0"),
    ] {
        let err = refused(&["doctor", option, value], 2);
        assert!(
            err.contains(option) && err.contains("1..=86400"),
            "{option} {value}: {err}"
        );
    }
}

#[test]
fn partitioning_options_a_method_or_a_saved_map_would_ignore_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 0);
    let out = tmp.path().join("chunks");
    for method in ["contiguous", "random"] {
        let err = refused(
            &[
                "partition",
                "--input",
                s(&graph),
                "--parts",
                "2",
                "--out",
                s(&out),
                "--method",
                method,
                "--balance",
                "nnz",
            ],
            1,
        );
        assert!(
            err.contains("--balance nnz") && err.contains("--method kaminpar"),
            "{method}: {err}"
        );
        let err = refused(
            &[
                "plan",
                "--input",
                s(&graph),
                "--parts",
                "2",
                "--method",
                method,
                "--balance",
                "nnz",
            ],
            1,
        );
        assert!(err.contains("--balance nnz"), "plan {method}: {err}");
        let err = refused(
            &[
                "partition",
                "--input",
                s(&graph),
                "--parts",
                "2",
                "--out",
                s(&out),
                "--method",
                method,
                "--imbalance",
                "1.1",
            ],
            1,
        );
        assert!(err.contains("drop --imbalance"), "{method}: {err}");
    }
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    // What each method does honour still runs.
    let extra = ["--method", "contiguous", "--balance", "nodes"];
    succeeds(&partition_args(&graph, &out, false, &extra));

    let map = tmp.path().join("saved.map");
    std::fs::copy(out.join("partition.map"), &map).unwrap();
    let with_map = |extra: &[&str]| {
        let mut args = vec![
            "partition",
            "--input",
            s(&graph),
            "--parts",
            "2",
            "--out",
            s(&out),
            "--force",
            "--partition-map",
            s(&map),
        ];
        args.extend_from_slice(extra);
        run_one(&args)
    };
    for extra in [
        &["--method", "metis"][..],
        &["--balance", "nnz"],
        &["--method", "kaminpar", "--seed", "3"],
    ] {
        let out = with_map(extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains("--partition-map") && err.contains(extra[0]) && err.contains("drop"),
            "{extra:?}: {err}"
        );
    }
    let out = with_map(&["--normalize", "row"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plan_refuses_a_feature_count_whose_bytes_would_wrap() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 0);
    let dir = chunks(&graph, tmp.path());
    for features in ["4611686018427387904", "18446744073709551615"] {
        let err = refused(&["plan", "--chunks", s(&dir), "--features", features], 1);
        assert!(
            err.contains("--features") && err.contains("too large") && err.contains("2^64"),
            "{features}: {err}"
        );
    }
    // The largest count it names is accepted, and its figures are not 0 B.
    let err = refused(
        &[
            "plan",
            "--chunks",
            s(&dir),
            "--features",
            "4611686018427387904",
        ],
        1,
    );
    let most = err
        .trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .trim_end_matches('.')
        .to_owned();
    let json = succeeds(&["plan", "--chunks", s(&dir), "--features", &most, "--json"]);
    let plan: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    for schedule in plan["schedules"].as_array().unwrap() {
        assert!(
            schedule["max_recv_bytes_per_rank"].as_u64().unwrap() > 0,
            "{schedule}"
        );
    }
    let over = (most.parse::<u64>().unwrap() + 1).to_string();
    refused(&["plan", "--chunks", s(&dir), "--features", &over], 1);
}

#[test]
fn a_dropout_that_rounds_to_one_is_named_as_given() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 0);
    let dir = chunks(&graph, tmp.path());
    let err = refused(
        &["train", "--chunks", s(&dir), "--dropout", "0.99999999"],
        2,
    );
    assert!(
        err.contains("0.99999999") && err.contains("rounds to 1") && err.contains("0.99999994"),
        "{err}"
    );
    let err = refused(&["train", "--chunks", s(&dir), "--dropout", "1.5"], 2);
    assert!(err.contains("got 1.5"), "{err}");
    let err = refused(&["train", "--chunks", s(&dir), "--lr", "1e-50"], 2);
    assert!(
        err.contains("1e-50") && err.contains("rounds to 0"),
        "{err}"
    );
}
