//! The NCCL backend from outside: setting up without a (working) driver is an error, never a
//! crash; `nccl-selftest` launched with `--spawn 2` and under `mpirun -n 2` either passes
//! every check (on a GPU machine) or skips on every rank, and never hangs.
//!
//! Each launch is killed after 120 s so a hang fails the test instead of blocking CI.

use std::process::Command;
use std::time::Duration;

use dist_comm::{CommError, DeviceSelect, LocalComm, NcclComm};

const TIMEOUT: Duration = Duration::from_secs(120);

/// With a `libcuda.so` that is not the driver first on the loader path, setting up must
/// return `NoDevice` naming the missing entry point: the process re-runs this test in a child
/// with a stub library on `LD_LIBRARY_PATH`.
#[test]
fn a_broken_driver_library_is_an_error_not_a_crash() {
    const CHILD: &str = "DIST_COMM_NCCL_STUB_DRIVER_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let results = LocalComm::run(2, |comm| {
            NcclComm::new(&comm, DeviceSelect::LocalRank).map(|_| ())
        });
        for r in results {
            match r {
                Err(CommError::NoDevice(msg)) => assert!(msg.contains("cuInit"), "{msg}"),
                other => panic!("a stub libcuda must not give a communicator: {other:?}"),
            }
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("stub.c");
    std::fs::write(&src, "int not_the_cuda_driver(void) { return 0; }\n").unwrap();
    let lib = dir.path().join("libcuda.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("skipping: no C compiler to build a stub libcuda.so");
        return;
    }
    std::fs::copy(&lib, dir.path().join("libcuda.so.1")).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_broken_driver_library_is_an_error_not_a_crash",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", dir.path())
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "child ran no test:\n{text}");
}

/// Runs `cmd` with a timeout (`test_support::run`); returns (success, stdout, stderr).
fn run(mut cmd: Command) -> (bool, String, String) {
    let out = test_support::run(&mut cmd, TIMEOUT);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every rank passed its checks, or every rank (or the launcher) skipped for want of a device.
fn assert_passed_or_skipped(ranks: usize, ok: bool, out: &str, err: &str) {
    assert!(ok, "nccl-selftest failed; stdout:\n{out}\nstderr:\n{err}");
    let passed = (0..ranks)
        .filter(|r| {
            out.lines().any(|l| {
                l.contains(&format!("rank {r} of {ranks}: ")) && l.contains("checks passed")
            })
        })
        .count();
    let skipped = out
        .lines()
        .filter(|l| l.contains("skipping: no CUDA device"))
        .count();
    assert!(
        passed == ranks || (passed == 0 && skipped > 0),
        "expected all {ranks} ranks to pass or a skip; stdout:\n{out}\nstderr:\n{err}"
    );
    if skipped > 0 {
        println!("nccl-selftest skipped: {}", out.trim());
    }
}

#[test]
fn selftest_spawned_two_ranks_pass_or_skip() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nccl-selftest"));
    cmd.args(["--spawn", "2"]);
    let (ok, out, err) = run(cmd);
    assert_passed_or_skipped(2, ok, &out, &err);
}

#[test]
fn selftest_rejects_bad_arguments() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nccl-selftest"));
    cmd.args(["--spawn", "two"]);
    let out = cmd.output().expect("run nccl-selftest");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--spawn needs a number"));
}

/// A `--spawn` child reads its rank, the size and the hex id from its environment: a
/// malformed one is a usage error; a well-formed one joins (here: passes or skips).
#[test]
fn selftest_children_read_their_rank_and_id() {
    const CHILD: &str = "DISTSPMM_NCCL_SELFTEST_CHILD";
    let exe = env!("CARGO_BIN_EXE_nccl-selftest");
    for bad in [
        "",
        "0,2",
        "0,2,abc",
        "x,2,00",
        &format!("0,2,{}", "zz".repeat(128)),
    ] {
        let out = Command::new(exe).env(CHILD, bad).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("malformed"),
            "{bad:?}"
        );
    }
    if matches!(cuda_probe::device_count(), Ok(n) if n > 0) {
        // A lone rank of two with a made-up id would wait inside NCCL for its peer.
        println!("skipping the well-formed case: a CUDA device is present");
        return;
    }
    let out = Command::new(exe)
        .env(CHILD, format!("1,2,{}", "ab".repeat(128)))
        .env_remove("DISTSPMM_REQUIRE_GPU")
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("rank 1 of 2: skipping: no CUDA device"),
        "{text}"
    );
}

/// Under `mpirun`, the setup's agreement steps run over MPI: without a GPU every rank must
/// skip (none may wait for a peer that gave up).
#[cfg(feature = "mpi")]
#[test]
fn selftest_under_mpirun_two_ranks_pass_or_skip() {
    let Some(mpirun) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("mpirun"))
            .find(|candidate| candidate.is_file())
    }) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "mpirun is not on PATH (install OpenMPI: apt-get install openmpi-bin libopenmpi-dev)"
        );
        println!("skipping: mpirun is not on PATH");
        return;
    };
    let mut cmd = Command::new(mpirun);
    // A host id per rank, so that two ranks may share one GPU (see nccl-selftest's docs).
    cmd.args(["-n", "2", "--oversubscribe", "--mca", "btl", "self,vader"])
        .args([
            "sh",
            "-c",
            "NCCL_HOSTID=dist-comm-test-rank-${OMPI_COMM_WORLD_RANK:-0} exec \"$0\"",
        ])
        .arg(env!("CARGO_BIN_EXE_nccl-selftest"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let (ok, out, err) = run(cmd);
    assert_passed_or_skipped(2, ok, &out, &err);
    if !out.contains("checks passed") {
        assert_eq!(
            out.lines()
                .filter(|l| l.contains("skipping: no CUDA device"))
                .count(),
            2,
            "both ranks must skip; stdout:\n{out}\nstderr:\n{err}"
        );
    }
}
