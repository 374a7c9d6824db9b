//! Building one chunk's contents per part: Â's rows split by source part into blocks over
//! compacted columns (CSR and CSC) — with `A`'s weights at the same entries when given — the
//! halo lists, and the node data following the renumbering.
//!
//! Two linear passes over Â. [`HaloLists::compute`] finds, for every part p and every other
//! part q, the sorted q-local ids of the columns p's rows reference (a bitmap over the new ids,
//! scanned part range by part range). [`ChunkBuilder::build`] then lays out one part's blocks
//! with a counting sort by block and by column. Â's rows are sorted by original column id and
//! the renumbering keeps original order within a part, so a row's entries in any one block are
//! already in compacted-column order: nothing is sorted.

use std::vec::Vec;

use std::sync::atomic::{AtomicU64, Ordering};

use chunk_format::{BlockView, ChunkContents};
use rayon::prelude::*;

use crate::graph::Graph;
use crate::partition::{Partition, Renumbering};
use distspmm_sparse::index;
use distspmm_sparse::sparse::par::split_lengths;
use distspmm_sparse::sparse::CsrView;

use super::ChunkBuildError;

/// Mask bits of the `MASKS` section.
const MASK_TRAIN: u8 = 1;
const MASK_VAL: u8 = 2;
const MASK_TEST: u8 = 4;

/// For every part p: the rows it receives from each other part (sorted q-local ids), flattened
/// with offsets `[P+1]` per part. Sends are the transpose: p sends r exactly `recv(r, p)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaloLists {
    parts: usize,
    /// `recv_offsets[p]` is part p's `[P+1]` offsets into `recv[p]`.
    recv_offsets: Vec<Vec<u64>>,
    recv: Vec<Vec<u32>>,
}

impl HaloLists {
    /// Finds every part's halo receive lists from Â (original ids) and the renumbering.
    /// Time O(nnz + P·N/64); one shared N-bit bitmap, parts in turn, each part's rows in
    /// parallel.
    pub fn compute(
        a_hat: &CsrView<'_, f32>,
        partition: &Partition,
        renumbering: &Renumbering,
    ) -> Self {
        Self::compute_with_locations(a_hat, renumbering, &locations(partition, renumbering))
    }

    fn compute_with_locations(
        a_hat: &CsrView<'_, f32>,
        renumbering: &Renumbering,
        location: &[u64],
    ) -> Self {
        let mut scan = HaloScan::new(renumbering.num_nodes());
        for p in 0..renumbering.parts() {
            let rows = RowsOfWhole {
                a_hat,
                weights: None,
                nodes: renumbering.part_nodes(p),
            };
            scan.add_part(renumbering.offsets(), location, p, &rows);
        }
        scan.finish()
    }

    /// Lists given part by part: `recv_offsets[p]` (`[P+1]` offsets) into `recv[p]`. A part
    /// whose lists the caller does not hold has offsets of empty lists.
    pub(super) fn from_lists(recv_offsets: Vec<Vec<u64>>, recv: Vec<Vec<u32>>) -> Self {
        debug_assert_eq!(recv_offsets.len(), recv.len());
        Self {
            parts: recv.len(),
            recv_offsets,
            recv,
        }
    }

    /// Number of parts.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// The sorted q-local ids part p receives from part q (empty for q = p).
    pub fn recv(&self, p: usize, q: usize) -> &[u32] {
        let o = &self.recv_offsets[p];
        &self.recv[p][index::offset(o[q])..index::offset(o[q + 1])]
    }

    /// Rows part p receives from all peers together (its halo size H).
    pub fn halo_rows(&self, p: usize) -> u64 {
        self.recv[p].len() as u64
    }

    /// Rows part p sends to all peers together.
    pub fn send_rows(&self, p: usize) -> u64 {
        (0..self.parts).map(|r| self.recv(r, p).len() as u64).sum()
    }
}

/// One part's rows of Â: local row i is the part's i-th node in renumbered order, its columns
/// original node ids, sorted, with their values.
pub(super) trait PartRows: Sync {
    /// Rows (the part's node count).
    fn nrows(&self) -> usize;
    /// Local row `i`: columns (original ids, increasing) and values.
    fn row(&self, i: usize) -> (&[u32], &[f32]);
    /// Whether the rows carry the weights of `A` at their entries (then every row does).
    fn has_weights(&self) -> bool;
    /// Local row `i`'s weights in `A`, entry for entry with [`PartRows::row`], if carried.
    fn row_weights(&self, i: usize) -> Option<&[f32]>;
}

/// Part rows read from the whole Â (original ids), with `A`'s weights at Â's entries if given.
struct RowsOfWhole<'r, 'a> {
    a_hat: &'r CsrView<'a, f32>,
    weights: Option<&'a [f32]>,
    nodes: &'r [u32],
}

