//! Checks shared by the graph-reader targets: what a reader returns must be a valid graph that
//! the rest of the pipeline accepts.

use distspmm_prep::graph::{npz, Graph};
use distspmm_prep::normalize::{adjacency, Normalization, NormalizeError};

/// Graphs up to this many nodes also go through normalisation (which allocates per node, so a
/// header announcing four billion nodes would only measure the machine's memory).
const NORMALIZE_UP_TO: usize = 1 << 12;

/// Bitwise equality of the float arrays (so that −0.0 and 0.0 count as different).
fn same_graph(a: &Graph, b: &Graph) -> bool {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    a.num_nodes == b.num_nodes
        && a.src == b.src
        && a.dst == b.dst
        && a.weights.as_deref().map(bits) == b.weights.as_deref().map(bits)
        && a.features.as_ref().map(|f| (f.dim, bits(&f.data)))
            == b.features.as_ref().map(|f| (f.dim, bits(&f.data)))
        && a.labels == b.labels
        && a.targets == b.targets
        && a.train_mask == b.train_mask
        && a.val_mask == b.val_mask
        && a.test_mask == b.test_mask
}

/// The checks every graph a reader accepted must pass: it validates, it survives an `.npz`
/// round trip unchanged (what one reader accepts the writer can store), and — when small —
/// every normalisation either succeeds with an `N × N` matrix or reports a negative degree.
pub fn check_graph(g: &Graph) {
    g.validate()
        .expect("a reader returned a graph that Graph::validate rejects");
    let bytes = npz::write_npz_bytes(g).expect("a valid graph must be writable as .npz");
    let again = npz::read_npz_bytes(&bytes).expect("the .npz writer's output must read back");
    // The writer stores num_nodes, so even isolated trailing nodes survive.
    assert!(
        same_graph(g, &again),
        "the .npz round trip changed the graph"
    );
    if g.num_nodes > NORMALIZE_UP_TO {
        return;
    }
    for norm in [Normalization::Gcn, Normalization::Row, Normalization::None] {
        match adjacency(g.num_nodes, &g.src, &g.dst, g.weights.as_deref(), norm) {
            Ok(a) => {
                assert_eq!((a.nrows(), a.ncols()), (g.num_nodes, g.num_nodes));
                assert!(a.nnz() <= g.num_edges() + g.num_nodes);
            }
            // Weights can make Â impossible: a negative degree, duplicates or a scaling past
            // f32's range. Each is an error naming the node or edge, never a wrong matrix.
            Err(
                NormalizeError::NegativeDegree { .. }
                | NormalizeError::WeightOverflow { .. }
                | NormalizeError::ScaledOverflow { .. },
            ) => {}
            Err(e) => panic!("a validated graph failed {norm} normalisation: {e}"),
        }
    }
}
