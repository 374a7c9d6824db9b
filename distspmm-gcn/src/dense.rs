//! Dense matrix products of the GCN (feature transforms and weight gradients) through
//! `matrixmultiply`'s packed, SIMD-dispatched sgemm. Matrices are row-major `&[f32]` with their
//! shapes passed explicitly; the wrappers check the shapes so the raw-pointer call is sound.

/// Which operand of a product is used transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// The matrix as stored (row-major `rows × cols`).
    N,
    /// Its transpose (the stored `rows × cols` matrix read as `cols × rows`).
    T,
}

/// A row-major matrix shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Number of rows as stored.
    pub rows: usize,
    /// Number of columns as stored (= the row stride).
    pub cols: usize,
}

impl Shape {
    /// A `rows × cols` row-major shape.
    pub const fn new(rows: usize, cols: usize) -> Self {
        Self { rows, cols }
    }

    fn logical(self, op: Op) -> (usize, usize) {
        match op {
            Op::N => (self.rows, self.cols),
            Op::T => (self.cols, self.rows),
        }
    }

    fn strides(self, op: Op) -> (isize, isize) {
        let (r, c) = (self.cols as isize, 1);
        match op {
            Op::N => (r, c),
            Op::T => (c, r),
        }
    }
}

/// `C = alpha · op(A) · op(B) + beta · C` where `C` is row-major `m × n`.
///
/// # Panics
/// If the shapes disagree or a slice is shorter than its shape: a programming error of the
/// caller (the GCN wires fixed shapes), never a data-dependent condition.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    alpha: f32,
    a: &[f32],
    a_shape: Shape,
    op_a: Op,
    b: &[f32],
    b_shape: Shape,
    op_b: Op,
    beta: f32,
    c: &mut [f32],
    c_shape: Shape,
) {
    let (m, k) = a_shape.logical(op_a);
    let (k2, n) = b_shape.logical(op_b);
    assert_eq!(k, k2, "gemm: inner dimensions differ");
    assert_eq!((m, n), (c_shape.rows, c_shape.cols), "gemm: output shape");
    assert!(a.len() >= a_shape.rows * a_shape.cols, "gemm: A too short");
    assert!(b.len() >= b_shape.rows * b_shape.cols, "gemm: B too short");
    assert!(c.len() >= m * n, "gemm: C too short");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // matrixmultiply handles k = 0 as C = beta·C; keep beta = 0 NaN-safe explicitly.
        for v in &mut c[..m * n] {
            *v = if beta == 0.0 { 0.0 } else { beta * *v };
        }
        return;
    }
    let (rsa, csa) = a_shape.strides(op_a);
    let (rsb, csb) = b_shape.strides(op_b);
    // SAFETY: the assertions above guarantee that every index matrixmultiply touches,
    // `i·rs + j·cs` for i < rows and j < cols of each logical operand, lies inside the slices;
    // `c` is exclusively borrowed and does not alias `a` or `b` (distinct borrows).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], sa: Shape, oa: Op, b: &[f32], sb: Shape, ob: Op) -> Vec<f32> {
        let at = |i: usize, j: usize| match oa {
            Op::N => a[i * sa.cols + j],
            Op::T => a[j * sa.cols + i],
        };
        let bt = |i: usize, j: usize| match ob {
            Op::N => b[i * sb.cols + j],
            Op::T => b[j * sb.cols + i],
        };
        let (m, k) = sa.logical(oa);
        let (_, n) = sb.logical(ob);
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
            }
        }
        c
    }

    #[test]
    fn all_transpose_combinations_match_naive() {
        let a: Vec<f32> = (0..12).map(|v| v as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..12).map(|v| (v as f32).sin()).collect();
        for (sa, oa, sb, ob) in [
            (Shape::new(3, 4), Op::N, Shape::new(4, 3), Op::N),
            (Shape::new(4, 3), Op::T, Shape::new(4, 3), Op::N),
            (Shape::new(3, 4), Op::N, Shape::new(3, 4), Op::T),
            (Shape::new(4, 3), Op::T, Shape::new(3, 4), Op::T),
        ] {
            let want = naive(&a, sa, oa, &b, sb, ob);
            let (m, _) = sa.logical(oa);
            let (_, n) = sb.logical(ob);
            let mut c = vec![f32::NAN; m * n];
            gemm(1.0, &a, sa, oa, &b, sb, ob, 0.0, &mut c, Shape::new(m, n));
            for (x, y) in c.iter().zip(&want) {
                assert!((x - y).abs() < 1e-5, "{x} vs {y}");
            }
        }
    }

    #[test]
    fn beta_accumulates_and_empty_inner_dimension_scales() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, 4.0];
        let mut c = [10.0f32];
        gemm(
            1.0,
            &a,
            Shape::new(1, 2),
            Op::N,
            &b,
            Shape::new(2, 1),
            Op::N,
            1.0,
            &mut c,
            Shape::new(1, 1),
        );
        assert_eq!(c[0], 21.0);
        let mut c = [f32::NAN, f32::NAN];
        gemm(
            1.0,
            &[],
            Shape::new(2, 0),
            Op::N,
            &[],
            Shape::new(0, 1),
            Op::N,
            0.0,
            &mut c,
            Shape::new(2, 1),
        );
        assert_eq!(c, [0.0, 0.0]);
    }
}
