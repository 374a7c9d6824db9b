//! Node features: a dense row-major `num_nodes × dim` matrix of `f32`, held in memory or
//! mapped from the input file.
//!
//! Features are usually the largest array of a graph (ogbn-papers100M: 111 M × 128 `f32`,
//! 57 GB), so the readers map them instead of copying them whenever the file stores them as
//! they are in memory — little-endian `f32`, C order, uncompressed, at a 4-byte aligned offset:
//! an `x.npy` in a directory of `.npy` files (NumPy aligns the data of a `.npy` to 64 bytes),
//! or an uncompressed `x.npy` member of an `.npz` that happens to be aligned (every `.npz`
//! [`super::npz::write_npz`] writes; `np.savez` archives when the offset allows). A mapped
//! matrix reads through the page cache, so a graph whose features do not fit in memory twice
//! still loads and the chunks copy their rows from the file. Writing to the matrix
//! ([`FeatureData`]'s `DerefMut`, e.g. row normalisation) first copies it into memory.
//!
//! A mapped file that another process truncates or rewrites while it is read does not crash
//! the reader (`super::mapped_input`: the lost pages read as zeros); [`Features::check_unchanged`]
//! reports it, and whoever commits what it made of the features (the chunk writer) calls it
//! first.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;
use std::vec::Vec;

use super::mapped_input::MappedInput;
use super::GraphError;

/// Dense node features, row-major `num_nodes × dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct Features {
    /// Feature columns per node.
    pub dim: usize,
    /// `num_nodes · dim` values; node i's features are `data[i·dim .. (i+1)·dim]`.
    pub data: FeatureData,
}

impl Features {
    /// A feature matrix held in memory.
    pub fn new(dim: usize, data: Vec<f32>) -> Self {
        Features {
            dim,
            data: data.into(),
        }
    }

    /// Node `i`'s feature row.
    ///
    /// # Panics
    /// If `i` is not a node of the matrix.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// An error ([`super::GraphErrorKind::InputChanged`], naming the file) if the features are
    /// mapped from a file that changed since it was mapped: what was read from it may be
    /// zeros or a mix of two versions. Always fine for features held in memory.
    pub fn check_unchanged(&self) -> Result<(), GraphError> {
        self.data.check_unchanged()
    }
}

/// The values of a [`Features`] matrix: a `Vec<f32>`, or `f32`s mapped read-only from a file.
/// Reads as a slice either way; the first mutable access copies a mapped matrix into memory.
#[derive(Clone, Default)]
pub struct FeatureData(Repr);

#[derive(Clone)]
enum Repr {
    Owned(Vec<f32>),
    Mapped {
        map: Arc<MappedInput>,
        /// Byte offset of the first value in the mapping (a multiple of 4).
        offset: usize,
        /// Number of values.
        len: usize,
    },
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Owned(Vec::new())
    }
}

impl FeatureData {
    /// Maps `len` little-endian `f32`s starting at byte `offset` of `file` (the input at
    /// `path`). `Ok(None)` when they cannot be used in place — a big-endian machine, an offset
    /// that is not 4-byte aligned, a file too short, or no room to guard another mapping — and
    /// the caller reads them by copying.
    ///
    /// A change of the file while the matrix is alive reads as zeros where the file shrank and
    /// is reported by [`FeatureData::check_unchanged`].
    pub(crate) fn map(
        file: &File,
        path: &Path,
        offset: u64,
        len: usize,
    ) -> io::Result<Option<Self>> {
        if cfg!(target_endian = "big") || !offset.is_multiple_of(4) {
            return Ok(None);
        }
        let Ok(offset) = usize::try_from(offset) else {
            return Ok(None);
        };
        let end = len.checked_mul(4).and_then(|b| b.checked_add(offset));
        let Some(map) = MappedInput::map(file, path)? else {
            return Ok(None);
        };
        if end.is_none_or(|end| end > map.bytes().len()) {
            return Ok(None);
        }
        Ok(Some(FeatureData(Repr::Mapped {
            map: Arc::new(map),
            offset,
            len,
        })))
    }

