//! GraphSAGE's layer (Hamilton et al.) with the defaults of PyG's `SAGEConv`: the mean
//! aggregator over in-neighbours, a root weight, the bias on the neighbour branch:
//! `out_i = act(W_lᵀ·mean_{j∈N(i)} x̃_j + b + W_rᵀ·x̃_i)`, `x̃` the input after the layer's
//! dropout.
//!
//! The mean is the SpMM with the per-edge weights `w_ij / Σ_j' w_ij'` ([`EdgeWeights::Mean`]):
//! the graph's own edges, no self loop added, a node without in-edges aggregating 0. The mean
//! commutes with `W_l` (`mean(x̃)·W_l = mean(x̃·W_l)`), so the layer aggregates at the narrower
//! of its two widths, as the GCN does: before the product when `in ≤ out`, after it otherwise.
//!
//! Parameters, in PyG's names and order: `lin_l.weight`, `lin_l.bias`, `lin_r.weight`. The
//! weights are stored row-major `in × out`, the transpose of PyG's `Linear.weight` (`[out,
//! in]`), so that every product reads them as `X·W`.

use super::act::{self, Act};
use super::{
    check_backward, check_forward, load_edge_weights, EdgeWeights, Graph, Layer, ParamSpec, Pass,
};
use crate::dense::Op;
use crate::dropout::DropoutKey;
use crate::model::{glorot, len_of, zeros};
use crate::par;
use anyhow::{ensure, Result};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};
use rand_chacha::ChaCha8Rng;

/// GraphSAGE's layer with PyG `SAGEConv`'s defaults (see the module documentation), bound to
/// one rank's rows, with its buffers.
#[derive(Debug)]
pub struct SageConv {
    /// Index of the layer in its stack (its dropout key).
    layer: usize,
    fi: usize,
    fo: usize,
    rows: usize,
    dropout: f32,
    act: Act,
    /// `lin_l.weight`, `in × out`.
    w_l: Vec<f32>,
    /// `lin_l.bias`, `out`.
    b: Vec<f32>,
    /// `lin_r.weight`, `in × out`.
    w_r: Vec<f32>,
    /// Whether the layer aggregates before the product (`in ≤ out`).
    aggregate_first: bool,
    /// The mean aggregator's per-edge weights.
    edges: Vec<f32>,
    /// `x̃`, the input after dropout (`rows × in`).
    input: Vec<f32>,
    /// `mean(x̃)` (`rows × in`) when aggregating first, `x̃·W_l` (`rows × out`) otherwise.
    mid: Vec<f32>,
    /// Workspace `rows × out`: the other branch of the sum in the forward pass, `mean_ᵀ(dz)`
    /// in the backward pass.
    side: Vec<f32>,
    /// Pre-activation output (`rows × out`).
    z: Vec<f32>,
    /// Activated output (`rows × out`).
    out: Vec<f32>,
    /// Workspace `rows × in` of the input gradient, allocated the first time one is asked for.
    scratch: Vec<f32>,
    /// Per-block partial sums of the weight and bias gradients.
    partials: Vec<f32>,
}

impl SageConv {
    /// Layer number `layer` of its stack (the key of its input dropout) from `dims[0]` to
    /// `dims[1]` features over `rows` rows, dropping its input with probability `dropout` in
    /// training and applying `act` to its output. Glorot-uniform weights (`lin_l.weight` drawn
    /// first, then `lin_r.weight`, each row-major `in × out`) and a zero bias.
    ///
    /// # Errors
    /// When a width is 0, `dropout` is not in `[0, 1)`, or a buffer cannot be allocated.
    pub fn new(
        layer: usize,
        dims: [usize; 2],
        rows: usize,
        dropout: f32,
        act: Act,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self> {
        let [fi, fo] = dims;
        ensure!(
            fi >= 1 && fo >= 1,
            "a SAGE layer needs widths of at least 1, got {fi} → {fo}"
        );
        ensure!(
            (0.0..1.0).contains(&dropout),
            "the dropout probability must be in [0, 1), got {dropout}"
        );
        let what = "the SAGE layer's weights";
        let w_l = glorot(rng, fi, fo, what)?;
        let w_r = glorot(rng, fi, fo, what)?;
        let b = zeros(fo, what)?;
        let aggregate_first = fi <= fo;
        let what = "the SAGE layer's activations";
        let mid = if aggregate_first { fi } else { fo };
        let partials = zeros(
            len_of(par::blocks(rows), fi * fo, what)?,
            "the SAGE layer's partial gradient sums",
        )?;
        Ok(Self {
            layer,
            fi,
            fo,
            rows,
            dropout,
            act,
            w_l,
            b,
            w_r,
            aggregate_first,
            edges: Vec::new(),
            input: zeros(len_of(rows, fi, what)?, what)?,
            mid: zeros(len_of(rows, mid, what)?, what)?,
            side: zeros(len_of(rows, fo, what)?, what)?,
            z: zeros(len_of(rows, fo, what)?, what)?,
            out: zeros(len_of(rows, fo, what)?, what)?,
            scratch: Vec::new(),
            partials,
        })
    }

    /// The key of this pass's input dropout.
    fn dropout_key(&self, pass: &Pass<'_>) -> DropoutKey {
        act::key(
            pass.seed,
            pass.epoch,
            self.layer,
            self.dropout,
            pass.training,
        )
    }
}

impl Layer for SageConv {
    fn dims(&self) -> (usize, usize) {
        (self.fi, self.fo)
    }

