//! The per-edge operand of a `dsp_spmm`: its layout (`dsp_spmm_edge_count`, `dsp_spmm_edges`,
//! `dsp_spmm_edge_weights`), the products with caller-given per-edge values
//! (`dsp_spmm_forward_values`, `dsp_spmm_backward_values`), the distributed SDDMM and its
//! gradient (`dsp_sddmm`, `dsp_sddmm_backward`) and the edge softmax (`dsp_edge_softmax`,
//! `dsp_edge_softmax_backward`): what GraphSAGE, GIN and GAT need beside the plain product.

use distspmm_op::operands::Operand;

use crate::boundary::{
    check_buffer, ffi_boundary, slice, slice_mut, Error, Handle, OutPtr, Status,
};
use crate::spmm::{
    call, check_buffers, collective, dense_operand, view, view_mut, Direction, EdgeValues, Spmm,
};

/// A per-edge buffer of `count` values, as the operand rules see it (one row).
pub(crate) fn edge_operand(name: &'static str, ptr: *const f32, count: usize) -> Operand {
    Operand {
        name,
        addr: ptr as u64,
        rows: 1,
        cols: count,
        ld: count,
    }
}

/// `count` must be this rank's edge count: the length of a one-group per-edge buffer.
fn check_edge_count(op: &Spmm, name: &str, count: usize) -> Result<(), Error> {
    let edges = op.op().edge_count();
    if count == edges {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{name}: count = {count}, but this rank (part {}) stores {edges} edges (ask \
             dsp_spmm_edge_count)",
            op.op().rank()
        )))
    }
}

/// The group rules of the per-edge calls: one group or more, `cols` (when the call has dense
/// operands) a multiple of `groups`, and every per-edge buffer `groups` runs of this rank's
/// edge count.
pub(crate) fn check_groups(
    op: &Spmm,
    groups: usize,
    cols: Option<usize>,
    counts: &[(&str, usize)],
) -> Result<(), Error> {
    if groups == 0 {
        return Err(Error::invalid(
            "groups = 0: give one group or more (1 for a plain per-edge operand, the number of \
             attention heads otherwise)",
        ));
    }
    if let Some(cols) = cols {
        if !cols.is_multiple_of(groups) {
            return Err(Error::invalid(format!(
                "cols = {cols} is not a multiple of groups = {groups} (each group is a block of \
                 cols / groups columns)"
            )));
        }
    }
    let edges = op.op().edge_count();
    for &(name, count) in counts {
        if groups.checked_mul(edges) != Some(count) {
            return Err(Error::invalid(format!(
                "{name}: count = {count}, but {groups} groups over the {edges} edges this rank \
                 (part {}) stores need {} (groups * dsp_spmm_edge_count)",
                op.op().rank(),
                groups.saturating_mul(edges)
            )));
        }
    }
    Ok(())
}

/// The activation before the edge softmax: `None` (plain softmax) for a slope of 1.
fn slope_arg(negative_slope: f32) -> Result<Option<f32>, Error> {
    if !negative_slope.is_finite() {
        return Err(Error::invalid(format!(
            "negative_slope = {negative_slope} is not finite (1.0 for a plain softmax, 0.2 for \
             GAT's LeakyReLU)"
        )));
    }
    #[allow(
        clippy::float_cmp,
        reason = "exactly 1.0 is the documented value for no activation"
    )]
    let plain = negative_slope == 1.0;
    Ok((!plain).then_some(negative_slope))
}

/// Stores this rank's number of stored non-zeros of `Ahat` (the self loops the normalisation
/// added included) in `*count`: the length of one group of every per-edge buffer. Local (no
/// communication); any thread that does not call the operator at the same time.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `count` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_edge_count(op: *const Spmm, count: *mut usize) -> Status {
    ffi_boundary("dsp_spmm_edge_count", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        let count = unsafe { OutPtr::new(count, "count") }?;
        count.write(op.op().edge_count());
        Ok(())
    })
}

