//! Cross-rank agreement, in one place: before any other collective every rank offers what it
//! must share (P, part, partition fingerprint, format version, N, n_p, schedule, message format, its chunk's
//! checksum and the [`content_digest`] its chunk directory lists) and every rank checks all
//! offers in the same order, so all reach the same verdict and the same message
//! ([`partition`], [`abstain`]); every operator call agrees on the operation and F ([`call`]);
//! ranks resuming training agree on the checkpoint ([`resume`]); and a local outcome becomes
//! collective ([`outcome`]): if any rank failed, every rank gets the lowest failing rank's
//! message instead of waiting for it in a later collective. Only words and bytes move here;
//! what they mean (chunks, schedules, operators, checkpoints) is the caller's.
//!
//! An error from these functions is held by every rank at the same step (except
//! [`AgreeError::Comm`], a failing communicator), so the ranks may meet in one more collective
//! and exit together; an error only one rank holds must abort the job instead.

use crate::{AllGather, AllReduce, CommError, ReduceOp};

/// Why the ranks do not agree. Every rank gets the same value, except for [`AgreeError::Comm`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgreeError {
    /// The chunks were made for another number of parts than the communicator has ranks.
    #[error(transparent)]
    PartsMismatch(#[from] PartsMismatch),
    /// The ranks disagree on something they must share, or a rank could not take part.
    #[error("{0}")]
    Disagreement(String),
    /// The agreement's own collective failed (possibly on this rank only).
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// The chunks were made for another number of parts than the communicator has ranks: the one
/// definition of this error and of its words (the operator, the CLI, the trainer and the C ABI
/// report it through this type, prefixed with the directory where they know it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the chunks were made for {chunk_parts} parts but {ranks} {started}: run {chunk_parts} \
     ranks (`mpirun -n {chunk_parts}`) or re-partition with `distspmm partition --parts {ranks}`",
    started = if *ranks == 1 { "rank was started" } else { "ranks were started" }
)]
pub struct PartsMismatch {
    /// P written in the chunks.
    pub chunk_parts: usize,
    /// Ranks in the communicator.
    pub ranks: usize,
}

/// [`PartsMismatch`] unless the chunk directory's `chunk_parts` equals the communicator's
/// `ranks` (the local check before a directory is opened for a rank).
pub fn check_parts(chunk_parts: usize, ranks: usize) -> Result<(), PartsMismatch> {
    if chunk_parts == ranks {
        Ok(())
    } else {
        Err(PartsMismatch { chunk_parts, ranks })
    }
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
    /// The chunk file's whole-file checksum (its header's, which covers every section: the
    /// structure, features, labels and masks).
    pub checksum: u64,
    /// The [`content_digest`] of the chunk checksums the rank's chunk directory lists for all
    /// parts, when the chunk was loaded from a directory; `None` for a chunk opened on its own.
    pub listed: Option<[u64; 2]>,
}

/// The digest of a chunk directory's content: xxh3-128 of every part's whole-file chunk
/// checksum, in part order. Each chunk's checksum covers all of its sections, so two
/// directories with one digest hold the same chunks; and since a rank's loaded chunk is checked
/// against its directory's list, the digest of the checksums the ranks loaded equals what every
/// directory lists exactly when all ranks train on one directory's content.
pub fn content_digest(checksums: impl IntoIterator<Item = u64>) -> [u64; 2] {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(b"distspmm-content-v1\0");
    for c in checksums {
        h.update(&c.to_le_bytes());
    }
    let d = h.digest128();
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the two 64-bit halves of a 128-bit digest"
    )]
    [(d >> 64) as u64, d as u64]
}

/// A [`content_digest`] as 32 hex digits.
fn digest_hex(d: [u64; 2]) -> String {
    format!("{:016x}{:016x}", d[0], d[1])
}

/// Words of a rank's record: status, P, part, fingerprint (2), version, N, n_p, schedule,
/// checksum, whether a listing follows, the listing's digest (2), message format.
const WORDS: usize = 14;
/// The rank offers a usable chunk.
const STATUS_CHUNK: u64 = 1;
/// The rank has no chunk (it could not load one, or none exists for its rank).
const STATUS_NONE: u64 = 2;
/// The rank has a chunk but cannot build an operator from it.
const STATUS_BROKEN: u64 = 3;

