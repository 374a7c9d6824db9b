//! Graph partitioning: METIS k-way (through the `metis` crate), contiguous ranges, balanced
//! random assignment, and the pick between METIS and KaMinPar by the graph's degree spread
//! ([`Method::Auto`]); the [`Partition`] they produce (part of each node, fingerprint, edge cut,
//! imbalance), the [`Renumbering`] that gives each part a contiguous id range, and the partition
//! map file that lets a chunk directory be rebuilt without re-partitioning.
//!
//! Partitioning looks only at the graph's structure: the edge list is symmetrised, self loops
//! and duplicates dropped ([`Adjacency`]), nodes weigh 1 and edges weigh 1, so the objective is
//! the number of undirected cut edges (or METIS's communication volume).

mod adjacency;
mod auto;
mod distributed;
mod kaminpar;
mod map_file;
mod renumber;

use distspmm_sparse::index;
use std::path::PathBuf;
use std::string::String;
use std::vec::Vec;

pub use self::auto::{AutoOptions, DegreeSpread, EVEN_DEGREE_SPREAD};
pub use self::kaminpar::{KaminparOptions, KAMINPAR_IMBALANCE};
pub use adjacency::Adjacency;
pub use distributed::DistAdjacency;
pub use renumber::Renumbering;

/// What can go wrong while partitioning or reading a partition map.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PartitionError {
    /// The symmetric adjacency (or another partitioning buffer) does not fit in memory.
    #[error(transparent)]
    Memory(#[from] distspmm_sparse::memory::MemoryError),
    /// Zero parts were asked for.
    #[error("the number of parts must be at least 1")]
    ZeroParts,
    /// The graph has no nodes.
    #[error("the graph has no nodes, so there is nothing to partition: check the input file")]
    EmptyGraph,
    /// More parts than nodes were asked for.
    #[error("cannot split {nodes} nodes into {parts} parts: use at most {nodes} parts")]
    TooManyParts {
        /// Requested parts.
        parts: u32,
        /// Nodes in the graph.
        nodes: u64,
    },
    /// The source and destination arrays differ in length.
    #[error("edge arrays differ in length: {src} sources, {dst} destinations")]
    EdgeLengthMismatch {
        /// Length of the source array.
        src: usize,
        /// Length of the destination array.
        dst: usize,
    },
    /// An edge names a node that does not exist.
    #[error("edge {edge} ({src} -> {dst}) names a node outside 0..{num_nodes}")]
    EdgeOutOfRange {
        /// Index of the edge.
        edge: usize,
        /// Its source.
        src: u64,
        /// Its destination.
        dst: u64,
        /// The graph's node count.
        num_nodes: u64,
    },
    /// A count does not fit METIS's index type (`idx_t`, 32-bit in Debian's libmetis).
    #[error(
        "the graph's {what} ({value}) exceeds METIS's index type (max {max}); \
         use --method kaminpar (64-bit edge ids), or a METIS built with 64-bit idx_t"
    )]
    TooLargeForMetis {
        /// Which quantity.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The largest value METIS accepts.
        max: u64,
    },
    /// The graph has more nodes than node ids (`u32`) can name.
    #[error("the graph has {0} nodes, more than the 4294967295 that 32-bit node ids can name")]
    TooManyNodes(u64),
    /// The total node weight for `--balance nnz` overflows a partitioner's 32-bit weights.
    #[error(
        "the total vertex weight for --balance nnz ({total}, non-zeros + nodes) exceeds \
         {partitioner}'s 32-bit node weights (max {max}); use --balance nodes"
    )]
    WeightsTooLarge {
        /// The partitioner.
        partitioner: &'static str,
        /// Non-zeros + nodes.
        total: u64,
        /// The largest total it accepts.
        max: u64,
    },
    /// METIS takes its seed as an `idx_t`.
    #[error("--seed {seed} is too large for METIS: give a seed from 0 to {max}")]
    SeedTooLarge {
        /// The seed given.
        seed: u64,
        /// The largest seed METIS takes.
        max: u64,
    },
    /// The imbalance tolerance is not a number above 1.
    #[error(
        "imbalance tolerance {} is invalid: give a number from 1.001 to 1001 (e.g. 1.03 for 3%)",
        crate::graph::show_float(*.0)
    )]
    InvalidImbalance(f64),
    /// KaMinPar refused the options or failed.
    #[error("KaMinPar: {0}")]
    Kaminpar(String),
    /// [`Method::Kaminpar`] was given to a build of this crate without its `kaminpar` feature.
    #[error(
        "this build has no KaMinPar: rebuild with `cargo build --release -p distspmm-cli \
         --features kaminpar`, or use --method metis"
    )]
    KaminparNotLinked,
    /// METIS rejected the input or failed.
    #[error("METIS failed: {0}")]
    Metis(String),
    /// A part map entry is not below the part count.
    #[error("node {node} is assigned to part {part}, but there are only {parts} parts")]
    PartOutOfRange {
        /// The node.
        node: u64,
        /// Its part id.
        part: u32,
        /// The part count.
        parts: u32,
    },
    /// The partition and the graph disagree on the node count.
    #[error("the partition covers {partition} nodes but the graph has {graph}")]
    NodeCountMismatch {
        /// Nodes in the partition.
        partition: u64,
        /// Nodes in the graph.
        graph: u64,
    },
    /// A partition map file is malformed.
    #[error("partition map {path}: {reason}")]
    BadMapFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// METIS's objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Objective {
    /// Minimise the number of cut edges.
    Cut,
    /// Minimise the total communication volume.
    Volume,
}

