//! The `mpi` backend: the system MPI library through rsmpi's FFI bindings.
//!
//! Calls go straight to `mpi::ffi` so that every return code is checked (rsmpi's safe wrappers
//! discard them) — together with `MPI_ERRORS_RETURN` on our communicator, a failing call becomes
//! a [`CommError::Mpi`] instead of an abort. rsmpi provides initialisation/finalisation
//! ([`Universe`]), the datatype handles and the reduction operation handles.
//!
//! **Large messages.** No length is limited by MPI's C `int` counts: a buffer longer than one
//! call can name travels as one message under a derived datatype, and all-reduces in pieces
//! ([`large`]; [`MAX_COUNT_ENV`] lowers the limit in tests).

mod large;

pub use large::{max_count, MAX_COUNT_ENV};
use large::{pieces, Span};

use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::Threading;

use crate::capability::{check_all_gather, check_rank, check_tag, rank_int};
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
        let span = Span::new(T::KIND, buf.len(), "broadcast length")?;
        // SAFETY: `span` describes exactly `buf`'s elements, which are valid and exclusively
        // borrowed for the blocking call; the root is in range.
        let rc = unsafe {
            ffi::MPI_Bcast(
                buf.as_mut_ptr().cast(),
                span.count(),
                span.datatype(),
                rank_int(root),
                self.comm,
            )
        };
        check(rc, "MPI_Bcast")
    }
}

