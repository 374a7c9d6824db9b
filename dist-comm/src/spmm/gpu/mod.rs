//! [`GpuDistSpmm`] (feature `cuda`): the distributed product `Y = Â·X` / `dX = Âᵀ·dY` of
//! [`DistSpmm`](super::DistSpmm) on device buffers, with distspmm-cuda's kernels and an
//! [`NcclComm`] moving the rows.
//!
//! # Setup
//! [`GpuDistSpmm::new`] is collective over a host communicator `H` (an `MpiComm`, a
//! [`LocalComm`](crate::LocalComm), or [`NcclHost`](crate::NcclHost) when there is only the
//! NCCL communicator) whose ranks are the NCCL communicator's. It uploads the rank's chunk —
//! the local block `Â[p][p]` and the off-diagonal blocks, each as CSR (forward) and CSC
//! (backward) — plus the halo send lists and the backward's scatter plan, then runs the CPU
//! operator's agreement (P, part, fingerprint, version, N, schedule) over `H`, so a bad chunk
//! on one rank is an error on every rank. Every call agrees on the operation and F over `H`
//! first, exactly as [`DistSpmm`](super::DistSpmm) does.
//!
//! # Execution
//! Three streams take part: the caller's stream `S` (the operator's device stream for the safe
//! calls, any stream of the device for the raw ones), the NCCL communicator's stream `M`, and
//! the device's own stream `D`. `M` and `D` first wait for the work queued on `S`; `S` waits
//! for `M` at the end. Nothing blocks the host after the agreement.
//! - **halo forward**: `M` packs the rows each peer needs into one contiguous send buffer
//!   (gather kernel over the concatenated send lists) and runs one grouped `ncclSend`/`ncclRecv`
//!   ([`NcclComm::halo_exchange_raw`]) into one receive buffer holding the halo blocks in
//!   increasing source part; meanwhile `D` multiplies the local block (`Y = Â[p][p]·X_p`).
//!   `M` then waits for `D` and adds the remote blocks in increasing source part (their
//!   compacted columns are the rows of the received blocks).
//! - **halo backward**: `M` computes `Â[p][q]ᵀ·dY_p` for every remote block into the receive
//!   buffer and sends each partial sum to its owner, receiving the partial sums of the rows
//!   this rank sent into the send buffer; meanwhile `D` computes `Â[p][p]ᵀ·dY_p`. `M` then
//!   adds the received sums into their rows with the scatter-add kernel: one warp per row,
//!   contributions in increasing source rank, no atomics.
//! - **broadcast**: on `M` alone, step by step as on the CPU: forward broadcasts `X_q` from
//!   every root q in turn ([`NcclComm::broadcast_raw`]) and adds `Â[p][q]·X_q`; backward sends
//!   `Â[p][q]ᵀ·dY_p` to each root q in turn (a grouped send/receive, as `NcclComm` offers no
//!   reduce), which adds the P−1 contributions in increasing rank (block-sum kernel).
//!
//! Every addition happens in a fixed order whatever the order of arrival, so results are
//! bit-identical run to run. They agree with the CPU operator to rounding (the kernels sum a
//! row's non-zeros in another order than the CPU kernels).
//!
//! # Buffers and bytes
//! The exchange buffers and row-splitting workspaces grow at the first call with a given F
//! (after waiting for the operator's streams) and are reused; later calls allocate nothing.
//! Dropping the operator does not wait on the host: its device memory is released in stream
//! order after the last call's work.
//! [`GpuDistSpmm::bytes_last_call`] counts the payload handed to NCCL with the conventions of
//! the CPU operator, so it equals `HaloPlan::traffic` / `BroadcastPlan::traffic`.

mod layout;

use chunk_format::ChunkView;
use distspmm_core::schedule::{BroadcastPlan, LayerTraffic, ScheduleKind, Traffic, Workspace};
use distspmm_cuda::{
    CudaError, DeviceCsc, DeviceCsr, DeviceDense, DeviceRowSplit, DeviceRows, DeviceScatter,
    GpuDevice, RawCsr, RawDense, RawSplit, RawSpmm, RawStream, RawWorkspace, SparseParts, Strategy,
};

use super::broadcast::q_local_blocks;
use super::{
    agree, check_shapes, predicted_traffic, value_bytes, DistSpmmError, Op, TrafficTotals,
};
use crate::nccl::{NcclComm, RawDeviceBuffer};
use crate::{AllGather, AllReduce, CommError};
use layout::{total_rows, HaloLayout, Segment};

/// A device failure of this rank (not collective).
fn cuda(e: CudaError) -> DistSpmmError {
    DistSpmmError::Comm(CommError::from(e))
}

/// A block on the device: CSR for the forward product, CSC for the transposed one.
#[derive(Debug)]
struct DeviceBlock {
    csr: DeviceCsr,
    csc: DeviceCsc,
}

