//! `GpuDistSpmm` against the CPU `DistSpmm` on the same chunks: forward and backward, both
//! schedules, several F (growing and then reusing the buffers) with padded leading dimensions,
//! traffic equal to the plan, bit-identical reruns, the raw-pointer path on the NCCL stream;
//! the per-edge calls (`spmm_values`, `spmm_values_transpose`, `sddmm`, `sddmm_backward`),
//! their grouped (multi-head) forms, and the edge softmax (plain and after a LeakyReLU,
//! forward and backward); messages in bf16 and f16 against the CPU operator in the same
//! precision (the conversion kernels against distspmm-sparse's conversions bit for bit, the
//! operator's results within the tolerance stated at `check_precisions`, the bytes as the
//! CPU's, NaN and ±Inf arriving as such).
//!
//! - P = 1 in this process (`LocalComm` host, `NcclComm::new`);
//! - P = 2 as two child processes of this test (no MPI needed): the parent creates the NCCL
//!   unique id and hands it over in the environment; each child joins with
//!   `NcclComm::from_unique_id`, agrees through `NcclHost`, and gets its own `NCCL_HOSTID` when
//!   the machine has fewer GPUs than ranks (NCCL refuses two ranks on one GPU of one host).
//!
//! Without a CUDA device every test prints "skipping: no CUDA device (...)" and passes, unless
//! `DISTSPMM_REQUIRE_GPU` is set (distspmm-cuda/gpu-check.sh sets it), which makes it fail.
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chunk_format::{encode, AlignedBuf, ChunkView};
use dist_comm::{
    AllGather, AllReduce, DeviceSelect, Group, LocalComm, NcclComm, NcclHost, NcclUniqueId,
};
use distspmm_cuda::{DeviceDense, GpuDevice, HalfFormat, RawDense};
use distspmm_op::schedule::{Precision, ScheduleKind, Traffic};
use distspmm_op::{DistSpmm, GpuDistSpmm};
use distspmm_prep::chunk::ChunkBuilder;
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::Partition;
use distspmm_sparse::kernel::convert::{narrow, widen, Half};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};

/// Environment of a spawned rank: `RANK,SIZE,HEX-ID`.
const CHILD: &str = "DIST_COMM_GPU_SPMM_CHILD";
const TIMEOUT: Duration = Duration::from_secs(120);
/// (F, padding of the leading dimension): the largest first, then smaller ones that reuse
/// the buffers, then a larger one that grows them again.
const SHAPES: [(usize, usize); 5] = [(64, 0), (5, 3), (1, 0), (33, 1), (130, 2)];

/// The number of CUDA devices, or `None` after printing the skip (failing instead when
/// `DISTSPMM_REQUIRE_GPU` is set).
fn devices() -> Option<usize> {
    let reason = match GpuDevice::count() {
        Ok(n) if n > 0 => return Some(n),
        Ok(_) => "the driver reports no device".to_owned(),
        Err(e) => e.to_string(),
    };
    assert!(
        std::env::var_os("DISTSPMM_REQUIRE_GPU").is_none(),
        "DISTSPMM_REQUIRE_GPU is set but there is no usable device: {reason}"
    );
    println!("skipping: no CUDA device ({reason})");
    None
}

/// A graph with a hub of degree 700 (long rows, so row splitting runs), a ring and chords,
/// split into `parts` interleaved parts; GCN-normalised.
fn chunks(parts: u32) -> Vec<AlignedBuf> {
    let n = 900u32;
    let mut edges: Vec<(u32, u32)> = (0..n).map(|i| (i, (i + 1) % n)).collect();
    // Both directions: row 0 (in-neighbours) and column 0 (out-neighbours) are long.
    edges.extend((1..=700).flat_map(|i| [(0, i), (i, 0)]));
    edges.extend((0..n).step_by(7).map(|i| (i, (i * 31 + 5) % n)));
    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
    let a_hat =
        normalize::adjacency(n as usize, &src, &dst, None, Normalization::Gcn).expect("normalise");
    let graph = Graph::from_edges(n as usize, src, dst);
    let part_of: Vec<u32> = (0..n).map(|i| (i / 3) % parts).collect();
    let partition = Partition::new(parts, part_of, "gpu-test").expect("partition");
    let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition).expect("chunk builder");
    (0..parts)
        .map(|p| encode(&builder.build(p).contents()).expect("encode"))
        .collect()
}

fn views(bufs: &[AlignedBuf]) -> Vec<ChunkView<'_>> {
    bufs.iter()
        .map(|b| ChunkView::parse(b.as_bytes()).expect("parse chunk"))
        .collect()
}

/// Value of global row `g`, column `j` (exact in f32).
fn value(seed: u64, g: usize, j: usize) -> f32 {
    let h = (g as u64 * 1_000_003 + j as u64 * 7919 + seed * 104_729) % 2001;
    h as f32 / 1000.0 - 1.0
}

