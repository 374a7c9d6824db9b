//! Feeds `.npz` archives to `graph::npz::read_npz_bytes`, two ways per input: the raw bytes (zip
//! container parsing), and an archive assembled from the input's structure — PyG array names,
//! well-formed or mangled `.npy` headers with arbitrary dtypes and shapes, element data — so that
//! the `.npy` and graph-level checks behind the zip CRCs get exercised. Everything accepted must
//! be a valid graph that survives an `.npz` round trip. An assembled archive the whole reader
//! accepts is also read in slices, as the ranks of `partition --distributed` read it
//! (`read_slice` at 1–3 ranks): every slice it accepts must be the whole graph's, cut.
#![no_main]

mod common;

use std::io::{Cursor, Write};

use arbitrary::{Arbitrary, Unstructured};
use distspmm_prep::graph::npz::{read_npz_bytes, read_slice, SliceNodes};
use distspmm_prep::graph::{slice_range, Graph, GraphSlice};
use libfuzzer_sys::fuzz_target;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

#[derive(Debug, Arbitrary)]
enum Name {
    EdgeIndex,
    NumNodes,
    EdgeWeight,
    X,
    Y,
    TrainMask,
    ValMask,
    TestMask,
    Ignored,
    /// Any name, e.g. a path with a directory or no `.npy` suffix.
    Other(String),
}

impl Name {
    fn file(&self) -> String {
        let base = match self {
            Name::EdgeIndex => "edge_index",
            Name::NumNodes => "num_nodes",
            Name::EdgeWeight => "edge_weight",
            Name::X => "x",
            Name::Y => "y",
            Name::TrainMask => "train_mask",
            Name::ValMask => "val_mask",
            Name::TestMask => "test_mask",
            Name::Ignored => "extra",
            Name::Other(s) => return s.clone(),
        };
        format!("{base}.npy")
    }
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Descr {
    I8,
    I4,
    F4,
    F8,
    B1,
    U1,
    BigEndianI8,
    Object,
}

impl Descr {
    fn text(self) -> &'static str {
        match self {
            Descr::I8 => "<i8",
            Descr::I4 => "<i4",
            Descr::F4 => "<f4",
            Descr::F8 => "<f8",
            Descr::B1 => "|b1",
            Descr::U1 => "|u1",
            Descr::BigEndianI8 => ">i8",
            Descr::Object => "|O",
        }
    }

