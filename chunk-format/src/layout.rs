//! Byte layout constants, the header and the section table entry (docs/chunk-format.md).

use core::fmt;

/// The 8 bytes every chunk file starts with: a high-bit byte (catches 7-bit transfers), a name
/// readable in a hex dump, and a newline (catches line-ending conversion).
pub const MAGIC: [u8; 8] = *b"\x89DSPCHK\n";

/// The newest format version this crate writes; it reads every minor version of this major.
/// The writer records the lowest version that defines every section of the file it writes
/// ([`crate::ChunkContents::version`]): a chunk without the sections 1.1 and 1.2 added is a
/// 1.0 file, one with edge weights but no multi-label targets a 1.1 file.
pub const FORMAT_VERSION: Version = Version { major: 1, minor: 2 };

/// The `TARGETS` byte of every class of an unlabelled row (a labelled row holds 0 or 1).
pub const TARGET_UNLABELLED: u8 = 0xFF;

/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 128;

/// Length of one section table entry in bytes.
pub const SECTION_ENTRY_LEN: usize = 48;

/// Every section (and the section table) starts at a multiple of this many bytes.
pub const SECTION_ALIGN: usize = 64;

/// The alignment [`crate::ChunkView::parse`] requires of the start of its buffer: enough for
/// every element type once sections are [`SECTION_ALIGN`]-aligned within the file.
pub const BUFFER_ALIGN: usize = 8;

/// Width in bytes of a local (row or compacted column) index; the only width of version 1.
pub const INDEX_WIDTH: u8 = 4;

/// Section flag bit: a reader that does not know the section's kind may skip it.
pub const SECTION_FLAG_OPTIONAL: u32 = 1;

// Header field offsets (see the header table in the spec).
pub(crate) const H_MAGIC: usize = 0;
pub(crate) const H_VERSION_MAJOR: usize = 8;
pub(crate) const H_VERSION_MINOR: usize = 10;
pub(crate) const H_VALUE_DTYPE: usize = 12;
pub(crate) const H_INDEX_WIDTH: usize = 13;
pub(crate) const H_RESERVED0: usize = 14;
pub(crate) const H_NUM_PARTS: usize = 16;
pub(crate) const H_PART_ID: usize = 20;
pub(crate) const H_NUM_GLOBAL_NODES: usize = 24;
pub(crate) const H_NUM_LOCAL_NODES: usize = 32;
pub(crate) const H_NUM_HALO_ROWS: usize = 40;
pub(crate) const H_NNZ: usize = 48;
pub(crate) const H_FEATURE_DIM: usize = 56;
pub(crate) const H_NUM_CLASSES: usize = 60;
pub(crate) const H_FINGERPRINT: usize = 64;
pub(crate) const H_SECTION_COUNT: usize = 80;
pub(crate) const H_RESERVED1: usize = 84;
pub(crate) const H_SECTION_TABLE_OFFSET: usize = 88;
pub(crate) const H_FILE_LEN: usize = 96;
pub(crate) const H_FILE_CHECKSUM: usize = 104;
pub(crate) const H_RESERVED2: usize = 112;

// Section table entry field offsets.
pub(crate) const E_KIND: usize = 0;
pub(crate) const E_FLAGS: usize = 4;
pub(crate) const E_ELEM_TYPE: usize = 8;
pub(crate) const E_RESERVED: usize = 12;
pub(crate) const E_OFFSET: usize = 16;
pub(crate) const E_BYTE_LEN: usize = 24;
pub(crate) const E_ELEM_COUNT: usize = 32;
pub(crate) const E_CHECKSUM: usize = 40;

/// A format version, `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Changes when an older reader could misread the file.
    pub major: u16,
    /// Changes for additions an older reader of the same major may ignore.
    pub minor: u16,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Type of the non-zero, feature and other real values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueDtype {
    /// IEEE 754 binary32 (code 1).
    F32,
}

impl ValueDtype {
    /// The code stored in the header.
    pub const fn code(self) -> u8 {
        match self {
            Self::F32 => 1,
        }
    }

    /// The dtype with this header code, if the code is known.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::F32),
            _ => None,
        }
    }
}

/// Element type of a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElemType {
    /// `u8` (code 1).
    U8,
    /// `i32` (code 2).
    I32,
    /// `u32` (code 3).
    U32,
    /// `u64` (code 4).
    U64,
    /// `f32` (code 5).
    F32,
}

