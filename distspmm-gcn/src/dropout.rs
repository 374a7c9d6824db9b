//! Counter-based dropout masks: whether entry (node, column) of layer `l`'s input is kept at
//! epoch `e` is a pure function of (seed, epoch, layer, original node id, column). The masks are
//! therefore the same on any number of ranks, under either parallel mode (a rank holding a
//! slice of the columns draws exactly those columns' decisions), and on resume.
//!
//! Cost: one SplitMix64 per row gives the row's two 32-bit keys `(mul, add)`, with `mul` odd;
//! entry `c` then hashes the counter `c · mul + add` with Wellons' `lowbias32` (two 32-bit
//! multiplies, three shift-xors) and keeps the entry when the top 24 bits of the hash are at
//! least `p · 2²⁴`. Every step is a lane-wise 32-bit integer operation, so a row is processed 16
//! entries at a time with AVX-512 (8 with AVX2), chosen at run time; the integer arithmetic is
//! exact, so every instruction set gives bit-identical masks, and the kept values are one
//! multiply by `1 / (1 − p)` either way.
//!
//! The row's odd multiplier keeps the counters of different rows from being shifted copies of
//! one another (with `c + key` two rows whose keys differ by less than the width would share
//! most of their decisions).
//!
//! Attention dropout ([`EdgeKey`]) drops per-edge values instead: whether head `h` of the edge
//! `src → dst` of layer `l` is kept at epoch `e` is a pure function of (seed, epoch, layer,
//! original ids of `dst` and `src`, head), so it too is the same on any number of ranks. The
//! layer's edge key is its row key's seed hashed once more with a constant (independent of the
//! input dropout's decisions); one SplitMix64 of the destination and one of the source give the
//! edge's two 32-bit keys, and the head takes the column's place in the draw above.

use rayon::prelude::*;
use std::ops::Range;

/// Inverted dropout keyed by (seed, epoch, layer): see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutKey {
    /// Seed of the run.
    pub seed: u64,
    /// Epoch (0-based).
    pub epoch: u64,
    /// Layer whose input is dropped.
    pub layer: usize,
    /// Drop probability in `[0, 1)`; 0 keeps everything unscaled.
    pub p: f32,
}

/// The part of a [`DropoutKey`] that belongs to one node: everything needed to decide its
/// entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowKey {
    mul: u32,
    add: u32,
    /// Entries whose 24-bit draw is below this are dropped; 0 keeps all.
    threshold: u32,
    /// `1 / (1 − p)` as f32 bits (kept `Eq` derivable).
    scale_bits: u32,
}

