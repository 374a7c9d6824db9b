//! The precision of the distributed product's messages ([`Precision`]) and the conversions
//! between `f32` and the 16-bit formats on the wire ([`narrow`], [`widen`]).
//!
//! A halo row or broadcast block in `bf16` or `f16` is narrowed from `f32` before it is handed
//! to the transport and widened back to `f32` where it is received; every product and sum stays
//! in `f32`. The conversions are IEEE 754's: round to nearest, ties to even; a value beyond the
//! largest finite one rounds to ±Inf; ±Inf stays ±Inf; subnormal inputs and results are kept as
//! the formats define them (never flushed to zero); a NaN stays a NaN, made quiet, with as much
//! of its payload as the narrower format holds (its upper bits). Widening is exact for every
//! non-NaN value. The results are those of the `half` crate's software conversions
//! (`bf16::from_f32_const`, `f16::from_f32_const` and their `to_f32_const`), bit for bit, on
//! every instruction set (tested over the bit patterns that matter).
//!
//! Instruction sets, through [`isa`](super::isa): AVX-512F (16 values a step: `bf16` with
//! integer rounding, `f16` with `vcvtps2ph`/`vcvtph2ps`), AVX2 (the portable `bf16` loop
//! compiled for AVX2; `f16` with F16C when the CPU has it), and portable loops. The AVX-512
//! `bf16` instruction (`vcvtneps2bf16`) is not used: it flushes subnormals to zero.

use core::fmt;
use core::str::FromStr;

#[cfg(target_arch = "x86_64")]
use super::has_f16c;
use super::{isa, Isa, KernelError};

/// The format of the values a distributed product hands to its communicator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Precision {
    /// IEEE single precision, the values as they are (no conversion).
    #[default]
    F32,
    /// bfloat16: `f32`'s 8-bit exponent, 7 stored mantissa bits.
    Bf16,
    /// IEEE half precision: 5-bit exponent, 10 stored mantissa bits (largest finite 65504).
    F16,
}

impl Precision {
    /// Every precision, in a fixed order.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    /// Lower-case name (`f32`, `bf16`, `f16`), as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// Bytes of one value on the wire.
    pub fn value_bytes(self) -> u64 {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 | Precision::F16 => 2,
        }
    }

    /// The 16-bit format, or `None` for `f32`.
    pub fn half(self) -> Option<Half> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(Half::Bf16),
            Precision::F16 => Some(Half::F16),
        }
    }

    /// The unit roundoff of one conversion to this format: a finite `x` within the format's
    /// normal range becomes `x·(1 + δ)` with `|δ| ≤ u` (`2⁻⁸` for `bf16`, `2⁻¹¹` for `f16`, 0
    /// for `f32`). Below the smallest normal the error is absolute instead: at most half the
    /// smallest subnormal ([`Precision::subnormal_step`] / 2).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Precision::F32 => 0.0,
            Precision::Bf16 => 1.0 / 256.0,
            Precision::F16 => 1.0 / 2048.0,
        }
    }

    /// The spacing of the format's subnormals (0 for `f32`, whose values are not converted).
    pub fn subnormal_step(self) -> f64 {
        match self {
            Precision::F32 => 0.0,
            // 2^-133 and 2^-24.
            Precision::Bf16 => f64::from(f32::from_bits(0x0000_0001)) * 65536.0,
            Precision::F16 => 1.0 / 16_777_216.0,
        }
    }

    /// The name as one 64-bit word (its ASCII bytes, little-endian, zero-padded): what the
    /// ranks compare when they agree on their options.
    pub fn word(self) -> u64 {
        let mut bytes = [0u8; 8];
        bytes[..self.name().len()].copy_from_slice(self.name().as_bytes());
        u64::from_le_bytes(bytes)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`Precision`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown message precision `{0}`: give f32, bf16 or f16")]
pub struct UnknownPrecision(pub alloc::string::String);

impl FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownPrecision(s.into()))
    }
}

/// A 16-bit format on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Half {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
}

/// Below this many values a conversion runs on the calling thread.
#[cfg(feature = "std")]
const SERIAL_VALUES: usize = 1 << 16;

/// `dst[k] = fmt(src[k])`: `f32` values rounded to the 16-bit format's bit patterns (see the
/// [module docs](self)). Multi-threaded over rayon's current pool for long runs; the result
/// does not depend on the thread count.
///
/// # Errors
/// [`KernelError::ConvertLength`] when the slices differ in length.
pub fn narrow(fmt: Half, src: &[f32], dst: &mut [u16]) -> Result<(), KernelError> {
    check(src.len(), dst.len())?;
    narrow_with(isa(), fmt, src, dst);
    Ok(())
}

