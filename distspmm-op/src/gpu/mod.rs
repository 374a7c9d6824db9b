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
//! operator's agreement (P, part, fingerprint, version, N, schedule, message precision) over
//! `H`, so a bad chunk on one rank is an error on every rank. Every call agrees on the
//! operation and F over `H` first, exactly as [`DistSpmm`](super::DistSpmm) does.
//!
//! # Execution
//! The operator is the [`Operator`](crate::Operator) shell of the CPU one (construction, call
//! path, accessors, bytes) over the GPU engine, so it runs the same
//! [`Program`](crate::Program)s; this module is the GPU [`Backend`]. Three streams take part: the caller's stream `S` (the operator's device
//! stream for the safe calls, any stream of the device for the raw ones), the NCCL
//! communicator's stream `M` ([`Lane::Comm`]) and the device's own stream `D`
//! ([`Lane::Local`]). `M` and `D` first wait for the work queued on `S`; a program's
//! [`Instr::Join`](crate::backend::Instr::Join) is an event between `M` and `D`; `S` waits for
//! `M` at the end. Nothing blocks the host after the agreement. The primitives:
//! - products: distspmm-cuda's SpMM (row groups or row splitting, with one split workspace per
//!   stream) over the uploaded CSR (`A·X`) or CSC (`Aᵀ·X`);
//! - packing: the gather kernel over the concatenated send lists (halo) or all rows
//!   (broadcast panel);
//! - the grouped exchange: one grouped `ncclSend`/`ncclRecv` ([`NcclComm::halo_exchange_raw`]),
//!   its body queued after it on `M`; broadcast: [`NcclComm::broadcast_raw`];
//! - the ordered scatter-add: one warp per row, contributions in increasing source rank, no
//!   atomics; adding blocks: the block-sum kernel; a zero contribution: a product with a
//!   matrix without non-zeros;
//! - per-edge values: the same SpMM over the uploaded structure with the values pointer on
//!   the block's run of the caller's edge operand; a transposed product first copies that run
//!   into CSC order (`dsp_csc_values`, through the CSR→CSC ranks uploaded at the first such
//!   call, 4 bytes per non-zero, into a scratch of 4 bytes per non-zero, each block its own run
//!   so the two lanes never share one); the SDDMM: `dsp_sddmm` over the block's uploaded CSR
//!   pattern into the block's run of the edge operand.
//! - grouped (multi-head) calls, G groups of `C = F / G` columns and G head-major runs of
//!   per-edge values (run g at `g·edge_count()`, as on the CPU): the exchanges move all F
//!   columns at once; a product over per-edge values is G SpMMs, group g's over its run and
//!   its columns `g·C..(g+1)·C` of X and Y (strided views, no copies), a transposed one first
//!   copies all G runs of the block into CSC order in one launch; the SDDMM writes all G runs
//!   of a block in one pass over its pattern (`dsp_sddmm` with `heads = G`).
//!
//! The edge softmax (`edge_softmax`, `leaky_relu_edge_softmax` and their backward) is
//! distspmm-cuda's kernel over the operator's uploaded row pointers (a table of the layout's
//! blocks made at construction): local, on the device's stream, the CPU operator's semantics.
//!
//! Every addition happens in a fixed order whatever the order of arrival, so results are
//! bit-identical run to run. They agree with the CPU operator to rounding (the kernels sum a
//! row's non-zeros in another order than the CPU kernels).
//!
//! # Message precision
//! [`GpuDistSpmm::with_precision`] moves the rows and partial sums in bf16 or f16 as
//! [`DistSpmm::with_precision`](crate::DistSpmm::with_precision) does, agreed with the
//! partition: beside each exchange buffer the engine keeps its 16-bit copy on the device; on
//! the NCCL stream each region is narrowed into its copy just before it is sent or broadcast
//! from this rank (distspmm-cuda's `dsp_narrow`), the copies travel as bytes (`ncclUint8`), and
//! each received copy is widened into its `f32` region as soon as it has arrived, before the
//! exchange's body reads it (`dsp_widen`). The conversions are the CPU's bit for bit, and the
//! steps — which regions are converted, what is handed over — are written once
//! (`crate::wire`) for this backend and the tests' recording backend, which checks them
//! against the CPU engine's without a device. Products and sums stay `f32`.
//!
//! # Buffers and bytes
//! The exchange buffers (and their 16-bit copies) and row-splitting workspaces grow at the
//! first call with a given F (after waiting for the operator's streams) and are reused; later
//! calls allocate nothing. Dropping the operator does not wait on the host: its device memory
//! is released in stream order after the last call's work.
//! [`GpuDistSpmm::bytes_last_call`] counts the payload as it is handed to NCCL (each message's
//! elements times their size), with the conventions of the CPU operator, so it equals
//! `HaloPlan::traffic` / `BroadcastPlan::traffic` in the operator's precision.

use std::ops::Deref;

use crate::schedule::{Precision, ScheduleKind, Traffic, Workspace};
use chunk_format::ChunkView;
use dist_comm::{AllGather, AllReduce, CommError, Group, NcclComm, RawDeviceBuffer};
use distspmm_cuda::{
    CudaError, DeviceCsc, DeviceCscOrder, DeviceCsr, DeviceDense, DeviceRowSplit, DeviceRows,
    DeviceScatter, EdgeRows, GpuDevice, HalfFormat, RawCscValues, RawCsr, RawDense, RawEdgeBlock,
    RawEdgeRuns, RawSplit, RawSpmm, RawStream, RawWorkspace, ScatterPlan, SparseParts, Strategy,
};
use distspmm_sparse::kernel::convert::Half;

use crate::backend::{
    run as run_program, Backend, Buf, Dense, Exchange, Instr, Lane, Matrix, Message, Orient,
    Product, Region, Rows, Values,
};
use crate::edges::{CscOrder, EdgeBlock, EdgeLayout};
use crate::layout::HaloLayout;
use crate::operands::{check_all, Operand};
use crate::operator::{self, engine::Engine, Shared};
use crate::wire::{self, Payload, Transport, WireCall};
use crate::{
    blocks, check_groups, check_operands, value_bytes, ChunkSource, DistSpmmError, Kind, Op,
    Operator, Schedule,
};

/// A device failure of this rank (not collective), as the communicators' device errors.
fn cuda(e: CudaError) -> DistSpmmError {
    DistSpmmError::Comm(match e {
        CudaError::NoDevice(message) => CommError::NoDevice(message),
        CudaError::Driver { call, message } => CommError::Cuda { call, message },
        other => CommError::Cuda {
            call: "distspmm-cuda",
            message: other.to_string(),
        },
    })
}

impl From<CudaError> for DistSpmmError {
    fn from(e: CudaError) -> Self {
        cuda(e)
    }
}

fn internal(what: &str) -> DistSpmmError {
    DistSpmmError::Internal(what.to_owned())
}

/// A block on the device: CSR for the forward product, CSC for the transposed one.
#[derive(Debug)]
struct DeviceBlock {
    csr: DeviceCsr,
    csc: DeviceCsc,
}

