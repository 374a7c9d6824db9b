//! Reader and encoder tests: round trips against a dense reference, exhaustive corruption,
//! hostile headers and tables, broken invariants, forward compatibility.
#![allow(
    clippy::cast_possible_truncation,
    reason = "tests over small fixtures: every offset, count and id is far below u32::MAX"
)]

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use crate::contents::{Piece, Plan, PlannedSection};
use crate::layout::*;
use crate::testing::{
    build, dense_from_view, params_strategy, small_full_chunk, small_multi_label_chunk, OwnedChunk,
};
use crate::*;

fn encode_ok(chunk: &OwnedChunk) -> AlignedBuf {
    encode(&chunk.contents()).expect("generated contents are valid")
}

/// Recomputes every in-bounds section checksum and the file checksum, so a test can change a
/// field and reach the checks behind the checksums.
fn reseal(bytes: &mut [u8]) {
    let table_off = read_u64(bytes, H_SECTION_TABLE_OFFSET) as usize;
    let count = read_u32(bytes, H_SECTION_COUNT) as usize;
    let table = table_off
        .checked_add(count * SECTION_ENTRY_LEN)
        .filter(|&end| end <= bytes.len())
        .map(|end| table_off..end);
    for e in table.clone().unwrap_or(0..0).step_by(SECTION_ENTRY_LEN) {
        let off = read_u64(bytes, e + E_OFFSET) as usize;
        let len = read_u64(bytes, e + E_BYTE_LEN) as usize;
        if let Some(data) = off.checked_add(len).and_then(|end| bytes.get(off..end)) {
            let c = xxhash_rust::xxh3::xxh3_64(data);
            set_u64(bytes, e + E_CHECKSUM, c);
        }
    }
    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(&bytes[..HEADER_LEN]);
    let c = file_checksum(&header, table.map_or(&[][..], |t| &bytes[t]));
    set_u64(bytes, H_FILE_CHECKSUM, c);
}

/// A named corruption of an encoded chunk.
type Edit = fn(&mut [u8]);

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn set_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Byte offset of the table entry of `kind` in an encoded chunk.
fn entry_at(bytes: &[u8], kind: SectionKind) -> usize {
    let table_off = read_u64(bytes, H_SECTION_TABLE_OFFSET) as usize;
    let count = read_u32(bytes, H_SECTION_COUNT) as usize;
    (0..count)
        .map(|i| table_off + i * SECTION_ENTRY_LEN)
        .find(|&e| read_u32(bytes, e + E_KIND) == kind.0)
        .expect("section present")
}

/// Applies `edit` to a copy of the small chunk, reseals it, and parses it.
fn parse_edited(edit: impl FnOnce(&mut [u8])) -> Result<(), ChunkError> {
    let mut buf = encode_ok(&small_full_chunk());
    edit(buf.as_bytes_mut());
    reseal(buf.as_bytes_mut());
    ChunkView::parse(buf.as_bytes()).map(|_| ())
}

fn assert_round_trip(chunk: &OwnedChunk) {
    let contents = chunk.contents();
    let buf = encode(&contents).unwrap();
    let view = ChunkView::parse(buf.as_bytes()).unwrap();
    assert_eq!(view.contents(), contents);
    let h = view.header();
    let weighted = chunk.blocks.iter().any(|b| b.edge_weights.is_some());
    let minor = match (chunk.targets.is_some(), weighted) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 0,
    };
    assert_eq!(h.version, Version { major: 1, minor });
    assert_eq!(view.targets(), chunk.targets.as_deref());
    assert_eq!(view.labels(), chunk.labels.as_deref());
    assert_eq!(h.version, contents.version());
    assert_eq!(view.edge_weights().is_some(), weighted);
    for (b, owned) in view.blocks().zip(&chunk.blocks) {
        assert_eq!(b.edge_weights, owned.edge_weights.as_deref());
    }
    let flat: Vec<f32> = chunk
        .blocks
        .iter()
        .filter_map(|b| b.edge_weights.clone())
        .flatten()
        .collect();
    assert_eq!(view.edge_weights().unwrap_or(&[]), flat.as_slice());
    assert_eq!(h.num_parts as usize + 1, chunk.part_offsets.len());
    assert_eq!(h.num_local_nodes as usize, chunk.n_p());
    assert_eq!(h.num_halo_rows as usize, chunk.halo_recv.len());
    assert_eq!(h.fingerprint, chunk.fingerprint);
    assert_eq!(h.file_len as usize, buf.len());
    assert_eq!(h.file_len % SECTION_ALIGN as u64, 0);
    let (from_csr, from_csc) = dense_from_view(&view);
    assert_eq!(from_csr, chunk.dense);
    assert_eq!(from_csc, chunk.dense);
    for q in 0..view.num_parts() {
        let range = chunk.halo_send_offsets[q] as usize..chunk.halo_send_offsets[q + 1] as usize;
        assert_eq!(view.halo_send(q), &chunk.halo_send[range]);
    }
    assert_eq!(view.diagonal_block().src_part, chunk.part_id);
    // Re-encoding what was read gives the same bytes.
    assert_eq!(encode(&view.contents()).unwrap().as_bytes(), buf.as_bytes());
}

