//! One rank's slice of an `.npz` graph or a directory of `.npy` files: its share of the edges
//! and of the node arrays ([`super::super::slice_range`]), never the whole graph.
//!
//! An array stored as it is (every `.npy` of a directory, an uncompressed `.npz` member) is
//! read from its slice's first byte on (a seek); a compressed member is decompressed up to the
//! end of the slice, and only the slice is kept. Either way the memory is the slice's.
//! `edge_index` may be in C or Fortran order; the node arrays must be in C order (NumPy's
//! default; a Fortran-order array is refused with the fix).

use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;
use std::vec::Vec;

use super::{
    decode_floats, decode_ints, entry_exists, read_labels, read_mask, read_num_nodes, read_targets,
    vec_with_capacity, Arrays, Dtype, Graph, GraphError, GraphErrorKind, NpyDir, NpyHeader, Npz,
    BOOLS, FLOATS, INTS, MAX_NODES, Y_DTYPES,
};
use crate::graph::{Features, GraphSlice};
use distspmm_sparse::index;

/// How many nodes the graph has, as far as one rank's slice tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceNodes {
    /// Given by `num_nodes` or the length of a node array.
    Known(usize),
    /// No node array: the largest id in this rank's edges plus one (0 without edges); the
    /// graph's node count is the maximum over the ranks.
    AtLeast(usize),
}

/// Reads rank `rank`'s slice (of `ranks`) of the `.npz` file or `.npy` directory at `path`.
/// With [`SliceNodes::AtLeast`] the slice holds no node data and `num_nodes` is this rank's
/// lower bound: the caller agrees on the maximum and sets it.
pub fn read_slice(
    path: impl AsRef<Path>,
    rank: usize,
    ranks: usize,
) -> Result<(GraphSlice, SliceNodes), GraphError> {
    let path = path.as_ref();
    let inner = || {
        if path.is_dir() {
            if !entry_exists(&path.join("edge_index.npy")) {
                return Err(GraphErrorKind::Invalid(
                    "it is a directory without edge_index.npy: give an .npz file or a \
                     directory of .npy files named as in an .npz"
                        .into(),
                )
                .into());
            }
            read(NpyDir { dir: path }, rank, ranks)
        } else {
            let file = chunk_format::open_regular(path)?;
            let for_reads = file.try_clone()?;
            read(
                Npz::open(
                    BufReader::with_capacity(1 << 16, file),
                    Some((for_reads, path.to_path_buf())),
                )?,
                rank,
                ranks,
            )
        }
    };
    inner().map_err(|e| e.in_file(path))
}

/// Reads the element ranges `ranges` (ascending, disjoint) of array `name`, whose header
/// `ranges_of` turns into them, handing each range's reader to `read` in turn: by seeks when
/// the array is stored as it is, by reading past what lies between otherwise.
fn with_ranges(
    arrays: &mut impl Arrays,
    name: &str,
    allowed: &[Dtype],
    ranges_of: impl FnOnce(&NpyHeader) -> Result<Vec<Range<u64>>, GraphErrorKind>,
    mut read: impl FnMut(usize, &mut dyn Read, &NpyHeader) -> Result<(), GraphErrorKind>,
) -> Result<(), GraphError> {
    let at = |kind| GraphError::in_array(name, kind);
    if let Some(stored) = arrays.stored(name, allowed)? {
        let h = &stored.header;
        let size = h.dtype.size() as u64;
        let ranges = ranges_of(h).map_err(at)?;
        let mut file = stored.file;
        for (i, range) in ranges.iter().enumerate() {
            file.seek(SeekFrom::Start(stored.offset + range.start * size))
                .map_err(|e| at(GraphErrorKind::Io(e)))?;
            let mut r =
                BufReader::with_capacity(1 << 16, &mut file).take((range.end - range.start) * size);
            read(i, &mut r, h).map_err(at)?;
        }
        return Ok(());
    }
    arrays.with_array(name, allowed, |r, h| {
        let size = h.dtype.size() as u64;
        let mut pos = 0u64;
        for (i, range) in ranges_of(h)?.iter().enumerate() {
            let skip = (range.start - pos) * size;
            let skipped =
                io::copy(&mut r.take(skip), &mut io::sink()).map_err(GraphErrorKind::Io)?;
            if skipped != skip {
                return Err(GraphErrorKind::Invalid(
                    "the array data is truncated".into(),
                ));
            }
            read(i, &mut r.take((range.end - range.start) * size), h)?;
            pos = range.end;
        }
        Ok(())
    })
}

