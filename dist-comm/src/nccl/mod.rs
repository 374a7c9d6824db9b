//! The `nccl` backend (feature `nccl`): NCCL broadcast, all-reduce and grouped send/receive
//! on device memory, for the GPU path of the distributed SpMM.
//!
//! # Setting up
//! [`NcclComm::new`] is collective over a host communicator (an `MpiComm`, or a
//! [`LocalComm`](crate::LocalComm) in tests): every rank probes its CUDA driver, device and the
//! NCCL library, the ranks agree that all of them can go on, each opens its device (its local
//! rank — its rank among the ranks on the same host — modulo the host's device count, or a
//! given ordinal), rank 0 creates the NCCL unique id and broadcasts it over the host
//! communicator, and every rank joins the NCCL communicator (`ncclCommInitRank`). Each step
//! ends with an agreement, so a rank without a GPU, driver or library makes *every* rank
//! return an error (the failing rank its own, the others [`CommError::NoDevice`] or
//! [`CommError::PeerFailed`]) instead of leaving them waiting inside NCCL.
//! [`NcclComm::from_unique_id`] is the step without the host communicator, for launchers
//! that distribute the id themselves; [`NcclHost`] then gives them the host-buffer
//! collectives (all-reduce, all-gather, barrier) that agreements need, staged through the
//! device.
//!
//! # Device buffers
//! The safe calls take cudarc device memory — `CudaSlice<T>`, `CudaView<T>`, `CudaViewMut<T>`
//! (anything [`DevicePtr`]/[`DevicePtrMut`]) — of the communicator's device, with `T` any
//! dist-comm [`Element`] (`f32` and `f64` for features and gradients; the integer types
//! too). Memory that cudarc does not own — the rows of a distspmm-cuda `DeviceDense`
//! (`raw().ptr` plus an offset) or a C caller's pointer — goes through the `*_raw` calls
//! with a [`RawDeviceBuffer`].
//!
//! # Streams and ordering
//! Every call is queued on the communicator's stream ([`NcclComm::stream`]) and returns before
//! the transfer has finished. Work queued on the same stream (kernels launched with
//! [`NcclComm::raw_stream`] as distspmm-cuda's `RawStream`, cudarc copies on
//! [`NcclComm::stream`]) is ordered after it; [`NcclComm::synchronize`] waits for all of it and
//! reports NCCL's asynchronous errors. cudarc's event tracking orders other streams that use
//! the same `CudaSlice`s.
//!
//! # The halo exchange
//! [`NcclComm::halo_exchange`] posts one `ncclRecv` per incoming block and one `ncclSend` per
//! outgoing block inside one `ncclGroupStart`/`ncclGroupEnd`, so NCCL schedules all of them
//! at once without deadlock, whatever the order. Each block must be received with exactly the
//! length its peer sends (a distspmm `HaloPlan` fixes both sides); blocks between one pair of
//! ranks match in the order they are posted. A rank may send to itself.
//!
//! # Library loading
//! The CUDA driver is probed through distspmm-cuda's [`probe`] (no
//! crash without `libcuda.so`); NCCL is opened at run time from `$DISTSPMM_NCCL_LIBRARY`
//! ([`NCCL_LIBRARY_ENV`]) or as `libnccl.so.2`/`libnccl.so` on the loader path (the
//! `nvidia-nccl-cu13` wheel's `nvidia/nccl/lib`, or the system's `libnccl2`). Missing pieces
//! are [`CommError::NoDevice`], never a panic.
//!
//! # One GPU, several ranks
//! NCCL refuses two ranks of one communicator on the same GPU of the same host ("Duplicate GPU
//! detected", `ncclInvalidUsage`): use one GPU per rank. For tests on a single GPU only, a
//! distinct `NCCL_HOSTID` per rank makes NCCL treat the ranks as separate hosts and connect
//! them over sockets (`nccl-selftest --spawn` and `distspmm-cuda/gpu-check.sh` do this).

mod ffi;
mod host;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Arc;

use cuda_probe as probe;
use cuda_probe::NoDevice;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, DriverError};
use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclUniqueId};

