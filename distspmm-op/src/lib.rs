//! The distributed SpMM operator: `Y = Â·X` (forward) and `dX = Âᵀ·dY` (backward) of one rank
//! over a communicator, executing a `distspmm_core::schedule` plan on the rank's chunk.
//!
//! Rank p holds chunk p (borrowed, zero copy: a [`ChunkView`] over a memory map) and its rows
//! `X_p`; `forward` returns its rows `Y_p`, `backward` its rows `dX_p`. Every call is
//! collective: all ranks call `forward` (or `backward`) together with the same F.
//!
//! # Layers
//! - **schedules** ([`halo`], [`broadcast`]): each direction is a short [`Program`] built once
//!   per rank from the chunk — pack rows, exchange them, multiply blocks, add in a fixed order
//!   — over names (operands, buffer regions, blocks), not memory. They are written once.
//! - **backends** ([`Backend`]): the primitives a program needs (pack rows, local SpMM / SpMMᵀ
//!   into a block, ordered scatter-add, the grouped exchange, broadcast, lane ordering). The CPU
//!   backend ([`DistSpmm`]) runs them with distspmm-core's kernels over any communicator with
//!   the capabilities it uses ([`Broadcast`], [`PointToPoint`], and [`AllGather`] +
//!   [`AllReduce`] for the agreement); the GPU backend (`GpuDistSpmm`, feature `cuda`) with
//!   distspmm-cuda's kernels on two streams and an `NcclComm`.
//! - **agreement**: before any other collective the ranks agree on the partition, and every
//!   call agrees on the operation and F (below).
//! - **operands** ([`operands`]): the extent, alignment and overlap rules of operands given as
//!   memory (the GPU operator's raw calls and the C ABI).
//!
//! # Agreement
//! [`DistSpmm::new`] starts with one all-gather of a fixed-size record per rank (P of its chunk,
//! part id, partition fingerprint, chunk format version, N, schedule, the chunk's checksum and
//! the content digest its directory lists, [`ChunkSource::listed`]), before any other
//! collective; every rank checks all records in the same order and so fails with the same
//! [`DistSpmmError`] on any mismatch (chunks for 4 parts under 2 ranks, chunks of two runs,
//! copies of one partition of different data, a rank without a chunk). A rank that has no chunk to offer calls [`abstain`] instead, which
//! joins the same all-gather. Every `forward`/`backward` starts with one small all-reduce (five
//! words) agreeing on the operation and F and on whether every rank's operands fit its chunk,
//! so a wrong call on one rank is an error on all ranks rather than a hang.
//!
//! # Execution on the CPU
//! - **halo** ([`ScheduleKind::Halo`]): one [`PointToPoint::exchange`] per call. Each peer's
//!   rows are packed, receives then sends are posted, the local block is multiplied while the
//!   messages travel, then remote blocks (compacted columns = rows of the received halo) are
//!   added in increasing source part, each waited for when it is needed. Backward sends the
//!   partial sums for the halo rows (`spmm_transpose` over the compacted CSC) back to their
//!   owners, who add them into the rows they sent, in increasing source part.
//! - **broadcast** ([`ScheduleKind::Broadcast`]): the off-diagonal blocks are stored over
//!   compacted columns, but this schedule receives all of `X_q`, so at construction the operator
//!   derives for every non-empty block `Â[p][q]` its CSR column ids in q-local numbering
//!   (`halo_recv(q)[c]`, one `u32` per non-zero) and its CSC column pointer over all `n_q`
//!   columns (`u64[n_q+1]`); row pointers, row ids and values stay borrowed from the chunk.
//!   The loops are `BroadcastPlan`'s, with the blocking [`Broadcast`] and one
//!   [`PointToPoint::exchange`] per backward round.
//!
//! Additions happen in a fixed order whatever the arrival order, so both schedules are
//! bit-identical run to run (and the `local` backend is bit-identical to MPI: no reduction is
//! left to the communicator). Kernels are `distspmm_core::kernel`'s (rayon threads); only the
//! calling thread communicates. The chunk's blocks are viewed without re-validation: parsing
//! the chunk checked them (see `blocks`).
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
//! With the feature `cuda`, `GpuDistSpmm` runs the same programs on device buffers with
//! distspmm-cuda's kernels and an `NcclComm`, agreeing over a host communicator exactly as
//! here (see its module docs).

