//! The CPU backend: distspmm-core's kernels (rayon threads) on host buffers, rows moved by any
//! communicator with broadcast and point-to-point messages (local threads, MPI). Both lanes
//! are the calling thread: an exchange posts its receives and sends, runs its body (the local
//! block first) and waits for each received block only when the body reads it, so the
//! messages travel while the local block is multiplied.

pub(crate) mod rows;

use dist_comm::{Broadcast, Completion, Exchange as Requests, PointToPoint, RequestId};
use distspmm_core::kernel::{spmm, spmm_transpose};
use distspmm_core::sparse::{DenseView, DenseViewMut};

use crate::backend::{
    run, Accumulate, Backend, Buf, Dense, Exchange, Lane, Matrix, Message, Orient, Region, Rows,
};
use crate::blocks::{BlockViews, QLocalBlock};
use crate::DistSpmmError;

/// The blocks a schedule names, on the host.
#[derive(Debug)]
pub(crate) struct CpuMatrices<'a> {
    pub(crate) diagonal: BlockViews<'a>,
    /// Halo: the off-diagonal blocks in increasing source part (empty under broadcast).
    pub(crate) remote: Vec<(usize, BlockViews<'a>)>,
    /// Broadcast: the q-local blocks by source part (empty under halo).
    pub(crate) q_local: Vec<Option<QLocalBlock<'a>>>,
}

fn internal(what: &str) -> DistSpmmError {
    DistSpmmError::Internal(what.to_owned())
}

impl CpuMatrices<'_> {
    /// `y = a·x + β·y` (or with `aᵀ`).
    fn product(
        &self,
        a: Matrix,
        orient: Orient,
        x: DenseView<'_, f32>,
        acc: Accumulate,
        y: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        let beta = acc.beta();
        let missing = || internal("the program names a block the chunk does not have");
        let block = match a {
            Matrix::Diagonal => Some(self.diagonal),
            Matrix::Remote(k) => Some(self.remote.get(k).ok_or_else(missing)?.1),
            Matrix::QLocal(_) => None,
        };
        match (block, orient) {
            (Some(b), Orient::Plain) => spmm(1.0, &b.csr, x, beta, y)?,
            (Some(b), Orient::Transposed) => spmm_transpose(1.0, &b.csc, x, beta, y)?,
            (None, _) => {
                let Matrix::QLocal(q) = a else {
                    return Err(missing());
                };
                let b = self
                    .q_local
                    .get(q)
                    .and_then(Option::as_ref)
                    .ok_or_else(missing)?;
                match orient {
                    Orient::Plain => spmm(1.0, &b.csr.view(), x, beta, y)?,
                    Orient::Transposed => spmm_transpose(1.0, &b.csc.view(), x, beta, y)?,
                }
            }
        }
        Ok(())
    }
}

/// The values of `r` in a buffer of `f` columns.
fn span(r: &Region, f: usize) -> std::ops::Range<usize> {
    r.first * f..r.end() * f
}

fn region<'b>(buf: &'b [f32], r: &Region, f: usize) -> Result<&'b [f32], DistSpmmError> {
    buf.get(span(r, f))
        .ok_or_else(|| internal("a region lies beyond its buffer"))
}

fn region_mut<'b>(
    buf: &'b mut [f32],
    r: &Region,
    f: usize,
) -> Result<&'b mut [f32], DistSpmmError> {
    buf.get_mut(span(r, f))
        .ok_or_else(|| internal("a region lies beyond its buffer"))
}

fn dense(values: &[f32], rows: usize, f: usize) -> Result<DenseView<'_, f32>, DistSpmmError> {
    DenseView::from_row_major(values, rows, f).map_err(|e| DistSpmmError::Internal(e.to_string()))
}

fn dense_mut(
    values: &mut [f32],
    rows: usize,
    f: usize,
) -> Result<DenseViewMut<'_, f32>, DistSpmmError> {
    DenseViewMut::from_row_major(values, rows, f)
        .map_err(|e| DistSpmmError::Internal(e.to_string()))
}

/// One call of a program on the host: the communicator, the blocks, the operands and the two
/// buffers (sized for F by the operator).
#[derive(Debug)]
pub(crate) struct CpuCall<'c, 'a, C> {
    pub(crate) comm: &'c C,
    pub(crate) m: &'c CpuMatrices<'a>,
    /// The halo send lists concatenated in increasing peer (empty under broadcast).
    pub(crate) send_rows: &'c [u32],
    pub(crate) x: DenseView<'c, f32>,
    pub(crate) y: DenseViewMut<'c, f32>,
    pub(crate) packed: &'c mut [f32],
    pub(crate) halo: &'c mut [f32],
    pub(crate) f: usize,
}

impl<C> CpuCall<'_, '_, C> {
    fn buf_mut(&mut self, b: Buf) -> &mut [f32] {
        match b {
            Buf::Packed => self.packed,
            Buf::Halo => self.halo,
        }
    }
}

