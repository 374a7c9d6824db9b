//! PT-Scotch's distributed k-way graph partitioner under MPI, from Rust: each rank holds a
//! contiguous range of the vertices of a symmetric graph (CSR rows with global neighbour ids)
//! and gets back the part of each of its vertices.
//!
//! ```no_run
//! use distspmm_ptscotch::{partition, DistGraph, Options};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let comm = dist_comm::MpiComm::init()?;
//! // A path 0 - 1 - 2 - 3 over two ranks: rank 0 holds vertices 0..2, rank 1 holds 2..4.
//! let vtxdist = [0, 2, 4];
//! let (xadj, adjncy): (&[u64], &[u64]) = if dist_comm::Group::rank(&comm) == 0 {
//!     (&[0, 1, 3], &[1, 0, 2])
//! } else {
//!     (&[0, 2, 3], &[1, 3, 2])
//! };
//! let graph = DistGraph::new(&vtxdist, xadj, adjncy);
//! let parts = partition(&comm, &graph, &Options::new(2))?; // the part of vertices 0..2 or 2..4
//! let quality = distspmm_ptscotch::evaluate(&comm, &graph, &parts, 2)?;
//! println!("edge cut {}", quality.edge_cut);
//! # Ok(()) }
//! ```
//!
//! # What the caller gives
//! - **The distribution** `vtxdist` (P + 1 entries, the same on every rank): rank r holds the
//!   global vertices `vtxdist[r]..vtxdist[r + 1]`; ranks may hold none.
//! - **The graph**: `xadj` (the rank's vertex count + 1 offsets from 0) and `adjncy` (global
//!   neighbour ids), *symmetric* (every edge stored as both arcs, with equal weights), without
//!   self loops or duplicate arcs: PT-Scotch's requirements. Optional vertex weights (one per
//!   local vertex) and edge weights (one per arc), all ≥ 1.
//! - **The options**: K parts (any K ≥ 1, also more than the ranks), the imbalance (largest part
//!   weight over the mean, ≥ 1, e.g. 1.03), the seed, the strategy, threads per rank.
//!
//! Everything is checked before PT-Scotch sees it, and every rank returns the same verdict
//! (the lowest failing rank's [`PtScotchError::Input`] with its [`InputErrorKind`]), so one bad
//! rank never leaves the others waiting in a collective. Symmetry is checked by comparing hashes
//! of the arcs and their reversals (see `check.rs`): no arc moves between ranks for it.
//!
//! # The call
//! `SCOTCH_dgraphBuild` over copies of the arrays as `SCOTCH_Num` (8 bytes per offset, arc and
//! weight), the strategy ([`Strategy`]: `SCOTCH_stratDgraphMapBuild` with its flags, P, K and
//! the imbalance − 1, or `SCOTCH_stratDgraphMap` with [`Strategy::Skewed`]'s string; by default
//! [`Strategy::Auto`] picks one from the degrees), then `SCOTCH_dgraphPart`, in an execution context (`SCOTCH_Context`) of its own: its own
//! random generator seeded with [`Options::seed`], PT-Scotch's *deterministic* option on, and
//! [`Options::threads`] threads. For a given seed, rank count, graph and distribution the parts
//! are the same on every run (the integration tests check it). The parts differ between rank
//! counts: PT-Scotch's coarsening follows the distribution.
//!
//! PT-Scotch's own errors (a failing call, out of memory) print its message on the failing
//! rank's standard error (`libptscotcherr`, which returns; this crate never links
//! `libptscotcherrexit`, which calls `exit()`), and every rank returns
//! [`PtScotchError::Partitioner`] with the lowest failing rank's call.
//!
//! # MPI thread level
//! Debian's PT-Scotch 7.0 is built with `SCOTCH_PTHREAD` and `SCOTCH_PTHREAD_MPI`: with more
//! than one thread per rank some of its algorithms (the folding of the distributed graph onto
//! halves of the ranks) call MPI from two threads at once, which needs `MPI_THREAD_MULTIPLE`.
//! By default this crate runs PT-Scotch on one thread per rank (its context's thread count,
//! whatever `SCOTCH_PTHREAD_NUMBER` says), which needs only that the calling thread may call MPI:
//! `MPI_THREAD_FUNNELED` from the main thread, as `dist_comm::MpiComm::init` initialises it.
//! [`Options::threads`] > 1 is refused unless MPI grants `MPI_THREAD_MULTIPLE`.
//!
//! # Linking
//! build.rs links the 64-bit archives of `libptscotch-dev`
//! (`/usr/lib/x86_64-linux-gnu/scotch-int64/libptscotch.a`, `libptscotcherr.a`) statically by
//! path, so the 32-bit library of the same soname can never be loaded instead, and fails the
//! build unless the header's `SCOTCH_Num` is `int64_t`; [`partition`] also checks the linked
//! library's `SCOTCH_numSizeof()` is 8 ([`PtScotchError::NumSize`]).

