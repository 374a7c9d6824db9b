//! The GCN of Kipf & Welling: `H' = σ(Â·H·W + b)`, ReLU between layers, dropout on every layer's
//! input, log-softmax + NLL over the training nodes, Adam with L2 weight decay on the first layer.
//!
//! The models (the layer stack in [`crate::nn`] and the tensor-parallel GCN) are written
//! against two narrow doors: [`Aggregate`] (Â·X and Âᵀ·dY over this
//! rank's rows, however they are computed) and [`Reduce`] (sums across ranks). With the
//! distributed SpMM behind the first and MPI behind the second this is data-parallel training;
//! with a single-process product and an identity reduction it is ordinary training, and the two
//! optimise the same objective: the loss is the mean over *all* training nodes of all ranks, so
//! local gradients are summed, not averaged.

use super::par;
use anyhow::{ensure, Result};
use chunk_format::TARGET_UNLABELLED;
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
    /// Of them, the bytes received so far by the distributed product's forward programs (rows
    /// to their readers) and backward programs (partial sums back to their owners), as its
    /// operator counted them; 0 where nothing is distributed.
    fn bytes_by_direction(&self) -> [u64; 2] {
        [0, 0]
    }
}

/// Element-wise sums across all ranks, in place; every rank gets the same result.
pub trait Reduce {
    /// Sums `buf` across ranks.
    fn sum_f32(&mut self, buf: &mut [f32]) -> Result<()>;
    /// Sums `buf` across ranks.
    fn sum_f64(&mut self, buf: &mut [f64]) -> Result<()>;
    /// Every rank's `mine` (of any length), concatenated in rank order, on every rank. One
    /// rank's (the default) is `mine` itself.
    fn gather_f32(&mut self, mine: &[f32]) -> Result<Vec<f32>> {
        Ok(mine.to_vec())
    }
    /// Bytes this rank has received from other ranks in its sums (and gathers) so far (0
    /// unless counted).
    fn bytes_received(&self) -> u64 {
        0
    }
}

/// The message-passing layer a model stacks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Kipf & Welling's GCN over the chunk's `Â` (ReLU between layers).
    #[default]
    Gcn,
    /// GraphSAGE, mean aggregator over in-neighbours with a root weight (ReLU between layers).
    Sage,
    /// GIN: sum aggregation then a two-layer MLP per layer (ReLU between layers).
    Gin,
    /// GAT: multi-head additive attention over each node's in-edges and its self loop (ELU
    /// between layers).
    Gat,
}

impl ModelKind {
    /// Lower-case name (`gcn`, `sage`, `gin`, `gat`).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Gcn => "gcn",
            ModelKind::Sage => "sage",
            ModelKind::Gin => "gin",
            ModelKind::Gat => "gat",
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Hyperparameters of the model and its optimiser.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// The layer the model stacks.
    #[serde(default)]
    pub model: ModelKind,
    /// Input feature width.
    pub in_dim: usize,
    /// Hidden width of every inner layer (per attention head for GAT).
    pub hidden: usize,
    /// Number of classes (output width).
    pub classes: usize,
    /// Number of layers (≥ 1).
    pub layers: usize,
    /// Dropout probability on every layer's input during training.
    pub dropout: f32,
    /// Adam learning rate.
    pub lr: f32,
    /// L2 weight decay: on the first layer's weights for GCN (the GCN paper's choice), on
    /// every parameter for the other models (PyTorch's `Adam(weight_decay=…)`).
    pub weight_decay: f32,
    /// Seed of the initial weights and the dropout masks.
    pub seed: u64,
    /// GAT: attention heads of the inner layers (concatenated).
    #[serde(default = "one")]
    pub heads: usize,
    /// GAT: attention heads of the last layer (averaged).
    #[serde(default = "one")]
    pub out_heads: usize,
    /// GAT: dropout probability on the attention coefficients during training.
    #[serde(default)]
    pub attn_dropout: f32,
    /// Adds each inner layer's input to its output where the widths agree.
    #[serde(default)]
    pub residual: bool,
    /// GIN: ε is a trained parameter (else fixed at 0).
    #[serde(default)]
    pub train_eps: bool,
    /// Multi-label targets (`classes` independent 0/1 outputs, binary cross-entropy with
    /// logits) instead of one class per node (softmax and NLL).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_label: bool,
}

fn one() -> usize {
    1
}

impl ModelConfig {
    /// Widths of the layer boundaries: `[in, hidden, …, hidden, classes]`.
    pub fn dims(&self) -> Vec<usize> {
        let mut d = vec![self.in_dim];
        d.extend(std::iter::repeat_n(
            self.inner(),
            self.layers.saturating_sub(1),
        ));
        d.push(self.classes);
        d
    }