/// What METIS keeps balanced across the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Balance {
    /// Nodes per part (every vertex weighs 1): gpmetis's default, and the seed's.
    #[default]
    Nodes,
    /// Non-zeros of Â per part: vertex v weighs its degree + 1 (its row of Â with the self
    /// loop, exactly for undirected graphs), so every rank does about the same SpMM work.
    /// On power-law graphs node balance leaves the part holding the hubs with several times
    /// the mean work.
    Nonzeros,
}

/// Options of METIS k-way partitioning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetisOptions {
    /// METIS's random seed (`-seed` of gpmetis); must fit `idx_t`.
    pub seed: u64,
    /// Allowed imbalance: largest part ≤ `imbalance` × mean part size (1.03 → METIS ufactor 30),
    /// measured in what [`MetisOptions::balance`] balances.
    pub imbalance: f64,
    /// Cut or communication volume.
    pub objective: Objective,
    /// Nodes or non-zeros.
    pub balance: Balance,
}

impl Default for MetisOptions {
    /// gpmetis's k-way defaults: seed 1 here (so runs are reproducible), ufactor 30, edge cut,
    /// nodes balanced.
    fn default() -> Self {
        Self {
            seed: 1,
            imbalance: 1.03,
            objective: Objective::Cut,
            balance: Balance::Nodes,
        }
    }
}

/// The imbalance tolerance in thousandths above 1 (METIS's `ufactor`), for a tolerance from
/// 1.001 to 1001: the range every method accepts.
pub(crate) fn imbalance_thousandths(imbalance: f64) -> Result<i32, PartitionError> {
    let ufactor = ((imbalance - 1.0) * 1000.0).round();
    if !imbalance.is_finite() || !(1.0..=1.0e6).contains(&ufactor) {
        return Err(PartitionError::InvalidImbalance(imbalance));
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an integer in 1..=1e6, checked just above"
    )]
    Ok(ufactor as i32)
}

impl MetisOptions {
    /// METIS's `ufactor` (imbalance in thousandths) for this tolerance.
    pub fn ufactor(&self) -> Result<i32, PartitionError> {
        imbalance_thousandths(self.imbalance)
    }
}

/// How nodes are assigned to parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    /// METIS multilevel k-way.
    Metis(MetisOptions),
    /// KaMinPar deep multilevel k-way (parallel, 64-bit edge ids).
    Kaminpar(KaminparOptions),
    /// METIS or KaMinPar, picked by the graph's degree spread ([`AutoOptions::choose`]); the
    /// partition records the method that ran.
    Auto(AutoOptions),
    /// Part p gets original ids `⌊pN/P⌋..⌊(p+1)N/P⌋` (no locality beyond the input order).
    Contiguous,
    /// A seeded random permutation split into P equal ranges: balanced, locality-free — the
    /// worst case for communication, useful as a baseline.
    Random {
        /// Seed of the permutation (ChaCha8).
        seed: u64,
    },
}

impl Method {
    /// The method that runs on `adjacency`: [`Method::Auto`]'s pick, any other method itself.
    pub fn resolve(&self, adjacency: &Adjacency) -> Method {
        match self {
            Method::Auto(options) => options.choose(adjacency),
            method => *method,
        }
    }

    /// A short text naming the method and every option that shapes its result; stored in the
    /// partition map and mixed into the fingerprint.
    pub fn tag(&self) -> Result<String, PartitionError> {
        Ok(match self {
            Method::Metis(o) => std::format!(
                "metis:seed={}:ufactor={}:objective={}{}",
                o.seed,
                o.ufactor()?,
                match o.objective {
                    Objective::Cut => "cut",
                    Objective::Volume => "vol",
                },
                // Absent for node balance, so tags (and fingerprints) of earlier runs stand.
                match o.balance {
                    Balance::Nodes => "",
                    Balance::Nonzeros => ":balance=nnz",
                }
            ),
            // The thread count is part of the tag: with more than one thread the result depends
            // on it (and varies between runs).
            Method::Kaminpar(o) => std::format!(
                "kaminpar:seed={}:imbalance=1.03:threads={}{}",
                o.seed,
                o.effective_threads(),
                match o.balance {
                    Balance::Nodes => "",
                    Balance::Nonzeros => ":balance=nnz",
                }
            ),
            // A partition never carries this tag: it records the method that was picked.
            Method::Auto(o) => std::format!(
                "auto:seed={}:imbalance={}:threads={}{}",
                o.seed,
                crate::graph::show_float(o.imbalance),
                o.threads,
                match o.balance {
                    Balance::Nodes => "",
                    Balance::Nonzeros => ":balance=nnz",
                }
            ),
            Method::Contiguous => "contiguous".into(),
            Method::Random { seed } => std::format!("random:seed={seed}"),
        })
    }
}

