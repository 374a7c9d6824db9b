/*
 * C99 test of the message precision of distspmm.h (built and run by capi/tests/c_api.rs):
 *
 *   mpirun -n P precision_test DIR
 *       DIR: a graph with non-negative edge weights in P parts (so Ahat >= 0).
 *
 * For both schedules, operators in bf16 and f16 (dsp_spmm_create_with_precision) against one in
 * f32 (dsp_spmm_create): forward, backward and forward_values differ from f32's by at most
 * u * (|Ahat| |X|) per entry (u = 2^-8 for bf16, 2^-11 for f16; the bound of docs/c-api.md with
 * every term counted as crossing), computed by the f32 operator itself on |X| since Ahat >= 0;
 * they do differ somewhere (the values were converted); and each call hands the communicator
 * exactly half the bytes of f32's. Then the getter and the statuses of bad precisions, one
 * rank's included. Prints one line per failed check and exits non-zero if any failed.
 */
#include "check.h"

#include <math.h>
#include <stdlib.h>

#define COLS 7
#define LD (COLS + 2)

typedef struct {
  dsp_comm *comm;
  size_t n;
  unsigned size;
} Ctx;

typedef dsp_status (*Product)(dsp_spmm *, size_t, size_t, const float *, size_t, float *, size_t);

/* This rank's n x COLS block (leading dimension LD) of pseudo-random values in [-1, 1) from
 * `seed`, or their magnitudes. */
static float *block(const Ctx *c, unsigned long seed, int magnitude) {
  float *m = calloc(c->n * LD + 1, sizeof(float));
  size_t i, j;
  seed += 1000 * (unsigned long)my_rank;
  for (i = 0; i < c->n; i++)
    for (j = 0; j < COLS; j++) {
      float v = next_value(&seed);
      m[i * LD + j] = magnitude ? fabsf(v) : v;
    }
  return m;
}

/* The largest |got - want| over the block, and whether every entry is within
 * u * bound + the two results' own f32 rounding of their sums (ulps of the magnitudes summed;
 * below f16's normals the conversion's absolute error, at most 2^-25 a term). */
static double compare(const Ctx *c, const float *got, const float *want, const float *bound,
                      double u, int *within) {
  double worst = 0.0;
  size_t i, j;
  *within = 1;
  for (i = 0; i < c->n; i++)
    for (j = 0; j < COLS; j++) {
      size_t at = i * COLS + j;
      double d = fabs((double)got[at] - (double)want[at]);
      double allowed = (u + 1e-5) * (double)bound[at] + 1e-7;
      worst = fmax(worst, d);
      if (!(d <= allowed)) *within = 0;
    }
  return worst;
}

/* The largest of every rank's `local` (each rank adds its value into its own slot). */
static double max_over_ranks(const Ctx *c, double local) {
  double *values = calloc(c->size, sizeof(double)), worst = 0.0;
  unsigned r;
  values[my_rank] = local;
  EXPECT(dsp_allreduce_sum_f64(c->comm, values, c->size), DSP_STATUS_OK, NULL);
  for (r = 0; r < c->size; r++) worst = fmax(worst, values[r]);
  free(values);
  return worst;
}

/* One product through the f32 operator and the other one (`u` its unit roundoff; 0: another
 * f32 operator, which must give the same bits and bytes). A reduced precision is within the
 * bound, rounds something, and moves exactly half the bytes. */
static void check_product(const Ctx *c, dsp_spmm *f32, dsp_spmm *reduced, Product product,
                          double u, const char *what) {
  float *x = block(c, 17, 0), *magnitudes = block(c, 17, 1);
  float *want = calloc(c->n * COLS + 1, sizeof(float));
  float *got = calloc(c->n * COLS + 1, sizeof(float));
  float *bound = calloc(c->n * COLS + 1, sizeof(float));
  uint64_t sent32 = 0, received32 = 0, sent16 = 1, received16 = 1;
  int within = 0;
  double worst;
  EXPECT(product(f32, c->n, COLS, magnitudes, LD, bound, COLS), DSP_STATUS_OK, NULL);
  EXPECT(product(f32, c->n, COLS, x, LD, want, COLS), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_bytes_last_call(f32, &sent32, &received32), DSP_STATUS_OK, NULL);
  EXPECT(product(reduced, c->n, COLS, x, LD, got, COLS), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_bytes_last_call(reduced, &sent16, &received16), DSP_STATUS_OK, NULL);
  worst = compare(c, got, want, bound, u, &within);
  if (!within) fprintf(stderr, "rank %u: %s: largest difference %g\n", my_rank, what, worst);
  CHECK(within, what);
  if (u == 0.0) {
    CHECK(worst == 0.0, what);
    CHECK(sent16 == sent32 && received16 == received32, "the bytes of f32");
  } else if (c->size > 1) {
    CHECK(sent32 > 0 && received32 > 0, "f32 moves bytes");
    CHECK(2 * sent16 == sent32 && 2 * received16 == received32, "half the bytes of f32");
    CHECK(max_over_ranks(c, worst) > 0.0, "values that crossed ranks were rounded");
  }
  free(x), free(magnitudes), free(want), free(got), free(bound);
}

