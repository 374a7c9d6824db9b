//! Edge list → normalised adjacency matrix Â as a CSR of `f32`.
//!
//! Convention: an edge `u → v` (`src = u`, `dst = v`) means v aggregates u's features, so it
//! becomes the entry `Â[v][u]`; row v lists v's in-neighbours. Undirected graphs list both
//! directions.
//!
//! - [`Normalization::Gcn`]: `Â = D^-1/2 (A + I) D^-1/2` as PyTorch Geometric's `gcn_norm`:
//!   self loops are added the way `add_remaining_self_loops` does — a node that already has a
//!   self loop keeps it (weight as given) instead of getting a second one, every other node gets
//!   weight 1 — and `D` holds the row sums of `A + I` (weighted in-degrees including the loop).
//!   A node of degree 0 (possible only with zero weights) gets a zero row and column, as in
//!   PyG; a negative degree is an error (PyG would produce NaN).
//! - [`Normalization::Row`]: `Â = D^-1 (A + I)` with the same self loops and degrees: each row
//!   averages its neighbourhood.
//! - [`Normalization::None`]: `A` as given (duplicates merged), no self loops added.
//!
//! Duplicate edges are merged by summing their weights (unweighted edges weigh 1). This matches
//! PyG, whose scatter adds duplicates, except for duplicated self loops, which are summed here
//! while PyG keeps one of them.
//!
//! [`adjacency_with_weights`] also returns, entry for entry with Â, the weight of that entry in
//! `A` itself (the merged input weights, 0 at a self loop the normalisation added): what chunks
//! record for models that aggregate with other normalisations than Â's.
//!
//! Cost: linear in edges + nodes (a counting sort by row, a sort of each row's few columns),
//! rows sorted and scaled in parallel under `std`; memory about twice the output.

use core::fmt;
use core::ops::Range;
use core::str::FromStr;
use std::string::String;
use std::vec::Vec;

use distspmm_sparse::index;
use distspmm_sparse::sparse::par::{for_each_block, grain_for};
use distspmm_sparse::sparse::{assemble, CsrOwned, TripletSource};

/// How the adjacency matrix is normalised; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Normalization {
    /// `D^-1/2 (A + I) D^-1/2`, as PyG's `gcn_norm`.
    #[default]
    Gcn,
    /// `D^-1 (A + I)`: row-stochastic mean aggregation.
    Row,
    /// `A` as given, duplicates merged, no self loops added.
    None,
}

impl Normalization {
    /// Lower-case name (`gcn`, `row`, `none`), as parsed by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Normalization::Gcn => "gcn",
            Normalization::Row => "row",
            Normalization::None => "none",
        }
    }
}

