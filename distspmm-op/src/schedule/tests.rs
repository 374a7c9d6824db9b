//! Plans against counts taken straight from Â and the partition map, and against each other
//! (per-rank plans from chunks = all-rank counts from the partition shape).
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use std::vec::Vec;

use chunk_format::{encode, AlignedBuf, ChunkView};
use proptest::prelude::*;

use super::*;
use distspmm_prep::chunk::ChunkBuilder;
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::Partition;
use distspmm_sparse::sparse::CsrOwned;

/// Â of a random graph (GCN normalisation) and its chunks for the given part map.
fn chunks(
    n: usize,
    edges: &[(u32, u32)],
    part_of: &[u32],
    parts: u32,
) -> (CsrOwned<f32>, Vec<AlignedBuf>) {
    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
    let a_hat = normalize::adjacency(n, &src, &dst, None, Normalization::Gcn).unwrap();
    let graph = Graph::from_edges(n, src, dst);
    let partition = Partition::new(parts, part_of.to_vec(), "test").unwrap();
    let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition).unwrap();
    let bufs = (0..parts)
        .map(|p| encode(&builder.build(p).contents()).unwrap())
        .collect();
    (a_hat, bufs)
}

/// `(halo rows, non-zeros)` per pair of parts, counted from Â in original ids.
fn pair_counts(a_hat: &CsrOwned<f32>, part_of: &[u32], parts: usize) -> (Vec<u64>, Vec<u64>) {
    let mut referenced = std::collections::BTreeSet::new();
    let mut nnz = std::vec![0u64; parts * parts];
    for v in 0..a_hat.nrows() {
        let p = part_of[v] as usize;
        for &c in a_hat.row(v).0 {
            let q = part_of[c as usize] as usize;
            nnz[p * parts + q] += 1;
            if q != p {
                referenced.insert((p, c));
            }
        }
    }
    let mut halo = std::vec![0u64; parts * parts];
    for (p, c) in referenced {
        halo[p * parts + part_of[c as usize] as usize] += 1;
    }
    (halo, nnz)
}

fn graph_strategy() -> impl Strategy<Value = (usize, Vec<(u32, u32)>, Vec<u32>, u32, usize)> {
    (1usize..40, 1u32..6, 1usize..9).prop_flat_map(|(n, parts, features)| {
        let parts = parts.min(n as u32);
        (
            Just(n),
            proptest::collection::vec((0..n as u32, 0..n as u32), 0..4 * n),
            proptest::collection::vec(0..parts, n),
            Just(parts),
            Just(features),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn plans_count_what_the_matrix_needs(
        (n, edges, part_of, parts, features) in graph_strategy()
    ) {
        let (a_hat, bufs) = chunks(n, &edges, &part_of, parts);
        let views: Vec<ChunkView<'_>> =
            bufs.iter().map(|b| ChunkView::parse(b.as_bytes()).unwrap()).collect();
        let parts = parts as usize;
        let shape = PartitionShape::from_chunks(&views).unwrap();
        let (halo, nnz) = pair_counts(&a_hat, &part_of, parts);
        for p in 0..parts {
            for q in 0..parts {
                prop_assert_eq!(shape.halo_rows(p, q), halo[p * parts + q]);
                prop_assert_eq!(shape.block_nnz(p, q), nnz[p * parts + q]);
            }
        }

        let row = features as u64 * VALUE_BYTES;
        for kind in ScheduleKind::ALL {
            let all = shape.traffic(kind, features);
            let sent: u64 = all.iter().map(|t| t.forward.sent).sum();
            let received: u64 = all.iter().map(|t| t.forward.received).sum();
            prop_assert_eq!(sent, received);
            for (p, view) in views.iter().enumerate() {
                let (traffic, workspace) = match kind {
                    ScheduleKind::Broadcast => {
                        let plan = BroadcastPlan::from_chunk(view);
                        prop_assert_eq!(&plan, &shape.broadcast_plan(p));
                        (plan.traffic(features), plan.workspace(features))
                    }
                    ScheduleKind::Halo => {
                        let plan = HaloPlan::from_chunk(view);
                        (plan.traffic(features), plan.workspace(features))
                    }
                };
                prop_assert_eq!(traffic, all[p]);
                prop_assert_eq!(traffic.backward, traffic.forward.reversed());
                prop_assert_eq!(workspace, shape.workspace(kind, p, features));
                let expected_rows = match kind {
                    ScheduleKind::Broadcast => shape.nodes() - shape.part_rows(p),
                    ScheduleKind::Halo => halo[p * parts..(p + 1) * parts].iter().sum(),
                };
                prop_assert_eq!(traffic.forward.received, expected_rows * row);
            }
        }
        // The halo schedule never moves more than the broadcast.
        let b = shape.traffic(ScheduleKind::Broadcast, features);
        let h = shape.traffic(ScheduleKind::Halo, features);
        for p in 0..parts {
            prop_assert!(h[p].forward.received <= b[p].forward.received);
        }
    }
}

#[test]
fn halo_plan_lists_come_from_the_chunk() {
    // A path 0-1-2-3 split into {0,1} and {2,3}: each part needs one row of the other.
    let edges = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)];
    let (_, bufs) = chunks(4, &edges, &[0, 0, 1, 1], 2);
    let views: Vec<ChunkView<'_>> = bufs
        .iter()
        .map(|b| ChunkView::parse(b.as_bytes()).unwrap())
        .collect();
    let (p0, p1) = (
        HaloPlan::from_chunk(&views[0]),
        HaloPlan::from_chunk(&views[1]),
    );
    assert_eq!(p0.recv_list(1), &[0]); // node 2 is part 1's local row 0
    assert_eq!(p0.send_list(1), &[1]); // node 1 is part 0's local row 1
    assert_eq!(p1.recv_list(0), &[1]);
    assert_eq!(p0.recv_peers().collect::<Vec<_>>(), [1]);
    assert_eq!(p1.send_peers().collect::<Vec<_>>(), [0]);
    assert_eq!(
        p0.traffic(3).forward,
        Traffic {
            sent: 12,
            received: 12
        }
    );
    let b = BroadcastPlan::from_chunk(&views[0]);
    let steps: Vec<_> = b.steps().collect();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (steps[1].root, steps[1].rows, steps[1].block_nnz),
        (1, 2, 1)
    );
    // Received: the other part's 2 rows; sent: own 2 rows to 1 peer. Panel 2 rows, inbox 2.
    assert_eq!(b.traffic(1).forward, Traffic::rows(2, 2, 1));
    assert_eq!(
        b.workspace(1),
        Workspace {
            buffers: 4 * VALUE_BYTES,
            structure: 4 + 8 * 3
        }
    );
}

