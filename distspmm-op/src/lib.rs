//! The distributed SpMM operator: `Y = Â·X` (forward) and `dX = Âᵀ·dY` (backward) of one rank
//! over a communicator, executing a [`schedule`] plan on the rank's chunk.
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
//!   backend ([`DistSpmm`]) runs them with distspmm-sparse's kernels over any communicator with
//!   the capabilities it uses ([`Broadcast`], [`PointToPoint`], and [`AllGather`] +
//!   [`AllReduce`] for the agreement); the GPU backend (`GpuDistSpmm`, feature `cuda`) with
//!   distspmm-cuda's kernels on two streams and an `NcclComm`.
//! - **the shell** ([`Operator`]): what both operators hold and do is written once over an
//!   engine — construction (derive locally, agree), the call path (check, reserve, agree, run
//!   the call's programs, count the bytes) and the accessors. [`DistSpmm`] is the shell over
//!   [`CpuEngine`], `GpuDistSpmm` over `GpuEngine`; an engine owns only what differs (buffers,
//!   communicators, device state) and its [`Backend`].
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
//! # Per-edge values and the SDDMM
//! Beside `Â`, the operator multiplies by the caller's per-edge values ([`DistSpmm::spmm_values`]
//! `Y = A_e·X`, [`DistSpmm::spmm_values_transpose`] `dX = A_eᵀ·dY`) and samples them
//! ([`DistSpmm::sddmm`] `E_ij = ⟨U_i, V_j⟩`, [`DistSpmm::sddmm_backward`]), over the same
//! schedules and exchanges. The values are one f32 per stored non-zero of the rank's rows in the
//! [`EdgeLayout`] order (diagonal block first, then increasing source part, each block in CSR
//! order); the transposed product reads them through a CSR→CSC permutation made at its first
//! call (4 bytes per non-zero, plus 4 per non-zero for the permuted copy). Between the SDDMM
//! and the SpMM, GAT normalises each row's values with [`DistSpmm::edge_softmax`] or
//! [`DistSpmm::leaky_relu_edge_softmax`], local to the rank (a row's in-edges live on its
//! owner).
//!
//! Additions happen in a fixed order whatever the arrival order, so both schedules are
//! bit-identical run to run (and the `local` backend is bit-identical to MPI: no reduction is
//! left to the communicator). Kernels are `distspmm_sparse::kernel`'s (rayon threads); only the
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
//! # Message precision
//! [`DistSpmm::with_precision`] sends the messages in bf16 or f16 ([`Precision`]): the CPU
//! engine narrows each region where it hands it to the communicator and widens each message
//! where it is first read, into the same `f32` buffers the programs name, so products and sums
//! stay `f32` and only operands that cross ranks are rounded, once. The bytes are counted as
//! they are handed over (2 per value) and equal the plan's in that precision
//! (`LayerTraffic::in_precision`); the workspace adds the 16-bit copies of the two buffers.
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
mod edge_softmax;
mod edges;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod halo;
mod layout;
#[cfg(test)]
mod mock;
mod open;
pub mod operands;
mod operator;
pub mod schedule;
#[cfg(test)]
mod tests;
#[cfg(any(test, feature = "cuda"))]
mod wire;

use std::ops::Deref;

pub use crate::schedule::Precision;
use crate::schedule::{BroadcastPlan, HaloPlan, LayerTraffic, ScheduleKind, Traffic, Workspace};
use chunk_format::ChunkView;
pub use dist_comm::agree::PartsMismatch;
use dist_comm::{AllGather, AllReduce, Broadcast, CommError, PointToPoint};
use distspmm_sparse::kernel::KernelError;
use distspmm_sparse::sparse::{DenseView, DenseViewMut, PageBuffer};

pub use agree::abstain;
pub use backend::{Backend, Program};
pub use chunk_source::ChunkSource;
pub use cpu::CpuEngine;
pub use edges::{EdgeBlock, EdgeLayout};
#[cfg(feature = "cuda")]
pub use gpu::GpuDistSpmm;
#[cfg(feature = "cuda")]
pub use gpu::GpuEngine;
pub use open::{open_rank_chunk, OpenError, RankChunk};
pub use operands::{Operand, OperandError};
pub use operator::{Operator, TrafficTotals};

