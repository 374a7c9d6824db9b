//! The GCN of Kipf & Welling: `H' = σ(Â·H·W + b)`, ReLU between layers, dropout on every layer's
//! input, log-softmax + NLL over the training nodes, Adam with L2 weight decay on the first layer.
//!
//! The model is written once against two narrow doors: [`Aggregate`] (Â·X and Âᵀ·dY over this
//! rank's rows, however they are computed) and [`Reduce`] (sums across ranks). With the
//! distributed SpMM behind the first and MPI behind the second this is data-parallel training;
//! with a single-process product and an identity reduction it is ordinary training, and the two
//! optimise the same objective: the loss is the mean over *all* training nodes of all ranks, so
//! local gradients are summed, not averaged.

use super::dense::Op;
pub(crate) use super::dropout::DropoutKey;
use super::par;
use super::sparse_input::SparseInput;
use anyhow::{ensure, Result};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// Â·X and Âᵀ·dY over the rows this rank owns.
pub trait Aggregate {
    /// `y = Â · x` for this rank's rows; `x` and `y` are `rows × f` row-major.
    fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()>;
    /// `dx = Âᵀ · dy` for this rank's rows; `dy` and `dx` are `rows × f` row-major.
    fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()>;
    /// Payload bytes this rank has received so far (for reporting).
    fn bytes_received(&self) -> u64;
}

/// Element-wise sums across all ranks, in place; every rank gets the same result.
pub trait Reduce {
    /// Sums `buf` across ranks.
    fn sum_f32(&mut self, buf: &mut [f32]) -> Result<()>;
    /// Sums `buf` across ranks.
    fn sum_f64(&mut self, buf: &mut [f64]) -> Result<()>;
}

/// Hyperparameters of the model and its optimiser.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcnConfig {
    /// Input feature width.
    pub in_dim: usize,
    /// Hidden width of every inner layer.
    pub hidden: usize,
    /// Number of classes (output width).
    pub classes: usize,
    /// Number of GCN layers (≥ 1).
    pub layers: usize,
    /// Dropout probability on every layer's input during training.
    pub dropout: f32,
    /// Adam learning rate.
    pub lr: f32,
    /// L2 weight decay on the first layer's weights (the GCN paper's choice).
    pub weight_decay: f32,
    /// Seed of the initial weights and the dropout masks.
    pub seed: u64,
}

impl GcnConfig {
    /// Widths of the layer boundaries: `[in, hidden, …, hidden, classes]`.
    pub fn dims(&self) -> Vec<usize> {
        let mut d = vec![self.in_dim];
        d.extend(std::iter::repeat_n(
            self.hidden,
            self.layers.saturating_sub(1),
        ));
        d.push(self.classes);
        d
    }

    /// f32 elements a model of this configuration holds: the parameters four times (values,
    /// Adam's two moments, the gradient), `per_layer(fi, fo)` for each layer and
    /// `extra(max_weight)`, where `max_weight` is the largest weight's element count. Worked out
    /// without building [`GcnConfig::dims`] (the layer count may be anything an option
    /// allows); saturating.
    pub fn elements(&self, per_layer: impl Fn(u64, u64) -> u64, extra: impl Fn(u64) -> u64) -> u64 {
        let (i, h, c) = (self.in_dim as u64, self.hidden as u64, self.classes as u64);
        let layer = |fi: u64, fo: u64| {
            fi.saturating_mul(fo)
                .saturating_add(fo)
                .saturating_mul(4)
                .saturating_add(per_layer(fi, fo))
        };
        let (total, max_weight) = match self.layers as u64 {
            0 => (0, 0),
            1 => (layer(i, c), i.saturating_mul(c)),
            l => (
                layer(i, h)
                    .saturating_add((l - 2).saturating_mul(layer(h, h)))
                    .saturating_add(layer(h, c)),
                i.saturating_mul(h).max(h.saturating_mul(c)).max(if l > 2 {
                    h.saturating_mul(h)
                } else {
                    0
                }),
            ),
        };
        total.saturating_add(extra(max_weight))
    }

    /// Checks that a model whose buffers hold [`GcnConfig::elements`] f32 values fits in the
    /// memory available, before any of it is allocated.
    pub fn check_memory(&self, rows: usize, elements: u64) -> Result<()> {
        distspmm_core::memory::check(
            format!(
                "a GCN of {} layers and hidden width {} over {rows} nodes ({} features, {} classes)",
                self.layers, self.hidden, self.in_dim, self.classes
            ),
            distspmm_core::memory::bytes_of::<f32>(elements),
            MEMORY_HINT,
        )?;
        Ok(())
    }

    /// Checks the configuration makes a trainable model.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.layers >= 1, "--layers must be at least 1");
        ensure!(
            self.in_dim >= 1,
            "the chunks carry no features (feature dimension 0); a GCN needs node features"
        );
        ensure!(
            self.classes >= 2,
            "the chunks carry {} classes; training needs labels with at least 2 classes",
            self.classes
        );
        ensure!(
            self.hidden >= 1 || self.layers == 1,
            "--hidden must be at least 1"
        );
        ensure!(
            (0.0..1.0).contains(&self.dropout),
            "--dropout must be in [0, 1), got {}",
            self.dropout
        );
        ensure!(
            self.lr.is_finite() && self.lr > 0.0,
            "--lr must be a positive number, got {}",
            self.lr
        );
        ensure!(
            self.weight_decay.is_finite() && self.weight_decay >= 0.0,
            "--weight-decay must be a non-negative number, got {}",
            self.weight_decay
        );
        Ok(())
    }
}

/// What to do when a model's buffers do not fit.
const MEMORY_HINT: &str =
    "lower --hidden or --layers, or (data-parallel) partition the graph into more parts";

/// `len` zeros, allocated fallibly: a buffer the system refuses is an error naming `what`.
pub(crate) fn zeros(len: usize, what: &str) -> Result<Vec<f32>> {
    Ok(distspmm_core::memory::try_filled(
        len,
        0.0,
        what,
        MEMORY_HINT,
    )?)
}

