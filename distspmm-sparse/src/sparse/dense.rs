//! Row-major dense matrices with a leading dimension, over owned or borrowed storage.
//!
//! A `rows × cols` matrix reads element `(i, j)` at `data[i * ld + j]` with `ld >= cols`, so a
//! view can be a column slice of a wider matrix (the feature-split schedule multiplies such
//! slices). The buffer must hold `(rows - 1) * ld + cols` elements: the last row needs no padding.

use alloc::vec::Vec;
use core::fmt;
use core::ops::{Deref, DerefMut, Range};

use super::SparseError;

/// The number of elements a `rows × cols` matrix with leading dimension `ld` needs.
fn required_len(rows: usize, cols: usize, ld: usize) -> Result<usize, SparseError> {
    if ld < cols {
        return Err(SparseError::LeadingDimension { ld, cols });
    }
    if rows == 0 {
        return Ok(0);
    }
    (rows - 1)
        .checked_mul(ld)
        .and_then(|n| n.checked_add(cols))
        .ok_or(SparseError::DimensionTooLarge {
            dim: rows,
            reason: "rows × leading dimension overflows usize",
        })
}

fn check_range(axis: &'static str, range: &Range<usize>, bound: usize) -> Result<(), SparseError> {
    if range.start > range.end || range.end > bound {
        return Err(SparseError::RangeOutOfBounds {
            axis,
            start: range.start,
            end: range.end,
            bound,
        });
    }
    Ok(())
}

/// A row-major dense matrix with a leading dimension over storage `S` (a slice, a mutable
/// slice or a `Vec`); use it through [`DenseView`], [`DenseViewMut`] and [`DenseOwned`].
#[derive(Clone, Copy)]
pub struct Dense<S> {
    data: S,
    rows: usize,
    cols: usize,
    ld: usize,
}

/// A borrowed dense matrix (`Copy`).
pub type DenseView<'a, T> = Dense<&'a [T]>;
/// A mutably borrowed dense matrix.
pub type DenseViewMut<'a, T> = Dense<&'a mut [T]>;
/// A dense matrix owning its buffer.
pub type DenseOwned<T> = Dense<Vec<T>>;

impl<S> fmt::Debug for Dense<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dense")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("ld", &self.ld)
            .finish_non_exhaustive()
    }
}

impl<S: Deref<Target = [T]>, T> Dense<S> {
    /// Wraps `data` as `rows × cols` with leading dimension `ld`; element `(i, j)` is
    /// `data[i * ld + j]`. Fails when `ld < cols` or `data` is shorter than `(rows - 1) * ld + cols`.
    pub fn new(data: S, rows: usize, cols: usize, ld: usize) -> Result<Self, SparseError> {
        let needed = required_len(rows, cols, ld)?;
        if data.len() < needed {
            return Err(SparseError::DenseTooShort {
                rows,
                cols,
                ld,
                needed,
                len: data.len(),
            });
        }
        Ok(Self {
            data,
            rows,
            cols,
            ld,
        })
    }

    /// Wraps a contiguous row-major buffer as `rows × cols` (`ld = cols`).
    pub fn from_row_major(data: S, rows: usize, cols: usize) -> Result<Self, SparseError> {
        Self::new(data, rows, cols, cols)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Leading dimension: elements from the start of one row to the start of the next.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// The underlying buffer, starting at element `(0, 0)`. Elements between `cols` and `ld`
    /// of each row belong to the wider matrix, not to this one.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// Row `i` (`cols` elements). Panics when `i >= rows`, like slice indexing.
    pub fn row(&self, i: usize) -> &[T] {
        assert!(i < self.rows, "row {i} out of range for {} rows", self.rows);
        &self.data[i * self.ld..i * self.ld + self.cols]
    }

    /// A borrowed view of the whole matrix.
    pub fn view(&self) -> DenseView<'_, T> {
        Dense {
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
            ld: self.ld,
        }
    }

    /// Element `(i, j)`, or `None` outside the matrix.
    pub fn get(&self, i: usize, j: usize) -> Option<T>
    where
        T: Copy,
    {
        (i < self.rows && j < self.cols).then(|| self.data[i * self.ld + j])
    }

    /// Copies the matrix into a contiguous row-major `Vec` (`rows * cols` elements).
    pub fn to_vec(&self) -> Vec<T>
    where
        T: Copy,
    {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for i in 0..self.rows {
            out.extend_from_slice(self.row(i));
        }
        out
    }

    /// The buffer range of rows `rows` and columns `cols`, after checking both.
    fn sub_range(
        &self,
        rows: &Range<usize>,
        cols: &Range<usize>,
    ) -> Result<Range<usize>, SparseError> {
        check_range("row", rows, self.rows)?;
        check_range("column", cols, self.cols)?;
        if rows.is_empty() {
            return Ok(0..0);
        }
        Ok(rows.start * self.ld + cols.start..(rows.end - 1) * self.ld + cols.end)
    }
}

impl<S: DerefMut<Target = [T]>, T> Dense<S> {
    /// The underlying buffer mutably, starting at element `(0, 0)` (see [`Dense::as_slice`]).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// Row `i` mutably (`cols` elements). Panics when `i >= rows`.
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        assert!(i < self.rows, "row {i} out of range for {} rows", self.rows);
        &mut self.data[i * self.ld..i * self.ld + self.cols]
    }

    /// A mutable view of the whole matrix.
    pub fn view_mut(&mut self) -> DenseViewMut<'_, T> {
        Dense {
            data: &mut self.data,
            rows: self.rows,
            cols: self.cols,
            ld: self.ld,
        }
    }

    /// Sets every element (not the padding between `cols` and `ld`) to `value`.
    pub fn fill(&mut self, value: T)
    where
        T: Copy,
    {
        for i in 0..self.rows {
            self.row_mut(i).fill(value);
        }
    }
}

