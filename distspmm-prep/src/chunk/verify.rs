//! The checks of a whole chunk directory that need its partition ([`VerifyDir`]: every chunk
//! against the partition map and the manifest, as `distspmm inspect` and `verify` run them),
//! and Â reassembled from the chunks ([`reassemble`]).

use std::path::Path;
use std::string::ToString;
use std::vec::Vec;

use chunk_format::dir::{check_consistency, ChunkDir, ChunkDirError, MANIFEST_FILE};
use chunk_format::{ChunkView, MappedChunk};
use distspmm_sparse::index;
use distspmm_sparse::sparse::CsrOwned;

use crate::partition::Partition;

/// What a chunk directory is checked and read back with beyond `ChunkDir`'s own checks of one
/// chunk at a time.
pub trait VerifyDir {
    /// The saved partition map as a [`Partition`] (its length, checksum and fingerprint checked
    /// against the manifest by [`ChunkDir::read_partition_map`]).
    fn load_partition(&self) -> Result<Partition, ChunkDirError>;
    /// Loads and validates every chunk, then checks them together: the cross-chunk rules of
    /// [`check_consistency`], that chunk p's original ids are exactly part p's nodes of the
    /// saved partition map, in order, and that every manifest field the chunks and the map can
    /// vouch for agrees with them ([`check_manifest_fields`]). Returns the mapped chunks.
    fn validate_all(&self) -> Result<Vec<MappedChunk>, ChunkDirError>;
    /// Loads every chunk and reassembles Â in renumbered ids (see [`reassemble`]).
    fn reassemble(&self) -> Result<CsrOwned<f32>, ChunkDirError>;
}

impl VerifyDir for ChunkDir {
    fn load_partition(&self) -> Result<Partition, ChunkDirError> {
        let map = self.read_partition_map()?;
        Ok(Partition::new(map.parts, map.part_of, map.method)?)
    }

