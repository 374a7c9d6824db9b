// distspmm per-edge kernels of the distributed SDDMM and of the SpMM with per-edge values on the
// GPU (distspmm-op's GpuDistSpmm):
//
// * `dsp_sddmm`: out[k] = <U[i, :], V[cols[k], :]> for every stored entry k of row i of a CSR
//   pattern. One warp per row; the warp's lanes form groups of `group` lanes (a power of two up
//   to 32, chosen by the host from F: src/edges.rs, `sddmm_group`), each group takes one entry
//   of the row at a time, its lanes stride over the F columns and their partial sums meet in a
//   fixed butterfly of shuffles. Every value is summed in an order set by F alone, so results
//   are deterministic (not the CPU kernel's order: they agree to rounding).
// * `dsp_csc_values`: csc[k] = csr[rowptr[rows[k]] + rank[k]] for k < nnz: a block's per-edge
//   values (CSR order) in the order of its CSC, `rank[k]` being the position of CSC entry k
//   within its CSR row, for the transposed product. One thread per value.
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
              float* __restrict__ out, u32 f, u32 group) {
    const u64 i = warp_row();
    if (i >= nrows) return;  // whole warps leave together: rows are per warp
    const u32 l = lane();
    const u32 first = l % group, groups = WARP / group;
    const u64 lo = __ldg(rowptr + i), hi = __ldg(rowptr + i + 1);
    const float* ui = u + i * ldu;
    // `base` is the same on every lane, so every shuffle below has the whole warp.
    for (u64 base = lo; base < hi; base += groups) {
        const u64 k = base + l / group;
        float acc = 0.0f;
        if (k < hi) {
            const float* vj = v + static_cast<u64>(__ldg(cols + k)) * ldv;
            for (u32 j = first; j < f; j += group) acc += __ldg(ui + j) * __ldg(vj + j);
        }
        for (u32 offset = group / 2; offset > 0; offset /= 2)
            acc += __shfl_xor_sync(FULL, acc, offset);
        if (k < hi && first == 0) out[k] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    dsp_csc_values(u64 nnz, const u64* __restrict__ rowptr, const u32* __restrict__ rows,
                   const u32* __restrict__ rank, const float* __restrict__ csr,
                   float* __restrict__ csc) {
    const u64 k = static_cast<u64>(blockIdx.x) * BLOCK_THREADS + threadIdx.x;
    if (k >= nnz) return;
    csc[k] = __ldg(csr + __ldg(rowptr + __ldg(rows + k)) + __ldg(rank + k));
}