mod agree;
pub mod backend;
mod blocks;
pub mod broadcast;
mod chunk_source;
mod cpu;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod halo;
mod layout;
#[cfg(test)]
mod mock;
mod open;
pub mod operands;
#[cfg(test)]
mod tests;

use std::ops::Deref;

use chunk_format::ChunkView;
pub use dist_comm::agree::PartsMismatch;
use dist_comm::{AllGather, AllReduce, Broadcast, CommError, PointToPoint};
use distspmm_core::kernel::KernelError;
use distspmm_core::schedule::{
    BroadcastPlan, HaloPlan, LayerTraffic, ScheduleKind, Traffic, Workspace,
};
use distspmm_core::sparse::{DenseView, DenseViewMut, PageBuffer};

pub use agree::abstain;
pub use backend::{Backend, Program};
pub use chunk_source::ChunkSource;
#[cfg(feature = "cuda")]
pub use gpu::GpuDistSpmm;
pub use open::{open_rank_chunk, OpenError, RankChunk};
pub use operands::{Operand, OperandError};

use backend::{buffer_rows, moved_rows, run, Buf};
use blocks::QLocalBlock;
use cpu::{CpuBlocks, CpuCall, CpuMatrices};
use layout::HaloLayout;

/// What went wrong in building or calling a [`DistSpmm`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DistSpmmError {
    /// The chunks were made for another number of parts than the communicator has ranks
    /// (every rank gets this error).
    #[error(transparent)]
    PartsMismatch(#[from] PartsMismatch),
    /// The ranks disagree on something they must share: fingerprint, format version, N,
    /// schedule, the operation or F of a call, or a rank could not take part. Every rank gets
    /// the same message.
    #[error("{0}")]
    Disagreement(String),
    /// This rank's operands do not fit its chunk (the other ranks get a
    /// [`DistSpmmError::Disagreement`] pointing here).
    #[error("{0}")]
    Shape(String),
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
    /// A program and a backend disagree about the memory it names (a bug in this crate).
    #[error("internal error of the distributed SpMM: {0}")]
    Internal(String),
}

impl DistSpmmError {
    /// Whether every rank of the communicator returned an error from the same call (an
    /// agreement failure); otherwise (communication, kernel or internal errors) other ranks
    /// may still be waiting, and an MPI program should abort the job.
    pub fn is_collective(&self) -> bool {
        !matches!(
            self,
            DistSpmmError::Comm(_) | DistSpmmError::Kernel(_) | DistSpmmError::Internal(_)
        )
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

    /// The names of the input and output in messages.
    fn operand_names(self) -> (&'static str, &'static str) {
        match self {
            Op::Forward => ("X", "Y"),
            Op::Backward => ("dY", "dX"),
        }
    }
}

/// Message tags: one per direction, so a fast rank's next call never matches a slow rank's
/// pending receive of another kind.
const TAG_FORWARD: dist_comm::Tag = 0x5E1;
const TAG_BACKWARD: dist_comm::Tag = 0x5E2;

/// What one rank runs under a schedule: the two programs and the halo layout they name.
#[derive(Debug)]
struct Schedule {
    kind: ScheduleKind,
    rank: usize,
    parts: usize,
    forward: Program,
    backward: Program,
    /// Halo: who sends which rows (the send lists concatenated are what `Rows::SendLists`
    /// names). Broadcast: empty.
    layout: HaloLayout,
}

impl Schedule {
    fn new(chunk: &ChunkView<'_>, kind: ScheduleKind) -> Result<Self, DistSpmmError> {
        let (rank, parts) = (chunk.part_id(), chunk.num_parts());
        let (forward, backward, layout) = match kind {
            ScheduleKind::Halo => {
                let layout = HaloLayout::new(chunk)?;
                (halo::forward(&layout), halo::backward(&layout), layout)
            }
            ScheduleKind::Broadcast => {
                let plan = BroadcastPlan::from_chunk(chunk);
                let mut has_block = vec![false; parts];
                for b in chunk.blocks().filter(|b| b.src_part as usize != rank) {
                    has_block[b.src_part as usize] = true;
                }
                let n = chunk.num_local_nodes();
                (
                    broadcast::forward(&plan, &has_block),
                    broadcast::backward(&plan, &has_block, n),
                    HaloLayout::default(),
                )
            }
        };
        Ok(Self {
            kind,
            rank,
            parts,
            forward,
            backward,
            layout,
        })
    }

