//! Feeds arbitrary bytes to `graph::mtx::read_mtx` (Matrix Market coordinate files). Everything
//! accepted must be a valid graph the rest of the pipeline takes (see `common::check_graph`).
#![no_main]

mod common;

use std::io::Cursor;

use distspmm_prep::graph::mtx::read_mtx;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = read_mtx(Cursor::new(data)) {
        common::check_graph(&g);
    }
});
