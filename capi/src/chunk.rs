//! `dsp_chunk`: this rank's chunk of a chunk directory (memory-mapped, validated), its sizes
//! and zero-copy pointers to its node data.

use std::ffi::c_char;
use std::path::PathBuf;
use std::sync::Arc;

use chunk_format::dir::ChunkDir;
use chunk_format::{ChunkHeader, ChunkView};
use dist_comm::agree::message_with_sources;
use dist_comm::Group;
use distspmm_op::{open_rank_chunk, OpenError, RankChunk};

use crate::boundary::{ffi_boundary, ffi_boundary_void, Error, Handle, OutPtr, Status};
use crate::comm::{agree, Comm};

/// This rank's part of a chunk directory written by `distspmm partition`: the rows of Ahat (the normalised adjacency) it
/// owns, its halo lists and its nodes' features, labels, masks and original ids, mapped
/// read-only from `part-NNNNN.chunk`.
///
/// Thread-safety: immutable after `dsp_chunk_open`; any number of threads may query it and
/// read its data at once. Free it only when no other thread uses it.
#[derive(Debug)]
pub struct Chunk {
    dir: ChunkDir,
    mapped: Arc<RankChunk>,
}

impl Handle for Chunk {
    const C_NAME: &'static str = "dsp_chunk";
}

impl Chunk {
    /// The validated chunk view.
    pub(crate) fn view(&self) -> &ChunkView<'_> {
        self.mapped.view()
    }

    fn header(&self) -> &ChunkHeader {
        self.mapped.view().header()
    }

    /// The mapped chunk (with what its directory lists, which the operators' agreement
    /// compares across ranks), shared with the operators built from it.
    pub(crate) fn mapped(&self) -> &Arc<RankChunk> {
        &self.mapped
    }
}

#[cfg(unix)]
fn path_from_c(bytes: &[u8]) -> Result<PathBuf, Error> {
    use std::os::unix::ffi::OsStrExt;
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

#[cfg(not(unix))]
fn path_from_c(bytes: &[u8]) -> Result<PathBuf, Error> {
    std::str::from_utf8(bytes)
        .map(PathBuf::from)
        .map_err(|_| Error::invalid("dir is not valid UTF-8"))
}

/// Opens the directory and loads part `rank`, checking that it has `size` parts.
fn open_local(dir: *const c_char, rank: usize, size: usize) -> Result<Chunk, Error> {
    // SAFETY: the exported caller's contract: `dir` is NULL or a NUL-terminated string.
    let dir = unsafe { crate::c_str(dir, "dir") }?;
    if dir.is_empty() {
        return Err(Error::invalid("dir is an empty string"));
    }
    let path = path_from_c(dir.to_bytes())?;
    if !path.is_dir() {
        return Err(Error::new(
            Status::Io,
            format!("{} is not a directory", path.display()),
        ));
    }
    let (dir, mapped) = open_rank_chunk(&path, rank, size)?;
    Ok(Chunk {
        dir,
        mapped: Arc::new(mapped),
    })
}

impl From<OpenError> for Error {
    fn from(e: OpenError) -> Self {
        match e.dir_error() {
            Some(source) => Error::new(Error::from(source).status, message_with_sources(&e)),
            None => Error::new(Status::PartsMismatch, e.to_string()),
        }
    }
}

/// The content digest the chunk's directory lists, folded into one word: equal on every rank
/// that opened a copy of one directory, different for another partition (each chunk's checksum
/// covers its header's fingerprint) or a stale copy of other data.
fn content_key(chunk: &Chunk) -> u64 {
    let [hi, lo] = chunk.mapped.listed();
    hi ^ lo
}

/// Opens `dir` (a chunk directory from `distspmm partition`) and maps this rank's chunk,
/// `part-<rank>.chunk`, validating it in full against the manifest. Collective over `comm`:
/// the ranks agree on the outcome, so when any rank fails every rank fails: the failing rank
/// with its own status and message, the others with `DSP_STATUS_PEER_FAILED` naming it. A
/// directory with P parts opened under a different number of ranks is
/// `DSP_STATUS_PARTS_MISMATCH` on every rank; directories of different partitions, or of one
/// partition of different data (features, labels, masks, edges: a stale copy on one host), on
/// different ranks are `DSP_STATUS_ARGUMENT_MISMATCH`. On failure `*out` is NULL.
///
/// # Safety
/// `comm` is NULL or a live `dsp_comm *`; `dir` is NULL or a NUL-terminated path; `out` is
/// NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_open(
    comm: *mut Comm,
    dir: *const c_char,
    out: *mut *mut Chunk,
) -> Status {
    ffi_boundary("dsp_chunk_open", || {
        // SAFETY: the caller guarantees NULL or valid for a write.
        let out = unsafe { OutPtr::new(out, "out") };
        if let Ok(out) = &out {
            out.write(std::ptr::null_mut());
        }
        // SAFETY: the caller guarantees a live handle or NULL.
        let comm = unsafe { Comm::borrow(comm, "comm") }?;
        comm.check_usable()?;
        let mpi = comm.mpi();
        // A NULL `out` is still a local failure the peers must hear about.
        let local = out
            .as_ref()
            .map_err(Error::clone)
            .and_then(|_| open_local(dir, mpi.rank(), mpi.size()));
        let key = local.as_ref().map(content_key).map_err(Error::clone);
        agree(mpi, key, |k| format!("content digest {k:016x}")).map_err(|e| {
            if e.status == Status::ArgumentMismatch {
                Error::new(
                    e.status,
                    format!(
                        "the ranks opened chunk directories with different contents ({}; this \
                         rank's is {}): another partition, or a stale copy of other data; copy \
                         the same chunk directory to every host and pass it on every rank",
                        e.message,
                        local
                            .as_ref()
                            .map_or_else(|_| String::new(), |c| c.dir.path().display().to_string())
                    ),
                )
            } else {
                e
            }
        })?;
        let chunk = local?;
        out?.write(chunk.into_raw());
        Ok(())
    })
}

