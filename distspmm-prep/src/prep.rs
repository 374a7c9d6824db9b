//! The whole preprocessing pipeline as one call, [`run`]: read the graph → its adjacency →
//! park the edge arrays on disk → partition (or read a saved map) → restore the edges →
//! normalise Â → build the chunks (in memory or with bounded memory) → write the chunk
//! directory. `distspmm partition` is this call plus its progress bars and summary.
//!
//! [`run`] reports each phase as it starts and ends (with its seconds and peak resident
//! memory) and each chunk as it is written ([`PrepEvent`]); what it made is a [`PrepReport`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chunk_format::dir::{ChunkDirError, DirLock, Manifest, WriteOptions, WriteTimings};

use crate::chunk::{BoundedBuilder, ChunkBuildError, ChunkBuilder, EdgeBuckets, ParkedEdges};
use crate::graph::{Graph, GraphError};
use crate::normalize::{self, Normalization, NormalizeError};
use crate::output::OutputError;
use crate::partition::{Adjacency, Method, Partition, PartitionError};

/// What [`run`] does: the input, the partition (a method, or a saved map), the normalisation,
/// how the chunks are built and where they go.
#[derive(Debug, Clone)]
pub struct PrepConfig {
    /// The graph file (any format [`crate::graph::load`] reads).
    pub input: PathBuf,
    /// Parts P.
    pub parts: u32,
    /// The chunk directory (created if missing; an existing one must hold nothing but an
    /// earlier run's chunk files, and is replaced as a whole).
    pub out: PathBuf,
    /// How nodes are assigned to parts (ignored with `partition_map`).
    pub method: Method,
    /// Reuse this saved partition map instead of partitioning.
    pub partition_map: Option<PathBuf>,
    /// Normalisation of Â.
    pub normalization: Normalization,
    /// How the chunks are built.
    pub build: Build,
    /// Also write the symmetrised graph in METIS `.graph` format here.
    pub write_metis_graph: Option<PathBuf>,
    /// Replace a different partition in `out`, and an existing `write_metis_graph` file.
    pub force: bool,
    /// The command line recorded in the manifest.
    pub command_line: Vec<String>,
}

/// How the chunks are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// In memory when its estimated working set fits in half of the available memory,
    /// bounded otherwise.
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
pub const IN_MEMORY_BYTES_PER_NNZ: u64 = 40;

impl Build {
    /// The builder to use for a graph of `nodes` and `edges`: [`Build::Auto`] takes the
    /// in-memory one when its estimated working set fits in half of `available` (or
    /// `available` is unknown).
    pub fn resolve(self, nodes: usize, edges: usize, available: Option<u64>) -> Build {
        match self {
            Build::Auto => {
                let need = IN_MEMORY_BYTES_PER_NNZ.saturating_mul((nodes + edges) as u64);
                match available {
                    Some(a) if need > a / 2 => Build::Bounded,
                    _ => Build::InMemory,
                }
            }
            other => other,
        }
    }

    /// Its name (`auto`, `in-memory`, `bounded`).
    pub fn name(self) -> &'static str {
        match self {
            Build::Auto => "auto",
            Build::InMemory => "in-memory",
            Build::Bounded => "bounded",
        }
    }
}

/// A phase of [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the graph file.
    Load,
    /// The adjacency, the partition (or the saved map) and its edge cut; the METIS graph file.
    Partition,
    /// Normalising Â (in memory), or bucketing the edges by part (bounded).
    Normalise,
    /// Renumbering and finding the halos (in memory), or normalising part by part and finding
    /// the halos (bounded).
    Halo,
    /// Building and writing the chunks. Reported as two phases once it ends
    /// ([`PrepReport::phases`]: `build` and `write`, its wall time split in the proportion of
    /// the summed per-part times).
    Chunks,
}

