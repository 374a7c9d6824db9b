//! [`ChunkContents`] (the writer's borrowed input), the layout plan shared by both writers, and
//! the in-memory encoder.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use crate::aligned::AlignedBuf;
use crate::error::ChunkError;
use crate::layout::{
    align_up, file_checksum, ChunkHeader, ElemType, SectionEntry, SectionKind, ValueDtype, Version,
    FORMAT_VERSION, HEADER_LEN, INDEX_WIDTH, SECTION_ENTRY_LEN, SECTION_FLAG_OPTIONAL,
};
use crate::view::{BlockView, ChunkView};

/// Everything one chunk holds, borrowed from the builder (nothing is copied before writing).
/// The meaning of each array is in `docs/design.md` ("Chunk contents") and the rules in
/// `docs/chunk-format.md`; [`encode`] and [`crate::write_chunk`] reject contents that break them.
/// Counts the header stores (P, N, n_p, H, nnz) are derived from the slices.
#[derive(Clone, PartialEq)]
pub struct ChunkContents<'a> {
    /// This chunk's part `p`.
    pub part_id: u32,
    /// Partition-run fingerprint, the same in all chunks of one run.
    pub fingerprint: [u8; 16],
    /// Part offsets `u64[P+1]`.
    pub part_offsets: &'a [u64],
    /// The blocks in strictly increasing order of `src_part`, the diagonal block included.
    /// `nrows` must be `n_p`; `ncols` the compacted column count. Their `edge_weights` are
    /// the `EDGE_WEIGHTS` section: given for every block or for none.
    pub blocks: Vec<BlockView<'a>>,
    /// Offsets of the per-peer receive lists, `u64[P+1]`.
    pub halo_recv_offsets: &'a [u64],
    /// Receive lists, concatenated in peer order.
    pub halo_recv: &'a [u32],
    /// Offsets of the per-peer send lists, `u64[P+1]`.
    pub halo_send_offsets: &'a [u64],
    /// Send lists, concatenated in peer order.
    pub halo_send: &'a [u32],
    /// Feature dimension `F` (0 without features).
    pub feature_dim: u32,
    /// Row-major `n_p × F` features; present iff `feature_dim > 0`.
    pub features: Option<&'a [f32]>,
    /// Number of classes `C` (0 without labels).
    pub num_classes: u32,
    /// Labels, −1 or `< C`: one class per node. With `num_classes > 0` exactly one of
    /// `labels` and `targets` is present.
    pub labels: Option<&'a [i32]>,
    /// Multi-label targets, row-major `n_p × C`: each row all 0/1, or all
    /// [`crate::TARGET_UNLABELLED`] for an unlabelled node (`TARGETS`, format 1.2).
    pub targets: Option<&'a [u8]>,
    /// Masks (bit 0 train, 1 val, 2 test).
    pub masks: Option<&'a [u8]>,
    /// Original node id of each local row.
    pub original_ids: &'a [u64],
}

/// Counts and shapes only, not the arrays.
impl core::fmt::Debug for ChunkContents<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ChunkContents")
            .field("part_id", &self.part_id)
            .field("num_parts", &self.part_offsets.len().saturating_sub(1))
            .field("blocks", &self.blocks)
            .field("halo_recv", &self.halo_recv.len())
            .field("halo_send", &self.halo_send.len())
            .field("feature_dim", &self.feature_dim)
            .field("num_classes", &self.num_classes)
            .field("targets", &self.targets.is_some())
            .field("masks", &self.masks.is_some())
            .finish_non_exhaustive()
    }
}

impl ChunkContents<'_> {
    /// The format version the writer records for these contents: the lowest that defines
    /// every section they fill — 1.2 with multi-label targets (`TARGETS`), else 1.1 when the
    /// blocks carry edge weights (`EDGE_WEIGHTS`), else 1.0, so a chunk without either is byte
    /// for byte a 1.0 file.
    pub fn version(&self) -> Version {
        if self.targets.is_some() {
            FORMAT_VERSION
        } else if self.blocks.iter().any(|b| b.edge_weights.is_some()) {
            Version { major: 1, minor: 1 }
        } else {
            Version { major: 1, minor: 0 }
        }
    }
}

