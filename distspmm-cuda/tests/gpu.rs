//! Kernels against a plain-loop CPU reference. Tests that need a GPU print
//! "skipping: no CUDA device (...)" and return when none can be opened, unless
//! `DISTSPMM_REQUIRE_GPU` is set (the GPU check script sets it), which turns the skip into a
//! failure.
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test matrices: every narrowing is exact"
)]

use distspmm_cuda::{
    add_blocks, edge_softmax::SOFTMAX_KERNELS, edges::EDGE_KERNELS, gather_rows, kernel_resources,
    rows::ROW_KERNELS, scatter_add_rows, spmm, spmm_transpose_with, spmm_with, strategy::KERNELS,
    train::TRAIN_KERNELS, CudaError, DeviceCsc, DeviceCsr, DeviceDense, DeviceRows, DeviceScatter,
    GpuDevice, GroupLanes, RawSplit, RawSpmm, RawWorkspace, ScatterPlan, SparseParts, Strategy,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::device;

/// A host CSR (u64 pointers, u32 indices, f32 values).
#[derive(Clone, Debug)]
struct HostCsr {
    nrows: usize,
    ncols: usize,
    indptr: Vec<u64>,
    indices: Vec<u32>,
    values: Vec<f32>,
}

impl HostCsr {
    fn parts(&self) -> SparseParts<'_> {
        SparseParts {
            nrows: self.nrows,
            ncols: self.ncols,
            indptr: &self.indptr,
            indices: &self.indices,
            values: &self.values,
        }
    }

    /// Row lengths from `len_of_row`, random columns (repeats allowed) and values.
    fn random(
        nrows: usize,
        ncols: usize,
        seed: u64,
        mut len_of_row: impl FnMut(&mut ChaCha8Rng) -> usize,
    ) -> HostCsr {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut indptr = vec![0u64];
        let (mut indices, mut values) = (Vec::new(), Vec::new());
        for _ in 0..nrows {
            let len = if ncols == 0 { 0 } else { len_of_row(&mut rng) };
            for _ in 0..len {
                indices.push(rng.random_range(0..ncols as u32));
                values.push(rng.random_range(-1.0f32..1.0));
            }
            indptr.push(indices.len() as u64);
        }
        HostCsr {
            nrows,
            ncols,
            indptr,
            indices,
            values,
        }
    }

    /// A uniform-degree matrix with about a fifth of the rows empty.
    fn uniform(nrows: usize, ncols: usize, max_len: usize, seed: u64) -> HostCsr {
        HostCsr::random(nrows, ncols, seed, |rng| {
            if rng.random_bool(0.2) {
                0
            } else {
                rng.random_range(1..=max_len)
            }
        })
    }

    /// Power-law row lengths (Pareto, exponent ~1.2), so a few rows are very long.
    fn power_law(nrows: usize, ncols: usize, seed: u64) -> HostCsr {
        HostCsr::random(nrows, ncols, seed, |rng| {
            let u: f64 = rng.random_range(1e-6..1.0);
            ((2.0 * u.powf(-1.0 / 1.2)) as usize).min(4 * ncols)
        })
    }

    /// The CSC of this matrix: the CSR of its transpose.
    fn transpose(&self) -> HostCsr {
        let mut counts = vec![0u64; self.ncols + 1];
        for &c in &self.indices {
            counts[c as usize + 1] += 1;
        }
        for j in 0..self.ncols {
            counts[j + 1] += counts[j];
        }
        let mut next = counts.clone();
        let mut indices = vec![0u32; self.indices.len()];
        let mut values = vec![0f32; self.values.len()];
        for r in 0..self.nrows {
            for k in self.indptr[r] as usize..self.indptr[r + 1] as usize {
                let c = self.indices[k] as usize;
                let dst = next[c] as usize;
                indices[dst] = r as u32;
                values[dst] = self.values[k];
                next[c] += 1;
            }
        }
        HostCsr {
            nrows: self.ncols,
            ncols: self.nrows,
            indptr: counts,
            indices,
            values,
        }
    }

    /// Reference α·A·X + β·Y in f64 with plain loops, and the scale each entry's rounding
    /// error is measured against (Σ|α a x| + |β y|).
    fn reference(
        &self,
        alpha: f32,
        x: &[f32],
        beta: f32,
        y: &[f32],
        f: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut out = vec![0f64; self.nrows * f];
        let mut scale = vec![0f64; self.nrows * f];
        for r in 0..self.nrows {
            for k in self.indptr[r] as usize..self.indptr[r + 1] as usize {
                let (c, a) = (self.indices[k] as usize, f64::from(self.values[k]));
                for j in 0..f {
                    let t = f64::from(alpha) * a * f64::from(x[c * f + j]);
                    out[r * f + j] += t;
                    scale[r * f + j] += t.abs();
                }
            }
            if beta != 0.0 {
                for j in 0..f {
                    let t = f64::from(beta) * f64::from(y[r * f + j]);
                    out[r * f + j] += t;
                    scale[r * f + j] += t.abs();
                }
            }
        }
        (out, scale)
    }
}

