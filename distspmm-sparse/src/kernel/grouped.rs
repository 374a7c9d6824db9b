//! Grouped per-edge products: G products over one sparse pattern in one pass over its stored
//! entries, each group `g` with its own run of per-edge values and its own `w = F / G` columns
//! of the dense operands (columns `g·w..(g+1)·w`) — the heads of a multi-head attention layer.
//!
//! - [`spmm_grouped`]: `Y_i[g·C..(g+1)·C] = α·Σ_j e_g[k]·X_j[g·C..(g+1)·C] + β·Y_i[…]` over the
//!   CSR of A, `k` the CSR position of `(i, j)`; [`spmm_transpose_grouped`] the same over the
//!   CSC of A (`Aᵀ`), the runs in CSC order.
//! - [`sddmm_grouped`]: `e_g[k] = ⟨U_i[g·w..(g+1)·w], V_j[g·w..(g+1)·w]⟩`.
//!
//! The runs ([`EdgeRuns`], [`EdgeRunsMut`]) are head-major — run g at `values[g·stride..]`,
//! `stride = nnz` for G consecutive runs — or, for reading, edge-major (the G values of one entry
//! side by side). Every X row is gathered once per entry for all groups, and every index once.
//!
//! With one group (and, for reading, consecutive values) the products are exactly
//! [`spmm`](super::spmm), [`spmm_transpose`](super::spmm_transpose) and
//! [`sddmm`](super::sddmm), bit for bit. With more, each SDDMM value is the dot product of
//! [`sddmm`](super::sddmm) (so a grouped call gives the bits of G separate calls), and each SpMM
//! output element is summed in the order of the stored entries without fused multiply-adds,
//! like the portable [`spmm`](super::spmm) path and [`reference`](super::reference): every
//! instruction set (the portable loops are compiled also for AVX2 and for AVX-512F) and every
//! thread count gives the bits of [`reference::spmm_grouped`](super::reference::spmm_grouped).

use alloc::vec::Vec;
use core::ops::Range;

use super::sddmm::{check_sddmm, dot};
use super::{
    check_shapes, generic, isa, prefetch, prefetch_nta, Isa, KernelError, Operand, MIN_GRAIN,
    PREFETCH_LINES, ROW_COST, STREAM_AHEAD,
};
use crate::index;
use crate::sparse::par::{for_each_block, grain_for, SplitRows};
use crate::sparse::{CscView, CsrView, DenseView, DenseViewMut, Scalar};

/// G runs of per-edge values over one pattern's stored entries, read only: the value of group
/// `g` at entry `k` is `values[k·edge_stride + g·group_stride]`.
#[derive(Debug, Clone, Copy)]
pub struct EdgeRuns<'a, T> {
    values: &'a [T],
    groups: usize,
    len: usize,
    group_stride: usize,
    edge_stride: usize,
}

/// The runs of `groups` groups of `len` values `stride` apart in `values`, checked to fit.
fn check_runs(values: usize, groups: usize, len: usize, stride: usize) -> Result<(), KernelError> {
    let fits = groups >= 1
        && (groups == 1 || stride >= len)
        && (groups - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(len))
            .is_some_and(|end| end <= values);
    if fits {
        Ok(())
    } else {
        Err(KernelError::EdgeRuns {
            groups,
            len,
            stride,
            values,
        })
    }
}

/// The run length of `values` split into `groups` equal runs.
fn equal_runs(values: usize, groups: usize) -> Result<usize, KernelError> {
    if groups == 0 || !values.is_multiple_of(groups) {
        return Err(KernelError::EdgeRuns {
            groups,
            len: values / groups.max(1),
            stride: values / groups.max(1),
            values,
        });
    }
    Ok(values / groups)
}

impl<'a, T: Copy> EdgeRuns<'a, T> {
    /// `groups` runs of `len` values, run g at `values[g·stride..g·stride + len]`.
    ///
    /// # Errors
    /// [`KernelError::EdgeRuns`] when `groups` is 0, the runs overlap (`stride < len`) or do
    /// not fit in `values`.
    pub fn head_major(
        values: &'a [T],
        groups: usize,
        len: usize,
        stride: usize,
    ) -> Result<Self, KernelError> {
        check_runs(values.len(), groups, len, stride)?;
        Ok(Self {
            values,
            groups,
            len,
            group_stride: stride,
            edge_stride: 1,
        })
    }

