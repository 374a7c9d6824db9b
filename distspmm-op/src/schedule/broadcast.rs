//! [`BroadcastPlan`]: the seed's schedule (CAGNET 1D), one broadcast per part.

use std::format;
use std::vec::Vec;

use chunk_format::ChunkView;

use super::{LayerTraffic, ScheduleError, Traffic, Workspace, VALUE_BYTES};

/// The broadcast/accumulate schedule as seen by one rank p.
///
/// ```text
/// forward  (Y_p = Σ_q Â[p][q]·X_q):
///     for q in 0..P:
///         rank q broadcasts X_q                       (n_q·F values to every other rank)
///         Y_p += Â[p][q]·X_q                          (q-local columns)
/// backward (dX_q = Σ_p Â[p][q]ᵀ·dY_p):
///     for q in 0..P:
///         every rank p ≠ q sends Â[p][q]ᵀ·dY_p to q   (n_q·F values)
///         rank q: dX_q = Â[q][q]ᵀ·dY_q + Σ_{p≠q, increasing} received_p
/// ```
///
/// The off-diagonal blocks of a chunk are stored over compacted columns (positions in the halo
/// receive list from q); this schedule receives all of `X_q`, so the operator multiplies with
/// q-local column ids, which it derives once at construction ([`BroadcastPlan::workspace`]
/// counts those arrays).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastPlan {
    rank: usize,
    /// `n_q` for every part q.
    part_rows: Vec<u64>,
    /// Non-zeros of `Â[p][q]` for every part q (0 where p's chunk has no such block).
    block_nnz: Vec<u64>,
}

/// One round of the forward loop: `root` broadcasts its `rows` rows; this rank multiplies its
/// block of `block_nnz` non-zeros with them (nothing to multiply when 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BroadcastStep {
    /// The broadcasting rank q.
    pub root: usize,
    /// `n_q`, rows of `X_q`.
    pub rows: u64,
    /// Non-zeros of this rank's block `Â[p][q]`.
    pub block_nnz: u64,
}

impl BroadcastPlan {
    /// The plan of the rank that holds `chunk`.
    pub fn from_chunk(chunk: &ChunkView<'_>) -> Self {
        let offsets = chunk.part_offsets();
        let mut block_nnz = std::vec![0u64; chunk.num_parts()];
        for block in chunk.blocks() {
            block_nnz[block.src_part as usize] = block.nnz() as u64;
        }
        Self {
            rank: chunk.part_id(),
            part_rows: offsets.windows(2).map(|w| w[1] - w[0]).collect(),
            block_nnz,
        }
    }

    /// The plan of rank `rank` from the part offsets `[P+1]` and the non-zeros of its blocks
    /// `Â[rank][q]` for every q (`[P]`).
    ///
    /// # Errors
    /// [`ScheduleError::Shape`] when the lengths disagree, the offsets decrease, or `rank ≥ P`.
    pub fn new(
        rank: usize,
        part_offsets: &[u64],
        block_nnz: &[u64],
    ) -> Result<Self, ScheduleError> {
        let parts = part_offsets.len().saturating_sub(1);
        let bad = |detail| ScheduleError::Shape {
            what: "broadcast plan",
            detail,
        };
        if parts == 0 || rank >= parts || block_nnz.len() != parts {
            return Err(bad(format!(
                "rank {rank} with {} part offsets and {} block counts (need P+1 and P, rank < P)",
                part_offsets.len(),
                block_nnz.len()
            )));
        }
        if part_offsets.windows(2).any(|w| w[1] < w[0]) {
            return Err(bad("the part offsets decrease".into()));
        }
        Ok(Self {
            rank,
            part_rows: part_offsets.windows(2).map(|w| w[1] - w[0]).collect(),
            block_nnz: block_nnz.to_vec(),
        })
    }

    /// This rank p.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks P.
    pub fn parts(&self) -> usize {
        self.part_rows.len()
    }

    /// The forward rounds, one per root q = 0..P−1 (the backward runs the same roots).
    pub fn steps(&self) -> impl ExactSizeIterator<Item = BroadcastStep> + '_ {
        (0..self.parts()).map(|root| BroadcastStep {
            root,
            rows: self.part_rows[root],
            block_nnz: self.block_nnz[root],
        })
    }

    /// Bytes this rank sends and receives per forward and backward call with `features`
    /// columns: it receives every other part's rows, and as a root delivers its own `n_p` rows
    /// to each of the P−1 others.
    pub fn traffic(&self, features: usize) -> LayerTraffic {
        let others = self.parts() as u64 - 1;
        let own = self.part_rows[self.rank];
        let all: u64 = self.part_rows.iter().sum();
        LayerTraffic::symmetric(Traffic::rows(others * own, all - own, features))
    }

    /// What the operator allocates: a panel of `max_q n_q` rows (the broadcast buffer forward,
    /// the outgoing contribution backward; none when P = 1), an inbox of `(P−1)·n_p` rows (the
    /// P−1 contributions to this rank's rows, backward), and for every non-empty off-diagonal
    /// block its column ids in q-local numbering (`u32` per non-zero) and its CSC column
    /// pointer over all `n_q` columns (`u64[n_q + 1]`).
    pub fn workspace(&self, features: usize) -> Workspace {
        let parts = self.parts() as u64;
        let panel = if parts > 1 {
            self.part_rows.iter().copied().max().unwrap_or(0)
        } else {
            0
        };
        let inbox = (parts - 1) * self.part_rows[self.rank];
        let structure = self
            .steps()
            .filter(|s| s.root != self.rank && s.block_nnz > 0)
            .map(|s| 4 * s.block_nnz + 8 * (s.rows + 1))
            .sum();
        Workspace {
            buffers: (panel + inbox) * features as u64 * VALUE_BYTES,
            structure,
        }
    }
}
