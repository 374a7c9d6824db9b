// distspmm CUDA SpMM kernels: Y = alpha * A * X + beta * Y with A in CSR (u64 row pointers,
// u32 column indices, f32 values) and X, Y dense row-major f32 with leading dimensions.
//
// The transposed product Y = alpha * A^T * X + beta * Y runs the same kernels over the CSC
// arrays of A (column j of A is row j of A^T), so there is no separate transpose kernel.
//
// Two strategies, picked by the host from the matrix shape (distspmm-cuda/src/strategy.rs):
//
// * row groups (`dsp_csr_rows_*`): a group of G lanes (G = 4, 8, 16 or 32) owns one row; a warp
//   holds 32 / G rows. The group loads G non-zeros at a time with coalesced reads and
//   broadcasts them with warp shuffles; each lane gathers V feature chunks of X (float4 when
//   F % 4 == 0 and the pointers and leading dimensions are 16-byte aligned, float otherwise).
//   Small F takes small groups so that no lane idles; F >= 256 takes V = 2 for more loads in
//   flight per lane.
// * row splitting (`dsp_csr_pieces_*` + `dsp_csr_long_rows_*`): for skewed degree
//   distributions, rows longer than a threshold are skipped by the row-group kernel and cut
//   into pieces of about the same number of non-zeros. One warp reduces each piece into a
//   partial-sum row of a workspace (lanes split both the features and the non-zeros, then
//   combine with a fixed butterfly); a second pass adds each long row's partial sums in
//   piece order. No atomics: the result is deterministic.
//
// beta == 0 never reads Y (so NaN or garbage in Y does not propagate). Every kernel uses
// 256-thread blocks (see BLOCK_THREADS in src/strategy.rs).

typedef unsigned long long u64;
typedef unsigned int u32;

