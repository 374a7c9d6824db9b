//! Synthetic graphs: Graph500 Kronecker (RMAT) topologies for benchmarks, and contextual
//! stochastic block models (CSBM) with features, labels and masks for end-to-end training.
//!
//! Both are deterministic per seed and independent of the thread count: every parallel chunk
//! of work draws from its own ChaCha8 stream (`seed`, stream = chunk index).

use super::{Features, Graph, GraphError, GraphErrorKind, MAX_NODES};
use chunk_format::workdir::{self, Stale, WorkDir, WorkDirError};
use distspmm_sparse::index;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::format;
use std::vec;
use std::vec::Vec;

/// Graph500 initiator probability of the top-left quadrant (both endpoints in the lower half).
pub const RMAT_A: f64 = 0.57;
/// Graph500 initiator probability of the top-right quadrant.
pub const RMAT_B: f64 = 0.19;
/// Graph500 initiator probability of the bottom-left quadrant.
pub const RMAT_C: f64 = 0.19;

/// Sampled edges per RNG stream: fixes the work split so results do not depend on thread count.
const RMAT_CHUNK: usize = 1 << 15;
/// Stream ids above every chunk index, for the draws that are not per chunk.
const STREAM_PERMUTATION: u64 = u64::MAX;
const STREAM_LABELS: u64 = u64::MAX - 1;
const STREAM_EDGES: u64 = u64::MAX - 2;
const STREAM_MASKS: u64 = u64::MAX - 3;
const STREAM_MEANS: u64 = u64::MAX - 4;
const STREAM_NODE_DATA: u64 = u64::MAX - 5;
const STREAM_MEMBERSHIP: u64 = u64::MAX - 6;

