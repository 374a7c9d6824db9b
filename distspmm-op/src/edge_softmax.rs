//! The softmax of per-edge values over each destination row's in-edges (GAT's attention
//! normalisation), optionally after a LeakyReLU: `α_ij = exp(a_ij − m_i) / Σ_j' exp(a_ij' − m_i)`
//! with `a = LeakyReLU(z)` (or `a = z`) and `m_i` the row's largest `a`.
//!
//! A row's entries all live on the rank that owns the row, spread over the blocks of the
//! [`EdgeLayout`] (the diagonal block, then `A[p][q]` in increasing q), so the calls are local:
//! no communication and no agreement. Every row is computed on one thread, its entries visited
//! in layout order (block by block, CSR order within a block), so the result has the same bits
//! for any number of rayon threads.

use std::ops::Range;

use chunk_format::ChunkView;
use rayon::prelude::*;

use crate::{check_operands, ChunkSource, DistSpmm, DistSpmmError, EdgeLayout};

#[cfg(test)]
mod tests;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 256;

/// Where each row's entries sit in the per-edge operand: per layout block, its first position
/// and its CSR row pointer.
struct RowRuns<'a> {
    blocks: Vec<(usize, &'a [u64])>,
    rows: usize,
}

impl<'a> RowRuns<'a> {
    fn new(chunk: &ChunkView<'a>, layout: &EdgeLayout) -> Self {
        let blocks = layout
            .blocks()
            .iter()
            .enumerate()
            .map(|(k, eb)| (eb.first, chunk.block(layout.chunk_index(k)).csr_rowptr))
            .collect();
        Self {
            blocks,
            rows: chunk.num_local_nodes(),
        }
    }

    /// Positions of `rows` in block `k`, relative to the block.
    fn span(&self, k: usize, rows: Range<usize>) -> Range<usize> {
        let rowptr = self.blocks[k].1;
        // Entries of a validated row pointer: positions in the block's arrays.
        distspmm_core::index::offset(rowptr[rows.start])
            ..distspmm_core::index::offset(rowptr[rows.end])
    }

    /// Runs `body(rows, pieces)` for consecutive groups of rows in parallel, `pieces[k]` being
    /// the group's run of `out` in block `k` (the runs of a group are disjoint from every other
    /// group's, so each row is written by one task only).
    fn for_each_group<F>(&self, out: &mut [f32], body: F)
    where
        F: Fn(Range<usize>, &mut [&mut [f32]]) + Sync,
    {
        let groups: Vec<Range<usize>> = (0..self.rows)
            .step_by(ROWS_PER_TASK)
            .map(|s| s..(s + ROWS_PER_TASK).min(self.rows))
            .collect();
        let mut pieces: Vec<Vec<&mut [f32]>> = groups
            .iter()
            .map(|_| Vec::with_capacity(self.blocks.len()))
            .collect();
        // The layout's blocks are consecutive and each block's rows are in order: cutting `out`
        // front to back gives every (block, group) run.
        let mut rest = out;
        for k in 0..self.blocks.len() {
            for (g, rows) in groups.iter().enumerate() {
                let (run, tail) =
                    std::mem::take(&mut rest).split_at_mut(self.span(k, rows.clone()).len());
                pieces[g].push(run);
                rest = tail;
            }
        }
        groups
            .into_par_iter()
            .zip(pieces.par_iter_mut())
            .for_each(|(rows, pieces)| body(rows, pieces));
    }

    /// Calls `visit(k, at, local)` for each block `k` holding entries of `row`, `at` the
    /// entries' positions in the operand and `local` their positions in the run of `row`'s
    /// group (whose first row is `first`).
    fn visit_row(
        &self,
        first: usize,
        row: usize,
        mut visit: impl FnMut(usize, Range<usize>, Range<usize>),
    ) {
        for k in 0..self.blocks.len() {
            let span = self.span(k, row..row + 1);
            if span.is_empty() {
                continue;
            }
            let base = self.span(k, first..first).start;
            let at = self.blocks[k].0 + span.start..self.blocks[k].0 + span.end;
            visit(k, at, span.start - base..span.end - base);
        }
    }
}

/// LeakyReLU with `slope` (`None`: the identity).
#[inline]
fn activate(slope: Option<f32>, z: f32) -> f32 {
    match slope {
        Some(s) if z <= 0.0 => s * z,
        _ => z,
    }
}

/// The activation's derivative at `z`: 1 for `z > 0`, `slope` otherwise (PyTorch's choice at 0).
#[inline]
fn gate(slope: Option<f32>, z: f32) -> f32 {
    match slope {
        Some(s) if z <= 0.0 => s,
        _ => 1.0,
    }
}

/// The forward pass over every row of `runs`.
fn forward(runs: &RowRuns<'_>, slope: Option<f32>, logits: &[f32], out: &mut [f32]) {
    runs.for_each_group(out, |rows, pieces| {
        let first = rows.start;
        for row in rows {
            let (mut max, mut finite) = (f32::NEG_INFINITY, true);
            runs.visit_row(first, row, |_, at, _| {
                for &z in &logits[at] {
                    let a = activate(slope, z);
                    finite &= a.is_finite();
                    max = max.max(a);
                }
            });
            if !finite {
                runs.visit_row(first, row, |k, _, local| pieces[k][local].fill(f32::NAN));
                continue;
            }
            let mut sum = 0f32;
            runs.visit_row(first, row, |k, at, local| {
                for (o, &z) in pieces[k][local].iter_mut().zip(&logits[at]) {
                    *o = (activate(slope, z) - max).exp();
                    sum += *o;
                }
            });
            // sum ≥ 1: the row's largest entry contributes exp(0).
            runs.visit_row(first, row, |k, _, local| {
                for o in &mut pieces[k][local] {
                    *o /= sum;
                }
            });
        }
    });
}

