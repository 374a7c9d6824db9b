//! The partition map file of a [`Partition`]: its layout, checks and fingerprint are
//! `chunk_format::dir::partition_map`'s (the chunk directory holds the file); this adds the
//! conversions to and from a validated [`Partition`], and saving and loading one on its own.

use std::path::Path;
use std::vec::Vec;

use chunk_format::dir::partition_map::{self, PartitionMap};

use super::{Partition, PartitionError};

impl Partition {
    /// Serialises the partition map (`chunk_format::dir::partition_map` gives the layout).
    pub fn to_map_bytes(&self) -> Vec<u8> {
        partition_map::encode(self.parts(), self.method(), self.part_of())
    }

    /// Parses a partition map written by [`Partition::to_map_bytes`], checking magic, version,
    /// lengths, checksum and that every part id is below P. `path` only names the source in
    /// errors.
    pub fn from_map_bytes(bytes: &[u8], path: &Path) -> Result<Self, PartitionError> {
        let bad = |reason: String| PartitionError::BadMapFile {
            path: path.to_path_buf(),
            reason,
        };
        let map = PartitionMap::parse(bytes).map_err(bad)?;
        Partition::new(map.parts, map.part_of, map.method)
            .map_err(|err| bad(std::format!("invalid partition: {err}")))
    }

    /// Writes the partition map to `path` atomically (temp file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), PartitionError> {
        Ok(chunk_format::atomic::write_atomically(
            path,
            &self.to_map_bytes(),
        )?)
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
        // The part ids start after the 28-byte header and the method tag.
        let at = 28 + tag_len;
        bytes[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
        let body_len = bytes.len() - 8;
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&sum.to_le_bytes());
        let err = Partition::from_map_bytes(&bytes, Path::new("m")).unwrap_err();
        assert!(std::format!("{err}").contains("invalid partition"), "{err}");
    }
}
