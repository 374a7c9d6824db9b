//! The graph a distributed partitioner takes, built on the ranks from their slices of the edge
//! list: rank r holds the rows of its node range ([`crate::graph::slice_range`]) of the
//! symmetric, loop-free, duplicate-free adjacency, with global neighbour ids (PT-Scotch's and
//! ParMETIS's distributed CSR).

use std::vec::Vec;

use dist_comm::CommError;

use crate::chunk::distributed::{exchange, BuildComm};
use crate::graph::slice_range;
use distspmm_sparse::index;

/// One rank's rows of the symmetric adjacency (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistAdjacency {
    /// The first node of every rank, then N (P + 1 entries, the same on every rank).
    pub vtxdist: Vec<u64>,
    /// Offsets of this rank's rows in `adjncy` (its node count + 1, from 0).
    pub xadj: Vec<u64>,
    /// Neighbours (global ids), increasing within a row.
    pub adjncy: Vec<u64>,
}

impl DistAdjacency {
    /// Builds this rank's rows from its slice of the directed edges `src[e] → dst[e]` (ids below
    /// `num_nodes`, checked by the caller): both arcs of every edge go to the ranks owning
    /// their first ends (one all-to-all-v), which sort and deduplicate their rows. Every rank
    /// calls it at once.
    pub fn build<C: BuildComm>(
        comm: &C,
        num_nodes: usize,
        src: &[u32],
        dst: &[u32],
    ) -> Result<Self, CommError> {
        let ranks = comm.size();
        let vtxdist: Vec<u64> = (0..ranks)
            .map(|r| slice_range(num_nodes as u64, ranks, r).start)
            .chain([num_nodes as u64])
            .collect();
        let owner = |v: u32| vtxdist[1..].partition_point(|&end| end <= u64::from(v));
        let mut counts = std::vec![0usize; ranks];
        for (&u, &v) in src.iter().zip(dst) {
            if u != v {
                counts[owner(u)] += 2;
                counts[owner(v)] += 2;
            }
        }
        let mut cursor = Vec::with_capacity(ranks);
        let mut at = 0usize;
        for &c in &counts {
            cursor.push(at);
            at += c;
        }
        let mut send = std::vec![0u32; at];
        for (&u, &v) in src.iter().zip(dst) {
            if u != v {
                for (a, b) in [(u, v), (v, u)] {
                    let k = &mut cursor[owner(a)];
                    send[*k] = a;
                    send[*k + 1] = b;
                    *k += 2;
                }
            }
        }
        let (arcs, _) = exchange(comm, &send, &counts)?;
        drop(send);
        let rank = comm.rank();
        let first = vtxdist[rank];
        let rows = index::offset(vtxdist[rank + 1] - first);
        let mut xadj = std::vec![0u64; rows + 1];
        for pair in arcs.chunks_exact(2) {
            xadj[index::offset(u64::from(pair[0]) - first) + 1] += 1;
        }
        for i in 0..rows {
            xadj[i + 1] += xadj[i];
        }
        let mut next: Vec<u64> = xadj[..rows].to_vec();
        let mut adjncy = std::vec![0u64; arcs.len() / 2];
        for pair in arcs.chunks_exact(2) {
            let row = index::offset(u64::from(pair[0]) - first);
            adjncy[index::offset(next[row])] = u64::from(pair[1]);
            next[row] += 1;
        }
        drop(arcs);
        // Sort and deduplicate each row in place, compacting as it goes.
        let mut out = 0usize;
        let mut start = 0usize;
        for i in 0..rows {
            let end = index::offset(xadj[i + 1]);
            adjncy[start..end].sort_unstable();
            let row_start = out;
            for k in start..end {
                if out == row_start || adjncy[out - 1] != adjncy[k] {
                    adjncy[out] = adjncy[k];
                    out += 1;
                }
            }
            start = end;
            xadj[i + 1] = out as u64;
        }
        adjncy.truncate(out);
        adjncy.shrink_to_fit();
        Ok(Self {
            vtxdist,
            xadj,
            adjncy,
        })
    }

    /// `--balance nnz`'s vertex weights, as the single-machine partitioners get them: degree +
    /// 1 (the self loop of `A + I`).
    pub fn nonzero_weights(&self) -> Vec<u64> {
        self.xadj.windows(2).map(|w| w[1] - w[0] + 1).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::generate;
    use crate::partition::Adjacency;
    use dist_comm::{Group, LocalComm};

    #[test]
    fn the_ranks_rows_are_the_single_machine_adjacency_sorted() {
        let mut g = generate::rmat(8, 4, 5).unwrap();
        g.src.extend([3, 3, 7]);
        g.dst.extend([3, 9, 9]);
        let whole = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
        for ranks in 1..=4 {
            let rows = LocalComm::run(ranks, |comm| {
                let slice = crate::graph::GraphSlice::cut(&g, comm.rank(), ranks);
                DistAdjacency::build(&comm, g.num_nodes, &slice.src, &slice.dst).unwrap()
            });
            let mut v = 0usize;
            for part in &rows {
                assert_eq!(part.vtxdist, rows[0].vtxdist);
                for (i, w) in part.xadj.windows(2).enumerate() {
                    let mut expected: Vec<u64> =
                        whole.neighbours(v).iter().map(|&u| u64::from(u)).collect();
                    expected.sort_unstable();
                    assert_eq!(
                        &part.adjncy[index::offset(w[0])..index::offset(w[1])],
                        &expected[..],
                        "row {i}"
                    );
                    assert_eq!(part.nonzero_weights()[i], expected.len() as u64 + 1);
                    v += 1;
                }
            }
            assert_eq!(v, g.num_nodes);
        }
    }
}