/// This rank's `n × F` input with leading dimension `ld` (padding NaN).
fn input(views: &[ChunkView<'_>], rank: usize, seed: u64, f: usize, ld: usize) -> Vec<f32> {
    let first = views[0].part_offsets()[rank] as usize;
    let n = views[rank].num_local_nodes();
    let mut m = vec![f32::NAN; n * ld];
    for i in 0..n {
        for j in 0..f {
            m[i * ld + j] = value(seed, first + i, j);
        }
    }
    m
}

/// The CPU operator's results for every rank: per shape, (Y, dX, forward and backward bytes)
/// row-major without padding.
type Reference = Vec<(Vec<f32>, Vec<f32>, Traffic, Traffic)>;

fn cpu_reference(views: &[ChunkView<'_>], kind: ScheduleKind) -> Vec<Reference> {
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], kind).expect("CPU operator");
        let n = op.local_rows();
        SHAPES
            .iter()
            .map(|&(f, _)| {
                let (x, dy) = (input(views, p, 1, f, f), input(views, p, 2, f, f));
                let (mut y, mut dx) = (vec![0f32; n * f], vec![0f32; n * f]);
                fn dense(m: &[f32], n: usize, f: usize) -> DenseView<'_, f32> {
                    DenseView::new(m, n, f, f).expect("view")
                }
                op.forward(
                    dense(&x, n, f),
                    DenseViewMut::new(&mut y[..], n, f, f).expect("view"),
                )
                .expect("CPU forward");
                let fw = op.bytes_last_call();
                op.backward(
                    dense(&dy, n, f),
                    DenseViewMut::new(&mut dx[..], n, f, f).expect("view"),
                )
                .expect("CPU backward");
                (y, dx, fw, op.bytes_last_call())
            })
            .collect()
    })
}

fn assert_close(what: &str, got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (k, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= 1e-5 + 1e-4 * e.abs(),
            "{what}: element {k} is {g}, the CPU operator gives {e}"
        );
    }
}

/// Every check of one rank; `host` and `nccl` span the same ranks.
fn check_rank<H: AllGather + AllReduce>(host: &H, nccl: &NcclComm, views: &[ChunkView<'_>]) {
    let p = host.rank();
    for kind in [ScheduleKind::Halo, ScheduleKind::Broadcast] {
        let reference = &cpu_reference(views, kind)[p];
        let mut op = GpuDistSpmm::new(host, nccl, views[p], kind).expect("GPU operator");
        let dev = op.device().clone();
        let n = op.local_rows();
        for (&(f, pad), (y_ref, dx_ref, fw, bw)) in SHAPES.iter().zip(reference) {
            let ld = f + pad;
            let what = format!("rank {p}, {kind:?}, F = {f}, ld = {ld}");
            let upload = |seed| {
                DeviceDense::from_host_strided(&dev, n, f, ld, &input(views, p, seed, f, ld))
                    .expect("upload")
            };
            let (x, dy) = (upload(1), upload(2));
            // NaN everywhere: the products must overwrite the matrix and leave the padding.
            let nan = vec![f32::NAN; n * ld];
            let fresh = || DeviceDense::from_host_strided(&dev, n, f, ld, &nan).expect("upload");
            let (mut y, mut dx) = (fresh(), fresh());
            op.forward(&x, &mut y).expect("GPU forward");
            assert_eq!(op.bytes_last_call(), *fw, "{what}: forward bytes");
            assert_eq!(op.bytes_last_call(), op.predicted_traffic(f).forward);
            op.backward(&dy, &mut dx).expect("GPU backward");
            assert_eq!(op.bytes_last_call(), *bw, "{what}: backward bytes");
            assert_eq!(op.bytes_last_call(), op.predicted_traffic(f).backward);
            let y_host = y.to_host().expect("download");
            assert_close(&format!("{what}: Y"), &y_host, y_ref);
            assert_close(
                &format!("{what}: dX"),
                &dx.to_host().expect("download"),
                dx_ref,
            );
            let padding_kept = |m: &DeviceDense| {
                let all = m.to_host_strided().expect("download");
                (0..n).all(|i| all[i * ld + f..(i + 1) * ld].iter().all(|v| v.is_nan()))
            };
            assert!(
                padding_kept(&y) && padding_kept(&dx),
                "{what}: padding written"
            );

            // A rerun is bit-identical.
            let mut again = fresh();
            op.forward(&x, &mut again).expect("GPU forward");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&again.to_host().expect("download")),
                bits(&y_host),
                "{what}: rerun differs"
            );

            // The raw path on the NCCL stream (the default stream of raw calls).
            let raw_y = fresh();
            let (xr, yr): (RawDense, RawDense) = (x.raw(), raw_y.raw());
            dev.synchronize().expect("sync");
            // SAFETY: both matrices live on the operator's device until the synchronisation
            // below; `raw_y` is distinct from `x`.
            unsafe { op.forward_raw(xr, yr, None) }.expect("GPU forward (raw)");
            nccl.synchronize().expect("NCCL stream");
            assert_eq!(
                bits(&raw_y.to_host().expect("download")),
                bits(&y_host),
                "{what}: raw path differs"
            );
        }
        let totals = op.bytes_total();
        assert_eq!(totals.forward_calls, 3 * SHAPES.len() as u64);
        assert_eq!(totals.backward_calls, SHAPES.len() as u64);
        check_edges(&mut op, views, kind);
        check_grouped(&mut op, views, kind);
        check_edge_softmax(&op, views, kind);
        println!("rank {p}: {kind:?} matches the CPU operator");
        for precision in [Precision::Bf16, Precision::F16] {
            check_precision(host, nccl, views, kind, precision);
        }
    }
}

/// F of the reduced-precision checks.
const PRECISION_SHAPES: [usize; 2] = [64, 5];

/// The CPU operator in one precision on every rank, per F of [`PRECISION_SHAPES`]:
/// `[Y, dX, A_e·X, A_eᵀ·dY, E]`, the bounds of dX and `A_eᵀ·dY` (`|Â|ᵀ·|dY|` and
/// `|A_e|ᵀ·|dY|`, by the f32 operator), the bytes of the five calls, the per-edge values, and
/// Y of a forward whose input crosses with NaN, +Inf and −Inf in rank 0's first row.
type PrecisionReference = (
    [Vec<f32>; 5],
    [Vec<f32>; 2],
    [Traffic; 5],
    Vec<f32>,
    Vec<f32>,
);

