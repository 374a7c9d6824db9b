use super::super::generate::{csbm, rmat, CsbmParams};
use super::super::{load, Location};
use super::*;
use std::vec;

/// One array of a hand-built archive: name, descr, shape, raw little-endian data.
struct Array {
    name: &'static str,
    descr: &'static str,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn array(name: &'static str, descr: &'static str, shape: &[u64], data: Vec<u8>) -> Array {
    Array {
        name,
        descr,
        shape: shape.to_vec(),
        data,
    }
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f64s(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn header_for(descr: &str, shape: &[u64], fortran: bool) -> Vec<u8> {
    npy_header_text(descr, fortran, shape)
}

fn archive_with(entries: Vec<(String, Vec<u8>)>, method: CompressionMethod) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in entries {
        zip.start_file(name, options).unwrap();
        zip.write_all(&bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn archive(arrays: Vec<Array>, method: CompressionMethod) -> Vec<u8> {
    let entries = arrays
        .into_iter()
        .map(|a| {
            let mut bytes = header_for(a.descr, &a.shape, false);
            bytes.extend_from_slice(&a.data);
            (format!("{}.npy", a.name), bytes)
        })
        .collect();
    archive_with(entries, method)
}

fn triangle_edges() -> Array {
    array("edge_index", "<i8", &[2, 3], i64s(&[0, 1, 2, 1, 2, 0]))
}

#[test]
fn reads_stored_entries_and_narrow_dtypes() {
    let bytes = archive(
        vec![
            array("edge_index", "<i4", &[2, 3], i32s(&[0, 1, 2, 1, 2, 0])),
            array("num_nodes", "<i8", &[1], i64s(&[4])),
            array(
                "x",
                "<f8",
                &[4, 2],
                f64s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
            ),
            array("y", "<i4", &[4], i32s(&[0, 1, -1, 2])),
            array("train_mask", "|u1", &[4], vec![1, 0, 0, 1]),
            array("edge_weight", "<f8", &[3], f64s(&[0.5, 1.0, 2.0])),
            array("unrelated", "<f4", &[1], f32s(&[1.0])),
        ],
        CompressionMethod::Stored,
    );
    let g = read_npz_bytes(&bytes).unwrap();
    assert_eq!(g.num_nodes, 4);
    assert_eq!(
        (g.src.clone(), g.dst.clone()),
        (vec![0, 1, 2], vec![1, 2, 0])
    );
    let f = g.features.as_ref().unwrap();
    assert_eq!((f.dim, f.row(3)), (2, &[7.0f32, 8.0][..]));
    assert_eq!(g.labels, Some(vec![0, 1, -1, 2]));
    assert_eq!(g.num_classes(), 3);
    assert_eq!(g.train_mask, Some(vec![true, false, false, true]));
    assert_eq!(g.weights, Some(vec![0.5, 1.0, 2.0]));
    assert!(g.val_mask.is_none() && g.test_mask.is_none());
}

/// Writes a `.npy` entry whose data is in column-major order.
fn fortran_entry(name: &str, descr: &str, shape: &[u64], data: Vec<u8>) -> (String, Vec<u8>) {
    let mut bytes = header_for(descr, shape, true);
    bytes.extend(data);
    (format!("{name}.npy"), bytes)
}

#[test]
fn reads_fortran_order_2d_arrays() {
    // edge_index (2, 3) column-major: pairs (src, dst); x (3, 2) column-major: column by column.
    let bytes = archive_with(
        vec![
            fortran_entry("edge_index", "<i8", &[2, 3], i64s(&[0, 1, 1, 2, 2, 0])),
            fortran_entry(
                "x",
                "<f4",
                &[3, 2],
                f32s(&[1.0, 2.0, 3.0, 10.0, 20.0, 30.0]),
            ),
            fortran_entry("y", "<i8", &[3], i64s(&[2, 1, 0])),
        ],
        CompressionMethod::Deflated,
    );
    let g = read_npz_bytes(&bytes).unwrap();
    assert_eq!((g.src, g.dst), (vec![0, 1, 2], vec![1, 2, 0]));
    assert_eq!(
        g.features.unwrap().data.into_vec(),
        vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0]
    );
    assert_eq!(g.labels, Some(vec![2, 1, 0]));
}

#[test]
fn node_count_falls_back_to_x_then_ids() {
    let with_x = archive(
        vec![
            triangle_edges(),
            array("x", "<f4", &[5, 1], f32s(&[0.0; 5])),
        ],
        CompressionMethod::Deflated,
    );
    assert_eq!(read_npz_bytes(&with_x).unwrap().num_nodes, 5);
    let bare = archive(vec![triangle_edges()], CompressionMethod::Deflated);
    assert_eq!(read_npz_bytes(&bare).unwrap().num_nodes, 3);
}

#[test]
fn round_trip_with_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.npz");
    let mut g = csbm(&CsbmParams {
        nodes: 300,
        ..CsbmParams::default()
    })
    .unwrap();
    g.weights = Some((0..g.num_edges()).map(|e| e as f32 * 0.25 - 3.0).collect());
    g.labels.as_mut().unwrap()[7] = -1;
    write_npz(&path, &g).unwrap();
    assert_eq!(read_npz(&path).unwrap(), g);
    assert_eq!(load(&path).unwrap(), g);
    // Deterministic bytes, and no temporary file left behind.
    let first = std::fs::read(&path).unwrap();
    write_npz(&path, &g).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), first);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn round_trip_topology_only_and_empty() {
    let dir = tempfile::tempdir().unwrap();
    for g in [
        rmat(8, 4, 1).unwrap(),
        Graph::default(),
        Graph::from_edges(3, vec![], vec![]),
    ] {
        let path = dir.path().join("t.npz");
        write_npz(&path, &g).unwrap();
        assert_eq!(read_npz(&path).unwrap(), g);
    }
}

#[test]
fn header_format_matches_numpy() {
    let h = npy_header(Dtype::I64, &[2, 10556]);
    assert_eq!(h.len() % 64, 0);
    assert!(h.ends_with(b"\n"));
    let text = std::str::from_utf8(&h[10..]).unwrap();
    assert!(text.starts_with("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 10556), }"));
    let parsed = read_npy_header(&mut &h[..]).unwrap();
    assert_eq!(parsed.shape, vec![2, 10556]);
    assert_eq!(parsed.prefix_len, h.len() as u64);
    let scalar = read_npy_header(&mut &npy_header(Dtype::I64, &[])[..]).unwrap();
    assert!(scalar.shape.is_empty() && scalar.count() == Some(1));
}

#[test]
fn header_parser_is_strict() {
    for text in [
        "{'descr': '<i8', 'fortran_order': False}",
        "{'descr': '<i8', 'fortran_order': Maybe, 'shape': (1,)}",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (x,)}",
        "{'descr': '<i8, 'fortran_order': False, 'shape': (1,)}",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (1,)} junk",
        "['descr']",
    ] {
        assert!(parse_header_dict(text.as_bytes()).is_err(), "{text}");
    }
    let (d, f, s) =
        parse_header_dict(b"{\"descr\":\"<f4\",\"fortran_order\":True,\"shape\":(3L,4L)}  \n")
            .unwrap();
    assert_eq!((d.as_str(), f, s), ("<f4", true, vec![3, 4]));
}

