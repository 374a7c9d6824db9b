//! Atomic file writes, the one helper of the workspace (chunks, manifests, partition maps,
//! `.npz` graphs, training checkpoints): the new contents go to a temporary file beside the
//! final path, named `<file>.tmp-<pid>-<seq>`, which is fsynced and renamed over the final
//! path, and then the directory is fsynced so that the rename itself survives a crash. A
//! reader sees the old file or the complete new one, never a part; on any error (or a drop
//! before [`AtomicFile::commit`]) the temporary file is removed and the final path is
//! untouched. A writer killed before its rename leaves a temporary that
//! [`stale_temporary_of`] recognises. A file written by several processes at once (the
//! ranks of `distspmm predict`, each its rows) is one [`AtomicFile`] whose temporary the
//! others open with [`open_temporary`]; it is committed once every writer has succeeded.
//!
//! Only a regular file is ever replaced: a final path that is a directory, a FIFO, a device or
//! a socket is refused before anything is written (and checked again just before the rename).
//! A symbolic link is resolved once and its target written, if that is a regular file; the
//! link stays a link. A dangling link, or one to anything but a regular file, is refused.

use std::format;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::string::String;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::file::describe_file_type;

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

/// The file an atomic write of `path` replaces: `path` when it is absent or a regular file,
/// the target of a symbolic link to a regular file; anything else is an error naming `path`
/// and what it is.
fn final_path(path: &Path) -> Result<PathBuf, AtomicWriteError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(e) => return Err(step("inspect", path)(e)),
    };
    if meta.is_file() {
        return Ok(path.to_path_buf());
    }
    if !meta.file_type().is_symlink() {
        return Err(not_replaceable(path, meta.file_type()));
    }
    let refuse = |detail: String| AtomicWriteError {
        action: "write",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, detail),
    };
    let target = match fs::canonicalize(path) {
        Ok(target) => target,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let to = fs::read_link(path).unwrap_or_default();
            return Err(refuse(format!(
                "it is a symbolic link to {}, which does not exist: remove the link or choose \
                 another path",
                to.display()
            )));
        }
        Err(e) => return Err(step("resolve the symbolic link", path)(e)),
    };
    let kind = fs::metadata(&target)
        .map_err(step("inspect", &target))?
        .file_type();
    if kind.is_file() {
        return Ok(target);
    }
    Err(refuse(format!(
        "it is a symbolic link to {}, which is {}, not a regular file: only a regular file is \
         replaced; choose another path",
        target.display(),
        describe_file_type(kind)
    )))
}

/// The error for a final path that is not a regular file (an atomic write would replace it).
fn not_replaceable(path: &Path, kind: fs::FileType) -> AtomicWriteError {
    let detail = if kind.is_dir() {
        String::from("it is a directory: give the path of a file (for example one inside it)")
    } else {
        format!(
            "it is {}, not a regular file: only a regular file is replaced; remove it or \
             choose another path",
            describe_file_type(kind)
        )
    };
    AtomicWriteError {
        action: "write",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, detail),
    }
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
    /// Creates the temporary file (readable and writable, new) for a write of `path` (of its
    /// target, if `path` is a symbolic link to a regular file).
    ///
    /// # Errors
    /// [`AtomicWriteError`] when `path` is neither absent nor a regular file (nor a link to
    /// one), or the temporary file cannot be created.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, AtomicWriteError> {
        let path = final_path(path.as_ref())?;
        let path = path.as_path();
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
        // Something other than a regular file may have taken the path since `create`.
        match fs::symlink_metadata(&self.path) {
            Ok(meta) if !meta.is_file() => {
                return Err(not_replaceable(&self.path, meta.file_type()))
            }
            _ => {}
        }
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

/// Opens the temporary file of an [`AtomicFile`] that another process created (on a filesystem
/// both see) to write parts of it in place: a file written by several processes at once, as
/// the ranks of a distributed command each write their rows at their offsets. The rule of such
/// a write: every writer writes its part, syncs it (`File::sync_data`) and says so; the
/// creating process commits only after all have succeeded, and drops the [`AtomicFile`] (which
/// removes the temporary) if any failed, so the final path holds the old file or the whole new
/// one, as for a write by one process.
///
/// # Errors
/// [`AtomicWriteError`] when `tmp` is not named as a temporary of an atomic write, cannot be
/// opened for writing (it is absent, say on a filesystem this process does not share), or is
/// not a regular file.
pub fn open_temporary(tmp: &Path) -> Result<File, AtomicWriteError> {
    let named = tmp
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(temporary_of)
        .is_some();
    if !named {
        return Err(AtomicWriteError {
            action: "open",
            path: tmp.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "it is not the temporary of an atomic write (`<file>.tmp-<pid>-<seq>`)",
            ),
        });
    }
    let file = OpenOptions::new()
        .write(true)
        .open(tmp)
        .map_err(step("open", tmp))?;
    let kind = file.metadata().map_err(step("inspect", tmp))?.file_type();
    if !kind.is_file() {
        return Err(not_replaceable(tmp, kind));
    }
    Ok(file)
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
    temporary_of(name).and_then(|(file, pid)| (pid != std::process::id()).then_some(file))
}

