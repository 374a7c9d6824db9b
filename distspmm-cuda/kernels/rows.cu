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
//
// One warp per row, lanes over the F columns (coalesced 128-byte accesses per warp). Every
// kernel uses 256-thread blocks (BLOCK_THREADS in src/strategy.rs); the host computes the grid
// as ceil(nrows / 8) (src/rows.rs, `row_blocks`).

typedef unsigned long long u64;
typedef unsigned int u32;

namespace {

constexpr int WARP = 32;
constexpr int BLOCK_THREADS = 256;

// The warp's row and the lane, in 64-bit arithmetic (grids beyond 2^32 threads are legal).
__device__ __forceinline__ u64 warp_row() {
    return (static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x) / WARP;
}
__device__ __forceinline__ u32 lane() { return threadIdx.x % WARP; }

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