use backend::{buffer_rows, moved_rows, Buf, Values};
use cpu::{CpuBlocks, CpuOperands};
use layout::HaloLayout;
use operator::engine::Engine;

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
    /// The chunk records no edge weights of the graph (chunk format 1.0), so
    /// [`DistSpmm::edge_weights`] has nothing to give. All chunks of one partition are written
    /// alike, so every rank gets it.
    #[error(
        "these chunks carry no edge weights (written before they were recorded): re-run \
         `distspmm partition` (chunk of part {part})"
    )]
    NoEdgeWeights {
        /// The part of the chunk.
        part: usize,
    },
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

/// Which collective operation a call is (agreed on per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Forward = 1,
    Backward = 2,
    SpmmValues = 3,
    SpmmValuesTranspose = 4,
    Sddmm = 5,
    SddmmBackward = 6,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Forward => "forward",
            Op::Backward => "backward",
            Op::SpmmValues => "spmm_values",
            Op::SpmmValuesTranspose => "spmm_values_transpose",
            Op::Sddmm => "sddmm",
            Op::SddmmBackward => "sddmm_backward",
        }
    }

    /// The precision this call's messages travel in on an operator of `precision`: the
    /// operator's, except the SDDMM's, which stay f32. The rows an SDDMM exchanges become
    /// logits that an edge softmax exponentiates (GAT's source halves `t_j`), so a relative
    /// error u in a logit z moves its attention weight by about u·|z| (bf16 at |z| = 10:
    /// about 4 %), where the products' rows only enter sums; measured, bf16 logits cost GAT
    /// 0.7–0.9 points of accuracy on a 64-feature CSBM graph and f32 logits nothing
    /// (docs/performance.md). They are 2 columns per head, so keeping them exact costs little.
    /// Both engines take their messages' precision from here.
    fn message_precision(self, precision: Precision) -> Precision {
        match self {
            Op::Sddmm => Precision::F32,
            _ => precision,
        }
    }

    /// The names of the input and output in messages (the SpMM forms).
    fn operand_names(self) -> (&'static str, &'static str) {
        match self {
            Op::Forward | Op::SpmmValues => ("X", "Y"),
            Op::Backward | Op::SpmmValuesTranspose => ("dY", "dX"),
            Op::Sddmm => ("U", "V"),
            Op::SddmmBackward => ("dE", "dU"),
        }
    }

    /// The programs a call runs, in order.
    fn programs(self) -> &'static [Kind] {
        match self {
            Op::Forward => &[Kind::Forward],
            Op::Backward => &[Kind::Backward],
            Op::SpmmValues => &[Kind::ForwardEdges],
            Op::SpmmValuesTranspose => &[Kind::BackwardEdges],
            Op::Sddmm => &[Kind::Sddmm],
            Op::SddmmBackward => &[Kind::ForwardEdges, Kind::BackwardEdges],
        }
    }

    /// Whether the call takes a per-edge operand.
    fn reads_edges(self) -> bool {
        !matches!(self, Op::Forward | Op::Backward)
    }

    /// Whether a program of the call reads per-edge values through the CSR→CSC permutation.
    fn transposes_edges(self) -> bool {
        self.programs().contains(&Kind::BackwardEdges)
    }
}

/// The programs of a schedule: what each call kind runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Y = Â·X`.
    Forward = 0,
    /// `dX = Âᵀ·dY`.
    Backward = 1,
    /// `Y = A_e·X` with the call's per-edge values.
    ForwardEdges = 2,
    /// `dX = A_eᵀ·dY` with the call's per-edge values.
    BackwardEdges = 3,
    /// `E = sddmm(U, V)`.
    Sddmm = 4,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Forward,
        Kind::Backward,
        Kind::ForwardEdges,
        Kind::BackwardEdges,
        Kind::Sddmm,
    ];

    /// Whether the program moves the input's rows to their readers (not partial sums back).
    fn is_forward(self) -> bool {
        !matches!(self, Kind::Backward | Kind::BackwardEdges)
    }
}

