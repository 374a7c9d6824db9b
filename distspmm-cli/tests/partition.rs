//! `distspmm partition` and `distspmm inspect` end to end: Cora at P = 2, 4, 8, overwrite rules,
//! partition map reuse, P > N, and inspect catching corrupted or foreign chunks.

mod launch;

use std::path::{Path, PathBuf};

use launch::{cora, distspmm, fails, ok, one_json, s};

/// `partition --input G --parts P --out DIR` followed by `extra`.
fn partition<'a>(g: &'a Path, parts: &'a str, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "partition",
        "--input",
        s(g),
        "--parts",
        parts,
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    args
}

/// A 12-node graph: two 6-cycles joined by one edge, as an edge list.
fn small_graph(dir: &Path) -> PathBuf {
    let mut text = String::from("# src dst\n");
    for base in [0, 6] {
        for i in 0..6 {
            text.push_str(&format!("{} {}\n", base + i, base + (i + 1) % 6));
            text.push_str(&format!("{} {}\n", base + (i + 1) % 6, base + i));
        }
    }
    text.push_str("0 6\n6 0\n");
    let path = dir.join("small.txt");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn cora_end_to_end_at_2_4_8_parts() {
    let Some(cora) = cora() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for parts in [2u32, 4, 8] {
        let out = tmp.path().join(format!("cora-{parts}"));
        let p = parts.to_string();
        // The default method where the build has it (KaMinPar), METIS otherwise.
        let method: &[&str] = if cfg!(feature = "kaminpar") {
            &["--json"]
        } else {
            &["--json", "--method", "metis"]
        };
        let v = one_json(&ok(&partition(&cora, &p, &out, method)));
        assert_eq!(v["parts"], parts);
        assert_eq!(v["nodes"], 2708);
        assert_eq!(v["edges"], 10556);
        let cut = v["edge_cut"].as_u64().unwrap();
        assert!(cut > 0 && cut < 10556 / 2, "edge cut {cut}");
        let imbalance = v["max_imbalance"].as_f64().unwrap();
        assert!((1.0..=1.05).contains(&imbalance), "imbalance {imbalance}");
        assert!(v["halo_rows_max"].as_u64().unwrap() > 0);
        assert!(v["seconds"].as_f64().unwrap() > 0.0);

        let report = one_json(&ok(&["inspect", s(&out), "--json"]));
        assert_eq!(report["valid"], true);
        assert_eq!(report["parts"], parts);
        assert_eq!(report["edge_cut"], cut);
        assert_eq!(report["feature_dim"], 1433);
        assert_eq!(report["classes"], 7);
        let chunks = report["chunks"].as_array().unwrap();
        let nodes: u64 = chunks.iter().map(|c| c["nodes"].as_u64().unwrap()).sum();
        let nnz: u64 = chunks.iter().map(|c| c["nnz"].as_u64().unwrap()).sum();
        assert_eq!(nodes, 2708);
        assert_eq!(nnz, report["nnz"].as_u64().unwrap());
        let summary = ok(&["inspect", s(&out.join("part-00000.chunk"))]);
        assert!(summary.contains("valid chunk"), "{summary}");
        // The non-zero imbalance reported is the chunks' own.
        let nnz_max = chunks
            .iter()
            .map(|c| c["nnz"].as_u64().unwrap())
            .max()
            .unwrap();
        let expected = nnz_max as f64 * f64::from(parts) / nnz as f64;
        let reported = v["nnz_imbalance"].as_f64().unwrap();
        assert!(
            (reported - expected).abs() < 1e-9,
            "{reported} vs {expected}"
        );

        // Balancing non-zeros instead of nodes: the work per part within METIS's tolerance,
        // recorded in the method (a different partition run). METIS: KaMinPar's bound on
        // weighted nodes is looser by up to the heaviest node (tested in distspmm-prep).
        let out_nnz = tmp.path().join(format!("cora-{parts}-nnz"));
        let w = one_json(&ok(&partition(
            &cora,
            &p,
            &out_nnz,
            &["--json", "--balance", "nnz", "--method", "metis"],
        )));
        let work = w["nnz_imbalance"].as_f64().unwrap();
        assert!(work <= 1.05, "nnz imbalance {work} with --balance nnz");
        let manifest = serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(out_nnz.join("manifest.json")).unwrap(),
        )
        .unwrap();
        assert!(
            manifest["partition_method"]
                .as_str()
                .unwrap()
                .ends_with(":balance=nnz"),
            "{manifest}"
        );
    }
}