/// Frees a chunk (unmaps it; operators made from it keep their own reference). NULL is
/// accepted. Pointers from `dsp_chunk_features` and friends are invalid afterwards.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *` that no other thread is using; it must not be used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_free(chunk: *mut Chunk) {
    ffi_boundary_void("dsp_chunk_free", || {
        // SAFETY: the caller guarantees NULL or a live handle it gives up.
        drop(unsafe { Chunk::from_raw(chunk) });
        Ok(())
    })
}

/// Borrows the chunk and writes one value derived from it.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
unsafe fn query<T>(
    chunk: *const Chunk,
    out: *mut T,
    get: impl FnOnce(&Chunk) -> T,
) -> Result<(), Error> {
    // SAFETY: the caller guarantees a live handle or NULL.
    let chunk = unsafe { Chunk::borrow(chunk, "chunk") }?;
    // SAFETY: the caller guarantees NULL or valid for a write.
    let out = unsafe { OutPtr::new(out, "out") }?;
    out.write(get(chunk));
    Ok(())
}

/// This chunk's part id (equal to the rank that opened it), in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_part(chunk: *const Chunk, out: *mut u32) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_part", || unsafe {
        query(chunk, out, |c| c.header().part_id)
    })
}

/// The number of parts P of the partition (equal to the number of ranks), in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_num_parts(chunk: *const Chunk, out: *mut u32) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_num_parts", || unsafe {
        query(chunk, out, |c| c.header().num_parts)
    })
}

/// The rows this rank owns, n_p: the row count of every local matrix (X, Y, features), in
/// `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_num_local_nodes(chunk: *const Chunk, out: *mut usize) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_num_local_nodes", || unsafe {
        query(chunk, out, |c| c.view().num_local_nodes())
    })
}

/// The halo rows H: rows of other ranks that this rank's non-zeros reference (received by the
/// halo schedule), in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_num_halo_rows(chunk: *const Chunk, out: *mut usize) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_num_halo_rows", || unsafe {
        // Bounded by the halo list's length, checked by `ChunkView::parse`.
        query(chunk, out, |c| {
            distspmm_sparse::index::offset(c.header().num_halo_rows)
        })
    })
}

