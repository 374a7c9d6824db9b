//! The CPU backend: distspmm-sparse's kernels (rayon threads) on host buffers, rows moved by any
//! communicator with broadcast and point-to-point messages (local threads, MPI). Both lanes
//! are the calling thread: an exchange posts its receives and sends, runs its body (the local
//! block first) and waits for each received block only when the body reads it, so the
//! messages travel while the local block is multiplied. Products over the call's per-edge
//! values are distspmm-sparse's grouped products over the block's pattern: the G runs of the
//! caller's values (CSR), or their CSC-ordered copy (`CscOrder::permute`, made just before each
//! transposed product, an entry's G values side by side, and kept for the next call when that
//! call's one group of values is the same bits: an aggregator's fixed weights); the SDDMM is
//! `distspmm_sparse::kernel::sddmm_grouped` over a block's pattern into its G runs of the edge
//! operand. With one group these are the single products, bit for bit.

pub(crate) mod rows;

use dist_comm::{Broadcast, Completion, Element, Exchange as Requests, PointToPoint, RequestId};
use distspmm_sparse::kernel::convert::{narrow, widen, Half};
use distspmm_sparse::kernel::{
    sddmm_grouped, spmm, spmm_grouped, spmm_transpose, spmm_transpose_grouped, EdgeRuns,
    EdgeRunsMut,
};
use distspmm_sparse::sparse::{CscView, CsrView, DenseView, DenseViewMut};

use crate::backend::{
    run, Accumulate, Backend, Buf, Dense, Exchange, Lane, Matrix, Message, Orient, Product, Region,
    Rows, Values,
};
use chunk_format::ChunkView;

use std::marker::PhantomData;
use std::ops::Deref;

use crate::schedule::{ScheduleKind, Traffic, Workspace};
use dist_comm::{AllGather, AllReduce};

use crate::blocks::{self, QLocalBlock};
use crate::edges::{CscOrder, EdgeLayout};
use crate::operator::engine::Engine;
use crate::operator::Shared;
use crate::{value_bytes, Buffer, DistSpmmError, Kind, Op};

/// What the operator derives once from its chunk for the blocks a schedule names, on the host.
#[derive(Debug)]
pub(crate) struct CpuBlocks {
    /// Halo: the off-diagonal blocks in increasing source part as (source part, block index)
    /// (empty under broadcast).
    pub(crate) remote: Vec<(usize, usize)>,
    /// Broadcast: the q-local blocks by source part (empty under halo).
    pub(crate) q_local: Vec<Option<QLocalBlock>>,
    /// The CSR→CSC permutation, made at the first call that needs it.
    pub(crate) csc: Option<CscOrder>,
}

impl CpuBlocks {
    /// What the schedule `kind` needs from `chunk` (local).
    pub(crate) fn new(chunk: &ChunkView<'_>, kind: ScheduleKind) -> Self {
        Self {
            remote: match kind {
                ScheduleKind::Halo => blocks::remote_indices(chunk),
                ScheduleKind::Broadcast => Vec::new(),
            },
            q_local: match kind {
                ScheduleKind::Halo => Vec::new(),
                ScheduleKind::Broadcast => blocks::q_local(chunk),
            },
            csc: None,
        }
    }
}

/// The CPU engine of [`Operator`](crate::Operator): the communicator (anything that dereferences to one with
/// broadcast, point-to-point messages and the agreement's collectives), what the operator
/// derives from its chunk for the host kernels, and the host buffers.
#[derive(Debug)]
pub struct CpuEngine<C> {
    pub(crate) comm: C,
    blocks: CpuBlocks,
    /// [`Buf::Packed`].
    packed: Buffer,
    /// [`Buf::Halo`].
    halo: Buffer,
    /// The narrowed copies of [`Buf::Packed`] and [`Buf::Halo`] on the wire (same rows, one
    /// 16-bit value each), when the operator's precision is a 16-bit format.
    wire: [Vec<u16>; 2],
    /// The bytes each program of the last call handed to the communicator.
    counted: Vec<Traffic>,
    /// The per-edge values of a transposed product in CSC order (grown at the first such
    /// call).
    csc_values: Vec<f32>,
    /// A copy of the one-group values `csc_values` holds in CSC order, when it holds a whole
    /// call's: a later transposed call over the same values (bit for bit: an aggregator's
    /// fixed weights, called every epoch) reads `csc_values` as it is instead of permuting
    /// again. Empty when `csc_values` holds nothing reusable.
    csc_source: Vec<f32>,
}

