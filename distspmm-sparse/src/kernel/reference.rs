//! Reference products in plain loops: one output element at a time, summed in the order of the
//! stored entries. The tests compare the fast kernels against these (exactly for the portable
//! path, within rounding for the FMA paths).

use crate::sparse::{Compressed, CscView, CsrView, DenseView, DenseViewMut, Orientation, Scalar};

use super::grouped::{check_grouped, group_width};
use super::{check_shapes, EdgeRuns, EdgeRunsMut, KernelError};

/// Y = α·A·X + β·Y with A in CSR form; `β = 0` does not read Y, `α = 0` does not read A or X.
pub fn spmm<T: Scalar>(
    alpha: T,
    a: &CsrView<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    y: DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    check_shapes("A", a.nrows(), a.ncols(), &x, &y)?;
    gather(alpha, a, x, beta, y);
    Ok(())
}

/// Y = α·Aᵀ·X + β·Y with A in CSC form: row `j` of the result sums column `j` of A.
pub fn spmm_transpose<T: Scalar>(
    alpha: T,
    a: &CscView<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    y: DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    check_shapes("Aᵀ", a.ncols(), a.nrows(), &x, &y)?;
    gather(alpha, a, x, beta, y);
    Ok(())
}

/// Row `o` of Y gathers the entries of outer index `o` of `a` (a row of A for a CSR, a column
/// of A — a row of Aᵀ — for a CSC).
fn gather<T: Scalar, O: Orientation>(
    alpha: T,
    a: &Compressed<T, &[u64], &[u32], &[T], O>,
    x: DenseView<'_, T>,
    beta: T,
    mut y: DenseViewMut<'_, T>,
) {
    for o in 0..a.outer_dim() {
        let (idx, vals) = a.outer_view(o);
        for f in 0..x.cols() {
            let mut sum = T::ZERO;
            for (&c, &v) in idx.iter().zip(vals) {
                sum += v * x.row(c as usize)[f];
            }
            store(&mut y.row_mut(o)[f], alpha, sum, beta);
        }
    }
}

/// `y = α·sum + β·y`, where `β = 0` does not read `y` and `α = 0` does not use `sum` (as in
/// BLAS: A and X are then not referenced, so NaN or ∞ in X do not matter).
fn store<T: Scalar>(y: &mut T, alpha: T, sum: T, beta: T) {
    *y = if alpha == T::ZERO {
        if beta == T::ZERO {
            T::ZERO
        } else {
            beta * *y
        }
    } else if beta == T::ZERO {
        alpha * sum
    } else {
        alpha * sum + beta * *y
    };
}

/// `E[k] = ⟨U_i, V_j⟩` for every stored entry `(i, j)` of `pattern` at CSR position `k`,
/// summed over the columns in order.
pub fn sddmm<T: Scalar>(
    pattern: &CsrView<'_, T>,
    u: DenseView<'_, T>,
    v: DenseView<'_, T>,
    out: &mut [T],
) -> Result<(), KernelError> {
    super::sddmm::check_sddmm(pattern, &u, &v, out.len())?;
    let mut k = 0;
    for i in 0..pattern.nrows() {
        for &j in pattern.row(i).0 {
            let mut sum = T::ZERO;
            for (&a, &b) in u.row(i).iter().zip(v.row(j as usize)) {
                sum += a * b;
            }
            out[k] = sum;
            k += 1;
        }
    }
    Ok(())
}

/// The grouped [`spmm`]: row `i`'s columns of group `g` (`C = F / G` each) sum
/// `e_g[p]·X_j[…]` over its stored entries `(i, j)` at CSR positions `p`, in order.
///
/// # Errors
/// As [`spmm_grouped`](super::spmm_grouped).
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
    gather_grouped(alpha, a, e, x, beta, y);
    Ok(())
}

/// The grouped [`spmm_transpose`], the runs of `e` in the CSC's order.
///
/// # Errors
/// As [`spmm_transpose_grouped`](super::spmm_transpose_grouped).
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
    gather_grouped(alpha, a, e, x, beta, y);
    Ok(())
}

fn gather_grouped<T: Scalar, O: Orientation>(
    alpha: T,
    a: &Compressed<T, &[u64], &[u32], &[T], O>,
    e: EdgeRuns<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    mut y: DenseViewMut<'_, T>,
) {
    let c = x.cols() / e.groups();
    for o in 0..a.outer_dim() {
        let (idx, _) = a.outer_view(o);
        let first = crate::index::offset(a.indptr()[o]);
        for f in 0..x.cols() {
            let g = f / c;
            let mut sum = T::ZERO;
            for (p, &col) in idx.iter().enumerate() {
                sum += e.value(g, first + p) * x.row(col as usize)[f];
            }
            store(&mut y.row_mut(o)[f], alpha, sum, beta);
        }
    }
}

/// The grouped [`sddmm`]: `e_g[k] = ⟨U_i[g·w..(g+1)·w], V_j[g·w..(g+1)·w]⟩`, summed over the
/// columns in order.
///
/// # Errors
/// As [`sddmm_grouped`](super::sddmm_grouped).
pub fn sddmm_grouped<T: Scalar>(
    pattern: &CsrView<'_, T>,
    u: DenseView<'_, T>,
    v: DenseView<'_, T>,
    mut out: EdgeRunsMut<'_, T>,
) -> Result<(), KernelError> {
    super::sddmm::check_sddmm(pattern, &u, &v, out.len())?;
    check_grouped(pattern.nnz(), out.len(), out.groups(), u.cols())?;
    let w = group_width(u.cols(), out.groups())?;
    let mut k = 0;
    for i in 0..pattern.nrows() {
        for &j in pattern.row(i).0 {
            for (g, run) in out.runs_mut().iter_mut().enumerate() {
                let mut sum = T::ZERO;
                let cols = g * w..(g + 1) * w;
                for (&a, &b) in u.row(i)[cols.clone()].iter().zip(&v.row(j as usize)[cols]) {
                    sum += a * b;
                }
                run[k] = sum;
            }
            k += 1;
        }
    }
    Ok(())
}
