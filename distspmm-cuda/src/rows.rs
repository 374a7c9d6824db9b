//! Row movement on the device for the distributed SpMM (`kernels/rows.cu`): packing the rows
//! each peer needs into one contiguous send buffer ([`gather_rows`]), adding the partial sums
//! received for a rank's own rows in a fixed order ([`scatter_add_rows`], planned on the host
//! by [`ScatterPlan`]), and adding stacked blocks in order ([`add_blocks`]). One warp per row,
//! no atomics: every output row is written by one warp, and the additions into it happen in
//! the order the plan lists them, so results are deterministic.
//!
//! Messages in 16 bits: [`GpuDevice::narrow_raw`] rounds `f32` values to a [`HalfFormat`]'s
//! bit patterns and [`GpuDevice::widen_raw`] widens them back, with the results of
//! distspmm-sparse's `kernel::convert` bit for bit (round to nearest even, subnormals kept,
//! overflow to ±Inf, a NaN quiet with its sign and upper payload bits).

use crate::device::{DeviceDense, GpuDevice, RawDense};
use crate::driver::{Arg, Buffer, RawStream};
use crate::error::{CudaError, Result};
use crate::strategy::blocks_for_warps;

/// The gather kernel: `out[k] = x[rows[k]]` (`rows` NULL: `out[k] = x[k]`).
const GATHER: &str = "dsp_gather_rows";
/// The scatter-add kernel: `y[rows[k]] += packed[src[s]]` for `s` in `ptr[k]..ptr[k+1]`.
const SCATTER_ADD: &str = "dsp_scatter_add_rows";
/// The block sum: `y[i] += blocks[b·n + i]` for `b = 0..nblocks`.
const ADD_BLOCKS: &str = "dsp_add_blocks";
/// `f32` values to 16-bit patterns.
const NARROW: &str = "dsp_narrow";
/// 16-bit patterns to `f32` values.
const WIDEN: &str = "dsp_widen";

/// Every kernel in `kernels/rows.cu`; the build's ptxas report must list each for sm_80 and
/// sm_90, and the loaded module must contain each.
pub const ROW_KERNELS: [&str; 5] = [GATHER, SCATTER_ADD, ADD_BLOCKS, NARROW, WIDEN];

/// A 16-bit format of [`GpuDevice::narrow_raw`] and [`GpuDevice::widen_raw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfFormat {
    /// bfloat16: `f32`'s 8-bit exponent, 7 stored mantissa bits.
    Bf16,
    /// IEEE binary16.
    F16,
}

impl HalfFormat {
    /// The kernels' `fmt` argument.
    fn code(self) -> u32 {
        match self {
            HalfFormat::Bf16 => 0,
            HalfFormat::F16 => 1,
        }
    }
}

/// Blocks at most a conversion launches (its threads loop over the rest).
const CONVERT_MAX_BLOCKS: u64 = 1 << 16;

/// Blocks of [`BLOCK_THREADS`](crate::strategy::BLOCK_THREADS) threads for a conversion of
/// `len` values: one thread per value, up to [`CONVERT_MAX_BLOCKS`].
pub fn convert_blocks(len: usize) -> u64 {
    (len as u64)
        .div_ceil(u64::from(crate::strategy::BLOCK_THREADS))
        .min(CONVERT_MAX_BLOCKS)
}

/// The rules of [`GpuDevice::narrow_raw`] and [`GpuDevice::widen_raw`]: `f32` values 4-byte
/// aligned, 16-bit values 2-byte aligned, neither NULL unless there are no values, and both
/// runs within the address space.
pub fn check_convert(op: &'static str, wide: u64, narrow: u64, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let within = |ptr: u64, size: u64| {
        (len as u64)
            .checked_mul(size)
            .and_then(|bytes| ptr.checked_add(bytes))
            .is_some()
    };
    if wide == 0 || narrow == 0 {
        return Err(shape(op, "a NULL operand".into()));
    }
    if !wide.is_multiple_of(4) || !narrow.is_multiple_of(2) {
        return Err(shape(
            op,
            format!(
                "misaligned operands: f32 values at {wide:#x} (4-byte alignment), 16-bit \
                 values at {narrow:#x} (2-byte alignment)"
            ),
        ));
    }
    if !within(wide, 4) || !within(narrow, 2) {
        return Err(shape(
            op,
            format!("{len} values overflow the address space"),
        ));
    }
    Ok(())
}

