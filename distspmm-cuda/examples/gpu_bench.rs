//! Times our CSR (`spmm`) and CSC (`spmm_transpose`) kernels against cuSPARSE SpMM at its
//! strongest — every CSR algorithm (`CUSPARSE_SPMM_CSR_ALG1`, `ALG2`, `ALG3`) with row-major and
//! with column-major dense operands, `cusparseSpMM_preprocess` for ALG1 and ALG3 (the algorithms
//! it speeds up), 32-bit indices; the fastest configuration that cuSPARSE supports is the peer —
//! on Graph500 RMAT graphs, checks every result against a CPU reference on sampled rows, and
//! measures the device's copy bandwidth.
//!
//! ```text
//! cargo run --release -p distspmm-cuda --features bench --example gpu_bench -- \
//!     [--scales 18,20] [--features 16,64,256] [--edge-factor 16] [--seed 1] [--iters 20] [--json FILE]
//! ```
//!
//! * CSR: Y = Â X with Â the GCN-normalised adjacency of the (symmetric) RMAT graph.
//! * CSC: Y = Âᵀ X with Â that of the directed RMAT graph of the same scale (so Âᵀ ≠ Â): ours
//!   from the CSC of Â, cuSPARSE from the same arrays as the CSR of Âᵀ.
//!
//! Bandwidth is reported against the compulsory traffic of one product — A once (8 bytes per
//! non-zero plus 8 per row pointer), X once, Y written once — over the H200's 4.8 TB/s and over
//! the copy bandwidth measured here (device-to-device copy of a 4 GiB buffer, read + write
//! counted). Random gathers re-read rows of X, so this is a lower bound on the bytes moved.

#![allow(
    clippy::cast_possible_truncation,
    reason = "benchmark sizes: graph sizes checked against i32 for cuSPARSE, flags parsed from small numbers"
)]

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context as _, Result};
use cudarc::cusparse::sys as cs;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use distspmm_cuda::{
    spmm_transpose_with, spmm_with, DeviceCsc, DeviceCsr, DeviceDense, GpuDevice, KernelChoice,
    RawDense, SparseParts, Strategy,
};
use distspmm_prep::graph::generate::{rmat, rmat_directed};
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{adjacency, Normalization};
use distspmm_sparse::sparse::CsrOwned;

/// The H200's HBM3e bandwidth by its datasheet, bytes per second.
const ROOFLINE_BYTES_PER_S: f64 = 4.8e12;
const WARMUP: usize = 3;
/// Rows checked against the CPU reference per product (plus the longest row).
const CHECKED_ROWS: usize = 256;
/// f32 elements of each buffer of the copy-bandwidth measurement (4 GiB).
const COPY_ELEMS: usize = 1 << 30;
/// Timed copies.
const COPY_REPS: usize = 10;

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

/// A host CSR borrowed from distspmm-sparse's matrices.
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

    /// Largest |got(r, j) - reference| / (Σ|a x| + tiny) over sampled rows of Y = A X.
    fn check(&self, x: &[f32], f: usize, got: impl Fn(usize, usize) -> f32) -> f64 {
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
                worst = worst.max((f64::from(got(r, j)) - sum).abs() / (scale + 1e-30));
            }
        }
        worst
    }

    fn compulsory_bytes(&self, f: usize) -> f64 {
        let a = self.indices.len() * 8 + self.indptr.len() * 8;
        (a + (self.ncols + self.nrows) * f * 4) as f64
    }
}

/// A cuSPARSE SpMM configuration.
#[derive(Clone, Copy, Debug)]
struct Config {
    alg: cs::cusparseSpMMAlg_t,
    /// Whether `cusparseSpMM_preprocess` runs once before the timed calls.
    preprocess: bool,
    /// Dense operands column-major (X and Y transposed in memory) rather than row-major.
    col_major: bool,
}

impl Config {
    fn name(&self) -> String {
        let alg = match self.alg {
            cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG1 => "ALG1",
            cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG2 => "ALG2",
            cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG3 => "ALG3",
            _ => "other",
        };
        format!(
            "{alg}/{}{}",
            if self.col_major { "col" } else { "row" },
            if self.preprocess { "+pre" } else { "" }
        )
    }
}

