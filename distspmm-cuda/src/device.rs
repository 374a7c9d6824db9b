//! Devices, device-resident operands and the SpMM launches.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use crate::driver::{self, Arg, Buffer, Context, Elem, RawStream};
use crate::error::{CudaError, Result};
use crate::plan::{validate_compressed, workspace_ld, RowSplitPlan};
use crate::strategy::{
    blocks_for_warps, long_rows_kernel, pieces_kernel, resolve, row_warps, rows_kernel,
    KernelChoice, PlanState, Strategy,
};

/// An open CUDA device: its context, the stream every call of this crate runs on, the loaded
/// kernels and a partial-sum workspace for row splitting. Cheap to clone (shared handle).
#[derive(Clone, Debug)]
pub struct GpuDevice {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ctx: Context,
    workspace: Mutex<Option<Buffer<f32>>>,
}

impl GpuDevice {
    /// Opens device `ordinal`. Without a driver or device this returns
    /// [`CudaError::NoDevice`] (never panics); without the `cuda` feature,
    /// [`CudaError::NotBuilt`].
    pub fn open(ordinal: usize) -> Result<GpuDevice> {
        let ctx = Context::open(ordinal)?;
        tracing::debug!(ordinal, "opened CUDA device");
        Ok(GpuDevice {
            inner: Arc::new(Inner {
                ctx,
                workspace: Mutex::new(None),
            }),
        })
    }

    /// Number of CUDA devices the driver reports ([`CudaError::NoDevice`] without a driver).
    pub fn count() -> Result<usize> {
        driver::device_count()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ctx.ordinal()
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> Result<String> {
        self.inner.ctx.name()
    }

    /// Compute capability as (major, minor).
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        self.inner.ctx.compute_capability()
    }