namespace {

constexpr u32 FULL_MASK = 0xffffffffu;
constexpr int WARP = 32;
constexpr int BLOCK_THREADS = 256;
// Resident blocks per SM asked of ptxas: caps registers at 65536 / (256 * 4) = 64 per thread,
// enough for the gathers in flight without a spill.
constexpr int MIN_BLOCKS = 4;
// Non-zeros whose feature chunks are loaded before the first multiply-add: enough gathers in
// flight per lane (16 floats: four float4 or eight-to-sixteen floats) to cover memory latency
// at 32 resident warps per SM, few enough to stay inside 64 registers.
constexpr int FLOATS_IN_FLIGHT = 16;
constexpr int MAX_UNROLL = 8;
__host__ __device__ constexpr int unroll_for(int chunk_floats, int limit) {
    return FLOATS_IN_FLIGHT / chunk_floats < limit
               ? (FLOATS_IN_FLIGHT / chunk_floats < MAX_UNROLL ? FLOATS_IN_FLIGHT / chunk_floats : MAX_UNROLL)
               : (limit < MAX_UNROLL ? limit : MAX_UNROLL);
}

template <bool VEC> struct Chunk;
template <> struct Chunk<true> {
    using T = float4;
    static constexpr int WIDTH = 4;
};
template <> struct Chunk<false> {
    using T = float;
    static constexpr int WIDTH = 1;
};

__device__ __forceinline__ void set_zero(float4& a) { a = make_float4(0.f, 0.f, 0.f, 0.f); }
__device__ __forceinline__ void set_zero(float& a) { a = 0.f; }

__device__ __forceinline__ float4 load_ro(const float4* p) { return __ldg(p); }
__device__ __forceinline__ float load_ro(const float* p) { return __ldg(p); }

__device__ __forceinline__ void fma_into(float4& acc, float a, float4 x) {
    acc.x = fmaf(a, x.x, acc.x);
    acc.y = fmaf(a, x.y, acc.y);
    acc.z = fmaf(a, x.z, acc.z);
    acc.w = fmaf(a, x.w, acc.w);
}
__device__ __forceinline__ void fma_into(float& acc, float a, float x) { acc = fmaf(a, x, acc); }

__device__ __forceinline__ void add_into(float4& acc, float4 x) {
    acc.x += x.x;
    acc.y += x.y;
    acc.z += x.z;
    acc.w += x.w;
}
__device__ __forceinline__ void add_into(float& acc, float x) { acc += x; }

__device__ __forceinline__ float4 shfl_xor(float4 v, int mask) {
    v.x = __shfl_xor_sync(FULL_MASK, v.x, mask);
    v.y = __shfl_xor_sync(FULL_MASK, v.y, mask);
    v.z = __shfl_xor_sync(FULL_MASK, v.z, mask);
    v.w = __shfl_xor_sync(FULL_MASK, v.w, mask);
    return v;
}
__device__ __forceinline__ float shfl_xor(float v, int mask) {
    return __shfl_xor_sync(FULL_MASK, v, mask);
}

// y = alpha * acc + beta * y; with beta == 0, y is written without being read.
__device__ __forceinline__ void store_scaled(float4* y, float alpha, float4 acc, float beta) {
    float4 out = make_float4(alpha * acc.x, alpha * acc.y, alpha * acc.z, alpha * acc.w);
    if (beta != 0.f) {
        const float4 old = *y;
        out.x = fmaf(beta, old.x, out.x);
        out.y = fmaf(beta, old.y, out.y);
        out.z = fmaf(beta, old.z, out.z);
        out.w = fmaf(beta, old.w, out.w);
    }
    *y = out;
}
__device__ __forceinline__ void store_scaled(float* y, float alpha, float acc, float beta) {
    float out = alpha * acc;
    if (beta != 0.f) out = fmaf(beta, *y, out);
    *y = out;
}

__device__ __forceinline__ u64 global_warp() {
    return (static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x) / WARP;
}

// Row groups: G lanes per row, V chunks per lane per feature tile.
// Rows with more than `long_threshold` non-zeros are left to the row-splitting kernels.
template <int G, int V, bool VEC>
__device__ __forceinline__ void csr_rows(u32 nrows, const u64* __restrict__ indptr,
                                         const u32* __restrict__ indices,
                                         const float* __restrict__ values,
                                         const float* __restrict__ x, u64 ldx,
                                         float* __restrict__ y, u64 ldy, u32 f, float alpha,
                                         float beta, u64 long_threshold) {
    static_assert(G == 4 || G == 8 || G == 16 || G == 32, "group size must divide the warp");
    using T = typename Chunk<VEC>::T;
    constexpr int W = Chunk<VEC>::WIDTH;
    constexpr int ROWS_PER_WARP = WARP / G;
    constexpr u32 TILE = static_cast<u32>(V * G * W);
    constexpr int UNROLL = unroll_for(V * W, G);

    const int lane = threadIdx.x % WARP;
    const int sub = lane % G;
    const u64 first_row = global_warp() * ROWS_PER_WARP;
    if (first_row >= nrows) return;  // warp-uniform
    const u64 row = first_row + lane / G;

    u64 begin = 0, end = 0;
    bool owned = false;  // this group writes its row here
    if (row < nrows) {
        begin = indptr[row];
        end = indptr[row + 1];
        owned = end - begin <= long_threshold;
        if (!owned) end = begin;
    }
    // Warp-uniform batch count: every lane takes part in every shuffle.
    const u32 batches = __reduce_max_sync(FULL_MASK, static_cast<u32>((end - begin + G - 1) / G));

    for (u32 tile = 0; tile < f; tile += TILE) {
        T acc[V];
#pragma unroll
        for (int v = 0; v < V; ++v) set_zero(acc[v]);

        for (u32 b = 0; b < batches; ++b) {
            const u64 base = begin + static_cast<u64>(b) * G;
            u32 col = 0;
            float val = 0.f;
            if (base + sub < end) {
                col = __ldg(indices + base + sub);
                val = __ldg(values + base + sub);
            }
            const u32 count = base < end ? static_cast<u32>(min(static_cast<u64>(G), end - base)) : 0u;
            const u32 warp_count = __reduce_max_sync(FULL_MASK, count);
#pragma unroll 1
            for (u32 j0 = 0; j0 < warp_count; j0 += UNROLL) {
                // All loads of the step are issued before the first use: UNROLL * V gathers
                // in flight per lane.
                T xs[UNROLL][V];
                float as[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
                    const u32 j = j0 + u;
                    const u32 c = __shfl_sync(FULL_MASK, col, j, G);
                    as[u] = __shfl_sync(FULL_MASK, val, j, G);
                    const float* xrow = x + static_cast<u64>(c) * ldx;
#pragma unroll
                    for (int v = 0; v < V; ++v) {
                        const u32 fc = tile + static_cast<u32>((v * G + sub) * W);
                        if (j < count && fc < f) {
                            xs[u][v] = load_ro(reinterpret_cast<const T*>(xrow + fc));
                        } else {
                            set_zero(xs[u][v]);
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                    for (int v = 0; v < V; ++v) fma_into(acc[v], as[u], xs[u][v]);
                }
            }
        }
        if (owned) {
            float* yrow = y + row * ldy;
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const u32 fc = tile + static_cast<u32>((v * G + sub) * W);
                if (fc < f) store_scaled(reinterpret_cast<T*>(yrow + fc), alpha, acc[v], beta);
            }
        }
    }
}

// Row splitting, pass 1: warp w reduces non-zeros [piece_lo[w], piece_hi[w]) of one long row
// into partial[w * ldp ...]. G lanes span the features, 32 / G slots span the non-zeros.
template <int G, bool VEC>
__device__ __forceinline__ void csr_pieces(u32 npieces, const u64* __restrict__ piece_lo,
                                           const u64* __restrict__ piece_hi,
                                           const u32* __restrict__ indices,
                                           const float* __restrict__ values,
                                           const float* __restrict__ x, u64 ldx,
                                           float* __restrict__ partial, u64 ldp, u32 f) {
    using T = typename Chunk<VEC>::T;
    constexpr int W = Chunk<VEC>::WIDTH;
    constexpr u32 SLOTS = WARP / G;
    constexpr u32 TILE = static_cast<u32>(G * W);
    constexpr u32 STEPS = WARP / SLOTS;  // shuffle steps per full batch of 32 non-zeros
    constexpr int UNROLL = unroll_for(W, static_cast<int>(STEPS));

    const u64 piece = global_warp();
    if (piece >= npieces) return;  // warp-uniform
    const int lane = threadIdx.x % WARP;
    const u32 slot = static_cast<u32>(lane / G);
    const int sub = lane % G;
    const u64 lo = piece_lo[piece];
    const u64 hi = piece_hi[piece];

    for (u32 tile = 0; tile < f; tile += TILE) {
        const u32 fc = tile + static_cast<u32>(sub * W);
        T acc;
        set_zero(acc);
        for (u64 base = lo; base < hi; base += WARP) {
            u32 col = 0;
            float val = 0.f;
            if (base + lane < hi) {
                col = __ldg(indices + base + lane);
                val = __ldg(values + base + lane);
            }
            const u32 count = static_cast<u32>(min(static_cast<u64>(WARP), hi - base));
            const u32 steps = (count + SLOTS - 1) / SLOTS;
#pragma unroll 1
            for (u32 j0 = 0; j0 < steps; j0 += UNROLL) {
                T xs[UNROLL];
                float as[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) {
                    // Lanes of slot s take non-zeros s, s + SLOTS, s + 2 * SLOTS, ... of the batch.
                    const u32 src = (j0 + u) * SLOTS + slot;
                    const u32 c = __shfl_sync(FULL_MASK, col, src % WARP);
                    as[u] = __shfl_sync(FULL_MASK, val, src % WARP);
                    if (src < count && fc < f) {
                        xs[u] = load_ro(reinterpret_cast<const T*>(x + static_cast<u64>(c) * ldx + fc));
                    } else {
                        set_zero(xs[u]);
                    }
                }
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) fma_into(acc, as[u], xs[u]);
            }
        }
        // Fixed butterfly over the slots: deterministic summation order.
#pragma unroll
        for (int off = G; off < WARP; off <<= 1) add_into(acc, shfl_xor(acc, off));
        if (slot == 0 && fc < f) *reinterpret_cast<T*>(partial + piece * ldp + fc) = acc;
    }
}

// Row splitting, pass 2: warp i adds the partial sums of long row long_rows[i] in piece order
// (pieces long_piece_ptr[i] .. long_piece_ptr[i+1]) and writes alpha * sum + beta * y.
template <bool VEC>
__device__ __forceinline__ void csr_long_rows(u32 nlong, const u32* __restrict__ long_rows,
                                              const u64* __restrict__ long_piece_ptr,
                                              const float* __restrict__ partial, u64 ldp,
                                              float* __restrict__ y, u64 ldy, u32 f, float alpha,
                                              float beta) {
    using T = typename Chunk<VEC>::T;
    constexpr int W = Chunk<VEC>::WIDTH;
    const u64 i = global_warp();
    if (i >= nlong) return;
    const int lane = threadIdx.x % WARP;
    const u64 row = long_rows[i];
    const u64 p0 = long_piece_ptr[i];
    const u64 p1 = long_piece_ptr[i + 1];
    for (u32 fc = static_cast<u32>(lane * W); fc < f; fc += WARP * W) {
        T acc;
        set_zero(acc);
        for (u64 p = p0; p < p1; ++p) add_into(acc, *reinterpret_cast<const T*>(partial + p * ldp + fc));
        store_scaled(reinterpret_cast<T*>(y + row * ldy + fc), alpha, acc, beta);
    }
}

}  // namespace

