//! The GCN layer of Kipf & Welling: `H' = act(Â·dropout(H)·W + b)` over the chunk's normalised
//! adjacency `Â`, with the product order chosen by width (aggregate first when `in ≤ out`), the
//! bias and activation fused into the product's row blocks, and — for the first layer over
//! sparse features — the dropout fused into a product that reads only the non-zeros
//! ([`SparseInput`]).

use super::act::{self, Act};
use super::{Graph, Layer, ParamSpec, Pass};
use crate::dense::Op;
use crate::model::{dense, glorot, len_of, zeros};
use crate::par;
use crate::sparse_input::SparseInput;
use anyhow::Result;

/// How the first layer reads its input, once it has been seen.
#[derive(Debug)]
enum FirstInput {
    /// Not looked at yet (or not the first layer).
    Unknown,
    /// Dense; the address and length of the input looked at.
    Dense((usize, usize)),
    /// Sparse rows of the input (boxed: the other states are two words).
    Sparse(Box<SparseInput>),
}

/// One GCN layer bound to this rank's rows, with its buffers.
#[derive(Debug)]
pub struct GcnConv {
    fi: usize,
    fo: usize,
    /// Position in the stack: the dropout key's layer, and whether the input is the features.
    index: usize,
    dropout: f32,
    act: Act,
    rows: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
    /// The input after dropout (`rows × fi`; released while the sparse path holds it).
    input: Vec<f32>,
    /// `Â·input` (aggregate first) or `input·W` (transform first).
    mid: Vec<f32>,
    /// Pre-activation output `rows × fo`.
    z: Vec<f32>,
    /// Activated output `rows × fo`.
    out: Vec<f32>,
    aggregate_first: bool,
    /// Backward scratch, `rows × max(fi, fo)`.
    scratch: Vec<f32>,
    /// Per-block partial sums of the weight and bias gradients (grown once).
    partials: Vec<f32>,
    /// The first layer's `Â·X` of the undropped features (aggregate first): evaluation passes
    /// see the same input every epoch, so it is computed once per input.
    eval_mid: Option<((usize, usize), Vec<f32>)>,
    first_input: FirstInput,
    /// Whether the last training forward pass took the sparse path.
    sparse_step: bool,
}

impl GcnConv {
    /// f32 elements a layer of these widths over `rows` rows allocates (its parameters
    /// excluded): input, mid, z, out and scratch, plus the evaluation cache of a first layer.
    pub fn elements(fi: usize, fo: usize, rows: usize, first: bool) -> u64 {
        let (r, fi, fo) = (rows as u64, fi as u64, fo as u64);
        let per_row = fi
            .saturating_add(fi.max(fo))
            .saturating_add(fo.saturating_mul(2))
            .saturating_add(fi.max(fo))
            .saturating_add(if first { fi } else { 0 });
        r.saturating_mul(per_row)
            .saturating_add((par::blocks(rows) as u64).saturating_mul(fi.saturating_mul(fo)))
    }

    /// A layer `fi → fo` at position `index`, Glorot weights drawn from `rng`, zero bias.
    pub fn new(
        fi: usize,
        fo: usize,
        index: usize,
        dropout: f32,
        act: Act,
        rows: usize,
        rng: &mut rand_chacha::ChaCha8Rng,
    ) -> Result<Self> {
        let what = "the GCN's weights";
        let weight = glorot(rng, fi, fo, what)?;
        let bias = zeros(fo, what)?;
        let aggregate_first = fi <= fo;
        let what = "the GCN's activations";
        let mid = if aggregate_first { fi } else { fo };
        Ok(Self {
            input: zeros(len_of(rows, fi, what)?, what)?,
            mid: zeros(len_of(rows, mid, what)?, what)?,
            z: zeros(len_of(rows, fo, what)?, what)?,
            out: zeros(len_of(rows, fo, what)?, what)?,
            scratch: zeros(len_of(rows, fi.max(fo), what)?, what)?,
            partials: zeros(
                len_of(par::blocks(rows), len_of(fi, fo, what)?, what)?,
                "the GCN's partial gradient sums",
            )?,
            fi,
            fo,
            index,
            dropout,
            act,
            rows,
            weight,
            bias,
            aggregate_first,
            eval_mid: None,
            first_input: FirstInput::Unknown,
            sparse_step: false,
        })
    }