    /// `values` as `groups` consecutive runs of equal length (`e[g·nnz + k]`).
    ///
    /// # Errors
    /// [`KernelError::EdgeRuns`] when `groups` is 0 or does not divide `values.len()`.
    pub fn contiguous(values: &'a [T], groups: usize) -> Result<Self, KernelError> {
        let len = equal_runs(values.len(), groups)?;
        Self::head_major(values, groups, len, len)
    }

    /// `values` as the `groups` values of each entry side by side (`e[k·G + g]`).
    ///
    /// # Errors
    /// [`KernelError::EdgeRuns`] when `groups` is 0 or does not divide `values.len()`.
    pub fn edge_major(values: &'a [T], groups: usize) -> Result<Self, KernelError> {
        let len = equal_runs(values.len(), groups)?;
        Ok(Self {
            values,
            groups,
            len,
            group_stride: 1,
            edge_stride: groups,
        })
    }

    /// The number of groups G.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Values per run (the pattern's stored entries).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the runs are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of group `g` at entry `k` (panics when outside the runs).
    #[inline(always)]
    pub fn value(&self, g: usize, k: usize) -> T {
        self.values[k * self.edge_stride + g * self.group_stride]
    }

    /// The one run as consecutive values, when there is one group stored that way.
    fn single(&self) -> Option<&'a [T]> {
        (self.groups == 1 && self.edge_stride == 1).then(|| &self.values[..self.len])
    }
}

/// G runs of per-edge values an SDDMM writes, one slice per group.
#[derive(Debug)]
pub struct EdgeRunsMut<'a, T> {
    runs: Vec<&'a mut [T]>,
}

impl<'a, T> EdgeRunsMut<'a, T> {
    /// `groups` runs of `len` values, run g at `values[g·stride..g·stride + len]`.
    ///
    /// # Errors
    /// As [`EdgeRuns::head_major`].
    pub fn head_major(
        values: &'a mut [T],
        groups: usize,
        len: usize,
        stride: usize,
    ) -> Result<Self, KernelError> {
        check_runs(values.len(), groups, len, stride)?;
        let mut runs = Vec::with_capacity(groups);
        let mut rest = values;
        for g in 0..groups {
            let (run, tail) = rest.split_at_mut(len);
            runs.push(run);
            // The next run starts `stride` after this one (checked to lie inside `values`).
            rest = if g + 1 < groups {
                &mut tail[stride - len..]
            } else {
                &mut []
            };
        }
        Ok(Self { runs })
    }

    /// `values` as `groups` consecutive runs of equal length (`e[g·nnz + k]`).
    ///
    /// # Errors
    /// As [`EdgeRuns::contiguous`].
    pub fn contiguous(values: &'a mut [T], groups: usize) -> Result<Self, KernelError> {
        let len = equal_runs(values.len(), groups)?;
        Self::head_major(values, groups, len, len)
    }

    /// The number of groups G.
    pub fn groups(&self) -> usize {
        self.runs.len()
    }

    /// Values per run.
    pub fn len(&self) -> usize {
        self.runs.first().map_or(0, |r| r.len())
    }

    /// Whether the runs are empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs, one slice per group.
    pub fn runs_mut(&mut self) -> &mut [&'a mut [T]] {
        &mut self.runs
    }
}

impl<T: Send> SplitRows for EdgeRunsMut<'_, T> {
    fn split_rows(self, indptr: &[u64], rows: &Range<usize>, mid: usize) -> (Self, Self) {
        let at = index::offset(indptr[mid] - indptr[rows.start]);
        let (mut left, mut right) = (
            Vec::with_capacity(self.runs.len()),
            Vec::with_capacity(self.runs.len()),
        );
        for run in self.runs {
            let (a, b) = run.split_at_mut(at);
            left.push(a);
            right.push(b);
        }
        (Self { runs: left }, Self { runs: right })
    }
}

/// The width of each group's columns: `cols / groups`.
pub(crate) fn group_width(cols: usize, groups: usize) -> Result<usize, KernelError> {
    if groups == 0 || !cols.is_multiple_of(groups) {
        return Err(KernelError::Groups { groups, cols });
    }
    Ok(cols / groups)
}

