//! A chunk directory: `part-NNNNN.chunk` per part, `partition.map`, and `manifest.json` written
//! last. Writing it ([`write_chunk_dir`]), opening it ([`ChunkDir`]), validating it across
//! chunks, and reassembling Â from it.

use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use chunk_format::{write_chunk, ChunkView, MappedChunk, FORMAT_VERSION};
use rayon::prelude::*;

use crate::partition::{sync_parent_dir, write_atomically, Adjacency, Partition};
use crate::sparse::CsrOwned;

use super::manifest::{
    encode_hex, format_checksum, parse_checksum, Manifest, ManifestChunk, ManifestFile,
    MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, PARTITION_MAP_FILE,
};
use super::{ChunkBuilder, ChunkDirError};

/// File name of part `p`'s chunk.
pub fn chunk_file_name(p: u32) -> String {
    std::format!("part-{p:05}.chunk")
}

/// What [`write_chunk_dir`] needs besides the chunks themselves.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Replace a directory that holds a *different* partition (same fingerprint is always fine).
    pub force: bool,
    /// Normalisation of Â, recorded in the manifest (`gcn`, `row`, `none`).
    pub normalization: String,
    /// The command line that made the directory, recorded in the manifest.
    pub command_line: Vec<String>,
    /// The partition's edge cut if the caller has it (from [`Partition::edge_cut`]); computed
    /// from the graph's edges otherwise.
    pub edge_cut: Option<u64>,
    /// Advanced by one per chunk written.
    pub progress: indicatif::ProgressBar,
    /// Time spent building and writing chunks, summed over the parts (they run in parallel).
    pub timings: std::sync::Arc<WriteTimings>,
    /// The graph's directed edge count for the manifest when the caller has released the
    /// graph's edge arrays (chunks need only Â and the node data); the graph's own otherwise.
    pub edges: Option<u64>,
}

/// Seconds [`write_chunk_dir`] spent building chunks in memory and writing them, each summed
/// over the parts (which run in parallel, so the sums can exceed the wall time).
#[derive(Debug, Default)]
pub struct WriteTimings {
    build_nanos: std::sync::atomic::AtomicU64,
    write_nanos: std::sync::atomic::AtomicU64,
}

impl WriteTimings {
    /// Seconds spent building chunks, summed over parts.
    pub fn build_seconds(&self) -> f64 {
        self.build_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }

    /// Seconds spent writing chunk files, summed over parts.
    pub fn write_seconds(&self) -> f64 {
        self.write_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }

