//! A chunk directory: `part-NNNNN.chunk` per part, `partition.map`, and `manifest.json` written
//! last. Writing it ([`write_chunk_dir`]), opening it ([`ChunkDir`]), validating it across
//! chunks, and reassembling Â from it.

use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use chunk_format::{write_chunk, ChunkView, MappedChunk, Version, FORMAT_VERSION};
use rayon::prelude::*;

use crate::index;
use crate::partition::{sync_parent_dir, write_atomically, Adjacency, Partition};
use crate::sparse::CsrOwned;
use crate::workdir::{self, Kind, Stale, WorkDir};

use super::manifest::{
    encode_hex, format_checksum, parse_checksum, Manifest, ManifestChunk, ManifestFile,
    MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, PARTITION_MAP_FILE,
};
use super::{io_error, ChunkBuilder, ChunkDirError, HaloLists, PartChunk};
use crate::partition::Renumbering;

/// File name of part `p`'s chunk.
pub fn chunk_file_name(p: u32) -> String {
    std::format!("part-{p:05}.chunk")
}

/// What [`write_chunk_dir`] builds the chunks from: [`ChunkBuilder`] (the whole Â in memory,
/// parts built in parallel) or [`BoundedBuilder`](super::BoundedBuilder) (one part's rows at a
/// time). Both give the same chunks.
pub trait PartChunkBuilder: Sync {
    /// The partition.
    fn partition(&self) -> &Partition;
    /// Its renumbering.
    fn renumbering(&self) -> &Renumbering;
    /// The halo lists of every part.
    fn halo(&self) -> &HaloLists;
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
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<PartChunk, ChunkDirError>;
}

impl PartChunkBuilder for ChunkBuilder<'_> {
    fn partition(&self) -> &Partition {
        ChunkBuilder::partition(self)
    }
    fn renumbering(&self) -> &Renumbering {
        ChunkBuilder::renumbering(self)
    }
    fn halo(&self) -> &HaloLists {
        ChunkBuilder::halo(self)
    }
    fn fingerprint(&self) -> [u8; 16] {
        ChunkBuilder::fingerprint(self)
    }
    fn feature_dim(&self) -> u32 {
        ChunkBuilder::feature_dim(self)
    }
    fn num_classes(&self) -> u32 {
        ChunkBuilder::num_classes(self)
    }
    fn nnz(&self) -> u64 {
        ChunkBuilder::nnz(self)
    }
    fn edges(&self) -> u64 {
        self.graph().num_edges() as u64
    }
    fn edge_cut(&self) -> Result<u64, ChunkDirError> {
        let g = self.graph();
        let adjacency = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst)?;
        Ok(ChunkBuilder::partition(self).edge_cut(&adjacency)?)
    }
    fn parts_in_parallel(&self) -> bool {
        true
    }
    fn build_part(&self, p: u32, scratch: &mut Vec<u32>) -> Result<PartChunk, ChunkDirError> {
        let chunk = self.build_with_scratch(p, scratch);
        // After the reads of the node data: a mapped input that changed under them is refused.
        self.graph()
            .check_unchanged()
            .map_err(super::ChunkBuildError::from)?;
        Ok(chunk)
    }
}

/// What [`write_chunk_dir`] needs besides the chunks themselves.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Replace a directory that holds a *different* partition (same fingerprint is always fine).
    pub force: bool,
    /// Normalisation of Â, recorded in the manifest (`gcn`, `row`, `none`).
    pub normalization: String,
    /// The command line that made the directory, recorded in the manifest.
    pub command_line: Vec<String>,
    /// The partition's edge cut if the caller has it (from [`Partition::edge_cut`]); computed
    /// from the graph's edges otherwise.
    pub edge_cut: Option<u64>,
    /// Advanced by one per chunk written.
    pub progress: indicatif::ProgressBar,
    /// Time spent building and writing chunks, summed over the parts (they run in parallel).
    pub timings: std::sync::Arc<WriteTimings>,
    /// The graph's directed edge count for the manifest when the caller has released the
    /// graph's edge arrays (chunks need only Â and the node data); the graph's own otherwise.
    pub edges: Option<u64>,
    /// The directory's lock, if the caller took it already (to hold it over a longer run, as
    /// `distspmm partition` does from the start); otherwise [`write_chunk_dir`] takes it.
    pub lock: Option<std::sync::Arc<DirLock>>,
    /// The input graph's content fingerprint (`Graph::fingerprint`), recorded in the manifest
    /// as `graph_fingerprint` when given.
    pub graph_fingerprint: Option<[u8; 16]>,
}

