//! The symmetric, loop-free, duplicate-free adjacency METIS partitions, built from a directed edge
//! list in linear time.

use std::io::Write;
use std::path::Path;
use std::vec::Vec;

use metis::Idx;

use super::PartitionError;

/// Undirected structure of a graph in METIS's CSR layout (`xadj`, `adjncy` as [`metis::Idx`]):
/// both directions of every edge, no self loops, no duplicates. Edge weights are ignored —
/// the partitioner balances nodes and minimises cut edges.
///
/// Neighbours within a row keep the order in which their edges first appear in the input, so
/// the same edge list always gives the same adjacency (and METIS, with the same seed, the same
/// partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjacency {
    xadj: Vec<Idx>,
    adjncy: Vec<Idx>,
}

impl Adjacency {
    /// Builds the symmetric adjacency of `num_nodes` nodes from directed edges `src[i] → dst[i]`.
    ///
    /// Linear time and memory: a counting sort by endpoint, then an in-place per-row dedup with a
    /// last-seen marker. Fails when an id is out of range, the arrays differ in length, or the
    /// node or adjacency-entry count does not fit METIS's index type.
    pub fn from_edges(num_nodes: usize, src: &[u32], dst: &[u32]) -> Result<Self, PartitionError> {
        if src.len() != dst.len() {
            return Err(PartitionError::EdgeLengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        let n_idx = to_idx(num_nodes as u64, "node count")?;
        // Row degree counts (both directions, loops excluded), with the range check.
        let mut start = std::vec![0usize; num_nodes + 1];
        for (i, (&u, &v)) in src.iter().zip(dst).enumerate() {
            let (u, v) = (u as usize, v as usize);
            if u >= num_nodes || v >= num_nodes {
                return Err(PartitionError::EdgeOutOfRange {
                    edge: i,
                    src: u as u64,
                    dst: v as u64,
                    num_nodes: num_nodes as u64,
                });
            }
            if u != v {
                start[u + 1] += 1;
                start[v + 1] += 1;
            }
        }
        for i in 0..num_nodes {
            start[i + 1] += start[i];
        }
        let total = start[num_nodes];
        // The pre-dedup entry count bounds the final one; check it against Idx first so that
        // every position below fits.
        to_idx(total as u64, "adjacency entry count (twice the edges)")?;
        let mut adjncy: Vec<Idx> = std::vec![0; total];
        let mut fill = start.clone();
        for (&u, &v) in src.iter().zip(dst) {
            if u != v {
                let (u, v) = (u as usize, v as usize);
                adjncy[fill[u]] = v as Idx;
                fill[u] += 1;
                adjncy[fill[v]] = u as Idx;
                fill[v] += 1;
            }
        }
        drop(fill);
        // Dedup each row in place, compacting towards the front.
        let mut last_row = std::vec![usize::MAX; num_nodes];
        let mut xadj: Vec<Idx> = Vec::with_capacity(num_nodes + 1);
        xadj.push(0);
        let mut out = 0usize;
        for row in 0..num_nodes {
            for k in start[row]..start[row + 1] {
                let col = adjncy[k];
                let seen = &mut last_row[col as usize];
                if *seen != row {
                    *seen = row;
                    adjncy[out] = col;
                    out += 1;
                }
            }
            xadj.push(out as Idx);
        }
        adjncy.truncate(out);
        adjncy.shrink_to_fit();
        debug_assert_eq!(xadj.len() as Idx - 1, n_idx);
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
    pub fn xadj(&self) -> &[Idx] {
        &self.xadj
    }

    /// Neighbour lists, concatenated.
    pub fn adjncy(&self) -> &[Idx] {
        &self.adjncy
    }

    /// The neighbours of `node`.
    pub fn neighbours(&self, node: usize) -> &[Idx] {
        &self.adjncy[self.xadj[node] as usize..self.xadj[node + 1] as usize]
    }

    /// Writes the graph in METIS's text `.graph` format (1-based, unweighted), the input of
    /// `gpmetis`, so its partitions can be compared with ours on the very same graph.
    pub fn write_metis_graph(&self, path: &Path) -> Result<(), PartitionError> {
        let io_err = |source| PartitionError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io_err)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        writeln!(out, "{} {}", self.num_nodes(), self.num_edges()).map_err(io_err)?;
        let mut line = std::string::String::new();
        for node in 0..self.num_nodes() {
            line.clear();
            for (k, &v) in self.neighbours(node).iter().enumerate() {
                if k > 0 {
                    line.push(' ');
                }
                push_decimal(&mut line, v as u64 + 1);
            }
            line.push('\n');
            out.write_all(line.as_bytes()).map_err(io_err)?;
        }
        out.flush().map_err(io_err)
    }
}

fn push_decimal(line: &mut std::string::String, mut value: u64) {
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

fn to_idx(value: u64, what: &'static str) -> Result<Idx, PartitionError> {
    Idx::try_from(value).map_err(|_| PartitionError::TooLargeForMetis {
        what,
        value,
        max: Idx::MAX as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn reference(n: usize, src: &[u32], dst: &[u32]) -> Vec<BTreeSet<Idx>> {
        let mut rows = std::vec![BTreeSet::new(); n];
        for (&u, &v) in src.iter().zip(dst) {
            if u != v {
                rows[u as usize].insert(v as Idx);
                rows[v as usize].insert(u as Idx);
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
                edges.iter().map(|&(u, v)| (u % n as u32, v % n as u32)).unzip();
            let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
            let want = reference(n, &src, &dst);
            prop_assert_eq!(adj.num_nodes(), n);
            let mut total = 0;
            for (node, row) in want.iter().enumerate() {
                let got = adj.neighbours(node);
                let got_set: BTreeSet<Idx> = got.iter().copied().collect();
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
