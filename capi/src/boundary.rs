//! The boundary between C and Rust: the status enum, the error every body returns, the panic
//! guard every exported body runs in, the thread-local last-error message, and the one place
//! where raw pointers become references ([`Handle`], [`OutPtr`], [`slice()`], [`slice_mut`]).

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use chunk_format::dir::ChunkDirError;
use dist_comm::agree::message_with_sources;
use dist_comm::CommError;

/// What a `dsp_` call returns. The numeric values are part of the ABI: they never change, and
/// a minor release may only add new ones (treat unknown values as failures).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// A required pointer argument is NULL.
    NullArgument = 1,
    /// An argument is out of range: a size, a leading dimension, a schedule or precision
    /// value, a misaligned buffer, a count that does not match the chunk.
    InvalidArgument = 2,
    /// The ranks passed different arguments to a collective call (another partition, schedule
    /// or message precision, another number of columns, another buffer length). Every rank
    /// gets this status.
    ArgumentMismatch = 3,
    /// The chunk directory holds a different number of parts than the communicator has ranks.
    /// Every rank gets this status.
    PartsMismatch = 4,
    /// A file could not be read (missing directory, permissions).
    Io = 5,
    /// The chunk directory, its manifest or a chunk file is invalid or inconsistent.
    InvalidChunk = 6,
    /// The chunk carries no such data (e.g. no features or no labels).
    NotPresent = 7,
    /// An MPI call failed.
    Mpi = 8,
    /// MPI is in the wrong state: already finalised, not initialised for an adopted
    /// communicator, an invalid communicator handle, or too little thread support.
    MpiEnvironment = 9,
    /// Another rank failed in the same collective call; this rank's own arguments were
    /// fine. `dsp_last_error()` names the rank and its message.
    PeerFailed = 10,
    /// A handle was used from a thread other than the one that created it (see the
    /// thread-safety notes of `dsp_comm` and `dsp_spmm`).
    WrongThread = 11,
    /// The request needs something this build does not have.
    Unsupported = 12,
    /// An internal error (a bug in distspmm) was caught at the boundary; the handles involved
    /// should be freed.
    Panic = 13,
    /// Memory for the call's buffers could not be allocated (host memory for a `dsp_spmm`'s
    /// communication buffers, device memory for a device operator), or the OS refused a thread
    /// the library needed (memory or process limits). Added in 0.1.
    OutOfMemory = 14,
    /// A CUDA or NCCL call failed on the device (a launch, a copy, a stream, a collective).
    /// Added in 0.1.
    Device = 15,
}

/// Every status with the suffix of its C name (`DSP_STATUS_<name>`, the header's enum, made
/// by cbindgen from [`Status`]) and its description (`dsp_status_str`): the one table the
/// header, `docs/c-api.md` and the Python package's `STATUS_NAMES` are checked against
/// (`tests/status.rs`).
const TABLE: [(Status, &str, &CStr); 16] = [
    (Status::Ok, "OK", c"success"),
    (
        Status::NullArgument,
        "NULL_ARGUMENT",
        c"a required pointer argument is NULL",
    ),
    (
        Status::InvalidArgument,
        "INVALID_ARGUMENT",
        c"an argument is out of range",
    ),
    (
        Status::ArgumentMismatch,
        "ARGUMENT_MISMATCH",
        c"the ranks passed different arguments to a collective call",
    ),
    (
        Status::PartsMismatch,
        "PARTS_MISMATCH",
        c"the chunk directory holds a different number of parts than there are ranks",
    ),
    (Status::Io, "IO", c"a file could not be read"),
    (
        Status::InvalidChunk,
        "INVALID_CHUNK",
        c"the chunk directory or a chunk file is invalid",
    ),
    (
        Status::NotPresent,
        "NOT_PRESENT",
        c"the chunk carries no such data",
    ),
    (Status::Mpi, "MPI", c"an MPI call failed"),
    (
        Status::MpiEnvironment,
        "MPI_ENVIRONMENT",
        c"MPI is in the wrong state for this call",
    ),
    (
        Status::PeerFailed,
        "PEER_FAILED",
        c"another rank failed in the same collective call",
    ),
    (
        Status::WrongThread,
        "WRONG_THREAD",
        c"the handle belongs to another thread",
    ),
    (
        Status::Unsupported,
        "UNSUPPORTED",
        c"not supported by this build",
    ),
    (
        Status::Panic,
        "PANIC",
        c"internal error in distspmm (a bug; please report it)",
    ),
    (Status::OutOfMemory, "OUT_OF_MEMORY", c"out of memory"),
    (
        Status::Device,
        "DEVICE",
        c"a CUDA or NCCL call failed on the device",
    ),
];

