//! Times our CSR (`spmm`) and CSC (`spmm_transpose`) kernels against cuSPARSE SpMM
//! (CSR, `CUSPARSE_SPMM_CSR_ALG2`, 32-bit indices, row-major dense operands) on the
//! GCN-normalised adjacency of Graph500 RMAT graphs, and checks both against a CPU reference on
//! sampled rows.
//!
//! ```text
//! cargo run --release -p distspmm-cuda --features bench --example gpu_bench -- \
//!     [--scales 18,20] [--features 16,64,256] [--edge-factor 16] [--seed 1] [--iters 20] [--json FILE]
//! ```
//!
//! Bandwidth is reported against the compulsory traffic of one product — A once (8 bytes per
//! non-zero plus 8 per row pointer), X once, Y written once — over the H200's 4.8 TB/s. Random
//! gathers re-read rows of X, so this is a lower bound on the bytes actually moved.

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, ensure, Context as _, Result};
use cudarc::cusparse::sys as cs;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use distspmm_core::graph::generate::rmat;
use distspmm_core::normalize::{adjacency, Normalization};
use distspmm_cuda::{
    spmm_transpose_with, spmm_with, DeviceCsc, DeviceCsr, DeviceDense, GpuDevice, KernelChoice,
    SparseParts, Strategy,
};

/// The H200's HBM3e bandwidth by its datasheet, bytes per second.
const ROOFLINE_BYTES_PER_S: f64 = 4.8e12;
const WARMUP: usize = 3;
/// Rows checked against the CPU reference per product (plus the longest row).
const CHECKED_ROWS: usize = 256;

struct Args {
    scales: Vec<u32>,
    features: Vec<usize>,
    edge_factor: u32,
    seed: u64,
    iters: usize,
    json: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        scales: vec![18, 20],
        features: vec![16, 64, 256],
        edge_factor: 16,
        seed: 1,
        iters: 20,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let list = |v: &str| -> Result<Vec<u64>> {
            v.split(',')
                .map(|s| {
                    s.trim()
                        .parse::<u64>()
                        .with_context(|| format!("{flag}: `{s}` is not a number"))
                })
                .collect()
        };
        match flag.as_str() {
            "--scales" => args.scales = list(&value)?.into_iter().map(|s| s as u32).collect(),
            "--features" => args.features = list(&value)?.into_iter().map(|f| f as usize).collect(),
            "--edge-factor" => args.edge_factor = value.parse().context("--edge-factor takes a number")?,
            "--seed" => args.seed = value.parse().context("--seed takes a number")?,
            "--iters" => args.iters = value.parse().context("--iters takes a number")?,
            "--json" => args.json = Some(value.into()),
            other => bail!("unknown flag {other}; flags: --scales --features --edge-factor --seed --iters --json"),
        }
    }
    ensure!(args.iters > 0, "--iters must be at least 1");
    Ok(args)
}

/// A host CSR borrowed from distspmm-core's matrices.
struct HostCsr<'a> {
    nrows: usize,
    ncols: usize,
    indptr: &'a [u64],
    indices: &'a [u32],
    values: &'a [f32],
}

impl HostCsr<'_> {
    fn parts(&self) -> SparseParts<'_> {
        SparseParts {
            nrows: self.nrows,
            ncols: self.ncols,
            indptr: self.indptr,
            indices: self.indices,
            values: self.values,
        }
    }

    fn longest_row(&self) -> (usize, u64) {
        (0..self.nrows)
            .map(|r| (r, self.indptr[r + 1] - self.indptr[r]))
            .max_by_key(|&(_, l)| l)
            .unwrap_or((0, 0))
    }

    /// Largest |got - reference| / (Σ|a x| + tiny) over sampled rows of Y = A X.
    fn check(&self, x: &[f32], f: usize, got: &[f32]) -> f64 {
        let step = (self.nrows / CHECKED_ROWS).max(1);
        let rows = (0..self.nrows)
            .step_by(step)
            .chain(std::iter::once(self.longest_row().0));
        let mut worst = 0f64;
        for r in rows.filter(|&r| r < self.nrows) {
            for j in 0..f {
                let (mut sum, mut scale) = (0f64, 0f64);
                for k in self.indptr[r] as usize..self.indptr[r + 1] as usize {
                    let t =
                        f64::from(self.values[k]) * f64::from(x[self.indices[k] as usize * f + j]);
                    sum += t;
                    scale += t.abs();
                }
                worst = worst.max((f64::from(got[r * f + j]) - sum).abs() / (scale + 1e-30));
            }
        }
        worst
    }

    fn compulsory_bytes(&self, f: usize) -> f64 {
        let a = self.indices.len() * 8 + self.indptr.len() * 8;
        (a + (self.ncols + self.nrows) * f * 4) as f64
    }
}

