//! Prediction with a trained model: the checkpoint's weights (its best epoch's where it holds
//! them, see [`Weights`]), a forward pass without dropout over the whole graph, the accuracy
//! (or, for multi-label targets, the ROC-AUC) on each mask, and the requested outputs as `.npy`
//! files in the input graph's node order.
//!
//! Each rank writes its own rows into each file, at `header + original id × row bytes`; no rank
//! gathers a matrix. The files are written by the workspace's atomic write
//! (`chunk_format::atomic`) shared by the ranks: rank 0 creates the temporary file of each
//! output (header, full length), every rank opens it ([`chunk_format::atomic::open_temporary`]),
//! writes and syncs its rows, and rank 0 renames the files only once every rank has succeeded.
//! So the output directory must be on a filesystem every rank sees.
//!
//! Only the files named in [`Output::file_name`] are ever created or replaced in the output
//! directory; one that exists is replaced only with `force`.

use super::checkpoint::{self, Purpose};
use super::model::{count_metrics, log_sum_exp, sigmoid, LocalData, ModelConfig};
use super::nn::{net::Net, Graph};
use super::{
    agree, classify, load_checkpoint, run, Agreed, CommReduce, Config, ConfigError, Event, Job,
    Mode, NonFinite, Outcome, Placement, Schedule, Task, TrainError,
};
use anyhow::{anyhow, bail, Context, Result};
use dist_comm::{AllGather, AllReduce, Broadcast, Communicator, Group, ReduceOp};
use distspmm_sparse::npy::{npy_file_header, NpyElement};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One output file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The last layer's output, `[N, classes]` f32.
    Logits,
    /// The softmax of the logits, `[N, classes]` f32; for multi-label targets the sigmoid of
    /// each logit.
    Probabilities,
    /// The predicted class (the logits' argmax), `[N]` i64; for multi-label targets each
    /// class's 0/1 prediction (logit above 0, probability above 1/2), `[N, classes]` u8.
    Labels,
    /// The input of this layer (counted from 0), `[N, width]` f32: 0 is the features as the
    /// model reads them (row-normalised if the model was trained so), `layers − 1` the last
    /// hidden representation.
    Embeddings(usize),
}

impl Output {
    /// The file's name in the output directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Output::Logits => "logits.npy",
            Output::Probabilities => "probabilities.npy",
            Output::Labels => "labels.npy",
            Output::Embeddings(_) => "embeddings.npy",
        }
    }

    fn element(self, multi_label: bool) -> NpyElement {
        match (self, multi_label) {
            (Output::Labels, false) => NpyElement::I64,
            (Output::Labels, true) => NpyElement::U8,
            _ => NpyElement::F32,
        }
    }
}

/// What `train --save-predictions` writes: the logits and the predicted labels.
pub const SAVED: [Output; 2] = [Output::Logits, Output::Labels];

/// The outputs a prediction writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outputs {
    /// `logits.npy`.
    pub logits: bool,
    /// `probabilities.npy`.
    pub probabilities: bool,
    /// `labels.npy`.
    pub labels: bool,
    /// `embeddings.npy`: the input of this layer (counted from 0).
    pub embeddings: Option<usize>,
}

