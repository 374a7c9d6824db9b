//! The one error type of the crate.

/// What went wrong in a GPU call; every public function of the crate returns it.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The crate was compiled without the `cuda` feature, so there are no kernels to run.
    #[error("distspmm-cuda was built without CUDA support (rebuild with `--features cuda`)")]
    NotBuilt,
    /// No usable driver or device: `libcuda.so` is missing, the ordinal is out of range, or the
    /// driver refused to initialise. The message says which.
    #[error("no CUDA driver/device: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver call `{call}` failed: {message}")]
    Driver {
        /// The driver operation that failed.
        call: &'static str,
        /// The driver's own description of the failure.
        message: String,
    },
    /// The embedded kernel image lacks a kernel the launcher asked for (a build mismatch).
    #[error("kernel `{0}` is missing from the embedded CUDA module")]
    MissingKernel(&'static str),
    /// A sparse matrix handed to the upload is not a valid CSR/CSC structure.
    #[error("invalid {format} matrix: {reason}")]
    InvalidMatrix {
        /// `"CSR"` or `"CSC"`.
        format: &'static str,
        /// What is wrong, with the offending position.
        reason: String,
    },
    /// Operand dimensions do not agree, or a size does not fit the kernels' index types.
    #[error("shape mismatch in {op}: {reason}")]
    Shape {
        /// The operation (`spmm`, `spmm_transpose`, `upload_dense`, ...).
        op: &'static str,
        /// Which dimensions disagree, with their values.
        reason: String,
    },
    /// A parameter outside what the call accepts (a dropout probability outside `[0, 1)`, a
    /// step count of 0, ...).
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// Which parameter, with its value and what is accepted.
        reason: String,
    },
    /// Operands live on different devices (or different `GpuDevice` handles).
    #[error("operands of {0} belong to different GpuDevice handles")]
    DeviceMismatch(&'static str),
    /// The build's ptxas report could not be read.
    #[error("unreadable ptxas report: {0}")]
    Report(String),
    /// A strategy was asked for that this call cannot run (e.g. row splitting without a plan).
    #[error("strategy not available: {0}")]
    Strategy(String),
}

/// Result alias of the crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;
