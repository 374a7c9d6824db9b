//! Chunk building against set and dense references, and chunk directories end to end.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test graphs of a few thousand nodes: every narrowing is exact"
)]

use std::collections::BTreeSet;
use std::path::Path;
use std::string::ToString;
use std::vec::Vec;

use chunk_format::dir::{
    check_consistency, chunk_file_name, ChunkDir, ChunkDirError, DirLock, Manifest, WriteOptions,
    MANIFEST_FILE, PARTITION_MAP_FILE,
};
use chunk_format::{encode, AlignedBuf, ChunkView};
use proptest::prelude::*;

use super::*;
use crate::graph::{Features, Graph, Targets, TARGET_UNLABELLED};
use crate::partition::{partition, Adjacency, Method, MetisOptions, Partition};
use distspmm_sparse::sparse::CsrOwned;

/// A graph with random node data, and a stand-in Â with the structure `normalize` gives
/// (row v = v's in-neighbours plus a self loop) but arbitrary values: the builder only moves
/// entries, so any N × N CSR exercises it.
fn graph_and_a_hat(
    n: usize,
    edges: &[(u32, u32)],
    dim: usize,
    seed: u32,
) -> (Graph, CsrOwned<f32>) {
    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
    let mut g = Graph::from_edges(n, src, dst);
    let val = |i: usize| ((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / 1.0e9;
    if dim > 0 {
        g.features = Some(Features {
            dim,
            data: (0..n * dim).map(val).collect::<Vec<f32>>().into(),
        });
    }
    if seed.is_multiple_of(2) {
        g.labels = Some((0..n).map(|v| (v as i32 + seed as i32) % 4 - 1).collect());
    } else {
        // Multi-label targets: three classes, every fifth node unlabelled.
        let data = (0..n * 3)
            .map(|k| {
                if (k / 3 + seed as usize).is_multiple_of(5) {
                    TARGET_UNLABELLED
                } else {
                    u8::from((k as u32).wrapping_mul(2654435761) ^ seed > u32::MAX / 2)
                }
            })
            .collect();
        g.targets = Some(Targets { classes: 3, data });
    }
    g.train_mask = Some((0..n).map(|v| v % 3 == 0).collect());
    g.test_mask = Some((0..n).map(|v| v % 5 == 1).collect());
    let mut rows: Vec<u32> = g.dst.clone();
    let mut cols: Vec<u32> = g.src.clone();
    rows.extend(0..n as u32);
    cols.extend(0..n as u32);
    let values: Vec<f32> = (0..rows.len()).map(val).collect();
    let a_hat = CsrOwned::from_triplets(n, n, &rows, &cols, &values).unwrap();
    (g, a_hat)
}

fn encode_all(builder: &ChunkBuilder<'_>) -> Vec<AlignedBuf> {
    (0..builder.partition().parts())
        .map(|p| encode(&builder.build(p).contents()).unwrap())
        .collect()
}

/// Â permuted into renumbered ids, as a dense matrix.
fn permuted_dense(a_hat: &CsrOwned<f32>, old_to_new: &[u32]) -> Vec<f32> {
    let n = a_hat.nrows();
    let mut dense = std::vec![0f32; n * n];
    for v in 0..n {
        let (cols, vals) = a_hat.row(v);
        for (&u, &x) in cols.iter().zip(vals) {
            dense[old_to_new[v] as usize * n + old_to_new[u as usize] as usize] = x;
        }
    }
    dense
}

fn check_chunks(g: &Graph, a_hat: &CsrOwned<f32>, part: &Partition) {
    let builder = ChunkBuilder::new(g, a_hat.view(), part).unwrap();
    let bufs = encode_all(&builder);
    let views: Vec<ChunkView<'_>> = bufs
        .iter()
        .map(|b| ChunkView::parse(b.as_bytes()).unwrap())
        .collect();
    let named: Vec<(&Path, &ChunkView<'_>)> = views.iter().map(|v| (Path::new("mem"), v)).collect();
    check_consistency(&named).unwrap();

    // Reassembling all chunks gives Â exactly (bit-identical values).
    let renumbering = part.renumbering();
    let back = reassemble(&named).unwrap();
    assert_eq!(
        back.to_dense(),
        permuted_dense(a_hat, renumbering.old_to_new())
    );

    let off = renumbering.offsets();
    for (p, view) in views.iter().enumerate() {
        let nodes = renumbering.part_nodes(p as u32);
        // Halo lists minimal and complete: exactly the referenced columns of each peer.
        for (q, &base) in off.iter().enumerate().take(part.parts() as usize) {
            let mut want = BTreeSet::new();
            if q != p {
                for &v in nodes {
                    for &u in a_hat.row(v as usize).0 {
                        if part.part_of()[u as usize] as usize == q {
                            want.insert(renumbering.old_to_new()[u as usize] - base as u32);
                        }
                    }
                }
            }
            let got: Vec<u32> = view.halo_recv(q).to_vec();
            assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "recv {p} <- {q}");
            assert_eq!(
                view.block_for_source(q as u32).is_some(),
                q == p || !got.is_empty()
            );
        }
        // Node data follows its nodes.
        let ids: Vec<u64> = nodes.iter().map(|&v| u64::from(v)).collect();
        assert_eq!(view.original_ids(), ids.as_slice());
        for (i, &v) in nodes.iter().enumerate() {
            let v = v as usize;
            if let Some(f) = &g.features {
                let row = &view.features().unwrap()[i * f.dim..(i + 1) * f.dim];
                assert_eq!(row, f.row(v));
            }
            // Labels are kept when there is at least one class (all −1 means C = 0: none).
            match (view.labels(), view.targets(), &g.targets) {
                (Some(labels), None, None) => {
                    assert_eq!(labels[i], g.labels.as_ref().unwrap()[v]);
                }
                (None, Some(targets), Some(t)) => {
                    assert_eq!(view.header().num_classes, 3);
                    assert_eq!(view.header().version.minor, 2);
                    assert_eq!(&targets[i * 3..(i + 1) * 3], t.row(v));
                }
                (None, None, None) => assert_eq!(g.num_classes(), 0),
                other => panic!("labels and targets do not follow the graph: {other:?}"),
            }
            let m = view.masks().unwrap()[i];
            assert_eq!(m & 1 != 0, g.train_mask.as_ref().unwrap()[v]);
            assert_eq!(m & 2, 0);
            assert_eq!(m & 4 != 0, g.test_mask.as_ref().unwrap()[v]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn chunks_match_references(
        n in 1usize..40,
        parts_raw in 1u32..6,
        edges in proptest::collection::vec((0u32..40, 0u32..40), 0..160),
        dim in 0usize..4,
        method in 0usize..3,
        seed in 0u32..1000,
    ) {
        let parts = parts_raw.min(n as u32);
        let edges: Vec<(u32, u32)> =
            edges.iter().map(|&(u, v)| (u % n as u32, v % n as u32)).collect();
        let (g, a_hat) = graph_and_a_hat(n, &edges, dim, seed);
        let adj = Adjacency::from_edges(n, &g.src, &g.dst).unwrap();
        let method = [
            Method::Metis(MetisOptions { seed: u64::from(seed), ..MetisOptions::default() }),
            Method::Contiguous,
            Method::Random { seed: u64::from(seed) },
        ][method];
        let part = partition(&adj, parts, &method).unwrap();
        check_chunks(&g, &a_hat, &part);
    }
}

#[test]
fn one_part_has_no_halo_and_disconnected_graphs_work() {
    // Two components and an isolated node, P = 1 and P = 3.
    let edges = [(0, 1), (1, 0), (1, 2), (2, 1), (4, 5), (5, 4)];
    let (g, a_hat) = graph_and_a_hat(7, &edges, 2, 3);
    let adj = Adjacency::from_edges(7, &g.src, &g.dst).unwrap();
    for parts in [1, 3] {
        let part = partition(&adj, parts, &Method::Metis(MetisOptions::default())).unwrap();
        check_chunks(&g, &a_hat, &part);
    }
    let part = partition(&adj, 1, &Method::Contiguous).unwrap();
    let builder = ChunkBuilder::new(&g, a_hat.view(), &part).unwrap();
    let chunk = builder.build(0);
    assert_eq!(chunk.halo_rows(), 0);
    assert_eq!(chunk.contents().blocks.len(), 1);
}

#[test]
fn builder_rejects_mismatched_inputs() {
    let (g, a_hat) = graph_and_a_hat(5, &[(0, 1)], 0, 0);
    let wrong = Partition::new(2, std::vec![0, 1, 0, 1], "x").unwrap();
    assert!(matches!(
        ChunkBuilder::new(&g, a_hat.view(), &wrong),
        Err(ChunkBuildError::Mismatch(_))
    ));
    let (_, small) = graph_and_a_hat(4, &[], 0, 0);
    let part = Partition::new(1, std::vec![0; 5], "x").unwrap();
    assert!(matches!(
        ChunkBuilder::new(&g, small.view(), &part),
        Err(ChunkBuildError::Mismatch(_))
    ));
}

fn ring(n: u32) -> Vec<(u32, u32)> {
    (0..n)
        .flat_map(|v| [(v, (v + 1) % n), ((v + 1) % n, v)])
        .collect()
}

fn write_dir(
    dir: &Path,
    g: &Graph,
    a_hat: &CsrOwned<f32>,
    part: &Partition,
    force: bool,
) -> Result<Manifest, ChunkDirError> {
    let builder = ChunkBuilder::new(g, a_hat.view(), part).unwrap();
    let options = WriteOptions {
        force,
        command_line: std::vec!["test".into()],
        ..WriteOptions::default()
    };
    write_chunk_dir(dir, &builder, &options)
}

#[test]
fn directory_round_trip_and_overwrite_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chunks");
    let (g, a_hat) = graph_and_a_hat(30, &ring(30), 3, 1);
    let adj = Adjacency::from_edges(30, &g.src, &g.dst).unwrap();
    let metis = partition(&adj, 4, &Method::Metis(MetisOptions::default())).unwrap();
    let m = write_dir(&dir, &g, &a_hat, &metis, false).unwrap();
    assert_eq!(m.parts, 4);
    assert_eq!(m.edge_cut, metis.edge_cut(&adj).unwrap());
    assert_eq!(m.nnz, a_hat.nnz() as u64);
    assert_eq!(m.edges, 60);

    let opened = ChunkDir::open(&dir).unwrap();
    assert_eq!(opened.manifest(), &m);
    assert_eq!(opened.fingerprint(), metis.fingerprint());
    assert_eq!(opened.load_partition().unwrap(), metis);
    assert_eq!(opened.validate_all().unwrap().len(), 4);
    let back = opened.reassemble().unwrap();
    assert_eq!(
        back.to_dense(),
        permuted_dense(&a_hat, metis.renumbering().old_to_new())
    );

    // Same partition again: fine (idempotent).
    assert_eq!(write_dir(&dir, &g, &a_hat, &metis, false).unwrap(), m);
    // Another partition: refused without force, and the directory is untouched.
    let random = partition(&adj, 2, &Method::Random { seed: 5 }).unwrap();
    let err = write_dir(&dir, &g, &a_hat, &random, false).unwrap_err();
    assert!(
        matches!(err, ChunkDirError::DifferentPartition { .. }),
        "{err}"
    );
    assert!(std::format!("{err}").contains("--force"));
    ChunkDir::open(&dir).unwrap().validate_all().unwrap();
    // With force: replaced, and the chunk files of the 4-part run are gone.
    write_dir(&dir, &g, &a_hat, &random, true).unwrap();
    let opened = ChunkDir::open(&dir).unwrap();
    assert_eq!(opened.parts(), 2);
    opened.validate_all().unwrap();
    assert!(!dir.join(chunk_file_name(2)).exists());
    assert!(!dir.join(chunk_file_name(3)).exists());
}

#[test]
fn temporaries_left_by_killed_writers_are_removed_by_the_next_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chunks");
    std::fs::create_dir_all(&dir).unwrap();
    // What writers killed before their rename leave behind.
    let other = std::process::id().wrapping_add(1);
    let stale = [
        std::format!("part-00001.chunk.tmp-{other}-0"),
        std::format!("manifest.json.tmp-{other}"),
        std::format!("partition.map.tmp-{other}"),
    ];
    for name in &stale {
        std::fs::write(dir.join(name), b"partial").unwrap();
    }
    let (g, a_hat) = graph_and_a_hat(20, &ring(20), 2, 3);
    let adj = Adjacency::from_edges(20, &g.src, &g.dst).unwrap();
    let part = partition(&adj, 2, &Method::Contiguous).unwrap();
    write_dir(&dir, &g, &a_hat, &part, false).unwrap();
    for name in &stale {
        assert!(!dir.join(name).exists(), "{name} was left");
    }
    ChunkDir::open(&dir).unwrap().validate_all().unwrap();
}

#[test]
fn files_that_only_look_like_a_chunk_directory_s_are_refused_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (g, a_hat) = graph_and_a_hat(20, &ring(20), 2, 3);
    let adj = Adjacency::from_edges(20, &g.src, &g.dst).unwrap();
    let part = partition(&adj, 2, &Method::Contiguous).unwrap();
    let other = std::process::id().wrapping_add(1);
    for (i, name) in [
        String::from("notes.txt"),
        std::format!("features.npy.tmp-{other}"),
        String::from("part-00001.chunk.tmp-abc"),
        String::from("manifest.json.tmp-"),
        String::from("part-x.chunk"),
    ]
    .iter()
    .enumerate()
    {
        let dir = tmp.path().join(std::format!("chunks{i}"));
        write_dir(&dir, &g, &a_hat, &part, false).unwrap();
        std::fs::write(dir.join(name), b"mine").unwrap();
        match write_dir(&dir, &g, &a_hat, &part, true) {
            Err(ChunkDirError::Foreign { entry, others, .. }) => {
                assert_eq!(entry, dir.join(name));
                assert_eq!(others, 0);
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(std::fs::read(dir.join(name)).unwrap(), b"mine");
        ChunkDir::open(&dir).unwrap().validate_all().unwrap();
    }
    // A subdirectory, even one named like a chunk, is not a chunk directory's either.
    let dir = tmp.path().join("chunks");
    std::fs::create_dir_all(dir.join("part-00000.chunk")).unwrap();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let err = write_dir(&dir, &g, &a_hat, &part, true).unwrap_err();
    let message = std::format!("{err}");
    assert!(
        message.contains("data (and 1 more entry)") && message.contains("give a new or empty"),
        "{message}"
    );
    assert!(dir.join("part-00000.chunk").is_dir());
}

#[test]
fn a_file_that_appears_during_a_run_is_left_with_the_old_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chunks");
    let (g, a_hat) = graph_and_a_hat(20, &ring(20), 2, 3);
    let adj = Adjacency::from_edges(20, &g.src, &g.dst).unwrap();
    let part = partition(&adj, 2, &Method::Contiguous).unwrap();
    write_dir(&dir, &g, &a_hat, &part, false).unwrap();
    // The lock checked the directory; the file comes after, while the run goes on.
    let lock = std::sync::Arc::new(DirLock::acquire(&dir).unwrap());
    std::fs::write(dir.join("late.txt"), b"mine").unwrap();
    let builder = ChunkBuilder::new(&g, a_hat.view(), &part).unwrap();
    let options = WriteOptions {
        lock: Some(lock),
        ..WriteOptions::default()
    };
    write_chunk_dir(&dir, &builder, &options).unwrap();
    ChunkDir::open(&dir).unwrap().validate_all().unwrap();
    assert!(!dir.join("late.txt").exists());
    let old = tmp
        .path()
        .join(std::format!(".chunks.staging-{}", std::process::id()));
    let left: Vec<String> = std::fs::read_dir(&old)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["late.txt"]);
    assert_eq!(std::fs::read(old.join("late.txt")).unwrap(), b"mine");
}

#[test]
fn corrupted_and_foreign_chunks_are_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let (g, a_hat) = graph_and_a_hat(24, &ring(24), 2, 2);
    let adj = Adjacency::from_edges(24, &g.src, &g.dst).unwrap();
    let a = partition(&adj, 3, &Method::Metis(MetisOptions::default())).unwrap();
    let b = partition(&adj, 3, &Method::Random { seed: 1 }).unwrap();
    let (dir_a, dir_b) = (tmp.path().join("a"), tmp.path().join("b"));
    write_dir(&dir_a, &g, &a_hat, &a, false).unwrap();
    write_dir(&dir_b, &g, &a_hat, &b, false).unwrap();

    // A chunk of another partition run mixed in.
    let victim = dir_a.join(chunk_file_name(1));
    let original = std::fs::read(&victim).unwrap();
    std::fs::copy(dir_b.join(chunk_file_name(1)), &victim).unwrap();
    let err = ChunkDir::open(&dir_a).unwrap().validate_all().unwrap_err();
    let msg = std::format!("{err}");
    assert!(
        msg.contains("part-00001.chunk") && msg.contains("another partition"),
        "{msg}"
    );

    // Same partition, different contents (re-normalised values): the manifest checksum catches it.
    let (_, other_values) = graph_and_a_hat(24, &ring(24), 2, 99);
    let builder = ChunkBuilder::new(&g, other_values.view(), &a).unwrap();
    chunk_format::write_chunk(&victim, &builder.build(1).contents()).unwrap();
    let err = ChunkDir::open(&dir_a).unwrap().load(1).unwrap_err();
    assert!(std::format!("{err}").contains("file_checksum"), "{err}");

    // A flipped byte.
    let mut bytes = original.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();
    let err = ChunkDir::open(&dir_a).unwrap().validate_all().unwrap_err();
    assert!(matches!(err, ChunkDirError::Chunk(_)), "{err}");
    assert!(std::format!("{err}").contains("part-00001.chunk"), "{err}");

    // Restored: valid again. A damaged manifest or partition map is reported.
    std::fs::write(&victim, &original).unwrap();
    ChunkDir::open(&dir_a).unwrap().validate_all().unwrap();
    let map = dir_a.join(PARTITION_MAP_FILE);
    let mut map_bytes = std::fs::read(&map).unwrap();
    map_bytes[30] ^= 1;
    std::fs::write(&map, &map_bytes).unwrap();
    // Found on opening: every command that opens the directory sees it, not only validate_all.
    let err = ChunkDir::open(&dir_a).unwrap_err();
    assert!(std::format!("{err}").contains("partition map"), "{err}");
    std::fs::remove_file(&map).unwrap();
    let err = ChunkDir::open(&dir_a).unwrap_err();
    assert!(
        std::format!("{err}").contains("missing, but the manifest lists it"),
        "{err}"
    );
    std::fs::copy(dir_b.join(PARTITION_MAP_FILE), &map).unwrap();
    let err = ChunkDir::open(&dir_a).unwrap_err();
    assert!(
        std::format!("{err}").contains("replaced or corrupted"),
        "{err}"
    );
    std::fs::write(dir_a.join(MANIFEST_FILE), b"{\"format\": 1}").unwrap();
    assert!(matches!(
        ChunkDir::open(&dir_a),
        Err(ChunkDirError::Manifest { .. })
    ));
    std::fs::remove_file(dir_a.join(MANIFEST_FILE)).unwrap();
    let err = ChunkDir::open(&dir_a).unwrap_err();
    assert!(
        std::format!("{err}").contains("never completely written"),
        "{err}"
    );
}

#[test]
fn halo_scan_across_bitmap_words() {
    // Part ranges that start and end inside 64-bit words, many words per part.
    let n = 700u32;
    let mut state = 12345u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32 % n
    };
    let edges: Vec<(u32, u32)> = (0..3000).map(|_| (next(), next())).collect();
    let (g, a_hat) = graph_and_a_hat(n as usize, &edges, 1, 7);
    let adj = Adjacency::from_edges(n as usize, &g.src, &g.dst).unwrap();
    for method in [Method::Random { seed: 3 }, Method::Contiguous] {
        let part = partition(&adj, 7, &method).unwrap();
        check_chunks(&g, &a_hat, &part);
    }
}

