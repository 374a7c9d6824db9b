// A distributed 2-layer GNN (GCN, GraphSAGE, GIN or GAT) trained through libdistspmm's C ABI.
//
//   mpirun -n P distspmm_train --chunks DIR [--model gcn|sage|gin|gat] [--epochs 200]
//       [--hidden 16] [--heads 2] [--lr 0.01] [--weight-decay 5e-4] [--dropout 0.5]
//       [--seed 1] [--schedule halo|broadcast] [--log-every 20]
//
// DIR is a chunk directory from `distspmm partition --parts P` (features, labels and masks
// required; GraphSAGE and GIN also need the edge weights that partition records). Each rank
// holds its part's rows; the model is
//     logits = layer2(drop(act(layer1(drop(X)))))          (drop() only in training)
// with X row-normalised and act ReLU (ELU for GAT). The layers, all over the rank's rows:
//     gcn   Ahat (x W) + b                                           dsp_spmm_forward
//     sage  M (x Wl) + b + x Wr,  M: the mean over in-neighbours       dsp_spmm_forward_values
//     gin   MLP((1 + eps) x + S x), S: the sum over in-neighbours     dsp_spmm_forward_values
//     gat   per head h: z = x W, e_ij = LeakyReLU(a_dst.z_i + a_src.z_j), alpha = softmax_i(e),
//           out_i = sum_j alpha_ij z_j + b                dsp_sddmm, dsp_edge_softmax, ..._values
// M and S come from dsp_spmm_edge_weights (A's weights, 0 at the self loops the normalisation
// added): S is them as they are, M divides each by its row's sum. Every backward pass is
// written out with the matching calls (dsp_spmm_backward, dsp_spmm_backward_values,
// dsp_sddmm_backward, dsp_edge_softmax_backward). Softmax cross-entropy is averaged over the
// training nodes of ALL ranks (so any P optimises the same objective); the weight gradients
// are summed across ranks with dsp_allreduce_sum_f32 and every rank applies the same Adam
// update (L2 weight decay on the first layer), so the weights stay identical.
//
// Includes only distspmm.h and links only libdistspmm.so. Rank 0 prints the loss every
// --log-every epochs and, last, a line "... test_acc=<value>".
#include <distspmm.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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
  std::string model = "gcn";
  int epochs = 200;
  size_t hidden = 16;
  size_t heads = 2;
  float lr = 0.01f;
  float weight_decay = 5e-4f;
  float dropout = 0.5f;
  uint64_t seed = 1;
  int32_t schedule = DSP_SCHEDULE_HALO;
  int log_every = 20;
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
    else if (a == "--model") o.model = value();
    else if (a == "--epochs") o.epochs = std::stoi(value());
    else if (a == "--hidden") o.hidden = std::stoul(value());
    else if (a == "--heads") o.heads = std::stoul(value());
    else if (a == "--lr") o.lr = std::stof(value());
    else if (a == "--weight-decay") o.weight_decay = std::stof(value());
    else if (a == "--dropout") o.dropout = std::stof(value());
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--log-every") o.log_every = std::stoi(value());
    else if (a == "--schedule") {
      std::string s = value();
      if (s == "halo") o.schedule = DSP_SCHEDULE_HALO;
      else if (s == "broadcast") o.schedule = DSP_SCHEDULE_BROADCAST;
      else throw std::runtime_error("--schedule is halo or broadcast, not " + s);
    } else {
      throw std::runtime_error("unknown argument " + a + " (see the comment atop train.cpp)");
    }
  }
  if (o.chunks.empty()) throw std::runtime_error("--chunks DIR is required");
  if (o.model != "gcn" && o.model != "sage" && o.model != "gin" && o.model != "gat")
    throw std::runtime_error("--model is gcn, sage, gin or gat, not " + o.model);
  if (o.dropout < 0.0f || o.dropout >= 1.0f) throw std::runtime_error("--dropout in [0, 1)");
  if (o.hidden == 0 || o.heads == 0 || o.hidden % o.heads != 0)
    throw std::runtime_error("--hidden must be a positive multiple of --heads");
  if (o.log_every <= 0) throw std::runtime_error("--log-every must be positive");
  return o;
}

// A parameter tensor with its gradient and Adam state.
struct Param {
  std::vector<float> w, g, m, v;
  float decay;
  Param(size_t n, float decay_) : w(n, 0.0f), g(n, 0.0f), m(n, 0.0f), v(n, 0.0f), decay(decay_) {}

