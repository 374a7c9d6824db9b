//! Hand-written AVX-512 `f32` pass: one output row's `w <= 128` feature columns live in up to
//! 8 `zmm` accumulators (the last one masked when `w` is not a multiple of 16); each non-zero is
//! one broadcast and `NV` fused multiply-adds from the gathered X row.
//!
//! Memory, not arithmetic, bounds this product, so most of the code is about the caches:
//! - the X row [`PREFETCH_LINES`] cache lines ahead (in non-zeros: that over the lines per
//!   row) is prefetched, across row boundaries within the block, so that many gathers are in
//!   flight at once;
//! - the index and value streams are prefetched non-temporally [`STREAM_AHEAD`] entries
//!   ahead, so that they do not push the hot rows of X (the hubs of a power-law graph) out of
//!   the outer caches;
//! - a large Y written with β = 0 is written with streaming stores (no read for ownership, no
//!   cache pollution) when its rows are cache-line aligned;
//! - wider feature ranges are split into passes of at most [`MAX_WIDTH`] columns: each pass
//!   reads fewer bytes of every X row, so more hub rows stay cached; when X is much larger than
//!   the cache, each pass's columns are first packed into a contiguous panel of
//!   [`PACK_WIDTH`] columns, so that a pass gathers from a dense slab instead of a few bytes
//!   of every widely spaced row (measured +15 % at F = 256 on RMAT scale 18).
//!
//! Narrow passes (`w <= 32`) alternate two accumulator sets so that the FMA latency does not
//! bound rows with many non-zeros.

use core::arch::x86_64::{
    __m512, __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    _mm512_stream_ps, _mm_sfence,
};
use core::ops::Range;

use super::{prefetch, prefetch_nta, Operand, Pass, PREFETCH_LINES, ROW_COST, STREAM_AHEAD};
use crate::index;
use crate::sparse::par::for_each_block;
use crate::sparse::{DenseView, DenseViewMut};

/// Lanes of a `zmm` register of `f32`.
const LANES: usize = 16;
/// Widest pass: 8 accumulators. Measured on RMAT scale 18 (2 threads, Zen 4): passes of 128
/// beat both 64 and 256 at F = 256.
const MAX_WIDTH: usize = 8 * LANES;
/// Outputs at least this large are written with streaming stores when possible.
const STREAM_MIN_BYTES: usize = 8 << 20;
/// A multi-pass product packs X when X is at least this large (about the shared L3).
const PACK_MIN_BYTES: usize = 32 << 20;
/// Columns of a packed panel of X: a 262,144-row panel is 32 MiB. Panels of 16 measured the
/// same at F = 256, panels of 64 lost the gain.
const PACK_WIDTH: usize = 32;

/// How a product with `f` feature columns over an X of `x_rows` rows is cut into passes:
/// `(pass width, pack X into panels)`. One pass up to [`MAX_WIDTH`] columns; beyond, equal
/// passes rounded up to whole vectors, of at most [`PACK_WIDTH`] columns when X is packed.
/// Depends on the shape only, never on the threads.
pub(crate) fn plan(f: usize, x_rows: usize) -> (usize, bool) {
    if f <= MAX_WIDTH {
        return (f, false);
    }
    let pack = x_rows.saturating_mul(f).saturating_mul(4) >= PACK_MIN_BYTES;
    let max = if pack { PACK_WIDTH } else { MAX_WIDTH };
    let passes = f.div_ceil(max);
    (f.div_ceil(passes).next_multiple_of(LANES), pack)
}

/// Storage of a packed panel: huge pages under `std` (the panel is gathered from at random).
#[cfg(feature = "std")]
type Panel = crate::sparse::PageBuffer<f32>;
#[cfg(not(feature = "std"))]
type Panel = alloc::vec::Vec<f32>;