fn rng_stream(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

fn invalid(msg: String) -> GraphError {
    GraphErrorKind::Invalid(msg).into()
}

/// Gives a topology-only graph random node data, for benchmarking training on graphs that come
/// without any (e.g. [`rmat`]): features uniform in `[0, 1)`, labels uniform in `0..classes`,
/// and a random split of 10% training, 10% validation and 20% test nodes. There is nothing to
/// learn in it; it has the shapes and costs of a real workload.
///
/// Errors if `classes` is 0 or exceeds `i32::MAX`, or the feature matrix overflows `usize`.
pub fn random_node_data(
    graph: &mut Graph,
    features: usize,
    classes: usize,
    seed: u64,
) -> Result<(), GraphError> {
    let n = graph.num_nodes;
    if classes == 0 || classes > i32::MAX as usize {
        return Err(invalid(format!(
            "random node data needs 1..={} classes, got {classes}",
            i32::MAX
        )));
    }
    #[allow(clippy::cast_possible_truncation, reason = "checked just above")]
    let classes_i32 = classes as i32;
    let len = n
        .checked_mul(features)
        .ok_or_else(|| invalid(format!("{n} nodes × {features} features overflow")))?;
    let mut rng = rng_stream(seed, STREAM_NODE_DATA);
    let data: Vec<f32> = (0..len).map(|_| rng.random::<f32>()).collect();
    let labels: Vec<i32> = (0..n).map(|_| rng.random_range(0..classes_i32)).collect();
    let mut order: Vec<u32> = (0..index::id(n)).collect();
    order.shuffle(&mut rng);
    let (train_end, val_end, test_end) = (n / 10, n / 5, 2 * n / 5);
    let mut masks = [vec![false; n], vec![false; n], vec![false; n]];
    for (i, &v) in order[..test_end].iter().enumerate() {
        let which = if i < train_end {
            0
        } else if i < val_end {
            1
        } else {
            2
        };
        masks[which][v as usize] = true;
    }
    let [train, val, test] = masks;
    graph.features = Some(Features::new(features, data));
    graph.labels = Some(labels);
    graph.train_mask = Some(train);
    graph.val_mask = Some(val);
    graph.test_mask = Some(test);
    Ok(())
}

/// A Graph500 Kronecker graph with `2^scale` nodes.
///
/// Samples `edge_factor · 2^scale` edges by recursive descent into the quadrants of the
/// adjacency matrix with probabilities a, b, c, d = [`RMAT_A`], [`RMAT_B`], [`RMAT_C`], 0.05,
/// maps node ids through a seeded random permutation (so high-degree nodes are not clustered
/// at low ids), then symmetrises and drops self loops and duplicates. The result lists both
/// directions of every undirected edge, sorted by (src, dst); nodes may be isolated.
///
/// Errors if `scale > 31` (ids are `u32`) or the edge count overflows `usize`.
pub fn rmat(scale: u32, edge_factor: u32, seed: u64) -> Result<Graph, GraphError> {
    rmat_with(scale, edge_factor, seed, false)
}

/// A directed Graph500 Kronecker graph: as [`rmat`], but every sampled edge is kept in the
/// direction it was drawn, without its reverse, so the adjacency matrix is not symmetric (its
/// CSC arrays differ from its CSR arrays, which is what a benchmark of the transposed kernel
/// needs). It draws `2 · edge_factor · 2^scale` edges, as many as [`rmat`] lists before
/// removing duplicates, so the two have about the same number of non-zeros; self loops and
/// duplicates are dropped; the result is sorted by (src, dst).
///
/// Errors as [`rmat`].
pub fn rmat_directed(scale: u32, edge_factor: u32, seed: u64) -> Result<Graph, GraphError> {
    rmat_with(scale, edge_factor, seed, true)
}

fn rmat_with(scale: u32, edge_factor: u32, seed: u64, directed: bool) -> Result<Graph, GraphError> {
    rmat_edges(scale, edge_factor, seed, directed, u64::MAX, None)?.into_graph()
}

/// Keys per bucket that `distspmm generate rmat` holds at most while it sorts (1 GiB of keys):
/// larger graphs are sampled into sorted bucket files ([`rmat_edges`]).
pub const RMAT_BUCKET_KEYS: u64 = 1 << 27;

/// Keys per piece handed to [`SortedEdges::for_each_piece`] (512 KiB).
const PIECE_KEYS: usize = 1 << 16;

/// Chunks sampled together before their keys are routed to the bucket files (32 MiB of keys).
const BATCH_CHUNKS: usize = 64;

/// The kind of the generator's work directory, `.<name>.rmat-<pid>` beside the output, which
/// holds the [`bucket_file`]s.
const RMAT_WORK: workdir::Kind = workdir::Kind {
    name: "rmat",
    owns: |name| workdir::numbered(name, "bucket-", ".u64"),
};

/// A graph's edges as keys `src << 32 | dst`, sorted, without duplicates: in memory, or in
/// bucket files of a work directory (each bucket a range of source ids, so the buckets in
/// order are the sorted list), removed when this is dropped.
#[derive(Debug)]
pub struct SortedEdges {
    num_nodes: usize,
    store: Store,
}

#[derive(Debug)]
enum Store {
    Memory(Vec<u64>),
    Files { dir: WorkDir, counts: Vec<u64> },
}

fn io_error(path: &std::path::Path, err: std::io::Error) -> GraphError {
    GraphError::from(err).in_file(path)
}

impl From<WorkDirError> for GraphError {
    fn from(e: WorkDirError) -> Self {
        io_error(&e.path, e.source)
    }
}

fn bucket_file(dir: &std::path::Path, b: usize) -> std::path::PathBuf {
    dir.join(format!("bucket-{b:05}.u64"))
}

impl SortedEdges {
    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.num_nodes
    }

    /// Number of (directed) edges.
    pub fn num_edges(&self) -> u64 {
        match &self.store {
            Store::Memory(keys) => keys.len() as u64,
            Store::Files { counts, .. } => counts.iter().sum(),
        }
    }

    /// Whether the edges are in bucket files rather than in memory.
    pub fn on_disk(&self) -> bool {
        matches!(self.store, Store::Files { .. })
    }

    /// Calls `f` on the keys in order, in pieces of at most 64 Ki keys; stops at `f`'s first
    /// error.
    pub fn for_each_piece(
        &self,
        f: &mut dyn FnMut(&[u64]) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        use std::io::Read;
        match &self.store {
            Store::Memory(keys) => keys.chunks(PIECE_KEYS).try_for_each(f),
            Store::Files { dir, counts } => {
                let mut piece = vec![0u64; PIECE_KEYS];
                for (b, &count) in counts.iter().enumerate() {
                    let path = bucket_file(dir.path(), b);
                    let mut file = std::io::BufReader::with_capacity(
                        1 << 20,
                        std::fs::File::open(&path).map_err(|e| io_error(&path, e))?,
                    );
                    let mut left = count;
                    while left > 0 {
                        let take = usize::try_from(left).map_or(PIECE_KEYS, |l| l.min(PIECE_KEYS));
                        let buf = &mut piece[..take];
                        file.read_exact(bytemuck::cast_slice_mut(buf))
                            .map_err(|e| io_error(&path, e))?;
                        f(buf)?;
                        left -= take as u64;
                    }
                }
                Ok(())
            }
        }
    }

    /// The edges as a [`Graph`] (source and target arrays, 8 bytes per edge in memory).
    pub fn into_graph(self) -> Result<Graph, GraphError> {
        let num_nodes = self.num_nodes;
        let (src, dst) = match &self.store {
            Store::Memory(keys) => split_keys(keys)?,
            Store::Files { .. } => {
                let edges = self.num_edges();
                let len = usize::try_from(edges)
                    .map_err(|_| invalid(format!("{edges} edges do not fit in memory")))?;
                let mut keys = Vec::new();
                keys.try_reserve_exact(len)
                    .map_err(|_| invalid(format!("not enough memory for {len} edges")))?;
                self.for_each_piece(&mut |piece| {
                    keys.extend_from_slice(piece);
                    Ok(())
                })?;
                split_keys(&keys)?
            }
        };
        Ok(Graph::from_edges(num_nodes, src, dst))
    }
}

