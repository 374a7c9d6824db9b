//! `distspmm train`: parses the options into a [`distspmm_gcn::Config`], trains with the
//! library over MPI, and prints the epoch lines and the summary on rank 0.
//!
//! Launch with `mpirun -n P distspmm train --chunks DIR` (P = the directory's parts) or
//! `mpirun -n P distspmm train --input G.npz --mode tensor`. Without mpirun it runs as one rank.

use anyhow::{Context, Result};
use dist_comm::Group;
use distspmm_gcn::{Config, Event};
use std::path::{Path, PathBuf};

/// How the work is split across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Each rank owns a chunk's rows (nodes); the aggregation is the distributed SpMM.
    Data,
    /// Each rank holds the whole graph and a slice of the feature columns.
    Tensor,
}

/// The layer a model stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Model {
    /// Graph convolution over the normalised adjacency.
    Gcn,
    /// GraphSAGE with the mean aggregator.
    Sage,
    /// Graph isomorphism network.
    Gin,
    /// Graph attention network.
    Gat,
}

/// The validation metric of early stopping and the best-epoch report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Metric {
    /// Accuracy (one class per node).
    Acc,
    /// Macro-F1 over the classes present among the labels or predictions (one class per node).
    F1,
    /// ROC-AUC averaged over the classes, as OGB's ogbn-proteins evaluator (multi-label targets).
    Auc,
}

/// Which communication schedule the distributed SpMM uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Schedule {
    /// Send each peer only the rows its non-zeros reference.
    Halo,
    /// The seed's schedule: every rank broadcasts all its rows.
    Broadcast,
}

/// What to do when a feature, weight or gradient is NaN or infinite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NonFinite {
    /// Stop with an error naming where it appeared.
    Fail,
    /// Report it once and go on (NaN features are replaced by 0).
    Warn,
}

impl From<Mode> for distspmm_gcn::Mode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Data => distspmm_gcn::Mode::Data,
            Mode::Tensor => distspmm_gcn::Mode::Tensor,
        }
    }
}

impl From<Schedule> for distspmm_gcn::Schedule {
    fn from(schedule: Schedule) -> Self {
        match schedule {
            Schedule::Halo => distspmm_gcn::Schedule::Halo,
            Schedule::Broadcast => distspmm_gcn::Schedule::Broadcast,
        }
    }
}

impl From<NonFinite> for distspmm_gcn::NonFinite {
    fn from(policy: NonFinite) -> Self {
        match policy {
            NonFinite::Fail => distspmm_gcn::NonFinite::Fail,
            NonFinite::Warn => distspmm_gcn::NonFinite::Warn,
        }
    }
}

