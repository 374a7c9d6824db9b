/*
 * C99 test of the per-edge calls of distspmm.h (built and run by capi/tests/c_api.rs):
 *
 *   mpirun -n P edges_test DIR WEIGHT_SUM ADDED_LOOPS OLD_DIR
 *       DIR: a weighted graph with features in P parts; WEIGHT_SUM: the sum of its input edge
 *       weights; ADDED_LOOPS: the self loops the normalisation added (its nodes without one);
 *       OLD_DIR: the same partition written without edge weights (chunk format 1.0).
 *
 * Every product is compared with a dense reference built from dsp_spmm_edges: X, U, V, dY are
 * functions of the global node id, so each rank knows the rows other ranks own; the sums into
 * other ranks' rows (backward products, dV) are made over all N rows and added up with
 * dsp_allreduce_sum_f32. Then the statuses of bad arguments, one rank's bad argument included.
 * Prints one line per failed check and exits non-zero if any failed.
 */
#include "check.h"

#include <math.h>
#include <stdlib.h>

/* The graph's dense operands: a smooth function of the global node id and the column. */
static float dense(int which, uint64_t node, size_t col) {
  return (float)sin(0.37 * (double)node + 1.3 * (double)col + 0.9 * which);
}

/* The rank's layout and the world it lives in. */
typedef struct {
  dsp_comm *comm;
  dsp_spmm *op;
  uint32_t size;
  size_t n, edges;
  uint64_t global, offset;
  int64_t *rows, *sources;
} Ctx;

