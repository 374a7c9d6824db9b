//! `distspmm generate`: synthetic graphs as `.npz` (PyG layout) — RMAT topologies for
//! benchmarks, CSBM graphs with features, labels and masks for training.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use distspmm_prep::graph::generate::{self, CsbmParams};
use distspmm_prep::graph::{npz, Graph};
use indicatif::ProgressBar;

/// Generate a synthetic graph and write it as .npz (PyG field names).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: GenerateWhat,
}

#[derive(Debug, clap::Subcommand)]
enum GenerateWhat {
    /// Graph500 Kronecker graph (a,b,c = 0.57,0.19,0.19; scrambled ids; symmetrised unless
    /// --directed; no self loops or duplicates). Topology only.
    Rmat(RmatArgs),
    /// Contextual stochastic block model: class-dependent Gaussian features, homophilous
    /// edges, labels (or, with --multi-label C, multi-label targets) and train/val/test masks.
    /// The defaults give the quick-start graph.
    Csbm(CsbmArgs),
}

#[derive(Debug, clap::Args)]
struct RmatArgs {
    /// log2 of the node count (≤ 31).
    #[arg(long)]
    scale: u32,
    /// Sampled undirected edges per node, before duplicates and self loops are removed.
    #[arg(long, default_value_t = 16)]
    edge_factor: u32,
    /// Keep every sampled edge in its drawn direction instead of symmetrising (2 · edge factor
    /// directed draws per node, about as many entries as the symmetrised graph): Â is then not
    /// symmetric, e.g. to benchmark the transposed (CSC) kernel.
    #[arg(long)]
    directed: bool,
    /// Seed of every random draw (same seed, same file).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also give every node this many random features (uniform in [0, 1)), a random label and
    /// a random train/val/test split, to benchmark training; 0 writes the topology only.
    #[arg(long, default_value_t = 0)]
    features: usize,
    /// Classes of the random labels (with --features).
    #[arg(long, default_value_t = 8)]
    classes: usize,
    /// Edge keys (8 bytes each, two per sampled edge) held in memory at a time: a graph with
    /// more is sampled into sorted bucket files beside --out and streamed into the archive.
    #[arg(long, default_value_t = generate::RMAT_BUCKET_KEYS, value_parser = clap::value_parser!(u64).range(1..))]
    bucket_keys: u64,
    #[command(flatten)]
    output: Output,
}

#[derive(Debug, clap::Args)]
struct CsbmArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = CsbmParams::default().nodes)]
    nodes: usize,
    /// Number of classes (balanced).
    #[arg(long, default_value_t = CsbmParams::default().classes)]
    classes: usize,
    /// Multi-label targets over C communities instead of one class per node: every node
    /// belongs to one community (which decides its edges) and, with probability 1/2, to a
    /// second one; its features add both communities' means, and `y` (shape [N, C], 0/1) marks
    /// both. Replaces --classes.
    #[arg(long, value_name = "C", conflicts_with = "classes")]
    multi_label: Option<usize>,
    /// Feature columns.
    #[arg(long, default_value_t = CsbmParams::default().features)]
    features: usize,
    /// Average undirected degree.
    #[arg(long, default_value_t = CsbmParams::default().avg_degree)]
    avg_degree: f64,
    /// Fraction of edges joining nodes of the same class, in [0, 1].
    #[arg(long, default_value_t = CsbmParams::default().homophily)]
    homophily: f64,
    /// Distance between class means in units of the feature noise (larger = easier from
    /// features alone).
    #[arg(long, default_value_t = CsbmParams::default().separation)]
    separation: f64,
    /// Seed of every random draw (same seed, same file).
    #[arg(long, default_value_t = CsbmParams::default().seed)]
    seed: u64,
    #[command(flatten)]
    output: Output,
}

