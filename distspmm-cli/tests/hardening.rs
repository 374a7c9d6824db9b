//! Corrupted chunk directories: any single flipped byte or truncation of a chunk, the manifest or
//! the partition map makes `distspmm inspect DIR` exit with status 1 and a message naming the
//! file (and, for chunks, the section or header part), never a panic.
//!
//! `distspmm inspect DIR` is `ChunkDir::open` followed by `ChunkDir::validate_all`. The dense
//! byte sweeps (every header and section-table byte, every 7th byte elsewhere, every manifest
//! byte) run those two calls in-process, which takes a fraction of a second; a sample of the
//! same corruptions, and every truncation, also runs the binary to check its exit status and
//! message.
//!
//! Hostile headers — huge counts, overlapping or misaligned sections, offsets past the end — are
//! rejected before any allocation by chunk-format's own tests
//! (`hostile_headers_are_rejected_without_allocating` and `hostile_section_tables_are_rejected`
//! in `chunk-format/src/tests.rs`); they are not repeated here.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;

use chunk_format::dir::{ChunkDir, MANIFEST_FILE, PARTITION_MAP_FILE};
use chunk_format::{MappedChunk, HEADER_LEN, SECTION_ENTRY_LEN};
use distspmm_prep::chunk::VerifyDir;

fn distspmm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_distspmm"))
        .args(args)
        .output()
        .expect("run distspmm")
}

