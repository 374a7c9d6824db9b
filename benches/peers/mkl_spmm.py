#!/usr/bin/env python3
"""Times Intel MKL's sparse x dense product at its best on the GCN-normalised adjacency matrix
of a graph, for comparison with `distspmm bench spmm`: the inspector-executor API from C
(`mkl_spmm.c`: handle created once, mkl_sparse_set_mm_hint + mkl_sparse_optimize before timing,
preallocated huge-page X and Y, row-major), not a Python wrapper's per-call path.

Builds the same matrix as distspmm_prep::normalize::adjacency(.., Gcn): entry A[v][u] for each
edge u -> v (edge_index[0] = u, edge_index[1] = v), duplicates summed, self loops as PyG's
add_remaining_self_loops (an existing loop keeps its weight, other nodes get 1), then
D^-1/2 (A + I) D^-1/2 with D the row sums. X is uniform in [-1, 1), float32, row-major.
The CSR arrays go to a scratch directory; the C program (compiled on first use against the
PyPI `mkl` + `mkl-include` wheels of this Python's prefix) maps them and times REPS calls.

Prints one JSON line per feature width and product:
{"library": "mkl", "product": "csr" | "transpose", "method", "features", "seconds" (median),
 "min_seconds", "gflops" (2 nnz F / seconds), "nnz", "nodes", "threads", "max_error"}
With --transpose it times A^T.X both ways MKL offers and reports each: from A's CSR handle
with SPARSE_OPERATION_TRANSPOSE (method "transpose-op") and from the CSR of A^T, i.e. the CSC
arrays distspmm's transposed kernel reads (method "csr-of-transpose"); the faster is the peer.

    pip install mkl mkl-include scipy numpy
    python3 benches/peers/mkl_spmm.py --input G.npz --features 16 64 256 --threads 2 [--transpose]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="graph .npz with edge_index [2, E] (PyG layout)")
    p.add_argument("--features", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10, help="timed repetitions after one warm-up")
    p.add_argument("--transpose", action="store_true", help="time A^T.X instead of A.X")
    p.add_argument("--build-dir", default="target/peers", help="where the C program is compiled")
    return p.parse_args()


args = parse_args()
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def mkl_program():
    """Compiles mkl_spmm.c against this prefix's MKL wheels (once per source change)."""
    src = os.path.join(HERE, "mkl_spmm.c")
    out = os.path.join(args.build_dir, "mkl_spmm")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(src):
        return out
    inc, lib = os.path.join(sys.prefix, "include"), os.path.join(sys.prefix, "lib")
    if not os.path.exists(os.path.join(inc, "mkl_spblas.h")):
        sys.exit(f"no mkl_spblas.h under {inc}: pip install mkl-include (and mkl) into {sys.prefix}")
    rt = sorted(glob.glob(os.path.join(lib, "libmkl_rt.so.*")))
    if not rt:
        sys.exit(f"no libmkl_rt.so.* under {lib}: pip install mkl into {sys.prefix}")
    os.makedirs(args.build_dir, exist_ok=True)
    cmd = [os.environ.get("CC", "cc"), "-O2", "-std=c11", src, f"-I{inc}", f"-L{lib}",
           f"-l:{os.path.basename(rt[-1])}", f"-Wl,-rpath,{lib}", "-o", out]
    subprocess.run(cmd, check=True)
    return out


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


def write_csr(a, d):
    a = a.tocsr()
    a.sort_indices()
    a.indptr.astype(np.int32).tofile(os.path.join(d, "indptr.i32"))
    a.indices.astype(np.int32).tofile(os.path.join(d, "indices.i32"))
    a.data.astype(np.float32).tofile(os.path.join(d, "values.f32"))
    with open(os.path.join(d, "shape.txt"), "w") as f:
        f.write(f"{a.shape[0]} {a.shape[1]} {a.nnz}\n")


def main():
    prog = mkl_program()
    t0 = time.perf_counter()
    a = gcn_adjacency(args.input)
    n, nnz = a.shape[0], a.nnz
    print(f"# matrix: {n} nodes, {nnz} non-zeros, built in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    env = dict(os.environ, MKL_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
               MKL_DYNAMIC="FALSE")
    with tempfile.TemporaryDirectory(prefix="mkl-spmm-") as tmp:
        csr, csr_t = os.path.join(tmp, "a"), os.path.join(tmp, "at")
        os.makedirs(csr)
        write_csr(a, csr)
        runs = [("csr", "csr", csr, [])]
        if args.transpose:
            os.makedirs(csr_t)
            write_csr(a.T, csr_t)
            runs = [("transpose", "transpose-op", csr, ["transpose"]),
                    ("transpose", "csr-of-transpose", csr_t, ["csc"])]
        for f in args.features:
            for product, method, d, mode in runs:
                r = subprocess.run([prog, d, str(f), str(args.reps), *mode], env=env, check=True,
                                   capture_output=True, text=True)
                median, best, err = (float(v) for v in r.stdout.split())
                if err > 1e-4:
                    sys.exit(f"MKL ({method}) differs from the reference by {err:.2e} at F={f}")
                print(json.dumps({
                    "library": "mkl", "product": product, "method": method, "features": f,
                    "seconds": median, "min_seconds": best,
                    "gflops": 2.0 * nnz * f / median / 1e9, "nnz": nnz, "nodes": n,
                    "threads": args.threads, "max_error": err,
                }), flush=True)


if __name__ == "__main__":
    main()
