//! The operator's shell, written once over its backend: what every distributed operator of this
//! crate holds (the chunk, the programs of its schedule, the per-edge layout, the bytes moved),
//! how it is built (derive locally, then agree with every rank) and the path of every call
//! (check locally, reserve, agree, run the call's programs on the backend, count the bytes).
//! [`DistSpmm`](crate::DistSpmm) is this shell over the CPU engine (host buffers and any
//! communicator), `GpuDistSpmm` over the GPU engine (device, streams, device buffers, NCCL).

use crate::schedule::{LayerTraffic, Precision, ScheduleKind, Traffic, Workspace};
use chunk_format::ChunkView;
use dist_comm::AllGather;

use crate::edges::EdgeLayout;
use crate::{agree, predicted_traffic, ChunkSource, DistSpmmError, Kind, Op, Program, Schedule};

/// What every backend derives from the chunk's blocks on the host: the per-edge layout.
#[derive(Debug)]
pub(crate) struct Blocks {
    /// The layout of the per-edge operand.
    pub(crate) edges: EdgeLayout,
}

/// The shell's state a backend reads during a call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shared<'s> {
    pub(crate) chunk: ChunkView<'s>,
    pub(crate) blocks: &'s Blocks,
    pub(crate) schedule: &'s Schedule,
    /// The format of the values handed to the transport.
    pub(crate) precision: Precision,
}

pub(crate) mod engine {
    use super::{DistSpmmError, Kind, Op, Shared, Traffic, Workspace};
    use dist_comm::AllReduce;

    /// What differs between the backends: where the rows live and how the instructions of a
    /// program run (the backend of `backend::run`), and the communicator the ranks agree over.
    pub(crate) trait Engine {
        /// The communicator every call agrees over.
        type Host: AllReduce;
        /// The operands of one program of a call (its input, output, `U`, per-edge values).
        type Operands<'a>;
        /// Where the caller orders a call's work (nothing on the CPU, a stream on the GPU).
        type Stream: Copy;

        /// The agreement's communicator.
        fn host(&self) -> &Self::Host;

        /// Everything a call of `op` with `groups` groups over `f` columns may fail at locally
        /// (buffers, the CSR→CSC permutation), before the agreement.
        ///
        /// # Errors
        /// [`DistSpmmError::Allocation`] (its rank set by the shell) and what deriving fails at.
        fn reserve(
            &mut self,
            s: &Shared<'_>,
            op: Op,
            groups: usize,
            f: usize,
        ) -> Result<(), DistSpmmError>;

        /// Runs the programs of one agreed call, in order, each over its operands.
        ///
        /// # Safety
        /// The operands satisfy the engine's contract (on the CPU they are borrowed slices and
        /// views, always valid; on the GPU device memory as the raw calls require), and
        /// `stream` is live.
        ///
        /// # Errors
        /// Kernel, device and communication errors.
        unsafe fn execute<'a, I>(
            &mut self,
            s: &Shared<'_>,
            groups: usize,
            f: usize,
            programs: I,
            stream: Self::Stream,
        ) -> Result<(), DistSpmmError>
        where
            I: IntoIterator<Item = (Kind, Self::Operands<'a>)>;

        /// The memory the engine holds beside the chunk.
        fn workspace(&self) -> Workspace;

        /// The payload bytes each program of the last [`execute`](Engine::execute) handed to
        /// the transport, in program order, when the engine counts them as it hands them
        /// over; `None` when it moves `f32` values only and the shell counts the programs'
        /// rows instead.
        fn counted(&self) -> Option<&[Traffic]> {
            None
        }
    }
}

use engine::Engine;

/// One rank's distributed operator over the engine `E` (see [`DistSpmm`](crate::DistSpmm) and,
/// with the feature `cuda`, `GpuDistSpmm`), holding its chunk as `K`.
#[derive(Debug)]
pub struct Operator<E, K> {
    pub(crate) chunk: K,
    pub(crate) blocks: Blocks,
    pub(crate) schedule: Schedule,
    pub(crate) engine: E,
    precision: Precision,
    last: Traffic,
    totals: TrafficTotals,
}

/// An operator whose programs and layout are derived and agreed on, before its engine is
/// assembled from what the derivation returned.
pub(crate) struct Agreed<K, P> {
    chunk: K,
    blocks: Blocks,
    schedule: Schedule,
    precision: Precision,
    /// What the engine's derivation returned.
    parts: P,
}