impl PartRows for RowsOfWhole<'_, '_> {
    fn nrows(&self) -> usize {
        self.nodes.len()
    }

    fn row(&self, i: usize) -> (&[u32], &[f32]) {
        self.a_hat.row(self.nodes[i] as usize)
    }

    fn has_weights(&self) -> bool {
        self.weights.is_some()
    }

    fn row_weights(&self, i: usize) -> Option<&[f32]> {
        self.weights.map(|w| {
            let (v, indptr) = (self.nodes[i] as usize, self.a_hat.indptr());
            &w[index::offset(indptr[v])..index::offset(indptr[v + 1])]
        })
    }
}

/// Finds the halo receive lists part by part, in order `0..P`: one shared N-bit bitmap over
/// the new ids, each part's rows marked in parallel, then scanned peer range by peer range (so
/// the lists come out sorted and the bitmap is left clear). Time O(nnz_p + N/64) per part.
pub(super) struct HaloScan {
    bitmap: Vec<AtomicU64>,
    recv_offsets: Vec<Vec<u64>>,
    recv: Vec<Vec<u32>>,
}

impl HaloScan {
    pub(super) fn new(num_nodes: usize) -> Self {
        Self {
            bitmap: (0..num_nodes.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            recv_offsets: Vec::new(),
            recv: Vec::new(),
        }
    }

    /// Adds part `p` (the next one), given the part offsets, every original node's packed
    /// location (see [`locations`]) and the part's rows.
    pub(super) fn add_part(
        &mut self,
        offsets: &[u64],
        location: &[u64],
        p: u32,
        rows: &impl PartRows,
    ) {
        debug_assert_eq!(self.recv.len(), p as usize);
        let (offsets_p, recv_p) = self.scan_part(offsets, location, p, rows);
        self.recv_offsets.push(offsets_p);
        self.recv.push(recv_p);
    }

    /// Part `p`'s receive lists alone (`[P+1]` offsets and the sorted q-local ids), leaving the
    /// bitmap clear: what [`HaloScan::add_part`] records, for a caller that holds only some
    /// parts' rows.
    pub(super) fn scan_part(
        &mut self,
        offsets: &[u64],
        location: &[u64],
        p: u32,
        rows: &impl PartRows,
    ) -> (Vec<u64>, Vec<u32>) {
        let parts = offsets.len() - 1;
        let bitmap = &self.bitmap;
        (0..rows.nrows())
            .into_par_iter()
            .with_min_len(ROW_GRAIN)
            .for_each(|i| {
                for &col in rows.row(i).0 {
                    let (q, local) = split_location(location[col as usize]);
                    if q != p {
                        let new = index::offset(offsets[q as usize]) + local as usize;
                        bitmap[new / 64].fetch_or(1u64 << (new % 64), Ordering::Relaxed);
                    }
                }
            });
        let mut offsets_p = Vec::with_capacity(parts + 1);
        offsets_p.push(0u64);
        let mut recv_p = Vec::new();
        for q in 0..parts {
            let (start, end) = (index::offset(offsets[q]), index::offset(offsets[q + 1]));
            if q != p as usize && start < end {
                let first = start / 64;
                for (k, slot) in self.bitmap[first..=(end - 1) / 64].iter_mut().enumerate() {
                    let base = (first + k) * 64;
                    // Only this part's range: a boundary word is shared.
                    let word = slot.get_mut();
                    let mut bits = *word & range_mask(base, start, end);
                    *word &= !bits;
                    while bits != 0 {
                        let id = base + bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        recv_p.push(index::id(id - start));
                    }
                }
            }
            offsets_p.push(recv_p.len() as u64);
        }
        (offsets_p, recv_p)
    }

    /// The lists of all parts added.
    pub(super) fn finish(self) -> HaloLists {
        HaloLists {
            parts: self.recv.len(),
            recv_offsets: self.recv_offsets,
            recv: self.recv,
        }
    }
}

/// A chunk stores local rows and compacted columns (its rows plus its halo) as `u32`: checks
/// that part `p`'s `rows + halo` fit `max`.
pub(super) fn check_part_fits(
    p: u32,
    rows: u64,
    halo: u64,
    max: u64,
) -> Result<(), ChunkBuildError> {
    if rows.saturating_add(halo) > max {
        return Err(ChunkBuildError::Mismatch(std::format!(
            "part {p} has {rows} rows and {halo} halo rows, more local ids than the chunk \
             format's u32 holds ({max}); partition into more parts"
        )));
    }
    Ok(())
}

/// The bits of the 64-bit word covering ids `base..base+64` that fall in `start..end`
/// (`base < end`).
pub(super) fn range_mask(base: usize, start: usize, end: usize) -> u64 {
    let below = |k: usize| if k >= 64 { u64::MAX } else { (1u64 << k) - 1 };
    below(end - base) & !below(start.saturating_sub(base))
}

// Task sizes. The unit tests use tiny ones so that their small graphs take the multi-task paths.
/// Rows per parallel task when scanning a part's rows (marking halo bits).
const ROW_GRAIN: usize = if cfg!(test) { 2 } else { 1024 };
/// Non-zeros per parallel task when laying out a part's blocks.
const ENTRY_GRAIN: u64 = if cfg!(test) { 5 } else { 1 << 15 };
/// Blocks with fewer non-zeros are transposed by one task.
const TRANSPOSE_PAR_MIN: usize = if cfg!(test) { 4 } else { 1 << 18 };
/// Column-range tasks per large block: one per thread (three in tests, whatever the machine).
fn transpose_tasks() -> usize {
    if cfg!(test) {
        3
    } else {
        rayon::current_num_threads().max(1)
    }
}

/// Where every original node went, packed as `part << 32 | local id in the part`: one random
/// access per non-zero instead of two (part map, then renumbering).
pub(super) fn locations(partition: &Partition, renumbering: &Renumbering) -> Vec<u64> {
    let offsets = renumbering.offsets();
    partition
        .part_of()
        .par_iter()
        .zip(renumbering.old_to_new())
        .map(|(&q, &new)| (u64::from(q) << 32) | (u64::from(new) - offsets[q as usize]))
        .collect()
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "deliberate: the high and the low 32 bits of a packed (part, local row)"
)]
pub(super) fn split_location(location: u64) -> (u32, u32) {
    ((location >> 32) as u32, location as u32)
}

