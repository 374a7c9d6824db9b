#![allow(
    clippy::cast_possible_truncation,
    reason = "small test graphs: every narrowing is exact"
)]

use super::test_support::sorted_edges;
use super::*;
use flate2::write::GzEncoder;
use std::io::Write;
use std::{format, vec};

fn sample() -> Graph {
    Graph {
        num_nodes: 3,
        src: vec![0, 1, 2],
        dst: vec![1, 2, 0],
        weights: Some(vec![1.0, 2.0, 3.0]),
        features: Some(Features {
            dim: 2,
            data: vec![0.0; 6].into(),
        }),
        labels: Some(vec![0, -1, 1]),
        targets: None,
        train_mask: Some(vec![true, false, false]),
        val_mask: None,
        test_mask: Some(vec![false, false, true]),
    }
}

#[test]
fn validate_accepts_consistent_graphs() {
    sample().validate().unwrap();
    Graph::default().validate().unwrap();
    assert_eq!(sample().num_classes(), 2);
    assert_eq!(Graph::default().num_classes(), 0);
    let unlabelled = Graph {
        labels: Some(vec![-1; 3]),
        ..sample()
    };
    assert_eq!(unlabelled.num_classes(), 0);
}

/// Each broken field is reported against its array name.
#[test]
fn validate_names_the_broken_field() {
    let cases: Vec<(Graph, &str)> = vec![
        (
            Graph {
                dst: vec![1, 2],
                ..sample()
            },
            "edge_index",
        ),
        (
            Graph {
                src: vec![0, 3, 2],
                ..sample()
            },
            "edge_index[0]",
        ),
        (
            Graph {
                dst: vec![0, 1, 9],
                ..sample()
            },
            "edge_index[1]",
        ),
        (
            Graph {
                weights: Some(vec![1.0]),
                ..sample()
            },
            "edge_weight",
        ),
        (
            Graph {
                weights: Some(vec![1.0, f32::INFINITY, 0.0]),
                ..sample()
            },
            "edge_weight",
        ),
        (
            Graph {
                features: Some(Features {
                    dim: 2,
                    data: vec![0.0; 5].into(),
                }),
                ..sample()
            },
            "x",
        ),
        (
            Graph {
                labels: Some(vec![0, 1]),
                ..sample()
            },
            "y",
        ),
        (
            Graph {
                labels: Some(vec![0, -3, 1]),
                ..sample()
            },
            "y",
        ),
        (
            Graph {
                val_mask: Some(vec![true]),
                ..sample()
            },
            "val_mask",
        ),
    ];
    for (g, array) in cases {
        let e = g.validate().unwrap_err();
        assert_eq!(e.location(), &Location::Array(array.into()), "{e}");
    }
    // One label of 2^31 − 2 would make 2^31 − 1 classes (and N × C classifier outputs).
    let e = Graph {
        labels: Some(vec![0, 2_147_483_646, 1]),
        ..sample()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.location(), &Location::Array("y".into()));
    let text = format!("{e}");
    assert!(
        text.contains("label 2147483646 would mean 2147483647 classes, more than the graph's 3 nodes (and than 65536)"),
        "{text}"
    );
    let huge = Graph {
        num_nodes: MAX_NODES + 1,
        ..Graph::default()
    };
    assert!(matches!(
        huge.validate().unwrap_err().kind(),
        GraphErrorKind::TooManyNodes(_)
    ));
}

#[test]
fn formats_by_extension() {
    let f = |p: &str| Format::from_path(Path::new(p));
    assert_eq!(f("a/b/cora.npz"), Some((Format::Npz, false)));
    assert_eq!(f("web.MTX"), Some((Format::MatrixMarket, false)));
    assert_eq!(f("web.mtx.gz"), Some((Format::MatrixMarket, true)));
    assert_eq!(f("x.graph"), Some((Format::Metis, false)));
    assert_eq!(f("x.metis.gz"), Some((Format::Metis, true)));
    for el in ["e.txt", "e.tsv", "e.csv", "e.el", "e.edges", "e.csv.gz"] {
        assert_eq!(f(el).map(|(f, _)| f), Some(Format::EdgeList), "{el}");
    }
    assert_eq!(f("x.npz.gz"), None);
    assert_eq!(f("x.bin"), None);
    assert_eq!(f("noext"), None);
}