impl<K, P> Agreed<K, P> {
    /// The operator over the engine `engine` makes of the derived parts.
    pub(crate) fn with_engine<E>(self, engine: impl FnOnce(P) -> E) -> Operator<E, K> {
        Operator {
            chunk: self.chunk,
            blocks: self.blocks,
            schedule: self.schedule,
            engine: engine(self.parts),
            precision: self.precision,
            last: Traffic::default(),
            totals: TrafficTotals::default(),
        }
    }
}

/// Builds what every operator derives from `chunk` under `kind`, plus the engine's own parts
/// (`derive`, local), then agrees with every rank over `host` on the partition, the schedule
/// and the message `precision` (collective: a local failure is reported to all ranks, as in
/// [`DistSpmm::new`](crate::DistSpmm::new)).
pub(crate) fn agree_and_build<H, K, P>(
    host: &H,
    chunk: K,
    (kind, precision): (ScheduleKind, Precision),
    derive: impl FnOnce(&ChunkView<'_>, &Schedule, &Blocks) -> Result<P, DistSpmmError>,
) -> Result<Agreed<K, P>, DistSpmmError>
where
    H: AllGather,
    K: ChunkSource,
{
    let view = chunk.chunk();
    let built = Schedule::new(&view, kind).and_then(|schedule| {
        let blocks = Blocks {
            edges: EdgeLayout::new(&view),
        };
        let parts = derive(&view, &schedule, &blocks)?;
        Ok((schedule, blocks, parts))
    });
    if let Err(e) = &built {
        tracing::warn!(rank = view.part_id(), error = %e, "cannot build the operator");
    }
    agree::agree_on_chunk(
        host,
        &view,
        chunk.listed(),
        (kind, precision),
        built.is_ok(),
    )?;
    let (schedule, blocks, parts) = built?;
    Ok(Agreed {
        chunk,
        blocks,
        schedule,
        precision,
        parts,
    })
}

/// The call path (the engine's bounds are the crate's own: the methods are too).
impl<E, K: ChunkSource> Operator<E, K> {
    /// One call of `op` (`groups` groups over `f` columns, one operand set per program of
    /// `op`): this rank's own checks (`local`), the engine's reservation, the agreement of
    /// every rank, the programs on the engine, the bytes counted.
    ///
    /// # Safety
    /// As [`Engine::execute`].
    pub(crate) unsafe fn call_programs<'a, const N: usize>(
        &mut self,
        op: Op,
        groups: usize,
        f: usize,
        local: Result<(), DistSpmmError>,
        operands: [E::Operands<'a>; N],
        stream: E::Stream,
    ) -> Result<(), DistSpmmError>
    where
        E: Engine,
    {
        let kinds = op.programs();
        let local = local.and_then(|()| {
            if kinds.len() == N {
                self.reserve(op, groups, f)
            } else {
                Err(DistSpmmError::Internal(format!(
                    "{} runs {} programs, given operands for {N}",
                    op.name(),
                    kinds.len()
                )))
            }
        });
        agree::agree_on_call(self.engine.host(), op, groups, f, local)?;
        let shared = Shared {
            chunk: self.chunk.chunk(),
            blocks: &self.blocks,
            schedule: &self.schedule,
            precision: op.message_precision(self.precision),
        };
        let programs = kinds.iter().copied().zip(operands);
        // SAFETY: forwarded contract.
        unsafe { self.engine.execute(&shared, groups, f, programs, stream) }?;
        let mut total = Traffic::default();
        let counted = self.engine.counted();
        for (k, &kind) in kinds.iter().enumerate() {
            let traffic = match counted {
                Some(c) => c.get(k).copied().unwrap_or_default(),
                None if f == 0 => Traffic::default(),
                None => self.schedule.program_traffic(kind, f),
            };
            self.totals.record(kind, traffic);
            total += traffic;
        }
        self.last = total;
        Ok(())
    }

    /// The engine's reservation, its allocation failures naming this rank.
    fn reserve(&mut self, op: Op, groups: usize, f: usize) -> Result<(), DistSpmmError>
    where
        E: Engine,
    {
        let rank = self.rank();
        let shared = Shared {
            chunk: self.chunk.chunk(),
            blocks: &self.blocks,
            schedule: &self.schedule,
            precision: op.message_precision(self.precision),
        };
        self.engine
            .reserve(&shared, op, groups, f)
            .map_err(|e| match e {
                DistSpmmError::Allocation { bytes, reason, .. } => DistSpmmError::Allocation {
                    rank,
                    bytes,
                    reason,
                },
                e => e,
            })
    }
}

impl<E, K: ChunkSource> Operator<E, K> {
    /// The format of the values this operator hands to its communicator (agreed by every
    /// rank at construction).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The schedule this operator runs.
    pub fn schedule(&self) -> ScheduleKind {
        self.schedule.kind
    }

    /// The program of one direction (`backward` false: forward), for inspection.
    pub fn program(&self, backward: bool) -> &Program {
        self.schedule.program(if backward {
            Kind::Backward
        } else {
            Kind::Forward
        })
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

    /// The chunk.
    pub fn chunk(&self) -> ChunkView<'_> {
        self.chunk.chunk()
    }

    /// Payload bytes this rank handed to the communicator in its last call, in the operator's
    /// [`precision`](Self::precision) (a broadcast counted once per receiving rank on the
    /// root's side: the plan's conventions).
    pub fn bytes_last_call(&self) -> Traffic {
        self.last
    }

    /// Payload bytes and calls so far, per direction.
    pub fn bytes_total(&self) -> TrafficTotals {
        self.totals
    }

    /// The bytes the plan predicts for one forward and one backward call with `features`
    /// columns in the operator's precision (what [`bytes_last_call`](Self::bytes_last_call)
    /// will count).
    pub fn predicted_traffic(&self, features: usize) -> LayerTraffic {
        predicted_traffic(&self.chunk.chunk(), self.schedule(), features)
            .in_precision(self.precision)
    }

    /// Values of the per-edge operand of this rank (of one group): its stored non-zeros.
    pub fn edge_count(&self) -> usize {
        self.blocks.edges.len()
    }

    /// The layout of the per-edge operand of the per-edge calls (`spmm_values`,
    /// `spmm_values_transpose`, `sddmm`, `sddmm_backward` and their grouped forms).
    pub fn edge_layout(&self) -> &EdgeLayout {
        &self.blocks.edges
    }

    /// The position in the per-edge operand of the edge from global (renumbered) node
    /// `source` into this rank's row `row`; `None` when the chunk stores no such entry.
    pub fn edge_position(&self, row: usize, source: u64) -> Option<usize> {
        self.blocks.edges.position(&self.chunk.chunk(), row, source)
    }

    /// `(row, global source)` of every position of the per-edge operand, in order.
    pub fn edges(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.blocks.edges.edges(self.chunk.chunk())
    }

    /// Fills `out` ([`edge_count`](Self::edge_count) values) with the weight in the graph's
    /// `A` (not Â) of every edge, in the order of [`edges`](Self::edges): the input edges'
    /// weights summed (1 for an unweighted edge), 0 at a self loop the normalisation added.
    /// Local: no communication.
    ///
    /// # Errors
    /// [`DistSpmmError::NoEdgeWeights`] for chunks written without them;
    /// [`DistSpmmError::Shape`] when `out` is not `edge_count()` long.
    pub fn edge_weights(&self, out: &mut [f32]) -> Result<(), DistSpmmError> {
        self.blocks.edges.fill_weights(&self.chunk.chunk(), out)
    }
}

/// Bytes moved by all calls so far, per direction: a forward program moves the input's rows
/// to the ranks that read them (`forward`, `spmm_values`, `sddmm`, and the `dU` half of
/// `sddmm_backward`), a backward program moves partial sums back to the rows' owners
/// (`backward`, `spmm_values_transpose`, the `dV` half of `sddmm_backward`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficTotals {
    /// All forward programs together.
    pub forward: Traffic,
    /// All backward programs together.
    pub backward: Traffic,
    /// Number of forward programs run.
    pub forward_calls: u64,
    /// Number of backward programs run.
    pub backward_calls: u64,
}

impl TrafficTotals {
    /// Adds one program's bytes.
    fn record(&mut self, kind: Kind, traffic: Traffic) {
        if kind.is_forward() {
            self.forward += traffic;
            self.forward_calls += 1;
        } else {
            self.backward += traffic;
            self.backward_calls += 1;
        }
    }
}
