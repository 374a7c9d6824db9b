//! Test support: random but consistent chunk contents, built from a dense block row of Â the
//! way a partitioner would (compacted columns, exact halo lists), plus that dense reference.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: part sizes, ids and offsets are a few thousand at most, so every narrowing is exact"
)]

use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use crate::{BlockView, ChunkContents, ChunkView};

/// A small deterministic generator (splitmix64).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A non-zero value with an exact binary representation.
    fn value(&mut self) -> f32 {
        (self.below(2000) as f32 - 999.5) / 64.0
    }
}

/// Parameters of a random chunk.
#[derive(Clone, Debug)]
pub(crate) struct ChunkParams {
    pub(crate) seed: u64,
    pub(crate) part_sizes: Vec<u32>,
    pub(crate) part_id: usize,
    pub(crate) density_percent: u64,
    pub(crate) feature_dim: u32,
    pub(crate) num_classes: u32,
    pub(crate) masks: bool,
    pub(crate) edge_weights: bool,
    /// Multi-label targets (`TARGETS`) instead of labels, when there are classes.
    pub(crate) multi_label: bool,
}

pub(crate) fn params_strategy() -> impl Strategy<Value = ChunkParams> {
    (
        any::<u64>(),
        prop::collection::vec(0u32..7, 1..5),
        any::<prop::sample::Index>(),
        0u64..=70,
        0u32..4,
        0u32..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                seed,
                part_sizes,
                part,
                density_percent,
                feature_dim,
                num_classes,
                masks,
                edge_weights,
                multi_label,
            )| {
                ChunkParams {
                    seed,
                    part_id: part.index(part_sizes.len()),
                    part_sizes,
                    density_percent,
                    feature_dim,
                    num_classes,
                    masks,
                    edge_weights,
                    multi_label,
                }
            },
        )
}

/// Owned arrays of one block.
#[derive(Clone, Debug)]
pub(crate) struct OwnedBlock {
    pub(crate) src_part: u32,
    pub(crate) ncols: usize,
    pub(crate) csr_rowptr: Vec<u64>,
    pub(crate) csr_cols: Vec<u32>,
    pub(crate) csr_vals: Vec<f32>,
    pub(crate) csc_colptr: Vec<u64>,
    pub(crate) csc_rows: Vec<u32>,
    pub(crate) csc_vals: Vec<f32>,
    pub(crate) edge_weights: Option<Vec<f32>>,
}

/// Owned arrays of one chunk, and the dense block row they were built from.
#[derive(Clone, Debug)]
pub(crate) struct OwnedChunk {
    pub(crate) part_id: u32,
    pub(crate) fingerprint: [u8; 16],
    pub(crate) part_offsets: Vec<u64>,
    pub(crate) blocks: Vec<OwnedBlock>,
    pub(crate) halo_recv_offsets: Vec<u64>,
    pub(crate) halo_recv: Vec<u32>,
    pub(crate) halo_send_offsets: Vec<u64>,
    pub(crate) halo_send: Vec<u32>,
    pub(crate) feature_dim: u32,
    pub(crate) features: Option<Vec<f32>>,
    pub(crate) num_classes: u32,
    pub(crate) labels: Option<Vec<i32>>,
    pub(crate) targets: Option<Vec<u8>>,
    pub(crate) masks: Option<Vec<u8>>,
    pub(crate) original_ids: Vec<u64>,
    /// Row-major `n_p × N`: p's rows of Â over global columns.
    pub(crate) dense: Vec<f32>,
}

fn prefix(counts: impl Iterator<Item = usize>) -> Vec<u64> {
    let mut out = vec![0u64];
    for c in counts {
        out.push(out[out.len() - 1] + c as u64);
    }
    out
}

