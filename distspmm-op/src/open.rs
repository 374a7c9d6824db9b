//! Opening "my rank's chunk", in one place for every caller (the CLI's distributed commands,
//! the trainer, the C ABI): open the chunk directory, check that it was made for as many parts
//! as there are ranks ([`PartsMismatch`]), map and validate this rank's chunk, and keep what the
//! directory lists for all parts ([`RankChunk`]), which the operators' agreement compares across
//! ranks. Local; callers make the outcome collective their own way (the operator's
//! [`abstain`](crate::abstain), or `dist_comm::agree::outcome` / `settle`).

use std::ops::Deref;
use std::path::{Path, PathBuf};

use chunk_format::{ChunkView, MappedChunk};
use dist_comm::agree::{check_parts, PartsMismatch};

use crate::ChunkSource;
use chunk_format::dir::{ChunkDir, ChunkDirError};

/// Why a rank could not open its chunk.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory was made for another number of parts than there are ranks.
    #[error("chunk directory {}: {mismatch}", dir.display())]
    PartsMismatch {
        /// The chunk directory.
        dir: PathBuf,
        /// The part and rank counts.
        mismatch: PartsMismatch,
    },
    /// The directory (its manifest, its partition map) cannot be opened.
    #[error("rank {rank} cannot open the chunk directory {}", dir.display())]
    Open {
        /// This rank.
        rank: usize,
        /// The chunk directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: Box<ChunkDirError>,
    },
    /// This rank's chunk cannot be loaded (missing, unreadable, invalid).
    #[error("rank {rank} cannot load its chunk")]
    Load {
        /// This rank.
        rank: usize,
        /// Why.
        #[source]
        source: Box<ChunkDirError>,
    },
}

impl OpenError {
    /// The parts the directory was made for, when it could be opened (what
    /// [`abstain`](crate::abstain) wants to know).
    pub fn chunk_parts(&self) -> Option<usize> {
        match self {
            OpenError::PartsMismatch { mismatch, .. } => Some(mismatch.chunk_parts),
            OpenError::Open { .. } => None,
            OpenError::Load { .. } => None,
        }
    }

    /// The chunk directory's own error, if that is what failed.
    pub fn dir_error(&self) -> Option<&ChunkDirError> {
        match self {
            OpenError::Open { source, .. } | OpenError::Load { source, .. } => Some(source),
            OpenError::PartsMismatch { .. } => None,
        }
    }
}

/// This rank's chunk, mapped and validated against its directory's manifest, with the content
/// digest that directory lists for all parts ([`ChunkSource::listed`]): an operator built from
/// it (or a reference, `Rc`, `Arc` of it) checks with every rank that all train on one
/// directory's content. It dereferences to the [`MappedChunk`].
#[derive(Debug)]
pub struct RankChunk {
    mapped: MappedChunk,
    listed: [u64; 2],
}

impl RankChunk {
    /// The [`content_digest`](dist_comm::agree::content_digest) the chunk's directory lists:
    /// equal on every rank exactly when all ranks opened copies of one directory's content.
    pub fn listed(&self) -> [u64; 2] {
        self.listed
    }
}

impl Deref for RankChunk {
    type Target = MappedChunk;
    fn deref(&self) -> &MappedChunk {
        &self.mapped
    }
}

// SAFETY: as for the `MappedChunk` it holds and never replaces.
unsafe impl ChunkSource for RankChunk {
    fn chunk(&self) -> ChunkView<'_> {
        *self.mapped.view()
    }
    fn listed(&self) -> Option<[u64; 2]> {
        Some(self.listed)
    }
}

