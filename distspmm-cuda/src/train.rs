//! The element-wise steps of training on the device (`kernels/train.cu`), each with the
//! semantics of the CPU trainer (distspmm-gcn) so that a GPU run and a CPU run with the same
//! seed follow the same trajectory:
//!
//! * [`bias_activation`] / [`activation_backward`] / [`column_sums`]: a layer's epilogue
//!   `out = act(z + b)` (identity, ReLU, ELU with α = 1), its backward `d ← d · act'(z)` from the
//!   pre-activation, and the bias gradient (column sums, deterministic: fixed chunks of 256
//!   rows, fixed order within and across them).
//! * [`dropout`] / [`dropout_in_place`]: inverted dropout with the CPU trainer's counter-keyed
//!   masks, bit for bit — entry (node, column) of layer `l`'s input at epoch `e` is kept as a
//!   pure function of (seed, epoch, layer, original node id, column): SplitMix64 per row gives
//!   the row's keys, Wellons' `lowbias32` of `column · mul + add` per entry, kept when the top
//!   24 bits reach `p · 2²⁴`; kept values are multiplied by `1 / (1 − p)`. The same call masks
//!   the gradient in the backward pass.
//! * [`nll_loss`]: log-softmax + NLL over the labelled training rows — the logits' gradient
//!   `(softmax − onehot) / train_total` there and 0 elsewhere — and the sums the CPU trainer's
//!   metrics are made of ([`LossSums`]), added in f64 in a fixed order.
//! * [`adam_step`]: one Adam step with PyTorch's semantics (L2 weight decay added to the
//!   gradient), every operation rounded on its own as on the CPU: the CPU's step bit for bit.

use std::ops::Range;

use crate::device::{DeviceDense, GpuDevice, RawDense};
use crate::driver::{Arg, Buffer};
use crate::error::{CudaError, Result};
use crate::rows::{check_dense, row_blocks};

const BIAS_ACT: &str = "dsp_bias_act";
const ACT_BACKWARD: &str = "dsp_act_backward";
const COLUMN_SUMS: &str = "dsp_column_sums";
const DROPOUT: &str = "dsp_dropout";
const NLL: &str = "dsp_nll";
const SUM_F64: &str = "dsp_sum_f64";
const ADAM: &str = "dsp_adam";

/// Every kernel in `kernels/train.cu`; the build's ptxas report must list each for sm_80 and
/// sm_90, and the loaded module must contain each.
pub const TRAIN_KERNELS: [&str; 7] = [
    BIAS_ACT,
    ACT_BACKWARD,
    COLUMN_SUMS,
    DROPOUT,
    NLL,
    SUM_F64,
    ADAM,
];

/// Rows per block of the reductions (`CHUNK_ROWS` in `kernels/train.cu`).
const CHUNK_ROWS: usize = 256;
/// Columns per block of the column sums (a warp).
const TILE_COLS: usize = 32;
/// Statistics per block of the NLL kernel.
const STATS: usize = 7;

/// Mask bit of the training rows in [`DeviceLabels`].
pub const TRAIN: u8 = 1;
/// Mask bit of the validation rows.
pub const VAL: u8 = 2;
/// Mask bit of the test rows.
pub const TEST: u8 = 4;

fn invalid(op: &'static str, reason: String) -> CudaError {
    CudaError::InvalidArgument { op, reason }
}

fn shape(op: &'static str, reason: String) -> CudaError {
    CudaError::Shape { op, reason }
}

fn same_device(op: &'static str, dev: &GpuDevice, operands: &[&DeviceDense]) -> Result<()> {
    if operands.iter().all(|d| dev.same(d.device())) {
        Ok(())
    } else {
        Err(CudaError::DeviceMismatch(op))
    }
}

fn same_shape(op: &'static str, named: &[(&str, &DeviceDense)]) -> Result<()> {
    let Some((first, a)) = named.first() else {
        return Ok(());
    };
    for (name, d) in &named[1..] {
        if (d.rows(), d.cols()) != (a.rows(), a.cols()) {
            return Err(shape(
                op,
                format!(
                    "{name} is {} × {} but {first} is {} × {}",
                    d.rows(),
                    d.cols(),
                    a.rows(),
                    a.cols()
                ),
            ));
        }
    }
    Ok(())
}

