//! `distspmm verify`: runs the distributed forward and backward products with both schedules
//! and compares them with a single-process f64 product of the reassembled Â at rank 0.
//!
//! With `--comm-precision bf16|f16` each exchanged operand (a row of X or dY that crosses
//! ranks, or a partial sum sent back) is rounded once to the format, `v·(1 + δ)` with
//! `|δ| ≤ u` (`2⁻⁸`, `2⁻¹¹`), or by at most half a subnormal step below the format's normals.
//! So an entry may differ from the exact product by `u` times the sum of the absolute values
//! of its terms (the entry of `|Â|·|X|`, a bound on those that cross ranks), plus half a
//! subnormal step per rank, on top of `--tolerance` relative to the largest entry: that is
//! the bound each entry is checked against.

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use chunk_format::dir::ChunkDir;
use dist_comm::{BlockLayout, Communicator, ReduceOp};
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::{DistSpmm, Precision};
use distspmm_prep::chunk::VerifyDir;
use distspmm_sparse::sparse::{CsrOwned, DenseView, DenseViewMut};
use rayon::prelude::*;

use super::ranks::{self, explain, test_matrix, Launch, OnAllRanks, RankMain};

/// Check the distributed SpMM against a single-process product.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chunk directory written by `distspmm partition`.
    #[arg(long)]
    pub chunks: PathBuf,
    /// Feature columns F of the random test matrices X and dY.
    #[arg(long, default_value_t = 16)]
    pub features: usize,
    /// Seed of the test matrices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest accepted error, relative to the largest |entry| of the reference result (with
    /// bf16 or f16 messages, on top of the format's rounding bound).
    #[arg(long, default_value_t = 1e-5)]
    pub tolerance: f64,
    /// The format of the messages: f32, bf16 or f16 (rows and partial sums narrowed where
    /// they are sent, widened to f32 where they are received).
    #[arg(long, default_value = "f32", value_parser = ranks::parse_precision)]
    pub comm_precision: Precision,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    pub json: bool,
    /// How ranks are formed.
    #[command(flatten)]
    pub launch: Launch,
}

/// Runs `distspmm verify`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        anyhow::bail!(
            "--tolerance {} is not a valid tolerance: give a finite number of at least 0 (e.g. \
             1e-5)",
            distspmm_prep::graph::show_float(args.tolerance)
        );
    }
    if args.features == 0 {
        anyhow::bail!("--features must be at least 1");
    }
    // Rank 0 holds X, dY, the gathered products and the f64 references, all N × F: refused
    // before any rank starts.
    ranks::check_matrix_memory(&args.chunks, args.features, 36, "verify")?;
    ranks::launch(&args.launch, &args.chunks, &Verify(args))
}

struct Verify<'a>(&'a Args);

/// The single-process results `Â·X` and `Âᵀ·dY` (f64), computed at rank 0, and for messages
/// in a 16-bit format also `|Â|·|X|` and `|Â|ᵀ·|dY|` (the sums of the terms' magnitudes).
struct Reference {
    y: Vec<f64>,
    dx: Vec<f64>,
    magnitudes: Option<[Vec<f64>; 2]>,
}

impl Reference {
    fn compute(
        dir: &ChunkDir,
        features: usize,
        seed: u64,
        precision: Precision,
    ) -> anyhow::Result<Self> {
        let mut a = dir
            .reassemble()
            .context("cannot reassemble Â from the chunks")?;
        let n = a.nrows();
        let mut x = test_matrix(seed, 0, n, features);
        let mut dy = test_matrix(seed + 1, 0, n, features);
        let (y, dx) = (
            product(&a, &x, features),
            transpose_product(&a, &dy, features),
        );
        let magnitudes = match precision.half() {
            None => None,
            Some(_) => {
                for v in a.data_mut().iter_mut().chain(&mut x).chain(&mut dy) {
                    *v = v.abs();
                }
                Some([
                    product(&a, &x, features),
                    transpose_product(&a, &dy, features),
                ])
            }
        };
        Ok(Self { y, dx, magnitudes })
    }
}

/// `A·X` in f64, one row per task.
fn product(a: &CsrOwned<f32>, x: &[f32], features: usize) -> Vec<f64> {
    let mut y = vec![0f64; a.nrows() * features];
    y.par_chunks_mut(features.max(1))
        .enumerate()
        .for_each(|(i, out)| {
            let (cols, vals) = a.row(i);
            for (&k, &v) in cols.iter().zip(vals) {
                let row = &x[k as usize * features..(k as usize + 1) * features];
                for (o, &xv) in out.iter_mut().zip(row) {
                    *o += f64::from(v) * f64::from(xv);
                }
            }
        });
    y
}