mod check;
mod ffi;
mod quality;
mod scotch;

pub use check::GraphTotals;
pub use quality::{evaluate, Quality};

use dist_comm::{AllGather, AllReduce, CommError, MpiComm};
use distspmm_prep::partition::DegreeSpread;

/// One rank's share of a symmetric graph distributed by contiguous vertex ranges.
#[derive(Debug, Clone, Copy)]
pub struct DistGraph<'a> {
    /// The first global vertex of every rank, then the vertex count (P + 1 entries, the same on
    /// every rank).
    pub vtxdist: &'a [u64],
    /// Offsets of this rank's vertices' neighbour lists in `adjncy` (its vertex count + 1,
    /// from 0).
    pub xadj: &'a [u64],
    /// Global neighbour ids.
    pub adjncy: &'a [u64],
    /// One weight ≥ 1 per local vertex (e.g. degree + 1 to balance non-zeros of Â), or none
    /// (every vertex weighs 1).
    pub vertex_weights: Option<&'a [u64]>,
    /// One weight ≥ 1 per arc, equal in both directions of an edge, or none (all 1).
    pub edge_weights: Option<&'a [u64]>,
}

impl<'a> DistGraph<'a> {
    /// A graph without weights.
    pub fn new(vtxdist: &'a [u64], xadj: &'a [u64], adjncy: &'a [u64]) -> Self {
        Self {
            vtxdist,
            xadj,
            adjncy,
            vertex_weights: None,
            edge_weights: None,
        }
    }

    /// The same graph with vertex weights.
    pub fn with_vertex_weights(self, weights: &'a [u64]) -> Self {
        Self {
            vertex_weights: Some(weights),
            ..self
        }
    }

    /// The same graph with edge weights.
    pub fn with_edge_weights(self, weights: &'a [u64]) -> Self {
        Self {
            edge_weights: Some(weights),
            ..self
        }
    }
}

/// Which PT-Scotch strategy partitions the graph.
///
/// PT-Scotch's predefined strategies (`SCOTCH_stratDgraphMapBuild`'s flags) refine every
/// bisection with sequential Fiduccia–Mattheyses (FM), which picks each move by scanning its
/// gain table past the vertices the balance forbids to move. On a power-law graph nearly every
/// vertex has a cut edge, so the scan covers the graph and the refinement grows with the square
/// of its size (RMAT-18, 3.8 M edges: over 5 minutes at P = 1 and 2); and coarsening keeps
/// nearly all arcs for many levels (the hubs' neighbourhoods merge slowly), about 110–130 bytes
/// per arc on every rank. [`Strategy::Skewed`] avoids both; [`Strategy::Auto`] picks it for
/// graphs with skewed degrees and [`Strategy::Quality`] otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Strategy {
    /// [`Strategy::Skewed`] when the degrees are skewed (their standard deviation above half
    /// their mean, isolated vertices left out: the rule `distspmm partition --method auto`
    /// uses), else [`Strategy::Quality`]. [`choose_strategy`] says which.
    #[default]
    Auto = 0,
    /// `SCOTCH_STRATQUALITY`: the best cut PT-Scotch's predefined strategies give (meshes).
    Quality = 1,
    /// `SCOTCH_STRATBALANCE`: balance enforced strictly (exactifying refinement with a zero
    /// tolerance at the end).
    Balance = 2,
    /// `SCOTCH_STRATSPEED`: fewer bipartitioning passes.
    Speed = 3,
    /// `SCOTCH_STRATDEFAULT`.
    Default = 4,
    /// For power-law graphs: recursive bisection in which each bisection of a (sub)graph of
    /// at least 400,000 arcs is one pass of greedy graph growing (linear in the arcs, no FM, no
    /// coarsening), and smaller ones are multilevel with FM. Every rank gathers the graph it
    /// bisects (PT-Scotch's `q` method), so a rank's memory is about the whole graph's
    /// (≈ 23 bytes per arc) whatever P.
    Skewed = 5,
}

