"""DistSAGEConv, DistGINConv and DistGATConv checked against PyG's layers, on every rank.

    mpirun -n 2 python python/tests/check_torch_layers.py --chunks DIR --graph GRAPH.npz

DIR is `distspmm partition --input GRAPH.npz --parts P --out DIR` (GCN normalisation, which
stores A + I: the input's edges and one self loop per node); also runs without mpirun for P = 1.
GRAPH.npz must be unweighted (PyG's SAGEConv, GINConv and GATConv ignore edge weights).

- edges: the stored entries of this rank's rows, as (destination, source) original ids, are
  the edge multiset PyG's GATConv uses (`remove_self_loops` + `add_self_loops` of the .npz's
  edge_index) restricted to this rank's nodes, and `edge_weights` is each edge's multiplicity in
  the .npz (0 at the added self loops);
- each layer (several configurations) against PyG's, run by PyG in float64 on the whole graph
  in the same process from the same state_dict: the output rows, the input gradient and the
  parameter gradients (summed over the ranks by `sync_gradients`) of `sum(out * G)` for a fixed
  random G, within 1e-5 relative to the largest reference entry (of the output, of the input
  gradient, of all the parameter gradients); the state_dict loaded both ways;
- at P = 1, `torch.autograd.gradcheck` of each layer (input and parameters) in float32, with a
  step and tolerances suited to float32 (the library computes in float32 only), on smooth
  configurations (`smooth_layers`);
- at every P, DistGATConv's gradient of the global loss against central differences of that
  loss (all ranks perturb the same global coordinate together);
- the errors for bad per-edge operands (a wrong count on one rank fails on every rank).

Prints one `rank R: ... ok` line per rank; exits non-zero on every rank if any rank fails.
"""

import argparse
import os
import sys
import warnings

import numpy as np
import torch
from torch_geometric.nn import GATConv, GINConv, SAGEConv
from torch_geometric.utils import add_self_loops, remove_self_loops

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from check_spmm import report_and_exit  # noqa: E402 - the shared ending
from distspmm import Chunk, DistSpmmError, Spmm, load  # noqa: E402
from distspmm.torch import (  # noqa: E402
    DistGATConv,
    DistGINConv,
    DistSAGEConv,
    DistSpmmValues,
    EdgeSoftmax,
    communicator,
    edge_weights,
    global_sum,
    sync_gradients,
)

PYG_TOLERANCE = 1e-5  # relative to the largest reference entry (float32 against float64)
GRADIENT_TOLERANCE = 2e-3  # relative to the largest gradient entry, central differences in f32


def relative_error(got, want):
    got, want = got.detach().double(), want.detach().double()
    if want.numel() == 0:
        return 0.0
    scale = max(float(want.abs().max()), 1e-30)
    return float((got - want).abs().max()) / scale


def renumbered_to_original(comm, chunk):
    """Every node's original id, indexed by its global (renumbered) id: each rank fills its
    range, summed over the ranks (ids below 2^53 are exact in float64)."""
    table = np.zeros(chunk.num_global_nodes, dtype=np.float64)
    offset = chunk.global_offset
    table[offset : offset + chunk.num_local_nodes] = chunk.original_ids.astype(np.float64)
    comm.allreduce_sum(table)
    return torch.from_numpy(table.astype(np.int64))


def check_edges(comm, chunk, op, edge_index, ids, problems):
    """The stored entries are GATConv's edge set, with the multiplicities as weights."""
    n = chunk.num_global_nodes
    rows, sources = (torch.from_numpy(a) for a in op.edges())
    original = renumbered_to_original(comm, chunk)
    ours = ids[rows] * n + original[sources]  # destination * n + source, original ids
    gat_edges, _ = add_self_loops(remove_self_loops(edge_index)[0], num_nodes=n)
    mine = torch.zeros(n, dtype=torch.bool)
    mine[ids] = True
    gat_edges = gat_edges[:, mine[gat_edges[1]]]
    theirs = gat_edges[1] * n + gat_edges[0]
    if not torch.equal(torch.sort(ours).values, torch.sort(theirs).values):
        problems.append(
            f"stored entries ({len(ours)}) differ from GATConv's edges into this rank's nodes "
            f"({len(theirs)})"
        )
    keys, counts = torch.unique(edge_index[1] * n + edge_index[0], return_counts=True)
    position = torch.searchsorted(keys, ours).clamp(max=len(keys) - 1)
    want = torch.where(keys[position] == ours, counts[position], 0).float()
    weights = edge_weights(op, "sum").view(-1)
    if not torch.equal(weights, want):
        problems.append("edge_weights differ from the .npz's edge multiplicities")
    mean = edge_weights(op, "mean").view(-1)
    sums = torch.zeros(chunk.num_local_nodes, dtype=torch.float64).index_add_(
        0, rows, want.double()
    )
    mean_want = torch.where(sums[rows] > 0, want.double() / sums[rows], 0.0)
    if relative_error(mean, mean_want) > 1e-7:
        problems.append("edge_weights(op, 'mean') is not the weights over their row sums")
    return f"edges: {len(ours)} stored = GATConv's"


