//! Splitting the rows of a compressed matrix into blocks of balanced work (non-zeros plus a
//! per-row cost), run in parallel with rayon under `std` and in order without it.

use crate::index;
use core::ops::Range;

/// The work of rows `rows`: their stored entries plus `row_cost` per row.
pub fn cost(indptr: &[u64], rows: &Range<usize>, row_cost: u64) -> u64 {
    indptr[rows.end] - indptr[rows.start] + rows.len() as u64 * row_cost
}

/// The row `mid` in `rows.start + 1 .. rows.end` where `cost(rows.start..mid)` first reaches
/// half of the total (binary search on `indptr`). Needs `rows.len() >= 2`.
pub fn split_point(indptr: &[u64], rows: &Range<usize>, row_cost: u64) -> usize {
    let half = cost(indptr, rows, row_cost) / 2;
    let (mut lo, mut hi) = (rows.start + 1, rows.end - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if cost(indptr, &(rows.start..mid), row_cost) < half {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// State that follows a row block when it is split (an output view, a slice of entries).
pub trait SplitRows: Sized + Send {
    /// Splits the state of rows `rows` into that of `rows.start..mid` and `mid..rows.end`.
    fn split_rows(self, indptr: &[u64], rows: &Range<usize>, mid: usize) -> (Self, Self);
}

/// The stored entries (values) of the rows: split where the pointer array says.
impl<T: Send> SplitRows for &mut [T] {
    fn split_rows(self, indptr: &[u64], rows: &Range<usize>, mid: usize) -> (Self, Self) {
        self.split_at_mut(index::offset(indptr[mid] - indptr[rows.start]))
    }
}

/// Runs `f` on blocks of rows covering `rows`, each of work at most `grain` or a single row,
/// in parallel under `std`. The blocks depend only on `indptr`, `row_cost` and `grain`.
pub fn for_each_block<S, F>(
    indptr: &[u64],
    rows: Range<usize>,
    row_cost: u64,
    grain: u64,
    state: S,
    f: &F,
) where
    S: SplitRows,
    F: Fn(Range<usize>, S) + Sync,
{
    if rows.len() < 2 || cost(indptr, &rows, row_cost) <= grain {
        f(rows, state);
        return;
    }
    let mid = split_point(indptr, &rows, row_cost);
    let (a, b) = state.split_rows(indptr, &rows, mid);
    let (left, right) = (rows.start..mid, mid..rows.end);
    #[cfg(feature = "std")]
    rayon::join(
        || for_each_block(indptr, left, row_cost, grain, a, f),
        || for_each_block(indptr, right, row_cost, grain, b, f),
    );
    #[cfg(not(feature = "std"))]
    {
        for_each_block(indptr, left, row_cost, grain, a, f);
        for_each_block(indptr, right, row_cost, grain, b, f);
    }
}

/// Worker threads available to [`for_each_block`] (1 without `std`).
pub fn threads() -> usize {
    #[cfg(feature = "std")]
    {
        rayon::current_num_threads()
    }
    #[cfg(not(feature = "std"))]
    {
        1
    }
}

/// Splits `slice` into consecutive pieces of the given lengths (which sum to at most its
/// length), so that parallel tasks can each own one.
pub fn split_lengths<T>(
    mut slice: &mut [T],
    lengths: impl IntoIterator<Item = usize>,
) -> alloc::vec::Vec<&mut [T]> {
    let mut pieces = alloc::vec::Vec::new();
    for len in lengths {
        let (head, tail) = core::mem::take(&mut slice).split_at_mut(len);
        pieces.push(head);
        slice = tail;
    }
    pieces
}

/// How many tasks split `n` rows into contiguous ranges when each task reads all the input and
/// writes only its own rows (so more tasks than threads only repeat the reading): one per
/// thread, at least 1024 rows each; three in unit tests, so the split runs there.
pub fn range_tasks(n: usize) -> usize {
    let (wanted, min_rows) = if cfg!(test) {
        (3, 1)
    } else {
        (threads(), 1024)
    };
    wanted.min(n / min_rows).max(1)
}

/// A grain that gives each thread several blocks (for balance) of at least `min` work.
pub fn grain_for(total: u64, min: u64) -> u64 {
    let threads = threads() as u64;
    if threads <= 1 {
        return u64::MAX;
    }
    (total / (threads * 8)).max(min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn split_point_halves_the_work() {
        let indptr = [0u64, 10, 10, 11, 12, 40];
        let rows = 0..5;
        let mid = split_point(&indptr, &rows, 0);
        assert_eq!(mid, 4, "rows 0..4 hold 12 of 40, 0..5 all");
        let mid = split_point(&indptr, &(0..4), 0);
        assert_eq!(mid, 1);
        let even = [0u64, 0, 0, 0, 0];
        assert_eq!(split_point(&even, &(0..4), 1), 2);
    }

    struct Collect;
    impl SplitRows for Collect {
        fn split_rows(self, _: &[u64], _: &Range<usize>, _: usize) -> (Self, Self) {
            (Collect, Collect)
        }
    }

    #[cfg(feature = "std")]
    #[test]
    fn blocks_cover_all_rows_once() {
        let indptr: Vec<u64> = (0..=100u64).map(|i| i * i).collect();
        let seen = std::sync::Mutex::new(Vec::new());
        for_each_block(&indptr, 0..100, 1, 500, Collect, &|r: Range<usize>, _| {
            seen.lock().unwrap().push(r);
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort_by_key(|r| r.start);
        let mut next = 0;
        for r in &seen {
            assert_eq!(r.start, next);
            assert!(r.len() == 1 || cost(&indptr, r, 1) <= 500);
            next = r.end;
        }
        assert_eq!(next, 100);
    }
}