impl Outputs {
    /// The requested files, in a fixed order.
    pub fn list(&self) -> Vec<Output> {
        [
            self.logits.then_some(Output::Logits),
            self.probabilities.then_some(Output::Probabilities),
            self.labels.then_some(Output::Labels),
            self.embeddings.map(Output::Embeddings),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Which of a checkpoint's weights a prediction uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    /// The best epoch's by the validation metric ([`checkpoint::BestEpoch::weights`]): kept by
    /// a run with a patience, or the last epoch's when that was the best. These are the
    /// weights `train --patience` evaluates for its summary.
    Best,
    /// The last epoch's.
    Last,
}

/// What to predict with and on: the options of `distspmm predict`, as plain data.
#[derive(Debug, Clone)]
pub struct Request {
    /// Chunk directory (data-parallel mode; any part count of the graph the model was trained
    /// on).
    pub chunks: Option<PathBuf>,
    /// Graph file (tensor-parallel mode).
    pub input: Option<PathBuf>,
    /// What reads `input` ([`Config::read_graph`]).
    pub read_graph: Option<crate::ReadGraph>,
    /// How the rows are split across ranks.
    pub mode: Mode,
    /// Communication schedule of the distributed SpMM (data mode).
    pub schedule: Schedule,
    /// The checkpoint directory of the trained model.
    pub checkpoint: PathBuf,
    /// The directory the outputs go to (created if missing).
    pub out: Option<PathBuf>,
    /// The outputs to write.
    pub outputs: Outputs,
    /// Replace output files that exist already.
    pub force: bool,
    /// NaN or infinite features: fail, or replace them by 0 (as the training did with warn).
    pub on_nonfinite: NonFinite,
    /// The weights to use; `None` is the best epoch's where the checkpoint holds them, else the
    /// last epoch's.
    pub weights: Option<Weights>,
}

impl Request {
    /// Checks the combination of output options (before any collective).
    fn check(&self) -> Result<(), ConfigError> {
        match (&self.out, self.outputs.list().is_empty()) {
            (None, false) => Err(ConfigError::OutputsNeedOut),
            (Some(_), true) => Err(ConfigError::NothingToWrite),
            _ => Ok(()),
        }
    }

    /// The run's configuration: the model and its preprocessing from the checkpoint, the data
    /// and its split from the request.
    fn config(&self, identity: &checkpoint::Identity, epochs: u64) -> Config {
        let m = &identity.config;
        Config {
            chunks: self.chunks.clone(),
            input: self.input.clone(),
            read_graph: self.read_graph,
            mode: self.mode,
            epochs,
            model: m.model,
            hidden: m.hidden,
            layers: m.layers,
            heads: m.heads,
            out_heads: m.out_heads,
            attn_dropout: m.attn_dropout,
            residual: m.residual,
            train_eps: m.train_eps,
            lr: m.lr,
            weight_decay: m.weight_decay,
            dropout: m.dropout,
            schedule: self.schedule,
            seed: m.seed,
            normalize_features: identity.normalize_features,
            on_nonfinite: self.on_nonfinite,
            ..Config::default()
        }
    }
}

/// A file a prediction wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Written {
    /// Its path.
    pub path: PathBuf,
    /// NumPy's `descr` of its elements (`<f4`, `<i8`).
    pub dtype: &'static str,
    /// Its shape: `[N]` or `[N, width]`.
    pub shape: Vec<u64>,
}

/// The outcome of a prediction (what `distspmm predict --json` prints), the same on every rank.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    /// Epochs the model was trained for.
    pub epochs: u64,
    /// The weights used: `best` or `last`.
    pub weights: Weights,
    /// The epoch whose weights were used (counted from 1).
    pub weights_epoch: u64,
    /// With the best epoch's weights: the validation metric that chose it (`acc`, `f1` or
    /// `auc`) ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_metric: Option<crate::model::Metric>,
    /// ... and its value at that epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_val: Option<f64>,
    /// The graph's nodes.
    pub nodes: u64,
    /// Ranks.
    pub ranks: usize,
    /// `data` or `tensor`.
    pub mode: &'static str,
    /// Accuracy on the training mask, if the graph has one with labelled nodes (class labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_acc: Option<f64>,
    /// ... on the validation mask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_acc: Option<f64>,
    /// ... on the test mask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_acc: Option<f64>,
    /// Multi-label targets: the ROC-AUC on the training mask (see [`crate::model::auc_per_mask`]),
    /// if some class has both target values among its labelled nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_auc: Option<f64>,
    /// ... on the validation mask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_auc: Option<f64>,
    /// ... on the test mask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_auc: Option<f64>,
    /// Wall time of the forward pass on the slowest rank, seconds.
    pub forward_seconds: f64,
    /// The files written, in the order of [`Outputs::list`].
    pub files: Vec<Written>,
    /// The model and its hyperparameters, from the checkpoint.
    pub config: ModelConfig,
}