def layer_pairs(features):
    """(name, PyG layer factory, our layer factory, output width) for every configuration."""

    def mlp():
        return torch.nn.Sequential(
            torch.nn.Linear(features, 7), torch.nn.ReLU(), torch.nn.Linear(7, 5)
        )

    f = features
    return [
        ("SAGE", lambda: SAGEConv(f, 6), lambda: DistSAGEConv(f, 6), 6),
        ("SAGE narrow", lambda: SAGEConv(f, 3), lambda: DistSAGEConv(f, 3), 3),
        (
            "SAGE sum/normalize/project",
            lambda: SAGEConv(f, 9, aggr="sum", normalize=True, project=True, root_weight=False),
            lambda: DistSAGEConv(f, 9, aggr="sum", normalize=True, project=True,
                                 root_weight=False),
            9,
        ),
        ("GIN", lambda: GINConv(mlp()), lambda: DistGINConv(mlp()), 5),
        ("GIN train_eps", lambda: GINConv(mlp(), eps=0.3, train_eps=True),
         lambda: DistGINConv(mlp(), eps=0.3, train_eps=True), 5),
        ("GAT 3x4", lambda: GATConv(f, 4, heads=3), lambda: DistGATConv(f, 4, heads=3), 12),
        ("GAT 8x8", lambda: GATConv(f, 8, heads=8), lambda: DistGATConv(f, 8, heads=8), 64),
        (
            "GAT 2x3 mean/residual",
            lambda: GATConv(f, 3, heads=2, concat=False, residual=True),
            lambda: DistGATConv(f, 3, heads=2, concat=False, residual=True),
            3,
        ),
        ("GAT 1x5 no bias", lambda: GATConv(f, 5, bias=False),
         lambda: DistGATConv(f, 5, bias=False), 5),
    ]


def randomise_biases(layer):
    """Biases are zero at GATConv's init: drawn so that they count."""
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-1, 1)


def shapes(state):
    return {k: tuple(v.shape) for k, v in state.items()}


def check_layers(comm, chunk, op, graph, ids, generator, problems):
    x_global, edge_index = graph
    n = chunk.num_global_nodes
    lines = []
    for name, make_pyg, make_ours, width in layer_pairs(x_global.shape[1]):
        torch.manual_seed(5)  # the same weights on every rank
        pyg, ours = make_pyg(), make_ours()
        randomise_biases(pyg)
        pyg_state = pyg.state_dict()
        if shapes(pyg_state) != shapes(ours.state_dict()):
            problems.append(f"{name}: state_dict layouts differ: {shapes(pyg_state)} vs "
                            f"{shapes(ours.state_dict())}")
            continue
        ours.load_state_dict(pyg_state)
        back = make_pyg()  # the other way: our weights into a fresh PyG layer
        back.load_state_dict(ours.state_dict())
        if any(not torch.equal(back.state_dict()[k], pyg_state[k]) for k in pyg_state):
            problems.append(f"{name}: our state_dict does not load back into PyG's layer")
        g_global = torch.randn((n, width), generator=generator)
        # PyG in float64: the errors are ours alone.
        pyg.double()
        x_ref = x_global.double().requires_grad_()
        out_ref = pyg(x_ref, edge_index)
        (out_ref * g_global).sum().backward()
        x = x_global[ids].clone().requires_grad_()
        out = ours(x, op)
        (out * g_global[ids]).sum().backward()
        sync_gradients(ours, comm)
        errors = {"out": relative_error(out, out_ref[ids]),
                  "dx": relative_error(x.grad, x_ref.grad[ids])}
        # Parameter gradients relative to the largest of them all: att_dst's is a sum over
        # softmax rows whose gradients cancel (to 0 but for LeakyReLU), so its own largest
        # entry understates the magnitude of what float32 summed.
        scale = max(float(p.grad.abs().max()) for p in pyg.parameters())
        for key, p in pyg.named_parameters():
            error = (ours.get_parameter(key).grad.double() - p.grad).abs().max()
            errors[key] = float(error) / scale
        worst = max(errors.values())
        if not worst <= PYG_TOLERANCE:
            problems.append(f"{name} vs PyG: " + ", ".join(
                f"{k} {v:.1e}" for k, v in errors.items() if not v <= PYG_TOLERANCE))
        lines.append(f"{name} out {errors['out']:.0e} grads {worst:.0e}")
    return lines


