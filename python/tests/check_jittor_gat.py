"""distspmm.jittor's DistGATConv checked against a dense NumPy reference, on every rank.

    use_mkl=0 mpirun -n 2 python python/tests/check_jittor_gat.py --chunks DIR --graph GRAPH.npz

DIR is `distspmm partition --input GRAPH.npz --parts P --out DIR`; also runs without mpirun for
P = 1. The reference is GATConv's definition computed densely in float64 from the .npz alone:
the attention mask is the input's edges plus one self loop per node (edge weights and
duplicates play no part in attention), LeakyReLU with slope 0.2, the softmax over each row, the
heads concatenated or averaged, and its gradient of `sum(out * G)` for a fixed random G derived
by hand. The layer's output rows, its input gradient and its parameter gradients (summed over
the ranks) must agree within 1e-5 relative to the largest reference entry.

Prints one `rank R: ... ok` line per rank; exits non-zero on every rank if any rank fails.
"""

import argparse
import os
import sys

import jittor as jt  # first: under mpirun Jittor initialises MPI itself
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from check_spmm import report_and_exit  # noqa: E402 - the shared ending
from distspmm import Chunk, Spmm, load  # noqa: E402
from distspmm.jittor import DistGATConv, communicator  # noqa: E402

TOLERANCE = 1e-5  # relative, float32 layer against the float64 reference


def relative_error(got, want):
    scale = max(float(np.abs(want).max()), 1e-30)
    return float(np.abs(np.asarray(got, dtype=np.float64) - want).max()) / scale


def dense_gat(x, mask, weight, att_src, att_dst, bias, heads, concat, slope, g):
    """GATConv's output and the gradients of sum(out * g), densely in float64: returns
    (out, {"x", "lin.weight", "att_src", "att_dst", "bias"} gradients)."""
    n = x.shape[0]
    c = att_src.shape[-1]
    z = x @ weight.T
    zh = z.reshape(n, heads, c)
    a_src, a_dst = att_src.reshape(heads, c), att_dst.reshape(heads, c)
    s = np.einsum("nhc,hc->hn", zh, a_dst)  # destination halves
    t = np.einsum("nhc,hc->hn", zh, a_src)  # source halves
    e = s[:, :, None] + t[:, None, :]  # (heads, i, j)
    leaky = np.where(e > 0, e, slope * e)
    masked = np.where(mask[None], leaky, -np.inf)
    alpha = np.exp(masked - masked.max(axis=2, keepdims=True))
    alpha /= alpha.sum(axis=2, keepdims=True)
    heads_out = np.einsum("hij,jhc->ihc", alpha, zh)
    out = heads_out.reshape(n, heads * c) if concat else heads_out.mean(axis=1)
    if bias is not None:
        out = out + bias
    # Backward of sum(out * g).
    d_heads = g.reshape(n, heads, c) if concat else np.repeat(g[:, None, :] / heads, heads, 1)
    d_alpha = np.einsum("ihc,jhc->hij", d_heads, zh)
    d_zh = np.einsum("hij,ihc->jhc", alpha, d_heads)
    d_leaky = alpha * (d_alpha - (alpha * d_alpha).sum(axis=2, keepdims=True))
    d_e = d_leaky * np.where(e > 0, 1.0, slope)
    ds, dt = d_e.sum(axis=2), d_e.sum(axis=1)  # (heads, n) each
    d_zh = d_zh + ds.T[:, :, None] * a_dst + dt.T[:, :, None] * a_src
    grads = {
        "att_dst": np.einsum("hn,nhc->hc", ds, zh).reshape(att_dst.shape),
        "att_src": np.einsum("hn,nhc->hc", dt, zh).reshape(att_src.shape),
    }
    dz = d_zh.reshape(n, heads * c)
    grads["lin.weight"] = dz.T @ x
    grads["x"] = dz @ weight
    if bias is not None:
        grads["bias"] = g.sum(axis=0)
    return out, grads


def check_gat(comm, chunk, op, npz, ids, rng, problems, heads, channels, concat, bias):
    n = chunk.num_global_nodes
    edge_index = npz["edge_index"].astype(np.int64)
    mask = np.eye(n, dtype=bool)
    mask[edge_index[1], edge_index[0]] = True  # message j -> i is row i, column j
    x_global = npz["x"].astype(np.float64)
    features = x_global.shape[1]
    np.random.seed(5)  # the same weights on every rank
    conv = DistGATConv(features, channels, heads=heads, concat=concat, bias=bias)
    width = heads * channels if concat else channels
    if bias:
        conv.bias = jt.array(rng.uniform(-1, 1, width).astype(np.float32))
    g = rng.standard_normal((n, width))
    params = {k: v.numpy().astype(np.float64) for k, v in conv.state_dict().items()}
    want, want_grads = dense_gat(
        x_global, mask, params["lin.weight"], params["att_src"], params["att_dst"],
        params.get("bias"), heads, concat, 0.2, g,
    )
    x = jt.array(x_global[ids].astype(np.float32))
    out = conv(x, op)
    loss = (out * jt.array(g[ids].astype(np.float32))).sum()
    names = ["x"] + list(conv.state_dict())
    variables = [x] + [conv.state_dict()[k] for k in names[1:]]
    grads = dict(zip(names, (v.numpy().astype(np.float64) for v in jt.grad(loss, variables))))
    for k in names[1:]:  # parameters: summed over the ranks
        comm.allreduce_sum(grads[k])
    errors = {"out": relative_error(out.numpy(), want[ids]),
              "x": relative_error(grads["x"], want_grads["x"][ids])}
    for k in names[1:]:
        errors[k] = relative_error(grads[k], want_grads[k])
    name = f"GAT {heads}x{channels}{'' if concat else ' mean'}{'' if bias else ' no bias'}"
    bad = [f"{k} {v:.1e}" for k, v in errors.items() if not v <= TOLERANCE]
    if bad:
        problems.append(f"{name} vs the dense reference: " + ", ".join(bad))
    return f"{name} out {errors['out']:.0e} grads {max(errors.values()):.0e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", required=True)
    parser.add_argument("--graph", required=True, help="the .npz the directory was made from")
    parser.add_argument("--lib", help="path to libdistspmm.so")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    load(args.lib)
    comm = communicator()
    chunk = Chunk(comm, args.chunks)
    npz = np.load(args.graph)
    ids = chunk.original_ids.astype(np.int64)
    rng = np.random.default_rng(args.seed)  # the same draws on every rank
    problems, lines = [], []
    try:
        op = Spmm(comm, chunk, "halo")
        for heads, channels, concat, bias in ((3, 4, True, True), (2, 3, False, False)):
            lines.append(
                check_gat(comm, chunk, op, npz, ids, rng, problems, heads, channels, concat, bias)
            )
        op.close()
    except Exception as e:  # noqa: BLE001 - reported, and the other ranks told
        problems.append(f"{type(e).__name__}: {e}")
    report_and_exit(comm, chunk, lines, problems)


if __name__ == "__main__":
    main()