    /// f32 elements a model of this configuration holds: the parameters four times (values,
    /// Adam's two moments, the gradient), `per_layer(fi, fo)` for each layer and
    /// `extra(max_weight)`, where `max_weight` is the largest weight's element count. Worked out
    /// without building [`ModelConfig::dims`] (the layer count may be anything an option
    /// allows); saturating.
    pub fn elements(&self, per_layer: impl Fn(u64, u64) -> u64, extra: impl Fn(u64) -> u64) -> u64 {
        let (i, h, c) = (self.in_dim as u64, self.inner() as u64, self.classes as u64);
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

    /// Parameters a model of this configuration holds (saturating; worked out without building
    /// [`ModelConfig::dims`], as the layer count may be anything an option allows).
    pub fn parameters(&self) -> u64 {
        let (i, h, c) = (self.in_dim as u64, self.hidden as u64, self.classes as u64);
        let inner = self.inner() as u64;
        let layer = |first: bool, last: bool| -> u64 {
            let fi = if first { i } else { inner };
            let fo = if last { c } else { inner };
            let mul = u64::saturating_mul;
            match self.model {
                ModelKind::Gcn => mul(fi, fo).saturating_add(fo),
                ModelKind::Sage => mul(mul(fi, fo), 2).saturating_add(fo),
                ModelKind::Gin => mul(fi, h)
                    .saturating_add(h)
                    .saturating_add(mul(h, fo))
                    .saturating_add(fo)
                    .saturating_add(u64::from(self.train_eps)),
                ModelKind::Gat => {
                    let (heads, per_head) = if last {
                        (self.out_heads as u64, c)
                    } else {
                        (self.heads as u64, h)
                    };
                    let width = mul(heads, per_head);
                    mul(fi, width)
                        .saturating_add(mul(width, 2))
                        .saturating_add(if last { per_head } else { width })
                }
            }
        };
        match self.layers as u64 {
            0 => 0,
            1 => layer(true, true),
            l => layer(true, false)
                .saturating_add((l - 2).saturating_mul(layer(false, false)))
                .saturating_add(layer(false, true)),
        }
    }

    /// Width of the inner layer boundaries: `hidden`, times the heads for GAT (concatenated).
    pub fn inner(&self) -> usize {
        match self.model {
            ModelKind::Gat => self.hidden.saturating_mul(self.heads),
            _ => self.hidden,
        }
    }

    /// Checks that a model whose buffers hold [`ModelConfig::elements`] f32 values fits in the
    /// memory available, before any of it is allocated.
    pub fn check_memory(&self, rows: usize, elements: u64) -> Result<()> {
        distspmm_sparse::memory::check(
            format!(
                "a GCN of {} layers and hidden width {} over {rows} nodes ({} features, {} classes)",
                self.layers, self.hidden, self.in_dim, self.classes
            ),
            distspmm_sparse::memory::bytes_of::<f32>(elements),
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
        ensure!(
            self.heads >= 1 && self.out_heads >= 1,
            "--heads and --out-heads must be at least 1"
        );
        ensure!(
            (0.0..1.0).contains(&self.attn_dropout),
            "--attn-dropout must be in [0, 1), got {}",
            self.attn_dropout
        );
        ensure!(
            self.model == ModelKind::Gat
                || (self.heads == 1 && self.out_heads == 1 && self.attn_dropout == 0.0),
            "--heads, --out-heads and --attn-dropout are options of --model gat (this is --model {})",
            self.model
        );
        ensure!(
            self.model == ModelKind::Gin || !self.train_eps,
            "--train-eps is an option of --model gin (this is --model {})",
            self.model
        );
        Ok(())
    }
}

/// What to do when a model's buffers do not fit.
const MEMORY_HINT: &str =
    "lower --hidden or --layers, or (data-parallel) partition the graph into more parts";

/// `len` zeros, allocated fallibly: a buffer the system refuses is an error naming `what`.
pub(crate) fn zeros(len: usize, what: &str) -> Result<Vec<f32>> {
    Ok(distspmm_sparse::memory::try_filled(
        len,
        0.0,
        what,
        MEMORY_HINT,
    )?)
}

/// `a · b` as a buffer length; an overflow is the same error as a refused allocation.
pub(crate) fn len_of(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| {
        distspmm_sparse::memory::MemoryError {
            what: what.into(),
            bytes: u64::MAX,
            available: None,
            hint: MEMORY_HINT,
        }
        .into()
    })
}

/// One named parameter tensor (row-major).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tensor {
    /// Name, `convs.<layer>.<name within the layer>` (PyG's names within a layer).
    pub name: String,
    /// Rows and columns.
    pub shape: [usize; 2],
    /// The values, row-major.
    pub values: Vec<f32>,
}

/// A model's parameters: its tensors in a fixed order (layer by layer, each layer's tensors in
/// its own order), the order of the flat gradient and of Adam's moments.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// The tensors.
    pub tensors: Vec<Tensor>,
}

impl Params {
    /// A GCN's parameters: per layer `convs.<l>.lin.weight` (Glorot-uniform, `in × out`) and
    /// `convs.<l>.bias` (zeros), identical on every rank for the same seed (allocated fallibly:
    /// weights that do not fit are an error).
    pub fn glorot(cfg: &ModelConfig) -> Result<Self> {
        let dims = cfg.dims();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed);
        let mut tensors = Vec::new();
        for l in 0..cfg.layers {
            let (fi, fo) = (dims[l], dims[l + 1]);
            tensors.push(Tensor {
                name: format!("convs.{l}.lin.weight"),
                shape: [fi, fo],
                values: glorot(&mut rng, fi, fo, "the GCN's weights")?,
            });
            tensors.push(Tensor {
                name: format!("convs.{l}.bias"),
                shape: [1, fo],
                values: zeros(fo, "the GCN's weights")?,
            });
        }
        Ok(Self { tensors })
    }

    /// The GCN's weight of layer `l` (tensor `2l`).
    pub fn weight(&self, l: usize) -> &[f32] {
        &self.tensors[2 * l].values
    }

    /// The GCN's bias of layer `l` (tensor `2l + 1`).
    pub fn bias(&self, l: usize) -> &[f32] {
        &self.tensors[2 * l + 1].values
    }

    /// All parameters as one flat vector (the tensors in order).
    #[cfg(test)]
    pub fn flatten(&self) -> Vec<f32> {
        self.tensors
            .iter()
            .flat_map(|t| t.values.iter().copied())
            .collect()
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.tensors.iter().map(|t| t.values.len()).sum()
    }

    /// Whether there are no parameters (no layers).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Overwrites the parameters from a flat vector in [`Params::flatten`] order.
    #[cfg(test)]
    pub fn unflatten(&mut self, flat: &[f32]) {
        let mut at = 0;
        for t in &mut self.tensors {
            let len = t.values.len();
            t.values.copy_from_slice(&flat[at..at + len]);
            at += len;
        }
    }

    /// Whether `self` has the names and shapes of `like` (values aside).
    pub fn same_layout(&self, like: &Params) -> bool {
        self.tensors.len() == like.tensors.len()
            && self.tensors.iter().zip(&like.tensors).all(|(a, b)| {
                a.name == b.name
                    && a.shape == b.shape
                    && a.shape[0].checked_mul(a.shape[1]) == Some(a.values.len())
            })
    }
}

