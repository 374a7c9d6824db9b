//! The portable pass: fixed-width accumulator arrays the compiler vectorises for the build
//! target, compiled a second time with AVX2 + FMA enabled for x86-64 CPUs without AVX-512.
//! Used for every `f64` product and for `f32` where AVX-512 is missing. It sums in the same
//! order and with the same operations as [`super::reference`](mod@super::reference), so its results are identical.

use core::ops::Range;

use super::{prefetch, prefetch_nta, Isa, Operand, Pass, PREFETCH_LINES, STREAM_AHEAD};
use crate::index;
use crate::sparse::{DenseViewMut, Scalar};

/// The pass width for `f` feature columns: the smallest of 8, 16, 32, 64 elements (at most
/// 256 bytes of accumulators) that covers `f`, or the largest.
pub(crate) fn pass_width<T>(f: usize) -> usize {
    let max = 256 / size_of::<T>();
    [8, 16, 32, 64]
        .into_iter()
        .find(|&w| w >= f || w >= max)
        .unwrap_or(max)
}

/// Runs `pass` (width `width`, as returned by [`pass_width`]) over `rows` into `y`, whose row 0
/// is row `rows.start`.
pub(crate) fn pass<T: Scalar>(
    isa: Isa,
    pass: &Pass<'_, T>,
    width: usize,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    match width {
        8 => pass_w::<T, 8>(isa, pass, rows, y),
        16 => pass_w::<T, 16>(isa, pass, rows, y),
        32 => pass_w::<T, 32>(isa, pass, rows, y),
        _ => pass_w::<T, 64>(isa, pass, rows, y),
    }
}

fn pass_w<T: Scalar, const W: usize>(
    isa: Isa,
    pass: &Pass<'_, T>,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: `isa` never exceeds what the CPU supports (see `super::isa`), and every
        // instruction set at or above AVX2 here includes AVX2 and FMA.
        unsafe { pass_avx2::<T, W>(pass, rows, y) };
        return;
    }
    let _ = isa;
    pass_body::<T, W>(pass, rows, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn pass_avx2<T: Scalar, const W: usize>(
    pass: &Pass<'_, T>,
    rows: Range<usize>,
    y: DenseViewMut<'_, T>,
) {
    pass_body::<T, W>(pass, rows, y);
}

/// X's columns `off..off + W` as an array (panics only if the operand invariants are broken).
#[inline(always)]
fn block<T, const W: usize>(xs: &[T], off: usize) -> &[T; W] {
    xs[off..off + W]
        .first_chunk::<W>()
        .expect("a slice of length W has a first chunk of W")
}

#[inline(always)]
fn pass_body<T: Scalar, const W: usize>(
    pass: &Pass<'_, T>,
    rows: Range<usize>,
    mut y: DenseViewMut<'_, T>,
) {
    let Operand {
        indptr,
        indices,
        data,
    } = pass.op;
    let (xs, ldx, f0, w) = (pass.x.as_slice(), pass.x.ld(), pass.f0, pass.w);
    let last = index::offset(indptr[rows.end]).saturating_sub(1);
    // Lines of one gathered row (plus one when it does not start on a line).
    let lines = (w * size_of::<T>()).div_ceil(64) + 1;
    let per_line = 64 / size_of::<T>();
    let distance = (PREFETCH_LINES / lines).max(1);
    let ahead = |k: usize| {
        let j = indices[(k + distance).min(last)] as usize;
        let row = xs.as_ptr().wrapping_add(j * ldx + f0);
        for l in 0..lines - 1 {
            prefetch(row.wrapping_add(l * per_line));
        }
        prefetch(row.wrapping_add(w - 1));
        prefetch_nta(indices.as_ptr().wrapping_add(k + STREAM_AHEAD));
        prefetch_nta(data.as_ptr().wrapping_add(k + STREAM_AHEAD));
    };
    for (r, i) in rows.enumerate() {
        let (s, e) = (index::offset(indptr[i]), index::offset(indptr[i + 1]));
        let mut acc = [T::ZERO; W];
        if w == W {
            for k in s..e {
                ahead(k);
                let a = data[k];
                let xr = block::<T, W>(xs, indices[k] as usize * ldx + f0);
                for (acc_j, &x_j) in acc.iter_mut().zip(xr) {
                    *acc_j += a * x_j;
                }
            }
        } else {
            // A narrower pass (e.g. 7 classes in a pass of 8) still runs at the full width
            // wherever X has W values from the row's offset on: the lanes past `w` read the
            // next columns (or row) and are never stored, and lanes `..w` are computed as
            // they would be alone. Only the last rows of X, whose W values would run past its
            // end, take the `w`-wide loop.
            for k in s..e {
                ahead(k);
                let a = data[k];
                let off = indices[k] as usize * ldx + f0;
                if let Some(xr) = xs.get(off..off + W).and_then(|x| x.first_chunk::<W>()) {
                    for (acc_j, &x_j) in acc.iter_mut().zip(xr) {
                        *acc_j += a * x_j;
                    }
                } else {
                    for (acc_j, &x_j) in acc[..w].iter_mut().zip(&xs[off..off + w]) {
                        *acc_j += a * x_j;
                    }
                }
            }
        }
        let out = &mut y.row_mut(r)[f0..f0 + w];
        if pass.beta == T::ZERO {
            for (o, &s) in out.iter_mut().zip(&acc) {
                *o = pass.alpha * s;
            }
        } else {
            for (o, &s) in out.iter_mut().zip(&acc) {
                *o = pass.alpha * s + pass.beta * *o;
            }
        }
    }
}