/// cuSPARSE SpMM (CSR ALG2) of one matrix with 32-bit indices on its own stream.
struct Cusparse {
    handle: cs::cusparseHandle_t,
    stream: std::sync::Arc<CudaStream>,
    offsets: CudaSlice<i32>,
    indices: CudaSlice<i32>,
    values: CudaSlice<f32>,
    nrows: usize,
    ncols: usize,
    nnz: usize,
}

fn cs_check(status: cs::cusparseStatus_t, what: &str) -> Result<()> {
    ensure!(
        status == cs::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS,
        "cuSPARSE {what} failed: {status:?}"
    );
    Ok(())
}

impl Cusparse {
    fn new(ctx: &std::sync::Arc<CudaContext>, a: &HostCsr<'_>) -> Result<Cusparse> {
        // SAFETY: only probes whether libcusparse can be dlopened.
        ensure!(
            unsafe { cs::is_culib_present() },
            "libcusparse.so not found (put the nvidia-cusparse wheel's lib on LD_LIBRARY_PATH)"
        );
        ensure!(
            a.indices.len() < i32::MAX as usize,
            "cuSPARSE baseline uses 32-bit indices; nnz {} is too large",
            a.indices.len()
        );
        let stream = ctx.new_stream()?;
        let offsets: Vec<i32> = a.indptr.iter().map(|&p| p as i32).collect();
        let indices: Vec<i32> = a.indices.iter().map(|&c| c as i32).collect();
        let handle = cudarc::cusparse::result::create()
            .map_err(|e| anyhow::anyhow!("cusparseCreate: {e:?}"))?;
        // SAFETY: the handle was just created; the stream belongs to the same (primary) context.
        cs_check(
            unsafe { cs::cusparseSetStream(handle, stream.cu_stream() as cs::cudaStream_t) },
            "SetStream",
        )?;
        Ok(Cusparse {
            handle,
            offsets: stream.clone_htod(&offsets)?,
            indices: stream.clone_htod(&indices)?,
            values: stream.clone_htod(a.values)?,
            stream,
            nrows: a.nrows,
            ncols: a.ncols,
            nnz: a.indices.len(),
        })
    }

