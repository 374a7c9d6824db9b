//! The chunk directory: `part-NNNNN.chunk` per part, `partition.map`, and `manifest.json`
//! written last. Writing one atomically from a [`ChunkSource`] ([`write_dir`]) under its
//! [`DirLock`], opening it ([`ChunkDir`]: the manifest and the partition map checked, chunks
//! loaded memory-mapped and checked against the manifest), and the cross-chunk rules
//! ([`check_consistency`]).
//!
//! Building the chunks (renumbering, halos, Â's blocks) is the preprocessing's
//! (`distspmm_prep::chunk`); this module only knows a chunk's [`ChunkContents`].

mod manifest;
pub mod partition_map;

use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use rayon::prelude::*;

use crate::workdir::{self, Kind, Stale, WorkDir, WorkDirError};
use crate::{write_chunk, ChunkContents, ChunkView, MappedChunk, Version, FORMAT_VERSION};

use self::partition_map::PartitionMap;
use manifest::encode_hex;
pub use manifest::{
    fingerprint_hex, format_checksum, parse_checksum, Manifest, ManifestChunk, ManifestFile,
    MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, PARTITION_MAP_FILE,
};

/// Writing, opening or validating a chunk directory failed. Messages name the file and, for
/// inconsistencies, the chunk section or header field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkDirError {
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `manifest.json` is missing, not JSON, or breaks its rules.
    #[error("{}: {reason}", path.display())]
    Manifest {
        /// The manifest's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The directory holds a different partition and `force` was not given.
    #[error(
        "{} already holds a different partition ({existing}); pass --force to replace it, \
         or choose another directory",
        dir.display()
    )]
    DifferentPartition {
        /// The directory.
        dir: PathBuf,
        /// What it holds.
        existing: String,
    },
    /// The output directory holds an entry that is not a chunk directory's own file: a writer
    /// of chunk directories replaces its output as a whole and never touches other files.
    #[error(
        "{} holds {}{}, which `distspmm partition` did not write; it replaces its output \
         directory as a whole and never touches other files, so it refuses: give a new or \
         empty directory as --out, or move those files elsewhere (--force replaces only an \
         earlier chunk directory)",
        dir.display(),
        entry.display(),
        and_more(*others)
    )]
    Foreign {
        /// The output directory.
        dir: PathBuf,
        /// Its first foreign entry (in name order).
        entry: PathBuf,
        /// How many more there are.
        others: usize,
    },
    /// Another writer holds the directory's lock (see [`DirLock`]).
    #[error(
        "another `distspmm partition` is writing {} right now (it holds {}): wait for it to \
         finish, or write to another directory",
        dir.display(),
        lock.display()
    )]
    Busy {
        /// The directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// A part outside `0..P` was asked for.
    #[error("part {part} does not exist: the directory has {parts} parts")]
    NoSuchPart {
        /// The part asked for.
        part: u32,
        /// P.
        parts: u32,
    },
    /// A chunk file is unreadable or invalid on its own.
    #[error(transparent)]
    Chunk(#[from] crate::ChunkFileError),
    /// A chunk disagrees with the manifest or with another chunk.
    #[error("{}, {section}: {detail}", file.display())]
    Inconsistent {
        /// The chunk (or map) file at fault.
        file: PathBuf,
        /// The section or header field.
        section: &'static str,
        /// What disagrees.
        detail: String,
    },
    /// The partition map is not a valid one.
    #[error("{}: {reason}", path.display())]
    PartitionMap {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The [`ChunkSource`] failed to build a chunk (its own error: the graph, the
    /// normalisation, the partition, memory).
    #[error(transparent)]
    Build(std::boxed::Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl From<crate::atomic::AtomicWriteError> for ChunkDirError {
    fn from(e: crate::atomic::AtomicWriteError) -> Self {
        ChunkDirError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

impl From<WorkDirError> for ChunkDirError {
    fn from(e: WorkDirError) -> Self {
        ChunkDirError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// ` (and N more entries)` for N > 0.
fn and_more(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " (and 1 more entry)".into(),
        n => std::format!(" (and {n} more entries)"),
    }
}

/// The error for an I/O failure on `path` (every file of this module names its path).
fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ChunkDirError + '_ {
    move |source| ChunkDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// File name of part `p`'s chunk.
pub fn chunk_file_name(p: u32) -> String {
    std::format!("part-{p:05}.chunk")
}

/// What [`write_dir`] writes a directory from: the partition (its map file, method tag,
/// imbalance, renumbered part offsets and fingerprint), counts for the manifest, and each
/// part's chunk, built on demand.
pub trait ChunkSource: Sync {
    /// One part's built chunk.
    type Part;
    /// Parts P.
    fn parts(&self) -> u32;
    /// Nodes N.
    fn nodes(&self) -> u64;
    /// The partition map file's bytes (see [`partition_map`]).
    fn partition_map(&self) -> Vec<u8>;
    /// The partition's method tag.
    fn partition_method(&self) -> &str;
    /// The partition's imbalance (largest part over the mean).
    fn imbalance(&self) -> f64;
    /// The renumbered part offsets (P + 1 values).
    fn part_offsets(&self) -> &[u64];
    /// Part `p`'s halo rows.
    fn halo_rows(&self, p: u32) -> u64;
    /// The partition fingerprint every chunk carries.
    fn fingerprint(&self) -> [u8; 16];
    /// Feature columns (0 without features).
    fn feature_dim(&self) -> u32;
    /// Classes (0 without labels).
    fn num_classes(&self) -> u32;
    /// Non-zeros of Â.
    fn nnz(&self) -> u64;
    /// The graph's directed edge count (when [`WriteOptions::edges`] does not give it).
    fn edges(&self) -> u64;
    /// The partition's edge cut (when [`WriteOptions::edge_cut`] does not give it).
    fn edge_cut(&self) -> Result<u64, ChunkDirError>;
    /// Whether parts may be built at the same time (more memory, less time).
    fn parts_in_parallel(&self) -> bool;
    /// Builds part `p`'s chunk; `scratch` is a work array reused across calls.
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<Self::Part, ChunkDirError>;
    /// The contents of a part built by [`ChunkSource::build_part`].
    fn contents<'a>(&self, part: &'a Self::Part) -> ChunkContents<'a>;
}

/// What [`write_dir`] needs besides the chunks themselves.
#[derive(Clone)]
pub struct WriteOptions<'a> {
    /// Replace a directory that holds a *different* partition (same fingerprint is always fine).
    pub force: bool,
    /// Normalisation of Â, recorded in the manifest (`gcn`, `row`, `none`).
    pub normalization: String,
    /// The command line that made the directory, recorded in the manifest.
    pub command_line: Vec<String>,
    /// The partition's edge cut if the caller has it; [`ChunkSource::edge_cut`] otherwise.
    pub edge_cut: Option<u64>,
    /// Called with the part's number after each chunk is written (from the writing threads).
    pub on_chunk_written: Option<&'a (dyn Fn(u32) + Sync)>,
    /// Time spent building and writing chunks, summed over the parts (they run in parallel).
    pub timings: std::sync::Arc<WriteTimings>,
    /// The graph's directed edge count for the manifest when the caller has released the
    /// graph's edge arrays (chunks need only Â and the node data); the source's otherwise.
    pub edges: Option<u64>,
    /// The directory's lock, if the caller took it already (to hold it over a longer run, as
    /// `distspmm partition` does from the start); otherwise [`write_dir`] takes it.
    pub lock: Option<std::sync::Arc<DirLock>>,
    /// The input graph's content fingerprint, recorded in the manifest as
    /// `graph_fingerprint` when given.
    pub graph_fingerprint: Option<[u8; 16]>,
}

impl std::fmt::Debug for WriteOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteOptions")
            .field("force", &self.force)
            .field("normalization", &self.normalization)
            .field("command_line", &self.command_line)
            .field("edge_cut", &self.edge_cut)
            .field("on_chunk_written", &self.on_chunk_written.is_some())
            .field("timings", &self.timings)
            .field("edges", &self.edges)
            .field("lock", &self.lock)
            .field("graph_fingerprint", &self.graph_fingerprint)
            .finish()
    }
}

/// Seconds [`write_dir`] spent building chunks in memory and writing them, each summed
/// over the parts (which run in parallel, so the sums can exceed the wall time).
#[derive(Debug, Default)]
pub struct WriteTimings {
    build_nanos: std::sync::atomic::AtomicU64,
    write_nanos: std::sync::atomic::AtomicU64,
}

impl WriteTimings {
    /// Seconds spent building chunks, summed over parts.
    pub fn build_seconds(&self) -> f64 {
        self.build_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }

    /// Seconds spent writing chunk files, summed over parts.
    pub fn write_seconds(&self) -> f64 {
        self.write_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }

    fn add(&self, build: std::time::Duration, write: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        // Saturating: 2^64 ns is 584 years.
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.build_nanos.fetch_add(nanos(build), Relaxed);
        self.write_nanos.fetch_add(nanos(write), Relaxed);
    }
}

impl Default for WriteOptions<'_> {
    fn default() -> Self {
        Self {
            force: false,
            normalization: "gcn".into(),
            command_line: Vec::new(),
            edge_cut: None,
            on_chunk_written: None,
            timings: std::sync::Arc::default(),
            edges: None,
            lock: None,
            graph_fingerprint: None,
        }
    }
}

/// The exclusive lock of a chunk directory's writer: an `flock` on `.<name>.lock` beside the
/// directory (not inside it, since the directory itself is replaced), held until dropped. A
/// second writer of the same directory, in this process or another, is refused with
/// [`ChunkDirError::Busy`] instead of mixing its files with the first one's. The lock file stays
/// (removing it would race with a writer that just opened it); the lock goes with the process.
///
/// The directory is resolved once, here: its parent canonical (so `nd/.` or `nd/` is `nd`), and
/// a symbolic link to a directory followed to its target, which is what is written (the link
/// stays a link; the lock, staging and work directories sit beside the target, on its file
/// system).
#[derive(Debug)]
pub struct DirLock {
    file: std::fs::File,
    path: PathBuf,
    /// The locked directory's parent (canonical) and name.
    parent: PathBuf,
    name: std::ffi::OsString,
}

impl DirLock {
    /// Takes the lock of output directory `dir` (creating its parent if needed), or fails at
    /// once if another writer holds it. Under the lock, an existing `dir` is checked before
    /// anything is built: it must be a directory, not a mount point (which cannot be replaced
    /// as a whole), holding nothing but a chunk directory's own files
    /// ([`ChunkDirError::Foreign`] names the first other entry).
    pub fn acquire(dir: &Path) -> Result<Self, ChunkDirError> {
        let (parent, name) = resolve_out(dir)?;
        let mut lock_name = std::ffi::OsString::from(".");
        lock_name.push(&name);
        lock_name.push(".lock");
        let path = parent.join(lock_name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_error(&path))?;
        // SAFETY: `flock` only reads the descriptor, which `file` keeps open for the call.
        let rc = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        if rc != 0 {
            let source = std::io::Error::last_os_error();
            return Err(if source.kind() == std::io::ErrorKind::WouldBlock {
                ChunkDirError::Busy {
                    dir: dir.to_path_buf(),
                    lock: path,
                }
            } else {
                ChunkDirError::Io { path, source }
            });
        }
        let lock = Self {
            file,
            path,
            parent,
            name,
        };
        check_out_dir(&lock.dir())?;
        Ok(lock)
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The locked directory, resolved (see [`DirLock`]): where the chunks are written.
    pub fn dir(&self) -> PathBuf {
        self.parent.join(&self.name)
    }

    /// A fresh work directory `.<name>.<kind>-<pid>` beside the locked directory, after
    /// removing those of the same kind that killed writers left (this lock says none is in
    /// use).
    pub fn work_dir(&self, kind: Kind) -> Result<WorkDir, ChunkDirError> {
        remove_stale(&self.parent, &self.name, kind)?;
        Ok(WorkDir::beside(&self.parent, &self.name, kind)?)
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock anyway; unlocking first makes it prompt even
        // if a forked child inherited the descriptor.
        // SAFETY: as in `acquire`; the descriptor is still open.
        unsafe {
            libc::flock(std::os::fd::AsRawFd::as_raw_fd(&self.file), libc::LOCK_UN);
        }
    }
}

/// `dir`'s parent (`.` for a bare name) and its last component.
fn split_dir(dir: &Path) -> Result<(PathBuf, std::ffi::OsString), ChunkDirError> {
    let name = dir
        .file_name()
        .filter(|n| *n != "." && *n != "..")
        .ok_or_else(|| ChunkDirError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an output directory needs a name of its own (not `.`, `..` or `/`): give e.g. \
                 --out chunks",
            ),
        })?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_os_string()))
}

