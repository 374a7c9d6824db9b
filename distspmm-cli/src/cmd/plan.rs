//! `distspmm plan`: a dry run of the distributed SpMM without MPI — per-rank memory and bytes
//! per layer under each schedule, for any P, from a chunk directory or straight from a graph
//! (partitioned here, nothing written), and the P×P communication matrix as an SVG heatmap.
//! The byte counts are the schedules' own (`distspmm_op::schedule`), the same the operator
//! measures in `distspmm bench dist`.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chunk_format::dir::ChunkDir;
use chunk_format::{MappedChunk, HEADER_LEN, SECTION_ALIGN, SECTION_ENTRY_LEN};
use distspmm_prep::chunk::HaloLists;
use distspmm_prep::normalize;
use distspmm_prep::partition::Adjacency;
use distspmm_sparse::memory::human_bytes as human;

use super::partition::PartitionOptions;
use distspmm_op::schedule::{
    CommMatrix, LayerTraffic, PartitionShape, Precision, ScheduleKind, Workspace, VALUE_BYTES,
};
use indicatif::ProgressBar;

/// Plan the distributed SpMM: memory and traffic per rank, without running it.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["chunks", "input"])))]
pub struct Args {
    /// A chunk directory written by `distspmm partition`.
    #[arg(long)]
    pub chunks: Option<PathBuf>,
    /// Or a graph file (.npz, .mtx, METIS .graph, edge list) to partition here; nothing is
    /// written. Needs --parts.
    #[arg(long, requires = "parts")]
    pub input: Option<PathBuf>,
    /// Number of parts P (= ranks) to partition --input into.
    #[arg(long, requires = "input")]
    pub parts: Option<u32>,
    /// How --input is partitioned (as `distspmm partition`).
    #[command(flatten)]
    pub partitioning: PartitionOptions,
    /// Which schedules to plan.
    #[arg(long, value_enum, default_value_t = SchedulePick::Both)]
    pub schedule: SchedulePick,
    /// Feature columns F of X (default: the graph's feature dimension, or 64 without features).
    #[arg(long)]
    pub features: Option<usize>,
    /// The format of the messages: f32, bf16 or f16 (the traffic and the operator's buffers
    /// in that format; the SVG heatmap stays in f32 bytes).
    #[arg(long, default_value = "f32", value_parser = super::ranks::parse_precision)]
    pub comm_precision: Precision,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also draw the P×P matrix of bytes per forward call as an SVG heatmap into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// Which schedules `plan` covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulePick {
    /// The broadcast schedule only.
    Broadcast,
    /// The halo schedule only.
    Halo,
    /// Both, side by side.
    Both,
}

impl SchedulePick {
    fn kinds(self) -> &'static [ScheduleKind] {
        match self {
            SchedulePick::Broadcast => &[ScheduleKind::Broadcast],
            SchedulePick::Halo => &[ScheduleKind::Halo],
            SchedulePick::Both => &ScheduleKind::ALL,
        }
    }
}

/// The partition-level facts a plan is made of.
struct Planned {
    source: String,
    method: String,
    shape: PartitionShape,
    chunk_bytes: Vec<u64>,
    feature_dim: usize,
}

/// Runs `distspmm plan`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let show = !args.json && std::io::stderr().is_terminal();
    let planned = match (&args.chunks, &args.input, args.parts) {
        (Some(dir), _, _) => from_chunks(dir, show)?,
        (None, Some(input), Some(parts)) => from_graph(input, parts, &args.partitioning)?,
        _ => bail!("give --chunks DIR, or --input GRAPH with --parts P"),
    };
    let features = match args.features {
        Some(f) => f,
        None if planned.feature_dim > 0 => planned.feature_dim,
        None => 64,
    };
    check_features(&planned, features)?;
    let plans: Vec<(ScheduleKind, Vec<RankPlan>)> = args
        .schedule
        .kinds()
        .iter()
        .map(|&kind| {
            (
                kind,
                rank_plans(&planned, kind, features, args.comm_precision),
            )
        })
        .collect();
    if let Some(path) = &args.svg {
        let panels: Vec<(ScheduleKind, CommMatrix)> = plans
            .iter()
            .map(|(kind, _)| (*kind, planned.shape.comm_matrix(*kind)))
            .collect();
        chunk_format::atomic::write_atomically(path, heatmaps(&panels, features).as_bytes())
            .with_context(|| format!("cannot write the heatmap {}", path.display()))?;
    }
    if args.json {
        println!(
            "{}",
            json(&planned, (features, args.comm_precision), &plans)
        );
    } else {
        print_tables(&planned, (features, args.comm_precision), &plans);
        if let Some(path) = &args.svg {
            println!("communication matrix drawn into {}", path.display());
        }
    }
    Ok(())
}