/// Message tags: one per direction, so a fast rank's next call never matches a slow rank's
/// pending receive of another kind.
const TAG_FORWARD: dist_comm::Tag = 0x5E1;
const TAG_BACKWARD: dist_comm::Tag = 0x5E2;

/// What one rank runs under a schedule: a program per call kind and the halo layout they
/// name.
#[derive(Debug)]
struct Schedule {
    kind: ScheduleKind,
    rank: usize,
    parts: usize,
    /// Indexed by [`Kind`].
    programs: [Program; 5],
    /// Halo: who sends which rows (the send lists concatenated are what `Rows::SendLists`
    /// names). Broadcast: empty.
    layout: HaloLayout,
}

impl Schedule {
    fn new(chunk: &ChunkView<'_>, kind: ScheduleKind) -> Result<Self, DistSpmmError> {
        let (rank, parts) = (chunk.part_id(), chunk.num_parts());
        let (programs, layout) = match kind {
            ScheduleKind::Halo => {
                let layout = HaloLayout::new(chunk)?;
                let programs = [
                    halo::forward(&layout, Values::Chunk),
                    halo::backward(&layout, Values::Chunk),
                    halo::forward(&layout, Values::Edges),
                    halo::backward(&layout, Values::Edges),
                    halo::sddmm(&layout),
                ];
                (programs, layout)
            }
            ScheduleKind::Broadcast => {
                let plan = BroadcastPlan::from_chunk(chunk);
                let mut has_block = vec![false; parts];
                for b in chunk.blocks().filter(|b| b.src_part as usize != rank) {
                    has_block[b.src_part as usize] = true;
                }
                let n = chunk.num_local_nodes();
                let programs = [
                    broadcast::forward(&plan, &has_block, Values::Chunk),
                    broadcast::backward(&plan, &has_block, n, Values::Chunk),
                    broadcast::forward(&plan, &has_block, Values::Edges),
                    broadcast::backward(&plan, &has_block, n, Values::Edges),
                    broadcast::sddmm(&plan, &has_block),
                ];
                (programs, HaloLayout::default())
            }
        };
        Ok(Self {
            kind,
            rank,
            parts,
            programs,
            layout,
        })
    }

    fn program(&self, kind: Kind) -> &Program {
        &self.programs[kind as usize]
    }

    /// Rows of the two buffers a call of `op` needs: the packed buffer holds what any program
    /// packs (so it is sized once), the halo buffer what this call's programs receive.
    fn buffer_rows(&self, op: Op) -> [usize; 2] {
        let packed = Buf::Packed as usize;
        let halo = Buf::Halo as usize;
        let mut rows = [0; 2];
        for kind in Kind::ALL {
            rows[packed] = rows[packed].max(buffer_rows(self.program(kind))[packed]);
        }
        for &kind in op.programs() {
            rows[halo] = rows[halo].max(buffer_rows(self.program(kind))[halo]);
        }
        rows
    }

    /// The payload of one program of `kind` with `features` columns.
    fn program_traffic(&self, kind: Kind, features: usize) -> Traffic {
        let (sent, received) = moved_rows(self.program(kind), self.rank, self.parts);
        Traffic::rows(sent, received, features)
    }
}

