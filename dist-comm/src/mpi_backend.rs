//! The `mpi` backend: the system MPI library through rsmpi's FFI bindings.
//!
//! Calls go straight to `mpi::ffi` so that every return code is checked (rsmpi's safe wrappers
//! discard them) — together with `MPI_ERRORS_RETURN` on our communicator, a failing call becomes
//! a [`CommError::Mpi`] instead of an abort. rsmpi provides initialisation/finalisation
//! ([`Universe`]), the datatype handles and the reduction operation handles.
//!
//! **Large messages.** MPI-3 counts are C `int`s, so one call carries at most `i32::MAX`
//! elements. Longer buffers are split: broadcasts, all-reduces and all-gathers into consecutive
//! calls over pieces; an all-to-all whose counts or displacements do not fit (on any rank: the
//! ranks agree first) into point-to-point pieces on a private communicator; a send or receive
//! into several requests that complete together. [`MAX_COUNT_ENV`] lowers the limit so the
//! split paths run on small messages (the `mpirun` tests do).

use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::OnceLock;

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::Threading;

use crate::capability::{check_all_gather, check_rank, check_tag};
use crate::{
    AllGather, AllReduce, AllToAllV, BlockLayout, Broadcast, CommError, Completion, Element,
    ElementKind, Exchange, Group, PointToPoint, ReduceOp, Reducible, RequestId, Tag,
};

/// A communicator over MPI: a private duplicate of `MPI_COMM_WORLD` or of a communicator the
/// host application handed over.
///
/// Neither `Send` nor `Sync`: MPI is used at `MPI_THREAD_FUNNELED`, i.e. only from the thread
/// that initialised it (see the crate docs). Dropping the handle frees the duplicate
/// (`MPI_Comm_free`, collective in spirit: drop it on every rank) and, if this handle
/// initialised MPI, finalises MPI.
pub struct MpiComm {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// Reused scratch: all-to-all counts/displacements as C ints (4 × size).
    counts: RefCell<Vec<c_int>>,
    /// Reused scratch for the send side of an all-reduce (8-byte aligned words; rsmpi does not
    /// expose `MPI_IN_PLACE`, whose value differs between MPI libraries).
    reduce_scratch: RefCell<Vec<u64>>,
    /// A second duplicate for the point-to-point pieces of split all-to-alls (so they never
    /// match a caller's own messages), made the first time one is needed (all ranks need it
    /// together); freed before `comm`.
    split_comm: std::cell::Cell<ffi::MPI_Comm>,
    /// Present when this handle initialised MPI: dropping it calls `MPI_Finalize`. Declared
    /// after `comm`, and `Drop` frees `comm` first.
    universe: Option<Universe>,
    _not_send: PhantomData<*const ()>,
}

/// Turns an MPI return code into a result.
fn check(code: c_int, call: &'static str) -> Result<(), CommError> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(CommError::Mpi {
            call,
            code,
            message: error_string(code),
        })
    }
}

/// `MPI_Error_string` of a code.
fn error_string(code: c_int) -> String {
    let mut buf: [c_char; ffi::MPI_MAX_ERROR_STRING as usize] =
        [0; ffi::MPI_MAX_ERROR_STRING as usize];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as the call requires, and
    // `len` is a valid out-pointer. MPI_Error_string may be called at any time.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("unknown MPI error code {code}");
    }
    let len = usize::try_from(len).unwrap_or(0).min(buf.len());
    let bytes: Vec<u8> = buf[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn datatype(kind: ElementKind) -> ffi::MPI_Datatype {
    match kind {
        ElementKind::U8 => u8::equivalent_datatype().as_raw(),
        ElementKind::I32 => i32::equivalent_datatype().as_raw(),
        ElementKind::U32 => u32::equivalent_datatype().as_raw(),
        ElementKind::I64 => i64::equivalent_datatype().as_raw(),
        ElementKind::U64 => u64::equivalent_datatype().as_raw(),
        ElementKind::F32 => f32::equivalent_datatype().as_raw(),
        ElementKind::F64 => f64::equivalent_datatype().as_raw(),
    }
}

fn operation(op: ReduceOp) -> ffi::MPI_Op {
    match op {
        ReduceOp::Sum => SystemOperation::sum().as_raw(),
        ReduceOp::Max => SystemOperation::max().as_raw(),
        ReduceOp::Min => SystemOperation::min().as_raw(),
    }
}

/// A length as an MPI count.
fn count(what: &'static str, n: usize) -> Result<c_int, CommError> {
    c_int::try_from(n).map_err(|_| CommError::CountOverflow { what, value: n })
}

/// Environment variable that lowers the element count of one MPI call below `i32::MAX` (a
/// positive integer), so that tests run the split paths on small messages. Read once.
pub const MAX_COUNT_ENV: &str = "DIST_COMM_MPI_MAX_COUNT";

/// The most elements one MPI call carries: `i32::MAX`, or [`MAX_COUNT_ENV`]'s value if smaller.
pub fn max_count() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let limit = i32::MAX as usize;
        match std::env::var(MAX_COUNT_ENV) {
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n.min(limit),
                _ => {
                    tracing::warn!(value = %v, "{MAX_COUNT_ENV} is not a positive integer; ignored");
                    limit
                }
            },
            Err(_) => limit,
        }
    })
}

