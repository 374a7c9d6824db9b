//! The operator over the `local` communicator against a dense f64 reference of the reassembled
//! Â, for random graphs and partitions (empty halos and empty parts included), both schedules,
//! forward and backward; agreement failures on every rank; bit-identical reruns.
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use std::path::Path;

use crate::schedule::{HaloPlan, LayerTraffic, Precision, ScheduleKind, Traffic, Workspace};
use chunk_format::{encode, AlignedBuf, ChunkView};
use distspmm_prep::chunk::{reassemble, ChunkBuilder};
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::Partition;
use distspmm_sparse::sparse::{CsrOwned, DenseView, DenseViewMut};
use proptest::prelude::*;

use super::{abstain, predicted_traffic, DistSpmm, DistSpmmError, PartsMismatch};
use dist_comm::{Group, LocalComm};

/// The chunks of a graph (GCN-normalised Â) split by `part_of`.
pub(crate) fn chunks(
    n: usize,
    edges: &[(u32, u32)],
    part_of: &[u32],
    parts: u32,
) -> Vec<AlignedBuf> {
    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
    let a_hat = normalize::adjacency(n, &src, &dst, None, Normalization::Gcn).unwrap();
    let graph = Graph::from_edges(n, src, dst);
    let partition = Partition::new(parts, part_of.to_vec(), "test").unwrap();
    let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition).unwrap();
    (0..parts)
        .map(|p| encode(&builder.build(p).contents()).unwrap())
        .collect()
}

pub(crate) fn views(bufs: &[AlignedBuf]) -> Vec<ChunkView<'_>> {
    bufs.iter()
        .map(|b| ChunkView::parse(b.as_bytes()).unwrap())
        .collect()
}

/// Â in renumbered ids, reassembled from the chunks.
pub(crate) fn reassembled(views: &[ChunkView<'_>]) -> CsrOwned<f32> {
    let named: Vec<(&Path, &ChunkView<'_>)> =
        views.iter().map(|v| (Path::new("memory"), v)).collect();
    reassemble(&named).unwrap()
}

/// A value of row `g`, column `j` of a test matrix, exact in f32.
pub(crate) fn value(seed: u64, g: usize, j: usize) -> f32 {
    let h = (g as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((j as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(seed)
        .wrapping_mul(0x94D0_49BB_1331_11EB);
    ((h >> 40) % 2001) as f32 / 1000.0 - 1.0
}

/// What one rank computed: its rows of Y and dX (row-major) and its counters.
#[derive(Debug)]
struct RankResult {
    y: Vec<f32>,
    dx: Vec<f32>,
    forward: Traffic,
    backward: Traffic,
    predicted: LayerTraffic,
    workspace: Workspace,
    predicted_workspace: Workspace,
}

/// Runs forward and backward on every rank with `features` columns stored with leading
/// dimension `features + pad`, after a warm-up call with `warm_f` columns, the messages in
/// `precision`.
fn run(
    views: &[ChunkView<'_>],
    (kind, precision): (ScheduleKind, Precision),
    features: usize,
    pad: usize,
    warm_f: usize,
) -> Vec<Result<RankResult, DistSpmmError>> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::with_precision(&comm, views[p], kind, precision)?;
        let (n, first) = (op.local_rows(), offsets[p] as usize);
        let ld = features + pad;
        let padded = |seed| -> Vec<f32> {
            let mut m = vec![f32::NAN; n * ld];
            for i in 0..n {
                for j in 0..features {
                    m[i * ld + j] = value(seed, first + i, j);
                }
            }
            m
        };
        if warm_f > 0 {
            let (x, mut y) = (vec![0.5f32; n * warm_f], vec![0f32; n * warm_f]);
            op.forward(
                DenseView::new(&x[..], n, warm_f, warm_f).unwrap(),
                DenseViewMut::new(&mut y[..], n, warm_f, warm_f).unwrap(),
            )?;
            op.backward(
                DenseView::new(&x[..], n, warm_f, warm_f).unwrap(),
                DenseViewMut::new(&mut y[..], n, warm_f, warm_f).unwrap(),
            )?;
        }
        let (x, dy) = (padded(1), padded(2));
        let (mut y, mut dx) = (vec![f32::NAN; n * ld], vec![f32::NAN; n * ld]);
        op.forward(
            DenseView::new(&x[..], n, features, ld).unwrap(),
            DenseViewMut::new(&mut y[..], n, features, ld).unwrap(),
        )?;
        let forward = op.bytes_last_call();
        op.backward(
            DenseView::new(&dy[..], n, features, ld).unwrap(),
            DenseViewMut::new(&mut dx[..], n, features, ld).unwrap(),
        )?;
        let strip = |m: Vec<f32>| -> Vec<f32> {
            (0..n)
                .flat_map(|i| m[i * ld..i * ld + features].to_vec())
                .collect()
        };
        let features_max = features.max(warm_f);
        let predicted_workspace = match kind {
            ScheduleKind::Broadcast => {
                crate::schedule::BroadcastPlan::from_chunk(&views[p]).workspace(features_max)
            }
            ScheduleKind::Halo => HaloPlan::from_chunk(&views[p]).workspace(features_max),
        }
        .in_precision(precision);
        Ok(RankResult {
            y: strip(y),
            dx: strip(dx),
            forward,
            backward: op.bytes_last_call(),
            predicted: op.predicted_traffic(features),
            workspace: op.workspace(),
            predicted_workspace,
        })
    })
}

/// `Â·X` and `Âᵀ·dY` in f64 from the reassembled Â.
fn reference(a: &CsrOwned<f32>, features: usize) -> (Vec<f64>, Vec<f64>) {
    let n = a.nrows();
    let (mut y, mut dx) = (vec![0f64; n * features], vec![0f64; n * features]);
    for i in 0..n {
        let (cols, vals) = a.row(i);
        for (&k, &v) in cols.iter().zip(vals) {
            for j in 0..features {
                y[i * features + j] += f64::from(v) * f64::from(value(1, k as usize, j));
                dx[k as usize * features + j] += f64::from(v) * f64::from(value(2, i, j));
            }
        }
    }
    (y, dx)
}

pub(crate) fn assert_close(got: &[f32], want: &[f64], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}", what);
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (f64::from(g) - w).abs() <= 1e-5 * scale,
            "{what}[{k}] = {g}, reference {w}"
        );
    }
    Ok(())
}