/// `Aᵀ·dY` in f64 by scattering the rows of A.
fn transpose_product(a: &CsrOwned<f32>, dy: &[f32], features: usize) -> Vec<f64> {
    let mut dx = vec![0f64; a.ncols() * features];
    for i in 0..a.nrows() {
        let (cols, vals) = a.row(i);
        let row = &dy[i * features..(i + 1) * features];
        for (&k, &v) in cols.iter().zip(vals) {
            let out = &mut dx[k as usize * features..(k as usize + 1) * features];
            for (o, &g) in out.iter_mut().zip(row) {
                *o += f64::from(v) * f64::from(g);
            }
        }
    }
    dx
}

/// Whether every entry of `got` lies within `tolerance · max |want| + u · magnitude + tiny`
/// of `want` (`magnitude`: the entry's sum of its terms' magnitudes; `(u, tiny)`: the message
/// format's unit roundoff and absolute error below its normals).
fn within_format(
    got: &[f32],
    want: &[f64],
    magnitude: &[f64],
    tolerance: f64,
    (u, tiny): (f64, f64),
) -> bool {
    let scale = want.iter().map(|w| w.abs()).fold(0f64, f64::max);
    got.iter()
        .zip(want)
        .zip(magnitude)
        .all(|((&g, &w), &m)| (f64::from(g) - w).abs() <= tolerance * scale + u * m + tiny)
}

/// `(max |got − want|, that over max |want|)`.
fn errors(got: &[f32], want: &[f64]) -> (f64, f64) {
    let abs = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0f64, f64::max);
    let scale = want.iter().map(|w| w.abs()).fold(0f64, f64::max);
    (abs, if scale > 0.0 { abs / scale } else { abs })
}

/// Gathers every rank's rows (row-major, `features` wide) at rank 0, in rank order; other
/// ranks get an empty vector.
fn gather_at_root<C: Communicator>(
    comm: &C,
    local: &[f32],
    offsets: &[u64],
    features: usize,
) -> anyhow::Result<Vec<f32>> {
    let (ranks, me) = (comm.size(), comm.rank());
    let send: Vec<usize> = (0..ranks)
        .map(|r| if r == 0 { local.len() } else { 0 })
        .collect();
    let recv: Vec<usize> = (0..ranks)
        .map(|r| {
            if me == 0 {
                // A part's size: at most u32::MAX, checked by `ChunkView::parse`.
                distspmm_sparse::index::offset(offsets[r + 1] - offsets[r]) * features
            } else {
                0
            }
        })
        .collect();
    let (send, recv) = (BlockLayout::packed(send), BlockLayout::packed(recv));
    let mut out = vec![0f32; recv.extent()];
    comm.all_to_all_v(local, &send, &mut out, &recv)?;
    Ok(out)
}

/// One compared product.
#[derive(Debug, Clone, serde::Serialize)]
struct Check {
    schedule: &'static str,
    comm_precision: &'static str,
    product: &'static str,
    max_abs_error: f64,
    max_rel_error: f64,
    sent_bytes_max: u64,
    received_bytes_max: u64,
    pass: bool,
}