/// The part of every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    parts: u32,
    part_of: Vec<u32>,
    method: String,
}

impl Partition {
    /// A validated partition: `1 ≤ parts ≤ part_of.len()`, every entry below `parts`. Parts may
    /// be empty here (a map from elsewhere); [`partition`] never leaves one empty. `method` is the
    /// [`Method::tag`] (or any text naming where the map came from).
    pub fn new(
        parts: u32,
        part_of: Vec<u32>,
        method: impl Into<String>,
    ) -> Result<Self, PartitionError> {
        check_parts(parts, part_of.len())?;
        if let Some((node, &part)) = part_of.iter().enumerate().find(|(_, &p)| p >= parts) {
            return Err(PartitionError::PartOutOfRange {
                node: node as u64,
                part,
                parts,
            });
        }
        Ok(Self {
            parts,
            part_of,
            method: method.into(),
        })
    }

    /// Number of parts P.
    pub fn parts(&self) -> u32 {
        self.parts
    }

    /// Number of nodes N.
    pub fn num_nodes(&self) -> usize {
        self.part_of.len()
    }

    /// The part of every node (original ids).
    pub fn part_of(&self) -> &[u32] {
        &self.part_of
    }

    /// The method tag this partition was made with.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Nodes per part.
    pub fn part_sizes(&self) -> Vec<u64> {
        let mut sizes = std::vec![0u64; self.parts as usize];
        for &p in &self.part_of {
            sizes[p as usize] += 1;
        }
        sizes
    }

    /// Largest part over the mean part size N/P (1.0 = perfectly balanced).
    pub fn imbalance(&self) -> f64 {
        let largest = self.part_sizes().into_iter().max().unwrap_or(0);
        largest as f64 * self.parts as f64 / self.num_nodes() as f64
    }

    /// Undirected edges whose endpoints lie in different parts, each counted once — the edge
    /// cut METIS reports.
    pub fn edge_cut(&self, adjacency: &Adjacency) -> Result<u64, PartitionError> {
        if adjacency.num_nodes() != self.num_nodes() {
            return Err(PartitionError::NodeCountMismatch {
                partition: self.num_nodes() as u64,
                graph: adjacency.num_nodes() as u64,
            });
        }
        let mut cut = 0u64;
        for u in 0..self.num_nodes() {
            let pu = self.part_of[u];
            cut += adjacency
                .neighbours(u)
                .iter()
                .filter(|&&v| (v as usize) > u && self.part_of[v as usize] != pu)
                .count() as u64;
        }
        Ok(cut)
    }

    /// 16-byte identity of this partition: xxh3-128 over a domain tag, P, N, the method tag
    /// and the part map. Every chunk carries it, and ranks compare it before communicating.
    pub fn fingerprint(&self) -> [u8; 16] {
        chunk_format::dir::partition_map::fingerprint(self.parts, &self.method, &self.part_of)
    }

    /// Groups nodes by part: part p owns the contiguous new ids `offsets[p]..offsets[p+1]`.
    pub fn renumbering(&self) -> Renumbering {
        Renumbering::from_part_map(self.parts, &self.part_of)
    }
}

fn check_parts(parts: u32, nodes: usize) -> Result<(), PartitionError> {
    if parts == 0 {
        return Err(PartitionError::ZeroParts);
    }
    if nodes == 0 {
        return Err(PartitionError::EmptyGraph);
    }
    if parts as u64 > nodes as u64 {
        return Err(PartitionError::TooManyParts {
            parts,
            nodes: nodes as u64,
        });
    }
    Ok(())
}

/// Splits the graph's nodes into `parts` parts with `method`.
///
/// P = 1 puts every node in part 0 without calling a partitioner; P > N is an error. METIS needs
/// the node and adjacency-entry counts to fit its `idx_t`; KaMinPar, contiguous and random have
/// no such limit. [`Method::Kaminpar`] (with P ≥ 2) needs the crate's `kaminpar` feature (the
/// default); without it, it is [`PartitionError::KaminparNotLinked`].
pub fn partition(
    adjacency: &Adjacency,
    parts: u32,
    method: &Method,
) -> Result<Partition, PartitionError> {
    partition_with(adjacency, parts, method, kaminpar::LINKED)
}

