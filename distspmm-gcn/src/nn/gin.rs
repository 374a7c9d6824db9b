//! GIN's layer (Xu et al.) as PyG's `GINConv` with `nn = Sequential(Linear(in, hidden), ReLU,
//! Linear(hidden, out))`: `h_i = (1 + ε)·x̃_i + Σ_j w_ij·x̃_j` (the sum over in-neighbours with
//! the graph's own edge weights, [`EdgeWeights::Sum`]), then `out_i = act(MLP(h_i))`, `x̃` the
//! input after the layer's dropout. ε is fixed (0 by default) or trained.
//!
//! The sum and `(1 + ε)·` commute with the MLP's first product, so the layer aggregates at the
//! narrower of `in` and `hidden`, as the GCN does: `h·W₁` when `in ≤ hidden`, else
//! `A·(x̃·W₁) + (1 + ε)·x̃·W₁`.
//!
//! Parameters, in PyG's names and order: `eps` (only when trainable, shape `[1, 1]`),
//! `nn.0.weight`, `nn.0.bias`, `nn.2.weight`, `nn.2.bias`. The weights are stored row-major
//! `in × out`, the transpose of PyG's `Linear.weight` (`[out, in]`).

use super::act::{self, Act};
use super::{check_backward, check_forward, load_edge_weights};
use super::{EdgeWeights, Graph, Layer, ParamSpec, Pass};
use crate::dense::Op;
use crate::dropout::DropoutKey;
use crate::model::{glorot, len_of, zeros};
use crate::par;
use anyhow::{ensure, Result};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};
use rand_chacha::ChaCha8Rng;

/// GIN's ε: fixed, or a trained parameter starting at the value given (PyG's `eps` and
/// `train_eps`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Eps {
    /// Fixed at this value.
    Fixed(f32),
    /// Trained, starting at this value.
    Trainable(f32),
}

impl Default for Eps {
    /// PyG's default: `eps = 0`, not trained.
    fn default() -> Self {
        Self::Fixed(0.0)
    }
}

/// GIN's layer with a two-layer MLP (see the module documentation), bound to one rank's rows,
/// with its buffers.
#[derive(Debug)]
pub struct GinConv {
    /// Index of the layer in its stack (its dropout key).
    layer: usize,
    fi: usize,
    hidden: usize,
    fo: usize,
    rows: usize,
    dropout: f32,
    act: Act,
    /// ε (one value; a parameter only when `train_eps`).
    eps: Vec<f32>,
    train_eps: bool,
    /// `nn.0.weight`, `in × hidden`.
    w1: Vec<f32>,
    /// `nn.0.bias`, `hidden`.
    b1: Vec<f32>,
    /// `nn.2.weight`, `hidden × out`.
    w2: Vec<f32>,
    /// `nn.2.bias`, `out`.
    b2: Vec<f32>,
    /// Whether the layer aggregates before the first product (`in ≤ hidden`).
    aggregate_first: bool,
    /// The sum aggregator's per-edge weights.
    edges: Vec<f32>,
    /// `x̃`, the input after dropout (`rows × in`).
    input: Vec<f32>,
    /// `h` (`rows × in`) when aggregating first, `x̃·W₁` (`rows × hidden`) otherwise.
    mid: Vec<f32>,
    /// The MLP's first pre-activation, `h·W₁ + b₁` (`rows × hidden`).
    a1: Vec<f32>,
    /// `ReLU(a1)` (`rows × hidden`).
    r1: Vec<f32>,
    /// Pre-activation output (`rows × out`).
    z: Vec<f32>,
    /// Activated output (`rows × out`).
    out: Vec<f32>,
    /// Workspace `rows × hidden`: the gradient of `a1`.
    d_a1: Vec<f32>,
    /// Workspace, allocated the first time it is needed: the gradient of `h` (`rows × in`)
    /// when aggregating first, of `x̃·W₁` (`rows × hidden`) otherwise.
    d_mid: Vec<f32>,
    /// Per-block partial sums of the weight and bias gradients.
    partials: Vec<f32>,
}

