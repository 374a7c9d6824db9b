"""The distributed aggregation for PyTorch and PyTorch Geometric (PyG).

    from distspmm import Chunk, Spmm
    from distspmm.torch import DistGCNConv, DistSpmm, chunk_data, communicator, sync_gradients

    comm = communicator()                  # the MPI world (mpi4py's when installed)
    chunk = Chunk(comm, "cora-2")          # this rank's part of `distspmm partition --parts 2`
    data = chunk_data(chunk)               # a PyG Data: x, y, train/val/test_mask, n_id
    op = Spmm(comm, chunk, "halo")         # or "broadcast"; comm_precision="bf16": half the bytes
    h = DistSpmm(op, data.x @ w)           # this rank's rows of Ahat (X W), differentiable
    conv = DistGCNConv(16, 7)              # PyG GCNConv's parameters: lin.weight, bias
    out = conv(h, op)                      # Ahat (H W^T) + b; `op` takes edge_index's place
    ...; loss.backward(); sync_gradients(model, comm); optimizer.step()

`DistSpmmFunction` is a `torch.autograd.Function`: forward `Y_p = (Ahat X)_p` from the rank's
rows `X_p`, backward `dX_p = (Ahat^T dY)_p` (the transposed pair with `transpose=True`), both
collective over the operator's ranks. Its backward is itself a `DistSpmm`, so higher-order
gradients work. With a host operator (`Spmm`) it takes float32 CPU tensors and hands their memory
to the library without a copy when their rows are contiguous (any row stride); with a device
operator (`SpmmDevice`, a CUDA build of the library) it takes CUDA tensors and passes their device
pointers with the current CUDA stream.

`DistSAGEConv`, `DistGINConv` and `DistGATConv` are PyG's `SAGEConv`, `GINConv` and `GATConv`
with their parameters, built from the per-edge operators (host operator only): `DistSpmmValues`
(aggregation with caller-given per-edge values, several groups of columns at once: the heads),
`DistSddmm` (per-edge dot products of two rows), `EdgeSoftmax` (attention coefficients) and
`edge_weights` (the graph's own weights, summed or averaged). Their forward and backward calls
are collective in the order autograd runs them, the same on every rank for the same model
(docs/pytorch.md, "SAGE, GIN and GAT"). Their backward is once differentiable.

    conv = DistGATConv(1433, 8, heads=8, dropout=0.6)   # lin.weight, att_src, att_dst, bias
    out = conv(data.x, op)                               # (n_p, 64)

Gradients are summed over the ranks through MPI, on the library's own communicator
(`Comm.allreduce_sum`, a duplicate of the world): `sync_gradients`. See docs/pytorch.md for why
not torch.distributed, the loss scaling that makes the sum the gradient of the global mean loss,
and how to write another layer over `DistSpmm`.
"""

import math
import warnings
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._capi import MASK_TEST, MASK_TRAIN, MASK_VAL, Comm, DistSpmmError, Spmm, SpmmDevice

__all__ = [
    "DistGATConv",
    "DistGCNConv",
    "DistGINConv",
    "DistSAGEConv",
    "DistSddmm",
    "DistSddmmFunction",
    "DistSpmm",
    "DistSpmmFunction",
    "DistSpmmValues",
    "DistSpmmValuesFunction",
    "EdgeSoftmax",
    "EdgeSoftmaxFunction",
    "edge_weights",
    "broadcast_parameters",
    "chunk_data",
    "communicator",
    "global_sum",
    "sync_gradients",
]


def communicator(lib=None):
    """This process's `Comm`, created once and shared: it adopts mpi4py's `MPI.COMM_WORLD` when
    mpi4py is installed (so both see one MPI), else initialises MPI itself (`dsp_init`; under
    `mpirun` that is the job's world, without it a single rank)."""
    global _COMM
    if _COMM is None:
        try:
            from mpi4py import MPI
        except ImportError:
            _COMM = Comm(None, lib)
        else:
            _COMM = Comm(MPI.COMM_WORLD, lib)
    return _COMM


