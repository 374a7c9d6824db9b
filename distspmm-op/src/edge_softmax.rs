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

use distspmm_sparse::kernel::{isa, Isa};

use crate::{check_groups, ChunkSource, DistSpmm, DistSpmmError, EdgeLayout};

#[cfg(test)]
mod tests;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 256;

/// Lanes of the row reductions (maxima, sums, dot products): each lane sums every `LANES`-th
/// entry of a row's runs, in order, and the lanes are combined in one fixed tree. The order
/// depends on the row alone, so every instruction set and thread count gives the same bits.
const LANES: usize = 8;

/// Where each row's entries sit in the per-edge operand: per layout block, its first position
/// and its CSR row pointer.
struct RowRuns<'a> {
    blocks: Vec<(usize, &'a [u64])>,
    rows: usize,
    /// Values of one group's run (the layout's length).
    len: usize,
}

/// One block's entries of one row: the block `k`, their positions `at` in a group's run of
/// the operand and `local` in the piece of the row's task.
#[derive(Clone)]
struct Span {
    k: usize,
    at: Range<usize>,
    local: Range<usize>,
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
            len: layout.len(),
        }
    }

    /// Positions of `rows` in block `k`, relative to the block.
    fn span(&self, k: usize, rows: Range<usize>) -> Range<usize> {
        let rowptr = self.blocks[k].1;
        // Entries of a validated row pointer: positions in the block's arrays.
        distspmm_sparse::index::offset(rowptr[rows.start])
            ..distspmm_sparse::index::offset(rowptr[rows.end])
    }

    /// Runs `body(rows, pieces)` for consecutive groups of rows in parallel over `out`'s
    /// `groups` runs, `pieces[g·K + k]` being the rows' run of group g's values in block `k`
    /// (K blocks; the runs of a task are disjoint from every other task's, so each row is
    /// written by one task only).
    fn for_each_task<F>(&self, groups: usize, out: &mut [f32], body: F)
    where
        F: Fn(Range<usize>, &mut [&mut [f32]]) + Sync,
    {
        if self.len == 0 {
            return;
        }
        let tasks: Vec<Range<usize>> = (0..self.rows)
            .step_by(ROWS_PER_TASK)
            .map(|s| s..(s + ROWS_PER_TASK).min(self.rows))
            .collect();
        let mut pieces: Vec<Vec<&mut [f32]>> = tasks
            .iter()
            .map(|_| Vec::with_capacity(groups * self.blocks.len()))
            .collect();
        // Each group's run holds the layout's blocks one after another, each block's rows in
        // order: cutting a run front to back gives every (block, task) piece.
        for run in out.chunks_exact_mut(self.len).take(groups) {
            let mut rest = run;
            for k in 0..self.blocks.len() {
                for (t, rows) in tasks.iter().enumerate() {
                    let (piece, tail) =
                        std::mem::take(&mut rest).split_at_mut(self.span(k, rows.clone()).len());
                    pieces[t].push(piece);
                    rest = tail;
                }
            }
        }
        tasks
            .into_par_iter()
            .zip(pieces.par_iter_mut())
            .for_each(|(rows, pieces)| body(rows, pieces));
    }

    /// The spans of `row` (in a task whose first row is `first`) in layout order, into
    /// `spans` (cleared first); blocks without entries of the row are left out.
    fn row_spans(&self, first: usize, row: usize, spans: &mut Vec<Span>) {
        spans.clear();
        for k in 0..self.blocks.len() {
            let span = self.span(k, row..row + 1);
            if span.is_empty() {
                continue;
            }
            let base = self.span(k, first..first).start;
            spans.push(Span {
                k,
                at: self.blocks[k].0 + span.start..self.blocks[k].0 + span.end,
                local: span.start - base..span.end - base,
            });
        }
    }
}

/// Per-lane partial results of a row reduction, combined in a fixed tree.
#[inline(always)]
fn combine(lanes: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    op(
        op(op(lanes[0], lanes[4]), op(lanes[2], lanes[6])),
        op(op(lanes[1], lanes[5]), op(lanes[3], lanes[7])),
    )
}

