#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact; f32 rounding is deliberate"
)]

use super::*;
use std::collections::BTreeSet;
use std::string::ToString;

/// Checks the shape every generated undirected graph must have.
fn assert_simple_symmetric(g: &Graph) {
    g.validate().unwrap();
    let edges: Vec<(u32, u32)> = g.src.iter().copied().zip(g.dst.iter().copied()).collect();
    assert!(
        edges.windows(2).all(|w| w[0] < w[1]),
        "sorted, no duplicates"
    );
    assert!(edges.iter().all(|(u, v)| u != v), "no self loops");
    let set: BTreeSet<(u32, u32)> = edges.iter().copied().collect();
    assert!(
        edges.iter().all(|&(u, v)| set.contains(&(v, u))),
        "symmetric"
    );
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn rmat_is_simple_symmetric_and_sized() {
    let g = rmat(10, 8, 7).unwrap();
    assert_eq!(g.num_nodes, 1024);
    assert_simple_symmetric(&g);
    // Duplicates and self loops remove some of the 8192 samples, but not most of them.
    let undirected = g.num_edges() / 2;
    assert!(undirected <= 8192 && undirected > 4096, "{undirected}");
    assert!(g.features.is_none() && g.labels.is_none() && g.weights.is_none());
}

#[test]
fn rmat_is_deterministic_per_seed_and_thread_count() {
    let a = in_pool(1, || rmat(11, 4, 42).unwrap());
    let b = in_pool(3, || rmat(11, 4, 42).unwrap());
    assert_eq!(a, b);
    let c = rmat(11, 4, 43).unwrap();
    assert_ne!(a.src, c.src);
}

#[test]
fn rmat_degrees_are_skewed() {
    let g = rmat(12, 16, 1).unwrap();
    let mut deg = vec![0usize; g.num_nodes];
    for &d in &g.dst {
        deg[d as usize] += 1;
    }
    let max = *deg.iter().max().unwrap() as f64;
    let mean = g.num_edges() as f64 / g.num_nodes as f64;
    assert!(max > 10.0 * mean, "max degree {max}, mean {mean}");
    // Scrambling spreads the hubs: the top-degree node is rarely id 0.
    let isolated = deg.iter().filter(|&&d| d == 0).count();
    assert!(isolated > 0, "Kronecker graphs leave some nodes isolated");
}

#[test]
fn rmat_scrambles_ids() {
    // Without scrambling, node 0 (all-zero bits) is by far the hub. Count in which half of the id
    // range the 16 largest degrees fall: a random permutation splits them.
    let g = rmat(12, 16, 3).unwrap();
    let mut deg = vec![0usize; g.num_nodes];
    for &d in &g.dst {
        deg[d as usize] += 1;
    }
    let mut order: Vec<usize> = (0..g.num_nodes).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(deg[i]));
    let low = order[..16].iter().filter(|&&i| i < g.num_nodes / 2).count();
    assert!(
        (2..=14).contains(&low),
        "{low} of the 16 hubs in the lower half"
    );
}

#[test]
fn rmat_rejects_too_many_nodes() {
    let err = rmat(32, 1, 0).unwrap_err();
    assert!(
        matches!(err.kind(), GraphErrorKind::TooManyNodes(_)),
        "{err}"
    );
    let empty = rmat(0, 4, 0).unwrap();
    assert_eq!((empty.num_nodes, empty.num_edges()), (1, 0));
}

#[test]
fn directed_rmat_keeps_one_direction_and_about_the_same_entries() {
    let sym = rmat(11, 8, 5).unwrap();
    let g = rmat_directed(11, 8, 5).unwrap();
    g.validate().unwrap();
    let edges: Vec<(u32, u32)> = g.src.iter().copied().zip(g.dst.iter().copied()).collect();
    assert!(
        edges.windows(2).all(|w| w[0] < w[1]),
        "sorted, no duplicates"
    );
    assert!(edges.iter().all(|(u, v)| u != v), "no self loops");
    let set: BTreeSet<(u32, u32)> = edges.iter().copied().collect();
    let reciprocated = edges
        .iter()
        .filter(|&&(u, v)| set.contains(&(v, u)))
        .count();
    // Hub pairs are drawn in both directions now and then, but most edges are one-way.
    assert!(
        reciprocated < edges.len() / 2,
        "{reciprocated} of {} edges have their reverse",
        edges.len()
    );
    // 2 · 8 · 2048 draws against the symmetrised graph's 8 · 2048 undirected samples listed
    // both ways: the entry counts are within duplicates of each other.
    let (d, s) = (g.num_edges() as f64, sym.num_edges() as f64);
    assert!(
        d <= 32768.0 && (0.7..1.3).contains(&(d / s)),
        "directed {d}, symmetrised {s}"
    );
    // The same skew: the largest in-degree is far above the mean.
    let mut deg = vec![0usize; g.num_nodes];
    for &v in &g.dst {
        deg[v as usize] += 1;
    }
    let max = *deg.iter().max().unwrap() as f64;
    assert!(max > 10.0 * d / g.num_nodes as f64, "max in-degree {max}");
    let one = in_pool(1, || rmat_directed(11, 8, 5).unwrap());
    assert_eq!(one, g, "independent of the thread count");
    assert!(rmat_directed(32, 1, 0).is_err());
}