impl<C: Broadcast + PointToPoint> Backend for CpuCall<'_, '_, C> {
    fn spmm(
        &mut self,
        _lane: Lane,
        a: Matrix,
        orient: Orient,
        x: Dense,
        acc: Accumulate,
        y: Dense,
    ) -> Result<(), DistSpmmError> {
        let (f, m, input) = (self.f, self.m, self.x);
        match (x, y) {
            (_, Dense::Input) => Err(internal("a product writes the input")),
            (Dense::Input, Dense::Output) => m.product(a, orient, input, acc, self.y.reborrow()),
            (Dense::Region(r), Dense::Output) => {
                let buf = if r.buf == Buf::Packed {
                    &*self.packed
                } else {
                    &*self.halo
                };
                let x = dense(region(buf, &r, f)?, r.rows, f)?;
                m.product(a, orient, x, acc, self.y.reborrow())
            }
            (_, Dense::Region(r)) => {
                let (mine, other) = match r.buf {
                    Buf::Packed => (&mut *self.packed, &*self.halo),
                    Buf::Halo => (&mut *self.halo, &*self.packed),
                };
                let out = dense_mut(region_mut(mine, &r, f)?, r.rows, f)?;
                match x {
                    Dense::Input => m.product(a, orient, input, acc, out),
                    Dense::Region(xr) if xr.buf != r.buf => {
                        let x = dense(region(other, &xr, f)?, xr.rows, f)?;
                        m.product(a, orient, x, acc, out)
                    }
                    _ => Err(internal("a product reads and writes one buffer")),
                }
            }
            (Dense::Output, _) => Err(internal("a product reads the output")),
        }
    }

    fn zero(&mut self, into: Region) -> Result<(), DistSpmmError> {
        let f = self.f;
        region_mut(self.buf_mut(into.buf), &into, f)?.fill(0.0);
        Ok(())
    }

    fn pack(&mut self, which: Rows, into: Region) -> Result<(), DistSpmmError> {
        let (f, x, send_rows) = (self.f, self.x, self.send_rows);
        let out = region_mut(self.buf_mut(into.buf), &into, f)?;
        match which {
            Rows::All if into.rows == x.rows() => rows::copy_rows(&x, out),
            Rows::SendLists if into.rows == send_rows.len() => rows::pack(&x, send_rows, out),
            _ => return Err(internal("a pack's region does not fit its rows")),
        }
        Ok(())
    }

    fn broadcast(&mut self, r: Region, root: usize) -> Result<(), DistSpmmError> {
        let (f, comm) = (self.f, self.comm);
        comm.broadcast(region_mut(self.buf_mut(r.buf), &r, f)?, root)?;
        Ok(())
    }

    fn exchange(&mut self, ex: &Exchange) -> Result<(), DistSpmmError> {
        let f = self.f;
        let one_buffer = |list: &[Message]| -> Result<Option<Buf>, DistSpmmError> {
            let buf = list.first().map(|m| m.region.buf);
            if list.iter().any(|m| Some(m.region.buf) != buf) {
                return Err(internal("an exchange's messages span both buffers"));
            }
            Ok(buf)
        };
        let (recv_buf, send_buf) = (one_buffer(&ex.recvs)?, one_buffer(&ex.sends)?);
        if recv_buf.is_some() && recv_buf == send_buf {
            return Err(internal(
                "an exchange sends from the buffer it receives into",
            ));
        }
        let Self {
            comm,
            m,
            send_rows,
            x,
            y,
            packed,
            halo,
            ..
        } = self;
        let (recv_into, send_from): (&mut [f32], &[f32]) = match (recv_buf, send_buf) {
            (Some(Buf::Packed), _) | (None, Some(Buf::Halo)) => (&mut **packed, &**halo),
            _ => (&mut **halo, &**packed),
        };
        let (m, send_rows, x) = (*m, *send_rows, *x);
        let result = comm.exchange(|requests| {
            let mut pending = Vec::with_capacity(ex.recvs.len());
            let mut rest = recv_into;
            let mut at = 0;
            for msg in &ex.recvs {
                let r = msg.region;
                if r.first < at {
                    return Ok(Err(internal("an exchange's receives overlap")));
                }
                let skip = (r.first - at) * f;
                if rest.len() < skip + r.rows * f {
                    return Ok(Err(internal("a region lies beyond its buffer")));
                }
                let (into, tail) = std::mem::take(&mut rest)[skip..].split_at_mut(r.rows * f);
                pending.push((r, requests.irecv(msg.peer, ex.tag, into)?));
                rest = tail;
                at = r.end();
            }
            for msg in &ex.sends {
                match region(send_from, &msg.region, f) {
                    Ok(values) => requests.isend(msg.peer, ex.tag, values)?,
                    Err(e) => return Ok(Err(e)),
                };
            }
            let mut in_flight = InFlight {
                requests,
                m,
                send_rows,
                x,
                y: y.reborrow(),
                f,
                pending,
                arrived: Vec::with_capacity(ex.recvs.len()),
            };
            // A communication error must reach the scope (it cancels what is pending); any
            // other error leaves the messages to complete.
            match run(&mut in_flight, &ex.body) {
                Err(DistSpmmError::Comm(e)) => Err(e),
                other => Ok(other),
            }
        });
        result?
    }

