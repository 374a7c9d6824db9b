//! The operator's side of the agreement: its chunk (and what its directory lists) as a
//! [`dist_comm::agree::ChunkRecord`], its call as an operation code and F, and dist-comm's
//! verdict as a [`DistSpmmError`]. The protocol and its rules live in `dist_comm::agree`.

use crate::schedule::{Precision, ScheduleKind};
use chunk_format::dir::Manifest;
use chunk_format::ChunkView;
use dist_comm::agree::{self, content_digest, AgreeError, ChunkRecord};
use dist_comm::{AllGather, AllReduce};

use super::{DistSpmmError, Op};

impl From<AgreeError> for DistSpmmError {
    fn from(e: AgreeError) -> Self {
        match e {
            AgreeError::PartsMismatch(m) => DistSpmmError::PartsMismatch(m),
            AgreeError::Disagreement(m) => DistSpmmError::Disagreement(m),
            AgreeError::Comm(e) => DistSpmmError::Comm(e),
        }
    }
}

/// The [`content_digest`] of the chunk checksums `manifest` lists, part by part (what
/// [`ChunkRecord::listed`] carries for a chunk loaded from that directory).
pub(crate) fn listed_digest(manifest: &Manifest) -> [u64; 2] {
    // `Manifest::validate` refuses a checksum that is not 16 hex digits: none maps to 0.
    content_digest(
        manifest
            .chunks
            .iter()
            .map(|c| c.checksum_value().unwrap_or(0)),
    )
}

fn chunk_record(chunk: &ChunkView<'_>, listed: Option<[u64; 2]>) -> ChunkRecord {
    let h = chunk.header();
    ChunkRecord {
        parts: h.num_parts,
        part: h.part_id,
        fingerprint: h.fingerprint,
        version: (h.version.major, h.version.minor),
        global_nodes: h.num_global_nodes,
        local_nodes: h.num_local_nodes,
        checksum: h.file_checksum,
        listed,
    }
}

/// The agreement of `DistSpmm::new`: `listed` is what the chunk's directory lists
/// ([`ChunkSource::listed`](crate::ChunkSource::listed)), `usable` whether this rank could
/// build its part; the ranks also agree on the schedule and the message precision.
pub(crate) fn agree_on_chunk<C: AllGather>(
    comm: &C,
    chunk: &ChunkView<'_>,
    listed: Option<[u64; 2]>,
    (schedule, precision): (ScheduleKind, Precision),
    usable: bool,
) -> Result<(), DistSpmmError> {
    Ok(agree::partition(
        comm,
        &chunk_record(chunk, listed),
        schedule.code(),
        precision.word(),
        usable,
    )?)
}

/// Joins the agreement of [`DistSpmm::new`](super::DistSpmm::new) on a rank that has no chunk to
/// offer (see [`dist_comm::agree::abstain`]). Collective; returns the error every rank gets.
pub fn abstain<C: AllGather>(comm: &C, chunk_parts: Option<usize>) -> DistSpmmError {
    agree::abstain(comm, chunk_parts).into()
}

/// The per-call agreement: the same operation, group count and F everywhere, and every rank's
/// operands fit (`shape` is this rank's own check, reported to the others as a flag). The group
/// count of the per-edge calls rides in the operation code's upper bits (one group leaves the
/// code as it is), so a call with another group count is another operation.
pub(crate) fn agree_on_call<C: AllReduce>(
    comm: &C,
    op: Op,
    groups: usize,
    features: usize,
    shape: Result<(), DistSpmmError>,
) -> Result<(), DistSpmmError> {
    let code = op as u64 | ((groups.saturating_sub(1) as u64) << 8);
    let agreed = agree::call(comm, code, op.name(), features, shape.is_ok());
    shape?;
    Ok(agreed?)
}
