//! Communicators that move the bytes a distspmm schedule asks for: MPI, in-process threads,
//! and NCCL on device buffers (feature `nccl`).
//!
//! # Capabilities
//! Communication is split into narrow traits, in the spirit of rsmpi, so a function asks only for
//! what it uses:
//!
//! | trait | calls | used for |
//! |---|---|---|
//! | [`Group`] | `rank`, `size`, `barrier` | membership, timing fences |
//! | [`Broadcast`] | `broadcast(buf, root)` | the broadcast schedule (rank q sends X_q to all) |
//! | [`AllReduce`] | `all_reduce(buf, Sum/Max/Min)`, `all_reduce_sum` | gradients, accuracy, agreeing on a maximum |
//! | [`AllGather`] | `all_gather(send, recv)`, `all_gather_vec` | agreeing on metadata (P, fingerprint, F) before any other collective |
//! | [`AllToAllV`] | `all_to_all_v(send, layout, recv, layout)` | one-shot halo exchange |
//! | [`PointToPoint`] | `exchange(\|ex\| …)` with `isend`/`irecv`/`wait`/`wait_any`/`test` | overlapped halo exchange: post receives, post sends, compute the local block, consume remote blocks as they arrive |
//!
//! [`Communicator`] bundles them all. Element types are the sealed [`Element`] set (`u8`, `i32`,
//! `u32`, `i64`, `u64`, `f32`, `f64`); reductions apply to [`Reducible`] (all but `u8`). Every call
//! returns [`CommError`]; a failing *peer* is an error value, not a panic, wherever the backend can
//! tell.
//!
//! Nonblocking messages live inside a scope: [`PointToPoint::exchange`] lends an [`Exchange`]
//! request set to a closure; buffers are borrowed for the scope, a receive hands its filled buffer
//! back in its [`Completion`], and every request is completed (or cancelled, on error or panic)
//! before the borrows end. No `unsafe` is needed to use it, and leaking a request is impossible.
//!
//! ```
//! use dist_comm::{AllGather, AllReduce, Group, LocalComm};
//!
//! // Agree on metadata before any other collective, then reduce: the same code runs over MPI.
//! let out = LocalComm::run(4, |comm| {
//!     let meta = comm.all_gather_vec(&[comm.size() as u64, 0xF1A9])?;
//!     assert!(meta.chunks(2).all(|m| m == [4, 0xF1A9]));
//!     let mut grad = [comm.rank() as f32, 1.0];
//!     comm.all_reduce_sum(&mut grad)?;
//!     Ok::<_, dist_comm::CommError>(grad)
//! });
//! assert!(out.iter().all(|g| g == &Ok([6.0, 4.0])));
//! ```
//!
//! # Backends
//! - [`LocalComm`] — P ranks as threads of one process (`LocalComm::run(p, |comm| …)`), for tests
//!   and single-machine runs without MPI. Collectives are deterministic: reductions fold in rank
//!   order, `((b0 ∘ b1) ∘ b2) ∘ …`, bit-identical to a serial loop over the ranks. The ranks check
//!   that their collective calls agree (same collective, root, length, type; all-to-all counts
//!   that match between sender and receiver) and all get the same [`CommError::Mismatch`]
//!   otherwise. A rank that panics or drops its handle while others wait on it turns their wait
//!   into [`CommError::PeerFailed`]; a panic poisons the group.
//! - `MpiComm` (feature `mpi`, default) — over the system MPI through rsmpi's FFI. Either
//!   initialises MPI (`MpiComm::init`, which owns `MPI_Finalize`) or adopts a communicator the host
//!   application already has (`MpiComm::adopt`, `MpiComm::from_fortran_handle` for the `MPI_Fint`
//!   a C ABI receives, `MpiComm::world_if_initialized`). It always works on a *duplicate* of the
//!   given communicator, so its messages never match the host's, and sets `MPI_ERRORS_RETURN` on
//!   that duplicate so failing calls become [`CommError::Mpi`]. MPI's reduction order is left to the
//!   library: sums can differ in the last bits from the `local` backend for P ≥ 3 (OpenMPI gives
//!   every rank the same result).
//!
//! - `NcclComm` (feature `nccl`) — NCCL broadcast, all-reduce and grouped send/receive (the halo
//!   exchange) on *device* buffers (cudarc slices, or raw device pointers), set up collectively
//!   over a host communicator (MPI). On host buffers it implements [`Group`], [`Broadcast`],
//!   [`AllReduce`] and [`AllGather`] too (staged through the device: for the few words of an
//!   agreement, not bulk data), so code generic over those capabilities runs on it; see the
//!   `nccl` module for setup, stream ordering and library loading. `NcclHost` is the same
//!   staging as a separate value.
//!
//! This crate moves bytes only: the distributed SpMM that runs schedules over these
//! communicators (on host or device buffers) is the crate `distspmm-op`.
//!
//! [`Counting`] wraps any of them and counts the bytes handed to each kind of call (what
//! `bench dist` and training report as traffic).
//!
//! [`conformance`] holds the checks every backend passes (the `local` unit tests run them for
//! P = 1..5, `dist-comm-selftest` under `mpirun`); a new host-buffer backend should run them too.
//! The NCCL backend, on device buffers, has its own GPU check: `nccl-selftest`.
//!
//! # Thread-safety
//! A communicator handle is used by one thread at a time: [`LocalComm`] is `Send` but not `Sync`
//! (one thread drives one rank); `MpiComm` is neither `Send` nor `Sync`, because MPI is initialised
//! with `MPI_THREAD_FUNNELED` — only the thread that initialised MPI makes MPI calls, while kernels
//! may use any number of worker threads that never call MPI. Adopting a communicator from a host
//! whose MPI provides less than `MPI_THREAD_SERIALIZED` is only allowed on MPI's main thread.
//!
//! # Running under `mpirun` (OpenMPI)
//! Shared memory (`vader`, single copy through CMA) works in the project's container; the flags
//! the integration tests use are
//!
//! ```text
//! OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
//!   mpirun -n 3 --oversubscribe --mca btl self,vader <program>
//! ```
//!
//! (`--oversubscribe` when ranks exceed cores; the two variables only when running as root.)
//! Checked with OpenMPI 4.1.4 at 1–4 ranks on 2 cores: `self,vader` (CMA single copy),
//! `self,vader` with `--mca btl_vader_single_copy_mechanism none`, `self,tcp` and the default
//! selection all pass. If a container forbids cross-process memory access (`process_vm_readv`,
//! which CMA needs; typical of a restrictive seccomp or ptrace policy) add
//! `--mca btl_vader_single_copy_mechanism none`; `--mca btl self,tcp` avoids shared memory
//! altogether. The `dist-comm-selftest` binary runs every call of this crate on
//! `MPI_COMM_WORLD` and exits non-zero on any wrong result: use it to check an MPI installation.

pub mod agree;
mod capability;
pub mod conformance;
mod counting;
mod element;
mod error;
mod layout;
mod local;
#[cfg(feature = "mpi")]
mod mpi_backend;
#[cfg(feature = "nccl")]
pub mod nccl;

pub use capability::{
    AllGather, AllReduce, AllToAllV, Broadcast, Communicator, Completion, Exchange, Group,
    PointToPoint, RequestId, Tag, MAX_TAG,
};
pub use counting::{Bytes, Counting, CountingExchange, TrafficCounts};
pub use element::{Element, ElementKind, ReduceOp, Reducible};
pub use error::CommError;
pub use layout::BlockLayout;
pub use local::{LocalComm, LocalExchange};
#[cfg(feature = "mpi")]
pub use mpi_backend::{max_count as mpi_max_count, MpiComm, MpiExchange, MAX_COUNT_ENV};
#[cfg(feature = "nccl")]
pub use nccl::{DeviceSelect, NcclComm, NcclHost, NcclUniqueId, RawDeviceBuffer};