    /// Decides, once per input, whether the first layer reads it as sparse rows
    /// ([`SparseInput`]: a layer that transforms before it aggregates, over features at most one
    /// in [`crate::sparse_input::MAX_DENSITY`] non-zero); the dense copy of its dropped input is
    /// then released.
    fn look_at_input(&mut self, x: &[f32]) -> Result<()> {
        let id = (x.as_ptr() as usize, x.len());
        match &self.first_input {
            FirstInput::Sparse(sp) if sp.built_from(x) => return Ok(()),
            FirstInput::Dense(seen) if *seen == id => return Ok(()),
            _ => {}
        }
        self.sparse_step = false;
        let sparse = if self.aggregate_first {
            None
        } else {
            SparseInput::build(x, self.rows, self.fi, self.fo)?
        };
        self.first_input = match sparse {
            Some(sp) => {
                tracing::debug!(
                    stored = sp.nnz(),
                    entries = x.len(),
                    "the first layer reads its input as sparse rows"
                );
                self.input = Vec::new();
                FirstInput::Sparse(Box::new(sp))
            }
            None => FirstInput::Dense(id),
        };
        Ok(())
    }
}

impl Layer for GcnConv {
    fn dims(&self) -> (usize, usize) {
        (self.fi, self.fo)
    }

