//! The `distspmm` command line.
fn main() {}
