//! `manifest.json`: what a chunk directory holds, written last so that its presence means every
//! file it names is complete.

use std::string::{String, ToString};
use std::vec::Vec;

use serde::{Deserialize, Serialize};

/// The `format` value of every manifest.
pub const MANIFEST_FORMAT: &str = "distspmm-chunks";
/// The manifest layout version this code writes; it reads this one and version 1 (which has no
/// [`Manifest::graph_fingerprint`]).
pub const MANIFEST_VERSION: u32 = 2;
/// File name of the manifest inside a chunk directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the saved partition map inside a chunk directory.
pub const PARTITION_MAP_FILE: &str = "partition.map";

/// The manifest of a chunk directory (serialised as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Manifest layout version ([`MANIFEST_VERSION`]).
    pub format_version: u32,
    /// Version of the chunk file format the chunks were written with (`major.minor`).
    pub chunk_format_version: String,
    /// The distspmm version that wrote the directory.
    pub distspmm_version: String,
    /// Parts P (= chunk files = ranks).
    pub parts: u32,
    /// Nodes N.
    pub nodes: u64,
    /// Edges of the input graph as given (directed, before normalisation).
    pub edges: u64,
    /// Non-zeros of Â (self loops added, duplicates merged).
    pub nnz: u64,
    /// Feature columns F (0 without features).
    pub feature_dim: u32,
    /// Classes C (0 without labels).
    pub classes: u32,
    /// Normalisation of Â: `gcn`, `row` or `none`.
    pub normalization: String,
    /// The partition method tag (e.g. `metis:seed=1:ufactor=30:objective=cut`).
    pub partition_method: String,
    /// The partition fingerprint every chunk carries, 32 hex digits.
    pub fingerprint: String,
    /// Content fingerprint of the input graph (`Graph::fingerprint`, 32 hex digits): the same
    /// for every partition of one graph, so that a training checkpoint moves between part
    /// counts. Absent in version-1 manifests and where the writer was not given it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_fingerprint: Option<String>,
    /// Part offsets `[P+1]` in renumbered ids.
    pub part_offsets: Vec<u64>,
    /// Undirected cut edges, each counted once (METIS's edge cut).
    pub edge_cut: u64,
    /// Largest part over the mean part size.
    pub max_imbalance: f64,
    /// Halo rows (rows received from all peers) per part.
    pub halo_rows: Vec<u64>,
    /// The saved partition map.
    pub partition_map: ManifestFile,
    /// One entry per part, in part order.
    pub chunks: Vec<ManifestChunk>,
    /// The command line that made the directory.
    pub command_line: Vec<String>,
    /// xxh3-64 (16 hex digits) of the manifest's contents: its pretty JSON with this field set
    /// to 16 zeros. Filled in by [`Manifest::seal`] and checked by [`Manifest::from_json`], so
    /// any change to a value (a flipped byte, a hand edit) is detected.
    pub checksum: String,
}

/// A file the manifest names, with its size and checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// File name, relative to the directory.
    pub file: String,
    /// Length in bytes.
    pub bytes: u64,
    /// xxh3-64 of the file's bytes, 16 hex digits.
    pub checksum: String,
}

/// A chunk file entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestChunk {
    /// The part p.
    pub part: u32,
    /// File name, relative to the directory.
    pub file: String,
    /// Length in bytes.
    pub bytes: u64,
    /// The chunk's whole-file checksum (header `file_checksum`, which covers the header, the
    /// section table and through it every section's checksum), 16 hex digits.
    pub checksum: String,
    /// Local rows n_p.
    pub nodes: u64,
    /// Non-zeros over the chunk's blocks.
    pub nnz: u64,
}