fn from_chunks(dir: &Path, show: bool) -> anyhow::Result<Planned> {
    let chunk_dir = ChunkDir::open(dir)?;
    let parts = chunk_dir.parts();
    let progress = if show {
        ProgressBar::new(u64::from(parts))
    } else {
        ProgressBar::hidden()
    };
    let chunks: Vec<MappedChunk> = (0..parts)
        .map(|p| {
            progress.inc(1);
            chunk_dir.load(p)
        })
        .collect::<Result<_, _>>()?;
    progress.finish_and_clear();
    let shape = PartitionShape::from_chunks(chunks.iter().map(MappedChunk::view))
        .with_context(|| format!("the chunks in {} do not fit together", dir.display()))?;
    let manifest = chunk_dir.manifest();
    Ok(Planned {
        source: dir.display().to_string(),
        method: manifest.partition_method.clone(),
        shape,
        chunk_bytes: chunks.iter().map(|c| c.len() as u64).collect(),
        feature_dim: manifest.feature_dim as usize,
    })
}

fn from_graph(input: &Path, parts: u32, options: &PartitionOptions) -> anyhow::Result<Planned> {
    if parts == 0 {
        bail!("--parts must be at least 1");
    }
    let graph = distspmm_prep::graph::load(input)
        .with_context(|| format!("cannot read the graph {}", input.display()))?;
    let n = graph.num_nodes;
    let a_hat = normalize::adjacency(
        n,
        &graph.src,
        &graph.dst,
        graph.weights.as_deref(),
        options.normalize,
    )
    .with_context(|| format!("cannot normalise {}", input.display()))?;
    let adjacency = Adjacency::from_edges(n, &graph.src, &graph.dst)?;
    // `auto`'s pick for this graph, so the plan names the method `partition` would run.
    let method = options.method()?.resolve(&adjacency);
    let partition = distspmm_prep::partition::partition(&adjacency, parts, &method)?;
    drop(adjacency);
    let renumbering = partition.renumbering();
    let halo = HaloLists::compute(&a_hat.view(), &partition, &renumbering);
    let p_count = parts as usize;
    let part_of = partition.part_of();
    let mut block_nnz = vec![0u64; p_count * p_count];
    for v in 0..n {
        let row = part_of[v] as usize * p_count;
        for &c in a_hat.row(v).0 {
            block_nnz[row + part_of[c as usize] as usize] += 1;
        }
    }
    let halo_rows: Vec<u64> = (0..p_count * p_count)
        .map(|i| halo.recv(i / p_count, i % p_count).len() as u64)
        .collect();
    let shape = PartitionShape::new(renumbering.offsets().to_vec(), halo_rows, block_nnz)?;
    let masks = graph.train_mask.is_some() || graph.val_mask.is_some() || graph.test_mask.is_some();
    let chunk_bytes = (0..p_count)
        .map(|p| {
            chunk_file_bytes(&ChunkCounts {
                parts: p_count as u64,
                rows: shape.part_rows(p),
                blocks: 1 + (0..p_count).filter(|&q| shape.halo_rows(p, q) > 0).count() as u64,
                nnz: shape.nnz(p),
                halo_rows: (0..p_count).map(|q| shape.halo_rows(p, q)).sum(),
                sent_rows: (0..p_count).map(|r| shape.halo_rows(r, p)).sum(),
                features: graph.feature_dim() as u64,
                labels: graph.num_classes() > 0 && graph.targets.is_none(),
                targets: graph.targets.as_ref().map_or(0, |t| t.classes as u64),
                masks,
            })
        })
        .collect();
    Ok(Planned {
        source: input.display().to_string(),
        method: method.tag()?,
        shape,
        chunk_bytes,
        feature_dim: graph.feature_dim(),
    })
}

