//! The stack: layers of one kind (`ModelKind`), log-softmax + NLL (or, for multi-label
//! targets, binary cross-entropy with logits) over the training nodes of all ranks, one Adam, weight decay by the model's rule, optional residual connections, and
//! the parameters as named tensors for checkpoints.
//!
//! The loss is the mean over *all* training nodes of all ranks, so each rank's gradients are
//! summed across ranks (by the [`Reduce`] it is given), not averaged: data-parallel training
//! optimises the same objective as training in one process.

use super::act::Act;
use super::gat::{GatConv, GatOptions};
use super::gcn::GcnConv;
use super::gin::{Eps, GinConv};
use super::sage::SageConv;
use super::{param_len, Graph, Layer, Pass};
use crate::model::{
    auc_per_mask, auc_rows, bce_grad, bce_sums, count_confusion, count_metrics, labelled, len_of,
    nll_grad, zeros, Adam, LocalData, Metrics, ModelConfig, ModelKind, NonFiniteGradient, Params,
    Reduce, Tensor, TRAIN,
};
use anyhow::{ensure, Result};
use rand::SeedableRng;

/// A model bound to one rank's rows.
#[derive(Debug)]
pub struct Net {
    /// Hyperparameters.
    pub cfg: ModelConfig,
    layers: Vec<Box<dyn Layer>>,
    /// Optimiser state (the flat order of [`Net::params`]).
    pub adam: Adam,
    rows: usize,
    /// The flat gradient; layer `l`'s part starts at `offsets[l]`.
    grad: Vec<f32>,
    offsets: Vec<usize>,
    /// Gradient buffers of the widest layer boundary, `rows × widest` each.
    dy: Vec<f32>,
    dx: Vec<f32>,
    /// Per layer: its output plus its input, when it has a residual connection.
    residual: Vec<Option<Vec<f32>>>,
    train_total: f64,
}

/// The activation between layers of a model (the last layer's output is the logits).
fn act_between(kind: ModelKind) -> Act {
    match kind {
        ModelKind::Gat => Act::Elu,
        ModelKind::Gcn | ModelKind::Sage | ModelKind::Gin => Act::Relu,
    }
}

/// What to do when a model's buffers do not fit.
const MEMORY_HINT: &str =
    "lower --hidden or --layers, or (data-parallel) partition the graph into more parts";
/// ... and for GAT, whose widths and per-edge buffers grow with the heads.
const GAT_MEMORY_HINT: &str =
    "lower --hidden, --heads or --layers, or (data-parallel) partition the graph into more parts";

