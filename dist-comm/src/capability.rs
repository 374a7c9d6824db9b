//! The capability traits: each names one thing a communicator can do, so code asks only
//! for what it uses (`fn agree<C: AllGather>(…)`, `fn halo<C: PointToPoint>(…)`).
//!
//! All calls are *collective over the group* unless marked otherwise: every rank must make the
//! same sequence of collective calls with matching arguments (same root, same lengths, same
//! element type). Calls take `&self`; a communicator is used by one thread at a time (handles
//! are `!Sync`), see the crate docs on thread-safety.

use crate::element::{Element, ReduceOp, Reducible};
use crate::layout::BlockLayout;
use crate::CommError;

/// A message tag of a point-to-point message.
pub type Tag = u16;

/// The largest tag every MPI library accepts (`MPI_TAG_UB` is at least 32767).
pub const MAX_TAG: Tag = 32767;

/// Membership of a group of ranks.
pub trait Group {
    /// This process's rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn size(&self) -> usize;

    /// Returns once every rank has entered the barrier (collective).
    ///
    /// # Errors
    /// [`CommError::PeerFailed`] when a rank fails instead of arriving; backend errors.
    fn barrier(&self) -> Result<(), CommError>;
}

/// One-to-all copy of a buffer.
pub trait Broadcast: Group {
    /// Copies `root`'s `buf` into every other rank's `buf`, in place (collective).
    /// Every rank passes a buffer of the same length.
    ///
    /// # Errors
    /// [`CommError::InvalidRank`] for a root outside the group; [`CommError::Mismatch`] when the
    /// ranks disagree on root, length or type (detected by the `local` backend; MPI's behaviour
    /// is undefined there); peer failures; backend errors.
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError>;
}

/// Element-wise reduction whose result every rank receives.
pub trait AllReduce: Group {
    /// Replaces `buf` on every rank by the element-wise reduction of all ranks' `buf`s
    /// (collective). Every rank passes the same length.
    ///
    /// Order: the `local` backend folds in rank order, `((b0 ∘ b1) ∘ b2) ∘ …`, so a float sum is
    /// bit-identical to a serial loop over the ranks and the same on every rank. MPI leaves the
    /// order (and thus float rounding) to the library; OpenMPI gives the same result on every
    /// rank for a fixed group size and message size.
    ///
    /// # Errors
    /// [`CommError::Mismatch`] on disagreeing lengths, types or operations (`local`); peer
    /// failures; backend errors.
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError>;

    /// [`AllReduce::all_reduce`] with [`ReduceOp::Sum`].
    ///
    /// # Errors
    /// As [`AllReduce::all_reduce`].
    fn all_reduce_sum<T: Reducible>(&self, buf: &mut [T]) -> Result<(), CommError> {
        self.all_reduce(buf, ReduceOp::Sum)
    }
}

/// Every rank contributes an equal-length slice and receives all of them (for agreeing on
/// metadata: sizes, fingerprints, versions).
pub trait AllGather: Group {
    /// Writes rank `r`'s `send` into `recv[r * send.len() .. (r + 1) * send.len()]` on every rank
    /// (collective). `recv.len()` must be `send.len() * size()`.
    ///
    /// # Errors
    /// [`CommError::BufferSize`] for a wrong `recv` length; [`CommError::Mismatch`] when ranks
    /// pass different lengths (`local`); peer failures; backend errors.
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError>;

    /// [`AllGather::all_gather`] into a new vector of `send.len() * size()` elements.
    ///
    /// # Errors
    /// As [`AllGather::all_gather`].
    fn all_gather_vec<T: Element>(&self, send: &[T]) -> Result<Vec<T>, CommError> {
        let mut recv = vec![T::zeroed(); send.len() * self.size()];
        self.all_gather(send, &mut recv)?;
        Ok(recv)
    }
}