fn graph_strategy() -> impl Strategy<Value = (usize, Vec<(u32, u32)>, Vec<u32>, u32)> {
    graphs(48, 5, 5)
}

/// Random graphs of fewer than `max_nodes` nodes and fewer than `edges_per_node` edges per
/// node, with any map into at most `max_parts` parts: `(n, edges, part_of, parts)`.
pub(crate) fn graphs(
    max_nodes: usize,
    max_parts: u32,
    edges_per_node: usize,
) -> impl Strategy<Value = (usize, Vec<(u32, u32)>, Vec<u32>, u32)> {
    (1usize..max_nodes, 1u32..=max_parts).prop_flat_map(move |(n, parts)| {
        let parts = parts.min(n as u32);
        (
            Just(n),
            proptest::collection::vec((0..n as u32, 0..n as u32), 0..edges_per_node * n),
            // Any map, so parts may be empty or have no halo at all.
            proptest::collection::vec(0..parts, n),
            Just(parts),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn both_schedules_match_the_dense_reference(
        (n, edges, part_of, parts) in graph_strategy(),
        features in 1usize..10,
        pad in 0usize..3,
        warm_f in 0usize..12,
    ) {
        let bufs = chunks(n, &edges, &part_of, parts);
        let views = views(&bufs);
        let (y_ref, dx_ref) = reference(&reassembled(&views), features);
        for kind in ScheduleKind::ALL {
            let (y, dx) = gathered(run(&views, (kind, Precision::F32), features, pad, warm_f))?;
            assert_close(&y, &y_ref, &format!("{kind} Y"))?;
            assert_close(&dx, &dx_ref, &format!("{kind} dX"))?;
        }
    }

    /// In bf16 and f16 every exchanged operand (a halo row, a broadcast block, a partial sum
    /// sent back) is rounded once to the format, `x·(1 + δ)` with `|δ| ≤ u` (u = 2⁻⁸ for
    /// bf16, 2⁻¹¹ for f16: the test's values are normal in both formats, or 0), and nothing
    /// else changes: so each result differs from the f32 operator's by at most `u` times the
    /// sum of the absolute values of its terms that cross ranks (`remote`), plus the f32
    /// rounding of the perturbed sums; a result without such terms is the f32 one to the bit.
    #[test]
    fn reduced_precision_messages_stay_within_the_format_bound(
        (n, edges, part_of, parts) in graph_strategy(),
        features in 1usize..10,
        pad in 0usize..3,
        warm_f in 0usize..12,
    ) {
        let bufs = chunks(n, &edges, &part_of, parts);
        let views = views(&bufs);
        let [remote_y, remote_dx, all_y, all_dx] = remote_sums(&views, features);
        for kind in ScheduleKind::ALL {
            let (y32, dx32) = gathered(run(&views, (kind, Precision::F32), features, pad, warm_f))?;
            for precision in [Precision::Bf16, Precision::F16] {
                let (y, dx) = gathered(run(&views, (kind, precision), features, pad, warm_f))?;
                // Per message an absolute half step below the format's normals (partial sums
                // can be that small); a result adds at most one message per other rank.
                let bound = (
                    precision.unit_roundoff(),
                    precision.subnormal_step() / 2.0 * f64::from(parts),
                );
                let what = format!("{kind} {precision}");
                within(&y, &y32, (&remote_y, &all_y), bound, &format!("{what} Y"))?;
                within(&dx, &dx32, (&remote_dx, &all_dx), bound, &format!("{what} dX"))?;
            }
        }
    }
}

/// Every rank's rows of Y and dX in rank order, after checking each rank's counted bytes and
/// workspace against the plan's.
fn gathered(
    results: Vec<Result<RankResult, DistSpmmError>>,
) -> Result<(Vec<f32>, Vec<f32>), TestCaseError> {
    let (mut y, mut dx) = (Vec::new(), Vec::new());
    for r in results {
        let r = r.unwrap();
        prop_assert_eq!(r.forward, r.predicted.forward);
        prop_assert_eq!(r.backward, r.predicted.backward);
        prop_assert_eq!(r.workspace, r.predicted_workspace);
        y.extend(r.y);
        dx.extend(r.dx);
    }
    Ok((y, dx))
}

/// For the test matrices of [`run`]: per entry of Y = Â·X and dX = Âᵀ·dY, the sum of the
/// absolute values of the terms whose two ends lie on different ranks, and of all terms.
fn remote_sums(views: &[ChunkView<'_>], features: usize) -> [Vec<f64>; 4] {
    let a = reassembled(views);
    let offsets = views[0].part_offsets();
    let part = |g: usize| offsets.partition_point(|&o| o as usize <= g) - 1;
    let n = a.nrows();
    let mut sums = [(); 4].map(|()| vec![0f64; n * features]);
    for i in 0..n {
        let (cols, vals) = a.row(i);
        for (&k, &v) in cols.iter().zip(vals) {
            let k = k as usize;
            let crosses = part(i) != part(k);
            for j in 0..features {
                let y = (f64::from(v) * f64::from(value(1, k, j))).abs();
                let dx = (f64::from(v) * f64::from(value(2, i, j))).abs();
                sums[2][i * features + j] += y;
                sums[3][k * features + j] += dx;
                if crosses {
                    sums[0][i * features + j] += y;
                    sums[1][k * features + j] += dx;
                }
            }
        }
    }
    sums
}

/// `got` within `u·remote + tiny + 2⁻²⁰·all` of the f32 operator's `want`, and equal to it bit
/// for bit where nothing crossed ranks.
fn within(
    got: &[f32],
    want: &[f32],
    (remote, all): (&[f64], &[f64]),
    (u, tiny): (f64, f64),
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}", what);
    for k in 0..got.len() {
        let (g, w) = (f64::from(got[k]), f64::from(want[k]));
        if remote[k] == 0.0 {
            prop_assert_eq!(
                got[k].to_bits(),
                want[k].to_bits(),
                "{}[{}]: nothing crossed",
                what,
                k
            );
        }
        let bound = u * remote[k] + tiny + all[k] / 1_048_576.0;
        prop_assert!(
            (g - w).abs() <= bound,
            "{what}[{k}] = {g}, f32 gives {w}: off by {} > {bound}",
            (g - w).abs()
        );
    }
    Ok(())
}

/// The edges of a ring of `n` nodes plus chords.
fn ring_edges(n: usize) -> Vec<(u32, u32)> {
    let mut edges = Vec::new();
    for v in 0..n as u32 {
        let w = (v + 1) % n as u32;
        let c = (v * 7 + 3) % n as u32;
        edges.extend([(v, w), (w, v), (v, c), (c, v)]);
    }
    edges
}

fn ring_parts(n: usize, parts: u32) -> Vec<u32> {
    (0..n).map(|v| (v * parts as usize / n) as u32).collect()
}

/// A ring of `n` nodes plus chords, split into `parts` contiguous ranges.
pub(crate) fn ring(n: usize, parts: u32) -> Vec<AlignedBuf> {
    chunks(n, &ring_edges(n), &ring_parts(n, parts), parts)
}

/// A chunk directory of a 30-node ring in `parts` parts at `dir`.
pub(crate) fn write_ring_dir(dir: &Path, parts: u32) {
    use chunk_format::dir::WriteOptions;
    use distspmm_prep::chunk::write_chunk_dir;
    let n = 30;
    let (src, dst): (Vec<u32>, Vec<u32>) = ring_edges(n).into_iter().unzip();
    let a_hat = normalize::adjacency(n, &src, &dst, None, Normalization::Gcn).unwrap();
    let graph = Graph::from_edges(n, src, dst);
    let partition = Partition::new(parts, ring_parts(n, parts), "test").unwrap();
    let builder = ChunkBuilder::new(&graph, a_hat.view(), &partition).unwrap();
    write_chunk_dir(dir, &builder, &WriteOptions::default()).unwrap();
}

#[test]
fn reruns_are_bit_identical() {
    let bufs = ring(3000, 4);
    let views = views(&bufs);
    for kind in ScheduleKind::ALL {
        let bits = |results: Vec<Result<RankResult, DistSpmmError>>| -> Vec<u32> {
            results
                .into_iter()
                .flat_map(|r| {
                    let r = r.unwrap();
                    r.y.into_iter().chain(r.dx).map(f32::to_bits)
                })
                .collect()
        };
        let first = bits(run(&views, (kind, Precision::F32), 24, 0, 0));
        for _ in 0..3 {
            assert_eq!(
                bits(run(&views, (kind, Precision::F32), 24, 0, 0)),
                first,
                "{kind}"
            );
        }
    }
}

#[test]
fn disconnected_parts_exchange_nothing_under_halo() {
    // Two triangles, one per part: no halo at all.
    let edges = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)];
    let bufs = chunks(6, &edges, &[0, 0, 0, 1, 1, 1], 2);
    let views = views(&bufs);
    for r in run(&views, (ScheduleKind::Halo, Precision::F32), 3, 1, 0) {
        let r = r.unwrap();
        assert_eq!(
            (r.forward, r.backward),
            (Traffic::default(), Traffic::default())
        );
    }
    for r in run(&views, (ScheduleKind::Broadcast, Precision::F32), 3, 1, 0) {
        assert_eq!(r.unwrap().forward.received, 3 * 3 * 4);
    }
}

/// Every rank's error message.
pub(crate) fn messages<T>(results: Vec<Result<T, DistSpmmError>>) -> Vec<String> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        })
        .collect()
}