#[test]
fn range_mask_selects_exactly_the_range() {
    for base in [0usize, 64, 128] {
        for start in 0..200 {
            for end in start + 1..start + 70 {
                if base >= end {
                    continue;
                }
                let mask = build::range_mask(base, start, end);
                for bit in 0..64 {
                    let id = base + bit;
                    assert_eq!(
                        mask >> bit & 1 == 1,
                        (start..end).contains(&id),
                        "{base} {start} {end} {bit}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_part_whose_local_ids_overflow_u32_asks_for_more_parts() {
    assert!(build::check_part_fits(0, 10, 5, 15).is_ok());
    let err = build::check_part_fits(3, 10, 6, 15).unwrap_err();
    let text = std::format!("{err}");
    assert!(
        text.contains("part 3") && text.contains("more parts"),
        "{text}"
    );
    assert!(build::check_part_fits(0, u64::MAX, 1, u64::from(u32::MAX)).is_err());
}

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chunks");
    let (g, a_hat) = graph_and_a_hat(20, &ring(20), 2, 3);
    let adj = Adjacency::from_edges(20, &g.src, &g.dst).unwrap();
    let part = partition(&adj, 2, &Method::Contiguous).unwrap();
    let held = DirLock::acquire(&dir).unwrap();
    let err = write_dir(&dir, &g, &a_hat, &part, true).unwrap_err();
    assert!(matches!(err, ChunkDirError::Busy { .. }), "{err}");
    let text = std::format!("{err}");
    assert!(
        text.contains("another `distspmm partition` is writing") && text.contains(".chunks.lock"),
        "{text}"
    );
    assert!(!dir.exists(), "a refused writer wrote nothing");
    // A second lock in the same process is refused too (flock is per open file).
    assert!(matches!(
        DirLock::acquire(&dir),
        Err(ChunkDirError::Busy { .. })
    ));
    drop(held);
    write_dir(&dir, &g, &a_hat, &part, true).unwrap();
    ChunkDir::open(&dir).unwrap().validate_all().unwrap();
}

#[test]
fn a_rewrite_swaps_in_a_complete_directory_and_leaves_no_staging() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("chunks");
    let (g, a_hat) = graph_and_a_hat(30, &ring(30), 3, 1);
    let adj = Adjacency::from_edges(30, &g.src, &g.dst).unwrap();
    let four = partition(&adj, 4, &Method::Contiguous).unwrap();
    let two = partition(&adj, 2, &Method::Random { seed: 9 }).unwrap();
    write_dir(&dir, &g, &a_hat, &four, false).unwrap();
    // What a writer killed mid-run leaves beside the directory: removed by the next write.
    let stale = tmp.path().join(".chunks.staging-4000000");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join(chunk_file_name(0)), b"partial").unwrap();
    std::fs::write(stale.join("manifest.json.tmp-4000000-1"), b"partial").unwrap();
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = inode(&dir);
    write_dir(&dir, &g, &a_hat, &two, true).unwrap();
    assert_ne!(inode(&dir), before, "the directory was replaced as a whole");
    let opened = ChunkDir::open(&dir).unwrap();
    assert_eq!(opened.parts(), 2);
    opened.validate_all().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".chunks.lock", "chunks"]);
    let mut inside: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    inside.sort();
    assert_eq!(
        inside,
        [
            "manifest.json",
            "part-00000.chunk",
            "part-00001.chunk",
            "partition.map"
        ]
    );
}