/// Bytes of one section: borrowed from the contents, or small derived arrays the plan owns.
#[derive(Debug)]
pub(crate) enum Piece<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Piece<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Piece::Borrowed(b) => b,
            Piece::Owned(v) => v,
        }
    }
}

/// One section of a planned file.
#[derive(Debug)]
pub(crate) struct PlannedSection<'a> {
    pub(crate) kind: SectionKind,
    pub(crate) flags: u32,
    pub(crate) elem: ElemType,
    pub(crate) pieces: Vec<Piece<'a>>,
    /// Set by [`Plan::layout`].
    pub(crate) offset: u64,
    pub(crate) byte_len: u64,
}

impl<'a> PlannedSection<'a> {
    /// A section with the spec's flags and type; an unknown kind becomes optional opaque bytes.
    pub(crate) fn new(kind: SectionKind, pieces: Vec<Piece<'a>>) -> Self {
        let spec = kind.spec();
        Self {
            kind,
            flags: spec.map_or(SECTION_FLAG_OPTIONAL, SectionKind::expected_flags),
            elem: spec.map_or(ElemType::U8, |s| s.elem),
            pieces,
            offset: 0,
            byte_len: 0,
        }
    }

    /// xxh3-64 of the concatenated pieces.
    pub(crate) fn checksum(&self) -> u64 {
        let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
        for piece in &self.pieces {
            hasher.update(piece.bytes());
        }
        hasher.digest()
    }
}

/// The layout of a file: header fields and where each section goes.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) header: ChunkHeader,
    pub(crate) sections: Vec<PlannedSection<'a>>,
}

fn borrowed<T: bytemuck::NoUninit>(s: &[T]) -> Piece<'_> {
    Piece::Borrowed(bytemuck::cast_slice(s))
}

fn per_block<'a>(
    blocks: &[BlockView<'a>],
    field: impl Fn(&BlockView<'a>) -> &'a [u8],
) -> Vec<Piece<'a>> {
    blocks.iter().map(|b| Piece::Borrowed(field(b))).collect()
}

fn prefix_sums(counts: impl Iterator<Item = usize>) -> Vec<u8> {
    let mut out = vec![0u8; 8];
    let mut total = 0u64;
    for c in counts {
        total = total.saturating_add(c as u64);
        out.extend_from_slice(&total.to_le_bytes());
    }
    out
}

impl<'a> Plan<'a> {
    /// Derives the header and the section list from `contents` and lays them out. Checks only
    /// what the layout itself needs; the full rules are checked by parsing the result.
    pub(crate) fn new(contents: &ChunkContents<'a>) -> Result<Self, ChunkError> {
        let off = contents.part_offsets;
        let parts = off.len().saturating_sub(1);
        let num_parts = u32::try_from(parts).ok().filter(|&p| p > 0).ok_or_else(|| {
            ChunkError::header(
                "num_parts",
                format!("part_offsets has {} entries; it needs num_parts + 1 with 1 <= num_parts < 2^32", off.len()),
            )
        })?;
        let p = contents.part_id as usize;
        if p >= parts {
            return Err(ChunkError::header(
                "part_id",
                format!("{p} is not below num_parts {parts}"),
            ));
        }
        let n_p = off[p + 1].checked_sub(off[p]).ok_or_else(|| {
            ChunkError::section(
                SectionKind::PART_OFFSETS,
                format!("offsets decrease at part {p}"),
            )
        })?;
        let blocks = &contents.blocks;
        for (i, b) in blocks.iter().enumerate() {
            Self::check_block_shape(b, i, n_p)?;
        }
        let weighted = blocks.iter().any(|b| b.edge_weights.is_some());
        if let Some((i, b)) = blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.edge_weights.is_some() != weighted)
        {
            return Err(ChunkError::section(
                SectionKind::EDGE_WEIGHTS,
                format!(
                    "block {i} (source part {}) has no edge weights but another block has; \
                     either every block carries them or none",
                    b.src_part
                ),
            ));
        }
        let nnz = blocks
            .iter()
            .fold(0u64, |acc, b| acc.saturating_add(b.csr_cols.len() as u64));