/// Builds the chunk of `params.part_id` from a random dense block row.
pub(crate) fn build(params: &ChunkParams) -> OwnedChunk {
    let mut rng = Rng::new(params.seed);
    let parts = params.part_sizes.len();
    let p = params.part_id;
    let off = prefix(params.part_sizes.iter().map(|&s| s as usize));
    let n = off[parts] as usize;
    let n_p = params.part_sizes[p] as usize;
    let (p_start, p_end) = (off[p] as usize, off[p + 1] as usize);

    let mut dense = vec![0f32; n_p * n];
    for x in &mut dense {
        if rng.below(100) < params.density_percent {
            *x = rng.value();
        }
    }

    // Receive lists: exactly the columns of q's range that hold a non-zero.
    let mut recv: Vec<Vec<u32>> = vec![Vec::new(); parts];
    for (q, list) in recv.iter_mut().enumerate() {
        if q == p {
            continue;
        }
        for g in off[q] as usize..off[q + 1] as usize {
            if (0..n_p).any(|r| dense[r * n + g] != 0.0) {
                list.push((g - off[q] as usize) as u32);
            }
        }
    }

    let mut blocks = Vec::new();
    for q in 0..parts {
        let globals: Vec<usize> = if q == p {
            (p_start..p_end).collect()
        } else if !recv[q].is_empty() {
            recv[q]
                .iter()
                .map(|&c| off[q] as usize + c as usize)
                .collect()
        } else {
            continue;
        };
        let ncols = globals.len();
        let mut b = OwnedBlock {
            src_part: q as u32,
            ncols,
            csr_rowptr: vec![0],
            csr_cols: Vec::new(),
            csr_vals: Vec::new(),
            csc_colptr: vec![0],
            csc_rows: Vec::new(),
            csc_vals: Vec::new(),
            edge_weights: None,
        };
        for r in 0..n_p {
            for (c, &g) in globals.iter().enumerate() {
                let v = dense[r * n + g];
                if v != 0.0 {
                    b.csr_cols.push(c as u32);
                    b.csr_vals.push(v);
                }
            }
            b.csr_rowptr.push(b.csr_cols.len() as u64);
        }
        for &g in &globals {
            for r in 0..n_p {
                let v = dense[r * n + g];
                if v != 0.0 {
                    b.csc_rows.push(r as u32);
                    b.csc_vals.push(v);
                }
            }
            b.csc_colptr.push(b.csc_rows.len() as u64);
        }
        blocks.push(b);
    }

    let send: Vec<Vec<u32>> = (0..parts)
        .map(|r| {
            if r == p {
                Vec::new()
            } else {
                (0..n_p as u32).filter(|_| rng.below(100) < 30).collect()
            }
        })
        .collect();

    let mut permutation: Vec<u64> = (0..n as u64).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        permutation.swap(i, j);
    }
    let f = params.feature_dim;
    let c = params.num_classes;
    let fingerprint = core::array::from_fn(|_| rng.next_u64() as u8);
    let features = (f > 0).then(|| (0..n_p * f as usize).map(|_| rng.value()).collect());
    let mut labels = (c > 0).then(|| {
        (0..n_p)
            .map(|_| rng.below(u64::from(c) + 1) as i32 - 1)
            .collect()
    });
    let masks = params
        .masks
        .then(|| (0..n_p).map(|_| rng.below(8) as u8).collect());
    // Drawn last, so chunks without them are the ones the generator always made.
    if params.edge_weights {
        for b in &mut blocks {
            b.edge_weights = Some(b.csr_vals.iter().map(|_| rng.value()).collect());
        }
    }
    // Each row unlabelled (one in four) or 0/1 per class.
    let targets = (params.multi_label && c > 0).then(|| {
        labels = None;
        let mut t = Vec::with_capacity(n_p * c as usize);
        for _ in 0..n_p {
            if rng.below(4) == 0 {
                t.extend(core::iter::repeat_n(crate::TARGET_UNLABELLED, c as usize));
            } else {
                t.extend((0..c).map(|_| rng.below(2) as u8));
            }
        }
        t
    });
    OwnedChunk {
        part_id: p as u32,
        fingerprint,
        halo_recv_offsets: prefix(recv.iter().map(Vec::len)),
        halo_recv: recv.concat(),
        halo_send_offsets: prefix(send.iter().map(Vec::len)),
        halo_send: send.concat(),
        part_offsets: off,
        blocks,
        feature_dim: f,
        features,
        num_classes: c,
        labels,
        targets,
        masks,
        original_ids: permutation[p_start..p_end].to_vec(),
        dense,
    }
}

