//! A `distspmm predict` killed while it writes its outputs leaves no partial file under an
//! output's name: the ranks write into a temporary that rank 0 renames only after every rank
//! succeeded, so each output is either absent, the user's previous file byte for byte, or a
//! complete new one.

mod launch;

use std::path::Path;
use std::time::{Duration, Instant};

use launch::{csbm, mpi_job, mpirun_available, npy, partition, s};

/// The `.npy` files predict writes here, with their previous contents when a run replaces
/// them.
const OUTPUTS: [&str; 3] = ["logits.npy", "probabilities.npy", "embeddings.npy"];

/// Whether `dir` holds a temporary of an atomic write (`<file>.tmp-<pid>-<seq>`).
fn temporary_in(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.contains(".npy.tmp-"))
        })
}

/// Checks that `path` is a complete `.npy` file of `rows` rows of f32: its header's shape and
/// its length agree.
fn assert_complete(path: &Path, rows: usize) {
    let (header, data) = npy(path);
    let shape = &header[header.find("'shape': (").expect("shape") + 10..];
    let dims: Vec<usize> = shape[..shape.find(')').unwrap()]
        .split(',')
        .filter(|d| !d.trim().is_empty())
        .map(|d| d.trim().parse().unwrap())
        .collect();
    assert_eq!(dims[0], rows, "{}: {header}", path.display());
    assert_eq!(
        data.len(),
        dims.iter().product::<usize>() * 4,
        "{} is not complete: {header}",
        path.display()
    );
}

#[test]
fn a_predict_killed_mid_write_leaves_no_partial_output() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let nodes = 60_000;
    let graph = csbm(tmp.path(), "g.npz", nodes, 64, 7);
    let chunks = tmp.path().join("chunks");
    partition(&graph, 2, &chunks, &[]);
    let ck = tmp.path().join("ck");
    let train = mpi_job(
        2,
        &[
            "train",
            "--chunks",
            s(&chunks),
            "--epochs",
            "1",
            "--checkpoint",
            s(&ck),
        ],
    )
    .output(Duration::from_secs(300));
    assert!(train.status.success(), "{train:?}");

    let out = tmp.path().join("out");
    let predict = [
        "predict",
        "--chunks",
        s(&chunks),
        "--checkpoint",
        s(&ck),
        "--out",
        s(&out),
        "--logits",
        "--probabilities",
        "--embeddings",
        "0",
        "--force",
    ];
    // A first run that ends, whose files a killed second run must leave as they are.
    let first = mpi_job(2, &predict).output(Duration::from_secs(300));
    assert!(first.status.success(), "{first:?}");
    let previous: Vec<Vec<u8>> = OUTPUTS
        .iter()
        .map(|name| std::fs::read(out.join(name)).unwrap())
        .collect();
    // A user's file that predict does not write stays untouched too.
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();

    // The second run is killed, every rank and mpirun at once (a lost node), as soon as a
    // temporary appears: rank 0 creates each one before the ranks write their rows into it.
    let mut job = mpi_job(2, &predict);
    let start = Instant::now();
    let mut seen = false;
    while start.elapsed() < Duration::from_secs(300) && job.finished().is_none() {
        if temporary_in(&out) {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let (status, stderr) = (job.finished(), job.stderr());
    // Dropping an unfinished job kills its ranks, then mpirun, with SIGKILL.
    drop(job);
    assert!(
        seen,
        "no temporary appeared in {} before predict ended (status {status:?}): the test \
         never interrupted a write; stderr: {stderr}",
        out.display(),
    );
    for (name, before) in OUTPUTS.iter().zip(&previous) {
        let path = out.join(name);
        let now = std::fs::read(&path).unwrap_or_else(|e| panic!("{name} is gone: {e}"));
        if now != *before {
            // Renamed into place before the kill: then it must be whole.
            assert_complete(&path, nodes);
        }
    }
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"mine");

    // The next run replaces the outputs; the killed run's temporary stays for the user to
    // delete (no process may remove a file another one wrote), and does not stand in the way.
    let again = mpi_job(2, &predict).output(Duration::from_secs(300));
    assert!(again.status.success(), "{again:?}");
    for name in OUTPUTS {
        assert_complete(&out.join(name), nodes);
    }
}
