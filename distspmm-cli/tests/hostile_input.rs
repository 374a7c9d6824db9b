//! Hostile inputs of the third hardening round (issue 24), each as a user would meet it: sizes
//! that exceed the address-space limit of a batch job (`ulimit -v`), an input rewritten while
//! `partition` maps it, `.npy` directories whose entries are not files, METIS files and edge
//! lists that used to be read as something else, and the messages that named the wrong cause.
//! Every failure must be exit status 1 with one message that says what is wrong and what to do:
//! never an abort (134), a bus error (135), a panic (101) or a hang.

mod launch;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use distspmm_prep::graph::{npz, Graph};
use launch::{csbm, error_of, ok, run_one, s, Job, BIN, DEADLINE};

/// Runs `distspmm ARGS…` under `ulimit -v KIB` (one rayon thread), killed after `DEADLINE`.
fn run_limited(kib: u64, args: &[&str]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .env("RAYON_NUM_THREADS", "1");
    launch::run(cmd, DEADLINE)
}

/// Entries of `dir` whose name contains `part` (work and staging directories left behind).
fn leftovers(dir: &Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(part))
        .collect()
}

/// The members of an `.npz` unzipped into a new directory `name` beside it.
fn unzip(archive: &Path, name: &str) -> PathBuf {
    let dir = archive.with_file_name(name);
    std::fs::create_dir(&dir).unwrap();
    let mut zip = zip::ZipArchive::new(std::fs::File::open(archive).unwrap()).unwrap();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).unwrap();
        let mut out = std::fs::File::create(dir.join(member.name())).unwrap();
        std::io::copy(&mut member, &mut out).unwrap();
    }
    dir
}

/// An address-space limit well above what the binary needs to start (about 40 MB in a debug
/// build) and far below what the inputs below ask for.
const LIMIT_KIB: u64 = 600_000;

#[test]
fn sizes_beyond_the_address_space_limit_are_errors_not_aborts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = dir.join("chunks");

    // Six edges declaring 2·10^8 nodes: 800 MB for a node array alone.
    let graph = dir.join("declared.npz");
    let g = Graph::from_edges(200_000_000, vec![0, 1, 2], vec![1, 2, 0]);
    npz::write_npz(&graph, &g).unwrap();
    let mtx = dir.join("declared.mtx");
    std::fs::write(
        &mtx,
        "%%MatrixMarket matrix coordinate pattern general\n200000000 200000000 1\n1 2\n",
    )
    .unwrap();
    for input in [&graph, &mtx] {
        let err = error_of(
            &run_limited(
                LIMIT_KIB,
                &[
                    "partition",
                    "--input",
                    s(input),
                    "--parts",
                    "2",
                    "--out",
                    s(&out),
                ],
            ),
            &input.display().to_string(),
        );
        assert!(
            err.contains("200000000 nodes") && err.contains("GiB but only"),
            "{err}"
        );
        assert!(err.contains("ulimit -v"), "the fix: {err}");
    }

    // A compressed edge list of 12 million edges (96 MB of ids) in 50 kB, under a limit that
    // leaves less than that once the binary runs.
    let edges = dir.join("many.txt.gz");
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "yes '0 1' | head -n 12000000 | gzip -1 > '{}'",
            edges.display()
        ))
        .status()
        .unwrap();
    assert!(made.success());
    let err = error_of(
        &run_limited(
            150_000,
            &[
                "partition",
                "--input",
                s(&edges),
                "--parts",
                "2",
                "--out",
                s(&out),
            ],
        ),
        "edge list",
    );
    assert!(
        err.contains("an edge array of") && err.contains("needs") && err.contains("ulimit"),
        "{err}"
    );
    assert!(err.contains("line "), "names where it stopped: {err}");
    assert!(!out.exists());

    // RMAT with 2048 bucket files of a 1 MiB write buffer each: refused before any file is
    // made, and no work directory is left.
    let rmat = dir.join("r.npz");
    let err = error_of(
        &run_limited(
            LIMIT_KIB,
            &[
                "generate",
                "rmat",
                "--scale",
                "16",
                "--edge-factor",
                "8",
                "--bucket-keys",
                "1000",
                "--out",
                s(&rmat),
            ],
        ),
        "rmat buckets",
    );
    assert!(
        err.contains("2048 bucket files") && err.contains("--bucket-keys"),
        "{err}"
    );
    assert!(!rmat.exists());
    assert_eq!(leftovers(dir, ".rmat-"), Vec::<String>::new());
    // What a killed generator left (a process id that cannot exist) goes with the next run
    // beside the same output, even one that needs no bucket files.
    let stale = dir.join(".r.npz.rmat-4194305");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("bucket-00000.u64"), [0u8; 16]).unwrap();
    ok(&["generate", "rmat", "--scale", "8", "--out", s(&rmat)]);
    assert!(rmat.exists());
    assert_eq!(leftovers(dir, ".rmat-"), Vec::<String>::new());
}

