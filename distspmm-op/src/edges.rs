//! The per-edge operand of a rank: one f32 per stored non-zero of its rows, the layout of the
//! values a caller gives to `spmm_values` / `spmm_values_transpose` / `sddmm_backward` and gets
//! from `sddmm` ([`EdgeLayout`]), the graph's own edge weights in that layout
//! ([`EdgeLayout::fill_weights`]), and the CSR→CSC permutation the transposed products read
//! those values through ([`CscOrder`]).

use std::ops::Range;

use chunk_format::{BlockView, ChunkView};
use rayon::prelude::*;

use crate::backend::Matrix;
use crate::blocks;
use crate::{check_operands, DistSpmmError};

/// One block's run of the per-edge operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeBlock {
    /// The source part q of the block `A[p][q]` (p itself for the diagonal block).
    pub source: usize,
    /// Position of the block's first non-zero in the operand.
    pub first: usize,
    /// The block's non-zeros.
    pub len: usize,
}

impl EdgeBlock {
    /// Positions `first..first + len`.
    pub fn range(&self) -> Range<usize> {
        self.first..self.first + self.len
    }
}

/// The layout of a rank's per-edge operand ("EdgeValues"): the stored non-zeros of its chunk's
/// blocks, each block in its CSR order (row by row, columns increasing within a row), the
/// blocks one after another — the diagonal block `A[p][p]` first, then the off-diagonal blocks
/// `A[p][q]` in increasing source part q. Both schedules use it, and it depends only on the
/// chunk, so every operator over the same chunk has the same layout.
///
/// The value of the edge from global (renumbered) node `s` into this rank's row `i` is at
/// `block.first + rowptr[i] + t`, where `block` is the block of `s`'s part q, `rowptr` that
/// block's CSR row pointer and `t` the position of `s`'s column among row `i`'s columns: its
/// q-local id `s − off[q]` for the diagonal block, its position in the halo receive list from
/// q otherwise. [`DistSpmm::edge_position`](crate::DistSpmm::edge_position) computes it, and
/// [`DistSpmm::edges`](crate::DistSpmm::edges) lists (row, source) in layout order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeLayout {
    blocks: Vec<EdgeBlock>,
    /// The chunk's index of each block of `blocks`.
    chunk_index: Vec<usize>,
    len: usize,
}

impl EdgeLayout {
    /// The layout of `chunk`'s non-zeros.
    pub(crate) fn new(chunk: &ChunkView<'_>) -> Self {
        let part = chunk.part_id();
        let diagonal = chunk
            .block_sources()
            .partition_point(|&q| (q as usize) < part);
        let order = std::iter::once((part, diagonal)).chain(blocks::remote_indices(chunk));
        let (mut blocks, mut chunk_index, mut first) = (Vec::new(), Vec::new(), 0);
        for (source, i) in order {
            let len = chunk.block(i).nnz();
            blocks.push(EdgeBlock { source, first, len });
            chunk_index.push(i);
            first += len;
        }
        Self {
            blocks,
            chunk_index,
            len: first,
        }
    }

    /// Values of the operand: this rank's stored non-zeros.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the rank stores no non-zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The blocks in layout order (the diagonal block first, then increasing source part).
    pub fn blocks(&self) -> &[EdgeBlock] {
        &self.blocks
    }

    /// The block of source part `q`, if this rank has one.
    pub fn block_of_source(&self, q: usize) -> Option<&EdgeBlock> {
        self.blocks.iter().find(|b| b.source == q)
    }

    /// The layout position of a block a program names.
    pub(crate) fn index_of(&self, a: Matrix) -> Option<usize> {
        match a {
            Matrix::Diagonal => (!self.blocks.is_empty()).then_some(0),
            Matrix::Remote(k) => (k + 1 < self.blocks.len()).then_some(k + 1),
            Matrix::QLocal(q) => self
                .blocks
                .iter()
                .skip(1)
                .position(|b| b.source == q)
                .map(|k| k + 1),
        }
    }