/// Arguments of `distspmm train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chunk directory written by `distspmm partition` (data-parallel mode).
    #[arg(long, value_name = "DIR")]
    pub chunks: Option<PathBuf>,
    /// Graph file for tensor-parallel mode (every rank loads the whole graph).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// `data` splits nodes (needs --chunks), `tensor` splits feature columns (needs --input).
    #[arg(long, value_enum, default_value = "data")]
    pub mode: Mode,
    /// Training epochs.
    #[arg(long, default_value_t = 200)]
    pub epochs: u64,
    /// The layer the model stacks: `gcn` (Kipf & Welling), `sage` (GraphSAGE, mean aggregator
    /// with a root weight), `gin` (sum aggregation, a two-layer MLP per layer) or `gat`
    /// (multi-head attention over in-edges and a self loop).
    #[arg(long, value_enum, default_value = "gcn")]
    pub model: Model,
    /// Hidden width (per head for gat) [default: 16 for gcn, 64 for sage and gin, 8 for gat].
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Layers.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Adam learning rate [default: 0.01, 0.005 for gat].
    #[arg(long, value_parser = parse_f32)]
    pub lr: Option<f32>,
    /// L2 weight decay: on the first layer's weights for gcn (as the GCN paper), on every
    /// parameter for sage, gin and gat (as PyTorch's Adam).
    #[arg(long, default_value_t = 5e-4, value_parser = parse_f32)]
    pub weight_decay: f32,
    /// Dropout probability on every layer's input, in [0, 1) [default: 0.5, 0.6 for gat].
    #[arg(long, value_parser = parse_dropout)]
    pub dropout: Option<f32>,
    /// gat: attention heads of the inner layers, concatenated [default: 8].
    #[arg(long)]
    pub heads: Option<usize>,
    /// gat: attention heads of the last layer, averaged.
    #[arg(long, default_value_t = 1)]
    pub out_heads: usize,
    /// gat: dropout probability on the attention coefficients [default: 0.6].
    #[arg(long, value_parser = parse_dropout)]
    pub attn_dropout: Option<f32>,
    /// Add each inner layer's input to its output where the widths agree (skip connections).
    #[arg(long)]
    pub residual: bool,
    /// gin: train ε of `(1 + ε)·h_i + Σ h_j` (else ε = 0).
    #[arg(long)]
    pub train_eps: bool,
    /// Communication schedule of the distributed SpMM (data mode).
    #[arg(long, value_enum, default_value = "halo")]
    pub schedule: Schedule,
    /// The format of the distributed SpMM's messages (data mode): f32, bf16 or f16 (rows and
    /// partial sums narrowed where they are sent, widened to f32 where they are received;
    /// the products stay f32).
    #[arg(long, default_value = "f32", value_parser = super::ranks::parse_precision)]
    pub comm_precision: distspmm_gcn::Precision,
    /// Seed of the initial weights and the dropout masks.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Row-normalise the features (divide each row by its sum) as the GCN paper; skipped, with a
    /// note, for features with negative values, where a row sum is not a scale.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub normalize_features: bool,
    /// Directory for checkpoints (weights, optimiser state, epoch).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Write a checkpoint every K epochs (and after the last); 0 writes only after the last.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub checkpoint_every: u64,
    /// Continue from the checkpoint in --checkpoint.
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,
    /// NaN or infinite values in features, weights or gradients: fail or warn.
    #[arg(long, value_enum, default_value = "fail")]
    pub on_nonfinite: NonFinite,
    /// After training, time each SpMM and GEMM call of the last epoch in isolation (the same
    /// operator, shapes, routines and threads; median of --kernel-reps after one untimed call)
    /// and report their sum beside the median epoch (data mode; JSON field `isolated`).
    #[arg(long)]
    pub isolated_kernels: bool,
    /// Timed repetitions of each call for --isolated-kernels.
    #[arg(
        long,
        default_value_t = 7,
        value_name = "N",
        requires = "isolated_kernels"
    )]
    pub kernel_reps: usize,
    /// After the last epoch, write `logits.npy` and `labels.npy` (the predicted classes) into
    /// DIR in the input graph's node order, as `distspmm predict --logits --labels` does; with
    /// several hosts DIR must be on a filesystem every rank sees.
    #[arg(long, value_name = "DIR")]
    pub save_predictions: Option<PathBuf>,
    /// Replace prediction files that exist already in --save-predictions (other files there
    /// are never touched).
    #[arg(long, requires = "save_predictions")]
    pub force: bool,
    /// The validation metric that --patience and the reported best epoch follow: accuracy or
    /// macro-F1 for one class per node, ROC-AUC for multi-label targets (`y` of shape [N, C])
    /// [default: acc, or auc for multi-label targets].
    #[arg(long, value_enum)]
    pub metric: Option<Metric>,
    /// Stop once the validation --metric has not improved for N epochs, and restore the best
    /// epoch's weights before the final evaluation (and --save-predictions). A checkpoint
    /// keeps the last epoch's state and the best epoch's (its weights too, which `predict`
    /// uses by default); --resume continues the count.
    #[arg(long, value_name = "N")]
    pub patience: Option<u64>,
    /// Print only a final JSON line on stdout (epoch lines go to stderr).
    #[arg(long)]
    pub json: bool,
}

/// A number option the model holds as `f32`: refused when single precision cannot hold the
/// value as given (it overflows to infinity, or a non-zero rounds to 0), so a message never
/// shows a value other than the one the user wrote.
fn parse_f32(text: &str) -> Result<f32, String> {
    let single: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    let wide: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if wide.is_finite() && single.is_infinite() {
        return Err(format!(
            "{text} is beyond single precision (f32, at most {:e}), which training computes in",
            f32::MAX
        ));
    }
    if wide != 0.0 && single == 0.0 {
        return Err(format!(
            "{text} rounds to 0 in single precision (f32, smallest positive {:e}), which training \
             computes in",
            f32::from_bits(1)
        ));
    }
    Ok(single)
}

