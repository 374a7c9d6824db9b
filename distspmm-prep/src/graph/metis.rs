//! METIS graph files (`.graph`, the input of `gpmetis`).
//!
//! Layout (METIS manual, §4.1.1): a header `n m [fmt [ncon]]`, then exactly n vertex lines,
//! line u (1-based) holding `[size] [w_1 … w_ncon] v_1 [e_1] v_2 [e_2] …`. `fmt` is up to three
//! binary digits: vertex sizes (100), vertex weights (10), edge weights (1); `ncon` (default 1)
//! counts the weights per vertex. Neighbour ids are 1-based; `%` lines are comments. A blank
//! line is a vertex without neighbours, so blank lines are never skipped between vertices.
//! m counts undirected edges: the lines must hold 2m neighbour entries in total, and the
//! adjacency must be symmetric (v on line u if and only if u on line v), as `gpmetis` requires:
//! a file that lists an edge from one end only is refused, naming the pair.
//!
//! Neighbour v on line u becomes the edge `v → u` (u aggregates v); as METIS lists every edge
//! from both ends, the graph comes out with both directions. Vertex sizes and weights are
//! checked and dropped (a [`Graph`] has no place for them); edge weights become `weights`.

use super::text::{fields, parse_id, parse_id_one_based, parse_weight, trim, LineReader};
use super::{Graph, GraphError, GraphErrorKind, MAX_NODES};
use distspmm_sparse::index;
use std::format;
use std::io::BufRead;
use std::string::String;
use std::vec::Vec;

/// What the header's `fmt` and `ncon` say each vertex line holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LineFormat {
    vertex_size: bool,
    vertex_weights: usize,
    edge_weights: bool,
}

fn bad_header(msg: String) -> GraphErrorKind {
    GraphErrorKind::BadHeader(msg)
}

fn parse_header(line: &[u8]) -> Result<(u64, u64, LineFormat), GraphErrorKind> {
    let tokens: Vec<&[u8]> = fields(line).collect();
    if !(2..=4).contains(&tokens.len()) {
        return Err(bad_header(format!(
            "expected \"nodes edges [fmt [ncon]]\", found {} fields",
            tokens.len()
        )));
    }
    let n = parse_id(tokens[0])?;
    let m = parse_id(tokens[1])?;
    if n > MAX_NODES as u64 {
        return Err(GraphErrorKind::TooManyNodes(n));
    }
    let fmt = tokens.get(2).copied().unwrap_or(b"0");
    if fmt.len() > 3 || !fmt.iter().all(|b| matches!(b, b'0' | b'1')) {
        return Err(bad_header(format!(
            "fmt {:?} must be up to three binary digits (vertex sizes, vertex weights, edge weights)",
            String::from_utf8_lossy(fmt)
        )));
    }
    let digit =
        |from_right: usize| fmt.len() > from_right && fmt[fmt.len() - 1 - from_right] == b'1';
    let has_vertex_weights = digit(1);
    let ncon = match tokens.get(3) {
        Some(t) => {
            let ncon = parse_id(t)?;
            if !has_vertex_weights || ncon == 0 || ncon > 1024 {
                return Err(bad_header(format!(
                    "ncon {ncon} needs vertex weights in fmt (x1x) and must be in 1..=1024"
                )));
            }
            #[allow(
                clippy::cast_possible_truncation,
                reason = "in 1..=1024, checked just above"
            )]
            let ncon = ncon as usize;
            ncon
        }
        None => usize::from(has_vertex_weights),
    };
    Ok((
        n,
        m,
        LineFormat {
            vertex_size: digit(2),
            vertex_weights: ncon,
            edge_weights: digit(0),
        },
    ))
}