impl<C> CpuEngine<C> {
    pub(crate) fn new(comm: C, blocks: CpuBlocks) -> Self {
        Self {
            comm,
            blocks,
            packed: Buffer::default(),
            halo: Buffer::default(),
            wire: [Vec::new(), Vec::new()],
            counted: Vec::new(),
            csc_values: Vec::new(),
            csc_source: Vec::new(),
        }
    }
}

/// The operands of one program of a CPU call.
#[derive(Debug)]
pub(crate) struct CpuOperands<'a> {
    /// [`Dense::Input`].
    pub(crate) input: DenseView<'a, f32>,
    /// [`Dense::Output`] (no rows for the SDDMM).
    pub(crate) output: DenseViewMut<'a, f32>,
    /// [`Dense::Left`].
    pub(crate) left: Option<DenseView<'a, f32>>,
    /// The per-edge values products read (empty when none).
    pub(crate) values: &'a [f32],
    /// The per-edge values SDDMMs write (empty when none).
    pub(crate) out: &'a mut [f32],
}

impl<C> Engine for CpuEngine<C>
where
    C: Deref,
    C::Target: AllGather + AllReduce + Broadcast + PointToPoint + Sized,
{
    type Host = C::Target;
    type Operands<'a> = CpuOperands<'a>;
    type Stream = ();

    fn host(&self) -> &C::Target {
        &self.comm
    }

    fn reserve(
        &mut self,
        s: &Shared<'_>,
        op: Op,
        groups: usize,
        f: usize,
    ) -> Result<(), DistSpmmError> {
        let rows = s.schedule.buffer_rows(op);
        self.packed.reserve(rows[Buf::Packed as usize] * f)?;
        self.halo.reserve(rows[Buf::Halo as usize] * f)?;
        if s.precision.half().is_some() {
            for (wire, len) in self
                .wire
                .iter_mut()
                .zip([self.packed.len(), self.halo.len()])
            {
                if wire.len() < len {
                    wire.try_reserve_exact(len - wire.len()).map_err(|e| {
                        DistSpmmError::Allocation {
                            rank: 0,
                            bytes: len as u64 * 2,
                            reason: e.to_string(),
                        }
                    })?;
                    wire.resize(len, 0);
                }
            }
        }
        if !op.transposes_edges() || f == 0 {
            return Ok(());
        }
        if self.blocks.csc.is_none() {
            self.blocks.csc = Some(CscOrder::new(&s.chunk, &s.blocks.edges)?);
        }
        // Shapes checked: one group or more, `groups · nnz` values in the operand.
        let nnz = s.blocks.edges.len() * groups;
        if self.csc_values.len() < nnz {
            self.csc_values
                .try_reserve_exact(nnz - self.csc_values.len())
                .map_err(|e| DistSpmmError::Allocation {
                    rank: 0,
                    bytes: value_bytes(nnz),
                    reason: e.to_string(),
                })?;
            self.csc_values.resize(nnz, 0.0);
        }
        Ok(())
    }

    unsafe fn execute<'a, I>(
        &mut self,
        s: &Shared<'_>,
        groups: usize,
        f: usize,
        programs: I,
        (): (),
    ) -> Result<(), DistSpmmError>
    where
        I: IntoIterator<Item = (Kind, CpuOperands<'a>)>,
    {
        self.counted.clear();
        for (kind, o) in programs {
            if f == 0 {
                self.counted.push(Traffic::default());
                if kind == Kind::Sddmm {
                    // Every dot product of no columns is 0; nothing travels.
                    o.out.fill(0.0);
                }
                continue;
            }
            let program = s.schedule.program(kind);
            let rows = crate::backend::buffer_rows(program);
            let transposes = kind == Kind::BackwardEdges;
            // One group's values the last transposed call permuted, bit for bit: reuse them.
            let csc_ready = transposes
                && groups == 1
                && !self.csc_source.is_empty()
                && same_bits(&self.csc_source, o.values);
            if transposes && !csc_ready {
                // Overwritten below: nothing reusable unless the call completes.
                self.csc_source.clear();
            }
            let csc = if transposes {
                &mut self.csc_values[..]
            } else {
                &mut []
            };
            let values = o.values;
            let [wire_packed, wire_halo] = &mut self.wire;
            let wire = s.precision.half().map(|fmt| Wire {
                fmt,
                packed: &mut wire_packed[..rows[Buf::Packed as usize] * f],
                halo: &mut wire_halo[..rows[Buf::Halo as usize] * f],
            });
            let mut call = CpuCall {
                comm: &*self.comm,
                m: CpuMatrices {
                    chunk: s.chunk,
                    blocks: &self.blocks,
                    edges: &s.blocks.edges,
                },
                send_rows: &s.schedule.layout.send_rows,
                x: o.input,
                y: o.output,
                left: o.left,
                edges: CpuEdges {
                    values: o.values,
                    out: o.out,
                    csc,
                    csc_ready,
                    groups,
                },
                packed: self.packed.get(rows[Buf::Packed as usize] * f),
                halo: self.halo.get(rows[Buf::Halo as usize] * f),
                wire,
                moved: Traffic::default(),
                f,
            };
            run(&mut call, program)?;
            self.counted.push(call.moved);
            if transposes && !csc_ready && groups == 1 {
                self.csc_source
                    .try_reserve_exact(values.len())
                    .map_err(|e| DistSpmmError::Allocation {
                        rank: 0,
                        bytes: value_bytes(values.len()),
                        reason: e.to_string(),
                    })?;
                self.csc_source.extend_from_slice(values);
            }
        }
        Ok(())
    }

    /// Buffers sized for the largest F called so far, and derived index arrays; after a
    /// transposed product over per-edge values also the CSR→CSC permutation, in `structure`,
    /// and the permuted values, in `buffers`: 4 bytes per non-zero for the permutation, 4 per
    /// non-zero and group of the largest group count so far for the values.
    fn workspace(&self) -> Workspace {
        let structure = self
            .blocks
            .q_local
            .iter()
            .flatten()
            .map(QLocalBlock::structure_bytes)
            .sum::<u64>()
            + self.blocks.csc.as_ref().map_or(0, CscOrder::bytes);
        Workspace {
            buffers: value_bytes(
                self.packed.len()
                    + self.halo.len()
                    + self.csc_values.len()
                    + self.csc_source.capacity(),
            ) + 2 * self.wire.iter().map(|w| w.len() as u64).sum::<u64>(),
            structure,
        }
    }

    fn counted(&self) -> Option<&[Traffic]> {
        Some(&self.counted)
    }
}

