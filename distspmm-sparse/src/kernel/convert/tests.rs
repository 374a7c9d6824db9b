//! The conversions against the `half` crate's software conversions, bit for bit, on every
//! instruction set this CPU runs (forced one at a time, as the product kernels' tests do).

use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;

use super::*;

/// Every instruction set this CPU can run.
fn isas() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| i <= Isa::supported())
        .collect()
}

fn reference_narrow(fmt: Half, x: f32) -> u16 {
    match fmt {
        Half::Bf16 => half::bf16::from_f32_const(x).to_bits(),
        Half::F16 => half::f16::from_f32_const(x).to_bits(),
    }
}

fn reference_widen(fmt: Half, h: u16) -> u32 {
    match fmt {
        Half::Bf16 => half::bf16::from_bits(h).to_f32_const().to_bits(),
        Half::F16 => half::f16::from_bits(h).to_f32_const().to_bits(),
    }
}

/// The `f32` bit patterns that matter for both formats: ±0, the smallest and largest
/// subnormals and normals of `f32` and of each format, the values around every rounding
/// boundary of each format (just below, the tie, just above, for every 16-bit pattern), just
/// below and at overflow, ±Inf, quiet and signalling NaNs with payloads in high and low bits;
/// plus a stride through all 2³² patterns.
fn patterns() -> Vec<u32> {
    let mut p: Vec<u32> = vec![
        0x0000_0000,
        0x8000_0000, // ±0
        0x0000_0001,
        0x8000_0001,
        0x007F_FFFF,
        0x807F_FFFF, // f32 subnormals
        0x0080_0000,
        0x8080_0000,
        0x7F7F_FFFF,
        0xFF7F_FFFF, // f32 smallest/largest normals
        0x7F80_0000,
        0xFF80_0000, // ±Inf
        0x7FC0_0000,
        0xFFC0_0000,
        0x7F80_0001,
        0xFF80_0001, // quiet and signalling NaN
        0x7FA0_0000,
        0x7FBF_FFFF,
        0x7FC0_0001,
        0x7FFF_FFFF,
        0xFFFF_FFFF,
        0x7F81_2345,
        0x7F80_8000,
        0x7F80_FFFF,
        0x7F80_1000,
        0x7F80_2000, // NaN payloads in the low bits
        0x477F_E000,
        0x477F_EFFF,
        0x477F_F000,
        0x477F_F001,
        0x4780_0000, // f16 overflow: 65504..
        0x3880_0000,
        0x3380_0000,
        0x3300_0000,
        0x3300_0001,
        0x32FF_FFFF, // f16 normal/subnormal edges
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_8001,
        0x3F81_7FFF, // bf16 ties to even both ways
        0x3F80_1000,
        0x3F80_3000,
        0x3F80_0FFF,
        0x3F80_1001, // f16 ties to even both ways
    ];
    // Around every bf16 boundary: the pattern, just below the tie, the tie, just above.
    for h in 0..=u16::MAX {
        let base = u32::from(h) << 16;
        p.extend([
            base,
            base | 0x7FFF,
            base | 0x8000,
            base | 0x8001,
            base | 0xFFFF,
        ]);
    }
    // Around every f16 value (as f32) and the ties between neighbours.
    for h in 0..=u16::MAX {
        let x = reference_widen(Half::F16, h);
        p.extend([
            x,
            x.wrapping_add(0x0FFF),
            x.wrapping_add(0x1000),
            x.wrapping_add(0x1001),
        ]);
        p.extend([x.wrapping_sub(1), x.wrapping_add(1)]);
    }
    // A stride through everything (odd, so every residue class mod 2^k is visited).
    p.extend((0..=u32::MAX).step_by(40_503));
    p
}

#[test]
fn narrowing_matches_the_software_reference_on_every_instruction_set() {
    let bits = patterns();
    let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    for fmt in [Half::Bf16, Half::F16] {
        let want: Vec<u16> = src.iter().map(|&x| reference_narrow(fmt, x)).collect();
        for isa in isas() {
            // Every length remainder of the vector loops, and the multi-threaded path.
            for len in [src.len(), 1, 7, 15, 17, 33] {
                let mut got = vec![0u16; len];
                narrow_with(isa, fmt, &src[..len], &mut got);
                for k in 0..len {
                    assert_eq!(
                        got[k], want[k],
                        "{fmt:?} {isa:?}: {:#010x} narrowed to {:#06x}, the reference gives {:#06x}",
                        bits[k], got[k], want[k]
                    );
                }
            }
        }
    }
}

#[test]
fn widening_matches_the_software_reference_for_every_pattern() {
    let src: Vec<u16> = (0..=u16::MAX).collect();
    for fmt in [Half::Bf16, Half::F16] {
        for isa in isas() {
            let mut got = vec![0f32; src.len()];
            widen_with(isa, fmt, &src, &mut got);
            for (h, g) in src.iter().zip(&got) {
                assert_eq!(
                    g.to_bits(),
                    reference_widen(fmt, *h),
                    "{fmt:?} {isa:?}: {h:#06x}"
                );
            }
        }
    }
}

#[test]
fn the_formats_keep_what_they_promise() {
    for fmt in [Half::Bf16, Half::F16] {
        for isa in isas() {
            let src = [
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::from_bits(0x7F80_0001), // signalling NaN
                f32::from_bits(0xFFC1_2345),
                f32::MAX,
                -0.0,
                1.0,
            ];
            let mut h = [0u16; 7];
            narrow_with(isa, fmt, &src, &mut h);
            let mut back = [0f32; 7];
            widen_with(isa, fmt, &h, &mut back);
            assert_eq!(back[0], f32::INFINITY, "{fmt:?} {isa:?}");
            assert_eq!(back[1], f32::NEG_INFINITY);
            assert!(back[2].is_nan() && back[3].is_nan(), "NaN stays NaN");
            assert_ne!(back[2].to_bits() & 0x0040_0000, 0, "and is quiet");
            assert!(back[3].is_sign_negative(), "with its sign");
            match fmt {
                Half::Bf16 => {
                    assert_eq!(back[3].to_bits() >> 16, 0xFFC1, "upper payload kept");
                    assert_eq!(
                        back[4],
                        f32::INFINITY,
                        "f32::MAX rounds up past bf16's largest"
                    );
                }
                Half::F16 => assert_eq!(back[4], f32::INFINITY, "overflow is Inf"),
            }
            assert_eq!(back[5].to_bits(), 0x8000_0000);
            assert_eq!(back[6], 1.0);
        }
    }
}

#[test]
fn conversions_check_their_lengths() {
    assert_eq!(
        narrow(Half::Bf16, &[1.0, 2.0], &mut [0; 1]),
        Err(KernelError::ConvertLength { from: 2, to: 1 })
    );
    assert!(widen(Half::F16, &[0; 3], &mut [0.0; 3]).is_ok());
}

#[test]
fn precisions_parse_and_name_themselves() {
    for p in Precision::ALL {
        assert_eq!(p.name().parse::<Precision>(), Ok(p));
        assert_eq!(
            p.word().to_le_bytes()[..p.name().len()],
            *p.name().as_bytes()
        );
    }
    assert_eq!("BF16".parse::<Precision>(), Ok(Precision::Bf16));
    assert!("fp8"
        .parse::<Precision>()
        .unwrap_err()
        .to_string()
        .contains("f32, bf16 or f16"));
    assert_eq!(Precision::Bf16.value_bytes(), 2);
    assert_eq!(Precision::F16.subnormal_step(), 2f64.powi(-24));
    assert_eq!(Precision::Bf16.subnormal_step(), 2f64.powi(-133));
}
