//! The first layer's input as sparse rows. Bag-of-words features are mostly zeros (Cora's
//! 2708 × 1433 are 98.7 % zeros); read densely, an epoch's first layer streams the whole
//! matrix four times (dropout reads and writes it, the training and evaluation products and
//! the weight gradient read it), about 77 MB on Cora for 49 k non-zeros. Held here as CSR
//! (with the transposed structure for the weight gradient), the epoch's first layer touches
//! the non-zeros only: the dropout decisions of the stored entries, fused into the product
//! `X·W`, and `Xᵀ·B` column by column.
//!
//! Both products give **the bits of the dense path** (`par::gemm_rows` / `par::gemm_tn_sum`
//! over the dense dropped input): each element is the same fused multiply-add chains in the
//! same order. Forward, one chain per pass of [`KC`] columns from zero, the passes added in
//! order (`dense::narrow_rows`); backward, one chain per pass of [`KC`] rows from zero, the
//! passes of a reduction block added in order, the blocks added in order from zero
//! (`par::gemm_tn_sum`). The zeros the dense path adds are `0 · w = ±0`, which never change a
//! chain that starts at +0 (it never holds −0) — as long as the other operand is finite; when
//! it is not, the caller takes the dense path (see [`SparseInput::product`] and
//! [`SparseInput::tn_sum`]), so a NaN spreads exactly as it would there.
//!
//! Used only where the dense path's narrow kernels apply (`dense::narrow_applies`: an output
//! 8–32 wide and fused multiply-add on this CPU), so that the chains are the same; and only when
//! at most one entry in [`MAX_DENSITY`] is non-zero.

#[cfg(target_arch = "x86_64")]
use super::dense::narrow_dispatch;
use super::dense::{narrow_applies, Op, KC};
use super::dropout::DropoutKey;
use super::par::{self, Product};
use anyhow::Result;
use std::ops::Range;

/// The sparse path is taken when at most one entry in this many is non-zero. At higher
/// densities the dense path's vectorised mask and streaming win over the sparse path's
/// per-entry column indices.
pub const MAX_DENSITY: usize = 8;

/// Entries (stored values plus rows or columns) a parallel task of the products takes at
/// least.
const GRAIN: usize = 4096;

/// The non-zeros of a `rows × k` row-major matrix, by row (CSR) and by column, with the values
/// of this step's dropout.
#[derive(Debug)]
pub struct SparseInput {
    /// Address and length of the dense matrix this was built from (rebuilt if it changes).
    source: (usize, usize),
    rows: usize,
    k: usize,
    /// Row `r`'s entries are `ptr[r]..ptr[r + 1]` of `cols` / `vals` / `kept`.
    ptr: Vec<usize>,
    cols: Vec<u32>,
    vals: Vec<f32>,
    /// The stored entries after the last training product's dropout (kept ones scaled, dropped
    /// ones 0), in CSR order.
    kept: Vec<f32>,
    /// Column `c`'s entries are `col_ptr[c]..col_ptr[c + 1]` of `col_rows` / `col_pos`, in row
    /// order; `col_pos` is the entry's CSR position.
    col_ptr: Vec<usize>,
    col_rows: Vec<u32>,
    col_pos: Vec<usize>,
    /// The reduction block (`par::reduce_rows`) of each pass of [`KC`] rows.
    block_of_pass: Vec<u32>,
}