/// `(offset, length)` of the consecutive pieces of at most `limit` elements that cover
/// `0..len`; a single empty piece for `len = 0` (an empty message is still one message).
fn pieces(len: usize, limit: usize) -> impl Iterator<Item = (usize, usize)> {
    let limit = limit.max(1);
    let n = len.div_ceil(limit).max(1);
    (0..n).map(move |i| (i * limit, limit.min(len - (i * limit).min(len))))
}

/// A piece's length as a C int (pieces are at most [`max_count`] ≤ `i32::MAX` long).
fn piece_count(len: usize) -> c_int {
    len as c_int
}

fn comm_null() -> ffi::MPI_Comm {
    // SAFETY: reading an immutable handle constant exported by rsmpi's C shim.
    unsafe { ffi::RSMPI_COMM_NULL }
}

/// Whether `raw` is `MPI_COMM_NULL` or the all-zero handle (what OpenMPI's `MPI_Comm_f2c`
/// returns for an out-of-range Fortran handle; never a valid handle in OpenMPI or MPICH).
fn is_null_comm(raw: ffi::MPI_Comm) -> bool {
    // SAFETY: MPI_Comm is a pointer (OpenMPI) or an integer (MPICH); all-zero is a valid value
    // of either, used only for comparison.
    let zero: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    raw == comm_null() || raw == zero
}

fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading an immutable handle constant exported by rsmpi's C shim.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn undefined() -> c_int {
    // SAFETY: reading an immutable integer constant exported by rsmpi's C shim.
    unsafe { ffi::RSMPI_UNDEFINED }
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is a C struct of integers; all-zero is a valid value, and MPI
    // overwrites it before we read it.
    unsafe { std::mem::zeroed() }
}

/// Whether MPI is usable now (initialised and not finalised).
fn environment_ready() -> Result<(), CommError> {
    if mpi::environment::is_finalized() {
        return Err(CommError::Environment(
            "MPI has already been finalised in this process and cannot be used again".into(),
        ));
    }
    if !mpi::environment::is_initialized() {
        return Err(CommError::Environment(
            "MPI is not initialised: call MpiComm::init, or initialise MPI in the host application first".into(),
        ));
    }
    Ok(())
}

impl MpiComm {
    /// Initialises MPI (`MPI_Init_thread` with `MPI_THREAD_FUNNELED`) and returns a communicator
    /// over (a duplicate of) `MPI_COMM_WORLD`. MPI is finalised when the handle is dropped.
    ///
    /// `FUNNELED` is the level this crate needs: all MPI calls come from the initialising thread
    /// (the handle is `!Send`), and compute threads never call MPI. Asking for more
    /// (`SERIALIZED`/`MULTIPLE`) can make some MPI libraries take locks on every call.
    ///
    /// # Errors
    /// [`CommError::Environment`] when MPI is already initialised (use [`MpiComm::adopt`] or
    /// [`MpiComm::world_if_initialized`]) or finalised; [`CommError::Mpi`] when duplicating the
    /// world communicator fails.
    pub fn init() -> Result<Self, CommError> {
        if mpi::environment::is_finalized() {
            return Err(CommError::Environment(
                "MPI has already been finalised in this process and cannot be initialised again"
                    .into(),
            ));
        }
        if mpi::environment::is_initialized() {
            return Err(CommError::Environment(
                "MPI is already initialised (by the host application or an earlier MpiComm::init); \
                 use MpiComm::world_if_initialized or MpiComm::adopt instead"
                    .into(),
            ));
        }
        let (universe, provided) =
            mpi::initialize_with_threading(Threading::Funneled).ok_or_else(|| {
                CommError::Environment("another thread initialised MPI concurrently".into())
            })?;
        if provided < Threading::Funneled {
            tracing::warn!(
                ?provided,
                "the MPI library grants less than MPI_THREAD_FUNNELED; keep compute threads away from MPI"
            );
        }
        // SAFETY: MPI is initialised, so MPI_COMM_WORLD is a valid communicator.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        // SAFETY: `world` is valid (above).
        let comm = unsafe { Self::duplicate(world, Some(universe)) }?;
        tracing::debug!(rank = comm.rank, size = comm.size, "initialised MPI");
        Ok(comm)
    }

