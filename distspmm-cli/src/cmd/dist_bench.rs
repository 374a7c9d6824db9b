//! `distspmm bench dist`: times the distributed SpMM (one aggregation `Y = Â·X` and its backward
//! `dX = Âᵀ·dY`) under a schedule and a message precision, and reports the payload bytes one
//! forward and one backward call handed to the transport, as counted by a [`Counting`] layer
//! around the communicator (point-to-point and broadcast bytes; the operator's small agreement
//! collectives are not part of the schedule).
//!
//! Every repetition starts after a barrier; a rank's time is its wall time for the call; a
//! repetition's time is the maximum over ranks; the reported time is the median over the
//! repetitions (after one untimed warm-up call in each direction).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use dist_comm::{AllReduce, Communicator, Counting, Group, ReduceOp};
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::{DistSpmm, Precision, RankChunk};
use distspmm_sparse::sparse::{DenseView, DenseViewMut, PageBuffer};

use super::ranks::{self, explain, test_matrix, Launch, RankMain, ScheduleArg};

/// Options of `bench dist`.
#[derive(Debug, clap::Args)]
pub struct DistArgs {
    /// Chunk directory written by `distspmm partition` (run with as many ranks as it has parts).
    #[arg(long)]
    pub chunks: PathBuf,
    /// Feature columns F of X.
    #[arg(long)]
    pub features: usize,
    /// Which schedule to run.
    #[arg(long, value_enum)]
    pub schedule: ScheduleArg,
    /// The format of the messages: f32, bf16 or f16 (rows and partial sums narrowed where
    /// they are sent, widened to f32 where they are received).
    #[arg(long, default_value = "f32", value_parser = ranks::parse_precision)]
    pub comm_precision: Precision,
    /// Timed repetitions per direction; the median is reported.
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Print one JSON line (rank 0) instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// How ranks are formed.
    #[command(flatten)]
    pub launch: Launch,
}

/// Runs `distspmm bench dist`.
pub fn run(args: &DistArgs) -> anyhow::Result<()> {
    if args.reps == 0 {
        anyhow::bail!("--reps must be at least 1");
    }
    // X, Y, dY, dX and the halo buffers of every rank, about N × F together when the ranks
    // share this process (under MPI each rank's share is on its own host).
    if !ranks::under_mpi_launcher() {
        ranks::check_matrix_memory(&args.chunks, args.features, 24, "bench dist")?;
    }
    ranks::launch(&args.launch, &args.chunks, &Bench(args))
}

struct Bench<'a>(&'a DistArgs);

/// A copy of `values` on a huge-page-advised mapping.
fn on_huge_pages(values: &[f32]) -> std::io::Result<PageBuffer<f32>> {
    let mut buffer = PageBuffer::zeroed(values.len())?;
    buffer.copy_from_slice(values);
    Ok(buffer)
}

/// Median of the per-repetition maxima over ranks of `call`'s wall time.
fn time<C: Communicator>(
    comm: &C,
    reps: usize,
    mut call: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut seconds = Vec::with_capacity(reps);
    for _ in 0..reps {
        comm.barrier()?;
        let started = Instant::now();
        call()?;
        let mut slowest = [started.elapsed().as_secs_f64()];
        comm.all_reduce(&mut slowest, ReduceOp::Max)?;
        seconds.push(slowest[0]);
    }
    seconds.sort_by(f64::total_cmp);
    Ok(seconds[seconds.len() / 2])
}

impl RankMain for Bench<'_> {
    fn run<C: Communicator>(&self, comm: &C) -> anyhow::Result<()> {
        let args = self.0;
        let counted = Counting::new(comm);
        let comm = &counted;
        let (f, kind) = (args.features, ScheduleKind::from(args.schedule));
        let (_, chunk) = ranks::load_chunk(comm, &args.chunks)?;
        let view = *chunk.view();
        let (me, n) = (comm.rank(), view.num_local_nodes());
        let first = view.part_offsets()[me];
        let mut op = DistSpmm::with_precision(comm, &chunk, kind, args.comm_precision)
            .map_err(|e| explain(e, &args.chunks))?;
        // X, Y, dY and dX on huge pages, as NumPy allocates them for the Python peer.
        let x = on_huge_pages(&test_matrix(1, first, n, f))?;
        let dy = on_huge_pages(&test_matrix(2, first, n, f))?;
        let (mut y, mut dx) = (PageBuffer::zeroed(n * f)?, PageBuffer::zeroed(n * f)?);
        let mut forward = |op: &mut DistSpmm<&Counting<'_, C>, &RankChunk>| -> anyhow::Result<()> {
            let y = DenseViewMut::from_row_major(&mut y[..], n, f)?;
            op.forward(DenseView::from_row_major(&x[..], n, f)?, y)
                .map_err(|e| explain(e, &args.chunks))
        };
        let before = comm.counts();
        forward(&mut op).context("warm-up forward call")?;
        let bytes = comm.counts().since(&before).schedule();
        let seconds = time(comm, args.reps, || forward(&mut op))?;
        let mut backward = |op: &mut DistSpmm<&Counting<'_, C>, &RankChunk>| -> anyhow::Result<()> {
            let dx = DenseViewMut::from_row_major(&mut dx[..], n, f)?;
            op.backward(DenseView::from_row_major(&dy[..], n, f)?, dx)
                .map_err(|e| explain(e, &args.chunks))
        };
        let before = comm.counts();
        backward(&mut op).context("warm-up backward call")?;
        let bytes_backward = comm.counts().since(&before).schedule();
        let seconds_backward = time(comm, args.reps, || backward(&mut op))?;

        let mut max = [
            bytes.sent,
            bytes.received,
            bytes_backward.sent,
            bytes_backward.received,
        ];
        comm.all_reduce(&mut max, ReduceOp::Max)?;
        if me == 0 {
            let threads = rayon::current_num_threads();
            if args.json {
                let line = serde_json::json!({
                    "schedule": kind.name(),
                    "comm_precision": args.comm_precision.name(),
                    "ranks": comm.size(),
                    "features": f,
                    "seconds": seconds,
                    "seconds_backward": seconds_backward,
                    "max_recv_bytes_per_rank": max[1],
                    "max_send_bytes_per_rank": max[0],
                    "max_recv_bytes_per_rank_backward": max[3],
                    "max_send_bytes_per_rank_backward": max[2],
                    "reps": args.reps,
                    "nodes": view.header().num_global_nodes,
                    "threads_per_rank": threads,
                });
                println!("{line}");
            } else {
                println!(
                    "{} schedule, {} messages, {} ranks × {threads} threads, F = {f}: forward \
                     {:.3} ms, backward {:.3} ms (median of {} over the slowest rank); per \
                     forward call a rank receives at most {} bytes and sends at most {}, per \
                     backward call at most {} and {}",
                    kind.name(),
                    args.comm_precision,
                    comm.size(),
                    seconds * 1e3,
                    seconds_backward * 1e3,
                    args.reps,
                    max[1],
                    max[0],
                    max[3],
                    max[2]
                );
            }
        }
        Ok(())
    }
}
