//! The partition map file: which part every node belongs to, saved beside the chunks so that
//! re-chunking (another normalisation, a fixed bug in the builder) does not re-partition.
//!
//! Layout, all integers little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | magic `DSPPMAP\0` |
//! | 8 | 4 | version (`1`) |
//! | 12 | 4 | parts P |
//! | 16 | 8 | nodes N |
//! | 24 | 4 | method tag length L |
//! | 28 | L | method tag (UTF-8, e.g. `metis:seed=1:ufactor=30:objective=cut`) |
//! | 28+L | 4·N | part of each node (`u32`) |
//! | 28+L+4N | 8 | xxh3-64 of all preceding bytes |

use std::path::Path;
use std::string::String;
use std::vec::Vec;

use super::{Partition, PartitionError};

/// First bytes of a partition map file.
pub const MAP_MAGIC: [u8; 8] = *b"DSPPMAP\0";
/// Version of the partition map layout this code writes and reads.
pub const MAP_VERSION: u32 = 1;
const HEADER_LEN: usize = 28;

impl Partition {
    /// Serialises the partition map (see the module documentation for the layout).
    pub fn to_map_bytes(&self) -> Vec<u8> {
        let tag = self.method().as_bytes();
        let mut out = Vec::with_capacity(HEADER_LEN + tag.len() + 4 * self.num_nodes() + 8);
        out.extend_from_slice(&MAP_MAGIC);
        out.extend_from_slice(&MAP_VERSION.to_le_bytes());
        out.extend_from_slice(&self.parts().to_le_bytes());
        out.extend_from_slice(&(self.num_nodes() as u64).to_le_bytes());
        #[allow(
            clippy::cast_possible_truncation,
            reason = "the tag is a partitioning method's short name"
        )]
        out.extend_from_slice(&(tag.len() as u32).to_le_bytes());
        out.extend_from_slice(tag);
        for &p in self.part_of() {
            out.extend_from_slice(&p.to_le_bytes());
        }
        let checksum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Parses a partition map written by [`Partition::to_map_bytes`], checking magic, version,
    /// lengths, checksum and that every part id is below P. `path` only names the source in
    /// errors.
    pub fn from_map_bytes(bytes: &[u8], path: &Path) -> Result<Self, PartitionError> {
        let bad = |reason: String| PartitionError::BadMapFile {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < HEADER_LEN + 8 {
            return Err(bad(std::format!(
                "file is {} bytes, shorter than the {}-byte header and checksum",
                bytes.len(),
                HEADER_LEN + 8
            )));
        }
        if bytes[..8] != MAP_MAGIC {
            return Err(bad("not a partition map (wrong magic bytes)".into()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let version = u32_at(8);
        if version != MAP_VERSION {
            return Err(bad(std::format!(
                "version {version}, this build reads version {MAP_VERSION}"
            )));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let stored = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
        let actual = xxhash_rust::xxh3::xxh3_64(body);
        if stored != actual {
            return Err(bad(std::format!(
                "checksum mismatch (stored {stored:016x}, computed {actual:016x}): the file is corrupted"
            )));
        }
        let parts = u32_at(12);
        let nodes = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let tag_len = u32_at(24) as usize;
        let expected = (HEADER_LEN as u64)
            .checked_add(tag_len as u64)
            .and_then(|x| x.checked_add(nodes.checked_mul(4)?))
            .and_then(|x| x.checked_add(8));
        if expected != Some(bytes.len() as u64) {
            return Err(bad(std::format!(
                "length {} does not match {nodes} nodes and a {tag_len}-byte method tag",
                bytes.len()
            )));
        }
        let tag = std::str::from_utf8(&body[HEADER_LEN..HEADER_LEN + tag_len])
            .map_err(|_| bad("method tag is not UTF-8".into()))?;
        let part_of: Vec<u32> = body[HEADER_LEN + tag_len..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Partition::new(parts, part_of, tag)
            .map_err(|err| bad(std::format!("invalid partition: {err}")))
    }

    /// Writes the partition map to `path` atomically (temp file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), PartitionError> {
        write_atomically(path, &self.to_map_bytes())
    }

    /// Reads and validates a partition map saved by [`Partition::save`].
    pub fn load(path: &Path) -> Result<Self, PartitionError> {
        let bytes = chunk_format::read_regular(path).map_err(|source| PartitionError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_map_bytes(&bytes, path)
    }
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or the new one
/// (`chunk_format::atomic`, the workspace's one atomic write).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PartitionError> {
    chunk_format::atomic::write_atomically(path, bytes).map_err(PartitionError::from)
}

/// Makes a rename in `path`'s directory durable.
pub(crate) fn sync_parent_dir(path: &Path) -> Result<(), PartitionError> {
    chunk_format::atomic::sync_parent_dir(path).map_err(PartitionError::from)
}

impl From<chunk_format::atomic::AtomicWriteError> for PartitionError {
    fn from(e: chunk_format::atomic::AtomicWriteError) -> Self {
        PartitionError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Partition {
        Partition::new(3, std::vec![2, 0, 1, 1, 0, 2, 2], "random:seed=4").unwrap()
    }

    #[test]
    fn round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("partition.map");
        let p = sample();
        p.save(&path).unwrap();
        let back = Partition::load(&path).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.fingerprint(), p.fingerprint());
        // No temp file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let p = sample();
        let bytes = p.to_map_bytes();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(
                Partition::from_map_bytes(&bad, Path::new("x")).is_err(),
                "flip at byte {i} not detected"
            );
        }
        for len in 0..bytes.len() {
            assert!(Partition::from_map_bytes(&bytes[..len], Path::new("x")).is_err());
        }
    }

    #[test]
    fn rejects_part_ids_out_of_range_even_with_a_valid_checksum() {
        let p = sample();
        let mut bytes = p.to_map_bytes();
        let tag_len = p.method().len();
        let at = HEADER_LEN + tag_len;
        bytes[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
        let body_len = bytes.len() - 8;
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&sum.to_le_bytes());
        let err = Partition::from_map_bytes(&bytes, Path::new("m")).unwrap_err();
        assert!(std::format!("{err}").contains("invalid partition"), "{err}");
    }
}
