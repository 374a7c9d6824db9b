//! The [`Backend`] trait: the few primitives the schedules need, and the [`Program`] a schedule
//! is written as.
//!
//! A schedule ([`halo`](crate::halo), [`broadcast`](crate::broadcast)) is a short list of
//! [`Instr`]uctions over *names* — the operands, regions of the operator's two buffers, the
//! chunk's blocks and their per-edge values — built once per rank and call kind. [`run`] hands each instruction to a
//! backend, which resolves the names to its own memory (host slices or device pointers) and
//! executes it with its own kernels and transport. The CPU backend runs the instructions in
//! order on the calling thread (kernels on rayon threads); the GPU backend queues them on two
//! streams ([`Lane`]s) ordered by events ([`Instr::Join`]); the recording backend of the tests
//! checks that choreography on the CPU.
//!
//! # The rules a program follows (and the backends rely on)
//! - Every region names rows `first..first + rows` of one buffer, `F` values per row.
//! - An [`Instr::Exchange`] posts its receives, then its sends, then runs its `body` while the
//!   messages travel; every request is complete when the instruction ends. Received regions are
//!   read only inside the body, on [`Lane::Comm`] (the lane that moved them, so no event is
//!   needed); sent regions are not written before the exchange ends. Receives lie in one buffer
//!   and sends in the other.
//! - Work on [`Lane::Local`] touches only the operands; before [`Lane::Comm`] reads or writes
//!   what [`Lane::Local`] wrote, the program joins them (`Join { waiter: Comm, signaller:
//!   Local }`). The call ends on [`Lane::Comm`]: the backend joins the caller to it.
//! - Additions happen in the order the program lists them, whatever the order of arrival, so
//!   results are bit-identical run to run.
//! - The call's per-edge operand ([`Values::Edges`]) is one value per stored non-zero of this
//!   rank's rows in the [`EdgeLayout`](crate::EdgeLayout) order; an instruction touches only its
//!   block's slice of it, so the slices of different blocks never conflict.

use crate::DistSpmmError;

/// One of the operator's two communication buffers (each a row-major matrix of F columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The rows of this rank's packed send lists (halo) or the broadcast panel.
    Packed,
    /// The halo rows received from the peers (halo) or the root's inbox (broadcast).
    Halo,
}

/// Rows `first..first + rows` of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First row.
    pub first: usize,
    /// Number of rows.
    pub rows: usize,
}

impl Region {
    /// Rows `first..first + rows` of `buf`.
    pub fn new(buf: Buf, first: usize, rows: usize) -> Self {
        Self { buf, first, rows }
    }

    /// One past the last row.
    pub fn end(&self) -> usize {
        self.first + self.rows
    }
}

/// A dense `rows × F` matrix a primitive reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dense {
    /// The call's input (`X_p` forward, `dY_p` backward).
    Input,
    /// The call's output (`Y_p` forward, `dX_p` backward).
    Output,
    /// The SDDMM's left operand `U_p` (this rank's rows, read only; the call's
    /// [`Dense::Input`] is then `V_p`, the rows that travel).
    Left,
    /// A region of a buffer.
    Region(Region),
}

/// A sparse block of this rank's chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Matrix {
    /// `Â[p][p]`.
    Diagonal,
    /// The `k`-th off-diagonal block in increasing source part, over compacted columns (column
    /// c = row c of the halo received from its source part).
    Remote(usize),
    /// The block `Â[p][q]` over q-local columns `0..n_q` (the broadcast schedule receives all
    /// of `X_q`).
    QLocal(usize),
}

/// Which product of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Orient {
    /// `A·X` (the block's CSR).
    Plain,
    /// `Aᵀ·X` (the block's CSC).
    Transposed,
}

/// Where the values of a block come from (its pattern is always the chunk's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Values {
    /// The chunk's stored values (`Â`).
    Chunk,
    /// The block's slice of the call's per-edge operand (CSR order; a transposed product reads
    /// it through the operator's CSR→CSC permutation).
    Edges,
}

/// Whether a product overwrites its output or adds to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accumulate {
    /// `Y = A·X` (β = 0).
    Overwrite,
    /// `Y += A·X` (β = 1).
    Add,
}

impl Accumulate {
    /// The β of `Y = A·X + β·Y`.
    pub fn beta(self) -> f32 {
        match self {
            Accumulate::Overwrite => 0.0,
            Accumulate::Add => 1.0,
        }
    }
}

/// Where a primitive runs. On the CPU both lanes are the calling thread; on the GPU
/// [`Lane::Comm`] is the NCCL communicator's stream and [`Lane::Local`] the device's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Communication and everything that touches received or sent rows.
    Comm,
    /// The local block, overlapped with the communication.
    Local,
}

