//! The sparse blocks of a rank's chunk as the schedules name them ([`Matrix`](crate::backend::Matrix)),
//! built without re-validating: a [`ChunkView`] is only made by `ChunkView::parse`, which checks
//! every block's CSR and CSC (pointers of `nrows + 1` / `ncols + 1` entries from 0 to nnz,
//! non-decreasing; indices strictly increasing within a row or column and below the other
//! dimension) and every halo receive list (strictly increasing, below the sender's row count).
//! The views below rely on that (sprs-style unchecked constructors, contract in each SAFETY).

use chunk_format::{BlockView, ChunkView};
use distspmm_sparse::sparse::{CscView, CsrView};

/// The CSR and CSC of one block over the chunk's own arrays.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockViews<'a> {
    pub(crate) csr: CsrView<'a, f32>,
    pub(crate) csc: CscView<'a, f32>,
}

impl<'a> BlockViews<'a> {
    /// The views of a block of a parsed chunk.
    fn of(b: &BlockView<'a>) -> Self {
        let missing = "a block's values are its own length";
        Self {
            csr: csr_with(b, b.csr_vals).expect(missing),
            csc: csc_with(b, b.csc_vals).expect(missing),
        }
    }
}

/// The CSR of a block of a parsed chunk (over its compacted columns) with `values` in place of
/// its own; `None` unless `values` holds one value per non-zero.
pub(crate) fn csr_with<'a>(b: &BlockView<'a>, values: &'a [f32]) -> Option<CsrView<'a, f32>> {
    // SAFETY: `b` comes from a `ChunkView`, whose parse checked exactly the invariants of
    // `Compressed` for the block's pointer and index arrays (see `BlockView`'s docs and the
    // module docs), with nrows × ncols as given here; `values` has one entry per non-zero
    // (checked), which is all `Compressed` asks of the values.
    (values.len() == b.csr_cols.len()).then(|| unsafe {
        CsrView::new_unchecked(b.nrows, b.ncols, b.csr_rowptr, b.csr_cols, values)
    })
}

/// The CSC of a block of a parsed chunk with `values` (in CSC order) in place of its own;
/// `None` unless `values` holds one value per non-zero.
pub(crate) fn csc_with<'a>(b: &BlockView<'a>, values: &'a [f32]) -> Option<CscView<'a, f32>> {
    // SAFETY: as in `csr_with`, for the block's CSC arrays.
    (values.len() == b.csc_rows.len()).then(|| unsafe {
        CscView::new_unchecked(b.nrows, b.ncols, b.csc_colptr, b.csc_rows, values)
    })
}

/// The diagonal block `Â[p][p]`.
pub(crate) fn diagonal<'a>(chunk: &ChunkView<'a>) -> BlockViews<'a> {
    BlockViews::of(&chunk.diagonal_block())
}

/// Block `i` of the chunk (in order of source part).
pub(crate) fn block<'a>(chunk: &ChunkView<'a>, i: usize) -> BlockViews<'a> {
    BlockViews::of(&chunk.block(i))
}

/// The off-diagonal blocks in increasing source part, as (source part, block index).
pub(crate) fn remote_indices(chunk: &ChunkView<'_>) -> Vec<(usize, usize)> {
    let part = chunk.part_id();
    chunk
        .block_sources()
        .iter()
        .enumerate()
        .filter(|&(_, &q)| q as usize != part)
        .map(|(i, &q)| (q as usize, i))
        .collect()
}

/// The off-diagonal blocks in increasing source part, over compacted columns.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn remote<'a>(chunk: &ChunkView<'a>) -> Vec<(usize, BlockViews<'a>)> {
    remote_indices(chunk)
        .into_iter()
        .map(|(q, i)| (q, block(chunk, i)))
        .collect()
}

/// A block `Â[p][q]` over q-local columns `0..n_q`: the arrays derived from the chunk (the
/// CSR's column ids mapped through the halo receive list, the CSC's column pointer spread over
/// all `n_q` columns), owned; row pointers, row ids and values are the chunk's, viewed by
/// [`QLocalBlock::views`].
#[derive(Debug)]
pub(crate) struct QLocalBlock {
    /// The block's index in the chunk it was derived from.
    block: usize,
    n_q: usize,
    cols: Vec<u32>,
    colptr: Vec<u64>,
}

