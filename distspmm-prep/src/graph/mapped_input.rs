//! Input files mapped into memory, guarded against being changed while they are read.
//!
//! Reading a mapped page past the end of a file that another process has truncated raises
//! `SIGBUS`, which kills the process (and leaves its half-written outputs behind); a rewrite in
//! place changes the bytes under the reader without any signal. So every mapping made here is
//! registered — its address range, in a fixed table of atomics — with a `SIGBUS` handler
//! installed once per process. A fault inside a registered range maps a page of zeros over the
//! faulting page, marks that mapping changed and returns, so the read completes (with zeros)
//! instead of killing the process; a fault anywhere else restores the disposition that was in
//! place before and returns, so that it is raised again and handled as it would have been.
//! [`MappedInput::check`] reports a fault, or a change of the file's length or modification
//! time since it was mapped (a rewrite in place that never faults), as an error: a reader calls
//! it after it used the data and before anything made from them is committed.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use memmap2::Mmap;

use super::{GraphError, GraphErrorKind};

/// Mappings that can be registered at once; more are not mapped (the readers copy instead).
const SLOTS: usize = 64;

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const ACTIVE: u8 = 2;

/// One registered mapping: `start..end` (whole pages), and whether a fault hit it.
struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    end: AtomicUsize,
    changed: AtomicBool,
}