fn random_dense(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rows * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect()
}

fn assert_close(what: &str, got: &[f32], (want, scale): &(Vec<f64>, Vec<f64>)) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let tol = 1e-5 * s + 1e-6;
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}: entry {i} is {g}, expected {w} (tolerance {tol})"
        );
    }
}

/// Runs one product on the device and checks it against the reference.
#[allow(clippy::too_many_arguments)]
fn check_product(
    dev: &GpuDevice,
    a: &HostCsr,
    device_a: &DeviceCsr,
    f: usize,
    alpha: f32,
    beta: f32,
    strategy: Strategy,
    seed: u64,
) {
    let x = random_dense(a.ncols, f, seed);
    let y0 = random_dense(a.nrows, f, seed + 1);
    let dx = DeviceDense::from_host(dev, a.ncols, f, &x).unwrap();
    let mut dy = DeviceDense::from_host(dev, a.nrows, f, &y0).unwrap();
    let choice = spmm_with(strategy, alpha, device_a, &dx, beta, &mut dy).unwrap();
    let what = format!(
        "{}x{} nnz {} F {f} α {alpha} β {beta} {strategy:?} -> {choice:?}",
        a.nrows,
        a.ncols,
        a.indices.len()
    );
    assert_close(
        &what,
        &dy.to_host().unwrap(),
        &a.reference(alpha, &x, beta, &y0, f),
    );
}

const FEATURES: [usize; 13] = [1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 100, 128, 260];
const SCALARS: [(f32, f32); 3] = [(1.0, 0.0), (0.5, 2.0), (-1.5, 1.0)];

fn strategies() -> Vec<Strategy> {
    let mut s = vec![
        Strategy::Auto,
        Strategy::RowSplit,
        Strategy::RowGroups { lanes: None },
    ];
    s.extend(GroupLanes::ALL.map(|l| Strategy::RowGroups { lanes: Some(l) }));
    s
}

#[test]
fn open_reports_a_missing_device_as_an_error_not_a_panic() {
    match GpuDevice::open(0) {
        Ok(dev) => assert!(!dev.name().unwrap().is_empty()),
        Err(CudaError::NoDevice(msg)) => {
            assert!(distspmm_cuda::built_with_cuda());
            assert!(!msg.is_empty());
            println!("no device, as reported: {msg}");
        }
        Err(CudaError::NotBuilt) => assert!(!distspmm_cuda::built_with_cuda()),
        Err(other) => panic!("unexpected error opening device 0: {other}"),
    }
    // A device far beyond any machine's count is never there.
    assert!(matches!(
        GpuDevice::open(4096),
        Err(CudaError::NoDevice(_) | CudaError::NotBuilt)
    ));
    match GpuDevice::count() {
        Ok(n) => assert!(distspmm_cuda::built_with_cuda() && n < 4096),
        Err(e) => assert!(
            matches!(e, CudaError::NoDevice(_) | CudaError::NotBuilt),
            "{e}"
        ),
    }
}