impl QLocalBlock {
    /// The CSR and CSC of the block over q-local columns.
    ///
    /// # Panics
    /// If `chunk` is not the chunk the block was derived from in [`q_local`] and has fewer
    /// blocks, or its block has another shape (a bug of the caller; never a wrong result).
    pub(crate) fn views<'c>(
        &'c self,
        chunk: &ChunkView<'c>,
    ) -> (CsrView<'c, f32>, CscView<'c, f32>) {
        let b = chunk.block(self.block);
        self.views_with(chunk, b.csr_vals, b.csc_vals)
    }

    /// [`QLocalBlock::views`] with other values: `csr_vals` in CSR order, `csc_vals` in CSC
    /// order (the per-edge operand and its permutation).
    ///
    /// # Panics
    /// As [`QLocalBlock::views`], and when the values do not hold one value per non-zero (a
    /// bug of the caller).
    pub(crate) fn views_with<'c>(
        &'c self,
        chunk: &ChunkView<'c>,
        csr_vals: &'c [f32],
        csc_vals: &'c [f32],
    ) -> (CsrView<'c, f32>, CscView<'c, f32>) {
        let b = chunk.block(self.block);
        assert_eq!(
            b.csr_cols.len(),
            self.cols.len(),
            "a q-local block viewed over another chunk"
        );
        assert!(
            csr_vals.len() == self.cols.len() && csc_vals.len() == self.cols.len(),
            "a q-local block's values are one per non-zero"
        );
        // SAFETY: `q_local` derived `cols` and `colptr` from this block of a parsed chunk
        // (valid CSR/CSC over its `ncols` compacted columns, `ncols` = the length of the
        // receive list from q, every entry of which is below n_q and strictly increasing). A
        // strictly increasing map keeps each row's columns strictly increasing and puts them
        // below n_q; the spread column pointer holds each compacted column's count at its
        // q-local column and its prefix sum runs from 0 to nnz, non-decreasing. `chunk` is
        // the chunk they were derived from: the operator holds it through a `ChunkSource`,
        // whose contract is to view the same bytes on every call (the assertion above guards
        // against a caller handing in another one). The values hold one entry per non-zero
        // (asserted).
        unsafe {
            (
                CsrView::new_unchecked(b.nrows, self.n_q, b.csr_rowptr, &self.cols, csr_vals),
                CscView::new_unchecked(b.nrows, self.n_q, &self.colptr, b.csc_rows, csc_vals),
            )
        }
    }

    /// Bytes of the derived arrays.
    pub(crate) fn structure_bytes(&self) -> u64 {
        4 * self.cols.len() as u64 + 8 * self.colptr.len() as u64
    }
}

/// The off-diagonal blocks of `chunk` in q-local columns, indexed by source part (`None` for
/// the chunk's own part and for parts without a block); both backends use the same blocks.
pub(crate) fn q_local(chunk: &ChunkView<'_>) -> Vec<Option<QLocalBlock>> {
    let part = chunk.part_id();
    let offsets = chunk.part_offsets();
    let mut blocks: Vec<Option<QLocalBlock>> = (0..chunk.num_parts()).map(|_| None).collect();
    for (q, i) in remote_indices(chunk) {
        debug_assert_ne!(q, part);
        let b = chunk.block(i);
        // A part's size: at most u32::MAX, checked by `ChunkView::parse`.
        let n_q = distspmm_sparse::index::offset(offsets[q + 1] - offsets[q]);
        let halo = chunk.halo_recv(q);
        let cols: Vec<u32> = b.csr_cols.iter().map(|&c| halo[c as usize]).collect();
        let mut colptr = vec![0u64; n_q + 1];
        for (c, w) in b.csc_colptr.windows(2).enumerate() {
            colptr[halo[c] as usize + 1] = w[1] - w[0];
        }
        for i in 0..n_q {
            colptr[i + 1] += colptr[i];
        }
        blocks[q] = Some(QLocalBlock {
            block: i,
            n_q,
            cols,
            colptr,
        });
    }
    blocks
}