/// The host arrays of a block: shape, CSR (row pointers, columns, values) and CSC (column
/// pointers, rows, values).
type HostBlock<'b> = (
    usize,
    usize,
    (&'b [u64], &'b [u32], &'b [f32]),
    (&'b [u64], &'b [u32], &'b [f32]),
);

impl DeviceBlock {
    fn upload(dev: &GpuDevice, block: HostBlock<'_>) -> Result<Self, CudaError> {
        let (nrows, ncols, (rp, ci, cv), (cp, ri, rv)) = block;
        let parts = |indptr, indices, values| SparseParts {
            nrows,
            ncols,
            indptr,
            indices,
            values,
        };
        Ok(Self {
            csr: DeviceCsr::new(dev, parts(rp, ci, cv))?,
            csc: DeviceCsc::new(dev, parts(cp, ri, rv))?,
        })
    }

    /// Device bytes of both structures.
    fn bytes(&self) -> u64 {
        let nnz = self.csr.nnz() as u64;
        8 * (self.csr.nrows() as u64 + 1 + self.csc.ncols() as u64 + 1) + 16 * nnz
    }
}

/// A flat f32 device buffer that grows to the largest size asked for.
#[derive(Debug, Default)]
struct Flat(Option<DeviceDense>);

impl Flat {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, DeviceDense::cols)
    }

    fn needs(&self, len: usize) -> bool {
        len > self.len()
    }

    /// Reallocates to `len` values (the caller has waited for every stream that used it).
    fn grow(&mut self, dev: &GpuDevice, len: usize) -> Result<(), CudaError> {
        if self.needs(len) {
            self.0 = None;
            self.0 = Some(DeviceDense::zeros(dev, 1, len)?);
        }
        Ok(())
    }

    fn ptr(&self) -> u64 {
        self.0.as_ref().map_or(0, |d| d.raw().ptr)
    }

    /// Rows `first..first + rows` of this buffer read as a packed `rows × f` matrix.
    fn rows(&self, first: usize, rows: usize, f: usize) -> RawDense {
        RawDense {
            rows,
            cols: f,
            ld: f,
            ptr: self.ptr() + (first * f * size_of::<f32>()) as u64,
        }
    }

    /// A segment of this buffer as an NCCL block.
    fn segment(&self, s: &Segment, f: usize) -> RawDeviceBuffer {
        RawDeviceBuffer {
            ptr: self.rows(s.first, s.rows, f).ptr,
            len: s.rows * f,
        }
    }

    fn workspace(&self) -> RawWorkspace {
        RawWorkspace {
            ptr: self.ptr(),
            len: self.len(),
        }
    }
}

/// The halo schedule on the device.
#[derive(Debug)]
struct HaloDevice {
    layout: HaloLayout,
    /// One per receive segment, same order.
    blocks: Vec<DeviceBlock>,
    send_rows: DeviceRows,
    scatter: DeviceScatter,
}

/// The broadcast schedule on the device.
#[derive(Debug)]
struct BroadcastDevice {
    plan: BroadcastPlan,
    /// Indexed by source part, q-local columns; `None` for the own part and empty blocks.
    blocks: Vec<Option<DeviceBlock>>,
    /// A matrix without non-zeros over the largest part's rows: `Âᵀ` of an empty block,
    /// whose product writes the zero contribution a root still expects.
    empty: DeviceCsr,
}

#[derive(Debug)]
enum GpuState {
    Halo(HaloDevice),
    Broadcast(BroadcastDevice),
}

/// The streams of one call.
#[derive(Debug, Clone, Copy)]
struct Streams {
    caller: RawStream,
    main: RawStream,
    side: RawStream,
}

/// The distributed SpMM operator of one rank on device buffers. See the [module docs](self).
///
/// ```no_run
/// use chunk_format::ChunkView;
/// use dist_comm::spmm::{DistSpmmError, GpuDistSpmm};
/// use dist_comm::{AllGather, AllReduce, Broadcast, DeviceSelect, NcclComm};
/// use distspmm_core::schedule::ScheduleKind;
/// use distspmm_cuda::{CudaError, DeviceDense};
///
/// /// One aggregation `Y_p = (Â·X)_p` on this rank's GPU (every rank calls it together).
/// fn aggregate<H: AllGather + AllReduce + Broadcast>(
///     host: &H,
///     chunk: ChunkView<'_>,
///     x: &[f32],
///     f: usize,
/// ) -> Result<Vec<f32>, DistSpmmError> {
///     let nccl = NcclComm::new(host, DeviceSelect::LocalRank)?;
///     let mut op = GpuDistSpmm::new(host, &nccl, chunk, ScheduleKind::Halo)?;
///     let n = op.local_rows();
///     let dev = op.device().clone();
///     let cuda = |e: CudaError| DistSpmmError::Comm(e.into());
///     let x = DeviceDense::from_host(&dev, n, f, x).map_err(cuda)?;
///     let mut y = DeviceDense::zeros(&dev, n, f).map_err(cuda)?;
///     op.forward(&x, &mut y)?;
///     y.to_host().map_err(cuda)
/// }
/// ```
#[derive(Debug)]
pub struct GpuDistSpmm<'a, H: AllGather + AllReduce> {
    host: &'a H,
    nccl: &'a NcclComm,
    dev: GpuDevice,
    chunk: ChunkView<'a>,
    diagonal: DeviceBlock,
    state: GpuState,
    /// Halo: the send buffer (backward: received partial sums). Broadcast: the panel.
    first: Flat,
    /// Halo: the receive buffer (backward: partial sums sent). Broadcast: the root's inbox.
    second: Flat,
    /// Row-splitting workspace of the products on the NCCL stream.
    ws_main: Flat,
    /// Row-splitting workspace of the products on the device stream.
    ws_side: Flat,
    last: Traffic,
    totals: TrafficTotals,
}