fn precision_reference(
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
    precision: Precision,
    f: usize,
) -> Vec<PrecisionReference> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let q = comm.rank();
        let mut cpu =
            DistSpmm::with_precision(&comm, views[q], kind, precision).expect("CPU operator");
        let mut exact = DistSpmm::new(&comm, views[q], kind).expect("CPU operator");
        let first = offsets[q] as usize;
        let e: Vec<f32> = cpu
            .edges()
            .map(|(r, s)| value(5, first + r, s as usize))
            .collect();
        let m = cpu.local_rows();
        let (x, dy) = (input(views, q, 1, f, f), input(views, q, 2, f, f));
        fn dense(a: &[f32], m: usize, f: usize) -> DenseView<'_, f32> {
            DenseView::new(a, m, f, f).expect("view")
        }
        fn dense_mut(a: &mut [f32], m: usize, f: usize) -> DenseViewMut<'_, f32> {
            DenseViewMut::new(a, m, f, f).expect("view")
        }
        let view = |a| dense(a, m, f);
        let mut out: [Vec<f32>; 5] = std::array::from_fn(|_| vec![0f32; m * f]);
        out[4] = vec![0f32; cpu.edge_count()];
        let mut bytes = [Traffic::default(); 5];
        let [y, dx, ye, dxe, s] = &mut out;
        let mut_view = |a| dense_mut(a, m, f);
        cpu.forward(view(&x), mut_view(y)).expect("CPU forward");
        bytes[0] = cpu.bytes_last_call();
        cpu.backward(view(&dy), mut_view(dx)).expect("CPU backward");
        bytes[1] = cpu.bytes_last_call();
        cpu.spmm_values(&e, view(&x), mut_view(ye))
            .expect("CPU spmm_values");
        bytes[2] = cpu.bytes_last_call();
        cpu.spmm_values_transpose(&e, view(&dy), mut_view(dxe))
            .expect("CPU spmm_values_transpose");
        bytes[3] = cpu.bytes_last_call();
        cpu.sddmm(view(&x), view(&dy), s).expect("CPU sddmm");
        bytes[4] = cpu.bytes_last_call();
        // The bounds: the same products over magnitudes, in f32.
        let abs = |a: &[f32]| a.iter().map(|v| v.abs()).collect::<Vec<_>>();
        let (dy_abs, e_abs) = (abs(&dy), abs(&e));
        let mut bounds: [Vec<f32>; 2] = std::array::from_fn(|_| vec![0f32; m * f]);
        let [b_dx, b_dxe] = &mut bounds;
        exact
            .backward(view(&dy_abs), mut_view(b_dx))
            .expect("CPU backward");
        exact
            .spmm_values_transpose(&e_abs, view(&dy_abs), mut_view(b_dxe))
            .expect("CPU spmm_values_transpose");
        let mut poisoned = x.clone();
        if q == 0 {
            poisoned[..3].copy_from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        }
        let mut y_poisoned = vec![0f32; m * f];
        cpu.forward(view(&poisoned), mut_view(&mut y_poisoned))
            .expect("CPU forward");
        (out, bounds, bytes, e, y_poisoned)
    })
}

/// `got` against the CPU operator's `expected` within `1e-5 + 1e-4·|e| + extra[k]`; a
/// non-finite expected value must be matched by the same class (NaN, or the same infinity).
fn assert_within(what: &str, got: &[f32], expected: &[f32], extra: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (k, (g, e)) in got.iter().zip(expected).enumerate() {
        let ok = if e.is_nan() {
            g.is_nan()
        } else if e.is_infinite() {
            g == e
        } else {
            (g - e).abs() <= 1e-5 + 1e-4 * e.abs() + extra(k)
        };
        assert!(
            ok,
            "{what}: element {k} is {g}, the CPU operator gives {e} (allowed extra {})",
            extra(k)
        );
    }
}

