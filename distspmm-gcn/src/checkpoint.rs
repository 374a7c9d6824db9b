//! Training checkpoints: weights, Adam state and the number of finished epochs, the best epoch
//! by the validation metric (with early stopping, its weights), plus what they were trained on,
//! so `--resume` continues exactly where a run stopped, `predict` can use the best epoch's
//! weights, and a checkpoint of another model or graph is refused.
//!
//! A checkpoint is one JSON file (`checkpoint.json` in the checkpoint directory). f32 values are
//! written in their shortest round-trip form, so they reload bit-exactly. It carries an xxh3
//! checksum of its payload; it is written to a temporary file, fsynced and renamed, so a crash
//! (or a rank killed mid-write) leaves the previous checkpoint or the new one, never half.

use super::model::{Adam, Metric, ModelConfig, ModelKind, Params};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// File name of the checkpoint inside the checkpoint directory.
pub const FILE_NAME: &str = "checkpoint.json";
const FORMAT: &str = "distspmm-gcn-checkpoint";
/// 5: the state records the best epoch ([`State::best`]). 4 lacks it and is read (its `best` is
/// `None`). 4 named the data by the input graph's content and Â's normalisation
/// ([`DataIdentity::Graph`]), the same for every partition, so a checkpoint resumes at another
/// rank count; 3 named the partitioned chunks' content in data mode. Versions before
/// [`OLDEST_READ`] are refused (see [`load`]).
const VERSION: u32 = 5;
/// The oldest version [`load`] reads: the first whose identity can be checked against the data.
const OLDEST_READ: u32 = 4;

/// What a checkpoint's run trained on and with: everything that changes the objective. A resume
/// continues only a run whose identity is the same ([`Identity::differences`]); the partition,
/// and so the rank count, is not part of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// Hyperparameters of the model (widths, layers, dropout, learning rate, weight decay,
    /// seed).
    pub config: ModelConfig,
    /// `data` or `tensor`.
    pub mode: String,
    /// Whether `--normalize-features` was set.
    pub normalize_features: bool,
    /// What the training data is.
    pub data: DataIdentity,
    /// Where the data was read from; named in messages, not compared (the same data may move).
    pub data_source: String,
    /// In data mode, the partition the chunks belong to: named in messages, compared only for
    /// [`DataIdentity::Chunks`]. Absent in tensor mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionIdentity>,
}

/// The training data's identity, independent of how it is split across ranks where the data
/// tells.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DataIdentity {
    /// The input graph's content fingerprint (`Graph::fingerprint`, hex; recorded by
    /// `partition` in the manifest, computed from the graph file in tensor mode) and the
    /// normalisation of Â (`gcn`, `row`, `none`): what every partition of the graph shares.
    Graph {
        /// The graph's content fingerprint (hex).
        fingerprint: String,
        /// Â's normalisation.
        normalization: String,
    },
    /// The chunks' content, for a chunk directory whose manifest does not record the graph's
    /// fingerprint (written by an earlier `partition`): only those chunks match it.
    Chunks {
        /// The chunk directory's content fingerprint (hex).
        fingerprint: String,
    },
}

/// The partition a data-mode run's chunks belong to (from their manifest).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionIdentity {
    /// P, the parts the chunks were made for.
    pub parts: u32,
    /// The partition run's fingerprint (hex).
    pub fingerprint: String,
}

impl Identity {
    /// How this run (`here`) differs from the checkpoint's (`self`), one phrase per field in
    /// plain words ("--hidden is 16 there, 32 here"); empty when a resume may continue it.
    pub fn differences(&self, here: &Identity) -> Vec<String> {
        let mut out = Vec::new();
        if self.mode != here.mode {
            out.push(format!("--mode is {} there, {} here", self.mode, here.mode));
        }
        out.extend(self.model_differences(here));
        out.extend(self.data_differences(here));
        out
    }

    /// The differences a prediction checks (the model's options come from the checkpoint, the
    /// data from here; the mode and the rank count may differ).
    pub fn prediction_differences(&self, here: &Identity) -> Vec<String> {
        let mut out = self.model_differences(here);
        out.extend(self.data_differences(here));
        out
    }

