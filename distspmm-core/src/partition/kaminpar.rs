//! KaMinPar k-way partitioning (deep multilevel, shared-memory parallel), through the KaMinPar
//! library that the `kaminpar` crate vendors and builds with CMake against Debian's TBB.
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

use std::vec::Vec;

use super::{nonzero_weights, Adjacency, Balance, PartitionError};

/// The imbalance KaMinPar's library keeps (its `epsilon`, fixed at 0.03 in this version).
pub const KAMINPAR_IMBALANCE: f64 = 1.03;

/// Options of KaMinPar partitioning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KaminparOptions {
    /// Seed of KaMinPar's random generators.
    pub seed: u64,
    /// Allowed imbalance (largest part ≤ this × the mean, in what `balance` balances): KaMinPar
    /// keeps 1.03, so any value from 1.03 up is met; smaller ones are refused.
    pub imbalance: f64,
    /// Threads; 0 means all cores (`std::thread::available_parallelism`).
    pub threads: usize,
    /// Nodes or non-zeros.
    pub balance: Balance,
}

impl Default for KaminparOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            imbalance: KAMINPAR_IMBALANCE,
            threads: 0,
            balance: Balance::Nodes,
        }
    }
}

impl KaminparOptions {
    /// Checks the options: an imbalance KaMinPar can meet, a seed that fits its `int`.
    pub fn validate(&self) -> Result<(), PartitionError> {
        super::imbalance_thousandths(self.imbalance)?;
        if self.imbalance < KAMINPAR_IMBALANCE - 1e-9 {
            return Err(PartitionError::Kaminpar(std::format!(
                "it balances parts to within 3% (imbalance 1.03) and cannot meet {}; \
                 use --imbalance 1.03 or more, or --method metis",
                self.imbalance
            )));
        }
        if i32::try_from(self.seed).is_err() {
            return Err(PartitionError::Kaminpar(std::format!(
                "seed {} does not fit its 32-bit seed; use a seed below 2147483648",
                self.seed
            )));
        }
        Ok(())
    }

    /// The thread count this runs with.
    pub fn effective_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            t => t,
        }
    }
}

#[cfg(feature = "kaminpar")]
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
#[cfg(feature = "kaminpar")]
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Partitions with KaMinPar; `parts ≥ 2`, `parts ≤ N` (checked by the caller).
pub(super) fn kaminpar_kway(
    adjacency: &Adjacency,
    parts: u32,
    options: &KaminparOptions,
) -> Result<Vec<u32>, PartitionError> {
    options.validate()?;
    let weights = match options.balance {
        Balance::Nodes => None,
        // KaMinPar sums node weights into 32-bit block weights.
        Balance::Nonzeros => Some(nonzero_weights(adjacency, i32::MAX as u64, "KaMinPar")?),
    };
    run(adjacency, parts, options, weights)
}

#[cfg(feature = "kaminpar")]
fn run(
    adjacency: &Adjacency,
    parts: u32,
    options: &KaminparOptions,
    mut weights: Option<Vec<i32>>,
) -> Result<Vec<u32>, PartitionError> {
    let n = u32::try_from(adjacency.num_nodes())
        .map_err(|_| PartitionError::TooManyNodes(adjacency.num_nodes() as u64))?;
    let threads = options.effective_threads();
    // KaMinPar's API takes mutable pointers although it only reads the graph; its Graph wraps
    // the arrays without copying (or freeing) them.
    let xadj = adjacency.xadj();
    let adjncy = adjacency.adjncy();
    let mut part = std::vec![0u32; n as usize];
    let mut message = std::vec![0 as std::ffi::c_char; 512];
    let started = std::time::Instant::now();
    let _guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // On a thread of its own, so KaMinPar's thread-local state stays off the caller's thread.
    let code = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: the shim reads n + 1 offsets, xadj[n] neighbour ids and (if not null)
                // n weights, and writes n block ids into `part` and at most `capacity` bytes
                // into `message`; every buffer has those lengths and lives past the call. The
                // graph arrays are only read (KaMinPar keeps the input graph const). The shim
                // catches every C++ exception, so nothing unwinds into Rust.
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
            std::string::String::from_utf8_lossy(&bytes).into_owned(),
        ));
    }
    tracing::info!(
        parts,
        threads,
        seconds = started.elapsed().as_secs_f64(),
        "KaMinPar done"
    );
    if let Some((node, &p)) = part.iter().enumerate().find(|(_, &p)| p >= parts) {
        return Err(PartitionError::Kaminpar(std::format!(
            "returned part {p} for node {node}, outside 0..{parts}"
        )));
    }
    Ok(part)
}

#[cfg(not(feature = "kaminpar"))]
fn run(
    _adjacency: &Adjacency,
    _parts: u32,
    _options: &KaminparOptions,
    _weights: Option<Vec<i32>>,
) -> Result<Vec<u32>, PartitionError> {
    Err(PartitionError::Kaminpar(
        "this build has no KaMinPar: rebuild with `cargo build --release -p distspmm-cli \
         --features kaminpar`, or use --method metis"
            .into(),
    ))
}