/// Random graphs for the bounded builder: weights (some duplicates, self loops and isolated
/// nodes at these sizes), features, labels, masks.
pub(super) fn weighted_graph(
    n: usize,
    edges: &[(u32, u32, u8)],
    weighted: bool,
    seed: u32,
) -> Graph {
    let (g, _) = graph_and_a_hat(
        n,
        &edges.iter().map(|&(u, v, _)| (u, v)).collect::<Vec<_>>(),
        (seed % 3) as usize,
        seed,
    );
    let mut g = g;
    // Weights in (0, 2] with uneven bits, so the order of f32 sums matters.
    g.weights = weighted.then(|| edges.iter().map(|e| f32::from(e.2) / 7.0 + 0.1).collect());
    g
}

/// Every part's chunk by the in-memory builder (over `normalize::adjacency_with_weights`) and
/// by the bounded builder (over edge buckets in a work directory beside `out`), encoded.
pub(super) fn both_builders(
    g: &Graph,
    part: &Partition,
    norm: crate::normalize::Normalization,
    out: &Path,
) -> (Vec<AlignedBuf>, Vec<AlignedBuf>) {
    let (a_hat, weights) = crate::normalize::adjacency_with_weights(
        g.num_nodes,
        &g.src,
        &g.dst,
        g.weights.as_deref(),
        norm,
    )
    .unwrap();
    let in_memory = encode_all(
        &ChunkBuilder::new(g, a_hat.view(), part)
            .unwrap()
            .with_edge_weights(&weights)
            .unwrap(),
    );
    let lock = DirLock::acquire(out).unwrap();
    let buckets =
        EdgeBuckets::write(&lock, part, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap();
    assert_eq!(buckets.edges(), g.num_edges() as u64);
    // The bounded builder needs only the node data once the edges are bucketed.
    let mut nodes_only = g.clone();
    nodes_only.src = Vec::new();
    nodes_only.dst = Vec::new();
    nodes_only.weights = None;
    let bounded = BoundedBuilder::new(&nodes_only, part, buckets).unwrap();
    assert_eq!(bounded.nnz(), a_hat.nnz() as u64);
    assert_eq!(
        PartChunkBuilder::halo(&bounded),
        ChunkBuilder::new(g, a_hat.view(), part).unwrap().halo()
    );
    let mut scratch = Vec::new();
    let chunks = (0..part.parts())
        .map(|p| encode(&bounded.build_part(p, &mut scratch).unwrap().contents()).unwrap())
        .collect();
    (in_memory, chunks)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn bounded_chunks_are_byte_identical_to_in_memory_ones(
        n in 1usize..40,
        parts_raw in 1u32..=6,
        edges in proptest::collection::vec((0u32..40, 0u32..40, 0u8..20), 0..160),
        weighted in any::<bool>(),
        norm in 0usize..3,
        method in 0usize..2,
        seed in 0u32..1000,
    ) {
        let parts = parts_raw.min(n as u32);
        let edges: Vec<(u32, u32, u8)> =
            edges.iter().map(|&(u, v, w)| (u % n as u32, v % n as u32, w)).collect();
        let g = weighted_graph(n, &edges, weighted, seed);
        let norm = [
            crate::normalize::Normalization::Gcn,
            crate::normalize::Normalization::Row,
            crate::normalize::Normalization::None,
        ][norm];
        let adj = Adjacency::from_edges(n, &g.src, &g.dst).unwrap();
        let method = [Method::Random { seed: u64::from(seed) }, Method::Contiguous][method];
        let part = partition(&adj, parts, &method).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (in_memory, bounded) = both_builders(&g, &part, norm, &tmp.path().join("out"));
        prop_assert_eq!(in_memory.len(), bounded.len());
        for (p, (a, b)) in in_memory.iter().zip(&bounded).enumerate() {
            prop_assert!(a.as_bytes() == b.as_bytes(), "part {} differs", p);
        }
        let views: Vec<ChunkView<'_>> =
            in_memory.iter().map(|b| ChunkView::parse(b.as_bytes()).unwrap()).collect();
        check_edge_weights(&g, &part, norm, &views);
        // The work directory is gone with the builder.
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.contains("buckets"))
            .collect();
        prop_assert!(left.is_empty(), "left {:?}", left);
    }
}

