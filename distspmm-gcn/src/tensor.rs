//! Tensor-parallel GCN (the seed's `dist_gcn_TP.py`): every rank holds the whole graph and owns a
//! slice of each layer's input *columns*. Per layer, rank r computes `(Â·H[:, cols_r])·W[cols_r, :]`
//! locally and the partial outputs are summed across ranks (one allreduce of `N × out`); the
//! backward pass mirrors it with one allreduce of `N × in` for the input gradient. The parameters
//! are replicated; each rank contributes the weight-gradient rows of its columns.
//!
//! Dropout keys, loss and optimiser are those of the data-parallel model, so both modes optimise
//! the same objective and see the same dropout masks.

use super::dense::{gemm, Op, Shape};
use super::model::{
    count_metrics, len_of, nll_grad, zeros, Adam, Aggregate, DropoutKey, LocalData, Metrics,
    ModelConfig, NonFiniteGradient, Params, Reduce, TRAIN,
};
use anyhow::{ensure, Result};
use std::ops::Range;

/// The columns of a `width`-wide matrix that `rank` of `size` owns (contiguous, balanced).
pub fn column_range(width: usize, rank: usize, size: usize) -> Range<usize> {
    let base = width / size;
    let rem = width % size;
    let start = rank * base + rank.min(rem);
    start..start + base + usize::from(rank < rem)
}

#[derive(Debug)]
struct Layer {
    cols: Range<usize>,
    /// This rank's input columns after dropout (`n × |cols|`).
    input: Vec<f32>,
    /// `Â · input` (`n × |cols|`).
    agg: Vec<f32>,
    /// Pre-activation output (`n × out`), summed over ranks.
    z: Vec<f32>,
    /// Activated output (`n × out`).
    out: Vec<f32>,
}

/// A tensor-parallel GCN on one rank.
#[derive(Debug)]
pub struct TensorGcn {
    /// Hyperparameters.
    pub cfg: ModelConfig,
    /// Parameters (replicated on every rank).
    pub params: Params,
    /// Optimiser state (replicated).
    pub adam: Adam,
    rank: usize,
    dims: Vec<usize>,
    n: usize,
    layers: Vec<Layer>,
    grad: Vec<f32>,
    dz: Vec<f32>,
    scratch: Vec<f32>,
    dh: Vec<f32>,
    train_total: f64,
}

impl TensorGcn {
    /// A fresh model for `rank` of `size` over all `n` nodes.
    pub fn new(
        cfg: ModelConfig,
        n: usize,
        rank: usize,
        size: usize,
        data: &LocalData<'_>,
    ) -> Result<Self> {
        cfg.validate()?;
        let train_total = data
            .masks
            .iter()
            .zip(data.labels)
            .filter(|(&m, &y)| m & TRAIN != 0 && y >= 0)
            .count();
        ensure!(
            train_total > 0,
            "the training mask is empty: nothing to train on"
        );
        // Per layer this rank's input and aggregated columns and the full z and out; three
        // buffers of the widest layer.
        let r = n as u64;
        let share = |width: u64| width.div_ceil(size.max(1) as u64);
        let elements = cfg.elements(
            |fi, fo| {
                r.saturating_mul(
                    share(fi)
                        .saturating_mul(2)
                        .saturating_add(fo.saturating_mul(2)),
                )
            },
            |_| {
                let widest = (cfg.in_dim.max(cfg.hidden).max(cfg.classes)) as u64;
                r.saturating_mul(widest).saturating_mul(3)
            },
        );
        cfg.check_memory(n, elements)?;
        let params = Params::glorot(&cfg)?;
        let dims = cfg.dims();
        let what = "the GCN's activations";
        let layers = (0..cfg.layers)
            .map(|l| {
                let cols = column_range(dims[l], rank, size);
                let w = cols.len();
                Ok(Layer {
                    cols,
                    input: zeros(len_of(n, w, what)?, what)?,
                    agg: zeros(len_of(n, w, what)?, what)?,
                    z: zeros(len_of(n, dims[l + 1], what)?, what)?,
                    out: zeros(len_of(n, dims[l + 1], what)?, what)?,
                })
            })
            .collect::<Result<_>>()?;
        let widest = dims.iter().copied().max().unwrap_or(0);
        let what = "the GCN's gradients";
        Ok(Self {
            adam: Adam::new(params.len())?,
            grad: zeros(params.len(), what)?,
            params,
            rank,
            n,
            layers,
            dz: zeros(len_of(n, widest, what)?, what)?,
            scratch: zeros(len_of(n, widest, what)?, what)?,
            dh: zeros(len_of(n, widest, what)?, what)?,
            dims,
            train_total: train_total as f64,
            cfg,
        })
    }

