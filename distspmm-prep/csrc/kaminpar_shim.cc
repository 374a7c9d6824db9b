// A C entry point into the KaMinPar library that the `kaminpar` crate (0.2) vendors and builds
// (with KAMINPAR_64BIT_EDGE_IDS). The crate's own Rust API copies the graph through petgraph,
// cannot bound the thread count and lets KaMinPar log to stdout; this shim hands KaMinPar our
// CSR arrays without a copy, caps TBB's threads with a global_control, silences std::cout for
// the call and turns every C++ exception into an error code, so nothing unwinds into Rust.

#include <getopt.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <new>
#include <random>
#include <string>

#include <mutex>
#include <set>
#include <thread>

#include <tbb/global_control.h>
#include <tbb/task_scheduler_observer.h>

// The public API of vendor/KaMinPar/library/libkaminpar.h as the crate builds it (64-bit edge
// ids, 64-bit edge weights), declared here because the crate exports no include path.
namespace libkaminpar {
using NodeID = uint32_t;
using EdgeID = uint64_t;
using BlockID = uint32_t;
using NodeWeight = int32_t;
using EdgeWeight = int64_t;

class Partitioner {
  friend class PartitionerBuilder;

public:
  Partitioner();
  ~Partitioner();

  Partitioner &set_option(const std::string &name, const std::string &value);
  std::unique_ptr<BlockID[]> partition(BlockID k) const;
  std::unique_ptr<BlockID[]> partition(BlockID k, EdgeWeight &edge_cut) const;
  std::size_t partition_size() const;

private:
  struct PartitionerPrivate *_pimpl;
};

class PartitionerBuilder {
public:
  PartitionerBuilder(const PartitionerBuilder &) = delete;
  PartitionerBuilder &operator=(const PartitionerBuilder &) = delete;
  PartitionerBuilder(PartitionerBuilder &&) noexcept = default;
  PartitionerBuilder &operator=(PartitionerBuilder &&) noexcept = default;
  ~PartitionerBuilder();

  static PartitionerBuilder from_graph_file(const std::string &filename);
  static PartitionerBuilder from_adjacency_array(NodeID n, EdgeID *nodes, NodeID *edges);

  void with_node_weights(NodeWeight *node_weights);
  void with_edge_weights(EdgeWeight *edge_weights);
  Partitioner create();
  Partitioner rearrange_and_create();

private:
  PartitionerBuilder();

private:
  struct PartitionerBuilderPrivate *_pimpl;
};
} // namespace libkaminpar

// KaMinPar's random generators are per-thread std::mt19937s, each seeded from this static the
// first time its thread draws (kaminpar::Randomize::seed, utility/random.cc); its library API
// ignores the --seed option. Bound by its mangled name rather than by redeclaring the class.
extern int kaminpar_randomize_seed __asm__("_ZN8kaminpar9Randomize4seedE");

// kaminpar::Randomize (utility/random.h of the vendored version, pinned by `=0.2.0`), member for
// member, so its generator can be reseeded: a per-thread mt19937, a bool distribution, and 1024
// precomputed random bools with their cursor. Same types in the same order, built by the same
// compiler: the same layout.
struct RandomizeLayout {
  std::mt19937 generator;
  std::uniform_int_distribution<int> bool_dist;
  std::size_t next_random_bool;
  bool random_bools[1024];
};

// kaminpar::ip::InitialCoarsener::_random_permutations, a process-wide static whose first member
// is a reference to the Randomize of the thread that ran the static initialisers. Every
// coarsening draws from that generator, so without a reseed each call continues where the last
// one stopped and no two calls give the same partition.
struct PermutationsHead {
  RandomizeLayout *rand;
};
extern PermutationsHead kaminpar_initial_coarsener_permutations __asm__(
    "_ZN8kaminpar2ip16InitialCoarsener20_random_permutationsE");

// kaminpar::Randomize::instance(): the calling thread's Randomize, created from
// Randomize::seed the first time that thread asks.
RandomizeLayout &kaminpar_randomize_instance() __asm__("_ZN8kaminpar9Randomize8instanceEv");