/// Row boundaries `[0, …, nrows]` cutting rows into runs of about `ENTRY_GRAIN` entries, from
/// the rows' entry offsets (`entry_start`, `nrows + 1` entries).
fn row_runs(entry_start: &[u64]) -> Vec<usize> {
    let nrows = entry_start.len() - 1;
    let mut bounds = std::vec![0usize];
    let mut next = ENTRY_GRAIN;
    for (i, &e) in entry_start
        .iter()
        .enumerate()
        .skip(1)
        .take(nrows.saturating_sub(1))
    {
        if e >= next {
            bounds.push(i);
            next = e + ENTRY_GRAIN;
        }
    }
    bounds.push(nrows);
    bounds
}

/// Transposes one CSR block (`rowptr` from 0, `cols < ncols`) into CSC: `colptr` (`ncols + 1`
/// zeros on entry), `rows_out`, `vals_out`. A counting sort, so rows come out increasing in
/// each column; large blocks are split into column ranges of equal non-zeros, one task each
/// (every task reads the whole block and writes only its own, contiguous, output range).
fn transpose_into(
    rowptr: &[u64],
    cols: &[u32],
    vals: &[f32],
    colptr: &mut [u64],
    rows_out: &mut [u32],
    vals_out: &mut [f32],
) {
    let ncols = colptr.len() - 1;
    for &c in cols {
        colptr[c as usize + 1] += 1;
    }
    for c in 0..ncols {
        colptr[c + 1] += colptr[c];
    }
    let colptr: &[u64] = colptr;
    let nnz = cols.len();
    let tasks = if nnz < TRANSPOSE_PAR_MIN {
        1
    } else {
        transpose_tasks()
    };
    let mut bounds = std::vec![0usize];
    for t in 1..tasks {
        let target = (nnz * t / tasks) as u64;
        let c = colptr[..ncols].partition_point(|&x| x < target);
        bounds.push(c.max(*bounds.last().unwrap_or(&0)));
    }
    bounds.push(ncols);
    let lengths: Vec<usize> = bounds
        .windows(2)
        .map(|w| index::offset(colptr[w[1]] - colptr[w[0]]))
        .collect();
    let row_pieces = split_lengths(rows_out, lengths.iter().copied());
    let val_pieces = split_lengths(vals_out, lengths.iter().copied());
    row_pieces
        .into_par_iter()
        .zip(val_pieces)
        .zip(bounds.par_windows(2))
        .for_each(|((rows_t, vals_t), range)| {
            let (c0, c1) = (range[0], range[1]);
            let base = colptr[c0];
            let mut next: Vec<u64> = colptr[c0..c1].iter().map(|&x| x - base).collect();
            for i in 0..rowptr.len() - 1 {
                for k in index::offset(rowptr[i])..index::offset(rowptr[i + 1]) {
                    let c = cols[k] as usize;
                    if (c0..c1).contains(&c) {
                        let at = index::offset(next[c - c0]);
                        next[c - c0] += 1;
                        rows_t[at] = index::id(i);
                        vals_t[at] = vals[k];
                    }
                }
            }
        });
}

