//! The edge softmax on the device (`kernels/edge_softmax.cu`): the softmax of per-edge logits
//! over each destination row's entries, optionally after a LeakyReLU (GAT's attention
//! normalisation), forward ([`edge_softmax`]) and backward ([`edge_softmax_backward`]), with
//! the semantics of the CPU operator's `edge_softmax` family in distspmm-op: numerically stable
//! (the row's largest activated logit is subtracted), a row with a non-finite activated logit
//! NaN in all its entries, rows without entries untouched.
//!
//! The per-edge operand is the distributed operator's layout: the entries of several CSR blocks
//! one after another (block `b` starting at `first_b`), so a row's entries are one run per
//! block, described by an [`EdgeRows`]. One warp per row, fixed shuffle reductions:
//! deterministic (and agreeing with the CPU to rounding, not bit for bit).

use crate::device::{DeviceDense, GpuDevice, RawDense};
use crate::driver::{Arg, Buffer, RawStream};
use crate::error::{CudaError, Result};
use crate::strategy::blocks_for_warps;

/// The forward kernel.
const FORWARD: &str = "dsp_edge_softmax";
/// The backward kernel.
const BACKWARD: &str = "dsp_edge_softmax_backward";

/// Every kernel in `kernels/edge_softmax.cu`; the build's ptxas report must list each for
/// sm_80 and sm_90, and the loaded module must contain each.
pub const SOFTMAX_KERNELS: [&str; 2] = [FORWARD, BACKWARD];

/// One block of the per-edge layout on the host: its entries start at `first` in the operand,
/// row `i`'s at `first + rowptr[i]`.
#[derive(Clone, Copy, Debug)]
pub struct EdgeBlock<'a> {
    /// Position of the block's first entry in the per-edge operand.
    pub first: usize,
    /// The block's CSR row pointers (`rows + 1`, non-decreasing).
    pub rowptr: &'a [u64],
}

/// One block of the per-edge layout whose row pointers are already on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEdgeBlock {
    /// Position of the block's first entry in the per-edge operand.
    pub first: usize,
    /// `CUdeviceptr` of the block's `rows + 1` u64 row pointers.
    pub rowptr: u64,
}

/// Where each row's entries sit in a per-edge operand, on the device: a table of blocks (first
/// position, row pointers).
#[derive(Debug)]
pub struct EdgeRows {
    dev: GpuDevice,
    nrows: usize,
    edges: usize,
    nblocks: usize,
    firsts: Buffer<u64>,
    rowptrs: Buffer<u64>,
    /// Row pointers uploaded by [`EdgeRows::new`] (none for [`EdgeRows::from_device`]); the
    /// table `rowptrs` points into them.
    _owned: Vec<Buffer<u64>>,
}

fn shape(op: &'static str, reason: String) -> CudaError {
    CudaError::Shape { op, reason }
}

