//! Chunk files (`std`): the atomic streaming writer and the memory-mapped reader.

use std::format;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::vec::Vec;

use memmap2::Mmap;

use crate::atomic::{AtomicFile, AtomicWriteError};
use crate::contents::{ChunkContents, Plan};
use crate::error::ChunkError;
use crate::view::{ChunkView, ParseOptions};

/// A chunk file could not be written, read or validated. Names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkFileError {
    /// An I/O operation failed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done ("open", "write", "rename", …).
        action: &'static str,
        /// The file (or directory) concerned.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The bytes are not a valid chunk (reading), or the contents break the format's rules
    /// (writing; nothing is left under the final name).
    #[error("{} is not a valid chunk", path.display())]
    Invalid {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong.
        source: ChunkError,
    },
}

fn io_error<'p>(
    action: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> ChunkFileError + 'p {
    move |source| ChunkFileError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Opens `path` for reading if it is a regular file. Anything else — a FIFO, a socket, a
/// device, a directory — is refused with [`io::ErrorKind::InvalidInput`] and a message naming
/// what it is, before a byte is read: the file is opened with `O_NONBLOCK` (so a FIFO without a
/// writer cannot block the open) and its type is taken from the open descriptor (`fstat`), so it
/// cannot change between the check and the use. Every reader of chunks, chunk directories and
/// graph files opens its input through this.
pub fn open_regular(path: impl AsRef<Path>) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {}, not a regular file", describe_file_type(kind)),
    ))
}

/// Reads the whole of a regular file (see [`open_regular`]).
pub fn read_regular(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// What a file that is not a regular one is, for messages: "a FIFO (named pipe)", "a socket",
/// "a device", "a directory", or "not a plain file".
pub fn describe_file_type(kind: fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    }
}

/// What [`write_chunk`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    /// The final path.
    pub path: PathBuf,
    /// Length of the file in bytes.
    pub bytes_written: u64,
    /// The whole-file checksum stored in its header.
    pub file_checksum: u64,
}

const ZEROS: [u8; 4096] = [0; 4096];