impl ElemType {
    /// The code stored in the section table.
    pub const fn code(self) -> u32 {
        match self {
            Self::U8 => 1,
            Self::I32 => 2,
            Self::U32 => 3,
            Self::U64 => 4,
            Self::F32 => 5,
        }
    }

    /// The type with this code, if the code is known.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Self::U8),
            2 => Some(Self::I32),
            3 => Some(Self::U32),
            4 => Some(Self::U64),
            5 => Some(Self::F32),
            _ => None,
        }
    }

    /// Size of one element in bytes.
    pub const fn size(self) -> u64 {
        match self {
            Self::U8 => 1,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::U64 => 8,
        }
    }
}

/// A section kind code. Known kinds are the associated constants; other codes may come from a
/// newer minor version (and must then be marked [`SECTION_FLAG_OPTIONAL`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SectionKind(pub u32);

/// What the spec fixes for a known section kind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KindSpec {
    pub(crate) name: &'static str,
    pub(crate) elem: ElemType,
    pub(crate) optional: bool,
}

/// Known kinds, indexed by code (index 0 is unused). The order is the writer's layout order.
const KIND_SPECS: [Option<KindSpec>; 21] = {
    const fn k(name: &'static str, elem: ElemType, optional: bool) -> Option<KindSpec> {
        Some(KindSpec {
            name,
            elem,
            optional,
        })
    }
    [
        None,
        k("PART_OFFSETS", ElemType::U64, false),
        k("BLOCK_SRC", ElemType::U32, false),
        k("BLOCK_COL_OFFSETS", ElemType::U64, false),
        k("BLOCK_NNZ_OFFSETS", ElemType::U64, false),
        k("CSR_ROWPTR", ElemType::U64, false),
        k("CSR_COLS", ElemType::U32, false),
        k("CSR_VALS", ElemType::F32, false),
        k("CSC_COLPTR", ElemType::U64, false),
        k("CSC_ROWS", ElemType::U32, false),
        k("CSC_VALS", ElemType::F32, false),
        k("HALO_RECV_OFFSETS", ElemType::U64, false),
        k("HALO_RECV", ElemType::U32, false),
        k("HALO_SEND_OFFSETS", ElemType::U64, false),
        k("HALO_SEND", ElemType::U32, false),
        k("ORIGINAL_IDS", ElemType::U64, false),
        k("FEATURES", ElemType::F32, true),
        k("LABELS", ElemType::I32, true),
        k("MASKS", ElemType::U8, true),
        k("EDGE_WEIGHTS", ElemType::F32, true),
        k("TARGETS", ElemType::U8, true),
    ]
};

/// Number of slots in a table indexed by known kind code.
pub(crate) const KIND_SLOTS: usize = KIND_SPECS.len();

impl SectionKind {
    /// Part offsets, `u64[P+1]`.
    pub const PART_OFFSETS: Self = Self(0x01);
    /// Source part of each block, `u32[B]`, strictly increasing.
    pub const BLOCK_SRC: Self = Self(0x02);
    /// Prefix sums of the blocks' compacted column counts, `u64[B+1]`.
    pub const BLOCK_COL_OFFSETS: Self = Self(0x03);
    /// Prefix sums of the blocks' non-zero counts, `u64[B+1]`.
    pub const BLOCK_NNZ_OFFSETS: Self = Self(0x04);
    /// Per-block CSR row pointers, `u64[B*(n_p+1)]`.
    pub const CSR_ROWPTR: Self = Self(0x05);
    /// CSR compacted column indices, `u32[nnz]`.
    pub const CSR_COLS: Self = Self(0x06);
    /// CSR values, `f32[nnz]`.
    pub const CSR_VALS: Self = Self(0x07);
    /// Per-block CSC column pointers, `u64[sum_b(ncols_b+1)]`.
    pub const CSC_COLPTR: Self = Self(0x08);
    /// CSC row indices, `u32[nnz]`.
    pub const CSC_ROWS: Self = Self(0x09);
    /// CSC values, `f32[nnz]`.
    pub const CSC_VALS: Self = Self(0x0A);
    /// Offsets of the per-peer halo receive lists, `u64[P+1]`.
    pub const HALO_RECV_OFFSETS: Self = Self(0x0B);
    /// Halo receive lists (peer-local row ids), `u32[H]`.
    pub const HALO_RECV: Self = Self(0x0C);
    /// Offsets of the per-peer halo send lists, `u64[P+1]`.
    pub const HALO_SEND_OFFSETS: Self = Self(0x0D);
    /// Halo send lists (local row ids), `u32[..]`.
    pub const HALO_SEND: Self = Self(0x0E);
    /// Original (pre-renumbering) node ids, `u64[n_p]`.
    pub const ORIGINAL_IDS: Self = Self(0x0F);
    /// Node features, row-major `f32[n_p*F]` (optional).
    pub const FEATURES: Self = Self(0x10);
    /// Node labels, `i32[n_p]`, −1 for unlabelled (optional).
    pub const LABELS: Self = Self(0x11);
    /// Train/val/test masks, `u8[n_p]` (optional).
    pub const MASKS: Self = Self(0x12);
    /// The weight in the graph's `A` of every stored non-zero, in `CSR_VALS` order, `f32[nnz]`
    /// (optional; format 1.1).
    pub const EDGE_WEIGHTS: Self = Self(0x13);
    /// Multi-label targets, row-major `u8[n_p*C]`: 0 or 1 per class, or a whole row of
    /// [`TARGET_UNLABELLED`] (optional, instead of `LABELS`; format 1.2).
    pub const TARGETS: Self = Self(0x14);