    /// Y = A X (ALG2) `reps` times; returns the mean milliseconds per product.
    fn time(&self, x: &DeviceDense, y: &mut DeviceDense, reps: usize) -> Result<f64> {
        let f = x.cols() as i64;
        let (xr, yr) = (x.raw(), y.raw());
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ptr = |s: &CudaSlice<i32>| s.device_ptr(&self.stream).0 as *mut std::ffi::c_void;
        let mut a = std::ptr::null_mut();
        let mut dx = std::ptr::null_mut();
        let mut dy = std::ptr::null_mut();
        let op = cs::cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE;
        let alg = cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG2;
        let r32 = cs::cudaDataType::CUDA_R_32F;
        // SAFETY: every pointer is a live device allocation of the primary context with the
        // sizes given (rows + 1 offsets, nnz indices and values, rows × ld dense matrices);
        // the descriptors are destroyed before returning.
        unsafe {
            cs_check(
                cs::cusparseCreateCsr(
                    &mut a,
                    self.nrows as i64,
                    self.ncols as i64,
                    self.nnz as i64,
                    ptr(&self.offsets),
                    ptr(&self.indices),
                    self.values.device_ptr(&self.stream).0 as *mut _,
                    cs::cusparseIndexType_t::CUSPARSE_INDEX_32I,
                    cs::cusparseIndexType_t::CUSPARSE_INDEX_32I,
                    cs::cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO,
                    r32,
                ),
                "CreateCsr",
            )?;
            let order = cs::cusparseOrder_t::CUSPARSE_ORDER_ROW;
            cs_check(
                cs::cusparseCreateDnMat(
                    &mut dx,
                    xr.rows as i64,
                    f,
                    xr.ld as i64,
                    xr.ptr as *mut _,
                    r32,
                    order,
                ),
                "CreateDnMat X",
            )?;
            cs_check(
                cs::cusparseCreateDnMat(
                    &mut dy,
                    yr.rows as i64,
                    f,
                    yr.ld as i64,
                    yr.ptr as *mut _,
                    r32,
                    order,
                ),
                "CreateDnMat Y",
            )?;
            let scalars: (*const std::ffi::c_void, *const std::ffi::c_void) =
                ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
            let mut size = 0usize;
            cs_check(
                cs::cusparseSpMM_bufferSize(
                    self.handle,
                    op,
                    op,
                    scalars.0,
                    a,
                    dx,
                    scalars.1,
                    dy,
                    r32,
                    alg,
                    &mut size,
                ),
                "SpMM_bufferSize",
            )?;
            let buffer = self.stream.alloc_zeros::<u8>(size.max(1))?;
            let buf = buffer.device_ptr(&self.stream).0 as *mut std::ffi::c_void;
            let run = || {
                cs_check(
                    cs::cusparseSpMM(
                        self.handle,
                        op,
                        op,
                        scalars.0,
                        a,
                        dx,
                        scalars.1,
                        dy,
                        r32,
                        alg,
                        buf,
                    ),
                    "SpMM",
                )
            };
            for _ in 0..WARMUP {
                run()?;
            }
            self.stream.synchronize()?;
            let t = Instant::now();
            for _ in 0..reps {
                run()?;
            }
            self.stream.synchronize()?;
            let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
            cs_check(cs::cusparseDestroyDnMat(dx), "DestroyDnMat")?;
            cs_check(cs::cusparseDestroyDnMat(dy), "DestroyDnMat")?;
            cs_check(cs::cusparseDestroySpMat(a), "DestroySpMat")?;
            drop(buffer);
            Ok(ms)
        }
    }
}

impl Drop for Cusparse {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `new` and is destroyed once.
        let _ = unsafe { cudarc::cusparse::result::destroy(self.handle) };
    }
}

/// Runs `product` `reps` times after warm-up; mean milliseconds and the kernels chosen.
fn time_ours(
    dev: &GpuDevice,
    reps: usize,
    mut product: impl FnMut() -> distspmm_cuda::Result<KernelChoice>,
) -> Result<(f64, KernelChoice)> {
    let mut choice = product()?;
    for _ in 1..WARMUP {
        choice = product()?;
    }
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..reps {
        product()?;
    }
    dev.synchronize()?;
    Ok((t.elapsed().as_secs_f64() * 1e3 / reps as f64, choice))
}

fn describe(c: &KernelChoice) -> String {
    let split = if c.split_kernels.is_some() {
        "row-split"
    } else {
        "row-groups"
    };
    format!(
        "{split} {} lanes {}",
        c.lanes.get(),
        if c.vec4 { "float4" } else { "f32" }
    )
}