/// A layer's output activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None (the last layer's logits).
    Identity,
    /// `max(z, 0)`.
    Relu,
    /// `z > 0 ? z : exp(z) − 1` (α = 1).
    Elu,
}

impl Activation {
    /// The kernels' code of the activation.
    fn code(self) -> u32 {
        match self {
            Activation::Identity => 0,
            Activation::Relu => 1,
            Activation::Elu => 2,
        }
    }
}

/// Checks the bias of an `F`-column matrix: `1 × F`, contiguous.
fn check_bias(op: &'static str, bias: &DeviceDense, f: usize) -> Result<()> {
    if bias.rows() != 1 || bias.cols() != f {
        return Err(shape(
            op,
            format!(
                "the bias must be 1 × {f}, given {} × {}",
                bias.rows(),
                bias.cols()
            ),
        ));
    }
    Ok(())
}

/// Launches the epilogue with `out` (which may be `z` itself).
fn launch_bias_act(
    bias: Option<&DeviceDense>,
    act: Activation,
    z: &RawDense,
    out: &RawDense,
    dev: &GpuDevice,
) -> Result<()> {
    check_dense(BIAS_ACT, &[("z", z), ("out", out)])?;
    if let Some(b) = bias {
        check_bias(BIAS_ACT, b, z.cols)?;
    }
    if z.rows != out.rows {
        return Err(shape(
            BIAS_ACT,
            format!("out has {} rows for z's {}", out.rows, z.rows),
        ));
    }
    if z.rows == 0 || z.cols == 0 {
        return Ok(());
    }
    let args = [
        Arg::U32(crate::kernel_u32(z.rows)),
        Arg::U32(crate::kernel_u32(z.cols)),
        Arg::U64(bias.map_or(0, |b| b.raw().ptr)),
        Arg::U64(z.ptr),
        Arg::U64(z.ld as u64),
        Arg::U64(out.ptr),
        Arg::U64(out.ld as u64),
        Arg::U32(act.code()),
    ];
    // SAFETY: the arguments match dsp_bias_act; z, out and the bias are live matrices of `dev`
    // with the shapes checked above (out either distinct from z or z itself, which the kernel
    // allows: each element is read before it is written, by the same thread).
    unsafe { dev.ctx().launch(BIAS_ACT, row_blocks(z.rows), &args, None) }
}

/// `z += bias` (row-wise, when given) and `out = act(z)`, element-wise, on the device's
/// stream; `z` keeps the pre-activation for [`activation_backward`].
///
/// # Errors
/// [`CudaError::Shape`] when `out` is not `z`'s shape or the bias is not `1 × F`;
/// [`CudaError::DeviceMismatch`]; driver errors.
pub fn bias_activation(
    bias: Option<&DeviceDense>,
    act: Activation,
    z: &mut DeviceDense,
    out: &mut DeviceDense,
) -> Result<()> {
    let dev = z.device().clone();
    same_device(BIAS_ACT, &dev, &[out])?;
    if let Some(b) = bias {
        same_device(BIAS_ACT, &dev, &[b])?;
    }
    same_shape(BIAS_ACT, &[("z", z), ("out", out)])?;
    launch_bias_act(bias, act, &z.raw(), &out.raw(), &dev)
}

/// `z ← act(z + bias)` in place (the pre-activation is not kept), on the device's stream.
///
/// # Errors
/// As [`bias_activation`].
pub fn bias_activation_in_place(
    bias: Option<&DeviceDense>,
    act: Activation,
    z: &mut DeviceDense,
) -> Result<()> {
    let dev = z.device().clone();
    if let Some(b) = bias {
        same_device(BIAS_ACT, &dev, &[b])?;
    }
    let raw = z.raw();
    launch_bias_act(bias, act, &raw, &raw, &dev)
}