proptest! {
    // Miri interprets every step; a few cases still cover the casts and bounds of the reader.
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 96 }))]

    #[test]
    fn random_chunks_round_trip_and_match_the_dense_reference(params in params_strategy()) {
        assert_round_trip(&build(&params));
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_header_never_panic(
        params in params_strategy(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        seal in any::<bool>(),
    ) {
        let mut buf = encode_ok(&build(&params));
        let len = buf.len();
        for (i, v) in edits {
            buf.as_bytes_mut()[i.index(len)] = v;
        }
        if seal {
            reseal(buf.as_bytes_mut());
        }
        // Either outcome is fine; a successful parse must hand out consistent views.
        if let Ok(view) = ChunkView::parse(buf.as_bytes()) {
            let _ = dense_from_view(&view);
        }
    }
}

#[test]
fn empty_and_single_part_chunks_round_trip() {
    for (sizes, part) in [
        (vec![0], 0),
        (vec![5], 0),
        (vec![0, 3], 0),
        (vec![3, 0, 2], 1),
    ] {
        for density_percent in [0, 50] {
            assert_round_trip(&build(&testing::ChunkParams {
                seed: 3,
                part_sizes: sizes.clone(),
                part_id: part,
                density_percent,
                feature_dim: 0,
                // Empty parts with multi-label targets too.
                num_classes: if density_percent > 0 { 2 } else { 0 },
                masks: false,
                edge_weights: density_percent > 0,
                multi_label: density_percent > 0,
            }));
        }
    }
}

/// Every byte natively; every 61st under Miri (which interprets each parse step by step).
const MIRI_STRIDE: usize = if cfg!(miri) { 61 } else { 1 };

#[test]
fn every_single_byte_flip_is_rejected() {
    let buf = encode_ok(&small_full_chunk());
    let bytes = buf.as_bytes();
    let mut copy = AlignedBuf::from_bytes(bytes);
    for i in (0..bytes.len()).step_by(MIRI_STRIDE) {
        for flip in [0x01u8, 0x80, 0xff] {
            copy.as_bytes_mut()[i] ^= flip;
            assert!(
                ChunkView::parse(copy.as_bytes()).is_err(),
                "flipping byte {i} with {flip:#x} was not detected"
            );
            copy.as_bytes_mut()[i] ^= flip;
        }
    }
    assert!(ChunkView::parse(copy.as_bytes()).is_ok());
}

#[test]
fn every_truncation_and_extension_is_rejected() {
    let buf = encode_ok(&small_full_chunk());
    let bytes = buf.as_bytes();
    for len in (0..bytes.len()).step_by(MIRI_STRIDE) {
        let cut = AlignedBuf::from_bytes(&bytes[..len]);
        let err = ChunkView::parse(cut.as_bytes()).unwrap_err();
        if len < HEADER_LEN {
            assert_eq!(err, ChunkError::TooShort { len });
        } else {
            assert!(matches!(err, ChunkError::LengthMismatch { .. }), "{err}");
        }
    }
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(&[0; 64]);
    let longer = AlignedBuf::from_bytes(&longer);
    assert!(matches!(
        ChunkView::parse(longer.as_bytes()),
        Err(ChunkError::LengthMismatch { .. })
    ));
}

#[test]
fn checksums_and_transpose_check_can_be_skipped_but_structure_cannot() {
    let mut buf = encode_ok(&small_full_chunk());
    let e = entry_at(buf.as_bytes(), SectionKind::FEATURES);
    let off = read_u64(buf.as_bytes(), e + E_OFFSET) as usize;
    buf.as_bytes_mut()[off] ^= 0x10;
    let skip = ParseOptions::STRUCTURE_ONLY;
    assert!(ChunkView::parse_with(buf.as_bytes(), &skip).is_ok());
    assert!(matches!(
        ChunkView::parse(buf.as_bytes()),
        Err(ChunkError::SectionChecksum {
            section: SectionKind::FEATURES,
            ..
        })
    ));
    // A CSC value that differs from the CSR passes only without the transpose check.
    let mut other = encode_ok(&small_full_chunk());
    let e = entry_at(other.as_bytes(), SectionKind::CSC_VALS);
    let off = read_u64(other.as_bytes(), e + E_OFFSET) as usize;
    other.as_bytes_mut()[off] ^= 0x01;
    reseal(other.as_bytes_mut());
    assert!(ChunkView::parse_with(other.as_bytes(), &skip).is_ok());
    let only_transpose = ParseOptions {
        verify_section_checksums: false,
        ..ParseOptions::FULL
    };
    assert!(matches!(
        ChunkView::parse_with(other.as_bytes(), &only_transpose),
        Err(ChunkError::Section {
            section: SectionKind::CSC_VALS,
            ..
        })
    ));
    // A structural break is caught even without checksums.
    let e = entry_at(buf.as_bytes(), SectionKind::MASKS);
    let off = read_u64(buf.as_bytes(), e + E_OFFSET) as usize;
    buf.as_bytes_mut()[off] = 0x80;
    assert!(matches!(
        ChunkView::parse_with(buf.as_bytes(), &skip),
        Err(ChunkError::Section {
            section: SectionKind::MASKS,
            ..
        })
    ));
}

#[test]
fn buffer_problems_are_named() {
    let buf = encode_ok(&small_full_chunk());
    let mut shifted = vec![0u8; buf.len() + 1];
    shifted[1..].copy_from_slice(buf.as_bytes());
    let aligned = AlignedBuf::from_bytes(&shifted);
    assert_eq!(
        ChunkView::parse(&aligned.as_bytes()[1..]).unwrap_err(),
        ChunkError::MisalignedBuffer
    );
    let mut bad = AlignedBuf::from_bytes(buf.as_bytes());
    bad.as_bytes_mut()[0] = b'P';
    assert!(matches!(
        ChunkView::parse(bad.as_bytes()),
        Err(ChunkError::BadMagic { .. })
    ));
}

#[test]
fn hostile_headers_are_rejected_without_allocating() {
    let cases: Vec<(&str, Edit)> = vec![
        ("section_count", |b| set_u32(b, H_SECTION_COUNT, u32::MAX)),
        ("table past end", |b| {
            set_u64(b, H_SECTION_TABLE_OFFSET, u64::MAX - 63)
        }),
        ("table overlaps header", |b| {
            set_u64(b, H_SECTION_TABLE_OFFSET, 64)
        }),
        ("table misaligned", |b| {
            set_u64(b, H_SECTION_TABLE_OFFSET, 136)
        }),
        ("num_local_nodes", |b| {
            set_u64(b, H_NUM_LOCAL_NODES, 1 << 40)
        }),
        ("num_local_nodes fits u32", |b| {
            set_u64(b, H_NUM_LOCAL_NODES, u64::from(u32::MAX))
        }),
        ("nnz", |b| set_u64(b, H_NNZ, u64::MAX)),
        ("num_halo_rows", |b| set_u64(b, H_NUM_HALO_ROWS, u64::MAX)),
        ("num_global_nodes", |b| {
            set_u64(b, H_NUM_GLOBAL_NODES, u64::MAX)
        }),
        ("feature_dim", |b| set_u32(b, H_FEATURE_DIM, u32::MAX)),
        ("num_classes 0 with labels", |b| {
            set_u32(b, H_NUM_CLASSES, 0)
        }),
        ("num_parts 0", |b| set_u32(b, H_NUM_PARTS, 0)),
        ("num_parts huge", |b| set_u32(b, H_NUM_PARTS, u32::MAX)),
        ("part_id", |b| set_u32(b, H_PART_ID, 3)),
        ("value_dtype", |b| b[H_VALUE_DTYPE] = 2),
        ("index_width", |b| b[H_INDEX_WIDTH] = 8),
        ("reserved", |b| b[H_RESERVED1] = 1),
    ];
    for (name, edit) in cases {
        let err = parse_edited(edit).expect_err(name);
        assert!(
            !matches!(err, ChunkError::FileChecksum { .. }),
            "{name}: resealed file should fail a field check, got {err}"
        );
    }
}

#[test]
fn hostile_section_tables_are_rejected() {
    const K: SectionKind = SectionKind::CSR_COLS;
    let cases: Vec<(&str, Edit)> = vec![
        ("offset past end", |b| {
            set_u64(b, entry_at(b, K) + E_OFFSET, u64::MAX - 63)
        }),
        ("byte_len huge", |b| {
            set_u64(b, entry_at(b, K) + E_BYTE_LEN, u64::MAX)
        }),
        ("count overflow", |b| {
            let e = entry_at(b, K);
            set_u64(b, e + E_ELEM_COUNT, u64::MAX / 2);
            set_u64(b, e + E_BYTE_LEN, (u64::MAX / 2).wrapping_mul(4));
        }),
        ("misaligned offset", |b| {
            let e = entry_at(b, K);
            set_u64(b, e + E_OFFSET, read_u64(b, e + E_OFFSET) + 8);
        }),
        ("overlap", |b| {
            let off = read_u64(b, entry_at(b, SectionKind::CSR_ROWPTR) + E_OFFSET);
            set_u64(b, entry_at(b, K) + E_OFFSET, off);
        }),
        ("section over the table", |b| {
            set_u64(b, entry_at(b, SectionKind::PART_OFFSETS) + E_OFFSET, 128);
        }),
        ("wrong element type", |b| {
            set_u32(b, entry_at(b, K) + E_ELEM_TYPE, ElemType::F32.code());
        }),
        ("unknown flag", |b| set_u32(b, entry_at(b, K) + E_FLAGS, 2)),
        ("required marked optional", |b| {
            set_u32(b, entry_at(b, K) + E_FLAGS, SECTION_FLAG_OPTIONAL);
        }),
        ("reserved", |b| set_u32(b, entry_at(b, K) + E_RESERVED, 1)),
        ("duplicate kind", |b| {
            set_u32(b, entry_at(b, SectionKind::CSR_VALS) + E_KIND, K.0);
        }),
    ];
    for (name, edit) in cases {
        let err = parse_edited(edit).expect_err(name);
        assert!(
            matches!(err, ChunkError::SectionTable { .. }),
            "{name}: {err}"
        );
    }
}

/// Re-encodes the small chunk after `edit` changes its contents and returns the section the
/// encoder's validation blames. The writer's in-memory check of the same contents (what
/// `write_chunk` runs instead of reading its file back) must give exactly the same error.
fn blamed_section(edit: impl FnOnce(&mut OwnedChunk)) -> SectionKind {
    let mut chunk = small_full_chunk();
    edit(&mut chunk);
    let contents = chunk.contents();
    let plan = Plan::new(&contents);
    let in_memory = plan
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|plan| plan.validate(&contents, true));
    // What a reader says of the same bytes, unchecked by the encoder.
    let parsed = plan.and_then(|plan| {
        let buf = plan.encode_unchecked()?;
        ChunkView::parse(buf.as_bytes()).map(|_| ())
    });
    match (&in_memory, &parsed) {
        // A block of the wrong width: the file's column offsets stop adding up (its layout
        // check) before the in-memory check can name the block; the section is the same.
        (
            Err(ChunkError::Section {
                section: SectionKind::BLOCK_COL_OFFSETS,
                ..
            }),
            Err(ChunkError::Section {
                section: SectionKind::BLOCK_COL_OFFSETS,
                ..
            }),
        ) => {}
        _ => assert_eq!(
            in_memory, parsed,
            "the writer's check and the reader disagree"
        ),
    }
    match parsed {
        Err(ChunkError::Section { section, .. }) => section,
        Err(ChunkError::MissingSection { section }) => section,
        Err(other) => panic!("expected a section error, got {other}"),
        Ok(_) => panic!("invalid contents were encoded"),
    }
}

