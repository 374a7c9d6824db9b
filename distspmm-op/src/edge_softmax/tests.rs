//! The edge softmax (plain and after a LeakyReLU) on every rank of the `local` communicator
//! against a dense f64 softmax over each row's in-edges of the reassembled graph, for random
//! graphs and partitions, P = 1..4; the backward against the dense formula and finite
//! differences; rows sum to 1; the same bits at 1 and 3 threads; non-finite rows; operand
//! lengths.
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use std::collections::HashMap;

use crate::schedule::ScheduleKind;
use chunk_format::{encode, AlignedBuf, ChunkView};
use dist_comm::{Group, LocalComm};
use distspmm_prep::chunk::ChunkBuilder;
use distspmm_prep::graph::Graph;
use distspmm_prep::normalize::{self, Normalization};
use distspmm_prep::partition::Partition;
use proptest::prelude::*;

use crate::tests::{chunks, graphs, messages, reassembled, ring, value, views};
use crate::{DistSpmm, DistSpmmError};

const SLOPE: f32 = 0.2;

/// The logit of the edge from global node `j` into global row `i`, in [-4, 4].
fn logit(i: usize, j: u64) -> f32 {
    4.0 * value(31, i, j as usize)
}

/// The incoming gradient of that edge.
fn grad(i: usize, j: u64) -> f32 {
    value(32, i, j as usize)
}

/// What one rank computed, by (global row, global source).
#[derive(Debug)]
struct SoftmaxResult {
    edges: Vec<(usize, u64)>,
    /// `edge_softmax`, its backward, and both for the LeakyReLU form.
    plain: Vec<f32>,
    d_plain: Vec<f32>,
    leaky: Vec<f32>,
    d_leaky: Vec<f32>,
}

fn run_softmax(views: &[ChunkView<'_>]) -> Vec<Result<SoftmaxResult, DistSpmmError>> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let first = offsets[p] as usize;
        let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
        let z: Vec<f32> = edges.iter().map(|&(i, j)| logit(i, j)).collect();
        let dy: Vec<f32> = edges.iter().map(|&(i, j)| grad(i, j)).collect();
        let nan = || vec![f32::NAN; edges.len()];
        let (mut plain, mut d_plain, mut leaky, mut d_leaky) = (nan(), nan(), nan(), nan());
        op.edge_softmax(&z, &mut plain)?;
        op.edge_softmax_backward(&plain, &dy, &mut d_plain)?;
        op.leaky_relu_edge_softmax(SLOPE, &z, &mut leaky)?;
        op.leaky_relu_edge_softmax_backward(SLOPE, &z, &leaky, &dy, &mut d_leaky)?;
        Ok(SoftmaxResult {
            edges,
            plain,
            d_plain,
            leaky,
            d_leaky,
        })
    })
}

/// The dense reference by edge: (α, dz) of the softmax over each row's in-edges of `rows`
/// (global row → its sources), after LeakyReLU with `slope` when given.
fn reference(rows: &[Vec<u64>], slope: Option<f64>) -> HashMap<(usize, u64), (f64, f64)> {
    let act = |z: f64| match slope {
        Some(s) if z <= 0.0 => s * z,
        _ => z,
    };
    let gate = |z: f64| match slope {
        Some(s) if z <= 0.0 => s,
        _ => 1.0,
    };
    let mut by_edge = HashMap::new();
    for (i, sources) in rows.iter().enumerate() {
        let z: Vec<f64> = sources.iter().map(|&j| f64::from(logit(i, j))).collect();
        let dy: Vec<f64> = sources.iter().map(|&j| f64::from(grad(i, j))).collect();
        let a: Vec<f64> = z.iter().map(|&z| act(z)).collect();
        let e: Vec<f64> = a.iter().map(|&a| a.exp()).collect();
        let sum: f64 = e.iter().sum();
        let alpha: Vec<f64> = e.iter().map(|&e| e / sum).collect();
        let dot: f64 = alpha.iter().zip(&dy).map(|(a, d)| a * d).sum();
        for (t, &j) in sources.iter().enumerate() {
            let dz = alpha[t] * (dy[t] - dot) * gate(z[t]);
            by_edge.insert((i, j), (alpha[t], dz));
        }
    }
    by_edge
}

