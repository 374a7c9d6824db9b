//! Hostile inputs of the second hardening round (issue 16), each as a new user would meet it:
//! concurrent writers of one chunk directory, tiny files that declare huge sizes, special files
//! where chunks or graphs belong, a deleted or replaced `partition.map`, manifests whose checksum
//! is right but whose fields lie, and the messages that used to name the wrong cause. Every
//! failure must be a plain exit status 1 with one message that says what is wrong — never a
//! panic (101), an abort (134) or a hang.

mod launch;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chunk_format::dir::{Manifest, MANIFEST_FILE, PARTITION_MAP_FILE};
use launch::{csbm, error_of, ok, run_one, s, BIN, DEADLINE};

/// Runs `sh -c SCRIPT` with `$BIN` set to the binary (one rayon thread), killed after `DEADLINE`.
fn shell(script: &str) -> Output {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .env("BIN", BIN)
        .env("RAYON_NUM_THREADS", "1");
    launch::run(cmd, DEADLINE)
}

fn partition(graph: &Path, parts: usize, out: &Path) {
    launch::partition(graph, parts, out, &["--json"]);
}

#[test]
fn concurrent_partitions_into_one_directory_never_mix() {
    let tmp = tempfile::tempdir().unwrap();
    let a = csbm(tmp.path(), "a.npz", 6000, 8, 1);
    let b = csbm(tmp.path(), "b.npz", 6000, 8, 2);
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
        let inspected = run_one(&["inspect", s(&dir)]);
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
        let stderr = error_of(&run_one(&full), args[0]);
        assert!(
            stderr.contains(
                "the file declares 2000000000 nodes, but its 1 edges reference only nodes below 2"
            ) && stderr.contains("memory is available")
                && stderr.contains("check the node count the file declares"),
            "{args:?}: {stderr}"
        );
    }
    // An .npz of 3 edges whose num_nodes is 2³² − 1.
    let g = distspmm_prep::graph::Graph::from_edges(4, vec![0, 1, 2], vec![1, 2, 3]);
    let valid = distspmm_prep::graph::npz::write_npz_bytes(&g).unwrap();
    let npz = tmp.path().join("huge.npz");
    std::fs::write(&npz, with_ints(&valid, "num_nodes", "()", &[4_294_967_295])).unwrap();
    for args in [
        vec!["plan", "--input", s(&npz), "--parts", "2"],
        vec!["bench", "spmm", "--input", s(&npz), "--features", "4"],
    ] {
        let stderr = error_of(&run_one(&args), args[0]);
        assert!(
            stderr.contains("huge.npz")
                && stderr.contains(
                    "the file declares 4294967295 nodes, but its 3 edges reference only nodes below 4"
                )
                && stderr.contains("num_nodes in an .npz"),
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
        let stderr = error_of(&run_one(&full), args[1]);
        assert!(
            stderr.contains("memory is available") && stderr.contains("lower --"),
            "{args:?}: {stderr}"
        );
        assert!(!out.exists());
    }
    // verify: N × F test matrices.
    let small = csbm(tmp.path(), "small.npz", 300, 8, 3);
    let one = tmp.path().join("one");
    partition(&small, 1, &one);
    let stderr = error_of(
        &run_one(&["verify", "--chunks", s(&one), "--features", "100000000000"]),
        "verify",
    );
    assert!(stderr.contains("lower --features"), "{stderr}");
}

