//! The per-edge calls (`spmm_values`, `spmm_values_transpose`, `sddmm`, `sddmm_backward`, and
//! their grouped forms for G = 1..3) over the `local` communicator against dense f64
//! references of the reassembled pattern, for random graphs and partitions, P = 1..4, both
//! schedules; their bytes against the plans;
//! bit-identical reruns; GAT's additive attention as an SDDMM; finite differences of the
//! SDDMM → SpMM composition.
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use std::collections::HashMap;

use crate::schedule::{LayerTraffic, ScheduleKind, Traffic};
use chunk_format::ChunkView;
use dist_comm::{Group, LocalComm};
use distspmm_sparse::sparse::{CsrOwned, DenseView, DenseViewMut};
use proptest::prelude::*;

use chunk_format::{encode, AlignedBuf};
use distspmm_prep::chunk::ChunkBuilder;
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::Partition;

use crate::tests::{assert_close, chunks, graphs, messages, reassembled, ring, value, views};
use crate::{DistSpmm, DistSpmmError};

/// The value of the edge from global node `j` into global row `i`, exact in f32.
fn edge_value(seed: u64, i: usize, j: u64) -> f32 {
    value(seed, i, j as usize + 7919)
}

/// What one rank computed with the per-edge calls, in global row ids.
#[derive(Debug)]
struct EdgeResult {
    /// (global row, global source) of every position of its edge operand.
    edges: Vec<(usize, u64)>,
    /// `A_e·X`, `A_eᵀ·dY` (values seed 5), the SDDMM of U and V, its backward (values seed 6).
    y: Vec<f32>,
    dx: Vec<f32>,
    e: Vec<f32>,
    du: Vec<f32>,
    dv: Vec<f32>,
    /// Bytes of the four calls and the plan's prediction.
    bytes: [Traffic; 4],
    predicted: LayerTraffic,
}

fn view(m: &[f32], rows: usize, f: usize) -> DenseView<'_, f32> {
    DenseView::from_row_major(m, rows, f).unwrap()
}

fn out(m: &mut [f32], rows: usize, f: usize) -> DenseViewMut<'_, f32> {
    DenseViewMut::from_row_major(m, rows, f).unwrap()
}

fn run_edges(
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
    f: usize,
) -> Vec<Result<EdgeResult, DistSpmmError>> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], kind)?;
        let (n, first) = (op.local_rows(), offsets[p] as usize);
        let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
        assert_eq!(edges.len(), op.edge_count());
        for (k, &(i, s)) in edges.iter().enumerate() {
            assert_eq!(op.edge_position(i - first, s), Some(k), "edge {k}");
        }
        let matrix = |seed| -> Vec<f32> {
            (0..n * f)
                .map(|k| value(seed, first + k / f, k % f))
                .collect()
        };
        let per_edge =
            |seed| -> Vec<f32> { edges.iter().map(|&(i, j)| edge_value(seed, i, j)).collect() };
        let (x, dy, u, v) = (matrix(1), matrix(2), matrix(3), matrix(4));
        let (e, de) = (per_edge(5), per_edge(6));
        let nan = || vec![f32::NAN; n * f];
        let (mut y, mut dx, mut du, mut dv) = (nan(), nan(), nan(), nan());
        let mut s = vec![f32::NAN; op.edge_count()];
        op.spmm_values(&e, view(&x, n, f), out(&mut y, n, f))?;
        let b0 = op.bytes_last_call();
        op.spmm_values_transpose(&e, view(&dy, n, f), out(&mut dx, n, f))?;
        let b1 = op.bytes_last_call();
        op.sddmm(view(&u, n, f), view(&v, n, f), &mut s)?;
        let b2 = op.bytes_last_call();
        let (du_view, dv_view) = (out(&mut du, n, f), out(&mut dv, n, f));
        op.sddmm_backward(&de, view(&u, n, f), view(&v, n, f), du_view, dv_view)?;
        let b3 = op.bytes_last_call();
        Ok(EdgeResult {
            edges,
            y,
            dx,
            e: s,
            du,
            dv,
            bytes: [b0, b1, b2, b3],
            predicted: op.predicted_traffic(f),
        })
    })
}