/// Each global row's sources in the reassembled pattern.
fn in_edges(views: &[ChunkView<'_>]) -> Vec<Vec<u64>> {
    let a = reassembled(views);
    (0..a.nrows())
        .map(|i| a.row(i).0.iter().map(|&j| u64::from(j)).collect())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Both forms on every rank against the dense softmax over each row's in-edges, the
    /// backward against the dense formula, each row summing to 1.
    #[test]
    fn the_edge_softmax_matches_the_dense_reference(
        (n, edges, part_of, parts) in graphs(40, 4, 4),
    ) {
        let bufs = chunks(n, &edges, &part_of, parts);
        let views = views(&bufs);
        let rows = in_edges(&views);
        let plain_ref = reference(&rows, None);
        let leaky_ref = reference(&rows, Some(f64::from(SLOPE)));
        let mut seen = 0;
        for r in run_softmax(&views) {
            let r = r.unwrap();
            let mut sums: HashMap<usize, f64> = HashMap::new();
            for (k, edge) in r.edges.iter().enumerate() {
                let (Some(&(a, da)), Some(&(l, dl))) = (plain_ref.get(edge), leaky_ref.get(edge))
                else {
                    return Err(TestCaseError::fail(format!("{edge:?} is not an edge")));
                };
                let near = |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-5;
                prop_assert!(near(r.plain[k], a), "α{edge:?} = {}, reference {a}", r.plain[k]);
                prop_assert!(near(r.d_plain[k], da), "dz{edge:?} = {}, reference {da}", r.d_plain[k]);
                prop_assert!(near(r.leaky[k], l), "leaky α{edge:?} = {}, reference {l}", r.leaky[k]);
                prop_assert!(near(r.d_leaky[k], dl), "leaky dz{edge:?} = {}, reference {dl}", r.d_leaky[k]);
                *sums.entry(edge.0).or_default() += f64::from(r.leaky[k]);
            }
            for (row, sum) in sums {
                prop_assert!((sum - 1.0).abs() <= 1e-5, "row {row} sums to {sum}");
            }
            seen += r.edges.len();
        }
        prop_assert_eq!(seen, plain_ref.len());
    }
}

/// The gradient of `L = Σ_k w_k·α_k` with `α = softmax(LeakyReLU(z))` per row, on two ranks,
/// against central differences of L in f64 (each rank's loss depends on its own logits only).
#[test]
fn the_backward_has_the_finite_difference_gradient() {
    let n = 11;
    let mut edges: Vec<(u32, u32)> = (0..n as u32).map(|i| (i, (i + 1) % n as u32)).collect();
    edges.extend([(0, 4), (5, 2), (7, 3), (3, 8), (9, 3), (10, 3), (6, 3)]);
    let part_of: Vec<u32> = (0..n as u32).map(|i| i % 2).collect();
    let bufs = chunks(n, &edges, &part_of, 2);
    let views = views(&bufs);
    let offsets = views[0].part_offsets();
    let results = LocalComm::run(2, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Broadcast)?;
        let first = offsets[p] as usize;
        let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
        // Logits away from LeakyReLU's kink at 0, so a step of h does not cross it.
        let z: Vec<f32> = edges
            .iter()
            .map(|&(i, j)| {
                let v = logit(i, j);
                v + 0.1f32.copysign(v)
            })
            .collect();
        let w: Vec<f32> = edges.iter().map(|&(i, j)| grad(i, j)).collect();
        let loss = |z: &[f32]| -> Result<f64, DistSpmmError> {
            let mut alpha = vec![0f32; z.len()];
            op.leaky_relu_edge_softmax(SLOPE, z, &mut alpha)?;
            Ok(alpha
                .iter()
                .zip(&w)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum())
        };
        let mut alpha = vec![0f32; z.len()];
        op.leaky_relu_edge_softmax(SLOPE, &z, &mut alpha)?;
        let mut dz = vec![f32::NAN; z.len()];
        op.leaky_relu_edge_softmax_backward(SLOPE, &z, &alpha, &w, &mut dz)?;
        let h = 1e-2f32;
        for k in 0..z.len() {
            let at = |delta: f32| {
                let mut moved = z.clone();
                moved[k] += delta;
                loss(&moved)
            };
            let fd = (at(h)? - at(-h)?) / (2.0 * f64::from(h));
            let g = f64::from(dz[k]);
            assert!(
                (fd - g).abs() <= 2e-3 * (1.0 + g.abs()),
                "rank {p}: d/dz{:?} = {g}, finite difference {fd}",
                edges[k]
            );
        }
        Ok::<_, DistSpmmError>(z.len())
    });
    let total: usize = results.into_iter().map(Result::unwrap).sum();
    assert!(total > n);
}

