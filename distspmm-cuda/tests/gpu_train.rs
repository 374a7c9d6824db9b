//! The edge softmax and the training kernels against plain-loop CPU references: the edge
//! softmax as distspmm-op's CPU operator defines it, the training steps as the CPU trainer
//! (distspmm-gcn) does them — the dropout masks and the Adam step bit for bit. Tests that need
//! a GPU skip as in `gpu.rs` (and fail under `DISTSPMM_REQUIRE_GPU`).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    reason = "small test matrices: every narrowing is exact"
)]

use std::ops::Range;

use distspmm_cuda::{
    activation_backward, adam_step, bias_activation, bias_activation_in_place, column_sums,
    dropout, dropout_in_place, edge_softmax, edge_softmax_backward, nll_loss, Activation, AdamStep,
    CudaError, DeviceDense, DeviceIds, DeviceLabels, DropoutKey, EdgeBlock, EdgeRows, GpuDevice,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::device;

fn random(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn column(dev: &GpuDevice, v: &[f32]) -> DeviceDense {
    DeviceDense::from_host(dev, v.len(), 1, v).unwrap()
}

/// `got` agrees with `want` within `abs + rel·|want|`, NaN only where `want` is NaN.
fn assert_near(what: &str, got: &[f32], want: &[f64], abs: f64, rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: entry {i} is {g}, expected NaN");
            continue;
        }
        let tol = abs + rel * w.abs();
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}: entry {i} is {g}, expected {w} (tolerance {tol})"
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// [`bits`] with every NaN as one value: the device's arithmetic returns its canonical NaN where
/// the CPU's keeps the input's payload.
fn bits_any_nan(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Edge softmax

/// A per-edge layout of several blocks: row pointers per block and where each block starts.
struct Layout {
    rows: usize,
    firsts: Vec<usize>,
    rowptrs: Vec<Vec<u64>>,
}

impl Layout {
    /// `count(b, r)` entries of row `r` in block `b`, blocks one after another.
    fn new(rows: usize, blocks: usize, count: impl Fn(usize, usize) -> usize) -> Layout {
        let (mut firsts, mut rowptrs, mut at) = (Vec::new(), Vec::new(), 0usize);
        for b in 0..blocks {
            let mut ptr = vec![0u64];
            for r in 0..rows {
                ptr.push(ptr[r] + count(b, r) as u64);
            }
            firsts.push(at);
            at += *ptr.last().unwrap() as usize;
            rowptrs.push(ptr);
        }
        Layout {
            rows,
            firsts,
            rowptrs,
        }
    }

    fn edges(&self) -> usize {
        self.firsts.last().unwrap() + *self.rowptrs.last().unwrap().last().unwrap() as usize
    }

    fn device(&self, dev: &GpuDevice) -> EdgeRows {
        let blocks: Vec<EdgeBlock<'_>> = self
            .firsts
            .iter()
            .zip(&self.rowptrs)
            .map(|(&first, rowptr)| EdgeBlock { first, rowptr })
            .collect();
        EdgeRows::new(dev, self.rows, &blocks).unwrap()
    }

    /// Positions of row `r`'s entries in layout order.
    fn row(&self, r: usize) -> Vec<usize> {
        self.firsts
            .iter()
            .zip(&self.rowptrs)
            .flat_map(|(&f, p)| f + p[r] as usize..f + p[r + 1] as usize)
            .collect()
    }
}

fn leaky(slope: Option<f32>, z: f32) -> f64 {
    match slope {
        Some(s) if z <= 0.0 => f64::from(s) * f64::from(z),
        _ => f64::from(z),
    }
}

/// The CPU operator's edge softmax in f64; NaN over rows with a non-finite activated logit,
/// `fill` where no row has the entry.
fn softmax_reference(l: &Layout, slope: Option<f32>, z: &[f32], fill: f64) -> Vec<f64> {
    let mut out = vec![fill; z.len()];
    for r in 0..l.rows {
        let at = l.row(r);
        let a: Vec<f64> = at
            .iter()
            .map(|&k| leaky(slope, z[k]) as f32 as f64)
            .collect();
        if a.iter().any(|v| !v.is_finite()) {
            at.iter().for_each(|&k| out[k] = f64::NAN);
            continue;
        }
        let max = a.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = a.iter().map(|v| (v - max).exp()).sum();
        for (&k, v) in at.iter().zip(&a) {
            out[k] = (v - max).exp() / sum;
        }
    }
    out
}

/// The CPU operator's backward in f64 from the given `out`.
fn softmax_backward_reference(
    l: &Layout,
    slope: Option<f32>,
    z: &[f32],
    out: &[f32],
    d_out: &[f32],
    fill: f64,
) -> Vec<f64> {
    let mut d = vec![fill; out.len()];
    for r in 0..l.rows {
        let at = l.row(r);
        let dot: f64 = at
            .iter()
            .map(|&k| f64::from(out[k]) * f64::from(d_out[k]))
            .sum();
        for &k in &at {
            let g = match slope {
                Some(s) if z[k] <= 0.0 => f64::from(s),
                _ => 1.0,
            };
            d[k] = f64::from(out[k]) * (f64::from(d_out[k]) - dot) * g;
        }
    }
    d
}

/// 41 rows over four blocks (the last empty): rows without entries (0, 20), with one (1),
/// long rows across blocks (5: 153 entries in three blocks, 6: 34 in two), rows with a NaN
/// (7), +∞ (8) and −∞ (9) logit, and a row of large logits (11) that overflow exp without the
/// max subtraction.
fn softmax_case() -> (Layout, Vec<f32>) {
    let l = Layout::new(41, 4, |b, r| match (b, r) {
        (3, _) | (_, 0 | 20) => 0,
        (0, 1) => 1,
        (_, 1) => 0,
        (1, 5) => 150,
        (1, 6) => 33,
        (0, r) => r % 3,
        (1, r) => (r * 7) % 5,
        (_, r) => usize::from(r % 4 == 0) * 40 + usize::from(r == 5 || r == 6),
    });
    let mut z = random(l.edges(), -4.0, 4.0, 7);
    let row = |r| l.row(r);
    z[row(7)[1]] = f32::NAN;
    z[row(8)[0]] = f32::INFINITY;
    z[*row(9).last().unwrap()] = f32::NEG_INFINITY;
    for (i, k) in row(11).into_iter().enumerate() {
        z[k] = 100.0 + i as f32;
    }
    (l, z)
}

#[test]
fn edge_softmax_layout_has_the_rows_it_claims() {
    let (l, z) = softmax_case();
    assert_eq!(l.row(0).len() + l.row(20).len(), 0);
    assert_eq!(l.row(1).len(), 1);
    assert!(l.row(5).len() > 64 && l.row(6).len() > 32);
    for r in [7, 8, 9, 11] {
        assert!(l.row(r).len() >= 2, "row {r}");
    }
    assert!(z.iter().filter(|v| !v.is_finite()).count() == 3);
    // Every entry belongs to exactly one row.
    let mut seen = vec![0u8; l.edges()];
    (0..l.rows)
        .flat_map(|r| l.row(r))
        .for_each(|k| seen[k] += 1);
    assert!(seen.iter().all(|&c| c == 1));
}

#[test]
fn edge_softmax_matches_the_cpu_definition() {
    let Some(dev) = device() else { return };
    let (l, z) = softmax_case();
    let rows = l.device(&dev);
    assert_eq!(rows.edge_count(), l.edges());
    let e = l.edges();
    let logits = column(&dev, &z);
    let d_out_host = random(e, -1.0, 1.0, 8);
    let d_out = column(&dev, &d_out_host);
    for slope in [None, Some(0.2f32)] {
        let mut out = column(&dev, &vec![-5.0; e]);
        edge_softmax(&rows, slope, &logits, &mut out).unwrap();
        let got = out.to_host().unwrap();
        // Every entry belongs to a row, so nothing keeps the fill.
        let want = softmax_reference(&l, slope, &z, -5.0);
        assert_near(
            &format!("forward, slope {slope:?}"),
            &got,
            &want,
            1e-7,
            2e-6,
        );
        for r in (0..l.rows).filter(|&r| ![7, 8, 9].contains(&r) && !l.row(r).is_empty()) {
            let s: f64 = l.row(r).iter().map(|&k| f64::from(got[k])).sum();
            assert!((s - 1.0).abs() < 1e-5, "row {r} sums to {s}");
        }
        // Deterministic: the same bits again.
        let mut again = column(&dev, &vec![0.0; e]);
        edge_softmax(&rows, slope, &logits, &mut again).unwrap();
        assert_eq!(bits(&again.to_host().unwrap()), bits(&got));

        let mut d = column(&dev, &vec![-5.0; e]);
        let leaky_arg = slope.map(|s| (s, &logits));
        edge_softmax_backward(&rows, leaky_arg, &out, &d_out, &mut d).unwrap();
        let got_d = d.to_host().unwrap();
        let want_d = softmax_backward_reference(&l, slope, &z, &got, &d_out_host, -5.0);
        assert_near(
            &format!("backward, slope {slope:?}"),
            &got_d,
            &want_d,
            1e-6,
            1e-5,
        );
        for r in [7, 8, 9] {
            assert!(l.row(r).iter().all(|&k| got_d[k].is_nan()), "row {r}");
        }
    }
}

#[test]
fn edge_softmax_rejects_bad_layouts_and_operands() {
    let Some(dev) = device() else { return };
    let (l, z) = softmax_case();
    let rows = l.device(&dev);
    let logits = column(&dev, &z);
    let mut short = column(&dev, &z[1..]);
    assert!(matches!(
        edge_softmax(&rows, None, &logits, &mut short),
        Err(CudaError::Shape { .. })
    ));
    let mut wide = DeviceDense::zeros(&dev, z.len(), 2).unwrap();
    assert!(edge_softmax(&rows, None, &logits, &mut wide).is_err());
    let ptr = [0u64, 2, 1];
    assert!(EdgeRows::new(
        &dev,
        2,
        &[EdgeBlock {
            first: 0,
            rowptr: &ptr
        }]
    )
    .is_err());
    // An empty layout and empty operands: nothing to do.
    let none = EdgeRows::new(&dev, 0, &[]).unwrap();
    let mut empty = DeviceDense::zeros(&dev, 0, 1).unwrap();
    edge_softmax(
        &none,
        Some(0.2),
        &DeviceDense::zeros(&dev, 0, 1).unwrap(),
        &mut empty,
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Bias, activation, bias gradient

fn elu(z: f32) -> f64 {
    if z > 0.0 {
        f64::from(z)
    } else {
        f64::from(z).exp_m1()
    }
}

#[test]
fn bias_activation_and_backward_match_the_cpu() {
    let Some(dev) = device() else { return };
    for (rows, f, ld) in [(37usize, 5usize, 5usize), (300, 64, 70), (9, 33, 33)] {
        let z0 = random(rows * ld, -3.0, 3.0, 1);
        let b = random(f, -1.0, 1.0, 2);
        let bias = DeviceDense::from_host(&dev, 1, f, &b).unwrap();
        let zb: Vec<f32> = (0..rows * ld)
            .map(|k| if k % ld < f { z0[k] + b[k % ld] } else { z0[k] })
            .collect();
        for act in [Activation::Identity, Activation::Relu, Activation::Elu] {
            let what = format!("{rows}×{f} ld {ld} {act:?}");
            let mut z = DeviceDense::from_host_strided(&dev, rows, f, ld, &z0).unwrap();
            let mut out = DeviceDense::zeros(&dev, rows, f).unwrap();
            bias_activation(Some(&bias), act, &mut z, &mut out).unwrap();
            // z keeps the pre-activation, exactly z + b (padding untouched).
            assert_eq!(bits(&z.to_host_strided().unwrap()), bits(&zb), "{what}: z");
            let pre = z.to_host().unwrap();
            let want: Vec<f64> = pre
                .iter()
                .map(|&v| match act {
                    Activation::Identity => f64::from(v),
                    Activation::Relu => f64::from(v.max(0.0)),
                    Activation::Elu => elu(v),
                })
                .collect();
            let got = out.to_host().unwrap();
            assert_near(&format!("{what}: out"), &got, &want, 1e-7, 1e-6);
            if act != Activation::Elu {
                let exact: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                assert_eq!(bits(&got), bits(&exact), "{what}: exact");
            }
            // In place: the same values.
            let mut zi = DeviceDense::from_host_strided(&dev, rows, f, ld, &z0).unwrap();
            bias_activation_in_place(Some(&bias), act, &mut zi).unwrap();
            assert_eq!(bits(&zi.to_host().unwrap()), bits(&got), "{what}: in place");

            // Backward from the pre-activation.
            let g0 = random(rows * f, -1.0, 1.0, 3);
            let mut d = DeviceDense::from_host(&dev, rows, f, &g0).unwrap();
            activation_backward(act, &z, &mut d).unwrap();
            let want_d: Vec<f64> = g0
                .iter()
                .zip(&pre)
                .map(|(&g, &v)| match act {
                    Activation::Identity => f64::from(g),
                    Activation::Relu => f64::from(if v > 0.0 { g } else { 0.0 }),
                    Activation::Elu if v <= 0.0 => f64::from(g) * f64::from(v).exp(),
                    Activation::Elu => f64::from(g),
                })
                .collect();
            assert_near(
                &format!("{what}: backward"),
                &d.to_host().unwrap(),
                &want_d,
                1e-7,
                1e-6,
            );
        }
        // No bias: z unchanged.
        let mut z = DeviceDense::from_host_strided(&dev, rows, f, ld, &z0).unwrap();
        let mut out = DeviceDense::zeros(&dev, rows, f).unwrap();
        bias_activation(None, Activation::Identity, &mut z, &mut out).unwrap();
        assert_eq!(bits(&z.to_host_strided().unwrap()), bits(&z0));
        assert_eq!(bits(&out.to_host().unwrap()), bits(&z.to_host().unwrap()));
    }
    // A bias of the wrong width is refused.
    let mut z = DeviceDense::zeros(&dev, 4, 3).unwrap();
    let mut out = DeviceDense::zeros(&dev, 4, 3).unwrap();
    let bias = DeviceDense::zeros(&dev, 1, 2).unwrap();
    assert!(bias_activation(Some(&bias), Activation::Relu, &mut z, &mut out).is_err());
}

#[test]
fn column_sums_are_the_bias_gradient_and_deterministic() {
    let Some(dev) = device() else { return };
    // 70 000 rows take two passes of partial sums.
    for (rows, f, ld) in [
        (0usize, 3usize, 3usize),
        (1, 1, 1),
        (300, 33, 40),
        (70_000, 64, 64),
    ] {
        let x = random(rows * ld, -1.0, 1.0, rows as u64);
        let dx = DeviceDense::from_host_strided(&dev, rows, f, ld, &x).unwrap();
        let mut out = DeviceDense::from_host(&dev, 1, f, &vec![f32::NAN; f]).unwrap();
        column_sums(&dx, &mut out).unwrap();
        let got = out.to_host().unwrap();
        for (j, &g) in got.iter().enumerate() {
            let (mut s, mut a) = (0f64, 0f64);
            for i in 0..rows {
                s += f64::from(x[i * ld + j]);
                a += f64::from(x[i * ld + j]).abs();
            }
            assert!(
                (f64::from(g) - s).abs() <= 1e-6 * a + 1e-7,
                "{rows}×{f}: column {j} sums to {g}, expected {s}"
            );
        }
        let mut again = DeviceDense::zeros(&dev, 1, f).unwrap();
        column_sums(&dx, &mut again).unwrap();
        assert_eq!(bits(&again.to_host().unwrap()), bits(&got));
    }
}

// ---------------------------------------------------------------------------------------------
// Dropout: the CPU trainer's masks, reimplemented here from their definition.

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The CPU trainer's `DropoutKey::apply` for `ids.len()` rows of `width` columns, columns `cols`.
fn host_dropout(
    key: &DropoutKey,
    ids: &[u64],
    src: &[f32],
    width: usize,
    cols: Range<usize>,
) -> Vec<f32> {
    let base =
        splitmix64(key.seed ^ splitmix64(key.epoch.wrapping_mul(0x1000_0000_01B3) ^ key.layer));
    let threshold = (f64::from(key.p) * f64::from(1u32 << 24)) as u32;
    let scale = if key.p == 0.0 {
        1.0
    } else {
        1.0 / (1.0 - key.p)
    };
    let mut out = Vec::with_capacity(ids.len() * cols.len());
    for (r, &id) in ids.iter().enumerate() {
        let k = splitmix64(base ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (mul, add) = ((k as u32) | 1, (k >> 32) as u32);
        for c in cols.clone() {
            let keep = lowbias32((c as u32).wrapping_mul(mul).wrapping_add(add)) >> 8 >= threshold;
            let v = src[r * width + c];
            out.push(if keep { v * scale } else { 0.0 });
        }
    }
    out
}

#[test]
fn dropout_masks_are_the_cpu_masks_bit_for_bit() {
    let Some(dev) = device() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let rows: usize = 300;
    let mut ids: Vec<u64> = (0..rows).map(|_| rng.random()).collect();
    ids[0] = 0;
    ids[1] = u64::MAX;
    let dids = DeviceIds::new(&dev, &ids).unwrap();
    for (p, width, cols) in [
        (0.5f32, 64usize, 0..64),
        (0.1, 37, 0..37),
        (0.9, 70, 13..51),
        (0.0, 16, 0..16),
        (1e-9, 5, 1..4),
        (0.6, 1, 0..1),
    ] {
        for (seed, epoch, layer) in [(42u64, 3u64, 1u64), (u64::MAX, 0, 0), (7, 123_456, 5)] {
            let key = DropoutKey {
                seed,
                epoch,
                layer,
                p,
            };
            let what = format!("p {p} width {width} cols {cols:?} key {key:?}");
            let mut src = random(rows * width, -2.0, 2.0, seed ^ epoch);
            src[3] = f32::NAN;
            let want = host_dropout(&key, &ids, &src, width, cols.clone());
            let dsrc = DeviceDense::from_host(&dev, rows, width, &src).unwrap();
            let mut dst = DeviceDense::zeros(&dev, rows, cols.len()).unwrap();
            dropout(&key, &dids, &dsrc, cols.clone(), &mut dst).unwrap();
            assert_eq!(
                bits_any_nan(&dst.to_host().unwrap()),
                bits_any_nan(&want),
                "{what}"
            );
            // In place over the column slice, as the backward pass masks a gradient.
            let sliced: Vec<f32> = src
                .chunks(width)
                .flat_map(|r| r[cols.clone()].to_vec())
                .collect();
            let mut x = DeviceDense::from_host(&dev, rows, cols.len(), &sliced).unwrap();
            dropout_in_place(&key, &dids, cols.start, &mut x).unwrap();
            assert_eq!(
                bits_any_nan(&x.to_host().unwrap()),
                bits_any_nan(&want),
                "{what}: in place"
            );
            if p >= 0.1 && width >= 37 {
                let dropped = want.iter().filter(|&&v| v == 0.0).count() as f64;
                let rate = dropped / want.len() as f64;
                assert!((rate - f64::from(p)).abs() < 0.03, "{what}: rate {rate}");
            }
        }
    }
    // Bad probability and shapes.
    let key = DropoutKey {
        seed: 1,
        epoch: 0,
        layer: 0,
        p: 1.0,
    };
    let mut x = DeviceDense::zeros(&dev, rows, 4).unwrap();
    assert!(matches!(
        dropout_in_place(&key, &dids, 0, &mut x),
        Err(CudaError::InvalidArgument { .. })
    ));
    let key = DropoutKey { p: 0.5, ..key };
    let mut short = DeviceDense::zeros(&dev, 3, 4).unwrap();
    assert!(dropout_in_place(&key, &dids, 0, &mut short).is_err());
    let src = DeviceDense::zeros(&dev, rows, 4).unwrap();
    assert!(dropout(&key, &dids, &src, 2..5, &mut x).is_err());
}

#[test]
fn dropout_reference_follows_the_documented_definition() {
    // Runs without a GPU: the reference above against the definition's properties.
    let key = DropoutKey {
        seed: 42,
        epoch: 3,
        layer: 1,
        p: 0.5,
    };
    let ids: Vec<u64> = (1000..1100).collect();
    let width = 40;
    let src: Vec<f32> = (0..ids.len() * width).map(|i| i as f32 + 1.0).collect();
    let full = host_dropout(&key, &ids, &src, width, 0..width);
    let part = host_dropout(
        &key,
        &ids[37..61],
        &src[37 * width..61 * width],
        width,
        0..width,
    );
    assert_eq!(part, full[37 * width..61 * width]);
    let kept = full.iter().filter(|&&v| v != 0.0).count();
    assert!((1800..2200).contains(&kept), "{kept} of 4000 kept");
    assert!(full
        .iter()
        .zip(&src)
        .all(|(&d, &s)| d == 0.0 || d == 2.0 * s));
}

// ---------------------------------------------------------------------------------------------
// Log-softmax + NLL

/// The CPU trainer's `(argmax, log Σ exp)` of a row.
fn log_sum_exp(row: &[f32]) -> (usize, f32) {
    let (mut arg, mut max) = (0, f32::NEG_INFINITY);
    for (k, &v) in row.iter().enumerate() {
        if v > max {
            max = v;
            arg = k;
        }
    }
    let s: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    (arg, max + s.ln())
}

#[test]
fn nll_loss_matches_the_cpu_metrics_and_gradient() {
    let Some(dev) = device() else { return };
    // 70 000 rows: 274 blocks of partial sums, added in two passes.
    for (rows, classes, ld) in [(1usize, 2usize, 2usize), (1000, 7, 9), (70_000, 40, 40)] {
        let mut rng = ChaCha8Rng::seed_from_u64(rows as u64);
        let mut z = random(rows * ld, -3.0, 3.0, rows as u64 + 1);
        let labels: Vec<i32> = (0..rows)
            .map(|_| {
                if rng.random_bool(0.15) {
                    -1
                } else {
                    rng.random_range(0..classes as i32)
                }
            })
            .collect();
        let masks: Vec<u8> = (0..rows).map(|_| rng.random_range(0..8u8)).collect();
        if rows > 10 {
            // A tie at the largest logit (the first position wins), and a NaN in a row that is
            // not a training row (argmax skips it, nothing else reads it).
            z[3 * ld] = 5.0;
            z[3 * ld + 1] = 5.0;
            z[4 * ld + 2] = f32::NAN;
        }
        let masks: Vec<u8> = masks
            .iter()
            .enumerate()
            .map(|(i, &m)| if i == 4 { m & !1 } else { m })
            .collect();
        let train_total = 1234.0f64;
        let logits = DeviceDense::from_host_strided(&dev, rows, classes, ld, &z).unwrap();
        let dl = DeviceLabels::new(&dev, classes, &labels, &masks).unwrap();
        let mut dz =
            DeviceDense::from_host(&dev, rows, classes, &vec![f32::NAN; rows * classes]).unwrap();
        let sums = nll_loss(&logits, &dl, train_total, &mut dz).unwrap();
        let mut want = [0f64; 7];
        let mut want_dz = vec![0f64; rows * classes];
        for i in 0..rows {
            let (y, m) = (labels[i], masks[i]);
            if y < 0 {
                continue;
            }
            let row = &z[i * ld..i * ld + classes];
            let (arg, lse) = log_sum_exp(row);
            let ok = f64::from(u8::from(arg == y as usize));
            if m & 1 != 0 {
                want[0] += f64::from(lse - row[y as usize]);
                want[1] += ok;
                want[2] += 1.0;
                for (k, &v) in row.iter().enumerate() {
                    let p = (v - lse).exp();
                    want_dz[i * classes + k] = f64::from(
                        ((p - f32::from(u8::from(k == y as usize))) as f64 / train_total) as f32,
                    );
                }
            }
            if m & 2 != 0 {
                want[3] += ok;
                want[4] += 1.0;
            }
            if m & 4 != 0 {
                want[5] += ok;
                want[6] += 1.0;
            }
        }
        let got = sums.to_array();
        let what = format!("{rows}×{classes}");
        assert_eq!(got[1..], want[1..], "{what}: counts");
        assert!(
            (got[0] - want[0]).abs() <= 1e-5 * want[0].abs() + 1e-6,
            "{what}: nll {} vs {}",
            got[0],
            want[0]
        );
        assert_near(
            &format!("{what}: dz"),
            &dz.to_host().unwrap(),
            &want_dz,
            1e-6 / train_total,
            1e-5,
        );
        // Deterministic.
        let mut again = DeviceDense::zeros(&dev, rows, classes).unwrap();
        let sums2 = nll_loss(&logits, &dl, train_total, &mut again).unwrap();
        assert_eq!(sums2, sums);
        assert_eq!(
            bits(&again.to_host().unwrap()),
            bits(&dz.to_host().unwrap())
        );
    }
    // Labels out of range, wrong shapes and a zero total are refused.
    assert!(DeviceLabels::new(&dev, 3, &[0, 3], &[1, 1]).is_err());
    assert!(DeviceLabels::new(&dev, 3, &[0, -2], &[1, 1]).is_err());
    assert!(DeviceLabels::new(&dev, 3, &[0], &[1, 1]).is_err());
    let dl = DeviceLabels::new(&dev, 3, &[0, 2], &[1, 1]).unwrap();
    let logits = DeviceDense::zeros(&dev, 2, 3).unwrap();
    let mut dz = DeviceDense::zeros(&dev, 2, 3).unwrap();
    assert!(nll_loss(&logits, &dl, 0.0, &mut dz).is_err());
    let mut bad = DeviceDense::zeros(&dev, 2, 4).unwrap();
    assert!(nll_loss(&logits, &dl, 2.0, &mut bad).is_err());
}

// ---------------------------------------------------------------------------------------------
// Adam

/// The CPU trainer's Adam update (PyTorch's semantics), weight decay added to the gradient.
fn host_adam(step: &AdamStep, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    const B1: f32 = 0.9;
    const B2: f32 = 0.999;
    const EPS: f32 = 1e-8;
    let t = i32::try_from(step.t).unwrap_or(i32::MAX);
    let bc1 = 1.0 - B1.powi(t);
    let bc2 = 1.0 - B2.powi(t);
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
        let g = if step.weight_decay != 0.0 {
            g + step.weight_decay * *p
        } else {
            g
        };
        *m = B1 * *m + (1.0 - B1) * g;
        *v = B2 * *v + (1.0 - B2) * g * g;
        let mhat = *m / bc1;
        let vhat = *v / bc2;
        *p -= step.lr * mhat / (vhat.sqrt() + EPS);
    }
}

#[test]
fn adam_step_is_the_cpu_step_bit_for_bit() {
    let Some(dev) = device() else { return };
    let (rows, cols) = (301, 17);
    let n = rows * cols;
    let mut p = random(n, -1.0, 1.0, 1);
    let mut m = vec![0f32; n];
    let mut v = vec![0f32; n];
    let mut dp = DeviceDense::from_host(&dev, rows, cols, &p).unwrap();
    let mut dm = DeviceDense::from_host(&dev, rows, cols, &m).unwrap();
    let mut dv = DeviceDense::from_host(&dev, rows, cols, &v).unwrap();
    for t in 1..=12u64 {
        let mut g = random(n, -0.5, 0.5, 100 + t);
        g[5] = 0.0;
        g[6] = 1e-30;
        let step = AdamStep {
            lr: 0.01,
            t,
            weight_decay: if t % 2 == 0 { 5e-4 } else { 0.0 },
        };
        let dg = DeviceDense::from_host(&dev, rows, cols, &g).unwrap();
        adam_step(&step, &mut dp, &dg, &mut dm, &mut dv).unwrap();
        host_adam(&step, &mut p, &g, &mut m, &mut v);
        assert_eq!(bits(&dp.to_host().unwrap()), bits(&p), "params at t = {t}");
        assert_eq!(bits(&dm.to_host().unwrap()), bits(&m), "m at t = {t}");
        assert_eq!(bits(&dv.to_host().unwrap()), bits(&v), "v at t = {t}");
        assert_eq!(bits(&dg.to_host().unwrap()), bits(&g), "grads untouched");
    }
    // A large step number (the corrections saturate at 1) and the refusals.
    let step = AdamStep {
        lr: 0.005,
        t: 1 << 40,
        weight_decay: 0.0,
    };
    let g = random(n, -0.5, 0.5, 5);
    let dg = DeviceDense::from_host(&dev, rows, cols, &g).unwrap();
    adam_step(&step, &mut dp, &dg, &mut dm, &mut dv).unwrap();
    host_adam(&step, &mut p, &g, &mut m, &mut v);
    assert_eq!(bits(&dp.to_host().unwrap()), bits(&p));
    let zero = AdamStep { t: 0, ..step };
    assert!(matches!(
        adam_step(&zero, &mut dp, &dg, &mut dm, &mut dv),
        Err(CudaError::InvalidArgument { .. })
    ));
    let mut padded = DeviceDense::zeros_strided(&dev, rows, cols, cols + 1).unwrap();
    assert!(adam_step(&step, &mut padded, &dg, &mut dm, &mut dv).is_err());
}