fn small_csbm(seed: u64) -> CsbmParams {
    CsbmParams {
        nodes: 600,
        classes: 4,
        features: 16,
        avg_degree: 6.0,
        homophily: 0.7,
        separation: 1.0,
        seed,
        multi_label: false,
    }
}

#[test]
fn multi_label_csbm_marks_one_or_two_communities_and_keeps_the_rest() {
    let p = CsbmParams {
        multi_label: true,
        ..small_csbm(5)
    };
    let g = csbm(&p).unwrap();
    g.validate().unwrap();
    let single = csbm(&small_csbm(5)).unwrap();
    // The edges, masks and first communities are the single-label graph's.
    assert_eq!((&g.src, &g.dst), (&single.src, &single.dst));
    assert_eq!(g.train_mask, single.train_mask);
    assert_eq!(g.num_classes(), 4);
    assert!(g.labels.is_none());
    let t = g.targets.as_ref().unwrap();
    let y = single.labels.as_ref().unwrap();
    let f = g.features.as_ref().unwrap();
    let (mut two, mut extra) = (0, vec![Vec::new(); 4]);
    for v in 0..g.num_nodes {
        let row = t.row(v);
        assert_eq!(row[y[v] as usize], 1, "node {v} is in its first community");
        let ones = row.iter().filter(|&&b| b == 1).count();
        assert!((1..=2).contains(&ones) && row.iter().all(|&b| b <= 1));
        if ones == 2 {
            two += 1;
            let s = (0..4).find(|&k| k != y[v] as usize && row[k] == 1).unwrap();
            extra[s].push(v);
        } else {
            // One community: the single-label graph's features, bit for bit.
            assert_eq!(f.row(v), single.features.as_ref().unwrap().row(v));
        }
    }
    assert!(
        (250..350).contains(&two),
        "{two} of 600 nodes in two communities"
    );
    // A second community moves the features towards its mean: members of community k through
    // their second membership lie further along μ_k than the nodes outside k.
    let mean_of = |k: usize| -> Vec<f64> {
        let members: Vec<usize> = (0..600).filter(|&v| y[v] as usize == k).collect();
        (0..16)
            .map(|j| {
                members.iter().map(|&v| f64::from(f.row(v)[j])).sum::<f64>() / members.len() as f64
            })
            .collect()
    };
    for (k, joined) in extra.iter().enumerate() {
        let mu = mean_of(k);
        let along = |v: usize| -> f64 {
            f.row(v)
                .iter()
                .zip(&mu)
                .map(|(&x, m)| f64::from(x) * m)
                .sum()
        };
        let outside: Vec<usize> = (0..600).filter(|&v| t.row(v)[k] == 0).collect();
        let avg = |vs: &[usize]| vs.iter().map(|&v| along(v)).sum::<f64>() / vs.len() as f64;
        assert!(avg(joined) > avg(&outside) + 0.3, "community {k}");
    }
    assert_eq!(csbm(&p).unwrap(), g, "deterministic");
    assert!(csbm(&CsbmParams {
        classes: 1,
        homophily: 1.0,
        ..p
    })
    .is_err());
}

#[test]
fn csbm_shape_labels_and_masks() {
    let p = small_csbm(5);
    let g = csbm(&p).unwrap();
    assert_simple_symmetric(&g);
    assert_eq!(g.num_nodes, 600);
    assert_eq!(g.num_edges(), 2 * 1800);
    assert_eq!(g.num_classes(), 4);
    assert_eq!(g.feature_dim(), 16);
    let y = g.labels.as_ref().unwrap();
    for c in 0..4 {
        assert_eq!(y.iter().filter(|&&l| l == c).count(), 150);
    }
    let (tr, va, te) = (
        g.train_mask.as_ref().unwrap(),
        g.val_mask.as_ref().unwrap(),
        g.test_mask.as_ref().unwrap(),
    );
    // 600 / (10·4) = 15 per class; R = 540 → 180 val, 360 test.
    for c in 0..4 {
        let n = (0..600).filter(|&i| tr[i] && y[i] == c).count();
        assert_eq!(n, 15);
    }
    assert_eq!(va.iter().filter(|&&b| b).count(), 180);
    assert_eq!(te.iter().filter(|&&b| b).count(), 360);
    assert!((0..600).all(|i| u8::from(tr[i]) + u8::from(va[i]) + u8::from(te[i]) <= 1));
}

