//! Drives the C ABI of `libdistspmm` the way a C host would: through bindings generated from
//! the committed `include/distspmm.h` (see `build.rs`), with sequences of calls chosen by the
//! fuzzer — opening valid, missing and corrupted chunk directories, every query with and
//! without NULL outputs, creating operators with any schedule value, forward and backward with
//! any shape and leading dimension, collectives with NULL and sized buffers, extra
//! communicators from `dsp_init` and from arbitrary Fortran handles, frees in any order.
//!
//! Buffers are sized exactly as the header's contract says (so AddressSanitizer catches any
//! read or write outside them), and the header's promises are checked: a failing call returns
//! a known status, sets `*out` to NULL and leaves a message in `dsp_last_error()`; a successful
//! product returned `rows x cols` finite values (from finite inputs) and left the padding
//! between `cols` and the leading dimension untouched; the zero-copy arrays hold what the sizes
//! say. MPI runs as a singleton (one rank), initialised once per process.
#![no_main]

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

// Link the library whose `#[no_mangle]` symbols the generated declarations name.
use distspmm as _;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    clippy::all,
    missing_docs
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/distspmm_sys.rs"));
}
use sys::*;

/// Largest status code the header defines.
const MAX_STATUS: dsp_status = DSP_STATUS_DEVICE;
/// Padding value written between `cols` and the leading dimension: it must survive a call.
const PAD: f32 = -7.25;

/// What the process sets up once: MPI, a communicator kept for its lifetime, a valid chunk
/// directory (P = 1) and the bytes of its files, and a scratch directory for mutated copies.
struct Setup {
    comm: *mut dsp_comm,
    valid: PathBuf,
    files: Vec<(String, Vec<u8>)>,
    scratch: PathBuf,
}

// SAFETY: libFuzzer calls the target from one thread only; the handle is only used there.
unsafe impl Send for Setup {}
// SAFETY: as above.
unsafe impl Sync for Setup {}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let root = scratch_root();
        // SAFETY: `remove_scratch` is an `extern "C" fn()` that never unwinds.
        unsafe { atexit(remove_scratch) };
        let valid = root.join("valid");
        write_fixture(&valid);
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&valid)
            .expect("fixture directory")
            .map(|e| {
                let e = e.expect("fixture entry");
                let name = e.file_name().into_string().expect("ASCII name");
                (name, std::fs::read(e.path()).expect("fixture file"))
            })
            .collect();
        files.sort();
        // Keep OpenMPI's components loaded, so LeakSanitizer can name (and the suppressions
        // below match) what they keep allocated until exit.
        std::env::set_var("OMPI_MCA_mca_base_component_disable_dlclose", "1");
        let mut comm = ptr::null_mut();
        // SAFETY: `comm` is valid for a write.
        let status = unsafe { dsp_init(&mut comm) };
        assert_eq!(status, DSP_STATUS_OK, "dsp_init: {}", last_error());
        Setup {
            comm,
            valid,
            files,
            scratch: root.join("scratch"),
        }
    })
}

