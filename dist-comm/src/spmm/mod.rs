//! [`DistSpmm`]: the distributed product `Y = Â·X` (forward) and `dX = Âᵀ·dY` (backward) over a
//! communicator, executing a `distspmm_core::schedule` plan on one rank's chunk.
//!
//! Rank p holds chunk p (borrowed, zero copy: a [`ChunkView`] over a memory map) and its rows
//! `X_p`; `forward` returns its rows `Y_p`, `backward` its rows `dX_p`. Every call is
//! collective: all ranks call `forward` (or `backward`) together with the same F.
//!
//! # Agreement
//! [`DistSpmm::new`] starts with one all-gather of a fixed-size record per rank (P of its chunk,
//! part id, partition fingerprint, chunk format version, N, schedule), before any other
//! collective; every rank checks all records in the same order and so fails with the same
//! [`DistSpmmError`] on any mismatch (chunks for 4 parts under 2 ranks, chunks of two runs, a
//! rank without a chunk). A rank that has no chunk to offer calls [`abstain`] instead, which
//! joins the same all-gather. Every `forward`/`backward` starts with one small all-reduce (five
//! words) agreeing on the operation and F and on whether every rank's operands fit its chunk,
//! so a wrong call on one rank is an error on all ranks rather than a hang.
//!
//! # Execution
//! - **broadcast** ([`ScheduleKind::Broadcast`]): the off-diagonal blocks are stored over
//!   compacted columns, but this schedule receives all of `X_q`, so at construction the operator
//!   derives for every non-empty block `Â[p][q]` its CSR column ids in q-local numbering
//!   (`halo_recv(q)[c]`, one `u32` per non-zero) and its CSC column pointer over all `n_q`
//!   columns (`u64[n_q+1]`); row pointers, row ids and values stay borrowed from the chunk.
//!   The loops are `BroadcastPlan`'s, with the blocking [`Broadcast`](crate::Broadcast) and one
//!   [`PointToPoint::exchange`] per backward round.
//! - **halo** ([`ScheduleKind::Halo`]): one [`PointToPoint::exchange`] per call. Receives are
//!   posted first, each peer's rows are packed and sent, the local block is multiplied while
//!   the messages travel, then remote blocks (compacted columns = rows of the received halo)
//!   are added in increasing source part as soon as each has arrived. Backward sends the
//!   partial sums for the halo rows (`spmm_transpose` over the compacted CSC) back to their
//!   owners, who add them into the rows they sent, in increasing source part.
//!
//! Additions happen in a fixed order whatever the arrival order, so both schedules are
//! bit-identical run to run (and the `local` backend is bit-identical to MPI: no reduction is
//! left to the communicator). Kernels are `distspmm_core::kernel`'s (rayon threads); only the
//! calling thread communicates.
//!
//! # Buffers and bytes
//! Buffers (on huge-page-advised mappings, as NumPy allocates large arrays) grow at the first
//! call with a given F and are reused; a call allocates nothing afterwards (the communicator
//! may). [`DistSpmm::workspace`] reports them and equals the plan's
//! prediction. [`DistSpmm::bytes_last_call`] counts the payload this rank handed to the
//! communicator in its last call, with the plan's conventions (a broadcast counts its payload
//! once per receiving rank on the root's side), so it equals `BroadcastPlan::traffic` /
//! `HaloPlan::traffic`.
//!
//! # On the GPU
//! With the feature `cuda`, `GpuDistSpmm` runs the same schedules on device buffers with
//! distspmm-cuda's kernels and an `NcclComm`, agreeing over a host communicator exactly as
//! here (see its module docs).

mod agree;
mod broadcast;
#[cfg(feature = "cuda")]
pub mod gpu;
mod halo;
mod rows;
#[cfg(test)]
mod tests;

use chunk_format::ChunkView;
use distspmm_core::kernel::KernelError;
use distspmm_core::schedule::{
    BroadcastPlan, HaloPlan, LayerTraffic, ScheduleKind, Traffic, Workspace,
};
use distspmm_core::sparse::{CscView, CsrView, DenseView, DenseViewMut, PageBuffer, SparseError};

use crate::{CommError, Communicator};

pub use agree::abstain;
#[cfg(feature = "cuda")]
pub use gpu::GpuDistSpmm;