  // Glorot/Xavier uniform for a fan_in x fan_out weight; same seed, same values on all ranks.
  void glorot(size_t fan_in, size_t fan_out, std::mt19937_64 &rng) {
    float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
    std::uniform_real_distribution<float> u(-limit, limit);
    for (float &x : w) x = u(rng);
  }

  // One Adam step (PyTorch's: L2 weight decay added to the gradient, bias-corrected moments).
  void adam(float lr, int step) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(step));
    const float c2 = 1.0f - std::pow(b2, static_cast<float>(step));
    for (size_t i = 0; i < w.size(); ++i) {
      float grad = g[i] + decay * w[i];
      m[i] = b1 * m[i] + (1.0f - b1) * grad;
      v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

// Node features as rows of non-zeros (bag-of-words features are ~99% zeros on Cora), so the
// products with the first weight and the input dropout cost O(nnz) rather than O(n x F).
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
};

using Matrix = std::vector<float>;  // row-major, the rank's n rows

// out (n x k) = a (n x m) * b (m x k).
void matmul(const float *a, const float *b, float *out, size_t n, size_t m, size_t k) {
  std::fill(out, out + n * k, 0.0f);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) {
      const float x = a[i * m + j], *row = b + j * k;
      for (size_t c = 0; c < k; ++c) out[i * k + c] += x * row[c];
    }
}

// g (m x k) += a^T d, a being n x m and d n x k.
void add_matmul_at(const float *a, const float *d, float *g, size_t n, size_t m, size_t k) {
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) {
      const float x = a[i * m + j];
      for (size_t c = 0; c < k; ++c) g[j * k + c] += x * d[i * k + c];
    }
}

// out (n x m) += d (n x k) * b^T, b being m x k.
void add_matmul_bt(const float *d, const float *b, float *out, size_t n, size_t k, size_t m) {
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) {
      float s = 0.0f;
      for (size_t c = 0; c < k; ++c) s += d[i * k + c] * b[j * k + c];
      out[i * m + j] += s;
    }
}

// Adds the bias b (k) to every row of x (n x k); its gradient is the column sums.
void add_bias(Matrix &x, const Param &b) {
  const size_t k = b.w.size();
  for (size_t i = 0; i < x.size(); ++i) x[i] += b.w[i % k];
}
void add_bias_grad(const Matrix &d, Param &b) {
  const size_t k = b.w.size();
  for (size_t i = 0; i < d.size(); ++i) b.g[i % k] += d[i];
}

// A layer's input: the sparse features (first layer; no gradient flows back to them) or a
// dense n x cols matrix (the hidden representation).
struct Input {
  const SparseRows *sparse = nullptr;
  const Matrix *dense = nullptr;
  size_t rows = 0, cols = 0;

  // out (rows x k) = input * w (cols x k).
  Matrix times(const std::vector<float> &w, size_t k) const {
    Matrix out(rows * k, 0.0f);
    if (dense != nullptr) {
      matmul(dense->data(), w.data(), out.data(), rows, cols, k);
      return out;
    }
    for (size_t i = 0; i < rows; ++i)
      for (size_t e = sparse->ptr[i]; e < sparse->ptr[i + 1]; ++e) {
        const float x = sparse->val[e], *row = w.data() + sparse->col[e] * k;
        for (size_t c = 0; c < k; ++c) out[i * k + c] += x * row[c];
      }
    return out;
  }

  // g (cols x k) += input^T d (rows x k).
  void add_grad(const Matrix &d, std::vector<float> &g, size_t k) const {
    if (dense != nullptr) {
      add_matmul_at(dense->data(), d.data(), g.data(), rows, cols, k);
      return;
    }
    for (size_t i = 0; i < rows; ++i)
      for (size_t e = sparse->ptr[i]; e < sparse->ptr[i + 1]; ++e) {
        const float x = sparse->val[e];
        for (size_t c = 0; c < k; ++c) g[sparse->col[e] * k + c] += x * d[i * k + c];
      }
  }
};

// The operator and the per-edge weights the layers aggregate with.
struct Graph {
  dsp_spmm *op = nullptr;
  size_t n = 0, edges = 0;
  std::vector<float> sum, mean;  // S and M in the per-edge layout