_COMM = None


def _check_input(op, x, what):
    if not isinstance(op, (Spmm, SpmmDevice)):
        raise TypeError(
            f"DistSpmm needs a distspmm.Spmm or SpmmDevice operator, not {type(op).__name__}"
        )
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(
            f"DistSpmm multiplies float32 tensors, not {x.dtype}: convert with {what}.float()"
        )
    if x.dim() != 2 or x.shape[0] != op.rows:
        raise ValueError(
            f"{what} must have shape ({op.rows}, cols) (this rank's rows), not {tuple(x.shape)}"
        )
    if isinstance(op, SpmmDevice):
        if x.device.type != "cuda":
            raise TypeError(
                f"a SpmmDevice operator multiplies CUDA tensors, {what} is on {x.device}: "
                "move it with .cuda() or use distspmm.Spmm for CPU tensors"
            )
    elif x.device.type != "cpu":
        raise TypeError(
            f"a Spmm operator multiplies CPU tensors, {what} is on {x.device}: use a "
            "distspmm.SpmmDevice (a CUDA build of the library) or move it with .cpu()"
        )


def _product(op, x, transpose, what="x"):
    """`op`'s forward (backward when `transpose`) on the (n_p, cols) float32 tensor `x`: a new
    (n_p, cols) tensor on x's device. No copy of `x` when its rows are contiguous."""
    _check_input(op, x, what)
    x = x.detach()
    rows, cols = x.shape
    if x.stride(1) != 1 and cols > 1:
        x = x.contiguous()
    out = torch.empty((rows, cols), dtype=torch.float32, device=x.device)
    if isinstance(op, SpmmDevice):
        if x.stride(0) < cols:  # rows <= 1 may report any row stride
            x = x.contiguous()
        ldx = max(x.stride(0), cols)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        product = op.backward_ptr if transpose else op.forward_ptr
        product(cols, x.data_ptr(), ldx, out.data_ptr(), cols, stream)
    else:
        # numpy views of the tensors' memory: the library reads x and writes out in place.
        product = op.backward if transpose else op.forward
        product(x.numpy(), out=out.numpy())
    return out


class DistSpmmFunction(torch.autograd.Function):
    """`Y_p = (Ahat X)_p` with gradient `dX_p = (Ahat^T dY)_p`, or the transposed pair.

    `apply(op, x, transpose)`: the `Spmm` (or `SpmmDevice`) of this rank, its local rows `x`
    and whether to multiply by `Ahat^T` instead. Use it through `DistSpmm`.
    """

    @staticmethod
    def forward(ctx, op, x, transpose):
        ctx.op = op
        ctx.transpose = bool(transpose)
        return _product(op, x, ctx.transpose)

    @staticmethod
    def backward(ctx, dy):
        # The other product of the same operator, through apply() so that it is differentiable
        # in turn (double backward); without create_graph it runs as a plain product.
        dx = DistSpmmFunction.apply(ctx.op, dy, not ctx.transpose)
        return None, dx, None


def DistSpmm(op, x, transpose=False):  # noqa: N802 - named like the Jittor operator
    """This rank's rows of `Ahat X` (or `Ahat^T X` with `transpose=True`) for the local rows `x`
    (an (n_p, cols) float32 tensor, n_p = `chunk.num_local_nodes`, cols equal on every rank),
    differentiable with respect to `x`. Collective over `op`'s communicator: every rank calls it,
    and its backward, in the same order."""
    if isinstance(x, torch.Tensor):  # fail before autograd wraps the error
        _check_input(op, x, "x")
    return DistSpmmFunction.apply(op, x, transpose)


