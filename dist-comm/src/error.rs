//! The one error type every communicator returns.

use crate::element::ElementKind;

/// What went wrong in a communication call.
///
/// Errors that come from a *peer* (it failed, left, or called a different collective) are
/// reported as values, never as panics, wherever the backend can detect them: the `local`
/// backend always can; the `mpi` backend can when the MPI library returns an error code
/// instead of aborting the job (see the crate docs on `MPI_ERRORS_RETURN`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A rank argument (root, destination, source) is not in `0..size`.
    #[error("{what} rank {rank} is out of range for a group of {size} ranks")]
    InvalidRank {
        /// Which argument was wrong ("root", "destination", "source").
        what: &'static str,
        /// The rank that was passed.
        rank: usize,
        /// The group size.
        size: usize,
    },
    /// A message tag is above [`crate::MAX_TAG`].
    #[error("message tag {tag} is above the portable maximum {max}", max = crate::MAX_TAG)]
    InvalidTag {
        /// The tag that was passed.
        tag: u16,
    },
    /// A buffer's length does not fit the call.
    #[error("{what}: expected {expected} elements, got {actual}")]
    BufferSize {
        /// Which buffer and call.
        what: &'static str,
        /// The length the call needs.
        expected: usize,
        /// The length that was passed.
        actual: usize,
    },
    /// Counts/displacements of an all-to-all are inconsistent with the buffers or the group.
    #[error("invalid block layout: {0}")]
    InvalidLayout(String),
    /// A count or displacement does not fit the backend's integer type (MPI counts are C `int`).
    #[error("{what} = {value} does not fit MPI's int count type (max {max}); split the message", max = i32::MAX)]
    CountOverflow {
        /// Which quantity overflowed.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// The ranks entered different collectives, or the same collective with incompatible
    /// arguments. Every rank of the collective receives the same message.
    #[error("ranks disagree on a collective call: {0}")]
    Mismatch(String),
    /// A message arrived with a different length than the posted receive.
    #[error("message from rank {peer} with tag {tag}: the posted receive holds {expected} elements, the message has {actual}")]
    MessageLength {
        /// The sending rank.
        peer: usize,
        /// The message tag.
        tag: u16,
        /// Length of the posted receive.
        expected: usize,
        /// Length of the message (in elements of the receive's type).
        actual: usize,
    },
    /// A message's element type differs from the posted receive's (detected by the `local`
    /// backend; MPI does not check type signatures of point-to-point messages).
    #[error("message from rank {peer} with tag {tag}: the receive expects {expected} elements, the message holds {actual}")]
    MessageType {
        /// The sending rank.
        peer: usize,
        /// The message tag.
        tag: u16,
        /// Element type of the receive.
        expected: ElementKind,
        /// Element type of the message.
        actual: ElementKind,
    },
    /// A request id that this exchange did not hand out, or that already completed.
    #[error("request {id} is unknown to this exchange or already completed")]
    InvalidRequest {
        /// The request id.
        id: usize,
    },
    /// Another rank failed (panicked, returned an error, or released its communicator) while
    /// this rank needed it; the group is unusable afterwards.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The failed rank (or, when not known, this rank's view of the culprit).
        rank: usize,
        /// What happened to it.
        reason: String,
    },
    /// An MPI call returned an error code.
    #[error("{call} failed with MPI error {code}: {message}")]
    Mpi {
        /// The MPI function.
        call: &'static str,
        /// The MPI error code.
        code: i32,
        /// `MPI_Error_string` of the code.
        message: String,
    },
    /// MPI is in the wrong state for the request (initialised twice, not initialised,
    /// finalised, insufficient thread support, wrong thread).
    #[error("MPI environment: {0}")]
    Environment(String),
    /// No usable GPU communication on this rank or a peer: the CUDA driver or the NCCL library
    /// cannot be loaded, or there is no (such) CUDA device. The message says which and where.
    #[error("no CUDA device or NCCL library: {0}")]
    NoDevice(String),
    /// A CUDA driver call of a GPU backend failed.
    #[error("CUDA call `{call}` failed: {message}")]
    Cuda {
        /// The driver operation.
        call: &'static str,
        /// The driver's description of the failure.
        message: String,
    },
    /// An NCCL call returned an error code.
    #[error("{call} failed with NCCL error {code}: {message}")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// The `ncclResult_t` code.
        code: i32,
        /// `ncclGetErrorString` of the code and, where NCCL has one, its last error message.
        message: String,
    },
    /// The OS refused to start the thread of a local rank (a process or thread limit, or no
    /// memory for its stack). The ranks already started were told and have stopped.
    #[error(
        "cannot start local rank {rank} of {size} as a thread: {reason}; run fewer ranks \
         (--local-ranks) or raise the limits on \
         processes and memory (ulimit -u, ulimit -v)"
    )]
    Spawn {
        /// The rank whose thread could not start.
        rank: usize,
        /// The group size asked for.
        size: usize,
        /// The OS error.
        reason: String,
    },
    /// A device buffer lives on another GPU than the communicator's.
    #[error("{what} is on CUDA device {actual}, the communicator on device {expected}")]
    WrongDevice {
        /// Which buffer.
        what: &'static str,
        /// The communicator's device ordinal.
        expected: usize,
        /// The buffer's device ordinal.
        actual: usize,
    },
}
