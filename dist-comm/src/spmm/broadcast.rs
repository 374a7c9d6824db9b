//! The broadcast schedule's execution: P blocking broadcasts forward, P reductions to a root
//! backward (each a point-to-point exchange that the root adds up in increasing rank).

use chunk_format::ChunkView;
use distspmm_core::kernel::{spmm, spmm_transpose};
use distspmm_core::schedule::{BroadcastPlan, Traffic, Workspace};
use distspmm_core::sparse::{Csc, CscView, Csr, CsrView, DenseView, DenseViewMut};

use super::halo::received;
use super::{rows, value_bytes, Buffer, DistSpmmError, Op, TAG_BACKWARD};
use crate::{Communicator, Exchange, RequestId};

/// A block `Â[p][q]` over q-local columns `0..n_q`: the CSR with its column ids mapped through
/// the halo receive list (owned), the CSC with its column pointer spread over all `n_q`
/// columns (owned); row pointers, row ids and values borrowed from the chunk.
#[derive(Debug)]
pub(super) struct QLocalBlock<'a> {
    pub(super) csr: Csr<f32, &'a [u64], Vec<u32>, &'a [f32]>,
    pub(super) csc: Csc<f32, Vec<u64>, &'a [u32], &'a [f32]>,
}

/// The off-diagonal blocks of `chunk` in q-local columns, indexed by source part (`None` for
/// the chunk's own part and for empty blocks); the GPU operator uploads the same blocks.
pub(super) fn q_local_blocks<'a>(
    chunk: &ChunkView<'a>,
) -> Result<Vec<Option<QLocalBlock<'a>>>, DistSpmmError> {
    let part = chunk.part_id();
    let offsets = chunk.part_offsets();
    let mut blocks: Vec<Option<QLocalBlock<'a>>> = (0..chunk.num_parts()).map(|_| None).collect();
    for b in chunk.blocks().filter(|b| b.src_part as usize != part) {
        let q = b.src_part as usize;
        let n_q = (offsets[q + 1] - offsets[q]) as usize;
        let halo = chunk.halo_recv(q);
        let err = |source| DistSpmmError::Block {
            part,
            src: q,
            source,
        };
        let cols: Vec<u32> = b.csr_cols.iter().map(|&c| halo[c as usize]).collect();
        let mut colptr = vec![0u64; n_q + 1];
        for (c, w) in b.csc_colptr.windows(2).enumerate() {
            colptr[halo[c] as usize + 1] = w[1] - w[0];
        }
        for i in 0..n_q {
            colptr[i + 1] += colptr[i];
        }
        blocks[q] = Some(QLocalBlock {
            csr: Csr::new(b.nrows, n_q, b.csr_rowptr, cols, b.csr_vals).map_err(err)?,
            csc: Csc::new(b.nrows, n_q, colptr, b.csc_rows, b.csc_vals).map_err(err)?,
        });
    }
    Ok(blocks)
}

/// The broadcast plan, the blocks in q-local columns and the two buffers.
#[derive(Debug)]
pub(super) struct BroadcastState<'a> {
    plan: BroadcastPlan,
    /// Indexed by source part; `None` for this rank's own part and for empty blocks.
    blocks: Vec<Option<QLocalBlock<'a>>>,
    /// Forward: the rows being broadcast. Backward: this rank's contribution to a root.
    panel: Buffer,
    /// Backward: the P−1 contributions to this rank's rows.
    inbox: Buffer,
    /// Request ids of the posted receives (reused).
    ids: Vec<RequestId>,
}

impl<'a> BroadcastState<'a> {
    pub(super) fn new(chunk: &ChunkView<'a>) -> Result<Self, DistSpmmError> {
        Ok(Self {
            plan: BroadcastPlan::from_chunk(chunk),
            blocks: q_local_blocks(chunk)?,
            panel: Buffer::default(),
            inbox: Buffer::default(),
            ids: Vec::with_capacity(chunk.num_parts()),
        })
    }

    /// Makes room for a call of `op` with `features` columns.
    pub(super) fn reserve(&mut self, op: Op, features: usize) -> Result<(), DistSpmmError> {
        self.panel.reserve(self.panel_rows() * features)?;
        if op == Op::Backward {
            let own = self
                .plan
                .steps()
                .nth(self.plan.rank())
                .map_or(0, |s| s.rows);
            self.inbox
                .reserve((self.plan.parts() - 1) * own as usize * features)?;
        }
        Ok(())
    }