/// The edges of [`rmat`] (or, `directed`, of [`rmat_directed`]) as [`SortedEdges`], holding
/// at most about `bucket_keys` keys at a time: when all keys (two per sampled edge) exceed
/// that, they are routed as sampled into `2^k` bucket files by source-id range, in a work
/// directory `.<name>.rmat-<pid>` beside `out` (`work_beside`), and each bucket is sorted and
/// deduplicated on its own. The result is the same whatever `bucket_keys` and thread count.
pub fn rmat_edges(
    scale: u32,
    edge_factor: u32,
    seed: u64,
    directed: bool,
    bucket_keys: u64,
    work_beside: Option<&std::path::Path>,
) -> Result<SortedEdges, GraphError> {
    if scale > 31 {
        return Err(GraphErrorKind::TooManyNodes(1u64 << scale.min(63)).into());
    }
    let n = 1usize << scale;
    let sampled = (edge_factor as usize)
        .checked_shl(scale)
        .filter(|m| m.checked_mul(2).is_some() && (*m >> scale) == edge_factor as usize)
        .ok_or_else(|| {
            invalid(format!(
                "edge factor {edge_factor} at scale {scale} overflows"
            ))
        })?;
    let started = std::time::Instant::now();
    let total = 2 * sampled;
    let sampler = Sampler::new(scale, seed, directed);
    let buckets = (total as u64)
        .div_ceil(bucket_keys.max(1))
        .next_power_of_two()
        .min(n as u64);
    if let Some(out) = work_beside {
        remove_stale_work(out);
    }
    let store = match (buckets, work_beside) {
        (1, _) | (_, None) => {
            let mut keys: Vec<u64> = Vec::new();
            keys.try_reserve_exact(total).map_err(|_| {
                invalid(format!("not enough memory for {sampled} sampled edges (scale {scale}, edge factor {edge_factor})"))
            })?;
            keys.resize(total, 0);
            keys.par_chunks_mut(2 * RMAT_CHUNK)
                .enumerate()
                .for_each(|(chunk, out)| sampler.fill(chunk, out));
            keys.par_sort_unstable();
            keys.dedup();
            if keys.last() == Some(&u64::MAX) {
                keys.pop();
            }
            Store::Memory(keys)
        }
        (buckets, Some(out)) => {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "buckets ≤ nodes = 2^scale ≤ 2^31"
            )]
            let buckets = buckets as usize;
            sample_into_buckets(&sampler, total, buckets, scale, out)?
        }
    };
    let edges = SortedEdges {
        num_nodes: n,
        store,
    };
    tracing::debug!(
        scale,
        edge_factor,
        sampled,
        directed,
        edges = edges.num_edges(),
        buckets,
        seconds = started.elapsed().as_secs_f64(),
        "rmat generated"
    );
    Ok(edges)
}

/// Where the work directory of the output `out` goes: its parent, and the output's name.
fn work_parent(out: &std::path::Path) -> (&std::path::Path, &std::ffi::OsStr) {
    let name = out.file_name().unwrap_or(std::ffi::OsStr::new("graph"));
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    (parent, name)
}

/// Removes the work directories that killed generators left beside `out`, whether or not this
/// run needs one.
fn remove_stale_work(out: &std::path::Path) {
    let (parent, name) = work_parent(out);
    // Without a lock on the output, only the directories of processes that are gone are stale.
    match workdir::remove_stale(parent, name, RMAT_WORK, Stale::OfDeadProcesses) {
        Ok(()) => {}
        // A parent that cannot be listed (unreadable): writing the output there says what is
        // wrong, once; the sweep only had nothing it could reach.
        Err(err) if err.path == parent => {
            tracing::debug!(path = %parent.display(), err = %err.source, "cannot look for stale work directories");
        }
        Err(err) => {
            tracing::warn!(path = %err.path.display(), err = %err.source, "cannot remove a stale work directory");
        }
    }
}

