//! Per-edge kernels (`kernels/sddmm.cu`): the SDDMM `out[k] = ⟨U_i, V_j⟩` over the stored
//! entries of a CSR pattern ([`GpuDevice::sddmm_raw`], one warp per row, lanes grouped by F,
//! a fixed shuffle reduction: deterministic), its grouped form over G heads of `w = F / G`
//! columns each into G runs of values ([`GpuDevice::sddmm_grouped_raw`], one pass over the
//! pattern), and the copy of a block's per-edge values (one run per group) into the order of
//! its CSC for the transposed product ([`GpuDevice::csc_values_raw`], through a
//! [`DeviceCscOrder`]: for each CSC entry its position within its CSR row, one u32 each).
//!
//! The SpMM with per-edge values needs no kernel of its own: it is [`GpuDevice::spmm_raw`] over
//! a [`RawCsr`] whose `values` point at the per-edge values (or at their CSC-ordered copy); a
//! group's product is that SpMM over the group's columns of the dense operands.

use crate::device::{GpuDevice, RawCsr, RawDense};
use crate::driver::{Arg, Buffer, RawStream};
use crate::error::{CudaError, Result};
use crate::strategy::{blocks_for_warps, BLOCK_THREADS};

/// The SDDMM kernel.
const SDDMM: &str = "dsp_sddmm";
/// The CSR→CSC copy of per-edge values.
const CSC_VALUES: &str = "dsp_csc_values";

/// Every kernel in `kernels/sddmm.cu`; the build's ptxas report must list each for sm_80 and
/// sm_90, and the loaded module must contain each.
pub const EDGE_KERNELS: [&str; 2] = [SDDMM, CSC_VALUES];

/// Lanes that share one entry of the SDDMM for `f` columns: the smallest power of two that
/// covers `f`, at most a warp.
pub fn sddmm_group(f: usize) -> u32 {
    if f >= 32 {
        32
    } else {
        // f < 32: the power of two fits u32.
        crate::kernel_u32(f.max(1).next_power_of_two())
    }
}

fn shape(op: &'static str, reason: String) -> CudaError {
    CudaError::Shape { op, reason }
}

/// G runs of per-edge values on the device: run g holds `len` f32 from `ptr + 4·g·stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEdgeRuns {
    /// `CUdeviceptr` of run 0.
    pub ptr: u64,
    /// Runs (groups), at least one.
    pub groups: usize,
    /// Values per run.
    pub len: usize,
    /// Values from one run's start to the next's (at least `len` with more than one run).
    pub stride: usize,
}

/// The shape rules of [`GpuDevice::sddmm_grouped_raw`]: `U` has the pattern's rows, `V` its
/// columns, both the same F within u32, `ld >= F`, F a multiple of the group count; `out` one
/// run of one value per stored entry per group, runs not overlapping, within u64 offsets.
pub fn check_sddmm_grouped(
    pattern: &RawCsr,
    u: &RawDense,
    v: &RawDense,
    out: &RawEdgeRuns,
) -> Result<()> {
    let single = RawDense {
        rows: pattern.nnz,
        cols: 1,
        ld: 1,
        ptr: out.ptr,
    };
    check_sddmm(pattern, u, v, &single)?;
    if out.len != pattern.nnz {
        return Err(shape(
            SDDMM,
            format!(
                "each run must hold one value per stored entry ({}), given {}",
                pattern.nnz, out.len
            ),
        ));
    }
    let fits = out.groups >= 1
        && u.cols.is_multiple_of(out.groups)
        && u32::try_from(out.groups).is_ok()
        && (out.groups == 1 || out.stride >= out.len)
        && (out.groups - 1)
            .checked_mul(out.stride)
            .and_then(|s| s.checked_add(out.len))
            .is_some();
    if !fits {
        return Err(shape(
            SDDMM,
            format!(
                "{} groups of {} columns and runs of {} values {} apart do not fit",
                out.groups, u.cols, out.len, out.stride
            ),
        ));
    }
    Ok(())
}