/// The dense references: (Y, dX, E by edge, dU, dV) in f64.
#[allow(clippy::type_complexity)]
fn reference(
    a: &CsrOwned<f32>,
    f: usize,
) -> (
    Vec<f64>,
    Vec<f64>,
    HashMap<(usize, u64), f64>,
    Vec<f64>,
    Vec<f64>,
) {
    let n = a.nrows();
    let z = || vec![0f64; n * f];
    let (mut y, mut dx, mut du, mut dv) = (z(), z(), z(), z());
    let mut e = HashMap::new();
    let m = |seed, g: usize, c| f64::from(value(seed, g, c));
    for i in 0..n {
        for &j in a.row(i).0 {
            let (j, jg) = (j as usize, u64::from(j));
            let (w, w6) = (
                f64::from(edge_value(5, i, jg)),
                f64::from(edge_value(6, i, jg)),
            );
            let mut dot = 0f64;
            for c in 0..f {
                y[i * f + c] += w * m(1, j, c);
                dx[j * f + c] += w * m(2, i, c);
                dot += m(3, i, c) * m(4, j, c);
                du[i * f + c] += w6 * m(4, j, c);
                dv[j * f + c] += w6 * m(3, i, c);
            }
            e.insert((i, jg), dot);
        }
    }
    (y, dx, e, du, dv)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Every per-edge call on every rank against the dense formulas, both schedules; the edge
    /// operand covers the pattern exactly once, positions round-trip; bytes are the plan's.
    #[test]
    fn per_edge_calls_match_the_dense_reference(
        (n, edges, part_of, parts) in graphs(40, 4, 4),
        f in 1usize..7,
    ) {
        let bufs = chunks(n, &edges, &part_of, parts);
        let views = views(&bufs);
        let a = reassembled(&views);
        let (y_ref, dx_ref, e_ref, du_ref, dv_ref) = reference(&a, f);
        for kind in ScheduleKind::ALL {
            let (mut y, mut dx, mut du, mut dv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut seen = 0;
            for r in run_edges(&views, kind, f) {
                let r = r.unwrap();
                let pr = r.predicted;
                prop_assert_eq!(r.bytes, [pr.forward, pr.backward, pr.forward, pr.forward + pr.backward]);
                for (k, edge) in r.edges.iter().enumerate() {
                    let want = e_ref.get(edge);
                    prop_assert!(want.is_some(), "{kind}: {edge:?} is not an edge of Â");
                    let want = *want.unwrap();
                    prop_assert!((f64::from(r.e[k]) - want).abs() <= 1e-5 * (1.0 + want.abs()));
                }
                seen += r.edges.len();
                y.extend(r.y);
                dx.extend(r.dx);
                du.extend(r.du);
                dv.extend(r.dv);
            }
            prop_assert_eq!(seen, a.nnz(), "{} covers every stored entry once", kind);
            assert_close(&y, &y_ref, &format!("{kind} A_e·X"))?;
            assert_close(&dx, &dx_ref, &format!("{kind} A_eᵀ·dY"))?;
            assert_close(&du, &du_ref, &format!("{kind} dU"))?;
            assert_close(&dv, &dv_ref, &format!("{kind} dV"))?;
        }
    }
}

/// What one rank computed with the grouped per-edge calls (G groups of C columns), in global
/// row ids; with one group also the single calls' results, which must be the same bits.
#[derive(Debug)]
struct GroupedResult {
    edges: Vec<(usize, u64)>,
    y: Vec<f32>,
    dx: Vec<f32>,
    /// G runs of one value per edge.
    e: Vec<f32>,
    du: Vec<f32>,
    dv: Vec<f32>,
    bytes: [Traffic; 4],
    predicted: LayerTraffic,
}

/// The per-edge values of group g of the call with seed `seed`.
fn group_seed(seed: u64, g: usize) -> u64 {
    seed + 100 * g as u64
}

fn run_grouped(
    views: &[ChunkView<'_>],
    kind: ScheduleKind,
    groups: usize,
    c: usize,
) -> Vec<Result<GroupedResult, DistSpmmError>> {
    let offsets = views[0].part_offsets();
    let f = groups * c;
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], kind)?;
        let (n, first, nnz) = (op.local_rows(), offsets[p] as usize, op.edge_count());
        let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
        let matrix = |seed| -> Vec<f32> {
            (0..n * f)
                .map(|k| value(seed, first + k / f, k % f))
                .collect()
        };
        let per_edge = |seed| -> Vec<f32> {
            (0..groups)
                .flat_map(|g| edges.iter().map(move |&(i, j)| (g, i, j)))
                .map(|(g, i, j)| edge_value(group_seed(seed, g), i, j))
                .collect()
        };
        let (x, dy, u, v) = (matrix(1), matrix(2), matrix(3), matrix(4));
        let (e, de) = (per_edge(5), per_edge(6));
        let nan = || vec![f32::NAN; n * f];
        let (mut y, mut dx, mut du, mut dv) = (nan(), nan(), nan(), nan());
        let mut s = vec![f32::NAN; groups * nnz];
        op.spmm_values_grouped(groups, &e, view(&x, n, f), out(&mut y, n, f))?;
        let b0 = op.bytes_last_call();
        op.spmm_values_transpose_grouped(groups, &e, view(&dy, n, f), out(&mut dx, n, f))?;
        let b1 = op.bytes_last_call();
        op.sddmm_grouped(groups, view(&u, n, f), view(&v, n, f), &mut s)?;
        let b2 = op.bytes_last_call();
        let (du_view, dv_view) = (out(&mut du, n, f), out(&mut dv, n, f));
        op.sddmm_backward_grouped(
            groups,
            &de,
            view(&u, n, f),
            view(&v, n, f),
            du_view,
            dv_view,
        )?;
        let b3 = op.bytes_last_call();
        // Each group's SDDMM is the single SDDMM over its columns, bit for bit.
        for g in 0..groups {
            let cols = g * c..(g + 1) * c;
            let mut single = vec![f32::NAN; nnz];
            let (ug, vg) = (view(&u, n, f), view(&v, n, f));
            op.sddmm(
                ug.column_slice(cols.clone()).unwrap(),
                vg.column_slice(cols).unwrap(),
                &mut single,
            )?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s[g * nnz..(g + 1) * nnz]), bits(&single), "group {g}");
        }
        if groups == 1 {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (mut y1, mut dx1, mut du1, mut dv1) = (nan(), nan(), nan(), nan());
            op.spmm_values(&e, view(&x, n, f), out(&mut y1, n, f))?;
            op.spmm_values_transpose(&e, view(&dy, n, f), out(&mut dx1, n, f))?;
            let (du_view, dv_view) = (out(&mut du1, n, f), out(&mut dv1, n, f));
            op.sddmm_backward(&de, view(&u, n, f), view(&v, n, f), du_view, dv_view)?;
            for (grouped, single) in [(&y, &y1), (&dx, &dx1), (&du, &du1), (&dv, &dv1)] {
                assert_eq!(bits(grouped), bits(single), "one group is the single call");
            }
        }
        Ok(GroupedResult {
            edges,
            y,
            dx,
            e: s,
            du,
            dv,
            bytes: [b0, b1, b2, b3],
            predicted: op.predicted_traffic(f),
        })
    })
}