/// Samples all `total` keys chunk by chunk into `buckets` files by source-id range (self loops
/// dropped), then sorts and deduplicates each file in place.
fn sample_into_buckets(
    sampler: &Sampler,
    total: usize,
    buckets: usize,
    scale: u32,
    out: &std::path::Path,
) -> Result<Store, GraphError> {
    use std::io::Read;
    let (parent, name) = work_parent(out);
    // The write buffers of every bucket file and the sampling batch are held together: check
    // them before the work directory holds a file.
    const BATCH_KEYS: usize = BATCH_CHUNKS * 2 * RMAT_CHUNK;
    const HINT: &str = "give a larger --bucket-keys (fewer bucket files, each sorted in memory \
                        on its own), or raise the memory limit (`ulimit -v`)";
    let buffers = (buckets as u64)
        .saturating_mul(BUCKET_BUFFER as u64)
        .saturating_add(distspmm_sparse::memory::bytes_of::<u64>(BATCH_KEYS as u64));
    let what = || {
        format!(
            "the write buffers of {buckets} bucket files ({} each) and the sampling batch",
            distspmm_sparse::memory::human_bytes(BUCKET_BUFFER as u64)
        )
    };
    distspmm_sparse::memory::check(what(), buffers, HINT)?;
    let mut batch = distspmm_sparse::memory::try_filled(BATCH_KEYS, 0u64, what(), HINT)?;
    let mut files = distspmm_sparse::memory::try_with_capacity(buckets, what(), HINT)?;
    let dir = WorkDir::beside(parent, name, RMAT_WORK)?;
    let shift = scale - buckets.trailing_zeros();
    for b in 0..buckets {
        let path = bucket_file(dir.path(), b);
        let file = std::fs::File::create(&path).map_err(|e| io_error(&path, e))?;
        let buffer: Vec<u8> =
            distspmm_sparse::memory::try_with_capacity(BUCKET_BUFFER, what(), HINT)?;
        files.push(BucketWriter { file, buffer });
    }
    let chunks = total.div_ceil(2 * RMAT_CHUNK);
    for first in (0..chunks).step_by(BATCH_CHUNKS) {
        let end = (first * 2 * RMAT_CHUNK + batch.len()).min(total);
        let keys = &mut batch[..end - first * 2 * RMAT_CHUNK];
        keys.par_chunks_mut(2 * RMAT_CHUNK)
            .enumerate()
            .for_each(|(c, out)| sampler.fill(first + c, out));
        for &key in keys.iter() {
            if key != u64::MAX {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "the source id (key >> 32) is below 2^scale"
                )]
                let b = ((key >> 32) >> shift) as usize;
                files[b]
                    .push(key)
                    .map_err(|e| io_error(&bucket_file(dir.path(), b), e))?;
            }
        }
    }
    drop(batch);
    let mut counts = Vec::with_capacity(buckets);
    for (b, file) in files.into_iter().enumerate() {
        let path = bucket_file(dir.path(), b);
        file.finish().map_err(|e| io_error(&path, e))?;
        let mut bytes = std::fs::File::open(&path).map_err(|e| io_error(&path, e))?;
        let len = bytes.metadata().map_err(|e| io_error(&path, e))?.len() / 8;
        let len = usize::try_from(len)
            .map_err(|_| invalid(format!("bucket {b} holds more keys than memory")))?;
        let what = || format!("sorting bucket {b} of {len} keys");
        const SORT_HINT: &str = "give a smaller --bucket-keys (more bucket files, fewer keys \
                                 in each), or raise the memory limit (`ulimit -v`)";
        distspmm_sparse::memory::check(
            what(),
            distspmm_sparse::memory::bytes_of::<u64>(len as u64),
            SORT_HINT,
        )?;
        let mut keys = distspmm_sparse::memory::try_filled(len, 0u64, what(), SORT_HINT)?;
        bytes
            .read_exact(bytemuck::cast_slice_mut(&mut keys))
            .map_err(|e| io_error(&path, e))?;
        drop(bytes);
        keys.par_sort_unstable();
        keys.dedup();
        std::fs::write(&path, bytemuck::cast_slice::<u64, u8>(&keys))
            .map_err(|e| io_error(&path, e))?;
        counts.push(keys.len() as u64);
    }
    Ok(Store::Files { dir, counts })
}

/// Bytes buffered per bucket file before they are written.
const BUCKET_BUFFER: usize = 1 << 20;

/// A bucket file and its write buffer (allocated by the caller, fallibly: there may be
/// thousands of buckets).
struct BucketWriter {
    file: std::fs::File,
    buffer: Vec<u8>,
}

impl BucketWriter {
    /// Appends one key, writing the buffer out when it is full.
    fn push(&mut self, key: u64) -> std::io::Result<()> {
        if self.buffer.capacity() - self.buffer.len() < 8 {
            self.flush()?;
        }
        self.buffer.extend_from_slice(&key.to_ne_bytes());
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        self.file.write_all(&self.buffer)?;
        self.buffer.clear();
        Ok(())
    }

    /// Writes what is buffered and closes the file.
    fn finish(mut self) -> std::io::Result<()> {
        self.flush()
    }
}

/// Draws the keys of one chunk of samples: the per-chunk ChaCha8 stream, the quadrant
/// thresholds and the node permutation.
struct Sampler {
    scale: u32,
    seed: u64,
    per_sample: usize,
    perm: Vec<u32>,
    thresholds: (u64, u64, u64),
}

