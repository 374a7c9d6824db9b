//! GCN training as a library: a GCN trained with the distributed SpMM (data-parallel over
//! chunks) or with the feature columns split across ranks (tensor-parallel).
//!
//! [`train`] takes a plain [`Config`] and the communicator of this rank; every rank calls it with
//! the same configuration. It reports progress through [`Event`]s and returns the run's
//! [`Summary`]; what to print is the caller's choice (the `distspmm train` command prints the
//! epoch lines and the summary on rank 0). Errors are [`TrainError`]s, which say whether every
//! rank holds the same error ([`TrainError::is_collective`]) or only this one.

pub mod checkpoint;
pub mod data;
pub mod dense;
pub mod dropout;
pub mod isolated;
pub mod model;
pub mod nn;
pub mod par;
pub mod predict;
pub mod sparse_input;
pub mod tensor;

use anyhow::{bail, Context, Result};
use dist_comm::{AllGather, AllReduce, Communicator, Counting, Group, ReduceOp};
pub use distspmm_op::Precision;
use model::{Aggregate, LocalData, Metrics, ModelConfig, Reduce, TRAIN};
use nn::Graph;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How the work is split across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each rank owns a chunk's rows (nodes); the aggregation is the distributed SpMM.
    Data,
    /// Each rank holds the whole graph and a slice of the feature columns.
    Tensor,
}

/// Which communication schedule the distributed SpMM uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Send each peer only the rows its non-zeros reference.
    Halo,
    /// The seed's schedule: every rank broadcasts all its rows.
    Broadcast,
}

/// What to do when a feature, weight or gradient is NaN or infinite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonFinite {
    /// Stop with an error naming where it appeared.
    Fail,
    /// Report it once and go on (NaN features are replaced by 0).
    Warn,
}

/// What to train on and how: the options of `distspmm train`, as plain data.
#[derive(Debug, Clone)]
pub struct Config {
    /// Chunk directory written by `distspmm partition` (data-parallel mode).
    pub chunks: Option<PathBuf>,
    /// Graph file for tensor-parallel mode (every rank loads the whole graph, with
    /// `read_graph`).
    pub input: Option<PathBuf>,
    /// What reads `input` in tensor-parallel mode: the graph readers are the preprocessing's
    /// (`distspmm-prep`), which this crate does not link; `distspmm train` passes its reader.
    pub read_graph: Option<ReadGraph>,
    /// `Data` splits nodes (needs `chunks`), `Tensor` splits feature columns (needs `input`).
    pub mode: Mode,
    /// Training epochs.
    pub epochs: u64,
    /// The layer the model stacks.
    pub model: model::ModelKind,
    /// Hidden width (per attention head for GAT).
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// GAT: attention heads of the inner layers (concatenated).
    pub heads: usize,
    /// GAT: attention heads of the last layer (averaged).
    pub out_heads: usize,
    /// GAT: dropout probability on the attention coefficients.
    pub attn_dropout: f32,
    /// Adds each inner layer's input to its output where the widths agree.
    pub residual: bool,
    /// GIN: train ε (else fixed at 0).
    pub train_eps: bool,
    /// Adam learning rate.
    pub lr: f32,
    /// L2 weight decay: on the first layer's weights for GCN (as the GCN paper), on every
    /// parameter for the other models.
    pub weight_decay: f32,
    /// Dropout probability on every layer's input.
    pub dropout: f32,
    /// Communication schedule of the distributed SpMM (data mode).
    pub schedule: Schedule,
    /// The format of the distributed SpMM's messages (data mode): rows and partial sums are
    /// narrowed to it where they are sent and widened back to f32 where they are received.
    /// Not part of a checkpoint's identity: like the schedule it changes how values travel,
    /// not the model or its objective, so a run may resume in another precision.
    pub comm_precision: Precision,
    /// Seed of the initial weights and the dropout masks.
    pub seed: u64,
    /// Row-normalise the features (divide each row by its sum) as the GCN paper; skipped, with
    /// an [`Event::NormalizationSkipped`], for features with negative values.
    pub normalize_features: bool,
    /// Directory for checkpoints (weights, optimiser state, epoch).
    pub checkpoint: Option<PathBuf>,
    /// Write a checkpoint every K epochs (and after the last); 0 writes only after the last.
    pub checkpoint_every: u64,
    /// Continue from the checkpoint in `checkpoint` (which it needs).
    pub resume: bool,
    /// NaN or infinite values in features, weights or gradients: fail or warn.
    pub on_nonfinite: NonFinite,
    /// After training, time the last epoch's SpMM and GEMM calls in isolation with this many
    /// repetitions each ([`isolated`]; data mode) and report them in [`Summary::isolated`].
    pub isolated_kernels: Option<usize>,
    /// After the last epoch, write the logits and the predicted labels into this directory as
    /// [`predict`] does (`logits.npy`, `labels.npy`, in the input graph's node order).
    pub save_predictions: Option<PathBuf>,
    /// Replace prediction files that exist already in `save_predictions`.
    pub force: bool,
    /// The validation metric early stopping and [`Summary::best_epoch`] follow; `None` is the
    /// data's own: accuracy for class labels, ROC-AUC for multi-label targets (see
    /// [`model::Metric::resolve`], which refuses a metric the data has not).
    pub metric: Option<model::Metric>,
    /// Early stopping: stop once the validation `metric` has not improved for this many epochs,
    /// and restore the best epoch's parameters before the final evaluation (so the summary, and
    /// `save_predictions`, are the best epoch's). `None` trains every epoch and reports the
    /// last. A checkpoint holds the last epoch's state and the best epoch
    /// ([`checkpoint::BestEpoch`]: its number, value and the epochs since, and with a patience
    /// its parameters, which `predict` uses by default); a resume continues from them, so it
    /// stops where an uninterrupted run would ([`Event::BestRestored`], or
    /// [`Event::BestStartsAfresh`] where the checkpoint cannot tell).
    pub patience: Option<u64>,
}

impl Default for Config {
    /// The defaults of `distspmm train` (with neither `chunks` nor `input` set).
    fn default() -> Self {
        Self {
            chunks: None,
            input: None,
            read_graph: None,
            mode: Mode::Data,
            epochs: 200,
            model: model::ModelKind::Gcn,
            hidden: 16,
            layers: 2,
            heads: 1,
            out_heads: 1,
            attn_dropout: 0.0,
            residual: false,
            train_eps: false,
            lr: 0.01,
            weight_decay: 5e-4,
            dropout: 0.5,
            schedule: Schedule::Halo,
            comm_precision: Precision::F32,
            seed: 42,
            normalize_features: true,
            checkpoint: None,
            checkpoint_every: 0,
            resume: false,
            on_nonfinite: NonFinite::Fail,
            isolated_kernels: None,
            save_predictions: None,
            force: false,
            metric: None,
            patience: None,
        }
    }
}

/// A graph file as tensor-parallel training reads it, from a [`ReadGraph`].
#[derive(Debug)]
pub struct GraphFile {
    /// Nodes N.
    pub nodes: usize,
    /// Â of the whole graph as one part's chunk (node data left out), with the graph's own
    /// weight of each entry.
    pub chunk: chunk_format::AlignedBuf,
    /// The node features, N × `in_dim`, row-major.
    pub features: Vec<f32>,
    /// Feature columns.
    pub in_dim: usize,
    /// Class labels, one per node (`y` as classes).
    pub labels: Option<Vec<i32>>,
    /// Multi-label 0/1 targets, N × `classes` (`y` as a matrix).
    pub targets: Option<Vec<u8>>,
    /// Classes (or target columns).
    pub classes: usize,
    /// The training, validation and test masks, one flag per node, where the file has them.
    pub train_mask: Option<Vec<bool>>,
    /// See `train_mask`.
    pub val_mask: Option<Vec<bool>>,
    /// See `train_mask`.
    pub test_mask: Option<Vec<bool>>,
    /// The graph's content fingerprint (hex), which checkpoints record.
    pub fingerprint: String,
    /// The normalisation of Â (`gcn`), which checkpoints record.
    pub normalization: String,
}

/// Reads a graph file for tensor-parallel training: Â and the node data
/// (`distspmm train` passes one built on distspmm-prep's readers).
pub type ReadGraph = fn(&Path) -> Result<GraphFile>;

