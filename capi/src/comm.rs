//! `dsp_comm`: the communicator handle (initialise MPI or adopt the host's communicator),
//! its queries, and the all-reduce helpers for gradients.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::thread::ThreadId;

use dist_comm::agree::{settle, Settled};
use dist_comm::{AllGather, AllReduce, Group, MpiComm, Reducible};

use crate::boundary::{ffi_boundary, slice_mut, Error, Handle, OutPtr, Status};

/// A communicator: a private duplicate of `MPI_COMM_WORLD` (from `dsp_init`) or of the host's
/// communicator (from `dsp_init_fortran`).
///
/// Thread-safety: MPI is used at `MPI_THREAD_FUNNELED`, so a `dsp_comm` (and every
/// `dsp_spmm` made with it) may only be used on the thread that created it; other threads get
/// `DSP_STATUS_WRONG_THREAD`. Compute threads inside the library never call MPI.
#[derive(Debug)]
pub struct Comm {
    shared: Rc<Shared>,
    owner: ThreadId,
}

/// What a communicator handle and the operators made with it share.
#[derive(Debug)]
pub(crate) struct Shared {
    // Declared first: the duplicate is freed before MPI may be finalised below.
    mpi: MpiComm,
    /// The communicator that initialised MPI, if this one was adopted while it lived: MPI is
    /// finalised only when every communicator using it is gone.
    _environment: Option<Rc<Shared>>,
}

thread_local! {
    /// The communicator whose drop finalises MPI (`dsp_init` initialised it). MPI is used at
    /// `MPI_THREAD_FUNNELED`, so all communicators live on this one thread.
    static ENVIRONMENT: RefCell<Weak<Shared>> = const { RefCell::new(Weak::new()) };
}

impl Handle for Comm {
    const C_NAME: &'static str = "dsp_comm";
}

impl Comm {
    fn new(mpi: MpiComm) -> Self {
        let owns = mpi.owns_environment();
        let environment = if owns {
            None
        } else {
            ENVIRONMENT.with(|e| e.borrow().upgrade())
        };
        let shared = Rc::new(Shared {
            mpi,
            _environment: environment,
        });
        if owns {
            ENVIRONMENT.with(|e| *e.borrow_mut() = Rc::downgrade(&shared));
        }
        Self {
            shared,
            owner: std::thread::current().id(),
        }
    }

    /// Fails with [`Status::WrongThread`] unless called on the creating thread, and with
    /// [`Status::MpiEnvironment`] once MPI has been finalised (by the host): an MPI call then
    /// would abort the process.
    pub(crate) fn check_usable(&self) -> Result<(), Error> {
        check_usable(self.owner, Self::C_NAME)
    }

    /// The communicator (after [`Comm::check_usable`]).
    pub(crate) fn mpi(&self) -> &MpiComm {
        &self.shared.mpi
    }

    /// What a handle that may outlive this one (`dsp_spmm`) keeps, with the thread it must be
    /// used on.
    pub(crate) fn share(&self) -> (SharedComm, ThreadId) {
        (SharedComm(Rc::clone(&self.shared)), self.owner)
    }
}

/// A communicator held by ownership by the handles made with it (`dsp_spmm`,
/// `dsp_spmm_device`): a reference count of the communicator and of the MPI environment it
/// needs, dereferencing to the communicator. Not `Send`: it stays on the creating thread.
#[derive(Debug, Clone)]
pub(crate) struct SharedComm(Rc<Shared>);

impl std::ops::Deref for SharedComm {
    type Target = MpiComm;

    fn deref(&self) -> &MpiComm {
        &self.0.mpi
    }
}

/// [`Status::WrongThread`] off the `owner` thread; [`Status::MpiEnvironment`] after
/// `MPI_Finalize`.
pub(crate) fn check_usable(owner: ThreadId, what: &str) -> Result<(), Error> {
    check_owner(owner, what)?;
    if mpi::environment::is_finalized() {
        return Err(Error::new(
            Status::MpiEnvironment,
            format!(
                "MPI has been finalised (by the host application); this {what} can only be freed"
            ),
        ));
    }
    Ok(())
}