        let mut sections = vec![
            PlannedSection::new(SectionKind::PART_OFFSETS, vec![borrowed(off)]),
            PlannedSection::new(
                SectionKind::BLOCK_SRC,
                vec![Piece::Owned(
                    blocks
                        .iter()
                        .flat_map(|b| b.src_part.to_le_bytes())
                        .collect(),
                )],
            ),
            PlannedSection::new(
                SectionKind::BLOCK_COL_OFFSETS,
                vec![Piece::Owned(prefix_sums(blocks.iter().map(|b| b.ncols)))],
            ),
            PlannedSection::new(
                SectionKind::BLOCK_NNZ_OFFSETS,
                vec![Piece::Owned(prefix_sums(blocks.iter().map(BlockView::nnz)))],
            ),
            PlannedSection::new(
                SectionKind::CSR_ROWPTR,
                per_block(blocks, |b| bytemuck::cast_slice(b.csr_rowptr)),
            ),
            PlannedSection::new(
                SectionKind::CSR_COLS,
                per_block(blocks, |b| bytemuck::cast_slice(b.csr_cols)),
            ),
            PlannedSection::new(
                SectionKind::CSR_VALS,
                per_block(blocks, |b| bytemuck::cast_slice(b.csr_vals)),
            ),
            PlannedSection::new(
                SectionKind::CSC_COLPTR,
                per_block(blocks, |b| bytemuck::cast_slice(b.csc_colptr)),
            ),
            PlannedSection::new(
                SectionKind::CSC_ROWS,
                per_block(blocks, |b| bytemuck::cast_slice(b.csc_rows)),
            ),
            PlannedSection::new(
                SectionKind::CSC_VALS,
                per_block(blocks, |b| bytemuck::cast_slice(b.csc_vals)),
            ),
            PlannedSection::new(
                SectionKind::HALO_RECV_OFFSETS,
                vec![borrowed(contents.halo_recv_offsets)],
            ),
            PlannedSection::new(SectionKind::HALO_RECV, vec![borrowed(contents.halo_recv)]),
            PlannedSection::new(
                SectionKind::HALO_SEND_OFFSETS,
                vec![borrowed(contents.halo_send_offsets)],
            ),
            PlannedSection::new(SectionKind::HALO_SEND, vec![borrowed(contents.halo_send)]),
            PlannedSection::new(
                SectionKind::ORIGINAL_IDS,
                vec![borrowed(contents.original_ids)],
            ),
        ];
        if let Some(features) = contents.features {
            sections.push(PlannedSection::new(
                SectionKind::FEATURES,
                vec![borrowed(features)],
            ));
        }
        if let Some(labels) = contents.labels {
            sections.push(PlannedSection::new(
                SectionKind::LABELS,
                vec![borrowed(labels)],
            ));
        }
        if let Some(masks) = contents.masks {
            sections.push(PlannedSection::new(
                SectionKind::MASKS,
                vec![borrowed(masks)],
            ));
        }
        if weighted {
            sections.push(PlannedSection::new(
                SectionKind::EDGE_WEIGHTS,
                per_block(blocks, |b| {
                    bytemuck::cast_slice(b.edge_weights.unwrap_or(&[]))
                }),
            ));
        }
        if let Some(targets) = contents.targets {
            sections.push(PlannedSection::new(
                SectionKind::TARGETS,
                vec![borrowed(targets)],
            ));
        }

