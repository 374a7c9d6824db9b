//! `mpirun -n P distspmm partition --distributed`: the ranks partition a graph none of them
//! holds whole, with PT-Scotch (64-bit), and write one chunk directory together.
//!
//! The pipeline is `distspmm_prep::prep::distributed::run`; this module gives it PT-Scotch as
//! the partitioner and turns its report into the summary or the `--json` line.

use anyhow::{bail, Context};
use dist_comm::{Group, MpiComm};
use distspmm_prep::partition::{Balance, DistAdjacency};
use distspmm_prep::prep::distributed::{self as dist, DistPartitioner, DistPrepConfig};

use super::{gib, Args, BalanceArg, MethodArg};

/// Refuses the options `--distributed` cannot honour, before MPI starts.
fn check_options(args: &Args) -> anyhow::Result<()> {
    let o = &args.partitioning;
    if !matches!(o.method, None | Some(MethodArg::Ptscotch)) {
        bail!(
            "--distributed partitions with PT-Scotch on the ranks: drop --method or give \
             --method ptscotch (the other methods run on one machine, without --distributed)"
        );
    }
    if o.threads.is_some() || o.objective.is_some() {
        bail!("--threads and --objective are KaMinPar's and METIS's: drop them with --distributed");
    }
    if args.partition_map.is_some() || args.write_metis_graph.is_some() {
        bail!(
            "--partition-map and --write-metis-graph need the whole graph on one machine: \
             drop them with --distributed"
        );
    }
    Ok(())
}

/// PT-Scotch as the pipeline's partitioner.
struct PtScotch<'c> {
    comm: &'c MpiComm,
    options: distspmm_ptscotch::Options,
    balance: Balance,
}

impl DistPartitioner for PtScotch<'_> {
    fn tag(&self) -> String {
        format!(
            "ptscotch:seed={}:imbalance={}:ranks={}{}",
            self.options.seed,
            distspmm_prep::graph::show_float(self.options.imbalance),
            self.comm.size(),
            match self.balance {
                Balance::Nodes => "",
                Balance::Nonzeros => ":balance=nnz",
            }
        )
    }

    fn partition(
        &mut self,
        graph: &DistAdjacency,
        weights: Option<&[u64]>,
        parts: u32,
    ) -> Result<(Vec<u32>, u64), String> {
        let mut dist_graph =
            distspmm_ptscotch::DistGraph::new(&graph.vtxdist, &graph.xadj, &graph.adjncy);
        if let Some(w) = weights {
            dist_graph = dist_graph.with_vertex_weights(w);
        }
        let parts = parts as usize;
        let options = distspmm_ptscotch::Options {
            parts,
            ..self.options
        };
        let of_nodes = distspmm_ptscotch::partition(self.comm, &dist_graph, &options)
            .map_err(|e| format!("PT-Scotch: {e}"))?;
        let quality = distspmm_ptscotch::evaluate(self.comm, &dist_graph, &of_nodes, parts)
            .map_err(|e| format!("PT-Scotch's partition: {e}"))?;
        Ok((of_nodes, quality.edge_cut))
    }
}

/// Runs the distributed partition under `mpirun`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    check_options(args)?;
    let comm = MpiComm::init().context("cannot initialise MPI")?;
    match run_ranks(args, &comm) {
        Ok(()) => Ok(()),
        // Every step agreed: every rank holds an error.
        Err(err) => crate::cmd::ranks::fail_under_mpi(comm, &err, true),
    }
}

fn run_ranks(args: &Args, comm: &MpiComm) -> anyhow::Result<()> {
    let o = &args.partitioning;
    let balance = match o.balance {
        None | Some(BalanceArg::Nodes) => Balance::Nodes,
        Some(BalanceArg::Nnz) => Balance::Nonzeros,
    };
    let config = DistPrepConfig {
        input: args.input.clone(),
        parts: args.parts,
        out: args.out.clone(),
        normalization: o.normalize,
        balance,
        force: args.force,
        command_line: std::env::args().collect(),
    };
    let mut ptscotch = PtScotch {
        comm,
        options: distspmm_ptscotch::Options {
            seed: o.seed.unwrap_or(super::DEFAULT_SEED),
            imbalance: o.imbalance.unwrap_or(super::DEFAULT_IMBALANCE),
            ..distspmm_ptscotch::Options::new(args.parts as usize)
        },
        balance,
    };
    let report = dist::run(comm, &config, &mut ptscotch)?;
    let Some(manifest) = &report.manifest else {
        return Ok(());
    };
    let busiest = |p: &dist::DistPhaseReport| p.peak_rss.iter().copied().max().unwrap_or(0);
    let halo_rows_max = manifest.halo_rows.iter().copied().max().unwrap_or(0);
    if args.json {
        let map = |value: &dyn Fn(&dist::DistPhaseReport) -> serde_json::Value| {
            report
                .phases
                .iter()
                .map(|p| (p.phase.name().to_string(), value(p)))
                .collect::<serde_json::Map<_, _>>()
        };
        let line = serde_json::json!({
            "parts": manifest.parts,
            "ranks": report.ranks,
            "nodes": manifest.nodes,
            "edges": manifest.edges,
            "nnz": manifest.nnz,
            "method": manifest.partition_method,
            "edge_cut": manifest.edge_cut,
            "max_imbalance": manifest.max_imbalance,
            "halo_rows_max": halo_rows_max,
            "build": "distributed",
            "seconds": report.seconds,
            "phase_seconds": map(&|p| serde_json::json!(p.seconds)),
            "phase_peak_rss_bytes": map(&|p| serde_json::json!(busiest(p))),
            "phase_peak_rss_bytes_sum": map(&|p| serde_json::json!(p.peak_rss.iter().sum::<u64>())),
            "phase_bytes_per_nnz_per_rank": map(&|p| serde_json::json!(report.bytes_per_nnz_per_rank(p))),
            "peak_rss_bytes": report.phases.iter().map(busiest).max(),
            "counted_bytes_rank0": {
                "partition": report.steps.partition,
                "exchange": report.steps.exchange,
                "rows": report.steps.rows,
            },
        });
        println!("{line}");
    } else {
        println!(
            "{}: {} nodes, {} edges ({} non-zeros in Â, {} normalisation), read by {} ranks",
            args.input.display(),
            manifest.nodes,
            manifest.edges,
            manifest.nnz,
            manifest.normalization,
            report.ranks
        );
        println!(
            "{} parts by {}: edge cut {}, max imbalance {:.3} in nodes, halo rows per part max \
             {halo_rows_max}",
            manifest.parts, manifest.partition_method, manifest.edge_cut, manifest.max_imbalance
        );
        println!(
            "wrote {} chunks and the manifest into {} in {:.2} s",
            manifest.chunks.len(),
            args.out.display(),
            report.seconds
        );
        let mut line = String::from("phases (busiest rank's peak memory):");
        for p in &report.phases {
            line.push_str(&format!(
                " {} {:.2} s ({}),",
                p.phase.name(),
                p.seconds,
                gib(busiest(p))
            ));
        }
        line.pop();
        println!("{line}");
    }
    Ok(())
}
