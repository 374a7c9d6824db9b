//! Messages longer than one MPI count.
//!
//! MPI-3 counts are C `int`s, so one call names at most `i32::MAX` elements of a datatype. A
//! longer buffer is described by **one derived datatype** that covers all of it — whole blocks
//! of `limit` elements plus a tail — and passed with count 1 (the approach of BigMPI, Hammond,
//! Schäfer and Latham, 2014). It is still one message: matching, ordering, truncation errors
//! and `MPI_Get_elements_x` behave exactly as for a short one, so a receive posted with the
//! wrong length fails the same way at any size. MPI's built-in reductions are defined on
//! predefined datatypes only, so all-reduces go in consecutive pieces instead ([`pieces`]): all
//! ranks pass the same length and cut it alike.
//!
//! [`MAX_COUNT_ENV`] lowers the limit, so that the `mpirun` tests run every one of these paths
//! on small messages.

use std::ffi::c_int;
use std::sync::OnceLock;

use mpi::ffi;

use super::{check, datatype};
use crate::{CommError, ElementKind};

/// Environment variable that lowers the element count one MPI call may name, below `i32::MAX`
/// (a positive integer), so that tests exercise the large-message paths on small messages.
/// Read once per process.
pub const MAX_COUNT_ENV: &str = "DIST_COMM_MPI_MAX_COUNT";

/// The most elements one MPI call names with a predefined datatype: `i32::MAX`, or
/// [`MAX_COUNT_ENV`]'s value if smaller.
pub fn max_count() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let limit = c_int::MAX.unsigned_abs() as usize;
        match std::env::var(MAX_COUNT_ENV) {
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n.min(limit),
                _ => {
                    tracing::warn!(value = %v, "{MAX_COUNT_ENV} is not a positive integer; ignored");
                    limit
                }
            },
            Err(_) => limit,
        }
    })
}

/// `(offset, length)` of consecutive pieces of at most `limit` elements covering `0..len`; one
/// empty piece for `len = 0` (an empty call is still one call, on every rank alike).
pub(super) fn pieces(len: usize, limit: usize) -> impl Iterator<Item = (usize, usize)> {
    let limit = limit.max(1);
    let n = len.div_ceil(limit).max(1);
    (0..n).map(move |i| {
        let start = (i * limit).min(len);
        (start, limit.min(len - start))
    })
}

/// A length of at most [`max_count`] as a C int.
fn small(len: usize) -> c_int {
    debug_assert!(len <= max_count());
    c_int::try_from(len).unwrap_or(c_int::MAX)
}

/// `len` consecutive elements as MPI sees them: the element's predefined datatype with count
/// `len` when that fits one call, otherwise a committed derived datatype covering all `len`
/// with count 1. A derived datatype is freed on drop; MPI lets it be freed while a
/// non-blocking operation that uses it is pending, but a receive keeps its [`Span`] until it
/// completes, to count what arrived ([`Span::received`]).
#[derive(Debug)]
pub(super) struct Span {
    datatype: ffi::MPI_Datatype,
    count: c_int,
    derived: bool,
}

impl Span {
    /// `len` elements of `kind` starting at the buffer's first byte.
    pub(super) fn new(
        kind: ElementKind,
        len: usize,
        what: &'static str,
    ) -> Result<Self, CommError> {
        let limit = max_count();
        let base = datatype(kind);
        if len <= limit {
            return Ok(Span {
                datatype: base,
                count: small(len),
                derived: false,
            });
        }
        let overflow = || CommError::CountOverflow { what, value: len };
        let (blocks, tail) = (len / limit, len % limit);
        let blocks = c_int::try_from(blocks).map_err(|_| overflow())?;
        // Intermediate types are freed as soon as the next one is built from them (MPI keeps
        // what a derived type needs); `Temp` frees them on every path, errors included.
        let block = Temp::new(
            // SAFETY: `base` is a predefined datatype, `limit` fits a C int, valid out-pointer.
            |out| unsafe { ffi::MPI_Type_contiguous(small(limit), base, out) },
            "MPI_Type_contiguous",
        )?;
        let body = Temp::new(
            // SAFETY: `block.0` is a valid datatype, valid out-pointer.
            |out| unsafe { ffi::MPI_Type_contiguous(blocks, block.0, out) },
            "MPI_Type_contiguous",
        )?;
        let whole = if tail == 0 {
            body
        } else {
            let tail_at = len
                .checked_sub(tail)
                .and_then(|n| n.checked_mul(kind.size()))
                .and_then(|b| ffi::MPI_Aint::try_from(b).ok())
                .ok_or_else(overflow)?;
            let lengths: [c_int; 2] = [1, small(tail)];
            let displs: [ffi::MPI_Aint; 2] = [0, tail_at];
            let types = [body.0, base];
            Temp::new(
                // SAFETY: two-element arrays as the count says; valid datatypes; valid
                // out-pointer.
                |out| unsafe {
                    ffi::MPI_Type_create_struct(
                        2,
                        lengths.as_ptr(),
                        displs.as_ptr(),
                        types.as_ptr(),
                        out,
                    )
                },
                "MPI_Type_create_struct",
            )?
        };
        whole.commit()
    }

