//! The on-disk chunk: what one rank of a `P`-way partition loads — its rows of Â split into one
//! block per source part (CSR and CSC over compacted columns), the halo send/receive lists, and
//! optional features, labels and masks.
//!
//! The byte layout is specified in `docs/chunk-format.md`. [`ChunkView`] is a zero-copy,
//! validating view over the bytes of a chunk (a memory map or an [`AlignedBuf`]): once
//! [`ChunkView::parse`] succeeds, every offset, index and count in the view is known to be in
//! range, so kernels may index without further checks. [`encode`] lays out a chunk in memory; with
//! the `std` feature, [`write_chunk`] streams one to disk atomically and [`MappedChunk`] maps and
//! validates one.
//!
//! The crate is `#![no_std]` + `alloc`; the `std` feature (default) adds the file helpers.
#![no_std]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

#[cfg(target_endian = "big")]
compile_error!(
    "chunk-format views little-endian file data in place without byte swapping; big-endian targets are not supported"
);

mod aligned;
mod contents;
mod error;
#[cfg(feature = "std")]
mod file;
mod layout;
mod validate;
mod view;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

pub use aligned::AlignedBuf;
pub use contents::{encode, encode_to_vec, ChunkContents};
pub use error::ChunkError;
#[cfg(feature = "std")]
pub use file::{write_chunk, ChunkFileError, MappedChunk, WriteSummary};
pub use layout::{
    ChunkHeader, ElemType, SectionEntry, SectionKind, ValueDtype, Version, BUFFER_ALIGN,
    FORMAT_VERSION, HEADER_LEN, INDEX_WIDTH, MAGIC, SECTION_ALIGN, SECTION_ENTRY_LEN,
    SECTION_FLAG_OPTIONAL,
};
pub use view::{BlockView, ChunkView, ParseOptions};
