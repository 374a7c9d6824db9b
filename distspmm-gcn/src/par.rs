//! Multi-threaded building blocks of an epoch, on the current rayon pool (the SpMM's): dense
//! products split into row blocks, each block's epilogue (bias, ReLU, dropout) run while the
//! block is still in cache, and reductions over rows (weight and bias gradients, metric counts)
//! that are deterministic: rows are cut into blocks of [`reduce_rows`] whatever the thread
//! count, each block's partial result is computed on its own, and the partials are added in
//! block order. Results are therefore bit-identical for any number of threads.
//!
//! The products go through `matrixmultiply`'s packed, SIMD-dispatched sgemm, one
//! single-threaded call per row block: the blocks spread over the rayon pool the SpMM uses (so
//! the two never compete for cores), and a block's output is still in cache for its epilogue.
//!
//! The row-wise stages are cut into [`task_rows`] rows per task, a function of the thread count
//! (about eight tasks per thread, so that a small graph such as Cora still balances its two
//! cores): that is safe because each output row of those stages depends on its own input row
//! only, and `matrixmultiply` computes an element of a product the same way (the same sum over
//! k, in the same order) whichever rows share its call. The reductions over rows keep their
//! blocks of [`reduce_rows`], which depend on `n` alone.

use super::dense::{
    gemm, gemm_tn_acc, narrow_applies, narrow_rows, narrow_tn_acc, skinny_applies, skinny_rows,
    skinny_tn, skinny_tn_applies, Op, Shape,
};
use rayon::prelude::*;
use std::cell::RefCell;

/// A dense product as the trainer called it: the shapes of one [`gemm_rows`] or
/// [`gemm_tn_sum`] call, logged by [`start_recording`] and replayed in isolation by
/// [`crate::isolated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Product {
    /// [`gemm_rows`]: `C (n × m) = A (n × k) · op(W)`, `W` stored `k × m` (`Op::N`) or
    /// `m × k` (`Op::T`).
    Rows {
        /// Rows of `A` and `C`.
        n: usize,
        /// Columns of `A`.
        k: usize,
        /// Columns of `C`.
        m: usize,
        /// How `W` is read.
        op_w: Op,
    },
    /// [`gemm_tn_sum`]: `G (k × m) = Aᵀ · B` for `A (n × k)` and `B (n × m)`.
    TnSum {
        /// Rows of `A` and `B` (the summed dimension).
        n: usize,
        /// Columns of `A`.
        k: usize,
        /// Columns of `B`.
        m: usize,
    },
    /// [`crate::sparse_input::SparseInput::product`]: `C (n × m) = X (n × k, nnz stored) · W`.
    SparseRows {
        /// Rows of `X` and `C`.
        n: usize,
        /// Columns of `X`.
        k: usize,
        /// Columns of `C`.
        m: usize,
        /// Stored entries of `X`.
        nnz: usize,
    },
    /// [`crate::sparse_input::SparseInput::tn_sum`]: `G (k × m) = Xᵀ · B` for `X (n × k, nnz
    /// stored)` and `B (n × m)`.
    SparseTnSum {
        /// Rows of `X` and `B` (the summed dimension).
        n: usize,
        /// Columns of `X`.
        k: usize,
        /// Columns of `B`.
        m: usize,
        /// Stored entries of `X`.
        nnz: usize,
    },
}

impl Product {
    /// Floating-point operations of the product (`2·n·k·m`).
    pub fn flops(&self) -> f64 {
        match *self {
            Self::Rows { n, k, m, .. } | Self::TnSum { n, k, m } => {
                2.0 * n as f64 * k as f64 * m as f64
            }
            // Only the stored entries are multiplied (`2·nnz·m`).
            Self::SparseRows { nnz, m, .. } | Self::SparseTnSum { nnz, m, .. } => {
                2.0 * nnz as f64 * m as f64
            }
        }
    }
}

