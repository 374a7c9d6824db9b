//! `distspmm partition`: graph file → normalised Â → partition → chunk directory.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::bail;
use distspmm_prep::normalize::Normalization;
use distspmm_prep::partition::{
    AutoOptions, Balance, KaminparOptions, Method, MetisOptions, Objective,
};
use distspmm_prep::prep::{self, Build, Phase, PrepConfig, PrepEvent};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

mod distributed;

/// Partition a graph and write one chunk per part plus a manifest into a directory.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Input graph: .npz (PyG field names), .mtx, METIS .graph, or an edge list (.txt/.tsv/.csv, .gz accepted).
    #[arg(long)]
    input: PathBuf,
    /// Number of parts P (= chunk files = MPI ranks).
    #[arg(long)]
    parts: u32,
    /// Output directory (created if missing). An existing one must hold nothing but an earlier
    /// run's chunk files: it is replaced as a whole, and other files are never touched.
    #[arg(long)]
    out: PathBuf,
    /// Method, seed, imbalance, objective and normalisation.
    #[command(flatten)]
    partitioning: PartitionOptions,
    /// Reuse this saved partition map (e.g. DIR/partition.map of an earlier run) instead of
    /// partitioning again (the map records its method: --method, --seed, --imbalance,
    /// --objective, --threads and --balance do not apply).
    #[arg(long, value_name = "FILE")]
    partition_map: Option<PathBuf>,
    /// Also write the symmetrised graph in METIS .graph format (to compare with gpmetis). An
    /// existing FILE is replaced only with --force (or when the contents are the same), and
    /// never when it is the input graph or the partition map.
    #[arg(long, value_name = "FILE")]
    write_metis_graph: Option<PathBuf>,
    /// Replace a different partition already in the output directory, and an existing
    /// --write-metis-graph file.
    #[arg(long)]
    force: bool,
    /// Print one JSON line instead of the summary (and no progress bars).
    #[arg(long)]
    json: bool,
    /// How the chunks are built: `in-memory` normalises the whole Â at once; `bounded` buckets
    /// the edges by part into files beside --out and holds one part's rows at a time; `auto`
    /// takes in-memory when its estimated working set fits in the available memory.
    #[arg(long, value_enum, default_value_t = BuildArg::Auto)]
    build: BuildArg,
    /// Partition on the ranks of an MPI job (`mpirun -n P distspmm partition --distributed
    /// ...`) with PT-Scotch: each rank reads only its slice of the input (an .npz file or a
    /// directory of .npy files, on a file system every rank reads) and writes its parts'
    /// chunks; --parts may exceed the rank count. --out must be on a file system every rank
    /// writes.
    #[arg(long)]
    distributed: bool,
}

/// How the chunks are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BuildArg {
    /// In memory when it fits, bounded otherwise.
    Auto,
    /// The whole normalised Â in memory, parts built in parallel.
    InMemory,
    /// Edges bucketed by part on disk, one part's rows in memory at a time.
    Bounded,
}

impl From<BuildArg> for Build {
    fn from(arg: BuildArg) -> Self {
        match arg {
            BuildArg::Auto => Build::Auto,
            BuildArg::InMemory => Build::InMemory,
            BuildArg::Bounded => Build::Bounded,
        }
    }
}

/// How a graph is partitioned and normalised: the options `distspmm partition` and
/// `distspmm plan --input` share. The partitioner's options are `Option`s, their defaults
/// applied in [`PartitionOptions::method`], so that an option given for a method that does not
/// use it (or with a saved partition map) is refused instead of ignored.
#[derive(Debug, clap::Args)]
pub struct PartitionOptions {
    /// How nodes are assigned to parts [default: auto].
    #[arg(long, value_enum)]
    pub method: Option<MethodArg>,
    /// Seed for METIS, KaMinPar or the random permutation [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Imbalance tolerance of METIS and KaMinPar: largest part ≤ this × mean part size (1.03 =
    /// METIS ufactor 30; KaMinPar always keeps 1.03, so it accepts 1.03 or more) [default: 1.03].
    #[arg(long)]
    pub imbalance: Option<f64>,
    /// Threads KaMinPar partitions with (default: all cores; with `auto`, when it picks
    /// KaMinPar). Its result is reproducible for a fixed seed only with --threads 1 (more
    /// threads race in its label propagation).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// METIS objective: edge cut or communication volume (`vol` needs --method metis)
    /// [default: cut].
    #[arg(long, value_enum)]
    pub objective: Option<ObjectiveArg>,
    /// Normalisation of Â: gcn (D^-1/2 (A+I) D^-1/2), row (D^-1 (A+I)) or none.
    #[arg(long, default_value = "gcn")]
    pub normalize: Normalization,
    /// What METIS or KaMinPar balances: nodes per part, or non-zeros of Â per part (vertex
    /// weight = degree + 1), which evens out the SpMM work on power-law graphs [default: nodes].
    #[arg(long, value_enum)]
    pub balance: Option<BalanceArg>,
}