    /// Adopts a communicator of a host application that initialised MPI itself (a Jittor,
    /// PyTorch or mpi4py process, a C++ trainer). Works on a duplicate (`MPI_Comm_dup`, collective
    /// over `raw`: every rank of `raw` must call this), never initialises or finalises MPI.
    ///
    /// # Safety
    /// `raw` must be a valid communicator handle of this process (or `MPI_COMM_NULL`, which is
    /// rejected), and stay valid while `MPI_Comm_dup` runs.
    ///
    /// # Errors
    /// [`CommError::Environment`] when MPI is not initialised, already finalised, `raw` is
    /// `MPI_COMM_NULL`, or the host's thread level is below `MPI_THREAD_SERIALIZED` and this is
    /// not MPI's main thread; [`CommError::Mpi`] from the duplication.
    pub unsafe fn adopt(raw: ffi::MPI_Comm) -> Result<Self, CommError> {
        environment_ready()?;
        if is_null_comm(raw) {
            return Err(CommError::Environment(
                "the communicator to adopt is MPI_COMM_NULL".into(),
            ));
        }
        let provided = mpi::environment::threading_support();
        if provided < Threading::Serialized {
            let mut main: c_int = 0;
            // SAFETY: MPI is initialised; `main` is a valid out-pointer.
            let rc = unsafe { ffi::MPI_Is_thread_main(&mut main) };
            check(rc, "MPI_Is_thread_main")?;
            if main == 0 {
                return Err(CommError::Environment(format!(
                    "the host initialised MPI with {provided:?} thread support, which allows MPI calls \
                     only from its main thread; call from that thread or initialise MPI with \
                     MPI_THREAD_SERIALIZED"
                )));
            }
        }
        // SAFETY: the caller guarantees `raw` is a valid communicator.
        let comm = unsafe { Self::duplicate(raw, None) }?;
        tracing::debug!(
            rank = comm.rank,
            size = comm.size,
            "adopted an MPI communicator"
        );
        Ok(comm)
    }

    /// Adopts a communicator given as its Fortran handle (`MPI_Fint`, e.g. `MPI_Comm_c2f` in C,
    /// `comm.py2f()` in mpi4py), as a C ABI receives it without including `mpi.h`. Converted with
    /// `MPI_Comm_f2c`, then as [`MpiComm::adopt`].
    ///
    /// # Errors
    /// As [`MpiComm::adopt`]; [`CommError::Environment`] when the handle names no communicator.
    pub fn from_fortran_handle(handle: ffi::RSMPI_Fint) -> Result<Self, CommError> {
        environment_ready()?;
        // SAFETY: MPI is initialised; MPI_Comm_f2c takes any integer and returns the
        // communicator it names or an invalid handle (OpenMPI checks the handle table bounds
        // and returns a null handle; MPICH validates handles in the calls that use them).
        let raw = unsafe { ffi::RSMPI_Comm_f2c(handle) };
        if is_null_comm(raw) {
            return Err(CommError::Environment(format!(
                "Fortran handle {handle} names no MPI communicator"
            )));
        }
        // SAFETY: `raw` came from MPI_Comm_f2c and is not MPI_COMM_NULL.
        unsafe { Self::adopt(raw) }
    }

    /// A communicator over (a duplicate of) `MPI_COMM_WORLD` if someone already initialised MPI
    /// (and did not finalise it), `None` otherwise. Collective over the world when it returns
    /// `Some`.
    ///
    /// # Errors
    /// As [`MpiComm::adopt`].
    pub fn world_if_initialized() -> Result<Option<Self>, CommError> {
        if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
            return Ok(None);
        }
        // SAFETY: MPI is initialised, so MPI_COMM_WORLD is a valid communicator.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        // SAFETY: as above.
        unsafe { Self::adopt(world) }.map(Some)
    }

    /// Duplicates `parent`, sets `MPI_ERRORS_RETURN` on the duplicate, and reads rank and size.
    ///
    /// # Safety
    /// `parent` is a valid communicator and MPI is initialised.
    unsafe fn duplicate(
        parent: ffi::MPI_Comm,
        universe: Option<Universe>,
    ) -> Result<Self, CommError> {
        let mut this = Self {
            comm: comm_null(),
            rank: 0,
            size: 0,
            counts: RefCell::new(Vec::new()),
            reduce_scratch: RefCell::new(Vec::new()),
            split_comm: std::cell::Cell::new(comm_null()),
            universe,
            _not_send: PhantomData,
        };
        // SAFETY: the caller guarantees `parent` is valid; the out-pointer is valid. On error
        // `this` is dropped, which frees nothing (comm is null) and finalises MPI if it owns it.
        let rc = unsafe { ffi::MPI_Comm_dup(parent, &mut this.comm) };
        check(rc, "MPI_Comm_dup")?;
        // SAFETY: `this.comm` is the valid duplicate; the error handler constant is predefined.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(this.comm, ffi::RSMPI_ERRORS_RETURN) };
        check(rc, "MPI_Comm_set_errhandler")?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: valid communicator and out-pointers.
        let rc = unsafe { ffi::MPI_Comm_rank(this.comm, &mut rank) };
        check(rc, "MPI_Comm_rank")?;
        // SAFETY: valid communicator and out-pointers.
        let rc = unsafe { ffi::MPI_Comm_size(this.comm, &mut size) };
        check(rc, "MPI_Comm_size")?;
        this.rank = usize::try_from(rank).unwrap_or(0);
        this.size = usize::try_from(size).unwrap_or(0);
        Ok(this)
    }

    /// The underlying (duplicated) communicator, for interoperating with other MPI code. It is
    /// freed when this handle drops.
    pub fn as_raw(&self) -> ffi::MPI_Comm {
        self.comm
    }

    /// Whether this handle initialised MPI (and will finalise it on drop).
    pub fn owns_environment(&self) -> bool {
        self.universe.is_some()
    }

    /// The thread support level MPI provides in this process.
    pub fn threading(&self) -> Threading {
        mpi::environment::threading_support()
    }

    /// Terminates every process of this communicator's job (`MPI_Abort`) with `code`: the
    /// way out when ranks can no longer agree (an error on one rank while others wait in a
    /// collective).
    pub fn abort(&self, code: i32) -> ! {
        // SAFETY: valid communicator; MPI_Abort does not return on success.
        unsafe {
            ffi::MPI_Abort(self.comm, code);
        }
        std::process::abort()
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let mut split = self.split_comm.get();
        if split != comm_null() && !mpi::environment::is_finalized() {
            // SAFETY: `split` is our own duplicate, still valid since MPI is not finalised.
            let rc = unsafe { ffi::MPI_Comm_free(&mut split) };
            if let Err(e) = check(rc, "MPI_Comm_free") {
                tracing::warn!(%e, "freeing the split-message communicator failed");
            }
        }
        if self.comm != comm_null() && !mpi::environment::is_finalized() {
            // SAFETY: `comm` is our own duplicate, still valid since MPI is not finalised.
            let rc = unsafe { ffi::MPI_Comm_free(&mut self.comm) };
            if let Err(e) = check(rc, "MPI_Comm_free") {
                tracing::warn!(%e, "freeing the duplicated communicator failed");
            }
        }
        // `universe` (if any) drops after this and calls MPI_Finalize.
    }
}