/// Predicts on this rank over `comm` with the checkpoint `request` names (collective); every
/// rank gets the same [`Report`]. `on` gets the data's events (a skipped normalisation).
pub fn predict<C: Communicator>(
    request: &Request,
    comm: &C,
    on: &mut dyn FnMut(Event),
) -> Result<Report, TrainError> {
    request.check()?;
    let result = (|| -> Result<Report> {
        if let Some(out) = &request.out {
            prepare_out(comm, out, request.force, &request.outputs.list())?;
        }
        // The model is not known before the checkpoint is read: its size is bounded by the
        // memory check alone.
        let state = load_checkpoint(comm, &request.checkpoint, u64::MAX, Purpose::Predict)?;
        let layers = state.identity.config.layers;
        if let Some(layer) = request.outputs.embeddings.filter(|&l| l >= layers) {
            return Err(Agreed(format!(
                "--embeddings {layer}: the model has {layers} layers, whose inputs are numbered \
                 0 (the features) to {} (the last hidden representation)",
                layers.saturating_sub(1)
            ))
            .into());
        }
        let cfg = request.config(&state.identity, state.epoch);
        let source = cfg.source().map_err(|e| Agreed(e.to_string()))?;
        match run(&cfg, source, comm, on, Task::Predict(request, &state))? {
            Outcome::Predicted(report) => Ok(report),
            Outcome::Trained(_) => bail!("internal: a prediction trained"),
        }
    })();
    result.map_err(classify)
}

/// Restores the checkpoint's state into `model` (built for the data here), runs the forward
/// pass, counts the accuracies and writes the outputs (collective).
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces of a set-up run, passed once"
)]
pub(crate) fn predict_with<C, G>(
    job: &Job<'_>,
    comm: &C,
    mut model: Net,
    g: &mut G,
    data: &LocalData<'_>,
    placement: &Placement,
    request: &Request,
    state: &checkpoint::State,
) -> Result<Report>
where
    C: AllReduce + AllGather + Broadcast + Group,
    G: Graph,
{
    let path = checkpoint::path_in(&request.checkpoint);
    let differences = state.identity.prediction_differences(&job.identity);
    // Every rank read the same checkpoint and holds the same identity: one verdict.
    let verdict = if differences.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(
            "checkpoint {} was trained on other data: {}; predict on the graph it was trained on \
             (partitioned into any number of parts, or in tensor mode)",
            path.display(),
            differences.join("; ")
        ))
    };
    agree(comm, verdict)?;
    // Every rank holds the same checkpoint and request: one verdict.
    let (weights, params) = agree(comm, choose_weights(state, request.weights, &path))?;
    agree(comm, model.restore(params, state.adam.clone()))?;
    let t = Instant::now();
    model.infer(g, data)?;
    let mut seconds = [t.elapsed().as_secs_f64()];
    comm.all_reduce(&mut seconds, ReduceOp::Max)?;
    // Under a column split every rank holds every row: its counts are already the total.
    let replicated = g.column_split().is_some();
    let classes = model.cfg.classes;
    let (mut counts, auc) = match data.targets {
        Some(targets) => {
            let mut red = CommReduce::new(comm);
            (
                [0.0; 7],
                model.auc(replicated, &mut red, targets, data.masks)?,
            )
        }
        None => (
            count_metrics(model.logits(), classes, data.labels, data.masks),
            [None; 3],
        ),
    };
    if !replicated && data.targets.is_none() {
        comm.all_reduce_sum(&mut counts)?;
    }
    let accuracy = |ok: f64, n: f64| (n > 0.0).then(|| ok / n);
    let files = match &request.out {
        Some(dir) => write(
            comm,
            dir,
            request.force,
            &request.outputs.list(),
            &model,
            data,
            placement,
        )?,
        None => Vec::new(),
    };
    let best = state.best.as_ref().filter(|_| weights == Weights::Best);
    Ok(Report {
        checkpoint: path,
        epochs: state.epoch,
        weights,
        weights_epoch: best.map_or(state.epoch, |b| b.epoch),
        best_metric: best.map(|b| b.metric),
        best_val: best.map(|b| b.value),
        nodes: placement.nodes,
        ranks: comm.size(),
        mode: job.mode,
        train_acc: accuracy(counts[1], counts[2]),
        val_acc: accuracy(counts[3], counts[4]),
        test_acc: accuracy(counts[5], counts[6]),
        train_auc: auc[0],
        val_auc: auc[1],
        test_auc: auc[2],
        forward_seconds: seconds[0],
        files,
        config: model.cfg.clone(),
    })
}

