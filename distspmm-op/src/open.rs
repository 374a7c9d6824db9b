//! Opening "my rank's chunk", in one place for every caller (the CLI's distributed commands,
//! the trainer, the C ABI): open the chunk directory, check that it was made for as many parts
//! as there are ranks ([`PartsMismatch`]), map and validate this rank's chunk. Local; callers
//! make the outcome collective their own way (the operator's [`abstain`](crate::abstain), or
//! `dist_comm::agree::outcome` / `settle`).

use std::path::{Path, PathBuf};

use chunk_format::MappedChunk;
use dist_comm::agree::{check_parts, PartsMismatch};
use distspmm_core::chunk::{ChunkDir, ChunkDirError};

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

/// Opens the chunk directory `dir` for rank `rank` of `ranks`: the directory, the part-count
/// check, and rank `rank`'s chunk, mapped and validated against the manifest.
///
/// # Errors
/// [`OpenError`]: the directory cannot be opened, it holds another number of parts than
/// `ranks`, or this rank's chunk cannot be loaded.
pub fn open_rank_chunk(
    dir: &Path,
    rank: usize,
    ranks: usize,
) -> Result<(ChunkDir, MappedChunk), OpenError> {
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
    let chunk = opened.load(part).map_err(|source| OpenError::Load {
        rank,
        source: Box::new(source),
    })?;
    Ok((opened, chunk))
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
}
