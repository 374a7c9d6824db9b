//! The input checks made before PT-Scotch sees a graph: this rank's arrays ([`check_local`]),
//! then one verdict for all ranks ([`check`]): the lowest failing rank's error, ranks that were
//! given different distributions or options, sums beyond `SCOTCH_Num`, and an asymmetric graph.
//!
//! Symmetry is checked without moving any arc: every rank hashes each of its arcs `(u, v, w)`
//! forwards and reversed, `(v, u, w)`, and the graph is symmetric (with equal weights both ways)
//! exactly when the multiset of all arcs equals the multiset of all reversed arcs. Two 64-bit
//! sums of a mixing hash compare the multisets: an asymmetric graph passes with a probability
//! near 2⁻¹²⁸. Duplicate arcs and self loops are found per vertex.

use dist_comm::agree::{self, Settled};
use dist_comm::{AllGather, AllReduce};

use crate::{DistGraph, InputError, InputErrorKind, Options, PtScotchError};

/// What one rank's arrays add up to (the words every rank shares in [`check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LocalSums {
    /// Sum of vertex weights (the vertex count without weights).
    pub vertex_weight: u64,
    /// Sum of edge weights (the arc count without weights).
    pub edge_weight: u64,
    /// Arcs (adjacency entries).
    pub arcs: u64,
    /// Wrapping sums of the two hashes of every arc, forwards.
    pub forward: [u64; 2],
    /// The same of every arc reversed.
    pub reverse: [u64; 2],
}

/// The whole graph's sizes, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphTotals {
    /// Vertices (the last entry of `vtxdist`).
    pub vertices: u64,
    /// Arcs over all ranks: twice the edges of the symmetric graph.
    pub arcs: u64,
    /// Sum of all vertex weights (the vertex count without weights).
    pub vertex_weight: u64,
    /// Sum of all edge weights over arcs (the arc count without weights).
    pub edge_weight: u64,
}

const SEEDS: [u64; 2] = [0x9E37_79B9_7F4A_7C15, 0xD1B5_4A32_D192_ED03];

/// splitmix64's finaliser: a bijective mix of 64 bits.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A hash of the arc `u → v` with weight `w`, one per seed.
fn arc_hash(seed: u64, u: u64, v: u64, w: u64) -> u64 {
    mix(mix(mix(seed ^ u) ^ v).wrapping_add(w) ^ seed.rotate_left(17))
}

/// Checks this rank's share of the graph and the options alone (no communication), for rank
/// `rank` of `ranks`. `multiple_threads` says whether MPI grants `MPI_THREAD_MULTIPLE`.
///
/// # Errors
/// The first problem found, as an [`InputError`].
pub(crate) fn check_local(
    graph: &DistGraph<'_>,
    rank: usize,
    ranks: usize,
    options: &Options,
    multiple_threads: bool,
) -> Result<LocalSums, InputError> {
    check_options(options, multiple_threads)?;
    let vtxdist = graph.vtxdist;
    if vtxdist.len() != ranks + 1 {
        return Err(InputError::Distribution(format!(
            "vtxdist holds {} entries; {ranks} ranks need {} (the first vertex of each rank, then \
             the vertex count)",
            vtxdist.len(),
            ranks + 1
        )));
    }
    if vtxdist[0] != 0 {
        return Err(InputError::Distribution(format!(
            "vtxdist starts at {}, not 0",
            vtxdist[0]
        )));
    }
    if let Some(r) = vtxdist.windows(2).position(|w| w[1] < w[0]) {
        return Err(InputError::Distribution(format!(
            "vtxdist decreases from {} (rank {r}) to {} (rank {})",
            vtxdist[r],
            vtxdist[r + 1],
            r + 1
        )));
    }
    let vertices = vtxdist[ranks];
    fits("the vertex count", vertices)?;
    let first = vtxdist[rank];
    let owned = vtxdist[rank + 1] - first;
    let xadj = graph.xadj;
    if u64::try_from(xadj.len()).ok() != owned.checked_add(1) {
        return Err(InputError::Distribution(format!(
            "vtxdist gives rank {rank} {owned} vertices, so xadj must hold {} offsets, but it holds {}",
            owned.saturating_add(1),
            xadj.len()
        )));
    }
    let adjncy = graph.adjncy;
    if xadj[0] != 0 {
        return Err(InputError::Offsets(format!(
            "xadj starts at {}, not 0",
            xadj[0]
        )));
    }
    if let Some(i) = xadj.windows(2).position(|w| w[1] < w[0]) {
        return Err(InputError::Offsets(format!(
            "xadj decreases at local vertex {i} (global {}): {} then {}",
            first + i as u64,
            xadj[i],
            xadj[i + 1]
        )));
    }
    let arcs = adjncy.len() as u64;
    if xadj[xadj.len() - 1] != arcs {
        return Err(InputError::Offsets(format!(
            "xadj ends at {} but adjncy holds {arcs} entries",
            xadj[xadj.len() - 1]
        )));
    }
    fits("this rank's arc count", arcs)?;

    let vertex_weight = match graph.vertex_weights {
        None => owned,
        Some(w) => weight_sum("vertex", w, xadj.len() - 1, first)?,
    };
    let edge_weight = match graph.edge_weights {
        None => arcs,
        Some(w) => weight_sum("edge", w, adjncy.len(), 0)?,
    };

    let mut sums = LocalSums {
        vertex_weight,
        edge_weight,
        arcs,
        ..LocalSums::default()
    };
    let mut scratch: Vec<u64> = Vec::new();
    for (i, range) in xadj.windows(2).enumerate() {
        // Offsets are monotone and end at adjncy.len(), so they index adjncy.
        let (start, end) = (index(range[0]), index(range[1]));
        let u = first + i as u64;
        let neighbours = &adjncy[start..end];
        for (e, &v) in neighbours.iter().enumerate() {
            if v >= vertices {
                return Err(InputError::VertexId(format!(
                    "vertex {u} has neighbour {v}, but the graph has {vertices} vertices"
                )));
            }
            if v == u {
                return Err(InputError::SelfLoop(format!(
                    "vertex {u} lists itself as a neighbour; PT-Scotch takes graphs without self loops"
                )));
            }
            let w = graph.edge_weights.map_or(1, |w| w[start + e]);
            for (k, &seed) in SEEDS.iter().enumerate() {
                sums.forward[k] = sums.forward[k].wrapping_add(arc_hash(seed, u, v, w));
                sums.reverse[k] = sums.reverse[k].wrapping_add(arc_hash(seed, v, u, w));
            }
        }
        if !neighbours.windows(2).all(|w| w[0] < w[1]) {
            scratch.clear();
            scratch.extend_from_slice(neighbours);
            scratch.sort_unstable();
            if let Some(w) = scratch.windows(2).find(|w| w[0] == w[1]) {
                return Err(InputError::DuplicateArc(format!(
                    "vertex {u} lists neighbour {} more than once; PT-Scotch takes each edge once \
                     per direction",
                    w[0]
                )));
            }
        }
    }
    Ok(sums)
}