#[allow(
    clippy::declare_interior_mutable_const,
    reason = "the initialiser of each slot of the static table, never used as a value"
)]
const EMPTY: Slot = Slot {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    changed: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The `SIGBUS` disposition before ours, restored for a fault that is not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// The `SIGBUS` handler: see the module docs. Only atomics and async-signal-safe system calls
/// (`mmap`, `sigaction`, `raise`); no allocation, no lock.
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to a handler installed with `SA_SIGINFO`.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let page = PAGE_SIZE.load(Ordering::Relaxed);
    // A fault (si_code > 0), not a signal sent by a process.
    if code > 0 && page.is_power_of_two() {
        for slot in &TABLE {
            if slot.state.load(Ordering::Acquire) != ACTIVE {
                continue;
            }
            let (start, end) = (
                slot.start.load(Ordering::Relaxed),
                slot.end.load(Ordering::Relaxed),
            );
            if !(start..end).contains(&addr) {
                continue;
            }
            let base = addr & !(page - 1);
            // SAFETY: the page lies inside a live read-only mapping of an input file (its slot
            // is active, so the mapping is not yet unmapped: unregistering comes first). A
            // private anonymous page replaces it in place (`MAP_FIXED`); the mapping's owner
            // unmaps the whole range, this page included, when it is dropped.
            let mapped = unsafe {
                libc::syscall(
                    libc::SYS_mmap,
                    base,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if usize::try_from(mapped).ok() == Some(base) {
                slot.changed.store(true, Ordering::Release);
                return;
            }
            break;
        }
    }
    // Not ours: the previous disposition handles it, as if this handler had never been there.
    // SAFETY: `sigaction` and `raise` are async-signal-safe; `previous` points to the
    // disposition saved before this handler was installed (`install` sets it first).
    unsafe {
        if let Some(previous) = PREVIOUS.get() {
            libc::sigaction(signal, std::ptr::from_ref(previous), std::ptr::null_mut());
        }
        if code <= 0 {
            // A sent signal does not come back by itself on return: raise it again (it is
            // blocked until this handler returns).
            libc::raise(signal);
        }
    }
}

/// Installs the handler once; whether it is in place.
fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: `sysconf` reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let Ok(page) = usize::try_from(page) else {
            return;
        };
        PAGE_SIZE.store(page, Ordering::Relaxed);
        // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask, no flags); the
        // calls write or read only the structures passed.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &raw mut previous) != 0 {
                return;
            }
            let _ = PREVIOUS.set(previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                on_sigbus;
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&raw mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &raw const action, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
    INSTALLED.load(Ordering::Acquire)
}

/// Registers `range` in a free slot; `None` if the table is full.
fn register(start: usize, len: usize) -> Option<usize> {
    let page = PAGE_SIZE.load(Ordering::Relaxed);
    let end = start.checked_add(len)?.checked_next_multiple_of(page)?;
    TABLE.iter().position(|slot| {
        if slot
            .state
            .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        slot.start.store(start, Ordering::Relaxed);
        slot.end.store(end, Ordering::Relaxed);
        slot.changed.store(false, Ordering::Relaxed);
        slot.state.store(ACTIVE, Ordering::Release);
        true
    })
}

/// What identifies an open file's contents at one time: its length and modification time (a
/// rewrite in place changes one or both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Identity {
    pub(crate) fn of(file: &File) -> std::io::Result<Self> {
        let meta = file.metadata()?;
        Ok(Identity {
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// A whole input file mapped read-only, registered with the `SIGBUS` guard (see the module
/// docs).
pub(crate) struct MappedInput {
    map: Mmap,
    slot: usize,
    /// The file mapped (kept open: its length and modification time are compared by
    /// [`MappedInput::check`], on the same inode even if the path is replaced).
    file: File,
    path: PathBuf,
    identity: Identity,
}

impl MappedInput {
    /// Maps `file` (the input at `path`); `Ok(None)` where the guard cannot be installed or
    /// every slot is taken (the caller then reads by copying).
    pub(crate) fn map(file: &File, path: &Path) -> std::io::Result<Option<Self>> {
        if !install() {
            return Ok(None);
        }
        let file = file.try_clone()?;
        let identity = Identity::of(&file)?;
        // SAFETY: the file is opened read-only and the mapping is only read. A truncation by
        // another process while it is read is caught by the registered `SIGBUS` guard (the
        // page reads as zeros and the mapping is marked changed), and any change is reported
        // by `check`, which the readers call before they commit what they made of the data.
        let map = unsafe { Mmap::map(&file) }?;
        let Some(slot) = register(map.as_ptr() as usize, map.len()) else {
            return Ok(None);
        };
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(Some(MappedInput {
            map,
            slot,
            file,
            path: path.to_path_buf(),
            identity,
        }))
    }

    /// The file's bytes (zeros where it shrank after it was mapped).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file mapped.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// An error if the file changed since it was mapped: a read past its new end (a fault), or
    /// another length or modification time now.
    pub(crate) fn check(&self) -> Result<(), GraphError> {
        let faulted = TABLE[self.slot].changed.load(Ordering::Acquire);
        let now = Identity::of(&self.file);
        if faulted || now.ok() != Some(self.identity) {
            return Err(GraphError::from(GraphErrorKind::InputChanged).in_file(&self.path));
        }
        Ok(())
    }
}

impl Drop for MappedInput {
    fn drop(&mut self) {
        // Unregistered before the mapping goes (the `Mmap` field is dropped after this).
        TABLE[self.slot].state.store(FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::string::ToString;

    fn file_of(bytes: usize) -> (tempfile::TempDir, PathBuf, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        let mut f = File::create(&path).unwrap();
        f.write_all(&std::vec![7u8; bytes]).unwrap();
        drop(f);
        let file = File::open(&path).unwrap();
        (dir, path, file)
    }

    #[test]
    fn a_truncated_input_reads_as_zeros_and_is_reported() {
        let len = 5 * 4096 + 100;
        let (_dir, path, file) = file_of(len);
        let input = MappedInput::map(&file, &path).unwrap().expect("mapped");
        assert!(input.bytes().iter().all(|&b| b == 7));
        input.check().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        // Without the guard this read would kill the test process with SIGBUS.
        let bytes = input.bytes();
        assert!(bytes[..4096].iter().all(|&b| b == 7));
        assert!(bytes[4096..].iter().all(|&b| b == 0), "zeros past the end");
        let err = input.check().unwrap_err();
        assert!(matches!(err.kind(), GraphErrorKind::InputChanged), "{err}");
        assert_eq!(err.file(), Some(path.as_path()));
        assert!(
            err.to_string().contains("changed while it was being read"),
            "{err}"
        );
    }

    #[test]
    fn a_rewrite_in_place_is_reported_without_a_fault() {
        let (_dir, path, file) = file_of(8192);
        let input = MappedInput::map(&file, &path).unwrap().expect("mapped");
        input.check().unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(&[1u8; 16]).unwrap();
        // Same length; the modification time set apart from the mapping's (a rewrite within
        // the file system's timestamp granularity would otherwise look unchanged).
        f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        assert!(input.check().is_err());
    }

    #[test]
    fn slots_are_freed_when_a_mapping_is_dropped() {
        let (_dir, path, file) = file_of(100);
        for _ in 0..(2 * SLOTS) {
            let input = MappedInput::map(&file, &path)
                .unwrap()
                .expect("a slot is free");
            input.check().unwrap();
        }
    }
}
