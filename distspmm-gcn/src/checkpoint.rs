//! Training checkpoints: weights, Adam state and the number of finished epochs, plus what they
//! were trained on, so `--resume` continues exactly where a run stopped and refuses a checkpoint
//! of another model or graph.
//!
//! A checkpoint is one JSON file (`checkpoint.json` in the checkpoint directory). f32 values are
//! written in their shortest round-trip form, so they reload bit-exactly. It carries an xxh3
//! checksum of its payload; it is written to a temporary file, fsynced and renamed, so a crash
//! (or a rank killed mid-write) leaves the previous checkpoint or the new one, never half.

use super::model::{Adam, GcnConfig, Params};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// File name of the checkpoint inside the checkpoint directory.
pub const FILE_NAME: &str = "checkpoint.json";
const FORMAT: &str = "distspmm-gcn-checkpoint";
/// 2: the run's identity records the data's content fingerprint and `--normalize-features`.
const VERSION: u32 = 2;

/// What a checkpoint's run trained on and with: everything that changes the objective. A resume
/// continues only a run whose identity is the same ([`Identity::differences`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// Hyperparameters of the model (widths, layers, dropout, learning rate, weight decay,
    /// seed).
    pub config: GcnConfig,
    /// `data` or `tensor`.
    pub mode: String,
    /// Whether `--normalize-features` was set.
    pub normalize_features: bool,
    /// Content fingerprint of the training data (hex): of the chunks' contents in data mode,
    /// of the graph file's arrays in tensor mode.
    pub data_fingerprint: String,
    /// Where the data was read from; named in messages, not compared (the same data may move).
    pub data_source: String,
}

impl Identity {
    /// How this run (`here`) differs from the checkpoint's (`self`), one phrase per field in
    /// plain words ("--hidden is 16 there, 32 here"); empty when a resume may continue it.
    pub fn differences(&self, here: &Identity) -> Vec<String> {
        let (a, b) = (&self.config, &here.config);
        let mut out = Vec::new();
        let mut field = |name: &str, there: String, here: String| {
            if there != here {
                out.push(format!("{name} is {there} there, {here} here"));
            }
        };
        field("--mode", self.mode.clone(), here.mode.clone());
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
        field(
            "--normalize-features",
            self.normalize_features.to_string(),
            here.normalize_features.to_string(),
        );
        if self.data_fingerprint != here.data_fingerprint {
            out.push(format!(
                "the data differ (content fingerprint {} of {} there, {} of {} here)",
                self.data_fingerprint, self.data_source, here.data_fingerprint, here.data_source
            ));
        }
        out
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

fn checksum(state: &serde_json::Value) -> Result<String> {
    let bytes = serde_json::to_vec(state)?;
    Ok(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)))
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

/// Reads and verifies the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<State> {
    let path = path_in(dir);
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "cannot read checkpoint {} (run without --resume to start from scratch)",
            path.display()
        )
    })?;
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
    if envelope.version < VERSION {
        bail!(
            "{} has checkpoint version {}, which does not record the training data's content \
             or --normalize-features, so a resume cannot check that it continues the same run: \
             start again without --resume",
            path.display(),
            envelope.version
        );
    }
    if envelope.version > VERSION {
        bail!(
            "{} has checkpoint version {}; this distspmm reads up to {VERSION}: upgrade distspmm",
            path.display(),
            envelope.version
        );
    }
    if checksum(&envelope.state)? != envelope.checksum {
        bail!(
            "{} fails its checksum: the file was modified or corrupted",
            path.display()
        );
    }
    let state: State = serde_json::from_value(envelope.state)
        .with_context(|| format!("{} has an unexpected layout", path.display()))?;
    let shapes_ok = {
        // The layer count is checked against the arrays present before `dims` is built from it.
        let config = &state.identity.config;
        state.params.weights.len() == config.layers
            && state.params.biases.len() == config.layers
            && {
                let dims = config.dims();
                (0..config.layers).all(|l| {
                    dims[l].checked_mul(dims[l + 1]) == Some(state.params.weights[l].len())
                        && state.params.biases[l].len() == dims[l + 1]
                })
            }
            && state.adam.m.len() == state.params.len()
            && state.adam.v.len() == state.params.len()
    };
    if !shapes_ok {
        bail!(
            "{} holds parameters whose shapes do not match its own configuration",
            path.display()
        );
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        let config = GcnConfig {
            in_dim: 5,
            hidden: 3,
            classes: 2,
            layers: 2,
            dropout: 0.5,
            lr: 0.01,
            weight_decay: 5e-4,
            seed: 1,
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
                data_fingerprint: "abc".into(),
                data_source: "chunks".into(),
            },
            epoch: 7,
            params,
            adam,
        }
    }

    #[test]
    fn differences_name_each_field_in_plain_words() {
        let there = state().identity;
        assert!(there.differences(&there).is_empty());
        let mut here = there.clone();
        here.config.hidden = 8;
        here.normalize_features = false;
        here.data_fingerprint = "def".into();
        here.data_source = "other".into();
        assert_eq!(
            there.differences(&here),
            [
                "--hidden is 3 there, 8 here",
                "--normalize-features is true there, false here",
                "the data differ (content fingerprint abc of chunks there, def of other here)",
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
    fn a_checkpoint_without_a_data_fingerprint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &state()).unwrap();
        let path = path_in(dir.path());
        let mut envelope: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        envelope["version"] = 1.into();
        std::fs::write(&path, serde_json::to_vec(&envelope).unwrap()).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint version 1") && err.contains("without --resume"),
            "{err}"
        );
    }

    #[test]
    fn a_layer_count_beyond_the_arrays_is_refused_before_it_sizes_anything() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = state();
        s.identity.config.layers = usize::MAX;
        save(dir.path(), &s).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("shapes do not match"), "{err}");
    }

    #[test]
    fn round_trips_bit_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let s = state();
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path()).unwrap(), s);
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
        assert_eq!(load(dir.path()).unwrap(), state());
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
        assert!(load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        std::fs::remove_file(&path).unwrap();
        assert!(load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("without --resume"));
    }
}