    /// The position of the edge from global node `source` into row `row` (see the type docs);
    /// `None` when `A` stores no such entry. `chunk` is the chunk the layout was made from.
    pub(crate) fn position(&self, chunk: &ChunkView<'_>, row: usize, source: u64) -> Option<usize> {
        if row >= chunk.num_local_nodes() {
            return None;
        }
        let offsets = chunk.part_offsets();
        // The part holding `source`: the last q with off[q] <= source < off[q + 1].
        let q = offsets.partition_point(|&o| o <= source).checked_sub(1)?;
        if q >= chunk.num_parts() {
            return None;
        }
        let local = u32::try_from(source - offsets[q]).ok()?;
        let k = self.blocks.iter().position(|b| b.source == q)?;
        let b = chunk.block(self.chunk_index[k]);
        let column = if q == chunk.part_id() {
            local
        } else {
            let at = chunk.halo_recv(q).binary_search(&local).ok()?;
            u32::try_from(at).ok()?
        };
        let (s, e) = row_span(&b, row);
        let t = b.csr_cols[s..e].binary_search(&column).ok()?;
        Some(self.blocks[k].first + s + t)
    }

    /// (row, global source) of every position, in layout order.
    pub(crate) fn edges<'c>(
        &'c self,
        chunk: ChunkView<'c>,
    ) -> impl Iterator<Item = (usize, u64)> + 'c {
        let offsets = chunk.part_offsets();
        let part = chunk.part_id();
        self.blocks
            .iter()
            .zip(&self.chunk_index)
            .flat_map(move |(eb, &i)| {
                let b = chunk.block(i);
                let q = eb.source;
                let recv = if q == part {
                    &[][..]
                } else {
                    chunk.halo_recv(q)
                };
                (0..b.nrows).flat_map(move |row| {
                    let (s, e) = row_span(&b, row);
                    b.csr_cols[s..e].iter().map(move |&c| {
                        let local = if q == part { c } else { recv[c as usize] };
                        (row, offsets[q] + u64::from(local))
                    })
                })
            })
    }

    /// The chunk's index of a layout block.
    pub(crate) fn chunk_index(&self, k: usize) -> usize {
        self.chunk_index[k]
    }

    /// Copies the weight in the graph's `A` of every edge (the chunk's `EDGE_WEIGHTS`, stored
    /// block by block in the chunk's order) into `out`, in layout order: each block's run is
    /// its CSR order, so a block's weights land whole at its run. `chunk` is the chunk the
    /// layout was made from.
    ///
    /// # Errors
    /// [`DistSpmmError::NoEdgeWeights`] when the chunk does not record them (format 1.0);
    /// [`DistSpmmError::Shape`] when `out` does not hold [`len`](Self::len) values.
    pub(crate) fn fill_weights(
        &self,
        chunk: &ChunkView<'_>,
        out: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let part = chunk.part_id();
        if chunk.edge_weights().is_none() {
            return Err(DistSpmmError::NoEdgeWeights { part });
        }
        let edges = [("the output", out.len(), self.len)];
        check_operands("edge_weights", part, chunk.num_local_nodes(), &[], &edges)?;
        for (eb, &i) in self.blocks.iter().zip(&self.chunk_index) {
            // Present in every block once in the chunk (validated), `len` of them each.
            if let Some(weights) = chunk.block(i).edge_weights {
                out[eb.range()].copy_from_slice(weights);
            }
        }
        Ok(())
    }
}

/// The CSR positions `s..e` of `row` in a block (relative to the block).
fn row_span(b: &BlockView<'_>, row: usize) -> (usize, usize) {
    // Entries of a validated row pointer: positions in the block's arrays.
    (
        distspmm_sparse::index::offset(b.csr_rowptr[row]),
        distspmm_sparse::index::offset(b.csr_rowptr[row + 1]),
    )
}