impl<'a, H: AllGather + AllReduce> GpuDistSpmm<'a, H> {
    /// Builds rank `host.rank()`'s operator for `chunk` under `schedule` on the GPU of `nccl`
    /// (collective over `host`, whose ranks must be `nccl`'s).
    ///
    /// # Errors
    /// As [`DistSpmm::new`](super::DistSpmm::new); a rank that cannot upload its chunk (no
    /// device, out of memory) gets [`DistSpmmError::Comm`] and the others a
    /// [`DistSpmmError::Disagreement`] naming it.
    pub fn new(
        host: &'a H,
        nccl: &'a NcclComm,
        chunk: ChunkView<'a>,
        schedule: ScheduleKind,
    ) -> Result<Self, DistSpmmError> {
        let built = Self::build(host, nccl, chunk, schedule);
        if let Err(e) = &built {
            tracing::warn!(rank = host.rank(), error = %e, "cannot build the GPU operator");
        }
        agree::agree_on_chunk(host, &chunk, schedule, built.is_ok())?;
        built
    }

    fn build(
        host: &'a H,
        nccl: &'a NcclComm,
        chunk: ChunkView<'a>,
        schedule: ScheduleKind,
    ) -> Result<Self, DistSpmmError> {
        if (nccl.rank(), nccl.size()) != (host.rank(), host.size()) {
            return Err(DistSpmmError::Shape(format!(
                "the NCCL communicator's rank {} of {} is not the host communicator's rank {} \
                 of {}: build both over the same ranks",
                nccl.rank(),
                nccl.size(),
                host.rank(),
                host.size()
            )));
        }
        let dev = GpuDevice::open(nccl.ordinal()).map_err(cuda)?;
        let n = chunk.num_local_nodes();
        let d = chunk.diagonal_block();
        let diagonal = DeviceBlock::upload(
            &dev,
            (
                n,
                n,
                (d.csr_rowptr, d.csr_cols, d.csr_vals),
                (d.csc_colptr, d.csc_rows, d.csc_vals),
            ),
        )
        .map_err(cuda)?;
        let state = match schedule {
            ScheduleKind::Halo => GpuState::Halo(Self::halo_state(&dev, &chunk)?),
            ScheduleKind::Broadcast => GpuState::Broadcast(Self::broadcast_state(&dev, &chunk)?),
        };
        // The uploads ran on the device stream; the NCCL stream uses them next.
        dev.synchronize().map_err(cuda)?;
        tracing::debug!(
            rank = chunk.part_id(),
            ordinal = dev.ordinal(),
            ?schedule,
            "uploaded the chunk for the GPU operator"
        );
        Ok(Self {
            host,
            nccl,
            dev,
            chunk,
            diagonal,
            state,
            first: Flat::default(),
            second: Flat::default(),
            ws_main: Flat::default(),
            ws_side: Flat::default(),
            last: Traffic::default(),
            totals: TrafficTotals::default(),
        })
    }