    fn forward(
        &mut self,
        agg: &mut dyn Aggregate,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
        epoch: u64,
        training: bool,
    ) -> Result<()> {
        let n = self.n;
        for l in 0..self.cfg.layers {
            let (fi, fo) = (self.dims[l], self.dims[l + 1]);
            let key = DropoutKey {
                seed: self.cfg.seed,
                epoch,
                layer: l,
                p: if training { self.cfg.dropout } else { 0.0 },
            };
            let (done, rest) = self.layers.split_at_mut(l);
            let layer = &mut rest[0];
            let src: &[f32] = if l == 0 {
                data.features
            } else {
                &done[l - 1].out
            };
            let w = layer.cols.len();
            key.apply(
                data.original_ids,
                &src[..n * fi],
                fi,
                layer.cols.clone(),
                &mut layer.input,
            );
            let w_rows = &self.params.weight(l)[layer.cols.start * fo..layer.cols.end * fo];
            if w > 0 {
                agg.forward(&layer.input, w, &mut layer.agg)?;
            }
            gemm(
                1.0,
                &layer.agg,
                Shape::new(n, w),
                Op::N,
                w_rows,
                Shape::new(w, fo),
                Op::N,
                0.0,
                &mut layer.z,
                Shape::new(n, fo),
            );
            red.sum_f32(&mut layer.z)?;
            let last = l + 1 == self.cfg.layers;
            let b = self.params.bias(l);
            for (zr, or) in layer
                .z
                .chunks_exact_mut(fo)
                .zip(layer.out.chunks_exact_mut(fo))
            {
                for ((z, o), &bb) in zr.iter_mut().zip(or.iter_mut()).zip(b) {
                    *z += bb;
                    *o = if last { *z } else { z.max(0.0) };
                }
            }
        }
        Ok(())
    }

    /// Evaluates without dropout. Every rank holds every row's logits, so no reduction is needed.
    pub fn evaluate(
        &mut self,
        agg: &mut dyn Aggregate,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
    ) -> Result<Metrics> {
        self.forward(agg, red, data, 0, false)?;
        let last = &self.layers[self.cfg.layers - 1].out;
        Ok(Metrics::from_counts(&count_metrics(
            last,
            self.cfg.classes,
            data.labels,
            data.masks,
        )))
    }

    /// One training step; returns the mean training loss of its forward pass.
    pub fn train_step(
        &mut self,
        agg: &mut dyn Aggregate,
        red: &mut dyn Reduce,
        data: &LocalData<'_>,
        epoch: u64,
    ) -> Result<f64> {
        self.forward(agg, red, data, epoch, true)?;
        let n = self.n;
        let layers = self.cfg.layers;
        let c = self.cfg.classes;
        let counts = count_metrics(&self.layers[layers - 1].out, c, data.labels, data.masks);
        nll_grad(
            &self.layers[layers - 1].out,
            c,
            data.labels,
            data.masks,
            self.train_total,
            &mut self.dz[..n * c],
        );
        self.grad.fill(0.0);
        let mut at = 0;
        let mut offsets = Vec::with_capacity(layers);
        for l in 0..layers {
            offsets.push(at);
            at += self.dims[l] * self.dims[l + 1] + self.dims[l + 1];
        }
        for l in (0..layers).rev() {
            let (fi, fo) = (self.dims[l], self.dims[l + 1]);
            let layer = &self.layers[l];
            let w = layer.cols.len();
            let (gw, rest) = self.grad[offsets[l]..].split_at_mut(fi * fo);
            // Every rank has the full dZ; rank 0 alone contributes the bias gradient so the
            // sum across ranks counts it once.
            if self.rank == 0 {
                for row in self.dz[..n * fo].chunks_exact(fo) {
                    for (g, &v) in rest[..fo].iter_mut().zip(row) {
                        *g += v;
                    }
                }
            }
            let gw_rows = &mut gw[layer.cols.start * fo..layer.cols.end * fo];
            gemm(
                1.0,
                &layer.agg,
                Shape::new(n, w),
                Op::T,
                &self.dz,
                Shape::new(n, fo),
                Op::N,
                0.0,
                gw_rows,
                Shape::new(w, fo),
            );
            if l == 0 {
                continue;
            }
            // d(Â·H_cols) = dZ·W[cols]ᵀ, dH_cols = Âᵀ·that, then through dropout and ReLU; other
            // ranks fill the other columns and one sum assembles the full dZ of the layer below.
            let w_rows = &self.params.weight(l)[layer.cols.start * fo..layer.cols.end * fo];
            gemm(
                1.0,
                &self.dz,
                Shape::new(n, fo),
                Op::N,
                w_rows,
                Shape::new(w, fo),
                Op::T,
                0.0,
                &mut self.scratch,
                Shape::new(n, w),
            );
            let dh_cols = &mut self.dh[..n * w];
            if w > 0 {
                agg.backward(&self.scratch[..n * w], w, dh_cols)?;
            }
            let scale = 1.0 / (1.0 - self.cfg.dropout);
            let prev_z = &self.layers[l - 1].z;
            let dz = &mut self.dz[..n * fi];
            dz.fill(0.0);
            for r in 0..n {
                for (k, c) in layer.cols.clone().enumerate() {
                    let kept = layer.input[r * w + k];
                    let keep = if self.cfg.dropout == 0.0 {
                        1.0
                    } else if kept == 0.0 {
                        0.0
                    } else {
                        scale
                    };
                    dz[r * fi + c] = if prev_z[r * fi + c] > 0.0 {
                        dh_cols[r * w + k] * keep
                    } else {
                        0.0
                    };
                }
            }
            red.sum_f32(dz)?;
        }
        red.sum_f32(&mut self.grad)?;
        let loss = counts[0] / counts[2].max(1.0);
        NonFiniteGradient::check(&self.grad, epoch, loss)?;
        let w0 = self.params.weight(0).len();
        for (g, &w) in self.grad[..w0].iter_mut().zip(self.params.weight(0)) {
            *g += self.cfg.weight_decay * w;
        }
        self.adam
            .step_params(&mut self.params, &self.grad, self.cfg.lr);
        Ok(loss)
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test shapes: every narrowing is exact; f32 rounding is deliberate"
)]
mod tests {
    use super::*;
    use crate::model::testing::{Alone, DenseAgg};
    use crate::model::TEST;
    use crate::nn::net::Net;
    use crate::nn::testing::DenseGraph;
    use crate::nn::Graph;
    use rand::{Rng, SeedableRng};
    use std::sync::{Arc, Barrier, Mutex};