/// Blocks of [`BLOCK_THREADS`](crate::strategy::BLOCK_THREADS) threads for the row kernels:
/// one warp per row.
pub fn row_blocks(nrows: usize) -> u64 {
    blocks_for_warps(nrows as u64)
}

/// Which packed rows are added into which output rows, and in which order: for output row
/// `rows()[k]`, the packed rows `src()[ptr()[k]..ptr()[k+1]]`, added in that order.
///
/// Built from index lists that are concatenated in the packed buffer — list `i`'s entry `j`
/// is packed row `offset(i) + j` and adds into output row `lists[i][j]` — so every output row
/// receives its contributions in increasing list order (the backward of the halo schedule:
/// one list per peer, in increasing rank, exactly as the CPU operator adds them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScatterPlan {
    rows: Vec<u32>,
    ptr: Vec<u64>,
    src: Vec<u64>,
    packed_rows: usize,
    nrows: usize,
}

impl ScatterPlan {
    /// Plans the scatter-add of `lists` (each strictly increasing, every entry below
    /// `nrows`, the rows of the output) packed one after another.
    ///
    /// # Errors
    /// [`CudaError::Shape`] when a list is not strictly increasing, an entry is out of range,
    /// or the sizes exceed the kernel's u32 row count.
    pub fn new(nrows: usize, lists: &[&[u32]]) -> Result<Self> {
        let bad = |reason: String| CudaError::Shape {
            op: "ScatterPlan::new",
            reason,
        };
        if u32::try_from(nrows).is_err() {
            return Err(bad(format!("{nrows} output rows exceed u32")));
        }
        let mut count = vec![0u64; nrows];
        for (i, list) in lists.iter().enumerate() {
            if let Some(j) = list.windows(2).position(|w| w[1] <= w[0]) {
                return Err(bad(format!(
                    "list {i} is not strictly increasing at position {j}: {} then {}",
                    list[j],
                    list[j + 1]
                )));
            }
            if let Some(&r) = list.iter().find(|&&r| r as usize >= nrows) {
                return Err(bad(format!(
                    "list {i} names row {r} but the output has {nrows} rows"
                )));
            }
            for &r in *list {
                count[r as usize] += 1;
            }
        }
        let rows: Vec<u32> = (0..crate::kernel_u32(nrows))
            .filter(|&r| count[r as usize] > 0)
            .collect();
        let mut ptr = Vec::with_capacity(rows.len() + 1);
        ptr.push(0u64);
        // Where the next contribution of each output row goes in `src`.
        let mut next = vec![0u64; nrows];
        for &r in &rows {
            let start = *ptr.last().expect("ptr starts with 0");
            next[r as usize] = start;
            ptr.push(start + count[r as usize]);
        }
        let total = *ptr.last().expect("ptr starts with 0");
        #[allow(
            clippy::cast_possible_truncation,
            reason = "total counts the entries of the lists, which are in memory"
        )]
        let mut src = vec![0u64; total as usize];
        let mut packed = 0u64;
        for list in lists {
            for &r in *list {
                let slot = &mut next[r as usize];
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "a slot is below total, which fits usize"
                )]
                let at = *slot as usize;
                src[at] = packed;
                *slot += 1;
                packed += 1;
            }
        }
        // One packed row per entry of the lists.
        let packed_rows = src.len();
        Ok(Self {
            rows,
            ptr,
            src,
            packed_rows,
            nrows,
        })
    }

    /// The output rows that receive anything, increasing.
    pub fn rows(&self) -> &[u32] {
        &self.rows
    }

    /// `rows().len() + 1` offsets into [`src`](Self::src).
    pub fn ptr(&self) -> &[u64] {
        &self.ptr
    }

    /// Packed row of each contribution, grouped by output row, in order of addition.
    pub fn src(&self) -> &[u64] {
        &self.src
    }

    /// Rows of the packed buffer (the lists' total length).
    pub fn packed_rows(&self) -> usize {
        self.packed_rows
    }

    /// Rows of the output the plan was made for.
    pub fn output_rows(&self) -> usize {
        self.nrows
    }
}

