//! Building compressed arrays from unordered entries: a counting sort by outer index, then a
//! sort and duplicate merge within each (short) outer index, in parallel under `std`.

use crate::index;
use alloc::vec::Vec;
use core::ops::Range;

use super::par::{for_each_block, grain_for, range_tasks, split_lengths, SplitRows};
use super::Scalar;

/// Entries `(outer, inner, value)` that can be visited twice (count, then place).
pub trait TripletSource<T> {
    /// The number of entries [`TripletSource::for_each`] yields.
    fn len(&self) -> usize;
    /// Whether it yields no entries.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Calls `f(outer, inner, value)` for every entry, always in the same order. Every `outer`
    /// must be below the `outer` dimension passed to [`assemble`].
    fn for_each(&self, f: impl FnMut(u32, u32, T));
}

/// Triplets held in three slices of equal length.
pub struct SliceTriplets<'a, T> {
    pub outer: &'a [u32],
    pub inner: &'a [u32],
    pub values: &'a [T],
}

impl<T: Copy> TripletSource<T> for SliceTriplets<'_, T> {
    fn len(&self) -> usize {
        self.outer.len()
    }

    fn for_each(&self, mut f: impl FnMut(u32, u32, T)) {
        for ((&o, &i), &v) in self.outer.iter().zip(self.inner).zip(self.values) {
            f(o, i, v);
        }
    }
}

/// Entries of a block of outer indices plus the merged length of each outer index.
struct Block<'a, T> {
    entries: &'a mut [(u32, T)],
    merged: &'a mut [u64],
}

impl<T: Send> SplitRows for Block<'_, T> {
    fn split_rows(self, indptr: &[u64], rows: &Range<usize>, mid: usize) -> (Self, Self) {
        let cut = index::offset(indptr[mid] - indptr[rows.start]);
        let (e1, e2) = self.entries.split_at_mut(cut);
        let (m1, m2) = self.merged.split_at_mut(mid - rows.start);
        (
            Block {
                entries: e1,
                merged: m1,
            },
            Block {
                entries: e2,
                merged: m2,
            },
        )
    }
}

/// Sorts each outer index's entries by inner index (stable: duplicates keep input order),
/// sums duplicates in place and records how many entries remain.
fn sort_and_merge<T: Scalar>(indptr: &[u64], rows: Range<usize>, block: Block<'_, T>) {
    let base = indptr[rows.start];
    for (r, merged) in rows.zip(block.merged.iter_mut()) {
        let (s, e) = (
            index::offset(indptr[r] - base),
            index::offset(indptr[r + 1] - base),
        );
        let seg = &mut block.entries[s..e];
        seg.sort_by_key(|&(j, _)| j);
        let mut len = 0usize;
        for k in 0..seg.len() {
            if len > 0 && seg[len - 1].0 == seg[k].0 {
                let v = seg[k].1;
                seg[len - 1].1 += v;
            } else {
                seg[len] = seg[k];
                len += 1;
            }
        }
        *merged = len as u64;
    }
}

/// An array [`assemble`] needs could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocFailed {
    /// Bytes of the array refused (saturating).
    pub bytes: u64,
}

/// The compressed arrays `(indptr, indices, data)`.
pub type Arrays<T> = (Vec<u64>, Vec<u32>, Vec<T>);