impl DeviceBlock {
    /// Uploads a block given by its host arrays: shape, CSR (row pointers, columns, values)
    /// and CSC (column pointers, rows, values).
    fn upload(
        dev: &GpuDevice,
        (nrows, ncols): (usize, usize),
        (rp, ci, cv): (&[u64], &[u32], &[f32]),
        (cp, ri, rv): (&[u64], &[u32], &[f32]),
    ) -> Result<Self, CudaError> {
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

    /// Uploads a block of the chunk over its own (compacted) columns.
    fn of(dev: &GpuDevice, b: &blocks::BlockViews<'_>) -> Result<Self, CudaError> {
        let (csr, csc) = (&b.csr, &b.csc);
        Self::upload(
            dev,
            (csr.nrows(), csr.ncols()),
            (csr.indptr(), csr.indices(), csr.data()),
            (csc.indptr(), csc.indices(), csc.data()),
        )
    }

    /// The raw matrix and its row-splitting plan of one orientation.
    fn oriented(&self, orient: Orient) -> (RawCsr, Option<&DeviceRowSplit>) {
        match orient {
            Orient::Plain => (self.csr.raw(), self.csr.row_split()),
            Orient::Transposed => (self.csc.raw(), self.csc.row_split()),
        }
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

    fn workspace(&self) -> RawWorkspace {
        RawWorkspace {
            ptr: self.ptr(),
            len: self.len(),
        }
    }
}

/// The 16-bit copy of an exchange buffer (the same rows, one 16-bit value each), held in a
/// [`Flat`] of half as many `f32` (rounded up).
#[derive(Debug, Default)]
struct Halves(Flat);

impl Halves {
    /// The `f32` values that hold `len` 16-bit values.
    fn words(len: usize) -> usize {
        len.div_ceil(2)
    }

    /// 16-bit values it holds.
    fn len(&self) -> usize {
        2 * self.0.len()
    }

    /// The address of value `k`.
    fn at(&self, k: usize) -> u64 {
        self.0.ptr() + (k * size_of::<u16>()) as u64
    }
}

/// The kernels' name of a 16-bit format.
fn half_format(fmt: Half) -> HalfFormat {
    match fmt {
        Half::Bf16 => HalfFormat::Bf16,
        Half::F16 => HalfFormat::F16,
    }
}

/// The blocks a schedule names, on the device.
#[derive(Debug)]
struct DeviceMatrices {
    diagonal: DeviceBlock,
    /// Halo: the off-diagonal blocks in increasing source part.
    remote: Vec<DeviceBlock>,
    /// Broadcast: the q-local blocks by source part.
    q_local: Vec<Option<DeviceBlock>>,
    /// Broadcast: a matrix without non-zeros over the largest part's rows, `Âᵀ` of an empty
    /// block, whose product writes the zero contribution a root still expects.
    empty: Option<DeviceCsr>,
    /// Halo: the concatenated send lists (gather) and the backward's scatter plan.
    halo: Option<(DeviceRows, DeviceScatter)>,
    /// The CSR→CSC ranks of every block in layout order, uploaded at the first transposed
    /// product over per-edge values.
    csc_order: Option<DeviceCscOrder>,
    /// Where each row's entries sit in the per-edge operand (the blocks' first positions and
    /// uploaded row pointers), for the edge softmax; set once the blocks are uploaded.
    rows: Option<EdgeRows>,
}

impl DeviceMatrices {
    fn block(&self, a: Matrix) -> Result<&DeviceBlock, DistSpmmError> {
        let missing = || internal("the program names a block the chunk does not have");
        match a {
            Matrix::Diagonal => Ok(&self.diagonal),
            Matrix::Remote(k) => self.remote.get(k).ok_or_else(missing),
            Matrix::QLocal(q) => self
                .q_local
                .get(q)
                .and_then(Option::as_ref)
                .ok_or_else(missing),
        }
    }

    /// Device bytes of the uploaded structure.
    fn bytes(&self, scatter: Option<&ScatterPlan>) -> u64 {
        let blocks = self.remote.iter().chain(self.q_local.iter().flatten());
        self.diagonal.bytes()
            + blocks.map(DeviceBlock::bytes).sum::<u64>()
            + self
                .empty
                .as_ref()
                .map_or(0, |e| 8 * (e.nrows() as u64 + 1))
            + scatter.map_or(0, |sc| {
                4 * sc.packed_rows() as u64
                    + 4 * sc.rows().len() as u64
                    + 8 * (sc.ptr().len() + sc.src().len()) as u64
            })
            + self.csc_order.as_ref().map_or(0, DeviceCscOrder::bytes)
            + self.rows.as_ref().map_or(0, |r| 16 * r.blocks() as u64)
    }
}

/// The layout run of a block a program names.
fn edge_run(edges: &EdgeLayout, a: Matrix) -> Result<(usize, usize), DistSpmmError> {
    let k = edges
        .index_of(a)
        .ok_or_else(|| internal("the program names a block without per-edge values"))?;
    let b = edges.blocks()[k];
    Ok((b.first, b.len))
}

/// The backward's scatter-add of a halo layout: partial sums received in the send layout,
/// added into the rows they belong to in increasing peer.
fn scatter_plan(layout: &HaloLayout, n: usize) -> Result<ScatterPlan, DistSpmmError> {
    let lists: Vec<&[u32]> = layout
        .sends
        .iter()
        .map(|s| &layout.send_rows[s.first..s.first + s.rows])
        .collect();
    ScatterPlan::new(n, &lists)
        .map_err(|e| DistSpmmError::Shape(format!("the halo send lists: {e}")))
}

/// The streams of one call.
#[derive(Debug, Clone, Copy)]
struct Streams {
    caller: RawStream,
    main: RawStream,
    side: RawStream,
}

/// The GPU engine of [`Operator`](crate::Operator): the host communicator the ranks agree
/// over, the NCCL communicator that moves the rows, the device with the chunk's blocks
/// uploaded, and the device buffers.
#[derive(Debug)]
pub struct GpuEngine<H, N>
where
    N: Deref<Target = NcclComm>,
{
    host: H,
    nccl: N,
    dev: GpuDevice,
    m: DeviceMatrices,
    /// The scatter plan's host arrays (for [`GpuDistSpmm::workspace`]).
    scatter: Option<ScatterPlan>,
    /// [`Buf::Packed`].
    packed: Flat,
    /// [`Buf::Halo`].
    halo: Flat,
    /// Row-splitting workspaces of the products, per lane ([`Lane::Comm`], [`Lane::Local`]).
    ws: [Flat; 2],
    /// The per-edge values of the transposed products in CSC order (one run per group, each
    /// with one run per block).
    csc_values: Flat,
    /// The 16-bit copies of [`Buf::Packed`] and [`Buf::Halo`] (empty in `f32`).
    wire: [Halves; 2],
    /// The bytes each program of the last call handed to NCCL.
    counted: Vec<Traffic>,
}

/// The distributed SpMM operator of one rank on device buffers: the [`Operator`] shell over
/// the GPU engine ([`GpuEngine`]). See the [module docs](self).
///
/// ```no_run
/// use chunk_format::ChunkView;
/// use dist_comm::{AllGather, AllReduce, Broadcast, DeviceSelect, NcclComm};
/// use distspmm_op::schedule::ScheduleKind;
/// use distspmm_cuda::{CudaError, DeviceDense};
/// use distspmm_op::{DistSpmmError, GpuDistSpmm};
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
///     let cuda = DistSpmmError::from;
///     let x = DeviceDense::from_host(&dev, n, f, x).map_err(cuda)?;
///     let mut y = DeviceDense::zeros(&dev, n, f).map_err(cuda)?;
///     op.forward(&x, &mut y)?;
///     y.to_host().map_err(cuda)
/// }
/// ```
///
/// As [`DistSpmm`](crate::DistSpmm), the operator holds its communicators and its chunk by
/// whatever the caller gives: references, or owners (`Rc<NcclComm>`, `Arc<MappedChunk>`).
pub type GpuDistSpmm<H, N, K> = Operator<GpuEngine<H, N>, K>;

/// One program of a call on device memory: the operands it names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    /// [`Dense::Input`].
    x: RawDense,
    /// [`Dense::Output`] (no rows for the SDDMM).
    y: RawDense,
    /// [`Dense::Left`].
    left: Option<RawDense>,
    /// The per-edge values products read (`CUdeviceptr`, 0 when none).
    values: u64,
    /// The per-edge values SDDMMs write (`CUdeviceptr`, 0 when none).
    out: u64,
}

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Comm => 0,
        Lane::Local => 1,
    }
}

/// The block a program names for block `k` of the per-edge layout.
fn layout_block(kind: ScheduleKind, k: usize, b: &EdgeBlock) -> Matrix {
    if k == 0 {
        Matrix::Diagonal
    } else {
        match kind {
            ScheduleKind::Halo => Matrix::Remote(k - 1),
            ScheduleKind::Broadcast => Matrix::QLocal(b.source),
        }
    }
}

/// Columns `first..first + w` of `d`.
fn columns(d: RawDense, first: usize, w: usize) -> RawDense {
    RawDense {
        rows: d.rows,
        cols: w,
        ld: d.ld,
        ptr: d.ptr + (first * size_of::<f32>()) as u64,
    }
}

/// One group of a grouped product over per-edge values: where its run of values starts
/// (values after run 0's start) and its columns of the dense operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GroupSlice {
    values: usize,
    first_column: usize,
    columns: usize,
}

/// The groups of a product with `groups` groups of `w` columns over runs `stride` values
/// apart: group g reads run g and columns `g·w..(g+1)·w` (the CPU's head-major layout).
fn group_slices(groups: usize, stride: usize, w: usize) -> impl Iterator<Item = GroupSlice> {
    (0..groups).map(move |g| GroupSlice {
        values: g * stride,
        first_column: g * w,
        columns: w,
    })
}