/// The seed when --seed is not given.
const DEFAULT_SEED: u64 = 1;
/// The imbalance tolerance when --imbalance is not given.
const DEFAULT_IMBALANCE: f64 = 1.03;

/// What the partitioner balances.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BalanceArg {
    /// Nodes per part.
    Nodes,
    /// Non-zeros of Â per part.
    Nnz,
}

impl PartitionOptions {
    /// The partitioning method these options describe; an error for an option the chosen
    /// method cannot honour (`--objective vol` without METIS, `--threads` without KaMinPar,
    /// `--balance nnz`, `--imbalance` or `--seed` with a method that has no use for them).
    pub fn method(&self) -> anyhow::Result<Method> {
        let method = self.method.unwrap_or(MethodArg::Auto);
        if method == MethodArg::Ptscotch {
            bail!(
                "--method ptscotch partitions on the ranks of an MPI job: run `mpirun -n P \
                 distspmm partition --distributed ...`"
            );
        }
        if matches!(self.objective, Some(ObjectiveArg::Vol)) && !matches!(method, MethodArg::Metis)
        {
            bail!(
                "--objective vol is a METIS objective: add --method metis (KaMinPar and the \
                 default, auto, minimise the edge cut)"
            );
        }
        if self.threads.is_some() && !matches!(method, MethodArg::Kaminpar | MethodArg::Auto) {
            bail!("--threads sets KaMinPar's threads: drop it, or use --method kaminpar");
        }
        if let MethodArg::Contiguous | MethodArg::Random = method {
            let name = method.name();
            if matches!(self.balance, Some(BalanceArg::Nnz)) {
                bail!(
                    "--balance nnz weighs each node by its non-zeros, which only METIS and \
                     KaMinPar do; --method {name} splits the nodes into parts of equal node \
                     counts: use --method kaminpar or --method metis with --balance nnz, or \
                     drop --balance nnz"
                );
            }
            if self.imbalance.is_some() {
                bail!(
                    "--imbalance is a tolerance of METIS and KaMinPar; --method {name} splits \
                     the nodes evenly (parts differ by at most one node): drop --imbalance"
                );
            }
            if self.seed.is_some() && matches!(method, MethodArg::Contiguous) {
                bail!("--method contiguous draws nothing at random: drop --seed");
            }
        }
        let seed = self.seed.unwrap_or(DEFAULT_SEED);
        let imbalance = self.imbalance.unwrap_or(DEFAULT_IMBALANCE);
        let balance = match self.balance {
            None | Some(BalanceArg::Nodes) => Balance::Nodes,
            Some(BalanceArg::Nnz) => Balance::Nonzeros,
        };
        Ok(match method {
            MethodArg::Metis => Method::Metis(MetisOptions {
                seed,
                imbalance,
                objective: match self.objective {
                    None | Some(ObjectiveArg::Cut) => Objective::Cut,
                    Some(ObjectiveArg::Vol) => Objective::Volume,
                },
                balance,
            }),
            MethodArg::Kaminpar => Method::Kaminpar(KaminparOptions {
                seed,
                imbalance,
                threads: self.threads.map_or(0, |t| t as usize),
                balance,
            }),
            MethodArg::Auto => Method::Auto(AutoOptions {
                seed,
                imbalance,
                threads: self.threads.map_or(0, |t| t as usize),
                balance,
            }),
            MethodArg::Contiguous => Method::Contiguous,
            MethodArg::Random | MethodArg::Ptscotch => Method::Random { seed },
        })
    }