pub use ffi::NCCL_LIBRARY_ENV;
use ffi::{data_type, decode_version, reduction, NcclLibrary};
pub use host::NcclHost;

use crate::capability::{check_rank, rank_int};
use crate::{AllGather, Broadcast, CommError, Element, ElementKind, ReduceOp, Reducible};

impl From<NoDevice> for CommError {
    fn from(e: NoDevice) -> Self {
        CommError::NoDevice(e.0)
    }
}

fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CommError {
    move |e| CommError::Cuda {
        call,
        message: e.to_string(),
    }
}

/// Which GPU a rank of an [`NcclComm`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSelect {
    /// The rank's local rank (its position among the ranks on the same host, as NCCL
    /// identifies hosts: `NCCL_HOSTID`, else host name and boot id) modulo the number of
    /// devices the driver reports.
    LocalRank,
    /// This device ordinal.
    Ordinal(usize),
}

/// The 128-byte NCCL unique id that names one communicator; created on one rank and handed to
/// all others before they call [`NcclComm::from_unique_id`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId([u8; NcclUniqueId::BYTES]);

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclUniqueId(..)")
    }
}

impl NcclUniqueId {
    /// Size of the id in bytes (`NCCL_UNIQUE_ID_BYTES`).
    pub const BYTES: usize = 128;

    /// Creates a fresh id (`ncclGetUniqueId`); this also starts NCCL's bootstrap listener on
    /// the calling process, which must stay alive until every rank has joined.
    ///
    /// # Errors
    /// [`CommError::NoDevice`] without the NCCL library; [`CommError::Nccl`] when NCCL fails.
    pub fn new() -> Result<Self, CommError> {
        let lib = NcclLibrary::get()?;
        let mut raw = ncclUniqueId {
            internal: [0; Self::BYTES],
        };
        // SAFETY: `raw` is a valid out-pointer of the declared type.
        let code = unsafe { (lib.get_unique_id)(&mut raw) };
        lib.check(code, "ncclGetUniqueId", std::ptr::null_mut())?;
        Ok(Self(raw.internal.map(|c| c as u8)))
    }

    /// An id received from the rank that created it.
    pub fn from_bytes(bytes: [u8; Self::BYTES]) -> Self {
        Self(bytes)
    }

    /// The id's bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; Self::BYTES] {
        &self.0
    }

    fn raw(&self) -> ncclUniqueId {
        ncclUniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

/// A device buffer given by address, for memory cudarc does not own: `len` elements of the
/// call's element type starting at device address `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDeviceBuffer {
    /// Device address of the first element.
    pub ptr: u64,
    /// Length in elements.
    pub len: usize,
}

/// The version of the NCCL library this process would use, as (major, minor, patch).
///
/// # Errors
/// [`CommError::NoDevice`] when the library cannot be loaded.
pub fn nccl_version() -> Result<(i32, i32, i32), CommError> {
    Ok(decode_version(NcclLibrary::get()?.version()?))
}

/// One rank's member of an NCCL communicator, bound to one GPU and one stream.
///
/// `Send` (move it to the thread that drives the GPU) but not `Sync`: NCCL calls on one
/// communicator must not run concurrently. Dropping it waits for its stream and destroys the
/// communicator (`ncclCommDestroy`, an intra-node collective in NCCL: drop it on every rank),
/// or aborts it after a failed call.
pub struct NcclComm {
    lib: &'static NcclLibrary,
    comm: ncclComm_t,
    rank: usize,
    size: usize,
    stream: Arc<CudaStream>,
    /// Set when an NCCL call failed: drop aborts instead of destroying.
    broken: Cell<bool>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent, which `!Sync` (the `Cell`) guarantees; the stream handle is `Send + Sync`, the
// library table is immutable and `'static`.
unsafe impl Send for NcclComm {}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.ordinal())
            .field("library", &self.lib.file)
            .finish_non_exhaustive()
    }
}

/// What every rank contributes to the first agreement: whether it can go on, its host, and
/// its device count.
const READY_WORDS: usize = 3;

