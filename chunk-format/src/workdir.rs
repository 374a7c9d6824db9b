//! Work directories beside an output: `.<name>.<kind>-<pid>` in the output's parent (the same
//! file system, so they have the output's space), removed when dropped, and the ones killed
//! processes left removed by the next run. One home for this rule: the chunk writer's staging
//! and bucket directories and `generate rmat`'s bucket files use it.
//!
//! Only files the tool writes there are ever removed: each [`Kind`] knows its own file names,
//! and a removal takes those (regular files, by name) and then the empty directory. A work
//! directory that holds anything else is left where it is, with a warning naming it. One that is
//! already gone (another run swept it first) is not an error, nor is a parent directory that is
//! not there: neither holds anything to remove.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::vec::Vec;

/// An I/O failure on a work directory, naming the path.
#[derive(Debug)]
pub struct WorkDirError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> WorkDirError + '_ {
    move |source| WorkDirError {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether an error on a path says that no directory is there (nothing in it to remove): the
/// path, or a directory on the way to it, does not exist or is not a directory.
fn no_directory(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// A kind of work directory: its name and the names of the files its writer puts there.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// The `<kind>` of `.<name>.<kind>-<pid>` (`staging`, `buckets`, `rmat`).
    pub name: &'static str,
    /// Whether a file name is one this kind's writer creates (and so may remove).
    pub owns: fn(&str) -> bool,
}

/// Whether `name` is `<prefix><digits><suffix>` with at least one digit (numbered work files
/// such as `bucket-00003`).
pub fn numbered(name: &str, prefix: &str, suffix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(suffix))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// `.<name>.<kind>-<pid>` in `parent`: this process's work directory of that kind for the
/// output `parent/name`.
pub fn sibling(parent: &Path, name: &OsStr, kind: Kind) -> PathBuf {
    let mut sibling = OsString::from(".");
    sibling.push(name);
    sibling.push(std::format!(".{}-{}", kind.name, std::process::id()));
    parent.join(sibling)
}

/// Which leftover work directories are stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Every one: the caller holds the output's lock, so no live writer owns one.
    All,
    /// Those whose process no longer exists (without a lock, a live one may be in use).
    OfDeadProcesses,
}

/// Removes the work directories `.<name>.<kind>-<pid>` in `parent` that `which` calls stale: the
/// files of `kind` in each, then the directory; one that holds anything else stays, with a
/// warning. A `parent` that is not there (or not a directory) holds none: nothing to do.
pub fn remove_stale(
    parent: &Path,
    name: &OsStr,
    kind: Kind,
    which: Stale,
) -> Result<(), WorkDirError> {
    let Some(name) = name.to_str() else {
        return Ok(());
    };
    let prefix = std::format!(".{name}.{}-", kind.name);
    let listing = match std::fs::read_dir(parent) {
        Ok(listing) => listing,
        Err(e) if no_directory(&e) => return Ok(()),
        Err(e) => return Err(at(parent)(e)),
    };
    for entry in listing {
        let entry = entry.map_err(at(parent))?;
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .filter(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let dead = || {
            pid.parse::<libc::pid_t>()
                .map_or(true, |pid| !process_exists(pid))
        };
        if (which == Stale::All || dead()) && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let path = entry.path();
            tracing::info!(path = %path.display(), "removing a {} directory left by an interrupted run", kind.name);
            let foreign = remove_own(&path, kind)?;
            warn_kept(&path, &foreign);
        }
    }
    Ok(())
}

/// Removes the regular files `kind` owns from `dir`, then `dir` if nothing else is left; returns
/// the names of the entries that are not `kind`'s (sorted), which stay with the directory. A
/// `dir` (or file in it) that another run removed meanwhile is simply gone: not an error.
pub fn remove_own(dir: &Path, kind: Kind) -> Result<Vec<OsString>, WorkDirError> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if no_directory(&e) => return Ok(Vec::new()),
        Err(e) => return Err(at(dir)(e)),
    };
    let mut foreign = Vec::new();
    for entry in listing {
        let entry = entry.map_err(at(dir))?;
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(kind.owns)
            && match entry.file_type() {
                Ok(t) => t.is_file(),
                // Removed meanwhile: nothing left to remove or keep.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(at(dir)(e)),
            };
        if !ours {
            foreign.push(name);
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(at(&path)(e)),
        }
    }
    foreign.sort();
    if foreign.is_empty() {
        match std::fs::remove_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(at(dir)(e)),
        }
    }
    Ok(foreign)
}

/// The warning for a work directory kept because it holds `foreign` entries (nothing if none).
fn warn_kept(dir: &Path, foreign: &[OsString]) {
    if let Some(first) = foreign.first() {
        tracing::warn!(
            "{} holds {} that distspmm did not write (the first: {}); it was left as it is: \
             move what you need out of it and remove it",
            dir.display(),
            entries(foreign.len()),
            Path::new(first).display()
        );
    }
}

/// "1 entry", "N entries".
pub fn entries(n: usize) -> std::string::String {
    if n == 1 {
        "1 entry".into()
    } else {
        std::format!("{n} entries")
    }
}

/// Whether a process `pid` exists (signal 0 reaches it, or it exists but belongs to another
/// user).
fn process_exists(pid: libc::pid_t) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: `kill` with signal 0 sends nothing; it only checks that `pid` exists and may be
    // signalled. It reads no memory of ours.
    let reached = unsafe { libc::kill(pid, 0) } == 0;
    reached || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A work directory of one [`Kind`], removed when dropped (its own files, then the directory;
/// see [`remove_own`]).
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    kind: Kind,
    /// Whether the directory is still there to remove (see [`WorkDir::remove`]).
    armed: bool,
}