#define DSP_ROWS_KERNEL(NAME, G, V, VEC)                                                       \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)                                \
        NAME(u32 nrows, const u64* indptr, const u32* indices, const float* values,           \
             const float* x, u64 ldx, float* y, u64 ldy, u32 f, float alpha, float beta,     \
             u64 long_threshold) {                                                             \
        csr_rows<G, V, VEC>(nrows, indptr, indices, values, x, ldx, y, ldy, f, alpha, beta,  \
                            long_threshold);                                                   \
    }

DSP_ROWS_KERNEL(dsp_csr_rows_g4_v1_vec4, 4, 1, true)
DSP_ROWS_KERNEL(dsp_csr_rows_g8_v1_vec4, 8, 1, true)
DSP_ROWS_KERNEL(dsp_csr_rows_g16_v1_vec4, 16, 1, true)
DSP_ROWS_KERNEL(dsp_csr_rows_g32_v1_vec4, 32, 1, true)
DSP_ROWS_KERNEL(dsp_csr_rows_g32_v2_vec4, 32, 2, true)
DSP_ROWS_KERNEL(dsp_csr_rows_g4_v1_f32, 4, 1, false)
DSP_ROWS_KERNEL(dsp_csr_rows_g8_v1_f32, 8, 1, false)
DSP_ROWS_KERNEL(dsp_csr_rows_g16_v1_f32, 16, 1, false)
DSP_ROWS_KERNEL(dsp_csr_rows_g32_v1_f32, 32, 1, false)
DSP_ROWS_KERNEL(dsp_csr_rows_g32_v2_f32, 32, 2, false)