    fn add(&self, build: std::time::Duration, write: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.build_nanos.fetch_add(build.as_nanos() as u64, Relaxed);
        self.write_nanos.fetch_add(write.as_nanos() as u64, Relaxed);
    }
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            force: false,
            normalization: "gcn".into(),
            command_line: Vec::new(),
            edge_cut: None,
            progress: indicatif::ProgressBar::hidden(),
            timings: std::sync::Arc::default(),
            edges: None,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ChunkDirError + '_ {
    move |source| ChunkDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Builds every part's chunk and writes the directory: the partition map, the chunks (in
/// parallel, each atomically), then `manifest.json` (atomically, last). A crash leaves either no
/// manifest or one whose every file is complete.
///
/// If `dir` already holds a manifest of a different partition (another fingerprint), this
/// refuses unless `options.force`; the same fingerprint rewrites in place. The old manifest is
/// removed before any chunk is replaced, and chunk files of an earlier run with more parts are
/// removed after the new manifest is in place.
pub fn write_chunk_dir(
    dir: &Path,
    builder: &ChunkBuilder<'_>,
    options: &WriteOptions,
) -> Result<Manifest, ChunkDirError> {
    let partition = builder.partition();
    let parts = partition.parts();
    let fingerprint = encode_hex(&builder.fingerprint());
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let manifest_path = dir.join(MANIFEST_FILE);
    if manifest_path.exists() {
        if !options.force {
            match read_manifest(&manifest_path) {
                Ok(old) if old.fingerprint == fingerprint => {}
                Ok(old) => {
                    return Err(ChunkDirError::DifferentPartition {
                        dir: dir.to_path_buf(),
                        existing: std::format!(
                            "{} parts, {}, fingerprint {}",
                            old.parts,
                            old.partition_method,
                            old.fingerprint
                        ),
                    })
                }
                Err(err) => {
                    return Err(ChunkDirError::DifferentPartition {
                        dir: dir.to_path_buf(),
                        existing: std::format!("an unreadable manifest ({err})"),
                    })
                }
            }
        }
        // No manifest may vouch for chunks while they are being replaced.
        std::fs::remove_file(&manifest_path).map_err(io_error(&manifest_path))?;
        sync_parent_dir(&manifest_path)?;
    }

    let map_bytes = partition.to_map_bytes();
    write_atomically(&dir.join(PARTITION_MAP_FILE), &map_bytes)?;
    let partition_map = ManifestFile {
        file: PARTITION_MAP_FILE.into(),
        bytes: map_bytes.len() as u64,
        checksum: format_checksum(xxhash_rust::xxh3::xxh3_64(&map_bytes)),
    };
    drop(map_bytes);

    options.progress.set_length(u64::from(parts));
    let chunks: Vec<ManifestChunk> = (0..parts)
        .into_par_iter()
        .map_init(Vec::new, |scratch, p| {
            let started = std::time::Instant::now();
            let chunk = builder.build_with_scratch(p, scratch);
            let built = started.elapsed();
            let file = chunk_file_name(p);
            let summary = write_chunk(dir.join(&file), &chunk.contents())?;
            let written = started.elapsed() - built;
            options.timings.add(built, written);
            tracing::debug!(
                part = p,
                build_seconds = built.as_secs_f64(),
                write_seconds = written.as_secs_f64(),
                bytes = summary.bytes_written,
                "chunk written"
            );
            options.progress.inc(1);
            Ok(ManifestChunk {
                part: p,
                file,
                bytes: summary.bytes_written,
                checksum: format_checksum(summary.file_checksum),
                nodes: chunk.num_local_nodes() as u64,
                nnz: chunk.nnz() as u64,
            })
        })
        .collect::<Result<_, ChunkDirError>>()?;

    let edge_cut = match options.edge_cut {
        Some(cut) => cut,
        None => {
            let g = builder.graph();
            partition.edge_cut(&Adjacency::from_edges(g.num_nodes, &g.src, &g.dst)?)?
        }
    };
    let mut manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        format_version: MANIFEST_VERSION,
        chunk_format_version: FORMAT_VERSION.to_string(),
        distspmm_version: env!("CARGO_PKG_VERSION").into(),
        parts,
        nodes: partition.num_nodes() as u64,
        edges: options.edges.unwrap_or(builder.graph().num_edges() as u64),
        nnz: builder.nnz(),
        feature_dim: builder.feature_dim(),
        classes: builder.num_classes(),
        normalization: options.normalization.clone(),
        partition_method: partition.method().into(),
        fingerprint,
        part_offsets: builder.renumbering().offsets().to_vec(),
        edge_cut,
        max_imbalance: partition.imbalance(),
        halo_rows: (0..parts as usize)
            .map(|p| builder.halo().halo_rows(p))
            .collect(),
        partition_map,
        chunks,
        command_line: options.command_line.clone(),
        checksum: String::new(),
    };
    let json = manifest.seal().map_err(|reason| ChunkDirError::Manifest {
        path: manifest_path.clone(),
        reason,
    })?;
    write_atomically(&manifest_path, &json)?;
    remove_stale_chunks(dir, parts)?;
    remove_stale_temporaries(dir)?;
    Ok(manifest)
}

/// The file a temporary named `<file>.tmp-<pid>` or `<file>.tmp-<pid>-<seq>` stands for, if
/// `name` is one written by another process than this one: what the atomic writers of this
/// workspace (chunks, partition map, manifest, `distspmm` checkpoints) leave behind when they
/// are killed before their rename. It never carries a final name.
pub fn stale_temporary_of(name: &str) -> Option<&str> {
    let (file, suffix) = name.rsplit_once(".tmp-")?;
    let mut numbers = suffix.split('-');
    let pid = numbers.next()?.parse::<u32>().ok()?;
    let rest_ok = numbers.all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (rest_ok && !file.is_empty() && pid != std::process::id()).then_some(file)
}

/// Whether `name` is a stale temporary (see [`stale_temporary_of`]) of a chunk directory's own
/// files.
fn is_stale_temporary(name: &str) -> bool {
    stale_temporary_of(name).is_some_and(|file| {
        file == MANIFEST_FILE
            || file == PARTITION_MAP_FILE
            || (file.starts_with("part-") && file.ends_with(".chunk"))
    })
}

/// Removes the temporaries killed writers left in `dir` (see [`is_stale_temporary`]). Runs
/// once the new manifest is in place: writing one directory from two processes at once is not
/// supported anyway (each would remove the other's manifest).
fn remove_stale_temporaries(dir: &Path) -> Result<(), ChunkDirError> {
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        if entry.file_name().to_str().is_some_and(is_stale_temporary) {
            let path = entry.path();
            tracing::info!(path = %path.display(), "removing a temporary left by an interrupted writer");
            std::fs::remove_file(&path).map_err(io_error(&path))?;
        }
    }
    Ok(())
}