impl Sampler {
    fn new(scale: u32, seed: u64, directed: bool) -> Self {
        let n = 1usize << scale;
        let perm = random_permutation(n, &mut rng_stream(seed, STREAM_PERMUTATION));
        // Thresholds on a uniform u32: [0, a) → (0,0), [a, a+b) → (0,1), [a+b, a+b+c) → (1,0), else (1,1).
        let scale32 = f64::from(u32::MAX) + 1.0;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "deliberate: thresholds below 2^32, rounded down"
        )]
        let thresholds = (
            (RMAT_A * scale32) as u64,
            ((RMAT_A + RMAT_B) * scale32) as u64,
            ((RMAT_A + RMAT_B + RMAT_C) * scale32) as u64,
        );
        Self {
            scale,
            seed,
            per_sample: if directed { 1 } else { 2 },
            perm,
            thresholds,
        }
    }

    /// Fills `out` (the keys of chunk `chunk`): each undirected sample becomes two directed
    /// keys (src << 32 | dst); directed, each key is a sample of its own. Self loops become
    /// u64::MAX, which sorts last and is cut off after dedup.
    fn fill(&self, chunk: usize, out: &mut [u64]) {
        let (t_a, t_ab, t_abc) = self.thresholds;
        let mut rng = rng_stream(self.seed, chunk as u64);
        for slot in out.chunks_exact_mut(self.per_sample) {
            let (mut row, mut col) = (0usize, 0usize);
            for _ in 0..self.scale {
                // Branch-free quadrant choice (the four outcomes are unpredictable): the row
                // bit is set in c and d, the column bit in b and d.
                let r = u64::from(rng.random::<u32>());
                let i = usize::from(r >= t_ab);
                let j = usize::from((r >= t_a) ^ (r >= t_ab) ^ (r >= t_abc));
                row = (row << 1) | i;
                col = (col << 1) | j;
            }
            let (u, v) = (u64::from(self.perm[row]), u64::from(self.perm[col]));
            if u == v {
                slot.fill(u64::MAX);
            } else {
                slot[0] = (u << 32) | v;
                if let Some(back) = slot.get_mut(1) {
                    *back = (v << 32) | u;
                }
            }
        }
    }
}

/// `src << 32 | dst` keys → separate id vectors, in parallel.
fn split_keys(keys: &[u64]) -> Result<(Vec<u32>, Vec<u32>), GraphError> {
    let what = || format!("the source and target arrays of {} edges", keys.len());
    const HINT: &str = "generate a smaller graph (lower --scale, --edge-factor, --nodes or \
                        --avg-degree), or raise the memory limit (`ulimit -v`)";
    distspmm_sparse::memory::check(
        what(),
        distspmm_sparse::memory::bytes_of::<u32>(keys.len() as u64).saturating_mul(2),
        HINT,
    )?;
    let mut src = distspmm_sparse::memory::try_filled(keys.len(), 0u32, what(), HINT)?;
    let mut dst = distspmm_sparse::memory::try_filled(keys.len(), 0u32, what(), HINT)?;
    const BLOCK: usize = 1 << 16;
    src.par_chunks_mut(BLOCK)
        .zip(dst.par_chunks_mut(BLOCK))
        .zip(keys.par_chunks(BLOCK))
        .for_each(|((s, d), k)| {
            for ((s, d), &k) in s.iter_mut().zip(d.iter_mut()).zip(k) {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "deliberate: a key is (src << 32) | dst"
                )]
                let (src, dst) = ((k >> 32) as u32, k as u32);
                (*s, *d) = (src, dst);
            }
        });
    Ok((src, dst))
}

fn random_permutation(n: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    // n ≤ MAX_NODES: checked by the callers' parameters.
    let mut perm: Vec<u32> = (0..n).map(index::id).collect();
    perm.shuffle(rng);
    perm
}

/// Parameters of [`csbm`]. `Default` gives the quick-start graph: 3000 nodes, 5 classes,
/// 64 features, average degree 10, homophily 0.7, feature separation 1.5, seed 0.
#[derive(Clone, Debug, PartialEq)]
pub struct CsbmParams {
    /// Number of nodes (≥ `classes`).
    pub nodes: usize,
    /// Number of classes (≥ 1); class sizes differ by at most one.
    pub classes: usize,
    /// Feature columns (≥ 1).
    pub features: usize,
    /// Target average (undirected) degree: `nodes · avg_degree / 2` distinct undirected edges.
    pub avg_degree: f64,
    /// Probability that an edge joins two nodes of the same class, in [0, 1].
    pub homophily: f64,
    /// Distance between any two class means, in units of the per-feature noise deviation.
    pub separation: f64,
    /// Seed of every random draw.
    pub seed: u64,
    /// Multi-label targets instead of class labels: every node belongs to its own class's
    /// community and, with probability 1/2, to one other; its targets mark both (see [`csbm`]).
    pub multi_label: bool,
}

impl Default for CsbmParams {
    fn default() -> Self {
        CsbmParams {
            nodes: 3000,
            classes: 5,
            features: 64,
            avg_degree: 10.0,
            homophily: 0.7,
            separation: 1.5,
            seed: 0,
            multi_label: false,
        }
    }
}