/// Reads `bytes` and returns the error, which must name `array`.
fn error_in(bytes: &[u8], array: &str) -> GraphError {
    let e = read_npz_bytes(bytes).unwrap_err();
    assert_eq!(e.location(), &Location::Array(array.into()), "{e}");
    assert!(format!("{e}").contains(&format!("array {array:?}")), "{e}");
    e
}

#[test]
fn missing_edge_index() {
    let bytes = archive(
        vec![array("x", "<f4", &[1, 1], f32s(&[1.0]))],
        CompressionMethod::Stored,
    );
    let e = error_in(&bytes, "edge_index");
    assert!(matches!(e.kind(), GraphErrorKind::MissingArray));
}

#[test]
fn unsupported_dtypes() {
    for (descr, name) in [
        (">i8", "edge_index"),
        ("<f4", "edge_index"),
        ("<U4", "edge_index"),
    ] {
        let bytes = archive(
            vec![array(name, descr, &[2, 1], vec![0; 16])],
            CompressionMethod::Stored,
        );
        let e = error_in(&bytes, name);
        assert!(
            matches!(e.kind(), GraphErrorKind::Dtype { .. }),
            "{descr}: {e}"
        );
    }
    let bytes = archive(
        vec![triangle_edges(), array("y", "<f8", &[3], f64s(&[0.0; 3]))],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "y").kind(),
        GraphErrorKind::Dtype { .. }
    ));
}