impl fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("owns_environment", &self.owns_environment())
            .finish()
    }
}

impl Group for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<(), CommError> {
        // SAFETY: valid communicator.
        check(unsafe { ffi::MPI_Barrier(self.comm) }, "MPI_Barrier")
    }
}

impl Broadcast for MpiComm {
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        check_rank("root", root, self.size)?;
        // Every rank passes the same length, so all split it alike.
        for (offset, len) in pieces(buf.len(), max_count()) {
            let piece = &mut buf[offset..offset + len];
            // SAFETY: `piece` is valid for `len` (≤ i32::MAX) elements of T's MPI type and
            // exclusively borrowed for the blocking call; the root is in range.
            let rc = unsafe {
                ffi::MPI_Bcast(
                    piece.as_mut_ptr().cast(),
                    piece_count(len),
                    datatype(T::KIND),
                    root as c_int,
                    self.comm,
                )
            };
            check(rc, "MPI_Bcast")?;
        }
        Ok(())
    }
}

impl AllReduce for MpiComm {
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let mut scratch = self.reduce_scratch.borrow_mut();
        let limit = max_count();
        for (offset, len) in pieces(buf.len(), limit) {
            let piece = &mut buf[offset..offset + len];
            let words = size_of_val(piece).div_ceil(8);
            if scratch.len() < words {
                scratch.resize(words, 0);
            }
            let send: &mut [T] =
                &mut bytemuck::cast_slice_mut::<u64, T>(&mut scratch[..words])[..len];
            send.copy_from_slice(piece);
            // SAFETY: `send` and `piece` are distinct valid buffers of `len` (≤ i32::MAX)
            // elements of T's MPI type; the call is blocking.
            let rc = unsafe {
                ffi::MPI_Allreduce(
                    send.as_ptr().cast(),
                    piece.as_mut_ptr().cast(),
                    piece_count(len),
                    datatype(T::KIND),
                    operation(op),
                    self.comm,
                )
            };
            check(rc, "MPI_Allreduce")?;
        }
        Ok(())
    }
}

impl AllGather for MpiComm {
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        check_all_gather(send.len(), recv.len(), self.size)?;
        let dt = datatype(T::KIND);
        let limit = max_count();
        let n = send.len();
        if recv.len() <= limit {
            // SAFETY: `send` holds `n` elements, `recv` holds `n * size` (checked) ≤ i32::MAX,
            // both of T's MPI type, distinct, and the call is blocking.
            let rc = unsafe {
                ffi::MPI_Allgather(
                    send.as_ptr().cast(),
                    piece_count(n),
                    dt,
                    recv.as_mut_ptr().cast(),
                    piece_count(n),
                    dt,
                    self.comm,
                )
            };
            return check(rc, "MPI_Allgather");
        }
        // Pieces of the send buffer small enough that all ranks' together fit one call,
        // gathered into a staging buffer and copied to their places in `recv`.
        let piece = (limit / self.size).max(1);
        let mut staging: Vec<T> = vec![T::zeroed(); piece * self.size];
        for (offset, len) in pieces(n, piece) {
            // SAFETY: `send[offset..]` holds `len` elements, `staging` holds `len * size` ≤
            // i32::MAX (`piece * size ≤ limit`, or `size` when the limit is below the group
            // size, which is far below i32::MAX), both of T's MPI type, distinct; blocking.
            let rc = unsafe {
                ffi::MPI_Allgather(
                    send[offset..].as_ptr().cast(),
                    piece_count(len),
                    dt,
                    staging.as_mut_ptr().cast(),
                    piece_count(len),
                    dt,
                    self.comm,
                )
            };
            check(rc, "MPI_Allgather")?;
            for r in 0..self.size {
                recv[r * n + offset..r * n + offset + len]
                    .copy_from_slice(&staging[r * len..(r + 1) * len]);
            }
        }
        Ok(())
    }
}