impl Phase {
    /// The phase's name in reports (`load`, `partition`, `normalise`, `halo`; `build` for
    /// [`Phase::Chunks`]).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Partition => "partition",
            Phase::Normalise => "normalise",
            Phase::Halo => "halo",
            Phase::Chunks => "build",
        }
    }
}

/// What [`run`] reports while it runs. Chunk events come from the threads that write the
/// chunks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PrepEvent {
    /// A phase started; `build` is the chunk builder (known from [`Phase::Normalise`] on).
    PhaseStarted {
        /// The phase.
        phase: Phase,
        /// Whether the partition comes from a saved map.
        from_map: bool,
        /// The chunk builder, once chosen.
        build: Option<Build>,
    },
    /// A phase ended.
    PhaseFinished {
        /// The phase.
        phase: Phase,
        /// Its wall time.
        seconds: f64,
        /// The peak resident memory during it, where the OS says.
        peak_rss: Option<u64>,
    },
    /// Part `part`'s chunk is written: `written` of `parts` so far.
    ChunkWritten {
        /// The part.
        part: u32,
        /// Chunks written so far.
        written: u32,
        /// Parts P.
        parts: u32,
    },
}

/// One phase of a finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseReport {
    /// `load`, `partition`, `normalise`, `halo`, `build` or `write`.
    pub name: &'static str,
    /// Wall time.
    pub seconds: f64,
    /// Peak resident memory during it, where the OS says.
    pub peak_rss: Option<u64>,
}

/// What [`run`] made.
#[derive(Debug, Clone)]
pub struct PrepReport {
    /// The manifest of the chunk directory written.
    pub manifest: Manifest,
    /// The method that ran (`auto`'s pick; the given method with a saved map).
    pub method: Method,
    /// The chunk builder that ran.
    pub build: Build,
    /// Each phase, in order.
    pub phases: Vec<PhaseReport>,
    /// Wall time of the whole run.
    pub seconds: f64,
}

impl PrepReport {
    /// The run's peak resident memory: the largest phase peak.
    pub fn peak_rss(&self) -> Option<u64> {
        self.phases.iter().filter_map(|p| p.peak_rss).max()
    }
}

/// Why [`run`] failed. Each message says what the pipeline was doing; the source says why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepError {
    /// The METIS graph file would replace an input.
    #[error(
        "--write-metis-graph {} is the file {option} {} reads: writing the METIS graph there \
         would replace it (--force does not allow this); choose another file",
        out.display(),
        input.display()
    )]
    MetisGraphIsAnInput {
        /// The METIS graph file.
        out: PathBuf,
        /// The option naming the input.
        option: &'static str,
        /// The input.
        input: PathBuf,
    },
    /// The output directory cannot be locked, or is not one to write (see [`DirLock`]).
    #[error("cannot write the chunks into {}", out.display())]
    Lock {
        /// The output directory.
        out: PathBuf,
        /// Why.
        #[source]
        source: ChunkDirError,
    },
    /// The graph cannot be read.
    #[error("cannot read the input graph")]
    Load(#[source] GraphError),
    /// The adjacency, the partition or its edge cut failed.
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// The METIS graph file cannot be written.
    #[error("cannot write the METIS graph file")]
    MetisGraph(#[source] OutputError),
    /// The edge arrays cannot be parked on disk while the partitioner runs.
    #[error("cannot park the edge arrays beside the output directory")]
    Park(#[source] ChunkDirError),
    /// The parked edge arrays cannot be read back.
    #[error("cannot read the parked edge arrays back")]
    Restore(#[source] ChunkDirError),
    /// The saved partition map covers another number of nodes.
    #[error(
        "the partition map {} covers {map_nodes} nodes but the graph has {nodes}: it was made \
         for another graph",
        path.display()
    )]
    MapNodes {
        /// The map file.
        path: PathBuf,
        /// Its nodes.
        map_nodes: usize,
        /// The graph's.
        nodes: usize,
    },
    /// The saved partition map has another number of parts.
    #[error(
        "the partition map {} has {map_parts} parts but --parts is {parts}: pass --parts \
         {map_parts}",
        path.display()
    )]
    MapParts {
        /// The map file.
        path: PathBuf,
        /// Its parts.
        map_parts: u32,
        /// The parts asked for.
        parts: u32,
    },
    /// Â cannot be normalised (in memory).
    #[error("cannot normalise {}", input.display())]
    Normalize {
        /// The graph file.
        input: PathBuf,
        /// Why.
        #[source]
        source: NormalizeError,
    },
    /// The edges cannot be bucketed or normalised part by part (bounded).
    #[error("cannot normalise {}", input.display())]
    NormalizeBounded {
        /// The graph file.
        input: PathBuf,
        /// Why.
        #[source]
        source: ChunkDirError,
    },
    /// The graph, Â and partition do not fit together.
    #[error(transparent)]
    Build(#[from] ChunkBuildError),
    /// Building or writing the chunks failed.
    #[error("cannot write the chunks into {}", out.display())]
    Write {
        /// The output directory.
        out: PathBuf,
        /// Why.
        #[source]
        source: WriteError,
    },
}