    /// The spec's name of a known kind.
    pub fn name(self) -> Option<&'static str> {
        self.spec().map(|s| s.name)
    }

    /// Whether this crate knows the kind.
    pub fn is_known(self) -> bool {
        self.spec().is_some()
    }

    pub(crate) fn spec(self) -> Option<KindSpec> {
        KIND_SPECS.get(self.0 as usize).copied().flatten()
    }

    /// Slot index of a known kind (its code).
    pub(crate) fn slot(self) -> Option<usize> {
        self.spec().map(|_| self.0 as usize)
    }

    /// Flags the spec prescribes for a known kind.
    pub(crate) fn expected_flags(spec: KindSpec) -> u32 {
        if spec.optional {
            SECTION_FLAG_OPTIONAL
        } else {
            0
        }
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown kind {:#x}", self.0),
        }
    }
}

/// The fixed header of a chunk, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkHeader {
    /// Format version the file was written with.
    pub version: Version,
    /// Type of the values.
    pub value_dtype: ValueDtype,
    /// Width of a local index in bytes (4).
    pub index_width: u8,
    /// Number of parts `P`.
    pub num_parts: u32,
    /// This chunk's part `p`.
    pub part_id: u32,
    /// Global node count `N`.
    pub num_global_nodes: u64,
    /// Rows owned by this part, `n_p`.
    pub num_local_nodes: u64,
    /// Rows received from all peers together, `H`.
    pub num_halo_rows: u64,
    /// Non-zeros of all blocks together.
    pub nnz: u64,
    /// Feature dimension `F`, 0 without features.
    pub feature_dim: u32,
    /// Number of classes `C`, 0 without labels.
    pub num_classes: u32,
    /// Identifies the partition run; equal in all chunks of one run.
    pub fingerprint: [u8; 16],
    /// Entries in the section table.
    pub section_count: u32,
    /// Byte offset of the section table.
    pub section_table_offset: u64,
    /// Length of the file in bytes.
    pub file_len: u64,
    /// Whole-file checksum (xxh3-64 of the header with this field zeroed, then the table).
    pub file_checksum: u64,
}

pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

