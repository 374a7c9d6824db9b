//! Which kernel runs for which shape: the names of the kernels in `kernels/spmm.cu` and the
//! pure selection rules (testable without a GPU).

use crate::plan::RowSplitPlan;

/// Threads per block of every kernel (`BLOCK_THREADS` in `kernels/spmm.cu`).
pub const BLOCK_THREADS: u32 = 256;
/// Warps per block.
pub const WARPS_PER_BLOCK: u32 = BLOCK_THREADS / 32;

/// Lanes of a warp that share one row of A (row groups) or one piece of a long row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupLanes {
    /// 4 lanes per row, 8 rows per warp.
    L4,
    /// 8 lanes per row, 4 rows per warp.
    L8,
    /// 16 lanes per row, 2 rows per warp.
    L16,
    /// A whole warp per row.
    L32,
}

impl GroupLanes {
    /// Every group size, smallest first.
    pub const ALL: [GroupLanes; 4] = [
        GroupLanes::L4,
        GroupLanes::L8,
        GroupLanes::L16,
        GroupLanes::L32,
    ];

    /// The number of lanes.
    pub fn get(self) -> u32 {
        match self {
            GroupLanes::L4 => 4,
            GroupLanes::L8 => 8,
            GroupLanes::L16 => 16,
            GroupLanes::L32 => 32,
        }
    }

    /// The smallest group whose lanes cover `f` feature columns with one chunk each (float4
    /// chunks when `vec4`), so that small F leaves no lane idle and large F uses the whole warp.
    pub fn for_features(f: usize, vec4: bool) -> GroupLanes {
        let chunks = if vec4 { f.div_ceil(4) } else { f };
        match chunks {
            0..=4 => GroupLanes::L4,
            5..=8 => GroupLanes::L8,
            9..=16 => GroupLanes::L16,
            _ => GroupLanes::L32,
        }
    }

    fn index(self) -> usize {
        match self {
            GroupLanes::L4 => 0,
            GroupLanes::L8 => 1,
            GroupLanes::L16 => 2,
            GroupLanes::L32 => 3,
        }
    }
}

/// How an SpMM is split over the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Row splitting when the matrix has rows longer than its plan's piece size (a skewed
    /// degree distribution), row groups sized by F otherwise.
    #[default]
    Auto,
    /// One group of lanes per row for every row; `None` sizes the group by F.
    RowGroups {
        /// Lanes per row; `None` picks [`GroupLanes::for_features`].
        lanes: Option<GroupLanes>,
    },
    /// Row groups for short rows, long rows cut into pieces by non-zeros and combined in a
    /// deterministic second pass (needs the matrix's [`RowSplitPlan`]).
    RowSplit,
}

/// What a call ran: the kernels and their parameters (for logs and benchmarks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelChoice {
    /// Lanes per row (and per piece).
    pub lanes: GroupLanes,
    /// Whether X and Y were read and written as float4.
    pub vec4: bool,
    /// The row-group kernel.
    pub rows_kernel: &'static str,
    /// The piece and combine kernels, when long rows were split.
    pub split_kernels: Option<(&'static str, &'static str)>,
}

const ROWS_VEC4: [&str; 4] = [
    "dsp_csr_rows_g4_v1_vec4",
    "dsp_csr_rows_g8_v1_vec4",
    "dsp_csr_rows_g16_v1_vec4",
    "dsp_csr_rows_g32_v1_vec4",
];
const ROWS_F32: [&str; 4] = [
    "dsp_csr_rows_g4_v1_f32",
    "dsp_csr_rows_g8_v1_f32",
    "dsp_csr_rows_g16_v1_f32",
    "dsp_csr_rows_g32_v1_f32",
];
const ROWS_WIDE_VEC4: &str = "dsp_csr_rows_g32_v2_vec4";
const ROWS_WIDE_F32: &str = "dsp_csr_rows_g32_v2_f32";
const PIECES_VEC4: [&str; 4] = [
    "dsp_csr_pieces_g4_vec4",
    "dsp_csr_pieces_g8_vec4",
    "dsp_csr_pieces_g16_vec4",
    "dsp_csr_pieces_g32_vec4",
];
const PIECES_F32: [&str; 4] = [
    "dsp_csr_pieces_g4_f32",
    "dsp_csr_pieces_g8_f32",
    "dsp_csr_pieces_g16_f32",
    "dsp_csr_pieces_g32_f32",
];
const LONG_ROWS_VEC4: &str = "dsp_csr_long_rows_vec4";
const LONG_ROWS_F32: &str = "dsp_csr_long_rows_f32";