impl NcclComm {
    /// Builds the NCCL communicator of the ranks of `host` (collective over `host`; see the
    /// module docs for the steps and how failures are agreed on).
    ///
    /// # Errors
    /// On every rank when any rank fails: [`CommError::NoDevice`] (no driver, device or NCCL
    /// library on this rank, or on a peer — the message names it), [`CommError::Cuda`] or
    /// [`CommError::Nccl`] for failures on this rank, [`CommError::PeerFailed`] for failures
    /// of a peer after the first step; errors of `host` itself.
    pub fn new<C: AllGather + Broadcast>(
        host: &C,
        device: DeviceSelect,
    ) -> Result<Self, CommError> {
        let (rank, size) = (host.rank(), host.size());

        // 1. Can every rank load the driver and NCCL and see a device?
        let local = probe_local(device);
        let count = local.as_ref().map_or(0, |&(_, n)| n);
        let mine = [u64::from(local.is_ok()), host_hash(), count as u64];
        let all = host.all_gather_vec(&mine)?;
        let lib = match local {
            Err(e) => return Err(e),
            Ok((lib, _)) => lib,
        };
        if let Some(r) = first_failed(all.chunks(READY_WORDS).map(|w| w[0] == 1)) {
            return Err(CommError::NoDevice(format!(
                "rank {r} of {size} cannot use CUDA or NCCL (its own error says why)"
            )));
        }
        let ordinal = match device {
            DeviceSelect::Ordinal(o) => o,
            DeviceSelect::LocalRank => local_rank(&all, rank) % count,
        };

        // 2. Every rank opens its device; rank 0 creates the id and broadcasts it.
        let stream = open_stream(ordinal);
        let opened = host.all_gather_vec(&[u8::from(stream.is_ok())])?;
        let stream = stream?;
        if let Some(r) = first_failed(opened.iter().map(|&ok| ok == 1)) {
            return Err(CommError::PeerFailed {
                rank: r,
                reason: "it could not open its CUDA device".into(),
            });
        }
        let mut message = [0u8; 1 + NcclUniqueId::BYTES];
        let mut id_error = None;
        if rank == 0 {
            match NcclUniqueId::new() {
                Ok(id) => {
                    message[0] = 1;
                    message[1..].copy_from_slice(id.as_bytes());
                }
                Err(e) => id_error = Some(e),
            }
        }
        host.broadcast(&mut message, 0)?;
        if let Some(e) = id_error {
            return Err(e);
        }
        if message[0] != 1 {
            return Err(CommError::PeerFailed {
                rank: 0,
                reason: "it could not create the NCCL unique id".into(),
            });
        }
        let mut bytes = [0u8; NcclUniqueId::BYTES];
        bytes.copy_from_slice(&message[1..]);
        let id = NcclUniqueId::from_bytes(bytes);

        // 3. Every rank joins; all keep the communicator only if all joined.
        let joined = init_rank(lib, &id, rank, size, stream);
        let agreed = host.all_gather_vec(&[u8::from(joined.is_ok())])?;
        let comm = joined?;
        if let Some(r) = first_failed(agreed.iter().map(|&ok| ok == 1)) {
            comm.broken.set(true);
            return Err(CommError::PeerFailed {
                rank: r,
                reason: "ncclCommInitRank failed there".into(),
            });
        }
        tracing::debug!(rank, size, ordinal, library = %lib.file, "joined NCCL communicator");
        Ok(comm)
    }

    /// Joins the communicator named by `id` as `rank` of `size` on device `ordinal`, without a
    /// host communicator: every rank must call this with the same id and size and a distinct
    /// rank (`ncclCommInitRank` blocks until all have joined).
    ///
    /// # Errors
    /// [`CommError::InvalidRank`]; [`CommError::NoDevice`] without driver, device or library;
    /// [`CommError::Cuda`] / [`CommError::Nccl`] when opening the device or joining fails.
    pub fn from_unique_id(
        id: &NcclUniqueId,
        rank: usize,
        size: usize,
        ordinal: usize,
    ) -> Result<Self, CommError> {
        check_rank("rank", rank, size)?;
        let (lib, _) = probe_local(DeviceSelect::Ordinal(ordinal))?;
        let stream = open_stream(ordinal)?;
        init_rank(lib, id, rank, size, stream)
    }

