//! Loading the CUDA driver without crashing (feature `driver`, implied by `cuda`): the
//! `cuda-probe` crate's probe, with its [`NoDevice`](cuda_probe::NoDevice) as
//! [`CudaError::NoDevice`].

pub use cuda_probe::{guarded, probe_driver, NoDevice};

use crate::error::{CudaError, Result};

impl From<NoDevice> for CudaError {
    fn from(e: NoDevice) -> Self {
        CudaError::NoDevice(e.0)
    }
}

/// Number of CUDA devices the driver reports; [`CudaError::NoDevice`] without a usable driver.
pub fn device_count() -> Result<usize> {
    Ok(cuda_probe::device_count()?)
}