/// `a · b` as a buffer length; an overflow is the same error as a refused allocation.
pub(crate) fn len_of(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| {
        distspmm_core::memory::MemoryError {
            what: what.into(),
            bytes: u64::MAX,
            available: None,
            hint: MEMORY_HINT,
        }
        .into()
    })
}

/// The parameters: per layer a row-major `in × out` weight and an `out` bias.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// Weights, one per layer.
    pub weights: Vec<Vec<f32>>,
    /// Biases, one per layer.
    pub biases: Vec<Vec<f32>>,
}

impl Params {
    /// Glorot-uniform weights and zero biases, identical on every rank for the same seed
    /// (allocated fallibly: weights that do not fit are an error).
    pub fn glorot(cfg: &GcnConfig) -> Result<Self> {
        let dims = cfg.dims();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed);
        let mut weights = Vec::new();
        let mut biases = Vec::new();
        for l in 0..cfg.layers {
            let (fi, fo) = (dims[l], dims[l + 1]);
            #[allow(
                clippy::cast_possible_truncation,
                reason = "deliberate: rounds the Glorot bound to f32"
            )]
            let r = (6.0 / (fi + fo) as f64).sqrt() as f32;
            let what = "the GCN's weights";
            let mut w = zeros(len_of(fi, fo, what)?, what)?;
            w.iter_mut().for_each(|v| *v = rng.random_range(-r..=r));
            weights.push(w);
            biases.push(zeros(fo, what)?);
        }
        Ok(Self { weights, biases })
    }

    /// All parameters as one flat vector (weights then bias, layer by layer).
    #[cfg(test)]
    pub fn flatten(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.len());
        for (w, b) in self.weights.iter().zip(&self.biases) {
            v.extend_from_slice(w);
            v.extend_from_slice(b);
        }
        v
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.weights.iter().map(Vec::len).sum::<usize>()
            + self.biases.iter().map(Vec::len).sum::<usize>()
    }

    /// Whether there are no parameters (no layers).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Overwrites the parameters from a flat vector in [`Params::flatten`] order.
    #[cfg(test)]
    pub fn unflatten(&mut self, flat: &[f32]) {
        let mut at = 0;
        for (w, b) in self.weights.iter_mut().zip(&mut self.biases) {
            let (wl, bl) = (w.len(), b.len());
            w.copy_from_slice(&flat[at..at + wl]);
            at += wl;
            b.copy_from_slice(&flat[at..at + bl]);
            at += bl;
        }
    }
}

/// Adam (Kingma & Ba) with L2 weight decay added to the gradient, as PyTorch's `Adam`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Adam {
    /// First-moment estimates, flat in [`Params::flatten`] order.
    pub m: Vec<f32>,
    /// Second-moment estimates.
    pub v: Vec<f32>,
    /// Steps taken.
    pub t: u64,
}

impl Adam {
    const BETA1: f32 = 0.9;
    const BETA2: f32 = 0.999;
    const EPS: f32 = 1e-8;

    /// Zero state for `n` parameters (allocated fallibly).
    pub fn new(n: usize) -> Result<Self> {
        let what = "Adam's moment estimates";
        Ok(Self {
            m: zeros(n, what)?,
            v: zeros(n, what)?,
            t: 0,
        })
    }

    /// One step, `params -= lr · m̂ / (√v̂ + ε)`, on the parameters where they live (the
    /// moments and `grads` are flat, weights then bias layer by layer), without copying them.
    pub fn step_params(&mut self, params: &mut Params, grads: &[f32], lr: f32) {
        self.t += 1;
        let mut at = 0;
        for (w, b) in params.weights.iter_mut().zip(&mut params.biases) {
            for p in [w, b] {
                let r = at..at + p.len();
                Self::update(
                    self.t,
                    p,
                    &grads[r.clone()],
                    &mut self.m[r.clone()],
                    &mut self.v[r],
                    lr,
                );
                at += p.len();
            }
        }
    }

    fn update(t: u64, params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], lr: f32) {
        // β^t is 0 in f32 long before t reaches i32::MAX, so saturating changes nothing.
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let bc1 = 1.0 - Self::BETA1.powi(t);
        let bc2 = 1.0 - Self::BETA2.powi(t);
        par::zip_chunks(params, grads, m, v, |params, grads, m, v| {
            for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                *m = Self::BETA1 * *m + (1.0 - Self::BETA1) * g;
                *v = Self::BETA2 * *v + (1.0 - Self::BETA2) * g * g;
                let mhat = *m / bc1;
                let vhat = *v / bc2;
                *p -= lr * mhat / (vhat.sqrt() + Self::EPS);
            }
        });
    }
}

/// What one rank holds of the data: its feature rows, labels and masks, and the original node ids
/// of its rows (the dropout masks are keyed by original id, so they do not depend on how many
/// ranks share the graph).
#[derive(Debug, Clone, Copy)]
pub struct LocalData<'a> {
    /// `rows × in_dim` features (row-normalised if asked).
    pub features: &'a [f32],
    /// Class per row, −1 for unlabelled.
    pub labels: &'a [i32],
    /// Bit 0 train, bit 1 val, bit 2 test.
    pub masks: &'a [u8],
    /// Original node id of each row.
    pub original_ids: &'a [u64],
}

/// Mask bit of the training nodes.
pub const TRAIN: u8 = 1;
/// Mask bit of the validation nodes.
pub const VAL: u8 = 2;
/// Mask bit of the test nodes.
pub const TEST: u8 = 4;

/// A training step whose gradient, summed across ranks, holds NaN or infinite values. The step
/// returns it as its error *before* touching the parameters, so the caller may stop (the
/// default) or skip the update and go on (`--on-nonfinite warn`, as mixed-precision trainers
/// skip overflowing steps). Every rank sees the same summed gradient, hence the same verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFiniteGradient {
    /// The epoch of the step, 1-based as the epoch lines print it.
    pub epoch: u64,
    /// The step's mean training loss (often NaN itself).
    pub loss: f64,
}