impl AllToAllV for MpiComm {
    fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_layout: &BlockLayout,
        recv: &mut [T],
        recv_layout: &BlockLayout,
    ) -> Result<(), CommError> {
        let p = self.size;
        send_layout.check("all_to_all_v send", p, send.len(), false)?;
        recv_layout.check("all_to_all_v receive", p, recv.len(), true)?;
        // Every count and displacement fits an int when the extents do; whether any rank's do
        // not is agreed first, so that all ranks take the same path.
        let limit = max_count();
        let local_split = send_layout.extent() > limit || recv_layout.extent() > limit;
        if self.any_rank(local_split)? {
            return self.all_to_all_v_split(send, send_layout, recv, recv_layout, limit);
        }
        let mut ints = self.counts.borrow_mut();
        ints.clear();
        for layout in [send_layout, recv_layout] {
            ints.extend(layout.counts().iter().map(|&c| c as c_int));
            ints.extend(layout.displs().iter().map(|&d| d as c_int));
        }
        let (send_ints, recv_ints) = ints.split_at(2 * p);
        let dt = datatype(T::KIND);
        // SAFETY: the layouts were checked against the group size and the buffer lengths (every
        // block lies inside its buffer, receive blocks are disjoint) and fit C ints (the extents
        // do, so every count and displacement does); the buffers are distinct and the call is
        // blocking.
        let rc = unsafe {
            ffi::MPI_Alltoallv(
                send.as_ptr().cast(),
                send_ints[..p].as_ptr(),
                send_ints[p..].as_ptr(),
                dt,
                recv.as_mut_ptr().cast(),
                recv_ints[..p].as_ptr(),
                recv_ints[p..].as_ptr(),
                dt,
                self.comm,
            )
        };
        check(rc, "MPI_Alltoallv")
    }
}

