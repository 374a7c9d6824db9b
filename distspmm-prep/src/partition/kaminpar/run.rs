//! KaMinPar k-way partitioning (deep multilevel, shared-memory parallel) for distspmm, through
//! the KaMinPar library that the `kaminpar` crate vendors and builds with CMake against
//! Debian's TBB.
//!
//! The parent module keeps the method's options, their checks, the weights and what happens
//! around the call (one part, empty parts, the method tag); this module makes the call. It is
//! built with the crate's `kaminpar` feature (the default), and only the preprocessing links it:
//! the runtime (the C library, the trainer) never depends on this crate.
//!
//! KaMinPar takes the [`Adjacency`] as it is — 64-bit row offsets, 32-bit node ids — so there
//! is no limit on the edge count beyond memory; a small C++ shim (`csrc/kaminpar_shim.cc`)
//! passes the arrays without copying them, caps TBB at the requested thread count, keeps
//! KaMinPar's log off stdout and turns C++ exceptions into errors.
//!
//! What this KaMinPar version (the crate's, 2022) fixes itself: the imbalance tolerance is 3 %
//! (its library ignores other values; with `--balance nnz` a part may exceed it by up to its
//! heaviest node, KaMinPar's rule for weighted nodes), and node weights are 32-bit. Its random
//! state is a per-thread generator plus one process-wide static; the shim reseeds all of them
//! from the seed on every call, so the result is reproducible for a fixed seed with one
//! thread, and varies with more (its parallel label propagation races).
//!
//! Why this route and not the `mt-kahypar` crate (0.2, the statically built alternative):
//! KaMinPar reads our CSR arrays in place (4 bytes per adjacency entry), where Mt-KaHyPar's C
//! API takes an edge list of 64-bit ids (16 bytes per undirected edge) and copies it; its
//! cut and block weights are 32-bit; and the crate compiles Mt-KaHyPar, oneTBB and Boost
//! (180 C++ files of heavy templates) from source on every clean build, against KaMinPar's
//! 24 through CMake with Debian's TBB.

use crate::partition::{Adjacency, KaminparOptions, PartitionError};

mod ffi {
    // Links the KaMinPar library (and TBB) that the crate builds.
    use ::kaminpar as _;

    extern "C" {
        /// `csrc/kaminpar_shim.cc`: 0 on success, 1 with a NUL-terminated message otherwise.
        pub fn distspmm_kaminpar_partition(
            n: u32,
            xadj: *mut u64,
            adjncy: *mut u32,
            node_weights: *mut i32,
            k: u32,
            seed: u64,
            threads: usize,
            part: *mut u32,
            message: *mut std::ffi::c_char,
            capacity: usize,
        ) -> std::ffi::c_int;
    }
}

/// KaMinPar's random state and TBB's thread limit are process-wide: one call at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The KaMinPar call ([`super::KaminparKway`]): `2 ≤ parts ≤ N` and validated options,
/// checked by the parent module.
pub(super) fn kaminpar_kway(
    adjacency: &Adjacency,
    parts: u32,
    options: &KaminparOptions,
    mut weights: Option<Vec<i32>>,
) -> Result<Vec<u32>, PartitionError> {
    let n = u32::try_from(adjacency.num_nodes())
        .map_err(|_| PartitionError::TooManyNodes(adjacency.num_nodes() as u64))?;
    if weights.as_ref().is_some_and(|w| w.len() != n as usize) {
        return Err(PartitionError::Kaminpar(format!(
            "{} node weights were given for {n} nodes",
            weights.as_ref().map_or(0, Vec::len)
        )));
    }
    let threads = options.effective_threads();
    // KaMinPar's API takes mutable pointers although it only reads the graph; its Graph wraps
    // the arrays without copying (or freeing) them.
    let xadj = adjacency.xadj();
    let adjncy = adjacency.adjncy();
    let mut part = vec![0u32; n as usize];
    let mut message = vec![0 as std::ffi::c_char; 512];
    let started = std::time::Instant::now();
    let _guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // On a thread of its own, so KaMinPar's thread-local state stays off the caller's thread.
    let code = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: the shim reads n + 1 offsets, xadj[n] neighbour ids and (if not null)
                // n weights (their length checked above), and writes n block ids into `part` and
                // at most `capacity` bytes into `message`; every buffer has those lengths and
                // lives past the call. The graph arrays are only read (KaMinPar keeps the input
                // graph const). The shim catches every C++ exception, so nothing unwinds into
                // Rust.
                unsafe {
                    ffi::distspmm_kaminpar_partition(
                        n,
                        xadj.as_ptr().cast_mut(),
                        adjncy.as_ptr().cast_mut(),
                        weights
                            .as_mut()
                            .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr()),
                        parts,
                        options.seed,
                        threads,
                        part.as_mut_ptr(),
                        message.as_mut_ptr(),
                        message.len(),
                    )
                }
            })
            .join()
    });
    let code =
        code.map_err(|_| PartitionError::Kaminpar("the partitioning thread panicked".into()))?;
    if code != 0 {
        let bytes: Vec<u8> = message
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        return Err(PartitionError::Kaminpar(
            String::from_utf8_lossy(&bytes).into_owned(),
        ));
    }
    tracing::info!(
        parts,
        threads,
        seconds = started.elapsed().as_secs_f64(),
        "KaMinPar done"
    );
    // The parent module checks the parts (each below `parts`) before it uses them.
    Ok(part)
}