    /// The model's options and the data's shape.
    fn model_differences(&self, here: &Identity) -> Vec<String> {
        let (a, b) = (&self.config, &here.config);
        let mut out = Vec::new();
        let mut field = |name: &str, there: String, here: String| {
            if there != here {
                out.push(format!("{name} is {there} there, {here} here"));
            }
        };
        field("--model", a.model.to_string(), b.model.to_string());
        field(
            "the data's feature width",
            a.in_dim.to_string(),
            b.in_dim.to_string(),
        );
        field(
            "the data's class count",
            a.classes.to_string(),
            b.classes.to_string(),
        );
        let targets = |multi: bool| {
            if multi {
                "multi-label targets"
            } else {
                "one class per node"
            }
        };
        field(
            "the data's targets",
            targets(a.multi_label).into(),
            targets(b.multi_label).into(),
        );
        field("--hidden", a.hidden.to_string(), b.hidden.to_string());
        field("--layers", a.layers.to_string(), b.layers.to_string());
        field("--dropout", a.dropout.to_string(), b.dropout.to_string());
        field("--lr", a.lr.to_string(), b.lr.to_string());
        field(
            "--weight-decay",
            a.weight_decay.to_string(),
            b.weight_decay.to_string(),
        );
        field("--seed", a.seed.to_string(), b.seed.to_string());
        field("--heads", a.heads.to_string(), b.heads.to_string());
        field(
            "--out-heads",
            a.out_heads.to_string(),
            b.out_heads.to_string(),
        );
        field(
            "--attn-dropout",
            a.attn_dropout.to_string(),
            b.attn_dropout.to_string(),
        );
        field("--residual", a.residual.to_string(), b.residual.to_string());
        field(
            "--train-eps",
            a.train_eps.to_string(),
            b.train_eps.to_string(),
        );
        field(
            "--normalize-features",
            self.normalize_features.to_string(),
            here.normalize_features.to_string(),
        );
        out
    }

    /// Why the data differ, as plainly as the fingerprints and the partitions tell.
    fn data_differences(&self, here: &Identity) -> Vec<String> {
        let (src_a, src_b) = (&self.data_source, &here.data_source);
        match (&self.data, &here.data) {
            (
                DataIdentity::Graph {
                    fingerprint: a,
                    normalization: na,
                },
                DataIdentity::Graph {
                    fingerprint: b,
                    normalization: nb,
                },
            ) => {
                let mut out = Vec::new();
                if a != b {
                    out.push(format!(
                        "the data differ (content fingerprint {a} of {src_a} there, {b} of \
                         {src_b} here: another graph, or the same graph with other features, \
                         labels, masks or edges)"
                    ));
                }
                if na != nb {
                    out.push(format!(
                        "the normalisation of Â is {na} there, {nb} here (`distspmm partition \
                         --normalize`; tensor mode uses gcn)"
                    ));
                }
                out
            }
            (DataIdentity::Chunks { fingerprint: a }, DataIdentity::Chunks { fingerprint: b }) => {
                if a == b {
                    Vec::new()
                } else {
                    vec![self.chunks_difference(here, a, b)]
                }
            }
            (DataIdentity::Graph { .. }, DataIdentity::Chunks { .. }) => vec![format!(
                "the checkpoint names its data by the graph's content, but the manifest of the \
                 chunks in {src_b} does not record it (they were partitioned by an earlier \
                 distspmm): partition the graph again (`distspmm partition`), which records it"
            )],
            (DataIdentity::Chunks { .. }, DataIdentity::Graph { .. }) => vec![format!(
                "the checkpoint names its data by the chunks in {src_a}, whose manifest did not \
                 record the graph's content (an earlier `distspmm partition`), so other data \
                 cannot be checked against it: use those chunks, or train again from scratch \
                 on these"
            )],
        }
    }

