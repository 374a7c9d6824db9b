//! Renumbering nodes part by part, so part p owns the contiguous new-id range
//! `[offsets[p], offsets[p+1])`.

use distspmm_sparse::index;
use std::ops::Range;
use std::vec::Vec;

/// Old ↔ new node ids after grouping nodes by part. Within a part, nodes keep their original
/// relative order, so the renumbering of a contiguous partition is the identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renumbering {
    offsets: Vec<u64>,
    old_to_new: Vec<u32>,
    new_to_old: Vec<u32>,
}

impl Renumbering {
    /// Groups the nodes of `part_of` (all entries `< parts`) by part with a stable counting sort.
    pub(crate) fn from_part_map(parts: u32, part_of: &[u32]) -> Self {
        let mut offsets = std::vec![0u64; parts as usize + 1];
        for &p in part_of {
            offsets[p as usize + 1] += 1;
        }
        for p in 0..parts as usize {
            offsets[p + 1] += offsets[p];
        }
        let mut next: Vec<u64> = offsets[..parts as usize].to_vec();
        let mut old_to_new = std::vec![0u32; part_of.len()];
        let mut new_to_old = std::vec![0u32; part_of.len()];
        for (old, &p) in part_of.iter().enumerate() {
            let new = next[p as usize];
            next[p as usize] += 1;
            #[allow(
                clippy::cast_possible_truncation,
                reason = "a new id below the node count, which fits u32 ids"
            )]
            let new_id = new as u32;
            old_to_new[old] = new_id;
            new_to_old[index::offset(new)] = index::id(old);
        }
        Self {
            offsets,
            old_to_new,
            new_to_old,
        }
    }

    /// Number of parts.
    pub fn parts(&self) -> u32 {
        // Built from a u32 part count.
        index::id(self.offsets.len() - 1)
    }

    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.old_to_new.len()
    }

    /// Part offsets, `parts + 1` entries: part p owns new ids `offsets[p]..offsets[p+1]`.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// New id of every original node.
    pub fn old_to_new(&self) -> &[u32] {
        &self.old_to_new
    }

    /// Original id of every new node.
    pub fn new_to_old(&self) -> &[u32] {
        &self.new_to_old
    }

    /// The new-id range owned by `part`.
    pub fn part_range(&self, part: u32) -> Range<usize> {
        index::offset(self.offsets[part as usize])..index::offset(self.offsets[part as usize + 1])
    }

    /// Number of nodes in `part`.
    pub fn part_size(&self, part: u32) -> usize {
        self.part_range(part).len()
    }

    /// Original ids of `part`'s nodes in local order (local id i is new id `offsets[part] + i`).
    pub fn part_nodes(&self, part: u32) -> &[u32] {
        &self.new_to_old[self.part_range(part)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn is_a_stable_grouping_by_part(
            parts in 1u32..6,
            raw in proptest::collection::vec(0u32..6, 0..80),
        ) {
            let part_of: Vec<u32> = raw.iter().map(|&p| p % parts).collect();
            let r = Renumbering::from_part_map(parts, &part_of);
            prop_assert_eq!(r.parts(), parts);
            prop_assert_eq!(usize::try_from(r.offsets()[parts as usize]).unwrap(), part_of.len());
            for p in 0..parts {
                let nodes = r.part_nodes(p);
                // Exactly the nodes of p, in increasing original order.
                let want: Vec<u32> = (0..u32::try_from(part_of.len()).unwrap())
                    .filter(|&v| part_of[v as usize] == p)
                    .collect();
                prop_assert_eq!(nodes, &want[..]);
            }
            for old in 0..part_of.len() {
                let new = r.old_to_new()[old] as usize;
                prop_assert_eq!(r.new_to_old()[new] as usize, old);
            }
        }
    }
}
