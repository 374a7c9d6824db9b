//! Compressed sparse matrices (CSR and CSC) over owned or borrowed storage.

use crate::index;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::marker::PhantomData;

use super::assemble::{assemble, SliceTriplets};
use super::{Scalar, SparseError};

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ByRow {}
    impl Sealed for super::ByCol {}
}

/// Which dimension a [`Compressed`] matrix compresses: [`ByRow`] (CSR) or [`ByCol`] (CSC).
pub trait Orientation:
    sealed::Sealed + Copy + Default + fmt::Debug + Send + Sync + 'static
{
    /// The other orientation: the same arrays read as the transposed matrix.
    type Flip: Orientation<Flip = Self>;
    /// `true` for CSR: the outer dimension is the rows.
    const ROW_MAJOR: bool;
    /// The name of the outer dimension, for messages.
    const AXIS: &'static str;
}

/// Rows are compressed: a [`Csr`] matrix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByRow;

/// Columns are compressed: a [`Csc`] matrix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByCol;

impl Orientation for ByRow {
    type Flip = ByCol;
    const ROW_MAJOR: bool = true;
    const AXIS: &'static str = "row";
}

impl Orientation for ByCol {
    type Flip = ByRow;
    const ROW_MAJOR: bool = false;
    const AXIS: &'static str = "column";
}

/// A compressed sparse matrix over any storage: `indptr` (u64 offsets, one per outer index plus
/// one), `indices` (u32 inner indices, strictly increasing within each outer index) and `data`.
///
/// Use it through [`Csr`] (row pointers, column indices) and [`Csc`] (column pointers, row
/// indices). Storage is anything that derefs to a slice: `Vec`s ([`CsrOwned`]), slices
/// ([`CsrView`], e.g. over a memory-mapped chunk, no copy), or a mix.
///
/// Invariants (checked by [`Compressed::new`], promised by callers of
/// [`Compressed::new_unchecked`]): `indptr.len() == outer + 1`, `indptr[0] == 0`, `indptr` is
/// non-decreasing, `indptr[outer] == indices.len() == data.len()`, and within each outer index
/// the inner indices are strictly increasing (sorted, no duplicates) and below the inner
/// dimension, which is at most `u32::MAX + 1`.
pub struct Compressed<T, P, I, V, O> {
    outer: usize,
    inner: usize,
    indptr: P,
    indices: I,
    data: V,
    _marker: PhantomData<(fn() -> T, O)>,
}

/// Compressed sparse row matrix: row pointers, column indices, values.
pub type Csr<T, P, I, V> = Compressed<T, P, I, V, ByRow>;
/// Compressed sparse column matrix: column pointers, row indices, values.
pub type Csc<T, P, I, V> = Compressed<T, P, I, V, ByCol>;
/// A CSR matrix owning its arrays.
pub type CsrOwned<T> = Csr<T, Vec<u64>, Vec<u32>, Vec<T>>;
/// A CSR matrix borrowing its arrays (zero-copy, e.g. from a memory-mapped chunk).
pub type CsrView<'a, T> = Csr<T, &'a [u64], &'a [u32], &'a [T]>;
/// A CSC matrix owning its arrays.
pub type CscOwned<T> = Csc<T, Vec<u64>, Vec<u32>, Vec<T>>;
/// A CSC matrix borrowing its arrays.
pub type CscView<'a, T> = Csc<T, &'a [u64], &'a [u32], &'a [T]>;

/// A borrowed compressed matrix of either orientation.
type ViewOf<'a, T, O> = Compressed<T, &'a [u64], &'a [u32], &'a [T], O>;
/// An owned compressed matrix of either orientation.
type OwnedOf<T, O> = Compressed<T, Vec<u64>, Vec<u32>, Vec<T>, O>;

impl<T, P: Clone, I: Clone, V: Clone, O> Clone for Compressed<T, P, I, V, O> {
    fn clone(&self) -> Self {
        Self {
            outer: self.outer,
            inner: self.inner,
            indptr: self.indptr.clone(),
            indices: self.indices.clone(),
            data: self.data.clone(),
            _marker: PhantomData,
        }
    }
}