/// The per-edge operands of one call: `groups` runs of the layout's length each, run g of
/// every operand starting at `g·len` (the call's group count; one for the single products).
#[derive(Debug)]
pub(crate) struct CpuEdges<'c> {
    /// The values products over [`Values::Edges`] read (empty when the call has none).
    pub(crate) values: &'c [f32],
    /// The values SDDMMs write (empty when the call writes none).
    pub(crate) out: &'c mut [f32],
    /// Room for the values in CSC order, each block's `G·nnz` values at `G·first` in layout
    /// order, an entry's G values side by side (empty unless the call has transposed products
    /// over [`Values::Edges`]).
    pub(crate) csc: &'c mut [f32],
    /// Whether `csc` already holds `values` in CSC order (a repeated call over the same
    /// values), so the products read it without permuting.
    pub(crate) csc_ready: bool,
    /// The group count G.
    pub(crate) groups: usize,
}

impl CpuEdges<'_> {
    fn reborrow(&mut self) -> CpuEdges<'_> {
        CpuEdges {
            values: self.values,
            out: &mut *self.out,
            csc: &mut *self.csc,
            csc_ready: self.csc_ready,
            groups: self.groups,
        }
    }
}

/// The blocks of one call: the chunk they are viewed in (unchecked, as it was parsed) and what
/// the operator derived from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuMatrices<'c> {
    pub(crate) chunk: ChunkView<'c>,
    pub(crate) blocks: &'c CpuBlocks,
    /// The layout of the per-edge operand.
    pub(crate) edges: &'c EdgeLayout,
}

/// The one form of SDDMM the programs use: `U` sampled into the call's edge operand.
fn sddmm_operands(u: Dense, out: Values) -> Result<(), DistSpmmError> {
    if out != Values::Edges || u != Dense::Left {
        return Err(internal(
            "an SDDMM that does not sample U into the edge operand",
        ));
    }
    Ok(())
}