    /// Waits until all work queued on this device's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.ctx.synchronize()
    }

    /// This device's own stream (where the safe calls and uploads run), for ordering it
    /// against other streams with [`join_streams`](Self::join_streams).
    pub fn stream(&self) -> RawStream {
        self.inner.ctx.raw_stream()
    }

    /// Makes `waiter` wait for all work queued on `signaller` so far, without blocking the
    /// host (an event recorded on `signaller`, waited for on `waiter`); `None` names this
    /// device's own stream. Does nothing when both name the same stream.
    ///
    /// # Safety
    /// Both streams must be live streams of this device's context.
    pub unsafe fn join_streams(
        &self,
        waiter: Option<RawStream>,
        signaller: Option<RawStream>,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.inner.ctx.join(waiter, signaller) }
    }

    pub(crate) fn ctx(&self) -> &Context {
        &self.inner.ctx
    }

    /// Uploads a row-splitting plan for use with [`spmm_raw`](Self::spmm_raw).
    pub fn upload_row_split(&self, plan: &RowSplitPlan) -> Result<DeviceRowSplit> {
        Ok(DeviceRowSplit {
            piece_nnz: plan.piece_nnz(),
            nlong: plan.long_rows().len(),
            npieces: plan.pieces(),
            long_rows: self.upload(plan.long_rows())?,
            long_piece_ptr: self.upload(plan.long_piece_ptr())?,
            piece_lo: self.upload(plan.piece_lo())?,
            piece_hi: self.upload(plan.piece_hi())?,
        })
    }

    /// Y = αAX + βY on caller-owned device memory, on `stream` (this device's own stream when
    /// `None`). Row splitting needs `split`; without it, [`Strategy::RowSplit`] is an error and
    /// [`Strategy::Auto`] runs row groups. Returns the kernels that were queued.
    ///
    /// # Safety
    /// Every pointer in `op` (and the workspace in `split`) must be device memory of this
    /// device's context: `a` a valid CSR with `nrows + 1` row pointers (u64), `nnz` column
    /// indices (u32, each below `ncols`) and values (f32); `x` and `y` at least
    /// `(rows - 1) * ld + cols` f32 each; the workspace at least
    /// [`DeviceRowSplit::workspace_len`] f32 for `y.cols`, not shared with a concurrent call.
    /// `y` must not overlap `x`, `a` or the workspace. All of it must stay alive, and `stream`
    /// (a live stream of this context) must not be destroyed, until the queued work finishes.
    pub unsafe fn spmm_raw(
        &self,
        op: &RawSpmm,
        strategy: Strategy,
        split: Option<RawSplit<'_>>,
        stream: Option<RawStream>,
    ) -> Result<KernelChoice> {
        check_product("spmm_raw", &op.a, &op.x, &op.y)?;
        let split = match split {
            None => SplitInput::Missing,
            Some(s) if s.plan.nlong == 0 => SplitInput::NoLongRows,
            Some(s) => SplitInput::Plan(s.plan, s.workspace),
        };
        // SAFETY: forwarded contract of this function.
        unsafe { self.launch_product(op, strategy, split, stream) }
    }

    pub(crate) fn upload<T: Elem>(&self, data: &[T]) -> Result<Buffer<T>> {
        // Zero-length device allocations are refused by the driver; keep one padding element.
        if data.is_empty() {
            self.inner.ctx.upload(&[T::default()])
        } else {
            self.inner.ctx.upload(data)
        }
    }

    pub(crate) fn ptr<T>(&self, buf: &Buffer<T>) -> u64 {
        self.inner.ctx.device_ptr(buf)
    }

    pub(crate) fn same(&self, other: &GpuDevice) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Runs a safe-API product: the workspace for row splitting comes from the device cache.
    fn product(
        &self,
        op: &RawSpmm,
        strategy: Strategy,
        matrix: &Compressed,
    ) -> Result<KernelChoice> {
        let f = op.y.cols;
        let state = PlanState::of(&matrix.plan);
        let wants_split = matches!(resolve(strategy, f, false, state), Ok((_, true)));
        let Some(split) = matrix.split.as_ref().filter(|_| wants_split) else {
            // SAFETY: the operands are live buffers of this device whose sizes were checked
            // by the constructors and by check_product; all work runs on this device's stream.
            return unsafe { self.launch_product(op, strategy, SplitInput::NoLongRows, None) };
        };
        let needed = split.workspace_len(f).max(1);
        let mut cache = self
            .inner
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let workspace = match cache.as_ref() {
            Some(b) if b.len() >= needed => b,
            // The old buffer is freed in stream order, after the work that used it.
            _ => cache.insert(self.inner.ctx.zeros::<f32>(needed)?),
        };
        let workspace = RawWorkspace {
            ptr: self.ptr(workspace),
            len: workspace.len(),
        };
        // SAFETY: as above; the workspace is this device's cached buffer, large enough for f
        // columns and used only while the lock is held, in stream order.
        unsafe { self.launch_product(op, strategy, SplitInput::Plan(split, workspace), None) }
    }

    /// Queues the kernels of one product.
    ///
    /// # Safety
    /// As [`spmm_raw`](Self::spmm_raw); the shapes must have passed `check_product`.
    unsafe fn launch_product(
        &self,
        op: &RawSpmm,
        strategy: Strategy,
        split: SplitInput<'_>,
        stream: Option<RawStream>,
    ) -> Result<KernelChoice> {
        let RawSpmm {
            alpha,
            a,
            x,
            beta,
            y,
        } = *op;
        let f = y.cols;
        let aligned = |d: &RawDense| d.ld.is_multiple_of(4) && d.ptr.is_multiple_of(16);
        let workspace_aligned = match split {
            SplitInput::Plan(_, w) => w.ptr.is_multiple_of(16),
            _ => true,
        };
        let vec4 = f.is_multiple_of(4) && aligned(&x) && aligned(&y) && workspace_aligned;
        let state = match split {
            SplitInput::Missing => PlanState::Missing,
            SplitInput::NoLongRows => PlanState::NoLongRows,
            SplitInput::Plan(..) => PlanState::LongRows,
        };
        let (lanes, do_split) = resolve(strategy, f, vec4, state).map_err(CudaError::Strategy)?;
        let rows_kernel = rows_kernel(lanes, f, vec4);
        let mut choice = KernelChoice {
            lanes,
            vec4,
            rows_kernel,
            split_kernels: None,
        };
        if y.rows == 0 || f == 0 {
            return Ok(choice);
        }
        // check_product guaranteed that these fit u32.
        let (nrows, f32_cols) = (crate::kernel_u32(y.rows), crate::kernel_u32(f));
        let split = match split {
            SplitInput::Plan(plan, workspace) if do_split => Some((plan, workspace)),
            _ => None,
        };
        let long_threshold = split.map_or(u64::MAX, |(s, _)| s.piece_nnz);
        let ctx = &self.inner.ctx;
        let rows_args = [
            Arg::U32(nrows),
            Arg::U64(a.indptr),
            Arg::U64(a.indices),
            Arg::U64(a.values),
            Arg::U64(x.ptr),
            Arg::U64(x.ld as u64),
            Arg::U64(y.ptr),
            Arg::U64(y.ld as u64),
            Arg::U32(f32_cols),
            Arg::F32(alpha),
            Arg::F32(beta),
            Arg::U64(long_threshold),
        ];
        let blocks = blocks_for_warps(row_warps(y.rows as u64, lanes));
        // SAFETY: the argument list matches DSP_ROWS_KERNEL in kernels/spmm.cu; the pointers
        // satisfy this function's contract.
        unsafe { ctx.launch(rows_kernel, blocks, &rows_args, stream)? };

        if let Some((plan, workspace)) = split {
            if workspace.len < plan.workspace_len(f) {
                return Err(CudaError::Shape {
                    op: "spmm",
                    reason: format!(
                        "row-splitting workspace has {} f32, needs {}",
                        workspace.len,
                        plan.workspace_len(f)
                    ),
                });
            }
            let (pieces, combine) = (pieces_kernel(lanes, vec4), long_rows_kernel(vec4));
            let ldp = workspace_ld(f) as u64;
            let piece_args = [
                Arg::U32(crate::kernel_u32(plan.npieces)),
                Arg::U64(self.ptr(&plan.piece_lo)),
                Arg::U64(self.ptr(&plan.piece_hi)),
                Arg::U64(a.indices),
                Arg::U64(a.values),
                Arg::U64(x.ptr),
                Arg::U64(x.ld as u64),
                Arg::U64(workspace.ptr),
                Arg::U64(ldp),
                Arg::U32(f32_cols),
            ];
            // SAFETY: matches DSP_PIECES_KERNEL; the plan's buffers are live device arrays of
            // npieces entries and the workspace holds npieces * ldp f32 (checked above).
            unsafe {
                ctx.launch(
                    pieces,
                    blocks_for_warps(plan.npieces as u64),
                    &piece_args,
                    stream,
                )?
            };
            let combine_args = [
                Arg::U32(crate::kernel_u32(plan.nlong)),
                Arg::U64(self.ptr(&plan.long_rows)),
                Arg::U64(self.ptr(&plan.long_piece_ptr)),
                Arg::U64(workspace.ptr),
                Arg::U64(ldp),
                Arg::U64(y.ptr),
                Arg::U64(y.ld as u64),
                Arg::U32(f32_cols),
                Arg::F32(alpha),
                Arg::F32(beta),
            ];
            // SAFETY: matches DSP_LONG_ROWS_KERNEL; long_rows holds nlong rows below nrows
            // and long_piece_ptr nlong + 1 piece offsets.
            unsafe {
                ctx.launch(
                    combine,
                    blocks_for_warps(plan.nlong as u64),
                    &combine_args,
                    stream,
                )?
            };
            choice.split_kernels = Some((pieces, combine));
        }
        tracing::trace!(?choice, nrows = y.rows, f, "queued spmm");
        Ok(choice)
    }
}

