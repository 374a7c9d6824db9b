//! Building the chunks on several ranks at once, each holding only a slice of the graph: the
//! bounded-memory builder's steps ([`super::bounded`]) with its per-part files replaced by
//! messages between the ranks.
//!
//! Rank r of P holds a [`GraphSlice`]: a contiguous piece of the edge list (the pieces in rank
//! order are the input's edge order) and a contiguous range of nodes with their data, plus the
//! part of each of those nodes (from a distributed partitioner). Rank r builds the parts
//! [`owned_parts`]`(K, P, r)`, a contiguous range of the K parts (K ≥ P).
//!
//! 1. **Partition** (all-gather of the part ids): every rank holds the whole part map, its
//!    renumbering and every node's location (O(N) words per rank; 4 + 4 + 8 + 8 bytes per node
//!    with the degrees below).
//! 2. **Edges** (all-to-all-v): edge `u → v` goes to the rank owning part(v), grouped by part,
//!    so a part's edges arrive in the input's edge order (pieces of lower ranks first) — the
//!    order [`super::bounded`] reads its bucket files in. The self loops of `A + I` are taken
//!    from the edges received, which hold every loop of the rank's nodes.
//! 3. **Rows**: each part's merged, unscaled rows, assembled exactly as the single-machine
//!    builders do; their sums are the degrees.
//! 4. **Degrees** (all-gather, in new-id order): every rank gets every node's factor of the
//!    normalisation, and scales its rows as `normalize` does.
//! 5. **Halo lists** (all-to-all-v): each part's receive lists come from its rows; part p sends
//!    part q what q receives from p, so the lists go to the rank owning p.
//! 6. **Node data** (all-to-all-v): features, labels, targets and masks of the rank's node
//!    range go to the rank owning each node's part, which lays them out in new-id order.
//! 7. **Chunks**: one part at a time, by the code every builder shares
//!    ([`super::build`]'s layout), handed to the caller (who writes them).
//!
//! Given the same partition, the chunks are byte-identical to the single-machine builders'
//! (the tests compare them). Every step that can fail on one rank ends in an agreement
//! ([`dist_comm::agree::outcome`]): every rank returns an error, none waits in a later
//! collective.

use std::ops::Range;
use std::string::String;
use std::vec::Vec;

use dist_comm::agree::{self, PeerFailure};
use dist_comm::{AllGather, AllReduce, AllToAllV, BlockLayout, CommError, Element};

use crate::graph::{Features, Graph, GraphSlice, Targets};
use crate::normalize::{self, Normalization, NormalizeError, SelfLoops};
use crate::partition::{Partition, Renumbering};
use distspmm_sparse::index;
use distspmm_sparse::sparse::{assemble, TripletSource};

use super::bounded::LocalRows;
use super::build::{locations, split_location, HaloScan, Layout};
use super::{ChunkBuildError, HaloLists, PartChunk};
use chunk_format::dir::ChunkDirError;

/// The collectives the distributed builder uses.
pub trait BuildComm: AllGather + AllReduce + AllToAllV {}
impl<C: AllGather + AllReduce + AllToAllV> BuildComm for C {}