impl SparseInput {
    /// The non-zeros of the `rows × k` row-major `x`, or `None` when more than one entry in
    /// [`MAX_DENSITY`] is non-zero, or when the products of this layer (output `m` wide)
    /// cannot take the sparse path here (see the module documentation). A refused allocation
    /// is an error.
    pub fn build(x: &[f32], rows: usize, k: usize, m: usize) -> Result<Option<Self>> {
        let x = &x[..rows * k];
        if rows == 0
            || !narrow_applies(k, m, Op::N)
            || u32::try_from(k).is_err()
            || u32::try_from(rows).is_err()
        {
            return Ok(None);
        }
        use rayon::prelude::*;
        let counts: Vec<usize> = x
            .par_chunks(k)
            .map(|row| row.iter().filter(|&&v| v != 0.0).count())
            .collect();
        let nnz: usize = counts.iter().sum();
        if nnz > (rows * k) / MAX_DENSITY {
            return Ok(None);
        }
        let what = "the sparse first-layer input";
        let hint = "pass features with fewer non-zeros, or partition the graph into more parts";
        let filled = |len: usize| distspmm_sparse::memory::try_filled(len, 0usize, what, hint);
        let mut ptr = filled(rows + 1)?;
        for (r, c) in counts.iter().enumerate() {
            ptr[r + 1] = ptr[r] + c;
        }
        let mut cols = distspmm_sparse::memory::try_filled(nnz, 0u32, what, hint)?;
        let mut vals = distspmm_sparse::memory::try_filled(nnz, 0.0f32, what, hint)?;
        let mut col_ptr = filled(k + 1)?;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "k fits a u32 (checked above)"
        )]
        for (row, r) in x.chunks_exact(k).zip(ptr.windows(2)) {
            let mut at = r[0];
            for (c, &v) in row.iter().enumerate() {
                if v != 0.0 {
                    cols[at] = c as u32;
                    vals[at] = v;
                    col_ptr[c + 1] += 1;
                    at += 1;
                }
            }
        }
        for c in 0..k {
            col_ptr[c + 1] += col_ptr[c];
        }
        let passes_per_block = par::reduce_rows(rows) / KC;
        let mut block_of_pass =
            distspmm_sparse::memory::try_filled(rows.div_ceil(KC), 0u32, what, hint)?;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "fewer blocks than rows, which fit a u32"
        )]
        block_of_pass
            .iter_mut()
            .enumerate()
            .for_each(|(q, b)| *b = (q / passes_per_block) as u32);
        let mut col_rows = distspmm_sparse::memory::try_filled(nnz, 0u32, what, hint)?;
        let mut col_pos = filled(nnz)?;
        let mut next = col_ptr.clone();
        #[allow(
            clippy::cast_possible_truncation,
            reason = "rows fit a u32 (checked above)"
        )]
        for (r, at) in ptr.windows(2).enumerate() {
            for (pos, &c) in (at[0]..at[1]).zip(&cols[at[0]..at[1]]) {
                let c = c as usize;
                col_rows[next[c]] = r as u32;
                col_pos[next[c]] = pos;
                next[c] += 1;
            }
        }
        Ok(Some(Self {
            source: (x.as_ptr() as usize, x.len()),
            rows,
            k,
            ptr,
            cols,
            kept: distspmm_sparse::memory::try_filled(nnz, 0.0f32, what, hint)?,
            vals,
            col_ptr,
            col_rows,
            col_pos,
            block_of_pass,
        }))
    }

    /// Whether this was built from `x` (the same slice: the trainer's features do not move).
    pub fn built_from(&self, x: &[f32]) -> bool {
        self.source == (x.as_ptr() as usize, x.len())
    }

    /// Number of stored (non-zero) entries.
    pub fn nnz(&self) -> usize {
        self.cols.len()
    }

    /// `c = drop(X) · W` (`rows × m`, `W` row-major `k × m`, finite: the caller checks, see
    /// the module documentation), with `drop` this step's dropout when `dropout` is given (the
    /// row `r`'s mask is keyed on `ids[r]`; the kept values are kept for [`Self::tn_sum`]) and
    /// the identity otherwise. Rows run in parallel on the current rayon pool; the bits are
    /// those of the dense path.
    ///
    /// # Panics
    /// If `w`, `c` or `ids` is shorter than its shape.
    pub fn product(
        &mut self,
        dropout: Option<(&DropoutKey, &[u64])>,
        w: &[f32],
        m: usize,
        c: &mut [f32],
    ) {
        par::record(Product::SparseRows {
            n: self.rows,
            k: self.k,
            m,
            nnz: self.nnz(),
        });
        let (w, c) = (&w[..self.k * m], &mut c[..self.rows * m]);
        let grain = grain(self.nnz() + self.rows);
        let (ptr, cols, vals) = (&self.ptr[..], &self.cols[..], &self.vals[..]);
        let kept: &mut [f32] = match dropout {
            Some(_) => &mut self.kept,
            None => &mut [],
        };
        if let Some((_, ids)) = dropout {
            assert!(ids.len() >= self.rows, "sparse input: fewer ids than rows");
        }
        let leaf = |rows: Range<usize>, c: &mut [f32], kept: &mut [f32]| {
            let first = ptr[rows.start];
            let offsets = &ptr[rows.start..=rows.end];
            let Some((key, ids)) = dropout else {
                return rows_kernel(offsets, cols, (vals, 0), w, m, c);
            };
            for r in rows {
                let at = ptr[r]..ptr[r + 1];
                let k = &mut kept[at.start - first..at.end - first];
                key.row(ids[r]).apply_at(&cols[at.clone()], &vals[at], k);
            }
            rows_kernel(offsets, cols, (kept, first), w, m, c);
        };
        split_rows(ptr, 0..self.rows, grain, m, c, kept, &leaf);
    }

    /// `out = drop(X)ᵀ · b` (`k × m`) for the row-major `rows × m` `b`, with the values of the
    /// last training [`Self::product`], and the bits of `par::gemm_tn_sum` over the dense
    /// dropped input. Columns run in parallel on the current rayon pool. Returns `false`, and
    /// leaves `out` alone, when `b` is not finite: the dense path is then the one with the
    /// dense path's bits (see the module documentation).
    ///
    /// # Panics
    /// If `b` or `out` is shorter than its shape.
    pub fn tn_sum(&self, b: &[f32], m: usize, out: &mut [f32]) -> bool {
        let (b, out) = (&b[..self.rows * m], &mut out[..self.k * m]);
        if !b.iter().all(|v| v.is_finite()) {
            return false;
        }
        par::record(Product::SparseTnSum {
            n: self.rows,
            k: self.k,
            m,
            nnz: self.nnz(),
        });
        let grain = grain(self.nnz() + self.k);
        let (col_ptr, col_rows, col_pos, kept) = (
            &self.col_ptr[..],
            &self.col_rows[..],
            &self.col_pos[..],
            &self.kept[..],
        );
        let block_of_pass = &self.block_of_pass[..];
        let leaf = |cols: Range<usize>, out: &mut [f32], _: &mut [f32]| {
            let offsets = &col_ptr[cols.start..=cols.end];
            tn_kernel(offsets, col_rows, col_pos, kept, b, m, block_of_pass, out);
        };
        split_rows(col_ptr, 0..self.k, grain, m, out, &mut [], &leaf);
        true
    }

    /// Takes the stored values undropped as the values [`Self::tn_sum`] reads, as a training
    /// [`Self::product`] with a dropout of 0 would (the replay of the weight gradient in
    /// isolation).
    pub fn keep_all(&mut self) {
        self.kept.copy_from_slice(&self.vals);
    }

    /// Writes the values of the last training [`Self::product`] into the dense `rows × k`
    /// `dst` (zeros elsewhere): the dense path's input, for the step that must take it.
    ///
    /// # Panics
    /// If `dst` is shorter than its shape.
    pub fn densify_kept(&self, dst: &mut [f32]) {
        let dst = &mut dst[..self.rows * self.k];
        dst.fill(0.0);
        for (r, row) in dst.chunks_exact_mut(self.k).enumerate() {
            for pos in self.ptr[r]..self.ptr[r + 1] {
                row[self.cols[pos] as usize] = self.kept[pos];
            }
        }
    }
}