/// Device pointers of a CSR matrix (u64 row pointers, u32 column indices, f32 values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawCsr {
    /// Rows of A.
    pub nrows: usize,
    /// Columns of A.
    pub ncols: usize,
    /// Stored non-zeros.
    pub nnz: usize,
    /// `CUdeviceptr` of `nrows + 1` u64 row pointers.
    pub indptr: u64,
    /// `CUdeviceptr` of `nnz` u32 column indices.
    pub indices: u64,
    /// `CUdeviceptr` of `nnz` f32 values.
    pub values: u64,
}

/// Device pointer of a row-major dense f32 matrix with leading dimension `ld` (elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDense {
    /// Rows.
    pub rows: usize,
    /// Columns (F).
    pub cols: usize,
    /// Elements between the starts of consecutive rows (`>= cols`).
    pub ld: usize,
    /// `CUdeviceptr` of the first element.
    pub ptr: u64,
}

/// One product Y = αAX + βY on raw device pointers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RawSpmm {
    /// α.
    pub alpha: f32,
    /// A (`nrows × ncols`).
    pub a: RawCsr,
    /// X (`ncols × F`).
    pub x: RawDense,
    /// β; 0 means Y is written without being read.
    pub beta: f32,
    /// Y (`nrows × F`).
    pub y: RawDense,
}

