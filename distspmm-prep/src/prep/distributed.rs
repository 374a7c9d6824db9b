//! The pipeline on the ranks of a job: `prep::distributed::run`, what `mpirun -n P distspmm
//! partition --distributed` calls. No rank holds the whole graph.
//!
//! Phases, each ending in an agreement (a failure anywhere is every rank's error):
//! 1. **read**: rank r reads its slice of the `.npz` / `.npy` directory ([`npz::read_slice`]);
//! 2. **graph**: the symmetric adjacency of its node range ([`DistAdjacency`]);
//! 3. **partition**: the caller's distributed partitioner (PT-Scotch in the CLI; this crate does
//!    not link one) gives each of the rank's nodes its part;
//! 4. **exchange**: the edges to the ranks that build their rows, then **build**: the chunks of
//!    the rank's parts ([`crate::chunk::distributed::build`]), each written into the staging
//!    directory rank 0 made beside the output (on a file system every rank writes:
//!    [`SharedWrite`]);
//! 5. **write**: rank 0 gathers the chunks' manifest entries, checks the old directory may be
//!    replaced, writes the partition map and the manifest and puts the directory in place. A
//!    failure before that (or a killed job) leaves the output as it was.

use std::path::PathBuf;
use std::string::String;
use std::time::Instant;
use std::vec::Vec;

use chunk_format::dir::{
    chunk_file_name, partition_map, write_part, DirFacts, DirLock, Manifest, ManifestChunk,
    SharedWrite, WriteOptions,
};
use chunk_format::Version;
use dist_comm::agree::{self, PeerFailure};
use dist_comm::{Broadcast, CommError, ReduceOp};

use crate::chunk::distributed::{self as dist, BuildComm, DistBuildError, StepBytes};
use crate::graph::{npz, slice_range, Graph, GraphError};
use crate::normalize::Normalization;
use crate::partition::{Balance, DistAdjacency};

use super::rss;

/// What [`run`] makes: from which input, into how many parts, where.
#[derive(Debug, Clone)]
pub struct DistPrepConfig {
    /// An `.npz` file or a directory of `.npy` files, readable by every rank.
    pub input: PathBuf,
    /// Parts K (at least the rank count).
    pub parts: u32,
    /// The chunk directory, on a file system every rank writes.
    pub out: PathBuf,
    /// Normalisation of Â.
    pub normalization: Normalization,
    /// What the partitioner balances: nodes, or non-zeros of Â (vertex weight degree + 1).
    pub balance: Balance,
    /// Replace a directory holding another partition.
    pub force: bool,
    /// Recorded in the manifest.
    pub command_line: Vec<String>,
}

/// A distributed partitioner: every rank calls it at once with its rows of the graph and, for
/// [`Balance::Nonzeros`], their vertex weights; it returns the part of each of the rank's
/// nodes and the edge cut (the same on every rank), or a message.
pub trait DistPartitioner {
    /// The method tag the partition records (its fingerprint covers it).
    fn tag(&self) -> String;
    /// Partitions into `parts` parts.
    fn partition(
        &mut self,
        graph: &DistAdjacency,
        weights: Option<&[u64]>,
        parts: u32,
    ) -> Result<(Vec<u32>, u64), String>;
}

/// A phase of [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistPhase {
    /// Reading the rank's slice.
    Read,
    /// Building its rows of the symmetric adjacency.
    Graph,
    /// The distributed partitioner.
    Partition,
    /// The edges to the ranks that build their rows.
    Exchange,
    /// The rows, degrees, halo lists and node data of the rank's parts (their messages too),
    /// its chunks built and written.
    Build,
    /// Rank 0's manifest and the directory swap.
    Write,
}

impl DistPhase {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            DistPhase::Read => "read",
            DistPhase::Graph => "graph",
            DistPhase::Partition => "partition",
            DistPhase::Exchange => "exchange",
            DistPhase::Build => "build",
            DistPhase::Write => "write",
        }
    }
}

/// One phase as every rank saw it.
#[derive(Debug, Clone)]
pub struct DistPhaseReport {
    /// The phase.
    pub phase: DistPhase,
    /// This rank's seconds.
    pub seconds: f64,
    /// Every rank's peak resident memory in the phase (VmHWM; 0 where unknown), by rank.
    pub peak_rss: Vec<u64>,
}

/// What [`run`] did, on every rank (the manifest on rank 0 only).
#[derive(Debug)]
pub struct DistPrepReport {
    /// The manifest written (rank 0).
    pub manifest: Option<Manifest>,
    /// Ranks.
    pub ranks: usize,
    /// Non-zeros of Â.
    pub nnz: u64,
    /// The phases in order.
    pub phases: Vec<DistPhaseReport>,
    /// This rank's own arrays at the end of the build's steps (counted).
    pub steps: StepBytes,
    /// Wall seconds of the whole run.
    pub seconds: f64,
}