/// Seconds [`write_chunk_dir`] spent building chunks in memory and writing them, each summed
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

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            force: false,
            normalization: "gcn".into(),
            command_line: Vec::new(),
            edge_cut: None,
            progress: indicatif::ProgressBar::hidden(),
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

    /// A fresh work directory `.<name>.buckets-<pid>` beside the locked directory, after
    /// removing those that killed writers left (this lock says none is in use).
    pub(super) fn scratch_dir(&self) -> Result<WorkDir, ChunkDirError> {
        remove_stale(&self.parent, &self.name, BUCKETS)?;
        Ok(WorkDir::beside(&self.parent, &self.name, BUCKETS)?)
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
        chunk_format::describe_file_type(kind)
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
pub fn write_chunk_dir(
    dir: &Path,
    builder: &(impl PartChunkBuilder + ?Sized),
    options: &WriteOptions,
) -> Result<Manifest, ChunkDirError> {
    let own_lock;
    let lock = match &options.lock {
        Some(lock) => lock.as_ref(),
        None => {
            own_lock = DirLock::acquire(dir)?;
            &own_lock
        }
    };
    let dir = lock.dir();
    let dir = dir.as_path();
    let partition = builder.partition();
    let fingerprint = encode_hex(&builder.fingerprint());
    let manifest_path = dir.join(MANIFEST_FILE);
    if manifest_path.exists() && !options.force {
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
    remove_stale(&lock.parent, &lock.name, STAGING)?;
    // Dropped on an error: the files written so far are removed.
    let staging = WorkDir::beside(&lock.parent, &lock.name, STAGING)?;
    let manifest = write_files(staging.path(), builder, partition, fingerprint, options)?;
    replace_dir(dir, staging)?;
    Ok(manifest)
}

/// Writes the partition map, the chunks and the manifest into the (empty) directory `dir`.
fn write_files(
    dir: &Path,
    builder: &(impl PartChunkBuilder + ?Sized),
    partition: &Partition,
    fingerprint: String,
    options: &WriteOptions,
) -> Result<Manifest, ChunkDirError> {
    let parts = partition.parts();
    let manifest_path = dir.join(MANIFEST_FILE);
    let map_bytes = partition.to_map_bytes();
    write_atomically(&dir.join(PARTITION_MAP_FILE), &map_bytes)?;
    let partition_map = ManifestFile {
        file: PARTITION_MAP_FILE.into(),
        bytes: map_bytes.len() as u64,
        checksum: format_checksum(xxhash_rust::xxh3::xxh3_64(&map_bytes)),
    };
    drop(map_bytes);

    options.progress.set_length(u64::from(parts));
    let one = |scratch: &mut Vec<u32>, p: u32| {
        let started = std::time::Instant::now();
        let chunk = builder.build_part(p, scratch)?;
        let built = started.elapsed();
        let file = chunk_file_name(p);
        let contents = chunk.contents();
        let summary = write_chunk(dir.join(&file), &contents)?;
        let version = contents.version();
        drop(contents);
        let written = started.elapsed() - built;
        options.timings.add(built, written);
        tracing::debug!(
            part = p,
            build_seconds = built.as_secs_f64(),
            write_seconds = written.as_secs_f64(),
            bytes = summary.bytes_written,
            "chunk written"
        );
        options.progress.inc(1);
        let entry = ManifestChunk {
            part: p,
            file,
            bytes: summary.bytes_written,
            checksum: format_checksum(summary.file_checksum),
            nodes: chunk.num_local_nodes() as u64,
            nnz: chunk.nnz() as u64,
        };
        Ok((entry, version))
    };
    let written: Vec<(ManifestChunk, Version)> = if builder.parts_in_parallel() {
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
    // The chunks' own version (1.0 without edge weights): one builder writes all its chunks
    // with or all without them, and `ChunkDir::open` checks every header against it.
    let chunk_format_version = written
        .iter()
        .map(|(_, version)| *version)
        .max()
        .unwrap_or(FORMAT_VERSION);
    let chunks: Vec<ManifestChunk> = written.into_iter().map(|(entry, _)| entry).collect();

    let edge_cut = match options.edge_cut {
        Some(cut) => cut,
        None => builder.edge_cut()?,
    };
    let mut manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        format_version: MANIFEST_VERSION,
        chunk_format_version: chunk_format_version.to_string(),
        distspmm_version: env!("CARGO_PKG_VERSION").into(),
        parts,
        nodes: partition.num_nodes() as u64,
        edges: options.edges.unwrap_or_else(|| builder.edges()),
        nnz: builder.nnz(),
        feature_dim: builder.feature_dim(),
        classes: builder.num_classes(),
        normalization: options.normalization.clone(),
        partition_method: partition.method().into(),
        fingerprint,
        graph_fingerprint: options.graph_fingerprint.as_ref().map(|f| encode_hex(f)),
        part_offsets: builder.renumbering().offsets().to_vec(),
        edge_cut,
        max_imbalance: partition.imbalance(),
        halo_rows: (0..parts as usize)
            .map(|p| builder.halo().halo_rows(p))
            .collect(),
        partition_map,
        chunks,
        command_line: options.command_line.clone(),
        checksum: String::new(),
    };
    let json = manifest.seal().map_err(|reason| ChunkDirError::Manifest {
        path: manifest_path.clone(),
        reason,
    })?;
    write_atomically(&manifest_path, &json)?;
    Ok(manifest)
}

/// The staging directory's kind, `.<name>.staging-<pid>`: a chunk directory's own files.
const STAGING: Kind = Kind {
    name: "staging",
    owns: is_chunk_dir_file,
};
/// The bounded builder's work directory's kind, `.<name>.buckets-<pid>`: its bucket and rows
/// files, and the parked edge arrays.
const BUCKETS: Kind = Kind {
    name: "buckets",
    owns: |name| super::bounded::is_work_file(name) || super::park::is_work_file(name),
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
    own(name) || chunk_format::atomic::temporary_of(name).is_some_and(|(file, _)| own(file))
}

/// Puts the complete directory `staging` in place of `dir`: a plain rename if `dir` does not
/// exist; otherwise the two directories are exchanged atomically and the old run's files are
/// removed by name. Whatever else is in the old directory (it appeared in `dir` during the run)
/// stays there, under the staging name, with a warning.
fn replace_dir(dir: &Path, staging: WorkDir) -> Result<(), ChunkDirError> {
    if !dir.exists() {
        std::fs::rename(staging.path(), dir).map_err(io_error(dir))?;
        staging.keep();
        return sync_parent_dir(dir).map_err(ChunkDirError::from);
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
    sync_parent_dir(dir)?;
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

pub use chunk_format::atomic::stale_temporary_of;

fn read_manifest(path: &Path) -> Result<Manifest, ChunkDirError> {
    let bytes = chunk_format::read_regular(path).map_err(io_error(path))?;
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
    /// (see [`ChunkDir::load_partition`]): the one rule every command that opens a chunk
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
        opened.load_partition()?;
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

    /// Reads the saved partition map, checking its length and checksum against the manifest
    /// and its fingerprint against the chunks'.
    pub fn load_partition(&self) -> Result<Partition, ChunkDirError> {
        let entry = &self.manifest.partition_map;
        let path = self.dir.join(&entry.file);
        let bytes = chunk_format::read_regular(&path).map_err(|source| {
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
        let partition = Partition::from_map_bytes(&bytes, &path)?;
        if partition.fingerprint() != self.fingerprint {
            return Err(ChunkDirError::Inconsistent {
                file: path,
                section: "partition map",
                detail: "its fingerprint is not the directory's".into(),
            });
        }
        Ok(partition)
    }

    /// Loads and validates every chunk, then checks them together: the cross-chunk rules of
    /// [`check_consistency`], that chunk p's original ids are exactly part p's nodes of the
    /// saved partition map, in order, and that every manifest field the chunks and the map can
    /// vouch for agrees with them ([`ChunkDir::check_manifest_fields`]). Returns the mapped
    /// chunks.
    pub fn validate_all(&self) -> Result<Vec<MappedChunk>, ChunkDirError> {
        let chunks: Vec<MappedChunk> = (0..self.parts())
            .map(|p| self.load(p))
            .collect::<Result<_, _>>()?;
        let views: Vec<(&Path, &ChunkView<'_>)> =
            chunks.iter().map(|c| (c.path(), c.view())).collect();
        check_consistency(&views)?;
        let partition = self.load_partition()?;
        let renumbering = partition.renumbering();
        if renumbering.offsets() != self.manifest.part_offsets.as_slice() {
            return Err(ChunkDirError::Inconsistent {
                file: self.dir.join(&self.manifest.partition_map.file),
                section: "partition map",
                detail: "its part sizes do not match the manifest's part offsets".into(),
            });
        }
        for (p, (path, view)) in views.iter().enumerate() {
            let nodes = renumbering.part_nodes(index::id(p));
            if !view
                .original_ids()
                .iter()
                .zip(nodes)
                .all(|(&a, &b)| a == u64::from(b))
            {
                return Err(ChunkDirError::Inconsistent {
                    file: path.to_path_buf(),
                    section: "ORIGINAL_IDS",
                    detail: std::format!(
                        "the original ids are not part {p}'s nodes of the partition map"
                    ),
                });
            }
        }
        self.check_manifest_fields(&views, &partition)?;
        Ok(chunks)
    }

    /// The manifest fields that [`ChunkDir::load`] does not check against one chunk, checked
    /// against all of them and the partition map: `chunk_format_version` (every header's
    /// version), `partition_method` and `max_imbalance` (the map's), `nnz` (the chunks' sum),
    /// `edge_cut` (recounted from Â's cross-part entries), `edges` (at least Â's off-diagonal
    /// entries — every one comes from an edge — or all of them without normalisation), and
    /// `normalization` (one of `gcn`, `row`, `none`; with `gcn` and `row` every row has its
    /// self loop; with `row` every row sums to 1 or is all zeros). `distspmm_version` and
    /// `command_line` only describe the run.
    fn check_manifest_fields(
        &self,
        views: &[(&Path, &ChunkView<'_>)],
        partition: &Partition,
    ) -> Result<(), ChunkDirError> {
        let m = &self.manifest;
        let manifest_path = self.dir.join(MANIFEST_FILE);
        let bad = |field: &str, detail: String| ChunkDirError::Manifest {
            path: manifest_path.clone(),
            reason: std::format!(
                "{field}: {detail}; the manifest does not describe these chunks (was it edited?): \
                 re-run `distspmm partition`"
            ),
        };
        for (path, view) in views {
            let version = view.header().version.to_string();
            if version != m.chunk_format_version {
                return Err(bad(
                    "chunk_format_version",
                    std::format!(
                        "it says {}, but {} has version {version}",
                        m.chunk_format_version,
                        path.display()
                    ),
                ));
            }
        }
        if partition.method() != m.partition_method {
            return Err(bad(
                "partition_method",
                std::format!(
                    "it says {:?}, the partition map {:?}",
                    m.partition_method,
                    partition.method()
                ),
            ));
        }
        let imbalance = partition.imbalance();
        if (imbalance - m.max_imbalance).abs() > 1e-9 * imbalance.abs().max(1.0) {
            return Err(bad(
                "max_imbalance",
                std::format!(
                    "it says {}, the partition map's parts give {imbalance}",
                    m.max_imbalance
                ),
            ));
        }
        let nnz: u64 = views.iter().map(|(_, v)| v.header().nnz).sum();
        if nnz != m.nnz {
            return Err(bad(
                "nnz",
                std::format!("it says {}, the chunks hold {nnz}", m.nnz),
            ));
        }
        let shape = AHatShape::of(views);
        if shape.edge_cut != m.edge_cut {
            return Err(bad(
                "edge_cut",
                std::format!("it says {}, the chunks give {}", m.edge_cut, shape.edge_cut),
            ));
        }
        let from_edges = match m.normalization.as_str() {
            "gcn" | "row" => shape.off_diagonal,
            "none" => nnz,
            other => {
                return Err(bad(
                    "normalization",
                    std::format!("{other:?} is not one of gcn, row, none"),
                ))
            }
        };
        if m.edges < from_edges {
            return Err(bad(
                "edges",
                std::format!(
                    "it says {}, but the chunks hold {from_edges} entries that each come from an \
                     edge",
                    m.edges
                ),
            ));
        }
        if m.normalization != "none" && shape.rows_without_loop > 0 {
            return Err(bad(
                "normalization",
                std::format!(
                    "it says {}, which adds a self loop to every row, but {} rows have none",
                    m.normalization,
                    shape.rows_without_loop
                ),
            ));
        }
        if m.normalization == "row" && shape.rows_not_stochastic > 0 {
            return Err(bad(
                "normalization",
                std::format!(
                    "it says row, but {} rows of Â do not sum to 1",
                    shape.rows_not_stochastic
                ),
            ));
        }
        Ok(())
    }

    /// Loads every chunk and reassembles Â in renumbered ids (see [`reassemble`]).
    pub fn reassemble(&self) -> Result<CsrOwned<f32>, ChunkDirError> {
        let chunks = self.validate_all()?;
        let views: Vec<(&Path, &ChunkView<'_>)> =
            chunks.iter().map(|c| (c.path(), c.view())).collect();
        reassemble(&views)
    }
}

/// What [`ChunkDir::check_manifest_fields`] recounts from the chunks' Â.
struct AHatShape {
    /// Unordered pairs of nodes in different parts joined by an entry in either direction.
    edge_cut: u64,
    /// Entries off the diagonal.
    off_diagonal: u64,
    /// Rows without a diagonal entry.
    rows_without_loop: u64,
    /// Rows whose values sum neither to 1 nor are all zero (relative tolerance 1e-3).
    rows_not_stochastic: u64,
}

impl AHatShape {
    /// Counts over the P chunks of one run, after [`check_consistency`].
    fn of(chunks: &[(&Path, &ChunkView<'_>)]) -> Self {
        let mut shape = Self {
            edge_cut: 0,
            off_diagonal: 0,
            rows_without_loop: 0,
            rows_not_stochastic: 0,
        };
        // Cross entries counted once per direction; a pair with both directions twice.
        let (mut one_way, mut both_ways) = (0u64, 0u64);
        for &(_, view) in chunks {
            let p = view.part_id();
            let blocks: Vec<_> = view.blocks().collect();
            for i in 0..view.num_local_nodes() {
                let (mut has_loop, mut sum) = (false, 0f64);
                for block in &blocks {
                    let q = block.src_part as usize;
                    let (s, e) = (
                        index::offset(block.csr_rowptr[i]),
                        index::offset(block.csr_rowptr[i + 1]),
                    );
                    sum += block.csr_vals[s..e]
                        .iter()
                        .map(|&v| f64::from(v))
                        .sum::<f64>();
                    if q == p {
                        let on_diagonal = block.csr_cols[s..e].binary_search(&index::id(i)).is_ok();
                        has_loop |= on_diagonal;
                        shape.off_diagonal += (e - s - usize::from(on_diagonal)) as u64;
                        continue;
                    }
                    shape.off_diagonal += (e - s) as u64;
                    // Entry (this row, u) with u in part q: does q's row u hold this row?
                    let peer = chunks[q].1;
                    let recv = view.halo_recv(q);
                    let reverse = peer.blocks().find(|b| b.src_part as usize == p);
                    let my_index = peer.halo_recv(p).binary_search(&index::id(i)).ok();
                    for &c in &block.csr_cols[s..e] {
                        let u = recv[c as usize] as usize;
                        let mutual = match (&reverse, my_index) {
                            (Some(r), Some(k)) => {
                                let (rs, re) = (
                                    index::offset(r.csr_rowptr[u]),
                                    index::offset(r.csr_rowptr[u + 1]),
                                );
                                r.csr_cols[rs..re].binary_search(&index::id(k)).is_ok()
                            }
                            _ => false,
                        };
                        if mutual {
                            both_ways += 1;
                        } else {
                            one_way += 1;
                        }
                    }
                }
                shape.rows_without_loop += u64::from(!has_loop);
                let stochastic = (sum - 1.0).abs() <= 1e-3 || sum == 0.0;
                shape.rows_not_stochastic += u64::from(!stochastic);
            }
        }
        shape.edge_cut = one_way + both_ways / 2;
        shape
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

/// Reassembles the global Â (renumbered ids: part p's row i is `off[p] + i`, and likewise for
/// columns) from all P chunks of a run, after [`check_consistency`]. Blocks come in increasing
/// source part and part ranges increase with the part, so each row's columns come out sorted.
pub fn reassemble(chunks: &[(&Path, &ChunkView<'_>)]) -> Result<CsrOwned<f32>, ChunkDirError> {
    check_consistency(chunks)?;
    let off = chunks[0].1.part_offsets();
    let total = off[off.len() - 1];
    let n = usize::try_from(total)
        .ok()
        .filter(|&n| n <= crate::graph::MAX_NODES)
        .ok_or_else(|| ChunkDirError::Inconsistent {
            file: chunks[0].0.to_path_buf(),
            section: "part offsets",
            detail: std::format!(
                "{total} nodes exceed the limit of {} (node ids are u32)",
                crate::graph::MAX_NODES
            ),
        })?;
    let nnz: usize = chunks
        .iter()
        .map(|(_, v)| index::offset(v.header().nnz))
        .sum();
    let mut indptr = Vec::with_capacity(n + 1);
    indptr.push(0u64);
    let mut indices = Vec::with_capacity(nnz);
    let mut data = Vec::with_capacity(nnz);
    for &(_, view) in chunks {
        let p = view.part_id();
        let blocks: Vec<_> = view.blocks().collect();
        for i in 0..view.num_local_nodes() {
            for block in &blocks {
                let q = block.src_part as usize;
                let recv = view.halo_recv(q);
                let (s, e) = (
                    index::offset(block.csr_rowptr[i]),
                    index::offset(block.csr_rowptr[i + 1]),
                );
                for (&c, &v) in block.csr_cols[s..e].iter().zip(&block.csr_vals[s..e]) {
                    let local = if q == p { c } else { recv[c as usize] };
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "a global id below N, which was checked against MAX_NODES above"
                    )]
                    indices.push((off[q] + u64::from(local)) as u32);
                    data.push(v);
                }
            }
            indptr.push(indices.len() as u64);
        }
    }
    CsrOwned::new(n, n, indptr, indices, data).map_err(|e| ChunkDirError::Inconsistent {
        file: chunks[0].0.to_path_buf(),
        section: "CSR",
        detail: std::format!("the reassembled Â is not a valid CSR: {e}"),
    })
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
