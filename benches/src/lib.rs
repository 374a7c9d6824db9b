//! Shared inputs of the criterion benchmarks, built the way `distspmm bench` builds them:
//! GCN-normalised adjacency matrices of synthetic graphs and random dense operands on huge
//! pages (as NumPy allocates them for the Python peers in `benches/peers/`).

use distspmm_core::graph::generate::{self, CsbmParams};
use distspmm_core::graph::Graph;
use distspmm_core::normalize::{self, Normalization};
use distspmm_core::sparse::{CsrOwned, Dense, PageBuffer};

/// Â = D^-1/2 (A + I) D^-1/2 of `g`.
pub fn gcn_matrix(g: &Graph) -> CsrOwned<f32> {
    normalize::adjacency(
        g.num_nodes,
        &g.src,
        &g.dst,
        g.weights.as_deref(),
        Normalization::Gcn,
    )
    .expect("generated graphs are valid")
}

/// Â of the Graph500 RMAT graph of `2^scale` nodes, edge factor 16, seed 1 (what
/// `distspmm generate rmat --scale S --edge-factor 16 --seed 1` writes).
pub fn rmat_matrix(scale: u32) -> CsrOwned<f32> {
    gcn_matrix(&generate::rmat(scale, 16, 1).expect("RMAT parameters are in range"))
}

/// Â of a graph the size of Cora (2708 nodes, average degree 3.9), from the CSBM generator.
pub fn cora_sized_matrix() -> CsrOwned<f32> {
    let params = CsbmParams {
        nodes: 2708,
        classes: 7,
        features: 1,
        avg_degree: 3.9,
        seed: 1,
        ..CsbmParams::default()
    };
    gcn_matrix(&generate::csbm(&params).expect("CSBM parameters are in range"))
}

/// A `rows × cols` row-major matrix of values in [-1, 1) from a fixed pseudo-random sequence.
pub fn random_dense(rows: usize, cols: usize, seed: u64) -> Dense<PageBuffer<f32>> {
    let mut buf = PageBuffer::zeroed(rows * cols).expect("memory for a dense operand");
    let mut state = seed;
    for v in buf.iter_mut() {
        // SplitMix64: good enough to keep the values from being special.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        *v = ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
    }
    Dense::from_row_major(buf, rows, cols).expect("buffer sized for the shape")
}
