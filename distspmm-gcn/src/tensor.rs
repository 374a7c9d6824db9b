//! Tensor parallelism as a strategy under the layers (the seed's `dist_gcn_TP.py`, for every
//! model): every rank holds the whole graph and every row, and owns a contiguous slice of each
//! layer's input *columns*. A layer computes its column-linear stage (see
//! [`Graph::column_split`]: the part of its forward pass that is linear in its input, e.g.
//! `(Â·x̃[:, cols_r])·W[cols_r, :]` for the GCN) over its slice, and one allreduce of
//! `rows × stage width` sums the slices; the rest of the layer (bias, activation, GIN's second
//! product, GAT's attention) runs on every rank alike. The backward pass mirrors it: each rank
//! forms the weight-gradient rows and the input-gradient columns of its slice, and one allreduce
//! of `rows × in` assembles the input gradient of the layer below.
//!
//! The layers do not know which strategy runs them: [`ColumnSplit`] is a [`Graph`] that passes
//! the graph's calls to the whole graph it wraps and answers the column questions. The model
//! stack ([`crate::nn::net::Net`]) only counts the metrics once (every rank holds every row) and
//! lets rank 0 alone contribute the gradients every rank computes alike.
//!
//! Dropout keys, loss and optimiser are those of data-parallel training, so both modes optimise
//! the same objective and see the same dropout masks.

use std::ops::Range;
use std::time::Instant;

use anyhow::{ensure, Result};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};

use crate::model::{Aggregate, Reduce};
use crate::nn::{EdgeWeights, Graph};

/// The columns of a `width`-wide matrix that `rank` of `size` owns (contiguous, balanced).
pub fn column_range(width: usize, rank: usize, size: usize) -> Range<usize> {
    let size = size.max(1);
    let base = width / size;
    let rem = width % size;
    let start = rank * base + rank.min(rem);
    start..start + base + usize::from(rank < rem)
}

/// A whole graph `G` on one of `ranks` ranks that split every layer's input columns, the sums
/// going through `R` (collective: every rank makes the same calls in the same order).
#[derive(Debug)]
pub struct ColumnSplit<G, R> {
    inner: G,
    red: R,
    rank: usize,
    ranks: usize,
    /// Seconds spent in this split's reductions.
    seconds: f64,
}

impl<G: Graph, R: Reduce> ColumnSplit<G, R> {
    /// Rank `rank` of `ranks` over the whole graph `inner`, summing through `red`.
    ///
    /// # Errors
    /// When `rank` is not below `ranks`.
    pub fn new(inner: G, red: R, rank: usize, ranks: usize) -> Result<Self> {
        ensure!(
            rank < ranks,
            "rank {rank} of a column split over {ranks} ranks"
        );
        Ok(Self {
            inner,
            red,
            rank,
            ranks,
            seconds: 0.0,
        })
    }

    fn sum(&mut self, buf: &mut [f32]) -> Result<()> {
        if self.ranks == 1 {
            return Ok(());
        }
        let t = Instant::now();
        let r = self.red.sum_f32(buf);
        self.seconds += t.elapsed().as_secs_f64();
        r
    }
}

impl<G: Graph, R: Reduce> Aggregate for ColumnSplit<G, R> {
    fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()> {
        self.inner.forward(x, f, y)
    }
    fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()> {
        self.inner.backward(dy, f, dx)
    }
    fn bytes_received(&self) -> u64 {
        self.inner.bytes_received()
    }
    fn bytes_by_direction(&self) -> [u64; 2] {
        self.inner.bytes_by_direction()
    }
}

