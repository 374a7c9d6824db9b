//! `dsp_spmm_device`: the distributed SpMM on device memory (distspmm-op's `GpuDistSpmm` over an
//! NCCL communicator built from the `dsp_comm`). The functions exist in every build, so the
//! header is the same; without the `cuda` feature they return `DSP_STATUS_UNSUPPORTED`.

use std::ffi::c_void;

use crate::boundary::{ffi_boundary, ffi_boundary_void, Error, Handle, OutPtr, Status};
use crate::chunk::Chunk;
use crate::comm::Comm;

/// The distributed SpMM operator of one rank on one GPU: `Y = Ahat X` and `dX = Ahat^T dY` on
/// this rank's rows held in device memory, with the rows of other ranks moved by NCCL.
///
/// It owns an NCCL communicator over the ranks of its `dsp_comm` and keeps the communicator
/// and chunk alive (they may be freed before it). Thread-safety as for `dsp_spmm`: only the
/// thread that created its `dsp_comm` may use it; calls are collective.
#[derive(Debug)]
pub struct SpmmDevice {
    #[cfg(feature = "cuda")]
    inner: imp::Inner,
    #[cfg(not(feature = "cuda"))]
    _never: std::convert::Infallible,
}

impl Handle for SpmmDevice {
    const C_NAME: &'static str = "dsp_spmm_device";
}

/// The error of every device call in a build without CUDA.
#[cfg(not(feature = "cuda"))]
fn unsupported() -> Error {
    Error::new(
        Status::Unsupported,
        "this libdistspmm was built without CUDA support: rebuild the C library with \
         `cargo build -p distspmm-capi --features cuda` to pass device pointers",
    )
}

/// Which product a call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Forward,
    Backward,
}

/// Creates this rank's distributed SpMM on device `device_ordinal` (or, for -1, the rank's
/// local rank modulo the number of devices of its host) for `chunk` (opened with the same
/// communicator) and `schedule` (a `dsp_schedule` value), its messages in `float`: as
/// `dsp_spmm_create_device_with_precision` with `DSP_COMM_PRECISION_F32`. Collective over
/// `comm`: the ranks agree on their arguments, then build an NCCL communicator over the same
/// ranks (every rank fails if one has no usable GPU, driver or NCCL library), upload their
/// chunk to the device and agree on the partition and schedule as `dsp_spmm_create` does.
/// Without a CUDA device every rank gets `DSP_STATUS_UNSUPPORTED` (the message names the rank
/// and the reason); in a library built without CUDA, `DSP_STATUS_UNSUPPORTED` at once. On
/// failure `*out` is NULL. Creating thread of `comm` only.
///
/// # Safety
/// `comm` and `chunk` are NULL or live handles; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_create_device(
    comm: *mut Comm,
    chunk: *const Chunk,
    schedule: i32,
    device_ordinal: i32,
    out: *mut *mut SpmmDevice,
) -> Status {
    // SAFETY: forwarded caller contract.
    unsafe {
        create_device(
            "dsp_spmm_create_device",
            comm,
            chunk,
            schedule,
            crate::spmm::CommPrecision::F32 as i32,
            device_ordinal,
            out,
        )
    }
}

/// `dsp_spmm_create_device` with its messages in `precision` (a `dsp_comm_precision` value),
/// converted on the device before they are sent and after they arrive, as
/// `dsp_spmm_create_with_precision` describes (the same bound, half the bytes for the 16-bit
/// formats). A bad code is `DSP_STATUS_INVALID_ARGUMENT` on its rank and
/// `DSP_STATUS_PEER_FAILED` on the others; different precisions are
/// `DSP_STATUS_ARGUMENT_MISMATCH` on every rank. Collective; creating thread of `comm` only.
///
/// # Safety
/// As `dsp_spmm_create_device`.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_create_device_with_precision(
    comm: *mut Comm,
    chunk: *const Chunk,
    schedule: i32,
    precision: i32,
    device_ordinal: i32,
    out: *mut *mut SpmmDevice,
) -> Status {
    // SAFETY: forwarded caller contract.
    unsafe {
        create_device(
            "dsp_spmm_create_device_with_precision",
            comm,
            chunk,
            schedule,
            precision,
            device_ordinal,
            out,
        )
    }
}