/// Why a distributed build failed: this rank's own error, another rank's, or the communication.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistBuildError {
    /// This rank failed (every other rank returns [`DistBuildError::Peer`] with its message).
    #[error(transparent)]
    Local(#[from] ChunkDirError),
    /// Another rank failed: the lowest failing rank and its message.
    #[error(transparent)]
    Peer(#[from] PeerFailure),
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// The parts rank `rank` of `ranks` builds out of `parts`: a contiguous range, `⌊K·r/P⌋ ..
/// ⌊K·(r+1)/P⌋` (empty when K < P, which [`build`] refuses).
pub fn owned_parts(parts: u32, ranks: usize, rank: usize) -> Range<u32> {
    let at = |r: usize| index::id((parts as usize * r) / ranks.max(1));
    at(rank)..at(rank + 1)
}

/// The rank that builds part `q` (see [`owned_parts`]).
fn owner_of_part(parts: u32, ranks: usize, q: u32) -> usize {
    // The largest r with ⌊K·r/P⌋ ≤ q.
    let (k, p) = (parts as usize, ranks);
    ((q as usize + 1) * p - 1) / k
}

/// What the ranks built together, the same on every rank except `chunks_built`.
#[derive(Debug)]
pub struct DistBuild {
    /// The whole partition (every rank holds it).
    pub partition: Partition,
    /// Every part's halo rows (for the manifest).
    pub halo_rows: Vec<u64>,
    /// Non-zeros of Â over all parts.
    pub nnz: u64,
    /// Directed edges of the input.
    pub edges: u64,
    /// Feature columns.
    pub feature_dim: u32,
    /// Classes.
    pub num_classes: u32,
    /// The parts this rank built (and handed to the caller), in order.
    pub chunks_built: Range<u32>,
}

/// The bytes this rank held at the end of each step (its own arrays, counted, not measured).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepBytes {
    /// The whole partition, its renumbering and the node locations.
    pub partition: u64,
    /// The edges sent and received.
    pub exchange: u64,
    /// The assembled rows of the rank's parts.
    pub rows: u64,
}

/// Builds the chunks of this rank's parts from its `slice` and the parts of its nodes
/// (`slice_parts`, one per node of `slice.nodes`, below `parts`), with every other rank of
/// `comm` calling it at once; calls `on_exchanged` once the edges are with the ranks that build
/// their rows (the end of the exchange, for phase timings) and hands each chunk, in part order,
/// to `sink`. `method` names the partitioner in the partition (its fingerprint covers it).
///
/// # Errors
/// Every rank returns an error when any fails: its own ([`DistBuildError::Local`]) or the
/// lowest failing rank's ([`DistBuildError::Peer`]), so that no rank is left waiting.
#[allow(
    clippy::too_many_arguments,
    reason = "the build's inputs, each used once"
)]
pub fn build<C: BuildComm>(
    comm: &C,
    slice: GraphSlice,
    slice_parts: &[u32],
    parts: u32,
    method: &str,
    norm: Normalization,
    steps: &mut StepBytes,
    on_exchanged: &mut dyn FnMut(),
    mut sink: impl FnMut(PartChunk) -> Result<(), ChunkDirError>,
) -> Result<DistBuild, DistBuildError> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let local = check_slice(&slice, slice_parts, parts, ranks);
    settle(comm, local)?;
    let n = slice.num_nodes;
    // One graph: every rank read the same sizes, and the slices hold every edge once (a file
    // replaced while the ranks read it would give them other sizes).
    let key = [n as u64, slice.num_edges];
    let keys = comm.all_gather_vec(&key)?;
    let pieces = all_reduce_sum(comm, slice.src.len() as u64)?;
    if let Some(other) = keys.chunks_exact(2).position(|k| k != key) {
        return Err(DistBuildError::Local(mismatch(std::format!(
            "this rank read a graph of {n} nodes and {} edges, rank {other} one of {} nodes and              {} edges: was the input replaced while the ranks read it?",
            slice.num_edges,
            keys[2 * other],
            keys[2 * other + 1]
        ))));
    }
    if pieces != slice.num_edges {
        return Err(DistBuildError::Local(mismatch(std::format!(
            "the ranks' slices hold {pieces} edges but the graph has {}",
            slice.num_edges
        ))));
    }

    // 1. The partition, everywhere.
    let part_of = all_gather_v(comm, slice_parts)?;
    let partition = settle(
        comm,
        Partition::new(parts, part_of, method).map_err(Into::into),
    )?;
    let renumbering = partition.renumbering();
    let location = locations(&partition, &renumbering);
    steps.partition = 4 * n as u64 * 2 + 8 * n as u64;

    // 2. Edges to the owners of their rows' parts.
    let (edges, nodes) = (slice.src.len() as u64, slice.nodes);
    let total_edges = all_reduce_sum(comm, edges)?;
    let received = send_edges(comm, &partition, parts, slice.src, slice.dst, slice.weights)?;
    steps.exchange = received.bytes();
    on_exchanged();

    // 3. Rows of the rank's parts, degrees of their nodes.
    let mine = owned_parts(parts, ranks, rank);
    let assembled = assemble_parts(&received, &renumbering, &location, n, norm, mine.clone());
    let (rows, diagonal, degrees) = settle(comm, assembled)?;
    drop(received);
    steps.rows = rows
        .iter()
        .map(|r| 16 * r.nnz() + 8 * r.indptr.len() as u64)
        .sum();
    let nnz = all_reduce_sum(comm, rows.iter().map(LocalRows::nnz).sum())?;

    // 4. Every node's factor.
    let inv = inverse_degrees(comm, degrees, &renumbering, norm)?;

    // 5. Halo lists.
    let halo = halo_lists(comm, &rows, &renumbering, &location, parts, mine.clone())?;
    let halo_rows = all_gather_v(
        comm,
        &mine
            .clone()
            .map(|p| halo.halo_rows(p as usize))
            .collect::<Vec<_>>(),
    )?;

    // 6. Node data.
    let (local, feature_dim, num_classes) =
        node_data(comm, &nodes, &partition, &renumbering, parts, &mine)?;
    drop(nodes);

    // 7. Chunks.
    let base = renumbering.offsets()[mine.start as usize];
    let built = (|| {
        let layout = Layout::for_new_ids(
            &local,
            &partition,
            renumbering,
            location,
            base,
            feature_dim,
            num_classes,
        )?;
        let mut scratch = Vec::new();
        for (p, mut part_rows) in mine.clone().zip(rows) {
            let part_nodes = layout.renumbering().part_nodes(p);
            let rows_p = part_nodes.len() as u64;
            let halo_p = halo.halo_rows(p as usize);
            super::build::check_part_fits(p, rows_p, halo_p, u64::from(u32::MAX))?;
            part_rows.normalise(p, part_nodes, diagonal.as_ref(), &inv, norm)?;
            let chunk = layout.build_part(&halo, p, &part_rows, &mut scratch);
            drop(part_rows);
            sink(chunk)?;
        }
        Ok::<(), ChunkDirError>(())
    })();
    settle(comm, built)?;
    Ok(DistBuild {
        halo_rows,
        nnz,
        edges: total_edges,
        feature_dim,
        num_classes,
        chunks_built: mine,
        partition,
    })
}