fn first_nonempty_row(chunk: &OwnedChunk, block: usize, min_len: usize) -> usize {
    let rp = &chunk.blocks[block].csr_rowptr;
    (0..rp.len() - 1)
        .find(|&r| (rp[r + 1] - rp[r]) as usize >= min_len)
        .expect("small chunk has such a row")
}

#[test]
fn broken_invariants_are_named() {
    let diag = |c: &OwnedChunk| {
        c.blocks
            .iter()
            .position(|b| b.src_part == c.part_id)
            .unwrap()
    };
    assert_eq!(
        blamed_section(|c| {
            let d = diag(c);
            let r = first_nonempty_row(c, d, 2);
            let s = c.blocks[d].csr_rowptr[r] as usize;
            c.blocks[d].csr_cols.swap(s, s + 1);
        }),
        SectionKind::CSR_COLS
    );
    assert_eq!(
        blamed_section(|c| {
            let d = diag(c);
            let k = c.blocks[d].csc_vals.len() - 1;
            c.blocks[d].csc_vals[k] += 1.0;
        }),
        SectionKind::CSC_VALS
    );
    assert_eq!(
        blamed_section(|c| {
            let d = diag(c);
            let k = c.blocks[d].csc_rows.len() - 1;
            let r = c.blocks[d].csc_rows[k];
            // Still sorted within its column, but not the CSR's entry.
            let col_start = c.blocks[d].csc_colptr[c.blocks[d].ncols - 1] as usize;
            if k > col_start && c.blocks[d].csc_rows[k - 1] + 1 < r {
                c.blocks[d].csc_rows[k] = r - 1;
            } else {
                c.blocks[d].csc_rows[k] = (r + 1).min(3);
                if c.blocks[d].csc_rows[k] == r {
                    c.blocks[d].csc_rows[k] = 0;
                }
            }
        }),
        SectionKind::CSC_ROWS
    );
    assert_eq!(
        blamed_section(|c| c.labels.as_mut().unwrap()[0] = 3),
        SectionKind::LABELS
    );
    assert_eq!(
        blamed_section(|c| c.labels.as_mut().unwrap()[0] = -2),
        SectionKind::LABELS
    );
    assert_eq!(
        blamed_section(|c| c.masks.as_mut().unwrap()[1] = 0b1000),
        SectionKind::MASKS
    );
    assert_eq!(
        blamed_section(|c| c.original_ids[0] = 9),
        SectionKind::ORIGINAL_IDS
    );
    assert_eq!(
        blamed_section(|c| c.halo_send_offsets[2] += 1),
        SectionKind::HALO_SEND_OFFSETS
    );
    assert_eq!(
        blamed_section(|c| {
            // A send list entry out of range (n_p = 4).
            c.halo_send = vec![0, 1, 4];
            c.halo_send_offsets = vec![0, 3, 3, 3];
        }),
        SectionKind::HALO_SEND
    );
    assert_eq!(
        blamed_section(|c| {
            // Give the chunk's own part a receive range.
            let last = *c.halo_recv_offsets.last().unwrap();
            assert!(last > 0 && c.part_id == 1);
            c.halo_recv_offsets = vec![0, 0, last, last];
        }),
        SectionKind::HALO_RECV_OFFSETS
    );
    assert_eq!(
        blamed_section(|c| {
            let q = c
                .blocks
                .iter()
                .position(|b| b.src_part != c.part_id)
                .unwrap();
            c.blocks.remove(q);
        }),
        SectionKind::HALO_RECV_OFFSETS
    );
    assert_eq!(
        blamed_section(|c| {
            let d = diag(c);
            c.blocks.remove(d);
        }),
        SectionKind::BLOCK_SRC
    );
    assert_eq!(
        blamed_section(|c| c.blocks.swap(0, 1)),
        SectionKind::BLOCK_SRC
    );
    assert_eq!(
        blamed_section(|c| c.features.as_mut().unwrap().pop().map(|_| ()).unwrap()),
        SectionKind::FEATURES
    );
}

