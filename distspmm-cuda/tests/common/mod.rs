//! Shared by the GPU test files.

use distspmm_cuda::{CudaError, GpuDevice};

/// Device 0, or `None` (after printing "skipping: no CUDA device (...)") when none can be
/// opened, unless `DISTSPMM_REQUIRE_GPU` is set (the GPU check script sets it), which turns the
/// skip into a failure.
pub fn device() -> Option<GpuDevice> {
    match GpuDevice::open(0) {
        Ok(dev) => Some(dev),
        Err(e @ (CudaError::NoDevice(_) | CudaError::NotBuilt)) => {
            assert!(
                std::env::var_os("DISTSPMM_REQUIRE_GPU").is_none(),
                "DISTSPMM_REQUIRE_GPU is set but no device opened: {e}"
            );
            println!("skipping: no CUDA device ({e})");
            None
        }
        Err(e) => panic!("opening CUDA device 0 failed: {e}"),
    }
}