/// This rank's result made collective: its own error as [`DistBuildError::Local`], another
/// rank's as [`DistBuildError::Peer`].
fn settle<C: BuildComm, T>(comm: &C, local: Result<T, ChunkDirError>) -> Result<T, DistBuildError> {
    match agree::outcome_keeping_own(comm, local, |e| agree::message_with_sources(e))? {
        Ok(value) => Ok(value),
        Err(agree::Failure::Own(own)) => Err(DistBuildError::Local(own)),
        Err(agree::Failure::Peer(peer)) => Err(DistBuildError::Peer(peer)),
    }
}

fn mismatch(message: String) -> ChunkDirError {
    ChunkBuildError::Mismatch(message).into()
}

/// The local checks of [`build`]'s inputs.
fn check_slice(
    slice: &GraphSlice,
    slice_parts: &[u32],
    parts: u32,
    ranks: usize,
) -> Result<(), ChunkDirError> {
    if (parts as usize) < ranks {
        return Err(mismatch(std::format!(
            "{parts} parts for {ranks} ranks: every rank builds at least one part, so give at \
             least as many parts as ranks"
        )));
    }
    if slice_parts.len() != slice.nodes.num_nodes {
        return Err(mismatch(std::format!(
            "{} part ids for the {} nodes of this rank's slice",
            slice_parts.len(),
            slice.nodes.num_nodes
        )));
    }
    if let Some(&bad) = slice_parts.iter().find(|&&q| q >= parts) {
        return Err(mismatch(std::format!(
            "part {bad} of a node, but there are {parts} parts"
        )));
    }
    slice.nodes.validate().map_err(ChunkBuildError::from)?;
    normalize::check_edges(
        slice.num_nodes,
        &slice.src,
        &slice.dst,
        slice.weights.as_deref(),
    )?;
    Ok(())
}

/// Elements one all-to-all-v call moves at most in all, send or receive side: MPI's counts
/// and displacements are `int`s, so larger exchanges run in rounds, each moving an equal share
/// of every block (through buffers of one round's share: memory only past this size).
const ROUND_ELEMENTS: usize = i32::MAX as usize;

/// Every rank's `mine`, concatenated in rank order, on every rank.
pub fn all_gather_v<C: BuildComm, T: Element + Default>(
    comm: &C,
    mine: &[T],
) -> Result<Vec<T>, CommError> {
    all_gather_v_capped(comm, mine, ROUND_ELEMENTS)
}

fn all_gather_v_capped<C: BuildComm, T: Element + Default>(
    comm: &C,
    mine: &[T],
    cap: usize,
) -> Result<Vec<T>, CommError> {
    let ranks = comm.size();
    let counts: Vec<usize> = comm
        .all_gather_vec(&[mine.len() as u64])?
        .into_iter()
        .map(index::offset)
        .collect();
    let total: usize = counts.iter().sum();
    let rounds = total.div_ceil(cap.max(1)).max(1);
    let mut out = std::vec![T::default(); total];
    let starts = prefix(&counts);
    for k in 0..rounds {
        let piece = |count: usize| round_range(count, k, rounds);
        let mine_k = &mine[piece(mine.len())];
        let send = BlockLayout::new(std::vec![mine_k.len(); ranks], std::vec![0; ranks])?;
        let recv_counts: Vec<usize> = counts.iter().map(|&c| piece(c).len()).collect();
        let recv = BlockLayout::packed(recv_counts.clone());
        let mut buf = std::vec![T::default(); recv.total()];
        comm.all_to_all_v(mine_k, &send, &mut buf, &recv)?;
        for r in 0..ranks {
            let at = starts[r] + piece(counts[r]).start;
            out[at..at + recv_counts[r]].copy_from_slice(&buf[recv.block(r)]);
        }
    }
    Ok(out)
}