/// What every part's chunk shares, whatever holds Â: the graph's node data, the partition,
/// its renumbering, every node's location and the sizes the chunks record.
#[derive(Debug)]
pub(super) struct Layout<'a> {
    graph: &'a Graph,
    partition: &'a Partition,
    renumbering: Renumbering,
    location: Vec<u64>,
    fingerprint: [u8; 16],
    feature_dim: u32,
    num_classes: u32,
    /// Where the node data of a part's nodes are in `graph`: `None` at their original ids (the
    /// whole graph); `Some(base)` at their new ids − `base` (a graph holding the node data of
    /// the parts one rank builds, in new-id order).
    node_base: Option<u64>,
}

impl<'a> Layout<'a> {
    /// Checks that the graph and the partition agree and renumbers.
    pub(super) fn new(graph: &'a Graph, partition: &'a Partition) -> Result<Self, ChunkBuildError> {
        graph.validate()?;
        let n = graph.num_nodes;
        if partition.num_nodes() != n {
            return Err(ChunkBuildError::Mismatch(std::format!(
                "the partition covers {} nodes but the graph has {n}",
                partition.num_nodes()
            )));
        }
        let feature_dim = u32::try_from(graph.feature_dim()).map_err(|_| {
            ChunkBuildError::Mismatch(std::format!(
                "feature dimension {} exceeds the chunk format's u32",
                graph.feature_dim()
            ))
        })?;
        let num_classes = u32::try_from(graph.num_classes()).map_err(|_| {
            ChunkBuildError::Mismatch(std::format!(
                "{} classes exceed the chunk format's u32",
                graph.num_classes()
            ))
        })?;
        let renumbering = partition.renumbering();
        let location = locations(partition, &renumbering);
        Ok(Self::from_parts(
            graph,
            partition,
            renumbering,
            location,
            feature_dim,
            num_classes,
        ))
    }

    fn from_parts(
        graph: &'a Graph,
        partition: &'a Partition,
        renumbering: Renumbering,
        location: Vec<u64>,
        feature_dim: u32,
        num_classes: u32,
    ) -> Self {
        Self {
            graph,
            partition,
            renumbering,
            location,
            fingerprint: partition.fingerprint(),
            feature_dim,
            num_classes,
            node_base: None,
        }
    }

    /// A layout whose `graph` holds the node data of the new ids `base..base + graph.num_nodes`
    /// only (see [`Layout::node_base`]), with the sizes every chunk records given (they are
    /// the whole graph's). `renumbering` and `location` must be `partition`'s.
    pub(super) fn for_new_ids(
        graph: &'a Graph,
        partition: &'a Partition,
        renumbering: Renumbering,
        location: Vec<u64>,
        base: u64,
        feature_dim: u32,
        num_classes: u32,
    ) -> Result<Self, ChunkBuildError> {
        graph.validate()?;
        if graph.feature_dim() != feature_dim as usize {
            return Err(ChunkBuildError::Mismatch(std::format!(
                "the node data hold {} feature columns but the graph has {feature_dim}",
                graph.feature_dim()
            )));
        }
        Ok(Self {
            node_base: Some(base),
            ..Self::from_parts(
                graph,
                partition,
                renumbering,
                location,
                feature_dim,
                num_classes,
            )
        })
    }