#[test]
fn one_rank_moves_nothing() {
    let plan = BroadcastPlan::new(0, &[0, 5], &[7]).unwrap();
    assert_eq!(plan.traffic(16), LayerTraffic::default());
    assert_eq!(plan.workspace(16), Workspace::default());
    let shape = PartitionShape::new(std::vec![0, 5], std::vec![0], std::vec![7]).unwrap();
    assert_eq!(
        shape.traffic(ScheduleKind::Halo, 16),
        [LayerTraffic::default()]
    );
}

#[test]
fn partition_shape_rejects_inconsistent_counts() {
    let offsets = || std::vec![0u64, 2, 5];
    let ok = PartitionShape::new(offsets(), std::vec![0, 3, 1, 0], std::vec![2, 4, 1, 3]);
    assert!(ok.is_ok());
    let cases = [
        (std::vec![0, 3, 1, 0], std::vec![2, 4, 1]), // wrong length
        (std::vec![1, 3, 1, 0], std::vec![2, 4, 1, 3]), // halo from itself
        (std::vec![0, 4, 1, 0], std::vec![2, 4, 1, 3]), // more rows than part 1 has
        (std::vec![0, 3, 0, 0], std::vec![2, 4, 1, 3]), // non-zeros without halo rows
    ];
    for (halo, nnz) in cases {
        let err = PartitionShape::new(offsets(), halo.clone(), nnz.clone());
        assert!(err.is_err(), "accepted halo {halo:?} nnz {nnz:?}");
    }
    assert!(PartitionShape::new(std::vec![0, 3, 2], std::vec![0; 4], std::vec![0; 4]).is_err());
    assert!(PartitionShape::new(std::vec![0], std::vec![], std::vec![]).is_err());
    assert!(BroadcastPlan::new(2, &[0, 1, 2], &[1, 1]).is_err());
}

#[test]
fn broadcast_matrix_is_every_other_part() {
    let shape =
        PartitionShape::new(std::vec![0, 2, 5, 5], std::vec![0; 9], std::vec![0; 9]).unwrap();
    let m = shape.comm_matrix(ScheduleKind::Broadcast);
    assert_eq!(m.rows(0, 1), 3);
    assert_eq!(m.rows(1, 0), 2);
    assert_eq!(m.rows(2, 2), 0);
    assert_eq!(m.rows(2, 1), 3);
    assert_eq!(m.received_rows(2), 5);
    assert_eq!(m.sent_rows(2), 0);
    assert_eq!(m.max_rows(), 3);
}