/// What went wrong in building or calling a [`DistSpmm`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DistSpmmError {
    /// The chunks were made for another number of parts than the communicator has ranks
    /// (every rank gets this error).
    #[error("the chunks were made for {chunk_parts} parts but the communicator has {ranks} ranks")]
    PartsMismatch {
        /// P written in the chunks.
        chunk_parts: usize,
        /// Ranks in the communicator.
        ranks: usize,
    },
    /// The ranks disagree on something they must share: fingerprint, format version, N,
    /// schedule, the operation or F of a call, or a rank could not take part. Every rank gets
    /// the same message.
    #[error("{0}")]
    Disagreement(String),
    /// This rank's operands do not fit its chunk (the other ranks get a
    /// [`DistSpmmError::Disagreement`] pointing here).
    #[error("{0}")]
    Shape(String),
    /// A block of this rank's chunk cannot be viewed as a sparse matrix (the other ranks get a
    /// [`DistSpmmError::Disagreement`] pointing here).
    #[error("the block of part {part}'s chunk with columns from part {src}: {source}")]
    Block {
        /// This rank's part.
        part: usize,
        /// The block's source part.
        src: usize,
        /// What the sparse constructor found.
        source: SparseError,
    },
    /// This rank cannot allocate its communication buffers (the other ranks get a
    /// [`DistSpmmError::Disagreement`] pointing here).
    #[error("cannot allocate {bytes} bytes of communication buffers on rank {rank}: {reason}")]
    Allocation {
        /// This rank.
        rank: usize,
        /// The size asked for.
        bytes: u64,
        /// What the system said.
        reason: String,
    },
    /// A communication call failed (possibly on this rank only).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A kernel rejected its operands (a bug: shapes are checked before).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl DistSpmmError {
    /// Whether every rank of the communicator returned an error from the same call (an
    /// agreement failure); otherwise (communication or kernel errors) other ranks may still be
    /// waiting, and an MPI program should abort the job.
    pub fn is_collective(&self) -> bool {
        !matches!(self, DistSpmmError::Comm(_) | DistSpmmError::Kernel(_))
    }
}

/// Bytes moved by all calls so far, per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficTotals {
    /// All forward calls together.
    pub forward: Traffic,
    /// All backward calls together.
    pub backward: Traffic,
    /// Number of forward calls.
    pub forward_calls: u64,
    /// Number of backward calls.
    pub backward_calls: u64,
}

/// The distributed SpMM operator of one rank. See the [module docs](self).
///
/// ```
/// use chunk_format::ChunkView;
/// use dist_comm::spmm::{DistSpmm, DistSpmmError};
/// use dist_comm::Communicator;
/// use distspmm_core::schedule::ScheduleKind;
/// use distspmm_core::sparse::{DenseView, DenseViewMut};
///
/// /// One aggregation `Y_p = (Â·X)_p` on this rank (every rank calls it together).
/// fn aggregate<C: Communicator>(
///     comm: &C,
///     chunk: ChunkView<'_>, // e.g. *ChunkDir::load(rank)?.view()
///     x: &[f32],
///     f: usize,
/// ) -> Result<Vec<f32>, DistSpmmError> {
///     let mut op = DistSpmm::new(comm, chunk, ScheduleKind::Halo)?;
///     let n = op.local_rows();
///     let mut y = vec![0.0; n * f];
///     let x = DenseView::from_row_major(x, n, f).expect("x holds n_p × F values");
///     op.forward(x, DenseViewMut::from_row_major(&mut y[..], n, f).expect("n_p × F"))?;
///     assert_eq!(op.bytes_last_call(), op.predicted_traffic(f).forward);
///     Ok(y)
/// }
/// ```
#[derive(Debug)]
pub struct DistSpmm<'a, C: Communicator> {
    comm: &'a C,
    chunk: ChunkView<'a>,
    diagonal: CsrView<'a, f32>,
    diagonal_t: CscView<'a, f32>,
    state: State<'a>,
    last: Traffic,
    totals: TrafficTotals,
}

/// The schedule-specific part: plan, derived structure and buffers.
#[derive(Debug)]
enum State<'a> {
    Broadcast(broadcast::BroadcastState<'a>),
    Halo(halo::HaloState<'a>),
}

/// Which collective operation a call is (agreed on per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Forward = 1,
    Backward = 2,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Forward => "forward",
            Op::Backward => "backward",
        }
    }
}

/// Message tags: one per direction, so a fast rank's next call never matches a slow rank's
/// pending receive of another kind.
const TAG_FORWARD: crate::Tag = 0x5E1;
const TAG_BACKWARD: crate::Tag = 0x5E2;

