//! `dsp_spmm`: the distributed product `Y = Ahat X` (forward) and `dX = Ahat^T dY` (backward)
//! of one rank, over a `dsp_comm` and a `dsp_chunk` (distspmm-op's `DistSpmm`).

use std::sync::Arc;
use std::thread::ThreadId;

use distspmm_op::operands::{check_pair, Operand, OperandError};
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::{DistSpmm, DistSpmmError, Precision, RankChunk};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};

use crate::boundary::{
    ffi_boundary, ffi_boundary_void, slice, slice_mut, Error, Handle, OutPtr, Status,
};
use crate::chunk::Chunk;
use crate::comm::{agree, check_owner, check_usable, Comm, SharedComm};
use crate::edges::{check_groups, edge_operand};

/// Which communication schedule a `dsp_spmm` runs (the values are part of the ABI).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Sparsity-aware: each rank receives only the rows of other ranks that its non-zeros
    /// reference (the chunk's halo lists), all peers at once, overlapped with the local block.
    Halo = 0,
    /// Every rank receives every other rank's rows, one broadcast per rank (CAGNET's 1D
    /// algorithm; the baseline).
    Broadcast = 1,
}

impl Schedule {
    pub(crate) fn from_code(code: i32) -> Option<ScheduleKind> {
        match code {
            c if c == Schedule::Halo as i32 => Some(ScheduleKind::Halo),
            c if c == Schedule::Broadcast as i32 => Some(ScheduleKind::Broadcast),
            _ => None,
        }
    }
}

/// The format in which a `dsp_spmm`'s messages travel between ranks (the values are part of
/// the ABI). Halo rows and broadcast blocks forward, partial sums backward, and the rows every
/// per-edge product and SDDMM moves, are narrowed to it where they are handed to MPI and
/// widened back to `float` where they are received; every product and sum stays in `float`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommPrecision {
    /// IEEE single precision: the values as they are (what `dsp_spmm_create` uses).
    F32 = 0,
    /// bfloat16 (`float`'s exponent range, 8 significant bits): half the bytes; each value
    /// that crosses ranks is rounded once, within a relative 2^-8 in `float`'s normal range.
    Bf16 = 1,
    /// IEEE half precision (largest finite 65504, 11 significant bits): half the bytes; each
    /// value that crosses ranks is rounded once, within a relative 2^-11 in its normal range
    /// (larger values become infinities).
    F16 = 2,
}

impl CommPrecision {
    /// The precision a `dsp_comm_precision` code names, `None` for any other value.
    pub(crate) fn from_code(code: i32) -> Option<Precision> {
        match code {
            c if c == CommPrecision::F32 as i32 => Some(Precision::F32),
            c if c == CommPrecision::Bf16 as i32 => Some(Precision::Bf16),
            c if c == CommPrecision::F16 as i32 => Some(Precision::F16),
            _ => None,
        }
    }

    /// The `dsp_comm_precision` code of `precision`.
    pub(crate) fn code(precision: Precision) -> i32 {
        let abi = match precision {
            Precision::F32 => CommPrecision::F32,
            Precision::Bf16 => CommPrecision::Bf16,
            Precision::F16 => CommPrecision::F16,
        };
        abi as i32
    }
}

/// The distributed SpMM operator of one rank: `Y = Ahat X` and `dX = Ahat^T dY` on this rank's
/// rows, communicating with the other ranks by the chosen schedule.
///
/// Thread-safety: like its `dsp_comm`, used only on the thread that created that communicator
/// (other threads get `DSP_STATUS_WRONG_THREAD`); calls are collective, so all ranks call
/// `dsp_spmm_forward` / `dsp_spmm_backward` in the same order. The kernels inside use worker
/// threads (rayon) that never call MPI. The operator keeps its communicator and chunk alive:
/// they may be freed before it.
pub struct Spmm {
    /// The operator, owning a reference to the communicator and to the mapped chunk.
    op: DistSpmm<SharedComm, Arc<RankChunk>>,
    owner: ThreadId,
}

impl std::fmt::Debug for Spmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spmm")
            .field("rank", &self.op.rank())
            .field("parts", &self.op.parts())
            .field("schedule", &self.op.schedule())
            .field("precision", &self.op.precision())
            .finish_non_exhaustive()
    }
}

