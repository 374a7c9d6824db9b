//! Large zeroed buffers on their own memory mapping, aligned for the kernels and advised for
//! transparent huge pages.

use core::fmt;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

use memmap2::MmapMut;

use super::Scalar;

/// Huge page size on x86-64 and aarch64 Linux; also the alignment of large buffers.
const HUGE_PAGE: usize = 2 << 20;

/// A zero-initialised buffer of `len` elements on its own anonymous memory mapping: page
/// aligned (so rows of 16 `f32` start on cache lines), 2 MiB aligned when at least 2 MiB, and
/// advised for transparent huge pages on Linux.
///
/// A sparse product gathers rows of X at random; with 4 KiB pages nearly every gather from a
/// large X misses the TLB, with 2 MiB pages few do. NumPy advises its large arrays the same
/// way, so benchmarks against NumPy-based peers should use this for X and Y. Use it as the
/// storage of a [`super::Dense`]: `Dense::from_row_major(PageBuffer::zeroed(n * f)?, n, f)`.
pub struct PageBuffer<T> {
    map: MmapMut,
    offset: usize,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T> fmt::Debug for PageBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageBuffer")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<T: Scalar> PageBuffer<T> {
    /// Maps `len` zeroed elements. Fails when the size overflows or the mapping fails (out of
    /// memory or address space). The huge-page advice is best effort: refused advice (an old
    /// kernel, THP disabled) still gives a working buffer of small pages.
    pub fn zeroed(len: usize) -> std::io::Result<Self> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| std::io::Error::other("buffer size overflows usize"))?;
        let slack = if bytes >= HUGE_PAGE { HUGE_PAGE } else { 0 };
        let map = MmapMut::map_anon(bytes.max(1) + slack)?;
        let offset = if slack > 0 {
            map.as_ptr().align_offset(HUGE_PAGE)
        } else {
            0
        };
        #[cfg(target_os = "linux")]
        if slack > 0 {
            // Best effort, see above.
            let _ = map.advise_range(memmap2::Advice::HugePage, offset, bytes);
        }
        Ok(PageBuffer {
            map,
            offset,
            len,
            _elements: PhantomData,
        })
    }
}

impl<T: Scalar> Deref for PageBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        let bytes = &self.map[self.offset..self.offset + self.len * size_of::<T>()];
        bytemuck::cast_slice(bytes)
    }
}

impl<T: Scalar> DerefMut for PageBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let range = self.offset..self.offset + self.len * size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.map[range])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::Dense;

    #[test]
    fn zeroed_aligned_and_writable() {
        for len in [0usize, 1, 17, 3 << 19] {
            let mut b = PageBuffer::<f32>::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0.0));
            assert_eq!(b.as_ptr() as usize % 4096, 0);
            if len * 4 >= HUGE_PAGE {
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            }
            b.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
            assert!(b.iter().enumerate().all(|(i, &v)| v == i as f32));
        }
        let m = Dense::from_row_major(PageBuffer::<f64>::zeroed(12).unwrap(), 3, 4).unwrap();
        assert_eq!(m.row(2), &[0.0; 4]);
    }
}