fn internal(what: &str) -> DistSpmmError {
    DistSpmmError::Internal(what.to_owned())
}

/// The pattern of a block (over the columns the schedule names) with a block's values in
/// place: the CSR for a plain product, the CSC for a transposed one.
enum Oriented<'v> {
    Csr(CsrView<'v, f32>),
    Csc(CscView<'v, f32>),
}

fn missing() -> DistSpmmError {
    internal("the program names a block the chunk does not have")
}

fn mismatched() -> DistSpmmError {
    internal("a block's per-edge values do not fit the block")
}

impl<'c> CpuMatrices<'c> {
    /// `y = a·x + β·y` (or with `aᵀ`), `a`'s values from `values`.
    fn product(
        &self,
        p: &Product,
        edges: &mut CpuEdges<'_>,
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        match p.values {
            Values::Chunk => self.chunk_product(p.a, p.orient, x, p.acc, y),
            Values::Edges => {
                let beta = p.acc.beta();
                match self.with_edges(p.a, p.orient, edges)? {
                    (Oriented::Csr(a), runs) => spmm_grouped(1.0, &a, runs, x, beta, y)?,
                    (Oriented::Csc(a), runs) => {
                        spmm_transpose_grouped(1.0, &a, runs, x, beta, y)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Block `a`'s pattern with its runs of the per-edge values: the caller's runs for the
    /// CSR, or, transposed, their CSC-ordered copy made into the block's room in `edges.csc`.
    fn with_edges<'v>(
        &'v self,
        a: Matrix,
        orient: Orient,
        edges: &'v mut CpuEdges<'_>,
    ) -> Result<(Oriented<'v>, EdgeRuns<'v, f32>), DistSpmmError> {
        let layout = self.edges;
        let (k, groups) = (layout.index_of(a).ok_or_else(missing)?, edges.groups);
        let eb = layout.blocks()[k];
        let b = self.chunk.block(layout.chunk_index(k));
        let values = edges.values.get(eb.first..).ok_or_else(mismatched)?;
        let q_local = |q: usize| {
            self.blocks
                .q_local
                .get(q)
                .and_then(Option::as_ref)
                .ok_or_else(missing)
        };
        Ok(match orient {
            Orient::Plain => {
                let pattern = match a {
                    Matrix::QLocal(q) => q_local(q)?.views(&self.chunk).0,
                    _ => blocks::csr_with(&b, b.csr_vals).ok_or_else(mismatched)?,
                };
                let runs = EdgeRuns::head_major(values, groups, eb.len, layout.len())?;
                (Oriented::Csr(pattern), runs)
            }
            Orient::Transposed => {
                let order =
                    self.blocks.csc.as_ref().ok_or_else(|| {
                        internal("no CSR→CSC permutation for a transposed product")
                    })?;
                let room = eb.first * groups..eb.range().end * groups;
                let csc = edges.csc.get_mut(room).ok_or_else(mismatched)?;
                if values.len() < groups.saturating_sub(1) * layout.len() + eb.len {
                    return Err(mismatched());
                }
                if !edges.csc_ready {
                    order.permute(&b, &eb, values, (groups, layout.len()), csc);
                }
                let pattern = match a {
                    Matrix::QLocal(q) => q_local(q)?.views(&self.chunk).1,
                    _ => blocks::csc_with(&b, b.csc_vals).ok_or_else(mismatched)?,
                };
                (Oriented::Csc(pattern), EdgeRuns::edge_major(csc, groups)?)
            }
        })
    }

    /// `out = ⟨u_i, v_j⟩` over block `a`'s stored entries per group, into its runs of the
    /// edge operand (`groups` runs of the layout's length).
    fn sddmm(
        &self,
        a: Matrix,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        out: &mut [f32],
        groups: usize,
    ) -> Result<(), DistSpmmError> {
        let layout = self.edges;
        let k = layout.index_of(a).ok_or_else(missing)?;
        let eb = layout.blocks()[k];
        let room = out
            .get_mut(eb.first..)
            .ok_or_else(|| internal("an SDDMM without room for its values"))?;
        let runs = EdgeRunsMut::head_major(room, groups, eb.len, layout.len())?;
        let b = self.chunk.block(layout.chunk_index(k));
        let pattern = match a {
            Matrix::QLocal(q) => {
                let block = self
                    .blocks
                    .q_local
                    .get(q)
                    .and_then(Option::as_ref)
                    .ok_or_else(missing)?;
                block.views(&self.chunk).0
            }
            _ => blocks::csr_with(&b, b.csr_vals).ok_or_else(mismatched)?,
        };
        sddmm_grouped(&pattern, u, v, runs)?;
        Ok(())
    }

    /// `y = a·x + β·y` (or with `aᵀ`) with the chunk's values.
    fn chunk_product(
        &self,
        a: Matrix,
        orient: Orient,
        x: DenseView<'_, f32>,
        acc: Accumulate,
        y: DenseViewMut<'_, f32>,
    ) -> Result<(), DistSpmmError> {
        let beta = acc.beta();
        let block = match a {
            Matrix::Diagonal => Some(blocks::diagonal(&self.chunk)),
            Matrix::Remote(k) => {
                let &(_, i) = self.blocks.remote.get(k).ok_or_else(missing)?;
                Some(blocks::block(&self.chunk, i))
            }
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
                    .blocks
                    .q_local
                    .get(q)
                    .and_then(Option::as_ref)
                    .ok_or_else(missing)?;
                let (csr, csc) = b.views(&self.chunk);
                match orient {
                    Orient::Plain => spmm(1.0, &csr, x, beta, y)?,
                    Orient::Transposed => spmm_transpose(1.0, &csc, x, beta, y)?,
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

fn region<'b, T>(buf: &'b [T], r: &Region, f: usize) -> Result<&'b [T], DistSpmmError> {
    buf.get(span(r, f))
        .ok_or_else(|| internal("a region lies beyond its buffer"))
}

fn region_mut<'b, T>(buf: &'b mut [T], r: &Region, f: usize) -> Result<&'b mut [T], DistSpmmError> {
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
pub(crate) struct CpuCall<'c, C> {
    pub(crate) comm: &'c C,
    pub(crate) m: CpuMatrices<'c>,
    /// The halo send lists concatenated in increasing peer (empty under broadcast).
    pub(crate) send_rows: &'c [u32],
    pub(crate) x: DenseView<'c, f32>,
    pub(crate) y: DenseViewMut<'c, f32>,
    /// The SDDMM's `U_p` ([`Dense::Left`]).
    pub(crate) left: Option<DenseView<'c, f32>>,
    pub(crate) edges: CpuEdges<'c>,
    pub(crate) packed: &'c mut [f32],
    pub(crate) halo: &'c mut [f32],
    /// The buffers' copies on the wire in a 16-bit format (`None`: `f32` on the wire).
    pub(crate) wire: Option<Wire<'c>>,
    /// The payload handed to the communicator so far (the plan's conventions).
    pub(crate) moved: Traffic,
    pub(crate) f: usize,
}

/// A call's messages in a 16-bit format: the narrowed copies of the two buffers, a region of
/// a buffer at the same rows in its copy.
#[derive(Debug)]
pub(crate) struct Wire<'c> {
    pub(crate) fmt: Half,
    pub(crate) packed: &'c mut [u16],
    pub(crate) halo: &'c mut [u16],
}

impl Wire<'_> {
    fn buf_mut(&mut self, b: Buf) -> &mut [u16] {
        match b {
            Buf::Packed => self.packed,
            Buf::Halo => self.halo,
        }
    }
}

impl<C> CpuCall<'_, C> {
    fn buf_mut(&mut self, b: Buf) -> &mut [f32] {
        match b {
            Buf::Packed => self.packed,
            Buf::Halo => self.halo,
        }
    }
}

/// A value the transport moves for the CPU backend: `f32` as it is, or the bytes of 16-bit
/// values, widened to `f32` on arrival.
trait OnWire: Element {
    /// Values of the type per `f32` value.
    const PER_VALUE: usize;

    /// A received message as the `f32` rows it carries: itself for `f32`; for bytes of a
    /// 16-bit format (`fmt`), widened into `rows`.
    fn arrived<'s>(
        data: &'s mut [Self],
        rows: Option<&'s mut [f32]>,
        fmt: Option<Half>,
    ) -> Result<&'s mut [f32], DistSpmmError>;
}

impl OnWire for f32 {
    const PER_VALUE: usize = 1;

    fn arrived<'s>(
        data: &'s mut [f32],
        _: Option<&'s mut [f32]>,
        _: Option<Half>,
    ) -> Result<&'s mut [f32], DistSpmmError> {
        Ok(data)
    }
}