/// An offset already checked to index a slice, as `usize`.
pub(crate) fn index(offset: u64) -> usize {
    usize::try_from(offset).unwrap_or(usize::MAX)
}

/// The checks of the options alone.
fn check_options(options: &Options, multiple_threads: bool) -> Result<(), InputError> {
    if options.parts == 0 {
        return Err(InputError::Parts("the number of parts is 0".into()));
    }
    if u32::try_from(options.parts).is_err() {
        return Err(InputError::Parts(format!(
            "{} parts: part ids are 32-bit, so at most {} parts",
            options.parts,
            u32::MAX
        )));
    }
    if !options.imbalance.is_finite() || options.imbalance < 1.0 {
        return Err(InputError::Imbalance(format!(
            "imbalance {}: the largest part's weight over the mean part weight is a finite number ≥ 1 \
             (1.03 allows parts 3 % above the mean)",
            options.imbalance
        )));
    }
    if options.threads == 0 || i32::try_from(options.threads).is_err() {
        return Err(InputError::Threads(format!(
            "{} threads per rank: give 1 or more (at most {})",
            options.threads,
            i32::MAX
        )));
    }
    if options.threads > 1 && !multiple_threads {
        return Err(InputError::Threads(format!(
            "{} threads per rank need MPI_THREAD_MULTIPLE (this PT-Scotch build calls MPI from \
             several threads), but MPI was initialised with less: use 1 thread per rank, or \
             initialise MPI with MPI_THREAD_MULTIPLE",
            options.threads
        )));
    }
    Ok(())
}

/// `what` as a `SCOTCH_Num` (i64) or [`InputError::Overflow`].
fn fits(what: &str, value: u64) -> Result<(), InputError> {
    if i64::try_from(value).is_err() {
        return Err(InputError::Overflow(format!(
            "{what} is {value}, beyond PT-Scotch's 64-bit SCOTCH_Num ({})",
            i64::MAX
        )));
    }
    Ok(())
}