/// Caller-owned f32 device memory for the partial sums of row splitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawWorkspace {
    /// `CUdeviceptr`, 16-byte aligned for the float4 kernels.
    pub ptr: u64,
    /// Length in f32 elements.
    pub len: usize,
}

/// The row-splitting inputs of a raw call: the plan of A on the device and a workspace.
#[derive(Clone, Copy, Debug)]
pub struct RawSplit<'a> {
    /// A's plan, uploaded with [`GpuDevice::upload_row_split`].
    pub plan: &'a DeviceRowSplit,
    /// At least `plan.workspace_len(F)` f32.
    pub workspace: RawWorkspace,
}

/// A [`RowSplitPlan`] on the device.
#[derive(Debug)]
pub struct DeviceRowSplit {
    piece_nnz: u64,
    nlong: usize,
    npieces: usize,
    long_rows: Buffer<u32>,
    long_piece_ptr: Buffer<u64>,
    piece_lo: Buffer<u64>,
    piece_hi: Buffer<u64>,
}

impl DeviceRowSplit {
    /// Number of pieces.
    pub fn pieces(&self) -> usize {
        self.npieces
    }

    /// Number of long (split) rows.
    pub fn long_rows(&self) -> usize {
        self.nlong
    }

    /// f32 elements of workspace a product with `f` feature columns needs.
    pub fn workspace_len(&self, f: usize) -> usize {
        self.npieces * workspace_ld(f)
    }
}

/// The row-splitting input of one launch.
#[derive(Clone, Copy, Debug)]
enum SplitInput<'a> {
    /// No plan was given (raw calls).
    Missing,
    /// The matrix has no long rows.
    NoLongRows,
    /// The plan on the device and a workspace for its partial sums.
    Plan(&'a DeviceRowSplit, RawWorkspace),
}

/// Validates the shapes of a product and the index-type limits of the kernels.
fn check_product(op: &'static str, a: &RawCsr, x: &RawDense, y: &RawDense) -> Result<()> {
    let bad = |reason: String| Err(CudaError::Shape { op, reason });
    if x.rows != a.ncols {
        return bad(format!(
            "X has {} rows but A has {} columns",
            x.rows, a.ncols
        ));
    }
    if y.rows != a.nrows {
        return bad(format!("Y has {} rows but A has {} rows", y.rows, a.nrows));
    }
    if x.cols != y.cols {
        return bad(format!("X has {} columns but Y has {}", x.cols, y.cols));
    }
    for (name, d) in [("X", x), ("Y", y)] {
        if d.ld < d.cols {
            return bad(format!(
                "{name} leading dimension {} is below its {} columns",
                d.ld, d.cols
            ));
        }
    }
    if u32::try_from(a.nrows).is_err() || u32::try_from(y.cols).is_err() {
        return bad(format!(
            "{} rows × {} columns exceed the kernels' u32 limits",
            a.nrows, y.cols
        ));
    }
    Ok(())
}