/// Which rows of the input [`Instr::Pack`] gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rows {
    /// All rows, in order (the broadcast panel).
    All,
    /// The halo send lists of every peer concatenated in increasing peer.
    SendLists,
}

/// One block of an exchange: a peer and the region that goes to it or comes from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Message {
    /// The other rank.
    pub peer: usize,
    /// The rows sent or received.
    pub region: Region,
}

/// The grouped exchange of [`Instr::Exchange`].
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// The message tag (one per direction).
    pub tag: dist_comm::Tag,
    /// Sends, in increasing peer.
    pub sends: Vec<Message>,
    /// Receives, in increasing peer; disjoint regions of one buffer in increasing rows.
    pub recvs: Vec<Message>,
    /// What runs while the messages travel.
    pub body: Program,
}

/// `y = a·x` or `y += a·x` (or with `aᵀ`), the block's values taken from `values`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Product {
    /// Where it runs.
    pub lane: Lane,
    /// The block (its pattern).
    pub a: Matrix,
    /// Plain or transposed.
    pub orient: Orient,
    /// The block's values: the chunk's or the call's per-edge operand.
    pub values: Values,
    /// The dense operand.
    pub x: Dense,
    /// Overwrite or add.
    pub acc: Accumulate,
    /// The output.
    pub y: Dense,
}

/// One step of a schedule.
#[derive(Debug, Clone, PartialEq)]
pub enum Instr {
    /// A sparse × dense product.
    Spmm(Product),
    /// `out[k] = ⟨u_i, v_j⟩` for every stored entry `(i, j)` of `block` at its position `k` in
    /// the block's slice of the per-edge operand (`u` holds the block's rows, `v` its columns).
    Sddmm {
        /// Where it runs.
        lane: Lane,
        /// The block whose stored entries are sampled.
        block: Matrix,
        /// The rows' operand (`Dense::Left`).
        u: Dense,
        /// The columns' operand (`Dense::Input` for the diagonal block, a received region
        /// otherwise).
        v: Dense,
        /// Where the values go: [`Values::Edges`] (the chunk's values are never written).
        out: Values,
    },
    /// `into = 0` (the contribution of an empty block).
    Zero {
        /// The rows to clear.
        into: Region,
    },
    /// Gathers rows of the input into a region, on [`Lane::Comm`].
    Pack {
        /// Which rows.
        rows: Rows,
        /// Where to.
        into: Region,
    },
    /// The root's region is copied into every rank's region (collective), on [`Lane::Comm`].
    Broadcast {
        /// The rows.
        region: Region,
        /// The rank that sends.
        root: usize,
    },
    /// Posts a grouped exchange and runs its body while the messages travel.
    Exchange(Exchange),
    /// `waiter` waits for the work queued on `signaller` so far.
    Join {
        /// The lane that waits.
        waiter: Lane,
        /// The lane waited for.
        signaller: Lane,
    },
    /// `Output[send_list(peer)[k]] += from[k]` for every message in order (contributions to a
    /// row in increasing peer), on [`Lane::Comm`]: the partial sums for the rows this rank
    /// sent, received into the regions of `from`.
    ScatterAdd {
        /// The received partial sums, one region per peer, in increasing peer.
        from: Vec<Message>,
    },
    /// `Output += block` for every region in order, on [`Lane::Comm`].
    AddBlocks {
        /// `n_p`-row regions, added in this order.
        from: Vec<Region>,
    },
}

/// A schedule for one direction: the instructions in program order.
pub type Program = Vec<Instr>;

/// The primitives a backend provides; [`run`] drives them from a [`Program`]. Every method
/// resolves the names it is given (operands, regions, blocks) to the backend's memory for the
/// current call.
pub trait Backend {
    /// `y = a·x + β·y` with the block `a` (or its transpose) and its `values`, on `lane`.
    ///
    /// # Errors
    /// Operands that do not fit, kernel or device errors.
    fn spmm(&mut self, p: &Product) -> Result<(), DistSpmmError>;

    /// `out[k] = ⟨u_i, v_j⟩` over the stored entries of `block`, on `lane`.
    ///
    /// # Errors
    /// Operands that do not fit (an `out` other than [`Values::Edges`]), kernel or device
    /// errors.
    fn sddmm(
        &mut self,
        lane: Lane,
        block: Matrix,
        u: Dense,
        v: Dense,
        out: Values,
    ) -> Result<(), DistSpmmError>;

    /// Sets a region to zero.
    ///
    /// # Errors
    /// A region outside the buffers; device errors.
    fn zero(&mut self, into: Region) -> Result<(), DistSpmmError>;

    /// Gathers `rows` of the input into `into`.
    ///
    /// # Errors
    /// A region outside the buffers; device errors.
    fn pack(&mut self, rows: Rows, into: Region) -> Result<(), DistSpmmError>;