impl OwnedBlock {
    pub(crate) fn view(&self, nrows: usize) -> BlockView<'_> {
        BlockView {
            src_part: self.src_part,
            nrows,
            ncols: self.ncols,
            csr_rowptr: &self.csr_rowptr,
            csr_cols: &self.csr_cols,
            csr_vals: &self.csr_vals,
            csc_colptr: &self.csc_colptr,
            csc_rows: &self.csc_rows,
            csc_vals: &self.csc_vals,
            edge_weights: self.edge_weights.as_deref(),
        }
    }
}

impl OwnedChunk {
    pub(crate) fn n_p(&self) -> usize {
        let p = self.part_id as usize;
        (self.part_offsets[p + 1] - self.part_offsets[p]) as usize
    }

    pub(crate) fn contents(&self) -> ChunkContents<'_> {
        let n_p = self.n_p();
        ChunkContents {
            part_id: self.part_id,
            fingerprint: self.fingerprint,
            part_offsets: &self.part_offsets,
            blocks: self.blocks.iter().map(|b| b.view(n_p)).collect(),
            halo_recv_offsets: &self.halo_recv_offsets,
            halo_recv: &self.halo_recv,
            halo_send_offsets: &self.halo_send_offsets,
            halo_send: &self.halo_send,
            feature_dim: self.feature_dim,
            features: self.features.as_deref(),
            num_classes: self.num_classes,
            labels: self.labels.as_deref(),
            targets: self.targets.as_deref(),
            masks: self.masks.as_deref(),
            original_ids: &self.original_ids,
        }
    }
}

/// A chunk with every section non-empty (three parts, features, labels, masks, edge weights),
/// for the exhaustive corruption tests.
pub(crate) fn small_full_chunk() -> OwnedChunk {
    build(&ChunkParams {
        seed: 7,
        part_sizes: vec![3, 4, 2],
        part_id: 1,
        density_percent: 40,
        feature_dim: 2,
        num_classes: 3,
        masks: true,
        edge_weights: true,
        multi_label: false,
    })
}

/// [`small_full_chunk`] with multi-label targets instead of labels.
pub(crate) fn small_multi_label_chunk() -> OwnedChunk {
    build(&ChunkParams {
        seed: 7,
        part_sizes: vec![3, 4, 2],
        part_id: 1,
        density_percent: 40,
        feature_dim: 2,
        num_classes: 3,
        masks: true,
        edge_weights: true,
        multi_label: true,
    })
}

/// Rebuilds p's dense block row (`n_p × N`) from a view, once from the CSR and once from the CSC
/// of every block, mapping compacted columns back through the halo receive lists.
pub(crate) fn dense_from_view(view: &ChunkView<'_>) -> (Vec<f32>, Vec<f32>) {
    let off = view.part_offsets();
    let n = off[view.num_parts()] as usize;
    let n_p = view.num_local_nodes();
    let p = view.part_id();
    let mut from_csr = vec![0f32; n_p * n];
    let mut from_csc = vec![0f32; n_p * n];
    for b in view.blocks() {
        let q = b.src_part as usize;
        let global = |c: usize| {
            if q == p {
                off[p] as usize + c
            } else {
                off[q] as usize + view.halo_recv(q)[c] as usize
            }
        };
        for r in 0..b.nrows {
            for k in b.csr_rowptr[r] as usize..b.csr_rowptr[r + 1] as usize {
                from_csr[r * n + global(b.csr_cols[k] as usize)] = b.csr_vals[k];
            }
        }
        for c in 0..b.ncols {
            for k in b.csc_colptr[c] as usize..b.csc_colptr[c + 1] as usize {
                from_csc[b.csc_rows[k] as usize * n + global(c)] = b.csc_vals[k];
            }
        }
    }
    (from_csr, from_csc)
}