impl DistPrepReport {
    /// The busiest rank's peak in `phase` over its share of Â's non-zeros (nnz / ranks).
    pub fn bytes_per_nnz_per_rank(&self, phase: &DistPhaseReport) -> f64 {
        let share = (self.nnz as f64 / self.ranks as f64).max(1.0);
        phase.peak_rss.iter().copied().max().unwrap_or(0) as f64 / share
    }
}

/// Why [`run`] failed; every rank returns one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistPrepError {
    /// Fewer parts than ranks.
    #[error(
        "{parts} parts with {ranks} ranks: every rank builds at least one part; give {ranks} \
         parts or more, or start fewer ranks"
    )]
    TooFewParts {
        /// K.
        parts: u32,
        /// P.
        ranks: usize,
    },
    /// The input is neither an `.npz` file nor a directory.
    #[error(
        "{} is neither an .npz file nor a directory of .npy files, which each rank reads its \
         slice of: write the graph as .npz first (numpy.savez, torch_geometric), or partition it \
         on one machine",
        .0.display()
    )]
    Format(PathBuf),
    /// This rank's slice of the input cannot be read.
    #[error("cannot read the input graph")]
    Read(#[source] GraphError),
    /// The output directory cannot be written.
    #[error("cannot write the chunks into {}", out.display())]
    Out {
        /// The output directory.
        out: PathBuf,
        /// Why.
        #[source]
        source: chunk_format::dir::ChunkDirError,
    },
    /// The partitioner failed.
    #[error("the partitioner failed: {0}")]
    Partitioner(String),
    /// Building the chunks failed.
    #[error("cannot build the chunks")]
    Build(#[source] DistBuildError),
    /// Another rank failed: the lowest failing rank and its message.
    #[error(transparent)]
    Peer(#[from] PeerFailure),
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// This rank's outcome made collective: its own error, or the lowest failing rank's (told with
/// its causes).
fn agreed<C: BuildComm, T>(comm: &C, local: Result<T, DistPrepError>) -> Result<T, DistPrepError> {
    match agree::outcome_keeping_own(comm, local, |e| agree::message_with_sources(e))? {
        Ok(value) => Ok(value),
        Err(agree::Failure::Own(own)) => Err(own),
        Err(agree::Failure::Peer(peer)) => Err(DistPrepError::Peer(peer)),
    }
}

/// Times the phases and reads this rank's peak memory in each.
struct Phases {
    entries: Vec<(DistPhase, f64, u64)>,
    started: Instant,
}

impl Phases {
    fn new() -> Self {
        rss::reset_peak();
        Self {
            entries: Vec::new(),
            started: Instant::now(),
        }
    }

    fn done(&mut self, phase: DistPhase) {
        let seconds = self.started.elapsed().as_secs_f64();
        let peak = rss::peak().unwrap_or(0);
        tracing::info!(phase = phase.name(), seconds, peak, "phase done");
        self.entries.push((phase, seconds, peak));
        rss::trim();
        rss::reset_peak();
        self.started = Instant::now();
    }
}

/// Runs the pipeline on every rank of `comm` at once (see the [module docs](self)), with
/// `partitioner` as the distributed partitioner.
///
/// # Errors
/// Every rank returns an error when any fails: its own, or [`DistPrepError::Peer`] with the
/// lowest failing rank's message.
pub fn run<C: BuildComm + Broadcast>(
    comm: &C,
    config: &DistPrepConfig,
    partitioner: &mut dyn DistPartitioner,
) -> Result<DistPrepReport, DistPrepError> {
    let started = Instant::now();
    let (rank, ranks) = (comm.rank(), comm.size());
    let parts = config.parts;
    if (parts as usize) < ranks {
        return Err(DistPrepError::TooFewParts { parts, ranks });
    }
    let input = &config.input;
    if !(input.is_dir() || input.extension().is_some_and(|e| e == "npz")) {
        return Err(DistPrepError::Format(input.clone()));
    }
    let out_error = |source| DistPrepError::Out {
        out: config.out.clone(),
        source,
    };
    // Rank 0 holds the directory's lock for the whole run.
    let lock = agreed(
        comm,
        if rank == 0 {
            DirLock::acquire(&config.out).map(Some).map_err(out_error)
        } else {
            Ok(None)
        },
    )?;
    let mut phases = Phases::new();

    // Read.
    let read = npz::read_slice(input, rank, ranks).map_err(DistPrepError::Read);
    let (mut slice, nodes) = agreed(comm, read)?;
    let n = match nodes {
        npz::SliceNodes::Known(n) => n,
        npz::SliceNodes::AtLeast(n) => {
            let mut max = [n as u64];
            comm.all_reduce(&mut max, ReduceOp::Max)?;
            let n = distspmm_sparse::index::offset(max[0]);
            let range = slice_range(n as u64, ranks, rank);
            slice.num_nodes = n;
            slice.first_node = distspmm_sparse::index::offset(range.start);
            slice.nodes = Graph {
                num_nodes: distspmm_sparse::index::offset(range.end - range.start),
                ..Graph::default()
            };
            n
        }
    };
    phases.done(DistPhase::Read);

    // The distributed graph.
    let adjacency = DistAdjacency::build(comm, n, &slice.src, &slice.dst)?;
    let weights = matches!(config.balance, Balance::Nonzeros).then(|| adjacency.nonzero_weights());
    phases.done(DistPhase::Graph);

    // The partitioner.
    let tag = partitioner.tag();
    let parted = partitioner
        .partition(&adjacency, weights.as_deref(), parts)
        .map_err(DistPrepError::Partitioner);
    let (slice_parts, edge_cut) = agreed(comm, parted)?;
    drop((weights, adjacency));
    phases.done(DistPhase::Partition);

    // Exchange, build and write this rank's chunks into rank 0's staging directory.
    let staging = agreed(
        comm,
        lock.as_ref()
            .map(SharedWrite::begin)
            .transpose()
            .map_err(out_error),
    )?;
    let staging_path = {
        let mut bytes = staging.as_ref().map_or_else(Vec::new, |s| {
            s.path().as_os_str().as_encoded_bytes().to_vec()
        });
        let mut len = [bytes.len() as u64];
        comm.broadcast(&mut len, 0)?;
        bytes.resize(distspmm_sparse::index::offset(len[0]), 0);
        comm.broadcast(&mut bytes, 0)?;
        // The bytes rank 0's own `OsStr` gave: a path on the shared file system.
        PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())
    };
    let mut written = Vec::new();
    let mut steps = StepBytes::default();
    let built = dist::build(
        comm,
        slice,
        &slice_parts,
        parts,
        &tag,
        config.normalization,
        &mut steps,
        &mut || phases.done(DistPhase::Exchange),
        |chunk| {
            written.push(write_part(&staging_path, &chunk.contents())?);
            Ok(())
        },
    )
    .map_err(DistPrepError::Build)?;
    phases.done(DistPhase::Build);

    // Rank 0 gathers the chunks' manifest entries and commits.
    let entries = dist::all_gather_v(comm, &encode_entries(&written))?;
    let committed = match (&lock, staging) {
        (Some(lock), Some(staging)) => {
            let partition = &built.partition;
            let facts = DirFacts {
                parts: partition.parts(),
                nodes: partition.num_nodes() as u64,
                partition_map: partition_map::encode(
                    partition.parts(),
                    partition.method(),
                    partition.part_of(),
                ),
                partition_method: partition.method().into(),
                imbalance: partition.imbalance(),
                part_offsets: partition.renumbering().offsets().to_vec(),
                fingerprint: partition.fingerprint(),
                halo_rows: built.halo_rows.clone(),
                feature_dim: built.feature_dim,
                classes: built.num_classes,
                nnz: built.nnz,
                edges: built.edges,
                edge_cut,
            };
            let options = WriteOptions {
                force: config.force,
                normalization: config.normalization.name().into(),
                command_line: config.command_line.clone(),
                ..WriteOptions::default()
            };
            staging
                .commit(lock, &facts, decode_entries(&entries), &options)
                .map(Some)
                .map_err(out_error)
        }
        _ => Ok(None),
    };
    let manifest = agreed(comm, committed)?;
    phases.done(DistPhase::Write);

    // Every rank's phase peaks.
    let mine: Vec<u64> = phases.entries.iter().map(|e| e.2).collect();
    let all = comm.all_gather_vec(&mine)?;
    let k = mine.len();
    let phases = phases
        .entries
        .iter()
        .enumerate()
        .map(|(i, &(phase, seconds, _))| DistPhaseReport {
            phase,
            seconds,
            peak_rss: (0..ranks).map(|r| all[r * k + i]).collect(),
        })
        .collect();
    Ok(DistPrepReport {
        manifest,
        ranks,
        nnz: built.nnz,
        phases,
        steps,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Words per chunk entry between the ranks: part, bytes, checksum, nodes, non-zeros, version.
const WORDS: usize = 6;

fn encode_entries(written: &[(ManifestChunk, Version)]) -> Vec<u64> {
    let mut out = Vec::with_capacity(written.len() * WORDS);
    for (c, version) in written {
        out.extend([
            u64::from(c.part),
            c.bytes,
            chunk_format::dir::parse_checksum(&c.checksum).unwrap_or(0),
            c.nodes,
            c.nnz,
            (u64::from(version.major) << 16) | u64::from(version.minor),
        ]);
    }
    out
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "the words were made from a u32 part and two u16 version numbers"
)]
fn decode_entries(words: &[u64]) -> Vec<(ManifestChunk, Version)> {
    words
        .chunks_exact(WORDS)
        .map(|w| {
            let part = w[0] as u32;
            (
                ManifestChunk {
                    part,
                    file: chunk_file_name(part),
                    bytes: w[1],
                    checksum: chunk_format::dir::format_checksum(w[2]),
                    nodes: w[3],
                    nnz: w[4],
                },
                Version {
                    major: (w[5] >> 16) as u16,
                    minor: (w[5] & 0xffff) as u16,
                },
            )
        })
        .collect()
}

#[cfg(test)]
#[path = "distributed_tests.rs"]
mod tests;
