//! Graphs as edge lists with optional node data, their readers, writers and generators.
//!
//! A [`Graph`] is the raw input of the pipeline: a directed edge list (`src[e] → dst[e]`) plus
//! optional edge weights, node features, labels and train/val/test masks. Normalisation into Â,
//! partitioning and chunk building all start from it.
//!
//! **Edge direction.** An edge `u → v` means *v aggregates u's features*: after normalisation
//! `Â[v][u] ≠ 0`, so row v of Â lists v's in-neighbours. Undirected graphs store both directions.
//!
//! Readers ([`load`] dispatches on the file extension):
//! - [`npz`]: NumPy `.npz` in PyTorch Geometric's field names (also the writer, [`npz::write_npz`]),
//!   or a directory of `.npy` files in the same names ([`npz::read_npy_dir`]);
//! - [`mtx`]: Matrix Market coordinate files;
//! - [`metis`]: METIS `.graph` files;
//! - [`edgelist`]: whitespace- or comma-separated edge lists (`.txt`, `.tsv`, `.csv`, `.el`);
//!
//! text formats may be gzip-compressed (`name.mtx.gz`). Generators live in [`generate`].

pub mod edgelist;
mod error;
mod features;
pub mod generate;
mod mapped_input;
pub mod metis;
pub mod mtx;
pub mod npz;
mod slice;
mod text;

pub use chunk_format::TARGET_UNLABELLED;
pub use error::{show_float, GraphError, GraphErrorKind, Location};
pub use features::{FeatureData, Features};
pub use slice::{node_range, slice_range, GraphSlice};

use std::boxed::Box;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::string::{String, ToString};
use std::vec::Vec;

/// Largest node count a [`Graph`] may have: node ids are `u32`.
pub const MAX_NODES: usize = u32::MAX as usize;

/// Classes any graph may have; more need at least as many nodes as classes
/// ([`Graph::validate`]).
pub const MAX_CLASSES_ANY_GRAPH: u64 = 1 << 16;

/// Multi-label targets: `classes` values per node, row-major, each 0 or 1; a row of
/// [`TARGET_UNLABELLED`] bytes marks an unlabelled node (what an `.npz` `y` of shape `(N, C)`,
/// `C ≥ 2`, holds, a row of −1 unlabelled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Targets {
    /// Classes per node, C.
    pub classes: usize,
    /// `num_nodes × classes` bytes.
    pub data: Vec<u8>,
}

impl Targets {
    /// Row `v`'s bytes.
    pub fn row(&self, v: usize) -> &[u8] {
        &self.data[v * self.classes..(v + 1) * self.classes]
    }
}

/// A directed graph with optional weights, features, labels and masks (PyG's `Data` fields).
///
/// Edge `e` goes `src[e] → dst[e]`: node `dst[e]` aggregates node `src[e]`'s features
/// (`Â[dst][src] ≠ 0`). Undirected graphs list both directions. Self loops and duplicate edges
/// are allowed here; normalisation merges duplicates and adds self loops once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// Number of nodes; ids are `0..num_nodes` (at most [`MAX_NODES`]).
    pub num_nodes: usize,
    /// Source node of each edge.
    pub src: Vec<u32>,
    /// Target node of each edge (the node that aggregates).
    pub dst: Vec<u32>,
    /// Optional weight of each edge (finite); `None` means every edge weighs 1.
    pub weights: Option<Vec<f32>>,
    /// Optional node features.
    pub features: Option<Features>,
    /// Optional class of each node; −1 marks an unlabelled node.
    pub labels: Option<Vec<i32>>,
    /// Optional multi-label targets, instead of `labels` (at most one of the two is set).
    pub targets: Option<Targets>,
    /// Optional training-node mask.
    pub train_mask: Option<Vec<bool>>,
    /// Optional validation-node mask.
    pub val_mask: Option<Vec<bool>>,
    /// Optional test-node mask.
    pub test_mask: Option<Vec<bool>>,
}

