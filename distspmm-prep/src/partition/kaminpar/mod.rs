//! KaMinPar's options ([`KaminparOptions`]) and what surrounds its call: the checks of the
//! options and the node weights. The call itself — the KaMinPar library, TBB and the
//! `kaminpar` crate's C++ bridge — is `run`, built with the crate's `kaminpar` feature;
//! without it, [`Method::Kaminpar`](super::Method::Kaminpar) is
//! [`PartitionError::KaminparNotLinked`].
//!
//! What the KaMinPar version that crate builds (the `kaminpar` crate's, 2022) fixes itself:
//! the imbalance tolerance is 3 % (its library ignores other values), node weights are 32-bit
//! and its seed is a C `int`.

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

/// The KaMinPar call ([`LINKED`] in a build with KaMinPar; tests pass their own): splits `adjacency` into
/// `parts` parts (`2 ≤ parts ≤ N`) with `options` (validated), node v weighing `weights[v]`
/// when weights are given (one per node, summing to at most `i32::MAX`), and returns each
/// node's part (checked here: one per node, each below `parts`).
pub(crate) type KaminparKway =
    fn(&Adjacency, u32, &KaminparOptions, Option<Vec<i32>>) -> Result<Vec<u32>, PartitionError>;

/// Partitions with KaMinPar through `run`; `parts ≥ 2`, `parts ≤ N` (checked by the caller).
/// What `run` returns is checked: one part per node, each below `parts`.
pub(super) fn kaminpar_kway(
    adjacency: &Adjacency,
    parts: u32,
    options: &KaminparOptions,
    run: KaminparKway,
) -> Result<Vec<u32>, PartitionError> {
    options.validate()?;
    let weights = match options.balance {
        Balance::Nodes => None,
        // KaMinPar sums node weights into 32-bit block weights.
        Balance::Nonzeros => Some(nonzero_weights(adjacency, i32::MAX as u64, "KaMinPar")?),
    };
    let part_of = run(adjacency, parts, options, weights)?;
    if part_of.len() != adjacency.num_nodes() {
        return Err(PartitionError::Kaminpar(std::format!(
            "returned parts for {} nodes, but the graph has {}",
            part_of.len(),
            adjacency.num_nodes()
        )));
    }
    if let Some((node, &p)) = part_of.iter().enumerate().find(|(_, &p)| p >= parts) {
        return Err(PartitionError::Kaminpar(std::format!(
            "returned part {p} for node {node}, outside 0..{parts}"
        )));
    }
    Ok(part_of)
}

#[cfg(feature = "kaminpar")]
mod run;

/// The KaMinPar call of this build: the library's.
#[cfg(feature = "kaminpar")]
pub(super) const LINKED: KaminparKway = run::kaminpar_kway;

/// The KaMinPar call of this build: none, said as [`PartitionError::KaminparNotLinked`].
#[cfg(not(feature = "kaminpar"))]
pub(super) const LINKED: KaminparKway = |_, _, _, _| Err(PartitionError::KaminparNotLinked);

#[cfg(all(test, feature = "kaminpar"))]
mod tests;
