//! Golden test vectors: small chunks built by hand must encode to the committed fixture bytes,
//! and each fixture must decode to its hand-written contents. An accidental format change fails
//! here. Three fixtures: `small-v1.chunk` (format 1.0: no edge weights),
//! `small-v1.1-edge-weights.chunk` (the same chunk with its `EDGE_WEIGHTS`, format 1.1) and
//! `small-v1.2-targets.chunk` (that chunk with multi-label `TARGETS` instead of `LABELS`,
//! format 1.2). After an intended change (and a version bump), regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p chunk-format --test golden`.

use std::path::PathBuf;
use std::sync::Once;

use chunk_format::{
    encode_to_vec, AlignedBuf, BlockView, ChunkContents, ChunkView, SectionKind, Version,
    FORMAT_VERSION, HEADER_LEN, SECTION_ENTRY_LEN, SECTION_FLAG_OPTIONAL, TARGET_UNLABELLED,
};

/// One committed fixture: its file and whether its blocks carry edge weights.
#[derive(Clone, Copy, Debug)]
enum Fixture {
    /// Format 1.0, 18 sections.
    V1_0,
    /// Format 1.1: the 18 sections plus `EDGE_WEIGHTS`.
    EdgeWeights,
    /// Format 1.2: as `EdgeWeights`, with `TARGETS` in place of `LABELS`.
    Targets,
}

impl Fixture {
    fn path(self) -> PathBuf {
        let name = match self {
            Fixture::V1_0 => "small-v1.chunk",
            Fixture::EdgeWeights => "small-v1.1-edge-weights.chunk",
            Fixture::Targets => "small-v1.2-targets.chunk",
        };
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name)
    }

    fn weighted(self) -> bool {
        matches!(self, Fixture::EdgeWeights | Fixture::Targets)
    }

    fn multi_label(self) -> bool {
        matches!(self, Fixture::Targets)
    }

    fn version(self) -> Version {
        match self {
            Fixture::V1_0 => Version { major: 1, minor: 0 },
            Fixture::EdgeWeights => Version { major: 1, minor: 1 },
            Fixture::Targets => Version { major: 1, minor: 2 },
        }
    }

    /// The section kinds, in the writer's order.
    fn kinds(self) -> Vec<u32> {
        let mut kinds: Vec<u32> = (1..=18).collect();
        if self.weighted() {
            kinds.push(SectionKind::EDGE_WEIGHTS.0);
        }
        if self.multi_label() {
            kinds.retain(|&k| k != SectionKind::LABELS.0);
            kinds.push(SectionKind::TARGETS.0);
        }
        kinds
    }

    /// The fixture's bytes; with `UPDATE_GOLDEN=1` it is first rewritten (once per process and
    /// fixture, before any test reads it).
    fn bytes(self) -> AlignedBuf {
        static UPDATE: [Once; 3] = [Once::new(), Once::new(), Once::new()];
        let path = self.path();
        if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
            UPDATE[self as usize].call_once(|| {
                std::fs::write(&path, encode_to_vec(&contents(self)).unwrap()).unwrap();
            });
        }
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {} ({e}); generate it with UPDATE_GOLDEN=1",
                path.display()
            )
        });
        AlignedBuf::from_bytes(&bytes)
    }
}

// P = 3 parts of sizes 2, 3, 2; this is part 1 (global nodes 2, 3, 4). Its rows of Â:
//   row 0 (node 2): node 0 → 0.5, node 2 → 1.0, node 3 → 0.25
//   row 1 (node 3): node 3 → 2.0, node 6 → -1.5
//   row 2 (node 4): node 1 → 0.75, node 4 → 3.0, node 6 → 0.125
// Received: from part 0 its nodes 0 and 1, from part 2 its node 1 (global 6).
// The weights of the same entries in A (second fixture):
//   row 0: node 0 → 1, node 2 → 0 (a loop the normalisation added), node 3 → 1
//   row 1: node 3 → 2 (an input self loop), node 6 → 1
//   row 2: node 1 → 2 (a duplicated edge), node 4 → 0 (added), node 6 → 0.5
const PART_OFFSETS: [u64; 4] = [0, 2, 5, 7];
const RECV_OFFSETS: [u64; 4] = [0, 2, 2, 3];
const RECV: [u32; 3] = [0, 1, 1];
const SEND_OFFSETS: [u64; 4] = [0, 2, 2, 3];
const SEND: [u32; 3] = [0, 2, 1];
const FEATURES: [f32; 6] = [1.5, -2.0, 0.0, 4.25, -0.5, 8.0];
const LABELS: [i32; 3] = [2, -1, 0];
/// The multi-label fixture's targets: three classes per row, the second row unlabelled.
const TARGETS: [u8; 9] = [
    1,
    0,
    1,
    TARGET_UNLABELLED,
    TARGET_UNLABELLED,
    TARGET_UNLABELLED,
    0,
    0,
    1,
];
const MASKS: [u8; 3] = [0b001, 0b010, 0b100];
const ORIGINAL_IDS: [u64; 3] = [6, 0, 3];
const FINGERPRINT: [u8; 16] = *b"golden-chunk-v1!";
/// Edge weights per block, in CSR order.
const WEIGHTS: [&[f32]; 3] = [&[1.0, 2.0], &[0.0, 1.0, 2.0, 0.0], &[1.0, 0.5]];