impl fmt::Display for Normalization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not `gcn`, `row` or `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown normalisation (expected gcn, row or none)")]
pub struct UnknownNormalization;

impl FromStr for Normalization {
    type Err = UnknownNormalization;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "gcn" | "sym" => Ok(Normalization::Gcn),
            "row" | "mean" => Ok(Normalization::Row),
            "none" => Ok(Normalization::None),
            _ => Err(UnknownNormalization),
        }
    }
}

/// An edge list that cannot be turned into a matrix, named by edge position.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum NormalizeError {
    /// `src` and `dst` differ in length.
    #[error("{src} source ids but {dst} destination ids")]
    EdgeArrays {
        /// Length of `src`.
        src: usize,
        /// Length of `dst`.
        dst: usize,
    },
    /// `weights` does not have one entry per edge.
    #[error("{weights} edge weights for {edges} edges")]
    WeightCount {
        /// Length of `weights`.
        weights: usize,
        /// Number of edges.
        edges: usize,
    },
    /// More nodes than u32 column indices can address.
    #[error("{num_nodes} nodes do not fit u32 node ids")]
    TooManyNodes {
        /// The node count given.
        num_nodes: usize,
    },
    /// An edge endpoint is not below `num_nodes`.
    #[error("edge {edge} has node id {node}, but there are only {num_nodes} nodes")]
    NodeOutOfRange {
        /// Position of the edge.
        edge: usize,
        /// The offending id.
        node: u32,
        /// The node count.
        num_nodes: usize,
    },
    /// A weight is NaN or infinite.
    #[error("edge {edge} has weight {weight}; weights must be finite")]
    NonFiniteWeight {
        /// Position of the edge.
        edge: usize,
        /// The offending weight.
        weight: f32,
    },
    /// Summing the weights of duplicate edges (or of a node's self loops) leaves f32's range.
    #[error(
        "the weights of the edges {src} → {dst} add up to more than f32 can hold (|sum| > \
         3.4e38): scale the edge weights down, or merge the duplicate edges yourself"
    )]
    WeightOverflow {
        /// Source node of the merged entry.
        src: u32,
        /// Target node (the row of Â).
        dst: u32,
    },
    /// A normalised entry leaves f32's range: a tiny (positive) degree, from weights that
    /// nearly cancel, scales a large weight past 3.4e38.
    #[error(
        "the normalised weight of the edge {src} → {dst} is beyond f32's range: its weight is \
         large and a degree is nearly 0 (weights that cancel out): check the edge weights"
    )]
    ScaledOverflow {
        /// Source node of the entry.
        src: u32,
        /// Target node (the row of Â).
        dst: u32,
    },
    /// The matrix does not fit in memory.
    #[error(transparent)]
    Memory(#[from] distspmm_sparse::memory::MemoryError),
    /// A node's weighted degree is negative, so `D^-1/2` does not exist.
    #[error("node {node} has negative weighted degree {degree}")]
    NegativeDegree {
        /// The node.
        node: usize,
        /// Its degree (row sum of A + I).
        degree: f64,
    },
}

/// What to do when the normalised adjacency does not fit.
const MEMORY_HINT: &str = "use a machine with more memory, or a smaller graph";

/// The entries of `A` (or `A + I`) as `(row = dst, column = src, weight)`.
struct Entries<'a> {
    src: &'a [u32],
    dst: &'a [u32],
    weights: Option<&'a [f32]>,
    /// The self loops when they are added (input self loops are then folded into the diagonal
    /// and skipped here).
    diagonal: Option<&'a SelfLoops>,
}

impl TripletSource<f32> for Entries<'_> {
    fn len(&self) -> usize {
        match self.diagonal {
            None => self.src.len(),
            Some(d) => {
                self.src
                    .iter()
                    .zip(self.dst)
                    .filter(|(s, t)| s != t)
                    .count()
                    + d.len()
            }
        }
    }

    fn for_each(&self, mut f: impl FnMut(u32, u32, f32)) {
        let skip_loops = self.diagonal.is_some();
        for (e, (&u, &v)) in self.src.iter().zip(self.dst).enumerate() {
            if skip_loops && u == v {
                continue;
            }
            f(v, u, self.weights.map_or(1.0, |w| w[e]));
        }
        if let Some(d) = self.diagonal {
            for v in 0..d.len() {
                f(index::id(v), index::id(v), d.with_identity(v));
            }
        }
    }
}

/// The normalised adjacency matrix (`num_nodes × num_nodes`) of the edges `src[e] → dst[e]`
/// with optional `weights` (1 when absent); see the [module docs](self) for the conventions.
pub fn adjacency(
    num_nodes: usize,
    src: &[u32],
    dst: &[u32],
    weights: Option<&[f32]>,
    norm: Normalization,
) -> Result<CsrOwned<f32>, NormalizeError> {
    normalized(num_nodes, src, dst, weights, norm, false).map(|(a_hat, _)| a_hat)
}

/// [`adjacency`], and the weight in `A` of each of Â's stored entries, in Â's CSR order: the
/// input edges' weights merged as for Â (1 for an unweighted edge), and 0 at a diagonal entry
/// the normalisation added (a node without a self loop in the input). Under
/// [`Normalization::None`] the weights are Â's values. Costs 4 more bytes per entry.
pub fn adjacency_with_weights(
    num_nodes: usize,
    src: &[u32],
    dst: &[u32],
    weights: Option<&[f32]>,
    norm: Normalization,
) -> Result<(CsrOwned<f32>, Vec<f32>), NormalizeError> {
    normalized(num_nodes, src, dst, weights, norm, true)
        .map(|(a_hat, raw)| (a_hat, raw.unwrap_or_default()))
}

/// [`adjacency`], keeping `A`'s weights at Â's entries when `keep_weights` is set.
fn normalized(
    num_nodes: usize,
    src: &[u32],
    dst: &[u32],
    weights: Option<&[f32]>,
    norm: Normalization,
    keep_weights: bool,
) -> Result<(CsrOwned<f32>, Option<Vec<f32>>), NormalizeError> {
    check_edges(num_nodes, src, dst, weights)?;
    let (n, e) = (num_nodes as u64, src.len() as u64);
    let what = || std::format!("the normalised adjacency of {n} nodes and {e} edges");
    // At the peak: the entries as pairs and the output arrays (8 + 12 bytes per entry, nodes
    // included as self loops, and 4 more for the kept weights), the row pointers and cursors,
    // and per node the diagonal, the degrees and their inverses.
    let per_entry = if keep_weights { 24 } else { 20 };
    distspmm_sparse::memory::check(
        what(),
        e.saturating_add(n)
            .saturating_mul(per_entry)
            .saturating_add(n.saturating_mul(48)),
        MEMORY_HINT,
    )?;
    let diagonal = self_loops(num_nodes, src, dst, weights, norm, &what)?;
    let entries = Entries {
        src,
        dst,
        weights,
        diagonal: diagonal.as_ref(),
    };
    let (indptr, indices, mut data) =
        assemble(num_nodes, &entries).map_err(|failed| assembly_failed(what(), failed.bytes))?;
    if let Some((row, src)) = first_overflow(&indptr, &indices, &data) {
        return Err(NormalizeError::WeightOverflow {
            src,
            dst: index::id(row),
        });
    }
    let raw = if keep_weights {
        Some(raw_weights(
            &indptr,
            &indices,
            &data,
            diagonal.as_ref(),
            index::id,
            &what,
        )?)
    } else {
        None
    };
    drop(diagonal);
    if norm != Normalization::None {
        let mut inv = row_degrees(&indptr, &data, &what)?;
        invert_degrees(&mut inv, norm)?;
        scale_rows(&indptr, &indices, &mut data, &inv, &inv, norm);
        // Finite weights over a positive degree can still leave f32 when the degree is tiny.
        if let Some((row, src)) = first_overflow(&indptr, &indices, &data) {
            return Err(NormalizeError::ScaledOverflow {
                src,
                dst: index::id(row),
            });
        }
    }
    // The assembled arrays are sorted and in range by construction; `new` re-checks them in
    // linear time rather than trusting that with `unsafe`.
    let a_hat = CsrOwned::new(num_nodes, num_nodes, indptr, indices, data)
        .expect("assembled adjacency arrays satisfy the CSR invariants");
    Ok((a_hat, raw))
}

// The steps of [`adjacency`], also run part by part by the bounded-memory chunk builder
// (`chunk::bounded`), which must give exactly the same values: one home for each rule.

/// The error for an assembly whose allocation of `bytes` was refused.
pub(crate) fn assembly_failed(what: String, bytes: u64) -> NormalizeError {
    distspmm_sparse::memory::MemoryError {
        what,
        bytes,
        available: None,
        hint: MEMORY_HINT,
    }
    .into()
}

/// The diagonal of a normalisation that adds self loops, per node: the summed weight of its
/// input self loops, and whether it has any (else the loop is added).
#[derive(Debug)]
pub(crate) struct SelfLoops {
    /// The input self loops' weights summed in edge order (0 without any).
    raw: Vec<f32>,
    /// Whether the input has a self loop on the node.
    looped: Vec<bool>,
}

impl SelfLoops {
    /// Number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }

    /// The diagonal weight of node `v` in `A + I`, as `add_remaining_self_loops`: its input
    /// self loops' weight, or 1 for a loop the normalisation adds.
    pub(crate) fn with_identity(&self, v: usize) -> f32 {
        if self.looped[v] {
            self.raw[v]
        } else {
            1.0
        }
    }

    /// The diagonal weight of node `v` in `A`: 0 for a loop the normalisation adds.
    pub(crate) fn raw(&self, v: usize) -> f32 {
        self.raw[v]
    }
}

/// The self loops of `A + I` under `norm` (`None` for [`Normalization::None`], which adds no
/// loops): a node's input self loops, their weights summed in edge order, or an added loop of
/// weight 1 (see [`SelfLoops`]). Allocated fallibly (for `what`).
pub(crate) fn self_loops(
    num_nodes: usize,
    src: &[u32],
    dst: &[u32],
    weights: Option<&[f32]>,
    norm: Normalization,
    what: &dyn Fn() -> String,
) -> Result<Option<SelfLoops>, NormalizeError> {
    if norm == Normalization::None {
        return Ok(None);
    }
    let mut raw = distspmm_sparse::memory::try_filled(num_nodes, 0.0f32, what(), MEMORY_HINT)?;
    let mut looped = distspmm_sparse::memory::try_filled(num_nodes, false, what(), MEMORY_HINT)?;
    for (e, (&u, &v)) in src.iter().zip(dst).enumerate() {
        if u == v {
            let w = weights.map_or(1.0, |w| w[e]);
            let d = &mut raw[v as usize];
            *d = if looped[v as usize] { *d + w } else { w };
            looped[v as usize] = true;
        }
    }
    Ok(Some(SelfLoops { raw, looped }))
}

/// The weights of `A` at the entries of assembled, unscaled rows of `A` or `A + I`
/// (`indptr`, `indices` in original column ids, `data`), entry for entry: `data` itself, with
/// each row's diagonal entry set to its weight in `A` when `loops` were added (0 for an added
/// loop; the input loops' sum otherwise, which is already the entry's value). `row_node(i)` is
/// row i's node. Allocated fallibly (for `what`).
pub(crate) fn raw_weights(
    indptr: &[u64],
    indices: &[u32],
    data: &[f32],
    loops: Option<&SelfLoops>,
    row_node: impl Fn(usize) -> u32,
    what: &dyn Fn() -> String,
) -> Result<Vec<f32>, NormalizeError> {
    let mut raw = distspmm_sparse::memory::try_with_capacity(data.len(), what(), MEMORY_HINT)?;
    raw.extend_from_slice(data);
    if let Some(loops) = loops {
        for (i, w) in indptr.windows(2).enumerate() {
            let (s, e) = (index::offset(w[0]), index::offset(w[1]));
            let v = row_node(i);
            // Every row of `A + I` holds its diagonal entry exactly once.
            if let Ok(t) = indices[s..e].binary_search(&v) {
                raw[s + t] = loops.raw(v as usize);
            }
        }
    }
    Ok(raw)
}

/// The first entry (row, column), in row order, whose value is not finite: before scaling (every
/// weight being finite) a sum of duplicates that overflowed, after it a weight over a tiny degree.
pub(crate) fn first_overflow(
    indptr: &[u64],
    indices: &[u32],
    data: &[f32],
) -> Option<(usize, u32)> {
    let k = data.iter().position(|w| !w.is_finite())?;
    let row = indptr.partition_point(|&start| index::offset(start) <= k) - 1;
    Some((row, indices[k]))
}

/// Each row's sum (its node's weighted degree in `A + I`), in f64, in column order; allocated
/// fallibly (for `what`).
pub(crate) fn row_degrees(
    indptr: &[u64],
    data: &[f32],
    what: &dyn Fn() -> String,
) -> Result<Vec<f64>, NormalizeError> {
    let mut degree =
        distspmm_sparse::memory::try_filled(indptr.len() - 1, 0.0f64, what(), MEMORY_HINT)?;
    for (d, w) in degree.iter_mut().zip(indptr.windows(2)) {
        *d = data[index::offset(w[0])..index::offset(w[1])]
            .iter()
            .map(|&x| f64::from(x))
            .sum();
    }
    Ok(degree)
}

/// Turns the degrees, in place, into the per-node factors `D^-1/2` ([`Normalization::Gcn`]) or
/// `D^-1` (otherwise), 0 for degree 0; a negative degree is an error naming the first such node.
pub(crate) fn invert_degrees(
    degree: &mut [f64],
    norm: Normalization,
) -> Result<(), NormalizeError> {
    if let Some((node, &degree)) = degree.iter().enumerate().find(|(_, &d)| d < 0.0) {
        return Err(NormalizeError::NegativeDegree { node, degree });
    }
    for d in degree {
        *d = match (*d > 0.0, norm) {
            (false, _) => 0.0,
            (true, Normalization::Gcn) => 1.0 / d.sqrt(),
            (true, _) => 1.0 / *d,
        };
    }
    Ok(())
}

/// Scales the rows `(indptr, indices, data)` in place, in parallel: entry (i, u) by
/// `row_inv[i] · col_inv[u]` ([`Normalization::Gcn`]) or by `row_inv[i]` (otherwise), in f64,
/// rounded once to f32. `row_inv` has one factor per row of these arrays, `col_inv` one per
/// column id.
pub(crate) fn scale_rows(
    indptr: &[u64],
    indices: &[u32],
    data: &mut [f32],
    row_inv: &[f64],
    col_inv: &[f64],
    norm: Normalization,
) {
    let nrows = indptr.len() - 1;
    let scale = |rows: Range<usize>, values: &mut [f32]| {
        let base = index::offset(indptr[rows.start]);
        for v in rows {
            let (s, e) = (
                index::offset(indptr[v]) - base,
                index::offset(indptr[v + 1]) - base,
            );
            let cols = &indices[s + base..e + base];
            for (w, &u) in values[s..e].iter_mut().zip(cols) {
                let factor = match norm {
                    Normalization::Gcn => row_inv[v] * col_inv[u as usize],
                    _ => row_inv[v],
                };
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "deliberate: the weight is computed in f64 and rounded to f32 once"
                )]
                let weight = (f64::from(*w) * factor) as f32;
                *w = weight;
            }
        }
    };
    let total = indptr[nrows] + nrows as u64;
    for_each_block(indptr, 0..nrows, 1, grain_for(total, 1 << 16), data, &scale);
}

pub(crate) fn check_edges(
    num_nodes: usize,
    src: &[u32],
    dst: &[u32],
    weights: Option<&[f32]>,
) -> Result<(), NormalizeError> {
    if src.len() != dst.len() {
        return Err(NormalizeError::EdgeArrays {
            src: src.len(),
            dst: dst.len(),
        });
    }
    if num_nodes > u32::MAX as usize + 1 {
        return Err(NormalizeError::TooManyNodes { num_nodes });
    }
    if let Some(w) = weights {
        if w.len() != src.len() {
            return Err(NormalizeError::WeightCount {
                weights: w.len(),
                edges: src.len(),
            });
        }
        if let Some((edge, &weight)) = w.iter().enumerate().find(|(_, w)| !w.is_finite()) {
            return Err(NormalizeError::NonFiniteWeight { edge, weight });
        }
    }
    for (edge, (&u, &v)) in src.iter().zip(dst).enumerate() {
        for node in [u, v] {
            if node as usize >= num_nodes {
                return Err(NormalizeError::NodeOutOfRange {
                    edge,
                    node,
                    num_nodes,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Â computed densely in f64 from the module-doc definitions.
    fn dense_reference(
        n: usize,
        src: &[u32],
        dst: &[u32],
        weights: Option<&[f32]>,
        norm: Normalization,
    ) -> Vec<f64> {
        let w = |e: usize| weights.map_or(1.0, |w| f64::from(w[e]));
        let mut a = vec![0.0f64; n * n];
        let mut has_loop = vec![false; n];
        for e in 0..src.len() {
            let (u, v) = (src[e] as usize, dst[e] as usize);
            if u == v && norm != Normalization::None {
                if !has_loop[v] {
                    a[v * n + v] = 0.0;
                }
                has_loop[v] = true;
            }
            a[v * n + u] += w(e);
        }
        if norm == Normalization::None {
            return a;
        }
        for v in 0..n {
            if !has_loop[v] {
                a[v * n + v] = 1.0;
            }
        }
        let deg: Vec<f64> = (0..n).map(|v| a[v * n..(v + 1) * n].iter().sum()).collect();
        let inv = |d: f64, p: f64| if d > 0.0 { d.powf(-p) } else { 0.0 };
        for v in 0..n {
            for u in 0..n {
                a[v * n + u] *= match norm {
                    Normalization::Gcn => inv(deg[v], 0.5) * inv(deg[u], 0.5),
                    _ => inv(deg[v], 1.0),
                };
            }
        }
        a
    }

    #[test]
    fn a_normalised_weight_beyond_f32_is_an_error_not_infinity() {
        // Row 2's degree is 3e38 − 3e38 + 1e-30 (summed in column order): positive but tiny,
        // so scaling its entries by it overflows.
        let (src, dst, w) = ([0u32, 1, 2], [2u32, 2, 2], [3e38f32, -3e38, 1e-30]);
        for norm in [Normalization::Gcn, Normalization::Row] {
            let err = adjacency(3, &src, &dst, Some(&w), norm).unwrap_err();
            assert!(
                matches!(err, NormalizeError::ScaledOverflow { dst: 2, .. }),
                "{norm}: {err}"
            );
            assert!(
                std::format!("{err}").contains("check the edge weights"),
                "{err}"
            );
        }
        // Without normalisation the weights are kept as given.
        adjacency(3, &src, &dst, Some(&w), Normalization::None).unwrap();
    }

    #[test]
    fn two_node_path_and_isolated_node() {
        // 0 — 1 undirected, node 2 isolated: Â = [[.5 .5 0] [.5 .5 0] [0 0 1]].
        let a = adjacency(3, &[0, 1], &[1, 0], None, Normalization::Gcn).unwrap();
        assert_eq!(
            a.to_dense(),
            vec![0.5, 0.5, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 1.0]
        );
        let r = adjacency(3, &[0, 1], &[1, 0], None, Normalization::Row).unwrap();
        assert_eq!(
            r.to_dense(),
            vec![0.5, 0.5, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 1.0]
        );
    }

    #[test]
    fn direction_convention_and_existing_self_loops() {
        // Edge 0 → 1: node 1 aggregates node 0, so Â[1][0] ≠ 0 and Â[0][1] = 0.
        // The self loop on node 0 is kept once (weight 1, not 2).
        let a = adjacency(2, &[0, 0], &[1, 0], None, Normalization::None).unwrap();
        assert_eq!(a.to_dense(), vec![1.0, 0.0, 1.0, 0.0]);
        let g = adjacency(2, &[0, 0], &[1, 0], None, Normalization::Gcn).unwrap();
        let s = 1.0 / 2.0f32.sqrt();
        assert_eq!(g.nnz(), 3);
        let d = g.to_dense();
        assert_eq!(d[0], 1.0);
        assert_eq!(d[1], 0.0);
        assert!((d[2] - s).abs() < 1e-7 && (d[3] - 0.5).abs() < 1e-7);
    }

    #[test]
    fn duplicate_weights_that_overflow_f32_are_an_error() {
        let big = 3e38f32;
        for norm in [Normalization::Gcn, Normalization::Row, Normalization::None] {
            let err =
                adjacency(3, &[0, 0, 1], &[2, 2, 1], Some(&[big, big, 1.0]), norm).unwrap_err();
            assert!(
                matches!(err, NormalizeError::WeightOverflow { src: 0, dst: 2 }),
                "{norm}: {err}"
            );
            assert!(std::format!("{err}").contains("0 → 2"), "{err}");
        }
        // Self loops: summed into the diagonal.
        let err =
            adjacency(2, &[1, 1], &[1, 1], Some(&[big, big]), Normalization::Gcn).unwrap_err();
        assert!(
            matches!(err, NormalizeError::WeightOverflow { src: 1, dst: 1 }),
            "{err}"
        );
        // Large but in range: fine, and the degrees (f64) are exact enough.
        let a = adjacency(2, &[0], &[1], Some(&[big]), Normalization::Row).unwrap();
        assert!(a.data().iter().all(|w| w.is_finite()));
    }

    #[test]
    fn bad_edges_are_rejected_with_their_position() {
        let n = Normalization::Gcn;
        assert!(matches!(
            adjacency(3, &[0, 1], &[1], None, n),
            Err(NormalizeError::EdgeArrays { src: 2, dst: 1 })
        ));
        assert!(matches!(
            adjacency(3, &[0, 1], &[1, 3], None, n),
            Err(NormalizeError::NodeOutOfRange {
                edge: 1,
                node: 3,
                ..
            })
        ));
        assert!(matches!(
            adjacency(3, &[0, 1], &[1, 2], Some(&[1.0]), n),
            Err(NormalizeError::WeightCount {
                weights: 1,
                edges: 2
            })
        ));
        assert!(matches!(
            adjacency(3, &[0, 1], &[1, 2], Some(&[1.0, f32::NAN]), n),
            Err(NormalizeError::NonFiniteWeight { edge: 1, .. })
        ));
        assert!(matches!(
            adjacency(3, &[0], &[1], Some(&[f32::INFINITY]), n),
            Err(NormalizeError::NonFiniteWeight { edge: 0, .. })
        ));
        assert!(matches!(
            adjacency(2, &[0], &[1], Some(&[-3.0]), n),
            Err(NormalizeError::NegativeDegree { node: 1, .. })
        ));
        assert_eq!("GCN".parse::<Normalization>(), Ok(Normalization::Gcn));
        assert!("sideways".parse::<Normalization>().is_err());
    }

    fn graphs() -> impl Strategy<Value = (usize, Vec<(u32, u32, f32)>)> {
        (0usize..14).prop_flat_map(|n| {
            let edges = if n == 0 {
                Just(Vec::new()).boxed()
            } else {
                // Weights in (0, 2]: positive, so degrees are positive; duplicates and self
                // loops occur often at these sizes.
                proptest::collection::vec(
                    (
                        0..u32::try_from(n).unwrap(),
                        0..u32::try_from(n).unwrap(),
                        1u8..=8,
                    ),
                    0..3 * n,
                )
                .prop_map(|v| {
                    v.into_iter()
                        .map(|(a, b, w)| (a, b, f32::from(w) / 4.0))
                        .collect()
                })
                .boxed()
            };
            (Just(n), edges)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn matches_the_dense_definition((n, edges) in graphs(), weighted in any::<bool>()) {
            let src: Vec<u32> = edges.iter().map(|e| e.0).collect();
            let dst: Vec<u32> = edges.iter().map(|e| e.1).collect();
            let w: Vec<f32> = edges.iter().map(|e| e.2).collect();
            let weights = weighted.then_some(&w[..]);
            for norm in [Normalization::Gcn, Normalization::Row, Normalization::None] {
                let a = adjacency(n, &src, &dst, weights, norm).unwrap();
                let want = dense_reference(n, &src, &dst, weights, norm);
                let got = a.to_dense();
                for (k, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    prop_assert!(
                        (f64::from(g) - r).abs() <= 1e-6 * r.abs().max(1.0),
                        "{norm}: entry ({}, {}) = {g}, expected {r}", k / n.max(1), k % n.max(1)
                    );
                }
                // A's weights at Â's entries: A's value (0 at an added loop), every entry of A
                // among them; Â's values themselves without normalisation.
                let (a_hat, raw) = adjacency_with_weights(n, &src, &dst, weights, norm).unwrap();
                prop_assert_eq!(&a_hat, &a);
                prop_assert_eq!(raw.len(), a.nnz());
                let plain = dense_reference(n, &src, &dst, weights, Normalization::None);
                let mut stored = 0;
                for v in 0..n {
                    let (cols, _) = a.row(v);
                    let start = index::offset(a.indptr()[v]);
                    for (t, &u) in cols.iter().enumerate() {
                        let want = plain[v * n + u as usize];
                        prop_assert_eq!(f64::from(raw[start + t]), want, "({}, {})", v, u);
                        stored += usize::from(want != 0.0);
                    }
                }
                prop_assert_eq!(stored, plain.iter().filter(|&&x| x != 0.0).count());
                if norm == Normalization::None {
                    prop_assert_eq!(&raw[..], a.data());
                }
                if norm != Normalization::None {
                    // Every node has its diagonal entry, stored exactly once.
                    for v in 0..n {
                        let (cols, _) = a.row(v);
                        prop_assert_eq!(cols.iter().filter(|&&c| c as usize == v).count(), 1);
                    }
                }
            }
        }
    }
}
