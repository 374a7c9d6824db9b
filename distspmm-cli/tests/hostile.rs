//! Hostile inputs of the second hardening round (issue 16), each as a new user would meet it:
//! concurrent writers of one chunk directory, tiny files that declare huge sizes, special files
//! where chunks or graphs belong, a deleted or replaced `partition.map`, manifests whose checksum
//! is right but whose fields lie, and the messages that used to name the wrong cause. Every
//! failure must be a plain exit status 1 with one message that says what is wrong — never a
//! panic (101), an abort (134) or a hang.

mod launch;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use distspmm_core::chunk::{Manifest, MANIFEST_FILE, PARTITION_MAP_FILE};
use launch::{ok, s};

const BIN: &str = env!("CARGO_BIN_EXE_distspmm");

/// Runs `distspmm ARGS…` (one rayon thread), killed after 60 s.
fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("RAYON_NUM_THREADS", "1");
    launch::run(cmd, Duration::from_secs(60))
}

/// Runs `sh -c SCRIPT` with `$BIN` set to the binary, killed after 60 s.
fn shell(script: &str) -> Output {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .env("BIN", BIN)
        .env("RAYON_NUM_THREADS", "1");
    launch::run(cmd, Duration::from_secs(60))
}

/// The stderr of a run that must end with exit status 1 (an error, not a crash).
fn error_of(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: expected exit status 1, got {:?}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

fn csbm(dir: &Path, name: &str, nodes: usize, seed: u64) -> PathBuf {
    let path = dir.join(name);
    ok(&[
        "generate",
        "csbm",
        "--nodes",
        &nodes.to_string(),
        "--features",
        "8",
        "--classes",
        "3",
        "--avg-degree",
        "6",
        "--seed",
        &seed.to_string(),
        "--out",
        s(&path),
    ]);
    path
}

fn partition(graph: &Path, parts: usize, out: &Path) {
    launch::partition(graph, parts, out, &["--json"]);
}

#[test]
fn concurrent_partitions_into_one_directory_never_mix() {
    let tmp = tempfile::tempdir().unwrap();
    let a = csbm(tmp.path(), "a.npz", 6000, 1);
    let b = csbm(tmp.path(), "b.npz", 6000, 2);
    let dir = tmp.path().join("chunks");
    for trial in 0..4 {
        let start = |graph: &Path| {
            Command::new(BIN)
                .args(["partition", "--input", s(graph), "--parts", "2"])
                .args(["--out", s(&dir), "--force", "--json"])
                .env("RAYON_NUM_THREADS", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (first, second) = (start(&a), start(&b));
        let outs = [
            first.wait_with_output().unwrap(),
            second.wait_with_output().unwrap(),
        ];
        for out in &outs {
            if !out.status.success() {
                let stderr = error_of(out, "the refused run");
                assert!(
                    stderr.contains("another `distspmm partition` is writing")
                        && stderr.contains("wait for it to finish"),
                    "trial {trial}: {stderr}"
                );
            }
        }
        assert!(
            outs.iter().any(|o| o.status.success()),
            "trial {trial}: neither run succeeded"
        );
        // Whichever won, the directory is one run's, whole.
        let inspected = run(&["inspect", s(&dir)]);
        assert!(
            inspected.status.success(),
            "trial {trial}: a mixed directory: {}",
            String::from_utf8_lossy(&inspected.stderr)
        );
        let leftovers: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("staging"))
            .collect();
        assert!(leftovers.is_empty(), "trial {trial}: {leftovers:?}");
    }
}

#[test]
fn tiny_files_that_declare_huge_sizes_are_errors_not_aborts() {
    let tmp = tempfile::tempdir().unwrap();
    // 2·10⁹ nodes for one entry: 77 bytes that used to abort in the allocator.
    let mtx = tmp.path().join("huge.mtx");
    std::fs::write(
        &mtx,
        "%%MatrixMarket matrix coordinate pattern general\n2000000000 2000000000 1\n1 2\n",
    )
    .unwrap();
    for args in [
        vec!["partition", "--input", s(&mtx), "--parts", "2"],
        vec!["plan", "--input", s(&mtx), "--parts", "2"],
        vec!["bench", "spmm", "--input", s(&mtx), "--features", "4"],
    ] {
        let mut full = args.clone();
        let out_dir = tmp.path().join("out");
        if args[0] == "partition" {
            full.extend(["--out", s(&out_dir)]);
        }
        let stderr = error_of(&run(&full), args[0]);
        assert!(
            stderr.contains(
                "the file declares 2000000000 nodes, but its 1 edges reference only nodes below 2"
            ) && stderr.contains("memory is available")
                && stderr.contains("check the node count the file declares"),
            "{args:?}: {stderr}"
        );
    }
    // Generators: the graph asked for is refused before any of it is made.
    for args in [
        vec!["generate", "rmat", "--scale", "31", "--edge-factor", "0"],
        vec!["generate", "csbm", "--features", "100000000"],
    ] {
        let out = tmp.path().join("g.npz");
        let mut full = args.clone();
        full.extend(["--out", s(&out)]);
        let stderr = error_of(&run(&full), args[1]);
        assert!(
            stderr.contains("memory is available") && stderr.contains("lower --"),
            "{args:?}: {stderr}"
        );
        assert!(!out.exists());
    }
    // verify: N × F test matrices.
    let small = csbm(tmp.path(), "small.npz", 300, 3);
    let one = tmp.path().join("one");
    partition(&small, 1, &one);
    let stderr = error_of(
        &run(&["verify", "--chunks", s(&one), "--features", "100000000000"]),
        "verify",
    );
    assert!(stderr.contains("lower --features"), "{stderr}");
}

#[test]
fn local_ranks_check_the_part_count_before_starting_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 400, 4);
    let dir = tmp.path().join("chunks");
    partition(&graph, 2, &dir);
    // Under an address-space limit that 1000 thread stacks do not fit, the part count is
    // checked first, so the answer is the real mistake, not a panic about threads.
    for command in [
        "verify --features 4",
        "bench dist --features 4 --schedule halo",
    ] {
        let out = shell(&format!(
            "ulimit -v 1500000; exec \"$BIN\" {command} --chunks '{}' --local-ranks 1000",
            dir.display()
        ));
        let stderr = error_of(&out, command);
        assert!(
            stderr.contains("was made for 2 parts but 1000 ranks were started"),
            "{command}: {stderr}"
        );
    }
    // A thread the OS refuses with the part count right is an error too
    // (`a_refused_thread_is_an_error_and_the_started_ranks_are_released` in dist-comm: an
    // address-space limit tight enough to refuse thread stacks also fails other allocations,
    // so it cannot be reproduced reliably from here).
}