/// `len` copies of `value`, allocated fallibly.
fn filled<T: Clone>(len: usize, value: T) -> Result<Vec<T>, AllocFailed> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| AllocFailed {
        bytes: (len as u64).saturating_mul(size_of::<T>() as u64),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// Runs `f(task, state)` for every state, in parallel under `std`.
fn for_each_task<S: Send>(states: Vec<S>, f: impl Fn(usize, S) + Sync) {
    #[cfg(feature = "std")]
    {
        use rayon::prelude::*;
        states
            .into_par_iter()
            .enumerate()
            .for_each(|(t, state)| f(t, state));
    }
    #[cfg(not(feature = "std"))]
    for (t, state) in states.into_iter().enumerate() {
        f(t, state);
    }
}

/// The compressed arrays `(indptr, indices, data)` of `outer` outer indices holding the entries
/// of `source`, sorted within each outer index, duplicates summed in input order.
///
/// Time O(nnz + outer) plus the per-row sorts. Counting and placing run as one task per thread,
/// each owning a contiguous range of outer indices and visiting every entry in order (so each
/// outer index's entries keep the input order whatever the thread count; the visits are
/// sequential reads, the writes random, and each task writes only its own range). Memory: the
/// entries once as pairs, then once in the output arrays, every array allocated fallibly (a
/// refused one is [`AllocFailed`]).
pub fn assemble<T: Scalar>(
    outer: usize,
    source: &(impl TripletSource<T> + Sync),
) -> Result<Arrays<T>, AllocFailed> {
    let tasks = range_tasks(outer);
    let bounds: Vec<usize> = (0..=tasks).map(|t| outer * t / tasks).collect();
    let mut indptr = filled(outer.saturating_add(1), 0u64)?;
    let counts = split_lengths(&mut indptr[1..], bounds.windows(2).map(|w| w[1] - w[0]));
    for_each_task(counts, |t, counts| {
        let range = bounds[t]..bounds[t + 1];
        source.for_each(|o, _, _| {
            if range.contains(&(o as usize)) {
                counts[o as usize - range.start] += 1;
            }
        });
    });
    for o in 0..outer {
        indptr[o + 1] += indptr[o];
    }
    let mut cursor = filled(outer, 0u64)?;
    cursor.copy_from_slice(&indptr[..outer]);
    let mut entries = filled(source.len(), (0u32, T::ZERO))?;
    let lengths = bounds
        .windows(2)
        .map(|w| index::offset(indptr[w[1]] - indptr[w[0]]));
    let places: Vec<_> = split_lengths(&mut entries, lengths)
        .into_iter()
        .zip(split_lengths(
            &mut cursor,
            bounds.windows(2).map(|w| w[1] - w[0]),
        ))
        .collect();
    for_each_task(places, |t, (entries, cursor)| {
        let range = bounds[t]..bounds[t + 1];
        let base = indptr[range.start];
        source.for_each(|o, i, v| {
            if range.contains(&(o as usize)) {
                let c = &mut cursor[o as usize - range.start];
                entries[index::offset(*c - base)] = (i, v);
                *c += 1;
            }
        });
    });
    drop(cursor);

    let mut merged = filled(outer, 0u64)?;
    for_each_block(
        &indptr,
        0..outer,
        4,
        grain_for(indptr[outer] + 4 * outer as u64, 1 << 16),
        Block {
            entries: &mut entries,
            merged: &mut merged,
        },
        &|rows, block| sort_and_merge(&indptr, rows, block),
    );

    // The merged layout (each outer index keeps its first `merged` entries), written out in
    // parallel straight into the output arrays.
    let mut out_ptr = filled(outer.saturating_add(1), 0u64)?;
    for o in 0..outer {
        out_ptr[o + 1] = out_ptr[o] + merged[o];
    }
    drop(merged);
    let write = index::offset(out_ptr[outer]);
    let mut indices = filled(write, 0u32)?;
    let mut data = filled(write, T::ZERO)?;
    for_each_block(
        &out_ptr,
        0..outer,
        1,
        grain_for(write as u64 + outer as u64, 1 << 16),
        Output {
            indices: &mut indices,
            data: &mut data,
        },
        &|rows, out| {
            let base = out_ptr[rows.start];
            for o in rows {
                let from = index::offset(indptr[o]);
                let to = index::offset(out_ptr[o] - base);
                let len = index::offset(out_ptr[o + 1] - out_ptr[o]);
                for (k, &(j, v)) in entries[from..from + len].iter().enumerate() {
                    out.indices[to + k] = j;
                    out.data[to + k] = v;
                }
            }
        },
    );
    drop(entries);
    Ok((out_ptr, indices, data))
}

/// The output arrays of a block of outer indices.
struct Output<'a, T> {
    indices: &'a mut [u32],
    data: &'a mut [T],
}

impl<T: Send> SplitRows for Output<'_, T> {
    fn split_rows(self, indptr: &[u64], rows: &Range<usize>, mid: usize) -> (Self, Self) {
        let cut = index::offset(indptr[mid] - indptr[rows.start]);
        let (i1, i2) = self.indices.split_at_mut(cut);
        let (d1, d2) = self.data.split_at_mut(cut);
        (
            Output {
                indices: i1,
                data: d1,
            },
            Output {
                indices: i2,
                data: d2,
            },
        )
    }
}
