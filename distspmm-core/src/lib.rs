//! Sparse matrix types, CPU SpMM kernels, graph loading, partitioning, chunk building and the
//! communication schedules of distributed SpMM.
//!
//! `#![no_std]` + `alloc`: the sparse types and kernels work anywhere; threads (rayon), files,
//! graph readers, METIS and chunk writing need the default `std` feature.
#![no_std]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

#[cfg(feature = "std")]
pub mod chunk;
#[cfg(feature = "std")]
pub mod graph;
pub mod index;
pub mod kernel;
#[cfg(feature = "std")]
pub mod memory;
#[cfg(feature = "std")]
pub mod normalize;
#[cfg(feature = "std")]
pub mod partition;
pub mod schedule;
pub mod sparse;
#[cfg(feature = "std")]
mod workdir;
