//! Output files of the command line: the one no-clobber rule every output file follows.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context};

/// The command line's one no-clobber rule for an output file: writes `out` with `write_to`
/// (which writes a whole file at the path it is given, atomically). An existing file is
/// replaced only with `force` or when the new contents are identical (then it is left alone and
/// `false` is returned); `option` names the output in the refusal (`--out`).
pub fn write<E>(
    out: &Path,
    force: bool,
    option: &str,
    write_to: impl Fn(&Path) -> Result<(), E>,
) -> anyhow::Result<bool>
where
    E: std::error::Error + Send + Sync + 'static,
{
    if force || !out.exists() {
        write_to(out)?;
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
        .with_context(|| format!("cannot create a directory beside {}", out.display()))?;
    let candidate = scratch.path().join(file_name);
    let outcome = write_to(&candidate)
        .map_err(anyhow::Error::from)
        .and_then(|()| same_contents(&candidate, out));
    // Only what this call wrote is removed: its candidate, then the directory it created.
    let _ = std::fs::remove_file(&candidate);
    let _ = std::fs::remove_dir(scratch.keep());
    if outcome? {
        return Ok(false);
    }
    bail!(
        "{} already exists with different contents; pass --force to replace it or choose another {option}",
        out.display()
    )
}

fn same_contents(a: &Path, b: &Path) -> anyhow::Result<bool> {
    let open = |p: &Path| -> anyhow::Result<(u64, BufReader<File>)> {
        let f = chunk_format::open_regular(p)
            .with_context(|| format!("cannot read {}", p.display()))?;
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