/// Checks the runs of a grouped product over a pattern of `nnz` entries and `cols` columns.
pub(crate) fn check_grouped(
    nnz: usize,
    len: usize,
    groups: usize,
    cols: usize,
) -> Result<(), KernelError> {
    group_width(cols, groups)?;
    if len != nnz {
        return Err(KernelError::EdgeCount { nnz, values: len });
    }
    Ok(())
}

/// `e_g[k] = ⟨U_i[g·w..(g+1)·w], V_j[g·w..(g+1)·w]⟩` for every stored entry `(i, j)` of
/// `pattern` at CSR position `k` and every group g of `out` (`w = F / G`; `U: m × F`,
/// `V: n × F`). The pattern's own values are not read.
///
/// ```
/// use distspmm_sparse::kernel::{sddmm_grouped, EdgeRunsMut};
/// use distspmm_sparse::sparse::{CsrOwned, DenseView};
///
/// // The pattern {(0, 1), (1, 0)}; two groups of one column each.
/// let a = CsrOwned::<f32>::from_triplets(2, 2, &[0, 1], &[1, 0], &[1.0; 2])?;
/// let (u, v) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
/// let mut e = [0.0; 4];
/// sddmm_grouped(
///     &a.view(),
///     DenseView::from_row_major(&u[..], 2, 2)?,
///     DenseView::from_row_major(&v[..], 2, 2)?,
///     EdgeRunsMut::contiguous(&mut e[..], 2)?,
/// )?;
/// assert_eq!(e, [7.0, 15.0, 16.0, 24.0]); // group 0: 1·7, 3·5; group 1: 2·8, 4·6
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`KernelError::SddmmOperands`] when `U` or `V` do not fit the pattern or each other,
/// [`KernelError::Groups`] when their columns do not split into the groups,
/// [`KernelError::EdgeCount`] when a run does not hold one value per stored entry.
pub fn sddmm_grouped<T: Scalar>(
    pattern: &CsrView<'_, T>,
    u: DenseView<'_, T>,
    v: DenseView<'_, T>,
    out: EdgeRunsMut<'_, T>,
) -> Result<(), KernelError> {
    check_sddmm(pattern, &u, &v, out.len())?;
    check_grouped(pattern.nnz(), out.len(), out.groups(), u.cols())?;
    let (indptr, indices, _) = pattern.into_raw_parts();
    run_sddmm(isa(), indptr, indices, u, v, out);
    Ok(())
}

/// Runs one grouped SDDMM after the shapes were checked, with at most the instruction set
/// `isa`.
pub(crate) fn run_sddmm<T: Scalar>(
    isa: Isa,
    indptr: &[u64],
    indices: &[u32],
    u: DenseView<'_, T>,
    v: DenseView<'_, T>,
    mut out: EdgeRunsMut<'_, T>,
) {
    if out.groups() == 1 {
        if let Some(run) = out.runs.pop() {
            super::sddmm::run(isa, indptr, indices, u, v, run);
        }
        return;
    }
    let isa = isa.min(Isa::supported());
    let rows = u.rows();
    if rows == 0 || out.is_empty() {
        return;
    }
    if u.cols() == 0 {
        out.runs.iter_mut().for_each(|r| r.fill(T::ZERO));
        return;
    }
    let work = (out.len() * out.groups()) as u64 + ROW_COST * rows as u64;
    let grain = grain_for(work, MIN_GRAIN);
    // The common group widths get loops of a width known at compile time (the same dot
    // products, unrolled).
    let block = |r: Range<usize>, out: EdgeRunsMut<'_, T>| match u.cols() / out.groups() {
        2 => sddmm_rows::<T, 2>(isa, indptr, indices, &u, &v, r, out),
        8 => sddmm_rows::<T, 8>(isa, indptr, indices, &u, &v, r, out),
        _ => sddmm_rows::<T, 0>(isa, indptr, indices, &u, &v, r, out),
    };
    for_each_block(indptr, 0..rows, ROW_COST, grain, out, &block);
}