#[test]
fn chunks_for_another_rank_count_fail_on_every_rank() {
    let bufs = ring(30, 3);
    let three = views(&bufs);
    let results = LocalComm::run(2, |comm| {
        DistSpmm::new(&comm, three[comm.rank()], ScheduleKind::Halo).map(|_| ())
    });
    for r in &results {
        assert_eq!(
            r,
            &Err(DistSpmmError::PartsMismatch(PartsMismatch {
                chunk_parts: 3,
                ranks: 2
            }))
        );
        assert!(r.as_ref().unwrap_err().is_collective());
    }
    // Chunks for 2 parts under 3 ranks: rank 2 has none and abstains.
    let bufs = ring(30, 2);
    let two = views(&bufs);
    let results = LocalComm::run(3, |comm| match two.get(comm.rank()) {
        Some(&v) => DistSpmm::new(&comm, v, ScheduleKind::Broadcast).map(|_| ()),
        None => Err(abstain(&comm, Some(2))),
    });
    let m = messages(results);
    assert!(m.iter().all(|x| x == &m[0]), "{m:?}");
    assert!(
        m[0].contains("made for 2 parts") && m[0].contains("3 ranks"),
        "{m:?}"
    );
}

#[test]
fn a_rank_without_a_chunk_fails_every_rank() {
    let bufs = ring(30, 3);
    let views = views(&bufs);
    let results = LocalComm::run(3, |comm| {
        if comm.rank() == 1 {
            Err(abstain(&comm, None))
        } else {
            DistSpmm::new(&comm, views[comm.rank()], ScheduleKind::Halo).map(|_| ())
        }
    });
    let m = messages(results);
    assert!(m.iter().all(|x| x == &m[0]), "{m:?}");
    assert!(m[0].contains("rank 1 has no chunk"), "{m:?}");
}