/// The body of both device constructors.
///
/// # Safety
/// As `dsp_spmm_create_device`.
unsafe fn create_device(
    name: &'static str,
    comm: *mut Comm,
    chunk: *const Chunk,
    schedule: i32,
    precision: i32,
    device_ordinal: i32,
    out: *mut *mut SpmmDevice,
) -> Status {
    ffi_boundary(name, || {
        // SAFETY: the caller guarantees NULL or valid for a write.
        let out = unsafe { OutPtr::new(out, "out") };
        if let Ok(out) = &out {
            out.write(std::ptr::null_mut());
        }
        #[cfg(feature = "cuda")]
        {
            // SAFETY: forwarded caller contract.
            let op = unsafe { imp::create(comm, chunk, schedule, precision, device_ordinal) }?;
            out?.write(op.into_raw());
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (comm, chunk, schedule, precision, device_ordinal, out);
            Err(unsupported())
        }
    })
}

/// Frees a device operator, its device memory and its NCCL communicator (destroying an NCCL
/// communicator is collective within a node: free the operators of all ranks together). NULL is
/// accepted. Creating thread of its communicator only; from another thread it frees nothing
/// and `dsp_last_error()` says so.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm_device *`; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_device_free(op: *mut SpmmDevice) {
    ffi_boundary_void("dsp_spmm_device_free", || {
        // SAFETY: the caller guarantees NULL or a live handle it gives up.
        let Some(op) = (unsafe { SpmmDevice::from_raw(op) }) else {
            return Ok(());
        };
        #[cfg(feature = "cuda")]
        {
            imp::free(op)
        }
        #[cfg(not(feature = "cuda"))]
        {
            match op._never {}
        }
    })
}

/// The body of the forward and backward calls.
///
/// # Safety
/// The exported callers' contract.
#[allow(clippy::too_many_arguments)]
unsafe fn call(
    op: *mut SpmmDevice,
    direction: Direction,
    rows: usize,
    cols: usize,
    input: *const f32,
    ld_in: usize,
    output: *mut f32,
    ld_out: usize,
    stream: *mut c_void,
) -> Result<(), Error> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: the exported callers' contract: NULL or a live handle, used by one thread.
        let op = unsafe { SpmmDevice::borrow_mut(op, "op") }?;
        let args = imp::Args {
            direction,
            rows,
            cols,
            input: input as u64,
            ld_in,
            output: output as u64,
            ld_out,
            stream: stream as u64,
        };
        // SAFETY: forwarded caller contract.
        unsafe { op.inner.call(args) }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (
            op, direction, rows, cols, input, ld_in, output, ld_out, stream,
        );
        Err(unsupported())
    }
}

/// Forward product on this rank's rows in device memory: `Y_p = (Ahat X)_p`. `x` is a device
/// pointer to this rank's `rows x cols` block of X (row-major, leading dimension `ldx >= cols`,
/// at least `(rows-1)*ldx + cols` floats, 4-byte aligned); `y` receives `rows x cols` (leading
/// dimension `ldy`, padding untouched), overwritten; both on the operator's device, not
/// overlapping. `stream` is a `cudaStream_t` / `CUstream` of that device as `void *` (NULL: the
/// legacy default stream): the product is ordered after the work queued on it before the call,
/// and work queued on it afterwards sees the result. The call returns once the work is queued
/// (after a host-side agreement among the ranks): synchronise the stream before reading `y` on
/// the host. `rows` must be `dsp_chunk_num_local_nodes`; `cols` must be equal on every rank.
/// Collective; creating thread only. `DSP_STATUS_UNSUPPORTED` in a build without CUDA.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm_device *`; `x` and `y` are NULL or device memory of the
/// extents above that stays allocated, and is not written by other work, until the queued
/// product has finished; `stream` is NULL or a live stream of the operator's device.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_device_forward(
    op: *mut SpmmDevice,
    rows: usize,
    cols: usize,
    x: *const f32,
    ldx: usize,
    y: *mut f32,
    ldy: usize,
    stream: *mut c_void,
) -> Status {
    ffi_boundary("dsp_spmm_device_forward", || {
        // SAFETY: forwarded caller contract.
        unsafe { call(op, Direction::Forward, rows, cols, x, ldx, y, ldy, stream) }
    })
}

