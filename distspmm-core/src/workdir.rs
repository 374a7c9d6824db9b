//! Work directories beside an output: `.<name>.<kind>-<pid>` in the output's parent (the same
//! file system, so they have the output's space), removed with their files when dropped, and
//! the ones killed processes left removed by the next run. One home for this rule: the chunk
//! writer's staging and bucket directories and `generate rmat`'s bucket files use it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// An I/O failure on a work directory, naming the path.
#[derive(Debug)]
pub(crate) struct WorkDirError {
    pub(crate) path: PathBuf,
    pub(crate) source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> WorkDirError + '_ {
    move |source| WorkDirError {
        path: path.to_path_buf(),
        source,
    }
}

/// `.<name>.<kind>-<pid>` in `parent`: this process's work directory of that kind for the
/// output `parent/name`.
pub(crate) fn sibling(parent: &Path, name: &OsStr, kind: &str) -> PathBuf {
    let mut sibling = std::ffi::OsString::from(".");
    sibling.push(name);
    sibling.push(std::format!(".{kind}-{}", std::process::id()));
    parent.join(sibling)
}

/// Which leftover work directories are stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stale {
    /// Every one: the caller holds the output's lock, so no live writer owns one.
    All,
    /// Those whose process no longer exists (without a lock, a live one may be in use).
    OfDeadProcesses,
}

/// Removes the work directories `.<name>.<kind>-<pid>` in `parent` that `which` calls stale.
pub(crate) fn remove_stale(
    parent: &Path,
    name: &OsStr,
    kind: &str,
    which: Stale,
) -> Result<(), WorkDirError> {
    let Some(name) = name.to_str() else {
        return Ok(());
    };
    let prefix = std::format!(".{name}.{kind}-");
    for entry in std::fs::read_dir(parent).map_err(at(parent))? {
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
        if which == Stale::All || dead() {
            let path = entry.path();
            tracing::info!(path = %path.display(), "removing a {kind} directory left by an interrupted run");
            std::fs::remove_dir_all(&path).map_err(at(&path))?;
        }
    }
    Ok(())
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

/// A work directory, removed with its files when dropped.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    /// Creates `path` (new: an existing one is an error).
    pub(crate) fn create(path: PathBuf) -> Result<Self, WorkDirError> {
        std::fs::create_dir(&path).map_err(at(&path))?;
        Ok(Self { path })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), %err, "cannot remove a work directory");
        }
    }
}
