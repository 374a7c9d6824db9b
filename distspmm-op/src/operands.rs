//! The rules for a call's dense operands given as memory (an address, rows, columns, a leading
//! dimension): one home for the GPU operator's raw entry points and the C ABI's host and device
//! entry points. (The CPU operator takes `DenseView`s, whose constructor already checks the
//! extent, and the borrow checker rules out overlap.)

use distspmm_sparse::memory::human_bytes;

/// Why an operand given as memory cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OperandError {
    /// `ld < cols`.
    #[error("leading dimension of {name} is {ld}, less than cols = {cols}")]
    LeadingDimension {
        /// The operand's name.
        name: &'static str,
        /// Its leading dimension.
        ld: usize,
        /// Its columns.
        cols: usize,
    },
    /// The operand's bytes, `4·((rows − 1)·ld + cols)` from its address, do not fit the
    /// address space (see [`check_pair`] for the extent that reaches the other operand).
    #[error(
        "{name} of {rows} rows × ld {ld} (cols {cols}) × 4 bytes from {addr:#x} overflows the \
         address space: check rows, cols and the leading dimension"
    )]
    Overflow {
        /// The operand's name.
        name: &'static str,
        /// Its rows.
        rows: usize,
        /// Its columns.
        cols: usize,
        /// Its leading dimension.
        ld: usize,
        /// Its address.
        addr: u64,
    },
    /// A NULL address for an operand that holds values.
    #[error("{name} is NULL but holds {values} values")]
    Null {
        /// The operand's name.
        name: &'static str,
        /// Values it spans.
        values: usize,
    },
    /// An address that is not a multiple of 4 bytes.
    #[error("{name} ({addr:#x}) is not aligned to 4 bytes")]
    Misaligned {
        /// The operand's name.
        name: &'static str,
        /// Its address.
        addr: u64,
    },
    /// Input and output share memory.
    #[error(
        "{input} ({} from {input_addr:#x}) and {output} ({} from {output_addr:#x}) overlap; the \
         product cannot be computed in place (for separate buffers, check rows, cols and the \
         leading dimensions)",
        human_bytes(*input_bytes),
        human_bytes(*output_bytes)
    )]
    Overlap {
        /// The input's name.
        input: &'static str,
        /// The output's name.
        output: &'static str,
        /// The input's address.
        input_addr: u64,
        /// The input's extent in bytes.
        input_bytes: u64,
        /// The output's address.
        output_addr: u64,
        /// The output's extent in bytes.
        output_bytes: u64,
    },
}

/// A dense f32 operand as memory: `rows × cols`, row `i` starting `i·ld` values after `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Its name in messages (`x`, `dY`, …).
    pub name: &'static str,
    /// Byte address of element (0, 0); 0 is NULL.
    pub addr: u64,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Leading dimension, in values.
    pub ld: usize,
}

/// The end of the address space a process is given unless it asks for more with an address
/// hint: 2^47 on x86-64 (four-level paging, and five-level paging without a hint), 2^48 on
/// AArch64; elsewhere the top of `u64`. An operand whose declared extent runs past it into the
/// other operand is a wrong size, not an in-place call ([`check_pair`]).
const DEFAULT_ADDRESS_END: u64 = if cfg!(target_arch = "x86_64") {
    1 << 47
} else if cfg!(target_arch = "aarch64") {
    1 << 48
} else {
    u64::MAX
};

impl Operand {
    /// Values the operand spans, `(rows − 1)·ld + cols` (0 when it has no rows or columns),
    /// after checking `ld >= cols`.
    ///
    /// # Errors
    /// [`OperandError::LeadingDimension`], [`OperandError::Overflow`] (also when the span in
    /// bytes is larger than any object can be, `isize::MAX`).
    pub fn values(&self) -> Result<usize, OperandError> {
        if self.ld < self.cols {
            return Err(OperandError::LeadingDimension {
                name: self.name,
                ld: self.ld,
                cols: self.cols,
            });
        }
        if self.rows == 0 || self.cols == 0 {
            return Ok(0);
        }
        (self.rows - 1)
            .checked_mul(self.ld)
            .and_then(|e| e.checked_add(self.cols))
            .filter(|e| {
                e.checked_mul(size_of::<f32>())
                    .is_some_and(|bytes| isize::try_from(bytes).is_ok())
            })
            .ok_or(self.overflow())
    }

    fn overflow(&self) -> OperandError {
        OperandError::Overflow {
            name: self.name,
            rows: self.rows,
            cols: self.cols,
            ld: self.ld,
            addr: self.addr,
        }
    }

