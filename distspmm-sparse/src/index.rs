//! The workspace's two justified narrowing conversions of indices (docs/design.md, "Index
//! types"): an offset into memory as a position, and an index below a u32-checked count as a
//! u32 id. Both are plain casts that cannot truncate under the contract in their docs, which
//! every caller meets; values read from input are converted with `try_from` and a typed error
//! instead.

/// An entry of an offset array — `indptr`, `xadj`, part, halo and block offsets, a chunk's
/// validated offsets — as a position in the array it indexes. Every such array is checked when
/// it is built or parsed to end at (at most) the length of that array, which lies in memory, so
/// its entries fit `usize`. Also a node id or count read as u64 and checked to be at most
/// `graph::MAX_NODES` (u32::MAX).
#[allow(
    clippy::cast_possible_truncation,
    reason = "an offset is at most the length of an in-memory array, which is a usize"
)]
#[inline(always)]
pub const fn offset(x: u64) -> usize {
    x as usize
}

/// A node id, local row or compacted column given as an index below a count that was checked to
/// fit u32 ids: a graph's nodes (at most `graph::MAX_NODES`, checked when it
/// is made or read), a matrix's inner dimension (at most `u32::MAX + 1`, checked by the
/// compressed matrices' constructors), a part's rows and a block's columns (checked when the
/// chunk is built).
#[allow(
    clippy::cast_possible_truncation,
    reason = "the index is below a count that was checked to fit u32 ids"
)]
#[inline(always)]
pub const fn id(i: usize) -> u32 {
    i as u32
}