#[test]
fn bad_npy_headers() {
    let mut not_npy = b"PK not numpy at all".to_vec();
    not_npy.resize(64, b' ');
    let fortran_3d = {
        let mut b = header_for("<i8", &[2, 1, 1], true);
        b.extend(i64s(&[0, 0]));
        b
    };
    for entry in [not_npy, fortran_3d] {
        let bytes = archive_with(
            vec![("edge_index.npy".into(), entry)],
            CompressionMethod::Stored,
        );
        let e = error_in(&bytes, "edge_index");
        assert!(matches!(e.kind(), GraphErrorKind::BadHeader(_)), "{e}");
    }
}

#[test]
fn shapes_and_lengths_must_agree() {
    // Wrong rank for edge_index.
    let bytes = archive(
        vec![array("edge_index", "<i8", &[3, 1], i64s(&[0, 0, 0]))],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "edge_index").kind(),
        GraphErrorKind::LengthMismatch(_)
    ));
    // Data shorter than the shape (truncated entry).
    let bytes = archive(
        vec![array("edge_index", "<i8", &[2, 3], i64s(&[0, 1, 2]))],
        CompressionMethod::Deflated,
    );
    assert!(matches!(
        error_in(&bytes, "edge_index").kind(),
        GraphErrorKind::LengthMismatch(_)
    ));
    // One weight per edge.
    let bytes = archive(
        vec![
            triangle_edges(),
            array("edge_weight", "<f4", &[2], f32s(&[1.0, 1.0])),
        ],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "edge_weight").kind(),
        GraphErrorKind::LengthMismatch(_)
    ));
    // Labels for a different node count than x (caught by validation, still naming the array).
    let bytes = archive(
        vec![
            triangle_edges(),
            array("x", "<f4", &[3, 1], f32s(&[0.0; 3])),
            array("y", "<i8", &[2], i64s(&[0, 1])),
        ],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "y").kind(),
        GraphErrorKind::LengthMismatch(_)
    ));
}

#[test]
fn negative_and_out_of_range_ids() {
    let bytes = archive(
        vec![array("edge_index", "<i8", &[2, 2], i64s(&[0, -4, 1, 1]))],
        CompressionMethod::Deflated,
    );
    assert!(matches!(
        error_in(&bytes, "edge_index").kind(),
        GraphErrorKind::NegativeId(-4)
    ));
    let bytes = archive(
        vec![triangle_edges(), array("num_nodes", "<i8", &[], i64s(&[2]))],
        CompressionMethod::Deflated,
    );
    let e = error_in(&bytes, "edge_index");
    assert!(
        matches!(
            e.kind(),
            GraphErrorKind::IdOutOfRange {
                id: 2,
                num_nodes: 2
            }
        ),
        "{e}"
    );
    let bytes = archive(
        vec![array("edge_index", "<i8", &[2, 1], i64s(&[1 << 33, 0]))],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "edge_index").kind(),
        GraphErrorKind::TooManyNodes(_)
    ));
    // Without num_nodes, x's rows give the node count: ids beyond them blame x (too few rows),
    // not the edges; likewise y or a mask when they give the count.
    let bytes = archive(
        vec![
            triangle_edges(),
            array("x", "<f4", &[2, 1], f32s(&[0.0; 2])),
        ],
        CompressionMethod::Stored,
    );
    let e = error_in(&bytes, "x");
    assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)), "{e}");
    assert!(
        format!("{e}").contains("x has 2 rows but edge_index reaches node 2"),
        "{e}"
    );
    let bytes = archive(
        vec![triangle_edges(), array("y", "<i8", &[1], i64s(&[0]))],
        CompressionMethod::Deflated,
    );
    assert!(format!("{}", error_in(&bytes, "y")).contains("y has 1 labels"));
    // With num_nodes declared, the edges are at fault.
    let bytes = archive(
        vec![
            triangle_edges(),
            array("num_nodes", "<i8", &[], i64s(&[2])),
            array("x", "<f4", &[2, 1], f32s(&[0.0; 2])),
        ],
        CompressionMethod::Stored,
    );
    error_in(&bytes, "edge_index");
}

