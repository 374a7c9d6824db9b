//! CSR/CSC validation and the kernels behind it. From a structured input it builds the three
//! arrays of a small matrix — valid by construction, then optionally mutated (pointer entries,
//! indices, lengths) — and hands them to `Csr::new` or `Csc::new`; separately it feeds the input's
//! triplets (indices unreduced, so some fall outside) to `from_triplets`.
//!
//! Every unmutated structure must be accepted. Whatever is accepted must really satisfy the
//! invariants the unchecked kernels rely on, and then `kernel::spmm` / `kernel::spmm_transpose`
//! (rayon, SIMD, leading dimensions) must equal `kernel::reference` and a dense product exactly:
//! values are small multiples of 1/8, so every sum is exact in `f32` whatever the order or FMA.
//! Run under AddressSanitizer, an accepted-but-invalid structure would show up as an
//! out-of-bounds read in the kernel.
#![no_main]

use arbitrary::Arbitrary;
use distspmm_sparse::kernel::{self, reference};
use distspmm_sparse::sparse::{
    ByCol, ByRow, Compressed, CscOwned, CsrOwned, DenseView, DenseViewMut, Orientation,
};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Mutation {
    SetPointer(u8, u64),
    SetIndex(u8, u32),
    PushIndex(u32),
    PushValue,
    PopValue,
    PushPointer(u64),
    PopPointer,
    SwapIndices(u8, u8),
}

#[derive(Debug, Arbitrary)]
struct Input {
    nrows: u8,
    ncols: u8,
    csc: bool,
    entries: Vec<(u8, u8, i8)>,
    mutations: Vec<Mutation>,
    triplets: Vec<(u32, u32, i8)>,
    features: u8,
    x_pad: u8,
    y_pad: u8,
    alpha: u8,
    beta: u8,
    x: Vec<i8>,
    y: Vec<i8>,
}

fn dyadic(v: i8) -> f32 {
    f32::from(v) / 8.0
}

/// The arrays of an `outer × inner` compressed matrix holding `entries` (reduced into range,
/// duplicates keep the last value), built directly rather than through the library.
fn build(
    outer: usize,
    inner: usize,
    entries: &[(usize, usize, f32)],
) -> (Vec<u64>, Vec<u32>, Vec<f32>) {
    let mut slots: Vec<Vec<(u32, f32)>> = vec![Vec::new(); outer];
    for &(o, i, v) in entries {
        let row = &mut slots[o];
        match row.iter_mut().find(|(j, _)| *j as usize == i) {
            Some(slot) => slot.1 = v,
            None => row.push((i as u32, v)),
        }
    }
    let mut indptr = vec![0u64];
    let (mut indices, mut data) = (Vec::new(), Vec::new());
    for mut row in slots {
        row.sort_by_key(|&(j, _)| j);
        for (j, v) in row {
            indices.push(j);
            data.push(v);
        }
        indptr.push(indices.len() as u64);
    }
    debug_assert!(inner > 0 || indices.is_empty());
    (indptr, indices, data)
}

fn mutate(m: &Mutation, indptr: &mut Vec<u64>, indices: &mut Vec<u32>, data: &mut Vec<f32>) {
    match *m {
        Mutation::SetPointer(at, v) => {
            if !indptr.is_empty() {
                let at = usize::from(at) % indptr.len();
                indptr[at] = v;
            }
        }
        Mutation::SetIndex(at, v) => {
            if !indices.is_empty() {
                let at = usize::from(at) % indices.len();
                indices[at] = v;
            }
        }
        Mutation::PushIndex(v) => indices.push(v),
        Mutation::PushValue => data.push(1.0),
        Mutation::PopValue => {
            data.pop();
        }
        Mutation::PushPointer(v) => indptr.push(v),
        Mutation::PopPointer => {
            indptr.pop();
        }
        Mutation::SwapIndices(a, b) => {
            if !indices.is_empty() {
                let n = indices.len();
                indices.swap(usize::from(a) % n, usize::from(b) % n);
            }
        }
    }
}

