//! Sparse matrices in CSR and CSC form over owned or borrowed storage, and row-major dense views
//! with a leading dimension.
//!
//! [`Csr`] and [`Csc`] are one type, [`Compressed`], read along rows or columns; any storage that
//! derefs to slices works, so a memory-mapped chunk is a [`CsrView`] with no copy. Row pointers
//! are `u64`, indices `u32`, values a [`Scalar`] (`f32` or `f64`).
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
pub(crate) mod par;
mod scalar;

#[cfg(feature = "std")]
pub(crate) use assemble::{assemble, TripletSource};
#[cfg(feature = "std")]
pub use buffer::PageBuffer;
pub use compressed::{
    ByCol, ByRow, Compressed, Csc, CscOwned, CscView, Csr, CsrOwned, CsrView, Orientation,
};
pub use dense::{Dense, DenseOwned, DenseView, DenseViewMut};
pub use error::SparseError;
pub use scalar::Scalar;
