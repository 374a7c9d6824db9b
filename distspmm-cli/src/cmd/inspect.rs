//! `distspmm inspect`: summarise and fully validate a chunk file or a chunk directory.

use std::path::{Path, PathBuf};

use chunk_format::dir::{fingerprint_hex, ChunkDir, MANIFEST_FILE, PARTITION_MAP_FILE};
use chunk_format::{ChunkView, MappedChunk};
use distspmm_prep::chunk::VerifyDir;
use serde_json::{json, Value};

/// Summarise and validate one chunk file, or a whole chunk directory (manifest, every chunk,
/// cross-chunk consistency). Exits non-zero, naming the file and section, if anything is wrong.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A chunk file or a directory written by `distspmm partition`.
    path: PathBuf,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Runs `distspmm inspect`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let is_dir = args.path.is_dir();
    let member = if is_dir {
        None
    } else {
        directory_member(&args.path)
    };
    let result = if is_dir {
        inspect_dir(&args.path)
    } else if let Some(what) = member {
        let dir = match args.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Err(anyhow::anyhow!(
            "{} is {what}, not a chunk file: pass the directory (`distspmm inspect {}`) to \
             check the whole chunk directory, or one of its part-NNNNN.chunk files",
            args.path.display(),
            dir.display()
        ))
    } else {
        inspect_file(&args.path)
    };
    match result {
        Ok((summary, text)) => {
            if args.json {
                println!("{summary}");
            } else {
                print!("{text}");
            }
            Ok(())
        }
        Err(err) => {
            if args.json {
                let line = json!({
                    "path": args.path.display().to_string(),
                    "valid": false,
                    "error": super::message(&err),
                });
                println!("{line}");
            }
            if member.is_some() {
                return Err(err);
            }
            Err(err.context(format!("{} is not valid", args.path.display())))
        }
    }
}

/// What a file of a chunk directory that is not a chunk is ("a chunk directory's manifest"):
/// by its name, or for a manifest renamed, by its JSON text. `None` for anything else.
fn directory_member(path: &Path) -> Option<&'static str> {
    use std::io::Read;
    let name = path.file_name()?.to_str()?;
    if name == MANIFEST_FILE {
        return Some("a chunk directory's manifest");
    }
    if name == PARTITION_MAP_FILE {
        return Some("a chunk directory's partition map");
    }
    let mut start = [0u8; 64];
    let read = chunk_format::open_regular(path)
        .and_then(|mut f| f.read(&mut start))
        .ok()?;
    let text = start[..read].trim_ascii_start();
    (text.starts_with(b"{") && text.windows(8).any(|w| w == b"\"format\""))
        .then_some("a chunk directory's manifest (JSON)")
}

fn chunk_summary(view: &ChunkView<'_>, bytes: usize) -> Value {
    let h = view.header();
    let p = view.part_id();
    let send_rows: usize = (0..view.num_parts()).map(|r| view.halo_send(r).len()).sum();
    json!({
        "part": h.part_id,
        "nodes": h.num_local_nodes,
        "nnz": h.nnz,
        "blocks": view.num_blocks(),
        "peers": view.block_sources().iter().filter(|&&q| q as usize != p).count(),
        "halo_rows": h.num_halo_rows,
        "send_rows": send_rows,
        "diagonal_nnz": view.diagonal_block().nnz(),
        "bytes": bytes,
    })
}

fn chunk_line(s: &Value) -> String {
    format!(
        "  part {:>4}: {:>10} nodes {:>12} nnz ({:>12} local) {:>4} peers {:>10} halo rows {:>10} sent rows {:>12} bytes\n",
        s["part"], s["nodes"], s["nnz"], s["diagonal_nnz"], s["peers"], s["halo_rows"], s["send_rows"], s["bytes"]
    )
}

fn inspect_file(path: &Path) -> anyhow::Result<(Value, String)> {
    let chunk = MappedChunk::open(path)?;
    let view = chunk.view();
    let h = view.header();
    let per_chunk = chunk_summary(view, chunk.len());
    let summary = json!({
        "path": path.display().to_string(),
        "kind": "chunk",
        "valid": true,
        "format_version": h.version.to_string(),
        "parts": h.num_parts,
        "nodes": h.num_global_nodes,
        "feature_dim": h.feature_dim,
        "classes": h.num_classes,
        "multi_label": view.targets().is_some(),
        "fingerprint": fingerprint_hex(&h.fingerprint),
        "file_checksum": format!("{:016x}", h.file_checksum),
        "has_masks": view.masks().is_some(),
        "chunk": per_chunk,
    });
    let text = format!(
        "{}: valid chunk (format {}), part {} of {}, {} global nodes, F = {}, C = {}{}, fingerprint {}\n{}",
        path.display(),
        h.version,
        h.part_id,
        h.num_parts,
        h.num_global_nodes,
        h.feature_dim,
        h.num_classes,
        if view.targets().is_some() {
            " (multi-label targets)"
        } else {
            ""
        },
        fingerprint_hex(&h.fingerprint),
        chunk_line(&per_chunk)
    );
    Ok((summary, text))
}

fn inspect_dir(path: &Path) -> anyhow::Result<(Value, String)> {
    let dir = ChunkDir::open(path)?;
    let chunks = dir.validate_all()?;
    let m = dir.manifest();
    let per_chunk: Vec<Value> = chunks
        .iter()
        .map(|c| chunk_summary(c.view(), c.len()))
        .collect();
    let summary = json!({
        "path": path.display().to_string(),
        "kind": "directory",
        "valid": true,
        "parts": m.parts,
        "nodes": m.nodes,
        "edges": m.edges,
        "nnz": m.nnz,
        "feature_dim": m.feature_dim,
        "classes": m.classes,
        "normalization": m.normalization,
        "partition_method": m.partition_method,
        "fingerprint": m.fingerprint,
        "edge_cut": m.edge_cut,
        "max_imbalance": m.max_imbalance,
        "halo_rows_max": m.halo_rows.iter().max(),
        "chunks": per_chunk,
    });
    let mut text = format!(
        "{}: valid chunk directory: {} parts, {} nodes, {} edges, {} non-zeros ({}), F = {}, C = {}\n\
         partition {} (fingerprint {}): edge cut {}, max imbalance {:.3}\n",
        path.display(),
        m.parts,
        m.nodes,
        m.edges,
        m.nnz,
        m.normalization,
        m.feature_dim,
        m.classes,
        m.partition_method,
        m.fingerprint,
        m.edge_cut,
        m.max_imbalance
    );
    for s in &per_chunk {
        text.push_str(&chunk_line(s));
    }
    Ok((summary, text))
}