impl GinConv {
    /// Layer number `layer` of its stack (the key of its input dropout) with widths
    /// `dims = [in, hidden, out]` over `rows` rows, dropping its input with probability
    /// `dropout` in training and applying `act` to its output. Glorot-uniform weights
    /// (`nn.0.weight` drawn first, then `nn.2.weight`, each row-major `in × out`), zero biases.
    ///
    /// # Errors
    /// When a width is 0, `dropout` is not in `[0, 1)`, ε is not finite, or a buffer cannot be
    /// allocated.
    pub fn new(
        layer: usize,
        dims: [usize; 3],
        rows: usize,
        dropout: f32,
        act: Act,
        eps: Eps,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self> {
        let [fi, hidden, fo] = dims;
        ensure!(
            fi >= 1 && hidden >= 1 && fo >= 1,
            "a GIN layer needs widths of at least 1, got {fi} → {hidden} → {fo}"
        );
        ensure!(
            (0.0..1.0).contains(&dropout),
            "the dropout probability must be in [0, 1), got {dropout}"
        );
        let (eps, train_eps) = match eps {
            Eps::Fixed(e) => (e, false),
            Eps::Trainable(e) => (e, true),
        };
        ensure!(
            eps.is_finite(),
            "GIN's ε must be a finite number, got {eps}"
        );
        let what = "the GIN layer's weights";
        let w1 = glorot(rng, fi, hidden, what)?;
        let w2 = glorot(rng, hidden, fo, what)?;
        let aggregate_first = fi <= hidden;
        let what = "the GIN layer's activations";
        let mid = if aggregate_first { fi } else { hidden };
        let partials = zeros(
            len_of(par::blocks(rows), (fi * hidden).max(hidden * fo), what)?,
            "the GIN layer's partial gradient sums",
        )?;
        Ok(Self {
            layer,
            fi,
            hidden,
            fo,
            rows,
            dropout,
            act,
            eps: vec![eps],
            train_eps,
            w1,
            b1: zeros(hidden, what)?,
            w2,
            b2: zeros(fo, what)?,
            aggregate_first,
            edges: Vec::new(),
            input: zeros(len_of(rows, fi, what)?, what)?,
            mid: zeros(len_of(rows, mid, what)?, what)?,
            a1: zeros(len_of(rows, hidden, what)?, what)?,
            r1: zeros(len_of(rows, hidden, what)?, what)?,
            z: zeros(len_of(rows, fo, what)?, what)?,
            out: zeros(len_of(rows, fo, what)?, what)?,
            d_a1: zeros(len_of(rows, hidden, what)?, what)?,
            d_mid: Vec::new(),
            partials,
        })
    }

    /// `1 + ε`.
    fn self_weight(&self) -> f32 {
        1.0 + self.eps[0]
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

/// `y += c·x` over the first `n` rows of width `width`, in row blocks.
fn add_scaled(y: &mut [f32], c: f32, x: &[f32], width: usize, n: usize) {
    par::for_row_blocks(y, width, n, |r0, y| {
        let x = &x[r0 * width..r0 * width + y.len()];
        y.iter_mut().zip(x).for_each(|(y, &x)| *y += c * x);
    });
}

/// `Σ a ⊙ b` over `n` rows of width `width`, in f64, added in the fixed blocks of
/// [`par::block_sums`].
fn dot_rows(a: &[f32], b: &[f32], width: usize, n: usize) -> f64 {
    let [s] = par::block_sums(n, |rows| {
        let r = rows.start * width..rows.end * width;
        [a[r.clone()]
            .iter()
            .zip(&b[r])
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()]
    });
    s
}

impl Layer for GinConv {
    fn dims(&self) -> (usize, usize) {
        (self.fi, self.fo)
    }

    /// PyG's names and order; `--weight-decay` on all of them, as PyTorch's
    /// `Adam(model.parameters(), weight_decay=…)` applies it.
    fn specs(&self) -> Vec<ParamSpec> {
        let (fi, h, fo) = (self.fi, self.hidden, self.fo);
        // Under a column split, W₁'s rows and ε are formed in parts (see `Graph::column_split`).
        let spec = |name, shape| ParamSpec {
            name,
            shape,
            decay: true,
            split: name == "eps" || name == "nn.0.weight",
        };
        let mut specs = Vec::with_capacity(5);
        if self.train_eps {
            specs.push(spec("eps", [1, 1]));
        }
        specs.extend([
            spec("nn.0.weight", [fi, h]),
            spec("nn.0.bias", [1, h]),
            spec("nn.2.weight", [h, fo]),
            spec("nn.2.bias", [1, fo]),
        ]);
        specs
    }

    fn params(&self) -> Vec<&[f32]> {
        let mut p: Vec<&[f32]> = Vec::with_capacity(5);
        if self.train_eps {
            p.push(&self.eps);
        }
        p.extend([&self.w1[..], &self.b1, &self.w2, &self.b2]);
        p
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        let mut p: Vec<&mut [f32]> = Vec::with_capacity(5);
        if self.train_eps {
            p.push(&mut self.eps);
        }
        p.extend([&mut self.w1[..], &mut self.b1, &mut self.w2, &mut self.b2]);
        p
    }

    fn forward(&mut self, g: &mut dyn Graph, x: &[f32], pass: &Pass<'_>) -> Result<()> {
        let (n, fi, h, fo) = (self.rows, self.fi, self.hidden, self.fo);
        check_forward(g, x, pass, (n, fi))?;
        load_edge_weights(g, EdgeWeights::Sum, &mut self.edges)?;
        // Under a column split this rank's stage is `((1 + ε)·x̃_c + A·x̃_c)·W₁[c]` over its
        // columns c, summed across ranks before b₁ and the ReLU; the rest of the MLP runs on
        // every rank alike.
        let split = g.column_split().is_some();
        let cols = g.columns(fi);
        let wc = cols.len();
        let key = self.dropout_key(pass);
        key.apply(pass.ids, &x[..n * fi], fi, cols.clone(), &mut self.input);
        let c = self.self_weight();
        let b1 = &self.b1[..];
        let w1 = &self.w1[cols.start * h..cols.end * h];
        if self.aggregate_first {
            // h = A·x̃ + (1 + ε)·x̃; a1 = h·W₁ + b₁.
            g.spmm_edges(
                &self.edges,
                DenseView::from_row_major(&self.input[..n * wc], n, wc)?,
                DenseViewMut::from_row_major(&mut self.mid[..n * wc], n, wc)?,
            )?;
            add_scaled(&mut self.mid, c, &self.input, wc, n);
            let (fused, fused_width): (&mut [f32], usize) = if split {
                (&mut [], 0)
            } else {
                (&mut self.r1, h)
            };
            par::gemm_rows(
                &self.mid,
                n,
                wc,
                w1,
                Op::N,
                h,
                &mut self.a1,
                fused,
                fused_width,
                |_, a1, r1| {
                    if !split {
                        act::bias_act(a1, None, b1, Act::Relu, r1);
                    }
                },
            );
        } else {
            // u = x̃·W₁; a1 = A·u + (1 + ε)·u + b₁.
            par::gemm_rows(
                &self.input,
                n,
                wc,
                w1,
                Op::N,
                h,
                &mut self.mid,
                &mut [],
                0,
                |_, _, _| {},
            );
            g.spmm_edges(
                &self.edges,
                DenseView::from_row_major(&self.mid[..n * h], n, h)?,
                DenseViewMut::from_row_major(&mut self.a1[..n * h], n, h)?,
            )?;
            if split {
                add_scaled(&mut self.a1, c, &self.mid, h, n);
            } else {
                act::bias_act_rows(
                    &mut self.a1[..n * h],
                    Some((c, &self.mid[..n * h])),
                    b1,
                    Act::Relu,
                    &mut self.r1[..n * h],
                );
            }
        }
        if split {
            g.sum_columns(&mut self.a1[..n * h])?;
            act::bias_act_rows(
                &mut self.a1[..n * h],
                None,
                b1,
                Act::Relu,
                &mut self.r1[..n * h],
            );
        }
        let (act, b2) = (self.act, &self.b2[..]);
        par::gemm_rows(
            &self.r1,
            n,
            h,
            &self.w2,
            Op::N,
            fo,
            &mut self.z,
            &mut self.out,
            fo,
            |_, z, out| act::bias_act(z, None, b2, act, out),
        );
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
        let (n, fi, h, fo) = (self.rows, self.fi, self.hidden, self.fo);
        let e = usize::from(self.train_eps);
        check_forward(g, x, pass, (n, fi))?;
        check_backward(
            (n, fi, fo),
            dy,
            grad,
            e + fi * h + h + h * fo + fo,
            dx.as_deref(),
        )?;
        let dz = &mut dy[..n * fo];
        self.act.backward(&self.z[..n * fo], dz);
        let (g_eps, rest) = grad.split_at_mut(e);
        let (g_w1, rest) = rest.split_at_mut(fi * h);
        let (g_b1, rest) = rest.split_at_mut(h);
        let (g_w2, g_b2) = rest.split_at_mut(h * fo);
        // The second linear: dW₂ = r1ᵀ·dz, db₂ = Σ dz, d(a1) = (dz·W₂ᵀ) ⊙ [a1 > 0].
        par::col_sums(dz, fo, n, g_b2, &mut self.partials);
        par::gemm_tn_sum(&self.r1, h, dz, fo, n, g_w2, &mut self.partials);
        let a1 = &self.a1;
        par::gemm_rows(
            dz,
            n,
            fo,
            &self.w2,
            Op::T,
            h,
            &mut self.d_a1,
            &mut [],
            0,
            |r0, d, _| Act::Relu.backward(&a1[r0 * h..r0 * h + d.len()], d),
        );
        let d_a1 = &self.d_a1[..n * h];
        par::col_sums(d_a1, h, n, g_b1, &mut self.partials);
        let c = self.self_weight();
        let split = g.column_split().is_some();
        let cols = g.columns(fi);
        let wc = cols.len();
        let g_w1 = &mut g_w1[cols.start * h..cols.end * h];
        let w1 = &self.w1[cols.start * h..cols.end * h];
        let mid_width = if self.aggregate_first { fi } else { h };
        let need_d_mid = !self.aggregate_first || self.train_eps || dx.is_some();
        if need_d_mid && self.d_mid.len() < n * mid_width {
            let what = "the GIN layer's gradients";
            self.d_mid = zeros(len_of(n, mid_width, what)?, what)?;
        }
        // This rank's columns of the input gradient: `dx` itself, or (split) a block that the
        // split gathers into it.
        let (mut dx, mut block) = (dx, Vec::new());
        if split && dx.is_some() {
            let what = "the GIN layer's input gradient";
            block = zeros(len_of(n, wc, what)?, what)?;
        }
        let target: Option<&mut [f32]> = match (&mut dx, split) {
            (None, _) => None,
            (Some(_), true) => Some(&mut block[..]),
            (Some(d), false) => Some(&mut d[..n * fi]),
        };
        if self.aggregate_first {
            // dW₁ = hᵀ·d(a1); dh = d(a1)·W₁ᵀ; dε = Σ dh ⊙ x̃; dx̃ = Aᵀ·dh + (1 + ε)·dh.
            par::gemm_tn_sum(&self.mid, wc, d_a1, h, n, g_w1, &mut self.partials);
            if !need_d_mid {
                return Ok(());
            }
            let dh = &mut self.d_mid[..n * wc];
            par::gemm_rows(d_a1, n, h, w1, Op::T, wc, dh, &mut [], 0, |_, _, _| {});
            if self.train_eps {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "deliberate: summed in f64, rounded to f32"
                )]
                let s = dot_rows(dh, &self.input, wc, n) as f32;
                g_eps[0] = s;
            }
            if let Some(t) = target {
                g.spmm_edges_transpose(
                    &self.edges,
                    DenseView::from_row_major(&*dh, n, wc)?,
                    DenseViewMut::from_row_major(&mut *t, n, wc)?,
                )?;
                add_scaled(t, c, dh, wc, n);
                let key = self.dropout_key(pass);
                act::dropout_backward_cols(&key, pass.ids, t, cols.clone());
            }
        } else {
            // du = Aᵀ·d(a1) + (1 + ε)·d(a1); dε = Σ d(a1) ⊙ u; dW₁ = x̃ᵀ·du; dx̃ = du·W₁ᵀ.
            let du = &mut self.d_mid[..n * h];
            g.spmm_edges_transpose(
                &self.edges,
                DenseView::from_row_major(d_a1, n, h)?,
                DenseViewMut::from_row_major(&mut *du, n, h)?,
            )?;
            add_scaled(du, c, d_a1, h, n);
            if self.train_eps {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "deliberate: summed in f64, rounded to f32"
                )]
                let s = dot_rows(d_a1, &self.mid, h, n) as f32;
                g_eps[0] = s;
            }
            par::gemm_tn_sum(&self.input, wc, du, h, n, g_w1, &mut self.partials);
            if let Some(t) = target {
                par::gemm_rows(du, n, h, w1, Op::T, wc, t, &mut [], 0, |_, _, _| {});
                let key = self.dropout_key(pass);
                act::dropout_backward_cols(&key, pass.ids, t, cols.clone());
            }
        }
        if split {
            if let Some(dx) = dx {
                g.gather_columns(fi, &block, dx)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::sage::tests::{act_f64, row_times, uniform, EDGES};
    use crate::nn::testing::{check_gradients, DenseGraph};
    use rand::SeedableRng;

    fn pass(ids: &[u64], training: bool) -> Pass<'_> {
        Pass {
            seed: 13,
            epoch: 1,
            training,
            ids,
        }
    }

    /// A layer whose first biases alternate ±2 (so that half the hidden units are on and half
    /// off for small inputs) and whose last bias is not 0.
    fn layer(dims: [usize; 3], rows: usize, dropout: f32, act: Act, eps: Eps) -> GinConv {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let mut l = GinConv::new(2, dims, rows, dropout, act, eps, &mut rng).unwrap();
        for (j, b) in l.b1.iter_mut().enumerate() {
            *b = if j % 2 == 0 { 2.0 } else { -2.0 };
        }
        l.b2.copy_from_slice(&uniform(dims[2], 4));
        l
    }

    /// Gradients by finite differences for fixed and trained ε, without and with input
    /// dropout. The hidden pre-activations stay at least 0.1 from the ReLU's kink, which no
    /// step of the finite differences (1e-2 on one value) crosses.
    fn gradients(dims: [usize; 3]) {
        for (dropout, eps) in [
            (0.0, Eps::Fixed(0.0)),
            (0.0, Eps::Trainable(0.25)),
            (0.5, Eps::Trainable(-0.3)),
            (0.5, Eps::Fixed(0.4)),
        ] {
            let mut g = DenseGraph::random(7, 0.3, 5);
            let ids = g.ids.clone();
            let p = pass(&ids, true);
            let mut l = layer(dims, g.n, dropout, Act::Elu, eps);
            assert_eq!(l.aggregate_first, dims[0] <= dims[1]);
            let x: Vec<f32> = uniform(g.n * dims[0], 8).iter().map(|v| 0.25 * v).collect();
            l.forward(&mut g, &x, &p).unwrap();
            let margin = l.a1.iter().fold(f32::INFINITY, |m, v| m.min(v.abs()));
            assert!(
                margin >= 0.1,
                "a hidden pre-activation within {margin} of 0"
            );
            assert!(l.a1.iter().any(|&v| v > 0.0) && l.a1.iter().any(|&v| v < 0.0));
            check_gradients(&mut l, &mut g, &x, &p, 5e-3);
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
        gradients([3, 6, 2]);
    }

    #[test]
    fn gradients_transforming_first() {
        gradients([6, 3, 4]);
    }

    #[test]
    fn forward_matches_the_formula() {
        let n = 5;
        for dims in [[3, 4, 2], [5, 2, 3]] {
            for (dropout, training, act, eps) in [
                (0.0, true, Act::Identity, Eps::default()),
                (0.5, false, Act::Relu, Eps::Trainable(0.3)),
                (0.5, true, Act::Elu, Eps::Fixed(-0.4)),
            ] {
                let mut g = DenseGraph::new(n, &EDGES);
                let ids = g.ids.clone();
                let p = pass(&ids, training);
                let mut l = layer(dims, n, dropout, act, eps);
                let [fi, h, fo] = dims;
                let x = uniform(n * fi, 9);
                l.forward(&mut g, &x, &p).unwrap();
                let mut xd = vec![0.0f32; n * fi];
                let key = act::key(p.seed, p.epoch, 2, dropout, training);
                act::dropout(&key, &ids, &x, fi, &mut xd);
                if !training {
                    assert_eq!(xd, x);
                }
                let xd: Vec<f64> = xd.iter().map(|&v| f64::from(v)).collect();
                let (Eps::Fixed(e) | Eps::Trainable(e)) = eps;
                let mut hsum: Vec<f64> = xd.iter().map(|&v| (1.0 + f64::from(e)) * v).collect();
                for &(s, d, w) in &EDGES {
                    for c in 0..fi {
                        hsum[d * fi + c] += f64::from(w) * xd[s * fi + c];
                    }
                }
                let (w1, b1, w2, b2) = (&l.w1, &l.b1, &l.w2, &l.b2);
                for i in 0..n {
                    let a1 = row_times(&hsum[i * fi..(i + 1) * fi], w1, h);
                    let r: Vec<f64> = a1
                        .iter()
                        .zip(b1)
                        .map(|(&a, &b)| (a + f64::from(b)).max(0.0))
                        .collect();
                    let z = row_times(&r, w2, fo);
                    for c in 0..fo {
                        let want = act_f64(act, z[c] + f64::from(b2[c]));
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
        let run = |threads: usize, dims: [usize; 3]| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut g = DenseGraph::random(600, 0.01, 4);
                let ids = g.ids.clone();
                let p = pass(&ids, true);
                let mut l = layer(dims, g.n, 0.5, Act::Relu, Eps::Trainable(0.1));
                let x = uniform(g.n * dims[0], 1);
                l.forward(&mut g, &x, &p).unwrap();
                let out = l.output().to_vec();
                let mut dy = uniform(g.n * dims[2], 2);
                let mut grad = vec![0.0; crate::nn::param_len(&l.specs())];
                let mut dx = vec![0.0; g.n * dims[0]];
                l.backward(&mut g, &x, &mut dy, &mut grad, Some(&mut dx), &p)
                    .unwrap();
                (out, grad, dx)
            })
        };
        for dims in [[24, 40, 8], [40, 24, 8]] {
            let (a, b) = (run(1, dims), run(3, dims));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.0), bits(&b.0));
            assert_eq!(bits(&a.1), bits(&b.1));
            assert_eq!(bits(&a.2), bits(&b.2));
        }
    }

    #[test]
    fn parameters_are_pyg_s() {
        let names = |l: &GinConv| l.specs().iter().map(|s| s.name).collect::<Vec<_>>();
        let fixed = layer([3, 5, 2], 2, 0.0, Act::Relu, Eps::default());
        assert_eq!(
            names(&fixed),
            ["nn.0.weight", "nn.0.bias", "nn.2.weight", "nn.2.bias"]
        );
        let trained = layer([3, 5, 2], 2, 0.0, Act::Relu, Eps::Trainable(0.5));
        assert_eq!(
            names(&trained),
            [
                "eps",
                "nn.0.weight",
                "nn.0.bias",
                "nn.2.weight",
                "nn.2.bias"
            ]
        );
        let shapes: Vec<_> = trained.specs().iter().map(|s| s.shape).collect();
        assert_eq!(shapes, [[1, 1], [3, 5], [1, 5], [5, 2], [1, 2]]);
        assert_eq!(trained.params()[0], [0.5]);
        for l in [&fixed, &trained] {
            for (s, p) in l.specs().iter().zip(l.params()) {
                assert_eq!(s.shape[0] * s.shape[1], p.len());
            }
        }
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let bad = Eps::Fixed(f32::NAN);
        assert!(GinConv::new(0, [2, 2, 2], 2, 0.0, Act::Relu, bad, &mut rng).is_err());
        assert!(GinConv::new(0, [2, 0, 2], 2, 0.0, Act::Relu, Eps::default(), &mut rng).is_err());
    }

    /// Without an input gradient nor a trained ε, aggregating first, the backward pass skips
    /// `dh` (and never allocates it); the parameter gradients are those of a full pass.
    #[test]
    fn no_input_gradient_unless_asked() {
        let mut g = DenseGraph::random(9, 0.3, 2);
        let ids = g.ids.clone();
        let p = pass(&ids, true);
        let mut l = layer([3, 6, 2], g.n, 0.0, Act::Relu, Eps::default());
        let x = uniform(g.n * 3, 3);
        let total = crate::nn::param_len(&l.specs());
        let (mut with, mut without) = (vec![0.0; total], vec![0.0; total]);
        l.forward(&mut g, &x, &p).unwrap();
        let mut dy = uniform(g.n * 2, 4);
        l.backward(&mut g, &x, &mut dy.clone(), &mut without, None, &p)
            .unwrap();
        assert!(l.d_mid.is_empty());
        let mut dx = vec![0.0; g.n * 3];
        l.backward(&mut g, &x, &mut dy, &mut with, Some(&mut dx), &p)
            .unwrap();
        assert_eq!(with, without);
        assert!(dx.iter().any(|&v| v != 0.0));
    }
}
