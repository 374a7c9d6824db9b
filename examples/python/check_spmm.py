"""One distributed forward and backward through libdistspmm (ctypes), checked against SciPy.

    mpirun -n 2 python examples/python/check_spmm.py --chunks DIR --graph GRAPH.npz

DIR is `distspmm partition --input GRAPH.npz --parts 2 --out DIR`. mpi4py initialises MPI and
the library adopts its communicator (MPI.COMM_WORLD.py2f()). Each rank multiplies its rows;
the result is compared with the same rows of Ahat @ X computed by SciPy from the .npz with the
directory's normalisation (gcn: D^-1/2 (A+I) D^-1/2 with PyG's self loops; row; none), for
every schedule. The chunk's node data (features, labels, masks) is checked against the .npz
too. Exits non-zero on every rank if any rank finds a difference.
"""

import argparse
import json
import os
import sys

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

# The package python/distspmm of this repository (or an installed one of the same name).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from distspmm import (  # noqa: E402
    MASK_TEST,
    MASK_TRAIN,
    MASK_VAL,
    Chunk,
    Comm,
    DistSpmmError,
    Spmm,
    SpmmDevice,
    built_with_cuda,
    load,
)


def normalized_adjacency(npz, num_nodes, normalization):
    """Ahat as distspmm builds it: edge u -> v is Ahat[v, u]; duplicates summed."""
    src, dst = npz["edge_index"].astype(np.int64)
    weights = npz["edge_weight"].astype(np.float64) if "edge_weight" in npz else np.ones(len(src))
    a = sp.coo_matrix((weights, (dst, src)), shape=(num_nodes, num_nodes)).tocsr()
    a.sum_duplicates()
    if normalization == "none":
        return a
    # add_remaining_self_loops: a node keeps its own self loop(s), the others get weight 1.
    has_loop = np.zeros(num_nodes, dtype=bool)
    has_loop[src[src == dst]] = True
    a = a + sp.diags(np.where(has_loop, 0.0, 1.0))
    degree = np.asarray(a.sum(axis=1)).ravel()
    inv = np.zeros_like(degree)
    positive = degree > 0
    if normalization == "gcn":
        inv[positive] = degree[positive] ** -0.5
        return sp.diags(inv) @ a @ sp.diags(inv)
    inv[positive] = 1.0 / degree[positive]
    return sp.diags(inv) @ a


def check_device_refused(comm, chunk, problems):
    """In a build without CUDA the device operator is refused with UNSUPPORTED on every rank (a
    collective outcome, so no rank is left waiting) and the host operator stays usable. Returns
    whether it checked (False in a CUDA build)."""
    if built_with_cuda():
        return False
    try:
        SpmmDevice(comm, chunk, "halo").close()
        problems.append("SpmmDevice was created by a library built without CUDA")
    except DistSpmmError as e:
        if e.status != "UNSUPPORTED":
            problems.append(f"SpmmDevice without CUDA: {e}")
    return True


def report_and_exit(comm, chunk, lines, problems):
    """The check scripts' ending: one `rank R: ... : ok` (or `FAILED: ...`) line per rank, then
    exit status 1 on every rank if any rank found a problem."""
    failed = comm.allreduce_sum(np.array([float(bool(problems))]))[0]
    verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
    say(f"rank {comm.rank}: {' | '.join(lines)}: {verdict}")
    chunk.close()
    sys.exit(1 if failed else 0)


def say(line, stream=sys.stdout):
    """One write per line, so the lines of concurrent ranks do not interleave."""
    stream.write(line + "\n")
    stream.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", required=True, help="chunk directory for this many ranks")
    parser.add_argument("--graph", required=True, help="the .npz the directory was made from")
    parser.add_argument("--lib", help="path to libdistspmm.so (default: see distspmm.load)")
    parser.add_argument("--cols", type=int, default=8, help="columns of X")
    parser.add_argument("--schedule", choices=["halo", "broadcast", "both"], default="both")
    args = parser.parse_args()

    load(args.lib)
    comm = Comm(MPI.COMM_WORLD)
    assert comm.rank == MPI.COMM_WORLD.Get_rank() and comm.size == MPI.COMM_WORLD.Get_size()
    chunk = Chunk(comm, args.chunks)
    with open(os.path.join(args.chunks, "manifest.json")) as f:
        normalization = json.load(f)["normalization"]
    npz = np.load(args.graph)
    n_global = chunk.num_global_nodes
    ids = chunk.original_ids.astype(np.int64)
    n = chunk.num_local_nodes
    assert ids.shape == (n,)
    problems = []

    # Zero-copy node data against the .npz.
    if "x" in npz:
        if not np.array_equal(chunk.features, npz["x"][ids]):
            problems.append("features differ from the .npz rows")
        if chunk.features.flags.writeable:
            problems.append("features must be read-only")
    if "y" in npz and not np.array_equal(chunk.labels, npz["y"][ids].astype(np.int32)):
        problems.append("labels differ")
    if "train_mask" in npz:
        expected = (
            npz["train_mask"][ids] * MASK_TRAIN
            + npz["val_mask"][ids] * MASK_VAL
            + npz["test_mask"][ids] * MASK_TEST
        ).astype(np.uint8)
        if not np.array_equal(chunk.masks, expected):
            problems.append("masks differ")

    a_hat = normalized_adjacency(npz, n_global, normalization)
    rng = np.random.default_rng(0)  # the same global X and dY on every rank
    x = rng.standard_normal((n_global, args.cols)).astype(np.float32)
    dy = rng.standard_normal((n_global, args.cols)).astype(np.float32)
    y_ref = (a_hat @ x.astype(np.float64))[ids]
    dx_ref = (a_hat.T @ dy.astype(np.float64))[ids]

    schedules = ["halo", "broadcast"] if args.schedule == "both" else [args.schedule]
    for schedule in schedules:
        op = Spmm(comm, chunk, schedule)
        # X_p as a column slice of a wider array: a leading dimension of cols + 3.
        wide = np.zeros((n, args.cols + 3), dtype=np.float32)
        wide[:, 1 : 1 + args.cols] = x[ids]
        y = op.forward(wide[:, 1 : 1 + args.cols])
        dx = op.backward(dy[ids])
        scale = max(1.0, float(np.abs(y_ref).max(initial=0.0)))
        err_forward = float(np.abs(y - y_ref).max(initial=0.0)) / scale
        scale = max(1.0, float(np.abs(dx_ref).max(initial=0.0)))
        err_backward = float(np.abs(dx - dx_ref).max(initial=0.0)) / scale
        sent, received = op.bytes_last_call
        say(
            f"check_spmm: rank {comm.rank}/{comm.size} {schedule}: n_p={n} "
            f"forward err={err_forward:.2e} backward err={err_backward:.2e} "
            f"bytes sent={sent} received={received}"
        )
        if not (err_forward < 1e-5 and err_backward < 1e-5):
            problems.append(f"{schedule}: relative error above 1e-5")
        op.close()

    # The device operator: in a build without CUDA every rank is refused with UNSUPPORTED and
    # can go on using the host operator.
    if check_device_refused(comm, chunk, problems):
        say(f"check_spmm: rank {comm.rank}: device operator refused without CUDA, as documented")

    failed = np.array([float(len(problems))])
    comm.allreduce_sum(failed)
    for p in problems:
        say(f"check_spmm: rank {comm.rank}: {p}", sys.stderr)
    chunk.close()
    comm.close()
    if failed[0] > 0:
        sys.exit(1)
    say(f"check_spmm: rank {MPI.COMM_WORLD.Get_rank()}: ok")


if __name__ == "__main__":
    main()
