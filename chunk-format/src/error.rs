//! The reader's (and encoder's) error type.

use alloc::string::String;

use crate::layout::{SectionKind, Version, BUFFER_ALIGN, HEADER_LEN, MAGIC};

/// Why a byte buffer is not a valid chunk (or why contents cannot be encoded as one). Every
/// variant names the header field, table entry or section that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// The buffer is shorter than the fixed header.
    #[error("chunk is {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort {
        /// Length of the buffer.
        len: usize,
    },
    /// The buffer does not start at an [`BUFFER_ALIGN`]-aligned address.
    #[error(
        "chunk buffer is not {BUFFER_ALIGN}-byte aligned; memory-map the file or read it into an AlignedBuf"
    )]
    MisalignedBuffer,
    /// The first 8 bytes are not [`MAGIC`].
    #[error("not a chunk file: magic is {found:02x?}, expected {MAGIC:02x?}")]
    BadMagic {
        /// The first 8 bytes of the buffer.
        found: [u8; 8],
    },
    /// The file's major version is not the one this reader implements.
    #[error("chunk format version {found} is not supported (this reader reads major version {supported_major})")]
    UnsupportedVersion {
        /// Version in the file.
        found: Version,
        /// The major version this reader reads.
        supported_major: u16,
    },
    /// The header's `file_len` differs from the buffer length.
    #[error(
        "header says the chunk is {header} bytes but it is {actual} bytes (truncated or extended)"
    )]
    LengthMismatch {
        /// `file_len` from the header.
        header: u64,
        /// Actual length of the buffer.
        actual: u64,
    },
    /// The whole-file checksum (header and section table) does not match.
    #[error("file checksum mismatch (stored {stored:#018x}, computed {computed:#018x}): the header or section table is corrupted")]
    FileChecksum {
        /// Checksum stored in the header.
        stored: u64,
        /// Checksum computed from the bytes.
        computed: u64,
    },
    /// A header field is out of range or inconsistent.
    #[error("header field {field}: {detail}")]
    Header {
        /// Name of the field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A section table entry is malformed (flags, type, bounds, alignment, overlap, duplicate).
    #[error("section table entry {index}: {detail}")]
    SectionTable {
        /// Position of the entry in the table.
        index: u32,
        /// What is wrong.
        detail: String,
    },
    /// A byte outside the header, table and sections is not zero.
    #[error("non-zero padding byte at offset {offset} ({location})")]
    Padding {
        /// Byte offset of the first non-zero byte.
        offset: u64,
        /// Which gap it lies in.
        location: String,
    },
    /// A section's data does not match its checksum.
    #[error("section {section}: checksum mismatch (stored {stored:#018x}, computed {computed:#018x}): the section data is corrupted")]
    SectionChecksum {
        /// The section.
        section: SectionKind,
        /// Checksum stored in the table.
        stored: u64,
        /// Checksum computed from the bytes.
        computed: u64,
    },
    /// A required section is not in the table.
    #[error("required section {section} is missing")]
    MissingSection {
        /// The missing section.
        section: SectionKind,
    },
    /// A section's contents break an invariant of the spec.
    #[error("section {section}: {detail}")]
    Section {
        /// The section.
        section: SectionKind,
        /// What is wrong, and where.
        detail: String,
    },
}

impl ChunkError {
    pub(crate) fn header(field: &'static str, detail: String) -> Self {
        Self::Header { field, detail }
    }

    pub(crate) fn table(index: u32, detail: String) -> Self {
        Self::SectionTable { index, detail }
    }

    pub(crate) fn section(section: SectionKind, detail: String) -> Self {
        Self::Section { section, detail }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    #[test]
    fn messages_name_the_place() {
        let e = ChunkError::section(
            SectionKind::CSR_COLS,
            "block 1, row 2: column 9 >= 4".into(),
        );
        assert_eq!(
            e.to_string(),
            "section CSR_COLS: block 1, row 2: column 9 >= 4"
        );
        let e = ChunkError::UnsupportedVersion {
            found: Version { major: 2, minor: 1 },
            supported_major: 1,
        };
        assert!(format!("{e}").contains("version 2.1"));
        let e = ChunkError::BadMagic { found: [0; 8] };
        assert!(e.to_string().contains("89, 44, 53"));
    }
}
