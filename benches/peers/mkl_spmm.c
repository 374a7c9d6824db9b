/*
 * Intel MKL's sparse x dense product at its best, for comparison with `distspmm bench spmm`:
 * the inspector-executor API with the matrix handle created once, mkl_sparse_set_mm_hint and
 * mkl_sparse_optimize before any timing, X and Y preallocated (2 MiB aligned, huge-page
 * advised, as `distspmm bench spmm` puts them), row-major layout, Y = A.X with beta = 0.
 *
 * Input: the CSR arrays of the matrix as raw little-endian files written by mkl_spmm.py
 * (DIR/indptr.i32, DIR/indices.i32, DIR/values.f32, DIR/shape.txt "rows cols nnz").
 *
 *   mkl_spmm DIR F REPS [transpose|csc]
 *
 * Modes: (none) Y = A.X from A's CSR; `transpose`: Y = A^T.X from the same CSR handle
 * (SPARSE_OPERATION_TRANSPOSE, hinted and optimised for it); `csc`: DIR holds the CSR of
 * A^T (= the CSC of A, which distspmm's transposed kernel reads), Y = (A^T).X non-transposed.
 * Prints one line "seconds_median seconds_min max_error" (median and minimum of REPS timed
 * calls after one untimed call; max_error = the largest relative difference of 16 spread rows
 * of Y from a double-precision loop over the CSR arrays).
 *
 * Build (mkl_spmm.py does this):
 *   cc -O2 -std=c11 mkl_spmm.c -I$PREFIX/include -L$PREFIX/lib -l:libmkl_rt.so.3 \
 *      -Wl,-rpath,$PREFIX/lib -o mkl_spmm
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <mkl.h>
#include <mkl_spblas.h>

static void die(const char *what) {
    fprintf(stderr, "mkl_spmm: %s\n", what);
    exit(2);
}

static void *load(const char *dir, const char *name, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mkl_spmm: cannot open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory");
    if (fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "mkl_spmm: %s is shorter than %zu bytes\n", path, bytes);
        exit(2);
    }
    fclose(f);
    return p;
}

/* 2 MiB aligned, huge-page advised, first touched here. */
static float *dense(size_t n) {
    size_t bytes = (n * sizeof(float) + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1);
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes ? bytes : (2u << 20)) != 0) die("out of memory");
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(sparse_status_t s, const char *what) {
    if (s != SPARSE_STATUS_SUCCESS) {
        fprintf(stderr, "mkl_spmm: %s failed (sparse_status_t %d)\n", what, (int)s);
        exit(3);
    }
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) die("usage: mkl_spmm DIR F REPS [transpose|csc]");
    const char *dir = argv[1];
    long f = strtol(argv[2], NULL, 10), reps = strtol(argv[3], NULL, 10);
    int transpose = argc == 5 && strcmp(argv[4], "transpose") == 0;
    if (argc == 5 && !transpose && strcmp(argv[4], "csc") != 0) die("mode must be transpose or csc");
    if (f < 1 || reps < 1) die("F and REPS must be positive");

    char path[4096];
    snprintf(path, sizeof path, "%s/shape.txt", dir);
    FILE *sf = fopen(path, "r");
    long rows, cols, nnz;
    if (!sf || fscanf(sf, "%ld %ld %ld", &rows, &cols, &nnz) != 3) die("cannot read shape.txt");
    fclose(sf);
    MKL_INT *indptr = load(dir, "indptr.i32", (size_t)(rows + 1) * sizeof(MKL_INT));
    MKL_INT *indices = load(dir, "indices.i32", (size_t)nnz * sizeof(MKL_INT));
    float *values = load(dir, "values.f32", (size_t)nnz * sizeof(float));

    long xrows = transpose ? rows : cols, yrows = transpose ? cols : rows;
    float *x = dense((size_t)xrows * (size_t)f), *y = dense((size_t)yrows * (size_t)f);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)xrows * (size_t)f; i++) { /* uniform in [-1, 1) */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }

    sparse_matrix_t a;
    check(mkl_sparse_s_create_csr(&a, SPARSE_INDEX_BASE_ZERO, (MKL_INT)rows, (MKL_INT)cols,
                                  indptr, indptr + 1, indices, values),
          "mkl_sparse_s_create_csr");
    struct matrix_descr descr = {.type = SPARSE_MATRIX_TYPE_GENERAL};
    sparse_operation_t op = transpose ? SPARSE_OPERATION_TRANSPOSE : SPARSE_OPERATION_NON_TRANSPOSE;
    check(mkl_sparse_set_mm_hint(a, op, descr, SPARSE_LAYOUT_ROW_MAJOR, (MKL_INT)f, reps + 1),
          "mkl_sparse_set_mm_hint");
    check(mkl_sparse_optimize(a), "mkl_sparse_optimize");

    double *t = malloc((size_t)reps * sizeof(double));
    if (!t) die("out of memory");
    for (long r = -1; r < reps; r++) {
        double t0 = now();
        check(mkl_sparse_s_mm(op, 1.0f, a, descr, SPARSE_LAYOUT_ROW_MAJOR, x, (MKL_INT)f,
                              (MKL_INT)f, 0.0f, y, (MKL_INT)f),
              "mkl_sparse_s_mm");
        double dt = now() - t0;
        if (r >= 0) t[r] = dt;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp);
    /* Check 16 spread output rows against a plain double-precision loop over the CSR. */
    double err = 0.0;
    double *ref = malloc((size_t)f * sizeof(double));
    if (!ref) die("out of memory");
    for (long k = 0; k < 16 && yrows > 0; k++) {
        long i = (long)(((unsigned long long)k * 2654435761ull) % (unsigned long long)yrows);
        memset(ref, 0, (size_t)f * sizeof(double));
        if (!transpose) {
            for (MKL_INT e = indptr[i]; e < indptr[i + 1]; e++)
                for (long j = 0; j < f; j++)
                    ref[j] += (double)values[e] * x[(size_t)indices[e] * (size_t)f + (size_t)j];
        } else {
            for (long r = 0; r < rows; r++)
                for (MKL_INT e = indptr[r]; e < indptr[r + 1]; e++)
                    if (indices[e] == i)
                        for (long j = 0; j < f; j++)
                            ref[j] += (double)values[e] * x[(size_t)r * (size_t)f + (size_t)j];
        }
        for (long j = 0; j < f; j++) {
            double d = (double)y[(size_t)i * (size_t)f + (size_t)j] - ref[j];
            double scale = ref[j] < 0 ? -ref[j] : ref[j];
            d = (d < 0 ? -d : d) / (scale > 1.0 ? scale : 1.0);
            if (d > err) err = d;
        }
    }
    printf("%.9g %.9g %.3g\n", t[reps / 2], t[0], err);
    mkl_sparse_destroy(a);
    return 0;
}
