//! The trainer as a small layer library: every model here is a stack of message-passing layers,
//! each a composition of two distributed primitives — a generalised SpMM (aggregate rows with
//! edge values: `Y = A_e·X`, the chunk's `Â` being one choice of `e`) and a generalised SDDMM
//! (a value per edge from its two end rows) — plus dense products and element-wise steps.
//!
//! - [`Graph`]: what a layer sees of the graph, for this rank's rows: the aggregation with the
//!   chunk's normalised values, the per-edge operand with the SpMM/SDDMM over it, the edge
//!   softmax, and the per-edge weights each aggregator needs. Data-parallel training puts the
//!   distributed operator behind it; tensor-parallel training and the tests a whole graph in one
//!   process.
//! - [`Layer`]: one layer with its parameters and its cached forward state. A layer owns the
//!   dropout of its input and the activation of its output, so that fused epilogues stay inside
//!   the layer that can fuse them.
//! - [`Net`](net::Net): the stack, one Adam, one loss (log-softmax + NLL over the training
//!   nodes), optional residual connections, the checkpointed parameters.
//!
//! Dropout masks are counter-keyed ([`crate::dropout`]) by (seed, epoch, layer, original node
//! id, column), and attention-dropout masks by (seed, epoch, layer, destination and source
//! original ids, head), so a run's losses do not depend on the number of ranks.

use std::ops::Range;

use anyhow::{ensure, Result};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};

use crate::model::zeros;
pub use crate::model::{Aggregate, LocalData, Reduce};

pub mod act;
pub mod gat;
pub mod gcn;
pub mod gin;
pub mod net;
pub mod sage;
#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test references computed in f64 and rounded to f32 on purpose"
)]
pub(crate) mod testing;

/// Which per-edge weights an aggregator reads ([`Graph::edge_weights`]), all over the edges of
/// the graph's `A` (the input's edges, duplicates merged by summing their weights; no self
/// loop is added). In the per-edge operand's layout, which also holds the diagonal entries the
/// GCN normalisation adds: those carry weight 0 here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeWeights {
    /// `w_ij`: the sum aggregator (GIN).
    Sum,
    /// `w_ij / Σ_j' w_ij'`: the mean over in-neighbours (GraphSAGE); a row without in-edges
    /// aggregates to 0.
    Mean,
}

/// What a layer sees of the graph: this rank's rows and the distributed primitives over them.
/// Every method that communicates is collective: all ranks call it in the same order with the
/// same widths.
pub trait Graph: Aggregate {
    /// Rows this rank owns (the rows of every operand below).
    fn rows(&self) -> usize;

    /// Values of the per-edge operand: this rank's stored non-zeros, in one fixed layout.
    fn edge_count(&self) -> usize;

    /// The per-edge weights of one aggregator ([`EdgeWeights`]), computed once and kept.
    ///
    /// # Errors
    /// When the data does not carry the graph's own edge weights (chunks written before they
    /// were recorded): the message says how to rebuild them.
    fn edge_weights(&mut self, kind: EdgeWeights) -> Result<&[f32]>;

    /// `(destination, source)` original node ids of every position of the per-edge operand
    /// (the keys of attention dropout). Collective the first time (the sources' ids come from
    /// their owners), then kept.
    ///
    /// # Errors
    /// When the exchange fails.
    fn edge_ends(&mut self) -> Result<&[(u64, u64)]>;

    /// `y = A_e·x`: rows aggregated with the per-edge values `e` ([`Graph::edge_count`] of
    /// them). [`Graph::spmm_edges_grouped`] with one group.
    ///
    /// # Errors
    /// When the product or its exchange fails.
    fn spmm_edges(
        &mut self,
        e: &[f32],
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.spmm_edges_grouped(1, e, x, y)
    }

    /// `dx = A_eᵀ·dy`. [`Graph::spmm_edges_transpose_grouped`] with one group.
    ///
    /// # Errors
    /// As [`Graph::spmm_edges`].
    fn spmm_edges_transpose(
        &mut self,
        e: &[f32],
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.spmm_edges_transpose_grouped(1, e, dy, dx)
    }

