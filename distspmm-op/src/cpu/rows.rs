//! Row movement between a rank's dense matrices and its packed message buffers, in parallel
//! over disjoint rows (each output row is written by one thread, so results do not depend on
//! the thread count).

use distspmm_sparse::sparse::{DenseView, DenseViewMut};
use rayon::prelude::*;

/// Below this many values a loop runs on the calling thread.
const SERIAL_VALUES: usize = 1 << 15;

/// Packs rows `list` of `x` into `out` (`list.len() × F`, row-major).
pub(super) fn pack(x: &DenseView<'_, f32>, list: &[u32], out: &mut [f32]) {
    let f = x.cols();
    let copy = |(dst, &i): (&mut [f32], &u32)| dst.copy_from_slice(x.row(i as usize));
    if list.len() * f < SERIAL_VALUES {
        out.chunks_exact_mut(f).zip(list).for_each(copy);
    } else {
        out.par_chunks_exact_mut(f)
            .zip(list.par_iter())
            .with_min_len(64)
            .for_each(copy);
    }
}

/// `m[list[k]] += packed[k]` for every k; `list` is strictly increasing (a halo list), so the
/// rows are distinct and the work splits into disjoint row ranges.
pub(super) fn scatter_add(m: DenseViewMut<'_, f32>, list: &[u32], packed: &[f32]) {
    scatter(m, 0, list, packed);
}

fn scatter(mut m: DenseViewMut<'_, f32>, first_row: usize, list: &[u32], packed: &[f32]) {
    let f = m.cols();
    if list.len() * f < SERIAL_VALUES || list.len() < 2 {
        for (&i, src) in list.iter().zip(packed.chunks_exact(f)) {
            add(m.row_mut(i as usize - first_row), src);
        }
        return;
    }
    let mid = list.len() / 2;
    let split = list[mid] as usize - first_row;
    let (top, bottom) = m.split_rows_at(split);
    let (lo, hi) = packed.split_at(mid * f);
    rayon::join(
        || scatter(top, first_row, &list[..mid], lo),
        || scatter(bottom, first_row + split, &list[mid..], hi),
    );
}

/// `m += other` (`other` row-major, `m.rows() × m.cols()`).
pub(super) fn add_all(mut m: DenseViewMut<'_, f32>, other: &[f32]) {
    let (rows, f) = (m.rows(), m.cols());
    if rows * f < SERIAL_VALUES || rows < 2 {
        for (i, src) in other.chunks_exact(f).take(rows).enumerate() {
            add(m.row_mut(i), src);
        }
        return;
    }
    let mid = rows / 2;
    let (top, bottom) = m.split_rows_at(mid);
    let (lo, hi) = other.split_at(mid * f);
    rayon::join(|| add_all(top, lo), || add_all(bottom, hi));
}

fn add(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// Copies `x` (any leading dimension) into `out` row-major.
pub(super) fn copy_rows(x: &DenseView<'_, f32>, out: &mut [f32]) {
    let f = x.cols();
    for (i, dst) in out.chunks_exact_mut(f).enumerate().take(x.rows()) {
        dst.copy_from_slice(x.row(i));
    }
}
