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

/// `C += Aᵀ · B` for an `rows × k` block `A` of a row-major matrix whose rows are `lda` apart
/// (`A` starts at `a[0]`), a row-major `rows × m` `B` and a row-major `k × m` `C`: one
/// reduction block of a weight gradient, added to a slice of its rows.
///
/// Each element is `C + (the product over the block)`, the same bits as computing the block's
/// product on its own and adding it to `C` (the kernel scales `C` by β = 1, exactly).
///
/// # Panics
/// If `k > lda` or a slice is shorter than its shape (a programming error of the caller).
pub fn gemm_tn_acc(
    a: &[f32],
    lda: usize,
    rows: usize,
    k: usize,
    b: &[f32],
    m: usize,
    c: &mut [f32],
) {
    if rows == 0 || k == 0 || m == 0 {
        return;
    }
    assert!(k <= lda, "gemm_tn_acc: block wider than its rows");
    assert!(a.len() >= (rows - 1) * lda + k, "gemm_tn_acc: A too short");
    assert!(b.len() >= rows * m, "gemm_tn_acc: B too short");
    assert!(c.len() >= k * m, "gemm_tn_acc: C too short");
    let (lda, m_stride) = (lda as isize, m as isize);
    // SAFETY: the assertions above bound every index touched: Aᵀ's element (i, r) is
    // `a[i + r·lda]` for i < k, r < rows, at most `(rows−1)·lda + k − 1`; B's (r, j) is
    // `b[r·m + j]` < rows·m; C's (i, j) is `c[i·m + j]` < k·m. `c` is exclusively borrowed and
    // does not alias `a` or `b`.
    unsafe {
        matrixmultiply::sgemm(
            k,
            rows,
            m,
            1.0,
            a.as_ptr(),
            1,
            lda,
            b.as_ptr(),
            m_stride,
            1,
            1.0,
            c.as_mut_ptr(),
            m_stride,
            1,
        );
    }
}

/// `matrixmultiply`'s depth of one pass over k (its `S_KC` for sgemm): a product's element is
/// the sum of one fused multiply-add chain per pass, the passes added in order.
pub(crate) const KC: usize = 256;

/// Calls `x86::$avx512::<M>(args…)` or `x86::$avx2::<M>(args…)` (functions of the calling
/// module, generic over the output width `M`, compiled for AVX-512F + FMA and for AVX2 + FMA)
/// for the narrow width `$m` (8, 16, 24, else 32): the AVX-512 build where the CPU has AVX-512F.
/// Only for callers that checked [`narrow_applies`] for `$m` (which detected AVX2 and FMA).
macro_rules! narrow_dispatch {
    ($m:expr, $avx512:ident, $avx2:ident, ($($arg:expr),* $(,)?)) => {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected just above, and FMA by `narrow_applies`, which
            // the caller checked.
            unsafe {
                match $m {
                    8 => x86::$avx512::<8>($($arg),*),
                    16 => x86::$avx512::<16>($($arg),*),
                    24 => x86::$avx512::<24>($($arg),*),
                    _ => x86::$avx512::<32>($($arg),*),
                }
            }
        } else {
            // SAFETY: `narrow_applies`, which the caller checked, detected AVX2 and FMA.
            unsafe {
                match $m {
                    8 => x86::$avx2::<8>($($arg),*),
                    16 => x86::$avx2::<16>($($arg),*),
                    24 => x86::$avx2::<24>($($arg),*),
                    _ => x86::$avx2::<32>($($arg),*),
                }
            }
        }
    };
}
pub(crate) use narrow_dispatch;

/// Whether [`narrow_rows`] can compute `A (rows × k) · W (k × m)` here with the bits of
/// [`gemm`]: `W` stored as is, `m` one to four vectors of 8 lanes, `k` deep enough for streaming
/// the rows of `A` to beat packing them, and `matrixmultiply` using a fused multiply-add kernel
/// on this CPU (its AVX-512 or FMA kernel), as `narrow_rows` does.
pub fn narrow_applies(k: usize, m: usize, op_w: Op) -> bool {
    op_w == Op::N && k >= 128 && m.is_multiple_of(8) && (8..=32).contains(&m) && fma_available()
}

fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C = A · W` for a row-major `rows × k` `A`, a row-major `k × m` `W` and a row-major
/// `rows × m` `C`, one row of `A` at a time against `W` held in cache, with the bits of
/// [`gemm`] (the caller checks [`narrow_applies`]): each element is one fused multiply-add chain
/// over each pass of [`KC`] values of k, from zero, and the passes are added in order, as
/// `matrixmultiply`'s FMA kernels compute it. Zeros of `A` (bag-of-words features are mostly
/// zeros) are skipped when `W` is finite (`w_finite`, which the caller checks once for all its
/// blocks: a false claim changes NaN propagation, never memory safety): a chain that starts at
/// +0 never holds −0, so adding `0 · w = ±0` leaves it unchanged, and skipping it changes no
/// bit.
///
/// # Panics
/// If the shapes do not hold or [`narrow_applies`] is false.
pub fn narrow_rows(
    a: &[f32],
    rows: usize,
    k: usize,
    w: &[f32],
    m: usize,
    c: &mut [f32],
    w_finite: bool,
) {
    assert!(
        narrow_applies(k, m, Op::N),
        "narrow_rows: shape not supported"
    );
    assert!(a.len() >= rows * k, "narrow_rows: A too short");
    assert!(w.len() >= k * m, "narrow_rows: W too short");
    assert!(c.len() >= rows * m, "narrow_rows: C too short");
    let (a, w, c) = (&a[..rows * k], &w[..k * m], &mut c[..rows * m]);
    let skip = w_finite;
    #[cfg(target_arch = "x86_64")]
    narrow_dispatch!(m, narrow_avx512, narrow_avx2, (a, k, w, c, skip));
}

/// The body of [`narrow_rows`] for `M` output columns, compiled into each instruction set's
/// function below (`mul_add` is then one fused instruction per lane).
#[inline(always)]
fn narrow_body<const M: usize>(a: &[f32], k: usize, w: &[f32], c: &mut [f32], skip: bool) {
    for (x, out) in a.chunks_exact(k).zip(c.chunks_exact_mut(M)) {
        let mut total = [0.0f32; M];
        for (pass, xs) in x.chunks(KC).enumerate() {
            let base = pass * KC;
            let mut acc = [0.0f32; M];
            for (g, group) in xs.chunks(16).enumerate() {
                if skip {
                    // The non-zeros of 16 values as bits, visited in order: most groups of a
                    // sparse row have none.
                    let mut bits = nonzero_bits(group);
                    while bits != 0 {
                        let i = bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        let xv = group[i];
                        let row = &w[(base + g * 16 + i) * M..][..M];
                        for (s, &wv) in acc.iter_mut().zip(row) {
                            *s = xv.mul_add(wv, *s);
                        }
                    }
                } else {
                    for (i, &xv) in group.iter().enumerate() {
                        let row = &w[(base + g * 16 + i) * M..][..M];
                        for (s, &wv) in acc.iter_mut().zip(row) {
                            *s = xv.mul_add(wv, *s);
                        }
                    }
                }
            }
            if pass == 0 {
                total = acc;
            } else {
                total.iter_mut().zip(&acc).for_each(|(t, &v)| *t += v);
            }
        }
        out.copy_from_slice(&total);
    }
}

/// [`gemm_tn_acc`] with the bits of it, for `m` that [`narrow_applies`] to (`k` any): rows of
/// `A` streamed against rows of `B`, each pass of [`KC`] rows summed from zero into a scratch
/// block of `C`'s rows and then added to `C`, as `matrixmultiply`'s FMA kernels do with β = 1.
/// Zeros of `A` are skipped when `B` is finite (see [`narrow_rows`]).
///
/// # Panics
/// As [`gemm_tn_acc`], or if `m` is not one [`narrow_applies`] to.
pub fn narrow_tn_acc(
    a: &[f32],
    lda: usize,
    rows: usize,
    k: usize,
    b: &[f32],
    m: usize,
    c: &mut [f32],
) {
    if rows == 0 || k == 0 {
        return;
    }
    assert!(
        narrow_applies(KC, m, Op::N),
        "narrow_tn_acc: width not supported"
    );
    assert!(k <= lda, "narrow_tn_acc: block wider than its rows");
    assert!(
        a.len() >= (rows - 1) * lda + k,
        "narrow_tn_acc: A too short"
    );
    assert!(b.len() >= rows * m, "narrow_tn_acc: B too short");
    assert!(c.len() >= k * m, "narrow_tn_acc: C too short");
    let (b, c) = (&b[..rows * m], &mut c[..k * m]);
    let skip = b.iter().all(|v| v.is_finite());
    #[cfg(target_arch = "x86_64")]
    narrow_dispatch!(
        m,
        narrow_tn_avx512,
        narrow_tn_avx2,
        (a, lda, rows, b, c, skip)
    );
}

/// Bit `i` set for each `group[i]` (at most 16) that is not ±0 (NaN included).
#[inline(always)]
fn nonzero_bits(group: &[f32]) -> u32 {
    group
        .iter()
        .enumerate()
        .fold(0, |bits, (i, &v)| bits | (u32::from(v != 0.0) << i))
}

/// Whether [`skinny_rows`] and [`skinny_tn`] compute these products here with the bits of
/// [`gemm`]: the shapes of hidden layers (`m` a multiple of 8 up to 64, `k` at most one
/// pass of [`KC`]) on a CPU where `matrixmultiply` uses a fused multiply-add kernel, as they do.
/// Packing a tall operand costs as much as the product at these widths; streaming its rows
/// through register tiles does not pack at all. Wider inputs (a first layer over many features)
/// stay with `matrixmultiply` or [`narrow_rows`], which are also the fast paths of unoptimised
/// (test) builds.
pub fn skinny_applies(k: usize, m: usize) -> bool {
    (1..=KC).contains(&k) && m.is_multiple_of(8) && (8..=64).contains(&m) && fma_available()
}

/// `C = A · W` for a row-major `rows × k` `A`, a row-major `k × m` `W` and a row-major
/// `rows × m` `C`, with the bits of [`gemm`] (the caller checks [`skinny_applies`]): each
/// element is one fused multiply-add chain over k from zero (k is one pass of [`KC`]), as
/// `matrixmultiply`'s FMA kernels compute it. Several rows share each load of a row of `W` (a
/// register tile of rows × m), so the product runs at the FMA units' rate without packing `A`.
///
/// # Panics
/// If the shapes do not hold or [`skinny_applies`] is false.
pub fn skinny_rows(a: &[f32], rows: usize, k: usize, w: &[f32], m: usize, c: &mut [f32]) {
    assert!(skinny_applies(k, m), "skinny_rows: shape not supported");
    assert!(a.len() >= rows * k, "skinny_rows: A too short");
    assert!(w.len() >= k * m, "skinny_rows: W too short");
    assert!(c.len() >= rows * m, "skinny_rows: C too short");
    let (a, w, c) = (&a[..rows * k], &w[..k * m], &mut c[..rows * m]);
    #[cfg(target_arch = "x86_64")]
    skinny_isa(std::is_x86_feature_detected!("avx512f"), a, k, w, m, c);
}

/// Calls `x86::$avx512::<M, R>(args…)` or `x86::$avx2::<M, R>(args…)` for the width `$m`
/// (a multiple of 8 up to 64, which [`skinny_applies`] checked with FMA and AVX2): `R`
/// rows (or columns) of the output per register tile, as many as keep the tile's `R · M`
/// accumulators in registers with room for the loads (16 of AVX-512's 32 registers, 12 of
/// AVX2's 16). `$avx512` says whether the caller detected AVX-512F.
macro_rules! skinny_dispatch {
    ($is512:expr, $m:expr, $avx512:ident, $avx2:ident, ($($arg:expr),* $(,)?)) => {
        if $is512 {
            // SAFETY: the caller detected AVX-512F, and FMA by `skinny_applies`.
            unsafe {
                match $m {
                    // One 8-lane vector per row: the AVX2 build's tile (AVX-512F implies AVX2).
                    8 => x86::$avx2::<8, 8>($($arg),*),
                    16 => x86::$avx512::<16, 8>($($arg),*),
                    24 => x86::$avx512::<24, 6>($($arg),*),
                    32 => x86::$avx512::<32, 6>($($arg),*),
                    40 => x86::$avx512::<40, 4>($($arg),*),
                    48 => x86::$avx512::<48, 4>($($arg),*),
                    56 => x86::$avx512::<56, 4>($($arg),*),
                    _ => x86::$avx512::<64, 4>($($arg),*),
                }
            }
        } else {
            // SAFETY: `skinny_applies` detected AVX2 and FMA.
            unsafe {
                match $m {
                    8 => x86::$avx2::<8, 8>($($arg),*),
                    16 => x86::$avx2::<16, 6>($($arg),*),
                    24 => x86::$avx2::<24, 4>($($arg),*),
                    32 => x86::$avx2::<32, 3>($($arg),*),
                    40 => x86::$avx2::<40, 2>($($arg),*),
                    48 => x86::$avx2::<48, 2>($($arg),*),
                    56 => x86::$avx2::<56, 1>($($arg),*),
                    _ => x86::$avx2::<64, 1>($($arg),*),
                }
            }
        }
    };
}

/// [`skinny_rows`] on the AVX-512 build (`avx512`, which the caller detected) or the AVX2 one.
#[cfg(target_arch = "x86_64")]
fn skinny_isa(avx512: bool, a: &[f32], k: usize, w: &[f32], m: usize, c: &mut [f32]) {
    skinny_dispatch!(avx512, m, skinny_avx512, skinny_avx2, (a, k, w, c));
}

/// Whether [`skinny_tn`] is the faster way to a weight gradient of these widths here: as
/// [`skinny_applies`], for 64 columns only. Narrower gradients (a GCN's 16 and 8) compiled into
/// gathers over the tile and ran 2.5× slower than `matrixmultiply` on RMAT-18 (AMD EPYC).
pub fn skinny_tn_applies(k: usize, m: usize) -> bool {
    m == 64 && skinny_applies(k, m)
}

/// `C = Aᵀ · B` (`k × m`) for a row-major `rows × k` `A` and a row-major `rows × m` `B`: a
/// block of a weight gradient, with the bits of [`gemm`] with `β = 0` (the caller checks
/// [`skinny_applies`]): each element is one fused multiply-add chain over each pass of [`KC`]
/// rows, from zero, the passes added in order. Register tiles of `C` (a few of its rows × m)
/// are summed over a pass's rows, which stay in cache for every tile; no operand is packed.
///
/// # Panics
/// If the shapes do not hold or [`skinny_applies`] is false.
pub fn skinny_tn(a: &[f32], k: usize, rows: usize, b: &[f32], m: usize, c: &mut [f32]) {
    assert!(skinny_applies(k, m), "skinny_tn: shape not supported");
    assert!(a.len() >= rows * k, "skinny_tn: A too short");
    assert!(b.len() >= rows * m, "skinny_tn: B too short");
    assert!(c.len() >= k * m, "skinny_tn: C too short");
    let (a, b, c) = (&a[..rows * k], &b[..rows * m], &mut c[..k * m]);
    if rows == 0 {
        c.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    skinny_tn_isa(std::is_x86_feature_detected!("avx512f"), a, k, b, c);
}

/// [`skinny_tn`] on the AVX-512 build (`avx512`, which the caller detected) or the AVX2 one.
#[cfg(target_arch = "x86_64")]
fn skinny_tn_isa(avx512: bool, a: &[f32], k: usize, b: &[f32], c: &mut [f32]) {
    let m = c.len() / k;
    skinny_dispatch!(avx512, m, skinny_tn_avx512, skinny_tn_avx2, (a, k, b, c));
}

/// The body of [`skinny_tn`] for `M` columns in tiles of `R` rows of `C` (its last rows one by
/// one).
#[inline(always)]
fn skinny_tn_body<const M: usize, const R: usize>(a: &[f32], k: usize, b: &[f32], c: &mut [f32]) {
    let rows = b.len() / M;
    let tiled = k / R * R;
    for (pass, r0) in (0..rows).step_by(KC).enumerate() {
        let r1 = rows.min(r0 + KC);
        for k0 in (0..tiled).step_by(R) {
            let mut acc = [[0.0f32; M]; R];
            for r in r0..r1 {
                let brow: &[f32; M] = b[r * M..][..M].try_into().expect("M values");
                let x = &a[r * k + k0..][..R];
                for (row, &xv) in acc.iter_mut().zip(x) {
                    for (s, &bv) in row.iter_mut().zip(brow) {
                        *s = xv.mul_add(bv, *s);
                    }
                }
            }
            for (crow, arow) in c[k0 * M..(k0 + R) * M].chunks_exact_mut(M).zip(&acc) {
                add_pass(pass, crow, arow);
            }
        }
        for kk in tiled..k {
            let mut acc = [0.0f32; M];
            for r in r0..r1 {
                let brow: &[f32; M] = b[r * M..][..M].try_into().expect("M values");
                let xv = a[r * k + kk];
                for (s, &bv) in acc.iter_mut().zip(brow) {
                    *s = xv.mul_add(bv, *s);
                }
            }
            add_pass(pass, &mut c[kk * M..(kk + 1) * M], &acc);
        }
    }
}

/// Pass `pass` of a product's chains into `c`: the first pass is written, later ones added.
#[inline(always)]
fn add_pass(pass: usize, c: &mut [f32], acc: &[f32]) {
    if pass == 0 {
        c.copy_from_slice(acc);
    } else {
        c.iter_mut().zip(acc).for_each(|(c, &v)| *c += v);
    }
}

/// The body of [`skinny_rows`] for `M` output columns in tiles of `R` rows (the last rows of
/// `A` one by one), compiled into each instruction set's function below.
#[inline(always)]
fn skinny_body<const M: usize, const R: usize>(a: &[f32], k: usize, w: &[f32], c: &mut [f32]) {
    let rows = c.len() / M;
    let tiled = rows / R * R;
    let (head, tail) = c.split_at_mut(tiled * M);
    for (t, out) in head.chunks_exact_mut(R * M).enumerate() {
        let x = &a[t * R * k..][..R * k];
        let mut acc = [[0.0f32; M]; R];
        for kk in 0..k {
            let wrow: &[f32; M] = w[kk * M..][..M].try_into().expect("M values");
            for (r, row) in acc.iter_mut().enumerate() {
                let xv = x[r * k + kk];
                for (s, &wv) in row.iter_mut().zip(wrow) {
                    *s = xv.mul_add(wv, *s);
                }
            }
        }
        for (o, t) in out.chunks_exact_mut(M).zip(&acc) {
            o.copy_from_slice(t);
        }
    }
    narrow_body::<M>(&a[tiled * k..], k, w, tail, false);
}

/// Rows of `C` one scratch block of [`narrow_tn_body`] holds.
const TN_SLAB: usize = 64;

#[inline(always)]
fn narrow_tn_body<const M: usize>(
    a: &[f32],
    lda: usize,
    rows: usize,
    b: &[f32],
    c: &mut [f32],
    skip: bool,
) {
    let mut acc = [[0.0f32; M]; TN_SLAB];
    for (slab, cs) in c.chunks_mut(TN_SLAB * M).enumerate() {
        let (k0, kk) = (slab * TN_SLAB, cs.len() / M);
        for p0 in (0..rows).step_by(KC) {
            acc[..kk].iter_mut().for_each(|r| *r = [0.0; M]);
            for r in p0..rows.min(p0 + KC) {
                let x = &a[r * lda + k0..][..kk];
                let brow: &[f32; M] = b[r * M..][..M].try_into().expect("M values");
                for (g, group) in x.chunks(16).enumerate() {
                    let mut bits = if skip {
                        nonzero_bits(group)
                    } else {
                        (1u32 << group.len()) - 1
                    };
                    while bits != 0 {
                        let i = bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        let xv = group[i];
                        for (s, &bv) in acc[g * 16 + i].iter_mut().zip(brow) {
                            *s = xv.mul_add(bv, *s);
                        }
                    }
                }
            }
            for (crow, arow) in cs.chunks_exact_mut(M).zip(&acc[..kk]) {
                crow.iter_mut().zip(arow).for_each(|(c, &v)| *c += v);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{narrow_body, narrow_tn_body, skinny_body, skinny_tn_body};

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn skinny_tn_avx512<const M: usize, const R: usize>(
        a: &[f32],
        k: usize,
        b: &[f32],
        c: &mut [f32],
    ) {
        skinny_tn_body::<M, R>(a, k, b, c);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn skinny_tn_avx2<const M: usize, const R: usize>(
        a: &[f32],
        k: usize,
        b: &[f32],
        c: &mut [f32],
    ) {
        skinny_tn_body::<M, R>(a, k, b, c);
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn skinny_avx512<const M: usize, const R: usize>(
        a: &[f32],
        k: usize,
        w: &[f32],
        c: &mut [f32],
    ) {
        skinny_body::<M, R>(a, k, w, c);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn skinny_avx2<const M: usize, const R: usize>(
        a: &[f32],
        k: usize,
        w: &[f32],
        c: &mut [f32],
    ) {
        skinny_body::<M, R>(a, k, w, c);
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn narrow_tn_avx512<const M: usize>(
        a: &[f32],
        lda: usize,
        rows: usize,
        b: &[f32],
        c: &mut [f32],
        skip: bool,
    ) {
        narrow_tn_body::<M>(a, lda, rows, b, c, skip);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn narrow_tn_avx2<const M: usize>(
        a: &[f32],
        lda: usize,
        rows: usize,
        b: &[f32],
        c: &mut [f32],
        skip: bool,
    ) {
        narrow_tn_body::<M>(a, lda, rows, b, c, skip);
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn narrow_avx512<const M: usize>(
        a: &[f32],
        k: usize,
        w: &[f32],
        c: &mut [f32],
        skip: bool,
    ) {
        narrow_body::<M>(a, k, w, c, skip);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn narrow_avx2<const M: usize>(
        a: &[f32],
        k: usize,
        w: &[f32],
        c: &mut [f32],
        skip: bool,
    ) {
        narrow_body::<M>(a, k, w, c, skip);
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
    fn narrow_rows_has_the_bits_of_gemm_on_dense_and_sparse_rows() {
        let (rows, k) = (37, 1433);
        for m in [8, 16, 24, 32] {
            if !narrow_applies(k, m, Op::N) {
                return;
            }
            let w: Vec<f32> = (0..k * m)
                .map(|i| ((i * 7919) % 1000) as f32 / 700.0 - 0.7)
                .collect();
            for density in [1, 3, 100] {
                // Every `density`-th value non-zero, some of them −0 or tiny.
                let a: Vec<f32> = (0..rows * k)
                    .map(|i| match (i * 2_654_435_761) % 997 % density {
                        0 if i % 13 == 0 => -0.0,
                        0 => ((i * 31) % 101) as f32 / 37.0 - 1.3,
                        _ => 0.0,
                    })
                    .collect();
                let mut want = vec![f32::NAN; rows * m];
                gemm(
                    1.0,
                    &a,
                    Shape::new(rows, k),
                    Op::N,
                    &w,
                    Shape::new(k, m),
                    Op::N,
                    0.0,
                    &mut want,
                    Shape::new(rows, m),
                );
                let mut got = vec![f32::NAN; rows * m];
                narrow_rows(&a, rows, k, &w, m, &mut got, true);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "m {m}, density 1/{density}");
            }
        }
    }

    #[test]
    fn skinny_rows_has_the_bits_of_gemm() {
        // 37 rows: whole tiles and a remainder for every tile height.
        let rows = 37;
        assert!(!skinny_applies(KC + 1, 64), "one pass of KC at most");
        for k in [1, 7, 64, KC] {
            for m in (8..=64).step_by(8) {
                if !skinny_applies(k, m) {
                    return;
                }
                let w: Vec<f32> = (0..k * m)
                    .map(|i| ((i * 7919) % 1000) as f32 / 700.0 - 0.7)
                    .collect();
                let a: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 31) % 101) as f32 / 37.0 - 1.3)
                    .collect();
                let mut want = vec![f32::NAN; rows * m];
                gemm(
                    1.0,
                    &a,
                    Shape::new(rows, k),
                    Op::N,
                    &w,
                    Shape::new(k, m),
                    Op::N,
                    0.0,
                    &mut want,
                    Shape::new(rows, m),
                );
                let mut got = vec![f32::NAN; rows * m];
                skinny_rows(&a, rows, k, &w, m, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "k {k}, m {m}");
                // The AVX2 build too, where this CPU has AVX-512.
                got.fill(f32::NAN);
                skinny_isa(false, &a, k, &w, m, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "AVX2: k {k}, m {m}");
            }
        }
    }

    #[test]
    fn skinny_tn_has_the_bits_of_gemm() {
        // 600 rows: three passes of KC; widths with whole tiles and remainders.
        let rows = 600;
        for k in [1, 7, 64, 70] {
            for m in (8..=64).step_by(8) {
                if !skinny_applies(k, m) {
                    return;
                }
                let a: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 31) % 101) as f32 / 37.0 - 1.3)
                    .collect();
                let b: Vec<f32> = (0..rows * m)
                    .map(|i| ((i * 7919) % 1000) as f32 / 700.0 - 0.7)
                    .collect();
                let mut want = vec![f32::NAN; k * m];
                gemm(
                    1.0,
                    &a,
                    Shape::new(rows, k),
                    Op::T,
                    &b,
                    Shape::new(rows, m),
                    Op::N,
                    0.0,
                    &mut want,
                    Shape::new(k, m),
                );
                for avx512 in [true, false] {
                    if avx512 && !std::is_x86_feature_detected!("avx512f") {
                        continue;
                    }
                    let mut got = vec![f32::NAN; k * m];
                    skinny_tn_isa(avx512, &a, k, &b, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "k {k}, m {m}, AVX-512 {avx512}");
                }
            }
        }
    }

    #[test]
    fn narrow_tn_acc_has_the_bits_of_gemm_tn_acc() {
        // 600 rows: three passes of KC; a block of 150 of 1433 columns at column 40.
        let (rows, lda, k0, k) = (600, 1433, 40, 150);
        for m in [8, 16, 32] {
            if !narrow_applies(KC, m, Op::N) {
                return;
            }
            let b: Vec<f32> = (0..rows * m)
                .map(|i| ((i * 7919) % 1000) as f32 / 700.0 - 0.7)
                .collect();
            for density in [1, 50] {
                let a: Vec<f32> = (0..rows * lda)
                    .map(|i| match (i * 2_654_435_761) % 997 % density {
                        0 if i % 13 == 0 => -0.0,
                        0 => ((i * 31) % 101) as f32 / 37.0 - 1.3,
                        _ => 0.0,
                    })
                    .collect();
                let start: Vec<f32> = (0..k * m).map(|i| (i % 17) as f32 * 0.125 - 1.0).collect();
                let (mut want, mut got) = (start.clone(), start);
                gemm_tn_acc(&a[k0..], lda, rows, k, &b, m, &mut want);
                narrow_tn_acc(&a[k0..], lda, rows, k, &b, m, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "m {m}, density 1/{density}");
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