/// Why the chunks could not be written: the directory writer's error, or a rerun of a
/// multi-threaded KaMinPar that found another partition in the directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The directory writer's error.
    #[error(transparent)]
    Dir(ChunkDirError),
    /// The directory holds a different partition, and KaMinPar ran with more than one thread.
    #[error(
        "{0} (KaMinPar with more than one thread does not give the same partition twice: add \
         --threads 1 for reproducible runs)"
    )]
    NotReproducible(ChunkDirError),
}

impl PrepConfig {
    /// `input` split into `parts` parts into `out` with the defaults of `distspmm partition`:
    /// method `auto` (seed 1, imbalance 1.03, balancing nodes), GCN normalisation, the builder
    /// chosen by the available memory, no saved map, no METIS graph file, no `force`.
    pub fn new(input: impl Into<PathBuf>, parts: u32, out: impl Into<PathBuf>) -> Self {
        Self {
            input: input.into(),
            parts,
            out: out.into(),
            method: Method::Auto(crate::partition::AutoOptions::default()),
            partition_map: None,
            normalization: Normalization::Gcn,
            build: Build::Auto,
            write_metis_graph: None,
            force: false,
            command_line: Vec::new(),
        }
    }
}

/// Runs the pipeline that `config` describes and writes its chunk directory, reporting to
/// `on_event` (from the calling thread, and for [`PrepEvent::ChunkWritten`] from the threads
/// that write the chunks). The directory's lock is held from the start, so a second run into
/// the same directory refuses at once; any failure leaves the previous directory as it was.
pub fn run(
    config: &PrepConfig,
    on_event: &(dyn Fn(PrepEvent) + Sync),
) -> Result<PrepReport, PrepError> {
    run_from(config, None, on_event)
}

/// [`run`] on a graph already in memory (generated, or changed after it was read): the
/// [`Phase::Load`] phase is skipped and `config.input` only names the graph in messages.
pub fn run_graph(
    config: &PrepConfig,
    graph: Graph,
    on_event: &(dyn Fn(PrepEvent) + Sync),
) -> Result<PrepReport, PrepError> {
    run_from(config, Some(graph), on_event)
}