#[test]
fn chunks_of_two_runs_or_swapped_parts_fail_every_rank() {
    let a = ring(40, 2);
    let edges: Vec<(u32, u32)> = (0..39).flat_map(|v| [(v, v + 1), (v + 1, v)]).collect();
    let b = chunks(40, &edges, &(0..40).map(|v| v % 2).collect::<Vec<_>>(), 2);
    let (va, vb) = (views(&a), views(&b));
    let mixed = [va[0], vb[1]];
    let m = messages(LocalComm::run(2, |comm| {
        DistSpmm::new(&comm, mixed[comm.rank()], ScheduleKind::Halo).map(|_| ())
    }));
    assert!(
        m[0] == m[1] && m[0].contains("another partition run"),
        "{m:?}"
    );
    let swapped = [va[1], va[0]];
    let m = messages(LocalComm::run(2, |comm| {
        DistSpmm::new(&comm, swapped[comm.rank()], ScheduleKind::Halo).map(|_| ())
    }));
    assert!(m[0] == m[1] && m[0].contains("chunk of part 1"), "{m:?}");
    let m = messages(LocalComm::run(2, |comm| {
        let kind = [ScheduleKind::Halo, ScheduleKind::Broadcast][comm.rank()];
        DistSpmm::new(&comm, va[comm.rank()], kind).map(|_| ())
    }));
    assert!(m[0] == m[1] && m[0].contains("schedule"), "{m:?}");
}

#[test]
fn calls_that_disagree_fail_every_rank() {
    let bufs = ring(60, 2);
    let views = views(&bufs);
    let call = |f_of: fn(usize) -> usize, rows_extra: usize, backward_on: Option<usize>| {
        messages(LocalComm::run(2, |comm| {
            let p = comm.rank();
            let mut op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
            let f = f_of(p);
            let n = op.local_rows() + if p == 1 { rows_extra } else { 0 };
            let (x, mut y) = (vec![1f32; n * f], vec![0f32; n * f]);
            let x = DenseView::from_row_major(&x[..], n, f).unwrap();
            let y = DenseViewMut::from_row_major(&mut y[..], n, f).unwrap();
            if backward_on == Some(p) {
                op.backward(x, y)
            } else {
                op.forward(x, y)
            }
        }))
    };
    let m = call(|p| 2 + p, 0, None);
    assert!(
        m[0] == m[1] && m[0].contains("from 2 to 3 columns"),
        "{m:?}"
    );
    let m = call(|_| 4, 1, None);
    assert!(
        m[1].contains("X is 31 × 4 but part 1 owns 30 rows"),
        "{m:?}"
    );
    assert!(m[0].contains("another rank's operands"), "{m:?}");
    let m = call(|_| 4, 0, Some(0));
    assert!(
        m[0] == m[1] && m[0].contains("different operations"),
        "{m:?}"
    );
    // F = 0 is a valid call that moves nothing.
    let ok = call(|_| 0, 0, None);
    assert_eq!(ok, ["ok", "ok"]);
}