impl NonFiniteGradient {
    /// `Err(NonFiniteGradient)` if `grad` holds a NaN or an infinity; `epoch` is 0-based.
    pub fn check(grad: &[f32], epoch: u64, loss: f64) -> Result<()> {
        if grad.iter().all(|g| g.is_finite()) {
            return Ok(());
        }
        Err(Self {
            epoch: epoch + 1,
            loss,
        }
        .into())
    }
}

impl std::fmt::Display for NonFiniteGradient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a gradient became NaN or infinite at epoch {} (training loss {}): lower --lr or check the features for huge values",
            self.epoch, self.loss
        )
    }
}

impl std::error::Error for NonFiniteGradient {}

/// Counts summed across ranks after an evaluation: `[nll_sum, train_ok, train_n, val_ok, val_n, test_ok, test_n]`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Metrics {
    /// Mean NLL over the training nodes (without the weight-decay term).
    pub loss: f64,
    /// Training accuracy (fraction).
    pub train_acc: f64,
    /// Validation accuracy (fraction).
    pub val_acc: f64,
    /// Test accuracy (fraction).
    pub test_acc: f64,
}

/// Buffers of one forward/backward pass, allocated once.
#[derive(Debug)]
struct LayerBuffers {
    /// The layer's input after dropout (`rows × fi`).
    input: Vec<f32>,
    /// `Â·input` (aggregate first) or `input·W` (transform first).
    mid: Vec<f32>,
    /// Pre-activation output `rows × fo`.
    z: Vec<f32>,
    /// Output after activation (`rows × fo`; the logits for the last layer).
    out: Vec<f32>,
    /// Whether this layer aggregates before transforming (cheaper when `fi ≤ fo`).
    aggregate_first: bool,
}

/// A GCN bound to one rank's rows, with its reusable buffers.
#[derive(Debug)]
pub struct Gcn {
    /// Hyperparameters.
    pub cfg: GcnConfig,
    /// Current parameters.
    pub params: Params,
    /// Optimiser state.
    pub adam: Adam,
    dims: Vec<usize>,
    rows: usize,
    layers: Vec<LayerBuffers>,
    grad: Vec<f32>,
    /// Offset of each layer's weight in `grad` (its bias follows it).
    offsets: Vec<usize>,
    d_a: Vec<f32>,
    d_b: Vec<f32>,
    /// Per-block partial sums of the weight and bias gradients (grown once).
    partials: Vec<f32>,
    /// `Â·X` of the undropped features, when the first layer aggregates first: evaluation
    /// passes see the same input every epoch, so it is computed once.
    eval_mid0: Option<Vec<f32>>,
    /// How the first layer reads its input, once the features have been seen.
    first_input: FirstInput,
    /// Whether the last training forward pass took the sparse first layer (its dropped input
    /// is then in the [`SparseInput`], not in `layers[0].input`).
    sparse_step: bool,
    train_total: f64,
}

/// How the first layer reads the features: found out on the first forward pass (and again if
/// the features are another slice).
#[derive(Debug)]
enum FirstInput {
    /// Not looked at yet.
    Unknown,
    /// Dense (too many non-zeros, or a layer the sparse path does not take); the address and
    /// length of the features looked at.
    Dense((usize, usize)),
    /// Sparse rows of the features (boxed: the other states are two words).
    Sparse(Box<SparseInput>),
}

impl Gcn {
    /// f32 elements a model of `cfg` over `rows` rows allocates: per layer input, mid, z and
    /// out; `Â·X` of the features cached for evaluation; two gradient buffers of the widest
    /// layer; the per-block partial weight gradients (and the parameters, four times).
    fn elements(cfg: &GcnConfig, rows: usize) -> u64 {
        let (r, blocks) = (rows as u64, par::blocks(rows) as u64);
        let widest = cfg.in_dim.max(cfg.hidden).max(cfg.classes) as u64;
        cfg.elements(
            |fi, fo| {
                r.saturating_mul(
                    fi.saturating_add(fi.max(fo))
                        .saturating_add(fo.saturating_mul(2)),
                )
            },
            |max_weight| {
                r.saturating_mul(cfg.in_dim as u64)
                    .saturating_add(r.saturating_mul(widest).saturating_mul(2))
                    .saturating_add(blocks.saturating_mul(max_weight))
            },
        )
    }

    /// A fresh model (Glorot weights) for `rows` local rows; `train_total` is the number of
    /// training nodes summed over all ranks.
    pub fn new(cfg: GcnConfig, rows: usize, train_total: u64) -> Result<Self> {
        cfg.validate()?;
        ensure!(
            train_total > 0,
            "the training mask is empty on every rank: nothing to train on"
        );
        cfg.check_memory(rows, Self::elements(&cfg, rows))?;
        let params = Params::glorot(&cfg)?;
        let adam = Adam::new(params.len())?;
        let dims = cfg.dims();
        let what = "the GCN's activations";
        let layers = (0..cfg.layers)
            .map(|l| {
                let (fi, fo) = (dims[l], dims[l + 1]);
                let aggregate_first = fi <= fo;
                let mid = if aggregate_first { fi } else { fo };
                Ok(LayerBuffers {
                    input: zeros(len_of(rows, fi, what)?, what)?,
                    mid: zeros(len_of(rows, mid, what)?, what)?,
                    z: zeros(len_of(rows, fo, what)?, what)?,
                    out: zeros(len_of(rows, fo, what)?, what)?,
                    aggregate_first,
                })
            })
            .collect::<Result<_>>()?;
        let max_weight = dims.windows(2).map(|d| d[0] * d[1]).max().unwrap_or(0);
        // Grown here, once: the reductions then never allocate.
        let partials = zeros(
            len_of(par::blocks(rows), max_weight, what)?,
            "the GCN's partial gradient sums",
        )?;
        let mut offsets = Vec::with_capacity(cfg.layers);
        let mut at = 0;
        for l in 0..cfg.layers {
            offsets.push(at);
            at += dims[l] * dims[l + 1] + dims[l + 1];
        }
        let widest = dims.iter().copied().max().unwrap_or(0);
        let what = "the GCN's gradients";
        Ok(Self {
            grad: zeros(params.len(), what)?,
            params,
            adam,
            rows,
            layers,
            offsets,
            d_a: zeros(len_of(rows, widest, what)?, what)?,
            d_b: zeros(len_of(rows, widest, what)?, what)?,
            partials,
            eval_mid0: None,
            first_input: FirstInput::Unknown,
            sparse_step: false,
            dims,
            train_total: train_total as f64,
            cfg,
        })
    }