/// The shape rules of [`GpuDevice::sddmm_raw`]: `U` has the pattern's rows, `V` its
/// columns, both the same F within u32 and `ld >= F`; `out` one value per stored entry
/// (`nnz × 1`, contiguous).
pub fn check_sddmm(pattern: &RawCsr, u: &RawDense, v: &RawDense, out: &RawDense) -> Result<()> {
    let named = [("U", u), ("V", v)];
    for (name, d) in named {
        if d.ld < d.cols {
            return Err(shape(
                SDDMM,
                format!(
                    "{name} leading dimension {} is below its {} columns",
                    d.ld, d.cols
                ),
            ));
        }
    }
    if u.rows != pattern.nrows || v.rows != pattern.ncols || u.cols != v.cols {
        return Err(shape(
            SDDMM,
            format!(
                "a {} × {} pattern needs U of {} rows and V of {} rows with equal columns, \
                 given U {} × {} and V {} × {}",
                pattern.nrows,
                pattern.ncols,
                pattern.nrows,
                pattern.ncols,
                u.rows,
                u.cols,
                v.rows,
                v.cols
            ),
        ));
    }
    if u32::try_from(u.rows).is_err() || u32::try_from(u.cols).is_err() {
        return Err(shape(
            SDDMM,
            format!("U is {} × {}, beyond u32", u.rows, u.cols),
        ));
    }
    if out.rows != pattern.nnz || out.cols != 1 || out.ld != 1 {
        return Err(shape(
            SDDMM,
            format!(
                "out must be {} × 1 (one value per stored entry, contiguous), given {} × {} \
                 with ld {}",
                pattern.nnz, out.rows, out.cols, out.ld
            ),
        ));
    }
    Ok(())
}

/// For every CSC entry of a block (in CSC order), its position within its CSR row, on the
/// device (for [`GpuDevice::csc_values_raw`]).
#[derive(Debug)]
pub struct DeviceCscOrder {
    dev: GpuDevice,
    len: usize,
    buf: Buffer<u32>,
}

impl DeviceCscOrder {
    /// Uploads `rank` (one entry per stored entry of the blocks it covers).
    ///
    /// # Errors
    /// Driver errors.
    pub fn new(dev: &GpuDevice, rank: &[u32]) -> Result<Self> {
        Ok(Self {
            dev: dev.clone(),
            len: rank.len(),
            buf: dev.upload(rank)?,
        })
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device bytes.
    pub fn bytes(&self) -> u64 {
        4 * self.len as u64
    }
}

/// One block's CSR→CSC copy of per-edge values:
/// `csc[g·stride + k] = csr[g·stride + rowptr[rows[k]] + rank[k]]` for `k < nnz` and every
/// group `g < groups`, where `rank` is the entries `first..first + nnz` of a
/// [`DeviceCscOrder`] (one group: `csc[k] = csr[rowptr[rows[k]] + rank[k]]`).
#[derive(Clone, Copy, Debug)]
pub struct RawCscValues<'a> {
    /// The ranks.
    pub order: &'a DeviceCscOrder,
    /// The block's first entry in `order`.
    pub first: usize,
    /// The block's stored entries.
    pub nnz: usize,
    /// `CUdeviceptr` of the block's CSR row pointers (`nrows + 1` u64).
    pub rowptr: u64,
    /// `CUdeviceptr` of the block's CSC row ids (`nnz` u32, each below `nrows`).
    pub rows: u64,
    /// `CUdeviceptr` of the block's per-edge values in CSR order (`nnz` f32).
    pub csr: u64,
    /// `CUdeviceptr` of the output, in CSC order (`nnz` f32 per group).
    pub csc: u64,
    /// Groups (runs of values), at least one.
    pub groups: usize,
    /// Values from one group's run to the next's, in `csr` and `csc` alike (at least `nnz`
    /// with more than one group).
    pub stride: usize,
}