    /// Element `v` encoded in this dtype (small values, so ids and labels are often in range;
    /// `v = 255` encodes −1 for the integer types).
    fn encode(self, v: u8, out: &mut Vec<u8>) {
        let i = if v == 255 { -1 } else { i64::from(v) };
        match self {
            Descr::I8 | Descr::Object => out.extend_from_slice(&i.to_le_bytes()),
            Descr::BigEndianI8 => out.extend_from_slice(&i.to_be_bytes()),
            Descr::I4 => out.extend_from_slice(&(i as i32).to_le_bytes()),
            Descr::F4 => out.extend_from_slice(&(f32::from(v) / 4.0 - 1.0).to_le_bytes()),
            Descr::F8 => out.extend_from_slice(&(f64::from(v) / 4.0 - 1.0).to_le_bytes()),
            Descr::B1 | Descr::U1 => out.push(v % 3),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Dim {
    Small(u8),
    Huge(u64),
}

#[derive(Debug, Arbitrary)]
struct Header {
    descr: Descr,
    fortran: bool,
    shape: Vec<Dim>,
    /// numpy's `'shape': (2, 5), }` vs a hand-written variant with no trailing comma.
    trailing_comma: bool,
    /// Replace the header text with arbitrary bytes.
    mangled: Option<Vec<u8>>,
    version: u8,
}

#[derive(Debug, Arbitrary)]
struct Entry {
    name: Name,
    header: Option<Header>,
    values: Vec<u8>,
    raw_tail: Vec<u8>,
    deflate: bool,
}

fn npy(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(h) = &entry.header else {
        out.extend_from_slice(&entry.values);
        out.extend_from_slice(&entry.raw_tail);
        return out;
    };
    let text = match &h.mangled {
        Some(bytes) => bytes.clone(),
        None => {
            let dims: Vec<String> = h
                .shape
                .iter()
                .map(|d| match d {
                    Dim::Small(v) => v.to_string(),
                    Dim::Huge(v) => v.to_string(),
                })
                .collect();
            let shape = match dims.len() {
                1 => format!("({},)", dims[0]),
                _ => format!("({})", dims.join(", ")),
            };
            let fortran = if h.fortran { "True" } else { "False" };
            let tail = if h.trailing_comma { ", }" } else { "}" };
            let mut t = format!(
                "{{'descr': '{}', 'fortran_order': {fortran}, 'shape': {shape}{tail}",
                h.descr.text()
            )
            .into_bytes();
            while (10 + t.len() + 1) % 64 != 0 {
                t.push(b' ');
            }
            t.push(b'\n');
            t
        }
    };
    out.extend_from_slice(b"\x93NUMPY");
    let version = h.version % 4;
    out.push(version);
    out.push(0);
    if version == 1 || version == 0 {
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&text);
    for &v in &entry.values {
        h.descr.encode(v, &mut out);
    }
    out.extend_from_slice(&entry.raw_tail);
    out
}

fn archive(entries: &[Entry]) -> Option<Vec<u8>> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for e in entries {
        let method = if e.deflate {
            CompressionMethod::Deflated
        } else {
            CompressionMethod::Stored
        };
        let options = SimpleFileOptions::default().compression_method(method);
        // Duplicate or unusable names are the zip writer's to refuse, not ours to test.
        zip.start_file(e.name.file(), options).ok()?;
        zip.write_all(&npy(e)).ok()?;
    }
    Some(zip.finish().ok()?.into_inner())
}

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = read_npz_bytes(data) {
        common::check_graph(&g);
    }
    let mut u = Unstructured::new(data);
    let Ok(entries) = Vec::<Entry>::arbitrary(&mut u) else {
        return;
    };
    if let Some(bytes) = archive(&entries) {
        if let Ok(g) = read_npz_bytes(&bytes) {
            common::check_graph(&g);
            check_slices(&bytes, &g);
        }
    }
});

/// Every slice `read_slice` accepts of the archive `bytes` is `g` cut (a rank may refuse what
/// it cannot read without the whole array, e.g. Fortran-order node arrays).
fn check_slices(bytes: &[u8], g: &Graph) {
    // A file of its own, created exclusively (never one that already stood under the name).
    let Ok(mut file) = tempfile::Builder::new().suffix(".npz").tempfile() else {
        return;
    };
    if std::io::Write::write_all(&mut file, bytes).is_err() {
        return;
    }
    let path = file.path().to_path_buf();
    for ranks in 1..=3 {
        for rank in 0..ranks {
            let Ok((mut slice, nodes)) = read_slice(&path, rank, ranks) else {
                continue;
            };
            if let SliceNodes::AtLeast(n) = nodes {
                // The ranks agree on the largest bound: the graph's node count.
                assert!(n <= g.num_nodes, "bound {n} above {} nodes", g.num_nodes);
                let range = slice_range(g.num_nodes as u64, ranks, rank);
                slice.num_nodes = g.num_nodes;
                slice.first_node = range.start as usize;
                slice.nodes = Graph {
                    num_nodes: (range.end - range.start) as usize,
                    ..Graph::default()
                };
            }
            let mut whole = GraphSlice::cut(g, rank, ranks);
            if matches!(nodes, SliceNodes::AtLeast(_)) {
                whole.nodes = slice.nodes.clone();
            }
            assert_eq!(slice, whole, "rank {rank} of {ranks}");
        }
    }
    drop(file);
}