#[derive(Debug, clap::Args)]
struct Output {
    /// Output file (.npz).
    #[arg(long)]
    out: PathBuf,
    /// Replace an existing file with different contents.
    #[arg(long)]
    force: bool,
    /// Print one JSON line instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Runs `distspmm generate`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let (name, seed, output, directed) = match &args.what {
        GenerateWhat::Rmat(a) => ("rmat", a.seed, &a.output, a.directed),
        GenerateWhat::Csbm(a) => ("csbm", a.seed, &a.output, false),
    };
    if output.out.extension().and_then(|e| e.to_str()) != Some("npz") {
        bail!(
            "the output must be an .npz file; got {} (try --out {})",
            output.out.display(),
            output.out.with_extension("npz").display()
        );
    }
    check_memory(&args.what)?;
    let spinner = spinner(!output.json);
    spinner.set_message(format!("generating {name} graph"));
    // The graph's node data, and its edges when they are not in the graph's own arrays.
    let (graph, sorted) = match &args.what {
        GenerateWhat::Rmat(a) => {
            let edges = generate::rmat_edges(
                a.scale,
                a.edge_factor,
                a.seed,
                a.directed,
                a.bucket_keys,
                Some(&output.out),
            )
            .context("cannot generate the RMAT graph")?;
            let mut g = Graph::from_edges(edges.num_nodes(), Vec::new(), Vec::new());
            if a.features > 0 {
                generate::random_node_data(&mut g, a.features, a.classes, a.seed)
                    .context("cannot generate random node data")?;
            }
            (g, Some(edges))
        }
        GenerateWhat::Csbm(a) => (
            generate::csbm(&CsbmParams {
                nodes: a.nodes,
                classes: a.multi_label.unwrap_or(a.classes),
                features: a.features,
                avg_degree: a.avg_degree,
                homophily: a.homophily,
                separation: a.separation,
                seed: a.seed,
                multi_label: a.multi_label.is_some(),
            })
            .context("cannot generate the CSBM graph")?,
            None,
        ),
    };
    let num_edges = sorted
        .as_ref()
        .map_or(graph.num_edges() as u64, |s| s.num_edges());
    spinner.set_message(format!("writing {}", output.out.display()));
    let written =
        distspmm_prep::output::write(&output.out, output.force, "--out", |path| match &sorted {
            Some(edges) => npz::write_npz_edges(path, &graph, edges),
            None => npz::write_npz(path, &graph),
        })?;
    drop(sorted);
    spinner.finish_and_clear();
    let bytes = std::fs::metadata(&output.out)
        .with_context(|| format!("cannot read back {}", output.out.display()))?
        .len();
    let seconds = started.elapsed().as_secs_f64();
    if output.json {
        let line = serde_json::json!({
            "out": output.out,
            "generator": name,
            "seed": seed,
            "nodes": graph.num_nodes,
            "edges": num_edges,
            "directed": directed,
            "features": graph.feature_dim(),
            "classes": graph.num_classes(),
            "multi_label": graph.targets.is_some(),
            "bytes": bytes,
            "written": written,
            "seconds": seconds,
        });
        println!("{line}");
    } else {
        let verb = if written {
            "wrote"
        } else {
            "unchanged (same contents)"
        };
        let edges = if directed {
            format!("{num_edges} directed edges")
        } else {
            format!(
                "{num_edges} directed edges (both directions of {} undirected)",
                num_edges / 2
            )
        };
        println!(
            "{verb} {}: {name} graph, {} nodes, {edges}{}, {:.1} MiB, {seconds:.2} s",
            output.out.display(),
            graph.num_nodes,
            extras(&graph),
            bytes as f64 / (1024.0 * 1024.0),
        );
    }
    Ok(())
}

/// Refuses a graph that cannot fit in memory before generating any of it.
fn check_memory(what: &GenerateWhat) -> anyhow::Result<()> {
    let (nodes, edges, features, hint) = match what {
        // The generator itself refuses scales above 31 (ids are u32), with its own message.
        GenerateWhat::Rmat(a) if a.scale > 31 => return Ok(()),
        // The edges are held at most `bucket_keys` keys of 8 bytes at a time (twice that for a
        // bucket's skew), counted here in the 24-byte edges of `working_set_bytes`.
        GenerateWhat::Rmat(a) => {
            let nodes = 1u64 << a.scale;
            let keys = nodes.saturating_mul(2 * u64::from(a.edge_factor));
            (
                nodes,
                keys.min(a.bucket_keys.saturating_mul(2)).saturating_mul(8) / 24,
                a.features as u64,
                "lower --scale, --edge-factor, --features or --bucket-keys",
            )
        }
        GenerateWhat::Csbm(a) => (
            a.nodes as u64,
            saturating_u64(a.nodes as f64 * a.avg_degree.max(0.0)),
            a.features as u64,
            "lower --nodes, --avg-degree or --features",
        ),
    };
    distspmm_sparse::memory::check(
        format!("a graph of {nodes} nodes, about {edges} edges and {features} features"),
        distspmm_prep::graph::working_set_bytes(nodes, edges, features),
        hint,
    )?;
    Ok(())
}

/// ", 64 features, 5 classes, masks 100/500/1000" for graphs with node data.
fn extras(g: &Graph) -> String {
    let mut s = String::new();
    if g.features.is_some() {
        s += &format!(", {} features", g.feature_dim());
    }
    if g.labels.is_some() {
        s += &format!(", {} classes", g.num_classes());
    }
    if let Some(t) = &g.targets {
        s += &format!(", multi-label targets over {} classes", t.classes);
    }
    let count = |m: &Option<Vec<bool>>| m.as_ref().map(|m| m.iter().filter(|&&b| b).count());
    if let (Some(tr), Some(va), Some(te)) = (
        count(&g.train_mask),
        count(&g.val_mask),
        count(&g.test_mask),
    ) {
        s += &format!(", train/val/test {tr}/{va}/{te}");
    }
    s
}

fn spinner(show: bool) -> ProgressBar {
    if !show || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A non-negative estimate as a u64, saturating (an `as` from f64 saturates and maps NaN to 0).
#[allow(
    clippy::cast_possible_truncation,
    reason = "deliberate: a saturating estimate of an edge count"
)]
fn saturating_u64(x: f64) -> u64 {
    x as u64
}