/// The operator in `precision` against the CPU operator in the same precision, F = 64 and 5.
///
/// Tolerance: both narrow the same `f32` values with the same conversion (bit for bit, see
/// `conversion_kernels_are_the_cpu_conversions`), so where rows of X cross ranks (forward,
/// `spmm_values`, `sddmm`) the operands are the same bits and the results differ only by the
/// order of the `f32` sums: the f32 tolerance, `1e-5 + 1e-4·|e|`. Where partial sums cross
/// (backward, `spmm_values_transpose`) the sender's `f32` partial sum differs by its order of
/// summation and may round to the neighbouring 16-bit value: `2u·(|A|ᵀ·|dY|)_i` more per entry
/// (one 16-bit step of a partial sum bounded by its magnitudes, `u` the format's unit
/// roundoff). Bytes: the CPU operator's count and the plan's in the precision. A forward whose
/// crossing input holds NaN, +Inf and −Inf gives the CPU's NaN and infinities.
fn check_precision<H: AllGather + AllReduce>(
    host: &H,
    nccl: &NcclComm,
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
    precision: Precision,
) {
    let p = host.rank();
    let mut op =
        GpuDistSpmm::with_precision(host, nccl, views[p], kind, precision).expect("GPU operator");
    assert_eq!(op.precision(), precision);
    let dev = op.device().clone();
    let (n, nnz) = (op.local_rows(), op.edge_count());
    let two_u = 2.0 * precision.unit_roundoff() as f32;
    for f in PRECISION_SHAPES {
        let what = format!("rank {p}, {kind:?}, {precision}, F = {f}");
        let (want, bounds, bytes, e_host, y_poisoned) =
            &precision_reference(views, kind, precision, f)[p];
        let upload = |m: &[f32]| DeviceDense::from_host(&dev, n, f, m).expect("upload");
        let (x, dy) = (
            upload(&input(views, p, 1, f, f)),
            upload(&input(views, p, 2, f, f)),
        );
        let e = DeviceDense::from_host(&dev, nnz, 1, e_host).expect("upload");
        let fresh = || DeviceDense::from_host(&dev, n, f, &vec![f32::NAN; n * f]).expect("upload");
        let (mut y, mut dx, mut ye, mut dxe) = (fresh(), fresh(), fresh(), fresh());
        let mut s = DeviceDense::from_host(&dev, nnz, 1, &vec![f32::NAN; nnz]).expect("upload");
        let mut counted = [Traffic::default(); 5];
        op.forward(&x, &mut y).expect("GPU forward");
        counted[0] = op.bytes_last_call();
        op.backward(&dy, &mut dx).expect("GPU backward");
        counted[1] = op.bytes_last_call();
        op.spmm_values(&e, &x, &mut ye).expect("GPU spmm_values");
        counted[2] = op.bytes_last_call();
        op.spmm_values_transpose(&e, &dy, &mut dxe)
            .expect("GPU spmm_values_transpose");
        counted[3] = op.bytes_last_call();
        op.sddmm(&x, &dy, &mut s).expect("GPU sddmm");
        counted[4] = op.bytes_last_call();
        assert_eq!(&counted, bytes, "{what}: bytes");
        let plan = op.predicted_traffic(f);
        assert_eq!((counted[0], counted[1]), (plan.forward, plan.backward));
        let host_of = |m: &DeviceDense| m.to_host().expect("download");
        let none = |_| 0.0;
        assert_within(&format!("{what}: Y"), &host_of(&y), &want[0], none);
        let b = |bound: &[f32]| {
            let bound = bound.to_vec();
            move |k: usize| two_u * bound[k]
        };
        assert_within(
            &format!("{what}: dX"),
            &host_of(&dx),
            &want[1],
            b(&bounds[0]),
        );
        assert_within(&format!("{what}: A_e·X"), &host_of(&ye), &want[2], none);
        assert_within(
            &format!("{what}: A_eᵀ·dY"),
            &host_of(&dxe),
            &want[3],
            b(&bounds[1]),
        );
        assert_within(&format!("{what}: E"), &host_of(&s), &want[4], none);
        let mut poisoned = input(views, p, 1, f, f);
        if p == 0 {
            poisoned[..3].copy_from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        }
        let xp = upload(&poisoned);
        op.forward(&xp, &mut y).expect("GPU forward");
        let y_host = host_of(&y);
        assert_within(&format!("{what}: poisoned Y"), &y_host, y_poisoned, none);
        if views.len() > 1 && p == 1 && kind == ScheduleKind::Halo {
            // Rank 0's first row crosses to rank 1, so its NaN and infinities arrive.
            assert!(y_host.iter().any(|v| v.is_nan()), "{what}: no NaN arrived");
        }
    }
    println!("rank {p}: {kind:?} in {precision} matches the CPU operator");
}

/// Bit patterns of f32 the conversions must agree on: every upper half with lower halves at
/// the rounding boundaries and ties of both formats (bf16: bit 16; f16: bit 13 for normals,
/// higher bits below its normals), so every exponent, sign, NaN payload, Inf and subnormal
/// is met, plus a stride through all 2³² patterns.
fn f32_patterns() -> Vec<u32> {
    let lows: [u32; 14] = [
        0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x4000, 0x6000, 0x7FFF, 0x8000,
        0x8001, 0xC000, 0xFFFF,
    ];
    let mut all: Vec<u32> = (0..=0xFFFFu32)
        .flat_map(|hi| lows.iter().map(move |lo| hi << 16 | lo))
        .collect();
    all.extend((0..=u32::MAX / 4093).map(|k| k * 4093));
    all
}

/// distspmm-cuda's `dsp_narrow` / `dsp_widen` against distspmm-sparse's conversions (the CPU
/// operator's), bit for bit: every 16-bit pattern widened, the patterns of [`f32_patterns`]
/// narrowed, both formats.
fn check_conversions(dev: &GpuDevice) {
    let patterns = f32_patterns();
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    for (fmt, kernel_fmt) in [(Half::Bf16, HalfFormat::Bf16), (Half::F16, HalfFormat::F16)] {
        // Narrowing: f32 in, 16-bit values out (two per f32 word of the output).
        let values: Vec<f32> = patterns.iter().map(|&b| f32::from_bits(b)).collect();
        let mut want = vec![0u16; values.len()];
        narrow(fmt, &values, &mut want).expect("CPU narrow");
        let x = DeviceDense::from_host(dev, 1, values.len(), &values).expect("upload");
        let out = DeviceDense::zeros(dev, 1, values.len().div_ceil(2)).expect("allocate");
        // SAFETY: `x` holds the values and `out` room for as many 16-bit values, separate
        // live allocations of `dev`, kept until the download below waits for the stream.
        unsafe { dev.narrow_raw(kernel_fmt, x.raw().ptr, out.raw().ptr, values.len(), None) }
            .expect("narrow on the device");
        let got: Vec<u16> = out
            .to_host()
            .expect("download")
            .iter()
            .flat_map(|w| {
                let b = w.to_bits();
                [(b & 0xFFFF) as u16, (b >> 16) as u16]
            })
            .take(values.len())
            .collect();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "{fmt:?}: {:#010x} narrows to {g:#06x} on the device, {w:#06x} on the CPU",
                patterns[k]
            );
        }
        // Widening: all 65 536 patterns, packed two per f32 word.
        let mut wide = vec![0f32; halves.len()];
        widen(fmt, &halves, &mut wide).expect("CPU widen");
        let packed: Vec<f32> = halves
            .chunks(2)
            .map(|c| f32::from_bits(u32::from(c[0]) | u32::from(c[1]) << 16))
            .collect();
        let h = DeviceDense::from_host(dev, 1, packed.len(), &packed).expect("upload");
        let out = DeviceDense::zeros(dev, 1, halves.len()).expect("allocate");
        // SAFETY: as above.
        unsafe { dev.widen_raw(kernel_fmt, h.raw().ptr, out.raw().ptr, halves.len(), None) }
            .expect("widen on the device");
        for (k, (g, w)) in out
            .to_host()
            .expect("download")
            .iter()
            .zip(&wide)
            .enumerate()
        {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{fmt:?}: {k:#06x} widens to {:#010x} on the device, {:#010x} on the CPU",
                g.to_bits(),
                w.to_bits()
            );
        }
    }
}

