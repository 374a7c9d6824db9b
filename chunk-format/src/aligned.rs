//! [`AlignedBuf`]: an owned, 64-byte-aligned byte buffer for reading a chunk without a memory map.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// One cache line; the buffer's unit of allocation, so the bytes start 64-byte aligned.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// An owned byte buffer whose start is 64-byte aligned (hence [`crate::BUFFER_ALIGN`]-aligned),
/// so a chunk read into it can be viewed with [`crate::ChunkView::parse`] without copying.
#[derive(Clone)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut buf = Self::zeroed(bytes.len());
        buf.as_bytes_mut().copy_from_slice(bytes);
        buf
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.lines)[..self.len]
    }

    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Line, u8>(&mut self.lines)[..self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads a whole file into an aligned buffer; errors name the file.
    #[cfg(feature = "std")]
    pub fn read_file(path: impl AsRef<std::path::Path>) -> Result<Self, crate::ChunkFileError> {
        use std::io::Read;
        let path = path.as_ref();
        let io_err = |action: &'static str| {
            move |source| crate::ChunkFileError::Io {
                action,
                path: path.to_path_buf(),
                source,
            }
        };
        let mut file = crate::open_regular(path).map_err(io_err("open"))?;
        let len = file.metadata().map_err(io_err("stat"))?.len();
        let len = usize::try_from(len).map_err(|_| crate::ChunkFileError::Io {
            action: "read",
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "file larger than the address space",
            ),
        })?;
        let mut buf = Self::zeroed(len);
        file.read_exact(buf.as_bytes_mut())
            .map_err(io_err("read"))?;
        Ok(buf)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl core::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_64_aligned_and_length_exact() {
        for len in [0usize, 1, 63, 64, 65, 1000] {
            #[allow(
                clippy::cast_possible_truncation,
                reason = "deliberate: a byte pattern that wraps"
            )]
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let buf = AlignedBuf::from_bytes(&bytes);
            assert_eq!(buf.as_bytes(), &bytes[..]);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_bytes().as_ptr() as usize % 64, 0);
        }
    }
}
