//! The agreement steps: one all-gather of a fixed-size record before any other collective of an
//! operator, one five-word all-reduce per call. Every rank checks the gathered data in the same
//! order, so every rank reaches the same verdict and the same message.

use chunk_format::ChunkView;
use distspmm_core::schedule::ScheduleKind;

use super::{DistSpmmError, Op};
use dist_comm::{AllGather, AllReduce, ReduceOp};

/// Words of a rank's record: status, P, part, fingerprint (2), version, N, n_p, schedule.
const WORDS: usize = 9;
/// The rank offers a usable chunk.
const STATUS_CHUNK: u64 = 1;
/// The rank has no chunk (it could not load one, or none exists for its rank).
const STATUS_NONE: u64 = 2;
/// The rank has a chunk but cannot build an operator from it.
const STATUS_BROKEN: u64 = 3;

fn record(status: u64, chunk: Option<&ChunkView<'_>>, schedule: u64) -> [u64; WORDS] {
    let Some(chunk) = chunk else {
        return [status, 0, 0, 0, 0, 0, 0, 0, schedule];
    };
    let h = chunk.header();
    let (lo, hi) = h.fingerprint.split_at(8);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    [
        status,
        u64::from(h.num_parts),
        u64::from(h.part_id),
        word(lo),
        word(hi),
        (u64::from(h.version.major) << 16) | u64::from(h.version.minor),
        h.num_global_nodes,
        h.num_local_nodes,
        schedule,
    ]
}

/// Gathers every rank's record and checks them (all ranks reach the same verdict).
fn gather_and_check<C: AllGather>(comm: &C, mine: [u64; WORDS]) -> Result<(), DistSpmmError> {
    let all = comm.all_gather_vec(&mine)?;
    check(&all, comm.size())
}

/// The agreement of `DistSpmm::new`: `usable` says whether this rank could build its part.
pub(super) fn agree_on_chunk<C: AllGather>(
    comm: &C,
    chunk: &ChunkView<'_>,
    schedule: ScheduleKind,
    usable: bool,
) -> Result<(), DistSpmmError> {
    let status = if usable { STATUS_CHUNK } else { STATUS_BROKEN };
    gather_and_check(comm, record(status, Some(chunk), schedule.code()))
}

/// Joins the agreement of [`DistSpmm::new`](super::DistSpmm::new) on a rank that has no chunk to
/// offer — it could not load one, or the chunk directory has none for its rank — so that every
/// other rank fails with the same error instead of waiting for it. `chunk_parts` is the number
/// of parts the directory was made for, when known (then a wrong rank count is what every rank
/// reports). Collective; returns the error every rank gets.
pub fn abstain<C: AllGather>(comm: &C, chunk_parts: Option<usize>) -> DistSpmmError {
    let mut mine = record(STATUS_NONE, None, 0);
    mine[1] = chunk_parts.map_or(0, |p| p as u64);
    match gather_and_check(comm, mine) {
        Err(e) => e,
        Ok(()) => DistSpmmError::Disagreement(
            "internal: the agreement accepted a rank without a chunk".into(),
        ),
    }
}

/// The rules, checked in a fixed order over the records of ranks 0..P−1.
fn check(all: &[u64], ranks: usize) -> Result<(), DistSpmmError> {
    let rec = |r: usize| &all[r * WORDS..(r + 1) * WORDS];
    let disagree = |m: String| Err(DistSpmmError::Disagreement(m));
    for r in 0..ranks {
        let parts = rec(r)[1] as usize;
        if parts != 0 && parts != ranks {
            return Err(DistSpmmError::PartsMismatch {
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

/// The per-call agreement: the same operation and F everywhere, and every rank's operands fit
/// (`shape` is this rank's own check, reported to the others as a flag).
pub(super) fn agree_on_call<C: AllReduce>(
    comm: &C,
    op: Op,
    features: usize,
    shape: Result<(), DistSpmmError>,
) -> Result<(), DistSpmmError> {
    let f = features as u64;
    let code = op as u64;
    // Max of x and of !x give the maximum and the minimum in one reduction.
    let mut words = [f, !f, code, !code, u64::from(shape.is_err())];
    comm.all_reduce(&mut words, ReduceOp::Max)?;
    shape?;
    let disagree = |m: String| Err(DistSpmmError::Disagreement(m));
    if words[4] != 0 {
        return disagree(format!(
            "{}: another rank's operands do not fit its chunk (its own error says why)",
            op.name()
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
            "ranks called {} with different feature counts, from {min} to {max} columns",
            op.name()
        ));
    }
    Ok(())
}
