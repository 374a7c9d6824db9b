//! An epoch's kernels timed in isolation: the yardstick of "an epoch at the speed of its
//! kernels" (`distspmm train --isolated-kernels`, [`crate::Config::isolated_kernels`]).
//!
//! During the last epoch (training step and evaluation) the trainer logs every aggregation
//! call ([`SpmmCall`]: direction, width, operand lengths, logged by the trainer's clocking
//! wrapper around its [`Aggregate`]) and every dense product ([`Product`], logged by
//! [`par::gemm_rows`] and [`par::gemm_tn_sum`] themselves, so the log cannot drift from what
//! the model calls). After training, each distinct call is replayed on fresh operands of the
//! same shapes through the same code: the trainer's own `Aggregate` (the same operator, on
//! the same thread pool) and the same `par` routine with no epilogue. One untimed call, then
//! `reps` timed ones; the median counts, once for every time the epoch made that call.
//!
//! The sum leaves out everything that is not an SpMM or a GEMM (the fused epilogues, dropout,
//! softmax/NLL, bias gradients, Adam, allreduces), so it is a floor that the epoch cannot
//! reach: `epoch_over_sum` is at least 1 up to noise.

use crate::model::{len_of, zeros, Aggregate};
use crate::par::{self, Product};
use crate::sparse_input::SparseInput;
use anyhow::Result;
use std::time::Instant;

/// One aggregation call of the epoch, as the model made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpmmCall {
    /// `Âᵀ·dY` (backward) rather than `Â·X`.
    pub backward: bool,
    /// Feature columns of the operands.
    pub width: usize,
    /// Length of the input slice (`rows · width`).
    pub x_len: usize,
    /// Length of the output slice.
    pub y_len: usize,
}

impl std::fmt::Display for SpmmCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows = self.y_len / self.width.max(1);
        let (op, input) = if self.backward {
            ("Âᵀ", "dY")
        } else {
            ("Â", "X")
        };
        write!(f, "{op}·{input}[{rows}x{}]", self.width)
    }
}

/// One distinct kernel call of the epoch, timed in isolation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelTime {
    /// `spmm` or `gemm`.
    pub kernel: &'static str,
    /// The call's operation and shapes, e.g. `Â·X[2708x16]` or `A[2708x1433]·W[1433x16]`.
    pub what: String,
    /// How many times the epoch made this call.
    pub count: usize,
    /// Median seconds of one call in isolation.
    pub seconds: f64,
    /// Fastest of the timed calls, seconds.
    pub min_seconds: f64,
    /// GFLOP/s at the median (`2·n·k·m` flops; dense products only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
}

/// The last epoch's SpMM and GEMM calls timed in isolation, beside the median epoch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IsolatedKernels {
    /// Timed repetitions of each distinct call (after one untimed call).
    pub reps: usize,
    /// `Σ count · median` over the epoch's aggregation calls, seconds.
    pub spmm_seconds: f64,
    /// `Σ count · median` over the epoch's dense products, seconds.
    pub gemm_seconds: f64,
    /// `spmm_seconds + gemm_seconds`.
    pub sum_seconds: f64,
    /// The run's median epoch over `sum_seconds` (the target: at most 1.5).
    pub epoch_over_sum: f64,
    /// Every distinct call, SpMMs first, each in the order the epoch first made it.
    pub calls: Vec<KernelTime>,
}

impl IsolatedKernels {
    /// Adds up the timed calls and sets them beside `epoch_seconds`.
    pub fn new(reps: usize, calls: Vec<KernelTime>, epoch_seconds: f64) -> Self {
        let total = |kernel: &str| {
            calls
                .iter()
                .filter(|c| c.kernel == kernel)
                .map(|c| c.count as f64 * c.seconds)
                .sum::<f64>()
        };
        let (spmm_seconds, gemm_seconds) = (total("spmm"), total("gemm"));
        let sum_seconds = spmm_seconds + gemm_seconds;
        Self {
            reps,
            spmm_seconds,
            gemm_seconds,
            sum_seconds,
            epoch_over_sum: epoch_seconds / sum_seconds,
            calls,
        }
    }
}

/// The distinct elements of `calls` in first-call order, each with its number of occurrences.
fn distinct<T: PartialEq + Copy>(calls: &[T]) -> Vec<(T, usize)> {
    let mut out: Vec<(T, usize)> = Vec::new();
    for &c in calls {
        match out.iter_mut().find(|(d, _)| *d == c) {
            Some((_, n)) => *n += 1,
            None => out.push((c, 1)),
        }
    }
    out
}

/// One untimed call of `f`, then `reps` timed calls: `(median, minimum)` seconds.
fn median_time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[0]))
}