#[test]
fn text_formats_load_by_extension_with_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let mtx = "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 2\n2 1\n3 2\n";
    let graph = "3 2\n2\n1 3\n2\n";
    let el = "0 1\n1 0\n1 2\n2 1\n";
    let sorted = |g: Graph| (g.num_nodes, sorted_edges(&g));
    let expected = (3, vec![(0, 1), (1, 0), (1, 2), (2, 1)]);
    for (name, text) in [
        ("a.mtx", mtx),
        ("a.graph", graph),
        ("a.el", el),
        ("a.csv", el),
    ] {
        let plain = dir.path().join(name);
        std::fs::write(&plain, text).unwrap();
        assert_eq!(sorted(load(&plain).unwrap()), expected, "{name}");
        let gz = dir.path().join(format!("{name}.gz"));
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(text.as_bytes()).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        assert_eq!(sorted(load(&gz).unwrap()), expected, "{name}.gz");
    }
    let bad = dir.path().join("bad.mtx.gz");
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(b"%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 9\n")
        .unwrap();
    std::fs::write(&bad, enc.finish().unwrap()).unwrap();
    let msg = format!("{}", load(&bad).unwrap_err());
    assert!(msg.contains("bad.mtx.gz: line 3:"), "{msg}");
    let unknown = dir.path().join("g.xyz");
    std::fs::write(&unknown, "").unwrap();
    let e = load(&unknown).unwrap_err();
    assert!(
        matches!(e.kind(), GraphErrorKind::UnknownFormat(_)) && format!("{e}").contains("g.xyz")
    );
}

#[test]
fn a_byte_order_mark_is_not_part_of_the_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let bom = "\u{feff}";
    // The edge list's first line is an edge: with the mark taken as text it became a header.
    for (name, text, edges) in [
        ("e.txt", "0 1\n1 2\n", 2),
        ("e.csv", "0,1\n1,2\n", 2),
        (
            "m.mtx",
            "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n2 3\n",
            2,
        ),
        ("g.graph", "3 2\n2\n1 3\n2\n", 4),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{bom}{text}")).unwrap();
        let g = load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((g.num_nodes, g.num_edges()), (3, edges), "{name}");
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            sorted_edges(&load(&path).unwrap()),
            sorted_edges(&g),
            "{name}"
        );
    }
}

#[test]
fn special_files_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let as_dir = dir.path().join("graph.npz");
    std::fs::create_dir(&as_dir).unwrap();
    let msg = format!("{}", load(&as_dir).unwrap_err());
    assert!(
        msg.contains("graph.npz") && msg.contains("a directory without edge_index.npy"),
        "{msg}"
    );
    for name in ["fifo.txt", "fifo.npz", "fifo.mtx.gz"] {
        let fifo = dir.path().join(name);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            return;
        }
        // Without a writer, opening a FIFO blocks forever unless the reader refuses it first.
        let msg = format!("{}", load(&fifo).unwrap_err());
        assert!(
            msg.contains("a FIFO (named pipe), not a regular file"),
            "{name}: {msg}"
        );
    }
}

mod properties {
    use super::super::edgelist::{read_edgelist, EdgeListOptions};
    use super::super::metis::read_metis;
    use super::super::mtx::read_mtx;
    use super::super::npz::{read_npz_bytes, write_npz_bytes};
    use super::*;
    use proptest::prelude::*;
    use std::string::String;
    use std::vec::Vec;

