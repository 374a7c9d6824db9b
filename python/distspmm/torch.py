"""The distributed aggregation for PyTorch and PyTorch Geometric (PyG).

    from distspmm import Chunk, Spmm
    from distspmm.torch import DistGCNConv, DistSpmm, chunk_data, communicator, sync_gradients

    comm = communicator()                  # the MPI world (mpi4py's when installed)
    chunk = Chunk(comm, "cora-2")          # this rank's part of `distspmm partition --parts 2`
    data = chunk_data(chunk)               # a PyG Data: x, y, train/val/test_mask, n_id
    op = Spmm(comm, chunk, "halo")         # or "broadcast"
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

Gradients are summed over the ranks through MPI, on the library's own communicator
(`Comm.allreduce_sum`, a duplicate of the world): `sync_gradients`. See docs/pytorch.md for why
not torch.distributed, the loss scaling that makes the sum the gradient of the global mean loss,
and how to write another layer over `DistSpmm`.
"""

import math
import warnings

import numpy as np
import torch

from ._capi import MASK_TEST, MASK_TRAIN, MASK_VAL, Comm, DistSpmmError, Spmm, SpmmDevice

__all__ = [
    "DistGCNConv",
    "DistSpmm",
    "DistSpmmFunction",
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