/// [`partition`], with `kaminpar` making the KaMinPar call of [`Method::Kaminpar`].
fn partition_with(
    adjacency: &Adjacency,
    parts: u32,
    method: &Method,
    kaminpar: kaminpar::KaminparKway,
) -> Result<Partition, PartitionError> {
    let n = adjacency.num_nodes();
    check_parts(parts, n)?;
    let tag = method.tag()?;
    let part_of = match method {
        // The picked method runs (and names the partition), even for one part.
        Method::Auto(options) => {
            return partition_with(adjacency, parts, &options.choose(adjacency), kaminpar)
        }
        _ if parts == 1 => std::vec![0u32; n],
        Method::Contiguous => contiguous(n, parts),
        Method::Random { seed } => random(n, parts, *seed),
        Method::Metis(options) => metis_kway(adjacency, parts, options)?,
        Method::Kaminpar(options) => {
            let mut part_of = kaminpar::kaminpar_kway(adjacency, parts, options, kaminpar)?;
            fill_empty_parts(adjacency, parts, &mut part_of);
            part_of
        }
    };
    Partition::new(parts, part_of, tag)
}

/// Part of each node when part p owns `⌊pN/P⌋..⌊(p+1)N/P⌋`.
fn contiguous(n: usize, parts: u32) -> Vec<u32> {
    let mut part_of = Vec::with_capacity(n);
    for p in 0..parts as u64 {
        let end = ((p + 1) as u128 * n as u128 / parts as u128) as usize;
        #[allow(clippy::cast_possible_truncation, reason = "p < parts, a u32")]
        part_of.resize(end, p as u32);
    }
    part_of
}

fn random(n: usize, parts: u32, seed: u64) -> Vec<u32> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<u32> = (0..index::id(n)).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    let ranges = contiguous(n, parts);
    let mut part_of = std::vec![0u32; n];
    for (&node, &p) in order.iter().zip(&ranges) {
        part_of[node as usize] = p;
    }
    part_of
}

/// Vertex weights for [`Balance::Nonzeros`]: degree + 1 (the self loop), checked to sum within
/// `max` (METIS's and KaMinPar's weights are 32-bit and summed by the partitioner).
pub(crate) fn nonzero_weights(
    adjacency: &Adjacency,
    max: u64,
    partitioner: &'static str,
) -> Result<Vec<i32>, PartitionError> {
    let xadj = adjacency.xadj();
    let total = xadj.last().copied().unwrap_or(0) + adjacency.num_nodes() as u64;
    if total > max {
        return Err(match partitioner {
            "METIS" => PartitionError::TooLargeForMetis {
                what: "total vertex weight (non-zeros + nodes) for --balance nnz",
                value: total,
                max,
            },
            _ => PartitionError::WeightsTooLarge {
                partitioner,
                total,
                max,
            },
        });
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "each weight is at most the total, checked to be at most `max` (≤ i32::MAX) above"
    )]
    Ok(xadj.windows(2).map(|w| (w[1] - w[0] + 1) as i32).collect())
}

/// Checks that the graph fits METIS's 32-bit `idx_t`: its node count and its adjacency entries
/// (twice the undirected edges, the length of `adjncy`) must not exceed `max`.
pub(crate) fn check_metis_size(nodes: u64, entries: u64, max: u64) -> Result<(), PartitionError> {
    for (what, value) in [
        ("node count", nodes),
        (
            "adjacency entry count (twice the undirected edges)",
            entries,
        ),
    ] {
        if value > max {
            return Err(PartitionError::TooLargeForMetis { what, value, max });
        }
    }
    Ok(())
}