/// Views are `Copy`, like the slices they hold.
impl<T, O> Copy for ViewOf<'_, T, O> {}

impl<T: Scalar, P, I, V, O> fmt::Debug for Compressed<T, P, I, V, O>
where
    P: AsRef<[u64]>,
    I: AsRef<[u32]>,
    V: AsRef<[T]>,
    O: Orientation,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(if O::ROW_MAJOR { "Csr" } else { "Csc" })
            .field("nrows", &self.nrows())
            .field("ncols", &self.ncols())
            .field("nnz", &self.nnz())
            .finish_non_exhaustive()
    }
}

impl<T: Scalar, P, I, V, O, P2, I2, V2> PartialEq<Compressed<T, P2, I2, V2, O>>
    for Compressed<T, P, I, V, O>
where
    P: AsRef<[u64]>,
    I: AsRef<[u32]>,
    V: AsRef<[T]>,
    P2: AsRef<[u64]>,
    I2: AsRef<[u32]>,
    V2: AsRef<[T]>,
    O: Orientation,
{
    /// Same shape, same structure, same stored values.
    fn eq(&self, other: &Compressed<T, P2, I2, V2, O>) -> bool {
        self.outer == other.outer
            && self.inner == other.inner
            && self.indptr() == other.indptr()
            && self.indices() == other.indices()
            && self.data() == other.data()
    }
}

/// Checks the invariants listed on [`Compressed`]; `O` only names the axis in errors.
fn validate<T, O: Orientation>(
    outer: usize,
    inner: usize,
    indptr: &[u64],
    indices: &[u32],
    data: &[T],
) -> Result<(), SparseError> {
    let axis = O::AXIS;
    if inner > u32::MAX as usize + 1 {
        return Err(SparseError::DimensionTooLarge {
            dim: inner,
            reason: "inner indices are u32",
        });
    }
    let expected = outer.checked_add(1).ok_or(SparseError::DimensionTooLarge {
        dim: outer,
        reason: "outer dimension + 1 overflows usize",
    })?;
    if indptr.len() != expected {
        return Err(SparseError::IndptrLength {
            axis,
            expected,
            actual: indptr.len(),
        });
    }
    if indices.len() != data.len() {
        return Err(SparseError::LengthMismatch {
            indices: indices.len(),
            values: data.len(),
        });
    }
    if indptr[0] != 0 {
        return Err(SparseError::IndptrStart {
            axis,
            first: indptr[0],
        });
    }
    let last = indptr[outer];
    if last != indices.len() as u64 {
        return Err(SparseError::IndptrEnd {
            axis,
            last,
            nnz: indices.len(),
        });
    }
    for (o, w) in indptr.windows(2).enumerate() {
        let (start, end) = (w[0], w[1]);
        if start > end {
            return Err(SparseError::IndptrNotMonotone {
                axis,
                outer: o,
                start,
                end,
            });
        }
    }
    for (o, w) in indptr.windows(2).enumerate() {
        let (start, end) = (w[0], w[1]);
        // In range: start <= end <= last == indices.len().
        let (s, e) = (index::offset(start), index::offset(end));
        let mut previous: Option<u32> = None;
        for (position, &index) in indices[s..e].iter().enumerate() {
            let position = s + position;
            if index as usize >= inner {
                return Err(SparseError::IndexOutOfBounds {
                    axis,
                    outer: o,
                    position,
                    index: u64::from(index),
                    bound: inner,
                });
            }
            if let Some(previous) = previous {
                if index <= previous {
                    return Err(SparseError::UnsortedIndices {
                        axis,
                        outer: o,
                        position,
                        previous,
                        index,
                    });
                }
            }
            previous = Some(index);
        }
    }
    Ok(())
}

