//! [`ChunkView`]: the zero-copy validating reader.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use crate::contents::ChunkContents;
use crate::error::ChunkError;
use crate::layout::{
    file_checksum, read_u16, ChunkHeader, ElemType, SectionEntry, SectionKind, FORMAT_VERSION,
    HEADER_LEN, H_VERSION_MAJOR, INDEX_WIDTH, KIND_SLOTS, MAGIC, SECTION_ALIGN, SECTION_ENTRY_LEN,
    SECTION_FLAG_OPTIONAL,
};
use crate::validate::{peer_range, to_usize};

/// What [`ChunkView::parse_with`] checks beyond the layout, the header/table checksum and the
/// structural invariants, which it always checks (they are what makes unchecked indexing sound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseOptions {
    /// Verify every section's xxh3 checksum (one pass over the data at memory bandwidth).
    pub verify_section_checksums: bool,
    /// Verify that each block's CSC holds exactly the entries of its CSR (one merge pass with a
    /// random access per non-zero: the most expensive check on large, poorly ordered blocks).
    pub verify_csc_matches_csr: bool,
}

impl ParseOptions {
    /// Every check (the default).
    pub const FULL: Self = Self {
        verify_section_checksums: true,
        verify_csc_matches_csr: true,
    };

    /// Only the checks memory safety and in-range indexing need, for a file that passed a
    /// [`ParseOptions::FULL`] parse before (the writer does one on everything it writes).
    pub const STRUCTURE_ONLY: Self = Self {
        verify_section_checksums: false,
        verify_csc_matches_csr: false,
    };
}

impl Default for ParseOptions {
    fn default() -> Self {
        Self::FULL
    }
}

/// One block `Â[p][q]` of a chunk: p's `nrows` local rows times the `ncols` compacted columns of
/// source part `q`, as CSR and CSC. Validated invariants (when it comes from a [`ChunkView`]):
/// `csr_rowptr` has `nrows+1` entries, starts at 0, is non-decreasing and ends at `nnz()`;
/// column indices are strictly increasing within a row and `< ncols`; the same holds for the CSC
/// with rows `< nrows`; CSR and CSC hold the same entries with bit-identical values;
/// `edge_weights`, when present, has `nnz()` finite entries.
#[derive(Clone, Copy, PartialEq)]
pub struct BlockView<'a> {
    /// The source part `q` whose columns this block holds.
    pub src_part: u32,
    /// Number of rows (`n_p`).
    pub nrows: usize,
    /// Number of compacted columns: `n_p` for the diagonal block, else rows received from `q`.
    pub ncols: usize,
    /// CSR row pointer, `nrows+1` entries starting at 0.
    pub csr_rowptr: &'a [u64],
    /// CSR compacted column indices.
    pub csr_cols: &'a [u32],
    /// CSR values.
    pub csr_vals: &'a [f32],
    /// CSC column pointer, `ncols+1` entries starting at 0.
    pub csc_colptr: &'a [u64],
    /// CSC row indices.
    pub csc_rows: &'a [u32],
    /// CSC values.
    pub csc_vals: &'a [f32],
    /// The weight in the graph's `A` (not Â) of each stored entry, in CSR order (entry for
    /// entry with `csr_vals`): the input edges' weights summed (1 for an unweighted edge), 0
    /// at a diagonal entry the normalisation added. `None` in chunks written without them
    /// (format 1.0); in one chunk either every block has them or none.
    pub edge_weights: Option<&'a [f32]>,
}

impl BlockView<'_> {
    /// Number of non-zeros.
    pub fn nnz(&self) -> usize {
        self.csr_cols.len()
    }
}

/// Shapes only: a block of a mapped chunk can hold billions of entries.
impl fmt::Debug for BlockView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockView")
            .field("src_part", &self.src_part)
            .field("nrows", &self.nrows)
            .field("ncols", &self.ncols)
            .field("nnz", &self.nnz())
            .field("edge_weights", &self.edge_weights.is_some())
            .finish_non_exhaustive()
    }
}