/// The backward pass: `dz = α ∘ (dα − ⟨α, dα⟩_row) ∘ gate(z)`.
fn backward(
    runs: &RowRuns<'_>,
    slope: Option<f32>,
    logits: &[f32],
    out: &[f32],
    d_out: &[f32],
    d_logits: &mut [f32],
) {
    runs.for_each_group(d_logits, |rows, pieces| {
        let first = rows.start;
        for row in rows {
            let mut dot = 0f32;
            runs.visit_row(first, row, |_, at, _| {
                for (&y, &dy) in out[at.clone()].iter().zip(&d_out[at]) {
                    dot += y * dy;
                }
            });
            runs.visit_row(first, row, |k, at, local| {
                let zs = if slope.is_some() {
                    &logits[at.clone()]
                } else {
                    &[][..]
                };
                for (t, d) in pieces[k][local].iter_mut().enumerate() {
                    let p = at.start + t;
                    let g = zs.get(t).map_or(1.0, |&z| gate(slope, z));
                    *d = out[p] * (d_out[p] - dot) * g;
                }
            });
        }
    });
}

/// Per-edge softmax calls of the CPU operator (local to the rank: no communication).
impl<C, K: ChunkSource> DistSpmm<C, K> {
    /// `out[k] = exp(z_k − m_i) / Σ exp(z_k' − m_i)` over the entries k' of `k`'s row i, for
    /// `logits` `z` and `out` in the [`EdgeLayout`] order ([`edge_count`](Self::edge_count)
    /// values each; `out` is overwritten). Each row's entries (over all blocks of the layout)
    /// sum to 1; rows without entries have nothing to write. Numerically stable (`m_i` is the
    /// row's largest logit); deterministic for any thread count. A row with a non-finite logit
    /// (NaN or ±∞) is NaN in all its entries. Local: no communication.
    ///
    /// # Errors
    /// [`DistSpmmError::Shape`] when an operand does not hold one value per stored non-zero.
    pub fn edge_softmax(&self, logits: &[f32], out: &mut [f32]) -> Result<(), DistSpmmError> {
        self.softmax_call("edge_softmax", None, logits, out)
    }

    /// The gradient of [`edge_softmax`](Self::edge_softmax) from its result `out` and the
    /// gradient `d_out`: `d_logits[k] = out[k]·(d_out[k] − Σ_{k' ∈ row} out[k']·d_out[k'])`
    /// (overwritten). Non-finite values propagate through the arithmetic (a NaN of `out`
    /// makes its row's `d_logits` NaN). Local.
    ///
    /// # Errors
    /// As [`edge_softmax`](Self::edge_softmax).
    pub fn edge_softmax_backward(
        &self,
        out: &[f32],
        d_out: &[f32],
        d_logits: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        self.softmax_backward_call("edge_softmax_backward", None, &[], out, d_out, d_logits)
    }

    /// [`edge_softmax`](Self::edge_softmax) of `LeakyReLU(z) = z > 0 ? z : slope·z` (GAT's
    /// attention with `slope = 0.2`), fused: the activated logits are not stored.
    ///
    /// # Errors
    /// As [`edge_softmax`](Self::edge_softmax).
    pub fn leaky_relu_edge_softmax(
        &self,
        slope: f32,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        self.softmax_call("leaky_relu_edge_softmax", Some(slope), logits, out)
    }

    /// The gradient of [`leaky_relu_edge_softmax`](Self::leaky_relu_edge_softmax) with respect
    /// to the pre-activation `logits` (whose signs it needs): that of
    /// [`edge_softmax_backward`](Self::edge_softmax_backward) times 1 where `z > 0` and
    /// `slope` elsewhere.
    ///
    /// # Errors
    /// As [`edge_softmax`](Self::edge_softmax).
    pub fn leaky_relu_edge_softmax_backward(
        &self,
        slope: f32,
        logits: &[f32],
        out: &[f32],
        d_out: &[f32],
        d_logits: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let name = "leaky_relu_edge_softmax_backward";
        self.softmax_backward_call(name, Some(slope), logits, out, d_out, d_logits)
    }

    fn softmax_call(
        &self,
        name: &str,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let (chunk, nnz) = (self.chunk.chunk(), self.blocks.edges.len());
        let edges = [("logits", logits.len(), nnz), ("out", out.len(), nnz)];
        check_operands(name, chunk.part_id(), chunk.num_local_nodes(), &[], &edges)?;
        forward(
            &RowRuns::new(&chunk, &self.blocks.edges),
            slope,
            logits,
            out,
        );
        Ok(())
    }

    fn softmax_backward_call(
        &self,
        name: &str,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d_out: &[f32],
        d_logits: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let (chunk, nnz) = (self.chunk.chunk(), self.blocks.edges.len());
        let mut edges = vec![
            ("out", out.len(), nnz),
            ("d_out", d_out.len(), nnz),
            ("d_logits", d_logits.len(), nnz),
        ];
        if slope.is_some() {
            edges.insert(0, ("logits", logits.len(), nnz));
        }
        check_operands(name, chunk.part_id(), chunk.num_local_nodes(), &[], &edges)?;
        let runs = RowRuns::new(&chunk, &self.blocks.edges);
        backward(&runs, slope, logits, out, d_out, d_logits);
        Ok(())
    }
}