static dsp_status forward(dsp_spmm *op, size_t rows, size_t cols, const float *x, size_t ldx,
                          float *y, size_t ldy) {
  return dsp_spmm_forward(op, rows, cols, x, ldx, y, ldy);
}

static dsp_status backward(dsp_spmm *op, size_t rows, size_t cols, const float *x, size_t ldx,
                           float *y, size_t ldy) {
  return dsp_spmm_backward(op, rows, cols, x, ldx, y, ldy);
}

/* forward_values over the edge weights of A (non-negative), so |e| = e. */
static float *weights = NULL;
static size_t weight_count = 0;

static dsp_status forward_values(dsp_spmm *op, size_t rows, size_t cols, const float *x,
                                 size_t ldx, float *y, size_t ldy) {
  return dsp_spmm_forward_values(op, 1, weights, weight_count, rows, cols, x, ldx, y, ldy);
}

static void test_schedule(Ctx *c, dsp_chunk *chunk, int schedule) {
  static const int precisions[2] = {DSP_COMM_PRECISION_BF16, DSP_COMM_PRECISION_F16};
  static const double units[2] = {1.0 / 256.0, 1.0 / 2048.0};
  dsp_spmm *f32 = NULL, *reduced = NULL, *explicit_f32 = NULL;
  int32_t code = -1;
  int k;
  EXPECT(dsp_spmm_create(c->comm, chunk, schedule, &f32), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, schedule, DSP_COMM_PRECISION_F32,
                                        &explicit_f32),
         DSP_STATUS_OK, NULL);
  if (f32 == NULL || explicit_f32 == NULL) return;
  EXPECT(dsp_spmm_comm_precision(f32, &code), DSP_STATUS_OK, NULL);
  CHECK(code == DSP_COMM_PRECISION_F32, "dsp_spmm_create is f32");
  EXPECT(dsp_spmm_comm_precision(explicit_f32, &code), DSP_STATUS_OK, NULL);
  CHECK(code == DSP_COMM_PRECISION_F32, "the f32 code is f32");
  EXPECT(dsp_spmm_edge_count(f32, &weight_count), DSP_STATUS_OK, NULL);
  weights = malloc((weight_count + 1) * sizeof(float));
  EXPECT(dsp_spmm_edge_weights(f32, weights, weight_count), DSP_STATUS_OK, NULL);
  /* DSP_COMM_PRECISION_F32 is dsp_spmm_create exactly: the same bits, the same bytes. */
  check_product(c, f32, explicit_f32, forward, 0.0, "f32 forward is dsp_spmm_create's");
  for (k = 0; k < 2; k++) {
    const char *name = k == 0 ? "bf16" : "f16";
    char what[64];
    EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, schedule, precisions[k], &reduced),
           DSP_STATUS_OK, NULL);
    if (reduced == NULL) break;
    EXPECT(dsp_spmm_comm_precision(reduced, &code), DSP_STATUS_OK, NULL);
    CHECK(code == precisions[k], "the getter returns the precision");
    sprintf(what, "%s forward within u |Ahat| |X|", name);
    check_product(c, f32, reduced, forward, units[k], what);
    sprintf(what, "%s backward within u |Ahat^T| |dY|", name);
    check_product(c, f32, reduced, backward, units[k], what);
    sprintf(what, "%s forward_values within u |E| |X|", name);
    check_product(c, f32, reduced, forward_values, units[k], what);
    dsp_spmm_free(reduced);
    reduced = NULL;
  }
  free(weights);
  weights = NULL;
  dsp_spmm_free(f32);
  dsp_spmm_free(explicit_f32);
}