    /// Random graphs of up to 12 nodes, with any subset of the optional fields.
    fn graphs() -> impl Strategy<Value = Graph> {
        (1usize..12).prop_flat_map(|n| {
            let edge = (0..n as u32, 0..n as u32);
            (
                proptest::collection::vec((edge, -4.0f32..4.0), 0..40),
                any::<bool>(),
                proptest::option::of((0usize..4, proptest::collection::vec(-9.0f32..9.0, n * 3))),
                proptest::option::of(proptest::collection::vec(-1i32..5, n)),
                proptest::option::of(proptest::collection::vec(any::<bool>(), n)),
                // Multi-label targets (two classes), replacing the labels: a row whose
                // first draw is 2 is unlabelled.
                proptest::option::of(proptest::collection::vec(0u8..3, n * 2)),
            )
                .prop_map(move |(edges, weighted, x, y, mask, t)| Graph {
                    num_nodes: n,
                    src: edges.iter().map(|e| e.0 .0).collect(),
                    dst: edges.iter().map(|e| e.0 .1).collect(),
                    weights: weighted.then(|| edges.iter().map(|e| e.1).collect()),
                    features: x.map(|(dim, data)| Features {
                        dim,
                        data: data[..n * dim].to_vec().into(),
                    }),
                    labels: if t.is_some() { None } else { y },
                    targets: t.map(|t| Targets {
                        classes: 2,
                        data: t
                            .chunks(2)
                            .flat_map(|r| {
                                if r[0] == 2 {
                                    [TARGET_UNLABELLED; 2]
                                } else {
                                    [r[0], r[1] % 2]
                                }
                            })
                            .collect(),
                    }),
                    train_mask: mask.clone(),
                    val_mask: None,
                    test_mask: mask.map(|m| m.iter().map(|b| !b).collect()),
                })
        })
    }

    fn weight_of(g: &Graph, e: usize) -> String {
        g.weights
            .as_ref()
            .map_or_else(String::new, |w| format!(" {}", w[e]))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn npz_round_trip(g in graphs()) {
            let bytes = write_npz_bytes(&g).unwrap();
            prop_assert_eq!(read_npz_bytes(&bytes).unwrap(), g);
        }

        /// The `.npy` members of an `.npz`, unzipped into a directory, read back as the same
        /// graph through the directory reader (and through `load`).
        #[test]
        fn npy_directory_agrees_with_the_archive(g in graphs()) {
            let bytes = write_npz_bytes(&g).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
            for i in 0..zip.len() {
                let mut member = zip.by_index(i).unwrap();
                let mut out = std::fs::File::create(dir.path().join(member.name())).unwrap();
                std::io::copy(&mut member, &mut out).unwrap();
            }
            let from_archive = read_npz_bytes(&bytes).unwrap();
            prop_assert_eq!(&npz::read_npy_dir(dir.path()).unwrap(), &from_archive);
            prop_assert_eq!(load(dir.path()).unwrap(), from_archive);
        }

        #[test]
        fn edgelist_round_trip(g in graphs(), csv in any::<bool>(), header in any::<bool>()) {
            let sep = if csv { "," } else { "\t" };
            let mut text = String::from("# generated\n");
            if header {
                text += "source,target\n";
            }
            for e in 0..g.num_edges() {
                let w = weight_of(&g, e).replace(' ', sep);
                text += &format!("{}{sep}{}{w}\n", g.src[e], g.dst[e]);
            }
            let opts = EdgeListOptions { num_nodes: Some(g.num_nodes), one_based: false };
            let back = read_edgelist(text.as_bytes(), &opts).unwrap();
            let weights = if g.num_edges() == 0 { None } else { g.weights.clone() };
            prop_assert_eq!(back, Graph { weights, ..Graph::from_edges(g.num_nodes, g.src, g.dst) });
        }

        #[test]
        fn mtx_round_trip(g in graphs()) {
            let field = if g.weights.is_some() { "real" } else { "pattern" };
            let mut text = format!(
                "%%MatrixMarket matrix coordinate {field} general\n{n} {n} {}\n",
                g.num_edges(),
                n = g.num_nodes
            );
            for e in 0..g.num_edges() {
                // Entry (row, col) = (dst + 1, src + 1).
                text += &format!("{} {}{}\n", g.dst[e] + 1, g.src[e] + 1, weight_of(&g, e));
            }
            let back = read_mtx(text.as_bytes()).unwrap();
            prop_assert_eq!(back, Graph { weights: g.weights.clone(), ..Graph::from_edges(g.num_nodes, g.src, g.dst) });
        }

        #[test]
        fn metis_round_trip(g in graphs()) {
            // METIS lists undirected graphs: symmetrise without self loops, one line per node.
            let mut adj = vec![Vec::new(); g.num_nodes];
            for (&u, &v) in g.src.iter().zip(&g.dst) {
                if u != v {
                    adj[v as usize].push(u);
                    adj[u as usize].push(v);
                }
            }
            let entries: usize = adj.iter().map(Vec::len).sum();
            let mut text = format!("{} {}\n", g.num_nodes, entries / 2);
            for list in &adj {
                let line: Vec<String> = list.iter().map(|v| (v + 1).to_string()).collect();
                text += &line.join(" ");
                text += "\n";
            }
            let back = read_metis(text.as_bytes()).unwrap();
            let mut expected: Vec<(u32, u32)> = adj
                .iter()
                .enumerate()
                .flat_map(|(u, l)| l.iter().map(move |&v| (v, u as u32)))
                .collect();
            expected.sort_unstable();
            prop_assert_eq!(back.num_nodes, g.num_nodes);
            prop_assert_eq!(sorted_edges(&back), expected);
        }

        /// Arbitrary bytes: an error or a valid graph, never a panic.
        #[test]
        fn readers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let results = [
                read_mtx(&bytes[..]),
                read_metis(&bytes[..]),
                read_edgelist(&bytes[..], &EdgeListOptions::default()),
                read_npz_bytes(&bytes),
            ];
            for g in results.iter().flatten() {
                prop_assert!(g.validate().is_ok());
            }
        }