/// Every kernel in `kernels/spmm.cu`; the build's ptxas report must list each for sm_80 and
/// sm_90, and the loaded module must contain each.
pub const KERNELS: [&str; 20] = [
    ROWS_VEC4[0],
    ROWS_VEC4[1],
    ROWS_VEC4[2],
    ROWS_VEC4[3],
    ROWS_WIDE_VEC4,
    ROWS_F32[0],
    ROWS_F32[1],
    ROWS_F32[2],
    ROWS_F32[3],
    ROWS_WIDE_F32,
    PIECES_VEC4[0],
    PIECES_VEC4[1],
    PIECES_VEC4[2],
    PIECES_VEC4[3],
    PIECES_F32[0],
    PIECES_F32[1],
    PIECES_F32[2],
    PIECES_F32[3],
    LONG_ROWS_VEC4,
    LONG_ROWS_F32,
];

/// The row-group kernel for `lanes`. A whole-warp group takes
/// two chunks per lane per tile once F spans more than one chunk per lane.
pub(crate) fn rows_kernel(lanes: GroupLanes, f: usize, vec4: bool) -> &'static str {
    let chunks = if vec4 { f.div_ceil(4) } else { f };
    match (lanes, vec4) {
        (GroupLanes::L32, true) if chunks > 32 => ROWS_WIDE_VEC4,
        (GroupLanes::L32, false) if chunks > 32 => ROWS_WIDE_F32,
        (l, true) => ROWS_VEC4[l.index()],
        (l, false) => ROWS_F32[l.index()],
    }
}

/// The piece kernel (pass 1 of row splitting) for `lanes`.
pub(crate) fn pieces_kernel(lanes: GroupLanes, vec4: bool) -> &'static str {
    if vec4 {
        PIECES_VEC4[lanes.index()]
    } else {
        PIECES_F32[lanes.index()]
    }
}

/// The combine kernel (pass 2 of row splitting).
pub(crate) fn long_rows_kernel(vec4: bool) -> &'static str {
    if vec4 {
        LONG_ROWS_VEC4
    } else {
        LONG_ROWS_F32
    }
}

/// What the launcher knows about the matrix's row-splitting plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlanState {
    /// No plan on the device (a raw call without one).
    Missing,
    /// A plan without long rows: row splitting is plain row groups.
    NoLongRows,
    /// A plan with long rows to split.
    LongRows,
}

impl PlanState {
    pub(crate) fn of(plan: &RowSplitPlan) -> PlanState {
        if plan.is_empty() {
            PlanState::NoLongRows
        } else {
            PlanState::LongRows
        }
    }
}

/// Resolves `strategy` for a product with `f` feature columns: the group size, and whether
/// long rows are split.
pub(crate) fn resolve(
    strategy: Strategy,
    f: usize,
    vec4: bool,
    plan: PlanState,
) -> Result<(GroupLanes, bool), String> {
    let by_f = GroupLanes::for_features(f, vec4);
    match strategy {
        Strategy::Auto => Ok((by_f, plan == PlanState::LongRows)),
        Strategy::RowGroups { lanes } => Ok((lanes.unwrap_or(by_f), false)),
        Strategy::RowSplit if plan == PlanState::Missing => {
            Err("row splitting needs the matrix's RowSplitPlan on the device".into())
        }
        Strategy::RowSplit => Ok((by_f, plan == PlanState::LongRows)),
    }
}

/// Blocks needed for `warps` warps.
pub(crate) fn blocks_for_warps(warps: u64) -> u64 {
    warps.div_ceil(u64::from(WARPS_PER_BLOCK))
}