    /// This layer's input after dropout, into `layers[l].input`.
    #[cfg(test)]
    fn dropout_input(
        &mut self,
        l: usize,
        src: &[f32],
        data: &LocalData<'_>,
        epoch: u64,
        training: bool,
    ) {
        let fi = self.dims[l];
        self.key(l, epoch, training).apply(
            data.original_ids,
            &src[..self.rows * fi],
            fi,
            0..fi,
            &mut self.layers[l].input,
        );
    }

    /// Decides, once for these features, whether the first layer reads them as sparse rows
    /// ([`SparseInput`]: a first layer that transforms before it aggregates, over features at
    /// most one in [`crate::sparse_input::MAX_DENSITY`] non-zero); the dense copy of its
    /// dropped input is then released.
    fn look_at_features(&mut self, features: &[f32]) -> Result<()> {
        let (fi, fo) = (self.dims[0], self.dims[1]);
        let x = &features[..self.rows * fi];
        let id = (x.as_ptr() as usize, x.len());
        match &self.first_input {
            FirstInput::Sparse(sp) if sp.built_from(x) => return Ok(()),
            FirstInput::Dense(seen) if *seen == id => return Ok(()),
            _ => {}
        }
        self.sparse_step = false;
        let sparse = if self.layers[0].aggregate_first {
            None
        } else {
            SparseInput::build(x, self.rows, fi, fo)?
        };
        self.first_input = match sparse {
            Some(sp) => {
                tracing::debug!(
                    stored = sp.nnz(),
                    entries = x.len(),
                    "the first layer reads its input as sparse rows"
                );
                self.layers[0].input = Vec::new();
                FirstInput::Sparse(Box::new(sp))
            }
            None => FirstInput::Dense(id),
        };
        Ok(())
    }

    fn key(&self, layer: usize, epoch: u64, training: bool) -> DropoutKey {
        DropoutKey {
            seed: self.cfg.seed,
            epoch,
            layer,
            p: if training { self.cfg.dropout } else { 0.0 },
        }
    }

    /// Forward pass over this rank's rows; the logits end up in the last layer's `out`.
    fn forward(
        &mut self,
        agg: &mut dyn Aggregate,
        data: &LocalData<'_>,
        epoch: u64,
        training: bool,
    ) -> Result<()> {
        let n = self.rows;
        self.look_at_features(data.features)?;
        for l in 0..self.cfg.layers {
            let (fi, fo) = (self.dims[l], self.dims[l + 1]);
            let key = self.key(l, epoch, training);
            let last = l + 1 == self.cfg.layers;
            let (done, rest) = self.layers.split_at_mut(l);
            let layer = &mut rest[0];
            let src: &[f32] = if l == 0 {
                &data.features[..n * fi]
            } else {
                &done[l - 1].out
            };
            let (w, b) = (&self.params.weights[l], &self.params.biases[l]);
            let epilogue = |_: usize, z: &mut [f32], out: &mut [f32]| bias_act(z, out, b, last);
            if layer.aggregate_first {
                let mid: &[f32] = if l == 0 && !training {
                    match &mut self.eval_mid0 {
                        Some(m) => m,
                        cache @ None => {
                            let what = "the aggregated features";
                            let mut m = zeros(len_of(n, fi, what)?, what)?;
                            agg.forward(src, fi, &mut m)?;
                            cache.insert(m)
                        }
                    }
                } else {
                    key.apply(data.original_ids, src, fi, 0..fi, &mut layer.input);
                    agg.forward(&layer.input, fi, &mut layer.mid)?;
                    &layer.mid
                };
                dense(|| {
                    par::gemm_rows(
                        mid,
                        n,
                        fi,
                        w,
                        Op::N,
                        fo,
                        &mut layer.z,
                        &mut layer.out,
                        fo,
                        epilogue,
                    )
                });
            } else {
                // The first layer over sparse features reads their non-zeros only (the same
                // bits; a non-finite weight takes the dense path, see `sparse_input`).
                let sparse = match &mut self.first_input {
                    FirstInput::Sparse(sp) if l == 0 && w.iter().all(|v| v.is_finite()) => Some(sp),
                    _ => None,
                };
                if l == 0 && training {
                    self.sparse_step = sparse.is_some();
                }
                if let Some(sp) = sparse {
                    let dropout = training.then_some((&key, data.original_ids));
                    dense(|| sp.product(dropout, w, fo, &mut layer.mid));
                } else {
                    if layer.input.len() < n * fi {
                        // Released when the sparse path was chosen; back for this pass.
                        let what = "the GCN's activations";
                        layer.input = zeros(len_of(n, fi, what)?, what)?;
                    }
                    key.apply(data.original_ids, src, fi, 0..fi, &mut layer.input);
                    dense(|| {
                        par::gemm_rows(
                            &layer.input,
                            n,
                            fi,
                            w,
                            Op::N,
                            fo,
                            &mut layer.mid,
                            &mut [],
                            0,
                            |_, _, _| {},
                        )
                    });
                }
                agg.forward(&layer.mid, fo, &mut layer.z)?;
                let block = par::task_rows(n, fo);
                layer
                    .z
                    .par_chunks_mut(block * fo)
                    .zip(layer.out.par_chunks_mut(block * fo))
                    .for_each(|(z, out)| epilogue(0, z, out));
            }
        }
        Ok(())
    }

    /// Evaluates without dropout: loss over training nodes and the three accuracies, summed over ranks.
    pub fn evaluate(
        &mut self,
        agg: &mut dyn Aggregate,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
    ) -> Result<Metrics> {
        self.forward(agg, data, 0, false)?;
        let mut counts = self.local_counts(data);
        red.sum_f64(&mut counts)?;
        Ok(Metrics::from_counts(&counts))
    }