/// Least entries of a task when `total` are spread over the current pool: about eight tasks a
/// thread, at least [`GRAIN`].
fn grain(total: usize) -> usize {
    total
        .div_ceil(8 * rayon::current_num_threads().max(1))
        .max(GRAIN)
}

/// Runs `leaf(range, out_rows, side)` over pieces of `range` (rows of a CSR or columns of a
/// CSC whose offsets are `ptr`), each with its `m`-wide rows of `out` and, when `side` is not
/// empty, its entries of `side` (CSR order); pieces are halved at the entry midpoint with
/// `rayon::join` until they hold at most `grain` entries (stored values plus rows) or one row.
fn split_rows<F>(
    ptr: &[usize],
    range: Range<usize>,
    grain: usize,
    m: usize,
    out: &mut [f32],
    side: &mut [f32],
    leaf: &F,
) where
    F: Fn(Range<usize>, &mut [f32], &mut [f32]) + Sync,
{
    let (lo, hi) = (range.start, range.end);
    let entries = ptr[hi] - ptr[lo] + (hi - lo);
    if hi - lo <= 1 || entries <= grain {
        leaf(range, out, side);
        return;
    }
    // The first row at or past half the entries (values plus rows), strictly inside.
    let half = (ptr[lo] + lo + ptr[hi] + hi) / 2;
    let (mut a, mut b) = (lo + 1, hi - 1);
    while a < b {
        let c = (a + b) / 2;
        if ptr[c] + c < half {
            a = c + 1;
        } else {
            b = c;
        }
    }
    let mid = a;
    let (out_lo, out_hi) = out.split_at_mut((mid - lo) * m);
    let (side_lo, side_hi) = if side.is_empty() {
        (&mut [][..], &mut [][..])
    } else {
        side.split_at_mut(ptr[mid] - ptr[lo])
    };
    rayon::join(
        || split_rows(ptr, lo..mid, grain, m, out_lo, side_lo, leaf),
        || split_rows(ptr, mid..hi, grain, m, out_hi, side_hi, leaf),
    );
}

