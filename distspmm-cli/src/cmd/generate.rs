//! `distspmm generate`: synthetic graphs as `.npz` (PyG layout) — RMAT topologies for
//! benchmarks, CSBM graphs with features, labels and masks for training.

use std::fs::File;
use std::io::{BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use distspmm_core::graph::generate::{self, CsbmParams};
use distspmm_core::graph::{npz, Graph};
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
    /// edges, labels and train/val/test masks. The defaults give the quick-start graph.
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
    let graph = match &args.what {
        GenerateWhat::Rmat(a) => {
            let make = if a.directed {
                generate::rmat_directed
            } else {
                generate::rmat
            };
            let mut g =
                make(a.scale, a.edge_factor, a.seed).context("cannot generate the RMAT graph")?;
            if a.features > 0 {
                generate::random_node_data(&mut g, a.features, a.classes, a.seed)
                    .context("cannot generate random node data")?;
            }
            g
        }
        GenerateWhat::Csbm(a) => generate::csbm(&CsbmParams {
            nodes: a.nodes,
            classes: a.classes,
            features: a.features,
            avg_degree: a.avg_degree,
            homophily: a.homophily,
            separation: a.separation,
            seed: a.seed,
        })
        .context("cannot generate the CSBM graph")?,
    };
    spinner.set_message(format!("writing {}", output.out.display()));
    let written = write(&graph, &output.out, output.force)?;
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
            "edges": graph.num_edges(),
            "directed": directed,
            "features": graph.feature_dim(),
            "classes": graph.num_classes(),
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
            format!("{} directed edges", graph.num_edges())
        } else {
            format!(
                "{} directed edges (both directions of {} undirected)",
                graph.num_edges(),
                graph.num_edges() / 2
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
        GenerateWhat::Rmat(a) => {
            let nodes = 1u64 << a.scale;
            (
                nodes,
                nodes.saturating_mul(2 * u64::from(a.edge_factor)),
                a.features as u64,
                "lower --scale, --edge-factor or --features",
            )
        }
        GenerateWhat::Csbm(a) => (
            a.nodes as u64,
            saturating_u64(a.nodes as f64 * a.avg_degree.max(0.0)),
            a.features as u64,
            "lower --nodes, --avg-degree or --features",
        ),
    };
    distspmm_core::memory::check(
        format!("a graph of {nodes} nodes, about {edges} edges and {features} features"),
        distspmm_core::graph::working_set_bytes(nodes, edges, features),
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

/// Writes `graph` to `out` atomically. An existing file is replaced only with `force` or when
/// the new contents are identical (then it is left alone and `false` is returned).
fn write(graph: &Graph, out: &Path, force: bool) -> anyhow::Result<bool> {
    if force || !out.exists() {
        npz::write_npz(out, graph)?;
        return Ok(true);
    }
    let name = out
        .file_name()
        .map_or_else(|| "graph.npz".into(), |n| n.to_string_lossy().into_owned());
    let candidate = out.with_file_name(format!(".{name}.{}.candidate.npz", std::process::id()));
    let outcome = npz::write_npz(&candidate, graph)
        .map_err(anyhow::Error::from)
        .and_then(|()| same_contents(&candidate, out));
    let _ = std::fs::remove_file(&candidate);
    if outcome? {
        return Ok(false);
    }
    bail!(
        "{} already exists with different contents; pass --force to replace it or choose another --out",
        out.display()
    )
}

fn same_contents(a: &Path, b: &Path) -> anyhow::Result<bool> {
    let open = |p: &Path| -> anyhow::Result<(u64, BufReader<File>)> {
        let f = File::open(p).with_context(|| format!("cannot read {}", p.display()))?;
        let len = f.metadata()?.len();
        Ok((len, BufReader::with_capacity(1 << 16, f)))
    };
    let ((len_a, mut ra), (len_b, mut rb)) = (open(a)?, open(b)?);
    if len_a != len_b {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = ra.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        rb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// A non-negative estimate as a u64, saturating (an `as` from f64 saturates and maps NaN to 0).
#[allow(
    clippy::cast_possible_truncation,
    reason = "deliberate: a saturating estimate of an edge count"
)]
fn saturating_u64(x: f64) -> u64 {
    x as u64
}