/// The grouped dense references in f64: (Y, dX, E by edge and group, dU, dV), group g's
/// values of seed `s` those of seed `group_seed(s, g)`.
#[allow(clippy::type_complexity)]
fn reference_grouped(
    a: &CsrOwned<f32>,
    groups: usize,
    c: usize,
) -> (
    Vec<f64>,
    Vec<f64>,
    HashMap<(usize, u64), Vec<f64>>,
    Vec<f64>,
    Vec<f64>,
) {
    let (n, f) = (a.nrows(), groups * c);
    let z = || vec![0f64; n * f];
    let (mut y, mut dx, mut du, mut dv) = (z(), z(), z(), z());
    let mut e = HashMap::new();
    let m = |seed, g: usize, c| f64::from(value(seed, g, c));
    for i in 0..n {
        for &j in a.row(i).0 {
            let (j, jg) = (j as usize, u64::from(j));
            let mut dots = vec![0f64; groups];
            for (g, dot) in dots.iter_mut().enumerate() {
                let w = f64::from(edge_value(group_seed(5, g), i, jg));
                let w6 = f64::from(edge_value(group_seed(6, g), i, jg));
                for col in g * c..(g + 1) * c {
                    y[i * f + col] += w * m(1, j, col);
                    dx[j * f + col] += w * m(2, i, col);
                    *dot += m(3, i, col) * m(4, j, col);
                    du[i * f + col] += w6 * m(4, j, col);
                    dv[j * f + col] += w6 * m(3, i, col);
                }
            }
            e.insert((i, jg), dots);
        }
    }
    (y, dx, e, du, dv)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The grouped per-edge calls for G = 1, 2, 3 on every rank against the dense formulas,
    /// both schedules, any P up to 4: each group's SDDMM the single one's bits, one group the
    /// single calls' bits, the bytes the plan's for F = G·C.
    #[test]
    fn grouped_per_edge_calls_match_the_dense_reference(
        (n, edges, part_of, parts) in graphs(40, 4, 4),
        groups in 1usize..4,
        c in 1usize..4,
    ) {
        let bufs = chunks(n, &edges, &part_of, parts);
        let views = views(&bufs);
        let a = reassembled(&views);
        let (y_ref, dx_ref, e_ref, du_ref, dv_ref) = reference_grouped(&a, groups, c);
        for kind in ScheduleKind::ALL {
            let (mut y, mut dx, mut du, mut dv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for r in run_grouped(&views, kind, groups, c) {
                let r = r.unwrap();
                let pr = r.predicted;
                prop_assert_eq!(r.bytes, [pr.forward, pr.backward, pr.forward, pr.forward + pr.backward]);
                let nnz = r.edges.len();
                for (k, edge) in r.edges.iter().enumerate() {
                    let want = e_ref.get(edge);
                    prop_assert!(want.is_some(), "{kind}: {edge:?} is not an edge of Â");
                    for (g, &want) in want.unwrap().iter().enumerate() {
                        let got = f64::from(r.e[g * nnz + k]);
                        prop_assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{kind}: group {g}");
                    }
                }
                y.extend(r.y);
                dx.extend(r.dx);
                du.extend(r.du);
                dv.extend(r.dv);
            }
            assert_close(&y, &y_ref, &format!("{kind} G = {groups}: A_e·X"))?;
            assert_close(&dx, &dx_ref, &format!("{kind} G = {groups}: A_eᵀ·dY"))?;
            assert_close(&du, &du_ref, &format!("{kind} G = {groups}: dU"))?;
            assert_close(&dv, &dv_ref, &format!("{kind} G = {groups}: dV"))?;
        }
    }
}

#[test]
fn grouped_calls_refuse_groups_that_do_not_fit_on_every_rank() {
    let bufs = ring(60, 2);
    let views = views(&bufs);
    // Rank 1 gives 3 columns in 2 groups.
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let n = op.local_rows();
        let f = if p == 1 { 3 } else { 4 };
        let e = vec![0f32; 2 * op.edge_count()];
        let (x, mut y) = (vec![1f32; n * f], vec![0f32; n * f]);
        op.spmm_values_grouped(2, &e, view(&x, n, f), out(&mut y, n, f))
    }));
    assert!(
        m[1].contains("3 columns do not split into 2 groups"),
        "{m:?}"
    );
    assert!(m[0].contains("another rank's operands"), "{m:?}");
    // Rank 0 gives one run where two are due; zero groups on rank 1.
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], ScheduleKind::Broadcast)?;
        let (n, f) = (op.local_rows(), 4);
        let mut e = vec![0f32; op.edge_count()];
        let u = vec![1f32; n * f];
        op.sddmm_grouped(2 - 2 * p, view(&u, n, f), view(&u, n, f), &mut e)
    }));
    assert!(
        m[0].contains("E holds") && m[0].contains("2 groups"),
        "{m:?}"
    );
    assert!(m[1].contains("into 0 groups"), "{m:?}");
    // The same call with different group counts: every rank fails alike.
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let (n, f, groups) = (op.local_rows(), 4, 1 + p);
        let e = vec![0f32; groups * op.edge_count()];
        let (x, mut y) = (vec![1f32; n * f], vec![0f32; n * f]);
        op.spmm_values_transpose_grouped(groups, &e, view(&x, n, f), out(&mut y, n, f))
    }));
    assert!(
        m[0] == m[1] && m[0].contains("different operations"),
        "{m:?}"
    );
}

