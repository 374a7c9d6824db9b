//! Kernel tests against the plain-loop reference and a dense product.
#![allow(
    clippy::cast_possible_truncation,
    reason = "small test matrices: every narrowing is exact"
)]

use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::*;
use crate::sparse::{CscOwned, CsrOwned};

/// Every instruction set this CPU can run.
fn isas() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| i <= Isa::supported())
        .collect()
}

/// A random `rows × cols` matrix from triplets (duplicates included) with about `density`
/// of the cells set; some rows and columns stay empty.
fn random_csr(rows: usize, cols: usize, entries: &[(u32, u32, f32)]) -> CsrOwned<f32> {
    let r: Vec<u32> = entries.iter().map(|e| e.0).collect();
    let c: Vec<u32> = entries.iter().map(|e| e.1).collect();
    let v: Vec<f32> = entries.iter().map(|e| e.2).collect();
    CsrOwned::from_triplets(rows, cols, &r, &c, &v).unwrap()
}

/// Dense `rows × ld` buffer whose first `cols` columns hold the values.
fn dense(rows: usize, ld: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..rows * ld)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Checks `got` against the exact product α·A·X + β·Y0 computed in f64 from the dense A.
#[allow(clippy::too_many_arguments)]
fn assert_close_to_dense(
    a: &CsrOwned<f32>,
    x: &DenseView<'_, f32>,
    alpha: f32,
    beta: f32,
    y0: &[f32],
    got: &[f32],
    ldy: usize,
) -> Result<(), TestCaseError> {
    let ad = a.to_dense();
    let (m, k, f) = (a.nrows(), a.ncols(), x.cols());
    for i in 0..m {
        let row_nnz = a.row(i).0.len() as f64;
        for j in 0..f {
            let (mut exact, mut bound) = (0.0f64, 0.0f64);
            for c in 0..k {
                let p = f64::from(ad[i * k + c]) * f64::from(x.row(c)[j]);
                exact += p;
                bound += p.abs();
            }
            exact *= f64::from(alpha);
            bound *= f64::from(alpha).abs();
            if beta != 0.0 {
                let old = f64::from(beta) * f64::from(y0[i * ldy + j]);
                exact += old;
                bound += old.abs();
            }
            let g = f64::from(got[i * ldy + j]);
            let tol = (row_nnz + 3.0) * f64::from(f32::EPSILON) * bound + 1e-30;
            prop_assert!(
                (g - exact).abs() <= tol,
                "Y[{i}][{j}] = {g}, expected {exact} (tolerance {tol})"
            );
        }
    }
    Ok(())
}

fn problem() -> impl Strategy<Value = (usize, usize, Vec<(u32, u32, f32)>)> {
    (0usize..24, 0usize..24).prop_flat_map(|(r, c)| {
        let entries = if r == 0 || c == 0 {
            Just(Vec::new()).boxed()
        } else {
            proptest::collection::vec((0..r as u32, 0..c as u32, -1.0f32..1.0), 0..r * c + 8)
                .boxed()
        };
        (Just(r), Just(c), entries)
    })
}

fn features() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(16),
        Just(17),
        Just(64),
        1usize..80,
        250usize..300,
    ]
}

