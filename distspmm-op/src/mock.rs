//! A recording backend: runs a rank's programs without memory or messages and checks the
//! choreography the GPU backend relies on — which lane touches what (dense operands, buffer
//! regions and their 16-bit copies, and each block's run of the per-edge operand), which joins
//! order them, what each exchange sends and receives — on the CPU. Its exchanges and
//! broadcasts run the GPU backend's own transport steps ([`wire`](crate::wire)), so in bf16
//! and f16 it records which regions the GPU narrows and widens and counts the bytes the GPU
//! hands over. Tests then check that the ranks' programs match each other (every send has its
//! receive, broadcasts agree), move the bytes the plans predict, and convert the regions the
//! CPU engine converts with the bytes it counts.

use crate::schedule::Traffic;
use distspmm_sparse::kernel::convert::Half;

use crate::backend::{
    run, Accumulate, Backend, Dense, Exchange, Lane, Matrix, Message, Product, Region, Rows, Values,
};
use crate::wire::{self, Payload, Transport, WireCall};
use crate::DistSpmmError;

/// One primitive as the recording backend saw it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    Spmm(Product),
    Sddmm {
        lane: Lane,
        block: Matrix,
        u: Dense,
        v: Dense,
    },
    Zero(Region),
    Pack(Rows, Region),
    Broadcast {
        region: Region,
        root: usize,
    },
    /// An exchange was posted (its body's events follow, then [`Event::Completed`]).
    Posted {
        tag: dist_comm::Tag,
        sends: Vec<Message>,
        recvs: Vec<Message>,
    },
    Completed,
    Join {
        waiter: Lane,
        signaller: Lane,
    },
    ScatterAdd(Vec<Message>),
    AddBlocks(Vec<Region>),
    /// A region narrowed into its 16-bit copy (before it is sent or broadcast from here).
    Narrow(Region),
    /// A region's 16-bit copy widened into it (after it arrived).
    Widen(Region),
}

/// Memory a primitive touches: a dense operand or region, the 16-bit copy of a region, or one
/// block's run of the per-edge operand (the runs of different blocks are disjoint; the chunk's
/// values are never written).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Dense(Dense),
    Wire(Region),
    Edges(Matrix),
}

/// An access to memory: who, when (the lane's sequence number), what, and whether it wrote.
#[derive(Debug, Clone, Copy)]
struct Access {
    lane: Lane,
    seq: usize,
    what: Target,
    write: bool,
}

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Comm => 0,
        Lane::Local => 1,
    }
}

fn overlaps(a: &Target, b: &Target) -> bool {
    match (a, b) {
        (Target::Dense(Dense::Region(r)), Target::Dense(Dense::Region(s)))
        | (Target::Wire(r), Target::Wire(s)) => {
            r.buf == s.buf && r.first < s.end() && s.first < r.end()
        }
        _ => a == b,
    }
}

/// The recording backend of one rank. `hazards` lists every access that a GPU would run
/// unordered against an earlier conflicting access on the other lane, and every breach of the
/// exchange rules of [`backend`](crate::backend) (including a received region its exchange's
/// body never reads).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub(crate) events: Vec<Event>,
    pub(crate) hazards: Vec<String>,
    /// The call the transport steps run for (precision, F, rank, ranks).
    call: WireCall,
    /// The bytes the transport steps counted.
    pub(crate) moved: Traffic,
    /// The bytes of the payloads handed to point-to-point messages and to broadcasts, added
    /// up here from their lengths (the plan's conventions).
    pub(crate) point_to_point: Traffic,
    pub(crate) broadcast: Traffic,
    accesses: Vec<Access>,
    /// Operations issued per lane.
    issued: [usize; 2],
    /// `seen[l][m]`: lane l has waited for the first `seen[l][m]` operations of lane m.
    seen: [[usize; 2]; 2],
    /// The exchange whose body is running: (sent, received) regions.
    open: Option<(Vec<Region>, Vec<Region>)>,
    /// The received regions the running exchange's body has read.
    body_reads: Vec<Region>,
    /// The tag of the exchange being handed over.
    tag: dist_comm::Tag,
}

impl Recorder {
    /// Records one operation on `lane` reading `reads` and writing `writes` (dense operands).
    fn access(&mut self, lane: Lane, reads: &[Dense], writes: &[Dense], what: &str) {
        let reads: Vec<Target> = reads.iter().map(|d| Target::Dense(*d)).collect();
        let writes: Vec<Target> = writes.iter().map(|d| Target::Dense(*d)).collect();
        self.touch(lane, &reads, &writes, what);
    }