/// Where output directory `dir` is written: its parent (created if missing, canonical) and its
/// name, or for a symbolic link to a directory the target's (canonical) parent and name.
fn resolve_out(dir: &Path) -> Result<(PathBuf, std::ffi::OsString), ChunkDirError> {
    let (parent, name) = split_dir(dir)?;
    std::fs::create_dir_all(&parent).map_err(io_error(&parent))?;
    let parent = std::fs::canonicalize(&parent).map_err(io_error(&parent))?;
    let path = parent.join(&name);
    let is_link = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok((parent, name));
    }
    let refuse = |detail: String| ChunkDirError::Io {
        path: path.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, detail),
    };
    let target = match std::fs::canonicalize(&path) {
        Ok(target) => target,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let to = std::fs::read_link(&path).unwrap_or_default();
            return Err(refuse(std::format!(
                "it is a symbolic link to {}, which does not exist: create that directory, or \
                 give another --out",
                to.display()
            )));
        }
        Err(e) => return Err(io_error(&path)(e)),
    };
    if !target.is_dir() {
        return Err(refuse(std::format!(
            "it is a symbolic link to {}, which is not a directory: give a directory as --out",
            target.display()
        )));
    }
    split_dir(&target)
}

/// The checks on an existing output directory `dir` (resolved) before anything is built: a
/// directory, not a mount point, and nothing in it but a chunk directory's own files (regular
/// files named as [`is_chunk_dir_file`] says). Nothing is changed.
fn check_out_dir(dir: &Path) -> Result<(), ChunkDirError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(dir)(e)),
    };
    if !meta.is_dir() {
        return Err(ChunkDirError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                std::format!(
                    "exists and is not a directory (it is {}): choose another --out",
                    describe_entry(meta.file_type())
                ),
            ),
        });
    }
    if is_mount_point(dir, &meta) {
        return Err(mount_point(dir));
    }
    let mut foreign = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(is_chunk_dir_file)
            && entry.file_type().map_err(io_error(dir))?.is_file();
        if !ours {
            foreign.push(name);
        }
    }
    foreign.sort();
    match foreign.first() {
        None => Ok(()),
        Some(first) => Err(ChunkDirError::Foreign {
            dir: dir.to_path_buf(),
            entry: dir.join(first),
            others: foreign.len() - 1,
        }),
    }
}