/// Refuses a feature count for which a byte count of the plan would not fit in 64 bits (the
/// schedules' counters and the sums here would wrap). Every figure is at most `rows·F·4 +
/// fixed` with `rows ≤ (2P + 4)·N` — all ranks' sends in both directions, or one rank's
/// buffers (`(P + 1)·N` rows at most) plus X and Y — and `fixed` at most every chunk's bytes
/// plus a rank's index workspace (`4·nnz + 8·(N + P)`).
fn check_features(planned: &Planned, features: usize) -> anyhow::Result<()> {
    let shape = &planned.shape;
    let (parts, nodes) = (shape.parts() as u64, shape.nodes());
    let nnz = (0..shape.parts()).try_fold(0u64, |sum, p| sum.checked_add(shape.nnz(p)));
    let fixed = planned
        .chunk_bytes
        .iter()
        .try_fold(0u64, |sum, &b| sum.checked_add(b))
        .zip(nnz.and_then(|z| z.checked_mul(4)))
        .and_then(|(c, z)| c.checked_add(z))
        .zip(nodes.checked_add(parts).and_then(|n| n.checked_mul(8)))
        .and_then(|(f, w)| f.checked_add(w));
    let per_feature = parts
        .checked_mul(2)
        .and_then(|p| p.checked_add(4))
        .and_then(|p| p.checked_mul(nodes))
        .and_then(|rows| rows.checked_mul(VALUE_BYTES));
    let most = match (fixed, per_feature) {
        (Some(fixed), Some(per_feature)) => {
            ((u64::MAX - fixed) / per_feature.max(1)).min(u64::MAX / VALUE_BYTES)
        }
        _ => 0,
    };
    let features = features as u64;
    if features > most {
        bail!(
            "--features {features} is too large: the plan's byte counts for {nodes} nodes in \
             {parts} parts would pass 2^64 − 1 bytes (16 EiB); the largest F this plan can \
             count is {most}"
        );
    }
    Ok(())
}

/// What decides a chunk file's length.
struct ChunkCounts {
    parts: u64,
    rows: u64,
    blocks: u64,
    nnz: u64,
    halo_rows: u64,
    sent_rows: u64,
    features: u64,
    labels: bool,
    /// Classes of multi-label targets (0 without them).
    targets: u64,
    masks: bool,
}

/// The length of a chunk file as `docs/chunk-format.md` lays it out: header, section table,
/// then each section 64-aligned in kind order, the file padded to 64 bytes.
fn chunk_file_bytes(c: &ChunkCounts) -> u64 {
    let mut sections = vec![
        8 * (c.parts + 1),                     // PART_OFFSETS
        4 * c.blocks,                          // BLOCK_SRC
        8 * (c.blocks + 1),                    // BLOCK_COL_OFFSETS
        8 * (c.blocks + 1),                    // BLOCK_NNZ_OFFSETS
        8 * c.blocks * (c.rows + 1),           // CSR_ROWPTR
        4 * c.nnz,                             // CSR_COLS
        4 * c.nnz,                             // CSR_VALS
        8 * (c.rows + c.halo_rows + c.blocks), // CSC_COLPTR
        4 * c.nnz,                             // CSC_ROWS
        4 * c.nnz,                             // CSC_VALS
        8 * (c.parts + 1),                     // HALO_RECV_OFFSETS
        4 * c.halo_rows,                       // HALO_RECV
        8 * (c.parts + 1),                     // HALO_SEND_OFFSETS
        4 * c.sent_rows,                       // HALO_SEND
        8 * c.rows,                            // ORIGINAL_IDS
    ];
    if c.features > 0 {
        sections.push(4 * c.rows * c.features); // FEATURES
    }
    if c.labels {
        sections.push(4 * c.rows); // LABELS
    }
    if c.masks {
        sections.push(c.rows); // MASKS
    }
    // EDGE_WEIGHTS: `distspmm partition` writes the graph's own weights into every chunk.
    sections.push(4 * c.nnz);
    if c.targets > 0 {
        sections.push(c.rows * c.targets); // TARGETS
    }
    let align = |x: u64| x.div_ceil(SECTION_ALIGN as u64) * SECTION_ALIGN as u64;
    let table = (HEADER_LEN + SECTION_ENTRY_LEN * sections.len()) as u64;
    align(sections.iter().fold(table, |end, len| align(end) + len))
}