#[test]
fn conversion_kernels_are_the_cpu_conversions() {
    if std::env::var_os(CHILD).is_some() || devices().is_none() {
        return;
    }
    let dev = GpuDevice::open(0).expect("device");
    check_conversions(&dev);
}

/// The per-edge calls of one rank against the CPU operator's, F = 1, 2, 7, 33, 64 (F = 0
/// for the SDDMM: zeros); bytes as the plan's; a rerun bit-identical.
fn check_edges<H: AllGather + AllReduce>(
    op: &mut GpuDistSpmm<&H, &NcclComm, ChunkView<'_>>,
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
) {
    let p = op.rank();
    let offsets = views[0].part_offsets();
    let nnz = op.edge_count();
    let dev = op.device().clone();
    let n = op.local_rows();
    let column = |v: &[f32]| DeviceDense::from_host(&dev, nnz, 1, v).expect("upload");
    for f in [1usize, 2, 7, 33, 64] {
        let what = format!("rank {p}, {kind:?}, F = {f}");
        let reference = LocalComm::run(views.len(), |comm| {
            let q = comm.rank();
            let mut cpu = DistSpmm::new(&comm, views[q], kind).expect("CPU operator");
            let first = offsets[q] as usize;
            // The per-edge values by the edge's global ends.
            let per_edge = |seed| -> Vec<f32> {
                cpu.edges()
                    .map(|(r, s)| value(seed, first + r, s as usize))
                    .collect()
            };
            let (e, de) = (per_edge(5), per_edge(6));
            let m = cpu.local_rows();
            let (x, u) = (input(views, q, 1, f, f), input(views, q, 3, f, f));
            fn view(a: &[f32], m: usize, f: usize) -> DenseView<'_, f32> {
                DenseView::new(a, m, f, f).expect("view")
            }
            let z = || vec![0f32; m * f];
            let (mut y, mut dx, mut du, mut dv) = (z(), z(), z(), z());
            let mut s = vec![0f32; cpu.edge_count()];
            cpu.spmm_values(
                &e,
                view(&x, m, f),
                DenseViewMut::new(&mut y[..], m, f, f).expect("view"),
            )
            .expect("CPU spmm_values");
            let b0 = cpu.bytes_last_call();
            cpu.spmm_values_transpose(
                &e,
                view(&x, m, f),
                DenseViewMut::new(&mut dx[..], m, f, f).expect("view"),
            )
            .expect("CPU spmm_values_transpose");
            cpu.sddmm(view(&u, m, f), view(&x, m, f), &mut s)
                .expect("CPU sddmm");
            let b2 = cpu.bytes_last_call();
            cpu.sddmm_backward(
                &de,
                view(&u, m, f),
                view(&x, m, f),
                DenseViewMut::new(&mut du[..], m, f, f).expect("view"),
                DenseViewMut::new(&mut dv[..], m, f, f).expect("view"),
            )
            .expect("CPU sddmm_backward");
            let b3 = cpu.bytes_last_call();
            (y, dx, s, du, dv, [b0, b2, b3], (e, de))
        });
        let (y_ref, dx_ref, s_ref, du_ref, dv_ref, bytes, (e_host, de_host)) = &reference[p];
        assert_eq!(e_host.len(), nnz);
        let (e, de) = (column(e_host), column(de_host));
        let upload = |seed| DeviceDense::from_host(&dev, n, f, &input(views, p, seed, f, f));
        let (x, u) = (upload(1).expect("upload"), upload(3).expect("upload"));
        let fresh = || DeviceDense::from_host(&dev, n, f, &vec![f32::NAN; n * f]).expect("upload");
        let (mut y, mut dx, mut du, mut dv) = (fresh(), fresh(), fresh(), fresh());
        let mut s = column(&vec![f32::NAN; nnz]);
        op.spmm_values(&e, &x, &mut y).expect("GPU spmm_values");
        assert_eq!(op.bytes_last_call(), bytes[0], "{what}: spmm_values bytes");
        op.spmm_values_transpose(&e, &x, &mut dx)
            .expect("GPU spmm_values_transpose");
        op.sddmm(&u, &x, &mut s).expect("GPU sddmm");
        assert_eq!(op.bytes_last_call(), bytes[1], "{what}: sddmm bytes");
        op.sddmm_backward(&de, &u, &x, &mut du, &mut dv)
            .expect("GPU sddmm_backward");
        assert_eq!(
            op.bytes_last_call(),
            bytes[2],
            "{what}: sddmm_backward bytes"
        );
        let host = |m: &DeviceDense| m.to_host().expect("download");
        assert_close(&format!("{what}: A_e·X"), &host(&y), y_ref);
        assert_close(&format!("{what}: A_eᵀ·X"), &host(&dx), dx_ref);
        assert_close(&format!("{what}: E"), &host(&s), s_ref);
        assert_close(&format!("{what}: dU"), &host(&du), du_ref);
        assert_close(&format!("{what}: dV"), &host(&dv), dv_ref);
        let mut again = column(&vec![f32::NAN; nnz]);
        op.sddmm(&u, &x, &mut again).expect("GPU sddmm");
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(host(&again)),
            bits(host(&s)),
            "{what}: SDDMM rerun differs"
        );
    }
    // F = 0: every value of E is 0.
    let none = DeviceDense::zeros(&dev, n, 0).expect("upload");
    let mut s = column(&vec![f32::NAN; nnz]);
    op.sddmm(&none, &none, &mut s).expect("GPU sddmm, F = 0");
    assert!(s.to_host().expect("download").iter().all(|&v| v == 0.0));
    println!("rank {p}: {kind:?} per-edge calls match the CPU operator");
}