/// What a directory entry that is not a regular file is, for messages.
fn describe_entry(kind: std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a regular file"
    } else {
        crate::describe_file_type(kind)
    }
}

/// Whether directory `dir` (with metadata `meta`) is a mount point: on another device than its
/// parent, or the root of a mount of the same file system (a bind mount; `statx` says so).
fn is_mount_point(dir: &Path, meta: &std::fs::Metadata) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    if std::fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev()) {
        return true;
    }
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `statx` is a plain C struct of integers, for which all zeroes is a valid value.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `buf` a writable `statx` that both
    // outlive the call, which only reads the one and writes the other.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut buf,
        )
    };
    #[allow(
        clippy::cast_sign_loss,
        reason = "a flag constant, a positive bit of the 64-bit attribute words"
    )]
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    rc == 0 && buf.stx_attributes_mask & root != 0 && buf.stx_attributes & root != 0
}

/// The error for an output directory that is a mount point.
fn mount_point(dir: &Path) -> ChunkDirError {
    ChunkDirError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            std::format!(
                "it is a mount point, which cannot be replaced as a whole (a new run is written \
                 beside it and swapped in): give a directory inside it, e.g. --out {}",
                dir.join("chunks").display()
            ),
        ),
    }
}

/// Builds every part's chunk and writes the directory under the directory's [`DirLock`]: the
/// partition map, the chunks (in parallel) and `manifest.json` last go into a fresh staging
/// directory `.<name>.staging-<pid>` beside `dir`, which then replaces `dir` in one atomic
/// exchange (`renameat2(RENAME_EXCHANGE)`). A reader sees the old directory or the new one,
/// never a mix; a crash leaves the old directory intact (and a staging directory whose files
/// the next write removes).
///
/// Only the files a chunk directory is made of (`part-NNNNN.chunk`, `partition.map`,
/// `manifest.json`, and temporaries of these) are ever created, replaced or removed. An existing
/// `dir` that holds anything else is refused before anything is built
/// ([`ChunkDirError::Foreign`], checked by [`DirLock::acquire`]); after the exchange the old
/// run's files are removed by name, and anything else that appeared in `dir` meanwhile stays,
/// in the old directory (now `.<name>.staging-<pid>`), with a warning naming it. `dir` is
/// resolved as [`DirLock`] says (a symbolic link's target is written); a mount point cannot be
/// replaced and is refused.
///
/// If `dir` already holds a manifest of a different partition (another fingerprint), this
/// refuses unless `options.force`; the same fingerprint is always fine. `force` never allows
/// replacing other files.
pub fn write_dir<S: ChunkSource + ?Sized>(
    dir: &Path,
    source: &S,
    options: &WriteOptions<'_>,
) -> Result<Manifest, ChunkDirError> {
    let own_lock;
    let lock = match &options.lock {
        Some(lock) => lock.as_ref(),
        None => {
            own_lock = DirLock::acquire(dir)?;
            &own_lock
        }
    };
    check_replaceable(lock, source.fingerprint(), options.force)?;
    let fingerprint = encode_hex(&source.fingerprint());
    remove_stale(&lock.parent, &lock.name, STAGING)?;
    // Dropped on an error: the files written so far are removed.
    let staging = WorkDir::beside(&lock.parent, &lock.name, STAGING)?;
    let manifest = write_files(staging.path(), source, fingerprint, options)?;
    replace_dir(&lock.dir(), staging)?;
    Ok(manifest)
}

