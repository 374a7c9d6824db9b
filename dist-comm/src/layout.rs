//! Counts and displacements of a variable-size all-to-all.

use core::ops::Range;

use crate::CommError;

/// Where each rank's block lies in an all-to-all buffer: block `r` is
/// `buf[displs[r] .. displs[r] + counts[r]]` (in elements).
///
/// Built once per plan and reused for every call. A receive layout's blocks must not overlap
/// (checked by [`crate::AllToAllV::all_to_all_v`]); a send layout's may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLayout {
    counts: Vec<usize>,
    displs: Vec<usize>,
    extent: usize,
    disjoint: bool,
}

impl BlockLayout {
    /// Blocks packed back to back in rank order: `displs` are the exclusive prefix sums of `counts`.
    pub fn packed(counts: impl Into<Vec<usize>>) -> Self {
        let counts = counts.into();
        let mut displs = Vec::with_capacity(counts.len());
        let mut at = 0usize;
        for &c in &counts {
            displs.push(at);
            at += c;
        }
        Self {
            counts,
            displs,
            extent: at,
            disjoint: true,
        }
    }

    /// Blocks at explicit displacements.
    ///
    /// # Errors
    /// [`CommError::InvalidLayout`] when the two vectors differ in length or a block's end
    /// overflows `usize`.
    pub fn new(counts: Vec<usize>, displs: Vec<usize>) -> Result<Self, CommError> {
        if counts.len() != displs.len() {
            return Err(CommError::InvalidLayout(format!(
                "{} counts but {} displacements",
                counts.len(),
                displs.len()
            )));
        }
        let mut extent = 0usize;
        let mut blocks = Vec::with_capacity(counts.len());
        for (r, (&c, &d)) in counts.iter().zip(&displs).enumerate() {
            let end = d.checked_add(c).ok_or_else(|| {
                CommError::InvalidLayout(format!(
                    "block {r}: displacement {d} + count {c} overflows"
                ))
            })?;
            extent = extent.max(end);
            if c > 0 {
                blocks.push((d, end));
            }
        }
        blocks.sort_unstable();
        let disjoint = blocks.windows(2).all(|w| w[0].1 <= w[1].0);
        Ok(Self {
            counts,
            displs,
            extent,
            disjoint,
        })
    }

    /// Number of blocks (must equal the group size when used).
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Elements in each block.
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// Offset of each block.
    pub fn displs(&self) -> &[usize] {
        &self.displs
    }

    /// The element range of block `r`.
    ///
    /// # Panics
    /// When `r >= self.len()`.
    pub fn block(&self, r: usize) -> Range<usize> {
        self.displs[r]..self.displs[r] + self.counts[r]
    }

    /// The smallest buffer length that holds every block.
    pub fn extent(&self) -> usize {
        self.extent
    }

    /// Total elements over all blocks.
    pub fn total(&self) -> usize {
        self.counts.iter().sum()
    }

    /// Whether no two non-empty blocks overlap.
    pub fn is_disjoint(&self) -> bool {
        self.disjoint
    }

    /// Checks this layout against a group size and a buffer length.
    pub(crate) fn check(
        &self,
        what: &'static str,
        size: usize,
        buf_len: usize,
        writes: bool,
    ) -> Result<(), CommError> {
        if self.len() != size {
            return Err(CommError::InvalidLayout(format!(
                "{what} layout has {} blocks for a group of {size} ranks",
                self.len()
            )));
        }
        if self.extent > buf_len {
            return Err(CommError::BufferSize {
                what,
                expected: self.extent,
                actual: buf_len,
            });
        }
        if writes && !self.disjoint {
            return Err(CommError::InvalidLayout(format!(
                "{what} layout has overlapping blocks"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_prefix_sums() {
        let l = BlockLayout::packed(vec![2, 0, 3]);
        assert_eq!(l.displs(), &[0, 2, 2]);
        assert_eq!(l.extent(), 5);
        assert_eq!(l.total(), 5);
        assert_eq!(l.block(2), 2..5);
        assert!(l.is_disjoint());
    }

    #[test]
    fn explicit_overlap_and_errors() {
        let l = BlockLayout::new(vec![2, 2], vec![0, 1]).expect("valid");
        assert!(!l.is_disjoint());
        assert_eq!(l.extent(), 3);
        assert!(l.check("recv", 2, 3, true).is_err());
        assert!(l.check("send", 2, 3, false).is_ok());
        assert!(l.check("send", 2, 2, false).is_err());
        assert!(l.check("send", 3, 3, false).is_err());
        // Empty blocks never overlap anything.
        let l = BlockLayout::new(vec![0, 2], vec![1, 0]).expect("valid");
        assert!(l.is_disjoint());
        assert!(BlockLayout::new(vec![1], vec![]).is_err());
        assert!(BlockLayout::new(vec![2], vec![usize::MAX]).is_err());
    }
}