fn scalars() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(1.0), Just(-0.5), Just(2.25)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn spmm_matches_reference_and_dense(
        (m, k, entries) in problem(),
        f in features(),
        pad_x in 0usize..5,
        pad_y in 0usize..5,
        alpha in scalars(),
        beta in scalars(),
        seed in any::<u64>(),
    ) {
        let a = random_csr(m, k, &entries);
        let (ldx, ldy) = (f + pad_x, f + pad_y);
        let xbuf = dense(k, ldx, seed);
        let x = DenseView::new(&xbuf, k, f, ldx).unwrap();
        let mut y0 = dense(m, ldy, seed ^ 0x9e37);
        if beta == 0.0 {
            // β = 0 must overwrite without reading: NaN in Y must not survive.
            y0.iter_mut().step_by(3).for_each(|v| *v = f32::NAN);
        }

        let mut want = y0.clone();
        reference::spmm(alpha, &a.view(), x, beta, DenseViewMut::new(&mut want, m, f, ldy).unwrap())
            .unwrap();
        assert_close_to_dense(&a, &x, alpha, beta, &y0, &want, ldy)?;

        for isa in isas() {
            let mut got = y0.clone();
            let op = Operand { indptr: a.indptr(), indices: a.indices(), data: a.data() };
            run(isa, alpha, op, x, beta, DenseViewMut::new(&mut got, m, f, ldy).unwrap());
            if isa == Isa::Avx512 {
                assert_close_to_dense(&a, &x, alpha, beta, &y0, &got, ldy)?;
            } else {
                // Same operations in the same order as the reference: identical bits.
                for (g, w) in got.iter().zip(&want) {
                    prop_assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
                }
            }
            // The padding between F and ld belongs to someone else: untouched.
            for i in 0..m {
                for j in f..ldy {
                    let (g, o) = (got[i * ldy + j], y0[i * ldy + j]);
                    prop_assert!(g.to_bits() == o.to_bits(), "padding Y[{i}][{j}] changed");
                }
            }
        }

        // The public entry point agrees with the run it dispatches to.
        let mut got = y0.clone();
        spmm(alpha, &a.view(), x, beta, DenseViewMut::new(&mut got, m, f, ldy).unwrap()).unwrap();
        assert_close_to_dense(&a, &x, alpha, beta, &y0, &got, ldy)?;
    }

    #[test]
    fn transpose_of_csc_equals_spmm_of_transpose(
        (m, k, entries) in problem(),
        f in features(),
        alpha in scalars(),
        beta in scalars(),
        seed in any::<u64>(),
    ) {
        // A is m × k; Aᵀ·X needs X with m rows and gives k rows.
        let a = random_csr(m, k, &entries);
        let csc: CscOwned<f32> = a.to_csc().unwrap();
        let swapped: Vec<(u32, u32, f32)> = entries.iter().map(|&(r, c, v)| (c, r, v)).collect();
        let at = random_csr(k, m, &swapped);
        let xbuf = dense(m, f, seed);
        let x = DenseView::from_row_major(&xbuf, m, f).unwrap();
        let y0 = dense(k, f, seed ^ 7);

        let mut via_csc = y0.clone();
        spmm_transpose(alpha, &csc.view(), x, beta, DenseViewMut::from_row_major(&mut via_csc, k, f).unwrap())
            .unwrap();
        let mut via_csr = y0.clone();
        spmm(alpha, &at.view(), x, beta, DenseViewMut::from_row_major(&mut via_csr, k, f).unwrap())
            .unwrap();
        prop_assert_eq!(&via_csc, &via_csr);

        let mut want = y0.clone();
        reference::spmm_transpose(
            alpha, &csc.view(), x, beta, DenseViewMut::from_row_major(&mut want, k, f).unwrap(),
        )
        .unwrap();
        assert_close_to_dense(&at, &x, alpha, beta, &y0, &via_csc, f)?;
        assert_close_to_dense(&at, &x, alpha, beta, &y0, &want, f)?;
    }
}

/// A power-law-ish matrix large enough to be split into many blocks.
fn skewed(rows: usize, cols: usize) -> CsrOwned<f32> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rows {
        // Degrees from 0 to ~2000, heavy-tailed.
        let deg = (1u64 << (next() % 12)) as usize / 2;
        for _ in 0..deg {
            r.push(i as u32);
            c.push((next() % cols as u64) as u32);
            v.push((next() % 1000) as f32 / 997.0 - 0.5);
        }
    }
    CsrOwned::from_triplets(rows, cols, &r, &c, &v).unwrap()
}

#[test]
fn results_are_bit_identical_for_one_to_four_threads() {
    let a = skewed(3000, 2500);
    assert!(
        a.nnz() > 4 * MIN_GRAIN as usize,
        "must be split into blocks"
    );
    let csc = a.to_csc().unwrap();
    for f in [1usize, 16, 17, 64, 300] {
        let xbuf = dense(2500, f, f as u64);
        let x = DenseView::from_row_major(&xbuf, 2500, f).unwrap();
        let xtbuf = dense(3000, f, f as u64 + 1);
        let xt = DenseView::from_row_major(&xtbuf, 3000, f).unwrap();
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for threads in 1..=4 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (y, yt) = pool.install(|| {
                let mut y = dense(3000, f, 3);
                spmm(
                    0.75,
                    &a.view(),
                    x,
                    0.5,
                    DenseViewMut::from_row_major(&mut y, 3000, f).unwrap(),
                )
                .unwrap();
                let mut yt = vec![f32::NAN; 2500 * f];
                spmm_transpose(
                    1.0,
                    &csc.view(),
                    xt,
                    0.0,
                    DenseViewMut::from_row_major(&mut yt, 2500, f).unwrap(),
                )
                .unwrap();
                (y, yt)
            });
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            match &first {
                None => first = Some((y, yt)),
                Some((y1, yt1)) => {
                    assert_eq!(bits(y1), bits(&y), "CSR, F = {f}, {threads} threads");
                    assert_eq!(bits(yt1), bits(&yt), "CSC, F = {f}, {threads} threads");
                }
            }
        }
    }
}