/// Each rank's outputs of every call at `threads` rayon threads, as bits.
fn bits_at(views: &[ChunkView<'_>], threads: usize) -> Vec<u32> {
    let offsets = views[0].part_offsets();
    LocalComm::run(views.len(), |comm| {
        let p = comm.rank();
        // The rank's own thread joins the pool, so its calls run on `threads` threads.
        let _pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .use_current_thread()
            .build()
            .unwrap();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let first = offsets[p] as usize;
        let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
        let z: Vec<f32> = edges.iter().map(|&(i, j)| logit(i, j)).collect();
        let dy: Vec<f32> = edges.iter().map(|&(i, j)| grad(i, j)).collect();
        let zero = || vec![0f32; edges.len()];
        let (mut a, mut da, mut l, mut dl) = (zero(), zero(), zero(), zero());
        assert_eq!(rayon::current_num_threads(), threads);
        op.edge_softmax(&z, &mut a)?;
        op.edge_softmax_backward(&a, &dy, &mut da)?;
        op.leaky_relu_edge_softmax(SLOPE, &z, &mut l)?;
        op.leaky_relu_edge_softmax_backward(SLOPE, &z, &l, &dy, &mut dl)?;
        Ok::<_, DistSpmmError>([a, da, l, dl])
    })
    .into_iter()
    .flat_map(|r| r.unwrap().into_iter().flatten().map(f32::to_bits))
    .collect()
}

#[test]
fn the_edge_softmax_has_the_same_bits_at_one_and_three_threads() {
    // Several tasks of rows per rank, rows spread over three blocks.
    let bufs = ring(3000, 3);
    let views = views(&bufs);
    assert_eq!(bits_at(&views, 1), bits_at(&views, 3));
}

/// Chunks of the pattern as given: no self loops, so rows may have no entry.
fn chunks_without_self_loops(
    n: usize,
    edges: &[(u32, u32)],
    part_of: &[u32],
    parts: u32,
) -> Vec<AlignedBuf> {
    let (src, dst): (Vec<u32>, Vec<u32>) = edges.iter().copied().unzip();
    let a = normalize::adjacency(n, &src, &dst, None, Normalization::None).unwrap();
    let graph = Graph::from_edges(n, src, dst);
    let partition = Partition::new(parts, part_of.to_vec(), "test").unwrap();
    let builder = ChunkBuilder::new(&graph, a.view(), &partition).unwrap();
    (0..parts)
        .map(|p| encode(&builder.build(p).contents()).unwrap())
        .collect()
}

/// A NaN or infinite logit makes its row NaN and leaves the other rows alone; rows without
/// entries (and a rank without edges) have nothing to write.
#[test]
fn a_non_finite_logit_is_nan_in_its_row_only() {
    // Rows 0..3 on rank 0, 3..6 on rank 1; rows 2 and 5 have no in-edge, rank 1 none at all
    // after the edges into 3 and 4 are left out.
    let edges = [(1, 0), (3, 0), (0, 1), (4, 1)];
    let bufs = chunks_without_self_loops(6, &edges, &[0, 0, 0, 1, 1, 1], 2);
    let views = views(&bufs);
    let offsets = views[0].part_offsets();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let results = LocalComm::run(2, |comm| {
            let p = comm.rank();
            let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
            let first = offsets[p] as usize;
            let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
            // The first edge of row 0 is bad.
            let mut z: Vec<f32> = edges.iter().map(|&(i, j)| logit(i, j)).collect();
            if let Some(k) = edges.iter().position(|&(i, _)| i == 0) {
                z[k] = bad;
            }
            let mut alpha = vec![0f32; z.len()];
            op.leaky_relu_edge_softmax(SLOPE, &z, &mut alpha)?;
            Ok::<_, DistSpmmError>((edges, alpha))
        });
        let mut seen = 0;
        for r in results {
            let (edges, alpha) = r.unwrap();
            for (&(i, j), &a) in edges.iter().zip(&alpha) {
                if i == 0 {
                    assert!(a.is_nan(), "{bad}: α[0][{j}] = {a}");
                } else {
                    assert!(a.is_finite(), "{bad}: α[{i}][{j}] = {a}");
                }
            }
            seen += edges.len();
        }
        assert_eq!(seen, 4);
    }
}