/// The cut-off (arcs of the graph being bisected) above which [`Strategy::Skewed`] grows
/// the bisection greedily instead of running multilevel FM.
const SKEWED_GREEDY_ARCS: u64 = 400_000;

/// The strategy [`partition`] runs for `strategy` on `graph` (collective): `strategy` itself
/// unless it is [`Strategy::Auto`], which becomes [`Strategy::Skewed`] when the degrees of the
/// non-isolated vertices have a standard deviation above half their mean, else
/// [`Strategy::Quality`]. The same on every rank.
///
/// # Errors
/// [`PtScotchError::Comm`].
pub fn choose_strategy<C: AllReduce>(
    comm: &C,
    graph: &DistGraph<'_>,
    strategy: Strategy,
) -> Result<Strategy, PtScotchError> {
    if strategy != Strategy::Auto {
        return Ok(strategy);
    }
    // Vertices with arcs, their degrees' sum and the sum of their squares, added up over the
    // ranks; the rule is `partition --method auto`'s (`DegreeSpread`).
    let mut sums = DegreeSpread::sums(graph.xadj);
    comm.all_reduce(&mut sums, dist_comm::ReduceOp::Sum)?;
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "deliberate: a count of vertices, exact in f64 below 2^53"
    )]
    let spread = DegreeSpread::from_sums(sums[0] as u64, sums[1], sums[2]);
    Ok(if spread.is_even() {
        Strategy::Quality
    } else {
        Strategy::Skewed
    })
}

impl Strategy {
    /// The flags of `SCOTCH_stratDgraphMapBuild`, or `None` for the strategies this crate
    /// writes out itself.
    fn flags(self) -> Option<ffi::ScotchNum> {
        match self {
            Self::Quality => Some(ffi::STRAT_QUALITY),
            Self::Balance => Some(ffi::STRAT_BALANCE),
            Self::Speed => Some(ffi::STRAT_SPEED),
            Self::Default => Some(ffi::STRAT_DEFAULT),
            Self::Auto | Self::Skewed => None,
        }
    }

    /// [`Strategy::Skewed`]'s strategy string in PT-Scotch's grammar, for balance tolerance
    /// `tolerance` (the imbalance − 1). The bisection method `h{pass=1}` is one greedy graph
    /// growing; below the cut-off, `m{…}` coarsens to 80 vertices, grows 10 times and refines
    /// every level with FM on the band around the cut.
    fn skewed_string(tolerance: f64) -> String {
        let fm = format!("f{{bal={tolerance:.6},move=80}}");
        let bisect = format!(
            "/(edge<{SKEWED_GREEDY_ARCS})?m{{vert=80,low=h{{pass=10}}{fm},\
             asc=b{{bnd={fm},org={fm}}}}}:h{{pass=1}};"
        );
        format!(
            "r{{bal={tolerance:.6},sep=q{{strat={bisect}}},\
             seq=r{{bal={tolerance:.6},poli=S,sep={bisect}}}}}"
        )
    }
}

/// How to partition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// K, the number of parts (≥ 1; may exceed the rank count; at most `u32::MAX`).
    pub parts: usize,
    /// The largest part's weight over the mean part weight (≥ 1; PT-Scotch's balance tolerance
    /// is this − 1).
    pub imbalance: f64,
    /// Seed of PT-Scotch's random generator for this call.
    pub seed: u64,
    /// PT-Scotch's predefined strategy.
    pub strategy: Strategy,
    /// Threads PT-Scotch uses on each rank (1 unless MPI grants `MPI_THREAD_MULTIPLE`).
    pub threads: usize,
}

impl Options {
    /// K parts, imbalance 1.03 (the CLI's default), seed 1, [`Strategy::Auto`], one thread.
    pub fn new(parts: usize) -> Self {
        Self {
            parts,
            imbalance: 1.03,
            seed: 1,
            strategy: Strategy::Auto,
            threads: 1,
        }
    }
}