/// `out[i] = Σ_j v[j] · W[cols[j]]` over row `i`'s entries `offsets[i]..offsets[i + 1]` (`m`
/// wide; `v.0` holds the values from position `v.1` on), one chain per pass of [`KC`] columns
/// from zero, the passes added in order: `dense::narrow_rows`' bits.
fn rows_kernel(
    offsets: &[usize],
    cols: &[u32],
    v: (&[f32], usize),
    w: &[f32],
    m: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    narrow_dispatch!(m, rows_avx512, rows_avx2, (offsets, cols, v, w, out));
    #[cfg(not(target_arch = "x86_64"))]
    {
        // `narrow_applies` is false off x86_64, so no input is ever built there.
        let _ = (offsets, cols, v, w, m, out);
        unreachable!("the sparse input is built only where the narrow kernels apply");
    }
}

/// Adds `from` to `to` and clears `from` where `flush` holds, and adds +0 (which changes
/// nothing: `to` never holds −0) where it does not: a pass or block boundary without a branch,
/// which would be taken at random.
#[inline(always)]
fn flush_if<const M: usize>(flush: bool, from: &mut [f32; M], to: &mut [f32; M]) {
    for (f, t) in from.iter_mut().zip(to.iter_mut()) {
        let v = *f;
        *t += if flush { v } else { 0.0 };
        *f = if flush { 0.0 } else { v };
    }
}

/// The zeros of `v` (dropped entries) are multiplied like the others: `0 · w = ±0` added to a
/// chain changes nothing when `w` is finite (see the module documentation), and a test per
/// entry would be a branch taken at random.
#[inline(always)]
fn rows_body<const M: usize>(
    offsets: &[usize],
    cols: &[u32],
    (v, vbase): (&[f32], usize),
    w: &[f32],
    out: &mut [f32],
) {
    for (at, o) in offsets.windows(2).zip(out.chunks_exact_mut(M)) {
        let (mut total, mut acc, mut pass) = ([0.0f32; M], [0.0f32; M], 0);
        for (&c, &x) in cols[at[0]..at[1]]
            .iter()
            .zip(&v[at[0] - vbase..at[1] - vbase])
        {
            let c = c as usize;
            flush_if(c / KC != pass, &mut acc, &mut total);
            pass = c / KC;
            for (s, &wv) in acc.iter_mut().zip(&w[c * M..][..M]) {
                *s = x.mul_add(wv, *s);
            }
        }
        flush_if(true, &mut acc, &mut total);
        o.copy_from_slice(&total);
    }
}

/// `out[i] = Σ_r kept[pos_r] · b[r]` over column `i`'s entries `offsets[i]..offsets[i + 1]`
/// (their rows `rows`, CSR positions `pos`): one chain per pass of [`KC`] rows from zero, the
/// passes of each reduction block (`block_of_pass[pass]`) added in order, the blocks added in
/// order from zero: `par::gemm_tn_sum`'s bits (zeros multiplied like the others, see
/// [`rows_body`]).
#[allow(
    clippy::too_many_arguments,
    reason = "the transposed structure's three arrays, the operands and the block map"
)]
fn tn_kernel(
    offsets: &[usize],
    rows: &[u32],
    pos: &[usize],
    kept: &[f32],
    b: &[f32],
    m: usize,
    block_of_pass: &[u32],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    narrow_dispatch!(
        m,
        tn_avx512,
        tn_avx2,
        (offsets, rows, pos, kept, b, block_of_pass, out)
    );
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (offsets, rows, pos, kept, b, m, block_of_pass, out);
        unreachable!("the sparse input is built only where the narrow kernels apply");
    }
}