impl ChunkHeader {
    /// Encodes the header; reserved bytes are zero.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        put(&mut b, H_MAGIC, &MAGIC);
        put(&mut b, H_VERSION_MAJOR, &self.version.major.to_le_bytes());
        put(&mut b, H_VERSION_MINOR, &self.version.minor.to_le_bytes());
        b[H_VALUE_DTYPE] = self.value_dtype.code();
        b[H_INDEX_WIDTH] = self.index_width;
        put(&mut b, H_NUM_PARTS, &self.num_parts.to_le_bytes());
        put(&mut b, H_PART_ID, &self.part_id.to_le_bytes());
        put(
            &mut b,
            H_NUM_GLOBAL_NODES,
            &self.num_global_nodes.to_le_bytes(),
        );
        put(
            &mut b,
            H_NUM_LOCAL_NODES,
            &self.num_local_nodes.to_le_bytes(),
        );
        put(&mut b, H_NUM_HALO_ROWS, &self.num_halo_rows.to_le_bytes());
        put(&mut b, H_NNZ, &self.nnz.to_le_bytes());
        put(&mut b, H_FEATURE_DIM, &self.feature_dim.to_le_bytes());
        put(&mut b, H_NUM_CLASSES, &self.num_classes.to_le_bytes());
        put(&mut b, H_FINGERPRINT, &self.fingerprint);
        put(&mut b, H_SECTION_COUNT, &self.section_count.to_le_bytes());
        put(
            &mut b,
            H_SECTION_TABLE_OFFSET,
            &self.section_table_offset.to_le_bytes(),
        );
        put(&mut b, H_FILE_LEN, &self.file_len.to_le_bytes());
        put(&mut b, H_FILE_CHECKSUM, &self.file_checksum.to_le_bytes());
        b
    }

    /// Decodes the fields after magic and version have been checked. Returns `None` for an
    /// unknown value dtype code.
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Option<Self> {
        let mut fingerprint = [0u8; 16];
        fingerprint.copy_from_slice(&b[H_FINGERPRINT..H_FINGERPRINT + 16]);
        Some(Self {
            version: Version {
                major: read_u16(b, H_VERSION_MAJOR),
                minor: read_u16(b, H_VERSION_MINOR),
            },
            value_dtype: ValueDtype::from_code(b[H_VALUE_DTYPE])?,
            index_width: b[H_INDEX_WIDTH],
            num_parts: read_u32(b, H_NUM_PARTS),
            part_id: read_u32(b, H_PART_ID),
            num_global_nodes: read_u64(b, H_NUM_GLOBAL_NODES),
            num_local_nodes: read_u64(b, H_NUM_LOCAL_NODES),
            num_halo_rows: read_u64(b, H_NUM_HALO_ROWS),
            nnz: read_u64(b, H_NNZ),
            feature_dim: read_u32(b, H_FEATURE_DIM),
            num_classes: read_u32(b, H_NUM_CLASSES),
            fingerprint,
            section_count: read_u32(b, H_SECTION_COUNT),
            section_table_offset: read_u64(b, H_SECTION_TABLE_OFFSET),
            file_len: read_u64(b, H_FILE_LEN),
            file_checksum: read_u64(b, H_FILE_CHECKSUM),
        })
    }

    /// The name of the first reserved header field that is not zero.
    pub(crate) fn nonzero_reserved(b: &[u8; HEADER_LEN]) -> Option<&'static str> {
        let fields: [(&'static str, core::ops::Range<usize>); 3] = [
            ("reserved (bytes 14..16)", H_RESERVED0..H_NUM_PARTS),
            (
                "reserved (bytes 84..88)",
                H_RESERVED1..H_SECTION_TABLE_OFFSET,
            ),
            ("reserved (bytes 112..128)", H_RESERVED2..HEADER_LEN),
        ];
        fields
            .into_iter()
            .find(|(_, r)| b[r.clone()].iter().any(|&x| x != 0))
            .map(|(name, _)| name)
    }
}

/// One section table entry, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SectionEntry {
    /// What the section holds.
    pub kind: SectionKind,
    /// Flag bits ([`SECTION_FLAG_OPTIONAL`]).
    pub flags: u32,
    /// Element type code (see [`ElemType::from_code`]).
    pub elem_type: u32,
    /// Byte offset of the data in the file.
    pub offset: u64,
    /// Length of the data in bytes.
    pub byte_len: u64,
    /// Number of elements.
    pub elem_count: u64,
    /// xxh3-64 of the data.
    pub checksum: u64,
}

impl SectionEntry {
    /// Encodes the entry; the reserved field is zero.
    pub(crate) fn encode(&self) -> [u8; SECTION_ENTRY_LEN] {
        let mut b = [0u8; SECTION_ENTRY_LEN];
        put(&mut b, E_KIND, &self.kind.0.to_le_bytes());
        put(&mut b, E_FLAGS, &self.flags.to_le_bytes());
        put(&mut b, E_ELEM_TYPE, &self.elem_type.to_le_bytes());
        put(&mut b, E_OFFSET, &self.offset.to_le_bytes());
        put(&mut b, E_BYTE_LEN, &self.byte_len.to_le_bytes());
        put(&mut b, E_ELEM_COUNT, &self.elem_count.to_le_bytes());
        put(&mut b, E_CHECKSUM, &self.checksum.to_le_bytes());
        b
    }

    /// Decodes one entry and its reserved field.
    pub(crate) fn decode(b: &[u8; SECTION_ENTRY_LEN]) -> (Self, u32) {
        let entry = Self {
            kind: SectionKind(read_u32(b, E_KIND)),
            flags: read_u32(b, E_FLAGS),
            elem_type: read_u32(b, E_ELEM_TYPE),
            offset: read_u64(b, E_OFFSET),
            byte_len: read_u64(b, E_BYTE_LEN),
            elem_count: read_u64(b, E_ELEM_COUNT),
            checksum: read_u64(b, E_CHECKSUM),
        };
        (entry, read_u32(b, E_RESERVED))
    }
}