    /// [`Operand::values`], plus: not NULL when it spans values, aligned for f32, its bytes
    /// below the top of the address space.
    ///
    /// # Errors
    /// As [`Operand::values`]; [`OperandError::Null`], [`OperandError::Misaligned`],
    /// [`OperandError::Overflow`] when `addr + 4·values` passes the top of the address space.
    pub fn check(&self) -> Result<usize, OperandError> {
        let values = self.values()?;
        if values > 0 && self.addr == 0 {
            return Err(OperandError::Null {
                name: self.name,
                values,
            });
        }
        if !self.addr.is_multiple_of(align_of::<f32>() as u64) {
            return Err(OperandError::Misaligned {
                name: self.name,
                addr: self.addr,
            });
        }
        // The last byte must have an address (on a 32-bit target, below 2^32).
        let last = self.bytes(values).1.map(|end| end.saturating_sub(1));
        if values > 0 && last.is_none_or(|last| usize::try_from(last).is_err()) {
            return Err(self.overflow());
        }
        Ok(values)
    }

    /// The byte range `[addr, addr + 4·values)`; `None` for the end when it passes `u64`.
    fn bytes(&self, values: usize) -> (u64, Option<u64>) {
        let len = (values as u64).checked_mul(size_of::<f32>() as u64);
        (self.addr, len.and_then(|len| self.addr.checked_add(len)))
    }
}

/// Checks both operands of a product ([`Operand::check`]) and that they do not overlap;
/// returns the values each spans. Two ranges that overlap because the first one in memory
/// runs past the end of a process's default address space (2^47 on x86-64) into the other are
/// an operand too large for any buffer — a wrong rows, cols or ld — and reported as
/// [`OperandError::Overflow`] of that operand; an extent past that end that reaches nothing
/// else is accepted, as a process may map memory there.
///
/// # Errors
/// The first failing rule, input first; [`OperandError::Overflow`], [`OperandError::Overlap`].
pub fn check_pair(input: &Operand, output: &Operand) -> Result<(usize, usize), OperandError> {
    let (n_in, n_out) = (input.check()?, output.check()?);
    if n_in > 0 && n_out > 0 {
        // `check` made sure both ends exist.
        let end = |o: &Operand, n| o.bytes(n).1.unwrap_or(u64::MAX);
        let ((a0, a1), (b0, b1)) = (
            (input.addr, end(input, n_in)),
            (output.addr, end(output, n_out)),
        );
        if a0 < b1 && b0 < a1 {
            // The operand that starts first is the one whose extent reaches the other.
            let (first, first_end) = if a0 <= b0 { (input, a1) } else { (output, b1) };
            if first_end > DEFAULT_ADDRESS_END {
                return Err(first.overflow());
            }
            return Err(OperandError::Overlap {
                input: input.name,
                output: output.name,
                input_addr: a0,
                input_bytes: a1 - a0,
                output_addr: b0,
                output_bytes: b1 - b0,
            });
        }
    }
    Ok((n_in, n_out))
}