impl EdgeRows {
    /// Checks and uploads the layout of `rows` rows over `blocks`: every row pointer has
    /// `rows + 1` non-decreasing entries, and the blocks' entries do not overlap in the operand
    /// (each entry belongs to one row of one block). The operand's length is the end of the
    /// last block.
    ///
    /// # Errors
    /// [`CudaError::Shape`] when a row pointer has the wrong length or decreases, blocks
    /// overlap, or the sizes exceed u32 rows or blocks; driver errors.
    pub fn new(dev: &GpuDevice, rows: usize, blocks: &[EdgeBlock<'_>]) -> Result<Self> {
        const OP: &str = "EdgeRows::new";
        let edges = check_layout(rows, blocks)?;
        let owned = blocks
            .iter()
            .map(|b| dev.upload(b.rowptr))
            .collect::<Result<Vec<_>>>()?;
        let raw: Vec<RawEdgeBlock> = blocks
            .iter()
            .zip(&owned)
            .map(|(b, buf)| RawEdgeBlock {
                first: b.first,
                rowptr: dev.ptr(buf),
            })
            .collect();
        let mut this = Self::table(dev, OP, rows, edges, &raw)?;
        this._owned = owned;
        Ok(this)
    }

    /// The layout of `rows` rows over blocks whose row pointers are on the device already (the
    /// distributed operator's blocks), for an operand of `edges` entries.
    ///
    /// # Safety
    /// Every `rowptr` must be device memory of `dev`'s context holding `rows + 1`
    /// non-decreasing u64 row pointers, alive as long as this value; the blocks' entries
    /// `first + rowptr[0] .. first + rowptr[rows]` must lie within `edges` and not overlap.
    ///
    /// # Errors
    /// [`CudaError::Shape`] when the sizes exceed u32 rows or blocks; driver errors.
    pub unsafe fn from_device(
        dev: &GpuDevice,
        rows: usize,
        edges: usize,
        blocks: &[RawEdgeBlock],
    ) -> Result<Self> {
        Self::table(dev, "EdgeRows::from_device", rows, edges, blocks)
    }

    fn table(
        dev: &GpuDevice,
        op: &'static str,
        rows: usize,
        edges: usize,
        blocks: &[RawEdgeBlock],
    ) -> Result<Self> {
        if u32::try_from(rows).is_err() || u32::try_from(blocks.len()).is_err() {
            return Err(shape(
                op,
                format!("{rows} rows over {} blocks exceed u32", blocks.len()),
            ));
        }
        let firsts: Vec<u64> = blocks.iter().map(|b| b.first as u64).collect();
        let ptrs: Vec<u64> = blocks.iter().map(|b| b.rowptr).collect();
        Ok(Self {
            dev: dev.clone(),
            nrows: rows,
            edges,
            nblocks: blocks.len(),
            firsts: dev.upload(&firsts)?,
            rowptrs: dev.upload(&ptrs)?,
            _owned: Vec::new(),
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.nrows
    }

    /// Entries of the per-edge operands this layout describes.
    pub fn edge_count(&self) -> usize {
        self.edges
    }

    /// Blocks.
    pub fn blocks(&self) -> usize {
        self.nblocks
    }
}

/// The checks of [`EdgeRows::new`]; returns the operand's length.
pub fn check_layout(rows: usize, blocks: &[EdgeBlock<'_>]) -> Result<usize> {
    const OP: &str = "EdgeRows::new";
    let mut spans = Vec::with_capacity(blocks.len());
    for (b, block) in blocks.iter().enumerate() {
        let ptr = block.rowptr;
        if ptr.len() != rows + 1 {
            return Err(shape(
                OP,
                format!(
                    "block {b} has {} row pointers for {rows} rows (needs {})",
                    ptr.len(),
                    rows + 1
                ),
            ));
        }
        if let Some(i) = ptr.windows(2).position(|w| w[1] < w[0]) {
            return Err(shape(
                OP,
                format!(
                    "block {b}'s row pointers decrease at row {i}: {} then {}",
                    ptr[i],
                    ptr[i + 1]
                ),
            ));
        }
        let at = |p: u64| {
            usize::try_from(p)
                .ok()
                .and_then(|p| p.checked_add(block.first))
        };
        let (Some(lo), Some(hi)) = (at(ptr[0]), at(ptr[rows])) else {
            return Err(shape(
                OP,
                format!("block {b}'s entries run past the address space"),
            ));
        };
        if lo < hi {
            spans.push((lo, hi, b));
        }
    }
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(shape(
            OP,
            format!(
                "blocks {} and {} overlap in the per-edge operand ({}..{} and {}..{})",
                w[0].2, w[1].2, w[0].0, w[0].1, w[1].0, w[1].1
            ),
        ));
    }
    Ok(spans.last().map_or(0, |s| s.1))
}

/// A per-edge operand must be one contiguous column of `edges` values.
fn check_operand(op: &'static str, name: &str, d: &RawDense, edges: usize) -> Result<()> {
    if d.rows != edges || d.cols != 1 || d.ld != 1 {
        return Err(shape(
            op,
            format!(
                "{name} must be {edges} × 1 (one value per entry, contiguous), given {} × {} \
                 with ld {}",
                d.rows, d.cols, d.ld
            ),
        ));
    }
    Ok(())
}

impl GpuDevice {
    /// `out = softmax over each row of LeakyReLU_slope(logits)` (no LeakyReLU when `slope` is
    /// `None`), per-edge operands `rows.edge_count() × 1`, queued on `stream` (this device's
    /// stream when `None`).
    ///
    /// # Safety
    /// `logits` and `out` must be device memory of this device's context of `edge_count` f32
    /// each, not overlapping; both, and `stream` (a live stream of this context), must stay
    /// alive until the kernel finishes.
    ///
    /// # Errors
    /// [`CudaError::Shape`] when an operand is not `edge_count × 1` and contiguous;
    /// [`CudaError::DeviceMismatch`]; driver errors.
    pub unsafe fn edge_softmax_raw(
        &self,
        rows: &EdgeRows,
        slope: Option<f32>,
        logits: RawDense,
        out: RawDense,
        stream: Option<RawStream>,
    ) -> Result<()> {
        if !self.same(&rows.dev) {
            return Err(CudaError::DeviceMismatch(FORWARD));
        }
        check_operand(FORWARD, "logits", &logits, rows.edges)?;
        check_operand(FORWARD, "out", &out, rows.edges)?;
        if rows.nrows == 0 || rows.edges == 0 {
            return Ok(());
        }
        let args = [
            Arg::U32(crate::kernel_u32(rows.nrows)),
            Arg::U32(crate::kernel_u32(rows.nblocks)),
            Arg::U64(self.ptr(&rows.firsts)),
            Arg::U64(self.ptr(&rows.rowptrs)),
            Arg::U32(u32::from(slope.is_some())),
            Arg::F32(slope.unwrap_or(1.0)),
            Arg::U64(logits.ptr),
            Arg::U64(out.ptr),
        ];
        // SAFETY: the arguments match dsp_edge_softmax; the layout's entries lie within
        // edge_count (EdgeRows' checks or from_device's contract) and the operands hold that
        // many values (checked), as this function's contract requires.
        unsafe {
            self.ctx()
                .launch(FORWARD, blocks_for_warps(rows.nrows as u64), &args, stream)
        }
    }

    /// `d_logits = out ∘ (d_out − ⟨out, d_out⟩_row)`, times 1 where `z > 0` and `slope`
    /// elsewhere when `leaky` is `Some((slope, z))` (the pre-activation logits of the forward
    /// call), queued on `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// As [`edge_softmax_raw`](Self::edge_softmax_raw), for `out`, `d_out`, `d_logits` and the
    /// logits; `d_logits` must not overlap the others.
    ///
    /// # Errors
    /// As [`edge_softmax_raw`](Self::edge_softmax_raw).
    pub unsafe fn edge_softmax_backward_raw(
        &self,
        rows: &EdgeRows,
        leaky: Option<(f32, RawDense)>,
        out: RawDense,
        d_out: RawDense,
        d_logits: RawDense,
        stream: Option<RawStream>,
    ) -> Result<()> {
        if !self.same(&rows.dev) {
            return Err(CudaError::DeviceMismatch(BACKWARD));
        }
        if let Some((_, z)) = &leaky {
            check_operand(BACKWARD, "logits", z, rows.edges)?;
        }
        check_operand(BACKWARD, "out", &out, rows.edges)?;
        check_operand(BACKWARD, "d_out", &d_out, rows.edges)?;
        check_operand(BACKWARD, "d_logits", &d_logits, rows.edges)?;
        if rows.nrows == 0 || rows.edges == 0 {
            return Ok(());
        }
        let args = [
            Arg::U32(crate::kernel_u32(rows.nrows)),
            Arg::U32(crate::kernel_u32(rows.nblocks)),
            Arg::U64(self.ptr(&rows.firsts)),
            Arg::U64(self.ptr(&rows.rowptrs)),
            Arg::U32(u32::from(leaky.is_some())),
            Arg::F32(leaky.map_or(1.0, |(s, _)| s)),
            Arg::U64(leaky.map_or(0, |(_, z)| z.ptr)),
            Arg::U64(out.ptr),
            Arg::U64(d_out.ptr),
            Arg::U64(d_logits.ptr),
        ];
        // SAFETY: the arguments match dsp_edge_softmax_backward (the logits are read only when
        // `leaky` is set); sizes as in edge_softmax_raw.
        unsafe {
            self.ctx()
                .launch(BACKWARD, blocks_for_warps(rows.nrows as u64), &args, stream)
        }
    }
}

fn same_device(op: &'static str, rows: &EdgeRows, operands: &[&DeviceDense]) -> Result<()> {
    if operands.iter().all(|d| rows.dev.same(d.device())) {
        Ok(())
    } else {
        Err(CudaError::DeviceMismatch(op))
    }
}

/// The edge softmax of `logits` into `out` (per-edge operands `rows.edge_count() × 1`), after a
/// LeakyReLU of `slope` when given, on the device's stream.
///
/// # Errors
/// [`CudaError::Shape`] when an operand is not `edge_count × 1`;
/// [`CudaError::DeviceMismatch`]; driver errors.
pub fn edge_softmax(
    rows: &EdgeRows,
    slope: Option<f32>,
    logits: &DeviceDense,
    out: &mut DeviceDense,
) -> Result<()> {
    same_device(FORWARD, rows, &[logits, out])?;
    // SAFETY: live buffers of one device with the sizes their constructors checked; `out` is
    // borrowed mutably, so it is not `logits`; all work runs on the device's stream.
    unsafe {
        rows.dev
            .edge_softmax_raw(rows, slope, logits.raw(), out.raw(), None)
    }
}

/// The gradient of [`edge_softmax`] with respect to its logits from its result `out` and the
/// gradient `d_out`, into `d_logits`; `leaky` is `Some((slope, logits))` when the forward call
/// had a LeakyReLU. On the device's stream.
///
/// # Errors
/// As [`edge_softmax`].
pub fn edge_softmax_backward(
    rows: &EdgeRows,
    leaky: Option<(f32, &DeviceDense)>,
    out: &DeviceDense,
    d_out: &DeviceDense,
    d_logits: &mut DeviceDense,
) -> Result<()> {
    same_device(BACKWARD, rows, &[out, d_out, d_logits])?;
    if let Some((_, z)) = leaky {
        same_device(BACKWARD, rows, &[z])?;
    }
    // SAFETY: as in edge_softmax; `d_logits` is borrowed mutably, so it overlaps nothing.
    unsafe {
        rows.dev.edge_softmax_backward_raw(
            rows,
            leaky.map(|(s, z)| (s, z.raw())),
            out.raw(),
            d_out.raw(),
            d_logits.raw(),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_checked() {
        let a = [0u64, 2, 2, 5];
        let b = [0u64, 1, 1, 1];
        let ok = [
            EdgeBlock {
                first: 0,
                rowptr: &a,
            },
            EdgeBlock {
                first: 5,
                rowptr: &b,
            },
        ];
        assert_eq!(check_layout(3, &ok).unwrap(), 6);
        assert_eq!(check_layout(3, &[]).unwrap(), 0);
        // Wrong length.
        assert!(check_layout(2, &ok).is_err());
        // Decreasing.
        let bad = [0u64, 3, 2, 5];
        assert!(check_layout(
            3,
            &[EdgeBlock {
                first: 0,
                rowptr: &bad
            }]
        )
        .is_err());
        // Overlapping blocks.
        let overlap = [
            ok[0],
            EdgeBlock {
                first: 4,
                rowptr: &b,
            },
        ];
        assert!(check_layout(3, &overlap).is_err());
        // Empty blocks overlap nothing; a gap is allowed.
        let empty = [0u64, 0, 0, 0];
        let gaps = [
            EdgeBlock {
                first: 9,
                rowptr: &a,
            },
            EdgeBlock {
                first: 10,
                rowptr: &empty,
            },
        ];
        assert_eq!(check_layout(3, &gaps).unwrap(), 14);
    }

    #[test]
    fn operands_are_one_contiguous_column() {
        let d = |rows, cols, ld| RawDense {
            rows,
            cols,
            ld,
            ptr: 0,
        };
        assert!(check_operand(FORWARD, "x", &d(7, 1, 1), 7).is_ok());
        assert!(check_operand(FORWARD, "x", &d(6, 1, 1), 7).is_err());
        assert!(check_operand(FORWARD, "x", &d(7, 2, 2), 7).is_err());
        assert!(check_operand(FORWARD, "x", &d(7, 1, 4), 7).is_err());
    }
}
