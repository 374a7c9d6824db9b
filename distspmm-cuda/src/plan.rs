//! Host-side work before an upload: the structure check of a CSR/CSC matrix and the
//! row-splitting plan that cuts long rows into pieces of about equal non-zero count.

use crate::error::{CudaError, Result};

/// Checks a compressed sparse structure (CSR, or CSC read as the CSR of the transpose):
/// `ptr` has `nmajor + 1` monotone entries starting at 0 and ending at `idx.len() ==
/// values.len()`, every index is below `nminor`, and the sizes fit the kernels' u32 indices.
pub(crate) fn validate_compressed(
    format: &'static str,
    nmajor: usize,
    nminor: usize,
    ptr: &[u64],
    idx: &[u32],
    values: &[f32],
) -> Result<()> {
    let bad = |reason: String| CudaError::InvalidMatrix { format, reason };
    if u32::try_from(nmajor).is_err() {
        return Err(bad(format!(
            "{nmajor} rows/columns do not fit the kernels' u32 row index"
        )));
    }
    if nminor > u32::MAX as usize + 1 {
        return Err(bad(format!("{nminor} rows/columns do not fit u32 indices")));
    }
    if ptr.len() != nmajor + 1 {
        return Err(bad(format!(
            "pointer array has {} entries, expected {}",
            ptr.len(),
            nmajor + 1
        )));
    }
    if ptr[0] != 0 {
        return Err(bad(format!(
            "pointer array starts at {}, expected 0",
            ptr[0]
        )));
    }
    if let Some(i) = ptr.windows(2).position(|w| w[1] < w[0]) {
        return Err(bad(format!(
            "pointer array decreases at {}: {} > {}",
            i,
            ptr[i],
            ptr[i + 1]
        )));
    }
    let nnz = ptr[nmajor];
    if nnz != idx.len() as u64 || nnz != values.len() as u64 {
        return Err(bad(format!(
            "pointer array ends at {nnz} but there are {} indices and {} values",
            idx.len(),
            values.len()
        )));
    }
    if let Some(k) = idx.iter().position(|&c| c as usize >= nminor) {
        return Err(bad(format!(
            "index {} at position {k} is out of range 0..{nminor}",
            idx[k]
        )));
    }
    Ok(())
}

/// Rows below this many non-zeros are never split, whatever the mean degree.
pub const MIN_PIECE_NNZ: u64 = 256;
/// Upper bound of the default piece size, so that a single warp's piece stays short.
pub const MAX_PIECE_NNZ: u64 = 4096;
/// A row counts as long when it has more than this many times the mean non-zeros per row.
pub const SKEW_FACTOR: u64 = 8;

/// Which rows are split and how: rows with more than [`piece_nnz`](Self::piece_nnz) non-zeros
/// are long; each long row is cut into `ceil(len / piece_nnz)` contiguous pieces whose sizes
/// differ by at most one. The row-group kernel skips long rows, a piece kernel reduces every
/// piece into a workspace row, and a combine kernel adds each long row's pieces in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSplitPlan {
    piece_nnz: u64,
    long_rows: Vec<u32>,
    long_piece_ptr: Vec<u64>,
    piece_lo: Vec<u64>,
    piece_hi: Vec<u64>,
}

impl RowSplitPlan {
    /// The default piece size for a matrix of `nrows` rows and `nnz` non-zeros:
    /// `SKEW_FACTOR` times the mean row length, clamped to `MIN_PIECE_NNZ..=MAX_PIECE_NNZ`.
    pub fn default_piece_nnz(nrows: usize, nnz: u64) -> u64 {
        let mean = nnz.div_ceil(nrows.max(1) as u64);
        (SKEW_FACTOR * mean).clamp(MIN_PIECE_NNZ, MAX_PIECE_NNZ)
    }

