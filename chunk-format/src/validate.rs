//! The structural invariants of a chunk (docs/chunk-format.md, "Invariants a reader validates").
//!
//! Runs after the layout and checksums are verified. Counts are compared with the header before
//! any slicing, so the slicing in [`ChunkView::block`] and friends cannot fail afterwards.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::error::ChunkError;
use crate::layout::{ChunkHeader, SectionKind, TARGET_UNLABELLED};
use crate::view::{BlockView, ChunkView};

/// Checks that `actual` elements is the `expected` count (`what` says where it comes from).
fn expect_len(
    kind: SectionKind,
    actual: usize,
    expected: u64,
    what: &str,
) -> Result<(), ChunkError> {
    if actual as u64 == expected {
        Ok(())
    } else {
        Err(ChunkError::section(
            kind,
            format!("has {actual} elements, expected {expected} ({what})"),
        ))
    }
}

/// Checks a prefix-sum array: starts at 0, non-decreasing, ends at `total`.
fn check_prefix(offsets: &[u64], total: u64, total_name: &str) -> Result<(), String> {
    match offsets.first() {
        None => return Err(String::from("is empty")),
        Some(&first) if first != 0 => return Err(format!("first offset is {first}, expected 0")),
        Some(_) => {}
    }
    if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return Err(format!(
            "offset {} ({}) is smaller than offset {i} ({})",
            i + 1,
            offsets[i + 1],
            offsets[i]
        ));
    }
    match offsets.last() {
        Some(&last) if last != total => Err(format!(
            "last offset is {last}, expected {total} ({total_name})"
        )),
        _ => Ok(()),
    }
}

/// Checks that `list` is strictly increasing and every entry is below `bound`.
fn check_sorted_below(list: &[u32], bound: u64) -> Result<(), String> {
    if let Some(i) = list.windows(2).position(|w| w[0] >= w[1]) {
        return Err(format!(
            "entries {i} and {} ({} and {}) are not strictly increasing",
            i + 1,
            list[i],
            list[i + 1]
        ));
    }
    match list.last() {
        Some(&last) if u64::from(last) >= bound => Err(format!(
            "entry {} is {last}, not below {bound}",
            list.len() - 1
        )),
        _ => Ok(()),
    }
}

/// An optional section is present exactly when its header count (F or C) is non-zero.
fn check_presence<T>(
    field: &'static str,
    count: u32,
    kind: SectionKind,
    section: Option<T>,
) -> Result<(), ChunkError> {
    match (count, section.is_some()) {
        (0, true) => Err(ChunkError::section(
            kind,
            format!("present but the header's {field} is 0"),
        )),
        (c, false) if c > 0 => Err(ChunkError::header(
            field,
            format!("is {c} but there is no {kind} section"),
        )),
        _ => Ok(()),
    }
}

/// A count or offset of a chunk as an index into memory: every value this is called on was
/// first checked to be at most the length of a section in memory (a `usize`) — by
/// `ChunkView::parse`, or by the `check_prefix` just before it in this file.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the value is bounded by the length of a slice in memory, which is a usize"
)]
#[inline(always)]
pub(crate) fn to_usize(x: u64) -> usize {
    x as usize
}

/// Rows of `list` owned by one peer, given validated prefix `offsets`.
pub(crate) fn peer_range(offsets: &[u64], peer: usize) -> core::ops::Range<usize> {
    to_usize(offsets[peer])..to_usize(offsets[peer + 1])
}

/// The arrays a chunk's invariants are stated on, however the chunk is held: parsed from a file
/// ([`ChunkView::validate`], after the file's own layout is checked) or about to be written
/// ([`Plan::validate`](crate::contents::Plan::validate), from the builder's arrays). One home for
/// the rules, so what a writer refuses is exactly what a reader would.
pub(crate) struct Arrays<'a, 'h> {
    pub(crate) header: &'h ChunkHeader,
    pub(crate) part_offsets: &'a [u64],
    pub(crate) halo_recv_offsets: &'a [u64],
    pub(crate) halo_recv: &'a [u32],
    pub(crate) halo_send_offsets: &'a [u64],
    pub(crate) halo_send: &'a [u32],
    pub(crate) original_ids: &'a [u64],
    pub(crate) features: Option<&'a [f32]>,
    pub(crate) labels: Option<&'a [i32]>,
    pub(crate) targets: Option<&'a [u8]>,
    pub(crate) masks: Option<&'a [u8]>,
}

