//! Errors of the sparse and dense constructors.

/// A sparse or dense matrix whose structure is not valid, named by what and where.
///
/// `axis` is `"row"` for CSR and `"column"` for CSC: the compressed ("outer") dimension.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SparseError {
    /// The pointer array does not have one entry per outer index plus one.
    #[error("the {axis} pointer array has {actual} entries, expected {expected} ({axis}s + 1)")]
    IndptrLength {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// The required length.
        expected: usize,
        /// The given length.
        actual: usize,
    },
    /// The pointer array does not start at 0.
    #[error("the {axis} pointer array starts at {first}, expected 0")]
    IndptrStart {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// The first entry.
        first: u64,
    },
    /// The pointer array decreases.
    #[error("the {axis} pointer array decreases at {axis} {outer}: {start} > {end}")]
    IndptrNotMonotone {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// The outer index whose range is reversed.
        outer: usize,
        /// Its start offset.
        start: u64,
        /// Its end offset.
        end: u64,
    },
    /// The last pointer is not the number of stored entries.
    #[error("the {axis} pointer array ends at {last}, but there are {nnz} stored entries")]
    IndptrEnd {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// The last entry of the pointer array.
        last: u64,
        /// The length of the index array.
        nnz: usize,
    },
    /// The index and value arrays differ in length.
    #[error("{indices} indices but {values} values")]
    LengthMismatch {
        /// The length of the index array.
        indices: usize,
        /// The length of the value array.
        values: usize,
    },
    /// An index is not below the inner dimension.
    #[error("{axis} {outer}, entry {position}: index {index} is out of range (dimension {bound})")]
    IndexOutOfBounds {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// The outer index (row of a CSR, column of a CSC); for triplets, the triplet position.
        outer: usize,
        /// The position in the index array.
        position: usize,
        /// The offending index.
        index: u64,
        /// The dimension it must stay below.
        bound: usize,
    },
    /// Indices of one row (column) are not strictly increasing: unsorted or duplicated.
    #[error(
        "{axis} {outer}, entry {position}: index {index} does not follow {previous} \
         (indices must be sorted without duplicates; use from_triplets to sort and merge)"
    )]
    UnsortedIndices {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// The outer index.
        outer: usize,
        /// The position in the index array.
        position: usize,
        /// The index before it.
        previous: u32,
        /// The offending index.
        index: u32,
    },
    /// A dimension does not fit the index type (`u32` indices) or the size overflows `usize`.
    #[error("dimension {dim} is too large: {reason}")]
    DimensionTooLarge {
        /// The offending dimension.
        dim: usize,
        /// Why it is too large.
        reason: &'static str,
    },
    /// An array of the matrix could not be allocated.
    #[error("cannot allocate {bytes} bytes for the matrix's arrays: not enough memory")]
    Allocation {
        /// Bytes of the array refused.
        bytes: u64,
    },
    /// Triplet arrays of different lengths.
    #[error("triplet arrays differ in length: {rows} row indices, {cols} column indices, {values} values")]
    TripletLength {
        /// Row index count.
        rows: usize,
        /// Column index count.
        cols: usize,
        /// Value count.
        values: usize,
    },
    /// A dense view whose leading dimension is smaller than its column count.
    #[error("leading dimension {ld} is smaller than the {cols} columns")]
    LeadingDimension {
        /// The leading dimension (elements between consecutive rows).
        ld: usize,
        /// The number of columns.
        cols: usize,
    },
    /// A dense view whose buffer is too short for its shape.
    #[error("dense buffer of {len} elements is too short for {rows} rows × {cols} columns with leading dimension {ld} (needs {needed})")]
    DenseTooShort {
        /// Rows of the view.
        rows: usize,
        /// Columns of the view.
        cols: usize,
        /// Leading dimension.
        ld: usize,
        /// Elements needed.
        needed: usize,
        /// Elements given.
        len: usize,
    },
    /// A column or row range outside the view.
    #[error("{axis} range {start}..{end} is outside 0..{bound}")]
    RangeOutOfBounds {
        /// `"row"` or `"column"`.
        axis: &'static str,
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
        /// The view's extent along that axis.
        bound: usize,
    },
}
