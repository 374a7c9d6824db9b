//! NumPy `.npz` graphs in PyTorch Geometric's field names: reader and writer; also a
//! directory of `.npy` files in the same names ([`read_npy_dir`], e.g. an unzipped `.npz`).
//!
//! An `.npz` is a zip of `.npy` files (stored or deflate-compressed). The arrays read, by the
//! names `numpy.savez` gives them (`<name>.npy`):
//!
//! | array | dtypes | shape | becomes |
//! |---|---|---|---|
//! | `edge_index` (required) | `<i8`, `<i4` | (2, E): row 0 sources, row 1 targets | `src`, `dst` |
//! | `num_nodes` | `<i8`, `<i4` | () or (1,) | `num_nodes` |
//! | `edge_weight` | `<f4`, `<f8` | (E,) | `weights` |
//! | `x` | `<f4`, `<f8` | (N, F) or (N,) | `features` |
//! | `y` | `<i8`, `<i4` | (N,) or (N, 1) | `labels` (−1 = unlabelled) |
//! | `y` | `<i8`, `<i4`, `\|b1`, `\|u1`, `<f4`, `<f8` | (N, C), C ≥ 2 | multi-label `targets` (0/1; a row of −1 = unlabelled) |
//! | `train_mask`, `val_mask`, `test_mask` | `\|b1`, `\|u1` (0/1) | (N,) | masks |
//!
//! Other arrays are ignored. Without `num_nodes` the node count is the row count of `x`, else
//! the length of `y` or a mask, else the largest id plus one.
//!
//! The `.npy` header is parsed here (a few dozen lines, strict: only the dtypes above, C order,
//! the three keys numpy writes) rather than through a crate: the format is tiny and fixed, the
//! reader must reject rather than coerce, and element data is decoded in 64 KiB chunks straight
//! into the target vectors (no intermediate copy of an `int64` edge array twice the size of the
//! `u32` result).

use super::generate::SortedEdges;
use super::mapped_input::Identity;
use super::{
    FeatureData, Features, Graph, GraphError, GraphErrorKind, Targets, MAX_NODES, TARGET_UNLABELLED,
};
use distspmm_sparse::index;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Cursor, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;
use std::{format, vec};
use zip::result::ZipError;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

/// Element types an array may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    I64,
    I32,
    F32,
    F64,
    Bool,
    U8,
}

impl Dtype {
    fn from_descr(descr: &str) -> Option<Dtype> {
        Some(match descr {
            "<i8" => Dtype::I64,
            "<i4" => Dtype::I32,
            "<f4" => Dtype::F32,
            "<f8" => Dtype::F64,
            "|b1" => Dtype::Bool,
            "|u1" => Dtype::U8,
            _ => return None,
        })
    }

    fn descr(self) -> &'static str {
        match self {
            Dtype::I64 => "<i8",
            Dtype::I32 => "<i4",
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
            Dtype::Bool => "|b1",
            Dtype::U8 => "|u1",
        }
    }

    fn size(self) -> usize {
        match self {
            Dtype::I64 | Dtype::F64 => 8,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::Bool | Dtype::U8 => 1,
        }
    }
}

/// A parsed `.npy` header.
#[derive(Debug, PartialEq)]
struct NpyHeader {
    dtype: Dtype,
    shape: Vec<u64>,
    /// Column-major element order (`fortran_order: True`; PyG's `edge_index.numpy()` often is,
    /// being a transposed view).
    fortran: bool,
    /// Bytes before the element data (magic, version, length, dict).
    prefix_len: u64,
}

impl NpyHeader {
    fn count(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
}

use distspmm_sparse::npy::MAGIC;
const MAX_HEADER: usize = 1 << 16;

fn bad(msg: String) -> GraphErrorKind {
    GraphErrorKind::BadHeader(msg)
}

fn read_npy_header<R: Read + ?Sized>(r: &mut R) -> Result<NpyHeader, GraphErrorKind> {
    let mut lead = [0u8; 8];
    read_exact(r, &mut lead, "the .npy header")?;
    if &lead[..6] != MAGIC {
        return Err(bad("not a .npy array (bad magic bytes)".into()));
    }
    let (len, len_bytes) = match lead[6] {
        1 => {
            let mut b = [0u8; 2];
            read_exact(r, &mut b, "the .npy header")?;
            (usize::from(u16::from_le_bytes(b)), 2)
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            read_exact(r, &mut b, "the .npy header")?;
            (u32::from_le_bytes(b) as usize, 4)
        }
        v => return Err(bad(format!(".npy format version {v} is not supported"))),
    };
    if len > MAX_HEADER {
        return Err(bad(format!("header of {len} bytes is implausibly long")));
    }
    let mut text = vec![0u8; len];
    read_exact(r, &mut text, "the .npy header")?;
    let (descr, fortran, shape) = parse_header_dict(&text)?;
    let dtype = Dtype::from_descr(&descr).ok_or(GraphErrorKind::Dtype {
        found: descr,
        expected: "one of <i8 <i4 <f4 <f8 |b1 |u1 (little-endian)",
    })?;
    if fortran && shape.len() > 2 {
        return Err(bad(
            "Fortran-order arrays of more than 2 dimensions are not supported".into(),
        ));
    }
    Ok(NpyHeader {
        dtype,
        // Order only matters for 2-D arrays.
        fortran: fortran && shape.len() == 2,
        shape,
        prefix_len: (8 + len_bytes + len) as u64,
    })
}

/// Parses numpy's header dict, e.g. `{'descr': '<i8', 'fortran_order': False, 'shape': (2, 5), }`.
fn parse_header_dict(text: &[u8]) -> Result<(String, bool, Vec<u64>), GraphErrorKind> {
    let mut p = DictParser { s: text, i: 0 };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    p.expect(b'{')?;
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        match key.as_str() {
            "descr" => descr = Some(p.string()?),
            "fortran_order" => fortran = Some(p.boolean()?),
            "shape" => shape = Some(p.tuple()?),
            other => return Err(bad(format!("unexpected key {other:?} in the .npy header"))),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            p.expect(b'}')?;
            break;
        }
    }
    if !p.s[p.i..].iter().all(u8::is_ascii_whitespace) {
        return Err(bad("trailing characters after the .npy header dict".into()));
    }
    match (descr, fortran, shape) {
        (Some(d), Some(f), Some(s)) => Ok((d, f, s)),
        _ => Err(bad(
            "the .npy header needs 'descr', 'fortran_order' and 'shape'".into(),
        )),
    }
}