/// The storage shared by [`DeviceCsr`] and [`DeviceCsc`]: a compressed structure over
/// `nmajor` rows (CSR) or columns (CSC) with indices below `nminor`.
#[derive(Debug)]
struct Compressed {
    dev: GpuDevice,
    nmajor: usize,
    nminor: usize,
    nnz: usize,
    ptr: Buffer<u64>,
    idx: Buffer<u32>,
    val: Buffer<f32>,
    plan: RowSplitPlan,
    split: Option<DeviceRowSplit>,
}

impl Compressed {
    #[allow(clippy::too_many_arguments)]
    fn upload(
        dev: &GpuDevice,
        format: &'static str,
        nmajor: usize,
        nminor: usize,
        ptr: &[u64],
        idx: &[u32],
        val: &[f32],
        piece_nnz: Option<u64>,
    ) -> Result<Compressed> {
        validate_compressed(format, nmajor, nminor, ptr, idx, val)?;
        let piece =
            piece_nnz.unwrap_or_else(|| RowSplitPlan::default_piece_nnz(nmajor, idx.len() as u64));
        let plan = RowSplitPlan::new(ptr, piece)?;
        let split = if plan.is_empty() {
            None
        } else {
            Some(dev.upload_row_split(&plan)?)
        };
        Ok(Compressed {
            dev: dev.clone(),
            nmajor,
            nminor,
            nnz: idx.len(),
            ptr: dev.upload(ptr)?,
            idx: dev.upload(idx)?,
            val: dev.upload(val)?,
            plan,
            split,
        })
    }

    fn raw(&self) -> RawCsr {
        RawCsr {
            nrows: self.nmajor,
            ncols: self.nminor,
            nnz: self.nnz,
            indptr: self.dev.ptr(&self.ptr),
            indices: self.dev.ptr(&self.idx),
            values: self.dev.ptr(&self.val),
        }
    }

    /// Y = α M X + β Y where M is the CSR these arrays describe.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        op: &'static str,
        strategy: Strategy,
        alpha: f32,
        x: &DeviceDense,
        beta: f32,
        y: &mut DeviceDense,
    ) -> Result<KernelChoice> {
        if !self.dev.same(&x.dev) || !self.dev.same(&y.dev) {
            return Err(CudaError::DeviceMismatch(op));
        }
        let raw = RawSpmm {
            alpha,
            a: self.raw(),
            x: x.raw(),
            beta,
            y: y.raw(),
        };
        check_product(op, &raw.a, &raw.x, &raw.y)?;
        self.dev.product(&raw, strategy, self)
    }
}

/// Which way a compressed sparse matrix is stored; the marker of [`DeviceSparse`].
pub trait Layout: std::fmt::Debug + private::Sealed {
    /// `"CSR"` or `"CSC"`, for error messages.
    const FORMAT: &'static str;
    /// Whether the pointer array runs over A's rows (CSR) rather than its columns (CSC).
    const ROW_MAJOR: bool;
}

mod private {
    pub trait Sealed {}
    impl Sealed for super::RowMajor {}
    impl Sealed for super::ColMajor {}
}

/// CSR: row pointers, column indices.
#[derive(Debug)]
pub enum RowMajor {}

/// CSC: column pointers, row indices.
#[derive(Debug)]
pub enum ColMajor {}

impl Layout for RowMajor {
    const FORMAT: &'static str = "CSR";
    const ROW_MAJOR: bool = true;
}

impl Layout for ColMajor {
    const FORMAT: &'static str = "CSC";
    const ROW_MAJOR: bool = false;
}

/// A compressed sparse matrix A on the device (u64 pointers, u32 indices, f32 values) with the
/// row-splitting plan of its pointer array. A CSC is the CSR of Aᵀ, which is what
/// [`spmm_transpose`] runs the CSR kernels over.
#[derive(Debug)]
pub struct DeviceSparse<L: Layout> {
    inner: Compressed,
    _layout: PhantomData<L>,
}

/// A CSR matrix on the device.
pub type DeviceCsr = DeviceSparse<RowMajor>;
/// A CSC matrix on the device.
pub type DeviceCsc = DeviceSparse<ColMajor>;

