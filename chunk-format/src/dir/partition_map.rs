//! The partition map file (`partition.map`): which part every node belongs to, saved beside
//! the chunks so that re-chunking (another normalisation, a fixed bug in the builder) does not
//! re-partition, and the partition fingerprint every chunk carries.
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

use std::string::String;
use std::vec::Vec;

/// First bytes of a partition map file.
pub const MAP_MAGIC: [u8; 8] = *b"DSPPMAP\0";
/// Version of the partition map layout this code writes and reads.
pub const MAP_VERSION: u32 = 1;
const HEADER_LEN: usize = 28;

/// A partition map as the file holds it: P, the method tag and the part of every node (each
/// below P, checked when parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMap {
    /// Parts P.
    pub parts: u32,
    /// The method tag the partition was made with.
    pub method: String,
    /// The part of every node (original ids).
    pub part_of: Vec<u32>,
}

/// Serialises a partition map (see the module documentation for the layout).
pub fn encode(parts: u32, method: &str, part_of: &[u32]) -> Vec<u8> {
    let tag = method.as_bytes();
    let mut out = Vec::with_capacity(HEADER_LEN + tag.len() + 4 * part_of.len() + 8);
    out.extend_from_slice(&MAP_MAGIC);
    out.extend_from_slice(&MAP_VERSION.to_le_bytes());
    out.extend_from_slice(&parts.to_le_bytes());
    out.extend_from_slice(&(part_of.len() as u64).to_le_bytes());
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the tag is a partitioning method's short name"
    )]
    out.extend_from_slice(&(tag.len() as u32).to_le_bytes());
    out.extend_from_slice(tag);
    for &p in part_of {
        out.extend_from_slice(&p.to_le_bytes());
    }
    let checksum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

impl PartitionMap {
    /// Parses a partition map written by [`encode`], checking magic, version, lengths, checksum,
    /// that P is at least 1 and that every part id is below P. The error says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < HEADER_LEN + 8 {
            return Err(std::format!(
                "file is {} bytes, shorter than the {}-byte header and checksum",
                bytes.len(),
                HEADER_LEN + 8
            ));
        }
        if bytes[..8] != MAP_MAGIC {
            return Err("not a partition map (wrong magic bytes)".into());
        }
        let u32_at = |at: usize| {
            let mut word = [0u8; 4];
            word.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(word)
        };
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let version = u32_at(8);
        if version != MAP_VERSION {
            return Err(std::format!(
                "version {version}, this build reads version {MAP_VERSION}"
            ));
        }
        let body = &bytes[..bytes.len() - 8];
        let stored = u64_at(bytes.len() - 8);
        let actual = xxhash_rust::xxh3::xxh3_64(body);
        if stored != actual {
            return Err(std::format!(
                "checksum mismatch (stored {stored:016x}, computed {actual:016x}): the file is corrupted"
            ));
        }
        let parts = u32_at(12);
        let nodes = u64_at(16);
        let tag_len = u32_at(24) as usize;
        let expected = (HEADER_LEN as u64)
            .checked_add(tag_len as u64)
            .and_then(|x| x.checked_add(nodes.checked_mul(4)?))
            .and_then(|x| x.checked_add(8));
        if expected != Some(bytes.len() as u64) {
            return Err(std::format!(
                "length {} does not match {nodes} nodes and a {tag_len}-byte method tag",
                bytes.len()
            ));
        }
        let method = core::str::from_utf8(&body[HEADER_LEN..HEADER_LEN + tag_len])
            .map_err(|_| String::from("method tag is not UTF-8"))?;
        let part_of: Vec<u32> = body[HEADER_LEN + tag_len..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if parts == 0 {
            return Err("invalid partition: the number of parts must be at least 1".into());
        }
        if let Some((node, &part)) = part_of.iter().enumerate().find(|(_, &p)| p >= parts) {
            return Err(std::format!(
                "invalid partition: node {node} is assigned to part {part}, but there are only {parts} parts"
            ));
        }
        Ok(Self {
            parts,
            method: method.into(),
            part_of,
        })
    }

    /// The partition's fingerprint ([`fingerprint`]).
    pub fn fingerprint(&self) -> [u8; 16] {
        fingerprint(self.parts, &self.method, &self.part_of)
    }
}

/// 16-byte identity of a partition: xxh3-128 over a domain tag, P, N, the method tag and the
/// part map. Every chunk carries it, and ranks compare it before communicating.
pub fn fingerprint(parts: u32, method: &str, part_of: &[u32]) -> [u8; 16] {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(b"distspmm-partition-v1\0");
    h.update(&parts.to_le_bytes());
    h.update(&(part_of.len() as u64).to_le_bytes());
    h.update(&(method.len() as u64).to_le_bytes());
    h.update(method.as_bytes());
    let mut buf = [0u8; 4096];
    for block in part_of.chunks(buf.len() / 4) {
        for (dst, p) in buf.chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&p.to_le_bytes());
        }
        h.update(&buf[..block.len() * 4]);
    }
    h.digest128().to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_round_trips_and_every_corruption_is_refused() {
        let bytes = encode(3, "metis:seed=1", &[0, 2, 1, 1]);
        let map = PartitionMap::parse(&bytes).unwrap();
        assert_eq!(
            map,
            PartitionMap {
                parts: 3,
                method: "metis:seed=1".into(),
                part_of: std::vec![0, 2, 1, 1],
            }
        );
        assert_eq!(
            map.fingerprint(),
            fingerprint(3, "metis:seed=1", &[0, 2, 1, 1])
        );
        assert_ne!(
            map.fingerprint(),
            fingerprint(3, "metis:seed=2", &[0, 2, 1, 1])
        );
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(PartitionMap::parse(&bad).is_err(), "a flipped bit at {at}");
        }
        assert!(PartitionMap::parse(&bytes[..bytes.len() - 1]).is_err());
        let out_of_range = encode(2, "x", &[0, 2]);
        let err = PartitionMap::parse(&out_of_range).unwrap_err();
        assert!(err.contains("node 1 is assigned to part 2"), "{err}");
    }
}