struct DictParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl DictParser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.s.get(self.i) == Some(&c);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, c: u8) -> Result<(), GraphErrorKind> {
        self.skip_ws();
        if self.eat(c) {
            Ok(())
        } else {
            Err(bad(format!(
                "malformed .npy header dict: expected {:?} at byte {}",
                char::from(c),
                self.i
            )))
        }
    }

    fn string(&mut self) -> Result<String, GraphErrorKind> {
        let quote = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(bad(format!("expected a quoted string at byte {}", self.i))),
        };
        let start = self.i + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == quote)
            .ok_or_else(|| bad("unterminated string in the .npy header".into()))?;
        self.i = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }

    fn boolean(&mut self) -> Result<bool, GraphErrorKind> {
        for (word, value) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if self.s[self.i..].starts_with(word) {
                self.i += word.len();
                return Ok(value);
            }
        }
        Err(bad(format!("expected True or False at byte {}", self.i)))
    }

    fn tuple(&mut self) -> Result<Vec<u64>, GraphErrorKind> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            let start = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            let digits = &self.s[start..self.i];
            let dim = core::str::from_utf8(digits)
                .ok()
                .and_then(|d| d.parse::<u64>().ok())
                .ok_or_else(|| bad(format!("expected a dimension at byte {start}")))?;
            self.eat(b'L'); // Python 2 long literals.
            dims.push(dim);
            if dims.len() > 32 {
                return Err(bad("more than 32 dimensions".into()));
            }
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

fn read_exact<R: Read + ?Sized>(
    r: &mut R,
    buf: &mut [u8],
    what: &str,
) -> Result<(), GraphErrorKind> {
    r.read_exact(buf).map_err(|e| read_error(e, what))
}

/// A read error of a `.npy` file or `.npz` member: running short, or damaged compressed data,
/// said as such with the fix; any other failure is the I/O error.
fn read_error(e: io::Error, what: &str) -> GraphErrorKind {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => GraphErrorKind::Invalid(format!(
            "{what} is truncated: the file ends early (an interrupted copy or write); re-create it"
        )),
        io::ErrorKind::InvalidData => {
            GraphErrorKind::Invalid(format!("{what} is damaged ({e}): re-create the file"))
        }
        _ => GraphErrorKind::Io(e),
    }
}

/// Streams an array body of `count` elements of `dtype` in chunks of whole elements, then
/// checks nothing follows.
fn for_each_chunk<R: Read + ?Sized>(
    r: &mut R,
    header: &NpyHeader,
    count: u64,
    mut f: impl FnMut(&[u8]) -> Result<(), GraphErrorKind>,
) -> Result<(), GraphErrorKind> {
    const CHUNK: usize = 1 << 16; // a multiple of every element size
    let mut buf = vec![0u8; CHUNK];
    let mut remaining = count
        .checked_mul(header.dtype.size() as u64)
        .ok_or_else(|| GraphErrorKind::Invalid("array size overflows".into()))?;
    while remaining > 0 {
        let take = usize::try_from(remaining).map_or(CHUNK, |n| n.min(CHUNK));
        read_exact(r, &mut buf[..take], "the array data")?;
        f(&buf[..take])?;
        remaining -= take as u64;
    }
    let mut extra = [0u8; 1];
    if r.read(&mut extra)
        .map_err(|e| read_error(e, "the array data"))?
        != 0
    {
        return Err(GraphErrorKind::LengthMismatch(
            "the entry holds more data than its shape".into(),
        ));
    }
    Ok(())
}

fn le<const N: usize>(c: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(c);
    a
}

/// Calls `f` on every integer of a chunk.
fn decode_ints(
    dtype: Dtype,
    bytes: &[u8],
    mut f: impl FnMut(i64) -> Result<(), GraphErrorKind>,
) -> Result<(), GraphErrorKind> {
    match dtype {
        Dtype::I64 => bytes
            .chunks_exact(8)
            .try_for_each(|c| f(i64::from_le_bytes(le(c)))),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .try_for_each(|c| f(i64::from(i32::from_le_bytes(le(c))))),
        Dtype::Bool | Dtype::U8 => bytes.iter().try_for_each(|&b| f(i64::from(b))),
        Dtype::F32 | Dtype::F64 => Err(GraphErrorKind::Invalid("not an integer array".into())),
    }
}

/// Appends every float of a chunk to `out` as `f32`, rejecting NaN and infinities.
fn decode_floats(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) -> Result<(), GraphErrorKind> {
    let start = out.len();
    match dtype {
        Dtype::F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(le(c)))),
        Dtype::F64 => out.extend(bytes.chunks_exact(8).map(|c| {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "deliberate: float64 arrays are read as f32, rounded"
            )]
            let value = f64::from_le_bytes(le(c)) as f32;
            value
        })),
        _ => return Err(GraphErrorKind::Invalid("not a float array".into())),
    }
    match out[start..].iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(k) => {
            // Report the stored value (an f64 may be finite but overflow f32).
            let i = k * dtype.size();
            let stored = if dtype == Dtype::F64 {
                f64::from_le_bytes(le(&bytes[i..i + 8]))
            } else {
                f64::from(out[start + k])
            };
            Err(GraphErrorKind::NonFinite(stored))
        }
    }
}

/// Where the named `.npy` arrays of a graph come from: an `.npz` archive or a directory.
trait Arrays {
    /// Whether array `name` is present.
    fn has(&self, name: &str) -> bool;

    /// Opens array `name`, checks its dtype and header, and hands the body reader to `read`.
    fn with_array<T>(
        &mut self,
        name: &str,
        allowed: &[Dtype],
        read: impl FnOnce(&mut dyn Read, &NpyHeader) -> Result<T, GraphErrorKind>,
    ) -> Result<T, GraphError>;

    /// Array `name` (present) as its checked header, the file holding it and the byte offset
    /// of its data in that file, when it is stored uncompressed in a file this source can map;
    /// `None` otherwise (compressed, or held in memory).
    fn stored(&mut self, name: &str, allowed: &[Dtype]) -> Result<Option<Stored>, GraphError>;
}