/// The whole-file checksum: xxh3-64 of the header with its checksum field zeroed, then the table.
pub(crate) fn file_checksum(header: &[u8; HEADER_LEN], table: &[u8]) -> u64 {
    let mut zeroed = *header;
    zeroed[H_FILE_CHECKSUM..H_FILE_CHECKSUM + 8].fill(0);
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    hasher.update(&zeroed);
    hasher.update(table);
    hasher.digest()
}

/// Rounds `x` up to a multiple of [`SECTION_ALIGN`], or `None` on overflow.
pub(crate) fn align_up(x: u64) -> Option<u64> {
    let a = SECTION_ALIGN as u64;
    x.checked_add(a - 1).map(|y| y / a * a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_header() -> ChunkHeader {
        ChunkHeader {
            version: FORMAT_VERSION,
            value_dtype: ValueDtype::F32,
            index_width: INDEX_WIDTH,
            num_parts: 4,
            part_id: 3,
            num_global_nodes: 1 << 40,
            num_local_nodes: 7,
            num_halo_rows: 9,
            nnz: 11,
            feature_dim: 13,
            num_classes: 5,
            fingerprint: core::array::from_fn(|i| u8::try_from(i * 17).unwrap()),
            section_count: 18,
            section_table_offset: 128,
            file_len: 1 << 33,
            file_checksum: 0xdead_beef_0bad_f00d,
        }
    }

    #[test]
    fn header_round_trips_through_bytes() {
        let h = sample_header();
        let bytes = h.encode();
        assert_eq!(&bytes[..8], &MAGIC);
        assert_eq!(ChunkHeader::decode(&bytes), Some(h));
        assert_eq!(ChunkHeader::nonzero_reserved(&bytes), None);
    }

    #[test]
    fn reserved_header_bytes_are_reported_by_name() {
        let mut bytes = sample_header().encode();
        bytes[120] = 1;
        assert_eq!(
            ChunkHeader::nonzero_reserved(&bytes),
            Some("reserved (bytes 112..128)")
        );
    }

    #[test]
    fn entry_round_trips_through_bytes() {
        let e = SectionEntry {
            kind: SectionKind::CSC_VALS,
            flags: SECTION_FLAG_OPTIONAL,
            elem_type: ElemType::F32.code(),
            offset: 64 * 1000,
            byte_len: 4 * 77,
            elem_count: 77,
            checksum: u64::MAX - 3,
        };
        assert_eq!(SectionEntry::decode(&e.encode()), (e, 0));
    }

    #[test]
    fn file_checksum_ignores_the_checksum_field_only() {
        let mut bytes = sample_header().encode();
        let table = [7u8; 96];
        let c = file_checksum(&bytes, &table);
        bytes[H_FILE_CHECKSUM] ^= 0xff;
        assert_eq!(file_checksum(&bytes, &table), c);
        bytes[H_FILE_LEN] ^= 1;
        assert_ne!(file_checksum(&bytes, &table), c);
    }

    #[test]
    fn kinds_have_spec_names_and_types() {
        assert_eq!(SectionKind::CSR_COLS.name(), Some("CSR_COLS"));
        assert_eq!(
            SectionKind::FEATURES.spec().map(|s| (s.elem, s.optional)),
            Some((ElemType::F32, true))
        );
        assert!(!SectionKind(0).is_known());
        assert_eq!(
            SectionKind::EDGE_WEIGHTS
                .spec()
                .map(|s| (s.name, s.elem, s.optional)),
            Some(("EDGE_WEIGHTS", ElemType::F32, true))
        );
        assert_eq!(
            SectionKind::TARGETS
                .spec()
                .map(|s| (s.name, s.elem, s.optional)),
            Some(("TARGETS", ElemType::U8, true))
        );
        assert!(!SectionKind(0x15).is_known());
        assert_eq!(alloc::format!("{}", SectionKind(0x99)), "unknown kind 0x99");
        for code in 1..=5 {
            assert_eq!(ElemType::from_code(code).map(ElemType::code), Some(code));
        }
        assert_eq!(align_up(0), Some(0));
        assert_eq!(align_up(65), Some(128));
        assert_eq!(align_up(u64::MAX), None);
    }
}
