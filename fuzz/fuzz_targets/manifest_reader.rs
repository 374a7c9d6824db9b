//! Feeds arbitrary bytes to `Manifest::from_json` (the parser and rule check behind every
//! `ChunkDir::open`). On success the manifest must satisfy what loading relies on, and must
//! serialise and parse back to itself.
#![no_main]

use distspmm_core::chunk::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Manifest::from_json(data) else {
        return;
    };
    let parts = m.parts as usize;
    assert!(parts >= 1);
    assert_eq!(m.chunks.len(), parts);
    assert_eq!(m.part_offsets.len(), parts + 1);
    assert_eq!(m.halo_rows.len(), parts);
    assert_eq!(m.part_offsets[parts], m.nodes);
    m.fingerprint_bytes()
        .expect("an accepted manifest has a fingerprint");
    for (p, c) in m.chunks.iter().enumerate() {
        assert_eq!(c.part as usize, p);
        assert!(!c.file.contains('/') && c.file != ".." && !c.file.is_empty());
        assert_eq!(c.nodes, m.part_offsets[p + 1] - m.part_offsets[p]);
    }
    // What the writer (`write_chunk_dir`, serde_json pretty) would store reads back unchanged.
    let json = serde_json::to_vec_pretty(&m).expect("an accepted manifest must serialise");
    assert_eq!(Manifest::from_json(&json).as_ref(), Ok(&m));
});
