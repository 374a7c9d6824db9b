//! The per-edge operations of the GAT layer, through the distributed operator at P = 1 (one
//! rank of the in-process communicator: the calls the layer makes, without communication) on
//! RMAT of scale 14 + `DISTSPMM_BENCH_SCALE`, with GAT's default 8 heads of 8 columns. The
//! parameter of each benchmark is the number of heads in the call.
//! - `sddmm/1`, `sddmm/8`: the attention logits `e_ij = s_i + t_j` as the layer computes them,
//!   one grouped SDDMM of width 2 per head (`U_i = [s_i, 1]`, `V_j = [1, t_j]`);
//!   `sddmm_backward/8`: its two gradients (two grouped SpMMs with the per-edge gradient).
//! - `leaky_relu_edge_softmax/1` and its `_backward/1`: the row-wise softmax of one head's
//!   activated logits (slope 0.2; the layer runs it head by head).
//! - `spmm_values/8`, `spmm_values_transpose/8`: the aggregation of the 8 heads' 8 columns
//!   (F = 64) with their attention coefficients, forward and backward.
//!
//! Throughput: flops for the products (2 · nnz · F, F summed over the heads; the SDDMM's
//! backward does two products), bytes of per-edge operands read and written for the softmax
//! (8 per edge forward: logits in, coefficients out; 16 backward: logits, coefficients and
//! their gradient in, the logits' gradient out), so criterion reports GB/s there.
//!
//! `cargo criterion -p distspmm-benches --bench gat`.

use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use dist_comm::LocalComm;
use distspmm_benches::{
    chunk_builder, chunk_views, describe, encode_parts, flops, gcn_matrix_with_weights,
    random_dense, random_values, rmat_graph, scale, RMAT_SCALE,
};
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::DistSpmm;
use distspmm_prep::partition::Partition;
use distspmm_sparse::sparse::{Dense, PageBuffer};

/// GAT's LeakyReLU slope.
const SLOPE: f32 = 0.2;
/// GAT's default heads and columns per head (`distspmm train --model gat`).
const HEADS: usize = 8;
const HEAD_WIDTH: usize = 8;

/// The layer's attention halves for `heads` heads: rows `[s_0, 1, …, s_{H−1}, 1]`
/// (`ones_first = false`) or `[1, t_0, …, 1, t_{H−1}]`.
fn attention_half(n: usize, heads: usize, ones_first: bool, seed: u64) -> Dense<PageBuffer<f32>> {
    let mut m = random_dense(n, 2 * heads, seed);
    let ones = usize::from(!ones_first);
    for i in 0..n {
        for pair in m.row_mut(i).chunks_exact_mut(2) {
            pair[ones] = 1.0;
        }
    }
    m
}

fn gat_benches(c: &mut Criterion) {
    let scale = RMAT_SCALE + scale();
    let g = rmat_graph(scale);
    let (a_hat, weights) = gcn_matrix_with_weights(&g);
    let name = format!("rmat{scale}");
    describe(&name, &a_hat);
    let single = Partition::new(1, vec![0; g.num_nodes], "single part").expect("one part");
    let chunks = encode_parts(&chunk_builder(&g, &a_hat, &weights, &single));
    let views = chunk_views(&chunks);
    let comm = LocalComm::group(1).pop().expect("a group of one rank");
    let mut op = DistSpmm::new(&comm, views[0], ScheduleKind::Halo).expect("one rank agrees");
    let (n, nnz) = (op.local_rows(), op.edge_count());

    let mut group = c.benchmark_group(format!("gat_{name}"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));

    for heads in [1, HEADS] {
        let (u, v) = (
            attention_half(n, heads, false, 1),
            attention_half(n, heads, true, 2),
        );
        let mut logits = vec![0.0f32; heads * nnz];
        group.throughput(Throughput::Elements(flops(nnz, 2 * heads)));
        group.bench_function(BenchmarkId::new("sddmm", heads), |b| {
            b.iter(|| {
                op.sddmm_grouped(heads, u.view(), v.view(), &mut logits)
                    .expect("operands fit")
            })
        });
    }
    let (u, v) = (
        attention_half(n, HEADS, false, 1),
        attention_half(n, HEADS, true, 2),
    );
    let d_logits = random_values(HEADS * nnz, 3);
    let (mut du, mut dv) = (random_dense(n, 2 * HEADS, 4), random_dense(n, 2 * HEADS, 5));
    group.throughput(Throughput::Elements(2 * flops(nnz, 2 * HEADS)));
    group.bench_function(BenchmarkId::new("sddmm_backward", HEADS), |b| {
        b.iter(|| {
            op.sddmm_backward_grouped(
                HEADS,
                &d_logits,
                u.view(),
                v.view(),
                du.view_mut(),
                dv.view_mut(),
            )
            .expect("operands fit")
        })
    });

    let (u1, v1) = (
        attention_half(n, 1, false, 1),
        attention_half(n, 1, true, 2),
    );
    let mut logits = vec![0.0f32; nnz];
    op.sddmm(u1.view(), v1.view(), &mut logits)
        .expect("operands fit");
    let mut alpha = vec![0.0f32; nnz];
    group.throughput(Throughput::Bytes(8 * nnz as u64));
    group.bench_function(BenchmarkId::new("leaky_relu_edge_softmax", 1), |b| {
        b.iter(|| {
            op.leaky_relu_edge_softmax(SLOPE, &logits, &mut alpha)
                .expect("operands fit")
        })
    });
    let d_alpha = random_values(nnz, 6);
    let mut d_in = vec![0.0f32; nnz];
    group.throughput(Throughput::Bytes(16 * nnz as u64));
    group.bench_function(
        BenchmarkId::new("leaky_relu_edge_softmax_backward", 1),
        |b| {
            b.iter(|| {
                op.leaky_relu_edge_softmax_backward(SLOPE, &logits, &alpha, &d_alpha, &mut d_in)
                    .expect("operands fit")
            })
        },
    );

    // Coefficients of every head, each row's summing to 1 as the softmax leaves them.
    let mut coefficients = vec![0.0f32; HEADS * nnz];
    for (h, run) in coefficients.chunks_exact_mut(nnz).enumerate() {
        op.leaky_relu_edge_softmax(SLOPE, &random_values(nnz, 10 + h as u64), run)
            .expect("operands fit");
    }
    let f = HEADS * HEAD_WIDTH;
    let (z, mut out) = (random_dense(n, f, 7), random_dense(n, f, 8));
    group.throughput(Throughput::Elements(flops(nnz, f)));
    group.bench_function(BenchmarkId::new("spmm_values", HEADS), |b| {
        b.iter(|| {
            op.spmm_values_grouped(HEADS, &coefficients, z.view(), out.view_mut())
                .expect("operands fit")
        })
    });
    group.bench_function(BenchmarkId::new("spmm_values_transpose", HEADS), |b| {
        b.iter(|| {
            op.spmm_values_transpose_grouped(HEADS, &coefficients, z.view(), out.view_mut())
                .expect("operands fit")
        })
    });
    group.finish();
}

criterion_group!(benches, gat_benches);
criterion_main!(benches);