    fn halo_state(dev: &GpuDevice, chunk: &ChunkView<'_>) -> Result<HaloDevice, DistSpmmError> {
        let layout = HaloLayout::new(chunk)?;
        let part = chunk.part_id();
        let blocks = chunk
            .blocks()
            .filter(|b| b.src_part as usize != part)
            .map(|b| {
                DeviceBlock::upload(
                    dev,
                    (
                        b.nrows,
                        b.ncols,
                        (b.csr_rowptr, b.csr_cols, b.csr_vals),
                        (b.csc_colptr, b.csc_rows, b.csc_vals),
                    ),
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(cuda)?;
        Ok(HaloDevice {
            send_rows: DeviceRows::new(dev, &layout.send_rows).map_err(cuda)?,
            scatter: DeviceScatter::new(dev, &layout.scatter).map_err(cuda)?,
            layout,
            blocks,
        })
    }

    fn broadcast_state(
        dev: &GpuDevice,
        chunk: &ChunkView<'_>,
    ) -> Result<BroadcastDevice, DistSpmmError> {
        let plan = BroadcastPlan::from_chunk(chunk);
        let blocks = q_local_blocks(chunk)?
            .iter()
            .map(|b| {
                b.as_ref()
                    .map(|b| {
                        let (csr, csc) = (&b.csr, &b.csc);
                        DeviceBlock::upload(
                            dev,
                            (
                                csr.nrows(),
                                csr.ncols(),
                                (csr.indptr(), csr.indices(), csr.data()),
                                (csc.indptr(), csc.indices(), csc.data()),
                            ),
                        )
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(cuda)?;
        let widest = plan.steps().map(|s| s.rows as usize).max().unwrap_or(0);
        let zeros = vec![0u64; widest + 1];
        let empty = DeviceCsr::new(
            dev,
            SparseParts {
                nrows: widest,
                ncols: chunk.num_local_nodes(),
                indptr: &zeros,
                indices: &[],
                values: &[],
            },
        )
        .map_err(cuda)?;
        Ok(BroadcastDevice {
            plan,
            blocks,
            empty,
        })
    }

    /// `Y_p = (Â·X)_p` from this rank's `X_p` into `Y_p` (`n_p × F` each, any leading
    /// dimension, overwritten), both on [`device`](Self::device); queued on the device's stream
    /// (what [`DeviceDense::to_host`] waits for). Collective.
    ///
    /// # Errors
    /// As [`DistSpmm::forward`](super::DistSpmm::forward); a matrix of another `GpuDevice`
    /// handle is a [`DistSpmmError::Shape`] (use [`device`](Self::device) to allocate).
    pub fn forward(&mut self, x: &DeviceDense, y: &mut DeviceDense) -> Result<(), DistSpmmError> {
        let local = self.same_device(&[x, y]);
        // SAFETY: both are live allocations of this operator's device with the extents
        // their raw() describes; `y` is borrowed mutably, so it is not `x`; the device stream
        // is live as long as `self.dev`.
        unsafe {
            self.call(
                Op::Forward,
                x.raw(),
                y.raw(),
                Some(self.dev.stream()),
                local,
            )
        }
    }

    /// `dX_p = (Âᵀ·dY)_p` from `dY_p` into `dX_p` on the device's stream. Collective.
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub fn backward(
        &mut self,
        dy: &DeviceDense,
        dx: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let local = self.same_device(&[dy, dx]);
        // SAFETY: as in forward.
        unsafe {
            self.call(
                Op::Backward,
                dy.raw(),
                dx.raw(),
                Some(self.dev.stream()),
                local,
            )
        }
    }

    /// [`forward`](Self::forward) on device memory given by address, ordered after the work
    /// queued on `stream` before the call (the NCCL stream when `None`); work queued on
    /// `stream` after the call runs after the product. Returns once the work is queued.
    ///
    /// # Safety
    /// `x` and `y` must address `(rows − 1)·ld + cols` f32 each in memory of this operator's
    /// device; `y` must not overlap `x` (checked where the ranges are known); `stream` must be
    /// a live stream of the device's primary context; all must stay alive and untouched by
    /// other streams until the work queued on `stream` by this call has finished.
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub unsafe fn forward_raw(
        &mut self,
        x: RawDense,
        y: RawDense,
        stream: Option<RawStream>,
    ) -> Result<(), DistSpmmError> {
        // SAFETY: forwarded contract.
        unsafe { self.call(Op::Forward, x, y, stream, Ok(())) }
    }

    /// [`backward`](Self::backward) on device memory given by address (see
    /// [`forward_raw`](Self::forward_raw)).
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw), with `dy` and `dx`.
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub unsafe fn backward_raw(
        &mut self,
        dy: RawDense,
        dx: RawDense,
        stream: Option<RawStream>,
    ) -> Result<(), DistSpmmError> {
        // SAFETY: forwarded contract.
        unsafe { self.call(Op::Backward, dy, dx, stream, Ok(())) }
    }

    fn same_device(&self, operands: &[&DeviceDense]) -> Result<(), DistSpmmError> {
        let ordinal = self.dev.ordinal();
        if operands
            .iter()
            .all(|m| m.device().stream() == self.dev.stream())
        {
            Ok(())
        } else {
            Err(DistSpmmError::Shape(format!(
                "rank {}: an operand belongs to another GpuDevice handle than the operator's \
                 (device {ordinal}); allocate it on GpuDistSpmm::device()",
                self.rank()
            )))
        }
    }

    /// Checks locally, agrees, then queues the schedule.
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw).
    unsafe fn call(
        &mut self,
        op: Op,
        input: RawDense,
        output: RawDense,
        stream: Option<RawStream>,
        local: Result<(), DistSpmmError>,
    ) -> Result<(), DistSpmmError> {
        let f = input.cols;
        let ready = local
            .and_then(|()| self.check_operands(op, &input, &output))
            .and_then(|()| self.reserve(op, f));
        agree::agree_on_call(self.host, op, f, ready)?;
        let traffic = if f == 0 || input.rows == 0 && self.parts() == 1 {
            Traffic::default()
        } else {
            let main = RawStream(self.nccl.raw_stream());
            let streams = Streams {
                caller: stream.unwrap_or(main),
                main,
                side: self.dev.stream(),
            };
            // SAFETY: the caller's contract covers the operands and its stream; the NCCL and
            // device streams are live as long as `self`.
            unsafe {
                self.join(streams.main, streams.caller)?;
                self.join(streams.side, streams.caller)?;
                let traffic = match op {
                    Op::Forward => self.run_forward(input, output, streams)?,
                    Op::Backward => self.run_backward(input, output, streams)?,
                };
                self.join(streams.caller, streams.main)?;
                traffic
            }
        };
        self.last = traffic;
        self.totals.record(op, traffic);
        Ok(())
    }

    /// # Safety
    /// Both are live streams of the device's context.
    unsafe fn join(&self, waiter: RawStream, signaller: RawStream) -> Result<(), DistSpmmError> {
        // SAFETY: forwarded contract.
        unsafe { self.dev.join_streams(Some(waiter), Some(signaller)) }.map_err(cuda)
    }

    fn check_operands(
        &self,
        op: Op,
        input: &RawDense,
        output: &RawDense,
    ) -> Result<(), DistSpmmError> {
        check_device_operands(op, self.rank(), self.local_rows(), input, output)
    }

    /// Grows the buffers for a call of `op` with `f` columns, after waiting for the streams
    /// that may still use the old ones.
    fn reserve(&mut self, op: Op, f: usize) -> Result<(), DistSpmmError> {
        let rank = self.rank();
        let ws = |s: Option<&DeviceRowSplit>| s.map_or(0, |s| s.workspace_len(f));
        let (first, second, main, side) = match &self.state {
            GpuState::Halo(h) => {
                let (main_ws, side_ws) = match op {
                    Op::Forward => (
                        h.blocks.iter().map(|b| ws(b.csr.row_split())).max(),
                        ws(self.diagonal.csr.row_split()),
                    ),
                    Op::Backward => (
                        h.blocks.iter().map(|b| ws(b.csc.row_split())).max(),
                        ws(self.diagonal.csc.row_split()),
                    ),
                };
                (
                    h.layout.sent_rows() * f,
                    h.layout.halo_rows() * f,
                    main_ws.unwrap_or(0),
                    side_ws,
                )
            }
            GpuState::Broadcast(b) => {
                let parts = b.plan.parts();
                let panel = if parts > 1 {
                    b.plan.steps().map(|s| s.rows as usize).max().unwrap_or(0)
                } else {
                    0
                };
                let inbox = match op {
                    Op::Forward => 0,
                    Op::Backward => (parts - 1) * self.local_rows(),
                };
                let blocks = b.blocks.iter().flatten().chain([&self.diagonal]);
                let main_ws = match op {
                    Op::Forward => blocks.map(|b| ws(b.csr.row_split())).max(),
                    Op::Backward => blocks.map(|b| ws(b.csc.row_split())).max(),
                };
                (panel * f, inbox * f, main_ws.unwrap_or(0), 0)
            }
        };
        let wanted = [first, second, main, side];
        let bufs = [&self.first, &self.second, &self.ws_main, &self.ws_side];
        if !bufs.iter().zip(wanted).any(|(b, len)| b.needs(len)) {
            return Ok(());
        }
        let bytes = value_bytes(wanted.iter().sum());
        let alloc = |e: CudaError| DistSpmmError::Allocation {
            rank,
            bytes,
            reason: e.to_string(),
        };
        // The old buffers may still be in use by the previous call's work.
        self.nccl.synchronize()?;
        self.dev.synchronize().map_err(cuda)?;
        let dev = &self.dev;
        for (buf, len) in [
            &mut self.first,
            &mut self.second,
            &mut self.ws_main,
            &mut self.ws_side,
        ]
        .into_iter()
        .zip(wanted)
        {
            buf.grow(dev, len).map_err(alloc)?;
        }
        // Allocated (and zeroed) on the device stream; the NCCL stream uses them too.
        dev.synchronize().map_err(cuda)
    }

    /// `Y = α·A·X + β·Y` on `stream` with `a`'s row-splitting plan and `ws`.
    ///
    /// # Safety
    /// `x` and `y` are live device memory of the extents they describe, `y` not overlapping
    /// `x`; `ws` is used by no other stream; `stream` is live.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        &self,
        a: RawCsr,
        split: Option<&DeviceRowSplit>,
        ws: &Flat,
        x: RawDense,
        beta: f32,
        y: RawDense,
        stream: RawStream,
    ) -> Result<(), DistSpmmError> {
        let split = split.map(|plan| RawSplit {
            plan,
            workspace: ws.workspace(),
        });
        let op = RawSpmm {
            alpha: 1.0,
            a,
            x,
            beta,
            y,
        };
        // SAFETY: forwarded contract; the matrix and plan are this operator's uploads.
        unsafe { self.dev.spmm_raw(&op, Strategy::Auto, split, Some(stream)) }
            .map(|_| ())
            .map_err(cuda)
    }

    /// # Safety
    /// As [`forward_raw`](Self::forward_raw); the streams are joined to the caller's.
    unsafe fn run_forward(
        &self,
        x: RawDense,
        y: RawDense,
        s: Streams,
    ) -> Result<Traffic, DistSpmmError> {
        let f = x.cols;
        let diag = &self.diagonal.csr;
        match &self.state {
            GpuState::Halo(h) => {
                let send = self.first.rows(0, h.layout.sent_rows(), f);
                // SAFETY: (all blocks below) the operands are the caller's buffers and this
                // operator's own, sized by `reserve` for F; the local product writes Y on the
                // device stream while the NCCL stream packs, exchanges, then adds into Y only
                // after joining the device stream.
                unsafe {
                    self.product(
                        diag.raw(),
                        diag.row_split(),
                        &self.ws_side,
                        x,
                        0.0,
                        y,
                        s.side,
                    )?;
                    self.dev
                        .gather_rows_raw(x, Some(&h.send_rows), send, Some(s.main))
                        .map_err(cuda)?;
                    self.exchange(
                        &h.layout.sends,
                        &self.first,
                        &h.layout.recvs,
                        &self.second,
                        f,
                    )?;
                    self.join(s.main, s.side)?;
                    for (seg, b) in h.layout.recvs.iter().zip(&h.blocks) {
                        let halo = self.second.rows(seg.first, seg.rows, f);
                        self.product(
                            b.csr.raw(),
                            b.csr.row_split(),
                            &self.ws_main,
                            halo,
                            1.0,
                            y,
                            s.main,
                        )?;
                    }
                }
                Ok(Traffic {
                    sent: value_bytes(h.layout.sent_rows() * f),
                    received: value_bytes(h.layout.halo_rows() * f),
                })
            }
            GpuState::Broadcast(b) => {
                let (me, parts) = (self.rank(), b.plan.parts());
                let mut traffic = Traffic::default();
                let mut beta = 0.0;
                for step in b.plan.steps() {
                    let (q, rows) = (step.root, step.rows as usize);
                    let panel = self.first.rows(0, rows, f);
                    // SAFETY: as above; everything runs in order on the NCCL stream.
                    unsafe {
                        if parts > 1 {
                            if q == me {
                                self.dev
                                    .gather_rows_raw(x, None, panel, Some(s.main))
                                    .map_err(cuda)?;
                                traffic.sent += value_bytes(rows * f) * (parts as u64 - 1);
                            } else {
                                traffic.received += value_bytes(rows * f);
                            }
                            let buf = RawDeviceBuffer {
                                ptr: panel.ptr,
                                len: rows * f,
                            };
                            self.nccl.broadcast_raw::<f32>(buf, q)?;
                        }
                        if q == me {
                            self.product(
                                diag.raw(),
                                diag.row_split(),
                                &self.ws_main,
                                x,
                                beta,
                                y,
                                s.main,
                            )?;
                            beta = 1.0;
                        } else if let Some(block) = &b.blocks[q] {
                            let a = &block.csr;
                            self.product(
                                a.raw(),
                                a.row_split(),
                                &self.ws_main,
                                panel,
                                beta,
                                y,
                                s.main,
                            )?;
                            beta = 1.0;
                        }
                    }
                }
                Ok(traffic)
            }
        }
    }

    /// # Safety
    /// As [`forward_raw`](Self::forward_raw); the streams are joined to the caller's.
    unsafe fn run_backward(
        &self,
        dy: RawDense,
        dx: RawDense,
        s: Streams,
    ) -> Result<Traffic, DistSpmmError> {
        let f = dy.cols;
        let diag = &self.diagonal.csc;
        match &self.state {
            GpuState::Halo(h) => {
                let incoming = self.first.rows(0, h.layout.sent_rows(), f);
                // SAFETY: as in run_forward: the partial sums are written and sent on the
                // NCCL stream while the device stream computes the local block into dX; the
                // scatter-add joins the device stream first.
                unsafe {
                    self.product(
                        diag.raw(),
                        diag.row_split(),
                        &self.ws_side,
                        dy,
                        0.0,
                        dx,
                        s.side,
                    )?;
                    for (seg, b) in h.layout.recvs.iter().zip(&h.blocks) {
                        let partial = self.second.rows(seg.first, seg.rows, f);
                        self.product(
                            b.csc.raw(),
                            b.csc.row_split(),
                            &self.ws_main,
                            dy,
                            0.0,
                            partial,
                            s.main,
                        )?;
                    }
                    self.exchange(
                        &h.layout.recvs,
                        &self.second,
                        &h.layout.sends,
                        &self.first,
                        f,
                    )?;
                    self.join(s.main, s.side)?;
                    self.dev
                        .scatter_add_raw(&h.scatter, incoming, dx, Some(s.main))
                        .map_err(cuda)?;
                }
                Ok(Traffic {
                    sent: value_bytes(h.layout.halo_rows() * f),
                    received: value_bytes(h.layout.sent_rows() * f),
                })
            }
            GpuState::Broadcast(b) => {
                let (me, parts, n) = (self.rank(), b.plan.parts(), self.local_rows());
                let mut traffic = Traffic::default();
                for step in b.plan.steps() {
                    let (q, rows) = (step.root, step.rows as usize);
                    // SAFETY: as in run_forward; everything runs in order on the NCCL stream.
                    unsafe {
                        if q == me {
                            self.product(
                                diag.raw(),
                                diag.row_split(),
                                &self.ws_main,
                                dy,
                                0.0,
                                dx,
                                s.main,
                            )?;
                            if parts == 1 {
                                continue;
                            }
                            let inbox: Vec<Segment> = (0..parts)
                                .filter(|&r| r != me)
                                .enumerate()
                                .map(|(k, peer)| Segment {
                                    peer,
                                    first: k * n,
                                    rows: n,
                                })
                                .collect();
                            traffic.received += value_bytes(total_rows(&inbox) * f);
                            self.exchange(&[], &self.first, &inbox, &self.second, f)?;
                            let stacked = self.second.rows(0, total_rows(&inbox), f);
                            self.dev
                                .add_blocks_raw(stacked, dx, Some(s.main))
                                .map_err(cuda)?;
                        } else {
                            let partial = self.first.rows(0, rows, f);
                            let a = match &b.blocks[q] {
                                Some(block) => block.csc.raw(),
                                None => RawCsr {
                                    nrows: rows,
                                    ..b.empty.raw()
                                },
                            };
                            let split = b.blocks[q].as_ref().and_then(|x| x.csc.row_split());
                            self.product(a, split, &self.ws_main, dy, 0.0, partial, s.main)?;
                            traffic.sent += value_bytes(rows * f);
                            let to_root = [Segment {
                                peer: q,
                                first: 0,
                                rows,
                            }];
                            self.exchange(&to_root, &self.first, &[], &self.second, f)?;
                        }
                    }
                }
                Ok(traffic)
            }
        }
    }

    /// One grouped exchange: `sends` segments of `from` go out, `recvs` segments of `into`
    /// come in, on the NCCL stream.
    ///
    /// # Safety
    /// Both buffers are this operator's, reserved for `f` columns.
    unsafe fn exchange(
        &self,
        sends: &[Segment],
        from: &Flat,
        recvs: &[Segment],
        into: &Flat,
        f: usize,
    ) -> Result<(), DistSpmmError> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        let out: Vec<(usize, RawDeviceBuffer)> =
            sends.iter().map(|s| (s.peer, from.segment(s, f))).collect();
        let inc: Vec<(usize, RawDeviceBuffer)> =
            recvs.iter().map(|s| (s.peer, into.segment(s, f))).collect();
        // SAFETY: the segments lie inside two distinct buffers of this device, reserved for
        // F columns; receive segments are disjoint; the buffers live in `self` and are only
        // replaced after both streams have been waited for.
        unsafe { self.nccl.halo_exchange_raw::<f32>(&out, &inc) }?;
        Ok(())
    }

    /// The schedule this operator runs.
    pub fn schedule(&self) -> ScheduleKind {
        match self.state {
            GpuState::Halo(_) => ScheduleKind::Halo,
            GpuState::Broadcast(_) => ScheduleKind::Broadcast,
        }
    }

    /// This rank (= its part p).
    pub fn rank(&self) -> usize {
        self.chunk.part_id()
    }

    /// Number of ranks P.
    pub fn parts(&self) -> usize {
        self.chunk.num_parts()
    }

    /// Rows this rank owns, `n_p`.
    pub fn local_rows(&self) -> usize {
        self.chunk.num_local_nodes()
    }

    /// The device the operator runs on; allocate the operands of
    /// [`forward`](Self::forward) and [`backward`](Self::backward) on it.
    pub fn device(&self) -> &GpuDevice {
        &self.dev
    }

    /// The NCCL communicator.
    pub fn nccl(&self) -> &'a NcclComm {
        self.nccl
    }

    /// The host communicator the ranks agree over.
    pub fn host(&self) -> &'a H {
        self.host
    }

    /// The chunk.
    pub fn chunk(&self) -> &ChunkView<'a> {
        &self.chunk
    }