/// Whether the directory `lock` holds may be replaced by a partition of `fingerprint`: it
/// holds none, the same one, or (with `force`) another; and it is a directory.
fn check_replaceable(
    lock: &DirLock,
    fingerprint: [u8; 16],
    force: bool,
) -> Result<(), ChunkDirError> {
    let dir = lock.dir();
    let dir = dir.as_path();
    let fingerprint = encode_hex(&fingerprint);
    let manifest_path = dir.join(MANIFEST_FILE);
    if manifest_path.exists() && !force {
        match read_manifest(&manifest_path) {
            Ok(old) if old.fingerprint == fingerprint => {}
            Ok(old) => {
                return Err(ChunkDirError::DifferentPartition {
                    dir: dir.to_path_buf(),
                    existing: std::format!(
                        "{} parts, {}, fingerprint {}",
                        old.parts,
                        old.partition_method,
                        old.fingerprint
                    ),
                })
            }
            Err(err) => {
                return Err(ChunkDirError::DifferentPartition {
                    dir: dir.to_path_buf(),
                    existing: std::format!("an unreadable manifest ({err})"),
                })
            }
        }
    }
    if dir.exists() && !dir.is_dir() {
        return Err(ChunkDirError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a directory: choose another --out",
            ),
        });
    }
    Ok(())
}

/// Writes the partition map, the chunks and the manifest into the (empty) directory `dir`.
fn write_files<S: ChunkSource + ?Sized>(
    dir: &Path,
    source: &S,
    fingerprint: String,
    options: &WriteOptions<'_>,
) -> Result<Manifest, ChunkDirError> {
    let parts = source.parts();
    let map_bytes = source.partition_map();
    let partition_map = write_map(dir, &map_bytes)?;
    let one = |scratch: &mut Vec<u32>, p: u32| {
        let started = std::time::Instant::now();
        let chunk = source.build_part(p, scratch)?;
        let built = started.elapsed();
        let written = write_part(dir, &source.contents(&chunk))?;
        drop(chunk);
        let write_time = started.elapsed() - built;
        options.timings.add(built, write_time);
        tracing::debug!(
            part = p,
            build_seconds = built.as_secs_f64(),
            write_seconds = write_time.as_secs_f64(),
            bytes = written.0.bytes,
            "chunk written"
        );
        if let Some(on_chunk_written) = &options.on_chunk_written {
            on_chunk_written(p);
        }
        Ok(written)
    };
    let written: Vec<(ManifestChunk, Version)> = if source.parts_in_parallel() {
        (0..parts)
            .into_par_iter()
            .map_init(Vec::new, one)
            .collect::<Result<_, ChunkDirError>>()?
    } else {
        let mut scratch = Vec::new();
        (0..parts)
            .map(|p| one(&mut scratch, p))
            .collect::<Result<_, ChunkDirError>>()?
    };
    let edge_cut = match options.edge_cut {
        Some(cut) => cut,
        None => source.edge_cut()?,
    };
    let facts = DirFacts {
        parts,
        nodes: source.nodes(),
        partition_map: map_bytes,
        partition_method: source.partition_method().into(),
        imbalance: source.imbalance(),
        part_offsets: source.part_offsets().to_vec(),
        fingerprint: source.fingerprint(),
        halo_rows: (0..parts).map(|p| source.halo_rows(p)).collect(),
        feature_dim: source.feature_dim(),
        classes: source.num_classes(),
        nnz: source.nnz(),
        edges: options.edges.unwrap_or_else(|| source.edges()),
        edge_cut,
    };
    debug_assert_eq!(encode_hex(&facts.fingerprint), fingerprint);
    write_manifest(dir, &facts, partition_map, written, options)
}

