//! Hand-written AVX-512 `f32` pass: one output row's `w <= 256` feature columns live in up to
//! 16 `zmm` accumulators (the last one masked when `w` is not a multiple of 16), each non-zero
//! is one broadcast and `NV` fused multiply-adds from the gathered X row, and the X row
//! [`PREFETCH_DISTANCE`] non-zeros ahead is prefetched (across row boundaries, within the block).
//! Narrow passes (`w <= 32`) alternate two accumulator sets so the FMA latency does not bound them.

use core::arch::x86_64::{
    __m512, __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
};
use core::ops::Range;

use super::{prefetch, Operand, Pass};
use crate::sparse::DenseViewMut;

/// Lanes of a `zmm` register of `f32`.
const LANES: usize = 16;
/// Widest pass: 16 accumulators, leaving half the register file for loads and the broadcast.
const MAX_WIDTH: usize = 16 * LANES;
/// Non-zeros between a gather and the prefetch of its X row.
const PREFETCH_DISTANCE: usize = 8;

/// The pass width for `f` feature columns over an X of `x_rows` rows.
pub(crate) fn pass_width(f: usize, x_rows: usize) -> usize {
    let _ = x_rows;
    if f <= MAX_WIDTH {
        return f;
    }
    let passes = f.div_ceil(MAX_WIDTH);
    f.div_ceil(passes).next_multiple_of(LANES)
}

/// Runs `pass` over `rows` into `y`, whose row 0 is row `rows.start`.
///
/// # Safety
/// The CPU supports AVX-512F. `pass` satisfies the [`Pass`] invariants: the operand arrays obey
/// the [`crate::sparse::Compressed`] invariants with every index below `pass.x.rows()`,
/// `rows.end` is at most the operand's outer dimension, `0 < pass.w <= MAX_WIDTH`,
/// `pass.f0 + pass.w <= pass.x.cols()`, and `y` has `rows.len()` rows and at least
/// `pass.f0 + pass.w` columns.
pub(crate) unsafe fn pass(pass: &Pass<'_, f32>, rows: Range<usize>, y: DenseViewMut<'_, f32>) {
    macro_rules! dispatch {
        ($($nv:literal)*) => {
            match pass.w.div_ceil(LANES) {
                // SAFETY: forwarded contract; `NV` matches `w`.
                $($nv => unsafe { pass_nv::<$nv>(pass, rows, y) },)*
                _ => unreachable!("pass width {} exceeds {MAX_WIDTH}", pass.w),
            }
        };
    }
    dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
}

/// The pass with `NV = ceil(w / 16)` accumulators.
// Indexing the accumulator array by register number reads like the register allocation it is.
///
/// # Safety
/// As [`pass`], and `16 * (NV - 1) < pass.w <= 16 * NV`.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f")]
unsafe fn pass_nv<const NV: usize>(
    pass: &Pass<'_, f32>,
    rows: Range<usize>,
    mut y: DenseViewMut<'_, f32>,
) {
    let Operand {
        indptr,
        indices,
        data,
    } = pass.op;
    let (ldx, f0, w) = (pass.x.ld(), pass.f0, pass.w);
    let ldy = y.ld();
    let x = pass.x.as_slice().as_ptr().wrapping_add(f0);
    let yp = y.as_mut_slice().as_mut_ptr().wrapping_add(f0);
    let (idx, val) = (indices.as_ptr(), data.as_ptr());
    let tail: __mmask16 = (u32::MAX >> (32 - (w - LANES * (NV - 1)))) as __mmask16;
    let alpha = _mm512_set1_ps(pass.alpha);
    let beta = _mm512_set1_ps(pass.beta);
    let overwrite = pass.beta == 0.0;
    let dual = NV <= 2;
    let last = (indptr[rows.end] as usize).saturating_sub(1);

    // One non-zero: prefetch ahead, then acc += a · X[col, f0..f0 + w].
    let step = |k: usize, acc: &mut [__m512; NV]| {
        // SAFETY: `k` < the block's last offset + 1 <= nnz, so `k` and the clamped prefetch
        // position index `indices`/`data`; each index is below `x.rows()`, so the row starts
        // inside X's buffer and its columns `f0..f0 + w` are inside it (the view's shape check);
        // loads of the last vector are masked to the `w - 16 (NV - 1)` valid lanes (masked-off
        // lanes never fault). Prefetches are hints and never fault.
        unsafe {
            let ahead = x.add(*idx.add((k + PREFETCH_DISTANCE).min(last)) as usize * ldx);
            for v in 0..NV {
                prefetch(ahead.wrapping_add(v * LANES));
            }
            prefetch(ahead.wrapping_add(w - 1));
            let a = _mm512_set1_ps(*val.add(k));
            let xr = x.add(*idx.add(k) as usize * ldx);
            for v in 0..NV - 1 {
                acc[v] = _mm512_fmadd_ps(a, _mm512_loadu_ps(xr.add(v * LANES)), acc[v]);
            }
            let xv = _mm512_maskz_loadu_ps(tail, xr.add((NV - 1) * LANES));
            acc[NV - 1] = _mm512_fmadd_ps(a, xv, acc[NV - 1]);
        }
    };

    for (r, i) in rows.enumerate() {
        let (s, e) = (indptr[i] as usize, indptr[i + 1] as usize);
        let mut acc = [_mm512_setzero_ps(); NV];
        if dual {
            let mut acc2 = [_mm512_setzero_ps(); NV];
            let mut k = s;
            while k + 1 < e {
                step(k, &mut acc);
                step(k + 1, &mut acc2);
                k += 2;
            }
            if k < e {
                step(k, &mut acc);
            }
            for v in 0..NV {
                acc[v] = _mm512_add_ps(acc[v], acc2[v]);
            }
        } else {
            for k in s..e {
                step(k, &mut acc);
            }
        }
        // SAFETY: row `r` < `y.rows()` and columns `f0..f0 + w` <= `y.cols()`, so the row's
        // first `w` elements from `yp + r * ldy` are inside Y's buffer; the last vector is
        // masked. With β = 0, Y is not read.
        unsafe {
            let yr = yp.add(r * ldy);
            for v in 0..NV {
                let mut out = _mm512_mul_ps(alpha, acc[v]);
                let full = v + 1 < NV;
                if !overwrite {
                    let old = if full {
                        _mm512_loadu_ps(yr.add(v * LANES))
                    } else {
                        _mm512_maskz_loadu_ps(tail, yr.add(v * LANES))
                    };
                    out = _mm512_fmadd_ps(beta, old, out);
                }
                if full {
                    _mm512_storeu_ps(yr.add(v * LANES), out);
                } else {
                    _mm512_mask_storeu_ps(yr.add(v * LANES), tail, out);
                }
            }
        }
    }
}