    /// Payload bytes this rank handed to NCCL in its last call (the CPU operator's
    /// conventions).
    pub fn bytes_last_call(&self) -> Traffic {
        self.last
    }

    /// Payload bytes and calls so far, per direction.
    pub fn bytes_total(&self) -> TrafficTotals {
        self.totals
    }

    /// The bytes the plan predicts for one forward and one backward call with `features`
    /// columns.
    pub fn predicted_traffic(&self, features: usize) -> LayerTraffic {
        predicted_traffic(&self.chunk, self.schedule(), features)
    }

    /// Device memory this operator holds: `buffers` the exchange buffers and row-splitting
    /// workspaces (sized for the largest F so far), `structure` the uploaded blocks (CSR and
    /// CSC), send lists and scatter plan.
    pub fn workspace(&self) -> Workspace {
        let buffers = [&self.first, &self.second, &self.ws_main, &self.ws_side]
            .iter()
            .map(|b| b.len())
            .sum::<usize>();
        let structure = self.diagonal.bytes()
            + match &self.state {
                GpuState::Halo(h) => {
                    let sc = &h.layout.scatter;
                    h.blocks.iter().map(DeviceBlock::bytes).sum::<u64>()
                        + 4 * h.layout.send_rows.len() as u64
                        + 4 * sc.rows().len() as u64
                        + 8 * (sc.ptr().len() + sc.src().len()) as u64
                }
                GpuState::Broadcast(b) => {
                    b.blocks
                        .iter()
                        .flatten()
                        .map(DeviceBlock::bytes)
                        .sum::<u64>()
                        + 8 * (b.empty.nrows() as u64 + 1)
                }
            };
        Workspace {
            buffers: value_bytes(buffers),
            structure,
        }
    }
}