    /// Counts over this rank's rows from the logits of the last forward pass.
    fn local_counts(&self, data: &LocalData<'_>) -> [f64; 7] {
        count_metrics(
            &self.layers[self.cfg.layers - 1].out,
            self.cfg.classes,
            data.labels,
            data.masks,
        )
    }

    /// One training step (forward with dropout, backward, gradient sum across ranks, Adam);
    /// returns the mean training loss of the step's forward pass.
    pub fn train_step(
        &mut self,
        agg: &mut dyn Aggregate,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
        epoch: u64,
    ) -> Result<f64> {
        self.forward(agg, data, epoch, true)?;
        let mut counts = self.local_counts(data);
        self.backward(agg, data)?;
        // One reduction for the gradient and the loss statistics together would mix f32 and f64;
        // two small reductions keep the f64 sums exact.
        red.sum_f32(&mut self.grad)?;
        red.sum_f64(&mut counts)?;
        let loss = counts[0] / counts[2].max(1.0);
        NonFiniteGradient::check(&self.grad, epoch, loss)?;
        // L2 weight decay on the first layer's weights, added once after the sum.
        let w0 = self.params.weights[0].len();
        for (g, &w) in self.grad[..w0].iter_mut().zip(&self.params.weights[0]) {
            *g += self.cfg.weight_decay * w;
        }
        self.adam
            .step_params(&mut self.params, &self.grad, self.cfg.lr);
        Ok(loss)
    }

    /// Gradient of the global mean NLL with respect to all parameters, for this rank's rows,
    /// into `self.grad` (flat, [`Params::flatten`] order). The first layer's input gradient is
    /// never formed: no parameter needs it.
    fn backward(&mut self, agg: &mut dyn Aggregate, data: &LocalData<'_>) -> Result<()> {
        let n = self.rows;
        let layers = self.cfg.layers;
        let c = self.cfg.classes;
        let mut dz = std::mem::take(&mut self.d_a);
        nll_grad(
            &self.layers[layers - 1].out,
            c,
            data.labels,
            data.masks,
            self.train_total,
            &mut dz[..n * c],
        );
        let mut scratch = std::mem::take(&mut self.d_b);
        let scale = 1.0 / (1.0 - self.cfg.dropout);
        let dropout = self.cfg.dropout;
        for l in (0..layers).rev() {
            let (fi, fo) = (self.dims[l], self.dims[l + 1]);
            let (gw, rest) = self.grad[self.offsets[l]..].split_at_mut(fi * fo);
            let gb = &mut rest[..fo];
            let partials = &mut self.partials;
            dense(|| par::col_sums(&dz, fo, n, gb, partials));
            let layer = &self.layers[l];
            let w = &self.params.weights[l];
            let need_input_grad = l > 0;
            // Through the dropout of this layer's input (kept entries were scaled) and the
            // previous layer's ReLU, on each row block as soon as its product is done.
            let mask = |r0: usize, d: &mut [f32]| {
                if let Some(prev) = l.checked_sub(1).map(|p| &self.layers[p]) {
                    let range = r0 * fi..r0 * fi + d.len();
                    let (kept, z) = (&layer.input[range.clone()], &prev.z[range]);
                    // Selects, not branches: the dropped entries and the ReLU's zeros fall
                    // at random, and a branch on them would be mispredicted half the time.
                    let factor = if dropout == 0.0 { 1.0 } else { scale };
                    for ((d, &kept), &z) in d.iter_mut().zip(kept).zip(z) {
                        let keep = if dropout == 0.0 || kept != 0.0 {
                            factor
                        } else {
                            0.0
                        };
                        let v = *d * keep;
                        *d = if z > 0.0 { v } else { 0.0 };
                    }
                }
            };
            if layer.aggregate_first {
                // Z = (Â·H)·W: dW = (Â·H)ᵀ·dZ, d(Â·H) = dZ·Wᵀ, dH = Âᵀ·d(Â·H).
                dense(|| par::gemm_tn_sum(&layer.mid, fi, &dz, fo, n, gw, partials));
                if need_input_grad {
                    dense(|| {
                        par::gemm_rows(
                            &dz,
                            n,
                            fo,
                            w,
                            Op::T,
                            fi,
                            &mut scratch,
                            &mut [],
                            0,
                            |_, _, _| {},
                        )
                    });
                    agg.backward(&scratch[..n * fi], fi, &mut dz[..n * fi])?;
                    par::for_row_blocks(&mut dz, fi, n, mask);
                }
            } else {
                // Z = Â·(H·W): d(H·W) = Âᵀ·dZ, dW = Hᵀ·d(H·W), dH = d(H·W)·Wᵀ.
                agg.backward(&dz[..n * fo], fo, &mut scratch[..n * fo])?;
                let sparse = match &self.first_input {
                    FirstInput::Sparse(sp) if l == 0 && self.sparse_step => Some(sp),
                    _ => None,
                };
                if !sparse.is_some_and(|sp| dense(|| sp.tn_sum(&scratch, fo, gw))) {
                    // Dense, or sparse with a non-finite gradient: the dropped input made dense
                    // in `dz`, which this layer no longer needs (no input gradient at l = 0).
                    let input: &[f32] = match sparse {
                        Some(sp) => {
                            sp.densify_kept(&mut dz[..n * fi]);
                            &dz[..n * fi]
                        }
                        None => &layer.input,
                    };
                    dense(|| par::gemm_tn_sum(input, fi, &scratch, fo, n, gw, partials));
                }
                if need_input_grad {
                    dense(|| {
                        par::gemm_rows(
                            &scratch,
                            n,
                            fo,
                            w,
                            Op::T,
                            fi,
                            &mut dz,
                            &mut [],
                            0,
                            |r0, d, _| mask(r0, d),
                        )
                    });
                }
            }
        }
        self.d_a = dz;
        self.d_b = scratch;
        Ok(())
    }
}

