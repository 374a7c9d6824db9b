//! The preprocessing of distspmm, in the order the data flows: read a graph ([`graph`]: `.npz`,
//! `.npy` directories, edge lists, Matrix Market, METIS files, generators), partition it
//! ([`partition`]: METIS, KaMinPar, the degree rule of `auto`, saved maps), normalise its
//! adjacency ([`normalize`]: Â), and build each part's chunk ([`chunk`]: in memory or with
//! bounded memory) into a chunk directory. [`prep::run`] is the whole pipeline as one call.
//!
//! The runtime (the operator, the trainer, the C library) reads chunk directories through
//! `chunk_format::dir` and never links this crate, its partitioners or their C++.

pub mod chunk;
pub mod graph;
pub mod normalize;
pub mod output;
pub mod partition;
pub mod prep;