/// Reads the header of an array stored in `size` bytes and checks its dtype and that the
/// shape accounts for exactly those bytes.
fn checked_header(
    r: &mut dyn Read,
    size: u64,
    allowed: &[Dtype],
) -> Result<NpyHeader, GraphErrorKind> {
    let header = read_npy_header(r)?;
    if !allowed.contains(&header.dtype) {
        let expected = allowed_names(allowed);
        return Err(GraphErrorKind::Dtype {
            found: header.dtype.descr().to_string(),
            expected,
        });
    }
    let bytes = header
        .count()
        .and_then(|c| c.checked_mul(header.dtype.size() as u64))
        .and_then(|b| b.checked_add(header.prefix_len));
    if bytes != Some(size) {
        return Err(GraphErrorKind::LengthMismatch(format!(
            "shape {:?} of {} needs {} bytes with the header, the entry has {size}",
            header.shape,
            header.dtype.descr(),
            bytes.map_or_else(|| "too many".to_string(), |b| b.to_string()),
        )));
    }
    Ok(header)
}

/// An array stored as it is in memory: its checked header, the file holding it (and its
/// path), and the byte offset of its data in that file.
struct Stored {
    header: NpyHeader,
    file: File,
    path: PathBuf,
    offset: u64,
}

/// The zip archive under the reader, with errors mapped to [`GraphError`].
struct Npz<R> {
    archive: ZipArchive<R>,
    /// The archive's file and path, when it is one (uncompressed members can then be mapped).
    file: Option<(File, PathBuf)>,
}

/// A directory holding `<name>.npy` files.
struct NpyDir<'a> {
    dir: &'a Path,
}

impl Arrays for NpyDir<'_> {
    /// Whether the directory has an entry `<name>.npy`, of any kind: a FIFO, a directory or a
    /// dangling link there is present (and refused when opened), never taken for an absent
    /// array.
    fn has(&self, name: &str) -> bool {
        entry_exists(&self.dir.join(format!("{name}.npy")))
    }

    fn with_array<T>(
        &mut self,
        name: &str,
        allowed: &[Dtype],
        read: impl FnOnce(&mut dyn Read, &NpyHeader) -> Result<T, GraphErrorKind>,
    ) -> Result<T, GraphError> {
        let (mut r, header) = self.open(name, allowed)?;
        read(&mut r, &header).map_err(|kind| GraphError::in_array(name, kind))
    }

    fn stored(&mut self, name: &str, allowed: &[Dtype]) -> Result<Option<Stored>, GraphError> {
        let (r, header) = self.open(name, allowed)?;
        Ok(Some(Stored {
            offset: header.prefix_len,
            header,
            file: r.into_inner(),
            path: self.dir.join(format!("{name}.npy")),
        }))
    }
}

impl NpyDir<'_> {
    /// Opens `<name>.npy` (a regular file) and reads its checked header; the reader is left
    /// at the first data byte.
    fn open(
        &self,
        name: &str,
        allowed: &[Dtype],
    ) -> Result<(BufReader<File>, NpyHeader), GraphError> {
        let at = |kind| GraphError::in_array(name, kind);
        let path = self.dir.join(format!("{name}.npy"));
        let file = chunk_format::open_regular(&path).map_err(|e| at(not_regular(&path, e)))?;
        let size = file
            .metadata()
            .map_err(|e| at(GraphErrorKind::Io(e)))?
            .len();
        let mut r = BufReader::with_capacity(1 << 16, file);
        let header = checked_header(&mut r, size, allowed).map_err(at)?;
        Ok((r, header))
    }
}

/// Whether `path` names a directory entry of any kind (a dangling link too); an entry that
/// cannot be examined counts as present, so that opening it reports why.
fn entry_exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).map_or_else(|e| e.kind() != io::ErrorKind::NotFound, |_| true)
}

/// The error for an array file of a `.npy` directory that could not be opened: one that is
/// not a regular file (a FIFO, a directory, a device, a dangling link) is named with what it
/// is; any other failure is the I/O error.
fn not_regular(path: &Path, err: io::Error) -> GraphErrorKind {
    use std::os::unix::fs::FileTypeExt;
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let kind = |t: std::fs::FileType| {
        if t.is_fifo() {
            "a FIFO (named pipe)"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_socket() {
            "a socket"
        } else {
            "not a plain file"
        }
    };
    let Ok(entry) = std::fs::symlink_metadata(path) else {
        return GraphErrorKind::Io(err);
    };
    let what = if entry.file_type().is_symlink() {
        let target =
            std::fs::read_link(path).map_or_else(|_| "?".to_string(), |t| t.display().to_string());
        match std::fs::metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                format!("a symbolic link to {target}, which does not exist")
            }
            Ok(m) if !m.is_file() => {
                format!("a symbolic link to {target}, {}", kind(m.file_type()))
            }
            _ => return GraphErrorKind::Io(err),
        }
    } else if entry.is_file() {
        return GraphErrorKind::Io(err);
    } else {
        kind(entry.file_type()).to_string()
    };
    GraphErrorKind::Invalid(format!(
        "`{name}` is {what}, not a regular file: every array of a directory of .npy files must \
         be a regular .npy file (replace it with the array's file, or remove it if the array \
         is optional)"
    ))
}

/// Member `<name>.npy` of the archive.
fn member<'z, R: Read + Seek>(
    archive: &'z mut ZipArchive<R>,
    name: &str,
) -> Result<zip::read::ZipFile<'z, R>, GraphError> {
    archive
        .by_name(&format!("{name}.npy"))
        .map_err(|e| GraphError::in_array(name, archive_error(e)))
}

/// An error opening an `.npz` archive or one of its members, said as what it means for the
/// file: a truncated or damaged archive, with the fix.
fn archive_error(e: ZipError) -> GraphErrorKind {
    match e {
        ZipError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => GraphErrorKind::Invalid(
            "the .npz archive is truncated or damaged: it ends before the data its zip \
             directory lists (an interrupted copy, download or write); re-create it"
                .into(),
        ),
        ZipError::Io(e) => GraphErrorKind::Io(e),
        ZipError::InvalidArchive(reason) if reason.contains("EOCD") => {
            GraphErrorKind::Invalid(format!(
                "not a valid .npz (zip) archive ({reason}): the zip directory at its end is \
                 missing, so the file is truncated or is not a zip archive; re-create it"
            ))
        }
        ZipError::FileNotFound => GraphErrorKind::MissingArray,
        other => GraphErrorKind::Invalid(format!(
            "not a valid .npz (zip) archive: {other}; re-create it"
        )),
    }
}