/// A weight of some block of the small chunk (the last one with entries).
fn some_weight(c: &mut OwnedChunk) -> &mut f32 {
    c.blocks
        .iter_mut()
        .filter_map(|b| b.edge_weights.as_mut())
        .filter_map(|w| w.last_mut())
        .last()
        .expect("the small chunk has weighted entries")
}

#[test]
fn broken_edge_weights_are_named() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(
            blamed_section(|c| *some_weight(c) = bad),
            SectionKind::EDGE_WEIGHTS
        );
    }
    // One weight too few in a block, and a block without weights beside blocks with them.
    assert_eq!(
        blamed_section(|c| {
            let b = c
                .blocks
                .iter_mut()
                .find(|b| !b.csr_cols.is_empty())
                .unwrap();
            b.edge_weights.as_mut().unwrap().pop();
        }),
        SectionKind::EDGE_WEIGHTS
    );
    assert_eq!(
        blamed_section(|c| c.blocks[1].edge_weights = None),
        SectionKind::EDGE_WEIGHTS
    );
    // In a file: a section whose count is not the header's nnz.
    let buf = encode_plan_edited(|plan| {
        let s = plan
            .sections
            .iter_mut()
            .find(|s| s.kind == SectionKind::EDGE_WEIGHTS)
            .unwrap();
        s.pieces.push(Piece::Owned(1f32.to_le_bytes().to_vec()));
    });
    let err = ChunkView::parse(buf.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            ChunkError::Section {
                section: SectionKind::EDGE_WEIGHTS,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("the header's nnz"), "{err}");
}