// The programs on the recording backend: the choreography the GPU backend relies on, and the
// ranks' programs against each other.

use crate::backend::{
    Accumulate, Buf, Dense, Instr, Lane, Matrix, Orient, Product, Region, Rows, Values,
};
use crate::mock::{record, Event};
use crate::{Kind, Op, Schedule};

/// The call whose buffers a program of `kind` runs in.
fn op_of(kind: Kind) -> Op {
    match kind {
        Kind::Forward => Op::Forward,
        Kind::Backward => Op::Backward,
        Kind::ForwardEdges => Op::SpmmValues,
        Kind::BackwardEdges => Op::SpmmValuesTranspose,
        Kind::Sddmm => Op::Sddmm,
    }
}

/// Every point-to-point message of a rank's recorded program, in program order:
/// (sends: (to, tag, rows), receives: (from, tag, rows)).
type Messages = (Vec<(usize, u16, usize)>, Vec<(usize, u16, usize)>);

fn messages_of(events: &[Event]) -> Messages {
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for e in events {
        if let Event::Posted {
            tag,
            sends: s,
            recvs: r,
        } = e
        {
            sends.extend(s.iter().map(|m| (m.peer, *tag, m.region.rows)));
            recvs.extend(r.iter().map(|m| (m.peer, *tag, m.region.rows)));
        }
    }
    (sends, recvs)
}

fn broadcasts_of(events: &[Event]) -> Vec<(usize, usize)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Broadcast { region, root } => Some((*root, region.rows)),
            _ => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// On every rank, both schedules and every program (the SpMM with the chunk's values and
    /// with per-edge values, both directions, and the SDDMM): no lane touches what the other
    /// lane touched without a join, the local lane is joined before the call ends, exchange
    /// bodies only read what they receive; every rank's sends to q are q's receives from it,
    /// in order; every rank runs the same broadcasts; the rows moved are the plan's.
    #[test]
    fn programs_keep_the_gpu_choreography(
        (n, edges, part_of, parts) in graph_strategy(),
    ) {
        let bufs = chunks(n, &edges, &part_of, parts);
        let views = views(&bufs);
        for kind in ScheduleKind::ALL {
            for op in Kind::ALL {
                let mut recorded = Vec::new();
                for v in &views {
                    let schedule = Schedule::new(v, kind).unwrap();
                    let r = record(schedule.program(op));
                    prop_assert!(r.hazards.is_empty(), "{kind} {op:?} rank {}: {:?}", v.part_id(), r.hazards);
                    let plan = schedule.program_traffic(op, 1);
                    let want = predicted_traffic(v, kind, 1);
                    let want = if op.is_forward() { want.forward } else { want.backward };
                    prop_assert_eq!(plan, want);
                    // Every region fits the buffers the operator reserves.
                    let rows = schedule.buffer_rows(op_of(op));
                    for e in &r.events {
                        if let Event::Spmm(Product { x: Dense::Region(g), .. })
                        | Event::Spmm(Product { y: Dense::Region(g), .. })
                        | Event::Sddmm { v: Dense::Region(g), .. } = e
                        {
                            prop_assert!(g.end() <= rows[g.buf as usize]);
                        }
                    }
                    recorded.push(r);
                }
                let all: Vec<Messages> = recorded.iter().map(|r| messages_of(&r.events)).collect();
                for p in 0..views.len() {
                    for q in 0..views.len() {
                        let sent: Vec<_> = all[p].0.iter().filter(|m| m.0 == q).map(|m| (m.1, m.2)).collect();
                        let got: Vec<_> = all[q].1.iter().filter(|m| m.0 == p).map(|m| (m.1, m.2)).collect();
                        prop_assert_eq!(sent, got, "{} {:?}: {} -> {}", kind, op, p, q);
                    }
                }
                let first = broadcasts_of(&recorded[0].events);
                for r in &recorded {
                    prop_assert_eq!(&broadcasts_of(&r.events), &first);
                }
            }
        }
    }
}