impl Manifest {
    /// Parses the bytes of a `manifest.json`, checks its [`checksum`](Manifest::checksum) and
    /// then [`Manifest::validate`]. The error says what is wrong (JSON syntax with line and
    /// column, a missing field, a checksum mismatch, or the rule broken); callers add the path.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let manifest: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let computed = manifest.contents_checksum()?;
        if manifest.checksum != computed {
            return Err(std::format!(
                "checksum {:?} does not match the contents ({computed}): the manifest was \
                 corrupted or edited; re-run `distspmm partition`",
                manifest.checksum
            ));
        }
        manifest.validate()?;
        Ok(manifest)
    }

    /// Fills in [`checksum`](Manifest::checksum) and returns the bytes of `manifest.json`
    /// (pretty JSON and a newline), which [`Manifest::from_json`] reads back.
    pub fn seal(&mut self) -> Result<Vec<u8>, String> {
        self.checksum = self.contents_checksum()?;
        let mut json = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        json.push(b'\n');
        Ok(json)
    }

    /// xxh3-64 of the pretty JSON with `checksum` zeroed, as 16 hex digits.
    fn contents_checksum(&self) -> Result<String, String> {
        let unsealed = Self {
            checksum: format_checksum(0),
            ..self.clone()
        };
        let json = serde_json::to_vec_pretty(&unsealed).map_err(|e| e.to_string())?;
        Ok(format_checksum(xxhash_rust::xxh3::xxh3_64(&json)))
    }

    /// The fingerprint as bytes.
    pub fn fingerprint_bytes(&self) -> Result<[u8; 16], String> {
        let mut out = [0u8; 16];
        decode_hex(&self.fingerprint, &mut out).ok_or_else(|| {
            std::format!("fingerprint {:?} is not 32 hex digits", self.fingerprint)
        })?;
        Ok(out)
    }

    /// Checks the manifest on its own: format and version, P ≥ 1, one chunk entry per part in
    /// order, offsets `[P+1]` from 0 to N, plain file names, well-formed checksums.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != MANIFEST_FORMAT {
            return Err(std::format!(
                "format is {:?}, expected {MANIFEST_FORMAT:?}",
                self.format
            ));
        }
        if !(1..=MANIFEST_VERSION).contains(&self.format_version) {
            return Err(std::format!(
                "format_version {} is not supported (this build reads 1 to {MANIFEST_VERSION})",
                self.format_version
            ));
        }
        if let Some(hex) = &self.graph_fingerprint {
            if self.format_version < 2 || decode_hex(hex, &mut [0u8; 16]).is_none() {
                return Err(std::format!(
                    "graph_fingerprint {hex:?} is not 32 hex digits of a version-2 manifest"
                ));
            }
        }
        let parts = self.parts as usize;
        if parts == 0 {
            return Err("parts is 0".into());
        }
        self.fingerprint_bytes()?;
        if self.part_offsets.len() != parts + 1 {
            return Err(std::format!(
                "part_offsets has {} entries, expected parts + 1 = {}",
                self.part_offsets.len(),
                parts + 1
            ));
        }
        if self.part_offsets[0] != 0
            || self.part_offsets.windows(2).any(|w| w[0] > w[1])
            || self.part_offsets[parts] != self.nodes
        {
            return Err(std::format!(
                "part_offsets must rise from 0 to nodes = {}",
                self.nodes
            ));
        }
        if self.halo_rows.len() != parts {
            return Err(std::format!(
                "halo_rows has {} entries, expected {parts}",
                self.halo_rows.len()
            ));
        }
        if self.chunks.len() != parts {
            return Err(std::format!(
                "{} chunk entries for {parts} parts",
                self.chunks.len()
            ));
        }
        check_file_name(&self.partition_map.file)?;
        check_checksum(&self.partition_map.checksum, "partition_map")?;
        for (p, c) in self.chunks.iter().enumerate() {
            if c.part as usize != p {
                return Err(std::format!("chunk entry {p} is for part {}", c.part));
            }
            check_file_name(&c.file)?;
            check_checksum(&c.checksum, &c.file)?;
            let n_p = self.part_offsets[p + 1] - self.part_offsets[p];
            if c.nodes != n_p {
                return Err(std::format!(
                    "chunk {} has {} nodes but part_offsets give part {p} {n_p}",
                    c.file,
                    c.nodes
                ));
            }
        }
        if self.chunks.iter().map(|c| c.nnz).sum::<u64>() != self.nnz {
            return Err(std::format!(
                "the chunks' non-zeros do not add up to nnz = {}",
                self.nnz
            ));
        }
        Ok(())
    }
}

/// A file name inside the directory: no separators, not `.`/`..`, not empty.
fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(std::format!(
            "file name {name:?} is not a plain name inside the directory"
        ));
    }
    Ok(())
}

fn check_checksum(hex: &str, what: &str) -> Result<(), String> {
    parse_checksum(hex)
        .map(|_| ())
        .ok_or_else(|| std::format!("{what}: checksum {hex:?} is not 16 hex digits"))
}

/// 16 lowercase hex digits.
pub fn format_checksum(value: u64) -> String {
    std::format!("{value:016x}")
}

impl ManifestChunk {
    /// The whole-file checksum as a number (`None` unless 16 hex digits, which
    /// [`Manifest::validate`] refuses).
    pub fn checksum_value(&self) -> Option<u64> {
        parse_checksum(&self.checksum)
    }
}

/// Parses [`format_checksum`]'s output.
pub fn parse_checksum(hex: &str) -> Option<u64> {
    let mut bytes = [0u8; 8];
    decode_hex(hex, &mut bytes)?;
    Some(u64::from_be_bytes(bytes))
}

/// A fingerprint as the 32 lowercase hex digits the manifest stores.
pub fn fingerprint_hex(fingerprint: &[u8; 16]) -> String {
    encode_hex(fingerprint)
}

/// Lowercase hex of `bytes`.
pub(crate) fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| std::format!("{b:02x}")).collect()
}