/// `fi × fo` Glorot-uniform values (bound `√(6 / (fi + fo))`) drawn from `rng`, allocated
/// fallibly (for `what`).
pub(crate) fn glorot(
    rng: &mut rand_chacha::ChaCha8Rng,
    fi: usize,
    fo: usize,
    what: &str,
) -> Result<Vec<f32>> {
    let mut w = zeros(len_of(fi, fo, what)?, what)?;
    glorot_fill(rng, &mut w, fi, fo);
    Ok(w)
}

/// Fills `values` Glorot-uniform for fans `fan_a` and `fan_b` (bound `√(6 / (fan_a + fan_b))`),
/// drawn from `rng` in order.
pub(crate) fn glorot_fill(
    rng: &mut rand_chacha::ChaCha8Rng,
    values: &mut [f32],
    fan_a: usize,
    fan_b: usize,
) {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "deliberate: rounds the Glorot bound to f32"
    )]
    let r = (6.0 / (fan_a + fan_b).max(1) as f64).sqrt() as f32;
    values
        .iter_mut()
        .for_each(|v| *v = rng.random_range(-r..=r));
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

    /// One step, `params -= lr · m̂ / (√v̂ + ε)`, on the tensors where they live (the moments
    /// and `grads` are flat, the tensors in order), without copying them.
    pub fn step_params(&mut self, params: &mut Params, grads: &[f32], lr: f32) {
        self.step(
            params.tensors.iter_mut().map(|t| &mut t.values[..]),
            grads,
            lr,
        );
    }

    /// [`Adam::step_params`] over parameter slices in the flat order.
    pub fn step<'a>(
        &mut self,
        tensors: impl IntoIterator<Item = &'a mut [f32]>,
        grads: &[f32],
        lr: f32,
    ) {
        self.t += 1;
        let mut at = 0;
        for p in tensors {
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

/// What one rank holds of the data: its feature rows, labels (or multi-label targets) and
/// masks, and the original node ids of its rows (the dropout masks are keyed by original id, so
/// they do not depend on how many ranks share the graph).
#[derive(Debug, Clone, Copy)]
pub struct LocalData<'a> {
    /// `rows × in_dim` features (row-normalised if asked).
    pub features: &'a [f32],
    /// Class per row, −1 for unlabelled (empty with multi-label `targets`).
    pub labels: &'a [i32],
    /// Multi-label targets, `rows × classes`: each row 0/1 per class, or all
    /// [`TARGET_UNLABELLED`] for an unlabelled node. `None` for class labels.
    pub targets: Option<&'a [u8]>,
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

/// An evaluation's numbers, from counts summed across ranks (see [`count_metrics`] and
/// [`count_confusion`]).
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
    /// Macro-F1 over the training nodes (see [`macro_f1`]).
    pub train_f1: f64,
    /// Macro-F1 over the validation nodes.
    pub val_f1: f64,
    /// Macro-F1 over the test nodes.
    pub test_f1: f64,
    /// Multi-label targets: the ROC-AUC on the training, validation and test masks (see
    /// [`auc_per_mask`]; 0 for a mask without a class that has both target values), where the
    /// accuracies and F1s above are 0. `None` for class labels.
    pub auc: Option<[f64; 3]>,
}

/// The validation metric that early stopping and the "best epoch" report follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Accuracy.
    #[default]
    Acc,
    /// Macro-F1 over the classes (see [`macro_f1`]).
    F1,
    /// ROC-AUC averaged over the classes, for multi-label targets (see [`auc_per_mask`]).
    Auc,
}

impl Metric {
    /// Lower-case name (`acc`, `f1`, `auc`), as the option takes it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Acc => "acc",
            Metric::F1 => "f1",
            Metric::Auc => "auc",
        }
    }

    /// The metric of data with multi-label targets (`auc`) or class labels (`acc`) when none is
    /// asked for; an asked-for metric the data has not is an error that says which it has.
    ///
    /// # Errors
    /// `acc` or `f1` for multi-label targets, `auc` for class labels.
    pub fn resolve(asked: Option<Metric>, multi_label: bool) -> Result<Metric> {
        match (asked, multi_label) {
            (None, false) => Ok(Metric::Acc),
            (None, true) => Ok(Metric::Auc),
            (Some(m @ Metric::Auc), true) | (Some(m @ (Metric::Acc | Metric::F1)), false) => Ok(m),
            (Some(m), true) => anyhow::bail!(
                "--metric {} is for one class per node, but this graph has multi-label targets \
                 (`y` of shape [N, C] in {{0, 1}}), which are measured by ROC-AUC: use --metric \
                 auc, or leave --metric out",
                m.name()
            ),
            (Some(_), false) => anyhow::bail!(
                "--metric auc is for multi-label targets (`y` of shape [N, C] in {{0, 1}}), but \
                 this graph has one class per node: use --metric acc or f1, or leave --metric out"
            ),
        }
    }
}