#[test]
fn the_halo_forward_overlaps_the_local_block_and_joins_before_adding() {
    let bufs = ring(30, 3);
    let views = views(&bufs);
    let chunk = &views[1];
    let schedule = Schedule::new(chunk, ScheduleKind::Halo).unwrap();
    let r = record(schedule.program(Kind::Forward));
    assert!(r.hazards.is_empty(), "{:?}", r.hazards);
    let plan = HaloPlan::from_chunk(chunk);
    let sent = plan.sent_rows() as usize;
    assert_eq!(
        r.events[0],
        Event::Pack(Rows::SendLists, Region::new(Buf::Packed, 0, sent))
    );
    let Event::Posted { sends, recvs, .. } = &r.events[1] else {
        panic!("{:?}", r.events);
    };
    // What is exchanged: each peer's send list, each source's receive list, packed in order.
    let peers: Vec<(usize, usize)> = sends.iter().map(|m| (m.peer, m.region.rows)).collect();
    let lists: Vec<(usize, usize)> = plan
        .send_peers()
        .map(|q| (q, plan.send_list(q).len()))
        .collect();
    assert_eq!(peers, lists);
    let sources: Vec<(usize, usize)> = recvs.iter().map(|m| (m.peer, m.region.rows)).collect();
    let expected: Vec<(usize, usize)> = (0..3)
        .filter(|&q| q != 1 && !plan.recv_list(q).is_empty())
        .map(|q| (q, plan.recv_list(q).len()))
        .collect();
    assert_eq!(sources, expected);
    assert!(recvs.iter().all(|m| m.region.buf == Buf::Halo));
    // The local block on the local lane, then the join, then the remote blocks in order on
    // the communication lane, reading the received regions.
    assert_eq!(
        r.events[2],
        Event::Spmm(Product {
            lane: Lane::Local,
            a: Matrix::Diagonal,
            orient: Orient::Plain,
            values: Values::Chunk,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Output
        })
    );
    assert_eq!(
        r.events[3],
        Event::Join {
            waiter: Lane::Comm,
            signaller: Lane::Local
        }
    );
    for (k, m) in recvs.iter().enumerate() {
        assert_eq!(
            r.events[4 + k],
            Event::Spmm(Product {
                lane: Lane::Comm,
                a: Matrix::Remote(k),
                orient: Orient::Plain,
                values: Values::Chunk,
                x: Dense::Region(m.region),
                acc: Accumulate::Add,
                y: Dense::Output
            })
        );
    }
    assert_eq!(r.events[4 + recvs.len()], Event::Completed);
}

#[test]
fn the_recorder_catches_a_missing_join_and_a_body_that_writes_a_buffer() {
    let bufs = ring(30, 3);
    let views = views(&bufs);
    let schedule = Schedule::new(&views[1], ScheduleKind::Halo).unwrap();
    for op in [
        Kind::Forward,
        Kind::Backward,
        Kind::ForwardEdges,
        Kind::BackwardEdges,
    ] {
        let mut program = schedule.program(op).clone();
        let Some(Instr::Exchange(ex)) = program.last_mut() else {
            panic!("the halo program ends with its exchange");
        };
        ex.body.retain(|i| !matches!(i, Instr::Join { .. }));
        let r = record(&program);
        assert!(
            r.hazards.iter().any(|h| h.contains("unordered")),
            "{op:?}: {:?}",
            r.hazards
        );
    }
    let mut program = schedule.program(Kind::Forward).clone();
    let Some(Instr::Exchange(ex)) = program.last_mut() else {
        panic!("the halo program ends with its exchange");
    };
    ex.body.push(Instr::Zero {
        into: Region::new(Buf::Packed, 0, 1),
    });
    let r = record(&program);
    assert!(
        r.hazards.iter().any(|h| h.contains("being exchanged")),
        "{:?}",
        r.hazards
    );
}

#[test]
fn the_recorder_checks_the_sddmm_and_per_edge_products() {
    let bufs = ring(30, 3);
    let views = views(&bufs);
    let schedule = Schedule::new(&views[1], ScheduleKind::Halo).unwrap();
    // The SDDMM: the diagonal block on the local lane while V's rows travel, the remote
    // blocks on the communication lane reading what they receive, the local lane joined last.
    let r = record(schedule.program(Kind::Sddmm));
    assert!(r.hazards.is_empty(), "{:?}", r.hazards);
    assert!(matches!(
        r.events[2],
        Event::Sddmm {
            lane: Lane::Local,
            block: Matrix::Diagonal,
            u: Dense::Left,
            v: Dense::Input
        }
    ));
    let mut program = schedule.program(Kind::Sddmm).clone();
    let Some(Instr::Exchange(ex)) = program.last_mut() else {
        panic!("the halo SDDMM ends with its exchange");
    };
    ex.body.retain(|i| !matches!(i, Instr::Join { .. }));
    let r = record(&program);
    assert!(
        r.hazards
            .iter()
            .any(|h| h.contains("local lane's work is joined")),
        "{:?}",
        r.hazards
    );
    // Two lanes writing one block's run of the edge operand, or an SDDMM into the chunk.
    let sample = |lane, out| Instr::Sddmm {
        lane,
        block: Matrix::Diagonal,
        u: Dense::Left,
        v: Dense::Input,
        out,
    };
    let r = record(&[
        sample(Lane::Local, Values::Edges),
        sample(Lane::Comm, Values::Edges),
        Instr::Join {
            waiter: Lane::Comm,
            signaller: Lane::Local,
        },
    ]);
    assert!(
        r.hazards.iter().any(|h| h.contains("unordered")),
        "{:?}",
        r.hazards
    );
    let r = record(&[sample(Lane::Comm, Values::Chunk)]);
    assert!(
        r.hazards.iter().any(|h| h.contains("chunk's values")),
        "{:?}",
        r.hazards
    );
    // A product reading a block's edge values on one lane while the other lane writes them.
    let r = record(&[
        sample(Lane::Local, Values::Edges),
        Instr::Spmm(Product {
            lane: Lane::Comm,
            a: Matrix::Diagonal,
            orient: Orient::Transposed,
            values: Values::Edges,
            x: Dense::Input,
            acc: Accumulate::Overwrite,
            y: Dense::Output,
        }),
        Instr::Join {
            waiter: Lane::Comm,
            signaller: Lane::Local,
        },
    ]);
    assert!(
        r.hazards.iter().any(|h| h.contains("unordered")),
        "{:?}",
        r.hazards
    );
}