/// A `libcuda.so` without the driver's symbols makes cudarc panic on its first call; the
/// probe must turn that into `NoDevice`. The library path is read at process start, so the
/// test re-runs itself in a child process with a stub driver first on `LD_LIBRARY_PATH`.
#[test]
fn broken_driver_library_is_an_error_not_a_crash() {
    const CHILD: &str = "DISTSPMM_CUDA_STUB_DRIVER_CHILD";
    if std::env::var_os(CHILD).is_some() {
        match GpuDevice::open(0) {
            Err(CudaError::NoDevice(msg)) => assert!(msg.contains("cuInit"), "{msg}"),
            Err(CudaError::NotBuilt) => assert!(!distspmm_cuda::built_with_cuda()),
            other => panic!("a stub libcuda must not open: {other:?}"),
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("stub.c");
    std::fs::write(&src, "int not_the_cuda_driver(void) { return 0; }\n").unwrap();
    let lib = dir.path().join("libcuda.so");
    let built = std::process::Command::new("cc")
        .arg("-shared")
        .arg("-fPIC")
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("skipping: no C compiler to build a stub libcuda.so");
        return;
    }
    std::fs::copy(&lib, dir.path().join("libcuda.so.1")).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "broken_driver_library_is_an_error_not_a_crash",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", dir.path())
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "child ran no test:\n{text}");
}

#[test]
fn handles_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GpuDevice>();
    send_sync::<DeviceCsr>();
    send_sync::<DeviceCsc>();
    send_sync::<DeviceDense>();
}