/// What a [`Config`] trains on, once its combination of options is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// Data-parallel over this chunk directory.
    Chunks(&'a Path),
    /// Tensor-parallel over this graph file.
    Graph(&'a Path),
}

/// A combination of options that cannot be trained; found before any collective.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Data mode without a chunk directory.
    #[error("data-parallel training needs --chunks DIR (written by `distspmm partition`); for tensor-parallel training over a graph file use --mode tensor --input FILE")]
    DataNeedsChunks,
    /// Tensor mode without a graph file.
    #[error("--mode tensor needs --input FILE (every rank loads the whole graph)")]
    TensorNeedsInput,
    /// Data mode with a graph file.
    #[error("--input is for --mode tensor; data-parallel training reads --chunks")]
    InputInDataMode,
    /// Tensor mode with a chunk directory.
    #[error("--chunks is for data-parallel training; --mode tensor reads --input")]
    ChunksInTensorMode,
    /// `resume` without a checkpoint directory.
    #[error("--resume needs --checkpoint DIR (the directory to continue from)")]
    ResumeNeedsCheckpoint,
    /// `checkpoint_every` without a checkpoint directory to write to.
    #[error(
        "--checkpoint-every {0} needs --checkpoint DIR (the directory to write the checkpoints to)"
    )]
    CheckpointEveryNeedsCheckpoint(u64),
    /// Zero epochs asked for a fresh run.
    #[error("--epochs 0 trains nothing: give the number of epochs to train, at least 1")]
    ZeroEpochs,
    /// Early stopping with a patience of 0 epochs.
    #[error("--patience 0 would stop after the first epoch: give the number of epochs without improvement to wait, at least 1 (or leave --patience out to train every epoch)")]
    ZeroPatience,
    /// Isolated kernel timings with no repetitions.
    #[error("--kernel-reps 0 times nothing: give at least 1 repetition")]
    ZeroKernelReps,
    /// Isolated kernel timings in tensor mode, whose products do not run through the
    /// data-parallel model's routines.
    #[error("--isolated-kernels times the data-parallel model's kernels: train with --chunks (data mode)")]
    IsolatedKernelsInTensorMode,
    /// Isolated kernel timings with early stopping: the kernels are recorded in the epoch
    /// numbered `--epochs`, which an early stop never reaches.
    #[error("--isolated-kernels times the kernels of the last epoch (number --epochs), which --patience may stop before: use one of the two per run")]
    IsolatedKernelsWithPatience,
    /// A message precision in tensor mode, where no rows travel through the distributed SpMM.
    #[error("--comm-precision {0} sets the format of the distributed SpMM's messages, which tensor mode does not send (its sums are f32 allreduces): leave it out or train with --chunks (data mode)")]
    PrecisionInTensorMode(&'static str),
    /// Prediction outputs asked for without a directory to write them to.
    #[error("--logits, --probabilities, --labels and --embeddings are written into --out DIR: give the directory")]
    OutputsNeedOut,
    /// An output directory with no output asked for.
    #[error("--out DIR is given but nothing is asked to be written there: add --logits, --probabilities, --labels or --embeddings LAYER (without --out, predict reports the accuracies only)")]
    NothingToWrite,
}

impl Config {
    /// The model's configuration for data of `in_dim` features and `classes` classes (one per
    /// node, or `multi_label` targets).
    pub fn model_config(&self, in_dim: usize, classes: usize, multi_label: bool) -> ModelConfig {
        ModelConfig {
            model: self.model,
            in_dim,
            hidden: self.hidden,
            classes,
            layers: self.layers,
            dropout: self.dropout,
            lr: self.lr,
            weight_decay: self.weight_decay,
            seed: self.seed,
            heads: self.heads,
            out_heads: self.out_heads,
            attn_dropout: self.attn_dropout,
            residual: self.residual,
            train_eps: self.train_eps,
            multi_label,
        }
    }

    /// Checks the combination of options; returns what to train on.
    pub fn source(&self) -> Result<Source<'_>, ConfigError> {
        let source = match (self.mode, &self.chunks, &self.input) {
            (Mode::Data, None, _) => Err(ConfigError::DataNeedsChunks),
            (Mode::Tensor, _, None) => Err(ConfigError::TensorNeedsInput),
            (Mode::Data, Some(_), Some(_)) => Err(ConfigError::InputInDataMode),
            (Mode::Tensor, Some(_), _) => Err(ConfigError::ChunksInTensorMode),
            (Mode::Data, Some(dir), None) => Ok(Source::Chunks(dir)),
            (Mode::Tensor, None, Some(file)) => Ok(Source::Graph(file)),
        };
        self.resume_from()?;
        if self.checkpoint_every > 0 && self.checkpoint.is_none() {
            return Err(ConfigError::CheckpointEveryNeedsCheckpoint(
                self.checkpoint_every,
            ));
        }
        // With --resume, 0 is "no more than the checkpoint has": said with the checkpoint's
        // epoch count once it is read.
        if self.epochs == 0 && !self.resume {
            return Err(ConfigError::ZeroEpochs);
        }
        if self.patience == Some(0) {
            return Err(ConfigError::ZeroPatience);
        }
        match (self.isolated_kernels, self.mode) {
            (Some(0), _) => return Err(ConfigError::ZeroKernelReps),
            (Some(_), Mode::Tensor) => return Err(ConfigError::IsolatedKernelsInTensorMode),
            (Some(_), Mode::Data) if self.patience.is_some() => {
                return Err(ConfigError::IsolatedKernelsWithPatience)
            }
            _ => {}
        }
        if self.mode == Mode::Tensor && self.comm_precision != Precision::F32 {
            return Err(ConfigError::PrecisionInTensorMode(
                self.comm_precision.name(),
            ));
        }
        source
    }

    /// The checkpoint directory to resume from, if `resume` is set.
    fn resume_from(&self) -> Result<Option<&Path>, ConfigError> {
        match (self.resume, &self.checkpoint) {
            (false, _) => Ok(None),
            (true, Some(dir)) => Ok(Some(dir)),
            (true, None) => Err(ConfigError::ResumeNeedsCheckpoint),
        }
    }
}

/// One epoch's outcome, the same on every rank but for `split`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochReport {
    /// The epoch just finished, counted from 1 (including those before a resume).
    pub epoch: u64,
    /// Mean training loss of the epoch's training step (NLL, or binary cross-entropy for
    /// multi-label targets).
    pub loss: f64,
    /// Accuracies and macro-F1s (or ROC-AUCs, for multi-label targets) after the step.
    pub metrics: Metrics,
    /// Wall time of the epoch (training step + evaluation) on the slowest rank, seconds.
    pub seconds: f64,
    /// Payload bytes received in this epoch, summed over all ranks: `spmm_bytes +
    /// allreduce_bytes`.
    pub bytes: u64,
    /// ... of them, by the distributed SpMM's exchanges (point-to-point and broadcast, as
    /// counted at the transport; 0 in tensor mode and on one rank) ...
    pub spmm_bytes: u64,
    /// ... and by the training's allreduces (gradients, loss and accuracy counts,
    /// tensor-parallel partial products; 0 on one rank).
    pub allreduce_bytes: u64,
    /// The distributed SpMM's bytes by direction, as its operators counted them where they
    /// handed them to the transport, summed over all ranks: rows to their readers (forward
    /// programs) and partial sums back to their owners (backward programs); together
    /// `spmm_bytes`.
    pub spmm_direction_bytes: [u64; 2],
    /// This rank's own `[spmm, dense, comm, other]` seconds of the epoch (see [`Summary`]);
    /// unlike the other fields, it differs from rank to rank.
    pub split: [f64; 4],
}

/// What [`train`] reports as it goes; every rank gets the same events in the same order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The features have negative values, so row normalisation (meant for non-negative
    /// features such as bag-of-words) was skipped.
    NormalizationSkipped {
        /// The smallest feature value over all ranks.
        minimum: f32,
    },
    /// Training continues from a checkpoint.
    Resumed {
        /// The checkpoint file.
        path: PathBuf,
        /// Epochs it had finished.
        epoch: u64,
    },
    /// The resumed checkpoint's best epoch is continued from: the epoch and value to beat, and
    /// early stopping's count of epochs since it.
    BestRestored {
        /// The best epoch before the resume.
        epoch: u64,
        /// The metric followed.
        metric: model::Metric,
        /// Its value at `epoch`.
        value: f64,
        /// Epochs since `epoch` without improvement.
        since: u64,
    },
    /// The resumed checkpoint's best epoch cannot be continued from: the best epoch and early
    /// stopping's count start afresh from the resumed epoch.
    BestStartsAfresh {
        /// Why, in plain words ("the checkpoint was written by an earlier distspmm …").
        reason: String,
    },
    /// An epoch finished.
    Epoch(EpochReport),
    /// Early stopping ends the run: the validation metric has not improved for
    /// [`Config::patience`] epochs; the best epoch's parameters are restored.
    StoppedEarly {
        /// The last epoch trained.
        epoch: u64,
        /// The epoch of the best validation metric.
        best_epoch: u64,
        /// The metric followed.
        metric: model::Metric,
        /// Its best value.
        best: f64,
    },
}

/// Why [`train`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The options do not make a run (the same on every rank that has the same options; found
    /// before any collective).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An error every rank holds, from the same step: they may meet in one more collective
    /// (e.g. a barrier, so that each prints it before any exits).
    #[error("{0:#}")]
    OnAllRanks(anyhow::Error),
    /// An error only this rank knows of; the others may be waiting for it in a collective.
    #[error("{0:#}")]
    Local(anyhow::Error),
}

impl TrainError {
    /// Whether every rank holds this error (a configuration error counts: every rank checks
    /// the same options before any collective).
    pub fn is_collective(&self) -> bool {
        !matches!(self, Self::Local(_))
    }
}