impl Handle for Spmm {
    const C_NAME: &'static str = "dsp_spmm";
}

impl From<DistSpmmError> for Error {
    fn from(e: DistSpmmError) -> Self {
        let status = match &e {
            DistSpmmError::PartsMismatch { .. } => Status::PartsMismatch,
            DistSpmmError::Disagreement(_) => Status::ArgumentMismatch,
            DistSpmmError::Shape(_) => Status::InvalidArgument,
            DistSpmmError::Comm(c) => return Error::from(c.clone()),
            DistSpmmError::Allocation { .. } => Status::OutOfMemory,
            // Chunks written before edge weights were recorded: the message says to
            // re-partition.
            DistSpmmError::NoEdgeWeights { .. } => Status::InvalidArgument,
            _ => Status::Panic,
        };
        Error::new(status, dist_comm::agree::message_with_sources(&e))
    }
}

impl From<OperandError> for Error {
    /// A NULL operand that holds values is `NullArgument` (the message names its size, as
    /// for every other buffer); the other operand rules are `InvalidArgument`.
    fn from(e: OperandError) -> Self {
        match e {
            OperandError::Null { name, values } => {
                Error::null(&format!("{name} (with {values} elements)"))
            }
            e => Error::invalid(e.to_string()),
        }
    }
}

/// The schedule a `dsp_schedule` code names, or the error the create functions return.
pub(crate) fn schedule_arg(schedule: i32) -> Result<ScheduleKind, Error> {
    Schedule::from_code(schedule).ok_or_else(|| {
        Error::invalid(format!(
            "schedule {schedule} is not a dsp_schedule (DSP_SCHEDULE_HALO = 0, \
             DSP_SCHEDULE_BROADCAST = 1)"
        ))
    })
}

/// The message precision a `dsp_comm_precision` code names, or the error the create
/// functions return.
pub(crate) fn precision_arg(precision: i32) -> Result<Precision, Error> {
    CommPrecision::from_code(precision).ok_or_else(|| {
        Error::invalid(format!(
            "precision {precision} is not a dsp_comm_precision (DSP_COMM_PRECISION_F32 = 0, \
             DSP_COMM_PRECISION_BF16 = 1, DSP_COMM_PRECISION_F16 = 2)"
        ))
    })
}

/// The create functions' first agreement: every rank's local checks (`local`) and the same
/// schedule and message precision codes everywhere (one key: the schedule in the low 32 bits,
/// the precision in the high ones), so a bad argument anywhere fails everywhere with this
/// library's statuses and different choices are an argument mismatch on every rank (collective
/// over `comm`).
pub(crate) fn agree_on_options(
    comm: &Comm,
    local: Result<(), &Error>,
    schedule: i32,
    precision: i32,
) -> Result<(), Error> {
    let key = local
        .map(|()| u64::from(schedule as u32) | (u64::from(precision as u32) << 32))
        .map_err(Error::clone);
    agree(comm.mpi(), key, |key| {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "deliberate: each half of the key is an i32 code"
        )]
        let (schedule, precision) = (key as u32 as i32, (key >> 32) as u32 as i32);
        let schedule = match Schedule::from_code(schedule) {
            Some(ScheduleKind::Halo) => "halo",
            _ => "broadcast",
        };
        let precision = CommPrecision::from_code(precision).unwrap_or_default();
        format!("schedule {schedule}, precision {precision}")
    })
    .map(|_| ())
}

/// Builds the operator on the (already checked) inputs; it owns a reference to the
/// communicator and to the mapped chunk.
fn build(
    comm: &Comm,
    chunk: &Chunk,
    schedule: ScheduleKind,
    precision: Precision,
) -> Result<Spmm, Error> {
    let (shared, owner) = comm.share();
    let op = DistSpmm::with_precision(shared, Arc::clone(chunk.mapped()), schedule, precision)?;
    Ok(Spmm { op, owner })
}