    pub(super) fn graph(&self) -> &'a Graph {
        self.graph
    }

    pub(super) fn partition(&self) -> &'a Partition {
        self.partition
    }

    pub(super) fn renumbering(&self) -> &Renumbering {
        &self.renumbering
    }

    /// Every original node's `part << 32 | local id`.
    pub(super) fn location(&self) -> &[u64] {
        &self.location
    }

    pub(super) fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint
    }

    pub(super) fn feature_dim(&self) -> u32 {
        self.feature_dim
    }

    pub(super) fn num_classes(&self) -> u32 {
        self.num_classes
    }

    /// Checks that every part's rows and halo fit the chunk's u32 local ids.
    pub(super) fn check_fits(&self, halo: &HaloLists) -> Result<(), ChunkBuildError> {
        for p in 0..self.partition.parts() {
            let rows = self.renumbering.part_nodes(p).len() as u64;
            check_part_fits(p, rows, halo.halo_rows(p as usize), u64::from(u32::MAX))?;
        }
        Ok(())
    }

    /// Builds part `p`'s chunk from its rows of Â and the halo lists. `scratch` is an
    /// `N`-entry work array (any contents), reused across calls to avoid an allocation per
    /// part. Time O(nnz_p + B·n_p + H + send rows).
    pub(super) fn build_part(
        &self,
        halo: &HaloLists,
        p: u32,
        rows: &impl PartRows,
        scratch: &mut Vec<u32>,
    ) -> PartChunk {
        let parts = self.partition.parts() as usize;
        let n = self.partition.num_nodes();
        debug_assert_eq!(rows.nrows(), self.renumbering.part_nodes(p).len());
        let offsets = self.renumbering.offsets();
        let p_us = p as usize;
        let part_nodes = self.renumbering.part_nodes(p);
        let n_p = part_nodes.len();

        // Blocks: the diagonal always, every q with a non-empty receive list.
        let mut block_of = std::vec![u32::MAX; parts];
        let mut block_src = Vec::new();
        let mut col_offsets = std::vec![0u64];
        for (q, slot) in block_of.iter_mut().enumerate() {
            let ncols = if q == p_us {
                n_p
            } else {
                halo.recv(p_us, q).len()
            };
            if q == p_us || ncols > 0 {
                *slot = index::id(block_src.len());
                block_src.push(index::id(q));
                col_offsets.push(col_offsets.last().copied().unwrap_or(0) + ncols as u64);
            }
        }
        let nblocks = block_src.len();

        // Compacted column of every referenced new id: halo position for q ≠ p.
        scratch.resize(n, 0);
        for q in (0..parts).filter(|&q| q != p_us) {
            let base = index::offset(offsets[q]);
            for (k, &local) in halo.recv(p_us, q).iter().enumerate() {
                scratch[base + local as usize] = index::id(k);
            }
        }
        let scratch: &[u32] = scratch;
        let diagonal = block_of[p_us] as usize;
        // p's entries of Â, concatenated in local row order, cut into runs of rows for tasks.
        let mut entry_start = Vec::with_capacity(n_p + 1);
        entry_start.push(0u64);
        for i in 0..n_p {
            entry_start.push(entry_start[i] + rows.row(i).0.len() as u64);
        }
        let nnz = index::offset(entry_start[n_p]);
        let runs = row_runs(&entry_start);
        let run_rows = |w: &[usize]| w[0]..w[1];

        // Pass 1: every entry's (block, compacted column), and entries per (row, block).
        let mut located = std::vec![0u64; nnz];
        let mut counts = std::vec![0u32; n_p * nblocks];
        let located_runs = split_lengths(
            &mut located,
            runs.windows(2)
                .map(|w| index::offset(entry_start[w[1]] - entry_start[w[0]])),
        );
        let count_runs = split_lengths(
            &mut counts,
            runs.windows(2).map(|w| (w[1] - w[0]) * nblocks),
        );
        located_runs
            .into_par_iter()
            .zip(count_runs)
            .zip(runs.par_windows(2))
            .for_each(|((located, counts), w)| {
                let mut k = 0;
                for (i, r) in run_rows(w).enumerate() {
                    for &col in rows.row(r).0 {
                        let (q, local) = split_location(self.location[col as usize]);
                        let q = q as usize;
                        let (b, c) = if q == p_us {
                            (diagonal, local)
                        } else {
                            let new = index::offset(offsets[q]) + local as usize;
                            (block_of[q] as usize, scratch[new])
                        };
                        located[k] = ((b as u64) << 32) | u64::from(c);
                        k += 1;
                        counts[i * nblocks + b] += 1;
                    }
                }
            });

        // Row pointers per block (block-major, as the format stores them).
        let stride = n_p + 1;
        let mut csr_rowptr = std::vec![0u64; nblocks * stride];
        let mut nnz_offsets = std::vec![0u64; nblocks + 1];
        for b in 0..nblocks {
            let rp = &mut csr_rowptr[b * stride..(b + 1) * stride];
            for i in 0..n_p {
                rp[i + 1] = rp[i] + u64::from(counts[i * nblocks + b]);
            }
            nnz_offsets[b + 1] = nnz_offsets[b] + rp[n_p];
        }
        drop(counts);

        // Pass 2: scatter into the blocks (and the weights of A, in the same order). A run of
        // rows owns one contiguous piece of every block, so runs proceed in parallel with a
        // cursor per block.
        let mut csr_cols = std::vec![0u32; nnz];
        let mut csr_vals = std::vec![0f32; nnz];
        let mut edge_weights = rows.has_weights().then(|| std::vec![0f32; nnz]);
        let piece_lengths: Vec<usize> = (0..nblocks)
            .flat_map(|b| {
                let rp = &csr_rowptr[b * stride..(b + 1) * stride];
                runs.windows(2)
                    .map(move |w| index::offset(rp[w[1]] - rp[w[0]]))
            })
            .collect();
        let nruns = runs.len() - 1;
        let mut col_pieces: Vec<Vec<&mut [u32]>> = (0..nruns).map(|_| Vec::new()).collect();
        let mut val_pieces: Vec<Vec<&mut [f32]>> = (0..nruns).map(|_| Vec::new()).collect();
        let mut weight_pieces: Vec<Vec<&mut [f32]>> = (0..nruns).map(|_| Vec::new()).collect();
        let cols_split = split_lengths(&mut csr_cols, piece_lengths.iter().copied());
        let vals_split = split_lengths(&mut csr_vals, piece_lengths.iter().copied());
        for (k, (cp, vp)) in cols_split.into_iter().zip(vals_split).enumerate() {
            col_pieces[k % nruns].push(cp);
            val_pieces[k % nruns].push(vp);
        }
        if let Some(weights) = edge_weights.as_mut() {
            let split = split_lengths(weights, piece_lengths.iter().copied());
            for (k, wp) in split.into_iter().enumerate() {
                weight_pieces[k % nruns].push(wp);
            }
        }
        col_pieces
            .into_par_iter()
            .zip(val_pieces)
            .zip(weight_pieces)
            .zip(runs.par_windows(2))
            .for_each(|(((mut cols, mut vals), mut weights), w)| {
                let mut cursor = std::vec![0usize; nblocks];
                let mut k = index::offset(entry_start[w[0]]);
                for r in run_rows(w) {
                    let row_weights = rows.row_weights(r);
                    for (t, &v) in rows.row(r).1.iter().enumerate() {
                        let (b, c) = split_location(located[k]);
                        k += 1;
                        let b = b as usize;
                        cols[b][cursor[b]] = c;
                        vals[b][cursor[b]] = v;
                        if let Some(rw) = row_weights {
                            weights[b][cursor[b]] = rw[t];
                        }
                        cursor[b] += 1;
                    }
                }
            });
        drop(located);

        // CSC per block over its compacted columns.
        let total_cols = index::offset(col_offsets[nblocks]);
        let mut csc_colptr = std::vec![0u64; total_cols + nblocks];
        let mut csc_rows = std::vec![0u32; nnz];
        let mut csc_vals = std::vec![0f32; nnz];
        let colptr_pieces = split_lengths(
            &mut csc_colptr,
            col_offsets
                .windows(2)
                .map(|w| index::offset(w[1] - w[0]) + 1),
        );
        let block_nnz = nnz_offsets.windows(2).map(|w| index::offset(w[1] - w[0]));
        let row_pieces = split_lengths(&mut csc_rows, block_nnz.clone());
        let cval_pieces = split_lengths(&mut csc_vals, block_nnz);
        for (b, ((colptr, rows), cvals)) in colptr_pieces
            .into_iter()
            .zip(row_pieces)
            .zip(cval_pieces)
            .enumerate()
        {
            let (z0, z1) = (
                index::offset(nnz_offsets[b]),
                index::offset(nnz_offsets[b + 1]),
            );
            transpose_into(
                &csr_rowptr[b * stride..(b + 1) * stride],
                &csr_cols[z0..z1],
                &csr_vals[z0..z1],
                colptr,
                rows,
                cvals,
            );
        }

        // Halo lists: receive from q as computed; send to r what r receives from p.
        let recv_offsets = halo.recv_offsets[p_us].clone();
        let recv = halo.recv[p_us].clone();
        let mut send_offsets = Vec::with_capacity(parts + 1);
        send_offsets.push(0u64);
        let mut send = Vec::new();
        for r in 0..parts {
            if r != p_us {
                send.extend_from_slice(halo.recv(r, p_us));
            }
            send_offsets.push(send.len() as u64);
        }

        // Node data, gathered in local (renumbered) order.
        let original_ids: Vec<u64> = part_nodes.iter().map(|&v| u64::from(v)).collect();
        let local_rows: Vec<u32>;
        let data_rows: &[u32] = match self.node_base {
            None => part_nodes,
            Some(base) => {
                let first = offsets[p_us] - base;
                local_rows = (0..n_p)
                    .map(|i| index::id(index::offset(first) + i))
                    .collect();
                &local_rows
            }
        };
        let features = self.graph.features.as_ref().filter(|f| f.dim > 0).map(|f| {
            let mut out = Vec::with_capacity(n_p * f.dim);
            for &v in data_rows {
                out.extend_from_slice(f.row(v as usize));
            }
            out
        });
        let labels = self
            .graph
            .labels
            .as_ref()
            .filter(|_| self.num_classes > 0)
            .map(|y| data_rows.iter().map(|&v| y[v as usize]).collect());
        let targets = self
            .graph
            .targets
            .as_ref()
            .filter(|_| self.num_classes > 0)
            .map(|t| {
                let mut out = Vec::with_capacity(n_p * t.classes);
                for &v in data_rows {
                    out.extend_from_slice(t.row(v as usize));
                }
                out
            });
        let g = self.graph;
        let masks =
            (g.train_mask.is_some() || g.val_mask.is_some() || g.test_mask.is_some()).then(|| {
                let bit = |m: &Option<Vec<bool>>, v: u32, b: u8| {
                    m.as_ref().map_or(0, |m| if m[v as usize] { b } else { 0 })
                };
                data_rows
                    .iter()
                    .map(|&v| {
                        bit(&g.train_mask, v, MASK_TRAIN)
                            | bit(&g.val_mask, v, MASK_VAL)
                            | bit(&g.test_mask, v, MASK_TEST)
                    })
                    .collect()
            });

        PartChunk {
            part_id: p,
            fingerprint: self.fingerprint,
            part_offsets: offsets.to_vec(),
            block_src,
            col_offsets,
            nnz_offsets,
            csr_rowptr,
            csr_cols,
            csr_vals,
            csc_colptr,
            csc_rows,
            csc_vals,
            edge_weights,
            recv_offsets,
            recv,
            send_offsets,
            send,
            feature_dim: self.feature_dim,
            features,
            num_classes: self.num_classes,
            labels,
            targets,
            masks,
            original_ids,
        }
    }
}