namespace {
// Restores std::cout's buffer and state however the call ends.
class MuteStdout {
public:
  MuteStdout() : _saved(std::cout.rdbuf(nullptr)) {}
  ~MuteStdout() {
    std::cout.rdbuf(_saved);
    std::cout.clear();
  }
  MuteStdout(const MuteStdout &) = delete;
  MuteStdout &operator=(const MuteStdout &) = delete;

private:
  std::streambuf *_saved;
};

// Puts a Randomize back in the state its constructor gives it for `seed`.
void reseed(RandomizeLayout &rand, int seed) {
  rand.generator.seed(static_cast<std::mt19937::result_type>(seed));
  rand.bool_dist.reset();
  rand.next_random_bool = 0;
  std::uniform_int_distribution<int> dist(0, 1);
  for (bool &b : rand.random_bools) {
    b = dist(rand.generator) != 0;
  }
}

// TBB's worker threads outlive a call, and with them their Randomize: reseeds each thread the
// first time it joins the call's work, so every call starts every generator from `seed`.
class ReseedWorkers : public tbb::task_scheduler_observer {
public:
  explicit ReseedWorkers(int seed) : _seed(seed) { observe(true); }
  ~ReseedWorkers() override { observe(false); }
  ReseedWorkers(const ReseedWorkers &) = delete;
  ReseedWorkers &operator=(const ReseedWorkers &) = delete;

  void on_scheduler_entry(bool /*is_worker*/) override {
    std::lock_guard<std::mutex> lock(_mutex);
    if (_seen.insert(std::this_thread::get_id()).second) {
      reseed(kaminpar_randomize_instance(), _seed);
    }
  }

private:
  int _seed;
  std::mutex _mutex;
  std::set<std::thread::id> _seen;
};

// Partitioner::set_option parses "--name value" with getopt_long, which resumes at the global
// `optind`: without a reset only the process's first option is read and every later one is
// silently ignored. optind = 0 makes glibc's getopt start afresh.
void set_option(libkaminpar::Partitioner &partitioner, const char *name, const std::string &value) {
  optind = 0;
  partitioner.set_option(name, value);
}

void copy_message(const char *what, char *message, std::size_t capacity) {
  if (capacity == 0) {
    return;
  }
  std::strncpy(message, what, capacity - 1);
  message[capacity - 1] = '\0';
}
} // namespace

// Partitions the symmetric CSR graph (n nodes, row offsets xadj[0..=n], neighbours adjncy) into
// k blocks; writes block ids to part[0..n]. node_weights may be null (unit weights); seed must
// fit an int (the caller checks). Every generator KaMinPar draws from is reseeded from `seed`
// first, so threads = 1 gives the same partition every call (more threads race). KaMinPar
// reads the arrays in place and may not write them; they are not const only because its API
// takes plain pointers. Returns 0 on success, otherwise 1 with a message in `message`.
extern "C" int distspmm_kaminpar_partition(uint32_t n, uint64_t *xadj, uint32_t *adjncy,
                                           int32_t *node_weights, uint32_t k, uint64_t seed,
                                           std::size_t threads, uint32_t *part, char *message,
                                           std::size_t capacity) {
  try {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    kaminpar_randomize_seed = static_cast<int>(seed);
    if (kaminpar_initial_coarsener_permutations.rand != nullptr) {
      reseed(*kaminpar_initial_coarsener_permutations.rand, static_cast<int>(seed));
    }
    ReseedWorkers reseed_workers(static_cast<int>(seed));
    reseed(kaminpar_randomize_instance(), static_cast<int>(seed));
    MuteStdout mute;
    auto builder = libkaminpar::PartitionerBuilder::from_adjacency_array(n, xadj, adjncy);
    if (node_weights != nullptr) {
      builder.with_node_weights(node_weights);
    }
    libkaminpar::Partitioner partitioner = builder.create();
    set_option(partitioner, "--threads", std::to_string(threads));
    set_option(partitioner, "--seed", std::to_string(seed));
    std::unique_ptr<libkaminpar::BlockID[]> blocks = partitioner.partition(k);
    if (!blocks || partitioner.partition_size() != n) {
      copy_message("KaMinPar returned no partition", message, capacity);
      return 1;
    }
    std::memcpy(part, blocks.get(), sizeof(uint32_t) * static_cast<std::size_t>(n));
    return 0;
  } catch (const std::bad_alloc &) {
    copy_message("KaMinPar ran out of memory", message, capacity);
  } catch (const std::exception &e) {
    copy_message(e.what(), message, capacity);
  } catch (...) {
    copy_message("KaMinPar failed with an unknown exception", message, capacity);
  }
  return 1;
}