/// `z += b` on each row, and `out` = ReLU(z) (or z itself for the last layer's logits).
fn bias_act(z: &mut [f32], out: &mut [f32], b: &[f32], last: bool) {
    let fo = b.len();
    for (zr, or) in z.chunks_exact_mut(fo).zip(out.chunks_exact_mut(fo)) {
        for ((z, o), &bb) in zr.iter_mut().zip(or.iter_mut()).zip(b) {
            *z += bb;
            *o = if last { *z } else { z.max(0.0) };
        }
    }
}

thread_local! {
    /// Seconds this thread spent in the model's dense products (and their fused epilogues).
    static DENSE_SECONDS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Runs `f` (a dense product), adding its wall time to this thread's dense-product clock.
fn dense<T>(f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let out = f();
    DENSE_SECONDS.with(|s| s.set(s.get() + t.elapsed().as_secs_f64()));
    out
}

/// Seconds the calling thread has spent in dense products so far (see [`dense`]).
pub fn dense_seconds() -> f64 {
    DENSE_SECONDS.with(std::cell::Cell::get)
}

impl Metrics {
    /// From counts summed over all rows of all ranks (see [`count_metrics`]).
    pub fn from_counts(k: &[f64; 7]) -> Self {
        Self {
            loss: k[0] / k[2].max(1.0),
            train_acc: k[1] / k[2].max(1.0),
            val_acc: k[3] / k[4].max(1.0),
            test_acc: k[5] / k[6].max(1.0),
        }
    }
}

/// `[nll_sum, train_ok, train_n, val_ok, val_n, test_ok, test_n]` over the rows of `logits`
/// (`rows × classes`); unlabelled rows (−1) count nowhere.
pub(crate) fn count_metrics(
    logits: &[f32],
    classes: usize,
    labels: &[i32],
    masks: &[u8],
) -> [f64; 7] {
    let rows = labels
        .len()
        .min(masks.len())
        .min(logits.len() / classes.max(1));
    par::block_sums(rows, |range| {
        let mut k = [0.0f64; 7];
        let logits = &logits[range.start * classes..range.end * classes];
        for ((row, &y), &m) in logits
            .chunks_exact(classes)
            .zip(&labels[range.clone()])
            .zip(&masks[range])
        {
            if y < 0 {
                continue;
            }
            let (argmax, lse) = log_sum_exp(row);
            let ok = f64::from(u8::from(argmax == y as usize));
            if m & TRAIN != 0 {
                k[0] += f64::from(lse - row[y as usize]);
                k[1] += ok;
                k[2] += 1.0;
            }
            if m & VAL != 0 {
                k[3] += ok;
                k[4] += 1.0;
            }
            if m & TEST != 0 {
                k[5] += ok;
                k[6] += 1.0;
            }
        }
        k
    })
}

/// Gradient of the mean NLL over `train_total` training nodes with respect to the logits:
/// `(softmax − onehot) / train_total` on this slice's labelled training rows, 0 elsewhere.
pub(crate) fn nll_grad(
    logits: &[f32],
    classes: usize,
    labels: &[i32],
    masks: &[u8],
    train_total: f64,
    dz: &mut [f32],
) {
    let rows = par::task_rows(labels.len(), classes);
    let block = rows * classes;
    dz.par_chunks_mut(block)
        .zip(logits.par_chunks(block))
        .zip(labels.par_chunks(rows))
        .zip(masks.par_chunks(rows))
        .for_each(|(((dz, logits), labels), masks)| {
            dz.fill(0.0);
            for (((row, d), &y), &m) in logits
                .chunks_exact(classes)
                .zip(dz.chunks_exact_mut(classes))
                .zip(labels)
                .zip(masks)
            {
                if y < 0 || m & TRAIN == 0 {
                    continue;
                }
                let (_, lse) = log_sum_exp(row);
                for (k, (dv, &v)) in d.iter_mut().zip(row).enumerate() {
                    let p = (v - lse).exp();
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "deliberate: averaged in f64, rounded to f32"
                    )]
                    let grad =
                        ((p - f32::from(u8::from(k == y as usize))) as f64 / train_total) as f32;
                    *dv = grad;
                }
            }
        });
}

/// `(argmax, log Σ exp)` of one row of logits.
pub(crate) fn log_sum_exp(row: &[f32]) -> (usize, f32) {
    let (mut arg, mut max) = (0, f32::NEG_INFINITY);
    for (k, &v) in row.iter().enumerate() {
        if v > max {
            max = v;
            arg = k;
        }
    }
    let s: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    (arg, max + s.ln())
}

/// Stand-ins for the distributed pieces, shared by the model's and the tensor-parallel tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::super::dense::{gemm, Op, Shape};
    use super::{Aggregate, Reduce, Result};

    /// Â as a dense matrix over all rows (one rank).
    pub(crate) struct DenseAgg {
        pub(crate) n: usize,
        pub(crate) a: Vec<f32>,
    }

    impl Aggregate for DenseAgg {
        fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()> {
            gemm(
                1.0,
                &self.a,
                Shape::new(self.n, self.n),
                Op::N,
                x,
                Shape::new(self.n, f),
                Op::N,
                0.0,
                y,
                Shape::new(self.n, f),
            );
            Ok(())
        }
        fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()> {
            gemm(
                1.0,
                &self.a,
                Shape::new(self.n, self.n),
                Op::T,
                dy,
                Shape::new(self.n, f),
                Op::N,
                0.0,
                dx,
                Shape::new(self.n, f),
            );
            Ok(())
        }
        fn bytes_received(&self) -> u64 {
            0
        }
    }

    /// Runs `f` on a fresh rayon pool of `threads` threads.
    pub(crate) fn pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a test thread pool")
            .install(f)
    }

    /// A single rank: sums are the identity.
    pub(crate) struct Alone;
    impl Reduce for Alone {
        fn sum_f32(&mut self, _: &mut [f32]) -> Result<()> {
            Ok(())
        }
        fn sum_f64(&mut self, _: &mut [f64]) -> Result<()> {
            Ok(())
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test shapes: every narrowing is exact; f32 rounding is deliberate"
)]
mod tests {
    use super::*;

    use super::testing::{pool, Alone, DenseAgg};