/// The CPU operator's grouped calls on every rank for `groups` groups of `c` columns:
/// (A_e·X, A_eᵀ·X, E, dU, dV, bytes of the four calls, (e, dE)) per rank.
type GroupedReference = (
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    [Traffic; 4],
    (Vec<f32>, Vec<f32>),
);

fn grouped_reference(
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
    groups: usize,
    f: usize,
) -> Vec<GroupedReference> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let q = comm.rank();
        let mut cpu = DistSpmm::new(&comm, views[q], kind).expect("CPU operator");
        let first = offsets[q] as usize;
        // Group g's value of an edge by its global ends (head-major runs).
        let per_edge = |seed: u64| -> Vec<f32> {
            (0..groups as u64)
                .flat_map(|g| {
                    cpu.edges()
                        .map(move |(r, s)| value(seed + 10 * g, first + r, s as usize))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let (e, de) = (per_edge(5), per_edge(6));
        let m = cpu.local_rows();
        let (x, u) = (input(views, q, 1, f, f), input(views, q, 3, f, f));
        fn dense(a: &[f32], m: usize, f: usize) -> DenseView<'_, f32> {
            DenseView::new(a, m, f, f).expect("view")
        }
        let dv = |a| dense(a, m, f);
        let z = || vec![0f32; m * f];
        let (mut y, mut dx, mut du, mut dvv) = (z(), z(), z(), z());
        let mut s = vec![0f32; groups * cpu.edge_count()];
        let mut bytes = [Traffic::default(); 4];
        cpu.spmm_values_grouped(
            groups,
            &e,
            dv(&x),
            DenseViewMut::new(&mut y[..], m, f, f).expect("view"),
        )
        .expect("CPU spmm_values_grouped");
        bytes[0] = cpu.bytes_last_call();
        cpu.spmm_values_transpose_grouped(
            groups,
            &e,
            dv(&x),
            DenseViewMut::new(&mut dx[..], m, f, f).expect("view"),
        )
        .expect("CPU spmm_values_transpose_grouped");
        bytes[1] = cpu.bytes_last_call();
        cpu.sddmm_grouped(groups, dv(&u), dv(&x), &mut s)
            .expect("CPU sddmm_grouped");
        bytes[2] = cpu.bytes_last_call();
        cpu.sddmm_backward_grouped(
            groups,
            &de,
            dv(&u),
            dv(&x),
            DenseViewMut::new(&mut du[..], m, f, f).expect("view"),
            DenseViewMut::new(&mut dvv[..], m, f, f).expect("view"),
        )
        .expect("CPU sddmm_backward_grouped");
        bytes[3] = cpu.bytes_last_call();
        (y, dx, s, du, dvv, bytes, (e, de))
    })
}