/// A contextual stochastic block model: a labelled, featured, undirected graph.
///
/// - **Labels:** node classes are balanced (sizes differ by ≤ 1) and assigned in a seeded
///   random order; every node is labelled.
/// - **Features:** `x_i = μ_{y_i} + ε_i`, ε ~ N(0, I). The class means are orthogonal
///   directions (Gram–Schmidt of Gaussian vectors; random unit vectors when `classes >
///   features`) scaled so that any two means lie `separation` apart. The defaults (separation
///   1.5, homophily 0.7, degree 10) are chosen so the features alone are weak evidence while
///   two rounds of GCN aggregation average most of the noise away: a nearest-centroid
///   classifier fitted on the training nodes scores about 0.33 on X (chance is 0.2) and about
///   0.93 on Â²X (seeds 0–2), a stand-in for an MLP versus a 2-layer GCN; the tests check it.
/// - **Edges:** `round(nodes · avg_degree / 2)` distinct undirected edges, no self loops. Each
///   picks a uniform node u; with probability `homophily` its partner is uniform in u's class,
///   otherwise uniform in a uniformly chosen other class. Both directions are listed, sorted.
/// - **Masks** (Planetoid-style): `t = min(20, max(1, ⌊nodes / (10 · classes)⌋))` training
///   nodes per class; of the other R nodes, `min(500, ⌊R/3⌋)` validation and
///   `min(1000, ⌊2R/3⌋)` test nodes, all chosen at random and disjoint.
/// - **Multi-label** (`multi_label`): the classes are communities and the graph has
///   [`Targets`](super::Targets) instead of labels. A node's class above is its first
///   community (it decides the edges and the masks); with probability 1/2 the node also joins
///   one other community, uniform among the rest (its own stream of draws, so the edges,
///   masks and first communities are those of the single-label graph), and its features add
///   that community's mean: `x_i = μ_{y_i} + μ_{s_i} + ε_i`. Its targets are 1 for both.
///   Needs at least 2 classes.
///
/// Errors on parameters that make no such graph (no classes, fewer nodes than classes,
/// homophily outside [0, 1], a degree asking for more than half of the possible pairs).
pub fn csbm(p: &CsbmParams) -> Result<Graph, GraphError> {
    check_csbm(p)?;
    let (n, c) = (p.nodes, p.classes);

    #[allow(
        clippy::cast_possible_truncation,
        reason = "i % c < c ≤ i32::MAX, checked by check_csbm"
    )]
    let mut labels: Vec<i32> = (0..n).map(|i| (i % c) as i32).collect();
    labels.shuffle(&mut rng_stream(p.seed, STREAM_LABELS));
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); c];
    for (i, &y) in labels.iter().enumerate() {
        members[y as usize].push(index::id(i));
    }

    let second = p.multi_label.then(|| second_communities(p, &labels));
    let features = csbm_features(p, &labels, second.as_deref());
    let (src, dst) = csbm_edges(p, &labels, &members)?;
    let (train, val, test) = planetoid_masks(p, &members);
    let (labels, targets) = match second {
        Some(second) => {
            let mut data = vec![0u8; n * c];
            for (i, (&y, &s)) in labels.iter().zip(&second).enumerate() {
                for k in [y, s].into_iter().filter_map(|k| usize::try_from(k).ok()) {
                    data[i * c + k] = 1;
                }
            }
            (None, Some(super::Targets { classes: c, data }))
        }
        None => (Some(labels), None),
    };
    Ok(Graph {
        num_nodes: n,
        src,
        dst,
        weights: None,
        features: Some(features),
        labels,
        targets,
        train_mask: Some(train),
        val_mask: Some(val),
        test_mask: Some(test),
    })
}

/// Each node's second community in a multi-label CSBM, or −1 for none: with probability 1/2 a
/// class other than its first, uniform among them.
fn second_communities(p: &CsbmParams, labels: &[i32]) -> Vec<i32> {
    let c = p.classes;
    let mut rng = rng_stream(p.seed, STREAM_MEMBERSHIP);
    labels
        .iter()
        .map(|&y| {
            if !rng.random_bool(0.5) {
                return -1;
            }
            #[allow(
                clippy::cast_possible_truncation,
                reason = "a class below c ≤ i32::MAX, checked by check_csbm"
            )]
            let other = rng.random_range(0..c - 1) as i32;
            if other >= y {
                other + 1
            } else {
                other
            }
        })
        .collect()
}

