//! One rank's share of a graph for the distributed pipeline: a contiguous piece of the edge
//! list and a contiguous range of nodes with their data.
//!
//! Rank r of P holds the edges `⌊E·r/P⌋ .. ⌊E·(r+1)/P⌋` and the nodes `⌊N·r/P⌋ .. ⌊N·(r+1)/P⌋`
//! ([`slice_range`]); the pieces in rank order are the input's own order, which the chunk
//! builders rely on (duplicate edges sum in edge order).

use std::ops::Range;
use std::vec::Vec;

use super::{Features, Graph, Targets};

/// One rank's share of a graph (see the [module docs](self)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphSlice {
    /// Nodes of the whole graph, N.
    pub num_nodes: usize,
    /// Directed edges of the whole graph, E.
    pub num_edges: u64,
    /// The first of this rank's edges in the input's edge order.
    pub first_edge: u64,
    /// Sources of this rank's edges (global ids).
    pub src: Vec<u32>,
    /// Targets of this rank's edges (global ids).
    pub dst: Vec<u32>,
    /// Their weights, when the graph has any.
    pub weights: Option<Vec<f32>>,
    /// The first of this rank's nodes.
    pub first_node: usize,
    /// The data of this rank's nodes `first_node .. first_node + nodes.num_nodes`, as a graph
    /// of that many nodes without edges.
    pub nodes: Graph,
}

/// Rank `rank`'s share of `0..total` items split over `ranks` ranks.
pub fn slice_range(total: u64, ranks: usize, rank: usize) -> Range<u64> {
    let at = |r: usize| {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "total · r / ranks ≤ total, a u64"
        )]
        let v = (u128::from(total) * r as u128 / ranks.max(1) as u128) as u64;
        v
    };
    at(rank)..at(rank + 1)
}

impl GraphSlice {
    /// Rank `rank`'s share of a whole graph held in memory.
    pub fn cut(graph: &Graph, rank: usize, ranks: usize) -> Self {
        let edges = slice_range(graph.num_edges() as u64, ranks, rank);
        let e =
            distspmm_sparse::index::offset(edges.start)..distspmm_sparse::index::offset(edges.end);
        let nodes = slice_range(graph.num_nodes as u64, ranks, rank);
        let v =
            distspmm_sparse::index::offset(nodes.start)..distspmm_sparse::index::offset(nodes.end);
        GraphSlice {
            num_nodes: graph.num_nodes,
            num_edges: graph.num_edges() as u64,
            first_edge: edges.start,
            src: graph.src[e.clone()].to_vec(),
            dst: graph.dst[e.clone()].to_vec(),
            weights: graph.weights.as_ref().map(|w| w[e].to_vec()),
            first_node: v.start,
            nodes: node_range(graph, v),
        }
    }
}

/// The node data of `graph`'s nodes `range`, as a graph of that many nodes without edges.
pub fn node_range(graph: &Graph, range: Range<usize>) -> Graph {
    let rows = |dim: usize| range.start * dim..range.end * dim;
    Graph {
        num_nodes: range.len(),
        features: graph.features.as_ref().map(|f| {
            let mut data = Vec::with_capacity(range.len() * f.dim);
            for v in range.clone() {
                data.extend_from_slice(f.row(v));
            }
            Features::new(f.dim, data)
        }),
        labels: graph.labels.as_ref().map(|y| y[range.clone()].to_vec()),
        targets: graph.targets.as_ref().map(|t| Targets {
            classes: t.classes,
            data: t.data[rows(t.classes)].to_vec(),
        }),
        train_mask: graph.train_mask.as_ref().map(|m| m[range.clone()].to_vec()),
        val_mask: graph.val_mask.as_ref().map(|m| m[range.clone()].to_vec()),
        test_mask: graph.test_mask.as_ref().map(|m| m[range.clone()].to_vec()),
        ..Graph::default()
    }
}
