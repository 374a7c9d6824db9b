//! The input checks and the quality measure over the in-process communicator (the MPI launches
//! with PT-Scotch itself are in tests/mpirun.rs).
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use dist_comm::{Group, LocalComm};
use proptest::prelude::*;

use crate::check::check_local;
use crate::*;

/// A symmetric graph as per-vertex sorted neighbour lists, split over `ranks` contiguous
/// ranges: (vtxdist, per-rank (xadj, adjncy)).
type Split = (Vec<u64>, Vec<(Vec<u64>, Vec<u64>)>);

fn split(lists: &[Vec<u64>], ranks: usize) -> Split {
    let n = lists.len() as u64;
    let vtxdist: Vec<u64> = (0..=ranks as u64).map(|r| n * r / ranks as u64).collect();
    let shares = (0..ranks)
        .map(|r| {
            let (mut xadj, mut adjncy) = (vec![0u64], Vec::new());
            for list in &lists[vtxdist[r] as usize..vtxdist[r + 1] as usize] {
                adjncy.extend_from_slice(list);
                xadj.push(adjncy.len() as u64);
            }
            (xadj, adjncy)
        })
        .collect();
    (vtxdist, shares)
}

/// The cycle 0 - 1 - … - (n-1) - 0.
fn cycle(n: u64) -> Vec<Vec<u64>> {
    (0..n)
        .map(|u| {
            let mut l = vec![(u + 1) % n, (u + n - 1) % n];
            l.sort_unstable();
            l.dedup();
            l
        })
        .collect()
}

/// Runs `check` on `ranks` ranks of `lists`, rank `bad` spoiled by `spoil`; every rank's
/// result.
fn check_spoiled(
    lists: &[Vec<u64>],
    ranks: usize,
    bad: usize,
    spoil: impl Fn(&mut Vec<u64>, &mut Vec<u64>, &mut Vec<u64>, &mut Options) + Sync,
) -> Vec<Result<GraphTotals, PtScotchError>> {
    let (vtxdist, shares) = split(lists, ranks);
    LocalComm::run(ranks, |comm| {
        let (mut xadj, mut adjncy) = shares[comm.rank()].clone();
        let mut weights = vec![1u64; xadj.len() - 1];
        let mut options = Options::new(2);
        if comm.rank() == bad {
            spoil(&mut xadj, &mut adjncy, &mut weights, &mut options);
        }
        let graph = DistGraph::new(&vtxdist, &xadj, &adjncy).with_vertex_weights(&weights);
        check(&comm, &graph, &options)
    })
}

/// Every rank got the same error, of `kind`.
fn assert_all_fail(results: &[Result<GraphTotals, PtScotchError>], kind: InputErrorKind) {
    let first = results[0].as_ref().expect_err("rank 0 must fail");
    for r in results {
        assert_eq!(r.as_ref().err(), Some(first), "{results:?}");
    }
    match first {
        PtScotchError::Input { kind: k, .. } => assert_eq!(*k, kind, "{first}"),
        other => panic!("expected an input error, got {other}"),
    }
}

#[test]
fn a_symmetric_graph_passes_with_its_totals() {
    for ranks in 1..=4 {
        let results = check_spoiled(&cycle(10), ranks, usize::MAX, |_, _, _, _| {});
        for r in results {
            assert_eq!(
                r.unwrap(),
                GraphTotals {
                    vertices: 10,
                    arcs: 20,
                    vertex_weight: 10,
                    edge_weight: 20
                }
            );
        }
    }
}

