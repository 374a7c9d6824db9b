//! The `distspmm` command line: generate graphs, partition them into chunks, inspect chunks,
//! plan and benchmark the distributed SpMM, verify it, train a GNN and predict with it.

mod cmd;

use clap::{Parser, Subcommand};

/// Distributed sparse × dense products and GCN training over partitioned graphs.
#[derive(Debug, Parser)]
#[command(name = "distspmm", version, about, propagate_version = true)]
struct Cli {
    /// More log output (-v info, -vv debug); `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train a GNN (GCN, GraphSAGE, GIN, GAT): data-parallel over chunks (the distributed SpMM)
    /// or tensor-parallel (every layer's input columns split across ranks).
    Train(cmd::train::Args),
    /// Predict with a trained model's checkpoint: accuracy on each mask, and logits,
    /// probabilities, labels or a layer's input as .npy files in the graph's node order.
    Predict(cmd::predict::Args),
    /// Generate a synthetic graph (RMAT or CSBM) as .npz.
    Generate(cmd::generate::Args),
    /// Partition a graph and write one chunk file per rank plus a manifest.
    Partition(cmd::partition::Args),
    /// Summarise and validate a chunk file or a chunk directory.
    Inspect(cmd::inspect::Args),
    /// Benchmarks: time the CPU SpMM kernels (`bench spmm`) and the distributed SpMM.
    Bench(cmd::bench::Args),
    /// Check the distributed SpMM (both schedules, forward and backward) against a
    /// single-process product; run under `mpirun -n P` or with --local-ranks P.
    Verify(cmd::verify::Args),
    /// Dry run without MPI: per-rank memory and bytes per layer for each schedule, and the
    /// P×P communication matrix as an SVG heatmap.
    Plan(cmd::plan::Args),
    /// Check a chunk directory, the MPI installation and the hosts before a run: each check
    /// ok, warn or fail with a fix; non-zero exit if any fails.
    Doctor(cmd::doctor::Args),
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Restores the default SIGPIPE action, so `distspmm plan | head` ends quietly like other
/// command-line tools instead of failing a `println!` with a broken pipe.
fn default_sigpipe() {
    // SAFETY: called first thing in `main`, before any other thread exists; `signal` with
    // `SIG_DFL` only changes this process's disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> std::process::ExitCode {
    default_sigpipe();
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result: anyhow::Result<()> = match cli.command {
        Command::Train(args) => cmd::train::run(&args),
        Command::Predict(args) => cmd::predict::run(&args),
        Command::Generate(args) => cmd::generate::run(&args),
        Command::Partition(args) => cmd::partition::run(&args),
        Command::Inspect(args) => cmd::inspect::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Verify(args) => cmd::verify::run(&args),
        Command::Plan(args) => cmd::plan::run(&args),
        Command::Doctor(args) => cmd::doctor::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", cmd::message(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