/// The grouped per-edge calls of one rank against the CPU operator's: 3 groups of 1, 5 and
/// 16 columns (one pass, one exchange of all F columns: the bytes of F), then 1 group, bit for
/// bit the single calls.
fn check_grouped<H: AllGather + AllReduce>(
    op: &mut GpuDistSpmm<&H, &NcclComm, ChunkView<'_>>,
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
) {
    let p = op.rank();
    let nnz = op.edge_count();
    let dev = op.device().clone();
    let n = op.local_rows();
    let column = |v: &[f32]| DeviceDense::from_host(&dev, v.len(), 1, v).expect("upload");
    let host = |m: &DeviceDense| m.to_host().expect("download");
    for (groups, c) in [(3usize, 1usize), (3, 5), (3, 16), (1, 7)] {
        let f = groups * c;
        let what = format!("rank {p}, {kind:?}, {groups} groups of {c} columns");
        let (y_ref, dx_ref, s_ref, du_ref, dv_ref, bytes, (e_host, de_host)) =
            &grouped_reference(views, kind, groups, f)[p];
        assert_eq!(e_host.len(), groups * nnz);
        let (e, de) = (column(e_host), column(de_host));
        let upload = |seed| DeviceDense::from_host(&dev, n, f, &input(views, p, seed, f, f));
        let (x, u) = (upload(1).expect("upload"), upload(3).expect("upload"));
        let fresh = || DeviceDense::from_host(&dev, n, f, &vec![f32::NAN; n * f]).expect("upload");
        let (mut y, mut dx, mut du, mut dv) = (fresh(), fresh(), fresh(), fresh());
        let mut s = column(&vec![f32::NAN; groups * nnz]);
        op.spmm_values_grouped(groups, &e, &x, &mut y)
            .expect("GPU spmm_values_grouped");
        assert_eq!(op.bytes_last_call(), bytes[0], "{what}: spmm bytes");
        assert_eq!(op.bytes_last_call(), op.predicted_traffic(f).forward);
        op.spmm_values_transpose_grouped(groups, &e, &x, &mut dx)
            .expect("GPU spmm_values_transpose_grouped");
        assert_eq!(op.bytes_last_call(), bytes[1], "{what}: transposed bytes");
        op.sddmm_grouped(groups, &u, &x, &mut s)
            .expect("GPU sddmm_grouped");
        assert_eq!(op.bytes_last_call(), bytes[2], "{what}: sddmm bytes");
        op.sddmm_backward_grouped(groups, &de, &u, &x, &mut du, &mut dv)
            .expect("GPU sddmm_backward_grouped");
        assert_eq!(
            op.bytes_last_call(),
            bytes[3],
            "{what}: sddmm_backward bytes"
        );
        assert_close(&format!("{what}: A_e·X"), &host(&y), y_ref);
        assert_close(&format!("{what}: A_eᵀ·X"), &host(&dx), dx_ref);
        assert_close(&format!("{what}: E"), &host(&s), s_ref);
        assert_close(&format!("{what}: dU"), &host(&du), du_ref);
        assert_close(&format!("{what}: dV"), &host(&dv), dv_ref);
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if groups == 1 {
            let (mut y1, mut s1) = (fresh(), column(&vec![f32::NAN; nnz]));
            op.spmm_values(&e, &x, &mut y1).expect("GPU spmm_values");
            op.sddmm(&u, &x, &mut s1).expect("GPU sddmm");
            assert_eq!(bits(host(&y1)), bits(host(&y)), "{what}: one group differs");
            assert_eq!(bits(host(&s1)), bits(host(&s)), "{what}: one group differs");
        }
        // A wrong run length is this rank's shape error (every rank calls it alike here).
        let short = column(&vec![0.0; nnz.max(1) * groups + 1]);
        let err = op.spmm_values_grouped(groups, &short, &x, &mut y);
        assert!(
            matches!(err, Err(distspmm_op::DistSpmmError::Shape(_))),
            "{what}: {err:?}"
        );
    }
    // F = 0: every value of every group is 0.
    let none = DeviceDense::zeros(&dev, n, 0).expect("upload");
    let mut s = column(&vec![f32::NAN; 2 * nnz]);
    op.sddmm_grouped(2, &none, &none, &mut s)
        .expect("GPU sddmm_grouped, F = 0");
    assert!(host(&s).iter().all(|&v| v == 0.0));
    println!("rank {p}: {kind:?} grouped calls match the CPU operator");
}

/// The edge softmax of one rank against the CPU operator's: plain and after a LeakyReLU of
/// slope 0.2, forward and backward (local calls: no other rank takes part).
fn check_edge_softmax<H: AllGather + AllReduce>(
    op: &GpuDistSpmm<&H, &NcclComm, ChunkView<'_>>,
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
) {
    let p = op.rank();
    let nnz = op.edge_count();
    let dev = op.device().clone();
    // Building the CPU operator is collective: the reference runs every rank's.
    let reference = LocalComm::run(views.len(), |comm| {
        let q = comm.rank();
        let cpu = DistSpmm::new(&comm, views[q], kind).expect("CPU operator");
        let off = views[0].part_offsets()[q] as usize;
        let per_edge = |seed| -> Vec<f32> {
            cpu.edges()
                .map(|(r, s)| 4.0 * value(seed, off + r, s as usize))
                .collect()
        };
        let (z, d_out) = (per_edge(7), per_edge(8));
        let m = cpu.edge_count();
        let (mut a, mut b, mut da, mut db) =
            (vec![0f32; m], vec![0f32; m], vec![0f32; m], vec![0f32; m]);
        cpu.edge_softmax(&z, &mut a).expect("CPU edge_softmax");
        cpu.leaky_relu_edge_softmax(0.2, &z, &mut b)
            .expect("CPU leaky_relu_edge_softmax");
        cpu.edge_softmax_backward(&a, &d_out, &mut da)
            .expect("CPU edge_softmax_backward");
        cpu.leaky_relu_edge_softmax_backward(0.2, &z, &b, &d_out, &mut db)
            .expect("CPU leaky_relu_edge_softmax_backward");
        (z, d_out, a, b, da, db)
    });
    let (z_host, d_host, a_ref, b_ref, da_ref, db_ref) = &reference[p];
    let column = |v: &[f32]| DeviceDense::from_host(&dev, nnz, 1, v).expect("upload");
    let host = |m: &DeviceDense| m.to_host().expect("download");
    let (z, d_out) = (column(z_host), column(d_host));
    let nan = vec![f32::NAN; nnz];
    let (mut a, mut b, mut da, mut db) = (column(&nan), column(&nan), column(&nan), column(&nan));
    op.edge_softmax(&z, &mut a).expect("GPU edge_softmax");
    op.leaky_relu_edge_softmax(0.2, &z, &mut b)
        .expect("GPU leaky_relu_edge_softmax");
    op.edge_softmax_backward(&a, &d_out, &mut da)
        .expect("GPU edge_softmax_backward");
    op.leaky_relu_edge_softmax_backward(0.2, &z, &b, &d_out, &mut db)
        .expect("GPU leaky_relu_edge_softmax_backward");
    let what = format!("rank {p}, {kind:?}");
    assert_close(&format!("{what}: softmax"), &host(&a), a_ref);
    assert_close(&format!("{what}: LeakyReLU softmax"), &host(&b), b_ref);
    assert_close(&format!("{what}: softmax backward"), &host(&da), da_ref);
    assert_close(
        &format!("{what}: LeakyReLU softmax backward"),
        &host(&db),
        db_ref,
    );
    let mut wrong = DeviceDense::from_host(&dev, nnz + 1, 1, &vec![0.0; nnz + 1]).expect("upload");
    let err = op.edge_softmax(&z, &mut wrong);
    assert!(
        matches!(err, Err(distspmm_op::DistSpmmError::Shape(_))),
        "{what}: {err:?}"
    );
    println!("rank {p}: {kind:?} edge softmax matches the CPU operator");
}