#[test]
fn per_edge_reruns_are_bit_identical() {
    let bufs = ring(3000, 4);
    let views = views(&bufs);
    for kind in ScheduleKind::ALL {
        let bits = || -> Vec<u32> {
            run_edges(&views, kind, 19)
                .into_iter()
                .flat_map(|r| {
                    let r = r.unwrap();
                    [r.y, r.dx, r.e, r.du, r.dv]
                        .into_iter()
                        .flatten()
                        .map(f32::to_bits)
                })
                .collect()
        };
        let first = bits();
        for _ in 0..2 {
            assert_eq!(bits(), first, "{kind}");
        }
    }
}

/// The CPU engine keeps the CSC order of one group's values for the next transposed call over
/// the same bits: every call still gives what a fresh operator gives, whether the values repeat,
/// changed in place (one entry, or a zero's sign), or a grouped call came in between.
#[test]
fn transposed_calls_over_repeated_or_changed_values_match_a_fresh_operator() {
    let bufs = ring(3000, 4);
    let views = views(&bufs);
    let f = 5;
    for kind in ScheduleKind::ALL {
        let results = LocalComm::run(views.len(), |comm| {
            let p = comm.rank();
            let mut op = DistSpmm::new(&comm, views[p], kind)?;
            let (n, first) = (op.local_rows(), views[0].part_offsets()[p] as usize);
            let dy: Vec<f32> = (0..n * f).map(|k| value(2, first + k / f, k % f)).collect();
            let mut e: Vec<f32> = op
                .edges()
                .map(|(r, s)| edge_value(5, first + r, s))
                .collect();
            let transposed = |op: &mut DistSpmm<_, _>, e: &[f32]| {
                let mut dx = vec![f32::NAN; n * f];
                op.spmm_values_transpose(e, view(&dy, n, f), out(&mut dx, n, f))
                    .map(|()| dx.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
            };
            let mut checks = Vec::new();
            for step in 0..4 {
                match step {
                    1 => e[0] += 1.0,
                    2 => {
                        let twice: Vec<f32> = e.iter().chain(&e).copied().collect();
                        let mut dx = vec![0.0f32; n * 2 * f];
                        op.spmm_values_transpose_grouped(
                            2,
                            &twice,
                            view(&[dy.clone(), dy.clone()].concat()[..n * 2 * f], n, 2 * f),
                            out(&mut dx, n, 2 * f),
                        )?;
                    }
                    3 => {
                        let last = e.len() - 1;
                        e[last] = -e[last];
                    }
                    _ => {}
                }
                let got = transposed(&mut op, &e)?;
                let again = transposed(&mut op, &e)?;
                let want = transposed(&mut DistSpmm::new(&comm, views[p], kind)?, &e)?;
                checks.push((step, got == want && again == want));
            }
            Ok::<_, DistSpmmError>(checks)
        });
        for r in results {
            for (step, ok) in r.unwrap() {
                assert!(ok, "{kind}: step {step}");
            }
        }
    }
}

/// GAT's additive attention `e_ij = s_i + t_j` is the SDDMM with F = 2, `U_i = [s_i, 1]`,
/// `V_j = [1, t_j]`: exactly, on every edge, whatever the rank of `j`.
#[test]
fn gat_attention_logits_are_an_sddmm_of_width_two() {
    let bufs = ring(90, 3);
    let views = views(&bufs);
    let offsets = views[0].part_offsets();
    let (s, t) = (|i: usize| value(7, i, 0), |j: usize| value(8, j, 0));
    for kind in ScheduleKind::ALL {
        let results = LocalComm::run(3, |comm| {
            let p = comm.rank();
            let mut op = DistSpmm::new(&comm, views[p], kind)?;
            let (n, first) = (op.local_rows(), offsets[p] as usize);
            let u: Vec<f32> = (0..n).flat_map(|i| [s(first + i), 1.0]).collect();
            let v: Vec<f32> = (0..n).flat_map(|j| [1.0, t(first + j)]).collect();
            let mut e = vec![f32::NAN; op.edge_count()];
            op.sddmm(
                DenseView::from_row_major(&u[..], n, 2).unwrap(),
                DenseView::from_row_major(&v[..], n, 2).unwrap(),
                &mut e,
            )?;
            let remote = op
                .edges()
                .filter(|&(_, src)| !(offsets[p]..offsets[p + 1]).contains(&src))
                .count();
            let edges: Vec<(usize, u64)> = op.edges().map(|(r, src)| (first + r, src)).collect();
            Ok::<_, DistSpmmError>((edges, e, remote))
        });
        let mut remote = 0;
        for r in results {
            let (edges, e, far) = r.unwrap();
            remote += far;
            for (&(i, j), &got) in edges.iter().zip(&e) {
                let want = s(i) + t(j as usize);
                assert_eq!(got.to_bits(), want.to_bits(), "{kind}: e[{i}][{j}]");
            }
        }
        assert!(remote > 0, "the ring's chords cross parts");
    }
}

/// The gradient of `L = Σ W ∘ (A_E·X)` with `E = sddmm(U, V)`, composed from the
/// distributed calls (`dE = sddmm(dY, X)`, `dX = A_Eᵀ·dY`, `(dU, dV) = sddmm_backward(dE)`),
/// against central differences of L. L is linear in each coordinate, so the differences are
/// exact up to rounding.
#[test]
fn the_sddmm_spmm_composition_has_the_finite_difference_gradient() {
    let n = 9;
    let mut edges: Vec<(u32, u32)> = (0..n as u32).map(|i| (i, (i + 1) % n as u32)).collect();
    edges.extend([(0, 4), (5, 2), (7, 3), (3, 3)]);
    let part_of: Vec<u32> = (0..n as u32).map(|i| i % 2).collect();
    let bufs = chunks(n, &edges, &part_of, 2);
    let views = views(&bufs);
    let offsets = views[0].part_offsets();
    let f = 3;
    let global = |seed| -> Vec<f32> { (0..n * f).map(|k| value(seed, k / f, k % f)).collect() };
    let w = global(20);
    // Loss and gradients (dU, dV, dX) of the whole graph, rows in renumbered order.
    let evaluate = |kind: ScheduleKind, u: &[f32], v: &[f32], x: &[f32]| {
        let results = LocalComm::run(2, |comm| {
            let p = comm.rank();
            let mut op = DistSpmm::new(&comm, views[p], kind)?;
            let (lo, hi) = (offsets[p] as usize * f, offsets[p + 1] as usize * f);
            let rows = op.local_rows();
            let mine = |m: &[f32]| m[lo..hi].to_vec();
            let (u, v, x, w) = (mine(u), mine(v), mine(x), mine(&w));
            let zeros = || vec![0f32; rows * f];
            let mut e = vec![0f32; op.edge_count()];
            op.sddmm(view(&u, rows, f), view(&v, rows, f), &mut e)?;
            let mut y = zeros();
            op.spmm_values(&e, view(&x, rows, f), out(&mut y, rows, f))?;
            let loss: f64 = y
                .iter()
                .zip(&w)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            // dY = W.
            let mut de = vec![0f32; op.edge_count()];
            op.sddmm(view(&w, rows, f), view(&x, rows, f), &mut de)?;
            let (mut dx, mut du, mut dv) = (zeros(), zeros(), zeros());
            op.spmm_values_transpose(&e, view(&w, rows, f), out(&mut dx, rows, f))?;
            let (du_view, dv_view) = (out(&mut du, rows, f), out(&mut dv, rows, f));
            op.sddmm_backward(&de, view(&u, rows, f), view(&v, rows, f), du_view, dv_view)?;
            Ok::<_, DistSpmmError>((loss, du, dv, dx))
        });
        let (mut loss, mut grads) = (0f64, [Vec::new(), Vec::new(), Vec::new()]);
        for r in results {
            let (l, du, dv, dx) = r.unwrap();
            loss += l;
            grads[0].extend(du);
            grads[1].extend(dv);
            grads[2].extend(dx);
        }
        (loss, grads)
    };
    for kind in ScheduleKind::ALL {
        let inputs = [global(21), global(22), global(23)];
        let (_, grads) = evaluate(kind, &inputs[0], &inputs[1], &inputs[2]);
        let h = 0.25f32;
        for (which, grad) in grads.iter().enumerate() {
            for k in 0..n * f {
                let at = |delta: f32| {
                    let mut moved = inputs.clone();
                    moved[which][k] += delta;
                    evaluate(kind, &moved[0], &moved[1], &moved[2]).0
                };
                let fd = (at(h) - at(-h)) / (2.0 * f64::from(h));
                let g = f64::from(grad[k]);
                assert!(
                    (fd - g).abs() <= 1e-3 * (1.0 + g.abs()),
                    "{kind}: d/d{}[{k}] = {g}, finite difference {fd}",
                    ["U", "V", "X"][which]
                );
            }
        }
    }
}

#[test]
fn an_edge_operand_of_the_wrong_length_fails_every_rank() {
    let bufs = ring(60, 2);
    let views = views(&bufs);
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let (n, f) = (op.local_rows(), 2);
        let extra = usize::from(p == 1);
        let mut e = vec![0f32; op.edge_count() + extra];
        let u = vec![1f32; n * f];
        op.sddmm(
            DenseView::from_row_major(&u[..], n, f).unwrap(),
            DenseView::from_row_major(&u[..], n, f).unwrap(),
            &mut e,
        )
    }));
    assert!(
        m[1].contains("sddmm on rank 1: E holds") && m[1].contains("non-zeros"),
        "{m:?}"
    );
    assert!(m[0].contains("another rank's operands"), "{m:?}");
    // A per-edge call on one rank and a plain one on the other: every rank fails.
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let mut op = DistSpmm::new(&comm, views[p], ScheduleKind::Broadcast)?;
        let (n, f) = (op.local_rows(), 2);
        let (x, mut y) = (vec![1f32; n * f], vec![0f32; n * f]);
        let x = DenseView::from_row_major(&x[..], n, f).unwrap();
        let y = DenseViewMut::from_row_major(&mut y[..], n, f).unwrap();
        if p == 0 {
            let e = vec![1f32; op.edge_count()];
            op.spmm_values(&e, x, y)
        } else {
            op.forward(x, y)
        }
    }));
    assert!(
        m[0] == m[1] && m[0].contains("different operations"),
        "{m:?}"
    );
}