impl std::fmt::Display for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Rows {
                n,
                k,
                m,
                op_w: Op::N,
            } => write!(f, "A[{n}x{k}]·W[{k}x{m}]"),
            Self::Rows {
                n,
                k,
                m,
                op_w: Op::T,
            } => write!(f, "A[{n}x{k}]·W[{m}x{k}]ᵀ"),
            Self::TnSum { n, k, m } => write!(f, "A[{n}x{k}]ᵀ·B[{n}x{m}]"),
            Self::SparseRows { n, k, m, nnz } => {
                write!(f, "X[{n}x{k}, {nnz} stored]·W[{k}x{m}]")
            }
            Self::SparseTnSum { n, k, m, nnz } => {
                write!(f, "X[{n}x{k}, {nnz} stored]ᵀ·B[{n}x{m}]")
            }
        }
    }
}

thread_local! {
    /// The products this thread has called since [`start_recording`], if it is recording.
    static RECORDING: RefCell<Option<Vec<Product>>> = const { RefCell::new(None) };
}

/// Starts logging, on the calling thread, the shape of every [`gemm_rows`] and
/// [`gemm_tn_sum`] call it makes (the trainer calls them from the thread that runs the epoch).
pub fn start_recording() {
    RECORDING.with(|r| *r.borrow_mut() = Some(Vec::new()));
}

/// Stops logging on the calling thread and returns the products called since
/// [`start_recording`], in call order (empty if it was not recording).
pub fn stop_recording() -> Vec<Product> {
    RECORDING.with(|r| r.borrow_mut().take().unwrap_or_default())
}

pub(crate) fn record(p: Product) {
    RECORDING.with(|r| {
        if let Some(log) = r.borrow_mut().as_mut() {
            log.push(p);
        }
    });
}

/// The most rows of a row-wise task (products, epilogues, softmax, dropout): a block of a
/// product's output stays in cache for its epilogue. Also the least rows of a reduction block.
pub const BLOCK_ROWS: usize = 256;
const _: () = assert!(
    BLOCK_ROWS == super::dense::KC,
    "a reduction block is one pass over k"
);

/// Tasks per thread the row-wise stages aim for: enough that one slow task or a descheduled
/// thread leaves little idle.
const TASKS_PER_THREAD: usize = 8;

/// Elements (rows × width) below which a row-wise task is not split further.
const MIN_TASK_ELEMENTS: usize = 4096;

/// Rows per task of a row-wise stage over `n` rows of `width` values on the current rayon pool:
/// about [`TASKS_PER_THREAD`] tasks per thread, at most [`BLOCK_ROWS`] rows, at least
/// [`MIN_TASK_ELEMENTS`] values (a multiple of 8 rows when it is below [`BLOCK_ROWS`]). It
/// depends on the thread count, so it may only cut stages whose rows are computed
/// independently of one another (their results then do not depend on it).
pub fn task_rows(n: usize, width: usize) -> usize {
    let per_thread = n.div_ceil(TASKS_PER_THREAD * rayon::current_num_threads().max(1));
    let least = MIN_TASK_ELEMENTS.div_ceil(width.max(1));
    per_thread
        .max(least)
        .next_multiple_of(8)
        .clamp(1, BLOCK_ROWS)
}

/// Rows per block of the reductions over rows for `n` rows: a function of `n` alone (never of
/// the thread count), at least [`BLOCK_ROWS`], and at most about 64 blocks, which bounds the
/// per-block partial sums to 64 copies of the result.
pub fn reduce_rows(n: usize) -> usize {
    n.div_ceil(64).next_multiple_of(BLOCK_ROWS).max(BLOCK_ROWS)
}

/// Number of reduction blocks of `n` rows.
pub fn blocks(n: usize) -> usize {
    n.div_ceil(reduce_rows(n))
}

