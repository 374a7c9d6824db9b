"""distspmm.torch checked against PyTorch and PyG themselves, on every rank.

    mpirun -n 2 python python/tests/check_torch.py ops   --chunks DIR --graph GRAPH.npz
    mpirun -n 2 python python/tests/check_torch.py train --chunks DIR --graph cora.npz
    mpirun -n 2 python python/tests/check_torch.py precision --chunks DIR --graph GRAPH.npz

DIR is `distspmm partition --input GRAPH.npz --parts P --out DIR` (GCN normalisation); both also
run without mpirun for P = 1. The references are built from the .npz by PyG and PyTorch alone:
Ahat by PyG's `gcn_norm` (self loops, symmetric normalisation) as a `torch.sparse` matrix.

`ops`: the chunk as a PyG Data (values against the .npz, the mapped tensors sharing the chunk's
memory); `DistSpmm` and its transpose, forward and autograd backward, against `torch.sparse.mm`
in float64 for both schedules, on contiguous and row-strided inputs; `gradcheck` and `gradgradcheck`
of a nonlinear composition (central differences at float32) at P = 1; at every P, the gradient of a two-layer
DistGCNConv model's global mean loss, summed by `sync_gradients`, against central differences of
that loss; `DistGCNConv` against PyG's `GCNConv` with the same state_dict (outputs and gradients,
both directions of load_state_dict); the errors for bad inputs; the device operator's refusal
in a library built without CUDA (and, where CUDA works, CUDA tensors against the host operator).

`train`: a two-layer GCN (hidden 16, ReLU, no dropout, Adam lr 0.01, weight decay 5e-4 on the
first layer) trained `--epochs` epochs with DistGCNConv over the chunks and, in the same process,
with PyG's GCNConv on the whole graph from the same weights: the global mean loss of every epoch
must agree within 1e-4 relative.

`precision`: `Spmm(..., comm_precision="bf16")` and `"f16"` through `DistSpmm`, both schedules and
directions, forward and autograd backward, against the f32 operator: every entry within
`u (|M| |X|)` of f32's (u = 2^-8 for bf16, 2^-11 for f16; M = Ahat or its transpose, from PyG),
different from it somewhere at P > 1, and each call moving exactly half of f32's bytes; the
operator reports its precision; an unknown name is a ValueError, and a library without the
option refuses a reduced precision with UNSUPPORTED.

Prints one `rank R: ... ok` line per rank; exits non-zero on every rank if any rank fails.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from check_spmm import check_device_refused, report_and_exit  # noqa: E402 - shared endings
from distspmm import Chunk, DistSpmmError, Spmm, SpmmDevice, load  # noqa: E402
from distspmm.torch import (  # noqa: E402
    DistGCNConv,
    DistSpmm,
    chunk_data,
    communicator,
    global_sum,
    sync_gradients,
)

PRODUCT_TOLERANCE = 1e-5  # relative, float32 products against float64 torch.sparse
PYG_TOLERANCE = 1e-5  # DistGCNConv against GCNConv, both float32
GRADIENT_TOLERANCE = 2e-3  # relative to the largest gradient entry, central differences in f32
LOSS_TOLERANCE = 1e-4  # relative, per epoch
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "f16": 2.0**-11}  # of one conversion to the message format


def relative_error(got, want):
    got, want = got.detach().double(), want.detach().double()
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1e-30)
    return float((got - want).abs().max()) / scale if want.numel() else 0.0


class Graph:
    """The .npz as PyG sees it, and Ahat built from it by PyG's gcn_norm."""

    def __init__(self, path, num_nodes):
        npz = np.load(path)
        self.npz = npz
        self.num_nodes = num_nodes
        self.edge_index = torch.from_numpy(npz["edge_index"].astype(np.int64))
        self.edge_weight = (
            torch.from_numpy(npz["edge_weight"].astype(np.float32))
            if "edge_weight" in npz
            else None
        )
        self.x = torch.from_numpy(npz["x"].astype(np.float32)) if "x" in npz else None
        index, weight = gcn_norm(
            self.edge_index,
            None if self.edge_weight is None else self.edge_weight.double(),
            num_nodes,
            add_self_loops=True,
            dtype=torch.float64,
        )
        # Message u -> v (index[0] = u, index[1] = v) is Ahat[v, u].
        self.a_hat = torch.sparse_coo_tensor(
            torch.stack([index[1], index[0]]), weight, (num_nodes, num_nodes), check_invariants=True
        ).coalesce()
        self.a_hat_t = self.a_hat.t().coalesce()