fn zip_error(e: ZipError) -> GraphErrorKind {
    match e {
        ZipError::Io(e) => GraphErrorKind::Io(e),
        other => GraphErrorKind::Invalid(format!("not a valid .npz (zip) archive: {other}")),
    }
}

impl<R: Read + Seek> Npz<R> {
    fn open(reader: R, file: Option<(File, PathBuf)>) -> Result<Self, GraphError> {
        let archive = ZipArchive::new(reader).map_err(archive_error)?;
        Ok(Npz { archive, file })
    }
}

impl<R: Read + Seek> Arrays for Npz<R> {
    fn has(&self, name: &str) -> bool {
        self.archive
            .index_for_name(&format!("{name}.npy"))
            .is_some()
    }

    fn with_array<T>(
        &mut self,
        name: &str,
        allowed: &[Dtype],
        read: impl FnOnce(&mut dyn Read, &NpyHeader) -> Result<T, GraphErrorKind>,
    ) -> Result<T, GraphError> {
        let at = |kind| GraphError::in_array(name, kind);
        let mut entry = member(&mut self.archive, name)?;
        let size = entry.size();
        let header = checked_header(&mut entry, size, allowed).map_err(at)?;
        read(&mut entry, &header).map_err(at)
    }

    fn stored(&mut self, name: &str, allowed: &[Dtype]) -> Result<Option<Stored>, GraphError> {
        let at = |kind| GraphError::in_array(name, kind);
        let Some((file, path)) = &self.file else {
            return Ok(None);
        };
        let mut entry = member(&mut self.archive, name)?;
        // A stored member's bytes are the file's bytes only if it is neither compressed nor
        // encrypted (the zip crate refuses encrypted members in `by_name`).
        if entry.compression() != CompressionMethod::Stored
            || entry.size() != entry.compressed_size()
        {
            return Ok(None);
        }
        let size = entry.size();
        let header = checked_header(&mut entry, size, allowed).map_err(at)?;
        let offset = entry.data_start() + header.prefix_len;
        let file = file.try_clone().map_err(|e| at(GraphErrorKind::Io(e)))?;
        Ok(Some(Stored {
            header,
            file,
            path: path.clone(),
            offset,
        }))
    }
}

fn allowed_names(allowed: &[Dtype]) -> &'static str {
    if allowed == Y_DTYPES {
        return "<i8, <i4, |b1, |u1, <f4 or <f8";
    }
    match allowed.first() {
        Some(Dtype::I64 | Dtype::I32) => "<i8 or <i4",
        Some(Dtype::F32 | Dtype::F64) => "<f4 or <f8",
        _ => "|b1 or |u1",
    }
}

const INTS: &[Dtype] = &[Dtype::I64, Dtype::I32];
const FLOATS: &[Dtype] = &[Dtype::F32, Dtype::F64];
const BOOLS: &[Dtype] = &[Dtype::Bool, Dtype::U8];
/// `y`: integer class ids, or multi-label targets in any of these.
const Y_DTYPES: &[Dtype] = &[
    Dtype::I64,
    Dtype::I32,
    Dtype::Bool,
    Dtype::U8,
    Dtype::F32,
    Dtype::F64,
];

fn shape_error(header: &NpyHeader, expected: &str) -> GraphErrorKind {
    GraphErrorKind::LengthMismatch(format!("shape {:?} should be {expected}", header.shape))
}

/// An array length from a header as a `usize`, failing cleanly where it does not fit.
fn array_len(n: u64) -> Result<usize, GraphErrorKind> {
    usize::try_from(n)
        .map_err(|_| GraphErrorKind::Invalid(format!("{n} elements do not fit this address space")))
}

/// Reserves `n` elements, checked against the available memory and allocated fallibly, so
/// that a header asking for absurd sizes is an error naming the size.
fn vec_with_capacity<T>(n: u64) -> Result<Vec<T>, GraphErrorKind> {
    const HINT: &str = "check the shape the array's header declares, or use a machine with \
                        more memory (the free memory, a cgroup limit and `ulimit -v` all count)";
    let what = || format!("an array of {n} elements");
    distspmm_sparse::memory::check(what(), distspmm_sparse::memory::bytes_of::<T>(n), HINT)?;
    let len = array_len(n)?;
    Ok(distspmm_sparse::memory::try_with_capacity(
        len,
        what(),
        HINT,
    )?)
}

/// `(rows, columns)` of a feature array: `(N, F)`, or `(N,)` for one column.
fn feature_shape(h: &NpyHeader) -> Result<(u64, u64), GraphErrorKind> {
    match h.shape[..] {
        [rows, dim] => Ok((rows, dim)),
        [rows] => Ok((rows, 1)),
        _ => Err(shape_error(h, "(N, F)")),
    }
}

/// Whether a reader may map arrays (features) instead of copying them; tests compare the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mapping {
    Allowed,
    #[cfg_attr(not(test), allow(dead_code))]
    Never,
}

/// `x` as a mapped matrix (rows, features) when it is stored as it is in memory: `<f4`, C
/// order, uncompressed, 4-byte aligned in its file (see [`super::FeatureData`]). Values are
/// checked finite as the copying reader checks them. `None` leaves `x` to the copying reader.
fn map_features(npz: &mut impl Arrays) -> Result<Option<(usize, Features)>, GraphError> {
    let at = |kind| GraphError::in_array("x", kind);
    let Some(Stored {
        header: h,
        file,
        path,
        offset,
    }) = npz.stored("x", FLOATS)?
    else {
        return Ok(None);
    };
    let (rows, dim) = feature_shape(&h).map_err(at)?;
    if h.dtype != Dtype::F32 || h.fortran {
        return Ok(None);
    }
    let (Some(count), Ok(rows), Ok(dim)) = (
        h.count().and_then(|c| usize::try_from(c).ok()),
        usize::try_from(rows),
        usize::try_from(dim),
    ) else {
        return Ok(None);
    };
    let Some(data) =
        FeatureData::map(&file, &path, offset, count).map_err(|e| at(GraphErrorKind::Io(e)))?
    else {
        return Ok(None);
    };
    let bad = data.iter().find(|x| !x.is_finite()).copied();
    data.check_unchanged()?;
    if let Some(bad) = bad {
        return Err(at(GraphErrorKind::NonFinite(f64::from(bad))));
    }
    tracing::debug!(rows, dim, "features mapped from the input file");
    Ok(Some((rows, Features { dim, data })))
}

