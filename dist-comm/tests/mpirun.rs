//! Launches `dist-comm-selftest` under a real `mpirun` (OpenMPI) with 2 and 3 ranks, both with
//! dist-comm initialising MPI and with MPI initialised by the "host" and adopted.
//!
//! Skipped with a message when `mpirun` is not on `PATH`, unless `CI=true` (then it fails).
//! Each launch is killed after 60 s so a hang fails the test instead of blocking CI.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

/// One `mpirun` at a time: oversubscribed ranks of parallel launches would crowd two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn mpirun() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("mpirun"))
        .find(|candidate| candidate.is_file())
}

fn launch(ranks: usize, args: &[&str]) {
    launch_with(ranks, args, None);
}

/// Launches the selftest; with `max_count`, under `DIST_COMM_MPI_MAX_COUNT` (every rank must
/// report it as its limit).
fn launch_with(ranks: usize, args: &[&str], max_count: Option<usize>) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(mpirun) = mpirun() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "mpirun is not on PATH (install OpenMPI: apt-get install openmpi-bin libopenmpi-dev)"
        );
        eprintln!("skipping: mpirun is not on PATH");
        return;
    };
    let mut command = Command::new(mpirun);
    command
        .args([
            "-n",
            &ranks.to_string(),
            "--oversubscribe",
            "--mca",
            "btl",
            "self,vader",
        ])
        .args(max_count.map_or(&[][..], |_| &["-x", "DIST_COMM_MPI_MAX_COUNT"][..]))
        .arg(env!("CARGO_BIN_EXE_dist-comm-selftest"))
        .args(args)
        .envs(max_count.map(|n| ("DIST_COMM_MPI_MAX_COUNT", n.to_string())))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let output = test_support::run(&mut command, TIMEOUT);
    let (status, out, err) = (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        status.success(),
        "mpirun -n {ranks} {args:?}: {status}\nstdout:\n{out}\nstderr:\n{err}"
    );
    let mode = if args.contains(&"--adopt") {
        "adopt"
    } else {
        "init"
    };
    let limit = max_count.unwrap_or(i32::MAX as usize);
    for rank in 0..ranks {
        let reported = format!("rank {rank} of {ranks}: MPI element limit per call {limit}");
        assert!(
            out.lines().any(|l| l.ends_with(&reported)),
            "rank {rank} did not report limit {limit}; stdout:\n{out}"
        );
        let line = format!("rank {rank} of {ranks}: ");
        assert!(
            out.lines()
                .any(|l| l.contains(&line) && l.ends_with(&format!("checks passed ({mode})"))),
            "rank {rank} did not report success; stdout:\n{out}\nstderr:\n{err}"
        );
    }
}

#[test]
fn selftest_two_ranks() {
    launch(2, &[]);
}

#[test]
fn selftest_three_ranks() {
    launch(3, &[]);
}

#[test]
fn adopted_communicator_two_ranks() {
    launch(2, &["--adopt"]);
}

#[test]
fn adopted_communicator_three_ranks() {
    launch(3, &["--adopt"]);
}

/// Every collective and point-to-point path with messages longer than one MPI call may name
/// (the limit forced down to 1000 elements; in production it is `i32::MAX`): derived datatypes,
/// all-reduce pieces, `MPI_Alltoallw`, and length errors on long messages.
#[test]
fn selftest_three_ranks_with_messages_split() {
    launch_with(3, &[], Some(1000));
}