impl<H: AllGather + AllReduce> Drop for GpuDistSpmm<'_, H> {
    /// The device memory is freed in the order of the device stream, but the last call may
    /// still be using it on the NCCL stream: make the device stream wait for that first (no
    /// host wait).
    fn drop(&mut self) {
        let main = RawStream(self.nccl.raw_stream());
        // SAFETY: both streams are live: the NCCL communicator outlives `self` ('a) and the
        // device stream lives as long as `self.dev`.
        if let Err(e) = unsafe { self.dev.join_streams(None, Some(main)) } {
            tracing::warn!(error = %e, "ordering the GPU operator's release after its last call failed; waiting instead");
            let _ = self.nccl.synchronize();
        }
    }
}

/// The device operands of one call: `n × F` each (as on the CPU), `ld >= F`, not NULL when
/// they hold anything, and not overlapping.
fn check_device_operands(
    op: Op,
    rank: usize,
    n: usize,
    input: &RawDense,
    output: &RawDense,
) -> Result<(), DistSpmmError> {
    let f = input.cols;
    check_shapes(
        op,
        rank,
        n,
        (input.rows, input.cols),
        (output.rows, output.cols),
    )?;
    let names = match op {
        Op::Forward => ("X", "Y"),
        Op::Backward => ("dY", "dX"),
    };
    let shape = |m: String| {
        Err(DistSpmmError::Shape(format!(
            "{} on rank {rank}: {m}",
            op.name()
        )))
    };
    for (name, d) in [(names.0, input), (names.1, output)] {
        if d.ld < d.cols {
            return shape(format!(
                "{name}'s leading dimension {} is below its {} columns",
                d.ld, d.cols
            ));
        }
        if d.ptr == 0 && n > 0 && f > 0 {
            return shape(format!("{name} is a NULL device pointer"));
        }
    }
    if n > 0 && f > 0 {
        // Byte extents; saturating, so an absurd leading dimension reads as "overlaps"
        // rather than wrapping around.
        let extent = |d: &RawDense| {
            ((n - 1) as u64)
                .saturating_mul(d.ld as u64)
                .saturating_add(f as u64)
                .saturating_mul(size_of::<f32>() as u64)
        };
        let (a, b) = (input.ptr, output.ptr);
        if a < b.saturating_add(extent(output)) && b < a.saturating_add(extent(input)) {
            return shape(format!(
                "{} and {} overlap; the product cannot be computed in place",
                names.0, names.1
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(rows: usize, cols: usize, ld: usize, ptr: u64) -> RawDense {
        RawDense {
            rows,
            cols,
            ld,
            ptr,
        }
    }

    #[test]
    fn device_operands_are_checked_on_the_host() {
        let check = |x, y| check_device_operands(Op::Forward, 1, 10, &x, &y);
        let shape = |r: Result<(), DistSpmmError>, text: &str| match r {
            Err(DistSpmmError::Shape(m)) => assert!(m.contains(text), "{m}"),
            other => panic!("expected a shape error with {text:?}, got {other:?}"),
        };
        let (x, y) = (dense(10, 4, 4, 0x10_000), dense(10, 4, 6, 0x20_000));
        assert_eq!(check(x, y), Ok(()));
        shape(check(dense(9, 4, 4, 0x10_000), y), "X is 9 × 4");
        shape(check(x, dense(10, 3, 6, 0x20_000)), "Y is 10 × 3");
        shape(check(x, dense(10, 4, 3, 0x20_000)), "leading dimension 3");
        shape(check(dense(10, 4, 4, 0), y), "X is a NULL");
        // Y starts inside X's last row.
        shape(check(x, dense(10, 4, 4, 0x10_000 + 4 * 37)), "overlap");
        // X's extent ends exactly where Y starts: fine.
        assert_eq!(check(x, dense(10, 4, 4, 0x10_000 + 4 * 40)), Ok(()));
        // An absurd leading dimension saturates instead of wrapping.
        shape(check(dense(10, 4, usize::MAX, 0x10_000), y), "overlap");
        // Nothing to hold: NULL is fine.
        let empty = |ptr| dense(0, 4, 4, ptr);
        assert_eq!(
            check_device_operands(Op::Backward, 0, 0, &empty(0), &empty(0)),
            Ok(())
        );
    }
}
