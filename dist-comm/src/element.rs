//! Element types a communicator can move, and the reductions it can apply to them.

use core::fmt;

use bytemuck::Pod;

mod sealed {
    pub trait Sealed {}
}

/// Which primitive type an [`Element`] is; backends map it to their own type tag
/// (for MPI: `MPI_UINT8_T`, `MPI_FLOAT`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElementKind {
    /// `u8`: raw bytes.
    U8,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
    /// `i64`.
    I64,
    /// `u64`.
    U64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl ElementKind {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// The Rust name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::I64 => "i64",
            Self::U64 => "u64",
            Self::F32 => "f32",
            Self::F64 => "f64",
        }
    }
}

impl fmt::Display for ElementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A plain-old-data type every backend can send: `u8`, `i32`, `u32`, `i64`, `u64`, `f32`, `f64`.
///
/// Sealed: backends need a native type tag for each element type, so the set is closed.
/// User structs travel as bytes (`bytemuck::cast_slice` to `u8`).
pub trait Element: Pod + Send + Sync + sealed::Sealed {
    /// The type's tag.
    const KIND: ElementKind;
}

/// A reduction applied element-wise by [`crate::AllReduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (integers wrap on overflow, as MPI's do in practice).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sum => "sum",
            Self::Max => "max",
            Self::Min => "min",
        })
    }
}

/// An [`Element`] that [`ReduceOp`] applies to: every element type except raw bytes.
pub trait Reducible: Element + PartialOrd {
    /// `acc = acc ∘ x` for the operation `op`. For floats, `Max`/`Min` keep `acc` when either
    /// side is NaN (MPI leaves NaN handling implementation-defined).
    fn combine(op: ReduceOp, acc: &mut Self, x: Self);
}

macro_rules! element {
    ($t:ty, $kind:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const KIND: ElementKind = ElementKind::$kind;
        }
    };
}

macro_rules! reducible {
    ($t:ty, $add:expr) => {
        impl Reducible for $t {
            #[inline]
            fn combine(op: ReduceOp, acc: &mut Self, x: Self) {
                match op {
                    ReduceOp::Sum => *acc = $add(*acc, x),
                    ReduceOp::Max => {
                        if x > *acc {
                            *acc = x;
                        }
                    }
                    ReduceOp::Min => {
                        if x < *acc {
                            *acc = x;
                        }
                    }
                }
            }
        }
    };
}

element!(u8, U8);
element!(i32, I32);
element!(u32, U32);
element!(i64, I64);
element!(u64, U64);
element!(f32, F32);
element!(f64, F64);

reducible!(i32, i32::wrapping_add);
reducible!(u32, u32::wrapping_add);
reducible!(i64, i64::wrapping_add);
reducible!(u64, u64::wrapping_add);
reducible!(f32, |a: f32, b: f32| a + b);
reducible!(f64, |a: f64, b: f64| a + b);

/// Reduces `contributions` element-wise in the given order into `out`
/// (`out = ((c0 ∘ c1) ∘ c2) ∘ …`): the definition of the deterministic rank-order reduction.
pub(crate) fn reduce_in_order<'c, T: Reducible>(
    op: ReduceOp,
    out: &mut [T],
    mut contributions: impl Iterator<Item = &'c [T]>,
) {
    if let Some(first) = contributions.next() {
        out.copy_from_slice(first);
    }
    for c in contributions {
        for (acc, &x) in out.iter_mut().zip(c) {
            T::combine(op, acc, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_match_sizes() {
        fn check<T: Element>() {
            assert_eq!(T::KIND.size(), size_of::<T>(), "{}", T::KIND);
        }
        check::<u8>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u64>();
        check::<f32>();
        check::<f64>();
    }

    #[test]
    fn rank_order_sum_is_a_left_fold() {
        // 1 + 1e8 - 1e8 in f32: the left fold loses the 1, the other association keeps it.
        let parts: [&[f32]; 3] = [&[1.0], &[1e8], &[-1e8]];
        let mut out = [0.0f32];
        reduce_in_order(ReduceOp::Sum, &mut out, parts.iter().copied());
        assert_eq!(out[0], (1.0f32 + 1e8) + -1e8);
        assert_ne!(out[0], 1.0f32 + (1e8 + -1e8));
    }

    #[test]
    fn max_min_and_wrapping_sum() {
        let parts: [&[u64]; 3] = [&[3, u64::MAX], &[7, 2], &[5, 0]];
        let mut out = [0u64; 2];
        reduce_in_order(ReduceOp::Max, &mut out, parts.iter().copied());
        assert_eq!(out, [7, u64::MAX]);
        reduce_in_order(ReduceOp::Min, &mut out, parts.iter().copied());
        assert_eq!(out, [3, 0]);
        reduce_in_order(ReduceOp::Sum, &mut out, parts.iter().copied());
        assert_eq!(out, [15, 1]);
    }
}
