//! A whole graph in one process as a [`Graph`] (dense loops, the reference the layers are
//! checked against), and a finite-difference check of a layer's backward pass.

use super::{EdgeWeights, Graph, Layer, Pass};
use crate::model::Aggregate;
use anyhow::{ensure, Result};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};
use rand::{Rng, SeedableRng};

/// A graph of `n` nodes held whole: its edges `A` (weights), the pattern of `A + I` as the
/// per-edge layout (row by row, columns increasing), and `Â = D^-1/2 (A + I) D^-1/2` as the
/// chunk's values (PyG's `gcn_norm`).
#[derive(Debug, Clone)]
pub(crate) struct DenseGraph {
    pub(crate) n: usize,
    /// `(row, col)` of each position of the per-edge operand.
    pub(crate) pattern: Vec<(usize, usize)>,
    /// `Â` at each position.
    pub(crate) norm: Vec<f32>,
    /// Original id of each node.
    pub(crate) ids: Vec<u64>,
    sum: Vec<f32>,
    mean: Vec<f32>,
    ends: Vec<(u64, u64)>,
    /// Every aggregation called through [`Aggregate`], in order.
    pub(crate) calls: Vec<crate::isolated::SpmmCall>,
}

impl DenseGraph {
    /// From edges `(src, dst, weight)` (`src → dst`: `dst` aggregates `src`); duplicates summed.
    pub(crate) fn new(n: usize, edges: &[(usize, usize, f32)]) -> Self {
        let mut a = vec![0.0f32; n * n];
        let mut has = vec![false; n * n];
        for &(s, d, w) in edges {
            a[d * n + s] += w;
            has[d * n + s] = true;
        }
        let mut pattern = Vec::new();
        let mut raw = Vec::new();
        for i in 0..n {
            for j in 0..n {
                if has[i * n + j] || i == j {
                    pattern.push((i, j));
                    raw.push(if has[i * n + j] { a[i * n + j] } else { 0.0 });
                }
            }
        }
        // gcn_norm: A + I with the remaining self loops (weight 1 where none was given).
        let loop_w = |i: usize| if has[i * n + i] { a[i * n + i] } else { 1.0 };
        let mut deg = vec![0.0f64; n];
        for (&(i, j), &w) in pattern.iter().zip(&raw) {
            deg[i] += f64::from(if i == j { loop_w(i) } else { w });
        }
        let norm = pattern
            .iter()
            .zip(&raw)
            .map(|(&(i, j), &w)| {
                let v = if i == j { loop_w(i) } else { w };
                let d = (deg[i] * deg[j]).sqrt();
                if d > 0.0 {
                    (f64::from(v) / d) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let mut row_sum = vec![0.0f64; n];
        for (&(i, _), &w) in pattern.iter().zip(&raw) {
            row_sum[i] += f64::from(w);
        }
        let mean = pattern
            .iter()
            .zip(&raw)
            .map(|(&(i, _), &w)| {
                if row_sum[i] > 0.0 {
                    (f64::from(w) / row_sum[i]) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let ids: Vec<u64> = (0..n as u64).map(|i| 1000 + 7 * i).collect();
        let ends = pattern.iter().map(|&(i, j)| (ids[i], ids[j])).collect();
        Self {
            n,
            sum: raw,
            pattern,
            norm,
            mean,
            ids,
            ends,
            calls: Vec::new(),
        }
    }

    /// A graph whose `Â` is the dense row-major `n × n` matrix `a` itself (its non-zeros, plus
    /// the diagonal with value 0 where `a` has none), `A` being the same values.
    pub(crate) fn from_dense(n: usize, a: &[f32]) -> Self {
        let mut edges = Vec::new();
        for i in 0..n {
            for j in 0..n {
                if a[i * n + j] != 0.0 {
                    edges.push((j, i, a[i * n + j]));
                }
            }
        }
        let mut g = Self::new(n, &edges);
        g.norm = g.pattern.iter().map(|&(i, j)| a[i * n + j]).collect();
        g
    }

    /// A random simple graph: each ordered pair an edge with probability `p`, weight 1.
    pub(crate) fn random(n: usize, p: f64, seed: u64) -> Self {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut edges = Vec::new();
        for s in 0..n {
            for d in 0..n {
                if s != d && rng.random_bool(p) {
                    edges.push((s, d, 1.0));
                }
            }
        }
        Self::new(n, &edges)
    }

    /// The width of each of `groups` groups of `f` columns, after checking that `values` holds
    /// one run of edge values per group.
    fn group_width(&self, groups: usize, f: usize, values: usize) -> Result<usize> {
        ensure!(
            groups >= 1 && f.is_multiple_of(groups) && values == groups * self.pattern.len(),
            "{values} edge values and {f} columns for {groups} groups over {} edges",
            self.pattern.len()
        );
        Ok(f / groups)
    }

    /// `y = A_e·x` (or `A_eᵀ·x` when `t`), group g's columns with run g of `e`.
    fn product(
        &self,
        groups: usize,
        e: &[f32],
        x: &DenseView<'_, f32>,
        y: &mut DenseViewMut<'_, f32>,
        t: bool,
    ) -> Result<()> {
        let f = x.cols();
        let c = self.group_width(groups, f, e.len())?;
        let edges = self.pattern.len();
        let mut out = vec![0.0f32; self.n * f];
        for g in 0..groups {
            for (&(i, j), &v) in self.pattern.iter().zip(&e[g * edges..(g + 1) * edges]) {
                let (dst, src) = if t { (j, i) } else { (i, j) };
                for col in g * c..(g + 1) * c {
                    out[dst * f + col] += v * x.row(src)[col];
                }
            }
        }
        for r in 0..self.n {
            y.row_mut(r)[..f].copy_from_slice(&out[r * f..(r + 1) * f]);
        }
        Ok(())
    }
}

impl Aggregate for DenseGraph {
    fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()> {
        self.calls.push(crate::isolated::SpmmCall {
            backward: false,
            width: f,
            x_len: x.len(),
            y_len: y.len(),
        });
        let norm = self.norm.clone();
        let xv = DenseView::from_row_major(&x[..self.n * f], self.n, f)?;
        let mut yv = DenseViewMut::from_row_major(&mut y[..self.n * f], self.n, f)?;
        self.product(1, &norm, &xv, &mut yv, false)
    }
    fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()> {
        self.calls.push(crate::isolated::SpmmCall {
            backward: true,
            width: f,
            x_len: dy.len(),
            y_len: dx.len(),
        });
        let norm = self.norm.clone();
        let xv = DenseView::from_row_major(&dy[..self.n * f], self.n, f)?;
        let mut yv = DenseViewMut::from_row_major(&mut dx[..self.n * f], self.n, f)?;
        self.product(1, &norm, &xv, &mut yv, true)
    }
    fn bytes_received(&self) -> u64 {
        0
    }
}

impl Graph for DenseGraph {
    fn rows(&self) -> usize {
        self.n
    }
    fn edge_count(&self) -> usize {
        self.pattern.len()
    }
    fn edge_weights(&mut self, kind: EdgeWeights) -> Result<&[f32]> {
        Ok(match kind {
            EdgeWeights::Sum => &self.sum,
            EdgeWeights::Mean => &self.mean,
        })
    }
    fn edge_ends(&mut self) -> Result<&[(u64, u64)]> {
        Ok(&self.ends)
    }
    fn spmm_edges_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        x: DenseView<'_, f32>,
        mut y: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.product(groups, e, &x, &mut y, false)
    }
    fn spmm_edges_transpose_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        dy: DenseView<'_, f32>,
        mut dx: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.product(groups, e, &dy, &mut dx, true)
    }
    fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<()> {
        let w = self.group_width(groups, u.cols(), e.len())?;
        let edges = self.pattern.len();
        for (g, run) in e.chunks_exact_mut(edges.max(1)).enumerate().take(groups) {
            let cols = g * w..(g + 1) * w;
            for (out, &(i, j)) in run.iter_mut().zip(&self.pattern) {
                *out = u.row(i)[cols.clone()]
                    .iter()
                    .zip(&v.row(j)[cols.clone()])
                    .map(|(a, b)| a * b)
                    .sum();
            }
        }
        Ok(())
    }
    fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        mut du: DenseViewMut<'_, f32>,
        mut dv: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.product(groups, de, &v, &mut du, false)?;
        self.product(groups, de, &u, &mut dv, true)
    }
    fn edge_softmax_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let act = |z: f32| match slope {
            Some(s) if z <= 0.0 => s * z,
            _ => z,
        };
        let e = self.pattern.len();
        ensure!(
            groups >= 1 && logits.len() == groups * e && out.len() == groups * e,
            "edge_softmax_grouped: {groups} groups of {e} edges"
        );
        for (logits, out) in logits.chunks_exact(e).zip(out.chunks_exact_mut(e)) {
            for i in 0..self.n {
                let ks: Vec<usize> = (0..e).filter(|&k| self.pattern[k].0 == i).collect();
                let m = ks
                    .iter()
                    .map(|&k| act(logits[k]))
                    .fold(f32::NEG_INFINITY, f32::max);
                let s: f32 = ks.iter().map(|&k| (act(logits[k]) - m).exp()).sum();
                for &k in &ks {
                    out[k] = (act(logits[k]) - m).exp() / s;
                }
            }
        }
        Ok(())
    }
    fn edge_softmax_backward_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d: &mut [f32],
    ) -> Result<()> {
        let e = self.pattern.len();
        ensure!(
            groups >= 1
                && slope.is_none_or(|_| logits.len() == groups * e)
                && [out.len(), d.len()] == [groups * e; 2],
            "edge_softmax_backward_grouped: {groups} groups of {e} edges"
        );
        for g in 0..groups {
            let run = g * e..(g + 1) * e;
            let (out, d) = (&out[run.clone()], &mut d[run.clone()]);
            for i in 0..self.n {
                let ks: Vec<usize> = (0..e).filter(|&k| self.pattern[k].0 == i).collect();
                let dot: f32 = ks.iter().map(|&k| out[k] * d[k]).sum();
                for &k in &ks {
                    let g = out[k] * (d[k] - dot);
                    d[k] = match slope {
                        Some(s) if logits[run.start + k] <= 0.0 => g * s,
                        _ => g,
                    };
                }
            }
        }
        Ok(())
    }
}

/// Checks a layer's backward pass against central finite differences of
/// `L = Σ output ⊙ r` (a fixed random `r`), in f64-accumulated sums: every parameter gradient
/// and the input gradient, within `tol` relative to the largest gradient.
pub(crate) fn check_gradients(
    layer: &mut dyn Layer,
    g: &mut DenseGraph,
    x: &[f32],
    pass: &Pass<'_>,
    tol: f32,
) {
    let (fi, fo) = layer.dims();
    let n = g.n;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99);
    let r: Vec<f32> = (0..n * fo).map(|_| rng.random_range(-1.0..1.0)).collect();
    let loss = |layer: &mut dyn Layer, g: &mut DenseGraph, x: &[f32]| -> f64 {
        layer.forward(g, x, pass).expect("forward");
        layer
            .output()
            .iter()
            .zip(&r)
            .map(|(&o, &r)| f64::from(o) * f64::from(r))
            .sum()
    };
    loss(layer, g, x);
    let total = super::param_len(&layer.specs());
    let mut grad = vec![0.0f32; total];
    let mut dx = vec![0.0f32; n * fi];
    let mut dy = r.clone();
    layer
        .backward(g, x, &mut dy, &mut grad, Some(&mut dx), pass)
        .expect("backward");
    let h = 1e-2f32;
    // Parameters, tensor by tensor, through params_mut.
    let mut numeric = Vec::with_capacity(total);
    let tensors = layer.params().len();
    for t in 0..tensors {
        let len = layer.params()[t].len();
        for i in 0..len {
            let orig = layer.params()[t][i];
            layer.params_mut()[t][i] = orig + h;
            let up = loss(layer, g, x);
            layer.params_mut()[t][i] = orig - h;
            let down = loss(layer, g, x);
            layer.params_mut()[t][i] = orig;
            numeric.push(((up - down) / (2.0 * f64::from(h))) as f32);
        }
    }
    let mut xs = x.to_vec();
    let mut numeric_dx = Vec::with_capacity(n * fi);
    for i in 0..n * fi {
        let orig = xs[i];
        xs[i] = orig + h;
        let up = loss(layer, g, &xs);
        xs[i] = orig - h;
        let down = loss(layer, g, &xs);
        xs[i] = orig;
        numeric_dx.push(((up - down) / (2.0 * f64::from(h))) as f32);
    }
    let compare = |what: &str, analytic: &[f32], numeric: &[f32]| {
        let scale = numeric.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        for (k, (a, b)) in analytic.iter().zip(numeric).enumerate() {
            assert!(
                (a - b).abs() <= tol * scale,
                "{what}[{k}]: backward {a}, finite differences {b} (scale {scale})"
            );
        }
    };
    compare("parameter gradient", &grad, &numeric);
    compare("input gradient", &dx, &numeric_dx);
}
