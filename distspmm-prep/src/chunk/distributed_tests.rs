//! The distributed builder against the single-machine builders: byte-identical chunks for the
//! same partition at every rank and part count, and the same verdict on every rank when one
//! rank's input is bad.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test graphs of a few dozen nodes: every narrowing is exact"
)]

use std::vec::Vec;

use chunk_format::encode;
use dist_comm::{Group, LocalComm};
use proptest::prelude::*;

use super::super::tests::{both_builders, weighted_graph};
use super::*;
use crate::graph::{slice_range, GraphSlice};
use crate::partition::{partition, Adjacency, Method};

/// A rank's build and its encoded chunks.
type RankResult = Result<(DistBuild, Vec<Vec<u8>>), DistBuildError>;

/// Runs [`build`] on `ranks` threads over `g` cut into slices with the parts of `part`;
/// returns every rank's result with its encoded chunks.
fn run(g: &Graph, part: &Partition, ranks: usize, norm: Normalization) -> Vec<RankResult> {
    LocalComm::run(ranks, |comm| {
        let slice = GraphSlice::cut(g, comm.rank(), ranks);
        let nodes = slice_range(g.num_nodes as u64, ranks, comm.rank());
        let parts_of = &part.part_of()[nodes.start as usize..nodes.end as usize];
        let mut chunks = Vec::new();
        let mut steps = StepBytes::default();
        let built = build(
            &comm,
            slice,
            parts_of,
            part.parts(),
            part.method(),
            norm,
            &mut steps,
            &mut || {},
            |chunk| {
                chunks.push(encode(&chunk.contents()).unwrap().as_bytes().to_vec());
                Ok(())
            },
        )?;
        Ok((built, chunks))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn distributed_chunks_are_byte_identical_to_single_machine_ones(
        n in 3usize..40,
        ranks in 1usize..=3,
        extra_parts in 0u32..3,
        edges in proptest::collection::vec((0u32..40, 0u32..40, 0u8..20), 0..160),
        weighted in any::<bool>(),
        norm in 0usize..3,
        seed in 0u32..1000,
    ) {
        let parts = (ranks as u32 + extra_parts).min(n as u32);
        let ranks = ranks.min(parts as usize);
        let edges: Vec<(u32, u32, u8)> =
            edges.iter().map(|&(u, v, w)| (u % n as u32, v % n as u32, w)).collect();
        let g = weighted_graph(n, &edges, weighted, seed);
        let norm = [Normalization::Gcn, Normalization::Row, Normalization::None][norm];
        let adj = Adjacency::from_edges(n, &g.src, &g.dst).unwrap();
        let part = partition(&adj, parts, &Method::Random { seed: u64::from(seed) }).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (in_memory, _) = both_builders(&g, &part, norm, &tmp.path().join("out"));
        let mut all = Vec::new();
        for (rank, result) in run(&g, &part, ranks, norm).into_iter().enumerate() {
            let (built, chunks) = result.unwrap();
            prop_assert_eq!(built.chunks_built.clone(), owned_parts(parts, ranks, rank));
            prop_assert_eq!(&built.partition, &part);
            prop_assert_eq!(built.edges, g.num_edges() as u64);
            prop_assert_eq!(built.feature_dim as usize, g.feature_dim());
            let expected_halo: Vec<u64> = in_memory
                .iter()
                .map(|c| chunk_format::ChunkView::parse(c.as_bytes()).unwrap().halo_recv_flat().len() as u64)
                .collect();
            prop_assert_eq!(&built.halo_rows, &expected_halo);
            all.extend(chunks);
        }
        prop_assert_eq!(all.len(), in_memory.len());
        for (p, (a, b)) in in_memory.iter().zip(&all).enumerate() {
            prop_assert!(a.as_bytes() == &b[..], "part {} differs", p);
        }
    }
}

#[test]
fn parts_are_spread_contiguously_and_every_part_has_one_owner() {
    for ranks in 1..6 {
        for parts in ranks as u32..20 {
            let mut next = 0;
            for r in 0..ranks {
                let owned = owned_parts(parts, ranks, r);
                assert_eq!(owned.start, next);
                assert!(!owned.is_empty());
                for q in owned.clone() {
                    assert_eq!(owner_of_part(parts, ranks, q), r);
                }
                next = owned.end;
            }
            assert_eq!(next, parts);
        }
    }
}

#[test]
fn a_bad_slice_on_one_rank_fails_every_rank() {
    let edges: Vec<(u32, u32, u8)> = (0..20).map(|i| (i, (i + 1) % 20, 1)).collect();
    let g = weighted_graph(20, &edges, true, 4);
    let adj = Adjacency::from_edges(20, &g.src, &g.dst).unwrap();
    let part = partition(&adj, 3, &Method::Contiguous).unwrap();
    let results = LocalComm::run(3, |comm| {
        let mut slice = GraphSlice::cut(&g, comm.rank(), 3);
        if comm.rank() == 1 {
            slice.weights.as_mut().unwrap()[0] = f32::NAN;
        }
        let nodes = slice_range(20, 3, comm.rank());
        let parts_of = &part.part_of()[nodes.start as usize..nodes.end as usize];
        build(
            &comm,
            slice,
            parts_of,
            3,
            part.method(),
            Normalization::Gcn,
            &mut StepBytes::default(),
            &mut || {},
            |_| Ok(()),
        )
        .map(|_| ())
    });
    for (rank, result) in results.into_iter().enumerate() {
        match (rank, result) {
            (1, Err(DistBuildError::Local(e))) => assert!(
                e.to_string().contains("NaN") || e.to_string().contains("finite"),
                "{e}"
            ),
            (_, Err(DistBuildError::Peer(p))) => assert_eq!(p.rank, 1),
            (r, other) => panic!("rank {r}: {other:?}"),
        }
    }
}

/// Every rank's error when `ranks` ranks build `g` (node parts all 0) into `parts` parts, each
/// rank's slice first changed by `spoil`.
fn every_rank_fails(
    g: &Graph,
    ranks: usize,
    parts: u32,
    spoil: impl Fn(usize, &mut GraphSlice) + Sync,
) -> Vec<String> {
    let results = LocalComm::run(ranks, |comm| {
        let mut slice = GraphSlice::cut(g, comm.rank(), ranks);
        spoil(comm.rank(), &mut slice);
        let nodes = slice_range(g.num_nodes as u64, ranks, comm.rank());
        let parts_of = std::vec![0u32; (nodes.end - nodes.start) as usize];
        build(
            &comm,
            slice,
            &parts_of,
            parts,
            "test",
            Normalization::Gcn,
            &mut StepBytes::default(),
            &mut || {},
            |_| Ok(()),
        )
        .map(|_| ())
    });
    results
        .into_iter()
        .map(|r| r.unwrap_err().to_string())
        .collect()
}

#[test]
fn fewer_parts_than_ranks_is_refused_everywhere() {
    let g = weighted_graph(10, &[(0, 1, 1), (1, 2, 1)], false, 2);
    for err in every_rank_fails(&g, 3, 2, |_, _| {}) {
        assert!(err.contains("at least as many parts as ranks"), "{err}");
    }
}

#[test]
fn ranks_that_read_graphs_of_other_sizes_all_fail() {
    let g = weighted_graph(12, &[(0, 1, 1), (1, 2, 1), (5, 9, 1)], false, 2);
    let spoil = |rank: usize, slice: &mut GraphSlice| {
        if rank == 1 {
            slice.num_edges += 1;
        }
    };
    for err in every_rank_fails(&g, 2, 2, spoil) {
        assert!(err.contains("replaced while the ranks read it"), "{err}");
    }
}

#[test]
fn exchanges_past_the_round_limit_run_in_rounds_with_the_same_result() {
    for ranks in 1..=3 {
        let results = LocalComm::run(ranks, |comm| {
            let me = comm.rank();
            // Rank r sends 7·r + 3·q + 1 elements to rank q, each naming sender, receiver, index.
            let counts: Vec<usize> = (0..ranks).map(|q| 7 * me + 3 * q + 1).collect();
            let send: Vec<u64> = (0..ranks)
                .flat_map(|q| (0..counts[q]).map(move |i| (me * 1000 + q * 100 + i) as u64))
                .collect();
            let whole = exchange_capped(&comm, &send, &counts, usize::MAX).unwrap();
            let gathered = all_gather_v_capped(&comm, &send, usize::MAX).unwrap();
            for cap in [1, 2, 5, 17] {
                assert_eq!(exchange_capped(&comm, &send, &counts, cap).unwrap(), whole);
                assert_eq!(all_gather_v_capped(&comm, &send, cap).unwrap(), gathered);
            }
            whole
        });
        for (me, (recv, recv_counts)) in results.into_iter().enumerate() {
            let expected: Vec<u64> = (0..ranks)
                .flat_map(|s| {
                    (0..7 * s + 3 * me + 1).map(move |i| (s * 1000 + me * 100 + i) as u64)
                })
                .collect();
            assert_eq!(recv, expected);
            assert_eq!(
                recv_counts,
                (0..ranks).map(|s| 7 * s + 3 * me + 1).collect::<Vec<_>>()
            );
        }
    }
}
