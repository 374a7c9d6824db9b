//! A partition's quality over the distributed graph (collective): the edge cut and every
//! part's vertex weight. Each rank asks the owners of its arcs' remote ends for their parts (two
//! all-to-all-v exchanges of the distinct remote ids, 16 bytes per distinct remote end), then
//! counts its cut arcs; the sums are all-reduced.

use dist_comm::{AllGather, AllReduce, AllToAllV, BlockLayout, ReduceOp};

use crate::check::index;
use crate::{DistGraph, InputErrorKind, PtScotchError};

/// What a partition of the whole graph gives, the same on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quality {
    /// Edges whose two ends lie in different parts (cut arcs / 2).
    pub edge_cut: u64,
    /// The edge weights of the cut edges (cut arcs' weights / 2; `edge_cut` without weights).
    pub cut_weight: u64,
    /// The vertex weight of each part (its vertex count without weights).
    pub part_weights: Vec<u64>,
}

impl Quality {
    /// The heaviest part's weight over the mean part weight (1.0 is perfect balance; 0.0 for
    /// a graph without vertices).
    pub fn imbalance(&self) -> f64 {
        let total: u64 = self.part_weights.iter().sum();
        let max = self.part_weights.iter().copied().max().unwrap_or(0);
        if total == 0 {
            return 0.0;
        }
        max as f64 * self.part_weights.len() as f64 / total as f64
    }
}

/// The edge cut and part weights of `parts` (the part of each of this rank's vertices, each
/// `< k`) over `graph`, a graph [`crate::partition`] accepts (collective).
///
/// # Errors
/// [`PtScotchError::Input`] on every rank when some rank's `parts` has the wrong length or a
/// part ≥ `k` ([`InputErrorKind::Parts`]); [`PtScotchError::Comm`] from the exchanges.
pub fn evaluate<C: AllReduce + AllGather + AllToAllV>(
    comm: &C,
    graph: &DistGraph<'_>,
    parts: &[u32],
    k: usize,
) -> Result<Quality, PtScotchError> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let vtxdist = graph.vtxdist;
    let local = check_parts(graph, rank, parts, k);
    if let Err(failure) = dist_comm::agree::outcome(comm, local)? {
        return Err(PtScotchError::Input {
            rank: Some(failure.rank),
            kind: InputErrorKind::Parts,
            message: failure.message,
        });
    }
    let (first, end) = (vtxdist[rank], vtxdist[rank + 1]);

    // The distinct remote ends, sorted: sorted by owner too, as owners hold increasing ranges.
    let mut remote: Vec<u64> = graph
        .adjncy
        .iter()
        .copied()
        .filter(|&v| v < first || v >= end)
        .collect();
    remote.sort_unstable();
    remote.dedup();
    let mut send_counts = vec![0usize; ranks];
    let mut owner = 0usize;
    for &v in &remote {
        while v >= vtxdist[owner + 1] {
            owner += 1;
        }
        send_counts[owner] += 1;
    }
    let ones = BlockLayout::packed(vec![1usize; ranks]);
    let counts_out: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
    let mut counts_in = vec![0u64; ranks];
    comm.all_to_all_v(&counts_out, &ones, &mut counts_in, &ones)?;
    let recv_counts: Vec<usize> = counts_in.iter().map(|&c| index(c)).collect();
    let asked_layout = BlockLayout::packed(recv_counts);
    let remote_layout = BlockLayout::packed(send_counts);
    let mut asked = vec![0u64; asked_layout.extent()];
    comm.all_to_all_v(&remote, &remote_layout, &mut asked, &asked_layout)?;
    let answers: Vec<u64> = asked
        .iter()
        .map(|&v| u64::from(parts[index(v - first)]))
        .collect();
    let mut remote_parts = vec![0u64; remote.len()];
    comm.all_to_all_v(&answers, &asked_layout, &mut remote_parts, &remote_layout)?;
    drop((asked, answers));

    let part_of = |v: u64| -> u64 {
        if v >= first && v < end {
            u64::from(parts[index(v - first)])
        } else {
            // Every remote end is in `remote` (built from the same arcs).
            remote
                .binary_search(&v)
                .map_or(u64::MAX, |at| remote_parts[at])
        }
    };
    let mut sums = [0u64; 2];
    let mut weights = vec![0u64; k];
    for (i, range) in graph.xadj.windows(2).enumerate() {
        let p = parts[i];
        weights[p as usize] += graph.vertex_weights.map_or(1, |w| w[i]);
        for e in index(range[0])..index(range[1]) {
            if part_of(graph.adjncy[e]) != u64::from(p) {
                sums[0] += 1;
                sums[1] += graph.edge_weights.map_or(1, |w| w[e]);
            }
        }
    }
    comm.all_reduce(&mut sums, ReduceOp::Sum)?;
    comm.all_reduce(&mut weights, ReduceOp::Sum)?;
    Ok(Quality {
        edge_cut: sums[0] / 2,
        cut_weight: sums[1] / 2,
        part_weights: weights,
    })
}

/// `parts` fits this rank's vertices and `k`.
fn check_parts(graph: &DistGraph<'_>, rank: usize, parts: &[u32], k: usize) -> Result<(), String> {
    let owned = graph.xadj.len().saturating_sub(1);
    if parts.len() != owned {
        return Err(format!(
            "rank {rank} holds {owned} vertices but {} parts",
            parts.len()
        ));
    }
    if let Some((i, &p)) = parts.iter().enumerate().find(|(_, &p)| p as usize >= k) {
        return Err(format!(
            "vertex {} is in part {p}, but there are {k} parts",
            graph.vtxdist[rank] + i as u64
        ));
    }
    Ok(())
}
