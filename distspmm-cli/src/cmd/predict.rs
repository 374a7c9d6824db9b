//! `distspmm predict`: loads a trained model's checkpoint, runs the forward pass without dropout
//! over the whole graph under MPI, prints the accuracy on each mask on rank 0, and writes the
//! requested outputs as `.npy` files in the input graph's node order.
//!
//! Launch with `mpirun -n P distspmm predict --chunks DIR --checkpoint CK --out OUT --logits`
//! (P = the directory's parts, any part count of the graph the model was trained on) or
//! `mpirun -n P distspmm predict --mode tensor --input G.npz …`. Without mpirun it runs as one
//! rank.

use anyhow::{Context, Result};
use dist_comm::Group;
use distspmm_gcn::predict::{Outputs, Request, Weights};
use distspmm_gcn::Event;
use std::path::PathBuf;

use super::train::{Mode, NonFinite, Schedule};

/// Which of the checkpoint's weights to predict with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsArg {
    /// The best epoch's by the validation metric (kept by `train --patience`).
    Best,
    /// The last epoch's.
    Last,
}

/// Arguments of `distspmm predict`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chunk directory written by `distspmm partition` (data-parallel mode): any part count of
    /// the graph the model was trained on.
    #[arg(long, value_name = "DIR")]
    pub chunks: Option<PathBuf>,
    /// Graph file for tensor-parallel mode (every rank loads the whole graph).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// `data` splits nodes (needs --chunks), `tensor` splits feature columns (needs --input).
    #[arg(long, value_enum, default_value = "data")]
    pub mode: Mode,
    /// The checkpoint directory of the trained model (`train --checkpoint DIR`); the model and
    /// its options come from it.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Directory for the output files (created if missing); with several hosts, on a
    /// filesystem every rank sees: the ranks write their rows into the same files.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write `logits.npy`: the last layer's output, [N, classes] float32.
    #[arg(long)]
    pub logits: bool,
    /// Write `probabilities.npy`: the softmax of the logits, [N, classes] float32 (for
    /// multi-label targets the sigmoid of each logit).
    #[arg(long)]
    pub probabilities: bool,
    /// Write `labels.npy`: the predicted class (argmax of the logits), [N] int64 (for
    /// multi-label targets each class's 0/1 prediction, sigmoid above 1/2, [N, classes] uint8).
    #[arg(long)]
    pub labels: bool,
    /// Write `embeddings.npy`: the input of layer LAYER, counted from 0 ([N, width] float32):
    /// 0 is the features as the model reads them, LAYERS − 1 the last hidden representation.
    #[arg(long, value_name = "LAYER")]
    pub embeddings: Option<usize>,
    /// Replace output files that exist already in --out (other files there are never touched).
    #[arg(long)]
    pub force: bool,
    /// Communication schedule of the distributed SpMM (data mode).
    #[arg(long, value_enum, default_value = "halo")]
    pub schedule: Schedule,
    /// NaN or infinite features: fail, or replace them by 0 (as `train --on-nonfinite warn`).
    #[arg(long, value_enum, default_value = "fail")]
    pub on_nonfinite: NonFinite,
    /// The weights to predict with: the best epoch's by the validation metric (what `train
    /// --patience` reports; refused if the checkpoint does not hold them) or the last epoch's
    /// [default: best where the checkpoint holds them, else last].
    #[arg(long, value_enum, value_name = "WHICH")]
    pub weights: Option<WeightsArg>,
    /// Print only a final JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The library's request (everything but the output format).
    fn request(&self) -> Request {
        Request {
            chunks: self.chunks.clone(),
            input: self.input.clone(),
            read_graph: Some(super::train::read_whole_graph),
            mode: self.mode.into(),
            schedule: self.schedule.into(),
            checkpoint: self.checkpoint.clone(),
            out: self.out.clone(),
            outputs: Outputs {
                logits: self.logits,
                probabilities: self.probabilities,
                labels: self.labels,
                embeddings: self.embeddings,
            },
            force: self.force,
            on_nonfinite: self.on_nonfinite.into(),
            weights: self.weights.map(|w| match w {
                WeightsArg::Best => Weights::Best,
                WeightsArg::Last => Weights::Last,
            }),
        }
    }
}

/// Runs `distspmm predict`.
pub fn run(args: &Args) -> Result<()> {
    let request = args.request();
    super::train::use_this_thread_in_the_pool();
    let comm = dist_comm::MpiComm::init()
        .context("cannot start MPI (is this an OpenMPI build of distspmm launched with mpirun?)")?;
    let rank = comm.rank();
    let result = distspmm_gcn::predict::predict(&request, &comm, &mut |event| {
        if rank == 0 {
            if let Event::NormalizationSkipped { .. } = event {
                super::train::print_event(event, true);
            }
        }
    });
    let report = match result {
        Ok(report) => report,
        Err(err) => {
            let collective = err.is_collective();
            super::ranks::fail_under_mpi(comm, &err.into(), collective)
        }
    };
    if rank == 0 {
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            let accuracy = [
                ("train", report.train_acc),
                ("val", report.val_acc),
                ("test", report.test_acc),
            ]
            .into_iter()
            .filter_map(|(mask, acc)| acc.map(|a| format!("{mask} {:.2}%", 100.0 * a)))
            .collect::<Vec<_>>();
            let auc = [
                ("train", report.train_auc),
                ("val", report.val_auc),
                ("test", report.test_auc),
            ]
            .into_iter()
            .filter_map(|(mask, auc)| auc.map(|a| format!("{mask} {a:.4}")))
            .collect::<Vec<_>>();
            match (report.weights, report.best_metric, report.best_val) {
                (Weights::Best, Some(metric), Some(value)) => println!(
                    "using the best epoch's weights: epoch {} of {}, validation {} {value:.4}",
                    report.weights_epoch,
                    report.epochs,
                    metric.name()
                ),
                _ => println!(
                    "using the last epoch's weights: epoch {}",
                    report.weights_epoch
                ),
            }
            println!(
                "predicted {} nodes on {} rank(s), {} mode, with the model of {} after {} epochs: {}",
                report.nodes,
                report.ranks,
                report.mode,
                report.checkpoint.display(),
                report.epochs,
                if report.config.multi_label {
                    if auc.is_empty() {
                        "no mask with a class that has both target values".to_owned()
                    } else {
                        format!("ROC-AUC {}", auc.join(", "))
                    }
                } else if accuracy.is_empty() {
                    "no labelled nodes in a mask".to_owned()
                } else {
                    format!("accuracy {}", accuracy.join(", "))
                }
            );
            for file in &report.files {
                println!(
                    "wrote {} ({} {:?})",
                    file.path.display(),
                    file.dtype,
                    file.shape
                );
            }
        }
    }
    Ok(())
}