    /// Builds the plan for the row pointers `indptr` (`nrows + 1` monotone entries) with pieces
    /// of at most `piece_nnz` non-zeros.
    pub fn new(indptr: &[u64], piece_nnz: u64) -> Result<Self> {
        if piece_nnz == 0 {
            return Err(CudaError::Strategy(
                "row-splitting piece size must be at least 1".into(),
            ));
        }
        if indptr.is_empty() {
            return Err(CudaError::InvalidMatrix {
                format: "CSR",
                reason: "row pointer array is empty (expected nrows + 1 entries)".into(),
            });
        }
        let mut plan = RowSplitPlan {
            piece_nnz,
            long_rows: Vec::new(),
            long_piece_ptr: vec![0],
            piece_lo: Vec::new(),
            piece_hi: Vec::new(),
        };
        for (row, w) in indptr.windows(2).enumerate() {
            let (lo, hi) = (w[0], w[1]);
            if hi < lo {
                return Err(CudaError::InvalidMatrix {
                    format: "CSR",
                    reason: format!("row pointer array decreases at {row}: {lo} > {hi}"),
                });
            }
            let len = hi - lo;
            if len <= piece_nnz {
                continue;
            }
            let row = u32::try_from(row).map_err(|_| CudaError::InvalidMatrix {
                format: "CSR",
                reason: format!("row {row} does not fit the kernels' u32 row index"),
            })?;
            let pieces = len.div_ceil(piece_nnz);
            let (base, extra) = (len / pieces, len % pieces);
            let mut start = lo;
            for p in 0..pieces {
                let size = base + u64::from(p < extra);
                plan.piece_lo.push(start);
                plan.piece_hi.push(start + size);
                start += size;
            }
            plan.long_rows.push(row);
            plan.long_piece_ptr.push(plan.piece_lo.len() as u64);
        }
        if u32::try_from(plan.piece_lo.len()).is_err() {
            return Err(CudaError::Strategy(format!(
                "{} row-splitting pieces exceed the kernels' u32 count: raise the piece size",
                plan.piece_lo.len()
            )));
        }
        Ok(plan)
    }

    /// Rows with more non-zeros than this are long (and the largest size of a piece).
    pub fn piece_nnz(&self) -> u64 {
        self.piece_nnz
    }

    /// The long rows, ascending.
    pub fn long_rows(&self) -> &[u32] {
        &self.long_rows
    }

    /// `long_piece_ptr[i]..long_piece_ptr[i + 1]` are the pieces of `long_rows[i]`.
    pub fn long_piece_ptr(&self) -> &[u64] {
        &self.long_piece_ptr
    }

    /// First non-zero of each piece.
    pub fn piece_lo(&self) -> &[u64] {
        &self.piece_lo
    }

    /// One past the last non-zero of each piece.
    pub fn piece_hi(&self) -> &[u64] {
        &self.piece_hi
    }

    /// Number of pieces.
    pub fn pieces(&self) -> usize {
        self.piece_lo.len()
    }

    /// Whether no row is long (row splitting then reduces to the row-group kernel).
    pub fn is_empty(&self) -> bool {
        self.long_rows.is_empty()
    }

    /// f32 elements of the partial-sum workspace needed for `f` feature columns.
    pub fn workspace_len(&self, f: usize) -> usize {
        self.pieces() * workspace_ld(f)
    }
}