impl<T, P, I, V, O> Compressed<T, P, I, V, O>
where
    T: Scalar,
    P: AsRef<[u64]>,
    I: AsRef<[u32]>,
    V: AsRef<[T]>,
    O: Orientation,
{
    /// Wraps the three arrays of an `nrows × ncols` matrix after checking every invariant listed
    /// on [`Compressed`] (O(outer + nnz), no copy). For a [`Csr`], `indptr` has `nrows + 1`
    /// entries and `indices` are column indices; for a [`Csc`], `ncols + 1` and row indices.
    ///
    /// Unsorted or duplicate indices are rejected; [`Compressed::from_triplets`] sorts and
    /// merges them.
    pub fn new(
        nrows: usize,
        ncols: usize,
        indptr: P,
        indices: I,
        data: V,
    ) -> Result<Self, SparseError> {
        let (outer, inner) = if O::ROW_MAJOR {
            (nrows, ncols)
        } else {
            (ncols, nrows)
        };
        validate::<T, O>(
            outer,
            inner,
            indptr.as_ref(),
            indices.as_ref(),
            data.as_ref(),
        )?;
        Ok(Self {
            outer,
            inner,
            indptr,
            indices,
            data,
            _marker: PhantomData,
        })
    }

    /// Wraps the arrays without checking them.
    ///
    /// # Safety
    /// The arrays must satisfy every invariant listed on [`Compressed`] (as [`Compressed::new`]
    /// would check, with the same `nrows`/`ncols` convention). The kernels index `X` and `Y`
    /// without bounds checks on the strength of these invariants, so a violation is undefined
    /// behaviour, not a panic.
    pub unsafe fn new_unchecked(
        nrows: usize,
        ncols: usize,
        indptr: P,
        indices: I,
        data: V,
    ) -> Self {
        let (outer, inner) = if O::ROW_MAJOR {
            (nrows, ncols)
        } else {
            (ncols, nrows)
        };
        debug_assert!(validate::<T, O>(
            outer,
            inner,
            indptr.as_ref(),
            indices.as_ref(),
            data.as_ref()
        )
        .is_ok());
        Self {
            outer,
            inner,
            indptr,
            indices,
            data,
            _marker: PhantomData,
        }
    }

    /// Number of rows.
    pub fn nrows(&self) -> usize {
        if O::ROW_MAJOR {
            self.outer
        } else {
            self.inner
        }
    }

    /// Number of columns.
    pub fn ncols(&self) -> usize {
        if O::ROW_MAJOR {
            self.inner
        } else {
            self.outer
        }
    }

    /// The compressed dimension: rows of a CSR, columns of a CSC.
    pub fn outer_dim(&self) -> usize {
        self.outer
    }

    /// The indexed dimension: columns of a CSR, rows of a CSC.
    pub fn inner_dim(&self) -> usize {
        self.inner
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.as_ref().len()
    }

    /// The pointer array (`outer_dim() + 1` offsets).
    pub fn indptr(&self) -> &[u64] {
        self.indptr.as_ref()
    }

    /// The inner indices (column indices of a CSR, row indices of a CSC).
    pub fn indices(&self) -> &[u32] {
        self.indices.as_ref()
    }

    /// The stored values.
    pub fn data(&self) -> &[T] {
        self.data.as_ref()
    }

    /// The stored values, mutably (the structure cannot change through them).
    pub fn data_mut(&mut self) -> &mut [T]
    where
        V: AsMut<[T]>,
    {
        self.data.as_mut()
    }

    /// Indices and values of outer index `i` (row `i` of a CSR, column `i` of a CSC).
    /// Panics when `i >= outer_dim()`.
    pub fn outer_view(&self, i: usize) -> (&[u32], &[T]) {
        let p = self.indptr();
        let (s, e) = (index::offset(p[i]), index::offset(p[i + 1]));
        (&self.indices()[s..e], &self.data()[s..e])
    }

    /// A borrowed view of the same matrix.
    pub fn view(&self) -> ViewOf<'_, T, O> {
        Compressed {
            outer: self.outer,
            inner: self.inner,
            indptr: self.indptr(),
            indices: self.indices(),
            data: self.data(),
            _marker: PhantomData,
        }
    }

    /// The transposed matrix, zero-copy: the arrays of a CSR of A are a CSC of Aᵀ (and back).
    pub fn transpose_view(&self) -> ViewOf<'_, T, O::Flip> {
        Compressed {
            outer: self.outer,
            inner: self.inner,
            indptr: self.indptr(),
            indices: self.indices(),
            data: self.data(),
            _marker: PhantomData,
        }
    }

    /// The transposed matrix, keeping the storage: a CSR of A becomes a CSC of Aᵀ.
    pub fn into_transpose(self) -> Compressed<T, P, I, V, O::Flip> {
        Compressed {
            outer: self.outer,
            inner: self.inner,
            indptr: self.indptr,
            indices: self.indices,
            data: self.data,
            _marker: PhantomData,
        }
    }

    /// Gives back the storage: `(indptr, indices, data)`.
    pub fn into_raw_parts(self) -> (P, I, V) {
        (self.indptr, self.indices, self.data)
    }

    /// Copies into owned storage.
    pub fn to_owned(&self) -> OwnedOf<T, O> {
        Compressed {
            outer: self.outer,
            inner: self.inner,
            indptr: self.indptr().to_vec(),
            indices: self.indices().to_vec(),
            data: self.data().to_vec(),
            _marker: PhantomData,
        }
    }

    /// The same matrix in the other orientation (CSR → CSC, CSC → CSR): a counting sort by inner
    /// index, O(nnz + inner), no comparison sort; indices come out sorted because the outer
    /// indices are visited in order.
    fn flip_storage(&self) -> OwnedOf<T, O::Flip> {
        let (indptr, indices, data) = (self.indptr(), self.indices(), self.data());
        let mut out_ptr = vec![0u64; self.inner + 1];
        for &j in indices {
            out_ptr[j as usize + 1] += 1;
        }
        for j in 0..self.inner {
            out_ptr[j + 1] += out_ptr[j];
        }
        let mut cursor: Vec<u64> = out_ptr[..self.inner].to_vec();
        let mut out_idx = vec![0u32; self.nnz()];
        let mut out_val = vec![T::ZERO; self.nnz()];
        for o in 0..self.outer {
            let (s, e) = (index::offset(indptr[o]), index::offset(indptr[o + 1]));
            for k in s..e {
                let j = indices[k] as usize;
                let dst = index::offset(cursor[j]);
                cursor[j] += 1;
                // `o < outer <= u32::MAX + 1` because a flipped matrix must index it with u32;
                // checked by the callers.
                out_idx[dst] = index::id(o);
                out_val[dst] = data[k];
            }
        }
        Compressed {
            outer: self.inner,
            inner: self.outer,
            indptr: out_ptr,
            indices: out_idx,
            data: out_val,
            _marker: PhantomData,
        }
    }

    /// Checks that the outer dimension can become an inner (u32-indexed) one.
    fn check_flippable(&self) -> Result<(), SparseError> {
        if self.outer > u32::MAX as usize + 1 {
            return Err(SparseError::DimensionTooLarge {
                dim: self.outer,
                reason: "converting would need u32 indices beyond u32::MAX",
            });
        }
        Ok(())
    }

    /// The matrix as a row-major dense `nrows × ncols` buffer (for tests and small matrices).
    pub fn to_dense(&self) -> Vec<T> {
        let (nrows, ncols) = (self.nrows(), self.ncols());
        let mut out = vec![T::ZERO; nrows * ncols];
        for o in 0..self.outer {
            let (idx, val) = self.outer_view(o);
            for (&j, &v) in idx.iter().zip(val) {
                let (r, c) = if O::ROW_MAJOR {
                    (o, j as usize)
                } else {
                    (j as usize, o)
                };
                out[r * ncols + c] = v;
            }
        }
        out
    }
}