  Graph(dsp_spmm *op_, size_t n_, bool weights) : op(op_), n(n_) {
    DSP_CHECK(dsp_spmm_edge_count(op, &edges));
    if (!weights) return;
    std::vector<int64_t> rows(edges), sources(edges);
    DSP_CHECK(dsp_spmm_edges(op, rows.data(), sources.data(), edges));
    sum.resize(edges);
    DSP_CHECK(dsp_spmm_edge_weights(op, sum.data(), edges));
    std::vector<double> row_sum(n, 0.0);
    for (size_t k = 0; k < edges; ++k) row_sum[rows[k]] += sum[k];
    mean.resize(edges);
    for (size_t k = 0; k < edges; ++k)
      mean[k] = row_sum[rows[k]] > 0.0 ? static_cast<float>(sum[k] / row_sum[rows[k]]) : 0.0f;
  }

  // Y = E X and dX = E^T dY for per-edge values e of `groups` heads (X: n x cols).
  Matrix forward(const std::vector<float> &e, size_t groups, const Matrix &x, size_t cols) const {
    Matrix y(n * cols);
    DSP_CHECK(dsp_spmm_forward_values(op, groups, e.data(), e.size(), n, cols, x.data(), cols,
                                      y.data(), cols));
    return y;
  }
  Matrix backward(const std::vector<float> &e, size_t groups, const Matrix &dy,
                  size_t cols) const {
    Matrix dx(n * cols);
    DSP_CHECK(dsp_spmm_backward_values(op, groups, e.data(), e.size(), n, cols, dy.data(), cols,
                                       dx.data(), cols));
    return dx;
  }
};

// One graph layer: forward keeps what backward needs; backward accumulates the parameters'
// gradients and, when `d_in` is given, adds the gradient of the (dense) input to it.
class Layer {
 public:
  virtual ~Layer() = default;
  virtual Matrix forward(const Input &in) = 0;
  virtual void backward(const Matrix &d_out, Matrix *d_in) = 0;
  virtual std::vector<Param *> params() = 0;
};

// GCN: Ahat (x W) + b.
class GcnConv : public Layer {
 public:
  GcnConv(const Graph &g, size_t fi, size_t fo, float decay, std::mt19937_64 &rng)
      : g_(g), fi_(fi), fo_(fo), w_(fi * fo, decay), b_(fo, decay) {
    w_.glorot(fi, fo, rng);
  }
  Matrix forward(const Input &in) override {
    in_ = in;
    Matrix t = in.times(w_.w, fo_), out(g_.n * fo_);
    DSP_CHECK(dsp_spmm_forward(g_.op, g_.n, fo_, t.data(), fo_, out.data(), fo_));
    add_bias(out, b_);
    return out;
  }
  void backward(const Matrix &d_out, Matrix *d_in) override {
    add_bias_grad(d_out, b_);
    Matrix dt(g_.n * fo_);
    DSP_CHECK(dsp_spmm_backward(g_.op, g_.n, fo_, d_out.data(), fo_, dt.data(), fo_));
    in_.add_grad(dt, w_.g, fo_);
    if (d_in != nullptr) add_matmul_bt(dt.data(), w_.w.data(), d_in->data(), g_.n, fo_, fi_);
  }
  std::vector<Param *> params() override { return {&w_, &b_}; }

 private:
  const Graph &g_;
  size_t fi_, fo_;
  Param w_, b_;
  Input in_;
};

// GraphSAGE (PyG's SAGEConv, mean aggregator): M (x Wl) + b + x Wr.
class SageConv : public Layer {
 public:
  SageConv(const Graph &g, size_t fi, size_t fo, float decay, std::mt19937_64 &rng)
      : g_(g), fi_(fi), fo_(fo), wl_(fi * fo, decay), b_(fo, decay), wr_(fi * fo, decay) {
    wl_.glorot(fi, fo, rng);
    wr_.glorot(fi, fo, rng);
  }
  Matrix forward(const Input &in) override {
    in_ = in;
    Matrix out = g_.forward(g_.mean, 1, in.times(wl_.w, fo_), fo_);
    Matrix root = in.times(wr_.w, fo_);
    for (size_t i = 0; i < out.size(); ++i) out[i] += root[i];
    add_bias(out, b_);
    return out;
  }
  void backward(const Matrix &d_out, Matrix *d_in) override {
    add_bias_grad(d_out, b_);
    Matrix dt = g_.backward(g_.mean, 1, d_out, fo_);
    in_.add_grad(dt, wl_.g, fo_);
    in_.add_grad(d_out, wr_.g, fo_);
    if (d_in != nullptr) {
      add_matmul_bt(dt.data(), wl_.w.data(), d_in->data(), g_.n, fo_, fi_);
      add_matmul_bt(d_out.data(), wr_.w.data(), d_in->data(), g_.n, fo_, fi_);
    }
  }
  std::vector<Param *> params() override { return {&wl_, &b_, &wr_}; }