    /// Whether the values are mapped from a file rather than held in memory.
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Repr::Mapped { .. })
    }

    /// See [`Features::check_unchanged`].
    pub fn check_unchanged(&self) -> Result<(), GraphError> {
        match &self.0 {
            Repr::Owned(_) => Ok(()),
            Repr::Mapped { map, .. } => map.check(),
        }
    }

    /// The file the values are mapped from, if they are.
    pub fn mapped_from(&self) -> Option<&Path> {
        match &self.0 {
            Repr::Owned(_) => None,
            Repr::Mapped { map, .. } => Some(map.path()),
        }
    }

    /// The values as a `Vec` (a copy if they are mapped).
    pub fn into_vec(self) -> Vec<f32> {
        match self.0 {
            Repr::Owned(v) => v,
            Repr::Mapped { .. } => self.to_vec(),
        }
    }
}

impl From<Vec<f32>> for FeatureData {
    fn from(v: Vec<f32>) -> Self {
        FeatureData(Repr::Owned(v))
    }
}

impl Deref for FeatureData {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.0 {
            Repr::Owned(v) => v,
            Repr::Mapped { map, offset, len } => {
                // `map` checked that `offset + 4·len` lies inside the mapping and that `offset`
                // is a multiple of 4 (the mapping itself starts on a page), so the cast cannot
                // fail; every bit pattern is an f32.
                bytemuck::cast_slice(&map.bytes()[*offset..*offset + 4 * *len])
            }
        }
    }
}

impl DerefMut for FeatureData {
    fn deref_mut(&mut self) -> &mut [f32] {
        if let Repr::Mapped { .. } = self.0 {
            self.0 = Repr::Owned(self.to_vec());
        }
        match &mut self.0 {
            Repr::Owned(v) => v,
            Repr::Mapped { .. } => unreachable!("copied into memory above"),
        }
    }
}

impl PartialEq for FeatureData {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for FeatureData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        <[f32] as fmt::Debug>::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::vec;

    fn file_with(prefix: usize, values: &[f32]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; prefix]).unwrap();
        for v in values {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        f
    }

    #[test]
    fn maps_aligned_values_and_copies_on_write() {
        let values = [1.5f32, -2.0, 3.25, 0.0, 1e-3];
        let file = file_with(64, &values);
        let mut data = FeatureData::map(&file, Path::new("x.npy"), 64, values.len())
            .unwrap()
            .expect("aligned");
        assert!(data.is_mapped());
        assert_eq!(&data[..], &values);
        assert_eq!(data, FeatureData::from(values.to_vec()));
        let copy = data.clone();
        data[1] = 9.0;
        assert!(!data.is_mapped(), "a write copies the values into memory");
        assert!(copy.is_mapped(), "a clone keeps its own view");
        assert_eq!(&copy[..], &values, "the file is not written");
        assert_eq!(data.into_vec(), vec![1.5, 9.0, 3.25, 0.0, 1e-3]);
    }

    #[test]
    fn unaligned_or_short_data_is_left_to_the_copying_reader() {
        let values = [1.0f32, 2.0];
        let file = file_with(6, &values);
        assert!(FeatureData::map(&file, Path::new("x.npy"), 6, 2)
            .unwrap()
            .is_none());
        let file = file_with(8, &values);
        assert!(
            FeatureData::map(&file, Path::new("x.npy"), 8, 3)
                .unwrap()
                .is_none(),
            "past the end"
        );
        assert!(FeatureData::map(&file, Path::new("x.npy"), 8, usize::MAX)
            .unwrap()
            .is_none());
        assert!(FeatureData::map(&file, Path::new("x.npy"), 8, 2)
            .unwrap()
            .is_some());
    }
}