/// The layout: diagonal block first, then the remote blocks in increasing source part, each
/// the chunk's CSR order; the transposed product's permutation is 4 bytes per non-zero.
#[test]
fn the_edge_layout_puts_the_diagonal_block_first() {
    let bufs = ring(30, 3);
    let views = views(&bufs);
    for chunk in &views {
        let layout = super::EdgeLayout::new(chunk);
        let blocks = layout.blocks();
        assert_eq!(blocks[0].source, chunk.part_id());
        assert_eq!(blocks[0].first, 0);
        assert_eq!(blocks[0].len, chunk.diagonal_block().nnz());
        assert!(blocks[1..].windows(2).all(|w| w[0].source < w[1].source));
        let mut next = 0;
        for b in blocks {
            assert_eq!(b.first, next);
            next += b.len;
        }
        assert_eq!(layout.len(), next);
        let order = super::CscOrder::new(chunk, &layout).unwrap();
        assert_eq!(order.bytes(), 4 * layout.len() as u64);
        // The permutation reads every CSR value once per block: a permutation.
        for (k, eb) in blocks.iter().enumerate() {
            let b = chunk.block(layout.chunk_index(k));
            let csr: Vec<f32> = (0..eb.len).map(|i| i as f32).collect();
            let mut csc = vec![f32::NAN; eb.len];
            order.permute(&b, eb, &csr, (1, eb.len), &mut csc);
            let mut sorted = csc.clone();
            sorted.sort_by(f32::total_cmp);
            assert_eq!(sorted, csr);
            // And in the chunk's own values: the CSC's values.
            let mut own = vec![f32::NAN; eb.len];
            order.permute(&b, eb, b.csr_vals, (1, eb.len), &mut own);
            assert_eq!(own, b.csc_vals);
            // Three groups, runs 5 apart beyond the block: each entry's values side by side.
            let stride = eb.len + 5;
            let values: Vec<f32> = (0..2 * stride + eb.len).map(|i| i as f32).collect();
            let mut grouped = vec![f32::NAN; 3 * eb.len];
            order.permute(&b, eb, &values, (3, stride), &mut grouped);
            for (k, values) in grouped.chunks_exact(3).enumerate() {
                for (g, &v) in values.iter().enumerate() {
                    assert_eq!(v, csc[k] + (g * stride) as f32);
                }
            }
        }
    }
}