/// The weights of `state` that `asked` names (`None`: the best epoch's where `state` holds them,
/// else the last); asking for the best of a checkpoint that does not hold them is refused with
/// how to get them.
fn choose_weights<'s>(
    state: &'s checkpoint::State,
    asked: Option<Weights>,
    path: &Path,
) -> Result<(Weights, &'s crate::model::Params)> {
    let best = state.best.as_ref().and_then(|b| b.weights(&state.params));
    match (asked, best) {
        (None | Some(Weights::Best), Some(params)) => Ok((Weights::Best, params)),
        (None, None) | (Some(Weights::Last), _) => Ok((Weights::Last, &state.params)),
        (Some(Weights::Best), None) => {
            let why = match &state.best {
                None => "was written by an earlier distspmm (checkpoint version 4), which kept \
                         the last epoch's weights only"
                    .to_owned(),
                Some(b) => format!(
                    "was trained without --patience, so it keeps the last epoch's weights \
                     ({}) only, and its best epoch by the validation {} was {}",
                    state.epoch,
                    b.metric.name(),
                    b.epoch
                ),
            };
            bail!(
                "--weights best: checkpoint {} {why}; predict with --weights last, or train \
                 again with --patience N --checkpoint DIR, which keeps the best epoch's weights",
                path.display()
            )
        }
    }
}

/// The refusal of an output file that exists already.
fn exists_error(path: &Path) -> anyhow::Error {
    anyhow!(
        "{} already exists; pass --force to replace it, or choose another directory",
        path.display()
    )
}

/// Checks on rank 0, before any data is loaded, that `dir` can take `outputs`: it is created if
/// missing, and an output file in it that exists already is refused unless `force`
/// (collective).
pub(crate) fn prepare_out<C: AllReduce + AllGather + Group>(
    comm: &C,
    dir: &Path,
    force: bool,
    outputs: &[Output],
) -> Result<()> {
    let checked = if comm.rank() == 0 {
        check_out(dir, force, outputs)
    } else {
        Ok(())
    };
    agree(comm, checked)
}

fn check_out(dir: &Path, force: bool, outputs: &[Output]) -> Result<()> {
    if let Ok(meta) = std::fs::metadata(dir) {
        if !meta.is_dir() {
            bail!(
                "{} is not a directory: give a directory (it is created if missing) for the \
                 output files",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    for output in outputs {
        let path = dir.join(output.file_name());
        if !force && std::fs::symlink_metadata(&path).is_ok() {
            return Err(exists_error(&path));
        }
    }
    Ok(())
}

/// The shape of `output`'s array over `nodes` rows.
fn shape(output: Output, model: &Net, nodes: u64) -> Result<Vec<u64>> {
    let width = match output {
        Output::Logits | Output::Probabilities => model.cfg.classes,
        Output::Labels if model.cfg.multi_label => model.cfg.classes,
        Output::Labels => return Ok(vec![nodes]),
        Output::Embeddings(l) => {
            model
                .layer_input(l, &[])
                .with_context(|| format!("internal: the model has no layer {l}"))?
                .1
        }
    };
    Ok(vec![nodes, width as u64])
}

/// Writes `outputs` of the last forward pass of `model` into `dir`, each rank its rows in
/// `placement` at their original ids, through one shared atomic write per file (collective).
pub(crate) fn write<C>(
    comm: &C,
    dir: &Path,
    force: bool,
    outputs: &[Output],
    model: &Net,
    data: &LocalData<'_>,
    placement: &Placement,
) -> Result<Vec<Written>>
where
    C: AllReduce + AllGather + Broadcast + Group,
{
    let multi_label = model.cfg.multi_label;
    let mut files = Vec::with_capacity(outputs.len());
    for &output in outputs {
        files.push(Written {
            path: dir.join(output.file_name()),
            dtype: output.element(multi_label).descr(),
            shape: shape(output, model, placement.nodes)?,
        });
    }
    // Rank 0 creates each temporary, with its header and its full length.
    let created = if comm.rank() == 0 {
        outputs
            .iter()
            .zip(&files)
            .map(|(&output, file)| create(output.element(multi_label), file, force))
            .collect::<Result<Vec<_>>>()
    } else {
        Ok(Vec::new())
    };
    let created = agree(comm, created)?;
    let mut temporaries = Vec::with_capacity(files.len());
    for i in 0..files.len() {
        let own = created.get(i).map(|(_, _, tmp)| tmp.as_path());
        temporaries.push(share_path(comm, own)?);
    }
    let written = (|| -> Result<()> {
        for ((&output, file), tmp) in outputs.iter().zip(&files).zip(&temporaries) {
            let header = npy_file_header(output.element(multi_label), &file.shape).len() as u64;
            write_rows(tmp, output, header, model, data, placement).with_context(|| {
                format!(
                    "cannot write the rows of {} into {} (rank 0's temporary; --out must be on a \
                     filesystem every rank sees)",
                    file.path.display(),
                    tmp.display()
                )
            })?;
        }
        Ok(())
    })();
    // A failure anywhere leaves the temporaries to be dropped, and removed, on rank 0.
    agree(comm, written)?;
    let committed = created.into_iter().try_for_each(|(out, path, _)| {
        out.commit()
            .with_context(|| format!("cannot write {}", path.display()))
    });
    agree(comm, committed)?;
    Ok(files)
}

/// Creates the temporary of `file` (refusing a file that appeared since [`prepare_out`] unless
/// the run may replace it) with its header and its full length; returns it with its final and
/// temporary paths.
fn create(
    element: NpyElement,
    file: &Written,
    force: bool,
) -> Result<(chunk_format::atomic::AtomicFile, PathBuf, PathBuf)> {
    let path = &file.path;
    if !force && std::fs::symlink_metadata(path).is_ok() {
        return Err(exists_error(path));
    }
    let cannot = || format!("cannot write {}", path.display());
    let mut out = chunk_format::atomic::AtomicFile::create(path).with_context(cannot)?;
    let header = npy_file_header(element, &file.shape);
    let rows = file.shape[0];
    let row_bytes = file.shape.get(1).copied().unwrap_or(1) * element.size() as u64;
    let len = rows
        .checked_mul(row_bytes)
        .and_then(|b| b.checked_add(header.len() as u64))
        .with_context(|| format!("{} would exceed 2^64 bytes", path.display()))?;
    out.file().write_all_at(&header, 0).with_context(cannot)?;
    out.file().set_len(len).with_context(cannot)?;
    let tmp = out.temporary_path().to_path_buf();
    Ok((out, path.clone(), tmp))
}

/// Hands rank 0's `path` (`Some` there) to every rank (collective).
fn share_path<C: Broadcast + Group>(comm: &C, path: Option<&Path>) -> Result<PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = path.map_or(&[][..], |p| p.as_os_str().as_bytes());
    let mut len = [bytes.len() as u64];
    comm.broadcast(&mut len, 0)
        .context("cannot hand the output's temporary path to the other ranks")?;
    let mut buf = if comm.rank() == 0 {
        bytes.to_vec()
    } else {
        vec![0u8; usize::try_from(len[0]).context("a path longer than memory")?]
    };
    comm.broadcast(&mut buf, 0)
        .context("cannot hand the output's temporary path to the other ranks")?;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(buf)))
}