impl Graph {
    /// A graph with only a topology.
    pub fn from_edges(num_nodes: usize, src: Vec<u32>, dst: Vec<u32>) -> Self {
        Graph {
            num_nodes,
            src,
            dst,
            ..Graph::default()
        }
    }

    /// Number of (directed) edges.
    pub fn num_edges(&self) -> usize {
        self.src.len()
    }

    /// Feature columns per node, 0 without features.
    pub fn feature_dim(&self) -> usize {
        self.features.as_ref().map_or(0, |f| f.dim)
    }

    /// Number of classes: the targets' columns for multi-label targets, else the largest label
    /// plus one, 0 without labels (or with none set).
    pub fn num_classes(&self) -> usize {
        if let Some(t) = &self.targets {
            return t.classes;
        }
        self.labels
            .as_ref()
            .and_then(|l| l.iter().copied().max())
            .map_or(0, |m| usize::try_from(m).map_or(0, |m| m + 1))
    }

    /// 16-byte identity of the graph's contents: xxh3-128 over a domain tag, the node count and
    /// every array (edges, weights, features, labels, masks; each with whether it is present;
    /// multi-label targets with their class count, where there are any — so a graph without
    /// them has the identity it had before they existed), so that a graph regenerated with the
    /// same node count is told apart (checkpoints record it to refuse a resume on other data).
    pub fn fingerprint(&self) -> [u8; 16] {
        fn array(h: &mut xxhash_rust::xxh3::Xxh3, tag: &[u8], bytes: Option<&[u8]>) {
            h.update(tag);
            match bytes {
                Some(b) => {
                    h.update(&[1]);
                    h.update(&(b.len() as u64).to_le_bytes());
                    h.update(b);
                }
                None => h.update(&[0]),
            }
        }
        let mask = |m: &Option<Vec<bool>>| {
            m.as_ref()
                .map(|m| m.iter().map(|&b| u8::from(b)).collect::<Vec<u8>>())
        };
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(b"distspmm-graph-v1\0");
        h.update(&(self.num_nodes as u64).to_le_bytes());
        array(&mut h, b"src", Some(bytemuck::cast_slice(&self.src)));
        array(&mut h, b"dst", Some(bytemuck::cast_slice(&self.dst)));
        array(
            &mut h,
            b"weights",
            self.weights.as_deref().map(bytemuck::cast_slice),
        );
        h.update(&(self.feature_dim() as u64).to_le_bytes());
        array(
            &mut h,
            b"x",
            self.features
                .as_ref()
                .map(|f| bytemuck::cast_slice(&f.data)),
        );
        array(
            &mut h,
            b"y",
            self.labels.as_deref().map(bytemuck::cast_slice),
        );
        for (tag, m) in [
            (&b"train_mask"[..], &self.train_mask),
            (b"val_mask", &self.val_mask),
            (b"test_mask", &self.test_mask),
        ] {
            array(&mut h, tag, mask(m).as_deref());
        }
        if let Some(t) = &self.targets {
            h.update(&(t.classes as u64).to_le_bytes());
            array(&mut h, b"y_multi_label", Some(&t.data));
        }
        h.digest128().to_le_bytes()
    }

    /// An error ([`GraphErrorKind::InputChanged`], naming the file) if data this graph maps
    /// from its input file (the features, [`Features::check_unchanged`]) changed since they were
    /// mapped. Whoever commits what it made of the graph calls this after the last read.
    pub fn check_unchanged(&self) -> Result<(), GraphError> {
        self.features
            .as_ref()
            .map_or(Ok(()), Features::check_unchanged)
    }