    #[test]
    fn column_ranges_cover_every_column_once() {
        for width in [0, 1, 5, 16, 1433] {
            for size in 1..=6 {
                let mut next = 0;
                for r in 0..size {
                    let c = column_range(width, r, size);
                    assert_eq!(c.start, next);
                    next = c.end;
                }
                assert_eq!(next, width);
            }
        }
    }

    /// Sums across threads through shared memory (test stand-in for a communicator).
    struct ThreadSum {
        rank: usize,
        acc: Arc<Mutex<Vec<f64>>>,
        barrier: Arc<Barrier>,
    }

    impl ThreadSum {
        fn sum(&mut self, buf: &mut [f64]) {
            if self.rank == 0 {
                *self.acc.lock().unwrap() = vec![0.0; buf.len()];
            }
            self.barrier.wait();
            {
                let mut acc = self.acc.lock().unwrap();
                for (a, b) in acc.iter_mut().zip(buf.iter()) {
                    *a += *b;
                }
            }
            self.barrier.wait();
            buf.copy_from_slice(&self.acc.lock().unwrap());
            self.barrier.wait();
        }
    }

    impl Reduce for ThreadSum {
        fn sum_f32(&mut self, buf: &mut [f32]) -> Result<()> {
            let mut wide: Vec<f64> = buf.iter().map(|&v| f64::from(v)).collect();
            self.sum(&mut wide);
            buf.iter_mut().zip(&wide).for_each(|(b, &w)| *b = w as f32);
            Ok(())
        }
        fn sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
            self.sum(buf);
            Ok(())
        }
    }

    #[test]
    fn tensor_parallel_matches_the_single_process_model() {
        let n = 9;
        let in_dim = 7;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let a: Vec<f32> = (0..n * n)
            .map(|_| {
                if rng.random::<f32>() < 0.35 {
                    rng.random_range(0.1..1.0)
                } else {
                    0.0
                }
            })
            .collect();
        let x: Vec<f32> = (0..n * in_dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let labels: Vec<i32> = (0..n as i32).map(|i| i % 3).collect();
        let masks: Vec<u8> = (0..n)
            .map(|i| if i % 3 != 2 { TRAIN } else { TEST })
            .collect();
        let ids: Vec<u64> = (0..n as u64).map(|i| i * 7 + 1).collect();
        let cfg = ModelConfig {
            in_dim,
            hidden: 5,
            classes: 3,
            layers: 2,
            dropout: 0.4,
            lr: 0.02,
            weight_decay: 5e-4,
            seed: 5,
            ..crate::nn::net::tests::test_config(in_dim, 5, 2)
        };
        let data = LocalData {
            features: &x,
            labels: &labels,
            masks: &masks,
            original_ids: &ids,
        };
        let epochs = 15;

        let mut agg = DenseGraph::from_dense(n, &a);
        let train_n = masks.iter().filter(|&&m| m & TRAIN != 0).count() as u64;
        let mut single = Net::new(cfg.clone(), n, agg.edge_count(), train_n).unwrap();
        let want: Vec<f64> = (0..epochs)
            .map(|e| single.train_step(&mut agg, &mut Alone, &data, e).unwrap())
            .collect();

        for size in [1, 2, 3] {
            let acc = Arc::new(Mutex::new(Vec::new()));
            let barrier = Arc::new(Barrier::new(size));
            let losses: Vec<Vec<f64>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..size)
                    .map(|rank| {
                        let (acc, barrier, a, cfg) =
                            (acc.clone(), barrier.clone(), a.clone(), cfg.clone());
                        s.spawn(move || {
                            let mut red = ThreadSum { rank, acc, barrier };
                            let mut agg = DenseAgg { n, a };
                            let mut m = TensorGcn::new(cfg, n, rank, size, &data).unwrap();
                            (0..epochs)
                                .map(|e| m.train_step(&mut agg, &mut red, &data, e).unwrap())
                                .collect()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for rank_losses in &losses {
                for (got, want) in rank_losses.iter().zip(&want) {
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "P={size}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