/// Reads a METIS graph file (see the module docs). Errors name the line and what is wrong; the
/// result satisfies [`Graph::validate`]. Self loops are kept (METIS itself rejects them; the
/// partitioner drops them).
pub fn read_metis(reader: impl BufRead) -> Result<Graph, GraphError> {
    let mut lines = LineReader::new(reader);
    let (n, m, format) = loop {
        let Some((number, line)) = lines.next_line()? else {
            return Err(GraphError::at_line(
                lines.line() + 1,
                bad_header("missing the header \"nodes edges [fmt [ncon]]\"".into()),
            ));
        };
        let at = |kind: GraphErrorKind| GraphError::at_line(number, kind);
        let line = trim(line);
        if line.is_empty() || line.starts_with(b"%") {
            continue;
        }
        break parse_header(line).map_err(at)?;
    };
    let header_line = lines.line();
    let entries = m
        .checked_mul(2)
        .ok_or_else(|| lines.error(bad_header(format!("edge count {m} is too large"))))?;
    let reserve = entries.min(1 << 24) as usize;
    let mut src = super::edge_data_with_capacity(reserve).map_err(|k| lines.error(k))?;
    let mut dst = super::edge_data_with_capacity(reserve).map_err(|k| lines.error(k))?;
    let mut weights = if format.edge_weights {
        Some(super::edge_data_with_capacity(reserve).map_err(|k| lines.error(k))?)
    } else {
        None
    };
    let leading = usize::from(format.vertex_size) + format.vertex_weights;
    let per_neighbour = if format.edge_weights { 2 } else { 1 };

    let mut u: u64 = 0;
    while u < n {
        let Some((number, line)) = lines.next_line()? else {
            return Err(lines.error(GraphErrorKind::LengthMismatch(format!(
                "the header promises {n} vertex lines, the file ends after {u}"
            ))));
        };
        let at = |kind: GraphErrorKind| GraphError::at_line(number, kind);
        if trim(line).starts_with(b"%") {
            continue;
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "u < n ≤ MAX_NODES (u32::MAX), checked in the header"
        )]
        let row = u as u32;
        let mut count = 0usize;
        let mut pending: Option<u32> = None;
        for token in fields(line) {
            if count < leading {
                // Vertex size / weights: non-negative integers, checked and dropped.
                parse_id(token).map_err(at)?;
            } else if (count - leading).is_multiple_of(per_neighbour) {
                let v = parse_id_one_based(token, n).map_err(at)?;
                if format.edge_weights {
                    pending = Some(v);
                } else {
                    super::push_edge_data(&mut src, v).map_err(at)?;
                    super::push_edge_data(&mut dst, row).map_err(at)?;
                }
            } else {
                let w = parse_weight(token).map_err(at)?;
                if let (Some(v), Some(ws)) = (pending.take(), weights.as_mut()) {
                    super::push_edge_data(&mut src, v).map_err(at)?;
                    super::push_edge_data(&mut dst, row).map_err(at)?;
                    super::push_edge_data(ws, w).map_err(at)?;
                }
            }
            count += 1;
        }
        let ragged = count < leading || !(count - leading).is_multiple_of(per_neighbour);
        if ragged {
            let expected = if count < leading { leading } else { count + 1 };
            return Err(at(GraphErrorKind::RaggedRow {
                expected,
                found: count,
            }));
        }
        if src.len() as u64 > entries {
            return Err(at(GraphErrorKind::LengthMismatch(format!(
                "the header promises {m} edges ({entries} neighbour entries) but there are more"
            ))));
        }
        u += 1;
    }
    while let Some((number, line)) = lines.next_line()? {
        let at = |kind: GraphErrorKind| GraphError::at_line(number, kind);
        let line = trim(line);
        if !(line.is_empty() || line.starts_with(b"%")) {
            return Err(at(GraphErrorKind::LengthMismatch(format!(
                "the header promises {n} vertex lines but there are more"
            ))));
        }
    }
    if src.len() as u64 != entries {
        return Err(GraphError::at_line(
            header_line,
            GraphErrorKind::LengthMismatch(format!(
                "the header promises {m} edges ({entries} neighbour entries), the vertex lines hold {}",
                src.len()
            )),
        ));
    }
    check_symmetric(&src, &dst)?;
    Ok(Graph {
        weights,
        ..Graph::from_edges(index::offset(n), src, dst)
    })
}

