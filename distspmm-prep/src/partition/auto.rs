//! The structure-chosen method ([`super::Method::Auto`]): METIS for graphs whose degrees are
//! even (meshes, grids, road-like graphs), KaMinPar for graphs with skewed degrees (power-law
//! graphs, citation networks).
//!
//! Why (docs/performance.md, "Choosing the partitioner by the graph's structure"): the KaMinPar
//! version linked refines k-way partitions by label propagation only, which leaves 1.1–1.2×
//! METIS's cut on a 2-D mesh whatever its options; METIS's FM refinement finds the mesh's
//! straight cuts, in less time. On skewed graphs KaMinPar takes half METIS's memory per edge
//! and a fraction of its time, and cuts less at small part counts.

use super::{
    check_metis_size, Adjacency, Balance, KaminparOptions, Method, MetisOptions, Objective,
};

/// The largest coefficient of variation (standard deviation over mean) of the degrees of the
/// non-isolated nodes for which [`AutoOptions::choose`] takes METIS. Measured: 2-D meshes
/// 0.02–0.06, a CSBM graph of mean degree 10 0.32 (Poisson-like degrees); Cora 1.34, RMAT
/// 6.5 and more. Isolated nodes are left out: they change neither partitioner's cut.
pub const EVEN_DEGREE_SPREAD: f64 = 0.5;

/// Options of [`Method::Auto`]: what the method it picks gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoOptions {
    /// Seed of METIS or KaMinPar.
    pub seed: u64,
    /// Allowed imbalance (largest part ≤ this × the mean): METIS meets any value from 1.001,
    /// KaMinPar 1.03 and up (smaller values are its error when it is picked).
    pub imbalance: f64,
    /// KaMinPar's threads (0: all cores); METIS runs on one.
    pub threads: usize,
    /// Nodes or non-zeros.
    pub balance: Balance,
}

impl Default for AutoOptions {
    fn default() -> Self {
        let k = KaminparOptions::default();
        Self {
            seed: k.seed,
            imbalance: k.imbalance,
            threads: k.threads,
            balance: k.balance,
        }
    }
}

/// How spread the degrees of a graph's non-isolated nodes are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DegreeSpread {
    /// Nodes with at least one neighbour.
    pub nodes: u64,
    /// Their mean degree.
    pub mean: f64,
    /// Their degrees' standard deviation over the mean (0 without such nodes).
    pub coefficient_of_variation: f64,
}

impl DegreeSpread {
    /// The spread of `adjacency`'s degrees, in one pass over its row offsets.
    pub fn of(adjacency: &Adjacency) -> Self {
        let [nodes, sum, sum_sq] = Self::sums(adjacency.xadj());
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "deliberate: a count of nodes, exact in f64 below 2^53"
        )]
        Self::from_sums(nodes as u64, sum, sum_sq)
    }

    /// The count, sum and sum of squares of the non-zero degrees of the rows `xadj` delimits
    /// (CSR row offsets): what [`from_sums`](Self::from_sums) takes, to be added up over ranks
    /// first when each holds a slice of the rows.
    pub fn sums(xadj: &[u64]) -> [f64; 3] {
        let mut sums = [0f64; 3];
        for w in xadj.windows(2) {
            let degree = w[1].saturating_sub(w[0]);
            if degree > 0 {
                let d = degree as f64;
                sums[0] += 1.0;
                sums[1] += d;
                sums[2] += d * d;
            }
        }
        sums
    }

    /// The spread of `nodes` non-zero degrees from their sum and the sum of their squares
    /// (for a graph whose rows are spread over ranks: add the sums up first).
    pub fn from_sums(nodes: u64, sum: f64, sum_of_squares: f64) -> Self {
        if nodes == 0 {
            return Self {
                nodes,
                mean: 0.0,
                coefficient_of_variation: 0.0,
            };
        }
        let count = nodes as f64;
        let mean = sum / count;
        let variance = (sum_of_squares / count - mean * mean).max(0.0);
        Self {
            nodes,
            mean,
            coefficient_of_variation: variance.sqrt() / mean,
        }
    }

    /// Whether the degrees are even enough for METIS ([`EVEN_DEGREE_SPREAD`]).
    pub fn is_even(&self) -> bool {
        self.coefficient_of_variation <= EVEN_DEGREE_SPREAD
    }
}

