// C++11 test of distspmm.h in a host that initialises MPI itself (built with mpicxx and run
// under `mpirun -n 2` by capi/tests/c_api.rs):
//   api_test_cpp DIR2
// adopting the host's communicator by its Fortran handle, adopting MPI_COMM_WORLD through
// dsp_init, a parts mismatch under an adopted sub-communicator, the thread rules of dsp_comm /
// dsp_chunk / dsp_spmm, handles used after the host's MPI_Finalize, and RAII ownership with
// std::unique_ptr.
#include <distspmm.h>
// Only MPI's C interface (its deprecated C++ bindings do not compile cleanly with -Wextra).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

int rank_ = -1;
int checks = 0;
int failures = 0;

void check(bool ok, const char *what, int line) {
  ++checks;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "rank %d: line %d: %s failed; last error: %s\n", rank_, line, what,
                 dsp_last_error());
  }
}
#define CHECK(cond) check((cond), #cond, __LINE__)

void expect(dsp_status got, dsp_status want, const char *text, const char *call, int line) {
  ++checks;
  if (got != want) {
    ++failures;
    std::fprintf(stderr, "rank %d: line %d: %s returned %s, expected %s; last error: %s\n", rank_,
                 line, call, dsp_status_str(got), dsp_status_str(want), dsp_last_error());
  } else if (text != nullptr && std::strstr(dsp_last_error(), text) == nullptr) {
    ++failures;
    std::fprintf(stderr, "rank %d: line %d: %s: \"%s\" does not contain \"%s\"\n", rank_, line,
                 call, dsp_last_error(), text);
  }
}
#define EXPECT(call, want, text) expect((call), (want), (text), #call, __LINE__)

struct ChunkFree {
  void operator()(dsp_chunk *c) const { dsp_chunk_free(c); }
};
struct SpmmFree {
  void operator()(dsp_spmm *s) const { dsp_spmm_free(s); }
};
struct CommFree {
  void operator()(dsp_comm *c) const { dsp_finalize(c); }
};
using ChunkPtr = std::unique_ptr<dsp_chunk, ChunkFree>;
using SpmmPtr = std::unique_ptr<dsp_spmm, SpmmFree>;
using CommPtr = std::unique_ptr<dsp_comm, CommFree>;

CommPtr adopt(MPI_Comm comm) {
  dsp_comm *raw = nullptr;
  EXPECT(dsp_init_fortran(static_cast<int32_t>(MPI_Comm_c2f(comm)), &raw), DSP_STATUS_OK,
         nullptr);
  return CommPtr(raw);
}