/// Checks every operand of a call ([`Operand::check`]) and that no output overlaps any other
/// operand ([`check_pair`]'s rule for each pair); inputs may share memory (the `U` and `V` of
/// an SDDMM may be one matrix). A per-edge operand is an `nnz × 1` operand with `ld = 1`.
///
/// # Errors
/// The first failing rule: inputs in order, then outputs in order.
pub fn check_all(inputs: &[Operand], outputs: &[Operand]) -> Result<(), OperandError> {
    for o in inputs.iter().chain(outputs) {
        o.check()?;
    }
    for (k, out) in outputs.iter().enumerate() {
        for other in inputs.iter().chain(&outputs[..k]) {
            check_pair(other, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &'static str, addr: u64, rows: usize, cols: usize, ld: usize) -> Operand {
        Operand {
            name,
            addr,
            rows,
            cols,
            ld,
        }
    }

    #[test]
    fn extents_alignment_and_overlap() {
        let (x, y) = (m("x", 0x10_000, 10, 4, 4), m("y", 0x20_000, 10, 4, 6));
        assert_eq!(check_pair(&x, &y), Ok((40, 58)));
        assert!(matches!(
            check_pair(&x, &m("y", 0x20_000, 10, 4, 3)),
            Err(OperandError::LeadingDimension {
                name: "y",
                ld: 3,
                cols: 4
            })
        ));
        assert!(matches!(
            check_pair(&m("x", 0, 10, 4, 4), &y),
            Err(OperandError::Null {
                name: "x",
                values: 40
            })
        ));
        assert!(matches!(
            check_pair(&m("x", 0x10_002, 10, 4, 4), &y),
            Err(OperandError::Misaligned { .. })
        ));
        // Y starts inside X's last row; X's extent ending exactly where Y starts is fine.
        assert!(matches!(
            check_pair(&x, &m("y", 0x10_000 + 4 * 37, 10, 4, 4)),
            Err(OperandError::Overlap {
                input: "x",
                output: "y",
                input_bytes: 160,
                ..
            })
        ));
        assert_eq!(
            check_pair(&x, &m("y", 0x10_000 + 4 * 40, 10, 4, 4)),
            Ok((40, 40))
        );
        // Y inside X's padding still overlaps X's extent (conservative, as the kernels may
        // not touch it but the caller's memory is one block).
        assert!(check_pair(&m("x", 0x10_000, 2, 1, 8), &m("y", 0x10_004, 1, 1, 1)).is_err());
        // An absurd leading dimension is an overflow, not a wrap-around.
        assert!(matches!(
            check_pair(&m("x", 0x10_000, 10, 4, usize::MAX), &y),
            Err(OperandError::Overflow { name: "x", .. })
        ));
        assert!(matches!(
            m("x", 0x10_000, 2, 1, usize::MAX / 4).values(),
            Err(OperandError::Overflow { .. })
        ));
        // Nothing to hold: NULL is fine, in place or not.
        assert_eq!(
            check_pair(&m("x", 0, 0, 4, 4), &m("y", 0, 0, 4, 4)),
            Ok((0, 0))
        );
        assert_eq!(
            check_pair(&m("x", 0, 3, 0, 0), &m("y", 0, 3, 0, 0)),
            Ok((0, 0))
        );
        // The top of the address space is an overflow, not a wrap-around.
        let top = u64::MAX - 3;
        assert!(matches!(
            check_pair(&m("x", top, 1, 1, 1), &m("y", 0x10_000, 1, 1, 1)),
            Err(OperandError::Overflow { name: "x", .. })
        ));
        assert_eq!(
            check_pair(&m("x", top - 4, 1, 1, 1), &m("y", 0x10_000, 1, 1, 1)),
            Ok((1, 1))
        );
        // More bytes than any object may hold (isize::MAX).
        assert!(matches!(
            m("x", 0x10_000, 1, usize::MAX / 4, usize::MAX / 4).values(),
            Err(OperandError::Overflow { .. })
        ));
    }

    #[test]
    fn every_output_is_checked_against_every_other_operand() {
        let (u, v) = (m("U", 0x10_000, 10, 4, 4), m("V", 0x20_000, 10, 4, 4));
        let e = m("E", 0x30_000, 25, 1, 1);
        assert_eq!(check_all(&[u, v], &[e]), Ok(()));
        // U and V may be one matrix; an output may not be either.
        assert_eq!(check_all(&[u, u], &[e]), Ok(()));
        assert!(matches!(
            check_all(&[u, v], &[m("E", 0x20_000 + 4 * 8, 25, 1, 1)]),
            Err(OperandError::Overlap {
                input: "V",
                output: "E",
                ..
            })
        ));
        // Two outputs in one place.
        let du = m("dU", 0x40_000, 10, 4, 4);
        assert!(matches!(
            check_all(&[e, u, v], &[du, m("dV", 0x40_000 + 4 * 39, 10, 4, 4)]),
            Err(OperandError::Overlap {
                input: "dU",
                output: "dV",
                ..
            })
        ));
        assert!(matches!(
            check_all(&[e], &[m("dV", 0, 1, 1, 1)]),
            Err(OperandError::Null { name: "dV", .. })
        ));
    }

    /// `cols = 2^40` on buffers of the usual size: the declared extent of one operand reaches
    /// the other only by running past the end of the address space, which is an extent that
    /// overflows, not an in-place call.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn an_extent_past_the_address_space_is_an_overflow_not_an_overlap() {
        let cols = 1usize << 40;
        let (x_addr, y_addr) = (0x5555_0000_0000, 0x5555_0010_0000);
        let err = check_pair(
            &m("x", x_addr, 1354, cols, cols),
            &m("y", y_addr, 1354, cols, cols),
        )
        .unwrap_err();
        assert!(
            matches!(err, OperandError::Overflow { name: "x", .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("overflows the address space") && text.contains("cols 1099511627776"),
            "{text}"
        );
        // The output first in memory: its extent is the one that runs over.
        assert!(matches!(
            check_pair(
                &m("dy", y_addr, 1354, cols, cols),
                &m("dx", x_addr, 1354, cols, cols)
            ),
            Err(OperandError::Overflow { name: "dx", .. })
        ));
        // A true in-place call within the address space is still an overlap, with both extents.
        let err = check_pair(&m("x", x_addr, 4, 4, 4), &m("y", x_addr + 4, 4, 4, 4)).unwrap_err();
        assert!(matches!(err, OperandError::Overlap { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("x (64 B from 0x555500000000)") && text.contains("check rows, cols"),
            "{text}"
        );
        // An extent past 2^47 that reaches nothing else is accepted (memory may be mapped
        // there with an address hint).
        assert_eq!(
            check_pair(
                &m("x", 0x7f00_0000_0000, 1, 1 << 42, 1 << 42),
                &m("y", 0x10_000, 1, 1, 1)
            ),
            Ok((1 << 42, 1))
        );
    }
}
