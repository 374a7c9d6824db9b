//! The halo schedule: one grouped exchange per call, the local block while the messages
//! travel (see `HaloPlan` for the algebra).
//!
//! ```text
//! forward:  pack X_p[send(r)] for every peer r
//!           exchange: send them, receive H_q from every q   ║  Y = A[p][p]·X_p     (local lane)
//!           join;  for q increasing: Y += A[p][q]·H_q
//! backward: for q increasing: P_q = A[p][q]ᵀ·dY_p
//!           exchange: send P_q to q, receive S_r from every r ║  dX = A[p][p]ᵀ·dY_p (local lane)
//!           join;  for r increasing: dX[send(r)] += S_r
//! sddmm:    pack V_p[send(r)] for every peer r
//!           exchange: send them, receive H_q from every q   ║  E[p][p] = sddmm(U_p, V_p) (local lane)
//!           for q increasing: E[p][q] = sddmm(U_p, H_q);  join
//! ```
//!
//! `A` is `Â` (the chunk's values, [`Values::Chunk`]) or the call's per-edge values
//! ([`Values::Edges`]); the SDDMM's backward is the forward with values `dE` and `X = V`
//! (`dU`) followed by the backward with values `dE` and `dY = U` (`dV`).

use crate::backend::{
    Accumulate, Buf, Dense, Exchange, Instr, Lane, Matrix, Message, Orient, Product, Program,
    Region, Rows, Values,
};
use crate::layout::{HaloLayout, Segment};
use crate::{TAG_BACKWARD, TAG_FORWARD};

fn messages(segments: &[Segment], buf: Buf) -> Vec<Message> {
    segments
        .iter()
        .map(|s| Message {
            peer: s.peer,
            region: Region::new(buf, s.first, s.rows),
        })
        .collect()
}

/// Packs the send lists of the input and posts the forward exchange around `body`.
fn send_rows_around(layout: &HaloLayout, recvs: Vec<Message>, body: Program) -> Program {
    vec![
        Instr::Pack {
            rows: Rows::SendLists,
            into: Region::new(Buf::Packed, 0, layout.sent_rows()),
        },
        Instr::Exchange(Exchange {
            tag: TAG_FORWARD,
            sends: messages(&layout.sends, Buf::Packed),
            recvs,
            body,
        }),
    ]
}

const JOIN_LOCAL: Instr = Instr::Join {
    waiter: Lane::Comm,
    signaller: Lane::Local,
};

/// `Y_p = A[p][p]·X_p + Σ_q A[p][q]·H_q`.
pub(crate) fn forward(layout: &HaloLayout, values: Values) -> Program {
    let recvs = messages(&layout.recvs, Buf::Halo);
    let mut body = vec![
        Instr::Spmm(Product {
            lane: Lane::Local,
            a: Matrix::Diagonal,
            orient: Orient::Plain,
            values,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Output,
        }),
        JOIN_LOCAL,
    ];
    body.extend(recvs.iter().enumerate().map(|(k, m)| {
        Instr::Spmm(Product {
            lane: Lane::Comm,
            a: Matrix::Remote(k),
            orient: Orient::Plain,
            values,
            x: Dense::Region(m.region),
            acc: Accumulate::Add,
            y: Dense::Output,
        })
    }));
    send_rows_around(layout, recvs, body)
}

/// `dX_p = A[p][p]ᵀ·dY_p + Σ_r scatter(send(r), A[r][p]ᵀ·dY_r)`: the forward's buffers with
/// their roles swapped.
pub(crate) fn backward(layout: &HaloLayout, values: Values) -> Program {
    let partials = messages(&layout.recvs, Buf::Halo);
    let incoming = messages(&layout.sends, Buf::Packed);
    let mut program: Program = partials
        .iter()
        .enumerate()
        .map(|(k, m)| {
            Instr::Spmm(Product {
                lane: Lane::Comm,
                a: Matrix::Remote(k),
                orient: Orient::Transposed,
                values,
                x: Dense::Input,
                acc: Accumulate::Overwrite,
                y: Dense::Region(m.region),
            })
        })
        .collect();
    let body = vec![
        Instr::Spmm(Product {
            lane: Lane::Local,
            a: Matrix::Diagonal,
            orient: Orient::Transposed,
            values,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Output,
        }),
        JOIN_LOCAL,
        Instr::ScatterAdd {
            from: incoming.clone(),
        },
    ];
    program.push(Instr::Exchange(Exchange {
        tag: TAG_BACKWARD,
        sends: partials,
        recvs: incoming,
        body,
    }));
    program
}

/// `E[p][q] = sddmm(U_p, V_q)` for every block: the forward's exchange of `V`'s rows, the
/// diagonal block on the local lane while they travel, the remote blocks as they arrive.
pub(crate) fn sddmm(layout: &HaloLayout) -> Program {
    let recvs = messages(&layout.recvs, Buf::Halo);
    let mut body = vec![Instr::Sddmm {
        lane: Lane::Local,
        block: Matrix::Diagonal,
        u: Dense::Left,
        v: Dense::Input,
        out: Values::Edges,
    }];
    body.extend(recvs.iter().enumerate().map(|(k, m)| Instr::Sddmm {
        lane: Lane::Comm,
        block: Matrix::Remote(k),
        u: Dense::Left,
        v: Dense::Region(m.region),
        out: Values::Edges,
    }));
    body.push(JOIN_LOCAL);
    send_rows_around(layout, recvs, body)
}