class DistGCNConv(torch.nn.Module):
    """PyG's `GCNConv` over the rank's chunk: `Ahat (X W^T) + b`, Ahat the chunk directory's
    normalised adjacency (`distspmm partition`'s default `--normalization gcn` is GCNConv's
    `normalize=True, add_self_loops=True`: `D^-1/2 (A + I) D^-1/2`, existing self loops kept).

    Parameters as GCNConv's, so `state_dict`s interchange: `lin.weight` (out, in), Glorot
    uniform, and `bias` (out), zeros (absent with `bias=False`). `forward(x, op)` takes this
    rank's rows `x` (n_p, in) and the rank's operator where GCNConv takes `edge_index`; the
    dense product runs first, so the exchange carries `out_channels` columns.
    """

    def __init__(self, in_channels, out_channels, bias=True):
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(
                f"in_channels and out_channels must be positive, not {in_channels}, "
                f"{out_channels}"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin = torch.nn.Linear(in_channels, out_channels, bias=False)
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot uniform weight (PyG's `inits.glorot`), zero bias."""
        bound = math.sqrt(6.0 / (self.in_channels + self.out_channels))
        with torch.no_grad():
            self.lin.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, x, op):
        out = DistSpmm(op, self.lin(x))
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}"


# The per-edge calls (SAGE, GIN, GAT): on the host operator only.


def _check_host(op, x, what):
    if isinstance(op, SpmmDevice):
        raise TypeError(
            "the per-edge products (SAGE, GIN, GAT) run on the host operator only: use a "
            "distspmm.Spmm and CPU tensors"
        )
    _check_input(op, x, what)


def _check_edge_values(e, what):
    if not isinstance(e, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(e).__name__}")
    if e.dtype != torch.float32 or e.device.type != "cpu":
        raise TypeError(f"{what} must be a float32 CPU tensor, not {e.dtype} on {e.device}")


def _edge_array(e):
    """The per-edge values' memory as numpy (no copy when contiguous)."""
    return e.detach().contiguous().numpy()


def _row_array(x):
    """The rows' memory as numpy (no copy when rows are contiguous; `_rows` copies otherwise)."""
    x = x.detach()
    if x.stride(1) != 1 and x.shape[1] > 1:
        x = x.contiguous()
    return x.numpy()


class DistSpmmValuesFunction(torch.autograd.Function):
    """`Y_i[g] = sum_j e_g[ij] X_j[g]` (`Spmm.forward_values`) with gradients
    `dX_j[g] = sum_i e_g[ij] dY_i[g]` (`backward_values`) and `de_g[ij] = <dY_i[g], X_j[g]>`
    (`sddmm`), each computed only when needed. Use it through `DistSpmmValues`."""

    @staticmethod
    def forward(ctx, op, groups, e, x):
        ctx.op, ctx.groups = op, groups
        ctx.save_for_backward(e, x)
        out = torch.empty((op.rows, x.shape[1]), dtype=torch.float32)
        op.forward_values(_edge_array(e), _row_array(x), groups, out=out.numpy())
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        e, x = ctx.saved_tensors
        op, groups = ctx.op, ctx.groups
        de = dx = None
        dy = _row_array(dy)
        # The same collectives in the same order on every rank: which gradients are needed
        # depends only on the model, the same everywhere.
        if ctx.needs_input_grad[3]:
            dx = torch.empty_like(x, memory_format=torch.contiguous_format)
            op.backward_values(_edge_array(e), dy, groups, out=dx.numpy())
        if ctx.needs_input_grad[2]:
            de = torch.empty((groups, op.edge_count), dtype=torch.float32)
            op.sddmm(dy, _row_array(x), groups, out=de.numpy())
            de = de.view(e.shape)
        return None, None, de, dx


def DistSpmmValues(op, e, x, groups=1):  # noqa: N802 - named like DistSpmm
    """This rank's rows of `A_e X`: `Y_i[g] = sum_j e_g[ij] X_j[g]` over the stored entries
    of Ahat's rows (the per-edge values `e` in their place), `X_j[g]` the column block `g` of
    width `cols / groups`. `e` holds `groups * op.edge_count` float32 values, group `g` at
    `g * edge_count` (a contiguous `(groups, edge_count)` tensor); `x` is this rank's
    `(n_p, cols)` rows. Differentiable with respect to `e` and `x`; collective, as its
    backward."""
    _check_host(op, x, "x")
    _check_edge_values(e, "e")
    return DistSpmmValuesFunction.apply(op, int(groups), e, x)