/// Warps the row-group kernel needs for `nrows` rows with `lanes` lanes per row.
pub(crate) fn row_warps(nrows: u64, lanes: GroupLanes) -> u64 {
    nrows.div_ceil(u64::from(32 / lanes.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_cover_features_without_idle_groups() {
        assert_eq!(GroupLanes::for_features(1, false), GroupLanes::L4);
        assert_eq!(GroupLanes::for_features(16, true), GroupLanes::L4);
        assert_eq!(GroupLanes::for_features(17, true), GroupLanes::L8);
        assert_eq!(GroupLanes::for_features(64, true), GroupLanes::L16);
        assert_eq!(GroupLanes::for_features(64, false), GroupLanes::L32);
        assert_eq!(GroupLanes::for_features(128, true), GroupLanes::L32);
        for f in 1..600 {
            for vec4 in [false, true] {
                let l = GroupLanes::for_features(f, vec4);
                let chunks = if vec4 { f.div_ceil(4) } else { f };
                // The next smaller group would need more than one chunk per lane.
                assert!(
                    l == GroupLanes::L4 || chunks > l.get() as usize / 2,
                    "f={f} vec4={vec4} -> {l:?}"
                );
                assert!(l == GroupLanes::L32 || chunks <= l.get() as usize);
            }
        }
    }

    #[test]
    fn wide_tiles_only_for_whole_warps_beyond_one_chunk_per_lane() {
        assert_eq!(
            rows_kernel(GroupLanes::L32, 128, true),
            "dsp_csr_rows_g32_v1_vec4"
        );
        assert_eq!(
            rows_kernel(GroupLanes::L32, 129, true),
            "dsp_csr_rows_g32_v2_vec4"
        );
        assert_eq!(
            rows_kernel(GroupLanes::L32, 256, true),
            "dsp_csr_rows_g32_v2_vec4"
        );
        assert_eq!(
            rows_kernel(GroupLanes::L32, 33, false),
            "dsp_csr_rows_g32_v2_f32"
        );
        assert_eq!(
            rows_kernel(GroupLanes::L16, 999, false),
            "dsp_csr_rows_g16_v1_f32"
        );
        assert_eq!(
            pieces_kernel(GroupLanes::L8, true),
            "dsp_csr_pieces_g8_vec4"
        );
        assert_eq!(long_rows_kernel(false), "dsp_csr_long_rows_f32");
    }

    #[test]
    fn every_selectable_kernel_is_listed_once() {
        let mut names = KERNELS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KERNELS.len());
        for lanes in GroupLanes::ALL {
            for vec4 in [false, true] {
                for f in [1, 4, 33, 129, 512] {
                    assert!(KERNELS.contains(&rows_kernel(lanes, f, vec4)));
                }
                assert!(KERNELS.contains(&pieces_kernel(lanes, vec4)));
            }
        }
        assert!(KERNELS.contains(&long_rows_kernel(true)));
    }

    #[test]
    fn auto_splits_only_skewed_matrices() {
        let flat = PlanState::of(&RowSplitPlan::new(&[0, 3, 6, 9], 4).unwrap());
        let skewed = PlanState::of(&RowSplitPlan::new(&[0, 1, 2, 100], 4).unwrap());
        assert_eq!(flat, PlanState::NoLongRows);
        assert_eq!(skewed, PlanState::LongRows);
        assert_eq!(
            resolve(Strategy::Auto, 16, true, flat),
            Ok((GroupLanes::L4, false))
        );
        assert_eq!(
            resolve(Strategy::Auto, 16, true, skewed),
            Ok((GroupLanes::L4, true))
        );
        assert_eq!(
            resolve(Strategy::Auto, 256, true, PlanState::Missing),
            Ok((GroupLanes::L32, false))
        );
        let forced = Strategy::RowGroups {
            lanes: Some(GroupLanes::L8),
        };
        assert_eq!(
            resolve(forced, 256, true, skewed),
            Ok((GroupLanes::L8, false))
        );
        assert_eq!(
            resolve(Strategy::RowSplit, 3, false, skewed),
            Ok((GroupLanes::L4, true))
        );
        assert_eq!(
            resolve(Strategy::RowSplit, 3, false, flat),
            Ok((GroupLanes::L4, false))
        );
        assert!(resolve(Strategy::RowSplit, 3, false, PlanState::Missing).is_err());
    }

    #[test]
    fn grid_sizes_round_up() {
        assert_eq!(row_warps(9, GroupLanes::L4), 2);
        assert_eq!(row_warps(8, GroupLanes::L4), 1);
        assert_eq!(row_warps(3, GroupLanes::L32), 3);
        assert_eq!(blocks_for_warps(9), 2);
        assert_eq!(blocks_for_warps(0), 0);
    }
}
