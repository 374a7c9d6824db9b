//! Building the chunks without holding the whole normalised Â: the edges are bucketed by the
//! part of their row node into files, then each part's rows are normalised and its chunk built
//! on its own.
//!
//! 1. [`EdgeBuckets::write`] (one pass over the edges): each edge `u → v` is Â's entry
//!    `(v, u)`, so it goes to part(v)'s bucket file, in edge order, with its weight; the
//!    self-loop diagonal of `A + I` (O(N)) is kept in memory.
//! 2. [`BoundedBuilder::new`] (a first pass over the parts): each bucket is read and assembled
//!    into the part's merged, unscaled rows exactly as [`crate::normalize::adjacency`]
//!    assembles all rows (same triplet order per row, so duplicates and self loops sum in the
//!    same order), written back as the part's rows file; the rows give the part's degrees
//!    (for the normalisation, O(N) for all parts) and its halo receive lists (sends are their
//!    transpose, so they need every part first).
//! 3. [`BoundedBuilder`]'s chunks (one part at a time): the rows file is read, its values kept
//!    as the weights of `A` (`normalize::raw_weights`), scaled with the same factors and
//!    rounding as `normalize`, and laid out by the same code as
//!    [`ChunkBuilder`](super::ChunkBuilder)'s chunks; the node data come from the graph.
//!
//! The chunks are byte-identical to the in-memory builder's given
//! [`normalize::adjacency_with_weights`]'s weights (both record `A`'s weights). Memory beyond
//! O(N) arrays: the largest part's bucket and rows in the first pass, its rows, their weights
//! and chunk in the second; disk: the buckets (8 bytes per edge, 12 with weights), then the rows
//! files (8 bytes per non-zero).

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::vec::Vec;

use crate::graph::Graph;
use crate::normalize::{self, Normalization, NormalizeError, SelfLoops};
use crate::partition::{Partition, Renumbering};
use distspmm_sparse::index;
use distspmm_sparse::sparse::{assemble, TripletSource};

use super::build::{split_location, HaloScan, Layout, PartRows};
use super::write::PartChunkBuilder;
use super::{io_error, ChunkBuildError, HaloLists, PartChunk};
use chunk_format::dir::{ChunkDirError, DirLock};
use chunk_format::workdir::WorkDir;

/// Bytes of write buffer per bucket, at most (less with many parts: 256 MiB in all).
const BUCKET_BUFFER: usize = 1 << 20;

/// The edges of a graph bucketed by the part of their row node (Â's row v lists v's
/// in-neighbours, so `u → v` goes to part(v)), in files of a work directory beside the output
/// directory, removed when this is dropped.
#[derive(Debug)]
pub struct EdgeBuckets {
    dir: WorkDir,
    parts: u32,
    num_nodes: usize,
    edges: u64,
    weighted: bool,
    norm: Normalization,
    /// The self loops of `A + I` (absent for [`Normalization::None`]).
    diagonal: Option<SelfLoops>,
}

impl EdgeBuckets {
    /// Writes the edges `src[e] → dst[e]` (weights optional) into one bucket per part of
    /// `partition`, in a work directory beside the directory `lock` holds. The edges are
    /// checked as [`normalize::adjacency`] checks them.
    pub fn write(
        lock: &DirLock,
        partition: &Partition,
        src: &[u32],
        dst: &[u32],
        weights: Option<&[f32]>,
        norm: Normalization,
    ) -> Result<Self, ChunkDirError> {
        let num_nodes = partition.num_nodes();
        normalize::check_edges(num_nodes, src, dst, weights)?;
        let (n, e) = (num_nodes, src.len());
        let what = || std::format!("the self loops of {n} nodes and {e} edges");
        let diagonal = normalize::self_loops(num_nodes, src, dst, weights, norm, &what)?;
        let dir = super::write::scratch_dir(lock)?;
        let parts = partition.parts();
        let capacity = (256usize << 20) / (parts as usize).max(1);
        let capacity = capacity.clamp(64 << 10, BUCKET_BUFFER);
        let mut files = Vec::with_capacity(parts as usize);
        for p in 0..parts {
            let path = bucket_path(dir.path(), p);
            let file = std::fs::File::create(&path).map_err(io_error(&path))?;
            files.push((BufWriter::with_capacity(capacity, file), path));
        }
        let part_of = partition.part_of();
        let skip_loops = diagonal.is_some();
        for (e, (&u, &v)) in src.iter().zip(dst).enumerate() {
            if skip_loops && u == v {
                continue;
            }
            let (out, path) = &mut files[part_of[v as usize] as usize];
            let mut record = [0u8; 12];
            record[..4].copy_from_slice(&v.to_ne_bytes());
            record[4..8].copy_from_slice(&u.to_ne_bytes());
            let len = match weights {
                Some(w) => {
                    record[8..].copy_from_slice(&w[e].to_ne_bytes());
                    12
                }
                None => 8,
            };
            out.write_all(&record[..len]).map_err(io_error(path))?;
        }
        for (out, path) in files {
            out.into_inner()
                .map_err(|e| e.into_error())
                .map_err(io_error(&path))?;
        }
        Ok(Self {
            dir,
            parts,
            num_nodes,
            edges: src.len() as u64,
            weighted: weights.is_some(),
            norm,
            diagonal,
        })
    }

