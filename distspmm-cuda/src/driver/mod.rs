//! The few driver primitives the launcher needs, with a CUDA implementation (cudarc) and one
//! for builds without the `cuda` feature. Everything above this module is written once.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::{device_count, Buffer, Context, Elem};

#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub(crate) use stub::{device_count, Buffer, Context, Elem};

/// One kernel argument, passed by value (device pointers as `U64`).
#[derive(Clone, Copy, Debug)]
// Only the CUDA driver reads the values; the stub never launches.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Arg {
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
}

/// A CUDA stream handle (`CUstream` / `cudaStream_t`) owned by the caller, as an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStream(pub u64);