/// Round `k` of `rounds`'s share of a block of `count` elements.
fn round_range(count: usize, k: usize, rounds: usize) -> Range<usize> {
    let at = |k: usize| {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "count · k / rounds ≤ count, a usize"
        )]
        let v = (count as u128 * k as u128 / rounds as u128) as usize;
        v
    };
    at(k)..at(k + 1)
}

/// Exclusive prefix sums.
fn prefix(counts: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &c in counts {
        out.push(at);
        at += c;
    }
    out
}

pub(crate) fn all_reduce_sum<C: BuildComm>(comm: &C, mine: u64) -> Result<u64, CommError> {
    let mut value = [mine];
    comm.all_reduce_sum(&mut value)?;
    Ok(value[0])
}

/// Sends each rank's blocks (`counts[r]` elements of `send` for rank r, packed in rank order)
/// and returns what every rank sent this one, packed in rank order, with the counts.
pub(crate) fn exchange<C: BuildComm, T: Element + Default>(
    comm: &C,
    send: &[T],
    counts: &[usize],
) -> Result<(Vec<T>, Vec<usize>), CommError> {
    exchange_capped(comm, send, counts, ROUND_ELEMENTS)
}

fn exchange_capped<C: BuildComm, T: Element + Default>(
    comm: &C,
    send: &[T],
    counts: &[usize],
    cap: usize,
) -> Result<(Vec<T>, Vec<usize>), CommError> {
    let recv_counts = exchange_counts(comm, counts)?;
    let recv = exchange_known(comm, send, counts, &recv_counts, cap)?;
    Ok((recv, recv_counts))
}

/// What every rank will send this one, given what this one sends each (`counts`).
fn exchange_counts<C: BuildComm>(comm: &C, counts: &[usize]) -> Result<Vec<usize>, CommError> {
    let ranks = comm.size();
    let mut theirs = std::vec![0u64; ranks];
    let ones = BlockLayout::packed(std::vec![1; ranks]);
    let mine: Vec<u64> = counts.iter().map(|&c| c as u64).collect();
    comm.all_to_all_v(&mine, &ones, &mut theirs, &ones)?;
    Ok(theirs.into_iter().map(index::offset).collect())
}

/// [`exchange`] with the receive counts known ([`exchange_counts`]).
fn exchange_known<C: BuildComm, T: Element + Default>(
    comm: &C,
    send: &[T],
    counts: &[usize],
    recv_counts: &[usize],
    cap: usize,
) -> Result<Vec<T>, CommError> {
    let ranks = comm.size();
    let recv_layout = BlockLayout::packed(recv_counts.to_vec());
    let mut recv = std::vec![T::default(); recv_layout.total()];
    // The same number of rounds everywhere: enough for the largest side of any rank.
    let largest = send.len().max(recv.len()) as u64;
    let mut rounds = [largest.div_ceil(cap.max(1) as u64).max(1)];
    comm.all_reduce(&mut rounds, dist_comm::ReduceOp::Max)?;
    let rounds = index::offset(rounds[0]);
    if rounds == 1 {
        comm.all_to_all_v(
            send,
            &BlockLayout::packed(counts.to_vec()),
            &mut recv,
            &recv_layout,
        )?;
        return Ok(recv);
    }
    let (send_starts, recv_starts) = (prefix(counts), prefix(recv_counts));
    for k in 0..rounds {
        let piece = |count: usize| round_range(count, k, rounds);
        let mut out = Vec::new();
        let mut out_counts = Vec::with_capacity(ranks);
        for r in 0..ranks {
            let range = piece(counts[r]);
            out_counts.push(range.len());
            out.extend_from_slice(&send[send_starts[r] + range.start..send_starts[r] + range.end]);
        }
        let in_counts: Vec<usize> = recv_counts.iter().map(|&c| piece(c).len()).collect();
        let in_layout = BlockLayout::packed(in_counts.clone());
        let mut buf = std::vec![T::default(); in_layout.total()];
        comm.all_to_all_v(&out, &BlockLayout::packed(out_counts), &mut buf, &in_layout)?;
        for s in 0..ranks {
            let at = recv_starts[s] + piece(recv_counts[s]).start;
            recv[at..at + in_counts[s]].copy_from_slice(&buf[in_layout.block(s)]);
        }
    }
    Ok(recv)
}