thread_local! {
    /// Seconds this thread spent in the model's dense products (and their fused epilogues).
    static DENSE_SECONDS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Runs `f` (a dense product), adding its wall time to this thread's dense-product clock.
pub(crate) fn dense<T>(f: impl FnOnce() -> T) -> T {
    let _clock = DenseClock::start();
    f()
}

/// Adds the time from its start to its drop to this thread's dense-product clock: the
/// row-block products of [`crate::par`] start one, so every layer's products are counted.
pub(crate) struct DenseClock(std::time::Instant);

impl DenseClock {
    /// Starts the clock.
    pub(crate) fn start() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Drop for DenseClock {
    fn drop(&mut self) {
        let elapsed = self.0.elapsed().as_secs_f64();
        DENSE_SECONDS.with(|s| s.set(s.get() + elapsed));
    }
}

/// Seconds the calling thread has spent in dense products so far (see [`dense`]).
pub fn dense_seconds() -> f64 {
    DENSE_SECONDS.with(std::cell::Cell::get)
}

impl Metrics {
    /// From counts summed over all rows of all ranks: `k` of [`count_metrics`], `confusion` of
    /// [`count_confusion`] (`9 · classes` values).
    pub fn from_counts(k: &[f64; 7], confusion: &[f64]) -> Self {
        let per_mask = confusion.len() / 3;
        let f1 = |mask: usize| macro_f1(&confusion[mask * per_mask..(mask + 1) * per_mask]);
        Self {
            loss: k[0] / k[2].max(1.0),
            train_acc: k[1] / k[2].max(1.0),
            val_acc: k[3] / k[4].max(1.0),
            test_acc: k[5] / k[6].max(1.0),
            train_f1: f1(0),
            val_f1: f1(1),
            test_f1: f1(2),
            auc: None,
        }
    }

    /// For multi-label targets: the mean binary cross-entropy over the training nodes and
    /// classes (`[loss sum, training rows]` of [`bce_sums`], summed over ranks) and the ROC-AUC
    /// per mask.
    pub fn multi_label(sums: &[f64; 2], classes: usize, auc: [Option<f64>; 3]) -> Self {
        Self {
            loss: sums[0] / (sums[1] * classes as f64).max(1.0),
            auc: Some(auc.map(|a| a.unwrap_or(0.0))),
            ..Self::default()
        }
    }

    /// The validation value of `metric`.
    pub fn val(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Acc => self.val_acc,
            Metric::F1 => self.val_f1,
            Metric::Auc => self.auc.map_or(0.0, |a| a[1]),
        }
    }
}

/// Per-class counts over the rows of `logits` (`rows × classes`), for [`macro_f1`]: for each
/// mask (train, val, test, in that order) and each class `c`, `[tp, fp, fn]` — rows of the mask
/// labelled `c` and predicted `c`, predicted `c` but labelled otherwise, labelled `c` but
/// predicted otherwise — so `9 · classes` values, summed across ranks as the accuracy counts
/// are. The prediction is the argmax of [`count_metrics`]; unlabelled rows (−1) count nowhere.
pub(crate) fn count_confusion(
    logits: &[f32],
    classes: usize,
    labels: &[i32],
    masks: &[u8],
) -> Vec<f64> {
    let per_mask = 3 * classes;
    let rows = labels
        .len()
        .min(masks.len())
        .min(logits.len() / classes.max(1));
    let block = par::task_rows(rows, classes).max(1);
    let count = |range: std::ops::Range<usize>| {
        let mut k = vec![0.0f64; 3 * per_mask];
        for r in range {
            let (y, m) = (labels[r], masks[r]);
            // A label outside the classes is one `count_metrics` also never counts as right.
            let Ok(y) = usize::try_from(y) else { continue };
            if y >= classes {
                continue;
            }
            let (p, _) = log_sum_exp(&logits[r * classes..(r + 1) * classes]);
            for (mask, bit) in [TRAIN, VAL, TEST].into_iter().enumerate() {
                if m & bit == 0 {
                    continue;
                }
                let at = mask * per_mask;
                if p == y {
                    k[at + 3 * y] += 1.0;
                } else {
                    k[at + 3 * p + 1] += 1.0;
                    k[at + 3 * y + 2] += 1.0;
                }
            }
        }
        k
    };
    (0..rows.div_ceil(block))
        .into_par_iter()
        .map(|b| count(b * block..((b + 1) * block).min(rows)))
        .reduce(
            || vec![0.0; 3 * per_mask],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            },
        )
}

