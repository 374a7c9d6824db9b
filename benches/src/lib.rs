//! Shared inputs of the criterion benchmarks, built the way `distspmm` builds them: the
//! GCN-normalised adjacency matrices of generated graphs (RMAT as `distspmm generate rmat`
//! writes it, a 2-D mesh), METIS partitions and the chunks of each part, and random dense
//! operands on huge pages (as NumPy allocates them for the Python peers in `benches/peers/`).
//!
//! Sizes are small enough that the whole `cargo criterion -p distspmm-benches` run takes a few
//! minutes on 2 cores; `DISTSPMM_BENCH_SCALE=k` ([`scale`]) makes every graph `2^k` times larger.

use chunk_format::{encode, AlignedBuf, ChunkView};
use distspmm_prep::chunk::ChunkBuilder;
use distspmm_prep::graph::generate;
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::{self, Adjacency, Method, MetisOptions, Partition};
use distspmm_sparse::sparse::{CsrOwned, Dense, PageBuffer};

/// The environment variable that scales every benchmark graph: `k` multiplies its nodes by `2^k`.
pub const SCALE_VAR: &str = "DISTSPMM_BENCH_SCALE";

/// The largest accepted `DISTSPMM_BENCH_SCALE`: RMAT scale 24 for the kernels (about 800
/// million non-zeros in Â, 10 GB with its CSC form).
pub const MAX_SCALE: u32 = 10;

/// RMAT scale (log2 of the nodes) of the kernel, GAT, operator and chunk-reader graphs at
/// `DISTSPMM_BENCH_SCALE=0`.
pub const RMAT_SCALE: u32 = 14;

/// RMAT scale of the partitioner's graph at `DISTSPMM_BENCH_SCALE=0`.
pub const PARTITION_RMAT_SCALE: u32 = 12;

/// Side of the square mesh at `DISTSPMM_BENCH_SCALE=0` (256 × 256 nodes).
pub const MESH_SIDE: usize = 256;

/// `DISTSPMM_BENCH_SCALE` from `value` (the variable's text, `None` when unset): an integer
/// from 0 to [`MAX_SCALE`], 0 when unset.
///
/// # Errors
/// A message naming the variable and the accepted range.
pub fn parse_scale(value: Option<&str>) -> Result<u32, String> {
    let Some(text) = value else {
        return Ok(0);
    };
    match text.trim().parse::<u32>() {
        Ok(k) if k <= MAX_SCALE => Ok(k),
        _ => Err(format!(
            "{SCALE_VAR}={text:?} is not a step from 0 to {MAX_SCALE}: give k to make every \
             benchmark graph 2^k times larger ({SCALE_VAR}=4 turns the kernels' RMAT-14 into \
             RMAT-18), or unset it"
        )),
    }
}

/// The benchmark graphs' scale step from `DISTSPMM_BENCH_SCALE`. A value out of range (or not
/// text) ends the benchmark process with the message and exit status 2.
pub fn scale() -> u32 {
    let raw = std::env::var_os(SCALE_VAR);
    let text = raw.as_ref().map(|v| v.to_str().unwrap_or("(not UTF-8)"));
    parse_scale(text).unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2)
    })
}

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

/// [`gcn_matrix`] and the weight in `A` of each of Â's entries, which the chunks record (as
/// `distspmm partition` writes them).
pub fn gcn_matrix_with_weights(g: &Graph) -> (CsrOwned<f32>, Vec<f32>) {
    normalize::adjacency_with_weights(
        g.num_nodes,
        &g.src,
        &g.dst,
        g.weights.as_deref(),
        Normalization::Gcn,
    )
    .expect("generated graphs are valid")
}

/// The Graph500 RMAT graph of `2^scale` nodes, edge factor 16, seed 1: what
/// `distspmm generate rmat --scale S --edge-factor 16 --seed 1` writes.
pub fn rmat_graph(scale: u32) -> Graph {
    generate::rmat(scale, 16, 1).expect("RMAT parameters are in range")
}

/// The mesh's width and height at scale step `k`: [`MESH_SIDE`] squared times `2^k` nodes (the
/// width doubles first).
pub fn mesh_shape(k: u32) -> (usize, usize) {
    (MESH_SIDE << k.div_ceil(2), MESH_SIDE << (k / 2))
}

/// The 2-D grid graph of `width × height` nodes (id `row · width + column`), each joined to
/// its up to four neighbours in both directions: the 5-point stencil of a finite-difference
/// mesh, whose Â has a narrow band (each row's columns lie within `width` of the diagonal).
/// Edges are listed sorted by (source, destination).
pub fn mesh_graph(width: usize, height: usize) -> Graph {
    let n = width * height;
    let id = |v: usize| u32::try_from(v).expect("mesh node ids fit u32");
    let (mut src, mut dst) = (Vec::with_capacity(4 * n), Vec::with_capacity(4 * n));
    for r in 0..height {
        for c in 0..width {
            let v = r * width + c;
            let up = (r > 0).then(|| v - width);
            let left = (c > 0).then(|| v - 1);
            let right = (c + 1 < width).then_some(v + 1);
            let down = (r + 1 < height).then_some(v + width);
            for u in [up, left, right, down].into_iter().flatten() {
                src.push(id(v));
                dst.push(id(u));
            }
        }
    }
    Graph::from_edges(n, src, dst)
}

/// One line on stderr naming a benchmark graph and its size, so that a run states what it
/// measured (criterion's report has only the group names).
pub fn describe(name: &str, a: &CsrOwned<f32>) {
    eprintln!("{name}: {} nodes, {} non-zeros in Â", a.nrows(), a.nnz());
}

