//! Building one chunk's contents per part: Â's rows split by source part into blocks over
//! compacted columns (CSR and CSC), the halo lists, and the node data following the renumbering.
//!
//! Two linear passes over Â. [`HaloLists::compute`] finds, for every part p and every other
//! part q, the sorted q-local ids of the columns p's rows reference (a bitmap over the new ids,
//! scanned part range by part range). [`ChunkBuilder::build`] then lays out one part's blocks
//! with a counting sort by block and by column. Â's rows are sorted by original column id and
//! the renumbering keeps original order within a part, so a row's entries in any one block are
//! already in compacted-column order: nothing is sorted.

use std::vec::Vec;

use chunk_format::{BlockView, ChunkContents};
use rayon::prelude::*;

use crate::graph::Graph;
use crate::partition::{Partition, Renumbering};
use crate::sparse::CsrView;

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
    /// Time O(nnz + P·N/64), one N-bit scratch bitmap per worker thread.
    pub fn compute(
        a_hat: &CsrView<'_, f32>,
        partition: &Partition,
        renumbering: &Renumbering,
    ) -> Self {
        let parts = partition.parts() as usize;
        let n = partition.num_nodes();
        let part_of = partition.part_of();
        let old_to_new = renumbering.old_to_new();
        let offsets = renumbering.offsets();
        let lists: Vec<(Vec<u64>, Vec<u32>)> = (0..parts as u32)
            .into_par_iter()
            .map_init(
                || std::vec![0u64; n.div_ceil(64)],
                |bitmap, p| {
                    for &old in renumbering.part_nodes(p) {
                        for &col in a_hat.row(old as usize).0 {
                            if part_of[col as usize] != p {
                                let new = old_to_new[col as usize] as usize;
                                bitmap[new / 64] |= 1u64 << (new % 64);
                            }
                        }
                    }
                    let mut recv_offsets = Vec::with_capacity(parts + 1);
                    recv_offsets.push(0u64);
                    let mut recv = Vec::new();
                    for q in 0..parts {
                        let (start, end) = (offsets[q] as usize, offsets[q + 1] as usize);
                        if q != p as usize && start < end {
                            let first = start / 64;
                            let words = &mut bitmap[first..=(end - 1) / 64];
                            for (k, slot) in words.iter_mut().enumerate() {
                                let base = (first + k) * 64;
                                // Only this part's range: a boundary word is shared.
                                let mut bits = *slot & range_mask(base, start, end);
                                *slot &= !bits;
                                while bits != 0 {
                                    let id = base + bits.trailing_zeros() as usize;
                                    bits &= bits - 1;
                                    recv.push((id - start) as u32);
                                }
                            }
                        }
                        recv_offsets.push(recv.len() as u64);
                    }
                    (recv_offsets, recv)
                },
            )
            .collect();
        let (recv_offsets, recv) = lists.into_iter().unzip();
        Self {
            parts,
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
        &self.recv[p][o[q] as usize..o[q + 1] as usize]
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

/// The bits of the 64-bit word covering ids `base..base+64` that fall in `start..end`
/// (`base < end`).
pub(super) fn range_mask(base: usize, start: usize, end: usize) -> u64 {
    let below = |k: usize| if k >= 64 { u64::MAX } else { (1u64 << k) - 1 };
    below(end - base) & !below(start.saturating_sub(base))
}

/// Everything needed to build any part's chunk: the graph's node data, Â, the partition, its
/// renumbering and halo lists.
#[derive(Debug)]
pub struct ChunkBuilder<'a> {
    graph: &'a Graph,
    a_hat: CsrView<'a, f32>,
    partition: &'a Partition,
    renumbering: Renumbering,
    halo: HaloLists,
    fingerprint: [u8; 16],
    feature_dim: u32,
    num_classes: u32,
}

impl<'a> ChunkBuilder<'a> {
    /// Checks that the graph, Â (`N × N`, rows = aggregating nodes, original ids) and the
    /// partition agree, renumbers and computes the halo lists.
    pub fn new(
        graph: &'a Graph,
        a_hat: CsrView<'a, f32>,
        partition: &'a Partition,
    ) -> Result<Self, ChunkBuildError> {
        graph.validate()?;
        let n = graph.num_nodes;
        if a_hat.nrows() != n || a_hat.ncols() != n {
            return Err(ChunkBuildError::Mismatch(std::format!(
                "Â is {}×{} but the graph has {n} nodes",
                a_hat.nrows(),
                a_hat.ncols()
            )));
        }
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
        let halo = HaloLists::compute(&a_hat, partition, &renumbering);
        Ok(Self {
            graph,
            a_hat,
            partition,
            renumbering,
            halo,
            fingerprint: partition.fingerprint(),
            feature_dim,
            num_classes,
        })
    }

    /// The graph whose node data the chunks carry.
    pub fn graph(&self) -> &Graph {
        self.graph
    }

    /// The partition.
    pub fn partition(&self) -> &Partition {
        self.partition
    }

    /// The renumbering (part p owns new ids `offsets[p]..offsets[p+1]`).
    pub fn renumbering(&self) -> &Renumbering {
        &self.renumbering
    }

    /// The halo lists.
    pub fn halo(&self) -> &HaloLists {
        &self.halo
    }

    /// The partition fingerprint every chunk carries.
    pub fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint
    }

    /// Feature columns (0 without features).
    pub fn feature_dim(&self) -> u32 {
        self.feature_dim
    }

    /// Classes (0 without labels).
    pub fn num_classes(&self) -> u32 {
        self.num_classes
    }

    /// Non-zeros of Â.
    pub fn nnz(&self) -> u64 {
        self.a_hat.nnz() as u64
    }

    /// Builds part `p`'s chunk. `scratch` is an `N`-entry work array (any contents), reused
    /// across calls to avoid an allocation per part. Time O(nnz_p + B·n_p + H + send rows).
    pub fn build_with_scratch(&self, p: u32, scratch: &mut Vec<u32>) -> PartChunk {
        let parts = self.partition.parts() as usize;
        let n = self.partition.num_nodes();
        let offsets = self.renumbering.offsets();
        let p_us = p as usize;
        let part_nodes = self.renumbering.part_nodes(p);
        let n_p = part_nodes.len();
        let part_of = self.partition.part_of();
        let old_to_new = self.renumbering.old_to_new();

        // Blocks: the diagonal always, every q with a non-empty receive list.
        let mut block_of = std::vec![u32::MAX; parts];
        let mut block_src = Vec::new();
        let mut col_offsets = std::vec![0u64];
        for (q, slot) in block_of.iter_mut().enumerate() {
            let ncols = if q == p_us {
                n_p
            } else {
                self.halo.recv(p_us, q).len()
            };
            if q == p_us || ncols > 0 {
                *slot = block_src.len() as u32;
                block_src.push(q as u32);
                col_offsets.push(col_offsets.last().copied().unwrap_or(0) + ncols as u64);
            }
        }
        let nblocks = block_src.len();

        // Compacted column of every referenced new id: halo position for q ≠ p.
        scratch.resize(n, 0);
        for q in (0..parts).filter(|&q| q != p_us) {
            let base = offsets[q] as usize;
            for (k, &local) in self.halo.recv(p_us, q).iter().enumerate() {
                scratch[base + local as usize] = k as u32;
            }
        }
        let compact = |col: u32| -> (usize, u32) {
            let q = part_of[col as usize] as usize;
            let new = old_to_new[col as usize] as usize;
            let c = if q == p_us {
                (new - offsets[q] as usize) as u32
            } else {
                scratch[new]
            };
            (block_of[q] as usize, c)
        };

        // CSR: count per (block, row), prefix sums, then fill rows in order.
        let stride = n_p + 1;
        let mut csr_rowptr = std::vec![0u64; nblocks * stride];
        for (i, &old) in part_nodes.iter().enumerate() {
            for &col in self.a_hat.row(old as usize).0 {
                let b = block_of[part_of[col as usize] as usize] as usize;
                csr_rowptr[b * stride + i + 1] += 1;
            }
        }
        let mut nnz_offsets = std::vec![0u64; nblocks + 1];
        for b in 0..nblocks {
            let rp = &mut csr_rowptr[b * stride..(b + 1) * stride];
            for i in 0..n_p {
                rp[i + 1] += rp[i];
            }
            nnz_offsets[b + 1] = nnz_offsets[b] + rp[n_p];
        }
        let nnz = nnz_offsets[nblocks] as usize;
        let mut csr_cols = std::vec![0u32; nnz];
        let mut csr_vals = std::vec![0f32; nnz];
        let mut fill: Vec<usize> = nnz_offsets[..nblocks].iter().map(|&o| o as usize).collect();
        for &old in part_nodes {
            let (cols, vals) = self.a_hat.row(old as usize);
            for (&col, &val) in cols.iter().zip(vals) {
                let (b, c) = compact(col);
                csr_cols[fill[b]] = c;
                csr_vals[fill[b]] = val;
                fill[b] += 1;
            }
        }

        // CSC per block: counting sort by compacted column; rows come out increasing.
        let total_cols = col_offsets[nblocks] as usize;
        let mut csc_colptr = std::vec![0u64; total_cols + nblocks];
        let mut csc_rows = std::vec![0u32; nnz];
        let mut csc_vals = std::vec![0f32; nnz];
        for b in 0..nblocks {
            let (c0, c1) = (col_offsets[b] as usize, col_offsets[b + 1] as usize);
            let colptr = &mut csc_colptr[c0 + b..c1 + b + 1];
            let (z0, z1) = (nnz_offsets[b] as usize, nnz_offsets[b + 1] as usize);
            for &c in &csr_cols[z0..z1] {
                colptr[c as usize + 1] += 1;
            }
            for c in 0..c1 - c0 {
                colptr[c + 1] += colptr[c];
            }
            let mut next: Vec<u64> = colptr[..c1 - c0].to_vec();
            let rp = &csr_rowptr[b * stride..(b + 1) * stride];
            for i in 0..n_p {
                for k in rp[i] as usize..rp[i + 1] as usize {
                    let c = csr_cols[z0 + k] as usize;
                    let at = z0 + next[c] as usize;
                    next[c] += 1;
                    csc_rows[at] = i as u32;
                    csc_vals[at] = csr_vals[z0 + k];
                }
            }
        }

        // Halo lists: receive from q as computed; send to r what r receives from p.
        let recv_offsets = self.halo.recv_offsets[p_us].clone();
        let recv = self.halo.recv[p_us].clone();
        let mut send_offsets = Vec::with_capacity(parts + 1);
        send_offsets.push(0u64);
        let mut send = Vec::new();
        for r in 0..parts {
            if r != p_us {
                send.extend_from_slice(self.halo.recv(r, p_us));
            }
            send_offsets.push(send.len() as u64);
        }

        // Node data, gathered in local (renumbered) order.
        let original_ids: Vec<u64> = part_nodes.iter().map(|&v| u64::from(v)).collect();
        let features = self.graph.features.as_ref().filter(|f| f.dim > 0).map(|f| {
            let mut out = Vec::with_capacity(n_p * f.dim);
            for &v in part_nodes {
                out.extend_from_slice(f.row(v as usize));
            }
            out
        });
        let labels = self
            .graph
            .labels
            .as_ref()
            .filter(|_| self.num_classes > 0)
            .map(|y| part_nodes.iter().map(|&v| y[v as usize]).collect());
        let g = self.graph;
        let masks =
            (g.train_mask.is_some() || g.val_mask.is_some() || g.test_mask.is_some()).then(|| {
                let bit = |m: &Option<Vec<bool>>, v: u32, b: u8| {
                    m.as_ref().map_or(0, |m| if m[v as usize] { b } else { 0 })
                };
                part_nodes
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
            recv_offsets,
            recv,
            send_offsets,
            send,
            feature_dim: self.feature_dim,
            features,
            num_classes: self.num_classes,
            labels,
            masks,
            original_ids,
        }
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
    recv_offsets: Vec<u64>,
    recv: Vec<u32>,
    send_offsets: Vec<u64>,
    send: Vec<u32>,
    feature_dim: u32,
    features: Option<Vec<f32>>,
    num_classes: u32,
    labels: Option<Vec<i32>>,
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
                    self.col_offsets[b] as usize,
                    self.col_offsets[b + 1] as usize,
                );
                let (z0, z1) = (
                    self.nnz_offsets[b] as usize,
                    self.nnz_offsets[b + 1] as usize,
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
            masks: self.masks.as_deref(),
            original_ids: &self.original_ids,
        }
    }
}