fn write_zeros(w: &mut impl Write, mut n: u64) -> io::Result<()> {
    while n > 0 {
        let k = usize::try_from(n).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
        w.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Writes `contents` as a chunk file at `path`, atomically. The contents are first checked in
/// memory against every rule the validating reader checks (the same code, CSC against CSR
/// included), so an invalid chunk is refused before anything is written; then the data stream
/// (hashed on the way) through a buffered writer into `<path>.tmp-<pid>-<seq>`, the header and
/// table follow, the temporary file is fsynced, renamed to `path`, and the directory is fsynced.
/// The file is not read back: a read-back maps the whole file, which on a large part doubles
/// the writer's resident memory and rereads every byte. A crash leaves the old file or the new
/// one under `path`, never half a chunk; on any error the temporary file is removed and `path`
/// is untouched.
pub fn write_chunk(
    path: impl AsRef<Path>,
    contents: &ChunkContents<'_>,
) -> Result<WriteSummary, ChunkFileError> {
    let path = path.as_ref();
    let invalid = |source| ChunkFileError::Invalid {
        path: path.to_path_buf(),
        source,
    };
    let plan = Plan::new(contents).map_err(invalid)?;
    plan.validate(contents, true).map_err(invalid)?;
    let mut atomic = AtomicFile::create(path)?;
    let tmp = atomic.temporary_path().to_path_buf();
    let mut out = BufWriter::with_capacity(1 << 20, atomic.file());
    let write_err = io_error("write", &tmp);
    let mut checksums = Vec::with_capacity(plan.sections.len());
    let stream = (|| -> io::Result<u64> {
        let mut at = 0u64;
        for s in &plan.sections {
            write_zeros(&mut out, s.offset - at)?;
            let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
            for piece in &s.pieces {
                hasher.update(piece.bytes());
                out.write_all(piece.bytes())?;
            }
            checksums.push(hasher.digest());
            at = s.offset + s.byte_len;
        }
        write_zeros(&mut out, plan.header.file_len - at)?;
        let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        let (head, file_checksum) = plan.header_and_table(&checksums);
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&head)?;
        Ok(file_checksum)
    })();
    let file_checksum = stream.map_err(write_err)?;

    atomic.commit()?;
    tracing::debug!(
        path = %path.display(),
        bytes = plan.header.file_len,
        checksum = file_checksum,
        "wrote chunk"
    );
    Ok(WriteSummary {
        path: path.to_path_buf(),
        bytes_written: plan.header.file_len,
        file_checksum,
    })
}

impl From<AtomicWriteError> for ChunkFileError {
    fn from(e: AtomicWriteError) -> Self {
        ChunkFileError::Io {
            action: e.action,
            path: e.path,
            source: e.source,
        }
    }
}

/// A memory-mapped, validated chunk file. The view borrows the map, so no data is copied.
pub struct MappedChunk {
    // Declared before `map` so it is dropped first; it borrows the mapped bytes.
    view: ChunkView<'static>,
    map: Mmap,
    path: PathBuf,
}

impl MappedChunk {
    /// Maps `path` and validates it fully (see [`ChunkView::parse`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ChunkFileError> {
        Self::open_with(path, &ParseOptions::default())
    }

    /// [`MappedChunk::open`] with parse options.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &ParseOptions,
    ) -> Result<Self, ChunkFileError> {
        let path = path.as_ref();
        let file = open_regular(path).map_err(io_error("open", path))?;
        // SAFETY: chunk files are written once (temp + rename) and never modified in place, so
        // the mapped bytes do not change under the view; a process truncating the file anyway
        // is outside this crate's contract, as for any memory map.
        let map = unsafe { Mmap::map(&file) }.map_err(io_error("map", path))?;
        // SAFETY: the slice points into the mapping, whose address does not change when `map`
        // moves into the struct; the view is only handed out tied to `&self` (`view`), and is
        // dropped before `map` (field order), so it never outlives the mapping.
        let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(map.as_ptr(), map.len()) };
        let view =
            ChunkView::parse_with(bytes, options).map_err(|source| ChunkFileError::Invalid {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            view,
            map,
            path: path.to_path_buf(),
        })
    }

    /// The validated view of the file.
    pub fn view(&self) -> &ChunkView<'_> {
        &self.view
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the file is empty (never true for a valid chunk).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl std::fmt::Debug for MappedChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedChunk")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .field("header", self.view.header())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::small_full_chunk;
    use crate::SectionKind;
    use std::string::{String, ToString};

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri does not support file-backed memory mappings")]
    fn written_file_maps_back_to_the_same_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-1.chunk");
        let chunk = small_full_chunk();
        let summary = write_chunk(&path, &chunk.contents()).unwrap();
        assert_eq!(dir_entries(dir.path()), ["part-1.chunk"]);
        assert_eq!(summary.bytes_written, fs::metadata(&path).unwrap().len());

        let mapped = MappedChunk::open(&path).unwrap();
        assert_eq!(mapped.view().contents(), chunk.contents());
        assert_eq!(mapped.view().file_checksum(), summary.file_checksum);
        assert_eq!(mapped.path(), path);
        // Same bytes as the in-memory encoder.
        let encoded = crate::encode(&chunk.contents()).unwrap();
        assert_eq!(fs::read(&path).unwrap(), encoded.as_bytes());
        let read = crate::AlignedBuf::read_file(&path).unwrap();
        assert_eq!(
            ChunkView::parse(&read).unwrap().contents(),
            chunk.contents()
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri does not support file-backed memory mappings")]
    fn invalid_contents_leave_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.chunk");
        let chunk = small_full_chunk();
        write_chunk(&path, &chunk.contents()).unwrap();
        let before = fs::read(&path).unwrap();

        let mut broken = chunk.clone();
        broken.masks.as_mut().unwrap()[0] = 0xff;
        let err = write_chunk(&path, &broken.contents()).unwrap_err();
        match &err {
            ChunkFileError::Invalid { path: p, source } => {
                assert_eq!(p, &path);
                assert!(matches!(
                    source,
                    ChunkError::Section {
                        section: SectionKind::MASKS,
                        ..
                    }
                ));
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert!(err.to_string().contains("c.chunk"));
        assert_eq!(fs::read(&path).unwrap(), before);
        assert_eq!(dir_entries(dir.path()), ["c.chunk"]);

        let fresh = dir.path().join("never.chunk");
        assert!(write_chunk(&fresh, &broken.contents()).is_err());
        assert_eq!(dir_entries(dir.path()), ["c.chunk"]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri does not support file-backed memory mappings")]
    fn io_and_format_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.chunk");
        let err = MappedChunk::open(&missing).unwrap_err();
        assert!(matches!(err, ChunkFileError::Io { action: "open", .. }));
        assert!(err.to_string().contains("missing.chunk"), "{err}");

        let junk = dir.path().join("junk.chunk");
        fs::write(
            &junk,
            b"definitely not a chunk file, but long enough?".repeat(4),
        )
        .unwrap();
        let err = MappedChunk::open(&junk).unwrap_err();
        assert!(matches!(
            err,
            ChunkFileError::Invalid {
                source: ChunkError::BadMagic { .. },
                ..
            }
        ));
        assert!(err.to_string().contains("junk.chunk"));

        let empty = dir.path().join("empty.chunk");
        fs::write(&empty, b"").unwrap();
        assert!(matches!(
            MappedChunk::open(&empty),
            Err(ChunkFileError::Invalid {
                source: ChunkError::TooShort { len: 0 },
                ..
            })
        ));

        // Not regular files: refused at once, naming what they are (a FIFO must not block).
        let fifo = dir.path().join("fifo.chunk");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let err = MappedChunk::open(&fifo).unwrap_err();
            assert!(err.to_string().contains("fifo.chunk"), "{err}");
            let cause = std::error::Error::source(&err).unwrap().to_string();
            assert!(
                cause.contains("a FIFO (named pipe), not a regular file"),
                "{cause}"
            );
            assert!(crate::AlignedBuf::read_file(&fifo).is_err());
        }
        let err = MappedChunk::open(dir.path()).unwrap_err();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("a directory, not a regular file"), "{cause}");

        let no_dir = dir.path().join("no/such/dir/c.chunk");
        let err = write_chunk(&no_dir, &small_full_chunk().contents()).unwrap_err();
        assert!(matches!(
            err,
            ChunkFileError::Io {
                action: "create",
                ..
            }
        ));
    }
}