    fn validate_all(&self) -> Result<Vec<MappedChunk>, ChunkDirError> {
        let chunks: Vec<MappedChunk> = (0..self.parts())
            .map(|p| self.load(p))
            .collect::<Result<_, _>>()?;
        let views: Vec<(&Path, &ChunkView<'_>)> =
            chunks.iter().map(|c| (c.path(), c.view())).collect();
        check_consistency(&views)?;
        let partition = self.load_partition()?;
        let renumbering = partition.renumbering();
        if renumbering.offsets() != self.manifest().part_offsets.as_slice() {
            return Err(ChunkDirError::Inconsistent {
                file: self.path().join(&self.manifest().partition_map.file),
                section: "partition map",
                detail: "its part sizes do not match the manifest's part offsets".into(),
            });
        }
        for (p, (path, view)) in views.iter().enumerate() {
            let nodes = renumbering.part_nodes(index::id(p));
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
        check_manifest_fields(self, &views, &partition)?;
        Ok(chunks)
    }

    fn reassemble(&self) -> Result<CsrOwned<f32>, ChunkDirError> {
        let chunks = self.validate_all()?;
        let views: Vec<(&Path, &ChunkView<'_>)> =
            chunks.iter().map(|c| (c.path(), c.view())).collect();
        reassemble(&views)
    }
}

/// The manifest fields that [`ChunkDir::load`] does not check against one chunk, checked
/// against all of them and the partition map: `chunk_format_version` (every header's
/// version), `partition_method` and `max_imbalance` (the map's), `nnz` (the chunks' sum),
/// `edge_cut` (recounted from Â's cross-part entries), `edges` (at least Â's off-diagonal
/// entries — every one comes from an edge — or all of them without normalisation), and
/// `normalization` (one of `gcn`, `row`, `none`; with `gcn` and `row` every row has its
/// self loop; with `row` every row sums to 1 or is all zeros). `distspmm_version` and
/// `command_line` only describe the run.
fn check_manifest_fields(
    dir: &ChunkDir,
    views: &[(&Path, &ChunkView<'_>)],
    partition: &Partition,
) -> Result<(), ChunkDirError> {
    let m = dir.manifest();
    let manifest_path = dir.path().join(MANIFEST_FILE);
    let bad = |field: &str, detail: String| ChunkDirError::Manifest {
        path: manifest_path.clone(),
        reason: std::format!(
            "{field}: {detail}; the manifest does not describe these chunks (was it edited?): \
             re-run `distspmm partition`"
        ),
    };
    for (path, view) in views {
        let version = view.header().version.to_string();
        if version != m.chunk_format_version {
            return Err(bad(
                "chunk_format_version",
                std::format!(
                    "it says {}, but {} has version {version}",
                    m.chunk_format_version,
                    path.display()
                ),
            ));
        }
    }
    if partition.method() != m.partition_method {
        return Err(bad(
            "partition_method",
            std::format!(
                "it says {:?}, the partition map {:?}",
                m.partition_method,
                partition.method()
            ),
        ));
    }
    let imbalance = partition.imbalance();
    if (imbalance - m.max_imbalance).abs() > 1e-9 * imbalance.abs().max(1.0) {
        return Err(bad(
            "max_imbalance",
            std::format!(
                "it says {}, the partition map's parts give {imbalance}",
                m.max_imbalance
            ),
        ));
    }
    let nnz: u64 = views.iter().map(|(_, v)| v.header().nnz).sum();
    if nnz != m.nnz {
        return Err(bad(
            "nnz",
            std::format!("it says {}, the chunks hold {nnz}", m.nnz),
        ));
    }
    let shape = AHatShape::of(views);
    if shape.edge_cut != m.edge_cut {
        return Err(bad(
            "edge_cut",
            std::format!("it says {}, the chunks give {}", m.edge_cut, shape.edge_cut),
        ));
    }
    let from_edges = match m.normalization.as_str() {
        "gcn" | "row" => shape.off_diagonal,
        "none" => nnz,
        other => {
            return Err(bad(
                "normalization",
                std::format!("{other:?} is not one of gcn, row, none"),
            ))
        }
    };
    if m.edges < from_edges {
        return Err(bad(
            "edges",
            std::format!(
                "it says {}, but the chunks hold {from_edges} entries that each come from an \
                 edge",
                m.edges
            ),
        ));
    }
    if m.normalization != "none" && shape.rows_without_loop > 0 {
        return Err(bad(
            "normalization",
            std::format!(
                "it says {}, which adds a self loop to every row, but {} rows have none",
                m.normalization,
                shape.rows_without_loop
            ),
        ));
    }
    if m.normalization == "row" && shape.rows_not_stochastic > 0 {
        return Err(bad(
            "normalization",
            std::format!(
                "it says row, but {} rows of Â do not sum to 1",
                shape.rows_not_stochastic
            ),
        ));
    }
    Ok(())
}

/// What [`check_manifest_fields`] recounts from the chunks' Â.
struct AHatShape {
    /// Unordered pairs of nodes in different parts joined by an entry in either direction.
    edge_cut: u64,
    /// Entries off the diagonal.
    off_diagonal: u64,
    /// Rows without a diagonal entry.
    rows_without_loop: u64,
    /// Rows whose values sum neither to 1 nor are all zero (relative tolerance 1e-3).
    rows_not_stochastic: u64,
}

impl AHatShape {
    /// Counts over the P chunks of one run, after [`check_consistency`].
    fn of(chunks: &[(&Path, &ChunkView<'_>)]) -> Self {
        let mut shape = Self {
            edge_cut: 0,
            off_diagonal: 0,
            rows_without_loop: 0,
            rows_not_stochastic: 0,
        };
        // Cross entries counted once per direction; a pair with both directions twice.
        let (mut one_way, mut both_ways) = (0u64, 0u64);
        for &(_, view) in chunks {
            let p = view.part_id();
            let blocks: Vec<_> = view.blocks().collect();
            for i in 0..view.num_local_nodes() {
                let (mut has_loop, mut sum) = (false, 0f64);
                for block in &blocks {
                    let q = block.src_part as usize;
                    let (s, e) = (
                        index::offset(block.csr_rowptr[i]),
                        index::offset(block.csr_rowptr[i + 1]),
                    );
                    sum += block.csr_vals[s..e]
                        .iter()
                        .map(|&v| f64::from(v))
                        .sum::<f64>();
                    if q == p {
                        let on_diagonal = block.csr_cols[s..e].binary_search(&index::id(i)).is_ok();
                        has_loop |= on_diagonal;
                        shape.off_diagonal += (e - s - usize::from(on_diagonal)) as u64;
                        continue;
                    }
                    shape.off_diagonal += (e - s) as u64;
                    // Entry (this row, u) with u in part q: does q's row u hold this row?
                    let peer = chunks[q].1;
                    let recv = view.halo_recv(q);
                    let reverse = peer.blocks().find(|b| b.src_part as usize == p);
                    let my_index = peer.halo_recv(p).binary_search(&index::id(i)).ok();
                    for &c in &block.csr_cols[s..e] {
                        let u = recv[c as usize] as usize;
                        let mutual = match (&reverse, my_index) {
                            (Some(r), Some(k)) => {
                                let (rs, re) = (
                                    index::offset(r.csr_rowptr[u]),
                                    index::offset(r.csr_rowptr[u + 1]),
                                );
                                r.csr_cols[rs..re].binary_search(&index::id(k)).is_ok()
                            }
                            _ => false,
                        };
                        if mutual {
                            both_ways += 1;
                        } else {
                            one_way += 1;
                        }
                    }
                }
                shape.rows_without_loop += u64::from(!has_loop);
                let stochastic = (sum - 1.0).abs() <= 1e-3 || sum == 0.0;
                shape.rows_not_stochastic += u64::from(!stochastic);
            }
        }
        shape.edge_cut = one_way + both_ways / 2;
        shape
    }
}

/// Reassembles the global Â (renumbered ids: part p's row i is `off[p] + i`, and likewise for
/// columns) from all P chunks of a run, after [`check_consistency`]. Blocks come in increasing
/// source part and part ranges increase with the part, so each row's columns come out sorted.
pub fn reassemble(chunks: &[(&Path, &ChunkView<'_>)]) -> Result<CsrOwned<f32>, ChunkDirError> {
    check_consistency(chunks)?;
    let off = chunks[0].1.part_offsets();
    let total = off[off.len() - 1];
    let n = usize::try_from(total)
        .ok()
        .filter(|&n| n <= crate::graph::MAX_NODES)
        .ok_or_else(|| ChunkDirError::Inconsistent {
            file: chunks[0].0.to_path_buf(),
            section: "part offsets",
            detail: std::format!(
                "{total} nodes exceed the limit of {} (node ids are u32)",
                crate::graph::MAX_NODES
            ),
        })?;
    let nnz: usize = chunks
        .iter()
        .map(|(_, v)| index::offset(v.header().nnz))
        .sum();
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
                    index::offset(block.csr_rowptr[i]),
                    index::offset(block.csr_rowptr[i + 1]),
                );
                for (&c, &v) in block.csr_cols[s..e].iter().zip(&block.csr_vals[s..e]) {
                    let local = if q == p { c } else { recv[c as usize] };
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "a global id below N, which was checked against MAX_NODES above"
                    )]
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