/// Backward product on this rank's rows in device memory: `dX_p = (Ahat^T dY)_p`, with the
/// conventions of `dsp_spmm_device_forward` (`dy` in, `dx` out, overwritten, on `stream`).
/// Collective; creating thread only. `DSP_STATUS_UNSUPPORTED` in a build without CUDA.
///
/// # Safety
/// As `dsp_spmm_device_forward`, with `dy` and `dx`.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_device_backward(
    op: *mut SpmmDevice,
    rows: usize,
    cols: usize,
    dy: *const f32,
    lddy: usize,
    dx: *mut f32,
    lddx: usize,
    stream: *mut c_void,
) -> Status {
    ffi_boundary("dsp_spmm_device_backward", || {
        // SAFETY: forwarded caller contract.
        unsafe {
            call(
                op,
                Direction::Backward,
                rows,
                cols,
                dy,
                lddy,
                dx,
                lddx,
                stream,
            )
        }
    })
}

/// Payload bytes this rank handed to NCCL in its last forward or backward call (what the
/// schedule predicts, as `dsp_spmm_bytes_last_call`). Any thread that does not call the
/// operator at the same time. `DSP_STATUS_UNSUPPORTED` in a build without CUDA.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm_device *`; `sent` and `received` are NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_device_bytes_last_call(
    op: *const SpmmDevice,
    sent: *mut u64,
    received: *mut u64,
) -> Status {
    ffi_boundary("dsp_spmm_device_bytes_last_call", || {
        #[cfg(feature = "cuda")]
        {
            // SAFETY: the caller guarantees NULL or a live handle.
            let op = unsafe { SpmmDevice::borrow(op, "op") }?;
            // SAFETY: the caller guarantees NULL or valid for a write.
            let sent = unsafe { OutPtr::new(sent, "sent") }?;
            // SAFETY: the caller guarantees NULL or valid for a write.
            let received = unsafe { OutPtr::new(received, "received") }?;
            let traffic = op.inner.op.bytes_last_call();
            sent.write(traffic.sent);
            received.write(traffic.received);
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (op, sent, received);
            Err(unsupported())
        }
    })
}

/// 1 if this library was built with CUDA support (the `dsp_spmm_device` functions work only
/// then, and still need a device at run time), else 0. Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn dsp_built_with_cuda() -> i32 {
    i32::from(cfg!(feature = "cuda"))
}

#[cfg(feature = "cuda")]
mod imp {
    //! The CUDA build: the handle's contents and the calls.

    use std::rc::Rc;
    use std::sync::Arc;
    use std::thread::ThreadId;

    use dist_comm::{CommError, DeviceSelect, NcclComm};
    use distspmm_cuda::{RawDense, RawStream};
    use distspmm_op::{DistSpmmError, GpuDistSpmm, Operand, RankChunk};

    use super::{Direction, SpmmDevice};
    use crate::boundary::{Error, Handle, Status};
    use crate::chunk::Chunk;
    use crate::comm::{agree, check_owner, check_usable, Comm, SharedComm};
    use crate::spmm::{agree_on_options, precision_arg, schedule_arg};

    /// What a `dsp_spmm_device` holds: the operator, which owns references to the host
    /// communicator, the NCCL communicator and the mapped chunk.
    pub(super) struct Inner {
        pub(super) op: GpuDistSpmm<SharedComm, Rc<NcclComm>, Arc<RankChunk>>,
        owner: ThreadId,
    }