/// Values in `[-1, 1)` (a fixed integer hash of the index), so that no operand is all zeros.
fn operand(len: usize, salt: u32, what: &str) -> Result<Vec<f32>> {
    let mut v = zeros(len, what)?;
    v.iter_mut().enumerate().for_each(|(i, x)| {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "deliberate: a hash of the index's low 32 bits"
        )]
        let h = (i as u32 ^ salt).wrapping_mul(0x9E37_79B1).rotate_left(13);
        *x = (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
    });
    Ok(v)
}

/// A sparse `n × k` input with `nnz` stored entries spread evenly over the rows (at spread
/// columns of each row, values as [`operand`]'s), as [`SparseInput`] holds it for an `m`-wide
/// product: the replay of a [`Product::SparseRows`] or [`Product::SparseTnSum`].
fn sparse_operand(n: usize, k: usize, m: usize, nnz: usize, what: &str) -> Result<SparseInput> {
    let mut x = zeros(len_of(n, k, what)?, what)?;
    let values = operand(nnz, 2, what)?;
    let mut at = 0;
    for (r, row) in x.chunks_exact_mut(k.max(1)).enumerate() {
        let count = nnz / n + usize::from(r < nnz % n);
        for j in 0..count {
            // Distinct columns (count ≤ k), shifted per row; a zero value would not be stored.
            row[(j * k / count + r) % k] = if values[at] == 0.0 { 0.5 } else { values[at] };
            at += 1;
        }
    }
    SparseInput::build(&x, n, k, m)?.ok_or_else(|| {
        anyhow::anyhow!("the replay of a sparse product ({n}x{k}, {nnz} stored) is not sparse here")
    })
}

/// Input and output buffers long enough for every call in `calls`: allocated before any
/// replay, so that a refused allocation is found before the first (collective) call.
pub fn spmm_buffers(calls: &[SpmmCall]) -> Result<(Vec<f32>, Vec<f32>)> {
    let x = calls.iter().map(|c| c.x_len).max().unwrap_or(0);
    let y = calls.iter().map(|c| c.y_len).max().unwrap_or(0);
    let what = "the isolated SpMM operands";
    Ok((operand(x, 1, what)?, zeros(y, what)?))
}

/// Replays each distinct aggregation call of `calls` through `agg` (collective for a
/// distributed `agg`: every rank made the same calls, so every rank replays the same sequence).
pub fn time_spmm<A: Aggregate + ?Sized>(
    agg: &mut A,
    calls: &[SpmmCall],
    reps: usize,
    (x, y): (&[f32], &mut [f32]),
) -> Result<Vec<KernelTime>> {
    distinct(calls)
        .into_iter()
        .map(|(c, count)| {
            let (x, y) = (&x[..c.x_len], &mut y[..c.y_len]);
            let (seconds, min_seconds) = median_time(reps, || {
                if c.backward {
                    agg.backward(x, c.width, y)
                } else {
                    agg.forward(x, c.width, y)
                }
            })?;
            Ok(KernelTime {
                kernel: "spmm",
                what: c.to_string(),
                count,
                seconds,
                min_seconds,
                gflops: None,
            })
        })
        .collect()
}

