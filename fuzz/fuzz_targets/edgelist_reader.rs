//! Feeds arbitrary bytes to `graph::edgelist::read_edgelist`. The first byte picks the options
//! (bit 0: one-based ids; bit 1: a given node count, the second byte); the rest is the file.
//! Everything accepted must be a valid graph the rest of the pipeline takes (see
//! `common::check_graph`), with every id below the node count asked for.
#![no_main]

mod common;

use std::io::Cursor;

use distspmm_prep::graph::edgelist::{read_edgelist, EdgeListOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (options, text) = match data {
        [flags, n, rest @ ..] if flags & 2 != 0 => (
            EdgeListOptions {
                num_nodes: Some(usize::from(*n)),
                one_based: flags & 1 != 0,
            },
            rest,
        ),
        [flags, rest @ ..] => (
            EdgeListOptions {
                num_nodes: None,
                one_based: flags & 1 != 0,
            },
            rest,
        ),
        [] => return,
    };
    if let Ok(g) = read_edgelist(Cursor::new(text), &options) {
        if let Some(n) = options.num_nodes {
            assert_eq!(g.num_nodes, n);
        }
        common::check_graph(&g);
    }
});
