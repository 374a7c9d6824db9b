//! KaMinPar through [`partition`]: cut, balance (of nodes and of non-zeros) and
//! reproducibility on one thread.

use crate::partition::partition;
use crate::partition::testing::{two_cliques, weighted_imbalance};
use crate::partition::{
    Adjacency, AutoOptions, Balance, KaminparOptions, Method, MetisOptions, KAMINPAR_IMBALANCE,
};
use proptest::prelude::*;

fn kaminpar(threads: usize, seed: u64, balance: Balance) -> Method {
    Method::Kaminpar(KaminparOptions {
        seed,
        threads,
        balance,
        ..KaminparOptions::default()
    })
}

/// KaMinPar's bound on a part: (1 + 0.03) · ⌈W/P⌉ of the balanced weight, relaxed to
/// ⌈W/P⌉ + the heaviest node when nodes are weighted (its `setup_max_block_weight`: a part
/// may have to take one hub whole).
fn kaminpar_bound(total: u64, parts: u32, heaviest: u64) -> u64 {
    let perfect = total.div_ceil(u64::from(parts));
    #[allow(
        clippy::cast_possible_truncation,
        reason = "deliberate: KaMinPar's own floor of the relaxed bound, well below u64::MAX"
    )]
    let eps = (perfect as f64 * KAMINPAR_IMBALANCE).floor() as u64;
    if heaviest > 1 {
        eps.max(perfect + heaviest)
    } else {
        eps
    }
}

#[test]
fn kaminpar_separates_two_cliques_and_balances_nonzeros() {
    let (n, src, dst) = two_cliques(8);
    let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
    let p = partition(&adj, 2, &kaminpar(1, 1, Balance::Nodes)).unwrap();
    assert_eq!(p.edge_cut(&adj).unwrap(), 1);
    assert_eq!(p.method(), "kaminpar:seed=1:imbalance=1.03:threads=1");

    let g = crate::graph::generate::rmat(12, 16, 7).unwrap();
    let adj = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
    let row_nnz = |v: usize| adj.xadj()[v + 1] - adj.xadj()[v] + 1;
    let total: u64 = (0..adj.num_nodes()).map(row_nnz).sum();
    let nodes = partition(&adj, 4, &kaminpar(2, 1, Balance::Nodes)).unwrap();
    let nnz = partition(&adj, 4, &kaminpar(2, 1, Balance::Nonzeros)).unwrap();
    let mut work = vec![0u64; 4];
    for (v, &q) in nnz.part_of().iter().enumerate() {
        work[q as usize] += row_nnz(v);
    }
    let heaviest = (0..adj.num_nodes()).map(row_nnz).max().unwrap();
    assert!(
        *work.iter().max().unwrap() <= kaminpar_bound(total, 4, heaviest),
        "{work:?}"
    );
    assert!(weighted_imbalance(&nodes, row_nnz) > weighted_imbalance(&nnz, row_nnz));
    assert!(nnz.method().ends_with(":balance=nnz"));
    // A cut well below a random split's (which cuts about 3/4 of the edges), and close to
    // METIS's on the same graph (RMAT graphs have no small cut: METIS cuts about half).
    let random = partition(&adj, 4, &Method::Random { seed: 1 }).unwrap();
    let metis = partition(&adj, 4, &Method::Metis(MetisOptions::default())).unwrap();
    let (ours, random, metis) = (
        nodes.edge_cut(&adj).unwrap(),
        random.edge_cut(&adj).unwrap(),
        metis.edge_cut(&adj).unwrap(),
    );
    assert!(ours * 4 < random * 3, "kaminpar {ours}, random {random}");
    assert!(ours * 10 < metis * 11, "kaminpar {ours}, metis {metis}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn kaminpar_gives_a_valid_balanced_reproducible_partition(
        n in 2usize..300,
        parts_raw in 2u32..9,
        edges in proptest::collection::vec((0u32..300, 0u32..300), 0..1200),
        seed in 0u64..1000,
    ) {
        let parts = parts_raw.min(u32::try_from(n).unwrap());
        let (src, dst): (Vec<u32>, Vec<u32>) =
            edges.iter().map(|&(u, v)| (u % u32::try_from(n).unwrap(), v % u32::try_from(n).unwrap())).unzip();
        let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
        let method = kaminpar(1, seed, Balance::Nodes);
        let p = partition(&adj, parts, &method).unwrap();
        prop_assert_eq!(p.num_nodes(), n);
        prop_assert!(p.part_of().iter().all(|&x| x < parts));
        let sizes = p.part_sizes();
        prop_assert!(sizes.iter().all(|&s| s > 0), "empty part: {:?}", sizes);
        let bound = kaminpar_bound(n as u64, parts, 1).max((n as u64).div_ceil(u64::from(parts)));
        prop_assert!(sizes.iter().all(|&s| s <= bound), "sizes {:?}, bound {}", sizes, bound);
        // One thread and a fixed seed: the same map again.
        let again = partition(&adj, parts, &method).unwrap();
        prop_assert_eq!(p.part_of(), again.part_of());
    }
}

/// KaMinPar cuts two cliques at their one joining edge, after the options' own checks.
#[test]
fn kaminpar_cuts_two_cliques_at_their_bridge() {
    let (n, src, dst) = two_cliques(5);
    let adj = Adjacency::from_edges(n, &src, &dst).unwrap();
    let method = kaminpar(1, 1, Balance::Nodes);
    assert_eq!(
        partition(&adj, 2, &method).unwrap().edge_cut(&adj).unwrap(),
        1
    );
    let tight = Method::Kaminpar(KaminparOptions {
        imbalance: 1.01,
        ..KaminparOptions::default()
    });
    let err = partition(&adj, 2, &tight).unwrap_err();
    assert!(err.to_string().contains("--imbalance 1.03"), "{err}");
}

/// `auto` leaves a power-law graph to KaMinPar, as `--method kaminpar` runs it.
#[test]
fn auto_leaves_a_power_law_graph_to_kaminpar() {
    let g = crate::graph::generate::rmat(12, 16, 5).unwrap();
    let adj = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
    let auto = Method::Auto(AutoOptions {
        threads: 1,
        ..AutoOptions::default()
    });
    let picked = partition(&adj, 8, &auto).unwrap();
    assert_eq!(picked.method(), "kaminpar:seed=1:imbalance=1.03:threads=1");
    assert_eq!(
        picked,
        partition(&adj, 8, &kaminpar(1, 1, Balance::Nodes)).unwrap()
    );
}