    /// The partitioner's options given on the command line (`--method`, `--seed`, …): what a
    /// saved partition map makes moot.
    fn partitioner_options_given(&self) -> Vec<&'static str> {
        [
            ("--method", self.method.is_some()),
            ("--seed", self.seed.is_some()),
            ("--imbalance", self.imbalance.is_some()),
            ("--threads", self.threads.is_some()),
            ("--objective", self.objective.is_some()),
            ("--balance", self.balance.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// Partitioning methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MethodArg {
    /// The default: METIS when the graph's degrees are even (their standard deviation at most
    /// half their mean, isolated nodes left out: meshes, grids, road networks), where it cuts
    /// 10-15% fewer edges than KaMinPar in less time; KaMinPar when they are skewed (power-law
    /// graphs) or the graph is past METIS's size limit. The partition records which ran.
    /// METIS takes about twice KaMinPar's memory per edge: for an even-degree graph near the
    /// machine's memory, choose `kaminpar`.
    Auto,
    /// METIS multilevel k-way (one thread; at most 2^31 - 1 adjacency entries).
    Metis,
    /// KaMinPar deep multilevel k-way (parallel, 64-bit edge ids, about half METIS's memory
    /// per edge).
    Kaminpar,
    /// Contiguous id ranges.
    Contiguous,
    /// Balanced random assignment (a locality-free baseline).
    Random,
    /// PT-Scotch's distributed k-way partitioner, on the ranks of an MPI job: only with
    /// --distributed (which uses it by default).
    Ptscotch,
}

impl MethodArg {
    /// Its name on the command line.
    fn name(self) -> &'static str {
        match self {
            MethodArg::Auto => "auto",
            MethodArg::Metis => "metis",
            MethodArg::Kaminpar => "kaminpar",
            MethodArg::Contiguous => "contiguous",
            MethodArg::Random => "random",
            MethodArg::Ptscotch => "ptscotch",
        }
    }
}

/// METIS objectives.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ObjectiveArg {
    /// Minimise cut edges.
    Cut,
    /// Minimise total communication volume.
    Vol,
}

/// What a phase says on stderr while it runs.
fn phase_message(phase: Phase, from_map: bool, build: Option<Build>) -> &'static str {
    let bounded = build == Some(Build::Bounded);
    match phase {
        Phase::Load => "loading the graph",
        Phase::Partition if from_map => "reading the partition map",
        Phase::Partition => "partitioning",
        Phase::Normalise if bounded => "bucketing the edges by part",
        Phase::Normalise => "normalising Â",
        Phase::Halo if bounded => "normalising part by part and finding the halos",
        Phase::Halo => "renumbering and finding the halos",
        Phase::Chunks => "building and writing chunks",
    }
}

/// The progress bars of a run on stderr: a spinner per phase while it runs, its time when
/// done, and a bar of the chunks written.
struct Bars {
    bars: MultiProgress,
    parts: u32,
    /// The running phase's spinner.
    phase: Option<ProgressBar>,
    /// The chunks written.
    chunks: Option<ProgressBar>,
}

impl Bars {
    fn on(&mut self, event: PrepEvent) {
        match event {
            PrepEvent::PhaseStarted {
                phase,
                from_map,
                build,
            } => {
                let bar = self.bars.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                        .expect("static template")
                        .tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "),
                );
                bar.set_message(phase_message(phase, from_map, build));
                bar.enable_steady_tick(Duration::from_millis(100));
                self.phase = Some(bar);
                if phase == Phase::Chunks {
                    let chunks = self.bars.add(ProgressBar::new(u64::from(self.parts)));
                    chunks.set_style(
                        ProgressStyle::with_template("  {bar:30} {pos}/{len} chunks")
                            .expect("static template"),
                    );
                    self.chunks = Some(chunks);
                }
            }
            PrepEvent::PhaseFinished { seconds, .. } => {
                if let Some(chunks) = self.chunks.take() {
                    chunks.finish_and_clear();
                }
                if let Some(bar) = self.phase.take() {
                    let message = bar.message();
                    bar.set_style(
                        ProgressStyle::with_template("  {msg}").expect("static template"),
                    );
                    bar.finish_with_message(format!("{message}: {seconds:.2} s"));
                }
            }
            PrepEvent::ChunkWritten { .. } => {
                if let Some(chunks) = &self.chunks {
                    chunks.inc(1);
                }
            }
        }
    }
}