/// `--dropout`: a probability in [0, 1) as given, and still below 1 in single precision.
fn parse_dropout(text: &str) -> Result<f32, String> {
    let single = parse_f32(text)?;
    let wide: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(0.0..1.0).contains(&wide) {
        return Err(format!(
            "the dropout probability must be in [0, 1), got {text}"
        ));
    }
    if single >= 1.0 {
        return Err(format!(
            "{text} rounds to 1 in single precision (f32), which training computes in, and a \
             dropout of 1 drops everything: the largest dropout below 1 is {}",
            1.0f32.next_down()
        ));
    }
    Ok(single)
}

impl Args {
    /// The library's configuration (everything but the output format).
    fn config(&self) -> Config {
        let model = match self.model {
            Model::Gcn => distspmm_gcn::model::ModelKind::Gcn,
            Model::Sage => distspmm_gcn::model::ModelKind::Sage,
            Model::Gin => distspmm_gcn::model::ModelKind::Gin,
            Model::Gat => distspmm_gcn::model::ModelKind::Gat,
        };
        let gat = self.model == Model::Gat;
        Config {
            chunks: self.chunks.clone(),
            input: self.input.clone(),
            read_graph: Some(read_whole_graph),
            mode: self.mode.into(),
            epochs: self.epochs,
            model,
            hidden: self.hidden.unwrap_or(match self.model {
                Model::Gcn => 16,
                Model::Sage | Model::Gin => 64,
                Model::Gat => 8,
            }),
            layers: self.layers,
            heads: self.heads.unwrap_or(if gat { 8 } else { 1 }),
            out_heads: self.out_heads,
            attn_dropout: self.attn_dropout.unwrap_or(if gat { 0.6 } else { 0.0 }),
            residual: self.residual,
            train_eps: self.train_eps,
            lr: self.lr.unwrap_or(if gat { 0.005 } else { 0.01 }),
            weight_decay: self.weight_decay,
            dropout: self.dropout.unwrap_or(if gat { 0.6 } else { 0.5 }),
            schedule: self.schedule.into(),
            comm_precision: self.comm_precision,
            seed: self.seed,
            normalize_features: self.normalize_features,
            checkpoint: self.checkpoint.clone(),
            checkpoint_every: self.checkpoint_every,
            resume: self.resume,
            on_nonfinite: self.on_nonfinite.into(),
            isolated_kernels: self.isolated_kernels.then_some(self.kernel_reps),
            save_predictions: self.save_predictions.clone(),
            force: self.force,
            metric: self.metric.map(|m| match m {
                Metric::Acc => distspmm_gcn::model::Metric::Acc,
                Metric::F1 => distspmm_gcn::model::Metric::F1,
                Metric::Auc => distspmm_gcn::model::Metric::Auc,
            }),
            patience: self.patience,
        }
    }
}

/// Prints an event on rank 0 (every rank gets the same events).
pub(crate) fn print_event(event: Event, json: bool) {
    match event {
        Event::NormalizationSkipped { minimum } => eprintln!(
            "note: the features have negative values (minimum {minimum}); row normalisation is for non-negative features such as bag-of-words, so it is skipped (--normalize-features false silences this)"
        ),
        Event::Resumed { path, epoch } => {
            eprintln!("resuming from {} after epoch {epoch}", path.display());
        }
        Event::BestRestored {
            epoch,
            metric,
            value,
            since,
        } => eprintln!(
            "continuing from its best epoch {epoch} (validation {} {value:.4}, {since} epoch(s) since)",
            metric.name()
        ),
        Event::BestStartsAfresh { reason } => eprintln!(
            "note: {reason}: the best epoch (and --patience's count) start afresh from the resumed epoch"
        ),
        Event::Epoch(rec) => {
            let m = &rec.metrics;
            let scores = match m.auc {
                Some([train, val, test]) => {
                    format!("train auc {train:.4}  val auc {val:.4}  test auc {test:.4}")
                }
                None => format!(
                    "train {:.4} (f1 {:.4})  val {:.4} (f1 {:.4})  test {:.4} (f1 {:.4})",
                    m.train_acc, m.train_f1, m.val_acc, m.val_f1, m.test_acc, m.test_f1
                ),
            };
            let line = format!(
                "epoch {:>4}  loss {:.4}  {scores}  time {:>8.2} ms  comm {:>10} B (spmm {}, allreduce {})",
                rec.epoch,
                rec.loss,
                rec.seconds * 1e3,
                rec.bytes,
                rec.spmm_bytes,
                rec.allreduce_bytes
            );
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        }
        Event::StoppedEarly {
            epoch,
            best_epoch,
            metric,
            best,
        } => eprintln!(
            "stopping early after epoch {epoch}: the validation {} has not improved since epoch {best_epoch} ({best:.4}); restoring that epoch's weights",
            metric.name()
        ),
    }
}

