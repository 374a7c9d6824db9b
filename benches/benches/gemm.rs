//! The GCN's dense products on the RMAT-18 training shapes through three GEMMs, to choose the
//! trainer's: the trainer's own routines (`distspmm_gcn::par::gemm_rows` / `gemm_tn_sum`: row
//! blocks over the rayon pool, one single-threaded `matrixmultiply` sgemm per block), one
//! `matrixmultiply` call over all rows with its `threading` feature (its own threads, as many as
//! `MATMUL_NUM_THREADS`), and one call of the `gemm` crate with `Parallelism::Rayon`.
//!
//! One process times one GEMM at one thread count; `benches/scripts/gemm-peers.sh` runs them
//! side by side in interleaved rounds (and at 1 thread, to check that each result is
//! bit-identical whatever the thread count). Prints one JSON line per product: the median and
//! minimum of `--reps` calls after one untimed call, GFLOP/s (`2·n·k·m` flops) and an FNV-1a
//! hash of the result's bits.
//!
//! ```text
//! MATMUL_NUM_THREADS=2 cargo bench -p distspmm-benches --features gemm-peers --bench gemm -- \
//!     --gemm ours|matrixmultiply-threaded|gemm --threads 2 [--rows 262144] [--reps 7]
//! ```

use distspmm_gcn::dense::Op;
use distspmm_gcn::par::{self, Product};
use std::time::Instant;

/// The products of one RMAT-18 training epoch (64 features, hidden 64, 8 classes), as
/// `distspmm train --isolated-kernels` lists them.
fn products(n: usize) -> [Product; 5] {
    [
        Product::Rows {
            n,
            k: 64,
            m: 64,
            op_w: Op::N,
        },
        Product::Rows {
            n,
            k: 64,
            m: 8,
            op_w: Op::N,
        },
        Product::TnSum { n, k: 64, m: 8 },
        Product::Rows {
            n,
            k: 8,
            m: 64,
            op_w: Op::T,
        },
        Product::TnSum { n, k: 64, m: 64 },
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Ours,
    MatrixmultiplyThreaded,
    GemmCrate,
}

fn operand(len: usize, salt: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let h = (i as u32 ^ salt).wrapping_mul(0x9E37_79B1).rotate_left(13);
            (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn fnv(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `C (m × n) = op(A) · op(B)`, all row-major, strides given as (row, column) of the logical
/// operands, through `matrixmultiply` in one call.
#[allow(clippy::too_many_arguments)]
fn mm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: (isize, isize),
    b: &[f32],
    sb: (isize, isize),
    c: &mut [f32],
) {
    assert!(c.len() >= m * n && a.len() >= m * k && b.len() >= k * n);
    // SAFETY: the callers pass operands of exactly the logical shapes with these strides
    // (their lengths checked above), and `c` is an exclusive borrow of m·n values.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            sa.0,
            sa.1,
            b.as_ptr(),
            sb.0,
            sb.1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// The same through the `gemm` crate (column stride first in its signature).
#[allow(clippy::too_many_arguments)]
fn gc(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: (isize, isize),
    b: &[f32],
    sb: (isize, isize),
    c: &mut [f32],
    threads: usize,
) {
    assert!(c.len() >= m * n && a.len() >= m * k && b.len() >= k * n);
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: as in `mm`; `read_dst = false`, so `c`'s old contents are never read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            sa.1,
            sa.0,
            b.as_ptr(),
            sb.1,
            sb.0,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

fn run(
    which: Peer,
    p: Product,
    threads: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    partials: &mut Vec<f32>,
) {
    match (which, p) {
        (Peer::Ours, Product::Rows { n, k, m, op_w }) => {
            par::gemm_rows(a, n, k, b, op_w, m, c, &mut [], 0, |_, _, _| {});
        }
        (Peer::Ours, Product::TnSum { n, k, m }) => par::gemm_tn_sum(a, k, b, m, n, c, partials),
        (_, Product::Rows { n, k, m, op_w }) => {
            // C (n × m) = A (n × k) · op(W); W stored k × m (N) or m × k (T).
            let sw = match op_w {
                Op::N => (m as isize, 1),
                Op::T => (1, k as isize),
            };
            if which == Peer::GemmCrate {
                gc(n, k, m, a, (k as isize, 1), b, sw, c, threads);
            } else {
                mm(n, k, m, a, (k as isize, 1), b, sw, c);
            }
        }
        (_, Product::TnSum { n, k, m }) => {
            // G (k × m) = Aᵀ (k × n) · B (n × m).
            if which == Peer::GemmCrate {
                gc(k, n, m, a, (1, k as isize), b, (m as isize, 1), c, threads);
            } else {
                mm(k, n, m, a, (1, k as isize), b, (m as isize, 1), c);
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let which = match opt("--gemm").as_deref() {
        Some("ours") => Peer::Ours,
        Some("matrixmultiply-threaded") => Peer::MatrixmultiplyThreaded,
        Some("gemm") => Peer::GemmCrate,
        other => panic!("--gemm ours|matrixmultiply-threaded|gemm, got {other:?}"),
    };
    let threads: usize = opt("--threads").map_or(2, |v| v.parse().expect("--threads N"));
    let n: usize = opt("--rows").map_or(1 << 18, |v| v.parse().expect("--rows N"));
    let reps: usize = opt("--reps").map_or(7, |v| v.parse().expect("--reps N"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool");
    let name = match which {
        Peer::Ours => "ours",
        Peer::MatrixmultiplyThreaded => "matrixmultiply-threaded",
        Peer::GemmCrate => "gemm",
    };
    for p in products(n) {
        let (a_len, b_len, c_len) = match p {
            Product::Rows { n, k, m, .. } => (n * k, k * m, n * m),
            Product::TnSum { n, k, m } => (n * k, n * m, k * m),
        };
        let (a, b) = (operand(a_len, 2), operand(b_len, 3));
        let mut c = vec![0.0f32; c_len];
        let mut partials = vec![0.0f32; par::blocks(n) * 64 * 64];
        let mut times = Vec::with_capacity(reps);
        pool.install(|| {
            run(which, p, threads, &a, &b, &mut c, &mut partials);
            for _ in 0..reps {
                let t = Instant::now();
                run(which, p, threads, &a, &b, &mut c, &mut partials);
                times.push(t.elapsed().as_secs_f64());
            }
        });
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{}",
            serde_json::json!({
                "gemm": name,
                "threads": threads,
                "product": p.to_string(),
                "seconds": median,
                "min_seconds": times[0],
                "gflops": p.flops() / median / 1e9,
                "hash": format!("{:016x}", fnv(&c)),
                "reps": reps,
            })
        );
    }
}