#[cfg(feature = "kaminpar")]
#[test]
fn refuses_to_overwrite_another_partition_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let g = small_graph(tmp.path());
    let out = tmp.path().join("chunks");
    let first = ok(&partition(&g, "2", &out, &["--threads", "1"]));
    assert!(first.contains("2 parts"), "{first}");
    // The same partition again is fine (the default repeats itself on one thread).
    ok(&partition(&g, "2", &out, &["--json", "--threads", "1"]));
    let err = fails(&partition(&g, "3", &out, &[]));
    assert!(
        err.contains("different partition") && err.contains("--force"),
        "{err}"
    );
    let still = one_json(&ok(&["inspect", s(&out), "--json"]));
    assert_eq!(still["parts"], 2);
    ok(&partition(&g, "3", &out, &["--force"]));
    let now = one_json(&ok(&["inspect", s(&out), "--json"]));
    assert_eq!(now["parts"], 3);
}

#[test]
fn partition_map_is_reused_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let g = small_graph(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    ok(&partition(
        &g,
        "3",
        &a,
        &["--method", "random", "--seed", "7"],
    ));
    let map = a.join("partition.map");
    ok(&partition(
        &g,
        "3",
        &b,
        &["--partition-map", s(&map), "--normalize", "row"],
    ));
    let (ra, rb) = (
        one_json(&ok(&["inspect", s(&a), "--json"])),
        one_json(&ok(&["inspect", s(&b), "--json"])),
    );
    assert_eq!(ra["fingerprint"], rb["fingerprint"]);
    assert_eq!(rb["partition_method"], "random:seed=7");
    assert_eq!(rb["normalization"], "row");
    let err = fails(&partition(&g, "2", &b, &["--partition-map", s(&map)]));
    assert!(err.contains("--parts 3"), "{err}");
}

#[test]
fn more_parts_than_nodes_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let g = small_graph(tmp.path());
    let out = tmp.path().join("chunks");
    let err = fails(&partition(&g, "13", &out, &["--method", "metis"]));
    assert!(err.contains("at most 12 parts"), "{err}");
    assert!(!out.join("manifest.json").exists());
    ok(&partition(&g, "12", &out, &["--json", "--method", "metis"]));
}

#[test]
fn inspect_rejects_corrupted_and_foreign_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let g = small_graph(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    ok(&partition(&g, "3", &a, &["--method", "metis"]));
    ok(&partition(&g, "3", &b, &["--method", "contiguous"]));
    let victim = a.join("part-00002.chunk");
    let original = std::fs::read(&victim).unwrap();

    // A flipped byte in the data.
    let mut bytes = original.clone();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x01;
    std::fs::write(&victim, &bytes).unwrap();
    let err = fails(&["inspect", s(&a)]);
    assert!(err.contains("part-00002.chunk"), "{err}");
    let err = fails(&["inspect", s(&victim)]);
    assert!(err.contains("part-00002.chunk"), "{err}");
    let out = distspmm(&["inspect", s(&a), "--json"]);
    assert!(!out.status.success());
    let v = one_json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(v["valid"], false);

    // A chunk of another partition run mixed in.
    std::fs::copy(b.join("part-00002.chunk"), &victim).unwrap();
    let err = fails(&["inspect", s(&a)]);
    assert!(
        err.contains("part-00002.chunk") && err.contains("fingerprint"),
        "{err}"
    );
    // On its own it is a valid chunk.
    ok(&["inspect", s(&victim)]);

    std::fs::write(&victim, &original).unwrap();
    ok(&["inspect", s(&a)]);
}