#[test]
fn column_slices_of_wider_matrices() {
    // Y[:, 3..10] = A · X[:, 5..12], leaving the rest of Y alone.
    let a = skewed(50, 40);
    let xbuf = dense(40, 20, 1);
    let xfull = DenseView::from_row_major(&xbuf, 40, 20).unwrap();
    let x = xfull.column_slice(5..12).unwrap();
    let mut ybuf = dense(50, 16, 2);
    let before = ybuf.clone();
    let y = DenseViewMut::from_row_major(&mut ybuf, 50, 16).unwrap();
    spmm(1.0, &a.view(), x, 0.0, y.column_slice_mut(3..10).unwrap()).unwrap();
    let xs = x.to_vec();
    let mut want = vec![0.0f32; 50 * 7];
    reference::spmm(
        1.0,
        &a.view(),
        DenseView::from_row_major(&xs, 40, 7).unwrap(),
        0.0,
        DenseViewMut::from_row_major(&mut want, 50, 7).unwrap(),
    )
    .unwrap();
    for i in 0..50 {
        for j in 0..16 {
            let got = ybuf[i * 16 + j];
            if (3..10).contains(&j) {
                let w = want[i * 7 + j - 3];
                assert!((got - w).abs() <= 1e-4 * (1.0 + w.abs()), "Y[{i}][{j}]");
            } else {
                assert_eq!(
                    got.to_bits(),
                    before[i * 16 + j].to_bits(),
                    "Y[{i}][{j}] outside the slice"
                );
            }
        }
    }
}

#[test]
fn shape_errors_name_the_mismatch() {
    let a = skewed(5, 4);
    let xbuf = vec![0.0f32; 4 * 3];
    let mut ybuf = [0.0f32; 6 * 3];
    let x = DenseView::from_row_major(&xbuf, 4, 3).unwrap();
    let bad_x = DenseView::from_row_major(&xbuf, 3, 4).unwrap();
    let y = DenseViewMut::from_row_major(&mut ybuf[..15], 5, 3).unwrap();
    assert!(matches!(
        spmm(1.0, &a.view(), bad_x, 0.0, y),
        Err(KernelError::InnerDimension {
            op_cols: 4,
            x_rows: 3,
            ..
        })
    ));
    let mut y6 = vec![0.0f32; 18];
    assert!(matches!(
        spmm(
            1.0,
            &a.view(),
            x,
            0.0,
            DenseViewMut::from_row_major(&mut y6, 6, 3).unwrap()
        ),
        Err(KernelError::OutputRows {
            op_rows: 5,
            y_rows: 6,
            ..
        })
    ));
    let mut y2 = vec![0.0f32; 10];
    assert!(matches!(
        spmm(
            1.0,
            &a.view(),
            x,
            0.0,
            DenseViewMut::from_row_major(&mut y2, 5, 2).unwrap()
        ),
        Err(KernelError::FeatureColumns {
            x_cols: 3,
            y_cols: 2
        })
    ));
    let csc = a.to_csc().unwrap();
    assert!(matches!(
        spmm_transpose(
            1.0,
            &csc.view(),
            x,
            0.0,
            DenseViewMut::from_row_major(&mut y6[..12], 4, 3).unwrap()
        ),
        Err(KernelError::InnerDimension {
            op: "Aᵀ",
            op_cols: 5,
            x_rows: 4
        })
    ));
}