    /// Records one operation on `lane` reading `reads` and writing `writes`.
    fn touch(&mut self, lane: Lane, reads: &[Target], writes: &[Target], what: &str) {
        let l = lane_index(lane);
        let seq = self.issued[l];
        self.issued[l] += 1;
        self.seen[l][l] = seq + 1;
        let new = reads
            .iter()
            .map(|d| (*d, false))
            .chain(writes.iter().map(|d| (*d, true)));
        for (target, write) in new {
            for a in &self.accesses {
                let m = lane_index(a.lane);
                if m != l
                    && (a.write || write)
                    && overlaps(&a.what, &target)
                    && self.seen[l][m] <= a.seq
                {
                    self.hazards.push(format!(
                        "{what} on {lane:?} {} {target:?}, which {:?} {} unordered",
                        if write { "writes" } else { "reads" },
                        a.lane,
                        if a.write { "wrote" } else { "read" }
                    ));
                }
            }
            self.accesses.push(Access {
                lane,
                seq,
                what: target,
                write,
            });
        }
        if let Some((sent, received)) = &self.open {
            for w in writes {
                if let Target::Dense(Dense::Region(r)) = w {
                    if sent
                        .iter()
                        .chain(received)
                        .any(|s| overlaps(&Target::Dense(Dense::Region(*s)), w))
                    {
                        self.hazards
                            .push(format!("{what} writes {r:?} while it is being exchanged"));
                    }
                }
            }
            for r in reads {
                if let Target::Dense(Dense::Region(region)) = r {
                    let ok = received.contains(region) && lane == Lane::Comm;
                    if ok {
                        self.body_reads.push(*region);
                    } else {
                        self.hazards.push(format!(
                            "{what} on {lane:?} reads {region:?} inside an exchange that does \
                             not deliver it to that lane"
                        ));
                    }
                }
            }
            if writes
                .iter()
                .any(|w| matches!(w, Target::Dense(d) if *d != Dense::Output))
            {
                self.hazards
                    .push(format!("{what} writes a buffer inside an exchange"));
            }
        }
    }

    /// After a whole program: the call ends on the communication lane, so everything the
    /// local lane did must be ordered before its end.
    pub(crate) fn finish(&mut self) {
        let local = lane_index(Lane::Local);
        if self.seen[lane_index(Lane::Comm)][local] < self.issued[local] {
            self.hazards
                .push("the call ends before the local lane's work is joined".into());
        }
    }
}

impl Backend for Recorder {
    fn spmm(&mut self, p: &Product) -> Result<(), DistSpmmError> {
        let mut reads = vec![Target::Dense(p.x)];
        if p.acc == Accumulate::Add {
            reads.push(Target::Dense(p.y));
        }
        if p.values == Values::Edges {
            reads.push(Target::Edges(p.a));
        }
        if matches!(p.x, Dense::Output | Dense::Left) || matches!(p.y, Dense::Input | Dense::Left) {
            self.hazards.push(format!(
                "spmm reads {:?} into {:?}: not an input and an output",
                p.x, p.y
            ));
        }
        self.touch(p.lane, &reads, &[Target::Dense(p.y)], "spmm");
        self.events.push(Event::Spmm(*p));
        Ok(())
    }

    fn sddmm(
        &mut self,
        lane: Lane,
        block: Matrix,
        u: Dense,
        v: Dense,
        out: Values,
    ) -> Result<(), DistSpmmError> {
        if out != Values::Edges {
            self.hazards
                .push("an SDDMM writes the chunk's values".into());
        }
        if u != Dense::Left || matches!(v, Dense::Output | Dense::Left) {
            self.hazards.push(format!(
                "an SDDMM samples {u:?} against {v:?}, not U against V"
            ));
        }
        let reads = [Target::Dense(u), Target::Dense(v)];
        self.touch(lane, &reads, &[Target::Edges(block)], "sddmm");
        self.events.push(Event::Sddmm { lane, block, u, v });
        Ok(())
    }

    fn zero(&mut self, into: Region) -> Result<(), DistSpmmError> {
        self.access(Lane::Comm, &[], &[Dense::Region(into)], "zero");
        self.events.push(Event::Zero(into));
        Ok(())
    }

