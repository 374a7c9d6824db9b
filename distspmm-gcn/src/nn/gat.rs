//! The graph attention layer of Veličković et al. with PyTorch Geometric's `GATConv`
//! semantics: per head `h`, `z = x·W` (`W` is `in × H·C`, head `h` its columns `h·C..(h+1)·C`),
//! `α_ij = softmax_i(LeakyReLU_0.2(att_dst[h]·z_i[h] + att_src[h]·z_j[h]))` over the in-edges
//! `j → i` of each destination `i` (the per-edge layout holds `A + I`, so every node attends to
//! itself), attention dropout on `α`, `out_i[h] = Σ_j α_ij·z_j[h]`; the heads concatenated
//! (`H·C` columns) or averaged (`C`), then the bias and the layer's activation.
//!
//! As graph primitives: the two halves of each logit are local dot products, `s_i =
//! att_dst[h]·z_i[h]` and `t_j = att_src[h]·z_j[h]`; an SDDMM with two columns per head,
//! `u_i = [s_i, 1]` and `v_j = [1, t_j]`, gives `e_ij = s_i + t_j` while moving the sources'
//! `t` the way the SpMM moves their rows; the edge softmax is local to the destination's owner;
//! the aggregation is an SpMM with the per-edge values `α`. The backward pass runs the same
//! primitives transposed: `dz[h] = A_αᵀ·dout[h]`, `dα_ij = ⟨dout_i[h], z_j[h]⟩` (an SDDMM),
//! the edge softmax's backward, and the SDDMM's backward for `ds_i = Σ_j de_ij` and `dt_j =
//! Σ_i de_ij` (the latter summed on the sources' owners). Every SDDMM and SpMM is one grouped
//! call for all heads (the heads are the groups: one pass over the edges, one exchange of
//! all heads' rows), and so is the edge softmax (one pass over each row for all heads).

use super::act::{self, Act};
use super::{Graph, Layer, ParamSpec, Pass};
use crate::dense::Op;
use crate::dropout::DropoutKey;
use crate::model::{glorot_fill, len_of, zeros};
use crate::par;
use anyhow::{ensure, Result};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};

/// LeakyReLU's slope on negative attention logits (PyG's `negative_slope` default).
pub const NEGATIVE_SLOPE: f32 = 0.2;

/// The shape and regularisation of one GAT layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatOptions {
    /// Input width.
    pub in_dim: usize,
    /// Attention heads `H` (≥ 1).
    pub heads: usize,
    /// Output channels per head `C` (≥ 1).
    pub channels: usize,
    /// Concatenate the heads (`H·C` outputs) or average them (`C`).
    pub concat: bool,
    /// Dropout probability on the layer's input features, in `[0, 1)`.
    pub dropout: f32,
    /// Dropout probability on the normalised attention coefficients, in `[0, 1)`.
    pub attn_dropout: f32,
    /// Output activation (ELU between layers, identity for the last).
    pub act: Act,
}

impl GatOptions {
    /// Output width: `H·C` when concatenating, `C` when averaging.
    pub fn out_dim(&self) -> usize {
        if self.concat {
            self.heads * self.channels
        } else {
            self.channels
        }
    }
}

/// One GAT layer: its parameters (PyG's names and order) and its forward state.
///
/// Parameters, in [`Layer::params`] order:
/// - `lin.weight`, `in × H·C` row-major: the transpose of PyG's `lin.weight` (`[H·C, in]`,
///   applied as `x·Wᵀ`): ours`[k][o]` = PyG's`[o][k]`;
/// - `att_src`, `1 × H·C`: PyG's `att_src` (`[1, H, C]`) in its memory order, head-major; it
///   scores the source `j` of each edge `j → i`;
/// - `att_dst`, `1 × H·C`: PyG's `att_dst`, scoring the destination `i`;
/// - `bias`, `1 × out` (`H·C` or `C`), added after the heads are combined.
///
/// Forward state: `H × edge_count` logits and coefficients (and their dropped copy while
/// training with attention dropout), allocated at the first pass and kept.
#[derive(Debug)]
pub struct GatConv {
    opts: GatOptions,
    /// Position in the stack (the dropout keys).
    layer: usize,
    weight: Vec<f32>,
    att_src: Vec<f32>,
    att_dst: Vec<f32>,
    bias: Vec<f32>,
    /// Rows and edges the buffers below are sized for.
    rows: usize,
    edges: usize,
    /// The dropped input (`rows × in`), when input dropout is on.
    input: Vec<f32>,
    /// `x·W` (`rows × H·C`).
    z: Vec<f32>,
    /// Per row `[s_0, 1, …, s_{H−1}, 1 | 1, t_0, …, 1, t_{H−1}]` (`rows × 4H`): the grouped
    /// SDDMM's `u` (the first `2H` columns, two per head) and `v` (the last `2H`).
    uv: Vec<f32>,
    /// Attention logits `e`, one run of `edges` per head.
    logits: Vec<f32>,
    /// `softmax(LeakyReLU(e))`, one run per head.
    alpha: Vec<f32>,
    /// The dropped coefficients of the forward pass, then `dα` and, in its place, `d e` in the
    /// backward pass.
    work: Vec<f32>,
    /// Each head's aggregation when the heads are averaged (`rows × H·C`); in the backward
    /// pass, each head's output gradient (`dy` repeated per head).
    heads_out: Vec<f32>,
    /// The pre-activation output (`rows × out`).
    pre: Vec<f32>,
    /// The activated output (`rows × out`).
    out: Vec<f32>,
    /// Whether the last forward pass aggregated with the dropped coefficients.
    dropped: bool,
    /// Whether a training forward pass awaits its backward pass (which overwrites `work`).
    pending: bool,
    dz: Vec<f32>,
    /// The SDDMM's `du` and `dv` (`rows × 2H`, two columns per head).
    du: Vec<f32>,
    dv: Vec<f32>,
    /// Per row `[dt_0 … dt_{H−1}, ds_0 … ds_{H−1}]` (`rows × 2H`).
    dsdt: Vec<f32>,
    /// `dsdtᵀ·z` (`2H × H·C`), whose diagonal blocks are the attention vectors' gradients.
    att_grad: Vec<f32>,
    partials: Vec<f32>,
}