 private:
  const Graph &g_;
  size_t fi_, fo_;
  Param wl_, b_, wr_;
  Input in_;
};

// GIN (PyG's GINConv, eps = 0, nn = Linear, ReLU, Linear): MLP((1 + eps) x + S x). The sum
// commutes with the first Linear's product, so the layer aggregates x W1 (narrower than x).
class GinConv : public Layer {
 public:
  GinConv(const Graph &g, size_t fi, size_t fh, size_t fo, float decay, std::mt19937_64 &rng)
      : g_(g), fi_(fi), fh_(fh), fo_(fo), w1_(fi * fh, decay), b1_(fh, decay),
        w2_(fh * fo, decay), b2_(fo, decay) {
    w1_.glorot(fi, fh, rng);
    w2_.glorot(fh, fo, rng);
  }
  Matrix forward(const Input &in) override {
    in_ = in;
    Matrix t = in.times(w1_.w, fh_);
    a_ = g_.forward(g_.sum, 1, t, fh_);
    for (size_t i = 0; i < a_.size(); ++i) a_[i] += (1.0f + eps_) * t[i];
    add_bias(a_, b1_);
    r_.resize(a_.size());
    for (size_t i = 0; i < a_.size(); ++i) r_[i] = std::max(a_[i], 0.0f);
    Matrix out(g_.n * fo_);
    matmul(r_.data(), w2_.w.data(), out.data(), g_.n, fh_, fo_);
    add_bias(out, b2_);
    return out;
  }
  void backward(const Matrix &d_out, Matrix *d_in) override {
    add_bias_grad(d_out, b2_);
    add_matmul_at(r_.data(), d_out.data(), w2_.g.data(), g_.n, fh_, fo_);
    Matrix da(g_.n * fh_, 0.0f);
    add_matmul_bt(d_out.data(), w2_.w.data(), da.data(), g_.n, fo_, fh_);
    for (size_t i = 0; i < da.size(); ++i) da[i] = a_[i] > 0.0f ? da[i] : 0.0f;
    add_bias_grad(da, b1_);
    Matrix dt = g_.backward(g_.sum, 1, da, fh_);
    for (size_t i = 0; i < dt.size(); ++i) dt[i] += (1.0f + eps_) * da[i];
    in_.add_grad(dt, w1_.g, fh_);
    if (d_in != nullptr) add_matmul_bt(dt.data(), w1_.w.data(), d_in->data(), g_.n, fh_, fi_);
  }
  std::vector<Param *> params() override { return {&w1_, &b1_, &w2_, &b2_}; }

 private:
  const Graph &g_;
  size_t fi_, fh_, fo_;
  const float eps_ = 0.0f;
  Param w1_, b1_, w2_, b2_;
  Input in_;
  Matrix a_, r_;
};