/// Removes `part-NNNNN.chunk` files with `NNNNN ≥ parts` (left by an earlier run with more parts).
fn remove_stale_chunks(dir: &Path, parts: u32) -> Result<(), ChunkDirError> {
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let index = name
            .strip_prefix("part-")
            .and_then(|rest| rest.strip_suffix(".chunk"))
            .filter(|digits| digits.len() >= 5 && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<u64>().ok());
        if index.is_some_and(|i| i >= u64::from(parts)) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(io_error(&path))?;
        }
    }
    Ok(())
}

fn read_manifest(path: &Path) -> Result<Manifest, ChunkDirError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    Manifest::from_json(&bytes).map_err(|reason| ChunkDirError::Manifest {
        path: path.to_path_buf(),
        reason,
    })
}

/// An opened chunk directory whose manifest has been read and checked.
#[derive(Debug, Clone)]
pub struct ChunkDir {
    dir: PathBuf,
    manifest: Manifest,
    fingerprint: [u8; 16],
}

impl ChunkDir {
    /// Reads and validates `dir/manifest.json`. A directory without one was never completely
    /// written (or is not a chunk directory).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ChunkDirError> {
        let dir = dir.as_ref();
        let path = dir.join(MANIFEST_FILE);
        if !path.is_file() {
            return Err(ChunkDirError::Manifest {
                path,
                reason: "missing: the directory was never completely written; \
                         re-run `distspmm partition`"
                    .into(),
            });
        }
        let manifest = read_manifest(&path)?;
        let fingerprint =
            manifest
                .fingerprint_bytes()
                .map_err(|reason| ChunkDirError::Manifest {
                    path: path.clone(),
                    reason,
                })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            fingerprint,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Parts P.
    pub fn parts(&self) -> u32 {
        self.manifest.parts
    }