class DistSddmmFunction(torch.autograd.Function):
    """`e_g[ij] = <U_i[g], V_j[g]>` (`Spmm.sddmm`) with gradients (`sddmm_backward`, one
    collective call for both). Use it through `DistSddmm`."""

    @staticmethod
    def forward(ctx, op, groups, u, v):
        ctx.op, ctx.groups = op, groups
        ctx.save_for_backward(u, v)
        e = torch.empty((groups, op.edge_count), dtype=torch.float32)
        op.sddmm(_row_array(u), _row_array(v), groups, out=e.numpy())
        return e

    @staticmethod
    @once_differentiable
    def backward(ctx, de):
        u, v = ctx.saved_tensors
        du = torch.empty(u.shape, dtype=torch.float32)
        dv = torch.empty(v.shape, dtype=torch.float32)
        ctx.op.sddmm_backward(
            _edge_array(de), _row_array(u), _row_array(v), ctx.groups,
            du=du.numpy(), dv=dv.numpy(),
        )
        return None, None, du, dv


def DistSddmm(op, u, v, groups=1):  # noqa: N802 - named like DistSpmm
    """Per-edge values `e_g[ij] = <U_i[g], V_j[g]>` over the stored entries `(i, j)` of this
    rank's rows: `u` and `v` are this rank's `(n_p, cols)` rows, the sources' rows of `v`
    arriving by the operator's exchange. Returns a `(groups, op.edge_count)` tensor,
    differentiable with respect to `u` and `v`; collective, as its backward."""
    _check_host(op, u, "u")
    _check_host(op, v, "v")
    return DistSddmmFunction.apply(op, int(groups), u, v)