    /// This rank, in `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The CUDA device ordinal this rank uses.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The stream every call is queued on; allocate and copy the buffers on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream as a raw `CUstream` handle, e.g. for `distspmm_cuda::RawStream` so that SpMM
    /// kernels run in order with the transfers.
    pub fn raw_stream(&self) -> u64 {
        self.stream.cu_stream() as u64
    }

    /// The NCCL library file in use.
    pub fn library(&self) -> &str {
        &self.lib.file
    }

    /// Copies `root`'s `buf` into every other rank's `buf`, in place (collective; every rank
    /// passes the same length). Queued on [`stream`](Self::stream).
    ///
    /// # Errors
    /// [`CommError::InvalidRank`]; [`CommError::WrongDevice`] for a buffer of another GPU;
    /// [`CommError::Nccl`].
    pub fn broadcast<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        root: usize,
    ) -> Result<(), CommError> {
        check_rank("root", root, self.size)?;
        self.same_device("broadcast buffer", buf.stream())?;
        let len = buf.len();
        let (ptr, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` addresses `len` elements of T on this communicator's device, borrowed
        // mutably for this call; the guard orders later users of the buffer after the stream.
        unsafe { self.enqueue_broadcast(RawDeviceBuffer { ptr, len }, T::KIND, root) }
    }

    /// [`broadcast`](Self::broadcast) on device memory given by address.
    ///
    /// # Safety
    /// `buf` must address `buf.len` elements of `T` in device memory of this communicator's
    /// device, not in use by other streams, and stay alive until the queued transfer has
    /// finished (e.g. [`synchronize`](Self::synchronize)).
    ///
    /// # Errors
    /// As [`broadcast`](Self::broadcast).
    pub unsafe fn broadcast_raw<T: Element>(
        &self,
        buf: RawDeviceBuffer,
        root: usize,
    ) -> Result<(), CommError> {
        check_rank("root", root, self.size)?;
        // SAFETY: forwarded contract.
        unsafe { self.enqueue_broadcast(buf, T::KIND, root) }
    }

    /// Replaces `buf` on every rank by the element-wise reduction of all ranks' `buf`s
    /// (collective; same length everywhere). NCCL chooses the reduction order: float sums may
    /// differ in the last bits from a serial loop, but every rank gets the same result.
    ///
    /// # Errors
    /// [`CommError::WrongDevice`]; [`CommError::Nccl`].
    pub fn all_reduce<T: Reducible, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.same_device("all-reduce buffer", buf.stream())?;
        let len = buf.len();
        let (ptr, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: as in `broadcast`.
        unsafe { self.enqueue_all_reduce(RawDeviceBuffer { ptr, len }, T::KIND, op) }
    }

    /// [`all_reduce`](Self::all_reduce) with [`ReduceOp::Sum`] (gradients, accuracy counts).
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub fn all_reduce_sum<T: Reducible, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
    ) -> Result<(), CommError> {
        self.all_reduce(buf, ReduceOp::Sum)
    }

    /// [`all_reduce`](Self::all_reduce) on device memory given by address.
    ///
    /// # Safety
    /// As [`broadcast_raw`](Self::broadcast_raw).
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub unsafe fn all_reduce_raw<T: Reducible>(
        &self,
        buf: RawDeviceBuffer,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        // SAFETY: forwarded contract.
        unsafe { self.enqueue_all_reduce(buf, T::KIND, op) }
    }

    /// The halo exchange: sends every `(peer, block)` of `sends` to `peer` and receives every
    /// `(peer, block)` of `recvs` from `peer`, all inside one NCCL group (see the module docs).
    /// Not collective, but every send needs the matching receive, of the same length, on its
    /// peer, posted in the same order among the blocks of that pair.
    ///
    /// # Errors
    /// [`CommError::InvalidRank`] for a peer outside the group; [`CommError::WrongDevice`];
    /// [`CommError::Nccl`].
    pub fn halo_exchange<T, S, R>(
        &self,
        sends: &[(usize, &S)],
        recvs: &mut [(usize, &mut R)],
    ) -> Result<(), CommError>
    where
        T: Element,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        check_peers(
            sends.iter().map(|s| s.0),
            recvs.iter().map(|r| r.0),
            self.size,
        )?;
        for (_, buf) in sends {
            self.same_device("halo send block", buf.stream())?;
        }
        for (_, buf) in recvs.iter() {
            self.same_device("halo receive block", buf.stream())?;
        }
        let mut guards = Vec::with_capacity(sends.len() + recvs.len());
        let mut raw_sends = Vec::with_capacity(sends.len());
        for &(peer, buf) in sends {
            let len = buf.len();
            let (ptr, guard) = buf.device_ptr(&self.stream);
            raw_sends.push((peer, RawDeviceBuffer { ptr, len }));
            guards.push(guard);
        }
        let mut raw_recvs = Vec::with_capacity(recvs.len());
        for (peer, buf) in recvs.iter_mut() {
            let len = buf.len();
            let (ptr, guard) = buf.device_ptr_mut(&self.stream);
            raw_recvs.push((*peer, RawDeviceBuffer { ptr, len }));
            guards.push(guard);
        }
        // SAFETY: every block addresses its `len` elements of T on this device; the receive
        // blocks are distinct `&mut` borrows (no overlap with each other or with the sends);
        // the guards, dropped after the group is queued, order later users after the stream.
        let queued = unsafe { self.enqueue_exchange(T::KIND, &raw_sends, &raw_recvs) };
        drop(guards);
        queued
    }

    /// [`halo_exchange`](Self::halo_exchange) on device memory given by address — e.g. the
    /// halo rows of one contiguous `DeviceDense`, one block per source rank.
    ///
    /// # Safety
    /// Every block must address its `len` elements of `T` in device memory of this
    /// communicator's device; receive blocks must not overlap each other or any send block;
    /// none may be in use by other streams; all must stay alive until the queued transfers
    /// have finished (e.g. [`synchronize`](Self::synchronize)).
    ///
    /// # Errors
    /// As [`halo_exchange`](Self::halo_exchange).
    pub unsafe fn halo_exchange_raw<T: Element>(
        &self,
        sends: &[(usize, RawDeviceBuffer)],
        recvs: &[(usize, RawDeviceBuffer)],
    ) -> Result<(), CommError> {
        check_peers(
            sends.iter().map(|s| s.0),
            recvs.iter().map(|r| r.0),
            self.size,
        )?;
        // SAFETY: forwarded contract.
        unsafe { self.enqueue_exchange(T::KIND, sends, recvs) }
    }

    /// Waits until everything queued on the stream has finished, then reports an asynchronous
    /// NCCL error of the communicator, if any.
    ///
    /// # Errors
    /// [`CommError::Cuda`] when the stream failed; [`CommError::Nccl`] for NCCL's error.
    pub fn synchronize(&self) -> Result<(), CommError> {
        self.bind()?;
        let waited = self
            .stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"));
        let mut code: c_int = 0;
        // SAFETY: `self.comm` is live; `code` is a valid out-pointer.
        let rc = unsafe { (self.lib.comm_get_async_error)(self.comm, &mut code) };
        self.checked(rc, "ncclCommGetAsyncError")?;
        self.checked(code, "an asynchronous NCCL operation")?;
        waited
    }

    /// Aborts the communicator at once (`ncclCommAbort`), without waiting for queued work: the
    /// way out after a peer failed. Dropping does the same after a failed call.
    pub fn abort(self) {
        self.broken.set(true);
    }

    fn same_device(&self, what: &'static str, stream: &Arc<CudaStream>) -> Result<(), CommError> {
        let (expected, actual) = (self.ordinal(), stream.context().ordinal());
        if expected == actual {
            Ok(())
        } else {
            Err(CommError::WrongDevice {
                what,
                expected,
                actual,
            })
        }
    }

    /// Makes this communicator's context current on the calling thread (NCCL uses the
    /// current device).
    fn bind(&self) -> Result<(), CommError> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))
    }

    fn cu_stream(&self) -> cudaStream_t {
        self.stream.cu_stream() as cudaStream_t
    }

    /// Checks an NCCL return code; a failure marks the communicator for abort.
    fn checked(&self, code: c_int, call: &'static str) -> Result<(), CommError> {
        let result = self.lib.check(code, call, self.comm);
        if result.is_err() {
            self.broken.set(true);
        }
        result
    }

    /// # Safety
    /// As [`broadcast_raw`](Self::broadcast_raw); `root` checked.
    unsafe fn enqueue_broadcast(
        &self,
        buf: RawDeviceBuffer,
        kind: ElementKind,
        root: usize,
    ) -> Result<(), CommError> {
        self.bind()?;
        let ptr = buf.ptr as *mut std::ffi::c_void;
        // SAFETY: the caller guarantees the buffer; `root < size`, which fits a C int (checked
        // when the communicator was created); the communicator and stream are live.
        let code = unsafe {
            (self.lib.broadcast)(
                ptr,
                ptr,
                buf.len,
                data_type(kind),
                rank_int(root),
                self.comm,
                self.cu_stream(),
            )
        };
        self.checked(code, "ncclBroadcast")
    }

    /// # Safety
    /// As [`broadcast_raw`](Self::broadcast_raw).
    unsafe fn enqueue_all_reduce(
        &self,
        buf: RawDeviceBuffer,
        kind: ElementKind,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.bind()?;
        let ptr = buf.ptr as *mut std::ffi::c_void;
        // SAFETY: the caller guarantees the buffer (in-place reduction is allowed by NCCL);
        // the communicator and stream are live.
        let code = unsafe {
            (self.lib.all_reduce)(
                ptr,
                ptr,
                buf.len,
                data_type(kind),
                reduction(op),
                self.comm,
                self.cu_stream(),
            )
        };
        self.checked(code, "ncclAllReduce")
    }

    /// Posts the receives, then the sends, inside one group; the group is always closed.
    ///
    /// # Safety
    /// As [`halo_exchange_raw`](Self::halo_exchange_raw); peers checked.
    unsafe fn enqueue_exchange(
        &self,
        kind: ElementKind,
        sends: &[(usize, RawDeviceBuffer)],
        recvs: &[(usize, RawDeviceBuffer)],
    ) -> Result<(), CommError> {
        self.bind()?;
        let dtype = data_type(kind);
        // SAFETY: group calls take no arguments; every start is matched by the end below.
        let code = unsafe { (self.lib.group_start)() };
        self.checked(code, "ncclGroupStart")?;
        let mut posted = Ok(());
        for &(peer, buf) in recvs {
            // SAFETY: the caller guarantees the block; `peer < size` fits a C int.
            let code = unsafe {
                (self.lib.recv)(
                    buf.ptr as *mut std::ffi::c_void,
                    buf.len,
                    dtype,
                    rank_int(peer),
                    self.comm,
                    self.cu_stream(),
                )
            };
            posted = self.checked(code, "ncclRecv");
            if posted.is_err() {
                break;
            }
        }
        if posted.is_ok() {
            for &(peer, buf) in sends {
                // SAFETY: as above.
                let code = unsafe {
                    (self.lib.send)(
                        buf.ptr as *const std::ffi::c_void,
                        buf.len,
                        dtype,
                        rank_int(peer),
                        self.comm,
                        self.cu_stream(),
                    )
                };
                posted = self.checked(code, "ncclSend");
                if posted.is_err() {
                    break;
                }
            }
        }
        // SAFETY: closes the group opened above.
        let code = unsafe { (self.lib.group_end)() };
        let closed = self.checked(code, "ncclGroupEnd");
        posted.and(closed)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let bound = self.bind().is_ok();
        let clean = bound && !self.broken.get() && self.stream.synchronize().is_ok();
        let (free, call) = if clean {
            (self.lib.comm_destroy, "ncclCommDestroy")
        } else {
            (self.lib.comm_abort, "ncclCommAbort")
        };
        // SAFETY: `self.comm` is a live communicator, freed exactly once, here.
        let code = unsafe { free(self.comm) };
        if let Err(e) = self.lib.check(code, call, std::ptr::null_mut()) {
            tracing::warn!(rank = self.rank, error = %e, "releasing the NCCL communicator failed");
        }
    }
}

/// Loads the driver (probed, panics caught), checks the device, loads NCCL.
fn probe_local(device: DeviceSelect) -> Result<(&'static NcclLibrary, usize), CommError> {
    let count = probe::device_count()?;
    if count == 0 {
        return Err(CommError::NoDevice(
            "the CUDA driver reports no device".into(),
        ));
    }
    if let DeviceSelect::Ordinal(o) = device {
        if o >= count {
            return Err(CommError::NoDevice(format!(
                "device {o} requested but the CUDA driver reports {count} device(s)"
            )));
        }
    }
    Ok((NcclLibrary::get()?, count))
}

/// Retains the device's primary context (shared with distspmm-cuda and the CUDA runtime, so
/// device pointers of either are valid here) and creates the communicator's stream.
fn open_stream(ordinal: usize) -> Result<Arc<CudaStream>, CommError> {
    probe::guarded("opening the CUDA device", || {
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        ctx.new_stream().map_err(driver("cuStreamCreate"))
    })
}

/// `ncclCommInitRank` on the stream's device.
fn init_rank(
    lib: &'static NcclLibrary,
    id: &NcclUniqueId,
    rank: usize,
    size: usize,
    stream: Arc<CudaStream>,
) -> Result<NcclComm, CommError> {
    let overflow = |what, value| CommError::CountOverflow { what, value };
    let nranks = c_int::try_from(size).map_err(|_| overflow("NCCL ranks", size))?;
    let me = c_int::try_from(rank).map_err(|_| overflow("NCCL rank", rank))?;
    stream
        .context()
        .bind_to_thread()
        .map_err(driver("cuCtxSetCurrent"))?;
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out-pointer; the id is passed by value as declared; NCCL binds
    // the communicator to the current context's device, made current above.
    let code = unsafe { (lib.comm_init_rank)(&mut comm, nranks, id.raw(), me) };
    lib.check(code, "ncclCommInitRank", std::ptr::null_mut())
        .map_err(duplicate_gpu_hint)?;
    Ok(NcclComm {
        lib,
        comm,
        rank,
        size,
        stream,
        broken: Cell::new(false),
    })
}

/// Adds the way out to NCCL's "Duplicate GPU detected" refusal.
fn duplicate_gpu_hint(e: CommError) -> CommError {
    match e {
        CommError::Nccl {
            call,
            code,
            message,
        } if message.contains("Duplicate GPU") => CommError::Nccl {
            call,
            code,
            message: format!(
                "{message}; NCCL allows one rank per GPU and host: run as many ranks per host \
                 as it has GPUs (or, for tests on one GPU only, give each rank its own NCCL_HOSTID)"
            ),
        },
        other => other,
    }
}

/// The first rank whose flag is false.
fn first_failed(flags: impl Iterator<Item = bool>) -> Option<usize> {
    flags.enumerate().find(|&(_, ok)| !ok).map(|(r, _)| r)
}

/// This rank's position among the ranks of its host, from the gathered readiness words
/// (`READY_WORDS` per rank, the host hash second).
fn local_rank(all: &[u64], rank: usize) -> usize {
    let host = |r: usize| all[r * READY_WORDS + 1];
    (0..rank).filter(|&r| host(r) == host(rank)).count()
}

/// Identifies the host as NCCL does: `NCCL_HOSTID` if set, else host name and boot id.
fn host_hash() -> u64 {
    let id = std::env::var("NCCL_HOSTID").unwrap_or_else(|_| {
        let read = |p| std::fs::read_to_string(p).unwrap_or_default();
        let name = read("/proc/sys/kernel/hostname");
        let name = if name.trim().is_empty() {
            std::env::var("HOSTNAME").unwrap_or_default()
        } else {
            name
        };
        format!(
            "{}{}",
            name.trim(),
            read("/proc/sys/kernel/random/boot_id").trim()
        )
    });
    fnv1a(id.as_bytes())
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Checks the peers of a halo exchange.
fn check_peers(
    destinations: impl Iterator<Item = usize>,
    sources: impl Iterator<Item = usize>,
    size: usize,
) -> Result<(), CommError> {
    for peer in destinations {
        check_rank("destination", peer, size)?;
    }
    for peer in sources {
        check_rank("source", peer, size)?;
    }
    Ok(())
}