#[test]
fn non_finite_values() {
    let bytes = archive(
        vec![
            triangle_edges(),
            array("x", "<f4", &[3, 1], f32s(&[0.0, f32::NAN, 1.0])),
        ],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "x").kind(),
        GraphErrorKind::NonFinite(_)
    ));
    let bytes = archive(
        vec![
            triangle_edges(),
            array("edge_weight", "<f8", &[3], f64s(&[1.0, 1e300, 1.0])),
        ],
        CompressionMethod::Stored,
    );
    let e = error_in(&bytes, "edge_weight");
    assert!(
        matches!(e.kind(), GraphErrorKind::NonFinite(v) if *v == 1e300),
        "{e}"
    );
}

#[test]
fn invalid_labels_and_masks() {
    let bytes = archive(
        vec![triangle_edges(), array("y", "<i8", &[3], i64s(&[0, -2, 1]))],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "y").kind(),
        GraphErrorKind::Invalid(_)
    ));
    let bytes = archive(
        vec![
            triangle_edges(),
            array("val_mask", "|u1", &[3], vec![0, 2, 1]),
        ],
        CompressionMethod::Stored,
    );
    assert!(matches!(
        error_in(&bytes, "val_mask").kind(),
        GraphErrorKind::Invalid(_)
    ));
}

#[test]
fn multi_label_targets_are_read_from_every_dtype_and_order() {
    // Three nodes, two classes; node 1 unlabelled (a row of -1).
    let expected = Targets {
        classes: 2,
        data: vec![1, 0, TARGET_UNLABELLED, TARGET_UNLABELLED, 0, 1],
    };
    let rows = [1i64, 0, -1, -1, 0, 1];
    let as_f = |v: &[i64]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let floats32: Vec<f32> = rows.iter().map(|&x| x as f32).collect();
    for y in [
        array("y", "<i8", &[3, 2], i64s(&rows)),
        array(
            "y",
            "<i4",
            &[3, 2],
            i32s(&rows.map(|x| i32::try_from(x).unwrap())),
        ),
        array("y", "<f8", &[3, 2], f64s(&as_f(&rows))),
        array("y", "<f4", &[3, 2], f32s(&floats32)),
    ] {
        let descr = y.descr;
        let g = read_npz_bytes(&archive(
            vec![triangle_edges(), y],
            CompressionMethod::Stored,
        ))
        .unwrap();
        assert_eq!(g.targets.as_ref(), Some(&expected), "{descr}");
        assert_eq!((g.labels.as_ref(), g.num_classes()), (None, 2), "{descr}");
    }
    // Booleans and bytes hold labelled rows only.
    let g = read_npz_bytes(&archive(
        vec![
            triangle_edges(),
            array("y", "|b1", &[3, 2], vec![1, 0, 1, 1, 0, 1]),
        ],
        CompressionMethod::Deflated,
    ))
    .unwrap();
    assert_eq!(g.targets.unwrap().data, [1, 0, 1, 1, 0, 1]);
    // Column-major: class 0 of every node, then class 1.
    let g = read_npz_bytes(&archive_with(
        vec![
            fortran_entry("edge_index", "<i8", &[2, 3], i64s(&[0, 1, 1, 2, 2, 0])),
            fortran_entry("y", "<i8", &[3, 2], i64s(&[1, -1, 0, 0, -1, 1])),
        ],
        CompressionMethod::Deflated,
    ))
    .unwrap();
    assert_eq!(g.targets, Some(expected.clone()));
    // Written back as int64 (N, C), -1 for unlabelled rows, and read the same.
    let again = read_npz_bytes(&write_npz_bytes(&g).unwrap()).unwrap();
    assert_eq!(again, g);
    // (N, 1) stays one class id per node.
    let g = read_npz_bytes(&archive(
        vec![
            triangle_edges(),
            array("y", "<i8", &[3, 1], i64s(&[2, 0, 1])),
        ],
        CompressionMethod::Stored,
    ))
    .unwrap();
    assert_eq!((g.labels, g.targets), (Some(vec![2, 0, 1]), None));
}