/// The chunks of a weighted graph split by `part_of`, normalised by `norm`, recording the
/// graph's edge weights (or not).
fn weighted_chunks(
    n: usize,
    edges: &[(u32, u32, f32)],
    part_of: &[u32],
    parts: u32,
    norm: Normalization,
    record: bool,
) -> Vec<AlignedBuf> {
    let src: Vec<u32> = edges.iter().map(|e| e.0).collect();
    let dst: Vec<u32> = edges.iter().map(|e| e.1).collect();
    let w: Vec<f32> = edges.iter().map(|e| e.2).collect();
    let (a_hat, weights) =
        normalize::adjacency_with_weights(n, &src, &dst, Some(&w), norm).unwrap();
    let mut graph = Graph::from_edges(n, src, dst);
    graph.weights = Some(w);
    let partition = Partition::new(parts, part_of.to_vec(), "test").unwrap();
    let mut builder = ChunkBuilder::new(&graph, a_hat.view(), &partition).unwrap();
    if record {
        builder = builder.with_edge_weights(&weights).unwrap();
    }
    (0..parts)
        .map(|p| encode(&builder.build(p).contents()).unwrap())
        .collect()
}

/// Every rank's edge weights and `edges()` (global rows), over the `local` communicator.
fn weights_by_rank(views: &[ChunkView<'_>]) -> Vec<Result<EdgeWeights, DistSpmmError>> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let first = offsets[p] as usize;
        let mut weights = vec![f32::NAN; op.edge_count()];
        op.edge_weights(&mut weights)?;
        let edges = op.edges().map(|(r, s)| (first + r, s)).collect();
        Ok(EdgeWeights { edges, weights })
    })
}