def check_data(chunk, graph, ids, problems):
    data = chunk_data(chunk)
    npz = graph.npz
    if data.num_nodes != chunk.num_local_nodes:
        problems.append(f"Data has {data.num_nodes} nodes, the chunk {chunk.num_local_nodes}")
    if not torch.equal(data.n_id, ids):
        problems.append("n_id differs from the chunk's original ids")
    if data.n_id.data_ptr() != chunk.original_ids.ctypes.data:
        problems.append("n_id is a copy, not the mapped ids")
    if "x" in npz:
        if not torch.equal(data.x, torch.from_numpy(npz["x"][ids.numpy()].astype(np.float32))):
            problems.append("x differs from the .npz rows")
        if data.x.data_ptr() != chunk.features.ctypes.data:
            problems.append("x is a copy, not the mapped features")
    if "y" in npz:
        want = torch.from_numpy(npz["y"][ids.numpy()].astype(np.int64))
        if data.y.dtype != torch.int64 or not torch.equal(data.y, want):
            problems.append("y differs from the .npz labels (or is not int64)")
    for name in ("train", "val", "test"):
        key = f"{name}_mask"
        if key in npz:
            want = torch.from_numpy(npz[key][ids.numpy()].astype(bool))
            if data[key].dtype != torch.bool or not torch.equal(data[key], want):
                problems.append(f"{key} differs from the .npz")
    copied = chunk_data(chunk, copy=True)
    if "x" in npz:
        if copied.x.data_ptr() == data.x.data_ptr() or not torch.equal(copied.x, data.x):
            problems.append("chunk_data(copy=True) must copy x")
        copied.x.mul_(2.0)  # writable: a copy may be changed in place
    return f"Data: x{tuple(data.x.shape) if 'x' in data else '-'} mapped"


def check_products(comm, chunk, graph, ids, cols, generator, problems):
    n = graph.num_nodes
    x_global = torch.randn((n, cols), generator=generator)
    g_global = torch.randn((n, cols), generator=generator)
    lines = []
    for schedule in ("halo", "broadcast"):
        op = Spmm(comm, chunk, schedule)
        calls = spy_on(op)
        for transpose in (False, True):
            m = graph.a_hat_t if transpose else graph.a_hat
            reference = x_global.double().requires_grad_()
            (torch.sparse.mm(m, reference) * g_global.double()).sum().backward()
            y_ref = torch.sparse.mm(m, x_global.double())[ids]
            dx_ref = reference.grad[ids]
            for layout in ("contiguous", "strided"):
                if layout == "contiguous":
                    x = x_global[ids].clone().requires_grad_()
                    x_in = x
                else:  # a column slice: rows contiguous, row stride cols + 3
                    wide = torch.zeros((len(ids), cols + 3))
                    wide[:, 2 : 2 + cols] = x_global[ids]
                    wide.requires_grad_()
                    x = wide
                    x_in = wide[:, 2 : 2 + cols]
                y = DistSpmm(op, x_in, transpose)
                if calls[-1] != (x_in.data_ptr(), y.data_ptr()):
                    problems.append(f"{schedule} {layout}: the library got copies, not the tensors")
                (y * g_global[ids]).sum().backward()
                dx = x.grad if layout == "contiguous" else x.grad[:, 2 : 2 + cols]
                forward = relative_error(y, y_ref)
                backward = relative_error(dx, dx_ref)
                name = f"{schedule}{' transpose' if transpose else ''} {layout}"
                for what, err in (("forward", forward), ("backward", backward)):
                    if not err <= PRODUCT_TOLERANCE:
                        problems.append(f"{name} {what} error {err:.2e} > {PRODUCT_TOLERANCE}")
                if layout == "contiguous":
                    lines.append(f"{schedule}{'^T' if transpose else ''} err={forward:.0e}/{backward:.0e}")
        op.close()
    return lines


