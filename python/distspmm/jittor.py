"""The distributed aggregation as a Jittor operator.

    import jittor as jt
    from distspmm import Chunk, Spmm
    from distspmm.jittor import DistSpmm, communicator

    comm = communicator()                  # adopts the MPI Jittor started under mpirun
    chunk = Chunk(comm, "cora-2")          # this rank's part of `distspmm partition --parts 2`
    op = Spmm(comm, chunk, "halo")         # or "broadcast"; comm_precision="bf16": half the bytes
    x = jt.array(chunk.features)           # (n_p, F): this rank's rows
    h = DistSpmm(op, x @ w)                # (n_p, H): this rank's rows of Ahat (X W)
    jt.grad(h.sum(), w)                    # backward runs Ahat^T dY through the same operator

It replaces JittorGeometric's `DistSpmm(dist, x, csr_list, local_vnum)`: the rank's block rows,
halo lists and communication plan live in the chunk behind `op`, so the call takes only the
operator and the local Var. Forward and backward are collective: every rank calls them in the
same order, which a model that is the same on every rank does by construction.

With a host operator (`Spmm`), Vars are passed as host arrays (one copy in, one copy out,
O(n_p x F) each, small next to the exchange); under `jt.flags.use_cuda = 1` Jittor copies them
between device and host. With a device operator (`SpmmDevice`, a CUDA build of the library,
`jt.flags.use_cuda = 1`), the Var's device memory is handed to the library without a copy: a
Jittor code op (`jt.code`, compiled by Jittor with nvcc) calls `dsp_spmm_device_forward` /
`_backward` through their addresses, on the legacy default stream that Jittor's own CUDA
operators use, so the product is ordered with the ops before and after it.

    op = SpmmDevice(comm, chunk, "halo")   # instead of Spmm
    jt.flags.use_cuda = 1
    h = DistSpmm(op, x @ w)                # device pointers in and out

The device path has not run on a GPU yet (none was available where it was written).

The graph attention layer, PyG's `GATConv` over the chunk, is built from three more
differentiable operators on the per-edge values of the rank's rows (host operator only):

    from distspmm.jittor import DistGATConv
    conv = DistGATConv(chunk.num_features, 8, heads=8, dropout=0.6)
    h = conv(x, op)                        # (n_p, 64); parameters lin.weight, att_src, att_dst, bias

`DistSddmm(op, u, v, groups)` (per-edge dot products of the rows' column blocks),
`EdgeSoftmax(op, logits, groups, negative_slope)` and `DistSpmmValues(op, e, x, groups)` (the
aggregation with per-edge values) are the same calls as `distspmm.torch`'s (docs/pytorch.md).
"""

import math

import jittor as jt
import numpy as np
from jittor import nn

from ._capi import Comm, Spmm, SpmmDevice

__all__ = [
    "DistGATConv",
    "DistSddmm",
    "DistSpmm",
    "DistSpmmFunction",
    "DistSpmmValues",
    "EdgeSoftmax",
    "communicator",
]


def communicator(lib=None):
    """This process's `Comm` for use next to Jittor, created once per process and shared.

    Under `mpirun` Jittor has already initialised MPI (at `import jittor`), so MPI is adopted,
    never initialised twice: through mpi4py's `MPI.COMM_WORLD.py2f()` when mpi4py is installed
    (mpi4py sees MPI initialised and leaves it to Jittor), else `dsp_init`, which adopts
    `MPI_COMM_WORLD` when MPI is up. Without `mpirun` (one process) MPI is initialised for a
    single rank. Import Jittor before mpi4py: Jittor calls MPI_Init itself, which fails once mpi4py
    has initialised MPI. Raises RuntimeError if the library's world differs from Jittor's (a
    launcher other than OpenMPI's: Jittor looks for OMPI_COMM_WORLD_SIZE and would otherwise
    train as P independent single ranks without averaging gradients).
    """
    global _COMM
    if _COMM is not None:
        return _COMM
    try:
        from mpi4py import MPI
    except ImportError:
        comm = Comm(None, lib)
    else:
        comm = Comm(MPI.COMM_WORLD, lib)
    if (comm.rank, comm.size) != (jt.rank, jt.world_size):
        raise RuntimeError(
            f"distspmm sees rank {comm.rank} of {comm.size} but Jittor rank {jt.rank} of "
            f"{jt.world_size}: launch with OpenMPI's mpirun, which Jittor recognises"
        )
    _COMM = comm
    return comm


_COMM = None


# The body of the device code op: the library's entry points arrive as addresses in `data`
# (float64, exact below 2^53), so the op compiles once and links nothing.
_DEVICE_SRC = """
    typedef int (*dsp_product)(void*, size_t, size_t, const float*, size_t, float*, size_t, void*);
    typedef const char* (*dsp_message)(void);
    void* op = (void*)(uintptr_t)(unsigned long long)data["op"];
    dsp_product product = (dsp_product)(uintptr_t)(unsigned long long)data["fn"];
    dsp_message last_error = (dsp_message)(uintptr_t)(unsigned long long)data["last_error"];
    size_t rows = in0_shape0, cols = in0_shape1;
    int status = product(op, rows, cols, in0_p, cols, out0_p, cols, (void*)0);
    if (status != 0) LOGf << "distspmm device product failed (status " << status << "): "
                          << last_error();
"""


