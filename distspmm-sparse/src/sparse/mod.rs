//! Sparse matrices in CSR and CSC form over owned or borrowed storage, and row-major dense views
//! with a leading dimension.
//!
//! [`Csr`] and [`Csc`] are one type, [`Compressed`], read along rows or columns; any storage that
//! derefs to slices works, so a memory-mapped chunk is a [`CsrView`] with no copy. Row pointers
//! are `u64`, indices `u32`, values a [`Scalar`] (`f32` or `f64`).
//!
//! ```
//! use distspmm_sparse::sparse::CsrView;
//!
//! // Borrowed arrays (e.g. slices of a memory-mapped chunk): checked, not copied.
//! let (indptr, indices, data) = ([0u64, 2, 3], [0u32, 2, 1], [1.0f32, 2.0, 3.0]);
//! let a = CsrView::new(2, 3, &indptr[..], &indices[..], &data[..])?;
//! assert_eq!(a.row(0), (&[0u32, 2][..], &[1.0f32, 2.0][..]));
//! let at = a.transpose_view(); // the same arrays read as the CSC of Aᵀ
//! assert_eq!((at.nrows(), at.ncols()), (3, 2));
//! # Ok::<(), distspmm_sparse::sparse::SparseError>(())
//! ```
//!
//! Duplicates: [`Compressed::new`] requires strictly increasing indices within each row (column)
//! and rejects unsorted or duplicated ones with the position; [`Compressed::from_triplets`]
//! accepts entries in any order and merges duplicates by summing them.

mod assemble;
#[cfg(feature = "std")]
mod buffer;
mod compressed;
mod dense;
mod error;
pub mod par;
mod scalar;

#[cfg(feature = "std")]
pub use assemble::{assemble, TripletSource};
#[cfg(feature = "std")]
pub use buffer::PageBuffer;
pub use compressed::{
    ByCol, ByRow, Compressed, Csc, CscOwned, CscView, Csr, CsrOwned, CsrView, Orientation,
};
pub use dense::{Dense, DenseOwned, DenseView, DenseViewMut};
pub use error::SparseError;
pub use scalar::Scalar;