#[test]
fn edge_weights_are_optional_and_skipped_by_a_reader_that_does_not_know_them() {
    let weighted = encode_ok(&small_full_chunk());
    let view = ChunkView::parse(weighted.as_bytes()).unwrap();
    assert_eq!(view.header().version, Version { major: 1, minor: 1 });
    let entry = view
        .sections()
        .find(|s| s.kind == SectionKind::EDGE_WEIGHTS)
        .unwrap();
    assert_eq!(entry.flags, SECTION_FLAG_OPTIONAL);
    assert_eq!(entry.elem_count, view.header().nnz);
    let mut without = view.contents();
    for b in &mut without.blocks {
        b.edge_weights = None;
    }

    // A 1.0 reader sees a section of a kind it does not know, marked OPTIONAL: skipped.
    let mut renamed = weighted.clone();
    let at = entry_at(renamed.as_bytes(), SectionKind::EDGE_WEIGHTS);
    set_u32(renamed.as_bytes_mut(), at + E_KIND, 0x40);
    reseal(renamed.as_bytes_mut());
    let old = ChunkView::parse(renamed.as_bytes()).unwrap();
    assert_eq!(old.edge_weights(), None);
    assert_eq!(old.contents(), without);

    // The same chunk without the section is a valid 1.0 file.
    let plain = encode(&without).unwrap();
    let plain = ChunkView::parse(plain.as_bytes()).unwrap();
    assert_eq!(plain.header().version, Version { major: 1, minor: 0 });
    assert_eq!(plain.edge_weights(), None);
    assert!(plain.blocks().all(|b| b.edge_weights.is_none()));
    assert_eq!(plain.sections().len() + 1, view.sections().len());
}