/// A one-column `y`: a class id per node (−1 unlabelled), integers only.
/// The `num_nodes` array: one non-negative integer, at most [`MAX_NODES`].
fn read_num_nodes(r: &mut dyn Read, h: &NpyHeader) -> Result<usize, GraphErrorKind> {
    if h.count() != Some(1) || h.shape.len() > 1 {
        return Err(shape_error(h, "() or (1,)"));
    }
    let mut value = 0i64;
    for_each_chunk(r, h, 1, |b| {
        decode_ints(h.dtype, b, |v| {
            value = v;
            Ok(())
        })
    })?;
    match u64::try_from(value) {
        Ok(n) if n <= MAX_NODES as u64 => Ok(index::offset(n)),
        Ok(n) => Err(GraphErrorKind::TooManyNodes(n)),
        Err(_) => Err(GraphErrorKind::Invalid(format!(
            "negative node count {value}"
        ))),
    }
}

/// `n` mask entries, each 0 or 1.
fn read_mask(r: &mut dyn Read, h: &NpyHeader, n: u64) -> Result<Vec<bool>, GraphErrorKind> {
    let mut m = vec_with_capacity(n)?;
    for_each_chunk(r, h, n, |b| {
        decode_ints(h.dtype, b, |v| {
            match v {
                0 | 1 => m.push(v == 1),
                _ => {
                    return Err(GraphErrorKind::Invalid(format!(
                        "mask value {v} is neither 0 nor 1"
                    )))
                }
            }
            Ok(())
        })
    })?;
    Ok(m)
}

fn read_labels(r: &mut dyn Read, h: &NpyHeader, n: u64) -> Result<Vec<i32>, GraphErrorKind> {
    if !INTS.contains(&h.dtype) {
        return Err(GraphErrorKind::Dtype {
            found: h.dtype.descr().to_string(),
            expected:
                "<i8 or <i4 (class ids; a y of shape (N, C) may also be bool, uint8 or float)",
        });
    }
    let mut y = vec_with_capacity(n)?;
    for_each_chunk(r, h, n, |b| {
        decode_ints(h.dtype, b, |v| {
            let label = i32::try_from(v).ok().filter(|&l| l >= -1).ok_or_else(|| {
                GraphErrorKind::Invalid(format!(
                    "label {v} is not a class id (0..2^31) or -1 for unlabelled"
                ))
            })?;
            y.push(label);
            Ok(())
        })
    })?;
    Ok(y)
}

/// A `y` of shape `(N, C)`, `C ≥ 2`: multi-label targets, 0 or 1 per class, a row of −1 for an
/// unlabelled node; integers, booleans or floats holding exactly those values.
fn read_targets(
    r: &mut dyn Read,
    h: &NpyHeader,
    n: u64,
    classes: u64,
) -> Result<Targets, GraphErrorKind> {
    /// The byte of a target value (`as_int`: the value if it is an integer), or why not.
    fn byte(as_int: Option<i64>, shown: &dyn std::fmt::Display) -> Result<u8, GraphErrorKind> {
        match as_int {
            Some(0) => Ok(0),
            Some(1) => Ok(1),
            Some(-1) => Ok(TARGET_UNLABELLED),
            _ => Err(GraphErrorKind::Invalid(format!(
                "target value {shown} is not 0 or 1 (or -1 in a whole row, for an unlabelled \
                 node)"
            ))),
        }
    }
    let float = |v: f64| {
        let int = [0.0, 1.0, -1.0].contains(&v).then(|| {
            #[allow(clippy::cast_possible_truncation, reason = "v is 0, 1 or -1: exact")]
            let i = v as i64;
            i
        });
        byte(int, &v)
    };
    let count = h.count().unwrap_or(u64::MAX);
    let mut data: Vec<u8> = vec_with_capacity(count)?;
    for_each_chunk(r, h, count, |b| match h.dtype {
        Dtype::F32 => b.chunks_exact(4).try_for_each(|c| {
            data.push(float(f64::from(f32::from_le_bytes(le(c))))?);
            Ok(())
        }),
        Dtype::F64 => b.chunks_exact(8).try_for_each(|c| {
            data.push(float(f64::from_le_bytes(le(c)))?);
            Ok(())
        }),
        _ => decode_ints(h.dtype, b, |v| {
            data.push(byte(Some(v), &v)?);
            Ok(())
        }),
    })?;
    let (rows, classes) = (array_len(n)?, array_len(classes)?);
    if h.fortran {
        // Column-major on disk: transpose into rows.
        let mut t = vec![0u8; data.len()];
        for (k, &v) in data.iter().enumerate() {
            t[(k % rows) * classes + k / rows] = v;
        }
        data = t;
    }
    Ok(Targets { classes, data })
}