/// Bytes as GiB with two decimals.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The phases of a report as `{name: value}`.
fn phases_json(
    report: &prep::PrepReport,
    value: impl Fn(&prep::PhaseReport) -> serde_json::Value,
) -> serde_json::Value {
    report
        .phases
        .iter()
        .map(|p| (p.name.to_string(), value(p)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `phases: load 0.12 s (peak 0.10 GiB), …`.
fn phases_summary(report: &prep::PrepReport) -> String {
    let mut out = String::from("phases:");
    for p in &report.phases {
        out.push_str(&format!(" {} {:.2} s", p.name, p.seconds));
        if let Some(peak) = p.peak_rss {
            out.push_str(&format!(" (peak {})", gib(peak)));
        }
        out.push(',');
    }
    out.pop();
    out
}

impl Args {
    /// The pipeline these arguments describe.
    fn prep_config(&self) -> anyhow::Result<PrepConfig> {
        Ok(PrepConfig {
            input: self.input.clone(),
            parts: self.parts,
            out: self.out.clone(),
            method: self.partitioning.method()?,
            partition_map: self.partition_map.clone(),
            normalization: self.partitioning.normalize,
            build: self.build.into(),
            write_metis_graph: self.write_metis_graph.clone(),
            force: self.force,
            command_line: std::env::args().collect(),
        })
    }
}

/// Runs `distspmm partition`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.distributed {
        return distributed::run(args);
    }
    let show = !args.json && std::io::stderr().is_terminal();
    let bars = Mutex::new(Bars {
        bars: MultiProgress::with_draw_target(if show {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        }),
        parts: args.parts,
        phase: None,
        chunks: None,
    });
    if args.parts == 0 {
        bail!("--parts must be at least 1");
    }
    if let Some(map) = &args.partition_map {
        let given = args.partitioning.partitioner_options_given();
        if !given.is_empty() {
            let them = if given.len() == 1 { "it" } else { "them" };
            bail!(
                "--partition-map reuses the partition saved in {} (the map records the method \
                 that made it), so {} would be ignored: drop {them}, or partition afresh \
                 without --partition-map",
                map.display(),
                given.join(", ")
            );
        }
    }
    let config = args.prep_config()?;
    let report = prep::run(&config, &|event| {
        bars.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .on(event)
    })?;
    let manifest = &report.manifest;
    let seconds = report.seconds;
    let peak_rss = report.peak_rss();
    let halo_rows_max = manifest.halo_rows.iter().copied().max().unwrap_or(0);
    // The SpMM work per rank follows the non-zeros: max over mean (1 = perfect).
    let nnz_max = manifest.chunks.iter().map(|c| c.nnz).max().unwrap_or(0);
    let nnz_imbalance = if manifest.nnz == 0 {
        1.0
    } else {
        nnz_max as f64 * f64::from(manifest.parts) / manifest.nnz as f64
    };
    if args.json {
        let line = serde_json::json!({
            "parts": manifest.parts,
            "nodes": manifest.nodes,
            "edges": manifest.edges,
            "nnz": manifest.nnz,
            "method": manifest.partition_method,
            "edge_cut": manifest.edge_cut,
            "max_imbalance": manifest.max_imbalance,
            "nnz_imbalance": nnz_imbalance,
            "halo_rows_max": halo_rows_max,
            "build": report.build.name(),
            "seconds": seconds,
            "phase_seconds": phases_json(&report, |p| serde_json::json!(p.seconds)),
            "phase_peak_rss_bytes": phases_json(&report, |p| serde_json::json!(p.peak_rss)),
            "peak_rss_bytes": peak_rss,
        });
        println!("{line}");
    } else {
        let bytes: u64 = manifest.chunks.iter().map(|c| c.bytes).sum();
        println!(
            "{}: {} nodes, {} edges ({} non-zeros in Â, {} normalisation)",
            args.input.display(),
            manifest.nodes,
            manifest.edges,
            manifest.nnz,
            manifest.normalization
        );
        println!(
            "{} parts by {}: edge cut {}, max imbalance {:.3} in nodes, {nnz_imbalance:.3} in non-zeros, halo rows per part max {} (total {})",
            manifest.parts,
            manifest.partition_method,
            manifest.edge_cut,
            manifest.max_imbalance,
            halo_rows_max,
            manifest.halo_rows.iter().sum::<u64>()
        );
        println!(
            "wrote {} chunks ({:.1} MiB) and the manifest into {} in {seconds:.2} s",
            manifest.chunks.len(),
            bytes as f64 / (1024.0 * 1024.0),
            args.out.display()
        );
        match peak_rss {
            Some(peak) => println!("{}; peak memory {}", phases_summary(&report), gib(peak)),
            None => println!("{}", phases_summary(&report)),
        }
    }
    Ok(())
}