/// The sum of `weights`, checked: `expected` entries, each ≥ 1, the sum a `SCOTCH_Num`.
/// `first` numbers vertex weights globally in messages.
fn weight_sum(what: &str, weights: &[u64], expected: usize, first: u64) -> Result<u64, InputError> {
    if weights.len() != expected {
        return Err(InputError::WeightsLength(format!(
            "{what} weights hold {} entries for {expected} {what}s",
            weights.len()
        )));
    }
    let mut sum: u64 = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w == 0 {
            let at = if what == "vertex" {
                format!("vertex {}", first + i as u64)
            } else {
                format!("adjacency entry {i}")
            };
            return Err(InputError::ZeroWeight(format!(
                "{at} has {what} weight 0; PT-Scotch takes weights ≥ 1"
            )));
        }
        sum = sum
            .checked_add(w)
            .filter(|&s| i64::try_from(s).is_ok())
            .ok_or_else(|| {
                InputError::Overflow(format!(
                    "this rank's {what} weights add up to more than PT-Scotch's SCOTCH_Num holds ({})",
                    i64::MAX
                ))
            })?;
    }
    Ok(sum)
}

/// A key every rank must share: the distribution, the options and which weights are given.
fn shared_key(graph: &DistGraph<'_>, options: &Options) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for &v in graph.vtxdist {
        h.update(&v.to_le_bytes());
    }
    h.update(&(options.parts as u64).to_le_bytes());
    h.update(&options.imbalance.to_bits().to_le_bytes());
    h.update(&options.seed.to_le_bytes());
    h.update(&[
        options.strategy as u8,
        u8::from(graph.vertex_weights.is_some()),
        u8::from(graph.edge_weights.is_some()),
    ]);
    h.update(&(options.threads as u64).to_le_bytes());
    h.digest()
}

/// Checks the distributed graph and the options on every rank (collective) and returns the
/// same verdict on every rank: the graph's totals, or the lowest failing rank's
/// [`PtScotchError::Input`]. `multiple_threads`: whether MPI grants `MPI_THREAD_MULTIPLE`.
pub(crate) fn check<C: AllReduce + AllGather>(
    comm: &C,
    graph: &DistGraph<'_>,
    options: &Options,
    multiple_threads: bool,
) -> Result<GraphTotals, PtScotchError> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let local = check_local(graph, rank, ranks, options, multiple_threads);
    let message = local.as_ref().err().map(ToString::to_string);
    let offered = match (&local, &message) {
        (Ok(_), _) => Ok(shared_key(graph, options)),
        (Err(e), Some(m)) => Err((e.kind() as i32, m.as_str())),
        (Err(e), None) => Err((e.kind() as i32, "")),
    };
    match agree::settle(comm, offered)? {
        Settled::Agreed(_) => {}
        Settled::Failed(f) => {
            return Err(PtScotchError::Input {
                rank: Some(f.rank),
                kind: InputErrorKind::from_code(f.code),
                message: f.message,
            })
        }
        Settled::Keys { .. } => {
            return Err(PtScotchError::Input {
                rank: None,
                kind: InputErrorKind::Disagreement,
                message: "the ranks were given different vertex distributions (vtxdist), options, \
                          or weight arrays on some ranks only; give every rank the same"
                    .into(),
            })
        }
    }
    let sums = local.unwrap_or_default();
    let words = [
        sums.vertex_weight,
        sums.edge_weight,
        sums.arcs,
        sums.forward[0],
        sums.forward[1],
        sums.reverse[0],
        sums.reverse[1],
    ];
    let all = comm.all_gather_vec(&words)?;
    let mut total = [0u128; 3];
    let mut hashes = [0u64; 4];
    for record in all.chunks_exact(words.len()) {
        for k in 0..3 {
            total[k] += u128::from(record[k]);
        }
        for k in 0..4 {
            hashes[k] = hashes[k].wrapping_add(record[3 + k]);
        }
    }
    let names = [
        "the vertex weights",
        "the edge weights",
        "the arcs (adjacency entries)",
    ];
    for (k, name) in names.iter().enumerate() {
        if i64::try_from(total[k]).is_err() {
            return Err(PtScotchError::Input {
                rank: None,
                kind: InputErrorKind::Overflow,
                message: format!(
                    "{name} of all ranks add up to {}, beyond PT-Scotch's 64-bit SCOTCH_Num ({})",
                    total[k],
                    i64::MAX
                ),
            });
        }
    }
    if hashes[0..2] != hashes[2..4] {
        return Err(PtScotchError::Input {
            rank: None,
            kind: InputErrorKind::Asymmetric,
            message: "the graph is not symmetric: some arc u → v has no arc v → u (or one with \
                      another edge weight); PT-Scotch partitions undirected graphs, stored as \
                      both arcs of every edge"
                .into(),
        });
    }
    Ok(GraphTotals {
        vertices: graph.vtxdist[ranks],
        // Below i64::MAX (checked above).
        arcs: u64::try_from(total[2]).unwrap_or(u64::MAX),
        vertex_weight: u64::try_from(total[0]).unwrap_or(u64::MAX),
        edge_weight: u64::try_from(total[1]).unwrap_or(u64::MAX),
    })
}