/// [`run`], reading `config.input` unless `graph` is given.
fn run_from(
    config: &PrepConfig,
    graph: Option<Graph>,
    on_event: &(dyn Fn(PrepEvent) + Sync),
) -> Result<PrepReport, PrepError> {
    let started = Instant::now();
    if let Some(metis) = &config.write_metis_graph {
        refuse_to_overwrite_inputs(metis, config)?;
    }
    // Held for the whole run, so a second run into the same directory refuses at once.
    let lock = Arc::new(
        DirLock::acquire(&config.out).map_err(|source| PrepError::Lock {
            out: config.out.clone(),
            source,
        })?,
    );
    let mut phases = Phases {
        on_event,
        from_map: config.partition_map.is_some(),
        build: None,
        done: Vec::new(),
    };
    rss::reset_peak();

    // The graph's fingerprint is recorded in the manifest: what a checkpoint names its data
    // by, whatever the partition.
    let (mut graph, graph_fingerprint) = match graph {
        Some(graph) => {
            let fingerprint = graph.fingerprint();
            (graph, fingerprint)
        }
        None => {
            let phase = phases.start(Phase::Load);
            let graph = crate::graph::load(&config.input).map_err(PrepError::Load)?;
            let fingerprint = graph.fingerprint();
            phases.finish(phase);
            (graph, fingerprint)
        }
    };

    let phase = phases.start(Phase::Partition);
    let (partition, edge_cut, method) = partition_phase(config, &lock, &mut graph)?;
    phases.finish(phase);

    let build = config.build.resolve(
        graph.num_nodes,
        graph.num_edges(),
        distspmm_sparse::memory::available(),
    );
    tracing::info!(build = build.name(), "chunk builder");
    phases.build = Some(build);
    // What the manifest records that the builders no longer know once the edges are released.
    let options = WriteOptions {
        force: config.force,
        normalization: config.normalization.name().into(),
        command_line: config.command_line.clone(),
        edge_cut: Some(edge_cut),
        graph_fingerprint: Some(graph_fingerprint),
        edges: Some(graph.num_edges() as u64),
        lock: Some(lock.clone()),
        ..WriteOptions::default()
    };
    let manifest = if build == Build::Bounded {
        let phase = phases.start(Phase::Normalise);
        let bounded = |source| PrepError::NormalizeBounded {
            input: config.input.clone(),
            source,
        };
        let buckets = EdgeBuckets::write(
            &lock,
            &partition,
            &graph.src,
            &graph.dst,
            graph.weights.as_deref(),
            config.normalization,
        )
        .map_err(bounded)?;
        release_edges(&mut graph);
        phases.finish(phase);

        let phase = phases.start(Phase::Halo);
        let builder = BoundedBuilder::new(&graph, &partition, buckets).map_err(bounded)?;
        phases.finish(phase);
        write_chunks(config, &mut phases, &builder, options, &method)?
    } else {
        let phase = phases.start(Phase::Normalise);
        let (a_hat, edge_weights) = normalize::adjacency_with_weights(
            graph.num_nodes,
            &graph.src,
            &graph.dst,
            graph.weights.as_deref(),
            config.normalization,
        )
        .map_err(|source| PrepError::Normalize {
            input: config.input.clone(),
            source,
        })?;
        // From here on only Â and the node data are needed: release the edge arrays (8 bytes
        // per edge, 12 with weights) before the chunks are built.
        release_edges(&mut graph);
        phases.finish(phase);

        let phase = phases.start(Phase::Halo);
        let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition)?
            .with_edge_weights(&edge_weights)?;
        phases.finish(phase);
        write_chunks(config, &mut phases, &builder, options, &method)?
    };
    Ok(PrepReport {
        manifest,
        method,
        build,
        phases: phases.done,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The partition phase: the adjacency (and the METIS graph file from it), the partition or the
/// saved map, its edge cut. The partitioners need only the adjacency: the edge arrays wait on
/// disk meanwhile, out of this phase's peak (the run's peak), and come back once the adjacency
/// is gone. Returns the method that ran (`auto`'s pick).
fn partition_phase(
    config: &PrepConfig,
    lock: &DirLock,
    graph: &mut Graph,
) -> Result<(Partition, u64, Method), PrepError> {
    let adjacency = Adjacency::from_edges(graph.num_nodes, &graph.src, &graph.dst)?;
    // `auto`'s pick for this graph: the method that runs, and that a rerun's error names.
    let method = match config.partition_map {
        Some(_) => config.method,
        None => config.method.resolve(&adjacency),
    };
    if let Some(path) = &config.write_metis_graph {
        crate::output::write(path, config.force, "--write-metis-graph", |p| {
            adjacency.write_metis_graph(p)
        })
        .map_err(PrepError::MetisGraph)?;
    }
    let parked = match (&config.partition_map, &method) {
        (None, Method::Metis(_) | Method::Kaminpar(_)) => {
            Some(ParkedEdges::park(lock, graph).map_err(PrepError::Park)?)
        }
        _ => None,
    };
    let partition = match &config.partition_map {
        Some(path) => load_map(path, config.parts, graph.num_nodes)?,
        None => crate::partition::partition(&adjacency, config.parts, &method)?,
    };
    let edge_cut = partition.edge_cut(&adjacency)?;
    drop(adjacency);
    if let Some(parked) = parked {
        parked.restore(graph).map_err(PrepError::Restore)?;
    }
    Ok((partition, edge_cut, method))
}

/// Builds and writes every chunk from `builder` (the phase [`Phase::Chunks`]).
fn write_chunks(
    config: &PrepConfig,
    phases: &mut Phases<'_>,
    builder: &impl crate::chunk::PartChunkBuilder,
    options: WriteOptions<'_>,
    method: &Method,
) -> Result<Manifest, PrepError> {
    let phase = phases.start(Phase::Chunks);
    let parts = builder.partition().parts();
    let written = std::sync::atomic::AtomicU32::new(0);
    let on_event = phases.on_event;
    let on_chunk_written = |part: u32| {
        let n = written.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        on_event(PrepEvent::ChunkWritten {
            part,
            written: n,
            parts,
        });
    };
    let options = WriteOptions {
        on_chunk_written: Some(&on_chunk_written),
        ..options
    };
    let manifest =
        crate::chunk::write_chunk_dir(&config.out, builder, &options).map_err(|err| {
            PrepError::Write {
                out: config.out.clone(),
                source: explain_rerun(err, method),
            }
        })?;
    phases.finish_chunks(phase, &options.timings);
    Ok(manifest)
}

/// A rerun with the same options that found a different partition in the directory: with more
/// than one thread KaMinPar does not repeat its partition, which is worth saying.
fn explain_rerun(err: ChunkDirError, method: &Method) -> WriteError {
    let racy = matches!(method, Method::Kaminpar(k) if k.effective_threads() > 1);
    match err {
        ChunkDirError::DifferentPartition { .. } if racy => WriteError::NotReproducible(err),
        err => WriteError::Dir(err),
    }
}

/// A saved partition map, checked against the graph and the part count.
fn load_map(path: &Path, parts: u32, nodes: usize) -> Result<Partition, PrepError> {
    let partition = Partition::load(path)?;
    if partition.num_nodes() != nodes {
        return Err(PrepError::MapNodes {
            path: path.to_path_buf(),
            map_nodes: partition.num_nodes(),
            nodes,
        });
    }
    if partition.parts() != parts {
        return Err(PrepError::MapParts {
            path: path.to_path_buf(),
            map_parts: partition.parts(),
            parts,
        });
    }
    Ok(partition)
}

/// Refuses a METIS graph path that names one of the run's inputs (the graph, the partition
/// map) under any name: the same path once canonicalised, a symlink to it or a hard link of
/// it. `force` does not lift this.
fn refuse_to_overwrite_inputs(out: &Path, config: &PrepConfig) -> Result<(), PrepError> {
    let inputs = [
        ("--input", Some(&config.input)),
        ("--partition-map", config.partition_map.as_ref()),
    ];
    for (option, input) in inputs {
        let Some(input) = input else { continue };
        if same_file(out, input) {
            return Err(PrepError::MetisGraphIsAnInput {
                out: out.to_path_buf(),
                option,
                input: input.clone(),
            });
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
fn release_edges(graph: &mut Graph) {
    graph.src = Vec::new();
    graph.dst = Vec::new();
    graph.weights = None;
}

/// The phases of a run so far, and where they are reported.
struct Phases<'e> {
    on_event: &'e (dyn Fn(PrepEvent) + Sync),
    from_map: bool,
    build: Option<Build>,
    done: Vec<PhaseReport>,
}

/// A phase under way.
struct Started {
    phase: Phase,
    at: Instant,
}

impl Phases<'_> {
    fn start(&self, phase: Phase) -> Started {
        (self.on_event)(PrepEvent::PhaseStarted {
            phase,
            from_map: self.from_map,
            build: self.build,
        });
        Started {
            phase,
            at: Instant::now(),
        }
    }

    /// Records a phase that just ended: its seconds and the peak RSS since the last reset,
    /// then resets the peak so the next phase measures its own.
    fn finish(&mut self, started: Started) {
        let seconds = started.at.elapsed().as_secs_f64();
        let peak_rss = rss::peak();
        rss::reset_peak();
        self.done.push(PhaseReport {
            name: started.phase.name(),
            seconds,
            peak_rss,
        });
        self.finished(started.phase, seconds, peak_rss);
    }

    /// Records the chunk phase as `build` and `write`: chunks are built and written part by
    /// part (in parallel for the in-memory builder), so its wall time is split in the
    /// proportion of the summed per-part times, and both share its one peak.
    fn finish_chunks(&mut self, started: Started, timings: &WriteTimings) {
        let seconds = started.at.elapsed().as_secs_f64();
        let peak_rss = rss::peak();
        rss::reset_peak();
        let (build, write) = (timings.build_seconds(), timings.write_seconds());
        let build_share = if build + write > 0.0 {
            build / (build + write)
        } else {
            0.5
        };
        self.done.push(PhaseReport {
            name: "build",
            seconds: seconds * build_share,
            peak_rss,
        });
        self.done.push(PhaseReport {
            name: "write",
            seconds: seconds * (1.0 - build_share),
            peak_rss,
        });
        self.finished(started.phase, seconds, peak_rss);
    }

    fn finished(&self, phase: Phase, seconds: f64, peak_rss: Option<u64>) {
        tracing::info!(phase = phase.name(), seconds, "phase done");
        (self.on_event)(PrepEvent::PhaseFinished {
            phase,
            seconds,
            peak_rss,
        });
    }
}

pub mod distributed;

/// Resident-memory readings from `/proc/self` (Linux); `None` elsewhere.
pub mod rss {
    /// The peak resident set size (VmHWM) of this process since it started or since the last
    /// [`reset_peak`], in bytes.
    pub fn peak() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Resets the peak to the current resident size (Linux's `clear_refs` 5), so the next
    /// reading covers only what follows. Without it readings are cumulative.
    pub fn reset_peak() {
        if let Err(err) = std::fs::write("/proc/self/clear_refs", "5") {
            tracing::debug!(%err, "cannot reset the peak RSS; phase peaks are cumulative");
        }
    }

    /// Hands the heap's free memory back to the system, so that the next phase's peak is its
    /// own (glibc keeps freed pages otherwise; PT-Scotch frees gigabytes at once).
    pub fn trim() {
        // SAFETY: `malloc_trim` only releases free memory of the allocator; no live
        // allocation is affected.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use chunk_format::dir::{chunk_file_name, ChunkDir, MANIFEST_FILE, PARTITION_MAP_FILE};

    use super::*;
    use crate::chunk::VerifyDir;
    use crate::graph::generate::{csbm, CsbmParams};
    use crate::partition::MetisOptions;

    /// The partitioning method of the tests that compare two runs.
    const RANDOM: Method = Method::Random { seed: 5 };

    /// A labelled, featured graph of 300 nodes in `dir/graph.npz`.
    fn graph_file(dir: &Path) -> PathBuf {
        let graph = csbm(&CsbmParams {
            nodes: 300,
            classes: 3,
            features: 4,
            avg_degree: 5.0,
            seed: 11,
            ..CsbmParams::default()
        })
        .unwrap();
        let path = dir.join("graph.npz");
        crate::graph::npz::write_npz(&path, &graph).unwrap();
        path
    }

    /// `prep::run` with `build` and `method` at 3 parts: the report, and every event in order.
    fn run_with(
        input: &Path,
        out: &Path,
        build: Build,
        method: Method,
    ) -> (PrepReport, Vec<PrepEvent>) {
        let config = PrepConfig {
            method,
            build,
            ..PrepConfig::new(input, 3, out)
        };
        let events = Mutex::new(Vec::new());
        let report = run(&config, &|e| events.lock().unwrap().push(e)).unwrap();
        (report, events.into_inner().unwrap())
    }

    /// The phases a run reports, started and finished in order, and one event per chunk.
    fn check_events(events: &[PrepEvent], build: Build) {
        let mut phases = Vec::new();
        let mut chunks = Vec::new();
        for e in events {
            match *e {
                PrepEvent::PhaseStarted {
                    phase, build: b, ..
                } => {
                    phases.push(("start", phase));
                    let chosen = matches!(phase, Phase::Normalise | Phase::Halo | Phase::Chunks);
                    assert_eq!(b, chosen.then_some(build), "{phase:?}");
                }
                PrepEvent::PhaseFinished { phase, seconds, .. } => {
                    assert!(seconds >= 0.0);
                    phases.push(("end", phase));
                }
                PrepEvent::ChunkWritten {
                    part,
                    written,
                    parts,
                } => {
                    assert_eq!(parts, 3);
                    assert_eq!(phases.last(), Some(&("start", Phase::Chunks)));
                    chunks.push((part, written));
                }
            }
        }
        let order = [
            Phase::Load,
            Phase::Partition,
            Phase::Normalise,
            Phase::Halo,
            Phase::Chunks,
        ];
        let want: Vec<_> = order
            .iter()
            .flat_map(|&p| [("start", p), ("end", p)])
            .collect();
        assert_eq!(phases, want);
        chunks.sort_unstable();
        assert_eq!(chunks.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1, 2]);
        let mut counts: Vec<u32> = chunks.iter().map(|c| c.1).collect();
        counts.sort_unstable();
        assert_eq!(counts, [1, 2, 3]);
    }

    /// Both builders write the same chunk directory from the same file, and report their phases
    /// and chunks; the directory passes every cross-chunk check. (A seeded random partition:
    /// METIS's random state is process-wide, so another test's METIS run could change its
    /// tie-breaks between the two runs.)
    #[test]
    fn each_build_mode_writes_the_same_valid_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let input = graph_file(tmp.path());
        let mut written = Vec::new();
        for build in [Build::InMemory, Build::Bounded] {
            let out = tmp.path().join(build.name());
            let (report, events) = run_with(&input, &out, build, RANDOM);
            check_events(&events, build);
            assert_eq!(report.build, build);
            assert_eq!(report.method, RANDOM);
            let names: Vec<_> = report.phases.iter().map(|p| p.name).collect();
            assert_eq!(
                names,
                ["load", "partition", "normalise", "halo", "build", "write"]
            );
            let m = &report.manifest;
            assert_eq!((m.parts, m.nodes), (3, 300));
            assert_eq!(m.partition_method, "random:seed=5");
            assert_eq!(m.graph_fingerprint.as_deref().map(str::len), Some(32));
            let dir = ChunkDir::open(&out).unwrap();
            assert_eq!(dir.validate_all().unwrap().len(), 3);
            let files: Vec<Vec<u8>> = (0..3)
                .map(|p| std::fs::read(out.join(chunk_file_name(p))).unwrap())
                .chain([std::fs::read(out.join(PARTITION_MAP_FILE)).unwrap()])
                .collect();
            written.push(files);
        }
        assert!(
            written[0] == written[1],
            "the builders wrote different chunks"
        );
    }

    /// `auto` picks the in-memory builder when memory is plentiful, the bounded one when the
    /// estimated working set exceeds half of it.
    #[test]
    fn auto_builds_in_memory_unless_the_working_set_exceeds_half_the_memory() {
        let need = IN_MEMORY_BYTES_PER_NNZ * 1_100;
        assert_eq!(Build::Auto.resolve(100, 1000, None), Build::InMemory);
        assert_eq!(
            Build::Auto.resolve(100, 1000, Some(2 * need)),
            Build::InMemory
        );
        assert_eq!(
            Build::Auto.resolve(100, 1000, Some(2 * need - 2)),
            Build::Bounded
        );
        assert_eq!(Build::Bounded.resolve(100, 1000, None), Build::Bounded);
    }

    /// A saved map reused: the same partition; one for another part count is refused before
    /// anything is written, and so is a METIS graph file that would replace the input.
    #[test]
    fn a_saved_map_is_reused_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let input = graph_file(tmp.path());
        let first = tmp.path().join("first");
        let metis = Method::Metis(MetisOptions::default());
        let (report, _) = run_with(&input, &first, Build::InMemory, metis);
        assert!(report.manifest.partition_method.starts_with("metis:"));
        let map = first.join(PARTITION_MAP_FILE);
        let again = PrepConfig {
            partition_map: Some(map.clone()),
            ..PrepConfig::new(&input, 3, tmp.path().join("again"))
        };
        let events = Mutex::new(Vec::new());
        let reused = run(&again, &|e| events.lock().unwrap().push(e)).unwrap();
        assert_eq!(reused.manifest.fingerprint, report.manifest.fingerprint);
        assert!(events.into_inner().unwrap().iter().all(|e| !matches!(
            e,
            PrepEvent::PhaseStarted {
                from_map: false,
                ..
            }
        )));
        let wrong = PrepConfig {
            partition_map: Some(map),
            ..PrepConfig::new(&input, 2, tmp.path().join("wrong"))
        };
        let err = run(&wrong, &|_| {}).unwrap_err();
        assert!(
            matches!(
                err,
                PrepError::MapParts {
                    map_parts: 3,
                    parts: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!tmp.path().join("wrong").join(MANIFEST_FILE).exists());
        let clobber = PrepConfig {
            write_metis_graph: Some(input.clone()),
            force: true,
            ..PrepConfig::new(&input, 2, tmp.path().join("clobber"))
        };
        let err = run(&clobber, &|_| {}).unwrap_err();
        assert!(
            matches!(
                err,
                PrepError::MetisGraphIsAnInput {
                    option: "--input",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// A graph in memory goes through the same pipeline as its file, without the load phase.
    #[test]
    fn a_graph_in_memory_gives_the_chunks_of_its_file() {
        let tmp = tempfile::tempdir().unwrap();
        let input = graph_file(tmp.path());
        let (from_file, _) = run_with(&input, &tmp.path().join("file"), Build::InMemory, RANDOM);
        let config = PrepConfig {
            method: RANDOM,
            build: Build::InMemory,
            ..PrepConfig::new("in memory", 3, tmp.path().join("memory"))
        };
        let graph = crate::graph::load(&input).unwrap();
        let in_memory = run_graph(&config, graph, &|_| {}).unwrap();
        assert_eq!(in_memory.phases[0].name, "partition");
        assert_eq!(
            in_memory.manifest.fingerprint,
            from_file.manifest.fingerprint
        );
        for p in 0..3 {
            let read = |dir: &str| std::fs::read(tmp.path().join(dir).join(chunk_file_name(p)));
            assert!(read("file").unwrap() == read("memory").unwrap(), "part {p}");
        }
    }
}