    /// Why two chunk directories' content fingerprints `a` (there) and `b` (here) differ.
    fn chunks_difference(&self, here: &Identity, a: &str, b: &str) -> String {
        let (src_a, src_b) = (&self.data_source, &here.data_source);
        match (&self.partition, &here.partition) {
            (Some(pa), Some(pb)) if pa.parts != pb.parts => {
                let parts = |p: u32| format!("{p} part{}", if p == 1 { "" } else { "s" });
                format!(
                    "the checkpoint was written for chunks of {} ({src_a}), these are of {} \
                     ({src_b}), and its chunk directory's manifest does not record the graph's \
                     content, which would let it move between part counts: resume with the \
                     chunk directory it was written for, or with chunks partitioned again into \
                     {} (`distspmm partition --parts {}`)",
                    parts(pa.parts),
                    parts(pb.parts),
                    parts(pa.parts),
                    pa.parts
                )
            }
            (Some(pa), Some(pb)) if pa.fingerprint != pb.fingerprint => format!(
                "the checkpoint was written for another partition ({} of {src_a} there, {} of \
                 {src_b} here: another graph, --method or --seed); resume with the chunk \
                 directory it was written for",
                pa.fingerprint, pb.fingerprint
            ),
            _ => format!(
                "the data differ (content fingerprint {a} of {src_a} there, {b} of {src_b} \
                 here: the same partition of other features, labels, masks or edges)"
            ),
        }
    }
}

/// What is saved.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// The run the state belongs to, checked on resume.
    pub identity: Identity,
    /// Epochs finished.
    pub epoch: u64,
    /// Parameters after `epoch` epochs.
    pub params: Params,
    /// Optimiser state after `epoch` epochs.
    pub adam: Adam,
    /// The best epoch by the validation metric among the `epoch` finished ones; `None` in a
    /// checkpoint of version 4, which does not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestEpoch>,
}

/// The best epoch of a run by its validation metric, and early stopping's count of epochs since
/// it: what a resume continues from, and (with the weights) what `predict` uses by default.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BestEpoch {
    /// The best epoch (counted from 1): the first of equals.
    pub epoch: u64,
    /// The validation metric followed.
    pub metric: Metric,
    /// Its value after `epoch` (serde_json's `float_roundtrip` reads it back bit-exactly, so a
    /// resumed run compares later epochs against the same number).
    pub value: f64,
    /// Epochs finished after `epoch` without a strict improvement ([`State::epoch`] − `epoch`).
    pub since: u64,
    /// The parameters after `epoch`, kept when the run had a patience (`--patience`); `None`
    /// without one, when the run's final model is the last epoch's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Params>,
}