#[test]
fn csbm_default_masks_are_planetoid() {
    let g = csbm(&CsbmParams::default()).unwrap();
    let count = |m: &Option<Vec<bool>>| m.as_ref().unwrap().iter().filter(|&&b| b).count();
    assert_eq!(count(&g.train_mask), 20 * 5);
    assert_eq!(count(&g.val_mask), 500);
    assert_eq!(count(&g.test_mask), 1000);
}

#[test]
fn csbm_homophily_matches() {
    for h in [0.2, 0.9] {
        let g = csbm(&CsbmParams {
            homophily: h,
            ..small_csbm(9)
        })
        .unwrap();
        let y = g.labels.as_ref().unwrap();
        let same = g
            .src
            .iter()
            .zip(&g.dst)
            .filter(|(&u, &v)| y[u as usize] == y[v as usize])
            .count();
        let measured = same as f64 / g.num_edges() as f64;
        assert!(
            (measured - h).abs() < 0.04,
            "homophily {h}: measured {measured}"
        );
    }
}

#[test]
fn csbm_is_deterministic_per_seed_and_thread_count() {
    let p = CsbmParams {
        nodes: 5000,
        ..small_csbm(11)
    };
    let a = in_pool(1, || csbm(&p).unwrap());
    let b = in_pool(2, || csbm(&p).unwrap());
    assert_eq!(a, b);
    let c = csbm(&small_csbm(12)).unwrap();
    assert_ne!(a.labels, c.labels);
}

#[test]
fn csbm_class_means_are_separated() {
    let p = CsbmParams {
        nodes: 4000,
        features: 8,
        separation: 3.0,
        ..small_csbm(2)
    };
    let g = csbm(&p).unwrap();
    let f = g.features.as_ref().unwrap();
    let y = g.labels.as_ref().unwrap();
    let cent = centroids(f, y, 4, |_| true);
    for a in 0..4 {
        for b in a + 1..4 {
            let d = dist2(&cent[a], &cent[b]).sqrt();
            assert!((d - 3.0).abs() < 0.25, "classes {a},{b}: {d}");
        }
    }
}

#[test]
fn csbm_rejects_impossible_parameters() {
    let bad = [
        CsbmParams {
            classes: 0,
            ..small_csbm(0)
        },
        CsbmParams {
            nodes: 3,
            ..small_csbm(0)
        },
        CsbmParams {
            homophily: 1.5,
            ..small_csbm(0)
        },
        CsbmParams {
            avg_degree: 400.0,
            ..small_csbm(0)
        },
        CsbmParams {
            avg_degree: f64::NAN,
            ..small_csbm(0)
        },
        CsbmParams {
            separation: -1.0,
            ..small_csbm(0)
        },
        CsbmParams {
            classes: 1,
            homophily: 0.5,
            ..small_csbm(0)
        },
        // Labels are i32: more classes than that is refused before anything is allocated.
        CsbmParams {
            nodes: i32::MAX as usize + 1,
            classes: i32::MAX as usize + 1,
            ..small_csbm(0)
        },
    ];
    for p in bad {
        let err = csbm(&p).unwrap_err();
        assert!(
            matches!(err.kind(), GraphErrorKind::Invalid(_)),
            "{p:?}: {err}"
        );
    }
}