/// The distributed SpMM operator of one rank on the CPU. See the [crate docs](crate).
///
/// ```
/// use chunk_format::ChunkView;
/// use dist_comm::{AllGather, AllReduce, Broadcast, PointToPoint};
/// use distspmm_op::schedule::ScheduleKind;
/// use distspmm_sparse::sparse::{DenseView, DenseViewMut};
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
/// keeps both alive by ownership. It is the [`Operator`] shell over the CPU engine
/// ([`CpuEngine`]: the communicator and host buffers).
pub type DistSpmm<C, K> = Operator<CpuEngine<C>, K>;

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
        Self::with_precision(comm, chunk, schedule, Precision::F32)
    }

    /// [`new`](Self::new) with the rows and partial sums travelling in `precision`: each
    /// message is narrowed from `f32` where it is handed to the communicator and widened back
    /// to `f32` where it is received (`distspmm_sparse::kernel::convert`); products and sums
    /// stay in `f32`, and the rows a rank multiplies from its own `X_p` are never converted.
    /// `f32` moves the values as they are (the results and bytes of [`new`](Self::new)). The
    /// ranks agree on the precision with the partition.
    ///
    /// # Errors
    /// As [`new`](Self::new); a rank that chose another precision than rank 0 is a
    /// [`DistSpmmError::Disagreement`] on every rank.
    pub fn with_precision(
        comm: C,
        chunk: K,
        schedule: ScheduleKind,
        precision: Precision,
    ) -> Result<Self, DistSpmmError> {
        let agreed =
            operator::agree_and_build(&*comm, chunk, (schedule, precision), |view, _, _| {
                Ok(CpuBlocks::new(view, schedule))
            })?;
        Ok(agreed.with_engine(|blocks| CpuEngine::new(comm, blocks)))
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
        self.call(Op::Forward, 1, &[], x, y)
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
        self.call(Op::Backward, 1, &[], dy, dx)
    }

    /// `Y_p = (A_e·X)_p`: the forward product with the call's per-edge values `e` (one per
    /// stored non-zero of this rank's rows, in the [`EdgeLayout`] order) in place of `Â`.
    /// Collective; moves what [`forward`](Self::forward) moves.
    ///
    /// # Errors
    /// As [`DistSpmm::forward`]; `e` of another length than [`edge_count`](Self::edge_count)
    /// is a [`DistSpmmError::Shape`] on this rank.
    pub fn spmm_values(
        &mut self,
        e: &[f32],
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.spmm_values_grouped(1, e, x, y)
    }

    /// [`spmm_values`](Self::spmm_values) for `groups` groups at once, in one pass over the
    /// edges and one exchange: `e` holds `groups` runs of [`edge_count`](Self::edge_count)
    /// values (run g first at `g·edge_count`, each in the [`EdgeLayout`] order), `X` and `Y`
    /// `F = groups·C` columns, and `Y_i[g·C..(g+1)·C] = Σ_j e_g[ij]·X_j[g·C..(g+1)·C]` — the
    /// heads of a multi-head attention layer. One group is `spmm_values`, bit for bit.
    /// Collective (the ranks agree on the group count too); moves what
    /// [`forward`](Self::forward) moves for F columns.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values`]; no group, F not a multiple of `groups` or `e` of another
    /// length than `groups · edge_count()` is a [`DistSpmmError::Shape`] on this rank.
    pub fn spmm_values_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.call(Op::SpmmValues, groups, e, x, y)
    }

    /// `dX_p = (A_eᵀ·dY)_p`: the backward product with the call's per-edge values `e` (the
    /// [`EdgeLayout`] order; the operator reads them through its CSR→CSC permutation, made at
    /// the first such call: 4 bytes per non-zero, plus 4 per non-zero for the permuted copy).
    /// Collective; moves what [`backward`](Self::backward) moves.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values`].
    pub fn spmm_values_transpose(
        &mut self,
        e: &[f32],
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.spmm_values_transpose_grouped(1, e, dy, dx)
    }

    /// [`spmm_values_transpose`](Self::spmm_values_transpose) for `groups` groups at once:
    /// `dX_j[g·C..(g+1)·C] = Σ_i e_g[ij]·dY_i[g·C..(g+1)·C]`, `e` as in
    /// [`spmm_values_grouped`](Self::spmm_values_grouped). The CSC-ordered copy of the values
    /// holds `groups` values per non-zero. Collective; moves what
    /// [`backward`](Self::backward) moves.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values_grouped`].
    pub fn spmm_values_transpose_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.call(Op::SpmmValuesTranspose, groups, e, dy, dx)
    }

    /// One SpMM call: `op`'s one program over `input` and `output`, with the `groups` runs of
    /// per-edge values `e` for the calls that take them (`Op::reads_edges`; the chunk's values
    /// otherwise, `e` empty and one group).
    fn call(
        &mut self,
        op: Op,
        groups: usize,
        e: &[f32],
        input: DenseView<'_, f32>,
        output: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        let (rank, n, f) = (self.rank(), self.local_rows(), input.cols());
        let (i, o) = op.operand_names();
        let edges = [("E", e.len())];
        let shapes = check_operands(
            op.name(),
            rank,
            n,
            &[(i, shape(&input)), (o, shape(&output))],
            &[],
        )
        .and_then(|()| {
            let edges = if op.reads_edges() { &edges[..] } else { &[] };
            check_groups(op.name(), rank, groups, f, edges, self.edge_count())
        });
        let run = CpuOperands {
            input,
            output,
            left: None,
            values: e,
            out: &mut [],
        };
        // SAFETY: host operands borrowed for the call are always valid.
        unsafe { self.call_programs(op, groups, f, shapes, [run], ()) }
    }

    /// `E[k] = ⟨U_i, V_j⟩` for every stored non-zero `(i, j)` of this rank's rows, `k` its
    /// position in the [`EdgeLayout`]: `U_p` and `V_p` are this rank's rows (`n_p × F` each),
    /// the rows `V_j` of other parts come from their owners by the schedule's exchange (what
    /// [`forward`](Self::forward) moves for X). `e` ([`edge_count`](Self::edge_count) values)
    /// is overwritten. Collective.
    ///
    /// GAT's additive attention `e_ij = s_i + t_j` is this product with `F = 2`,
    /// `U_i = [s_i, 1]` and `V_j = [1, t_j]`.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values`].
    pub fn sddmm(
        &mut self,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        self.sddmm_grouped(1, u, v, e)
    }

    /// [`sddmm`](Self::sddmm) for `groups` groups at once, in one pass over the edges and one
    /// exchange: `U` and `V` have `F = groups·w` columns and
    /// `e_g[ij] = ⟨U_i[g·w..(g+1)·w], V_j[g·w..(g+1)·w]⟩`, written into `groups` runs of
    /// [`edge_count`](Self::edge_count) values (run g first at `g·edge_count`). Each value has
    /// the bits of [`sddmm`](Self::sddmm) over its group's columns. Collective.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values_grouped`].
    pub fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<(), DistSpmmError> {
        let (rank, n, f) = (self.rank(), self.local_rows(), u.cols());
        let op = Op::Sddmm;
        let shapes = check_operands(
            op.name(),
            rank,
            n,
            &[("U", shape(&u)), ("V", shape(&v))],
            &[],
        )
        .and_then(|()| {
            check_groups(
                op.name(),
                rank,
                groups,
                f,
                &[("E", e.len())],
                self.edge_count(),
            )
        });
        let mut none: [f32; 0] = [];
        let no_output = DenseViewMut::new(&mut none[..], 0, f, f)
            .map_err(|err| DistSpmmError::Internal(err.to_string()))?;
        let run = CpuOperands {
            input: v,
            output: no_output,
            left: Some(u),
            values: &[],
            out: e,
        };
        // SAFETY: as in `call`.
        unsafe { self.call_programs(op, groups, f, shapes, [run], ()) }
    }

    /// The gradients of [`sddmm`](Self::sddmm): `dU_i = Σ_j dE_ij·V_j` (the forward product
    /// with values `dE` over `V`, after the same exchange of `V`'s rows) and
    /// `dV_j = Σ_i dE_ij·U_i` (the transposed product with values `dE` over `U`, the partial
    /// sums for other parts' rows sent to their owners and added there). `du` and `dv` are
    /// overwritten. Collective; moves what one forward and one backward call move.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values`].
    pub fn sddmm_backward(
        &mut self,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        du: DenseViewMut<'_, f32>,
        dv: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        self.sddmm_backward_grouped(1, de, u, v, du, dv)
    }

    /// The gradients of [`sddmm_grouped`](Self::sddmm_grouped), per group:
    /// `dU_i[g·w..] = Σ_j dE_g[ij]·V_j[g·w..]` and `dV_j[g·w..] = Σ_i dE_g[ij]·U_i[g·w..]`
    /// ([`spmm_values_grouped`](Self::spmm_values_grouped) and
    /// [`spmm_values_transpose_grouped`](Self::spmm_values_transpose_grouped) with values
    /// `dE`), `dE` in runs as the SDDMM wrote them. Collective; moves what one forward and one
    /// backward call move.
    ///
    /// # Errors
    /// As [`DistSpmm::spmm_values_grouped`].
    pub fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        du: DenseViewMut<'_, f32>,
        dv: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        let (rank, n, f) = (self.rank(), self.local_rows(), u.cols());
        let op = Op::SddmmBackward;
        let shapes = check_operands(
            op.name(),
            rank,
            n,
            &[
                ("U", shape(&u)),
                ("V", shape(&v)),
                ("dU", shape(&du)),
                ("dV", shape(&dv)),
            ],
            &[],
        )
        .and_then(|()| {
            check_groups(
                op.name(),
                rank,
                groups,
                f,
                &[("dE", de.len())],
                self.edge_count(),
            )
        });
        let operands = |input, output| CpuOperands {
            input,
            output,
            left: None,
            values: de,
            out: &mut [],
        };
        let runs = [operands(v, du), operands(u, dv)];
        // SAFETY: as in `call`.
        unsafe { self.call_programs(op, groups, f, shapes, runs, ()) }
    }

    /// The communicator.
    pub fn comm(&self) -> &C::Target {
        &self.engine.comm
    }

    /// The memory this operator holds now beside the chunk (buffers sized for the largest F
    /// called so far, and derived index arrays; after a transposed product over per-edge
    /// values also the CSR→CSC permutation, in `structure`, and the permuted values, in
    /// `buffers`: 4 bytes per non-zero for the permutation, 4 per non-zero and group of the
    /// largest group count so far for the values).
    pub fn workspace(&self) -> Workspace {
        self.engine.workspace()
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

/// The rows and columns of a dense operand.
fn shape<S>(d: &distspmm_sparse::sparse::Dense<S>) -> (usize, usize)
where
    S: Deref<Target = [f32]>,
{
    (d.rows(), d.cols())
}

/// The shape rule of every call (`call` names it in messages): each dense operand (name, (rows, columns)) is `n_p × F`, F
/// the first one's columns; each per-edge operand (name, values, this rank's non-zeros) holds
/// one value per stored non-zero of this rank's rows.
fn check_operands(
    call: &str,
    rank: usize,
    n: usize,
    dense: &[(&str, (usize, usize))],
    edges: &[(&str, usize, usize)],
) -> Result<(), DistSpmmError> {
    if let Some(&(first, (_, f))) = dense.first() {
        for &(name, (rows, cols)) in dense {
            if rows != n || cols != f {
                return Err(DistSpmmError::Shape(format!(
                    "{call} on rank {rank}: {name} is {rows} × {cols} but part {rank} owns {n} \
                     rows and {first} has {f} columns",
                )));
            }
        }
    }
    for &(name, values, nnz) in edges {
        if values != nnz {
            return Err(DistSpmmError::Shape(format!(
                "{call} on rank {rank}: {name} holds {values} values but part {rank} stores {nnz} \
                 non-zeros (one value per edge, in the operator's edge layout)",
            )));
        }
    }
    Ok(())
}

/// The group rule of the per-edge calls (`call` names it in messages): one group or more,
/// F columns split into groups of equal width, and each per-edge operand (name, values) one
/// run of this rank's `nnz` values per group. One group is [`check_operands`]' rule.
fn check_groups(
    call: &str,
    rank: usize,
    groups: usize,
    f: usize,
    edges: &[(&str, usize)],
    nnz: usize,
) -> Result<(), DistSpmmError> {
    if groups == 0 || !f.is_multiple_of(groups) {
        return Err(DistSpmmError::Shape(format!(
            "{call} on rank {rank}: {f} columns do not split into {groups} groups of equal \
             width (give one group or more, dividing the columns)",
        )));
    }
    if groups == 1 {
        let edges: Vec<(&str, usize, usize)> = edges.iter().map(|&(e, v)| (e, v, nnz)).collect();
        return check_operands(call, rank, 0, &[], &edges);
    }
    for &(name, values) in edges {
        if groups.checked_mul(nnz) != Some(values) {
            return Err(DistSpmmError::Shape(format!(
                "{call} on rank {rank}: {name} holds {values} values but {groups} groups over \
                 the {nnz} non-zeros part {rank} stores need {} (one run of one value per edge \
                 for each group, in the operator's edge layout)",
                groups.saturating_mul(nnz),
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
    len as u64 * schedule::VALUE_BYTES
}