/// The invariants the kernels index by, checked independently of the library's validator.
fn assert_invariants(outer: usize, inner: usize, indptr: &[u64], indices: &[u32], data: &[f32]) {
    assert_eq!(indptr.len(), outer + 1);
    assert_eq!(indptr[0], 0);
    assert_eq!(indptr[outer] as usize, indices.len());
    assert_eq!(indices.len(), data.len());
    for w in indptr.windows(2) {
        assert!(w[0] <= w[1]);
        let run = &indices[w[0] as usize..w[1] as usize];
        assert!(run.iter().all(|&j| (j as usize) < inner));
        assert!(run.windows(2).all(|p| p[0] < p[1]));
    }
}

/// `alpha·op(A)·X + beta·Y` densely, `op(A)` given row-major `m × k`.
#[allow(clippy::too_many_arguments)]
fn dense_product(
    a: &[f32],
    m: usize,
    k: usize,
    x: &[f32],
    ldx: usize,
    f: usize,
    alpha: f32,
    beta: f32,
    y: &[f32],
    ldy: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; m * f];
    for i in 0..m {
        for c in 0..f {
            let mut s = 0.0f32;
            for j in 0..k {
                s += a[i * k + j] * x[j * ldx + c];
            }
            let prior = if beta == 0.0 {
                0.0
            } else {
                beta * y[i * ldy + c]
            };
            out[i * f + c] = if alpha == 0.0 {
                prior
            } else {
                alpha * s + prior
            };
        }
    }
    out
}

fn column_block(buf: &[f32], rows: usize, f: usize, ld: usize) -> Vec<f32> {
    (0..rows)
        .flat_map(|i| buf[i * ld..i * ld + f].iter().copied())
        .collect()
}

/// `from_triplets` in orientation `O` accepts exactly the in-range triplets and sums duplicates.
fn check_triplets<O: Orientation>(
    nrows: usize,
    ncols: usize,
    rows: &[u32],
    cols: &[u32],
    vals: &[f32],
    in_range: bool,
    sums: &[f32],
) {
    type Owned<O> = Compressed<f32, Vec<u64>, Vec<u32>, Vec<f32>, O>;
    match Owned::<O>::from_triplets(nrows, ncols, rows, cols, vals) {
        Ok(t) => {
            assert!(in_range, "from_triplets accepted an index out of range");
            let (outer, inner) = if O::ROW_MAJOR {
                (nrows, ncols)
            } else {
                (ncols, nrows)
            };
            assert_invariants(outer, inner, t.indptr(), t.indices(), t.data());
            assert_eq!(t.to_dense(), sums);
        }
        Err(_) => assert!(!in_range, "from_triplets rejected in-range triplets"),
    }
}

/// Triplets with indices reduced below 64 (so some fall outside small matrices).
fn check_all_triplets(input: &Input, nrows: usize, ncols: usize) {
    let rows: Vec<u32> = input.triplets.iter().map(|t| t.0 % 64).collect();
    let cols: Vec<u32> = input.triplets.iter().map(|t| t.1 % 64).collect();
    let vals: Vec<f32> = input.triplets.iter().map(|t| dyadic(t.2)).collect();
    let in_range =
        rows.iter().all(|&r| (r as usize) < nrows) && cols.iter().all(|&c| (c as usize) < ncols);
    let mut sums = vec![0.0f32; nrows * ncols];
    if in_range {
        for ((&r, &c), &v) in rows.iter().zip(&cols).zip(&vals) {
            sums[r as usize * ncols + c as usize] += v;
        }
    }
    check_triplets::<ByRow>(nrows, ncols, &rows, &cols, &vals, in_range, &sums);
    check_triplets::<ByCol>(nrows, ncols, &rows, &cols, &vals, in_range, &sums);
}

