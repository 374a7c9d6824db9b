//! `dist-comm-selftest`: runs dist-comm's conformance checks over `MPI_COMM_WORLD`, to check an
//! MPI installation and launch flags before a long run.
//!
//! ```text
//! mpirun -n 3 dist-comm-selftest            # dist-comm initialises and finalises MPI
//! mpirun -n 3 dist-comm-selftest --adopt    # MPI initialised by "the host" (raw MPI_Init_thread),
//!                                           # adopted through its Fortran handle, finalised by the host
//! ```
//!
//! Every rank prints one line `dist-comm-selftest: rank R of P: N checks passed (MODE)`. On a
//! failure the rank prints the check and aborts the whole job (`MPI_Abort`) so no rank hangs.

use std::ffi::c_int;
use std::process::ExitCode;

use dist_comm::{conformance, CommError, Group, MpiComm};
use mpi::ffi;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => run_init(),
        ["--adopt"] => run_adopt(),
        _ => {
            eprintln!("usage: mpirun -n P dist-comm-selftest [--adopt]");
            ExitCode::from(2)
        }
    }
}

/// Runs the conformance checks; on failure reports and aborts the job.
fn check_all(comm: &MpiComm, mode: &str) {
    // The per-call element limit (lowered by the split-path test).
    println!(
        "dist-comm-selftest: rank {} of {}: MPI element limit per call {}",
        comm.rank(),
        comm.size(),
        dist_comm::mpi_max_count()
    );
    match conformance::run_all(comm) {
        Ok(n) => println!(
            "dist-comm-selftest: rank {} of {}: {n} checks passed ({mode})",
            comm.rank(),
            comm.size()
        ),
        Err(e) => {
            eprintln!(
                "dist-comm-selftest: rank {} of {}: FAILED ({mode}): {e}",
                comm.rank(),
                comm.size()
            );
            comm.abort(1);
        }
    }
}

fn run_init() -> ExitCode {
    let comm = match MpiComm::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dist-comm-selftest: cannot start MPI: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !comm.owns_environment() {
        eprintln!("dist-comm-selftest: MpiComm::init does not own the MPI environment");
        comm.abort(1);
    }
    check_all(&comm, "init");
    // A second initialisation must be refused, not attempted.
    if !matches!(MpiComm::init(), Err(CommError::Environment(_))) {
        eprintln!("dist-comm-selftest: a second MpiComm::init was not refused");
        comm.abort(1);
    }
    drop(comm);
    if !mpi::environment::is_finalized() {
        eprintln!("dist-comm-selftest: dropping the initialising MpiComm did not finalise MPI");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Plays a host application (a C++ trainer, mpi4py) that owns MPI: raw `MPI_Init_thread`,
/// then hands dist-comm its world communicator as a Fortran handle.
fn run_adopt() -> ExitCode {
    let mut provided: c_int = 0;
    // SAFETY: MPI is not initialised yet in this process; null argc/argv are allowed; the
    // threading constant is read from rsmpi's C shim.
    let rc = unsafe {
        ffi::MPI_Init_thread(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            ffi::RSMPI_THREAD_FUNNELED,
            &mut provided,
        )
    };
    if rc != ffi::MPI_SUCCESS as c_int {
        eprintln!("dist-comm-selftest: MPI_Init_thread failed with code {rc}");
        return ExitCode::FAILURE;
    }
    let failed = adopt_checks();
    if let Err(e) = &failed {
        eprintln!("dist-comm-selftest: adopt: {e}");
    }
    // The host finalises; dist-comm must not have done it already.
    if mpi::environment::is_finalized() {
        eprintln!("dist-comm-selftest: an adopted MpiComm finalised MPI behind the host's back");
        return ExitCode::FAILURE;
    }
    // SAFETY: MPI is initialised and not finalised, every dist-comm handle is dropped.
    let rc = unsafe { ffi::MPI_Finalize() };
    if failed.is_err() || rc != ffi::MPI_SUCCESS as c_int {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn adopt_checks() -> Result<(), String> {
    if !matches!(MpiComm::init(), Err(CommError::Environment(_))) {
        return Err("MpiComm::init did not refuse an MPI initialised by the host".into());
    }
    for bad in [-1, 1 << 30] {
        if MpiComm::from_fortran_handle(bad).is_ok() {
            return Err(format!("Fortran handle {bad} was accepted"));
        }
    }
    // SAFETY: MPI is initialised, so MPI_COMM_WORLD is valid; c2f only converts the handle.
    let world = unsafe { ffi::RSMPI_Comm_c2f(ffi::RSMPI_COMM_WORLD) };
    let comm = MpiComm::from_fortran_handle(world).map_err(|e| e.to_string())?;
    if comm.owns_environment() {
        return Err("an adopted communicator claims to own the MPI environment".into());
    }
    check_all(&comm, "adopt");
    let second = MpiComm::world_if_initialized()
        .map_err(|e| e.to_string())?
        .ok_or("world_if_initialized returned None with MPI initialised")?;
    second.barrier().map_err(|e| e.to_string())?;
    drop(second);
    drop(comm);
    Ok(())
}
