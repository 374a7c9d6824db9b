// distspmm row-movement kernels of the distributed SpMM on the GPU (dist-comm's GpuDistSpmm):
//
// * `dsp_gather_rows`: out[k, :] = x[rows[k], :] for k < nrows, packing the rows each peer
//   needs (the chunk's halo send lists, concatenated in increasing peer) into one contiguous
//   send buffer; rows == NULL copies x[k, :] (a strided matrix into a contiguous panel).
// * `dsp_scatter_add_rows`: y[rows[k], :] += packed[src[s], :] for s in ptr[k]..ptr[k+1], in
//   that order: the backward's partial sums received for this rank's own rows, added in
//   increasing source rank. `rows` is strictly increasing, so every output row belongs to one
//   warp; no atomics, and the additions happen in a fixed order (deterministic, and in the
//   order of the CPU operator).
// * `dsp_add_blocks`: y[i, :] += blocks[b * nrows + i, :] for b = 0..nblocks in that order:
//   the broadcast schedule's backward at the root, adding the contributions of the other
//   ranks in increasing rank.
// * `dsp_narrow`: out[k] = x[k] as a 16-bit pattern (fmt 0: bf16, 1: f16) for k < n, the
//   messages of an operator whose rows travel in 16 bits, narrowed just before they are handed
//   to NCCL; `dsp_widen`: out[k] = h[k] widened to f32, where they arrive. The results are
//   distspmm-sparse's `kernel::convert`, bit for bit: bf16 rounds to nearest even on the integer
//   pattern (the CPU's portable loop: subnormals kept, overflow to Inf), f16 is
//   `__float2half_rn` / `__half2float` (round to nearest even, subnormals kept, widening
//   exact); a NaN keeps its sign and as much of its payload as the narrower format holds, made
//   quiet, in integer arithmetic for both formats (PTX's `cvt` may return a canonical NaN).
//
// The row kernels run one warp per row, lanes over the F columns (coalesced 128-byte accesses
// per warp); the host computes their grid as ceil(nrows / 8) (src/rows.rs, `row_blocks`). The
// conversions run one thread per value over a grid-stride loop (`convert_blocks`). Every
// kernel uses 256-thread blocks (BLOCK_THREADS in src/strategy.rs).

#include <cuda_fp16.h>

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

namespace {

constexpr int WARP = 32;
constexpr int BLOCK_THREADS = 256;

// The warp's row and the lane, in 64-bit arithmetic (grids beyond 2^32 threads are legal).
__device__ __forceinline__ u64 warp_row() {
    return (static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x) / WARP;
}
__device__ __forceinline__ u32 lane() { return threadIdx.x % WARP; }

// The first value of this thread and the grid's stride, for the grid-stride loops.
__device__ __forceinline__ u64 thread_index() {
    return static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x;
}
__device__ __forceinline__ u64 grid_stride() {
    return static_cast<u64>(gridDim.x) * BLOCK_THREADS;
}

constexpr u32 FMT_BF16 = 0;

__device__ __forceinline__ bool f32_nan(u32 x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }

// f32 bits to bf16 bits: round to nearest even on the pattern (a carry into the exponent is
// the next binade or Inf), a NaN made quiet with its upper payload.
__device__ __forceinline__ u16 bf16_bits(u32 x) {
    if (f32_nan(x)) return static_cast<u16>((x >> 16) | 0x0040u);
    return static_cast<u16>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// bf16 bits to f32 bits: a shift, a NaN made quiet.
__device__ __forceinline__ u32 bf16_widened(u16 h) {
    const u32 quiet = (h & 0x7FFFu) > 0x7F80u ? 0x0040u : 0u;
    return (static_cast<u32>(h) | quiet) << 16;
}

// f32 bits to f16 bits: the hardware's round to nearest even; a NaN as sign, quiet NaN and
// the upper 10 payload bits.
__device__ __forceinline__ u16 f16_bits(u32 x) {
    if (f32_nan(x))
        return static_cast<u16>(((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x03FFu));
    return __half_as_ushort(__float2half_rn(__uint_as_float(x)));
}

// f16 bits to f32 bits: exact; a NaN as sign, quiet NaN and its payload in the upper bits.
__device__ __forceinline__ u32 f16_widened(u16 h) {
    const u32 bits = h;
    if ((bits & 0x7FFFu) > 0x7C00u)
        return ((bits & 0x8000u) << 16) | 0x7FC00000u | ((bits & 0x03FFu) << 13);
    return __float_as_uint(__half2float(__ushort_as_half(h)));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_gather_rows(u32 nrows, const u32* __restrict__ rows, const float* __restrict__ x, u64 ldx,
                    float* __restrict__ out, u64 ldo, u32 f) {
    const u64 k = warp_row();
    if (k >= nrows) return;
    const u64 src = rows != nullptr ? static_cast<u64>(__ldg(rows + k)) : k;
    const float* in = x + src * ldx;
    float* o = out + k * ldo;
    for (u32 j = lane(); j < f; j += WARP) o[j] = __ldg(in + j);
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_scatter_add_rows(u32 nrows, const u32* __restrict__ rows, const u64* __restrict__ ptr,
                         const u64* __restrict__ src, const float* __restrict__ packed, u64 ldp,
                         float* __restrict__ y, u64 ldy, u32 f) {
    const u64 k = warp_row();
    if (k >= nrows) return;
    const u64 lo = __ldg(ptr + k), hi = __ldg(ptr + k + 1);
    float* out = y + static_cast<u64>(__ldg(rows + k)) * ldy;
    for (u32 j = lane(); j < f; j += WARP) {
        float acc = out[j];
        for (u64 s = lo; s < hi; ++s) acc += __ldg(packed + __ldg(src + s) * ldp + j);
        out[j] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_add_blocks(u32 nrows, u32 nblocks, const float* __restrict__ blocks, u64 ldb,
                   float* __restrict__ y, u64 ldy, u32 f) {
    const u64 i = warp_row();
    if (i >= nrows) return;
    float* out = y + i * ldy;
    for (u32 j = lane(); j < f; j += WARP) {
        float acc = out[j];
        for (u32 b = 0; b < nblocks; ++b)
            acc += __ldg(blocks + (static_cast<u64>(b) * nrows + i) * ldb + j);
        out[j] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_narrow(u64 n, u32 fmt, const u32* __restrict__ x, u16* __restrict__ out) {
    for (u64 k = thread_index(); k < n; k += grid_stride()) {
        const u32 bits = __ldg(x + k);
        out[k] = fmt == FMT_BF16 ? bf16_bits(bits) : f16_bits(bits);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_widen(u64 n, u32 fmt, const u16* __restrict__ h, u32* __restrict__ out) {
    for (u64 k = thread_index(); k < n; k += grid_stride()) {
        const u16 bits = __ldg(h + k);
        out[k] = fmt == FMT_BF16 ? bf16_widened(bits) : f16_widened(bits);
    }
}