#[test]
fn special_files_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 5);
    let dir = tmp.path().join("chunks");
    partition(&graph, 2, &dir);
    let chunk = dir.join("part-00001.chunk");
    std::fs::remove_file(&chunk).unwrap();
    let made = Command::new("mkfifo").arg(&chunk).status().unwrap();
    assert!(made.success());
    for args in [vec!["inspect", s(&dir)], vec!["inspect", s(&chunk)]] {
        let stderr = error_of(&run(&args), "inspect of a FIFO");
        assert!(
            stderr.contains("part-00001.chunk")
                && stderr.contains("a FIFO (named pipe), not a regular file"),
            "{args:?}: {stderr}"
        );
    }
    // A directory where a graph file belongs: said so, not "Is a directory" or "No such device".
    let as_dir = tmp.path().join("graph.npz");
    std::fs::create_dir(&as_dir).unwrap();
    let stderr = error_of(
        &run(&[
            "partition",
            "--input",
            s(&as_dir),
            "--parts",
            "2",
            "--out",
            s(&tmp.path().join("o")),
        ]),
        "a directory as the graph",
    );
    assert!(
        stderr.contains("graph.npz") && stderr.contains("a directory, not a regular file"),
        "{stderr}"
    );
}

/// Reseals `dir`'s manifest after `edit`, as a careful hand edit would.
fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut Manifest)) {
    let path = dir.join(MANIFEST_FILE);
    let mut m = Manifest::from_json(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, m.seal().unwrap()).unwrap();
}

#[test]
fn every_command_that_opens_chunks_checks_the_partition_map() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 6);
    let other = csbm(tmp.path(), "h.npz", 300, 7);
    let (dir, other_dir) = (tmp.path().join("chunks"), tmp.path().join("other"));
    partition(&other, 2, &other_dir);
    let map = dir.join(PARTITION_MAP_FILE);
    type Corruption<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let corruptions: [Corruption<'_>; 3] = [
        ("deleted", Box::new(|| std::fs::remove_file(&map).unwrap())),
        (
            "replaced",
            Box::new(|| {
                std::fs::copy(other_dir.join(PARTITION_MAP_FILE), &map).unwrap();
            }),
        ),
        (
            "flipped",
            Box::new(|| {
                let mut bytes = std::fs::read(&map).unwrap();
                let at = bytes.len() - 20;
                bytes[at] ^= 1;
                std::fs::write(&map, bytes).unwrap();
            }),
        ),
    ];
    for (how, corrupt) in &corruptions {
        partition(&graph, 2, &dir);
        corrupt();
        for args in [
            vec!["plan", "--chunks", s(&dir)],
            vec![
                "bench",
                "dist",
                "--chunks",
                s(&dir),
                "--local-ranks",
                "2",
                "--features",
                "4",
                "--schedule",
                "halo",
                "--reps",
                "1",
            ],
            vec!["verify", "--chunks", s(&dir), "--local-ranks", "2"],
            vec!["inspect", s(&dir)],
        ] {
            let stderr = error_of(&run(&args), &format!("{how} map, {}", args[0]));
            assert!(
                stderr.contains("partition.map") && stderr.contains("re-run `distspmm partition`"),
                "{how} map, {args:?}: {stderr}"
            );
        }
    }
}