#[inline(always)]
fn tn_body<const M: usize>(
    offsets: &[usize],
    rows: &[u32],
    pos: &[usize],
    kept: &[f32],
    b: &[f32],
    block_of_pass: &[u32],
    out: &mut [f32],
) {
    for (at, o) in offsets.windows(2).zip(out.chunks_exact_mut(M)) {
        let (mut total, mut in_block, mut acc) = ([0.0f32; M], [0.0f32; M], [0.0f32; M]);
        let (mut pass, mut blk) = (0, 0);
        for (&r, &p) in rows[at[0]..at[1]].iter().zip(&pos[at[0]..at[1]]) {
            let (x, r) = (kept[p], r as usize);
            let (q, bq) = (r / KC, block_of_pass[r / KC]);
            flush_if(q != pass, &mut acc, &mut in_block);
            flush_if(bq != blk, &mut in_block, &mut total);
            (pass, blk) = (q, bq);
            for (s, &bv) in acc.iter_mut().zip(&b[r * M..][..M]) {
                *s = x.mul_add(bv, *s);
            }
        }
        flush_if(true, &mut acc, &mut in_block);
        flush_if(true, &mut in_block, &mut total);
        o.copy_from_slice(&total);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{rows_body, tn_body};

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn rows_avx512<const M: usize>(
        offsets: &[usize],
        cols: &[u32],
        v: (&[f32], usize),
        w: &[f32],
        out: &mut [f32],
    ) {
        rows_body::<M>(offsets, cols, v, w, out);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn rows_avx2<const M: usize>(
        offsets: &[usize],
        cols: &[u32],
        v: (&[f32], usize),
        w: &[f32],
        out: &mut [f32],
    ) {
        rows_body::<M>(offsets, cols, v, w, out);
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn tn_avx512<const M: usize>(
        offsets: &[usize],
        rows: &[u32],
        pos: &[usize],
        kept: &[f32],
        b: &[f32],
        block_of_pass: &[u32],
        out: &mut [f32],
    ) {
        tn_body::<M>(offsets, rows, pos, kept, b, block_of_pass, out);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tn_avx2<const M: usize>(
        offsets: &[usize],
        rows: &[u32],
        pos: &[usize],
        kept: &[f32],
        b: &[f32],
        block_of_pass: &[u32],
        out: &mut [f32],
    ) {
        tn_body::<M>(offsets, rows, pos, kept, b, block_of_pass, out);
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test shapes: every narrowing is exact"
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::model::testing::pool;

    /// A `rows × k` matrix with about `per_mille` ‰ non-zeros (a fixed hash of the index);
    /// values of both signs, some tiny.
    fn sparse_dense(rows: usize, k: usize, per_mille: u32, seed: u32) -> Vec<f32> {
        (0..rows * k)
            .map(|i| {
                let h = (i as u32 ^ seed)
                    .wrapping_mul(0x9E37_79B1)
                    .rotate_left(11)
                    .wrapping_mul(0x85EB_CA6B);
                if h % 1000 < per_mille {
                    ((h >> 10) % 2001) as f32 / 1000.0 - 1.0 + 1e-3
                } else {
                    0.0
                }
            })
            .collect()
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(0x2C1B_3C6D).rotate_left(7);
                (h >> 9) as f32 / (1u32 << 22) as f32 - 1.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn key(p: f32) -> DropoutKey {
        DropoutKey {
            seed: 9,
            epoch: 2,
            layer: 0,
            p,
        }
    }

    /// Both products against the dense path (`par::gemm_rows` and `par::gemm_tn_sum` over the
    /// dense dropped input), bit for bit, at 1 and 3 threads.
    /// Returns whether the sparse path applied (it needs FMA on this CPU).
    fn check(rows: usize, k: usize, m: usize, per_mille: u32, p: f32, seed: u32) -> bool {
        let x = sparse_dense(rows, k, per_mille, seed);
        let Some(mut sp) = SparseInput::build(&x, rows, k, m).unwrap() else {
            assert!(!narrow_applies(k, m, Op::N) || per_mille > 125);
            return false;
        };
        let ids: Vec<u64> = (0..rows as u64).map(|i| 3 * i + 17).collect();
        let w = values(k * m, seed + 1);
        let b = values(rows * m, seed + 2);
        let key = key(p);
        let mut dropped = vec![0.0; rows * k];
        key.apply(&ids, &x, k, 0..k, &mut dropped);
        let mut want_c = vec![0.0; rows * m];
        par::gemm_rows(
            &dropped,
            rows,
            k,
            &w,
            Op::N,
            m,
            &mut want_c,
            &mut [],
            0,
            |_, _, _| {},
        );
        let mut want_g = vec![0.0; k * m];
        par::gemm_tn_sum(&dropped, k, &b, m, rows, &mut want_g, &mut Vec::new());
        let mut want_eval = vec![0.0; rows * m];
        par::gemm_rows(
            &x,
            rows,
            k,
            &w,
            Op::N,
            m,
            &mut want_eval,
            &mut [],
            0,
            |_, _, _| {},
        );
        for threads in [1, 3] {
            pool(threads, || {
                let mut c = vec![f32::NAN; rows * m];
                sp.product(Some((&key, &ids)), &w, m, &mut c);
                assert_eq!(bits(&c), bits(&want_c), "product, {threads} threads");
                let mut g = vec![f32::NAN; k * m];
                assert!(sp.tn_sum(&b, m, &mut g));
                assert_eq!(
                    bits(&g),
                    bits(&want_g),
                    "weight gradient, {threads} threads"
                );
                let mut d = vec![f32::NAN; rows * k];
                sp.densify_kept(&mut d);
                assert_eq!(bits(&d), bits(&dropped), "the kept values");
                let mut e = vec![f32::NAN; rows * m];
                sp.product(None, &w, m, &mut e);
                assert_eq!(bits(&e), bits(&want_eval), "undropped product");
            });
        }
        true
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn both_products_have_the_dense_paths_bits(
            rows in 1usize..700,
            k in 128usize..700,
            m in prop_oneof![Just(8usize), Just(16), Just(24), Just(32)],
            per_mille in 0u32..125,
            p in prop_oneof![Just(0.0f32), Just(0.5), 0.05f32..0.95],
            seed in any::<u32>(),
        ) {
            check(rows, k, m, per_mille, p, seed);
        }
    }

    #[test]
    fn tall_inputs_sum_several_passes_per_reduction_block() {
        // 20 000 rows: reduction blocks of 512 rows, two passes each (the slots path).
        assert_eq!(par::reduce_rows(20_000), 512);
        let fma = narrow_applies(130, 8, Op::N);
        assert_eq!(check(20_000, 130, 8, 40, 0.5, 5), fma);
        // Empty rows, empty columns and a column of one entry.
        assert_eq!(check(300, 128, 16, 1, 0.5, 6), fma);
    }

    #[test]
    fn a_non_finite_gradient_is_left_to_the_dense_path() {
        let (rows, k, m) = (40, 128, 8);
        let x = sparse_dense(rows, k, 60, 1);
        let Some(sp) = SparseInput::build(&x, rows, k, m).unwrap() else {
            return;
        };
        let mut b = values(rows * m, 2);
        b[13] = f32::NAN;
        let mut out = vec![7.0; k * m];
        assert!(!sp.tn_sum(&b, m, &mut out));
        assert!(out.iter().all(|&v| v == 7.0), "out untouched");
    }

    #[test]
    fn dense_or_unsupported_inputs_stay_dense() {
        let (rows, k) = (50, 128);
        // One in 4 non-zero: too dense.
        let x = sparse_dense(rows, k, 250, 3);
        assert!(SparseInput::build(&x, rows, k, 16).unwrap().is_none());
        let x = sparse_dense(rows, k, 20, 3);
        // A 7-wide output (not a narrow kernel's width) and a shallow k.
        assert!(SparseInput::build(&x, rows, k, 7).unwrap().is_none());
        assert!(SparseInput::build(&x[..rows * 64], rows, 64, 16)
            .unwrap()
            .is_none());
        if narrow_applies(k, 16, Op::N) {
            let sp = SparseInput::build(&x, rows, k, 16).unwrap().unwrap();
            assert_eq!(sp.nnz(), x.iter().filter(|&&v| v != 0.0).count());
            assert!(sp.built_from(&x));
            assert!(!sp.built_from(&x.clone()));
        }
    }
}