class EdgeSoftmaxFunction(torch.autograd.Function):
    """`Spmm.edge_softmax` with its gradient (`edge_softmax_backward`). Local. Use it
    through `EdgeSoftmax`."""

    @staticmethod
    def forward(ctx, op, groups, negative_slope, logits):
        ctx.op, ctx.groups, ctx.slope = op, groups, negative_slope
        out = torch.empty(logits.shape, dtype=torch.float32)
        op.edge_softmax(_edge_array(logits), groups, negative_slope, out=out.numpy())
        ctx.save_for_backward(logits, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        logits, out = ctx.saved_tensors
        d_logits = torch.empty(logits.shape, dtype=torch.float32)
        ctx.op.edge_softmax_backward(
            _edge_array(logits), _edge_array(out), _edge_array(d_out), ctx.groups, ctx.slope,
            d_logits=d_logits.numpy(),
        )
        return None, None, None, d_logits


def EdgeSoftmax(op, logits, groups=1, negative_slope=1.0):  # noqa: N802
    """Per group, the softmax over each destination row's entries of `LeakyReLU(logits)`
    with `negative_slope` (1.0: the plain softmax; GAT uses 0.2): the attention coefficients
    of the edges into each of this rank's nodes. `logits` as `DistSpmmValues`'s `e`; the
    result has its shape. Differentiable; local (no communication)."""
    _check_edge_values(logits, "logits")
    if isinstance(op, SpmmDevice) or not isinstance(op, Spmm):
        raise TypeError(f"EdgeSoftmax needs a distspmm.Spmm operator, not {type(op).__name__}")
    return EdgeSoftmaxFunction.apply(op, int(groups), float(negative_slope), logits)


_EDGE_WEIGHTS = weakref.WeakKeyDictionary()


def edge_weights(op, kind="sum"):
    """The `(1, op.edge_count)` float32 per-edge weights of an aggregator over the graph's
    `A` (the input's edges, duplicates summed, no self loop added; the diagonal entries the
    GCN normalisation added weigh 0): `"sum"` the weights `w_ij` (GIN's sum), `"mean"`
    `w_ij / sum_j' w_ij'` (SAGE's mean over in-neighbours; a node without in-edges
    aggregates to 0). Computed once per operator and kept; local."""
    if kind not in ("sum", "mean"):
        raise ValueError(f"kind is 'sum' or 'mean', not {kind!r}")
    if isinstance(op, SpmmDevice) or not isinstance(op, Spmm):
        raise TypeError(f"edge_weights needs a distspmm.Spmm operator, not {type(op).__name__}")
    cached = _EDGE_WEIGHTS.setdefault(op, {})
    if kind not in cached:
        w = op.edge_weights()
        if kind == "mean":
            rows, _ = op.edges()
            # Row sums in float64, the mean rounded once to float32 (as the trainer does).
            sums = np.bincount(rows, weights=w.astype(np.float64), minlength=op.rows)[rows]
            w = np.divide(w, sums, out=np.zeros(len(w)), where=sums > 0).astype(np.float32)
        cached[kind] = torch.from_numpy(w).view(1, -1)
    return cached[kind]


def _glorot(t, fan_in, fan_out):
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        t.uniform_(-bound, bound)


class DistSAGEConv(torch.nn.Module):
    """PyG's `SAGEConv` over the rank's chunk: `lin_l(mean_j x_j) + lin_r(x_i)`, the mean over
    the in-neighbours `j` of each node in the input graph (`edge_weights(op, "mean")`: no self
    loop added, as SAGEConv; an input self loop counts as an in-edge, a node without in-edges
    aggregates to 0). Weighted input graphs are averaged with their weights (SAGEConv ignores
    them). `aggr="sum"` (or `"add"`) sums instead.

    Parameters as SAGEConv's, so `state_dict`s interchange: `lin_l.weight`, `lin_l.bias`
    (absent with `bias=False`), `lin_r.weight` (absent with `root_weight=False`), and
    `lin.weight`, `lin.bias` with `project=True`; `normalize=True` L2-normalises the output
    rows. `forward(x, op)` takes this rank's rows and operator; the aggregation moves
    `min(in, out)` columns (the linear map runs first when it narrows)."""

    def __init__(self, in_channels, out_channels, aggr="mean", normalize=False,
                 root_weight=True, project=False, bias=True):
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(
                f"in_channels and out_channels must be positive, not {in_channels}, "
                f"{out_channels}"
            )
        if aggr not in ("mean", "sum", "add"):
            raise ValueError(f"aggr is 'mean', 'sum' or 'add', not {aggr!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.aggr = "sum" if aggr == "add" else aggr
        self.normalize, self.root_weight, self.project = normalize, root_weight, project
        if project:
            self.lin = torch.nn.Linear(in_channels, in_channels, bias=True)
        self.lin_l = torch.nn.Linear(in_channels, out_channels, bias=bias)
        if root_weight:
            self.lin_r = torch.nn.Linear(in_channels, out_channels, bias=False)

    def reset_parameters(self):
        """PyG's `Linear` defaults (those of `torch.nn.Linear`)."""
        for lin in (getattr(self, "lin", None), self.lin_l, getattr(self, "lin_r", None)):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x, op):
        _check_host(op, x, "x")
        w = edge_weights(op, self.aggr)
        h = F.relu(self.lin(x)) if self.project else x
        if self.out_channels < self.in_channels:  # aggregate the narrower side
            out = DistSpmmValues(op, w, F.linear(h, self.lin_l.weight))
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(DistSpmmValues(op, w, h))
        if self.root_weight:
            out = out + self.lin_r(x)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr!r}"


