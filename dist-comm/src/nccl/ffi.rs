//! libnccl opened at run time, with the entry points the backend calls.
//!
//! The ABI types (`ncclUniqueId`, `ncclComm_t`, the data-type and reduction enums) are
//! cudarc's bindings of `nccl.h`; the library is opened here rather than through cudarc's
//! loader, which looks only for `libnccl.so` and `libnccl.so.<CUDA major>` — never for
//! `libnccl.so.2`, the one name that both the `nvidia-nccl-cu13` wheel and the system's
//! `libnccl2` package install — and panics when it finds nothing. Here every failure (no
//! library, a missing symbol) is an error value. Return codes are read as plain integers, so
//! a code this build does not know cannot be an invalid enum value.

use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use libloading::Library;

use crate::{CommError, ElementKind, ReduceOp};

/// Environment variable naming the NCCL library file to open instead of searching the loader
/// path (e.g. `…/site-packages/nvidia/nccl/lib/libnccl.so.2`).
pub const NCCL_LIBRARY_ENV: &str = "DISTSPMM_NCCL_LIBRARY";

/// Names searched on the loader path, the runtime soname first.
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// `ncclSuccess`.
const SUCCESS: c_int = 0;

/// `ncclResult_t`, as an integer.
type Code = c_int;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> Code;
type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> Code;
type CommInitRank = unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> Code;
type CommFree = unsafe extern "C" fn(ncclComm_t) -> Code;
type CommGetAsyncError = unsafe extern "C" fn(ncclComm_t, *mut Code) -> Code;
type GetErrorString = unsafe extern "C" fn(Code) -> *const c_char;
type GetLastError = unsafe extern "C" fn(ncclComm_t) -> *const c_char;
type Broadcast = unsafe extern "C" fn(
    *const std::ffi::c_void,
    *mut std::ffi::c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> Code;
type AllReduce = unsafe extern "C" fn(
    *const std::ffi::c_void,
    *mut std::ffi::c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> Code;
type Send = unsafe extern "C" fn(
    *const std::ffi::c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> Code;
type Recv = unsafe extern "C" fn(
    *mut std::ffi::c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> Code;
type Group = unsafe extern "C" fn() -> Code;

/// The opened library and its entry points (valid while `_lib` is alive: forever, for the
/// process-wide instance).
pub(crate) struct NcclLibrary {
    _lib: Library,
    /// Where it was found, for messages.
    pub(crate) file: String,
    pub(crate) get_version: GetVersion,
    pub(crate) get_unique_id: GetUniqueId,
    pub(crate) comm_init_rank: CommInitRank,
    pub(crate) comm_destroy: CommFree,
    pub(crate) comm_abort: CommFree,
    pub(crate) comm_get_async_error: CommGetAsyncError,
    pub(crate) get_error_string: GetErrorString,
    /// `ncclGetLastError` exists from NCCL 2.13 on.
    pub(crate) get_last_error: Option<GetLastError>,
    pub(crate) broadcast: Broadcast,
    pub(crate) all_reduce: AllReduce,
    pub(crate) send: Send,
    pub(crate) recv: Recv,
    pub(crate) group_start: Group,
    pub(crate) group_end: Group,
}

impl std::fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLibrary")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// Copies the entry point `name` out of `lib`.
///
/// # Safety
/// `T` must be the function-pointer type of the symbol's C declaration.
unsafe fn entry<T: Copy>(lib: &Library, file: &str, name: &str) -> Result<T, String> {
    // SAFETY: forwarded contract: `T` matches the symbol's declaration.
    let symbol = unsafe { lib.get::<T>(name) };
    symbol
        .map(|s| *s)
        .map_err(|e| format!("{file} lacks the NCCL entry point {name}: {e}"))
}

impl NcclLibrary {
    /// The process-wide library: `$DISTSPMM_NCCL_LIBRARY` if set, else the first of
    /// `libnccl.so.2`, `libnccl.so` the loader finds. Opened once; a failure is remembered.
    ///
    /// # Errors
    /// [`CommError::NoDevice`] naming what was tried and how to install NCCL.
    pub(crate) fn get() -> Result<&'static NcclLibrary, CommError> {
        static LIB: OnceLock<Result<NcclLibrary, String>> = OnceLock::new();
        LIB.get_or_init(Self::search)
            .as_ref()
            .map_err(|e| CommError::NoDevice(e.clone()))
    }

    fn search() -> Result<NcclLibrary, String> {
        if let Some(path) = std::env::var_os(NCCL_LIBRARY_ENV) {
            let path = path
                .into_string()
                .map_err(|p| format!("{NCCL_LIBRARY_ENV}={p:?} is not valid UTF-8"))?;
            return Self::open(&path).map_err(|e| format!("{NCCL_LIBRARY_ENV}: {e}"));
        }
        let mut tried = Vec::with_capacity(NAMES.len());
        for name in NAMES {
            match Self::open(name) {
                Ok(lib) => return Ok(lib),
                Err(e) => tried.push(e),
            }
        }
        Err(format!(
            "the NCCL library could not be loaded ({}); install NCCL (`pip install \
             nvidia-nccl-cu13` and add its nvidia/nccl/lib folder to LD_LIBRARY_PATH, or the \
             system package libnccl2) or set {NCCL_LIBRARY_ENV} to the library file",
            tried.join("; ")
        ))
    }

    /// Opens `file` (a path, or a name searched on the loader path) and resolves every entry
    /// point; errors name the file and the missing symbol.
    pub(crate) fn open(file: &str) -> Result<NcclLibrary, String> {
        // SAFETY: opening libnccl runs its ELF initialisers, which set up NCCL's own global
        // state only; a file that is not NCCL fails below on its missing entry points.
        let lib = unsafe { Library::new(file) }.map_err(|e| format!("{file}: {e}"))?;
        // SAFETY: each type alias above transcribes the C declaration in nccl.h (NCCL 2.x,
        // unchanged since 2.7 for these functions; ncclGetLastError since 2.13).
        unsafe {
            Ok(NcclLibrary {
                get_version: entry(&lib, file, "ncclGetVersion")?,
                get_unique_id: entry(&lib, file, "ncclGetUniqueId")?,
                comm_init_rank: entry(&lib, file, "ncclCommInitRank")?,
                comm_destroy: entry(&lib, file, "ncclCommDestroy")?,
                comm_abort: entry(&lib, file, "ncclCommAbort")?,
                comm_get_async_error: entry(&lib, file, "ncclCommGetAsyncError")?,
                get_error_string: entry(&lib, file, "ncclGetErrorString")?,
                get_last_error: entry(&lib, file, "ncclGetLastError").ok(),
                broadcast: entry(&lib, file, "ncclBroadcast")?,
                all_reduce: entry(&lib, file, "ncclAllReduce")?,
                send: entry(&lib, file, "ncclSend")?,
                recv: entry(&lib, file, "ncclRecv")?,
                group_start: entry(&lib, file, "ncclGroupStart")?,
                group_end: entry(&lib, file, "ncclGroupEnd")?,
                file: file.to_owned(),
                _lib: lib,
            })
        }
    }

    /// Turns a return code into a result; the message carries `ncclGetErrorString` and, when
    /// the library has one, `ncclGetLastError(comm)` (`comm` may be null).
    pub(crate) fn check(
        &self,
        code: Code,
        call: &'static str,
        comm: ncclComm_t,
    ) -> Result<(), CommError> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString accepts any code and returns a static C string (or null).
        let mut message = unsafe { c_string((self.get_error_string)(code)) };
        if let Some(last) = self.get_last_error {
            // SAFETY: ncclGetLastError accepts a live communicator or null and returns a C
            // string owned by NCCL that stays valid until the next NCCL call on this thread.
            let detail = unsafe { c_string(last(comm)) };
            if !detail.is_empty() {
                message = format!("{message} ({})", detail.trim_end());
            }
        }
        Err(CommError::Nccl {
            call,
            code,
            message,
        })
    }

    /// NCCL's version code (e.g. 22803 for 2.28.3).
    pub(crate) fn version(&self) -> Result<i32, CommError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; ncclGetVersion needs no initialisation.
        let code = unsafe { (self.get_version)(&mut v) };
        self.check(code, "ncclGetVersion", std::ptr::null_mut())?;
        Ok(v)
    }
}

/// Copies a C string (null: empty).
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the duration of the call.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: forwarded contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// NCCL's type tag of an element type.
pub(crate) fn data_type(kind: ElementKind) -> ncclDataType_t {
    match kind {
        ElementKind::U8 => ncclDataType_t::ncclUint8,
        ElementKind::I32 => ncclDataType_t::ncclInt32,
        ElementKind::U32 => ncclDataType_t::ncclUint32,
        ElementKind::I64 => ncclDataType_t::ncclInt64,
        ElementKind::U64 => ncclDataType_t::ncclUint64,
        ElementKind::F32 => ncclDataType_t::ncclFloat32,
        ElementKind::F64 => ncclDataType_t::ncclFloat64,
    }
}

/// NCCL's reduction of a [`ReduceOp`].
pub(crate) fn reduction(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
    }
}

/// Decodes a version code: 2.9+ use `major*10000 + minor*100 + patch`, older ones
/// `major*1000 + minor*100 + patch`.
pub(crate) fn decode_version(code: i32) -> (i32, i32, i32) {
    if code >= 10000 {
        (code / 10000, (code % 10000) / 100, code % 100)
    } else {
        (code / 1000, (code % 1000) / 100, code % 100)
    }
}