/// The shell's call path over a recording engine: every per-edge call, grouped or not, hands
/// its engine the op's programs in order with the call's groups and F after reserving for
/// them, each program keeps the choreography, and the bytes are the plan's for F columns —
/// what the CPU operator counts for the same grouped call, and what the GPU engine (the same
/// shell, the same programs) runs.
#[test]
fn the_shell_hands_every_grouped_call_its_programs() {
    use crate::mock::{EngineLog, RecordingEngine};
    use crate::operator;

    let bufs = ring(24, 3);
    let views = views(&bufs);
    for kind in ScheduleKind::ALL {
        LocalComm::run(3, |comm| {
            let v = views[comm.rank()];
            let agreed =
                operator::agree_and_build(&comm, v, (kind, Precision::F32), |_, _, _| Ok(()))
                    .unwrap();
            let mut op = agreed.with_engine(|()| RecordingEngine {
                comm: &comm,
                log: EngineLog::default(),
            });
            let mut cpus: Vec<_> = Precision::ALL
                .into_iter()
                .map(|p| DistSpmm::with_precision(&comm, v, kind, p).unwrap())
                .collect();
            let (n, nnz) = (cpus[0].local_rows(), cpus[0].edge_count());
            // The SDDMMs' bytes, in f32 on every operator.
            let mut sddmm_bytes = Traffic::default();
            for groups in [1, 2, 3] {
                let f = 2 * groups;
                for call in [
                    Op::SpmmValues,
                    Op::SpmmValuesTranspose,
                    Op::Sddmm,
                    Op::SddmmBackward,
                ] {
                    let done = if call.programs().len() == 1 {
                        // SAFETY: the recording engine touches no memory.
                        unsafe { op.call_programs(call, groups, f, Ok(()), [()], ()) }
                    } else {
                        // SAFETY: as above.
                        unsafe { op.call_programs(call, groups, f, Ok(()), [(), ()], ()) }
                    };
                    done.unwrap();
                    assert_eq!(op.engine.log.reserved.pop(), Some((call, groups, f)));
                    let ran: Vec<_> = op.engine.log.executed.drain(..).collect();
                    let kinds: Vec<Kind> = ran.iter().map(|r| r.0).collect();
                    assert_eq!(kinds, call.programs());
                    for (k, g, cols, r) in &ran {
                        assert_eq!((*g, *cols), (groups, f));
                        assert!(r.hazards.is_empty(), "{kind} {k:?}: {:?}", r.hazards);
                    }
                    let plan = op.predicted_traffic(f);
                    if call == Op::Sddmm {
                        sddmm_bytes += plan.forward;
                    }
                    let want = match call {
                        Op::SpmmValues | Op::Sddmm => plan.forward,
                        Op::SpmmValuesTranspose => plan.backward,
                        _ => plan.forward + plan.backward,
                    };
                    assert_eq!(op.bytes_last_call(), want, "{kind} {call:?} G = {groups}");
                    // The CPU operator's grouped call moves the same values, in each
                    // precision's bytes (counted as they are handed to the communicator).
                    for cpu in &mut cpus {
                        let rows = vec![0.5f32; n * f];
                        let mut out = vec![0f32; n * f];
                        let mut more = vec![0f32; n * f];
                        let mut e = vec![0.25f32; groups * nnz];
                        let x = || DenseView::from_row_major(&rows[..], n, f).unwrap();
                        match call {
                            Op::SpmmValues => cpu.spmm_values_grouped(
                                groups,
                                &e,
                                x(),
                                DenseViewMut::from_row_major(&mut out[..], n, f).unwrap(),
                            ),
                            Op::SpmmValuesTranspose => cpu.spmm_values_transpose_grouped(
                                groups,
                                &e,
                                x(),
                                DenseViewMut::from_row_major(&mut out[..], n, f).unwrap(),
                            ),
                            Op::Sddmm => cpu.sddmm_grouped(groups, x(), x(), &mut e),
                            _ => cpu.sddmm_backward_grouped(
                                groups,
                                &e,
                                x(),
                                x(),
                                DenseViewMut::from_row_major(&mut out[..], n, f).unwrap(),
                                DenseViewMut::from_row_major(&mut more[..], n, f).unwrap(),
                            ),
                        }
                        .unwrap();
                        let p = cpu.precision();
                        // The SDDMM's messages stay f32 (`Op::message_precision`).
                        let wire = call.message_precision(p);
                        assert_eq!(wire == p, call != Op::Sddmm || p == Precision::F32);
                        assert_eq!(
                            cpu.bytes_last_call(),
                            want.in_precision(wire),
                            "CPU {kind} {p} {call:?} G = {groups}"
                        );
                    }
                }
            }
            let f32_totals = cpus[0].bytes_total();
            assert_eq!(op.bytes_total(), f32_totals);
            for cpu in &cpus[1..] {
                let t = cpu.bytes_total();
                let others = Traffic {
                    sent: f32_totals.forward.sent - sddmm_bytes.sent,
                    received: f32_totals.forward.received - sddmm_bytes.received,
                };
                assert_eq!(
                    t.forward,
                    others.in_precision(cpu.precision()) + sddmm_bytes
                );
                assert_eq!(
                    t.backward,
                    f32_totals.backward.in_precision(cpu.precision())
                );
                assert_eq!(t.forward_calls, f32_totals.forward_calls);
            }
        });
    }
}