/// Everything needed to build any part's chunk from the whole Â in memory: the graph's node
/// data, Â, the partition, its renumbering and halo lists. (`chunk::BoundedBuilder` builds the
/// same chunks holding one part's rows at a time.)
#[derive(Debug)]
pub struct ChunkBuilder<'a> {
    layout: Layout<'a>,
    a_hat: CsrView<'a, f32>,
    /// `A`'s weight at each of Â's entries, if the chunks record them.
    edge_weights: Option<&'a [f32]>,
    halo: HaloLists,
}

impl<'a> ChunkBuilder<'a> {
    /// Checks that the graph, Â (`N × N`, rows = aggregating nodes, original ids) and the
    /// partition agree, renumbers and computes the halo lists.
    pub fn new(
        graph: &'a Graph,
        a_hat: CsrView<'a, f32>,
        partition: &'a Partition,
    ) -> Result<Self, ChunkBuildError> {
        let n = graph.num_nodes;
        if a_hat.nrows() != n || a_hat.ncols() != n {
            graph.validate()?;
            return Err(ChunkBuildError::Mismatch(std::format!(
                "Â is {}×{} but the graph has {n} nodes",
                a_hat.nrows(),
                a_hat.ncols()
            )));
        }
        let started = std::time::Instant::now();
        let layout = Layout::new(graph, partition)?;
        let halo =
            HaloLists::compute_with_locations(&a_hat, layout.renumbering(), layout.location());
        layout.check_fits(&halo)?;
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            "renumbered and found the halo lists"
        );
        Ok(Self {
            layout,
            a_hat,
            edge_weights: None,
            halo,
        })
    }

    /// Records `edge_weights` — the weight in the graph's `A` of each of Â's stored entries,
    /// in Â's CSR order, as [`normalize::adjacency_with_weights`](crate::normalize::adjacency_with_weights)
    /// gives them — in every chunk (the `EDGE_WEIGHTS` section, chunk format 1.1). Without
    /// it the chunks carry Â only (format 1.0).
    ///
    /// # Errors
    /// [`ChunkBuildError::Mismatch`] when there is not one weight per entry of Â.
    pub fn with_edge_weights(mut self, edge_weights: &'a [f32]) -> Result<Self, ChunkBuildError> {
        if edge_weights.len() != self.a_hat.nnz() {
            return Err(ChunkBuildError::Mismatch(std::format!(
                "{} edge weights for the {} non-zeros of Â",
                edge_weights.len(),
                self.a_hat.nnz()
            )));
        }
        self.edge_weights = Some(edge_weights);
        Ok(self)
    }

    /// The graph whose node data the chunks carry.
    pub fn graph(&self) -> &Graph {
        self.layout.graph
    }

    /// The partition.
    pub fn partition(&self) -> &Partition {
        self.layout.partition
    }

    /// The renumbering (part p owns new ids `offsets[p]..offsets[p+1]`).
    pub fn renumbering(&self) -> &Renumbering {
        &self.layout.renumbering
    }

    /// The halo lists.
    pub fn halo(&self) -> &HaloLists {
        &self.halo
    }

    /// The partition fingerprint every chunk carries.
    pub fn fingerprint(&self) -> [u8; 16] {
        self.layout.fingerprint
    }

    /// Feature columns (0 without features).
    pub fn feature_dim(&self) -> u32 {
        self.layout.feature_dim
    }

    /// Classes (0 without labels).
    pub fn num_classes(&self) -> u32 {
        self.layout.num_classes
    }

    /// Non-zeros of Â.
    pub fn nnz(&self) -> u64 {
        self.a_hat.nnz() as u64
    }

    /// Builds part `p`'s chunk. `scratch` is an `N`-entry work array (any contents), reused
    /// across calls to avoid an allocation per part. Time O(nnz_p + B·n_p + H + send rows).
    pub fn build_with_scratch(&self, p: u32, scratch: &mut Vec<u32>) -> PartChunk {
        let rows = RowsOfWhole {
            a_hat: &self.a_hat,
            weights: self.edge_weights,
            nodes: self.layout.renumbering.part_nodes(p),
        };
        self.layout.build_part(&self.halo, p, &rows, scratch)
    }

    /// Builds part `p`'s chunk (allocating its own scratch array).
    pub fn build(&self, p: u32) -> PartChunk {
        self.build_with_scratch(p, &mut Vec::new())
    }
}

