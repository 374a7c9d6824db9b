//! What the distributed commands (`verify`, `bench dist`) share: how this process becomes one
//! or more ranks (MPI under `mpirun`, threads with `--local-ranks`, or a single rank), loading
//! this rank's chunk so that a failure on one rank fails every rank, plain-words messages for
//! operator errors, and the deterministic test matrices.
//!
//! Under MPI, an error every rank returns together (an agreement failure, a failed check whose
//! verdict was shared) ends each process with a message and a non-zero exit. An error only this
//! rank knows about (a communication failure, a local I/O error while others wait in a
//! collective) aborts the job with `MPI_Abort`, so that no rank is left waiting.

use std::fmt;
use std::io::Write as _;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use chunk_format::dir::ChunkDir;
use dist_comm::agree::check_parts;
use dist_comm::{AllGather, Communicator, Group, LocalComm, MpiComm};
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::{abstain, open_rank_chunk, DistSpmmError, OpenError, RankChunk};

/// How ranks are formed (shared by the distributed commands).
#[derive(Debug, Clone, clap::Args)]
pub struct Launch {
    /// Run P ranks as threads of this one process instead of MPI processes (no MPI needed).
    /// Without it the ranks are the processes `mpirun` started, or this process alone.
    #[arg(long, value_name = "P")]
    pub local_ranks: Option<usize>,
}

/// The schedule of a distributed product, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScheduleArg {
    /// Every rank broadcasts its rows to all (the seed's schedule, CAGNET 1D).
    Broadcast,
    /// Every rank sends each peer only the rows the peer's non-zeros reference.
    Halo,
}

impl From<ScheduleArg> for ScheduleKind {
    fn from(s: ScheduleArg) -> Self {
        match s {
            ScheduleArg::Broadcast => ScheduleKind::Broadcast,
            ScheduleArg::Halo => ScheduleKind::Halo,
        }
    }
}

/// `--comm-precision`: the format of the distributed SpMM's messages (`f32`, `bf16`, `f16`).
pub fn parse_precision(s: &str) -> Result<distspmm_op::Precision, String> {
    s.parse()
        .map_err(|e: distspmm_sparse::kernel::convert::UnknownPrecision| e.to_string())
}

/// The body of a distributed command, run once per rank.
pub trait RankMain: Sync {
    /// Runs this rank's part over `comm` (collective calls in the same order on every rank).
    fn run<C: Communicator>(&self, comm: &C) -> anyhow::Result<()>;
}

/// An error every rank returns from the same step, so no rank waits for another.
#[derive(Debug)]
pub struct OnAllRanks(pub anyhow::Error);

impl fmt::Display for OnAllRanks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", super::message(&self.0))
    }
}

impl std::error::Error for OnAllRanks {}

/// Whether every rank returns this error (then a plain non-zero exit is safe under MPI).
fn is_collective(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.is::<OnAllRanks>()
            || e.downcast_ref::<DistSpmmError>()
                .is_some_and(DistSpmmError::is_collective)
    })
}

/// Whether `mpirun` (or another MPI launcher) started this process.
pub fn under_mpi_launcher() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MV2_COMM_WORLD_SIZE",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// Runs `main` on every rank this process holds; see [`Launch`]. `chunks` is the chunk
/// directory the ranks will load: with `--local-ranks P` its part count is checked against P
/// before any thread starts.
pub fn launch(launch: &Launch, chunks: &Path, main: &impl RankMain) -> anyhow::Result<()> {
    if let Some(ranks) = launch.local_ranks {
        if under_mpi_launcher() {
            bail!("--local-ranks runs the ranks as threads of one process: drop it under mpirun");
        }
        if ranks == 0 {
            bail!("--local-ranks must be at least 1");
        }
        let dir = ChunkDir::open(chunks)
            .with_context(|| format!("cannot open the chunk directory {}", chunks.display()))?;
        if let Err(e) = check_parts(dir.parts() as usize, ranks) {
            return Err(explain(e.into(), chunks));
        }
        let results = LocalComm::try_run(ranks, |comm| main.run(&comm))?;
        return results.into_iter().find(Result::is_err).unwrap_or(Ok(()));
    }
    if !under_mpi_launcher() {
        let comm = LocalComm::group(1)
            .pop()
            .context("cannot form a single local rank")?;
        return main.run(&comm);
    }
    let comm = MpiComm::init().context("cannot initialise MPI")?;
    match main.run(&comm) {
        Ok(()) => Ok(()),
        Err(err) => {
            let collective = is_collective(&err);
            fail_under_mpi(comm, &err, collective)
        }
    }
}