/// Operands of the wrong length fail on that rank only (the calls are local), through the
/// operator's one shape rule.
#[test]
fn operands_of_the_wrong_length_fail_on_their_rank() {
    let bufs = ring(60, 2);
    let views = views(&bufs);
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let nnz = op.edge_count();
        let z = vec![0f32; nnz + usize::from(p == 1)];
        let mut out = vec![0f32; nnz];
        op.edge_softmax(&z[..nnz], &mut out)?;
        op.leaky_relu_edge_softmax(SLOPE, &z, &mut out)
    }));
    assert_eq!(m[0], "ok");
    assert!(
        m[1].contains("leaky_relu_edge_softmax on rank 1: logits holds")
            && m[1].contains("non-zeros"),
        "{m:?}"
    );
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let nnz = op.edge_count();
        let ok = vec![0f32; nnz];
        let mut d = vec![0f32; nnz - usize::from(p == 0)];
        op.edge_softmax_backward(&ok, &ok, &mut d)
    }));
    assert!(
        m[0].contains("edge_softmax_backward on rank 0: d_logits holds"),
        "{m:?}"
    );
    assert_eq!(m[1], "ok");
}

/// A graph whose node 0 receives an edge from every other node (one row of `n` entries
/// spread over every block, so the rows' lanes and remainders are both exercised) on a ring
/// with chords, in `parts` contiguous parts: `n` > 2·256 rows makes several tasks of rows.
fn hub(n: usize, parts: u32) -> Vec<AlignedBuf> {
    let mut edges: Vec<(u32, u32)> = (1..n as u32).map(|j| (j, 0)).collect();
    for v in 0..n as u32 {
        edges.extend([(v, (v + 1) % n as u32), (v, (v * 7 + 3) % n as u32)]);
    }
    let part_of: Vec<u32> = (0..n).map(|v| (v * parts as usize / n) as u32).collect();
    chunks(n, &edges, &part_of, parts)
}

/// Group g's logit (or incoming gradient, `seed` 1) of the edge from `j` into row `i`.
fn group_value(seed: u64, g: usize, i: usize, j: u64) -> f32 {
    4.0 * value(40 + 2 * g as u64 + seed, i, j as usize)
}

/// The grouped calls against one-group calls on each run, for both forms: the same bits
/// (each group's run is its own one-group problem, computed by the same loops).
#[test]
fn grouped_calls_give_each_run_the_bits_of_the_one_group_call() {
    const GROUPS: usize = 3;
    for parts in 1..=3 {
        let bufs = hub(700, parts);
        let views = views(&bufs);
        let offsets = views[0].part_offsets();
        let results = LocalComm::run(views.len(), |comm| {
            let p = comm.rank();
            let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
            let first = offsets[p] as usize;
            let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
            let e = edges.len();
            let of = |seed: u64| -> Vec<f32> {
                (0..GROUPS)
                    .flat_map(|g| edges.iter().map(move |&(i, j)| group_value(seed, g, i, j)))
                    .collect()
            };
            let (z, dy) = (of(0), of(1));
            for slope in [None, Some(SLOPE)] {
                let mut alpha = vec![f32::NAN; GROUPS * e];
                op.edge_softmax_grouped(GROUPS, slope, &z, &mut alpha)?;
                let mut dz = dy.clone();
                op.edge_softmax_backward_grouped(GROUPS, slope, &z, &alpha, &mut dz)?;
                for g in 0..GROUPS {
                    let run = g * e..(g + 1) * e;
                    let (mut a, mut d) = (vec![f32::NAN; e], vec![f32::NAN; e]);
                    let (z, dy) = (&z[run.clone()], &dy[run.clone()]);
                    match slope {
                        Some(s) => {
                            op.leaky_relu_edge_softmax(s, z, &mut a)?;
                            op.leaky_relu_edge_softmax_backward(s, z, &a, dy, &mut d)?;
                        }
                        None => {
                            op.edge_softmax(z, &mut a)?;
                            op.edge_softmax_backward(&a, dy, &mut d)?;
                        }
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&alpha[run.clone()]),
                        bits(&a),
                        "{parts} parts, group {g}"
                    );
                    assert_eq!(bits(&dz[run]), bits(&d), "{parts} parts, group {g}");
                    assert!(a.iter().all(|a| a.is_finite()));
                }
            }
            Ok::<_, DistSpmmError>(e)
        });
        let total: usize = results.into_iter().map(Result::unwrap).sum();
        assert!(total > 2 * 700);
    }
}

