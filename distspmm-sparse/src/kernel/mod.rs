//! CPU sparse × dense products: `Y = α·A·X + β·Y` from the CSR of A ([`spmm`]) and
//! `Y = α·Aᵀ·X + β·Y` from the CSC of A ([`spmm_transpose`]), the sampled dense–dense product
//! `E[k] = ⟨U_i, V_j⟩` over A's stored entries ([`sddmm`], see [its module](mod@sddmm)), plus
//! plain-loop references ([`reference`](mod@reference)) for the tests.
//!
//! Column `j` of A in CSC form is row `j` of Aᵀ, so both products gather rows of X into one
//! output row at a time: no atomics, no scatter. Rows are handed to rayon's threads in blocks of
//! balanced work (non-zeros plus a per-row cost, found by binary search on the pointer array), so
//! the hubs of a power-law graph do not serialise one thread. The feature dimension is walked in
//! passes whose width is chosen by `F` and by how much of X fits in the cache; within a pass, an
//! output row lives in SIMD registers (AVX-512 for `f32`, chosen at run time, with an
//! auto-vectorised AVX2 and a portable fallback), and the X rows far ahead are prefetched. The
//! hot loops allocate nothing; an `f32` product of more than 128 columns over an X of at least
//! 32 MiB allocates one packed panel of X (X's rows × 32) per call.
//!
//! **Determinism.** Every output row is summed by one thread in the order of its stored entries,
//! with a code path chosen only by the element type, `F`, the shape and the instruction set — never
//! by the thread count or the block split. Results are therefore bit-identical for any number of
//! threads on one machine. Different instruction sets may differ in the last bits (FMA, the
//! two-accumulator loop for narrow passes); the portable path is bit-identical to
//! [`reference`](mod@reference).
//!
//! `β = 0` overwrites Y without reading it (NaN in Y does not survive); `α = 0` only scales Y
//! by β, without reading A or X (as in BLAS).
//!
//! ```
//! use distspmm_sparse::kernel::spmm;
//! use distspmm_sparse::sparse::{CsrOwned, DenseView, DenseViewMut};
//!
//! // A = [[0 0 1] [2 0 3]], X = 3 × 2, Y = A·X.
//! let a = CsrOwned::<f32>::from_triplets(2, 3, &[0, 1, 1], &[2, 0, 2], &[1.0, 2.0, 3.0])?;
//! let x = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
//! let mut y = [f32::NAN; 4]; // β = 0: never read
//! let xv = DenseView::from_row_major(&x[..], 3, 2)?;
//! spmm(1.0, &a.view(), xv, 0.0, DenseViewMut::from_row_major(&mut y[..], 2, 2)?)?;
//! assert_eq!(y, [3.0, 30.0, 11.0, 110.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The instruction set is detected once; the environment variable `DISTSPMM_ISA`
//! (`portable`, `avx2`, `avx512`) can lower it, e.g. to benchmark the fallbacks.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod convert;
mod generic;
pub mod grouped;
pub mod reference;
pub mod sddmm;
#[cfg(test)]
mod tests;

use core::ops::Range;
use core::sync::atomic::{AtomicU8, Ordering};

pub use grouped::{sddmm_grouped, spmm_grouped, spmm_transpose_grouped, EdgeRuns, EdgeRunsMut};
pub use sddmm::sddmm;

use crate::sparse::par::{for_each_block, grain_for, SplitRows};
use crate::sparse::{Compressed, CscView, CsrView, DenseView, DenseViewMut, Orientation, Scalar};