fn decode_hex(hex: &str, out: &mut [u8]) -> Option<()> {
    if hex.len() != 2 * out.len() || !hex.is_ascii() {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        for v in [0u64, 1, 0xdead_beef, u64::MAX] {
            assert_eq!(parse_checksum(&format_checksum(v)), Some(v));
        }
        assert_eq!(parse_checksum("123"), None);
        assert_eq!(parse_checksum("zz00000000000000"), None);
        assert_eq!(encode_hex(&[0, 15, 255]), "000fff");
    }

    fn two_part_manifest() -> Manifest {
        let chunk = |part: u32, nodes: u64, nnz: u64| ManifestChunk {
            part,
            file: std::format!("part-{part:05}.chunk"),
            bytes: 4096,
            checksum: format_checksum(0x0123_4567_89ab_cdef ^ u64::from(part)),
            nodes,
            nnz,
        };
        Manifest {
            format: MANIFEST_FORMAT.into(),
            format_version: MANIFEST_VERSION,
            chunk_format_version: "1.0".into(),
            distspmm_version: "0.1.0".into(),
            parts: 2,
            nodes: 5,
            edges: 8,
            nnz: 13,
            feature_dim: 0,
            classes: 0,
            normalization: "gcn".into(),
            partition_method: "contiguous".into(),
            fingerprint: encode_hex(&[7u8; 16]),
            graph_fingerprint: Some(encode_hex(&[9u8; 16])),
            part_offsets: std::vec![0, 3, 5],
            edge_cut: 1,
            max_imbalance: 1.2,
            halo_rows: std::vec![1, 1],
            partition_map: ManifestFile {
                file: PARTITION_MAP_FILE.into(),
                bytes: 64,
                checksum: format_checksum(42),
            },
            chunks: std::vec![chunk(0, 3, 8), chunk(1, 2, 5)],
            command_line: std::vec!["distspmm".into(), "partition".into()],
            checksum: String::new(),
        }
    }

    #[test]
    fn from_json_round_trips_and_rejects_broken_rules() {
        let mut manifest = two_part_manifest();
        let json = manifest.seal().unwrap();
        assert_eq!(manifest.checksum.len(), 16);
        assert_eq!(Manifest::from_json(&json).unwrap(), manifest);

        // Every prefix that cuts into the JSON is an error (truncated file), never a panic.
        for len in 0..json.trim_ascii_end().len() {
            assert!(Manifest::from_json(&json[..len]).is_err(), "prefix {len}");
        }
        let mut extra_part = manifest.clone();
        extra_part.parts = 3;
        let err = Manifest::from_json(&extra_part.seal().unwrap()).unwrap_err();
        assert!(err.contains("part_offsets"), "{err}");
        let mut escaping = manifest;
        escaping.chunks[1].file = "../part-00001.chunk".into();
        let err = Manifest::from_json(&escaping.seal().unwrap()).unwrap_err();
        assert!(err.contains("not a plain name"), "{err}");
    }

    #[test]
    fn version_1_manifests_without_the_graph_fingerprint_are_read() {
        let mut old = two_part_manifest();
        old.format_version = 1;
        old.graph_fingerprint = None;
        let json = old.seal().unwrap();
        assert!(!String::from_utf8_lossy(&json).contains("graph_fingerprint"));
        assert_eq!(Manifest::from_json(&json).unwrap(), old);
        // Version 1 never had the field; version 2 may lack it (a writer not given it).
        let mut odd = two_part_manifest();
        odd.format_version = 1;
        let err = Manifest::from_json(&odd.seal().unwrap()).unwrap_err();
        assert!(err.contains("graph_fingerprint"), "{err}");
        let mut bad = two_part_manifest();
        bad.graph_fingerprint = Some("xyz".into());
        let err = Manifest::from_json(&bad.seal().unwrap()).unwrap_err();
        assert!(err.contains("not 32 hex digits"), "{err}");
        let mut without = two_part_manifest();
        without.graph_fingerprint = None;
        assert!(Manifest::from_json(&without.seal().unwrap()).is_ok());
        let mut newer = two_part_manifest();
        newer.format_version = MANIFEST_VERSION + 1;
        let err = Manifest::from_json(&newer.seal().unwrap()).unwrap_err();
        assert!(err.contains("reads 1 to 2"), "{err}");
    }

    #[test]
    fn every_flipped_byte_and_changed_value_is_detected() {
        let mut manifest = two_part_manifest();
        let json = manifest.seal().unwrap();
        for at in 0..json.len() {
            for mask in [0x01u8, 0x20, 0x80] {
                let mut bytes = json.clone();
                bytes[at] ^= mask;
                assert!(
                    Manifest::from_json(&bytes).is_err(),
                    "byte {at} ^ {mask:#04x} went unnoticed"
                );
            }
        }
        // A value no rule checks (e.g. the edge cut), changed consistently, is still caught.
        let mut edited = manifest.clone();
        edited.edge_cut += 1;
        let err = Manifest::from_json(&serde_json::to_vec_pretty(&edited).unwrap()).unwrap_err();
        assert!(err.contains("checksum"), "{err}");
        // Whitespace does not matter: the checksum covers the contents, not the layout.
        let compact = serde_json::to_vec(&manifest).unwrap();
        assert_eq!(Manifest::from_json(&compact).unwrap(), manifest);
    }

    #[test]
    fn file_names_must_stay_inside_the_directory() {
        for bad in ["", ".", "..", "../x", "a/b", "a\\b"] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_file_name("part-00000.chunk").is_ok());
    }
}