/// One rank under one schedule.
#[derive(Debug, Clone, serde::Serialize)]
struct RankPlan {
    rank: usize,
    rows: u64,
    nnz: u64,
    chunk_bytes: u64,
    workspace_bytes: u64,
    /// X and Y of one call (`2·n_p·F` values).
    operand_bytes: u64,
    memory_bytes: u64,
    forward: Bytes,
    backward: Bytes,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Bytes {
    sent: u64,
    received: u64,
}

fn rank_plans(
    planned: &Planned,
    kind: ScheduleKind,
    features: usize,
    precision: Precision,
) -> Vec<RankPlan> {
    let shape = &planned.shape;
    let traffic: Vec<LayerTraffic> = shape
        .traffic(kind, features)
        .into_iter()
        .map(|t| t.in_precision(precision))
        .collect();
    (0..shape.parts())
        .map(|p| {
            let workspace: Workspace = shape.workspace(kind, p, features).in_precision(precision);
            let operand_bytes = 2 * shape.part_rows(p) * features as u64 * VALUE_BYTES;
            let t = traffic[p];
            RankPlan {
                rank: p,
                rows: shape.part_rows(p),
                nnz: shape.nnz(p),
                chunk_bytes: planned.chunk_bytes[p],
                workspace_bytes: workspace.total(),
                operand_bytes,
                memory_bytes: planned.chunk_bytes[p] + workspace.total() + operand_bytes,
                forward: Bytes {
                    sent: t.forward.sent,
                    received: t.forward.received,
                },
                backward: Bytes {
                    sent: t.backward.sent,
                    received: t.backward.received,
                },
            }
        })
        .collect()
}

/// Maxima and totals over ranks.
#[derive(Debug, Clone, Copy)]
struct Summary {
    max_received: u64,
    max_sent: u64,
    /// Bytes sent by all ranks in one forward and one backward call.
    layer_total: u64,
    max_memory: u64,
}

fn summary(ranks: &[RankPlan]) -> Summary {
    let max = |f: fn(&RankPlan) -> u64| ranks.iter().map(f).max().unwrap_or(0);
    Summary {
        max_received: max(|r| r.forward.received),
        max_sent: max(|r| r.forward.sent),
        layer_total: ranks.iter().map(|r| r.forward.sent + r.backward.sent).sum(),
        max_memory: max(|r| r.memory_bytes),
    }
}

fn json(
    planned: &Planned,
    (features, precision): (usize, Precision),
    plans: &[(ScheduleKind, Vec<RankPlan>)],
) -> String {
    let shape = &planned.shape;
    let schedules: Vec<serde_json::Value> = plans
        .iter()
        .map(|(kind, ranks)| {
            let sum = summary(ranks);
            serde_json::json!({
                "schedule": kind.name(),
                "max_recv_bytes_per_rank": sum.max_received,
                "max_send_bytes_per_rank": sum.max_sent,
                "bytes_per_layer_all_ranks": sum.layer_total,
                "max_memory_bytes_per_rank": sum.max_memory,
                "ranks": ranks,
            })
        })
        .collect();
    serde_json::json!({
        "source": planned.source,
        "method": planned.method,
        "parts": shape.parts(),
        "nodes": shape.nodes(),
        "nnz": (0..shape.parts()).map(|p| shape.nnz(p)).sum::<u64>(),
        "features": features,
        "comm_precision": precision.name(),
        "schedules": schedules,
    })
    .to_string()
}

fn print_tables(
    planned: &Planned,
    (features, precision): (usize, Precision),
    plans: &[(ScheduleKind, Vec<RankPlan>)],
) {
    let shape = &planned.shape;
    let parts = shape.parts();
    println!(
        "plan for {}: {} nodes, {} non-zeros, {parts} parts ({}), F = {features} ({precision} \
         messages)",
        planned.source,
        shape.nodes(),
        (0..parts).map(|p| shape.nnz(p)).sum::<u64>(),
        planned.method
    );
    println!(
        "{:<36}{}",
        "",
        plans
            .iter()
            .map(|(k, _)| format!("{:>14}", k.name()))
            .collect::<String>()
    );
    let sums: Vec<Summary> = plans.iter().map(|(_, r)| summary(r)).collect();
    let cells = |pick: fn(&Summary) -> u64| -> String {
        sums.iter()
            .map(|s| format!("{:>14}", human(pick(s))))
            .collect()
    };
    println!(
        "{:<36}{}",
        "received per rank per call, max",
        cells(|s| s.max_received)
    );
    println!(
        "{:<36}{}",
        "sent per rank per call, max",
        cells(|s| s.max_sent)
    );
    println!(
        "{:<36}{}",
        "moved per layer (fwd + bwd), all",
        cells(|s| s.layer_total)
    );
    println!("{:<36}{}", "memory per rank, max", cells(|s| s.max_memory));
    if let [(_, broadcast), (_, halo)] = plans {
        let (b, h) = (summary(broadcast).max_received, summary(halo).max_received);
        if b > 0 {
            println!(
                "the halo schedule receives {:.3}× the broadcast's bytes (max per rank)",
                h as f64 / b as f64
            );
            if precision != Precision::F32 {
                // The broadcast in f32 (the seed's): the same values in 4 bytes each.
                let seed = b as f64 * VALUE_BYTES as f64 / precision.value_bytes() as f64;
                println!(
                    "the halo schedule in {precision} receives {:.3}× the f32 broadcast's \
                     bytes (the seed's; max per rank)",
                    h as f64 / seed
                );
            }
        }
    }
    println!(
        "(backward moves the same bytes the other way; memory = chunk + operator workspace + X \
         and Y)"
    );
    if parts > 32 {
        return;
    }
    for (kind, ranks) in plans {
        println!("\n{kind}: per rank (one forward call)");
        println!(
            "{:>5} {:>10} {:>11} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "rank", "rows", "nnz", "chunk", "workspace", "memory", "received", "sent"
        );
        for r in ranks {
            println!(
                "{:>5} {:>10} {:>11} {:>12} {:>12} {:>12} {:>12} {:>12}",
                r.rank,
                r.rows,
                r.nnz,
                human(r.chunk_bytes),
                human(r.workspace_bytes),
                human(r.memory_bytes),
                human(r.forward.received),
                human(r.forward.sent)
            );
        }
    }
}

/// Cells per axis at most; larger P is binned (sums over groups of ranks).
const MAX_CELLS: usize = 128;
/// Viridis, sampled: the colour of the lowest to the highest bytes.
const COLOURS: [(f64, f64, f64); 5] = [
    (68.0, 1.0, 84.0),
    (59.0, 82.0, 139.0),
    (33.0, 145.0, 140.0),
    (94.0, 201.0, 98.0),
    (253.0, 231.0, 37.0),
];

#[allow(
    clippy::cast_possible_truncation,
    reason = "t is clamped to [0, 1]: the index is below the palette's length and each channel in 0..=255"
)]
fn colour(t: f64) -> String {
    let t = t.clamp(0.0, 1.0) * (COLOURS.len() - 1) as f64;
    let i = (t.floor() as usize).min(COLOURS.len() - 2);
    let u = t - i as f64;
    let (a, b) = (COLOURS[i], COLOURS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * u).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(a.0, b.0),
        mix(a.1, b.1),
        mix(a.2, b.2)
    )
}