/// Every CSR algorithm in both dense layouts; preprocessing where cuSPARSE documents a gain.
fn configs() -> Vec<Config> {
    let algs = [
        (cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG1, true),
        (cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG2, false),
        (cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_CSR_ALG3, true),
    ];
    let mut v = Vec::new();
    for col_major in [false, true] {
        for (alg, preprocess) in algs {
            v.push(Config {
                alg,
                preprocess,
                col_major,
            });
        }
    }
    v
}

/// cuSPARSE SpMM of one matrix with 32-bit indices on its own stream.
struct Cusparse {
    handle: cs::cusparseHandle_t,
    stream: Arc<CudaStream>,
    offsets: CudaSlice<i32>,
    indices: CudaSlice<i32>,
    values: CudaSlice<f32>,
    nrows: usize,
    ncols: usize,
    nnz: usize,
}

/// Why a configuration has no time: cuSPARSE refused a call of it (recorded, the benchmark goes
/// on), or the driver failed (the benchmark stops).
enum Refusal {
    Status(&'static str, cs::cusparseStatus_t),
    Failed(anyhow::Error),
}

fn cs_call(status: cs::cusparseStatus_t, what: &'static str) -> Result<(), Refusal> {
    if status == cs::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Refusal::Status(what, status))
    }
}

impl From<cudarc::driver::DriverError> for Refusal {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Refusal::Failed(e.into())
    }
}

/// Descriptors destroyed when dropped.
struct Descriptors {
    a: cs::cusparseSpMatDescr_t,
    x: cs::cusparseDnMatDescr_t,
    y: cs::cusparseDnMatDescr_t,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by cuSPARSE and is destroyed once.
        unsafe {
            if !self.x.is_null() {
                let _ = cs::cusparseDestroyDnMat(self.x);
            }
            if !self.y.is_null() {
                let _ = cs::cusparseDestroyDnMat(self.y);
            }
            if !self.a.is_null() {
                let _ = cs::cusparseDestroySpMat(self.a);
            }
        }
    }
}