impl Net {
    /// A fresh model (initial weights from `cfg.seed`) for `rows` local rows; `train_total` is
    /// the number of training nodes summed over all ranks; `edges` the rank's stored non-zeros
    /// (for the memory estimate of per-edge buffers).
    pub fn new(cfg: ModelConfig, rows: usize, edges: usize, train_total: u64) -> Result<Self> {
        cfg.validate()?;
        ensure!(
            train_total > 0,
            "the training mask is empty on every rank: nothing to train on"
        );
        check_memory(&cfg, rows, edges)?;
        let dims = cfg.dims();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed);
        let mut layers: Vec<Box<dyn Layer>> = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let last = l + 1 == cfg.layers;
            let act = if last {
                Act::Identity
            } else {
                act_between(cfg.model)
            };
            let (fi, fo) = (dims[l], dims[l + 1]);
            let layer: Box<dyn Layer> = match cfg.model {
                ModelKind::Gcn => {
                    Box::new(GcnConv::new(fi, fo, l, cfg.dropout, act, rows, &mut rng)?)
                }
                ModelKind::Sage => Box::new(SageConv::new(
                    l,
                    [fi, fo],
                    rows,
                    cfg.dropout,
                    act,
                    &mut rng,
                )?),
                ModelKind::Gin => Box::new(GinConv::new(
                    l,
                    [fi, cfg.hidden, fo],
                    rows,
                    cfg.dropout,
                    act,
                    if cfg.train_eps {
                        Eps::Trainable(0.0)
                    } else {
                        Eps::Fixed(0.0)
                    },
                    &mut rng,
                )?),
                ModelKind::Gat => {
                    // Inner layers concatenate `heads` heads of `hidden`; the last averages
                    // `out_heads` heads of the class count.
                    let (heads, channels) = if last {
                        (cfg.out_heads, cfg.classes)
                    } else {
                        (cfg.heads, cfg.hidden)
                    };
                    let opts = GatOptions {
                        in_dim: fi,
                        heads,
                        channels,
                        concat: !last,
                        dropout: cfg.dropout,
                        attn_dropout: cfg.attn_dropout,
                        act,
                    };
                    Box::new(GatConv::new(opts, l, &mut rng)?)
                }
            };
            layers.push(layer);
        }
        let mut offsets = Vec::with_capacity(layers.len());
        let mut total = 0;
        for layer in &layers {
            offsets.push(total);
            total += param_len(&layer.specs());
        }
        let widest = dims.iter().copied().max().unwrap_or(0);
        let what = "the model's gradients";
        let residual = (0..cfg.layers)
            .map(|l| {
                let wanted = cfg.residual && l + 1 < cfg.layers && dims[l] == dims[l + 1];
                wanted
                    .then(|| zeros(len_of(rows, dims[l + 1], what)?, what))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            adam: Adam::new(total)?,
            grad: zeros(total, what)?,
            dy: zeros(len_of(rows, widest, what)?, what)?,
            dx: zeros(len_of(rows, widest, what)?, what)?,
            residual,
            offsets,
            layers,
            rows,
            train_total: train_total as f64,
            cfg,
        })
    }

    /// The parameters as named tensors (`convs.<l>.<name>`), copied.
    pub fn params(&self) -> Params {
        let mut tensors = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (spec, values) in layer.specs().into_iter().zip(layer.params()) {
                tensors.push(Tensor {
                    name: format!("convs.{l}.{}", spec.name),
                    shape: spec.shape,
                    values: values.to_vec(),
                });
            }
        }
        Params { tensors }
    }

    /// Replaces the parameters and the optimiser state (from a checkpoint of this model).
    ///
    /// # Errors
    /// When the tensors' names or shapes, or the moments' lengths, are not this model's.
    pub fn restore(&mut self, params: &Params, adam: Adam) -> Result<()> {
        let own = self.params();
        ensure!(
            params.same_layout(&own)
                && adam.m.len() == own.len()
                && adam.v.len() == own.len(),
            "the checkpoint's parameters do not have this model's tensors ({} tensors, {} values there; {} tensors, {} values here)",
            params.tensors.len(),
            params.len(),
            own.tensors.len(),
            own.len()
        );
        self.load_params(params)?;
        self.adam = adam;
        Ok(())
    }

    /// Replaces the parameters, leaving the optimiser state as it is (e.g. the best epoch's
    /// weights, kept by early stopping).
    ///
    /// # Errors
    /// When the tensors' names or shapes are not this model's.
    pub fn load_params(&mut self, params: &Params) -> Result<()> {
        ensure!(
            params.same_layout(&self.params()),
            "the parameters do not have this model's tensors ({} tensors, {} values there)",
            params.tensors.len(),
            params.len()
        );
        let mut from = params.tensors.iter();
        for layer in &mut self.layers {
            for p in layer.params_mut() {
                if let Some(t) = from.next() {
                    p.copy_from_slice(&t.values);
                }
            }
        }
        Ok(())
    }

    /// Forward pass over this rank's rows; the logits end up in the last layer's output.
    fn forward(
        &mut self,
        g: &mut dyn Graph,
        data: &LocalData<'_>,
        epoch: u64,
        training: bool,
    ) -> Result<()> {
        let pass = Pass {
            seed: self.cfg.seed,
            epoch,
            training,
            ids: data.original_ids,
        };
        for l in 0..self.layers.len() {
            let (done, rest) = self.layers.split_at_mut(l);
            let (sums, sum_rest) = self.residual.split_at_mut(l);
            let x = input_of(done, sums, data.features);
            let layer = &mut rest[0];
            layer.forward(g, x, &pass)?;
            if let Some(sum) = &mut sum_rest[0] {
                for ((s, &o), &x) in sum.iter_mut().zip(layer.output()).zip(x) {
                    *s = o + x;
                }
            }
        }
        Ok(())
    }

    /// A forward pass without dropout, for prediction: afterwards [`Net::logits`] and
    /// [`Net::layer_input`] hold its results (the pass [`Net::evaluate`] makes).
    pub fn infer(&mut self, g: &mut dyn Graph, data: &LocalData<'_>) -> Result<()> {
        self.forward(g, data, 0, false)
    }

    /// The input of layer `l` (counted from 0) in the last forward pass and its width: the
    /// features as the model read them for layer 0, the previous layer's output (plus its input
    /// where it has a residual connection) after, so `l = layers − 1` is the last hidden
    /// representation. `None` past the last layer.
    pub fn layer_input<'a>(&'a self, l: usize, features: &'a [f32]) -> Option<(&'a [f32], usize)> {
        let width = self.layers.get(l)?.dims().0;
        let x = input_of(&self.layers[..l], &self.residual[..l], features);
        Some((x, width))
    }

    /// The logits of the last forward pass (`rows × classes`).
    pub fn logits(&self) -> &[f32] {
        self.layers.last().map_or(&[], |l| l.output())
    }

    /// Evaluates without dropout: loss over training nodes, and the three accuracies and
    /// macro-F1s, from counts summed over ranks (in one reduction of `7 + 9 · classes` f64), or
    /// for multi-label targets the three ROC-AUCs (see [`Net::measure`]).
    pub fn evaluate(
        &mut self,
        g: &mut dyn Graph,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
    ) -> Result<Metrics> {
        self.forward(g, data, 0, false)?;
        self.measure(g.column_split().is_some(), red, data)
    }

    /// The metrics of the last forward pass's logits over every rank's rows (collective unless
    /// `replicated`: every rank then holds every row, so its own counts are the total). For
    /// multi-label targets the loss sums are reduced and the ROC-AUC needs every rank's scores:
    /// the labelled rows of the masks are gathered on every rank (`4 · (2 · classes + 1)`
    /// bytes per such row of the whole graph, padded to the rank with the most).
    pub fn measure(
        &self,
        replicated: bool,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
    ) -> Result<Metrics> {
        let classes = self.cfg.classes;
        if let Some(targets) = data.targets {
            let mut sums = bce_sums(self.logits(), classes, targets, data.masks);
            if !replicated {
                red.sum_f64(&mut sums)?;
            }
            let auc = self.auc(replicated, red, targets, data.masks)?;
            return Ok(Metrics::multi_label(&sums, classes, auc));
        }
        let mut counts = count_metrics(self.logits(), classes, data.labels, data.masks).to_vec();
        counts.extend(count_confusion(
            self.logits(),
            classes,
            data.labels,
            data.masks,
        ));
        if !replicated {
            red.sum_f64(&mut counts)?;
        }
        let (k, confusion) = counts.split_at(7);
        let k: &[f64; 7] = k.try_into()?;
        Ok(Metrics::from_counts(k, confusion))
    }

    /// The ROC-AUC of each mask (see [`auc_per_mask`]) of the last forward pass's logits
    /// against multi-label `targets` over every rank's rows (collective unless `replicated`):
    /// each rank's labelled rows of the masks are gathered on every rank, so every rank
    /// computes the value one process would.
    pub fn auc(
        &self,
        replicated: bool,
        red: &mut dyn Reduce,
        targets: &[u8],
        masks: &[u8],
    ) -> Result<[Option<f64>; 3]> {
        let classes = self.cfg.classes;
        let mine = auc_rows(self.logits(), classes, targets, masks);
        let rows = if replicated {
            mine
        } else {
            red.gather_f32(&mine)?
        };
        Ok(auc_per_mask(&rows, classes))
    }

    /// One training step (forward with dropout, backward, gradient sum across ranks, weight
    /// decay, Adam); returns the mean training loss of the step's forward pass.
    pub fn train_step(
        &mut self,
        g: &mut dyn Graph,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
        epoch: u64,
    ) -> Result<f64> {
        self.forward(g, data, epoch, true)?;
        let classes = self.cfg.classes;
        // `[loss sum, training rows]` at 0 and 2 (NLL, with the accuracy counts), or at 0 and 1
        // (binary cross-entropy, summed over the classes).
        let (mut counts, rows_at, per_row) = match data.targets {
            Some(t) => (
                bce_sums(self.logits(), classes, t, data.masks).to_vec(),
                1,
                classes,
            ),
            None => (
                count_metrics(self.logits(), classes, data.labels, data.masks).to_vec(),
                2,
                1,
            ),
        };
        self.backward(g, data, epoch)?;
        // Two small reductions keep the f64 sums exact. Under a column split each rank holds
        // a part of the split gradients and rank 0 alone the others (see `backward`), so the
        // sum is the gradient in both strategies.
        red.sum_f32(&mut self.grad)?;
        if g.column_split().is_none() {
            red.sum_f64(&mut counts)?;
        }
        let loss = counts[0] / (counts[rows_at] * per_row as f64).max(1.0);
        NonFiniteGradient::check(&self.grad, epoch, loss)?;
        self.add_weight_decay();
        let lr = self.cfg.lr;
        self.adam.step(
            self.layers.iter_mut().flat_map(|l| l.params_mut()),
            &self.grad,
            lr,
        );
        Ok(loss)
    }

    /// L2 weight decay added to the summed gradient: the first layer's weights for GCN (the
    /// GCN paper), every parameter otherwise (PyTorch's `Adam(weight_decay=…)`).
    fn add_weight_decay(&mut self) {
        let wd = self.cfg.weight_decay;
        if wd == 0.0 {
            return;
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let mut at = self.offsets[l];
            for (spec, values) in layer.specs().into_iter().zip(layer.params()) {
                let decays = match self.cfg.model {
                    ModelKind::Gcn => l == 0 && spec.decay,
                    _ => true,
                };
                if decays {
                    for (g, &w) in self.grad[at..at + values.len()].iter_mut().zip(values) {
                        *g += wd * w;
                    }
                }
                at += values.len();
            }
        }
    }

    /// The gradient of the global mean NLL with respect to every parameter, for this rank's
    /// rows, into `self.grad`. The first layer's input gradient is never formed.
    fn backward(&mut self, g: &mut dyn Graph, data: &LocalData<'_>, epoch: u64) -> Result<()> {
        let n = self.rows;
        let c = self.cfg.classes;
        let mut dy = std::mem::take(&mut self.dy);
        let mut dx = std::mem::take(&mut self.dx);
        match data.targets {
            Some(t) => bce_grad(
                self.logits(),
                c,
                t,
                data.masks,
                self.train_total,
                &mut dy[..n * c],
            ),
            None => nll_grad(
                self.logits(),
                c,
                data.labels,
                data.masks,
                self.train_total,
                &mut dy[..n * c],
            ),
        }
        let pass = Pass {
            seed: self.cfg.seed,
            epoch,
            training: true,
            ids: data.original_ids,
        };
        let split = g.column_split().is_some();
        let replicated_elsewhere = g.column_split().is_some_and(|(rank, _)| rank != 0);
        let mut result = Ok(());
        for l in (0..self.layers.len()).rev() {
            let (done, rest) = self.layers.split_at_mut(l);
            let x = input_of(done, &self.residual[..l], data.features);
            let layer = &mut rest[0];
            let (fi, fo) = layer.dims();
            let start = self.offsets[l];
            let grad = &mut self.grad[start..start + param_len(&layer.specs())];
            // With a residual connection the output's gradient also reaches the input as is.
            let skip = self.residual[l].as_ref().map(|_| dy[..n * fo].to_vec());
            let want_dx = (l > 0).then_some(&mut dx[..n * fi]);
            if split {
                // The layer writes the rows of its columns only.
                grad.fill(0.0);
            }
            if let Err(e) = layer.backward(g, x, &mut dy[..n * fo], grad, want_dx, &pass) {
                result = Err(e);
                break;
            }
            if replicated_elsewhere {
                // Every rank computed these gradients alike; rank 0's copy is the one summed.
                let mut at = 0;
                for spec in layer.specs() {
                    let len = spec.shape[0] * spec.shape[1];
                    if !spec.split {
                        grad[at..at + len].fill(0.0);
                    }
                    at += len;
                }
            }
            if let Some(skip) = skip {
                for (d, s) in dx.iter_mut().zip(skip) {
                    *d += s;
                }
            }
            std::mem::swap(&mut dy, &mut dx);
        }
        self.dy = dy;
        self.dx = dx;
        result
    }
}