/// The P×P matrices as side-by-side heatmaps with one logarithmic colour scale and a legend.
fn heatmaps(panels: &[(ScheduleKind, CommMatrix)], features: usize) -> String {
    let parts = panels.first().map_or(1, |(_, m)| m.parts());
    let bin = parts.div_ceil(MAX_CELLS);
    let cells = parts.div_ceil(bin);
    let row_bytes = features as u64 * VALUE_BYTES;
    let grids: Vec<Vec<u64>> = panels
        .iter()
        .map(|(_, m)| {
            let mut grid = vec![0u64; cells * cells];
            for p in 0..parts {
                for q in 0..parts {
                    grid[(p / bin) * cells + q / bin] += m.rows(p, q) * row_bytes;
                }
            }
            grid
        })
        .collect();
    let max = grids.iter().flatten().copied().max().unwrap_or(0);
    let min = grids
        .iter()
        .flatten()
        .copied()
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(max);
    let (lo, hi) = ((min.max(1) as f64).ln(), (max.max(1) as f64).ln());
    let scale = |v: u64| {
        if hi > lo {
            ((v as f64).ln() - lo) / (hi - lo)
        } else {
            1.0
        }
    };
    let (size, left, top, gap, legend) = (480.0, 70.0, 60.0, 50.0, 130.0);
    let width = left + panels.len() as f64 * (size + gap) + legend;
    let height = top + size + 60.0;
    let cell = size / cells as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let binned = if bin > 1 {
        format!(", cells sum {bin}×{bin} rank pairs")
    } else {
        String::new()
    };
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="20" font-size="14">Bytes rank p receives from rank q per forward call (F = {features}, {parts} ranks{binned}); backward is the transpose</text>"#
    );
    for (k, ((kind, _), grid)) in panels.iter().zip(&grids).enumerate() {
        let x0 = left + k as f64 * (size + gap);
        let _ = writeln!(
            svg,
            r#"<text x="{x0}" y="{}" font-size="13">{kind}</text>"#,
            top - 8.0
        );
        let _ = writeln!(
            svg,
            r##"<rect x="{x0}" y="{top}" width="{size}" height="{size}" fill="#f2f2f2" stroke="#888"/>"##
        );
        for i in 0..cells {
            for j in 0..cells {
                let v = grid[i * cells + j];
                if v == 0 {
                    continue;
                }
                let _ = writeln!(
                    svg,
                    r#"<rect x="{:.3}" y="{:.3}" width="{cell:.3}" height="{cell:.3}" fill="{}"><title>p {} ← q {}: {}</title></rect>"#,
                    x0 + j as f64 * cell,
                    top + i as f64 * cell,
                    colour(scale(v)),
                    i * bin,
                    j * bin,
                    human(v)
                );
            }
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">sending rank q (0 … {})</text>"#,
            x0 + size / 2.0,
            top + size + 20.0,
            parts - 1
        );
        let _ = writeln!(
            svg,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">receiving rank p (0 … {})</text>"#,
            x0 - 12.0,
            top + size / 2.0,
            parts - 1
        );
    }
    // Legend: a vertical bar, high at the top, with labels at decades of bytes.
    let lx = left + panels.len() as f64 * (size + gap);
    let _ = writeln!(
        svg,
        r#"<defs><linearGradient id="scale" x1="0" y1="1" x2="0" y2="0">"#
    );
    for s in 0..=10 {
        let t = f64::from(s) / 10.0;
        let _ = writeln!(svg, r#"<stop offset="{t}" stop-color="{}"/>"#, colour(t));
    }
    let _ = writeln!(svg, "</linearGradient></defs>");
    let _ = writeln!(
        svg,
        r##"<rect x="{lx}" y="{top}" width="18" height="{size}" fill="url(#scale)" stroke="#888"/>"##
    );
    let mut labels = vec![min, max];
    #[allow(
        clippy::cast_possible_truncation,
        reason = "log10 of a u64 is below 20"
    )]
    let mut decade = 10u64.pow((min.max(1) as f64).log10().ceil() as u32);
    while decade < max {
        if scale(decade) > 0.06 && scale(decade) < 0.94 {
            labels.push(decade);
        }
        decade = decade.saturating_mul(10);
    }
    for v in labels {
        let y = top + size * (1.0 - scale(v));
        let _ = writeln!(
            svg,
            r##"<line x1="{lx}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#333"/><text x="{}" y="{:.1}">{}</text>"##,
            lx + 22.0,
            lx + 26.0,
            y + 4.0,
            human(v)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{lx}" y="{}">log scale; blank = 0</text>"#,
        top + size + 20.0
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_run_from_dark_to_bright() {
        assert_eq!(colour(0.0), "#440154");
        assert_eq!(colour(1.0), "#fde725");
        assert_eq!(colour(2.0), "#fde725");
    }

    #[test]
    fn heatmap_bins_large_rank_counts() {
        let shape = PartitionShape::new(
            (0..=300u64).map(|p| p * 2).collect(),
            vec![0; 300 * 300],
            vec![0; 300 * 300],
        )
        .unwrap();
        let svg = heatmaps(
            &[(
                ScheduleKind::Broadcast,
                shape.comm_matrix(ScheduleKind::Broadcast),
            )],
            8,
        );
        // 300 ranks in bins of 3: 100 × 100 cells, every one non-zero (a diagonal bin still
        // holds the 6 off-diagonal pairs of its 3 ranks).
        assert_eq!(svg.matches("<title>").count(), 100 * 100);
        assert!(svg.contains("cells sum 3×3 rank pairs"));
        assert!(svg.ends_with("</svg>\n"));
    }
}