#[test]
fn gpu_operator_matches_cpu_operator_at_one_rank() {
    if std::env::var_os(CHILD).is_some() || devices().is_none() {
        return;
    }
    let bufs = chunks(1);
    let views = views(&bufs);
    let done = LocalComm::run(1, |comm| {
        let nccl = NcclComm::new(&comm, DeviceSelect::Ordinal(0)).expect("NCCL communicator");
        check_rank(&comm, &nccl, &views);
    });
    assert_eq!(done.len(), 1);
}

/// The body of a spawned rank.
fn child(spec: &str) {
    let mut it = spec.split(',');
    let mut next = || it.next().expect("RANK,SIZE,ID");
    let rank: usize = next().parse().expect("rank");
    let size: usize = next().parse().expect("size");
    let hex = next();
    let mut bytes = [0u8; NcclUniqueId::BYTES];
    for (k, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).expect("hex id");
    }
    let count = GpuDevice::count().expect("device count");
    let nccl = NcclComm::from_unique_id(&NcclUniqueId::from_bytes(bytes), rank, size, rank % count)
        .expect("join the NCCL communicator");
    let host = NcclHost::new(&nccl);
    let bufs = chunks(size as u32);
    check_rank(&host, &nccl, &views(&bufs));
    println!("rank {rank} of {size}: all checks passed");
}

#[test]
fn gpu_operator_matches_cpu_operator_at_two_spawned_ranks() {
    if let Some(spec) = std::env::var_os(CHILD) {
        child(spec.to_str().expect("ASCII spec"));
        return;
    }
    let Some(count) = devices() else { return };
    let size = 2;
    let id = NcclUniqueId::new().expect("NCCL unique id");
    let hex: String = id.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().expect("test executable");
    let logs = tempfile::tempdir().expect("temporary directory");
    let log = |rank: usize, stream: &str| logs.path().join(format!("rank{rank}.{stream}"));
    let children: Vec<_> = (0..size)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--exact",
                "gpu_operator_matches_cpu_operator_at_two_spawned_ranks",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, format!("{rank},{size},{hex}"))
            .stdin(Stdio::null())
            .stdout(File::create(log(rank, "out")).expect("log file"))
            .stderr(File::create(log(rank, "err")).expect("log file"));
            if count < size {
                cmd.env("NCCL_HOSTID", format!("gpu-spmm-test-rank-{rank}"));
            }
            cmd.spawn().expect("spawn a rank")
        })
        .collect();
    let start = Instant::now();
    let statuses: Vec<_> = children
        .into_iter()
        .map(|mut c| {
            let status = test_support::wait_until(&mut c, TIMEOUT.saturating_sub(start.elapsed()));
            if status.is_none() {
                test_support::kill_group(&mut c);
            }
            status
        })
        .collect();
    for (rank, status) in statuses.iter().enumerate() {
        let read = |stream| std::fs::read_to_string(log(rank, stream)).unwrap_or_default();
        let (out, err) = (read("out"), read("err"));
        print!("{out}");
        assert!(
            status.is_some_and(|s| s.success())
                && out.contains(&format!("rank {rank} of {size}: all checks passed")),
            "rank {rank} failed or hung ({status:?}); stdout:\n{out}\nstderr:\n{err}"
        );
    }
}

/// The fixture exercises what the GPU checks are meant to cover (runs without a GPU): at
/// P = 2 every rank sends and receives halo rows, the CPU reference runs, and rank 0's local
/// block has a row long enough for distspmm-cuda's row splitting.
#[test]
fn fixture_exchanges_halos_and_has_long_rows() {
    let bufs = chunks(2);
    let views = views(&bufs);
    for v in &views {
        let plan = distspmm_op::schedule::HaloPlan::from_chunk(v);
        assert!(plan.sent_rows() > 0 && plan.halo_rows() > 0);
    }
    let d = views[0].diagonal_block();
    let n = views[0].num_local_nodes();
    let piece = distspmm_cuda::RowSplitPlan::default_piece_nnz(n, d.csr_cols.len() as u64);
    let longest = d.csr_rowptr.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    // The CPU reference the GPU checks compare with runs, and moves the plan's bytes.
    for kind in [ScheduleKind::Halo, ScheduleKind::Broadcast] {
        for (v, rank) in views.iter().zip(cpu_reference(&views, kind)) {
            let plan = match kind {
                ScheduleKind::Halo => distspmm_op::schedule::HaloPlan::from_chunk(v).traffic(64),
                ScheduleKind::Broadcast => {
                    distspmm_op::schedule::BroadcastPlan::from_chunk(v).traffic(64)
                }
            };
            assert_eq!((rank[0].2, rank[0].3), (plan.forward, plan.backward));
        }
    }
    assert!(
        longest > piece,
        "longest row {longest} ≤ piece {piece}: no splitting"
    );
}