/// The outcome of a run (what `distspmm train --json` prints on rank 0), the same on every rank but
/// for the per-epoch time breakdown, which is each rank's own.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Epochs trained in total (including those before a resume; fewer than asked when early
    /// stopping ended the run).
    pub epochs: u64,
    /// Training accuracy of the final model (fraction): the last epoch's, or with
    /// [`Config::patience`] the best epoch's (its parameters restored). This and the other
    /// accuracies and macro-F1s are for class labels (absent for multi-label targets, which
    /// have the ROC-AUCs instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_acc: Option<f64>,
    /// Validation accuracy of the final model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_acc: Option<f64>,
    /// Test accuracy of the final model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_acc: Option<f64>,
    /// Training macro-F1 of the final model (see [`model::macro_f1`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_f1: Option<f64>,
    /// Validation macro-F1 of the final model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_f1: Option<f64>,
    /// Test macro-F1 of the final model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_f1: Option<f64>,
    /// Multi-label targets: the training ROC-AUC of the final model (see
    /// [`model::auc_per_mask`]; absent for class labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_auc: Option<f64>,
    /// ... the validation ROC-AUC ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_auc: Option<f64>,
    /// ... and the test ROC-AUC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_auc: Option<f64>,
    /// The validation metric followed for `best_epoch` (`acc`, `f1` or `auc`).
    pub metric: model::Metric,
    /// The epoch (counted from 1) with the best validation `metric`, the first of equals: among
    /// all epochs, those before a resume included ([`Event::BestRestored`]), or, after an
    /// [`Event::BestStartsAfresh`], among the resumed ones.
    pub best_epoch: u64,
    /// That best value.
    pub best_val: f64,
    /// The patience of early stopping, if any.
    pub patience: Option<u64>,
    /// Whether early stopping ended the run before the epochs asked for.
    pub stopped_early: bool,
    /// Mean training loss (NLL, or binary cross-entropy for multi-label targets) of the last
    /// epoch's training step.
    pub final_loss: f64,
    /// Median wall time of an epoch (training step + evaluation), seconds.
    pub epoch_seconds_median: f64,
    /// Payload bytes received in the last epoch, summed over all ranks, as counted at the
    /// transport by `dist_comm::Counting` layers: `spmm_bytes_per_epoch +
    /// allreduce_bytes_per_epoch`.
    pub comm_bytes_per_epoch: u64,
    /// ... of them, by the distributed SpMM's exchanges (0 in tensor mode and on one rank) ...
    pub spmm_bytes_per_epoch: u64,
    /// ... of which the distributed SpMM's forward programs (rows to the ranks that read them)
    /// received ...
    pub spmm_forward_bytes_per_epoch: u64,
    /// ... and its backward programs (partial sums back to the rows' owners) ...
    pub spmm_backward_bytes_per_epoch: u64,
    /// ... and by the training's allreduces (0 on one rank). In data mode an epoch reduces the
    /// gradient (`parameters` f32), the training step's loss/accuracy counts (7 f64) and the
    /// evaluation's counts (7 f64 and `9 · classes` per-class counts), each received once by
    /// every rank: `ranks · (4 · parameters + (14 + 9 · classes) · 8)` bytes. For multi-label
    /// targets the counts are 2 f64 each, and the evaluation also gathers the masks' labelled
    /// rows for the ROC-AUC (see [`nn::net::Net::measure`]), counted here.
    pub allreduce_bytes_per_epoch: u64,
    /// The model's parameter count (weights and biases of every layer).
    pub parameters: u64,
    /// Ranks.
    pub ranks: usize,
    /// Per-epoch breakdown of this rank's wall time, each the median over the epochs: in the
    /// aggregations (`Â·X`, `Âᵀ·dY`, including the distributed SpMM's own exchanges)...
    pub spmm_seconds: f64,
    /// ... in the dense products and their fused epilogues (data-parallel model; in tensor
    /// mode they count as other) ...
    pub dense_seconds: f64,
    /// ... in the allreduces (gradients, metrics, tensor-parallel partial products) ...
    pub comm_seconds: f64,
    /// ... and in everything else (dropout, softmax/NLL, bias gradients, Adam).
    pub other_seconds: f64,
    /// `data` or `tensor`.
    pub mode: &'static str,
    /// `halo` or `broadcast` (data mode).
    pub schedule: &'static str,
    /// The format of the distributed SpMM's messages: `f32`, `bf16` or `f16` (data mode;
    /// `none` in tensor mode).
    pub comm_precision: &'static str,
    /// The model and its hyperparameters (`model`, widths, layers, heads, dropouts, optimiser).
    pub config: ModelConfig,
    /// With [`Config::isolated_kernels`]: the last epoch's SpMM and GEMM calls timed in
    /// isolation on this rank, beside `epoch_seconds_median`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolated: Option<isolated::IsolatedKernels>,
}

/// Sums over any communicator with an allreduce, through a [`Counting`] layer of its own, so
/// that the training's reductions are counted apart from the distributed SpMM's exchanges.
pub struct CommReduce<'a, C> {
    comm: Counting<'a, C>,
    seconds: f64,
}

impl<'a, C> CommReduce<'a, C> {
    /// Sums over `comm`.
    pub fn new(comm: &'a C) -> Self {
        Self {
            comm: Counting::new(comm),
            seconds: 0.0,
        }
    }
}

impl<C> std::fmt::Debug for CommReduce<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommReduce")
    }
}

impl<C: AllReduce + AllGather> Reduce for CommReduce<'_, C> {
    fn sum_f32(&mut self, buf: &mut [f32]) -> Result<()> {
        let t = Instant::now();
        let r = self.comm.all_reduce_sum(buf);
        self.seconds += t.elapsed().as_secs_f64();
        r.context("allreduce across ranks failed")
    }
    fn sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        let t = Instant::now();
        let r = self.comm.all_reduce_sum(buf);
        self.seconds += t.elapsed().as_secs_f64();
        r.context("allreduce across ranks failed")
    }
    /// Each rank's length first, then every rank's values padded to the longest: every rank
    /// receives `P × longest` values.
    fn gather_f32(&mut self, mine: &[f32]) -> Result<Vec<f32>> {
        let t = Instant::now();
        let r = (|| -> Result<Vec<f32>> {
            let lens = self.comm.all_gather_vec(&[mine.len() as u64])?;
            let longest = lens.iter().copied().max().unwrap_or(0);
            let longest = usize::try_from(longest).context("a gather longer than memory")?;
            let mut padded = mine.to_vec();
            padded.resize(longest, 0.0);
            let all = self.comm.all_gather_vec(&padded)?;
            let mut out = Vec::new();
            for (block, &len) in all.chunks(longest.max(1)).zip(&lens) {
                // Each length is at most `longest`, a usize.
                out.extend_from_slice(&block[..usize::try_from(len).unwrap_or(longest)]);
            }
            Ok(out)
        })();
        self.seconds += t.elapsed().as_secs_f64();
        r.context("gather across ranks failed")
    }
    /// Bytes this rank has received from other ranks in its reductions and gathers so far (0
    /// on one rank).
    fn bytes_received(&self) -> u64 {
        let counts = self.comm.counts();
        counts.all_reduce.received + counts.all_gather.received
    }
}

/// A [`Graph`] that clocks the calls it passes on (and logs the aggregations while `log` is
/// set).
struct TimedGraph<'a, G: ?Sized> {
    inner: &'a mut G,
    seconds: f64,
    log: Option<Vec<isolated::SpmmCall>>,
}

impl<G: ?Sized> TimedGraph<'_, G> {
    fn note(&mut self, backward: bool, width: usize, x: &[f32], y: &[f32]) {
        if let Some(log) = &mut self.log {
            log.push(isolated::SpmmCall {
                backward,
                width,
                x_len: x.len(),
                y_len: y.len(),
            });
        }
    }
}

impl<G: Aggregate + ?Sized> Aggregate for TimedGraph<'_, G> {
    fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()> {
        self.note(false, f, x, y);
        let t = Instant::now();
        let r = self.inner.forward(x, f, y);
        self.seconds += t.elapsed().as_secs_f64();
        r
    }
    fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()> {
        self.note(true, f, dy, dx);
        let t = Instant::now();
        let r = self.inner.backward(dy, f, dx);
        self.seconds += t.elapsed().as_secs_f64();
        r
    }
    fn bytes_received(&self) -> u64 {
        self.inner.bytes_received()
    }
    fn bytes_by_direction(&self) -> [u64; 2] {
        self.inner.bytes_by_direction()
    }
}

impl<G: Graph + ?Sized> TimedGraph<'_, G> {
    /// Runs `f` on the inner graph, adding its wall time to the aggregation clock.
    fn timed<T>(&mut self, f: impl FnOnce(&mut G) -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f(&mut *self.inner);
        self.seconds += t.elapsed().as_secs_f64();
        r
    }
}