#[test]
fn invalid_multi_label_targets_name_y() {
    for (y, what) in [
        (
            array("y", "<i8", &[3, 2], i64s(&[1, 0, 2, 0, 0, 1])),
            "target value 2 is not 0 or 1",
        ),
        (
            array("y", "<f4", &[3, 2], f32s(&[1.0, 0.5, 0.0, 0.0, 0.0, 1.0])),
            "target value 0.5 is not 0 or 1",
        ),
        (
            array(
                "y",
                "<f8",
                &[3, 2],
                f64s(&[1.0, f64::NAN, 0.0, 0.0, 0.0, 1.0]),
            ),
            "target value NaN",
        ),
        (
            array("y", "<i8", &[3, 2], i64s(&[1, 0, -1, 0, 0, 1])),
            "node 1's targets mix -1",
        ),
        (
            array("y", "<i8", &[2, 2], i64s(&[1, 0, 0, 1])),
            "4 target values for 3 nodes",
        ),
        (
            array("y", "<i8", &[3, 2, 1], i64s(&[1, 0, 0, 0, 0, 1])),
            "(N,) for class ids or (N, C)",
        ),
    ] {
        let e = error_in(
            &archive(
                vec![
                    triangle_edges(),
                    array("num_nodes", "<i8", &[], i64s(&[3])),
                    y,
                ],
                CompressionMethod::Stored,
            ),
            "y",
        );
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
}

#[test]
fn not_a_zip_and_empty_input() {
    for bytes in [&b""[..], b"definitely not a zip archive"] {
        let e = read_npz_bytes(bytes).unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::Invalid(_)), "{e}");
    }
}

#[test]
fn file_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.npz");
    std::fs::write(
        &path,
        archive(
            vec![array("x", "<f4", &[1], f32s(&[1.0]))],
            CompressionMethod::Stored,
        ),
    )
    .unwrap();
    let msg = format!("{}", load(&path).unwrap_err());
    assert!(
        msg.contains("broken.npz") && msg.contains("\"edge_index\""),
        "{msg}"
    );
    let missing = format!("{}", load(dir.path().join("absent.npz")).unwrap_err());
    assert!(missing.contains("absent.npz"), "{missing}");
}

#[test]
fn write_refuses_invalid_graphs_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.npz");
    let g = Graph::from_edges(2, vec![0, 5], vec![1, 0]);
    let e = write_npz(&path, &g).unwrap_err();
    assert!(matches!(e.kind(), GraphErrorKind::IdOutOfRange { .. }));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // A directory that does not exist: an I/O error naming the file.
    let e = write_npz(dir.path().join("no/such/dir/g.npz"), &Graph::default()).unwrap_err();
    assert!(matches!(e.kind(), GraphErrorKind::Io(_)) && format!("{e}").contains("g.npz"));
}