    /// `e[k] = ⟨u_i, v_j⟩` for the edge `j → i` at position `k`. [`Graph::sddmm_grouped`] with
    /// one group.
    ///
    /// # Errors
    /// As [`Graph::spmm_edges`].
    fn sddmm(&mut self, u: DenseView<'_, f32>, v: DenseView<'_, f32>, e: &mut [f32]) -> Result<()> {
        self.sddmm_grouped(1, u, v, e)
    }

    /// The gradients of [`Graph::sddmm`]: `du_i = Σ_j de_ij·v_j`, `dv_j = Σ_i de_ij·u_i`
    /// (overwritten). [`Graph::sddmm_backward_grouped`] with one group.
    ///
    /// # Errors
    /// As [`Graph::spmm_edges`].
    fn sddmm_backward(
        &mut self,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        du: DenseViewMut<'_, f32>,
        dv: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.sddmm_backward_grouped(1, de, u, v, du, dv)
    }

    /// [`Graph::spmm_edges`] for `groups` groups (the heads of an attention layer) in one
    /// pass over the edges: `e` holds `groups` runs of [`Graph::edge_count`] values (run g at
    /// `g·edge_count`), `x` and `y` have `groups·C` columns, and `y_i[g·C..(g+1)·C] =
    /// Σ_j e_g[ij]·x_j[g·C..(g+1)·C]`.
    ///
    /// # Errors
    /// As [`Graph::spmm_edges`]; operands that do not split into the groups.
    fn spmm_edges_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<()>;

    /// [`Graph::spmm_edges_transpose`] for `groups` groups: `dx_j[g·C..] = Σ_i e_g[ij]·dy_i[g·C..]`.
    ///
    /// # Errors
    /// As [`Graph::spmm_edges_grouped`].
    fn spmm_edges_transpose_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<()>;

    /// [`Graph::sddmm`] for `groups` groups: `e_g[ij] = ⟨u_i[g·w..(g+1)·w], v_j[g·w..(g+1)·w]⟩`
    /// into `groups` runs of [`Graph::edge_count`] values.
    ///
    /// # Errors
    /// As [`Graph::spmm_edges_grouped`].
    fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<()>;