/// A of the graph densely in original ids, `[dst][src]`, in f64: the edges' weights summed (1
/// when unweighted), self loops included.
fn dense_a(g: &Graph) -> Vec<f64> {
    let n = g.num_nodes;
    let mut a = std::vec![0f64; n * n];
    for e in 0..g.src.len() {
        let w = g.weights.as_ref().map_or(1.0, |w| f64::from(w[e]));
        a[g.dst[e] as usize * n + g.src[e] as usize] += w;
    }
    a
}

/// Every chunk carries the weight in A of each stored entry, in CSR_VALS order: A's value
/// there (0 at a diagonal entry the normalisation added), every entry of A among them, and
/// CSR_VALS itself without normalisation.
fn check_edge_weights(
    g: &Graph,
    part: &Partition,
    norm: crate::normalize::Normalization,
    views: &[ChunkView<'_>],
) {
    let n = g.num_nodes;
    let a = dense_a(g);
    let renumbering = part.renumbering();
    let mut stored_nonzeros = 0;
    for (p, view) in views.iter().enumerate() {
        // 1.2 with multi-label targets.
        let version = if g.targets.is_some() { "1.2" } else { "1.1" };
        assert_eq!(view.header().version.to_string(), version);
        let flat = view.edge_weights().expect("the chunk carries edge weights");
        assert_eq!(flat.len() as u64, view.header().nnz);
        for b in view.blocks() {
            let weights = b.edge_weights.unwrap();
            if norm == crate::normalize::Normalization::None {
                assert_eq!(
                    weights.iter().map(|w| w.to_bits()).collect::<Vec<_>>(),
                    b.csr_vals.iter().map(|w| w.to_bits()).collect::<Vec<_>>()
                );
            }
            let q = b.src_part as usize;
            for i in 0..b.nrows {
                let row = renumbering.part_nodes(p as u32)[i] as usize;
                let span = b.csr_rowptr[i] as usize..b.csr_rowptr[i + 1] as usize;
                for (&c, &w) in b.csr_cols[span.clone()].iter().zip(&weights[span]) {
                    let local = if q == p {
                        c
                    } else {
                        view.halo_recv(q)[c as usize]
                    };
                    let col = renumbering.part_nodes(q as u32)[local as usize] as usize;
                    let want = a[row * n + col];
                    let got = f64::from(w);
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "part {p}, entry ({row}, {col}): weight {got}, A has {want}"
                    );
                    if want != 0.0 {
                        stored_nonzeros += 1;
                    }
                    assert!(want != 0.0 || row == col, "({row}, {col}) is not in A");
                }
            }
        }
    }
    assert_eq!(stored_nonzeros, a.iter().filter(|&&x| x != 0.0).count());
}