/// The create functions' body: checks the arguments, agrees on them with every rank, then
/// builds the operator into `*out` (NULL on failure).
///
/// # Safety
/// As `dsp_spmm_create_with_precision`.
unsafe fn create(
    comm: *mut Comm,
    chunk: *const Chunk,
    schedule: i32,
    precision: i32,
    out: *mut *mut Spmm,
) -> Result<(), Error> {
    // SAFETY: the caller guarantees NULL or valid for a write.
    let out = unsafe { OutPtr::new(out, "out") };
    if let Ok(out) = &out {
        out.write(std::ptr::null_mut());
    }
    // SAFETY: the caller guarantees a live handle or NULL.
    let comm = unsafe { Comm::borrow(comm, "comm") }?;
    comm.check_usable()?;
    let local = (|| {
        let out = out.as_ref().map_err(Error::clone)?;
        // SAFETY: the caller guarantees a live handle or NULL.
        let chunk = unsafe { Chunk::borrow(chunk, "chunk") }?;
        Ok((
            out,
            chunk,
            schedule_arg(schedule)?,
            precision_arg(precision)?,
        ))
    })();
    // Agree on the local checks first, so that a bad argument anywhere fails everywhere
    // with this library's statuses; the operator then agrees on the partition itself.
    agree_on_options(comm, local.as_ref().map(|_| ()), schedule, precision)?;
    let (out, chunk, kind, precision) = local?;
    out.write(build(comm, chunk, kind, precision)?.into_raw());
    Ok(())
}

/// Creates this rank's distributed SpMM for `chunk` (opened with the same communicator) and
/// `schedule` (a `dsp_schedule` value). Collective over `comm`: the ranks agree on their
/// arguments, then on the partition (fingerprint, P, N) and the schedule, so a bad argument on
/// any rank fails on every rank (`DSP_STATUS_PEER_FAILED` on the ranks whose own arguments were
/// fine) and different schedules are `DSP_STATUS_ARGUMENT_MISMATCH` everywhere. The
/// messages travel in `float` (`DSP_COMM_PRECISION_F32`; see
/// `dsp_spmm_create_with_precision`). On failure `*out` is NULL. Creating thread of `comm`
/// only.
///
/// # Safety
/// `comm` and `chunk` are NULL or live handles; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_create(
    comm: *mut Comm,
    chunk: *const Chunk,
    schedule: i32,
    out: *mut *mut Spmm,
) -> Status {
    ffi_boundary("dsp_spmm_create", || {
        // SAFETY: forwarded caller contract.
        unsafe { create(comm, chunk, schedule, CommPrecision::F32 as i32, out) }
    })
}

/// `dsp_spmm_create` with the messages travelling in `precision` (a `dsp_comm_precision`
/// value): each row or partial sum another rank needs is narrowed from `float` where it is
/// handed to MPI and widened back where it is received, for every collective call on the
/// operator (forward, backward, the per-edge products, the SDDMM); products and sums stay
/// `float`, and the rows a rank multiplies from its own block are never rounded. Bf16 and f16
/// halve the bytes (`dsp_spmm_bytes_last_call`); an entry of a result then differs from
/// `DSP_COMM_PRECISION_F32`'s by at most u (2^-8 for bf16, 2^-11 for f16) times the sum of the
/// magnitudes of its terms whose operand crossed ranks. Collective over `comm`, like
/// `dsp_spmm_create`: an out-of-range `precision` is `DSP_STATUS_INVALID_ARGUMENT` on its rank
/// and `DSP_STATUS_PEER_FAILED` on the others; different precisions on different ranks are
/// `DSP_STATUS_ARGUMENT_MISMATCH` everywhere. On failure `*out` is NULL. Creating thread of
/// `comm` only.
///
/// # Safety
/// `comm` and `chunk` are NULL or live handles; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_create_with_precision(
    comm: *mut Comm,
    chunk: *const Chunk,
    schedule: i32,
    precision: i32,
    out: *mut *mut Spmm,
) -> Status {
    ffi_boundary("dsp_spmm_create_with_precision", || {
        // SAFETY: forwarded caller contract.
        unsafe { create(comm, chunk, schedule, precision, out) }
    })
}

/// The message precision the operator was created with, as a `dsp_comm_precision` value, in
/// `*out`. Any thread that does not call the operator at the same time.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_comm_precision(op: *const Spmm, out: *mut i32) -> Status {
    ffi_boundary("dsp_spmm_comm_precision", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        let out = unsafe { OutPtr::new(out, "out") }?;
        out.write(CommPrecision::code(op.op.precision()));
        Ok(())
    })
}