/// [`blamed_section`] for the multi-label chunk: the section the writer and the reader blame.
fn blamed_multi_label_section(edit: impl FnOnce(&mut OwnedChunk)) -> (SectionKind, String) {
    let mut chunk = small_multi_label_chunk();
    edit(&mut chunk);
    let contents = chunk.contents();
    let in_memory = Plan::new(&contents).and_then(|plan| plan.validate(&contents, true));
    let parsed = Plan::new(&contents).and_then(|plan| {
        let buf = plan.encode_unchecked()?;
        ChunkView::parse(buf.as_bytes()).map(|_| ())
    });
    assert_eq!(
        in_memory, parsed,
        "the writer's check and the reader disagree"
    );
    match parsed {
        Err(e @ ChunkError::Section { section, .. }) => (section, e.to_string()),
        Err(e @ ChunkError::Header { .. }) => (SectionKind(0), e.to_string()),
        Err(other) => panic!("expected a section or header error, got {other}"),
        Ok(()) => panic!("invalid contents were encoded"),
    }
}

#[test]
fn multi_label_targets_round_trip_as_format_1_2() {
    let chunk = small_multi_label_chunk();
    assert!(chunk.labels.is_none());
    let targets = chunk.targets.clone().unwrap();
    assert_eq!(targets.len(), chunk.n_p() * 3);
    assert!(targets.chunks(3).any(|r| r == [TARGET_UNLABELLED; 3]));
    assert!(targets.chunks(3).any(|r| r.iter().all(|&t| t <= 1)));
    assert_round_trip(&chunk);
    let buf = encode_ok(&chunk);
    let view = ChunkView::parse(buf.as_bytes()).unwrap();
    assert_eq!(view.header().version, FORMAT_VERSION);
    assert_eq!(view.header().num_classes, 3);
    assert_eq!(view.labels(), None);
    let entry = view
        .sections()
        .find(|s| s.kind == SectionKind::TARGETS)
        .unwrap();
    assert_eq!(
        (entry.flags, entry.elem_type, entry.elem_count),
        (
            SECTION_FLAG_OPTIONAL,
            ElemType::U8.code(),
            targets.len() as u64
        )
    );
    // The last section, after EDGE_WEIGHTS, in the writer's kind order.
    assert_eq!(
        view.sections().last().map(|s| s.kind),
        Some(SectionKind::TARGETS)
    );

    // A 1.1 reader does not know TARGETS: it skips the optional section, then finds classes
    // without LABELS and refuses the chunk rather than misreading it.
    let mut renamed = buf.clone();
    let at = entry_at(renamed.as_bytes(), SectionKind::TARGETS);
    set_u32(renamed.as_bytes_mut(), at + E_KIND, 0x40);
    reseal(renamed.as_bytes_mut());
    let err = ChunkView::parse(renamed.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        ChunkError::Header {
            field: "num_classes",
            detail: "is 3 but there is no LABELS section".into()
        }
    );
}

