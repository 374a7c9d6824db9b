//! Cross-rank agreement, in one place: before any other collective every rank offers what it
//! must share (P, part, partition fingerprint, format version, N, n_p, schedule) and every
//! rank checks all offers in the same order, so all reach the same verdict and the same
//! message ([`partition`], [`abstain`]); every operator call agrees on the operation and F
//! ([`call`]); and a local outcome becomes collective ([`outcome`]): if any rank failed, every
//! rank gets the lowest failing rank's message instead of waiting for it in a later
//! collective. Only words and bytes move here; what they mean (chunks, schedules, operators)
//! is the caller's.
//!
//! An error from these functions is held by every rank at the same step (except
//! [`AgreeError::Comm`], a failing communicator), so the ranks may meet in one more collective
//! and exit together; an error only one rank holds must abort the job instead.

use crate::{AllGather, AllReduce, CommError, ReduceOp};

/// Why the ranks do not agree. Every rank gets the same value, except for [`AgreeError::Comm`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgreeError {
    /// The chunks were made for another number of parts than the communicator has ranks.
    #[error("the chunks were made for {chunk_parts} parts but the communicator has {ranks} ranks")]
    PartsMismatch {
        /// P written in the chunks.
        chunk_parts: usize,
        /// Ranks in the communicator.
        ranks: usize,
    },
    /// The ranks disagree on something they must share, or a rank could not take part.
    #[error("{0}")]
    Disagreement(String),
    /// The agreement's own collective failed (possibly on this rank only).
    #[error(transparent)]
    Comm(#[from] CommError),
}

impl AgreeError {
    /// Whether every rank holds this error.
    pub fn is_collective(&self) -> bool {
        !matches!(self, AgreeError::Comm(_))
    }
}

/// What a rank's chunk says about the partition it belongs to (read from its header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRecord {
    /// P the chunk was made for.
    pub parts: u32,
    /// The chunk's part.
    pub part: u32,
    /// The partition run's fingerprint.
    pub fingerprint: [u8; 16],
    /// Chunk format version (major, minor).
    pub version: (u16, u16),
    /// N, the graph's nodes.
    pub global_nodes: u64,
    /// n_p, the rows this chunk owns.
    pub local_nodes: u64,
}

/// Words of a rank's record: status, P, part, fingerprint (2), version, N, n_p, schedule.
const WORDS: usize = 9;
/// The rank offers a usable chunk.
const STATUS_CHUNK: u64 = 1;
/// The rank has no chunk (it could not load one, or none exists for its rank).
const STATUS_NONE: u64 = 2;
/// The rank has a chunk but cannot build an operator from it.
const STATUS_BROKEN: u64 = 3;

fn record(status: u64, chunk: Option<&ChunkRecord>, schedule: u64) -> [u64; WORDS] {
    let Some(h) = chunk else {
        return [status, 0, 0, 0, 0, 0, 0, 0, schedule];
    };
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&h.fingerprint[..8]);
    hi.copy_from_slice(&h.fingerprint[8..]);
    [
        status,
        u64::from(h.parts),
        u64::from(h.part),
        u64::from_le_bytes(lo),
        u64::from_le_bytes(hi),
        (u64::from(h.version.0) << 16) | u64::from(h.version.1),
        h.global_nodes,
        h.local_nodes,
        schedule,
    ]
}

/// Gathers every rank's record and checks them (all ranks reach the same verdict).
fn gather_and_check<C: AllGather>(comm: &C, mine: [u64; WORDS]) -> Result<(), AgreeError> {
    let all = comm.all_gather_vec(&mine)?;
    check(&all, comm.size())
}

/// The agreement before any other collective of an operator: every rank offers its chunk's
/// record and its schedule code; `usable` says whether this rank could build its part.
/// Collective; the same verdict on every rank.
pub fn partition<C: AllGather>(
    comm: &C,
    chunk: &ChunkRecord,
    schedule: u64,
    usable: bool,
) -> Result<(), AgreeError> {
    let status = if usable { STATUS_CHUNK } else { STATUS_BROKEN };
    gather_and_check(comm, record(status, Some(chunk), schedule))
}

/// Joins the agreement of [`partition`] on a rank that has no chunk to offer — it could not
/// load one, or the chunk directory has none for its rank — so that every other rank fails
/// with the same error instead of waiting for it. `chunk_parts` is the number of parts the
/// directory was made for, when known (then a wrong rank count is what every rank reports).
/// Collective; returns the error every rank gets.
pub fn abstain<C: AllGather>(comm: &C, chunk_parts: Option<usize>) -> AgreeError {
    let mut mine = record(STATUS_NONE, None, 0);
    mine[1] = chunk_parts.map_or(0, |p| p as u64);
    match gather_and_check(comm, mine) {
        Err(e) => e,
        Ok(()) => AgreeError::Disagreement(
            "internal: the agreement accepted a rank without a chunk".into(),
        ),
    }
}