impl<'a, T> DenseView<'a, T> {
    /// The underlying buffer for the whole lifetime of the view.
    pub fn into_slice(self) -> &'a [T] {
        self.data
    }

    /// The sub-view of rows `rows` and columns `cols` (same leading dimension).
    pub fn slice(self, rows: Range<usize>, cols: Range<usize>) -> Result<Self, SparseError> {
        let buf = self.sub_range(&rows, &cols)?;
        Ok(Dense {
            data: &self.data[buf],
            rows: rows.len(),
            cols: cols.len(),
            ld: self.ld,
        })
    }

    /// The sub-view of columns `range` (all rows).
    pub fn column_slice(self, range: Range<usize>) -> Result<Self, SparseError> {
        self.slice(0..self.rows, range)
    }

    /// The sub-view of rows `range` (all columns).
    pub fn row_slice(self, range: Range<usize>) -> Result<Self, SparseError> {
        self.slice(range, 0..self.cols)
    }
}

impl<'a, T> DenseViewMut<'a, T> {
    /// A shorter-lived mutable view of the same elements.
    pub fn reborrow(&mut self) -> DenseViewMut<'_, T> {
        self.view_mut()
    }

    /// The underlying buffer for the whole lifetime of the view, consuming it.
    pub fn into_slice(self) -> &'a mut [T] {
        self.data
    }

    /// The mutable sub-view of rows `rows` and columns `cols`.
    pub fn slice_mut(self, rows: Range<usize>, cols: Range<usize>) -> Result<Self, SparseError> {
        let buf = self.sub_range(&rows, &cols)?;
        Ok(Dense {
            data: &mut self.data[buf],
            rows: rows.len(),
            cols: cols.len(),
            ld: self.ld,
        })
    }

    /// The mutable sub-view of columns `range` (all rows).
    pub fn column_slice_mut(self, range: Range<usize>) -> Result<Self, SparseError> {
        let rows = 0..self.rows;
        self.slice_mut(rows, range)
    }

    /// The mutable sub-view of rows `range` (all columns).
    pub fn row_slice_mut(self, range: Range<usize>) -> Result<Self, SparseError> {
        let cols = 0..self.cols;
        self.slice_mut(range, cols)
    }

    /// Splits into rows `0..mid` and `mid..rows` (disjoint row blocks for threads).
    /// Panics when `mid > rows`.
    pub fn split_rows_at(self, mid: usize) -> (Self, Self) {
        assert!(mid <= self.rows, "split at row {mid} of {} rows", self.rows);
        let (rows, cols, ld) = (self.rows, self.cols, self.ld);
        let cut = (mid * ld).min(self.data.len());
        let (top, bottom) = self.data.split_at_mut(cut);
        let part = |data, rows| Dense {
            data,
            rows,
            cols,
            ld,
        };
        (part(top, mid), part(bottom, rows - mid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn shape_checks() {
        let data = vec![0.0f32; 10];
        assert!(DenseView::new(&data[..], 3, 4, 3).is_err(), "ld < cols");
        assert!(
            DenseView::new(&data[..], 3, 4, 4).is_err(),
            "needs 2*4+4 = 12 > 10"
        );
        assert!(
            DenseView::new(&data[..], 3, 2, 4).is_ok(),
            "needs 2*4+2 = 10"
        );
        assert!(DenseView::new(&data[..], 3, 3, 4).is_err());
        assert!(
            DenseView::new(&data[..0], 0, 7, 7).is_ok(),
            "no rows need no data"
        );
        assert!(
            DenseView::new(&data[..], usize::MAX, 1, usize::MAX).is_err(),
            "overflow"
        );
        assert!(DenseOwned::new(data, 2, 5, 5).is_ok());
    }

    #[test]
    fn column_and_row_slices_address_the_right_elements() {
        let data: Vec<u32> = (0..20).collect();
        let full = DenseView::from_row_major(&data[..], 4, 5).unwrap();
        let cols = full.column_slice(1..4).unwrap();
        assert_eq!((cols.rows(), cols.cols(), cols.ld()), (4, 3, 5));
        assert_eq!(cols.row(2), &[11, 12, 13]);
        assert_eq!(cols.get(3, 2), Some(18));
        assert_eq!(cols.get(4, 0), None);
        let rows = cols.row_slice(1..3).unwrap();
        assert_eq!(rows.to_vec(), vec![6, 7, 8, 11, 12, 13]);
        assert!(full.column_slice(2..6).is_err());
        assert!(full.row_slice(3..5).is_err());
        assert_eq!(full.column_slice(5..5).unwrap().cols(), 0);
    }

    #[test]
    fn mutable_slices_and_splits_write_only_their_part() {
        let mut m = DenseOwned::from_row_major(vec![0i32; 12], 3, 4).unwrap();
        let mut right = m.view_mut().column_slice_mut(2..4).unwrap();
        right.fill(1);
        let (mut top, mut bottom) = right.split_rows_at(1);
        top.row_mut(0)[0] = 7;
        bottom.row_mut(1)[1] = 9;
        assert_eq!(m.as_slice(), &[0, 0, 7, 1, 0, 0, 1, 1, 0, 0, 1, 9]);
    }
}