#[test]
fn broken_multi_label_targets_are_named() {
    // A value other than 0/1 in a labelled row.
    let (kind, msg) = blamed_multi_label_section(|c| {
        let t = c.targets.as_mut().unwrap();
        let r = t.chunks(3).position(|r| r[0] <= 1).unwrap();
        t[r * 3 + 1] = 2;
    });
    assert_eq!(kind, SectionKind::TARGETS);
    assert!(msg.contains("has 2 for class 1"), "{msg}");
    // An unlabelled row with a 0/1 in it.
    let (kind, msg) = blamed_multi_label_section(|c| {
        let t = c.targets.as_mut().unwrap();
        let r = t.chunks(3).position(|r| r[0] == TARGET_UNLABELLED).unwrap();
        t[r * 3 + 2] = 1;
    });
    assert_eq!(kind, SectionKind::TARGETS);
    assert!(
        msg.contains("has 1 for class 2 after 255 for class 0"),
        "{msg}"
    );
    // One byte short, and both sections at once.
    let (kind, msg) = blamed_multi_label_section(|c| {
        c.targets.as_mut().unwrap().pop();
    });
    assert_eq!(kind, SectionKind::TARGETS);
    assert!(msg.contains("num_local_nodes × num_classes"), "{msg}");
    let (kind, msg) = blamed_multi_label_section(|c| c.labels = Some(vec![0; c.n_p()]));
    assert_eq!(kind, SectionKind::TARGETS);
    assert!(msg.contains("not both"), "{msg}");
    // Targets without classes in the header.
    let (kind, msg) = blamed_multi_label_section(|c| c.num_classes = 0);
    assert_eq!(kind, SectionKind::TARGETS);
    assert!(msg.contains("num_classes is 0"), "{msg}");
}

#[test]
fn encoder_checks_block_shapes_and_header_fields() {
    let chunk = small_full_chunk();
    let mut contents = chunk.contents();
    contents.blocks[0].nrows += 1;
    assert!(matches!(
        encode(&contents),
        Err(ChunkError::Section {
            section: SectionKind::CSR_ROWPTR,
            ..
        })
    ));
    let mut contents = chunk.contents();
    contents.blocks[0].ncols += 1;
    assert!(encode(&contents).is_err());
    let mut contents = chunk.contents();
    contents.part_id = 3;
    assert!(matches!(
        encode(&contents),
        Err(ChunkError::Header {
            field: "part_id",
            ..
        })
    ));
    let mut contents = chunk.contents();
    contents.part_offsets = &[];
    assert!(matches!(
        encode(&contents),
        Err(ChunkError::Header {
            field: "num_parts",
            ..
        })
    ));
    let mut contents = chunk.contents();
    contents.features = None;
    assert!(matches!(
        encode(&contents),
        Err(ChunkError::Header {
            field: "feature_dim",
            ..
        })
    ));
}

/// Encodes the small chunk after `edit` changes its plan (sections or header), unvalidated.
fn encode_plan_edited(edit: impl FnOnce(&mut Plan<'_>)) -> AlignedBuf {
    let chunk = small_full_chunk();
    let contents = chunk.contents();
    let mut plan = Plan::new(&contents).unwrap();
    edit(&mut plan);
    plan.layout().unwrap();
    plan.encode_unchecked().unwrap()
}

#[test]
fn newer_minor_is_accepted_and_newer_or_older_major_rejected() {
    let buf = encode_plan_edited(|plan| plan.header.version.minor = 7);
    let view = ChunkView::parse(buf.as_bytes()).unwrap();
    assert_eq!(view.header().version, Version { major: 1, minor: 7 });
    for major in [0, 2] {
        let buf = encode_plan_edited(|plan| plan.header.version.major = major);
        assert_eq!(
            ChunkView::parse(buf.as_bytes()).unwrap_err(),
            ChunkError::UnsupportedVersion {
                found: Version { major, minor: 1 },
                supported_major: 1
            }
        );
    }
}

#[test]
fn unknown_optional_sections_are_skipped_and_unknown_required_rejected() {
    let extra: Vec<u8> = (0..100u8).collect();
    let plain = encode_ok(&small_full_chunk());
    let plain = ChunkView::parse(plain.as_bytes()).unwrap();
    for position in [0, 5, 18] {
        let buf = encode_plan_edited(|plan| {
            plan.header.version.minor = 1;
            plan.sections.insert(
                position,
                PlannedSection::new(SectionKind(0x40), vec![Piece::Owned(extra.clone())]),
            );
        });
        let view = ChunkView::parse(buf.as_bytes()).unwrap();
        assert_eq!(view.contents(), plain.contents());
        let unknown: Vec<SectionEntry> = view.sections().filter(|s| !s.kind.is_known()).collect();
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].byte_len, 100);

        let buf = encode_plan_edited(|plan| {
            let mut s = PlannedSection::new(SectionKind(0x40), vec![Piece::Owned(extra.clone())]);
            s.flags = 0;
            plan.sections.insert(position, s);
        });
        let err = ChunkView::parse(buf.as_bytes()).unwrap_err();
        assert!(
            matches!(err, ChunkError::SectionTable { .. }) && err.to_string().contains("0x40"),
            "{err}"
        );
    }
}

