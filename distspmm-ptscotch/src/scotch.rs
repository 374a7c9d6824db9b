//! The PT-Scotch call itself, on input [`crate::check`] accepted: owned library objects that
//! free themselves, and one function that builds the distributed graph and partitions it.

use std::ffi::{c_int, CString};
use std::ptr::{self, NonNull};

use dist_comm::{Group, MpiComm};

use crate::ffi::{self, ScotchNum};
use crate::{DistGraph, Options, Strategy};

/// A PT-Scotch call that failed, in words (shared with every rank by the caller).
fn failed(call: &str, code: c_int) -> String {
    format!("{call} returned {code} (PT-Scotch printed why on this rank's standard error)")
}

/// An object from a `SCOTCH_*Alloc`, initialised; `exit` undoes the init, then the memory is
/// freed with `SCOTCH_memFree`.
struct Owned<T> {
    ptr: NonNull<T>,
    exit: Option<unsafe extern "C" fn(*mut T)>,
}

impl<T> Owned<T> {
    /// Allocates with `alloc` and initialises with `init` (code 0 = success).
    ///
    /// # Safety
    /// `alloc` returns a fresh object of the library (or null), `init` initialises it, `exit`
    /// (if any) releases what `init` and later calls acquired.
    unsafe fn new(
        what: &str,
        alloc: unsafe extern "C" fn() -> *mut T,
        init: impl FnOnce(*mut T) -> c_int,
        exit: Option<unsafe extern "C" fn(*mut T)>,
    ) -> Result<Self, String> {
        // SAFETY: the caller guarantees `alloc` is a SCOTCH_*Alloc function.
        let raw = unsafe { alloc() };
        let ptr = NonNull::new(raw).ok_or_else(|| format!("out of memory allocating {what}"))?;
        let code = init(ptr.as_ptr());
        if code != 0 {
            // SAFETY: allocated above by the library, not initialised: only freed.
            unsafe { ffi::SCOTCH_memFree(ptr.as_ptr().cast()) };
            return Err(failed(what, code));
        }
        Ok(Self { ptr, exit })
    }

    fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if let Some(exit) = self.exit {
            // SAFETY: initialised in `new` (the caller's contract names the matching exit).
            unsafe { exit(self.ptr.as_ptr()) };
        }
        // SAFETY: allocated by a SCOTCH_*Alloc, released above; freed once.
        unsafe { ffi::SCOTCH_memFree(self.ptr.as_ptr().cast()) };
    }
}

/// `values` as `SCOTCH_Num`s (checked to fit by `crate::check`), allocated fallibly.
fn to_num(what: &str, values: &[u64]) -> Result<Vec<ScotchNum>, String> {
    let mut out = Vec::new();
    out.try_reserve_exact(values.len())
        .map_err(|_| format!("out of memory copying {} {what}", values.len()))?;
    out.extend(
        values
            .iter()
            .map(|&v| ScotchNum::try_from(v).unwrap_or(ScotchNum::MAX)),
    );
    Ok(out)
}