/// The rows `rows` into `out`, each group `N` columns wide (`N = 0`: as many as `U` has
/// columns per group).
fn sddmm_rows<T: Scalar, const N: usize>(
    isa: Isa,
    indptr: &[u64],
    indices: &[u32],
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    rows: Range<usize>,
    mut out: EdgeRunsMut<'_, T>,
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: `isa` never exceeds what the CPU supports (see `super::isa`), and every
        // instruction set at or above AVX2 here includes AVX2 and FMA.
        unsafe { sddmm_rows_avx2::<T, N>(indptr, indices, u, v, rows, &mut out.runs) };
        return;
    }
    let _ = isa;
    sddmm_body::<T, N>(indptr, indices, u, v, rows, &mut out.runs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn sddmm_rows_avx2<T: Scalar, const N: usize>(
    indptr: &[u64],
    indices: &[u32],
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    rows: Range<usize>,
    runs: &mut [&mut [T]],
) {
    sddmm_body::<T, N>(indptr, indices, u, v, rows, runs);
}

/// The rows `rows` into `runs`, whose first values are the entry at `indptr[rows.start]`.
#[inline(always)]
fn sddmm_body<T: Scalar, const N: usize>(
    indptr: &[u64],
    indices: &[u32],
    u: &DenseView<'_, T>,
    v: &DenseView<'_, T>,
    rows: Range<usize>,
    runs: &mut [&mut [T]],
) {
    let (f, groups) = (u.cols(), runs.len());
    let w = if N > 0 { N } else { f / groups };
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
            let vj = &vs[j..j + f];
            for (g, run) in runs.iter_mut().enumerate() {
                let cols = g * w..(g + 1) * w;
                run[k - base] = dot(&ui[cols.clone()], &vj[cols]);
            }
        }
    }
}

/// `Y = α·A_e·X + β·Y` per group with A in CSR form (`A: m × k`, `X: k × F`, `Y: m × F`, F
/// split into `e.groups()` groups of `C = F / G` columns): group g of row i sums
/// `e_g[p]·X_j[g·C..(g+1)·C]` over the row's entries `(i, j)` at CSR positions `p`. The
/// pattern's own values are not read. `β = 0` does not read Y; `α = 0` only scales Y.
///
/// ```
/// use distspmm_sparse::kernel::{spmm_grouped, EdgeRuns};
/// use distspmm_sparse::sparse::{CsrOwned, DenseView, DenseViewMut};
///
/// // Row 0 reads nodes 0 and 1; two groups of one column, values e_0 = [1, 2], e_1 = [3, 4].
/// let a = CsrOwned::<f32>::from_triplets(1, 2, &[0, 0], &[0, 1], &[0.0; 2])?;
/// let (x, e) = ([10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0]);
/// let mut y = [0.0; 2];
/// spmm_grouped(
///     1.0,
///     &a.view(),
///     EdgeRuns::contiguous(&e[..], 2)?,
///     DenseView::from_row_major(&x[..], 2, 2)?,
///     0.0,
///     DenseViewMut::from_row_major(&mut y[..], 1, 2)?,
/// )?;
/// assert_eq!(y, [1.0 * 10.0 + 2.0 * 30.0, 3.0 * 20.0 + 4.0 * 40.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// The shape errors of [`spmm`](super::spmm); [`KernelError::Groups`] when F does not split
/// into the groups; [`KernelError::EdgeCount`] when a run does not hold one value per stored
/// entry.
pub fn spmm_grouped<T: Scalar>(
    alpha: T,
    a: &CsrView<'_, T>,
    e: EdgeRuns<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    y: DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    check_shapes("A", a.nrows(), a.ncols(), &x, &y)?;
    check_grouped(a.nnz(), e.len(), e.groups(), x.cols())?;
    let (indptr, indices, _) = a.into_raw_parts();
    run_spmm(isa(), alpha, indptr, indices, e, x, beta, y);
    Ok(())
}

/// `Y = α·A_eᵀ·X + β·Y` per group with A in CSC form (`A: k × m`, `X: k × F`, `Y: m × F`), the
/// runs of `e` in the CSC's order: the gather kernel of [`spmm_grouped`] over the CSC arrays.
///
/// # Errors
/// As [`spmm_grouped`].
pub fn spmm_transpose_grouped<T: Scalar>(
    alpha: T,
    a: &CscView<'_, T>,
    e: EdgeRuns<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    y: DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    check_shapes("Aᵀ", a.ncols(), a.nrows(), &x, &y)?;
    check_grouped(a.nnz(), e.len(), e.groups(), x.cols())?;
    let (indptr, indices, _) = a.into_raw_parts();
    run_spmm(isa(), alpha, indptr, indices, e, x, beta, y);
    Ok(())
}