impl<G: Graph + ?Sized> Graph for TimedGraph<'_, G> {
    fn rows(&self) -> usize {
        self.inner.rows()
    }
    fn edge_count(&self) -> usize {
        self.inner.edge_count()
    }
    fn edge_weights(&mut self, kind: nn::EdgeWeights) -> Result<&[f32]> {
        self.inner.edge_weights(kind)
    }
    fn edge_ends(&mut self) -> Result<&[(u64, u64)]> {
        self.inner.edge_ends()
    }
    fn spmm_edges_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        x: distspmm_sparse::sparse::DenseView<'_, f32>,
        y: distspmm_sparse::sparse::DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.timed(|g| g.spmm_edges_grouped(groups, e, x, y))
    }
    fn spmm_edges_transpose_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        dy: distspmm_sparse::sparse::DenseView<'_, f32>,
        dx: distspmm_sparse::sparse::DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.timed(|g| g.spmm_edges_transpose_grouped(groups, e, dy, dx))
    }
    fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: distspmm_sparse::sparse::DenseView<'_, f32>,
        v: distspmm_sparse::sparse::DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<()> {
        self.timed(|g| g.sddmm_grouped(groups, u, v, e))
    }
    fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &[f32],
        u: distspmm_sparse::sparse::DenseView<'_, f32>,
        v: distspmm_sparse::sparse::DenseView<'_, f32>,
        du: distspmm_sparse::sparse::DenseViewMut<'_, f32>,
        dv: distspmm_sparse::sparse::DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.timed(|g| g.sddmm_backward_grouped(groups, de, u, v, du, dv))
    }
    fn edge_softmax_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.timed(|g| g.edge_softmax_grouped(groups, slope, logits, out))
    }
    fn edge_softmax_backward_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d: &mut [f32],
    ) -> Result<()> {
        self.timed(|g| g.edge_softmax_backward_grouped(groups, slope, logits, out, d))
    }
    // A column split's sums are reductions, counted by `column_traffic`, not aggregation time.
    fn column_split(&self) -> Option<(usize, usize)> {
        self.inner.column_split()
    }
    fn columns(&self, width: usize) -> std::ops::Range<usize> {
        self.inner.columns(width)
    }
    fn sum_columns(&mut self, partial: &mut [f32]) -> Result<()> {
        self.inner.sum_columns(partial)
    }
    fn gather_columns(&mut self, width: usize, block: &[f32], dx: &mut [f32]) -> Result<()> {
        self.inner.gather_columns(width, block, dx)
    }
    fn column_traffic(&self) -> (u64, f64) {
        self.inner.column_traffic()
    }
}

/// Makes a local outcome collective (through [`dist_comm::agree::outcome`]): if any rank
/// failed, every rank returns the same [`Agreed`] error (the lowest failing rank's message),
/// so no rank waits forever in a later collective.
pub fn agree<C: AllReduce + AllGather, T>(comm: &C, local: Result<T>) -> Result<T> {
    let local = local.map_err(|e| one_line(&e));
    match dist_comm::agree::outcome(comm, local).context("cannot agree with the other ranks")? {
        Ok(value) => Ok(value),
        Err(failure) => Err(Agreed(failure.to_string()).into()),
    }
}

/// An error and its causes on one line, each cause after a colon, except a cause whose text
/// the line already holds (an error that embeds its source's text would otherwise print it
/// twice: "x: no such directory: no such directory"). What the command line prints and what
/// [`agree`] hands the other ranks.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// An error [`agree`] handed to every rank: all ranks hold it at the same point, so they may
/// still meet in one more collective before exiting (see [`TrainError::OnAllRanks`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Agreed(String);

/// Whether every rank holds `err` (or an error it wraps): it came out of [`agree`], or out of
/// one of the distributed SpMM's own agreement checks.
fn is_agreed(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.is::<Agreed>()
            || e.downcast_ref::<distspmm_op::DistSpmmError>()
                .is_some_and(distspmm_op::DistSpmmError::is_collective)
    })
}

/// Row normalisation as the GCN paper's preprocessing: divide each row by its sum (rows summing
/// to 0 stay 0). It is meant for non-negative features (bag-of-words, counts), where the row sum
/// is a scale; for signed features (e.g. Gaussian CSBM features) a row sum near 0 would blow
/// values up, so [`maybe_normalize_rows`] leaves those alone and says so.
///
/// Sums and quotients are worked out in f64: a row of large finite values (say 3·10³⁸ each)
/// overflows an f32 sum to infinity, which would silently zero the row. A row whose sum is
/// still not finite (a non-finite feature) is an error naming the node (`id_of(row)`).
pub fn normalize_rows(x: &mut [f32], width: usize, id_of: impl Fn(usize) -> u64) -> Result<()> {
    if width == 0 {
        return Ok(());
    }
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        let s: f64 = row.iter().map(|&v| f64::from(v)).sum();
        if !s.is_finite() {
            bail!(
                "the features of node {} sum to {s}, so the row cannot be normalised: clean the input, or pass --normalize-features false",
                id_of(r)
            );
        }
        if s != 0.0 {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "deliberate: normalised in f64, rounded to f32"
            )]
            let normalise = |v: &mut f32| *v = (f64::from(*v) / s) as f32;
            row.iter_mut().for_each(normalise);
        }
    }
    Ok(())
}

/// Applies [`normalize_rows`] if the features are non-negative on every rank (collective);
/// returns whether it did (if not, it says so through `on`).
pub fn maybe_normalize_rows<C: AllReduce + AllGather>(
    comm: &C,
    x: &mut [f32],
    width: usize,
    id_of: impl Fn(usize) -> u64,
    on: &mut dyn FnMut(Event),
) -> Result<bool> {
    let mut m = [x.iter().copied().fold(f32::INFINITY, f32::min)];
    comm.all_reduce(&mut m, ReduceOp::Min)
        .context("cannot agree on the feature minimum")?;
    if m[0] < 0.0 {
        on(Event::NormalizationSkipped { minimum: m[0] });
        return Ok(false);
    }
    agree(comm, normalize_rows(x, width, id_of))?;
    Ok(true)
}

/// Checks features for NaN/Inf per the policy; with `Warn` they are replaced by 0.
pub fn check_features(
    x: &mut [f32],
    width: usize,
    first_id: impl Fn(usize) -> u64,
    policy: NonFinite,
) -> Result<()> {
    let Some(at) = x.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    let (row, col) = (at / width.max(1), at % width.max(1));
    let what = format!("feature {col} of node {} is {}", first_id(row), x[at]);
    match policy {
        NonFinite::Fail => bail!("{what}; clean the input, or pass --on-nonfinite warn to replace non-finite features by 0"),
        NonFinite::Warn => {
            let count = x.iter().filter(|v| !v.is_finite()).count();
            tracing::warn!("{what} ({count} non-finite feature values in total); replacing them by 0");
            x.iter_mut().filter(|v| !v.is_finite()).for_each(|v| *v = 0.0);
            Ok(())
        }
    }
}

/// Everything the epoch loop needs, whatever the mode.
struct Job<'a> {
    args: &'a Config,
    /// The validation metric, resolved for the data ([`model::Metric::resolve`]).
    metric: model::Metric,
    /// What the run trains on and with (recorded in checkpoints, checked on resume).
    identity: checkpoint::Identity,
    mode: &'static str,
    rank: usize,
    ranks: usize,
}

impl Job<'_> {
    #[allow(
        clippy::too_many_arguments,
        reason = "the parts of a run's identity, each from where it is known"
    )]
    fn new<'a>(
        args: &'a Config,
        cfg: ModelConfig,
        metric: model::Metric,
        mode: &'static str,
        data: checkpoint::DataIdentity,
        partition: Option<checkpoint::PartitionIdentity>,
        data_source: &Path,
        comm: &impl Group,
    ) -> Job<'a> {
        Job {
            args,
            metric,
            identity: checkpoint::Identity {
                config: cfg,
                mode: mode.into(),
                normalize_features: args.normalize_features,
                data,
                data_source: data_source.display().to_string(),
                partition,
            },
            mode,
            rank: comm.rank(),
            ranks: comm.size(),
        }
    }
}

/// Checks on rank 0 that the checkpoint directory (if any) can be written, before any data is
/// loaded or epoch run (collective).
fn check_checkpoint_dir<C: AllReduce + AllGather + Group>(cfg: &Config, comm: &C) -> Result<()> {
    let Some(dir) = &cfg.checkpoint else {
        return Ok(());
    };
    let probed = if comm.rank() == 0 {
        checkpoint::check_writable(dir)
    } else {
        Ok(())
    };
    agree(comm, probed)
}

/// Trains on this rank over `comm`, reporting through `on`; every rank calls it with the same
/// `cfg` and gets the same [`Summary`] (collective).
pub fn train<C: Communicator>(
    cfg: &Config,
    comm: &C,
    on: &mut dyn FnMut(Event),
) -> Result<Summary, TrainError> {
    let source = cfg.source()?;
    let result = check_checkpoint_dir(cfg, comm)
        .and_then(|()| match &cfg.save_predictions {
            Some(dir) => predict::prepare_out(comm, dir, cfg.force, &predict::SAVED),
            None => Ok(()),
        })
        .and_then(|()| run(cfg, source, comm, on, Task::Train))
        .and_then(|outcome| match outcome {
            Outcome::Trained(summary) => Ok(summary),
            Outcome::Predicted(_) => bail!("internal: a training run predicted"),
        });
    result.map_err(classify)
}

/// A run's error as the [`TrainError`] that says whether every rank holds it.
fn classify(err: anyhow::Error) -> TrainError {
    if is_agreed(&err) {
        TrainError::OnAllRanks(err)
    } else {
        TrainError::Local(err)
    }
}