/// `buf` holding exactly `len` values, reallocated (fallibly) when its length differs.
fn fit(buf: &mut Vec<f32>, len: usize, what: &str) -> Result<()> {
    if buf.len() != len {
        *buf = Vec::new();
        *buf = zeros(len, what)?;
    }
    Ok(())
}

/// Columns `first..first + width` of the `n`-row matrix stored in `buf` with leading dimension
/// `ld`.
fn cols(
    buf: &[f32],
    n: usize,
    first: usize,
    width: usize,
    ld: usize,
) -> Result<DenseView<'_, f32>> {
    Ok(DenseView::new(&buf[first.min(buf.len())..], n, width, ld)?)
}

impl GatConv {
    /// A layer at position `layer` of its stack (the dropout keys), its weight and attention
    /// vectors drawn Glorot-uniform from `rng` in that order (as PyG's `reset_parameters`:
    /// `lin.weight` with the bound of its `in`, `H·C` fans, each attention vector with that of
    /// its `[H, C]` shape), the bias zero.
    ///
    /// # Errors
    /// When an option is out of range or the parameters do not fit in memory.
    pub fn new(opts: GatOptions, layer: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Result<Self> {
        ensure!(
            opts.in_dim >= 1,
            "a GAT layer needs at least one input feature"
        );
        ensure!(opts.heads >= 1, "--heads must be at least 1");
        ensure!(opts.channels >= 1, "--hidden must be at least 1");
        ensure!(
            (0.0..1.0).contains(&opts.dropout),
            "--dropout must be in [0, 1), got {}",
            opts.dropout
        );
        ensure!(
            (0.0..1.0).contains(&opts.attn_dropout),
            "--attn-dropout must be in [0, 1), got {}",
            opts.attn_dropout
        );
        let what = "the GAT's parameters";
        let hc = len_of(opts.heads, opts.channels, what)?;
        let mut weight = zeros(len_of(opts.in_dim, hc, what)?, what)?;
        let mut att_src = zeros(hc, what)?;
        let mut att_dst = zeros(hc, what)?;
        glorot_fill(rng, &mut weight, opts.in_dim, hc);
        glorot_fill(rng, &mut att_src, opts.heads, opts.channels);
        glorot_fill(rng, &mut att_dst, opts.heads, opts.channels);
        let bias = zeros(opts.out_dim(), what)?;
        Ok(Self {
            opts,
            layer,
            weight,
            att_src,
            att_dst,
            bias,
            rows: 0,
            edges: 0,
            input: Vec::new(),
            z: Vec::new(),
            uv: Vec::new(),
            logits: Vec::new(),
            alpha: Vec::new(),
            work: Vec::new(),
            heads_out: Vec::new(),
            pre: Vec::new(),
            out: Vec::new(),
            dropped: false,
            pending: false,
            dz: Vec::new(),
            du: Vec::new(),
            dv: Vec::new(),
            dsdt: Vec::new(),
            att_grad: Vec::new(),
            partials: Vec::new(),
        })
    }

    /// The layer's options.
    pub fn options(&self) -> &GatOptions {
        &self.opts
    }

    /// The attention coefficients of the last forward pass before attention dropout: one run
    /// of [`Graph::edge_count`] values per head, in the per-edge layout.
    pub fn attention(&self) -> &[f32] {
        &self.alpha
    }

    /// Sizes the forward state for `n` rows and `e` edges.
    fn size_forward(&mut self, n: usize, e: usize, input_dropout: bool) -> Result<()> {
        let what = "the GAT layer's activations";
        let GatOptions {
            in_dim,
            heads,
            channels,
            concat,
            ..
        } = self.opts;
        let hc = heads * channels;
        let fo = self.opts.out_dim();
        let per_edge = len_of(heads, e, what)?;
        if input_dropout {
            fit(&mut self.input, len_of(n, in_dim, what)?, what)?;
        }
        fit(&mut self.z, len_of(n, hc, what)?, what)?;
        fit(&mut self.uv, len_of(n, 4 * heads, what)?, what)?;
        fit(&mut self.logits, per_edge, what)?;
        fit(&mut self.alpha, per_edge, what)?;
        if !concat {
            fit(&mut self.heads_out, len_of(n, hc, what)?, what)?;
        }
        fit(&mut self.pre, len_of(n, fo, what)?, what)?;
        fit(&mut self.out, len_of(n, fo, what)?, what)?;
        self.rows = n;
        self.edges = e;
        Ok(())
    }
}

/// `u_i = [s_i, 1]` (columns `2h, 2h+1`) and `v_i = [1, t_i]` (`2H + 2h, 2H + 2h + 1`) of every
/// head, from `z` (`rows × H·C`), for the rows of `block` starting at `r0`.
fn attention_halves(
    z: &[f32],
    att_src: &[f32],
    att_dst: &[f32],
    heads: usize,
    c: usize,
    r0: usize,
    block: &mut [f32],
) {
    let hc = heads * c;
    for (i, row) in block.chunks_exact_mut(4 * heads).enumerate() {
        let zi = &z[(r0 + i) * hc..(r0 + i + 1) * hc];
        let (u, v) = row.split_at_mut(2 * heads);
        for (h, (u, v)) in u.chunks_exact_mut(2).zip(v.chunks_exact_mut(2)).enumerate() {
            let head = h * c..(h + 1) * c;
            let dot = |a: &[f32]| -> f32 {
                a[head.clone()]
                    .iter()
                    .zip(&zi[head.clone()])
                    .map(|(a, z)| a * z)
                    .sum()
            };
            u.copy_from_slice(&[dot(att_dst), 1.0]);
            v.copy_from_slice(&[1.0, dot(att_src)]);
        }
    }
}

impl Layer for GatConv {
    fn dims(&self) -> (usize, usize) {
        (self.opts.in_dim, self.opts.out_dim())
    }