void test_adoption(const char *dir2) {
  CommPtr comm = adopt(MPI_COMM_WORLD);
  uint32_t rank = 99, size = 0;
  EXPECT(dsp_comm_rank(comm.get(), &rank), DSP_STATUS_OK, nullptr);
  EXPECT(dsp_comm_size(comm.get(), &size), DSP_STATUS_OK, nullptr);
  CHECK(static_cast<int>(rank) == rank_ && size == 2);

  // dsp_init with MPI already up adopts MPI_COMM_WORLD (and never finalises it).
  dsp_comm *world = nullptr;
  EXPECT(dsp_init(&world), DSP_STATUS_OK, nullptr);
  CommPtr world_ptr(world);
  EXPECT(dsp_comm_size(world, &size), DSP_STATUS_OK, nullptr);
  CHECK(size == 2);

  // A Fortran handle that names no communicator.
  dsp_comm *bad = reinterpret_cast<dsp_comm *>(&rank);
  EXPECT(dsp_init_fortran(123456, &bad), DSP_STATUS_MPI_ENVIRONMENT, "names no MPI communicator");
  CHECK(bad == nullptr);

  // A one-rank sub-communicator per process: the 2-part directory does not fit it.
  MPI_Comm single;
  MPI_Comm_split(MPI_COMM_WORLD, rank_, 0, &single);
  {
    CommPtr one = adopt(single);
    dsp_chunk *chunk = nullptr;
    EXPECT(dsp_chunk_open(one.get(), dir2, &chunk), DSP_STATUS_PARTS_MISMATCH,
           "made for 2 parts but 1 rank was started");
    CHECK(chunk == nullptr);
  }
  MPI_Comm_free(&single);

  // The adopted communicator works for collectives next to the host's own traffic.
  std::vector<double> grad{1.0, static_cast<double>(rank_)};
  EXPECT(dsp_allreduce_sum_f64(comm.get(), grad.data(), grad.size()), DSP_STATUS_OK, nullptr);
  int host_sum = 0, one = 1;
  MPI_Allreduce(&one, &host_sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(grad[0] == 2.0 && grad[1] == 1.0 && host_sum == 2);
}

void test_threads(const char *dir2) {
  CommPtr comm = adopt(MPI_COMM_WORLD);
  dsp_chunk *raw_chunk = nullptr;
  EXPECT(dsp_chunk_open(comm.get(), dir2, &raw_chunk), DSP_STATUS_OK, nullptr);
  ChunkPtr chunk(raw_chunk);
  dsp_spmm *raw_op = nullptr;
  EXPECT(dsp_spmm_create(comm.get(), chunk.get(), DSP_SCHEDULE_HALO, &raw_op), DSP_STATUS_OK,
         nullptr);
  SpmmPtr op(raw_op);
  size_t n = 0;
  EXPECT(dsp_chunk_num_local_nodes(chunk.get(), &n), DSP_STATUS_OK, nullptr);
  std::vector<float> x(n * 3, 1.0f), y(n * 3, 0.0f);

  EXPECT(dsp_chunk_part(nullptr, nullptr), DSP_STATUS_NULL_ARGUMENT, "chunk");
  std::string main_error = dsp_last_error();
  std::thread other([&] {
    // Chunks are immutable: any thread may read them.
    size_t m = 0;
    const float *features = nullptr;
    size_t len = 0;
    EXPECT(dsp_chunk_num_local_nodes(chunk.get(), &m), DSP_STATUS_OK, nullptr);
    EXPECT(dsp_chunk_features(chunk.get(), &features, &len), DSP_STATUS_OK, nullptr);
    CHECK(m == n && len == n * 6);
    // Communicators and operators belong to their thread (MPI_THREAD_FUNNELED).
    EXPECT(dsp_barrier(comm.get()), DSP_STATUS_WRONG_THREAD, "MPI_THREAD_FUNNELED");
    EXPECT(dsp_spmm_forward(op.get(), n, 3, x.data(), 3, y.data(), 3), DSP_STATUS_WRONG_THREAD,
           "dsp_spmm_forward: this dsp_spmm belongs");
    float g = 1.0f;
    EXPECT(dsp_allreduce_sum_f32(comm.get(), &g, 1), DSP_STATUS_WRONG_THREAD, "thread");
    EXPECT(dsp_finalize(comm.get()), DSP_STATUS_WRONG_THREAD, "dsp_finalize");
    // The per-edge layout is a query (any thread); the per-edge calls are the operator's.
    size_t edges = 0;
    EXPECT(dsp_spmm_edge_count(op.get(), &edges), DSP_STATUS_OK, nullptr);
    CHECK(edges >= n);
    std::vector<float> e(edges, 0.5f), soft(edges);
    EXPECT(dsp_sddmm(op.get(), 1, n, 3, x.data(), 3, y.data(), 3, e.data(), edges),
           DSP_STATUS_WRONG_THREAD, "dsp_sddmm: this dsp_spmm belongs");
    EXPECT(dsp_spmm_forward_values(op.get(), 1, e.data(), edges, n, 3, x.data(), 3, y.data(), 3),
           DSP_STATUS_WRONG_THREAD, "belongs");
    EXPECT(dsp_edge_softmax(op.get(), 1, 0.2f, e.data(), soft.data(), edges),
           DSP_STATUS_WRONG_THREAD, "dsp_edge_softmax: this dsp_spmm belongs");
    dsp_spmm_free(op.get());  // refused: the handle stays valid
    CHECK(std::strstr(dsp_last_error(), "dsp_spmm_free") != nullptr);
  });
  other.join();
  // The last error is per thread.
  CHECK(main_error == dsp_last_error());
  // Everything still works on the owning thread.
  EXPECT(dsp_spmm_forward(op.get(), n, 3, x.data(), 3, y.data(), 3), DSP_STATUS_OK, nullptr);
  double row_sums = 0.0;
  for (float v : y) row_sums += v;
  CHECK(row_sums > 0.0);
  EXPECT(dsp_barrier(comm.get()), DSP_STATUS_OK, nullptr);
}

// Handles that outlive the host's MPI_Finalize: using them is an error, not an abort (MPI
// aborts the process on calls after MPI_Finalize); freeing them is fine.
void test_after_host_finalize(const char *dir2) {
  CommPtr late = adopt(MPI_COMM_WORLD);
  dsp_chunk *raw_chunk = nullptr;
  EXPECT(dsp_chunk_open(late.get(), dir2, &raw_chunk), DSP_STATUS_OK, nullptr);
  ChunkPtr chunk(raw_chunk);
  dsp_spmm *raw_op = nullptr;
  EXPECT(dsp_spmm_create(late.get(), chunk.get(), DSP_SCHEDULE_BROADCAST, &raw_op),
         DSP_STATUS_OK, nullptr);
  SpmmPtr op(raw_op);
  size_t n = 0;
  EXPECT(dsp_chunk_num_local_nodes(chunk.get(), &n), DSP_STATUS_OK, nullptr);
  std::vector<float> x(n * 2, 1.0f), y(n * 2, 0.0f);
  MPI_Finalize();
  EXPECT(dsp_barrier(late.get()), DSP_STATUS_MPI_ENVIRONMENT, "MPI has been finalised");
  float g = 1.0f;
  EXPECT(dsp_allreduce_sum_f32(late.get(), &g, 1), DSP_STATUS_MPI_ENVIRONMENT, "finalised");
  dsp_chunk *again = nullptr;
  EXPECT(dsp_chunk_open(late.get(), dir2, &again), DSP_STATUS_MPI_ENVIRONMENT, "finalised");
  EXPECT(dsp_spmm_forward(op.get(), n, 2, x.data(), 2, y.data(), 2), DSP_STATUS_MPI_ENVIRONMENT,
         "finalised");
  dsp_comm *fresh = nullptr;
  EXPECT(dsp_init(&fresh), DSP_STATUS_MPI_ENVIRONMENT, "finalised");
  uint32_t rank = 99;
  EXPECT(dsp_comm_rank(late.get(), &rank), DSP_STATUS_OK, nullptr);
  CHECK(static_cast<int>(rank) == rank_);
  op.reset();
  EXPECT(dsp_finalize(late.release()), DSP_STATUS_OK, nullptr);
}

}  // namespace

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR2\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  CHECK(dsp_version() == DSP_VERSION_NUMBER);
  test_adoption(argv[1]);
  test_threads(argv[1]);
  // The library never finalised the host's MPI.
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);
  test_after_host_finalize(argv[1]);
  std::printf("api_test_cpp: rank %d: %d checks, %d failed\n", rank_, checks, failures);
  return failures == 0 ? 0 : 1;
}