// GAT (PyG's GATConv, heads concatenated, no attention dropout): per head h, z = x W,
// s_i = a_dst[h].z_i[h], t_j = a_src[h].z_j[h], e_ij = s_i + t_j (one grouped SDDMM with
// U = [s, 1] and V = [1, t] per head), alpha = edge softmax of LeakyReLU_0.2(e), and
// out_i[h] = sum_j alpha_ij z_j[h] + b.
class GatConv : public Layer {
 public:
  GatConv(const Graph &g, size_t fi, size_t heads, size_t ch, float decay, std::mt19937_64 &rng)
      : g_(g), fi_(fi), h_(heads), c_(ch), w_(fi * heads * ch, decay),
        a_src_(heads * ch, decay), a_dst_(heads * ch, decay), b_(heads * ch, decay) {
    w_.glorot(fi, heads * ch, rng);
    a_src_.glorot(ch, 1, rng);
    a_dst_.glorot(ch, 1, rng);
  }
  Matrix forward(const Input &in) override {
    in_ = in;
    const size_t n = g_.n, hc = h_ * c_, count = h_ * g_.edges;
    z_ = in.times(w_.w, hc);
    u_.assign(n * 2 * h_, 1.0f);
    v_.assign(n * 2 * h_, 1.0f);
    for (size_t i = 0; i < n; ++i)
      for (size_t h = 0; h < h_; ++h) {
        float s = 0.0f, t = 0.0f;
        for (size_t c = 0; c < c_; ++c) {
          s += a_dst_.w[h * c_ + c] * z_[i * hc + h * c_ + c];
          t += a_src_.w[h * c_ + c] * z_[i * hc + h * c_ + c];
        }
        u_[i * 2 * h_ + 2 * h] = s;
        v_[i * 2 * h_ + 2 * h + 1] = t;
      }
    logits_.resize(count);
    alpha_.resize(count);
    DSP_CHECK(dsp_sddmm(g_.op, h_, n, 2 * h_, u_.data(), 2 * h_, v_.data(), 2 * h_,
                        logits_.data(), count));
    DSP_CHECK(dsp_edge_softmax(g_.op, h_, kSlope, logits_.data(), alpha_.data(), count));
    Matrix out = g_.forward(alpha_, h_, z_, hc);
    add_bias(out, b_);
    return out;
  }
  void backward(const Matrix &d_out, Matrix *d_in) override {
    const size_t n = g_.n, hc = h_ * c_, count = h_ * g_.edges;
    add_bias_grad(d_out, b_);
    Matrix dz = g_.backward(alpha_, h_, d_out, hc);
    // d alpha_ij = <d_out_i[h], z_j[h]>: an SDDMM over the same edges.
    std::vector<float> d_alpha(count), d_logits(count);
    DSP_CHECK(dsp_sddmm(g_.op, h_, n, hc, d_out.data(), hc, z_.data(), hc, d_alpha.data(),
                        count));
    DSP_CHECK(dsp_edge_softmax_backward(g_.op, h_, kSlope, logits_.data(), alpha_.data(),
                                        d_alpha.data(), d_logits.data(), count));
    Matrix du(n * 2 * h_), dv(n * 2 * h_);
    DSP_CHECK(dsp_sddmm_backward(g_.op, h_, d_logits.data(), count, n, 2 * h_, u_.data(),
                                 2 * h_, v_.data(), 2 * h_, du.data(), 2 * h_, dv.data(), 2 * h_));
    for (size_t i = 0; i < n; ++i)
      for (size_t h = 0; h < h_; ++h) {
        const float ds = du[i * 2 * h_ + 2 * h], dt = dv[i * 2 * h_ + 2 * h + 1];
        for (size_t c = 0; c < c_; ++c) {
          const size_t k = h * c_ + c;
          dz[i * hc + k] += ds * a_dst_.w[k] + dt * a_src_.w[k];
          a_dst_.g[k] += ds * z_[i * hc + k];
          a_src_.g[k] += dt * z_[i * hc + k];
        }
      }
    in_.add_grad(dz, w_.g, hc);
    if (d_in != nullptr) add_matmul_bt(dz.data(), w_.w.data(), d_in->data(), n, hc, fi_);
  }
  std::vector<Param *> params() override { return {&w_, &a_src_, &a_dst_, &b_}; }

