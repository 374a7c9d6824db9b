//! Edge lists: one edge per line, `src dst [weight]`.
//!
//! Fields are separated by whitespace, or by commas when the first data line holds a comma
//! (CSV; spaces around commas are ignored). Lines starting with `#` or `%` are comments, blank
//! lines are skipped. One header line is allowed before the first edge, recognised by a first
//! field that is not number-like (does not start with a digit, a sign or a point), e.g.
//! `src,dst,weight`; a first line like `1e3 5` or `0x10 2` is data, and an error (ids are
//! decimal integers). The first edge fixes the column count:
//! 2 (unweighted) or 3 (the third column is a finite weight); every later line must match.
//!
//! A line `u v` is the edge `u → v` (v aggregates u). Ids are 0-based unless
//! [`EdgeListOptions::one_based`] is set; the node count is [`EdgeListOptions::num_nodes`] or
//! the largest id plus one.

use super::text::{fields, parse_id, parse_weight, trim, LineReader};
use super::{Graph, GraphError, GraphErrorKind, MAX_NODES};
use distspmm_sparse::index;
use std::io::BufRead;
use std::vec::Vec;

/// How to read an edge list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeListOptions {
    /// The node count; `None` takes the largest id plus one. Ids at or above it are errors.
    pub num_nodes: Option<usize>,
    /// Ids start at 1 (0 is then an error).
    pub one_based: bool,
}

/// Splits a line at commas (CSV) or at whitespace.
fn split(line: &[u8], csv: bool, out: &mut Vec<(usize, usize)>) {
    out.clear();
    if csv {
        let mut start = 0;
        for (i, &b) in line
            .iter()
            .enumerate()
            .chain(core::iter::once((line.len(), &b',')))
        {
            if b == b',' {
                let field = trim(&line[start..i]);
                let offset = field.as_ptr() as usize - line.as_ptr() as usize;
                out.push((offset, offset + field.len()));
                start = i + 1;
            }
        }
    } else {
        for field in fields(line) {
            let offset = field.as_ptr() as usize - line.as_ptr() as usize;
            out.push((offset, offset + field.len()));
        }
    }
}