class DistGINConv(torch.nn.Module):
    """PyG's `GINConv` over the rank's chunk: `nn((1 + eps) x_i + sum_j w_ij x_j)`, the sum over
    the in-neighbours `j` in the input graph (`edge_weights(op, "sum")`: weight 1 per unweighted
    edge, no self loop added; weighted graphs are summed with their weights, which GINConv
    ignores). `state_dict` as GINConv's: `eps` (a parameter with `train_eps=True`, else a
    buffer) and `nn.*`. A `BatchNorm` inside `nn` normalises with this rank's rows only."""

    def __init__(self, nn, eps=0.0, train_eps=False):
        super().__init__()
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self):
        """Resets `nn`'s modules (PyG's `reset`) and `eps` to its initial value."""
        for module in self.nn.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    def forward(self, x, op):
        _check_host(op, x, "x")
        out = DistSpmmValues(op, edge_weights(op, "sum"), x)
        return self.nn(out + (1 + self.eps) * x)

    def extra_repr(self):
        return f"nn={self.nn}"


class DistGATConv(torch.nn.Module):
    """PyG's `GATConv` (`add_self_loops=True`, no edge features) over the rank's chunk: per head
    `h`, `z = lin(x)`, `alpha_ij = softmax_i(LeakyReLU(<att_dst[h], z_i[h]> +
    <att_src[h], z_j[h]>))` over the stored entries of row `i` (the input's edges plus one
    self loop per node: GATConv's edge set after `remove_self_loops` + `add_self_loops` when
    the input has no duplicate edges), dropout on `alpha` while training,
    `out_i[h] = sum_j alpha_ij z_j[h]`; the heads concatenated (`concat=True`) or averaged,
    plus `res(x)` with `residual=True`, plus the bias.

    Parameters as GATConv's, so `state_dict`s interchange: `lin.weight` (heads * out, in),
    `att_src`, `att_dst` (1, heads, out), Glorot uniform, `bias` (zeros), `res.weight`.
    The logits come from one SDDMM (`u_i = [s_i, 1]`, `v_j = [1, t_j]` per head), the
    coefficients from the edge softmax, the output from one grouped SpMM over `z`."""

    def __init__(self, in_channels, out_channels, heads=1, concat=True, negative_slope=0.2,
                 dropout=0.0, bias=True, residual=False):
        super().__init__()
        if in_channels < 1 or out_channels < 1 or heads < 1:
            raise ValueError(
                f"in_channels, out_channels and heads must be positive, not {in_channels}, "
                f"{out_channels}, {heads}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), not {dropout}")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        total = heads * out_channels if concat else out_channels
        self.lin = torch.nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        if residual:
            self.res = torch.nn.Linear(in_channels, total, bias=False)
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(total))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot uniform weights and attention vectors (PyG's `glorot`), zero bias."""
        _glorot(self.lin.weight, self.in_channels, self.heads * self.out_channels)
        _glorot(self.att_src, self.heads, self.out_channels)
        _glorot(self.att_dst, self.heads, self.out_channels)
        if self.res is not None:
            _glorot(self.res.weight, self.res.in_features, self.res.out_features)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()

    def forward(self, x, op):
        _check_host(op, x, "x")
        n, heads, c = x.shape[0], self.heads, self.out_channels
        z = self.lin(x)
        zh = z.view(n, heads, c)
        s = (zh * self.att_dst).sum(-1)  # (n, heads): the destination's half of each logit
        t = (zh * self.att_src).sum(-1)  # the source's half
        ones = torch.ones_like(s)
        u = torch.stack([s, ones], dim=-1).reshape(n, 2 * heads)
        v = torch.stack([ones, t], dim=-1).reshape(n, 2 * heads)
        logits = DistSddmm(op, u, v, heads)  # (heads, edges): s_i + t_j
        alpha = EdgeSoftmax(op, logits, heads, self.negative_slope)
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        out = DistSpmmValues(op, alpha, z, heads)
        if not self.concat:
            out = out.view(n, heads, c).mean(dim=1)
        if self.res is not None:
            out = out + self.res(x)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"


def _zero_copy(array):
    """A tensor over a read-only numpy view of the chunk's mapping, without copying it. Torch has
    no read-only tensors and warns about that; the warning is replaced by the documented rule
    (chunk_data) that the mapped tensors must not be written."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        return torch.from_numpy(array)


def _present(read):
    try:
        return read()
    except DistSpmmError as e:
        if e.status == "NOT_PRESENT":
            return None
        raise


def chunk_data(chunk, copy=False):
    """This rank's chunk as a PyG `Data` (one node per local row, in the operator's order):

    - `x`: (n_p, F) float32 features, the mapped file itself (no copy);
    - `y`: (n_p,) int64 labels, -1 for unlabelled nodes (PyG's losses take int64: converted);
    - `train_mask`, `val_mask`, `test_mask`: (n_p,) bool, from the chunk's mask bits;
    - `n_id`: (n_p,) int64 ids of the nodes in the input graph (the mapped ids, reinterpreted,
      no copy);
    - `num_nodes` = n_p, and `part`, `num_parts`, `global_offset`, `num_global_nodes`.

    Attributes the chunk does not hold are absent. The mapped tensors (`x`, `n_id`) are
    read-only memory: an in-place write (`data.x.mul_(2)`, `data.x[0] = 1`) kills the process
    (SIGSEGV); out-of-place operations (`data.x / s`, PyG's `NormalizeFeatures`) are fine. With
    `copy=True` they are copied into ordinary writable tensors. The tensors keep the mapping
    alive until they are garbage, unless `chunk.close()` unmaps it earlier (then they must not
    be used)."""
    from torch_geometric.data import Data

    def mapped(array):
        return torch.from_numpy(array.copy()) if copy else _zero_copy(array)

    data = Data(num_nodes=chunk.num_local_nodes)
    if chunk.num_features > 0:
        features = _present(lambda: chunk.features)
        if features is not None:
            data.x = mapped(features)
    labels = _present(lambda: chunk.labels)
    if labels is not None:
        data.y = torch.from_numpy(labels.astype(np.int64))
    masks = _present(lambda: chunk.masks)
    if masks is not None:
        for name, bit in (("train", MASK_TRAIN), ("val", MASK_VAL), ("test", MASK_TEST)):
            data[f"{name}_mask"] = torch.from_numpy((masks & bit) != 0)
    # Original ids are below 2^63 (they index a graph), so the uint64 bits read as int64.
    data.n_id = mapped(chunk.original_ids.view(np.int64))
    data.part = chunk.part
    data.num_parts = chunk.num_parts
    data.global_offset = chunk.global_offset
    data.num_global_nodes = chunk.num_global_nodes
    return data


def _float_tensors(tensors):
    return [t for t in tensors if t.is_floating_point()]


def _allreduce_flat(comm, tensors):
    """Sums `tensors` over the ranks in place, in one collective: packed into one float64 host
    buffer (gradients and weights of a GCN are small next to the aggregation)."""
    if not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors])
    comm.allreduce_sum(flat.numpy())
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view(t.shape))
            offset += n


def sync_gradients(model, comm):
    """Sums the gradients of `model`'s parameters (a Module or an iterable of parameters) over
    the ranks, in place, so every rank steps with the same gradient. A parameter without a
    gradient on this rank contributes zeros (and gets the sum), so ranks whose losses miss a
    parameter stay in step. Collective: call it on every rank after `backward()`.

    With the loss of docs/pytorch.md (each rank's summed loss divided by the count over all
    ranks) the sum is the gradient of the global mean loss."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    _allreduce_flat(comm, _float_tensors([p.grad for p in params]))


def broadcast_parameters(model, comm, root=0):
    """Copies rank `root`'s floating-point parameters and buffers of `model` to every rank, so
    all ranks start from the same weights whatever their seeds. Collective."""
    tensors = _float_tensors(list(model.parameters()) + list(model.buffers()))
    if comm.rank != root:
        with torch.no_grad():
            for t in tensors:
                t.zero_()
    _allreduce_flat(comm, tensors)  # x + 0 + ... + 0 = x exactly


def global_sum(comm, *values):
    """The sums over the ranks of these numbers (or 0-d tensors), as Python floats; collective."""
    array = np.array([float(v) for v in values], dtype=np.float64)
    comm.allreduce_sum(array)
    return [float(v) for v in array]
