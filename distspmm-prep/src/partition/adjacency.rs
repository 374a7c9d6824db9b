//! The symmetric, loop-free, duplicate-free adjacency the partitioners take, built from a directed
//! edge list in linear time. Row offsets are 64-bit and neighbour ids 32-bit, so any graph whose
//! nodes fit `u32` fits, however many edges it has; METIS's 32-bit `idx_t` is checked where METIS
//! is called.

use distspmm_sparse::index;
use std::io::Write;
use std::path::Path;
use std::vec::Vec;

use rayon::prelude::*;

use super::PartitionError;
use distspmm_sparse::sparse::par::{range_tasks, split_lengths};

/// Undirected structure of a graph in CSR (`xadj` as `u64` offsets, `adjncy` as `u32` node ids):
/// both directions of every edge, no self loops, no duplicates. Edge weights are ignored —
/// the partitioner balances nodes (or non-zeros) and minimises cut edges.
///
/// Neighbours within a row keep the order in which their edges first appear in the input, so
/// the same edge list always gives the same adjacency (and METIS, with the same seed, the same
/// partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjacency {
    xadj: Vec<u64>,
    adjncy: Vec<u32>,
}

impl Adjacency {
    /// Builds the symmetric adjacency of `num_nodes` nodes from directed edges `src[i] → dst[i]`.
    ///
    /// Linear time and memory: a counting sort by endpoint, then an in-place per-row dedup with a
    /// last-seen marker. The rows are split into one range per thread; each task reads every
    /// edge and writes only its own rows, so the tasks need no synchronisation. Fails when an
    /// id is out of range, the arrays differ in length, or the node count exceeds `u32`.
    pub fn from_edges(num_nodes: usize, src: &[u32], dst: &[u32]) -> Result<Self, PartitionError> {
        if src.len() != dst.len() {
            return Err(PartitionError::EdgeLengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        if num_nodes > u32::MAX as usize {
            return Err(PartitionError::TooManyNodes(num_nodes as u64));
        }
        let n = num_nodes;
        if let Some(edge) = src
            .par_iter()
            .zip(dst)
            .position_first(|(&u, &v)| u as usize >= n || v as usize >= n)
        {
            return Err(PartitionError::EdgeOutOfRange {
                edge,
                src: u64::from(src[edge]),
                dst: u64::from(dst[edge]),
                num_nodes: n as u64,
            });
        }
        let tasks = range_tasks(n);
        let bounds: Vec<usize> = (0..=tasks).map(|t| n * t / tasks).collect();
        let edges = || src.iter().zip(dst).filter(|(u, v)| u != v);

        let what = || {
            std::format!(
                "the symmetric adjacency of {n} nodes and {} edges (for partitioning)",
                src.len()
            )
        };
        // At the peak: both directions of every edge (4 bytes each), per node its degree and the
        // row offsets, and per task a cursor and a last-row marker over all nodes.
        let (n64, e64) = (n as u64, src.len() as u64);
        distspmm_sparse::memory::check(
            what(),
            e64.saturating_mul(8)
                .saturating_add(n64.saturating_mul(16))
                .saturating_add((tasks as u64).saturating_mul(n64).saturating_mul(12)),
            MEMORY_HINT,
        )?;

        // Degrees with duplicates (both directions, loops excluded), each task its own rows.
        let mut degree = distspmm_sparse::memory::try_filled(n, 0usize, what(), MEMORY_HINT)?;
        split_lengths(&mut degree, bounds.windows(2).map(|w| w[1] - w[0]))
            .into_par_iter()
            .zip(bounds.par_windows(2))
            .for_each(|(degree, range)| {
                let lo = range[0];
                let mine = |x: u32| (range[0]..range[1]).contains(&(x as usize));
                for (&u, &v) in edges() {
                    if mine(u) {
                        degree[u as usize - lo] += 1;
                    }
                    if mine(v) {
                        degree[v as usize - lo] += 1;
                    }
                }
            });
        let region_len: Vec<usize> = bounds
            .windows(2)
            .map(|w| degree[w[0]..w[1]].iter().sum())
            .collect();

        // Scatter each task's rows into its own region, then dedup them in place (the degrees
        // become the deduplicated row lengths) and compact to the region's front.
        let mut adjncy: Vec<u32> =
            distspmm_sparse::memory::try_filled(region_len.iter().sum(), 0, what(), MEMORY_HINT)?;
        let kept: Vec<usize> = split_lengths(&mut adjncy, region_len.iter().copied())
            .into_par_iter()
            .zip(split_lengths(
                &mut degree,
                bounds.windows(2).map(|w| w[1] - w[0]),
            ))
            .zip(bounds.par_windows(2))
            .map(|((region, degree), range)| {
                let lo = range[0];
                let mine = |x: u32| (range[0]..range[1]).contains(&(x as usize));
                let mut cursor = Vec::with_capacity(degree.len());
                let mut at = 0usize;
                for &d in degree.iter() {
                    cursor.push(at);
                    at += d;
                }
                for (&u, &v) in edges() {
                    if mine(u) {
                        region[cursor[u as usize - lo]] = v;
                        cursor[u as usize - lo] += 1;
                    }
                    if mine(v) {
                        region[cursor[v as usize - lo]] = u;
                        cursor[v as usize - lo] += 1;
                    }
                }
                // Row r's entries end at cursor[r]; rows are contiguous from the region start.
                let mut last_row = std::vec![u32::MAX; n];
                let (mut read, mut out) = (0usize, 0usize);
                for (r, d) in degree.iter_mut().enumerate() {
                    let end = cursor[r];
                    let row_start = out;
                    for k in read..end {
                        let col = region[k];
                        let seen = &mut last_row[col as usize];
                        if *seen != index::id(r) {
                            *seen = index::id(r);
                            region[out] = col;
                            out += 1;
                        }
                    }
                    read = end;
                    *d = out - row_start;
                }
                out
            })
            .collect();

        // Close the gaps between the regions and build the row offsets.
        let mut write = 0usize;
        let mut read = 0usize;
        for (&len, &keep) in region_len.iter().zip(&kept) {
            adjncy.copy_within(read..read + keep, write);
            write += keep;
            read += len;
        }
        adjncy.truncate(write);
        adjncy.shrink_to_fit();
        let mut xadj: Vec<u64> =
            distspmm_sparse::memory::try_with_capacity(n + 1, what(), MEMORY_HINT)?;
        xadj.push(0);
        let mut at = 0u64;
        for &d in &degree {
            at += d as u64;
            xadj.push(at);
        }
        Ok(Self { xadj, adjncy })
    }

    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.xadj.len() - 1
    }

    /// Number of undirected edges (each stored twice in `adjncy`).
    pub fn num_edges(&self) -> u64 {
        self.adjncy.len() as u64 / 2
    }

    /// Row offsets, `num_nodes + 1` entries.
    pub fn xadj(&self) -> &[u64] {
        &self.xadj
    }

    /// Neighbour lists, concatenated.
    pub fn adjncy(&self) -> &[u32] {
        &self.adjncy
    }

    /// The neighbours of `node`.
    pub fn neighbours(&self, node: usize) -> &[u32] {
        &self.adjncy[index::offset(self.xadj[node])..index::offset(self.xadj[node + 1])]
    }

    /// Writes the graph in METIS's text `.graph` format (1-based, unweighted), the input of
    /// `gpmetis`, so its partitions can be compared with ours on the very same graph. The file
    /// is written atomically (`chunk_format::atomic`).
    pub fn write_metis_graph(&self, path: &Path) -> Result<(), PartitionError> {
        let io_err = |source| PartitionError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file =
            chunk_format::atomic::AtomicFile::create(path).map_err(|e| io_err(e.into()))?;
        self.write_metis_text(file.file()).map_err(io_err)?;
        file.commit().map_err(|e| io_err(e.into()))
    }

    fn write_metis_text(&self, file: &mut std::fs::File) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        writeln!(out, "{} {}", self.num_nodes(), self.num_edges())?;
        let mut line = String::new();
        for node in 0..self.num_nodes() {
            line.clear();
            for (k, &v) in self.neighbours(node).iter().enumerate() {
                if k > 0 {
                    line.push(' ');
                }
                push_decimal(&mut line, v as u64 + 1);
            }
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        out.flush()
    }
}

fn push_decimal(line: &mut String, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        line.push(d as char);
    }
}