/// Frees an operator. NULL is accepted. Must be called on the creating thread of its
/// communicator; from another thread it frees nothing (the handle stays valid) and
/// `dsp_last_error()` says so.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_free(op: *mut Spmm) {
    ffi_boundary_void("dsp_spmm_free", || {
        // SAFETY: the caller guarantees NULL or a live handle it gives up.
        let Some(op) = (unsafe { Spmm::from_raw(op) }) else {
            return Ok(());
        };
        if let Err(e) = check_owner(op.owner, Spmm::C_NAME) {
            // Dropping would release the communicator's `Rc` off its thread: keep it alive.
            let _ = Box::into_raw(op);
            return Err(e);
        }
        drop(op);
        Ok(())
    })
}

/// Which product a call computes.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    Forward,
    Backward,
}

/// The operator of a collective call, after its local checks and the agreement: borrows `op`
/// on its creating thread, runs `local` (this rank's argument checks, which make the call's
/// slices), then agrees with every rank on the outcome and on `cols`, so a bad argument
/// anywhere is an error everywhere ([`Status::PeerFailed`] on the ranks whose own arguments
/// were fine, [`Status::ArgumentMismatch`] for different `cols`).
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *` that no one else uses during `'a`.
pub(crate) unsafe fn collective<'a, T>(
    op: *mut Spmm,
    cols: usize,
    local: impl FnOnce(&Spmm) -> Result<T, Error>,
) -> Result<(&'a mut DistSpmm<SharedComm, Arc<RankChunk>>, T), Error> {
    // SAFETY: the caller's contract: NULL or a live handle, used by one thread.
    let op = unsafe { Spmm::borrow_mut(op, "op") }?;
    check_usable(op.owner, Spmm::C_NAME)?;
    let local = local(op);
    let key = local.as_ref().map(|_| cols as u64).map_err(Error::clone);
    agree(op.op.comm(), key, |c| format!("cols = {c}"))?;
    Ok((&mut op.op, local?))
}

impl Spmm {
    /// The operator.
    pub(crate) fn op(&self) -> &DistSpmm<SharedComm, Arc<RankChunk>> {
        &self.op
    }

    /// [`Status::WrongThread`] unless called on the creating thread of the communicator.
    pub(crate) fn check_owner(&self) -> Result<(), Error> {
        check_owner(self.owner, Self::C_NAME)
    }

    /// `rows` must be the number of rows this rank owns.
    pub(crate) fn check_rows(&self, rows: usize) -> Result<(), Error> {
        let n = self.op.local_rows();
        if rows == n {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "rows = {rows}, but this rank (part {}) owns {n} rows",
                self.op.rank()
            )))
        }
    }
}

