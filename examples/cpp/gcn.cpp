// A distributed 2-layer GCN (Kipf & Welling) trained through libdistspmm's C ABI.
//
//   mpirun -n P distspmm_gcn --chunks DIR [--epochs 200] [--hidden 16] [--lr 0.01]
//       [--weight-decay 5e-4] [--dropout 0.5] [--seed 1] [--schedule halo|broadcast]
//
// DIR is a chunk directory from `distspmm partition --parts P` (features, labels and masks
// required). Each rank holds its part's rows; the model is
//     Z = Ahat * relu(Ahat * drop(X) * W1 + b1) * W2 + b2   (drop() only in training)
// with X row-normalised, softmax cross-entropy averaged over the training nodes of ALL ranks
// (so any P optimises the same objective), Adam with L2 weight decay on the first layer, and
// the weight gradients summed across ranks with dsp_allreduce_sum_f32. Every rank applies the
// same update, so the weights stay identical. Accuracies are summed across ranks.
//
// Includes only distspmm.h and links only libdistspmm.so. Rank 0 prints progress and, last,
// a line "... test_acc=<value>".
#include <distspmm.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Throws with the library's message when a call fails (every rank fails together: the
// library agrees on errors across ranks before any collective).
void check(dsp_status status, const char *call) {
  if (status != DSP_STATUS_OK) {
    throw std::runtime_error(std::string(call) + ": " + dsp_status_str(status) + ": " +
                             dsp_last_error());
  }
}
#define DSP_CHECK(call) check((call), #call)

struct Options {
  std::string chunks;
  int epochs = 200;
  size_t hidden = 16;
  float lr = 0.01f;
  float weight_decay = 5e-4f;
  float dropout = 0.5f;
  uint64_t seed = 1;
  int32_t schedule = DSP_SCHEDULE_HALO;
};

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--chunks") o.chunks = value();
    else if (a == "--epochs") o.epochs = std::stoi(value());
    else if (a == "--hidden") o.hidden = std::stoul(value());
    else if (a == "--lr") o.lr = std::stof(value());
    else if (a == "--weight-decay") o.weight_decay = std::stof(value());
    else if (a == "--dropout") o.dropout = std::stof(value());
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--schedule") {
      std::string s = value();
      if (s == "halo") o.schedule = DSP_SCHEDULE_HALO;
      else if (s == "broadcast") o.schedule = DSP_SCHEDULE_BROADCAST;
      else throw std::runtime_error("--schedule is halo or broadcast, not " + s);
    } else {
      throw std::runtime_error("unknown argument " + a + " (see the comment atop gcn.cpp)");
    }
  }
  if (o.chunks.empty()) throw std::runtime_error("--chunks DIR is required");
  if (o.dropout < 0.0f || o.dropout >= 1.0f) throw std::runtime_error("--dropout in [0, 1)");
  return o;
}

// A parameter tensor with its Adam state.
struct Param {
  std::vector<float> w, m, v;
  float decay;
  Param(size_t n, float decay_) : w(n, 0.0f), m(n, 0.0f), v(n, 0.0f), decay(decay_) {}

  // Glorot/Xavier uniform for a fan_in x fan_out weight; same seed, same values on all ranks.
  void glorot(size_t fan_in, size_t fan_out, std::mt19937_64 &rng) {
    float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
    std::uniform_real_distribution<float> u(-limit, limit);
    for (float &x : w) x = u(rng);
  }

