//! The distributed operator (`DistSpmm`) over the in-process communicator: P ranks as threads
//! of this process, P ∈ {2, 4}, each rank's chunk of a METIS k-way partition of RMAT of scale
//! 14 + `DISTSPMM_BENCH_SCALE`, F = 64, both schedules (`halo`, `broadcast`), forward
//! (`Y = Â·X`) and backward (`dX = Âᵀ·dY`). One measured call is one collective call on every
//! rank: the time runs from rank 0's first call of a batch until every rank has finished the
//! batch. Throughput is the whole product's flops (2 · nnz(Â) · F per call), so criterion's
//! "elem/s" reads as FLOP/s summed over the ranks. The ranks share rayon's pool (one thread per
//! core), as ranks on one machine share its cores.
//!
//! `cargo criterion -p distspmm-benches --bench dist`; `-- dist_rmat14_f64/halo_forward`
//! runs a part.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use chunk_format::ChunkView;
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};
use dist_comm::LocalComm;
use distspmm_benches::{
    chunk_builder, chunk_views, describe, encode_parts, flops, gcn_matrix_with_weights,
    metis_partition, random_dense, rmat_graph, scale, RMAT_SCALE,
};
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::DistSpmm;
use distspmm_sparse::sparse::{Dense, PageBuffer};

const FEATURES: usize = 64;
const PARTS: [u32; 2] = [2, 4];

#[derive(Clone, Copy)]
enum Direction {
    Forward,
    Backward,
}

/// One rank's operator and operands.
struct Rank<'a> {
    op: DistSpmm<&'a LocalComm, ChunkView<'a>>,
    x: Dense<PageBuffer<f32>>,
    y: Dense<PageBuffer<f32>>,
}

impl<'a> Rank<'a> {
    /// Collective: every rank of the group builds its operator together.
    fn new(comm: &'a LocalComm, chunk: ChunkView<'a>, kind: ScheduleKind) -> Self {
        let op = DistSpmm::new(comm, chunk, kind).expect("the ranks' chunks form one partition");
        let n = op.local_rows();
        let seed = 2 * op.rank() as u64;
        Self {
            op,
            x: random_dense(n, FEATURES, seed + 1),
            y: random_dense(n, FEATURES, seed + 2),
        }
    }

    fn run(&mut self, direction: Direction, calls: u64) {
        for _ in 0..calls {
            match direction {
                Direction::Forward => self.op.forward(self.x.view(), self.y.view_mut()),
                Direction::Backward => self.op.backward(self.x.view(), self.y.view_mut()),
            }
            .expect("every rank calls with the same operation and F");
        }
    }
}

/// Benchmarks both directions of one schedule with one rank per chunk: rank 0 on this thread
/// (criterion's), the others on threads that run each batch rank 0 starts.
fn bench_schedule(
    group: &mut BenchmarkGroup<'_, WallTime>,
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
) {
    let parts = views.len();
    let mut comms = LocalComm::group(parts).into_iter();
    let root = comms.next().expect("at least one rank");
    std::thread::scope(|s| {
        // Rank 0's handle lives in this closure: a panic here drops it before the scope joins
        // the other ranks, whose collectives then fail instead of waiting for it.
        let root = root;
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut batches = Vec::with_capacity(parts - 1);
        for (comm, &view) in comms.zip(&views[1..]) {
            let (batch_tx, batch_rx) = mpsc::channel::<(Direction, u64)>();
            batches.push(batch_tx);
            let done = done_tx.clone();
            s.spawn(move || {
                let mut rank = Rank::new(&comm, view, kind);
                while let Ok((direction, calls)) = batch_rx.recv() {
                    rank.run(direction, calls);
                    if done.send(()).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        let mut rank = Rank::new(&root, views[0], kind);
        for (direction, name) in [
            (Direction::Forward, "forward"),
            (Direction::Backward, "backward"),
        ] {
            let id = BenchmarkId::new(format!("{}_{name}", kind.name()), parts);
            group.bench_function(id, |b| {
                b.iter_custom(|calls| {
                    for batch in &batches {
                        batch
                            .send((direction, calls))
                            .expect("the rank threads run");
                    }
                    let started = Instant::now();
                    rank.run(direction, calls);
                    for _ in &batches {
                        done_rx.recv().expect("the rank threads finish their batch");
                    }
                    started.elapsed()
                })
            });
        }
        // Closing the batch channels ends the rank threads.
        drop(batches);
    });
}

fn dist_benches(c: &mut Criterion) {
    let scale = RMAT_SCALE + scale();
    let g = rmat_graph(scale);
    let (a_hat, weights) = gcn_matrix_with_weights(&g);
    let name = format!("rmat{scale}");
    describe(&name, &a_hat);
    let mut group = c.benchmark_group(format!("dist_{name}_f{FEATURES}"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(flops(a_hat.nnz(), FEATURES)));
    for parts in PARTS {
        let partition = metis_partition(&g, parts);
        let chunks = encode_parts(&chunk_builder(&g, &a_hat, &weights, &partition));
        let views = chunk_views(&chunks);
        for kind in ScheduleKind::ALL {
            bench_schedule(&mut group, &views, kind);
        }
    }
    group.finish();
}

criterion_group!(benches, dist_benches);
criterion_main!(benches);