/// What is wrong with the input, as found on the rank that holds it (see [`PtScotchError`] for
/// what every rank returns).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// `vtxdist` has the wrong length, does not start at 0, decreases, or disagrees with the
    /// rank's `xadj`.
    #[error("bad vertex distribution: {0}")]
    Distribution(String),
    /// `xadj` does not start at 0, decreases, or does not end at `adjncy`'s length.
    #[error("bad offsets: {0}")]
    Offsets(String),
    /// A neighbour id is not a vertex of the graph.
    #[error("neighbour id out of range: {0}")]
    VertexId(String),
    /// A vertex lists itself.
    #[error("self loop: {0}")]
    SelfLoop(String),
    /// A vertex lists a neighbour twice.
    #[error("duplicate arc: {0}")]
    DuplicateArc(String),
    /// A weight array has the wrong length.
    #[error("bad weights: {0}")]
    WeightsLength(String),
    /// A weight is 0.
    #[error("zero weight: {0}")]
    ZeroWeight(String),
    /// K is 0 or above `u32::MAX`.
    #[error("bad number of parts: {0}")]
    Parts(String),
    /// The imbalance is below 1 or not finite.
    #[error("bad imbalance: {0}")]
    Imbalance(String),
    /// A count or sum does not fit PT-Scotch's `SCOTCH_Num` (i64).
    #[error("too large for PT-Scotch: {0}")]
    Overflow(String),
    /// The thread count is 0, or above 1 without `MPI_THREAD_MULTIPLE`.
    #[error("bad thread count: {0}")]
    Threads(String),
}

/// The kind of an input error, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum InputErrorKind {
    /// [`InputError::Distribution`].
    Distribution = 1,
    /// [`InputError::Offsets`].
    Offsets = 2,
    /// [`InputError::VertexId`].
    VertexId = 3,
    /// [`InputError::SelfLoop`].
    SelfLoop = 4,
    /// [`InputError::DuplicateArc`].
    DuplicateArc = 5,
    /// [`InputError::WeightsLength`].
    WeightsLength = 6,
    /// [`InputError::ZeroWeight`].
    ZeroWeight = 7,
    /// [`InputError::Parts`] (also parts handed to [`evaluate`] that do not fit).
    Parts = 8,
    /// [`InputError::Imbalance`].
    Imbalance = 9,
    /// [`InputError::Overflow`], or sums over all ranks beyond `SCOTCH_Num`.
    Overflow = 10,
    /// [`InputError::Threads`].
    Threads = 11,
    /// Some arc has no reverse arc with the same weight.
    Asymmetric = 12,
    /// Ranks were given different distributions, options, or weights on some ranks only.
    Disagreement = 13,
}

impl InputErrorKind {
    fn from_code(code: i32) -> Self {
        [
            Self::Distribution,
            Self::Offsets,
            Self::VertexId,
            Self::SelfLoop,
            Self::DuplicateArc,
            Self::WeightsLength,
            Self::ZeroWeight,
            Self::Parts,
            Self::Imbalance,
            Self::Overflow,
            Self::Threads,
            Self::Asymmetric,
        ]
        .into_iter()
        .find(|k| *k as i32 == code)
        .unwrap_or(Self::Disagreement)
    }
}

impl InputError {
    /// Its kind.
    pub fn kind(&self) -> InputErrorKind {
        match self {
            Self::Distribution(_) => InputErrorKind::Distribution,
            Self::Offsets(_) => InputErrorKind::Offsets,
            Self::VertexId(_) => InputErrorKind::VertexId,
            Self::SelfLoop(_) => InputErrorKind::SelfLoop,
            Self::DuplicateArc(_) => InputErrorKind::DuplicateArc,
            Self::WeightsLength(_) => InputErrorKind::WeightsLength,
            Self::ZeroWeight(_) => InputErrorKind::ZeroWeight,
            Self::Parts(_) => InputErrorKind::Parts,
            Self::Imbalance(_) => InputErrorKind::Imbalance,
            Self::Overflow(_) => InputErrorKind::Overflow,
            Self::Threads(_) => InputErrorKind::Threads,
        }
    }
}