/// One rank's edges (global row, global source) and their weights, in layout order.
#[derive(Debug)]
struct EdgeWeights {
    edges: Vec<(usize, u64)>,
    weights: Vec<f32>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The weights `edge_weights` gives are A's (in renumbered ids: the input edges' weights
    /// summed, 0 at an added self loop) at the positions `edges()` names, every edge of A
    /// among them, whatever the normalisation, the partition and P.
    #[test]
    fn edge_weights_are_the_graphs_own_in_layout_order(
        (n, edges, part_of, parts) in graphs(24, 4, 4),
        quarters in proptest::collection::vec(1u8..12, 96),
        norm in 0usize..3,
    ) {
        let norm = [Normalization::Gcn, Normalization::Row, Normalization::None][norm];
        // Multiples of 1/4: sums of duplicates are exact in f32.
        let weighted: Vec<(u32, u32, f32)> = edges
            .iter()
            .enumerate()
            .map(|(k, &(u, v))| (u, v, f32::from(quarters[k % quarters.len()]) / 4.0))
            .collect();
        let bufs = weighted_chunks(n, &weighted, &part_of, parts, norm, true);
        let views = views(&bufs);
        let new = Partition::new(parts, part_of.clone(), "test").unwrap().renumbering();
        let new = new.old_to_new();
        let mut a = vec![0f64; n * n];
        for &(u, v, w) in &weighted {
            a[new[v as usize] as usize * n + new[u as usize] as usize] += f64::from(w);
        }
        let mut stored = 0;
        for (p, result) in weights_by_rank(&views).into_iter().enumerate() {
            let EdgeWeights { edges, weights } = result.unwrap();
            prop_assert_eq!(edges.len(), weights.len());
            for (k, (&(i, s), &w)) in edges.iter().zip(&weights).enumerate() {
                let want = a[i * n + s as usize];
                prop_assert_eq!(f64::from(w), want, "rank {}, position {}: ({}, {})", p, k, i, s);
                prop_assert!(want != 0.0 || i as u64 == s, "({}, {}) is not an edge", i, s);
                stored += usize::from(want != 0.0);
            }
        }
        prop_assert_eq!(stored, a.iter().filter(|&&x| x != 0.0).count());
    }
}