    fn setup(
        layers: usize,
        in_dim: usize,
        hidden: usize,
    ) -> (DenseAgg, Vec<f32>, Vec<i32>, Vec<u8>, Vec<u64>, GcnConfig) {
        let n = 7;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        // A non-symmetric Â so that forward and backward use different products.
        let a: Vec<f32> = (0..n * n)
            .map(|_| {
                if rng.random::<f32>() < 0.4 {
                    rng.random_range(0.1..1.0)
                } else {
                    0.0
                }
            })
            .collect();
        let x: Vec<f32> = (0..n * in_dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let labels: Vec<i32> = (0..n as i32).map(|i| i % 3).collect();
        let masks: Vec<u8> = (0..n)
            .map(|i| if i % 2 == 0 { TRAIN } else { TEST })
            .collect();
        let ids: Vec<u64> = (0..n as u64).collect();
        (
            DenseAgg { n, a },
            x,
            labels,
            masks,
            ids,
            test_config(in_dim, hidden, layers),
        )
    }

    #[test]
    fn gradient_matches_finite_differences() {
        // Both layer orders: in_dim < hidden (aggregate first) and in_dim > hidden (transform first).
        for (layers, in_dim, hidden) in [(2, 3, 5), (2, 6, 2), (3, 4, 4), (1, 5, 1)] {
            let (mut agg, x, labels, masks, ids, cfg) = setup(layers, in_dim, hidden);
            let data = LocalData {
                features: &x,
                labels: &labels,
                masks: &masks,
                original_ids: &ids,
            };
            let train_n = masks.iter().filter(|&&m| m & TRAIN != 0).count() as u64;
            let mut model = Gcn::new(cfg, agg.n, train_n).unwrap();
            // Move biases off zero and away from ReLU kinks.
            for b in &mut model.params.biases {
                b.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = 0.05 * i as f32 + 0.01);
            }
            model.forward(&mut agg, &data, 0, true).unwrap();
            model.backward(&mut agg, &data).unwrap();
            let analytic = model.grad.clone();
            let base = model.params.flatten();
            let eps = 1e-2f32;
            for i in 0..base.len() {
                let mut loss_at = |delta: f32| {
                    let mut p = base.clone();
                    p[i] += delta;
                    model.params.unflatten(&p);
                    model.evaluate(&mut agg, &mut Alone, &data).unwrap().loss
                };
                let numeric = (loss_at(eps) - loss_at(-eps)) / (2.0 * f64::from(eps));
                let a = f64::from(analytic[i]);
                assert!(
                    (numeric - a).abs() <= 2e-3 + 2e-2 * a.abs(),
                    "layers {layers} in {in_dim} hidden {hidden}: param {i}: numeric {numeric} analytic {a}"
                );
            }
        }
    }

    #[test]
    fn training_lowers_the_loss_and_is_deterministic() {
        let run = || {
            let (mut agg, x, labels, masks, ids, mut cfg) = setup(2, 4, 8);
            cfg.dropout = 0.3;
            cfg.weight_decay = 5e-4;
            let data = LocalData {
                features: &x,
                labels: &labels,
                masks: &masks,
                original_ids: &ids,
            };
            let mut model = Gcn::new(cfg, agg.n, 4).unwrap();
            let first = model.evaluate(&mut agg, &mut Alone, &data).unwrap().loss;
            let mut losses = Vec::new();
            for epoch in 0..100 {
                losses.push(
                    model
                        .train_step(&mut agg, &mut Alone, &data, epoch)
                        .unwrap(),
                );
            }
            let last = model.evaluate(&mut agg, &mut Alone, &data).unwrap().loss;
            (first, last, losses)
        };
        let (first, last, losses) = run();
        assert!(last < 0.5 * first, "loss {first} -> {last}");
        assert_eq!(losses, run().2, "same seed, same losses");
    }

    #[test]
    fn a_non_finite_gradient_is_a_typed_error_raised_before_the_update() {
        let (mut agg, x, labels, masks, ids, mut cfg) = setup(2, 4, 8);
        // Adam moves every weight by about lr in its first step: 1e30 overflows the next
        // forward pass (hidden ~1e30, logits ~1e60 → inf, log-softmax → NaN).
        cfg.lr = 1e30;
        let data = LocalData {
            features: &x,
            labels: &labels,
            masks: &masks,
            original_ids: &ids,
        };
        let mut model = Gcn::new(cfg, agg.n, 4).unwrap();
        model.train_step(&mut agg, &mut Alone, &data, 0).unwrap();
        let before = model.params.clone();
        let err = model
            .train_step(&mut agg, &mut Alone, &data, 1)
            .unwrap_err();
        let bad = err
            .downcast_ref::<NonFiniteGradient>()
            .unwrap_or_else(|| panic!("not a NonFiniteGradient: {err:#}"));
        assert_eq!(bad.epoch, 2, "reported 1-based, as the epoch lines");
        assert_eq!(model.params, before, "the update was applied");
        assert!(err.to_string().contains("at epoch 2"), "{err}");
        assert!(NonFiniteGradient::check(&[1.0, -3.0], 0, 0.5).is_ok());
        assert!(NonFiniteGradient::check(&[1.0, f32::INFINITY], 0, 0.5).is_err());
    }