fn dist2(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

fn centroids(
    f: &Features,
    y: &[i32],
    classes: usize,
    keep: impl Fn(usize) -> bool,
) -> Vec<Vec<f64>> {
    let mut sum = vec![vec![0.0f64; f.dim]; classes];
    let mut cnt = vec![0usize; classes];
    for (i, &c) in y.iter().enumerate().filter(|&(i, _)| keep(i)) {
        cnt[c as usize] += 1;
        for (s, &x) in sum[c as usize].iter_mut().zip(f.row(i)) {
            *s += f64::from(x);
        }
    }
    for (s, &n) in sum.iter_mut().zip(&cnt) {
        s.iter_mut().for_each(|x| *x /= n.max(1) as f64);
    }
    sum
}

/// Test accuracy of a nearest-centroid classifier fitted on the training nodes.
fn centroid_accuracy(g: &Graph, f: &Features) -> f64 {
    let y = g.labels.as_ref().unwrap();
    let train = g.train_mask.as_ref().unwrap();
    let test = g.test_mask.as_ref().unwrap();
    let cent = centroids(f, y, g.num_classes(), |i| train[i]);
    let mut right = 0;
    let mut total = 0;
    for i in (0..g.num_nodes).filter(|&i| test[i]) {
        let row: Vec<f64> = f.row(i).iter().map(|&x| f64::from(x)).collect();
        let best = (0..cent.len())
            .min_by(|&a, &b| dist2(&row, &cent[a]).total_cmp(&dist2(&row, &cent[b])))
            .unwrap();
        right += usize::from(best as i32 == y[i]);
        total += 1;
    }
    right as f64 / total as f64
}

/// One GCN aggregation D^-1/2 (A+I) D^-1/2 · X, written out with plain loops.
fn propagate(g: &Graph, f: &Features) -> Features {
    let n = g.num_nodes;
    let mut deg = vec![1.0f64; n];
    for &d in &g.dst {
        deg[d as usize] += 1.0;
    }
    let mut out: Vec<f64> = (0..n * f.dim)
        .map(|k| f64::from(f.data[k]) / deg[k / f.dim])
        .collect();
    for (&s, &d) in g.src.iter().zip(&g.dst) {
        let w = 1.0 / (deg[s as usize] * deg[d as usize]).sqrt();
        for j in 0..f.dim {
            out[d as usize * f.dim + j] += w * f64::from(f.data[s as usize * f.dim + j]);
        }
    }
    Features {
        dim: f.dim,
        data: out
            .into_iter()
            .map(|x| x as f32)
            .collect::<Vec<f32>>()
            .into(),
    }
}

#[test]
fn csbm_default_rewards_aggregation() {
    // Proxy for "a 2-layer GCN reaches high accuracy, an MLP clearly less": a nearest-centroid
    // classifier on Â²X versus on X, centroids from the 20-per-class training nodes.
    let g = csbm(&CsbmParams::default()).unwrap();
    let x = g.features.as_ref().unwrap();
    let mlp = centroid_accuracy(&g, x);
    let two_hop = propagate(&g, &propagate(&g, x));
    let gcn = centroid_accuracy(&g, &two_hop);
    assert!((0.85..0.98).contains(&gcn), "aggregated accuracy {gcn}");
    assert!(
        mlp < gcn - 0.3,
        "features-only accuracy {mlp} vs aggregated {gcn}"
    );
}

/// Sampling into bucket files (forced by a small `bucket_keys`) gives exactly the in-memory
/// edges, for both kinds of graph, through both ways out (the graph and the npz writer), and
/// leaves no work directory behind.
#[test]
fn bucketed_rmat_equals_the_in_memory_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npz");
    for directed in [false, true] {
        let whole = rmat_edges(9, 6, 4, directed, u64::MAX, Some(&out)).unwrap();
        assert!(!whole.on_disk());
        for bucket_keys in [1, 100, 1000] {
            let bucketed = rmat_edges(9, 6, 4, directed, bucket_keys, Some(&out)).unwrap();
            assert!(bucketed.on_disk());
            assert_eq!(bucketed.num_edges(), whole.num_edges());
            let node_data = Graph::from_edges(bucketed.num_nodes(), Vec::new(), Vec::new());
            crate::graph::npz::write_npz_edges(&out, &node_data, &bucketed).unwrap();
            let streamed = std::fs::read(&out).unwrap();
            let graph = bucketed.into_graph().unwrap();
            let reference = if directed {
                rmat_directed(9, 6, 4).unwrap()
            } else {
                rmat(9, 6, 4).unwrap()
            };
            assert_eq!(graph, reference, "directed {directed}, {bucket_keys} keys");
            crate::graph::npz::write_npz(&out, &reference).unwrap();
            assert_eq!(streamed, std::fs::read(&out).unwrap());
        }
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".rmat-"))
        .collect();
    assert!(left.is_empty(), "work directories left: {left:?}");
}

#[test]
fn streamed_edges_refuse_node_data_of_another_graph() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npz");
    let edges = rmat_edges(5, 4, 1, false, 10, Some(&out)).unwrap();
    let wrong = Graph::from_edges(edges.num_nodes() + 1, Vec::new(), Vec::new());
    let err = crate::graph::npz::write_npz_edges(&out, &wrong, &edges).unwrap_err();
    assert!(err.to_string().contains("do not go with"), "{err}");
    assert!(!out.exists());
}

/// A work directory of a generator that no longer runs is removed by the next one; a live
/// process's (this one's parent, the test harness) is left alone.
#[test]
fn stale_rmat_work_directories_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.npz");
    // Above Linux's largest pid (2^22), so no process has it.
    let stale = dir.path().join(".r.npz.rmat-999999999");
    let live = dir.path().join(format!(
        ".r.npz.rmat-{}",
        std::os::unix::process::parent_id()
    ));
    for d in [&stale, &live] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("bucket-00000.u64"), [0u8; 8]).unwrap();
    }
    rmat_edges(6, 4, 1, false, 10, Some(&out)).unwrap();
    assert!(!stale.exists(), "the stale work directory is still there");
    assert!(live.exists(), "a live process's work directory was removed");
}