    /// Directed edges bucketed.
    pub fn edges(&self) -> u64 {
        self.edges
    }

    /// Reads part `p`'s bucket and assembles its merged, unscaled rows (local row order,
    /// columns in original ids), then removes the bucket.
    fn assemble_part(
        &self,
        p: u32,
        renumbering: &Renumbering,
        location: &[u64],
    ) -> Result<LocalRows, ChunkDirError> {
        let path = bucket_path(self.dir.path(), p);
        let bytes = std::fs::read(&path).map_err(io_error(&path))?;
        let nodes = renumbering.part_nodes(p);
        let record = if self.weighted { 12 } else { 8 };
        if bytes.len() % record != 0 {
            return Err(ChunkDirError::Io {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "a bucket file was cut short (was the work directory changed while it ran?)",
                ),
            });
        }
        let triplets = BucketTriplets {
            bytes: &bytes,
            record,
            location,
            nodes,
            diagonal: self.diagonal.as_ref(),
        };
        let (indptr, indices, data) = assemble(nodes.len(), &triplets).map_err(|failed| {
            normalize::assembly_failed(
                std::format!(
                    "the rows of part {p} ({} nodes, {} entries)",
                    nodes.len(),
                    triplets.len()
                ),
                failed.bytes,
            )
        })?;
        drop(bytes);
        std::fs::remove_file(&path).map_err(io_error(&path))?;
        Ok(LocalRows {
            indptr,
            indices,
            data,
            weights: None,
        })
    }
}

fn bucket_path(dir: &Path, p: u32) -> PathBuf {
    dir.join(std::format!("bucket-{p:05}"))
}

fn rows_path(dir: &Path, p: u32) -> PathBuf {
    dir.join(std::format!("rows-{p:05}"))
}

/// Whether `name` is one of the files above ([`bucket_path`], [`rows_path`]).
pub(super) fn is_work_file(name: &str) -> bool {
    chunk_format::workdir::numbered(name, "bucket-", "")
        || chunk_format::workdir::numbered(name, "rows-", "")
}

/// A part's bucket as the entries `(local row, original column, weight)` of its rows of `A`
/// (or `A + I`): the edges in edge order, then the diagonal — per row the order in which
/// `normalize` visits the same entries, so that [`assemble`] sums duplicates identically.
struct BucketTriplets<'a> {
    bytes: &'a [u8],
    record: usize,
    location: &'a [u64],
    nodes: &'a [u32],
    diagonal: Option<&'a SelfLoops>,
}

impl TripletSource<f32> for BucketTriplets<'_> {
    fn len(&self) -> usize {
        self.bytes.len() / self.record + self.diagonal.map_or(0, |_| self.nodes.len())
    }

    fn for_each(&self, mut f: impl FnMut(u32, u32, f32)) {
        let word = |r: &[u8], k: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&r[4 * k..4 * k + 4]);
            b
        };
        for r in self.bytes.chunks_exact(self.record) {
            let v = u32::from_ne_bytes(word(r, 0));
            let u = u32::from_ne_bytes(word(r, 1));
            let w = if self.record == 12 {
                f32::from_ne_bytes(word(r, 2))
            } else {
                1.0
            };
            f(split_location(self.location[v as usize]).1, u, w);
        }
        if let Some(d) = self.diagonal {
            for (i, &v) in self.nodes.iter().enumerate() {
                f(index::id(i), v, d.with_identity(v as usize));
            }
        }
    }
}

/// One part's rows of Â: CSR over its local rows, columns in original ids; once scaled, with
/// the weights of `A` at the same entries.
#[derive(Debug)]
pub(super) struct LocalRows {
    pub(super) indptr: Vec<u64>,
    pub(super) indices: Vec<u32>,
    pub(super) data: Vec<f32>,
    pub(super) weights: Option<Vec<f32>>,
}

impl PartRows for LocalRows {
    fn nrows(&self) -> usize {
        self.indptr.len() - 1
    }

    fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let range = index::offset(self.indptr[i])..index::offset(self.indptr[i + 1]);
        (&self.indices[range.clone()], &self.data[range])
    }

    fn has_weights(&self) -> bool {
        self.weights.is_some()
    }

    fn row_weights(&self, i: usize) -> Option<&[f32]> {
        let range = index::offset(self.indptr[i])..index::offset(self.indptr[i + 1]);
        self.weights.as_ref().map(|w| &w[range])
    }
}

impl LocalRows {
    pub(super) fn nnz(&self) -> u64 {
        self.indices.len() as u64
    }

    /// Turns part `p`'s merged, unscaled rows (of `nodes`, in local order) into its rows of Â
    /// with `A`'s weights beside them: the weights kept first (`normalize::raw_weights`, with
    /// the `diagonal` of `A + I`), then the values scaled by the per-node factors `inv` (by
    /// original id; empty for [`Normalization::None`]) with the same rounding as `normalize`.
    pub(super) fn normalise(
        &mut self,
        p: u32,
        nodes: &[u32],
        diagonal: Option<&SelfLoops>,
        inv: &[f64],
        norm: Normalization,
    ) -> Result<(), ChunkDirError> {
        let what = || std::format!("the edge weights of part {p} ({} entries)", self.nnz());
        self.weights = Some(normalize::raw_weights(
            &self.indptr,
            &self.indices,
            &self.data,
            diagonal,
            |i| nodes[i],
            &what,
        )?);
        if !inv.is_empty() {
            let row_inv: Vec<f64> = nodes.iter().map(|&v| inv[v as usize]).collect();
            normalize::scale_rows(
                &self.indptr,
                &self.indices,
                &mut self.data,
                &row_inv,
                inv,
                norm,
            );
            // As `normalize`; the entry named is the first in row order of the first part
            // that has one (`normalize` names the first in row order over all parts).
            if let Some((i, src)) =
                normalize::first_overflow(&self.indptr, &self.indices, &self.data)
            {
                return Err(NormalizeError::ScaledOverflow { src, dst: nodes[i] }.into());
            }
        }
        Ok(())
    }

    /// Writes the arrays, not the weights (native byte order: the file lives only as long as
    /// this process).
    fn save(&self, path: &Path) -> Result<(), ChunkDirError> {
        let file = std::fs::File::create(path).map_err(io_error(path))?;
        let mut out = BufWriter::with_capacity(BUCKET_BUFFER, file);
        let nnz = self.nnz();
        out.write_all(&nnz.to_ne_bytes())
            .and_then(|()| out.write_all(bytemuck::cast_slice(&self.indptr)))
            .and_then(|()| out.write_all(bytemuck::cast_slice(&self.indices)))
            .and_then(|()| out.write_all(bytemuck::cast_slice(&self.data)))
            .and_then(|()| out.flush())
            .map_err(io_error(path))
    }

    /// Reads what [`LocalRows::save`] wrote for `nrows` rows, then removes the file.
    fn load(path: &Path, nrows: usize) -> Result<Self, ChunkDirError> {
        let mut file = std::fs::File::open(path).map_err(io_error(path))?;
        let mut word = [0u8; 8];
        file.read_exact(&mut word).map_err(io_error(path))?;
        let changed = || ChunkDirError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a rows file does not hold what was written (was the work directory \
                 changed while it ran?)",
            ),
        };
        let nnz = usize::try_from(u64::from_ne_bytes(word)).map_err(|_| changed())?;
        let mut indptr = std::vec![0u64; nrows + 1];
        let mut indices = std::vec![0u32; nnz];
        let mut data = std::vec![0f32; nnz];
        file.read_exact(bytemuck::cast_slice_mut(&mut indptr))
            .and_then(|()| file.read_exact(bytemuck::cast_slice_mut(&mut indices)))
            .and_then(|()| file.read_exact(bytemuck::cast_slice_mut(&mut data)))
            .map_err(io_error(path))?;
        drop(file);
        std::fs::remove_file(path).map_err(io_error(path))?;
        if indptr[nrows] != nnz as u64 {
            return Err(changed());
        }
        Ok(Self {
            indptr,
            indices,
            data,
            weights: None,
        })
    }
}

/// Builds the same chunks as [`ChunkBuilder`](super::ChunkBuilder) from [`EdgeBuckets`],
/// holding one part's rows at a time (see the [module docs](self)). Parts are built one after
/// another, each in parallel inside; each part's chunk can be built once (its rows file is
/// consumed).
#[derive(Debug)]
pub struct BoundedBuilder<'a> {
    layout: Layout<'a>,
    buckets: EdgeBuckets,
    halo: HaloLists,
    /// Per original node, `D^-1/2` or `D^-1` (empty for [`Normalization::None`]).
    inv: Vec<f64>,
    nnz: u64,
}