    fn specs(&self) -> Vec<ParamSpec> {
        let hc = self.opts.heads * self.opts.channels;
        vec![
            ParamSpec {
                name: "lin.weight",
                shape: [self.opts.in_dim, hc],
                decay: true,
                split: true,
            },
            ParamSpec {
                name: "att_src",
                shape: [1, hc],
                decay: true,
                split: false,
            },
            ParamSpec {
                name: "att_dst",
                shape: [1, hc],
                decay: true,
                split: false,
            },
            ParamSpec {
                name: "bias",
                shape: [1, self.opts.out_dim()],
                decay: true,
                split: false,
            },
        ]
    }

    fn params(&self) -> Vec<&[f32]> {
        vec![&self.weight, &self.att_src, &self.att_dst, &self.bias]
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        vec![
            &mut self.weight,
            &mut self.att_src,
            &mut self.att_dst,
            &mut self.bias,
        ]
    }

    fn forward(&mut self, g: &mut dyn Graph, x: &[f32], pass: &Pass<'_>) -> Result<()> {
        let n = g.rows();
        let e = g.edge_count();
        let GatOptions {
            in_dim: fi,
            heads,
            channels: c,
            concat,
            ..
        } = self.opts;
        let (hc, fo) = (heads * c, self.opts.out_dim());
        ensure!(
            pass.ids.len() == n && x.len() == len_of(n, fi, "the GAT layer's input")?,
            "GAT layer {}: {} input values and {} node ids for {n} rows of {fi} features",
            self.layer,
            x.len(),
            pass.ids.len()
        );
        let key = act::key(
            pass.seed,
            pass.epoch,
            self.layer,
            self.opts.dropout,
            pass.training,
        );
        self.pending = false;
        // Under a column split this rank's stage is `x̃_c·W[c]` over its columns c (`in_cols`), summed across
        // ranks; the attention and aggregation then run on every rank alike.
        let split = g.column_split().is_some();
        let in_cols = g.columns(fi);
        let wc = in_cols.len();
        self.size_forward(n, e, key.p > 0.0 || split)?;
        let input: &[f32] = if key.p > 0.0 || split {
            key.apply(pass.ids, x, fi, in_cols.clone(), &mut self.input);
            &self.input
        } else {
            x
        };
        par::gemm_rows(
            input,
            n,
            wc,
            &self.weight[in_cols.start * hc..in_cols.end * hc],
            Op::N,
            hc,
            &mut self.z,
            &mut [],
            0,
            |_, _, _| {},
        );
        g.sum_columns(&mut self.z[..n * hc])?;
        let (z, att_src, att_dst) = (&self.z, &self.att_src, &self.att_dst);
        par::for_row_blocks(&mut self.uv, 4 * heads, n, |r0, block| {
            attention_halves(z, att_src, att_dst, heads, c, r0, block);
        });
        let u = cols(&self.uv, n, 0, 2 * heads, 4 * heads)?;
        let v = cols(&self.uv, n, 2 * heads, 2 * heads, 4 * heads)?;
        g.sddmm_grouped(heads, u, v, &mut self.logits)?;
        g.edge_softmax_grouped(heads, Some(NEGATIVE_SLOPE), &self.logits, &mut self.alpha)?;
        self.dropped = pass.training && self.opts.attn_dropout > 0.0;
        if self.dropped {
            let what = "the GAT layer's attention";
            fit(&mut self.work, len_of(heads, e, what)?, what)?;
            self.work.copy_from_slice(&self.alpha);
            let edge_key = DropoutKey {
                seed: pass.seed,
                epoch: pass.epoch,
                layer: self.layer,
                p: self.opts.attn_dropout,
            }
            .edges();
            edge_key.apply_in_place(g.edge_ends()?, &mut self.work);
        }
        let coef = if self.dropped {
            &self.work
        } else {
            &self.alpha
        };
        let target = if concat {
            &mut self.pre
        } else {
            &mut self.heads_out
        };
        let z = DenseView::from_row_major(&self.z[..], n, hc)?;
        g.spmm_edges_grouped(
            heads,
            coef,
            z,
            DenseViewMut::from_row_major(&mut target[..], n, hc)?,
        )?;
        let (bias, heads_out) = (&self.bias, &self.heads_out);
        #[allow(clippy::cast_precision_loss, reason = "a head count")]
        let heads_f = heads as f32;
        par::for_row_blocks(&mut self.pre, fo, n, |r0, block| {
            for (i, row) in block.chunks_exact_mut(fo).enumerate() {
                if concat {
                    row.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
                } else {
                    let src = &heads_out[(r0 + i) * hc..(r0 + i + 1) * hc];
                    for (k, (o, b)) in row.iter_mut().zip(bias).enumerate() {
                        let sum: f32 = (0..heads).map(|h| src[h * c + k]).sum();
                        *o = sum / heads_f + b;
                    }
                }
            }
        });
        self.opts.act.forward(&self.pre, &mut self.out);
        self.pending = pass.training;
        Ok(())
    }

