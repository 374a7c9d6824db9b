//! From a partitioned graph to chunk files, and the checks that need the whole partition.
//!
//! [`ChunkBuilder`] takes the [`Graph`](crate::graph::Graph) (node data), Â in original ids
//! (from [`crate::normalize`]) and a [`Partition`](crate::partition::Partition); it renumbers
//! the nodes part by part, finds the halo lists ([`HaloLists`]) and builds each part's
//! [`PartChunk`]: its rows of Â split by source part into blocks over compacted columns (CSR and
//! CSC), halo receive and send lists, and its nodes' features, labels, masks and original ids;
//! with [`ChunkBuilder::with_edge_weights`], also the graph's own weight of each entry of Â.
//! [`write_chunk_dir`] writes all chunks plus the partition map and `manifest.json` through
//! `chunk_format::dir` (the directory's format, lock and atomic replacement live there);
//! [`VerifyDir`] checks an opened directory against its partition map and reassembles Â.
//!
//! Time and memory are linear in the non-zeros of Â (plus P·N/64 bitmap words for the halo
//! scan); parts are built in parallel. [`BoundedBuilder`] builds the same chunks from edges
//! bucketed by part into files ([`EdgeBuckets`]), never holding more than one part's rows of
//! Â; both feed [`write_chunk_dir`] through [`PartChunkBuilder`].

mod bounded;
mod build;
pub mod distributed;
mod park;
mod verify;
mod write;

use std::path::Path;

use chunk_format::dir::ChunkDirError;

pub use bounded::{BoundedBuilder, EdgeBuckets};
pub use build::{ChunkBuilder, HaloLists, PartChunk};
pub use park::ParkedEdges;
pub use verify::{reassemble, VerifyDir};
pub use write::{write_chunk_dir, PartChunkBuilder};

/// The graph, Â and partition given to [`ChunkBuilder::new`] do not fit together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkBuildError {
    /// The graph itself is invalid.
    #[error(transparent)]
    Graph(#[from] crate::graph::GraphError),
    /// Sizes disagree (Â vs graph vs partition) or a count exceeds the chunk format's types.
    #[error("{0}")]
    Mismatch(String),
}

/// The error for an I/O failure on `path` (every file of this module names its path).
fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ChunkDirError + '_ {
    move |source| ChunkDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A failure of the builders' own, as the chunk directory's writer reports it.
macro_rules! build_error {
    ($($error:ty),*) => {$(
        impl From<$error> for ChunkDirError {
            fn from(e: $error) -> Self {
                ChunkDirError::Build(Box::new(e))
            }
        }
    )*};
}
build_error!(
    ChunkBuildError,
    crate::normalize::NormalizeError,
    crate::partition::PartitionError
);

/// An array that does not fit in memory, as the chunk directory's writer reports it.
fn out_of_memory(e: distspmm_sparse::memory::MemoryError) -> ChunkDirError {
    ChunkDirError::Build(Box::new(e))
}

#[cfg(test)]
mod tests;