/// Leading dimension of the partial-sum workspace: `f` rounded up to a multiple of 4 so that
/// every row stays 16-byte aligned for float4 stores.
pub fn workspace_ld(f: usize) -> usize {
    f.div_ceil(4) * 4
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test matrices: every narrowing is exact"
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn indptr_from_lengths(lengths: &[u64]) -> Vec<u64> {
        let mut p = vec![0];
        for l in lengths {
            p.push(p.last().unwrap() + l);
        }
        p
    }

    /// Emulates the three GPU passes on the host: rows kernel for short rows, piece partial
    /// sums, ordered combine. Returns y = A x for one feature column.
    fn emulate(
        indptr: &[u64],
        values: &[f64],
        x_of_nz: impl Fn(usize) -> f64,
        plan: &RowSplitPlan,
    ) -> Vec<f64> {
        let nrows = indptr.len() - 1;
        let mut y = vec![0.0; nrows];
        for r in 0..nrows {
            if indptr[r + 1] - indptr[r] <= plan.piece_nnz() {
                y[r] = (indptr[r]..indptr[r + 1])
                    .map(|k| values[k as usize] * x_of_nz(k as usize))
                    .sum();
            }
        }
        let partial: Vec<f64> = (0..plan.pieces())
            .map(|p| {
                (plan.piece_lo()[p]..plan.piece_hi()[p])
                    .map(|k| values[k as usize] * x_of_nz(k as usize))
                    .sum()
            })
            .collect();
        for (i, &r) in plan.long_rows().iter().enumerate() {
            let (a, b) = (
                plan.long_piece_ptr()[i] as usize,
                plan.long_piece_ptr()[i + 1] as usize,
            );
            y[r as usize] = partial[a..b].iter().sum();
        }
        y
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn pieces_tile_exactly_the_long_rows(lengths in prop::collection::vec(0u64..300, 0..60), piece in 1u64..80) {
            let indptr = indptr_from_lengths(&lengths);
            let plan = RowSplitPlan::new(&indptr, piece).unwrap();
            let expected_long: Vec<u32> = lengths.iter().enumerate().filter(|(_, &l)| l > piece).map(|(r, _)| r as u32).collect();
            prop_assert_eq!(plan.long_rows(), &expected_long[..]);
            prop_assert_eq!(plan.long_piece_ptr().len(), expected_long.len() + 1);
            for (i, &r) in plan.long_rows().iter().enumerate() {
                let (a, b) = (plan.long_piece_ptr()[i] as usize, plan.long_piece_ptr()[i + 1] as usize);
                let len = lengths[r as usize];
                prop_assert_eq!((b - a) as u64, len.div_ceil(piece));
                // Contiguous, in order, covering the row exactly; sizes within one of each other.
                prop_assert_eq!(plan.piece_lo()[a], indptr[r as usize]);
                prop_assert_eq!(plan.piece_hi()[b - 1], indptr[r as usize + 1]);
                let sizes: Vec<u64> = (a..b).map(|p| plan.piece_hi()[p] - plan.piece_lo()[p]).collect();
                for p in a + 1..b {
                    prop_assert_eq!(plan.piece_lo()[p], plan.piece_hi()[p - 1]);
                }
                prop_assert!(sizes.iter().all(|&s| s >= 1 && s <= piece));
                prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            }
            prop_assert_eq!(plan.workspace_len(5), plan.pieces() * 8);
        }

        #[test]
        fn split_emulation_matches_direct_product(lengths in prop::collection::vec(0u64..200, 1..40), piece in 1u64..50, seed in any::<u64>()) {
            let indptr = indptr_from_lengths(&lengths);
            let nnz = *indptr.last().unwrap() as usize;
            let values: Vec<f64> = (0..nnz).map(|k| ((k as u64 ^ seed) % 17) as f64 - 8.0).collect();
            let x = |k: usize| ((k as u64).wrapping_mul(2654435761) % 11) as f64 - 5.0;
            let plan = RowSplitPlan::new(&indptr, piece).unwrap();
            let got = emulate(&indptr, &values, x, &plan);
            for r in 0..lengths.len() {
                let direct: f64 = (indptr[r]..indptr[r + 1]).map(|k| values[k as usize] * x(k as usize)).sum();
                prop_assert_eq!(got[r], direct);
            }
        }
    }

    #[test]
    fn default_piece_follows_mean_within_bounds() {
        assert_eq!(RowSplitPlan::default_piece_nnz(0, 0), MIN_PIECE_NNZ);
        assert_eq!(RowSplitPlan::default_piece_nnz(1000, 5000), MIN_PIECE_NNZ);
        assert_eq!(RowSplitPlan::default_piece_nnz(1000, 100_000), 800);
        assert_eq!(
            RowSplitPlan::default_piece_nnz(10, 10_000_000),
            MAX_PIECE_NNZ
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(RowSplitPlan::new(&[0, 5], 0).is_err());
        assert!(RowSplitPlan::new(&[], 4).is_err());
        assert!(RowSplitPlan::new(&[0, 5, 3], 4).is_err());
        let ok = validate_compressed("CSR", 2, 3, &[0, 1, 2], &[0, 2], &[1.0, 2.0]);
        assert!(ok.is_ok());
        /// Pointers, indices, values, and a piece of the expected message.
        type Case = (&'static [u64], &'static [u32], &'static [f32], &'static str);
        let cases: [Case; 5] = [
            (&[0, 1], &[0], &[1.0], "entries"),
            (&[1, 1, 2], &[0, 2], &[1.0, 2.0], "starts at 1"),
            (&[0, 2, 1], &[0, 2], &[1.0, 2.0], "decreases at 1"),
            (&[0, 1, 2], &[0, 2], &[1.0], "1 values"),
            (&[0, 1, 2], &[0, 3], &[1.0, 2.0], "index 3 at position 1"),
        ];
        for (ptr, idx, val, needle) in cases {
            let err = validate_compressed("CSR", 2, 3, ptr, idx, val)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err} lacks {needle}");
        }
    }
}