/// Ends this MPI process after `err`, the one rule for every command under `mpirun`: an error
/// every rank holds (`collective`) is printed by each rank, which then meet in a barrier and
/// exit together; an error only this rank knows of aborts the job (`MPI_Abort`), so that no
/// rank is left waiting for this one.
pub fn fail_under_mpi(comm: MpiComm, err: &anyhow::Error, collective: bool) -> ! {
    if comm.size() > 1 && !collective {
        eprintln!("error on rank {}: {}", comm.rank(), super::message(err));
        eprintln!("aborting the MPI job so that the other ranks do not wait for this one");
        comm.abort(1)
    }
    // Every rank has this error: each prints it before any exits, since mpirun kills the rest
    // of the job when the first process ends with a failure. One write per line, so that the
    // ranks' lines do not interleave.
    let line = format!("error: {}\n", super::message(err));
    let _ = std::io::stderr().write_all(line.as_bytes());
    // The barrier cannot hang: every rank got the same error from the same step. If it fails
    // (a rank died meanwhile) the message is out already.
    let _ = comm.barrier();
    drop(comm); // MPI_Finalize
    std::process::exit(1)
}

/// Refuses a run whose dense N × `features` matrices (`bytes_per_value` bytes per entry over
/// all ranks together) cannot fit in memory, before any rank starts.
pub fn check_matrix_memory(
    chunks: &Path,
    features: usize,
    bytes_per_value: u64,
    command: &str,
) -> anyhow::Result<()> {
    let dir = ChunkDir::open(chunks)
        .with_context(|| format!("cannot open the chunk directory {}", chunks.display()))?;
    let nodes = dir.manifest().nodes;
    let values = nodes.saturating_mul(features as u64);
    distspmm_sparse::memory::check(
        format!("`distspmm {command}` with --features {features} on {nodes} nodes"),
        values.saturating_mul(bytes_per_value),
        "lower --features",
    )?;
    Ok(())
}

/// Opens the chunk directory and loads this rank's chunk (`distspmm_op::open_rank_chunk`).
/// Collective: a rank that cannot (the directory has another part count, no chunk for it, or
/// loading fails) joins the operator's agreement step with [`abstain`], so every rank fails
/// together.
pub fn load_chunk<C: AllGather>(comm: &C, dir: &Path) -> anyhow::Result<(ChunkDir, RankChunk)> {
    match open_rank_chunk(dir, comm.rank(), comm.size()) {
        Ok(opened) => Ok(opened),
        // Every rank reads the same manifest: the agreement's verdict is the mismatch.
        Err(e @ OpenError::PartsMismatch { .. }) => {
            Err(explain(abstain(comm, e.chunk_parts()), dir))
        }
        Err(e) => {
            abstain(comm, e.chunk_parts());
            // A rank that fails here reports its own error; the others learn of it in the
            // agreement.
            Err(OnAllRanks(e.into()).into())
        }
    }
}

/// An operator error in plain words, marked as shared by every rank where it is.
pub fn explain(err: DistSpmmError, dir: &Path) -> anyhow::Error {
    match err {
        DistSpmmError::PartsMismatch(m) => {
            OnAllRanks(anyhow!("chunk directory {}: {m}", dir.display())).into()
        }
        DistSpmmError::Disagreement(m) => {
            OnAllRanks(anyhow!("chunk directory {}: {m}", dir.display())).into()
        }
        e if e.is_collective() => OnAllRanks(e.into()).into(),
        e => e.into(),
    }
}

/// Row `row`, column `col` of test matrix `seed`: a deterministic value in [−1, 1] with few
/// mantissa bits, so every rank can make its own rows of the same global matrix.
pub fn test_value(seed: u64, row: u64, col: usize) -> f32 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(row.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(col as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % 4097) as f32 / 2048.0 - 1.0
}

/// Rows `first..first+rows` of test matrix `seed` with `features` columns, row-major.
pub fn test_matrix(seed: u64, first: u64, rows: usize, features: usize) -> Vec<f32> {
    (0..rows as u64)
        .flat_map(|i| (0..features).map(move |j| test_value(seed, first + i, j)))
        .collect()
}