    impl std::fmt::Debug for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SpmmDevice")
                .field("rank", &self.op.rank())
                .field("parts", &self.op.parts())
                .field("schedule", &self.op.schedule())
                .field("nccl", self.op.nccl())
                .finish_non_exhaustive()
        }
    }

    /// A CUDA, NCCL or operator failure as a status: no device is `Unsupported`, a failed
    /// CUDA or NCCL call `Device`, an operand on another device `InvalidArgument`; agreement
    /// outcomes as for `dsp_spmm`.
    fn device_error(e: CommError) -> Error {
        let status = match &e {
            CommError::NoDevice(_) => Status::Unsupported,
            CommError::Nccl { .. } | CommError::Cuda { .. } => Status::Device,
            CommError::WrongDevice { .. } => Status::InvalidArgument,
            _ => return Error::from(e),
        };
        Error::new(status, e.to_string())
    }

    fn op_error(e: DistSpmmError) -> Error {
        match e {
            DistSpmmError::Comm(c) => device_error(c),
            DistSpmmError::Allocation { .. } => Error::new(Status::OutOfMemory, e.to_string()),
            other => Error::from(other),
        }
    }

    /// Checks the arguments, agrees on them, then builds the NCCL communicator and the
    /// operator (collective).
    ///
    /// # Safety
    /// As `dsp_spmm_create_device`.
    pub(super) unsafe fn create(
        comm: *mut Comm,
        chunk: *const Chunk,
        schedule: i32,
        precision: i32,
        device_ordinal: i32,
    ) -> Result<SpmmDevice, Error> {
        // SAFETY: the caller guarantees a live handle or NULL.
        let comm = unsafe { Comm::borrow(comm, "comm") }?;
        comm.check_usable()?;
        let local = (|| {
            // SAFETY: the caller guarantees a live handle or NULL.
            let chunk = unsafe { Chunk::borrow(chunk, "chunk") }?;
            let kind = schedule_arg(schedule)?;
            let format = precision_arg(precision)?;
            let select = match device_ordinal {
                -1 => DeviceSelect::LocalRank,
                o if o >= 0 => DeviceSelect::Ordinal(o as usize),
                o => {
                    return Err(Error::invalid(format!(
                        "device_ordinal {o} is neither a device number nor -1 (local rank)"
                    )))
                }
            };
            Ok((chunk, kind, format, select))
        })();
        agree_on_options(comm, local.as_ref().map(|_| ()), schedule, precision)?;
        let (chunk, kind, format, select) = local?;
        let (shared, owner) = comm.share();
        let nccl = Rc::new(NcclComm::new(&*shared, select).map_err(device_error)?);
        let op =
            GpuDistSpmm::with_precision(shared, nccl, Arc::clone(chunk.mapped()), kind, format)
                .map_err(op_error)?;
        Ok(SpmmDevice {
            inner: Inner { op, owner },
        })
    }

    /// Frees on the owning thread; elsewhere keeps the handle alive and reports it.
    pub(super) fn free(op: Box<SpmmDevice>) -> Result<(), Error> {
        if let Err(e) = check_owner(op.inner.owner, SpmmDevice::C_NAME) {
            // Dropping would release the communicator's `Rc` off its thread: keep it alive.
            let _ = Box::into_raw(op);
            return Err(e);
        }
        drop(op);
        Ok(())
    }

    /// The arguments of one forward or backward call (device addresses as integers).
    pub(super) struct Args {
        pub(super) direction: Direction,
        pub(super) rows: usize,
        pub(super) cols: usize,
        pub(super) input: u64,
        pub(super) ld_in: usize,
        pub(super) output: u64,
        pub(super) ld_out: usize,
        pub(super) stream: u64,
    }

    /// Checks one operand (distspmm-op's operand rules: leading dimension, extent, NULL,
    /// alignment; the operator checks the overlap of the two).
    pub(super) fn operand(
        name: &'static str,
        ptr: u64,
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<RawDense, Error> {
        Operand {
            name,
            addr: ptr,
            rows,
            cols,
            ld,
        }
        .check()?;
        Ok(RawDense {
            rows,
            cols,
            ld,
            ptr,
        })
    }

    impl Inner {
        /// Checks locally, agrees with every rank, then queues the product.
        ///
        /// # Safety
        /// As `dsp_spmm_device_forward`.
        pub(super) unsafe fn call(&mut self, a: Args) -> Result<(), Error> {
            check_usable(self.owner, SpmmDevice::C_NAME)?;
            let (name_in, name_out) = match a.direction {
                Direction::Forward => ("x", "y"),
                Direction::Backward => ("dy", "dx"),
            };
            let n = self.op.local_rows();
            let local = (|| {
                if a.rows != n {
                    return Err(Error::invalid(format!(
                        "rows = {}, but this rank (part {}) owns {n} rows",
                        a.rows,
                        self.op.rank()
                    )));
                }
                let input = operand(name_in, a.input, a.rows, a.cols, a.ld_in)?;
                let output = operand(name_out, a.output, a.rows, a.cols, a.ld_out)?;
                Ok((input, output))
            })();
            let key = local.as_ref().map(|_| a.cols as u64).map_err(Error::clone);
            agree(self.op.host(), key, |c| format!("cols = {c}"))?;
            let (input, output) = local?;
            let stream = Some(RawStream(a.stream));
            // SAFETY: the caller guarantees device memory of the checked extents on the
            // operator's device and a live stream of it (NULL: the legacy default stream).
            let done = unsafe {
                match a.direction {
                    Direction::Forward => self.op.forward_raw(input, output, stream),
                    Direction::Backward => self.op.backward_raw(input, output, stream),
                }
            };
            done.map_err(op_error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_whether_it_was_built_with_cuda() {
        assert_eq!(dsp_built_with_cuda(), i32::from(cfg!(feature = "cuda")));
    }

    /// Without CUDA every entry point answers UNSUPPORTED with the way out; with CUDA, NULL
    /// handles are NULL_ARGUMENT. Either way `*out` is NULL afterwards.
    #[test]
    fn calls_without_a_usable_handle_fail_cleanly() {
        let expected = if cfg!(feature = "cuda") {
            Status::NullArgument
        } else {
            Status::Unsupported
        };
        let mut out = std::ptr::NonNull::<SpmmDevice>::dangling().as_ptr();
        // SAFETY: NULL handles; `out` is valid for a write.
        let status = unsafe {
            dsp_spmm_create_device(std::ptr::null_mut(), std::ptr::null(), 0, 0, &mut out)
        };
        assert_eq!(status, expected);
        assert!(out.is_null());
        if !cfg!(feature = "cuda") {
            assert!(crate::boundary::last_error().contains("--features cuda"));
        }
        let mut out = std::ptr::NonNull::<SpmmDevice>::dangling().as_ptr();
        // SAFETY: as above; precision code 1 is bf16.
        let status = unsafe {
            dsp_spmm_create_device_with_precision(
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                1,
                0,
                &mut out,
            )
        };
        assert_eq!(status, expected);
        assert!(out.is_null());
        assert!(crate::boundary::last_error().contains("dsp_spmm_create_device_with_precision"));
        let (x, mut y) = ([0f32; 4], [0f32; 4]);
        for direction in [Direction::Forward, Direction::Backward] {
            // SAFETY: a NULL handle; the pointers are never dereferenced.
            let status = ffi_boundary("test", || unsafe {
                call(
                    std::ptr::null_mut(),
                    direction,
                    2,
                    2,
                    x.as_ptr(),
                    2,
                    y.as_mut_ptr(),
                    2,
                    std::ptr::null_mut(),
                )
            });
            assert_eq!(status, expected);
        }
        let (mut sent, mut received) = (0u64, 0u64);
        // SAFETY: a NULL handle; the counters are valid for writes.
        let status =
            unsafe { dsp_spmm_device_bytes_last_call(std::ptr::null(), &mut sent, &mut received) };
        assert_eq!(status, expected);
        // SAFETY: NULL is accepted.
        unsafe { dsp_spmm_device_free(std::ptr::null_mut()) };
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn device_operands_are_checked_before_any_device_work() {
        use super::imp::operand;
        let ok = operand("x", 0x1000, 3, 4, 6).unwrap();
        assert_eq!((ok.rows, ok.cols, ok.ld, ok.ptr), (3, 4, 6, 0x1000));
        assert_eq!(
            operand("x", 0x1000, 3, 4, 3).unwrap_err().status,
            Status::InvalidArgument
        );
        assert_eq!(
            operand("x", 0x1002, 3, 4, 4).unwrap_err().status,
            Status::InvalidArgument
        );
        assert_eq!(
            operand("x", 0, 3, 4, 4).unwrap_err().status,
            Status::NullArgument
        );
        assert!(operand("x", 0, 0, 4, 4).is_ok(), "no rows: NULL is fine");
        assert_eq!(
            operand("x", 0x1000, usize::MAX, 4, usize::MAX)
                .unwrap_err()
                .status,
            Status::InvalidArgument
        );
    }
}