impl<T: Scalar, O: Orientation> OwnedOf<T, O> {
    /// Builds an `nrows × ncols` matrix from coordinate triplets `(rows[k], cols[k], values[k])`
    /// in any order; duplicates are merged by summing their values (in input order). Explicit
    /// zeros are kept. Linear time: a counting sort by the outer index, then a sort of each
    /// (short) row or column.
    pub fn from_triplets(
        nrows: usize,
        ncols: usize,
        rows: &[u32],
        cols: &[u32],
        values: &[T],
    ) -> Result<Self, SparseError> {
        if rows.len() != cols.len() || rows.len() != values.len() {
            return Err(SparseError::TripletLength {
                rows: rows.len(),
                cols: cols.len(),
                values: values.len(),
            });
        }
        for (dim, name) in [(nrows, "rows"), (ncols, "columns")] {
            if dim > u32::MAX as usize + 1 {
                return Err(SparseError::DimensionTooLarge {
                    dim,
                    reason: if name == "rows" {
                        "row indices are u32"
                    } else {
                        "column indices are u32"
                    },
                });
            }
        }
        for (k, (&r, &c)) in rows.iter().zip(cols).enumerate() {
            for (index, bound, axis) in [(r, nrows, "row"), (c, ncols, "column")] {
                if index as usize >= bound {
                    return Err(SparseError::IndexOutOfBounds {
                        axis,
                        outer: k,
                        position: k,
                        index: u64::from(index),
                        bound,
                    });
                }
            }
        }
        let (outer, inner, outer_idx, inner_idx) = if O::ROW_MAJOR {
            (nrows, ncols, rows, cols)
        } else {
            (ncols, nrows, cols, rows)
        };
        let (indptr, indices, data) = assemble(
            outer,
            &SliceTriplets {
                outer: outer_idx,
                inner: inner_idx,
                values,
            },
        )
        .map_err(|e| SparseError::Allocation { bytes: e.bytes })?;
        Ok(Compressed {
            outer,
            inner,
            indptr,
            indices,
            data,
            _marker: PhantomData,
        })
    }
}

