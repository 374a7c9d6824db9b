//! `mpirun -n P distspmm partition --distributed`: a valid partition at P = 1, 2, 3 whose chunks
//! are byte for byte the single-machine builder's for the same partition (so Â reassembles
//! exactly), and a run killed mid-write that leaves the previous directory as it was.

mod launch;

use std::path::Path;
use std::time::{Duration, Instant};

use chunk_format::dir::ChunkDir;
use distspmm_prep::chunk::VerifyDir;
use distspmm_prep::partition::Partition;
use launch::{csbm, mpi, mpi_job, mpirun_available, one_json, partition, s};

/// Every chunk file of `a` equals the one of the same name in `b`.
fn same_chunks(a: &Path, b: &Path) {
    let dir = ChunkDir::open(a).unwrap();
    for p in 0..dir.parts() {
        let name = chunk_format::dir::chunk_file_name(p);
        assert!(
            std::fs::read(a.join(&name)).unwrap() == std::fs::read(b.join(&name)).unwrap(),
            "{name} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// `distspmm partition --distributed --input INPUT --parts PARTS --out OUT EXTRA…`.
fn distributed(input: &Path, parts: usize, out: &Path, extra: &[&str]) -> Vec<String> {
    let parts = parts.to_string();
    let head = [
        "partition",
        "--distributed",
        "--input",
        s(input),
        "--parts",
        &parts,
        "--out",
        s(out),
    ];
    head.iter().chain(extra).map(|a| a.to_string()).collect()
}

/// The arguments as `&str`s.
fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Â of a chunk directory in original ids: (row, column, value bits), sorted.
fn a_hat_in_original_ids(dir: &ChunkDir) -> Vec<(u32, u32, u32)> {
    let renumbering = dir.load_partition().unwrap().renumbering();
    let new_to_old: Vec<u32> = (0..dir.parts())
        .flat_map(|p| renumbering.part_nodes(p).to_vec())
        .collect();
    let a = dir.reassemble().unwrap();
    let mut out = Vec::new();
    for row in 0..a.nrows() {
        let (cols, vals) = a.row(row);
        for (&c, &v) in cols.iter().zip(vals) {
            out.push((new_to_old[row], new_to_old[c as usize], v.to_bits()));
        }
    }
    out.sort_unstable();
    out
}

#[test]
fn distributed_partitions_are_valid_and_build_the_single_machine_chunks() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 4000, 16, 3);
    // The same arrays as a directory of .npy files (read by seeks).
    let npy = tmp.path().join("g");
    std::fs::create_dir(&npy).unwrap();
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&graph).unwrap()).unwrap();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).unwrap();
        let mut out = std::fs::File::create(npy.join(member.name())).unwrap();
        std::io::copy(&mut member, &mut out).unwrap();
    }
    let single = tmp.path().join("single");
    partition(
        &graph,
        4,
        &single,
        &["--method", "kaminpar", "--threads", "1"],
    );
    let a_hat = a_hat_in_original_ids(&ChunkDir::open(&single).unwrap());
    for (ranks, parts, input) in [(1, 2, &graph), (2, 2, &npy), (2, 5, &graph), (3, 4, &npy)] {
        let out = tmp.path().join(format!("d{ranks}-{parts}"));
        let run = mpi(ranks, &strs(&distributed(input, parts, &out, &["--json"])));
        assert!(run.status.success(), "{run:?}");
        let json = one_json(&String::from_utf8_lossy(&run.stdout));
        assert_eq!(json["ranks"], ranks);
        assert_eq!(json["parts"], parts);
        for phase in ["read", "graph", "partition", "exchange", "build", "write"] {
            assert!(
                json["phase_bytes_per_nnz_per_rank"][phase]
                    .as_f64()
                    .unwrap()
                    > 0.0
            );
        }
        // Every node in exactly one part, the parts balanced within PT-Scotch's tolerance.
        let map = Partition::load(&out.join("partition.map")).unwrap();
        assert_eq!(map.num_nodes(), 4000);
        assert_eq!(map.parts() as usize, parts);
        assert!(map.part_sizes().iter().all(|&n| n > 0));
        assert!(map.imbalance() <= 1.05, "imbalance {}", map.imbalance());
        assert!(map.method().starts_with("ptscotch:"), "{}", map.method());
        let dir = ChunkDir::open(&out).unwrap();
        dir.validate_all().unwrap();
        // The same Â, whatever the partition.
        assert!(
            a_hat_in_original_ids(&dir) == a_hat,
            "Â differs at {ranks} ranks, {parts} parts"
        );
        // The single-machine builder, given this partition, writes the same chunks.
        let again = tmp.path().join(format!("s{ranks}-{parts}"));
        partition(
            &graph,
            parts,
            &again,
            &["--partition-map", s(&out.join("partition.map"))],
        );
        same_chunks(&out, &again);
    }
}

#[test]
fn fewer_parts_than_ranks_and_other_methods_are_refused() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 500, 4, 1);
    let out = tmp.path().join("out");
    let run = mpi(3, &strs(&distributed(&graph, 2, &out, &[])));
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("give 3 parts or more"), "{err}");
    assert!(!out.exists());
    let run = mpi(
        1,
        &strs(&distributed(&graph, 2, &out, &["--method", "metis"])),
    );
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("--method ptscotch"));
}

#[test]
fn a_run_killed_while_the_ranks_write_leaves_the_previous_directory() {
    if !mpirun_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let graph = csbm(tmp.path(), "g.npz", 60_000, 64, 5);
    let out = tmp.path().join("out");
    let first = distributed(&graph, 2, &out, &["--force"]);
    assert!(mpi(2, &strs(&first)).status.success());
    let before: Vec<(String, Vec<u8>)> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    // A second run into four parts, killed (every rank and mpirun) once its staging directory
    // holds a chunk.
    let second = distributed(&graph, 4, &out, &["--force"]);
    let mut job = mpi_job(2, &strs(&second));
    let start = Instant::now();
    let mut seen = false;
    while start.elapsed() < Duration::from_secs(300) && job.finished().is_none() {
        let staging = std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(".out.staging-"));
        if let Some(staging) = staging {
            if std::fs::read_dir(staging.path()).is_ok_and(|mut d| d.next().is_some()) {
                seen = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let stderr = job.stderr();
    drop(job);
    assert!(
        seen,
        "the second run ended before it wrote a chunk: {stderr}"
    );
    for (name, bytes) in &before {
        assert!(
            std::fs::read(out.join(name)).unwrap() == *bytes,
            "{name} changed"
        );
    }
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), before.len());
    // The next run replaces it, and removes the killed run's staging directory.
    assert!(mpi(2, &strs(&second)).status.success());
    assert_eq!(ChunkDir::open(&out).unwrap().parts(), 4);
    let left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("staging"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
