//! Assertions shared by the readers' tests.

use super::{Graph, GraphError, Location};
use std::format;
use std::vec::Vec;

/// The error is located at `line`, and its message says so.
pub(crate) fn assert_line(e: &GraphError, line: u64) {
    assert_eq!(e.location(), &Location::Line(line), "{e}");
    assert!(format!("{e}").contains(&format!("line {line}: ")), "{e}");
}

/// The edges as sorted (src, dst) pairs.
pub(crate) fn sorted_edges(g: &Graph) -> Vec<(u32, u32)> {
    let mut e: Vec<(u32, u32)> = g.src.iter().copied().zip(g.dst.iter().copied()).collect();
    e.sort_unstable();
    e
}