#define DSP_PIECES_KERNEL(NAME, G, VEC)                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)                                \
        NAME(u32 npieces, const u64* piece_lo, const u64* piece_hi, const u32* indices,       \
             const float* values, const float* x, u64 ldx, float* partial, u64 ldp, u32 f) {  \
        csr_pieces<G, VEC>(npieces, piece_lo, piece_hi, indices, values, x, ldx, partial, ldp, \
                           f);                                                                 \
    }

DSP_PIECES_KERNEL(dsp_csr_pieces_g4_vec4, 4, true)
DSP_PIECES_KERNEL(dsp_csr_pieces_g8_vec4, 8, true)
DSP_PIECES_KERNEL(dsp_csr_pieces_g16_vec4, 16, true)
DSP_PIECES_KERNEL(dsp_csr_pieces_g32_vec4, 32, true)
DSP_PIECES_KERNEL(dsp_csr_pieces_g4_f32, 4, false)
DSP_PIECES_KERNEL(dsp_csr_pieces_g8_f32, 8, false)
DSP_PIECES_KERNEL(dsp_csr_pieces_g16_f32, 16, false)
DSP_PIECES_KERNEL(dsp_csr_pieces_g32_f32, 32, false)

#define DSP_LONG_ROWS_KERNEL(NAME, VEC)                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)                                \
        NAME(u32 nlong, const u32* long_rows, const u64* long_piece_ptr, const float* partial,\
             u64 ldp, float* y, u64 ldy, u32 f, float alpha, float beta) {                    \
        csr_long_rows<VEC>(nlong, long_rows, long_piece_ptr, partial, ldp, y, ldy, f, alpha,  \
                           beta);                                                              \
    }

DSP_LONG_ROWS_KERNEL(dsp_csr_long_rows_vec4, true)
DSP_LONG_ROWS_KERNEL(dsp_csr_long_rows_f32, false)