def spy_on(op):
    """Records the addresses of the arrays `op.forward`/`op.backward` receive (input, output)."""
    calls = []

    def spy(method):
        def call(x, out=None):
            calls.append((x.ctypes.data, out.ctypes.data))
            return method(x, out=out)

        return call

    op.forward, op.backward = spy(op.forward), spy(op.backward)
    return calls


def check_gradcheck(comm, chunk, generator, problems):
    """torch.autograd.gradcheck and gradgradcheck in float32 (the library's precision) with a
    step suited to it, at P = 1: per rank, they would differentiate only the rank's own rows (and
    loop over different numbers of them, breaking the collective order)."""
    if comm.size != 1:
        return "gradcheck: P=1 only"
    op = Spmm(comm, chunk, "halo")
    x = torch.randn((chunk.num_local_nodes, 2), generator=generator).requires_grad_()

    def composed(x):
        return DistSpmm(op, torch.tanh(DistSpmm(op, x, transpose=True)))

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not a double precision" input: on purpose
        results = []
        for name, check in (
            ("gradcheck", torch.autograd.gradcheck),
            ("gradgradcheck", torch.autograd.gradgradcheck),  # backward is a DistSpmm too
        ):
            try:
                check(composed, (x,), eps=1e-2, atol=1e-3, rtol=1e-2, raise_exception=True)
                results.append(f"{name} passed")
            except RuntimeError as e:
                results.append(f"{name} FAILED")
                problems.append(f"{name}: {str(e).splitlines()[0]}")
    op.close()
    return "f32 " + ", ".join(results)


def check_model_gradient(comm, chunk, generator, problems, hidden=5, probes=6, eps=1e-2):
    """The summed per-rank gradient of a two-layer DistGCNConv model against central
    differences of the global mean loss."""
    data = chunk_data(chunk)
    op = Spmm(comm, chunk, "halo")
    train = data.train_mask & (data.y >= 0)
    (n_train,) = global_sum(comm, train.sum())
    torch.manual_seed(11)  # the same weights on every rank
    conv1 = DistGCNConv(chunk.num_features, hidden)
    conv2 = DistGCNConv(hidden, chunk.num_classes)
    with torch.no_grad():
        for p in (conv1.bias, conv2.bias):
            p.uniform_(-0.5, 0.5)
    params = list(conv1.parameters()) + list(conv2.parameters())

    def global_loss(backward):
        out = conv2(torch.tanh(conv1(data.x, op)), op)
        local = F.cross_entropy(out[train], data.y[train], reduction="sum") / n_train
        if backward:
            local.backward()
        return global_sum(comm, local.detach())[0]

    global_loss(backward=True)
    sync_gradients(params, comm)
    grads = [p.grad.clone() for p in params]
    worst = 0.0
    for which, (param, grad) in enumerate(zip(params, grads)):
        scale = max(float(grad.abs().max()), 1e-12)
        flat_count = param.numel()
        for flat in generator_choice(generator, flat_count, min(probes, flat_count)):
            coord = np.unravel_index(flat, tuple(param.shape))
            with torch.no_grad():
                original = float(param[coord])
                param[coord] = original + eps
                plus = global_loss(backward=False)
                param[coord] = original - eps
                minus = global_loss(backward=False)
                param[coord] = original
            fd = (plus - minus) / (2 * eps)
            err = abs(fd - float(grad[coord])) / scale
            worst = max(worst, err)
            if not err <= GRADIENT_TOLERANCE:
                problems.append(
                    f"parameter {which}{tuple(int(c) for c in coord)}: autograd "
                    f"{float(grad[coord]):.6e}, finite differences {fd:.6e}"
                )
    op.close()
    return f"model gradient vs finite differences err={worst:.0e}"


def generator_choice(generator, n, k):
    return torch.randperm(n, generator=generator)[:k].tolist()


