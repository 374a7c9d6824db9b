//! The on-disk chunk: what one rank of a `P`-way partition loads — its rows of Â split into one
//! block per source part (CSR and CSC over compacted columns), the halo send/receive lists, and
//! optional features, labels (or multi-label targets), masks and the graph's own edge weights
//! at Â's entries.
//!
//! The byte layout is specified in `docs/chunk-format.md`. [`ChunkView`] is a zero-copy,
//! validating view over the bytes of a chunk (a memory map or an [`AlignedBuf`]): once
//! [`ChunkView::parse`] succeeds, every offset, index and count in the view is known to be in
//! range, so kernels may index without further checks. [`encode`] lays out a chunk in memory; with
//! the `std` feature, [`write_chunk`] streams one to disk atomically and [`MappedChunk`] maps and
//! validates one.
//!
//! The crate is `#![no_std]` + `alloc`; the `std` feature (default) adds the file helpers and
//! the chunk directory ([`dir`]: the manifest, the partition map, the atomic directory writer
//! and its lock, and [`dir::ChunkDir`], which opens a directory and loads its chunks).
//!
//! ```
//! use chunk_format::{encode, BlockView, ChunkContents, ChunkView};
//!
//! // One part of two nodes, Â = [[1, 2], [0, 3]]: only the diagonal block, no halo.
//! let diagonal = BlockView {
//!     src_part: 0,
//!     nrows: 2,
//!     ncols: 2,
//!     csr_rowptr: &[0, 2, 3],
//!     csr_cols: &[0, 1, 1],
//!     csr_vals: &[1.0, 2.0, 3.0],
//!     csc_colptr: &[0, 1, 3],
//!     csc_rows: &[0, 0, 1],
//!     csc_vals: &[1.0, 2.0, 3.0],
//!     edge_weights: None, // or the weight in A of each entry (format 1.1)
//! };
//! let contents = ChunkContents {
//!     part_id: 0,
//!     fingerprint: [7; 16],
//!     part_offsets: &[0, 2],
//!     blocks: vec![diagonal],
//!     halo_recv_offsets: &[0, 0],
//!     halo_recv: &[],
//!     halo_send_offsets: &[0, 0],
//!     halo_send: &[],
//!     feature_dim: 0,
//!     features: None,
//!     num_classes: 0,
//!     labels: None,
//!     targets: None, // or multi-label 0/1 targets, n_p × C (format 1.2)
//!     masks: None,
//!     original_ids: &[1, 0],
//! };
//! let bytes = encode(&contents)?; // an AlignedBuf; `write_chunk(path, &contents)` for a file
//! let view = ChunkView::parse(&bytes)?;
//! assert_eq!(view.header().nnz, 3);
//! assert_eq!(view.diagonal_block().csr_vals, [1.0, 2.0, 3.0]);
//! # Ok::<(), chunk_format::ChunkError>(())
//! ```
#![no_std]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

#[cfg(target_endian = "big")]
compile_error!(
    "chunk-format views little-endian file data in place without byte swapping; big-endian targets are not supported"
);

mod aligned;
#[cfg(feature = "std")]
pub mod atomic;
mod contents;
#[cfg(feature = "std")]
pub mod dir;
mod error;
#[cfg(feature = "std")]
mod file;
mod layout;
mod validate;
mod view;
#[cfg(feature = "std")]
pub mod workdir;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

pub use aligned::AlignedBuf;
pub use contents::{encode, encode_to_vec, ChunkContents};
pub use error::ChunkError;
#[cfg(feature = "std")]
pub use file::{
    describe_file_type, open_regular, read_regular, write_chunk, ChunkFileError, MappedChunk,
    WriteSummary,
};
pub use layout::{
    ChunkHeader, ElemType, SectionEntry, SectionKind, ValueDtype, Version, BUFFER_ALIGN,
    FORMAT_VERSION, HEADER_LEN, INDEX_WIDTH, MAGIC, SECTION_ALIGN, SECTION_ENTRY_LEN,
    SECTION_FLAG_OPTIONAL, TARGET_UNLABELLED,
};
pub use view::{BlockView, ChunkView, ParseOptions};