impl<'a> BoundedBuilder<'a> {
    /// Renumbers, then reads every part's bucket once: its rows (saved for the chunk), the
    /// degrees and the halo lists. `graph` supplies the node data (its edge arrays may already
    /// be released); `partition` must be the one the buckets were written for.
    pub fn new(
        graph: &'a Graph,
        partition: &'a Partition,
        buckets: EdgeBuckets,
    ) -> Result<Self, ChunkDirError> {
        let layout = Layout::new(graph, partition)?;
        if buckets.num_nodes != graph.num_nodes || buckets.parts != partition.parts() {
            return Err(ChunkBuildError::Mismatch(std::format!(
                "the edge buckets hold {} nodes in {} parts but the graph has {} nodes and the \
                 partition {} parts",
                buckets.num_nodes,
                buckets.parts,
                graph.num_nodes,
                partition.parts()
            ))
            .into());
        }
        let norm = buckets.norm;
        let renumbering = layout.renumbering();
        let mut scan = HaloScan::new(graph.num_nodes);
        let what = || std::format!("the degrees of {} nodes", graph.num_nodes);
        let mut degree = if norm == Normalization::None {
            Vec::new()
        } else {
            distspmm_sparse::memory::try_filled(
                graph.num_nodes,
                0f64,
                what(),
                "use a machine with more memory",
            )
            .map_err(NormalizeError::from)?
        };
        // The first overflowing entry in row order over all parts, as `normalize` reports it.
        let mut overflow: Option<(u32, u32)> = None;
        let mut nnz = 0u64;
        for p in 0..partition.parts() {
            let rows = buckets.assemble_part(p, renumbering, layout.location())?;
            let nodes = renumbering.part_nodes(p);
            if let Some((i, col)) =
                normalize::first_overflow(&rows.indptr, &rows.indices, &rows.data)
            {
                let at = (nodes[i], col);
                overflow = Some(overflow.map_or(at, |o| o.min(at)));
            }
            if !degree.is_empty() {
                let part_degrees = normalize::row_degrees(&rows.indptr, &rows.data, &what)?;
                for (&v, d) in nodes.iter().zip(part_degrees) {
                    degree[v as usize] = d;
                }
            }
            scan.add_part(renumbering.offsets(), layout.location(), p, &rows);
            nnz += rows.nnz();
            rows.save(&rows_path(buckets.dir.path(), p))?;
        }
        if let Some((dst, src)) = overflow {
            return Err(NormalizeError::WeightOverflow { src, dst }.into());
        }
        // The degrees become their inverse powers in place.
        let mut inv = degree;
        if !inv.is_empty() {
            normalize::invert_degrees(&mut inv, norm)?;
        }
        let halo = scan.finish();
        layout.check_fits(&halo)?;
        Ok(Self {
            layout,
            buckets,
            halo,
            inv,
            nnz,
        })
    }

    /// The graph whose node data the chunks carry.
    pub fn graph(&self) -> &Graph {
        self.layout.graph()
    }
}

impl PartChunkBuilder for BoundedBuilder<'_> {
    fn partition(&self) -> &Partition {
        self.layout.partition()
    }
    fn renumbering(&self) -> &Renumbering {
        self.layout.renumbering()
    }
    fn halo(&self) -> &HaloLists {
        &self.halo
    }
    fn fingerprint(&self) -> [u8; 16] {
        self.layout.fingerprint()
    }
    fn feature_dim(&self) -> u32 {
        self.layout.feature_dim()
    }
    fn num_classes(&self) -> u32 {
        self.layout.num_classes()
    }
    fn nnz(&self) -> u64 {
        self.nnz
    }
    fn edges(&self) -> u64 {
        self.buckets.edges
    }
    fn edge_cut(&self) -> Result<u64, ChunkDirError> {
        Err(ChunkBuildError::Mismatch(
            "the bounded-memory builder no longer holds the edges: give the partition's edge \
             cut in WriteOptions::edge_cut"
                .into(),
        )
        .into())
    }
    fn parts_in_parallel(&self) -> bool {
        false
    }
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<PartChunk, ChunkDirError> {
        let nodes = self.layout.renumbering().part_nodes(p);
        let mut rows = LocalRows::load(&rows_path(self.buckets.dir.path(), p), nodes.len())?;
        rows.normalise(
            p,
            nodes,
            self.buckets.diagonal.as_ref(),
            &self.inv,
            self.buckets.norm,
        )?;
        let chunk = self.layout.build_part(&self.halo, p, &rows, scratch);
        // After the reads of the node data: a mapped input that changed under them is refused.
        self.layout
            .graph()
            .check_unchanged()
            .map_err(ChunkBuildError::from)?;
        Ok(chunk)
    }
}