impl ChunkView<'_> {
    pub(crate) fn validate(&self, check_transpose: bool) -> Result<(), ChunkError> {
        let arrays = Arrays {
            header: &self.header,
            part_offsets: self.part_offsets,
            halo_recv_offsets: self.halo_recv_offsets,
            halo_recv: self.halo_recv,
            halo_send_offsets: self.halo_send_offsets,
            halo_send: self.halo_send,
            original_ids: self.original_ids,
            features: self.features,
            labels: self.labels,
            targets: self.targets,
            masks: self.masks,
        };
        arrays.validate_lists()?;
        arrays.validate_sources(self.block_src)?;
        self.validate_block_layout()?;
        let blocks: Vec<BlockView<'_>> = self.blocks().collect();
        arrays.validate_blocks(&blocks, check_transpose)
    }

    /// How the blocks lie in the file's concatenated sections: the per-block offset tables and
    /// every section's length, so that [`ChunkView::block`] cannot fail afterwards.
    fn validate_block_layout(&self) -> Result<(), ChunkError> {
        let h = &self.header;
        let n_p = h.num_local_nodes;
        let blocks = self.block_src.len() as u64;
        let total_cols = n_p.checked_add(h.num_halo_rows).ok_or_else(|| {
            ChunkError::header(
                "num_halo_rows",
                format!("{} + num_local_nodes overflows", h.num_halo_rows),
            )
        })?;
        let kind = SectionKind::BLOCK_COL_OFFSETS;
        expect_len(kind, self.block_col_offsets.len(), blocks + 1, "blocks + 1")?;
        check_prefix(
            self.block_col_offsets,
            total_cols,
            "num_local_nodes + num_halo_rows",
        )
        .map_err(|d| ChunkError::section(kind, d))?;
        let kind = SectionKind::BLOCK_NNZ_OFFSETS;
        expect_len(kind, self.block_nnz_offsets.len(), blocks + 1, "blocks + 1")?;
        check_prefix(self.block_nnz_offsets, h.nnz, "the header's nnz")
            .map_err(|d| ChunkError::section(kind, d))?;

        let rowptr_len = blocks.checked_mul(n_p + 1).ok_or_else(|| {
            ChunkError::section(
                SectionKind::CSR_ROWPTR,
                "blocks × (n_p + 1) overflows".into(),
            )
        })?;
        expect_len(
            SectionKind::CSR_ROWPTR,
            self.csr_rowptr.len(),
            rowptr_len,
            "blocks × (num_local_nodes + 1)",
        )?;
        // A saturated count matches no real length, so saturating is as good as checking here.
        expect_len(
            SectionKind::CSC_COLPTR,
            self.csc_colptr.len(),
            total_cols.saturating_add(blocks),
            "sum over blocks of (ncols + 1)",
        )?;
        for kind in [
            SectionKind::CSR_COLS,
            SectionKind::CSR_VALS,
            SectionKind::CSC_ROWS,
            SectionKind::CSC_VALS,
        ] {
            let len = match kind {
                SectionKind::CSR_COLS => self.csr_cols.len(),
                SectionKind::CSR_VALS => self.csr_vals.len(),
                SectionKind::CSC_ROWS => self.csc_rows.len(),
                _ => self.csc_vals.len(),
            };
            expect_len(kind, len, h.nnz, "the header's nnz")?;
        }
        if let Some(weights) = self.edge_weights {
            expect_len(
                SectionKind::EDGE_WEIGHTS,
                weights.len(),
                h.nnz,
                "the header's nnz",
            )?;
        }
        Ok(())
    }
}

impl Arrays<'_, '_> {
    /// The part offsets and both halo lists (checked before any block, which they describe).
    pub(crate) fn validate_lists(&self) -> Result<(), ChunkError> {
        self.validate_part_offsets()?;
        let part_offsets = self.part_offsets;
        self.validate_halo_lists(
            (SectionKind::HALO_RECV_OFFSETS, SectionKind::HALO_RECV),
            self.halo_recv_offsets,
            self.halo_recv,
            |q| part_offsets[q + 1] - part_offsets[q],
        )?;
        let n_p = self.header.num_local_nodes;
        self.validate_halo_lists(
            (SectionKind::HALO_SEND_OFFSETS, SectionKind::HALO_SEND),
            self.halo_send_offsets,
            self.halo_send,
            |_| n_p,
        )
    }

