//! What an operator holds its chunk by: a borrowed [`ChunkView`], or an owner of the mapped
//! file ([`MappedChunk`], and `Arc`/`Rc`/`Box`/`&` of any source), so that a holder that
//! outlives a stack frame (the C ABI's handles) owns the chunk instead of erasing a lifetime.

use std::rc::Rc;
use std::sync::Arc;

use chunk_format::{ChunkView, MappedChunk};

/// A chunk an operator can view whenever it runs.
///
/// # Safety
/// Every call of [`ChunkSource::chunk`] on one value returns a view of the same parsed bytes
/// for as long as the value lives: the operators derive index arrays from the view once and
/// view the chunk's blocks later without re-validating them against those arrays.
pub unsafe trait ChunkSource {
    /// The chunk.
    fn chunk(&self) -> ChunkView<'_>;

    /// The [`content_digest`](dist_comm::agree::content_digest) of the chunk checksums the
    /// chunk's directory lists for all parts, when it was loaded from one
    /// ([`RankChunk`](crate::RankChunk)): the operators' agreement checks that every rank's
    /// directory lists the same chunks and that they are the ones the ranks loaded. `None` for
    /// a chunk opened on its own (its checksum is still compared with the others' listings).
    fn listed(&self) -> Option<[u64; 2]> {
        None
    }
}

// SAFETY: a `ChunkView` is a copy of one parsed view; it never changes.
unsafe impl ChunkSource for ChunkView<'_> {
    fn chunk(&self) -> ChunkView<'_> {
        *self
    }
}

// SAFETY: a `MappedChunk` holds one read-only mapping and the view parsed from it, neither of
// which it replaces.
unsafe impl ChunkSource for MappedChunk {
    fn chunk(&self) -> ChunkView<'_> {
        *self.view()
    }
}

// SAFETY: the shared or borrowed source is the same value on every call.
unsafe impl<T: ChunkSource + ?Sized> ChunkSource for Arc<T> {
    fn chunk(&self) -> ChunkView<'_> {
        (**self).chunk()
    }
    fn listed(&self) -> Option<[u64; 2]> {
        (**self).listed()
    }
}

// SAFETY: as for `Arc`.
unsafe impl<T: ChunkSource + ?Sized> ChunkSource for Rc<T> {
    fn chunk(&self) -> ChunkView<'_> {
        (**self).chunk()
    }
    fn listed(&self) -> Option<[u64; 2]> {
        (**self).listed()
    }
}

// SAFETY: as for `Arc`.
unsafe impl<T: ChunkSource + ?Sized> ChunkSource for Box<T> {
    fn chunk(&self) -> ChunkView<'_> {
        (**self).chunk()
    }
    fn listed(&self) -> Option<[u64; 2]> {
        (**self).listed()
    }
}

// SAFETY: as for `Arc`.
unsafe impl<T: ChunkSource + ?Sized> ChunkSource for &T {
    fn chunk(&self) -> ChunkView<'_> {
        (**self).chunk()
    }
    fn listed(&self) -> Option<[u64; 2]> {
        (**self).listed()
    }
}