impl Status {
    /// Every status, in increasing value.
    pub fn all() -> impl ExactSizeIterator<Item = Status> {
        TABLE.iter().map(|&(s, _, _)| s)
    }

    fn entry(self) -> &'static (Status, &'static str, &'static CStr) {
        // Entry i of the table is the status of value i (checked by the tests), so this
        // indexing stays in bounds for every variant.
        &TABLE[self as usize]
    }

    /// The status with numeric value `code`, if any.
    pub fn from_code(code: i32) -> Option<Status> {
        let i = usize::try_from(code).ok()?;
        TABLE.get(i).map(|&(s, _, _)| s)
    }

    /// The C name without its `DSP_STATUS_` prefix, e.g. `"PARTS_MISMATCH"` (the Python
    /// package's `DistSpmmError.status`).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// A short static description (what `dsp_status_str` returns).
    pub fn description(self) -> &'static CStr {
        self.entry().2
    }
}

/// A failure: the status to return and the message for `dsp_last_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Error {
    /// The status returned to C.
    pub status: Status,
    /// The detailed message.
    pub message: String,
}

impl Error {
    /// A failure with a message.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// A NULL pointer for argument `what`.
    pub fn null(what: &str) -> Self {
        Self::new(Status::NullArgument, format!("{what} is NULL"))
    }

    /// An out-of-range argument.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidArgument, message)
    }

    /// Prefixes the message with the function that failed.
    pub fn context(mut self, function: &str) -> Self {
        self.message = format!("{function}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<CommError> for Error {
    fn from(e: CommError) -> Self {
        let status = match &e {
            CommError::Mpi { .. } | CommError::CountOverflow { .. } => Status::Mpi,
            CommError::Environment(_) => Status::MpiEnvironment,
            CommError::PeerFailed { .. } => Status::PeerFailed,
            CommError::Mismatch(_) => Status::ArgumentMismatch,
            // A thread the OS refused to start: a resource (memory, process count) ran out.
            CommError::Spawn { .. } => Status::OutOfMemory,
            _ => Status::InvalidArgument,
        };
        Self::new(status, e.to_string())
    }
}

impl From<&ChunkDirError> for Error {
    fn from(e: &ChunkDirError) -> Self {
        let status = match e {
            ChunkDirError::Io { .. } => Status::Io,
            ChunkDirError::Chunk(chunk_format::ChunkFileError::Io { .. }) => Status::Io,
            ChunkDirError::NoSuchPart { .. } => Status::PartsMismatch,
            _ => Status::InvalidChunk,
        };
        Self::new(status, message_with_sources(e))
    }
}

impl From<ChunkDirError> for Error {
    fn from(e: ChunkDirError) -> Self {
        Self::from(&e)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (NUL bytes become spaces).
pub(crate) fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
}

/// The last error's text, for the Rust tests.
#[cfg(test)]
pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|slot| slot.borrow().to_string_lossy().into_owned())
}

/// Pointer to this thread's last-error string; valid until the next [`set_last_error`] on this
/// thread (the `CString`'s heap buffer does not move while it is stored).
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Runs an exported function's body: `Ok` becomes [`Status::Ok`], an error sets the last-error
/// message (prefixed with `function`) and returns its status, and a panic becomes
/// [`Status::Panic`] — it never unwinds into C. Every exported function that returns a status
/// goes through here.
pub(crate) fn ffi_boundary(function: &str, body: impl FnOnce() -> Result<(), Error>) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Status::Ok,
        Ok(Err(e)) => {
            let e = e.context(function);
            set_last_error(&e.message);
            e.status
        }
        Err(payload) => {
            set_last_error(&format!(
                "{function}: internal error (a bug in distspmm; please report it): {}",
                panic_message(payload.as_ref())
            ));
            Status::Panic
        }
    }
}

/// [`ffi_boundary`] for exported functions without a status (the `free` functions): errors and
/// panics only set the last-error message.
pub(crate) fn ffi_boundary_void(function: &str, body: impl FnOnce() -> Result<(), Error>) {
    let _ = ffi_boundary(function, body);
}