  // One Adam step (PyTorch's: L2 weight decay added to the gradient, bias-corrected moments).
  void adam(const float *grad, float lr, int step) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(step));
    const float c2 = 1.0f - std::pow(b2, static_cast<float>(step));
    for (size_t i = 0; i < w.size(); ++i) {
      float g = grad[i] + decay * w[i];
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

// Node features as rows of non-zeros (bag-of-words features are ~99% zeros on Cora), so the
// products with W1 and the input dropout cost O(nnz) rather than O(n x F).
struct SparseRows {
  size_t rows = 0, cols = 0;
  std::vector<size_t> ptr{0};
  std::vector<uint32_t> col;
  std::vector<float> val;

  SparseRows() = default;
  SparseRows(const float *dense, size_t n, size_t f) : rows(n), cols(f) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < f; ++j) {
        if (dense[i * f + j] != 0.0f) {
          col.push_back(static_cast<uint32_t>(j));
          val.push_back(dense[i * f + j]);
        }
      }
      ptr.push_back(col.size());
    }
  }

  // out (rows x k) = this * b (cols x k).
  void times(const float *b, float *out, size_t k) const {
    std::fill(out, out + rows * k, 0.0f);
    for (size_t i = 0; i < rows; ++i)
      for (size_t e = ptr[i]; e < ptr[i + 1]; ++e) {
        const float x = val[e], *row = b + col[e] * k;
        for (size_t c = 0; c < k; ++c) out[i * k + c] += x * row[c];
      }
  }

  // grad (cols x k) = this^T * d (rows x k).
  void transpose_times(const float *d, float *grad, size_t k) const {
    std::fill(grad, grad + cols * k, 0.0f);
    for (size_t i = 0; i < rows; ++i)
      for (size_t e = ptr[i]; e < ptr[i + 1]; ++e) {
        const float x = val[e];
        float *g = grad + col[e] * k;
        for (size_t c = 0; c < k; ++c) g[c] += x * d[i * k + c];
      }
  }
};

// out (n x k) = a (n x m) * b (m x k), dense.
void matmul(const float *a, const float *b, float *out, size_t n, size_t m, size_t k) {
  std::fill(out, out + n * k, 0.0f);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) {
      const float x = a[i * m + j], *row = b + j * k;
      for (size_t c = 0; c < k; ++c) out[i * k + c] += x * row[c];
    }
}

// grad (m x k) = a^T (m x n) * d (n x k), a being n x m, dense.
void matmul_at(const float *a, const float *d, float *grad, size_t n, size_t m, size_t k) {
  std::fill(grad, grad + m * k, 0.0f);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) {
      const float x = a[i * m + j];
      float *g = grad + j * k;
      for (size_t c = 0; c < k; ++c) g[c] += x * d[i * k + c];
    }
}

// out (n x m) = d (n x k) * b^T, b being m x k.
void matmul_bt(const float *d, const float *b, float *out, size_t n, size_t k, size_t m) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < m; ++j) {
      float s = 0.0f;
      for (size_t c = 0; c < k; ++c) s += d[i * k + c] * b[j * k + c];
      out[i * m + j] = s;
    }
  }
}

// Inverted dropout: zeroes each value with probability p and scales the rest by 1/(1-p);
// `keep` (if given) records the factor applied per value for the backward pass.
void dropout(std::vector<float> &x, std::vector<float> *keep, float p, std::mt19937_64 &rng) {
  if (keep != nullptr) keep->resize(x.size());
  std::bernoulli_distribution drop(p);
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < x.size(); ++i) {
    const float factor = drop(rng) ? 0.0f : scale;
    x[i] *= factor;
    if (keep != nullptr) (*keep)[i] = factor;
  }
}

class Trainer {
 public:
  Trainer(dsp_comm *comm, dsp_chunk *chunk, dsp_spmm *op, const Options &o)
      : comm_(comm), op_(op), o_(o), w1_(0, o.weight_decay), b1_(0, o.weight_decay),
        w2_(0, 0.0f), b2_(0, 0.0f) {
    uint32_t rank = 0;
    DSP_CHECK(dsp_comm_rank(comm, &rank));
    DSP_CHECK(dsp_chunk_num_local_nodes(chunk, &n_));
    DSP_CHECK(dsp_chunk_num_features(chunk, &f_));
    DSP_CHECK(dsp_chunk_num_classes(chunk, &c_));
    const float *features = nullptr;
    const int32_t *labels = nullptr;
    const uint8_t *masks = nullptr;
    size_t len = 0;
    DSP_CHECK(dsp_chunk_features(chunk, &features, &len));
    DSP_CHECK(dsp_chunk_labels(chunk, &labels, &len));
    DSP_CHECK(dsp_chunk_masks(chunk, &masks, &len));
    labels_.assign(labels, labels + n_);
    masks_.assign(masks, masks + n_);
    // Row-normalised features (each row sums to 1), as in the GCN paper.
    std::vector<float> x(features, features + n_ * f_);
    for (size_t i = 0; i < n_; ++i) {
      float sum = 0.0f;
      for (size_t j = 0; j < f_; ++j) sum += x[i * f_ + j];
      if (sum > 0.0f)
        for (size_t j = 0; j < f_; ++j) x[i * f_ + j] /= sum;
    }
    x_ = SparseRows(x.data(), n_, f_);
    const size_t h = o.hidden;
    w1_ = Param(f_ * h, o.weight_decay);
    b1_ = Param(h, o.weight_decay);
    w2_ = Param(h * c_, 0.0f);
    b2_ = Param(c_, 0.0f);
    std::mt19937_64 init(o.seed);  // identical on every rank
    w1_.glorot(f_, h, init);
    w2_.glorot(h, c_, init);
    dropout_rng_.seed(o.seed * 7919 + rank);  // independent masks per rank
    double train = 0.0;
    for (uint8_t m : masks_) train += (m & DSP_MASK_TRAIN) ? 1.0 : 0.0;
    DSP_CHECK(dsp_allreduce_sum_f64(comm_, &train, 1));
    train_total_ = train;
    if (train_total_ == 0.0) throw std::runtime_error("no training nodes on any rank");
  }