/// `C = A · op(W)` for a tall `n × k` row-major `A` and a small weight `W` (`k × m` for
/// `Op::N`, stored `m × k` for `Op::T`), then `epilogue(first_row, c_block, extra_block)` on
/// each finished row block of `C` (`rows × m`) and of `extra` (`rows × extra_width`, e.g. the
/// next layer's input). Row blocks run in parallel.
///
/// # Panics
/// If a slice is shorter than its shape (the trainer wires fixed shapes).
#[allow(clippy::too_many_arguments)]
pub fn gemm_rows<F>(
    a: &[f32],
    n: usize,
    k: usize,
    w: &[f32],
    op_w: Op,
    m: usize,
    c: &mut [f32],
    extra: &mut [f32],
    extra_width: usize,
    epilogue: F,
) where
    F: Fn(usize, &mut [f32], &mut [f32]) + Sync,
{
    let _clock = crate::model::DenseClock::start();
    if n == 0 || m == 0 {
        return;
    }
    record(Product::Rows { n, k, m, op_w });
    let w_shape = match op_w {
        Op::N => Shape::new(k, m),
        Op::T => Shape::new(m, k),
    };
    let (a, c) = (&a[..n * k], &mut c[..n * m]);
    let extra = &mut extra[..n * extra_width];
    let block = task_rows(n, k.max(m));
    // A wide A times a narrow W (a first layer over many features): rows streamed against W
    // in cache, with the same bits as the packed product.
    let narrow = narrow_applies(k, m, op_w);
    let w_finite = narrow && w[..k * m].iter().all(|v| v.is_finite());
    // A hidden layer's product (narrow W, any A): rows streamed in register tiles against W
    // laid out `k × m` (transposed once here for `Op::T`), with the bits of the packed product.
    let skinny = !narrow && skinny_applies(k, m);
    let w_km: std::borrow::Cow<'_, [f32]> = match op_w {
        Op::T if skinny => {
            let mut t = vec![0.0f32; k * m];
            for (j, row) in w[..m * k].chunks_exact(k).enumerate() {
                for (i, &v) in row.iter().enumerate() {
                    t[i * m + j] = v;
                }
            }
            t.into()
        }
        _ => w.into(),
    };
    let body = |(i, (cb, eb)): (usize, (&mut [f32], &mut [f32]))| {
        let r0 = i * block;
        let rows = cb.len() / m;
        let a = &a[r0 * k..(r0 + rows) * k];
        if narrow {
            narrow_rows(a, rows, k, w, m, cb, w_finite);
        } else if skinny {
            skinny_rows(a, rows, k, &w_km, m, cb);
        } else {
            gemm(
                1.0,
                a,
                Shape::new(rows, k),
                Op::N,
                w,
                w_shape,
                op_w,
                0.0,
                cb,
                Shape::new(rows, m),
            );
        }
        epilogue(r0, cb, eb);
    };
    if extra_width == 0 {
        c.par_chunks_mut(block * m)
            .enumerate()
            .for_each(|(i, cb)| body((i, (cb, &mut []))));
    } else {
        c.par_chunks_mut(block * m)
            .zip(extra.par_chunks_mut(block * extra_width))
            .enumerate()
            .for_each(body);
    }
}