/// A Rust value handed to C as an opaque pointer (`Box::into_raw`), declared once per type.
/// C owns the pointer until it passes it to the type's free function.
pub(crate) trait Handle: Sized + 'static {
    /// The C type name, for messages.
    const C_NAME: &'static str;

    /// Moves the value to the heap and hands ownership to C.
    fn into_raw(self) -> *mut Self {
        Box::into_raw(Box::new(self))
    }

    /// Borrows a handle C passed in; NULL is [`Status::NullArgument`] naming `arg`.
    ///
    /// # Safety
    /// `ptr` is NULL or a pointer from [`Handle::into_raw`] of this type that has not been
    /// freed, and no `&mut` to it exists for `'a` (C is not calling into it from another thread).
    unsafe fn borrow<'a>(ptr: *const Self, arg: &str) -> Result<&'a Self, Error> {
        // SAFETY: the caller guarantees `ptr` is NULL or a live, unaliased-for-writes handle.
        unsafe { ptr.as_ref() }.ok_or_else(|| Error::null(&format!("{arg} ({} *)", Self::C_NAME)))
    }

    /// Borrows a handle mutably; NULL is [`Status::NullArgument`].
    ///
    /// # Safety
    /// As [`Handle::borrow`], and no other reference to it exists for `'a`.
    unsafe fn borrow_mut<'a>(ptr: *mut Self, arg: &str) -> Result<&'a mut Self, Error> {
        // SAFETY: the caller guarantees `ptr` is NULL or a live, unaliased handle.
        unsafe { ptr.as_mut() }.ok_or_else(|| Error::null(&format!("{arg} ({} *)", Self::C_NAME)))
    }

    /// Takes ownership back from C (for the free function); `None` for NULL.
    ///
    /// # Safety
    /// `ptr` is NULL or a pointer from [`Handle::into_raw`] of this type that has not been
    /// freed; C does not use it afterwards.
    unsafe fn from_raw(ptr: *mut Self) -> Option<Box<Self>> {
        if ptr.is_null() {
            None
        } else {
            // SAFETY: non-null and, by the caller's guarantee, from Box::into_raw, not freed.
            Some(unsafe { Box::from_raw(ptr) })
        }
    }
}

/// An out-parameter C passed in, checked for NULL before any work is done.
#[derive(Debug)]
pub(crate) struct OutPtr<T>(*mut T);

impl<T> OutPtr<T> {
    /// Checks `ptr`; NULL is [`Status::NullArgument`] naming `arg`.
    ///
    /// # Safety
    /// `ptr` is NULL or valid for a write of one `T` (alignment included) until
    /// [`OutPtr::write`] is called.
    pub unsafe fn new(ptr: *mut T, arg: &str) -> Result<Self, Error> {
        if ptr.is_null() {
            return Err(Error::null(arg));
        }
        if !ptr.is_aligned() {
            return Err(Error::invalid(format!("{arg} is not aligned for its type")));
        }
        Ok(Self(ptr))
    }

    /// Stores a value (the result, or NULL first so that a failed call leaves no stale handle).
    pub fn write(&self, value: T) {
        // SAFETY: non-null and aligned (checked in `new`), valid for a write by `new`'s contract.
        unsafe { self.0.write(value) }
    }
}

/// The rules of a C buffer of `len` elements: not NULL unless empty, aligned for `T`, and its
/// bytes within what one object may span.
pub(crate) fn check_buffer<T>(ptr: *const T, len: usize, arg: &str) -> Result<(), Error> {
    if len == 0 {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(Error::null(&format!("{arg} (with {len} elements)")));
    }
    if !ptr.is_aligned() {
        return Err(Error::invalid(format!(
            "{arg} is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(Error::invalid(format!(
            "{arg}: {len} elements are too many"
        )));
    }
    Ok(())
}