impl DropoutKey {
    /// `1 / (1 − p)`, the factor of kept entries (1 when `p = 0`).
    pub fn scale(&self) -> f32 {
        if self.p == 0.0 {
            1.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }

    /// The drop threshold on 24 random bits, as an f32 uniform would have it.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "p < 1, so the product is below 2^24"
    )]
    fn threshold(&self) -> u32 {
        (f64::from(self.p) * f64::from(1u32 << 24)) as u32
    }

    /// The key of node `id` (its original id).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "deliberate: the two halves of a 64-bit hash"
    )]
    pub fn row(&self, id: u64) -> RowKey {
        let k = splitmix64(self.base() ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        RowKey {
            mul: (k as u32) | 1,
            add: (k >> 32) as u32,
            threshold: self.threshold(),
            scale_bits: self.scale().to_bits(),
        }
    }

    /// The hash of (seed, epoch, layer) every node's and edge's key starts from.
    fn base(&self) -> u64 {
        splitmix64(
            self.seed ^ splitmix64(self.epoch.wrapping_mul(0x1000_0000_01B3) ^ (self.layer as u64)),
        )
    }

    /// The attention-dropout key of this layer and epoch, with this key's probability.
    pub fn edges(&self) -> EdgeKey {
        EdgeKey {
            base: splitmix64(self.base() ^ EDGE_DOMAIN),
            threshold: self.threshold(),
            scale_bits: self.scale().to_bits(),
        }
    }

    /// Writes columns `cols` of the `ids.len() × width` row-major `src` to `dst`
    /// (`ids.len() × cols.len()`), dropped and rescaled; rows run in parallel on the current
    /// rayon pool.
    ///
    /// # Panics
    /// If `src` or `dst` is shorter than its shape or `cols` is not inside `0..width`: a
    /// programming error of the caller (the trainer wires fixed shapes).
    pub fn apply(
        &self,
        ids: &[u64],
        src: &[f32],
        width: usize,
        cols: Range<usize>,
        dst: &mut [f32],
    ) {
        let w = cols.len();
        if w == 0 || ids.is_empty() {
            return;
        }
        assert!(cols.end <= width, "dropout: columns outside the row");
        let rows = ids.len();
        let (src, dst) = (&src[..rows * width], &mut dst[..rows * w]);
        // Each entry's decision is its own: any cut of the rows gives the same output.
        let task = super::par::task_rows(rows, w);
        dst.par_chunks_mut(task * w)
            .zip(src.par_chunks(task * width))
            .zip(ids.par_chunks(task))
            .for_each(|((d, s), ids)| {
                for ((d, s), &id) in d.chunks_exact_mut(w).zip(s.chunks_exact(width)).zip(ids) {
                    self.row(id).apply(cols.start, &s[cols.clone()], d);
                }
            });
    }
}

impl RowKey {
    /// Whether entry `col` of this row is kept: the scalar definition every vector path
    /// reproduces exactly (the tests hold them to it).
    #[cfg(test)]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a column below the feature width, a u32"
    )]
    pub fn keeps(&self, col: usize) -> bool {
        draw(self.mul, self.add, col as u32) >= self.threshold
    }

    /// The factor of kept entries.
    pub fn scale(&self) -> f32 {
        f32::from_bits(self.scale_bits)
    }

    /// `dst[j] = src[j] · scale` if column `first_col + j` is kept, else 0.
    ///
    /// # Panics
    /// If the two slices differ in length.
    pub fn apply(&self, first_col: usize, src: &[f32], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "dropout: row lengths differ");
        self.run(Cols::From(first_col), src, dst);
    }

    /// `dst[j] = src[j] · scale` if column `cols[j]` is kept, else 0: [`RowKey::apply`] for the
    /// stored entries of a sparse row (their columns listed), with the same decisions and values.
    ///
    /// # Panics
    /// If the three slices differ in length.
    pub fn apply_at(&self, cols: &[u32], src: &[f32], dst: &mut [f32]) {
        assert!(
            cols.len() == src.len() && src.len() == dst.len(),
            "dropout: row lengths differ"
        );
        self.run(Cols::At(cols), src, dst);
    }

    /// Both of the above, on the widest instruction set this CPU has.
    fn run(&self, cols: Cols<'_>, src: &[f32], dst: &mut [f32]) {
        if self.threshold == 0 {
            let s = self.scale();
            dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v * s);
            return;
        }
        match isa() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                // SAFETY: `isa()` returned Avx512 only after detecting AVX-512F on this CPU.
                unsafe { x86::apply_avx512(self, cols, src, dst) }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: `isa()` returned Avx2 only after detecting AVX2 on this CPU.
                unsafe { x86::apply_avx2(self, cols, src, dst) }
            }
            Isa::Portable => apply_body(self, cols, src, dst),
        }
    }
}

/// Separates a layer's edge keys from its row keys (the fractional bits of √2).
const EDGE_DOMAIN: u64 = 0x6A09_E667_F3BC_C908;

/// Inverted dropout of per-edge, per-head values (attention dropout), keyed by (seed, epoch,
/// layer) through [`DropoutKey::edges`] and decided per (destination id, source id, head): see
/// the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeKey {
    base: u64,
    /// Draws below this are dropped; 0 keeps all.
    threshold: u32,
    /// `1 / (1 − p)` as f32 bits.
    scale_bits: u32,
}

