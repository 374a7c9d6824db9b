//! Matrix Market coordinate files (`.mtx`) as adjacency matrices.
//!
//! Accepted: `%%MatrixMarket matrix coordinate {pattern|real|integer}
//! {general|symmetric|skew-symmetric}`, a square size line `N N NNZ`, then NNZ entries `i j [v]`
//! with 1-based indices; `%` comment lines and blank lines anywhere after the banner.
//!
//! **Direction.** Entry (i, j) is `A[i][j] ≠ 0`: row i aggregates column j, so it becomes the
//! edge `j → i` (`src = j − 1`, `dst = i − 1`), matching the crate's convention that row v of Â
//! lists v's in-neighbours. Symmetric files store one triangle; every off-diagonal entry is
//! mirrored (skew-symmetric mirrors with the negated value). Pattern files have no weights;
//! diagonal entries are kept as self loops.

use super::text::{fields, parse_id_one_based, parse_int, parse_weight, trim, LineReader};
use super::{Graph, GraphError, GraphErrorKind, MAX_NODES};
use distspmm_sparse::index;
use std::format;
use std::io::BufRead;
use std::string::String;
use std::vec::Vec;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Pattern,
    Real,
    Integer,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Symmetry {
    General,
    Symmetric,
    SkewSymmetric,
}

fn bad_header(msg: String) -> GraphErrorKind {
    GraphErrorKind::BadHeader(msg)
}

fn parse_banner(line: &[u8]) -> Result<(Field, Symmetry), GraphErrorKind> {
    let lower = line.to_ascii_lowercase();
    let tokens: Vec<&[u8]> = fields(&lower).collect();
    let [b"%%matrixmarket", b"matrix", format, field, symmetry] = tokens[..] else {
        return Err(bad_header(
            "expected the banner \"%%MatrixMarket matrix coordinate <field> <symmetry>\"".into(),
        ));
    };
    if format != b"coordinate" {
        return Err(bad_header(format!(
            "format {:?} is not supported: a graph needs the sparse \"coordinate\" format",
            String::from_utf8_lossy(format)
        )));
    }
    let field = match field {
        b"pattern" => Field::Pattern,
        b"real" | b"double" => Field::Real,
        b"integer" => Field::Integer,
        other => {
            return Err(bad_header(format!(
                "field {:?} is not supported (pattern, real or integer)",
                String::from_utf8_lossy(other)
            )))
        }
    };
    let symmetry = match symmetry {
        b"general" => Symmetry::General,
        b"symmetric" => Symmetry::Symmetric,
        b"skew-symmetric" if field != Field::Pattern => Symmetry::SkewSymmetric,
        other => {
            return Err(bad_header(format!(
                "symmetry {:?} is not supported with field {:?} (general or symmetric)",
                String::from_utf8_lossy(other),
                String::from_utf8_lossy(field_name(field))
            )))
        }
    };
    Ok((field, symmetry))
}

fn field_name(field: Field) -> &'static [u8] {
    match field {
        Field::Pattern => b"pattern",
        Field::Real => b"real",
        Field::Integer => b"integer",
    }
}