#[test]
fn ptxas_report_covers_every_kernel_without_spills() {
    let entries = match kernel_resources() {
        Ok(entries) => entries,
        Err(CudaError::NotBuilt) => {
            assert!(!distspmm_cuda::built_with_cuda());
            println!("skipping: built without the `cuda` feature");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    println!("{}", distspmm_cuda::ptxas::table(&entries));
    for arch in ["sm_80", "sm_90"] {
        let all = KERNELS
            .into_iter()
            .chain(ROW_KERNELS)
            .chain(EDGE_KERNELS)
            .chain(SOFTMAX_KERNELS)
            .chain(TRAIN_KERNELS);
        for kernel in all {
            let e = entries
                .iter()
                .find(|e| e.kernel == kernel && e.arch == arch);
            let e = e.unwrap_or_else(|| panic!("ptxas report lacks {kernel} for {arch}"));
            assert!(!e.spills(), "{kernel} spills on {arch}: {e:?}");
            assert!(
                e.registers <= 64,
                "{kernel} on {arch} exceeds the 64-register launch bound"
            );
        }
    }
    assert_eq!(
        entries.len(),
        2 * (KERNELS.len()
            + ROW_KERNELS.len()
            + EDGE_KERNELS.len()
            + SOFTMAX_KERNELS.len()
            + TRAIN_KERNELS.len()),
        "unexpected kernels in the ptxas report"
    );
}

#[test]
fn spmm_matches_reference_for_every_strategy_and_f() {
    let Some(dev) = device() else { return };
    let matrices = [
        HostCsr::uniform(300, 200, 40, 1),
        HostCsr::power_law(500, 400, 2),
    ];
    for (m, a) in matrices.iter().enumerate() {
        // A small piece size makes sure the power-law matrix really has long rows to split.
        let da = DeviceCsr::with_piece_nnz(&dev, a.parts(), Some(24)).unwrap();
        assert!(m == 0 || !da.plan().is_empty());
        for (i, &f) in FEATURES.iter().enumerate() {
            for strategy in strategies() {
                let (alpha, beta) = SCALARS[i % SCALARS.len()];
                check_product(&dev, a, &da, f, alpha, beta, strategy, (m * 100 + i) as u64);
            }
        }
    }
}

#[test]
fn alpha_beta_combinations() {
    let Some(dev) = device() else { return };
    let a = HostCsr::power_law(200, 150, 3);
    let da = DeviceCsr::with_piece_nnz(&dev, a.parts(), Some(16)).unwrap();
    for (alpha, beta) in [(0.0, 1.0), (2.0, -1.0), (1.0, 1.0), (0.25, 0.0)] {
        for f in [5, 64] {
            check_product(&dev, &a, &da, f, alpha, beta, Strategy::Auto, 7);
        }
    }
}

#[test]
fn beta_zero_never_reads_y() {
    let Some(dev) = device() else { return };
    let a = HostCsr::power_law(128, 128, 4);
    let da = DeviceCsr::with_piece_nnz(&dev, a.parts(), Some(16)).unwrap();
    for f in [3, 16, 256] {
        for strategy in strategies() {
            let x = random_dense(a.ncols, f, 9);
            let dx = DeviceDense::from_host(&dev, a.ncols, f, &x).unwrap();
            let mut dy =
                DeviceDense::from_host(&dev, a.nrows, f, &vec![f32::NAN; a.nrows * f]).unwrap();
            spmm_with(strategy, 1.5, &da, &dx, 0.0, &mut dy).unwrap();
            let want = a.reference(1.5, &x, 0.0, &[], f);
            assert_close(
                &format!("NaN Y, F {f}, {strategy:?}"),
                &dy.to_host().unwrap(),
                &want,
            );
        }
    }
}

#[test]
fn leading_dimensions_and_padding_are_respected() {
    let Some(dev) = device() else { return };
    let a = HostCsr::power_law(100, 90, 5);
    let da = DeviceCsr::with_piece_nnz(&dev, a.parts(), Some(16)).unwrap();
    // (F, ldx, ldy): aligned padding keeps float4, odd padding falls back to scalar.
    for (f, ldx, ldy) in [(8, 12, 16), (8, 9, 8), (64, 68, 65), (5, 7, 6)] {
        let x = random_dense(a.ncols, f, 11);
        let y0 = random_dense(a.nrows, f, 12);
        let pad = |rows: usize, ld: usize, m: &[f32]| -> Vec<f32> {
            (0..rows)
                .flat_map(|r| {
                    m[r * f..(r + 1) * f]
                        .iter()
                        .copied()
                        .chain(std::iter::repeat_n(-7.0, ld - f))
                })
                .collect()
        };
        let dx =
            DeviceDense::from_host_strided(&dev, a.ncols, f, ldx, &pad(a.ncols, ldx, &x)).unwrap();
        let mut dy =
            DeviceDense::from_host_strided(&dev, a.nrows, f, ldy, &pad(a.nrows, ldy, &y0)).unwrap();
        for strategy in strategies() {
            let before = dy.to_host().unwrap();
            let choice = spmm_with(strategy, 1.0, &da, &dx, 0.5, &mut dy).unwrap();
            assert_eq!(
                choice.vec4,
                ldx % 4 == 0 && ldy % 4 == 0 && f % 4 == 0,
                "{choice:?}"
            );
            let what = format!("F {f} ldx {ldx} ldy {ldy} {strategy:?}");
            assert_close(
                &what,
                &dy.to_host().unwrap(),
                &a.reference(1.0, &x, 0.5, &before, f),
            );
            let full = dy.to_host_strided().unwrap();
            for r in 0..a.nrows {
                assert!(
                    full[r * ldy + f..(r + 1) * ldy].iter().all(|&v| v == -7.0),
                    "{what}: padding of row {r} written"
                );
            }
        }
    }
}

#[test]
fn transpose_from_csc_matches_reference() {
    let Some(dev) = device() else { return };
    // Power-law rows of A become long columns of A: the transpose splits them.
    let a = HostCsr::power_law(400, 300, 6);
    let at = a.transpose();
    let csc = DeviceCsc::with_piece_nnz(
        &dev,
        SparseParts {
            nrows: a.nrows,
            ncols: a.ncols,
            indptr: &at.indptr,
            indices: &at.indices,
            values: &at.values,
        },
        Some(16),
    )
    .unwrap();
    assert_eq!((csc.nrows(), csc.ncols()), (a.nrows, a.ncols));
    for (i, &f) in [1, 4, 17, 64, 256].iter().enumerate() {
        for strategy in strategies() {
            let (alpha, beta) = SCALARS[i % SCALARS.len()];
            let x = random_dense(a.nrows, f, 20 + i as u64);
            let y0 = random_dense(a.ncols, f, 40 + i as u64);
            let dx = DeviceDense::from_host(&dev, a.nrows, f, &x).unwrap();
            let mut dy = DeviceDense::from_host(&dev, a.ncols, f, &y0).unwrap();
            spmm_transpose_with(strategy, alpha, &csc, &dx, beta, &mut dy).unwrap();
            let want = at.reference(alpha, &x, beta, &y0, f);
            assert_close(
                &format!("Aᵀ F {f} {strategy:?}"),
                &dy.to_host().unwrap(),
                &want,
            );
        }
    }
}

#[test]
fn row_splitting_is_deterministic() {
    let Some(dev) = device() else { return };
    let a = HostCsr::power_law(2000, 2000, 8);
    let da = DeviceCsr::with_piece_nnz(&dev, a.parts(), Some(32)).unwrap();
    let x = random_dense(a.ncols, 64, 3);
    let dx = DeviceDense::from_host(&dev, a.ncols, 64, &x).unwrap();
    let run = || {
        let mut dy = DeviceDense::zeros(&dev, a.nrows, 64).unwrap();
        let choice = spmm_with(Strategy::RowSplit, 1.0, &da, &dx, 0.0, &mut dy).unwrap();
        assert!(choice.split_kernels.is_some());
        dy.to_host().unwrap()
    };
    let first = run();
    assert!(first
        .iter()
        .zip(run())
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn degenerate_shapes() {
    let Some(dev) = device() else { return };
    // No non-zeros: Y = βY. No rows: nothing to do. F = 0: nothing to do.
    let empty = HostCsr::random(50, 40, 1, |_| 0);
    let da = DeviceCsr::new(&dev, empty.parts()).unwrap();
    check_product(&dev, &empty, &da, 9, 1.0, 3.0, Strategy::Auto, 1);
    let no_rows = HostCsr::random(0, 10, 1, |_| 1);
    let dn = DeviceCsr::new(&dev, no_rows.parts()).unwrap();
    check_product(&dev, &no_rows, &dn, 4, 1.0, 1.0, Strategy::RowSplit, 2);
    let a = HostCsr::uniform(10, 10, 3, 3);
    let da = DeviceCsr::new(&dev, a.parts()).unwrap();
    let dx = DeviceDense::zeros(&dev, 10, 0).unwrap();
    let mut dy = DeviceDense::zeros(&dev, 10, 0).unwrap();
    spmm(1.0, &da, &dx, 0.0, &mut dy).unwrap();
}

#[test]
fn shape_and_structure_errors() {
    let Some(dev) = device() else { return };
    let a = HostCsr::uniform(10, 8, 3, 4);
    let da = DeviceCsr::new(&dev, a.parts()).unwrap();
    let x = DeviceDense::zeros(&dev, 9, 4).unwrap();
    let mut y = DeviceDense::zeros(&dev, 10, 4).unwrap();
    assert!(matches!(
        spmm(1.0, &da, &x, 0.0, &mut y),
        Err(CudaError::Shape { .. })
    ));
    let x = DeviceDense::zeros(&dev, 8, 5).unwrap();
    assert!(matches!(
        spmm(1.0, &da, &x, 0.0, &mut y),
        Err(CudaError::Shape { .. })
    ));
    let mut bad = a.clone();
    bad.indices[0] = 8;
    assert!(matches!(
        DeviceCsr::new(&dev, bad.parts()),
        Err(CudaError::InvalidMatrix { .. })
    ));
    assert!(DeviceDense::from_host(&dev, 3, 3, &[0.0; 8]).is_err());
    assert!(DeviceDense::zeros_strided(&dev, 3, 4, 3).is_err());
    let other = GpuDevice::open(0).unwrap();
    let x_other = DeviceDense::zeros(&other, 8, 4).unwrap();
    assert!(matches!(
        spmm(1.0, &da, &x_other, 0.0, &mut y),
        Err(CudaError::DeviceMismatch(_))
    ));
}

#[test]
fn raw_entry_point_with_and_without_a_split_plan() {
    let Some(dev) = device() else { return };
    let a = HostCsr::power_law(600, 500, 10);
    let da = DeviceCsr::with_piece_nnz(&dev, a.parts(), Some(16)).unwrap();
    let plan = da.row_split().expect("power-law rows are long");
    let f = 32;
    let x = random_dense(a.ncols, f, 13);
    let y0 = random_dense(a.nrows, f, 14);
    let dx = DeviceDense::from_host(&dev, a.ncols, f, &x).unwrap();
    let want = a.reference(2.0, &x, -0.5, &y0, f);
    let workspace = DeviceDense::zeros(&dev, plan.workspace_len(f), 1).unwrap();
    for with_plan in [false, true] {
        let dy = DeviceDense::from_host(&dev, a.nrows, f, &y0).unwrap();
        let op = RawSpmm {
            alpha: 2.0,
            a: da.raw(),
            x: dx.raw(),
            beta: -0.5,
            y: dy.raw(),
        };
        let split = with_plan.then(|| RawSplit {
            plan,
            workspace: RawWorkspace {
                ptr: workspace.raw().ptr,
                len: plan.workspace_len(f),
            },
        });
        // SAFETY: every pointer belongs to live buffers of `dev` sized for this product, the
        // workspace is used by this call alone, and the device's own stream is used.
        let choice = unsafe { dev.spmm_raw(&op, Strategy::Auto, split, None) }.unwrap();
        assert_eq!(choice.split_kernels.is_some(), with_plan);
        assert_close("raw", &dy.to_host().unwrap(), &want);
    }
    // Row splitting without a plan is refused rather than silently ignored.
    let dy = DeviceDense::zeros(&dev, a.nrows, f).unwrap();
    let op = RawSpmm {
        alpha: 1.0,
        a: da.raw(),
        x: dx.raw(),
        beta: 0.0,
        y: dy.raw(),
    };
    // SAFETY: as above.
    let refused = unsafe { dev.spmm_raw(&op, Strategy::RowSplit, None, None) };
    assert!(matches!(refused, Err(CudaError::Strategy(_))));
}

/// Rows `(seed + i) * 0.25 - 7` of an `rows × ld` matrix (exact in f32).
fn host_matrix(rows: usize, ld: usize, seed: usize) -> Vec<f32> {
    (0..rows * ld)
        .map(|i| ((seed + i * 37) % 113) as f32 * 0.25 - 7.0)
        .collect()
}

#[test]
fn gather_scatter_and_block_sums_match_host_loops() {
    let Some(dev) = device() else { return };
    for (f, ld) in [(1, 1), (3, 5), (64, 64), (70, 72)] {
        let n = 37;
        let x_host = host_matrix(n, ld, f);
        let x = DeviceDense::from_host_strided(&dev, n, f, ld, &x_host).unwrap();
        // Gather with repeats and out of order.
        let ids: Vec<u32> = vec![5, 0, 36, 5, 17];
        let rows = DeviceRows::new(&dev, &ids).unwrap();
        let mut out = DeviceDense::zeros_strided(&dev, ids.len(), f, ld + 1).unwrap();
        gather_rows(&x, &rows, &mut out).unwrap();
        let expected: Vec<f32> = ids
            .iter()
            .flat_map(|&i| x_host[i as usize * ld..i as usize * ld + f].to_vec())
            .collect();
        assert_eq!(
            out.to_host().unwrap(),
            expected,
            "gather, F = {f}, ld = {ld}"
        );
        let bad = DeviceRows::new(&dev, &[37]).unwrap();
        assert!(gather_rows(&x, &bad, &mut DeviceDense::zeros(&dev, 1, f).unwrap()).is_err());

        // Scatter-add of three lists, in list order, against the same loop on the host.
        let lists: [&[u32]; 3] = [&[0, 3, 9, 36], &[3, 4], &[0, 3, 20]];
        let plan = ScatterPlan::new(n, &lists).unwrap();
        let packed_host = host_matrix(plan.packed_rows(), f, 11);
        let packed = DeviceDense::from_host(&dev, plan.packed_rows(), f, &packed_host).unwrap();
        let mut y = DeviceDense::from_host_strided(&dev, n, f, ld, &x_host).unwrap();
        scatter_add_rows(&DeviceScatter::new(&dev, &plan).unwrap(), &packed, &mut y).unwrap();
        let mut expected = x_host.clone();
        let mut k = 0;
        for list in lists {
            for &r in list {
                for j in 0..f {
                    expected[r as usize * ld + j] += packed_host[k * f + j];
                }
                k += 1;
            }
        }
        assert_eq!(
            y.to_host_strided().unwrap(),
            expected,
            "scatter-add, F = {f}"
        );

        // Three stacked blocks added in order.
        let blocks_host = host_matrix(3 * n, f, 5);
        let blocks = DeviceDense::from_host(&dev, 3 * n, f, &blocks_host).unwrap();
        let mut y = DeviceDense::from_host_strided(&dev, n, f, ld, &x_host).unwrap();
        add_blocks(&blocks, &mut y).unwrap();
        let mut expected = x_host.clone();
        for b in 0..3 {
            for i in 0..n {
                for j in 0..f {
                    expected[i * ld + j] += blocks_host[(b * n + i) * f + j];
                }
            }
        }
        assert_eq!(
            y.to_host_strided().unwrap(),
            expected,
            "block sums, F = {f}"
        );
    }
}