fn cora_path() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/datasets/cora.npz");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but the Cora dataset is missing at {}",
        path.display()
    );
    std::eprintln!(
        "skipping: {} not found (set CI=true to make this fail)",
        path.display()
    );
    None
}

#[test]
fn loads_cora() {
    let Some(path) = cora_path() else { return };
    let g = load(&path).unwrap();
    assert_eq!((g.num_nodes, g.num_edges()), (2708, 10556));
    let x = g.features.as_ref().unwrap();
    assert_eq!((x.dim, x.data.len()), (1433, 2708 * 1433));
    assert!(x.data.iter().all(|&v| v == 0.0 || v == 1.0));
    assert_eq!(g.num_classes(), 7);
    let count = |m: &Option<Vec<bool>>| m.as_ref().unwrap().iter().filter(|&&b| b).count();
    assert_eq!(
        (
            count(&g.train_mask),
            count(&g.val_mask),
            count(&g.test_mask)
        ),
        (140, 500, 1000)
    );
    // Both directions of every citation, no self loops.
    let mut fwd: Vec<(u32, u32)> = g.src.iter().copied().zip(g.dst.iter().copied()).collect();
    let mut rev: Vec<(u32, u32)> = fwd.iter().map(|&(u, v)| (v, u)).collect();
    fwd.sort_unstable();
    rev.sort_unstable();
    assert_eq!(fwd, rev);
    assert!(fwd.iter().all(|(u, v)| u != v));
    // And it survives our writer.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cora.npz");
    write_npz(&out, &g).unwrap();
    assert_eq!(read_npz(&out).unwrap(), g);
}

/// Writes `bytes` as `name` in `dir` and returns the path.
fn file_in(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// An `.npz` like `np.savez` writes (every member stored, no alignment), with a first member
/// of `pad` bytes that shifts where `x`'s data lands in the file.
fn savez_like(pad: usize, edges: &[i64], x: &[f32], shape: &[u64]) -> Vec<u8> {
    let e = (edges.len() / 2) as u64;
    let mut pad_member = vec![0u8; pad];
    pad_member.extend(header_for("<i8", &[2, 0], false));
    archive_with(
        vec![
            ("pad.npy".into(), pad_member),
            ("edge_index.npy".into(), {
                let mut b = header_for("<i8", &[2, e], false);
                b.extend(i64s(edges));
                b
            }),
            ("x.npy".into(), {
                let mut b = header_for("<f4", shape, false);
                b.extend(f32s(x));
                b
            }),
        ],
        CompressionMethod::Stored,
    )
}

#[test]
fn our_archives_and_npy_directories_map_their_features() {
    let dir = tempfile::tempdir().unwrap();
    let g = csbm(&CsbmParams {
        nodes: 200,
        features: 12,
        ..CsbmParams::default()
    })
    .unwrap();
    let path = dir.path().join("g.npz");
    write_npz(&path, &g).unwrap();
    let mapped = read_npz(&path).unwrap();
    assert!(mapped.features.as_ref().unwrap().data.is_mapped());
    assert_eq!(mapped, g);
    let copied = read_npz_with(&path, Mapping::Never).unwrap();
    assert!(!copied.features.as_ref().unwrap().data.is_mapped());
    assert_eq!(copied, g);

    // The same members unzipped into a directory.
    let npy = dir.path().join("g");
    std::fs::create_dir(&npy).unwrap();
    let mut zip = ZipArchive::new(File::open(&path).unwrap()).unwrap();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).unwrap();
        let mut out = File::create(npy.join(member.name())).unwrap();
        io::copy(&mut member, &mut out).unwrap();
    }
    let from_dir = read_npy_dir(&npy).unwrap();
    assert!(from_dir.features.as_ref().unwrap().data.is_mapped());
    assert_eq!(from_dir, g);
    assert_eq!(read_npy_dir_with(&npy, Mapping::Never).unwrap(), g);

    // Normalising mapped features in place copies them and leaves the file alone.
    let before = std::fs::read(&path).unwrap();
    let mut m = read_npz(&path).unwrap();
    let f = m.features.as_mut().unwrap();
    f.data[0] += 1.0;
    assert!(!f.data.is_mapped());
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn savez_archives_map_when_aligned_and_copy_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let edges = [0i64, 1, 2, 1, 2, 0];
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let mut seen = [false, false];
    for pad in 0..8 {
        let path = file_in(dir.path(), "s.npz", &savez_like(pad, &edges, &x, &[3, 4]));
        let g = read_npz(&path).unwrap();
        let f = g.features.as_ref().unwrap();
        assert_eq!((f.dim, &f.data[..]), (4, &x[..]), "pad {pad}");
        seen[usize::from(f.data.is_mapped())] = true;
        assert_eq!(read_npz_with(&path, Mapping::Never).unwrap(), g);
    }
    assert_eq!(
        seen,
        [true, true],
        "both the mapped and the copying path ran"
    );
}

