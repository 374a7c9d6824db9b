//! Feeds arbitrary bytes to `ChunkView::parse`, twice: as given, and with the header/table and
//! section checksums recomputed ("resealed") so that mutations of valid seeds reach the
//! structural checks behind the checksums. On success it touches every accessor, checks the
//! invariants kernels rely on, and re-encodes the contents (what the reader accepts, the writer
//! must accept).
#![no_main]

use chunk_format::{encode, AlignedBuf, ChunkView, HEADER_LEN, SECTION_ENTRY_LEN};
use libfuzzer_sys::fuzz_target;

// Field offsets from docs/chunk-format.md.
const H_SECTION_COUNT: usize = 80;
const H_SECTION_TABLE_OFFSET: usize = 88;
const H_FILE_CHECKSUM: usize = 104;
const E_OFFSET: usize = 16;
const E_BYTE_LEN: usize = 24;
const E_CHECKSUM: usize = 40;

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Recomputes the section checksums and the file checksum where the table is in bounds.
fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_LEN {
        return;
    }
    let count = u32::from_le_bytes(
        bytes[H_SECTION_COUNT..H_SECTION_COUNT + 4]
            .try_into()
            .unwrap(),
    );
    let table_off = read_u64(bytes, H_SECTION_TABLE_OFFSET);
    let Some(table_end) = table_off.checked_add(u64::from(count) * SECTION_ENTRY_LEN as u64) else {
        return;
    };
    if table_end > bytes.len() as u64 {
        return;
    }
    let table = table_off as usize..table_end as usize;
    for e in table.clone().step_by(SECTION_ENTRY_LEN) {
        let (off, len) = (
            read_u64(bytes, e + E_OFFSET),
            read_u64(bytes, e + E_BYTE_LEN),
        );
        if let Some(end) = off
            .checked_add(len)
            .filter(|&end| end <= bytes.len() as u64)
        {
            let c = xxhash_rust::xxh3::xxh3_64(&bytes[off as usize..end as usize]);
            bytes[e + E_CHECKSUM..e + E_CHECKSUM + 8].copy_from_slice(&c.to_le_bytes());
        }
    }
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(&bytes[..HEADER_LEN]);
    header[H_FILE_CHECKSUM..H_FILE_CHECKSUM + 8].fill(0);
    hasher.update(&header);
    hasher.update(&bytes[table]);
    bytes[H_FILE_CHECKSUM..H_FILE_CHECKSUM + 8].copy_from_slice(&hasher.digest().to_le_bytes());
}

fn touch(view: &ChunkView<'_>) {
    let h = view.header();
    let n_p = view.num_local_nodes();
    let parts = view.num_parts();
    assert_eq!(view.part_offsets().len(), parts + 1);
    assert_eq!(view.file_checksum(), h.file_checksum);
    assert_eq!(view.sections().len(), h.section_count as usize);
    let mut nnz = 0usize;
    for b in view.blocks() {
        assert_eq!(b.nrows, n_p);
        assert_eq!(b.csr_rowptr.len(), n_p + 1);
        assert_eq!(b.csc_colptr.len(), b.ncols + 1);
        for r in 0..n_p {
            for k in b.csr_rowptr[r] as usize..b.csr_rowptr[r + 1] as usize {
                assert!((b.csr_cols[k] as usize) < b.ncols);
                let _ = b.csr_vals[k];
            }
        }
        for c in 0..b.ncols {
            for k in b.csc_colptr[c] as usize..b.csc_colptr[c + 1] as usize {
                assert!((b.csc_rows[k] as usize) < n_p);
                let _ = b.csc_vals[k];
            }
        }
        nnz += b.nnz();
    }
    assert_eq!(nnz as u64, h.nnz);
    assert_eq!(view.diagonal_block().src_part as usize, view.part_id());
    let mut halo = 0usize;
    for q in 0..parts {
        let recv = view.halo_recv(q);
        halo += recv.len();
        assert_eq!(
            view.block_for_source(q as u32).is_some(),
            q == view.part_id() || !recv.is_empty()
        );
        assert!(view.halo_send(q).iter().all(|&r| (r as usize) < n_p));
    }
    assert_eq!(halo as u64, h.num_halo_rows);
    assert_eq!(view.original_ids().len(), n_p);
    if let Some(f) = view.features() {
        assert_eq!(f.len(), n_p * h.feature_dim as usize);
    }
    assert!(view.labels().is_none_or(|l| l.len() == n_p));
    assert!(view
        .targets()
        .is_none_or(|t| t.len() == n_p * h.num_classes as usize && view.labels().is_none()));
    assert!(view.masks().is_none_or(|m| m.len() == n_p));
    let reencoded = encode(&view.contents()).expect("contents the reader accepted must encode");
    let again = ChunkView::parse(reencoded.as_bytes()).expect("re-encoded chunk must parse");
    // Bitwise (values may be NaN): encoding is a fixed point after one round.
    let twice = encode(&again.contents()).expect("re-encoded contents must encode");
    assert_eq!(twice.as_bytes(), reencoded.as_bytes());
}

fuzz_target!(|data: &[u8]| {
    let mut buf = AlignedBuf::from_bytes(data);
    if let Ok(view) = ChunkView::parse(buf.as_bytes()) {
        touch(&view);
    }
    reseal(buf.as_bytes_mut());
    if let Ok(view) = ChunkView::parse(buf.as_bytes()) {
        touch(&view);
    }
});