#[cfg(feature = "kaminpar")]
#[test]
fn kaminpar_partitions_cora_and_the_run_reports_its_phases() {
    let Some(cora) = cora() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cora-kaminpar");
    let v = one_json(&ok(&partition(
        &cora,
        "4",
        &out,
        &[
            "--json",
            "--method",
            "kaminpar",
            "--threads",
            "1",
            "--seed",
            "3",
        ],
    )));
    assert!(
        v["method"]
            .as_str()
            .unwrap()
            .starts_with("kaminpar:seed=3:"),
        "{v}"
    );
    let cut = v["edge_cut"].as_u64().unwrap();
    assert!(cut > 0 && cut < 10556 / 4, "edge cut {cut}");
    let imbalance = v["max_imbalance"].as_f64().unwrap();
    assert!((1.0..=1.05).contains(&imbalance), "imbalance {imbalance}");
    let phases = v["phase_seconds"].as_object().unwrap();
    for phase in ["load", "partition", "normalise", "halo", "build", "write"] {
        assert!(phases[phase].as_f64().unwrap() >= 0.0, "{phase} in {v}");
    }
    let peak = v["peak_rss_bytes"].as_u64().unwrap();
    // Cora's features alone are 2708 × 1433 f32 (15.5 MB).
    assert!(peak > 15_000_000, "peak RSS {peak}");
    let report = one_json(&ok(&["inspect", s(&out), "--json"]));
    assert_eq!(report["valid"], true);
    assert_eq!(report["edge_cut"], cut);

    // One thread and the same seed: the same partition (the same fingerprint), so rerunning
    // into the directory needs no --force.
    ok(&partition(
        &cora,
        "4",
        &out,
        &["--method", "kaminpar", "--threads", "1", "--seed", "3"],
    ));
    // A tolerance tighter than KaMinPar's 3% is refused with the way out.
    let err = fails(&partition(
        &cora,
        "4",
        &out,
        &["--method", "kaminpar", "--imbalance", "1.01"],
    ));
    assert!(err.contains("--method metis"), "{err}");
}

/// `auto` is the default method (METIS for this graph's even degrees, named in the partition);
/// options it cannot honour are refused by name.
#[cfg(feature = "kaminpar")]
#[test]
fn auto_is_the_default_and_metis_only_options_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    let g = small_graph(tmp.path());
    let out = tmp.path().join("out");
    let v = one_json(&ok(&partition(&g, "2", &out, &["--json"])));
    assert!(v["method"].as_str().unwrap().starts_with("metis:"), "{v}");
    assert_eq!(
        v["edge_cut"], 1,
        "the two 6-cycles are split at their bridge: {v}"
    );
    let err = fails(&partition(
        &g,
        "2",
        &out,
        &["--objective", "vol", "--force"],
    ));
    assert!(err.contains("--method metis"), "{err}");
    let err = fails(&partition(
        &g,
        "2",
        &out,
        &["--method", "metis", "--threads", "2", "--force"],
    ));
    assert!(
        err.contains("--threads") && err.contains("kaminpar"),
        "{err}"
    );
    ok(&partition(
        &g,
        "2",
        &out,
        &["--method", "metis", "--objective", "vol", "--force"],
    ));
}

/// A rerun whose KaMinPar partition (on more than one thread) differs from the directory's
/// says why and how to get a reproducible one.
#[cfg(feature = "kaminpar")]
#[test]
fn a_racy_rerun_says_to_use_one_thread() {
    let Some(cora) = cora() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cora");
    // Another run's partition is in the directory (a random one, which KaMinPar never gives).
    ok(&partition(&cora, "4", &out, &["--method", "random"]));
    let err = fails(&partition(&cora, "4", &out, &["--threads", "2"]));
    assert!(
        err.contains("different partition") && err.contains("--threads 1"),
        "{err}"
    );
    let err = fails(&partition(&cora, "4", &out, &["--threads", "1"]));
    assert!(
        err.contains("different partition") && !err.contains("--threads 1"),
        "{err}"
    );
}