/// The input of the layer after `done`: the features for the first layer, else the previous
/// layer's output (plus its input, held in `sums`, where it has a residual connection).
fn input_of<'a>(
    done: &'a [Box<dyn Layer>],
    sums: &'a [Option<Vec<f32>>],
    features: &'a [f32],
) -> &'a [f32] {
    match (done.last(), sums.last()) {
        (_, Some(Some(sum))) => sum,
        (Some(prev), _) => prev.output(),
        (None, _) => features,
    }
}

/// Checks that a model of `cfg` over `rows` rows (and `edges` per-edge values) fits in the
/// memory available, before any of it is allocated. Worked out without building
/// [`ModelConfig::dims`] (the layer count may be anything an option allows); saturating.
fn check_memory(cfg: &ModelConfig, rows: usize, edges: usize) -> Result<()> {
    let r = rows as u64;
    let layer = |fi: usize, fo: usize, first: bool| -> u64 {
        match cfg.model {
            ModelKind::Gcn => GcnConv::elements(fi, fo, rows, first),
            // Inputs, products and outputs of the layer's steps, and for GAT per-edge values
            // of every head (scores, coefficients, their gradients).
            _ => {
                let heads = if cfg.model == ModelKind::Gat {
                    cfg.heads.max(cfg.out_heads) as u64
                } else {
                    0
                };
                r.saturating_mul(
                    (fi as u64)
                        .saturating_mul(3)
                        .saturating_add((fo.max(cfg.hidden) as u64).saturating_mul(5)),
                )
                .saturating_add((edges as u64).saturating_mul(heads).saturating_mul(4))
            }
        }
    };
    let (i, h, c) = (cfg.in_dim, cfg.inner(), cfg.classes);
    let layers = match cfg.layers as u64 {
        0 => 0,
        1 => layer(i, c, true),
        l => layer(i, h, true)
            .saturating_add((l - 2).saturating_mul(layer(h, h, false)))
            .saturating_add(layer(h, c, false)),
    };
    let widest = i.max(h).max(c) as u64;
    let elements = cfg
        .parameters()
        .saturating_mul(4)
        .saturating_add(layers)
        .saturating_add(r.saturating_mul(widest).saturating_mul(2));
    distspmm_sparse::memory::check(
        format!(
            "a {} of {} layers and hidden width {} over {rows} nodes ({} features, {} classes)",
            cfg.model.name().to_uppercase(),
            cfg.layers,
            cfg.hidden,
            cfg.in_dim,
            cfg.classes
        ),
        distspmm_sparse::memory::bytes_of::<f32>(elements),
        if cfg.model == ModelKind::Gat {
            GAT_MEMORY_HINT
        } else {
            MEMORY_HINT
        },
    )?;
    Ok(())
}