#[test]
fn local_ranks_check_the_part_count_before_starting_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 400, 8, 4);
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
            stderr.contains("made for 2 parts but 1000 ranks were started"),
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
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 5);
    let dir = tmp.path().join("chunks");
    partition(&graph, 2, &dir);
    let chunk = dir.join("part-00001.chunk");
    std::fs::remove_file(&chunk).unwrap();
    let made = Command::new("mkfifo").arg(&chunk).status().unwrap();
    assert!(made.success());
    for args in [vec!["inspect", s(&dir)], vec!["inspect", s(&chunk)]] {
        let stderr = error_of(&run_one(&args), "inspect of a FIFO");
        assert!(
            stderr.contains("part-00001.chunk")
                && stderr.contains("a FIFO (named pipe), not a regular file"),
            "{args:?}: {stderr}"
        );
    }
    // A directory where a chunk belongs.
    std::fs::remove_file(&chunk).unwrap();
    std::fs::create_dir(&chunk).unwrap();
    let stderr = error_of(&run_one(&["inspect", s(&dir)]), "a directory as a chunk");
    assert!(
        stderr.contains("part-00001.chunk") && stderr.contains("a directory, not a regular file"),
        "{stderr}"
    );
    // train (one rank, so one part) on a FIFO chunk: refused, not blocked forever.
    let one = tmp.path().join("one");
    partition(&graph, 1, &one);
    let first = one.join("part-00000.chunk");
    std::fs::remove_file(&first).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&first)
        .status()
        .unwrap()
        .success());
    let stderr = error_of(
        &run_one(&["train", "--chunks", s(&one), "--epochs", "1"]),
        "train on a FIFO",
    );
    assert!(
        stderr.contains("part-00000.chunk")
            && stderr.contains("a FIFO (named pipe), not a regular file"),
        "{stderr}"
    );
    // A directory where a graph file belongs: said so, not "Is a directory" or "No such device".
    let as_dir = tmp.path().join("graph.npz");
    std::fs::create_dir(&as_dir).unwrap();
    let stderr = error_of(
        &run_one(&[
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
        stderr.contains("graph.npz") && stderr.contains("a directory without edge_index.npy"),
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
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 6);
    let other = csbm(tmp.path(), "h.npz", 300, 8, 7);
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
            // One rank: the map is checked before the part count.
            vec!["train", "--chunks", s(&dir), "--epochs", "1"],
        ] {
            let stderr = error_of(&run_one(&args), &format!("{how} map, {}", args[0]));
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
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 8);
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
        let stderr = error_of(&run_one(&["inspect", s(&dir)]), field);
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
    let graph = csbm(tmp.path(), "g.npz", 300, 8, 9);
    let out = tmp.path().join("o");
    let partition_with = |extra: &[&str]| {
        let mut args = vec!["partition", "--input", s(&graph), "--parts", "2"];
        args.extend(["--out", s(&out)]);
        args.extend(extra);
        error_of(&run_one(&args), &format!("{extra:?}"))
    };
    let stderr = partition_with(&["--imbalance", "1e9"]);
    assert!(
        stderr.contains("give a number from 1.001 to 1001"),
        "{stderr}"
    );
    let stderr = partition_with(&["--imbalance", "1e300"]);
    assert!(stderr.contains("tolerance 1e300 is invalid"), "{stderr}");
    let stderr = partition_with(&["--seed", "18446744073709551615", "--method", "metis"]);
    assert!(
        stderr.contains("--seed 18446744073709551615 is too large for METIS")
            && !stderr.contains("index type"),
        "{stderr}"
    );
    // The default method, `auto`, runs METIS on this even-degree graph, and says the same.
    let stderr = partition_with(&["--seed", "18446744073709551615"]);
    assert!(
        stderr.contains("--seed 18446744073709551615 is too large for METIS"),
        "{stderr}"
    );
    // KaMinPar takes a C int seed too, and says so.
    let stderr = partition_with(&["--seed", "18446744073709551615", "--method", "kaminpar"]);
    assert!(
        stderr.contains("seed 18446744073709551615 does not fit")
            && stderr.contains("below 2147483648"),
        "{stderr}"
    );
    // 2³² − 1 nodes with --method contiguous: whatever stops it, not METIS's index type
    // (contiguous does not call METIS).
    let wide = tmp.path().join("wide.txt");
    std::fs::write(&wide, "0 4294967294\n").unwrap();
    let stderr = error_of(
        &run_one(&[
            "partition",
            "--input",
            s(&wide),
            "--parts",
            "2",
            "--method",
            "contiguous",
            "--out",
            s(&out),
        ]),
        "contiguous on 2^32 - 1 nodes",
    );
    assert!(
        !stderr.contains("METIS") && stderr.contains("4294967295 nodes"),
        "{stderr}"
    );
    // A graph without nodes.
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let stderr = error_of(
        &run_one(&[
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
        &run_one(&["verify", "--chunks", s(&dir), "--tolerance", "nan"]),
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

/// A 300-node CSBM graph in one chunk, for the training cases (one rank, no mpirun).
fn one_chunk(dir: &Path, seed: u64) -> PathBuf {
    let graph = csbm(dir, "train.npz", 300, 8, seed);
    let chunks = dir.join("train-chunks");
    partition(&graph, 1, &chunks);
    chunks
}

/// `distspmm train ARGS…` on one rank; nothing may have trained when it fails.
fn train_fails(args: &[&str], what: &str) -> String {
    let mut full = vec!["train"];
    full.extend(args);
    let out = run_one(&full);
    let stderr = error_of(&out, what);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("epoch") && !stderr.contains("epoch    1"),
        "{what}: trained before failing: {stdout}"
    );
    stderr
}

#[test]
fn an_unwritable_checkpoint_location_fails_before_the_first_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let chunks = one_chunk(tmp.path(), 10);
    // A regular file where a directory must be made: unwritable even for root.
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let ck = file.join("ck");
    let stderr = train_fails(
        &[
            "--chunks",
            s(&chunks),
            "--epochs",
            "50",
            "--checkpoint",
            s(&ck),
        ],
        "unwritable checkpoint",
    );
    assert!(
        stderr.contains(&format!("cannot write checkpoints into {}", ck.display()))
            && stderr.contains("choose a writable --checkpoint directory"),
        "{stderr}"
    );
    // The probe leaves nothing behind in a writable directory.
    let good = tmp.path().join("ck");
    ok(&[
        "train",
        "--chunks",
        s(&chunks),
        "--epochs",
        "1",
        "--checkpoint",
        s(&good),
    ]);
    let names: Vec<_> = std::fs::read_dir(&good)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["checkpoint.json"]);
    // --checkpoint-every without a directory to write to.
    let stderr = train_fails(
        &["--chunks", s(&chunks), "--checkpoint-every", "5"],
        "checkpoint-every alone",
    );
    assert!(
        stderr.contains("--checkpoint-every 5 needs --checkpoint DIR"),
        "{stderr}"
    );
}

#[test]
fn resume_refuses_other_data_and_other_options_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let chunks = one_chunk(tmp.path(), 11);
    let ck = tmp.path().join("ck");
    fn train<'a>(chunks: &'a Path, ck: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["--chunks", s(chunks), "--checkpoint", s(ck)];
        args.extend(extra);
        args
    }
    let mut first = vec!["train"];
    first.extend(train(&chunks, &ck, &["--epochs", "2"]));
    ok(&first);
    for (extra, field) in [
        (
            &["--normalize-features", "false"][..],
            "--normalize-features is true there, false here",
        ),
        (&["--hidden", "8"], "--hidden is 16 there, 8 here"),
        (&["--lr", "0.02"], "--lr is 0.01 there, 0.02 here"),
        (&["--seed", "7"], "--seed is 42 there, 7 here"),
    ] {
        let mut args = train(&chunks, &ck, &["--resume", "--epochs", "4"]);
        args.extend(extra);
        let stderr = train_fails(&args, field);
        assert!(
            stderr.contains(field)
                && stderr.contains("was written for another run")
                && !stderr.contains("ModelConfig")
                && !stderr.contains('{'),
            "{extra:?}: {stderr}"
        );
    }
    // Tensor mode: the same path and node count, regenerated with another seed.
    let graph = tmp.path().join("t.npz");
    let generate = |seed: &str| {
        ok(&[
            "generate",
            "csbm",
            "--nodes",
            "300",
            "--features",
            "8",
            "--classes",
            "3",
            "--seed",
            seed,
            "--force",
            "--out",
            s(&graph),
        ]);
    };
    generate("1");
    let tck = tmp.path().join("tck");
    let tensor = |epochs: &str, resume: bool| {
        let mut args = vec!["train", "--mode", "tensor", "--input", s(&graph)];
        args.extend(["--epochs", epochs, "--checkpoint", s(&tck)]);
        if resume {
            args.push("--resume");
        }
        run_one(&args)
    };
    assert!(tensor("2", false).status.success());
    generate("2");
    let stderr = error_of(&tensor("4", true), "tensor resume on regenerated data");
    assert!(
        stderr.contains("the data differ (content fingerprint") && stderr.contains("t.npz"),
        "{stderr}"
    );
    // The same data again: the resume goes on.
    generate("1");
    let out = tensor("3", true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn zero_epochs_and_a_finished_checkpoint_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let chunks = one_chunk(tmp.path(), 12);
    let stderr = train_fails(&["--chunks", s(&chunks), "--epochs", "0"], "--epochs 0");
    assert!(
        stderr.contains("--epochs 0 trains nothing") && !stderr.contains("checkpoint"),
        "{stderr}"
    );
    let ck = tmp.path().join("ck");
    ok(&[
        "train",
        "--chunks",
        s(&chunks),
        "--epochs",
        "2",
        "--checkpoint",
        s(&ck),
    ]);
    for epochs in ["0", "2"] {
        let stderr = train_fails(
            &[
                "--chunks",
                s(&chunks),
                "--epochs",
                epochs,
                "--checkpoint",
                s(&ck),
                "--resume",
            ],
            "a finished checkpoint",
        );
        assert!(
            stderr.contains("has already trained 2 epochs")
                && stderr.contains(&format!("--epochs {epochs} counts all epochs"))
                && stderr.contains("ask for more than 2"),
            "{stderr}"
        );
        assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
    }
}