    fn pack(&mut self, rows: Rows, into: Region) -> Result<(), DistSpmmError> {
        self.access(Lane::Comm, &[Dense::Input], &[Dense::Region(into)], "pack");
        self.events.push(Event::Pack(rows, into));
        Ok(())
    }

    fn broadcast(&mut self, region: Region, root: usize) -> Result<(), DistSpmmError> {
        wire::broadcast(self, region, root)
    }

    fn exchange(&mut self, ex: &Exchange) -> Result<(), DistSpmmError> {
        if self.open.is_some() {
            self.hazards.push("an exchange inside an exchange".into());
        }
        self.tag = ex.tag;
        wire::exchange(self, ex)?;
        let sent = ex.sends.iter().map(|m| m.region).collect();
        let received: Vec<Region> = ex.recvs.iter().map(|m| m.region).collect();
        self.open = Some((sent, received.clone()));
        self.body_reads.clear();
        let body = run(self, &ex.body);
        self.open = None;
        for r in received {
            if !self.body_reads.contains(&r) {
                self.hazards.push(format!(
                    "the exchange receives {r:?} but its body never reads it"
                ));
            }
        }
        self.events.push(Event::Completed);
        body
    }

    fn join(&mut self, waiter: Lane, signaller: Lane) -> Result<(), DistSpmmError> {
        let (w, s) = (lane_index(waiter), lane_index(signaller));
        self.seen[w][s] = self.seen[w][s].max(self.issued[s]);
        self.events.push(Event::Join { waiter, signaller });
        Ok(())
    }

    fn scatter_add(&mut self, from: &[Message]) -> Result<(), DistSpmmError> {
        let mut reads: Vec<Dense> = from.iter().map(|m| Dense::Region(m.region)).collect();
        reads.push(Dense::Output);
        self.access(Lane::Comm, &reads, &[Dense::Output], "scatter-add");
        self.events.push(Event::ScatterAdd(from.to_vec()));
        Ok(())
    }

    fn add_blocks(&mut self, from: &[Region]) -> Result<(), DistSpmmError> {
        let mut reads: Vec<Dense> = from.iter().map(|r| Dense::Region(*r)).collect();
        reads.push(Dense::Output);
        self.access(Lane::Comm, &reads, &[Dense::Output], "add-blocks");
        self.events.push(Event::AddBlocks(from.to_vec()));
        Ok(())
    }
}

/// The GPU backend's transport steps, recorded: conversions and hand-overs on the
/// communication lane, counted as the GPU counts them.
impl Transport for Recorder {
    fn call(&self) -> WireCall {
        self.call
    }

    fn moved(&mut self) -> &mut Traffic {
        &mut self.moved
    }

    fn narrow(&mut self, _fmt: Half, region: Region) -> Result<(), DistSpmmError> {
        let (f32s, copy) = (Target::Dense(Dense::Region(region)), Target::Wire(region));
        self.touch(Lane::Comm, &[f32s], &[copy], "narrow");
        self.events.push(Event::Narrow(region));
        Ok(())
    }

    fn widen(&mut self, _fmt: Half, region: Region) -> Result<(), DistSpmmError> {
        let (f32s, copy) = (Target::Dense(Dense::Region(region)), Target::Wire(region));
        self.touch(Lane::Comm, &[copy], &[f32s], "widen");
        self.events.push(Event::Widen(region));
        Ok(())
    }

    fn hand_over(
        &mut self,
        fmt: Option<Half>,
        sends: &[Payload],
        recvs: &[Payload],
    ) -> Result<(), DistSpmmError> {
        let on_wire = |p: &Payload| on_wire(fmt, p.region);
        let reads: Vec<Target> = sends.iter().map(on_wire).collect();
        let writes: Vec<Target> = recvs.iter().map(on_wire).collect();
        self.touch(Lane::Comm, &reads, &writes, "exchange");
        let bytes = |list: &[Payload]| -> u64 {
            list.iter()
                .map(|p| (p.len * self.call.element_bytes()) as u64)
                .sum()
        };
        self.point_to_point.sent += bytes(sends);
        self.point_to_point.received += bytes(recvs);
        let messages = |list: &[Payload]| -> Vec<Message> {
            list.iter()
                .map(|p| Message {
                    peer: p.peer,
                    region: p.region,
                })
                .collect()
        };
        self.events.push(Event::Posted {
            tag: self.tag,
            sends: messages(sends),
            recvs: messages(recvs),
        });
        Ok(())
    }