/// Training-node count of this rank's rows (labelled rows in the training mask).
pub fn local_train_count(data: &LocalData<'_>, classes: usize) -> u64 {
    match data.targets {
        Some(t) => data
            .masks
            .iter()
            .zip(t.chunks_exact(classes.max(1)))
            .filter(|(&m, t)| m & TRAIN != 0 && labelled(t))
            .count() as u64,
        None => data
            .masks
            .iter()
            .zip(data.labels)
            .filter(|(&m, &y)| m & TRAIN != 0 && y >= 0)
            .count() as u64,
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test shapes: every narrowing is exact"
)]
pub(crate) mod tests {
    use super::*;
    use crate::model::testing::Alone;
    use crate::model::TEST;
    use crate::nn::testing::DenseGraph;
    use rand::Rng;

    /// A random graph and node data over it.
    pub(crate) struct Setup {
        pub(crate) x: Vec<f32>,
        pub(crate) labels: Vec<i32>,
        /// Multi-label targets (3 classes) in place of `labels`, when set.
        pub(crate) targets: Option<Vec<u8>>,
        pub(crate) masks: Vec<u8>,
        pub(crate) ids: Vec<u64>,
    }

    impl Setup {
        pub(crate) fn new(n: usize, in_dim: usize, seed: u64) -> (DenseGraph, Self) {
            let g = DenseGraph::random(n, 0.3, seed);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed + 1);
            let x = (0..n * in_dim)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let labels = (0..n as i32).map(|i| i % 3).collect();
            let masks = (0..n)
                .map(|i| if i % 2 == 0 { TRAIN } else { TEST })
                .collect();
            let ids = g.ids.clone();
            (
                g,
                Self {
                    x,
                    labels,
                    targets: None,
                    masks,
                    ids,
                },
            )
        }

