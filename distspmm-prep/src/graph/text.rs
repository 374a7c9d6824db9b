//! Line reading and token parsing shared by the text readers (Matrix Market, METIS, edge lists).
//!
//! Lines are read as bytes into one reused buffer (no whole-file string, no per-line
//! allocation); numbers are parsed from byte slices.

use super::error::show_token;
use super::{GraphError, GraphErrorKind};
use std::io::BufRead;
use std::vec::Vec;

/// The UTF-8 encoding of U+FEFF, which some editors put at the start of a text file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Reads a text file line by line, counting lines from 1; a UTF-8 byte-order mark at the start
/// of the file is dropped.
pub(crate) struct LineReader<R> {
    reader: R,
    buf: Vec<u8>,
    line: u64,
}

impl<R: BufRead> LineReader<R> {
    pub(crate) fn new(reader: R) -> Self {
        LineReader {
            reader,
            buf: Vec::with_capacity(256),
            line: 0,
        }
    }

    /// The next line's number and text without its `\n` or `\r\n`, or `None` at the end of
    /// the input.
    pub(crate) fn next_line(&mut self) -> Result<Option<(u64, &[u8])>, GraphError> {
        self.buf.clear();
        let read = read_line(&mut self.reader, &mut self.buf)
            .map_err(|kind| GraphError::at_line(self.line + 1, kind))?;
        if read == 0 {
            return Ok(None);
        }
        self.line += 1;
        // A UTF-8 byte-order mark (editors on Windows write one) is not part of the first line.
        let start = if self.line == 1 && self.buf.starts_with(UTF8_BOM) {
            UTF8_BOM.len()
        } else {
            0
        };
        let mut end = self.buf.len();
        if self.buf[start..end].ends_with(b"\n") {
            end -= 1;
        }
        if self.buf[start..end].ends_with(b"\r") {
            end -= 1;
        }
        Ok(Some((self.line, &self.buf[start..end])))
    }

    /// The number of the line last returned (0 before the first).
    pub(crate) fn line(&self) -> u64 {
        self.line
    }

    /// An error on the line last returned.
    pub(crate) fn error(&self, kind: GraphErrorKind) -> GraphError {
        GraphError::at_line(self.line, kind)
    }
}

/// `BufRead::read_until(b'\n')` with the line's buffer grown fallibly: a file of one huge line
/// (or a compressed one that expands to it) is a memory error, not an abort.
fn read_line<R: BufRead>(reader: &mut R, buf: &mut Vec<u8>) -> Result<usize, GraphErrorKind> {
    let mut read = 0;
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(GraphErrorKind::Io(e)),
        };
        let (done, used) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (true, i + 1),
            None => (available.is_empty(), available.len()),
        };
        distspmm_sparse::memory::try_grow(
            buf,
            used,
            || std::format!("a line of more than {} bytes", read + used),
            "the file holds a line too long to hold in memory: check that it is the \
             graph file you meant (text formats hold one edge or vertex per line)",
        )?;
        buf.extend_from_slice(&available[..used]);
        reader.consume(used);
        read += used;
        if done {
            return Ok(read);
        }
    }
}

/// The line with leading and trailing ASCII whitespace removed.
pub(crate) fn trim(line: &[u8]) -> &[u8] {
    line.trim_ascii()
}

/// Whitespace-separated fields.
pub(crate) fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(u8::is_ascii_whitespace)
        .filter(|t| !t.is_empty())
}

/// A decimal integer with an optional sign.
pub(crate) fn parse_int(token: &[u8]) -> Result<i64, GraphErrorKind> {
    let not_a_number = || GraphErrorKind::NotANumber {
        token: show_token(token),
    };
    let (negative, digits) = match token {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, token),
    };
    if digits.is_empty() {
        return Err(not_a_number());
    }
    let mut value: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(not_a_number());
        }
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(b - b'0')))
            .ok_or_else(not_a_number)?;
    }
    Ok(if negative { -value } else { value })
}

/// A node id as written (0- or 1-based), rejecting negative values.
pub(crate) fn parse_id(token: &[u8]) -> Result<u64, GraphErrorKind> {
    let v = parse_int(token)?;
    u64::try_from(v).map_err(|_| GraphErrorKind::NegativeId(v))
}

/// A 1-based id in `1..=n` turned 0-based.
pub(crate) fn parse_id_one_based(token: &[u8], n: u64) -> Result<u32, GraphErrorKind> {
    let id = parse_id(token)?;
    if id == 0 {
        return Err(GraphErrorKind::Invalid(
            "node id 0 in a file whose ids start at 1".into(),
        ));
    }
    if id > n {
        return Err(GraphErrorKind::IdOutOfRange { id, num_nodes: n });
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "id ≤ n, a node count at most MAX_NODES (u32::MAX)"
    )]
    Ok((id - 1) as u32)
}

/// A finite floating-point value that fits in `f32`.
pub(crate) fn parse_weight(token: &[u8]) -> Result<f32, GraphErrorKind> {
    let text = core::str::from_utf8(token).map_err(|_| GraphErrorKind::NotANumber {
        token: show_token(token),
    })?;
    let value: f64 = text.parse().map_err(|_| GraphErrorKind::NotANumber {
        token: show_token(token),
    })?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "deliberate: rounds to f32; overflow to infinity is refused below"
    )]
    let single = value as f32;
    if !single.is_finite() {
        return Err(GraphErrorKind::NonFinite(value));
    }
    Ok(single)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    #[test]
    fn lines_strip_terminators_and_count() {
        let mut r = LineReader::new(&b"a b\r\nc\n\nlast"[..]);
        let mut seen = vec![];
        while let Some((n, l)) = r.next_line().unwrap() {
            seen.push((n, l.to_vec()));
        }
        assert_eq!(r.line(), 4);
        assert_eq!(
            seen,
            vec![
                (1, b"a b".to_vec()),
                (2, b"c".to_vec()),
                (3, vec![]),
                (4, b"last".to_vec())
            ]
        );
    }

    #[test]
    fn integers() {
        assert_eq!(parse_int(b"42").ok(), Some(42));
        assert_eq!(parse_int(b"-7").ok(), Some(-7));
        assert_eq!(parse_int(b"+7").ok(), Some(7));
        for bad in [&b""[..], b"-", b"1.0", b"12a", b"99999999999999999999"] {
            assert!(matches!(
                parse_int(bad),
                Err(GraphErrorKind::NotANumber { .. })
            ));
        }
        assert!(matches!(
            parse_id(b"-3"),
            Err(GraphErrorKind::NegativeId(-3))
        ));
        assert!(matches!(
            parse_id_one_based(b"5", 4),
            Err(GraphErrorKind::IdOutOfRange {
                id: 5,
                num_nodes: 4
            })
        ));
        assert!(matches!(
            parse_id_one_based(b"0", 4),
            Err(GraphErrorKind::Invalid(_))
        ));
        assert_eq!(parse_id_one_based(b"4", 4).ok(), Some(3));
    }

    #[test]
    fn weights() {
        assert_eq!(parse_weight(b"0.5").ok(), Some(0.5));
        assert_eq!(parse_weight(b"-2e3").ok(), Some(-2000.0));
        for bad in [&b"nan"[..], b"inf", b"-Infinity", b"1e300"] {
            assert!(matches!(
                parse_weight(bad),
                Err(GraphErrorKind::NonFinite(_))
            ));
        }
        assert!(matches!(
            parse_weight(b"x1"),
            Err(GraphErrorKind::NotANumber { .. })
        ));
    }
}