impl BestEpoch {
    /// The best epoch's parameters, given the checkpoint's last ones `last`: the kept copy, or
    /// `last` itself when the best epoch is the last (`since` 0); `None` when neither holds.
    pub fn weights<'a>(&'a self, last: &'a Params) -> Option<&'a Params> {
        self.params
            .as_ref()
            .or_else(|| (self.since == 0).then_some(last))
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    format: String,
    version: u32,
    /// xxh3-64 of the serialised `state`, hex.
    checksum: String,
    state: serde_json::Value,
}

/// Path of the checkpoint file in `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// xxh3-64 of the serialised `state`.
fn payload_checksum(state: &serde_json::Value) -> Result<u64> {
    let bytes = serde_json::to_vec(state)?;
    Ok(xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// [`payload_checksum`] as the envelope records it (16 hex digits).
fn checksum(state: &serde_json::Value) -> Result<String> {
    Ok(format!("{:016x}", payload_checksum(state)?))
}

/// Checks that checkpoints can be written into `dir` (created if missing) by creating the
/// temporary a [`save`] writes first (through the same atomic write) and dropping it unwritten,
/// which removes it, so that an unwritable location is an error before the first epoch rather
/// than when the first checkpoint is due.
pub fn check_writable(dir: &Path) -> Result<()> {
    let fail = || {
        format!(
            "cannot write checkpoints into {} (choose a writable --checkpoint directory)",
            dir.display()
        )
    };
    if let Some(kind) = std::fs::metadata(dir).ok().map(|m| m.file_type()) {
        if !kind.is_dir() {
            let what = if kind.is_file() {
                "a regular file"
            } else {
                chunk_format::describe_file_type(kind)
            };
            bail!(
                "--checkpoint {} is {what}, not a directory: give a directory (it is created if \
                 missing) that will hold {FILE_NAME}",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(fail)?;
    let probe = chunk_format::atomic::AtomicFile::create(path_in(dir)).with_context(fail)?;
    drop(probe);
    Ok(())
}

/// Writes `state` atomically into `dir` (created if missing).
pub fn save(dir: &Path, state: &State) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create checkpoint directory {}", dir.display()))?;
    let value = serde_json::to_value(state)?;
    let envelope = Envelope {
        format: FORMAT.into(),
        version: VERSION,
        checksum: checksum(&value)?,
        state: value,
    };
    let final_path = path_in(dir);
    // The workspace's one atomic write (temporary file, fsync, rename, directory fsync).
    let write = || -> Result<()> {
        let mut out = chunk_format::atomic::AtomicFile::create(&final_path)?;
        // serde_json writes token by token: buffer, or a checkpoint costs ~10^5 syscalls.
        let mut f = std::io::BufWriter::new(out.file());
        serde_json::to_writer(&mut f, &envelope)?;
        f.write_all(b"\n")?;
        f.into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        out.commit()?;
        Ok(())
    };
    write().map_err(|e| e.context(format!("cannot write checkpoint {}", final_path.display())))?;
    remove_stale_temporaries(dir);
    Ok(())
}

/// Removes the temporaries of writers killed before their rename (`checkpoint.json.tmp-<pid>-<seq>`
/// of another process, or `.checkpoint.json.tmp-<pid>` of older writers); they never carry the
/// final name, so they only take space. Best effort: a failure is logged, the checkpoint just
/// written stands.
fn remove_stale_temporaries(dir: &Path) {
    let older = format!(".{FILE_NAME}");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let stale = name
            .to_str()
            .and_then(chunk_format::atomic::stale_temporary_of)
            .is_some_and(|file| file == FILE_NAME || file == older);
        if stale {
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed the temporary of an interrupted checkpoint write")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale checkpoint temporary")
                }
            }
        }
    }
}

/// Text bytes a checkpoint of `config` can take at most: the parameters, Adam's two moments and
/// the best epoch's copy of the parameters as JSON numbers (at most 24 characters and a comma
/// each, as `serde_json` writes an f32 held as f64), plus 1 MiB for the envelope, the identity,
/// the tensor names and the paths. The
/// parameters counted are the most any model kind has at these widths, so that a checkpoint of
/// another model is read and refused by name rather than by size.
pub fn size_bound(config: &ModelConfig) -> u64 {
    [
        ModelKind::Gcn,
        ModelKind::Sage,
        ModelKind::Gin,
        ModelKind::Gat,
    ]
    .into_iter()
    .map(|model| {
        ModelConfig {
            model,
            ..config.clone()
        }
        .parameters()
    })
    .max()
    .unwrap_or(0)
    .saturating_mul(4 * 25)
    .saturating_add(1 << 20)
}

/// What a checkpoint is read for; it decides the advice its refusals give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `train --resume`.
    Resume,
    /// `predict`.
    Predict,
}

impl Purpose {
    /// What to do instead when the checkpoint cannot be used.
    fn instead(self) -> &'static str {
        match self {
            Purpose::Resume => "run without --resume to start from scratch",
            Purpose::Predict => "train the model again with --checkpoint DIR",
        }
    }

    /// The option that names the checkpoint directory, with the command.
    fn option(self) -> &'static str {
        match self {
            Purpose::Resume => "--resume",
            Purpose::Predict => "predict",
        }
    }
}