 private:
  static constexpr float kSlope = 0.2f;  // LeakyReLU's negative slope
  const Graph &g_;
  size_t fi_, h_, c_;
  Param w_, a_src_, a_dst_, b_;
  Input in_;
  Matrix z_, u_, v_;
  std::vector<float> logits_, alpha_;
};

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
  Trainer(dsp_comm *comm, dsp_chunk *chunk, dsp_spmm *op, const Options &o) : comm_(comm), o_(o) {
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
    graph_.reset(new Graph(op, n_, o.model == "sage" || o.model == "gin"));
    const Graph &g = *graph_;
    const size_t h = o.hidden;
    const float wd = o.weight_decay;
    std::mt19937_64 init(o.seed);  // identical on every rank
    if (o.model == "gcn") {
      layer1_.reset(new GcnConv(g, f_, h, wd, init));
      layer2_.reset(new GcnConv(g, h, c_, 0.0f, init));
    } else if (o.model == "sage") {
      layer1_.reset(new SageConv(g, f_, h, wd, init));
      layer2_.reset(new SageConv(g, h, c_, 0.0f, init));
    } else if (o.model == "gin") {
      layer1_.reset(new GinConv(g, f_, h, h, wd, init));
      layer2_.reset(new GinConv(g, h, h, c_, 0.0f, init));
    } else {
      layer1_.reset(new GatConv(g, f_, o.heads, h / o.heads, wd, init));
      layer2_.reset(new GatConv(g, h, 1, c_, 0.0f, init));
    }
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
    const size_t n = n_, c = c_;
    std::vector<float> z2 = forward(true);
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

    // Backward through layer 2, the dropout and the activation, then layer 1.
    std::vector<Param *> params = layer1_->params(), second = layer2_->params();
    params.insert(params.end(), second.begin(), second.end());
    for (Param *p : params) std::fill(p->g.begin(), p->g.end(), 0.0f);
    Matrix dh(n * o_.hidden, 0.0f);
    layer2_->backward(dz2, &dh);
    for (size_t k = 0; k < dh.size(); ++k) {
      if (o_.dropout > 0.0f) dh[k] *= keep_h_[k];
      const float a = a1_[k];
      dh[k] *= a > 0.0f ? 1.0f : (o_.model == "gat" ? std::exp(a) : 0.0f);
    }
    layer1_->backward(dh, nullptr);

    // All gradients in one buffer: a single all-reduce per epoch.
    std::vector<float> grads;
    for (Param *p : params) grads.insert(grads.end(), p->g.begin(), p->g.end());
    DSP_CHECK(dsp_allreduce_sum_f32(comm_, grads.data(), grads.size()));
    DSP_CHECK(dsp_allreduce_sum_f64(comm_, &loss, 1));
    size_t at = 0;
    for (Param *p : params) {
      std::copy(grads.begin() + at, grads.begin() + at + p->g.size(), p->g.begin());
      at += p->g.size();
      p->adam(o_.lr, step);
    }
    return loss / train_total_;
  }

  // Accuracy on the nodes with `mask_bit`, over all ranks (no dropout).
  double accuracy(uint8_t mask_bit) {
    const size_t c = c_;
    std::vector<float> z2 = forward(false);
    double counts[2] = {0.0, 0.0};  // correct, total
    for (size_t i = 0; i < n_; ++i) {
      if (!(masks_[i] & mask_bit)) continue;
      const float *z = &z2[i * c];
      size_t predicted = static_cast<size_t>(std::max_element(z, z + c) - z);
      counts[0] += predicted == static_cast<size_t>(labels_[i]) ? 1.0 : 0.0;
      counts[1] += 1.0;
    }
    DSP_CHECK(dsp_allreduce_sum_f64(comm_, counts, 2));
    return counts[1] > 0.0 ? counts[0] / counts[1] : 0.0;
  }

 private:
  // The logits (n x C); in training with dropout, keeping what backward needs.
  Matrix forward(bool train) {
    // Dropping a zero feature changes nothing: the input dropout acts on the non-zeros only.
    // The layers keep their inputs (xd_, h1_) for the backward pass.
    xd_ = x_;
    if (train && o_.dropout > 0.0f) dropout(xd_.val, nullptr, o_.dropout, dropout_rng_);
    a1_ = layer1_->forward(Input{&xd_, nullptr, n_, f_});
    h1_ = a1_;
    for (float &v : h1_) v = v > 0.0f ? v : (o_.model == "gat" ? std::expm1(v) : 0.0f);
    if (train && o_.dropout > 0.0f) dropout(h1_, &keep_h_, o_.dropout, dropout_rng_);
    return layer2_->forward(Input{nullptr, &h1_, n_, o_.hidden});
  }

  dsp_comm *comm_;
  Options o_;
  size_t n_ = 0, f_ = 0, c_ = 0;
  SparseRows x_, xd_;
  std::vector<int32_t> labels_;
  std::vector<uint8_t> masks_;
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<Layer> layer1_, layer2_;
  Matrix a1_, h1_, keep_h_;
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
      if (epoch % o.log_every == 0 || epoch == o.epochs) {
        double val = trainer.accuracy(DSP_MASK_VAL);
        if (rank == 0) std::printf("epoch %3d loss=%.4f val_acc=%.4f\n", epoch, loss, val);
      }
    }
    double test = trainer.accuracy(DSP_MASK_TEST);
    if (rank == 0)
      std::printf("model=%s ranks=%u epochs=%d test_acc=%.4f\n", o.model.c_str(), size, o.epochs,
                  test);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "rank %u: error: %s\n", rank, e.what());
    code = 1;
  }
  dsp_spmm_free(op);
  dsp_chunk_free(chunk);
  dsp_finalize(comm);
  return code;
}