    /// The blocks (after [`Arrays::validate_lists`]): which peers they come from and their
    /// shapes, each block's CSR and CSC, the node data, and last (the expensive check, so cheap
    /// failures are reported first) that each CSC holds its CSR's entries.
    pub(crate) fn validate_blocks(
        &self,
        blocks: &[BlockView<'_>],
        check_transpose: bool,
    ) -> Result<(), ChunkError> {
        self.validate_block_table(blocks)?;
        for (i, block) in blocks.iter().enumerate() {
            validate_block(block, i, block.src_part == self.header.part_id)?;
        }
        self.validate_node_data()?;
        if check_transpose {
            let mut cursor = Vec::new();
            for (i, block) in blocks.iter().enumerate() {
                check_csc_matches_csr(block, i, &mut cursor)?;
            }
        }
        Ok(())
    }

    fn validate_part_offsets(&self) -> Result<(), ChunkError> {
        let kind = SectionKind::PART_OFFSETS;
        let h = &self.header;
        let offsets = self.part_offsets;
        expect_len(
            kind,
            offsets.len(),
            u64::from(h.num_parts) + 1,
            "num_parts + 1",
        )?;
        check_prefix(offsets, h.num_global_nodes, "num_global_nodes")
            .map_err(|d| ChunkError::section(kind, d))?;
        if let Some(q) = offsets
            .windows(2)
            .position(|w| w[1] - w[0] > u64::from(u32::MAX))
        {
            return Err(ChunkError::section(
                kind,
                format!(
                    "part {q} has {} nodes, more than a u32 local index addresses",
                    offsets[q + 1] - offsets[q]
                ),
            ));
        }
        let p = h.part_id as usize;
        let own = offsets[p + 1] - offsets[p];
        if own != h.num_local_nodes {
            return Err(ChunkError::section(
                kind,
                format!(
                    "part {p} has {own} nodes but the header's num_local_nodes is {}",
                    h.num_local_nodes
                ),
            ));
        }
        Ok(())
    }

    /// Per-peer lists: offsets `u64[P+1]` over `list`, own range empty, each peer's list strictly
    /// increasing and below `bound(peer)`. For the receive side the total must be the header's H.
    fn validate_halo_lists(
        &self,
        (offsets_kind, list_kind): (SectionKind, SectionKind),
        offsets: &[u64],
        list: &[u32],
        bound: impl Fn(usize) -> u64,
    ) -> Result<(), ChunkError> {
        let h = &self.header;
        expect_len(
            offsets_kind,
            offsets.len(),
            u64::from(h.num_parts) + 1,
            "num_parts + 1",
        )?;
        if list_kind == SectionKind::HALO_RECV {
            expect_len(
                list_kind,
                list.len(),
                h.num_halo_rows,
                "the header's num_halo_rows",
            )?;
        }
        check_prefix(
            offsets,
            list.len() as u64,
            "the element count of the list section",
        )
        .map_err(|d| ChunkError::section(offsets_kind, d))?;
        let own = peer_range(offsets, h.part_id as usize);
        if !own.is_empty() {
            return Err(ChunkError::section(
                offsets_kind,
                format!(
                    "the range of the chunk's own part {} holds {} rows; it must be empty",
                    h.part_id,
                    own.len()
                ),
            ));
        }
        for peer in 0..h.num_parts as usize {
            check_sorted_below(&list[peer_range(offsets, peer)], bound(peer))
                .map_err(|d| ChunkError::section(list_kind, format!("list of peer {peer}: {d}")))?;
        }
        Ok(())
    }

    /// The blocks' source parts (after [`Arrays::validate_lists`]): sorted and below P, the
    /// diagonal block's among them, and one for every part rows are received from.
    pub(crate) fn validate_sources(&self, src: &[u32]) -> Result<(), ChunkError> {
        let h = &self.header;
        let part = h.part_id;
        check_sorted_below(src, u64::from(h.num_parts))
            .map_err(|d| ChunkError::section(SectionKind::BLOCK_SRC, d))?;
        if src.binary_search(&part).is_err() {
            return Err(ChunkError::section(
                SectionKind::BLOCK_SRC,
                format!("does not hold the diagonal block's source part {part}"),
            ));
        }
        // Blocks and halo receive lists describe the same peers.
        let recv = self.halo_recv_offsets;
        if let Some(q) = (0..h.num_parts).find(|&q| {
            q != part && recv[q as usize + 1] > recv[q as usize] && src.binary_search(&q).is_err()
        }) {
            return Err(ChunkError::section(
                SectionKind::HALO_RECV_OFFSETS,
                format!(
                    "rows are received from part {q} but there is no block with source part {q}"
                ),
            ));
        }
        Ok(())
    }

    /// The block table (after [`Arrays::validate_sources`]): a block only for a part rows are
    /// received from, and each block as wide as the rows it compacts.
    fn validate_block_table(&self, blocks: &[BlockView<'_>]) -> Result<(), ChunkError> {
        let h = &self.header;
        let part = h.part_id;
        let n_p = h.num_local_nodes;
        let recv = self.halo_recv_offsets;
        for (i, b) in blocks.iter().enumerate() {
            let q = b.src_part;
            let ncols = b.ncols as u64;
            let expected = if q == part {
                n_p
            } else {
                let received = recv[q as usize + 1] - recv[q as usize];
                if received == 0 {
                    return Err(ChunkError::section(
                        SectionKind::BLOCK_SRC,
                        format!(
                            "block {i} has source part {q} but no rows are received from part {q}"
                        ),
                    ));
                }
                received
            };
            if ncols != expected {
                return Err(ChunkError::section(
                    SectionKind::BLOCK_COL_OFFSETS,
                    format!(
                        "block {i} (source part {q}) has {ncols} columns, expected {expected} ({})",
                        if q == part {
                            "num_local_nodes"
                        } else {
                            "rows received from that part"
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_node_data(&self) -> Result<(), ChunkError> {
        let h = &self.header;
        let n_p = h.num_local_nodes;
        let kind = SectionKind::ORIGINAL_IDS;
        expect_len(kind, self.original_ids.len(), n_p, "num_local_nodes")?;
        if let Some(i) = self
            .original_ids
            .iter()
            .position(|&id| id >= h.num_global_nodes)
        {
            return Err(ChunkError::section(
                kind,
                format!(
                    "row {i} has original id {}, not below num_global_nodes {}",
                    self.original_ids[i], h.num_global_nodes
                ),
            ));
        }

        check_presence(
            "feature_dim",
            h.feature_dim,
            SectionKind::FEATURES,
            self.features,
        )?;
        if let Some(features) = self.features {
            let f = h.feature_dim;
            let expected = n_p.checked_mul(u64::from(f)).ok_or_else(|| {
                ChunkError::header("feature_dim", format!("num_local_nodes × {f} overflows"))
            })?;
            expect_len(
                SectionKind::FEATURES,
                features.len(),
                expected,
                "num_local_nodes × feature_dim",
            )?;
        }

        let classes = h.num_classes;
        if self.labels.is_some() && self.targets.is_some() {
            return Err(ChunkError::section(
                SectionKind::TARGETS,
                "present together with LABELS; a chunk holds one class per node (LABELS) or \
                 multi-label targets (TARGETS), not both"
                    .into(),
            ));
        }
        match self.targets {
            Some(targets) => self.validate_targets(targets)?,
            None => check_presence("num_classes", classes, SectionKind::LABELS, self.labels)?,
        }
        if let Some(labels) = self.labels {
            let kind = SectionKind::LABELS;
            expect_len(kind, labels.len(), n_p, "num_local_nodes")?;
            if let Some(i) = labels
                .iter()
                .position(|&l| l < -1 || (l >= 0 && l as u32 >= classes))
            {
                return Err(ChunkError::section(
                    kind,
                    format!(
                        "row {i} has label {}; labels are -1 (unlabelled) or below num_classes {classes}",
                        labels[i]
                    ),
                ));
            }
        }

        if let Some(masks) = self.masks {
            let kind = SectionKind::MASKS;
            expect_len(kind, masks.len(), n_p, "num_local_nodes")?;
            if let Some(i) = masks.iter().position(|&m| m & !0b111 != 0) {
                return Err(ChunkError::section(
                    kind,
                    format!(
                        "row {i} has mask {:#010b}; only bits 0 (train), 1 (val) and 2 (test) are defined",
                        masks[i]
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Arrays<'_, '_> {
    /// `TARGETS`: `n_p × C` bytes (C > 0), each row all 0/1 or all [`TARGET_UNLABELLED`].
    fn validate_targets(&self, targets: &[u8]) -> Result<(), ChunkError> {
        let h = &self.header;
        let kind = SectionKind::TARGETS;
        let classes = h.num_classes;
        if classes == 0 {
            return Err(ChunkError::section(
                kind,
                "present but the header's num_classes is 0".into(),
            ));
        }
        let expected = h
            .num_local_nodes
            .checked_mul(u64::from(classes))
            .ok_or_else(|| {
                ChunkError::header(
                    "num_classes",
                    format!("num_local_nodes × {classes} overflows"),
                )
            })?;
        expect_len(
            kind,
            targets.len(),
            expected,
            "num_local_nodes × num_classes",
        )?;
        for (i, row) in targets
            .chunks_exact(to_usize(u64::from(classes)))
            .enumerate()
        {
            let unlabelled = row[0] == TARGET_UNLABELLED;
            let bad = row.iter().position(|&t| {
                if unlabelled {
                    t != TARGET_UNLABELLED
                } else {
                    t > 1
                }
            });
            if let Some(c) = bad {
                return Err(ChunkError::section(
                    kind,
                    format!(
                        "row {i} has {} for class {c}{}; a row is all 0/1 (a labelled node) or \
                         all {TARGET_UNLABELLED} (an unlabelled one)",
                        row[c],
                        if unlabelled {
                            format!(" after {TARGET_UNLABELLED} for class 0")
                        } else {
                            String::new()
                        }
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Prefixes a detail with the block it concerns.
fn in_block(b: &BlockView<'_>, index: usize, detail: String) -> String {
    format!("block {index} (source part {}): {detail}", b.src_part)
}

/// One block's CSR and CSC structure.
fn validate_block(b: &BlockView<'_>, index: usize, diagonal: bool) -> Result<(), ChunkError> {
    let at = |d: String| in_block(b, index, d);
    let nnz = b.csr_cols.len() as u64;
    let (rowptr, colptr) = (b.csr_rowptr, b.csc_colptr);
    check_prefix(rowptr, nnz, "the block's non-zero count")
        .map_err(|d| ChunkError::section(SectionKind::CSR_ROWPTR, at(d)))?;
    for (r, w) in rowptr.windows(2).enumerate() {
        check_sorted_below(&b.csr_cols[to_usize(w[0])..to_usize(w[1])], b.ncols as u64)
            .map_err(|d| ChunkError::section(SectionKind::CSR_COLS, at(format!("row {r}: {d}"))))?;
    }
    check_prefix(colptr, nnz, "the block's non-zero count")
        .map_err(|d| ChunkError::section(SectionKind::CSC_COLPTR, at(d)))?;
    if !diagonal {
        if let Some(c) = colptr.windows(2).position(|w| w[0] == w[1]) {
            return Err(ChunkError::section(
                SectionKind::CSC_COLPTR,
                at(format!(
                    "compacted column {c} is empty; the halo receive list must hold exactly the referenced rows"
                )),
            ));
        }
    }
    for (c, w) in colptr.windows(2).enumerate() {
        check_sorted_below(&b.csc_rows[to_usize(w[0])..to_usize(w[1])], b.nrows as u64).map_err(
            |d| ChunkError::section(SectionKind::CSC_ROWS, at(format!("column {c}: {d}"))),
        )?;
    }
    if let Some(weights) = b.edge_weights {
        if let Some(k) = weights.iter().position(|w| !w.is_finite()) {
            let row = rowptr.partition_point(|&start| to_usize(start) <= k) - 1;
            return Err(ChunkError::section(
                SectionKind::EDGE_WEIGHTS,
                at(format!(
                    "the entry (row {row}, column {}) weighs {}; edge weights are finite",
                    b.csr_cols[k], weights[k]
                )),
            ));
        }
    }
    Ok(())
}

/// CSR == CSC for a structurally valid block: visit the CSC column by column; within a row the
/// CSR is sorted by column, so each CSC entry must be the next unvisited CSR entry of its row.
/// Equal counts plus this injective match make the two the same set of entries. `cursor` is
/// scratch space reused across blocks.
fn check_csc_matches_csr(
    b: &BlockView<'_>,
    index: usize,
    cursor: &mut Vec<usize>,
) -> Result<(), ChunkError> {
    let at = |d: String| in_block(b, index, d);
    let (rowptr, colptr) = (b.csr_rowptr, b.csc_colptr);
    cursor.clear();
    cursor.extend(rowptr[..b.nrows].iter().map(|&x| to_usize(x)));
    for (c, w) in colptr.windows(2).enumerate() {
        for k in to_usize(w[0])..to_usize(w[1]) {
            let r = b.csc_rows[k] as usize;
            let j = cursor[r];
            if j >= to_usize(rowptr[r + 1]) || b.csr_cols[j] as usize != c {
                return Err(ChunkError::section(
                    SectionKind::CSC_ROWS,
                    at(format!(
                        "entry (row {r}, column {c}) is in the CSC but not in the CSR"
                    )),
                ));
            }
            if b.csr_vals[j].to_bits() != b.csc_vals[k].to_bits() {
                return Err(ChunkError::section(
                    SectionKind::CSC_VALS,
                    at(format!(
                        "entry (row {r}, column {c}) is {} in the CSC but {} in the CSR",
                        b.csc_vals[k], b.csr_vals[j]
                    )),
                ));
            }
            cursor[r] = j + 1;
        }
    }
    Ok(())
}
