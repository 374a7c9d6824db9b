// distspmm training kernels: the element-wise steps of a layer and of the optimiser on the GPU
// (src/train.rs holds their wrappers and the host-side rules):
//
// * `dsp_bias_act`: z[i, j] += bias[j] (bias may be NULL), out[i, j] = act(z[i, j]), act the
//   identity (0), ReLU max(z, 0) (1) or ELU z > 0 ? z : expm1(z) (2). `out` may be `z` itself.
// * `dsp_act_backward`: d[i, j] *= act'(z[i, j]) in place from the pre-activation z: ReLU
//   selects (z > 0 ? d : 0), ELU multiplies by exp(z) where z <= 0.
// * `dsp_column_sums`: partial column sums of a matrix over chunks of 256 rows (the bias
//   gradient); the host repeats it on the partials until one row is left.
// * `dsp_dropout`: inverted dropout with counter-keyed masks: entry (row, column c) is kept when
//   lowbias32(c * mul + add) >> 8 >= threshold, (mul, add) = the halves of
//   splitmix64(base ^ id * 0x9E3779B97F4A7C15) (mul made odd), base =
//   splitmix64(seed ^ splitmix64(epoch * 0x1000000001B3 ^ layer)), id the row's original node id;
//   kept entries are multiplied by `scale`, the others are 0. Integer arithmetic throughout, so
//   the masks are those of the CPU trainer bit for bit. `dst` may be `src` itself.
// * `dsp_nll`: log-softmax + NLL over the labelled training rows: dz = (softmax - onehot) / total
//   there and 0 elsewhere, and per block of 256 rows the sums [nll, train correct, train count,
//   val correct, val count, test correct, test count] (f64) over the labelled rows; the host
//   adds the block sums with `dsp_sum_f64`.
// * `dsp_sum_f64`: sums of the rows of a rows x width f64 matrix per chunk of 256 rows, by a
//   fixed tree (deterministic).
// * `dsp_adam`: one Adam step (PyTorch's semantics, L2 weight decay added to the gradient when
//   wd != 0) with the bias corrections computed by the host; every operation rounds on its own
//   (no fused multiply-add), as the CPU trainer's, so the step is the CPU's bit for bit.
//
// Row kernels run one warp per row, lanes over the columns; reductions use fixed shuffle
// butterflies and fixed shared-memory trees, so every result is deterministic. Every kernel
// uses 256-thread blocks (BLOCK_THREADS in src/strategy.rs).

typedef unsigned long long u64;
typedef unsigned int u32;