static double max_diff(const float *a, const float *b, size_t len) {
  double d = 0.0;
  size_t i;
  for (i = 0; i < len; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
  return d;
}

/* Fills this rank's n x cols block (leading dimension ld) of dense operand `which`. */
static float *local_block(const Ctx *c, int which, size_t cols, size_t ld) {
  float *m = calloc(c->n * ld + 1, sizeof(float));
  size_t i, j;
  for (i = 0; i < c->n; i++)
    for (j = 0; j < cols; j++) m[i * ld + j] = dense(which, c->offset + i, j);
  return m;
}

/* groups runs of per-edge values: pseudo-random in [-1, 1) times `scale`. */
static float *edge_values(const Ctx *c, size_t groups, unsigned long seed, float scale) {
  float *e = malloc((groups * c->edges + 1) * sizeof(float));
  size_t k;
  for (k = 0; k < groups * c->edges; k++) e[k] = scale * next_value(&seed);
  return e;
}

/* The local rows of a global N x cols array summed over all ranks (contiguous n x cols). */
static float *sum_rows(const Ctx *c, float *all, size_t cols) {
  float *mine = malloc((c->n * cols + 1) * sizeof(float));
  EXPECT(dsp_allreduce_sum_f32(c->comm, all, (size_t)c->global * cols), DSP_STATUS_OK, NULL);
  memcpy(mine, all + c->offset * cols, c->n * cols * sizeof(float));
  free(all);
  return mine;
}

static void test_layout(Ctx *c, double weight_sum, double added_loops) {
  size_t k, loops = 0, bad = 0, zeros = 0;
  double sum = 0.0, counts[2];
  float *w = malloc((c->edges + 1) * sizeof(float));
  for (k = 0; k < c->edges; k++) {
    bad += (c->rows[k] < 0 || (size_t)c->rows[k] >= c->n) ? 1 : 0;
    bad += (c->sources[k] < 0 || (uint64_t)c->sources[k] >= c->global) ? 1 : 0;
    loops += (uint64_t)c->sources[k] == c->offset + (uint64_t)c->rows[k] ? 1 : 0;
  }
  CHECK(bad == 0, "rows in 0..n, sources in 0..N");
  CHECK(loops == c->n, "every row has its one self loop");
  EXPECT(dsp_spmm_edge_weights(c->op, w, c->edges), DSP_STATUS_OK, NULL);
  for (k = 0; k < c->edges; k++) {
    sum += w[k];
    zeros += w[k] == 0.0f ? 1 : 0;
    bad += w[k] < 0.0f ? 1 : 0;
  }
  CHECK(bad == 0, "weights are not negative");
  counts[0] = sum;
  counts[1] = (double)zeros;
  EXPECT(dsp_allreduce_sum_f64(c->comm, counts, 2), DSP_STATUS_OK, NULL);
  CHECK(fabs(counts[0] - weight_sum) <= 1e-3 * weight_sum, "the weights of A add up");
  CHECK(counts[1] == added_loops, "weight 0 exactly at the self loops the normalisation added");
  free(w);
}

/* forward_values and backward_values against their dense forms, for `groups` groups of width
 * w; with one group and the edge weights, forward_values is A X. */
static void test_values(Ctx *c, size_t groups, int use_weights) {
  const size_t w = 3, cols = groups * w, ld = cols + 2;
  float *e = edge_values(c, groups, 77 + groups, 1.0f);
  float *x = local_block(c, 0, cols, ld), *dy = local_block(c, 1, cols, cols);
  float *y = calloc(c->n * cols + 1, sizeof(float)), *dx = calloc(c->n * ld + 1, sizeof(float));
  float *want = calloc(c->n * cols + 1, sizeof(float));
  float *all = calloc((size_t)c->global * cols + 1, sizeof(float)), *want_dx, *got_dx;
  size_t k, j, i;
  if (use_weights) EXPECT(dsp_spmm_edge_weights(c->op, e, c->edges), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_forward_values(c->op, groups, e, groups * c->edges, c->n, cols, x, ld, y, cols),
         DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_backward_values(c->op, groups, e, groups * c->edges, c->n, cols, dy, cols, dx,
                                  ld),
         DSP_STATUS_OK, NULL);
  for (k = 0; k < c->edges; k++)
    for (j = 0; j < cols; j++) {
      float v = e[(j / w) * c->edges + k];
      want[(size_t)c->rows[k] * cols + j] += v * dense(0, (uint64_t)c->sources[k], j);
      all[(size_t)c->sources[k] * cols + j] += v * dense(1, c->offset + (uint64_t)c->rows[k], j);
    }
  want_dx = sum_rows(c, all, cols);
  got_dx = malloc((c->n * cols + 1) * sizeof(float));
  for (i = 0; i < c->n; i++) memcpy(got_dx + i * cols, dx + i * ld, cols * sizeof(float));
  CHECK(max_diff(y, want, c->n * cols) <= 1e-4, "forward_values is the dense product");
  CHECK(max_diff(got_dx, want_dx, c->n * cols) <= 1e-4, "backward_values is the dense product");
  free(e), free(x), free(dy), free(y), free(dx), free(want), free(want_dx), free(got_dx);
}

/* sddmm and sddmm_backward against their dense forms, and GAT's additive attention. */
static void test_sddmm(Ctx *c, size_t groups) {
  const size_t w = 4, cols = groups * w, ld = cols + 1;
  float *u = local_block(c, 2, cols, ld), *v = local_block(c, 3, cols, cols);
  float *e = calloc(groups * c->edges + 1, sizeof(float));
  float *want = calloc(groups * c->edges + 1, sizeof(float));
  float *de = edge_values(c, groups, 5 + groups, 1.0f);
  float *du = calloc(c->n * cols + 1, sizeof(float)), *dv = calloc(c->n * ld + 1, sizeof(float));
  float *want_du = calloc(c->n * cols + 1, sizeof(float));
  float *all = calloc((size_t)c->global * cols + 1, sizeof(float)), *want_dv, *got_dv;
  float *s = calloc(c->n * 2 + 1, sizeof(float)), *t = calloc(c->n * 2 + 1, sizeof(float));
  size_t k, j, i;
  EXPECT(dsp_sddmm(c->op, groups, c->n, cols, u, ld, v, cols, e, groups * c->edges),
         DSP_STATUS_OK, NULL);
  EXPECT(dsp_sddmm_backward(c->op, groups, de, groups * c->edges, c->n, cols, u, ld, v, cols, du,
                            cols, dv, ld),
         DSP_STATUS_OK, NULL);
  for (k = 0; k < c->edges; k++) {
    uint64_t row = c->offset + (uint64_t)c->rows[k], source = (uint64_t)c->sources[k];
    for (j = 0; j < cols; j++) {
      size_t g = j / w;
      want[g * c->edges + k] += dense(2, row, j) * dense(3, source, j);
      want_du[(size_t)c->rows[k] * cols + j] += de[g * c->edges + k] * dense(3, source, j);
      all[source * cols + j] += de[g * c->edges + k] * dense(2, row, j);
    }
  }
  want_dv = sum_rows(c, all, cols);
  got_dv = malloc((c->n * cols + 1) * sizeof(float));
  for (i = 0; i < c->n; i++) memcpy(got_dv + i * cols, dv + i * ld, cols * sizeof(float));
  CHECK(max_diff(e, want, groups * c->edges) <= 1e-4, "sddmm is the row dot products");
  CHECK(max_diff(du, want_du, c->n * cols) <= 1e-4, "sddmm_backward's dU");
  CHECK(max_diff(got_dv, want_dv, c->n * cols) <= 1e-4, "sddmm_backward's dV");

  /* GAT: U = [s, 1], V = [1, t] gives e_ij = s_i + t_j. */
  for (i = 0; i < c->n; i++) {
    s[2 * i] = dense(4, c->offset + i, 0);
    s[2 * i + 1] = 1.0f;
    t[2 * i] = 1.0f;
    t[2 * i + 1] = dense(5, c->offset + i, 0);
  }
  EXPECT(dsp_sddmm(c->op, 1, c->n, 2, s, 2, t, 2, e, c->edges), DSP_STATUS_OK, NULL);
  for (k = 0; k < c->edges; k++)
    want[k] = dense(4, c->offset + (uint64_t)c->rows[k], 0) + dense(5, (uint64_t)c->sources[k], 0);
  CHECK(max_diff(e, want, c->edges) <= 1e-5, "GAT's additive attention");
  free(u), free(v), free(e), free(want), free(de), free(du), free(dv), free(want_du);
  free(want_dv), free(got_dv), free(s), free(t);
}

/* The edge softmax and its gradient against a scalar reference, per row and group. */
static void test_softmax(Ctx *c, size_t groups, float slope) {
  const size_t len = groups * c->edges;
  float *z = edge_values(c, groups, 31 + groups, 3.0f), *d_out = edge_values(c, groups, 9, 1.0f);
  float *out = calloc(len + 1, sizeof(float)), *d_z = calloc(len + 1, sizeof(float));
  float *want = calloc(len + 1, sizeof(float)), *want_d = calloc(len + 1, sizeof(float));
  double *row_max = malloc((groups * c->n + 1) * sizeof(double));
  double *row_sum = calloc(groups * c->n + 1, sizeof(double));
  double *row_dot = calloc(groups * c->n + 1, sizeof(double));
  double *out_sum = calloc(groups * c->n + 1, sizeof(double)), worst = 0.0;
  size_t g, k, i;
  EXPECT(dsp_edge_softmax(c->op, groups, slope, z, out, len), DSP_STATUS_OK, NULL);
  EXPECT(dsp_edge_softmax_backward(c->op, groups, slope, z, out, d_out, d_z, len), DSP_STATUS_OK,
         NULL);
  for (i = 0; i < groups * c->n; i++) row_max[i] = -HUGE_VAL;
  for (g = 0; g < groups; g++) {
    for (k = 0; k < c->edges; k++) {
      double a = z[g * c->edges + k] > 0.0f ? z[g * c->edges + k] : slope * z[g * c->edges + k];
      size_t r = g * c->n + (size_t)c->rows[k];
      row_max[r] = fmax(row_max[r], a);
    }
    for (k = 0; k < c->edges; k++) {
      double a = z[g * c->edges + k] > 0.0f ? z[g * c->edges + k] : slope * z[g * c->edges + k];
      row_sum[g * c->n + (size_t)c->rows[k]] += exp(a - row_max[g * c->n + (size_t)c->rows[k]]);
    }
    for (k = 0; k < c->edges; k++) {
      size_t r = g * c->n + (size_t)c->rows[k], at = g * c->edges + k;
      double a = z[at] > 0.0f ? z[at] : slope * z[at];
      want[at] = (float)(exp(a - row_max[r]) / row_sum[r]);
      out_sum[r] += out[at];
      row_dot[r] += (double)out[at] * d_out[at];
    }
    for (k = 0; k < c->edges; k++) {
      size_t r = g * c->n + (size_t)c->rows[k], at = g * c->edges + k;
      want_d[at] = (float)((double)out[at] * (d_out[at] - row_dot[r]) *
                           (z[at] > 0.0f ? 1.0 : (double)slope));
    }
  }
  for (i = 0; i < groups * c->n; i++) worst = fmax(worst, fabs(out_sum[i] - 1.0));
  CHECK(worst <= 1e-5, "every row's softmax sums to 1");
  CHECK(max_diff(out, want, len) <= 1e-6, "edge softmax against the scalar reference");
  CHECK(max_diff(d_z, want_d, len) <= 1e-5, "edge softmax backward against the reference");
  free(z), free(d_out), free(out), free(d_z), free(want), free(want_d), free(row_max);
  free(row_sum), free(row_dot), free(out_sum);
}

/* Bad arguments: statuses and messages, every rank failing together in a collective call. */
static void test_statuses(Ctx *c) {
  const size_t cols = 4, e2 = 2 * c->edges;
  float *x = local_block(c, 0, cols, cols), *y = calloc(c->n * cols + 1, sizeof(float));
  float *dv = calloc(c->n * cols + 1, sizeof(float)), *e = edge_values(c, 2, 3, 1.0f);
  float *out = calloc(e2 + 1, sizeof(float));
  size_t count = 0;
  unsigned rank = my_rank;
  int64_t *ids = malloc((c->edges + 1) * sizeof(int64_t));

  EXPECT(dsp_spmm_edge_count(c->op, NULL), DSP_STATUS_NULL_ARGUMENT, "count is NULL");
  EXPECT(dsp_spmm_edge_count(c->op, &count), DSP_STATUS_OK, NULL);
  CHECK(count == c->edges, "edge count");
  EXPECT(dsp_spmm_edges(c->op, ids, NULL, c->edges), DSP_STATUS_NULL_ARGUMENT,
         "sources (with");
  EXPECT(dsp_spmm_edges(c->op, ids, ids, c->edges), DSP_STATUS_INVALID_ARGUMENT, "overlap");
  EXPECT(dsp_spmm_edges(c->op, ids, ids, c->edges + 1), DSP_STATUS_INVALID_ARGUMENT,
         "dsp_spmm_edge_count");
  EXPECT(dsp_spmm_edge_weights(c->op, out, c->edges - 1), DSP_STATUS_INVALID_ARGUMENT,
         "count = ");

  /* Every rank wrong alike. */
  EXPECT(dsp_spmm_forward_values(c->op, 1, e, c->edges + 1, c->n, cols, x, cols, y, cols),
         DSP_STATUS_INVALID_ARGUMENT, "groups * dsp_spmm_edge_count");
  EXPECT(dsp_spmm_forward_values(c->op, 3, e, 3 * c->edges, c->n, cols, x, cols, y, cols),
         DSP_STATUS_INVALID_ARGUMENT, "not a multiple of groups = 3");
  EXPECT(dsp_spmm_backward_values(c->op, 0, e, 0, c->n, cols, x, cols, y, cols),
         DSP_STATUS_INVALID_ARGUMENT, "groups = 0");
  EXPECT(dsp_sddmm(c->op, 0, c->n, cols, x, cols, x, cols, out, 0), DSP_STATUS_INVALID_ARGUMENT,
         "groups = 0");
  EXPECT(dsp_spmm_forward_values(c->op, 2, NULL, e2, c->n, cols, x, cols, y, cols),
         DSP_STATUS_NULL_ARGUMENT, "e (with");
  EXPECT(dsp_sddmm(c->op, 2, c->n, cols, x, cols, x, cols, NULL, e2), DSP_STATUS_NULL_ARGUMENT,
         "e (with");
  EXPECT(dsp_sddmm(c->op, 1, c->n, cols, x, cols, x, cols, x, c->edges),
         DSP_STATUS_INVALID_ARGUMENT, "overlap");
  EXPECT(dsp_sddmm_backward(c->op, 2, e, e2, c->n, cols, x, cols, x, cols, y, cols, y, cols),
         DSP_STATUS_INVALID_ARGUMENT, "overlap");
  EXPECT(dsp_sddmm_backward(c->op, 2, e, e2, c->n + 1, cols, x, cols, x, cols, y, cols, y, cols),
         DSP_STATUS_INVALID_ARGUMENT, "owns");
  /* One rank's argument error fails the other ranks with PEER_FAILED, never a hang. */
  if (c->size > 1) {
    EXPECT(dsp_spmm_forward_values(c->op, 2, e, rank == 1 ? e2 - 1 : e2, c->n, cols, x, cols, y,
                                   cols),
           rank == 1 ? DSP_STATUS_INVALID_ARGUMENT : DSP_STATUS_PEER_FAILED,
           rank == 1 ? "count = " : "rank 1 failed");
    EXPECT(dsp_sddmm(c->op, 2, c->n, cols, x, cols, rank == 1 ? NULL : x, cols, out, e2),
           rank == 1 ? DSP_STATUS_NULL_ARGUMENT : DSP_STATUS_PEER_FAILED,
           rank == 1 ? "v (with" : "rank 1 failed");
    EXPECT(dsp_sddmm_backward(c->op, rank == 1 ? 3 : 2, e, e2, c->n, cols, x, cols, x, cols, y,
                              cols, dv, cols),
           rank == 1 ? DSP_STATUS_INVALID_ARGUMENT : DSP_STATUS_PEER_FAILED,
           rank == 1 ? "not a multiple of groups" : "rank 1 failed");
    /* Different cols, different groups: every rank is told. */
    EXPECT(dsp_sddmm(c->op, 1, c->n, cols - rank, x, cols, x, cols, out, c->edges),
           DSP_STATUS_ARGUMENT_MISMATCH, "cols = ");
    EXPECT(dsp_spmm_forward_values(c->op, 1 + rank, e, (1 + rank) * c->edges, c->n, cols, x, cols,
                                   y, cols),
           DSP_STATUS_ARGUMENT_MISMATCH, NULL);
  }
  /* Still in step: a good call after the failures. */
  EXPECT(dsp_spmm_forward_values(c->op, 2, e, e2, c->n, cols, x, cols, y, cols), DSP_STATUS_OK,
         NULL);

  /* The edge softmax is local: its errors are this rank's own. */
  EXPECT(dsp_edge_softmax(c->op, 0, 1.0f, e, out, 0), DSP_STATUS_INVALID_ARGUMENT, "groups = 0");
  EXPECT(dsp_edge_softmax(c->op, 2, 1.0f, e, out, e2 + 1), DSP_STATUS_INVALID_ARGUMENT,
         "count = ");
  EXPECT(dsp_edge_softmax(c->op, 2, (float)HUGE_VAL, e, out, e2), DSP_STATUS_INVALID_ARGUMENT,
         "negative_slope");
  EXPECT(dsp_edge_softmax(c->op, 2, 0.2f, e, NULL, e2), DSP_STATUS_NULL_ARGUMENT, "out (with");
  EXPECT(dsp_edge_softmax(c->op, 1, 0.2f, e, e + 1, c->edges), DSP_STATUS_INVALID_ARGUMENT,
         "overlap");
  EXPECT(dsp_edge_softmax_backward(c->op, 2, 0.2f, e, e, e, e, e2), DSP_STATUS_INVALID_ARGUMENT,
         "overlap");
  EXPECT(dsp_edge_softmax_backward(c->op, 2, 0.2f, e, NULL, e, out, e2),
         DSP_STATUS_NULL_ARGUMENT, "out (with");
  free(x), free(y), free(dv), free(e), free(out), free(ids);
}

/* Chunks written without edge weights: the per-edge products work, the weights are refused. */
static void test_without_weights(dsp_comm *comm, const char *dir) {
  dsp_chunk *chunk = NULL;
  dsp_spmm *op = NULL;
  size_t edges = 0;
  float *w;
  EXPECT(dsp_chunk_open(comm, dir, &chunk), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_create(comm, chunk, DSP_SCHEDULE_HALO, &op), DSP_STATUS_OK, NULL);
  dsp_chunk_free(chunk);
  if (op == NULL) return;
  EXPECT(dsp_spmm_edge_count(op, &edges), DSP_STATUS_OK, NULL);
  w = calloc(edges + 1, sizeof(float));
  EXPECT(dsp_spmm_edge_weights(op, w, edges), DSP_STATUS_INVALID_ARGUMENT,
         "re-run `distspmm partition`");
  EXPECT(dsp_edge_softmax(op, 1, 1.0f, w, w + edges, 0), DSP_STATUS_INVALID_ARGUMENT, "count");
  free(w);
  dsp_spmm_free(op);
}

int main(int argc, char **argv) {
  Ctx c;
  dsp_chunk *chunk = NULL;
  int schedule;
  if (argc != 5) {
    fprintf(stderr, "usage: %s DIR WEIGHT_SUM ADDED_LOOPS OLD_DIR\n", argv[0]);
    return 2;
  }
  memset(&c, 0, sizeof c);
  EXPECT(dsp_init(&c.comm), DSP_STATUS_OK, NULL);
  if (c.comm == NULL) return 1;
  EXPECT(dsp_comm_rank(c.comm, &my_rank), DSP_STATUS_OK, NULL);
  EXPECT(dsp_comm_size(c.comm, &c.size), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_open(c.comm, argv[1], &chunk), DSP_STATUS_OK, NULL);
  if (chunk == NULL) return 1;
  EXPECT(dsp_chunk_num_local_nodes(chunk, &c.n), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_num_global_nodes(chunk, &c.global), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_global_offset(chunk, &c.offset), DSP_STATUS_OK, NULL);
  for (schedule = DSP_SCHEDULE_HALO; schedule <= DSP_SCHEDULE_BROADCAST; schedule++) {
    EXPECT(dsp_spmm_create(c.comm, chunk, schedule, &c.op), DSP_STATUS_OK, NULL);
    if (c.op == NULL) break;
    EXPECT(dsp_spmm_edge_count(c.op, &c.edges), DSP_STATUS_OK, NULL);
    CHECK(c.edges >= c.n, "at least the self loops");
    c.rows = malloc((c.edges + 1) * sizeof(int64_t));
    c.sources = malloc((c.edges + 1) * sizeof(int64_t));
    EXPECT(dsp_spmm_edges(c.op, c.rows, c.sources, c.edges), DSP_STATUS_OK, NULL);
    test_layout(&c, atof(argv[2]), atof(argv[3]));
    test_values(&c, 1, 1);
    test_values(&c, 2, 0);
    test_sddmm(&c, 1);
    test_sddmm(&c, 2);
    test_softmax(&c, 1, 1.0f);
    test_softmax(&c, 2, 0.2f);
    test_statuses(&c);
    free(c.rows);
    free(c.sources);
    dsp_spmm_free(c.op);
    c.op = NULL;
  }
  dsp_chunk_free(chunk);
  test_without_weights(c.comm, argv[4]);
  EXPECT(dsp_finalize(c.comm), DSP_STATUS_OK, NULL);
  printf("edges_test: rank %u: %d checks, %d failed\n", my_rank, checks, failures);
  return failures == 0 ? 0 : 1;
}
