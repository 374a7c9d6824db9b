//! The halo schedule's execution: one exchange per call, local block while messages travel.

use chunk_format::ChunkView;
use distspmm_core::kernel::{spmm, spmm_transpose};
use distspmm_core::schedule::{HaloPlan, Traffic, Workspace};
use distspmm_core::sparse::{CscView, CsrView, DenseView, DenseViewMut};

use super::{rows, value_bytes, Buffer, DistSpmmError, TAG_BACKWARD, TAG_FORWARD};
use crate::{CommError, Communicator, Completion, Exchange, RequestId};

/// One off-diagonal block over compacted columns (column c = row c of the halo from `src`).
#[derive(Debug)]
struct RemoteBlock<'a> {
    src: usize,
    csr: CsrView<'a, f32>,
    csc: CscView<'a, f32>,
}

/// The halo plan, the chunk's remote blocks and the two message buffers.
#[derive(Debug)]
pub(super) struct HaloState<'a> {
    plan: HaloPlan<'a>,
    /// In increasing source part: exactly the parts this rank receives from.
    blocks: Vec<RemoteBlock<'a>>,
    /// Forward: the packed rows this rank sends. Backward: the partial sums it receives.
    send: Buffer,
    /// Forward: the halo rows this rank receives. Backward: the partial sums it sends.
    recv: Buffer,
    /// Request ids of the posted receives (reused).
    ids: Vec<RequestId>,
}

impl<'a> HaloState<'a> {
    pub(super) fn new(chunk: &ChunkView<'a>) -> Result<Self, DistSpmmError> {
        let part = chunk.part_id();
        let blocks = chunk
            .blocks()
            .filter(|b| b.src_part as usize != part)
            .map(|b| {
                let err = |source| DistSpmmError::Block {
                    part,
                    src: b.src_part as usize,
                    source,
                };
                Ok(RemoteBlock {
                    src: b.src_part as usize,
                    csr: CsrView::new(b.nrows, b.ncols, b.csr_rowptr, b.csr_cols, b.csr_vals)
                        .map_err(err)?,
                    csc: CscView::new(b.nrows, b.ncols, b.csc_colptr, b.csc_rows, b.csc_vals)
                        .map_err(err)?,
                })
            })
            .collect::<Result<Vec<_>, DistSpmmError>>()?;
        Ok(Self {
            plan: HaloPlan::from_chunk(chunk),
            ids: Vec::with_capacity(blocks.len().max(chunk.num_parts())),
            blocks,
            send: Buffer::default(),
            recv: Buffer::default(),
        })
    }

    /// Makes room for calls with `features` columns (both directions use both buffers).
    pub(super) fn reserve(&mut self, features: usize) -> Result<(), DistSpmmError> {
        self.send
            .reserve(self.plan.sent_rows() as usize * features)?;
        self.recv.reserve(self.plan.halo_rows() as usize * features)
    }

    pub(super) fn workspace(&self) -> Workspace {
        Workspace {
            buffers: value_bytes(self.send.len() + self.recv.len()),
            structure: 0,
        }
    }