def check_against_pyg(comm, chunk, graph, ids, generator, problems):
    """DistGCNConv against PyG's GCNConv with the same state_dict: outputs and gradients."""
    op = Spmm(comm, chunk, "halo")
    data = chunk_data(chunk)
    features = chunk.num_features
    lines = []
    for bias in (True, False):
        torch.manual_seed(5)
        reference = GCNConv(features, 6, bias=bias)
        if bias:
            with torch.no_grad():
                reference.bias.uniform_(-1, 1)  # zero at init: make it count
        ours = DistGCNConv(features, 6, bias=bias)
        ref_state = reference.state_dict()
        our_state = ours.state_dict()
        if {k: tuple(v.shape) for k, v in ref_state.items()} != {
            k: tuple(v.shape) for k, v in our_state.items()
        }:
            problems.append(f"state_dict layouts differ: {list(ref_state)} vs {list(our_state)}")
            continue
        ours.load_state_dict(ref_state)
        GCNConv(features, 6, bias=bias).load_state_dict(ours.state_dict())  # the other way
        g_global = torch.randn((graph.num_nodes, 6), generator=generator)
        out_ref = reference(graph.x, graph.edge_index, graph.edge_weight)
        (out_ref * g_global).sum().backward()
        out = ours(data.x, op)
        (out * g_global[ids]).sum().backward()
        sync_gradients(ours, comm)
        err = relative_error(out, out_ref[ids])
        grad_errs = [
            relative_error(ours.get_parameter(k).grad, reference.get_parameter(k).grad)
            for k in ref_state
        ]
        worst = max([err] + grad_errs)
        if not worst <= PYG_TOLERANCE:
            problems.append(
                f"DistGCNConv(bias={bias}) vs GCNConv: output err {err:.2e}, gradient errs "
                f"{', '.join(f'{e:.2e}' for e in grad_errs)} > {PYG_TOLERANCE}"
            )
        lines.append(f"GCNConv(bias={bias}) err={worst:.0e}")
    op.close()
    return " ".join(lines)


def expect_error(problems, what, kind, call):
    try:
        call()
    except kind:
        return
    except Exception as e:  # noqa: BLE001 - any other failure is the problem reported
        problems.append(f"{what}: {type(e).__name__} instead of {kind.__name__}: {e}")
        return
    problems.append(f"{what}: no {kind.__name__}")


def check_errors(comm, chunk, problems):
    op = Spmm(comm, chunk, "halo")
    n = chunk.num_local_nodes
    expect_error(problems, "float64 input", TypeError, lambda: DistSpmm(op, torch.zeros((n, 2), dtype=torch.float64)))
    expect_error(problems, "wrong row count", ValueError, lambda: DistSpmm(op, torch.zeros((n + 1, 2))))
    expect_error(problems, "1-D input", ValueError, lambda: DistSpmm(op, torch.zeros(n)))
    expect_error(problems, "not an operator", TypeError, lambda: DistSpmm(object(), torch.zeros((n, 2))))
    expect_error(problems, "not a tensor", TypeError, lambda: DistSpmm(op, np.zeros((n, 2), np.float32)))
    line = "errors ok"
    if check_device_refused(comm, chunk, problems):
        line += ", device operator refused (UNSUPPORTED) without CUDA"
    elif global_sum(comm, torch.cuda.is_available())[0] == comm.size:  # on every rank
        line += ", " + check_cuda(comm, chunk, op, problems)
    else:
        line += ", CUDA build but torch sees no GPU on some rank"
    op.close()
    return line


def check_cuda(comm, chunk, host_op, problems):
    """CUDA tensors through a SpmmDevice against the host operator (forward and backward)."""
    device_op = SpmmDevice(comm, chunk, "halo")
    generator = torch.Generator().manual_seed(3)
    x = torch.randn((chunk.num_local_nodes, 4), generator=generator)
    g = torch.randn((chunk.num_local_nodes, 4), generator=generator)
    x_host = x.clone().requires_grad_()
    (DistSpmm(host_op, x_host) * g).sum().backward()
    x_dev = x.cuda().requires_grad_()
    y_dev = DistSpmm(device_op, x_dev)
    (y_dev * g.cuda()).sum().backward()
    torch.cuda.synchronize()
    forward = relative_error(y_dev.cpu(), DistSpmm(host_op, x))
    backward = relative_error(x_dev.grad.cpu(), x_host.grad)
    for what, err in (("forward", forward), ("backward", backward)):
        if not err <= PRODUCT_TOLERANCE:
            problems.append(f"CUDA {what} error {err:.2e} against the host operator")
    device_op.close()
    return f"CUDA tensors err={forward:.0e}/{backward:.0e}"