/// The layout of the per-edge operand: for each edge `k` (`count` = `dsp_spmm_edge_count`),
/// `rows[k]` receives its local row (`0 .. dsp_chunk_num_local_nodes`, the destination) and
/// `sources[k]` the global (renumbered) id of its source node (its column of `Ahat`). The
/// per-edge buffers of the other calls hold one value per edge in this order (with several
/// groups, run `g` of them starts at `g * count`). `rows` and `sources` must not overlap.
/// Local; any thread that does not call the operator at the same time.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `rows` and `sources` are NULL or hold `count` values.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_edges(
    op: *const Spmm,
    rows: *mut i64,
    sources: *mut i64,
    count: usize,
) -> Status {
    ffi_boundary("dsp_spmm_edges", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        check_edge_count(op, "rows and sources", count)?;
        check_buffer(rows, count, "rows")?;
        check_buffer(sources, count, "sources")?;
        // Both spans fit the address space (checked above).
        let (start, other) = (rows as usize, sources as usize);
        let bytes = count * size_of::<i64>();
        if count > 0 && start < other + bytes && other < start + bytes {
            return Err(Error::invalid(
                "rows and sources overlap: give two separate buffers of count values",
            ));
        }
        // SAFETY: the caller guarantees `count` values at `rows`, not overlapping `sources`
        // (checked above).
        let rows = unsafe { slice_mut(rows, count, "rows") }?;
        // SAFETY: as for `rows`.
        let sources = unsafe { slice_mut(sources, count, "sources") }?;
        for ((row, source), (r, s)) in op.op().edges().zip(rows.iter_mut().zip(sources)) {
            *r = i64::try_from(row).map_err(|_| Error::invalid("row beyond int64_t"))?;
            *s = i64::try_from(source).map_err(|_| Error::invalid("node id beyond int64_t"))?;
        }
        Ok(())
    })
}

/// The weight in the graph's `A` (not `Ahat`) of every edge, in the order of
/// `dsp_spmm_edges`: the input edges' weights summed (1 for an unweighted edge), 0 at a self
/// loop the normalisation added (GraphSAGE's mean aggregation divides these by the row sums;
/// GIN's sum uses them as they are). `weights` receives `count` = `dsp_spmm_edge_count`
/// values. `DSP_STATUS_INVALID_ARGUMENT` for chunks written without edge weights (re-run
/// `distspmm partition`). Local; any thread that does not call the operator at the same
/// time.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `weights` is NULL or holds `count` floats.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_edge_weights(
    op: *const Spmm,
    weights: *mut f32,
    count: usize,
) -> Status {
    ffi_boundary("dsp_spmm_edge_weights", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        check_edge_count(op, "weights", count)?;
        // SAFETY: the caller guarantees `count` floats at `weights`.
        let weights = unsafe { slice_mut(weights, count, "weights") }?;
        op.op().edge_weights(weights)?;
        Ok(())
    })
}

/// Forward product with caller-given per-edge values in place of `Ahat`'s:
/// `Y_i[g] = sum_j e_g[ij] X_j[g]` over this rank's rows, where `X_j[g]` is column block `g`
/// (of width `cols / groups`) of row `j`. `e` holds `groups` runs of `dsp_spmm_edge_count`
/// values (run `g` at `g * edge_count`, each in the order of `dsp_spmm_edges`), `count` =
/// `groups * edge_count` (checked); `x`, `y`, `rows` and `cols` as in `dsp_spmm_forward`
/// (`cols` a multiple of `groups`). `y` must not overlap `e` or `x`. Collective, moving what
/// `dsp_spmm_forward` moves: every rank calls it with the same `groups` and `cols`; an
/// argument error on any rank fails on every rank. Creating thread only.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `e` is NULL or holds `count` floats; `x` and `y` are
/// NULL or hold the extents of `dsp_spmm_forward`.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_forward_values(
    op: *mut Spmm,
    groups: usize,
    e: *const f32,
    count: usize,
    rows: usize,
    cols: usize,
    x: *const f32,
    ldx: usize,
    y: *mut f32,
    ldy: usize,
) -> Status {
    ffi_boundary("dsp_spmm_forward_values", || {
        // SAFETY: forwarded caller contract.
        unsafe {
            call(
                op,
                Direction::Forward,
                Some(EdgeValues { groups, e, count }),
                rows,
                cols,
                x,
                ldx,
                y,
                ldy,
            )
        }
    })
}