/// What a run does once its data, graph and model are set up (both modes end in [`finish`]).
#[derive(Clone, Copy)]
enum Task<'t> {
    /// Train, then write the predictions where `save_predictions` asks.
    Train,
    /// Predict with a checkpoint's state.
    Predict(&'t predict::Request, &'t checkpoint::State),
}

/// What a [`Task`] gives.
#[allow(
    clippy::large_enum_variant,
    reason = "one value per run, moved once: boxing would buy nothing"
)]
enum Outcome {
    Trained(Summary),
    Predicted(predict::Report),
}

/// Sets up the data, graph and model of `source` and runs `task` (collective).
fn run<C: Communicator>(
    cfg: &Config,
    source: Source<'_>,
    comm: &C,
    on: &mut dyn FnMut(Event),
    task: Task<'_>,
) -> Result<Outcome> {
    match source {
        Source::Chunks(dir) => data::run(cfg, dir, comm, on, task),
        Source::Graph(file) => run_tensor(cfg, file, comm, on, task),
    }
}

/// Which of a rank's rows it writes into output files (each row at its original id), and how
/// many rows the files have.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    /// The graph's nodes N.
    nodes: u64,
    /// The local rows this rank writes: all of its chunk's in data mode, a block of the
    /// (replicated) rows in tensor mode.
    rows: std::ops::Range<usize>,
}

/// Runs `task` over a set-up run: the epoch loop (and the saved predictions), or a prediction.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces of a set-up run, passed once"
)]
fn finish<C, G>(
    job: &Job<'_>,
    comm: &C,
    model: nn::net::Net,
    g: &mut G,
    data: &LocalData<'_>,
    placement: &Placement,
    on: &mut dyn FnMut(Event),
    task: Task<'_>,
) -> Result<Outcome>
where
    C: AllReduce + AllGather + dist_comm::Broadcast + Group,
    G: Graph,
{
    match task {
        Task::Train => {
            let (summary, mut model) = train_loop(job, comm, model, g, data, on)?;
            if let Some(dir) = &job.args.save_predictions {
                model.infer(g, data)?;
                let force = job.args.force;
                predict::write(comm, dir, force, &predict::SAVED, &model, data, placement)?;
            }
            Ok(Outcome::Trained(summary))
        }
        Task::Predict(request, state) => {
            predict::predict_with(job, comm, model, g, data, placement, request, state)
                .map(Outcome::Predicted)
        }
    }
}

/// Reads the checkpoint in `dir` on every rank (at most `limit` bytes) and checks that they all
/// read the same one: checkpoint directories may be host-local (collective).
fn load_checkpoint<C: AllReduce + AllGather>(
    comm: &C,
    dir: &Path,
    limit: u64,
    purpose: checkpoint::Purpose,
) -> Result<checkpoint::State> {
    let (state, checksum) = agree(comm, checkpoint::load(dir, limit, purpose))?;
    let path = checkpoint::path_in(dir);
    let read = dist_comm::agree::Resumed {
        epoch: state.epoch,
        checksum,
    };
    match dist_comm::agree::resume(comm, read) {
        Ok(()) => Ok(state),
        Err(e) if e.is_collective() => {
            Err(Agreed(format!("checkpoint {}: {e}", path.display())).into())
        }
        Err(e) => {
            Err(anyhow::Error::from(e)
                .context("cannot agree with the other ranks on the checkpoint"))
        }
    }
}

fn run_tensor<C: AllReduce + AllGather + dist_comm::Broadcast + Group>(
    args: &Config,
    input: &Path,
    comm: &C,
    on: &mut dyn FnMut(Event),
    task: Task<'_>,
) -> Result<Outcome> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let loaded = agree(comm, tensor_inputs(args, input));
    let WholeGraph {
        chunk,
        mut features,
        labels,
        targets,
        masks,
        ids,
        in_dim,
        classes,
        fingerprint,
        normalization,
    } = loaded?;
    let n = ids.len();
    let multi_label = targets.is_some();
    let metric = agree(comm, model::Metric::resolve(args.metric, multi_label))?;
    let cfg = args.model_config(in_dim, classes, multi_label);
    // Every rank holds the same options and graph: the same verdict everywhere.
    agree(comm, check_column_split(&cfg, ranks))?;
    if args.normalize_features {
        maybe_normalize_rows(comm, &mut features, in_dim, |r| r as u64, on)?;
    }
    let data = LocalData {
        features: &features,
        labels: &labels,
        targets: targets.as_deref(),
        masks: &masks,
        original_ids: &ids,
    };
    // Every rank holds every row: the training nodes are counted, not summed.
    let train_total = nn::net::local_train_count(&data, classes);
    let solo = dist_comm::LocalComm::group(1);
    let set_up = || -> Result<_> {
        let view = chunk_format::ChunkView::parse(chunk.as_bytes())
            .context("cannot read the whole graph's chunk back")?;
        let whole = data::whole_graph(&solo[0], view)?;
        let g = tensor::ColumnSplit::new(whole, CommReduce::new(comm), rank, ranks)?;
        let model = nn::net::Net::new(cfg.clone(), n, g.edge_count(), train_total)?;
        Ok((g, model))
    };
    let (mut g, model) = agree(comm, set_up())?;
    let identity = checkpoint::DataIdentity::Graph {
        fingerprint,
        normalization,
    };
    let job = Job::new(args, cfg, metric, "tensor", identity, None, input, comm);
    // Every rank holds every row: each writes an equal block of them.
    let placement = Placement {
        nodes: n as u64,
        rows: n * rank / ranks..n * (rank + 1) / ranks,
    };
    finish(&job, comm, model, &mut g, &data, &placement, on, task)
}

