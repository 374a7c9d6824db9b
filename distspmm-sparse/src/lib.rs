//! The sparse algebra of distspmm: CSR/CSC matrices over borrowed or owned storage, row-major
//! dense views, and the CPU kernels (SpMM, SDDMM, the grouped per-block SpMM, the 16-bit
//! conversions) with their instruction-set selection.
//!
//! `#![no_std]` + `alloc`: the types and kernels work anywhere; threads (rayon), memory-mapped
//! dense buffers and the fallible-allocation helpers of [`memory`] need the default `std`
//! feature.
#![no_std]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod index;
pub mod kernel;
#[cfg(feature = "std")]
pub mod memory;
pub mod npy;
pub mod sparse;
