//! [`PartitionShape`]: the partition-level counts every schedule's traffic follows from, for all
//! ranks at once, and the P×P [`CommMatrix`] of a schedule.

use std::format;
use std::vec::Vec;

use chunk_format::ChunkView;

use super::{BroadcastPlan, LayerTraffic, ScheduleError, ScheduleKind, Traffic, Workspace};

/// Part sizes, halo rows and non-zeros per pair of parts: enough to count any schedule's
/// bytes and buffers for every rank without chunks (a dry run for P in the thousands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionShape {
    part_offsets: Vec<u64>,
    /// `[p·P + q]`: rows of `X_q` that p's non-zeros reference (0 for q = p).
    halo_rows: Vec<u64>,
    /// `[p·P + q]`: non-zeros of `Â[p][q]`.
    block_nnz: Vec<u64>,
}

impl PartitionShape {
    /// Checks and wraps the counts: `part_offsets` `[P+1]` from 0, non-decreasing;
    /// `halo_rows` and `block_nnz` `[P·P]`, row-major by receiving part p. A part receives no
    /// halo rows from itself, at most `n_q` from q, and some exactly when its block `Â[p][q]`
    /// has non-zeros.
    ///
    /// # Errors
    /// [`ScheduleError::Shape`] naming the first rule broken.
    pub fn new(
        part_offsets: Vec<u64>,
        halo_rows: Vec<u64>,
        block_nnz: Vec<u64>,
    ) -> Result<Self, ScheduleError> {
        let bad = |detail| ScheduleError::Shape {
            what: "partition shape",
            detail,
        };
        let parts = part_offsets.len().saturating_sub(1);
        if parts == 0 || part_offsets[0] != 0 {
            return Err(bad(
                "the part offsets must hold P+1 ≥ 2 entries from 0".into()
            ));
        }
        if let Some(p) = (0..parts).find(|&p| part_offsets[p + 1] < part_offsets[p]) {
            return Err(bad(format!("the part offsets decrease after part {p}")));
        }
        let square = parts * parts;
        if halo_rows.len() != square || block_nnz.len() != square {
            return Err(bad(format!(
                "{} halo counts and {} block counts for P = {parts} (need P·P = {square})",
                halo_rows.len(),
                block_nnz.len()
            )));
        }
        for p in 0..parts {
            for q in 0..parts {
                let (h, z) = (halo_rows[p * parts + q], block_nnz[p * parts + q]);
                let n_q = part_offsets[q + 1] - part_offsets[q];
                let wrong = if q == p {
                    h != 0
                } else {
                    h > n_q || (h > 0) != (z > 0)
                };
                if wrong {
                    return Err(bad(format!(
                        "part {p} receives {h} rows from part {q} (of {n_q}) for a block of {z} \
                         non-zeros"
                    )));
                }
            }
        }
        Ok(Self {
            part_offsets,
            halo_rows,
            block_nnz,
        })
    }