/// `d ← d · act'(z)` in place from the pre-activation `z`: ReLU selects (`z > 0`), so a NaN
/// gradient where the ReLU is off becomes 0; ELU multiplies by `exp(z)` where `z ≤ 0`; the
/// identity does nothing. On the device's stream.
///
/// # Errors
/// [`CudaError::Shape`] when the shapes differ; [`CudaError::DeviceMismatch`]; driver errors.
pub fn activation_backward(act: Activation, z: &DeviceDense, d: &mut DeviceDense) -> Result<()> {
    let dev = d.device().clone();
    same_device(ACT_BACKWARD, &dev, &[z])?;
    same_shape(ACT_BACKWARD, &[("d", d), ("z", z)])?;
    let (zr, dr) = (z.raw(), d.raw());
    check_dense(ACT_BACKWARD, &[("z", &zr), ("d", &dr)])?;
    if act == Activation::Identity || dr.rows == 0 || dr.cols == 0 {
        return Ok(());
    }
    let args = [
        Arg::U32(crate::kernel_u32(dr.rows)),
        Arg::U32(crate::kernel_u32(dr.cols)),
        Arg::U64(zr.ptr),
        Arg::U64(zr.ld as u64),
        Arg::U64(dr.ptr),
        Arg::U64(dr.ld as u64),
        Arg::U32(act.code()),
    ];
    // SAFETY: the arguments match dsp_act_backward; both are live matrices of this device of
    // the checked, equal shapes, `d` borrowed mutably so distinct from `z`.
    unsafe {
        dev.ctx()
            .launch(ACT_BACKWARD, row_blocks(dr.rows), &args, None)
    }
}

/// Blocks of one column-sum pass over `rows` rows and `f` columns.
fn column_sum_blocks(rows: usize, f: usize) -> u64 {
    (rows.div_ceil(CHUNK_ROWS).max(1) * f.div_ceil(TILE_COLS)) as u64
}

/// `out[0, j] = Σ_i x[i, j]` (the bias gradient; `out` is `1 × F`), on the device's stream:
/// chunks of 256 rows summed in a fixed order, then the chunks' sums the same way until one
/// row is left, so the result does not change from run to run.
///
/// # Errors
/// [`CudaError::Shape`] when `out` is not `1 × F`; [`CudaError::DeviceMismatch`]; driver
/// errors.
pub fn column_sums(x: &DeviceDense, out: &mut DeviceDense) -> Result<()> {
    let dev = x.device().clone();
    same_device(COLUMN_SUMS, &dev, &[out])?;
    check_bias(COLUMN_SUMS, out, x.cols())?;
    let f = x.cols();
    let xr = x.raw();
    check_dense(COLUMN_SUMS, &[("x", &xr)])?;
    if f == 0 {
        return Ok(());
    }
    // Partial sums of each pass, kept alive until the passes that read them are queued (their
    // memory is released in stream order).
    let mut partials: Vec<Buffer<f32>> = Vec::new();
    let mut cur = xr;
    loop {
        let chunks = cur.rows.div_ceil(CHUNK_ROWS).max(1);
        let target = if chunks == 1 {
            out.raw()
        } else {
            let buf = dev.ctx().zeros::<f32>(chunks * f)?;
            let raw = RawDense {
                rows: chunks,
                cols: f,
                ld: f,
                ptr: dev.ptr(&buf),
            };
            partials.push(buf);
            raw
        };
        let args = [
            Arg::U32(crate::kernel_u32(cur.rows)),
            Arg::U32(crate::kernel_u32(f)),
            Arg::U64(cur.ptr),
            Arg::U64(cur.ld as u64),
            Arg::U64(target.ptr),
            Arg::U64(target.ld as u64),
        ];
        // SAFETY: the arguments match dsp_column_sums; `cur` is x or a partial buffer of
        // `cur.rows × f`, the target holds `chunks` rows of `f` columns (out: one row), all
        // live on this device's stream.
        unsafe {
            dev.ctx()
                .launch(COLUMN_SUMS, column_sum_blocks(cur.rows, f), &args, None)?;
        }
        if chunks == 1 {
            return Ok(());
        }
        cur = target;
    }
}

/// The key of one dropout mask: the CPU trainer's `DropoutKey` (seed, epoch, layer whose input
/// is dropped, probability).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutKey {
    /// Seed of the run.
    pub seed: u64,
    /// Epoch (0-based).
    pub epoch: u64,
    /// Layer whose input is dropped.
    pub layer: u64,
    /// Drop probability in `[0, 1)`; 0 keeps everything unscaled.
    pub p: f32,
}