/// `o = LeakyReLU_slope(z)` (a copy without a slope), branch-free; folds the values into the
/// lanes' maxima and `bad` (0 while every value is finite, NaN otherwise).
#[inline(always)]
fn activate_max(
    slope: Option<f32>,
    z: &[f32],
    o: &mut [f32],
    max: &mut [f32; LANES],
    bad: &mut [f32; LANES],
) {
    let s = slope.unwrap_or(1.0);
    let mut zc = z.chunks_exact(LANES);
    let mut oc = o.chunks_exact_mut(LANES);
    for (z, o) in (&mut zc).zip(&mut oc) {
        for l in 0..LANES {
            let a = if z[l] > 0.0 { z[l] } else { s * z[l] };
            o[l] = a;
            max[l] = max[l].max(a);
            bad[l] += a * 0.0;
        }
    }
    let rest = zc.remainder().iter().zip(oc.into_remainder());
    for (((&z, o), m), b) in rest.zip(max.iter_mut()).zip(bad.iter_mut()) {
        let a = if z > 0.0 { z } else { s * z };
        *o = a;
        *m = m.max(a);
        *b += a * 0.0;
    }
}

/// Folds `Σ x` (or `Σ x·y`) of one run into the lanes: lane l takes the run's entries
/// `l, l + LANES, …` (the run's remainder starts again at lane 0).
#[inline(always)]
fn sum_into(x: &[f32], y: Option<&[f32]>, lanes: &mut [f32; LANES]) {
    match y {
        None => {
            let mut xc = x.chunks_exact(LANES);
            for x in &mut xc {
                for l in 0..LANES {
                    lanes[l] += x[l];
                }
            }
            for (lane, &x) in lanes.iter_mut().zip(xc.remainder()) {
                *lane += x;
            }
        }
        Some(y) => {
            let (mut xc, mut yc) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
            for (x, y) in (&mut xc).zip(&mut yc) {
                for l in 0..LANES {
                    lanes[l] += x[l] * y[l];
                }
            }
            let rest = xc.remainder().iter().zip(yc.remainder());
            for (lane, (&x, &y)) in lanes.iter_mut().zip(rest) {
                *lane += x * y;
            }
        }
    }
}

/// `e^x` for `x ≤ 0` without a branch (so loops over it vectorise), within 2 ulp of the
/// correctly rounded value for `x ≥ ln(f32::MIN_POSITIVE)` ≈ −87.34 and 0 below it (where the
/// exact value is subnormal or 0: the softmax's terms relative to its largest, whose
/// contribution to a sum of at least 1 is below the last bit). Cody–Waite reduction `x = n·ln
/// 2 + r`, `|r| ≤ ln 2 / 2`, Cephes' degree-6 polynomial for `e^r`, and `2^n` assembled in the
/// exponent bits; plain multiplies and adds (no fused ones), so every instruction set gives the
/// same bits.
#[inline(always)]
#[allow(
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "exponent bit arithmetic on values checked to be in range"
)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOW: f32 = -87.336_55;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let c = x.max(LOW);
    let t = c * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (c - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // n in [−126, 0]: 2^n is a normal number.
    let k = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((k + 127) as u32) << 23);
    if x < LOW {
        0.0
    } else {
        y * scale
    }
}

/// The forward pass of one task's rows for every group.
struct Forward<'a> {
    runs: &'a RowRuns<'a>,
    groups: usize,
    slope: Option<f32>,
    logits: &'a [f32],
}

impl Forward<'_> {
    #[inline(always)]
    fn task(&self, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
        let (runs, nb, first) = (self.runs, self.runs.blocks.len(), rows.start);
        let mut spans = Vec::with_capacity(nb);
        // Per row of the task: its largest activated logit, whether all were finite.
        let mut maxes = [0f32; ROWS_PER_TASK];
        let mut finite = [true; ROWS_PER_TASK];
        for g in 0..self.groups {
            let z = &self.logits[g * runs.len..(g + 1) * runs.len];
            let out = &mut pieces[g * nb..(g + 1) * nb];
            // The activated logits less their row's maximum.
            for (r, row) in rows.clone().enumerate() {
                runs.row_spans(first, row, &mut spans);
                let (mut max, mut bad) = ([f32::NEG_INFINITY; LANES], [0f32; LANES]);
                for s in &spans {
                    let o = &mut out[s.k][s.local.clone()];
                    activate_max(self.slope, &z[s.at.clone()], o, &mut max, &mut bad);
                }
                let m = combine(max, f32::max);
                maxes[r] = m;
                finite[r] = combine(bad, |a, b| a + b) == 0.0;
                for s in &spans {
                    out[s.k][s.local.clone()].iter_mut().for_each(|o| *o -= m);
                }
            }
            // Their exponentials, over the task's whole run in each block.
            for piece in out.iter_mut() {
                piece.iter_mut().for_each(|o| *o = exp_nonpositive(*o));
            }
            // Normalised by the row's sum (at least 1: the largest entry contributes e^0).
            for (r, row) in rows.clone().enumerate() {
                runs.row_spans(first, row, &mut spans);
                if !finite[r] {
                    spans
                        .iter()
                        .for_each(|s| out[s.k][s.local.clone()].fill(f32::NAN));
                    continue;
                }
                let mut lanes = [0f32; LANES];
                for s in &spans {
                    sum_into(&out[s.k][s.local.clone()], None, &mut lanes);
                }
                let sum = combine(lanes, |a, b| a + b);
                for s in &spans {
                    out[s.k][s.local.clone()].iter_mut().for_each(|o| *o /= sum);
                }
            }
        }
    }
}