impl<H, N, K> GpuDistSpmm<H, N, K>
where
    H: Deref,
    H::Target: AllGather + AllReduce + Sized,
    N: Deref<Target = NcclComm>,
    K: ChunkSource,
{
    /// Builds rank `host.rank()`'s operator for `chunk` under `schedule` on the GPU of `nccl`
    /// (collective over `host`, whose ranks must be `nccl`'s).
    ///
    /// # Errors
    /// As [`DistSpmm::new`](crate::DistSpmm::new); a rank that cannot upload its chunk (no
    /// device, out of memory) gets [`DistSpmmError::Comm`] and the others a
    /// [`DistSpmmError::Disagreement`] naming it.
    pub fn new(host: H, nccl: N, chunk: K, schedule: ScheduleKind) -> Result<Self, DistSpmmError> {
        Self::with_precision(host, nccl, chunk, schedule, Precision::F32)
    }

    /// [`new`](Self::new) with the rows and partial sums travelling in `precision`, as
    /// [`DistSpmm::with_precision`](crate::DistSpmm::with_precision): each message is narrowed
    /// from `f32` on the device just before it is handed to NCCL and widened back to `f32`
    /// where it arrives (the CPU operator's conversions, bit for bit); products and sums stay
    /// in `f32`, and the rows a rank multiplies from its own `X_p` are never converted. `f32`
    /// moves the values as they are. The ranks agree on the precision with the partition.
    ///
    /// # Errors
    /// As [`new`](Self::new); a rank that chose another precision than rank 0 is a
    /// [`DistSpmmError::Disagreement`] on every rank.
    pub fn with_precision(
        host: H,
        nccl: N,
        chunk: K,
        schedule: ScheduleKind,
        precision: Precision,
    ) -> Result<Self, DistSpmmError> {
        let agreed =
            operator::agree_and_build(&*host, chunk, (schedule, precision), |view, s, blocks| {
                GpuEngine::<H, N>::build(&*host, &nccl, view, s, &blocks.edges)
            })?;
        Ok(agreed.with_engine(|(dev, m, scatter)| GpuEngine {
            host,
            nccl,
            dev,
            m,
            scatter,
            packed: Flat::default(),
            halo: Flat::default(),
            ws: [Flat::default(), Flat::default()],
            csc_values: Flat::default(),
            wire: [Halves::default(), Halves::default()],
            counted: Vec::new(),
        }))
    }

    /// `Y_p = (Â·X)_p` from this rank's `X_p` into `Y_p` (`n_p × F` each, any leading
    /// dimension, overwritten), both on [`device`](Self::device); queued on the device's stream
    /// (what [`DeviceDense::to_host`] waits for). Collective.
    ///
    /// # Errors
    /// As [`DistSpmm::forward`](crate::DistSpmm::forward); a matrix of another `GpuDevice`
    /// handle is a [`DistSpmmError::Shape`] (use [`device`](Self::device) to allocate).
    pub fn forward(&mut self, x: &DeviceDense, y: &mut DeviceDense) -> Result<(), DistSpmmError> {
        let local = self.same_device(&[x, y]);
        let stream = Some(self.engine.dev.stream());
        // SAFETY: both are live allocations of this operator's device with the extents
        // their raw() describes; `y` is borrowed mutably, so it is not `x`; the device stream
        // is live as long as the engine's device.
        unsafe { self.spmm_call(Op::Forward, x.raw(), y.raw(), stream, local) }
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
        let stream = Some(self.engine.dev.stream());
        // SAFETY: as in forward.
        unsafe { self.spmm_call(Op::Backward, dy.raw(), dx.raw(), stream, local) }
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
        unsafe { self.spmm_call(Op::Forward, x, y, stream, Ok(())) }
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
        unsafe { self.spmm_call(Op::Backward, dy, dx, stream, Ok(())) }
    }

    /// `Y_p = (A_e·X)_p` with the per-edge values `e` (an `edge_count() × 1` column in the
    /// [`EdgeLayout`](crate::EdgeLayout) order) in place of `Â`, on the device's stream, as
    /// [`DistSpmm::spmm_values`](crate::DistSpmm::spmm_values). Collective.
    ///
    /// # Errors
    /// As [`forward`](Self::forward); an `e` that is not one contiguous column of
    /// `edge_count()` values is a [`DistSpmmError::Shape`].
    pub fn spmm_values(
        &mut self,
        e: &DeviceDense,
        x: &DeviceDense,
        y: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.spmm_values_grouped(1, e, x, y)
    }

    /// [`spmm_values`](Self::spmm_values) for `groups` groups at once, as
    /// [`DistSpmm::spmm_values_grouped`](crate::DistSpmm::spmm_values_grouped): `e` is one
    /// contiguous column of `groups · edge_count()` values (run g first at `g·edge_count`),
    /// `X` and `Y` have `F = groups·C` columns, group g's product over columns
    /// `g·C..(g+1)·C`. One exchange of all F columns. Collective.
    ///
    /// # Errors
    /// As [`spmm_values`](Self::spmm_values); no group, F not a multiple of `groups` or `e`
    /// of another length than `groups · edge_count()` is a [`DistSpmmError::Shape`].
    pub fn spmm_values_grouped(
        &mut self,
        groups: usize,
        e: &DeviceDense,
        x: &DeviceDense,
        y: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.values_call(Op::SpmmValues, groups, e, x, y)
    }

    /// `dX_p = (A_eᵀ·dY)_p` with the per-edge values `e`, on the device's stream, as
    /// [`DistSpmm::spmm_values_transpose`](crate::DistSpmm::spmm_values_transpose).
    /// Collective.
    ///
    /// # Errors
    /// As [`spmm_values`](Self::spmm_values).
    pub fn spmm_values_transpose(
        &mut self,
        e: &DeviceDense,
        dy: &DeviceDense,
        dx: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.spmm_values_transpose_grouped(1, e, dy, dx)
    }

    /// [`spmm_values_transpose`](Self::spmm_values_transpose) for `groups` groups at once, `e`
    /// as in [`spmm_values_grouped`](Self::spmm_values_grouped); the CSC-ordered copy of the
    /// values holds `groups` runs. Collective.
    ///
    /// # Errors
    /// As [`spmm_values_grouped`](Self::spmm_values_grouped).
    pub fn spmm_values_transpose_grouped(
        &mut self,
        groups: usize,
        e: &DeviceDense,
        dy: &DeviceDense,
        dx: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.values_call(Op::SpmmValuesTranspose, groups, e, dy, dx)
    }

    fn values_call(
        &mut self,
        op: Op,
        groups: usize,
        e: &DeviceDense,
        input: &DeviceDense,
        output: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let (i, o) = op.operand_names();
        let same = self.same_device(&[e, input, output]);
        let (e, input_raw, output_raw) = (e.raw(), input.raw(), output.raw());
        let local = same.and_then(|()| {
            self.check_device_call(
                op.name(),
                groups,
                &[("E", &e), (i, &input_raw)],
                &[(o, &output_raw)],
            )
        });
        let run = Run {
            x: input_raw,
            y: output_raw,
            left: None,
            values: e.ptr,
            out: 0,
        };
        let stream = Some(self.engine.dev.stream());
        // SAFETY: live allocations of this operator's device (checked above, `e` through its
        // extent) with the extents their raw() describes; the output is borrowed mutably, so
        // it is none of the inputs; the device stream is live as long as the engine's device.
        unsafe { self.call_programs(op, groups, input_raw.cols, local, [run], stream) }
    }

    /// `E[k] = ⟨U_i, V_j⟩` over this rank's stored non-zeros into `e` (an `edge_count() × 1`
    /// column), on the device's stream, as [`DistSpmm::sddmm`](crate::DistSpmm::sddmm).
    /// Collective.
    ///
    /// # Errors
    /// As [`spmm_values`](Self::spmm_values).
    pub fn sddmm(
        &mut self,
        u: &DeviceDense,
        v: &DeviceDense,
        e: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.sddmm_grouped(1, u, v, e)
    }

    /// [`sddmm`](Self::sddmm) for `groups` groups at once, as
    /// [`DistSpmm::sddmm_grouped`](crate::DistSpmm::sddmm_grouped): `U` and `V` have
    /// `F = groups·w` columns, `e` is one contiguous column of `groups · edge_count()` values
    /// (run g first at `g·edge_count`), written in one pass over the edges. Collective.
    ///
    /// # Errors
    /// As [`spmm_values_grouped`](Self::spmm_values_grouped).
    pub fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: &DeviceDense,
        v: &DeviceDense,
        e: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let (u_raw, v_raw, e_raw) = (u.raw(), v.raw(), e.raw());
        let op = Op::Sddmm;
        let local = self.same_device(&[u, v, e]).and_then(|()| {
            self.check_device_call(
                op.name(),
                groups,
                &[("U", &u_raw), ("V", &v_raw)],
                &[("E", &e_raw)],
            )
        });
        let run = Run {
            x: v_raw,
            y: RawDense {
                rows: 0,
                cols: u_raw.cols,
                ld: u_raw.cols,
                ptr: 0,
            },
            left: Some(u_raw),
            values: 0,
            out: e_raw.ptr,
        };
        let stream = Some(self.engine.dev.stream());
        // SAFETY: as in spmm_values; `e` is borrowed mutably.
        unsafe { self.call_programs(op, groups, u_raw.cols, local, [run], stream) }
    }

    /// The gradients of [`sddmm`](Self::sddmm) (`dU`, `dV` overwritten), on the device's
    /// stream, as [`DistSpmm::sddmm_backward`](crate::DistSpmm::sddmm_backward). Collective.
    ///
    /// # Errors
    /// As [`spmm_values`](Self::spmm_values).
    pub fn sddmm_backward(
        &mut self,
        de: &DeviceDense,
        u: &DeviceDense,
        v: &DeviceDense,
        du: &mut DeviceDense,
        dv: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.sddmm_backward_grouped(1, de, u, v, du, dv)
    }

    /// The gradients of [`sddmm_grouped`](Self::sddmm_grouped), as
    /// [`DistSpmm::sddmm_backward_grouped`](crate::DistSpmm::sddmm_backward_grouped), `dE` in
    /// runs as the SDDMM wrote them. Collective.
    ///
    /// # Errors
    /// As [`spmm_values_grouped`](Self::spmm_values_grouped).
    pub fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &DeviceDense,
        u: &DeviceDense,
        v: &DeviceDense,
        du: &mut DeviceDense,
        dv: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let (de_raw, u_raw, v_raw) = (de.raw(), u.raw(), v.raw());
        let (du_raw, dv_raw) = (du.raw(), dv.raw());
        let op = Op::SddmmBackward;
        let local = self.same_device(&[de, u, v, du, dv]).and_then(|()| {
            self.check_device_call(
                op.name(),
                groups,
                &[("U", &u_raw), ("V", &v_raw), ("dE", &de_raw)],
                &[("dU", &du_raw), ("dV", &dv_raw)],
            )
        });
        let run = |x, y| Run {
            x,
            y,
            left: None,
            values: de_raw.ptr,
            out: 0,
        };
        let runs = [run(v_raw, du_raw), run(u_raw, dv_raw)];
        let stream = Some(self.engine.dev.stream());
        // SAFETY: as in spmm_values; `du` and `dv` are borrowed mutably.
        unsafe { self.call_programs(op, groups, u_raw.cols, local, runs, stream) }
    }

    fn same_device(&self, operands: &[&DeviceDense]) -> Result<(), DistSpmmError> {
        let ordinal = self.engine.dev.ordinal();
        if operands
            .iter()
            .all(|m| m.device().stream() == self.engine.dev.stream())
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

    /// The device operands of a call `name` with `groups` groups on this rank (see
    /// [`check_device_call`]).
    fn check_device_call(
        &self,
        name: &str,
        groups: usize,
        inputs: &[(&'static str, &RawDense)],
        outputs: &[(&'static str, &RawDense)],
    ) -> Result<(), DistSpmmError> {
        let rows = (self.local_rows(), self.edge_count());
        check_device_call(name, self.rank(), rows, groups, inputs, outputs)
    }

    /// An SpMM call with the chunk's values (`forward`, `backward`).
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw).
    unsafe fn spmm_call(
        &mut self,
        op: Op,
        input: RawDense,
        output: RawDense,
        stream: Option<RawStream>,
        local: Result<(), DistSpmmError>,
    ) -> Result<(), DistSpmmError> {
        let local = local.and_then(|()| {
            check_device_operands(op, self.rank(), self.local_rows(), &input, &output)
        });
        let run = Run {
            x: input,
            y: output,
            left: None,
            values: 0,
            out: 0,
        };
        // SAFETY: forwarded contract.
        unsafe { self.call_programs(op, 1, input.cols, local, [run], stream) }
    }

    /// The device the operator runs on; allocate the operands of
    /// [`forward`](Self::forward) and [`backward`](Self::backward) on it.
    pub fn device(&self) -> &GpuDevice {
        &self.engine.dev
    }

    /// The NCCL communicator.
    pub fn nccl(&self) -> &NcclComm {
        &self.engine.nccl
    }

    /// The host communicator the ranks agree over.
    pub fn host(&self) -> &H::Target {
        &self.engine.host
    }

    /// Device memory this operator holds: `buffers` the exchange buffers (with their 16-bit
    /// copies in bf16 and f16), row-splitting workspaces and the CSC-ordered copy of per-edge
    /// values (sized for the largest F and group count so far), `structure` the uploaded blocks (CSR and CSC), send lists, scatter
    /// plan, the CSR→CSC ranks once uploaded and the edge softmax's row table.
    pub fn workspace(&self) -> Workspace {
        self.engine.workspace()
    }
}

impl<H, N> GpuEngine<H, N>
where
    H: Deref,
    H::Target: AllGather + AllReduce + Sized,
    N: Deref<Target = NcclComm>,
{
    /// Opens the device and uploads what the schedule needs (local).
    fn build(
        host: &H::Target,
        nccl: &NcclComm,
        chunk: &ChunkView<'_>,
        schedule: &Schedule,
        edges: &EdgeLayout,
    ) -> Result<(GpuDevice, DeviceMatrices, Option<ScatterPlan>), DistSpmmError> {
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
        let n = chunk.num_local_nodes();
        let scatter = match schedule.kind {
            ScheduleKind::Halo => Some(scatter_plan(&schedule.layout, n)?),
            ScheduleKind::Broadcast => None,
        };
        let dev = GpuDevice::open(nccl.ordinal()).map_err(cuda)?;
        let m = upload(&dev, chunk, schedule, edges, scatter.as_ref())?;
        // The uploads ran on the device stream; the NCCL stream uses them next.
        dev.synchronize().map_err(cuda)?;
        tracing::debug!(
            rank = chunk.part_id(),
            ordinal = dev.ordinal(),
            schedule = ?schedule.kind,
            "uploaded the chunk for the GPU operator"
        );
        Ok((dev, m, scatter))
    }
}

/// Uploads the blocks the schedule names (the same host views the CPU operator uses), and
/// the per-edge layout's row table for the edge softmax.
fn upload(
    dev: &GpuDevice,
    chunk: &ChunkView<'_>,
    schedule: &Schedule,
    edges: &EdgeLayout,
    scatter: Option<&ScatterPlan>,
) -> Result<DeviceMatrices, DistSpmmError> {
    let diagonal = DeviceBlock::of(dev, &blocks::diagonal(chunk))?;
    let (mut remote, mut q_local, mut empty, mut halo) = (Vec::new(), Vec::new(), None, None);
    match schedule.kind {
        ScheduleKind::Halo => {
            remote = blocks::remote(chunk)
                .iter()
                .map(|(_, b)| DeviceBlock::of(dev, b))
                .collect::<Result<_, _>>()?;
            if let Some(plan) = scatter {
                halo = Some((
                    DeviceRows::new(dev, &schedule.layout.send_rows)?,
                    DeviceScatter::new(dev, plan)?,
                ));
            }
        }
        ScheduleKind::Broadcast => {
            q_local = blocks::q_local(chunk)
                .iter()
                .map(|b| {
                    b.as_ref()
                        .map(|b| {
                            let (csr, csc) = b.views(chunk);
                            let (csr, csc) = (&csr, &csc);
                            DeviceBlock::upload(
                                dev,
                                (csr.nrows(), csr.ncols()),
                                (csr.indptr(), csr.indices(), csr.data()),
                                (csc.indptr(), csc.indices(), csc.data()),
                            )
                        })
                        .transpose()
                })
                .collect::<Result<_, _>>()?;
            let widest =
                crate::backend::buffer_rows(schedule.program(Kind::Backward))[Buf::Packed as usize];
            let zeros = vec![0u64; widest + 1];
            empty = Some(DeviceCsr::new(
                dev,
                SparseParts {
                    nrows: widest,
                    ncols: chunk.num_local_nodes(),
                    indptr: &zeros,
                    indices: &[],
                    values: &[],
                },
            )?);
        }
    }
    let mut m = DeviceMatrices {
        diagonal,
        remote,
        q_local,
        empty,
        halo,
        csc_order: None,
        rows: None,
    };
    let mut table = Vec::with_capacity(edges.blocks().len());
    for (k, b) in edges.blocks().iter().enumerate() {
        let block = m.block(layout_block(schedule.kind, k, b))?;
        table.push(RawEdgeBlock {
            first: b.first,
            rowptr: block.csr.raw().indptr,
        });
    }
    // SAFETY: the row pointers are this operator's uploads of the layout's blocks (`n_p + 1`
    // non-decreasing entries each, validated with the chunk), alive as long as `m`, which
    // holds the table; block k's entries are the layout's run `first..first + len`, within
    // `edges.len()` and disjoint from the others'.
    m.rows =
        Some(unsafe { EdgeRows::from_device(dev, chunk.num_local_nodes(), edges.len(), &table) }?);
    Ok(m)
}

impl<H, N> Engine for GpuEngine<H, N>
where
    H: Deref,
    H::Target: AllGather + AllReduce + Sized,
    N: Deref<Target = NcclComm>,
{
    type Host = H::Target;
    type Operands<'a> = Run;
    type Stream = Option<RawStream>;

    fn host(&self) -> &H::Target {
        &self.host
    }

    /// Grows the buffers for a call of `op` with `groups` groups over `f` columns, after
    /// waiting for the streams that may still use the old ones; uploads the CSR→CSC ranks at
    /// the first transposed product over per-edge values.
    fn reserve(
        &mut self,
        s: &Shared<'_>,
        op: Op,
        groups: usize,
        f: usize,
    ) -> Result<(), DistSpmmError> {
        let rows = s.schedule.buffer_rows(op);
        let mut ws = [0usize; 2];
        for &kind in op.programs() {
            split_workspace(&self.m, s.schedule.program(kind), f, &mut ws)?;
        }
        let edges = &s.blocks.edges;
        let transposes = op.transposes_edges() && f > 0;
        if transposes && self.m.csc_order.is_none() {
            let order = CscOrder::new(&s.chunk, edges)?;
            let ranks: Vec<u32> = edges
                .blocks()
                .iter()
                .flat_map(|b| order.ranks(b).iter().copied())
                .collect();
            self.m.csc_order = Some(DeviceCscOrder::new(&self.dev, &ranks).map_err(cuda)?);
        }
        let (packed, halo) = (rows[Buf::Packed as usize] * f, rows[Buf::Halo as usize] * f);
        // The 16-bit copies, as the `f32` words that hold them.
        let copy = |len| match s.precision.half() {
            Some(_) => Halves::words(len),
            None => 0,
        };
        let wanted = [
            packed,
            halo,
            ws[0],
            ws[1],
            if transposes { groups * edges.len() } else { 0 },
            copy(packed),
            copy(halo),
        ];
        let bufs = [
            &self.packed,
            &self.halo,
            &self.ws[0],
            &self.ws[1],
            &self.csc_values,
            &self.wire[0].0,
            &self.wire[1].0,
        ];
        if !bufs.iter().zip(wanted).any(|(b, len)| b.needs(len)) {
            return Ok(());
        }
        let bytes = value_bytes(wanted.iter().sum());
        let alloc = |e: CudaError| DistSpmmError::Allocation {
            rank: 0,
            bytes,
            reason: e.to_string(),
        };
        // The old buffers may still be in use by the previous call's work.
        self.nccl.synchronize()?;
        self.dev.synchronize().map_err(cuda)?;
        let dev = &self.dev;
        let [ws_comm, ws_local] = &mut self.ws;
        let [wire_packed, wire_halo] = &mut self.wire;
        let bufs = [
            &mut self.packed,
            &mut self.halo,
            ws_comm,
            ws_local,
            &mut self.csc_values,
            &mut wire_packed.0,
            &mut wire_halo.0,
        ];
        for (buf, len) in bufs.into_iter().zip(wanted) {
            buf.grow(dev, len).map_err(alloc)?;
        }
        // Allocated (and zeroed) on the device stream; the NCCL stream uses them too.
        dev.synchronize().map_err(cuda)
    }

    /// Queues the programs in order on the operator's streams, ordered after `stream`'s work
    /// (the NCCL stream's when `None`) and before its later work.
    unsafe fn execute<'a, I>(
        &mut self,
        s: &Shared<'_>,
        groups: usize,
        f: usize,
        programs: I,
        stream: Option<RawStream>,
    ) -> Result<(), DistSpmmError>
    where
        I: IntoIterator<Item = (Kind, Self::Operands<'a>)>,
    {
        let main = RawStream(self.nccl.raw_stream());
        let streams = Streams {
            caller: stream.unwrap_or(main),
            main,
            side: self.dev.stream(),
        };
        let parts = s.chunk.num_parts();
        let mut joined = false;
        self.counted.clear();
        for (k, (kind, run)) in programs.into_iter().enumerate() {
            if f == 0 && kind == Kind::Sddmm {
                self.counted.push(Traffic::default());
                // SAFETY: forwarded contract.
                unsafe { self.zero_edges(s, groups, run.out, streams.caller)? };
                continue;
            }
            if f == 0 || run.x.rows == 0 && parts == 1 {
                // Nothing to compute, and nothing travels.
                self.counted.push(Traffic::default());
                continue;
            }
            let mut call = GpuCall {
                dev: &self.dev,
                nccl: &self.nccl,
                m: &self.m,
                edges: &s.blocks.edges,
                packed: &self.packed,
                halo: &self.halo,
                ws: [&self.ws[0], &self.ws[1]],
                csc: &self.csc_values,
                wire: [&self.wire[0], &self.wire[1]],
                call: WireCall {
                    precision: s.precision,
                    f,
                    rank: self.nccl.rank(),
                    size: self.nccl.size(),
                },
                moved: Traffic::default(),
                run,
                groups,
                streams,
                f,
            };
            // SAFETY: the caller's contract covers the operands and its stream; the NCCL and
            // device streams are live as long as `self`. A later program's local lane starts
            // after the earlier program's end.
            unsafe {
                if !joined {
                    call.join_raw(streams.main, streams.caller)?;
                    call.join_raw(streams.side, streams.caller)?;
                    joined = true;
                } else if k > 0 {
                    call.join_raw(streams.side, streams.main)?;
                }
            }
            run_program(&mut call, s.schedule.program(kind))?;
            self.counted.push(call.moved);
        }
        if joined {
            // SAFETY: as above.
            unsafe {
                self.dev
                    .join_streams(Some(streams.caller), Some(streams.main))
            }
            .map_err(cuda)?;
        }
        Ok(())
    }

    fn workspace(&self) -> Workspace {
        let buffers = [
            &self.packed,
            &self.halo,
            &self.ws[0],
            &self.ws[1],
            &self.csc_values,
            &self.wire[0].0,
            &self.wire[1].0,
        ]
        .iter()
        .map(|b| b.len())
        .sum::<usize>();
        Workspace {
            buffers: value_bytes(buffers),
            structure: self.m.bytes(self.scatter.as_ref()),
        }
    }

    fn counted(&self) -> Option<&[Traffic]> {
        Some(&self.counted)
    }
}

impl<H, N> GpuEngine<H, N>
where
    N: Deref<Target = NcclComm>,
{
    /// `out = 0` in every group's run of every block: the SDDMM of no columns (nothing
    /// travels), on `stream`.
    ///
    /// # Safety
    /// `out` addresses `groups · edge_count()` f32 of this operator's device, alive until the
    /// work queued on `stream` (a live stream of the device's context) has finished.
    unsafe fn zero_edges(
        &self,
        s: &Shared<'_>,
        groups: usize,
        out: u64,
        stream: RawStream,
    ) -> Result<(), DistSpmmError> {
        let edges = &s.blocks.edges;
        for (k, b) in edges.blocks().iter().enumerate() {
            let block = layout_block(s.schedule.kind, k, b);
            let pattern = self.m.block(block)?.csr.raw();
            let none = |rows| RawDense {
                rows,
                cols: 0,
                ld: 0,
                ptr: 0,
            };
            let runs = RawEdgeRuns {
                ptr: out + 4 * b.first as u64,
                groups,
                len: b.len,
                stride: edges.len(),
            };
            // SAFETY: the pattern is this operator's upload; U and V have no columns, so the
            // kernel reads neither; `runs` are the block's runs of the caller's `out`.
            unsafe {
                self.dev.sddmm_grouped_raw(
                    &pattern,
                    none(pattern.nrows),
                    none(pattern.ncols),
                    runs,
                    Some(stream),
                )
            }
            .map_err(cuda)?;
        }
        Ok(())
    }
}

/// Per-edge softmax calls of the GPU operator, as the CPU operator's (local to the rank: no
/// communication), on the device's stream over the operator's uploaded row pointers.
impl<H, N, K> GpuDistSpmm<H, N, K>
where
    H: Deref,
    H::Target: AllGather + AllReduce + Sized,
    N: Deref<Target = NcclComm>,
    K: ChunkSource,
{
    /// The softmax of `logits` over each row's entries into `out` (one contiguous column of
    /// [`edge_count`](Self::edge_count) values each), as
    /// [`DistSpmm::edge_softmax`](crate::DistSpmm::edge_softmax). Local.
    ///
    /// # Errors
    /// [`DistSpmmError::Shape`] when an operand is not one contiguous column of
    /// `edge_count()` values or belongs to another device handle; device errors.
    pub fn edge_softmax(
        &self,
        logits: &DeviceDense,
        out: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.softmax("edge_softmax", None, logits, out)
    }

    /// [`edge_softmax`](Self::edge_softmax) of `LeakyReLU_slope(logits)`, fused, as
    /// [`DistSpmm::leaky_relu_edge_softmax`](crate::DistSpmm::leaky_relu_edge_softmax).
    ///
    /// # Errors
    /// As [`edge_softmax`](Self::edge_softmax).
    pub fn leaky_relu_edge_softmax(
        &self,
        slope: f32,
        logits: &DeviceDense,
        out: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.softmax("leaky_relu_edge_softmax", Some(slope), logits, out)
    }

    /// The gradient of [`edge_softmax`](Self::edge_softmax) from its result `out` and
    /// `d_out` into `d_logits`, as
    /// [`DistSpmm::edge_softmax_backward`](crate::DistSpmm::edge_softmax_backward).
    ///
    /// # Errors
    /// As [`edge_softmax`](Self::edge_softmax).
    pub fn edge_softmax_backward(
        &self,
        out: &DeviceDense,
        d_out: &DeviceDense,
        d_logits: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        self.softmax_backward("edge_softmax_backward", None, out, d_out, d_logits)
    }

    /// The gradient of [`leaky_relu_edge_softmax`](Self::leaky_relu_edge_softmax) with
    /// respect to the pre-activation `logits`, as
    /// [`DistSpmm::leaky_relu_edge_softmax_backward`](crate::DistSpmm::leaky_relu_edge_softmax_backward).
    ///
    /// # Errors
    /// As [`edge_softmax`](Self::edge_softmax).
    pub fn leaky_relu_edge_softmax_backward(
        &self,
        slope: f32,
        logits: &DeviceDense,
        out: &DeviceDense,
        d_out: &DeviceDense,
        d_logits: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let name = "leaky_relu_edge_softmax_backward";
        self.softmax_backward(name, Some((slope, logits)), out, d_out, d_logits)
    }

    fn softmax_rows(&self) -> Result<&EdgeRows, DistSpmmError> {
        self.engine
            .m
            .rows
            .as_ref()
            .ok_or_else(|| internal("no row table for the edge softmax"))
    }

    fn softmax(
        &self,
        name: &str,
        slope: Option<f32>,
        logits: &DeviceDense,
        out: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let (z, o) = (logits.raw(), out.raw());
        self.same_device(&[logits, out])?;
        self.check_device_call(name, 1, &[("logits", &z)], &[("out", &o)])?;
        distspmm_cuda::edge_softmax(self.softmax_rows()?, slope, logits, out).map_err(cuda)
    }

    fn softmax_backward(
        &self,
        name: &str,
        leaky: Option<(f32, &DeviceDense)>,
        out: &DeviceDense,
        d_out: &DeviceDense,
        d_logits: &mut DeviceDense,
    ) -> Result<(), DistSpmmError> {
        let (o, d, dz) = (out.raw(), d_out.raw(), d_logits.raw());
        self.same_device(&[out, d_out, d_logits])?;
        let z = leaky.map(|(_, z)| z.raw());
        if let Some((_, z)) = leaky {
            self.same_device(&[z])?;
        }
        let mut inputs = vec![("out", &o), ("d_out", &d)];
        if let Some(z) = &z {
            inputs.push(("logits", z));
        }
        self.check_device_call(name, 1, &inputs, &[("d_logits", &dz)])?;
        distspmm_cuda::edge_softmax_backward(self.softmax_rows()?, leaky, out, d_out, d_logits)
            .map_err(cuda)
    }
}

/// The largest row-splitting workspace the products of `program` need on each lane.
fn split_workspace(
    m: &DeviceMatrices,
    program: &[Instr],
    f: usize,
    ws: &mut [usize; 2],
) -> Result<(), DistSpmmError> {
    for instr in program {
        match instr {
            Instr::Spmm(Product {
                lane, a, orient, ..
            }) => {
                let (_, split) = m.block(*a)?.oriented(*orient);
                let len = split.map_or(0, |s| s.workspace_len(f));
                let slot = &mut ws[lane_index(*lane)];
                *slot = (*slot).max(len);
            }
            Instr::Exchange(ex) => split_workspace(m, &ex.body, f, ws)?,
            _ => {}
        }
    }
    Ok(())
}

impl<H, N> Drop for GpuEngine<H, N>
where
    N: Deref<Target = NcclComm>,
{
    /// The device memory is freed in the order of the device stream, but the last call may
    /// still be using it on the NCCL stream: make the device stream wait for that first (no
    /// host wait).
    fn drop(&mut self) {
        let main = RawStream(self.nccl.raw_stream());
        // SAFETY: both streams are live: `self` holds the NCCL communicator, and the device
        // stream lives as long as `self.dev`.
        if let Err(e) = unsafe { self.dev.join_streams(None, Some(main)) } {
            tracing::warn!(error = %e, "ordering the GPU operator's release after its last call failed; waiting instead");
            let _ = self.nccl.synchronize();
        }
    }
}

/// One call of a program on the device: the operator's uploads and buffers (reserved for F
/// columns), the caller's operands and the three streams.
///
/// Every primitive queues work without waiting. The memory it names is the caller's operands
/// (covered by the raw calls' safety contract) and this operator's own buffers, which are only
/// replaced by `reserve` after both streams have been waited for.
struct GpuCall<'g> {
    dev: &'g GpuDevice,
    nccl: &'g NcclComm,
    m: &'g DeviceMatrices,
    /// The layout of the per-edge operand.
    edges: &'g EdgeLayout,
    packed: &'g Flat,
    halo: &'g Flat,
    ws: [&'g Flat; 2],
    /// Room for per-edge values in CSC order.
    csc: &'g Flat,
    /// The 16-bit copies of [`Buf::Packed`] and [`Buf::Halo`] (reserved in bf16 and f16).
    wire: [&'g Halves; 2],
    /// The precision, F, rank and ranks the messages move with.
    call: WireCall,
    /// The bytes handed to NCCL so far in this program.
    moved: Traffic,
    /// The program's operands.
    run: Run,
    /// The call's group count G: F splits into G groups of columns, each product over
    /// per-edge values and each SDDMM into G runs of `edge_count()` values.
    groups: usize,
    streams: Streams,
    f: usize,
}

impl GpuCall<'_> {
    fn stream(&self, lane: Lane) -> RawStream {
        match lane {
            Lane::Comm => self.streams.main,
            Lane::Local => self.streams.side,
        }
    }

    fn buf(&self, b: Buf) -> &Flat {
        match b {
            Buf::Packed => self.packed,
            Buf::Halo => self.halo,
        }
    }

    /// The region as a packed `rows × F` matrix, after checking it lies inside its buffer.
    fn region(&self, r: &Region) -> Result<RawDense, DistSpmmError> {
        let buf = self.buf(r.buf);
        if r.end() * self.f > buf.len() {
            return Err(internal("a region lies beyond its buffer"));
        }
        Ok(buf.rows(r.first, r.rows, self.f))
    }

    fn dense(&self, d: Dense) -> Result<RawDense, DistSpmmError> {
        match d {
            Dense::Input => Ok(self.run.x),
            Dense::Output => Ok(self.run.y),
            Dense::Left => self
                .run
                .left
                .ok_or_else(|| internal("the program reads U outside an SDDMM")),
            Dense::Region(r) => self.region(&r),
        }
    }

    /// # Safety
    /// Both are live streams of the device's context.
    unsafe fn join_raw(
        &self,
        waiter: RawStream,
        signaller: RawStream,
    ) -> Result<(), DistSpmmError> {
        // SAFETY: forwarded contract.
        unsafe { self.dev.join_streams(Some(waiter), Some(signaller)) }.map_err(cuda)
    }

    /// `Y = A·X + β·Y` on `lane`'s stream with `a`'s row-splitting plan and that lane's
    /// workspace.
    fn product(
        &self,
        lane: Lane,
        (a, split): (RawCsr, Option<&DeviceRowSplit>),
        x: RawDense,
        beta: f32,
        y: RawDense,
    ) -> Result<(), DistSpmmError> {
        let split = split.map(|plan| RawSplit {
            plan,
            workspace: self.ws[lane_index(lane)].workspace(),
        });
        let op = RawSpmm {
            alpha: 1.0,
            a,
            x,
            beta,
            y,
        };
        // SAFETY: the matrix and plan are this operator's uploads; `x` and `y` are the
        // caller's operands (its contract) or regions checked to lie in this operator's
        // buffers, which a program never reads and writes in one product; each lane has its
        // own split workspace; both streams are live (see `GpuCall`).
        unsafe {
            self.dev
                .spmm_raw(&op, Strategy::Auto, split, Some(self.stream(lane)))
        }
        .map(|_| ())
        .map_err(cuda)
    }

    /// The address of the 16-bit copy of `r`, after checking it lies inside the copy.
    fn copy(&self, r: &Region) -> Result<u64, DistSpmmError> {
        let copy = self.wire[match r.buf {
            Buf::Packed => 0,
            Buf::Halo => 1,
        }];
        if r.end() * self.f > copy.len() {
            return Err(internal("a region lies beyond its 16-bit copy"));
        }
        Ok(copy.at(r.first * self.f))
    }

    /// A message as NCCL takes it: the region's `f32` values (`fmt` `None`) or the bytes of
    /// its 16-bit copy, `payload.len` elements of either.
    fn segment(
        &self,
        fmt: Option<Half>,
        p: &Payload,
    ) -> Result<(usize, RawDeviceBuffer), DistSpmmError> {
        let (ptr, bytes) = match fmt {
            None => (self.region(&p.region)?.ptr, size_of::<f32>()),
            Some(_) => (self.copy(&p.region)?, size_of::<u16>()),
        };
        if p.len * self.call.element_bytes() != p.region.rows * self.f * bytes {
            return Err(internal("a message's length is not its region's"));
        }
        Ok((p.peer, RawDeviceBuffer { ptr, len: p.len }))
    }

    fn segments(
        &self,
        fmt: Option<Half>,
        list: &[Payload],
    ) -> Result<Vec<(usize, RawDeviceBuffer)>, DistSpmmError> {
        list.iter().map(|p| self.segment(fmt, p)).collect()
    }

    /// Converts `r` between its `f32` values and its 16-bit copy on the NCCL stream.
    fn convert(&self, fmt: Half, r: Region, narrow: bool) -> Result<(), DistSpmmError> {
        let (wide, copy) = (self.region(&r)?.ptr, self.copy(&r)?);
        let (fmt, len, stream) = (half_format(fmt), r.rows * self.f, Some(self.streams.main));
        // SAFETY: `wide` and `copy` are the region in this operator's buffer and in its 16-bit
        // copy (both checked to hold its `len` values, separate allocations), which the
        // buffers keep until both streams have been waited for; the NCCL stream is live.
        unsafe {
            if narrow {
                self.dev.narrow_raw(fmt, wide, copy, len, stream)
            } else {
                self.dev.widen_raw(fmt, copy, wide, len, stream)
            }
        }
        .map_err(cuda)
    }

    /// The regions of `list` as one stacked matrix (they must follow each other).
    fn stacked(&self, list: &[Region]) -> Result<RawDense, DistSpmmError> {
        let Some(first) = list.first() else {
            return Err(internal("nothing to add"));
        };
        let mut end = first.first;
        for r in list {
            if r.buf != first.buf || r.first != end {
                return Err(internal("the blocks to add do not follow each other"));
            }
            end = r.end();
        }
        self.region(&Region::new(first.buf, first.first, end - first.first))
    }
}

impl Backend for GpuCall<'_> {
    fn spmm(&mut self, p: &Product) -> Result<(), DistSpmmError> {
        let block = self.m.block(p.a)?;
        let (a, split) = block.oriented(p.orient);
        let (x, y) = (self.dense(p.x)?, self.dense(p.y)?);
        if p.values == Values::Chunk {
            return self.product(p.lane, (a, split), x, p.acc.beta(), y);
        }
        let (first, nnz) = edge_run(self.edges, p.a)?;
        if self.run.values == 0 && nnz > 0 {
            return Err(internal("a product over per-edge values without them"));
        }
        let stride = self.edges.len();
        let csr = self.run.values + 4 * first as u64;
        let values = match p.orient {
            Orient::Plain => csr,
            Orient::Transposed => {
                let order = self
                    .m
                    .csc_order
                    .as_ref()
                    .ok_or_else(|| internal("no CSR→CSC ranks for a transposed product"))?;
                if (self.groups - 1) * stride + first + nnz > self.csc.len() {
                    return Err(internal("no room for per-edge values in CSC order"));
                }
                let csc = self.csc.ptr() + 4 * first as u64;
                let copy = RawCscValues {
                    order,
                    first,
                    nnz,
                    rowptr: block.csr.raw().indptr,
                    rows: block.csc.raw().indices,
                    csr,
                    csc,
                    groups: self.groups,
                    stride,
                };
                // SAFETY: the row pointers and row ids are this operator's upload of one
                // block (CSR and CSC of the same entries, the ranks derived from them); `csr`
                // is the block's runs of the caller's edge operand (its contract, G runs of
                // `stride` values), `csc` the block's runs of this operator's scratch (checked
                // to fit); the lane's stream is live.
                unsafe { self.dev.csc_values_raw(&copy, Some(self.stream(p.lane))) }
                    .map_err(cuda)?;
                csc
            }
        };
        // Group g: its run of values over its columns of X and Y (one group: all of them).
        let w = self.f / self.groups;
        for g in group_slices(self.groups, stride, w) {
            let a = RawCsr {
                values: values + 4 * g.values as u64,
                ..a
            };
            let (xg, yg) = (
                columns(x, g.first_column, g.columns),
                columns(y, g.first_column, g.columns),
            );
            self.product(p.lane, (a, split), xg, p.acc.beta(), yg)?;
        }
        Ok(())
    }

    fn sddmm(
        &mut self,
        lane: Lane,
        block: Matrix,
        u: Dense,
        v: Dense,
        out: Values,
    ) -> Result<(), DistSpmmError> {
        if out != Values::Edges || self.run.out == 0 {
            return Err(internal("an SDDMM without an edge operand to write"));
        }
        let pattern = self.m.block(block)?.csr.raw();
        let (first, nnz) = edge_run(self.edges, block)?;
        let out = RawEdgeRuns {
            ptr: self.run.out + 4 * first as u64,
            groups: self.groups,
            len: nnz,
            stride: self.edges.len(),
        };
        let (u, v) = (self.dense(u)?, self.dense(v)?);
        // SAFETY: the pattern is this operator's upload; `u` and `v` are the caller's operands
        // or regions checked to lie in this operator's buffers; `out` is the block's runs of
        // the caller's edge operand, which no other instruction of the program writes; the
        // lane's stream is live.
        unsafe {
            self.dev
                .sddmm_grouped_raw(&pattern, u, v, out, Some(self.stream(lane)))
        }
        .map_err(cuda)
    }

    fn zero(&mut self, into: Region) -> Result<(), DistSpmmError> {
        let empty = self
            .m
            .empty
            .as_ref()
            .ok_or_else(|| internal("no empty matrix for a zero contribution"))?;
        if into.rows > empty.nrows() {
            return Err(internal("a zero contribution wider than the empty matrix"));
        }
        let a = RawCsr {
            nrows: into.rows,
            ..empty.raw()
        };
        let y = self.region(&into)?;
        self.product(Lane::Comm, (a, None), self.run.x, 0.0, y)
    }

    fn pack(&mut self, which: Rows, into: Region) -> Result<(), DistSpmmError> {
        let rows = match which {
            Rows::All => None,
            Rows::SendLists => Some(
                &self
                    .m
                    .halo
                    .as_ref()
                    .ok_or_else(|| internal("no send lists to pack"))?
                    .0,
            ),
        };
        let out = self.region(&into)?;
        // SAFETY: `x` is the caller's operand, `out` a region checked to lie in this
        // operator's packed buffer; the send lists are this operator's upload; the NCCL stream
        // is live.
        unsafe {
            self.dev
                .gather_rows_raw(self.run.x, rows, out, Some(self.streams.main))
        }
        .map_err(cuda)
    }

    fn broadcast(&mut self, region: Region, root: usize) -> Result<(), DistSpmmError> {
        wire::broadcast(self, region, root)
    }

    fn exchange(&mut self, ex: &Exchange) -> Result<(), DistSpmmError> {
        wire::exchange(self, ex)?;
        // The body is queued after the exchange (and the widening of what it received) on the
        // NCCL stream, or ordered after it by a join, so it sees the received rows.
        run_program(self, &ex.body)
    }

    fn join(&mut self, waiter: Lane, signaller: Lane) -> Result<(), DistSpmmError> {
        // SAFETY: the operator's two streams are live (see `GpuCall`).
        unsafe { self.join_raw(self.stream(waiter), self.stream(signaller)) }
    }

    fn scatter_add(&mut self, from: &[Message]) -> Result<(), DistSpmmError> {
        let scatter = &self
            .m
            .halo
            .as_ref()
            .ok_or_else(|| internal("no scatter plan"))?
            .1;
        let regions: Vec<Region> = from.iter().map(|m| m.region).collect();
        if regions.is_empty() {
            return Ok(());
        }
        let incoming = self.stacked(&regions)?;
        if regions[0].first != 0 || incoming.rows != scatter.packed_rows() {
            return Err(internal("a scatter-add that is not the whole send layout"));
        }
        // SAFETY: `incoming` lies in this operator's packed buffer (checked), `y` is the
        // caller's operand; the plan is this operator's upload; the NCCL stream is live.
        unsafe {
            self.dev
                .scatter_add_raw(scatter, incoming, self.run.y, Some(self.streams.main))
        }
        .map_err(cuda)
    }

    fn add_blocks(&mut self, from: &[Region]) -> Result<(), DistSpmmError> {
        let stacked = self.stacked(from)?;
        // SAFETY: `stacked` lies in this operator's buffer (checked), `y` is the caller's
        // operand; the NCCL stream is live.
        unsafe {
            self.dev
                .add_blocks_raw(stacked, self.run.y, Some(self.streams.main))
        }
        .map_err(cuda)
    }
}

/// The transport steps of [`wire`] on the device: conversions and NCCL calls on the NCCL
/// stream, in the order the steps give them.
impl Transport for GpuCall<'_> {
    fn call(&self) -> WireCall {
        self.call
    }

    fn moved(&mut self) -> &mut Traffic {
        &mut self.moved
    }

    fn narrow(&mut self, fmt: Half, region: Region) -> Result<(), DistSpmmError> {
        self.convert(fmt, region, true)
    }

    fn widen(&mut self, fmt: Half, region: Region) -> Result<(), DistSpmmError> {
        self.convert(fmt, region, false)
    }

    fn hand_over(
        &mut self,
        fmt: Option<Half>,
        sends: &[Payload],
        recvs: &[Payload],
    ) -> Result<(), DistSpmmError> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        let (out, inc) = (self.segments(fmt, sends)?, self.segments(fmt, recvs)?);
        // SAFETY: the segments lie inside this operator's buffers or their 16-bit copies on
        // the NCCL communicator's device (checked), receive segments are disjoint regions of
        // the other buffer (or its copy) than the sends (a program's rule); the buffers are
        // only replaced after both streams have been waited for.
        unsafe {
            match fmt {
                None => self.nccl.halo_exchange_raw::<f32>(&out, &inc),
                Some(_) => self.nccl.halo_exchange_raw::<u8>(&out, &inc),
            }
        }?;
        Ok(())
    }

    fn hand_over_broadcast(
        &mut self,
        fmt: Option<Half>,
        payload: Payload,
    ) -> Result<(), DistSpmmError> {
        let (root, buf) = self.segment(fmt, &payload)?;
        // SAFETY: the segment lies in this operator's buffer or its 16-bit copy on the NCCL
        // communicator's device (checked), reserved for F columns and alive until the queued
        // work has finished.
        unsafe {
            match fmt {
                None => self.nccl.broadcast_raw::<f32>(buf, root),
                Some(_) => self.nccl.broadcast_raw::<u8>(buf, root),
            }
        }?;
        Ok(())
    }
}

