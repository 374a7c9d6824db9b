//! Loading the CUDA driver without crashing (feature `driver`, implied by `cuda`).
//!
//! cudarc's dynamic loader panics on the first call into a driver library it cannot load (no
//! `libcuda.so`, or one that lacks a symbol). [`probe_driver`] checks that the library can be
//! opened before cudarc is asked to, and [`guarded`] turns any remaining panic of the bindings
//! into [`CudaError::NoDevice`]. The kernels use them, and so do other crates that drive CUDA
//! through cudarc (dist-comm's NCCL backend), so every crate reports "no CUDA device" the same
//! way. The catch needs `panic = "unwind"`, which the workspace profiles keep.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::{sys, CudaContext};

use crate::error::{CudaError, Result};

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic in the CUDA driver bindings".to_owned())
}

/// Runs `f`, turning a panic of cudarc's dynamic loader (missing library or symbol) into
/// [`CudaError::NoDevice`] (converted into the caller's error type): cudarc panics on the
/// first call into a driver it cannot load. `what` names the step for the message.
pub fn guarded<T, E: From<CudaError>>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(CudaError::NoDevice(format!("{what}: {}", panic_message(payload.as_ref()))).into())
    })
}

/// Checks that the driver library can be loaded at all, before cudarc is asked to:
/// [`CudaError::NoDevice`] when `libcuda.so` is not installed or not on the loader path.
pub fn probe_driver() -> Result<()> {
    // SAFETY: `is_culib_present` only dlopens the usual libcuda names and closes them again;
    // loading the driver library runs no code of ours.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDevice(
            "the CUDA driver library (libcuda.so) is not installed or not on the loader path"
                .into(),
        ))
    }
}

/// Number of CUDA devices the driver reports; [`CudaError::NoDevice`] without a usable
/// driver (probed first, panics of the bindings caught).
pub fn device_count() -> Result<usize> {
    probe_driver()?;
    guarded("driver initialisation", || {
        let n = CudaContext::device_count()
            .map_err(|e| CudaError::NoDevice(format!("driver initialisation failed: {e}")))?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}