/// Whether a field looks like a number (starts with a digit, a sign or a point): such a first
/// field makes its line an edge, never a header.
fn number_like(field: &[u8]) -> bool {
    field
        .first()
        .is_some_and(|&b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.'))
}

/// A node id that is a number but not a decimal integer (`1e3`, `0x10`, `2.0`) said as such.
fn decimal_id(field: &[u8], err: GraphErrorKind) -> GraphErrorKind {
    match err {
        GraphErrorKind::NotANumber { token } if number_like(field) => {
            GraphErrorKind::Invalid(std::format!(
                "node id {token:?} is not a decimal integer: ids are written as 0, 1, 2, … \
                 (no exponent, hexadecimal or fraction)"
            ))
        }
        other => other,
    }
}

/// Reads an edge list (see the module docs). Errors name the line and what is wrong; the
/// result satisfies [`Graph::validate`].
pub fn read_edgelist(reader: impl BufRead, options: &EdgeListOptions) -> Result<Graph, GraphError> {
    if let Some(n) = options.num_nodes {
        if n > MAX_NODES {
            return Err(GraphErrorKind::TooManyNodes(n as u64).into());
        }
    }
    let limit = options.num_nodes.map_or(MAX_NODES as u64, |n| n as u64);
    let base = u64::from(options.one_based);
    let mut lines = LineReader::new(reader);
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut weights: Vec<f32> = Vec::new();
    // Fixed by the first data line: (csv, columns).
    let mut layout: Option<(bool, usize)> = None;
    let mut header_allowed = true;
    let mut spans = Vec::with_capacity(4);
    let mut max_id: Option<u64> = None;
    while let Some((number, line)) = lines.next_line()? {
        let at = |kind: GraphErrorKind| GraphError::at_line(number, kind);
        let line = trim(line);
        if line.is_empty() || line.starts_with(b"#") || line.starts_with(b"%") {
            continue;
        }
        let csv = layout.map_or_else(|| line.contains(&b','), |(csv, _)| csv);
        split(line, csv, &mut spans);
        let field = |k: usize| &line[spans[k].0..spans[k].1];
        if header_allowed {
            header_allowed = false;
            if !spans.is_empty() && !number_like(field(0)) {
                continue;
            }
        }
        let columns = match layout {
            Some((_, columns)) => columns,
            None => {
                let columns = spans.len();
                if !(2..=3).contains(&columns) {
                    return Err(at(GraphErrorKind::RaggedRow {
                        expected: if columns < 2 { 2 } else { 3 },
                        found: columns,
                    }));
                }
                layout = Some((csv, columns));
                columns
            }
        };
        if spans.len() != columns {
            return Err(at(GraphErrorKind::RaggedRow {
                expected: columns,
                found: spans.len(),
            }));
        }
        let mut id = |k: usize| -> Result<u32, GraphError> {
            let raw = parse_id(field(k)).map_err(|e| at(decimal_id(field(k), e)))?;
            if raw < base {
                return Err(at(GraphErrorKind::Invalid(
                    "node id 0 in a file whose ids start at 1".into(),
                )));
            }
            let id = raw - base;
            if id >= limit {
                return Err(at(match options.num_nodes {
                    Some(n) => GraphErrorKind::IdOutOfRange {
                        id: raw,
                        num_nodes: n as u64,
                    },
                    None => GraphErrorKind::TooManyNodes(id.saturating_add(1)),
                }));
            }
            max_id = Some(max_id.map_or(id, |m| m.max(id)));
            #[allow(
                clippy::cast_possible_truncation,
                reason = "id < limit ≤ MAX_NODES, checked just above"
            )]
            Ok(id as u32)
        };
        let (u, v) = (id(0)?, id(1)?);
        if columns == 3 {
            let w = parse_weight(field(2)).map_err(at)?;
            super::push_edge_data(&mut weights, w).map_err(at)?;
        }
        super::push_edge_data(&mut src, u).map_err(at)?;
        super::push_edge_data(&mut dst, v).map_err(at)?;
    }
    let num_nodes = options
        .num_nodes
        .unwrap_or_else(|| max_id.map_or(0, |m| index::offset(m) + 1));
    let weighted = matches!(layout, Some((_, 3)));
    Ok(Graph {
        weights: weighted.then_some(weights),
        ..Graph::from_edges(num_nodes, src, dst)
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::assert_line;
    use super::*;
    use std::vec;

    fn read(text: &str) -> Result<Graph, GraphError> {
        read_edgelist(text.as_bytes(), &EdgeListOptions::default())
    }

    #[test]
    fn whitespace_with_comments_and_header() {
        let g = read("# SNAP style\nsrc dst\n0 1\n\n1\t2\n% other comment\n  2   0  \n").unwrap();
        assert_eq!(g.num_nodes, 3);
        assert_eq!((g.src, g.dst), (vec![0, 1, 2], vec![1, 2, 0]));
        assert!(g.weights.is_none());
    }

    #[test]
    fn csv_with_weights_and_crlf() {
        let g = read("source,target,weight\r\n0, 3, 0.5\r\n3,1,2\r\n").unwrap();
        assert_eq!(g.num_nodes, 4);
        assert_eq!((g.src, g.dst), (vec![0, 3], vec![3, 1]));
        assert_eq!(g.weights, Some(vec![0.5, 2.0]));
    }

    #[test]
    fn one_based_with_a_node_count() {
        let opts = EdgeListOptions {
            num_nodes: Some(5),
            one_based: true,
        };
        let g = read_edgelist(&b"1 2\n2 3\n"[..], &opts).unwrap();
        assert_eq!((g.num_nodes, g.src, g.dst), (5, vec![0, 1], vec![1, 2]));
        let e = read_edgelist(&b"1 2\n0 3\n"[..], &opts).unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::Invalid(_)));
        assert_line(&e, 2);
        let e = read_edgelist(&b"1 6\n"[..], &opts).unwrap_err();
        assert!(matches!(
            e.kind(),
            GraphErrorKind::IdOutOfRange {
                id: 6,
                num_nodes: 5
            }
        ));
        assert_line(&e, 1);
    }

    #[test]
    fn empty_list() {
        let g = read("# nothing\n").unwrap();
        assert_eq!((g.num_nodes, g.num_edges()), (0, 0));
    }

    #[test]
    fn negative_ids() {
        let e = read("0 1\n-2 1\n").unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::NegativeId(-2)));
        assert_line(&e, 2);
        // A negative id on the first line is not mistaken for a header.
        let e = read("-2 1\n").unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::NegativeId(-2)));
    }

    #[test]
    fn ids_beyond_u32() {
        let e = read("0 4294967296\n").unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::TooManyNodes(_)), "{e}");
        assert_line(&e, 1);
    }

    #[test]
    fn non_numeric_tokens() {
        let e = read("a b\n0 x\n").unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::NotANumber { .. }));
        assert_line(&e, 2);
        let e = read("0 1 heavy\n").unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::NotANumber { .. }));
        assert_line(&e, 1);
    }

    #[test]
    fn a_number_like_first_line_is_data_not_a_header() {
        for (text, token) in [
            ("1e3 5\n0 1\n", "1e3"),
            ("0x10 2\n0 1\n", "0x10"),
            ("2.0 1\n", "2.0"),
            ("+1e2,3\n", "+1e2"),
            ("0 1\n1 0x2\n", "0x2"),
        ] {
            let e = read(text).unwrap_err();
            assert!(
                matches!(e.kind(), GraphErrorKind::Invalid(m) if m.contains(token) && m.contains("decimal")),
                "{text:?}: {e}"
            );
        }
        assert_line(&read("1e3 5\n0 1\n").unwrap_err(), 1);
        assert_line(&read("0 1\n1 0x2\n").unwrap_err(), 2);
        // A header is a line that does not start like a number.
        let g = read("source target\n0 1\n").unwrap();
        assert_eq!(g.num_edges(), 1);
        let g = read("node_a,node_b\n0,1\n").unwrap();
        assert_eq!(g.num_edges(), 1);
    }

    #[test]
    fn non_finite_weights() {
        let e = read("0,1,1\n1,2,NaN\n").unwrap_err();
        assert!(matches!(e.kind(), GraphErrorKind::NonFinite(_)));
        assert_line(&e, 2);
    }

    #[test]
    fn ragged_rows() {
        let e = read("0 1 1.0\n1 2\n").unwrap_err();
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 3,
                found: 2
            }
        ));
        assert_line(&e, 2);
        let e = read("0 1 2 3\n").unwrap_err();
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 3,
                found: 4
            }
        ));
        let e = read("0,1\n1,,2\n").unwrap_err();
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 2,
                found: 3
            }
        ));
        assert_line(&e, 2);
        let e = read("7\n").unwrap_err();
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 2,
                found: 1
            }
        ));
    }
}