/// `out = Aᵀ · B` (`k × m`) for tall `n × k` `A` and `n × m` `B`, both row-major: the weight
/// gradient. Each row block's partial product goes to its own slot of `partials` (grown to
/// `blocks(n) · k · m` once, then reused), and the slots are added in block order.
///
/// When there are fewer row blocks than the pool has threads to keep busy (a small graph with
/// wide features, as Cora's first layer) and `out` has rows enough, the tasks are slices of
/// `out`'s rows instead: each adds the blocks' products to its slice, in block order, from
/// zero. Every element is then the same sum in the same order as through the slots (see
/// [`gemm_tn_acc`]), so the two ways give the same bits.
pub fn gemm_tn_sum(
    a: &[f32],
    k: usize,
    b: &[f32],
    m: usize,
    n: usize,
    out: &mut [f32],
    partials: &mut Vec<f32>,
) {
    let _clock = crate::model::DenseClock::start();
    let out = &mut out[..k * m];
    if k == 0 || m == 0 {
        return;
    }
    record(Product::TnSum { n, k, m });
    let nb = blocks(n);
    let threads = rayon::current_num_threads().max(1);
    // Only while a block is one of matrixmultiply's passes over k (`reduce_rows(n)` is
    // `BLOCK_ROWS`, n ≤ 16 384): a block's product is then one chain added to the slice, as it
    // is added to the slots' sum. Longer blocks sum their passes first, which a slice adding
    // pass after pass would not reproduce.
    if reduce_rows(n) == BLOCK_ROWS && nb < TASKS_PER_THREAD * threads && k >= 2 * MIN_SLICE_ROWS {
        // Slices of equal size, a multiple of the thread count of them: an even share each.
        let tasks = 4 * threads;
        let (a, b) = (&a[..n * k], &b[..n * m]);
        let slice = k.div_ceil(tasks).max(MIN_SLICE_ROWS);
        let rr = reduce_rows(n);
        out.par_chunks_mut(slice * m)
            .enumerate()
            .for_each(|(s, o)| {
                let k0 = s * slice;
                o.fill(0.0);
                let acc = if narrow_applies(k, m, Op::N) {
                    narrow_tn_acc
                } else {
                    gemm_tn_acc
                };
                for r0 in (0..n).step_by(rr) {
                    let rows = rr.min(n - r0);
                    acc(
                        &a[r0 * k + k0..],
                        k,
                        rows,
                        o.len() / m,
                        &b[r0 * m..(r0 + rows) * m],
                        m,
                        o,
                    );
                }
            });
        return;
    }
    if partials.len() < nb * k * m {
        partials.resize(nb * k * m, 0.0);
    }
    let (a, b) = (&a[..n * k], &b[..n * m]);
    let skinny = skinny_tn_applies(k, m);
    partials[..nb * k * m]
        .par_chunks_mut(k * m)
        .enumerate()
        .for_each(|(i, p)| {
            let r0 = i * reduce_rows(n);
            let rows = reduce_rows(n).min(n - r0);
            if skinny {
                // A hidden layer's weight gradient: the same bits without packing.
                let (a, b) = (&a[r0 * k..(r0 + rows) * k], &b[r0 * m..(r0 + rows) * m]);
                skinny_tn(a, k, rows, b, m, p);
                return;
            }
            gemm(
                1.0,
                &a[r0 * k..(r0 + rows) * k],
                Shape::new(rows, k),
                Op::T,
                &b[r0 * m..(r0 + rows) * m],
                Shape::new(rows, m),
                Op::N,
                0.0,
                p,
                Shape::new(k, m),
            );
        });
    sum_slots(&partials[..nb * k * m], out);
}

/// The fewest rows of `out` a task of [`gemm_tn_sum`] takes when it splits `out`.
const MIN_SLICE_ROWS: usize = 16;

/// `out[j] = Σ_rows b[row][j]` (`b` is `n × m`): the bias gradient, in fixed block order.
pub fn col_sums(b: &[f32], m: usize, n: usize, out: &mut [f32], partials: &mut Vec<f32>) {
    let _clock = crate::model::DenseClock::start();
    let out = &mut out[..m];
    if m == 0 {
        return;
    }
    let nb = blocks(n);
    if partials.len() < nb * m {
        partials.resize(nb * m, 0.0);
    }
    let b = &b[..n * m];
    partials[..nb * m]
        .par_chunks_mut(m)
        .zip(b.par_chunks(reduce_rows(n) * m))
        .for_each(|(p, rows)| {
            p.fill(0.0);
            for row in rows.chunks_exact(m) {
                p.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
            }
        });
    sum_slots(&partials[..nb * m], out);
}

/// `out = Σ_i slots[i]` over the `out.len()`-wide slots of `slots`, in slot order, the
/// columns of `out` split across threads.
fn sum_slots(slots: &[f32], out: &mut [f32]) {
    let width = out.len();
    const COLS: usize = 512;
    out.par_chunks_mut(COLS).enumerate().for_each(|(c, o)| {
        let cols = c * COLS..c * COLS + o.len();
        o.fill(0.0);
        for slot in slots.chunks_exact(width) {
            o.iter_mut()
                .zip(&slot[cols.clone()])
                .for_each(|(s, &v)| *s += v);
        }
    });
}