  // One epoch: forward with dropout, loss over all ranks' training nodes, backward, summed
  // gradients, Adam. Returns the global mean training loss.
  double train_epoch(int step) {
    const size_t n = n_, f = f_, h = o_.hidden, c = c_;
    // Dropping a zero feature changes nothing: the input dropout acts on the non-zeros only.
    SparseRows xd = x_;
    std::vector<float> keep_h;
    if (o_.dropout > 0.0f) dropout(xd.val, nullptr, o_.dropout, dropout_rng_);
    // Layer 1: Z1 = Ahat (Xd W1) + b1, H1 = relu(Z1).
    std::vector<float> t1(n * h), z1(n * h);
    xd.times(w1_.w.data(), t1.data(), h);
    DSP_CHECK(dsp_spmm_forward(op_, n, h, t1.data(), h, z1.data(), h));
    std::vector<float> h1(n * h);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < h; ++j) {
        z1[i * h + j] += b1_.w[j];
        h1[i * h + j] = std::max(z1[i * h + j], 0.0f);
      }
    if (o_.dropout > 0.0f) dropout(h1, &keep_h, o_.dropout, dropout_rng_);
    // Layer 2: Z2 = Ahat (H1d W2) + b2.
    std::vector<float> t2(n * c), z2(n * c);
    matmul(h1.data(), w2_.w.data(), t2.data(), n, h, c);
    DSP_CHECK(dsp_spmm_forward(op_, n, c, t2.data(), c, z2.data(), c));
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < c; ++j) z2[i * c + j] += b2_.w[j];

    // Softmax cross-entropy over the training nodes of all ranks: dZ2 = (p - onehot) / N_train.
    double loss = 0.0;
    std::vector<float> dz2(n * c, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      if (!(masks_[i] & DSP_MASK_TRAIN)) continue;
      const float *z = &z2[i * c];
      float mx = *std::max_element(z, z + c);
      double sum = 0.0;
      for (size_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(z[j] - mx));
      for (size_t j = 0; j < c; ++j) {
        double p = std::exp(static_cast<double>(z[j] - mx)) / sum;
        double y = static_cast<size_t>(labels_[i]) == j ? 1.0 : 0.0;
        dz2[i * c + j] = static_cast<float>((p - y) / train_total_);
      }
      loss -= static_cast<double>(z[labels_[i]] - mx) - std::log(sum);
    }

    // Backward. All gradients go into one buffer: a single all-reduce per epoch.
    const size_t n_w1 = f * h, n_b1 = h, n_w2 = h * c, n_b2 = c;
    std::vector<float> grads(n_w1 + n_b1 + n_w2 + n_b2, 0.0f);
    float *g_w1 = grads.data(), *g_b1 = g_w1 + n_w1, *g_w2 = g_b1 + n_b1, *g_b2 = g_w2 + n_w2;
    std::vector<float> dt2(n * c);
    DSP_CHECK(dsp_spmm_backward(op_, n, c, dz2.data(), c, dt2.data(), c));
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < c; ++j) g_b2[j] += dz2[i * c + j];
    matmul_at(h1.data(), dt2.data(), g_w2, n, h, c);
    std::vector<float> dz1(n * h);
    matmul_bt(dt2.data(), w2_.w.data(), dz1.data(), n, c, h);
    for (size_t k = 0; k < n * h; ++k) {
      if (o_.dropout > 0.0f) dz1[k] *= keep_h[k];
      if (z1[k] <= 0.0f) dz1[k] = 0.0f;
    }
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < h; ++j) g_b1[j] += dz1[i * h + j];
    std::vector<float> dt1(n * h);
    DSP_CHECK(dsp_spmm_backward(op_, n, h, dz1.data(), h, dt1.data(), h));
    xd.transpose_times(dt1.data(), g_w1, h);

    DSP_CHECK(dsp_allreduce_sum_f32(comm_, grads.data(), grads.size()));
    DSP_CHECK(dsp_allreduce_sum_f64(comm_, &loss, 1));
    w1_.adam(g_w1, o_.lr, step);
    b1_.adam(g_b1, o_.lr, step);
    w2_.adam(g_w2, o_.lr, step);
    b2_.adam(g_b2, o_.lr, step);
    return loss / train_total_;
  }

  // Accuracy on the nodes with `mask_bit`, over all ranks (no dropout).
  double accuracy(uint8_t mask_bit) {
    const size_t n = n_, h = o_.hidden, c = c_;
    std::vector<float> t1(n * h), z1(n * h), t2(n * c), z2(n * c);
    x_.times(w1_.w.data(), t1.data(), h);
    DSP_CHECK(dsp_spmm_forward(op_, n, h, t1.data(), h, z1.data(), h));
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < h; ++j) z1[i * h + j] = std::max(z1[i * h + j] + b1_.w[j], 0.0f);
    matmul(z1.data(), w2_.w.data(), t2.data(), n, h, c);
    DSP_CHECK(dsp_spmm_forward(op_, n, c, t2.data(), c, z2.data(), c));
    double counts[2] = {0.0, 0.0};  // correct, total
    for (size_t i = 0; i < n; ++i) {
      if (!(masks_[i] & mask_bit)) continue;
      float *z = &z2[i * c];
      for (size_t j = 0; j < c; ++j) z[j] += b2_.w[j];
      size_t predicted = static_cast<size_t>(std::max_element(z, z + c) - z);
      counts[0] += predicted == static_cast<size_t>(labels_[i]) ? 1.0 : 0.0;
      counts[1] += 1.0;
    }
    DSP_CHECK(dsp_allreduce_sum_f64(comm_, counts, 2));
    return counts[1] > 0.0 ? counts[0] / counts[1] : 0.0;
  }

 private:
  dsp_comm *comm_;
  dsp_spmm *op_;
  Options o_;
  size_t n_ = 0, f_ = 0, c_ = 0;
  SparseRows x_;
  std::vector<int32_t> labels_;
  std::vector<uint8_t> masks_;
  Param w1_, b1_, w2_, b2_;
  std::mt19937_64 dropout_rng_;
  double train_total_ = 0.0;
};

}  // namespace