fn blocks(fixture: Fixture) -> Vec<BlockView<'static>> {
    let weights = |b: usize| fixture.weighted().then_some(WEIGHTS[b]);
    vec![
        BlockView {
            src_part: 0,
            nrows: 3,
            ncols: 2,
            csr_rowptr: &[0, 1, 1, 2],
            csr_cols: &[0, 1],
            csr_vals: &[0.5, 0.75],
            csc_colptr: &[0, 1, 2],
            csc_rows: &[0, 2],
            csc_vals: &[0.5, 0.75],
            edge_weights: weights(0),
        },
        BlockView {
            src_part: 1,
            nrows: 3,
            ncols: 3,
            csr_rowptr: &[0, 2, 3, 4],
            csr_cols: &[0, 1, 1, 2],
            csr_vals: &[1.0, 0.25, 2.0, 3.0],
            csc_colptr: &[0, 1, 3, 4],
            csc_rows: &[0, 0, 1, 2],
            csc_vals: &[1.0, 0.25, 2.0, 3.0],
            edge_weights: weights(1),
        },
        BlockView {
            src_part: 2,
            nrows: 3,
            ncols: 1,
            csr_rowptr: &[0, 0, 1, 2],
            csr_cols: &[0, 0],
            csr_vals: &[-1.5, 0.125],
            csc_colptr: &[0, 2],
            csc_rows: &[1, 2],
            csc_vals: &[-1.5, 0.125],
            edge_weights: weights(2),
        },
    ]
}

fn contents(fixture: Fixture) -> ChunkContents<'static> {
    ChunkContents {
        part_id: 1,
        fingerprint: FINGERPRINT,
        part_offsets: &PART_OFFSETS,
        blocks: blocks(fixture),
        halo_recv_offsets: &RECV_OFFSETS,
        halo_recv: &RECV,
        halo_send_offsets: &SEND_OFFSETS,
        halo_send: &SEND,
        feature_dim: 2,
        features: Some(&FEATURES),
        num_classes: 3,
        labels: (!fixture.multi_label()).then_some(&LABELS[..]),
        targets: fixture.multi_label().then_some(&TARGETS[..]),
        masks: Some(&MASKS),
        original_ids: &ORIGINAL_IDS,
    }
}

fn encoder_output_matches(fixture: Fixture) {
    let bytes = encode_to_vec(&contents(fixture)).unwrap();
    let path = fixture.path();
    let committed = fixture.bytes().to_vec();
    assert!(
        committed == bytes,
        "the encoder no longer produces the committed bytes of {}: the chunk format changed. \
         If intended, bump the format version and regenerate with UPDATE_GOLDEN=1",
        path.display()
    );
}