/// `dst[k] = f32(src[k])`: the 16-bit format's bit patterns widened to `f32` (exact; a NaN
/// stays a quiet NaN with its payload).
///
/// # Errors
/// [`KernelError::ConvertLength`] when the slices differ in length.
pub fn widen(fmt: Half, src: &[u16], dst: &mut [f32]) -> Result<(), KernelError> {
    check(src.len(), dst.len())?;
    widen_with(isa(), fmt, src, dst);
    Ok(())
}

fn check(from: usize, to: usize) -> Result<(), KernelError> {
    if from == to {
        Ok(())
    } else {
        Err(KernelError::ConvertLength { from, to })
    }
}

/// [`narrow`] with at most the instruction set `isa` (the tests force each one).
pub(crate) fn narrow_with(isa: Isa, fmt: Half, src: &[f32], dst: &mut [u16]) {
    #[cfg(feature = "std")]
    if src.len() > SERIAL_VALUES {
        use rayon::prelude::*;
        dst.par_chunks_mut(SERIAL_VALUES)
            .zip(src.par_chunks(SERIAL_VALUES))
            .for_each(|(d, s)| narrow_serial(isa, fmt, s, d));
        return;
    }
    narrow_serial(isa, fmt, src, dst);
}

/// [`widen`] with at most the instruction set `isa`.
pub(crate) fn widen_with(isa: Isa, fmt: Half, src: &[u16], dst: &mut [f32]) {
    #[cfg(feature = "std")]
    if src.len() > SERIAL_VALUES {
        use rayon::prelude::*;
        dst.par_chunks_mut(SERIAL_VALUES)
            .zip(src.par_chunks(SERIAL_VALUES))
            .for_each(|(d, s)| widen_serial(isa, fmt, s, d));
        return;
    }
    widen_serial(isa, fmt, src, dst);
}

fn narrow_serial(isa: Isa, fmt: Half, src: &[f32], dst: &mut [u16]) {
    let isa = isa.min(Isa::supported());
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 {
            // SAFETY: `isa` was capped at what the CPU supports, so AVX-512F is present.
            unsafe { x86::narrow_avx512(fmt, src, dst) };
            return;
        }
        if isa == Isa::Avx2 {
            match fmt {
                // SAFETY: as above, AVX2 is present.
                Half::Bf16 => unsafe { x86::narrow_bf16_avx2(src, dst) },
                // SAFETY: AVX2 is present and `has_f16c` detected F16C.
                Half::F16 if has_f16c() => unsafe { x86::narrow_f16_f16c(src, dst) },
                Half::F16 => portable_narrow(fmt, src, dst),
            }
            return;
        }
    }
    let _ = isa;
    portable_narrow(fmt, src, dst);
}

fn widen_serial(isa: Isa, fmt: Half, src: &[u16], dst: &mut [f32]) {
    let isa = isa.min(Isa::supported());
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 {
            // SAFETY: `isa` was capped at what the CPU supports, so AVX-512F is present.
            unsafe { x86::widen_avx512(fmt, src, dst) };
            return;
        }
        if isa == Isa::Avx2 {
            match fmt {
                // SAFETY: AVX2 is present.
                Half::Bf16 => unsafe { x86::widen_bf16_avx2(src, dst) },
                // SAFETY: AVX2 is present and `has_f16c` detected F16C.
                Half::F16 if has_f16c() => unsafe { x86::widen_f16_f16c(src, dst) },
                Half::F16 => portable_widen(fmt, src, dst),
            }
            return;
        }
    }
    let _ = isa;
    portable_widen(fmt, src, dst);
}

/// `f32` bits to `bf16` bits: round to nearest even on the integer pattern (exact for
/// subnormals and overflow to Inf), a NaN made quiet keeping its upper payload.
#[inline(always)]
fn bf16_bits(x: u32) -> u16 {
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x0040;
    let r = if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    };
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the upper 16 bits of a u32"
    )]
    let r = r as u16;
    r
}

/// `bf16` bits to `f32` bits: a shift, a NaN made quiet.
#[inline(always)]
fn bf16_widened(h: u16) -> u32 {
    let quiet = if h & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    u32::from(h | quiet) << 16
}

fn portable_narrow(fmt: Half, src: &[f32], dst: &mut [u16]) {
    match fmt {
        Half::Bf16 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = bf16_bits(s.to_bits());
            }
        }
        Half::F16 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = half::f16::from_f32(*s).to_bits();
            }
        }
    }
}

