//! Feeds arbitrary bytes to `Manifest::from_json` (the parser, checksum and rule check behind
//! every `ChunkDir::open`), twice: as given, and — when the bytes deserialise — resealed with
//! `Manifest::seal` so that mutations of valid seeds reach the rules behind the checksum. An
//! accepted manifest must satisfy what loading relies on and read back unchanged from what the
//! writer would store.
#![no_main]

use chunk_format::dir::Manifest;
use libfuzzer_sys::fuzz_target;

fn check(bytes: &[u8]) {
    let Ok(m) = Manifest::from_json(bytes) else {
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
    let mut again = m.clone();
    let json = again.seal().expect("an accepted manifest must serialise");
    assert_eq!(again, m, "sealing an accepted manifest changed it");
    assert_eq!(Manifest::from_json(&json).as_ref(), Ok(&m));
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Ok(mut m) = serde_json::from_slice::<Manifest>(data) {
        if let Ok(sealed) = m.seal() {
            check(&sealed);
        }
    }
});