/// A read-only C buffer of `len` elements; NULL is allowed only when `len == 0`.
///
/// # Safety
/// Unless NULL, `ptr` points to `len` initialised `T`s that nobody writes during `'a`.
pub(crate) unsafe fn slice<'a, T>(ptr: *const T, len: usize, arg: &str) -> Result<&'a [T], Error> {
    check_buffer(ptr, len, arg)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-null, aligned, size within isize (checked); the caller guarantees `len`
    // initialised elements not written during 'a.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A writable C buffer of `len` elements; NULL is allowed only when `len == 0`.
///
/// # Safety
/// Unless NULL, `ptr` points to `len` initialised `T`s that nobody else reads or writes during
/// `'a` (C's buffers of plain numbers are always initialised memory).
pub(crate) unsafe fn slice_mut<'a, T>(
    ptr: *mut T,
    len: usize,
    arg: &str,
) -> Result<&'a mut [T], Error> {
    check_buffer(ptr, len, arg)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: as in `slice`, plus exclusive access for 'a by the caller's guarantee.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_are_stable_and_described() {
        for (i, s) in Status::all().enumerate() {
            assert_eq!(s as usize, i, "{s:?} moved");
            assert_eq!(Status::from_code(i32::try_from(i).unwrap()), Some(s));
            assert!(!s.description().is_empty());
            // The name is the variant's in SCREAMING_SNAKE_CASE (cbindgen's rename rule).
            let mut screaming = String::new();
            for (k, c) in format!("{s:?}").chars().enumerate() {
                if c.is_uppercase() && k > 0 {
                    screaming.push('_');
                }
                screaming.push(c.to_ascii_uppercase());
            }
            assert_eq!(s.name(), screaming);
        }
        assert_eq!(Status::from_code(-1), None);
        assert_eq!(
            Status::from_code(i32::try_from(Status::all().len()).unwrap()),
            None
        );
    }

    #[test]
    fn comm_errors_map_to_their_statuses() {
        let spawn = CommError::Spawn {
            rank: 3,
            size: 8,
            reason: "Resource temporarily unavailable".into(),
        };
        let e = Error::from(spawn);
        assert_eq!(e.status, Status::OutOfMemory);
        assert!(
            e.message.contains("Resource temporarily unavailable"),
            "{}",
            e.message
        );
        let e = Error::from(CommError::Mismatch("F differs".into()));
        assert_eq!(e.status, Status::ArgumentMismatch);
    }

    #[test]
    fn boundary_turns_errors_and_panics_into_statuses() {
        let s = ffi_boundary("f", || Err(Error::invalid("bad ld")));
        assert_eq!(s, Status::InvalidArgument);
        assert_eq!(last_error(), "f: bad ld");
        let s = ffi_boundary("g", || Ok(()));
        assert_eq!(s, Status::Ok);
        assert_eq!(last_error(), "f: bad ld", "success leaves the message");
        let s = ffi_boundary("h", || panic!("boom {}", 7));
        assert_eq!(s, Status::Panic);
        assert!(
            last_error().starts_with("h: internal error"),
            "{}",
            last_error()
        );
        assert!(last_error().ends_with("boom 7"), "{}", last_error());
        set_last_error("nul\0inside");
        assert_eq!(last_error(), "nul inside");
    }

    #[test]
    fn last_error_is_per_thread() {
        set_last_error("main thread");
        std::thread::spawn(|| {
            assert_eq!(last_error(), "");
            set_last_error("other");
        })
        .join()
        .unwrap();
        assert_eq!(last_error(), "main thread");
    }

    #[test]
    fn buffers_check_null_alignment_and_overflow() {
        let data = [1.0f32, 2.0, 3.0];
        // SAFETY: a live array of 3 floats, or NULL/empty cases the helpers reject or allow.
        unsafe {
            assert_eq!(slice(data.as_ptr(), 3, "x").unwrap(), &data);
            assert!(slice::<f32>(std::ptr::null(), 0, "x").unwrap().is_empty());
            assert_eq!(
                slice::<f32>(std::ptr::null(), 2, "x").unwrap_err().status,
                Status::NullArgument
            );
            let misaligned = (data.as_ptr() as *const u8).add(1) as *const f32;
            assert_eq!(
                slice(misaligned, 1, "x").unwrap_err().status,
                Status::InvalidArgument
            );
            assert_eq!(
                slice(data.as_ptr(), usize::MAX / 2, "x")
                    .unwrap_err()
                    .status,
                Status::InvalidArgument
            );
            let mut out = 0u64;
            OutPtr::new(&mut out, "out").unwrap().write(5);
            assert_eq!(out, 5);
            assert_eq!(
                OutPtr::<u64>::new(std::ptr::null_mut(), "out")
                    .unwrap_err()
                    .status,
                Status::NullArgument
            );
        }
    }
}