/// Runs `f(first_row, block)` on the row blocks ([`task_rows`]) of the `n × width` row-major
/// `buf` in parallel.
pub fn for_row_blocks<F>(buf: &mut [f32], width: usize, n: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    if width == 0 || n == 0 {
        return;
    }
    let block = task_rows(n, width);
    buf[..n * width]
        .par_chunks_mut(block * width)
        .enumerate()
        .for_each(|(i, b)| f(i * block, b));
}

/// `Σ_blocks f(rows of the block)` over `n` rows, the `K` sums added in block order.
pub fn block_sums<const K: usize, F>(n: usize, f: F) -> [f64; K]
where
    F: Fn(std::ops::Range<usize>) -> [f64; K] + Sync,
{
    let rows = reduce_rows(n);
    let parts: Vec<[f64; K]> = (0..blocks(n))
        .into_par_iter()
        .map(|i| f(i * rows..((i + 1) * rows).min(n)))
        .collect();
    let mut total = [0.0; K];
    for p in &parts {
        total.iter_mut().zip(p).for_each(|(t, &v)| *t += v);
    }
    total
}

/// Elements per task of [`zip_chunks`]: small vectors (the parameters of a small GCN) run on
/// the calling thread, where splitting would cost more than it saves.
pub const ELEMENTS_PER_TASK: usize = 1 << 14;

