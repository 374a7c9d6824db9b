//! What the GPU operator derives from a chunk on the host before it uploads anything: the
//! packed layout of the halo exchange (who sends which rows, where each block sits in the
//! contiguous send and receive buffers) and the fixed-order scatter-add of the backward.
//! Pure host code; the unit tests run without a GPU.

use chunk_format::ChunkView;
use distspmm_core::schedule::HaloPlan;
use distspmm_cuda::ScatterPlan;

use super::super::DistSpmmError;

/// One block of a packed buffer: the peer it goes to or comes from, its first row in the
/// buffer and its number of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// The peer rank.
    pub(crate) peer: usize,
    /// First row of the block in the packed buffer.
    pub(crate) first: usize,
    /// Rows of the block.
    pub(crate) rows: usize,
}

/// The halo exchange of one rank, laid out in two contiguous buffers (forward roles; the
/// backward swaps them, as the CPU operator does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HaloLayout {
    /// The send blocks in increasing peer: the rows of `X_p` each peer needs.
    pub(crate) sends: Vec<Segment>,
    /// Every send list concatenated in increasing peer (the gather kernel's row ids).
    pub(crate) send_rows: Vec<u32>,
    /// The receive blocks in increasing source part, one per remote block of the chunk (the
    /// block's compacted columns are the rows of its segment).
    pub(crate) recvs: Vec<Segment>,
    /// The backward's scatter-add: partial sums received in the send layout, added into the
    /// rows they belong to in increasing peer.
    pub(crate) scatter: ScatterPlan,
}

/// Lays `(peer, rows)` blocks out one after another.
fn segments(blocks: impl Iterator<Item = (usize, usize)>) -> Vec<Segment> {
    let mut first = 0;
    blocks
        .map(|(peer, rows)| {
            let s = Segment { peer, first, rows };
            first += rows;
            s
        })
        .collect()
}

/// Rows of all segments together.
pub(crate) fn total_rows(segments: &[Segment]) -> usize {
    segments.iter().map(|s| s.rows).sum()
}

impl HaloLayout {
    /// The layout of `chunk`'s halo plan.
    ///
    /// # Errors
    /// [`DistSpmmError::Shape`] when a send list is not strictly increasing or names a row the
    /// part does not own (a chunk the format check let through), or when a remote block's
    /// columns do not match its receive list.
    pub(crate) fn new(chunk: &ChunkView<'_>) -> Result<Self, DistSpmmError> {
        let plan = HaloPlan::from_chunk(chunk);
        let part = chunk.part_id();
        let lists: Vec<(usize, &[u32])> =
            plan.send_peers().map(|r| (r, plan.send_list(r))).collect();
        let sends = segments(lists.iter().map(|&(r, l)| (r, l.len())));
        let send_rows: Vec<u32> = lists.iter().flat_map(|&(_, l)| l.iter().copied()).collect();
        let recvs = segments(
            chunk
                .blocks()
                .filter(|b| b.src_part as usize != part)
                .map(|b| (b.src_part as usize, b.ncols)),
        );
        for s in &recvs {
            let expected = plan.recv_list(s.peer).len();
            if expected != s.rows {
                return Err(DistSpmmError::Shape(format!(
                    "part {part}'s block from part {} has {} columns but its halo receive list \
                     has {expected} rows",
                    s.peer, s.rows
                )));
            }
        }
        let refs: Vec<&[u32]> = lists.iter().map(|&(_, l)| l).collect();
        let scatter = ScatterPlan::new(chunk.num_local_nodes(), &refs)
            .map_err(|e| DistSpmmError::Shape(format!("part {part}'s halo send lists: {e}")))?;
        Ok(Self {
            sends,
            send_rows,
            recvs,
            scatter,
        })
    }

    /// Rows sent per forward call (rows of the send buffer).
    pub(crate) fn sent_rows(&self) -> usize {
        self.send_rows.len()
    }

    /// Halo rows received per forward call (rows of the receive buffer).
    pub(crate) fn halo_rows(&self) -> usize {
        total_rows(&self.recvs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spmm::tests::{chunks, views};

    #[test]
    fn layout_matches_the_halo_plan() {
        // A ring of 12 nodes with chords, split into 3 interleaved parts.
        let n = 12;
        let mut edges: Vec<(u32, u32)> = (0..n as u32).map(|i| (i, (i + 1) % n as u32)).collect();
        edges.extend([(0, 6), (3, 9), (2, 7)]);
        let part_of: Vec<u32> = (0..n as u32).map(|i| i % 3).collect();
        let bufs = chunks(n, &edges, &part_of, 3);
        let views = views(&bufs);
        for chunk in &views {
            let plan = HaloPlan::from_chunk(chunk);
            let layout = HaloLayout::new(chunk).unwrap();
            assert_eq!(layout.sent_rows() as u64, plan.sent_rows());
            assert_eq!(layout.halo_rows() as u64, plan.halo_rows());
            // Sends: increasing peers, contiguous, the plan's lists in order.
            let mut first = 0;
            for (s, r) in layout.sends.iter().zip(plan.send_peers()) {
                assert_eq!((s.peer, s.first), (r, first));
                assert_eq!(
                    &layout.send_rows[s.first..s.first + s.rows],
                    plan.send_list(r)
                );
                first += s.rows;
            }
            assert_eq!(layout.sends.len(), plan.send_peers().count());
            // Receives: increasing sources, each the length of its receive list.
            assert!(layout.recvs.windows(2).all(|w| w[0].peer < w[1].peer));
            for s in &layout.recvs {
                assert_eq!(s.rows, plan.recv_list(s.peer).len());
                assert_ne!(s.peer, chunk.part_id());
            }
            // The scatter plan adds packed row k into send_rows[k], in increasing peer.
            let sc = &layout.scatter;
            assert_eq!(sc.packed_rows(), layout.sent_rows());
            assert_eq!(sc.output_rows(), chunk.num_local_nodes());
            let mut seen = vec![Vec::new(); chunk.num_local_nodes()];
            for (k, &r) in layout.send_rows.iter().enumerate() {
                seen[r as usize].push(k as u64);
            }
            for (k, &r) in sc.rows().iter().enumerate() {
                let srcs = &sc.src()[sc.ptr()[k] as usize..sc.ptr()[k + 1] as usize];
                assert_eq!(srcs, seen[r as usize].as_slice());
                assert!(srcs.windows(2).all(|w| w[0] < w[1]));
            }
            let targets = seen.iter().filter(|s| !s.is_empty()).count();
            assert_eq!(sc.rows().len(), targets);
        }
    }

    #[test]
    fn a_single_part_has_nothing_to_exchange() {
        let bufs = chunks(4, &[(0, 1), (1, 2), (2, 3)], &[0, 0, 0, 0], 1);
        let views = views(&bufs);
        let layout = HaloLayout::new(&views[0]).unwrap();
        assert!(layout.sends.is_empty() && layout.recvs.is_empty());
        assert_eq!((layout.sent_rows(), layout.halo_rows()), (0, 0));
        assert!(layout.scatter.rows().is_empty());
    }
}