fn read_archive(mut npz: impl Arrays, map: Mapping) -> Result<Graph, GraphError> {
    let declared = if npz.has("num_nodes") {
        Some(npz.with_array("num_nodes", INTS, read_num_nodes)?)
    } else {
        None
    };

    if !npz.has("edge_index") {
        return Err(GraphError::in_array(
            "edge_index",
            GraphErrorKind::MissingArray,
        ));
    }
    let (src, dst) = npz.with_array("edge_index", INTS, |r, h| {
        let [2, e] = h.shape[..] else {
            return Err(shape_error(h, "(2, E)"));
        };
        let limit = declared.map_or(MAX_NODES as u64, |n| n as u64);
        let mut src: Vec<u32> = vec_with_capacity(e)?;
        let mut dst: Vec<u32> = vec_with_capacity(e)?;
        let mut seen = 0u64;
        for_each_chunk(r, h, 2 * e, |b| {
            decode_ints(h.dtype, b, |v| {
                let id = u64::try_from(v).map_err(|_| GraphErrorKind::NegativeId(v))?;
                if id >= limit {
                    return Err(match declared {
                        Some(n) => GraphErrorKind::IdOutOfRange {
                            id,
                            num_nodes: n as u64,
                        },
                        None => GraphErrorKind::TooManyNodes(id + 1),
                    });
                }
                // C order: all sources, then all targets; Fortran order: (src, dst) pairs.
                let to_src = if h.fortran {
                    seen.is_multiple_of(2)
                } else {
                    seen < e
                };
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "id < limit ≤ MAX_NODES (u32::MAX), checked just above"
                )]
                let id = id as u32;
                if to_src { &mut src } else { &mut dst }.push(id);
                seen += 1;
                Ok(())
            })
        })?;
        Ok((src, dst))
    })?;
    let edges = src.len() as u64;

    let weights = if npz.has("edge_weight") {
        Some(npz.with_array("edge_weight", FLOATS, |r, h| {
            if h.shape[..] != [edges] {
                return Err(shape_error(h, &format!("({edges},), one per edge")));
            }
            let mut w = vec_with_capacity(edges)?;
            for_each_chunk(r, h, edges, |b| decode_floats(h.dtype, b, &mut w))?;
            Ok(w)
        })?)
    } else {
        None
    };

    let mapped = if npz.has("x") && map == Mapping::Allowed {
        map_features(&mut npz)?
    } else {
        None
    };
    let features = if mapped.is_some() {
        mapped
    } else if npz.has("x") {
        Some(npz.with_array("x", FLOATS, |r, h| {
            let (rows, dim) = feature_shape(h)?;
            let count = h.count().unwrap_or(u64::MAX);
            let mut data = vec_with_capacity(count)?;
            let (rows, dim) = (array_len(rows)?, array_len(dim)?);
            if h.fortran {
                // Column-major on disk: scatter each column into the row-major matrix.
                data.resize(array_len(count)?, 0.0);
                let mut column = Vec::new();
                let mut k = 0usize;
                for_each_chunk(r, h, count, |b| {
                    column.clear();
                    decode_floats(h.dtype, b, &mut column)?;
                    for &v in &column {
                        data[(k % rows) * dim + k / rows] = v;
                        k += 1;
                    }
                    Ok(())
                })?;
            } else {
                for_each_chunk(r, h, count, |b| decode_floats(h.dtype, b, &mut data))?;
            }
            Ok((rows, Features::new(dim, data)))
        })?)
    } else {
        None
    };

    let (labels, targets) = if npz.has("y") {
        npz.with_array("y", Y_DTYPES, |r, h| match h.shape[..] {
            [n, classes] if classes >= 2 => read_targets(r, h, n, classes).map(|t| (None, Some(t))),
            [n] | [n, 1] => read_labels(r, h, n).map(|y| (Some(y), None)),
            _ => Err(shape_error(
                h,
                "(N,) for class ids or (N, C) for multi-label targets",
            )),
        })?
    } else {
        (None, None)
    };

    let mut masks: [Option<Vec<bool>>; 3] = [None, None, None];
    for (slot, name) in masks
        .iter_mut()
        .zip(["train_mask", "val_mask", "test_mask"])
    {
        if npz.has(name) {
            *slot = Some(npz.with_array(name, BOOLS, |r, h| {
                let [n] = h.shape[..] else {
                    return Err(shape_error(h, "(N,)"));
                };
                read_mask(r, h, n)
            })?);
        }
    }

    let max_id = src.iter().chain(&dst).copied().max();
    // Without `num_nodes` the first node array present gives the node count: edges that reach
    // beyond it mean that array is short (not that the edges are wrong).
    let from_arrays = [
        ("x", "rows", features.as_ref().map(|(rows, _)| *rows)),
        ("y", "labels", labels.as_ref().map(Vec::len)),
        (
            "y",
            "rows",
            targets.as_ref().map(|t| t.data.len() / t.classes),
        ),
    ]
    .into_iter()
    .chain(
        ["train_mask", "val_mask", "test_mask"]
            .into_iter()
            .zip(&masks)
            .map(|(name, m)| (name, "entries", m.as_ref().map(Vec::len))),
    )
    .find_map(|(name, what, len)| len.map(|len| (name, what, len)));
    if let (None, Some((name, what, len)), Some(max)) = (declared, from_arrays, max_id) {
        if max as usize >= len {
            return Err(GraphError::in_array(
                name,
                GraphErrorKind::LengthMismatch(format!(
                    "{name} has {len} {what} but edge_index reaches node {max}: the graph has \
                     at least {} nodes and {name} needs one per node",
                    u64::from(max) + 1
                )),
            ));
        }
    }
    let num_nodes = declared
        .or(from_arrays.map(|(_, _, len)| len))
        .unwrap_or_else(|| max_id.map_or(0, |m| m as usize + 1));
    let [train_mask, val_mask, test_mask] = masks;
    let graph = Graph {
        num_nodes,
        src,
        dst,
        weights,
        features: features.map(|(_, f)| f),
        labels,
        targets,
        train_mask,
        val_mask,
        test_mask,
    };
    graph.validate()?;
    Ok(graph)
}

/// Reads an `.npz` graph held in memory (see the module docs). For fuzzing and tests; errors
/// name the array at fault.
pub fn read_npz_bytes(bytes: &[u8]) -> Result<Graph, GraphError> {
    read_archive(Npz::open(Cursor::new(bytes), None)?, Mapping::Never)
}

/// Reads an `.npz` graph file (see the module docs). Errors name the file and the array. An
/// uncompressed, aligned `x.npy` member is mapped instead of copied ([`super::FeatureData`]).
pub fn read_npz(path: impl AsRef<Path>) -> Result<Graph, GraphError> {
    read_npz_with(path.as_ref(), Mapping::Allowed)
}

fn read_npz_with(path: &Path, map: Mapping) -> Result<Graph, GraphError> {
    let inner = || -> Result<Graph, GraphError> {
        let file = chunk_format::open_regular(path)?;
        let for_maps = file.try_clone()?;
        let before = Identity::of(&file)?;
        read_archive(
            Npz::open(
                BufReader::with_capacity(1 << 16, file),
                Some((for_maps.try_clone()?, path.to_path_buf())),
            )?,
            map,
        )
        .map_err(|e| {
            // A file rewritten under the reader fails in arbitrary ways: say what happened.
            if Identity::of(&for_maps).ok() == Some(before) {
                e
            } else {
                GraphErrorKind::InputChanged.into()
            }
        })
    };
    inner().map_err(|e| e.in_file(path))
}

