//! A recording backend: runs a rank's programs without memory or messages and checks the
//! choreography the GPU backend relies on — which lane touches what (dense operands, buffer
//! regions, and each block's run of the per-edge operand), which joins order them, what each
//! exchange sends and receives — on the CPU. Tests then check that the ranks'
//! programs match each other (every send has its receive, broadcasts agree) and move the bytes
//! the plans predict.

use crate::backend::{
    run, Accumulate, Backend, Dense, Exchange, Lane, Matrix, Message, Product, Region, Rows, Values,
};
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
}

/// Memory a primitive touches: a dense operand or region, or one block's run of the per-edge
/// operand (the runs of different blocks are disjoint; the chunk's values are never written).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Dense(Dense),
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
        (Target::Dense(Dense::Region(r)), Target::Dense(Dense::Region(s))) => {
            r.buf == s.buf && r.first < s.end() && s.first < r.end()
        }
        _ => a == b,
    }
}

/// The recording backend of one rank. `hazards` lists every access that a GPU would run
/// unordered against an earlier conflicting access on the other lane, and every breach of the
/// exchange rules of [`backend`](crate::backend).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub(crate) events: Vec<Event>,
    pub(crate) hazards: Vec<String>,
    accesses: Vec<Access>,
    /// Operations issued per lane.
    issued: [usize; 2],
    /// `seen[l][m]`: lane l has waited for the first `seen[l][m]` operations of lane m.
    seen: [[usize; 2]; 2],
    /// The exchange whose body is running: (sent, received) regions.
    open: Option<(Vec<Region>, Vec<Region>)>,
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
                    if !ok {
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
        let r = Dense::Region(region);
        self.access(Lane::Comm, &[r], &[r], "broadcast");
        self.events.push(Event::Broadcast { region, root });
        Ok(())
    }

    fn exchange(&mut self, ex: &Exchange) -> Result<(), DistSpmmError> {
        if self.open.is_some() {
            self.hazards.push("an exchange inside an exchange".into());
        }
        let region = |m: &Message| Dense::Region(m.region);
        let reads: Vec<Dense> = ex.sends.iter().map(region).collect();
        let writes: Vec<Dense> = ex.recvs.iter().map(region).collect();
        self.access(Lane::Comm, &reads, &writes, "exchange");
        self.events.push(Event::Posted {
            tag: ex.tag,
            sends: ex.sends.clone(),
            recvs: ex.recvs.clone(),
        });
        let sent = ex.sends.iter().map(|m| m.region).collect();
        let received = ex.recvs.iter().map(|m| m.region).collect();
        self.open = Some((sent, received));
        let body = run(self, &ex.body);
        self.open = None;
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

/// Records `program` from a clean start (both lanes joined to the caller).
pub(crate) fn record(program: &[crate::backend::Instr]) -> Recorder {
    let mut r = Recorder::default();
    run(&mut r, program).expect("the recorder accepts every program");
    r.finish();
    r
}

/// What a [`RecordingEngine`] saw of one call: its op, groups and F as reserved, and the
/// programs it was handed, each with its recorder.
#[derive(Debug, Default)]
pub(crate) struct EngineLog {
    pub(crate) reserved: Vec<(crate::Op, usize, usize)>,
    pub(crate) executed: Vec<(crate::Kind, usize, usize, Recorder)>,
}

/// An engine of the operator shell that runs every program on the recording backend: the
/// shell's call path (reserve, agree, programs in order, bytes) with nothing but the
/// choreography behind it.
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
        for (kind, ()) in programs {
            let r = record(s.schedule.program(kind));
            self.log.executed.push((kind, groups, f, r));
        }
        Ok(())
    }

    fn workspace(&self) -> distspmm_core::schedule::Workspace {
        distspmm_core::schedule::Workspace::default()
    }
}