impl GpuDevice {
    /// `out[k] = ⟨U_i, V_j⟩` for every stored entry `(i, j)` of `pattern` at position `k`,
    /// queued on `stream` (this device's stream when `None`); the pattern's values are not
    /// read.
    ///
    /// # Safety
    /// Every pointer must be device memory of this device's context: `pattern` a valid CSR
    /// (`nrows + 1` row pointers, `nnz` column ids each below `ncols`), `u` and `v`
    /// `(rows − 1)·ld + cols` f32 each, `out` `nnz` f32 not overlapping the others; all alive,
    /// and `stream` (a live stream of this context) not destroyed, until the kernel finishes.
    ///
    /// # Errors
    /// [`CudaError::Shape`] (see [`check_sddmm`]); driver errors.
    pub unsafe fn sddmm_raw(
        &self,
        pattern: &RawCsr,
        u: RawDense,
        v: RawDense,
        out: RawDense,
        stream: Option<RawStream>,
    ) -> Result<()> {
        check_sddmm(pattern, &u, &v, &out)?;
        let runs = RawEdgeRuns {
            ptr: out.ptr,
            groups: 1,
            len: pattern.nnz,
            stride: pattern.nnz,
        };
        // SAFETY: forwarded contract (one run of `nnz` values).
        unsafe { self.sddmm_grouped_raw(pattern, u, v, runs, stream) }
    }

    /// `out_g[k] = ⟨U_i[g·w..(g+1)·w], V_j[g·w..(g+1)·w]⟩` for every stored entry `(i, j)` of
    /// `pattern` at position `k` and every group `g < out.groups`, `w = F / G`, in one pass
    /// over the pattern, queued on `stream` (this device's stream when `None`). One group is
    /// [`sddmm_raw`](Self::sddmm_raw).
    ///
    /// # Safety
    /// As [`sddmm_raw`](Self::sddmm_raw), `out` addressing its G runs (none overlapping the
    /// others or `u` and `v`).
    ///
    /// # Errors
    /// [`CudaError::Shape`] (see [`check_sddmm_grouped`]); driver errors.
    pub unsafe fn sddmm_grouped_raw(
        &self,
        pattern: &RawCsr,
        u: RawDense,
        v: RawDense,
        out: RawEdgeRuns,
        stream: Option<RawStream>,
    ) -> Result<()> {
        check_sddmm_grouped(pattern, &u, &v, &out)?;
        if pattern.nnz == 0 {
            return Ok(());
        }
        let w = u.cols / out.groups;
        let args = [
            Arg::U32(crate::kernel_u32(pattern.nrows)),
            Arg::U64(pattern.indptr),
            Arg::U64(pattern.indices),
            Arg::U64(u.ptr),
            Arg::U64(u.ld as u64),
            Arg::U64(v.ptr),
            Arg::U64(v.ld as u64),
            Arg::U64(out.ptr),
            Arg::U32(crate::kernel_u32(w)),
            Arg::U32(sddmm_group(w)),
            Arg::U32(crate::kernel_u32(out.groups)),
            Arg::U64(out.stride as u64),
        ];
        // SAFETY: the arguments match dsp_sddmm; the shapes were checked against the pattern
        // and the memory satisfies this function's contract.
        unsafe {
            self.ctx()
                .launch(SDDMM, blocks_for_warps(pattern.nrows as u64), &args, stream)
        }
    }