    /// The partition fingerprint.
    pub fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint
    }

    /// Path of part `p`'s chunk file.
    pub fn chunk_path(&self, p: u32) -> Result<PathBuf, ChunkDirError> {
        let entry =
            self.manifest
                .chunks
                .get(p as usize)
                .ok_or_else(|| ChunkDirError::NoSuchPart {
                    part: p,
                    parts: self.parts(),
                })?;
        Ok(self.dir.join(&entry.file))
    }

    /// Maps and fully validates part `p`'s chunk, then checks it against the manifest:
    /// fingerprint, part id, P, N, part offsets, feature dim, classes, length and whole-file
    /// checksum.
    pub fn load(&self, p: u32) -> Result<MappedChunk, ChunkDirError> {
        let path = self.chunk_path(p)?;
        let entry = &self.manifest.chunks[p as usize];
        let chunk = MappedChunk::open(&path)?;
        let view = chunk.view();
        let h = view.header();
        let m = &self.manifest;
        let bad = |section: &'static str, detail: String| ChunkDirError::Inconsistent {
            file: path.clone(),
            section,
            detail,
        };
        if h.fingerprint != self.fingerprint {
            return Err(bad(
                "header.fingerprint",
                std::format!(
                    "fingerprint {} is not the directory's {}: the chunk belongs to another \
                     partition run",
                    encode_hex(&h.fingerprint),
                    m.fingerprint
                ),
            ));
        }
        if h.part_id != p || h.num_parts != m.parts {
            return Err(bad(
                "header.part_id",
                std::format!(
                    "chunk is part {} of {}, the manifest lists it as part {p} of {}",
                    h.part_id,
                    h.num_parts,
                    m.parts
                ),
            ));
        }
        if h.num_global_nodes != m.nodes {
            return Err(bad(
                "header.num_global_nodes",
                std::format!(
                    "{} nodes, the manifest says {}",
                    h.num_global_nodes,
                    m.nodes
                ),
            ));
        }
        if view.part_offsets() != m.part_offsets.as_slice() {
            return Err(bad(
                "PART_OFFSETS",
                "part offsets differ from the manifest's".into(),
            ));
        }
        if h.feature_dim != m.feature_dim || h.num_classes != m.classes {
            return Err(bad(
                "header.feature_dim",
                std::format!(
                    "F = {}, C = {}; the manifest says F = {}, C = {}",
                    h.feature_dim,
                    h.num_classes,
                    m.feature_dim,
                    m.classes
                ),
            ));
        }
        let want = parse_checksum(&entry.checksum);
        if Some(h.file_checksum) != want || chunk.len() as u64 != entry.bytes {
            return Err(bad(
                "header.file_checksum",
                std::format!(
                    "checksum {} and length {} do not match the manifest's {} and {}: the file \
                     was replaced after the manifest was written",
                    format_checksum(h.file_checksum),
                    chunk.len(),
                    entry.checksum,
                    entry.bytes
                ),
            ));
        }
        if h.num_halo_rows != m.halo_rows[p as usize] || h.nnz != entry.nnz {
            return Err(bad(
                "header.num_halo_rows",
                std::format!(
                    "H = {}, nnz = {}; the manifest says H = {}, nnz = {}",
                    h.num_halo_rows,
                    h.nnz,
                    m.halo_rows[p as usize],
                    entry.nnz
                ),
            ));
        }
        Ok(chunk)
    }

    /// Reads the saved partition map, checking its length and checksum against the manifest
    /// and its fingerprint against the chunks'.
    pub fn load_partition(&self) -> Result<Partition, ChunkDirError> {
        let entry = &self.manifest.partition_map;
        let path = self.dir.join(&entry.file);
        let bytes = std::fs::read(&path).map_err(io_error(&path))?;
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        if bytes.len() as u64 != entry.bytes || Some(sum) != parse_checksum(&entry.checksum) {
            return Err(ChunkDirError::Inconsistent {
                file: path,
                section: "partition map",
                detail: std::format!(
                    "length {} and checksum {} do not match the manifest's {} and {}",
                    bytes.len(),
                    format_checksum(sum),
                    entry.bytes,
                    entry.checksum
                ),
            });
        }
        let partition = Partition::from_map_bytes(&bytes, &path)?;
        if partition.fingerprint() != self.fingerprint {
            return Err(ChunkDirError::Inconsistent {
                file: path,
                section: "partition map",
                detail: "its fingerprint is not the directory's".into(),
            });
        }
        Ok(partition)
    }

    /// Loads and validates every chunk, then checks them together: the cross-chunk rules of
    /// [`check_consistency`], and that chunk p's original ids are exactly part p's nodes of the
    /// saved partition map, in order. Returns the mapped chunks.
    pub fn validate_all(&self) -> Result<Vec<MappedChunk>, ChunkDirError> {
        let chunks: Vec<MappedChunk> = (0..self.parts())
            .map(|p| self.load(p))
            .collect::<Result<_, _>>()?;
        let views: Vec<(&Path, &ChunkView<'_>)> =
            chunks.iter().map(|c| (c.path(), c.view())).collect();
        check_consistency(&views)?;
        let partition = self.load_partition()?;
        let renumbering = partition.renumbering();
        if renumbering.offsets() != self.manifest.part_offsets.as_slice() {
            return Err(ChunkDirError::Inconsistent {
                file: self.dir.join(&self.manifest.partition_map.file),
                section: "partition map",
                detail: "its part sizes do not match the manifest's part offsets".into(),
            });
        }
        for (p, (path, view)) in views.iter().enumerate() {
            let nodes = renumbering.part_nodes(p as u32);
            if !view
                .original_ids()
                .iter()
                .zip(nodes)
                .all(|(&a, &b)| a == u64::from(b))
            {
                return Err(ChunkDirError::Inconsistent {
                    file: path.to_path_buf(),
                    section: "ORIGINAL_IDS",
                    detail: std::format!(
                        "the original ids are not part {p}'s nodes of the partition map"
                    ),
                });
            }
        }
        Ok(chunks)
    }

    /// Loads every chunk and reassembles Â in renumbered ids (see [`reassemble`]).
    pub fn reassemble(&self) -> Result<CsrOwned<f32>, ChunkDirError> {
        let chunks = self.validate_all()?;
        let views: Vec<(&Path, &ChunkView<'_>)> =
            chunks.iter().map(|c| (c.path(), c.view())).collect();
        reassemble(&views)
    }
}

/// Cross-chunk rules for the P chunks of one run, given in part order with their paths (for
/// the error): the same P, N, fingerprint, part offsets, F and C everywhere; chunk p is part p;
/// Σ n_p = N; every block's column count equals the rows received from its source; and what q
/// sends p is exactly what p receives from q.
pub fn check_consistency(chunks: &[(&Path, &ChunkView<'_>)]) -> Result<(), ChunkDirError> {
    let Some(&(first_path, first)) = chunks.first() else {
        return Err(ChunkDirError::Inconsistent {
            file: PathBuf::new(),
            section: "chunks",
            detail: "no chunks given".into(),
        });
    };
    let bad = |path: &Path, section: &'static str, detail: String| ChunkDirError::Inconsistent {
        file: path.to_path_buf(),
        section,
        detail,
    };
    let h0 = first.header();
    if first.num_parts() != chunks.len() {
        return Err(bad(
            first_path,
            "header.num_parts",
            std::format!(
                "P = {} but {} chunks are given",
                first.num_parts(),
                chunks.len()
            ),
        ));
    }
    let mut total = 0u64;
    for (p, &(path, view)) in chunks.iter().enumerate() {
        let h = view.header();
        if view.part_id() != p {
            return Err(bad(
                path,
                "header.part_id",
                std::format!("expected part {p}, found part {}", view.part_id()),
            ));
        }
        if h.fingerprint != h0.fingerprint {
            return Err(bad(
                path,
                "header.fingerprint",
                std::format!(
                    "fingerprint {} differs from {}'s {}: chunks of different partition runs \
                     are mixed",
                    encode_hex(&h.fingerprint),
                    first_path.display(),
                    encode_hex(&h0.fingerprint)
                ),
            ));
        }
        if (
            h.num_parts,
            h.num_global_nodes,
            h.feature_dim,
            h.num_classes,
        ) != (
            h0.num_parts,
            h0.num_global_nodes,
            h0.feature_dim,
            h0.num_classes,
        ) {
            return Err(bad(
                path,
                "header",
                std::format!("P, N, F or C differs from {}", first_path.display()),
            ));
        }
        if view.part_offsets() != first.part_offsets() {
            return Err(bad(
                path,
                "PART_OFFSETS",
                std::format!("part offsets differ from {}'s", first_path.display()),
            ));
        }
        total += view.num_local_nodes() as u64;
        for block in view.blocks() {
            let q = block.src_part as usize;
            let expected = if q == p {
                view.num_local_nodes()
            } else {
                view.halo_recv(q).len()
            };
            if block.ncols != expected {
                return Err(bad(
                    path,
                    "BLOCK_COL_OFFSETS",
                    std::format!(
                        "block from part {q} has {} columns, expected {expected}",
                        block.ncols
                    ),
                ));
            }
        }
        for (q, &(q_path, q_view)) in chunks.iter().enumerate() {
            if q != p && q_view.halo_send(p) != view.halo_recv(q) {
                return Err(bad(
                    q_path,
                    "HALO_SEND",
                    std::format!(
                        "the rows part {q} sends part {p} differ from the rows {} receives \
                         from part {q} (HALO_RECV)",
                        path.display()
                    ),
                ));
            }
        }
    }
    if total != h0.num_global_nodes {
        return Err(bad(
            first_path,
            "header.num_global_nodes",
            std::format!(
                "the parts hold {total} nodes together, not N = {}",
                h0.num_global_nodes
            ),
        ));
    }
    Ok(())
}

/// Reassembles the global Â (renumbered ids: part p's row i is `off[p] + i`, and likewise for
/// columns) from all P chunks of a run, after [`check_consistency`]. Blocks come in increasing
/// source part and part ranges increase with the part, so each row's columns come out sorted.
pub fn reassemble(chunks: &[(&Path, &ChunkView<'_>)]) -> Result<CsrOwned<f32>, ChunkDirError> {
    check_consistency(chunks)?;
    let off = chunks[0].1.part_offsets();
    let n = off[off.len() - 1] as usize;
    let nnz: usize = chunks.iter().map(|(_, v)| v.header().nnz as usize).sum();
    let mut indptr = Vec::with_capacity(n + 1);
    indptr.push(0u64);
    let mut indices = Vec::with_capacity(nnz);
    let mut data = Vec::with_capacity(nnz);
    for &(_, view) in chunks {
        let p = view.part_id();
        let blocks: Vec<_> = view.blocks().collect();
        for i in 0..view.num_local_nodes() {
            for block in &blocks {
                let q = block.src_part as usize;
                let recv = view.halo_recv(q);
                let (s, e) = (
                    block.csr_rowptr[i] as usize,
                    block.csr_rowptr[i + 1] as usize,
                );
                for (&c, &v) in block.csr_cols[s..e].iter().zip(&block.csr_vals[s..e]) {
                    let local = if q == p { c } else { recv[c as usize] };
                    indices.push((off[q] + u64::from(local)) as u32);
                    data.push(v);
                }
            }
            indptr.push(indices.len() as u64);
        }
    }
    CsrOwned::new(n, n, indptr, indices, data).map_err(|e| ChunkDirError::Inconsistent {
        file: chunks[0].0.to_path_buf(),
        section: "CSR",
        detail: std::format!("the reassembled Â is not a valid CSR: {e}"),
    })
}