#[test]
fn edge_weights_need_chunks_that_record_them_and_a_buffer_of_edge_count() {
    // A ring of 12 nodes over 3 parts, a weighted self loop on node 5 and a duplicated edge.
    let mut edges: Vec<(u32, u32, f32)> = (0..12u32)
        .flat_map(|v| [(v, (v + 1) % 12, 1.0), ((v + 1) % 12, v, 0.5)])
        .collect();
    edges.extend([(5, 5, 3.0), (2, 7, 0.25), (2, 7, 0.5)]);
    let part_of: Vec<u32> = (0..12).map(|v| v / 4).collect();

    // Without the section: every rank says what to do.
    let unrecorded = weighted_chunks(12, &edges, &part_of, 3, Normalization::Gcn, false);
    let m = messages(weights_by_rank(&views(&unrecorded)));
    for (p, message) in m.iter().enumerate() {
        assert!(
            message.contains("carry no edge weights") && message.contains("distspmm partition"),
            "{message}"
        );
        assert!(message.contains(&format!("part {p}")), "{message}");
    }

    let bufs = weighted_chunks(12, &edges, &part_of, 3, Normalization::Gcn, true);
    let views = views(&bufs);
    for result in weights_by_rank(&views) {
        let EdgeWeights { edges, weights } = result.unwrap();
        let at = |i: usize, s: u64| weights[edges.iter().position(|&e| e == (i, s)).unwrap()];
        // Contiguous map: renumbered ids are the original ones.
        if edges.iter().any(|&(i, _)| i == 5) {
            assert_eq!(at(5, 5), 3.0);
            assert_eq!(at(5, 4), 1.0);
            assert_eq!(at(5, 6), 0.5);
            assert_eq!(at(4, 4), 0.0);
        }
        if edges.iter().any(|&(i, _)| i == 7) {
            assert_eq!(at(7, 2), 0.75);
        }
    }

    // A buffer of the wrong length is named; the call is local (one rank alone is fine).
    let m = messages(LocalComm::run(3, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Broadcast)?;
        let mut short = vec![0f32; op.edge_count() - usize::from(p == 2)];
        op.edge_weights(&mut short)
    }));
    assert!(
        m[2].contains("edge_weights on rank 2: the output holds"),
        "{m:?}"
    );
}