/// The CSR→CSC permutation of every block, derived once per operator: for each CSC entry of
/// each block (layout order), the position of that entry within its CSR row, one `u32` per
/// non-zero (a row holds at most `ncols ≤ 2³²−1` entries). A CSC entry `k` of row `i` then
/// reads the per-edge value at `block.first + rowptr[i] + rank[k]`.
#[derive(Debug, Default)]
pub(crate) struct CscOrder {
    rank: Vec<u32>,
}

#[cfg(test)]
mod tests;

/// Below this many values a permutation runs on the calling thread.
const SERIAL_VALUES: usize = 1 << 15;
/// Values per parallel task of a permutation.
const PARALLEL_VALUES: usize = 1 << 12;

impl CscOrder {
    /// The permutation of every block of `layout` (made from `chunk`).
    ///
    /// # Errors
    /// [`DistSpmmError::Allocation`] when its `4 · nnz` bytes cannot be had.
    pub(crate) fn new(chunk: &ChunkView<'_>, layout: &EdgeLayout) -> Result<Self, DistSpmmError> {
        let mut rank: Vec<u32> = Vec::new();
        rank.try_reserve_exact(layout.len())
            .map_err(|e| DistSpmmError::Allocation {
                rank: chunk.part_id(),
                bytes: 4 * layout.len() as u64,
                reason: e.to_string(),
            })?;
        rank.resize(layout.len(), 0);
        for (k, eb) in layout.blocks().iter().enumerate() {
            let b = chunk.block(layout.chunk_index(k));
            let out = &mut rank[eb.range()];
            // Where the next entry of each column goes.
            let mut next: Vec<usize> = b.csc_colptr[..b.ncols]
                .iter()
                .map(|&p| distspmm_sparse::index::offset(p))
                .collect();
            for row in 0..b.nrows {
                let (s, e) = row_span(&b, row);
                for (t, &c) in b.csr_cols[s..e].iter().enumerate() {
                    let slot = &mut next[c as usize];
                    // A row's position is below its entry count, at most ncols ≤ u32::MAX.
                    #[allow(clippy::cast_possible_truncation, reason = "t < ncols ≤ u32::MAX")]
                    {
                        out[*slot] = t as u32;
                    }
                    *slot += 1;
                }
            }
        }
        Ok(Self { rank })
    }

    /// Bytes it holds.
    pub(crate) fn bytes(&self) -> u64 {
        4 * self.rank.len() as u64
    }

    /// The ranks of layout block `k` (for an upload).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn ranks(&self, eb: &EdgeBlock) -> &[u32] {
        &self.rank[eb.range()]
    }

    /// `csc[k·G + g] = csr[g·stride + rowptr[rows[k]] + rank[k]]`: a block's per-edge values of
    /// `groups` groups (`csr` from the block's first value in the operand, group g's run
    /// `stride` values after group g − 1's) in the order of its CSC, the G values of one entry
    /// side by side (`out`, G values per non-zero; with one group, the CSC order itself).
    pub(crate) fn permute(
        &self,
        b: &BlockView<'_>,
        eb: &EdgeBlock,
        csr: &[f32],
        (groups, stride): (usize, usize),
        out: &mut [f32],
    ) {
        let rank = &self.rank[eb.range()];
        let (rowptr, rows) = (b.csr_rowptr, b.csc_rows);
        let gather = |(k, o): (usize, &mut [f32])| {
            let at = distspmm_sparse::index::offset(rowptr[rows[k] as usize]) + rank[k] as usize;
            for (g, o) in o.iter_mut().enumerate() {
                *o = csr[g * stride + at];
            }
        };
        let groups = groups.max(1);
        if out.len() < SERIAL_VALUES {
            out.chunks_exact_mut(groups).enumerate().for_each(gather);
        } else {
            out.par_chunks_exact_mut(groups)
                .enumerate()
                .with_min_len(PARALLEL_VALUES / groups)
                .for_each(gather);
        }
    }
}
