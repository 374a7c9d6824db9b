#!/usr/bin/env python3
"""Times Intel MKL's sparse x dense product (sparse_dot_mkl -> mkl_sparse_s_mm, CSR) on the
GCN-normalised adjacency matrix of a graph, for comparison with `distspmm bench spmm`.

Builds the same matrix as distspmm_core::normalize::adjacency(.., Gcn): entry A[v][u] for each
edge u -> v (edge_index[0] = u, edge_index[1] = v), duplicates summed, self loops as PyG's
add_remaining_self_loops (an existing loop keeps its weight, other nodes get 1), then
D^-1/2 (A + I) D^-1/2 with D the row sums. X is uniform in [-1, 1), float32, C order.

Prints one JSON line per feature width:
{"library": "mkl", "features", "seconds" (median), "gflops" (2 nnz F / seconds), "nnz", "nodes", "threads"}

    pip install mkl sparse_dot_mkl scipy numpy
    python3 benches/peers/mkl_spmm.py --input G.npz --features 16 64 256 --threads 2
"""
import argparse
import json
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="graph .npz with edge_index [2, E] (PyG layout)")
    p.add_argument("--features", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10, help="timed repetitions after one warm-up")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


args = parse_args()
# MKL reads its thread count when it loads: set it before numpy/scipy/sparse_dot_mkl import it.
for var in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[var] = str(args.threads)
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
if "MKL_RT" not in os.environ:
    # The PyPI `mkl` wheel puts libmkl_rt.so.N under <prefix>/lib, outside the loader's path.
    import glob
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    if found:
        os.environ["MKL_RT"] = found[-1]

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import sparse_dot_mkl  # noqa: E402


def gcn_adjacency(path):
    z = np.load(path)
    ei = z["edge_index"]
    n = int(z["num_nodes"]) if "num_nodes" in z.files else int(ei.max()) + 1
    src, dst = ei[0].astype(np.int64), ei[1].astype(np.int64)
    w = z["edge_weight"].astype(np.float64) if "edge_weight" in z.files else np.ones(len(src))
    loop = src == dst
    diag = np.ones(n)
    if loop.any():
        # Nodes with self loops keep the (summed) weight of their loops instead of 1.
        loops = np.zeros(n)
        np.add.at(loops, dst[loop], w[loop])
        has = np.zeros(n, dtype=bool)
        has[dst[loop]] = True
        diag[has] = loops[has]
    keep = ~loop
    a = sp.coo_matrix((w[keep], (dst[keep], src[keep])), shape=(n, n)).tocsr()
    a.sum_duplicates()
    a = (a + sp.diags(diag)).tocsr()
    deg = np.asarray(a.sum(axis=1)).ravel()
    dinv = np.zeros(n)
    dinv[deg > 0] = deg[deg > 0] ** -0.5
    d = sp.diags(dinv)
    a = (d @ a @ d).tocsr().astype(np.float32)
    a.sort_indices()
    return a


def main():
    t0 = time.perf_counter()
    a = gcn_adjacency(args.input)
    n, nnz = a.shape[0], a.nnz
    print(f"# matrix: {n} nodes, {nnz} non-zeros, built in {time.perf_counter() - t0:.1f} s; "
          f"MKL threads {sparse_dot_mkl.mkl_get_max_threads()}", file=sys.stderr)
    rng = np.random.default_rng(args.seed)
    for f in args.features:
        x = rng.uniform(-1.0, 1.0, size=(n, f)).astype(np.float32)
        y = sparse_dot_mkl.dot_product_mkl(a, x)  # warm-up (and correctness check below)
        ref = a @ x
        err = float(np.max(np.abs(y - ref)) / max(1.0, float(np.max(np.abs(ref)))))
        if err > 1e-4:
            sys.exit(f"MKL result differs from scipy by {err:.2e} at F={f}")
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            sparse_dot_mkl.dot_product_mkl(a, x)
            times.append(time.perf_counter() - t)
        times.sort()
        median = times[len(times) // 2]
        print(json.dumps({
            "library": "mkl", "features": f, "seconds": median, "min_seconds": times[0],
            "gflops": 2.0 * nnz * f / median / 1e9, "nnz": nnz, "nodes": n,
            "threads": args.threads,
        }), flush=True)


if __name__ == "__main__":
    main()