/// The bytes of the checkpoint file at `path`: a regular file (a FIFO, a device or a link to
/// one is refused before a byte is read) of at most `limit` bytes, read into memory checked
/// against what is available.
fn read_bounded(path: &Path, limit: u64, purpose: Purpose) -> Result<Vec<u8>> {
    let cannot = || {
        format!(
            "cannot read checkpoint {} ({})",
            path.display(),
            purpose.instead()
        )
    };
    let file = chunk_format::open_regular(path).with_context(cannot)?;
    let len = file.metadata().with_context(cannot)?.len();
    if len > limit {
        bail!(
            "checkpoint {} is {len} bytes, more than a checkpoint of this run's model can be \
             ({limit} at most): it was written for a larger model, or is not a checkpoint; \
             resume with the options it was written with, or use another --checkpoint directory",
            path.display()
        );
    }
    // The text, and the JSON tree parsed from it (a 32-byte value per number of, as written
    // here, about 20 characters): four times the text covers both.
    distspmm_sparse::memory::check(
        format!("reading checkpoint {} ({len} bytes)", path.display()),
        len.saturating_mul(4),
        "free memory, or run on a machine with more",
    )?;
    let capacity = usize::try_from(len).with_context(cannot)?;
    let mut bytes = distspmm_sparse::memory::try_with_capacity(
        capacity,
        format!("reading checkpoint {}", path.display()),
        "free memory, or run on a machine with more",
    )?;
    file.take(len.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(cannot)?;
    if bytes.len() as u64 != len {
        bail!(
            "checkpoint {} changed while it was read ({len} bytes, then {}): resume again once \
             no other run writes it",
            path.display(),
            bytes.len()
        );
    }
    Ok(bytes)
}

/// Reads and verifies the checkpoint in `dir`, of at most `limit` bytes ([`size_bound`] of the
/// run's model; a prediction, which does not know the model before it reads it, is bounded by
/// the memory check alone); returns it with the checksum of its contents (equal for copies of
/// one checkpoint: what the ranks compare before they use it).
///
/// Version 4, which lacks the best epoch, is read with [`State::best`] `None`. Earlier versions
/// are refused: version 3 named data-mode runs by their partitioned chunks, earlier ones did not
/// record the model or the data at all, so neither can be checked against the data it is used
/// with.
pub fn load(dir: &Path, limit: u64, purpose: Purpose) -> Result<(State, u64)> {
    let path = path_in(dir);
    let bytes = read_bounded(&path, limit, purpose)?;
    let envelope: Envelope = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a distspmm checkpoint (corrupted or truncated JSON)",
            path.display()
        )
    })?;
    if envelope.format != FORMAT {
        bail!(
            "{} is a {:?} file, not a {FORMAT}",
            path.display(),
            envelope.format
        );
    }
    if envelope.version < OLDEST_READ {
        bail!(
            "{} has checkpoint version {}, written by an earlier distspmm: it does not record \
             the training graph's content independently of its partition{}, so {} cannot check that \
             it fits this data: {}",
            path.display(),
            envelope.version,
            if envelope.version < 3 {
                " (nor the model or --normalize-features)"
            } else {
                ""
            },
            purpose.option(),
            purpose.instead()
        );
    }
    if envelope.version > VERSION {
        bail!(
            "{} has checkpoint version {}; this distspmm reads up to {VERSION}: upgrade distspmm",
            path.display(),
            envelope.version
        );
    }
    let sum = payload_checksum(&envelope.state)?;
    if format!("{sum:016x}") != envelope.checksum {
        bail!(
            "{} fails its checksum: the file was modified or corrupted",
            path.display()
        );
    }
    let state: State = serde_json::from_value(envelope.state)
        .with_context(|| format!("{} has an unexpected layout", path.display()))?;
    // Each tensor holds its shape's values, the moments one value per parameter and the best
    // epoch's copy the same tensors; whether the tensors are the model's is checked when the
    // model takes them.
    let filled = |p: &Params| {
        p.tensors
            .iter()
            .all(|t| t.shape[0].checked_mul(t.shape[1]) == Some(t.values.len()))
    };
    let shapes_ok = filled(&state.params)
        && state.adam.m.len() == state.params.len()
        && state.adam.v.len() == state.params.len()
        && state
            .best
            .as_ref()
            .and_then(|b| b.params.as_ref())
            .is_none_or(|p| filled(p) && p.same_layout(&state.params));
    if !shapes_ok {
        bail!(
            "{} holds parameters whose shapes do not match their values (a damaged checkpoint)",
            path.display()
        );
    }
    if let Some(best) = &state.best {
        if best.epoch == 0
            || best.epoch > state.epoch
            || best.since != state.epoch - best.epoch
            || !best.value.is_finite()
        {
            bail!(
                "{} records a best epoch ({}, {} since, of {} finished) that does not fit its \
                 epochs (a damaged checkpoint)",
                path.display(),
                best.epoch,
                best.since,
                state.epoch
            );
        }
    }
    Ok((state, sum))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A size limit no test checkpoint reaches.
    const LIMIT: u64 = 1 << 30;

    /// A small checkpoint state of 7 epochs whose best epoch, 5, has its weights kept.
    pub(crate) fn state() -> State {
        let config = ModelConfig {
            in_dim: 5,
            hidden: 3,
            classes: 2,
            layers: 2,
            dropout: 0.5,
            lr: 0.01,
            weight_decay: 5e-4,
            seed: 1,
            ..crate::nn::net::tests::test_config(5, 3, 2)
        };
        let params = Params::glorot(&config).unwrap();
        let mut adam = Adam::new(params.len()).unwrap();
        adam.m
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = 1.0 / (i as f32 + 3.0));
        adam.t = 7;
        State {
            identity: Identity {
                config,
                mode: "data".into(),
                normalize_features: true,
                data: graph("abc", "gcn"),
                data_source: "chunks".into(),
                partition: Some(PartitionIdentity {
                    parts: 2,
                    fingerprint: "f2".into(),
                }),
            },
            epoch: 7,
            best: Some(BestEpoch {
                epoch: 5,
                metric: Metric::F1,
                value: 0.1 + 0.2,
                since: 2,
                params: Some(params.clone()),
            }),
            params,
            adam,
        }
    }

    fn graph(fingerprint: &str, normalization: &str) -> DataIdentity {
        DataIdentity::Graph {
            fingerprint: fingerprint.into(),
            normalization: normalization.into(),
        }
    }

    #[test]
    fn differences_name_each_field_in_plain_words() {
        let there = state().identity;
        assert!(there.differences(&there).is_empty());
        let mut here = there.clone();
        here.partition = None;
        here.config.hidden = 8;
        here.normalize_features = false;
        here.data = graph("def", "row");
        here.data_source = "other".into();
        assert_eq!(
            there.differences(&here),
            [
                "--hidden is 3 there, 8 here",
                "--normalize-features is true there, false here",
                "the data differ (content fingerprint abc of chunks there, def of other here: \
                 another graph, or the same graph with other features, labels, masks or edges)",
                "the normalisation of Â is gcn there, row here (`distspmm partition \
                 --normalize`; tensor mode uses gcn)",
            ]
        );
        // Where the data lives is not part of the identity.
        let moved = Identity {
            data_source: "elsewhere".into(),
            ..there.clone()
        };
        assert!(there.differences(&moved).is_empty());
    }

    #[test]
    fn the_graph_s_chunks_at_another_part_count_or_in_tensor_mode_are_the_same_data() {
        let there = state().identity;
        let mut here = there.clone();
        here.partition = Some(PartitionIdentity {
            parts: 4,
            fingerprint: "f4".into(),
        });
        here.data_source = "c4".into();
        assert!(there.differences(&here).is_empty(), "another part count");
        here.partition = None;
        here.mode = "tensor".into();
        // A resume keeps the mode; a prediction may change it.
        assert_eq!(
            there.differences(&here),
            ["--mode is data there, tensor here"]
        );
        assert!(there.prediction_differences(&here).is_empty());
        here.config.classes = 5;
        assert_eq!(
            there.prediction_differences(&here),
            ["the data's class count is 2 there, 5 here"]
        );
    }

    #[test]
    fn chunks_without_the_graph_s_fingerprint_say_what_to_do() {
        let with_graph = state().identity;
        let old_chunks = |fingerprint: &str, parts: u32, partition: &str| Identity {
            data: DataIdentity::Chunks {
                fingerprint: fingerprint.into(),
            },
            data_source: format!("c{parts}"),
            partition: Some(PartitionIdentity {
                parts,
                fingerprint: partition.into(),
            }),
            ..with_graph.clone()
        };
        let d = with_graph.differences(&old_chunks("x", 2, "f2"));
        assert!(
            d.len() == 1
                && d[0].contains("does not record it")
                && d[0].contains("partition the graph again"),
            "{d:?}"
        );
        let there = old_chunks("abc", 2, "f2");
        let d = there.differences(&with_graph);
        assert!(
            d.len() == 1 && d[0].contains("whose manifest did not record the graph's content"),
            "{d:?}"
        );
        assert!(there.differences(&there.clone()).is_empty());
        let d = there.differences(&old_chunks("def", 3, "f3"));
        assert!(
            d.len() == 1
                && d[0].starts_with("the checkpoint was written for chunks of 2 parts (c2), these are of 3 parts (c3)")
                && d[0].ends_with("(`distspmm partition --parts 2`)"),
            "{d:?}"
        );
        let d = there.differences(&old_chunks("def", 2, "g2"));
        assert!(
            d.len() == 1
                && d[0].starts_with("the checkpoint was written for another partition (f2 of c2 there, g2 of c2 here"),
            "{d:?}"
        );
        let d = there.differences(&old_chunks("def", 2, "f2"));
        assert!(
            d.len() == 1
                && d[0].ends_with(
                    "here: the same partition of other features, labels, masks or edges)"
                ),
            "{d:?}"
        );
    }

    #[test]
    fn special_files_and_oversized_checkpoints_are_refused_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        // A FIFO without a writer: opening it for reading must not block.
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let err = format!(
            "{:#}",
            load(dir.path(), LIMIT, Purpose::Resume).unwrap_err()
        );
        assert!(
            err.contains(&path.display().to_string()) && err.contains("FIFO"),
            "{err}"
        );
        std::fs::remove_file(&path).unwrap();
        // A link to an endless device.
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let err = format!(
            "{:#}",
            load(dir.path(), LIMIT, Purpose::Resume).unwrap_err()
        );
        assert!(
            err.contains(&path.display().to_string()) && err.contains("a device"),
            "{err}"
        );
        std::fs::remove_file(&path).unwrap();
        // A regular file larger than any checkpoint of the run's model.
        save(dir.path(), &state()).unwrap();
        let bound = size_bound(&state().identity.config);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(bound + 1)
            .unwrap();
        let err = format!(
            "{:#}",
            load(dir.path(), bound, Purpose::Resume).unwrap_err()
        );
        assert!(
            err.contains("more than a checkpoint of this run's model can be"),
            "{err}"
        );
    }

    #[test]
    fn the_size_bound_holds_a_real_checkpoint_and_the_checksum_identifies_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = state();
        // The longest numbers serde_json writes for an f32.
        s.params
            .tensors
            .iter_mut()
            .flat_map(|t| t.values.iter_mut())
            .for_each(|v| *v = -1.175_494_4e-38);
        s.adam.v.iter_mut().for_each(|v| *v = -0.123_456_79);
        save(dir.path(), &s).unwrap();
        let len = std::fs::metadata(path_in(dir.path())).unwrap().len();
        let bound = size_bound(&s.identity.config);
        assert!(len <= bound, "{len} > {bound}");
        let (loaded, sum) = load(dir.path(), bound, Purpose::Resume).unwrap();
        assert_eq!(loaded, s);
        let other = tempfile::tempdir().unwrap();
        save(other.path(), &state()).unwrap();
        assert_ne!(load(other.path(), bound, Purpose::Resume).unwrap().1, sum);
        std::fs::copy(path_in(dir.path()), path_in(other.path())).unwrap();
        assert_eq!(load(other.path(), bound, Purpose::Resume).unwrap().1, sum);
    }

    #[test]
    fn a_file_where_the_directory_belongs_is_named_plainly() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("ckpt");
        std::fs::write(&file, b"mine").unwrap();
        let message = format!("{:#}", check_writable(&file).unwrap_err());
        assert!(
            message.contains("is a regular file, not a directory") && !message.contains("os error"),
            "{message}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    }

    #[test]
    fn writability_is_probed_without_leaving_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("a/b");
        check_writable(&ck).unwrap();
        assert_eq!(std::fs::read_dir(&ck).unwrap().count(), 0);
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = format!("{:#}", check_writable(&file.join("ck")).unwrap_err());
        assert!(
            err.contains("cannot write checkpoints into")
                && err.contains("choose a writable --checkpoint directory"),
            "{err}"
        );
    }

    #[test]
    fn a_checkpoint_of_an_earlier_version_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &state()).unwrap();
        let path = path_in(dir.path());
        let mut envelope: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for (version, purpose, what) in [
            (1, Purpose::Resume, "without --resume"),
            (3, Purpose::Predict, "train the model again"),
        ] {
            envelope["version"] = version.into();
            std::fs::write(&path, serde_json::to_vec(&envelope).unwrap()).unwrap();
            let err = load(dir.path(), LIMIT, purpose).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "checkpoint version {version}, written by an earlier"
                )) && err.contains(what)
                    && err.contains("nor the model") == (version < 3),
                "{err}"
            );
        }
    }

    #[test]
    fn a_checkpoint_of_version_4_is_read_without_a_best_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let old = State {
            best: None,
            ..state()
        };
        save(dir.path(), &old).unwrap();
        let path = path_in(dir.path());
        let mut envelope: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(envelope["state"].get("best").is_none(), "{envelope}");
        envelope["version"] = 4.into();
        std::fs::write(&path, serde_json::to_vec(&envelope).unwrap()).unwrap();
        assert_eq!(load(dir.path(), LIMIT, Purpose::Predict).unwrap().0, old);
    }

    #[test]
    fn a_best_epoch_that_does_not_fit_the_state_is_refused() {
        let mut other_layout = state().params;
        other_layout.tensors.pop();
        for damage in [
            |b: &mut BestEpoch, _: &Params| b.epoch = 0,
            |b: &mut BestEpoch, _: &Params| b.epoch = 8,
            |b: &mut BestEpoch, _: &Params| b.since = 1,
            |b: &mut BestEpoch, p: &Params| b.params = Some(p.clone()),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut s = state();
            damage(s.best.as_mut().unwrap(), &other_layout);
            save(dir.path(), &s).unwrap();
            let err = load(dir.path(), LIMIT, Purpose::Resume)
                .unwrap_err()
                .to_string();
            assert!(err.contains("a damaged checkpoint"), "{err}");
        }
    }

    #[test]
    fn the_best_epoch_s_weights_are_its_copy_or_the_last_ones_when_it_is_the_last() {
        let s = state();
        let best = s.best.clone().unwrap();
        let kept = best.params.clone().unwrap();
        assert_eq!(best.weights(&Params::default()), Some(&kept));
        let without = BestEpoch {
            params: None,
            ..best
        };
        assert_eq!(without.weights(&s.params), None);
        let last = BestEpoch {
            since: 0,
            ..without
        };
        assert_eq!(last.weights(&s.params), Some(&s.params));
    }

    #[test]
    fn metric_values_read_back_bit_exactly() {
        // The best value is compared with later epochs' after a resume: every fraction of up
        // to 400 nodes (an accuracy) must survive the JSON text.
        for n in 1..=400u32 {
            for k in 0..=n {
                let v = f64::from(k) / f64::from(n);
                let text = serde_json::to_string(&v).unwrap();
                let back: f64 = serde_json::from_str(&text).unwrap();
                assert_eq!(back.to_bits(), v.to_bits(), "{k}/{n} as {text}");
            }
        }
    }

    #[test]
    fn a_tensor_whose_values_do_not_fill_its_shape_is_refused() {
        for shape in [[usize::MAX, 2], [5, 4]] {
            let dir = tempfile::tempdir().unwrap();
            let mut s = state();
            s.params.tensors[0].shape = shape;
            save(dir.path(), &s).unwrap();
            let err = load(dir.path(), LIMIT, Purpose::Resume)
                .unwrap_err()
                .to_string();
            assert!(err.contains("shapes do not match"), "{err}");
        }
    }

    #[test]
    fn round_trips_bit_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let s = state();
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path(), LIMIT, Purpose::Resume).unwrap().0, s);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn a_save_removes_temporaries_of_killed_writers_only() {
        let dir = tempfile::tempdir().unwrap();
        let other = std::process::id().wrapping_add(1);
        let stale = [
            format!("{FILE_NAME}.tmp-{other}-0"),
            format!(".{FILE_NAME}.tmp-{other}"),
        ];
        let kept = [format!(".{FILE_NAME}.tmp-x{other}"), "notes.txt".to_owned()];
        for name in stale.iter().chain(&kept) {
            std::fs::write(dir.path().join(name), b"{\"partial").unwrap();
        }
        save(dir.path(), &state()).unwrap();
        for name in &stale {
            assert!(!dir.path().join(name).exists(), "{name} was left");
        }
        for name in &kept {
            assert!(dir.path().join(name).exists(), "{name} was removed");
        }
        assert_eq!(load(dir.path(), LIMIT, Purpose::Resume).unwrap().0, state());
    }

    #[test]
    fn corruption_and_truncation_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &state()).unwrap();
        let path = path_in(dir.path());
        let good = std::fs::read(&path).unwrap();
        // Change one digit of a value inside the state.
        let text = String::from_utf8(good.clone()).unwrap();
        let at = text.find("\"epoch\":7").unwrap() + 8;
        let mut bad = good.clone();
        bad[at] = b'8';
        std::fs::write(&path, &bad).unwrap();
        assert!(load(dir.path(), LIMIT, Purpose::Resume)
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(load(dir.path(), LIMIT, Purpose::Resume)
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        std::fs::remove_file(&path).unwrap();
        assert!(load(dir.path(), LIMIT, Purpose::Resume)
            .unwrap_err()
            .to_string()
            .contains("without --resume"));
    }
}