    /// PyG's names and order; `--weight-decay` on all of them, as PyTorch's
    /// `Adam(model.parameters(), weight_decay=…)` applies it.
    fn specs(&self) -> Vec<ParamSpec> {
        let (fi, fo) = (self.fi, self.fo);
        vec![
            ParamSpec {
                name: "lin_l.weight",
                shape: [fi, fo],
                decay: true,
                split: true,
            },
            ParamSpec {
                name: "lin_l.bias",
                shape: [1, fo],
                decay: true,
                split: false,
            },
            ParamSpec {
                name: "lin_r.weight",
                shape: [fi, fo],
                decay: true,
                split: true,
            },
        ]
    }

    fn params(&self) -> Vec<&[f32]> {
        vec![&self.w_l, &self.b, &self.w_r]
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.w_l, &mut self.b, &mut self.w_r]
    }

    fn forward(&mut self, g: &mut dyn Graph, x: &[f32], pass: &Pass<'_>) -> Result<()> {
        let (n, fi, fo) = (self.rows, self.fi, self.fo);
        check_forward(g, x, pass, (n, fi))?;
        load_edge_weights(g, EdgeWeights::Mean, &mut self.edges)?;
        // Under a column split this rank's stage is `mean(x̃_c)·W_l[c] + x̃_c·W_r[c]` over its
        // columns c, summed across ranks before the bias and activation; otherwise those are
        // fused into the last product.
        let split = g.column_split().is_some();
        let cols = g.columns(fi);
        let wc = cols.len();
        let key = self.dropout_key(pass);
        key.apply(pass.ids, &x[..n * fi], fi, cols.clone(), &mut self.input);
        let (act, b) = (self.act, &self.b[..]);
        let w_l = &self.w_l[cols.start * fo..cols.end * fo];
        let w_r = &self.w_r[cols.start * fo..cols.end * fo];
        let (fused, fused_width): (&mut [f32], usize) = if split {
            (&mut [], 0)
        } else {
            (&mut self.out, fo)
        };
        // The last product's epilogue: adds the other branch, then (unsplit) bias and activation.
        let epilogue = |side: &[f32], r0: usize, z: &mut [f32], out: &mut [f32]| {
            let side = &side[r0 * fo..r0 * fo + z.len()];
            if split {
                z.iter_mut().zip(side).for_each(|(z, &s)| *z += s);
            } else {
                act::bias_act(z, Some((1.0, side)), b, act, out);
            }
        };
        if self.aggregate_first {
            // z = mean(x̃)·W_l + (x̃·W_r + b).
            g.spmm_edges(
                &self.edges,
                DenseView::from_row_major(&self.input[..n * wc], n, wc)?,
                DenseViewMut::from_row_major(&mut self.mid[..n * wc], n, wc)?,
            )?;
            par::gemm_rows(
                &self.input,
                n,
                wc,
                w_r,
                Op::N,
                fo,
                &mut self.side,
                &mut [],
                0,
                |_, _, _| {},
            );
            let side = &self.side;
            par::gemm_rows(
                &self.mid,
                n,
                wc,
                w_l,
                Op::N,
                fo,
                &mut self.z,
                fused,
                fused_width,
                |r0, z, out| epilogue(side, r0, z, out),
            );
        } else {
            // z = x̃·W_r + (mean(x̃·W_l) + b).
            par::gemm_rows(
                &self.input,
                n,
                wc,
                w_l,
                Op::N,
                fo,
                &mut self.mid,
                &mut [],
                0,
                |_, _, _| {},
            );
            g.spmm_edges(
                &self.edges,
                DenseView::from_row_major(&self.mid[..n * fo], n, fo)?,
                DenseViewMut::from_row_major(&mut self.side[..n * fo], n, fo)?,
            )?;
            let side = &self.side;
            par::gemm_rows(
                &self.input,
                n,
                wc,
                w_r,
                Op::N,
                fo,
                &mut self.z,
                fused,
                fused_width,
                |r0, z, out| epilogue(side, r0, z, out),
            );
        }
        if split {
            g.sum_columns(&mut self.z[..n * fo])?;
            act::bias_act_rows(&mut self.z[..n * fo], None, b, act, &mut self.out[..n * fo]);
        }
        Ok(())
    }