/// Macro-F1 of one mask's `[tp, fp, fn]` per class (see [`count_confusion`]): the mean over
/// classes of `F1_c = 2·tp / (2·tp + fp + fn)`, as scikit-learn's
/// `f1_score(average='macro', zero_division=0)`: a class that occurs among the labels or the
/// predictions but is never right scores 0, and a class absent from both (all three counts 0)
/// is left out of the mean, as scikit-learn averages over the labels present in either. With no
/// class present (an empty mask) it is 0.
pub fn macro_f1(confusion: &[f64]) -> f64 {
    let (sum, present) = confusion
        .chunks_exact(3)
        .filter(|c| c[0] + c[1] + c[2] > 0.0)
        .fold((0.0, 0u32), |(sum, n), c| {
            (sum + 2.0 * c[0] / (2.0 * c[0] + c[1] + c[2]), n + 1)
        });
    if present == 0 {
        0.0
    } else {
        sum / f64::from(present)
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

/// Whether a row of multi-label targets is labelled (its bytes are 0/1, not
/// [`TARGET_UNLABELLED`]).
pub(crate) fn labelled(row: &[u8]) -> bool {
    row.first().is_some_and(|&t| t != TARGET_UNLABELLED)
}

/// Binary cross-entropy of a logit `z` against a target `y` ∈ {0, 1}, in the stable form
/// `max(z, 0) − z·y + ln(1 + e^−|z|)` (torch's `BCEWithLogitsLoss`).
pub fn bce_with_logits(z: f64, y: f64) -> f64 {
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

/// The logistic function `1 / (1 + e^−z)`, computed without overflow on either side.
pub fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// `[Σ bce, rows]` over this slice's labelled training rows of multi-label `targets`
/// (`rows × classes`): the loss summed over their classes (see [`bce_with_logits`]) and their
/// count. The mean loss is `Σ / (rows · classes)` over all ranks' sums.
pub(crate) fn bce_sums(logits: &[f32], classes: usize, targets: &[u8], masks: &[u8]) -> [f64; 2] {
    let rows = masks
        .len()
        .min(targets.len() / classes.max(1))
        .min(logits.len() / classes.max(1));
    par::block_sums(rows, |range| {
        let mut k = [0.0f64; 2];
        for r in range {
            let t = &targets[r * classes..(r + 1) * classes];
            if masks[r] & TRAIN == 0 || !labelled(t) {
                continue;
            }
            let z = &logits[r * classes..(r + 1) * classes];
            k[0] += z
                .iter()
                .zip(t)
                .map(|(&z, &y)| bce_with_logits(f64::from(z), f64::from(y)))
                .sum::<f64>();
            k[1] += 1.0;
        }
        k
    })
}

/// Gradient of the mean binary cross-entropy over `train_total` training nodes and `classes`
/// classes with respect to the logits: `(σ(z) − y) / (train_total · classes)` on this slice's
/// labelled training rows, 0 elsewhere.
pub(crate) fn bce_grad(
    logits: &[f32],
    classes: usize,
    targets: &[u8],
    masks: &[u8],
    train_total: f64,
    dz: &mut [f32],
) {
    let rows = par::task_rows(masks.len(), classes);
    let block = rows * classes;
    let scale = train_total * classes as f64;
    dz.par_chunks_mut(block)
        .zip(logits.par_chunks(block))
        .zip(targets.par_chunks(block))
        .zip(masks.par_chunks(rows))
        .for_each(|(((dz, logits), targets), masks)| {
            dz.fill(0.0);
            for (((z, d), t), &m) in logits
                .chunks_exact(classes)
                .zip(dz.chunks_exact_mut(classes))
                .zip(targets.chunks_exact(classes))
                .zip(masks)
            {
                if m & TRAIN == 0 || !labelled(t) {
                    continue;
                }
                for ((dv, &z), &y) in d.iter_mut().zip(z).zip(t) {
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "deliberate: computed in f64, rounded to f32"
                    )]
                    let grad = ((sigmoid(f64::from(z)) - f64::from(y)) / scale) as f32;
                    *dv = grad;
                }
            }
        });
}

/// Values per row of [`auc_rows`]: the logits, the targets and the mask bits.
fn auc_row_len(classes: usize) -> usize {
    2 * classes + 1
}

/// What this slice's rows contribute to the ROC-AUC of every mask: for each labelled row in
/// any mask, its `classes` logits, its `classes` targets (as 0.0 or 1.0) and its mask bits (as a
/// float), `2·classes + 1` values; [`auc_per_mask`] takes these rows of every rank.
pub(crate) fn auc_rows(logits: &[f32], classes: usize, targets: &[u8], masks: &[u8]) -> Vec<f32> {
    let mut out = Vec::new();
    for (r, &m) in masks.iter().enumerate() {
        let (Some(z), Some(t)) = (
            logits.get(r * classes..(r + 1) * classes),
            targets.get(r * classes..(r + 1) * classes),
        ) else {
            break;
        };
        if m & (TRAIN | VAL | TEST) == 0 || !labelled(t) {
            continue;
        }
        out.extend_from_slice(z);
        out.extend(t.iter().map(|&y| f32::from(y)));
        out.push(f32::from(m));
    }
    out
}

/// The ROC-AUC of every mask (train, val, test) over `rows` laid out as [`auc_rows`] writes
/// them (all ranks' rows together), as OGB's ogbn-proteins evaluator computes it: for each
/// class, the exact [`roc_auc`] of the logits over the mask's labelled rows, skipping a class
/// whose targets there are all 0 or all 1; then the mean over the classes kept. `None` for a
/// mask where no class is kept (OGB raises an error there). The order of the rows does not
/// matter: the result depends only on the set of (logit, target) pairs.
pub fn auc_per_mask(rows: &[f32], classes: usize) -> [Option<f64>; 3] {
    let width = auc_row_len(classes);
    let rows: Vec<&[f32]> = rows.chunks_exact(width).collect();
    [TRAIN, VAL, TEST].map(|bit| {
        let in_mask: Vec<&[f32]> = rows
            .iter()
            .copied()
            .filter(|r| mask_bits(r[width - 1]) & bit != 0)
            .collect();
        let per_class: Vec<Option<f64>> = (0..classes)
            .into_par_iter()
            .map(|c| {
                let mut pairs: Vec<(f32, bool)> = in_mask
                    .iter()
                    .map(|r| (r[c], r[classes + c] > 0.5))
                    .collect();
                roc_auc(&mut pairs)
            })
            .collect();
        let kept: Vec<f64> = per_class.into_iter().flatten().collect();
        (!kept.is_empty()).then(|| kept.iter().sum::<f64>() / kept.len() as f64)
    })
}

/// The mask bits [`auc_rows`] stored as a float (exact: at most 7).
fn mask_bits(v: f32) -> u8 {
    (0..8u8).find(|&m| f32::from(m) == v).unwrap_or(0)
}

/// The exact area under the ROC curve of `(score, positive)` pairs: the probability that a
/// positive scores above a negative, ties counting one half (the Mann–Whitney U over the
/// number of pairs), from the average ranks of tied scores. `None` without both a positive and
/// a negative. Reorders `pairs`. Scores are compared by value (−0 equals 0); NaN sorts above
/// every number.
pub fn roc_auc(pairs: &mut [(f32, bool)]) -> Option<f64> {
    let positives = pairs.iter().filter(|p| p.1).count();
    let negatives = pairs.len() - positives;
    if positives == 0 || negatives == 0 {
        return None;
    }
    for p in pairs.iter_mut() {
        if p.0 == 0.0 {
            p.0 = 0.0;
        }
    }
    pairs.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    // Σ of the positives' ranks (1-based), a tie group of positions i..j sharing the rank
    // (i + 1 + j) / 2: half-integers, exact in f64 far beyond any row count.
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < pairs.len() {
        let mut j = i + 1;
        while j < pairs.len() && pairs[j].0.total_cmp(&pairs[i].0).is_eq() {
            j += 1;
        }
        let pos = pairs[i..j].iter().filter(|p| p.1).count();
        rank_sum += pos as f64 * (i + 1 + j) as f64 / 2.0;
        i = j;
    }
    let (p, n) = (positives as f64, negatives as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
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

/// Stand-ins for the distributed pieces, shared by the models' and the tensor-parallel tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Reduce, Result};

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
mod tests {
    use super::*;
    use rand::seq::SliceRandom;

    /// One-hot logits predicting `preds` over `classes` classes.
    fn logits_of(preds: &[usize], classes: usize) -> Vec<f32> {
        let mut z = vec![0.0f32; preds.len() * classes];
        for (r, &p) in preds.iter().enumerate() {
            z[r * classes + p] = 1.0;
        }
        z
    }

    #[test]
    fn macro_f1_matches_a_hand_computed_example() {
        // Four classes. Validation: class 0 tp 1 fp 1 fn 1 (F1 1/2), class 1 tp 2 fp 1 (F1 4/5),
        // class 2 only labelled, never predicted (F1 0), class 3 neither labelled nor predicted
        // (left out): (0.5 + 0.8 + 0) / 3, as scikit-learn's
        // f1_score([0,0,1,1,2], [0,1,1,1,0], average='macro', zero_division=0).
        // Test: class 1 labelled but predicted 3 (0), class 2 right (1), class 3 only predicted
        // (0), class 0 absent (left out): 1/3. The unlabelled row counts nowhere.
        let labels = [0, 0, 1, 1, 2, 1, 2, -1, 0];
        let preds = [0, 1, 1, 1, 0, 3, 2, 2, 0];
        let vt = VAL | TEST;
        let masks = [VAL, VAL, VAL, VAL, VAL, TEST, TEST, vt, TRAIN];
        let z = logits_of(&preds, 4);
        let confusion = count_confusion(&z, 4, &labels, &masks);
        assert_eq!(confusion.len(), 9 * 4);
        #[rustfmt::skip]
        let val = [1.0, 1.0, 1.0,  2.0, 1.0, 0.0,  0.0, 0.0, 1.0,  0.0, 0.0, 0.0];
        assert_eq!(confusion[12..24], val);
        let m = Metrics::from_counts(&count_metrics(&z, 4, &labels, &masks), &confusion);
        assert!((m.val_f1 - 1.3 / 3.0).abs() < 1e-12, "{m:?}");
        assert!((m.test_f1 - 1.0 / 3.0).abs() < 1e-12, "{m:?}");
        assert_eq!(m.train_f1, 1.0, "one class, always right");
        assert!(
            (m.val_acc - 0.6).abs() < 1e-12 && m.test_acc == 0.5,
            "{m:?}"
        );
        assert_eq!(m.val(Metric::F1), m.val_f1);
        assert_eq!(m.val(Metric::Acc), m.val_acc);
    }

    #[test]
    fn macro_f1_of_nothing_is_zero_and_of_perfect_predictions_one() {
        assert_eq!(macro_f1(&[0.0; 12]), 0.0, "an empty mask");
        assert_eq!(macro_f1(&[]), 0.0);
        assert_eq!(
            macro_f1(&[3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0]),
            1.0
        );
        // Counts summed in any grouping give the same F1: blocks of rows are independent.
        let labels: Vec<i32> = (0..1000).map(|i| i % 7).collect();
        let preds: Vec<usize> = (0..1000).map(|i| (i * 3 / 2) % 7).collect();
        let masks = vec![VAL; 1000];
        let z = logits_of(&preds, 7);
        let whole = count_confusion(&z, 7, &labels, &masks);
        let mut halves = count_confusion(&z[..500 * 7], 7, &labels[..500], &masks[..500]);
        let rest = count_confusion(&z[500 * 7..], 7, &labels[500..], &masks[500..]);
        halves.iter_mut().zip(&rest).for_each(|(a, b)| *a += b);
        assert_eq!(whole, halves);
    }

    /// `-[y log σ(z) + (1 − y) log(1 − σ(z))]`, the textbook form, for moderate `z`.
    fn bce_reference(z: f64, y: f64) -> f64 {
        let p = 1.0 / (1.0 + (-z).exp());
        -(y * p.ln() + (1.0 - y) * (1.0 - p).ln())
    }

    #[test]
    fn bce_with_logits_is_the_textbook_loss_and_stays_finite() {
        for z in [-8.0, -1.5, -0.25, 0.0, 0.3, 2.0, 9.0] {
            for y in [0.0, 1.0] {
                let (a, b) = (bce_with_logits(z, y), bce_reference(z, y));
                assert!((a - b).abs() < 1e-12, "z {z} y {y}: {a} vs {b}");
            }
            assert!((sigmoid(z) - 1.0 / (1.0 + (-z).exp())).abs() < 1e-15);
        }
        // Where the textbook form overflows or loses everything: ln(1 + e^-|z|) ≈ 0.
        assert_eq!(bce_with_logits(1000.0, 0.0), 1000.0);
        assert_eq!(bce_with_logits(-1000.0, 1.0), 1000.0);
        assert_eq!(bce_with_logits(1000.0, 1.0), 0.0);
        assert!((bce_with_logits(40.0, 1.0) - (-40.0f64).exp()).abs() < 1e-30);
        assert_eq!((sigmoid(-1000.0), sigmoid(1000.0)), (0.0, 1.0));
    }

    /// Random logits, targets (some rows unlabelled) and masks.
    fn bce_case(rows: usize, classes: usize, seed: u64) -> (Vec<f32>, Vec<u8>, Vec<u8>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let z = (0..rows * classes)
            .map(|_| rng.random_range(-4.0f32..4.0))
            .collect();
        let mut t: Vec<u8> = (0..rows * classes)
            .map(|_| u8::from(rng.random::<bool>()))
            .collect();
        for r in (0..rows).filter(|r| r % 5 == 3) {
            t[r * classes..(r + 1) * classes].fill(TARGET_UNLABELLED);
        }
        let masks = (0..rows)
            .map(|r| [TRAIN, VAL, TEST, TRAIN | VAL, 0][r % 5])
            .collect();
        (z, t, masks)
    }

    #[test]
    fn bce_gradient_matches_finite_differences_and_a_dense_reference() {
        let (rows, classes) = (23, 4);
        let (z, t, masks) = bce_case(rows, classes, 11);
        // The labelled training rows: r % 5 ∈ {0, 3} minus the unlabelled r % 5 = 3.
        let train: Vec<usize> = (0..rows).filter(|r| r % 5 == 0).collect();
        let [sum, n] = bce_sums(&z, classes, &t, &masks);
        assert_eq!(n, train.len() as f64);
        let mean = |z: &[f32]| -> f64 {
            let mut total = 0.0;
            for &r in &train {
                for c in 0..classes {
                    let k = r * classes + c;
                    total += bce_reference(f64::from(z[k]), f64::from(t[k]));
                }
            }
            total / (train.len() * classes) as f64
        };
        assert!((sum / (n * classes as f64) - mean(&z)).abs() < 1e-12);
        let mut dz = vec![f32::NAN; rows * classes];
        bce_grad(&z, classes, &t, &masks, n, &mut dz);
        let eps = 1e-3f32;
        for k in 0..z.len() {
            // The step as the f32 logits take it.
            let (up, down) = (z[k] + eps, z[k] - eps);
            let at = |v: f32| {
                let mut w = z.clone();
                w[k] = v;
                mean(&w)
            };
            let numeric = (at(up) - at(down)) / (f64::from(up) - f64::from(down));
            let analytic = f64::from(dz[k]);
            assert!(
                (numeric - analytic).abs() < 1e-6,
                "logit {k}: numeric {numeric} analytic {analytic}"
            );
            if !train.contains(&(k / classes)) {
                assert_eq!(dz[k], 0.0, "logit {k} is not a labelled training row's");
            }
        }
        // Any thread count, the same bits.
        let mut again = vec![0.0f32; rows * classes];
        testing::pool(3, || bce_grad(&z, classes, &t, &masks, n, &mut again));
        assert_eq!(again, dz);
        assert_eq!(
            testing::pool(3, || bce_sums(&z, classes, &t, &masks)),
            [sum, n]
        );
    }

    /// The ROC-AUC by definition: over every (positive, negative) pair, 1 if the positive
    /// scores higher, 1/2 on a tie.
    fn pairwise_auc(pairs: &[(f32, bool)]) -> Option<f64> {
        let (mut wins, mut count) = (0.0, 0.0);
        for &(p, _) in pairs.iter().filter(|p| p.1) {
            for &(q, _) in pairs.iter().filter(|p| !p.1) {
                count += 1.0;
                wins += if p > q {
                    1.0
                } else if p == q {
                    0.5
                } else {
                    0.0
                };
            }
        }
        (count > 0.0).then(|| wins / count)
    }

    #[test]
    fn roc_auc_of_hand_computed_cases_with_ties() {
        let auc = |scores: &[f32], labels: &[u8]| {
            let mut pairs: Vec<(f32, bool)> = scores
                .iter()
                .zip(labels)
                .map(|(&s, &l)| (s, l == 1))
                .collect();
            roc_auc(&mut pairs)
        };
        // scikit-learn's roc_auc_score example.
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0, 0, 1, 1]), Some(0.75));
        // Positives {2, 3}, negatives {1, 2}: 1 + 1/2 + 1 + 1 of 4 pairs.
        assert_eq!(auc(&[1.0, 2.0, 2.0, 3.0], &[0, 0, 1, 1]), Some(0.875));
        // All tied: one half. Perfect and reversed orders.
        assert_eq!(auc(&[0.5; 4], &[0, 1, 0, 1]), Some(0.5));
        assert_eq!(auc(&[1.0, 2.0, 3.0], &[0, 1, 1]), Some(1.0));
        assert_eq!(auc(&[3.0, 2.0, 1.0], &[0, 1, 1]), Some(0.0));
        // A tie group of three (ranks 2, 3, 4 → 3 each) holding two positives and a negative:
        // positives {5, 5, 9}, negatives {1, 5}: (1 + 1/2) · 2 + 2 = 5 of 6.
        assert_eq!(
            auc(&[1.0, 5.0, 5.0, 5.0, 9.0], &[0, 1, 0, 1, 1]),
            Some(5.0 / 6.0)
        );
        // −0 and 0 are the same score.
        assert_eq!(auc(&[-0.0, 0.0], &[0, 1]), Some(0.5));
        // One kind of target only: undefined.
        assert_eq!(auc(&[1.0, 2.0], &[1, 1]), None);
        assert_eq!(auc(&[], &[]), None);
    }

    #[test]
    fn roc_auc_equals_the_pairwise_definition() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for case in 0..300 {
            let n = rng.random_range(0..40);
            // Few distinct scores, so that ties are common (zeros of both signs among them).
            let distinct = rng.random_range(1..6);
            let pairs: Vec<(f32, bool)> = (0..n)
                .map(|_| {
                    let s = [-0.0, 0.0, 0.5, -1.25, 3.0, 1e-30][rng.random_range(0..distinct)];
                    (s, rng.random::<bool>())
                })
                .collect();
            let expected = pairwise_auc(&pairs);
            let got = roc_auc(&mut pairs.clone());
            match (got, expected) {
                (Some(a), Some(b)) => assert!((a - b).abs() < 1e-12, "case {case}: {a} vs {b}"),
                (a, b) => assert_eq!(a, b, "case {case}"),
            }
        }
    }

    #[test]
    fn auc_per_mask_averages_the_classes_with_both_targets_as_ogb() {
        // Four labelled rows, two classes, plus an unlabelled row and one in no mask.
        // Class 0: train rows 0..3 targets [0, 1, 0, 1] over logits [0.1, 0.9, 0.2, 0.3]:
        // positives {0.9, 0.3}, negatives {0.1, 0.2}: AUC 1. Class 1: targets [1, 1, 1, 1] on
        // the training rows: skipped there.
        let z = [
            0.1f32, 5.0, 0.9, 1.0, 0.2, -1.0, 0.3, 2.0, 7.0, 7.0, 1.0, 1.0,
        ];
        let t = [
            0u8,
            1,
            1,
            1,
            0,
            1,
            1,
            1,
            TARGET_UNLABELLED,
            TARGET_UNLABELLED,
            1,
            0,
        ];
        let masks = [TRAIN | VAL, TRAIN | VAL, TRAIN, TRAIN | TEST, VAL, 0];
        let rows = auc_rows(&z, 2, &t, &masks);
        assert_eq!(
            rows.len(),
            4 * 5,
            "the unlabelled row and the one in no mask are left out"
        );
        let [train, val, test] = auc_per_mask(&rows, 2);
        assert_eq!(train, Some(1.0));
        // Validation rows 0 and 1: class 0 targets [0, 1] (AUC 1), class 1 all 1 (skipped).
        assert_eq!(val, Some(1.0));
        // Test: row 3 alone, one target value per class: nothing kept.
        assert_eq!(test, None);
        // The rows of several ranks in any order give the same bits.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let (z, t, masks) = bce_case(200, 5, 3);
        let rows = auc_rows(&z, 5, &t, &masks);
        let whole = auc_per_mask(&rows, 5);
        let mut shuffled: Vec<&[f32]> = rows.chunks(11).collect();
        shuffled.shuffle(&mut rng);
        assert_eq!(auc_per_mask(&shuffled.concat(), 5), whole);
        assert!(whole
            .iter()
            .all(|a| a.is_some_and(|a| (0.0..=1.0).contains(&a))));
        let m = Metrics::multi_label(&[9.0, 3.0], 2, [Some(0.5), None, Some(0.75)]);
        assert_eq!(m.auc, Some([0.5, 0.0, 0.75]));
        assert_eq!((m.loss, m.val(Metric::Auc)), (1.5, 0.0));
    }

    #[test]
    fn a_metric_the_targets_have_not_is_refused() {
        assert_eq!(Metric::resolve(None, false).unwrap(), Metric::Acc);
        assert_eq!(Metric::resolve(None, true).unwrap(), Metric::Auc);
        assert_eq!(
            Metric::resolve(Some(Metric::F1), false).unwrap(),
            Metric::F1
        );
        assert_eq!(
            Metric::resolve(Some(Metric::Auc), true).unwrap(),
            Metric::Auc
        );
        let e = Metric::resolve(Some(Metric::F1), true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--metric f1 is for one class per node") && e.contains("--metric auc"),
            "{e}"
        );
        let e = Metric::resolve(Some(Metric::Auc), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--metric auc is for multi-label targets") && e.contains("acc or f1"),
            "{e}"
        );
    }
}
