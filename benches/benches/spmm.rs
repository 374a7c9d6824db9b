//! CPU SpMM: Y = Â·X from the CSR form and Y = Âᵀ·X from the CSC form, on a Cora-sized graph
//! and RMAT graphs of scale 16–18, for F ∈ {16, 64, 256}. Throughput is counted in flops
//! (2 · nnz · F), so criterion's "elem/s" reads as FLOP/s. Threads: rayon's default (one per
//! core; set `RAYON_NUM_THREADS` to change it).
//!
//! `cargo bench -p distspmm-benches --bench spmm` (about two minutes); a filter such as
//! `-- rmat18/csr` runs a part.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use distspmm_benches::{cora_sized_matrix, random_dense, rmat_matrix};
use distspmm_core::kernel::{spmm, spmm_transpose};
use distspmm_core::sparse::CsrOwned;

const FEATURES: [usize; 3] = [16, 64, 256];

fn bench_graph(c: &mut Criterion, name: &str, a: &CsrOwned<f32>) {
    let csc = a.to_csc().expect("square matrices convert");
    let n = a.nrows();
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for f in FEATURES {
        let x = random_dense(n, f, 1);
        let mut y = random_dense(n, f, 2);
        group.throughput(Throughput::Elements(2 * a.nnz() as u64 * f as u64));
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
    bench_graph(c, "cora_sized", &cora_sized_matrix());
    for scale in [16, 17, 18] {
        bench_graph(c, &format!("rmat{scale}"), &rmat_matrix(scale));
    }
}

criterion_group!(benches, spmm_benches);
criterion_main!(benches);