    /// One block's per-edge values in the order of its CSC (see [`RawCscValues`]), queued on
    /// `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// The pointers of `op` must be device memory of this device's context of the sizes
    /// [`RawCscValues`] lists, `csc` not overlapping the others, the row pointers and row ids
    /// those of one valid block whose CSR and CSC hold the same entries and whose CSC order is
    /// `op.order`'s; all alive, and `stream` (a live stream of this context) not destroyed,
    /// until the kernel finishes.
    ///
    /// # Errors
    /// [`CudaError::Shape`] when the block's entries run past the order;
    /// [`CudaError::DeviceMismatch`]; driver errors.
    pub unsafe fn csc_values_raw(
        &self,
        op: &RawCscValues<'_>,
        stream: Option<RawStream>,
    ) -> Result<()> {
        if !self.same(&op.order.dev) {
            return Err(CudaError::DeviceMismatch(CSC_VALUES));
        }
        let groups_fit = op.groups >= 1
            && u32::try_from(op.groups).is_ok()
            && (op.groups == 1 || op.stride >= op.nnz)
            && (op.groups - 1).checked_mul(op.stride).is_some();
        if !groups_fit {
            return Err(shape(
                CSC_VALUES,
                format!(
                    "{} groups of {} values {} apart do not fit",
                    op.groups, op.nnz, op.stride
                ),
            ));
        }
        if op
            .first
            .checked_add(op.nnz)
            .is_none_or(|end| end > op.order.len)
        {
            return Err(shape(
                CSC_VALUES,
                format!(
                    "entries {}..{}+{} run past the order's {}",
                    op.first, op.first, op.nnz, op.order.len
                ),
            ));
        }
        if op.nnz == 0 {
            return Ok(());
        }
        let args = [
            Arg::U64(op.nnz as u64),
            Arg::U64(op.rowptr),
            Arg::U64(op.rows),
            Arg::U64(self.ptr(&op.order.buf) + 4 * op.first as u64),
            Arg::U64(op.csr),
            Arg::U64(op.csc),
            Arg::U32(crate::kernel_u32(op.groups)),
            Arg::U64(op.stride as u64),
        ];
        // SAFETY: the arguments match dsp_csc_values; the ranks lie in the order (checked),
        // the rest is this function's contract.
        unsafe {
            self.ctx().launch(
                CSC_VALUES,
                (op.nnz as u64).div_ceil(u64::from(BLOCK_THREADS)),
                &args,
                stream,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(rows: usize, cols: usize, ld: usize) -> RawDense {
        RawDense {
            rows,
            cols,
            ld,
            ptr: 0,
        }
    }

    fn csr(nrows: usize, ncols: usize, nnz: usize) -> RawCsr {
        RawCsr {
            nrows,
            ncols,
            nnz,
            indptr: 0,
            indices: 0,
            values: 0,
        }
    }

    #[test]
    fn groups_cover_f_up_to_a_warp() {
        let cases = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (8, 8),
            (9, 16),
            (31, 32),
            (32, 32),
        ];
        for (f, g) in cases {
            assert_eq!(sddmm_group(f), g, "F = {f}");
        }
        assert_eq!(sddmm_group(1000), 32);
    }

    #[test]
    fn grouped_sddmm_shapes_are_checked() {
        let a = csr(3, 4, 5);
        let runs = |groups, len, stride| RawEdgeRuns {
            ptr: 0,
            groups,
            len,
            stride,
        };
        let (u, v) = (dense(3, 6, 6), dense(4, 6, 6));
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(3, 5, 5)).is_ok());
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(1, 5, 0)).is_ok());
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(4, 5, 5)).is_err());
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(0, 5, 5)).is_err());
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(2, 5, 4)).is_err());
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(2, 4, 5)).is_err());
        assert!(check_sddmm_grouped(&a, &u, &v, &runs(2, 5, usize::MAX)).is_err());
    }

    #[test]
    fn sddmm_shapes_are_checked() {
        let a = csr(3, 4, 5);
        assert!(check_sddmm(&a, &dense(3, 2, 2), &dense(4, 2, 3), &dense(5, 1, 1)).is_ok());
        assert!(check_sddmm(&a, &dense(4, 2, 2), &dense(4, 2, 3), &dense(5, 1, 1)).is_err());
        assert!(check_sddmm(&a, &dense(3, 2, 2), &dense(3, 2, 3), &dense(5, 1, 1)).is_err());
        assert!(check_sddmm(&a, &dense(3, 2, 2), &dense(4, 3, 3), &dense(5, 1, 1)).is_err());
        assert!(check_sddmm(&a, &dense(3, 2, 1), &dense(4, 2, 3), &dense(5, 1, 1)).is_err());
        assert!(check_sddmm(&a, &dense(3, 2, 2), &dense(4, 2, 3), &dense(4, 1, 1)).is_err());
        assert!(check_sddmm(&a, &dense(3, 2, 2), &dense(4, 2, 3), &dense(5, 1, 2)).is_err());
    }
}