#[test]
fn inspect_checks_every_manifest_field_against_the_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 8);
    let dir = tmp.path().join("chunks");
    type Edit = (&'static str, Box<dyn Fn(&mut Manifest)>);
    let edits: [Edit; 7] = [
        ("edges", Box::new(|m| m.edges = 3)),
        (
            "normalization",
            Box::new(|m| m.normalization = "row".into()),
        ),
        (
            "normalization",
            Box::new(|m| m.normalization = "sym".into()),
        ),
        (
            "chunk_format_version",
            Box::new(|m| m.chunk_format_version = "1.9".into()),
        ),
        (
            "partition_method",
            Box::new(|m| m.partition_method = "random:seed=3".into()),
        ),
        ("edge_cut", Box::new(|m| m.edge_cut += 1)),
        ("max_imbalance", Box::new(|m| m.max_imbalance = 1.5)),
    ];
    for (field, edit) in &edits {
        partition(&graph, 2, &dir);
        edit_manifest(&dir, edit);
        let stderr = error_of(&run(&["inspect", s(&dir)]), field);
        assert!(
            stderr.contains(&format!("{field}: "))
                && stderr.contains("re-run `distspmm partition`"),
            "{field}: {stderr}"
        );
    }
    partition(&graph, 2, &dir);
    ok(&["inspect", s(&dir)]);
}

#[test]
fn messages_name_the_real_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 300, 9);
    let out = tmp.path().join("o");
    let partition_with = |extra: &[&str]| {
        let mut args = vec!["partition", "--input", s(&graph), "--parts", "2"];
        args.extend(["--out", s(&out)]);
        args.extend(extra);
        error_of(&run(&args), &format!("{extra:?}"))
    };
    let stderr = partition_with(&["--imbalance", "1e9"]);
    assert!(
        stderr.contains("give a number from 1.001 to 1001"),
        "{stderr}"
    );
    let stderr = partition_with(&["--imbalance", "1e300"]);
    assert!(stderr.contains("tolerance 1e300 is invalid"), "{stderr}");
    let stderr = partition_with(&["--seed", "18446744073709551615"]);
    assert!(
        stderr.contains("--seed 18446744073709551615 is too large for METIS")
            && !stderr.contains("index type"),
        "{stderr}"
    );
    // A graph without nodes.
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let stderr = error_of(
        &run(&[
            "partition",
            "--input",
            s(&empty),
            "--parts",
            "2",
            "--out",
            s(&out),
        ]),
        "no nodes",
    );
    assert!(
        stderr.contains("the graph has no nodes") && !stderr.contains("at most 0"),
        "{stderr}"
    );
    // verify --tolerance nan is an invalid option, not a MISMATCH.
    let dir = tmp.path().join("chunks");
    partition(&graph, 1, &dir);
    let stderr = error_of(
        &run(&["verify", "--chunks", s(&dir), "--tolerance", "nan"]),
        "tolerance nan",
    );
    assert!(
        stderr.contains("--tolerance NaN is not a valid tolerance") && !stderr.contains("MISMATCH"),
        "{stderr}"
    );
    // A full disk while writing a graph: the OS error once, no Rust debug text. A file size
    // limit makes writes fail the same way (SIGXFSZ ignored, so write returns EFBIG).
    let big = tmp.path().join("big.npz");
    let out = shell(&format!(
        "trap '' XFSZ; ulimit -f 16; exec \"$BIN\" generate csbm --nodes 20000 --out '{}'",
        big.display()
    ));
    let stderr = error_of(&out, "generate onto a full disk");
    assert!(
        !stderr.contains("ZipWriter") && !stderr.contains("Os {") && stderr.contains("big.npz"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let leftovers = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".tmp")
        })
        .count();
    assert_eq!(leftovers, 0, "the partial file was removed");
}
