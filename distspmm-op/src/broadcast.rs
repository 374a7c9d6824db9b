//! The broadcast schedule: P broadcasts forward, P reductions to a root backward (see
//! `BroadcastPlan`).
//!
//! ```text
//! forward:  for q = 0..P−1:  q broadcasts X_q;  Y_p += Â[p][q]·X_q   (the first product overwrites)
//! backward: for q = 0..P−1:  q == p: dX_p = Â[p][p]ᵀ·dY_p, receive every other rank's
//!                                    contribution and add them in increasing rank
//!                            q != p: send Â[p][q]ᵀ·dY_p to q (zeros for an empty block)
//! ```
//!
//! Everything runs on [`Lane::Comm`], in order.

use distspmm_core::schedule::BroadcastPlan;

use crate::backend::{
    Accumulate, Buf, Dense, Exchange, Instr, Lane, Matrix, Message, Orient, Program, Region, Rows,
};
use crate::TAG_BACKWARD;

/// The forward program; `has_block[q]` says whether `Â[p][q]` (q ≠ p) has non-zeros.
pub(crate) fn forward(plan: &BroadcastPlan, has_block: &[bool]) -> Program {
    let (me, parts) = (plan.rank(), plan.parts());
    let mut program = Program::new();
    let mut acc = Accumulate::Overwrite;
    for step in plan.steps() {
        // A part's rows: at most u32::MAX, checked by `ChunkView::parse`.
        let (q, rows) = (step.root, distspmm_core::index::offset(step.rows));
        let panel = Region::new(Buf::Packed, 0, rows);
        if parts > 1 {
            if q == me {
                program.push(Instr::Pack {
                    rows: Rows::All,
                    into: panel,
                });
            }
            program.push(Instr::Broadcast {
                region: panel,
                root: q,
            });
        }
        let (a, x) = if q == me {
            (Matrix::Diagonal, Dense::Input)
        } else if has_block[q] {
            (Matrix::QLocal(q), Dense::Region(panel))
        } else {
            continue;
        };
        program.push(Instr::Spmm {
            lane: Lane::Comm,
            a,
            orient: Orient::Plain,
            x,
            acc,
            y: Dense::Output,
        });
        acc = Accumulate::Add;
    }
    program
}

/// The backward program; `n` is this rank's row count.
pub(crate) fn backward(plan: &BroadcastPlan, has_block: &[bool], n: usize) -> Program {
    let (me, parts) = (plan.rank(), plan.parts());
    let mut program = Program::new();
    for step in plan.steps() {
        // A part's rows: at most u32::MAX, checked by `ChunkView::parse`.
        let (q, rows) = (step.root, distspmm_core::index::offset(step.rows));
        if q == me {
            program.push(Instr::Spmm {
                lane: Lane::Comm,
                a: Matrix::Diagonal,
                orient: Orient::Transposed,
                x: Dense::Input,
                acc: Accumulate::Overwrite,
                y: Dense::Output,
            });
            if parts == 1 {
                continue;
            }
            let inbox: Vec<Region> = (0..parts - 1)
                .map(|k| Region::new(Buf::Halo, k * n, n))
                .collect();
            let recvs = (0..parts)
                .filter(|&r| r != me)
                .zip(&inbox)
                .map(|(peer, &region)| Message { peer, region })
                .collect();
            program.push(Instr::Exchange(Exchange {
                tag: TAG_BACKWARD,
                sends: Vec::new(),
                recvs,
                body: vec![Instr::AddBlocks { from: inbox }],
            }));
        } else {
            let partial = Region::new(Buf::Packed, 0, rows);
            program.push(if has_block[q] {
                Instr::Spmm {
                    lane: Lane::Comm,
                    a: Matrix::QLocal(q),
                    orient: Orient::Transposed,
                    x: Dense::Input,
                    acc: Accumulate::Overwrite,
                    y: Dense::Region(partial),
                }
            } else {
                Instr::Zero { into: partial }
            });
            program.push(Instr::Exchange(Exchange {
                tag: TAG_BACKWARD,
                sends: vec![Message {
                    peer: q,
                    region: partial,
                }],
                recvs: Vec::new(),
                body: Program::new(),
            }));
        }
    }
    program
}