/// Reads a graph from a directory of `.npy` files named as in an `.npz` (`edge_index.npy`,
/// `x.npy`, `y.npy`, masks, …; e.g. `unzip graph.npz -d graph/`). `x.npy` is mapped when it
/// holds `<f4` in C order (NumPy's usual layout; [`super::FeatureData`]); every other array is
/// decoded in 64 KiB pieces into its target vector. Errors name the directory and the array.
pub fn read_npy_dir(path: impl AsRef<Path>) -> Result<Graph, GraphError> {
    read_npy_dir_with(path.as_ref(), Mapping::Allowed)
}

fn read_npy_dir_with(path: &Path, map: Mapping) -> Result<Graph, GraphError> {
    if !entry_exists(&path.join("edge_index.npy")) {
        return Err(GraphError::from(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a directory without edge_index.npy: give a graph file, or a directory of \
             .npy files named as in an .npz (edge_index.npy, x.npy, y.npy, train_mask.npy, …)",
        ))
        .in_file(path));
    }
    read_archive(NpyDir { dir: path }, map).map_err(|e| e.in_file(path))
}

/// The `.npy` header (format 1.0) for `dtype` and `shape`, padded to a multiple of 64 bytes.
fn npy_header(dtype: Dtype, shape: &[u64]) -> Vec<u8> {
    npy_header_text(dtype.descr(), false, shape)
}

use distspmm_sparse::npy::header_text as npy_header_text;

/// How a member is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Member {
    /// Deflate-compressed.
    Compressed,
    /// Uncompressed, its data 64-byte aligned in the file (the header is a multiple of 64
    /// bytes), so that a reader can map it ([`super::FeatureData`]).
    Mappable,
}

/// Writes one array: header, then the elements encoded by `encode` in chunks.
fn write_array<W: Write + Seek, T: Copy>(
    zip: &mut ZipWriter<W>,
    name: &str,
    member: Member,
    dtype: Dtype,
    shape: &[u64],
    values: impl Iterator<Item = T>,
    encode: impl Fn(T, &mut Vec<u8>),
) -> Result<(), GraphError> {
    write_array_with(zip, name, member, dtype, shape, |out| {
        let mut pieces = Pieces::new(out);
        for v in values {
            pieces.push(|buf| encode(v, buf))?;
        }
        pieces.finish()
    })
}

/// Encoded elements handed on to a member in pieces of about 64 KiB. Every array goes through
/// here: the compressor's output depends on where the writes are cut, so one rule for the cut
/// keeps a streamed array byte-identical to the same array written from memory.
struct Pieces<'o> {
    buf: Vec<u8>,
    out: &'o mut dyn FnMut(&[u8]) -> Result<(), GraphError>,
}

impl<'o> Pieces<'o> {
    fn new(out: &'o mut dyn FnMut(&[u8]) -> Result<(), GraphError>) -> Self {
        Self {
            buf: Vec::with_capacity(1 << 16),
            out,
        }
    }