int main(int argc, char **argv) {
  dsp_comm *comm = nullptr;
  dsp_chunk *chunk = nullptr;
  dsp_spmm *op = nullptr;
  uint32_t rank = 0, size = 0;
  int code = 0;
  try {
    const Options o = parse(argc, argv);
    DSP_CHECK(dsp_init(&comm));
    DSP_CHECK(dsp_comm_rank(comm, &rank));
    DSP_CHECK(dsp_comm_size(comm, &size));
    DSP_CHECK(dsp_chunk_open(comm, o.chunks.c_str(), &chunk));
    DSP_CHECK(dsp_spmm_create(comm, chunk, o.schedule, &op));
    Trainer trainer(comm, chunk, op, o);
    for (int epoch = 1; epoch <= o.epochs; ++epoch) {
      double loss = trainer.train_epoch(epoch);
      if (epoch % 20 == 0 || epoch == o.epochs) {
        double val = trainer.accuracy(DSP_MASK_VAL);
        if (rank == 0) std::printf("epoch %3d loss=%.4f val_acc=%.4f\n", epoch, loss, val);
      }
    }
    double test = trainer.accuracy(DSP_MASK_TEST);
    if (rank == 0) std::printf("ranks=%u epochs=%d test_acc=%.4f\n", size, o.epochs, test);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "rank %u: error: %s\n", rank, e.what());
    code = 1;
  }
  dsp_spmm_free(op);
  dsp_chunk_free(chunk);
  dsp_finalize(comm);
  return code;
}