/// Writes the partition map file's `bytes` into `dir`; returns its manifest entry.
fn write_map(dir: &Path, bytes: &[u8]) -> Result<ManifestFile, ChunkDirError> {
    crate::atomic::write_atomically(dir.join(PARTITION_MAP_FILE), bytes)?;
    Ok(ManifestFile {
        file: PARTITION_MAP_FILE.into(),
        bytes: bytes.len() as u64,
        checksum: format_checksum(xxhash_rust::xxh3::xxh3_64(bytes)),
    })
}

/// Writes one part's chunk into the directory `dir` under its part's file name
/// ([`chunk_file_name`]); returns its manifest entry and its format version.
pub fn write_part(
    dir: &Path,
    contents: &ChunkContents<'_>,
) -> Result<(ManifestChunk, Version), ChunkDirError> {
    let file = chunk_file_name(contents.part_id);
    let summary = write_chunk(dir.join(&file), contents)?;
    let nnz: u64 = contents
        .blocks
        .iter()
        .map(|b| b.csr_vals.len() as u64)
        .sum();
    let entry = ManifestChunk {
        part: contents.part_id,
        file,
        bytes: summary.bytes_written,
        checksum: format_checksum(summary.file_checksum),
        nodes: contents.original_ids.len() as u64,
        nnz,
    };
    Ok((entry, contents.version()))
}

/// What a chunk directory's manifest records besides its files and the options: what a
/// [`ChunkSource`] tells, for a directory whose chunks several processes wrote
/// ([`SharedWrite`]).
#[derive(Debug, Clone)]
pub struct DirFacts {
    /// Parts P.
    pub parts: u32,
    /// Nodes N.
    pub nodes: u64,
    /// The partition map file's bytes ([`partition_map::encode`]).
    pub partition_map: Vec<u8>,
    /// The partition's method tag.
    pub partition_method: String,
    /// The partition's imbalance (largest part over the mean).
    pub imbalance: f64,
    /// The renumbered part offsets (P + 1 values).
    pub part_offsets: Vec<u64>,
    /// The partition fingerprint every chunk carries.
    pub fingerprint: [u8; 16],
    /// Every part's halo rows.
    pub halo_rows: Vec<u64>,
    /// Feature columns.
    pub feature_dim: u32,
    /// Classes.
    pub classes: u32,
    /// Non-zeros of Â.
    pub nnz: u64,
    /// Directed edges of the input.
    pub edges: u64,
    /// The partition's edge cut.
    pub edge_cut: u64,
}

/// Seals and writes the manifest of the directory `dir` holding the map and the chunks
/// `written` (one per part, in part order).
fn write_manifest(
    dir: &Path,
    facts: &DirFacts,
    partition_map: ManifestFile,
    written: Vec<(ManifestChunk, Version)>,
    options: &WriteOptions<'_>,
) -> Result<Manifest, ChunkDirError> {
    let manifest_path = dir.join(MANIFEST_FILE);
    // The chunks' own version (1.0 without edge weights): one source writes all its chunks
    // with or all without them, and `ChunkDir::open` checks every header against it.
    let chunk_format_version = written
        .iter()
        .map(|(_, version)| *version)
        .max()
        .unwrap_or(FORMAT_VERSION);
    let chunks: Vec<ManifestChunk> = written.into_iter().map(|(entry, _)| entry).collect();
    let mut manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        format_version: MANIFEST_VERSION,
        chunk_format_version: chunk_format_version.to_string(),
        distspmm_version: env!("CARGO_PKG_VERSION").into(),
        parts: facts.parts,
        nodes: facts.nodes,
        edges: facts.edges,
        nnz: facts.nnz,
        feature_dim: facts.feature_dim,
        classes: facts.classes,
        normalization: options.normalization.clone(),
        partition_method: facts.partition_method.clone(),
        fingerprint: encode_hex(&facts.fingerprint),
        graph_fingerprint: options.graph_fingerprint.as_ref().map(|f| encode_hex(f)),
        part_offsets: facts.part_offsets.clone(),
        edge_cut: facts.edge_cut,
        max_imbalance: facts.imbalance,
        halo_rows: facts.halo_rows.clone(),
        partition_map,
        chunks,
        command_line: options.command_line.clone(),
        checksum: String::new(),
    };
    let json = manifest.seal().map_err(|reason| ChunkDirError::Manifest {
        path: manifest_path.clone(),
        reason,
    })?;
    crate::atomic::write_atomically(&manifest_path, &json)?;
    Ok(manifest)
}

/// A chunk directory written by several processes that share a file system (the ranks of a
/// distributed `partition`): the process holding the directory's [`DirLock`] creates the
/// staging directory ([`SharedWrite::begin`]), every process writes its parts' chunks into
/// [`SharedWrite::path`] ([`write_part`]), and once all succeeded the lock holder checks the
/// directory may be replaced, writes the map and the manifest and puts the directory in place
/// ([`SharedWrite::commit`]), as [`write_dir`] does. Dropped without a commit, the staging
/// directory's files are removed and the previous directory stays as it was.
#[derive(Debug)]
pub struct SharedWrite {
    staging: WorkDir,
}

impl SharedWrite {
    /// Creates the staging directory beside the directory `lock` holds (after removing those
    /// killed writers left). Whether the directory may be replaced is checked by
    /// [`SharedWrite::commit`], once the partition is known.
    pub fn begin(lock: &DirLock) -> Result<Self, ChunkDirError> {
        remove_stale(&lock.parent, &lock.name, STAGING)?;
        Ok(Self {
            staging: WorkDir::beside(&lock.parent, &lock.name, STAGING)?,
        })
    }