fn metis_kway(
    adjacency: &Adjacency,
    parts: u32,
    options: &MetisOptions,
) -> Result<Vec<u32>, PartitionError> {
    use metis::option::{ObjType, Seed, UFactor};
    let seed = metis::Idx::try_from(options.seed).map_err(|_| PartitionError::SeedTooLarge {
        seed: options.seed,
        max: metis::Idx::MAX as u64,
    })?;
    let nparts = metis::Idx::try_from(parts).map_err(|_| PartitionError::TooLargeForMetis {
        what: "part count",
        value: parts as u64,
        max: metis::Idx::MAX as u64,
    })?;
    let objective = match options.objective {
        Objective::Cut => ObjType::Cut,
        Objective::Volume => ObjType::Vol,
    };
    let max = metis::Idx::MAX as u64;
    check_metis_size(
        adjacency.num_nodes() as u64,
        adjacency.adjncy().len() as u64,
        max,
    )?;
    // Both fit idx_t (checked above): offsets narrow losslessly, and node ids below N ≤ idx_t's
    // maximum have the same bits as i32, so the neighbour array is reinterpreted, not copied.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the offsets fit idx_t, checked above"
    )]
    let xadj: Vec<metis::Idx> = adjacency.xadj().iter().map(|&e| e as metis::Idx).collect();
    let adjncy: &[metis::Idx] = bytemuck::cast_slice(adjacency.adjncy());
    let mut part: Vec<metis::Idx> = std::vec![0; adjacency.num_nodes()];
    let vwgt = match options.balance {
        Balance::Nodes => None,
        Balance::Nonzeros => Some(nonzero_weights(adjacency, max, "METIS")?),
    };
    let started = std::time::Instant::now();
    let mut graph = metis::Graph::new(1, nparts, &xadj, adjncy)
        .map_err(|e| PartitionError::Metis(std::format!("{e}")))?;
    if let Some(vwgt) = &vwgt {
        graph = graph.set_vwgt(vwgt);
    }
    let reported = graph
        .set_option(Seed(seed))
        .set_option(UFactor(options.ufactor()?))
        .set_option(objective)
        .part_kway(&mut part)
        .map_err(|e| PartitionError::Metis(std::format!("{e}")))?;
    tracing::info!(
        parts,
        objective = reported,
        seconds = started.elapsed().as_secs_f64(),
        "METIS k-way done"
    );
    let mut part_of: Vec<u32> = part
        .into_iter()
        .enumerate()
        .map(|(node, p)| {
            u32::try_from(p).ok().filter(|&p| p < parts).ok_or_else(|| {
                PartitionError::Metis(std::format!(
                    "returned part {p} for node {node}, outside 0..{parts}"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    fill_empty_parts(adjacency, parts, &mut part_of);
    Ok(part_of)
}

/// METIS and KaMinPar can leave a part empty on tiny graphs (a triangle into 2 parts, say). A rank without
/// rows is useless, so each empty part takes one node of the currently largest part: the one
/// with the fewest neighbours inside that part, so the fewest edges are newly cut. Needs
/// P ≤ N, which [`partition`] checks; a no-op when no part is empty.
fn fill_empty_parts(adjacency: &Adjacency, parts: u32, part_of: &mut [u32]) {
    let mut sizes = std::vec![0u64; parts as usize];
    for &p in part_of.iter() {
        sizes[p as usize] += 1;
    }
    while let Some(empty) = sizes.iter().position(|&s| s == 0) {
        let largest = (0..parts as usize).max_by_key(|&p| sizes[p]).unwrap_or(0);
        let internal = |v: usize| {
            adjacency
                .neighbours(v)
                .iter()
                .filter(|&&u| part_of[u as usize] as usize == largest)
                .count()
        };
        // P <= N, so the largest part of a partition with an empty part has two or more nodes.
        let Some(node) = (0..part_of.len())
            .filter(|&v| part_of[v] as usize == largest)
            .min_by_key(|&v| internal(v))
        else {
            return;
        };
        tracing::debug!(
            node,
            from = largest,
            to = empty,
            "filling a part METIS left empty"
        );
        part_of[node] = index::id(empty);
        sizes[largest] -= 1;
        sizes[empty] += 1;
    }
}

/// Graphs and measures the partitioning tests share (the unit tests and `tests/`).
#[doc(hidden)]
pub mod testing {
    use super::Partition;
    use std::vec::Vec;

    /// Two cliques of `k` nodes joined by one edge, plus an isolated node.
    pub fn two_cliques(k: u32) -> (usize, Vec<u32>, Vec<u32>) {
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for base in [0, k] {
            for i in 0..k {
                for j in 0..k {
                    if i != j {
                        src.push(base + i);
                        dst.push(base + j);
                    }
                }
            }
        }
        src.push(0);
        dst.push(k);
        ((2 * k + 1) as usize, src, dst)
    }

    /// The `rows` × `cols` 5-point mesh (node (i, j) is `i * cols + j`), both directions of
    /// every edge.
    pub fn mesh(rows: u32, cols: u32) -> (usize, Vec<u32>, Vec<u32>) {
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for i in 0..rows {
            for j in 0..cols {
                let v = i * cols + j;
                let mut link = |u: u32| {
                    src.extend([u, v]);
                    dst.extend([v, u]);
                };
                if j > 0 {
                    link(v - 1);
                }
                if i > 0 {
                    link(v - cols);
                }
            }
        }
        ((rows * cols) as usize, src, dst)
    }

    /// Largest part's share of `weight` over the mean (1 = perfect balance).
    pub fn weighted_imbalance(p: &Partition, weight: impl Fn(usize) -> u64) -> f64 {
        let mut per_part = std::vec![0u64; p.parts() as usize];
        for (v, &part) in p.part_of().iter().enumerate() {
            per_part[part as usize] += weight(v);
        }
        let total: u64 = per_part.iter().sum();
        *per_part.iter().max().unwrap() as f64 * f64::from(p.parts()) / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{two_cliques, weighted_imbalance};
    use super::*;
    use proptest::prelude::*;

    fn all_methods() -> [Method; 3] {
        [
            Method::Metis(MetisOptions::default()),
            Method::Contiguous,
            Method::Random { seed: 9 },
        ]
    }

    #[test]
    fn metis_separates_two_cliques() {
        let (n, src, dst) = two_cliques(8);
        let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
        let p = partition(&adj, 2, &Method::Metis(MetisOptions::default())).unwrap();
        assert_eq!(p.edge_cut(&adj).unwrap(), 1);
        // 17 nodes: the best split is 9 + 8 (the isolated node joins either clique).
        let mut sizes = p.part_sizes();
        sizes.sort_unstable();
        assert_eq!(sizes, [8, 9]);
        assert!((p.imbalance() - 9.0 / 8.5).abs() < 1e-12);
    }

    #[test]
    fn one_part_and_too_many_parts() {
        let (n, src, dst) = two_cliques(3);
        let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
        for method in all_methods() {
            let p = partition(&adj, 1, &method).unwrap();
            assert!(p.part_of().iter().all(|&x| x == 0));
            assert_eq!(p.edge_cut(&adj).unwrap(), 0);
            let err = partition(&adj, u32::try_from(n).unwrap() + 1, &method).unwrap_err();
            assert!(
                matches!(err, PartitionError::TooManyParts { parts, nodes } if parts == u32::try_from(n).unwrap() + 1 && nodes == n as u64)
            );
            assert!(matches!(
                partition(&adj, 0, &method),
                Err(PartitionError::ZeroParts)
            ));
        }
    }

    #[test]
    fn graphs_without_edges_and_with_components() {
        let adj = Adjacency::from_edges(10, &[], &[]).unwrap();
        for method in all_methods() {
            let p = partition(&adj, 3, &method).unwrap();
            assert_eq!(p.edge_cut(&adj).unwrap(), 0);
            assert_eq!(p.part_sizes().iter().sum::<u64>(), 10);
        }
        // Five disjoint triangles into 5 parts.
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for t in 0..5u32 {
            for (a, b) in [(0, 1), (1, 2), (2, 0)] {
                src.push(3 * t + a);
                dst.push(3 * t + b);
            }
        }
        let adj = Adjacency::from_edges(15, &src, &dst).unwrap();
        let p = partition(&adj, 5, &Method::Metis(MetisOptions::default())).unwrap();
        assert_eq!(p.part_sizes().iter().sum::<u64>(), 15);
    }

    #[test]
    fn metis_leaves_no_part_empty() {
        // A triangle into 2 and 3 parts, where METIS itself leaves a part empty.
        let adj = Adjacency::from_edges(3, &[0, 1, 2], &[1, 2, 0]).unwrap();
        for parts in [2, 3] {
            let p = partition(&adj, parts, &Method::Metis(MetisOptions::default())).unwrap();
            assert!(
                p.part_sizes().iter().all(|&s| s > 0),
                "{:?}",
                p.part_sizes()
            );
        }
        // Filling moves the node with the fewest neighbours inside the largest part.
        let adj = Adjacency::from_edges(4, &[0, 1, 2], &[1, 2, 0]).unwrap();
        let mut part_of = std::vec![0, 0, 0, 0];
        fill_empty_parts(&adj, 2, &mut part_of);
        assert_eq!(part_of, [0, 0, 0, 1]);
    }

    #[test]
    fn nonzero_balance_evens_out_the_work_of_a_power_law_graph() {
        let g = crate::graph::generate::rmat(12, 16, 7).unwrap();
        let adj = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
        let row_nnz = |v: usize| adj.xadj()[v + 1] - adj.xadj()[v] + 1;
        let by = |balance| {
            let o = MetisOptions {
                balance,
                ..MetisOptions::default()
            };
            partition(&adj, 4, &Method::Metis(o)).unwrap()
        };
        let (nodes, nnz) = (by(Balance::Nodes), by(Balance::Nonzeros));
        let (work_nodes, work_nnz) = (
            weighted_imbalance(&nodes, row_nnz),
            weighted_imbalance(&nnz, row_nnz),
        );
        // Node balance leaves the hubs' part with far more than its share of non-zeros;
        // weighting by degree + 1 brings it within METIS's tolerance (ufactor 30).
        assert!(
            work_nodes > 1.3,
            "node-balanced work imbalance {work_nodes}"
        );
        assert!(work_nnz < 1.06, "nnz-balanced work imbalance {work_nnz}");
        assert!(weighted_imbalance(&nodes, |_| 1) < 1.06);
        // The option is part of the method's tag (so of the fingerprint); node balance keeps
        // the tag of earlier versions.
        assert_eq!(nodes.method(), "metis:seed=1:ufactor=30:objective=cut");
        assert_eq!(
            nnz.method(),
            "metis:seed=1:ufactor=30:objective=cut:balance=nnz"
        );
        assert_ne!(nodes.fingerprint(), nnz.fingerprint());
    }

    #[test]
    fn imbalance_option_is_validated() {
        for bad in [1.0, 0.5, f64::NAN, f64::INFINITY] {
            let o = MetisOptions {
                imbalance: bad,
                ..MetisOptions::default()
            };
            assert!(matches!(
                o.ufactor(),
                Err(PartitionError::InvalidImbalance(_))
            ));
        }
        let o = MetisOptions {
            imbalance: 1.05,
            ..MetisOptions::default()
        };
        assert_eq!(o.ufactor().unwrap(), 50);
        // Too large: the message gives the whole valid range, not only its lower end.
        let o = MetisOptions {
            imbalance: 1e9,
            ..MetisOptions::default()
        };
        let text = o.ufactor().unwrap_err();
        let text = std::format!("{text}");
        assert!(
            text.contains("tolerance 1e9 is invalid: give a number from 1.001 to 1001"),
            "{text}"
        );
        // A huge one is shown in scientific notation, not as its 301 digits.
        let o = MetisOptions {
            imbalance: 1e300,
            ..MetisOptions::default()
        };
        let text = o.ufactor().unwrap_err();
        let text = std::format!("{text}");
        assert!(text.contains("tolerance 1e300 is"), "{text}");
    }

    #[test]
    fn messages_name_the_real_cause() {
        // No nodes: not "use at most 0 parts".
        let empty = Adjacency::from_edges(0, &[], &[]).unwrap();
        for method in all_methods() {
            let err = partition(&empty, 2, &method).unwrap_err();
            assert!(matches!(err, PartitionError::EmptyGraph), "{err}");
            assert!(!std::format!("{err}").contains("at most 0"), "{err}");
        }
        // A seed METIS cannot take is the seed's fault, not the graph's.
        let (n, src, dst) = two_cliques(3);
        let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
        let method = Method::Metis(MetisOptions {
            seed: u64::MAX,
            ..MetisOptions::default()
        });
        let text = partition(&adj, 2, &method).unwrap_err();
        let text = std::format!("{text}");
        assert!(
            text.contains("--seed 18446744073709551615 is too large for METIS")
                && !text.contains("graph"),
            "{text}"
        );
    }

    #[test]
    fn fingerprint_depends_on_map_parts_and_method() {
        let a = Partition::new(2, std::vec![0, 1, 1], "contiguous").unwrap();
        let b = Partition::new(2, std::vec![0, 0, 1], "contiguous").unwrap();
        let c = Partition::new(2, std::vec![0, 1, 1], "random:seed=1").unwrap();
        let d = Partition::new(3, std::vec![0, 1, 1], "contiguous").unwrap();
        let fps = [
            a.fingerprint(),
            b.fingerprint(),
            c.fingerprint(),
            d.fingerprint(),
        ];
        for i in 0..fps.len() {
            for j in i + 1..fps.len() {
                assert_ne!(fps[i], fps[j], "{i} vs {j}");
            }
        }
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
    }

    #[test]
    fn new_rejects_bad_maps() {
        assert!(matches!(
            Partition::new(2, std::vec![0, 2], "x"),
            Err(PartitionError::PartOutOfRange {
                node: 1,
                part: 2,
                parts: 2
            })
        ));
        assert!(matches!(
            Partition::new(3, std::vec![0, 1], "x"),
            Err(PartitionError::TooManyParts { .. })
        ));
    }

    #[test]
    fn metis_size_limit_names_kaminpar() {
        let max = i32::MAX as u64;
        assert!(check_metis_size(1000, max, max).is_ok());
        let err = check_metis_size(1000, max + 1, max).unwrap_err();
        assert!(
            matches!(err, PartitionError::TooLargeForMetis { value, .. } if value == max + 1),
            "{err:?}"
        );
        assert!(std::format!("{err}").contains("--method kaminpar"), "{err}");
        let err = check_metis_size(max + 1, 0, max).unwrap_err();
        assert!(std::format!("{err}").contains("node count"), "{err}");
    }

    #[test]
    fn kaminpar_refuses_a_tighter_imbalance_than_it_keeps() {
        for bad in [1.0, 1.01, f64::NAN] {
            let o = KaminparOptions {
                imbalance: bad,
                ..KaminparOptions::default()
            };
            assert!(o.validate().is_err(), "{bad}");
        }
        let loose = KaminparOptions {
            imbalance: 1.2,
            ..KaminparOptions::default()
        };
        assert!(loose.validate().is_ok());
        let big_seed = KaminparOptions {
            seed: 1 << 40,
            ..KaminparOptions::default()
        };
        assert!(big_seed.validate().is_err());
    }

    /// A node count far beyond the edges asks for more memory than there is: an error that
    /// names the adjacency, not an abort.
    #[test]
    fn an_adjacency_that_cannot_fit_is_an_error() {
        let err = Adjacency::from_edges(u32::MAX as usize, &[0, 1], &[1, 0]).unwrap_err();
        assert!(matches!(err, PartitionError::Memory(_)), "{err}");
        assert!(
            std::format!("{err}").contains("symmetric adjacency"),
            "{err}"
        );
    }

    fn kaminpar_nodes() -> Method {
        Method::Kaminpar(KaminparOptions {
            threads: 1,
            ..KaminparOptions::default()
        })
    }

    /// A build without KaMinPar: the method is an error that says how to get it, after the
    /// options' own checks; one part needs no partitioner.
    #[cfg(not(feature = "kaminpar"))]
    #[test]
    fn kaminpar_without_its_feature_says_how_to_get_it() {
        let (n, src, dst) = two_cliques(3);
        let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
        let err = partition(&adj, 2, &kaminpar_nodes()).unwrap_err();
        assert!(matches!(err, PartitionError::KaminparNotLinked), "{err:?}");
        assert!(
            std::format!("{err}").contains("--features kaminpar"),
            "{err}"
        );
        let tight = Method::Kaminpar(KaminparOptions {
            imbalance: 1.01,
            ..KaminparOptions::default()
        });
        let err = partition(&adj, 2, &tight).unwrap_err();
        assert!(std::format!("{err}").contains("--imbalance 1.03"), "{err}");
        let one = partition(&adj, 1, &kaminpar_nodes()).unwrap();
        assert!(one.part_of().iter().all(|&p| p == 0));
    }

    /// Every node in part 0, whatever the part count.
    fn all_in_part_zero(
        adjacency: &Adjacency,
        _parts: u32,
        _options: &KaminparOptions,
        _weights: Option<Vec<i32>>,
    ) -> Result<Vec<u32>, PartitionError> {
        Ok(std::vec![0; adjacency.num_nodes()])
    }

    /// What surrounds the KaMinPar call is this module's: the weights it is handed, the
    /// parts it leaves empty, the parts it returns out of range, the method tag, P = 1.
    #[test]
    fn partition_with_kaminpar_surrounds_the_call() {
        let (n, src, dst) = two_cliques(3);
        let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
        let p = partition_with(&adj, 3, &kaminpar_nodes(), all_in_part_zero).unwrap();
        assert!(
            p.part_sizes().iter().all(|&s| s > 0),
            "{:?}",
            p.part_sizes()
        );
        assert_eq!(p.method(), "kaminpar:seed=1:imbalance=1.03:threads=1");

        let nnz = Method::Kaminpar(KaminparOptions {
            threads: 1,
            balance: Balance::Nonzeros,
            ..KaminparOptions::default()
        });
        let p = partition_with(&adj, 2, &nnz, |adj, _, _, weights| {
            let expected: Vec<i32> = (0..adj.num_nodes())
                .map(|v| i32::try_from(adj.neighbours(v).len() + 1).unwrap())
                .collect();
            assert_eq!(weights, Some(expected));
            Ok(std::vec![1; adj.num_nodes()])
        })
        .unwrap();
        assert!(p.method().ends_with(":balance=nnz"), "{}", p.method());

        let out_of_range = partition_with(&adj, 2, &kaminpar_nodes(), |adj, _, _, _| {
            Ok(std::vec![2; adj.num_nodes()])
        });
        let text = std::format!("{}", out_of_range.unwrap_err());
        assert!(
            text.contains("returned part 2 for node 0, outside 0..2"),
            "{text}"
        );
        let short = partition_with(&adj, 2, &kaminpar_nodes(), |_, _, _, _| Ok(std::vec![0; 1]));
        let text = std::format!("{}", short.unwrap_err());
        assert!(
            text.contains("returned parts for 1 nodes, but the graph has 7"),
            "{text}"
        );
        let one = partition_with(&adj, 1, &kaminpar_nodes(), |_, _, _, _| {
            Err(PartitionError::Kaminpar("called for one part".into()))
        })
        .unwrap();
        assert_eq!(one.parts(), 1);
        // Every other method is partition's own. (METIS's random state is process-wide, so a
        // METIS run on another test thread can change its tie-breaks: compare what it is bound
        // to, its tag and the two cliques' one-edge cut.)
        for method in all_methods() {
            let ours = partition_with(&adj, 2, &method, all_in_part_zero).unwrap();
            let core = partition(&adj, 2, &method).unwrap();
            if matches!(method, Method::Metis(_)) {
                assert_eq!(ours.method(), core.method());
                assert_eq!(ours.edge_cut(&adj).unwrap(), 1);
            } else {
                assert_eq!(ours, core);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn every_node_in_exactly_one_part_and_cut_matches_reference(
            n in 1usize..60,
            parts_raw in 1u32..8,
            edges in proptest::collection::vec((0u32..60, 0u32..60), 0..300),
            which in 0usize..3,
        ) {
            let parts = parts_raw.min(u32::try_from(n).unwrap());
            let (src, dst): (Vec<u32>, Vec<u32>) =
                edges.iter().map(|&(u, v)| (u % u32::try_from(n).unwrap(), v % u32::try_from(n).unwrap())).unzip();
            let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
            let method = all_methods()[which];
            let p = partition(&adj, parts, &method).unwrap();
            prop_assert_eq!(p.num_nodes(), n);
            prop_assert!(p.part_of().iter().all(|&x| x < parts));
            prop_assert_eq!(p.part_sizes().iter().sum::<u64>(), n as u64);
            prop_assert!(p.part_sizes().iter().all(|&s| s > 0), "empty part: {:?}", p.part_sizes());
            // Reference cut: the set of unordered cut pairs.
            let cut: std::collections::BTreeSet<(u32, u32)> = src.iter().zip(&dst)
                .filter(|(&u, &v)| p.part_of()[u as usize] != p.part_of()[v as usize])
                .map(|(&u, &v)| (u.min(v), u.max(v)))
                .collect();
            prop_assert_eq!(p.edge_cut(&adj).unwrap(), cut.len() as u64);
            if !matches!(method, Method::Metis(_)) {
                // Contiguous and random are balanced to within one node.
                let sizes = p.part_sizes();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                prop_assert!(hi - lo <= 1, "sizes {:?}", sizes);
            }
            if matches!(method, Method::Contiguous) {
                prop_assert!(p.part_of().windows(2).all(|w| w[0] <= w[1]));
            }
        }
    }
}