        /// [`Setup::new`] with multi-label targets over 3 classes in place of the labels:
        /// random 0/1, row 2 unlabelled.
        pub(crate) fn multi_label(n: usize, in_dim: usize, seed: u64) -> (DenseGraph, Self) {
            let (g, mut s) = Self::new(n, in_dim, seed);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed + 2);
            let mut t: Vec<u8> = (0..n * 3).map(|_| u8::from(rng.random::<bool>())).collect();
            t[6..9].fill(chunk_format::TARGET_UNLABELLED);
            s.targets = Some(t);
            s.labels = Vec::new();
            (g, s)
        }
        pub(crate) fn data(&self) -> LocalData<'_> {
            LocalData {
                features: &self.x,
                labels: &self.labels,
                targets: self.targets.as_deref(),
                masks: &self.masks,
                original_ids: &self.ids,
            }
        }
        fn train_n(&self) -> u64 {
            local_train_count(&self.data(), 3)
        }
    }

    /// The tests' model: 3 classes, no dropout or weight decay, a fixed seed.
    pub(crate) fn test_config(in_dim: usize, hidden: usize, layers: usize) -> ModelConfig {
        ModelConfig {
            model: ModelKind::Gcn,
            in_dim,
            hidden,
            classes: 3,
            layers,
            dropout: 0.0,
            lr: 0.01,
            weight_decay: 0.0,
            seed: 9,
            heads: 1,
            out_heads: 1,
            attn_dropout: 0.0,
            residual: false,
            train_eps: false,
            multi_label: false,
        }
    }

    /// The flat parameters of `net`, and a setter.
    fn flat(net: &Net) -> Vec<f32> {
        net.params()
            .tensors
            .iter()
            .flat_map(|t| t.values.clone())
            .collect()
    }
    fn set_flat(net: &mut Net, values: &[f32]) {
        let mut at = 0;
        for layer in &mut net.layers {
            for p in layer.params_mut() {
                p.copy_from_slice(&values[at..at + p.len()]);
                at += p.len();
            }
        }
    }

    /// The whole model's gradient (loss = mean NLL over training nodes) against central
    /// finite differences of the evaluated loss.
    pub(crate) fn check_model_gradient(cfg: ModelConfig, g: &mut DenseGraph, s: &Setup) {
        let data = s.data();
        let mut net = Net::new(cfg.clone(), g.n, g.edge_count(), s.train_n()).unwrap();
        // Biases off zero and away from ReLU kinks.
        let mut base = flat(&net);
        let mut at = 0;
        for layer in &net.layers {
            for (spec, v) in layer.specs().iter().zip(layer.params()) {
                if spec.name.ends_with("bias") {
                    for (i, b) in base[at..at + v.len()].iter_mut().enumerate() {
                        *b = 0.05 * i as f32 + 0.01;
                    }
                }
                at += v.len();
            }
        }
        set_flat(&mut net, &base);
        net.forward(g, &data, 0, true).unwrap();
        net.backward(g, &data, 0).unwrap();
        let analytic = net.grad.clone();
        // Small enough not to cross the kink of a ReLU whose input is a few thousandths from 0.
        let eps = 1e-3f32;
        for i in 0..base.len() {
            let mut loss_at = |delta: f32| {
                let mut p = base.clone();
                p[i] += delta;
                set_flat(&mut net, &p);
                net.evaluate(g, &mut Alone, &data).unwrap().loss
            };
            let numeric = (loss_at(eps) - loss_at(-eps)) / (2.0 * f64::from(eps));
            let a = f64::from(analytic[i]);
            assert!(
                (numeric - a).abs() <= 2e-3 + 2e-2 * a.abs(),
                "{} layers {} in {} hidden {}: param {i}: numeric {numeric} analytic {a}",
                cfg.model,
                cfg.layers,
                cfg.in_dim,
                cfg.hidden
            );
        }
    }

    #[test]
    fn gcn_gradient_matches_finite_differences() {
        // Both layer orders: in < hidden (aggregate first) and in > hidden (transform first).
        for (layers, in_dim, hidden) in [(2, 3, 5), (2, 6, 2), (3, 4, 4), (1, 5, 1)] {
            let (mut g, s) = Setup::new(7, in_dim, 3);
            check_model_gradient(test_config(in_dim, hidden, layers), &mut g, &s);
        }
        // With residual connections on the inner layer of equal widths.
        let (mut g, s) = Setup::new(7, 4, 5);
        let cfg = ModelConfig {
            residual: true,
            ..test_config(4, 4, 3)
        };
        check_model_gradient(cfg, &mut g, &s);
    }

    #[test]
    fn multi_label_gradient_matches_finite_differences() {
        // Binary cross-entropy over the labelled training rows and every class.
        let (mut g, s) = Setup::multi_label(7, 4, 3);
        assert_eq!(s.train_n(), 3, "rows 0, 4 and 6: row 2 is unlabelled");
        for (model, layers) in [
            (ModelKind::Gcn, 2),
            (ModelKind::Gat, 2),
            (ModelKind::Sage, 1),
        ] {
            let cfg = ModelConfig {
                model,
                multi_label: true,
                ..test_config(4, 3, layers)
            };
            check_model_gradient(cfg, &mut g, &s);
        }
    }

    #[test]
    fn multi_label_loss_is_the_mean_bce_over_labelled_training_rows_and_classes() {
        let (mut g, s) = Setup::multi_label(7, 4, 5);
        let cfg = ModelConfig {
            multi_label: true,
            ..test_config(4, 3, 2)
        };
        let data = s.data();
        let mut net = Net::new(cfg, 7, g.edge_count(), s.train_n()).unwrap();
        let m = net.evaluate(&mut g, &mut Alone, &data).unwrap();
        let t = s.targets.as_ref().unwrap();
        let (mut sum, mut count) = (0.0f64, 0);
        for r in 0..7 {
            if s.masks[r] & TRAIN == 0 || r == 2 {
                continue;
            }
            for c in 0..3 {
                // -[y log σ(z) + (1 − y) log(1 − σ(z))], directly.
                let z = f64::from(net.logits()[r * 3 + c]);
                let p = 1.0 / (1.0 + (-z).exp());
                let y = f64::from(t[r * 3 + c]);
                sum -= y * p.ln() + (1.0 - y) * (1.0 - p).ln();
                count += 1;
            }
        }
        assert_eq!(count, 9);
        assert!(
            (m.loss - sum / 9.0).abs() < 1e-12,
            "{} vs {}",
            m.loss,
            sum / 9.0
        );
        // Without dropout the step's loss is the evaluation's.
        let step = net.train_step(&mut g, &mut Alone, &data, 0).unwrap();
        assert_eq!(step.to_bits(), m.loss.to_bits());
        let auc = m.auc.expect("multi-label metrics are ROC-AUCs");
        assert!(auc.iter().all(|a| (0.0..=1.0).contains(a)), "{auc:?}");
        assert_eq!((m.train_acc, m.val_f1), (0.0, 0.0));
        let after = net.evaluate(&mut g, &mut Alone, &data).unwrap();
        assert!(after.loss < m.loss, "{} then {}", m.loss, after.loss);
    }

    #[test]
    fn every_model_s_gradient_matches_finite_differences() {
        let (mut g, s) = Setup::new(7, 4, 3);
        for (model, layers) in [
            (ModelKind::Sage, 2),
            (ModelKind::Gin, 2),
            (ModelKind::Gat, 2),
            (ModelKind::Sage, 3),
        ] {
            let mut cfg = ModelConfig {
                model,
                ..test_config(4, 3, layers)
            };
            cfg.weight_decay = 0.0;
            if model == ModelKind::Gat {
                cfg.heads = 2;
                cfg.out_heads = 2;
            }
            check_model_gradient(cfg, &mut g, &s);
        }
        let cfg = ModelConfig {
            model: ModelKind::Gin,
            train_eps: true,
            residual: true,
            ..test_config(4, 3, 3)
        };
        check_model_gradient(cfg, &mut g, &s);
    }

    #[test]
    fn training_lowers_the_loss_and_is_deterministic() {
        let run = || {
            let (_, s) = Setup::new(7, 4, 3);
            // A non-symmetric weighted Â, so that forward and backward differ.
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
            let a: Vec<f32> = (0..49)
                .map(|_| {
                    if rng.random::<f32>() < 0.4 {
                        rng.random_range(0.1..1.0)
                    } else {
                        0.0
                    }
                })
                .collect();
            let mut g = DenseGraph::from_dense(7, &a);
            let mut cfg = test_config(4, 8, 2);
            cfg.dropout = 0.3;
            cfg.weight_decay = 5e-4;
            let data = s.data();
            let mut net = Net::new(cfg, 7, g.edge_count(), s.train_n()).unwrap();
            let first = net.evaluate(&mut g, &mut Alone, &data).unwrap().loss;
            let losses: Vec<f64> = (0..100)
                .map(|e| net.train_step(&mut g, &mut Alone, &data, e).unwrap())
                .collect();
            let last = net.evaluate(&mut g, &mut Alone, &data).unwrap().loss;
            (first, last, losses)
        };
        let (first, last, losses) = run();
        assert!(last < 0.5 * first, "loss {first} -> {last}");
        assert_eq!(losses, run().2, "same seed, same losses");
    }

    #[test]
    fn a_non_finite_gradient_is_a_typed_error_raised_before_the_update() {
        let (mut g, s) = Setup::new(7, 4, 3);
        let mut cfg = test_config(4, 8, 2);
        // Adam moves every weight by about lr in its first step: 1e30 overflows the next
        // forward pass (hidden ~1e30, logits ~1e60 → inf, log-softmax → NaN).
        cfg.lr = 1e30;
        let data = s.data();
        let mut net = Net::new(cfg, 7, g.edge_count(), s.train_n()).unwrap();
        net.train_step(&mut g, &mut Alone, &data, 0).unwrap();
        let before = net.params();
        let err = net.train_step(&mut g, &mut Alone, &data, 1).unwrap_err();
        let bad = err
            .downcast_ref::<NonFiniteGradient>()
            .unwrap_or_else(|| panic!("not a NonFiniteGradient: {err:#}"));
        assert_eq!(bad.epoch, 2, "reported 1-based, as the epoch lines");
        assert_eq!(net.params(), before, "the update was applied");
    }

    #[test]
    fn checkpointed_parameters_restore_only_into_the_same_model() {
        let (g, _) = Setup::new(7, 4, 3);
        let cfg = test_config(4, 8, 2);
        let net = Net::new(cfg.clone(), 7, g.edge_count(), 4).unwrap();
        let names: Vec<String> = net
            .params()
            .tensors
            .iter()
            .map(|t| t.name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "convs.0.lin.weight",
                "convs.0.bias",
                "convs.1.lin.weight",
                "convs.1.bias"
            ]
        );
        // The layer stack draws the GCN's initial weights in the order `Params::glorot` draws them.
        assert_eq!(net.params(), Params::glorot(&cfg).unwrap());
        let mut other = Net::new(test_config(4, 5, 2), 7, g.edge_count(), 4).unwrap();
        let adam = Adam::new(net.params().len()).unwrap();
        let err = other.restore(&net.params(), adam.clone()).unwrap_err();
        assert!(
            err.to_string().contains("do not have this model's tensors"),
            "{err}"
        );
        let mut same = Net::new(cfg, 7, g.edge_count(), 4).unwrap();
        same.restore(&net.params(), adam).unwrap();
        assert_eq!(same.params(), net.params());
    }

    #[test]
    fn bad_configurations_are_explained() {
        let cfg = test_config(4, 8, 2);
        let err = Net::new(
            ModelConfig {
                dropout: 1.0,
                ..cfg.clone()
            },
            3,
            9,
            1,
        )
        .unwrap_err();
        assert!(err.to_string().contains("--dropout"));
        let err = Net::new(cfg.clone(), 3, 9, 0).unwrap_err();
        assert!(err.to_string().contains("training mask is empty"));
        let err = Net::new(
            ModelConfig {
                heads: 4,
                ..cfg.clone()
            },
            3,
            9,
            1,
        )
        .unwrap_err();
        assert!(err.to_string().contains("--model gat"), "{err}");
        // Sizes no machine holds are refused before anything is allocated.
        for huge in [
            ModelConfig {
                layers: 4_294_967_295,
                ..cfg.clone()
            },
            ModelConfig {
                hidden: usize::MAX,
                ..cfg.clone()
            },
        ] {
            let err = format!("{:#}", Net::new(huge, 3, 9, 1).unwrap_err());
            assert!(err.contains("lower --hidden"), "{err}");
        }
    }
}