#[test]
fn an_input_truncated_while_partition_maps_it_is_an_error_not_a_bus_error() {
    let tmp = tempfile::tempdir().unwrap();
    // Our archives store x uncompressed and aligned: partition maps it (15 MB).
    let graph = csbm(tmp.path(), "g.npz", 60_000, 64, 0);
    let out = tmp.path().join("chunks");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "partition",
        "--input",
        s(&graph),
        "--parts",
        "4",
        "--out",
        s(&out),
    ])
    .env("RAYON_NUM_THREADS", "1");
    let mut job = Job::spawn(cmd);
    let maps = format!("/proc/{}/maps", job.pid());
    // Truncate as soon as the archive is mapped: every read of x after it faults.
    let mapped = launch::wait_for(Duration::from_secs(60), Duration::from_millis(1), || {
        std::fs::read_to_string(&maps).is_ok_and(|m| m.contains(s(&graph)))
            || job.finished().is_some()
    });
    assert!(mapped);
    let truncated = job.finished().is_none();
    if truncated {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&graph)
            .unwrap()
            .set_len(4096)
            .unwrap();
    }
    let output = job.output(Duration::from_secs(120));
    if output.status.success() {
        // Only possible if the whole run finished before the truncation.
        assert!(!truncated, "the run finished after the file was truncated");
        eprintln!("partition finished before the file was truncated");
    } else {
        let err = error_of(&output, "truncated input");
        assert!(
            err.contains("changed while it was being read") && err.contains("nothing was written"),
            "{err}"
        );
        assert!(err.contains("g.npz"), "names the file: {err}");
        assert!(!out.exists(), "no chunk directory");
    }
    assert_eq!(leftovers(tmp.path(), ".staging-"), Vec::<String>::new());
    assert_eq!(leftovers(tmp.path(), ".buckets-"), Vec::<String>::new());
}

#[test]
fn npy_directory_entries_that_are_not_regular_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 200, 4, 0);
    let npy = unzip(&graph, "g");
    let out = tmp.path().join("chunks");
    let partition = || {
        run_one(&[
            "partition",
            "--input",
            s(&npy),
            "--parts",
            "2",
            "--out",
            s(&out),
        ])
    };
    let fifo = |path: &Path| {
        assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
    };
    let y = npy.join("y.npy");
    for (make, what) in [
        ("fifo", "`y.npy` is a FIFO (named pipe), not a regular file"),
        ("dir", "`y.npy` is a directory, not a regular file"),
        ("zero", "`y.npy` is a symbolic link to /dev/zero, a device"),
        (
            "dangling",
            "`y.npy` is a symbolic link to gone.npy, which does not exist",
        ),
    ] {
        std::fs::remove_file(&y)
            .or_else(|_| std::fs::remove_dir(&y))
            .unwrap();
        match make {
            "fifo" => fifo(&y),
            "dir" => std::fs::create_dir(&y).unwrap(),
            "zero" => std::os::unix::fs::symlink("/dev/zero", &y).unwrap(),
            _ => std::os::unix::fs::symlink("gone.npy", &y).unwrap(),
        }
        let err = error_of(&partition(), make);
        assert!(err.contains(what), "{make}: {err}");
        assert!(!out.exists(), "{make}: no chunks without labels");
    }
    std::fs::remove_file(&y).unwrap();
    // Absent is fine: chunks without labels.
    let done = partition();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let edges = npy.join("edge_index.npy");
    std::fs::remove_file(&edges).unwrap();
    fifo(&edges);
    let err = error_of(&partition(), "edge_index FIFO");
    assert!(err.contains("`edge_index.npy` is a FIFO"), "{err}");
    assert!(
        !err.contains("missing") && !err.contains("without edge_index"),
        "{err}"
    );
}