/// Partitions the checked `graph` with `strategy` (already chosen: never [`Strategy::Auto`])
/// on this rank's side of the collective calls.
pub(crate) fn partition(
    comm: &MpiComm,
    graph: &DistGraph<'_>,
    options: &Options,
    strategy: Strategy,
) -> Result<Vec<u32>, String> {
    let owned = graph.xadj.len() - 1;
    // The arrays outlive every library object below (declared first, dropped last): the
    // distributed graph points into them.
    let mut vertices = to_num("offsets", graph.xadj)?;
    let mut arcs = to_num("arcs", graph.adjncy)?;
    let mut vertex_weights = graph
        .vertex_weights
        .map(|w| to_num("vertex weights", w))
        .transpose()?;
    let mut edge_weights = graph
        .edge_weights
        .map(|w| to_num("edge weights", w))
        .transpose()?;
    let mut parts: Vec<ScotchNum> = Vec::new();
    parts
        .try_reserve_exact(owned)
        .map_err(|_| format!("out of memory for the parts of {owned} vertices"))?;
    parts.resize(owned, -1);

    let as_num = |n: usize| ScotchNum::try_from(n).unwrap_or(ScotchNum::MAX);
    let threads = c_int::try_from(options.threads).unwrap_or(1);
    let seed = options.seed as ScotchNum;

    // SAFETY: SCOTCH_contextAlloc/Init/Exit are the matching triple. The global generator is
    // seeded, then cloned into the context, which PT-Scotch then seeds again: whatever PT-Scotch
    // draws from either generator follows the seed.
    let context = unsafe {
        Owned::new(
            "SCOTCH_contextInit",
            ffi::SCOTCH_contextAlloc,
            |c| ffi::SCOTCH_contextInit(c),
            Some(ffi::SCOTCH_contextExit),
        )
    }?;
    let c = context.as_ptr();
    // SAFETY: `c` is an initialised context that has not been committed (bound) yet, as
    // setting its options, random generator and threads requires.
    unsafe {
        ffi::SCOTCH_randomSeed(seed);
        let code = ffi::SCOTCH_contextRandomClone(c);
        if code != 0 {
            return Err(failed("SCOTCH_contextRandomClone", code));
        }
        ffi::SCOTCH_contextRandomSeed(c, seed);
        for option in [ffi::OPTION_DETERMINISTIC, ffi::OPTION_RANDOM_FIXED_SEED] {
            let code = ffi::SCOTCH_contextOptionSetNum(c, option, 1);
            if code != 0 {
                return Err(failed("SCOTCH_contextOptionSetNum", code));
            }
        }
        let code = ffi::SCOTCH_contextThreadSpawn(c, threads, ptr::null());
        if code != 0 {
            return Err(failed("SCOTCH_contextThreadSpawn", code));
        }
    }

    let raw_comm = comm.as_raw();
    // SAFETY: SCOTCH_dgraphAlloc/Init/Exit are the matching triple; `raw_comm` is the
    // communicator's valid duplicate, which outlives this call.
    let dgraph = unsafe {
        Owned::new(
            "SCOTCH_dgraphInit",
            ffi::SCOTCH_dgraphAlloc,
            |g| ffi::SCOTCH_dgraphInit(g, raw_comm),
            Some(ffi::SCOTCH_dgraphExit),
        )
    }?;
    let weights_ptr =
        |w: &mut Option<Vec<ScotchNum>>| w.as_mut().map_or(ptr::null_mut(), |w| w.as_mut_ptr());
    let vert = vertices.as_mut_ptr();
    // SAFETY: base 0; `vert` holds owned + 1 monotone offsets and `vert + 1` is the compact
    // end array PT-Scotch reads as `vendloctab`; `arcs` holds the arcs with global ids below
    // the vertex count; the weight arrays hold one entry per vertex / arc or are null; no
    // labels and no ghost array. All of them live until after `dgraph` is dropped.
    let code = unsafe {
        ffi::SCOTCH_dgraphBuild(
            dgraph.as_ptr(),
            0,
            as_num(owned),
            as_num(owned),
            vert,
            vert.add(1),
            weights_ptr(&mut vertex_weights),
            ptr::null_mut(),
            as_num(arcs.len()),
            as_num(arcs.len()),
            arcs.as_mut_ptr(),
            ptr::null_mut(),
            weights_ptr(&mut edge_weights),
        )
    };
    if code != 0 {
        return Err(failed("SCOTCH_dgraphBuild", code));
    }

    // The bound graph is a container (context and graph pointers) holding nothing of its own:
    // freed, never passed to SCOTCH_dgraphExit, and dropped before the graph and the context.
    // SAFETY: SCOTCH_dgraphAlloc gives a SCOTCH_Dgraph-sized block, which
    // SCOTCH_contextBindDgraph fills; `c` and `dgraph` outlive `bound`.
    let bound = unsafe {
        Owned::new(
            "SCOTCH_contextBindDgraph",
            ffi::SCOTCH_dgraphAlloc,
            |b| ffi::SCOTCH_contextBindDgraph(c, dgraph.as_ptr(), b),
            None,
        )
    }?;

    // SAFETY: SCOTCH_stratAlloc/Init/Exit are the matching triple.
    let strat = unsafe {
        Owned::new(
            "SCOTCH_stratInit",
            ffi::SCOTCH_stratAlloc,
            |s| ffi::SCOTCH_stratInit(s),
            Some(ffi::SCOTCH_stratExit),
        )
    }?;
    let tolerance = options.imbalance - 1.0;
    let code = match strategy.flags() {
        // SAFETY: an initialised strategy; plain values.
        Some(flags) => unsafe {
            ffi::SCOTCH_stratDgraphMapBuild(
                strat.as_ptr(),
                flags,
                as_num(comm.size()),
                as_num(options.parts),
                tolerance,
            )
        },
        None => {
            let text = CString::new(Strategy::skewed_string(tolerance))
                .map_err(|_| "the strategy string holds a NUL byte".to_string())?;
            // SAFETY: an initialised strategy and a NUL-terminated string that outlives the
            // call (PT-Scotch parses it into its own structures).
            unsafe { ffi::SCOTCH_stratDgraphMap(strat.as_ptr(), text.as_ptr()) }
        }
    };
    if code != 0 {
        return Err(failed("SCOTCH_stratDgraphMap(Build)", code));
    }

    // SAFETY: the bound graph over the built distributed graph, a parallel mapping strategy,
    // and `parts` with one entry per local vertex (collective over `raw_comm`: every rank
    // reaches this call, `crate::check` having agreed).
    let code = unsafe {
        ffi::SCOTCH_dgraphPart(
            bound.as_ptr(),
            as_num(options.parts),
            strat.as_ptr(),
            parts.as_mut_ptr(),
        )
    };
    drop((bound, strat, dgraph, context));
    if code != 0 {
        return Err(failed("SCOTCH_dgraphPart", code));
    }
    drop((vertices, arcs, vertex_weights, edge_weights));

    let k = options.parts;
    let mut out = Vec::new();
    out.try_reserve_exact(owned)
        .map_err(|_| format!("out of memory for the parts of {owned} vertices"))?;
    for (i, &p) in parts.iter().enumerate() {
        match u32::try_from(p) {
            Ok(p) if (p as usize) < k => out.push(p),
            _ => {
                return Err(format!(
                    "SCOTCH_dgraphPart put vertex {} in part {p}, outside 0..{k}",
                    graph.vtxdist[comm.rank()] + i as u64
                ))
            }
        }
    }
    Ok(out)
}