impl<T, P, I, V> Csr<T, P, I, V>
where
    T: Scalar,
    P: AsRef<[u64]>,
    I: AsRef<[u32]>,
    V: AsRef<[T]>,
{
    /// Column indices and values of row `i`. Panics when `i >= nrows()`.
    pub fn row(&self, i: usize) -> (&[u32], &[T]) {
        self.outer_view(i)
    }

    /// The CSC form of the same matrix, O(nnz + ncols).
    pub fn to_csc(&self) -> Result<CscOwned<T>, SparseError> {
        self.check_flippable()?;
        Ok(self.flip_storage())
    }
}

impl<T, P, I, V> Csc<T, P, I, V>
where
    T: Scalar,
    P: AsRef<[u64]>,
    I: AsRef<[u32]>,
    V: AsRef<[T]>,
{
    /// Row indices and values of column `j`. Panics when `j >= ncols()`.
    pub fn col(&self, j: usize) -> (&[u32], &[T]) {
        self.outer_view(j)
    }

    /// The CSR form of the same matrix, O(nnz + nrows).
    pub fn to_csr(&self) -> Result<CsrOwned<T>, SparseError> {
        self.check_flippable()?;
        Ok(self.flip_storage())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small() -> CsrOwned<f32> {
        // [[1 0 2]
        //  [0 0 0]
        //  [0 3 0]
        //  [4 0 5]]
        CsrOwned::new(
            4,
            3,
            vec![0, 2, 2, 3, 5],
            vec![0, 2, 1, 0, 2],
            vec![1.0, 2.0, 3.0, 4.0, 5.0],
        )
        .unwrap()
    }

    #[test]
    fn accessors_and_dense() {
        let a = small();
        assert_eq!((a.nrows(), a.ncols(), a.nnz()), (4, 3, 5));
        assert_eq!(a.row(3), (&[0u32, 2][..], &[4.0f32, 5.0][..]));
        assert_eq!(a.row(1).0.len(), 0);
        assert_eq!(
            a.to_dense(),
            vec![1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 4.0, 0.0, 5.0]
        );
    }

    #[test]
    fn view_wraps_borrowed_slices_without_copy() {
        let indptr = [0u64, 1, 2];
        let indices = [1u32, 0];
        let data = [2.0f32, 3.0];
        let v = CsrView::new(2, 2, &indptr[..], &indices[..], &data[..]).unwrap();
        assert!(core::ptr::eq(v.indices().as_ptr(), indices.as_ptr()));
        assert_eq!(v.to_owned().view(), v);
    }

    #[test]
    fn constructor_rejects_each_broken_invariant() {
        let ok = |p: Vec<u64>, i: Vec<u32>, d: Vec<f32>| CsrOwned::new(2, 3, p, i, d);
        assert!(matches!(
            ok(vec![0, 1], vec![0], vec![1.0]),
            Err(SparseError::IndptrLength { .. })
        ));
        assert!(matches!(
            ok(vec![1, 1, 1], vec![0], vec![1.0]),
            Err(SparseError::IndptrStart { .. })
        ));
        assert!(matches!(
            ok(vec![0, 1, 2], vec![0], vec![1.0]),
            Err(SparseError::IndptrEnd { .. })
        ));
        assert!(matches!(
            ok(vec![0, 2, 1], vec![0], vec![1.0]),
            Err(SparseError::IndptrNotMonotone { outer: 1, .. })
        ));
        assert!(matches!(
            ok(vec![0, 1, 2], vec![0, 1], vec![1.0]),
            Err(SparseError::LengthMismatch { .. })
        ));
        assert!(matches!(
            ok(vec![0, 1, 2], vec![0, 3], vec![1.0, 1.0]),
            Err(SparseError::IndexOutOfBounds {
                outer: 1,
                index: 3,
                ..
            })
        ));
        assert!(matches!(
            ok(vec![0, 2, 2], vec![1, 1], vec![1.0, 1.0]),
            Err(SparseError::UnsortedIndices { outer: 0, .. })
        ));
        assert!(matches!(
            ok(vec![0, 2, 2], vec![2, 1], vec![1.0, 1.0]),
            Err(SparseError::UnsortedIndices { .. })
        ));
        let empty = CsrOwned::<f64>::new(0, 0, vec![0], vec![], vec![]).unwrap();
        assert_eq!(empty.nnz(), 0);
    }

    #[test]
    fn transpose_view_is_the_transposed_matrix() {
        let a = small();
        let t = a.transpose_view();
        assert_eq!((t.nrows(), t.ncols()), (3, 4));
        let dense = a.to_dense();
        let dense_t = t.to_dense();
        for i in 0..4 {
            for j in 0..3 {
                assert_eq!(dense[i * 3 + j], dense_t[j * 4 + i]);
            }
        }
    }

    fn triplets() -> impl Strategy<Value = (usize, usize, Vec<(u32, u32, f64)>)> {
        (0usize..12, 0usize..12).prop_flat_map(|(r, c)| {
            let entries = if r == 0 || c == 0 {
                Just(Vec::new()).boxed()
            } else {
                proptest::collection::vec(
                    (
                        0..u32::try_from(r).unwrap(),
                        0..u32::try_from(c).unwrap(),
                        -4i32..5,
                    ),
                    0..60,
                )
                .prop_map(|v| {
                    v.into_iter()
                        .map(|(a, b, x)| (a, b, f64::from(x)))
                        .collect()
                })
                .boxed()
            };
            (Just(r), Just(c), entries)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn from_triplets_sums_duplicates_and_validates((r, c, t) in triplets()) {
            let rows: Vec<u32> = t.iter().map(|e| e.0).collect();
            let cols: Vec<u32> = t.iter().map(|e| e.1).collect();
            let vals: Vec<f64> = t.iter().map(|e| e.2).collect();
            let a = CsrOwned::from_triplets(r, c, &rows, &cols, &vals).unwrap();
            let mut dense = vec![0.0; r * c];
            for &(i, j, v) in &t {
                dense[i as usize * c + j as usize] += v;
            }
            prop_assert_eq!(a.to_dense(), dense.clone());
            // The result satisfies every invariant.
            let (p, i, d) = a.clone().into_raw_parts();
            prop_assert!(CsrOwned::new(r, c, p, i, d).is_ok());
            // Same matrix through the CSC builder and the conversions.
            let b = CscOwned::from_triplets(r, c, &rows, &cols, &vals).unwrap();
            prop_assert_eq!(b.to_dense(), dense);
            prop_assert_eq!(a.to_csc().unwrap(), b.clone());
            prop_assert_eq!(b.to_csr().unwrap(), a);
        }
    }

    #[test]
    fn from_triplets_rejects_bad_input() {
        assert!(matches!(
            CsrOwned::<f32>::from_triplets(2, 2, &[0], &[0, 1], &[1.0]),
            Err(SparseError::TripletLength { .. })
        ));
        assert!(matches!(
            CsrOwned::<f32>::from_triplets(2, 2, &[0, 1], &[0, 2], &[1.0, 1.0]),
            Err(SparseError::IndexOutOfBounds { position: 1, .. })
        ));
    }
}