    /// Where every process writes its chunks.
    pub fn path(&self) -> &Path {
        self.staging.path()
    }

    /// Checks that the directory `lock` holds may be replaced by this partition (a different
    /// one only with `options.force`), writes the partition map and the manifest for `facts`
    /// and the chunks `written` (every part's, in part order, as [`write_part`] returned them),
    /// then replaces the directory.
    pub fn commit(
        self,
        lock: &DirLock,
        facts: &DirFacts,
        written: Vec<(ManifestChunk, Version)>,
        options: &WriteOptions<'_>,
    ) -> Result<Manifest, ChunkDirError> {
        check_replaceable(lock, facts.fingerprint, options.force)?;
        let parts = facts.parts;
        if written.len() != parts as usize
            || written
                .iter()
                .enumerate()
                .any(|(p, (c, _))| c.part as usize != p)
        {
            return Err(ChunkDirError::Manifest {
                path: lock.dir().join(MANIFEST_FILE),
                reason: std::format!("{} chunks written for {parts} parts", written.len()),
            });
        }
        let map = write_map(self.staging.path(), &facts.partition_map)?;
        let manifest = write_manifest(self.staging.path(), facts, map, written, options)?;
        replace_dir(&lock.dir(), self.staging)?;
        Ok(manifest)
    }
}

/// The staging directory's kind, `.<name>.staging-<pid>`: a chunk directory's own files.
const STAGING: Kind = Kind {
    name: "staging",
    owns: is_chunk_dir_file,
};

/// Removes the directories `.<name>.<kind>-<pid>` (staging or bucket directories) that killed
/// writers of `parent/name` left (the caller holds the directory's lock, so no live writer owns
/// one): their own files, then the directory unless something else is in it.
fn remove_stale(parent: &Path, name: &std::ffi::OsStr, kind: Kind) -> Result<(), ChunkDirError> {
    Ok(workdir::remove_stale(parent, name, kind, Stale::All)?)
}

/// Whether `name` is one of a chunk directory's own files (`manifest.json`, `partition.map`,
/// `part-NNNNN.chunk`) or a temporary of one that an atomic write leaves when it is killed:
/// the only names a chunk directory's writer creates, replaces or removes.
fn is_chunk_dir_file(name: &str) -> bool {
    let own = |file: &str| {
        file == MANIFEST_FILE
            || file == PARTITION_MAP_FILE
            || workdir::numbered(file, "part-", ".chunk")
    };
    own(name) || crate::atomic::temporary_of(name).is_some_and(|(file, _)| own(file))
}