    fn output(&self) -> &[f32] {
        &self.out
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
        let GatOptions {
            in_dim: fi,
            heads,
            channels: c,
            concat,
            ..
        } = self.opts;
        let (n, e) = (self.rows, self.edges);
        let (hc, fo) = (heads * c, self.opts.out_dim());
        ensure!(
            self.pending,
            "GAT layer {}: backward pass without a training forward pass before it",
            self.layer
        );
        ensure!(
            g.rows() == n && g.edge_count() == e && pass.ids.len() == n,
            "GAT layer {}: the backward pass's graph differs from the forward pass's",
            self.layer
        );
        let total = super::param_len(&self.specs());
        ensure!(
            x.len() == n * fi
                && dy.len() == n * fo
                && grad.len() == total
                && dx.as_ref().is_none_or(|d| d.len() == n * fi),
            "GAT layer {}: gradient operands of the wrong length",
            self.layer
        );
        self.pending = false;
        let what = "the GAT layer's gradients";
        fit(&mut self.dz, n * hc, what)?;
        fit(&mut self.du, n * 2 * heads, what)?;
        fit(&mut self.dv, n * 2 * heads, what)?;
        fit(&mut self.dsdt, n * 2 * heads, what)?;
        fit(&mut self.att_grad, 2 * heads * hc, what)?;
        if !self.dropped {
            fit(&mut self.work, heads * e, what)?;
        }

        let (gw, rest) = grad.split_at_mut(fi * hc);
        let (g_src, rest) = rest.split_at_mut(hc);
        let (g_dst, g_bias) = rest.split_at_mut(hc);

        self.opts.act.backward(&self.pre, dy);
        par::col_sums(dy, fo, n, g_bias, &mut self.partials);
        if !concat && heads > 1 {
            #[allow(clippy::cast_precision_loss, reason = "a head count")]
            let h = heads as f32;
            par::for_row_blocks(dy, fo, n, |_, block| block.iter_mut().for_each(|v| *v /= h));
        }
        // Each head's output gradient: its columns of dy, or all of dy (already divided by H)
        // when the heads are averaged, repeated per head.
        let dout: &[f32] = if concat || heads == 1 {
            dy
        } else {
            fit(&mut self.heads_out, n * hc, what)?;
            let src: &[f32] = dy;
            par::for_row_blocks(&mut self.heads_out, hc, n, |r0, block| {
                for (i, row) in block.chunks_exact_mut(hc).enumerate() {
                    let d = &src[(r0 + i) * c..(r0 + i + 1) * c];
                    row.chunks_exact_mut(c)
                        .for_each(|head| head.copy_from_slice(d));
                }
            });
            &self.heads_out
        };
        let dout = DenseView::from_row_major(dout, n, hc)?;

        // dz = A_α'ᵀ·dout per head; then dα' = SDDMM(dout, z) per head into α''s runs, whose
        // last reader was that product.
        let coef = if self.dropped {
            &self.work
        } else {
            &self.alpha
        };
        let dz = DenseViewMut::from_row_major(&mut self.dz[..], n, hc)?;
        g.spmm_edges_transpose_grouped(heads, coef, dout, dz)?;
        let z = DenseView::from_row_major(&self.z[..], n, hc)?;
        g.sddmm_grouped(heads, dout, z, &mut self.work)?;
        if self.dropped {
            let edge_key = DropoutKey {
                seed: pass.seed,
                epoch: pass.epoch,
                layer: self.layer,
                p: self.opts.attn_dropout,
            }
            .edges();
            edge_key.apply_in_place(g.edge_ends()?, &mut self.work);
        }
        // de = softmax'(dα) for all heads, in place of dα; ds_i = Σ_j de_ij and dt_j = Σ_i de_ij
        // through the SDDMM's backward.
        let slope = Some(NEGATIVE_SLOPE);
        g.edge_softmax_backward_grouped(heads, slope, &self.logits, &self.alpha, &mut self.work)?;
        let u = cols(&self.uv, n, 0, 2 * heads, 4 * heads)?;
        let v = cols(&self.uv, n, 2 * heads, 2 * heads, 4 * heads)?;
        let du = DenseViewMut::from_row_major(&mut self.du[..], n, 2 * heads)?;
        let dv = DenseViewMut::from_row_major(&mut self.dv[..], n, 2 * heads)?;
        g.sddmm_backward_grouped(heads, &self.work, u, v, du, dv)?;
        let (du, dv) = (&self.du, &self.dv);
        par::for_row_blocks(&mut self.dsdt, 2 * heads, n, |r0, block| {
            for (i, row) in block.chunks_exact_mut(2 * heads).enumerate() {
                let (du, dv) = (
                    &du[(r0 + i) * 2 * heads..(r0 + i + 1) * 2 * heads],
                    &dv[(r0 + i) * 2 * heads..(r0 + i + 1) * 2 * heads],
                );
                for h in 0..heads {
                    row[h] = dv[2 * h + 1];
                    row[heads + h] = du[2 * h];
                }
            }
        });
        // dz[i, h] += ds_i·att_dst[h] + dt_i·att_src[h].
        let (dsdt, att_src, att_dst) = (&self.dsdt, &self.att_src, &self.att_dst);
        par::for_row_blocks(&mut self.dz, hc, n, |r0, block| {
            for (i, row) in block.chunks_exact_mut(hc).enumerate() {
                let d = &dsdt[(r0 + i) * 2 * heads..(r0 + i + 1) * 2 * heads];
                for (k, v) in row.iter_mut().enumerate() {
                    let h = k / c;
                    *v += d[heads + h] * att_dst[k] + d[h] * att_src[k];
                }
            }
        });
        // d att_src[h] = Σ_j dt_j·z_j[h], d att_dst[h] = Σ_i ds_i·z_i[h]: the diagonal blocks of
        // dsdtᵀ·z, summed in a fixed block order.
        par::gemm_tn_sum(
            &self.dsdt,
            2 * heads,
            &self.z,
            hc,
            n,
            &mut self.att_grad,
            &mut self.partials,
        );
        for h in 0..heads {
            let head = h * c..(h + 1) * c;
            g_src[head.clone()].copy_from_slice(&self.att_grad[h * hc..][head.clone()]);
            g_dst[head.clone()].copy_from_slice(&self.att_grad[(heads + h) * hc..][head]);
        }
        let key = act::key(
            pass.seed,
            pass.epoch,
            self.layer,
            self.opts.dropout,
            pass.training,
        );
        let split = g.column_split().is_some();
        let in_cols = g.columns(fi);
        let wc = in_cols.len();
        let c_rows = in_cols.start * hc..in_cols.end * hc;
        let input: &[f32] = if key.p > 0.0 || split { &self.input } else { x };
        par::gemm_tn_sum(
            input,
            wc,
            &self.dz,
            hc,
            n,
            &mut gw[c_rows.clone()],
            &mut self.partials,
        );
        if let Some(dx) = dx {
            // This rank's columns of the input gradient: `dx` itself, or (split) a block that
            // the split gathers into it.
            let what = "the GAT layer's input gradient";
            let mut block = if split {
                zeros(len_of(n, wc, what)?, what)?
            } else {
                Vec::new()
            };
            let target: &mut [f32] = if split { &mut block } else { &mut dx[..n * fi] };
            par::gemm_rows(
                &self.dz,
                n,
                hc,
                &self.weight[c_rows],
                Op::T,
                wc,
                target,
                &mut [],
                0,
                |_, _, _| {},
            );
            act::dropout_backward_cols(&key, pass.ids, target, in_cols);
            if split {
                g.gather_columns(fi, &block, dx)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    reason = "test shapes of a few nodes: every conversion is exact"
)]
mod tests {
    use super::*;
    use crate::nn::testing::{check_gradients, DenseGraph};
    use rand::{Rng, SeedableRng};

    fn options(
        heads: usize,
        concat: bool,
        dropout: f32,
        attn_dropout: f32,
        act: Act,
    ) -> GatOptions {
        GatOptions {
            in_dim: 5,
            heads,
            channels: 3,
            concat,
            dropout,
            attn_dropout,
            act,
        }
    }

    fn layer(opts: GatOptions, seed: u64) -> GatConv {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        GatConv::new(opts, 1, &mut rng).expect("layer")
    }

    fn features(n: usize, f: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n * f).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn pass(ids: &[u64], training: bool) -> Pass<'_> {
        Pass {
            seed: 17,
            epoch: 4,
            training,
            ids,
        }
    }

    fn leaky(v: f64) -> f64 {
        if v > 0.0 {
            v
        } else {
            0.2 * v
        }
    }

    /// A graph, a layer and an input whose attention logits all lie at least `margin` from
    /// LeakyReLU's kink at 0, where a finite difference of step 1e-2 would straddle it: the
    /// first of the seeds tried from `seed`.
    fn away_from_the_kink(
        opts: GatOptions,
        seed: u64,
        margin: f32,
    ) -> (DenseGraph, GatConv, Vec<f32>) {
        for s in seed..seed + 500 {
            let mut g = DenseGraph::random(8, 0.3, s);
            let ids = g.ids.clone();
            let mut l = layer(opts, s);
            // A bias away from zero, so its gradient is checked through the activation.
            l.params_mut()[3]
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = 0.1 * i as f32 - 0.25);
            let x = features(8, opts.in_dim, s);
            l.forward(&mut g, &x, &pass(&ids, true)).expect("forward");
            if l.logits.iter().all(|v| v.abs() >= margin) {
                return (g, l, x);
            }
        }
        panic!("no seed from {seed} keeps the logits {margin} from 0");
    }