    fn hand_over_broadcast(
        &mut self,
        fmt: Option<Half>,
        payload: Payload,
    ) -> Result<(), DistSpmmError> {
        let target = on_wire(fmt, payload.region);
        self.touch(Lane::Comm, &[target], &[target], "broadcast");
        let bytes = (payload.len * self.call.element_bytes()) as u64;
        if payload.peer == self.call.rank {
            self.broadcast.sent += bytes * (self.call.size as u64).saturating_sub(1);
        } else {
            self.broadcast.received += bytes;
        }
        self.events.push(Event::Broadcast {
            region: payload.region,
            root: payload.peer,
        });
        Ok(())
    }
}

/// What the transport moves for `region`: the region itself in `f32`, its 16-bit copy
/// otherwise.
fn on_wire(fmt: Option<Half>, region: Region) -> Target {
    match fmt {
        None => Target::Dense(Dense::Region(region)),
        Some(_) => Target::Wire(region),
    }
}

/// Records `program` from a clean start (both lanes joined to the caller), in `f32` with one
/// column on a rank of its own.
pub(crate) fn record(program: &[crate::backend::Instr]) -> Recorder {
    record_in(
        program,
        WireCall {
            precision: crate::Precision::F32,
            f: 1,
            rank: 0,
            size: 1,
        },
    )
}

/// Records `program` for the call `call` (its precision, F, this rank and the ranks).
pub(crate) fn record_in(program: &[crate::backend::Instr], call: WireCall) -> Recorder {
    let mut r = Recorder {
        call,
        ..Recorder::default()
    };
    run(&mut r, program).expect("the recorder accepts every program");
    r.finish();
    r
}

/// What a [`RecordingEngine`] saw of one call: its op, groups and F as reserved, and the
/// programs it was handed, each with its recorder; the bytes each program of the last call
/// handed over (what the engine reports as counted).
#[derive(Debug, Default)]
pub(crate) struct EngineLog {
    pub(crate) reserved: Vec<(crate::Op, usize, usize)>,
    pub(crate) executed: Vec<(crate::Kind, usize, usize, Recorder)>,
    pub(crate) counted: Vec<Traffic>,
}

/// An engine of the operator shell that runs every program on the recording backend: the
/// shell's call path (reserve, agree, programs in order, bytes) with nothing but the
/// choreography behind it, its bytes counted by the GPU backend's transport steps.
#[derive(Debug)]
pub(crate) struct RecordingEngine<'c> {
    pub(crate) comm: &'c dist_comm::LocalComm,
    pub(crate) log: EngineLog,
}

impl crate::operator::engine::Engine for RecordingEngine<'_> {
    type Host = dist_comm::LocalComm;
    type Operands<'a> = ();
    type Stream = ();

    fn host(&self) -> &dist_comm::LocalComm {
        self.comm
    }

    fn reserve(
        &mut self,
        _s: &crate::operator::Shared<'_>,
        op: crate::Op,
        groups: usize,
        f: usize,
    ) -> Result<(), DistSpmmError> {
        self.log.reserved.push((op, groups, f));
        Ok(())
    }

    unsafe fn execute<'a, I>(
        &mut self,
        s: &crate::operator::Shared<'_>,
        groups: usize,
        f: usize,
        programs: I,
        (): (),
    ) -> Result<(), DistSpmmError>
    where
        I: IntoIterator<Item = (crate::Kind, Self::Operands<'a>)>,
    {
        use dist_comm::Group;
        let call = WireCall {
            precision: s.precision,
            f,
            rank: self.comm.rank(),
            size: self.comm.size(),
        };
        self.log.counted.clear();
        for (kind, ()) in programs {
            let r = record_in(s.schedule.program(kind), call);
            self.log.counted.push(r.moved);
            self.log.executed.push((kind, groups, f, r));
        }
        Ok(())
    }

    fn workspace(&self) -> crate::schedule::Workspace {
        crate::schedule::Workspace::default()
    }

    fn counted(&self) -> Option<&[Traffic]> {
        Some(&self.log.counted)
    }
}

#[cfg(test)]
mod tests {
    use crate::schedule::{Precision, ScheduleKind};
    use dist_comm::{Bytes, Counting, Group, LocalComm};
    use distspmm_sparse::sparse::{DenseView, DenseViewMut};
    use proptest::prelude::*;