impl Cusparse {
    fn new(ctx: &Arc<CudaContext>, a: &HostCsr<'_>) -> Result<Cusparse> {
        // SAFETY: only probes whether libcusparse can be dlopened.
        let present = unsafe { cs::is_culib_present() };
        ensure!(
            present,
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
        let set = unsafe { cs::cusparseSetStream(handle, stream.cu_stream() as cs::cudaStream_t) };
        ensure!(
            set == cs::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS,
            "cusparseSetStream: {set:?}"
        );
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

    /// Y = A X with `cfg` `reps` times after warm-up (and preprocessing, when `cfg` asks);
    /// returns the mean milliseconds per product. `x` and `y` are the row-major operands, or
    /// for a column-major configuration their transposes (`F × rows`, row-major).
    fn time(
        &self,
        cfg: Config,
        f: usize,
        x: RawDense,
        y: RawDense,
        reps: usize,
    ) -> Result<f64, Refusal> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ptr = |s: &CudaSlice<i32>| s.device_ptr(&self.stream).0 as *mut std::ffi::c_void;
        let op = cs::cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE;
        let r32 = cs::cudaDataType::CUDA_R_32F;
        let (order, xld, yld) = if cfg.col_major {
            (
                cs::cusparseOrder_t::CUSPARSE_ORDER_COL,
                self.ncols,
                self.nrows,
            )
        } else {
            (cs::cusparseOrder_t::CUSPARSE_ORDER_ROW, x.ld, y.ld)
        };
        let mut d = Descriptors {
            a: std::ptr::null_mut(),
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
        };
        let scalars: (*const std::ffi::c_void, *const std::ffi::c_void) =
            ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
        // SAFETY: every pointer is a live device allocation of the primary context with the
        // sizes given (rows + 1 offsets, nnz indices and values, the dense operands holding
        // `ld` × (F or rows) elements in the chosen order); the descriptors are destroyed on
        // drop, after the stream has been synchronised.
        unsafe {
            cs_call(
                cs::cusparseCreateCsr(
                    &mut d.a,
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
            cs_call(
                cs::cusparseCreateDnMat(
                    &mut d.x,
                    self.ncols as i64,
                    f as i64,
                    xld as i64,
                    x.ptr as *mut _,
                    r32,
                    order,
                ),
                "CreateDnMat X",
            )?;
            cs_call(
                cs::cusparseCreateDnMat(
                    &mut d.y,
                    self.nrows as i64,
                    f as i64,
                    yld as i64,
                    y.ptr as *mut _,
                    r32,
                    order,
                ),
                "CreateDnMat Y",
            )?;
            let mut size = 0usize;
            cs_call(
                cs::cusparseSpMM_bufferSize(
                    self.handle,
                    op,
                    op,
                    scalars.0,
                    d.a,
                    d.x,
                    scalars.1,
                    d.y,
                    r32,
                    cfg.alg,
                    &mut size,
                ),
                "SpMM_bufferSize",
            )?;
            let buffer = self.stream.alloc_zeros::<u8>(size.max(1))?;
            let buf = buffer.device_ptr(&self.stream).0 as *mut std::ffi::c_void;
            if cfg.preprocess {
                cs_call(
                    cs::cusparseSpMM_preprocess(
                        self.handle,
                        op,
                        op,
                        scalars.0,
                        d.a,
                        d.x,
                        scalars.1,
                        d.y,
                        r32,
                        cfg.alg,
                        buf,
                    ),
                    "SpMM_preprocess",
                )?;
            }
            let run = || {
                cs_call(
                    cs::cusparseSpMM(
                        self.handle,
                        op,
                        op,
                        scalars.0,
                        d.a,
                        d.x,
                        scalars.1,
                        d.y,
                        r32,
                        cfg.alg,
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

/// Device-to-device copy bandwidth (read + write counted) of a `COPY_ELEMS`-float buffer:
/// (best, mean) GB/s over `COPY_REPS` copies, each timed alone.
fn copy_bandwidth(ctx: &Arc<CudaContext>) -> Result<(f64, f64)> {
    let stream = ctx.new_stream()?;
    let src = stream.alloc_zeros::<f32>(COPY_ELEMS)?;
    let mut dst = stream.alloc_zeros::<f32>(COPY_ELEMS)?;
    for _ in 0..2 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    stream.synchronize()?;
    let bytes = 2.0 * 4.0 * COPY_ELEMS as f64;
    let (mut best, mut total) = (0f64, 0f64);
    for _ in 0..COPY_REPS {
        let t = Instant::now();
        stream.memcpy_dtod(&src, &mut dst)?;
        stream.synchronize()?;
        let s = t.elapsed().as_secs_f64();
        best = best.max(bytes / s / 1e9);
        total += s;
    }
    Ok((best, bytes * COPY_REPS as f64 / total / 1e9))
}

/// Each cuSPARSE configuration's name and (ms, max relative error), or why it does not count.
type PeerTimes = Vec<(String, Result<(f64, f64), String>)>;

/// One product's measurements.
struct Case<'a> {
    scale: u32,
    op: &'a str,
    f: usize,
    ours: (f64, KernelChoice),
    err_ours: f64,
    peers: PeerTimes,
    bytes: f64,
}

fn report(out: &mut String, json: &mut String, c: &Case<'_>, copy_gbps: f64) -> Result<()> {
    let best = c
        .peers
        .iter()
        .filter_map(|(n, r)| r.as_ref().ok().map(|&(ms, err)| (n.as_str(), ms, err)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .context("cuSPARSE supported none of the configurations")?;
    let gbps = c.bytes / (c.ours.0 * 1e-3) / 1e9;
    let pct = 100.0 * gbps * 1e9 / ROOFLINE_BYTES_PER_S;
    let pct_copy = 100.0 * gbps / copy_gbps;
    let peers: Vec<String> = c
        .peers
        .iter()
        .map(|(n, r)| match r {
            Ok((ms, _)) => format!("{n} {ms:.3}"),
            Err(why) => format!("{n} n/a ({why})"),
        })
        .collect();
    let _ = writeln!(
        out,
        "  {} F={:<4} ours {:8.3} ms ({})  best cuSPARSE {} {:8.3} ms  speed-up {:5.2}x  {gbps:7.1} GB/s = {pct:4.1}% of 4.8 TB/s = {pct_copy:4.1}% of copy  max rel err ours {:.1e} cuSPARSE {:.1e}\n      cuSPARSE ms: {}",
        c.op,
        c.f,
        c.ours.0,
        describe(&c.ours.1),
        best.0,
        best.1,
        best.1 / c.ours.0,
        c.err_ours,
        best.2,
        peers.join(", ")
    );
    let all: Vec<String> = c
        .peers
        .iter()
        .map(|(n, r)| match r {
            Ok((ms, err)) => format!("\"{n}\":{{\"ms\":{ms:.4},\"err\":{err:.2e}}}"),
            Err(why) => format!("\"{n}\":{{\"refused\":\"{why}\"}}"),
        })
        .collect();
    let _ = writeln!(
        json,
        "{{\"scale\":{},\"op\":\"{}\",\"f\":{},\"ours_ms\":{:.4},\"best_cusparse\":\"{}\",\"best_cusparse_ms\":{:.4},\"speedup\":{:.3},\"ours_gbps\":{gbps:.1},\"roofline_pct\":{pct:.2},\"copy_gbps\":{copy_gbps:.1},\"copy_pct\":{pct_copy:.2},\"kernels\":\"{}\",\"err_ours\":{:.2e},\"cusparse\":{{{}}}}}",
        c.scale,
        c.op,
        c.f,
        c.ours.0,
        best.0,
        best.1,
        best.1 / c.ours.0,
        describe(&c.ours.1),
        c.err_ours,
        all.join(",")
    );
    Ok(())
}

/// X of `rows × f` (row-major) and its transpose (`f × rows`, row-major), by a fixed formula.
fn operand(rows: usize, f: usize) -> (Vec<f32>, Vec<f32>) {
    let val = |i: usize| ((i as u64).wrapping_mul(2654435761) % 1000) as f32 / 500.0 - 1.0;
    let x: Vec<f32> = (0..rows * f).map(val).collect();
    let mut xt = vec![0f32; rows * f];
    for j in 0..f {
        for i in 0..rows {
            xt[j * rows + i] = x[i * f + j];
        }
    }
    (x, xt)
}

/// Times every cuSPARSE configuration on `a`, checking each result (a configuration whose result
/// is off by 1e-4 relative or more is reported, not counted as the peer).
fn peers(
    dev: &GpuDevice,
    cus: &Cusparse,
    a: &HostCsr<'_>,
    f: usize,
    (x, xt): (&[f32], &[f32]),
    reps: usize,
) -> Result<PeerTimes> {
    let dx = DeviceDense::from_host(dev, a.ncols, f, x)?;
    let dxt = DeviceDense::from_host(dev, f, a.ncols, xt)?;
    let mut out = Vec::new();
    for cfg in configs() {
        // A fresh output per configuration, so a result is never left over from another.
        let y = if cfg.col_major {
            DeviceDense::zeros(dev, f, a.nrows)?
        } else {
            DeviceDense::zeros(dev, a.nrows, f)?
        };
        let xin = if cfg.col_major { dxt.raw() } else { dx.raw() };
        let result = match cus.time(cfg, f, xin, y.raw(), reps) {
            Ok(ms) => {
                let host = y.to_host()?;
                let err = if cfg.col_major {
                    a.check(x, f, |r, j| host[j * a.nrows + r])
                } else {
                    a.check(x, f, |r, j| host[r * f + j])
                };
                if err < 1e-4 {
                    Ok((ms, err))
                } else {
                    Err(format!("wrong result: max rel err {err:.1e}"))
                }
            }
            Err(Refusal::Status(call, status)) => Err(format!("{call}: {status:?}")),
            Err(Refusal::Failed(e)) => return Err(e.context(cfg.name())),
        };
        out.push((cfg.name(), result));
    }
    Ok(out)
}

/// The GCN-normalised adjacency of `g`.
fn normalised(g: &Graph) -> Result<CsrOwned<f32>> {
    Ok(adjacency(
        g.num_nodes,
        &g.src,
        &g.dst,
        None,
        Normalization::Gcn,
    )?)
}

fn host(csr: &CsrOwned<f32>) -> HostCsr<'_> {
    HostCsr {
        nrows: csr.nrows(),
        ncols: csr.ncols(),
        indptr: csr.indptr(),
        indices: csr.indices(),
        values: csr.data(),
    }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dev = GpuDevice::open(0).context("no CUDA device: this benchmark needs a GPU")?;
    let ctx = CudaContext::new(0)?;
    let cc = dev.compute_capability()?;
    println!("device: {} (sm_{}{})", dev.name()?, cc.0, cc.1);
    let (copy_best, copy_mean) = copy_bandwidth(&ctx)?;
    println!(
        "device-to-device copy of {} GiB: best {copy_best:.1} GB/s, mean {copy_mean:.1} GB/s over {COPY_REPS} copies (read + write counted); the best is the reference below",
        (COPY_ELEMS * 4) >> 30
    );
    let mut json = format!(
        "{{\"copy_gbps_best\":{copy_best:.1},\"copy_gbps_mean\":{copy_mean:.1},\"copy_bytes\":{}}}\n",
        COPY_ELEMS * 4
    );
    for &scale in &args.scales {
        let t = Instant::now();
        let g = rmat(scale, args.edge_factor, args.seed)
            .with_context(|| format!("generating RMAT scale {scale}"))?;
        let csr = normalised(&g)?;
        drop(g);
        let gd = rmat_directed(scale, args.edge_factor, args.seed)
            .with_context(|| format!("generating the directed RMAT scale {scale}"))?;
        let directed = normalised(&gd)?;
        drop(gd);
        let csc = directed.to_csc()?;
        let a = host(&csr);
        // The CSC of the directed Â is the CSR of Âᵀ.
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
                nrows: directed.nrows(),
                ncols: directed.ncols(),
                ..at.parts()
            },
        )?;
        let (cs_a, cs_at) = (Cusparse::new(&ctx, &a)?, Cusparse::new(&ctx, &at)?);
        let mut out = format!(
            "RMAT scale {scale} edge factor {}: {} nodes; CSR (symmetric, GCN Â): {} non-zeros, longest row {}, {} long rows in {} pieces of <= {}; CSC (directed, GCN Â): {} non-zeros, longest column {} ({:.1} s to build)\n",
            args.edge_factor,
            a.nrows,
            a.indices.len(),
            a.longest_row().1,
            da.plan().long_rows().len(),
            da.plan().pieces(),
            da.plan().piece_nnz(),
            at.indices.len(),
            at.longest_row().1,
            t.elapsed().as_secs_f64()
        );
        for &f in &args.features {
            for (op, m) in [("csr", &a), ("csc", &at)] {
                let (x, xt) = operand(m.ncols, f);
                let dx = DeviceDense::from_host(&dev, m.ncols, f, &x)?;
                let mut dy = DeviceDense::zeros(&dev, m.nrows, f)?;
                let ours = if op == "csr" {
                    time_ours(&dev, args.iters, || {
                        spmm_with(Strategy::Auto, 1.0, &da, &dx, 0.0, &mut dy)
                    })?
                } else {
                    time_ours(&dev, args.iters, || {
                        spmm_transpose_with(Strategy::Auto, 1.0, &dat, &dx, 0.0, &mut dy)
                    })?
                };
                let got = dy.to_host()?;
                let err_ours = m.check(&x, f, |r, j| got[r * f + j]);
                ensure!(
                    err_ours < 1e-4,
                    "scale {scale} F {f}: our {op} result is off by {err_ours:.2e} relative to the CPU reference"
                );
                let cus = if op == "csr" { &cs_a } else { &cs_at };
                let case = Case {
                    scale,
                    op,
                    f,
                    ours,
                    err_ours,
                    peers: peers(&dev, cus, m, f, (&x, &xt), args.iters)?,
                    bytes: m.compulsory_bytes(f),
                };
                report(&mut out, &mut json, &case, copy_best)?;
            }
        }
        print!("{out}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
