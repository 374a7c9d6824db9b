//! The sparse blocks of a rank's chunk as the schedules name them ([`Matrix`](crate::backend::Matrix)),
//! built without re-validating: a [`ChunkView`] is only made by `ChunkView::parse`, which checks
//! every block's CSR and CSC (pointers of `nrows + 1` / `ncols + 1` entries from 0 to nnz,
//! non-decreasing; indices strictly increasing within a row or column and below the other
//! dimension) and every halo receive list (strictly increasing, below the sender's row count).
//! The views below rely on that (sprs-style unchecked constructors, contract in each SAFETY).

use chunk_format::{BlockView, ChunkView};
use distspmm_core::sparse::{Csc, CscView, Csr, CsrView};

/// The CSR and CSC of one block over the chunk's own arrays.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockViews<'a> {
    pub(crate) csr: CsrView<'a, f32>,
    pub(crate) csc: CscView<'a, f32>,
}

impl<'a> BlockViews<'a> {
    /// The views of a block of a parsed chunk.
    fn of(b: &BlockView<'a>) -> Self {
        // SAFETY: `b` comes from a `ChunkView`, whose parse checked exactly the invariants of
        // `Compressed` for both arrays of every block (see `BlockView`'s docs and the module
        // docs), with nrows × ncols as given here.
        unsafe {
            Self {
                csr: CsrView::new_unchecked(b.nrows, b.ncols, b.csr_rowptr, b.csr_cols, b.csr_vals),
                csc: CscView::new_unchecked(b.nrows, b.ncols, b.csc_colptr, b.csc_rows, b.csc_vals),
            }
        }
    }
}

/// The diagonal block `Â[p][p]`.
pub(crate) fn diagonal<'a>(chunk: &ChunkView<'a>) -> BlockViews<'a> {
    BlockViews::of(&chunk.diagonal_block())
}

/// The off-diagonal blocks in increasing source part, over compacted columns.
pub(crate) fn remote<'a>(chunk: &ChunkView<'a>) -> Vec<(usize, BlockViews<'a>)> {
    let part = chunk.part_id();
    chunk
        .blocks()
        .filter(|b| b.src_part as usize != part)
        .map(|b| (b.src_part as usize, BlockViews::of(&b)))
        .collect()
}

/// A block `Â[p][q]` over q-local columns `0..n_q`: the CSR with its column ids mapped through
/// the halo receive list (owned), the CSC with its column pointer spread over all `n_q`
/// columns (owned); row pointers, row ids and values borrowed from the chunk.
#[derive(Debug)]
pub(crate) struct QLocalBlock<'a> {
    pub(crate) csr: Csr<f32, &'a [u64], Vec<u32>, &'a [f32]>,
    pub(crate) csc: Csc<f32, Vec<u64>, &'a [u32], &'a [f32]>,
}

/// The off-diagonal blocks of `chunk` in q-local columns, indexed by source part (`None` for
/// the chunk's own part and for parts without a block); both backends use the same blocks.
pub(crate) fn q_local<'a>(chunk: &ChunkView<'a>) -> Vec<Option<QLocalBlock<'a>>> {
    let part = chunk.part_id();
    let offsets = chunk.part_offsets();
    let mut blocks: Vec<Option<QLocalBlock<'a>>> = (0..chunk.num_parts()).map(|_| None).collect();
    for b in chunk.blocks().filter(|b| b.src_part as usize != part) {
        let q = b.src_part as usize;
        let n_q = (offsets[q + 1] - offsets[q]) as usize;
        let halo = chunk.halo_recv(q);
        let cols: Vec<u32> = b.csr_cols.iter().map(|&c| halo[c as usize]).collect();
        let mut colptr = vec![0u64; n_q + 1];
        for (c, w) in b.csc_colptr.windows(2).enumerate() {
            colptr[halo[c] as usize + 1] = w[1] - w[0];
        }
        for i in 0..n_q {
            colptr[i + 1] += colptr[i];
        }
        // SAFETY: the parse checked the block (valid CSR/CSC over its `ncols` compacted
        // columns, `ncols` = the length of the receive list from q) and the receive list
        // (strictly increasing, every entry below n_q). A strictly increasing map keeps each
        // row's columns strictly increasing and puts them below n_q; the spread column
        // pointer holds each compacted column's count at its q-local column and the prefix sum
        // runs from 0 to nnz, non-decreasing.
        blocks[q] = Some(unsafe {
            QLocalBlock {
                csr: Csr::new_unchecked(b.nrows, n_q, b.csr_rowptr, cols, b.csr_vals),
                csc: Csc::new_unchecked(b.nrows, n_q, colptr, b.csc_rows, b.csc_vals),
            }
        });
    }
    blocks
}