/// The host arrays of a compressed sparse matrix, as `distspmm-sparse`'s `Csr`/`Csc` store them:
/// `indptr` has one entry more than A has rows (CSR) or columns (CSC).
#[derive(Clone, Copy, Debug)]
pub struct SparseParts<'a> {
    /// Rows of A.
    pub nrows: usize,
    /// Columns of A.
    pub ncols: usize,
    /// Row pointers (CSR) or column pointers (CSC).
    pub indptr: &'a [u64],
    /// Column indices (CSR) or row indices (CSC) of the non-zeros.
    pub indices: &'a [u32],
    /// Values of the non-zeros.
    pub values: &'a [f32],
}

impl<L: Layout> DeviceSparse<L> {
    /// Checks and uploads `parts`, with the default row-splitting piece size.
    pub fn new(dev: &GpuDevice, parts: SparseParts<'_>) -> Result<Self> {
        Self::with_piece_nnz(dev, parts, None)
    }

    /// Checks and uploads `parts`; rows (CSR) or columns (CSC) with more than `piece_nnz`
    /// non-zeros are split (`None`: [`RowSplitPlan::default_piece_nnz`]).
    pub fn with_piece_nnz(
        dev: &GpuDevice,
        parts: SparseParts<'_>,
        piece_nnz: Option<u64>,
    ) -> Result<Self> {
        let SparseParts {
            nrows,
            ncols,
            indptr,
            indices,
            values,
        } = parts;
        let (nmajor, nminor) = if L::ROW_MAJOR {
            (nrows, ncols)
        } else {
            (ncols, nrows)
        };
        let inner = Compressed::upload(
            dev,
            L::FORMAT,
            nmajor,
            nminor,
            indptr,
            indices,
            values,
            piece_nnz,
        )?;
        Ok(DeviceSparse {
            inner,
            _layout: PhantomData,
        })
    }

    /// Rows of A.
    pub fn nrows(&self) -> usize {
        if L::ROW_MAJOR {
            self.inner.nmajor
        } else {
            self.inner.nminor
        }
    }

    /// Columns of A.
    pub fn ncols(&self) -> usize {
        if L::ROW_MAJOR {
            self.inner.nminor
        } else {
            self.inner.nmajor
        }
    }

    /// Stored non-zeros.
    pub fn nnz(&self) -> usize {
        self.inner.nnz
    }

    /// The row-splitting plan built at upload (over A's columns for a CSC).
    pub fn plan(&self) -> &RowSplitPlan {
        &self.inner.plan
    }

    /// The plan on the device (`None` when nothing is long enough to split).
    pub fn row_split(&self) -> Option<&DeviceRowSplit> {
        self.inner.split.as_ref()
    }

    /// Device pointers of the CSR these arrays describe: A for a CSR, Aᵀ for a CSC.
    pub fn raw(&self) -> RawCsr {
        self.inner.raw()
    }
}

/// A row-major dense f32 matrix on the device with leading dimension `ld`.
#[derive(Debug)]
pub struct DeviceDense {
    dev: GpuDevice,
    rows: usize,
    cols: usize,
    ld: usize,
    buf: Buffer<f32>,
}