    /// Broadcasts `region` from `root` (collective).
    ///
    /// # Errors
    /// Communication errors.
    fn broadcast(&mut self, region: Region, root: usize) -> Result<(), DistSpmmError>;

    /// Posts `ex`'s receives and sends, runs its body (through [`run`]) while they travel, and
    /// completes every request.
    ///
    /// # Errors
    /// Communication errors; the body's errors.
    fn exchange(&mut self, ex: &Exchange) -> Result<(), DistSpmmError>;

    /// `waiter` waits for the work queued on `signaller` so far (an event on the GPU).
    ///
    /// # Errors
    /// Device errors.
    fn join(&mut self, waiter: Lane, signaller: Lane) -> Result<(), DistSpmmError>;

    /// The ordered scatter-add of received partial sums into the output.
    ///
    /// # Errors
    /// Regions that were not received; device errors.
    fn scatter_add(&mut self, from: &[Message]) -> Result<(), DistSpmmError>;

    /// Adds `n_p`-row blocks into the output in order.
    ///
    /// # Errors
    /// Regions that were not received; device errors.
    fn add_blocks(&mut self, from: &[Region]) -> Result<(), DistSpmmError>;
}

/// Runs `program` on `backend`, instruction by instruction.
///
/// # Errors
/// The first error of a primitive.
pub fn run<B: Backend + ?Sized>(backend: &mut B, program: &[Instr]) -> Result<(), DistSpmmError> {
    for instr in program {
        match instr {
            Instr::Spmm(p) => backend.spmm(p)?,
            Instr::Sddmm {
                lane,
                block,
                u,
                v,
                out,
            } => backend.sddmm(*lane, *block, *u, *v, *out)?,
            Instr::Zero { into } => backend.zero(*into)?,
            Instr::Pack { rows, into } => backend.pack(*rows, *into)?,
            Instr::Broadcast { region, root } => backend.broadcast(*region, *root)?,
            Instr::Exchange(ex) => backend.exchange(ex)?,
            Instr::Join { waiter, signaller } => backend.join(*waiter, *signaller)?,
            Instr::ScatterAdd { from } => backend.scatter_add(from)?,
            Instr::AddBlocks { from } => backend.add_blocks(from)?,
        }
    }
    Ok(())
}

/// Rows each buffer must hold for `program` (the largest region end).
pub fn buffer_rows(program: &[Instr]) -> [usize; 2] {
    let mut rows = [0usize; 2];
    let mut see = |r: &Region| {
        let slot = &mut rows[r.buf as usize];
        *slot = (*slot).max(r.end());
    };
    visit_regions(program, &mut see);
    rows
}

/// Every region `program` names, in program order.
fn visit_regions(program: &[Instr], see: &mut impl FnMut(&Region)) {
    let dense = |d: &Dense, see: &mut dyn FnMut(&Region)| {
        if let Dense::Region(r) = d {
            see(r);
        }
    };
    for instr in program {
        match instr {
            Instr::Spmm(Product { x, y, .. }) | Instr::Sddmm { u: x, v: y, .. } => {
                dense(x, see);
                dense(y, see);
            }
            Instr::Zero { into } | Instr::Pack { into, .. } => see(into),
            Instr::Broadcast { region, .. } => see(region),
            Instr::Exchange(ex) => {
                for m in ex.sends.iter().chain(&ex.recvs) {
                    see(&m.region);
                }
                visit_regions(&ex.body, see);
            }
            Instr::Join { .. } => {}
            Instr::ScatterAdd { from } => from.iter().for_each(|m| see(&m.region)),
            Instr::AddBlocks { from } => from.iter().for_each(&mut *see),
        }
    }
}

/// Rows this rank hands to the transport and rows it receives in one run of `program` on a
/// group of `parts` ranks where it is `rank` (a broadcast counts its rows once per receiving
/// rank on the root's side: the plan's convention).
pub fn moved_rows(program: &[Instr], rank: usize, parts: usize) -> (u64, u64) {
    let (mut sent, mut received) = (0u64, 0u64);
    for instr in program {
        match instr {
            Instr::Broadcast { region, root } => {
                if *root == rank {
                    sent += region.rows as u64 * (parts as u64 - 1);
                } else {
                    received += region.rows as u64;
                }
            }
            Instr::Exchange(ex) => {
                sent += ex.sends.iter().map(|m| m.region.rows as u64).sum::<u64>();
                received += ex.recvs.iter().map(|m| m.region.rows as u64).sum::<u64>();
                let (s, r) = moved_rows(&ex.body, rank, parts);
                sent += s;
                received += r;
            }
            _ => {}
        }
    }
    (sent, received)
}