/// A panel of `len` elements, or `None` when memory is short (the product then runs unpacked).
fn panel(len: usize) -> Option<Panel> {
    #[cfg(feature = "std")]
    {
        Panel::zeroed(len).ok()
    }
    #[cfg(not(feature = "std"))]
    {
        let mut v = Panel::new();
        v.try_reserve_exact(len).ok()?;
        v.resize(len, 0.0);
        Some(v)
    }
}

/// Copies columns `f0..f0 + w` of X into `out` (`x.rows() × w`, row-major), in parallel.
fn pack_columns(x: DenseView<'_, f32>, f0: usize, w: usize, out: &mut [f32]) {
    const ROWS_PER_TASK: usize = 4096;
    let copy = |(c, chunk): (usize, &mut [f32])| {
        for (r, dst) in chunk.chunks_exact_mut(w).enumerate() {
            dst.copy_from_slice(&x.row(c * ROWS_PER_TASK + r)[f0..f0 + w]);
        }
    };
    #[cfg(feature = "std")]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(w * ROWS_PER_TASK)
            .enumerate()
            .for_each(copy);
    }
    #[cfg(not(feature = "std"))]
    out.chunks_mut(w * ROWS_PER_TASK).enumerate().for_each(copy);
}

/// Y = α·A·X + β·Y in `f32` with AVX-512: the passes of [`plan`], each over all rows in
/// parallel blocks of work `grain`.
///
/// # Safety
/// The CPU supports AVX-512F, and `op` is a checked operand whose shape matches X and Y (see
/// [`Operand`]): `check_shapes` passed.
pub(crate) unsafe fn run(
    alpha: f32,
    op: Operand<'_, f32>,
    x: DenseView<'_, f32>,
    beta: f32,
    mut y: DenseViewMut<'_, f32>,
    grain: u64,
) {
    let (rows, f) = (y.rows(), y.cols());
    let (width, pack) = plan(f, x.rows());
    let mut panel = if pack { panel(x.rows() * width) } else { None };
    for f0 in (0..f).step_by(width) {
        let w = width.min(f - f0);
        // Packed: the pass reads the panel from column 0 and writes the matching column slice
        // of Y; unpacked: both from column f0.
        let (xp, pf0, yp) = match panel.as_deref_mut() {
            Some(buf) => {
                let buf = &mut buf[..x.rows() * w];
                pack_columns(x, f0, w, buf);
                let xp = DenseView::from_row_major(&*buf, x.rows(), w)
                    .expect("a panel holds rows × w elements");
                let yp = y
                    .reborrow()
                    .column_slice_mut(f0..f0 + w)
                    .expect("f0 + w <= F");
                (xp, 0, yp)
            }
            None => (x, f0, y.reborrow()),
        };
        let p = Pass {
            op,
            x: xp,
            f0: pf0,
            w,
            alpha,
            beta,
            y_bytes: rows * f * 4,
        };
        for_each_block(op.indptr, 0..rows, ROW_COST, grain, yp, &|r, y| {
            // SAFETY: forwarded contract: AVX-512F is present and the operand's indices are
            // below X's rows (a panel has X's rows); `r` is a block of Y's rows and `y` those
            // rows; `0 < w <= MAX_WIDTH` and `pf0 + w` is within both X (or the panel) and Y.
            unsafe { pass(&p, r, y) }
        });
    }
}

/// Whether `pass` writes Y (from `yp`, the pass's first column of the block's first row, with
/// leading dimension `ldy`) with streaming stores: β = 0, a large output, and every stored
/// vector 64-byte aligned (the stores require it).
pub(crate) fn streams(pass: &Pass<'_, f32>, yp: *const f32, ldy: usize) -> bool {
    pass.beta == 0.0
        && pass.w.is_multiple_of(LANES)
        && (yp as usize).is_multiple_of(64)
        && (ldy * 4).is_multiple_of(64)
        && pass.y_bytes >= STREAM_MIN_BYTES
}