/// Refuses an adjacency that is not symmetric, naming the first pair (in vertex order) that
/// one vertex lists and the other does not: neighbour `src[e]` on the line of vertex `dst[e]`.
fn check_symmetric(src: &[u32], dst: &[u32]) -> Result<(), GraphError> {
    use rayon::slice::ParallelSliceMut;
    const HINT: &str = "checking that a METIS graph is symmetric takes 8 bytes per neighbour \
                        entry: use a machine with more memory, or give the graph as an edge list";
    let what = || format!("checking the symmetry of {} neighbour entries", src.len());
    let bytes = distspmm_sparse::memory::bytes_of::<u64>(src.len() as u64);
    distspmm_sparse::memory::check(what(), bytes, HINT)?;
    let mut listed: Vec<u64> = distspmm_sparse::memory::try_with_capacity(src.len(), what(), HINT)?;
    // (vertex whose line it is, neighbour listed there)
    listed.extend(
        dst.iter()
            .zip(src)
            .map(|(&u, &v)| (u64::from(u) << 32) | u64::from(v)),
    );
    listed.par_sort_unstable();
    let missing = listed.iter().find(|&&key| {
        let mirror = key.rotate_left(32);
        key != mirror && listed.binary_search(&mirror).is_err()
    });
    if let Some(&key) = missing {
        let (u, v) = ((key >> 32) + 1, (key & u64::from(u32::MAX)) + 1);
        return Err(GraphErrorKind::Invalid(format!(
            "the adjacency is not symmetric: vertex {u} lists {v} as a neighbour but vertex {v} \
             does not list {u}. A METIS graph lists every edge from both ends, as gpmetis \
             requires: add the missing entries (and fix the edge count in the header), or give \
             a directed graph as an edge list"
        ))
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_line, sorted_edges};
    use super::*;
    use std::vec;

    fn read(text: &str) -> Result<Graph, GraphError> {
        read_metis(text.as_bytes())
    }

    #[test]
    fn unweighted_with_comments_and_an_isolated_vertex() {
        // Triangle 1-2-3 plus isolated vertex 4 (its line is blank).
        let g = read("% a comment\n4 3\n2 3\n1 3\n% between\n1 2\n\n").unwrap();
        assert_eq!(g.num_nodes, 4);
        assert_eq!(
            sorted_edges(&g),
            vec![(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
        );
        assert!(g.weights.is_none());
        g.validate().unwrap();
    }

    #[test]
    fn edge_and_vertex_weights() {
        // fmt 011: vertex weights (2 constraints) and edge weights.
        let g = read("3 2 011 2\n5 1 2 7\n1 1 1 7 3 9\n2 2 2 9\n").unwrap();
        let mut e: Vec<(u32, u32, f32)> = (0..g.num_edges())
            .map(|k| (g.src[k], g.dst[k], g.weights.as_ref().unwrap()[k]))
            .collect();
        e.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert_eq!(e, vec![(0, 1, 7.0), (1, 0, 7.0), (1, 2, 9.0), (2, 1, 9.0)]);
        // fmt 100: vertex sizes lead each line.
        let g = read("2 1 100\n3 2\n4 1\n").unwrap();
        assert_eq!(sorted_edges(&g), vec![(0, 1), (1, 0)]);
    }

    fn err(text: &str) -> GraphError {
        read(text).unwrap_err()
    }

    #[test]
    fn bad_headers() {
        for (text, line) in [
            ("", 1),
            ("% only\n", 2),
            ("3\n", 1),
            ("3 2 2\n", 1),
            ("3 2 0 2\n", 1),
            ("3 2 1 1 9\n", 1),
        ] {
            let e = err(text);
            assert!(
                matches!(e.kind(), GraphErrorKind::BadHeader(_)),
                "{text:?}: {e}"
            );
            assert_line(&e, line);
        }
        let e = err("3 x\n");
        assert!(matches!(e.kind(), GraphErrorKind::NotANumber { .. }));
    }

    #[test]
    fn out_of_range_negative_and_non_numeric_neighbours() {
        let e = err("2 1\n3\n1\n");
        assert!(matches!(
            e.kind(),
            GraphErrorKind::IdOutOfRange {
                id: 3,
                num_nodes: 2
            }
        ));
        assert_line(&e, 2);
        let e = err("2 1\n2\n-1\n");
        assert!(matches!(e.kind(), GraphErrorKind::NegativeId(-1)));
        assert_line(&e, 3);
        let e = err("2 1\n2\none\n");
        assert!(matches!(e.kind(), GraphErrorKind::NotANumber { .. }));
        assert_line(&e, 3);
    }

    #[test]
    fn non_finite_edge_weight() {
        let e = err("2 1 1\n2 inf\n1 1\n");
        assert!(matches!(e.kind(), GraphErrorKind::NonFinite(_)));
        assert_line(&e, 2);
    }

    #[test]
    fn ragged_rows() {
        // An edge-weighted line with a neighbour but no weight.
        let e = err("2 1 1\n2 1\n1\n");
        assert!(matches!(e.kind(), GraphErrorKind::RaggedRow { .. }));
        assert_line(&e, 3);
        // Vertex weights required but the line is empty.
        let e = err("2 1 10\n\n1 2\n");
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 1,
                found: 0
            }
        ));
        assert_line(&e, 2);
    }

    #[test]
    fn an_asymmetric_adjacency_is_refused_naming_a_pair() {
        // Vertex 1 lists 2 and 3; vertex 3 does not list 1 (it lists 2 instead).
        let e = err("3 2\n2 3\n1\n2\n");
        assert!(matches!(e.kind(), GraphErrorKind::Invalid(_)), "{e}");
        let text = std::format!("{e}");
        assert!(
            text.contains("vertex 1 lists 3") && text.contains("symmetric"),
            "{text}"
        );
        // Symmetric, with self loops (each its own mirror).
        let g = read("2 2\n1 2\n1 2\n").unwrap();
        assert_eq!(g.num_edges(), 4);
    }

    #[test]
    fn counts_must_match_the_header() {
        let e = err("3 1\n2\n1\n");
        assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)), "{e}");
        assert_line(&e, 3);
        let e = err("2 1\n2\n1\n1\n");
        assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)));
        assert_line(&e, 4);
        let e = err("% c\n3 2\n2\n1\n\n");
        assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)));
        assert_line(&e, 2);
        let e = err("2 0\n2\n1\n");
        assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)));
        assert_line(&e, 2);
    }
}
