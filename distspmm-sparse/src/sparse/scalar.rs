//! The element types of the sparse and dense matrices.

use core::fmt::Debug;
use core::ops::{Add, AddAssign, Mul, Sub};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type of the matrices: `f32` or `f64` (sealed).
///
/// The kernels are generic over it; the hand-vectorised fast paths exist for `f32`.
pub trait Scalar:
    sealed::Sealed
    + bytemuck::Pod
    + Copy
    + Default
    + Debug
    + PartialEq
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + AddAssign
    + 'static
{
    /// The additive identity.
    const ZERO: Self;
    /// The multiplicative identity.
    const ONE: Self;
    /// Whether the value is neither infinite nor NaN.
    fn is_finite(self) -> bool;
    /// The absolute value.
    fn abs(self) -> Self;
    /// Widens to `f64` (exact).
    fn to_f64(self) -> f64;
    /// Narrows from `f64` (rounding to nearest for `f32`).
    fn from_f64(value: f64) -> Self;
}

macro_rules! impl_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            #[inline]
            #[allow(
                clippy::cast_possible_truncation,
                reason = "deliberate: rounds to the nearest f32, as documented"
            )]
            fn from_f64(value: f64) -> Self {
                value as $t
            }
        }
    };
}

impl_scalar!(f32);
impl_scalar!(f64);