/* Bad precisions: every rank fails together. */
static void test_statuses(Ctx *c, dsp_chunk *chunk) {
  dsp_spmm *op = NULL;
  int32_t code = 0;
  unsigned rank = my_rank;
  EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, DSP_SCHEDULE_HALO, 3, &op),
         DSP_STATUS_INVALID_ARGUMENT, "precision 3 is not a dsp_comm_precision");
  EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, DSP_SCHEDULE_HALO, DSP_COMM_PRECISION_BF16,
                                        NULL),
         DSP_STATUS_NULL_ARGUMENT, "out");
  EXPECT(dsp_spmm_create_with_precision(c->comm, NULL, DSP_SCHEDULE_HALO, DSP_COMM_PRECISION_BF16,
                                        &op),
         DSP_STATUS_NULL_ARGUMENT, "chunk");
  if (c->size > 1) {
    EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, DSP_SCHEDULE_HALO,
                                          rank == 1 ? -1 : DSP_COMM_PRECISION_BF16, &op),
           rank == 1 ? DSP_STATUS_INVALID_ARGUMENT : DSP_STATUS_PEER_FAILED,
           rank == 1 ? "precision -1" : "rank 1 failed");
    /* Rank 0 in f32, rank 1 in bf16: every rank is told, naming both. */
    EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, DSP_SCHEDULE_HALO,
                                          rank == 1 ? DSP_COMM_PRECISION_BF16
                                                    : DSP_COMM_PRECISION_F32,
                                          &op),
           DSP_STATUS_ARGUMENT_MISMATCH, "precision bf16");
    EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, DSP_SCHEDULE_HALO,
                                          rank == 1 ? DSP_COMM_PRECISION_F16
                                                    : DSP_COMM_PRECISION_BF16,
                                          &op),
           DSP_STATUS_ARGUMENT_MISMATCH, "precision f16");
  }
  CHECK(op == NULL, "no operator after failures");
  EXPECT(dsp_spmm_comm_precision(NULL, &code), DSP_STATUS_NULL_ARGUMENT,
         "dsp_spmm_comm_precision: op");
  /* Still in step: a good create after the failures. */
  EXPECT(dsp_spmm_create_with_precision(c->comm, chunk, DSP_SCHEDULE_BROADCAST,
                                        DSP_COMM_PRECISION_F16, &op),
         DSP_STATUS_OK, NULL);
  if (op == NULL) return;
  EXPECT(dsp_spmm_comm_precision(op, NULL), DSP_STATUS_NULL_ARGUMENT, "out");
  dsp_spmm_free(op);
}

int main(int argc, char **argv) {
  Ctx c;
  dsp_chunk *chunk = NULL;
  int schedule;
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  memset(&c, 0, sizeof c);
  EXPECT(dsp_init(&c.comm), DSP_STATUS_OK, NULL);
  if (c.comm == NULL) return 1;
  EXPECT(dsp_comm_rank(c.comm, &my_rank), DSP_STATUS_OK, NULL);
  EXPECT(dsp_comm_size(c.comm, &c.size), DSP_STATUS_OK, NULL);
  CHECK(DSP_COMM_PRECISION_F32 == 0 && DSP_COMM_PRECISION_BF16 == 1 &&
            DSP_COMM_PRECISION_F16 == 2,
        "precision values");
  EXPECT(dsp_chunk_open(c.comm, argv[1], &chunk), DSP_STATUS_OK, NULL);
  if (chunk == NULL) return 1;
  EXPECT(dsp_chunk_num_local_nodes(chunk, &c.n), DSP_STATUS_OK, NULL);
  for (schedule = DSP_SCHEDULE_HALO; schedule <= DSP_SCHEDULE_BROADCAST; schedule++)
    test_schedule(&c, chunk, schedule);
  test_statuses(&c, chunk);
  dsp_chunk_free(chunk);
  EXPECT(dsp_finalize(c.comm), DSP_STATUS_OK, NULL);
  printf("precision_test: rank %u: %d checks, %d failed\n", my_rank, checks, failures);
  return failures == 0 ? 0 : 1;
}