/// The edges this rank received: `u → v` (and the weight) for rows of its parts, grouped by
/// sending rank, then by part, each group in the sender's edge order; `counts[s][i]` edges from
/// rank s for the rank's i-th part.
struct Received {
    dst: Vec<u32>,
    src: Vec<u32>,
    weights: Option<Vec<f32>>,
    counts: Vec<Vec<u64>>,
}

impl Received {
    fn bytes(&self) -> u64 {
        (self.dst.len() * 4 + self.src.len() * 4 + self.weights.as_ref().map_or(0, |w| w.len() * 4))
            as u64
    }

    /// The positions of part `i`'s (the rank's i-th part's) edges, in edge order.
    fn ranges(&self, i: usize) -> Vec<Range<usize>> {
        let mut at = 0u64;
        let mut out = Vec::with_capacity(self.counts.len());
        for counts in &self.counts {
            let before: u64 = counts[..i].iter().sum();
            let total: u64 = counts.iter().sum();
            let start = index::offset(at + before);
            out.push(start..start + index::offset(counts[i]));
            at += total;
        }
        out
    }
}

/// Step 2: every edge to the rank owning its row node's part.
fn send_edges<C: BuildComm>(
    comm: &C,
    partition: &Partition,
    parts: u32,
    src: Vec<u32>,
    dst: Vec<u32>,
    weights: Option<Vec<f32>>,
) -> Result<Received, CommError> {
    let ranks = comm.size();
    let part_of = partition.part_of();
    // Edges per destination part, then each part's first position in the send buffers.
    let mut per_part = std::vec![0u64; parts as usize];
    for &v in &dst {
        per_part[part_of[v as usize] as usize] += 1;
    }
    let mut cursor = Vec::with_capacity(parts as usize);
    let mut at = 0usize;
    for &c in &per_part {
        cursor.push(at);
        at += index::offset(c);
    }
    let mut send_dst = std::vec![0u32; dst.len()];
    let mut send_src = std::vec![0u32; dst.len()];
    let mut send_w = weights.as_ref().map(|w| std::vec![0f32; w.len()]);
    for (e, (&u, &v)) in src.iter().zip(&dst).enumerate() {
        let q = part_of[v as usize] as usize;
        let k = cursor[q];
        cursor[q] += 1;
        send_dst[k] = v;
        send_src[k] = u;
        if let (Some(out), Some(w)) = (send_w.as_mut(), weights.as_ref()) {
            out[k] = w[e];
        }
    }
    drop((src, dst, weights));
    // Per rank: its parts' counts (a contiguous range of `per_part`), then the edges.
    let counts_layout: Vec<usize> = (0..ranks)
        .map(|r| owned_parts(parts, ranks, r).len())
        .collect();
    let (part_counts, _) = exchange(comm, &per_part, &counts_layout)?;
    let edge_counts: Vec<usize> = (0..ranks)
        .map(|r| {
            owned_parts(parts, ranks, r)
                .map(|q| index::offset(per_part[q as usize]))
                .sum()
        })
        .collect();
    let recv_counts = exchange_counts(comm, &edge_counts)?;
    let exchange =
        |send: &[u32]| exchange_known(comm, send, &edge_counts, &recv_counts, ROUND_ELEMENTS);
    let dst = exchange(&send_dst)?;
    drop(send_dst);
    let src = exchange(&send_src)?;
    drop(send_src);
    let weighted = all_reduce_sum(comm, u64::from(send_w.is_some()))? > 0;
    let weights = if weighted {
        let send = send_w.unwrap_or_default();
        Some(exchange_known(
            comm,
            &send,
            &edge_counts,
            &recv_counts,
            ROUND_ELEMENTS,
        )?)
    } else {
        None
    };
    let mine = owned_parts(parts, ranks, comm.rank()).len();
    let counts = part_counts
        .chunks(mine.max(1))
        .map(<[u64]>::to_vec)
        .collect();
    Ok(Received {
        dst,
        src,
        weights,
        counts,
    })
}

/// One part's received edges as the entries `(local row, original column, weight)` of its rows
/// of `A` (or `A + I`): edges in edge order, then the diagonal, as the bucket files are read.
struct PartTriplets<'a> {
    received: &'a Received,
    ranges: Vec<Range<usize>>,
    location: &'a [u64],
    nodes: &'a [u32],
    diagonal: Option<&'a SelfLoops>,
}

