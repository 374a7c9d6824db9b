//! The broadcast schedule: P broadcasts forward, P reductions to a root backward (see
//! `BroadcastPlan`).
//!
//! ```text
//! forward:  for q = 0..P−1:  q broadcasts X_q;  Y_p += A[p][q]·X_q   (the first product overwrites)
//! backward: for q = 0..P−1:  q == p: dX_p = A[p][p]ᵀ·dY_p, receive every other rank's
//!                                    contribution and add them in increasing rank
//!                            q != p: send A[p][q]ᵀ·dY_p to q (zeros for an empty block)
//! sddmm:    for q = 0..P−1:  q broadcasts V_q;  E[p][q] = sddmm(U_p, V_q)
//! ```
//!
//! `A` is `Â` ([`Values::Chunk`]) or the call's per-edge values ([`Values::Edges`]).
//! Everything runs on [`Lane::Comm`], in order.

use crate::schedule::BroadcastPlan;

use crate::backend::{
    Accumulate, Buf, Dense, Exchange, Instr, Lane, Matrix, Message, Orient, Product, Program,
    Region, Rows, Values,
};
use crate::TAG_BACKWARD;

/// Broadcasts every rank's input in turn and appends `step(block, rows)` after each
/// broadcast for which this rank has a block: the diagonal block over the input, or `Â[p][q]`
/// over q-local columns over the panel.
fn each_broadcast(
    plan: &BroadcastPlan,
    has_block: &[bool],
    mut step: impl FnMut(Matrix, Dense) -> Instr,
) -> Program {
    let (me, parts) = (plan.rank(), plan.parts());
    let mut program = Program::new();
    for step_of in plan.steps() {
        // A part's rows: at most u32::MAX, checked by `ChunkView::parse`.
        let (q, rows) = (step_of.root, distspmm_sparse::index::offset(step_of.rows));
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
        if q == me {
            program.push(step(Matrix::Diagonal, Dense::Input));
        } else if has_block[q] {
            program.push(step(Matrix::QLocal(q), Dense::Region(panel)));
        }
    }
    program
}

/// The forward program; `has_block[q]` says whether `Â[p][q]` (q ≠ p) has non-zeros.
pub(crate) fn forward(plan: &BroadcastPlan, has_block: &[bool], values: Values) -> Program {
    let mut acc = Accumulate::Overwrite;
    each_broadcast(plan, has_block, |a, x| {
        let product = Product {
            lane: Lane::Comm,
            a,
            orient: Orient::Plain,
            values,
            x,
            acc,
            y: Dense::Output,
        };
        acc = Accumulate::Add;
        Instr::Spmm(product)
    })
}

/// The SDDMM: `E[p][q] = sddmm(U_p, V_q)` after each broadcast of `V_q`.
pub(crate) fn sddmm(plan: &BroadcastPlan, has_block: &[bool]) -> Program {
    each_broadcast(plan, has_block, |block, v| Instr::Sddmm {
        lane: Lane::Comm,
        block,
        u: Dense::Left,
        v,
        out: Values::Edges,
    })
}

/// The backward program; `n` is this rank's row count.
pub(crate) fn backward(
    plan: &BroadcastPlan,
    has_block: &[bool],
    n: usize,
    values: Values,
) -> Program {
    let (me, parts) = (plan.rank(), plan.parts());
    let mut program = Program::new();
    for step in plan.steps() {
        // A part's rows: at most u32::MAX, checked by `ChunkView::parse`.
        let (q, rows) = (step.root, distspmm_sparse::index::offset(step.rows));
        if q == me {
            program.push(Instr::Spmm(Product {
                lane: Lane::Comm,
                a: Matrix::Diagonal,
                orient: Orient::Transposed,
                values,
                x: Dense::Input,
                acc: Accumulate::Overwrite,
                y: Dense::Output,
            }));
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
                Instr::Spmm(Product {
                    lane: Lane::Comm,
                    a: Matrix::QLocal(q),
                    orient: Orient::Transposed,
                    values,
                    x: Dense::Input,
                    acc: Accumulate::Overwrite,
                    y: Dense::Region(partial),
                })
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
