//! CPU SpMM kernels: `Y = Â·X` from the CSR form (`csr`) and `Y = Âᵀ·X` from the CSC form
//! (`csc_transpose`, the backward pass), for F ∈ {16, 64, 256}, on two graphs at
//! `DISTSPMM_BENCH_SCALE=k`: RMAT of scale 14 + k (power-law degrees, scattered columns; the
//! graph of `distspmm generate rmat --scale S --edge-factor 16 --seed 1`) and a 2-D mesh of
//! 2^16 · 2^k nodes (five entries per row in a narrow band). Throughput is counted in flops
//! (2 · nnz · F), so criterion's "elem/s" reads as FLOP/s. Threads: rayon's default (one per
//! core; set `RAYON_NUM_THREADS` to change it).
//!
//! `cargo criterion -p distspmm-benches --bench spmm` (or `cargo bench`); a filter such as
//! `-- spmm_rmat14/csr` runs a part.

use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use distspmm_benches::{
    describe, flops, gcn_matrix, mesh_graph, mesh_shape, random_dense, rmat_graph, scale,
    RMAT_SCALE,
};
use distspmm_sparse::kernel::{spmm, spmm_transpose};
use distspmm_sparse::sparse::CsrOwned;

const FEATURES: [usize; 3] = [16, 64, 256];

fn bench_graph(c: &mut Criterion, name: &str, a: &CsrOwned<f32>) {
    describe(name, a);
    let csc = a.to_csc().expect("square matrices convert");
    let n = a.nrows();
    let mut group = c.benchmark_group(format!("spmm_{name}"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for f in FEATURES {
        let x = random_dense(n, f, 1);
        let mut y = random_dense(n, f, 2);
        group.throughput(Throughput::Elements(flops(a.nnz(), f)));
        group.bench_with_input(BenchmarkId::new("csr", f), &f, |b, _| {
            b.iter(|| spmm(1.0, &a.view(), x.view(), 0.0, y.view_mut()).expect("shapes match"))
        });
        group.bench_with_input(BenchmarkId::new("csc_transpose", f), &f, |b, _| {
            b.iter(|| {
                spmm_transpose(1.0, &csc.view(), x.view(), 0.0, y.view_mut()).expect("shapes match")
            })
        });
    }
    group.finish();
}

fn spmm_benches(c: &mut Criterion) {
    let k = scale();
    let rmat = RMAT_SCALE + k;
    bench_graph(c, &format!("rmat{rmat}"), &gcn_matrix(&rmat_graph(rmat)));
    let (w, h) = mesh_shape(k);
    bench_graph(c, &format!("mesh{w}x{h}"), &gcn_matrix(&mesh_graph(w, h)));
}

criterion_group!(benches, spmm_benches);
criterion_main!(benches);
