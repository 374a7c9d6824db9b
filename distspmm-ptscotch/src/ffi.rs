//! The few PT-Scotch 7.0 functions this crate calls, declared by hand from
//! `/usr/include/scotch-int64/{scotch,ptscotch}.h` (64-bit `SCOTCH_Num`; build.rs checks the
//! header, [`crate::num_size`] the library).
//!
//! The opaque structures (`SCOTCH_Dgraph`, `SCOTCH_Strat`, `SCOTCH_Context`) are only ever
//! handled through pointers from their `SCOTCH_*Alloc` functions (sized by the library itself,
//! freed with `SCOTCH_memFree`), so no Rust declaration of their size can go stale.

use std::ffi::{c_char, c_double, c_int, c_void};

use mpi::ffi::MPI_Comm;

/// `SCOTCH_Num` of the 64-bit build.
pub type ScotchNum = i64;

/// `SCOTCH_STRATDEFAULT` … flags of `SCOTCH_stratDgraphMapBuild` (scotch.h).
pub const STRAT_DEFAULT: ScotchNum = 0x0;
pub const STRAT_QUALITY: ScotchNum = 0x1;
pub const STRAT_SPEED: ScotchNum = 0x2;
pub const STRAT_BALANCE: ScotchNum = 0x4;

/// `SCOTCH_OPTIONNUMDETERMINISTIC` (scotch.h).
pub const OPTION_DETERMINISTIC: c_int = 0;
/// `SCOTCH_OPTIONNUMRANDOMFIXEDSEED` (scotch.h).
pub const OPTION_RANDOM_FIXED_SEED: c_int = 1;

/// Opaque `SCOTCH_Dgraph`.
#[repr(C)]
pub struct Dgraph {
    _private: [u8; 0],
}

/// Opaque `SCOTCH_Strat`.
#[repr(C)]
pub struct Strat {
    _private: [u8; 0],
}

/// Opaque `SCOTCH_Context`.
#[repr(C)]
pub struct Context {
    _private: [u8; 0],
}

extern "C" {
    pub fn SCOTCH_numSizeof() -> c_int;
    pub fn SCOTCH_version(version: *mut c_int, release: *mut c_int, patch: *mut c_int);
    pub fn SCOTCH_memFree(ptr: *mut c_void);
    pub fn SCOTCH_randomSeed(seed: ScotchNum);

    pub fn SCOTCH_contextAlloc() -> *mut Context;
    pub fn SCOTCH_contextInit(context: *mut Context) -> c_int;
    pub fn SCOTCH_contextExit(context: *mut Context);
    pub fn SCOTCH_contextOptionSetNum(
        context: *mut Context,
        option: c_int,
        value: ScotchNum,
    ) -> c_int;
    pub fn SCOTCH_contextRandomClone(context: *mut Context) -> c_int;
    pub fn SCOTCH_contextRandomSeed(context: *mut Context, seed: ScotchNum);
    pub fn SCOTCH_contextThreadSpawn(
        context: *mut Context,
        threads: c_int,
        cores: *const c_int,
    ) -> c_int;
    pub fn SCOTCH_contextBindDgraph(
        context: *mut Context,
        graph: *const Dgraph,
        bound: *mut Dgraph,
    ) -> c_int;

    pub fn SCOTCH_dgraphAlloc() -> *mut Dgraph;
    pub fn SCOTCH_dgraphInit(graph: *mut Dgraph, comm: MPI_Comm) -> c_int;
    pub fn SCOTCH_dgraphExit(graph: *mut Dgraph);
    #[allow(clippy::too_many_arguments)]
    pub fn SCOTCH_dgraphBuild(
        graph: *mut Dgraph,
        baseval: ScotchNum,
        vertlocnbr: ScotchNum,
        vertlocmax: ScotchNum,
        vertloctab: *mut ScotchNum,
        vendloctab: *mut ScotchNum,
        veloloctab: *mut ScotchNum,
        vlblloctab: *mut ScotchNum,
        edgelocnbr: ScotchNum,
        edgelocsiz: ScotchNum,
        edgeloctab: *mut ScotchNum,
        edgegsttab: *mut ScotchNum,
        edloloctab: *mut ScotchNum,
    ) -> c_int;
    pub fn SCOTCH_dgraphPart(
        graph: *mut Dgraph,
        parts: ScotchNum,
        strategy: *mut Strat,
        partloctab: *mut ScotchNum,
    ) -> c_int;

    pub fn SCOTCH_stratAlloc() -> *mut Strat;
    pub fn SCOTCH_stratInit(strategy: *mut Strat) -> c_int;
    pub fn SCOTCH_stratExit(strategy: *mut Strat);
    pub fn SCOTCH_stratDgraphMap(strategy: *mut Strat, string: *const c_char) -> c_int;
    pub fn SCOTCH_stratDgraphMapBuild(
        strategy: *mut Strat,
        flags: ScotchNum,
        procnbr: ScotchNum,
        partnbr: ScotchNum,
        kbalval: c_double,
    ) -> c_int;
}