    use super::{record_in, EngineLog, Event, RecordingEngine};
    use crate::backend::{Buf, Exchange, Instr, Message, Region};
    use crate::tests::{chunks, graphs, ring, views};
    use crate::wire::WireCall;
    use crate::{operator, DistSpmm, Op};

    /// The regions the CPU engine narrows and widens in a program, by its rule (`cpu`): every
    /// exchange's send regions are narrowed and its receive regions widened; a broadcast's
    /// region is narrowed at the root and widened at the other ranks. Read off the program's
    /// transfers as the recorder saw them, in order.
    fn cpu_conversions(events: &[Event], rank: usize) -> (Vec<Region>, Vec<Region>) {
        let (mut narrowed, mut widened) = (Vec::new(), Vec::new());
        for e in events {
            match e {
                Event::Posted { sends, recvs, .. } => {
                    narrowed.extend(sends.iter().map(|m| m.region));
                    widened.extend(recvs.iter().map(|m| m.region));
                }
                Event::Broadcast { region, root } if *root == rank => narrowed.push(*region),
                Event::Broadcast { region, .. } => widened.push(*region),
                _ => {}
            }
        }
        (narrowed, widened)
    }

    /// The regions the recorded GPU steps narrowed and widened, in order.
    fn gpu_conversions(events: &[Event]) -> (Vec<Region>, Vec<Region>) {
        let narrowed = events.iter().filter_map(|e| match e {
            Event::Narrow(r) => Some(*r),
            _ => None,
        });
        let widened = events.iter().filter_map(|e| match e {
            Event::Widen(r) => Some(*r),
            _ => None,
        });
        (narrowed.collect(), widened.collect())
    }

    fn bytes(t: crate::schedule::Traffic) -> Bytes {
        Bytes {
            sent: t.sent,
            received: t.received,
        }
    }

