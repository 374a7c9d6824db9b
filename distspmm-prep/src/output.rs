//! Output files other than chunk directories (a generated graph, the METIS graph file of
//! `partition --write-metis-graph`): the one no-clobber rule every such file follows.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// An output file could not be written, or exists with other contents.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The file exists with different contents and `force` was not given.
    #[error(
        "{} already exists with different contents; pass --force to replace it or choose \
         another {option}",
        path.display()
    )]
    Exists {
        /// The output file.
        path: PathBuf,
        /// The option that names it (`--out`).
        option: String,
    },
    /// The scratch directory beside the output could not be created.
    #[error("cannot create a directory beside {}", path.display())]
    Scratch {
        /// The output file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file to compare could not be opened.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Comparing the contents failed.
    #[error(transparent)]
    Compare(#[from] std::io::Error),
    /// The writer failed.
    #[error(transparent)]
    Write(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// The one no-clobber rule for an output file: writes `out` with `write_to` (which writes a
/// whole file at the path it is given, atomically). An existing file is replaced only with
/// `force` or when the new contents are identical (then it is left alone and `false` is
/// returned); `option` names the output in the refusal (`--out`).
pub fn write<E>(
    out: &Path,
    force: bool,
    option: &str,
    write_to: impl Fn(&Path) -> Result<(), E>,
) -> Result<bool, OutputError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let wrote = |e: E| OutputError::Write(Box::new(e));
    if force || !out.exists() {
        write_to(out).map_err(wrote)?;
        return Ok(true);
    }
    // The candidate is written into a fresh directory of its own beside the output (created
    // exclusively under a random name, so nothing there is anyone else's), under the output's
    // own file name: writers may insist on its extension (`.npz`).
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_name = out.file_name().unwrap_or(std::ffi::OsStr::new("output"));
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(file_name);
    prefix.push(".");
    let scratch = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".candidate")
        .tempdir_in(parent)
        .map_err(|source| OutputError::Scratch {
            path: out.to_path_buf(),
            source,
        })?;
    let candidate = scratch.path().join(file_name);
    let outcome = write_to(&candidate)
        .map_err(wrote)
        .and_then(|()| same_contents(&candidate, out));
    // Only what this call wrote is removed: its candidate, then the directory it created.
    let _ = std::fs::remove_file(&candidate);
    let _ = std::fs::remove_dir(scratch.keep());
    if outcome? {
        return Ok(false);
    }
    Err(OutputError::Exists {
        path: out.to_path_buf(),
        option: option.into(),
    })
}

fn same_contents(a: &Path, b: &Path) -> Result<bool, OutputError> {
    let open = |p: &Path| -> Result<(u64, BufReader<File>), OutputError> {
        let f = chunk_format::open_regular(p).map_err(|source| OutputError::Read {
            path: p.to_path_buf(),
            source,
        })?;
        let len = f.metadata()?.len();
        Ok((len, BufReader::with_capacity(1 << 16, f)))
    };
    let ((len_a, mut ra), (len_b, mut rb)) = (open(a)?, open(b)?);
    if len_a != len_b {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = ra.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        rb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}