#[test]
fn missing_required_sections_are_named() {
    for kind in [
        SectionKind::PART_OFFSETS,
        SectionKind::CSC_VALS,
        SectionKind::ORIGINAL_IDS,
    ] {
        let buf = encode_plan_edited(|plan| plan.sections.retain(|s| s.kind != kind));
        assert_eq!(
            ChunkView::parse(buf.as_bytes()).unwrap_err(),
            ChunkError::MissingSection { section: kind }
        );
    }
}

#[test]
fn table_may_sit_after_the_sections() {
    // The reader follows section_table_offset wherever it points; move the table to the end.
    let buf = encode_ok(&small_full_chunk());
    let bytes = buf.as_bytes();
    let count = read_u32(bytes, H_SECTION_COUNT) as usize;
    let table_len = count * SECTION_ENTRY_LEN;
    let mut moved = bytes.to_vec();
    let table: Vec<u8> = bytes[HEADER_LEN..HEADER_LEN + table_len].to_vec();
    moved[HEADER_LEN..HEADER_LEN + table_len].fill(0);
    let new_off = moved.len();
    moved.extend_from_slice(&table);
    moved.resize(new_off + table_len.div_ceil(64) * 64, 0);
    let len = moved.len() as u64;
    set_u64(&mut moved, H_SECTION_TABLE_OFFSET, new_off as u64);
    set_u64(&mut moved, H_FILE_LEN, len);
    reseal(&mut moved);
    let moved = AlignedBuf::from_bytes(&moved);
    let view = ChunkView::parse(moved.as_bytes()).unwrap();
    assert_eq!(view.contents(), ChunkView::parse(bytes).unwrap().contents());
}

/// The fuzz seeds (`fuzz/seeds/chunk_reader/`) are valid chunks of the current format; with
/// `UPDATE_FUZZ_SEEDS=1` they are regenerated from the generator.
#[cfg(feature = "std")]
#[test]
fn fuzz_seeds_are_valid_chunks() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/chunk_reader");
    if std::env::var_os("UPDATE_FUZZ_SEEDS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(&dir).unwrap();
        let seeds = [
            ("three-parts-all-sections", small_full_chunk()),
            ("three-parts-multi-label", small_multi_label_chunk()),
            (
                "one-part",
                build(&testing::ChunkParams {
                    seed: 11,
                    part_sizes: vec![4],
                    part_id: 0,
                    density_percent: 50,
                    feature_dim: 1,
                    num_classes: 2,
                    masks: true,
                    edge_weights: false,
                    multi_label: false,
                }),
            ),
            (
                "four-parts-no-node-data",
                build(&testing::ChunkParams {
                    seed: 12,
                    part_sizes: vec![2, 3, 1, 2],
                    part_id: 2,
                    density_percent: 45,
                    feature_dim: 0,
                    num_classes: 0,
                    masks: false,
                    edge_weights: false,
                    multi_label: false,
                }),
            ),
        ];
        for (name, chunk) in seeds {
            std::fs::write(dir.join(name), encode_ok(&chunk).as_bytes()).unwrap();
        }
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return; // Packaged without the fuzz directory.
    };
    let mut seen = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let bytes = AlignedBuf::from_bytes(&std::fs::read(&path).unwrap());
        ChunkView::parse(bytes.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seen += 1;
    }
    assert!(seen >= 4, "expected at least 4 seeds in {}", dir.display());
}