/// The loops compiled for every instruction set up to the selected one give the same bits
/// (no fused multiply-adds, reductions in a fixed lane order).
#[test]
fn every_instruction_set_gives_the_same_bits() {
    use distspmm_sparse::kernel::{isa, Isa};
    const GROUPS: usize = 2;
    let bufs = hub(600, 2);
    let views = views(&bufs);
    let offsets = views[0].part_offsets();
    let results = LocalComm::run(2, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let first = offsets[p] as usize;
        let edges: Vec<(usize, u64)> = op.edges().map(|(r, s)| (first + r, s)).collect();
        let e = edges.len();
        let of = |seed: u64| -> Vec<f32> {
            (0..GROUPS)
                .flat_map(|g| edges.iter().map(move |&(i, j)| group_value(seed, g, i, j)))
                .collect()
        };
        let (z, dy) = (of(0), of(1));
        let mut seen: Vec<(Isa, Vec<u32>)> = Vec::new();
        for level in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if level > isa() {
                continue;
            }
            let (mut alpha, mut dz) = (vec![0f32; GROUPS * e], vec![0f32; GROUPS * e]);
            op.softmax_call("test", level, GROUPS, Some(SLOPE), &z, &mut alpha)?;
            op.softmax_backward_call(
                "test",
                level,
                GROUPS,
                Some(SLOPE),
                &z,
                &alpha,
                Some(&dy),
                &mut dz,
            )?;
            let bits = alpha.iter().chain(&dz).map(|x| x.to_bits()).collect();
            seen.push((level, bits));
        }
        for (level, bits) in &seen[1..] {
            assert!(
                *bits == seen[0].1,
                "rank {p}: {level:?} differs from portable"
            );
        }
        Ok::<_, DistSpmmError>(seen.len())
    });
    for r in results {
        assert!(r.unwrap() >= 1);
    }
}

/// The softmax's exponential against f64's: within 2 ulp of the exact value down to the
/// smallest normal result, 0 below it, 1 at 0.
#[test]
fn the_exponential_is_within_two_ulp() {
    let ulp = |x: f32| -> f64 {
        let x = x.abs();
        f64::from(f32::from_bits(x.to_bits() + 1)) - f64::from(x)
    };
    let low = -87.336_55f32;
    let mut worst = 0f64;
    for k in 0..=2_000_000u32 {
        let x = low * (k as f32 / 2_000_000.0);
        let got = super::exp_nonpositive(x);
        let want = f64::from(x).exp();
        let err = (f64::from(got) - want).abs() / ulp(want as f32);
        worst = worst.max(err);
        assert!(err <= 2.0, "e^{x}: {got}, exact {want} ({err} ulp)");
    }
    assert!(worst > 0.0);
    assert_eq!(super::exp_nonpositive(0.0), 1.0);
    assert_eq!(super::exp_nonpositive(-0.0), 1.0);
    for x in [-87.34f32, -100.0, -1e30, f32::MIN, f32::NEG_INFINITY] {
        assert_eq!(super::exp_nonpositive(x), 0.0, "e^{x}");
    }
}

/// No group, or operands that are not whole runs of the groups, fail on their rank.
#[test]
fn grouped_operands_must_be_whole_runs() {
    let bufs = ring(60, 2);
    let views = views(&bufs);
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let nnz = op.edge_count();
        let z = vec![0f32; 3 * nnz];
        let mut out = vec![0f32; 3 * nnz - usize::from(p == 1)];
        op.edge_softmax_grouped(3 - 3 * usize::from(p == 0), None, &z, &mut out)
    }));
    assert!(
        m[0].contains("edge_softmax_grouped on rank 0: no group"),
        "{m:?}"
    );
    assert!(
        m[1].contains("edge_softmax_grouped on rank 1: out holds"),
        "{m:?}"
    );
    let m = messages(LocalComm::run(2, |comm| {
        let p = comm.rank();
        let op = DistSpmm::new(&comm, views[p], ScheduleKind::Halo)?;
        let nnz = op.edge_count();
        let ok = vec![0f32; 2 * nnz];
        let z = vec![0f32; 2 * nnz + usize::from(p == 0)];
        let mut d = vec![0f32; 2 * nnz];
        op.edge_softmax_backward_grouped(2, Some(SLOPE), &z, &ok, &mut d)
    }));
    assert!(
        m[0].contains("edge_softmax_backward_grouped on rank 0: logits holds"),
        "{m:?}"
    );
    assert_eq!(m[1], "ok");
}