/// Bytes of one positioned write at most (rows of consecutive ids are written together).
const RUN_BYTES: usize = 1 << 20;

/// Writes this rank's rows of `output` into the temporary `tmp` (whose data starts at
/// `header`), each at its original id, and syncs them.
fn write_rows(
    tmp: &Path,
    output: Output,
    header: u64,
    model: &Net,
    data: &LocalData<'_>,
    placement: &Placement,
) -> Result<()> {
    let file = chunk_format::atomic::open_temporary(tmp)?;
    let classes = model.cfg.classes;
    let (values, width) = match output {
        Output::Logits | Output::Probabilities | Output::Labels => (model.logits(), classes),
        Output::Embeddings(l) => model
            .layer_input(l, data.features)
            .with_context(|| format!("internal: the model has no layer {l}"))?,
    };
    let multi_label = model.cfg.multi_label;
    let row_bytes = match (output, multi_label) {
        (Output::Labels, false) => NpyElement::I64.size(),
        _ => width * output.element(multi_label).size(),
    };
    let rows = placement.rows.clone();
    if values.len() < rows.end * width || data.original_ids.len() < rows.end {
        bail!("internal: the model's rows do not cover the rows to write");
    }
    let mut order: Vec<usize> = rows.collect();
    order.sort_unstable_by_key(|&r| data.original_ids[r]);
    let per_run = (RUN_BYTES / row_bytes.max(1)).max(1);
    let mut buf = Vec::with_capacity(per_run.min(order.len()) * row_bytes);
    let mut at = 0;
    while at < order.len() {
        // A run of rows with consecutive ids, one write.
        let first = data.original_ids[order[at]];
        let mut end = at + 1;
        while end < order.len()
            && end - at < per_run
            && data.original_ids[order[end]] == first + (end - at) as u64
        {
            end += 1;
        }
        if first + (end - at) as u64 > placement.nodes {
            bail!(
                "node id {} is outside the graph's {} nodes",
                first + (end - at) as u64 - 1,
                placement.nodes
            );
        }
        buf.clear();
        for &r in &order[at..end] {
            let row = &values[r * width..(r + 1) * width];
            match output {
                Output::Logits | Output::Embeddings(_) => {
                    row.iter().for_each(|v| buf.extend(v.to_le_bytes()));
                }
                Output::Probabilities if multi_label => {
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "deliberate: computed in f64, rounded to f32"
                    )]
                    let p = |v: f32| sigmoid(f64::from(v)) as f32;
                    row.iter().for_each(|&v| buf.extend(p(v).to_le_bytes()));
                }
                Output::Probabilities => {
                    let (_, lse) = log_sum_exp(row);
                    row.iter()
                        .for_each(|&v| buf.extend((v - lse).exp().to_le_bytes()));
                }
                Output::Labels if multi_label => {
                    buf.extend(row.iter().map(|&v| u8::from(v > 0.0)));
                }
                Output::Labels => {
                    let (argmax, _) = log_sum_exp(row);
                    buf.extend((argmax as i64).to_le_bytes());
                }
            }
        }
        let offset = header + first * row_bytes as u64;
        file.write_all_at(&buf, offset)?;
        at = end;
    }
    file.sync_data()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::net::tests::{test_config, Setup};

    #[test]
    fn the_best_epoch_s_weights_are_the_default_and_refused_where_missing() {
        let path = Path::new("ck/checkpoint.json");
        let mut state = checkpoint::tests::state();
        let kept = state.best.as_ref().unwrap().params.clone().unwrap();
        state.params.tensors[0].values[0] += 1.0;
        let chosen = |s: &checkpoint::State, asked| {
            choose_weights(s, asked, path)
                .map(|(w, p)| (w, p.clone()))
                .map_err(|e| e.to_string())
        };
        for asked in [None, Some(Weights::Best)] {
            assert_eq!(chosen(&state, asked), Ok((Weights::Best, kept.clone())));
        }
        let last = Ok((Weights::Last, state.params.clone()));
        assert_eq!(chosen(&state, Some(Weights::Last)), last);
        // Trained without a patience: the last weights, and the best refused with the way to
        // keep them ...
        let mut plain = state.clone();
        plain.best.as_mut().unwrap().params = None;
        assert_eq!(chosen(&plain, None), last);
        let err = chosen(&plain, Some(Weights::Best)).unwrap_err();
        assert!(
            err.contains("was trained without --patience")
                && err.contains("its best epoch by the validation f1 was 5")
                && err
                    .contains("--weights last, or train again with --patience N --checkpoint DIR"),
            "{err}"
        );
        // ... unless the last epoch was the best.
        let best = plain.best.as_mut().unwrap();
        (best.epoch, best.since) = (7, 0);
        let own = Ok((Weights::Best, plain.params.clone()));
        assert_eq!(chosen(&plain, Some(Weights::Best)), own);
        // A checkpoint of version 4 records no best epoch.
        let old = checkpoint::State {
            best: None,
            ..state
        };
        assert_eq!(chosen(&old, None), last);
        let err = chosen(&old, Some(Weights::Best)).unwrap_err();
        assert!(
            err.contains("written by an earlier distspmm (checkpoint version 4)")
                && err.contains("train again with --patience N"),
            "{err}"
        );
    }

    /// Reads an `.npy` file this module wrote: its header text and its data bytes.
    fn read_npy(path: &Path) -> (String, Vec<u8>) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        let header = String::from_utf8(bytes[10..10 + len].to_vec()).unwrap();
        (header, bytes[10 + len..].to_vec())
    }

    fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// A model's forward pass over a small random graph, on every call the same.
    fn inferred(n: usize) -> (Net, Setup) {
        let (mut g, s) = Setup::new(n, 4, 3);
        let mut net = Net::new(test_config(4, 5, 2), n, g.edge_count(), 4).unwrap();
        net.infer(&mut g, &s.data()).unwrap();
        (net, s)
    }

    /// Two ranks each write a block of rows whose original ids are shuffled; the files hold
    /// every row at its original id.
    #[test]
    fn ranks_write_their_rows_at_their_original_ids() {
        let n = 7;
        let (net, s) = inferred(n);
        let logits = net.logits().to_vec();
        let hidden = net.layer_input(1, &s.x).unwrap().0.to_vec();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        // Row r has original id perm[r]; rank 0 writes rows 0..3, rank 1 rows 3..7.
        let perm = [6u64, 1, 3, 0, 5, 2, 4];
        let outputs = [
            Output::Logits,
            Output::Probabilities,
            Output::Labels,
            Output::Embeddings(1),
        ];
        let results = dist_comm::LocalComm::run(2, |comm| {
            let (net, s) = inferred(n);
            let data = LocalData {
                original_ids: &perm,
                ..s.data()
            };
            let rows = if comm.rank() == 0 { 0..3 } else { 3..n };
            prepare_out(&comm, &out, false, &outputs).unwrap();
            let placement = Placement {
                nodes: n as u64,
                rows,
            };
            write(&comm, &out, false, &outputs, &net, &data, &placement).map_err(|e| e.to_string())
        });
        let files = results[0].clone().unwrap();
        assert_eq!(results[1], Ok(files.clone()));
        assert_eq!(files[0].shape, [7, 3]);
        assert_eq!(files[2].shape, [7]);
        assert_eq!(files[3].shape, [7, 5]);
        // Row `id` of a file is the row whose original id is `id`.
        let by_id = |v: &[f32], w: usize| -> Vec<f32> {
            (0..n as u64)
                .flat_map(|id| {
                    let r = perm.iter().position(|&p| p == id).unwrap();
                    v[r * w..(r + 1) * w].to_vec()
                })
                .collect()
        };
        let (header, data) = read_npy(&out.join("logits.npy"));
        assert!(
            header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (7, 3), }"),
            "{header}"
        );
        let expected = by_id(&logits, 3);
        assert_eq!(f32s(&data), expected);
        let (_, data) = read_npy(&out.join("probabilities.npy"));
        for (p, l) in f32s(&data).chunks(3).zip(expected.chunks(3)) {
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{p:?}");
            let (arg, _) = log_sum_exp(l);
            assert!(p.iter().all(|&q| q <= p[arg]), "{p:?} {l:?}");
        }
        let (header, data) = read_npy(&out.join("labels.npy"));
        assert!(
            header.contains("'descr': '<i8'") && header.contains("(7,)"),
            "{header}"
        );
        let labels: Vec<i64> = data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let argmax: Vec<i64> = expected
            .chunks(3)
            .map(|l| log_sum_exp(l).0 as i64)
            .collect();
        assert_eq!(labels, argmax);
        assert_eq!(
            f32s(&read_npy(&out.join("embeddings.npy")).1),
            by_id(&hidden, 5)
        );
        // Nothing but the outputs is left in the directory.
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "embeddings.npy",
                "labels.npy",
                "logits.npy",
                "probabilities.npy"
            ]
        );
    }

    #[test]
    fn an_existing_output_is_refused_unless_forced_and_left_intact() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("logits.npy");
        std::fs::write(&mine, b"user data").unwrap();
        let err = check_out(dir.path(), false, &[Output::Labels, Output::Logits])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("logits.npy already exists; pass --force to replace it"),
            "{err}"
        );
        assert_eq!(std::fs::read(&mine).unwrap(), b"user data");
        check_out(dir.path(), true, &[Output::Logits]).unwrap();
        check_out(dir.path(), false, &[Output::Labels]).unwrap();
        let err = check_out(&mine, false, &[Output::Labels])
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }

    #[test]
    fn a_failing_rank_leaves_no_output_file() {
        let n = 4;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_path_buf();
        let errors = dist_comm::LocalComm::run(2, |comm| {
            let (net, s) = inferred(n);
            // Rank 1 holds an id past the graph's nodes: its write fails.
            let ids: Vec<u64> = if comm.rank() == 0 {
                vec![0, 1, 2, 3]
            } else {
                vec![9, 1, 2, 3]
            };
            let data = LocalData {
                original_ids: &ids,
                ..s.data()
            };
            let placement = Placement {
                nodes: n as u64,
                rows: 0..n,
            };
            write(
                &comm,
                &out,
                false,
                &[Output::Logits],
                &net,
                &data,
                &placement,
            )
            .unwrap_err()
            .to_string()
        });
        assert!(
            errors[0] == errors[1]
                && errors[0].contains("rank 1 of 2")
                && errors[0].contains("node id 9"),
            "{errors:?}"
        );
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    }
}