/// [`Status::WrongThread`] unless the current thread is `owner`.
pub(crate) fn check_owner(owner: ThreadId, what: &str) -> Result<(), Error> {
    if std::thread::current().id() == owner {
        Ok(())
    } else {
        Err(Error::new(
            Status::WrongThread,
            format!(
                "this {what} belongs to the thread that created its dsp_comm; MPI is used at \
                 MPI_THREAD_FUNNELED, so call it from that thread"
            ),
        ))
    }
}

/// Initialises MPI (`MPI_Init_thread`, `MPI_THREAD_FUNNELED`) and returns a communicator over
/// `MPI_COMM_WORLD` in `*out`. If the host already initialised MPI, adopts `MPI_COMM_WORLD`
/// instead (then MPI is never finalised by this library). Collective over `MPI_COMM_WORLD`.
///
/// On failure `*out` is set to NULL. MPI cannot be initialised again after it was finalised
/// (`DSP_STATUS_MPI_ENVIRONMENT`).
///
/// # Safety
/// `out` is NULL or a valid pointer to a `dsp_comm *`.
#[no_mangle]
pub unsafe extern "C" fn dsp_init(out: *mut *mut Comm) -> Status {
    ffi_boundary("dsp_init", || {
        // SAFETY: the caller guarantees `out` is NULL or valid for a write.
        let out = unsafe { OutPtr::new(out, "out") }?;
        out.write(std::ptr::null_mut());
        let mpi = match MpiComm::world_if_initialized()? {
            Some(world) => world,
            None => MpiComm::init()?,
        };
        out.write(Comm::new(mpi).into_raw());
        Ok(())
    })
}

/// Adopts the host's communicator, given as its Fortran handle (`MPI_Comm_c2f(comm)` in C,
/// `comm.py2f()` in mpi4py), so this header needs no `mpi.h`. MPI must be initialised by the
/// host and is never finalised by this library. Works on a duplicate of the communicator:
/// collective over it, and its messages never match the host's. On failure `*out` is NULL.
///
/// # Safety
/// `out` is NULL or a valid pointer to a `dsp_comm *`.
#[no_mangle]
pub unsafe extern "C" fn dsp_init_fortran(fortran_comm: i32, out: *mut *mut Comm) -> Status {
    ffi_boundary("dsp_init_fortran", || {
        // SAFETY: the caller guarantees `out` is NULL or valid for a write.
        let out = unsafe { OutPtr::new(out, "out") }?;
        out.write(std::ptr::null_mut());
        let mpi = MpiComm::from_fortran_handle(fortran_comm)?;
        out.write(Comm::new(mpi).into_raw());
        Ok(())
    })
}

/// Frees a communicator (`MPI_Comm_free` of the duplicate: call it on every rank). If
/// `dsp_init` initialised MPI, MPI is finalised once every handle using it is freed: this
/// communicator, the `dsp_spmm` made with it, and communicators adopted while it lived. NULL is
/// accepted (returns `DSP_STATUS_OK`). From a thread other than the creating one it frees
/// nothing and returns `DSP_STATUS_WRONG_THREAD`. Freeing after the host finalised MPI is
/// fine (any other use then returns `DSP_STATUS_MPI_ENVIRONMENT`).
///
/// # Safety
/// `comm` is NULL or a `dsp_comm *` from `dsp_init`/`dsp_init_fortran` not yet finalised; it
/// must not be used afterwards (unless `DSP_STATUS_WRONG_THREAD` was returned).
#[no_mangle]
pub unsafe extern "C" fn dsp_finalize(comm: *mut Comm) -> Status {
    ffi_boundary("dsp_finalize", || {
        // SAFETY: the caller guarantees `comm` is NULL or a live handle it gives up.
        let Some(comm) = (unsafe { Comm::from_raw(comm) }) else {
            return Ok(());
        };
        if let Err(e) = check_owner(comm.owner, Comm::C_NAME) {
            // Dropping the `Rc` here would race with the owner thread; hand it back instead.
            let _ = Box::into_raw(comm);
            return Err(e);
        }
        drop(comm);
        Ok(())
    })
}