    /// The gradients of [`Graph::sddmm_grouped`], per group: `du_i[g·w..] = Σ_j de_g[ij]·v_j[g·w..]`,
    /// `dv_j[g·w..] = Σ_i de_g[ij]·u_i[g·w..]` (overwritten).
    ///
    /// # Errors
    /// As [`Graph::spmm_edges_grouped`].
    fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        du: DenseViewMut<'_, f32>,
        dv: DenseViewMut<'_, f32>,
    ) -> Result<()>;

    /// Softmax of `LeakyReLU_slope(logits)` over each destination row's in-edges (no
    /// LeakyReLU when `slope` is `None`). [`Graph::edge_softmax_grouped`] with one group.
    ///
    /// # Errors
    /// When an operand does not hold [`Graph::edge_count`] values.
    fn edge_softmax(&mut self, slope: Option<f32>, logits: &[f32], out: &mut [f32]) -> Result<()> {
        self.edge_softmax_grouped(1, slope, logits, out)
    }

    /// The gradient of [`Graph::edge_softmax`] with respect to `logits`, from its result `out`
    /// and `d_out` (overwrites `d_logits`). [`Graph::edge_softmax_backward_grouped`] with one
    /// group.
    ///
    /// # Errors
    /// As [`Graph::edge_softmax`].
    fn edge_softmax_backward(
        &mut self,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d_out: &[f32],
        d_logits: &mut [f32],
    ) -> Result<()> {
        ensure!(
            d_out.len() == d_logits.len(),
            "edge_softmax_backward: {} values of d_out for {} of d_logits",
            d_out.len(),
            d_logits.len()
        );
        d_logits.copy_from_slice(d_out);
        self.edge_softmax_backward_grouped(1, slope, logits, out, d_logits)
    }

    /// [`Graph::edge_softmax`] for `groups` groups (the heads of an attention layer) in one
    /// pass over the rows: `logits` and `out` hold `groups` runs of [`Graph::edge_count`]
    /// values (run g at `g·edge_count`), each normalised over each row's in-edges. Local.
    ///
    /// # Errors
    /// When `groups` is 0 or an operand does not hold `groups` runs of [`Graph::edge_count`]
    /// values.
    fn edge_softmax_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<()>;

    /// [`Graph::edge_softmax_backward`] for `groups` groups, the runs as in
    /// [`Graph::edge_softmax_grouped`] (`logits` read only with a `slope`), in place: `d`
    /// holds the gradient of `out` on entry and that of `logits` on return. Local.
    ///
    /// # Errors
    /// As [`Graph::edge_softmax_grouped`].
    fn edge_softmax_backward_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d: &mut [f32],
    ) -> Result<()>;

    /// How this graph splits a layer's input columns across ranks (tensor parallelism,
    /// [`crate::tensor::ColumnSplit`]): `Some((rank, ranks))` when every rank holds every row
    /// and computes the contribution of its own slice of each layer's input columns, `None`
    /// (the default) when the layer sees all columns of its rows.
    ///
    /// A layer's *column-linear stage* is the part of its forward pass that is linear in its
    /// input (the aggregation and the first product: `Â·x̃·W` for the GCN, `mean(x̃)·W_l + x̃·W_r`
    /// for SAGE, `((1+ε)·x̃ + Σ x̃_j)·W_1` for GIN, `x̃·W` for GAT). Under a split it is computed
    /// over [`Graph::columns`] with the matching rows of the weights, completed by
    /// [`Graph::sum_columns`]; the rest of the layer runs on every rank alike.
    fn column_split(&self) -> Option<(usize, usize)> {
        None
    }

    /// The input columns of a `width`-wide layer input whose contribution this rank computes
    /// (all of them unless the graph splits columns).
    fn columns(&self, width: usize) -> Range<usize> {
        0..width
    }

    /// Completes a column-linear stage computed over [`Graph::columns`] by summing it across
    /// the ranks that split the columns (nothing to do unless the graph splits columns).
    ///
    /// # Errors
    /// When the reduction fails.
    fn sum_columns(&mut self, _partial: &mut [f32]) -> Result<()> {
        Ok(())
    }

    /// Assembles a layer's input gradient from each rank's columns: `block` holds this rank's
    /// [`Graph::columns`]`(width)` of every row (`rows × cols`), `dx` gets all `width` columns
    /// (`rows × width`). Without a split `block` is the whole gradient and is copied.
    ///
    /// # Errors
    /// When the reduction fails or the buffers are shorter than their shapes.
    fn gather_columns(&mut self, width: usize, block: &[f32], dx: &mut [f32]) -> Result<()> {
        let len = self.rows() * width;
        ensure!(
            block.len() >= len && dx.len() >= len,
            "the input gradient's buffers hold {} and {} values, {len} needed",
            block.len(),
            dx.len()
        );
        dx[..len].copy_from_slice(&block[..len]);
        Ok(())
    }

    /// Bytes received and seconds spent in the reductions of a column split so far (0 without
    /// one).
    fn column_traffic(&self) -> (u64, f64) {
        (0, 0.0)
    }
}

/// One forward or backward pass, as a layer needs to know it.
#[derive(Debug, Clone, Copy)]
pub struct Pass<'a> {
    /// The run's seed (dropout keys).
    pub seed: u64,
    /// 0-based epoch (dropout keys).
    pub epoch: u64,
    /// Whether this is a training pass (dropout on) or an evaluation.
    pub training: bool,
    /// Original node id of each of this rank's rows (dropout keys).
    pub ids: &'a [u64],
}

/// A named parameter tensor of a layer, in the layer's fixed order.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    /// Name within the layer (`weight`, `bias`, `att_src`, …).
    pub name: &'static str,
    /// Shape (row-major).
    pub shape: [usize; 2],
    /// Whether `--weight-decay` applies to it under the model's rule.
    pub decay: bool,
    /// Whether, under a column split ([`Graph::column_split`]), each rank computes a part of
    /// this parameter's gradient that the ranks sum (the weights of a column-linear stage,
    /// whose rows are the input's columns, and GIN's ε); otherwise every rank computes the
    /// whole gradient alike.
    pub split: bool,
}

/// One layer of a [`net::Net`]: its input dropout, its message passing, its output activation,
/// its parameters and its cached forward state.
pub trait Layer: std::fmt::Debug + Send {
    /// `(in, out)` widths.
    fn dims(&self) -> (usize, usize);