/// The rules, checked in a fixed order over the records of ranks 0..P−1.
fn check(all: &[u64], ranks: usize) -> Result<(), AgreeError> {
    let rec = |r: usize| &all[r * WORDS..(r + 1) * WORDS];
    let disagree = |m: String| Err(AgreeError::Disagreement(m));
    for r in 0..ranks {
        let parts = rec(r)[1] as usize;
        if parts != 0 && parts != ranks {
            return Err(AgreeError::PartsMismatch {
                chunk_parts: parts,
                ranks,
            });
        }
    }
    for r in 0..ranks {
        match rec(r)[0] {
            STATUS_CHUNK => {}
            STATUS_BROKEN => {
                return disagree(format!(
                    "rank {r} cannot use its chunk (its own error says why)"
                ))
            }
            _ => {
                return disagree(format!(
                    "rank {r} has no chunk to work on (its own error says why)"
                ))
            }
        }
    }
    let first = rec(0);
    let fingerprint = |x: &[u64]| format!("{:016x}{:016x}", x[3].swap_bytes(), x[4].swap_bytes());
    for r in 0..ranks {
        let x = rec(r);
        if x[2] as usize != r {
            return disagree(format!(
                "rank {r} was given the chunk of part {}: every rank must load the part with \
                 its own number",
                x[2]
            ));
        }
        if x[3..5] != first[3..5] {
            return disagree(format!(
                "rank {r}'s chunk belongs to another partition run than rank 0's (fingerprint \
                 {} vs {}): load every rank's chunk from one chunk directory",
                fingerprint(x),
                fingerprint(first)
            ));
        }
        if x[5] != first[5] {
            return disagree(format!(
                "rank {r}'s chunk has format version {}.{}, rank 0's {}.{}",
                x[5] >> 16,
                x[5] & 0xffff,
                first[5] >> 16,
                first[5] & 0xffff
            ));
        }
        if x[6] != first[6] {
            return disagree(format!(
                "rank {r}'s chunk is for a graph of {} nodes, rank 0's for {}",
                x[6], first[6]
            ));
        }
        if x[8] != first[8] {
            return disagree(format!(
                "rank {r} chose another schedule than rank 0 (code {} vs {})",
                x[8], first[8]
            ));
        }
    }
    let rows: u64 = (0..ranks).map(|r| rec(r)[7]).sum();
    if rows != first[6] {
        return disagree(format!(
            "the ranks' chunks own {rows} rows together but the graph has {} nodes",
            first[6]
        ));
    }
    Ok(())
}

/// The per-call agreement: the same operation (`code`, named `name`) and F everywhere, and
/// every rank's operands fit (`fits` is this rank's own check; a rank whose operands do not
/// fit reports its own error, the others get a [`AgreeError::Disagreement`] pointing there).
/// One five-word all-reduce.
pub fn call<C: AllReduce>(
    comm: &C,
    code: u64,
    name: &str,
    features: usize,
    fits: bool,
) -> Result<(), AgreeError> {
    let f = features as u64;
    // Max of x and of !x give the maximum and the minimum in one reduction.
    let mut words = [f, !f, code, !code, u64::from(!fits)];
    comm.all_reduce(&mut words, ReduceOp::Max)?;
    let disagree = |m: String| Err(AgreeError::Disagreement(m));
    if words[4] != 0 {
        return disagree(format!(
            "{name}: another rank's operands do not fit its chunk (its own error says why)"
        ));
    }
    if words[2] != !words[3] {
        return disagree(
            "ranks called different operations at once: some forward, some backward".into(),
        );
    }
    let (max, min) = (words[0], !words[1]);
    if max != min {
        return disagree(format!(
            "ranks called {name} with different feature counts, from {min} to {max} columns"
        ));
    }
    Ok(())
}

/// Bytes of a failing rank's message that [`outcome`] shares.
const MESSAGE: usize = 1024;

/// A failure [`outcome`] shares with every rank: the lowest failing rank and its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rank {rank} of {ranks}: {message}")]
pub struct PeerFailure {
    /// The lowest rank that failed.
    pub rank: usize,
    /// Ranks in the communicator.
    pub ranks: usize,
    /// Its error message (cut to 1 KiB at a character boundary).
    pub message: String,
}