/// Personalised all-to-all exchange with per-pair sizes.
pub trait AllToAllV: Group {
    /// Sends `send[send_layout.block(q)]` to every rank `q` and receives rank `r`'s block into
    /// `recv[recv_layout.block(r)]` (collective). Rank `q`'s `recv_layout.counts()[r]` must equal
    /// rank `r`'s `send_layout.counts()[q]`; receive blocks must not overlap.
    ///
    /// # Errors
    /// [`CommError::InvalidLayout`] / [`CommError::BufferSize`] for layouts that do not fit the
    /// group or the buffers; [`CommError::Mismatch`] for counts that disagree between sender
    /// and receiver (`local`); [`CommError::CountOverflow`] past MPI's `int`; peer failures.
    fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_layout: &BlockLayout,
        recv: &mut [T],
        recv_layout: &BlockLayout,
    ) -> Result<(), CommError>;
}

/// Identifies a request within one exchange scope (its posting index, from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub usize);

/// A finished request, as returned by [`Exchange::wait`], [`Exchange::wait_any`] and
/// [`Exchange::test`]. A receive hands its buffer back, filled.
#[derive(Debug)]
pub enum Completion<'a, T> {
    /// A send finished: its buffer may be reused.
    Sent {
        /// The request.
        id: RequestId,
        /// Destination rank.
        peer: usize,
        /// Tag.
        tag: Tag,
        /// The buffer that was sent.
        data: &'a [T],
    },
    /// A receive finished: `data` holds the message.
    Received {
        /// The request.
        id: RequestId,
        /// Source rank.
        peer: usize,
        /// Tag.
        tag: Tag,
        /// The filled receive buffer.
        data: &'a mut [T],
    },
}

impl<T> Completion<'_, T> {
    /// The request that finished.
    pub fn id(&self) -> RequestId {
        match self {
            Self::Sent { id, .. } | Self::Received { id, .. } => *id,
        }
    }

    /// The other rank of the message.
    pub fn peer(&self) -> usize {
        match self {
            Self::Sent { peer, .. } | Self::Received { peer, .. } => *peer,
        }
    }

    /// The message tag.
    pub fn tag(&self) -> Tag {
        match self {
            Self::Sent { tag, .. } | Self::Received { tag, .. } => *tag,
        }
    }
}