fuzz_target!(|input: Input| {
    let (nrows, ncols) = (usize::from(input.nrows % 48), usize::from(input.ncols % 48));
    check_all_triplets(&input, nrows, ncols);

    let (outer, inner) = if input.csc {
        (ncols, nrows)
    } else {
        (nrows, ncols)
    };
    let reduced: Vec<(usize, usize, f32)> = if outer == 0 || inner == 0 {
        Vec::new()
    } else {
        input
            .entries
            .iter()
            .map(|&(o, i, v)| (usize::from(o) % outer, usize::from(i) % inner, dyadic(v)))
            .collect()
    };
    let (mut indptr, mut indices, mut data) = build(outer, inner, &reduced);
    for m in &input.mutations {
        mutate(m, &mut indptr, &mut indices, &mut data);
    }
    let unmutated = input.mutations.is_empty();

    let scales = [1.0f32, 0.0, -0.5, 2.0];
    let alpha = scales[usize::from(input.alpha) % 4];
    let beta = scales[usize::from(input.beta) % 4];
    let f = usize::from(input.features % 40) + 1;
    let (ldx, ldy) = (
        f + usize::from(input.x_pad % 5),
        f + usize::from(input.y_pad % 5),
    );
    let fill = |src: &[i8], len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| src.get(i % src.len().max(1)).map_or(0.25, |&v| dyadic(v)))
            .collect()
    };
    // op(A) is m × k: A for a CSR, Aᵀ for a CSC.
    let (m, k) = if input.csc {
        (ncols, nrows)
    } else {
        (nrows, ncols)
    };
    let x = fill(&input.x, k.max(1) * ldx);
    let y0 = fill(&input.y, m.max(1) * ldy);
    let xv = DenseView::new(&x[..], k, f, ldx).expect("X fits its buffer");
    let (mut y_fast, mut y_ref) = (y0.clone(), y0.clone());
    let y_fast_view = DenseViewMut::new(&mut y_fast[..], m, f, ldy).expect("Y fits its buffer");
    let y_ref_view = DenseViewMut::new(&mut y_ref[..], m, f, ldy).expect("Y fits its buffer");

    // op(A) densely (row-major m × k), after the products ran.
    let op_dense = if input.csc {
        let Ok(a) =
            CscOwned::<f32>::new(nrows, ncols, indptr.clone(), indices.clone(), data.clone())
        else {
            assert!(!unmutated, "a well-formed CSC was rejected");
            return;
        };
        assert_invariants(outer, inner, &indptr, &indices, &data);
        kernel::spmm_transpose(alpha, &a.view(), xv, beta, y_fast_view).expect("shapes agree");
        reference::spmm_transpose(alpha, &a.view(), xv, beta, y_ref_view).expect("shapes agree");
        let dense = a.to_dense();
        let csr = a.to_csr().expect("small matrices convert");
        assert_eq!(csr.to_dense(), dense);
        assert!(csr.to_csc().expect("and back") == a);
        (0..ncols)
            .flat_map(|j| (0..nrows).map(move |i| (i, j)))
            .map(|(i, j)| dense[i * ncols + j])
            .collect()
    } else {
        let Ok(a) =
            CsrOwned::<f32>::new(nrows, ncols, indptr.clone(), indices.clone(), data.clone())
        else {
            assert!(!unmutated, "a well-formed CSR was rejected");
            return;
        };
        assert_invariants(outer, inner, &indptr, &indices, &data);
        kernel::spmm(alpha, &a.view(), xv, beta, y_fast_view).expect("shapes agree");
        reference::spmm(alpha, &a.view(), xv, beta, y_ref_view).expect("shapes agree");
        let dense = a.to_dense();
        let csc = a.to_csc().expect("small matrices convert");
        assert_eq!(csc.to_dense(), dense);
        assert!(csc.to_csr().expect("and back") == a);
        dense
    };
    let want = dense_product(&op_dense, m, k, &x, ldx, f, alpha, beta, &y0, ldy);
    assert_eq!(column_block(&y_fast, m, f, ldy), want, "kernel vs dense");
    assert_eq!(column_block(&y_ref, m, f, ldy), want, "reference vs dense");
});