impl<'a, C: Communicator> DistSpmm<'a, C> {
    /// Builds rank `comm.rank()`'s operator for `chunk` under `schedule` (collective: every rank
    /// calls it, or [`abstain`], together).
    ///
    /// Derives what the schedule needs from the chunk first (a local failure is reported to all
    /// ranks), then agrees with all ranks as described in the [module docs](self).
    ///
    /// # Errors
    /// [`DistSpmmError::PartsMismatch`] / [`DistSpmmError::Disagreement`] (on every rank) when
    /// the ranks' chunks do not form one partition into `comm.size()` parts with `chunk` being
    /// part `comm.rank()`, or they chose different schedules; [`DistSpmmError::Block`] on the
    /// rank whose chunk has an unusable block; communication errors.
    pub fn new(
        comm: &'a C,
        chunk: ChunkView<'a>,
        schedule: ScheduleKind,
    ) -> Result<Self, DistSpmmError> {
        let built = Self::build(comm, chunk, schedule);
        agree::agree_on_chunk(comm, &chunk, schedule, built.is_ok())?;
        built
    }

    fn build(
        comm: &'a C,
        chunk: ChunkView<'a>,
        schedule: ScheduleKind,
    ) -> Result<Self, DistSpmmError> {
        let part = chunk.part_id();
        let block = chunk.diagonal_block();
        let n = chunk.num_local_nodes();
        let err = |source| DistSpmmError::Block {
            part,
            src: part,
            source,
        };
        let diagonal =
            CsrView::new(n, n, block.csr_rowptr, block.csr_cols, block.csr_vals).map_err(err)?;
        let diagonal_t =
            CscView::new(n, n, block.csc_colptr, block.csc_rows, block.csc_vals).map_err(err)?;
        let state = match schedule {
            ScheduleKind::Broadcast => State::Broadcast(broadcast::BroadcastState::new(&chunk)?),
            ScheduleKind::Halo => State::Halo(halo::HaloState::new(&chunk)?),
        };
        Ok(Self {
            comm,
            chunk,
            diagonal,
            diagonal_t,
            state,
            last: Traffic::default(),
            totals: TrafficTotals::default(),
        })
    }

    /// `Y_p = (Â·X)_p` from this rank's `X_p` (`n_p × F`, any leading dimension) into `Y_p`
    /// (`n_p × F`, overwritten). Collective.
    ///
    /// # Errors
    /// [`DistSpmmError::Shape`] on this rank and [`DistSpmmError::Disagreement`] on the others
    /// when this rank's operands do not fit; [`DistSpmmError::Disagreement`] on every rank when
    /// ranks call with different F or some call `backward` instead; communication errors.
    pub fn forward(
        &mut self,
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.call(Op::Forward, x, y)
    }

    /// `dX_p = (Âᵀ·dY)_p` from this rank's `dY_p` (`n_p × F`) into `dX_p` (`n_p × F`,
    /// overwritten). Collective.
    ///
    /// # Errors
    /// As [`DistSpmm::forward`].
    pub fn backward(
        &mut self,
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.call(Op::Backward, dy, dx)
    }

    fn call(
        &mut self,
        op: Op,
        input: DenseView<'_, f32>,
        output: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        let features = input.cols();
        // Everything that can fail locally happens before the agreement, which tells every
        // rank whether all are ready.
        let rank = self.rank();
        let ready = self
            .check_operands(op, &input, &output)
            .and_then(|()| match &mut self.state {
                State::Broadcast(s) => s.reserve(op, features),
                State::Halo(s) => s.reserve(features),
            })
            .map_err(|e| match e {
                DistSpmmError::Allocation { bytes, reason, .. } => DistSpmmError::Allocation {
                    rank,
                    bytes,
                    reason,
                },
                e => e,
            });
        agree::agree_on_call(self.comm, op, features, ready)?;
        let traffic = if features == 0 {
            Traffic::default()
        } else {
            let (comm, diagonal, diagonal_t) = (self.comm, &self.diagonal, &self.diagonal_t);
            match (&mut self.state, op) {
                (State::Broadcast(s), Op::Forward) => s.forward(comm, diagonal, input, output)?,
                (State::Broadcast(s), Op::Backward) => {
                    s.backward(comm, diagonal_t, input, output)?
                }
                (State::Halo(s), Op::Forward) => s.forward(comm, diagonal, input, output)?,
                (State::Halo(s), Op::Backward) => s.backward(comm, diagonal_t, input, output)?,
            }
        };
        self.last = traffic;
        self.totals.record(op, traffic);
        Ok(())
    }

    fn check_operands(
        &self,
        op: Op,
        input: &DenseView<'_, f32>,
        output: &DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        check_shapes(
            op,
            self.rank(),
            self.local_rows(),
            (input.rows(), input.cols()),
            (output.rows(), output.cols()),
        )
    }