def _device_data(op, transpose):
    addresses = op.function_addresses()
    data = {
        "op": addresses["op"],
        "fn": addresses["backward" if transpose else "forward"],
        "last_error": addresses["last_error"],
    }
    for name, value in data.items():
        if not 0 < value < 2**53:
            raise RuntimeError(f"address of {name} does not fit a float64 exactly: {value:#x}")
    return {k: float(v) for k, v in data.items()}


def _apply(op, x, transpose):
    """`op`'s forward (or backward, `transpose`) on the Var `x`: (n_p, cols) float32 in and out."""
    if not isinstance(op, (Spmm, SpmmDevice)):
        raise TypeError(
            f"DistSpmm needs a distspmm.Spmm or SpmmDevice operator, not {type(op).__name__}"
        )
    if x.dtype != jt.float32:
        raise TypeError(
            f"DistSpmm multiplies float32 Vars, not {x.dtype}: convert with x.float32()"
        )
    if x.ndim != 2:
        raise ValueError(f"DistSpmm needs a 2-D (n_p, cols) Var, not shape {tuple(x.shape)}")
    if isinstance(op, SpmmDevice):
        if not jt.flags.use_cuda:
            raise RuntimeError(
                "a SpmmDevice operator works on device memory: set jt.flags.use_cuda = 1 "
                "(or use distspmm.Spmm for host Vars)"
            )
        if x.shape[0] != op.rows:
            raise ValueError(f"x has {x.shape[0]} rows, this rank owns {op.rows}")
        return jt.code(
            x.shape, jt.float32, [x], data=_device_data(op, transpose), cuda_src=_DEVICE_SRC
        )
    data = np.ascontiguousarray(x.numpy())
    out = op.backward(data) if transpose else op.forward(data)
    return jt.array(out)


class DistSpmmFunction(jt.Function):
    """`Y_p = (Ahat X)_p` with gradient `dX_p = (Ahat^T dY)_p`, or the transposed pair.

    `execute(op, x, transpose=False)` takes the `Spmm` of this rank, its local rows `x` and
    whether to multiply by `Ahat^T` instead; `grad(dy)` runs the other product of the same
    operator. Use it through `DistSpmm`.
    """

    def execute(self, op, x, transpose=False):
        self.op = op
        self.transpose = bool(transpose)
        return _apply(op, x, self.transpose)

    def grad(self, dy):
        # One gradient per execute() argument: op and transpose are not Vars.
        if dy is None:
            return None, None, None
        return None, _apply(self.op, dy, not self.transpose), None


def DistSpmm(op, x, transpose=False):  # noqa: N802 - named like JittorGeometric's operator
    """This rank's rows of `Ahat X` (or `Ahat^T X` with `transpose=True`) for the local rows `x`
    (an (n_p, cols) float32 Var, n_p = `chunk.num_local_nodes`, cols equal on every rank),
    differentiable with respect to `x`. Collective over `op`'s communicator."""
    return DistSpmmFunction.apply(op, x, transpose)


def _host(op, what):
    if isinstance(op, SpmmDevice) or not isinstance(op, Spmm):
        raise TypeError(
            f"{what} runs on the host operator only (a distspmm.Spmm), not {type(op).__name__}"
        )


def _f32(var):
    return np.ascontiguousarray(var.numpy(), dtype=np.float32)


class _SpmmValuesFunction(jt.Function):
    """`Y_i[g] = sum_j e_g[ij] X_j[g]`; gradients `dX = A_e^T dY` and
    `de_g[ij] = <dY_i[g], X_j[g]>` (both always computed: collective, in the same order on
    every rank)."""

    def execute(self, op, groups, e, x):
        self.op, self.groups = op, groups
        self.e, self.x = _f32(e), _f32(x)
        return jt.array(op.forward_values(self.e, self.x, groups))

    def grad(self, dy):
        if dy is None:
            return None, None, None, None
        dy = _f32(dy)
        dx = self.op.backward_values(self.e, dy, self.groups)
        de = self.op.sddmm(dy, self.x, self.groups).reshape(self.e.shape)
        return None, None, jt.array(de), jt.array(dx)


def DistSpmmValues(op, e, x, groups=1):  # noqa: N802 - named like DistSpmm
    """This rank's rows of `A_e X` for the per-edge values `e` (`groups * op.edge_count`
    float32, group g at `g * edge_count`), `x` this rank's (n_p, cols) rows: `Y_i[g] =
    sum_j e_g[ij] X_j[g]` over column blocks of width cols / groups. Differentiable with respect
    to `e` and `x`; collective, as its gradient."""
    _host(op, "DistSpmmValues")
    return _SpmmValuesFunction.apply(op, int(groups), e, x)