fn check_csbm(p: &CsbmParams) -> Result<(), GraphError> {
    if p.classes == 0 || p.features == 0 {
        return Err(invalid(format!(
            "csbm needs at least one class and one feature (got {} classes, {} features)",
            p.classes, p.features
        )));
    }
    if p.nodes > MAX_NODES {
        return Err(GraphErrorKind::TooManyNodes(p.nodes as u64).into());
    }
    if p.multi_label && p.classes < 2 {
        return Err(invalid(format!(
            "a multi-label csbm needs at least 2 classes (communities), got {}",
            p.classes
        )));
    }
    if p.classes > i32::MAX as usize {
        return Err(invalid(format!(
            "csbm needs at most {} classes (labels are i32), got {}",
            i32::MAX,
            p.classes
        )));
    }
    if p.nodes < p.classes.max(2) {
        return Err(invalid(format!(
            "csbm needs at least max(2, classes) nodes (got {} nodes, {} classes)",
            p.nodes, p.classes
        )));
    }
    if !(0.0..=1.0).contains(&p.homophily) {
        return Err(invalid(format!(
            "homophily {} is not in [0, 1]",
            super::show_float(p.homophily)
        )));
    }
    if !p.separation.is_finite() || p.separation < 0.0 {
        return Err(invalid(format!(
            "separation {} is not a finite value ≥ 0",
            super::show_float(p.separation)
        )));
    }
    let n = p.nodes as f64;
    // Rejection sampling of distinct pairs stays fast while at most half of the candidate pairs
    // (overall, and within / across classes for the share routed there) are wanted.
    let wanted = (n * p.avg_degree / 2.0).round();
    let smallest_class = (p.nodes / p.classes) as f64;
    let same_pairs = p.classes as f64 * smallest_class * (smallest_class - 1.0) / 2.0;
    let cross_pairs = n * (n - 1.0) / 2.0 - same_pairs;
    let too_dense = wanted > n * (n - 1.0) / 4.0
        || (p.homophily > 0.0 && p.homophily * wanted > same_pairs / 2.0)
        || (p.homophily < 1.0 && (1.0 - p.homophily) * wanted > cross_pairs / 2.0);
    if !(p.avg_degree.is_finite() && p.avg_degree >= 0.0) || too_dense {
        return Err(invalid(format!(
            "average degree {} is not possible for {} nodes in {} classes at homophily {}: \
             at most half of the possible node pairs may be edges",
            super::show_float(p.avg_degree),
            p.nodes,
            p.classes,
            super::show_float(p.homophily)
        )));
    }
    if p.classes == 1 && p.homophily < 1.0 && wanted > 0.0 {
        return Err(invalid(
            "with one class every edge joins the same class: set homophily to 1".into(),
        ));
    }
    Ok(())
}

/// A standard normal pair by Box–Muller (rand 0.9 has no normal distribution without `rand_distr`).
fn gaussian_pair(rng: &mut ChaCha8Rng) -> (f64, f64) {
    // u1 in (0, 1] so the logarithm is finite.
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    let r = (-2.0 * u1.ln()).sqrt();
    let t = core::f64::consts::TAU * u2;
    (r * t.cos(), r * t.sin())
}

fn fill_gaussian(rng: &mut ChaCha8Rng, out: &mut [f64]) {
    let mut it = out.chunks_exact_mut(2);
    for pair in &mut it {
        let (a, b) = gaussian_pair(rng);
        pair[0] = a;
        pair[1] = b;
    }
    if let [last] = it.into_remainder() {
        *last = gaussian_pair(rng).0;
    }
}

/// Class means `classes × features`, pairwise `separation` apart.
fn class_means(p: &CsbmParams) -> Vec<f64> {
    let (c, f) = (p.classes, p.features);
    let mut rng = rng_stream(p.seed, STREAM_MEANS);
    let mut means = vec![0.0f64; c * f];
    for k in 0..c {
        loop {
            let (done, row) = means.split_at_mut(k * f);
            let row = &mut row[..f];
            fill_gaussian(&mut rng, row);
            if k < f {
                // Gram–Schmidt against the earlier means (already unit vectors).
                for prev in done.chunks_exact(f) {
                    let dot: f64 = prev.iter().zip(row.iter()).map(|(a, b)| a * b).sum();
                    for (r, q) in row.iter_mut().zip(prev) {
                        *r -= dot * q;
                    }
                }
            }
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 1e-6 {
                row.iter_mut().for_each(|x| *x /= norm);
                break;
            }
        }
    }
    // Orthonormal means are √2 apart; scale to `separation`.
    let s = p.separation / core::f64::consts::SQRT_2;
    means.iter_mut().for_each(|x| *x *= s);
    means
}

/// `x_i = μ_{y_i} + ε_i`, plus `μ_{s_i}` where `second` gives node i a second community.
fn csbm_features(p: &CsbmParams, labels: &[i32], second: Option<&[i32]>) -> Features {
    const ROWS_PER_STREAM: usize = 1024;
    let f = p.features;
    let means = class_means(p);
    let mean = |k: usize| &means[k * f..(k + 1) * f];
    let mut data = vec![0.0f32; p.nodes * f];
    data.par_chunks_mut(ROWS_PER_STREAM * f)
        .zip(labels.par_chunks(ROWS_PER_STREAM))
        .enumerate()
        .for_each(|(chunk, (out, ys))| {
            let mut rng = rng_stream(p.seed, chunk as u64);
            let mut noise = vec![0.0f64; f];
            for (i, (row, &y)) in out.chunks_exact_mut(f).zip(ys).enumerate() {
                fill_gaussian(&mut rng, &mut noise);
                let s = second.map_or(-1, |s| s[chunk * ROWS_PER_STREAM + i]);
                if let Ok(s) = usize::try_from(s) {
                    for (e, m) in noise.iter_mut().zip(mean(s)) {
                        *e += m;
                    }
                }
                for ((x, m), e) in row.iter_mut().zip(mean(y as usize)).zip(&noise) {
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "deliberate: rounds the f64 sample to f32"
                    )]
                    let sample = (m + e) as f32;
                    *x = sample;
                }
            }
        });
    Features::new(f, data)
}