/// One part's chunk in memory, in owned arrays; [`PartChunk::contents`] borrows them in the
/// form the chunk writer takes.
#[derive(Debug, Clone, PartialEq)]
pub struct PartChunk {
    part_id: u32,
    fingerprint: [u8; 16],
    part_offsets: Vec<u64>,
    block_src: Vec<u32>,
    col_offsets: Vec<u64>,
    nnz_offsets: Vec<u64>,
    csr_rowptr: Vec<u64>,
    csr_cols: Vec<u32>,
    csr_vals: Vec<f32>,
    csc_colptr: Vec<u64>,
    csc_rows: Vec<u32>,
    csc_vals: Vec<f32>,
    edge_weights: Option<Vec<f32>>,
    recv_offsets: Vec<u64>,
    recv: Vec<u32>,
    send_offsets: Vec<u64>,
    send: Vec<u32>,
    feature_dim: u32,
    features: Option<Vec<f32>>,
    num_classes: u32,
    labels: Option<Vec<i32>>,
    targets: Option<Vec<u8>>,
    masks: Option<Vec<u8>>,
    original_ids: Vec<u64>,
}

impl PartChunk {
    /// The part this chunk belongs to.
    pub fn part_id(&self) -> u32 {
        self.part_id
    }

    /// Local rows n_p.
    pub fn num_local_nodes(&self) -> usize {
        self.original_ids.len()
    }