def run_ops(comm, chunk, graph, ids, args, problems):
    generator = torch.Generator().manual_seed(args.seed)  # the same draws on every rank
    lines = [check_data(chunk, graph, ids, problems)]
    lines += check_products(comm, chunk, graph, ids, args.cols, generator, problems)
    lines.append(check_gradcheck(comm, chunk, generator, problems))
    lines.append(check_model_gradient(comm, chunk, generator, problems))
    lines.append(check_against_pyg(comm, chunk, graph, ids, generator, problems))
    lines.append(check_errors(comm, chunk, problems))
    return lines


def within_bound(got, want, bound, u):
    """The largest |got - want| and whether every entry is within u * bound plus the two
    results' own float32 rounding of their sums (and f16's absolute error below its normals)."""
    diff = (got.detach().double() - want.detach().double()).abs()
    allowed = (u + 1e-5) * bound + 1e-7
    return float(diff.max()) if diff.numel() else 0.0, bool((diff <= allowed).all())


class OldLibrary:
    """A library as one built before the message precision: without its two calls."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        if name in ("dsp_spmm_create_with_precision", "dsp_spmm_comm_precision"):
            raise AttributeError(name)
        return getattr(self._lib, name)


def run_precision(comm, chunk, graph, ids, args, problems):
    generator = torch.Generator().manual_seed(args.seed)  # the same draws on every rank
    n = graph.num_nodes
    x_global = torch.randn((n, args.cols), generator=generator)
    g_global = torch.randn((n, args.cols), generator=generator)
    lines = []
    for schedule in ("halo", "broadcast"):
        f32 = Spmm(comm, chunk, schedule)
        if f32.comm_precision != "f32":
            problems.append(f"Spmm() reports {f32.comm_precision!r}, not 'f32'")
        for name, u in UNIT_ROUNDOFF.items():
            op = Spmm(comm, chunk, schedule, comm_precision=name)
            if op.comm_precision != name:
                problems.append(f"comm_precision={name!r} reports {op.comm_precision!r}")
            for transpose in (False, True):
                m = graph.a_hat_t if transpose else graph.a_hat
                m_abs = torch.sparse_coo_tensor(m.indices(), m.values().abs(), m.shape)
                bound_y = torch.sparse.mm(m_abs, x_global.double().abs())[ids]
                bound_dx = torch.sparse.mm(m_abs.t(), g_global.double().abs())[ids]
                results, moved = [], []
                for operator in (f32, op):
                    x = x_global[ids].clone().requires_grad_()
                    y = DistSpmm(operator, x, transpose)
                    forward_bytes = operator.bytes_last_call
                    (y * g_global[ids]).sum().backward()
                    results.append((y, x.grad))
                    moved.append((forward_bytes, operator.bytes_last_call))
                call = f"{schedule}{' transpose' if transpose else ''} {name}"
                worst = []
                for what, got, want, bound in (
                    ("forward", results[1][0], results[0][0], bound_y),
                    ("backward", results[1][1], results[0][1], bound_dx),
                ):
                    diff, ok = within_bound(got, want, bound, u)
                    worst.append(diff)
                    if not ok:
                        problems.append(f"{call} {what}: difference {diff:.2e} beyond u |M| |X|")
                if comm.size > 1:
                    if global_sum(comm, max(worst))[0] == 0.0:
                        problems.append(f"{call}: the same bits as f32 (nothing was converted)")
                    for (sent32, received32), (sent16, received16) in zip(*moved):
                        half = 2 * sent16 == sent32 and 2 * received16 == received32
                        if not (sent32 > 0 and half):
                            problems.append(
                                f"{call}: bytes {sent16}/{received16}, f32 {sent32}/{received32}: "
                                "not half"
                            )
                if not transpose:
                    lines.append(f"{schedule} {name} err={worst[0]:.0e}/{worst[1]:.0e}")
            op.close()
        f32.close()
    expect_error(problems, "an unknown precision", ValueError,
                 lambda: Spmm(comm, chunk, "halo", comm_precision="int8"))

    class OldComm:  # the communicator as seen through a library without the option
        _lib = OldLibrary(comm._lib)
        handle = comm.handle

    try:
        Spmm(OldComm(), chunk, "halo", comm_precision="bf16")
        problems.append("a library without the option accepted bf16")
    except DistSpmmError as e:
        if e.status != "UNSUPPORTED":
            problems.append(f"a library without the option: {e.status} instead of UNSUPPORTED")
    lines.append("bytes halved, old library refuses")
    return lines


class ReferenceGCN(torch.nn.Module):
    def __init__(self, conv, features, hidden, classes):
        super().__init__()
        self.conv1 = conv(features, hidden)
        self.conv2 = conv(hidden, classes)

    def forward(self, x, *graph):
        return self.conv2(self.conv1(x, *graph).relu(), *graph)


def adam(model, lr=0.01):
    return torch.optim.Adam(
        [
            dict(params=model.conv1.parameters(), weight_decay=5e-4),
            dict(params=model.conv2.parameters(), weight_decay=0),
        ],
        lr=lr,
    )


def run_train(comm, chunk, graph, ids, args, problems):
    npz = graph.npz
    torch.manual_seed(args.seed)
    pyg = ReferenceGCN(GCNConv, chunk.num_features, 16, chunk.num_classes)
    ours = ReferenceGCN(DistGCNConv, chunk.num_features, 16, chunk.num_classes)
    ours.load_state_dict(pyg.state_dict())
    full = T.NormalizeFeatures()(
        Data(
            x=graph.x,
            edge_index=graph.edge_index,
            y=torch.from_numpy(npz["y"].astype(np.int64)),
            train_mask=torch.from_numpy(npz["train_mask"].astype(bool)),
        )
    )
    data = T.NormalizeFeatures()(chunk_data(chunk))
    op = Spmm(comm, chunk, "halo")
    (n_train,) = global_sum(comm, data.train_mask.sum())
    opt_pyg, opt_ours = adam(pyg), adam(ours)
    worst, losses = 0.0, []
    for epoch in range(1, args.epochs + 1):
        opt_pyg.zero_grad()
        out = pyg(full.x, full.edge_index)
        loss_pyg = F.cross_entropy(out[full.train_mask], full.y[full.train_mask])
        loss_pyg.backward()
        opt_pyg.step()

        opt_ours.zero_grad()
        out = ours(data.x, op)
        local = F.cross_entropy(
            out[data.train_mask], data.y[data.train_mask], reduction="sum"
        ) / n_train
        local.backward()
        sync_gradients(ours, comm)
        opt_ours.step()
        (loss,) = global_sum(comm, local.detach())

        want = loss_pyg.item()
        err = abs(loss - want) / abs(want)
        worst = max(worst, err)
        losses.append(loss)
        if not err <= LOSS_TOLERANCE:
            problems.append(f"epoch {epoch}: loss {loss:.7f}, PyG {want:.7f} (rel {err:.1e})")
    if not losses[-1] < losses[0]:
        problems.append(f"the loss did not fall: {losses[0]:.6f} -> {losses[-1]:.6f}")
    op.close()
    return [f"train {args.epochs} epochs: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
            f"max rel diff to PyG {worst:.1e}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["ops", "train", "precision"])
    parser.add_argument("--chunks", required=True)
    parser.add_argument("--graph", required=True, help="the .npz the directory was made from")
    parser.add_argument("--lib", help="path to libdistspmm.so")
    parser.add_argument("--cols", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    load(args.lib)
    torch.set_num_threads(1)
    comm = communicator()
    chunk = Chunk(comm, args.chunks)
    with open(os.path.join(args.chunks, "manifest.json")) as f:
        normalization = json.load(f)["normalization"]
    problems = []
    if normalization != "gcn":
        problems.append(f"{args.chunks} is normalised {normalization!r}, GCNConv needs 'gcn'")
    graph = Graph(args.graph, chunk.num_global_nodes)
    ids = torch.from_numpy(chunk.original_ids.astype(np.int64))
    run = {"ops": run_ops, "train": run_train, "precision": run_precision}[args.mode]
    try:
        lines = run(comm, chunk, graph, ids, args, problems)
    except Exception as e:  # noqa: BLE001 - reported, and the other ranks told
        lines = []
        problems.append(f"{type(e).__name__}: {e}")
    report_and_exit(comm, chunk, lines, problems)


if __name__ == "__main__":
    main()