    fn join(&mut self, _waiter: Lane, _signaller: Lane) -> Result<(), DistSpmmError> {
        Ok(())
    }

    fn scatter_add(&mut self, from: &[Message]) -> Result<(), DistSpmmError> {
        let (f, send_rows) = (self.f, self.send_rows);
        for msg in from {
            let r = msg.region;
            let list = send_rows
                .get(r.first..r.end())
                .ok_or_else(|| internal("a scatter-add's region is not part of the send lists"))?;
            let buf = if r.buf == Buf::Packed {
                &*self.packed
            } else {
                &*self.halo
            };
            let values = region(buf, &r, f)?;
            rows::scatter_add(self.y.reborrow(), list, values);
        }
        Ok(())
    }

    fn add_blocks(&mut self, from: &[Region]) -> Result<(), DistSpmmError> {
        let f = self.f;
        for r in from {
            let buf = if r.buf == Buf::Packed {
                &*self.packed
            } else {
                &*self.halo
            };
            rows::add_all(self.y.reborrow(), region(buf, r, f)?);
        }
        Ok(())
    }
}

/// The body of an exchange on the host: the operands, and the receive buffers handed back as
/// their messages arrive (each waited for when first read).
struct InFlight<'s, 'x, 'a, E> {
    requests: &'x mut E,
    m: &'x CpuMatrices<'a>,
    send_rows: &'x [u32],
    x: DenseView<'x, f32>,
    y: DenseViewMut<'x, f32>,
    f: usize,
    pending: Vec<(Region, RequestId)>,
    arrived: Vec<(Region, &'s mut [f32])>,
}

impl<'s, E: Requests<'s, f32>> InFlight<'s, '_, '_, E> {
    /// The index in `arrived` of the receive into `r`, waiting for it if needed.
    fn received(&mut self, r: Region) -> Result<usize, DistSpmmError> {
        if let Some(k) = self.arrived.iter().position(|(a, _)| *a == r) {
            return Ok(k);
        }
        let k = self
            .pending
            .iter()
            .position(|(p, _)| *p == r)
            .ok_or_else(|| internal("an exchange's body reads rows it does not receive"))?;
        let (_, id) = self.pending.swap_remove(k);
        match self.requests.wait(id)? {
            Completion::Received { data, .. } => self.arrived.push((r, data)),
            Completion::Sent { .. } => {
                return Err(DistSpmmError::Comm(dist_comm::CommError::InvalidRequest {
                    id: id.0,
                }))
            }
        }
        Ok(self.arrived.len() - 1)
    }
}

impl<'s, E: Requests<'s, f32>> Backend for InFlight<'s, '_, '_, E> {
    fn spmm(
        &mut self,
        _lane: Lane,
        a: Matrix,
        orient: Orient,
        x: Dense,
        acc: Accumulate,
        y: Dense,
    ) -> Result<(), DistSpmmError> {
        if y != Dense::Output {
            return Err(internal("an exchange's body writes a buffer"));
        }
        let f = self.f;
        match x {
            Dense::Input => self.m.product(a, orient, self.x, acc, self.y.reborrow()),
            Dense::Region(r) => {
                let k = self.received(r)?;
                let halo = dense(&*self.arrived[k].1, r.rows, f)?;
                self.m.product(a, orient, halo, acc, self.y.reborrow())
            }
            Dense::Output => Err(internal("a product reads the output")),
        }
    }

    fn zero(&mut self, _into: Region) -> Result<(), DistSpmmError> {
        Err(internal("an exchange's body writes a buffer"))
    }

    fn pack(&mut self, _rows: Rows, _into: Region) -> Result<(), DistSpmmError> {
        Err(internal("an exchange's body writes a buffer"))
    }

    fn broadcast(&mut self, _region: Region, _root: usize) -> Result<(), DistSpmmError> {
        Err(internal("a broadcast inside an exchange"))
    }

    fn exchange(&mut self, _ex: &Exchange) -> Result<(), DistSpmmError> {
        Err(internal("an exchange inside an exchange"))
    }

    fn join(&mut self, _waiter: Lane, _signaller: Lane) -> Result<(), DistSpmmError> {
        Ok(())
    }

    fn scatter_add(&mut self, from: &[Message]) -> Result<(), DistSpmmError> {
        for msg in from {
            let r = msg.region;
            let list = self
                .send_rows
                .get(r.first..r.end())
                .ok_or_else(|| internal("a scatter-add's region is not part of the send lists"))?;
            let k = self.received(r)?;
            rows::scatter_add(self.y.reborrow(), list, &*self.arrived[k].1);
        }
        Ok(())
    }

    fn add_blocks(&mut self, from: &[Region]) -> Result<(), DistSpmmError> {
        for &r in from {
            let k = self.received(r)?;
            rows::add_all(self.y.reborrow(), &*self.arrived[k].1);
        }
        Ok(())
    }
}