/// A shape mismatch between the operands of a product.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The sparse operand's column count differs from X's row count.
    #[error("{op} has {op_cols} columns but X has {x_rows} rows")]
    InnerDimension {
        /// `"A"` for [`spmm`], `"Aᵀ"` for [`spmm_transpose`].
        op: &'static str,
        /// Columns of the sparse operand.
        op_cols: usize,
        /// Rows of X.
        x_rows: usize,
    },
    /// Y's row count differs from the sparse operand's.
    #[error("{op} has {op_rows} rows but Y has {y_rows} rows")]
    OutputRows {
        /// `"A"` or `"Aᵀ"`.
        op: &'static str,
        /// Rows of the sparse operand.
        op_rows: usize,
        /// Rows of Y.
        y_rows: usize,
    },
    /// X and Y have different column (feature) counts.
    #[error("X has {x_cols} columns but Y has {y_cols}")]
    FeatureColumns {
        /// Columns of X.
        x_cols: usize,
        /// Columns of Y.
        y_cols: usize,
    },
    /// An SDDMM's dense operands do not fit its `nrows × ncols` pattern (`U: nrows × F`,
    /// `V: ncols × F`).
    #[error(
        "an SDDMM over a {nrows} × {ncols} pattern needs U of {nrows} rows and V of {ncols} \
         rows with equal columns, but U is {} × {} and V is {} × {}",
        u.0, u.1, v.0, v.1
    )]
    SddmmOperands {
        /// Rows of the pattern.
        nrows: usize,
        /// Columns of the pattern.
        ncols: usize,
        /// U's rows and columns.
        u: (usize, usize),
        /// V's rows and columns.
        v: (usize, usize),
    },
    /// A per-edge operand (or one run of a grouped one) does not hold one value per stored
    /// entry.
    #[error("the pattern stores {nnz} entries but the edge values hold {values}")]
    EdgeCount {
        /// Stored entries of the pattern.
        nnz: usize,
        /// Values given (per run for a grouped operand).
        values: usize,
    },
    /// A grouped product's dense columns do not split into its groups.
    #[error("{cols} columns do not split into {groups} groups of equal width")]
    Groups {
        /// Groups of the per-edge operand.
        groups: usize,
        /// Columns of the dense operands.
        cols: usize,
    },
    /// A conversion's source and destination differ in length.
    #[error("a conversion of {from} values into room for {to}")]
    ConvertLength {
        /// Values given.
        from: usize,
        /// Room given.
        to: usize,
    },
    /// The runs of a grouped per-edge operand do not fit its values (or there is no group).
    #[error(
        "{groups} runs of {len} per-edge values, each {stride} after the last, do not fit in \
         {values} values (at least one group, runs that do not overlap)"
    )]
    EdgeRuns {
        /// Groups asked for.
        groups: usize,
        /// Values per run.
        len: usize,
        /// Distance between the starts of consecutive runs.
        stride: usize,
        /// Values given.
        values: usize,
    },
}

/// The instruction sets the kernels can use, from least to most capable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the build target.
    Portable,
    /// x86-64 AVX2 + FMA (the portable loops compiled for it).
    Avx2,
    /// x86-64 AVX-512F (hand-written `f32` kernels).
    Avx512,
}