/// Nonblocking sends and receives posted inside one [`PointToPoint::exchange`] scope.
///
/// The buffers are borrowed for `'a`, which outlives the scope, so they cannot be touched
/// while a transfer is in flight; a receive hands its buffer back in its [`Completion`]. Requests
/// still pending when the scope's closure returns `Ok` are waited for; when it returns `Err` or
/// panics, pending receives are cancelled and pending sends waited for before the borrows end.
///
/// A receive must be posted with exactly the message's length (else
/// [`CommError::MessageLength`]). Messages between one pair of ranks with the same tag arrive
/// in the order they were sent and match receives in the order they were posted (MPI's
/// non-overtaking rule).
pub trait Exchange<'a, T: Element> {
    /// Starts sending `buf` to `dest` with `tag`. Not collective.
    ///
    /// # Errors
    /// Invalid rank or tag; backend errors.
    fn isend(&mut self, dest: usize, tag: Tag, buf: &'a [T]) -> Result<RequestId, CommError>;

    /// Starts receiving a message from `source` with `tag` into `buf`. Not collective.
    ///
    /// # Errors
    /// Invalid rank or tag; backend errors.
    fn irecv(&mut self, source: usize, tag: Tag, buf: &'a mut [T]) -> Result<RequestId, CommError>;

    /// Blocks until request `id` finishes.
    ///
    /// # Errors
    /// [`CommError::InvalidRequest`] for an id already completed or not from this scope;
    /// [`CommError::MessageLength`]; [`CommError::PeerFailed`] when the source fails first.
    fn wait(&mut self, id: RequestId) -> Result<Completion<'a, T>, CommError>;

    /// Returns request `id`'s completion if it has finished, `None` if it is still in flight.
    ///
    /// # Errors
    /// As [`Exchange::wait`].
    fn test(&mut self, id: RequestId) -> Result<Option<Completion<'a, T>>, CommError>;

    /// Blocks until any pending request finishes and returns it; `None` when none is pending.
    /// Use it to process halo blocks in arrival order.
    ///
    /// # Errors
    /// As [`Exchange::wait`].
    fn wait_any(&mut self) -> Result<Option<Completion<'a, T>>, CommError>;

    /// Blocks until every pending request has finished.
    ///
    /// # Errors
    /// The first error of a request; the others are still completed or cancelled by the scope.
    fn wait_all(&mut self) -> Result<(), CommError> {
        while self.wait_any()?.is_some() {}
        Ok(())
    }

    /// Number of requests posted and not yet returned as completed.
    fn pending(&self) -> usize;
}

/// Nonblocking point-to-point messages, posted inside a scope that guarantees the buffers
/// outlive the transfers (the safe shape of MPI's `Isend`/`Irecv`, as rsmpi's `request::scope`).
///
/// ```
/// use dist_comm::{Completion, Exchange, Group, LocalComm, PointToPoint};
///
/// let sums = LocalComm::run(3, |comm| {
///     let (me, p) = (comm.rank(), comm.size());
///     let mine = vec![me as f32; 4];
///     let mut inbox = vec![vec![0.0f32; 4]; p];
///     let mut total = 0.0;
///     comm.exchange(|ex| {
///         for (q, buf) in inbox.iter_mut().enumerate().filter(|(q, _)| *q != me) {
///             ex.irecv(q, 7, buf)?;
///         }
///         for q in (0..p).filter(|&q| q != me) {
///             ex.isend(q, 7, &mine)?;
///         }
///         total += mine.iter().sum::<f32>(); // local work while messages travel
///         while let Some(done) = ex.wait_any()? {
///             if let Completion::Received { data, .. } = done {
///                 total += data.iter().sum::<f32>();
///             }
///         }
///         Ok(())
///     })
///     .expect("exchange");
///     total
/// });
/// assert_eq!(sums, vec![12.0; 3]);
/// ```
pub trait PointToPoint: Group {
    /// The request set handed to an exchange closure.
    type Exchange<'a, T: Element>: Exchange<'a, T>
    where
        Self: 'a;

    /// Runs `f` with a fresh request set whose buffers live for `'a`; completes (or, on error or
    /// panic, cancels and completes) every request before returning. Not collective by itself.
    ///
    /// # Errors
    /// The closure's error, or the first error completing requests it left pending.
    fn exchange<'a, T, R, F>(&'a self, f: F) -> Result<R, CommError>
    where
        T: Element,
        F: FnOnce(&mut Self::Exchange<'a, T>) -> Result<R, CommError>;
}

/// Every capability at once, for code that needs the full set (the distributed operator).
pub trait Communicator: Broadcast + AllReduce + AllGather + AllToAllV + PointToPoint {}

impl<C: Broadcast + AllReduce + AllGather + AllToAllV + PointToPoint> Communicator for C {}

/// Checks a rank argument.
pub(crate) fn check_rank(what: &'static str, rank: usize, size: usize) -> Result<(), CommError> {
    if rank < size {
        Ok(())
    } else {
        Err(CommError::InvalidRank { what, rank, size })
    }
}

/// A rank as the C `int` MPI and NCCL take, once [`check_rank`] has bounded it by the
/// communicator's size, which is a C `int` (MPI reports it as one; `NcclComm` checks it when
/// it is created).
#[cfg(any(feature = "mpi", feature = "nccl"))]
#[allow(
    clippy::cast_possible_truncation,
    reason = "below the communicator's size, which is a c_int"
)]
pub(crate) fn rank_int(rank: usize) -> core::ffi::c_int {
    rank as core::ffi::c_int
}

/// Checks a tag argument.
pub(crate) fn check_tag(tag: Tag) -> Result<(), CommError> {
    if tag <= MAX_TAG {
        Ok(())
    } else {
        Err(CommError::InvalidTag { tag })
    }
}

/// Checks the buffer lengths of an all-gather.
pub(crate) fn check_all_gather(send: usize, recv: usize, size: usize) -> Result<(), CommError> {
    let expected = send.checked_mul(size).ok_or(CommError::BufferSize {
        what: "all_gather receive buffer",
        expected: usize::MAX,
        actual: recv,
    })?;
    if recv == expected {
        Ok(())
    } else {
        Err(CommError::BufferSize {
            what: "all_gather receive buffer",
            expected,
            actual: recv,
        })
    }
}