/// Makes a local outcome collective: if any rank failed, every rank returns the same
/// [`PeerFailure`] (the lowest failing rank's message), so no rank waits forever in a later
/// collective. One one-word all-reduce when every rank succeeded; an all-gather of 1 KiB per
/// rank otherwise.
pub fn outcome<C: AllReduce + AllGather, T, E: std::fmt::Display>(
    comm: &C,
    local: Result<T, E>,
) -> Result<Result<T, PeerFailure>, CommError> {
    let mut failed = [u64::from(local.is_err())];
    comm.all_reduce(&mut failed, ReduceOp::Max)?;
    let local = match (failed[0], local) {
        (0, Ok(value)) => return Ok(Ok(value)),
        (_, local) => local,
    };
    let mut mine = [0u8; MESSAGE];
    if let Err(e) = &local {
        let text = e.to_string();
        let mut n = text.len().min(MESSAGE);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        mine[..n].copy_from_slice(&text.as_bytes()[..n]);
        // A failing rank with an empty message still marks its record.
        if n == 0 {
            mine[0] = b'?';
        }
    }
    let all = comm.all_gather_vec(&mine[..])?;
    let (rank, message) = all
        .chunks(MESSAGE)
        .enumerate()
        .find(|(_, m)| m[0] != 0)
        .map(|(r, m)| {
            let end = m.iter().position(|&b| b == 0).unwrap_or(MESSAGE);
            (r, String::from_utf8_lossy(&m[..end]).into_owned())
        })
        .unwrap_or((0, "unknown error".into()));
    Ok(Err(PeerFailure {
        rank,
        ranks: comm.size(),
        message,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Group, LocalComm};

    fn chunk(parts: u32, part: u32) -> ChunkRecord {
        ChunkRecord {
            parts,
            part,
            fingerprint: [7; 16],
            version: (1, 0),
            global_nodes: 10,
            local_nodes: 5,
        }
    }

    #[test]
    fn ranks_with_one_partition_agree() {
        let out = LocalComm::run(2, |comm| {
            partition(&comm, &chunk(2, comm.rank() as u32), 1, true)
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");
    }

    #[test]
    fn a_wrong_rank_count_or_an_abstaining_rank_fails_every_rank_alike() {
        let out = LocalComm::run(3, |comm| match comm.rank() {
            2 => Err(abstain(&comm, Some(2))),
            r => partition(&comm, &chunk(2, r as u32), 1, true),
        });
        for r in out {
            assert_eq!(
                r,
                Err(AgreeError::PartsMismatch {
                    chunk_parts: 2,
                    ranks: 3
                })
            );
        }
        let out = LocalComm::run(2, |comm| match comm.rank() {
            1 => Err(abstain(&comm, None)),
            r => partition(&comm, &chunk(2, r as u32), 1, true),
        });
        for r in out {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("rank 1 has no chunk"), "{e}");
        }
    }

    #[test]
    fn calls_must_agree_on_operation_and_features() {
        let out = LocalComm::run(2, |comm| call(&comm, 1, "forward", 4 + comm.rank(), true));
        for r in out {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("from 4 to 5 columns"), "{e}");
        }
        let out = LocalComm::run(2, |comm| call(&comm, 1, "forward", 4, comm.rank() == 0));
        for r in out {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("another rank's operands"), "{e}");
        }
        let out = LocalComm::run(2, |comm| call(&comm, 1, "forward", 4, true));
        assert!(out.iter().all(Result::is_ok));
    }

    #[test]
    fn a_failure_on_one_rank_is_the_same_error_on_all() {
        let out = LocalComm::run(3, |comm| {
            let local: Result<u32, String> = if comm.rank() >= 1 {
                Err(format!("chunk {} is broken", comm.rank()))
            } else {
                Ok(7)
            };
            outcome(&comm, local).unwrap().map_err(|e| e.to_string())
        });
        for r in &out {
            assert_eq!(r.as_ref().unwrap_err(), "rank 1 of 3: chunk 1 is broken");
        }
        let ok = LocalComm::run(2, |comm| {
            outcome(&comm, Ok::<_, String>(comm.rank()))
                .unwrap()
                .unwrap()
        });
        assert_eq!(ok, vec![0, 1]);
    }

    #[test]
    fn long_and_empty_messages_are_shared_whole_characters_and_marked() {
        let out = LocalComm::run(2, |comm| {
            let local: Result<(), String> = match comm.rank() {
                0 => Err(String::new()),
                _ => Err("é".repeat(600)),
            };
            outcome(&comm, local).unwrap().unwrap_err()
        });
        assert_eq!(out[0].rank, 0, "an empty message still counts as a failure");
        let out = LocalComm::run(2, |comm| {
            let local: Result<(), String> = match comm.rank() {
                0 => Ok(()),
                _ => Err("é".repeat(600)),
            };
            outcome(&comm, local).unwrap().unwrap_err()
        });
        assert_eq!(out[0].message, "é".repeat(MESSAGE / 2));
    }
}