/// The file a temporary named `<file>.tmp-<pid>` or `<file>.tmp-<pid>-<seq>` stands for, and
/// the writer's process id, whichever process that is (see [`stale_temporary_of`] for those a
/// live writer of this process cannot own).
pub fn temporary_of(name: &str) -> Option<(&str, u32)> {
    let (file, suffix) = name.rsplit_once(".tmp-")?;
    let mut numbers = suffix.split('-');
    let pid = numbers.next()?.parse::<u32>().ok()?;
    let rest_ok = numbers.all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (rest_ok && !file.is_empty()).then_some((file, pid))
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

    /// Makes a FIFO at `path` (with the `mkfifo` tool).
    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn is_fifo(path: &Path) -> bool {
        use std::os::unix::fs::FileTypeExt;
        fs::symlink_metadata(path).unwrap().file_type().is_fifo()
    }

    #[test]
    fn a_fifo_or_a_directory_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("out.svg");
        mkfifo(&fifo);
        let e = write_atomically(&fifo, b"x").unwrap_err();
        assert_eq!(e.path, fifo);
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
        let message = format!("{}", io::Error::from(e));
        assert!(
            message.contains("it is a FIFO (named pipe), not a regular file"),
            "{message}"
        );
        assert!(is_fifo(&fifo));
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let e = write_atomically(&sub, b"x").unwrap_err();
        assert_eq!(e.path, sub);
        let message = format!("{}", io::Error::from(e));
        assert!(message.contains("it is a directory"), "{message}");
        assert!(!message.contains(".tmp-"), "{message}");
        assert!(sub.is_dir());
        assert_eq!(names(dir.path()), ["out.svg", "sub"]);
    }

    #[test]
    fn a_symbolic_link_is_written_through_to_a_regular_target_only() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        write_atomically(&target, b"old").unwrap();
        let link = dir.path().join("link.json");
        symlink(&target, &link).unwrap();
        write_atomically(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&target).unwrap(), b"new");

        // Dangling, to a FIFO, to a directory: refused, nothing changes.
        let dangling = dir.path().join("dangling.json");
        symlink(dir.path().join("absent.json"), &dangling).unwrap();
        let e = write_atomically(&dangling, b"x").unwrap_err();
        let message = format!("{}", io::Error::from(e));
        assert!(message.contains("which does not exist"), "{message}");
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        let to_fifo = dir.path().join("to-fifo");
        symlink(&fifo, &to_fifo).unwrap();
        let e = write_atomically(&to_fifo, b"x").unwrap_err();
        assert_eq!(e.path, to_fifo);
        let message = format!("{}", io::Error::from(e));
        assert!(
            message.contains("a FIFO (named pipe), not a regular file"),
            "{message}"
        );
        assert!(is_fifo(&fifo));
        let to_dir = dir.path().join("to-dir");
        symlink(dir.path(), &to_dir).unwrap();
        assert!(write_atomically(&to_dir, b"x").is_err());
        assert_eq!(
            names(dir.path()),
            [
                "dangling.json",
                "fifo",
                "link.json",
                "target.json",
                "to-dir",
                "to-fifo"
            ]
        );
    }

    #[test]
    fn a_device_is_never_replaced_even_through_a_link() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("null.svg");
        symlink("/dev/null", &link).unwrap();
        let e = write_atomically(&link, b"x").unwrap_err();
        let message = format!("{}", io::Error::from(e));
        assert!(
            message.contains("/dev/null, which is a device"),
            "{message}"
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn a_temporary_written_by_two_writers_appears_whole_or_not_at_all() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.npy");
        let mut out = AtomicFile::create(&path).unwrap();
        out.file().set_len(8).unwrap();
        let other = open_temporary(out.temporary_path()).unwrap();
        other.write_all_at(b"5678", 4).unwrap();
        other.sync_data().unwrap();
        out.file().write_all_at(b"1234", 0).unwrap();
        assert!(!path.exists(), "visible before the commit");
        out.commit().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"12345678");
        // A failed writer: the creator drops its file, and nothing appears.
        let out = AtomicFile::create(dir.path().join("b.npy")).unwrap();
        let tmp = out.temporary_path().to_path_buf();
        drop(out);
        let e = open_temporary(&tmp).unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
        assert_eq!(names(dir.path()), ["rows.npy"]);
        // Only a temporary's name is opened.
        let e = open_temporary(&path).unwrap_err();
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
        let own = format!("manifest.json.tmp-{}-0", std::process::id());
        assert_eq!(
            temporary_of(&own),
            Some(("manifest.json", std::process::id()))
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