    fn specs(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec {
                name: "lin.weight",
                shape: [self.fi, self.fo],
                decay: true,
                split: true,
            },
            ParamSpec {
                name: "bias",
                shape: [1, self.fo],
                decay: false,
                split: false,
            },
        ]
    }

    fn params(&self) -> Vec<&[f32]> {
        vec![&self.weight, &self.bias]
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.weight, &mut self.bias]
    }

    fn output(&self) -> &[f32] {
        &self.out
    }

    fn forward(&mut self, g: &mut dyn Graph, x: &[f32], pass: &Pass<'_>) -> Result<()> {
        let (n, fi, fo) = (self.rows, self.fi, self.fo);
        let first = self.index == 0;
        let x = &x[..n * fi];
        // Under a column split this rank's stage is `Â·x̃[:, cols]·W[cols, :]`, summed across
        // ranks before the epilogue; otherwise the epilogue is fused into the last product.
        let split = g.column_split().is_some();
        let cols = g.columns(fi);
        let wc = cols.len();
        if first && !split {
            self.look_at_input(x)?;
        }
        let key = act::key(
            pass.seed,
            pass.epoch,
            self.index,
            self.dropout,
            pass.training,
        );
        let (w, b, act) = (
            &self.weight[cols.start * fo..cols.end * fo],
            &self.bias,
            self.act,
        );
        let epilogue =
            |_: usize, z: &mut [f32], out: &mut [f32]| act::bias_act(z, None, b, act, out);
        let (fused, fused_width): (&mut [f32], usize) = if split {
            (&mut [], 0)
        } else {
            (&mut self.out, fo)
        };
        if self.aggregate_first {
            let mid: &[f32] = if first && !pass.training {
                let id = (x.as_ptr() as usize, x.len());
                match &mut self.eval_mid {
                    Some((seen, m)) if *seen == id => m,
                    cache => {
                        let what = "the aggregated features";
                        let mut m = zeros(len_of(n, wc, what)?, what)?;
                        if split {
                            key.apply(pass.ids, x, fi, cols.clone(), &mut self.input);
                            g.forward(&self.input, wc, &mut m)?;
                        } else {
                            g.forward(x, fi, &mut m)?;
                        }
                        &cache.insert((id, m)).1
                    }
                }
            } else {
                key.apply(pass.ids, x, fi, cols.clone(), &mut self.input);
                g.forward(&self.input, wc, &mut self.mid)?;
                &self.mid
            };
            par::gemm_rows(
                mid,
                n,
                wc,
                w,
                Op::N,
                fo,
                &mut self.z,
                fused,
                fused_width,
                |r0, z, out| {
                    if !split {
                        epilogue(r0, z, out);
                    }
                },
            );
        } else {
            // The first layer over sparse features reads their non-zeros only (the same bits;
            // a non-finite weight takes the dense path, see `sparse_input`).
            let sparse = match &mut self.first_input {
                FirstInput::Sparse(sp) if first && w.iter().all(|v| v.is_finite()) => Some(sp),
                _ => None,
            };
            if first && pass.training {
                self.sparse_step = sparse.is_some();
            }
            if let Some(sp) = sparse {
                let dropout = pass.training.then_some((&key, pass.ids));
                dense(|| sp.product(dropout, w, fo, &mut self.mid));
            } else {
                if self.input.len() < n * wc {
                    // Released when the sparse path was chosen; back for this pass.
                    let what = "the GCN's activations";
                    self.input = zeros(len_of(n, fi, what)?, what)?;
                }
                key.apply(pass.ids, x, fi, cols.clone(), &mut self.input);
                par::gemm_rows(
                    &self.input,
                    n,
                    wc,
                    w,
                    Op::N,
                    fo,
                    &mut self.mid,
                    &mut [],
                    0,
                    |_, _, _| {},
                );
            }
            g.forward(&self.mid, fo, &mut self.z)?;
        }
        if split || !self.aggregate_first {
            g.sum_columns(&mut self.z[..n * fo])?;
            act::bias_act_rows(&mut self.z[..n * fo], None, b, act, &mut self.out[..n * fo]);
        }
        Ok(())
    }

    fn backward(
        &mut self,
        g: &mut dyn Graph,
        _x: &[f32],
        dy: &mut [f32],
        grad: &mut [f32],
        dx: Option<&mut [f32]>,
        pass: &Pass<'_>,
    ) -> Result<()> {
        let (n, fi, fo) = (self.rows, self.fi, self.fo);
        let split = g.column_split().is_some();
        let cols = g.columns(fi);
        let wc = cols.len();
        let dz = &mut dy[..n * fo];
        self.act.backward(&self.z, dz);
        let (gw, rest) = grad.split_at_mut(fi * fo);
        let gw = &mut gw[cols.start * fo..cols.end * fo];
        let gb = &mut rest[..fo];
        let partials = &mut self.partials;
        par::col_sums(dz, fo, n, gb, partials);
        let key = act::key(pass.seed, pass.epoch, self.index, self.dropout, true);
        let ids = pass.ids;
        // Through this layer's input dropout, on each row block as soon as its product is done.
        let mask = |r0: usize, d: &mut [f32]| {
            let rows = d.len() / wc.max(1);
            act::dropout_backward_rows(&key, &ids[r0..r0 + rows], d, cols.clone());
        };
        let w = &self.weight[cols.start * fo..cols.end * fo];
        let scratch = &mut self.scratch;
        // This rank's columns of the input gradient: `dx` itself, or a block that the split
        // gathers into it.
        let (mut dx, mut block) = (dx, Vec::new());
        if split && dx.is_some() {
            let what = "the GCN's input gradient";
            block = zeros(len_of(n, wc, what)?, what)?;
        }
        {
            let target: Option<&mut [f32]> = match (&mut dx, split) {
                (None, _) => None,
                (Some(_), true) => Some(&mut block[..]),
                (Some(d), false) => Some(&mut d[..]),
            };
            if self.aggregate_first {
                // Z = (Â·H)·W: dW = (Â·H)ᵀ·dZ, d(Â·H) = dZ·Wᵀ, dH = Âᵀ·d(Â·H).
                par::gemm_tn_sum(&self.mid, wc, dz, fo, n, gw, partials);
                if let Some(t) = target {
                    par::gemm_rows(dz, n, fo, w, Op::T, wc, scratch, &mut [], 0, |_, _, _| {});
                    g.backward(&scratch[..n * wc], wc, &mut t[..n * wc])?;
                    par::for_row_blocks(t, wc, n, mask);
                }
            } else {
                // Z = Â·(H·W): d(H·W) = Âᵀ·dZ, dW = Hᵀ·d(H·W), dH = d(H·W)·Wᵀ.
                g.backward(dz, fo, &mut scratch[..n * fo])?;
                let sparse = match &self.first_input {
                    FirstInput::Sparse(sp) if self.index == 0 && self.sparse_step => Some(sp),
                    _ => None,
                };
                if !sparse.is_some_and(|sp| dense(|| sp.tn_sum(&scratch[..n * fo], fo, gw))) {
                    // Dense, or sparse with a non-finite gradient: the dropped input made dense.
                    let densified;
                    let input: &[f32] = match sparse {
                        Some(sp) => {
                            let what = "the GCN's activations";
                            let mut d = zeros(len_of(n, fi, what)?, what)?;
                            sp.densify_kept(&mut d);
                            densified = d;
                            &densified
                        }
                        None => &self.input,
                    };
                    par::gemm_tn_sum(input, wc, &scratch[..n * fo], fo, n, gw, partials);
                }
                if let Some(t) = target {
                    par::gemm_rows(
                        &scratch[..n * fo],
                        n,
                        fo,
                        w,
                        Op::T,
                        wc,
                        t,
                        &mut [],
                        0,
                        |r0, d, _| mask(r0, d),
                    );
                }
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