    #[test]
    fn gradients_match_finite_differences() {
        for (k, (heads, concat, dropout, attn, act)) in [
            (2, true, 0.0, 0.0, Act::Elu),
            (3, false, 0.0, 0.0, Act::Identity),
            (2, true, 0.3, 0.4, Act::Elu),
            (3, false, 0.3, 0.5, Act::Elu),
            (1, false, 0.0, 0.3, Act::Identity),
        ]
        .into_iter()
        .enumerate()
        {
            let opts = options(heads, concat, dropout, attn, act);
            let (mut g, mut l, x) = away_from_the_kink(opts, 100 * k as u64, 0.03);
            let ids = g.ids.clone();
            check_gradients(&mut l, &mut g, &x, &pass(&ids, true), 1e-2);
            if dropout > 0.0 {
                assert!(l.input.contains(&0.0), "case {k}: no input dropped");
            }
            if attn > 0.0 {
                let zeros = l.work.iter().filter(|&&v| v == 0.0).count();
                assert!(
                    zeros > 0 && zeros < l.work.len(),
                    "case {k}: {zeros} dropped"
                );
            }
        }
    }

    #[test]
    fn dropout_is_keyed_and_off_in_evaluation() {
        let mut g = DenseGraph::random(9, 0.3, 2);
        let ids = g.ids.clone();
        let x = features(9, 5, 8);
        let mut with = layer(options(3, true, 0.4, 0.5, Act::Elu), 6);
        let mut without = layer(options(3, true, 0.0, 0.0, Act::Elu), 6);
        assert_eq!(with.params(), without.params());
        let out = |l: &mut GatConv, g: &mut DenseGraph, training: bool| {
            l.forward(g, &x, &pass(&ids, training)).expect("forward");
            l.output().to_vec()
        };
        let plain = out(&mut without, &mut g, true);
        assert_eq!(out(&mut with, &mut g, false), plain);
        let dropped = out(&mut with, &mut g, true);
        assert_ne!(dropped, plain);
        assert_eq!(out(&mut with, &mut g, true), dropped, "the masks are keyed");
        // A backward pass needs a training forward pass before it.
        out(&mut with, &mut g, false);
        let mut dy = vec![1.0; dropped.len()];
        let mut grad = vec![0.0; super::super::param_len(&with.specs())];
        assert!(with
            .backward(&mut g, &x, &mut dy, &mut grad, None, &pass(&ids, true))
            .is_err());
    }

