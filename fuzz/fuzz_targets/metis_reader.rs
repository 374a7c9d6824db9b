//! Feeds arbitrary bytes to `graph::metis::read_metis` (METIS `.graph` files). Everything
//! accepted must be a valid graph the rest of the pipeline takes (see `common::check_graph`).
#![no_main]

mod common;

use std::io::Cursor;

use distspmm_prep::graph::metis::read_metis;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = read_metis(Cursor::new(data)) {
        common::check_graph(&g);
    }
});