#[test]
fn each_bad_input_fails_on_every_rank_with_its_kind() {
    type Spoil = fn(&mut Vec<u64>, &mut Vec<u64>, &mut Vec<u64>, &mut Options);
    let cases: [(Spoil, InputErrorKind); 12] = [
        (|x, _, _, _| x.swap(1, 2), InputErrorKind::Offsets),
        (|x, _, _, _| x[0] = 1, InputErrorKind::Offsets),
        (|x, _, _, _| x.push(99), InputErrorKind::Distribution),
        (|_, a, _, _| a[0] = 10, InputErrorKind::VertexId),
        (|_, a, _, _| a[0] = 5, InputErrorKind::SelfLoop),
        (|_, a, _, _| a[1] = a[0], InputErrorKind::DuplicateArc),
        (|_, a, _, _| a[0] = 0, InputErrorKind::Asymmetric),
        (|_, _, w, _| w[0] = 0, InputErrorKind::ZeroWeight),
        (
            |_, _, w, _| w.pop().map_or((), drop),
            InputErrorKind::WeightsLength,
        ),
        (|_, _, _, o| o.parts = 0, InputErrorKind::Parts),
        (
            |_, _, _, o| o.imbalance = f64::NAN,
            InputErrorKind::Imbalance,
        ),
        (|_, _, _, o| o.seed = 7, InputErrorKind::Disagreement),
    ];
    // Rank 1 of 2 holds vertices 5..10 of the 10-cycle; its first vertex 5 lists 4 and 6.
    for (spoil, kind) in cases {
        assert_all_fail(&check_spoiled(&cycle(10), 2, 1, spoil), kind);
    }
    // The lowest failing rank's error wins.
    let results = check_spoiled(&cycle(12), 3, 0, |x, _, _, _| x.swap(1, 2));
    match &results[2] {
        Err(PtScotchError::Input { rank, .. }) => assert_eq!(*rank, Some(0)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_edge_weight_that_differs_between_directions_is_asymmetric() {
    let (vtxdist, shares) = split(&cycle(8), 2);
    let results = LocalComm::run(2, |comm| {
        let (xadj, adjncy) = &shares[comm.rank()];
        let mut weights = vec![3u64; adjncy.len()];
        if comm.rank() == 1 {
            weights[0] = 4;
        }
        let graph = DistGraph::new(&vtxdist, xadj, adjncy).with_edge_weights(&weights);
        check(&comm, &graph, &Options::new(3))
    });
    assert_all_fail(&results, InputErrorKind::Asymmetric);
}

#[test]
fn sums_beyond_scotch_num_are_refused() {
    let results = check_spoiled(&cycle(10), 2, 1, |_, _, w, _| w[0] = i64::MAX as u64 - 9);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let results = check_spoiled(&cycle(10), 2, 1, |_, _, w, _| w[0] = i64::MAX as u64);
    assert_all_fail(&results, InputErrorKind::Overflow);
    // Each rank's sum fits, the total does not.
    let (vtxdist, shares) = split(&cycle(10), 2);
    let results = LocalComm::run(2, |comm| {
        let (xadj, adjncy) = &shares[comm.rank()];
        let mut weights = vec![1u64; xadj.len() - 1];
        weights[0] = i64::MAX as u64 / 2 + 1;
        let graph = DistGraph::new(&vtxdist, xadj, adjncy).with_vertex_weights(&weights);
        check(&comm, &graph, &Options::new(2))
    });
    assert_all_fail(&results, InputErrorKind::Overflow);
}

#[test]
fn options_are_checked_alone() {
    let (vtxdist, shares) = split(&cycle(6), 1);
    let (xadj, adjncy) = &shares[0];
    let graph = DistGraph::new(&vtxdist, xadj, adjncy);
    let with = |f: fn(&mut Options)| {
        let mut o = Options::new(2);
        f(&mut o);
        o
    };
    let kind =
        |o: Options, multiple: bool| check_local(&graph, 0, 1, &o, multiple).map_err(|e| e.kind());
    assert!(kind(Options::new(2), false).is_ok());
    assert!(kind(with(|o| o.imbalance = 1.0), false).is_ok());
    assert_eq!(
        kind(with(|o| o.imbalance = 0.99), false),
        Err(InputErrorKind::Imbalance)
    );
    assert_eq!(
        kind(with(|o| o.imbalance = f64::INFINITY), false),
        Err(InputErrorKind::Imbalance)
    );
    assert_eq!(
        kind(with(|o| o.threads = 0), true),
        Err(InputErrorKind::Threads)
    );
    assert_eq!(
        kind(with(|o| o.threads = 2), false),
        Err(InputErrorKind::Threads)
    );
    assert!(kind(with(|o| o.threads = 2), true).is_ok());
    assert_eq!(
        kind(with(|o| o.parts = 1 << 32), false),
        Err(InputErrorKind::Parts)
    );
    // Empty ranks are fine: vtxdist [0, 0, 6] gives rank 0 no vertices.
    let empty = DistGraph::new(&[0, 0, 6], &[0], &[]);
    assert!(check_local(&empty, 0, 2, &Options::new(2), false).is_ok());
    let kinds = (1..=13).map(InputErrorKind::from_code).collect::<Vec<_>>();
    assert!(kinds
        .iter()
        .enumerate()
        .all(|(i, k)| *k as i32 == i as i32 + 1));
}

/// A random symmetric graph without loops: `n` vertices, the given undirected pairs.
fn graph_from(n: u64, pairs: &[(u64, u64)]) -> Vec<Vec<u64>> {
    let mut lists = vec![Vec::new(); n as usize];
    for &(u, v) in pairs {
        let (u, v) = (u % n, v % n);
        if u != v {
            lists[u as usize].push(v);
            lists[v as usize].push(u);
        }
    }
    for l in &mut lists {
        l.sort_unstable();
        l.dedup();
    }
    lists
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `evaluate` against a serial count over the whole graph, for any split and parts.
    #[test]
    fn evaluate_matches_a_serial_count(
        n in 1u64..40,
        pairs in proptest::collection::vec((0u64..40, 0u64..40), 0..120),
        assign in proptest::collection::vec(0u32..5, 40),
        ranks in 1usize..5,
        k in 1usize..6,
    ) {
        let lists = graph_from(n, &pairs);
        let parts: Vec<u32> = (0..n as usize).map(|u| assign[u] % k as u32).collect();
        let mut cut = 0u64;
        let mut weights = vec![0u64; k];
        for (u, list) in lists.iter().enumerate() {
            weights[parts[u] as usize] += list.len() as u64 + 1;
            cut += list.iter().filter(|&&v| parts[v as usize] != parts[u]).count() as u64;
        }
        let (vtxdist, shares) = split(&lists, ranks);
        let results = LocalComm::run(ranks, |comm| {
            let r = comm.rank();
            let (xadj, adjncy) = &shares[r];
            let w: Vec<u64> = xadj.windows(2).map(|x| x[1] - x[0] + 1).collect();
            let graph = DistGraph::new(&vtxdist, xadj, adjncy).with_vertex_weights(&w);
            check(&comm, &graph, &Options::new(k))?;
            let mine = &parts[vtxdist[r] as usize..vtxdist[r + 1] as usize];
            evaluate(&comm, &graph, mine, k)
        });
        for q in results {
            let q = q.unwrap();
            prop_assert_eq!(q.edge_cut, cut / 2);
            prop_assert_eq!(q.cut_weight, cut / 2);
            prop_assert_eq!(&q.part_weights, &weights);
        }
    }
}

#[test]
fn evaluate_refuses_parts_that_do_not_fit_on_every_rank() {
    let (vtxdist, shares) = split(&cycle(6), 2);
    let results = LocalComm::run(2, |comm| {
        let (xadj, adjncy) = &shares[comm.rank()];
        let graph = DistGraph::new(&vtxdist, xadj, adjncy);
        let mut parts = vec![0u32; 3];
        if comm.rank() == 1 {
            parts[2] = 2;
        }
        evaluate(&comm, &graph, &parts, 2)
    });
    for r in &results {
        match r {
            Err(PtScotchError::Input { rank, kind, .. }) => {
                assert_eq!((*rank, *kind), (Some(1), InputErrorKind::Parts));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_linked_library_is_the_64_bit_build() {
    assert_eq!(num_size(), 8);
    assert_eq!(version().0, 7);
}

/// A star: vertex 0 joined to every other vertex (one hub, the rest of degree 1).
fn star(n: u64) -> Vec<Vec<u64>> {
    (0..n)
        .map(|u| if u == 0 { (1..n).collect() } else { vec![0] })
        .collect()
}

/// The strategy `Auto` chooses for `lists` over `ranks` ranks, checked equal on every rank.
fn auto_choice(lists: &[Vec<u64>], ranks: usize) -> crate::Strategy {
    let (vtxdist, shares) = split(lists, ranks);
    let chosen = LocalComm::run(ranks, |comm| {
        let (xadj, adjncy) = &shares[comm.rank()];
        let graph = DistGraph::new(&vtxdist, xadj, adjncy);
        choose_strategy(&comm, &graph, crate::Strategy::Auto).unwrap()
    });
    assert!(chosen.iter().all(|&s| s == chosen[0]), "{chosen:?}");
    chosen[0]
}

#[test]
fn auto_picks_quality_for_even_degrees_and_skewed_for_a_hub() {
    for ranks in 1..=3 {
        assert_eq!(auto_choice(&cycle(12), ranks), crate::Strategy::Quality);
        assert_eq!(auto_choice(&star(12), ranks), crate::Strategy::Skewed);
    }
    // Isolated vertices are left out: a cycle plus isolated vertices stays even.
    let mut lists = cycle(8);
    lists.extend(std::iter::repeat_n(Vec::new(), 8));
    assert_eq!(auto_choice(&lists, 2), crate::Strategy::Quality);
}

#[test]
fn a_named_strategy_is_kept() {
    let (vtxdist, shares) = split(&star(6), 1);
    let graph = DistGraph::new(&vtxdist, &shares[0].0, &shares[0].1);
    LocalComm::run(1, |comm| {
        for s in [
            crate::Strategy::Quality,
            crate::Strategy::Speed,
            crate::Strategy::Skewed,
        ] {
            assert_eq!(choose_strategy(&comm, &graph, s).unwrap(), s);
        }
    });
}

/// PT-Scotch parses the written-out strategy (no MPI needed: parsing only).
#[test]
fn the_skewed_strategy_string_parses() {
    for tolerance in [0.0, 0.03, 0.5] {
        let text = std::ffi::CString::new(crate::Strategy::skewed_string(tolerance)).unwrap();
        // SAFETY: SCOTCH_stratAlloc/Init/Exit/memFree in order on one strategy; the string is
        // NUL-terminated and outlives the call.
        let code = unsafe {
            let s = ffi::SCOTCH_stratAlloc();
            assert!(!s.is_null());
            assert_eq!(ffi::SCOTCH_stratInit(s), 0);
            let code = ffi::SCOTCH_stratDgraphMap(s, text.as_ptr());
            ffi::SCOTCH_stratExit(s);
            ffi::SCOTCH_memFree(s.cast());
            code
        };
        assert_eq!(code, 0, "{text:?}");
    }
    // A broken string is refused (the check above can fail).
    let bad = std::ffi::CString::new("r{sep=nonsense{").unwrap();
    // SAFETY: as above.
    let code = unsafe {
        let s = ffi::SCOTCH_stratAlloc();
        assert!(!s.is_null());
        assert_eq!(ffi::SCOTCH_stratInit(s), 0);
        let code = ffi::SCOTCH_stratDgraphMap(s, bad.as_ptr());
        ffi::SCOTCH_stratExit(s);
        ffi::SCOTCH_memFree(s.cast());
        code
    };
    assert_ne!(code, 0);
}