/// The header and block shapes only, not the (possibly huge) arrays.
impl fmt::Debug for ChunkView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkView")
            .field("len", &self.bytes.len())
            .field("header", &self.header)
            .field("blocks", &self.blocks().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// A validated, zero-copy view of a chunk's bytes. See the crate docs and `docs/chunk-format.md`
/// for what [`ChunkView::parse`] guarantees.
#[derive(Clone, Copy)]
pub struct ChunkView<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) header: ChunkHeader,
    pub(crate) table: &'a [u8],
    pub(crate) part_offsets: &'a [u64],
    pub(crate) block_src: &'a [u32],
    pub(crate) block_col_offsets: &'a [u64],
    pub(crate) block_nnz_offsets: &'a [u64],
    pub(crate) csr_rowptr: &'a [u64],
    pub(crate) csr_cols: &'a [u32],
    pub(crate) csr_vals: &'a [f32],
    pub(crate) csc_colptr: &'a [u64],
    pub(crate) csc_rows: &'a [u32],
    pub(crate) csc_vals: &'a [f32],
    pub(crate) halo_recv_offsets: &'a [u64],
    pub(crate) halo_recv: &'a [u32],
    pub(crate) halo_send_offsets: &'a [u64],
    pub(crate) halo_send: &'a [u32],
    pub(crate) original_ids: &'a [u64],
    pub(crate) features: Option<&'a [f32]>,
    pub(crate) labels: Option<&'a [i32]>,
    pub(crate) masks: Option<&'a [u8]>,
    pub(crate) edge_weights: Option<&'a [f32]>,
    pub(crate) targets: Option<&'a [u8]>,
}

/// Converts an in-bounds `(offset, len)` pair to a byte range of a buffer of `total` bytes.
fn byte_range(offset: u64, len: u64, total: usize) -> Option<Range<usize>> {
    let end = offset.checked_add(len)?;
    if end > total as u64 {
        return None;
    }
    Some(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)
}

/// Checks that `bytes[range]` is all zero; `location` names the gap for the error.
fn check_zero(
    bytes: &[u8],
    range: Range<usize>,
    location: impl FnOnce() -> String,
) -> Result<(), ChunkError> {
    let start = range.start;
    match bytes[range].iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(ChunkError::Padding {
            offset: (start + i) as u64,
            location: location(),
        }),
    }
}

/// Known sections found in the table, by kind code.
type Found<'a> = [Option<&'a [u8]>; KIND_SLOTS];

fn cast<T: bytemuck::AnyBitPattern>(kind: SectionKind, bytes: &[u8]) -> Result<&[T], ChunkError> {
    bytemuck::try_cast_slice(bytes).map_err(|e| {
        ChunkError::section(
            kind,
            format!("cannot view the data as its element type: {e:?}"),
        )
    })
}

fn required<'a, T: bytemuck::AnyBitPattern>(
    found: &Found<'a>,
    kind: SectionKind,
) -> Result<&'a [T], ChunkError> {
    match found[kind.0 as usize] {
        Some(f) => cast(kind, f),
        None => Err(ChunkError::MissingSection { section: kind }),
    }
}

fn optional<'a, T: bytemuck::AnyBitPattern>(
    found: &Found<'a>,
    kind: SectionKind,
) -> Result<Option<&'a [T]>, ChunkError> {
    found[kind.0 as usize].map(|f| cast(kind, f)).transpose()
}

