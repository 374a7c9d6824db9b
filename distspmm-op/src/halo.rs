//! The halo schedule: one grouped exchange per call, the local block while the messages
//! travel (see `HaloPlan` for the algebra).
//!
//! ```text
//! forward:  pack X_p[send(r)] for every peer r
//!           exchange: send them, receive H_q from every q   ║  Y = Â[p][p]·X_p     (local lane)
//!           join;  for q increasing: Y += Â[p][q]·H_q
//! backward: for q increasing: P_q = Â[p][q]ᵀ·dY_p
//!           exchange: send P_q to q, receive S_r from every r ║  dX = Â[p][p]ᵀ·dY_p (local lane)
//!           join;  for r increasing: dX[send(r)] += S_r
//! ```

use crate::backend::{
    Accumulate, Buf, Dense, Exchange, Instr, Lane, Matrix, Message, Orient, Program, Region, Rows,
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

/// `Y_p = Â[p][p]·X_p + Σ_q Â[p][q]·H_q`.
pub(crate) fn forward(layout: &HaloLayout) -> Program {
    let sends = messages(&layout.sends, Buf::Packed);
    let recvs = messages(&layout.recvs, Buf::Halo);
    let mut body = vec![
        Instr::Spmm {
            lane: Lane::Local,
            a: Matrix::Diagonal,
            orient: Orient::Plain,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Output,
        },
        Instr::Join {
            waiter: Lane::Comm,
            signaller: Lane::Local,
        },
    ];
    body.extend(recvs.iter().enumerate().map(|(k, m)| Instr::Spmm {
        lane: Lane::Comm,
        a: Matrix::Remote(k),
        orient: Orient::Plain,
        x: Dense::Region(m.region),
        acc: Accumulate::Add,
        y: Dense::Output,
    }));
    vec![
        Instr::Pack {
            rows: Rows::SendLists,
            into: Region::new(Buf::Packed, 0, layout.sent_rows()),
        },
        Instr::Exchange(Exchange {
            tag: TAG_FORWARD,
            sends,
            recvs,
            body,
        }),
    ]
}

/// `dX_p = Â[p][p]ᵀ·dY_p + Σ_r scatter(send(r), Â[r][p]ᵀ·dY_r)`: the forward's buffers with
/// their roles swapped.
pub(crate) fn backward(layout: &HaloLayout) -> Program {
    let partials = messages(&layout.recvs, Buf::Halo);
    let incoming = messages(&layout.sends, Buf::Packed);
    let mut program: Program = partials
        .iter()
        .enumerate()
        .map(|(k, m)| Instr::Spmm {
            lane: Lane::Comm,
            a: Matrix::Remote(k),
            orient: Orient::Transposed,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Region(m.region),
        })
        .collect();
    let body = vec![
        Instr::Spmm {
            lane: Lane::Local,
            a: Matrix::Diagonal,
            orient: Orient::Transposed,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Output,
        },
        Instr::Join {
            waiter: Lane::Comm,
            signaller: Lane::Local,
        },
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
