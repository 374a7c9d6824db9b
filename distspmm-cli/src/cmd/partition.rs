//! `distspmm partition`: graph file → normalised Â → partition → chunk directory.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use distspmm_core::chunk::{
    write_chunk_dir, BoundedBuilder, ChunkBuilder, ChunkDirError, DirLock, EdgeBuckets, Manifest,
    ParkedEdges, PartChunkBuilder, WriteOptions,
};
use distspmm_core::normalize::{self, Normalization};
use distspmm_core::partition::{
    Adjacency, AutoOptions, Balance, KaminparOptions, Method, MetisOptions, Objective, Partition,
    PartitionError,
};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

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

/// Bytes per non-zero of Â (counted as edges + nodes) that the in-memory build is taken to hold
/// at its peak: 24.5–26.4 measured on RMAT-22 at P = 4 (docs/performance.md, "The RMAT-22
/// targets on a quiet machine"; 32.8 before the writer stopped reading chunks back), rounded up
/// for features, node data and more skewed parts.
const IN_MEMORY_BYTES_PER_NNZ: u64 = 40;

impl BuildArg {
    /// The builder to use for a graph of `nodes` and `edges`: `auto` takes the in-memory one
    /// when its estimated working set fits in half of `available` (or `available` is unknown).
    fn resolve(self, nodes: usize, edges: usize, available: Option<u64>) -> BuildArg {
        match self {
            BuildArg::Auto => {
                let need = IN_MEMORY_BYTES_PER_NNZ.saturating_mul((nodes + edges) as u64);
                match available {
                    Some(a) if need > a / 2 => BuildArg::Bounded,
                    _ => BuildArg::InMemory,
                }
            }
            other => other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BuildArg::Auto => "auto",
            BuildArg::InMemory => "in-memory",
            BuildArg::Bounded => "bounded",
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
            MethodArg::Random => Method::Random { seed },
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

/// Splits the graph into `parts` parts with `method`: every subcommand that partitions calls
/// this. KaMinPar runs through distspmm-kaminpar when this binary has it (feature `kaminpar`);
/// every other method is distspmm-core's.
pub fn partition_graph(
    adjacency: &Adjacency,
    parts: u32,
    method: &Method,
) -> anyhow::Result<Partition> {
    #[cfg(feature = "kaminpar")]
    let result = distspmm_kaminpar::partition(adjacency, parts, method);
    #[cfg(not(feature = "kaminpar"))]
    let result = distspmm_core::partition::partition(adjacency, parts, method);
    match result {
        Err(PartitionError::KaminparNotLinked) => bail!(
            "this build has no KaMinPar: rebuild with `cargo build --release -p distspmm-cli \
             --features kaminpar`, or use --method metis"
        ),
        result => Ok(result?),
    }
}

/// A rerun with the same options that found a different partition in the directory: with more
/// than one thread KaMinPar does not repeat its partition, which is worth saying.
fn explain_rerun(err: ChunkDirError, method: &Method) -> anyhow::Error {
    let racy = matches!(method, Method::Kaminpar(k) if k.effective_threads() > 1);
    match err {
        ChunkDirError::DifferentPartition { .. } if racy => anyhow::anyhow!(
            "{err} (KaMinPar with more than one thread does not give the same partition twice: \
             add --threads 1 for reproducible runs)"
        ),
        err => err.into(),
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

/// One long phase on stderr: a spinner while it runs, its time when done.
struct Phase {
    bar: ProgressBar,
    started: Instant,
}

impl Phase {
    fn start(bars: &MultiProgress, message: &'static str) -> Self {
        let bar = bars.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .expect("static template")
                .tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "),
        );
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(100));
        Phase {
            bar,
            started: Instant::now(),
        }
    }

    /// Ends the phase; returns its wall time in seconds.
    fn done(self) -> f64 {
        let seconds = self.started.elapsed().as_secs_f64();
        let message = self.bar.message();
        tracing::info!(phase = %message, seconds, "phase done");
        self.bar
            .set_style(ProgressStyle::with_template("  {msg}").expect("static template"));
        self.bar
            .finish_with_message(format!("{message}: {seconds:.2} s"));
        seconds
    }
}

/// Time and peak resident memory of each phase of a `partition` run.
#[derive(Debug, Default)]
struct PhaseLog {
    entries: Vec<(&'static str, f64, Option<u64>)>,
}

impl PhaseLog {
    /// Records a phase that just ended: its seconds and the peak RSS since the last reset,
    /// then resets the peak so the next phase measures its own.
    fn record(&mut self, name: &'static str, seconds: f64) {
        self.entries.push((name, seconds, memory::peak_rss_bytes()));
        memory::reset_peak_rss();
    }

    fn seconds_json(&self) -> serde_json::Value {
        self.entries
            .iter()
            .map(|&(name, seconds, _)| (name.to_string(), serde_json::json!(seconds)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    fn peaks_json(&self) -> serde_json::Value {
        self.entries
            .iter()
            .map(|&(name, _, peak)| (name.to_string(), serde_json::json!(peak)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// The run's peak: the largest phase peak.
    fn peak(&self) -> Option<u64> {
        self.entries.iter().filter_map(|e| e.2).max()
    }

    fn summary(&self) -> String {
        let mut out = String::from("phases:");
        for &(name, seconds, peak) in &self.entries {
            out.push_str(&format!(" {name} {seconds:.2} s"));
            if let Some(peak) = peak {
                out.push_str(&format!(" (peak {})", memory::gib(peak)));
            }
            out.push(',');
        }
        out.pop();
        out
    }
}

/// Resident-memory readings from `/proc/self` (Linux); `None` elsewhere.
pub(crate) mod memory {
    /// The peak resident set size (VmHWM) of this process since it started or since the last
    /// [`reset_peak_rss`], in bytes.
    pub fn peak_rss_bytes() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Resets the peak to the current resident size (Linux's `clear_refs` 5), so the next
    /// reading covers only what follows. Without it readings are cumulative.
    pub fn reset_peak_rss() {
        if let Err(err) = std::fs::write("/proc/self/clear_refs", "5") {
            tracing::debug!(%err, "cannot reset the peak RSS; phase peaks are cumulative");
        }
    }

    /// Bytes as GiB with two decimals.
    pub fn gib(bytes: u64) -> String {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

/// Runs `distspmm partition`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let show = !args.json && std::io::stderr().is_terminal();
    let bars = MultiProgress::with_draw_target(if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
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
    if let Some(metis) = &args.write_metis_graph {
        refuse_to_overwrite_inputs(metis, args)?;
    }
    // Held for the whole run, so a second run into the same directory refuses at once.
    let lock = std::sync::Arc::new(
        DirLock::acquire(&args.out)
            .with_context(|| format!("cannot write the chunks into {}", args.out.display()))?,
    );
    let method = args.partitioning.method()?;
    let mut phases = PhaseLog::default();
    memory::reset_peak_rss();

    let phase = Phase::start(&bars, "loading the graph");
    let mut graph =
        distspmm_core::graph::load(&args.input).context("cannot read the input graph")?;
    // Recorded in the manifest: what a checkpoint names its data by, whatever the partition.
    let graph_fingerprint = graph.fingerprint();
    phases.record("load", phase.done());

    let (partition, edge_cut, method) = {
        let label = match args.partition_map {
            Some(_) => "reading the partition map",
            None => "partitioning",
        };
        let phase = Phase::start(&bars, label);
        let adjacency = Adjacency::from_edges(graph.num_nodes, &graph.src, &graph.dst)?;
        // `auto`'s pick for this graph: the method that runs, and that a rerun's error names.
        let method = match args.partition_map {
            Some(_) => method,
            None => method.resolve(&adjacency),
        };
        if let Some(path) = &args.write_metis_graph {
            super::output::write(path, args.force, "--write-metis-graph", |p| {
                adjacency.write_metis_graph(p)
            })
            .context("cannot write the METIS graph file")?;
        }
        // METIS and KaMinPar need only the adjacency: the edge arrays wait on disk meanwhile,
        // out of this phase's peak (the run's peak), and come back once the adjacency is gone.
        let parked = match (&args.partition_map, &method) {
            (None, Method::Metis(_) | Method::Kaminpar(_)) => Some(
                ParkedEdges::park(&lock, &mut graph)
                    .context("cannot park the edge arrays beside the output directory")?,
            ),
            _ => None,
        };
        let partition = match &args.partition_map {
            Some(path) => load_map(path, args.parts, graph.num_nodes)?,
            None => partition_graph(&adjacency, args.parts, &method)?,
        };
        let edge_cut = partition.edge_cut(&adjacency)?;
        drop(adjacency);
        if let Some(parked) = parked {
            parked
                .restore(&mut graph)
                .context("cannot read the parked edge arrays back")?;
        }
        phases.record("partition", phase.done());
        (partition, edge_cut, method)
    };

    let build = args.build.resolve(
        graph.num_nodes,
        graph.num_edges(),
        distspmm_core::memory::available(),
    );
    tracing::info!(build = build.name(), "chunk builder");
    // What the manifest records that the builders no longer know once the edges are released.
    let written = WriteOptions {
        edge_cut: Some(edge_cut),
        graph_fingerprint: Some(graph_fingerprint),
        edges: Some(graph.num_edges() as u64),
        lock: Some(lock.clone()),
        ..WriteOptions::default()
    };
    let manifest = if build == BuildArg::Bounded {
        let phase = Phase::start(&bars, "bucketing the edges by part");
        let buckets = EdgeBuckets::write(
            &lock,
            &partition,
            &graph.src,
            &graph.dst,
            graph.weights.as_deref(),
            args.partitioning.normalize,
        )
        .with_context(|| format!("cannot normalise {}", args.input.display()))?;
        release_edges(&mut graph);
        phases.record("normalise", phase.done());

        let phase = Phase::start(&bars, "normalising part by part and finding the halos");
        let builder = BoundedBuilder::new(&graph, &partition, buckets)
            .with_context(|| format!("cannot normalise {}", args.input.display()))?;
        phases.record("halo", phase.done());
        write_chunks(args, &bars, &mut phases, &builder, written, &method)?
    } else {
        let phase = Phase::start(&bars, "normalising Â");
        let (a_hat, edge_weights) = normalize::adjacency_with_weights(
            graph.num_nodes,
            &graph.src,
            &graph.dst,
            graph.weights.as_deref(),
            args.partitioning.normalize,
        )
        .with_context(|| format!("cannot normalise {}", args.input.display()))?;
        // From here on only Â and the node data are needed: release the edge arrays (8 bytes
        // per edge, 12 with weights) before the chunks are built.
        release_edges(&mut graph);
        phases.record("normalise", phase.done());

        let phase = Phase::start(&bars, "renumbering and finding the halos");
        let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition)?
            .with_edge_weights(&edge_weights)?;
        phases.record("halo", phase.done());
        write_chunks(args, &bars, &mut phases, &builder, written, &method)?
    };

    let seconds = started.elapsed().as_secs_f64();
    let peak_rss = phases.peak();
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
            "build": build.name(),
            "seconds": seconds,
            "phase_seconds": phases.seconds_json(),
            "phase_peak_rss_bytes": phases.peaks_json(),
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
            Some(peak) => println!("{}; peak memory {}", phases.summary(), memory::gib(peak)),
            None => println!("{}", phases.summary()),
        }
    }
    Ok(())
}

/// Refuses a `--write-metis-graph` path that names one of the run's inputs (the graph, the
/// partition map) under any name: the same path once canonicalised, a symlink to it or a hard
/// link of it. `--force` does not lift this.
fn refuse_to_overwrite_inputs(out: &Path, args: &Args) -> anyhow::Result<()> {
    let inputs = [
        ("--input", Some(&args.input)),
        ("--partition-map", args.partition_map.as_ref()),
    ];
    for (option, input) in inputs {
        let Some(input) = input else { continue };
        if same_file(out, input) {
            bail!(
                "--write-metis-graph {} is the file {option} {} reads: writing the METIS graph \
                 there would replace it (--force does not allow this); choose another file",
                out.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// Whether `a` and `b` name the same existing file: equal canonical paths, or the same device
/// and inode (hard links).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(x), Ok(y)) = (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        if x == y {
            return true;
        }
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Drops the graph's edge arrays (the chunks need only the node data from here on).
fn release_edges(graph: &mut distspmm_core::graph::Graph) {
    graph.src = Vec::new();
    graph.dst = Vec::new();
    graph.weights = None;
}

/// Builds and writes every chunk from `builder` (the phases `build` and `write`).
fn write_chunks(
    args: &Args,
    bars: &MultiProgress,
    phases: &mut PhaseLog,
    builder: &impl PartChunkBuilder,
    written: WriteOptions,
    method: &Method,
) -> anyhow::Result<Manifest> {
    let phase = Phase::start(bars, "building and writing chunks");
    let progress = bars.add(ProgressBar::new(u64::from(args.parts)));
    progress.set_style(
        ProgressStyle::with_template("  {bar:30} {pos}/{len} chunks").expect("static template"),
    );
    let options = WriteOptions {
        force: args.force,
        normalization: args.partitioning.normalize.name().into(),
        command_line: std::env::args().collect(),
        progress: progress.clone(),
        ..written
    };
    let manifest = write_chunk_dir(&args.out, builder, &options)
        .map_err(|err| explain_rerun(err, method))
        .with_context(|| format!("cannot write the chunks into {}", args.out.display()))?;
    progress.finish_and_clear();
    let chunk_seconds = phase.done();
    // Chunks are built and written part by part (in parallel for the in-memory builder): split
    // the phase's wall time in the proportion of the summed per-part times.
    let (build, write) = (
        options.timings.build_seconds(),
        options.timings.write_seconds(),
    );
    let build_share = if build + write > 0.0 {
        build / (build + write)
    } else {
        0.5
    };
    phases.record("build", chunk_seconds * build_share);
    // Build and write interleave, so both share the one peak just recorded.
    let build_peak = phases.entries.last().and_then(|e| e.2);
    phases
        .entries
        .push(("write", chunk_seconds * (1.0 - build_share), build_peak));
    Ok(manifest)
}

fn load_map(path: &Path, parts: u32, nodes: usize) -> anyhow::Result<Partition> {
    let partition = Partition::load(path)?;
    if partition.num_nodes() != nodes {
        bail!(
            "the partition map {} covers {} nodes but the graph has {nodes}: it was made for \
             another graph",
            path.display(),
            partition.num_nodes()
        );
    }
    if partition.parts() != parts {
        bail!(
            "the partition map {} has {} parts but --parts is {parts}: pass --parts {}",
            path.display(),
            partition.parts(),
            partition.parts()
        );
    }
    Ok(partition)
}