impl TripletSource<f32> for PartTriplets<'_> {
    fn len(&self) -> usize {
        let loops = |r: &Range<usize>| {
            (r.clone())
                .filter(|&k| self.received.src[k] == self.received.dst[k])
                .count()
        };
        self.ranges
            .iter()
            .map(|r| r.len() - self.diagonal.map_or(0, |_| loops(r)))
            .sum::<usize>()
            + self.diagonal.map_or(0, |_| self.nodes.len())
    }

    fn for_each(&self, mut f: impl FnMut(u32, u32, f32)) {
        let skip_loops = self.diagonal.is_some();
        for range in &self.ranges {
            for k in range.clone() {
                let (v, u) = (self.received.dst[k], self.received.src[k]);
                if skip_loops && u == v {
                    continue;
                }
                let w = self.received.weights.as_ref().map_or(1.0, |w| w[k]);
                f(split_location(self.location[v as usize]).1, u, w);
            }
        }
        if let Some(d) = self.diagonal {
            for (i, &v) in self.nodes.iter().enumerate() {
                f(index::id(i), v, d.with_identity(v as usize));
            }
        }
    }
}

/// The assembled rows of the rank's parts, the diagonal of `A + I` and the degrees of the
/// rank's nodes in new-id order.
type Assembled = (Vec<LocalRows>, Option<SelfLoops>, Vec<f64>);

/// Step 3.
fn assemble_parts(
    received: &Received,
    renumbering: &Renumbering,
    location: &[u64],
    num_nodes: usize,
    norm: Normalization,
    mine: Range<u32>,
) -> Result<Assembled, ChunkDirError> {
    let what = || std::format!("the self loops of {num_nodes} nodes");
    let diagonal = normalize::self_loops(
        num_nodes,
        &received.src,
        &received.dst,
        received.weights.as_deref(),
        norm,
        &what,
    )?;
    let mut all = Vec::with_capacity(mine.len());
    let mut degrees = Vec::new();
    let mut overflow: Option<(u32, u32)> = None;
    for (i, p) in mine.enumerate() {
        let nodes = renumbering.part_nodes(p);
        let triplets = PartTriplets {
            received,
            ranges: received.ranges(i),
            location,
            nodes,
            diagonal: diagonal.as_ref(),
        };
        let (indptr, indices, data) = assemble(nodes.len(), &triplets).map_err(|failed| {
            normalize::assembly_failed(
                std::format!("the rows of part {p} ({} nodes)", nodes.len()),
                failed.bytes,
            )
        })?;
        if let Some((i, col)) = normalize::first_overflow(&indptr, &indices, &data) {
            let at = (nodes[i], col);
            overflow = Some(overflow.map_or(at, |o| o.min(at)));
        }
        if norm != Normalization::None {
            let what = || std::format!("the degrees of part {p}");
            degrees.extend(normalize::row_degrees(&indptr, &data, &what)?);
        }
        all.push(LocalRows {
            indptr,
            indices,
            data,
            weights: None,
        });
    }
    if let Some((dst, src)) = overflow {
        return Err(NormalizeError::WeightOverflow { src, dst }.into());
    }
    Ok((all, diagonal, degrees))
}

/// Step 4: every node's `D^-1/2` or `D^-1` by original id (empty for no normalisation).
fn inverse_degrees<C: BuildComm>(
    comm: &C,
    degrees: Vec<f64>,
    renumbering: &Renumbering,
    norm: Normalization,
) -> Result<Vec<f64>, DistBuildError> {
    if norm == Normalization::None {
        return Ok(Vec::new());
    }
    let by_new = all_gather_v(comm, &degrees)?;
    drop(degrees);
    let mut inv: Vec<f64> = renumbering
        .old_to_new()
        .iter()
        .map(|&new| by_new[new as usize])
        .collect();
    drop(by_new);
    // The same verdict everywhere: every rank holds every degree.
    normalize::invert_degrees(&mut inv, norm).map_err(ChunkDirError::from)?;
    Ok(inv)
}