impl OnWire for u8 {
    const PER_VALUE: usize = 2;

    fn arrived<'s>(
        data: &'s mut [u8],
        rows: Option<&'s mut [f32]>,
        fmt: Option<Half>,
    ) -> Result<&'s mut [f32], DistSpmmError> {
        let (Some(rows), Some(fmt)) = (rows, fmt) else {
            return Err(internal("a narrowed message without rows to widen it into"));
        };
        let values: &[u16] = bytemuck::try_cast_slice(data)
            .map_err(|_| internal("a narrowed message that is not whole 16-bit values"))?;
        widen(fmt, values, rows)?;
        Ok(rows)
    }
}

/// The bytes of `values`, in the transport's element type.
fn wire_bytes(values: &[u16]) -> &[u8] {
    bytemuck::cast_slice(values)
}

fn wire_bytes_mut(values: &mut [u16]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

/// Bytes of `len` values of `T`.
fn bytes_of<T>(len: usize) -> u64 {
    (len * size_of::<T>()) as u64
}

/// A dense operand a call reads that is not a received region: the input or `U`.
fn operand<'a>(
    d: Dense,
    x: DenseView<'a, f32>,
    left: Option<DenseView<'a, f32>>,
) -> Result<DenseView<'a, f32>, DistSpmmError> {
    match d {
        Dense::Input => Ok(x),
        Dense::Left => left.ok_or_else(|| internal("the program reads U outside an SDDMM")),
        Dense::Output | Dense::Region(_) => Err(internal("a product reads the output")),
    }
}