    /// The schedule this operator runs.
    pub fn schedule(&self) -> ScheduleKind {
        match self.state {
            State::Broadcast(_) => ScheduleKind::Broadcast,
            State::Halo(_) => ScheduleKind::Halo,
        }
    }

    /// This rank (= its part p).
    pub fn rank(&self) -> usize {
        self.chunk.part_id()
    }

    /// Number of ranks P.
    pub fn parts(&self) -> usize {
        self.chunk.num_parts()
    }

    /// Rows this rank owns, `n_p` (rows of X, Y, dY and dX).
    pub fn local_rows(&self) -> usize {
        self.chunk.num_local_nodes()
    }

    /// The communicator.
    pub fn comm(&self) -> &'a C {
        self.comm
    }

    /// The chunk.
    pub fn chunk(&self) -> &ChunkView<'a> {
        &self.chunk
    }

    /// Payload bytes this rank sent and received in its last `forward` or `backward` call.
    pub fn bytes_last_call(&self) -> Traffic {
        self.last
    }

    /// Payload bytes and calls so far, per direction.
    pub fn bytes_total(&self) -> TrafficTotals {
        self.totals
    }

    /// The bytes the plan predicts for one forward and one backward call with `features`
    /// columns (what [`DistSpmm::bytes_last_call`] will measure).
    pub fn predicted_traffic(&self, features: usize) -> LayerTraffic {
        predicted_traffic(&self.chunk, self.schedule(), features)
    }

    /// The memory this operator holds now beside the chunk (buffers sized for the largest F
    /// called so far, and derived index arrays).
    pub fn workspace(&self) -> Workspace {
        match &self.state {
            State::Broadcast(s) => s.workspace(),
            State::Halo(s) => s.workspace(),
        }
    }
}

impl TrafficTotals {
    /// Adds one call's bytes.
    fn record(&mut self, op: Op, traffic: Traffic) {
        match op {
            Op::Forward => {
                self.forward += traffic;
                self.forward_calls += 1;
            }
            Op::Backward => {
                self.backward += traffic;
                self.backward_calls += 1;
            }
        }
    }
}

/// The plan's bytes for one forward and one backward call of `schedule` on `chunk`.
fn predicted_traffic(
    chunk: &ChunkView<'_>,
    schedule: ScheduleKind,
    features: usize,
) -> LayerTraffic {
    match schedule {
        ScheduleKind::Broadcast => BroadcastPlan::from_chunk(chunk).traffic(features),
        ScheduleKind::Halo => HaloPlan::from_chunk(chunk).traffic(features),
    }
}

/// The shape rule of every call: input and output are `n_p × F` (rows, columns given).
fn check_shapes(
    op: Op,
    rank: usize,
    n: usize,
    input: (usize, usize),
    output: (usize, usize),
) -> Result<(), DistSpmmError> {
    let names = match op {
        Op::Forward => ("X", "Y"),
        Op::Backward => ("dY", "dX"),
    };
    let f = input.1;
    for (name, (rows, cols)) in [(names.0, input), (names.1, output)] {
        if rows != n || cols != f {
            return Err(DistSpmmError::Shape(format!(
                "{} on rank {rank}: {name} is {rows} × {cols} but part {rank} owns {n} rows and \
                 {} has {f} columns",
                op.name(),
                names.0
            )));
        }
    }
    Ok(())
}

/// A communication buffer on its own huge-page-advised mapping (the halo rows are gathered at
/// random by the kernels, like X). It grows to the largest size asked for and never shrinks,
/// so a later call with the same or a smaller F allocates nothing.
#[derive(Debug, Default)]
struct Buffer(Option<PageBuffer<f32>>);

impl Buffer {
    /// Makes room for `len` values.
    fn reserve(&mut self, len: usize) -> Result<(), DistSpmmError> {
        if self.len() < len {
            self.0 = None; // release the old mapping first
            let buffer = PageBuffer::zeroed(len).map_err(|e| DistSpmmError::Allocation {
                rank: 0,
                bytes: value_bytes(len),
                reason: e.to_string(),
            })?;
            self.0 = Some(buffer);
        }
        Ok(())
    }

    /// The first `len` values (`len` at most what was reserved).
    fn get(&mut self, len: usize) -> &mut [f32] {
        match &mut self.0 {
            Some(b) => &mut b[..len],
            None => &mut [],
        }
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len())
    }
}

/// Bytes of a buffer of `len` values.
fn value_bytes(len: usize) -> u64 {
    len as u64 * distspmm_core::schedule::VALUE_BYTES
}