def smooth_layers(features):
    """(name, factory, output width) of the layers gradcheck differentiates: smooth ones, as a
    kink (ReLU, LeakyReLU) inside a central difference's step breaks it, and with hundreds of
    logits some always sit within 1e-3 of LeakyReLU's. So the MLP is tanh and GAT's slope 1.0
    (the plain edge softmax); LeakyReLU's gradient (slope 0.2) is checked against PyG's."""

    def mlp():
        return torch.nn.Sequential(
            torch.nn.Linear(features, 7), torch.nn.Tanh(), torch.nn.Linear(7, 5)
        )

    f = features
    return [
        ("SAGE", lambda: DistSAGEConv(f, 6), 6),
        ("SAGE sum narrow", lambda: DistSAGEConv(f, 3, aggr="sum", normalize=True), 3),
        ("GIN train_eps", lambda: DistGINConv(mlp(), eps=0.3, train_eps=True), 5),
        ("GAT 3x4", lambda: DistGATConv(f, 4, heads=3, negative_slope=1.0), 12),
        ("GAT 2x3 mean/residual",
         lambda: DistGATConv(f, 3, heads=2, concat=False, residual=True, negative_slope=1.0), 3),
    ]


def check_gradcheck(comm, chunk, op, x_global, ids, generator, problems):
    """torch.autograd.gradcheck in float32 at P = 1 (per rank it would perturb different
    numbers of local entries and break the collective order): the input and every parameter,
    the output reduced to its column sums against a fixed random G (few outputs: few backward
    passes), central differences with a step of 1e-3."""
    if comm.size != 1:
        return "gradcheck: P=1 only"
    results = []
    for name, make, width in smooth_layers(x_global.shape[1]):
        torch.manual_seed(5)
        layer = make()
        randomise_biases(layer)
        names = [k for k, _ in layer.named_parameters()]
        g = torch.randn((len(ids), width), generator=generator) / len(ids)

        def reduced(x, *values):
            values = dict(zip(names, values))
            return (torch.func.functional_call(layer, values, (x, op)) * g).sum(0)

        inputs = [x_global[ids].clone().requires_grad_()]
        inputs += [p.detach().clone().requires_grad_() for p in layer.parameters()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not a double precision" input: on purpose
            try:
                torch.autograd.gradcheck(reduced, tuple(inputs), eps=1e-3, atol=2e-4,
                                         rtol=1e-2, raise_exception=True)
                results.append(f"{name} passed")
            except RuntimeError as e:
                results.append(f"{name} FAILED")
                problems.append(f"gradcheck {name}: {str(e).splitlines()[0]}")
    return "f32 gradcheck " + ", ".join(results)


def check_gat_finite_differences(comm, chunk, op, x_global, ids, generator, problems,
                                 probes=4, eps=1e-3):
    """DistGATConv's summed gradients against central differences of the global loss (slope
    1.0, smooth: see `smooth_layers`)."""
    n, features = x_global.shape
    torch.manual_seed(9)  # the same weights on every rank
    layer = DistGATConv(features, 3, heads=2, negative_slope=1.0)
    with torch.no_grad():
        layer.bias.uniform_(-1, 1)
    g_global = torch.randn((n, 6), generator=generator) / n
    x = x_global[ids].clone().requires_grad_()
    local = lambda: (torch.tanh(layer(x, op)) * g_global[ids]).sum()  # noqa: E731

    loss = local()
    loss.backward()
    sync_gradients(layer, comm)
    # The input's gradient as a global table: each rank contributes its rows.
    x_grad = torch.zeros((n, features), dtype=torch.float64)
    x_grad[ids] = x.grad.double()
    comm.allreduce_sum(x_grad.numpy())
    owner = torch.full((n,), -1, dtype=torch.int64)
    owner[ids] = torch.arange(len(ids))
    targets = [(key, p) for key, p in layer.named_parameters()] + [("x", None)]
    # One scale for all: att_dst's gradient is 0 at slope 1.0 (a softmax ignores a row's shift).
    scale = max(float((x_grad if p is None else p.grad).abs().max()) for _, p in targets)
    worst = 0.0
    with torch.no_grad():
        for key, p in targets:
            grad = x_grad if p is None else p.grad.double()
            picks = torch.randperm(grad.numel(), generator=generator)[:probes].tolist()
            for flat in picks:
                coord = np.unravel_index(flat, tuple(grad.shape))
                if p is None:
                    row = int(owner[coord[0]])
                    target, where = (x, (row, coord[1])) if row >= 0 else (None, None)
                else:
                    target, where = p, coord
                values = []
                for step in (eps, -eps):
                    if target is not None:
                        original = float(target[where])
                        target[where] = original + step
                    values.append(global_sum(comm, local())[0])
                    if target is not None:
                        target[where] = original
                fd = (values[0] - values[1]) / (2 * eps)
                err = abs(fd - float(grad[coord])) / scale
                worst = max(worst, err)
                if not err <= GRADIENT_TOLERANCE:
                    problems.append(f"GAT {key}{tuple(int(c) for c in coord)}: autograd "
                                    f"{float(grad[coord]):.6e}, finite differences {fd:.6e}")
    return f"GAT gradient vs central differences err={worst:.0e}"


def expect_error(problems, what, kind, call):
    try:
        call()
    except kind:
        return
    except Exception as e:  # noqa: BLE001 - any other failure is the problem reported
        problems.append(f"{what}: {type(e).__name__} instead of {kind.__name__}: {e}")
        return
    problems.append(f"{what}: no {kind.__name__}")


def check_errors(comm, op, chunk, problems):
    n, e = chunk.num_local_nodes, op.edge_count
    x = torch.zeros((n, 4))
    # A wrong per-edge count on rank 0 only: refused there, PEER_FAILED on the others (the
    # library agrees before communicating), nobody left waiting.
    try:
        op.forward_values(np.zeros(e + (comm.rank == 0), np.float32), x.numpy())
        problems.append("a wrong per-edge count was accepted")
    except DistSpmmError as err:
        want = "INVALID_ARGUMENT" if comm.rank == 0 else "PEER_FAILED"
        if err.status != want:
            problems.append(f"a wrong per-edge count on rank 0: {err.status}, not {want}")
    expect_error(problems, "edge_weights kind", ValueError, lambda: edge_weights(op, "max"))
    expect_error(problems, "float64 per-edge values", TypeError,
                 lambda: DistSpmmValues(op, torch.zeros((1, e), dtype=torch.float64), x))
    expect_error(problems, "not an operator", TypeError,
                 lambda: EdgeSoftmax(object(), torch.zeros((1, e))))
    expect_error(problems, "wrong rows", ValueError,
                 lambda: DistGATConv(4, 2)(torch.zeros((n + 1, 4)), op))
    return "errors ok"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", required=True)
    parser.add_argument("--graph", required=True, help="the .npz the directory was made from")
    parser.add_argument("--lib", help="path to libdistspmm.so")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    load(args.lib)
    torch.set_num_threads(1)
    comm = communicator()
    chunk = Chunk(comm, args.chunks)
    problems, lines = [], []
    try:
        npz = np.load(args.graph)
        if "edge_weight" in npz:
            raise ValueError(f"{args.graph} is weighted: PyG's layers would ignore the weights")
        edge_index = torch.from_numpy(npz["edge_index"].astype(np.int64))
        x_global = torch.from_numpy(npz["x"].astype(np.float32))
        ids = torch.from_numpy(chunk.original_ids.astype(np.int64))
        generator = torch.Generator().manual_seed(args.seed)  # the same draws on every rank
        op = Spmm(comm, chunk, "halo")
        lines.append(check_edges(comm, chunk, op, edge_index, ids, problems))
        lines += check_layers(comm, chunk, op, (x_global, edge_index), ids, generator, problems)
        lines.append(check_gradcheck(comm, chunk, op, x_global, ids, generator, problems))
        lines.append(
            check_gat_finite_differences(comm, chunk, op, x_global, ids, generator, problems)
        )
        lines.append(check_errors(comm, op, chunk, problems))
        op.close()
    except Exception as e:  # noqa: BLE001 - reported, and the other ranks told
        problems.append(f"{type(e).__name__}: {e}")
    report_and_exit(comm, chunk, lines, problems)


if __name__ == "__main__":
    main()