/// Replays each distinct product of `products` on fresh operands of its shapes through the
/// `par` routine the trainer called, with no epilogue (local to this rank).
pub fn time_gemm(products: &[Product], reps: usize) -> Result<Vec<KernelTime>> {
    let what = "the isolated GEMM operands";
    distinct(products)
        .into_iter()
        .map(|(p, count)| {
            let (seconds, min_seconds) = match p {
                Product::Rows { n, k, m, op_w } => {
                    let a = operand(len_of(n, k, what)?, 2, what)?;
                    let w = operand(len_of(k, m, what)?, 3, what)?;
                    let mut c = zeros(len_of(n, m, what)?, what)?;
                    median_time(reps, || {
                        par::gemm_rows(&a, n, k, &w, op_w, m, &mut c, &mut [], 0, |_, _, _| {});
                        Ok(())
                    })?
                }
                Product::TnSum { n, k, m } => {
                    let a = operand(len_of(n, k, what)?, 4, what)?;
                    let b = operand(len_of(n, m, what)?, 5, what)?;
                    let mut out = zeros(len_of(k, m, what)?, what)?;
                    let mut partials = zeros(len_of(par::blocks(n), k * m, what)?, what)?;
                    median_time(reps, || {
                        par::gemm_tn_sum(&a, k, &b, m, n, &mut out, &mut partials);
                        Ok(())
                    })?
                }
                Product::SparseRows { n, k, m, nnz } => {
                    let mut x = sparse_operand(n, k, m, nnz, what)?;
                    let w = operand(len_of(k, m, what)?, 3, what)?;
                    let mut c = zeros(len_of(n, m, what)?, what)?;
                    median_time(reps, || {
                        x.product(None, &w, m, &mut c);
                        Ok(())
                    })?
                }
                Product::SparseTnSum { n, k, m, nnz } => {
                    let mut x = sparse_operand(n, k, m, nnz, what)?;
                    let b = operand(len_of(n, m, what)?, 5, what)?;
                    let mut out = zeros(len_of(k, m, what)?, what)?;
                    x.keep_all();
                    median_time(reps, || {
                        anyhow::ensure!(x.tn_sum(&b, m, &mut out), "the operand is finite");
                        Ok(())
                    })?
                }
            };
            Ok(KernelTime {
                kernel: "gemm",
                what: p.to_string(),
                count,
                seconds,
                min_seconds,
                gflops: Some(p.flops() / seconds / 1e9),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::Op;
    use crate::model::testing::Alone;
    use crate::model::{LocalData, ModelConfig, TRAIN};
    use crate::nn::net::Net;
    use crate::nn::testing::DenseGraph;
    use crate::nn::Graph;

    #[test]
    fn an_epochs_products_are_logged_and_replayed_with_their_counts() {
        let n = 300;
        let (in_dim, hidden, classes) = (4, 8, 3);
        let a: Vec<f32> = (0..n * n)
            .map(|i| if i % 7 == 0 { 0.1 } else { 0.0 })
            .collect();
        let mut graph = DenseGraph::from_dense(n, &a);
        let x: Vec<f32> = (0..n * in_dim).map(|i| (i % 5) as f32).collect();
        let labels: Vec<i32> = (0..i32::try_from(n).unwrap()).map(|i| i % 3).collect();
        let masks = vec![TRAIN; n];
        let ids: Vec<u64> = (0..n as u64).collect();
        let data = LocalData {
            features: &x,
            labels: &labels,
            targets: None,
            masks: &masks,
            original_ids: &ids,
        };
        let cfg = ModelConfig {
            in_dim,
            hidden,
            classes,
            layers: 2,
            dropout: 0.5,
            lr: 0.01,
            weight_decay: 0.0,
            seed: 1,
            ..crate::nn::net::tests::test_config(in_dim, hidden, 2)
        };
        let mut model = Net::new(cfg, n, graph.edge_count(), n as u64).unwrap();
        // The first evaluation fills the cache of Â·X; the recorded epoch is a later one.
        model.evaluate(&mut graph, &mut Alone, &data).unwrap();
        graph.calls.clear();
        par::start_recording();
        model.train_step(&mut graph, &mut Alone, &data, 1).unwrap();
        model.evaluate(&mut graph, &mut Alone, &data).unwrap();
        let products = par::stop_recording();
        assert!(par::stop_recording().is_empty(), "recording stopped");
        let spmm = |backward, width| SpmmCall {
            backward,
            width,
            x_len: n * width,
            y_len: n * width,
        };
        // Layer 0 aggregates first (4 ≤ 8), layer 1 transforms first (8 > 3); the evaluation
        // reuses Â·X and so aggregates only at layer 1.
        assert_eq!(
            graph.calls,
            [
                spmm(false, 4),
                spmm(false, 3),
                spmm(true, 3),
                spmm(false, 3)
            ]
        );
        let rows = |k, m, op_w| Product::Rows { n, k, m, op_w };
        assert_eq!(
            products,
            [
                rows(4, 8, Op::N),
                rows(8, 3, Op::N),
                Product::TnSum { n, k: 8, m: 3 },
                rows(3, 8, Op::T),
                Product::TnSum { n, k: 4, m: 8 },
                rows(4, 8, Op::N),
                rows(8, 3, Op::N),
            ]
        );
        let recorded = graph.calls.clone();
        let (x, mut y) = spmm_buffers(&recorded).unwrap();
        let mut calls = time_spmm(&mut graph, &recorded, 3, (&x, &mut y)).unwrap();
        calls.extend(time_gemm(&products, 3).unwrap());
        let counts: Vec<_> = calls.iter().map(|c| (c.kernel, c.count)).collect();
        assert_eq!(
            counts,
            [
                ("spmm", 1),
                ("spmm", 2),
                ("spmm", 1),
                ("gemm", 2),
                ("gemm", 2),
                ("gemm", 1),
                ("gemm", 1),
                ("gemm", 1)
            ]
        );
        assert_eq!(calls[1].what, "Â·X[300x3]");
        assert_eq!(calls[2].what, "Âᵀ·dY[300x3]");
        assert_eq!(calls[6].what, "A[300x3]·W[8x3]ᵀ");
        assert!(calls
            .iter()
            .all(|c| c.seconds > 0.0 && c.min_seconds <= c.seconds));
        let sum = IsolatedKernels::new(3, calls, 1.0);
        let want: f64 = sum.calls.iter().map(|c| c.count as f64 * c.seconds).sum();
        assert!((sum.sum_seconds - want).abs() < 1e-12);
        assert!((sum.spmm_seconds + sum.gemm_seconds - sum.sum_seconds).abs() < 1e-12);
        assert!((sum.epoch_over_sum - 1.0 / sum.sum_seconds).abs() < 1e-9);
    }
}
