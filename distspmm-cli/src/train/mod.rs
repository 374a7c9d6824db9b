//! `distspmm train`: a GCN trained with the distributed SpMM (data-parallel over chunks) or with
//! the feature columns split across ranks (tensor-parallel).

pub mod dense;
pub mod model;
pub mod tensor;
pub mod checkpoint;
