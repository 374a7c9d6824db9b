//! The communication schedules of the distributed product `Y = Â·X`, as data: who sends which
//! rows of X to whom, in what order, and how many bytes that is — without moving a byte.
//!
//! Rank p owns the rows `X_p` (`n_p × F`) and the row block `Â[p][·]`, split by source part into
//! blocks `Â[p][q]` (see `docs/design.md`). A schedule says how the `X_q` that p's blocks need
//! reach p (forward, `Y_p = Σ_q Â[p][q]·X_q`) and how the contributions `Â[p][q]ᵀ·dY_p` reach
//! q (backward, `dX_q = Σ_p Â[p][q]ᵀ·dY_p`). The communicator moves the bytes and the kernel
//! multiplies (`crate::DistSpmm` executes these plans); here they are plain numbers, so
//! `distspmm plan` can count any P up to thousands of ranks without running anything.
//!
//! - [`BroadcastPlan`] — the seed's DistSpmm, CAGNET's 1D algorithm. Forward: for q = 0..P−1,
//!   rank q broadcasts `X_q` and every rank does `Y_p += Â[p][q]·X_q`. Backward: for
//!   q = 0..P−1, every rank p ≠ q sends its contribution `Â[p][q]ᵀ·dY_p` (all `n_q` rows) to q,
//!   which adds them to its own `Â[q][q]ᵀ·dY_q` in increasing p. Every rank receives
//!   `(N − n_p)·F` values per forward call, whatever the graph looks like.
//! - [`HaloPlan`] — sparsity-aware. Forward: q sends p only the rows of `X_q` that p's non-zeros
//!   reference (the chunk's halo lists), all peers at once; p computes `Â[p][p]·X_p` while the
//!   messages travel and adds `Â[p][q]·H_q` for each received halo `H_q`. Backward runs the
//!   lists in reverse: p computes `Â[p][q]ᵀ·dY_p` for q's halo rows only (the CSC of the
//!   compacted block) and sends them back; q adds them into the rows it had sent.
//!
//! Both orders of addition are fixed (increasing source part), so results are bit-identical run
//! to run whatever order messages arrive in.
//!
//! **Bytes.** Every count is payload: `f32` values moved between two different ranks (a rank
//! never sends to itself). A broadcast counts its payload once per receiving rank, on the
//! root's sent side and on each receiver's received side, so that over all ranks bytes sent
//! equal bytes received for every schedule. Backward traffic is forward traffic with sent and
//! received swapped, for both schedules. Messages in a 16-bit [`Precision`] move the same
//! values in half the bytes ([`LayerTraffic::in_precision`]).
//!
//! Per rank the plans are built from a chunk ([`BroadcastPlan::from_chunk`],
//! [`HaloPlan::from_chunk`]); for all ranks at once from partition-level counts
//! ([`PartitionShape`]: part sizes, halo rows and non-zeros per block pair), which is what a
//! dry run needs.

mod broadcast;
mod halo;
mod shape;
#[cfg(test)]
mod tests;

use core::fmt;
use core::ops::{Add, AddAssign};

pub use broadcast::{BroadcastPlan, BroadcastStep};
pub use halo::HaloPlan;
pub use shape::{CommMatrix, PartitionShape};

pub use distspmm_sparse::kernel::convert::Precision;

/// Bytes of one value of X (`f32`).
pub const VALUE_BYTES: u64 = 4;

/// Which schedule a distributed product follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScheduleKind {
    /// [`BroadcastPlan`]: every rank receives every other rank's rows.
    Broadcast,
    /// [`HaloPlan`]: every rank receives only the rows its non-zeros reference.
    Halo,
}

impl ScheduleKind {
    /// Both schedules, in a fixed order.
    pub const ALL: [ScheduleKind; 2] = [ScheduleKind::Broadcast, ScheduleKind::Halo];

    /// Lower-case name (`broadcast`, `halo`), as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Broadcast => "broadcast",
            ScheduleKind::Halo => "halo",
        }
    }

    /// A stable small code (for exchanging the choice between ranks).
    pub fn code(self) -> u64 {
        match self {
            ScheduleKind::Broadcast => 1,
            ScheduleKind::Halo => 2,
        }
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Payload bytes one rank sends and receives in one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Traffic {
    /// Bytes sent to other ranks.
    pub sent: u64,
    /// Bytes received from other ranks.
    pub received: u64,
}

impl Traffic {
    /// Traffic for `sent_rows` and `received_rows` rows of `features` values each.
    pub fn rows(sent_rows: u64, received_rows: u64, features: usize) -> Self {
        let row = features as u64 * VALUE_BYTES;
        Self {
            sent: sent_rows * row,
            received: received_rows * row,
        }
    }

    /// The same values on the wire in `precision` (the counts above are of `f32` values, so
    /// this is exact).
    pub fn in_precision(self, precision: Precision) -> Self {
        let scale = |bytes: u64| bytes / VALUE_BYTES * precision.value_bytes();
        Self {
            sent: scale(self.sent),
            received: scale(self.received),
        }
    }

    /// The same traffic in the opposite direction (sent and received swapped).
    pub fn reversed(self) -> Self {
        Self {
            sent: self.received,
            received: self.sent,
        }
    }
}

impl Add for Traffic {
    type Output = Traffic;

    fn add(self, rhs: Traffic) -> Traffic {
        Traffic {
            sent: self.sent + rhs.sent,
            received: self.received + rhs.received,
        }
    }
}

impl AddAssign for Traffic {
    fn add_assign(&mut self, rhs: Traffic) {
        *self = *self + rhs;
    }
}

/// One rank's traffic for one layer: a forward and a backward call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LayerTraffic {
    /// One forward call (`Y = Â·X`).
    pub forward: Traffic,
    /// One backward call (`dX = Âᵀ·dY`).
    pub backward: Traffic,
}

impl LayerTraffic {
    /// A layer whose backward call is the forward call reversed (true of both schedules).
    pub fn symmetric(forward: Traffic) -> Self {
        Self {
            forward,
            backward: forward.reversed(),
        }
    }

    /// Both calls with their values on the wire in `precision`
    /// ([`Traffic::in_precision`]).
    pub fn in_precision(self, precision: Precision) -> Self {
        Self {
            forward: self.forward.in_precision(precision),
            backward: self.backward.in_precision(precision),
        }
    }
}

/// Memory one rank's operator holds beside its chunk and the caller's X and Y.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Workspace {
    /// Communication buffers (`f32`), proportional to F; allocated at the first call with a
    /// given F and reused.
    pub buffers: u64,
    /// Index arrays derived from the chunk at construction (independent of F).
    pub structure: u64,
}

impl Workspace {
    /// The workspace of an operator whose messages travel in `precision`: a 16-bit format
    /// adds, beside each `f32` buffer, its narrowed copy on the wire (2 bytes per value).
    pub fn in_precision(self, precision: Precision) -> Self {
        let wire = match precision.half() {
            Some(_) => self.buffers / VALUE_BYTES * precision.value_bytes(),
            None => 0,
        };
        Self {
            buffers: self.buffers + wire,
            structure: self.structure,
        }
    }

    /// Both together.
    pub fn total(&self) -> u64 {
        self.buffers + self.structure
    }
}

/// Partition-level counts that do not describe a valid partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A count array has the wrong length or the offsets are not a partition of `0..N`.
    #[error("{what}: {detail}")]
    Shape {
        /// Which input.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}