    fn output(&self) -> &[f32] {
        &self.out[..self.rows * self.fo]
    }

    fn backward(
        &mut self,
        g: &mut dyn Graph,
        x: &[f32],
        dy: &mut [f32],
        grad: &mut [f32],
        dx: Option<&mut [f32]>,
        pass: &Pass<'_>,
    ) -> Result<()> {
        let (n, fi, fo) = (self.rows, self.fi, self.fo);
        check_forward(g, x, pass, (n, fi))?;
        check_backward((n, fi, fo), dy, grad, 2 * fi * fo + fo, dx.as_deref())?;
        let split = g.column_split().is_some();
        let cols = g.columns(fi);
        let wc = cols.len();
        let dz = &mut dy[..n * fo];
        self.act.backward(&self.z[..n * fo], dz);
        let (g_wl, rest) = grad.split_at_mut(fi * fo);
        let (g_b, g_wr) = rest.split_at_mut(fo);
        let c_rows = cols.start * fo..cols.end * fo;
        let (g_wl, g_wr) = (&mut g_wl[c_rows.clone()], &mut g_wr[c_rows.clone()]);
        let (w_l, w_r) = (&self.w_l[c_rows.clone()], &self.w_r[c_rows]);
        par::col_sums(dz, fo, n, g_b, &mut self.partials);
        par::gemm_tn_sum(&self.input, wc, dz, fo, n, g_wr, &mut self.partials);
        if self.aggregate_first {
            // dW_l = mean(x̃)ᵀ·dz; dx̃ = meanᵀ(dz·W_lᵀ) + dz·W_rᵀ.
            par::gemm_tn_sum(&self.mid, wc, dz, fo, n, g_wl, &mut self.partials);
        } else {
            // d(x̃·W_l) = meanᵀ(dz); dW_l = x̃ᵀ·d(x̃·W_l); dx̃ = d(x̃·W_l)·W_lᵀ + dz·W_rᵀ.
            g.spmm_edges_transpose(
                &self.edges,
                DenseView::from_row_major(&*dz, n, fo)?,
                DenseViewMut::from_row_major(&mut self.side[..n * fo], n, fo)?,
            )?;
            par::gemm_tn_sum(&self.input, wc, &self.side, fo, n, g_wl, &mut self.partials);
        }
        let Some(dx) = dx else {
            return Ok(());
        };
        // This rank's columns of the input gradient: `dx` itself, or (split) a block that the
        // split gathers into it.
        let what = "the SAGE layer's input gradient";
        let mut block = if split {
            zeros(len_of(n, wc, what)?, what)?
        } else {
            Vec::new()
        };
        let target: &mut [f32] = if split { &mut block } else { &mut dx[..n * fi] };
        if self.scratch.len() < n * wc {
            self.scratch = zeros(len_of(n, fi, what)?, what)?;
        }
        let add = |_: usize, d: &mut [f32], s: &mut [f32]| {
            d.iter_mut().zip(&*s).for_each(|(d, &s)| *d += s);
        };
        if self.aggregate_first {
            par::gemm_rows(
                dz,
                n,
                fo,
                w_l,
                Op::T,
                wc,
                &mut self.scratch,
                &mut [],
                0,
                |_, _, _| {},
            );
            g.spmm_edges_transpose(
                &self.edges,
                DenseView::from_row_major(&self.scratch[..n * wc], n, wc)?,
                DenseViewMut::from_row_major(&mut *target, n, wc)?,
            )?;
            // scratch = dz·W_rᵀ, added to the gradient block by block.
            par::gemm_rows(
                dz,
                n,
                fo,
                w_r,
                Op::T,
                wc,
                &mut self.scratch,
                target,
                wc,
                |r0, s, d| add(r0, d, s),
            );
        } else {
            par::gemm_rows(
                &self.side,
                n,
                fo,
                w_l,
                Op::T,
                wc,
                &mut self.scratch,
                &mut [],
                0,
                |_, _, _| {},
            );
            par::gemm_rows(
                dz,
                n,
                fo,
                w_r,
                Op::T,
                wc,
                target,
                &mut self.scratch,
                wc,
                add,
            );
        }
        let key = self.dropout_key(pass);
        act::dropout_backward_cols(&key, pass.ids, target, cols.clone());
        if split {
            g.gather_columns(fi, &block, dx)?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::nn::testing::{check_gradients, DenseGraph};
    use rand::{Rng, SeedableRng};

    /// `n` values uniform in `[-1, 1)`.
    pub(crate) fn uniform(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn pass(ids: &[u64], training: bool) -> Pass<'_> {
        Pass {
            seed: 11,
            epoch: 3,
            training,
            ids,
        }
    }

    fn layer(dims: [usize; 2], rows: usize, dropout: f32, act: Act) -> SageConv {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut l = SageConv::new(1, dims, rows, dropout, act, &mut rng).unwrap();
        // A bias that is not 0, so that a missing or doubled bias shows.
        let b = uniform(dims[1], 6);
        l.params_mut()[1].copy_from_slice(&b);
        l
    }

    /// Gradients by finite differences, without and with input dropout (fixed key).
    fn gradients(dims: [usize; 2]) {
        for (dropout, act) in [(0.0, Act::Elu), (0.5, Act::Elu), (0.5, Act::Identity)] {
            let mut g = DenseGraph::random(7, 0.35, 3);
            let ids = g.ids.clone();
            let mut l = layer(dims, g.n, dropout, act);
            assert_eq!(l.aggregate_first, dims[0] <= dims[1]);
            let x = uniform(g.n * dims[0], 8);
            check_gradients(&mut l, &mut g, &x, &pass(&ids, true), 5e-3);
            if dropout > 0.0 {
                let dropped = l
                    .input
                    .iter()
                    .zip(&x)
                    .filter(|(d, x)| **d == 0.0 && **x != 0.0);
                assert!(dropped.count() > 0, "the input dropout dropped nothing");
            }
        }
    }

    #[test]
    fn gradients_aggregating_first() {
        gradients([3, 5]);
    }

    #[test]
    fn gradients_transforming_first() {
        gradients([6, 3]);
    }

    /// A weighted graph of 5 nodes: a duplicate edge (2 → 1 twice), a node without in-edges
    /// (3), a self loop given in the input (4 → 4).
    pub(crate) const EDGES: [(usize, usize, f32); 9] = [
        (0, 1, 1.0),
        (2, 1, 0.5),
        (2, 1, 1.5),
        (3, 1, 1.0),
        (1, 0, 2.0),
        (4, 2, 1.0),
        (0, 2, 3.0),
        (2, 4, 0.25),
        (4, 4, 0.75),
    ];

    /// `x·W` of one row (`w` row-major `x.len() × out`), in f64.
    pub(crate) fn row_times(x: &[f64], w: &[f32], out: usize) -> Vec<f64> {
        (0..out)
            .map(|c| (0..x.len()).map(|k| x[k] * f64::from(w[k * out + c])).sum())
            .collect()
    }

    pub(crate) fn act_f64(act: Act, z: f64) -> f64 {
        match act {
            Act::Identity => z,
            Act::Relu => z.max(0.0),
            Act::Elu => {
                if z > 0.0 {
                    z
                } else {
                    z.exp_m1()
                }
            }
        }
    }

    #[test]
    fn forward_matches_the_formula() {
        let n = 5;
        for dims in [[3, 4], [4, 2]] {
            for (dropout, training, act) in [
                (0.0, true, Act::Identity),
                (0.5, false, Act::Relu),
                (0.5, true, Act::Elu),
            ] {
                let mut g = DenseGraph::new(n, &EDGES);
                let ids = g.ids.clone();
                let p = pass(&ids, training);
                let mut l = layer(dims, n, dropout, act);
                let [fi, fo] = dims;
                let x = uniform(n * fi, 9);
                l.forward(&mut g, &x, &p).unwrap();
                // The input as the layer's dropout leaves it (the identity in evaluation).
                let mut xd = vec![0.0f32; n * fi];
                let key = act::key(p.seed, p.epoch, 1, dropout, training);
                act::dropout(&key, &ids, &x, fi, &mut xd);
                if !training {
                    assert_eq!(xd, x);
                }
                let xd: Vec<f64> = xd.iter().map(|&v| f64::from(v)).collect();
                let (mut num, mut den) = (vec![0.0f64; n * fi], vec![0.0f64; n]);
                for &(s, d, w) in &EDGES {
                    den[d] += f64::from(w);
                    for c in 0..fi {
                        num[d * fi + c] += f64::from(w) * xd[s * fi + c];
                    }
                }
                let params = l.params();
                for i in 0..n {
                    let mean: Vec<f64> = (0..fi)
                        .map(|c| {
                            if den[i] > 0.0 {
                                num[i * fi + c] / den[i]
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    if i == 3 {
                        assert!(mean.iter().all(|&m| m == 0.0));
                    }
                    let left = row_times(&mean, params[0], fo);
                    let root = row_times(&xd[i * fi..(i + 1) * fi], params[2], fo);
                    for c in 0..fo {
                        let z = left[c] + f64::from(params[1][c]) + root[c];
                        let want = act_f64(act, z);
                        let got = f64::from(l.output()[i * fo + c]);
                        assert!(
                            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                            "{dims:?} row {i} col {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Forward and backward at 1 and 3 threads: the same bits.
    #[test]
    fn same_bits_at_any_thread_count() {
        let run = |threads: usize, dims: [usize; 2]| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut g = DenseGraph::random(600, 0.01, 4);
                let ids = g.ids.clone();
                let p = pass(&ids, true);
                let mut l = layer(dims, g.n, 0.5, Act::Relu);
                let x = uniform(g.n * dims[0], 1);
                l.forward(&mut g, &x, &p).unwrap();
                let out = l.output().to_vec();
                let mut dy = uniform(g.n * dims[1], 2);
                let mut grad = vec![0.0; crate::nn::param_len(&l.specs())];
                let mut dx = vec![0.0; g.n * dims[0]];
                l.backward(&mut g, &x, &mut dy, &mut grad, Some(&mut dx), &p)
                    .unwrap();
                (out, grad, dx)
            })
        };
        for dims in [[24, 40], [40, 24]] {
            let (a, b) = (run(1, dims), run(3, dims));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.0), bits(&b.0));
            assert_eq!(bits(&a.1), bits(&b.1));
            assert_eq!(bits(&a.2), bits(&b.2));
        }
    }

    #[test]
    fn parameters_are_pyg_s() {
        let l = layer([3, 4], 2, 0.0, Act::Relu);
        let specs = l.specs();
        let names: Vec<_> = specs.iter().map(|s| s.name).collect();
        assert_eq!(names, ["lin_l.weight", "lin_l.bias", "lin_r.weight"]);
        let shapes: Vec<_> = specs.iter().map(|s| s.shape).collect();
        assert_eq!(shapes, [[3, 4], [1, 4], [3, 4]]);
        for (s, p) in specs.iter().zip(l.params()) {
            assert_eq!(s.shape[0] * s.shape[1], p.len());
        }
        let bound = (6.0f32 / 7.0).sqrt();
        let w = l.params()[0];
        assert!(w.iter().all(|v| v.abs() <= bound) && w.iter().any(|&v| v != 0.0));
        assert!(SageConv::new(
            0,
            [0, 4],
            2,
            0.0,
            Act::Relu,
            &mut ChaCha8Rng::seed_from_u64(0)
        )
        .is_err());
        assert!(SageConv::new(
            0,
            [2, 4],
            2,
            1.0,
            Act::Relu,
            &mut ChaCha8Rng::seed_from_u64(0)
        )
        .is_err());
    }

    #[test]
    fn mismatched_operands_are_errors() {
        let mut g = DenseGraph::random(4, 0.5, 1);
        let ids = g.ids.clone();
        let mut l = layer([2, 3], 5, 0.0, Act::Relu);
        let x = uniform(5 * 2, 1);
        assert!(l.forward(&mut g, &x, &pass(&ids, true)).is_err());
        let mut l = layer([2, 3], 4, 0.0, Act::Relu);
        assert!(l.forward(&mut g, &x[..7], &pass(&ids, true)).is_err());
        l.forward(&mut g, &x, &pass(&ids, true)).unwrap();
        let mut dy = vec![0.0; 12];
        let mut grad = vec![0.0; 5];
        assert!(l
            .backward(&mut g, &x, &mut dy, &mut grad, None, &pass(&ids, true))
            .is_err());
    }
}