/// Whether a column split over `ranks` ranks gives every rank at least one column of every
/// layer's input.
fn check_column_split(cfg: &ModelConfig, ranks: usize) -> Result<()> {
    // The first layer reads the features, every later one the inner width.
    let narrowest = [(1, cfg.in_dim), (2, cfg.inner())]
        .into_iter()
        .take(cfg.layers)
        .find(|&(_, w)| w < ranks);
    if let Some((l, width)) = narrowest {
        bail!(
            "--mode tensor splits each layer's input columns across the {ranks} ranks, but \
             layer {} has {width} input columns; run on at most {width} ranks or widen the \
             model (--hidden{})",
            l,
            if cfg.model == model::ModelKind::Gat {
                ", --heads"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// What tensor-parallel training reads of a graph file: the whole graph as one part's chunk
/// (built in memory, without the features), and the node data.
struct WholeGraph {
    chunk: chunk_format::AlignedBuf,
    features: Vec<f32>,
    /// Empty with multi-label `targets`.
    labels: Vec<i32>,
    targets: Option<Vec<u8>>,
    masks: Vec<u8>,
    ids: Vec<u64>,
    in_dim: usize,
    classes: usize,
    fingerprint: String,
    normalization: String,
}

fn tensor_inputs(args: &Config, input: &Path) -> Result<WholeGraph> {
    let read = args.read_graph.context(
        "--mode tensor reads the graph file itself, but this caller gave no graph reader \
         (Config::read_graph): train through `distspmm train`, or pass one",
    )?;
    let GraphFile {
        nodes: n,
        chunk,
        features: mut raw_features,
        in_dim,
        labels,
        targets,
        classes,
        train_mask,
        val_mask,
        test_mask,
        fingerprint,
        normalization,
    } = read(input)?;
    let labels = match (labels, &targets) {
        (Some(labels), _) => labels,
        (None, Some(_)) => Vec::new(),
        (None, None) => bail!("{} has no labels (`y`)", input.display()),
    };
    let mut masks = vec![0u8; n];
    for (bit, m) in [
        (TRAIN, &train_mask),
        (model::VAL, &val_mask),
        (model::TEST, &test_mask),
    ] {
        if let Some(m) = m {
            masks
                .iter_mut()
                .zip(m)
                .filter(|(_, &b)| b)
                .for_each(|(v, _)| *v |= bit);
        }
    }
    if !masks.iter().any(|m| m & TRAIN != 0) {
        bail!(
            "{} has no training nodes (`train_mask` missing or all false)",
            input.display()
        );
    }
    check_features(&mut raw_features, in_dim, |r| r as u64, args.on_nonfinite)?;
    Ok(WholeGraph {
        chunk,
        features: raw_features,
        labels,
        targets,
        masks,
        ids: (0..n as u64).collect(),
        in_dim,
        classes,
        fingerprint,
        normalization,
    })
}

/// The best epoch so far by the validation metric, and early stopping's count of epochs
/// without improvement. The metrics come from counts summed across ranks (whole numbers, exact
/// in f64, summed alike on every rank), so every rank holds the same values and reaches the
/// same decisions: stopping needs no agreement of its own.
#[derive(Debug)]
struct Best {
    metric: model::Metric,
    patience: Option<u64>,
    /// The best epoch (counted from 1; 0 before the first).
    epoch: u64,
    value: f64,
    /// With a patience: the best epoch's parameters.
    params: Option<model::Params>,
    /// Epochs since the best.
    since: u64,
}

impl Best {
    fn new(metric: model::Metric, patience: Option<u64>) -> Self {
        Self {
            metric,
            patience,
            epoch: 0,
            value: f64::NEG_INFINITY,
            params: None,
            since: 0,
        }
    }

    /// Continues from a resumed checkpoint's best epoch `record`, whose last parameters are
    /// `last`; leaves `self` as it is and returns why, in plain words, when the checkpoint does
    /// not record one, followed another metric, or (for a patience) holds no copy of its
    /// weights.
    fn resume(
        &mut self,
        record: Option<&checkpoint::BestEpoch>,
        last: &model::Params,
    ) -> std::result::Result<(), String> {
        let Some(record) = record else {
            return Err(
                "the checkpoint was written by an earlier distspmm (checkpoint version \
                        4) and does not record its best epoch"
                    .into(),
            );
        };
        if record.metric != self.metric {
            return Err(format!(
                "the checkpoint's run followed the validation {} (epoch {} was its best), this \
                 one follows {} (--metric)",
                record.metric.name(),
                record.epoch,
                self.metric.name()
            ));
        }
        let params = match (self.patience, record.weights(last)) {
            (None, _) => None,
            (Some(_), Some(params)) => Some(params.clone()),
            (Some(_), None) => {
                return Err(format!(
                    "the checkpoint's run had no --patience, so it kept no copy of its best \
                     epoch's ({}) weights for this one to restore",
                    record.epoch
                ))
            }
        };
        *self = Self {
            epoch: record.epoch,
            value: record.value,
            since: record.since,
            params,
            ..*self
        };
        Ok(())
    }

    /// What a checkpoint records of the best epoch (once an epoch has been observed).
    fn record(&self) -> checkpoint::BestEpoch {
        checkpoint::BestEpoch {
            epoch: self.epoch,
            metric: self.metric,
            value: self.value,
            since: self.since,
            params: self.params.clone(),
        }
    }

    /// Records the metrics after `epoch` (counted from 1); `params` copies the model's
    /// parameters, called (with a patience) only when the epoch improves on the best, strictly.
    /// Returns whether the patience has run out.
    fn observe(
        &mut self,
        epoch: u64,
        metrics: &Metrics,
        params: impl FnOnce() -> model::Params,
    ) -> bool {
        let value = metrics.val(self.metric);
        if self.epoch == 0 || value > self.value {
            self.epoch = epoch;
            self.value = value;
            self.since = 0;
            if self.patience.is_some() {
                self.params = Some(params());
            }
        } else {
            self.since += 1;
        }
        self.patience.is_some_and(|p| self.since >= p)
    }
}

/// The epoch loop shared by both modes: train, evaluate, report, checkpoint, stop early;
/// returns the summary and the trained model (with a patience, the best epoch's parameters).
fn train_loop<C, G>(
    job: &Job<'_>,
    comm: &C,
    mut model: nn::net::Net,
    agg: &mut G,
    data: &LocalData<'_>,
    on: &mut dyn FnMut(Event),
) -> Result<(Summary, nn::net::Net)>
where
    C: AllReduce + AllGather + Group,
    G: Graph + ?Sized,
{
    let args = job.args;
    let mut red = CommReduce::new(comm);
    let mut timed = TimedGraph {
        inner: agg,
        seconds: 0.0,
        log: None,
    };
    let mut start_epoch = 0;
    let mut best = Best::new(job.metric, args.patience);
    if let Some(dir) = args.resume_from()? {
        let limit = checkpoint::size_bound(&job.identity.config);
        let state = load_checkpoint(comm, dir, limit, checkpoint::Purpose::Resume)?;
        let path = checkpoint::path_in(dir);
        let differences = state.identity.differences(&job.identity);
        // Every rank read the same checkpoint and holds the same identity: one verdict, which
        // every rank prints before they exit together.
        let verdict = if !differences.is_empty() {
            Err(anyhow::anyhow!(
                "checkpoint {} was written for another run: {}; resume with the checkpoint's options and data, or use another --checkpoint directory",
                path.display(),
                differences.join("; ")
            ))
        } else if state.epoch >= args.epochs {
            Err(anyhow::anyhow!(
                "checkpoint {} has already trained {} epochs and --epochs {} counts all epochs, those included: ask for more than {}",
                path.display(),
                state.epoch,
                args.epochs,
                state.epoch
            ))
        } else {
            Ok(())
        };
        agree(comm, verdict)?;
        start_epoch = state.epoch;
        // Every rank holds the same checkpoint: the same outcome everywhere.
        let continued = best.resume(state.best.as_ref(), &state.params);
        agree(comm, model.restore(&state.params, state.adam))?;
        on(Event::Resumed {
            path: checkpoint::path_in(dir),
            epoch: start_epoch,
        });
        on(match continued {
            Ok(()) => Event::BestRestored {
                epoch: best.epoch,
                metric: best.metric,
                value: best.value,
                since: best.since,
            },
            Err(reason) => Event::BestStartsAfresh { reason },
        });
    }
    let mut records: Vec<EpochReport> = Vec::new();
    // Steps whose summed gradient was not finite and whose update was skipped (warn policy).
    let mut skipped = 0u64;
    // The last epoch's kernel calls, logged for `isolated_kernels`.
    let mut products = Vec::new();
    let mut stopped_early = false;
    for epoch in start_epoch..args.epochs {
        let logging = args.isolated_kernels.is_some() && epoch + 1 == args.epochs;
        if logging {
            timed.log = Some(Vec::new());
            par::start_recording();
        }
        let t = Instant::now();
        // A column split's sums count with the reductions.
        let (split_bytes, split_seconds) = timed.column_traffic();
        let before = [timed.bytes_received(), red.bytes_received() + split_bytes];
        let directions_before = timed.bytes_by_direction();
        let clocks = (
            timed.seconds,
            model::dense_seconds(),
            red.seconds + split_seconds,
        );
        // Every rank reaches the same verdict on the summed gradient, so skipping stays in step.
        let (loss, step_skipped) = match model.train_step(&mut timed, &mut red, data, epoch) {
            Ok(loss) => (loss, false),
            Err(e) => match (
                e.downcast_ref::<model::NonFiniteGradient>(),
                args.on_nonfinite,
            ) {
                (Some(bad), NonFinite::Warn) => {
                    skipped += 1;
                    if skipped == 1 && job.rank == 0 {
                        tracing::warn!("{bad}; skipping this update (--on-nonfinite warn), and every further one that is not finite");
                    }
                    (bad.loss, true)
                }
                // The verdict is on the summed gradient, the same on every rank: an error they
                // all hold, so each prints it before any exits (an abort by the first would
                // kill the others before they could say it).
                (Some(bad), NonFinite::Fail) => {
                    return Err(Agreed(std::format!(
                        "{bad}; or pass --on-nonfinite warn to skip such updates"
                    ))
                    .into())
                }
                (None, _) => return Err(e),
            },
        };
        let metrics = model.evaluate(&mut timed, &mut red, data)?;
        let local = t.elapsed().as_secs_f64();
        if logging {
            products = par::stop_recording();
        }
        let spmm = timed.seconds - clocks.0;
        let dense = model::dense_seconds() - clocks.1;
        let (split_bytes, split_seconds) = timed.column_traffic();
        let reduce = red.seconds + split_seconds - clocks.2;
        let split = [
            spmm,
            dense,
            reduce,
            (local - spmm - dense - reduce).max(0.0),
        ];
        let directions = timed.bytes_by_direction();
        let mut bytes = [
            timed.bytes_received() - before[0],
            red.bytes_received() + split_bytes - before[1],
            directions[0] - directions_before[0],
            directions[1] - directions_before[1],
        ];
        comm.all_reduce_sum(&mut bytes)?;
        let mut seconds = [t.elapsed().as_secs_f64()];
        comm.all_reduce(&mut seconds, ReduceOp::Max)?;
        if !loss.is_finite() && !step_skipped {
            let msg = format!("the training loss became {loss} at epoch {}", epoch + 1);
            match args.on_nonfinite {
                NonFinite::Fail => bail!("{msg}: lower --lr or check the inputs"),
                NonFinite::Warn => tracing::warn!("{msg}"),
            }
        }
        let rec = EpochReport {
            epoch: epoch + 1,
            loss,
            metrics,
            seconds: seconds[0],
            bytes: bytes[0] + bytes[1],
            spmm_bytes: bytes[0],
            allreduce_bytes: bytes[1],
            spmm_direction_bytes: [bytes[2], bytes[3]],
            split,
        };
        on(Event::Epoch(rec));
        records.push(rec);
        let done = epoch + 1;
        // The same verdict on every rank (see `Best`).
        let stop = best.observe(done, &metrics, || model.params()) && done < args.epochs;
        let due = args.checkpoint_every > 0 && done % args.checkpoint_every == 0;
        if let Some(dir) = &args.checkpoint {
            // The last epoch's state, also when stopping early, and the best epoch's record.
            if due || done == args.epochs || stop {
                let (params, adam) = (model.params(), &model.adam);
                let state = checkpoint::State {
                    identity: job.identity.clone(),
                    epoch: done,
                    params,
                    adam: adam.clone(),
                    best: Some(best.record()),
                };
                // Every rank holds the same parameters; rank 0 writes them.
                let written = if job.rank == 0 {
                    checkpoint::save(dir, &state)
                } else {
                    Ok(())
                };
                agree(comm, written)?;
            }
        }
        if stop {
            stopped_early = true;
            on(Event::StoppedEarly {
                epoch: done,
                best_epoch: best.epoch,
                metric: best.metric,
                best: best.value,
            });
            break;
        }
    }
    if skipped > 0 && job.rank == 0 {
        tracing::warn!(
            "{skipped} of {} updates were skipped because their gradient was NaN or infinite",
            records.len()
        );
    }
    let last = *records
        .last()
        .context("internal: the epoch loop ran no epoch")?;
    let median = |f: &dyn Fn(&EpochReport) -> f64| {
        let mut v: Vec<f64> = records.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let epoch_seconds = median(&|r| r.seconds);
    let isolated = match (args.isolated_kernels, timed.log.take()) {
        (Some(reps), Some(calls)) => {
            // Every rank logged the same calls: the SpMM replays are collective, the GEMM
            // replays local; the buffers are agreed on before the first collective call.
            let (x, mut y) = agree(comm, isolated::spmm_buffers(&calls))?;
            let mut timings = isolated::time_spmm(&mut *timed.inner, &calls, reps, (&x, &mut y))?;
            drop((x, y));
            timings.extend(agree(comm, isolated::time_gemm(&products, reps))?);
            Some(isolated::IsolatedKernels::new(reps, timings, epoch_seconds))
        }
        _ => None,
    };
    let mut last_metrics = last.metrics;
    if let Some(params) = best.params.take() {
        // Every rank restores the same parameters and evaluates them with the others.
        model.load_params(&params)?;
        last_metrics = model.evaluate(&mut timed, &mut red, data)?;
    }
    let classes = |v: f64| last_metrics.auc.is_none().then_some(v);
    let auc = |mask: usize| last_metrics.auc.map(|a| a[mask]);
    let summary = Summary {
        epochs: last.epoch,
        train_acc: classes(last_metrics.train_acc),
        val_acc: classes(last_metrics.val_acc),
        test_acc: classes(last_metrics.test_acc),
        train_f1: classes(last_metrics.train_f1),
        val_f1: classes(last_metrics.val_f1),
        test_f1: classes(last_metrics.test_f1),
        train_auc: auc(0),
        val_auc: auc(1),
        test_auc: auc(2),
        metric: best.metric,
        best_epoch: best.epoch,
        best_val: best.value,
        patience: args.patience,
        stopped_early,
        final_loss: last.loss,
        epoch_seconds_median: epoch_seconds,
        spmm_seconds: median(&|r| r.split[0]),
        dense_seconds: median(&|r| r.split[1]),
        comm_seconds: median(&|r| r.split[2]),
        other_seconds: median(&|r| r.split[3]),
        comm_bytes_per_epoch: last.bytes,
        spmm_bytes_per_epoch: last.spmm_bytes,
        spmm_forward_bytes_per_epoch: last.spmm_direction_bytes[0],
        spmm_backward_bytes_per_epoch: last.spmm_direction_bytes[1],
        allreduce_bytes_per_epoch: last.allreduce_bytes,
        parameters: model.params().len() as u64,
        ranks: job.ranks,
        mode: job.mode,
        schedule: match (job.mode, args.schedule) {
            ("tensor", _) => "none",
            (_, Schedule::Halo) => "halo",
            (_, Schedule::Broadcast) => "broadcast",
        },
        comm_precision: match job.mode {
            "tensor" => "none",
            _ => args.comm_precision.name(),
        },
        config: job.identity.config.clone(),
        isolated,
    };
    Ok((summary, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_of_uneven_lengths_give_every_rank_all_values_in_rank_order() {
        let out = dist_comm::LocalComm::run(3, |comm| {
            let mine: Vec<f32> = (0..[2, 0, 5][comm.rank()])
                .map(|i| (10 * comm.rank() + i) as f32)
                .collect();
            let mut red = CommReduce::new(&comm);
            let all = red.gather_f32(&mine).unwrap();
            (all, red.bytes_received())
        });
        let expected = [0.0, 1.0, 20.0, 21.0, 22.0, 23.0, 24.0];
        for (all, bytes) in &out {
            assert_eq!(all, &expected);
            assert!(*bytes > 0, "the gathers are counted");
        }
        // The ROC-AUC of rows split across ranks is the one of all rows in one process.
        let rows: Vec<f32> = (0..40)
            .flat_map(|r| {
                let z = ((r * 7) % 11) as f32 / 3.0;
                [
                    z,
                    -z,
                    f32::from(u8::from(r % 3 == 0)),
                    f32::from(u8::from(r % 2 == 0)),
                    7.0,
                ]
            })
            .collect();
        let whole = model::auc_per_mask(&rows, 2);
        let out = dist_comm::LocalComm::run(2, |comm| {
            let half = if comm.rank() == 0 {
                &rows[..75]
            } else {
                &rows[75..]
            };
            let all = CommReduce::new(&comm).gather_f32(half).unwrap();
            model::auc_per_mask(&all, 2)
        });
        assert_eq!(out, [whole, whole]);
        assert!(whole[1].is_some());
    }

    #[test]
    fn rows_are_normalised_only_when_every_rank_is_non_negative() {
        let out = dist_comm::LocalComm::run(2, |comm| {
            let mut x = if comm.rank() == 0 {
                vec![1.0f32, 3.0, 0.0, 0.0]
            } else {
                vec![2.0f32, 2.0, 4.0, 0.0]
            };
            let done = maybe_normalize_rows(&comm, &mut x, 2, |r| r as u64, &mut |_| {}).unwrap();
            (done, x)
        });
        assert_eq!(out[0], (true, vec![0.25, 0.75, 0.0, 0.0]));
        assert_eq!(out[1], (true, vec![0.5, 0.5, 1.0, 0.0]));
        let out = dist_comm::LocalComm::run(2, |comm| {
            let mut x = if comm.rank() == 0 {
                vec![1.0f32, 3.0]
            } else {
                vec![-2.0f32, 2.5]
            };
            let mut events = Vec::new();
            let done =
                maybe_normalize_rows(&comm, &mut x, 2, |r| r as u64, &mut |e| events.push(e))
                    .unwrap();
            assert_eq!(events, [Event::NormalizationSkipped { minimum: -2.0 }]);
            (done, x)
        });
        assert_eq!(
            out[0],
            (false, vec![1.0, 3.0]),
            "a negative value on another rank leaves all rows alone"
        );
        assert_eq!(out[1], (false, vec![-2.0, 2.5]));
    }

    #[test]
    fn rows_near_the_f32_limit_are_summed_in_f64() {
        // An f32 sum of these rows is infinite (and would zero them); in f64 it is not.
        let big = 2f32.powi(127);
        let mut x = vec![big, big, 0.0, big, big / 2.0, big / 2.0];
        normalize_rows(&mut x, 3, |r| r as u64).unwrap();
        assert_eq!(x, vec![0.5, 0.5, 0.0, 0.5, 0.25, 0.25]);
        let mut bad = vec![1.0f32, f32::INFINITY, 2.0, 3.0];
        let err = normalize_rows(&mut bad, 2, |r| 10 + r as u64)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the features of node 10 sum to inf")
                && err.contains("--normalize-features false"),
            "{err}"
        );
    }

    #[test]
    fn checkpoint_options_need_a_directory_and_epochs_are_at_least_one() {
        let base = Config {
            chunks: Some("d".into()),
            ..Config::default()
        };
        let every = Config {
            checkpoint_every: 5,
            ..base.clone()
        };
        assert_eq!(
            every.source(),
            Err(ConfigError::CheckpointEveryNeedsCheckpoint(5))
        );
        let zero = Config {
            epochs: 0,
            ..base.clone()
        };
        assert_eq!(zero.source(), Err(ConfigError::ZeroEpochs));
        // With --resume, 0 is judged against the checkpoint's epochs once it is read.
        let resumed = Config {
            checkpoint: Some("c".into()),
            resume: true,
            ..zero
        };
        assert!(resumed.source().is_ok());
    }

    #[test]
    fn a_failure_on_one_rank_is_the_same_error_on_all() {
        let out = dist_comm::LocalComm::run(3, |comm| {
            let local: Result<u32> = if comm.rank() == 1 {
                Err(anyhow::anyhow!("chunk 1 is broken"))
            } else {
                Ok(7)
            };
            agree(&comm, local).map_err(|e| e.to_string())
        });
        for r in &out {
            assert_eq!(r.as_ref().unwrap_err(), "rank 1 of 3: chunk 1 is broken");
        }
        let ok = dist_comm::LocalComm::run(2, |comm| {
            agree(&comm, Ok::<_, anyhow::Error>(comm.rank())).unwrap()
        });
        assert_eq!(ok, vec![0, 1]);
    }

    #[test]
    fn invalid_combinations_of_options_are_typed_errors() {
        let with = |mode, chunks: Option<&str>, input: Option<&str>, resume| Config {
            mode,
            chunks: chunks.map(PathBuf::from),
            input: input.map(PathBuf::from),
            resume,
            ..Config::default()
        };
        let source = |c: &Config| c.source().map(|s| format!("{s:?}"));
        assert_eq!(
            source(&with(Mode::Data, None, None, false)),
            Err(ConfigError::DataNeedsChunks)
        );
        assert_eq!(
            source(&with(Mode::Data, Some("d"), Some("g"), false)),
            Err(ConfigError::InputInDataMode)
        );
        assert_eq!(
            source(&with(Mode::Tensor, None, None, false)),
            Err(ConfigError::TensorNeedsInput)
        );
        assert_eq!(
            source(&with(Mode::Tensor, Some("d"), Some("g"), false)),
            Err(ConfigError::ChunksInTensorMode)
        );
        assert_eq!(
            source(&with(Mode::Data, Some("d"), None, true)),
            Err(ConfigError::ResumeNeedsCheckpoint)
        );
        assert_eq!(
            with(Mode::Data, Some("d"), None, false).source(),
            Ok(Source::Chunks(Path::new("d")))
        );
        let resumed = Config {
            checkpoint: Some("c".into()),
            ..with(Mode::Tensor, None, Some("g"), true)
        };
        assert_eq!(resumed.source(), Ok(Source::Graph(Path::new("g"))));
        let precise = |mode, chunks, input, comm_precision| Config {
            comm_precision,
            ..with(mode, chunks, input, false)
        };
        assert_eq!(
            precise(Mode::Tensor, None, Some("g"), Precision::Bf16).source(),
            Err(ConfigError::PrecisionInTensorMode("bf16"))
        );
        assert!(precise(Mode::Tensor, None, Some("g"), Precision::F32)
            .source()
            .is_ok());
        assert!(precise(Mode::Data, Some("d"), None, Precision::F16)
            .source()
            .is_ok());
        let isolated = |mode, chunks, input, reps| Config {
            isolated_kernels: Some(reps),
            ..with(mode, chunks, input, false)
        };
        assert_eq!(
            isolated(Mode::Data, Some("d"), None, 0).source(),
            Err(ConfigError::ZeroKernelReps)
        );
        assert_eq!(
            isolated(Mode::Tensor, None, Some("g"), 3).source(),
            Err(ConfigError::IsolatedKernelsInTensorMode)
        );
        assert_eq!(
            isolated(Mode::Data, Some("d"), None, 3).source(),
            Ok(Source::Chunks(Path::new("d")))
        );
        assert_eq!(
            Config {
                patience: Some(5),
                ..isolated(Mode::Data, Some("d"), None, 3)
            }
            .source(),
            Err(ConfigError::IsolatedKernelsWithPatience)
        );
    }

    #[test]
    fn early_stopping_waits_patience_epochs_after_the_best() {
        let at = |val_acc| Metrics {
            val_acc,
            ..Metrics::default()
        };
        let mut best = Best::new(model::Metric::Acc, Some(2));
        let mut copies = 0;
        let mut stops = Vec::new();
        for (e, v) in [0.5, 0.6, 0.6, 0.55, 0.7].into_iter().enumerate() {
            stops.push(best.observe(e as u64 + 1, &at(v), || {
                copies += 1;
                model::Params::default()
            }));
        }
        // A tie is no improvement: epochs 3 and 4 use up the patience after epoch 2.
        assert_eq!(stops, [false, false, false, true, false]);
        assert_eq!((best.epoch, best.value, copies), (5, 0.7, 3));
        // Without a patience the best is reported but never copied, and nothing stops.
        let mut report = Best::new(model::Metric::F1, None);
        let f1 = |val_f1| Metrics {
            val_f1,
            ..Metrics::default()
        };
        for (e, v) in [0.2, 0.4, 0.1, 0.1, 0.1].into_iter().enumerate() {
            assert!(!report.observe(e as u64 + 1, &f1(v), || unreachable!()));
        }
        assert_eq!((report.epoch, report.value), (2, 0.4));
        assert!(report.params.is_none());
        assert_eq!(
            Config {
                chunks: Some("d".into()),
                patience: Some(0),
                ..Config::default()
            }
            .source(),
            Err(ConfigError::ZeroPatience)
        );
    }

    #[test]
    fn a_resumed_best_stops_where_an_uninterrupted_run_does() {
        let at = |val_acc| Metrics {
            val_acc,
            ..Metrics::default()
        };
        let weights = |e: u64| model::Params {
            tensors: vec![model::Tensor {
                name: "w".into(),
                shape: [1, 1],
                values: vec![e as f32],
            }],
        };
        let values = [0.5, 0.7, 0.6, 0.6, 0.65, 0.7, 0.6, 0.6];
        let run = |best: &mut Best, epochs: std::ops::Range<u64>| -> Vec<bool> {
            let from = usize::try_from(epochs.start).unwrap();
            epochs
                .zip(&values[from..])
                .map(|(e, &v)| best.observe(e + 1, &at(v), || weights(e + 1)))
                .collect()
        };
        let mut straight = Best::new(model::Metric::Acc, Some(4));
        let all = run(&mut straight, 0..8);
        assert_eq!(all, [false, false, false, false, false, true, true, true]);
        for split in 1..6 {
            let mut first = Best::new(model::Metric::Acc, Some(4));
            let mut stops = run(&mut first, 0..split);
            let record = first.record();
            let mut resumed = Best::new(model::Metric::Acc, Some(4));
            resumed.resume(Some(&record), &weights(split)).unwrap();
            stops.extend(run(&mut resumed, split..8));
            assert_eq!(stops, all, "split after epoch {split}");
            assert_eq!(
                (resumed.epoch, resumed.value, resumed.since, &resumed.params),
                (
                    straight.epoch,
                    straight.value,
                    straight.since,
                    &straight.params
                ),
                "split after epoch {split}"
            );
        }
        // Without a patience, no weights are kept; a later patience restores the last epoch's
        // when it was the best, and cannot otherwise.
        let mut plain = Best::new(model::Metric::Acc, None);
        run(&mut plain, 0..2);
        let record = plain.record();
        assert!(record.params.is_none() && record.since == 0);
        let mut later = Best::new(model::Metric::Acc, Some(3));
        later.resume(Some(&record), &weights(2)).unwrap();
        assert_eq!(later.params, Some(weights(2)));
        run(&mut plain, 2..3);
        let mut later = Best::new(model::Metric::Acc, Some(3));
        let why = later
            .resume(Some(&plain.record()), &weights(3))
            .unwrap_err();
        assert!(why.contains("no --patience") && later.epoch == 0, "{why}");
        // Another metric, or a checkpoint that records no best epoch, starts afresh.
        let mut f1 = Best::new(model::Metric::F1, None);
        let why = f1.resume(Some(&record), &weights(2)).unwrap_err();
        assert!(why.contains("followed the validation acc"), "{why}");
        let why = f1.resume(None, &weights(2)).unwrap_err();
        assert!(
            why.contains("checkpoint version 4") && f1.epoch == 0,
            "{why}"
        );
    }

    #[test]
    fn the_best_epochs_weights_restore_its_metrics_exactly() {
        use crate::model::{testing::Alone, VAL};
        use crate::nn::net::{
            tests::{test_config, Setup},
            Net,
        };
        let (mut g, mut s) = Setup::new(24, 4, 7);
        for (i, m) in s.masks.iter_mut().enumerate() {
            if i % 3 == 1 {
                *m = VAL;
            }
        }
        let data = s.data();
        let mut cfg = test_config(4, 8, 2);
        cfg.lr = 0.2;
        cfg.dropout = 0.5;
        let train_n = nn::net::local_train_count(&data, 3);
        let mut net = Net::new(cfg, 24, g.edge_count(), train_n).unwrap();
        let mut best = Best::new(model::Metric::F1, Some(1000));
        let mut seen = Vec::new();
        for e in 0..60 {
            net.train_step(&mut g, &mut Alone, &data, e).unwrap();
            let m = net.evaluate(&mut g, &mut Alone, &data).unwrap();
            assert!(!best.observe(e + 1, &m, || net.params()));
            seen.push(m);
        }
        let kept = best.params.take().unwrap();
        assert!(
            best.epoch < 60,
            "the last epoch was the best: no restore to test"
        );
        assert_ne!(kept, net.params());
        net.load_params(&kept).unwrap();
        assert_eq!(net.params(), kept);
        // Evaluation has no dropout: the restored weights give the best epoch's numbers.
        let again = net.evaluate(&mut g, &mut Alone, &data).unwrap();
        let at = usize::try_from(best.epoch).unwrap() - 1;
        assert_eq!(again, seen[at]);
        assert_eq!(again.val_f1, best.value);
        let max = seen.iter().map(|m| m.val_f1).fold(f64::MIN, f64::max);
        assert_eq!(best.value, max);
    }

    #[test]
    fn non_finite_features_fail_or_are_zeroed() {
        let mut x = vec![1.0, f32::NAN, 2.0, f32::INFINITY];
        let err = check_features(&mut x.clone(), 2, |r| 100 + r as u64, NonFinite::Fail)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("feature 1 of node 100 is NaN") && err.contains("--on-nonfinite warn"),
            "{err}"
        );
        check_features(&mut x, 2, |r| r as u64, NonFinite::Warn).unwrap();
        assert_eq!(x, vec![1.0, 0.0, 2.0, 0.0]);
    }
}