namespace {

constexpr int WARP = 32;
constexpr int BLOCK_THREADS = 256;
constexpr int WARPS = BLOCK_THREADS / WARP;
constexpr unsigned FULL = 0xffffffffu;
// Rows per block of the reductions (column sums, NLL statistics, f64 sums).
constexpr u32 CHUNK_ROWS = 256;
// Statistics of the NLL kernel per block.
constexpr int STATS = 7;
constexpr unsigned char TRAIN = 1, VAL = 2, TEST = 4;

__device__ __forceinline__ u64 warp_row() {
    return (static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x) / WARP;
}
__device__ __forceinline__ u32 lane() { return threadIdx.x % WARP; }

__device__ __forceinline__ float activate(u32 act, float z) {
    if (act == 1) return fmaxf(z, 0.0f);
    if (act == 2) return z > 0.0f ? z : expm1f(z);
    return z;
}

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ u32 lowbias32(u32 x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_bias_act(u32 rows, u32 f, const float* __restrict__ bias, float* z, u64 ldz, float* out,
                 u64 ldo, u32 act) {
    const u64 i = warp_row();
    if (i >= rows) return;
    float* zi = z + i * ldz;
    float* oi = out + i * ldo;
    for (u32 j = lane(); j < f; j += WARP) {
        float v = zi[j];
        if (bias != nullptr) {
            v = v + __ldg(bias + j);
            zi[j] = v;
        }
        oi[j] = activate(act, v);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_act_backward(u32 rows, u32 f, const float* __restrict__ z, u64 ldz,
                     float* __restrict__ d, u64 ldd, u32 act) {
    const u64 i = warp_row();
    if (i >= rows) return;
    const float* zi = z + i * ldz;
    float* di = d + i * ldd;
    for (u32 j = lane(); j < f; j += WARP) {
        const float v = __ldg(zi + j);
        if (act == 1) {
            di[j] = v > 0.0f ? di[j] : 0.0f;
        } else if (act == 2 && v <= 0.0f) {
            di[j] = di[j] * expf(v);
        }
    }
}

// Block b = chunk * tiles + tile sums rows chunk*256 .. +256 of columns tile*32 .. +32 into row
// `chunk` of `out`: warp w adds rows w, w + 8, ... of the chunk in order, then thread w = 0 adds
// the eight warps' sums in warp order.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_column_sums(u32 rows, u32 f, const float* __restrict__ x, u64 ldx,
                    float* __restrict__ out, u64 ldo) {
    __shared__ float part[WARPS][WARP];
    const u32 tiles = (f + WARP - 1) / WARP;
    const u32 chunk = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const u32 w = threadIdx.x / WARP, l = lane();
    const u32 col = tile * WARP + l;
    const u64 start = static_cast<u64>(chunk) * CHUNK_ROWS;
    float acc = 0.0f;
    if (col < f) {
        for (u64 r = start + w; r < start + CHUNK_ROWS && r < rows; r += WARPS)
            acc += __ldg(x + r * ldx + col);
    }
    part[w][l] = acc;
    __syncthreads();
    if (w == 0 && col < f) {
        float sum = part[0][l];
        for (int k = 1; k < WARPS; ++k) sum += part[k][l];
        out[static_cast<u64>(chunk) * ldo + col] = sum;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_dropout(u32 rows, u32 w, u32 first_col, const u64* __restrict__ ids, u64 seed, u64 epoch,
                u64 layer, u32 threshold, float scale, const float* src, u64 lds, float* dst,
                u64 ldd) {
    const u64 i = warp_row();
    if (i >= rows) return;
    const u64 base = splitmix64(seed ^ splitmix64((epoch * 0x1000000001B3ull) ^ layer));
    const u64 k = splitmix64(base ^ (__ldg(ids + i) * 0x9E3779B97F4A7C15ull));
    const u32 mul = static_cast<u32>(k) | 1u, add = static_cast<u32>(k >> 32);
    const float* si = src + i * lds;
    float* di = dst + i * ldd;
    for (u32 j = lane(); j < w; j += WARP) {
        const u32 c = first_col + j;
        const bool keep = (lowbias32(c * mul + add) >> 8) >= threshold;
        const float v = si[j];
        di[j] = keep ? v * scale : 0.0f;
    }
}

// Warp w of block b takes rows b*256 + w*32 .. +32 in order; every lane ends each row with the
// same statistics (the butterflies give every lane the whole warp's result), lane 0 keeps them.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_nll(u32 rows, u32 classes, const float* __restrict__ z, u64 ldz,
            const int* __restrict__ labels, const unsigned char* __restrict__ masks, double total,
            float* __restrict__ dz, u64 lddz, double* __restrict__ partials) {
    __shared__ double stats[WARPS][STATS];
    const u32 w = threadIdx.x / WARP, l = lane();
    double acc[STATS] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    const u64 first = static_cast<u64>(blockIdx.x) * CHUNK_ROWS + static_cast<u64>(w) * WARP;
    for (u64 i = first; i < first + WARP && i < rows; ++i) {
        const int y = __ldg(labels + i);
        const unsigned char m = __ldg(masks + i);
        const float* zi = z + i * ldz;
        float* di = dz + i * lddz;
        if (y < 0 || static_cast<u32>(y) >= classes) {
            for (u32 c = l; c < classes; c += WARP) di[c] = 0.0f;
            continue;
        }
        // The largest logit and its first position (NaN never wins; all -inf/NaN: position 0).
        float max = -INFINITY;
        u32 arg = 0xffffffffu;
        for (u32 c = l; c < classes; c += WARP) {
            const float v = __ldg(zi + c);
            if (v > max) {
                max = v;
                arg = c;
            }
        }
        for (int offset = WARP / 2; offset > 0; offset /= 2) {
            const float om = __shfl_xor_sync(FULL, max, offset);
            const u32 oa = __shfl_xor_sync(FULL, arg, offset);
            if (om > max || (om == max && oa < arg)) {
                max = om;
                arg = oa;
            }
        }
        if (arg == 0xffffffffu) arg = 0;
        float s = 0.0f;
        for (u32 c = l; c < classes; c += WARP) s += expf(__ldg(zi + c) - max);
        for (int offset = WARP / 2; offset > 0; offset /= 2) s += __shfl_xor_sync(FULL, s, offset);
        const float lse = max + logf(s);
        const double ok = arg == static_cast<u32>(y) ? 1.0 : 0.0;
        if (m & TRAIN) {
            acc[0] += static_cast<double>(lse - __ldg(zi + y));
            acc[1] += ok;
            acc[2] += 1.0;
            for (u32 c = l; c < classes; c += WARP) {
                const float p = expf(__ldg(zi + c) - lse);
                const float hot = c == static_cast<u32>(y) ? 1.0f : 0.0f;
                di[c] = static_cast<float>(static_cast<double>(p - hot) / total);
            }
        } else {
            for (u32 c = l; c < classes; c += WARP) di[c] = 0.0f;
        }
        if (m & VAL) {
            acc[3] += ok;
            acc[4] += 1.0;
        }
        if (m & TEST) {
            acc[5] += ok;
            acc[6] += 1.0;
        }
    }
    if (l == 0) {
        for (int k = 0; k < STATS; ++k) stats[w][k] = acc[k];
    }
    __syncthreads();
    if (threadIdx.x < STATS) {
        double sum = stats[0][threadIdx.x];
        for (int k = 1; k < WARPS; ++k) sum += stats[k][threadIdx.x];
        partials[static_cast<u64>(blockIdx.x) * STATS + threadIdx.x] = sum;
    }
}

// Block b sums rows b*256 .. +256 of `in` (rows x width, contiguous, width <= 8) into row b of
// `out`, column by column through a fixed tree.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_sum_f64(u32 rows, u32 width, const double* __restrict__ in, double* __restrict__ out) {
    __shared__ double tree[BLOCK_THREADS];
    const u64 r = static_cast<u64>(blockIdx.x) * CHUNK_ROWS + threadIdx.x;
    for (u32 c = 0; c < width; ++c) {
        tree[threadIdx.x] = r < rows ? __ldg(in + r * width + c) : 0.0;
        __syncthreads();
        for (u32 half = BLOCK_THREADS / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) tree[threadIdx.x] += tree[threadIdx.x + half];
            __syncthreads();
        }
        if (threadIdx.x == 0) out[static_cast<u64>(blockIdx.x) * width + c] = tree[0];
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_adam(u64 n, float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
             float* __restrict__ v, float lr, float bc1, float bc2, float wd) {
    constexpr float B1 = 0.9f, B2 = 0.999f, EPS = 1e-8f;
    constexpr float OMB1 = 1.0f - B1, OMB2 = 1.0f - B2;
    const u64 k = static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x;
    if (k >= n) return;
    const float pk = p[k];
    float gk = __ldg(g + k);
    if (wd != 0.0f) gk = __fadd_rn(gk, __fmul_rn(wd, pk));
    const float mk = __fadd_rn(__fmul_rn(B1, m[k]), __fmul_rn(OMB1, gk));
    const float vk = __fadd_rn(__fmul_rn(B2, v[k]), __fmul_rn(__fmul_rn(OMB2, gk), gk));
    m[k] = mk;
    v[k] = vk;
    const float mhat = __fdiv_rn(mk, bc1), vhat = __fdiv_rn(vk, bc2);
    p[k] = __fsub_rn(pk, __fdiv_rn(__fmul_rn(lr, mhat), __fadd_rn(__fsqrt_rn(vhat), EPS)));
}