#[test]
fn empty_operands_and_alpha_zero() {
    // 0 × 0 matrix, no features, no rows.
    let empty = CsrOwned::<f32>::new(0, 0, vec![0], vec![], vec![]).unwrap();
    spmm(
        1.0,
        &empty.view(),
        DenseView::new(&[], 0, 5, 5).unwrap(),
        0.0,
        DenseViewMut::new(&mut [], 0, 5, 5).unwrap(),
    )
    .unwrap();
    // Rows without entries: Y = β·Y, or 0 when β = 0 even over NaN.
    let a = CsrOwned::<f32>::new(3, 2, vec![0, 0, 0, 0], vec![], vec![]).unwrap();
    let xbuf = vec![f32::NAN; 4];
    let x = DenseView::from_row_major(&xbuf, 2, 2).unwrap();
    let mut y = vec![1.0, 2.0, f32::NAN, 4.0, 5.0, 6.0];
    spmm(
        1.0,
        &a.view(),
        x,
        0.0,
        DenseViewMut::from_row_major(&mut y, 3, 2).unwrap(),
    )
    .unwrap();
    assert_eq!(y, vec![0.0; 6]);
    // α = 0: A and X are not used, Y = β·Y.
    let b = skewed(3, 2);
    let mut y = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    spmm(
        0.0,
        &b.view(),
        x,
        2.0,
        DenseViewMut::from_row_major(&mut y, 3, 2).unwrap(),
    )
    .unwrap();
    assert_eq!(y, vec![2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
}

#[test]
fn f64_products_match_the_reference_exactly() {
    let a32 = skewed(200, 150);
    let a = CsrOwned::<f64>::new(
        200,
        150,
        a32.indptr().to_vec(),
        a32.indices().to_vec(),
        a32.data().iter().map(|&v| f64::from(v)).collect(),
    )
    .unwrap();
    for f in [1usize, 7, 32, 33, 100] {
        let xbuf: Vec<f64> = dense(150, f, 9).into_iter().map(f64::from).collect();
        let x = DenseView::from_row_major(&xbuf, 150, f).unwrap();
        let y0: Vec<f64> = dense(200, f, 10).into_iter().map(f64::from).collect();
        let (mut got, mut want) = (y0.clone(), y0);
        spmm(
            1.5,
            &a.view(),
            x,
            -1.0,
            DenseViewMut::from_row_major(&mut got, 200, f).unwrap(),
        )
        .unwrap();
        reference::spmm(
            1.5,
            &a.view(),
            x,
            -1.0,
            DenseViewMut::from_row_major(&mut want, 200, f).unwrap(),
        )
        .unwrap();
        assert_eq!(got, want, "F = {f}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn large_aligned_outputs_take_the_streaming_store_path() {
    use crate::sparse::PageBuffer;
    // 65536 × 32 f32 = 8 MiB of Y on a page-aligned buffer: streamed when AVX-512 is present.
    let (m, k, f) = (65_536usize, 3000usize, 32usize);
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..m {
        for j in 0..(i % 5) {
            r.push(i as u32);
            c.push(((i * 7 + j * 613) % k) as u32);
            v.push(1.0 / (1 + j) as f32);
        }
    }
    let a = CsrOwned::from_triplets(m, k, &r, &c, &v).unwrap();
    let xbuf = dense(k, f, 5);
    let x = DenseView::from_row_major(&xbuf, k, f).unwrap();
    let mut ybuf = PageBuffer::<f32>::zeroed(m * f).unwrap();
    ybuf.iter_mut().for_each(|v| *v = f32::NAN);
    let pass = Pass {
        op: Operand::of(a.view()),
        x,
        f0: 0,
        w: f,
        alpha: 1.0,
        beta: 0.0,
        y_bytes: m * f * 4,
    };
    assert!(avx512::streams(&pass, ybuf.as_ptr(), f));
    spmm(
        0.5,
        &a.view(),
        x,
        0.0,
        DenseViewMut::from_row_major(&mut ybuf[..], m, f).unwrap(),
    )
    .unwrap();
    let mut want = vec![0.0f32; m * f];
    reference::spmm(
        0.5,
        &a.view(),
        x,
        0.0,
        DenseViewMut::from_row_major(&mut want, m, f).unwrap(),
    )
    .unwrap();
    for (i, (g, w)) in ybuf.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "Y[{}][{}] = {g}, expected {w}",
            i / f,
            i % f
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn wide_products_over_a_large_x_are_packed_into_panels_correctly() {
    // X of 65,536 × 136 f32 (34 MiB) is packed: passes of 32, 32, 32, 32, 8 columns.
    let (m, k, f) = (300usize, 65_536usize, 136usize);
    assert_eq!(avx512::plan(f, k), (32, true));
    assert_eq!(avx512::plan(f, 1000), (80, false));
    assert_eq!(avx512::plan(128, k), (128, false));
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..m {
        for j in 0..(i % 7) {
            r.push(i as u32);
            c.push(((i * 7919 + j * 104_729) % k) as u32);
            v.push(0.25 * (j as f32 + 1.0));
        }
    }
    let a = CsrOwned::from_triplets(m, k, &r, &c, &v).unwrap();
    let xbuf = dense(k, f, 11);
    let x = DenseView::from_row_major(&xbuf, k, f).unwrap();
    let y0 = dense(m, f, 12);
    let (mut got, mut want) = (y0.clone(), y0.clone());
    spmm(
        2.0,
        &a.view(),
        x,
        -1.0,
        DenseViewMut::from_row_major(&mut got, m, f).unwrap(),
    )
    .unwrap();
    reference::spmm(
        2.0,
        &a.view(),
        x,
        -1.0,
        DenseViewMut::from_row_major(&mut want, m, f).unwrap(),
    )
    .unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "Y[{}][{}] = {g}, expected {w}",
            i / f,
            i % f
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The SDDMM against ⟨U_i, V_j⟩ in f64, every instruction set giving the same bits, and
    /// the plain-loop reference within rounding (it sums the columns in another order).
    #[test]
    fn sddmm_matches_the_dot_products(
        (m, k, entries) in problem(),
        f in features(),
        pad_u in 0usize..5,
        pad_v in 0usize..5,
        seed in any::<u64>(),
    ) {
        let a = random_csr(m, k, &entries);
        let (ldu, ldv) = (f + pad_u, f + pad_v);
        let (ubuf, vbuf) = (dense(m, ldu, seed), dense(k, ldv, seed ^ 0x51));
        let u = DenseView::new(&ubuf, m, f, ldu).unwrap();
        let v = DenseView::new(&vbuf, k, f, ldv).unwrap();
        let mut want = vec![f32::NAN; a.nnz()];
        reference::sddmm(&a.view(), u, v, &mut want).unwrap();
        let mut exact = Vec::with_capacity(a.nnz());
        for i in 0..m {
            for &j in a.row(i).0 {
                let d: f64 = (0..f)
                    .map(|c| f64::from(u.row(i)[c]) * f64::from(v.row(j as usize)[c]))
                    .sum();
                exact.push(d);
            }
        }
        let mut first: Option<Vec<u32>> = None;
        for isa in isas() {
            let mut got = vec![f32::NAN; a.nnz()];
            sddmm::run(isa, a.indptr(), a.indices(), u, v, &mut got);
            for (k, (&g, &x)) in got.iter().zip(&exact).enumerate() {
                prop_assert!((f64::from(g) - x).abs() <= 1e-5 * (f as f64 + 1.0), "E[{k}] = {g}, exact {x}");
                prop_assert!((g - want[k]).abs() <= 1e-5 * (f as f32 + 1.0));
            }
            let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            match &first {
                None => first = Some(bits),
                Some(b) => prop_assert_eq!(b, &bits, "{:?}", isa),
            }
        }
        let mut got = vec![f32::NAN; a.nnz()];
        sddmm(&a.view(), u, v, &mut got).unwrap();
        prop_assert_eq!(first.unwrap(), got.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

#[cfg(feature = "std")]
#[test]
fn sddmm_is_bit_identical_for_any_thread_count() {
    // A skewed pattern large enough to be split into many blocks.
    let (m, k, f) = (3000usize, 2500usize, 37usize);
    let entries: Vec<(u32, u32, f32)> = (0..60_000u64)
        .map(|t| {
            let row = (t * 7919) % m as u64 % (1 + t % 97);
            (row as u32, ((t * 104_729) % k as u64) as u32, 1.0)
        })
        .collect();
    let a = random_csr(m, k, &entries);
    let (ubuf, vbuf) = (dense(m, f, 3), dense(k, f, 4));
    let u = DenseView::from_row_major(&ubuf, m, f).unwrap();
    let v = DenseView::from_row_major(&vbuf, k, f).unwrap();
    let run_on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut e = vec![0f32; a.nnz()];
        pool.install(|| sddmm(&a.view(), u, v, &mut e)).unwrap();
        e.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let one = run_on(1);
    assert_eq!(run_on(3), one);
    assert_eq!(run_on(8), one);
}

#[test]
fn sddmm_rejects_operands_that_do_not_fit() {
    let a = random_csr(2, 3, &[(0, 1, 1.0), (1, 2, 1.0)]);
    let (u, v) = (vec![0f32; 2 * 4], vec![0f32; 3 * 4]);
    let uv = DenseView::from_row_major(&u[..], 2, 4).unwrap();
    let vv = DenseView::from_row_major(&v[..], 3, 4).unwrap();
    let mut e = [0f32; 2];
    assert!(sddmm(&a.view(), uv, vv, &mut e).is_ok());
    assert!(matches!(
        sddmm(&a.view(), uv, vv, &mut e[..1]),
        Err(KernelError::EdgeCount { nnz: 2, values: 1 })
    ));
    let short = DenseView::from_row_major(&v[..8], 2, 4).unwrap();
    let err = sddmm(&a.view(), uv, short, &mut e).unwrap_err();
    assert!(alloc::format!("{err}").contains("V is 2 × 4"), "{err}");
    let narrow = DenseView::from_row_major(&u[..6], 2, 3).unwrap();
    assert!(matches!(
        sddmm(&a.view(), narrow, vv, &mut e),
        Err(KernelError::SddmmOperands { .. })
    ));
    // F = 0: every dot product is 0.
    let (u0, v0) = (
        DenseView::new(&u[..], 2, 0, 0).unwrap(),
        DenseView::new(&v[..], 3, 0, 0).unwrap(),
    );
    let mut e = [f32::NAN; 2];
    sddmm(&a.view(), u0, v0, &mut e).unwrap();
    assert_eq!(e, [0.0, 0.0]);
}

/// The pattern of `a` with every entry's value its CSR position (exact in f32 for these sizes),
/// and its CSC: the CSC's values are then the CSR→CSC permutation.
fn positions(a: &CsrOwned<f32>) -> (CsrOwned<f32>, CscOwned<f32>) {
    let p: Vec<f32> = (0..a.nnz()).map(|k| k as f32).collect();
    let csr = CsrOwned::new(
        a.nrows(),
        a.ncols(),
        a.indptr().to_vec(),
        a.indices().to_vec(),
        p,
    )
    .unwrap();
    let csc = csr.to_csc().unwrap();
    (csr, csc)
}

/// `Σ_j e_g[p]·X_j[col]` over the entries `(o, j)` of outer index `o` of `(indptr, indices)`
/// (`pos` maps an entry to its run position), α and β applied, in f64, with a rounding bound.
#[allow(clippy::too_many_arguments)]
fn grouped_exact(
    indptr: &[u64],
    indices: &[u32],
    pos: &dyn Fn(usize) -> usize,
    e: &[f32],
    nnz: usize,
    c: usize,
    x: &DenseView<'_, f32>,
    alpha: f32,
    beta: f32,
    y0: &[f32],
    got: &[f32],
) -> Result<(), TestCaseError> {
    let f = x.cols();
    for o in 0..indptr.len() - 1 {
        let (s, t) = (indptr[o] as usize, indptr[o + 1] as usize);
        for col in 0..f {
            let g = col / c;
            let (mut exact, mut bound) = (0.0f64, 0.0f64);
            for p in s..t {
                let v = f64::from(e[g * nnz + pos(p)]) * f64::from(x.row(indices[p] as usize)[col]);
                exact += v;
                bound += v.abs();
            }
            exact *= f64::from(alpha);
            bound *= f64::from(alpha).abs();
            if beta != 0.0 {
                let old = f64::from(beta) * f64::from(y0[o * f + col]);
                exact += old;
                bound += old.abs();
            }
            let got = f64::from(got[o * f + col]);
            let tol = ((t - s) as f64 + 3.0) * f64::from(f32::EPSILON) * bound + 1e-30;
            prop_assert!(
                (got - exact).abs() <= tol,
                "Y[{o}][{col}] = {got}, expected {exact}"
            );
        }
    }
    Ok(())
}

fn group_shapes() -> impl Strategy<Value = (usize, usize)> {
    (
        1usize..5,
        prop_oneof![
            Just(1usize),
            Just(2),
            Just(3),
            Just(8),
            Just(17),
            1usize..40
        ],
    )
}

/// `y` as a row-major `rows × f` matrix.
fn rows_of(y: &mut [f32], rows: usize, f: usize) -> DenseViewMut<'_, f32> {
    DenseViewMut::from_row_major(y, rows, f).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The grouped SpMM (CSR and CSC) against f64 sums, bit for bit against the plain-loop
    /// reference on every instruction set when there are several groups, and, with one group,
    /// bit for bit the single product.
    #[test]
    fn grouped_spmm_matches_reference_and_dense(
        (m, k, entries) in problem(),
        (groups, c) in group_shapes(),
        alpha in scalars(),
        beta in scalars(),
        seed in any::<u64>(),
    ) {
        let a = random_csr(m, k, &entries);
        let (csr, csc) = positions(&a);
        let nnz = a.nnz();
        let f = groups * c;
        let e = dense(groups, nnz, seed ^ 0x77);
        let runs = EdgeRuns::contiguous(&e, groups).unwrap();
        // Aᵀ reads its runs in CSC order: head-major and edge-major copies.
        let perm: Vec<usize> = csc.data().iter().map(|&p| p as usize).collect();
        let e_csc: Vec<f32> = (0..groups)
            .flat_map(|g| perm.iter().map(move |&p| (g, p)))
            .map(|(g, p)| e[g * nnz + p])
            .collect();
        let e_edge: Vec<f32> = (0..nnz)
            .flat_map(|q| (0..groups).map(move |g| (g, q)))
            .map(|(g, q)| e_csc[g * nnz + q])
            .collect();
        for transposed in [false, true] {
            let (rows, inner) = if transposed { (k, m) } else { (m, k) };
            let xbuf = dense(inner, f, seed);
            let x = DenseView::from_row_major(&xbuf, inner, f).unwrap();
            let mut y0 = dense(rows, f, seed ^ 0x9e37);
            if beta == 0.0 {
                y0.iter_mut().step_by(3).for_each(|v| *v = f32::NAN);
            }
            let mut want = y0.clone();
            let csc_runs = EdgeRuns::contiguous(&e_csc, groups).unwrap();
            if transposed {
                reference::spmm_transpose_grouped(alpha, &csc.view(), csc_runs, x, beta, rows_of(&mut want, rows, f))
                    .unwrap();
                let pos = |q: usize| perm[q];
                grouped_exact(csc.indptr(), csc.indices(), &pos, &e, nnz, c, &x, alpha, beta, &y0, &want)?;
            } else {
                reference::spmm_grouped(alpha, &csr.view(), runs, x, beta, rows_of(&mut want, rows, f)).unwrap();
                grouped_exact(csr.indptr(), csr.indices(), &|p| p, &e, nnz, c, &x, alpha, beta, &y0, &want)?;
            }
            let (indptr, indices) = if transposed {
                (csc.indptr(), csc.indices())
            } else {
                (csr.indptr(), csr.indices())
            };
            let mut results = Vec::new();
            for isa in isas() {
                let mut layouts = vec![if transposed { csc_runs } else { runs }];
                if transposed {
                    layouts.push(EdgeRuns::edge_major(&e_edge, groups).unwrap());
                }
                for e in layouts {
                    let mut got = y0.clone();
                    grouped::run_spmm(isa, alpha, indptr, indices, e, x, beta, rows_of(&mut got, rows, f));
                    results.push((isa, got));
                }
            }
            for (isa, got) in &results {
                if groups > 1 || *isa != Isa::Avx512 {
                    for (g, w) in got.iter().zip(&want) {
                        prop_assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{:?}", isa);
                    }
                }
            }
            if groups == 1 {
                // One group is the single product itself.
                let mut single = y0.clone();
                if transposed {
                    let vals = CscOwned::new(m, k, csc.indptr().to_vec(), csc.indices().to_vec(), e_csc.clone()).unwrap();
                    spmm_transpose(alpha, &vals.view(), x, beta, rows_of(&mut single, rows, f)).unwrap();
                } else {
                    let vals = CsrOwned::new(m, k, csr.indptr().to_vec(), csr.indices().to_vec(), e.clone()).unwrap();
                    spmm(alpha, &vals.view(), x, beta, rows_of(&mut single, rows, f)).unwrap();
                }
                let mut got = y0.clone();
                if transposed {
                    spmm_transpose_grouped(alpha, &csc.view(), csc_runs, x, beta, rows_of(&mut got, rows, f)).unwrap();
                } else {
                    spmm_grouped(alpha, &csr.view(), runs, x, beta, rows_of(&mut got, rows, f)).unwrap();
                }
                let same = got.iter().zip(&single).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
                prop_assert!(same, "one group differs from the single product");
            }
        }
    }

    /// The grouped SDDMM gives, bit for bit, what one SDDMM per group over its columns gives,
    /// on every instruction set, and the reference within rounding.
    #[test]
    fn grouped_sddmm_is_one_sddmm_per_group(
        (m, k, entries) in problem(),
        (groups, w) in group_shapes(),
        pad in 0usize..3,
        gap in 0usize..3,
        seed in any::<u64>(),
    ) {
        let a = random_csr(m, k, &entries);
        let nnz = a.nnz();
        let f = groups * w;
        let ld = f + pad;
        let (ubuf, vbuf) = (dense(m, ld, seed), dense(k, ld, seed ^ 0x51));
        let u = DenseView::new(&ubuf, m, f, ld).unwrap();
        let v = DenseView::new(&vbuf, k, f, ld).unwrap();
        let mut separate = vec![f32::NAN; groups * nnz];
        for (g, run) in separate.chunks_exact_mut(nnz.max(1)).enumerate().take(groups) {
            let cols = g * w..(g + 1) * w;
            sddmm(&a.view(), u.column_slice(cols.clone()).unwrap(), v.column_slice(cols).unwrap(), &mut run[..nnz])
                .unwrap();
        }
        let mut want = vec![f32::NAN; groups * nnz];
        reference::sddmm_grouped(&a.view(), u, v, EdgeRunsMut::contiguous(&mut want, groups).unwrap()).unwrap();
        for (g, r) in separate.iter().zip(&want) {
            prop_assert!((g - r).abs() <= 1e-5 * (w as f32 + 1.0));
        }
        // Runs `gap` values apart, the gaps left alone.
        let stride = nnz + gap;
        for isa in isas() {
            let mut got = vec![-7.0f32; (groups - 1) * stride + nnz];
            let runs = EdgeRunsMut::head_major(&mut got, groups, nnz, stride).unwrap();
            grouped::run_sddmm(isa, a.indptr(), a.indices(), u, v, runs);
            for g in 0..groups {
                prop_assert_eq!(bits(&got[g * stride..g * stride + nnz]), bits(&separate[g * nnz..(g + 1) * nnz]), "{:?}", isa);
                if g + 1 < groups {
                    prop_assert!(got[g * stride + nnz..(g + 1) * stride].iter().all(|&x| x == -7.0));
                }
            }
        }
        let mut got = vec![f32::NAN; groups * nnz];
        sddmm_grouped(&a.view(), u, v, EdgeRunsMut::contiguous(&mut got, groups).unwrap()).unwrap();
        prop_assert_eq!(bits(&got), bits(&separate));
    }
}

#[cfg(feature = "std")]
#[test]
fn grouped_products_are_bit_identical_for_any_thread_count() {
    let a = skewed(3000, 2500);
    let (csr, csc) = positions(&a);
    let nnz = a.nnz();
    for (groups, c) in [(2usize, 8usize), (8, 8), (3, 17), (4, 2)] {
        let f = groups * c;
        let e = dense(groups, nnz, 11);
        let xbuf = dense(2500, f, 12);
        let xtbuf = dense(3000, f, 13);
        let run_on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let runs = EdgeRuns::contiguous(&e, groups).unwrap();
                let x = DenseView::from_row_major(&xbuf, 2500, f).unwrap();
                let xt = DenseView::from_row_major(&xtbuf, 3000, f).unwrap();
                let mut y = vec![0f32; 3000 * f];
                spmm_grouped(
                    1.0,
                    &csr.view(),
                    runs,
                    x,
                    0.0,
                    DenseViewMut::from_row_major(&mut y, 3000, f).unwrap(),
                )
                .unwrap();
                let mut yt = vec![0f32; 2500 * f];
                spmm_transpose_grouped(
                    1.0,
                    &csc.view(),
                    runs,
                    xt,
                    0.0,
                    DenseViewMut::from_row_major(&mut yt, 2500, f).unwrap(),
                )
                .unwrap();
                let mut s = vec![0f32; groups * nnz];
                let u = DenseView::from_row_major(&xtbuf, 3000, f).unwrap();
                sddmm_grouped(
                    &csr.view(),
                    u,
                    x,
                    EdgeRunsMut::contiguous(&mut s, groups).unwrap(),
                )
                .unwrap();
                (bits(&y), bits(&yt), bits(&s))
            })
        };
        let one = run_on(1);
        assert_eq!(run_on(3), one, "G = {groups}, C = {c}");
        assert_eq!(run_on(4), one, "G = {groups}, C = {c}");
    }
}

#[test]
fn grouped_operands_that_do_not_fit_are_refused() {
    let v = [0f32; 12];
    assert!(EdgeRuns::contiguous(&v, 0).is_err());
    assert!(EdgeRuns::contiguous(&v, 5).is_err());
    assert_eq!(EdgeRuns::contiguous(&v, 4).unwrap().len(), 3);
    assert!(EdgeRuns::head_major(&v, 3, 4, 4).is_ok());
    assert!(
        EdgeRuns::head_major(&v, 3, 4, 5).is_err(),
        "runs past the end"
    );
    assert!(
        EdgeRuns::head_major(&v, 2, 4, 3).is_err(),
        "overlapping runs"
    );
    assert!(EdgeRuns::head_major(&v, 1, 12, 0).is_ok());
    assert!(EdgeRuns::edge_major(&v, 5).is_err());
    let mut w = [0f32; 12];
    assert!(EdgeRunsMut::head_major(&mut w, 2, 5, 4).is_err());
    assert!(matches!(
        EdgeRunsMut::contiguous(&mut w, 0),
        Err(KernelError::EdgeRuns { groups: 0, .. })
    ));

    let a = random_csr(2, 3, &[(0, 1, 1.0), (1, 2, 1.0)]);
    let (u, x) = (vec![0f32; 2 * 6], vec![0f32; 3 * 6]);
    let uv = DenseView::from_row_major(&u[..], 2, 6).unwrap();
    let xv = DenseView::from_row_major(&x[..], 3, 6).unwrap();
    let e = [0f32; 8];
    let mut y = vec![0f32; 2 * 6];
    // 6 columns in 4 groups.
    assert!(matches!(
        spmm_grouped(
            1.0,
            &a.view(),
            EdgeRuns::contiguous(&e, 4).unwrap(),
            xv,
            0.0,
            rows_of(&mut y, 2, 6)
        ),
        Err(KernelError::Groups { groups: 4, cols: 6 })
    ));
    // Runs of 4 values over 2 entries.
    assert!(matches!(
        spmm_grouped(
            1.0,
            &a.view(),
            EdgeRuns::contiguous(&e, 2).unwrap(),
            xv,
            0.0,
            rows_of(&mut y, 2, 6)
        ),
        Err(KernelError::EdgeCount { nnz: 2, values: 4 })
    ));
    assert!(spmm_grouped(
        1.0,
        &a.view(),
        EdgeRuns::contiguous(&e[..6], 3).unwrap(),
        xv,
        0.0,
        rows_of(&mut y, 2, 6)
    )
    .is_ok());
    let mut s = [0f32; 4];
    assert!(matches!(
        sddmm_grouped(
            &a.view(),
            uv,
            xv,
            EdgeRunsMut::contiguous(&mut s, 4).unwrap()
        ),
        Err(KernelError::EdgeCount { nnz: 2, values: 1 })
    ));
    let mut s = [f32::NAN; 6];
    let empty_u = DenseView::new(&u[..], 2, 0, 0).unwrap();
    let empty_x = DenseView::new(&x[..], 3, 0, 0).unwrap();
    sddmm_grouped(
        &a.view(),
        empty_u,
        empty_x,
        EdgeRunsMut::contiguous(&mut s, 3).unwrap(),
    )
    .unwrap();
    assert_eq!(s, [0.0; 6], "no columns: every dot product is 0");
}