impl MpiComm {
    /// Whether `flag` holds on any rank (a max-reduction of one byte; collective).
    fn any_rank(&self, flag: bool) -> Result<bool, CommError> {
        let send = u8::from(flag);
        let mut result = 0u8;
        // SAFETY: one-element buffers of MPI_UINT8_T, distinct; blocking.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                std::ptr::from_ref(&send).cast(),
                std::ptr::from_mut(&mut result).cast(),
                1,
                datatype(ElementKind::U8),
                operation(ReduceOp::Max),
                self.comm,
            )
        };
        check(rc, "MPI_Allreduce")?;
        Ok(result != 0)
    }

    /// The private communicator for split messages, duplicated on first use (collective: every
    /// rank reaches it in the same all-to-all).
    fn split_comm(&self) -> Result<ffi::MPI_Comm, CommError> {
        let existing = self.split_comm.get();
        if existing != comm_null() {
            return Ok(existing);
        }
        let mut dup = comm_null();
        // SAFETY: `self.comm` is valid; valid out-pointer.
        let rc = unsafe { ffi::MPI_Comm_dup(self.comm, &mut dup) };
        check(rc, "MPI_Comm_dup")?;
        self.split_comm.set(dup);
        // SAFETY: `dup` is the valid duplicate; the error handler constant is predefined.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(dup, ffi::RSMPI_ERRORS_RETURN) };
        check(rc, "MPI_Comm_set_errhandler")?;
        Ok(dup)
    }

    /// An all-to-all as point-to-point pieces of at most `limit` elements: for every peer, its
    /// block of `recv` as consecutive receives and its block of `send` as consecutive sends
    /// (messages between two ranks on one communicator and tag arrive in order).
    fn all_to_all_v_split<T: Element>(
        &self,
        send: &[T],
        send_layout: &BlockLayout,
        recv: &mut [T],
        recv_layout: &BlockLayout,
        limit: usize,
    ) -> Result<(), CommError> {
        let comm = self.split_comm()?;
        let dt = datatype(T::KIND);
        let total: usize = (0..self.size)
            .map(|r| {
                pieces(recv_layout.counts()[r], limit).count()
                    + pieces(send_layout.counts()[r], limit).count()
            })
            .sum();
        let n = count("split all_to_all_v requests", total)?;
        let mut requests: Vec<ffi::MPI_Request> = Vec::with_capacity(total);
        let recv_ptr = recv.as_mut_ptr();
        let mut posted = Ok(());
        for r in 0..self.size {
            let base = recv_layout.displs()[r];
            for (offset, len) in pieces(recv_layout.counts()[r], limit) {
                let mut request = request_null();
                // SAFETY: the layout was checked against `recv` (its block `base..base+count`
                // lies inside, blocks are disjoint), so `base + offset .. + len` is in bounds
                // and written by this receive alone; `recv` stays exclusively borrowed until
                // every request below has completed.
                let rc = unsafe {
                    ffi::MPI_Irecv(
                        recv_ptr.add(base + offset).cast(),
                        piece_count(len),
                        dt,
                        r as c_int,
                        0,
                        comm,
                        &mut request,
                    )
                };
                posted = check(rc, "MPI_Irecv");
                if posted.is_err() {
                    break;
                }
                requests.push(request);
            }
        }
        if posted.is_ok() {
            'peers: for r in 0..self.size {
                let block = &send[send_layout.block(r)];
                for (offset, len) in pieces(block.len(), limit) {
                    let mut request = request_null();
                    // SAFETY: `block[offset..offset + len]` is in bounds and stays borrowed
                    // (shared) until every request has completed below.
                    let rc = unsafe {
                        ffi::MPI_Isend(
                            block[offset..].as_ptr().cast(),
                            piece_count(len),
                            dt,
                            r as c_int,
                            0,
                            comm,
                            &mut request,
                        )
                    };
                    posted = check(rc, "MPI_Isend");
                    if posted.is_err() {
                        break 'peers;
                    }
                    requests.push(request);
                }
            }
        }
        if posted.is_err() {
            // Posting failed part-way: the receives posted may never be matched, so cancel them
            // before waiting (a cancelled or completed request both finish the wait).
            for request in &mut requests {
                // SAFETY: an active request of this call (sends ignore a cancel that comes too
                // late; MPI allows cancelling any active request).
                let rc = unsafe { ffi::MPI_Cancel(request) };
                if let Err(e) = check(rc, "MPI_Cancel") {
                    tracing::warn!(%e, "cancelling a split all-to-all piece failed");
                }
            }
        }
        let posted_count = piece_count(requests.len().min(n as usize));
        // SAFETY: `requests` holds `posted_count` (≤ n) active or cancelled requests whose
        // buffers are borrowed for this call; MPI_STATUSES_IGNORE is a valid statuses argument.
        let rc = unsafe {
            ffi::MPI_Waitall(
                posted_count,
                requests.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        posted?;
        check(rc, "MPI_Waitall")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Send,
    Receive,
}

/// One posted request's buffer, held as a raw pointer while MPI owns it. A buffer longer than
/// [`max_count`] goes as several MPI requests, `requests[first..first + pieces]`, one per
/// consecutive piece; the request completes when all of them have.
struct Posted<T> {
    peer: usize,
    tag: Tag,
    direction: Direction,
    ptr: NonNull<T>,
    len: usize,
    first: usize,
    pieces: usize,
    done: bool,
}

/// The request set of an [`MpiComm`] exchange scope; see [`Exchange`].
///
/// Buffers are borrowed for `'a` and held as raw pointers while MPI reads or writes them; a
/// finished request hands its buffer back as a reference. `Drop` cancels pending receives and
/// waits for every pending request, so no transfer outlives the borrows.
///
/// After an error inside the scope, a pending *send* is still waited for; if its receiver has
/// given up too (cancelled its receive), a large message can block there. Treat an exchange
/// error as fatal for the job: report it and call [`MpiComm::abort`].
pub struct MpiExchange<'a, T: Element> {
    comm: &'a MpiComm,
    requests: Vec<ffi::MPI_Request>,
    posted: Vec<Posted<T>>,
    pending: usize,
    _buffers: PhantomData<&'a mut [T]>,
}

impl<T: Element> fmt::Debug for MpiExchange<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiExchange")
            .field("rank", &self.comm.rank)
            .field("element", &T::KIND)
            .field("posted", &self.posted.len())
            .field("pending", &self.pending)
            .finish()
    }
}

impl<'a, T: Element> MpiExchange<'a, T> {
    /// Posts `len` elements at `ptr` to or from `peer` as one request per piece of at most
    /// [`max_count`] elements.
    ///
    /// # Safety
    /// `ptr` is valid for `len` elements for `'a` (readable for a send; for a receive, writable
    /// and used by nothing else until the request finishes).
    unsafe fn post(
        &mut self,
        direction: Direction,
        peer: usize,
        tag: Tag,
        ptr: NonNull<T>,
        len: usize,
    ) -> Result<RequestId, CommError> {
        let first = self.requests.len();
        for (offset, piece) in pieces(len, max_count()) {
            let mut request = request_null();
            // SAFETY: `offset + piece ≤ len`, so the piece lies in the caller's buffer, valid
            // as the caller guarantees; the peer and tag were checked; the exchange's Drop
            // completes the request before the borrow ends.
            let rc = unsafe {
                let at = ptr.as_ptr().add(offset).cast();
                match direction {
                    Direction::Send => ffi::MPI_Isend(
                        at,
                        piece_count(piece),
                        datatype(T::KIND),
                        peer as c_int,
                        c_int::from(tag),
                        self.comm.comm,
                        &mut request,
                    ),
                    Direction::Receive => ffi::MPI_Irecv(
                        at,
                        piece_count(piece),
                        datatype(T::KIND),
                        peer as c_int,
                        c_int::from(tag),
                        self.comm.comm,
                        &mut request,
                    ),
                }
            };
            let call = match direction {
                Direction::Send => "MPI_Isend",
                Direction::Receive => "MPI_Irecv",
            };
            if let Err(e) = check(rc, call) {
                // The pieces already posted stay pending as a request of their own, so that
                // Drop cancels or completes them.
                if self.requests.len() > first {
                    self.push_posted(direction, peer, tag, ptr, len, first);
                }
                return Err(e);
            }
            self.requests.push(request);
        }
        Ok(self.push_posted(direction, peer, tag, ptr, len, first))
    }