impl<C> CpuCall<'_, C> {
    /// A dense operand the call reads outside an exchange: the input, `U`, or a region of the
    /// buffers (`packed`, `halo`).
    fn read<'a>(
        &self,
        d: Dense,
        packed: &'a [f32],
        halo: &'a [f32],
    ) -> Result<DenseView<'a, f32>, DistSpmmError>
    where
        Self: 'a,
    {
        match d {
            Dense::Region(r) => {
                let buf = if r.buf == Buf::Packed { packed } else { halo };
                dense(region(buf, &r, self.f)?, r.rows, self.f)
            }
            other => operand(other, self.x, self.left),
        }
    }
}

impl<C: Broadcast + PointToPoint> Backend for CpuCall<'_, C> {
    fn spmm(&mut self, p: &Product) -> Result<(), DistSpmmError> {
        let (f, m, input) = (self.f, self.m, self.x);
        match (p.x, p.y) {
            (_, Dense::Input | Dense::Left) => Err(internal("a product writes an input")),
            (Dense::Region(_) | Dense::Input, Dense::Output) => {
                let x = self.read(p.x, self.packed, self.halo)?;
                m.product(p, &mut self.edges, x, self.y.reborrow())
            }
            (_, Dense::Region(r)) => {
                let (mine, other) = match r.buf {
                    Buf::Packed => (&mut *self.packed, &*self.halo),
                    Buf::Halo => (&mut *self.halo, &*self.packed),
                };
                let out = dense_mut(region_mut(mine, &r, f)?, r.rows, f)?;
                match p.x {
                    Dense::Input => m.product(p, &mut self.edges, input, out),
                    Dense::Region(xr) if xr.buf != r.buf => {
                        let x = dense(region(other, &xr, f)?, xr.rows, f)?;
                        m.product(p, &mut self.edges, x, out)
                    }
                    _ => Err(internal("a product reads and writes one buffer")),
                }
            }
            (Dense::Output | Dense::Left, _) => Err(internal("a product reads the output or U")),
        }
    }

    fn sddmm(
        &mut self,
        _lane: Lane,
        block: Matrix,
        u: Dense,
        v: Dense,
        out: Values,
    ) -> Result<(), DistSpmmError> {
        sddmm_operands(u, out)?;
        let m = self.m;
        let (u, v) = (
            self.read(u, self.packed, self.halo)?,
            self.read(v, self.packed, self.halo)?,
        );
        m.sddmm(block, u, v, self.edges.out, self.edges.groups)
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
        let mine = comm.rank() == root;
        let bytes = match self.wire.as_mut() {
            None => {
                let values = region_mut(self.buf_mut(r.buf), &r, f)?;
                comm.broadcast(values, root)?;
                bytes_of::<f32>(values.len())
            }
            Some(w) => {
                let fmt = w.fmt;
                let wire = region_mut(w.buf_mut(r.buf), &r, f)?;
                let values = region_mut(
                    match r.buf {
                        Buf::Packed => &mut *self.packed,
                        Buf::Halo => &mut *self.halo,
                    },
                    &r,
                    f,
                )?;
                if mine {
                    narrow(fmt, values, wire)?;
                }
                let bytes = wire_bytes_mut(wire);
                comm.broadcast(&mut *bytes, root)?;
                if !mine {
                    widen(fmt, wire, values)?;
                }
                bytes_of::<u16>(wire.len())
            }
        };
        if mine {
            self.moved.sent += bytes * (comm.size() as u64 - 1);
        } else {
            self.moved.received += bytes;
        }
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
            left,
            edges,
            packed,
            halo,
            wire,
            moved,
            ..
        } = self;
        let receives_packed = matches!(
            (recv_buf, send_buf),
            (Some(Buf::Packed), _) | (None, Some(Buf::Halo))
        );
        let (recv_into, send_from): (&mut [f32], &[f32]) = if receives_packed {
            (&mut **packed, &**halo)
        } else {
            (&mut **halo, &**packed)
        };
        let body = Body {
            m: *m,
            send_rows,
            x: *x,
            y: y.reborrow(),
            left: *left,
            edges: edges.reborrow(),
            f,
        };
        let Some(w) = wire else {
            return exchange_as::<f32, C>(comm, ex, recv_into, send_from, None, None, body, moved);
        };
        let (wire_recv, wire_send) = if receives_packed {
            (&mut *w.packed, &mut *w.halo)
        } else {
            (&mut *w.halo, &mut *w.packed)
        };
        for msg in &ex.sends {
            narrow(
                w.fmt,
                region(send_from, &msg.region, f)?,
                region_mut(wire_send, &msg.region, f)?,
            )?;
        }
        exchange_as::<u8, C>(
            comm,
            ex,
            wire_bytes_mut(wire_recv),
            wire_bytes(wire_send),
            Some(recv_into),
            Some(w.fmt),
            body,
            moved,
        )
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