/// Backward product with per-edge values (the gradient of `dsp_spmm_forward_values` with
/// respect to `x`): `dX_j[g] = sum_i e_g[ij] dY_i[g]`, with the conventions of
/// `dsp_spmm_forward_values` (`dy` in, `dx` out, overwritten, not overlapping `e` or `dy`).
/// Collective, moving what `dsp_spmm_backward` moves; creating thread only.
///
/// # Safety
/// As `dsp_spmm_forward_values`, with `dy` for `x` and `dx` for `y`.
#[no_mangle]
pub unsafe extern "C" fn dsp_spmm_backward_values(
    op: *mut Spmm,
    groups: usize,
    e: *const f32,
    count: usize,
    rows: usize,
    cols: usize,
    dy: *const f32,
    lddy: usize,
    dx: *mut f32,
    lddx: usize,
) -> Status {
    ffi_boundary("dsp_spmm_backward_values", || {
        // SAFETY: forwarded caller contract.
        unsafe {
            call(
                op,
                Direction::Backward,
                Some(EdgeValues { groups, e, count }),
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

/// The distributed SDDMM: `e_g[ij] = <U_i[g], V_j[g]>` for every edge `(i, j)` of this
/// rank's rows, `U_i[g]` being column block `g` (of width `cols / groups`) of row `i`. `u`
/// and `v` are this rank's `rows x cols` blocks of U and V (leading dimensions `ldu`, `ldv`);
/// the rows of V that other ranks own arrive by the schedule's exchange (what
/// `dsp_spmm_forward` moves for X). `e` receives `groups` runs of `dsp_spmm_edge_count`
/// values (`count` = `groups * edge_count`, checked), overwritten, and must not overlap `u` or
/// `v`. GAT's additive attention `e_ij = s_i + t_j` is this product with `cols = 2`,
/// `U_i = [s_i, 1]`, `V_j = [1, t_j]`. Collective; creating thread only.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `u` and `v` are NULL or hold `(rows-1)*ld + cols`
/// floats; `e` is NULL or holds `count` floats.
#[no_mangle]
pub unsafe extern "C" fn dsp_sddmm(
    op: *mut Spmm,
    groups: usize,
    rows: usize,
    cols: usize,
    u: *const f32,
    ldu: usize,
    v: *const f32,
    ldv: usize,
    e: *mut f32,
    count: usize,
) -> Status {
    ffi_boundary("dsp_sddmm", || {
        let local = |op: &Spmm| {
            op.check_rows(rows)?;
            check_groups(op, groups, Some(cols), &[("e", count)])?;
            let len = check_buffers(
                &[
                    dense_operand("u", u, rows, cols, ldu),
                    dense_operand("v", v, rows, cols, ldv),
                ],
                &[edge_operand("e", e, count)],
            )?;
            // SAFETY: the caller's contract: `u` holds (rows-1)*ldu + cols floats.
            let u = unsafe { slice(u, len[0], "u") }?;
            // SAFETY: the caller's contract: `v` holds (rows-1)*ldv + cols floats.
            let v = unsafe { slice(v, len[1], "v") }?;
            // SAFETY: the caller's contract: `e` holds `count` floats, overlapping
            // neither input (checked above).
            let e = unsafe { slice_mut(e, len[2], "e") }?;
            Ok((u, v, e))
        };
        // SAFETY: the caller's contract: NULL or a live handle, used by one thread.
        let (op, (u, v, e)) = unsafe { collective(op, cols, local) }?;
        let u = view(u, rows, cols, ldu)?;
        let v = view(v, rows, cols, ldv)?;
        op.sddmm_grouped(groups, u, v, e)?;
        Ok(())
    })
}

/// The gradients of `dsp_sddmm` from `de` (the gradient of its `e`, same layout and `count`):
/// `dU_i[g] = sum_j dE_g[ij] V_j[g]` and `dV_j[g] = sum_i dE_g[ij] U_i[g]`, into `du` and
/// `dv` (`rows x cols`, leading dimensions `lddu`, `lddv`, overwritten; neither may overlap
/// another buffer of the call). Collective, moving what one `dsp_spmm_forward` and one
/// `dsp_spmm_backward` move; creating thread only.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `de` is NULL or holds `count` floats; `u`, `v`, `du`
/// and `dv` are NULL or hold `(rows-1)*ld + cols` floats for their leading dimensions.
#[no_mangle]
pub unsafe extern "C" fn dsp_sddmm_backward(
    op: *mut Spmm,
    groups: usize,
    de: *const f32,
    count: usize,
    rows: usize,
    cols: usize,
    u: *const f32,
    ldu: usize,
    v: *const f32,
    ldv: usize,
    du: *mut f32,
    lddu: usize,
    dv: *mut f32,
    lddv: usize,
) -> Status {
    ffi_boundary("dsp_sddmm_backward", || {
        let local = |op: &Spmm| {
            op.check_rows(rows)?;
            check_groups(op, groups, Some(cols), &[("de", count)])?;
            let len = check_buffers(
                &[
                    edge_operand("de", de, count),
                    dense_operand("u", u, rows, cols, ldu),
                    dense_operand("v", v, rows, cols, ldv),
                ],
                &[
                    dense_operand("du", du, rows, cols, lddu),
                    dense_operand("dv", dv, rows, cols, lddv),
                ],
            )?;
            // SAFETY: the caller's contract: `de` holds `count` floats.
            let de = unsafe { slice(de, len[0], "de") }?;
            // SAFETY: the caller's contract: `u` holds (rows-1)*ldu + cols floats.
            let u = unsafe { slice(u, len[1], "u") }?;
            // SAFETY: the caller's contract: `v` holds (rows-1)*ldv + cols floats.
            let v = unsafe { slice(v, len[2], "v") }?;
            // SAFETY: the caller's contract: `du` holds (rows-1)*lddu + cols floats,
            // overlapping no other buffer (checked above).
            let du = unsafe { slice_mut(du, len[3], "du") }?;
            // SAFETY: as for `du`.
            let dv = unsafe { slice_mut(dv, len[4], "dv") }?;
            Ok((de, u, v, du, dv))
        };
        // SAFETY: the caller's contract: NULL or a live handle, used by one thread.
        let (op, (de, u, v, du, dv)) = unsafe { collective(op, cols, local) }?;
        let (u, v) = (view(u, rows, cols, ldu)?, view(v, rows, cols, ldv)?);
        let du = view_mut(du, rows, cols, lddu)?;
        let dv = view_mut(dv, rows, cols, lddv)?;
        op.sddmm_backward_grouped(groups, de, u, v, du, dv)?;
        Ok(())
    })
}

/// Edge softmax: for each group and each destination row `i`, `out_g[ij] =
/// exp(a_g[ij]) / sum_k exp(a_g[ik])` over the row's edges, where `a = LeakyReLU(logits)`
/// with `negative_slope` (`a = z > 0 ? z : negative_slope * z`; 1.0 is no activation, a plain
/// softmax; GAT uses 0.2; it must be finite). Numerically stable (the row maximum is
/// subtracted); a row with a non-finite logit is NaN. `logits` and `out` hold `groups` runs of
/// `dsp_spmm_edge_count` values (`count` = `groups * edge_count`, checked) and must not
/// overlap. Local (no communication: every row's edges are on its rank), but on the creating
/// thread like every call of the operator.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `logits` and `out` are NULL or hold `count` floats.
#[no_mangle]
pub unsafe extern "C" fn dsp_edge_softmax(
    op: *const Spmm,
    groups: usize,
    negative_slope: f32,
    logits: *const f32,
    out: *mut f32,
    count: usize,
) -> Status {
    ffi_boundary("dsp_edge_softmax", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        op.check_owner()?;
        let slope = slope_arg(negative_slope)?;
        check_groups(op, groups, None, &[("logits", count), ("out", count)])?;
        let len = check_buffers(
            &[edge_operand("logits", logits, count)],
            &[edge_operand("out", out, count)],
        )?;
        // SAFETY: the caller guarantees `count` floats at `logits`.
        let logits = unsafe { slice(logits, len[0], "logits") }?;
        // SAFETY: the caller guarantees `count` floats at `out`, not overlapping `logits`
        // (checked above).
        let out = unsafe { slice_mut(out, len[1], "out") }?;
        op.op().edge_softmax_grouped(groups, slope, logits, out)?;
        Ok(())
    })
}

/// The gradient of `dsp_edge_softmax` with respect to its pre-activation `logits`, from its
/// `logits`, its result `out` and the gradient `d_out` of `out`, into `d_logits`
/// (overwritten): per row and group, `d_a = out * (d_out - sum_k out_k d_out_k)`, times 1
/// where the logit is positive and `negative_slope` elsewhere. All four buffers hold `count` =
/// `groups * edge_count` values; `d_logits` must not overlap the others. Local; creating
/// thread only.
///
/// # Safety
/// `op` is NULL or a live `dsp_spmm *`; `logits`, `out`, `d_out` and `d_logits` are NULL or
/// hold `count` floats.
#[no_mangle]
pub unsafe extern "C" fn dsp_edge_softmax_backward(
    op: *const Spmm,
    groups: usize,
    negative_slope: f32,
    logits: *const f32,
    out: *const f32,
    d_out: *const f32,
    d_logits: *mut f32,
    count: usize,
) -> Status {
    ffi_boundary("dsp_edge_softmax_backward", || {
        // SAFETY: the caller guarantees NULL or a live handle.
        let op = unsafe { Spmm::borrow(op, "op") }?;
        op.check_owner()?;
        let slope = slope_arg(negative_slope)?;
        check_groups(op, groups, None, &[("logits", count)])?;
        let len = check_buffers(
            &[
                edge_operand("logits", logits, count),
                edge_operand("out", out, count),
                edge_operand("d_out", d_out, count),
            ],
            &[edge_operand("d_logits", d_logits, count)],
        )?;
        // SAFETY: the caller guarantees `count` floats at `logits`.
        let logits = unsafe { slice(logits, len[0], "logits") }?;
        // SAFETY: the caller guarantees `count` floats at `out`.
        let out = unsafe { slice(out, len[1], "out") }?;
        // SAFETY: the caller guarantees `count` floats at `d_out`.
        let d_out = unsafe { slice(d_out, len[2], "d_out") }?;
        // SAFETY: the caller guarantees `count` floats at `d_logits`, overlapping no other
        // buffer (checked above).
        let d_logits = unsafe { slice_mut(d_logits, len[3], "d_logits") }?;
        d_logits.copy_from_slice(d_out);
        op.op()
            .edge_softmax_backward_grouped(groups, slope, logits, out, d_logits)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_one_is_a_plain_softmax() {
        assert_eq!(slope_arg(1.0), Ok(None));
        assert_eq!(slope_arg(0.2), Ok(Some(0.2)));
        assert_eq!(slope_arg(0.0), Ok(Some(0.0)));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(slope_arg(bad).unwrap_err().status, Status::InvalidArgument);
        }
    }

    #[test]
    fn edge_operands_span_their_count() {
        let data = [0.0f32; 4];
        assert_eq!(edge_operand("e", data.as_ptr(), 4).check(), Ok(4));
        assert_eq!(edge_operand("e", std::ptr::null(), 0).check(), Ok(0));
        assert!(edge_operand("e", std::ptr::null(), 3).check().is_err());
    }
}
