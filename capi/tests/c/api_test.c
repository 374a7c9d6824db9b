/*
 * C99 test of every function of distspmm.h (built and run by capi/tests/c_api.rs).
 *
 *   api_test nompi
 *       without MPI: versions, status strings, NULL arguments of every function.
 *   mpirun -n 2 api_test mpi DIR2 DIR3 DIRDIRECTED EMPTYDIR
 *       DIR2: a featured, labelled graph in 2 parts; DIR3: the same in 3 parts (opened under
 *       2 ranks: a parts mismatch); DIRDIRECTED: a directed graph without node data in 2 parts;
 *       EMPTYDIR: an existing directory without a manifest.
 *
 * Prints one line per failed check and exits non-zero if any failed.
 */
#include "check.h"

#include <math.h>
#include <stdlib.h>

static int test_without_mpi(void) {
  int code;
  char expected[32];
  dsp_comm *comm = (dsp_comm *)&code; /* must be overwritten with NULL */
  dsp_chunk *chunk = (dsp_chunk *)&code;
  dsp_spmm *op = (dsp_spmm *)&code;
  uint32_t u32 = 0;
  int32_t i32 = 0;
  size_t size = 0;
  uint64_t u64 = 0;
  float f = 1.0f;
  double d = 1.0;
  const float *fp = NULL;
  const int32_t *ip = NULL;
  const uint8_t *bp = NULL;
  const uint64_t *lp = NULL;

  CHECK(dsp_version() == DSP_VERSION_NUMBER, "header and library versions agree");
  sprintf(expected, "%d.%d.%d", DSP_VERSION_MAJOR, DSP_VERSION_MINOR, DSP_VERSION_PATCH);
  CHECK(strcmp(dsp_version_string(), expected) == 0, "version string");
  CHECK(strcmp(dsp_last_error(), "") == 0, "no error yet");
  for (code = DSP_STATUS_OK; code <= DSP_STATUS_DEVICE; code++) {
    CHECK(strlen(dsp_status_str(code)) > 0, "every status is described");
    CHECK(strcmp(dsp_status_str(code), "unknown status code") != 0, "known status");
  }
  CHECK(strcmp(dsp_status_str(DSP_STATUS_OK), "success") == 0, "OK says success");
  CHECK(strcmp(dsp_status_str(DSP_STATUS_DEVICE + 1), "unknown status code") == 0, "unknown");
  CHECK(strcmp(dsp_status_str(-1), "unknown status code") == 0, "negative status");
  CHECK(DSP_MASK_TRAIN == 1 && DSP_MASK_VAL == 2 && DSP_MASK_TEST == 4, "mask bits");
  CHECK(DSP_SCHEDULE_HALO == 0 && DSP_SCHEDULE_BROADCAST == 1, "schedule values");
  CHECK(DSP_COMM_PRECISION_F32 == 0 && DSP_COMM_PRECISION_BF16 == 1 &&
            DSP_COMM_PRECISION_F16 == 2,
        "precision values");

  /* NULL arguments everywhere; nothing here initialises MPI. */
  EXPECT(dsp_init(NULL), DSP_STATUS_NULL_ARGUMENT, "dsp_init: out is NULL");
  EXPECT(dsp_init_fortran(0, NULL), DSP_STATUS_NULL_ARGUMENT, "out is NULL");
  EXPECT(dsp_init_fortran(0, &comm), DSP_STATUS_MPI_ENVIRONMENT, "not initialised");
  CHECK(comm == NULL, "a failed init leaves NULL");
  EXPECT(dsp_finalize(NULL), DSP_STATUS_OK, NULL);
  EXPECT(dsp_comm_rank(NULL, &u32), DSP_STATUS_NULL_ARGUMENT, "comm (dsp_comm *) is NULL");
  EXPECT(dsp_comm_size(NULL, &u32), DSP_STATUS_NULL_ARGUMENT, "dsp_comm_size: comm");
  EXPECT(dsp_barrier(NULL), DSP_STATUS_NULL_ARGUMENT, "dsp_barrier: comm");
  EXPECT(dsp_allreduce_sum_f32(NULL, &f, 1), DSP_STATUS_NULL_ARGUMENT, "comm");
  EXPECT(dsp_allreduce_sum_f64(NULL, &d, 1), DSP_STATUS_NULL_ARGUMENT, "comm");
  EXPECT(dsp_chunk_open(NULL, "dir", &chunk), DSP_STATUS_NULL_ARGUMENT, "comm");
  CHECK(chunk == NULL, "a failed open leaves NULL");
  EXPECT(dsp_chunk_open(NULL, "dir", NULL), DSP_STATUS_NULL_ARGUMENT, "is NULL");
  dsp_chunk_free(NULL);
  EXPECT(dsp_chunk_part(NULL, &u32), DSP_STATUS_NULL_ARGUMENT, "dsp_chunk_part: chunk");
  EXPECT(dsp_chunk_num_parts(NULL, &u32), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_num_local_nodes(NULL, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_num_halo_rows(NULL, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_num_global_nodes(NULL, &u64), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_global_offset(NULL, &u64), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_num_features(NULL, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_num_classes(NULL, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_features(NULL, &fp, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_labels(NULL, &ip, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_masks(NULL, &bp, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_chunk_original_ids(NULL, &lp, &size), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_spmm_create(NULL, NULL, DSP_SCHEDULE_HALO, &op), DSP_STATUS_NULL_ARGUMENT, "comm");
  CHECK(op == NULL, "a failed create leaves NULL");
  op = (dsp_spmm *)&code;
  EXPECT(dsp_spmm_create_with_precision(NULL, NULL, DSP_SCHEDULE_HALO, DSP_COMM_PRECISION_BF16,
                                        &op),
         DSP_STATUS_NULL_ARGUMENT, "dsp_spmm_create_with_precision: comm");
  CHECK(op == NULL, "a failed create leaves NULL");
  EXPECT(dsp_spmm_comm_precision(NULL, &i32), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_spmm_forward(NULL, 1, 1, &f, 1, &f + 1, 1), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_spmm_backward(NULL, 1, 1, &f, 1, &f + 1, 1), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_spmm_bytes_last_call(NULL, &u64, &u64), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_spmm_edge_count(NULL, &size), DSP_STATUS_NULL_ARGUMENT, "dsp_spmm_edge_count: op");
  EXPECT(dsp_spmm_edges(NULL, NULL, NULL, 0), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_spmm_edge_weights(NULL, &f, 1), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_spmm_forward_values(NULL, 1, &f, 1, 1, 1, &f, 1, &f + 1, 1),
         DSP_STATUS_NULL_ARGUMENT, "dsp_spmm_forward_values: op");
  EXPECT(dsp_spmm_backward_values(NULL, 1, &f, 1, 1, 1, &f, 1, &f + 1, 1),
         DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_sddmm(NULL, 1, 1, 1, &f, 1, &f, 1, &f + 1, 1), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_sddmm_backward(NULL, 1, &f, 1, 1, 1, &f, 1, &f, 1, &f + 1, 1, &f + 2, 1),
         DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_edge_softmax(NULL, 1, 0.2f, &f, &f + 1, 1), DSP_STATUS_NULL_ARGUMENT, "op");
  EXPECT(dsp_edge_softmax_backward(NULL, 1, 0.2f, &f, &f, &f, &f + 1, 1),
         DSP_STATUS_NULL_ARGUMENT, "dsp_edge_softmax_backward: op");
  dsp_spmm_free(NULL);
  CHECK(strstr(dsp_last_error(), "dsp_edge_softmax_backward") != NULL, "free(NULL) is no error");
  return 0;
}

/* Sums a double over the ranks. */
static double sum_over_ranks(dsp_comm *comm, double value) {
  EXPECT(dsp_allreduce_sum_f64(comm, &value, 1), DSP_STATUS_OK, NULL);
  return value;
}

static void test_comm(dsp_comm *comm, uint32_t rank) {
  float f[2];
  double d[2];
  uint32_t u32 = 0;
  f[0] = (float)rank + 1.0f;
  f[1] = 10.0f * ((float)rank + 1.0f);
  d[0] = (double)rank + 1.0;
  d[1] = 0.5;
  EXPECT(dsp_barrier(comm), DSP_STATUS_OK, NULL);
  EXPECT(dsp_comm_rank(comm, NULL), DSP_STATUS_NULL_ARGUMENT, "rank is NULL");
  EXPECT(dsp_comm_size(comm, NULL), DSP_STATUS_NULL_ARGUMENT, "size is NULL");
  EXPECT(dsp_comm_size(comm, &u32), DSP_STATUS_OK, NULL);
  CHECK(u32 == 2, "two ranks");
  EXPECT(dsp_allreduce_sum_f32(comm, f, 2), DSP_STATUS_OK, NULL);
  CHECK(f[0] == 3.0f && f[1] == 30.0f, "f32 sum");
  EXPECT(dsp_allreduce_sum_f64(comm, d, 2), DSP_STATUS_OK, NULL);
  CHECK(d[0] == 3.0 && d[1] == 1.0, "f64 sum");
  EXPECT(dsp_allreduce_sum_f64(comm, NULL, 0), DSP_STATUS_OK, NULL);
  /* Different counts: every rank fails instead of hanging. */
  EXPECT(dsp_allreduce_sum_f32(comm, f, 1 + rank), DSP_STATUS_ARGUMENT_MISMATCH, "count = ");
  /* A NULL buffer on rank 1 only. */
  EXPECT(dsp_allreduce_sum_f64(comm, rank == 1 ? NULL : d, 2),
         rank == 1 ? DSP_STATUS_NULL_ARGUMENT : DSP_STATUS_PEER_FAILED,
         rank == 1 ? "buf (with 2 elements) is NULL" : "rank 1 failed");
  /* A misaligned buffer. */
  EXPECT(dsp_allreduce_sum_f64(comm, (double *)((char *)d + 1), 1), DSP_STATUS_INVALID_ARGUMENT,
         "aligned");
}

static void test_open_failures(dsp_comm *comm, uint32_t rank, const char *dir2, const char *dir3,
                               const char *empty) {
  dsp_chunk *chunk = NULL;
  dsp_spmm *op = NULL;
  size_t n = 0;
  EXPECT(dsp_chunk_open(comm, NULL, &chunk), DSP_STATUS_NULL_ARGUMENT, "dir is NULL");
  EXPECT(dsp_chunk_open(comm, dir2, NULL), DSP_STATUS_NULL_ARGUMENT, "out is NULL");
  EXPECT(dsp_chunk_open(comm, "", &chunk), DSP_STATUS_INVALID_ARGUMENT, "empty");
  EXPECT(dsp_chunk_open(comm, "/nonexistent/chunks", &chunk), DSP_STATUS_IO,
         "/nonexistent/chunks is not a directory");
  EXPECT(dsp_chunk_open(comm, empty, &chunk), DSP_STATUS_INVALID_CHUNK, "manifest.json");
  /* Only rank 1 is wrong: rank 0 hears about it. */
  EXPECT(dsp_chunk_open(comm, rank == 1 ? "/nonexistent/chunks" : dir2, &chunk),
         rank == 1 ? DSP_STATUS_IO : DSP_STATUS_PEER_FAILED,
         rank == 1 ? "not a directory" : "rank 1 failed");
  CHECK(chunk == NULL, "no chunk after a failed open");
  /* Ranks opening different partitions. */
  EXPECT(dsp_chunk_open(comm, rank == 1 ? dir3 : dir2, &chunk),
         rank == 1 ? DSP_STATUS_PARTS_MISMATCH : DSP_STATUS_PEER_FAILED,
         rank == 1 ? "made for 3 parts" : "rank 1 failed");
  /* 3 parts under 2 ranks: every rank gets the status and the message. */
  EXPECT(dsp_chunk_open(comm, dir3, &chunk), DSP_STATUS_PARTS_MISMATCH,
         "made for 3 parts but 2 ranks were started");
  CHECK(chunk == NULL, "no chunk after a parts mismatch");
  /* Use after the failed open: the NULL handle is rejected everywhere. */
  EXPECT(dsp_chunk_num_local_nodes(chunk, &n), DSP_STATUS_NULL_ARGUMENT, "chunk");
  EXPECT(dsp_spmm_create(comm, chunk, DSP_SCHEDULE_HALO, &op), DSP_STATUS_NULL_ARGUMENT,
         "chunk (dsp_chunk *) is NULL");
  CHECK(op == NULL, "no operator from a NULL chunk");
  dsp_chunk_free(chunk);
}

static void test_queries(dsp_comm *comm, const dsp_chunk *chunk, uint32_t rank) {
  uint32_t part = 99, parts = 0;
  size_t n = 0, halo = 0, f = 0, c = 0, len = 0, i;
  uint64_t global = 0, offset = 0;
  const float *x = NULL;
  const int32_t *labels = NULL;
  const uint8_t *masks = NULL;
  const uint64_t *ids = NULL;
  double id_sum = 0.0, train = 0.0, bad = 0.0, total, offset0, offset1, n0;

  EXPECT(dsp_chunk_part(chunk, &part), DSP_STATUS_OK, NULL);
  CHECK(part == rank, "part = rank");
  EXPECT(dsp_chunk_num_parts(chunk, &parts), DSP_STATUS_OK, NULL);
  CHECK(parts == 2, "two parts");
  EXPECT(dsp_chunk_num_local_nodes(chunk, &n), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_num_halo_rows(chunk, &halo), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_num_global_nodes(chunk, &global), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_global_offset(chunk, &offset), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_num_features(chunk, &f), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_num_classes(chunk, &c), DSP_STATUS_OK, NULL);
  CHECK(global == 240 && f == 6 && c == 4, "N, F, C of the test graph");
  CHECK(n > 0 && halo > 0 && halo < global, "local and halo rows");
  total = sum_over_ranks(comm, (double)n);
  CHECK(total == (double)global, "parts cover N");
  offset0 = sum_over_ranks(comm, rank == 0 ? (double)offset : 0.0);
  offset1 = sum_over_ranks(comm, rank == 1 ? (double)offset : 0.0);
  n0 = sum_over_ranks(comm, rank == 0 ? (double)n : 0.0);
  CHECK(offset0 == 0.0 && offset1 == n0, "part 0 starts at 0, part 1 after it");

  EXPECT(dsp_chunk_features(chunk, &x, &len), DSP_STATUS_OK, NULL);
  CHECK(x != NULL && len == n * f, "features are n_p x F");
  EXPECT(dsp_chunk_labels(chunk, &labels, &len), DSP_STATUS_OK, NULL);
  CHECK(labels != NULL && len == n, "a label per node");
  for (i = 0; i < n; i++) bad += (labels[i] < 0 || labels[i] >= (int32_t)c) ? 1.0 : 0.0;
  CHECK(bad == 0.0, "labels in 0..C");
  EXPECT(dsp_chunk_masks(chunk, &masks, &len), DSP_STATUS_OK, NULL);
  CHECK(masks != NULL && len == n, "a mask per node");
  for (i = 0; i < n; i++) {
    train += (masks[i] & DSP_MASK_TRAIN) ? 1.0 : 0.0;
    bad += (masks[i] & ~(DSP_MASK_TRAIN | DSP_MASK_VAL | DSP_MASK_TEST)) ? 1.0 : 0.0;
  }
  CHECK(bad == 0.0, "only the three mask bits");
  train = sum_over_ranks(comm, train);
  CHECK(train == 6.0 * 4.0, "CSBM: 240 / (10 x 4) = 6 training nodes per class");
  EXPECT(dsp_chunk_original_ids(chunk, &ids, &len), DSP_STATUS_OK, NULL);
  CHECK(ids != NULL && len == n, "an id per node");
  for (i = 0; i < n; i++) id_sum += (double)ids[i];
  id_sum = sum_over_ranks(comm, id_sum);
  CHECK(id_sum == (double)global * (double)(global - 1) / 2.0, "the ids add up to 0 + .. + N-1");

  EXPECT(dsp_chunk_part(chunk, NULL), DSP_STATUS_NULL_ARGUMENT, "out is NULL");
  EXPECT(dsp_chunk_num_global_nodes(chunk, NULL), DSP_STATUS_NULL_ARGUMENT, "out is NULL");
  EXPECT(dsp_chunk_features(chunk, NULL, &len), DSP_STATUS_NULL_ARGUMENT, "data is NULL");
  EXPECT(dsp_chunk_labels(chunk, &labels, NULL), DSP_STATUS_NULL_ARGUMENT, "len is NULL");
  EXPECT(dsp_chunk_masks(chunk, NULL, NULL), DSP_STATUS_NULL_ARGUMENT, "data is NULL");
  EXPECT(dsp_chunk_original_ids(chunk, NULL, &len), DSP_STATUS_NULL_ARGUMENT, "data");
}

/* <a, b> over the rank's n x cols blocks (leading dimensions lda, ldb), summed over ranks. */
static double dot(dsp_comm *comm, const float *a, size_t lda, const float *b, size_t ldb,
                  size_t n, size_t cols) {
  double s = 0.0;
  size_t i, j;
  for (i = 0; i < n; i++)
    for (j = 0; j < cols; j++) s += (double)a[i * lda + j] * (double)b[i * ldb + j];
  return sum_over_ranks(comm, s);
}

/* Forward/backward checks of one operator on the directed graph: argument errors, leading
 * dimensions, the adjoint identity <A x, v> = <x, A^T v>, the halo byte count. Returns A x
 * (n x cols, contiguous) for comparing schedules; the caller frees it. */
static float *test_operator(dsp_comm *comm, dsp_spmm *op, uint32_t rank, size_t n, size_t halo,
                            int schedule) {
  const size_t cols = 5, pad = 8;
  unsigned long state = 12345UL + rank;
  float *x = malloc(n * pad * sizeof(float));
  float *y = malloc(n * cols * sizeof(float));
  float *y_padded = malloc(n * pad * sizeof(float));
  float *v = malloc(n * cols * sizeof(float));
  float *w = malloc(n * pad * sizeof(float));
  size_t i, j;
  uint64_t sent = 0, received = 0;
  double lhs, rhs, same = 0.0;
  for (i = 0; i < n * pad; i++) x[i] = next_value(&state);
  for (i = 0; i < n * cols; i++) v[i] = next_value(&state);

  /* Wrong sizes, NULLs, overlap: every rank fails, none hangs. */
  EXPECT(dsp_spmm_forward(op, n + 1, cols, x, pad, y, cols), DSP_STATUS_INVALID_ARGUMENT,
         "owns");
  EXPECT(dsp_spmm_forward(op, n, cols, x, rank == 1 ? cols - 1 : pad, y, cols),
         rank == 1 ? DSP_STATUS_INVALID_ARGUMENT : DSP_STATUS_PEER_FAILED,
         rank == 1 ? "leading dimension of x is 4, less than cols = 5" : "rank 1 failed");
  EXPECT(dsp_spmm_forward(op, n, cols + rank, x, pad, y_padded, pad),
         DSP_STATUS_ARGUMENT_MISMATCH, "cols = 5");
  EXPECT(dsp_spmm_forward(op, n, cols, NULL, pad, y, cols), DSP_STATUS_NULL_ARGUMENT, "x (with");
  EXPECT(dsp_spmm_backward(op, n, cols, v, cols, NULL, cols), DSP_STATUS_NULL_ARGUMENT, "dx");
  EXPECT(dsp_spmm_forward(op, n, cols, x, pad, x + 1, pad), DSP_STATUS_INVALID_ARGUMENT,
         "overlap");
  EXPECT(dsp_spmm_backward(op, n, cols, v, cols, w, cols - 2), DSP_STATUS_INVALID_ARGUMENT,
         "leading dimension of dx");
  EXPECT(dsp_spmm_bytes_last_call(op, NULL, &received), DSP_STATUS_NULL_ARGUMENT, "sent");

  /* A padded input and output give the same product as contiguous ones. */
  EXPECT(dsp_spmm_forward(op, n, cols, x, pad, y, cols), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_bytes_last_call(op, &sent, &received), DSP_STATUS_OK, NULL);
  if (schedule == DSP_SCHEDULE_HALO) {
    CHECK(received == (uint64_t)halo * cols * sizeof(float), "halo: H x cols floats received");
  } else {
    CHECK(received > 0 && sent > 0, "broadcast moves bytes");
  }
  EXPECT(dsp_spmm_forward(op, n, cols, x, pad, y_padded, pad), DSP_STATUS_OK, NULL);
  for (i = 0; i < n; i++)
    for (j = 0; j < cols; j++) same += y[i * cols + j] == y_padded[i * pad + j] ? 0.0 : 1.0;
  CHECK(same == 0.0, "leading dimensions do not change the product");

  /* <A x, v> = <x, A^T v> over all ranks (A is not symmetric: the graph is directed). */
  EXPECT(dsp_spmm_backward(op, n, cols, v, cols, w, pad), DSP_STATUS_OK, NULL);
  lhs = dot(comm, y, cols, v, cols, n, cols);
  rhs = dot(comm, x, pad, w, pad, n, cols);
  CHECK(fabs(lhs - rhs) <= 1e-4 * (fabs(lhs) + 1.0), "adjoint identity");
  CHECK(fabs(lhs) > 1e-3, "a non-trivial product");

  /* Zero columns is a valid (empty) call. */
  EXPECT(dsp_spmm_forward(op, n, 0, x, pad, y, 0), DSP_STATUS_OK, NULL);

  free(x);
  free(y_padded);
  free(v);
  free(w);
  return y;
}

static void test_spmm(dsp_comm *comm, uint32_t rank, const char *dir_directed) {
  dsp_chunk *chunk = NULL;
  dsp_spmm *halo_op = NULL, *broadcast_op = NULL, *op = NULL;
  size_t n = 0, halo = 0, len = 7, i;
  const float *x = (const float *)&len;
  float *y_halo, *y_broadcast;
  double diff = 0.0;

  EXPECT(dsp_chunk_open(comm, dir_directed, &chunk), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_features(chunk, &x, &len), DSP_STATUS_NOT_PRESENT, "has no features");
  CHECK(x == NULL && len == 0, "no data without features");
  EXPECT(dsp_chunk_num_local_nodes(chunk, &n), DSP_STATUS_OK, NULL);
  EXPECT(dsp_chunk_num_halo_rows(chunk, &halo), DSP_STATUS_OK, NULL);

  EXPECT(dsp_spmm_create(comm, chunk, 7, &op), DSP_STATUS_INVALID_ARGUMENT,
         "schedule 7 is not a dsp_schedule");
  EXPECT(dsp_spmm_create(comm, chunk, rank == 1 ? -1 : DSP_SCHEDULE_HALO, &op),
         rank == 1 ? DSP_STATUS_INVALID_ARGUMENT : DSP_STATUS_PEER_FAILED,
         rank == 1 ? "schedule -1" : "rank 1 failed");
  EXPECT(dsp_spmm_create(comm, chunk, rank == 1 ? DSP_SCHEDULE_BROADCAST : DSP_SCHEDULE_HALO,
                         &op),
         DSP_STATUS_ARGUMENT_MISMATCH, "schedule broadcast");
  EXPECT(dsp_spmm_create(comm, chunk, DSP_SCHEDULE_HALO, NULL), DSP_STATUS_NULL_ARGUMENT, "out");
  CHECK(op == NULL, "no operator after failures");

  EXPECT(dsp_spmm_create(comm, chunk, DSP_SCHEDULE_HALO, &halo_op), DSP_STATUS_OK, NULL);
  EXPECT(dsp_spmm_create(comm, chunk, DSP_SCHEDULE_BROADCAST, &broadcast_op), DSP_STATUS_OK,
         NULL);
  /* The operators keep the chunk alive. */
  dsp_chunk_free(chunk);
  if (halo_op == NULL || broadcast_op == NULL) return;
  y_halo = test_operator(comm, halo_op, rank, n, halo, DSP_SCHEDULE_HALO);
  y_broadcast = test_operator(comm, broadcast_op, rank, n, halo, DSP_SCHEDULE_BROADCAST);
  for (i = 0; i < n * 5; i++) diff = fmax(diff, fabs((double)y_halo[i] - (double)y_broadcast[i]));
  CHECK(diff <= 1e-5, "halo and broadcast schedules agree");
  free(y_halo);
  free(y_broadcast);
  dsp_spmm_free(broadcast_op);
  /* The communicator may go first: the operator keeps it (and MPI) alive. */
  EXPECT(dsp_finalize(comm), DSP_STATUS_OK, NULL);
  {
    float *a = calloc(n * 2 + 1, sizeof(float));
    float *b = calloc(n * 2 + 1, sizeof(float));
    EXPECT(dsp_spmm_forward(halo_op, n, 2, a, 2, b, 2), DSP_STATUS_OK, NULL);
    free(a);
    free(b);
  }
  dsp_spmm_free(halo_op); /* the last handle: MPI is finalised here */
}

static int test_with_mpi(const char *dir2, const char *dir3, const char *dir_directed,
                         const char *empty) {
  dsp_comm *comm = NULL, *second = NULL;
  dsp_chunk *chunk = NULL;
  uint32_t rank = 99;
  EXPECT(dsp_init(&comm), DSP_STATUS_OK, NULL);
  if (comm == NULL) return 1;
  EXPECT(dsp_comm_rank(comm, &rank), DSP_STATUS_OK, NULL);
  my_rank = rank;
  test_comm(comm, rank);
  test_open_failures(comm, rank, dir2, dir3, empty);
  EXPECT(dsp_chunk_open(comm, dir2, &chunk), DSP_STATUS_OK, NULL);
  if (chunk != NULL) test_queries(comm, chunk, rank);
  dsp_chunk_free(chunk);
  /* A second communicator adopts MPI_COMM_WORLD and keeps the MPI that dsp_init started
   * alive after the first one is finalised. */
  EXPECT(dsp_init(&second), DSP_STATUS_OK, NULL);
  EXPECT(dsp_finalize(comm), DSP_STATUS_OK, NULL);
  comm = NULL;
  if (second == NULL) return 1;
  EXPECT(dsp_barrier(second), DSP_STATUS_OK, NULL);
  test_spmm(second, rank, dir_directed); /* finalises MPI once its last handle is freed */
  EXPECT(dsp_init(&comm), DSP_STATUS_MPI_ENVIRONMENT, "finalised");
  CHECK(comm == NULL, "no second life for MPI");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "nompi") == 0) {
    test_without_mpi();
  } else if (argc == 6 && strcmp(argv[1], "mpi") == 0) {
    test_with_mpi(argv[2], argv[3], argv[4], argv[5]);
  } else {
    fprintf(stderr, "usage: %s nompi | mpi DIR2 DIR3 DIRDIRECTED EMPTYDIR\n", argv[0]);
    return 2;
  }
  printf("api_test: rank %u: %d checks, %d failed\n", my_rank, checks, failures);
  return failures == 0 ? 0 : 1;
}
