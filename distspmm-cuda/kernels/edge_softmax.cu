// distspmm edge softmax on the GPU: the softmax of per-edge logits over each destination row's
// entries (GAT's attention normalisation), optionally after a LeakyReLU, forward and backward,
// in the per-edge layout of the distributed operator: the operand holds the entries of several
// CSR blocks one after another, block b's entry k of row i at `firsts[b] + rowptr_b[i] + k`,
// so one row's entries are a run in each block (src/edge_softmax.rs, `EdgeRows`).
//
// * `dsp_edge_softmax`: out[k] = exp(a_k - m_i) / sum_k' exp(a_k' - m_i) over the entries k' of
//   row i, a = LeakyReLU(z) (or a = z), m_i the row's largest a. A row with a non-finite a
//   (NaN or +-inf) is NaN in all its entries; a row without entries writes nothing.
// * `dsp_edge_softmax_backward`: d_logits[k] = out[k] * (d_out[k] - <out, d_out>_row) * g_k,
//   g_k = slope where z_k <= 0 and 1 elsewhere with a LeakyReLU (1 without).
//
// One warp per row; the lanes stride over the row's entries block by block and their partial
// maxima and sums meet in a fixed butterfly of shuffles, so results are deterministic (summed
// in an order set by the row lengths alone: not the CPU operator's order, they agree to
// rounding). Every kernel uses 256-thread blocks (BLOCK_THREADS in src/strategy.rs).

typedef unsigned long long u64;
typedef unsigned int u32;

namespace {

constexpr int WARP = 32;
constexpr int BLOCK_THREADS = 256;
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ u64 warp_row() {
    return (static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x) / WARP;
}
__device__ __forceinline__ u32 lane() { return threadIdx.x % WARP; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(FULL, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(FULL, v, offset));
    return v;
}

// LeakyReLU with `slope` when `leaky`, the identity otherwise.
__device__ __forceinline__ float activate(u32 leaky, float slope, float z) {
    return (leaky != 0 && z <= 0.0f) ? slope * z : z;
}

// The entries of row i in block b: [lo, hi) of the per-edge operand.
__device__ __forceinline__ void run_of(const u64* __restrict__ firsts,
                                       const u64* __restrict__ rowptrs, u32 b, u64 i, u64& lo,
                                       u64& hi) {
    const u64* rowptr = reinterpret_cast<const u64*>(__ldg(rowptrs + b));
    const u64 first = __ldg(firsts + b);
    lo = first + __ldg(rowptr + i);
    hi = first + __ldg(rowptr + i + 1);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_edge_softmax(u32 nrows, u32 nblocks, const u64* __restrict__ firsts,
                     const u64* __restrict__ rowptrs, u32 leaky, float slope,
                     const float* __restrict__ logits, float* __restrict__ out) {
    const u64 i = warp_row();
    if (i >= nrows) return;  // whole warps leave together: rows are per warp
    const u32 l = lane();
    float max = -INFINITY;
    bool finite = true;
    for (u32 b = 0; b < nblocks; ++b) {
        u64 lo, hi;
        run_of(firsts, rowptrs, b, i, lo, hi);
        for (u64 k = lo + l; k < hi; k += WARP) {
            const float a = activate(leaky, slope, __ldg(logits + k));
            finite = finite && isfinite(a);
            max = fmaxf(max, a);
        }
    }
    if (!__all_sync(FULL, finite)) {
        for (u32 b = 0; b < nblocks; ++b) {
            u64 lo, hi;
            run_of(firsts, rowptrs, b, i, lo, hi);
            for (u64 k = lo + l; k < hi; k += WARP) out[k] = NAN;
        }
        return;
    }
    max = warp_max(max);
    float sum = 0.0f;
    for (u32 b = 0; b < nblocks; ++b) {
        u64 lo, hi;
        run_of(firsts, rowptrs, b, i, lo, hi);
        for (u64 k = lo + l; k < hi; k += WARP) {
            const float e = expf(activate(leaky, slope, __ldg(logits + k)) - max);
            out[k] = e;
            sum += e;
        }
    }
    // sum >= 1 wherever the row has entries: its largest entry contributes exp(0).
    sum = warp_sum(sum);
    // Each lane divides the entries it wrote itself.
    for (u32 b = 0; b < nblocks; ++b) {
        u64 lo, hi;
        run_of(firsts, rowptrs, b, i, lo, hi);
        for (u64 k = lo + l; k < hi; k += WARP) out[k] = out[k] / sum;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_edge_softmax_backward(u32 nrows, u32 nblocks, const u64* __restrict__ firsts,
                              const u64* __restrict__ rowptrs, u32 leaky, float slope,
                              const float* __restrict__ logits, const float* __restrict__ out,
                              const float* __restrict__ d_out, float* __restrict__ d_logits) {
    const u64 i = warp_row();
    if (i >= nrows) return;
    const u32 l = lane();
    float dot = 0.0f;
    for (u32 b = 0; b < nblocks; ++b) {
        u64 lo, hi;
        run_of(firsts, rowptrs, b, i, lo, hi);
        for (u64 k = lo + l; k < hi; k += WARP) dot += __ldg(out + k) * __ldg(d_out + k);
    }
    dot = warp_sum(dot);
    for (u32 b = 0; b < nblocks; ++b) {
        u64 lo, hi;
        run_of(firsts, rowptrs, b, i, lo, hi);
        for (u64 k = lo + l; k < hi; k += WARP) {
            const float g = (leaky != 0 && __ldg(logits + k) <= 0.0f) ? slope : 1.0f;
            d_logits[k] = __ldg(out + k) * (__ldg(d_out + k) - dot) * g;
        }
    }
}
