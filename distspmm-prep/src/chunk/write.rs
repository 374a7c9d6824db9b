//! Writing a whole chunk directory from a builder: [`PartChunkBuilder`] (what both builders
//! give) seen as the [`ChunkSource`] that `chunk_format::dir::write_dir` writes.

use std::path::Path;
use std::vec::Vec;

use chunk_format::dir::{
    partition_map, write_dir, ChunkDirError, ChunkSource, DirLock, Manifest, WriteOptions,
};
use chunk_format::workdir::{Kind, WorkDir};
use chunk_format::ChunkContents;

use super::{ChunkBuilder, HaloLists, PartChunk};
use crate::partition::{Adjacency, Partition, Renumbering};

/// What [`write_chunk_dir`] builds the chunks from: [`ChunkBuilder`] (the whole Â in memory,
/// parts built in parallel) or [`BoundedBuilder`](super::BoundedBuilder) (one part's rows at a
/// time). Both give the same chunks.
pub trait PartChunkBuilder: Sync {
    /// The partition.
    fn partition(&self) -> &Partition;
    /// Its renumbering.
    fn renumbering(&self) -> &Renumbering;
    /// The halo lists of every part.
    fn halo(&self) -> &HaloLists;
    /// The partition fingerprint every chunk carries.
    fn fingerprint(&self) -> [u8; 16];
    /// Feature columns (0 without features).
    fn feature_dim(&self) -> u32;
    /// Classes (0 without labels).
    fn num_classes(&self) -> u32;
    /// Non-zeros of Â.
    fn nnz(&self) -> u64;
    /// The graph's directed edge count (when [`WriteOptions::edges`] does not give it).
    fn edges(&self) -> u64;
    /// The partition's edge cut (when [`WriteOptions::edge_cut`] does not give it).
    fn edge_cut(&self) -> Result<u64, ChunkDirError>;
    /// Whether parts may be built at the same time (more memory, less time).
    fn parts_in_parallel(&self) -> bool;
    /// Builds part `p`'s chunk; `scratch` is a work array reused across calls.
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<PartChunk, ChunkDirError>;
}

impl PartChunkBuilder for ChunkBuilder<'_> {
    fn partition(&self) -> &Partition {
        ChunkBuilder::partition(self)
    }
    fn renumbering(&self) -> &Renumbering {
        ChunkBuilder::renumbering(self)
    }
    fn halo(&self) -> &HaloLists {
        ChunkBuilder::halo(self)
    }
    fn fingerprint(&self) -> [u8; 16] {
        ChunkBuilder::fingerprint(self)
    }
    fn feature_dim(&self) -> u32 {
        ChunkBuilder::feature_dim(self)
    }
    fn num_classes(&self) -> u32 {
        ChunkBuilder::num_classes(self)
    }
    fn nnz(&self) -> u64 {
        ChunkBuilder::nnz(self)
    }
    fn edges(&self) -> u64 {
        self.graph().num_edges() as u64
    }
    fn edge_cut(&self) -> Result<u64, ChunkDirError> {
        let g = self.graph();
        let adjacency = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst)?;
        Ok(ChunkBuilder::partition(self).edge_cut(&adjacency)?)
    }
    fn parts_in_parallel(&self) -> bool {
        true
    }
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<PartChunk, ChunkDirError> {
        let chunk = self.build_with_scratch(p, scratch);
        // After the reads of the node data: a mapped input that changed under them is refused.
        self.graph()
            .check_unchanged()
            .map_err(super::ChunkBuildError::from)?;
        Ok(chunk)
    }
}

/// A [`PartChunkBuilder`] as the directory writer's [`ChunkSource`].
struct Source<'b, B: ?Sized>(&'b B);

impl<B: PartChunkBuilder + ?Sized> ChunkSource for Source<'_, B> {
    type Part = PartChunk;
    fn parts(&self) -> u32 {
        self.0.partition().parts()
    }
    fn nodes(&self) -> u64 {
        self.0.partition().num_nodes() as u64
    }
    fn partition_map(&self) -> Vec<u8> {
        let partition = self.0.partition();
        partition_map::encode(partition.parts(), partition.method(), partition.part_of())
    }
    fn partition_method(&self) -> &str {
        self.0.partition().method()
    }
    fn imbalance(&self) -> f64 {
        self.0.partition().imbalance()
    }
    fn part_offsets(&self) -> &[u64] {
        self.0.renumbering().offsets()
    }
    fn halo_rows(&self, p: u32) -> u64 {
        self.0.halo().halo_rows(p as usize)
    }
    fn fingerprint(&self) -> [u8; 16] {
        self.0.fingerprint()
    }
    fn feature_dim(&self) -> u32 {
        self.0.feature_dim()
    }
    fn num_classes(&self) -> u32 {
        self.0.num_classes()
    }
    fn nnz(&self) -> u64 {
        self.0.nnz()
    }
    fn edges(&self) -> u64 {
        self.0.edges()
    }
    fn edge_cut(&self) -> Result<u64, ChunkDirError> {
        self.0.edge_cut()
    }
    fn parts_in_parallel(&self) -> bool {
        self.0.parts_in_parallel()
    }
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<PartChunk, ChunkDirError> {
        self.0.build_part(p, scratch)
    }
    fn contents<'a>(&self, part: &'a PartChunk) -> ChunkContents<'a> {
        part.contents()
    }
}

/// Builds every part's chunk with `builder` and writes the directory `dir`: the partition map,
/// the chunks and `manifest.json` last, replacing `dir` atomically under its lock, as
/// `chunk_format::dir::write_dir` says (which refuses a directory holding other files, or a
/// different partition without `options.force`).
pub fn write_chunk_dir(
    dir: &Path,
    builder: &(impl PartChunkBuilder + ?Sized),
    options: &WriteOptions<'_>,
) -> Result<Manifest, ChunkDirError> {
    write_dir(dir, &Source(builder), options)
}

/// The bounded builder's work directory's kind, `.<name>.buckets-<pid>`: its bucket and rows
/// files, and the parked edge arrays.
const BUCKETS: Kind = Kind {
    name: "buckets",
    owns: |name| super::bounded::is_work_file(name) || super::park::is_work_file(name),
};

/// A fresh work directory `.<name>.buckets-<pid>` beside the directory `lock` holds, after
/// removing those that killed writers left (the lock says none is in use).
pub(super) fn scratch_dir(lock: &DirLock) -> Result<WorkDir, ChunkDirError> {
    lock.work_dir(BUCKETS)
}