/// Step 5: the receive lists of the rank's parts, and the lists other parts receive from them
/// (their send lists); empty lists elsewhere.
fn halo_lists<C: BuildComm>(
    comm: &C,
    rows: &[LocalRows],
    renumbering: &Renumbering,
    location: &[u64],
    parts: u32,
    mine: Range<u32>,
) -> Result<HaloLists, CommError> {
    let ranks = comm.size();
    let k = parts as usize;
    let offsets = renumbering.offsets();
    let mut scan = HaloScan::new(renumbering.num_nodes());
    let mut recv_offsets: Vec<Vec<u64>> = std::vec![std::vec![0u64; k + 1]; k];
    let mut recv: Vec<Vec<u32>> = std::vec![Vec::new(); k];
    for (p, part_rows) in mine.clone().zip(rows) {
        let (o, r) = scan.scan_part(offsets, location, p, part_rows);
        recv_offsets[p as usize] = o;
        recv[p as usize] = r;
    }
    // To the owner of q, for each of my parts p and each of its parts q: |recv(p, q)| then
    // (in a second message) the ids.
    let mut lengths = Vec::new();
    let mut ids = Vec::new();
    let mut length_counts = std::vec![0usize; ranks];
    let mut id_counts = std::vec![0usize; ranks];
    for r in 0..ranks {
        for p in mine.clone() {
            for q in owned_parts(parts, ranks, r) {
                let o = &recv_offsets[p as usize];
                let list = &recv[p as usize]
                    [index::offset(o[q as usize])..index::offset(o[q as usize + 1])];
                lengths.push(list.len() as u64);
                ids.extend_from_slice(list);
                length_counts[r] += 1;
                id_counts[r] += list.len();
            }
        }
    }
    let (their_lengths, _) = exchange(comm, &lengths, &length_counts)?;
    let (their_ids, _) = exchange(comm, &ids, &id_counts)?;
    let (mut l, mut at) = (0usize, 0usize);
    for s in 0..ranks {
        for p in owned_parts(parts, ranks, s) {
            let mut o = std::vec![0u64; k + 1];
            let mut list = Vec::new();
            for q in 0..parts {
                if mine.contains(&q) {
                    let len = index::offset(their_lengths[l]);
                    l += 1;
                    if s != comm.rank() {
                        list.extend_from_slice(&their_ids[at..at + len]);
                    }
                    at += len;
                }
                o[q as usize + 1] = list.len() as u64;
            }
            if s != comm.rank() {
                recv_offsets[p as usize] = o;
                recv[p as usize] = list;
            }
        }
    }
    Ok(HaloLists::from_lists(recv_offsets, recv))
}

