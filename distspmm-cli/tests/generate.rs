//! `distspmm generate`: files load back, defaults work, reruns are idempotent, overwrites need
//! `--force`.

mod launch;

use distspmm_prep::graph::load;
use launch::{distspmm, ok, s};

#[test]
fn csbm_defaults_write_a_trainable_graph() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.npz");
    let summary = ok(&["generate", "csbm", "--out", s(&out)]);
    assert!(summary.starts_with("wrote "), "{summary}");
    let g = load(&out).unwrap();
    assert_eq!(
        (g.num_nodes, g.feature_dim(), g.num_classes()),
        (3000, 64, 5)
    );
    assert!(g.train_mask.is_some() && g.val_mask.is_some() && g.test_mask.is_some());
    // Same parameters again: the file is left as it is, and the run succeeds.
    let again = ok(&["generate", "csbm", "--out", s(&out)]);
    assert!(again.starts_with("unchanged"), "{again}");
}

#[test]
fn rmat_json_line_describes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npz");
    let line = ok(&[
        "generate",
        "rmat",
        "--scale",
        "10",
        "--edge-factor",
        "8",
        "--seed",
        "3",
        "--out",
        s(&out),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    let g = load(&out).unwrap();
    assert_eq!(v["generator"], "rmat");
    assert_eq!(v["nodes"], 1024);
    assert_eq!(v["edges"], g.num_edges() as u64);
    assert_eq!(v["bytes"], std::fs::metadata(&out).unwrap().len());
    assert_eq!(v["written"], true);
    assert_eq!(line.trim().lines().count(), 1);
}

#[test]
fn directed_rmat_is_not_symmetric_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.npz");
    let line = ok(&[
        "generate",
        "rmat",
        "--scale",
        "9",
        "--directed",
        "--out",
        s(&out),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["directed"], true);
    let g = load(&out).unwrap();
    assert_eq!(v["edges"], g.num_edges() as u64);
    let edges: std::collections::BTreeSet<(u32, u32)> =
        g.src.iter().copied().zip(g.dst.iter().copied()).collect();
    let one_way = edges
        .iter()
        .filter(|(u, v)| !edges.contains(&(*v, *u)))
        .count();
    assert!(
        one_way > edges.len() / 2,
        "{one_way} of {} edges one-way",
        edges.len()
    );
    let text = ok(&[
        "generate",
        "rmat",
        "--scale",
        "9",
        "--directed",
        "--out",
        s(&out),
    ]);
    assert!(
        text.starts_with("unchanged") && !text.contains("undirected"),
        "{text}"
    );
}

#[test]
fn a_different_graph_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npz");
    let o = s(&out);
    ok(&[
        "generate", "rmat", "--scale", "8", "--seed", "1", "--out", o,
    ]);
    let before = std::fs::read(&out).unwrap();
    let refused = distspmm(&[
        "generate", "rmat", "--scale", "8", "--seed", "2", "--out", o,
    ]);
    assert!(!refused.status.success());
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("--force"), "{msg}");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "the old file is untouched"
    );
    ok(&[
        "generate", "rmat", "--scale", "8", "--seed", "2", "--out", o, "--force",
    ]);
    assert_ne!(std::fs::read(&out).unwrap(), before);
    // Nothing but the output is left in the directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn bad_parameters_are_plain_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.npz");
    for args in [
        &["generate", "csbm", "--homophily", "1.5", "--out", s(&out)][..],
        &["generate", "rmat", "--scale", "40", "--out", s(&out)],
        &["generate", "csbm", "--out", s(&dir.path().join("g.txt"))],
    ] {
        let o = distspmm(args);
        assert!(!o.status.success(), "{args:?}");
        let msg = String::from_utf8_lossy(&o.stderr);
        assert!(
            msg.starts_with("error: ") && !msg.contains("panicked"),
            "{msg}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // An unwritable destination: the reason is said once, with the path.
    let missing = dir.path().join("no/such/dir/g.npz");
    let o = distspmm(&["generate", "rmat", "--scale", "4", "--out", s(&missing)]);
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && msg.contains("g.npz"), "{msg}");
    assert_eq!(msg.matches("os error").count(), 1, "{msg}");
    // A file where the destination's directory belongs: no warning about work directories
    // (there are none to sweep there), only the error.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let o = distspmm(&[
        "generate",
        "rmat",
        "--scale",
        "4",
        "--out",
        s(&file.join("g.npz")),
    ]);
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && msg.starts_with("error: ") && msg.contains("g.npz"),
        "{msg}"
    );
    assert_eq!(msg.matches("os error").count(), 1, "{msg}");
}

/// A graph larger than `--bucket-keys` goes through sorted bucket files beside the output: the
/// file is byte-identical to the in-memory one and the work directory is gone afterwards.
#[test]
fn rmat_through_bucket_files_is_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.npz"), dir.path().join("b.npz"));
    ok(&["generate", "rmat", "--scale", "12", "--out", s(&a)]);
    ok(&[
        "generate",
        "rmat",
        "--scale",
        "12",
        "--bucket-keys",
        "5000",
        "--out",
        s(&b),
    ]);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}