/// This process's rank in the communicator (0-based), in `*rank`. Any thread.
///
/// # Safety
/// `comm` is NULL or a live `dsp_comm *`; `rank` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_comm_rank(comm: *const Comm, rank: *mut u32) -> Status {
    ffi_boundary("dsp_comm_rank", || {
        // SAFETY: the caller guarantees a live handle or NULL.
        let comm = unsafe { Comm::borrow(comm, "comm") }?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        let rank = unsafe { OutPtr::new(rank, "rank") }?;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "MPI reports the rank as a non-negative C int"
        )]
        let value = comm.mpi().rank() as u32;
        rank.write(value);
        Ok(())
    })
}

/// The number of ranks in the communicator, in `*size`. Any thread.
///
/// # Safety
/// `comm` is NULL or a live `dsp_comm *`; `size` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_comm_size(comm: *const Comm, size: *mut u32) -> Status {
    ffi_boundary("dsp_comm_size", || {
        // SAFETY: the caller guarantees a live handle or NULL.
        let comm = unsafe { Comm::borrow(comm, "comm") }?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        let size = unsafe { OutPtr::new(size, "size") }?;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "MPI reports the size as a non-negative C int"
        )]
        let value = comm.mpi().size() as u32;
        size.write(value);
        Ok(())
    })
}

/// Waits until every rank of the communicator has called it. Collective; creating thread only.
///
/// # Safety
/// `comm` is NULL or a live `dsp_comm *`.
#[no_mangle]
pub unsafe extern "C" fn dsp_barrier(comm: *mut Comm) -> Status {
    ffi_boundary("dsp_barrier", || {
        // SAFETY: the caller guarantees a live handle or NULL.
        let comm = unsafe { Comm::borrow(comm, "comm") }?;
        comm.check_usable()?;
        comm.mpi().barrier()?;
        Ok(())
    })
}

/// The C ABI's agreement before a collective, on `dist_comm::agree::settle`: every rank offers
/// its local outcome (a key that must be equal everywhere, or its error) and learns every
/// rank's verdict. Returns this rank's own error if it has one; else [`Status::PeerFailed`]
/// naming the lowest failing rank, its status and message; else [`Status::ArgumentMismatch`]
/// if the keys differ (described by `describe`, e.g. "F = 16"); else the common key.
pub(crate) fn agree<C: AllGather + AllReduce>(
    comm: &C,
    local: Result<u64, Error>,
    describe: impl Fn(u64) -> String,
) -> Result<u64, Error> {
    let offered = match &local {
        Ok(key) => Ok(*key),
        Err(e) => Err((e.status as i32, e.message.as_str())),
    };
    let settled = settle(comm, offered)?;
    let key = local?;
    match settled {
        Settled::Agreed(key) => Ok(key),
        Settled::Failed(failed) => {
            let status = Status::from_code(failed.code).unwrap_or(Status::Panic);
            Err(Error::new(
                Status::PeerFailed,
                format!(
                    "rank {} failed ({}): {}",
                    failed.rank,
                    status.description().to_string_lossy(),
                    failed.message
                ),
            ))
        }
        Settled::Keys { rank, theirs, .. } => Err(Error::new(
            Status::ArgumentMismatch,
            format!(
                "rank {} has {} but rank {rank} has {}",
                comm.rank(),
                describe(key),
                describe(theirs)
            ),
        )),
    }
}