/// Opens the chunk directory `dir` for rank `rank` of `ranks`: the directory, the part-count
/// check, and rank `rank`'s chunk, mapped and validated against the manifest, with what the
/// directory lists for all parts ([`RankChunk`]).
///
/// # Errors
/// [`OpenError`]: the directory cannot be opened, it holds another number of parts than
/// `ranks`, or this rank's chunk cannot be loaded.
pub fn open_rank_chunk(
    dir: &Path,
    rank: usize,
    ranks: usize,
) -> Result<(ChunkDir, RankChunk), OpenError> {
    let opened = ChunkDir::open(dir).map_err(|source| OpenError::Open {
        rank,
        dir: dir.to_owned(),
        source: Box::new(source),
    })?;
    check_parts(opened.parts() as usize, ranks).map_err(|mismatch| OpenError::PartsMismatch {
        dir: dir.to_owned(),
        mismatch,
    })?;
    let part = u32::try_from(rank).map_err(|_| OpenError::PartsMismatch {
        dir: dir.to_owned(),
        mismatch: PartsMismatch {
            chunk_parts: opened.parts() as usize,
            ranks,
        },
    })?;
    let mapped = opened.load(part).map_err(|source| OpenError::Load {
        rank,
        source: Box::new(source),
    })?;
    let listed = crate::agree::listed_digest(opened.manifest());
    Ok((opened, RankChunk { mapped, listed }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_and_a_wrong_rank_count_are_told_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nothing");
        let e = open_rank_chunk(&missing, 0, 1).unwrap_err();
        assert!(matches!(e, OpenError::Open { rank: 0, .. }), "{e:?}");
        assert_eq!(e.chunk_parts(), None);
        assert!(e.dir_error().is_some());

        let dir = tmp.path().join("chunks");
        crate::tests::write_ring_dir(&dir, 2);
        let e = open_rank_chunk(&dir, 0, 3).unwrap_err();
        assert_eq!(e.chunk_parts(), Some(2));
        assert!(
            e.to_string()
                .ends_with("made for 2 parts but 3 ranks were started: run 2 ranks (`mpirun -n 2`) or re-partition with `distspmm partition --parts 3`"),
            "{e}"
        );
        let (opened, chunk) = open_rank_chunk(&dir, 1, 2).unwrap();
        assert_eq!(opened.parts(), 2);
        assert_eq!(chunk.view().part_id(), 1);
    }

    /// A chunk directory of one partition (two halves of 30 nodes) of a ring, with one more
    /// edge when `chord`: the same partition fingerprint, other content.
    fn write_ring(dir: &Path, chord: bool) {
        use chunk_format::dir::WriteOptions;
        use distspmm_prep::chunk::{write_chunk_dir, ChunkBuilder};
        use distspmm_prep::graph::Graph;
        use distspmm_prep::normalize::{adjacency, Normalization};
        use distspmm_prep::partition::Partition;
        let n = 30u32;
        let mut edges: Vec<(u32, u32)> = (0..n)
            .flat_map(|v| [(v, (v + 1) % n), ((v + 1) % n, v)])
            .collect();
        if chord {
            edges.extend([(0, 20), (20, 0)]);
        }
        let (src, dst): (Vec<u32>, Vec<u32>) = edges.into_iter().unzip();
        let a_hat = adjacency(n as usize, &src, &dst, None, Normalization::Gcn).unwrap();
        let graph = Graph::from_edges(n as usize, src, dst);
        let partition = Partition::new(2, (0..n).map(|v| v / 15).collect(), "test").unwrap();
        let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition).unwrap();
        write_chunk_dir(dir, &builder, &WriteOptions::default()).unwrap();
    }

    fn new_op<K: ChunkSource>(comm: &dist_comm::LocalComm, chunk: K) -> Result<(), String> {
        crate::DistSpmm::new(comm, chunk, crate::schedule::ScheduleKind::Halo)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn ranks_on_directories_of_one_partition_with_other_content_fail_together() {
        use dist_comm::{Group, LocalComm};
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        write_ring(&a, false);
        write_ring(&b, true);
        let (da, db) = (ChunkDir::open(&a).unwrap(), ChunkDir::open(&b).unwrap());
        assert_eq!(da.fingerprint(), db.fingerprint(), "one partition");

        // Copies of one directory agree.
        let out = LocalComm::run(2, |comm| {
            let (_, chunk) = open_rank_chunk(&a, comm.rank(), 2).unwrap();
            assert_eq!(
                chunk.listed(),
                dist_comm::agree::content_digest(
                    [0, 1].map(|p| { da.load(p).unwrap().view().file_checksum() })
                )
            );
            new_op(&comm, &chunk)
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");

        // Rank 1 on a directory with other content: every rank names it.
        let out = LocalComm::run(2, |comm| {
            let dir = if comm.rank() == 0 { &a } else { &b };
            let (_, chunk) = open_rank_chunk(dir, comm.rank(), 2).unwrap();
            new_op(&comm, std::sync::Arc::new(chunk))
        });
        for r in &out {
            let e = r.as_ref().unwrap_err();
            assert!(
                e.starts_with("rank 1's chunks differ from rank 0's (content digest "),
                "{e}"
            );
        }

        // Rank 1's chunk opened on its own (no listing) from the other directory: the listing
        // of rank 0 does not name it.
        let out = LocalComm::run(2, |comm| {
            if comm.rank() == 0 {
                let (_, chunk) = open_rank_chunk(&a, 0, 2).unwrap();
                new_op(&comm, &chunk)
            } else {
                let bare = MappedChunk::open(db.chunk_path(1).unwrap()).unwrap();
                new_op(&comm, &bare)
            }
        });
        for r in &out {
            let e = r.as_ref().unwrap_err();
            assert!(
                e.contains("are not the ones rank 0's chunk directory lists"),
                "{e}"
            );
        }
    }
}