impl AutoOptions {
    /// The method these options pick for `adjacency`: METIS (k-way, edge cut) when its degrees
    /// are even ([`DegreeSpread::is_even`]) and the graph fits METIS's 32-bit `idx_t`;
    /// otherwise KaMinPar. The picked method's own options are checked when it runs.
    pub fn choose(&self, adjacency: &Adjacency) -> Method {
        let fits_metis = check_metis_size(
            adjacency.num_nodes() as u64,
            adjacency.adjncy().len() as u64,
            metis::Idx::MAX as u64,
        )
        .is_ok();
        let spread = DegreeSpread::of(adjacency);
        let method = if fits_metis && spread.is_even() {
            Method::Metis(MetisOptions {
                seed: self.seed,
                imbalance: self.imbalance,
                objective: Objective::Cut,
                balance: self.balance,
            })
        } else {
            Method::Kaminpar(KaminparOptions {
                seed: self.seed,
                imbalance: self.imbalance,
                threads: self.threads,
                balance: self.balance,
            })
        };
        tracing::info!(
            degree_spread = spread.coefficient_of_variation,
            mean_degree = spread.mean,
            fits_metis,
            chosen = if matches!(method, Method::Metis(_)) {
                "metis"
            } else {
                "kaminpar"
            },
            "partitioner chosen by the degree spread"
        );
        method
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{mesh, two_cliques};
    #[cfg(not(feature = "kaminpar"))]
    use super::super::PartitionError;
    use super::*;

    #[test]
    fn the_spread_from_sums_is_even_up_to_half_the_mean() {
        let even =
            |nodes, sum: f64, squares: f64| DegreeSpread::from_sums(nodes, sum, squares).is_even();
        // Degrees 2, 2, 2, 2: deviation 0.
        assert!(even(4, 8.0, 16.0));
        // Degrees 1, 3: mean 2, deviation 1 = half the mean: still even.
        assert!(even(2, 4.0, 10.0));
        // Degrees 1, 1, 1, 9: mean 3, deviation √12 ≈ 3.46 > 1.5.
        assert!(!even(4, 12.0, 84.0));
        // No node with a neighbour.
        assert!(even(0, 0.0, 0.0));
    }

    fn adjacency(graph: (usize, Vec<u32>, Vec<u32>)) -> Adjacency {
        let (n, src, dst) = graph;
        Adjacency::from_edges(n, &src, &dst).unwrap()
    }

    #[test]
    fn a_mesh_picks_metis_with_the_given_options() {
        let adj = adjacency(mesh(64, 64));
        let spread = DegreeSpread::of(&adj);
        assert_eq!(spread.nodes, 64 * 64);
        // 4 corners of degree 2, 248 border nodes of degree 3, the rest 4.
        assert!((spread.mean - 2.0 * 2.0 * 64.0 * 63.0 / 4096.0).abs() < 1e-12);
        assert!(spread.coefficient_of_variation < 0.1, "{spread:?}");
        let options = AutoOptions {
            seed: 7,
            imbalance: 1.01,
            threads: 2,
            balance: Balance::Nonzeros,
        };
        assert_eq!(
            options.choose(&adj),
            Method::Metis(MetisOptions {
                seed: 7,
                imbalance: 1.01,
                objective: Objective::Cut,
                balance: Balance::Nonzeros,
            })
        );
        assert_eq!(Method::Auto(options).resolve(&adj), options.choose(&adj));
    }

    #[test]
    fn a_power_law_graph_picks_kaminpar() {
        let g = crate::graph::generate::rmat(12, 16, 7).unwrap();
        let adj = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
        let spread = DegreeSpread::of(&adj);
        assert!(spread.coefficient_of_variation > 1.0, "{spread:?}");
        let options = AutoOptions {
            threads: 1,
            ..AutoOptions::default()
        };
        assert_eq!(
            options.choose(&adj),
            Method::Kaminpar(KaminparOptions {
                threads: 1,
                ..KaminparOptions::default()
            })
        );
        // Hubs are what decides: two cliques (every degree equal but the bridge's ends) are even.
        assert!(DegreeSpread::of(&adjacency(two_cliques(8))).is_even());
    }

    #[test]
    fn isolated_nodes_do_not_count_and_a_graph_without_edges_is_even() {
        // The mesh plus as many isolated nodes as it has nodes: the same spread.
        let (n, src, dst) = mesh(16, 16);
        let with_isolated = Adjacency::from_edges(2 * n, &src, &dst).unwrap();
        assert_eq!(
            DegreeSpread::of(&with_isolated),
            DegreeSpread::of(&adjacency((n, src, dst)))
        );
        let empty = Adjacency::from_edges(5, &[], &[]).unwrap();
        let spread = DegreeSpread::of(&empty);
        assert_eq!((spread.nodes, spread.coefficient_of_variation), (0, 0.0));
        assert!(matches!(
            AutoOptions::default().choose(&empty),
            Method::Metis(_)
        ));
    }

    #[test]
    fn the_threshold_separates_a_star_from_a_cycle() {
        // A star: one hub of degree n − 1 and n − 1 leaves; its spread grows like √n.
        let n = 50u32;
        let (src, dst): (Vec<u32>, Vec<u32>) = (1..n).map(|v| (0, v)).unzip();
        let star = Adjacency::from_edges(n as usize, &src, &dst).unwrap();
        assert!(!DegreeSpread::of(&star).is_even());
        let (src, dst): (Vec<u32>, Vec<u32>) = (0..n).map(|v| (v, (v + 1) % n)).unzip();
        let cycle = Adjacency::from_edges(n as usize, &src, &dst).unwrap();
        assert_eq!(DegreeSpread::of(&cycle).coefficient_of_variation, 0.0);
    }

    /// The partition names the method that ran, not `auto`, for every part count.
    #[test]
    fn the_partition_records_the_picked_method() {
        let adj = adjacency(mesh(8, 8));
        for parts in [1, 4] {
            let p = super::super::partition(&adj, parts, &Method::Auto(AutoOptions::default()))
                .unwrap();
            assert_eq!(p.method(), "metis:seed=1:ufactor=30:objective=cut");
        }
        // A skewed graph's pick is KaMinPar; a build without it says so.
        let g = crate::graph::generate::rmat(10, 16, 3).unwrap();
        let adj = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
        let picked = super::super::partition(&adj, 2, &Method::Auto(AutoOptions::default()));
        #[cfg(feature = "kaminpar")]
        assert!(picked.unwrap().method().starts_with("kaminpar:"));
        #[cfg(not(feature = "kaminpar"))]
        assert!(
            matches!(picked, Err(PartitionError::KaminparNotLinked)),
            "{picked:?}"
        );
    }
}
