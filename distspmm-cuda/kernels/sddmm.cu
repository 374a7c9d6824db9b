// distspmm per-edge kernels of the distributed SDDMM and of the SpMM with per-edge values on the
// GPU (distspmm-op's GpuDistSpmm):
//
// * `dsp_sddmm`: out[h*stride + k] = <U[i, h*w..(h+1)*w], V[cols[k], h*w..(h+1)*w]> for every
//   stored entry k of row i of a CSR pattern and every head h < heads (one head: the plain
//   SDDMM over all w = F columns). One warp per row; the warp's lanes form groups of `group`
//   lanes (a power of two up to 32, chosen by the host from w: src/edges.rs, `sddmm_group`),
//   each group takes one entry of the row at a time and all its heads in turn (the entry's
//   column index read once), its lanes stride over the head's w columns and their partial sums
//   meet in a fixed butterfly of shuffles. Every value is summed in an order set by w alone, so
//   results are deterministic (not the CPU kernel's order: they agree to rounding).
// * `dsp_csc_values`: csc[g*stride + k] = csr[g*stride + rowptr[rows[k]] + rank[k]] for k < nnz
//   and every group g < groups: a block's per-edge values (CSR order, one run per group) in the
//   order of its CSC, `rank[k]` being the position of CSC entry k within its CSR row, for the
//   transposed product. One thread per entry, its groups in turn.
//
// Every kernel uses 256-thread blocks (BLOCK_THREADS in src/strategy.rs).

typedef unsigned long long u64;
typedef unsigned int u32;

namespace {

constexpr int WARP = 32;
constexpr int BLOCK_THREADS = 256;
constexpr unsigned FULL = 0xffffffffu;

// The warp's row and the lane, in 64-bit arithmetic (grids beyond 2^32 threads are legal).
__device__ __forceinline__ u64 warp_row() {
    return (static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x) / WARP;
}
__device__ __forceinline__ u32 lane() { return threadIdx.x % WARP; }

}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_sddmm(u32 nrows, const u64* __restrict__ rowptr, const u32* __restrict__ cols,
              const float* __restrict__ u, u64 ldu, const float* __restrict__ v, u64 ldv,
              float* __restrict__ out, u32 w, u32 group, u32 heads, u64 stride) {
    const u64 i = warp_row();
    if (i >= nrows) return;  // whole warps leave together: rows are per warp
    const u32 l = lane();
    const u32 first = l % group, groups = WARP / group;
    const u64 lo = __ldg(rowptr + i), hi = __ldg(rowptr + i + 1);
    const float* ui = u + i * ldu;
    // `base` is the same on every lane, so every shuffle below has the whole warp.
    for (u64 base = lo; base < hi; base += groups) {
        const u64 k = base + l / group;
        const float* vj = k < hi ? v + static_cast<u64>(__ldg(cols + k)) * ldv : v;
        for (u32 h = 0; h < heads; ++h) {
            const u64 col = static_cast<u64>(h) * w;
            float acc = 0.0f;
            if (k < hi) {
                for (u32 j = first; j < w; j += group)
                    acc += __ldg(ui + col + j) * __ldg(vj + col + j);
            }
            for (u32 offset = group / 2; offset > 0; offset /= 2)
                acc += __shfl_xor_sync(FULL, acc, offset);
            if (k < hi && first == 0) out[h * stride + k] = acc;
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_csc_values(u64 nnz, const u64* __restrict__ rowptr, const u32* __restrict__ rows,
                   const u32* __restrict__ rank, const float* __restrict__ csr,
                   float* __restrict__ csc, u32 groups, u64 stride) {
    const u64 k = static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x;
    if (k >= nnz) return;
    const u64 at = __ldg(rowptr + __ldg(rows + k)) + __ldg(rank + k);
    for (u32 g = 0; g < groups; ++g) csc[g * stride + k] = __ldg(csr + g * stride + at);
}