#[test]
fn ranks_with_other_message_precisions_fail_together() {
    let bufs = ring(24, 2);
    let views = views(&bufs);
    let out = LocalComm::run(2, |comm| {
        let precision = if comm.rank() == 0 {
            Precision::F32
        } else {
            Precision::Bf16
        };
        DistSpmm::with_precision(&comm, views[comm.rank()], ScheduleKind::Halo, precision)
            .map(|_| ())
    });
    for r in out {
        let e = r.unwrap_err();
        assert!(matches!(e, DistSpmmError::Disagreement(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("rank 1 sends its messages in bf16 but rank 0 in f32"),
            "{e}"
        );
    }
}

/// The per-edge calls in bf16 and f16 against the f32 operator: `spmm_values` (rows of X
/// cross ranks), `spmm_values_transpose` (partial sums cross back) and the SDDMM (rows of V
/// cross ranks) each within `u` of the sum of absolute values of their crossing terms (here
/// bounded by all terms, for every schedule), and NaN and ±Inf in a row that crosses arrive
/// as NaN and ±Inf.
#[test]
fn per_edge_calls_in_reduced_precision_stay_within_the_format_bound() {
    let (n_all, parts, f) = (24, 3u32, 4);
    let bufs = ring(n_all, parts);
    let views = views(&bufs);
    for kind in ScheduleKind::ALL {
        let run_at = |precision: Precision, poison: bool| {
            LocalComm::run(parts as usize, |comm| {
                let p = comm.rank();
                let mut op = DistSpmm::with_precision(&comm, views[p], kind, precision).unwrap();
                let (n, nnz) = (op.local_rows(), op.edge_count());
                let first = views[0].part_offsets()[p] as usize;
                let mut x: Vec<f32> = (0..n * f).map(|k| value(3, first + k / f, k % f)).collect();
                if poison && p == 0 {
                    // Row 0 of rank 0 is referenced by rank 2 (the ring closes there).
                    x[0] = f32::NAN;
                    x[1] = f32::INFINITY;
                    x[2] = f32::NEG_INFINITY;
                }
                let e: Vec<f32> = (0..nnz).map(|k| value(4, k, 0)).collect();
                let xv = DenseView::from_row_major(&x[..], n, f).unwrap();
                let (mut y, mut dx, mut s) =
                    (vec![0f32; n * f], vec![0f32; n * f], vec![0f32; nnz]);
                op.spmm_values(
                    &e,
                    xv,
                    DenseViewMut::from_row_major(&mut y[..], n, f).unwrap(),
                )
                .unwrap();
                op.spmm_values_transpose(
                    &e,
                    xv,
                    DenseViewMut::from_row_major(&mut dx[..], n, f).unwrap(),
                )
                .unwrap();
                op.sddmm(xv, xv, &mut s).unwrap();
                let (ax, ex): (Vec<f64>, Vec<f64>) = (
                    x.iter().map(|v| f64::from(v.abs())).collect(),
                    e.iter().map(|v| f64::from(v.abs())).collect(),
                );
                (y, dx, s, ax, ex)
            })
        };
        let exact = run_at(Precision::F32, false);
        for precision in [Precision::Bf16, Precision::F16] {
            let u = precision.unit_roundoff();
            let got = run_at(precision, false);
            for (r, (g, w)) in got.iter().zip(&exact).enumerate() {
                // |x| ≤ 1 and |e| ≤ 1: a row's terms are bounded by its edges' count,
                // at most 5 per row in this ring (plus the self loop) and 3 ranks.
                let bound = |a: f32, b: f32, terms: f64| {
                    (f64::from(a) - f64::from(b)).abs() <= u * terms + 1e-6
                };
                for (a, b) in g.0.iter().zip(&w.0).chain(g.1.iter().zip(&w.1)) {
                    assert!(
                        bound(*a, *b, 6.0),
                        "{kind} {precision} rank {r}: {a} vs {b}"
                    );
                }
                for (a, b) in g.2.iter().zip(&w.2) {
                    assert!(
                        bound(*a, *b, f as f64),
                        "{kind} {precision} SDDMM rank {r}: {a} vs {b}"
                    );
                }
            }
            let poisoned = run_at(precision, true);
            // Node 23 (rank 2) aggregates node 0 (rank 0's first row).
            let y = &poisoned[2].0;
            let hit = y.chunks_exact(f).any(|row| {
                row[0].is_nan() && row[1].is_infinite() && row[2].is_infinite() && row[1] != row[2]
            });
            assert!(
                hit,
                "{kind} {precision}: NaN and ±Inf cross the wire as such: {y:?}"
            );
            let s = &poisoned[2].2;
            assert!(
                s.iter().any(|v| v.is_nan()),
                "{kind} {precision}: SDDMM sees the NaN"
            );
        }
    }
}