class _SddmmFunction(jt.Function):
    """`e_g[ij] = <U_i[g], V_j[g]>` with its gradients (one collective call)."""

    def execute(self, op, groups, u, v):
        self.op, self.groups = op, groups
        self.u, self.v = _f32(u), _f32(v)
        return jt.array(op.sddmm(self.u, self.v, groups))

    def grad(self, de):
        if de is None:
            return None, None, None, None
        du, dv = self.op.sddmm_backward(_f32(de), self.u, self.v, self.groups)
        return None, None, jt.array(du), jt.array(dv)


def DistSddmm(op, u, v, groups=1):  # noqa: N802
    """The (groups, op.edge_count) per-edge values `e_g[ij] = <U_i[g], V_j[g]>` over the
    stored entries of this rank's rows (`u`, `v`: this rank's (n_p, cols) rows; the sources'
    rows of `v` arrive by the operator's exchange). Differentiable; collective."""
    _host(op, "DistSddmm")
    return _SddmmFunction.apply(op, int(groups), u, v)


class _EdgeSoftmaxFunction(jt.Function):
    def execute(self, op, groups, negative_slope, logits):
        self.op, self.groups, self.slope = op, groups, negative_slope
        self.logits = _f32(logits)
        self.out = op.edge_softmax(self.logits, groups, negative_slope)
        return jt.array(self.out)

    def grad(self, d_out):
        if d_out is None:
            return None, None, None, None
        d = self.op.edge_softmax_backward(
            self.logits, self.out, _f32(d_out), self.groups, self.slope
        )
        return None, None, None, jt.array(d)


def EdgeSoftmax(op, logits, groups=1, negative_slope=1.0):  # noqa: N802
    """Per group, the softmax over each destination row's entries of LeakyReLU(logits) with
    `negative_slope` (1.0: plain softmax; GAT: 0.2). Differentiable; local."""
    _host(op, "EdgeSoftmax")
    return _EdgeSoftmaxFunction.apply(op, int(groups), float(negative_slope), logits)


def _glorot(shape, fan_in, fan_out):
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return jt.array(np.random.uniform(-bound, bound, shape).astype(np.float32))


class DistGATConv(nn.Module):
    """PyG's `GATConv` (`add_self_loops=True`) over the rank's chunk, as `distspmm.torch`'s
    `DistGATConv`: per head `h`, `z = lin(x)`, `alpha_ij = softmax_i(LeakyReLU(<att_dst[h],
    z_i[h]> + <att_src[h], z_j[h]>))` over the stored entries of row `i` (the input's edges and
    one self loop per node), dropout on `alpha` while training, `out_i[h] = sum_j alpha_ij
    z_j[h]`, the heads concatenated or averaged, plus the bias. Parameters with GATConv's names
    and shapes: `lin.weight` (heads * out, in), `att_src`, `att_dst` (1, heads, out), Glorot
    uniform (from NumPy's global generator), `bias` zeros. `execute(x, op)`: this rank's rows
    and its host operator (`distspmm.Spmm`)."""

    def __init__(self, in_channels, out_channels, heads=1, concat=True, negative_slope=0.2,
                 dropout=0.0, bias=True):
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
        hc = heads * out_channels
        self.lin = nn.Linear(in_channels, hc, bias=False)
        self.lin.weight = _glorot((hc, in_channels), in_channels, hc)
        self.att_src = _glorot((1, heads, out_channels), heads, out_channels)
        self.att_dst = _glorot((1, heads, out_channels), heads, out_channels)
        self.bias = jt.zeros(hc if concat else out_channels) if bias else None

    def execute(self, x, op):
        if x.ndim != 2 or x.shape[0] != op.rows:
            raise ValueError(
                f"x must have shape ({op.rows}, {self.in_channels}) (this rank's rows), not "
                f"{tuple(x.shape)}"
            )
        n, heads, c = x.shape[0], self.heads, self.out_channels
        z = self.lin(x)
        zh = z.reshape(n, heads, c)
        s = (zh * self.att_dst).sum(-1)  # (n, heads): the destination's half of each logit
        t = (zh * self.att_src).sum(-1)  # the source's half
        ones = jt.ones_like(s)
        u = jt.stack([s, ones], dim=-1).reshape(n, 2 * heads)
        v = jt.stack([ones, t], dim=-1).reshape(n, 2 * heads)
        alpha = EdgeSoftmax(op, DistSddmm(op, u, v, heads), heads, self.negative_slope)
        if self.dropout > 0.0 and self.is_training():
            alpha = nn.dropout(alpha, self.dropout, is_train=True)
        out = DistSpmmValues(op, alpha, z, heads)
        if not self.concat:
            out = out.reshape(n, heads, c).mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out