/// Flops of one SpMM (or SDDMM) over `nnz` stored entries with `f` feature columns: a
/// multiply and an add per entry and column.
pub fn flops(nnz: usize, f: usize) -> u64 {
    2 * nnz as u64 * f as u64
}

/// `g`'s nodes split into `parts` parts by METIS k-way with its defaults (seed 1, ufactor 30,
/// edge cut), as `distspmm partition --method metis` does; one part without a partitioner.
pub fn metis_partition(g: &Graph, parts: u32) -> Partition {
    let adjacency = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).expect("a valid graph");
    partition::partition(&adjacency, parts, &Method::Metis(MetisOptions::default()))
        .expect("METIS partitions the benchmark graphs")
}

/// `distspmm partition`'s chunk builder for `g` under `partition`: Â (`a_hat`) and the weight
/// in `A` of each of its entries (`edge_weights`), both from [`gcn_matrix_with_weights`].
pub fn chunk_builder<'a>(
    g: &'a Graph,
    a_hat: &'a CsrOwned<f32>,
    edge_weights: &'a [f32],
    partition: &'a Partition,
) -> ChunkBuilder<'a> {
    ChunkBuilder::new(g, a_hat.view(), partition)
        .and_then(|builder| builder.with_edge_weights(edge_weights))
        .expect("graph, Â, its weights and the partition agree")
}

/// The chunk of every part `builder` builds, encoded in memory.
pub fn encode_parts(builder: &ChunkBuilder<'_>) -> Vec<AlignedBuf> {
    (0..builder.partition().parts())
        .map(|p| encode(&builder.build(p).contents()).expect("a built chunk encodes"))
        .collect()
}

/// The parsed (validated) views of `chunks`, in part order.
pub fn chunk_views(chunks: &[AlignedBuf]) -> Vec<ChunkView<'_>> {
    chunks
        .iter()
        .map(|c| ChunkView::parse(c.as_bytes()).expect("an encoded chunk parses"))
        .collect()
}

/// Fills `values` with numbers in [-1, 1) from a fixed pseudo-random sequence (SplitMix64 of
/// `seed`: enough to keep the values from being special).
pub fn fill_random(values: &mut [f32], seed: u64) {
    let mut state = seed;
    for v in values {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        *v = ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
    }
}

/// `len` values of [`fill_random`].
pub fn random_values(len: usize, seed: u64) -> Vec<f32> {
    let mut values = vec![0.0; len];
    fill_random(&mut values, seed);
    values
}

/// A `rows × cols` row-major matrix of [`fill_random`] values, on huge pages.
pub fn random_dense(rows: usize, cols: usize, seed: u64) -> Dense<PageBuffer<f32>> {
    let mut buf = PageBuffer::zeroed(rows * cols).expect("memory for a dense operand");
    fill_random(&mut buf, seed);
    Dense::from_row_major(buf, rows, cols).expect("buffer sized for the shape")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_defaults_to_zero_and_accepts_its_range() {
        assert_eq!(parse_scale(None), Ok(0));
        assert_eq!(parse_scale(Some("0")), Ok(0));
        assert_eq!(parse_scale(Some(" 3 ")), Ok(3));
        assert_eq!(parse_scale(Some(&MAX_SCALE.to_string())), Ok(MAX_SCALE));
    }

    #[test]
    fn scale_refuses_what_is_not_a_step_in_range() {
        for bad in ["", "-1", "1.5", "two", "11", "99999999999"] {
            let message = parse_scale(Some(bad)).expect_err(bad);
            assert!(
                message.contains(SCALE_VAR) && message.contains("0 to 10"),
                "{message}"
            );
        }
    }

    #[test]
    fn mesh_shape_doubles_the_nodes_per_step() {
        assert_eq!(mesh_shape(0), (256, 256));
        for k in 0..MAX_SCALE {
            let ((w0, h0), (w1, h1)) = (mesh_shape(k), mesh_shape(k + 1));
            assert_eq!(w1 * h1, 2 * w0 * h0, "step {k}");
        }
    }

    #[test]
    fn mesh_joins_each_node_to_its_grid_neighbours_both_ways() {
        let (w, h) = (4, 3);
        let g = mesh_graph(w, h);
        assert_eq!(g.num_nodes, 12);
        // 2·(h·(w−1) + w·(h−1)) directed edges.
        assert_eq!(g.num_edges(), 2 * (3 * 3 + 4 * 2));
        let edges: Vec<(u32, u32)> = g.src.iter().copied().zip(g.dst.iter().copied()).collect();
        assert!(
            edges.windows(2).all(|e| e[0] < e[1]),
            "sorted, no duplicates"
        );
        for &(s, d) in &edges {
            assert!(edges.contains(&(d, s)), "{s}→{d} has its reverse");
            let (rs, cs, rd, cd) = (
                s as usize / w,
                s as usize % w,
                d as usize / w,
                d as usize % w,
            );
            assert_eq!(
                rs.abs_diff(rd) + cs.abs_diff(cd),
                1,
                "{s}→{d} joins grid neighbours"
            );
        }
        let degree = |v: u32| edges.iter().filter(|e| e.0 == v).count();
        assert_eq!(
            (degree(0), degree(1), degree(5)),
            (2, 3, 4),
            "corner, side, interior"
        );
    }

    #[test]
    fn random_values_lie_in_the_unit_interval_and_differ_by_seed() {
        let (a, b) = (random_values(1000, 1), random_values(1000, 2));
        assert!(a.iter().chain(&b).all(|v| (-1.0..1.0).contains(v)));
        assert_ne!(a, b);
        assert_eq!(a, random_values(1000, 1));
    }
}