impl DeviceDense {
    /// Uploads `data`, `rows × cols` row-major (`ld = cols`).
    pub fn from_host(
        dev: &GpuDevice,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<DeviceDense> {
        Self::from_host_strided(dev, rows, cols, cols, data)
    }

    /// Uploads `data`, `rows` rows of `ld` elements of which the first `cols` are the matrix.
    pub fn from_host_strided(
        dev: &GpuDevice,
        rows: usize,
        cols: usize,
        ld: usize,
        data: &[f32],
    ) -> Result<DeviceDense> {
        let len = dense_len("DeviceDense::from_host", rows, cols, ld)?;
        if data.len() != len {
            return Err(CudaError::Shape {
                op: "DeviceDense::from_host",
                reason: format!(
                    "{} elements given for {rows} rows of leading dimension {ld}",
                    data.len()
                ),
            });
        }
        Ok(DeviceDense {
            dev: dev.clone(),
            rows,
            cols,
            ld,
            buf: dev.upload(data)?,
        })
    }

    /// A zero matrix with `ld = cols`.
    pub fn zeros(dev: &GpuDevice, rows: usize, cols: usize) -> Result<DeviceDense> {
        Self::zeros_strided(dev, rows, cols, cols)
    }

    /// A zero matrix with leading dimension `ld >= cols`.
    pub fn zeros_strided(
        dev: &GpuDevice,
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<DeviceDense> {
        let len = dense_len("DeviceDense::zeros", rows, cols, ld)?;
        let buf = dev.inner.ctx.zeros(len.max(1))?;
        Ok(DeviceDense {
            dev: dev.clone(),
            rows,
            cols,
            ld,
            buf,
        })
    }

    /// Downloads the matrix as `rows × cols` row-major (padding columns dropped).
    pub fn to_host(&self) -> Result<Vec<f32>> {
        let all = self.dev.inner.ctx.download(&self.buf)?;
        if self.ld == self.cols {
            return Ok(all[..self.rows * self.cols].to_vec());
        }
        Ok(all
            .chunks(self.ld)
            .take(self.rows)
            .flat_map(|r| r[..self.cols].iter().copied())
            .collect())
    }

    /// Downloads all `rows × ld` elements, padding columns included.
    pub fn to_host_strided(&self) -> Result<Vec<f32>> {
        let mut all = self.dev.inner.ctx.download(&self.buf)?;
        all.truncate(self.rows * self.ld);
        Ok(all)
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (F).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Leading dimension in elements.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// The device this matrix lives on.
    pub fn device(&self) -> &GpuDevice {
        &self.dev
    }

    /// Device pointer and layout, for [`GpuDevice::spmm_raw`] and foreign libraries.
    pub fn raw(&self) -> RawDense {
        RawDense {
            rows: self.rows,
            cols: self.cols,
            ld: self.ld,
            ptr: self.dev.ptr(&self.buf),
        }
    }
}

fn dense_len(op: &'static str, rows: usize, cols: usize, ld: usize) -> Result<usize> {
    if ld < cols {
        return Err(CudaError::Shape {
            op,
            reason: format!("leading dimension {ld} is below {cols} columns"),
        });
    }
    rows.checked_mul(ld).ok_or_else(|| CudaError::Shape {
        op,
        reason: format!("{rows} × {ld} elements overflow"),
    })
}

/// Y = αAX + βY with A in CSR, [`Strategy::Auto`]. Queued on the device's stream; returns the
/// kernels that were chosen.
pub fn spmm(
    alpha: f32,
    a: &DeviceCsr,
    x: &DeviceDense,
    beta: f32,
    y: &mut DeviceDense,
) -> Result<KernelChoice> {
    spmm_with(Strategy::Auto, alpha, a, x, beta, y)
}

/// [`spmm`] with an explicit strategy.
pub fn spmm_with(
    strategy: Strategy,
    alpha: f32,
    a: &DeviceCsr,
    x: &DeviceDense,
    beta: f32,
    y: &mut DeviceDense,
) -> Result<KernelChoice> {
    a.inner.product("spmm", strategy, alpha, x, beta, y)
}

/// Y = αAᵀX + βY from the CSC of A (the CSR kernels over the CSC arrays), [`Strategy::Auto`].
pub fn spmm_transpose(
    alpha: f32,
    a: &DeviceCsc,
    x: &DeviceDense,
    beta: f32,
    y: &mut DeviceDense,
) -> Result<KernelChoice> {
    spmm_transpose_with(Strategy::Auto, alpha, a, x, beta, y)
}

/// [`spmm_transpose`] with an explicit strategy.
pub fn spmm_transpose_with(
    strategy: Strategy,
    alpha: f32,
    a: &DeviceCsc,
    x: &DeviceDense,
    beta: f32,
    y: &mut DeviceDense,
) -> Result<KernelChoice> {
    a.inner
        .product("spmm_transpose", strategy, alpha, x, beta, y)
}
