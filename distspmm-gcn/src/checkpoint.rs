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
const VERSION: u32 = 1;

/// What is saved.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// Hyperparameters of the model the state belongs to.
    pub config: GcnConfig,
    /// `data` or `tensor`.
    pub mode: String,
    /// Identity of the training data (partition fingerprint or input file), checked on resume.
    pub data_id: String,
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
    let tmp = dir.join(format!(".{FILE_NAME}.tmp-{}", std::process::id()));
    let write = || -> Result<()> {
        // serde_json writes token by token: buffer, or a checkpoint costs ~10^5 syscalls.
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut f, &envelope)?;
        f.write_all(b"\n")?;
        let f = f
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &final_path)?;
        // Persist the rename itself.
        std::fs::File::open(dir)?.sync_all()?;
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        e.context(format!("cannot write checkpoint {}", final_path.display()))
    })?;
    remove_stale_temporaries(dir);
    Ok(())
}

/// Removes the temporaries of writers killed before their rename (`.checkpoint.json.tmp-<pid>`
/// of another process); they never carry the final name, so they only take space. Best effort:
/// a failure is logged, the checkpoint just written stands.
fn remove_stale_temporaries(dir: &Path) {
    let ours = format!(".{FILE_NAME}");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let stale = name
            .to_str()
            .and_then(distspmm_core::chunk::stale_temporary_of)
            .is_some_and(|file| file == ours);
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
        let dims = state.config.dims();
        state.params.weights.len() == state.config.layers
            && state.params.biases.len() == state.config.layers
            && (0..state.config.layers).all(|l| {
                state.params.weights[l].len() == dims[l] * dims[l + 1]
                    && state.params.biases[l].len() == dims[l + 1]
            })
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
        let params = Params::glorot(&config);
        let mut adam = Adam::new(params.len());
        adam.m
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = 1.0 / (i as f32 + 3.0));
        adam.t = 7;
        State {
            config,
            mode: "data".into(),
            data_id: "abc".into(),
            epoch: 7,
            params,
            adam,
        }
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
        let stale = format!(".{FILE_NAME}.tmp-{other}");
        let kept = [format!(".{FILE_NAME}.tmp-x{other}"), "notes.txt".to_owned()];
        for name in std::iter::once(&stale).chain(&kept) {
            std::fs::write(dir.path().join(name), b"{\"partial").unwrap();
        }
        save(dir.path(), &state()).unwrap();
        assert!(!dir.path().join(&stale).exists(), "{stale} was left");
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