impl WorkDir {
    /// Creates `.<name>.<kind>-<pid>` in `parent` (new: an existing one is an error).
    pub fn beside(parent: &Path, name: &OsStr, kind: Kind) -> Result<Self, WorkDirError> {
        let path = sibling(parent, name, kind);
        std::fs::create_dir(&path).map_err(at(&path))?;
        Ok(Self {
            path,
            kind,
            armed: true,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory to the caller (it was renamed into place, say): nothing is removed.
    pub fn keep(mut self) {
        self.armed = false;
    }

    /// Removes the directory now (as a drop does, but reporting errors); returns the entries
    /// that are not this kind's, which stay with the directory.
    pub fn remove(mut self) -> Result<Vec<OsString>, WorkDirError> {
        self.armed = false;
        remove_own(&self.path, self.kind)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match remove_own(&self.path, self.kind) {
            Ok(foreign) => warn_kept(&self.path, &foreign),
            Err(err) => {
                tracing::warn!(path = %err.path.display(), err = %err.source, "cannot remove a work directory");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::String;

    fn is_bucket(name: &str) -> bool {
        numbered(name, "bucket-", "")
    }

    const TEST: Kind = Kind {
        name: "test",
        owns: is_bucket,
    };

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn numbered_names_need_digits_between_prefix_and_suffix() {
        assert!(numbered("bucket-00012.u64", "bucket-", ".u64"));
        assert!(!numbered("bucket-.u64", "bucket-", ".u64"));
        assert!(!numbered("bucket-1a.u64", "bucket-", ".u64"));
        assert!(!numbered("bucket-1.u64.bak", "bucket-", ".u64"));
    }

    #[test]
    fn a_work_directory_removes_its_own_files_and_leaves_foreign_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = WorkDir::beside(tmp.path(), OsStr::new("out"), TEST).unwrap();
        let path = dir.path().to_path_buf();
        assert_eq!(
            path.file_name().unwrap().to_str().unwrap(),
            std::format!(".out.test-{}", std::process::id())
        );
        std::fs::write(path.join("bucket-00000"), b"ours").unwrap();
        drop(dir);
        assert!(!path.exists());

        let dir = WorkDir::beside(tmp.path(), OsStr::new("out"), TEST).unwrap();
        std::fs::write(path.join("bucket-00000"), b"ours").unwrap();
        std::fs::write(path.join("notes.txt"), b"yours").unwrap();
        // A directory with one of our names is not ours either.
        std::fs::create_dir(path.join("bucket-00001")).unwrap();
        std::fs::write(path.join("bucket-00001/x"), b"yours").unwrap();
        let kept = dir.remove().unwrap();
        assert_eq!(
            kept,
            [OsString::from("bucket-00001"), OsString::from("notes.txt")]
        );
        assert_eq!(names(&path), ["bucket-00001", "notes.txt"]);
        assert_eq!(std::fs::read(path.join("notes.txt")).unwrap(), b"yours");
    }

    #[test]
    fn stale_directories_lose_only_their_own_files() {
        let tmp = tempfile::tempdir().unwrap();
        let clean = tmp.path().join(".out.test-4000000001");
        let mixed = tmp.path().join(".out.test-4000000002");
        let other = tmp.path().join(".other.test-4000000003");
        for dir in [&clean, &mixed, &other] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("bucket-00007"), b"ours").unwrap();
        }
        std::fs::write(mixed.join("photo.jpg"), b"yours").unwrap();
        // A file with the prefix is not a directory to sweep.
        std::fs::write(tmp.path().join(".out.test-4000000004"), b"yours").unwrap();
        remove_stale(tmp.path(), OsStr::new("out"), TEST, Stale::OfDeadProcesses).unwrap();
        assert!(!clean.exists());
        assert_eq!(names(&mixed), ["photo.jpg"]);
        assert_eq!(names(&other), ["bucket-00007"]);
        assert!(tmp.path().join(".out.test-4000000004").is_file());
        // A live process's directory stays unless every one is stale.
        let live = sibling(tmp.path(), OsStr::new("out"), TEST);
        std::fs::create_dir(&live).unwrap();
        remove_stale(tmp.path(), OsStr::new("out"), TEST, Stale::OfDeadProcesses).unwrap();
        assert!(live.exists());
        remove_stale(tmp.path(), OsStr::new("out"), TEST, Stale::All).unwrap();
        assert!(!live.exists());
    }

    #[test]
    fn a_parent_that_is_not_a_directory_holds_nothing_to_sweep() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"yours").unwrap();
        for parent in [
            tmp.path().join("missing/dir"),
            file.clone(),
            file.join("below"),
        ] {
            for which in [Stale::OfDeadProcesses, Stale::All] {
                remove_stale(&parent, OsStr::new("out"), TEST, which)
                    .unwrap_or_else(|e| panic!("{}: {}", parent.display(), e.source));
            }
        }
        assert_eq!(std::fs::read(&file).unwrap(), b"yours");
    }

    #[test]
    fn a_work_directory_already_removed_is_not_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        // Two runs sweeping one stale directory: the second finds it gone.
        let stale = tmp.path().join(".out.test-4000000001");
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("bucket-00007"), b"ours").unwrap();
        assert!(remove_own(&stale, TEST).unwrap().is_empty());
        assert!(!stale.exists());
        assert!(remove_own(&stale, TEST).unwrap().is_empty());
        // A run's own directory removed under it: removing it says nothing is kept.
        let dir = WorkDir::beside(tmp.path(), OsStr::new("out"), TEST).unwrap();
        std::fs::remove_dir(dir.path()).unwrap();
        assert!(dir.remove().unwrap().is_empty());
    }
}