/// The global node count N, in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_num_global_nodes(chunk: *const Chunk, out: *mut u64) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_num_global_nodes", || unsafe {
        query(chunk, out, |c| c.header().num_global_nodes)
    })
}

/// The first global (renumbered) node id of this part: its rows are the global rows
/// `offset .. offset + n_p` of Ahat, in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_global_offset(chunk: *const Chunk, out: *mut u64) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_global_offset", || unsafe {
        query(chunk, out, |c| c.view().part_offsets()[c.view().part_id()])
    })
}

/// The feature columns F (0 if the graph has no features), in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_num_features(chunk: *const Chunk, out: *mut usize) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_num_features", || unsafe {
        query(chunk, out, |c| c.header().feature_dim as usize)
    })
}

/// The number of classes C (0 if the graph has no labels), in `*out`.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_num_classes(chunk: *const Chunk, out: *mut usize) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_num_classes", || unsafe {
        query(chunk, out, |c| c.header().num_classes as usize)
    })
}

/// Hands out a zero-copy slice of the chunk.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `data` and `len` are NULL or valid for a write.
unsafe fn data<T>(
    chunk: *const Chunk,
    data: *mut *const T,
    len: *mut usize,
    what: &str,
    get: impl for<'c> FnOnce(&ChunkView<'c>) -> Option<&'c [T]>,
) -> Result<(), Error> {
    // SAFETY: the caller guarantees a live handle or NULL.
    let chunk = unsafe { Chunk::borrow(chunk, "chunk") }?;
    // SAFETY: the caller guarantees NULL or valid for a write.
    let data = unsafe { OutPtr::new(data, "data") }?;
    // SAFETY: the caller guarantees NULL or valid for a write.
    let len = unsafe { OutPtr::new(len, "len") }?;
    data.write(std::ptr::null());
    len.write(0);
    let slice = get(chunk.view()).ok_or_else(|| {
        Error::new(
            Status::NotPresent,
            format!(
                "{} has no {what}: partition a graph that has them",
                chunk.mapped.path().display()
            ),
        )
    })?;
    data.write(slice.as_ptr());
    len.write(slice.len());
    Ok(())
}

/// This rank's node features: `*len = n_p * F` floats, row-major (row i is local node i,
/// leading dimension F), read-only and valid until `dsp_chunk_free`. `DSP_STATUS_NOT_PRESENT`
/// if the graph has no features. On success `*data` is never NULL (even when `*len` is 0).
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `data` and `len` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_features(
    chunk: *const Chunk,
    data: *mut *const f32,
    len: *mut usize,
) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_features", || unsafe {
        self::data(chunk, data, len, "features", |v| v.features())
    })
}

/// This rank's node labels: `*len = n_p` class ids in `0..C`, or -1 for an unlabelled node;
/// read-only, valid until `dsp_chunk_free`. `DSP_STATUS_NOT_PRESENT` without labels.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `data` and `len` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_labels(
    chunk: *const Chunk,
    data: *mut *const i32,
    len: *mut usize,
) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_labels", || unsafe {
        self::data(chunk, data, len, "labels", |v| v.labels())
    })
}

/// This rank's node masks: `*len = n_p` bytes of `DSP_MASK_TRAIN | DSP_MASK_VAL |
/// DSP_MASK_TEST` bits; read-only, valid until `dsp_chunk_free`. `DSP_STATUS_NOT_PRESENT`
/// without masks.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `data` and `len` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_masks(
    chunk: *const Chunk,
    data: *mut *const u8,
    len: *mut usize,
) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_masks", || unsafe {
        self::data(chunk, data, len, "masks", |v| v.masks())
    })
}

/// The original (input file) id of each local node: `*len = n_p` ids; read-only, valid until
/// `dsp_chunk_free`. Always present.
///
/// # Safety
/// `chunk` is NULL or a live `dsp_chunk *`; `data` and `len` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_chunk_original_ids(
    chunk: *const Chunk,
    data: *mut *const u64,
    len: *mut usize,
) -> Status {
    // SAFETY: forwarded caller contract.
    ffi_boundary("dsp_chunk_original_ids", || unsafe {
        self::data(chunk, data, len, "original ids", |v| Some(v.original_ids()))
    })
}