impl DropoutKey {
    /// `1 / (1 − p)`, the factor of kept entries (1 when `p = 0`).
    pub fn scale(&self) -> f32 {
        if self.p == 0.0 {
            1.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }

    /// The drop threshold on 24 random bits: entries whose draw is below it are dropped.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "checked p in [0, 1): the product is in [0, 2^24)"
    )]
    pub fn threshold(&self) -> u32 {
        (f64::from(self.p) * f64::from(1u32 << 24)) as u32
    }

    fn check(&self) -> Result<()> {
        if (0.0..1.0).contains(&self.p) {
            Ok(())
        } else {
            Err(invalid(
                DROPOUT,
                format!("the drop probability is {}, outside [0, 1)", self.p),
            ))
        }
    }
}

/// Original node ids of a matrix's rows on the device (the dropout masks' row keys).
#[derive(Debug)]
pub struct DeviceIds {
    dev: GpuDevice,
    len: usize,
    buf: Buffer<u64>,
}

impl DeviceIds {
    /// Uploads `ids`.
    ///
    /// # Errors
    /// [`CudaError::Shape`] beyond u32 rows; driver errors.
    pub fn new(dev: &GpuDevice, ids: &[u64]) -> Result<Self> {
        if u32::try_from(ids.len()).is_err() {
            return Err(shape(
                "DeviceIds::new",
                format!("{} ids exceed u32 rows", ids.len()),
            ));
        }
        Ok(Self {
            dev: dev.clone(),
            len: ids.len(),
            buf: dev.upload(ids)?,
        })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Launches the dropout of `src` (columns numbered from `first_col`) into `dst`.
fn launch_dropout(
    key: &DropoutKey,
    ids: &DeviceIds,
    first_col: usize,
    src: &RawDense,
    dst: &RawDense,
) -> Result<()> {
    key.check()?;
    check_dense(DROPOUT, &[("src", src), ("dst", dst)])?;
    if src.rows != ids.len || dst.rows != ids.len {
        return Err(shape(
            DROPOUT,
            format!(
                "{} ids for src of {} rows and dst of {}",
                ids.len, src.rows, dst.rows
            ),
        ));
    }
    let Some(first) = u32::try_from(first_col)
        .ok()
        .filter(|&c| c.checked_add(crate::kernel_u32(src.cols)).is_some())
    else {
        return Err(shape(
            DROPOUT,
            format!("columns {first_col}..+{} exceed u32", src.cols),
        ));
    };
    if src.rows == 0 || src.cols == 0 {
        return Ok(());
    }
    let args = [
        Arg::U32(crate::kernel_u32(src.rows)),
        Arg::U32(crate::kernel_u32(src.cols)),
        Arg::U32(first),
        Arg::U64(ids.dev.ptr(&ids.buf)),
        Arg::U64(key.seed),
        Arg::U64(key.epoch),
        Arg::U64(key.layer),
        Arg::U32(key.threshold()),
        Arg::F32(key.scale()),
        Arg::U64(src.ptr),
        Arg::U64(src.ld as u64),
        Arg::U64(dst.ptr),
        Arg::U64(dst.ld as u64),
    ];
    // SAFETY: the arguments match dsp_dropout; one id per row, src and dst live matrices of
    // the ids' device with the checked shapes (dst distinct from src or src itself, which the
    // kernel allows: each element is read before it is written, by the same thread).
    unsafe {
        ids.dev
            .ctx()
            .launch(DROPOUT, row_blocks(src.rows), &args, None)
    }
}

/// `dst = dropout(src[:, cols])` with the mask of `key`: row `i` is node `ids[i]`, column `j`
/// of `dst` is column `cols.start + j` of the mask (a tensor-parallel rank's slice draws the
/// same decisions as the whole), kept entries times [`DropoutKey::scale`], dropped ones 0. On
/// the device's stream.
///
/// # Errors
/// [`CudaError::InvalidArgument`] when `p` is outside `[0, 1)`; [`CudaError::Shape`] when the
/// rows are not one per id, `cols` is not within `src`'s columns or `dst` is not
/// `rows × cols.len()`; [`CudaError::DeviceMismatch`]; driver errors.
pub fn dropout(
    key: &DropoutKey,
    ids: &DeviceIds,
    src: &DeviceDense,
    cols: Range<usize>,
    dst: &mut DeviceDense,
) -> Result<()> {
    same_device(DROPOUT, &ids.dev, &[src, dst])?;
    let whole = src.raw();
    if cols.start > cols.end || cols.end > whole.cols || dst.cols() != cols.len() {
        return Err(shape(
            DROPOUT,
            format!(
                "columns {}..{} of a {}-column src into a {}-column dst",
                cols.start,
                cols.end,
                whole.cols,
                dst.cols()
            ),
        ));
    }
    let slice = RawDense {
        cols: cols.len(),
        ptr: whole.ptr + 4 * cols.start as u64,
        ..whole
    };
    launch_dropout(key, ids, cols.start, &slice, &dst.raw())
}

/// `x = dropout(x)` in place, the columns of `x` being mask columns `first_col..` (the
/// backward pass masks the gradient with the forward's key). On the device's stream.
///
/// # Errors
/// As [`dropout`].
pub fn dropout_in_place(
    key: &DropoutKey,
    ids: &DeviceIds,
    first_col: usize,
    x: &mut DeviceDense,
) -> Result<()> {
    same_device(DROPOUT, &ids.dev, &[x])?;
    let raw = x.raw();
    launch_dropout(key, ids, first_col, &raw, &raw)
}

/// Labels and split masks of a matrix's rows on the device, for [`nll_loss`].
#[derive(Debug)]
pub struct DeviceLabels {
    dev: GpuDevice,
    rows: usize,
    classes: usize,
    labels: Buffer<i32>,
    masks: Buffer<u8>,
}

impl DeviceLabels {
    /// Uploads one label (−1 = unlabelled, else below `classes`) and one mask ([`TRAIN`] |
    /// [`VAL`] | [`TEST`] bits) per row.
    ///
    /// # Errors
    /// [`CudaError::Shape`] when the lengths differ, a label is out of range, or the sizes
    /// exceed u32; driver errors.
    pub fn new(dev: &GpuDevice, classes: usize, labels: &[i32], masks: &[u8]) -> Result<Self> {
        const OP: &str = "DeviceLabels::new";
        if labels.len() != masks.len() {
            return Err(shape(
                OP,
                format!("{} labels but {} masks", labels.len(), masks.len()),
            ));
        }
        if u32::try_from(labels.len()).is_err() || u32::try_from(classes).is_err() {
            return Err(shape(
                OP,
                format!("{} rows of {classes} classes exceed u32", labels.len()),
            ));
        }
        if let Some((i, &y)) = labels
            .iter()
            .enumerate()
            .find(|&(_, &y)| y < -1 || usize::try_from(y).is_ok_and(|y| y >= classes))
        {
            return Err(shape(
                OP,
                format!("row {i} has label {y}; labels are −1 (none) or below {classes}"),
            ));
        }
        Ok(Self {
            dev: dev.clone(),
            rows: labels.len(),
            classes,
            labels: dev.upload(labels)?,
            masks: dev.upload(masks)?,
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Classes.
    pub fn classes(&self) -> usize {
        self.classes
    }
}

/// The sums [`nll_loss`] returns, over the labelled rows of the call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSums {
    /// Σ over training rows of `log Σ exp(z) − z_label`.
    pub nll: f64,
    /// Training rows whose largest logit (first, on ties) is at their label.
    pub train_correct: f64,
    /// Training rows.
    pub train_count: f64,
    /// Validation rows predicted right.
    pub val_correct: f64,
    /// Validation rows.
    pub val_count: f64,
    /// Test rows predicted right.
    pub test_correct: f64,
    /// Test rows.
    pub test_count: f64,
}

impl LossSums {
    /// `[nll, train correct, train count, val correct, val count, test correct, test count]`.
    pub fn to_array(&self) -> [f64; 7] {
        [
            self.nll,
            self.train_correct,
            self.train_count,
            self.val_correct,
            self.val_count,
            self.test_correct,
            self.test_count,
        ]
    }

    fn from_array(a: [f64; 7]) -> Self {
        let [nll, train_correct, train_count, val_correct, val_count, test_correct, test_count] = a;
        Self {
            nll,
            train_correct,
            train_count,
            val_correct,
            val_count,
            test_correct,
            test_count,
        }
    }
}

/// Log-softmax + NLL of `logits` (`rows × classes`) against `labels`: `dz` gets
/// `(softmax − onehot) / train_total` (rounded through f64) on the labelled training rows and 0
/// elsewhere, and the call returns the sums over this matrix's rows (a sum of f64 partials in
/// a fixed order; waits for the device). `train_total` is the number of training rows the loss
/// is averaged over (all ranks').
///
/// # Errors
/// [`CudaError::Shape`] when the logits are not `labels.rows() × labels.classes()` or `dz`
/// differs from them; [`CudaError::InvalidArgument`] when `train_total` is not positive and
/// finite; [`CudaError::DeviceMismatch`]; driver errors.
pub fn nll_loss(
    logits: &DeviceDense,
    labels: &DeviceLabels,
    train_total: f64,
    dz: &mut DeviceDense,
) -> Result<LossSums> {
    let dev = labels.dev.clone();
    same_device(NLL, &dev, &[logits, dz])?;
    same_shape(NLL, &[("logits", logits), ("dz", dz)])?;
    if logits.rows() != labels.rows || logits.cols() != labels.classes {
        return Err(shape(
            NLL,
            format!(
                "logits are {} × {} for {} labelled rows of {} classes",
                logits.rows(),
                logits.cols(),
                labels.rows,
                labels.classes
            ),
        ));
    }
    if !(train_total.is_finite() && train_total > 0.0) {
        return Err(invalid(
            NLL,
            format!("train_total is {train_total}; it must be positive"),
        ));
    }
    let (zr, dr) = (logits.raw(), dz.raw());
    check_dense(NLL, &[("logits", &zr), ("dz", &dr)])?;
    let blocks = labels.rows.div_ceil(CHUNK_ROWS).max(1);
    let mut partial = dev.ctx().zeros::<f64>(blocks * STATS)?;
    let args = [
        Arg::U32(crate::kernel_u32(labels.rows)),
        Arg::U32(crate::kernel_u32(labels.classes)),
        Arg::U64(zr.ptr),
        Arg::U64(zr.ld as u64),
        Arg::U64(dev.ptr(&labels.labels)),
        Arg::U64(dev.ptr(&labels.masks)),
        Arg::F64(train_total),
        Arg::U64(dr.ptr),
        Arg::U64(dr.ld as u64),
        Arg::U64(dev.ptr(&partial)),
    ];
    // SAFETY: the arguments match dsp_nll; logits and dz are live `rows × classes` matrices of
    // this device (dz borrowed mutably: distinct), one label and mask per row, labels below
    // `classes` (DeviceLabels::new), `blocks × 7` partials.
    unsafe { dev.ctx().launch(NLL, blocks as u64, &args, None)? };
    let mut rows = blocks;
    while rows > 1 {
        let next = rows.div_ceil(CHUNK_ROWS);
        let out = dev.ctx().zeros::<f64>(next * STATS)?;
        let args = [
            Arg::U32(crate::kernel_u32(rows)),
            Arg::U32(crate::kernel_u32(STATS)),
            Arg::U64(dev.ptr(&partial)),
            Arg::U64(dev.ptr(&out)),
        ];
        // SAFETY: the arguments match dsp_sum_f64; `partial` holds `rows × 7` f64 and `out`
        // `next × 7`, both live on this device's stream.
        unsafe { dev.ctx().launch(SUM_F64, next as u64, &args, None)? };
        partial = out;
        rows = next;
    }
    let sums = dev.ctx().download(&partial)?;
    let mut a = [0f64; STATS];
    a.copy_from_slice(&sums[..STATS]);
    Ok(LossSums::from_array(a))
}

/// One Adam step's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f32,
    /// The step's number, from 1 (the bias corrections `1 − β^t`).
    pub t: u64,
    /// L2 weight decay added to the gradient (`g + wd · p`); 0 for none.
    pub weight_decay: f32,
}

impl AdamStep {
    /// β₁ (PyTorch's default).
    pub const BETA1: f32 = 0.9;
    /// β₂.
    pub const BETA2: f32 = 0.999;

    /// The bias corrections `(1 − β₁^t, 1 − β₂^t)` in f32, as the CPU trainer computes them.
    pub fn corrections(&self) -> (f32, f32) {
        // β^t is 0 in f32 long before t reaches i32::MAX, so saturating changes nothing.
        let t = i32::try_from(self.t).unwrap_or(i32::MAX);
        (1.0 - Self::BETA1.powi(t), 1.0 - Self::BETA2.powi(t))
    }
}

/// One Adam step on the device: for every element, `g' = g + wd · p` (when `wd ≠ 0`),
/// `m = β₁m + (1 − β₁)g'`, `v = β₂v + (1 − β₂)g'²`, `p −= lr · (m / (1 − β₁^t)) /
/// (√(v / (1 − β₂^t)) + 10⁻⁸)`; `grads` is not modified. The four matrices have one shape and
/// are contiguous (`ld = cols`). On the device's stream.
///
/// # Errors
/// [`CudaError::InvalidArgument`] when `t` is 0; [`CudaError::Shape`] when shapes differ or a
/// matrix is padded; [`CudaError::DeviceMismatch`]; driver errors.
pub fn adam_step(
    step: &AdamStep,
    params: &mut DeviceDense,
    grads: &DeviceDense,
    m: &mut DeviceDense,
    v: &mut DeviceDense,
) -> Result<()> {
    let dev = params.device().clone();
    same_device(ADAM, &dev, &[grads, m, v])?;
    let named = [
        ("params", &*params),
        ("grads", grads),
        ("m", &*m),
        ("v", &*v),
    ];
    same_shape(ADAM, &named)?;
    if let Some((name, d)) = named.iter().find(|(_, d)| d.ld() != d.cols()) {
        return Err(shape(
            ADAM,
            format!(
                "{name} is padded (leading dimension {} for {} columns); Adam takes contiguous \
                 matrices",
                d.ld(),
                d.cols()
            ),
        ));
    }
    if step.t == 0 {
        return Err(invalid(ADAM, "the step number t starts at 1".into()));
    }
    let n = params.rows() * params.cols();
    if n == 0 {
        return Ok(());
    }
    let (bc1, bc2) = step.corrections();
    let args = [
        Arg::U64(n as u64),
        Arg::U64(params.raw().ptr),
        Arg::U64(grads.raw().ptr),
        Arg::U64(m.raw().ptr),
        Arg::U64(v.raw().ptr),
        Arg::F32(step.lr),
        Arg::F32(bc1),
        Arg::F32(bc2),
        Arg::F32(step.weight_decay),
    ];
    let blocks = (n as u64).div_ceil(u64::from(crate::strategy::BLOCK_THREADS));
    // SAFETY: the arguments match dsp_adam; the four are live contiguous matrices of this
    // device with `n` elements each, params, m and v borrowed mutably (distinct).
    unsafe { dev.ctx().launch(ADAM, blocks, &args, None) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropout_thresholds_and_scales() {
        let key = |p| DropoutKey {
            seed: 1,
            epoch: 2,
            layer: 0,
            p,
        };
        assert_eq!(key(0.0).threshold(), 0);
        assert_eq!(key(0.0).scale(), 1.0);
        assert_eq!(key(0.5).threshold(), 1 << 23);
        assert_eq!(key(0.75).scale(), 4.0);
        assert!(key(0.5).check().is_ok());
        for p in [1.0, -0.1, f32::NAN, 2.0] {
            assert!(matches!(
                key(p).check(),
                Err(CudaError::InvalidArgument { .. })
            ));
        }
    }

    #[test]
    fn adam_corrections_follow_t() {
        let s = |t| AdamStep {
            lr: 0.01,
            t,
            weight_decay: 0.0,
        };
        assert_eq!(s(1).corrections(), (1.0 - 0.9, 1.0 - 0.999));
        let (a, b) = s(u64::MAX).corrections();
        assert_eq!((a, b), (1.0, 1.0));
    }

    #[test]
    fn column_sum_passes_cover_rows_and_columns() {
        assert_eq!(column_sum_blocks(0, 1), 1);
        assert_eq!(column_sum_blocks(256, 32), 1);
        assert_eq!(column_sum_blocks(257, 33), 4);
        assert_eq!(column_sum_blocks(1 << 20, 64), 4096 * 2);
    }
}