#[test]
fn mapped_features_are_checked_like_copied_ones() {
    let dir = tempfile::tempdir().unwrap();
    let npy = dir.path().join("bad");
    std::fs::create_dir(&npy).unwrap();
    let mut e = header_for("<i8", &[2, 3], false);
    e.extend(i64s(&[0, 1, 2, 1, 2, 0]));
    file_in(&npy, "edge_index.npy", &e);
    let mut x = header_for("<f4", &[3, 1], false);
    x.extend(f32s(&[0.0, f32::INFINITY, 1.0]));
    file_in(&npy, "x.npy", &x);
    for map in [Mapping::Allowed, Mapping::Never] {
        let err = read_npy_dir_with(&npy, map).unwrap_err();
        assert!(
            matches!(err.kind(), GraphErrorKind::NonFinite(v) if v.is_infinite()),
            "{err}"
        );
        assert!(
            matches!(err.location(), Location::Array(a) if a == "x"),
            "{err}"
        );
    }
    // A shape that does not match the data is refused before mapping.
    let mut x = header_for("<f4", &[4, 1], false);
    x.extend(f32s(&[0.0, 1.0, 1.0]));
    file_in(&npy, "x.npy", &x);
    let err = read_npy_dir(&npy).unwrap_err();
    assert!(
        matches!(err.kind(), GraphErrorKind::LengthMismatch(_)),
        "{err}"
    );
}

#[test]
fn a_truncated_archive_says_so_and_how_to_fix_it() {
    let g = csbm(&CsbmParams {
        nodes: 100,
        features: 4,
        ..CsbmParams::default()
    })
    .unwrap();
    let bytes = write_npz_bytes(&g).unwrap();
    for cut in [1, 30, bytes.len() / 2] {
        let err = read_npz_bytes(&bytes[..bytes.len() - cut]).unwrap_err();
        let text = format!("{err}");
        assert!(
            text.contains("truncated") && text.contains("re-create it"),
            "{cut}: {text}"
        );
        assert!(!text.contains("failed to fill whole buffer"), "{text}");
    }
}

/// A directory of `.npy` files holding a triangle's `edge_index.npy` (and `x.npy` with
/// `rows × 1` features when `rows > 0`).
fn triangle_dir(parent: &Path, rows: usize) -> PathBuf {
    let npy = parent.join("g");
    std::fs::create_dir(&npy).unwrap();
    let mut e = header_for("<i8", &[2, 3], false);
    e.extend(i64s(&[0, 1, 2, 1, 2, 0]));
    file_in(&npy, "edge_index.npy", &e);
    if rows > 0 {
        let mut x = header_for("<f4", &[rows as u64, 1], false);
        x.extend(f32s(&vec![1.5; rows]));
        file_in(&npy, "x.npy", &x);
    }
    npy
}