fn record(status: u64, chunk: Option<&ChunkRecord>, schedule: u64, wire: u64) -> [u64; WORDS] {
    let Some(h) = chunk else {
        return [status, 0, 0, 0, 0, 0, 0, 0, schedule, 0, 0, 0, 0, wire];
    };
    let listed = h.listed.unwrap_or_default();
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
        h.checksum,
        u64::from(h.listed.is_some()),
        listed[0],
        listed[1],
        wire,
    ]
}

/// A message-format word as its name (up to 8 ASCII bytes, zero-padded).
fn word_name(word: u64) -> String {
    let bytes = word.to_le_bytes();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Gathers every rank's record and checks them (all ranks reach the same verdict).
fn gather_and_check<C: AllGather>(comm: &C, mine: [u64; WORDS]) -> Result<(), AgreeError> {
    let all = comm.all_gather_vec(&mine)?;
    check(&all, comm.size())
}

/// The agreement before any other collective of an operator: every rank offers its chunk's
/// record, its schedule code and the format of its messages (`wire`: the format's name as up
/// to 8 ASCII bytes, little-endian, zero-padded); `usable` says whether this rank could build
/// its part. Collective; the same verdict on every rank.
pub fn partition<C: AllGather>(
    comm: &C,
    chunk: &ChunkRecord,
    schedule: u64,
    wire: u64,
    usable: bool,
) -> Result<(), AgreeError> {
    let status = if usable { STATUS_CHUNK } else { STATUS_BROKEN };
    gather_and_check(comm, record(status, Some(chunk), schedule, wire))
}

/// Joins the agreement of [`partition`] on a rank that has no chunk to offer — it could not
/// load one, or the chunk directory has none for its rank — so that every other rank fails
/// with the same error instead of waiting for it. `chunk_parts` is the number of parts the
/// directory was made for, when known (then a wrong rank count is what every rank reports).
/// Collective; returns the error every rank gets.
pub fn abstain<C: AllGather>(comm: &C, chunk_parts: Option<usize>) -> AgreeError {
    let mut mine = record(STATUS_NONE, None, 0, 0);
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
        // A part count beyond usize cannot equal `ranks` either.
        let parts = usize::try_from(rec(r)[1]).unwrap_or(usize::MAX);
        if parts != 0 && parts != ranks {
            return Err(PartsMismatch {
                chunk_parts: parts,
                ranks,
            }
            .into());
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
        if x[2] != r as u64 {
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
        if x[13] != first[13] {
            return disagree(format!(
                "rank {r} sends its messages in {} but rank 0 in {}: give every rank the same \
                 message precision",
                word_name(x[13]),
                word_name(first[13])
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
    check_content(&rec, ranks)
}

/// The content rule over records that passed the others (one partition, part r on rank r):
/// every rank's directory lists the same chunks, and they are the ones the ranks loaded.
fn check_content<'a>(rec: &impl Fn(usize) -> &'a [u64], ranks: usize) -> Result<(), AgreeError> {
    let listing = |r: usize| (rec(r)[10] != 0).then(|| [rec(r)[11], rec(r)[12]]);
    let Some((lister, listed)) = (0..ranks).find_map(|r| listing(r).map(|d| (r, d))) else {
        return Ok(());
    };
    for r in lister + 1..ranks {
        if let Some(theirs) = listing(r).filter(|&d| d != listed) {
            return Err(AgreeError::Disagreement(format!(
                "rank {r}'s chunks differ from rank {lister}'s (content digest {} vs {}): the \
                 ranks' chunk directories hold one partition of different data (features, \
                 labels, masks, edges or normalisation: a stale copy?); copy the same chunk \
                 directory to every host",
                digest_hex(theirs),
                digest_hex(listed)
            )));
        }
    }
    let loaded = content_digest((0..ranks).map(|r| rec(r)[9]));
    if loaded != listed {
        return Err(AgreeError::Disagreement(format!(
            "the chunks the ranks loaded (content digest {}) are not the ones rank {lister}'s \
             chunk directory lists ({}): a rank opened a chunk of another graph on its own; \
             load every rank's chunk from a copy of one chunk directory",
            digest_hex(loaded),
            digest_hex(listed)
        )));
    }
    Ok(())
}

/// What a rank resumes training from: the epochs its checkpoint has finished and a checksum of
/// the checkpoint's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumed {
    /// Epochs the checkpoint has finished.
    pub epoch: u64,
    /// A checksum of the checkpoint's contents.
    pub checksum: u64,
}

/// Every rank resumes one checkpoint: one all-gather of each rank's [`Resumed`]; a difference
/// is a [`AgreeError::Disagreement`] on every rank naming the lowest rank that differs from
/// rank 0 and what each of the two holds. Collective.
pub fn resume<C: AllGather>(comm: &C, mine: Resumed) -> Result<(), AgreeError> {
    let all = comm.all_gather_vec(&[mine.epoch, mine.checksum])?;
    let at = |r: usize| (all[2 * r], all[2 * r + 1]);
    let Some(r) = (1..comm.size()).find(|&r| at(r) != at(0)) else {
        return Ok(());
    };
    let ((e0, c0), (e, c)) = (at(0), at(r));
    Err(AgreeError::Disagreement(format!(
        "the ranks resume different checkpoints: rank {r}'s has finished {e} epochs \
         (checksum {c:016x}), rank 0's {e0} (checksum {c0:016x}); resume every rank from a \
         copy of one checkpoint directory, or from one on a shared file system"
    )))
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

/// Bytes of a failing rank's message that [`settle`] and [`outcome`] share.
const MESSAGE: usize = 1024;
/// Words before the message in a rank's record of [`settle`]: failed, code, key.
const RECORD_WORDS: usize = 3;

/// A failure [`settle`] and [`outcome`] share with every rank: the lowest failing rank, the
/// code it gave and its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rank {rank} of {ranks}: {message}")]
pub struct PeerFailure {
    /// The lowest rank that failed.
    pub rank: usize,
    /// Ranks in the communicator.
    pub ranks: usize,
    /// The code that rank gave its failure (the caller's numbering, e.g. a C status; 0 through
    /// [`outcome`]).
    pub code: i32,
    /// Its error message (cut to 1 KiB at a character boundary).
    pub message: String,
}

/// What [`settle`] found: the same value on every rank, except `Keys`' `mine`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Every rank succeeded with this key.
    Agreed(u64),
    /// Some rank failed; the lowest one's failure.
    Failed(PeerFailure),
    /// Every rank succeeded but the keys differ: `rank` is the lowest rank whose key is not this
    /// rank's `mine`.
    Keys {
        /// The lowest rank with another key than this rank's.
        rank: usize,
        /// This rank's key.
        mine: u64,
        /// That rank's key.
        theirs: u64,
    },
}

/// Makes a local outcome with a key collective: every rank offers either the key every rank
/// must share (e.g. F, a buffer length, a fingerprint) or its failure (a code of the caller's
/// and a message), and every rank learns the same verdict: all succeeded with one key, the
/// lowest failing rank's failure, or the keys differ. One three-word all-reduce when every
/// rank succeeded with one key; then an all-gather of a record (three words and 1 KiB of
/// message) per rank.
pub fn settle<C: AllReduce + AllGather>(
    comm: &C,
    local: Result<u64, (i32, &str)>,
) -> Result<Settled, CommError> {
    let key = *local.as_ref().unwrap_or(&0);
    // Max of x and of !x give the maximum and the minimum in one reduction (a failing rank
    // offers key 0, which only makes the verdict take the slow path).
    let mut words = [u64::from(local.is_err()), key, !key];
    comm.all_reduce(&mut words, ReduceOp::Max)?;
    if words[0] == 0 && words[1] == !words[2] {
        return Ok(Settled::Agreed(key));
    }
    let mut mine = [0u8; RECORD_WORDS * 8 + MESSAGE];
    let (failed, code, text) = match local {
        Ok(_) => (0u64, 0i32, ""),
        Err((code, text)) => (1, code, text),
    };
    mine[0..8].copy_from_slice(&failed.to_le_bytes());
    mine[8..12].copy_from_slice(&code.to_le_bytes());
    mine[16..24].copy_from_slice(&key.to_le_bytes());
    let mut n = text.len().min(MESSAGE);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    mine[24..24 + n].copy_from_slice(&text.as_bytes()[..n]);
    let all = comm.all_gather_vec(&mine[..])?;
    let word = |record: &[u8], i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&record[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    let records: Vec<&[u8]> = all.chunks_exact(mine.len()).collect();
    if let Some((rank, record)) = records.iter().enumerate().find(|(_, r)| word(r, 0) != 0) {
        let message = &record[24..];
        let end = message.iter().position(|&b| b == 0).unwrap_or(MESSAGE);
        let mut code = [0u8; 4];
        code.copy_from_slice(&record[8..12]);
        let code = i32::from_le_bytes(code);
        return Ok(Settled::Failed(PeerFailure {
            rank,
            ranks: comm.size(),
            code,
            message: String::from_utf8_lossy(&message[..end]).into_owned(),
        }));
    }
    let (rank, theirs) = records
        .iter()
        .enumerate()
        .map(|(r, record)| (r, word(record, 2)))
        .find(|&(_, k)| k != key)
        .unwrap_or((comm.rank(), key));
    Ok(Settled::Keys {
        rank,
        mine: key,
        theirs,
    })
}

/// Makes a local outcome collective ([`settle`] without a key): if any rank failed, every rank
/// returns the same [`PeerFailure`] (the lowest failing rank's message, code 0), so no rank
/// waits forever in a later collective. A failing rank with an empty message still fails.
pub fn outcome<C: AllReduce + AllGather, T, E: std::fmt::Display>(
    comm: &C,
    local: Result<T, E>,
) -> Result<Result<T, PeerFailure>, CommError> {
    let text = local.as_ref().err().map(ToString::to_string);
    let offered = match &text {
        None => Ok(0),
        Some(t) if t.is_empty() => Err((0, "unknown error")),
        Some(t) => Err((0, t.as_str())),
    };
    match settle(comm, offered)? {
        Settled::Failed(failure) => Ok(Err(failure)),
        // Every rank offered key 0: `Keys` cannot happen.
        Settled::Agreed(_) | Settled::Keys { .. } => match local {
            Ok(value) => Ok(Ok(value)),
            Err(_) => Err(CommError::Mismatch(
                "internal: the agreement lost a failing rank".into(),
            )),
        },
    }
}

/// An error's message followed by those of its sources that it does not already include
/// (e.g. "cannot open part-00001.chunk: No such file or directory"): the words a failing rank
/// gives its peers, and the C ABI its callers.
pub fn message_with_sources(e: &dyn core::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

/// What [`outcome_keeping_own`] gives a rank when some rank failed.
#[derive(Debug)]
pub enum Failure<E> {
    /// This rank failed: its own error.
    Own(E),
    /// Another rank failed (this one did not): the lowest failing rank's message.
    Peer(PeerFailure),
}

/// [`outcome`] for a caller that keeps its own error: a failing rank gets its error value back
/// ([`Failure::Own`]), every other rank the lowest failing rank's [`PeerFailure`], whose message
/// is what `message` said of that rank's error.
pub fn outcome_keeping_own<C: AllReduce + AllGather, T, E>(
    comm: &C,
    local: Result<T, E>,
    message: impl FnOnce(&E) -> String,
) -> Result<Result<T, Failure<E>>, CommError> {
    let text = local.as_ref().err().map(message);
    let offered: Result<(), &str> = match &text {
        None => Ok(()),
        Some(text) => Err(text.as_str()),
    };
    let verdict = outcome(comm, offered)?;
    Ok(match (local, verdict) {
        (Ok(value), Ok(())) => Ok(value),
        (Err(own), _) => Err(Failure::Own(own)),
        (Ok(_), Err(peer)) => Err(Failure::Peer(peer)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Group, LocalComm};

    /// Part `part` of a partition into `parts` whose chunk checksums are 100, 101, …
    fn chunk(parts: u32, part: u32) -> ChunkRecord {
        ChunkRecord {
            parts,
            part,
            fingerprint: [7; 16],
            version: (1, 0),
            global_nodes: 5 * u64::from(parts),
            local_nodes: 5,
            checksum: 100 + u64::from(part),
            listed: Some(content_digest((0..parts).map(|p| 100 + u64::from(p)))),
        }
    }

    fn rank_u32(comm: &LocalComm) -> u32 {
        u32::try_from(comm.rank()).unwrap()
    }

    #[test]
    fn ranks_on_one_directorys_content_agree_with_or_without_a_listing() {
        let out = LocalComm::run(2, |comm| {
            let mut mine = chunk(2, rank_u32(&comm));
            // A chunk opened on its own offers no listing; its checksum is still checked.
            if comm.rank() == 1 {
                mine.listed = None;
            }
            partition(&comm, &mine, 1, 0, true)
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");
    }

    #[test]
    fn directories_with_other_content_are_named_by_rank_on_every_rank() {
        let out = LocalComm::run(3, |comm| {
            let mut mine = chunk(3, rank_u32(&comm));
            if comm.rank() == 2 {
                // A stale copy: part 2 (its own) and the listing differ.
                mine.checksum = 7;
                mine.listed = Some(content_digest([100, 101, 7]));
            }
            partition(&comm, &mine, 1, 0, true)
        });
        let first = out[0].clone().unwrap_err().to_string();
        assert!(
            first.starts_with("rank 2's chunks differ from rank 0's (content digest ")
                && first.ends_with("copy the same chunk directory to every host"),
            "{first}"
        );
        assert!(out
            .iter()
            .all(|r| r.clone().unwrap_err().to_string() == first));
    }

    #[test]
    fn a_chunk_opened_on_its_own_must_be_the_one_the_others_list() {
        let out = LocalComm::run(2, |comm| {
            let mut mine = chunk(2, rank_u32(&comm));
            if comm.rank() == 0 {
                mine.checksum = 5;
                mine.listed = None;
            }
            partition(&comm, &mine, 1, 0, true)
        });
        for r in out {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("are not the ones rank 1's chunk directory lists"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_content_digest_depends_on_every_checksum_and_their_order() {
        let d = content_digest([1, 2, 3]);
        assert_eq!(d, content_digest([1, 2, 3]));
        assert_ne!(d, content_digest([1, 2, 4]));
        assert_ne!(d, content_digest([2, 1, 3]));
        assert_ne!(d, content_digest([1, 2]));
    }

    #[test]
    fn ranks_resuming_different_checkpoints_are_told_so_on_every_rank() {
        let same = LocalComm::run(2, |comm| {
            resume(
                &comm,
                Resumed {
                    epoch: 5,
                    checksum: 9,
                },
            )
        });
        assert!(same.iter().all(Result::is_ok), "{same:?}");
        let out = LocalComm::run(3, |comm| {
            let stale = comm.rank() == 2;
            resume(
                &comm,
                Resumed {
                    epoch: if stale { 10 } else { 5 },
                    checksum: if stale { 0xab } else { 0xcd },
                },
            )
        });
        for r in out {
            assert_eq!(
                r.unwrap_err().to_string(),
                "the ranks resume different checkpoints: rank 2's has finished 10 epochs \
                 (checksum 00000000000000ab), rank 0's 5 (checksum 00000000000000cd); resume \
                 every rank from a copy of one checkpoint directory, or from one on a shared \
                 file system"
            );
        }
    }

    #[test]
    fn ranks_with_one_partition_agree() {
        let out = LocalComm::run(2, |comm| {
            partition(
                &comm,
                &chunk(2, u32::try_from(comm.rank()).unwrap()),
                1,
                0,
                true,
            )
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");
    }

    #[test]
    fn ranks_with_other_message_formats_are_told_so_on_every_rank() {
        let word = |name: &[u8]| {
            let mut b = [0u8; 8];
            b[..name.len()].copy_from_slice(name);
            u64::from_le_bytes(b)
        };
        let out = LocalComm::run(2, |comm| {
            let r = u32::try_from(comm.rank()).unwrap();
            let wire = if r == 0 { word(b"f32") } else { word(b"bf16") };
            partition(&comm, &chunk(2, r), 1, wire, true)
        });
        for r in out {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("rank 1 sends its messages in bf16 but rank 0 in f32"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_wrong_rank_count_or_an_abstaining_rank_fails_every_rank_alike() {
        let out = LocalComm::run(3, |comm| match comm.rank() {
            2 => Err(abstain(&comm, Some(2))),
            r => partition(&comm, &chunk(2, u32::try_from(r).unwrap()), 1, 0, true),
        });
        for r in out {
            assert_eq!(
                r,
                Err(AgreeError::PartsMismatch(PartsMismatch {
                    chunk_parts: 2,
                    ranks: 3
                }))
            );
        }
        let out = LocalComm::run(2, |comm| match comm.rank() {
            1 => Err(abstain(&comm, None)),
            r => partition(&comm, &chunk(2, u32::try_from(r).unwrap()), 1, 0, true),
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
    fn a_failing_rank_keeps_its_own_error_and_the_others_get_its_message() {
        let out = LocalComm::run(3, |comm| {
            let local: Result<u32, u32> = if comm.rank() == 1 { Err(7) } else { Ok(5) };
            outcome_keeping_own(&comm, local, |e| std::format!("code {e}")).unwrap()
        });
        assert!(matches!(out[1], Err(Failure::Own(7))));
        for r in [0, 2] {
            match &out[r] {
                Err(Failure::Peer(p)) => assert_eq!((p.rank, p.message.as_str()), (1, "code 7")),
                other => panic!("rank {r}: {other:?}"),
            }
        }
        let all_ok = LocalComm::run(2, |comm| {
            outcome_keeping_own(&comm, Ok::<_, u32>(comm.rank()), |_| String::new()).unwrap()
        });
        assert!(matches!(all_ok[..], [Ok(0), Ok(1)]));
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
        assert_eq!(out[1].message, "unknown error");
        let out = LocalComm::run(2, |comm| {
            let local: Result<(), String> = match comm.rank() {
                0 => Ok(()),
                _ => Err("é".repeat(600)),
            };
            outcome(&comm, local).unwrap().unwrap_err()
        });
        assert_eq!(out[0].message, "é".repeat(MESSAGE / 2));
    }

    #[test]
    fn settle_agrees_on_one_key() {
        let out = LocalComm::run(3, |comm| settle(&comm, Ok(16)).unwrap());
        assert!(out.iter().all(|s| s == &Settled::Agreed(16)), "{out:?}");
    }

    #[test]
    fn settle_shares_the_lowest_failure_with_its_code() {
        let out = LocalComm::run(3, |comm| {
            let local = match comm.rank() {
                0 => Ok(4),
                1 => Err((2, "ldx 3 < cols 4")),
                _ => Err((7, "another")),
            };
            settle(&comm, local).unwrap()
        });
        for s in out {
            assert_eq!(
                s,
                Settled::Failed(PeerFailure {
                    rank: 1,
                    ranks: 3,
                    code: 2,
                    message: "ldx 3 < cols 4".into()
                })
            );
        }
    }

    #[test]
    fn settle_names_the_lowest_rank_with_another_key() {
        let out = LocalComm::run(3, |comm| {
            let key = if comm.rank() == 2 { 9 } else { 8 };
            settle(&comm, Ok(key)).unwrap()
        });
        assert_eq!(
            out,
            vec![
                Settled::Keys {
                    rank: 2,
                    mine: 8,
                    theirs: 9
                },
                Settled::Keys {
                    rank: 2,
                    mine: 8,
                    theirs: 9
                },
                Settled::Keys {
                    rank: 0,
                    mine: 9,
                    theirs: 8
                },
            ]
        );
    }

    #[test]
    fn settle_cuts_long_messages_at_a_character_boundary() {
        let message = "é".repeat(MESSAGE);
        let out = LocalComm::run(2, |comm| {
            let local = if comm.rank() == 0 {
                Err((1, message.as_str()))
            } else {
                Ok(1)
            };
            settle(&comm, local).unwrap()
        });
        let Settled::Failed(f) = &out[1] else {
            panic!("{out:?}")
        };
        assert_eq!(f.message, "é".repeat(MESSAGE / 2));
    }
}
