//! Loading the CUDA driver without crashing.
//!
//! cudarc's dynamic loader panics on the first call into a driver library it cannot load (no
//! `libcuda.so`, or one that lacks a symbol). [`probe_driver`] checks that the library can be
//! opened before cudarc is asked to, and [`guarded`] turns any remaining panic of the bindings
//! into [`NoDevice`]. Every crate that drives CUDA through cudarc uses them — distspmm-cuda's
//! kernels and dist-comm's NCCL backend, neither of which depends on the other — so each
//! reports "no CUDA device" the same way. The catch needs `panic = "unwind"`, which the
//! workspace profiles keep.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::{sys, CudaContext};

/// No usable CUDA driver or device: what failed, in words. Each GPU crate turns it into its
/// own "no device" error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoDevice(pub String);

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic in the CUDA driver bindings".to_owned())
}

/// Runs `f`, turning a panic of cudarc's dynamic loader (missing library or symbol) into
/// [`NoDevice`] (converted into the caller's error type): cudarc panics on the first call into
/// a driver it cannot load. `what` names the step for the message.
pub fn guarded<T, E: From<NoDevice>>(what: &str, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(NoDevice(format!("{what}: {}", panic_message(payload.as_ref()))).into())
    })
}

/// Checks that the driver library can be loaded at all, before cudarc is asked to:
/// [`NoDevice`] when `libcuda.so` is not installed or not on the loader path.
pub fn probe_driver() -> Result<(), NoDevice> {
    // SAFETY: `is_culib_present` only dlopens the usual libcuda names and closes them again;
    // loading the driver library runs no code of ours.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(NoDevice(
            "the CUDA driver library (libcuda.so) is not installed or not on the loader path"
                .into(),
        ))
    }
}

/// Number of CUDA devices the driver reports; [`NoDevice`] without a usable driver (probed
/// first, panics of the bindings caught).
pub fn device_count() -> Result<usize, NoDevice> {
    probe_driver()?;
    guarded("driver initialisation", || {
        let n = CudaContext::device_count()
            .map_err(|e| NoDevice(format!("driver initialisation failed: {e}")))?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_the_guard_is_no_device() {
        let r: Result<(), NoDevice> = guarded("loading", || panic!("symbol cuInit missing"));
        assert_eq!(r, Err(NoDevice("loading: symbol cuInit missing".into())));
        let ok: Result<u8, NoDevice> = guarded("loading", || Ok(3));
        assert_eq!(ok, Ok(3));
    }

    #[test]
    fn without_a_driver_the_count_is_an_error_not_a_crash() {
        // Here (no GPU) the driver is missing or reports devices; either way no panic.
        match device_count() {
            Ok(_) => {}
            Err(NoDevice(message)) => assert!(!message.is_empty()),
        }
    }
}