impl Isa {
    /// Lower-case name, as accepted by `DISTSPMM_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            2 => Isa::Avx512,
            1 => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// What this CPU supports.
    fn supported() -> Self {
        #[cfg(all(target_arch = "x86_64", feature = "std"))]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        #[cfg(all(target_arch = "x86_64", not(feature = "std")))]
        {
            if cfg!(target_feature = "avx512f") {
                return Isa::Avx512;
            }
            if cfg!(all(target_feature = "avx2", target_feature = "fma")) {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// The requested ceiling from `DISTSPMM_ISA`, if any.
    fn requested() -> Option<Self> {
        #[cfg(feature = "std")]
        {
            match std::env::var("DISTSPMM_ISA")
                .ok()?
                .to_ascii_lowercase()
                .as_str()
            {
                "portable" => return Some(Isa::Portable),
                "avx2" => return Some(Isa::Avx2),
                "avx512" => return Some(Isa::Avx512),
                _ => {}
            }
        }
        None
    }
}

/// Whether the CPU converts between `f32` and IEEE half precision in hardware (F16C), which
/// the AVX2 path of [`convert`] uses for `f16`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_f16c() -> bool {
    #[cfg(feature = "std")]
    {
        std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(feature = "std"))]
    {
        cfg!(target_feature = "f16c")
    }
}

const ISA_UNKNOWN: u8 = u8::MAX;
static SELECTED_ISA: AtomicU8 = AtomicU8::new(ISA_UNKNOWN);

/// The instruction set the kernels use on this machine: the best one the CPU supports, capped
/// by `DISTSPMM_ISA` when set. Detected on first use.
pub fn isa() -> Isa {
    let v = SELECTED_ISA.load(Ordering::Relaxed);
    if v != ISA_UNKNOWN {
        return Isa::from_u8(v);
    }
    let supported = Isa::supported();
    let chosen = Isa::requested().map_or(supported, |r| r.min(supported));
    SELECTED_ISA.store(chosen as u8, Ordering::Relaxed);
    chosen
}

/// Y = α·A·X + β·Y with A in CSR form (`A: m × k`, `X: k × F`, `Y: m × F`).
///
/// X and Y may be column slices of wider matrices (leading dimensions). Multi-threaded over
/// rayon's current pool under `std`; bit-identical for every thread count.
pub fn spmm<T: Scalar>(
    alpha: T,
    a: &CsrView<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    y: DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    check_shapes("A", a.nrows(), a.ncols(), &x, &y)?;
    run(isa(), alpha, Operand::of(*a), x, beta, y);
    Ok(())
}

/// Y = α·Aᵀ·X + β·Y with A in CSC form (`A: k × m`, `X: k × F`, `Y: m × F`).
///
/// Column `j` of A is row `j` of Aᵀ, so this is the gather kernel of [`spmm`] over the CSC
/// arrays: no atomics, same threading and determinism.
pub fn spmm_transpose<T: Scalar>(
    alpha: T,
    a: &CscView<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    y: DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    check_shapes("Aᵀ", a.ncols(), a.nrows(), &x, &y)?;
    run(isa(), alpha, Operand::of(*a), x, beta, y);
    Ok(())
}

/// Checks an `op_rows × op_cols` sparse operand against X and Y.
pub(crate) fn check_shapes<T>(
    op: &'static str,
    op_rows: usize,
    op_cols: usize,
    x: &DenseView<'_, T>,
    y: &DenseViewMut<'_, T>,
) -> Result<(), KernelError> {
    if op_cols != x.rows() {
        return Err(KernelError::InnerDimension {
            op,
            op_cols,
            x_rows: x.rows(),
        });
    }
    if op_rows != y.rows() {
        return Err(KernelError::OutputRows {
            op,
            op_rows,
            y_rows: y.rows(),
        });
    }
    if x.cols() != y.cols() {
        return Err(KernelError::FeatureColumns {
            x_cols: x.cols(),
            y_cols: y.cols(),
        });
    }
    Ok(())
}

/// The arrays of a validated compressed matrix whose outer dimension is Y's rows and whose
/// indices are below X's rows (what [`check_shapes`] and the [`Compressed`] invariants give).
/// The unsafe kernels index X and Y on the strength of this invariant: build it only with
/// [`Operand::of`] from a checked matrix.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a, T> {
    pub(crate) indptr: &'a [u64],
    pub(crate) indices: &'a [u32],
    pub(crate) data: &'a [T],
}

impl<'a, T: Scalar> Operand<'a, T> {
    /// The arrays of `a`: its rows for a CSR, the rows of its transpose for a CSC.
    pub(crate) fn of<O: Orientation>(a: Compressed<T, &'a [u64], &'a [u32], &'a [T], O>) -> Self {
        let (indptr, indices, data) = a.into_raw_parts();
        Operand {
            indptr,
            indices,
            data,
        }
    }
}

/// One pass over all rows for the feature columns `f0..f0 + w`.
#[derive(Clone, Copy)]
pub(crate) struct Pass<'a, T> {
    pub(crate) op: Operand<'a, T>,
    pub(crate) x: DenseView<'a, T>,
    pub(crate) f0: usize,
    pub(crate) w: usize,
    pub(crate) alpha: T,
    pub(crate) beta: T,
    /// Bytes of the whole output Y (all rows, all columns): large outputs are streamed.
    pub(crate) y_bytes: usize,
}

impl<T: Send> SplitRows for DenseViewMut<'_, T> {
    fn split_rows(self, _: &[u64], rows: &Range<usize>, mid: usize) -> (Self, Self) {
        self.split_rows_at(mid - rows.start)
    }
}

/// Per-row work in units of one non-zero: storing a row and starting its loop.
pub(crate) const ROW_COST: u64 = 2;
/// The smallest block worth a task.
pub(crate) const MIN_GRAIN: u64 = 1 << 14;