#[allow(clippy::too_many_arguments)]
fn report(
    out: &mut String,
    json: &mut String,
    scale: u32,
    op: &str,
    f: usize,
    ours: (f64, KernelChoice),
    cusparse: f64,
    bytes: f64,
    errs: (f64, f64),
) {
    let gbps = bytes / (ours.0 * 1e-3) / 1e9;
    let pct = 100.0 * gbps * 1e9 / ROOFLINE_BYTES_PER_S;
    let _ = writeln!(
        out,
        "  {op} F={f:<4} ours {:8.3} ms ({})  cuSPARSE ALG2 {cusparse:8.3} ms  speed-up {:5.2}x  {gbps:7.1} GB/s = {pct:4.1}% of 4.8 TB/s  max rel err ours {:.1e} cuSPARSE {:.1e}",
        ours.0,
        describe(&ours.1),
        cusparse / ours.0,
        errs.0,
        errs.1
    );
    let _ = writeln!(
        json,
        "{{\"scale\":{scale},\"op\":\"{op}\",\"f\":{f},\"ours_ms\":{:.4},\"cusparse_ms\":{cusparse:.4},\"speedup\":{:.3},\"ours_gbps\":{gbps:.1},\"roofline_pct\":{pct:.2},\"kernels\":\"{}\",\"err_ours\":{:.2e},\"err_cusparse\":{:.2e}}}",
        ours.0,
        cusparse / ours.0,
        describe(&ours.1),
        errs.0,
        errs.1
    );
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dev = GpuDevice::open(0).context("no CUDA device: this benchmark needs a GPU")?;
    let ctx = CudaContext::new(0)?;
    println!(
        "device: {} (sm_{}{})",
        dev.name()?,
        dev.compute_capability()?.0,
        dev.compute_capability()?.1
    );
    let mut json = String::new();
    for &scale in &args.scales {
        let t = Instant::now();
        let g = rmat(scale, args.edge_factor, args.seed)
            .with_context(|| format!("generating RMAT scale {scale}"))?;
        let csr = adjacency(g.num_nodes, &g.src, &g.dst, None, Normalization::Gcn)?;
        let csc = csr.to_csc()?;
        let a = HostCsr {
            nrows: csr.nrows(),
            ncols: csr.ncols(),
            indptr: csr.indptr(),
            indices: csr.indices(),
            values: csr.data(),
        };
        // The CSC of A is the CSR of Aᵀ.
        let at = HostCsr {
            nrows: csc.ncols(),
            ncols: csc.nrows(),
            indptr: csc.indptr(),
            indices: csc.indices(),
            values: csc.data(),
        };
        let da = DeviceCsr::new(&dev, a.parts())?;
        let dat = DeviceCsc::new(
            &dev,
            SparseParts {
                nrows: csr.nrows(),
                ncols: csr.ncols(),
                ..at.parts()
            },
        )?;
        let (cs_a, cs_at) = (Cusparse::new(&ctx, &a)?, Cusparse::new(&ctx, &at)?);
        let mut out = format!(
            "RMAT scale {scale} edge factor {}: {} nodes, {} non-zeros (GCN Â), longest row {}, {} long rows in {} pieces of <= {} ({:.1} s to build)\n",
            args.edge_factor,
            a.nrows,
            a.indices.len(),
            a.longest_row().1,
            da.plan().long_rows().len(),
            da.plan().pieces(),
            da.plan().piece_nnz(),
            t.elapsed().as_secs_f64()
        );
        for &f in &args.features {
            let x: Vec<f32> = (0..a.ncols * f)
                .map(|i| ((i as u64).wrapping_mul(2654435761) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let dx = DeviceDense::from_host(&dev, a.ncols, f, &x)?;
            let mut dy = DeviceDense::zeros(&dev, a.nrows, f)?;
            let ours = time_ours(&dev, args.iters, || {
                spmm_with(Strategy::Auto, 1.0, &da, &dx, 0.0, &mut dy)
            })?;
            let err_ours = a.check(&x, f, &dy.to_host()?);
            let cus = cs_a.time(&dx, &mut dy, args.iters)?;
            let err_cus = a.check(&x, f, &dy.to_host()?);
            report(
                &mut out,
                &mut json,
                scale,
                "csr",
                f,
                ours,
                cus,
                a.compulsory_bytes(f),
                (err_ours, err_cus),
            );

            let mut dyt = DeviceDense::zeros(&dev, at.nrows, f)?;
            let xt = DeviceDense::from_host(&dev, at.ncols, f, &x[..at.ncols * f])?;
            let ours_t = time_ours(&dev, args.iters, || {
                spmm_transpose_with(Strategy::Auto, 1.0, &dat, &xt, 0.0, &mut dyt)
            })?;
            let err_ours_t = at.check(&x, f, &dyt.to_host()?);
            let cus_t = cs_at.time(&xt, &mut dyt, args.iters)?;
            let err_cus_t = at.check(&x, f, &dyt.to_host()?);
            report(
                &mut out,
                &mut json,
                scale,
                "csc",
                f,
                ours_t,
                cus_t,
                at.compulsory_bytes(f),
                (err_ours_t, err_cus_t),
            );
            for (what, err) in [("csr", err_ours), ("csc", err_ours_t)] {
                ensure!(err < 1e-4, "scale {scale} F {f}: our {what} result is off by {err:.2e} relative to the CPU reference");
            }
        }
        print!("{out}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