/// What an exchange's body reads and writes besides the messages.
struct Body<'x> {
    m: CpuMatrices<'x>,
    send_rows: &'x [u32],
    x: DenseView<'x, f32>,
    y: DenseViewMut<'x, f32>,
    left: Option<DenseView<'x, f32>>,
    edges: CpuEdges<'x>,
    f: usize,
}

/// One grouped exchange whose messages are values of `T`: `f32` (`rows` is `None`), or the
/// bytes of 16-bit values of the format `fmt`, widened into their regions of `rows` (the `f32`
/// receive buffer) as each message is first read. Receives are posted into `recv` at their
/// regions' places, sends go from `send`, the body runs while they travel; the bytes handed
/// to the communicator are added to `moved`.
#[allow(
    clippy::too_many_arguments,
    reason = "the pieces of one exchange, split for the borrows"
)]
fn exchange_as<T: OnWire, C: PointToPoint>(
    comm: &C,
    ex: &Exchange,
    recv: &mut [T],
    send: &[T],
    rows: Option<&mut [f32]>,
    fmt: Option<Half>,
    body: Body<'_>,
    moved: &mut Traffic,
) -> Result<(), DistSpmmError> {
    let (f, k) = (body.f, T::PER_VALUE);
    let result = comm.exchange(|requests| {
        let mut pending = Vec::with_capacity(ex.recvs.len());
        let mut rest = recv;
        let mut rest_rows = rows;
        let mut at = 0;
        for msg in &ex.recvs {
            let r = msg.region;
            if r.first < at {
                return Ok(Err(internal("an exchange's receives overlap")));
            }
            let (skip, len) = ((r.first - at) * f, r.rows * f);
            if rest.len() < (skip + len) * k
                || rest_rows.as_ref().is_some_and(|t| t.len() < skip + len)
            {
                return Ok(Err(internal("a region lies beyond its buffer")));
            }
            let (into, tail) = std::mem::take(&mut rest)[skip * k..].split_at_mut(len * k);
            let widened = rest_rows.take().map(|t| {
                let (widened, tail) = t[skip..].split_at_mut(len);
                rest_rows = Some(tail);
                widened
            });
            moved.received += bytes_of::<T>(into.len());
            pending.push((r, requests.irecv(msg.peer, ex.tag, into)?, widened));
            rest = tail;
            at = r.end();
        }
        for msg in &ex.sends {
            match region(send, &msg.region, f * k) {
                Ok(values) => {
                    moved.sent += bytes_of::<T>(values.len());
                    requests.isend(msg.peer, ex.tag, values)?
                }
                Err(e) => return Ok(Err(e)),
            };
        }
        let mut in_flight = InFlight {
            requests,
            m: body.m,
            send_rows: body.send_rows,
            x: body.x,
            y: body.y,
            left: body.left,
            edges: body.edges,
            f,
            fmt,
            arrived: Vec::with_capacity(pending.len()),
            pending,
            wire: PhantomData,
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

/// The body of an exchange on the host: the operands, and the receive buffers handed back as
/// their messages arrive (each waited for when first read, and widened to `f32` then when the
/// messages are 16-bit values).
struct InFlight<'s, 'x, E, T> {
    requests: &'x mut E,
    m: CpuMatrices<'x>,
    send_rows: &'x [u32],
    x: DenseView<'x, f32>,
    y: DenseViewMut<'x, f32>,
    left: Option<DenseView<'x, f32>>,
    edges: CpuEdges<'x>,
    f: usize,
    /// The 16-bit format of the messages (`None`: `f32`).
    fmt: Option<Half>,
    /// Each pending receive's region, request and, for 16-bit messages, the `f32` rows it is
    /// widened into.
    pending: Vec<(Region, RequestId, Option<&'s mut [f32]>)>,
    arrived: Vec<(Region, &'s mut [f32])>,
    wire: PhantomData<fn() -> T>,
}

impl<'s, T: OnWire, E: Requests<'s, T>> InFlight<'s, '_, E, T> {
    /// The index in `arrived` of the receive into `r`, waiting for it if needed.
    fn received(&mut self, r: Region) -> Result<usize, DistSpmmError> {
        if let Some(k) = self.arrived.iter().position(|(a, _)| *a == r) {
            return Ok(k);
        }
        let k = self
            .pending
            .iter()
            .position(|(p, _, _)| *p == r)
            .ok_or_else(|| internal("an exchange's body reads rows it does not receive"))?;
        let (_, id, widened) = self.pending.swap_remove(k);
        match self.requests.wait(id)? {
            Completion::Received { data, .. } => {
                let rows = T::arrived(data, widened, self.fmt)?;
                self.arrived.push((r, rows));
            }
            Completion::Sent { .. } => {
                return Err(DistSpmmError::Comm(dist_comm::CommError::InvalidRequest {
                    id: id.0,
                }))
            }
        }
        Ok(self.arrived.len() - 1)
    }
}

impl<'s, T: OnWire, E: Requests<'s, T>> Backend for InFlight<'s, '_, E, T> {
    fn spmm(&mut self, p: &Product) -> Result<(), DistSpmmError> {
        if p.y != Dense::Output {
            return Err(internal("an exchange's body writes a buffer"));
        }
        let m = self.m;
        // The received regions are moved out of `self` for the product's duration.
        let x = match p.x {
            Dense::Region(r) => Some(self.received(r)?),
            _ => None,
        };
        match x {
            Some(k) => {
                let (r, data) = &self.arrived[k];
                let halo = dense(data, r.rows, self.f)?;
                m.product(p, &mut self.edges, halo, self.y.reborrow())
            }
            None => {
                let x = operand(p.x, self.x, self.left)?;
                m.product(p, &mut self.edges, x, self.y.reborrow())
            }
        }
    }

    fn sddmm(
        &mut self,
        _lane: Lane,
        block: Matrix,
        u: Dense,
        v: Dense,
        out: Values,
    ) -> Result<(), DistSpmmError> {
        sddmm_operands(u, out)?;
        let m = self.m;
        let u = self.left.ok_or_else(|| internal("an SDDMM without U"))?;
        if let Dense::Region(r) = v {
            let k = self.received(r)?;
            let (r, data) = &self.arrived[k];
            let v = dense(data, r.rows, self.f)?;
            return m.sddmm(block, u, v, self.edges.out, self.edges.groups);
        }
        let v = operand(v, self.x, self.left)?;
        m.sddmm(block, u, v, self.edges.out, self.edges.groups)
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

/// Whether two runs of values are the same bits (NaN payloads and signed zeros included).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