fn portable_widen(fmt: Half, src: &[u16], dst: &mut [f32]) {
    match fmt {
        Half::Bf16 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(bf16_widened(*s));
            }
        }
        Half::F16 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = half::f16::from_bits(*s).to_f32();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{
        __m128i, __m256i, __m512i, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps,
        _mm256_storeu_ps, _mm512_add_epi32, _mm512_and_si512, _mm512_cmpgt_epu32_mask,
        _mm512_cvtepi32_epi16, _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_cvtps_ph,
        _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_blend_epi32, _mm512_or_si512,
        _mm512_set1_epi32, _mm512_slli_epi32, _mm512_srli_epi32, _mm512_storeu_ps,
        _mm512_storeu_si512, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_NO_EXC,
        _MM_FROUND_TO_NEAREST_INT,
    };
    use core::arch::x86_64::{_mm256_loadu_si256, _mm256_storeu_si256};

    use super::{bf16_bits, bf16_widened, portable_narrow, portable_widen, Half};

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    /// # Safety
    /// AVX-512F is present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow_avx512(fmt: Half, src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let body = n - n % 16;
        let mut k = 0;
        while k < body {
            // SAFETY: `k + 16 <= n`, within both slices; unaligned loads and stores.
            unsafe {
                let x = _mm512_loadu_si512(src.as_ptr().add(k).cast());
                let h = match fmt {
                    Half::Bf16 => {
                        let lsb =
                            _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
                        let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb);
                        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, bias));
                        let magnitude = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
                        let nan =
                            _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7F80_0000));
                        let quiet =
                            _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x0040));
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
                    }
                    Half::F16 => _mm512_cvtps_ph::<ROUND>(_mm512_loadu_ps(src.as_ptr().add(k))),
                };
                _mm256_storeu_si256(dst.as_mut_ptr().add(k).cast::<__m256i>(), h);
            }
            k += 16;
        }
        portable_narrow(fmt, &src[body..n], &mut dst[body..n]);
    }

    /// # Safety
    /// AVX-512F is present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_avx512(fmt: Half, src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let body = n - n % 16;
        let mut k = 0;
        while k < body {
            // SAFETY: `k + 16 <= n`, within both slices; unaligned loads and stores.
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(k).cast::<__m256i>());
                match fmt {
                    Half::Bf16 => {
                        let w: __m512i = _mm512_cvtepu16_epi32(h);
                        let magnitude = _mm512_and_si512(w, _mm512_set1_epi32(0x7FFF));
                        let nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7F80));
                        let quiet = _mm512_or_si512(w, _mm512_set1_epi32(0x0040));
                        let bits = _mm512_slli_epi32::<16>(_mm512_mask_blend_epi32(nan, w, quiet));
                        _mm512_storeu_si512(dst.as_mut_ptr().add(k).cast(), bits);
                    }
                    Half::F16 => _mm512_storeu_ps(dst.as_mut_ptr().add(k), _mm512_cvtph_ps(h)),
                }
            }
            k += 16;
        }
        portable_widen(fmt, &src[body..n], &mut dst[body..n]);
    }

    /// The portable `bf16` loop compiled for AVX2 (it vectorises).
    ///
    /// # Safety
    /// AVX2 is present.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn narrow_bf16_avx2(src: &[f32], dst: &mut [u16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16_bits(s.to_bits());
        }
    }

    /// # Safety
    /// AVX2 is present.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_bf16_avx2(src: &[u16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(bf16_widened(*s));
        }
    }

    /// # Safety
    /// AVX2 and F16C are present.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow_f16_f16c(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let body = n - n % 8;
        let mut k = 0;
        while k < body {
            // SAFETY: `k + 8 <= n`, within both slices; unaligned loads and stores.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(
                    src.as_ptr().add(k),
                ));
                _mm_storeu_si128(dst.as_mut_ptr().add(k).cast::<__m128i>(), h);
            }
            k += 8;
        }
        portable_narrow(Half::F16, &src[body..n], &mut dst[body..n]);
    }

    /// # Safety
    /// AVX2 and F16C are present.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_f16_f16c(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let body = n - n % 8;
        let mut k = 0;
        while k < body {
            // SAFETY: `k + 8 <= n`, within both slices; unaligned loads and stores.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(k).cast::<__m128i>());
                _mm256_storeu_ps(dst.as_mut_ptr().add(k), _mm256_cvtph_ps(h));
            }
            k += 8;
        }
        portable_widen(Half::F16, &src[body..n], &mut dst[body..n]);
    }
}

#[cfg(test)]
mod tests;