        let mut plan = Self {
            header: ChunkHeader {
                version: contents.version(),
                value_dtype: ValueDtype::F32,
                index_width: INDEX_WIDTH,
                num_parts,
                part_id: contents.part_id,
                num_global_nodes: off[parts],
                num_local_nodes: n_p,
                num_halo_rows: contents.halo_recv.len() as u64,
                nnz,
                feature_dim: contents.feature_dim,
                num_classes: contents.num_classes,
                fingerprint: contents.fingerprint,
                section_count: 0,
                section_table_offset: 0,
                file_len: 0,
                file_checksum: 0,
            },
            sections,
        };
        plan.layout()?;
        Ok(plan)
    }

    /// Checks `contents` (the arrays this plan was made from) against every rule a reader checks
    /// ([`ChunkView::parse`] with `check_transpose` as `verify_csc_matches_csr`), in memory,
    /// before anything is written; the layout rules hold by construction of the plan. For the
    /// file writer, which does not read its file back.
    #[cfg(feature = "std")]
    pub(crate) fn validate(
        &self,
        contents: &ChunkContents<'a>,
        check_transpose: bool,
    ) -> Result<(), ChunkError> {
        let arrays = crate::validate::Arrays {
            header: &self.header,
            part_offsets: contents.part_offsets,
            halo_recv_offsets: contents.halo_recv_offsets,
            halo_recv: contents.halo_recv,
            halo_send_offsets: contents.halo_send_offsets,
            halo_send: contents.halo_send,
            original_ids: contents.original_ids,
            features: contents.features,
            labels: contents.labels,
            targets: contents.targets,
            masks: contents.masks,
        };
        arrays.validate_lists()?;
        let src: Vec<u32> = contents.blocks.iter().map(|b| b.src_part).collect();
        arrays.validate_sources(&src)?;
        arrays.validate_blocks(&contents.blocks, check_transpose)
    }

    /// The per-block length rules the layout relies on (nrows = n_p, pointer lengths, equal
    /// non-zero counts), so a wrong block is named before anything is written.
    fn check_block_shape(b: &BlockView<'_>, i: usize, n_p: u64) -> Result<(), ChunkError> {
        let at = |kind, detail: alloc::string::String| {
            ChunkError::section(
                kind,
                format!("block {i} (source part {}): {detail}", b.src_part),
            )
        };
        if b.nrows as u64 != n_p || b.csr_rowptr.len() != b.nrows.saturating_add(1) {
            return Err(at(
                SectionKind::CSR_ROWPTR,
                format!(
                    "nrows is {} and the row pointer has {} entries; expected nrows = num_local_nodes = {n_p} and nrows + 1 entries",
                    b.nrows,
                    b.csr_rowptr.len()
                ),
            ));
        }
        if b.csc_colptr.len() != b.ncols.saturating_add(1) {
            return Err(at(
                SectionKind::CSC_COLPTR,
                format!(
                    "the column pointer has {} entries, expected ncols + 1 = {}",
                    b.csc_colptr.len(),
                    b.ncols.saturating_add(1)
                ),
            ));
        }
        let nnz = b.csr_cols.len();
        for (kind, len) in [
            (SectionKind::CSR_VALS, b.csr_vals.len()),
            (SectionKind::CSC_ROWS, b.csc_rows.len()),
            (SectionKind::CSC_VALS, b.csc_vals.len()),
            (
                SectionKind::EDGE_WEIGHTS,
                b.edge_weights.map_or(nnz, <[f32]>::len),
            ),
        ] {
            if len != nnz {
                return Err(at(
                    kind,
                    format!("has {len} entries but the CSR column array has {nnz}"),
                ));
            }
        }
        Ok(())
    }

    /// Places the table at the end of the header and the sections after it, in list order, each
    /// 64-aligned; fills the header's layout fields.
    pub(crate) fn layout(&mut self) -> Result<(), ChunkError> {
        let too_big = || ChunkError::header("file_len", "the chunk would exceed 2^64 bytes".into());
        let count = u32::try_from(self.sections.len())
            .map_err(|_| ChunkError::header("section_count", "more than 2^32 sections".into()))?;
        let table_offset = HEADER_LEN as u64;
        let table_end = table_offset + u64::from(count) * SECTION_ENTRY_LEN as u64;
        let mut cursor = table_end;
        for s in &mut self.sections {
            s.offset = align_up(cursor).ok_or_else(too_big)?;
            s.byte_len = s
                .pieces
                .iter()
                .try_fold(0u64, |acc, p| acc.checked_add(p.bytes().len() as u64))
                .ok_or_else(too_big)?;
            cursor = s.offset.checked_add(s.byte_len).ok_or_else(too_big)?;
        }
        self.header.section_count = count;
        self.header.section_table_offset = table_offset;
        self.header.file_len = align_up(cursor).ok_or_else(too_big)?;
        Ok(())
    }

    /// The header and section table bytes (contiguous from offset 0), with the given section
    /// checksums and the whole-file checksum filled in; also returns the file checksum.
    pub(crate) fn header_and_table(&self, checksums: &[u64]) -> (Vec<u8>, u64) {
        let mut table = Vec::with_capacity(self.sections.len() * SECTION_ENTRY_LEN);
        for (s, &checksum) in self.sections.iter().zip(checksums) {
            let entry = SectionEntry {
                kind: s.kind,
                flags: s.flags,
                elem_type: s.elem.code(),
                offset: s.offset,
                byte_len: s.byte_len,
                elem_count: s.byte_len / s.elem.size(),
                checksum,
            };
            table.extend_from_slice(&entry.encode());
        }
        let mut header = self.header;
        header.file_checksum = 0;
        header.file_checksum = file_checksum(&header.encode(), &table);
        let mut out = Vec::with_capacity(HEADER_LEN + table.len());
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&table);
        (out, header.file_checksum)
    }

    /// Lays the planned bytes out in memory without validating them.
    pub(crate) fn encode_unchecked(&self) -> Result<AlignedBuf, ChunkError> {
        let len = usize::try_from(self.header.file_len).map_err(|_| {
            ChunkError::header(
                "file_len",
                "the chunk does not fit in this address space".into(),
            )
        })?;
        let mut buf = AlignedBuf::zeroed(len);
        let bytes = buf.as_bytes_mut();
        let mut checksums = Vec::with_capacity(self.sections.len());
        for s in &self.sections {
            // Offsets and lengths come from `layout`, which bounded them by `file_len`.
            #[allow(
                clippy::cast_possible_truncation,
                reason = "`layout` bounded the offset by `file_len`, which fit usize just above"
            )]
            let mut at = s.offset as usize;
            for piece in &s.pieces {
                let piece = piece.bytes();
                bytes[at..at + piece.len()].copy_from_slice(piece);
                at += piece.len();
            }
            checksums.push(s.checksum());
        }
        let (head, _) = self.header_and_table(&checksums);
        bytes[..head.len()].copy_from_slice(&head);
        Ok(buf)
    }
}

/// Encodes `contents` as a chunk in an aligned in-memory buffer and validates the result with
/// [`ChunkView::parse`], so the bytes returned are always a valid chunk.
pub fn encode(contents: &ChunkContents<'_>) -> Result<AlignedBuf, ChunkError> {
    let buf = Plan::new(contents)?.encode_unchecked()?;
    ChunkView::parse(buf.as_bytes())?;
    Ok(buf)
}

/// [`encode`], returning a plain byte vector (for tests and transfers; to read it back, copy it
/// into an [`AlignedBuf`]).
pub fn encode_to_vec(contents: &ChunkContents<'_>) -> Result<Vec<u8>, ChunkError> {
    encode(contents).map(|buf| buf.as_bytes().to_vec())
}
