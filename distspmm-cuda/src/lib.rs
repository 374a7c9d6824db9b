//! Hand-written CUDA SpMM kernels for distspmm: Y = αAX + βY with A in CSR (forward) and
//! Y = αAᵀX + βY from the CSC of A (backward), f32, any F, leading dimensions, no atomics.
//!
//! # Kernels (`kernels/spmm.cu`)
//! * **Row groups** — a group of 4, 8, 16 or 32 lanes owns one row; the group loads its row's
//!   non-zeros with coalesced reads, broadcasts them by warp shuffles, and gathers the rows of
//!   X as float4 when F % 4 == 0 and the operands are 16-byte aligned (float otherwise). The
//!   group size follows F ([`GroupLanes::for_features`]) so small F leaves no lane idle.
//! * **Row splitting** — for skewed degree distributions, rows longer than a piece size
//!   ([`RowSplitPlan`], by default 8× the mean row length clamped to 256..=4096 non-zeros) are
//!   cut into pieces of equal non-zero count; a warp reduces each piece into a workspace row
//!   and a second kernel adds each long row's pieces in order. Deterministic, no atomics.
//! * The transposed product runs the same kernels over the CSC arrays (column j of A is
//!   row j of Aᵀ); there is no transpose-specific kernel.
//!
//! [`Strategy::Auto`] picks row splitting exactly when the matrix has long rows.
//!
//! `kernels/rows.cu` holds the row movement of the distributed SpMM (dist-comm's
//! `GpuDistSpmm`): gathering the rows each peer needs into one send buffer, and adding
//! received partial sums into a rank's own rows in a fixed order ([`rows`]; no atomics), and
//! narrowing messages to 16 bits and widening them back ([`HalfFormat`], the CPU's conversions
//! bit for bit).
//! `kernels/sddmm.cu` holds the per-edge kernels: the SDDMM over a CSR pattern and the copy of
//! per-edge values into CSC order for the transposed product ([`edges`]).
//! `kernels/edge_softmax.cu` holds the softmax of per-edge logits over each row's entries, with
//! an optional LeakyReLU, forward and backward ([`edge_softmax`]). `kernels/train.cu` holds the
//! element-wise steps of training: bias + activation and its backward, bias gradients,
//! counter-keyed dropout (the CPU trainer's masks bit for bit), log-softmax + NLL, and Adam
//! ([`train`]).
//!
//! # Building
//! Default builds need no CUDA: every entry point answers [`CudaError::NotBuilt`]. With the
//! feature `cuda`, `build.rs` (the only place nvcc runs) compiles `kernels/*.cu` into one
//! fatbin — SASS for sm_80 and sm_90 plus compute_90 PTX — embedded in the crate, runs
//! `ptxas -v` and fails the build on any register spill. nvcc is found through `NVCC`,
//! `CUDA_HOME`/`CUDA_PATH`, `PATH`, or the PyPI wheel `nvidia-cuda-nvcc` (found through
//! `python3`; `ci-check.sh` installs it). Pin it to the driver's CUDA version (13.0 for driver
//! 580) so the embedded PTX stays loadable: a driver refuses PTX from a newer toolkit.
//!
//! # Running
//! The driver is loaded at run time (cudarc, dynamic loading): [`GpuDevice::open`] probes for
//! `libcuda.so` first and turns any failure of the bindings into [`CudaError::NoDevice`], so a
//! `cuda` build on a machine without a GPU reports an error instead of crashing (the catch
//! needs `panic = "unwind"`, which the workspace profiles keep). The probe itself is public
//! as the `probe` module under the lighter feature `driver` (no kernels, no nvcc) for other crates that
//! use cudarc, such as dist-comm's NCCL backend.
//!
//! # Measuring
//! `examples/gpu_bench.rs` (feature `bench`) compares against cuSPARSE on RMAT graphs;
//! `gpu-check.sh` builds the tests and the benchmark here and runs them on a GPU machine.
//! Results and the ptxas register table live in `docs/performance.md`.
//!
//! ```no_run
//! use distspmm_cuda::{spmm, DeviceCsr, DeviceDense, GpuDevice, SparseParts};
//! # fn main() -> Result<(), distspmm_cuda::CudaError> {
//! let dev = GpuDevice::open(0)?;
//! // A = [[1, 2], [0, 3]]
//! let a = DeviceCsr::new(&dev, SparseParts {
//!     nrows: 2, ncols: 2, indptr: &[0, 2, 3], indices: &[0, 1, 1], values: &[1.0, 2.0, 3.0],
//! })?;
//! let x = DeviceDense::from_host(&dev, 2, 1, &[1.0, 1.0])?;
//! let mut y = DeviceDense::zeros(&dev, 2, 1)?;
//! spmm(1.0, &a, &x, 0.0, &mut y)?;
//! assert_eq!(y.to_host()?, vec![3.0, 3.0]);
//! # Ok(())
//! # }
//! ```
//!
//! Raw device pointers (for the C ABI and foreign frameworks) go through
//! [`GpuDevice::spmm_raw`], on the device's stream or a caller's [`RawStream`].