impl RankMain for Verify<'_> {
    fn run<C: Communicator>(&self, comm: &C) -> anyhow::Result<()> {
        let args = self.0;
        let f = args.features;
        let (dir, chunk) = ranks::load_chunk(comm, &args.chunks)?;
        let view = *chunk.view();
        let offsets = view.part_offsets();
        let (me, n) = (comm.rank(), view.num_local_nodes());
        let reference = if me == 0 {
            Some(Reference::compute(&dir, f, args.seed, args.comm_precision)?)
        } else {
            None
        };
        let x = test_matrix(args.seed, offsets[me], n, f);
        let dy = test_matrix(args.seed + 1, offsets[me], n, f);
        let (mut y, mut dx) = (vec![0f32; n * f], vec![0f32; n * f]);
        // Per schedule and product: max abs error, max rel error (rank 0), bytes (all ranks).
        let mut found = Vec::new();
        for kind in ScheduleKind::ALL {
            let mut op = DistSpmm::with_precision(comm, &chunk, kind, args.comm_precision)
                .map_err(|e| explain(e, &args.chunks))?;
            op.forward(
                DenseView::from_row_major(&x[..], n, f)?,
                DenseViewMut::from_row_major(&mut y[..], n, f)?,
            )
            .map_err(|e| explain(e, &args.chunks))?;
            let forward = op.bytes_last_call();
            op.backward(
                DenseView::from_row_major(&dy[..], n, f)?,
                DenseViewMut::from_row_major(&mut dx[..], n, f)?,
            )
            .map_err(|e| explain(e, &args.chunks))?;
            let backward = op.bytes_last_call();
            for (got, traffic, product) in [(&y, forward, 0), (&dx, backward, 1)] {
                let all = gather_at_root(comm, got, offsets, f)?;
                let (abs, rel, bounded) = match &reference {
                    Some(r) => {
                        let want = if product == 0 { &r.y } else { &r.dx };
                        let (abs, rel) = errors(&all, want);
                        let bounded = match &r.magnitudes {
                            None => rel <= args.tolerance,
                            Some(m) => within_format(
                                &all,
                                want,
                                &m[product],
                                args.tolerance,
                                (
                                    args.comm_precision.unit_roundoff(),
                                    args.comm_precision.subnormal_step() / 2.0 * comm.size() as f64,
                                ),
                            ),
                        };
                        (abs, rel, bounded)
                    }
                    None => (0.0, 0.0, true),
                };
                let mut bytes = [traffic.sent, traffic.received];
                comm.all_reduce(&mut bytes, ReduceOp::Max)?;
                found.push((kind, product, abs, rel, bytes, bounded));
            }
        }
        // Rank 0's verdict, shared so that every rank exits the same way.
        let mut measured: Vec<f64> = found
            .iter()
            .flat_map(|c| [c.2, c.3, if c.5 { 1.0 } else { 0.0 }])
            .collect();
        comm.broadcast(&mut measured, 0)?;
        let checks: Vec<Check> = found
            .iter()
            .zip(measured.chunks_exact(3))
            .map(|(&(kind, product, _, _, bytes, _), e)| Check {
                schedule: kind.name(),
                comm_precision: args.comm_precision.name(),
                product: ["Y = Â·X", "dX = Âᵀ·dY"][product],
                max_abs_error: e[0],
                max_rel_error: e[1],
                sent_bytes_max: bytes[0],
                received_bytes_max: bytes[1],
                pass: e[2] == 1.0,
            })
            .collect();
        let pass = checks.iter().all(|c| c.pass);
        if me == 0 {
            report(args, &checks, comm.size(), offsets[comm.size()], pass);
        }
        if pass {
            Ok(())
        } else {
            Err(OnAllRanks(anyhow!(
                "the distributed products differ from the single-process product by more than \
                 {} relative to the largest entry{} (see the table)",
                args.tolerance,
                match args.comm_precision.half() {
                    None => String::new(),
                    Some(_) => format!(
                        " plus the rounding bound of {} messages",
                        args.comm_precision
                    ),
                }
            ))
            .into())
        }
    }
}

fn report(args: &Args, checks: &[Check], ranks: usize, nodes: u64, pass: bool) {
    if args.json {
        let line = serde_json::json!({
            "chunks": args.chunks.display().to_string(),
            "ranks": ranks,
            "nodes": nodes,
            "features": args.features,
            "tolerance": args.tolerance,
            "comm_precision": args.comm_precision.name(),
            "checks": checks,
            "pass": pass,
        });
        println!("{line}");
        return;
    }
    println!(
        "verify {}: {ranks} ranks, {nodes} nodes, F = {}, {} messages, against a single-process \
         f64 product of the reassembled Â",
        args.chunks.display(),
        args.features,
        args.comm_precision
    );
    println!(
        "{:<10} {:<11} {:>13} {:>13} {:>15} {:>15}",
        "schedule", "product", "max |error|", "relative", "sent B/rank", "received B/rank"
    );
    for c in checks {
        println!(
            "{:<10} {:<11} {:>13.3e} {:>13.3e} {:>15} {:>15}  {}",
            c.schedule,
            c.product,
            c.max_abs_error,
            c.max_rel_error,
            c.sent_bytes_max,
            c.received_bytes_max,
            if c.pass { "ok" } else { "FAILED" }
        );
    }
    println!(
        "{} (tolerance {:e} relative to the largest |entry| of the reference{})",
        if pass {
            "all products agree"
        } else {
            "MISMATCH"
        },
        args.tolerance,
        match args.comm_precision.half() {
            None => String::new(),
            Some(_) => format!(
                ", plus per entry {} × the sum of its terms' magnitudes ({} rounding)",
                args.comm_precision.unit_roundoff(),
                args.comm_precision
            ),
        }
    );
}