impl<G: Graph, R: Reduce> Graph for ColumnSplit<G, R> {
    fn rows(&self) -> usize {
        self.inner.rows()
    }
    fn edge_count(&self) -> usize {
        self.inner.edge_count()
    }
    fn edge_weights(&mut self, kind: EdgeWeights) -> Result<&[f32]> {
        self.inner.edge_weights(kind)
    }
    fn edge_ends(&mut self) -> Result<&[(u64, u64)]> {
        self.inner.edge_ends()
    }
    fn spmm_edges_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.inner.spmm_edges_grouped(groups, e, x, y)
    }
    fn spmm_edges_transpose_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.inner.spmm_edges_transpose_grouped(groups, e, dy, dx)
    }
    fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<()> {
        self.inner.sddmm_grouped(groups, u, v, e)
    }
    fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        du: DenseViewMut<'_, f32>,
        dv: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        self.inner.sddmm_backward_grouped(groups, de, u, v, du, dv)
    }
    fn edge_softmax_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.inner.edge_softmax_grouped(groups, slope, logits, out)
    }
    fn edge_softmax_backward_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d: &mut [f32],
    ) -> Result<()> {
        self.inner
            .edge_softmax_backward_grouped(groups, slope, logits, out, d)
    }

    fn column_split(&self) -> Option<(usize, usize)> {
        Some((self.rank, self.ranks))
    }

    fn columns(&self, width: usize) -> Range<usize> {
        column_range(width, self.rank, self.ranks)
    }

    fn sum_columns(&mut self, partial: &mut [f32]) -> Result<()> {
        self.sum(partial)
    }

    /// Each rank places its columns into a zeroed `rows × width` matrix and the sum assembles
    /// them: every entry is one rank's value plus zeros, so the result is exact.
    fn gather_columns(&mut self, width: usize, block: &[f32], dx: &mut [f32]) -> Result<()> {
        let rows = self.rows();
        let cols = self.columns(width);
        let w = cols.len();
        let len = rows * width;
        ensure!(
            block.len() >= rows * w && dx.len() >= len,
            "the input gradient's buffers hold {} and {} values, {} and {len} needed",
            block.len(),
            dx.len(),
            rows * w
        );
        let dx = &mut dx[..len];
        if w == width {
            dx.copy_from_slice(&block[..len]);
        } else {
            dx.fill(0.0);
            if w > 0 {
                for (d, b) in dx.chunks_exact_mut(width).zip(block.chunks_exact(w)) {
                    d[cols.clone()].copy_from_slice(b);
                }
            }
        }
        self.sum(dx)
    }

    fn column_traffic(&self) -> (u64, f64) {
        (self.red.bytes_received(), self.seconds)
    }
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test shapes: every narrowing is exact; f32 rounding is deliberate"
)]
mod tests {
    use super::*;
    use crate::model::testing::Alone;
    use crate::model::{LocalData, ModelKind, TEST, TRAIN};
    use crate::nn::net::Net;
    use crate::nn::testing::DenseGraph;
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
        size: usize,
        acc: Arc<Mutex<Vec<f64>>>,
        barrier: Arc<Barrier>,
    }

    impl ThreadSum {
        /// A group of `size`: the returned function makes rank `r`'s member.
        fn group(size: usize) -> impl Fn(usize) -> ThreadSum {
            let acc = Arc::new(Mutex::new(Vec::new()));
            let barrier = Arc::new(Barrier::new(size));
            move |rank| ThreadSum {
                rank,
                size,
                acc: acc.clone(),
                barrier: barrier.clone(),
            }
        }

        /// Sums in rank order (each rank adds in turn), so every run adds alike.
        fn sum(&mut self, buf: &mut [f64]) {
            if self.rank == 0 {
                *self.acc.lock().unwrap() = vec![0.0; buf.len()];
            }
            self.barrier.wait();
            for turn in 0..self.size {
                if turn == self.rank {
                    let mut acc = self.acc.lock().unwrap();
                    for (a, b) in acc.iter_mut().zip(buf.iter()) {
                        *a += *b;
                    }
                }
                self.barrier.wait();
            }
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

    /// Every model trained with its columns split over 1, 2 and 3 ranks follows the losses of
    /// the same model in one process, and all ranks hold the same parameters.
    #[test]
    fn every_model_split_by_columns_matches_the_single_process_model() {
        let n = 11;
        let in_dim = 7;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let a: Vec<f32> = (0..n * n)
            .map(|_| {
                if rng.random::<f32>() < 0.3 {
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
        let data = LocalData {
            features: &x,
            labels: &labels,
            targets: None,
            masks: &masks,
            original_ids: &ids,
        };
        let train_n = masks.iter().filter(|&&m| m & TRAIN != 0).count() as u64;
        let epochs = 12;
        for model in [
            ModelKind::Gcn,
            ModelKind::Sage,
            ModelKind::Gin,
            ModelKind::Gat,
        ] {
            let cfg = crate::model::ModelConfig {
                model,
                hidden: 5,
                layers: 3,
                dropout: 0.4,
                attn_dropout: if model == ModelKind::Gat { 0.3 } else { 0.0 },
                heads: if model == ModelKind::Gat { 2 } else { 1 },
                out_heads: if model == ModelKind::Gat { 2 } else { 1 },
                train_eps: model == ModelKind::Gin,
                residual: true,
                lr: 0.02,
                weight_decay: 5e-4,
                seed: 5,
                ..crate::nn::net::tests::test_config(in_dim, 5, 3)
            };
            let mut g = DenseGraph::from_dense(n, &a);
            g.ids.clone_from(&ids);
            let mut single = Net::new(cfg.clone(), n, g.edge_count(), train_n).unwrap();
            let want: Vec<f64> = (0..epochs)
                .map(|e| single.train_step(&mut g, &mut Alone, &data, e).unwrap())
                .collect();

            for size in [1, 2, 3] {
                let grads = ThreadSum::group(size);
                let stages = ThreadSum::group(size);
                let runs: Vec<(Vec<f64>, Vec<f32>)> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..size)
                        .map(|rank| {
                            let (mut red, stage_red) = (grads(rank), stages(rank));
                            let (cfg, a, ids) = (cfg.clone(), a.clone(), ids.clone());
                            s.spawn(move || {
                                let mut whole = DenseGraph::from_dense(n, &a);
                                whole.ids = ids;
                                let edges = whole.edge_count();
                                let mut g = ColumnSplit::new(whole, stage_red, rank, size).unwrap();
                                let mut m = Net::new(cfg, n, edges, train_n).unwrap();
                                let losses = (0..epochs)
                                    .map(|e| m.train_step(&mut g, &mut red, &data, e).unwrap())
                                    .collect();
                                let params = m
                                    .params()
                                    .tensors
                                    .into_iter()
                                    .flat_map(|t| t.values)
                                    .collect();
                                (losses, params)
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (rank, (losses, params)) in runs.iter().enumerate() {
                    for (e, (got, want)) in losses.iter().zip(&want).enumerate() {
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{model} P={size} rank {rank} epoch {e}: {got} vs {want}"
                        );
                    }
                    assert_eq!(
                        params, &runs[0].1,
                        "{model} P={size}: rank {rank}'s weights"
                    );
                }
            }
        }
    }

    #[test]
    fn a_rank_outside_the_split_is_refused() {
        let g = DenseGraph::from_dense(2, &[0.0, 1.0, 1.0, 0.0]);
        assert!(ColumnSplit::new(g, Alone, 2, 2).is_err());
    }

    #[test]
    fn gathered_columns_are_the_ranks_blocks_side_by_side() {
        let (n, width, size) = (3, 5, 2);
        let sums = ThreadSum::group(size);
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    let red = sums(rank);
                    s.spawn(move || {
                        let whole = DenseGraph::from_dense(n, &[0.0; 9]);
                        let mut g = ColumnSplit::new(whole, red, rank, size).unwrap();
                        let cols = g.columns(width);
                        let block: Vec<f32> = (0..n)
                            .flat_map(|r| cols.clone().map(move |c| (r * 10 + c) as f32))
                            .collect();
                        let mut dx = vec![f32::NAN; n * width];
                        g.gather_columns(width, &block, &mut dx).unwrap();
                        dx
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<f32> = (0..n)
            .flat_map(|r| (0..width).map(move |c| (r * 10 + c) as f32))
            .collect();
        for dx in got {
            assert_eq!(dx, want);
        }
    }
}
