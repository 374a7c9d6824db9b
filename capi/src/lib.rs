//! The C ABI of distspmm: `libdistspmm.so` / `libdistspmm.a` and `include/distspmm.h`.
//!
//! This crate is the boundary only: it turns C calls into calls of `dist-comm` (communicators,
//! the distributed SpMM operator) and `chunk-format` (chunk directories), and turns every
//! outcome back into a [`Status`]. The rules every exported function follows:
//!
//! - its body runs inside `boundary::ffi_boundary`: a panic becomes [`Status::Panic`] (or a
//!   NULL / zero return), never an unwind into C;
//! - handles are boxed Rust values whose ownership is declared once per type
//!   (`boundary::Handle`); raw pointers become references only through its helpers, which
//!   turn NULL into [`Status::NullArgument`];
//! - a failure sets a thread-local message ([`dsp_last_error`]);
//! - collective calls first agree across ranks on their arguments, so a bad argument on one rank
//!   is an error on every rank instead of a hang, and the library never calls `MPI_Abort`.
//!
//! The header is generated from these sources by cbindgen (`tests/header.rs` checks that the
//! committed `include/distspmm.h` is current; `DISTSPMM_BLESS=1` rewrites it). `docs/c-api.md`
//! states the ABI rules, the thread-safety of each handle and a minimal example.

mod boundary;
mod chunk;
mod comm;
mod device;
mod edges;
mod spmm;
mod version;

pub use boundary::Status;
pub use chunk::Chunk;
pub use comm::Comm;
pub use device::SpmmDevice;
pub use spmm::{CommPrecision, Schedule, Spmm};
pub use version::{DSP_VERSION_MAJOR, DSP_VERSION_MINOR, DSP_VERSION_PATCH};

use std::ffi::{c_char, CStr};

/// Bit of a node's mask byte (see `dsp_chunk_masks`): the node is in the training set.
pub const DSP_MASK_TRAIN: u8 = 1;
/// Bit of a node's mask byte: the node is in the validation set.
pub const DSP_MASK_VAL: u8 = 2;
/// Bit of a node's mask byte: the node is in the test set.
pub const DSP_MASK_TEST: u8 = 4;

/// The library's version as `DSP_VERSION_MAJOR * 1000000 + DSP_VERSION_MINOR * 1000 +
/// DSP_VERSION_PATCH`. Compare it with the header's macros to detect a header/library
/// mismatch at run time. Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn dsp_version() -> u32 {
    version::NUMBER
}

/// The library's version as a static NUL-terminated string, e.g. `"0.2.0"`. Never NULL;
/// thread-safe.
#[no_mangle]
pub extern "C" fn dsp_version_string() -> *const c_char {
    version::STRING.as_ptr()
}

/// A short static description of a status code (e.g. `"a required pointer argument is
/// NULL"`); `"unknown status code"` for a value that is not a `dsp_status`. Never NULL;
/// thread-safe. The detailed message of the last failure is `dsp_last_error()`.
#[no_mangle]
pub extern "C" fn dsp_status_str(status: i32) -> *const c_char {
    Status::from_code(status)
        .map_or(c"unknown status code", Status::description)
        .as_ptr()
}

/// The detailed message of the most recent failing `dsp_` call on the calling thread (which
/// file, which argument, which rank), or `""` if none failed yet. Successful calls leave it
/// unchanged. The pointer stays valid until the next failing call on this thread; copy the
/// text to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn dsp_last_error() -> *const c_char {
    boundary::last_error_ptr()
}

/// Reads a NUL-terminated C string argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid for `'a`.
pub(crate) unsafe fn c_str<'a>(
    ptr: *const c_char,
    what: &'static str,
) -> Result<&'a CStr, boundary::Error> {
    if ptr.is_null() {
        return Err(boundary::Error::null(what));
    }
    // SAFETY: non-null, and the caller guarantees a NUL-terminated string valid for 'a.
    Ok(unsafe { CStr::from_ptr(ptr) })
}