impl AllReduce for MpiComm {
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let mut scratch = self.reduce_scratch.borrow_mut();
        // Built-in reductions take predefined datatypes only: consecutive pieces, cut alike on
        // every rank (all pass the same length).
        for (offset, len) in pieces(buf.len(), max_count()) {
            let piece = &mut buf[offset..offset + len];
            let n = count("all_reduce length", len)?;
            let words = size_of_val(piece).div_ceil(8);
            if scratch.len() < words {
                scratch.resize(words, 0);
            }
            let send: &mut [T] =
                &mut bytemuck::cast_slice_mut::<u64, T>(&mut scratch[..words])[..len];
            send.copy_from_slice(piece);
            // SAFETY: `send` and `piece` are distinct valid buffers of `n` elements of T's MPI
            // type; the call is blocking.
            let rc = unsafe {
                ffi::MPI_Allreduce(
                    send.as_ptr().cast(),
                    piece.as_mut_ptr().cast(),
                    n,
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
        // One rank's block, on both sides: rank r's lands `r` extents (= `send.len()`
        // elements) into `recv`.
        let span = Span::new(T::KIND, send.len(), "all_gather length")?;
        // SAFETY: `span` describes `send`'s elements; `recv` holds `size` such blocks
        // (checked); the buffers are distinct and the call is blocking.
        let rc = unsafe {
            ffi::MPI_Allgather(
                send.as_ptr().cast(),
                span.count(),
                span.datatype(),
                recv.as_mut_ptr().cast(),
                span.count(),
                span.datatype(),
                self.comm,
            )
        };
        check(rc, "MPI_Allgather")
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
        // Every count and displacement fits a call when the extents do. All ranks must take
        // the same collective, so whether any rank's do not is agreed first.
        let limit = max_count();
        let local_large = send_layout.extent() > limit || recv_layout.extent() > limit;
        if self.any_rank(local_large)? {
            return self.all_to_all_w(send, send_layout, recv, recv_layout);
        }
        let mut ints = self.counts.borrow_mut();
        ints.clear();
        #[allow(
            clippy::cast_possible_truncation,
            reason = "every count and displacement is at most the layout's extent, which fits a c_int (checked just above)"
        )]
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
    /// Whether `flag` holds on any rank (a max-reduction of one word; collective).
    fn any_rank(&self, flag: bool) -> Result<bool, CommError> {
        let mut flag = [u32::from(flag)];
        self.all_reduce(&mut flag, ReduceOp::Max)?;
        Ok(flag[0] != 0)
    }

    /// An all-to-all whose counts or displacements exceed one call's: `MPI_Alltoallw` with one
    /// datatype per peer and side that places the block itself ([`Span::at`]), so every count
    /// is 0 or 1 and every displacement 0.
    fn all_to_all_w<T: Element>(
        &self,
        send: &[T],
        send_layout: &BlockLayout,
        recv: &mut [T],
        recv_layout: &BlockLayout,
    ) -> Result<(), CommError> {
        let p = self.size;
        let spans = |layout: &BlockLayout, what| {
            (0..p)
                .map(|q| Span::at(T::KIND, layout.displs()[q], layout.counts()[q], what))
                .collect::<Result<Vec<Span>, CommError>>()
        };
        let send_spans = spans(send_layout, "all_to_all_v send block")?;
        let recv_spans = spans(recv_layout, "all_to_all_v receive block")?;
        let counts = |s: &[Span]| s.iter().map(Span::count).collect::<Vec<c_int>>();
        let types = |s: &[Span]| s.iter().map(Span::datatype).collect::<Vec<_>>();
        let (send_counts, recv_counts) = (counts(&send_spans), counts(&recv_spans));
        let (send_types, recv_types) = (types(&send_spans), types(&recv_spans));
        let zeros: Vec<c_int> = vec![0; p];
        // SAFETY: each peer's type places exactly its block of the layout, which was checked
        // against the buffer (inside it; receive blocks disjoint); all arrays hold `p` entries;
        // the buffers are distinct, the spans outlive the blocking call.
        let rc = unsafe {
            ffi::MPI_Alltoallw(
                send.as_ptr().cast(),
                send_counts.as_ptr(),
                zeros.as_ptr(),
                send_types.as_ptr(),
                recv.as_mut_ptr().cast(),
                recv_counts.as_ptr(),
                zeros.as_ptr(),
                recv_types.as_ptr(),
                self.comm,
            )
        };
        check(rc, "MPI_Alltoallw")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Send,
    Receive,
}

/// One posted request's buffer, held as a raw pointer while MPI owns it.
struct Posted<T> {
    peer: usize,
    tag: Tag,
    direction: Direction,
    ptr: NonNull<T>,
    len: usize,
    /// The datatype the request was posted with (a derived one for a long buffer), kept until
    /// it finishes so that a receive can count what arrived.
    span: Span,
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
    fn push(&mut self, request: ffi::MPI_Request, posted: Posted<T>) -> RequestId {
        self.requests.push(request);
        self.posted.push(posted);
        self.pending += 1;
        RequestId(self.posted.len() - 1)
    }

    fn check_id(&self, id: RequestId) -> Result<(), CommError> {
        match self.posted.get(id.0) {
            Some(p) if !p.done => Ok(()),
            _ => Err(CommError::InvalidRequest { id: id.0 }),
        }
    }

    /// Marks request `i` finished (MPI has released its buffer) and hands the buffer back.
    fn finish(
        &mut self,
        i: usize,
        status: &ffi::MPI_Status,
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
                let received = posted.span.received(status)?;
                if received != Some(len) {
                    return Err(CommError::MessageLength {
                        peer,
                        tag,
                        expected: len,
                        actual: received.unwrap_or(0),
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
        for (request, posted) in self.requests.iter_mut().zip(&mut self.posted) {
            if posted.done {
                continue;
            }
            if posted.direction == Direction::Receive {
                // SAFETY: `request` is an active request of this exchange.
                let rc = unsafe { ffi::MPI_Cancel(request) };
                if let Err(e) = check(rc, "MPI_Cancel") {
                    tracing::warn!(%e, "cancelling a pending receive failed");
                }
            }
            let mut status = empty_status();
            // SAFETY: `request` is active (or already null, which MPI_Wait accepts); its buffer
            // is still borrowed by this exchange.
            let rc = unsafe { ffi::MPI_Wait(request, &mut status) };
            if let Err(e) = check(rc, "MPI_Wait") {
                tracing::warn!(%e, "completing an abandoned request failed");
            }
            posted.done = true;
        }
        self.pending = 0;
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
        let span = Span::new(T::KIND, buf.len(), "isend length")?;
        let mut request = request_null();
        // SAFETY: `buf` stays borrowed (shared) for `'a`, which outlives this exchange, whose
        // Drop completes the request; `span` describes exactly its elements; the destination
        // and tag are valid.
        let rc = unsafe {
            ffi::MPI_Isend(
                buf.as_ptr().cast(),
                span.count(),
                span.datatype(),
                rank_int(dest),
                c_int::from(tag),
                self.comm.comm,
                &mut request,
            )
        };
        check(rc, "MPI_Isend")?;
        let posted = Posted {
            peer: dest,
            tag,
            direction: Direction::Send,
            ptr: NonNull::from(buf).cast(),
            len: buf.len(),
            span,
            done: false,
        };
        Ok(self.push(request, posted))
    }

    fn irecv(&mut self, source: usize, tag: Tag, buf: &'a mut [T]) -> Result<RequestId, CommError> {
        check_rank("source", source, self.comm.size)?;
        check_tag(tag)?;
        let span = Span::new(T::KIND, buf.len(), "irecv length")?;
        let len = buf.len();
        let ptr: NonNull<T> = NonNull::from(buf).cast();
        let mut request = request_null();
        // SAFETY: the exclusive borrow `buf` was consumed into `ptr` for `'a`, which outlives this
        // exchange, whose Drop completes the request; `span` describes exactly its `len`
        // elements; nothing else touches the buffer until the request finishes and `finish`
        // hands it back.
        let rc = unsafe {
            ffi::MPI_Irecv(
                ptr.as_ptr().cast(),
                span.count(),
                span.datatype(),
                rank_int(source),
                c_int::from(tag),
                self.comm.comm,
                &mut request,
            )
        };
        check(rc, "MPI_Irecv")?;
        let posted = Posted {
            peer: source,
            tag,
            direction: Direction::Receive,
            ptr,
            len,
            span,
            done: false,
        };
        Ok(self.push(request, posted))
    }

    fn wait(&mut self, id: RequestId) -> Result<Completion<'a, T>, CommError> {
        self.check_id(id)?;
        let mut status = empty_status();
        // SAFETY: an active request of this exchange; valid status out-pointer.
        let rc = unsafe { ffi::MPI_Wait(&mut self.requests[id.0], &mut status) };
        if let Err(e) = check(rc, "MPI_Wait") {
            self.posted[id.0].done = true;
            self.pending -= 1;
            return Err(e);
        }
        self.finish(id.0, &status)
    }

    fn test(&mut self, id: RequestId) -> Result<Option<Completion<'a, T>>, CommError> {
        self.check_id(id)?;
        let mut status = empty_status();
        let mut flag: c_int = 0;
        // SAFETY: an active request of this exchange; valid out-pointers.
        let rc = unsafe { ffi::MPI_Test(&mut self.requests[id.0], &mut flag, &mut status) };
        if let Err(e) = check(rc, "MPI_Test") {
            self.posted[id.0].done = true;
            self.pending -= 1;
            return Err(e);
        }
        if flag == 0 {
            return Ok(None);
        }
        self.finish(id.0, &status).map(Some)
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
        let i = usize::try_from(index).map_err(|_| CommError::InvalidRequest { id: usize::MAX })?;
        self.finish(i, &status).map(Some)
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