/// Puts the complete directory `staging` in place of `dir`: a plain rename if `dir` does not
/// exist; otherwise the two directories are exchanged atomically and the old run's files are
/// removed by name. Whatever else is in the old directory (it appeared in `dir` during the run)
/// stays there, under the staging name, with a warning.
fn replace_dir(dir: &Path, staging: WorkDir) -> Result<(), ChunkDirError> {
    if !dir.exists() {
        std::fs::rename(staging.path(), dir).map_err(io_error(dir))?;
        staging.keep();
        return Ok(crate::atomic::sync_parent_dir(dir)?);
    }
    let old = staging.path().to_path_buf();
    match exchange(&old, dir) {
        Ok(()) => {}
        // A file system without RENAME_EXCHANGE: step aside, then rename. A reader in between
        // finds no directory (and says so), never a mix.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            let mut aside = old.as_os_str().to_os_string();
            aside.push(".old");
            let aside = PathBuf::from(aside);
            std::fs::rename(dir, &aside).map_err(io_error(dir))?;
            std::fs::rename(&old, dir).map_err(io_error(dir))?;
            std::fs::rename(&aside, &old).map_err(io_error(&old))?;
        }
        // A mount point (or a directory in use as one) cannot be renamed.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(mount_point(dir)),
        Err(source) => {
            return Err(ChunkDirError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    crate::atomic::sync_parent_dir(dir)?;
    // `staging` now holds the old run; the new one is in place whatever happens below.
    match staging.remove() {
        Ok(kept) => {
            if let Some(first) = kept.first() {
                tracing::warn!(
                    "{} that distspmm did not write appeared in {} while it ran (the first: \
                     {}); they were left untouched with the previous run's directory, now {}: \
                     move them where you need them",
                    workdir::entries(kept.len()),
                    dir.display(),
                    Path::new(first).display(),
                    old.display()
                );
            }
        }
        Err(err) => tracing::warn!(
            path = %err.path.display(),
            err = %err.source,
            "cannot remove the previous run's chunk files"
        ),
    }
    Ok(())
}

/// Exchanges two paths atomically (`renameat2` with `RENAME_EXCHANGE`, Linux 3.15+).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both paths are valid NUL-terminated strings that live across the call; the
    // syscall only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub use crate::atomic::stale_temporary_of;

fn read_manifest(path: &Path) -> Result<Manifest, ChunkDirError> {
    let bytes = crate::read_regular(path).map_err(io_error(path))?;
    Manifest::from_json(&bytes).map_err(|reason| ChunkDirError::Manifest {
        path: path.to_path_buf(),
        reason,
    })
}

/// An opened chunk directory whose manifest has been read and checked.
#[derive(Debug, Clone)]
pub struct ChunkDir {
    dir: PathBuf,
    manifest: Manifest,
    fingerprint: [u8; 16],
}

impl ChunkDir {
    /// Reads and validates `dir/manifest.json`, and checks the saved partition map against it
    /// (see [`ChunkDir::read_partition_map`]): the one rule every command that opens a chunk
    /// directory follows, so a deleted, replaced or corrupted `partition.map` is found by all
    /// of them. A directory without a manifest was never completely written (or is not a chunk
    /// directory).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ChunkDirError> {
        let dir = dir.as_ref();
        let path = dir.join(MANIFEST_FILE);
        if !dir.is_dir() {
            return Err(ChunkDirError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    if dir.exists() {
                        "not a directory: give the directory `distspmm partition --out` wrote"
                    } else {
                        "no such directory: give the directory `distspmm partition --out` wrote"
                    },
                ),
            });
        }
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(ChunkDirError::Manifest {
                path,
                reason: "missing: the directory was never completely written; \
                         re-run `distspmm partition`"
                    .into(),
            });
        }
        let manifest = read_manifest(&path)?;
        let fingerprint =
            manifest
                .fingerprint_bytes()
                .map_err(|reason| ChunkDirError::Manifest {
                    path: path.clone(),
                    reason,
                })?;
        let opened = Self {
            dir: dir.to_path_buf(),
            manifest,
            fingerprint,
        };
        opened.read_partition_map()?;
        Ok(opened)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Parts P.
    pub fn parts(&self) -> u32 {
        self.manifest.parts
    }

    /// The partition fingerprint.
    pub fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint
    }

    /// Path of part `p`'s chunk file.
    pub fn chunk_path(&self, p: u32) -> Result<PathBuf, ChunkDirError> {
        let entry =
            self.manifest
                .chunks
                .get(p as usize)
                .ok_or_else(|| ChunkDirError::NoSuchPart {
                    part: p,
                    parts: self.parts(),
                })?;
        Ok(self.dir.join(&entry.file))
    }

    /// Reads the saved partition map, checking its length and checksum against the manifest
    /// and its fingerprint against the chunks'.
    pub fn read_partition_map(&self) -> Result<PartitionMap, ChunkDirError> {
        let entry = &self.manifest.partition_map;
        let path = self.dir.join(&entry.file);
        let bytes = crate::read_regular(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ChunkDirError::Inconsistent {
                    file: path.clone(),
                    section: "partition map",
                    detail: "missing, but the manifest lists it: the directory is incomplete; \
                             re-run `distspmm partition`"
                        .into(),
                }
            } else {
                ChunkDirError::Io {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        if bytes.len() as u64 != entry.bytes || Some(sum) != parse_checksum(&entry.checksum) {
            return Err(ChunkDirError::Inconsistent {
                file: path,
                section: "partition map",
                detail: std::format!(
                    "length {} and checksum {} do not match the manifest's {} and {}: the file \
                     was replaced or corrupted after the manifest was written; re-run \
                     `distspmm partition`",
                    bytes.len(),
                    format_checksum(sum),
                    entry.bytes,
                    entry.checksum
                ),
            });
        }
        let map = PartitionMap::parse(&bytes).map_err(|reason| ChunkDirError::PartitionMap {
            path: path.clone(),
            reason,
        })?;
        if map.fingerprint() != self.fingerprint {
            return Err(ChunkDirError::Inconsistent {
                file: path,
                section: "partition map",
                detail: "its fingerprint is not the directory's".into(),
            });
        }
        Ok(map)
    }

    /// Maps and fully validates part `p`'s chunk, then checks it against the manifest:
    /// fingerprint, part id, P, N, part offsets, feature dim, classes, length and whole-file
    /// checksum.
    pub fn load(&self, p: u32) -> Result<MappedChunk, ChunkDirError> {
        let path = self.chunk_path(p)?;
        let entry = &self.manifest.chunks[p as usize];
        let chunk = MappedChunk::open(&path)?;
        let view = chunk.view();
        let h = view.header();
        let m = &self.manifest;
        let bad = |section: &'static str, detail: String| ChunkDirError::Inconsistent {
            file: path.clone(),
            section,
            detail,
        };
        if h.fingerprint != self.fingerprint {
            return Err(bad(
                "header.fingerprint",
                std::format!(
                    "fingerprint {} is not the directory's {}: the chunk belongs to another \
                     partition run",
                    encode_hex(&h.fingerprint),
                    m.fingerprint
                ),
            ));
        }
        if h.part_id != p || h.num_parts != m.parts {
            return Err(bad(
                "header.part_id",
                std::format!(
                    "chunk is part {} of {}, the manifest lists it as part {p} of {}",
                    h.part_id,
                    h.num_parts,
                    m.parts
                ),
            ));
        }
        if h.num_global_nodes != m.nodes {
            return Err(bad(
                "header.num_global_nodes",
                std::format!(
                    "{} nodes, the manifest says {}",
                    h.num_global_nodes,
                    m.nodes
                ),
            ));
        }
        if view.part_offsets() != m.part_offsets.as_slice() {
            return Err(bad(
                "PART_OFFSETS",
                "part offsets differ from the manifest's".into(),
            ));
        }
        if h.feature_dim != m.feature_dim || h.num_classes != m.classes {
            return Err(bad(
                "header.feature_dim",
                std::format!(
                    "F = {}, C = {}; the manifest says F = {}, C = {}",
                    h.feature_dim,
                    h.num_classes,
                    m.feature_dim,
                    m.classes
                ),
            ));
        }
        let want = parse_checksum(&entry.checksum);
        if Some(h.file_checksum) != want || chunk.len() as u64 != entry.bytes {
            return Err(bad(
                "header.file_checksum",
                std::format!(
                    "checksum {} and length {} do not match the manifest's {} and {}: the file \
                     was replaced after the manifest was written",
                    format_checksum(h.file_checksum),
                    chunk.len(),
                    entry.checksum,
                    entry.bytes
                ),
            ));
        }
        if h.num_halo_rows != m.halo_rows[p as usize] || h.nnz != entry.nnz {
            return Err(bad(
                "header.num_halo_rows",
                std::format!(
                    "H = {}, nnz = {}; the manifest says H = {}, nnz = {}",
                    h.num_halo_rows,
                    h.nnz,
                    m.halo_rows[p as usize],
                    entry.nnz
                ),
            ));
        }
        Ok(chunk)
    }
}