    fn program(&self, op: Op) -> &Program {
        match op {
            Op::Forward => &self.forward,
            Op::Backward => &self.backward,
        }
    }

    /// Rows of the two buffers a call of `op` needs: the packed buffer holds what either
    /// direction packs (so it is sized once), the halo buffer what this direction receives.
    fn buffer_rows(&self, op: Op) -> [usize; 2] {
        let (fwd, bwd) = (buffer_rows(&self.forward), buffer_rows(&self.backward));
        let packed = Buf::Packed as usize;
        let halo = Buf::Halo as usize;
        let mut rows = [0; 2];
        rows[packed] = fwd[packed].max(bwd[packed]);
        rows[halo] = buffer_rows(self.program(op))[halo];
        rows
    }

    /// The payload of one call of `op` with `features` columns.
    fn traffic(&self, op: Op, features: usize) -> Traffic {
        let (sent, received) = moved_rows(self.program(op), self.rank, self.parts);
        Traffic::rows(sent, received, features)
    }
}

/// The distributed SpMM operator of one rank on the CPU. See the [crate docs](crate).
///
/// ```
/// use chunk_format::ChunkView;
/// use dist_comm::{AllGather, AllReduce, Broadcast, PointToPoint};
/// use distspmm_core::schedule::ScheduleKind;
/// use distspmm_core::sparse::{DenseView, DenseViewMut};
/// use distspmm_op::{DistSpmm, DistSpmmError};
///
/// /// One aggregation `Y_p = (Â·X)_p` on this rank (every rank calls it together).
/// fn aggregate<C: AllGather + AllReduce + Broadcast + PointToPoint>(
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
///
/// The operator holds its communicator as `C` (anything that dereferences to one: `&comm`, an
/// `Rc` or `Arc` of it) and its chunk as `K` (a [`ChunkSource`]: a borrowed `ChunkView`, or an
/// owner of the mapping such as `Arc<MappedChunk>`), so a long-lived holder such as the C ABI
/// keeps both alive by ownership.
#[derive(Debug)]
pub struct DistSpmm<C, K> {
    comm: C,
    chunk: K,
    blocks: CpuBlocks,
    schedule: Schedule,
    /// [`Buf::Packed`].
    packed: Buffer,
    /// [`Buf::Halo`].
    halo: Buffer,
    last: Traffic,
    totals: TrafficTotals,
}

impl<C, K> DistSpmm<C, K>
where
    C: Deref,
    C::Target: AllGather + AllReduce + Broadcast + PointToPoint + Sized,
    K: ChunkSource,
{
    /// Builds rank `comm.rank()`'s operator for `chunk` under `schedule` (collective: every rank
    /// calls it, or [`abstain`], together).
    ///
    /// Derives what the schedule needs from the chunk first (a local failure is reported to all
    /// ranks), then agrees with all ranks as described in the [crate docs](crate).
    ///
    /// # Errors
    /// [`DistSpmmError::PartsMismatch`] / [`DistSpmmError::Disagreement`] (on every rank) when
    /// the ranks' chunks do not form one partition into `comm.size()` parts with `chunk` being
    /// part `comm.rank()`, or they chose different schedules; communication errors.
    pub fn new(comm: C, chunk: K, schedule: ScheduleKind) -> Result<Self, DistSpmmError> {
        let view = chunk.chunk();
        let built = Self::build(&view, schedule);
        agree::agree_on_chunk(&*comm, &view, chunk.listed(), schedule, built.is_ok())?;
        let (blocks, schedule) = built?;
        Ok(Self {
            comm,
            chunk,
            blocks,
            schedule,
            packed: Buffer::default(),
            halo: Buffer::default(),
            last: Traffic::default(),
            totals: TrafficTotals::default(),
        })
    }

    /// What the schedule needs from the chunk (local).
    fn build(
        chunk: &ChunkView<'_>,
        kind: ScheduleKind,
    ) -> Result<(CpuBlocks, Schedule), DistSpmmError> {
        let blocks = CpuBlocks {
            remote: match kind {
                ScheduleKind::Halo => blocks::remote_indices(chunk),
                ScheduleKind::Broadcast => Vec::new(),
            },
            q_local: match kind {
                ScheduleKind::Halo => Vec::new(),
                ScheduleKind::Broadcast => blocks::q_local(chunk),
            },
        };
        Ok((blocks, Schedule::new(chunk, kind)?))
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
        let f = input.cols();
        // Everything that can fail locally happens before the agreement, which tells every
        // rank whether all are ready.
        let rank = self.rank();
        let rows = self.schedule.buffer_rows(op);
        let ready = check_shapes(
            op,
            rank,
            self.local_rows(),
            (input.rows(), input.cols()),
            (output.rows(), output.cols()),
        )
        .and_then(|()| self.packed.reserve(rows[Buf::Packed as usize] * f))
        .and_then(|()| self.halo.reserve(rows[Buf::Halo as usize] * f))
        .map_err(|e| match e {
            DistSpmmError::Allocation { bytes, reason, .. } => DistSpmmError::Allocation {
                rank,
                bytes,
                reason,
            },
            e => e,
        });
        agree::agree_on_call(&*self.comm, op, f, ready)?;
        let traffic = if f == 0 {
            Traffic::default()
        } else {
            let mut call = CpuCall {
                comm: &*self.comm,
                m: CpuMatrices {
                    chunk: self.chunk.chunk(),
                    blocks: &self.blocks,
                },
                send_rows: &self.schedule.layout.send_rows,
                x: input,
                y: output,
                packed: self.packed.get(rows[Buf::Packed as usize] * f),
                halo: self.halo.get(rows[Buf::Halo as usize] * f),
                f,
            };
            run(&mut call, self.schedule.program(op))?;
            self.schedule.traffic(op, f)
        };
        self.last = traffic;
        self.totals.record(op, traffic);
        Ok(())
    }

    /// The schedule this operator runs.
    pub fn schedule(&self) -> ScheduleKind {
        self.schedule.kind
    }

    /// The program of one direction (`backward` false: forward), for inspection.
    pub fn program(&self, backward: bool) -> &Program {
        self.schedule
            .program(if backward { Op::Backward } else { Op::Forward })
    }

    /// This rank (= its part p).
    pub fn rank(&self) -> usize {
        self.chunk.chunk().part_id()
    }

    /// Number of ranks P.
    pub fn parts(&self) -> usize {
        self.chunk.chunk().num_parts()
    }

    /// Rows this rank owns, `n_p` (rows of X, Y, dY and dX).
    pub fn local_rows(&self) -> usize {
        self.chunk.chunk().num_local_nodes()
    }

    /// The communicator.
    pub fn comm(&self) -> &C::Target {
        &self.comm
    }

    /// The chunk.
    pub fn chunk(&self) -> ChunkView<'_> {
        self.chunk.chunk()
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
        predicted_traffic(&self.chunk.chunk(), self.schedule(), features)
    }

    /// The memory this operator holds now beside the chunk (buffers sized for the largest F
    /// called so far, and derived index arrays).
    pub fn workspace(&self) -> Workspace {
        let structure = self
            .blocks
            .q_local
            .iter()
            .flatten()
            .map(QLocalBlock::structure_bytes)
            .sum();
        Workspace {
            buffers: value_bytes(self.packed.len() + self.halo.len()),
            structure,
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
    let names = op.operand_names();
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