/// Runs one product after the shapes were checked, with at most the instruction set `isa`
/// (the tests pick lower ones to cover every path).
pub(crate) fn run<T: Scalar>(
    isa: Isa,
    alpha: T,
    op: Operand<'_, T>,
    x: DenseView<'_, T>,
    beta: T,
    mut y: DenseViewMut<'_, T>,
) {
    let isa = isa.min(Isa::supported());
    let (rows, f) = (y.rows(), y.cols());
    if rows == 0 || f == 0 {
        return;
    }
    let grain = grain_for(op.data.len() as u64 + ROW_COST * rows as u64, MIN_GRAIN);
    if alpha == T::ZERO {
        for_each_block(
            op.indptr,
            0..rows,
            ROW_COST,
            grain,
            y,
            &|_, mut y: DenseViewMut<'_, T>| scale(beta, &mut y),
        );
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        if let Some((op, x, y)) = as_f32(op, x, y.reborrow()) {
            let (alpha, beta) = (bytemuck::cast(alpha), bytemuck::cast(beta));
            // SAFETY: `isa` was capped at what the CPU supports, so AVX-512F is present, and
            // `check_shapes` matched the operand to X and Y.
            unsafe { avx512::run(alpha, op, x, beta, y, grain) };
            return;
        }
    }
    let width = generic::pass_width::<T>(f);
    for f0 in (0..f).step_by(width) {
        let pass = Pass {
            op,
            x,
            f0,
            w: width.min(f - f0),
            alpha,
            beta,
            y_bytes: rows * f * size_of::<T>(),
        };
        for_each_block(
            op.indptr,
            0..rows,
            ROW_COST,
            grain,
            y.reborrow(),
            &|r, y| generic::pass(isa, &pass, width, r, y),
        );
    }
}

/// Y = β·Y, without reading Y when β = 0.
pub(crate) fn scale<T: Scalar>(beta: T, y: &mut DenseViewMut<'_, T>) {
    for i in 0..y.rows() {
        let row = y.row_mut(i);
        if beta == T::ZERO {
            row.fill(T::ZERO);
        } else {
            row.iter_mut().for_each(|v| *v = beta * *v);
        }
    }
}

/// The `f32` form of the operands when `T` is `f32` (a no-op cast), for the hand-written kernels.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
fn as_f32<'a, T: Scalar>(
    op: Operand<'a, T>,
    x: DenseView<'a, T>,
    y: DenseViewMut<'a, T>,
) -> Option<(Operand<'a, f32>, DenseView<'a, f32>, DenseViewMut<'a, f32>)> {
    if core::any::TypeId::of::<T>() != core::any::TypeId::of::<f32>() {
        return None;
    }
    let op = Operand {
        indptr: op.indptr,
        indices: op.indices,
        data: bytemuck::cast_slice(op.data),
    };
    let (rows, cols, ld) = (x.rows(), x.cols(), x.ld());
    let x = DenseView::new(bytemuck::cast_slice(x.into_slice()), rows, cols, ld).ok()?;
    let (rows, cols, ld) = (y.rows(), y.cols(), y.ld());
    let y = DenseViewMut::new(bytemuck::cast_slice_mut(y.into_slice()), rows, cols, ld).ok()?;
    Some((op, x, y))
}

/// Cache lines of X kept in flight by software prefetches; the distance in non-zeros is this
/// over the lines one gathered row spans. Deep: at F = 16 (one line per non-zero) 160
/// non-zeros ahead measured best on RMAT scale 18, against 48 for a 2 × slower product.
pub(crate) const PREFETCH_LINES: usize = 160;
/// Entries of the index and value arrays between a read and its non-temporal prefetch.
pub(crate) const STREAM_AHEAD: usize = 256;

/// Prefetches the cache line holding `p` into all cache levels (a hint: never faults).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint that never dereferences or faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Prefetches the line holding `p` without keeping it in the outer caches (a hint: never
/// faults): for the once-read index and value streams, which would otherwise push the hot rows
/// of X out of the shared cache.
#[inline(always)]
pub(crate) fn prefetch_nta<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint that never dereferences or faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_NTA }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