    /// Non-zeros over all blocks.
    pub fn nnz(&self) -> usize {
        self.csr_cols.len()
    }

    /// Rows received from all peers (H).
    pub fn halo_rows(&self) -> usize {
        self.recv.len()
    }

    /// The chunk in the writer's input form, borrowing this chunk's arrays.
    pub fn contents(&self) -> ChunkContents<'_> {
        let n_p = self.num_local_nodes();
        let stride = n_p + 1;
        let blocks = self
            .block_src
            .iter()
            .enumerate()
            .map(|(b, &src_part)| {
                let (c0, c1) = (
                    index::offset(self.col_offsets[b]),
                    index::offset(self.col_offsets[b + 1]),
                );
                let (z0, z1) = (
                    index::offset(self.nnz_offsets[b]),
                    index::offset(self.nnz_offsets[b + 1]),
                );
                BlockView {
                    src_part,
                    nrows: n_p,
                    ncols: c1 - c0,
                    csr_rowptr: &self.csr_rowptr[b * stride..(b + 1) * stride],
                    csr_cols: &self.csr_cols[z0..z1],
                    csr_vals: &self.csr_vals[z0..z1],
                    csc_colptr: &self.csc_colptr[c0 + b..c1 + b + 1],
                    csc_rows: &self.csc_rows[z0..z1],
                    csc_vals: &self.csc_vals[z0..z1],
                    edge_weights: self.edge_weights.as_ref().map(|w| &w[z0..z1]),
                }
            })
            .collect();
        ChunkContents {
            part_id: self.part_id,
            fingerprint: self.fingerprint,
            part_offsets: &self.part_offsets,
            blocks,
            halo_recv_offsets: &self.recv_offsets,
            halo_recv: &self.recv,
            halo_send_offsets: &self.send_offsets,
            halo_send: &self.send,
            feature_dim: self.feature_dim,
            features: self.features.as_deref(),
            num_classes: self.num_classes,
            labels: self.labels.as_deref(),
            targets: self.targets.as_deref(),
            masks: self.masks.as_deref(),
            original_ids: &self.original_ids,
        }
    }
}
