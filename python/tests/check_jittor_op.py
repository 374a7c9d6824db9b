"""The Jittor operator checked against SciPy and finite differences, on every rank.

    use_mkl=0 mpirun -n 2 python python/tests/check_jittor_op.py --chunks DIR --graph GRAPH.npz

DIR is `distspmm partition --input GRAPH.npz --parts P --out DIR`; also runs without mpirun for
P = 1. For each schedule, `DistSpmm(op, x)` and `DistSpmm(op, x, transpose=True)` must equal this
rank's rows of `Ahat X` and `Ahat^T X` built by SciPy from the .npz, and their Jittor gradients
`Ahat^T G` and `Ahat G`. Then a two-layer model, NLL of log_softmax(Ahat tanh(Ahat X W1) W2) over
the training nodes of all ranks: the gradient Jittor computes per rank for the loss scaled as
the example scales it (local sum x P / training nodes of all ranks), averaged over the ranks as
Jittor's optimisers average it, must match central finite differences of the global mean loss.
Prints one `rank R: ... ok` line per rank; exits non-zero on every rank if any rank fails.
"""

import argparse
import json
import os
import sys

import jittor as jt  # first: under mpirun Jittor initialises MPI itself
import numpy as np
from jittor import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from check_spmm import normalized_adjacency, report_and_exit  # noqa: E402 - SciPy's Ahat
from distspmm import MASK_TRAIN, Chunk, Spmm, load  # noqa: E402
from distspmm.jittor import DistSpmm, communicator  # noqa: E402

PRODUCT_TOLERANCE = 1e-5  # relative, float32 products against float64 SciPy
GRADIENT_TOLERANCE = 2e-3  # relative to the largest gradient entry, central differences in f32


def relative_error(got, want):
    scale = max(np.abs(want).max(), 1e-30)
    return float(np.abs(np.asarray(got, dtype=np.float64) - want).max() / scale)


def check_products(comm, chunk, a_hat, ids, cols, rng, problems):
    n = a_hat.shape[0]
    x_global = rng.standard_normal((n, cols)).astype(np.float32)
    g_global = rng.standard_normal((n, cols)).astype(np.float32)
    lines = []
    for schedule in ("halo", "broadcast"):
        op = Spmm(comm, chunk, schedule)
        for transpose in (False, True):
            m = a_hat.T.tocsr() if transpose else a_hat
            x = jt.array(x_global[ids])
            y = DistSpmm(op, x, transpose)
            forward = relative_error(y.numpy(), (m @ x_global.astype(np.float64))[ids])
            dx = jt.grad((y * jt.array(g_global[ids])).sum(), x)
            backward = relative_error(dx.numpy(), (m.T @ g_global.astype(np.float64))[ids])
            name = f"{schedule}{' transpose' if transpose else ''}"
            lines.append(f"{name}: forward err={forward:.1e} backward err={backward:.1e}")
            for what, err in (("forward", forward), ("backward", backward)):
                if not err <= PRODUCT_TOLERANCE:
                    problems.append(f"{name} {what} error {err:.2e} > {PRODUCT_TOLERANCE}")
        op.close()
    return lines


def check_two_layers(comm, chunk, rng, problems, hidden=5, probes=6, eps=5e-2):
    parts = comm.size
    features = np.array(chunk.features, dtype=np.float32)
    labels = np.array(chunk.labels)
    train = (np.array(chunk.masks) & MASK_TRAIN != 0) & (labels >= 0)
    n_train = comm.allreduce_sum(np.array([float(train.sum())]))[0]
    classes = chunk.num_classes
    w1 = (0.5 * rng.standard_normal((chunk.num_features, hidden))).astype(np.float32)
    w2 = (0.5 * rng.standard_normal((hidden, classes))).astype(np.float32)
    op = Spmm(comm, chunk, "halo")
    x = jt.array(features).stop_grad()
    index = jt.array(np.flatnonzero(train).astype(np.int32))
    target = jt.array(labels[train].astype(np.int32))

    def local_nll_sum(w1_var, w2_var):
        h = jt.tanh(DistSpmm(op, x @ w1_var))
        out = nn.log_softmax(DistSpmm(op, h @ w2_var), dim=1)
        if not train.any():  # keep the collective backward on ranks without training nodes
            return (out * 0.0).sum()
        return nn.nll_loss(out[index], target, reduction="sum")

    def global_mean_loss(w1_value, w2_value):
        with jt.no_grad():
            local = float(local_nll_sum(jt.array(w1_value), jt.array(w2_value)).item())
        return comm.allreduce_sum(np.array([local]))[0] / n_train

    w1_var, w2_var = jt.array(w1), jt.array(w2)
    scaled = local_nll_sum(w1_var, w2_var) * (parts / n_train)
    grads = jt.grad(scaled, [w1_var, w2_var])
    if jt.in_mpi:  # what jittor.optim.Optimizer.backward does to every gradient
        grads = [g.mpi_all_reduce("mean") for g in grads]
    grads = [g.numpy() for g in grads]

    worst = 0.0
    for which, (weight, grad) in enumerate(zip((w1, w2), grads)):
        scale = max(np.abs(grad).max(), 1e-12)
        for flat in rng.choice(weight.size, size=min(probes, weight.size), replace=False):
            coord = np.unravel_index(flat, weight.shape)
            plus, minus = [w.copy() for w in (w1, w2)], [w.copy() for w in (w1, w2)]
            plus[which][coord] += eps
            minus[which][coord] -= eps
            fd = (global_mean_loss(*plus) - global_mean_loss(*minus)) / (2 * eps)
            err = abs(fd - float(grad[coord])) / scale
            worst = max(worst, err)
            if not err <= GRADIENT_TOLERANCE:
                problems.append(
                    f"W{which + 1}{tuple(int(c) for c in coord)}: autograd {grad[coord]:.6e}, "
                    f"finite differences {fd:.6e}"
                )
    op.close()
    return f"two layers: gradient vs finite differences err={worst:.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", required=True)
    parser.add_argument("--graph", required=True, help="the .npz the directory was made from")
    parser.add_argument("--lib", help="path to libdistspmm.so")
    parser.add_argument("--cols", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    load(args.lib)
    comm = communicator()
    chunk = Chunk(comm, args.chunks)
    with open(os.path.join(args.chunks, "manifest.json")) as f:
        normalization = json.load(f)["normalization"]
    a_hat = normalized_adjacency(np.load(args.graph), chunk.num_global_nodes, normalization)
    ids = chunk.original_ids.astype(np.int64)
    rng = np.random.default_rng(args.seed)  # the same draws on every rank
    problems = []
    lines = check_products(comm, chunk, a_hat, ids, args.cols, rng, problems)
    lines.append(check_two_layers(comm, chunk, rng, problems))
    report_and_exit(comm, chunk, lines, problems)


if __name__ == "__main__":
    main()