    /// Adds one element's bytes (`encode` appends at most 8).
    fn push(&mut self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<(), GraphError> {
        encode(&mut self.buf);
        if self.buf.len() >= (1 << 16) - 8 {
            (self.out)(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Hands on what is left.
    fn finish(self) -> Result<(), GraphError> {
        (self.out)(&self.buf)
    }
}

/// Writes one array: header, then the bytes `fill` passes to its writer, in order (they must
/// add up to `shape`'s elements).
fn write_array_with<W: Write + Seek>(
    zip: &mut ZipWriter<W>,
    name: &str,
    member: Member,
    dtype: Dtype,
    shape: &[u64],
    fill: impl FnOnce(&mut dyn FnMut(&[u8]) -> Result<(), GraphError>) -> Result<(), GraphError>,
) -> Result<(), GraphError> {
    let at = |kind| GraphError::in_array(name, kind);
    let header = npy_header(dtype, shape);
    let data_bytes = shape.iter().product::<u64>() * dtype.size() as u64;
    let options = SimpleFileOptions::default()
        .large_file(data_bytes + header.len() as u64 >= u64::from(u32::MAX));
    let options = match member {
        Member::Compressed => options
            .compression_method(CompressionMethod::Deflated)
            .compression_level(Some(1)),
        Member::Mappable => options
            .compression_method(CompressionMethod::Stored)
            .with_alignment(64),
    };
    zip.start_file(format!("{name}.npy"), options)
        .map_err(|e| at(zip_error(e)))?;
    zip.write_all(&header)
        .map_err(|e| at(GraphErrorKind::Io(e)))?;
    fill(&mut |bytes| zip.write_all(bytes).map_err(|e| at(GraphErrorKind::Io(e))))
}

/// Where `edge_index` comes from: the graph's arrays, or sorted edges streamed in pieces.
#[derive(Clone, Copy)]
enum EdgeSource<'a> {
    Graph,
    Sorted(&'a SortedEdges),
}

fn write_archive<W: Write + Seek>(
    zip: &mut ZipWriter<W>,
    g: &Graph,
    edges: EdgeSource<'_>,
) -> Result<(), GraphError> {
    let n = g.num_nodes as u64;
    let i64_le = |v: i64, out: &mut Vec<u8>| out.extend_from_slice(&v.to_le_bytes());
    let e = match edges {
        EdgeSource::Graph => g.num_edges() as u64,
        EdgeSource::Sorted(sorted) => sorted.num_edges(),
    };
    write_array_with(
        zip,
        "edge_index",
        Member::Compressed,
        Dtype::I64,
        &[2, e],
        |out| {
            let mut pieces = Pieces::new(out);
            match edges {
                EdgeSource::Graph => {
                    for &v in g.src.iter().chain(&g.dst) {
                        pieces.push(|buf| i64_le(i64::from(v), buf))?;
                    }
                }
                // Row 0 the sources, row 1 the targets: two passes over the pieces.
                EdgeSource::Sorted(sorted) => {
                    for shift in [32u32, 0] {
                        sorted.for_each_piece(&mut |keys| {
                            for &k in keys {
                                #[allow(
                                    clippy::cast_possible_truncation,
                                    reason = "deliberate: a key is (src << 32) | dst"
                                )]
                                let id = (k >> shift) as u32;
                                pieces.push(|buf| i64_le(i64::from(id), buf))?;
                            }
                            Ok(())
                        })?;
                    }
                }
            }
            pieces.finish()
        },
    )?;
    write_array(
        zip,
        "num_nodes",
        Member::Compressed,
        Dtype::I64,
        &[],
        core::iter::once(n as i64),
        i64_le,
    )?;
    let f32_le = |v: f32, out: &mut Vec<u8>| out.extend_from_slice(&v.to_le_bytes());
    if let Some(w) = &g.weights {
        write_array(
            zip,
            "edge_weight",
            Member::Compressed,
            Dtype::F32,
            &[e],
            w.iter().copied(),
            f32_le,
        )?;
    }
    if let Some(f) = &g.features {
        let shape = [n, f.dim as u64];
        write_array(
            zip,
            "x",
            Member::Mappable,
            Dtype::F32,
            &shape,
            f.data.iter().copied(),
            f32_le,
        )?;
    }
    if let Some(y) = &g.labels {
        write_array(
            zip,
            "y",
            Member::Compressed,
            Dtype::I64,
            &[n],
            y.iter().map(|&c| i64::from(c)),
            i64_le,
        )?;
    }
    if let Some(t) = &g.targets {
        write_array(
            zip,
            "y",
            Member::Compressed,
            Dtype::I64,
            &[n, t.classes as u64],
            t.data.iter().map(|&v| {
                if v == TARGET_UNLABELLED {
                    -1
                } else {
                    i64::from(v)
                }
            }),
            i64_le,
        )?;
    }
    for (name, mask) in [
        ("train_mask", &g.train_mask),
        ("val_mask", &g.val_mask),
        ("test_mask", &g.test_mask),
    ] {
        if let Some(m) = mask {
            let bytes = m.iter().map(|&b| u8::from(b));
            write_array(
                zip,
                name,
                Member::Compressed,
                Dtype::Bool,
                &[n],
                bytes,
                |b, out| out.push(b),
            )?;
        }
    }
    Ok(())
}

/// `graph` as the bytes of an `.npz` in PyG's layout (what [`write_npz`] puts in the file).
pub fn write_npz_bytes(graph: &Graph) -> Result<Vec<u8>, GraphError> {
    graph.validate()?;
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    write_archive(&mut zip, graph, EdgeSource::Graph)?;
    Ok(zip.finish().map_err(zip_error)?.into_inner())
}

/// Writes `graph` as an `.npz` in PyG's layout (`edge_index`, `num_nodes` and whichever of
/// `edge_weight`, `x`, `y`, masks the graph has; deflate-compressed, except `x`, stored
/// uncompressed and 64-byte aligned so that [`read_npz`] maps it), atomically: the archive is
/// written to a temporary file beside `path`, fsynced and renamed over it, and the directory
/// fsynced (`chunk_format::atomic`), so `path` holds the old file or the complete new one,
/// never a part. The output is byte-for-byte reproducible.
pub fn write_npz(path: impl AsRef<Path>, graph: &Graph) -> Result<(), GraphError> {
    write_npz_from(path.as_ref(), graph, EdgeSource::Graph)
}

/// [`write_npz`] for a graph whose edges are `edges` (sorted, in memory or in bucket files,
/// streamed into the archive piece by piece) and whose node data (`num_nodes`, features,
/// labels, masks) are `nodes`'s; `nodes`'s own edge arrays must be empty. The file is the one
/// [`write_npz`] writes for the same graph, byte for byte.
pub fn write_npz_edges(
    path: impl AsRef<Path>,
    nodes: &Graph,
    edges: &SortedEdges,
) -> Result<(), GraphError> {
    let path = path.as_ref();
    if !nodes.src.is_empty() || nodes.weights.is_some() || nodes.num_nodes != edges.num_nodes() {
        return Err(GraphError::from(GraphErrorKind::Invalid(format!(
            "the node data ({} nodes, {} edges of their own) do not go with {} streamed edges \
             over {} nodes",
            nodes.num_nodes,
            nodes.src.len(),
            edges.num_edges(),
            edges.num_nodes()
        )))
        .in_file(path));
    }
    write_npz_from(path, nodes, EdgeSource::Sorted(edges))
}

fn write_npz_from(path: &Path, graph: &Graph, edges: EdgeSource<'_>) -> Result<(), GraphError> {
    graph.validate().map_err(|e| e.in_file(path))?;
    let result = (|| -> Result<(), GraphError> {
        let mut out = chunk_format::atomic::AtomicFile::create(path).map_err(io::Error::from)?;
        let buffered = BufWriter::with_capacity(1 << 20, out.file());
        let mut zip = ZipWriter::new(StopAfterError::new(buffered));
        write_archive(&mut zip, graph, edges)?;
        zip.finish()
            .map_err(zip_error)?
            .inner
            .into_inner()
            .map_err(|e| GraphErrorKind::Io(e.into_error()))?;
        out.commit().map_err(io::Error::from)?;
        Ok(())
    })();
    result.map_err(|e| e.in_file(path))
}

/// Passes writes and seeks through until the first error, which it returns; after that
/// everything succeeds and goes nowhere (positions stay consistent, so the zip writer's own
/// checks hold). The error has been reported by then: this only keeps `ZipWriter`'s `Drop`,
/// which finalises an unfinished archive, from failing again and printing that failure to
/// stderr as Rust debug text (a full disk would show `ZipWriter drop failed: Io(Os { … })`
/// after the real message).
struct StopAfterError<W> {
    inner: W,
    failed: bool,
    /// The position as the zip writer sees it.
    pos: u64,
    /// The largest position written.
    end: u64,
}

impl<W> StopAfterError<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            failed: false,
            pos: 0,
            end: 0,
        }
    }

    fn note<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if result
            .as_ref()
            .is_err_and(|e| e.kind() != io::ErrorKind::Interrupted)
        {
            self.failed = true;
        }
        result
    }

    fn advance(&mut self, n: usize) {
        self.pos += n as u64;
        self.end = self.end.max(self.pos);
    }
}

impl<W: Write> Write for StopAfterError<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = if self.failed {
            buf.len()
        } else {
            let result = self.inner.write(buf);
            self.note(result)?
        };
        self.advance(n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.failed {
            return Ok(());
        }
        let result = self.inner.flush();
        self.note(result)
    }
}

impl<W: Seek> Seek for StopAfterError<W> {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        if !self.failed {
            let result = self.inner.seek(pos);
            self.pos = self.note(result)?;
            return Ok(self.pos);
        }
        let target = match pos {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            io::SeekFrom::End(d) => self.end.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

mod slice;
pub use slice::{read_slice, SliceNodes};

#[cfg(test)]
mod tests;