#[test]
fn chunks_without_edge_weights_are_format_1_0_and_the_count_is_checked() {
    let g = Graph::from_edges(4, std::vec![0, 1, 2, 3], std::vec![1, 2, 3, 0]);
    let part = Partition::new(2, std::vec![0, 0, 1, 1], "x").unwrap();
    let norm = crate::normalize::Normalization::Gcn;
    let (a_hat, weights) =
        crate::normalize::adjacency_with_weights(4, &g.src, &g.dst, None, norm).unwrap();
    // A ring: every weight 1 but the four added loops.
    assert_eq!(weights.len(), a_hat.nnz());
    assert_eq!(weights.iter().filter(|&&w| w == 0.0).count(), 4);
    let plain = ChunkBuilder::new(&g, a_hat.view(), &part).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let manifest =
        write_chunk_dir(&tmp.path().join("plain"), &plain, &WriteOptions::default()).unwrap();
    assert_eq!(manifest.chunk_format_version, "1.0");
    let dir = ChunkDir::open(tmp.path().join("plain")).unwrap();
    dir.validate_all().unwrap();
    let bufs = encode_all(&plain);
    for buf in &bufs {
        let view = ChunkView::parse(buf.as_bytes()).unwrap();
        assert_eq!(view.header().version.to_string(), "1.0");
        assert!(view.edge_weights().is_none());
    }
    let weighted = ChunkBuilder::new(&g, a_hat.view(), &part)
        .unwrap()
        .with_edge_weights(&weights)
        .unwrap();
    let manifest = write_chunk_dir(
        &tmp.path().join("weighted"),
        &weighted,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(manifest.chunk_format_version, "1.1");
    ChunkDir::open(tmp.path().join("weighted"))
        .unwrap()
        .validate_all()
        .unwrap();
    match ChunkBuilder::new(&g, a_hat.view(), &part)
        .unwrap()
        .with_edge_weights(&weights[1..])
    {
        Err(ChunkBuildError::Mismatch(m)) => assert!(m.contains("edge weights"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bounded_directory_matches_the_in_memory_one() {
    let tmp = tempfile::tempdir().unwrap();
    let edges: Vec<(u32, u32, u8)> = ring(30)
        .into_iter()
        .chain([(3, 3), (3, 3), (7, 9), (7, 9)])
        .enumerate()
        .map(|(k, (u, v))| (u, v, (k % 11) as u8))
        .collect();
    let g = weighted_graph(32, &edges, true, 4);
    let adj = Adjacency::from_edges(32, &g.src, &g.dst).unwrap();
    let part = partition(&adj, 4, &Method::Metis(MetisOptions::default())).unwrap();
    let norm = crate::normalize::Normalization::Gcn;
    let (a_hat, weights) =
        crate::normalize::adjacency_with_weights(32, &g.src, &g.dst, g.weights.as_deref(), norm)
            .unwrap();
    let options = WriteOptions {
        edge_cut: Some(part.edge_cut(&adj).unwrap()),
        ..WriteOptions::default()
    };
    let mem_dir = tmp.path().join("mem");
    let mem = write_chunk_dir(
        &mem_dir,
        &ChunkBuilder::new(&g, a_hat.view(), &part)
            .unwrap()
            .with_edge_weights(&weights)
            .unwrap(),
        &options,
    )
    .unwrap();
    let out = tmp.path().join("bounded");
    let lock = std::sync::Arc::new(DirLock::acquire(&out).unwrap());
    // A work directory a killed run left is removed.
    let stale = tmp.path().join(".bounded.buckets-4000000000");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("bucket-00000"), b"old").unwrap();
    let buckets =
        EdgeBuckets::write(&lock, &part, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap();
    assert!(!stale.exists());
    let builder = BoundedBuilder::new(&g, &part, buckets).unwrap();
    let options = WriteOptions {
        lock: Some(lock),
        ..options
    };
    let bounded = write_chunk_dir(&out, &builder, &options).unwrap();
    assert_eq!(bounded.nnz, mem.nnz);
    assert_eq!(bounded.edges, mem.edges);
    assert_eq!(bounded.chunks, mem.chunks);
    assert_eq!(bounded.halo_rows, mem.halo_rows);
    assert_eq!(bounded.chunk_format_version, "1.1");
    assert_eq!(mem.chunk_format_version, "1.1");
    ChunkDir::open(&out).unwrap().validate_all().unwrap();
    drop(builder);
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n.contains("buckets")), "{names:?}");

    // Without the edge cut the bounded builder says what to give.
    let lock = DirLock::acquire(&tmp.path().join("again")).unwrap();
    let buckets =
        EdgeBuckets::write(&lock, &part, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap();
    drop(lock);
    let builder = BoundedBuilder::new(&g, &part, buckets).unwrap();
    let err = write_chunk_dir(
        &tmp.path().join("again"),
        &builder,
        &WriteOptions::default(),
    )
    .unwrap_err();
    assert!(std::format!("{err}").contains("edge_cut"), "{err}");
}

#[test]
fn bounded_builder_reports_normalisation_errors_as_normalize_does() {
    let tmp = tempfile::tempdir().unwrap();
    let big = 3e38f32;
    // Overflowing duplicates in both parts: the first in row order is named (row 1, in part 1,
    // before row 2, in part 0).
    let mut g = Graph::from_edges(4, std::vec![0, 0, 3, 3], std::vec![2, 2, 1, 1]);
    g.weights = Some(std::vec![big, big, big, big]);
    let part = Partition::new(2, std::vec![0, 1, 0, 1], "x").unwrap();
    let norm = crate::normalize::Normalization::Gcn;
    let want =
        crate::normalize::adjacency(4, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap_err();
    let lock = DirLock::acquire(&tmp.path().join("out")).unwrap();
    let buckets =
        EdgeBuckets::write(&lock, &part, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap();
    assert_eq!(
        normalize_error(BoundedBuilder::new(&g, &part, buckets)),
        Some(want.clone())
    );
    // A negative degree.
    g.weights = Some(std::vec![1.0, 1.0, -5.0, 1.0]);
    let want =
        crate::normalize::adjacency(4, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap_err();
    let buckets =
        EdgeBuckets::write(&lock, &part, &g.src, &g.dst, g.weights.as_deref(), norm).unwrap();
    assert_eq!(
        normalize_error(BoundedBuilder::new(&g, &part, buckets)),
        Some(want.clone())
    );
    // Bad edges: found before anything is written.
    let bad = EdgeBuckets::write(&lock, &part, &[0, 9], &[1, 2], None, norm);
    assert!(normalize_error(bad).is_some());
}

/// The normalisation error a builder's result carries, if that is what it is.
fn normalize_error<T>(
    result: Result<T, ChunkDirError>,
) -> Option<crate::normalize::NormalizeError> {
    match result {
        Err(ChunkDirError::Build(e)) => e.downcast().ok().map(|e| *e),
        _ => None,
    }
}