#[test]
fn npy_entries_that_are_not_regular_files_are_errors_not_absent() {
    let dir = tempfile::tempdir().unwrap();
    let npy = triangle_dir(dir.path(), 3);
    read_npy_dir(&npy).unwrap();
    let fifo = |path: &Path| {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(made.success());
    };
    for (name, what) in [
        ("y", "is a directory"),
        ("train_mask", "a symbolic link to /dev/zero, a device"),
        ("x", "which does not exist"),
        ("val_mask", "a FIFO (named pipe)"),
    ] {
        let path = npy.join(format!("{name}.npy"));
        let _ = std::fs::remove_file(&path);
        match name {
            "y" => std::fs::create_dir(&path).unwrap(),
            "train_mask" => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
            "x" => std::os::unix::fs::symlink("no-such-file.npy", &path).unwrap(),
            _ => fifo(&path),
        }
        let err = read_npy_dir(&npy).unwrap_err();
        let text = format!("{err}");
        assert!(
            text.contains(&format!("`{name}.npy` is")) && text.contains(what),
            "{name}: {text}"
        );
        assert!(text.contains("not a regular file"), "{text}");
        match std::fs::symlink_metadata(&path).unwrap().is_dir() {
            true => std::fs::remove_dir(&path).unwrap(),
            false => std::fs::remove_file(&path).unwrap(),
        }
    }
    // A FIFO edge_index.npy is named as what it is, not as missing.
    let edges = npy.join("edge_index.npy");
    std::fs::remove_file(&edges).unwrap();
    fifo(&edges);
    let text = format!("{}", read_npy_dir(&npy).unwrap_err());
    assert!(text.contains("`edge_index.npy` is a FIFO"), "{text}");
    assert!(
        !text.contains("missing") && !text.contains("without"),
        "{text}"
    );
}

#[test]
fn a_mapped_x_truncated_after_loading_is_reported_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    // Enough rows for several pages of values past the truncation point.
    let rows = 20_000;
    let npy = triangle_dir(dir.path(), rows);
    let g = read_npy_dir(&npy).unwrap_or_else(|e| panic!("{e}"));
    let f = g.features.as_ref().unwrap();
    assert!(f.data.is_mapped());
    g.check_unchanged().unwrap();
    let x = npy.join("x.npy");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&x)
        .unwrap()
        .set_len(4096)
        .unwrap();
    // Reading every value past the new end would be SIGBUS without the guard: zeros instead.
    let zeros = f.data.iter().filter(|&&v| v == 0.0).count();
    assert!(zeros > 0 && zeros < rows, "{zeros}");
    let err = g.check_unchanged().unwrap_err();
    assert!(matches!(err.kind(), GraphErrorKind::InputChanged), "{err}");
    assert_eq!(err.file(), Some(x.as_path()));
}

mod mapping_properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever the graph and wherever `x` lands in the file, the mapping readers give
        /// exactly the copying readers' graph.
        #[test]
        fn mapped_readers_agree_with_copying_readers(
            n in 1usize..20,
            dim in 1usize..6,
            pad in 0usize..16,
            edges in proptest::collection::vec((0i64..20, 0i64..20), 0..30),
            seed in any::<u32>(),
        ) {
            let edges: Vec<(i64, i64)> = edges.into_iter().map(|(a, b)| (a % n as i64, b % n as i64)).collect();
            let flat: Vec<i64> = edges.iter().map(|e| e.0).chain(edges.iter().map(|e| e.1)).collect();
            let x: Vec<f32> = (0..n * dim).map(|i| (u32::try_from(i).unwrap().wrapping_mul(2_654_435_761) ^ seed) as f32 * 1e-9).collect();
            let dir = tempfile::tempdir().unwrap();
            let path = file_in(dir.path(), "s.npz", &savez_like(pad, &flat, &x, &[n as u64, dim as u64]));
            let copied = read_npz_with(&path, Mapping::Never).unwrap();
            prop_assert_eq!(&read_npz(&path).unwrap(), &copied);
            let ours = dir.path().join("ours.npz");
            write_npz(&ours, &copied).unwrap();
            let mapped = read_npz(&ours).unwrap();
            prop_assert!(mapped.features.as_ref().unwrap().data.is_mapped());
            prop_assert_eq!(&mapped, &copied);
        }
    }
}