    /// Reads the counts from all P chunks of one run, given in part order.
    ///
    /// # Errors
    /// [`ScheduleError::Shape`] when the chunks are not parts 0..P−1 of one partition (P or
    /// offsets differ, a part is missing or out of order), or their counts break a rule of
    /// [`PartitionShape::new`].
    pub fn from_chunks<'c, 'b: 'c>(
        chunks: impl IntoIterator<Item = &'c ChunkView<'b>>,
    ) -> Result<Self, ScheduleError> {
        let bad = |detail| ScheduleError::Shape {
            what: "chunks",
            detail,
        };
        let mut part_offsets: Option<&[u64]> = None;
        let mut halo_rows = Vec::new();
        let mut block_nnz = Vec::new();
        let mut count = 0usize;
        for (p, chunk) in chunks.into_iter().enumerate() {
            let offsets = *part_offsets.get_or_insert(chunk.part_offsets());
            if chunk.part_id() != p || chunk.part_offsets() != offsets {
                return Err(bad(format!(
                    "chunk {p} of the list is part {} of {} with other part offsets than chunk 0",
                    chunk.part_id(),
                    chunk.num_parts()
                )));
            }
            let parts = chunk.num_parts();
            halo_rows.extend(chunk.halo_recv_offsets().windows(2).map(|w| w[1] - w[0]));
            let row = block_nnz.len();
            block_nnz.resize(row + parts, 0);
            for block in chunk.blocks() {
                block_nnz[row + block.src_part as usize] = block.nnz() as u64;
            }
            count += 1;
        }
        let offsets = part_offsets.ok_or_else(|| bad("no chunks".into()))?;
        if count != offsets.len() - 1 {
            return Err(bad(format!(
                "{count} chunks for a partition into {} parts",
                offsets.len() - 1
            )));
        }
        Self::new(offsets.to_vec(), halo_rows, block_nnz)
    }

    /// Number of parts P.
    pub fn parts(&self) -> usize {
        self.part_offsets.len() - 1
    }

    /// Number of nodes N.
    pub fn nodes(&self) -> u64 {
        self.part_offsets[self.parts()]
    }

    /// Part offsets `[P+1]`.
    pub fn part_offsets(&self) -> &[u64] {
        &self.part_offsets
    }

    /// Rows owned by part p, `n_p`.
    pub fn part_rows(&self, p: usize) -> u64 {
        self.part_offsets[p + 1] - self.part_offsets[p]
    }

    /// Rows of `X_q` that part p's non-zeros reference (0 for q = p).
    pub fn halo_rows(&self, p: usize, q: usize) -> u64 {
        self.halo_rows[p * self.parts() + q]
    }

    /// Non-zeros of `Â[p][q]`.
    pub fn block_nnz(&self, p: usize, q: usize) -> u64 {
        self.block_nnz[p * self.parts() + q]
    }

    /// Non-zeros of part p's rows (all its blocks).
    pub fn nnz(&self, p: usize) -> u64 {
        let parts = self.parts();
        self.block_nnz[p * parts..(p + 1) * parts].iter().sum()
    }

    /// Rank p's broadcast plan.
    ///
    /// # Panics
    /// If `p ≥ P`.
    pub fn broadcast_plan(&self, p: usize) -> BroadcastPlan {
        let parts = self.parts();
        BroadcastPlan::new(
            p,
            &self.part_offsets,
            &self.block_nnz[p * parts..(p + 1) * parts],
        )
        .expect("a checked partition shape makes valid plans")
    }

    /// The P×P matrix of rows each rank receives from each other rank per forward call under
    /// `kind` (backward moves the same rows the other way).
    pub fn comm_matrix(&self, kind: ScheduleKind) -> CommMatrix {
        let parts = self.parts();
        let rows = match kind {
            ScheduleKind::Halo => self.halo_rows.clone(),
            ScheduleKind::Broadcast => (0..parts * parts)
                .map(|i| {
                    let (p, q) = (i / parts, i % parts);
                    if p == q {
                        0
                    } else {
                        self.part_rows(q)
                    }
                })
                .collect(),
        };
        CommMatrix { parts, rows }
    }

    /// Every rank's bytes per forward and backward call under `kind` with `features` columns,
    /// in rank order.
    pub fn traffic(&self, kind: ScheduleKind, features: usize) -> Vec<LayerTraffic> {
        let matrix = self.comm_matrix(kind);
        (0..self.parts())
            .map(|p| matrix.traffic(p, features))
            .collect()
    }

    /// Rank p's operator workspace under `kind` with `features` columns (as the per-rank
    /// plans' `workspace`).
    ///
    /// # Panics
    /// If `p ≥ P`.
    pub fn workspace(&self, kind: ScheduleKind, p: usize, features: usize) -> Workspace {
        match kind {
            ScheduleKind::Broadcast => self.broadcast_plan(p).workspace(features),
            ScheduleKind::Halo => {
                let parts = self.parts();
                let received: u64 = self.halo_rows[p * parts..(p + 1) * parts].iter().sum();
                let sent: u64 = (0..parts).map(|r| self.halo_rows(r, p)).sum();
                super::halo::workspace(sent, received, features)
            }
        }
    }
}

/// Rows moved per forward call between every pair of ranks: `rows(p, q)` is what p receives
/// from q (0 on the diagonal). The backward call moves the transpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommMatrix {
    parts: usize,
    rows: Vec<u64>,
}

impl CommMatrix {
    /// Number of ranks P.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Rows rank p receives from rank q per forward call.
    ///
    /// # Panics
    /// If `p` or `q` is `≥ P`.
    pub fn rows(&self, p: usize, q: usize) -> u64 {
        assert!(p < self.parts && q < self.parts, "rank out of range");
        self.rows[p * self.parts + q]
    }

    /// Rows rank p receives from all others.
    pub fn received_rows(&self, p: usize) -> u64 {
        self.rows[p * self.parts..(p + 1) * self.parts].iter().sum()
    }

    /// Rows rank q sends to all others.
    pub fn sent_rows(&self, q: usize) -> u64 {
        (0..self.parts).map(|p| self.rows[p * self.parts + q]).sum()
    }

    /// The largest entry (for scaling a colour map).
    pub fn max_rows(&self) -> u64 {
        self.rows.iter().copied().max().unwrap_or(0)
    }

    /// Rank p's bytes per forward and backward call with `features` columns.
    pub fn traffic(&self, p: usize, features: usize) -> LayerTraffic {
        LayerTraffic::symmetric(Traffic::rows(
            self.sent_rows(p),
            self.received_rows(p),
            features,
        ))
    }
}