/// A dense `rows x cols` buffer with leading dimension `ld`, as the operand rules see it.
pub(crate) fn dense_operand(
    name: &'static str,
    ptr: *const f32,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Operand {
    Operand {
        name,
        addr: ptr as u64,
        rows,
        cols,
        ld,
    }
}

/// Checks a call's buffers by the operand rules: each one alone (NULL, alignment, extent),
/// then every output against every other buffer, since a call reads its inputs while it
/// writes its outputs and no output may share memory with anything. Returns the values each
/// spans, `inputs` first, then `outputs`, in the order given.
pub(crate) fn check_buffers(inputs: &[Operand], outputs: &[Operand]) -> Result<Vec<usize>, Error> {
    let all: Vec<&Operand> = inputs.iter().chain(outputs).collect();
    let values = all
        .iter()
        .map(|o| o.check())
        .collect::<Result<Vec<_>, _>>()?;
    for (i, output) in all.iter().enumerate().skip(inputs.len()) {
        for other in &all[..i] {
            check_pair(other, output)?;
        }
    }
    Ok(values)
}

/// A row-major view of a checked input buffer of `rows x cols`.
pub(crate) fn view(
    data: &[f32],
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<DenseView<'_, f32>, Error> {
    // With no columns the buffer holds nothing (it may be empty), whatever the ld says.
    let ld = if cols == 0 { 0 } else { ld };
    DenseView::new(data, rows, cols, ld).map_err(|e| Error::invalid(e.to_string()))
}

/// A row-major view of a checked output buffer of `rows x cols`.
pub(crate) fn view_mut(
    data: &mut [f32],
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<DenseViewMut<'_, f32>, Error> {
    let ld = if cols == 0 { 0 } else { ld };
    DenseViewMut::new(data, rows, cols, ld).map_err(|e| Error::invalid(e.to_string()))
}

/// Caller-given per-edge values in place of `Ahat`'s: `groups` runs of the rank's edge count
/// in `e` (`count` values).
#[derive(Clone, Copy)]
pub(crate) struct EdgeValues {
    pub(crate) groups: usize,
    pub(crate) e: *const f32,
    pub(crate) count: usize,
}

/// Checks one product's arguments locally, agrees with every rank (so a bad argument anywhere
/// is an error everywhere), then runs it: over `Ahat` (`values` None) or over caller-given
/// per-edge values.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn call(
    op: *mut Spmm,
    direction: Direction,
    values: Option<EdgeValues>,
    rows: usize,
    cols: usize,
    input: *const f32,
    ld_in: usize,
    output: *mut f32,
    ld_out: usize,
) -> Result<(), Error> {
    let (name_in, name_out) = match direction {
        Direction::Forward => ("x", "y"),
        Direction::Backward => ("dy", "dx"),
    };
    let local = |op: &Spmm| {
        op.check_rows(rows)?;
        let mut inputs = Vec::with_capacity(2);
        if let Some(v) = values {
            check_groups(op, v.groups, Some(cols), &[("e", v.count)])?;
            inputs.push(edge_operand("e", v.e, v.count));
        }
        inputs.push(dense_operand(name_in, input, rows, cols, ld_in));
        let len = check_buffers(
            &inputs,
            &[dense_operand(name_out, output, rows, cols, ld_out)],
        )?;
        let (len_e, len_in, len_out) = match values {
            Some(_) => (len[0], len[1], len[2]),
            None => (0, len[0], len[1]),
        };
        let e = match values {
            // SAFETY: the exported callers' contract: `e` holds `count` floats.
            Some(v) => unsafe { slice(v.e, len_e, "e") }?,
            None => &[],
        };
        // SAFETY: the exported callers' contract: `input` holds (rows-1)*ld_in + cols
        // floats.
        let input = unsafe { slice(input, len_in, name_in) }?;
        // SAFETY: the exported callers' contract: `output` holds (rows-1)*ld_out + cols
        // floats, overlapping no input (checked above).
        let output = unsafe { slice_mut(output, len_out, name_out) }?;
        Ok((e, input, output))
    };
    // SAFETY: the exported callers' contract: NULL or a live handle, used by one thread.
    let (op, (e, input, output)) = unsafe { collective(op, cols, local) }?;
    let input = view(input, rows, cols, ld_in)?;
    let output = view_mut(output, rows, cols, ld_out)?;
    match (direction, values) {
        (Direction::Forward, None) => op.forward(input, output)?,
        (Direction::Backward, None) => op.backward(input, output)?,
        (Direction::Forward, Some(v)) => op.spmm_values_grouped(v.groups, e, input, output)?,
        (Direction::Backward, Some(v)) => {
            op.spmm_values_transpose_grouped(v.groups, e, input, output)?;
        }
    }
    Ok(())
}

/// Forward product on this rank's rows: `Y_p = (Ahat X)_p`. `x` holds this rank's `rows x
/// cols` block of X (row-major, leading dimension `ldx >= cols`, at least `(rows-1)*ldx + cols`
/// floats); `y` receives `rows x cols` (leading dimension `ldy`), overwritten. `rows` must be
/// `dsp_chunk_num_local_nodes`; `cols` must be equal on every rank. `x` and `y` must not
/// overlap. Collective: every rank calls it together; an argument error on any rank fails on
/// every rank. Creating thread only.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `x` and `y` are NULL or hold the extents above.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_forward(
    op: *mut Spmm,
    rows: usize,
    cols: usize,
    x: *const f32,
    ldx: usize,
    y: *mut f32,
    ldy: usize,
) -> Status {
    ffi_boundary("dsp_spmm_forward", || {
        // SAFETY: forwarded caller contract.
        unsafe { call(op, Direction::Forward, None, rows, cols, x, ldx, y, ldy) }
    })
}

