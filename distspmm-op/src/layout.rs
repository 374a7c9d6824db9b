//! The packed layout of the halo exchange, derived from a chunk on the host: who sends which
//! rows, and where each block sits in the contiguous send and receive buffers. Both backends
//! run the halo schedule over it.

use crate::schedule::HaloPlan;
use chunk_format::ChunkView;

use crate::DistSpmmError;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HaloLayout {
    /// The send blocks in increasing peer: the rows of `X_p` each peer needs.
    pub(crate) sends: Vec<Segment>,
    /// Every send list concatenated in increasing peer (the gather kernel's row ids).
    pub(crate) send_rows: Vec<u32>,
    /// The receive blocks in increasing source part, one per remote block of the chunk (the
    /// block's compacted columns are the rows of its segment).
    pub(crate) recvs: Vec<Segment>,
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

impl HaloLayout {
    /// The layout of `chunk`'s halo plan.
    ///
    /// # Errors
    /// [`DistSpmmError::Shape`] when a remote block's columns do not match its receive list
    /// (the chunk format checks that too).
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
        Ok(Self {
            sends,
            send_rows,
            recvs,
        })
    }

    /// Rows sent per forward call (rows of the send buffer).
    pub(crate) fn sent_rows(&self) -> usize {
        self.send_rows.len()
    }

    /// Halo rows received per forward call (rows of the receive buffer).
    #[cfg(test)]
    pub(crate) fn halo_rows(&self) -> usize {
        self.recvs.iter().map(|s| s.rows).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{chunks, views};

    #[test]
    fn layout_matches_the_halo_plan() {
        // A ring of 12 nodes with chords, split into 3 interleaved parts.
        let n = 12;
        let n32 = u32::try_from(n).unwrap();
        let mut edges: Vec<(u32, u32)> = (0..n32).map(|i| (i, (i + 1) % n32)).collect();
        edges.extend([(0, 6), (3, 9), (2, 7)]);
        let part_of: Vec<u32> = (0..n32).map(|i| i % 3).collect();
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
        }
    }

    #[test]
    fn a_single_part_has_nothing_to_exchange() {
        let bufs = chunks(4, &[(0, 1), (1, 2), (2, 3)], &[0, 0, 0, 0], 1);
        let views = views(&bufs);
        let layout = HaloLayout::new(&views[0]).unwrap();
        assert!(layout.sends.is_empty() && layout.recvs.is_empty());
        assert_eq!((layout.sent_rows(), layout.halo_rows()), (0, 0));
    }
}