#[test]
fn the_run_reports_its_phases_and_releases_nothing_it_reports() {
    let Some(cora) = cora() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cora-phases");
    let v = one_json(&ok(&partition(
        &cora,
        "2",
        &out,
        &["--json", "--method", "metis"],
    )));
    let phases = v["phase_seconds"].as_object().unwrap();
    for phase in ["load", "partition", "normalise", "halo", "build", "write"] {
        assert!(phases[phase].as_f64().unwrap() >= 0.0, "{phase} in {v}");
        assert!(v["phase_peak_rss_bytes"][phase].as_u64().is_some(), "{v}");
    }
    let peak = v["peak_rss_bytes"].as_u64().unwrap();
    // Cora's features alone are 2708 × 1433 f32 (15.5 MB).
    assert!(peak > 15_000_000, "peak RSS {peak}");
    // The edge arrays are released before the chunks are built; the manifest still counts them.
    assert_eq!(v["edges"], 10556);
    let report = one_json(&ok(&["inspect", s(&out), "--json"]));
    assert_eq!(report["valid"], true);
    let text = ok(&partition(&cora, "2", &out, &["--method", "metis"]));
    assert!(text.contains("phases: load "), "{text}");
}

#[cfg(not(feature = "kaminpar"))]
#[test]
fn kaminpar_without_the_feature_says_how_to_get_it() {
    let tmp = tempfile::tempdir().unwrap();
    let g = small_graph(tmp.path());
    let out = tmp.path().join("out");
    let err = fails(&partition(&g, "2", &out, &["--method", "kaminpar"]));
    assert!(err.contains("--features kaminpar"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn bounded_build_writes_the_in_memory_chunks_and_verify_passes() {
    let Some(cora) = cora() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (mem, bounded) = (tmp.path().join("mem"), tmp.path().join("bounded"));
    let a = one_json(&ok(&partition(
        &cora,
        "3",
        &mem,
        &["--json", "--method", "metis", "--build", "in-memory"],
    )));
    assert_eq!(a["build"], "in-memory");
    let b = one_json(&ok(&partition(
        &cora,
        "3",
        &bounded,
        &["--json", "--method", "metis", "--build", "bounded"],
    )));
    assert_eq!(b["build"], "bounded");
    for key in ["nnz", "edges", "edge_cut", "halo_rows_max"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    for phase in ["load", "partition", "normalise", "halo", "build", "write"] {
        assert!(
            b["phase_seconds"][phase].as_f64().unwrap() >= 0.0,
            "{phase} in {b}"
        );
    }
    // The same chunk files, byte for byte, and no work directory left beside them.
    for p in 0..3 {
        let name = format!("part-{p:05}.chunk");
        let (x, y) = (
            std::fs::read(mem.join(&name)).unwrap(),
            std::fs::read(bounded.join(&name)).unwrap(),
        );
        assert!(x == y, "{name} differs");
    }
    let left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("buckets") || n.contains("staging"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let v = one_json(&ok(&[
        "verify",
        "--chunks",
        s(&bounded),
        "--local-ranks",
        "3",
        "--json",
    ]));
    assert_eq!(v["pass"], true, "{v}");
    let report = one_json(&ok(&["inspect", s(&bounded), "--json"]));
    assert_eq!(report["valid"], true);
    // `auto` on a graph this small builds in memory.
    let c = one_json(&ok(&partition(
        &cora,
        "3",
        &mem,
        &["--json", "--method", "metis"],
    )));
    assert_eq!(c["build"], "in-memory");
}