#[test]
fn asymmetric_metis_files_and_number_like_first_lines_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("chunks");
    let partition = |input: &Path| {
        run_one(&[
            "partition",
            "--input",
            s(input),
            "--parts",
            "2",
            "--out",
            s(&out),
        ])
    };
    // Vertex 1 lists 3, vertex 3 lists 2 and 4: the counts add up, the symmetry does not.
    let metis = tmp.path().join("g.graph");
    std::fs::write(&metis, "4 3\n2 3\n1 3\n2 4\n\n").unwrap();
    let err = error_of(&partition(&metis), "asymmetric METIS");
    assert!(
        err.contains("vertex 1 lists 3 as a neighbour but vertex 3 does not list 1")
            && err.contains("symmetric"),
        "{err}"
    );
    std::fs::write(&metis, "4 3\n2 3\n1 3\n1 2\n\n").unwrap();
    let out_ok = partition(&metis);
    assert!(
        out_ok.status.success(),
        "{}",
        String::from_utf8_lossy(&out_ok.stderr)
    );

    for (text, token) in [("1e3 5\n0 1\n", "1e3"), ("0x10 2\n0 1\n", "0x10")] {
        let el = tmp.path().join("g.el");
        std::fs::write(&el, text).unwrap();
        let err = error_of(&partition(&el), token);
        assert!(
            err.contains("line 1") && err.contains(token) && err.contains("decimal"),
            "{err}"
        );
    }
}

#[test]
fn messages_name_the_real_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = dir.join("chunks");
    let graph = csbm(dir, "g.npz", 300, 4, 0);

    // A truncated archive: what is wrong and what to do, not "failed to fill whole buffer".
    let bytes = std::fs::read(&graph).unwrap();
    let cut = dir.join("cut.npz");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    let err = error_of(
        &run_one(&[
            "partition",
            "--input",
            s(&cut),
            "--parts",
            "2",
            "--out",
            s(&out),
        ]),
        "truncated",
    );
    assert!(
        err.contains("truncated") && err.contains("re-create it"),
        "{err}"
    );
    assert!(!err.contains("failed to fill whole buffer"), "{err}");

    // Fewer rows in x than the edges need: x is at fault, not edge_index.
    let npy = unzip(&graph, "short");
    std::fs::remove_file(npy.join("num_nodes.npy")).unwrap();
    for name in ["y", "train_mask", "val_mask", "test_mask"] {
        std::fs::remove_file(npy.join(format!("{name}.npy"))).unwrap();
    }
    let mut x = std::fs::File::create(npy.join("x.npy")).unwrap();
    let mut header = String::from("{'descr': '<f4', 'fortran_order': False, 'shape': (5, 1), }");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    x.write_all(b"\x93NUMPY\x01\x00").unwrap();
    x.write_all(&u16::try_from(header.len()).unwrap().to_le_bytes())
        .unwrap();
    x.write_all(header.as_bytes()).unwrap();
    x.write_all(&[0u8; 20]).unwrap();
    drop(x);
    let err = error_of(
        &run_one(&[
            "partition",
            "--input",
            s(&npy),
            "--parts",
            "2",
            "--out",
            s(&out),
        ]),
        "short x",
    );
    assert!(
        err.contains("array \"x\"") && err.contains("x has 5 rows but edge_index reaches node"),
        "{err}"
    );

    // `inspect` on a chunk directory's manifest: pass the directory.
    launch::partition(&graph, 2, &out, &[]);
    for (file, what) in [
        ("manifest.json", "is a chunk directory's manifest"),
        ("partition.map", "is a chunk directory's partition map"),
    ] {
        let err = error_of(&run_one(&["inspect", s(&out.join(file))]), file);
        assert!(
            err.contains(what) && err.contains(&format!("`distspmm inspect {}`", s(&out))),
            "{err}"
        );
        assert!(!err.contains("magic"), "{err}");
    }
}