    /// Softmax over each row of the dense `A + I` pattern of `LeakyReLU(att_dst·Wx_i +
    /// att_src·Wx_j)`, in f64: `alpha[h][i][j]`.
    fn dense_attention(l: &GatConv, n: usize, adj: &[bool], x: &[f32]) -> Vec<Vec<Vec<f64>>> {
        let GatOptions {
            in_dim: fi,
            heads,
            channels: c,
            ..
        } = l.opts;
        let hc = heads * c;
        let mut z = vec![0.0f64; n * hc];
        for i in 0..n {
            for o in 0..hc {
                z[i * hc + o] = (0..fi)
                    .map(|k| f64::from(x[i * fi + k]) * f64::from(l.weight[k * hc + o]))
                    .sum();
            }
        }
        let score = |att: &[f32], i: usize, h: usize| -> f64 {
            (0..c)
                .map(|k| f64::from(att[h * c + k]) * z[i * hc + h * c + k])
                .sum()
        };
        (0..heads)
            .map(|h| {
                (0..n)
                    .map(|i| {
                        let logit =
                            |j: usize| leaky(score(&l.att_dst, i, h) + score(&l.att_src, j, h));
                        let nb: Vec<usize> = (0..n).filter(|&j| adj[i * n + j] || i == j).collect();
                        let m = nb
                            .iter()
                            .map(|&j| logit(j))
                            .fold(f64::NEG_INFINITY, f64::max);
                        let s: f64 = nb.iter().map(|&j| (logit(j) - m).exp()).sum();
                        (0..n)
                            .map(|j| {
                                if nb.contains(&j) {
                                    (logit(j) - m).exp() / s
                                } else {
                                    0.0
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn attention_matches_a_dense_computation() {
        let n = 11;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        let mut edges = Vec::new();
        let mut adj = vec![false; n * n];
        for s in 0..n {
            for d in 0..n {
                if s != d && rng.random_bool(0.3) {
                    edges.push((s, d, 1.0));
                    adj[d * n + s] = true;
                }
            }
        }
        let mut g = DenseGraph::new(n, &edges);
        let ids = g.ids.clone();
        let mut l = layer(options(3, true, 0.5, 0.5, Act::Elu), 9);
        let x = features(n, 5, 4);
        l.forward(&mut g, &x, &pass(&ids, false)).expect("forward");
        let want = dense_attention(&l, n, &adj, &x);
        let e = g.pattern.len();
        assert_eq!(e, n + edges.len(), "the layout holds A + I");
        for (h, want) in want.iter().enumerate() {
            for (k, &(i, j)) in g.pattern.iter().enumerate() {
                let got = f64::from(l.attention()[h * e + k]);
                assert!(
                    (got - want[i][j]).abs() < 1e-5,
                    "head {h}, edge {j} → {i}: {got} vs {}",
                    want[i][j]
                );
            }
        }
    }

    /// PyG's `GATConv` forward over an edge list `(src, dst)` with self loops added, in f64.
    fn pyg_forward(
        l: &GatConv,
        n: usize,
        edge_index: &[(usize, usize)],
        x: &[f32],
        swap: bool,
    ) -> Vec<f64> {
        let GatOptions {
            in_dim: fi,
            heads,
            channels: c,
            concat,
            act,
            ..
        } = l.opts;
        let hc = heads * c;
        let mut edges: Vec<(usize, usize)> =
            edge_index.iter().copied().filter(|(s, d)| s != d).collect();
        edges.extend((0..n).map(|i| (i, i)));
        let (a_src, a_dst) = if swap {
            (&l.att_dst, &l.att_src)
        } else {
            (&l.att_src, &l.att_dst)
        };
        // x_proj = x · lin.weightᵀ in PyG's terms; our weight is that transpose.
        let mut xp = vec![0.0f64; n * hc];
        for i in 0..n {
            for o in 0..hc {
                for k in 0..fi {
                    xp[i * hc + o] += f64::from(x[i * fi + k]) * f64::from(l.weight[k * hc + o]);
                }
            }
        }
        let mut out = vec![0.0f64; n * hc];
        for h in 0..heads {
            let alpha_of = |a: &[f32], i: usize| -> f64 {
                (0..c)
                    .map(|k| f64::from(a[h * c + k]) * xp[i * hc + h * c + k])
                    .sum()
            };
            let logits: Vec<f64> = edges
                .iter()
                .map(|&(s, d)| leaky(alpha_of(a_src, s) + alpha_of(a_dst, d)))
                .collect();
            for i in 0..n {
                let into: Vec<usize> = (0..edges.len()).filter(|&k| edges[k].1 == i).collect();
                let m = into
                    .iter()
                    .map(|&k| logits[k])
                    .fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = into.iter().map(|&k| (logits[k] - m).exp()).sum();
                for &k in &into {
                    let a = (logits[k] - m).exp() / s;
                    let j = edges[k].0;
                    for q in 0..c {
                        out[i * hc + h * c + q] += a * xp[j * hc + h * c + q];
                    }
                }
            }
        }
        let fo = l.opts.out_dim();
        let mut y = vec![0.0f64; n * fo];
        for i in 0..n {
            for o in 0..fo {
                let v = if concat {
                    out[i * hc + o]
                } else {
                    (0..heads).map(|h| out[i * hc + h * c + o]).sum::<f64>() / heads as f64
                };
                let v = v + f64::from(l.bias[o]);
                y[i * fo + o] = match act {
                    Act::Identity => v,
                    Act::Relu => v.max(0.0),
                    Act::Elu => {
                        if v > 0.0 {
                            v
                        } else {
                            v.exp_m1()
                        }
                    }
                };
            }
        }
        y
    }

    #[test]
    fn forward_matches_pyg_on_a_small_directed_graph() {
        // 0 → 1, 2 → 1, 1 → 2, 3 → 0, 0 → 3, 2 → 3: node 1 hears 0 and 2, node 3 hears 0 and
        // 2; nobody hears 3 but 0.
        let edge_index = [(0, 1), (2, 1), (1, 2), (3, 0), (0, 3), (2, 3)];
        let n = 4;
        let x: Vec<f32> = vec![
            0.5, -1.0, 0.25, //
            1.5, 0.0, -0.5, //
            -0.75, 0.5, 1.0, //
            0.0, 2.0, -1.25,
        ];
        let edges: Vec<(usize, usize, f32)> =
            edge_index.iter().map(|&(s, d)| (s, d, 1.0)).collect();
        let mut g = DenseGraph::new(n, &edges);
        let ids = g.ids.clone();
        for (concat, act) in [(true, Act::Elu), (false, Act::Identity)] {
            let mut l = layer(
                GatOptions {
                    in_dim: 3,
                    heads: 2,
                    channels: 2,
                    concat,
                    dropout: 0.0,
                    attn_dropout: 0.0,
                    act,
                },
                1,
            );
            let mut p = l.params_mut();
            p[0].iter_mut()
                .enumerate()
                .for_each(|(i, w)| *w = 0.3 * ((i * 7 % 11) as f32 - 5.0) / 5.0);
            p[1].copy_from_slice(&[0.8, -0.4, 0.3, 1.1]);
            p[2].copy_from_slice(&[-0.6, 0.9, 1.2, -0.2]);
            p[3].iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = 0.05 * i as f32 - 0.1);
            l.forward(&mut g, &x, &pass(&ids, true)).expect("forward");
            let want = pyg_forward(&l, n, &edge_index, &x, false);
            let swapped = pyg_forward(&l, n, &edge_index, &x, true);
            let got = l.output();
            assert_eq!(got.len(), want.len());
            for (k, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(a) - b).abs() < 1e-5,
                    "concat {concat}, [{k}]: {a} vs {b}"
                );
            }
            // The test tells the source's vector from the destination's.
            let apart = want
                .iter()
                .zip(&swapped)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                apart > 1e-2,
                "swapping att_src and att_dst moves the output by {apart}"
            );
        }
    }

    #[test]
    fn specs_follow_pyg() {
        let l = layer(options(4, false, 0.0, 0.0, Act::Identity), 1);
        let specs: Vec<(&str, [usize; 2])> = l.specs().iter().map(|s| (s.name, s.shape)).collect();
        assert_eq!(
            specs,
            [
                ("lin.weight", [5, 12]),
                ("att_src", [1, 12]),
                ("att_dst", [1, 12]),
                ("bias", [1, 3])
            ]
        );
        assert_eq!(l.dims(), (5, 3));
        for (spec, values) in l.specs().iter().zip(l.params()) {
            assert_eq!(values.len(), spec.shape[0] * spec.shape[1]);
        }
        let bound = |a: usize, b: usize| (6.0 / (a + b) as f32).sqrt();
        assert!(l.weight.iter().all(|v| v.abs() <= bound(5, 12)));
        assert!(l.weight.iter().any(|v| v.abs() > 0.8 * bound(5, 12)));
        assert!(l
            .att_src
            .iter()
            .chain(&l.att_dst)
            .all(|v| v.abs() <= bound(4, 3)));
        assert!(l.bias.iter().all(|&b| b == 0.0));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        assert!(GatConv::new(options(0, true, 0.0, 0.0, Act::Elu), 0, &mut rng).is_err());
        assert!(GatConv::new(options(2, true, 0.0, 1.0, Act::Elu), 0, &mut rng).is_err());
    }
}