fn csbm_edges(
    p: &CsbmParams,
    labels: &[i32],
    members: &[Vec<u32>],
) -> Result<(Vec<u32>, Vec<u32>), GraphError> {
    let (n, c) = (p.nodes, p.classes);
    #[allow(
        clippy::cast_possible_truncation,
        reason = "check_csbm bounds the wanted pairs by half the candidate pairs"
    )]
    let wanted = (n as f64 * p.avg_degree / 2.0).round() as usize;
    let mut rng = rng_stream(p.seed, STREAM_EDGES);
    let mut pairs: Vec<u64> = Vec::with_capacity(wanted + wanted / 8 + 16);
    // check_csbm keeps the wanted pairs ≤ half of the candidates, so each round fills at least
    // half of what is missing in expectation; the cap only guards against a logic error.
    for _round in 0..200 {
        if pairs.len() >= wanted {
            break;
        }
        let missing = wanted - pairs.len();
        for _ in 0..missing {
            let u = rng.random_range(0..n);
            let cu = labels[u] as usize;
            let class = if c == 1 || rng.random_bool(p.homophily) {
                cu
            } else {
                let other = rng.random_range(0..c - 1);
                if other >= cu {
                    other + 1
                } else {
                    other
                }
            };
            let group = &members[class];
            let v = group[rng.random_range(0..group.len())] as usize;
            if u != v {
                let (a, b) = (u.min(v) as u64, u.max(v) as u64);
                pairs.push((a << 32) | b);
            }
        }
        pairs.sort_unstable();
        pairs.dedup();
    }
    if pairs.len() < wanted {
        return Err(invalid(format!(
            "could not draw {wanted} distinct edges (got {}); lower the average degree",
            pairs.len()
        )));
    }
    // Each round draws at most the missing count, so exactly `wanted` pairs remain. List both
    // directions, sorted by (src, dst).
    let mut keys: Vec<u64> = Vec::with_capacity(2 * pairs.len());
    for &k in &pairs {
        keys.push(k);
        keys.push(k.rotate_left(32));
    }
    keys.par_sort_unstable();
    split_keys(&keys)
}

fn planetoid_masks(p: &CsbmParams, members: &[Vec<u32>]) -> (Vec<bool>, Vec<bool>, Vec<bool>) {
    let n = p.nodes;
    let per_class = (n / (10 * p.classes)).clamp(1, 20);
    let mut rng = rng_stream(p.seed, STREAM_MASKS);
    let mut train = vec![false; n];
    for group in members {
        let mut g = group.clone();
        g.shuffle(&mut rng);
        for &i in g.iter().take(per_class) {
            train[i as usize] = true;
        }
    }
    let mut rest: Vec<u32> = (0..index::id(n)).filter(|&i| !train[i as usize]).collect();
    rest.shuffle(&mut rng);
    let r = rest.len();
    let n_val = (r / 3).min(500);
    let n_test = (2 * r / 3).min(1000);
    let mut val = vec![false; n];
    let mut test = vec![false; n];
    for &i in &rest[..n_val] {
        val[i as usize] = true;
    }
    for &i in &rest[n_val..n_val + n_test] {
        test[i as usize] = true;
    }
    (train, val, test)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod node_data_tests {
    use super::*;

    #[test]
    fn random_node_data_has_the_asked_shapes_and_a_disjoint_split() {
        let mut g = rmat(6, 4, 3).unwrap();
        random_node_data(&mut g, 8, 5, 9).unwrap();
        g.validate().unwrap();
        let n = g.num_nodes;
        assert_eq!(g.feature_dim(), 8);
        assert!(g
            .features
            .as_ref()
            .unwrap()
            .data
            .iter()
            .all(|v| (0.0..1.0).contains(v)));
        assert!(g
            .labels
            .as_ref()
            .unwrap()
            .iter()
            .all(|&y| (0..5).contains(&y)));
        let count = |m: &Option<Vec<bool>>| m.as_ref().unwrap().iter().filter(|&&b| b).count();
        assert_eq!(
            (
                count(&g.train_mask),
                count(&g.val_mask),
                count(&g.test_mask)
            ),
            (n / 10, n / 5 - n / 10, 2 * n / 5 - n / 5)
        );
        for v in 0..n {
            let k = [&g.train_mask, &g.val_mask, &g.test_mask]
                .iter()
                .filter(|m| m.as_ref().unwrap()[v])
                .count();
            assert!(k <= 1, "node {v} in {k} masks");
        }
        let mut again = rmat(6, 4, 3).unwrap();
        random_node_data(&mut again, 8, 5, 9).unwrap();
        assert_eq!(again.labels, g.labels);
        assert!(random_node_data(&mut again, 8, 0, 9).is_err());
    }
}