impl<'a> ChunkView<'a> {
    /// Validates `bytes` as a chunk (magic, version, layout, all checksums, all structural
    /// invariants, CSC = CSR) and returns a view into it. `bytes` must start at an 8-byte-aligned address
    /// (a memory map or an [`crate::AlignedBuf`]). Never panics; allocates at most one array of
    /// `n_p` words, bounded by the input size.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ChunkError> {
        Self::parse_with(bytes, &ParseOptions::default())
    }

    /// [`ChunkView::parse`] with options.
    pub fn parse_with(bytes: &'a [u8], options: &ParseOptions) -> Result<Self, ChunkError> {
        let header_bytes: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(ChunkError::TooShort { len: bytes.len() })?;
        if !bytes.as_ptr().cast::<u64>().is_aligned() {
            return Err(ChunkError::MisalignedBuffer);
        }
        if header_bytes[..8] != MAGIC {
            let mut found = [0u8; 8];
            found.copy_from_slice(&header_bytes[..8]);
            return Err(ChunkError::BadMagic { found });
        }
        let major = read_u16(header_bytes, H_VERSION_MAJOR);
        if major != FORMAT_VERSION.major {
            return Err(ChunkError::UnsupportedVersion {
                found: crate::Version {
                    major,
                    minor: read_u16(header_bytes, H_VERSION_MAJOR + 2),
                },
                supported_major: FORMAT_VERSION.major,
            });
        }
        let dtype_code = header_bytes[crate::layout::H_VALUE_DTYPE];
        let header = ChunkHeader::decode(header_bytes).ok_or_else(|| {
            ChunkError::header(
                "value_dtype",
                format!("unknown value dtype code {dtype_code} (1 = f32)"),
            )
        })?;
        if header.file_len != bytes.len() as u64 {
            return Err(ChunkError::LengthMismatch {
                header: header.file_len,
                actual: bytes.len() as u64,
            });
        }

        let table_range = Self::table_range(&header, bytes.len())?;
        let table = &bytes[table_range.clone()];
        let computed = file_checksum(header_bytes, table);
        if computed != header.file_checksum {
            return Err(ChunkError::FileChecksum {
                stored: header.file_checksum,
                computed,
            });
        }
        Self::check_header_fields(header_bytes, &header)?;

        let found = Self::read_table(bytes, table, table_range, options)?;
        let view = Self {
            bytes,
            header,
            table,
            part_offsets: required(&found, SectionKind::PART_OFFSETS)?,
            block_src: required(&found, SectionKind::BLOCK_SRC)?,
            block_col_offsets: required(&found, SectionKind::BLOCK_COL_OFFSETS)?,
            block_nnz_offsets: required(&found, SectionKind::BLOCK_NNZ_OFFSETS)?,
            csr_rowptr: required(&found, SectionKind::CSR_ROWPTR)?,
            csr_cols: required(&found, SectionKind::CSR_COLS)?,
            csr_vals: required(&found, SectionKind::CSR_VALS)?,
            csc_colptr: required(&found, SectionKind::CSC_COLPTR)?,
            csc_rows: required(&found, SectionKind::CSC_ROWS)?,
            csc_vals: required(&found, SectionKind::CSC_VALS)?,
            halo_recv_offsets: required(&found, SectionKind::HALO_RECV_OFFSETS)?,
            halo_recv: required(&found, SectionKind::HALO_RECV)?,
            halo_send_offsets: required(&found, SectionKind::HALO_SEND_OFFSETS)?,
            halo_send: required(&found, SectionKind::HALO_SEND)?,
            original_ids: required(&found, SectionKind::ORIGINAL_IDS)?,
            features: optional(&found, SectionKind::FEATURES)?,
            labels: optional(&found, SectionKind::LABELS)?,
            masks: optional(&found, SectionKind::MASKS)?,
            edge_weights: optional(&found, SectionKind::EDGE_WEIGHTS)?,
            targets: optional(&found, SectionKind::TARGETS)?,
        };
        view.validate(options.verify_csc_matches_csr)?;
        Ok(view)
    }

    fn table_range(header: &ChunkHeader, total: usize) -> Result<Range<usize>, ChunkError> {
        let offset = header.section_table_offset;
        if offset < HEADER_LEN as u64 || offset & (SECTION_ALIGN as u64 - 1) != 0 {
            return Err(ChunkError::header(
                "section_table_offset",
                format!("{offset} is not a multiple of {SECTION_ALIGN} at or after the header"),
            ));
        }
        let len = u64::from(header.section_count) * SECTION_ENTRY_LEN as u64;
        byte_range(offset, len, total).ok_or_else(|| {
            ChunkError::header(
                "section_count",
                format!(
                    "a table of {} entries at offset {offset} does not fit in the {total}-byte file",
                    header.section_count
                ),
            )
        })
    }

    fn check_header_fields(
        header_bytes: &[u8; HEADER_LEN],
        header: &ChunkHeader,
    ) -> Result<(), ChunkError> {
        if let Some(field) = ChunkHeader::nonzero_reserved(header_bytes) {
            return Err(ChunkError::header(
                field,
                "reserved bytes must be zero".into(),
            ));
        }
        if header.index_width != INDEX_WIDTH {
            return Err(ChunkError::header(
                "index_width",
                format!("{} (only {INDEX_WIDTH} is defined)", header.index_width),
            ));
        }
        if header.num_parts == 0 {
            return Err(ChunkError::header("num_parts", "must be at least 1".into()));
        }
        if header.part_id >= header.num_parts {
            return Err(ChunkError::header(
                "part_id",
                format!(
                    "{} is not below num_parts {}",
                    header.part_id, header.num_parts
                ),
            ));
        }
        if header.num_local_nodes > u64::from(u32::MAX) {
            return Err(ChunkError::header(
                "num_local_nodes",
                format!("{} does not fit a u32 local index", header.num_local_nodes),
            ));
        }
        Ok(())
    }

    /// Walks the table: entry fields, bounds, order, zero gaps and checksums. Returns the known
    /// sections by kind code.
    fn read_table(
        bytes: &'a [u8],
        table: &[u8],
        table_range: Range<usize>,
        options: &ParseOptions,
    ) -> Result<Found<'a>, ChunkError> {
        let mut found: Found<'a> = [None; KIND_SLOTS];
        // Regions in file order: the header, then sections (ascending) with the table placed
        // where it falls; `cursor` is the end of the previous region.
        let mut cursor = HEADER_LEN;
        let mut previous = String::from("after the header");
        let mut table_placed = false;
        for (index, raw) in table.chunks_exact(SECTION_ENTRY_LEN).enumerate() {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "the table holds `section_count` (a u32) entries"
            )]
            let index = index as u32;
            let raw: &[u8; SECTION_ENTRY_LEN] = raw
                .try_into()
                .map_err(|_| ChunkError::table(index, "entry is not 48 bytes".into()))?;
            let (entry, reserved) = SectionEntry::decode(raw);
            let range = Self::check_entry(&entry, reserved, index, bytes.len())?;

            if !table_placed && range.end > table_range.start {
                if cursor > table_range.start {
                    return Err(ChunkError::header(
                        "section_table_offset",
                        format!(
                            "the section table at {} overlaps the region {previous}",
                            table_range.start
                        ),
                    ));
                }
                check_zero(bytes, cursor..table_range.start, || {
                    format!("{previous}, before the section table")
                })?;
                cursor = table_range.end;
                previous = String::from("after the section table");
                table_placed = true;
            }
            if range.start < cursor {
                return Err(ChunkError::table(
                    index,
                    format!(
                        "section {} at offset {} overlaps the region before it (which ends at {cursor}); entries must be in ascending, non-overlapping order",
                        entry.kind, range.start
                    ),
                ));
            }
            check_zero(bytes, cursor..range.start, || {
                format!("{previous}, before section {}", entry.kind)
            })?;
            cursor = range.end;
            previous = format!("after section {}", entry.kind);

            let data = &bytes[range];
            if options.verify_section_checksums {
                let computed = xxhash_rust::xxh3::xxh3_64(data);
                if computed != entry.checksum {
                    return Err(ChunkError::SectionChecksum {
                        section: entry.kind,
                        stored: entry.checksum,
                        computed,
                    });
                }
            }
            if let Some(slot) = entry.kind.slot() {
                if found[slot].is_some() {
                    return Err(ChunkError::table(
                        index,
                        format!("section {} appears more than once", entry.kind),
                    ));
                }
                found[slot] = Some(data);
            }
        }
        if !table_placed {
            if cursor > table_range.start {
                return Err(ChunkError::header(
                    "section_table_offset",
                    format!(
                        "the section table at {} overlaps the region {previous}",
                        table_range.start
                    ),
                ));
            }
            check_zero(bytes, cursor..table_range.start, || {
                format!("{previous}, before the section table")
            })?;
            cursor = table_range.end;
            previous = String::from("after the section table");
        }
        check_zero(bytes, cursor..bytes.len(), || {
            format!("{previous}, at the end of the file")
        })?;
        Ok(found)
    }

    /// Checks one entry's own fields and returns its byte range.
    fn check_entry(
        entry: &SectionEntry,
        reserved: u32,
        index: u32,
        total: usize,
    ) -> Result<Range<usize>, ChunkError> {
        let kind = entry.kind;
        if reserved != 0 {
            return Err(ChunkError::table(
                index,
                format!("section {kind}: reserved field is {reserved}, must be 0"),
            ));
        }
        if entry.flags & !SECTION_FLAG_OPTIONAL != 0 {
            return Err(ChunkError::table(
                index,
                format!(
                    "section {kind}: unknown flag bits {:#x}",
                    entry.flags & !SECTION_FLAG_OPTIONAL
                ),
            ));
        }
        let elem = ElemType::from_code(entry.elem_type);
        match kind.spec() {
            Some(spec) => {
                let flags = SectionKind::expected_flags(spec);
                if entry.flags != flags {
                    return Err(ChunkError::table(
                        index,
                        format!(
                            "section {kind}: flags are {:#x}, the spec says {flags:#x}",
                            entry.flags
                        ),
                    ));
                }
                if elem != Some(spec.elem) {
                    return Err(ChunkError::table(
                        index,
                        format!(
                            "section {kind}: element type code {} is not {:?} (code {})",
                            entry.elem_type,
                            spec.elem,
                            spec.elem.code()
                        ),
                    ));
                }
            }
            None if entry.flags & SECTION_FLAG_OPTIONAL == 0 => {
                return Err(ChunkError::table(
                    index,
                    format!(
                        "section of {kind} is required (not marked OPTIONAL) but this reader (format {FORMAT_VERSION}) does not know it"
                    ),
                ));
            }
            None => {}
        }
        if let Some(elem) = elem {
            if entry.elem_count.checked_mul(elem.size()) != Some(entry.byte_len) {
                return Err(ChunkError::table(
                    index,
                    format!(
                        "section {kind}: byte length {} is not {} elements of {} bytes",
                        entry.byte_len,
                        entry.elem_count,
                        elem.size()
                    ),
                ));
            }
        }
        if entry.offset & (SECTION_ALIGN as u64 - 1) != 0 {
            return Err(ChunkError::table(
                index,
                format!(
                    "section {kind}: offset {} is not a multiple of {SECTION_ALIGN}",
                    entry.offset
                ),
            ));
        }
        byte_range(entry.offset, entry.byte_len, total).ok_or_else(|| {
            ChunkError::table(
                index,
                format!(
                    "section {kind}: {} bytes at offset {} run past the end of the {total}-byte file",
                    entry.byte_len, entry.offset
                ),
            )
        })
    }

    /// The decoded header.
    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }

    /// The whole chunk's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The whole-file checksum from the header (verified by `parse`).
    pub fn file_checksum(&self) -> u64 {
        self.header.file_checksum
    }

    /// The section table entries, in file order (including skipped unknown optional sections).
    pub fn sections(&self) -> impl ExactSizeIterator<Item = SectionEntry> + 'a {
        self.table.chunks_exact(SECTION_ENTRY_LEN).map(|raw| {
            let mut entry = [0u8; SECTION_ENTRY_LEN];
            entry.copy_from_slice(raw);
            SectionEntry::decode(&entry).0
        })
    }

    /// Number of parts `P`.
    pub fn num_parts(&self) -> usize {
        self.header.num_parts as usize
    }

    /// This chunk's part id `p`.
    pub fn part_id(&self) -> usize {
        self.header.part_id as usize
    }

    /// Rows owned by this part, `n_p`.
    pub fn num_local_nodes(&self) -> usize {
        // Bounded by the CSR row-pointer section's length (`blocks × (n_p + 1)`, checked).
        to_usize(self.header.num_local_nodes)
    }

    /// Part offsets `u64[P+1]`: part `q` owns global nodes `off[q]..off[q+1]`.
    pub fn part_offsets(&self) -> &'a [u64] {
        self.part_offsets
    }

    /// Number of blocks `B` (the diagonal block plus one per peer this part receives from).
    pub fn num_blocks(&self) -> usize {
        self.block_src.len()
    }

    /// Source part of each block, strictly increasing.
    pub fn block_sources(&self) -> &'a [u32] {
        self.block_src
    }

    /// Block `i` (in order of source part).
    ///
    /// # Panics
    /// If `i >= self.num_blocks()`.
    pub fn block(&self, i: usize) -> BlockView<'a> {
        let nrows = self.num_local_nodes();
        let (z0, z1) = (
            to_usize(self.block_nnz_offsets[i]),
            to_usize(self.block_nnz_offsets[i + 1]),
        );
        let (c0, c1) = (
            to_usize(self.block_col_offsets[i]),
            to_usize(self.block_col_offsets[i + 1]),
        );
        BlockView {
            src_part: self.block_src[i],
            nrows,
            ncols: c1 - c0,
            csr_rowptr: &self.csr_rowptr[i * (nrows + 1)..(i + 1) * (nrows + 1)],
            csr_cols: &self.csr_cols[z0..z1],
            csr_vals: &self.csr_vals[z0..z1],
            csc_colptr: &self.csc_colptr[c0 + i..c1 + i + 1],
            csc_rows: &self.csc_rows[z0..z1],
            csc_vals: &self.csc_vals[z0..z1],
            edge_weights: self.edge_weights.map(|w| &w[z0..z1]),
        }
    }

    /// All blocks, in order of source part.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = BlockView<'a>> + 'a {
        let this = *self;
        (0..this.num_blocks()).map(move |i| this.block(i))
    }

    /// The block whose columns come from part `q`, if this part has one.
    pub fn block_for_source(&self, q: u32) -> Option<BlockView<'a>> {
        self.block_src.binary_search(&q).ok().map(|i| self.block(i))
    }

    /// The diagonal block `Â[p][p]` (always present).
    pub fn diagonal_block(&self) -> BlockView<'a> {
        let i = self.block_src.partition_point(|&q| q < self.header.part_id);
        self.block(i)
    }

    /// Offsets of the halo receive lists, `u64[P+1]`.
    pub fn halo_recv_offsets(&self) -> &'a [u64] {
        self.halo_recv_offsets
    }

    /// All halo receive lists, concatenated in peer order (`H` entries).
    pub fn halo_recv_flat(&self) -> &'a [u32] {
        self.halo_recv
    }

    /// The sorted `peer`-local ids of the rows this part receives from `peer` (empty for itself).
    ///
    /// # Panics
    /// If `peer >= self.num_parts()`.
    pub fn halo_recv(&self, peer: usize) -> &'a [u32] {
        &self.halo_recv[peer_range(self.halo_recv_offsets, peer)]
    }

    /// Offsets of the halo send lists, `u64[P+1]`.
    pub fn halo_send_offsets(&self) -> &'a [u64] {
        self.halo_send_offsets
    }

    /// All halo send lists, concatenated in peer order.
    pub fn halo_send_flat(&self) -> &'a [u32] {
        self.halo_send
    }

    /// The sorted local ids of the rows this part sends to `peer` (empty for itself).
    ///
    /// # Panics
    /// If `peer >= self.num_parts()`.
    pub fn halo_send(&self, peer: usize) -> &'a [u32] {
        &self.halo_send[peer_range(self.halo_send_offsets, peer)]
    }

    /// Node features, row-major `n_p × F`, if present.
    pub fn features(&self) -> Option<&'a [f32]> {
        self.features
    }

    /// Node labels (−1 = unlabelled, else `< C`), if present.
    pub fn labels(&self) -> Option<&'a [i32]> {
        self.labels
    }

    /// Multi-label targets, row-major `n_p × C` (each row all 0/1, or all
    /// [`crate::TARGET_UNLABELLED`] for an unlabelled node), if the chunk holds them instead of
    /// [`ChunkView::labels`] (format 1.2).
    pub fn targets(&self) -> Option<&'a [u8]> {
        self.targets
    }

    /// Node masks (bit 0 train, 1 val, 2 test), if present.
    pub fn masks(&self) -> Option<&'a [u8]> {
        self.masks
    }

    /// The weight in the graph's `A` of every stored non-zero, all blocks together in
    /// `CSR_VALS` order (block `i`'s run is its [`BlockView::edge_weights`]), if the chunk
    /// records them (format 1.1 and later).
    pub fn edge_weights(&self) -> Option<&'a [f32]> {
        self.edge_weights
    }

    /// Original (pre-renumbering) node id of each local row.
    pub fn original_ids(&self) -> &'a [u64] {
        self.original_ids
    }

    /// The view's contents in the writer's input form (to re-encode or compare a chunk).
    pub fn contents(&self) -> ChunkContents<'a> {
        ChunkContents {
            part_id: self.header.part_id,
            fingerprint: self.header.fingerprint,
            part_offsets: self.part_offsets,
            blocks: self.blocks().collect::<Vec<_>>(),
            halo_recv_offsets: self.halo_recv_offsets,
            halo_recv: self.halo_recv,
            halo_send_offsets: self.halo_send_offsets,
            halo_send: self.halo_send,
            feature_dim: self.header.feature_dim,
            features: self.features,
            num_classes: self.header.num_classes,
            labels: self.labels,
            targets: self.targets,
            masks: self.masks,
            original_ids: self.original_ids,
        }
    }
}