/// The `.npz` archive `valid` with its array `name` replaced by the `<i8` values `ints` of
/// shape `shape` (the writer refuses what these tests need, so the array is written here as
/// numpy would: a version 1.0 `.npy`, stored).
fn with_ints(valid: &[u8], name: &str, shape: &str, ints: &[i64]) -> Vec<u8> {
    use std::io::{Cursor, Write};
    let file_name = format!("{name}.npy");
    let mut src = zip::ZipArchive::new(Cursor::new(valid)).unwrap();
    let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for i in 0..src.len() {
        let file = src.by_index_raw(i).unwrap();
        if file.name() != file_name {
            out.raw_copy_file(file).unwrap();
        }
    }
    let dict = format!("{{'descr': '<i8', 'fortran_order': False, 'shape': {shape}, }}");
    let pad = (64 - (10 + dict.len() + 1) % 64) % 64;
    let header = format!("{dict}{}\n", " ".repeat(pad));
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend(u16::try_from(header.len()).unwrap().to_le_bytes());
    npy.extend(header.as_bytes());
    ints.iter().for_each(|l| npy.extend(l.to_le_bytes()));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    out.start_file(file_name, stored).unwrap();
    out.write_all(&npy).unwrap();
    out.finish().unwrap().into_inner()
}

#[test]
fn training_sizes_that_cannot_fit_are_errors_naming_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    let chunks = one_chunk(tmp.path(), 13);
    for (args, option) in [
        (
            &["--hidden", "1000000", "--layers", "3"][..],
            "hidden width 1000000",
        ),
        (&["--layers", "4294967295"], "4294967295 layers"),
    ] {
        let mut full = vec!["--chunks", s(&chunks), "--epochs", "1"];
        full.extend(args);
        let stderr = train_fails(&full, option);
        assert!(
            stderr.contains(option)
                && stderr.contains("memory is available")
                && stderr.contains("lower --hidden or --layers"),
            "{args:?}: {stderr}"
        );
    }
    // The issue's own case, --hidden 1000000 on Cora (about 160 GiB of buffers).
    if let Some(cora) = launch::cora() {
        let dir = tmp.path().join("cora");
        partition(&cora, 1, &dir);
        let stderr = train_fails(
            &["--chunks", s(&dir), "--epochs", "1", "--hidden", "1000000"],
            "Cora --hidden 1000000",
        );
        assert!(stderr.contains("lower --hidden"), "{stderr}");
    }
    // A label of 2³¹ − 2 would make 2³¹ − 1 classes: refused where the graph is read, by
    // partition and by tensor-parallel training alike.
    let mut g = distspmm_prep::graph::Graph::from_edges(4, vec![0, 1, 2], vec![1, 2, 3]);
    g.features = Some(distspmm_prep::graph::Features {
        dim: 2,
        data: vec![1.0; 8].into(),
    });
    g.labels = Some(vec![0, 1, 2, 1]);
    g.train_mask = Some(vec![true; 4]);
    let valid = distspmm_prep::graph::npz::write_npz_bytes(&g).unwrap();
    let bomb = tmp.path().join("bomb.npz");
    let labels = with_ints(&valid, "y", "(4,)", &[0, 1, 2_147_483_646, 1]);
    std::fs::write(&bomb, labels).unwrap();
    for args in [
        vec![
            "train",
            "--mode",
            "tensor",
            "--input",
            s(&bomb),
            "--epochs",
            "1",
        ],
        vec![
            "partition",
            "--input",
            s(&bomb),
            "--parts",
            "1",
            "--out",
            s(&tmp.path().join("bomb-chunks")),
        ],
    ] {
        let stderr = error_of(&run_one(&args), args[0]);
        assert!(
            stderr.contains("2147483646") && stderr.contains("class indices"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn features_near_the_f32_limit_are_normalised_not_zeroed() {
    let Some(cora) = launch::cora() else {
        return;
    };
    // Cora's bag-of-words rows scaled by 3·10³⁸ (still finite): an f32 row sum overflows to
    // infinity, which used to zero every feature (loss stuck at ln 7, 31.9 % accuracy).
    let tmp = tempfile::tempdir().unwrap();
    let mut g = distspmm_prep::graph::load(&cora).unwrap();
    let x = g.features.as_mut().unwrap();
    let top = x.data.iter().copied().fold(0.0f32, f32::max);
    x.data.iter_mut().for_each(|v| *v *= 3e38 / top);
    assert!(x.data.iter().all(|v| v.is_finite()));
    let scaled = tmp.path().join("scaled.npz");
    distspmm_prep::graph::npz::write_npz(&scaled, &g).unwrap();
    let dir = tmp.path().join("chunks");
    partition(&scaled, 1, &dir);
    let out = run_one(&["train", "--chunks", s(&dir), "--epochs", "100", "--json"]);
    let summary = launch::summary(&out);
    let acc = summary["test_acc"].as_f64().unwrap();
    assert!(acc > 0.7, "test accuracy {acc} on Cora scaled by 3e38");
}