/// Makes this thread the global pool's worker 0 (threads from RAYON_NUM_THREADS as before), so
/// every parallel stage of an epoch starts here instead of hopping into the pool and back; MPI
/// stays on this thread (MPI_THREAD_FUNNELED).
pub(crate) fn use_this_thread_in_the_pool() {
    if let Err(err) = rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global()
    {
        tracing::debug!(%err, "the global thread pool exists already; using it as it is");
    }
}

/// Runs `distspmm train`.
pub fn run(args: &Args) -> Result<()> {
    let cfg = args.config();
    // The combination of options is checked before MPI starts.
    cfg.source()?;
    use_this_thread_in_the_pool();
    let comm = dist_comm::MpiComm::init()
        .context("cannot start MPI (is this an OpenMPI build of distspmm launched with mpirun?)")?;
    let rank = comm.rank();
    let result = distspmm_gcn::train(&cfg, &comm, &mut |event| {
        if rank == 0 {
            print_event(event, args.json);
        }
    });
    let summary = match result {
        Ok(summary) => summary,
        // An error every rank holds is printed by each and they exit together; an error on one
        // rank aborts the job, so that no rank waits for it (as every distributed command).
        Err(err) => {
            let collective = err.is_collective();
            super::ranks::fail_under_mpi(comm, &err.into(), collective)
        }
    };
    if rank == 0 {
        if args.json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            let scores = match (summary.test_auc, summary.train_auc, summary.val_auc) {
                (Some(test), Some(train), Some(val)) => {
                    format!("test ROC-AUC {test:.4} (train {train:.4}, val {val:.4})")
                }
                _ => {
                    let v = |x: Option<f64>| x.unwrap_or_default();
                    format!(
                        "test accuracy {:.2}% (train {:.2}%, val {:.2}%), test macro-F1 {:.4} (train {:.4}, val {:.4})",
                        100.0 * v(summary.test_acc),
                        100.0 * v(summary.train_acc),
                        100.0 * v(summary.val_acc),
                        v(summary.test_f1),
                        v(summary.train_f1),
                        v(summary.val_f1),
                    )
                }
            };
            println!(
                "done: {} epochs on {} rank(s), {} mode: {scores}, best val {} {:.4} at epoch {}{}, final loss {:.4}, median epoch {:.2} ms, {} B/epoch ({} SpMM exchange, {} allreduce)",
                summary.epochs,
                summary.ranks,
                summary.mode,
                summary.metric.name(),
                summary.best_val,
                summary.best_epoch,
                if summary.patience.is_some() {
                    " (its weights restored)"
                } else {
                    ""
                },
                summary.final_loss,
                summary.epoch_seconds_median * 1e3,
                summary.comm_bytes_per_epoch,
                summary.spmm_bytes_per_epoch,
                summary.allreduce_bytes_per_epoch
            );
            if let Some(k) = &summary.isolated {
                for c in &k.calls {
                    println!(
                        "isolated {} {} x{}: median {:.3} ms (min {:.3} ms over {} reps){}",
                        c.kernel,
                        c.what,
                        c.count,
                        c.seconds * 1e3,
                        c.min_seconds * 1e3,
                        k.reps,
                        c.gflops
                            .map_or_else(String::new, |g| format!(", {g:.1} GFLOP/s"))
                    );
                }
                println!(
                    "the last epoch's kernels in isolation (rank 0): SpMM {:.2} ms + GEMM {:.2} ms = {:.2} ms; the median epoch is {:.2}x that",
                    k.spmm_seconds * 1e3,
                    k.gemm_seconds * 1e3,
                    k.sum_seconds * 1e3,
                    k.epoch_over_sum
                );
            }
        }
    }
    Ok(())
}