impl EdgeKey {
    /// The keys of the edge `src → dst` (original ids), its heads in the columns' place.
    fn pair(&self, dst: u64, src: u64) -> (u32, u32) {
        Self::pair_of(self.destination(dst), src)
    }

    /// The destination's half of its edges' keys.
    fn destination(&self, dst: u64) -> u64 {
        splitmix64(self.base ^ dst.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The keys of the edge from `src` into the destination whose half is `d`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "deliberate: the two halves of a 64-bit hash"
    )]
    fn pair_of(d: u64, src: u64) -> (u32, u32) {
        let k = splitmix64(d ^ src.wrapping_mul(0xD1B5_4A32_D192_ED03));
        ((k as u32) | 1, (k >> 32) as u32)
    }

    /// Whether head `head` of the edge `src → dst` (original ids) is kept.
    #[allow(clippy::cast_possible_truncation, reason = "a head index, a u32")]
    pub fn keeps(&self, dst: u64, src: u64, head: usize) -> bool {
        let (mul, add) = self.pair(dst, src);
        draw(mul, add, head as u32) >= self.threshold
    }

    /// The factor of kept values.
    pub fn scale(&self) -> f32 {
        f32::from_bits(self.scale_bits)
    }

    /// Drops and rescales, in place, head-major per-edge values: `values` holds one run of
    /// `ends.len()` values per head, position `k` of each run being the edge `ends[k] = (dst,
    /// src)`; a kept value is multiplied by [`EdgeKey::scale`], a dropped one becomes 0. Edges
    /// run in parallel on the current rayon pool, each edge's keys derived once for all heads, each head's decisions
    /// made lane by lane on the widest instruction set this CPU has (the same bits on every one).
    ///
    /// # Panics
    /// If `values.len()` is not a multiple of `ends.len()` (the caller wires fixed shapes).
    pub fn apply_in_place(&self, ends: &[(u64, u64)], values: &mut [f32]) {
        let edges = ends.len();
        if edges == 0 || self.threshold == 0 {
            return;
        }
        assert!(
            values.len().is_multiple_of(edges),
            "attention dropout: values are not whole runs of the edges"
        );
        let heads = values.len() / edges;
        let task = super::par::task_rows(edges, heads);
        // Task t takes edges [t·task, (t+1)·task) of every head's run.
        let mut tasks: Vec<Vec<&mut [f32]>> = (0..edges.div_ceil(task))
            .map(|_| Vec::with_capacity(heads))
            .collect();
        for run in values.chunks_exact_mut(edges) {
            for (t, part) in tasks.iter_mut().zip(run.chunks_mut(task)) {
                t.push(part);
            }
        }
        let isa = isa();
        tasks
            .into_par_iter()
            .zip(ends.par_chunks(task))
            .for_each(|(mut runs, ends)| match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => {
                    // SAFETY: `isa()` returned Avx512 only after detecting AVX-512F on this CPU.
                    unsafe { x86::edges_avx512(self, ends, &mut runs) }
                }
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => {
                    // SAFETY: `isa()` returned Avx2 only after detecting AVX2 on this CPU.
                    unsafe { x86::edges_avx2(self, ends, &mut runs) }
                }
                Isa::Portable => self.apply_runs(ends, &mut runs),
            });
    }

    /// One task's edges `ends`, `runs[h]` being their values of head `h`: tiles of edges
    /// derive their keys first (the destination's half once per run of equal destinations, as
    /// the layout stores a row's edges together), then each head's values are decided and
    /// scaled in one branch-free, lane-wise loop over the tile.
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation, reason = "a head index, a u32")]
    fn apply_runs(&self, ends: &[(u64, u64)], runs: &mut [&mut [f32]]) {
        const TILE: usize = 64;
        let (mut mul, mut add) = ([0u32; TILE], [0u32; TILE]);
        let scale = self.scale();
        let mut last: Option<(u64, u64)> = None;
        for (t, tile) in ends.chunks(TILE).enumerate() {
            for ((&(dst, src), m), a) in tile.iter().zip(&mut mul).zip(&mut add) {
                let d = match last {
                    Some((id, d)) if id == dst => d,
                    _ => {
                        let d = self.destination(dst);
                        last = Some((dst, d));
                        d
                    }
                };
                (*m, *a) = Self::pair_of(d, src);
            }
            let at = t * TILE..t * TILE + tile.len();
            for (h, run) in runs.iter_mut().enumerate() {
                let keys = mul.iter().zip(&add);
                for (v, (&m, &a)) in run[at.clone()].iter_mut().zip(keys) {
                    let keep = draw(m, a, h as u32) >= self.threshold;
                    *v = if keep { *v * scale } else { 0.0 };
                }
            }
        }
    }
}