/// A 200-node CSBM graph partitioned into 2 parts under `root/chunks`.
fn partitioned(root: &Path) -> PathBuf {
    let graph = root.join("g.npz");
    let dir = root.join("chunks");
    for args in [
        vec![
            "generate",
            "csbm",
            "--nodes",
            "200",
            "--features",
            "8",
            "--classes",
            "3",
            "--avg-degree",
            "4",
            "--out",
            graph.to_str().unwrap(),
        ],
        vec![
            "partition",
            "--input",
            graph.to_str().unwrap(),
            "--parts",
            "2",
            "--out",
            dir.to_str().unwrap(),
        ],
    ] {
        let out = distspmm(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// What `inspect DIR` does, in-process; the error with its causes, as the CLI prints it.
fn validate(dir: &Path) -> Result<(), String> {
    let chain = |e: &dyn std::error::Error| {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    };
    let dir = ChunkDir::open(dir).map_err(|e| chain(&e))?;
    dir.validate_all().map(drop).map_err(|e| chain(&e))
}

/// Runs `distspmm inspect DIR`, which must fail cleanly; returns its stderr.
fn inspect_fails(dir: &Path, what: &str) -> String {
    let out = distspmm(&["inspect", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: inspect must exit with 1 (101 is a panic): {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

/// Where a byte of a chunk lies, and what the error must then mention.
struct Layout {
    table: Range<usize>,
    /// (byte range, section name) of every section.
    sections: Vec<(Range<usize>, String)>,
}

impl Layout {
    fn of(path: &Path) -> Self {
        let chunk = MappedChunk::open(path).unwrap();
        let view = chunk.view();
        let h = view.header();
        let start = usize::try_from(h.section_table_offset).unwrap();
        Layout {
            table: start..start + usize::try_from(h.section_count).unwrap() * SECTION_ENTRY_LEN,
            sections: view
                .sections()
                .map(|e| {
                    let at = usize::try_from(e.offset).unwrap();
                    (
                        at..at + usize::try_from(e.byte_len).unwrap(),
                        e.kind.to_string(),
                    )
                })
                .collect(),
        }
    }

    /// Words of which the error for a flip at `at` must contain at least one.
    fn expected(&self, at: usize) -> Vec<String> {
        if at < HEADER_LEN {
            return ["header", "magic", "version"].map(String::from).to_vec();
        }
        if self.table.contains(&at) {
            return vec!["section table".into()];
        }
        match self.sections.iter().find(|(r, _)| r.contains(&at)) {
            Some((_, name)) => vec![format!("section {name}")],
            None => vec!["padding".into()],
        }
    }
}

/// Every header and table byte, every 7th byte after them, and the last byte.
fn sampled_offsets(layout: &Layout, len: usize) -> Vec<usize> {
    let dense_end = layout.table.end.max(HEADER_LEN);
    let mut offsets: Vec<usize> = (0..dense_end).collect();
    offsets.extend((dense_end..len).step_by(7));
    offsets.push(len - 1);
    offsets.dedup();
    offsets
}

#[test]
fn every_sampled_byte_flip_of_a_chunk_names_the_file_and_section() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    assert_eq!(validate(&dir), Ok(()));
    let victim = dir.join("part-00001.chunk");
    let original = std::fs::read(&victim).unwrap();
    let layout = Layout::of(&victim);
    assert!(layout.sections.len() >= 10, "the sweep must cross sections");
    let offsets = sampled_offsets(&layout, original.len());

    let mut by_cli = Vec::new();
    for (i, &at) in offsets.iter().enumerate() {
        let mut bytes = original.clone();
        bytes[at] ^= 1 << (at % 8);
        std::fs::write(&victim, &bytes).unwrap();
        let err = validate(&dir).expect_err(&format!("flip at byte {at} went unnoticed"));
        assert!(err.contains("part-00001.chunk"), "byte {at}: {err}");
        let words = layout.expected(at);
        assert!(
            words.iter().any(|w| err.contains(w.as_str())),
            "byte {at}: expected one of {words:?} in: {err}"
        );
        // The binary on a sample: the first header byte, each section's first byte, every 97th.
        if at == 0 || i % 97 == 0 || layout.sections.iter().any(|(r, _)| r.start == at) {
            let stderr = inspect_fails(&dir, &format!("flip at byte {at}"));
            assert!(stderr.contains("part-00001.chunk"), "byte {at}: {stderr}");
            assert!(
                words.iter().any(|w| stderr.contains(w.as_str())),
                "byte {at}: expected one of {words:?} in: {stderr}"
            );
            by_cli.push(at);
        }
    }
    assert!(by_cli.len() >= 20, "CLI sample too small: {by_cli:?}");

    // The chunk on its own (`inspect FILE`) as well.
    let mut bytes = original.clone();
    let (data, name) = &layout.sections[layout.sections.len() / 2];
    bytes[data.start] ^= 0x80;
    std::fs::write(&victim, &bytes).unwrap();
    let out = distspmm(&["inspect", victim.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("part-00001.chunk") && stderr.contains(&format!("section {name}")),
        "{stderr}"
    );

    std::fs::write(&victim, &original).unwrap();
    assert_eq!(validate(&dir), Ok(()));
}

#[test]
fn truncated_or_missing_chunks_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let victim = dir.join("part-00000.chunk");
    let original = std::fs::read(&victim).unwrap();
    let layout = Layout::of(&victim);
    let mut lengths = vec![0, 1, 7, HEADER_LEN - 1, HEADER_LEN, layout.table.start + 1];
    lengths.extend(layout.sections.iter().map(|(r, _)| r.start + 1));
    lengths.push(original.len() - 1);
    for len in lengths {
        std::fs::write(&victim, &original[..len]).unwrap();
        let err = validate(&dir).expect_err(&format!("truncation to {len} bytes went unnoticed"));
        assert!(err.contains("part-00000.chunk"), "{len} bytes: {err}");
        let stderr = inspect_fails(&dir, &format!("truncated to {len} bytes"));
        assert!(stderr.contains("part-00000.chunk"), "{len} bytes: {stderr}");
        // Truncation is named as such (header or length), not as some later symptom.
        assert!(
            ["shorter than", "truncated", "header says"]
                .iter()
                .any(|w| stderr.contains(w)),
            "{len} bytes: {stderr}"
        );
    }
    // An extended file is caught the same way.
    let mut longer = original.clone();
    longer.extend_from_slice(&[0; 64]);
    std::fs::write(&victim, &longer).unwrap();
    let stderr = inspect_fails(&dir, "extended by 64 bytes");
    assert!(stderr.contains("part-00000.chunk"), "{stderr}");

    std::fs::remove_file(&victim).unwrap();
    let stderr = inspect_fails(&dir, "missing chunk");
    assert!(stderr.contains("part-00000.chunk"), "{stderr}");
}

#[test]
fn every_flipped_or_truncated_manifest_byte_names_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let path = dir.join(MANIFEST_FILE);
    let original = std::fs::read(&path).unwrap();
    for at in 0..original.len() {
        let mut bytes = original.clone();
        bytes[at] ^= 1 << (at % 8);
        std::fs::write(&path, &bytes).unwrap();
        let err = validate(&dir).expect_err(&format!("manifest flip at byte {at} went unnoticed"));
        assert!(err.contains(MANIFEST_FILE), "byte {at}: {err}");
        if at % 53 == 0 {
            let stderr = inspect_fails(&dir, &format!("manifest flip at byte {at}"));
            assert!(stderr.contains(MANIFEST_FILE), "byte {at}: {stderr}");
        }
    }
    // Truncation anywhere inside the JSON (the trailing newline is not part of it).
    let json_len = original.trim_ascii_end().len();
    for len in (0..json_len).step_by(31).chain([json_len - 1]) {
        std::fs::write(&path, &original[..len]).unwrap();
        let stderr = inspect_fails(&dir, &format!("manifest truncated to {len} bytes"));
        assert!(stderr.contains(MANIFEST_FILE), "{len} bytes: {stderr}");
    }
    std::fs::remove_file(&path).unwrap();
    let stderr = inspect_fails(&dir, "missing manifest");
    assert!(
        stderr.contains(MANIFEST_FILE) && stderr.contains("distspmm partition"),
        "{stderr}"
    );
}

#[test]
fn every_flipped_or_truncated_partition_map_byte_names_the_map() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = partitioned(tmp.path());
    let path = dir.join(PARTITION_MAP_FILE);
    let original = std::fs::read(&path).unwrap();
    let lengths = (0..original.len()).step_by(41);
    for at in 0..original.len() {
        let mut bytes = original.clone();
        bytes[at] ^= 1 << (at % 8);
        std::fs::write(&path, &bytes).unwrap();
        let err = validate(&dir).expect_err(&format!("map flip at byte {at} went unnoticed"));
        assert!(
            err.contains(PARTITION_MAP_FILE) && err.contains("partition map"),
            "byte {at}: {err}"
        );
    }
    for len in lengths {
        std::fs::write(&path, &original[..len]).unwrap();
        let stderr = inspect_fails(&dir, &format!("map truncated to {len} bytes"));
        assert!(stderr.contains(PARTITION_MAP_FILE), "{len} bytes: {stderr}");
    }
}