extern "C" {
    /// The C library's `atexit`: libFuzzer ends the process with `exit`, never returning.
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// This process's scratch directory (the fixture and the mutated copies).
fn scratch_root() -> PathBuf {
    std::env::temp_dir().join(format!("distspmm-capi-fuzz-{}", std::process::id()))
}

extern "C" fn remove_scratch() {
    let _ = std::fs::remove_dir_all(scratch_root());
}

/// A small featured graph (60 nodes) in one part, written as `distspmm partition` does
/// (`distspmm_prep::prep::run_graph`).
fn write_fixture(dir: &Path) {
    use distspmm_prep::graph::generate::{csbm, CsbmParams};
    use distspmm_prep::partition::Method;
    use distspmm_prep::prep::{run_graph, Build, PrepConfig};
    let graph = csbm(&CsbmParams {
        nodes: 60,
        classes: 3,
        features: 5,
        avg_degree: 4.0,
        seed: 9,
        ..Default::default()
    })
    .expect("csbm");
    let config = PrepConfig {
        method: Method::Contiguous,
        build: Build::InMemory,
        force: true,
        ..PrepConfig::new("the fixture graph", 1, dir)
    };
    run_graph(&config, graph, &|_| {}).expect("write chunks");
}

fn last_error() -> String {
    // SAFETY: `dsp_last_error` returns a valid NUL-terminated string (possibly empty).
    unsafe { CStr::from_ptr(dsp_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The header's promises about a status: a known code, and a message when it failed.
fn check_status(what: &str, status: dsp_status) -> bool {
    assert!(
        (0..=MAX_STATUS).contains(&status),
        "{what} returned {status}, not a dsp_status"
    );
    if status != DSP_STATUS_OK {
        assert!(
            !last_error().is_empty(),
            "{what} failed ({status}) without a message"
        );
    }
    status == DSP_STATUS_OK
}

#[derive(Arbitrary, Debug)]
enum Dir {
    Valid,
    Null,
    Missing,
    Empty,
    /// A regular file instead of a directory.
    File,
    /// A copy of the valid directory with one file edited.
    Mutated {
        file: u8,
        edits: Vec<(u16, u8)>,
        truncate: Option<u16>,
        remove: bool,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Open {
        dir: Dir,
        null_out: bool,
        null_comm: bool,
    },
    Query {
        chunk: u8,
        which: u8,
        null_out: bool,
    },
    Arrays {
        chunk: u8,
        which: u8,
        null_data: bool,
        null_len: bool,
    },
    Create {
        chunk: u8,
        schedule: i32,
        null_out: bool,
        null_comm: bool,
    },
    Apply {
        op: u8,
        backward: bool,
        /// `None`: the chunk's own row count.
        rows: Option<u8>,
        cols: u8,
        x_pad: u8,
        y_pad: u8,
        /// Make the leading dimensions smaller than `cols` (must be refused).
        short_ld: bool,
        null_x: bool,
        null_y: bool,
        nan: bool,
    },
    Bytes {
        op: u8,
        null_sent: bool,
        null_received: bool,
    },
    FreeChunk(u8),
    FreeSpmm(u8),
    AllReduce {
        double: bool,
        count: u8,
        null_buf: bool,
    },
    Barrier,
    RankSize {
        null_out: bool,
    },
    StatusStr(i32),
    /// A second communicator: `dsp_init` adopts the running MPI; or a Fortran handle.
    Init {
        fortran: Option<i32>,
        null_out: bool,
    },
    Finalize(u8),
    NullHandles,
    /// The device-pointer entry points; in a build without CUDA each must refuse with
    /// `DSP_STATUS_UNSUPPORTED` whatever the arguments (and leave `*out` NULL).
    Device {
        chunk: u8,
        schedule: i32,
        ordinal: i32,
        which: u8,
        rows: u8,
        cols: u8,
        null_out: bool,
    },
}

/// Handles alive in one input; all are freed at its end.
#[derive(Default)]
struct State {
    comms: Vec<*mut dsp_comm>,
    chunks: Vec<(*mut dsp_chunk, usize)>,
    ops: Vec<(*mut dsp_spmm, usize)>,
}

fn pick<T: Copy>(v: &[T], i: u8) -> Option<T> {
    (!v.is_empty()).then(|| v[usize::from(i) % v.len()])
}

fn path_of(s: &Setup, dir: &Dir) -> Option<CString> {
    let path = match dir {
        Dir::Null => return None,
        Dir::Valid => s.valid.clone(),
        Dir::Missing => s.scratch.join("does-not-exist"),
        Dir::Empty => {
            let p = s.scratch.join("empty");
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            p
        }
        Dir::File => s.valid.join(&s.files[0].0),
        Dir::Mutated {
            file,
            edits,
            truncate,
            remove,
        } => {
            let p = s.scratch.join("mutated");
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            let target = usize::from(*file) % s.files.len();
            for (i, (name, bytes)) in s.files.iter().enumerate() {
                if i == target && *remove {
                    continue;
                }
                let mut bytes = bytes.clone();
                if i == target {
                    for &(at, b) in edits.iter().take(16) {
                        if !bytes.is_empty() {
                            let at = usize::from(at) % bytes.len();
                            bytes[at] ^= b;
                        }
                    }
                    if let Some(t) = truncate {
                        let len = usize::from(*t) % (bytes.len() + 1);
                        bytes.truncate(len);
                    }
                }
                std::fs::write(p.join(name), bytes).unwrap();
            }
            p
        }
    };
    Some(CString::new(path.into_os_string().into_encoded_bytes()).unwrap())
}

/// Checks a zero-copy array: present means `len` readable elements (ASan checks the reads).
fn touch<T: Copy + Into<f64>>(data: *const T, len: usize, expected: usize) -> f64 {
    assert!(!data.is_null() || len == 0, "non-empty array at NULL");
    assert_eq!(len, expected, "array length");
    if len == 0 {
        return 0.0;
    }
    // SAFETY: the library promises `len` elements at `data`, alive as long as the chunk.
    let s = unsafe { std::slice::from_raw_parts(data, len) };
    s.iter().map(|&v| v.into()).sum()
}

fn run(s: &Setup, st: &mut State, op: Op) {
    let comm = s.comm;
    match op {
        Op::Open {
            dir,
            null_out,
            null_comm,
        } => {
            let path = path_of(s, &dir);
            let mut out: *mut dsp_chunk = 8 as *mut dsp_chunk;
            let out_ptr = if null_out {
                ptr::null_mut()
            } else {
                &mut out as *mut _
            };
            let c = if null_comm { ptr::null_mut() } else { comm };
            let p = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
            // SAFETY: every pointer is NULL or valid for its use.
            let status = unsafe { dsp_chunk_open(c, p, out_ptr) };
            let ok = check_status("dsp_chunk_open", status);
            if null_out {
                assert!(!ok, "dsp_chunk_open succeeded without an output");
                return;
            }
            if !ok {
                assert!(out.is_null(), "failed dsp_chunk_open left *out set");
                return;
            }
            assert!(
                matches!(dir, Dir::Valid | Dir::Mutated { .. }),
                "opened {dir:?}"
            );
            let mut n = 0usize;
            // SAFETY: `out` is a live chunk; `n` is valid for a write.
            let q = unsafe { dsp_chunk_num_local_nodes(out, &mut n) };
            assert!(check_status("dsp_chunk_num_local_nodes", q));
            st.chunks.push((out, n));
        }
        Op::Query {
            chunk,
            which,
            null_out,
        } => {
            let ch = pick(&st.chunks, chunk).map_or(ptr::null(), |c| c.0.cast_const());
            let (mut a, mut b, mut c) = (0u32, 0usize, 0u64);
            // SAFETY: `ch` is NULL or live; outputs are NULL or valid.
            let status = unsafe {
                let (pa, pb, pc) = if null_out {
                    (ptr::null_mut(), ptr::null_mut(), ptr::null_mut())
                } else {
                    (&mut a as *mut u32, &mut b as *mut usize, &mut c as *mut u64)
                };
                match which % 8 {
                    0 => dsp_chunk_part(ch, pa),
                    1 => dsp_chunk_num_parts(ch, pa),
                    2 => dsp_chunk_num_local_nodes(ch, pb),
                    3 => dsp_chunk_num_halo_rows(ch, pb),
                    4 => dsp_chunk_num_global_nodes(ch, pc),
                    5 => dsp_chunk_global_offset(ch, pc),
                    6 => dsp_chunk_num_features(ch, pb),
                    _ => dsp_chunk_num_classes(ch, pb),
                }
            };
            let ok = check_status("a dsp_chunk query", status);
            assert_eq!(ok, !ch.is_null() && !null_out);
        }
        Op::Arrays {
            chunk,
            which,
            null_data,
            null_len,
        } => {
            let picked = pick(&st.chunks, chunk);
            let ch = picked.map_or(ptr::null(), |c| c.0.cast_const());
            let n = picked.map_or(0, |c| c.1);
            let mut f = 0usize;
            if !ch.is_null() {
                // SAFETY: live chunk, valid output.
                assert!(check_status("dsp_chunk_num_features", unsafe {
                    dsp_chunk_num_features(ch, &mut f)
                }));
            }
            let mut len = 0usize;
            let len_ptr = if null_len {
                ptr::null_mut()
            } else {
                &mut len as *mut usize
            };
            macro_rules! array {
                ($func:ident, $t:ty, $expected:expr) => {{
                    let mut data: *const $t = ptr::null();
                    let data_ptr = if null_data {
                        ptr::null_mut()
                    } else {
                        &mut data as *mut _
                    };
                    // SAFETY: `ch` is NULL or live; outputs are NULL or valid.
                    let status = unsafe { $func(ch, data_ptr, len_ptr) };
                    let ok = check_status(stringify!($func), status);
                    // A chunk without this array reports DSP_STATUS_NOT_PRESENT.
                    if ok {
                        assert!(!ch.is_null() && !null_data && !null_len);
                        touch(data, len, $expected);
                    }
                }};
            }
            match which % 4 {
                0 => array!(dsp_chunk_features, f32, n * f),
                1 => array!(dsp_chunk_labels, i32, n),
                2 => array!(dsp_chunk_masks, u8, n),
                _ => {
                    let mut data: *const u64 = ptr::null();
                    let data_ptr = if null_data {
                        ptr::null_mut()
                    } else {
                        &mut data as *mut _
                    };
                    // SAFETY: as above.
                    let status = unsafe { dsp_chunk_original_ids(ch, data_ptr, len_ptr) };
                    if check_status("dsp_chunk_original_ids", status) {
                        assert_eq!(len, n);
                        // SAFETY: `len` ids at `data`.
                        let ids = unsafe { std::slice::from_raw_parts(data, len) };
                        assert!(ids.iter().all(|&i| i < 60), "original id out of range");
                    }
                }
            }
        }
        Op::Create {
            chunk,
            schedule,
            null_out,
            null_comm,
        } => {
            let picked = pick(&st.chunks, chunk);
            let ch = picked.map_or(ptr::null(), |c| c.0.cast_const());
            let mut out: *mut dsp_spmm = 8 as *mut dsp_spmm;
            let out_ptr = if null_out {
                ptr::null_mut()
            } else {
                &mut out as *mut _
            };
            let c = if null_comm { ptr::null_mut() } else { comm };
            // SAFETY: every pointer is NULL or live/valid.
            let status = unsafe { dsp_spmm_create(c, ch, schedule, out_ptr) };
            let ok = check_status("dsp_spmm_create", status);
            let valid_schedule =
                schedule == DSP_SCHEDULE_HALO || schedule == DSP_SCHEDULE_BROADCAST;
            assert_eq!(
                ok,
                !ch.is_null() && !null_out && !null_comm && valid_schedule,
                "dsp_spmm_create with schedule {schedule}: {}",
                last_error()
            );
            if !null_out && !ok {
                assert!(out.is_null(), "failed dsp_spmm_create left *out set");
            }
            if ok {
                st.ops.push((out, picked.map_or(0, |c| c.1)));
            }
        }
        Op::Apply {
            op,
            backward,
            rows,
            cols,
            x_pad,
            y_pad,
            short_ld,
            null_x,
            null_y,
            nan,
        } => {
            let picked = pick(&st.ops, op);
            let handle = picked.map_or(ptr::null_mut(), |o| o.0);
            let n = picked.map_or(0, |o| o.1);
            let rows = rows.map_or(n, usize::from);
            let cols = usize::from(cols % 40);
            let (ldx, ldy) = if short_ld {
                (
                    cols.saturating_sub(1),
                    cols.saturating_sub(1 + usize::from(y_pad % 2)),
                )
            } else {
                (cols + usize::from(x_pad % 5), cols + usize::from(y_pad % 5))
            };
            // Exactly the extent the header asks for; a generous one when the leading
            // dimension is too short (the call must refuse it, not read past `cols`).
            let extent = |ld: usize| {
                if rows == 0 {
                    0
                } else if ld >= cols {
                    (rows - 1) * ld + cols
                } else {
                    rows * cols
                }
            };
            let mut x: Vec<f32> = (0..extent(ldx))
                .map(|i| (i % 13) as f32 * 0.25 - 1.0)
                .collect();
            if nan && !x.is_empty() {
                x[0] = f32::NAN;
            }
            let mut y = vec![PAD; extent(ldy)];
            let xp = if null_x { ptr::null() } else { x.as_ptr() };
            let yp = if null_y {
                ptr::null_mut()
            } else {
                y.as_mut_ptr()
            };
            // SAFETY: `handle` is NULL or live; the buffers hold the extents above.
            let status = unsafe {
                if backward {
                    dsp_spmm_backward(handle, rows, cols, xp, ldx, yp, ldy)
                } else {
                    dsp_spmm_forward(handle, rows, cols, xp, ldx, yp, ldy)
                }
            };
            let ok = check_status("dsp_spmm_forward/backward", status);
            if !ok {
                return;
            }
            assert!(!handle.is_null() && rows == n && ldx >= cols && ldy >= cols);
            assert!(cols == 0 || (!null_x && !null_y) || rows == 0);
            for (i, v) in y.iter().enumerate() {
                let (r, c) = (i / ldy.max(1), i % ldy.max(1));
                if c >= cols {
                    assert_eq!(v.to_bits(), PAD.to_bits(), "padding ({r}, {c}) overwritten");
                } else if !nan {
                    assert!(v.is_finite(), "({r}, {c}) = {v} from finite inputs");
                }
            }
        }
        Op::Bytes {
            op,
            null_sent,
            null_received,
        } => {
            let handle = pick(&st.ops, op).map_or(ptr::null(), |o| o.0.cast_const());
            let (mut a, mut b) = (0u64, 0u64);
            let pa = if null_sent {
                ptr::null_mut()
            } else {
                &mut a as *mut u64
            };
            let pb = if null_received {
                ptr::null_mut()
            } else {
                &mut b as *mut u64
            };
            // SAFETY: NULL or live/valid pointers.
            let status = unsafe { dsp_spmm_bytes_last_call(handle, pa, pb) };
            check_status("dsp_spmm_bytes_last_call", status);
        }
        Op::FreeChunk(i) => {
            if !st.chunks.is_empty() {
                let (c, _) = st.chunks.remove(usize::from(i) % st.chunks.len());
                // SAFETY: a live handle, removed from the state so it is never used again.
                unsafe { dsp_chunk_free(c) };
            }
        }
        Op::FreeSpmm(i) => {
            if !st.ops.is_empty() {
                let (o, _) = st.ops.remove(usize::from(i) % st.ops.len());
                // SAFETY: as above.
                unsafe { dsp_spmm_free(o) };
            }
        }
        Op::AllReduce {
            double,
            count,
            null_buf,
        } => {
            let count = usize::from(count);
            // SAFETY: the buffers hold `count` elements (or are NULL).
            let status = unsafe {
                if double {
                    let mut b: Vec<f64> = (0..count).map(|i| i as f64).collect();
                    let p = if null_buf {
                        ptr::null_mut()
                    } else {
                        b.as_mut_ptr()
                    };
                    let st = dsp_allreduce_sum_f64(comm, p, count);
                    if st == DSP_STATUS_OK && !null_buf {
                        assert!(b.iter().enumerate().all(|(i, &v)| v == i as f64));
                    }
                    st
                } else {
                    let mut b: Vec<f32> = (0..count).map(|i| i as f32).collect();
                    let p = if null_buf {
                        ptr::null_mut()
                    } else {
                        b.as_mut_ptr()
                    };
                    let st = dsp_allreduce_sum_f32(comm, p, count);
                    if st == DSP_STATUS_OK && !null_buf {
                        assert!(b.iter().enumerate().all(|(i, &v)| v == i as f32));
                    }
                    st
                }
            };
            let ok = check_status("dsp_allreduce_sum", status);
            assert_eq!(ok, !null_buf || count == 0, "{}", last_error());
        }
        Op::Barrier => {
            // SAFETY: a live communicator.
            assert!(check_status("dsp_barrier", unsafe { dsp_barrier(comm) }));
        }
        Op::RankSize { null_out } => {
            let mut v = 7u32;
            let p = if null_out {
                ptr::null_mut()
            } else {
                &mut v as *mut u32
            };
            // SAFETY: live communicator; NULL or valid output.
            let (a, b) = unsafe { (dsp_comm_rank(comm, p), dsp_comm_size(comm, p)) };
            assert_eq!(check_status("dsp_comm_rank", a), !null_out);
            assert_eq!(check_status("dsp_comm_size", b), !null_out);
            if !null_out {
                assert_eq!(v, 1, "singleton MPI has one rank");
            }
        }
        Op::StatusStr(code) => {
            // SAFETY: never NULL, a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(dsp_status_str(code)) };
            assert!(!s.to_bytes().is_empty());
        }
        Op::Init { fortran, null_out } => {
            let mut out: *mut dsp_comm = 8 as *mut dsp_comm;
            let p = if null_out {
                ptr::null_mut()
            } else {
                &mut out as *mut _
            };
            // SAFETY: NULL or valid output.
            let status = unsafe {
                match fortran {
                    Some(h) => dsp_init_fortran(h, p),
                    None => dsp_init(p),
                }
            };
            let ok = check_status("dsp_init", status);
            if null_out {
                assert!(!ok);
            } else if ok {
                st.comms.push(out);
            } else {
                assert!(out.is_null());
            }
        }
        Op::Finalize(i) => {
            if !st.comms.is_empty() {
                let c = st.comms.remove(usize::from(i) % st.comms.len());
                // SAFETY: a live extra communicator, never used again.
                let status = unsafe { dsp_finalize(c) };
                assert!(check_status("dsp_finalize", status), "{}", last_error());
            }
        }
        Op::Device {
            chunk,
            schedule,
            ordinal,
            which,
            rows,
            cols,
            null_out,
        } => {
            // SAFETY: a call without side effects.
            if unsafe { dsp_built_with_cuda() } != 0 {
                return; // a CUDA build needs a GPU for these; this driver runs without one
            }
            let ch = pick(&st.chunks, chunk).map_or(ptr::null(), |c| c.0.cast_const());
            let mut out: *mut dsp_spmm_device = 8 as *mut dsp_spmm_device;
            let out_ptr = if null_out {
                ptr::null_mut()
            } else {
                &mut out as *mut _
            };
            let (mut sent, mut received) = (0u64, 0u64);
            let x = [0f32; 4];
            let mut y = [0f32; 4];
            // SAFETY: every pointer is NULL, live or valid; the non-CUDA build reads none.
            let status = unsafe {
                match which % 5 {
                    0 => {
                        let st = dsp_spmm_create_device(s.comm, ch, schedule, ordinal, out_ptr);
                        if !null_out {
                            assert!(
                                out.is_null(),
                                "refused dsp_spmm_create_device left *out set"
                            );
                        }
                        st
                    }
                    which @ (1 | 2) => {
                        let product = if which == 1 {
                            dsp_spmm_device_forward
                        } else {
                            dsp_spmm_device_backward
                        };
                        product(
                            ptr::null_mut(),
                            usize::from(rows),
                            usize::from(cols),
                            x.as_ptr(),
                            4,
                            y.as_mut_ptr(),
                            4,
                            ptr::null_mut(),
                        )
                    }
                    3 => dsp_spmm_device_bytes_last_call(ptr::null(), &mut sent, &mut received),
                    _ => {
                        dsp_spmm_device_free(ptr::null_mut());
                        DSP_STATUS_UNSUPPORTED
                    }
                }
            };
            assert!(!check_status("a dsp_spmm_device call", status));
            assert_eq!(status, DSP_STATUS_UNSUPPORTED, "{}", last_error());
        }
        Op::NullHandles => {
            // SAFETY: NULL is accepted by every free function.
            unsafe {
                dsp_chunk_free(ptr::null_mut());
                dsp_spmm_free(ptr::null_mut());
                assert!(check_status(
                    "dsp_finalize(NULL)",
                    dsp_finalize(ptr::null_mut())
                ));
                assert!(!check_status(
                    "dsp_barrier(NULL)",
                    dsp_barrier(ptr::null_mut())
                ));
            }
        }
    }
}

/// Runs every kind of call once on valid arguments before the first input, so that what MPI
/// allocates lazily (and keeps until the process ends) is not counted as a leak of an input.
fn warm_up() {
    let s = setup();
    let mut st = State::default();
    let ops = [
        Op::Open {
            dir: Dir::Valid,
            null_out: false,
            null_comm: false,
        },
        Op::Barrier,
        Op::AllReduce {
            double: false,
            count: 4,
            null_buf: false,
        },
        Op::AllReduce {
            double: true,
            count: 4,
            null_buf: false,
        },
    ];
    for op in ops {
        run(s, &mut st, op);
    }
    for schedule in [DSP_SCHEDULE_HALO, DSP_SCHEDULE_BROADCAST] {
        run(
            s,
            &mut st,
            Op::Create {
                chunk: 0,
                schedule,
                null_out: false,
                null_comm: false,
            },
        );
    }
    for (op, backward) in [(0, false), (0, true), (1, false), (1, true)] {
        run(
            s,
            &mut st,
            Op::Apply {
                op,
                backward,
                rows: None,
                cols: 8,
                x_pad: 0,
                y_pad: 0,
                short_ld: false,
                null_x: false,
                null_y: false,
                nan: false,
            },
        );
    }
    for fortran in [None, Some(0), Some(1)] {
        run(
            s,
            &mut st,
            Op::Init {
                fortran,
                null_out: false,
            },
        );
    }
    finish(st);
}

/// Frees what is left: chunks before the operators made from them (an operator keeps its
/// chunk and communicator alive), then the extra communicators.
fn finish(mut st: State) {
    // SAFETY: every handle in the state is live and never used again.
    unsafe {
        for (c, _) in st.chunks.drain(..) {
            dsp_chunk_free(c);
        }
        for (o, _) in st.ops.drain(..) {
            dsp_spmm_free(o);
        }
        for c in st.comms.drain(..) {
            assert!(check_status("dsp_finalize", dsp_finalize(c)));
        }
    }
}

/// OpenMPI, PMIx and hwloc keep allocations made during `MPI_Init` and communicator creation
/// until the process exits (MPI is never finalised here); LeakSanitizer would report them as
/// leaks of whichever input ran first. What this project allocates itself is still checked; an MPI object it forgot to
/// free would be hidden (allocated inside libmpi), so this is no check of MPI handle hygiene.
#[no_mangle]
pub extern "C" fn __lsan_default_suppressions() -> *const std::ffi::c_char {
    concat!(
        "leak:libopen-pal.so\n",
        "leak:libopen-rte.so\n",
        "leak:libmpi.so\n",
        "leak:libpmix.so\n",
        "leak:libhwloc.so\n",
        "leak:mca_\n",
        "\0"
    )
    .as_ptr()
    .cast()
}

/// The per-input leak check (libFuzzer's `-detect_leaks`) stays on; the check at exit is off,
/// because at exit the never-finalised MPI's remaining allocations (some in components that
/// were unloaded, so no suppression can name them) are all that is left to report.
#[no_mangle]
pub extern "C" fn __asan_default_options() -> *const std::ffi::c_char {
    c"leak_check_at_exit=0".as_ptr()
}

fuzz_target!(init: warm_up(), |ops: Vec<Op>| {
    let s = setup();
    let mut st = State::default();
    for op in ops.into_iter().take(24) {
        run(s, &mut st, op);
    }
    finish(st);
});