    fn push_posted(
        &mut self,
        direction: Direction,
        peer: usize,
        tag: Tag,
        ptr: NonNull<T>,
        len: usize,
        first: usize,
    ) -> RequestId {
        self.posted.push(Posted {
            peer,
            tag,
            direction,
            ptr,
            len,
            first,
            pieces: self.requests.len() - first,
            done: false,
        });
        self.pending += 1;
        RequestId(self.posted.len() - 1)
    }

    /// The MPI requests of posted request `i`.
    fn requests_of(&mut self, i: usize) -> &mut [ffi::MPI_Request] {
        let (first, pieces) = (self.posted[i].first, self.posted[i].pieces);
        &mut self.requests[first..first + pieces]
    }

    /// Marks request `i` failed (its MPI requests are complete or freed by the failed call).
    fn fail(&mut self, i: usize, e: CommError) -> CommError {
        self.posted[i].done = true;
        self.pending -= 1;
        e
    }

    fn check_id(&self, id: RequestId) -> Result<(), CommError> {
        match self.posted.get(id.0) {
            Some(p) if !p.done => Ok(()),
            _ => Err(CommError::InvalidRequest { id: id.0 }),
        }
    }

    /// Marks request `i` finished (MPI has released its buffer: every piece has completed,
    /// `statuses` holds one status per piece) and hands the buffer back.
    fn finish(
        &mut self,
        i: usize,
        statuses: &[ffi::MPI_Status],
    ) -> Result<Completion<'a, T>, CommError> {
        let posted = &mut self.posted[i];
        if posted.done {
            return Err(CommError::InvalidRequest { id: i });
        }
        posted.done = true;
        self.pending -= 1;
        let (peer, tag, len, ptr) = (posted.peer, posted.tag, posted.len, posted.ptr);
        let id = RequestId(i);
        match posted.direction {
            Direction::Send => Ok(Completion::Sent {
                id,
                peer,
                tag,
                // SAFETY: `ptr`/`len` come from a `&'a [T]` given to `isend`; MPI no longer
                // reads it and the `done` flag hands it out only once.
                data: unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) },
            }),
            Direction::Receive => {
                // Every piece must have received exactly its length.
                let (mut total, mut exact) = (0usize, true);
                for (status, (_, piece)) in statuses.iter().zip(pieces(len, max_count())) {
                    let mut received: c_int = 0;
                    // SAFETY: `status` was filled by MPI for this receive's piece; valid
                    // out-pointer.
                    let rc =
                        unsafe { ffi::MPI_Get_count(status, datatype(T::KIND), &mut received) };
                    check(rc, "MPI_Get_count")?;
                    let got = usize::try_from(received).unwrap_or(0);
                    exact &= received != undefined() && got == piece;
                    total += got;
                }
                if !exact {
                    return Err(CommError::MessageLength {
                        peer,
                        tag,
                        expected: len,
                        actual: total,
                    });
                }
                Ok(Completion::Received {
                    id,
                    peer,
                    tag,
                    // SAFETY: `ptr`/`len` come from a `&'a mut [T]` moved into `irecv`, which
                    // nothing else uses; MPI has finished writing it and the `done` flag hands it
                    // out only once.
                    data: unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) },
                })
            }
        }
    }

    /// Cancels pending receives and waits for every pending request; errors are logged only.
    fn abandon(&mut self) {
        for posted in &mut self.posted {
            if posted.done {
                continue;
            }
            for request in &mut self.requests[posted.first..posted.first + posted.pieces] {
                if posted.direction == Direction::Receive && *request != request_null() {
                    // SAFETY: `request` is an active request of this exchange.
                    let rc = unsafe { ffi::MPI_Cancel(request) };
                    if let Err(e) = check(rc, "MPI_Cancel") {
                        tracing::warn!(%e, "cancelling a pending receive failed");
                    }
                }
                let mut status = empty_status();
                // SAFETY: `request` is active (or already null, which MPI_Wait accepts); its
                // buffer is still borrowed by this exchange.
                let rc = unsafe { ffi::MPI_Wait(request, &mut status) };
                if let Err(e) = check(rc, "MPI_Wait") {
                    tracing::warn!(%e, "completing an abandoned request failed");
                }
            }
            posted.done = true;
        }
        self.pending = 0;
    }

    /// Waits for every piece of request `i` (MPI_Waitall) and finishes it.
    fn wait_pieces(&mut self, i: usize) -> Result<Completion<'a, T>, CommError> {
        let pieces = self.posted[i].pieces;
        let mut statuses = vec![empty_status(); pieces];
        let requests = self.requests_of(i);
        // SAFETY: `requests` holds `pieces` requests of this exchange, active or null (pieces
        // already completed); `statuses` has room for as many.
        let rc = unsafe {
            ffi::MPI_Waitall(
                piece_count(pieces),
                requests.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        if let Err(e) = check(rc, "MPI_Waitall") {
            return Err(self.fail(i, e));
        }
        self.finish(i, &statuses)
    }
}

