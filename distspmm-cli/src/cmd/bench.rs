//! `distspmm bench`: timing runs. `bench spmm` times the CPU SpMM kernels on a graph's
//! normalised adjacency matrix.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use distspmm_prep::graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_sparse::kernel::{self, spmm, spmm_transpose};
use distspmm_sparse::sparse::{DenseView, DenseViewMut, PageBuffer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Time the kernels.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to time.
    #[command(subcommand)]
    pub what: BenchWhat,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchWhat {
    /// CPU SpMM Y = Â·X (or Âᵀ·X from the CSC form with --transpose) on a graph's normalised
    /// adjacency matrix and a random X; prints the median time and GFLOP/s (2·nnz·F flops).
    Spmm(SpmmArgs),
    /// The distributed SpMM under `mpirun -n P` (or --local-ranks P) with the broadcast or
    /// halo schedule; prints the median time per forward and backward call (slowest rank) and
    /// the payload bytes per forward call.
    Dist(super::dist_bench::DistArgs),
}

/// Options of `bench spmm`.
#[derive(Debug, clap::Args)]
pub struct SpmmArgs {
    /// Graph file (.npz PyG layout, .mtx, METIS .graph, edge list).
    #[arg(long)]
    pub input: PathBuf,
    /// Feature columns F of X and Y.
    #[arg(long)]
    pub features: usize,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Multiply by Âᵀ from the CSC form (the backward pass) instead of Â from the CSR form.
    #[arg(long)]
    pub transpose: bool,
    /// Timed repetitions (after one untimed warm-up); the median is reported.
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Normalisation of the adjacency matrix: gcn, row or none.
    #[arg(long, default_value_t = Normalization::Gcn)]
    pub norm: Normalization,
    /// Seed of the random X.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON line instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// Runs the chosen benchmark.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.what {
        BenchWhat::Spmm(a) => run_spmm(a),
        BenchWhat::Dist(a) => super::dist_bench::run(a),
    }
}

fn run_spmm(args: &SpmmArgs) -> anyhow::Result<()> {
    if args.features == 0 {
        bail!("--features must be at least 1");
    }
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1 (or left out for one per core)"),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the worker threads")?;

    let started = Instant::now();
    let g = graph::load(&args.input).context("cannot load the graph")?;
    let values = (g.num_nodes as u64).saturating_mul(args.features as u64);
    distspmm_sparse::memory::check(
        format!(
            "X and Y ({} nodes × --features {})",
            g.num_nodes, args.features
        ),
        values.saturating_mul(8),
        "lower --features",
    )?;
    tracing::info!(
        nodes = g.num_nodes,
        edges = g.num_edges(),
        secs = started.elapsed().as_secs_f64(),
        "graph loaded"
    );
    let a = pool
        .install(|| {
            normalize::adjacency(g.num_nodes, &g.src, &g.dst, g.weights.as_deref(), args.norm)
        })
        .context("cannot build the normalised adjacency matrix")?;
    drop(g);
    let csc = if args.transpose {
        Some(a.to_csc().context("cannot build the CSC form")?)
    } else {
        None
    };
    let (n, f, nnz) = (a.nrows(), args.features, a.nnz());
    tracing::info!(
        nodes = n,
        nnz,
        secs = started.elapsed().as_secs_f64(),
        "matrix built"
    );

    // X and Y on huge pages, as NumPy allocates them for the Python peers.
    let mut x = PageBuffer::<f32>::zeroed(n * f).context("cannot allocate X")?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    x.iter_mut()
        .for_each(|v| *v = rng.random_range(-1.0f32..1.0));
    let mut y = PageBuffer::<f32>::zeroed(n * f).context("cannot allocate Y")?;
    let xv = DenseView::from_row_major(&x[..], n, f)?;

    let mut times = Vec::with_capacity(args.reps);
    for rep in 0..=args.reps {
        let yv = DenseViewMut::from_row_major(&mut y[..], n, f)?;
        let t = Instant::now();
        pool.install(|| match &csc {
            Some(c) => spmm_transpose(1.0, &c.view(), xv, 0.0, yv),
            None => spmm(1.0, &a.view(), xv, 0.0, yv),
        })?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let gflops = 2.0 * nnz as f64 * f as f64 / median / 1e9;
    let isa = kernel::isa().name();
    if args.json {
        let line = serde_json::json!({
            "seconds": median,
            "gflops": gflops,
            "nnz": nnz,
            "nodes": n,
            "features": f,
            "threads": threads,
            "transpose": args.transpose,
            "min_seconds": times[0],
            "reps": args.reps,
            "isa": isa,
        });
        println!("{line}");
    } else {
        println!(
            "spmm {} F={f} threads={threads} nodes={n} nnz={nnz}: median {:.3} ms over {} reps, {gflops:.1} GFLOP/s ({isa})",
            if args.transpose { "CSC (Âᵀ·X)" } else { "CSR (Â·X)" },
            median * 1e3,
            args.reps,
        );
    }
    Ok(())
}
