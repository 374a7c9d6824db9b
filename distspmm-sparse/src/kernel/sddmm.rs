//! The sampled dense–dense product (SDDMM): one value per stored entry of a sparse pattern from
//! the two dense rows it joins, `E[k] = ⟨U_i, V_j⟩` for the entry `(i, j)` at CSR position `k`.
//!
//! Rows are handed to rayon's threads in blocks of balanced work (non-zeros plus a per-row
//! cost, as [`spmm`](super::spmm)), each block writing its own contiguous run of `E`. A row's
//! `U_i` stays in cache while the rows `V_j` of its entries are gathered (prefetched ahead, as
//! in the SpMM). The dot product sums `F` in eight interleaved lanes reduced in a fixed tree,
//! plain code the compiler vectorises for the build target and, on x86-64 CPUs with AVX2, a
//! second time with AVX2 enabled; no fused multiply-add is formed, so every instruction set
//! gives the same bits, and as every value is computed by one thread, so does every thread
//! count.

use core::ops::Range;

use super::{isa, prefetch, prefetch_nta, Isa, KernelError, PREFETCH_LINES, STREAM_AHEAD};
use crate::index;
use crate::sparse::par::{for_each_block, grain_for};
use crate::sparse::{CsrView, DenseView, Scalar};

/// Per-row work in units of one non-zero (loading `U_i`, starting the loop).
const ROW_COST: u64 = 2;
/// The smallest block worth a task, in non-zeros.
const MIN_GRAIN: u64 = 1 << 14;
/// Lanes of the dot product.
const LANES: usize = 8;

/// `E[k] = ⟨U_i, V_j⟩` for every stored entry `(i, j)` of `pattern` (`m × n`), `k` its CSR
/// position; `U: m × F`, `V: n × F` (any leading dimensions), `E` one value per stored entry.
/// The pattern's own values are not read.
///
/// ```
/// use distspmm_sparse::kernel::sddmm;
/// use distspmm_sparse::sparse::{CsrOwned, DenseView};
///
/// // The pattern {(0, 1), (1, 0), (1, 1)}; U = [[1, 2], [3, 4]], V = [[5, 6], [7, 8]].
/// let a = CsrOwned::<f32>::from_triplets(2, 2, &[0, 1, 1], &[1, 0, 1], &[1.0; 3])?;
/// let (u, v) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
/// let mut e = [0.0; 3];
/// sddmm(
///     &a.view(),
///     DenseView::from_row_major(&u[..], 2, 2)?,
///     DenseView::from_row_major(&v[..], 2, 2)?,
///     &mut e,
/// )?;
/// assert_eq!(e, [23.0, 39.0, 53.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`KernelError::SddmmOperands`] when `U` or `V` do not fit the pattern or each other,
/// [`KernelError::EdgeCount`] when `E` does not hold one value per stored entry.
pub fn sddmm<T: Scalar>(
    pattern: &CsrView<'_, T>,
    u: DenseView<'_, T>,
    v: DenseView<'_, T>,
    out: &mut [T],
) -> Result<(), KernelError> {
    check_sddmm(pattern, &u, &v, out.len())?;
    let (indptr, indices, _) = pattern.into_raw_parts();
    run(isa(), indptr, indices, u, v, out);
    Ok(())
}

/// Checks the operands of an SDDMM over `pattern`.
pub(crate) fn check_sddmm<T: Scalar>(
    pattern: &CsrView<'_, T>,
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    values: usize,
) -> Result<(), KernelError> {
    if u.rows() != pattern.nrows() || v.rows() != pattern.ncols() || u.cols() != v.cols() {
        return Err(KernelError::SddmmOperands {
            nrows: pattern.nrows(),
            ncols: pattern.ncols(),
            u: (u.rows(), u.cols()),
            v: (v.rows(), v.cols()),
        });
    }
    if values != pattern.nnz() {
        return Err(KernelError::EdgeCount {
            nnz: pattern.nnz(),
            values,
        });
    }
    Ok(())
}

/// Runs one SDDMM after the shapes were checked, with at most the instruction set `isa`.
pub(crate) fn run<T: Scalar>(
    isa: Isa,
    indptr: &[u64],
    indices: &[u32],
    u: DenseView<'_, T>,
    v: DenseView<'_, T>,
    out: &mut [T],
) {
    let isa = isa.min(Isa::supported());
    let rows = u.rows();
    if rows == 0 || out.is_empty() {
        return;
    }
    if u.cols() == 0 {
        out.fill(T::ZERO);
        return;
    }
    let grain = grain_for(out.len() as u64 + ROW_COST * rows as u64, MIN_GRAIN);
    let block = |r: Range<usize>, out: &mut [T]| rows_of(isa, indptr, indices, &u, &v, r, out);
    for_each_block(indptr, 0..rows, ROW_COST, grain, out, &block);
}

fn rows_of<T: Scalar>(
    isa: Isa,
    indptr: &[u64],
    indices: &[u32],
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    rows: Range<usize>,
    out: &mut [T],
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: `isa` never exceeds what the CPU supports (see `super::isa`), and every
        // instruction set at or above AVX2 here includes AVX2 and FMA.
        unsafe { rows_avx2(indptr, indices, u, v, rows, out) };
        return;
    }
    let _ = isa;
    rows_body(indptr, indices, u, v, rows, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rows_avx2<T: Scalar>(
    indptr: &[u64],
    indices: &[u32],
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    rows: Range<usize>,
    out: &mut [T],
) {
    rows_body(indptr, indices, u, v, rows, out);
}

/// The rows `rows` of the pattern into `out`, whose first value is the entry at
/// `indptr[rows.start]`.
#[inline(always)]
fn rows_body<T: Scalar>(
    indptr: &[u64],
    indices: &[u32],
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    rows: Range<usize>,
    out: &mut [T],
) {
    let f = u.cols();
    let (vs, ldv) = (v.as_slice(), v.ld());
    let base = index::offset(indptr[rows.start]);
    let last = index::offset(indptr[rows.end]).saturating_sub(1);
    let lines = (f * size_of::<T>()).div_ceil(64) + 1;
    let per_line = 64 / size_of::<T>();
    let distance = (PREFETCH_LINES / lines).max(1);
    for i in rows {
        let ui = u.row(i);
        let (s, e) = (index::offset(indptr[i]), index::offset(indptr[i + 1]));
        for k in s..e {
            let ahead = indices[(k + distance).min(last)] as usize;
            let row = vs.as_ptr().wrapping_add(ahead * ldv);
            for l in 0..lines - 1 {
                prefetch(row.wrapping_add(l * per_line));
            }
            prefetch(row.wrapping_add(f - 1));
            prefetch_nta(indices.as_ptr().wrapping_add(k + STREAM_AHEAD));
            let j = indices[k] as usize * ldv;
            out[k - base] = dot(ui, &vs[j..j + f]);
        }
    }
}

/// `⟨a, b⟩` in [`LANES`] interleaved partial sums reduced in a fixed tree, then the tail.
#[inline(always)]
pub(crate) fn dot<T: Scalar>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let mut tail = T::ZERO;
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}