/// Why partitioning failed. Every rank returns the same value, except [`PtScotchError::Comm`]
/// (a failing communicator, possibly on one rank only: abort the job then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtScotchError {
    /// Bad input: the lowest failing rank's error (`rank`), or a problem of the whole graph
    /// (`rank` None: asymmetry, sums beyond `SCOTCH_Num`, ranks given different arguments).
    #[error("{}{message}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default())]
    Input {
        /// The lowest rank whose input is wrong, if one rank's input is.
        rank: Option<usize>,
        /// What is wrong.
        kind: InputErrorKind,
        /// In words, with the fix.
        message: String,
    },
    /// PT-Scotch failed on some rank (its own message is on that rank's standard error).
    #[error("PT-Scotch failed on rank {rank}: {message}")]
    Partitioner {
        /// The lowest failing rank.
        rank: usize,
        /// Which call failed, or what ran out.
        message: String,
    },
    /// The linked library's `SCOTCH_Num` is not 8 bytes (a 32-bit PT-Scotch was linked).
    #[error(
        "the linked PT-Scotch has a {bytes}-byte SCOTCH_Num, not 8: link the 64-bit build \
         (/usr/lib/x86_64-linux-gnu/scotch-int64 of libptscotch-dev)"
    )]
    NumSize {
        /// `SCOTCH_numSizeof()`.
        bytes: usize,
    },
    /// The communicator failed (possibly on this rank only).
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// `SCOTCH_numSizeof()` of the linked library: 8 for the 64-bit build this crate links.
pub fn num_size() -> usize {
    // SAFETY: a pure query without arguments, callable at any time.
    let bytes = unsafe { ffi::SCOTCH_numSizeof() };
    usize::try_from(bytes).unwrap_or(0)
}

/// The linked PT-Scotch's version, release and patch level (7, 0, 3 on Debian 12).
pub fn version() -> (i32, i32, i32) {
    let (mut v, mut r, mut p) = (0, 0, 0);
    // SAFETY: three valid out-pointers; a pure query.
    unsafe { ffi::SCOTCH_version(&mut v, &mut r, &mut p) };
    (v, r, p)
}

/// Checks `graph` and `options` on every rank (collective) without partitioning: the graph's
/// totals, or on every rank the same [`PtScotchError::Input`]. [`partition`] runs it first;
/// over any communicator (e.g. `dist_comm::LocalComm`), for `MPI_THREAD_MULTIPLE` taken as
/// granted.
///
/// # Errors
/// [`PtScotchError::Input`], [`PtScotchError::Comm`].
pub fn check<C: AllReduce + AllGather>(
    comm: &C,
    graph: &DistGraph<'_>,
    options: &Options,
) -> Result<GraphTotals, PtScotchError> {
    check::check(comm, graph, options, true)
}

/// Partitions the distributed `graph` into `options.parts` parts with PT-Scotch (collective
/// over `comm`): the part (`< options.parts`) of each of this rank's vertices, in order.
///
/// Memory on top of the caller's arrays: the arrays as `SCOTCH_Num` (8 bytes per offset, arc
/// and weight) and the parts (8 bytes per vertex) for the call, then PT-Scotch's own working
/// set (ghost arcs, the coarsened graphs).
///
/// # Errors
/// The same on every rank: [`PtScotchError::Input`] for bad input (nothing reaches PT-Scotch),
/// [`PtScotchError::NumSize`], [`PtScotchError::Partitioner`]; and [`PtScotchError::Comm`].
pub fn partition(
    comm: &MpiComm,
    graph: &DistGraph<'_>,
    options: &Options,
) -> Result<Vec<u32>, PtScotchError> {
    let multiple = comm.threading() >= mpi::Threading::Multiple;
    check::check(comm, graph, options, multiple)?;
    let bytes = num_size();
    if bytes != 8 {
        return Err(PtScotchError::NumSize { bytes });
    }
    let strategy = choose_strategy(comm, graph, options.strategy)?;
    let local = scotch::partition(comm, graph, options, strategy);
    match dist_comm::agree::outcome(comm, local)? {
        Ok(parts) => Ok(parts),
        Err(failure) => Err(PtScotchError::Partitioner {
            rank: failure.rank,
            message: failure.message,
        }),
    }
}

#[cfg(test)]
mod tests;