    /// Every call of every rank's operator, both schedules, each precision: the CPU operator
    /// (over a `Counting` communicator) and the recording engine running the GPU backend's
    /// transport steps on the same programs. Returns a description of the first mismatch.
    fn compare(views: &[chunk_format::ChunkView<'_>], f: usize) -> Result<(), String> {
        let calls = [
            Op::Forward,
            Op::Backward,
            Op::SpmmValues,
            Op::SpmmValuesTranspose,
            Op::Sddmm,
            Op::SddmmBackward,
        ];
        for kind in ScheduleKind::ALL {
            for precision in Precision::ALL {
                let out = LocalComm::run(views.len(), |comm| -> Result<(), String> {
                    let rank = comm.rank();
                    let v = views[rank];
                    let counting = Counting::new(&comm);
                    let mut cpu = DistSpmm::with_precision(&counting, v, kind, precision)
                        .map_err(|e| e.to_string())?;
                    let agreed =
                        operator::agree_and_build(&comm, v, (kind, precision), |_, _, _| Ok(()))
                            .map_err(|e| e.to_string())?;
                    let mut gpu = agreed.with_engine(|()| RecordingEngine {
                        comm: &comm,
                        log: EngineLog::default(),
                    });
                    let (n, nnz) = (cpu.local_rows(), cpu.edge_count());
                    let x = vec![0.5f32; n * f];
                    let mut e = vec![0.25f32; nnz];
                    let (mut y, mut z) = (vec![0f32; n * f], vec![0f32; n * f]);
                    for call in calls {
                        let what = format!("{kind} {precision} {call:?} rank {rank}");
                        let before = counting.counts();
                        let xv = || DenseView::from_row_major(&x[..], n, f).unwrap();
                        let yv = DenseViewMut::from_row_major(&mut y[..], n, f).unwrap();
                        match call {
                            Op::Forward => cpu.forward(xv(), yv),
                            Op::Backward => cpu.backward(xv(), yv),
                            Op::SpmmValues => cpu.spmm_values(&e, xv(), yv),
                            Op::SpmmValuesTranspose => cpu.spmm_values_transpose(&e, xv(), yv),
                            Op::Sddmm => cpu.sddmm(xv(), xv(), &mut e),
                            Op::SddmmBackward => cpu.sddmm_backward(
                                &e,
                                xv(),
                                xv(),
                                yv,
                                DenseViewMut::from_row_major(&mut z[..], n, f).unwrap(),
                            ),
                        }
                        .map_err(|e| format!("{what}: CPU {e}"))?;
                        let counted = counting.counts().since(&before);
                        let done = if call.programs().len() == 1 {
                            // SAFETY: the recording engine touches no memory.
                            unsafe { gpu.call_programs(call, 1, f, Ok(()), [()], ()) }
                        } else {
                            // SAFETY: as above.
                            unsafe { gpu.call_programs(call, 1, f, Ok(()), [(), ()], ()) }
                        };
                        done.map_err(|e| format!("{what}: recording {e}"))?;
                        if gpu.bytes_last_call() != cpu.bytes_last_call() {
                            return Err(format!(
                                "{what}: the GPU steps count {:?}, the CPU engine {:?}",
                                gpu.bytes_last_call(),
                                cpu.bytes_last_call()
                            ));
                        }
                        let (mut p2p, mut bcast) = (Bytes::default(), Bytes::default());
                        for (k, _, _, r) in gpu.engine.log.executed.drain(..) {
                            if !r.hazards.is_empty() {
                                return Err(format!("{what} {k:?}: {:?}", r.hazards));
                            }
                            let gpu_conv = gpu_conversions(&r.events);
                            let want = match call.message_precision(precision) {
                                Precision::F32 => (Vec::new(), Vec::new()),
                                _ => cpu_conversions(&r.events, rank),
                            };
                            if gpu_conv != want {
                                return Err(format!(
                                    "{what} {k:?}: the GPU converts {gpu_conv:?}, the CPU \
                                     engine {want:?}"
                                ));
                            }
                            if r.point_to_point + r.broadcast != r.moved {
                                return Err(format!("{what} {k:?}: handed over ≠ counted"));
                            }
                            let add = |a: Bytes, t| Bytes {
                                sent: a.sent + bytes(t).sent,
                                received: a.received + bytes(t).received,
                            };
                            p2p = add(p2p, r.point_to_point);
                            bcast = add(bcast, r.broadcast);
                        }
                        if (p2p, bcast) != (counted.point_to_point, counted.broadcast) {
                            return Err(format!(
                                "{what}: the GPU hands over {p2p:?} point to point and \
                                 {bcast:?} by broadcast, the CPU engine {:?} and {:?}",
                                counted.point_to_point, counted.broadcast
                            ));
                        }
                    }
                    Ok(())
                });
                out.into_iter().collect::<Result<(), String>>()?;
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// The GPU backend's transport steps in bf16 and f16, recorded, narrow and widen the
        /// regions the CPU engine narrows and widens — every send region and the broadcasts at
        /// their root; every received region (each read by its exchange's body, after it is
        /// widened) and the broadcasts at the other ranks — and hand over the bytes the CPU
        /// engine hands its communicator, point to point and by broadcast, for every call,
        /// schedule and rank of random graphs and partitions; in f32 they convert nothing.
        #[test]
        fn gpu_transport_steps_convert_and_count_as_the_cpu_engine(
            (n, edges, part_of, parts) in graphs(30, 4, 4),
            f in 1usize..4,
        ) {
            let bufs = chunks(n, &edges, &part_of, parts);
            let result = compare(&views(&bufs), f);
            prop_assert!(result.is_ok(), "{}", result.unwrap_err());
        }
    }

    #[test]
    fn the_ring_converts_and_counts_as_the_cpu_engine() {
        let bufs = ring(30, 3);
        compare(&views(&bufs), 4).unwrap();
    }

    #[test]
    fn the_recorder_catches_a_received_region_the_body_never_reads() {
        let region = Region::new(Buf::Halo, 0, 2);
        let program = [Instr::Exchange(Exchange {
            tag: 7,
            sends: Vec::new(),
            recvs: vec![Message { peer: 1, region }],
            body: Vec::new(),
        })];
        let call = WireCall {
            precision: Precision::Bf16,
            f: 3,
            rank: 0,
            size: 2,
        };
        let r = record_in(&program, call);
        assert!(
            r.hazards.iter().any(|h| h.contains("never reads")),
            "{:?}",
            r.hazards
        );
        // Widened where it arrived, 2 bytes per value.
        assert_eq!(r.events.last(), Some(&Event::Completed));
        assert!(r.events.contains(&Event::Widen(region)));
        assert_eq!(r.moved.received, 12);
    }
}