/// Runs `pass` over `rows` into `y`, whose row 0 is row `rows.start`.
///
/// # Safety
/// The CPU supports AVX-512F. `pass` satisfies the [`Pass`] invariants: the operand arrays obey
/// the [`crate::sparse::Compressed`] invariants with every index below `pass.x.rows()`,
/// `rows.end` is at most the operand's outer dimension, `0 < pass.w <= MAX_WIDTH`,
/// `pass.f0 + pass.w <= pass.x.cols()`, and `y` has `rows.len()` rows and at least
/// `pass.f0 + pass.w` columns.
unsafe fn pass(pass: &Pass<'_, f32>, rows: Range<usize>, y: DenseViewMut<'_, f32>) {
    macro_rules! dispatch {
        ($($nv:literal)*) => {
            match pass.w.div_ceil(LANES) {
                // SAFETY: forwarded contract; `NV` matches `w`.
                $($nv => unsafe { pass_nv::<$nv>(pass, rows, y) },)*
                _ => unreachable!("pass width {} exceeds {MAX_WIDTH}", pass.w),
            }
        };
    }
    dispatch!(1 2 3 4 5 6 7 8);
}

/// The pass with `NV = ceil(w / 16)` accumulators.
///
/// # Safety
/// As [`pass`], and `16 * (NV - 1) < pass.w <= 16 * NV`.
// Indexing the accumulator array by register number reads like the register allocation it is.
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
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the last vector holds 1..=16 lanes, so the mask has at most 16 bits set"
    )]
    let tail: __mmask16 = (u32::MAX >> (32 - (w - LANES * (NV - 1)))) as __mmask16;
    let alpha = _mm512_set1_ps(pass.alpha);
    let beta = _mm512_set1_ps(pass.beta);
    let overwrite = pass.beta == 0.0;
    let dual = NV <= 2;
    let last = index::offset(indptr[rows.end]).saturating_sub(1);
    let distance = (PREFETCH_LINES / NV).max(1);
    // Rows of X that start on a cache line span exactly NV lines; otherwise one more.
    let aligned = (x as usize).is_multiple_of(64) && (ldx * 4).is_multiple_of(64);
    let extra_line = !aligned;
    let stream = streams(pass, yp, ldy);

    // One non-zero: prefetch ahead, then acc += a · X[col, f0..f0 + w].
    let step = |k: usize, acc: &mut [__m512; NV]| {
        // SAFETY: `k` < the block's last offset + 1 <= nnz, so `k` and the clamped prefetch
        // position index `indices`/`data`; each index is below `x.rows()`, so the row starts
        // inside X's buffer and its columns `f0..f0 + w` are inside it (the view's shape check);
        // loads of the last vector are masked to the `w - 16 (NV - 1)` valid lanes (masked-off
        // lanes never fault). Prefetches are hints and never fault.
        unsafe {
            let pk = (k + distance).min(last);
            let ahead = x.add(*idx.add(pk) as usize * ldx);
            for v in 0..NV {
                prefetch(ahead.wrapping_add(v * LANES));
            }
            if extra_line {
                prefetch(ahead.wrapping_add(w - 1));
            }
            prefetch_nta(idx.wrapping_add(k + STREAM_AHEAD));
            prefetch_nta(val.wrapping_add(k + STREAM_AHEAD));
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
        let (s, e) = (index::offset(indptr[i]), index::offset(indptr[i + 1]));
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
        // masked. With β = 0, Y is not read. Streaming stores need 64-byte alignment, which
        // `stream` checked for every row (base, leading dimension, whole vectors).
        unsafe {
            let yr = yp.add(r * ldy);
            for v in 0..NV {
                let mut out = _mm512_mul_ps(alpha, acc[v]);
                let full = v + 1 < NV;
                if stream {
                    _mm512_stream_ps(yr.add(v * LANES), out);
                    continue;
                }
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
    if stream {
        // Streaming stores are weakly ordered: make them visible before the block is joined.
        _mm_sfence();
    }
}
