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
            data: vec![0.0; 6],
        }),
        labels: Some(vec![0, -1, 1]),
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
                    data: vec![0.0; 5],
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
