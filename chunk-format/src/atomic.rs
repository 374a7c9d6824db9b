//! Atomic file writes, the one helper of the workspace (chunks, manifests, partition maps,
//! `.npz` graphs, training checkpoints): the new contents go to a temporary file beside the
//! final path, named `<file>.tmp-<pid>-<seq>`, which is fsynced and renamed over the final
//! path, and then the directory is fsynced so that the rename itself survives a crash. A
//! reader sees the old file or the complete new one, never a part; on any error (or a drop
//! before [`AtomicFile::commit`]) the temporary file is removed and the final path is
//! untouched. A writer killed before its rename leaves a temporary that
//! [`stale_temporary_of`] recognises.

use std::format;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A step of an atomic write that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}", path.display())]
pub struct AtomicWriteError {
    /// What was being done ("create", "write", "fsync", "rename to final name", "fsync
    /// directory").
    pub action: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl From<AtomicWriteError> for io::Error {
    /// The error with its step and path in the message, keeping the kind.
    fn from(e: AtomicWriteError) -> Self {
        io::Error::new(e.source.kind(), format!("{e}: {}", e.source))
    }
}

fn step(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> AtomicWriteError {
    let path = path.to_path_buf();
    move |source| AtomicWriteError {
        action,
        path,
        source,
    }
}

/// The temporary name for `path` of this process's next atomic write (the sequence number
/// keeps concurrent writers of one process apart).
fn temporary_path(path: &Path) -> Result<PathBuf, AtomicWriteError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| AtomicWriteError {
        action: "write",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"),
    })?;
    let mut tmp = name.to_os_string();
    tmp.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    Ok(path.with_file_name(tmp))
}

/// A file being written under a temporary name beside `path`; [`AtomicFile::commit`] puts it
/// at `path`. Dropped without a commit, it removes the temporary file.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary file (readable and writable, new) for a write of `path`.
    ///
    /// # Errors
    /// [`AtomicWriteError`] when the temporary file cannot be created.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, AtomicWriteError> {
        let path = path.as_ref();
        let tmp = temporary_path(path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(step("create", &tmp))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file,
            committed: false,
        })
    }

    /// The temporary file, to write (and read back) the contents.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// The temporary file's path (for messages).
    pub fn temporary_path(&self) -> &Path {
        &self.tmp
    }

    /// Fsyncs the temporary file, renames it to the final path and fsyncs the directory.
    ///
    /// # Errors
    /// [`AtomicWriteError`] naming the step; the temporary file is removed unless the rename
    /// happened (then only the directory fsync failed and the new file is in place).
    pub fn commit(mut self) -> Result<(), AtomicWriteError> {
        self.file.sync_all().map_err(step("fsync", &self.tmp))?;
        fs::rename(&self.tmp, &self.path).map_err(step("rename to final name", &self.tmp))?;
        self.committed = true;
        sync_parent_dir(&self.path)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the error being reported matters more than a failed cleanup.
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `path` atomically (see the [module docs](self)).
///
/// # Errors
/// [`AtomicWriteError`] naming the step that failed; `path` is then untouched.
pub fn write_atomically(path: impl AsRef<Path>, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    let mut out = AtomicFile::create(path)?;
    let tmp = out.temporary_path().to_path_buf();
    out.file().write_all(bytes).map_err(step("write", &tmp))?;
    out.commit()
}

/// Makes a rename (or a creation) in `path`'s directory durable: fsyncs the directory on Unix.
///
/// # Errors
/// [`AtomicWriteError`] when the directory cannot be opened or fsynced.
pub fn sync_parent_dir(path: &Path) -> Result<(), AtomicWriteError> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(step("fsync directory", dir))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// The file a temporary named `<file>.tmp-<pid>` or `<file>.tmp-<pid>-<seq>` stands for, if
/// `name` is one written by another process than this one: what the atomic writes above (and
/// the single-number names of older writers) leave behind when they are killed before their
/// rename. It never carries a final name.
pub fn stale_temporary_of(name: &str) -> Option<&str> {
    let (file, suffix) = name.rsplit_once(".tmp-")?;
    let mut numbers = suffix.split('-');
    let pid = numbers.next()?.parse::<u32>().ok()?;
    let rest_ok = numbers.all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (rest_ok && !file.is_empty() && pid != std::process::id()).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::ToOwned;
    use std::string::String;
    use std::vec::Vec;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomically(&path, b"old").unwrap();
        write_atomically(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["a.json"]);
    }

    #[test]
    fn a_dropped_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomically(&path, b"old").unwrap();
        let mut out = AtomicFile::create(&path).unwrap();
        out.file().write_all(b"half").unwrap();
        let tmp = out.temporary_path().to_path_buf();
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("a.json.tmp-"), "{name}");
        // Our own temporary is never "stale".
        assert_eq!(stale_temporary_of(&name), None);
        drop(out);
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["a.json"]);
    }

    #[test]
    fn a_missing_directory_names_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_atomically(dir.path().join("no/such/a.json"), b"x").unwrap_err();
        assert_eq!(e.action, "create");
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
        let e = write_atomically(Path::new("/"), b"x").unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn stale_temporaries_are_those_of_other_processes() {
        let other = std::process::id().wrapping_add(1);
        assert_eq!(
            stale_temporary_of(&format!("part-00001.chunk.tmp-{other}-3")),
            Some("part-00001.chunk")
        );
        assert_eq!(
            stale_temporary_of(&format!("manifest.json.tmp-{other}")),
            Some("manifest.json")
        );
        for name in [
            "manifest.json".to_owned(),
            format!("a.tmp-{}", std::process::id()),
            format!("a.tmp-{other}-"),
            format!("a.tmp-x{other}"),
            format!(".tmp-{other}"),
        ] {
            assert_eq!(stale_temporary_of(&name), None, "{name}");
        }
    }
}