/// The device operands of an SpMM call: `n × F` each (as on the CPU) and the rules of
/// [`operands`](crate::operands) (leading dimension, extent, NULL, alignment, no overlap).
fn check_device_operands(
    op: Op,
    rank: usize,
    n: usize,
    input: &RawDense,
    output: &RawDense,
) -> Result<(), DistSpmmError> {
    let (name_in, name_out) = op.operand_names();
    check_device_call(
        op.name(),
        rank,
        (n, 0),
        1,
        &[(name_in, input)],
        &[(name_out, output)],
    )
}

/// The names of per-edge operands in the device calls' messages.
const EDGE_OPERANDS: [&str; 6] = ["E", "dE", "logits", "out", "d_out", "d_logits"];

/// The device operands of any call (`call` names it in messages) with `groups` groups: dense
/// ones `n × F` (F the first's columns), per-edge ones (named in [`EDGE_OPERANDS`]) one
/// contiguous column of `groups · nnz` values (`ld = 1`, F splitting into the groups:
/// [`check_groups`]), then the rules of [`operands`](crate::operands) over all of them,
/// outputs against everything else.
fn check_device_call(
    call: &str,
    rank: usize,
    (n, nnz): (usize, usize),
    groups: usize,
    inputs: &[(&'static str, &RawDense)],
    outputs: &[(&'static str, &RawDense)],
) -> Result<(), DistSpmmError> {
    let is_edges = |name: &str| EDGE_OPERANDS.contains(&name);
    let all = || inputs.iter().chain(outputs);
    let dense: Vec<(&str, (usize, usize))> = all()
        .filter(|(name, _)| !is_edges(name))
        .map(|&(name, d)| (name, (d.rows, d.cols)))
        .collect();
    let edges: Vec<(&str, usize)> = all()
        .filter(|(name, _)| is_edges(name))
        .map(|&(name, d)| (name, d.rows))
        .collect();
    check_operands(call, rank, n, &dense, &[])?;
    let f = dense.first().map_or(0, |&(_, (_, f))| f);
    check_groups(call, rank, groups, f, &edges, nnz)?;
    if let Some((name, d)) = all().find(|(name, d)| is_edges(name) && (d.cols != 1 || d.ld != 1)) {
        return Err(DistSpmmError::Shape(format!(
            "{call} on rank {rank}: {name} is {} × {} with leading dimension {}; per-edge values \
             are one contiguous column (groups · edge_count() × 1, ld 1)",
            d.rows, d.cols, d.ld
        )));
    }
    let operand = |&(name, d): &(&'static str, &RawDense)| Operand {
        name,
        addr: d.ptr,
        rows: d.rows,
        cols: d.cols,
        ld: d.ld,
    };
    let ins: Vec<Operand> = inputs.iter().map(operand).collect();
    let outs: Vec<Operand> = outputs.iter().map(operand).collect();
    check_all(&ins, &outs).map_err(|e| DistSpmmError::Shape(format!("{call} on rank {rank}: {e}")))
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]
mod tests {
    use super::*;
    use crate::tests::{chunks, views};

    #[test]
    fn cuda_errors_are_the_communicators_device_errors() {
        let e = DistSpmmError::from(CudaError::NoDevice("no libcuda".into()));
        assert_eq!(
            e,
            DistSpmmError::Comm(CommError::NoDevice("no libcuda".into()))
        );
        let e = DistSpmmError::from(CudaError::Driver {
            call: "cuStreamCreate",
            message: "out of memory".into(),
        });
        assert_eq!(
            e,
            DistSpmmError::Comm(CommError::Cuda {
                call: "cuStreamCreate",
                message: "out of memory".into()
            })
        );
        assert!(!e.is_collective());
    }

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
        shape(
            check(x, dense(10, 4, 3, 0x20_000)),
            "leading dimension of Y is 3",
        );
        shape(check(dense(10, 4, 4, 0), y), "X is NULL");
        shape(check(x, dense(10, 4, 4, 0x10_000 + 4 * 37)), "overlap");
        assert_eq!(check(x, dense(10, 4, 4, 0x10_000 + 4 * 40)), Ok(()));
        shape(check(dense(10, 4, usize::MAX, 0x10_000), y), "overflow");
        let empty = |ptr| dense(0, 4, 4, ptr);
        assert_eq!(
            check_device_operands(Op::Backward, 0, 0, &empty(0), &empty(0)),
            Ok(())
        );
    }

    #[test]
    fn a_16_bit_copy_holds_two_values_per_word() {
        assert_eq!(
            [0, 1, 2, 3, 8].map(Halves::words),
            [0, 1, 1, 2, 4],
            "words for 0, 1, 2, 3, 8 values"
        );
        let none = Halves::default();
        assert_eq!(none.len(), 0);
        assert_eq!(none.at(5), 10);
        assert_eq!(
            [Half::Bf16, Half::F16].map(half_format),
            [HalfFormat::Bf16, HalfFormat::F16]
        );
    }

    #[test]
    fn a_group_reads_its_run_and_its_columns() {
        let got: Vec<GroupSlice> = group_slices(3, 10, 4).collect();
        let want = |g: usize| GroupSlice {
            values: 10 * g,
            first_column: 4 * g,
            columns: 4,
        };
        assert_eq!(got, vec![want(0), want(1), want(2)]);
        let x = columns(dense(5, 12, 16, 0x1000), 8, 4);
        assert_eq!(x, dense(5, 4, 16, 0x1000 + 32));
    }

    #[test]
    fn grouped_device_operands_are_checked_on_the_host() {
        let check = |groups, e: RawDense| {
            check_device_call(
                "spmm_values_grouped",
                0,
                (10, 7),
                groups,
                &[("E", &e), ("X", &dense(10, 6, 6, 0x10_000))],
                &[("Y", &dense(10, 6, 6, 0x20_000))],
            )
        };
        let shape = |r: Result<(), DistSpmmError>, text: &str| match r {
            Err(DistSpmmError::Shape(m)) => assert!(m.contains(text), "{m}"),
            other => panic!("expected a shape error with {text:?}, got {other:?}"),
        };
        assert_eq!(check(3, dense(21, 1, 1, 0x30_000)), Ok(()));
        assert_eq!(check(1, dense(7, 1, 1, 0x30_000)), Ok(()));
        shape(check(3, dense(7, 1, 1, 0x30_000)), "3 groups");
        shape(
            check(4, dense(28, 1, 1, 0x30_000)),
            "do not split into 4 groups",
        );
        shape(
            check(0, dense(0, 1, 1, 0x30_000)),
            "do not split into 0 groups",
        );
        shape(check(2, dense(14, 2, 2, 0x30_000)), "one contiguous column");
        shape(check(3, dense(21, 1, 1, 0x20_000 + 8)), "overlap");
    }

    #[test]
    fn the_scatter_plan_adds_in_increasing_peer() {
        // A ring of 12 nodes with chords, split into 3 interleaved parts.
        let n = 12;
        let mut edges: Vec<(u32, u32)> = (0..n as u32).map(|i| (i, (i + 1) % n as u32)).collect();
        edges.extend([(0, 6), (3, 9), (2, 7)]);
        let part_of: Vec<u32> = (0..n as u32).map(|i| i % 3).collect();
        let bufs = chunks(n, &edges, &part_of, 3);
        for chunk in &views(&bufs) {
            let layout = HaloLayout::new(chunk).unwrap();
            let sc = scatter_plan(&layout, chunk.num_local_nodes()).unwrap();
            assert_eq!(sc.packed_rows(), layout.sent_rows());
            assert_eq!(sc.output_rows(), chunk.num_local_nodes());
            let mut seen = vec![Vec::new(); chunk.num_local_nodes()];
            for (k, &r) in layout.send_rows.iter().enumerate() {
                seen[r as usize].push(k as u64);
            }
            for (k, &r) in sc.rows().iter().enumerate() {
                let srcs = &sc.src()[sc.ptr()[k] as usize..sc.ptr()[k + 1] as usize];
                assert_eq!(srcs, seen[r as usize].as_slice());
                assert!(srcs.windows(2).all(|w| w[0] < w[1]));
            }
            let targets = seen.iter().filter(|s| !s.is_empty()).count();
            assert_eq!(sc.rows().len(), targets);
        }
    }
}
