//! Feeds arbitrary bytes to `Partition::from_map_bytes` (the `partition.map` reader), twice: as
//! given, and with the trailing xxh3 checksum recomputed so that mutations of valid seeds reach
//! the length and part-id checks behind it. An accepted map must be canonical: writing it back
//! gives the same bytes.
#![no_main]

use std::path::Path;

use distspmm_prep::partition::Partition;
use libfuzzer_sys::fuzz_target;

fn check(bytes: &[u8]) {
    let Ok(partition) = Partition::from_map_bytes(bytes, Path::new("fuzz.map")) else {
        return;
    };
    let parts = partition.parts();
    assert!(partition.part_of().iter().all(|&p| p < parts));
    assert_eq!(
        partition.to_map_bytes(),
        bytes,
        "an accepted map must be canonical"
    );
    let sizes = partition.part_sizes();
    assert_eq!(sizes.len(), parts as usize);
    assert_eq!(sizes.iter().sum::<u64>(), partition.num_nodes() as u64);
    let renumbering = partition.renumbering();
    let offsets = renumbering.offsets();
    assert_eq!(offsets.len(), parts as usize + 1);
    assert_eq!(offsets[parts as usize], partition.num_nodes() as u64);
    for p in 0..parts {
        let nodes = renumbering.part_nodes(p);
        assert_eq!(nodes.len() as u64, sizes[p as usize]);
        assert!(nodes.iter().all(|&v| partition.part_of()[v as usize] == p));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 8 {
        let mut sealed = data.to_vec();
        let body = sealed.len() - 8;
        let sum = xxhash_rust::xxh3::xxh3_64(&sealed[..body]);
        sealed[body..].copy_from_slice(&sum.to_le_bytes());
        check(&sealed);
    }
});
