//! From a partitioned graph to chunk files and back.
//!
//! [`ChunkBuilder`] takes the [`Graph`](crate::graph::Graph) (node data), Â in original ids
//! (from [`crate::normalize`]) and a [`Partition`](crate::partition::Partition); it renumbers
//! the nodes part by part, finds the halo lists ([`HaloLists`]) and builds each part's
//! [`PartChunk`]: its rows of Â split by source part into blocks over compacted columns (CSR and
//! CSC), halo receive and send lists, and its nodes' features, labels, masks and original ids;
//! with [`ChunkBuilder::with_edge_weights`], also the graph's own weight of each entry of Â.
//! [`write_chunk_dir`] writes all chunks plus the partition map and `manifest.json`;
//! [`ChunkDir`] opens such a directory, loads chunks (memory-mapped, validated against the
//! manifest), checks them together and reassembles Â.
//!
//! Time and memory are linear in the non-zeros of Â (plus P·N/64 bitmap words for the halo
//! scan); parts are built in parallel. [`BoundedBuilder`] builds the same chunks from edges
//! bucketed by part into files ([`EdgeBuckets`]), never holding more than one part's rows of
//! Â; both feed [`write_chunk_dir`] through [`PartChunkBuilder`].

mod bounded;
mod build;
mod dir;
mod manifest;
mod park;

use std::path::{Path, PathBuf};
use std::string::String;

pub use bounded::{BoundedBuilder, EdgeBuckets};
pub use build::{ChunkBuilder, HaloLists, PartChunk};
pub use dir::{
    check_consistency, chunk_file_name, reassemble, stale_temporary_of, write_chunk_dir, ChunkDir,
    DirLock, PartChunkBuilder, WriteOptions, WriteTimings,
};
pub use manifest::{
    fingerprint_hex, Manifest, ManifestChunk, ManifestFile, MANIFEST_FILE, MANIFEST_FORMAT,
    MANIFEST_VERSION, PARTITION_MAP_FILE,
};
pub use park::ParkedEdges;

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

/// Writing, opening or validating a chunk directory failed. Messages name the file and, for
/// inconsistencies, the chunk section or header field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkDirError {
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `manifest.json` is missing, not JSON, or breaks its rules.
    #[error("{}: {reason}", path.display())]
    Manifest {
        /// The manifest's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The directory holds a different partition and `force` was not given.
    #[error(
        "{} already holds a different partition ({existing}); pass --force to replace it, \
         or choose another directory",
        dir.display()
    )]
    DifferentPartition {
        /// The directory.
        dir: PathBuf,
        /// What it holds.
        existing: String,
    },
    /// The output directory holds an entry that is not a chunk directory's own file: a writer
    /// of chunk directories replaces its output as a whole and never touches other files.
    #[error(
        "{} holds {}{}, which `distspmm partition` did not write; it replaces its output \
         directory as a whole and never touches other files, so it refuses: give a new or \
         empty directory as --out, or move those files elsewhere (--force replaces only an \
         earlier chunk directory)",
        dir.display(),
        entry.display(),
        and_more(*others)
    )]
    Foreign {
        /// The output directory.
        dir: PathBuf,
        /// Its first foreign entry (in name order).
        entry: PathBuf,
        /// How many more there are.
        others: usize,
    },
    /// Another writer holds the directory's lock (see [`DirLock`]).
    #[error(
        "another `distspmm partition` is writing {} right now (it holds {}): wait for it to \
         finish, or write to another directory",
        dir.display(),
        lock.display()
    )]
    Busy {
        /// The directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// A part outside `0..P` was asked for.
    #[error("part {part} does not exist: the directory has {parts} parts")]
    NoSuchPart {
        /// The part asked for.
        part: u32,
        /// P.
        parts: u32,
    },
    /// A chunk file is unreadable or invalid on its own.
    #[error(transparent)]
    Chunk(#[from] chunk_format::ChunkFileError),
    /// A chunk disagrees with the manifest or with another chunk.
    #[error("{}, {section}: {detail}", file.display())]
    Inconsistent {
        /// The chunk (or map) file at fault.
        file: PathBuf,
        /// The section or header field.
        section: &'static str,
        /// What disagrees.
        detail: String,
    },
    /// Building the chunks failed.
    #[error(transparent)]
    Build(#[from] ChunkBuildError),
    /// The edges cannot be normalised (the bounded-memory builder normalises part by part).
    #[error(transparent)]
    Normalize(#[from] crate::normalize::NormalizeError),
    /// The partition map could not be written or read.
    #[error(transparent)]
    Partition(#[from] crate::partition::PartitionError),
    /// An array does not fit in memory (e.g. the parked edges read back).
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
}

impl From<crate::workdir::WorkDirError> for ChunkDirError {
    fn from(e: crate::workdir::WorkDirError) -> Self {
        ChunkDirError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// ` (and N more entries)` for N > 0.
fn and_more(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " (and 1 more entry)".into(),
        n => std::format!(" (and {n} more entries)"),
    }
}

/// The error for an I/O failure on `path` (every file of this module names its path).
fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ChunkDirError + '_ {
    move |source| ChunkDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests;