/// The backward pass of one task's rows for every group, in place: `d` holds `dα` and becomes
/// `dz = α ∘ (dα − ⟨α, dα⟩_row) ∘ gate(z)`, the gate 1 where `z > 0` and `slope` elsewhere
/// (PyTorch's choice at 0).
struct Backward<'a> {
    runs: &'a RowRuns<'a>,
    groups: usize,
    slope: Option<f32>,
    logits: &'a [f32],
    out: &'a [f32],
}

impl Backward<'_> {
    #[inline(always)]
    fn task(&self, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
        let (runs, nb, first) = (self.runs, self.runs.blocks.len(), rows.start);
        let mut spans = Vec::with_capacity(nb);
        for g in 0..self.groups {
            let run = g * runs.len..(g + 1) * runs.len;
            let y = &self.out[run.clone()];
            let z = self.slope.map(|_| &self.logits[run]);
            let d = &mut pieces[g * nb..(g + 1) * nb];
            for row in rows.clone() {
                runs.row_spans(first, row, &mut spans);
                let mut lanes = [0f32; LANES];
                for s in &spans {
                    sum_into(&y[s.at.clone()], Some(&d[s.k][s.local.clone()]), &mut lanes);
                }
                let dot = combine(lanes, |a, b| a + b);
                for s in &spans {
                    let (y, d) = (&y[s.at.clone()], &mut d[s.k][s.local.clone()]);
                    match (self.slope, z) {
                        (Some(slope), Some(z)) => {
                            let z = &z[s.at.clone()];
                            for ((d, &y), &z) in d.iter_mut().zip(y).zip(z) {
                                let gate = if z > 0.0 { 1.0 } else { slope };
                                *d = y * (*d - dot) * gate;
                            }
                        }
                        _ => {
                            for (d, &y) in d.iter_mut().zip(y) {
                                *d = y * (*d - dot);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One task's rows on the widest instruction set the kernels may use (the loops above are
/// compiled for each; they give the same bits on every one).
fn forward_task(isa: Isa, f: &Forward<'_>, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: `isa` comes from `distspmm_sparse::kernel::isa`, which never exceeds what
            // this CPU supports; `Isa::Avx512` means AVX-512F is present.
            unsafe { x86::forward_avx512(f, rows, pieces) };
            return;
        }
        if isa >= Isa::Avx2 {
            // SAFETY: as above; `Isa::Avx2` and up include AVX2.
            unsafe { x86::forward_avx2(f, rows, pieces) };
            return;
        }
    }
    let _ = isa;
    f.task(rows, pieces);
}

/// [`forward_task`] for the backward pass.
fn backward_task(isa: Isa, b: &Backward<'_>, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: as in `forward_task`.
            unsafe { x86::backward_avx512(b, rows, pieces) };
            return;
        }
        if isa >= Isa::Avx2 {
            // SAFETY: as in `forward_task`.
            unsafe { x86::backward_avx2(b, rows, pieces) };
            return;
        }
    }
    let _ = isa;
    b.task(rows, pieces);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Backward, Forward, Range};

    #[target_feature(enable = "avx512f")]
    pub(super) fn forward_avx512(f: &Forward<'_>, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
        f.task(rows, pieces);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn forward_avx2(f: &Forward<'_>, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
        f.task(rows, pieces);
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn backward_avx512(b: &Backward<'_>, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
        b.task(rows, pieces);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn backward_avx2(b: &Backward<'_>, rows: Range<usize>, pieces: &mut [&mut [f32]]) {
        b.task(rows, pieces);
    }
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
        self.softmax_call("edge_softmax", isa(), 1, None, logits, out)
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
        let name = "edge_softmax_backward";
        self.softmax_backward_call(name, isa(), 1, None, &[], out, Some(d_out), d_logits)
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
        let name = "leaky_relu_edge_softmax";
        self.softmax_call(name, isa(), 1, Some(slope), logits, out)
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
        self.softmax_backward_call(
            name,
            isa(),
            1,
            Some(slope),
            logits,
            out,
            Some(d_out),
            d_logits,
        )
    }

    /// [`edge_softmax`](Self::edge_softmax), or with `slope`
    /// [`leaky_relu_edge_softmax`](Self::leaky_relu_edge_softmax), of `groups` groups at once
    /// (the heads of an attention layer): `logits` and `out` hold `groups` runs of
    /// [`edge_count`](Self::edge_count) values (run g at `g·edge_count`), and each run is
    /// normalised over each row's entries with the bits of the one-group call on it. One pass
    /// over the rows for every group. Local.
    ///
    /// # Errors
    /// [`DistSpmmError::Shape`] when `groups` is 0 or an operand does not hold `groups` runs
    /// of one value per stored non-zero.
    pub fn edge_softmax_grouped(
        &self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let name = "edge_softmax_grouped";
        self.softmax_call(name, isa(), groups, slope, logits, out)
    }

    /// The gradient of [`edge_softmax_grouped`](Self::edge_softmax_grouped) with respect to
    /// its `logits` (read only with a `slope`), from its result `out`, in place: `d` holds
    /// the gradient of `out` on entry and that of `logits` on return, each run as
    /// [`edge_softmax_backward`](Self::edge_softmax_backward) or
    /// [`leaky_relu_edge_softmax_backward`](Self::leaky_relu_edge_softmax_backward) computes
    /// it. Local.
    ///
    /// # Errors
    /// As [`edge_softmax_grouped`](Self::edge_softmax_grouped).
    pub fn edge_softmax_backward_grouped(
        &self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let name = "edge_softmax_backward_grouped";
        self.softmax_backward_call(name, isa(), groups, slope, logits, out, None, d)
    }

    /// The operands' rule: one group or more, each operand one run of this rank's non-zeros
    /// per group.
    fn softmax_operands(
        &self,
        name: &str,
        groups: usize,
        edges: &[(&str, usize)],
    ) -> Result<(), DistSpmmError> {
        let rank = self.chunk.chunk().part_id();
        if groups == 0 {
            return Err(DistSpmmError::Shape(format!(
                "{name} on rank {rank}: no group of per-edge values (give one group or more, \
                 one per attention head)",
            )));
        }
        check_groups(name, rank, groups, groups, edges, self.blocks.edges.len())
    }

    /// The forward calls, on at most the instruction set `isa`.
    fn softmax_call(
        &self,
        name: &str,
        isa: Isa,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        self.softmax_operands(
            name,
            groups,
            &[("logits", logits.len()), ("out", out.len())],
        )?;
        let chunk = self.chunk.chunk();
        let runs = RowRuns::new(&chunk, &self.blocks.edges);
        let pass = Forward {
            runs: &runs,
            groups,
            slope,
            logits,
        };
        runs.for_each_task(groups, out, |rows, pieces| {
            forward_task(isa, &pass, rows, pieces);
        });
        Ok(())
    }

    /// The backward calls, on at most the instruction set `isa`: `d_logits` starts as a copy
    /// of `d_out`, or holds it already (`None`).
    #[allow(clippy::too_many_arguments)]
    fn softmax_backward_call(
        &self,
        name: &str,
        isa: Isa,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d_out: Option<&[f32]>,
        d_logits: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let mut edges = vec![("out", out.len())];
        if slope.is_some() {
            edges.insert(0, ("logits", logits.len()));
        }
        match d_out {
            Some(d_out) => edges.extend([("d_out", d_out.len()), ("d_logits", d_logits.len())]),
            None => edges.push(("d", d_logits.len())),
        }
        self.softmax_operands(name, groups, &edges)?;
        if let Some(d_out) = d_out {
            d_logits.copy_from_slice(d_out);
        }
        let chunk = self.chunk.chunk();
        let runs = RowRuns::new(&chunk, &self.blocks.edges);
        let pass = Backward {
            runs: &runs,
            groups,
            slope,
            logits,
            out,
        };
        runs.for_each_task(groups, d_logits, |rows, pieces| {
            backward_task(isa, &pass, rows, pieces);
        });
        Ok(())
    }
}