    #[test]
    fn sparse_features_train_with_the_bits_of_the_dense_first_layer() {
        // Bag-of-words-like features (about 3 % non-zero, 160 wide) into a 16-wide first
        // layer, which transforms before it aggregates: the sparse path where it applies.
        let (n, in_dim) = (300, 160);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let a: Vec<f32> = (0..n * n)
            .map(|_| {
                if rng.random::<f32>() < 0.02 {
                    rng.random_range(0.1..1.0)
                } else {
                    0.0
                }
            })
            .collect();
        let x: Vec<f32> = (0..n * in_dim)
            .map(|_| {
                if rng.random::<f32>() < 0.03 {
                    rng.random_range(0.0..1.0)
                } else {
                    0.0
                }
            })
            .collect();
        let labels: Vec<i32> = (0..n as i32).map(|i| i % 5).collect();
        let masks: Vec<u8> = (0..n)
            .map(|i| if i % 3 == 0 { TRAIN } else { TEST })
            .collect();
        let ids: Vec<u64> = (0..n as u64).map(|i| 5 * i + 1).collect();
        let data = LocalData {
            features: &x,
            labels: &labels,
            masks: &masks,
            original_ids: &ids,
        };
        let mut cfg = test_config(in_dim, 16, 2);
        cfg.classes = 5;
        cfg.dropout = 0.5;
        let run = |dense: bool, threads: usize| {
            pool(threads, || {
                let mut agg = DenseAgg { n, a: a.clone() };
                let mut model = Gcn::new(cfg.clone(), n, 100).unwrap();
                if dense {
                    model.first_input = FirstInput::Dense((x.as_ptr() as usize, x.len()));
                }
                let mut losses = Vec::new();
                for epoch in 0..6 {
                    losses.push(
                        model
                            .train_step(&mut agg, &mut Alone, &data, epoch)
                            .unwrap(),
                    );
                    losses.push(model.evaluate(&mut agg, &mut Alone, &data).unwrap().loss);
                }
                let sparse = matches!(model.first_input, FirstInput::Sparse(_));
                (losses, model.params, sparse)
            })
        };
        let (want, want_params, was_sparse) = run(true, 2);
        assert!(!was_sparse, "forced dense");
        for threads in [1, 2, 3] {
            let (got, params, sparse) = run(false, threads);
            assert_eq!(
                sparse,
                crate::dense::narrow_applies(in_dim, 16, Op::N),
                "sparse where it applies"
            );
            assert_eq!(got, want, "losses, {threads} threads");
            assert_eq!(params, want_params, "parameters, {threads} threads");
        }
        // A non-finite weight takes the dense path for that pass (its buffer comes back), with
        // the dense path's result (here ReLU turns the NaN column into zeros).
        let nan_step = |dense: bool| {
            let mut agg = DenseAgg { n, a: a.clone() };
            let mut model = Gcn::new(cfg.clone(), n, 100).unwrap();
            if dense {
                model.first_input = FirstInput::Dense((x.as_ptr() as usize, x.len()));
            }
            model.train_step(&mut agg, &mut Alone, &data, 0).unwrap();
            model.params.weights[0][3] = f32::NAN;
            let loss = model
                .train_step(&mut agg, &mut Alone, &data, 1)
                .map_err(|e| e.to_string());
            assert!(!model.sparse_step);
            assert_eq!(model.layers[0].input.len(), n * in_dim);
            let params: Vec<u32> = model.params.flatten().iter().map(|v| v.to_bits()).collect();
            (loss.map(f64::to_bits), params)
        };
        assert_eq!(nan_step(false), nan_step(true));
    }

    #[test]
    fn dropout_masks_depend_on_original_ids_not_row_positions() {
        let (mut agg, x, labels, masks, ids, mut cfg) = setup(1, 4, 1);
        cfg.dropout = 0.5;
        let data = LocalData {
            features: &x,
            labels: &labels,
            masks: &masks,
            original_ids: &ids,
        };
        let mut model = Gcn::new(cfg.clone(), agg.n, 4).unwrap();
        model.forward(&mut agg, &data, 3, true).unwrap();
        let full = model.layers[0].input.clone();
        let dropped = full.iter().filter(|&&v| v == 0.0).count();
        assert!(
            dropped > 4 && dropped < 24,
            "about half of 28 entries dropped, got {dropped}"
        );
        // The same node seen as row 0 of a one-row rank gets the same mask.
        let one = LocalData {
            features: &x[4 * 4..5 * 4],
            labels: &labels[4..5],
            masks: &masks[4..5],
            original_ids: &ids[4..5],
        };
        let mut single = Gcn::new(cfg, 1, 1).unwrap();
        single.dropout_input(0, one.features, &one, 3, true);
        assert_eq!(single.layers[0].input, full[4 * 4..5 * 4]);
    }

    #[test]
    fn bad_configurations_are_explained() {
        let (_, _, _, _, _, cfg) = setup(2, 4, 8);
        let err = Gcn::new(
            GcnConfig {
                dropout: 1.0,
                ..cfg.clone()
            },
            3,
            1,
        )
        .unwrap_err();
        assert!(err.to_string().contains("--dropout"));
        let err = Gcn::new(cfg.clone(), 3, 0).unwrap_err();
        assert!(err.to_string().contains("training mask is empty"));
        // Sizes no machine holds are refused before anything is allocated.
        for huge in [
            GcnConfig {
                layers: 4_294_967_295,
                ..cfg.clone()
            },
            GcnConfig {
                hidden: usize::MAX,
                ..cfg.clone()
            },
        ] {
            let err = format!("{:#}", Gcn::new(huge, 3, 1).unwrap_err());
            assert!(err.contains("lower --hidden or --layers"), "{err}");
        }
    }

    /// The tests' model: 3 classes, no dropout or weight decay, a fixed seed.
    fn test_config(in_dim: usize, hidden: usize, layers: usize) -> GcnConfig {
        GcnConfig {
            in_dim,
            hidden,
            classes: 3,
            layers,
            dropout: 0.0,
            lr: 0.01,
            weight_decay: 0.0,
            seed: 9,
        }
    }

    #[test]
    fn the_memory_estimate_covers_every_buffer_the_model_allocates() {
        for (layers, in_dim, hidden, rows) in [(1, 4, 8, 7), (2, 9, 4, 300), (4, 5, 16, 1000)] {
            let cfg = test_config(in_dim, hidden, layers);
            let model = Gcn::new(cfg.clone(), rows, 1).unwrap();
            let buffers: usize = model
                .layers
                .iter()
                .map(|l| l.input.len() + l.mid.len() + l.z.len() + l.out.len())
                .sum();
            let held = 4 * model.params.len()
                + buffers
                + model.d_a.len()
                + model.d_b.len()
                + model.partials.len()
                + rows * in_dim; // the evaluation cache of Â·X
            let estimate = Gcn::elements(&cfg, rows);
            assert!(
                estimate >= held as u64,
                "{layers} layers: {estimate} < {held}"
            );
        }
    }
}