impl<T: Element> Drop for MpiExchange<'_, T> {
    fn drop(&mut self) {
        if self.pending > 0 {
            self.abandon();
        }
    }
}

impl<'a, T: Element> Exchange<'a, T> for MpiExchange<'a, T> {
    fn isend(&mut self, dest: usize, tag: Tag, buf: &'a [T]) -> Result<RequestId, CommError> {
        check_rank("destination", dest, self.comm.size)?;
        check_tag(tag)?;
        let len = buf.len();
        // SAFETY: `buf` stays borrowed (shared) for `'a`, which outlives this exchange, whose
        // Drop completes the request; MPI only reads a send buffer.
        unsafe { self.post(Direction::Send, dest, tag, NonNull::from(buf).cast(), len) }
    }

    fn irecv(&mut self, source: usize, tag: Tag, buf: &'a mut [T]) -> Result<RequestId, CommError> {
        check_rank("source", source, self.comm.size)?;
        check_tag(tag)?;
        let len = buf.len();
        let ptr: NonNull<T> = NonNull::from(buf).cast();
        // SAFETY: the exclusive borrow `buf` was consumed into `ptr` for `'a`, which outlives this
        // exchange, whose Drop completes the request; nothing else touches the buffer until the
        // request finishes and `finish` hands it back.
        unsafe { self.post(Direction::Receive, source, tag, ptr, len) }
    }

    fn wait(&mut self, id: RequestId) -> Result<Completion<'a, T>, CommError> {
        self.check_id(id)?;
        self.wait_pieces(id.0)
    }

    fn test(&mut self, id: RequestId) -> Result<Option<Completion<'a, T>>, CommError> {
        self.check_id(id)?;
        let pieces = self.posted[id.0].pieces;
        let mut statuses = vec![empty_status(); pieces];
        let mut flag: c_int = 0;
        let requests = self.requests_of(id.0);
        // SAFETY: `requests` holds `pieces` active requests of this exchange (MPI_Testall
        // completes all of them or none); valid out-pointers with room for `pieces` statuses.
        let rc = unsafe {
            ffi::MPI_Testall(
                piece_count(pieces),
                requests.as_mut_ptr(),
                &mut flag,
                statuses.as_mut_ptr(),
            )
        };
        if let Err(e) = check(rc, "MPI_Testall") {
            return Err(self.fail(id.0, e));
        }
        if flag == 0 {
            return Ok(None);
        }
        self.finish(id.0, &statuses).map(Some)
    }

    fn wait_any(&mut self) -> Result<Option<Completion<'a, T>>, CommError> {
        if self.pending == 0 {
            return Ok(None);
        }
        let n = count("pending requests", self.requests.len())?;
        let mut index: c_int = 0;
        let mut status = empty_status();
        // SAFETY: `requests` holds `n` handles, active or MPI_REQUEST_NULL (finished ones are
        // set to null by MPI); valid out-pointers.
        let rc =
            unsafe { ffi::MPI_Waitany(n, self.requests.as_mut_ptr(), &mut index, &mut status) };
        check(rc, "MPI_Waitany")?;
        if index == undefined() {
            return Ok(None);
        }
        let j = usize::try_from(index).map_err(|_| CommError::InvalidRequest { id: usize::MAX })?;
        // The posted request that MPI request j is a piece of; its other pieces are waited
        // for now (the peer has posted them all), so no request is ever half finished.
        let i = self
            .posted
            .partition_point(|p| p.first <= j)
            .saturating_sub(1);
        if self.posted[i].pieces == 1 {
            return self.finish(i, std::slice::from_ref(&status)).map(Some);
        }
        let piece = j - self.posted[i].first;
        let mut statuses = vec![empty_status(); self.posted[i].pieces];
        let requests = self.requests_of(i);
        // SAFETY: `requests` holds this request's pieces, active or null (piece j, just
        // completed); `statuses` has room for all of them.
        let rc = unsafe {
            ffi::MPI_Waitall(
                piece_count(requests.len()),
                requests.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        if let Err(e) = check(rc, "MPI_Waitall") {
            return Err(self.fail(i, e));
        }
        statuses[piece] = status;
        self.finish(i, &statuses).map(Some)
    }

    fn pending(&self) -> usize {
        self.pending
    }
}

impl PointToPoint for MpiComm {
    type Exchange<'a, T: Element> = MpiExchange<'a, T>;

    fn exchange<'a, T, R, F>(&'a self, f: F) -> Result<R, CommError>
    where
        T: Element,
        F: FnOnce(&mut MpiExchange<'a, T>) -> Result<R, CommError>,
    {
        let mut ex = MpiExchange {
            comm: self,
            requests: Vec::new(),
            posted: Vec::new(),
            pending: 0,
            _buffers: PhantomData,
        };
        // On error or panic, `ex`'s Drop cancels pending receives and completes every request
        // before the borrowed buffers are released.
        let out = f(&mut ex)?;
        ex.wait_all()?;
        Ok(out)
    }
}