/// One pass of a grouped product over the feature columns `f0..f0 + w`.
struct GroupedPass<'a, T> {
    indptr: &'a [u64],
    indices: &'a [u32],
    e: EdgeRuns<'a, T>,
    x: DenseView<'a, T>,
    /// Columns per group.
    c: usize,
    f0: usize,
    w: usize,
    alpha: T,
    beta: T,
}

/// Runs one grouped product after the shapes were checked, with at most the instruction set
/// `isa` (the outer index of `indptr` is Y's rows, the indices are X's rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_spmm<T: Scalar>(
    isa: Isa,
    alpha: T,
    indptr: &[u64],
    indices: &[u32],
    e: EdgeRuns<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    mut y: DenseViewMut<'_, T>,
) {
    if let Some(data) = e.single() {
        let op = Operand {
            indptr,
            indices,
            data,
        };
        super::run(isa, alpha, op, x, beta, y);
        return;
    }
    let isa = isa.min(Isa::supported());
    let (rows, f) = (y.rows(), y.cols());
    if rows == 0 || f == 0 {
        return;
    }
    let nnz = indices.len() as u64;
    let grain = grain_for(nnz * e.groups() as u64 + ROW_COST * rows as u64, MIN_GRAIN);
    if alpha == T::ZERO {
        let scale = |_, mut y: DenseViewMut<'_, T>| super::scale(beta, &mut y);
        for_each_block(indptr, 0..rows, ROW_COST, grain, y, &scale);
        return;
    }
    let width = generic::pass_width::<T>(f);
    for f0 in (0..f).step_by(width) {
        let pass = GroupedPass {
            indptr,
            indices,
            e,
            x,
            c: f / e.groups(),
            f0,
            w: width.min(f - f0),
            alpha,
            beta,
        };
        let block = |r: Range<usize>, y: DenseViewMut<'_, T>| match width {
            8 => pass_c::<T, 8>(isa, &pass, r, y),
            16 => pass_c::<T, 16>(isa, &pass, r, y),
            32 => pass_c::<T, 32>(isa, &pass, r, y),
            _ => pass_c::<T, 64>(isa, &pass, r, y),
        };
        for_each_block(indptr, 0..rows, ROW_COST, grain, y.reborrow(), &block);
    }
}

/// A pass of width `W` with the loops for its group width: columns per group `C` of 2, 4, 8
/// or 16 dividing `W` (every group of the pass whole, starting at a multiple of `C`), or any
/// other (`C = 0`: the groups' spans computed at run time).
fn pass_c<T: Scalar, const W: usize>(
    isa: Isa,
    pass: &GroupedPass<'_, T>,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    match pass.c {
        2 => pass_w::<T, W, 2>(isa, pass, rows, y),
        4 => pass_w::<T, W, 4>(isa, pass, rows, y),
        8 => pass_w::<T, W, 8>(isa, pass, rows, y),
        16 if W.is_multiple_of(16) => pass_w::<T, W, 16>(isa, pass, rows, y),
        _ => pass_w::<T, W, 0>(isa, pass, rows, y),
    }
}