    /// The parameter tensors, in the order of [`Layer::params`].
    fn specs(&self) -> Vec<ParamSpec>;

    /// The parameter values, one slice per [`ParamSpec`].
    fn params(&self) -> Vec<&[f32]>;

    /// The parameter values, mutable, one slice per [`ParamSpec`].
    fn params_mut(&mut self) -> Vec<&mut [f32]>;

    /// Forward pass over this rank's rows: `x` is the layer's input (`rows × in`, before its
    /// dropout); the activated output is then [`Layer::output`].
    ///
    /// # Errors
    /// When a distributed primitive fails.
    fn forward(&mut self, g: &mut dyn Graph, x: &[f32], pass: &Pass<'_>) -> Result<()>;

    /// The activated output of the last forward pass (`rows × out`).
    fn output(&self) -> &[f32];

    /// Backward pass of the last training forward pass: `dy` is the gradient with respect to
    /// [`Layer::output`] (`rows × out`; the layer may overwrite it), `x` the input that pass
    /// read. Writes the parameter gradients into `grad` (flat, the [`Layer::params`] order
    /// concatenated, overwritten) and, when `dx` is given, the gradient with respect to `x`
    /// (`rows × in`, overwritten).
    ///
    /// # Errors
    /// When a distributed primitive fails.
    fn backward(
        &mut self,
        g: &mut dyn Graph,
        x: &[f32],
        dy: &mut [f32],
        grad: &mut [f32],
        dx: Option<&mut [f32]>,
        pass: &Pass<'_>,
    ) -> Result<()>;
}

/// f32 elements of the layer's parameters (the sum of its [`ParamSpec`] shapes).
pub fn param_len(specs: &[ParamSpec]) -> usize {
    specs.iter().map(|s| s.shape[0] * s.shape[1]).sum()
}

/// Checks the graph, the node ids and the input a layer is handed against its `rows` rows of
/// `fi` input features.
pub(crate) fn check_forward(
    g: &dyn Graph,
    x: &[f32],
    pass: &Pass<'_>,
    (rows, fi): (usize, usize),
) -> Result<()> {
    ensure!(
        g.rows() == rows,
        "the graph has {} rows but the layer was built for {rows}",
        g.rows()
    );
    ensure!(
        pass.ids.len() == rows,
        "{} node ids for {rows} rows",
        pass.ids.len()
    );
    ensure!(
        x.len() >= rows * fi,
        "the layer's input holds {} values, {rows} rows of {fi} need {}",
        x.len(),
        rows * fi
    );
    Ok(())
}

/// Checks the operands of a backward pass (`dy`: `rows × fo`, `grad`: `params`, `dx`:
/// `rows × fi`).
pub(crate) fn check_backward(
    (rows, fi, fo): (usize, usize, usize),
    dy: &[f32],
    grad: &[f32],
    params: usize,
    dx: Option<&[f32]>,
) -> Result<()> {
    ensure!(
        dy.len() >= rows * fo,
        "the output gradient holds {} values, {rows} rows of {fo} need {}",
        dy.len(),
        rows * fo
    );
    ensure!(
        grad.len() == params,
        "the parameter gradient holds {} values, the layer has {params} parameters",
        grad.len()
    );
    if let Some(dx) = dx {
        ensure!(
            dx.len() >= rows * fi,
            "the input gradient holds {} values, {rows} rows of {fi} need {}",
            dx.len(),
            rows * fi
        );
    }
    Ok(())
}

/// The graph's per-edge weights of `kind` copied into `buf` (the layer's own, allocated once
/// and grown only if the graph holds more edges), so that they can be handed back to the
/// graph's products.
pub(crate) fn load_edge_weights(
    g: &mut dyn Graph,
    kind: EdgeWeights,
    buf: &mut Vec<f32>,
) -> Result<()> {
    let count = g.edge_count();
    if buf.len() != count {
        *buf = zeros(count, "the per-edge weights")?;
    }
    let w = g.edge_weights(kind)?;
    ensure!(
        w.len() == count,
        "the graph returned {} edge weights for {count} edges",
        w.len()
    );
    buf.copy_from_slice(w);
    Ok(())
}