/// Step 6: the node data of the rank's parts, in new-id order from the first of them, and the
/// graph's feature columns and classes.
fn node_data<C: BuildComm>(
    comm: &C,
    nodes: &Graph,
    partition: &Partition,
    renumbering: &Renumbering,
    parts: u32,
    mine: &Range<u32>,
) -> Result<(Graph, u32, u32), DistBuildError> {
    let ranks = comm.size();
    let part_of = partition.part_of();
    let n = partition.num_nodes();
    // What the node arrays hold, agreed: present or not, the feature columns, the classes.
    let classes_local = if nodes.targets.is_some() {
        0
    } else {
        nodes.num_classes() as u64
    };
    let mut shape = [
        nodes.feature_dim() as u64,
        nodes.targets.as_ref().map_or(0, |t| t.classes as u64),
        u64::from(nodes.labels.is_some()),
        u64::from(nodes.train_mask.is_some()),
        u64::from(nodes.val_mask.is_some()),
        u64::from(nodes.test_mask.is_some()),
        classes_local,
    ];
    let mine_shape = shape;
    comm.all_reduce(&mut shape, dist_comm::ReduceOp::Max)?;
    let local_check = if mine_shape[..6] == shape[..6] || nodes.num_nodes == 0 {
        Ok(())
    } else {
        Err(mismatch(
            "the ranks' node slices hold different arrays (features, labels, masks)".into(),
        ))
    };
    settle(comm, local_check)?;
    let [dim, target_classes, has_labels, has_train, has_val, has_test, label_classes] = shape;
    let dim = index::offset(dim);
    let target_classes = index::offset(target_classes);
    let num_classes = if target_classes > 0 {
        target_classes as u64
    } else {
        label_classes
    };
    let feature_dim = u32::try_from(dim).map_err(|_| {
        mismatch(std::format!(
            "{dim} feature columns exceed the chunk format's u32"
        ))
    })?;
    let num_classes = u32::try_from(num_classes).map_err(|_| {
        mismatch(std::format!(
            "{num_classes} classes exceed the chunk format's u32"
        ))
    })?;

    // This rank's node range and every rank's.
    let first = all_gather_v(comm, &[nodes.num_nodes as u64])?;
    let mut starts = Vec::with_capacity(ranks + 1);
    starts.push(0usize);
    for &c in &first {
        starts.push(starts.last().copied().unwrap_or(0) + index::offset(c));
    }
    if starts[ranks] != n {
        settle(
            comm,
            Err::<(), _>(mismatch(std::format!(
                "the ranks' node slices hold {} nodes in all but the graph has {n}",
                starts[ranks]
            ))),
        )?;
    }
    let my_range = starts[comm.rank()]..starts[comm.rank() + 1];
    let owner = |v: usize| owner_of_part(parts, ranks, part_of[v]);
    // Send order: by destination rank, then node id (so the receiver knows which is which).
    let mut order: Vec<usize> = (0..nodes.num_nodes).collect();
    order.sort_by_key(|&i| owner(my_range.start + i));
    let mut counts = std::vec![0usize; ranks];
    for &i in &order {
        counts[owner(my_range.start + i)] += 1;
    }
    let scaled = |c: &[usize], w: usize| c.iter().map(|&x| x * w).collect::<Vec<_>>();
    // Where each received node goes: its new id − base, for senders in rank order.
    let base = renumbering.offsets()[mine.start as usize];
    let count_mine = index::offset(renumbering.offsets()[mine.end as usize] - base);
    let me = comm.rank();
    let mut placed = Vec::with_capacity(count_mine);
    for s in 0..ranks {
        for v in starts[s]..starts[s + 1] {
            if owner(v) == me {
                placed.push(index::offset(u64::from(renumbering.old_to_new()[v]) - base));
            }
        }
    }

    let features = if dim > 0 {
        let f = nodes.features.as_ref();
        let mut send = Vec::with_capacity(nodes.num_nodes * dim);
        for &i in &order {
            send.extend_from_slice(f.map_or(&[][..], |f| f.row(i)));
        }
        let (recv, _) = exchange(comm, &send, &scaled(&counts, dim))?;
        let mut out = std::vec![0f32; count_mine * dim];
        for (k, &at) in placed.iter().enumerate() {
            out[at * dim..(at + 1) * dim].copy_from_slice(&recv[k * dim..(k + 1) * dim]);
        }
        Some(Features::new(dim, out))
    } else {
        None
    };
    let labels = if has_labels > 0 {
        let y = nodes.labels.as_deref().unwrap_or(&[]);
        let send: Vec<i32> = order.iter().map(|&i| y[i]).collect();
        let (recv, _) = exchange(comm, &send, &counts)?;
        let mut out = std::vec![0i32; count_mine];
        for (k, &at) in placed.iter().enumerate() {
            out[at] = recv[k];
        }
        Some(out)
    } else {
        None
    };
    let targets = if target_classes > 0 {
        let c = target_classes;
        let mut send = Vec::with_capacity(nodes.num_nodes * c);
        for &i in &order {
            send.extend_from_slice(nodes.targets.as_ref().map_or(&[][..], |t| t.row(i)));
        }
        let (recv, _) = exchange(comm, &send, &scaled(&counts, c))?;
        let mut out = std::vec![0u8; count_mine * c];
        for (k, &at) in placed.iter().enumerate() {
            out[at * c..(at + 1) * c].copy_from_slice(&recv[k * c..(k + 1) * c]);
        }
        Some(Targets {
            classes: c,
            data: out,
        })
    } else {
        None
    };
    let mut masks: [Option<Vec<bool>>; 3] = [None, None, None];
    let given = [has_train, has_val, has_test];
    let local = [&nodes.train_mask, &nodes.val_mask, &nodes.test_mask];
    if given.iter().any(|&g| g > 0) {
        let send: Vec<u8> = order
            .iter()
            .map(|&i| {
                local
                    .iter()
                    .enumerate()
                    .map(|(b, m)| m.as_ref().map_or(0u8, |m| u8::from(m[i]) << b))
                    .sum()
            })
            .collect();
        let (recv, _) = exchange(comm, &send, &counts)?;
        for (b, slot) in masks.iter_mut().enumerate() {
            if given[b] > 0 {
                let mut out = std::vec![false; count_mine];
                for (k, &at) in placed.iter().enumerate() {
                    out[at] = recv[k] & (1 << b) != 0;
                }
                *slot = Some(out);
            }
        }
    }
    let [train_mask, val_mask, test_mask] = masks;
    Ok((
        Graph {
            num_nodes: count_mine,
            features,
            labels,
            targets,
            train_mask,
            val_mask,
            test_mask,
            ..Graph::default()
        },
        feature_dim,
        num_classes,
    ))
}

#[cfg(test)]
#[path = "distributed_tests.rs"]
mod tests;