/// Reads a Matrix Market coordinate matrix as a graph (see the module docs for the
/// conventions). Errors name the line and what is wrong; nothing is validated twice, the result
/// already satisfies [`Graph::validate`].
pub fn read_mtx(reader: impl BufRead) -> Result<Graph, GraphError> {
    let mut lines = LineReader::new(reader);
    let (_, banner) = lines
        .next_line()?
        .ok_or_else(|| GraphError::at_line(1, bad_header("the file is empty".into())))?;
    let (field, symmetry) = parse_banner(banner).map_err(|k| GraphError::at_line(1, k))?;

    // Size line: the first line that is neither a comment nor blank.
    let (n, nnz) = loop {
        let Some((number, line)) = lines.next_line()? else {
            return Err(GraphError::at_line(
                lines.line() + 1,
                bad_header("missing the size line \"rows cols entries\"".into()),
            ));
        };
        let at = |kind: GraphErrorKind| GraphError::at_line(number, kind);
        let line = trim(line);
        if line.is_empty() || line.starts_with(b"%") {
            continue;
        }
        let sizes: Vec<&[u8]> = fields(line).collect();
        let [rows, cols, entries] = sizes[..] else {
            return Err(at(bad_header(format!(
                "the size line needs 3 numbers \"rows cols entries\", found {} fields",
                sizes.len()
            ))));
        };
        let parse = |t: &[u8]| -> Result<u64, GraphErrorKind> {
            let v = parse_int(t)?;
            u64::try_from(v).map_err(|_| bad_header(format!("negative size {v}")))
        };
        let (rows, cols, entries) = (
            parse(rows).map_err(at)?,
            parse(cols).map_err(at)?,
            parse(entries).map_err(at)?,
        );
        if rows != cols {
            return Err(at(bad_header(format!(
                "the matrix is {rows}×{cols}; an adjacency matrix must be square"
            ))));
        }
        if rows > MAX_NODES as u64 {
            return Err(at(GraphErrorKind::TooManyNodes(rows)));
        }
        break (rows, entries);
    };

    let mirrored = symmetry != Symmetry::General;
    let expected_fields = if field == Field::Pattern { 2 } else { 3 };
    // Cap the up-front reservation: the header's count is not trusted until the entries arrive.
    let reserve = (nnz.min(1 << 24) as usize) * if mirrored { 2 } else { 1 };
    let mut src = super::edge_data_with_capacity(reserve).map_err(|k| lines.error(k))?;
    let mut dst = super::edge_data_with_capacity(reserve).map_err(|k| lines.error(k))?;
    let mut weights = match field {
        Field::Pattern => None,
        _ => Some(super::edge_data_with_capacity(reserve).map_err(|k| lines.error(k))?),
    };
    let mut seen: u64 = 0;
    while let Some((number, line)) = lines.next_line()? {
        let at = |kind: GraphErrorKind| GraphError::at_line(number, kind);
        let line = trim(line);
        if line.is_empty() || line.starts_with(b"%") {
            continue;
        }
        let mut tokens: [&[u8]; 3] = [&[]; 3];
        let mut found = 0;
        for t in fields(line) {
            if let Some(slot) = tokens.get_mut(found) {
                *slot = t;
            }
            found += 1;
        }
        if found != expected_fields {
            return Err(at(GraphErrorKind::RaggedRow {
                expected: expected_fields,
                found,
            }));
        }
        let [i, j, value] = tokens;
        seen += 1;
        if seen > nnz {
            return Err(at(GraphErrorKind::LengthMismatch(format!(
                "the size line promises {nnz} entries but there are more"
            ))));
        }
        let row = parse_id_one_based(i, n).map_err(at)?;
        let col = parse_id_one_based(j, n).map_err(at)?;
        let w = match field {
            Field::Integer => Some(parse_int(value).map_err(at)? as f32),
            Field::Real => Some(parse_weight(value).map_err(at)?),
            Field::Pattern => None,
        };
        let mut push = |u: u32, v: u32, w: Option<f32>| -> Result<(), GraphError> {
            super::push_edge_data(&mut src, u).map_err(at)?;
            super::push_edge_data(&mut dst, v).map_err(at)?;
            if let (Some(ws), Some(w)) = (weights.as_mut(), w) {
                super::push_edge_data(ws, w).map_err(at)?;
            }
            Ok(())
        };
        push(col, row, w)?;
        if mirrored && row != col {
            let back = if symmetry == Symmetry::SkewSymmetric {
                w.map(|w| -w)
            } else {
                w
            };
            push(row, col, back)?;
        }
    }
    if seen != nnz {
        return Err(lines.error(GraphErrorKind::LengthMismatch(format!(
            "the size line promises {nnz} entries but the file has {seen}"
        ))));
    }
    Ok(Graph {
        weights,
        ..Graph::from_edges(index::offset(n), src, dst)
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_line, sorted_edges};
    use super::*;

    fn read(text: &str) -> Result<Graph, GraphError> {
        read_mtx(text.as_bytes())
    }

    #[test]
    fn general_real_entry_i_j_is_edge_j_to_i() {
        let g = read(
            "%%MatrixMarket matrix coordinate real general\n% comment\n\n3 3 2\n1 2 0.5\n3 1 -2\n",
        )
        .unwrap();
        assert_eq!(g.num_nodes, 3);
        assert_eq!((g.src, g.dst), (std::vec![1, 0], std::vec![0, 2]));
        assert_eq!(g.weights, Some(std::vec![0.5, -2.0]));
    }

    #[test]
    fn symmetric_pattern_mirrors_off_diagonal() {
        let g = read("%%MatrixMarket matrix coordinate pattern symmetric\n3 3 3\n2 1\n3 3\n3 2\n")
            .unwrap();
        assert_eq!(
            sorted_edges(&g),
            std::vec![(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]
        );
        assert!(g.weights.is_none());
        g.validate().unwrap();
    }

    #[test]
    fn integer_and_skew_symmetric() {
        let g = read("%%MatrixMarket matrix coordinate integer skew-symmetric\n2 2 1\n2 1 4\n")
            .unwrap();
        assert_eq!(g.weights, Some(std::vec![4.0, -4.0]));
        assert_eq!((g.src, g.dst), (std::vec![0, 1], std::vec![1, 0]));
    }

    fn err(text: &str) -> GraphError {
        read(text).unwrap_err()
    }

    #[test]
    fn bad_banner_and_size_line() {
        for (text, line) in [
            ("", 1),
            ("%%MatrixMarket matrix array real general\n2 2\n", 1),
            ("%%MatrixMarket matrix coordinate complex general\n", 1),
            ("%%MatrixMarket matrix coordinate pattern hermitian\n", 1),
            ("%%MatrixMarket matrix coordinate real general\n2 3 1\n", 2),
            (
                "%%MatrixMarket matrix coordinate real general\n% c\n2 2\n",
                3,
            ),
            ("%%MatrixMarket matrix coordinate real general\n", 2),
        ] {
            let e = err(text);
            assert!(
                matches!(e.kind(), GraphErrorKind::BadHeader(_)),
                "{text:?}: {e}"
            );
            assert_line(&e, line);
        }
    }

    #[test]
    fn out_of_range_and_zero_ids() {
        let e = err("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 2\n3 1\n");
        assert!(matches!(
            e.kind(),
            GraphErrorKind::IdOutOfRange {
                id: 3,
                num_nodes: 2
            }
        ));
        assert_line(&e, 4);
        let e = err("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n0 1\n");
        assert!(matches!(e.kind(), GraphErrorKind::Invalid(_)));
        assert_line(&e, 3);
    }

    #[test]
    fn negative_ids() {
        let e = err("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n-1 1\n");
        assert!(matches!(e.kind(), GraphErrorKind::NegativeId(-1)));
        assert_line(&e, 3);
    }

    #[test]
    fn non_finite_and_non_numeric_values() {
        let e = err("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 2 NaN\n");
        assert!(matches!(e.kind(), GraphErrorKind::NonFinite(_)));
        assert_line(&e, 3);
        let e = err("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 x 1\n");
        assert!(matches!(e.kind(), GraphErrorKind::NotANumber { .. }));
        assert_line(&e, 3);
    }

    #[test]
    fn ragged_rows() {
        let e = err("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 2 1\n2 1\n");
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 3,
                found: 2
            }
        ));
        assert_line(&e, 4);
        let e = err("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 2 7\n");
        assert!(matches!(
            e.kind(),
            GraphErrorKind::RaggedRow {
                expected: 2,
                found: 3
            }
        ));
    }

    #[test]
    fn entry_count_must_match_the_size_line() {
        let e = err("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 2\n");
        assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)));
        assert_line(&e, 3);
        let e = err("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 2\n2 1\n");
        assert!(matches!(e.kind(), GraphErrorKind::LengthMismatch(_)));
        assert_line(&e, 4);
    }
}