/// Tensor-parallel training's reader of a graph file ([`distspmm_gcn::ReadGraph`]): the graph,
/// Â (GCN-normalised, with the graph's weight of each entry) as one part's chunk without the
/// node data, and the node data itself.
pub(crate) fn read_whole_graph(input: &Path) -> Result<distspmm_gcn::GraphFile> {
    use distspmm_prep::normalize::{adjacency_with_weights, Normalization};
    let mut g = distspmm_prep::graph::load(input)
        .with_context(|| format!("cannot load {}", input.display()))?;
    let n = g.num_nodes;
    let fingerprint = chunk_format::dir::fingerprint_hex(&g.fingerprint());
    let feats = g.features.take().with_context(|| {
        format!(
            "{} has no node features (`x`); the models need them",
            input.display()
        )
    })?;
    let (features, in_dim) = (feats.data.to_vec(), feats.dim);
    drop(feats);
    let (a_hat, edge_weights) =
        adjacency_with_weights(n, &g.src, &g.dst, g.weights.as_deref(), Normalization::Gcn)
            .with_context(|| format!("cannot normalise the adjacency of {}", input.display()))?;
    let partition = distspmm_prep::partition::Partition::new(1, vec![0u32; n], "whole")
        .context("cannot describe the whole graph as one part")?;
    let builder = distspmm_prep::chunk::ChunkBuilder::new(&g, a_hat.view(), &partition)
        .and_then(|b| b.with_edge_weights(&edge_weights))
        .with_context(|| format!("cannot build the whole graph of {}", input.display()))?;
    let chunk = chunk_format::encode(&builder.build(0).contents())
        .with_context(|| format!("cannot encode the whole graph of {}", input.display()))?;
    drop(builder);
    let classes = g.num_classes();
    Ok(distspmm_gcn::GraphFile {
        nodes: n,
        chunk,
        features,
        in_dim,
        labels: g.labels.take(),
        classes,
        targets: g.targets.take().map(|t| t.data),
        train_mask: g.train_mask.take(),
        val_mask: g.val_mask.take(),
        test_mask: g.test_mask.take(),
        fingerprint,
        normalization: Normalization::Gcn.name().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_dropout, parse_f32};

    #[test]
    fn dropout_is_checked_as_given_and_in_single_precision() {
        assert_eq!(parse_dropout("0.5"), Ok(0.5));
        assert_eq!(parse_dropout("0"), Ok(0.0));
        assert_eq!(parse_dropout("0.99999994"), Ok(1.0f32.next_down()));
        let err = parse_dropout("0.99999999").unwrap_err();
        assert!(
            err.contains("0.99999999") && err.contains("rounds to 1"),
            "{err}"
        );
        assert!(err.contains("0.99999994"), "{err}");
        let err = parse_dropout("1").unwrap_err();
        assert!(err.contains("[0, 1), got 1"), "{err}");
        assert!(parse_dropout("-0.1").unwrap_err().contains("got -0.1"));
        assert!(parse_dropout("NaN").is_err());
        assert!(parse_dropout("half").unwrap_err().contains("not a number"));
    }

    #[test]
    fn f32_options_refuse_values_single_precision_cannot_hold() {
        assert_eq!(parse_f32("0.01"), Ok(0.01));
        assert_eq!(parse_f32("0"), Ok(0.0));
        assert!(parse_f32("1e-50").unwrap_err().contains("rounds to 0"));
        assert!(parse_f32("1e39")
            .unwrap_err()
            .contains("beyond single precision"));
        assert!(
            parse_f32("inf").is_ok(),
            "infinity is the library's to refuse"
        );
    }
}