fn decodes_to_the_hand_written_contents(fixture: Fixture) {
    let bytes = fixture.bytes();
    let view = ChunkView::parse(bytes.as_bytes()).unwrap();
    let h = view.header();
    assert_eq!(h.version, fixture.version());
    assert_eq!(
        (
            h.num_parts,
            h.part_id,
            h.num_global_nodes,
            h.num_local_nodes
        ),
        (3, 1, 7, 3)
    );
    assert_eq!(
        (h.num_halo_rows, h.nnz, h.feature_dim, h.num_classes),
        (3, 8, 2, 3)
    );
    assert_eq!(h.fingerprint, FINGERPRINT);
    assert_eq!(h.file_len, bytes.len() as u64);

    let blocks = blocks(fixture);
    assert_eq!(view.part_offsets(), PART_OFFSETS);
    assert_eq!(view.block_sources(), [0, 1, 2]);
    assert_eq!(view.blocks().collect::<Vec<_>>(), blocks);
    assert_eq!(view.diagonal_block(), blocks[1]);
    assert_eq!(view.block_for_source(2), Some(blocks[2]));
    assert_eq!(
        (view.halo_recv(0), view.halo_recv(1), view.halo_recv(2)),
        (&[0u32, 1][..], &[][..], &[1u32][..])
    );
    assert_eq!(
        (view.halo_send(0), view.halo_send(1), view.halo_send(2)),
        (&[0u32, 2][..], &[][..], &[1u32][..])
    );
    assert_eq!(view.features(), Some(&FEATURES[..]));
    assert_eq!(
        view.labels(),
        (!fixture.multi_label()).then_some(&LABELS[..])
    );
    assert_eq!(
        view.targets(),
        fixture.multi_label().then_some(&TARGETS[..])
    );
    assert_eq!(view.masks(), Some(&MASKS[..]));
    assert_eq!(view.original_ids(), ORIGINAL_IDS);
    let all_weights = WEIGHTS.concat();
    assert_eq!(
        view.edge_weights(),
        fixture.weighted().then_some(&all_weights[..])
    );
    assert_eq!(view.contents(), contents(fixture));
}

fn layout_follows_the_spec(fixture: Fixture) {
    let bytes = fixture.bytes();
    let view = ChunkView::parse(bytes.as_bytes()).unwrap();
    let h = view.header();
    // The reference writer: table right after the header, then the sections in kind order,
    // each 64-aligned, the file padded to a multiple of 64.
    let expected = fixture.kinds();
    let count = u32::try_from(expected.len()).unwrap();
    assert_eq!(h.section_table_offset, HEADER_LEN as u64);
    assert_eq!(h.section_count, count);
    let kinds: Vec<u32> = view.sections().map(|s| s.kind.0).collect();
    assert_eq!(kinds, expected);
    let mut expected_offset =
        (HEADER_LEN + count as usize * SECTION_ENTRY_LEN).div_ceil(64) as u64 * 64;
    for s in view.sections() {
        assert_eq!(s.offset, expected_offset, "{}", s.kind);
        expected_offset = (s.offset + s.byte_len).div_ceil(64) * 64;
    }
    assert_eq!(h.file_len, expected_offset);
    let counts: Vec<(SectionKind, u64)> = view.sections().map(|s| (s.kind, s.elem_count)).collect();
    assert_eq!(counts[4], (SectionKind::CSR_ROWPTR, 12));
    assert_eq!(counts[7], (SectionKind::CSC_COLPTR, 9));
    assert_eq!(counts[15], (SectionKind::FEATURES, 6));
    let flags: Vec<u32> = view.sections().map(|s| s.flags).collect();
    if fixture.weighted() {
        let at = kinds.iter().position(|&k| k == SectionKind::EDGE_WEIGHTS.0);
        let at = at.unwrap();
        assert_eq!(counts[at], (SectionKind::EDGE_WEIGHTS, 8));
        assert_eq!(flags[at], SECTION_FLAG_OPTIONAL);
    }
    if fixture.multi_label() {
        let last = counts.len() - 1;
        assert_eq!(counts[last], (SectionKind::TARGETS, 9));
        assert_eq!(flags[last], SECTION_FLAG_OPTIONAL);
    }
}

#[test]
fn encoder_output_matches_the_committed_fixture() {
    encoder_output_matches(Fixture::V1_0);
}

#[test]
fn fixture_decodes_to_the_hand_written_contents() {
    decodes_to_the_hand_written_contents(Fixture::V1_0);
}

#[test]
fn fixture_layout_follows_the_spec() {
    layout_follows_the_spec(Fixture::V1_0);
}

#[test]
fn encoder_output_matches_the_committed_edge_weights_fixture() {
    encoder_output_matches(Fixture::EdgeWeights);
}

#[test]
fn edge_weights_fixture_decodes_to_the_hand_written_contents() {
    decodes_to_the_hand_written_contents(Fixture::EdgeWeights);
}

#[test]
fn edge_weights_fixture_layout_follows_the_spec() {
    layout_follows_the_spec(Fixture::EdgeWeights);
}

#[test]
fn encoder_output_matches_the_committed_targets_fixture() {
    encoder_output_matches(Fixture::Targets);
}

#[test]
fn targets_fixture_decodes_to_the_hand_written_contents() {
    decodes_to_the_hand_written_contents(Fixture::Targets);
}

#[test]
fn targets_fixture_layout_follows_the_spec() {
    layout_follows_the_spec(Fixture::Targets);
    assert_eq!(Fixture::Targets.version(), FORMAT_VERSION);
}
