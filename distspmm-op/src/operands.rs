//! The rules for a call's dense operands given as memory (an address, rows, columns, a leading
//! dimension): one home for the GPU operator's raw entry points and the C ABI's host and device
//! entry points. (The CPU operator takes `DenseView`s, whose constructor already checks the
//! extent, and the borrow checker rules out overlap.)

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
    /// `(rows − 1)·ld + cols` values do not fit the address space.
    #[error("{rows} rows × ld {ld} of {name} overflow")]
    Overflow {
        /// The operand's name.
        name: &'static str,
        /// Its rows.
        rows: usize,
        /// Its leading dimension.
        ld: usize,
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
    #[error("{input} and {output} overlap; the product cannot be computed in place")]
    Overlap {
        /// The input's name.
        input: &'static str,
        /// The output's name.
        output: &'static str,
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

impl Operand {
    /// Values the operand spans, `(rows − 1)·ld + cols` (0 when it has no rows or columns),
    /// after checking `ld >= cols`.
    ///
    /// # Errors
    /// [`OperandError::LeadingDimension`], [`OperandError::Overflow`] (also when the span in
    /// bytes overflows).
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
            .filter(|e| e.checked_mul(size_of::<f32>()).is_some())
            .ok_or(OperandError::Overflow {
                name: self.name,
                rows: self.rows,
                ld: self.ld,
            })
    }

    /// [`Operand::values`], plus: not NULL when it spans values, aligned for f32.
    ///
    /// # Errors
    /// As [`Operand::values`]; [`OperandError::Null`], [`OperandError::Misaligned`].
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
        Ok(values)
    }

    /// The byte range `[addr, addr + 4·values)` (saturating at the top of the address space).
    fn bytes(&self, values: usize) -> (u64, u64) {
        let len = (values as u64).saturating_mul(size_of::<f32>() as u64);
        (self.addr, self.addr.saturating_add(len))
    }
}

/// Checks both operands of a product ([`Operand::check`]) and that they do not overlap;
/// returns the values each spans.
///
/// # Errors
/// The first failing rule, input first; [`OperandError::Overlap`].
pub fn check_pair(input: &Operand, output: &Operand) -> Result<(usize, usize), OperandError> {
    let (n_in, n_out) = (input.check()?, output.check()?);
    if n_in > 0 && n_out > 0 {
        let ((a0, a1), (b0, b1)) = (input.bytes(n_in), output.bytes(n_out));
        if a0 < b1 && b0 < a1 {
            return Err(OperandError::Overlap {
                input: input.name,
                output: output.name,
            });
        }
    }
    Ok((n_in, n_out))
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
                output: "y"
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
        // The top of the address space saturates instead of wrapping.
        let top = u64::MAX - 3;
        assert!(check_pair(&m("x", top, 1, 1, 1), &m("y", top, 1, 1, 1)).is_err());
    }
}