/// Runs `f` on matching chunks of four equal-length slices in parallel (Adam's update over
/// parameters, gradients and both moments).
pub fn zip_chunks<F>(a: &mut [f32], b: &[f32], c: &mut [f32], d: &mut [f32], f: F)
where
    F: Fn(&mut [f32], &[f32], &mut [f32], &mut [f32]) + Sync,
{
    let n = a.len();
    assert!(
        b.len() == n && c.len() == n && d.len() == n,
        "zip_chunks: lengths differ"
    );
    if n <= ELEMENTS_PER_TASK {
        f(a, b, c, d);
        return;
    }
    a.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(b.par_chunks(ELEMENTS_PER_TASK))
        .zip(c.par_chunks_mut(ELEMENTS_PER_TASK))
        .zip(d.par_chunks_mut(ELEMENTS_PER_TASK))
        .for_each(|(((a, b), c), d)| f(a, b, c, d));
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test shapes: every narrowing is exact; f32 rounding is deliberate"
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::model::testing::pool;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    fn naive_mm(a: &[f32], n: usize, k: usize, w: &[f32], m: usize) -> Vec<f64> {
        let mut c = vec![0.0f64; n * m];
        for i in 0..n {
            for l in 0..k {
                for j in 0..m {
                    c[i * m + j] += f64::from(a[i * k + l]) * f64::from(w[l * m + j]);
                }
            }
        }
        c
    }

    fn close(got: &[f32], want: &[f64]) -> bool {
        got.iter()
            .zip(want)
            .all(|(&g, &w)| (f64::from(g) - w).abs() <= 1e-3 * (1.0 + w.abs()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn products_and_sums_match_plain_loops_for_any_thread_count(
            n in 0usize..3000, k in 1usize..20, m in 1usize..12, seed in any::<u32>(),
        ) {
            let a = values(n * k, seed);
            let w = values(k * m, seed ^ 7);
            let b = values(n * m, seed ^ 11);
            let want_c = naive_mm(&a, n, k, &w, m);
            // Aᵀ·B and the column sums of B, in f64.
            let mut want_g = vec![0.0f64; k * m];
            let mut want_s = vec![0.0f64; m];
            for i in 0..n {
                for j in 0..m {
                    want_s[j] += f64::from(b[i * m + j]);
                    for l in 0..k {
                        want_g[l * m + j] += f64::from(a[i * k + l]) * f64::from(b[i * m + j]);
                    }
                }
            }
            let wt: Vec<f32> = (0..m * k).map(|i| w[(i % k) * m + i / k]).collect();
            let run = |threads| pool(threads, || {
                let mut c = vec![f32::NAN; n * m];
                let mut relu = vec![f32::NAN; n * m];
                gemm_rows(&a, n, k, &w, Op::N, m, &mut c, &mut relu, m, |r0, cb, eb| {
                    assert_eq!(r0 % 8, 0);
                    eb.iter_mut().zip(cb.iter()).for_each(|(e, &v)| *e = v.max(0.0));
                });
                let mut ct = vec![f32::NAN; n * m];
                gemm_rows(&a, n, k, &wt, Op::T, m, &mut ct, &mut [], 0, |_, _, _| {});
                let (mut g, mut s) = (vec![f32::NAN; k * m], vec![f32::NAN; m]);
                let mut partials = Vec::new();
                gemm_tn_sum(&a, k, &b, m, n, &mut g, &mut partials);
                col_sums(&b, m, n, &mut s, &mut partials);
                (c, relu, ct, g, s)
            });
            let one = run(1);
            prop_assert!(close(&one.0, &want_c));
            prop_assert!(one.1.iter().zip(&one.0).all(|(&r, &c)| r == c.max(0.0)));
            prop_assert!(close(&one.2, &want_c));
            prop_assert!(close(&one.3, &want_g));
            prop_assert!(close(&one.4, &want_s));
            prop_assert_eq!(run(3), one, "bit-identical for any thread count");
        }
    }

    #[test]
    fn weight_gradients_by_row_blocks_and_by_output_slices_agree_bit_for_bit() {
        // Cora's first layer: 11 reduction blocks, taken by row blocks on one thread and by
        // slices of the output's rows on two or more (fewer blocks than 8 per thread).
        // And a graph past 16 384 rows, whose blocks span several passes: row blocks always.
        for (n, k, m, many) in [(2708, 1433, 16, 5), (20_000, 40, 8, 16)] {
            tn_sum_agrees(n, k, m, many);
        }
    }

    fn tn_sum_agrees(n: usize, k: usize, m: usize, many: usize) {
        let a = values(n * k, 5);
        let b = values(n * m, 9);
        let run = |threads| {
            pool(threads, || {
                let mut g = vec![f32::NAN; k * m];
                gemm_tn_sum(&a, k, &b, m, n, &mut g, &mut Vec::new());
                g
            })
        };
        let one = run(1);
        let mut want = vec![0.0f64; k * m];
        for i in 0..n {
            for l in 0..k {
                for j in 0..m {
                    want[l * m + j] += f64::from(a[i * k + l]) * f64::from(b[i * m + j]);
                }
            }
        }
        assert!(close(&one, &want));
        for threads in [2, 3, many] {
            assert!(
                run(threads)
                    .iter()
                    .zip(&one)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{threads} threads"
            );
        }
    }

    #[test]
    fn block_sums_and_zip_chunks_cover_every_row_once() {
        let n = 300 * BLOCK_ROWS + 17;
        let sums = pool(3, || {
            block_sums::<2, _>(n, |rows| [rows.len() as f64, rows.map(|r| r as f64).sum()])
        });
        assert_eq!(sums, [n as f64, (n * (n - 1) / 2) as f64]);
        for len in [10, 3 * ELEMENTS_PER_TASK + 5] {
            let mut a = vec![1.0f32; len];
            let b: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let (mut c, mut d) = (vec![0.0f32; len], vec![0.0f32; len]);
            pool(2, || {
                zip_chunks(&mut a, &b, &mut c, &mut d, |a, b, c, d| {
                    for (((a, &b), c), d) in a.iter_mut().zip(b).zip(c).zip(d) {
                        *a += b;
                        *c = 2.0 * b;
                        *d = 3.0;
                    }
                })
            });
            assert!(
                (0..len).all(|i| a[i] == 1.0 + i as f32 && c[i] == 2.0 * i as f32 && d[i] == 3.0)
            );
        }
        let mut buf = vec![0.0f32; n * 3];
        for_row_blocks(&mut buf, 3, n, |r0, b| {
            for (i, row) in b.chunks_exact_mut(3).enumerate() {
                row.fill((r0 + i) as f32);
            }
        });
        assert!(buf
            .chunks_exact(3)
            .enumerate()
            .all(|(i, r)| r == [i as f32; 3]));
    }
}