/// Backward product (the gradient of the forward one) on this rank's rows:
/// `dX_p = (Ahat^T dY)_p`, with the same conventions as `dsp_spmm_forward` (`dy` in, `dx` out,
/// overwritten). Collective; creating thread only.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `dy` and `dx` are NULL or hold the extents of
/// `dsp_spmm_forward`.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_backward(
    op: *mut Spmm,
    rows: usize,
    cols: usize,
    dy: *const f32,
    lddy: usize,
    dx: *mut f32,
    lddx: usize,
) -> Status {
    ffi_boundary("dsp_spmm_backward", || {
        // SAFETY: forwarded caller contract.
        unsafe {
            call(
                op,
                Direction::Backward,
                None,
                rows,
                cols,
                dy,
                lddy,
                dx,
                lddx,
            )
        }
    })
}

/// Payload bytes this rank sent to and received from other ranks in its last forward or
/// backward call (what the schedule predicts; for measuring communication volume). Any
/// thread that does not call the operator at the same time.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `sent` and `received` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_bytes_last_call(
    op: *const Spmm,
    sent: *mut u64,
    received: *mut u64,
) -> Status {
    ffi_boundary("dsp_spmm_bytes_last_call", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        let sent = unsafe { OutPtr::new(sent, "sent") }?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        let received = unsafe { OutPtr::new(received, "received") }?;
        let traffic = op.op.bytes_last_call();
        sent.write(traffic.sent);
        received.write(traffic.received);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_codes_are_stable() {
        assert_eq!(Schedule::Halo as i32, 0);
        assert_eq!(Schedule::Broadcast as i32, 1);
        assert_eq!(Schedule::from_code(0), Some(ScheduleKind::Halo));
        assert_eq!(Schedule::from_code(1), Some(ScheduleKind::Broadcast));
        assert_eq!(Schedule::from_code(2), None);
        assert_eq!(Schedule::from_code(-1), None);
    }

    #[test]
    fn precision_codes_are_stable_and_round_trip() {
        assert_eq!(CommPrecision::F32 as i32, 0);
        assert_eq!(CommPrecision::Bf16 as i32, 1);
        assert_eq!(CommPrecision::F16 as i32, 2);
        for p in Precision::ALL {
            assert_eq!(CommPrecision::from_code(CommPrecision::code(p)), Some(p));
        }
        for bad in [3, -1, i32::MAX] {
            assert_eq!(CommPrecision::from_code(bad), None);
            let e = precision_arg(bad).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument);
            assert!(
                e.message.contains("DSP_COMM_PRECISION_BF16 = 1"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn outputs_may_overlap_nothing_inputs_may_share_memory() {
        let data = [0.0f32; 16];
        let at = |k: usize| data[k..].as_ptr();
        let dense = |name, k, rows| dense_operand(name, at(k), rows, 2, 2);
        // Two inputs over the same memory, an output beside them: fine.
        let spans = check_buffers(&[dense("u", 0, 3), dense("v", 0, 3)], &[dense("e", 6, 4)]);
        assert_eq!(spans, Ok(vec![6, 6, 8]));
        // An output over an input, or over another output.
        for outputs in [
            vec![dense("e", 4, 2)],
            vec![dense("du", 6, 2), dense("dv", 8, 2)],
        ] {
            let e = check_buffers(&[dense("u", 0, 3)], &outputs).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{}", e.message);
            assert!(e.message.contains("overlap"), "{}", e.message);
        }
        // A NULL buffer that holds values.
        let null = dense_operand("x", std::ptr::null(), 2, 2, 2);
        let e = check_buffers(&[null], &[]).unwrap_err();
        assert_eq!(e.status, Status::NullArgument);
        assert_eq!(e.message, "x (with 4 elements) is NULL");
    }

    #[test]
    fn chunks_without_edge_weights_are_an_argument_error_that_says_to_repartition() {
        let e = Error::from(DistSpmmError::NoEdgeWeights { part: 1 });
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains("distspmm partition"), "{}", e.message);
    }
}