fn pass_w<T: Scalar, const W: usize, const C: usize>(
    isa: Isa,
    pass: &GroupedPass<'_, T>,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: `isa` never exceeds what the CPU supports (see `super::isa`), and
            // `Isa::Avx512` means AVX-512F is present.
            unsafe { pass_avx512::<T, W, C>(pass, rows, y) };
            return;
        }
        if isa >= Isa::Avx2 {
            // SAFETY: as above; every instruction set at or above AVX2 here includes AVX2 and
            // FMA.
            unsafe { pass_avx2::<T, W, C>(pass, rows, y) };
            return;
        }
    }
    let _ = isa;
    pass_body::<T, W, C>(pass, rows, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn pass_avx2<T: Scalar, const W: usize, const C: usize>(
    pass: &GroupedPass<'_, T>,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    pass_body::<T, W, C>(pass, rows, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn pass_avx512<T: Scalar, const W: usize, const C: usize>(
    pass: &GroupedPass<'_, T>,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    pass_body::<T, W, C>(pass, rows, y);
}

/// The rows `rows` of one pass into `y`, whose row 0 is row `rows.start`. Each entry first
/// spreads its G values over the pass's columns (`scale[l]` is the value of column `l`'s
/// group), then adds `scale ⊙ X_j` into the accumulators, lane by lane: the sums of the
/// reference, in its order. With a group width `C` known at compile time (every group of the
/// pass whole), each group's `C` lanes instead add `e_g·X_j` directly from the broadcast
/// value: the same products and sums, without writing and re-reading `scale`.
#[inline(always)]
fn pass_body<T: Scalar, const W: usize, const C: usize>(
    pass: &GroupedPass<'_, T>,
    rows: Range<usize>,
    mut y: DenseViewMut<'_, T>,
) {
    let GroupedPass {
        indptr,
        indices,
        e,
        x,
        c,
        f0,
        w,
        alpha,
        beta,
    } = *pass;
    let (xs, ldx) = (x.as_slice(), x.ld());
    // The groups the pass's columns belong to, as (group, first column, end column) in pass
    // coordinates.
    let mut segments = [(0usize, 0usize, 0usize); W];
    let mut count = 0;
    let mut col = 0;
    while col < w {
        let g = (f0 + col) / c;
        let end = ((g + 1) * c - f0).min(w);
        segments[count] = (g, col, end);
        count += 1;
        col = end;
    }
    let segments = &segments[..count];
    let last = index::offset(indptr[rows.end]).saturating_sub(1);
    let lines = (w * size_of::<T>()).div_ceil(64) + 1;
    let per_line = 64 / size_of::<T>();
    let distance = (PREFETCH_LINES / lines).max(1);
    for (r, i) in rows.enumerate() {
        let (s, end) = (index::offset(indptr[i]), index::offset(indptr[i + 1]));
        let mut acc = [T::ZERO; W];
        let mut scale = [T::ZERO; W];
        for k in s..end {
            let ahead = indices[(k + distance).min(last)] as usize;
            let row = xs.as_ptr().wrapping_add(ahead * ldx + f0);
            for l in 0..lines - 1 {
                prefetch(row.wrapping_add(l * per_line));
            }
            prefetch(row.wrapping_add(w - 1));
            prefetch_nta(indices.as_ptr().wrapping_add(k + STREAM_AHEAD));
            let off = indices[k] as usize * ldx + f0;
            if C > 0 {
                // The pass's whole groups f0 / C.., C lanes each (`w` is a multiple of C).
                let xr = &xs[off..off + w];
                let lanes = acc[..w].chunks_exact_mut(C).zip(xr.chunks_exact(C));
                for (q, (acc_g, x_g)) in lanes.enumerate() {
                    let v = e.value(f0 / C + q, k);
                    for (acc_l, &x_l) in acc_g.iter_mut().zip(x_g) {
                        *acc_l += v * x_l;
                    }
                }
                continue;
            }
            for &(g, a, b) in segments {
                scale[a..b].fill(e.value(g, k));
            }
            // As in the single product: a narrower pass still runs at the full width wherever
            // X has W values from the row's offset on (the lanes past `w` are never stored).
            if let Some(xr) = xs.get(off..off + W).and_then(|x| x.first_chunk::<W>()) {
                for ((acc_l, &s_l), &x_l) in acc.iter_mut().zip(&scale).zip(xr) {
                    *acc_l += s_l * x_l;
                }
            } else {
                for ((acc_l, &s_l), &x_l) in acc[..w].iter_mut().zip(&scale).zip(&xs[off..off + w])
                {
                    *acc_l += s_l * x_l;
                }
            }
        }
        let out = &mut y.row_mut(r)[f0..f0 + w];
        if beta == T::ZERO {
            for (o, &s) in out.iter_mut().zip(&acc) {
                *o = alpha * s;
            }
        } else {
            for (o, &s) in out.iter_mut().zip(&acc) {
                *o = alpha * s + beta * *o;
            }
        }
    }
}
