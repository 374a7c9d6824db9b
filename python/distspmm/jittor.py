"""The distributed aggregation as a Jittor operator.

    import jittor as jt
    from distspmm import Chunk, Spmm
    from distspmm.jittor import DistSpmm, communicator

    comm = communicator()                  # adopts the MPI Jittor started under mpirun
    chunk = Chunk(comm, "cora-2")          # this rank's part of `distspmm partition --parts 2`
    op = Spmm(comm, chunk, "halo")         # or "broadcast"
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
"""

import jittor as jt
import numpy as np

from ._capi import Comm, Spmm, SpmmDevice

__all__ = ["DistSpmm", "DistSpmmFunction", "communicator"]


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