    /// `len` elements of `kind` starting `offset` elements into the buffer, as one datatype
    /// with count 1 (count 0 for an empty block): the per-peer types of an `MPI_Alltoallw`,
    /// whose displacements are C ints and cannot carry a large offset themselves.
    pub(super) fn at(
        kind: ElementKind,
        offset: usize,
        len: usize,
        what: &'static str,
    ) -> Result<Self, CommError> {
        if len == 0 {
            return Ok(Span {
                datatype: datatype(kind),
                count: 0,
                derived: false,
            });
        }
        let inner = Self::new(kind, len, what)?;
        let at = offset
            .checked_mul(kind.size())
            .and_then(|b| ffi::MPI_Aint::try_from(b).ok())
            .ok_or(CommError::CountOverflow {
                what,
                value: offset,
            })?;
        let lengths: [c_int; 1] = [inner.count];
        let displs: [ffi::MPI_Aint; 1] = [at];
        let placed = Temp::new(
            // SAFETY: one-element arrays as the count says; `inner.datatype` is valid (and kept
            // alive until after this call by `inner`); valid out-pointer.
            |out| unsafe {
                ffi::MPI_Type_create_hindexed(
                    1,
                    lengths.as_ptr(),
                    displs.as_ptr(),
                    inner.datatype,
                    out,
                )
            },
            "MPI_Type_create_hindexed",
        )?;
        placed.commit()
    }

    /// The datatype to pass.
    pub(super) fn datatype(&self) -> ffi::MPI_Datatype {
        self.datatype
    }

    /// The count to pass with [`Span::datatype`].
    pub(super) fn count(&self) -> c_int {
        self.count
    }

    /// Elements a receive posted with this span got (`MPI_Get_elements_x`: basic elements,
    /// whatever the datatype); `None` when MPI cannot tell (a partial element).
    pub(super) fn received(&self, status: &ffi::MPI_Status) -> Result<Option<usize>, CommError> {
        let mut n: ffi::MPI_Count = 0;
        // SAFETY: `status` was filled by MPI for a receive posted with this span's datatype,
        // which is still valid (a span frees its type only on drop); valid out-pointer.
        let rc = unsafe { ffi::MPI_Get_elements_x(status, self.datatype, &mut n) };
        check(rc, "MPI_Get_elements_x")?;
        Ok(usize::try_from(n).ok())
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if self.derived && !mpi::environment::is_finalized() {
            // SAFETY: a derived datatype this span created and nothing else frees.
            let rc = unsafe { ffi::MPI_Type_free(&mut self.datatype) };
            if let Err(e) = check(rc, "MPI_Type_free") {
                tracing::warn!(%e, "freeing a derived datatype failed");
            }
        }
    }
}

/// A derived datatype under construction, freed on drop unless committed into a [`Span`].
struct Temp(ffi::MPI_Datatype);

impl Temp {
    fn new(
        make: impl FnOnce(*mut ffi::MPI_Datatype) -> c_int,
        call: &'static str,
    ) -> Result<Self, CommError> {
        let mut t = datatype(ElementKind::U8);
        check(make(&mut t), call)?;
        Ok(Temp(t))
    }

    fn commit(self) -> Result<Span, CommError> {
        let mut t = self.0;
        std::mem::forget(self);
        // SAFETY: `t` is a valid derived datatype; valid out-pointer (MPI may update the
        // handle).
        let rc = unsafe { ffi::MPI_Type_commit(&mut t) };
        // The span owns the type from here: dropped on a failed commit, it frees it.
        let span = Span {
            datatype: t,
            count: 1,
            derived: true,
        };
        check(rc, "MPI_Type_commit")?;
        Ok(span)
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !mpi::environment::is_finalized() {
            // SAFETY: a derived datatype created by `Temp::new` and not handed on.
            let rc = unsafe { ffi::MPI_Type_free(&mut self.0) };
            if let Err(e) = check(rc, "MPI_Type_free") {
                tracing::warn!(%e, "freeing a derived datatype failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_cover_the_buffer_in_order() {
        for limit in [1, 2, 3, 7, 1000] {
            for len in [0, 1, 2, 6, 7, 8, 999, 1000, 1001, 2500] {
                let v: Vec<_> = pieces(len, limit).collect();
                assert!(!v.is_empty());
                let mut at = 0;
                for &(o, l) in &v {
                    assert_eq!(o, at, "len {len} limit {limit}");
                    assert!(l <= limit);
                    assert!(l > 0 || len == 0);
                    at += l;
                }
                assert_eq!(at, len);
                assert_eq!(v.len(), len.div_ceil(limit).max(1));
            }
        }
    }
}