    /// Checks that every part agrees with `num_nodes` and the edge count: node count within
    /// [`MAX_NODES`], `src`/`dst` of equal length with ids below `num_nodes`, one finite weight
    /// per edge, `num_nodes · dim` features, one label (≥ −1) and one mask entry per node.
    pub fn validate(&self) -> Result<(), GraphError> {
        let n = self.num_nodes;
        if n > MAX_NODES {
            return Err(GraphErrorKind::TooManyNodes(n as u64).into());
        }
        let invalid = |array: &str, msg: String| {
            GraphError::new(
                Location::Array(array.to_string()),
                GraphErrorKind::LengthMismatch(msg),
            )
        };
        if self.src.len() != self.dst.len() {
            return Err(invalid(
                "edge_index",
                std::format!("{} sources but {} targets", self.src.len(), self.dst.len()),
            ));
        }
        for (array, ids) in [("edge_index[0]", &self.src), ("edge_index[1]", &self.dst)] {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= n) {
                return Err(GraphError::new(
                    Location::Array(array.to_string()),
                    GraphErrorKind::IdOutOfRange {
                        id: u64::from(id),
                        num_nodes: n as u64,
                    },
                ));
            }
        }
        if let Some(w) = &self.weights {
            if w.len() != self.src.len() {
                return Err(invalid(
                    "edge_weight",
                    std::format!("{} weights for {} edges", w.len(), self.src.len()),
                ));
            }
            if let Some(&bad) = w.iter().find(|x| !x.is_finite()) {
                return Err(GraphError::new(
                    Location::Array("edge_weight".to_string()),
                    GraphErrorKind::NonFinite(f64::from(bad)),
                ));
            }
        }
        if let Some(f) = &self.features {
            if n.checked_mul(f.dim) != Some(f.data.len()) {
                return Err(invalid(
                    "x",
                    std::format!("{} values for {n} nodes × {} features", f.data.len(), f.dim),
                ));
            }
        }
        if let Some(y) = &self.labels {
            if y.len() != n {
                return Err(invalid(
                    "y",
                    std::format!("{} labels for {n} nodes", y.len()),
                ));
            }
            // A class id is an index into the classes: more classes than nodes (beyond a small
            // graph's allowance) is a corrupt label, and would size the classifier's N × C
            // outputs by it.
            let limit = (n as u64).max(MAX_CLASSES_ANY_GRAPH);
            if let Some(&bad) = y.iter().find(|&&c| c >= 0 && c as u64 >= limit) {
                return Err(GraphError::new(
                    Location::Array("y".to_string()),
                    GraphErrorKind::Invalid(std::format!(
                        "label {bad} would mean {} classes, more than the graph's {n} nodes \
                         (and than {MAX_CLASSES_ANY_GRAPH}): labels must be class indices \
                         0..C-1 (or -1 for unlabelled)",
                        i64::from(bad) + 1
                    )),
                ));
            }
            if let Some(&bad) = y.iter().find(|&&c| c < -1) {
                return Err(GraphError::new(
                    Location::Array("y".to_string()),
                    GraphErrorKind::Invalid(std::format!(
                        "label {bad} is negative (only -1, meaning unlabelled, is allowed)"
                    )),
                ));
            }
        }
        if let Some(t) = &self.targets {
            self.validate_targets(t)?;
        }
        for (array, mask) in [
            ("train_mask", &self.train_mask),
            ("val_mask", &self.val_mask),
            ("test_mask", &self.test_mask),
        ] {
            if let Some(m) = mask {
                if m.len() != n {
                    return Err(invalid(
                        array,
                        std::format!("{} entries for {n} nodes", m.len()),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Graph {
    /// Multi-label targets: not beside labels, at least two classes (a single column is read
    /// as class ids), no more than labels may number, one row per node, each row all 0/1 or all
    /// [`TARGET_UNLABELLED`].
    fn validate_targets(&self, t: &Targets) -> Result<(), GraphError> {
        let n = self.num_nodes;
        let at = |kind| GraphError::new(Location::Array("y".to_string()), kind);
        if self.labels.is_some() {
            return Err(at(GraphErrorKind::Invalid(
                "the graph has both class labels and multi-label targets; give one `y`".into(),
            )));
        }
        let limit = (n as u64).max(MAX_CLASSES_ANY_GRAPH);
        if t.classes < 2 || t.classes as u64 > limit {
            return Err(at(GraphErrorKind::Invalid(std::format!(
                "multi-label targets need 2 to {limit} classes (columns of y), not {}",
                t.classes
            ))));
        }
        if n.checked_mul(t.classes) != Some(t.data.len()) {
            return Err(at(GraphErrorKind::LengthMismatch(std::format!(
                "{} target values for {n} nodes × {} classes",
                t.data.len(),
                t.classes
            ))));
        }
        for (v, row) in t.data.chunks_exact(t.classes).enumerate() {
            let unlabelled = row[0] == TARGET_UNLABELLED;
            if row.iter().any(|&x| {
                if unlabelled {
                    x != TARGET_UNLABELLED
                } else {
                    x > 1
                }
            }) {
                return Err(at(GraphErrorKind::Invalid(std::format!(
                    "node {v}'s targets mix -1 (unlabelled) with 0/1 or hold other values: a row \
                     of y is all 0/1, or all -1 for an unlabelled node"
                ))));
            }
        }
        Ok(())
    }
}

/// Memory that normalising, partitioning and chunking a graph of `nodes` nodes, `edges` edges
/// and `features` feature columns needs: about 80 bytes per node (Â's row offsets, degrees,
/// the symmetric adjacency, the partition and renumbering), 24 per edge and the features. The
/// 24 bytes are the peak of the whole `distspmm partition` run per non-zero of Â, rounded
/// down: 24.3–26.4 measured on RMAT-22 (the edge list while Â is assembled, or the symmetric
/// adjacency next to KaMinPar's coarse graphs; docs/performance.md, issue 13). The bounded
/// builder with a light partitioner (`contiguous`) can peak lower, about 17 bytes, so this is
/// the default pipeline's need rather than a bound for every method; used to refuse inputs
/// that cannot fit it before the pipeline allocates anything.
pub fn working_set_bytes(nodes: u64, edges: u64, features: u64) -> u64 {
    nodes
        .saturating_mul(80)
        .saturating_add(edges.saturating_mul(24))
        .saturating_add(nodes.saturating_mul(features).saturating_mul(4))
}

/// Refuses a graph whose [`working_set_bytes`] exceed the available memory, naming what the
/// input declares (`declared` nodes for edges that reference only ids below `referenced`).
fn check_fits(graph: &Graph) -> Result<(), GraphError> {
    let (n, e) = (graph.num_nodes as u64, graph.num_edges() as u64);
    let bytes = working_set_bytes(n, e, graph.feature_dim() as u64);
    let referenced = graph
        .src
        .iter()
        .chain(&graph.dst)
        .max()
        .map_or(0, |&m| u64::from(m) + 1);
    let what = if referenced < n / 2 {
        std::format!(
            "the file declares {n} nodes, but its {e} edges reference only nodes below \
             {referenced}; a graph of {n} nodes"
        )
    } else {
        std::format!("a graph of {n} nodes and {e} edges")
    };
    distspmm_sparse::memory::check(
        what,
        bytes,
        "check the node count the file declares (the Matrix Market size line, num_nodes in an \
         .npz), or use a machine with more memory (or raise this process's limit, `ulimit -v`)",
    )
    .map_err(|e| GraphErrorKind::Memory(e).into())
}

/// Appends one value to an array of a text reader that grows with the file (edge ids,
/// weights), its growth checked against the available memory ([`distspmm_sparse::memory::try_grow`]) so
/// that a file too large for memory (a compressed edge list of billions of lines, or any file
/// under a tight `ulimit -v`) is an error rather than an abort.
fn push_edge_data<T>(v: &mut Vec<T>, value: T) -> Result<(), GraphErrorKind> {
    if v.len() == v.capacity() {
        let len = v.len();
        distspmm_sparse::memory::try_grow(
            v,
            1,
            || std::format!("an edge array of more than {len} entries"),
            EDGE_MEMORY_HINT,
        )?;
    }
    v.push(value);
    Ok(())
}

/// An empty edge array with room for `len` entries, allocated as [`push_edge_data`] grows one.
fn edge_data_with_capacity<T>(len: usize) -> Result<Vec<T>, GraphErrorKind> {
    let mut v = Vec::new();
    distspmm_sparse::memory::try_grow(
        &mut v,
        len,
        || std::format!("an edge array of {len} entries"),
        EDGE_MEMORY_HINT,
    )?;
    Ok(v)
}

const EDGE_MEMORY_HINT: &str = "the file holds more edges than fit in the memory this process \
     may use (the free memory, a cgroup limit, `ulimit -v`/`ulimit -d`): raise the limit, or \
     use a machine with more memory";

/// The file formats [`load`] understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// NumPy `.npz`, PyG field names.
    Npz,
    /// Matrix Market coordinate `.mtx`.
    MatrixMarket,
    /// METIS `.graph` / `.metis`.
    Metis,
    /// Edge list `.txt`, `.tsv`, `.csv`, `.el`, `.edges`.
    EdgeList,
}

impl Format {
    /// The format named by a path's extension, and whether the file is gzip-compressed
    /// (`.gz` after a text format's extension). `None` for an unknown extension.
    pub fn from_path(path: &Path) -> Option<(Format, bool)> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let (name, gz) = match name.strip_suffix(".gz") {
            Some(inner) => (inner.to_string(), true),
            None => (name, false),
        };
        let ext = name.rsplit_once('.')?.1;
        let format = match ext {
            "npz" if !gz => Format::Npz,
            "mtx" => Format::MatrixMarket,
            "graph" | "metis" => Format::Metis,
            "txt" | "tsv" | "csv" | "el" | "edges" => Format::EdgeList,
            _ => return None,
        };
        Some((format, gz))
    }
}

/// Reads a graph file, choosing the reader by extension (see [`Format::from_path`]; a directory
/// is read as `.npy` files, [`npz::read_npy_dir`]), and validates it, including that what it
/// declares fits in memory ([`working_set_bytes`]). Errors name the file and the line or array at fault.
///
/// Edge lists are read with [`edgelist::EdgeListOptions::default`] (0-based ids, node count =
/// largest id + 1); call [`edgelist::read_edgelist`] directly for other settings.
pub fn load(path: impl AsRef<Path>) -> Result<Graph, GraphError> {
    let path = path.as_ref();
    let graph = load_inner(path)
        .and_then(|g| check_fits(&g).map(|()| g))
        .map_err(|e| e.in_file(path))?;
    tracing::info!(
        path = %path.display(),
        nodes = graph.num_nodes,
        edges = graph.num_edges(),
        features = graph.feature_dim(),
        "graph loaded"
    );
    Ok(graph)
}

fn load_inner(path: &Path) -> Result<Graph, GraphError> {
    if path.is_dir() {
        return npz::read_npy_dir(path);
    }
    let Some((format, gz)) = Format::from_path(path) else {
        let ext = path
            .extension()
            .map_or_else(String::new, |e| e.to_string_lossy().into_owned());
        return Err(GraphErrorKind::UnknownFormat(ext).into());
    };
    let graph = match format {
        Format::Npz => return npz::read_npz(path),
        Format::MatrixMarket => mtx::read_mtx(open_text(path, gz)?)?,
        Format::Metis => metis::read_metis(open_text(path, gz)?)?,
        Format::EdgeList => {
            edgelist::read_edgelist(open_text(path, gz)?, &edgelist::EdgeListOptions::default())?
        }
    };
    graph.validate()?;
    Ok(graph)
}

/// A buffered reader over a text file, decompressing gzip when `gz`.
fn open_text(path: &Path, gz: bool) -> Result<Box<dyn BufRead>, GraphError> {
    const BUF: usize = 1 << 16;
    let file = chunk_format::open_regular(path)?;
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            BUF,
            flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUF, file)),
        ))
    } else {
        Box::new(BufReader::with_capacity(BUF, file))
    })
}

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