/// What to do when the adjacency does not fit.
const MEMORY_HINT: &str = "use a machine with more memory, or partition a smaller graph";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn reference(n: usize, src: &[u32], dst: &[u32]) -> Vec<BTreeSet<u32>> {
        let mut rows = std::vec![BTreeSet::new(); n];
        for (&u, &v) in src.iter().zip(dst) {
            if u != v {
                rows[u as usize].insert(v);
                rows[v as usize].insert(u);
            }
        }
        rows
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_set_reference(
            n in 1usize..40,
            edges in proptest::collection::vec((0u32..40, 0u32..40), 0..200),
        ) {
            let (src, dst): (Vec<u32>, Vec<u32>) =
                edges.iter().map(|&(u, v)| (u % u32::try_from(n).unwrap(), v % u32::try_from(n).unwrap())).unzip();
            let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
            let want = reference(n, &src, &dst);
            prop_assert_eq!(adj.num_nodes(), n);
            let mut total = 0;
            for (node, row) in want.iter().enumerate() {
                let got = adj.neighbours(node);
                let got_set: BTreeSet<u32> = got.iter().copied().collect();
                prop_assert_eq!(got.len(), got_set.len(), "duplicates in row {}", node);
                prop_assert_eq!(&got_set, row);
                total += row.len();
            }
            prop_assert_eq!(adj.adjncy().len(), total);
        }
    }

    #[test]
    fn rejects_out_of_range_and_mismatched_edges() {
        assert!(matches!(
            Adjacency::from_edges(3, &[0, 3], &[1, 0]),
            Err(PartitionError::EdgeOutOfRange { edge: 1, .. })
        ));
        assert!(matches!(
            Adjacency::from_edges(3, &[0], &[1, 2]),
            Err(PartitionError::EdgeLengthMismatch { src: 1, dst: 2 })
        ));
    }

    #[test]
    fn metis_graph_file_is_one_based_and_symmetric() {
        let adj = Adjacency::from_edges(3, &[0, 1, 1, 2], &[1, 0, 2, 2]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.graph");
        adj.write_metis_graph(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "3 2\n2\n1 3\n2\n");
    }
}
