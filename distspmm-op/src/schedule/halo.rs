//! [`HaloPlan`]: the sparsity-aware schedule, one exchange of halo rows per call.

use chunk_format::ChunkView;
use distspmm_sparse::index;

use super::{LayerTraffic, Traffic, Workspace, VALUE_BYTES};

/// The halo schedule as seen by one rank p, borrowing the halo lists of p's chunk.
///
/// ```text
/// forward  (Y_p = Â[p][p]·X_p + Σ_q Â[p][q]·H_q):
///     post receives H_q ← q for every q in recv_peers      (|recv(q)|·F values)
///     for r in send_peers: send X_p[send(r)] → r           (packed, |send(r)|·F values)
///     Y_p = Â[p][p]·X_p                                    (while the messages travel)
///     for q in recv_peers, increasing, as soon as H_q is in:
///         Y_p += Â[p][q]·H_q                               (compacted columns = rows of H_q)
/// backward (dX_p = Â[p][p]ᵀ·dY_p + Σ_r scatter(send(r), G_r)):
///     post receives G_r ← r for every r in send_peers      (|send(r)|·F values)
///     for q in recv_peers: send Â[p][q]ᵀ·dY_p → q          (CSC of the compacted block: the
///                                                           |recv(q)| halo rows only)
///     dX_p = Â[p][p]ᵀ·dY_p
///     for r in send_peers, increasing, as soon as G_r is in:
///         dX_p[send(r)[i]] += G_r[i]
/// ```
///
/// `recv(q)` is the sorted q-local ids of the rows of `X_q` that p's non-zeros reference,
/// exactly those; `send(r)` is what r receives from p. Rank p receives from q iff its chunk
/// has a block `Â[p][q]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaloPlan<'a> {
    rank: usize,
    recv_offsets: &'a [u64],
    recv: &'a [u32],
    send_offsets: &'a [u64],
    send: &'a [u32],
}

impl<'a> HaloPlan<'a> {
    /// The plan of the rank that holds `chunk`, borrowing its halo lists (no copy).
    pub fn from_chunk(chunk: &ChunkView<'a>) -> Self {
        Self {
            rank: chunk.part_id(),
            recv_offsets: chunk.halo_recv_offsets(),
            recv: chunk.halo_recv_flat(),
            send_offsets: chunk.halo_send_offsets(),
            send: chunk.halo_send_flat(),
        }
    }

    /// This rank p.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks P.
    pub fn parts(&self) -> usize {
        self.recv_offsets.len() - 1
    }

    /// The sorted q-local ids of the rows this rank receives from `q` (empty for itself and
    /// for parts its rows do not reference).
    ///
    /// # Panics
    /// If `q ≥ P`.
    pub fn recv_list(&self, q: usize) -> &'a [u32] {
        &self.recv[index::offset(self.recv_offsets[q])..index::offset(self.recv_offsets[q + 1])]
    }

    /// The sorted local ids of the rows this rank sends to `r`.
    ///
    /// # Panics
    /// If `r ≥ P`.
    pub fn send_list(&self, r: usize) -> &'a [u32] {
        &self.send[index::offset(self.send_offsets[r])..index::offset(self.send_offsets[r + 1])]
    }

    /// The parts this rank receives halo rows from, increasing.
    pub fn recv_peers(&self) -> impl Iterator<Item = usize> + 'a {
        let offsets = self.recv_offsets;
        (0..offsets.len() - 1).filter(move |&q| offsets[q + 1] > offsets[q])
    }

    /// The parts this rank sends halo rows to, increasing.
    pub fn send_peers(&self) -> impl Iterator<Item = usize> + 'a {
        let offsets = self.send_offsets;
        (0..offsets.len() - 1).filter(move |&r| offsets[r + 1] > offsets[r])
    }

    /// Halo rows received per forward call, from all peers together (H).
    pub fn halo_rows(&self) -> u64 {
        self.recv.len() as u64
    }

    /// Rows sent per forward call, to all peers together.
    pub fn sent_rows(&self) -> u64 {
        self.send.len() as u64
    }

    /// Bytes this rank sends and receives per forward and backward call with `features`
    /// columns.
    pub fn traffic(&self, features: usize) -> LayerTraffic {
        LayerTraffic::symmetric(Traffic::rows(self.sent_rows(), self.halo_rows(), features))
    }

    /// What the operator allocates: a send buffer of all sent rows and a receive buffer of all
    /// halo rows (backward reuses them with the roles swapped); no structure beyond the chunk.
    pub fn workspace(&self, features: usize) -> Workspace {
        workspace(self.sent_rows(), self.halo_rows(), features)
    }
}

/// The halo operator's buffers for `sent` and `received` rows of `features` values.
pub(super) fn workspace(sent: u64, received: u64, features: usize) -> Workspace {
    Workspace {
        buffers: (sent + received) * features as u64 * VALUE_BYTES,
        structure: 0,
    }
}