/// In-place sum over ranks of `count` values (gradients, counts): checks the buffer, agrees
/// on `count` with every rank, then reduces.
fn all_reduce_sum<T: Reducible>(comm: *mut Comm, buf: *mut T, count: usize) -> Result<(), Error> {
    // SAFETY: the exported callers' contract: `comm` is NULL or a live handle.
    let comm = unsafe { Comm::borrow(comm, "comm") }?;
    comm.check_usable()?;
    // SAFETY: the exported callers' contract: `buf` holds `count` values (or NULL).
    let local = unsafe { slice_mut(buf, count, "buf") };
    let checked = local.as_ref().map(|_| count as u64).map_err(Error::clone);
    agree(comm.mpi(), checked, |n| format!("count = {n}"))?;
    let buf = local?;
    comm.mpi().all_reduce_sum(buf)?;
    Ok(())
}

/// Replaces `buf[0..count]` on every rank by its sum over all ranks (e.g. weight gradients).
/// Collective; creating thread only. Every rank must pass the same `count`; a NULL `buf`
/// (with `count > 0`) or a different `count` on any rank fails on every rank
/// (`DSP_STATUS_PEER_FAILED` / `DSP_STATUS_ARGUMENT_MISMATCH`) instead of hanging.
///
/// # Safety
/// `comm` is NULL or a live `dsp_comm *`; `buf` is NULL or points to `count` floats.
#[no_mangle]
pub unsafe extern "C" fn dsp_allreduce_sum_f32(
    comm: *mut Comm,
    buf: *mut f32,
    count: usize,
) -> Status {
    ffi_boundary("dsp_allreduce_sum_f32", || all_reduce_sum(comm, buf, count))
}

/// `dsp_allreduce_sum_f32` for doubles (e.g. loss sums and accuracy counts).
///
/// # Safety
/// `comm` is NULL or a live `dsp_comm *`; `buf` is NULL or points to `count` doubles.
#[no_mangle]
pub unsafe extern "C" fn dsp_allreduce_sum_f64(
    comm: *mut Comm,
    buf: *mut f64,
    count: usize,
) -> Status {
    ffi_boundary("dsp_allreduce_sum_f64", || all_reduce_sum(comm, buf, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dist_comm::LocalComm;

    #[test]
    fn all_ok_with_equal_keys_agrees() {
        let out = LocalComm::run(3, |comm| agree(&comm, Ok(16), |k| format!("F = {k}")));
        assert!(out.iter().all(|r| r == &Ok(16)));
    }

    #[test]
    fn one_failing_rank_fails_every_rank_with_its_status_and_message() {
        let out = LocalComm::run(3, |comm| {
            let local = if comm.rank() == 1 {
                Err(Error::invalid("ldx 3 < cols 4"))
            } else {
                Ok(4)
            };
            agree(&comm, local, |k| format!("F = {k}"))
        });
        assert_eq!(out[1], Err(Error::invalid("ldx 3 < cols 4")));
        for r in [0, 2] {
            let e = out[r].clone().unwrap_err();
            assert_eq!(e.status, Status::PeerFailed);
            let described = Status::InvalidArgument.description().to_string_lossy();
            assert!(
                e.message
                    .starts_with(&format!("rank 1 failed ({described})")),
                "{}",
                e.message
            );
            assert!(e.message.ends_with("ldx 3 < cols 4"), "{}", e.message);
        }
    }

    #[test]
    fn different_keys_are_a_mismatch_on_every_rank() {
        let out = LocalComm::run(2, |comm| {
            agree(&comm, Ok(8 + comm.rank() as u64), |k| format!("F = {k}"))
        });
        for r in out {
            let e = r.unwrap_err();
            assert_eq!(e.status, Status::ArgumentMismatch);
            assert!(
                e.message.contains("F = 8") && e.message.contains("F = 9"),
                "{}",
                e.message
            );
        }
    }
}