/// A list of row ids on the device (for [`gather_rows`]).
#[derive(Debug)]
pub struct DeviceRows {
    dev: GpuDevice,
    len: usize,
    /// One past the largest id (0 when empty): the rows a gathered matrix must have.
    end: usize,
    buf: Buffer<u32>,
}

impl DeviceRows {
    /// Uploads `rows` (any order, repeats allowed).
    ///
    /// # Errors
    /// [`CudaError::Shape`] when there are more than `u32::MAX` rows; driver errors.
    pub fn new(dev: &GpuDevice, rows: &[u32]) -> Result<Self> {
        if u32::try_from(rows.len()).is_err() {
            return Err(CudaError::Shape {
                op: "DeviceRows::new",
                reason: format!("{} rows exceed u32", rows.len()),
            });
        }
        Ok(Self {
            dev: dev.clone(),
            len: rows.len(),
            end: rows.iter().max().map_or(0, |&m| m as usize + 1),
            buf: dev.upload(rows)?,
        })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A [`ScatterPlan`] on the device (for [`scatter_add_rows`]).
#[derive(Debug)]
pub struct DeviceScatter {
    dev: GpuDevice,
    targets: usize,
    packed_rows: usize,
    nrows: usize,
    rows: Buffer<u32>,
    ptr: Buffer<u64>,
    src: Buffer<u64>,
}

impl DeviceScatter {
    /// Uploads `plan`.
    ///
    /// # Errors
    /// Driver errors.
    pub fn new(dev: &GpuDevice, plan: &ScatterPlan) -> Result<Self> {
        Ok(Self {
            dev: dev.clone(),
            targets: plan.rows.len(),
            packed_rows: plan.packed_rows,
            nrows: plan.nrows,
            rows: dev.upload(&plan.rows)?,
            ptr: dev.upload(&plan.ptr)?,
            src: dev.upload(&plan.src)?,
        })
    }

    /// Rows of the packed input.
    pub fn packed_rows(&self) -> usize {
        self.packed_rows
    }

    /// Rows of the output.
    pub fn output_rows(&self) -> usize {
        self.nrows
    }
}

fn shape(op: &'static str, reason: String) -> CudaError {
    CudaError::Shape { op, reason }
}

/// Checks a row kernel's common limits: u32 rows and columns, `ld >= cols`, equal F.
pub(crate) fn check_dense(op: &'static str, named: &[(&str, &RawDense)]) -> Result<()> {
    let f = named.first().map_or(0, |(_, d)| d.cols);
    for (name, d) in named {
        if d.cols != f {
            return Err(shape(
                op,
                format!("{name} has {} columns, expected {f}", d.cols),
            ));
        }
        if d.ld < d.cols {
            return Err(shape(
                op,
                format!(
                    "{name} leading dimension {} is below its {} columns",
                    d.ld, d.cols
                ),
            ));
        }
        if u32::try_from(d.rows).is_err() || u32::try_from(d.cols).is_err() {
            return Err(shape(
                op,
                format!("{name} is {} × {}, beyond u32", d.rows, d.cols),
            ));
        }
    }
    Ok(())
}

/// The shape rules of [`GpuDevice::gather_rows_raw`]: `out` has one row per id (or `x`'s
/// rows without ids), every id is a row of `x`, F agrees.
pub fn check_gather(x: &RawDense, ids: Option<(usize, usize)>, out: &RawDense) -> Result<()> {
    check_dense(GATHER, &[("X", x), ("out", out)])?;
    let (len, end) = ids.unwrap_or((x.rows, x.rows));
    if out.rows != len {
        return Err(shape(
            GATHER,
            format!("out has {} rows for {len} row ids", out.rows),
        ));
    }
    if end > x.rows {
        return Err(shape(
            GATHER,
            format!("row id {} is out of range for X's {} rows", end - 1, x.rows),
        ));
    }
    Ok(())
}

/// The shape rules of [`GpuDevice::scatter_add_raw`].
pub fn check_scatter(
    packed_rows: usize,
    output_rows: usize,
    packed: &RawDense,
    y: &RawDense,
) -> Result<()> {
    check_dense(SCATTER_ADD, &[("packed", packed), ("Y", y)])?;
    if packed.rows != packed_rows || y.rows != output_rows {
        return Err(shape(
            SCATTER_ADD,
            format!(
                "the plan is for {packed_rows} packed and {output_rows} output rows, given {} \
                 and {}",
                packed.rows, y.rows
            ),
        ));
    }
    Ok(())
}

/// The shape rules of [`GpuDevice::add_blocks_raw`]; returns the number of blocks.
pub fn check_add_blocks(blocks: &RawDense, y: &RawDense) -> Result<usize> {
    check_dense(ADD_BLOCKS, &[("blocks", blocks), ("Y", y)])?;
    if y.rows == 0 {
        return Ok(0);
    }
    if !blocks.rows.is_multiple_of(y.rows) {
        return Err(shape(
            ADD_BLOCKS,
            format!(
                "{} stacked rows are not a whole number of {}-row blocks",
                blocks.rows, y.rows
            ),
        ));
    }
    Ok(blocks.rows / y.rows)
}

impl GpuDevice {
    /// `out[k] = x[rows[k]]` for every id of `rows` (`None`: `out[k] = x[k]`, a copy into
    /// another leading dimension), queued on `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// `x` and `out` must be device memory of this device's context holding
    /// `(rows - 1) * ld + cols` f32 each, not overlapping; both must stay alive, and `stream`
    /// (a live stream of this context) must not be destroyed, until the kernel has finished.
    pub unsafe fn gather_rows_raw(
        &self,
        x: RawDense,
        rows: Option<&DeviceRows>,
        out: RawDense,
        stream: Option<RawStream>,
    ) -> Result<()> {
        if let Some(r) = rows {
            if !self.same(&r.dev) {
                return Err(CudaError::DeviceMismatch(GATHER));
            }
        }
        check_gather(&x, rows.map(|r| (r.len, r.end)), &out)?;
        if out.rows == 0 || out.cols == 0 {
            return Ok(());
        }
        let args = [
            Arg::U32(crate::kernel_u32(out.rows)),
            Arg::U64(rows.map_or(0, |r| self.ptr(&r.buf))),
            Arg::U64(x.ptr),
            Arg::U64(x.ld as u64),
            Arg::U64(out.ptr),
            Arg::U64(out.ld as u64),
            Arg::U32(crate::kernel_u32(out.cols)),
        ];
        // SAFETY: the arguments match dsp_gather_rows; the ids are below x.rows (checked) and
        // the buffers satisfy this function's contract.
        unsafe {
            self.ctx()
                .launch(GATHER, row_blocks(out.rows), &args, stream)
        }
    }

    /// `y[row] += packed[src]` for every contribution of `plan`, in the plan's order, queued
    /// on `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// As [`gather_rows_raw`](Self::gather_rows_raw), with `packed` and `y` for `x` and `out`.
    pub unsafe fn scatter_add_raw(
        &self,
        plan: &DeviceScatter,
        packed: RawDense,
        y: RawDense,
        stream: Option<RawStream>,
    ) -> Result<()> {
        if !self.same(&plan.dev) {
            return Err(CudaError::DeviceMismatch(SCATTER_ADD));
        }
        check_scatter(plan.packed_rows, plan.nrows, &packed, &y)?;
        if plan.targets == 0 || y.cols == 0 {
            return Ok(());
        }
        let args = [
            Arg::U32(crate::kernel_u32(plan.targets)),
            Arg::U64(self.ptr(&plan.rows)),
            Arg::U64(self.ptr(&plan.ptr)),
            Arg::U64(self.ptr(&plan.src)),
            Arg::U64(packed.ptr),
            Arg::U64(packed.ld as u64),
            Arg::U64(y.ptr),
            Arg::U64(y.ld as u64),
            Arg::U32(crate::kernel_u32(y.cols)),
        ];
        // SAFETY: the arguments match dsp_scatter_add_rows; the plan's rows are below y.rows
        // and its sources below packed.rows (ScatterPlan::new and the check above).
        unsafe {
            self.ctx()
                .launch(SCATTER_ADD, row_blocks(plan.targets), &args, stream)
        }
    }

    /// `y[i] += blocks[b · y.rows + i]` for `b = 0, 1, …` in that order (`blocks` stacks whole
    /// `y.rows`-row blocks), queued on `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// As [`gather_rows_raw`](Self::gather_rows_raw), with `blocks` and `y`.
    pub unsafe fn add_blocks_raw(
        &self,
        blocks: RawDense,
        y: RawDense,
        stream: Option<RawStream>,
    ) -> Result<()> {
        let nblocks = check_add_blocks(&blocks, &y)?;
        if nblocks == 0 || y.cols == 0 {
            return Ok(());
        }
        let args = [
            Arg::U32(crate::kernel_u32(y.rows)),
            Arg::U32(crate::kernel_u32(nblocks)),
            Arg::U64(blocks.ptr),
            Arg::U64(blocks.ld as u64),
            Arg::U64(y.ptr),
            Arg::U64(y.ld as u64),
            Arg::U32(crate::kernel_u32(y.cols)),
        ];
        // SAFETY: the arguments match dsp_add_blocks; `blocks` holds nblocks · y.rows rows
        // (checked) and the buffers satisfy this function's contract.
        unsafe {
            self.ctx()
                .launch(ADD_BLOCKS, row_blocks(y.rows), &args, stream)
        }
    }
}

impl GpuDevice {
    /// `out[k]` = the bit pattern of `x[k]` in `fmt` for `k < len` (`x`: `len` f32, `out`:
    /// `len` 16-bit values), queued on `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// `x` and `out` must be device memory of this device's context holding `len` values each,
    /// not overlapping; both must stay alive, and `stream` (a live stream of this context) must
    /// not be destroyed, until the kernel has finished.
    ///
    /// # Errors
    /// [`CudaError::Shape`] for the rules of [`check_convert`]; driver errors.
    pub unsafe fn narrow_raw(
        &self,
        fmt: HalfFormat,
        x: u64,
        out: u64,
        len: usize,
        stream: Option<RawStream>,
    ) -> Result<()> {
        check_convert(NARROW, x, out, len)?;
        // SAFETY: forwarded contract; the arguments match dsp_narrow.
        unsafe { self.convert(NARROW, fmt, x, out, len, stream) }
    }

    /// `out[k]` = the `fmt` pattern `h[k]` widened to `f32` for `k < len` (`h`: `len` 16-bit
    /// values, `out`: `len` f32), queued on `stream` (this device's stream when `None`).
    ///
    /// # Safety
    /// As [`narrow_raw`](Self::narrow_raw), with `h` and `out`.
    ///
    /// # Errors
    /// As [`narrow_raw`](Self::narrow_raw).
    pub unsafe fn widen_raw(
        &self,
        fmt: HalfFormat,
        h: u64,
        out: u64,
        len: usize,
        stream: Option<RawStream>,
    ) -> Result<()> {
        check_convert(WIDEN, out, h, len)?;
        // SAFETY: forwarded contract; the arguments match dsp_widen.
        unsafe { self.convert(WIDEN, fmt, h, out, len, stream) }
    }

    /// Launches the conversion `kernel` over `len` values from `from` into `to`.
    ///
    /// # Safety
    /// As [`narrow_raw`](Self::narrow_raw); `kernel` is `dsp_narrow` or `dsp_widen` and the
    /// operands are checked.
    unsafe fn convert(
        &self,
        kernel: &'static str,
        fmt: HalfFormat,
        from: u64,
        to: u64,
        len: usize,
        stream: Option<RawStream>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let args = [
            Arg::U64(len as u64),
            Arg::U32(fmt.code()),
            Arg::U64(from),
            Arg::U64(to),
        ];
        // SAFETY: the arguments match the kernel's (n, fmt, in, out); the threads stay below
        // `len` values in both runs, which the caller's contract makes live memory.
        unsafe {
            self.ctx()
                .launch(kernel, convert_blocks(len), &args, stream)
        }
    }
}

fn same_devices(op: &'static str, a: &GpuDevice, b: &DeviceDense, c: &DeviceDense) -> Result<()> {
    if a.same(b.device()) && a.same(c.device()) {
        Ok(())
    } else {
        Err(CudaError::DeviceMismatch(op))
    }
}

/// `out[k] = x[rows[k]]` on the device's stream.
///
/// # Errors
/// [`CudaError::Shape`] when `out` does not have one row per id, an id is not a row of `x`,
/// or F differs; [`CudaError::DeviceMismatch`]; driver errors.
pub fn gather_rows(x: &DeviceDense, rows: &DeviceRows, out: &mut DeviceDense) -> Result<()> {
    same_devices(GATHER, &rows.dev, x, out)?;
    // SAFETY: live buffers of one device with the sizes their constructors checked; `out` is
    // borrowed mutably, so it cannot be `x`; all work runs on the device's stream.
    unsafe {
        rows.dev
            .gather_rows_raw(x.raw(), Some(rows), out.raw(), None)
    }
}

/// `y[row] += packed[src]` in the plan's fixed order, on the device's stream.
///
/// # Errors
/// [`CudaError::Shape`] when the shapes are not the plan's; [`CudaError::DeviceMismatch`];
/// driver errors.
pub fn scatter_add_rows(
    plan: &DeviceScatter,
    packed: &DeviceDense,
    y: &mut DeviceDense,
) -> Result<()> {
    same_devices(SCATTER_ADD, &plan.dev, packed, y)?;
    // SAFETY: as in gather_rows.
    unsafe { plan.dev.scatter_add_raw(plan, packed.raw(), y.raw(), None) }
}

/// `y += Σ_b block_b` in increasing b, `blocks` stacking whole blocks of `y`'s shape, on the
/// device's stream.
///
/// # Errors
/// [`CudaError::Shape`] when `blocks` is not a stack of `y`-shaped blocks;
/// [`CudaError::DeviceMismatch`]; driver errors.
pub fn add_blocks(blocks: &DeviceDense, y: &mut DeviceDense) -> Result<()> {
    let dev = y.device().clone();
    same_devices(ADD_BLOCKS, &dev, blocks, y)?;
    // SAFETY: as in gather_rows.
    unsafe { dev.add_blocks_raw(blocks.raw(), y.raw(), None) }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test matrices: every narrowing is exact"
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dense(rows: usize, cols: usize, ld: usize) -> RawDense {
        RawDense {
            rows,
            cols,
            ld,
            ptr: 0,
        }
    }

    /// What the scatter-add kernel computes, on the host, from the plan alone.
    fn apply(plan: &ScatterPlan, packed: &[f32], f: usize, y: &mut [f32]) {
        for (k, &r) in plan.rows().iter().enumerate() {
            for j in 0..f {
                let mut acc = y[r as usize * f + j];
                for &s in &plan.src()[plan.ptr()[k] as usize..plan.ptr()[k + 1] as usize] {
                    acc += packed[s as usize * f + j];
                }
                y[r as usize * f + j] = acc;
            }
        }
    }

    #[test]
    fn scatter_plan_orders_contributions_by_list() {
        // Row 2 is in all three lists, row 0 in the first and last.
        let plan = ScatterPlan::new(4, &[&[0, 2], &[2, 3], &[0, 2]]).unwrap();
        assert_eq!(plan.rows(), &[0, 2, 3]);
        assert_eq!(plan.ptr(), &[0, 2, 5, 6]);
        assert_eq!(plan.src(), &[0, 4, 1, 2, 5, 3]);
        assert_eq!(plan.packed_rows(), 6);
        assert_eq!(plan.output_rows(), 4);
    }

    #[test]
    fn scatter_plan_rejects_bad_lists() {
        assert!(ScatterPlan::new(4, &[&[1, 1]]).is_err());
        assert!(ScatterPlan::new(4, &[&[2, 1]]).is_err());
        assert!(ScatterPlan::new(4, &[&[0, 4]]).is_err());
        let empty = ScatterPlan::new(0, &[&[], &[]]).unwrap();
        assert_eq!(empty.ptr(), &[0]);
        assert_eq!(empty.packed_rows(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The plan adds exactly what a loop over the lists in order adds, bit for bit.
        #[test]
        fn scatter_plan_matches_sequential_loop(
            nrows in 0usize..40,
            masks in prop::collection::vec(prop::collection::vec(any::<bool>(), 40), 0..5),
            f in 1usize..4,
            seed in any::<u64>(),
        ) {
            let lists: Vec<Vec<u32>> = masks
                .iter()
                .map(|m| (0..nrows as u32).filter(|&r| m[r as usize]).collect())
                .collect();
            let refs: Vec<&[u32]> = lists.iter().map(Vec::as_slice).collect();
            let plan = ScatterPlan::new(nrows, &refs).unwrap();
            let total: usize = lists.iter().map(Vec::len).sum();
            prop_assert_eq!(plan.packed_rows(), total);
            let value = |i: usize| ((seed.wrapping_mul(i as u64 + 1) >> 40) as f32) * 1e-3 - 3.0;
            let packed: Vec<f32> = (0..total * f).map(value).collect();
            let mut expected: Vec<f32> = (0..nrows * f).map(|i| value(i + 7)).collect();
            let mut got = expected.clone();
            let mut k = 0;
            for list in &lists {
                for &r in list {
                    for j in 0..f {
                        expected[r as usize * f + j] += packed[k * f + j];
                    }
                    k += 1;
                }
            }
            apply(&plan, &packed, f, &mut got);
            prop_assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn row_blocks_cover_one_warp_per_row() {
        assert_eq!(row_blocks(0), 0);
        assert_eq!(row_blocks(1), 1);
        assert_eq!(row_blocks(8), 1);
        assert_eq!(row_blocks(9), 2);
        for n in [1usize, 7, 8, 1000, 1 << 20] {
            let warps = row_blocks(n) * u64::from(crate::strategy::WARPS_PER_BLOCK);
            assert!(warps >= n as u64 && warps < n as u64 + 8);
        }
    }

    #[test]
    fn conversions_check_their_operands_and_cover_them() {
        assert!(check_convert(NARROW, 0x1000, 0x2002, 5).is_ok());
        assert!(check_convert(NARROW, 0, 0, 0).is_ok());
        let err = |r: Result<()>, text: &str| match r {
            Err(CudaError::Shape { reason, .. }) => assert!(reason.contains(text), "{reason}"),
            other => panic!("expected a shape error with {text:?}, got {other:?}"),
        };
        err(check_convert(NARROW, 0, 0x2000, 1), "NULL");
        err(check_convert(NARROW, 0x1002, 0x2000, 1), "misaligned");
        err(check_convert(WIDEN, 0x1000, 0x2001, 1), "misaligned");
        err(
            check_convert(NARROW, 0x1000, 0x2000, usize::MAX / 2),
            "overflow",
        );
        assert_eq!(convert_blocks(0), 0);
        assert_eq!(convert_blocks(1), 1);
        assert_eq!(convert_blocks(256), 1);
        assert_eq!(convert_blocks(257), 2);
        assert_eq!(convert_blocks(usize::MAX), CONVERT_MAX_BLOCKS);
        assert_eq!((HalfFormat::Bf16.code(), HalfFormat::F16.code()), (0, 1));
    }

    #[test]
    fn shape_checks() {
        // gather
        assert!(check_gather(&dense(5, 3, 3), Some((2, 5)), &dense(2, 3, 4)).is_ok());
        assert!(check_gather(&dense(5, 3, 3), Some((2, 6)), &dense(2, 3, 3)).is_err());
        assert!(check_gather(&dense(5, 3, 3), Some((2, 1)), &dense(3, 3, 3)).is_err());
        assert!(check_gather(&dense(5, 3, 3), None, &dense(5, 3, 8)).is_ok());
        assert!(check_gather(&dense(5, 3, 3), None, &dense(5, 2, 3)).is_err());
        assert!(check_gather(&dense(5, 3, 2), None, &dense(5, 3, 3)).is_err());
        // scatter
        assert!(check_scatter(4, 6, &dense(4, 2, 2), &dense(6, 2, 5)).is_ok());
        assert!(check_scatter(4, 6, &dense(3, 2, 2), &dense(6, 2, 5)).is_err());
        assert!(check_scatter(4, 6, &dense(4, 2, 2), &dense(6, 3, 5)).is_err());
        // blocks
        assert_eq!(
            check_add_blocks(&dense(9, 2, 2), &dense(3, 2, 2)).unwrap(),
            3
        );
        assert_eq!(
            check_add_blocks(&dense(0, 2, 2), &dense(3, 2, 2)).unwrap(),
            0
        );
        assert_eq!(
            check_add_blocks(&dense(0, 2, 2), &dense(0, 2, 2)).unwrap(),
            0
        );
        assert!(check_add_blocks(&dense(8, 2, 2), &dense(3, 2, 2)).is_err());
    }
}