/// `h` with its first dimension `rows` (the header of a slice of rows).
fn rows_of(h: &NpyHeader, rows: u64) -> NpyHeader {
    let mut shape = h.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = rows;
    }
    NpyHeader {
        dtype: h.dtype,
        shape,
        fortran: h.fortran,
        prefix_len: 0,
    }
}

fn c_order(h: &NpyHeader) -> Result<(), GraphErrorKind> {
    if h.fortran && h.shape.len() > 1 && h.shape[1] > 1 {
        return Err(GraphErrorKind::Invalid(
            "the array is in Fortran (column) order, which a rank cannot read its rows of \
             without the whole array: save it in C order (numpy.ascontiguousarray)"
                .into(),
        ));
    }
    Ok(())
}

fn read(
    mut arrays: impl Arrays,
    rank: usize,
    ranks: usize,
) -> Result<(GraphSlice, SliceNodes), GraphError> {
    // The node count: declared, else the first node array's length.
    let declared = if arrays.has("num_nodes") {
        Some(arrays.with_array("num_nodes", INTS, read_num_nodes)?)
    } else {
        None
    };
    let mut from_arrays = None;
    for name in ["x", "y", "train_mask", "val_mask", "test_mask"] {
        if from_arrays.is_none() && arrays.has(name) {
            let allowed = match name {
                "x" => FLOATS,
                "y" => Y_DTYPES,
                _ => BOOLS,
            };
            let mut rows = 0u64;
            with_ranges(
                &mut arrays,
                name,
                allowed,
                |h| {
                    rows = h.shape.first().copied().unwrap_or(1);
                    Ok(Vec::new())
                },
                |_, _, _| Ok(()),
            )?;
            from_arrays = Some(index::offset(rows.min(MAX_NODES as u64 + 1)));
        }
    }
    let known = declared.or(from_arrays);

    // Edges.
    if !arrays.has("edge_index") {
        return Err(GraphError::in_array(
            "edge_index",
            GraphErrorKind::MissingArray,
        ));
    }
    let limit = known.map_or(MAX_NODES as u64, |n| n as u64);
    let mut total = 0u64;
    let (mut src, mut dst): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
    with_ranges(
        &mut arrays,
        "edge_index",
        INTS,
        |h| {
            let [2, e] = h.shape[..] else {
                return Err(super::shape_error(h, "(2, E)"));
            };
            let edges = crate::graph::slice_range(e, ranks, rank);
            Ok(if h.fortran {
                std::vec![2 * edges.start..2 * edges.end]
            } else {
                std::vec![edges.clone(), e + edges.start..e + edges.end]
            })
        },
        |i, r, h| {
            let edges = crate::graph::slice_range(h.shape[1], ranks, rank);
            let fortran = h.fortran;
            let count = (edges.end - edges.start) * if fortran { 2 } else { 1 };
            let mut seen = 0u64;
            if i == 0 {
                total = h.shape[1];
                src = vec_with_capacity(edges.end - edges.start)?;
                dst = vec_with_capacity(edges.end - edges.start)?;
            }
            super::for_each_chunk(r, &rows_of(h, count), count, |b| {
                decode_ints(h.dtype, b, |v| {
                    let id = u64::try_from(v).map_err(|_| GraphErrorKind::NegativeId(v))?;
                    if id >= limit {
                        return Err(match known {
                            Some(n) => GraphErrorKind::IdOutOfRange {
                                id,
                                num_nodes: n as u64,
                            },
                            None => GraphErrorKind::TooManyNodes(id + 1),
                        });
                    }
                    let to_src = if fortran {
                        seen.is_multiple_of(2)
                    } else {
                        i == 0
                    };
                    #[allow(clippy::cast_possible_truncation, reason = "id < limit ≤ u32::MAX")]
                    let id = id as u32;
                    if to_src { &mut src } else { &mut dst }.push(id);
                    seen += 1;
                    Ok(())
                })
            })
        },
    )?;
    let edges = crate::graph::slice_range(total, ranks, rank);
    let weights = if arrays.has("edge_weight") {
        let mut w = Vec::new();
        with_ranges(
            &mut arrays,
            "edge_weight",
            FLOATS,
            |h| {
                if h.shape[..] != [total] {
                    return Err(super::shape_error(
                        h,
                        &std::format!("({total},), one per edge"),
                    ));
                }
                Ok(std::vec![edges.clone()])
            },
            |_, r, h| {
                w = vec_with_capacity(edges.end - edges.start)?;
                let count = edges.end - edges.start;
                super::for_each_chunk(r, &rows_of(h, count), count, |b| {
                    decode_floats(h.dtype, b, &mut w)
                })
            },
        )?;
        Some(w)
    } else {
        None
    };

    // Node arrays: this rank's rows.
    let mut nodes = Graph::default();
    let (num_nodes, count) = match known {
        Some(n) => (n, SliceNodes::Known(n)),
        None => {
            let max = src.iter().chain(&dst).copied().max();
            let n = max.map_or(0, |m| m as usize + 1);
            (n, SliceNodes::AtLeast(n))
        }
    };
    let range = crate::graph::slice_range(num_nodes as u64, ranks, rank);
    let rows = range.end - range.start;
    let node_count = |h: &NpyHeader| -> Result<(), GraphErrorKind> {
        let n = h.shape.first().copied().unwrap_or(0);
        if n != num_nodes as u64 {
            return Err(GraphErrorKind::LengthMismatch(std::format!(
                "{n} rows, but the graph has {num_nodes} nodes"
            )));
        }
        c_order(h)
    };
    if matches!(count, SliceNodes::Known(_)) {
        nodes.num_nodes = index::offset(rows);
        if arrays.has("x") {
            let mut dim = 0usize;
            let mut data = Vec::new();
            with_ranges(
                &mut arrays,
                "x",
                FLOATS,
                |h| {
                    node_count(h)?;
                    let d = match h.shape[..] {
                        [_] => 1,
                        [_, d] => d,
                        _ => return Err(super::shape_error(h, "(N, F) or (N,)")),
                    };
                    Ok(std::vec![range.start * d..range.end * d])
                },
                |_, r, h| {
                    let d = h.shape.get(1).copied().unwrap_or(1);
                    dim = index::offset(d);
                    let count = rows * d;
                    data = vec_with_capacity(count)?;
                    super::for_each_chunk(r, &rows_of(h, count), count, |b| {
                        decode_floats(h.dtype, b, &mut data)
                    })
                },
            )?;
            nodes.features = Some(Features::new(dim, data));
        }
        if arrays.has("y") {
            with_ranges(
                &mut arrays,
                "y",
                Y_DTYPES,
                |h| {
                    node_count(h)?;
                    let classes = match h.shape[..] {
                        [_] | [_, 1] => 1,
                        [_, c] => c,
                        _ => {
                            return Err(super::shape_error(
                                h,
                                "(N,) for class ids or (N, C) for multi-label targets",
                            ))
                        }
                    };
                    Ok(std::vec![range.start * classes..range.end * classes])
                },
                |_, r, h| {
                    let classes = match h.shape[..] {
                        [_, c] if c >= 2 => c,
                        _ => 1,
                    };
                    let slice_header = rows_of(h, rows);
                    if classes >= 2 {
                        nodes.targets = Some(read_targets(r, &slice_header, rows, classes)?);
                    } else {
                        nodes.labels = Some(read_labels(r, &slice_header, rows)?);
                    }
                    Ok(())
                },
            )?;
        }
        for (b, name) in ["train_mask", "val_mask", "test_mask"]
            .into_iter()
            .enumerate()
        {
            if !arrays.has(name) {
                continue;
            }
            let mut m = Vec::new();
            with_ranges(
                &mut arrays,
                name,
                BOOLS,
                |h| {
                    if h.shape.len() != 1 {
                        return Err(super::shape_error(h, "(N,)"));
                    }
                    node_count(h)?;
                    Ok(std::vec![range.clone()])
                },
                |_, r, h| {
                    m = read_mask(r, &rows_of(h, rows), rows)?;
                    Ok(())
                },
            )?;
            match b {
                0 => nodes.train_mask = Some(m),
                1 => nodes.val_mask = Some(m),
                _ => nodes.test_mask = Some(m),
            }
        }
    }
    let slice = GraphSlice {
        num_nodes,
        num_edges: total,
        first_edge: edges.start,
        src,
        dst,
        weights,
        first_node: index::offset(range.start),
        nodes,
    };
    Ok((slice, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{generate, slice_range};
    use std::string::ToString;

    /// A graph with every kind of array: weights, features, labels or multi-label targets,
    /// three masks.
    fn graph(multi_label: bool) -> Graph {
        let mut g = generate::rmat(7, 4, 3).unwrap();
        generate::random_node_data(&mut g, 5, 4, 9).unwrap();
        g.weights = Some(
            (0..g.num_edges())
                .map(|e| (e % 7) as f32 * 0.25 + 0.5)
                .collect(),
        );
        if multi_label {
            g.labels = None;
            g.targets = Some(crate::graph::Targets {
                classes: 3,
                data: (0..g.num_nodes * 3).map(|k| u8::from(k % 5 < 2)).collect(),
            });
        }
        g
    }

    /// Every rank's slice read from `path` equals the slice cut from the whole graph.
    fn check(path: &Path, whole: &Graph) {
        for ranks in 1..=4 {
            for rank in 0..ranks {
                let (slice, nodes) = read_slice(path, rank, ranks).unwrap();
                assert_eq!(nodes, SliceNodes::Known(whole.num_nodes));
                assert_eq!(
                    slice,
                    GraphSlice::cut(whole, rank, ranks),
                    "rank {rank} of {ranks}"
                );
                let e = slice_range(whole.num_edges() as u64, ranks, rank);
                assert_eq!(slice.src.len() as u64, e.end - e.start);
            }
        }
    }

    #[test]
    fn slices_of_npz_files_and_npy_directories_are_the_whole_graph_cut() {
        let tmp = tempfile::tempdir().unwrap();
        for multi_label in [false, true] {
            let g = graph(multi_label);
            let npz = tmp.path().join("g.npz");
            super::super::write_npz(&npz, &g).unwrap();
            let whole = super::super::read_npz(&npz).unwrap();
            assert_eq!(whole, g);
            check(&npz, &g);
            // The same arrays as .npy files in a directory (stored, so read by seeks).
            let dir = tmp
                .path()
                .join(if multi_label { "multi" } else { "single" });
            std::fs::create_dir(&dir).unwrap();
            let mut zip = zip::ZipArchive::new(std::fs::File::open(&npz).unwrap()).unwrap();
            for i in 0..zip.len() {
                let mut member = zip.by_index(i).unwrap();
                let mut out = std::fs::File::create(dir.join(member.name())).unwrap();
                io::copy(&mut member, &mut out).unwrap();
            }
            check(&dir, &g);
        }
    }

    #[test]
    fn without_node_arrays_the_node_count_is_a_lower_bound_per_rank() {
        let tmp = tempfile::tempdir().unwrap();
        let g = Graph::from_edges(6, std::vec![0, 1, 5], std::vec![1, 2, 3]);
        let npz = tmp.path().join("g.npz");
        super::super::write_npz(&npz, &g).unwrap();
        // A directory with edge_index.npy alone (write_npz records num_nodes).
        let dir = tmp.path().join("edges");
        std::fs::create_dir(&dir).unwrap();
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&npz).unwrap()).unwrap();
        let mut member = zip.by_name("edge_index.npy").unwrap();
        io::copy(
            &mut member,
            &mut std::fs::File::create(dir.join("edge_index.npy")).unwrap(),
        )
        .unwrap();
        let bounds: Vec<SliceNodes> = (0..3).map(|r| read_slice(&dir, r, 3).unwrap().1).collect();
        assert_eq!(
            bounds,
            [
                SliceNodes::AtLeast(2),
                SliceNodes::AtLeast(3),
                SliceNodes::AtLeast(6)
            ]
        );
    }

    #[test]
    fn bad_slices_name_the_array() {
        let tmp = tempfile::tempdir().unwrap();
        let g = graph(false);
        let npz = tmp.path().join("g.npz");
        super::super::write_npz(&npz, &g).unwrap();
        // Cut the file short: the last rank's slice cannot be read, the first's can.
        let len = std::fs::metadata(&npz).unwrap().len();
        let short = tmp.path().join("short.npz");
        std::fs::write(&short, &std::fs::read(&npz).unwrap()[..(len / 2) as usize]).unwrap();
        let err = read_slice(&short, 1, 2).unwrap_err().to_string();
        assert!(err.contains("short.npz"), "{err}");
    }
}