    /// `Y_p = Â[p][p]·X_p + Σ_q Â[p][q]·H_q`, see `HaloPlan`.
    pub(super) fn forward<C: Communicator>(
        &mut self,
        comm: &C,
        diagonal: &CsrView<'_, f32>,
        x: DenseView<'_, f32>,
        mut y: DenseViewMut<'_, f32>,
    ) -> Result<Traffic, DistSpmmError> {
        let f = x.cols();
        let plan = self.plan;
        let send = self.send.get(plan.sent_rows() as usize * f);
        let recv = self.recv.get(plan.halo_rows() as usize * f);
        let traffic = Traffic {
            sent: value_bytes(send.len()),
            received: value_bytes(recv.len()),
        };
        let (blocks, ids) = (&self.blocks, &mut self.ids);
        comm.exchange(|ex| {
            ids.clear();
            let mut rest = recv;
            for b in blocks {
                let (halo, tail) = std::mem::take(&mut rest).split_at_mut(b.csr.ncols() * f);
                ids.push(ex.irecv(b.src, TAG_FORWARD, halo)?);
                rest = tail;
            }
            let mut rest = send;
            for r in plan.send_peers() {
                let list = plan.send_list(r);
                let (out, tail) = std::mem::take(&mut rest).split_at_mut(list.len() * f);
                rows::pack(&x, list, out);
                ex.isend(r, TAG_FORWARD, out)?;
                rest = tail;
            }
            // The local block while the messages travel.
            if let Err(e) = spmm(1.0, diagonal, x, 0.0, y.reborrow()) {
                return Ok(Err(e.into()));
            }
            // Remote blocks in increasing source part, each as soon as it (and those before
            // it) are in: a fixed order of addition whatever the order of arrival.
            for (b, &id) in blocks.iter().zip(ids.iter()) {
                let halo = received(ex.wait(id)?, id)?;
                let step = DenseView::from_row_major(&*halo, b.csr.ncols(), f)
                    .map_err(|e| DistSpmmError::Shape(format!("halo from rank {}: {e}", b.src)))
                    .and_then(|h| Ok(spmm(1.0, &b.csr, h, 1.0, y.reborrow())?));
                if let Err(e) = step {
                    return Ok(Err(e));
                }
            }
            Ok(Ok(()))
        })??;
        Ok(traffic)
    }

    /// `dX_p = Â[p][p]ᵀ·dY_p + Σ_r scatter(send(r), Â[r][p]ᵀ·dY_r)`, see `HaloPlan`.
    pub(super) fn backward<C: Communicator>(
        &mut self,
        comm: &C,
        diagonal_t: &CscView<'_, f32>,
        dy: DenseView<'_, f32>,
        mut dx: DenseViewMut<'_, f32>,
    ) -> Result<Traffic, DistSpmmError> {
        let f = dy.cols();
        let plan = self.plan;
        // The forward buffers with their roles swapped.
        let incoming = self.send.get(plan.sent_rows() as usize * f);
        let outgoing = self.recv.get(plan.halo_rows() as usize * f);
        let traffic = Traffic {
            sent: value_bytes(outgoing.len()),
            received: value_bytes(incoming.len()),
        };
        let (blocks, ids) = (&self.blocks, &mut self.ids);
        comm.exchange(|ex| {
            ids.clear();
            let mut rest = incoming;
            for r in plan.send_peers() {
                let len = plan.send_list(r).len() * f;
                let (partial, tail) = std::mem::take(&mut rest).split_at_mut(len);
                ids.push(ex.irecv(r, TAG_BACKWARD, partial)?);
                rest = tail;
            }
            let mut rest = outgoing;
            for b in blocks {
                let rows = b.csc.ncols();
                let (partial, tail) = std::mem::take(&mut rest).split_at_mut(rows * f);
                let step = DenseViewMut::from_row_major(&mut *partial, rows, f)
                    .map_err(|e| DistSpmmError::Shape(format!("partial sums for {}: {e}", b.src)))
                    .and_then(|out| Ok(spmm_transpose(1.0, &b.csc, dy, 0.0, out)?));
                if let Err(e) = step {
                    return Ok(Err(e));
                }
                ex.isend(b.src, TAG_BACKWARD, partial)?;
                rest = tail;
            }
            if let Err(e) = spmm_transpose(1.0, diagonal_t, dy, 0.0, dx.reborrow()) {
                return Ok(Err(e.into()));
            }
            for (r, &id) in plan.send_peers().zip(ids.iter()) {
                let partial = received(ex.wait(id)?, id)?;
                rows::scatter_add(dx.reborrow(), plan.send_list(r), partial);
            }
            Ok(Ok(()))
        })??;
        Ok(traffic)
    }
}

/// The buffer of a finished receive (`id` names a receive, so it cannot be a send).
pub(super) fn received<'a, T>(
    done: Completion<'a, T>,
    id: RequestId,
) -> Result<&'a mut [T], CommError> {
    match done {
        Completion::Received { data, .. } => Ok(data),
        Completion::Sent { .. } => Err(CommError::InvalidRequest { id: id.0 }),
    }
}