mod device;
mod driver;
pub mod edge_softmax;
pub mod edges;
mod error;
pub mod plan;
#[cfg(feature = "driver")]
pub mod probe;
pub mod ptxas;
pub mod rows;
pub mod strategy;
pub mod train;

pub use device::{
    spmm, spmm_transpose, spmm_transpose_with, spmm_with, ColMajor, DeviceCsc, DeviceCsr,
    DeviceDense, DeviceRowSplit, DeviceSparse, GpuDevice, Layout, RawCsr, RawDense, RawSplit,
    RawSpmm, RawWorkspace, RowMajor, SparseParts,
};
pub use driver::RawStream;
pub use edge_softmax::{edge_softmax, edge_softmax_backward, EdgeBlock, EdgeRows, RawEdgeBlock};
pub use edges::{DeviceCscOrder, RawCscValues, RawEdgeRuns};
pub use error::{CudaError, Result};
pub use plan::RowSplitPlan;
pub use rows::{
    add_blocks, gather_rows, scatter_add_rows, DeviceRows, DeviceScatter, HalfFormat, ScatterPlan,
};
pub use strategy::{GroupLanes, KernelChoice, Strategy};
pub use train::{
    activation_backward, adam_step, bias_activation, bias_activation_in_place, column_sums,
    dropout, dropout_in_place, nll_loss, Activation, AdamStep, DeviceIds, DeviceLabels, DropoutKey,
    LossSums,
};

/// A count or dimension as the kernels' u32 argument, once the launch's checks
/// (`check_dense`, `check_product`, `ScatterPlan::new`, `RowSplitPlan::new`) verified it fits.
#[allow(
    clippy::cast_possible_truncation,
    reason = "every caller passes a value checked to fit u32 before the launch"
)]
#[inline(always)]
pub(crate) const fn kernel_u32(x: usize) -> u32 {
    x as u32
}

/// Whether this build carries compiled kernels (the `cuda` feature).
pub fn built_with_cuda() -> bool {
    cfg!(feature = "cuda")
}

/// The raw `nvcc -Xptxas -v` log of the embedded kernels, as the build captured it.
#[cfg(feature = "cuda")]
pub const PTXAS_LOG: &str = include_str!(concat!(env!("OUT_DIR"), "/ptxas.log"));

/// The nvcc that compiled the embedded kernels (`nvcc --version`, last line).
#[cfg(feature = "cuda")]
pub const NVCC_VERSION: &str = include_str!(concat!(env!("OUT_DIR"), "/nvcc-version.txt"));

/// Registers, stack and spills of every embedded kernel per architecture (parsed from the
/// build's ptxas log); [`CudaError::NotBuilt`] without the `cuda` feature.
pub fn kernel_resources() -> Result<Vec<ptxas::KernelResources>> {
    #[cfg(feature = "cuda")]
    {
        ptxas::parse(PTXAS_LOG).map_err(CudaError::Report)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::NotBuilt)
    }
}