        /// A valid archive with bytes overwritten: an error or a valid graph, never a panic.
        #[test]
        fn corrupted_npz_never_panics(
            g in graphs(),
            hits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let mut bytes = write_npz_bytes(&g).unwrap();
            for (at, value) in hits {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            if let Ok(back) = read_npz_bytes(&bytes) {
                prop_assert!(back.validate().is_ok());
            }
        }
    }
}

#[test]
fn the_fingerprint_tells_contents_apart() {
    let g = sample();
    assert_eq!(g.fingerprint(), g.clone().fingerprint());
    let mut features = g.clone();
    if let Some(x) = features.features.as_mut() {
        x.data[0] += 1.0;
    }
    let mut labels = g.clone();
    if let Some(y) = labels.labels.as_mut() {
        y[0] = 1 - y[0];
    }
    let mut edges = g.clone();
    edges.dst.swap(0, 1);
    let no_mask = Graph {
        train_mask: None,
        ..g.clone()
    };
    for (what, other) in [
        ("features", features),
        ("labels", labels),
        ("edges", edges),
        ("mask", no_mask),
    ] {
        assert_ne!(g.fingerprint(), other.fingerprint(), "{what}");
    }
}

#[test]
fn multi_label_targets_are_validated_and_fingerprinted() {
    let base = || Graph::from_edges(3, vec![0, 1], vec![1, 2]);
    let targets = |classes: usize, data: Vec<u8>| Some(Targets { classes, data });
    let mut g = base();
    g.targets = targets(2, vec![1, 0, TARGET_UNLABELLED, TARGET_UNLABELLED, 0, 0]);
    g.validate().unwrap();
    assert_eq!(g.num_classes(), 2);
    // The targets are part of the identity; a graph without any keeps its own.
    assert_ne!(g.fingerprint(), base().fingerprint());
    let mut other = g.clone();
    other.targets.as_mut().unwrap().data[5] = 1;
    assert_ne!(other.fingerprint(), g.fingerprint());
    for (edit, what) in [
        (
            Box::new(|g: &mut Graph| g.labels = Some(vec![0, 1, 0])) as Box<dyn Fn(&mut Graph)>,
            "both class labels and multi-label targets",
        ),
        (
            Box::new(|g: &mut Graph| g.targets = targets(1, vec![0, 1, 1])),
            "2 to 65536 classes",
        ),
        (
            Box::new(|g: &mut Graph| g.targets = targets(2, vec![0, 1, 1, 1])),
            "4 target values for 3 nodes",
        ),
        (
            Box::new(|g: &mut Graph| g.targets = targets(2, vec![0, 1, 1, 2, 0, 0])),
            "node 1's targets",
        ),
        (
            Box::new(|g: &mut Graph| {
                g.targets = targets(2, vec![0, TARGET_UNLABELLED, 1, 1, 0, 0])
            }),
            "node 0's targets mix -1",
        ),
    ] {
        let mut bad = g.clone();
        edit(&mut bad);
        let e = bad.validate().unwrap_err();
        assert!(e.to_string().contains(what), "{what}: {e}");
        assert_eq!(e.location(), &Location::Array("y".into()));
    }
}