    pub(super) fn workspace(&self) -> Workspace {
        let structure = self
            .blocks
            .iter()
            .flatten()
            .map(|b| 4 * b.csr.nnz() as u64 + 8 * b.csc.indptr().len() as u64)
            .sum();
        Workspace {
            buffers: value_bytes(self.panel.len() + self.inbox.len()),
            structure,
        }
    }

    /// Rows of the largest part (the panel), 0 when there is nobody to talk to.
    fn panel_rows(&self) -> usize {
        if self.plan.parts() > 1 {
            self.plan
                .steps()
                .map(|s| s.rows as usize)
                .max()
                .unwrap_or(0)
        } else {
            0
        }
    }

    /// For q = 0..P−1: q broadcasts `X_q`; `Y_p += Â[p][q]·X_q`.
    pub(super) fn forward<C: Communicator>(
        &mut self,
        comm: &C,
        diagonal: &CsrView<'_, f32>,
        x: DenseView<'_, f32>,
        mut y: DenseViewMut<'_, f32>,
    ) -> Result<Traffic, DistSpmmError> {
        let (f, me, parts) = (x.cols(), self.plan.rank(), self.plan.parts());
        let panel_len = self.panel_rows() * f;
        let panel = self.panel.get(panel_len);
        let mut traffic = Traffic::default();
        let mut beta = 0.0; // the first product overwrites Y
        for step in self.plan.steps() {
            let (q, rows) = (step.root, step.rows as usize);
            if parts > 1 {
                let x_q = &mut panel[..rows * f];
                if q == me {
                    rows::copy_rows(&x, x_q);
                    traffic.sent += value_bytes(x_q.len()) * (parts as u64 - 1);
                } else {
                    traffic.received += value_bytes(x_q.len());
                }
                comm.broadcast(x_q, q)?;
            }
            if q == me {
                spmm(1.0, diagonal, x, beta, y.reborrow())?;
                beta = 1.0;
            } else if let Some(block) = &self.blocks[q] {
                let x_q = DenseView::from_row_major(&panel[..rows * f], rows, f)
                    .map_err(|e| DistSpmmError::Shape(format!("rows from rank {q}: {e}")))?;
                spmm(1.0, &block.csr.view(), x_q, beta, y.reborrow())?;
                beta = 1.0;
            }
        }
        Ok(traffic)
    }

    /// For q = 0..P−1: every p ≠ q sends `Â[p][q]ᵀ·dY_p` to q, which adds them to
    /// `Â[q][q]ᵀ·dY_q` in increasing p.
    pub(super) fn backward<C: Communicator>(
        &mut self,
        comm: &C,
        diagonal_t: &CscView<'_, f32>,
        dy: DenseView<'_, f32>,
        mut dx: DenseViewMut<'_, f32>,
    ) -> Result<Traffic, DistSpmmError> {
        let (f, me, parts) = (dy.cols(), self.plan.rank(), self.plan.parts());
        let n = dy.rows();
        let panel_len = self.panel_rows() * f;
        let panel = self.panel.get(panel_len);
        let inbox = self.inbox.get((parts - 1) * n * f);
        let mut traffic = Traffic::default();
        for step in self.plan.steps() {
            let (q, rows) = (step.root, step.rows as usize);
            if q == me {
                spmm_transpose(1.0, diagonal_t, dy, 0.0, dx.reborrow())?;
                if parts == 1 {
                    continue;
                }
                traffic.received += value_bytes(inbox.len());
                let ids = &mut self.ids;
                let dx = &mut dx;
                comm.exchange(|ex| {
                    ids.clear();
                    let mut rest = &mut inbox[..];
                    for r in (0..parts).filter(|&r| r != me) {
                        let (part, tail) = std::mem::take(&mut rest).split_at_mut(n * f);
                        ids.push(ex.irecv(r, TAG_BACKWARD, part)?);
                        rest = tail;
                    }
                    for &id in ids.iter() {
                        rows::add_all(dx.reborrow(), received(ex.wait(id)?, id)?);
                    }
                    Ok(())
                })?;
            } else {
                let partial = &mut panel[..rows * f];
                match &self.blocks[q] {
                    Some(block) => {
                        let out =
                            DenseViewMut::from_row_major(&mut *partial, rows, f).map_err(|e| {
                                DistSpmmError::Shape(format!("contribution to rank {q}: {e}"))
                            })?;
                        spmm_transpose(1.0, &block.csc.view(), dy, 0.0, out)?;
                    }
                    None => partial.fill(0.0),
                }
                traffic.sent += value_bytes(partial.len());
                comm.exchange(|ex| ex.isend(q, TAG_BACKWARD, &*partial).map(|_| ()))?;
            }
        }
        Ok(traffic)
    }
}