/// Cross-chunk rules for the P chunks of one run, given in part order with their paths (for
/// the error): the same P, N, fingerprint, part offsets, F and C everywhere; chunk p is part p;
/// Σ n_p = N; every block's column count equals the rows received from its source; and what q
/// sends p is exactly what p receives from q.
pub fn check_consistency(chunks: &[(&Path, &ChunkView<'_>)]) -> Result<(), ChunkDirError> {
    let Some(&(first_path, first)) = chunks.first() else {
        return Err(ChunkDirError::Inconsistent {
            file: PathBuf::new(),
            section: "chunks",
            detail: "no chunks given".into(),
        });
    };
    let bad = |path: &Path, section: &'static str, detail: String| ChunkDirError::Inconsistent {
        file: path.to_path_buf(),
        section,
        detail,
    };
    let h0 = first.header();
    if first.num_parts() != chunks.len() {
        return Err(bad(
            first_path,
            "header.num_parts",
            std::format!(
                "P = {} but {} chunks are given",
                first.num_parts(),
                chunks.len()
            ),
        ));
    }
    let mut total = 0u64;
    for (p, &(path, view)) in chunks.iter().enumerate() {
        let h = view.header();
        if view.part_id() != p {
            return Err(bad(
                path,
                "header.part_id",
                std::format!("expected part {p}, found part {}", view.part_id()),
            ));
        }
        if h.fingerprint != h0.fingerprint {
            return Err(bad(
                path,
                "header.fingerprint",
                std::format!(
                    "fingerprint {} differs from {}'s {}: chunks of different partition runs \
                     are mixed",
                    encode_hex(&h.fingerprint),
                    first_path.display(),
                    encode_hex(&h0.fingerprint)
                ),
            ));
        }
        if (
            h.num_parts,
            h.num_global_nodes,
            h.feature_dim,
            h.num_classes,
        ) != (
            h0.num_parts,
            h0.num_global_nodes,
            h0.feature_dim,
            h0.num_classes,
        ) {
            return Err(bad(
                path,
                "header",
                std::format!("P, N, F or C differs from {}", first_path.display()),
            ));
        }
        if view.part_offsets() != first.part_offsets() {
            return Err(bad(
                path,
                "PART_OFFSETS",
                std::format!("part offsets differ from {}'s", first_path.display()),
            ));
        }
        total += view.num_local_nodes() as u64;
        for block in view.blocks() {
            let q = block.src_part as usize;
            let expected = if q == p {
                view.num_local_nodes()
            } else {
                view.halo_recv(q).len()
            };
            if block.ncols != expected {
                return Err(bad(
                    path,
                    "BLOCK_COL_OFFSETS",
                    std::format!(
                        "block from part {q} has {} columns, expected {expected}",
                        block.ncols
                    ),
                ));
            }
        }
        for (q, &(q_path, q_view)) in chunks.iter().enumerate() {
            if q != p && q_view.halo_send(p) != view.halo_recv(q) {
                return Err(bad(
                    q_path,
                    "HALO_SEND",
                    std::format!(
                        "the rows part {q} sends part {p} differ from the rows {} receives \
                         from part {q} (HALO_RECV)",
                        path.display()
                    ),
                ));
            }
        }
    }
    if total != h0.num_global_nodes {
        return Err(bad(
            first_path,
            "header.num_global_nodes",
            std::format!(
                "the parts hold {total} nodes together, not N = {}",
                h0.num_global_nodes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_is_named_by_its_canonical_parent_and_its_own_name() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        for given in ["nd/.", "nd/", "nd", "x/../nd"] {
            std::fs::create_dir_all(tmp.path().join("x")).unwrap();
            let (parent, name) = resolve_out(&tmp.path().join(given)).unwrap();
            assert_eq!(
                (parent.as_path(), name.to_str().unwrap()),
                (root.as_path(), "nd"),
                "{given}"
            );
        }
        // A link to a directory names the target; the link stays.
        let target = tmp.path().join("real");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("link")).unwrap();
        let (parent, name) = resolve_out(&tmp.path().join("link")).unwrap();
        assert_eq!(parent.join(name), root.join("real"));
        for bad in [".", "..", "/"] {
            assert!(resolve_out(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_points_are_recognised() {
        let proc_root = Path::new("/proc");
        let mounted = std::fs::read_to_string("/proc/self/mounts")
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some("/proc")));
        if mounted {
            let meta = std::fs::symlink_metadata(proc_root).unwrap();
            assert!(is_mount_point(proc_root, &meta));
            let message = std::format!("{}", mount_point(proc_root));
            assert!(message.contains("give a directory inside it, e.g. --out /proc/chunks"));
        }
        let tmp = tempfile::tempdir().unwrap();
        let sub = tmp.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(!is_mount_point(
            &sub,
            &std::fs::symlink_metadata(&sub).unwrap()
        ));
    }
}