/// The columns of a row's entries: consecutive from a first column, or listed (the stored
/// entries of a sparse row).
#[derive(Debug, Clone, Copy)]
enum Cols<'a> {
    From(usize),
    At(&'a [u32]),
}

/// The 24-bit draw of column `col` of the row with keys `(mul, add)`.
#[inline(always)]
fn draw(mul: u32, add: u32, col: u32) -> u32 {
    lowbias32(col.wrapping_mul(mul).wrapping_add(add)) >> 8
}

/// Chris Wellons' `lowbias32` integer hash (hash-prospector), a bijection on u32.
#[inline(always)]
fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The loop every instruction set compiles: branch-free, lane-wise, so LLVM vectorises it at
/// the width the enclosing function's target features allow (listed columns are loaded as a
/// vector like the values: no gather).
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "columns are below the feature width, a u32 (the chunk's feature_dim)"
)]
fn apply_body(key: &RowKey, cols: Cols<'_>, src: &[f32], dst: &mut [f32]) {
    // A function, not a closure, so that it is compiled with the caller's target features.
    #[inline(always)]
    fn one(key: &RowKey, scale: f32, s: f32, c: u32) -> f32 {
        let keep = draw(key.mul, key.add, c) >= key.threshold;
        if keep {
            s * scale
        } else {
            0.0
        }
    }
    let scale = key.scale();
    match cols {
        Cols::From(first_col) => {
            let first = first_col as u32;
            for (j, (d, &s)) in dst.iter_mut().zip(src).enumerate() {
                *d = one(key, scale, s, first.wrapping_add(j as u32));
            }
        }
        Cols::At(cols) => {
            for ((d, &s), &c) in dst.iter_mut().zip(src).zip(cols) {
                *d = one(key, scale, s, c);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{apply_body, Cols, EdgeKey, RowKey};

    #[target_feature(enable = "avx512f")]
    pub(super) fn apply_avx512(key: &RowKey, cols: Cols<'_>, src: &[f32], dst: &mut [f32]) {
        apply_body(key, cols, src, dst);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn apply_avx2(key: &RowKey, cols: Cols<'_>, src: &[f32], dst: &mut [f32]) {
        apply_body(key, cols, src, dst);
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn edges_avx512(key: &EdgeKey, ends: &[(u64, u64)], runs: &mut [&mut [f32]]) {
        key.apply_runs(ends, runs);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn edges_avx2(key: &EdgeKey, ends: &[(u64, u64)], runs: &mut [&mut [f32]]) {
        key.apply_runs(ends, runs);
    }
}

/// Instruction sets the mask loops are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

/// The widest instruction set this CPU has (detection is cached by the standard library).
/// `DISTSPMM_ISA=avx2|portable` caps it, as for the SpMM kernels.
fn isa() -> Isa {
    static CHOSEN: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let cap = std::env::var("DISTSPMM_ISA").unwrap_or_default();
        #[cfg(target_arch = "x86_64")]
        {
            if cap != "avx2" && cap != "portable" && std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if cap != "portable" && std::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        let _ = cap;
        Isa::Portable
    })
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "test shapes of a few dozen rows and columns: every narrowing is exact"
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(p: f32) -> DropoutKey {
        DropoutKey {
            seed: 42,
            epoch: 3,
            layer: 1,
            p,
        }
    }

    type Apply = fn(&RowKey, usize, &[f32], &mut [f32]);

    /// Every instruction-set variant this CPU has.
    fn variants() -> Vec<(&'static str, Apply)> {
        let mut v: Vec<(&'static str, Apply)> =
            vec![("portable", |k, c, s, d| apply_body(k, Cols::From(c), s, d))];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                v.push((
                    "avx2",
                    // SAFETY: AVX2 was detected just above.
                    |k, c, s, d| unsafe { x86::apply_avx2(k, Cols::From(c), s, d) },
                ));
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push((
                    "avx512",
                    // SAFETY: AVX-512F was detected just above.
                    |k, c, s, d| unsafe { x86::apply_avx512(k, Cols::From(c), s, d) },
                ));
            }
        }
        v
    }

    proptest! {
        #[test]
        fn every_path_matches_the_scalar_definition(
            seed in any::<u64>(),
            epoch in 0u64..1000,
            layer in 0usize..4,
            p in prop_oneof![Just(0.0f32), Just(0.5f32), 0.01f32..0.99],
            ids in proptest::collection::vec(any::<u64>(), 1..12),
            width in 1usize..70,
            start_frac in 0.0f64..1.0,
            len_frac in 0.0f64..1.0,
        ) {
            let k = DropoutKey { seed, epoch, layer, p };
            let start = ((width as f64) * start_frac) as usize;
            let len = (((width - start) as f64) * len_frac).ceil() as usize;
            let cols = start..(start + len).min(width);
            let w = cols.len();
            let src: Vec<f32> = (0..ids.len() * width).map(|i| 0.25 + i as f32).collect();
            let mut want = vec![0.0f32; ids.len() * w];
            for (r, &id) in ids.iter().enumerate() {
                let row = k.row(id);
                for (j, c) in cols.clone().enumerate() {
                    want[r * w + j] = if row.keeps(c) { src[r * width + c] * k.scale() } else { 0.0 };
                }
            }
            let mut got = vec![f32::NAN; ids.len() * w];
            k.apply(&ids, &src, width, cols.clone(), &mut got);
            prop_assert_eq!(&got, &want);
            for (name, apply) in variants() {
                for (r, &id) in ids.iter().enumerate() {
                    let row = k.row(id);
                    let s = &src[r * width..][cols.clone()];
                    let mut d = vec![f32::NAN; w];
                    apply(&row, cols.start, s, &mut d);
                    prop_assert_eq!(&d[..], &want[r * w..(r + 1) * w], "{}", name);
                }
            }
        }
    }

    #[test]
    fn masks_follow_node_ids_not_positions_or_column_splits() {
        let k = key(0.5);
        let width = 40;
        let ids: Vec<u64> = (1000..1100).collect();
        let src: Vec<f32> = (0..ids.len() * width).map(|i| i as f32 + 1.0).collect();
        let mut full = vec![0.0; ids.len() * width];
        k.apply(&ids, &src, width, 0..width, &mut full);
        // Rows 37..61 alone (another rank's slice of the same nodes).
        let mut part = vec![0.0; 24 * width];
        k.apply(
            &ids[37..61],
            &src[37 * width..61 * width],
            width,
            0..width,
            &mut part,
        );
        assert_eq!(part, full[37 * width..61 * width]);
        // Columns 13..29 alone (a tensor-parallel rank's slice).
        let mut cols = vec![0.0; ids.len() * 16];
        k.apply(&ids, &src, width, 13..29, &mut cols);
        for r in 0..ids.len() {
            assert_eq!(
                cols[r * 16..(r + 1) * 16],
                full[r * width + 13..r * width + 29]
            );
        }
    }

    #[test]
    fn drop_rates_match_p_and_decisions_are_uncorrelated() {
        for p in [0.1f32, 0.5, 0.9] {
            let k = key(p);
            let (rows, width) = (4096u64, 64usize);
            let mut dropped = 0usize;
            // Agreement of neighbouring columns and of consecutive node ids, which a weak
            // counter hash would make depend on each other.
            let (mut same_col_pair, mut same_row_pair) = (0usize, 0usize);
            let mut prev: Vec<bool> = Vec::new();
            for id in 0..rows {
                let row = k.row(id);
                let keep: Vec<bool> = (0..width).map(|c| row.keeps(c)).collect();
                dropped += keep.iter().filter(|&&b| !b).count();
                same_col_pair += keep.windows(2).filter(|w| w[0] == w[1]).count();
                if !prev.is_empty() {
                    same_row_pair += keep.iter().zip(&prev).filter(|(a, b)| a == b).count();
                }
                prev = keep;
            }
            let n = (rows as usize * width) as f64;
            let rate = dropped as f64 / n;
            let sd = (f64::from(p) * (1.0 - f64::from(p)) / n).sqrt();
            assert!(
                (rate - f64::from(p)).abs() < 6.0 * sd,
                "p {p}: dropped {rate}"
            );
            // Two independent draws agree with probability p² + (1−p)².
            let agree = f64::from(p * p + (1.0 - p) * (1.0 - p));
            let col_pairs = (rows as usize * (width - 1)) as f64;
            let row_pairs = ((rows as usize - 1) * width) as f64;
            let tol = |m: f64| 6.0 * (agree * (1.0 - agree) / m).sqrt();
            assert!(
                (same_col_pair as f64 / col_pairs - agree).abs() < tol(col_pairs),
                "p {p}: neighbouring columns agree {}",
                same_col_pair as f64 / col_pairs
            );
            assert!(
                (same_row_pair as f64 / row_pairs - agree).abs() < tol(row_pairs),
                "p {p}: consecutive ids agree {}",
                same_row_pair as f64 / row_pairs
            );
        }
    }

    #[test]
    fn epochs_layers_and_seeds_draw_new_masks() {
        let base = key(0.5);
        let mask = |k: DropoutKey| -> Vec<bool> {
            (0..64u64)
                .flat_map(|id| {
                    let r = k.row(id);
                    (0..32).map(move |c| r.keeps(c))
                })
                .collect()
        };
        let m = mask(base);
        for other in [
            DropoutKey { epoch: 4, ..base },
            DropoutKey { layer: 0, ..base },
            DropoutKey { seed: 43, ..base },
        ] {
            let o = mask(other);
            let same = m.iter().zip(&o).filter(|(a, b)| a == b).count();
            // Independent masks agree on about half of 2048 entries.
            assert!(
                (824..1224).contains(&same),
                "{other:?}: {same} of 2048 agree"
            );
        }
        assert_eq!(mask(base), m, "a key is a pure function");
    }

    #[test]
    fn p_zero_copies_and_kept_entries_are_scaled() {
        let src = [1.0f32, -2.0, 3.5, 0.0];
        let mut d = [f32::NAN; 4];
        key(0.0).row(7).apply(0, &src, &mut d);
        assert_eq!(d, src);
        let k = key(0.75);
        let row = k.row(7);
        let mut d = [f32::NAN; 4];
        row.apply(100, &src, &mut d);
        for (j, (&got, &s)) in d.iter().zip(&src).enumerate() {
            let want = if row.keeps(100 + j) { s * 4.0 } else { 0.0 };
            assert_eq!(got, want);
        }
        assert_eq!(k.scale(), 4.0);
    }

    type EdgeApply = fn(&EdgeKey, &[(u64, u64)], &mut [&mut [f32]]);

    /// Every instruction-set variant of the per-edge loop this CPU has, against the scalar
    /// definition: tiles cut mid-run of a destination, lone edges, several heads.
    #[test]
    fn every_edge_path_matches_the_scalar_definition() {
        let mut paths: Vec<(&str, EdgeApply)> = vec![("portable", |k, e, r| k.apply_runs(e, r))];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was detected just above.
                paths.push(("avx2", |k, e, r| unsafe { x86::edges_avx2(k, e, r) }));
            }
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F was detected just above.
                paths.push(("avx512", |k, e, r| unsafe { x86::edges_avx512(k, e, r) }));
            }
        }
        let k = key(0.3).edges();
        let ends: Vec<(u64, u64)> = (0..517u64)
            .map(|i| (i / 37 + 9 * (i % 3), i.wrapping_mul(0x9E37) % 1000))
            .collect();
        let (heads, e) = (5, ends.len());
        let values: Vec<f32> = (0..heads * e).map(|i| i as f32 - 100.5).collect();
        for (name, apply) in paths {
            let mut got = values.clone();
            let mut runs: Vec<&mut [f32]> = got.chunks_exact_mut(e).collect();
            apply(&k, &ends, &mut runs);
            for h in 0..heads {
                for (i, &(d, s)) in ends.iter().enumerate() {
                    let v = values[h * e + i];
                    let want = if k.keeps(d, s, h) { v * k.scale() } else { 0.0 };
                    assert_eq!(got[h * e + i], want, "{name}: head {h}, edge {i}");
                }
            }
        }
    }

    #[test]
    fn edge_masks_follow_ids_and_heads_at_rate_p() {
        let k = key(0.4).edges();
        let ends: Vec<(u64, u64)> = (0..3000u64).map(|i| (i / 7 + 500, i * 13 + 1)).collect();
        let heads = 3;
        let e = ends.len();
        let values: Vec<f32> = (0..heads * e).map(|i| i as f32 + 1.0).collect();
        let mut got = values.clone();
        k.apply_in_place(&ends, &mut got);
        let mut dropped = 0usize;
        for h in 0..heads {
            for (i, &(d, s)) in ends.iter().enumerate() {
                let want = if k.keeps(d, s, h) {
                    values[h * e + i] * k.scale()
                } else {
                    dropped += 1;
                    0.0
                };
                assert_eq!(got[h * e + i], want);
            }
        }
        let n = (heads * e) as f64;
        let sd = (0.4 * 0.6 / n).sqrt();
        assert!(
            (dropped as f64 / n - 0.4).abs() < 6.0 * sd,
            "dropped {dropped}"
        );
        // The edges in another order (another rank's layout) keep the same decisions.
        let rev: Vec<(u64, u64)> = ends.iter().rev().copied().collect();
        let mut ones = vec![1.0f32; heads * e];
        k.apply_in_place(&rev, &mut ones);
        for h in 0..heads {
            for i in 0..e {
                assert_eq!(ones[h * e + e - 1 - i] != 0.0, got[h * e + i] != 0.0);
            }
        }
        // Heads, directions and the input dropout of the same layer decide independently.
        let agree = |f: &dyn Fn(u64, u64) -> (bool, bool)| {
            ends.iter()
                .filter(|&&(d, s)| {
                    let (a, b) = f(d, s);
                    a == b
                })
                .count()
        };
        let row = key(0.4);
        for (what, same) in [
            ("heads", agree(&|d, s| (k.keeps(d, s, 0), k.keeps(d, s, 1)))),
            (
                "directions",
                agree(&|d, s| (k.keeps(d, s, 0), k.keeps(s, d, 0))),
            ),
            (
                "input dropout",
                agree(&|d, s| (k.keeps(d, s, 0), row.row(d).keeps(0))),
            ),
        ] {
            // Independent draws agree with probability 0.52: 1560 of 3000, sd 27.
            assert!((1400..1720).contains(&same), "{what}: {same} of 3000 agree");
        }
        let mut unchanged = values.clone();
        key(0.0).edges().apply_in_place(&ends, &mut unchanged);
        assert_eq!(unchanged, values);
    }
}
