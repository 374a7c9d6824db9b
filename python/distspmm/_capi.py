"""ctypes bindings over libdistspmm.so (the C ABI in include/distspmm.h), with numpy views.

Pure Python: numpy is the only requirement (mpi4py to adopt the host's communicator). Import it
through the package (`from distspmm import Comm, Chunk, Spmm`); this module is its single copy.

    from mpi4py import MPI
    import numpy as np
    from distspmm import Comm, Chunk, Spmm

    comm = Comm(MPI.COMM_WORLD)          # adopts mpi4py's communicator (py2f handle)
    chunk = Chunk(comm, "cora-2")        # this rank's part of a `distspmm partition` directory
    x = chunk.features                   # zero-copy, read-only (n_p x F float32)
    op = Spmm(comm, chunk, "halo")       # or "broadcast"; comm_precision="bf16" halves the bytes
    y = op.forward(x)                    # Y_p = (Ahat X)_p, collective
    dx = op.backward(np.ones_like(y))    # dX_p = (Ahat^T dY)_p, collective
    e = op.sddmm(u, v)                   # per-edge <U_i, V_j> over Ahat's stored entries
    y = op.forward_values(e, x)          # sum_j e_ij X_j; edge_softmax, edge_weights, ...

Every call that fails raises DistSpmmError(status, message) with the library's message; collective
calls fail on every rank together (the library agrees on errors before communicating), so an
exception never leaves the other ranks waiting.

Finding the library: the `lib` argument of `load()`, else $DISTSPMM_LIB (a path to the .so), else
$DISTSPMM_ROOT/lib/libdistspmm.so (an install prefix from capi/install.sh), else the repository's
target/release and target/debug (under $CARGO_TARGET_DIR when set).

Thread rules (see docs/c-api.md): Comm and Spmm objects must be used on the thread that created the
Comm; Chunk objects and their arrays may be read from any thread.
"""

import ctypes
import os
from pathlib import Path

import numpy as np

__all__ = [
    "COMM_PRECISIONS",
    "Chunk",
    "Comm",
    "DistSpmmError",
    "MASK_TEST",
    "MASK_TRAIN",
    "MASK_VAL",
    "SCHEDULES",
    "Spmm",
    "SpmmDevice",
    "built_with_cuda",
    "load",
    "version",
]

# dsp_status values (stable: see docs/c-api.md); the one source is the C ABI's table in
# capi/src/boundary.rs, and capi/tests/status.rs checks this dict, the header and the docs against it.
STATUS_NAMES = {
    0: "OK",
    1: "NULL_ARGUMENT",
    2: "INVALID_ARGUMENT",
    3: "ARGUMENT_MISMATCH",
    4: "PARTS_MISMATCH",
    5: "IO",
    6: "INVALID_CHUNK",
    7: "NOT_PRESENT",
    8: "MPI",
    9: "MPI_ENVIRONMENT",
    10: "PEER_FAILED",
    11: "WRONG_THREAD",
    12: "UNSUPPORTED",
    13: "PANIC",
    14: "OUT_OF_MEMORY",
    15: "DEVICE",
}
MASK_TRAIN, MASK_VAL, MASK_TEST = 1, 2, 4
SCHEDULES = {"halo": 0, "broadcast": 1}
# dsp_comm_precision values: the format of the values a Spmm hands to MPI.
COMM_PRECISIONS = {"f32": 0, "bf16": 1, "f16": 2}


class DistSpmmError(RuntimeError):
    """A dsp_ call failed: `status` is the dsp_status name, `code` its value."""

    def __init__(self, code, message):
        self.code = code
        self.status = STATUS_NAMES.get(code, f"UNKNOWN({code})")
        super().__init__(f"{self.status}: {message}")


_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t
_SIGNATURES = {
    # name: (restype, argtypes)
    "dsp_version": (ctypes.c_uint32, []),
    "dsp_version_string": (ctypes.c_char_p, []),
    "dsp_status_str": (ctypes.c_char_p, [ctypes.c_int32]),
    "dsp_last_error": (ctypes.c_char_p, []),
    "dsp_init": (ctypes.c_int32, [ctypes.POINTER(_P)]),
    "dsp_init_fortran": (ctypes.c_int32, [ctypes.c_int32, ctypes.POINTER(_P)]),
    "dsp_finalize": (ctypes.c_int32, [_P]),
    "dsp_comm_rank": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_uint32)]),
    "dsp_comm_size": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_uint32)]),
    "dsp_barrier": (ctypes.c_int32, [_P]),
    "dsp_allreduce_sum_f32": (ctypes.c_int32, [_P, _P, _SIZE]),
    "dsp_allreduce_sum_f64": (ctypes.c_int32, [_P, _P, _SIZE]),
    "dsp_chunk_open": (ctypes.c_int32, [_P, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "dsp_chunk_free": (None, [_P]),
    "dsp_chunk_part": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_uint32)]),
    "dsp_chunk_num_parts": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_uint32)]),
    "dsp_chunk_num_local_nodes": (ctypes.c_int32, [_P, ctypes.POINTER(_SIZE)]),
    "dsp_chunk_num_halo_rows": (ctypes.c_int32, [_P, ctypes.POINTER(_SIZE)]),
    "dsp_chunk_num_global_nodes": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_uint64)]),
    "dsp_chunk_global_offset": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_uint64)]),
    "dsp_chunk_num_features": (ctypes.c_int32, [_P, ctypes.POINTER(_SIZE)]),
    "dsp_chunk_num_classes": (ctypes.c_int32, [_P, ctypes.POINTER(_SIZE)]),
    "dsp_chunk_features": (ctypes.c_int32, [_P, ctypes.POINTER(_P), ctypes.POINTER(_SIZE)]),
    "dsp_chunk_labels": (ctypes.c_int32, [_P, ctypes.POINTER(_P), ctypes.POINTER(_SIZE)]),
    "dsp_chunk_masks": (ctypes.c_int32, [_P, ctypes.POINTER(_P), ctypes.POINTER(_SIZE)]),
    "dsp_chunk_original_ids": (ctypes.c_int32, [_P, ctypes.POINTER(_P), ctypes.POINTER(_SIZE)]),
    "dsp_spmm_create": (ctypes.c_int32, [_P, _P, ctypes.c_int32, ctypes.POINTER(_P)]),
    "dsp_spmm_free": (None, [_P]),
    "dsp_spmm_forward": (ctypes.c_int32, [_P, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE]),
    "dsp_spmm_backward": (ctypes.c_int32, [_P, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE]),
    "dsp_spmm_bytes_last_call": (
        ctypes.c_int32,
        [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)],
    ),
    "dsp_built_with_cuda": (ctypes.c_int32, []),
    # The per-edge calls (ABI 0.2.0): see _PER_EDGE below.
    "dsp_spmm_edge_count": (ctypes.c_int32, [_P, ctypes.POINTER(_SIZE)]),
    "dsp_spmm_edges": (ctypes.c_int32, [_P, _P, _P, _SIZE]),
    "dsp_spmm_edge_weights": (ctypes.c_int32, [_P, _P, _SIZE]),
    "dsp_spmm_forward_values": (
        ctypes.c_int32,
        [_P, _SIZE, _P, _SIZE, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE],
    ),
    "dsp_spmm_backward_values": (
        ctypes.c_int32,
        [_P, _SIZE, _P, _SIZE, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE],
    ),
    "dsp_sddmm": (ctypes.c_int32, [_P, _SIZE, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE, _P, _SIZE]),
    "dsp_sddmm_backward": (
        ctypes.c_int32,
        [_P, _SIZE, _P, _SIZE, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE, _P, _SIZE, _P, _SIZE],
    ),
    "dsp_edge_softmax": (ctypes.c_int32, [_P, _SIZE, ctypes.c_float, _P, _P, _SIZE]),
    "dsp_edge_softmax_backward": (
        ctypes.c_int32,
        [_P, _SIZE, ctypes.c_float, _P, _P, _P, _P, _SIZE],
    ),
    # The message precision (ABI 0.2.0): see _PRECISION below.
    "dsp_spmm_create_with_precision": (
        ctypes.c_int32,
        [_P, _P, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(_P)],
    ),
    "dsp_spmm_comm_precision": (ctypes.c_int32, [_P, ctypes.POINTER(ctypes.c_int32)]),
    "dsp_spmm_create_device": (
        ctypes.c_int32,
        [_P, _P, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(_P)],
    ),
    "dsp_spmm_device_free": (None, [_P]),
    "dsp_spmm_device_forward": (ctypes.c_int32, [_P, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE, _P]),
    "dsp_spmm_device_backward": (ctypes.c_int32, [_P, _SIZE, _SIZE, _P, _SIZE, _P, _SIZE, _P]),
    "dsp_spmm_device_bytes_last_call": (
        ctypes.c_int32,
        [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)],
    ),
}

# Calls a library older than ABI 0.2.0 lacks: it still loads, and using them says what to do.
_PER_EDGE = {
    "dsp_spmm_edge_count",
    "dsp_spmm_edges",
    "dsp_spmm_edge_weights",
    "dsp_spmm_forward_values",
    "dsp_spmm_backward_values",
    "dsp_sddmm",
    "dsp_sddmm_backward",
    "dsp_edge_softmax",
    "dsp_edge_softmax_backward",
}
_PRECISION = {"dsp_spmm_create_with_precision", "dsp_spmm_comm_precision"}

_LIB = None


def _candidates():
    if os.environ.get("DISTSPMM_LIB"):
        yield Path(os.environ["DISTSPMM_LIB"])
    if os.environ.get("DISTSPMM_ROOT"):
        yield Path(os.environ["DISTSPMM_ROOT"]) / "lib" / "libdistspmm.so"
    repo = Path(__file__).resolve().parents[2]
    target = Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
    yield target / "release" / "libdistspmm.so"
    yield target / "debug" / "libdistspmm.so"


def load(lib=None):
    """Loads libdistspmm.so once (see the module docs for where it is looked for) and returns
    the ctypes library with every function's signature declared."""
    global _LIB
    if _LIB is not None and lib is None:
        return _LIB
    paths = [Path(lib)] if lib is not None else list(_candidates())
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(
            "libdistspmm.so not found (looked at "
            + ", ".join(str(p) for p in paths)
            + "); build it with `cargo build --release -p distspmm-capi` or set DISTSPMM_LIB"
        )
    # RTLD_GLOBAL: libmpi's plugins need its symbols when MPI was not loaded by mpi4py first.
    handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    for name, (restype, argtypes) in _SIGNATURES.items():
        if name in _PER_EDGE | _PRECISION and not hasattr(handle, name):
            continue
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _LIB = handle
    return handle


def _check(lib, code):
    if code != 0:
        raise DistSpmmError(code, lib.dsp_last_error().decode("utf-8", "replace"))


def version():
    """The library's version string, e.g. '0.1.0'."""
    return load().dsp_version_string().decode()


class _Handle:
    """Owns one C handle; `close()` (or garbage collection) frees it once."""

    _free = None

    def __init__(self, lib):
        self._lib = lib
        self._ptr = _P()

    @property
    def handle(self):
        if not self._ptr:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._ptr

    def close(self):
        if self._ptr:
            getattr(self._lib, self._free)(self._ptr)
            self._ptr = _P()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


class Comm(_Handle):
    """A communicator. `Comm()` initialises MPI (or adopts MPI_COMM_WORLD if MPI is already up);
    `Comm(mpi4py_comm)` adopts that communicator through its Fortran handle (`py2f()`);
    `Comm(int)` adopts a Fortran handle. Collective. Use it on the creating thread only."""

    _free = "dsp_finalize"

    def __init__(self, comm=None, lib=None):
        super().__init__(load(lib))
        if comm is None:
            _check(self._lib, self._lib.dsp_init(ctypes.byref(self._ptr)))
        else:
            handle = comm.py2f() if hasattr(comm, "py2f") else int(comm)
            _check(self._lib, self._lib.dsp_init_fortran(handle, ctypes.byref(self._ptr)))

    def close(self):
        if self._ptr:
            _check(self._lib, self._lib.dsp_finalize(self._ptr))
            self._ptr = _P()

    @property
    def rank(self):
        out = ctypes.c_uint32()
        _check(self._lib, self._lib.dsp_comm_rank(self.handle, ctypes.byref(out)))
        return out.value

    @property
    def size(self):
        out = ctypes.c_uint32()
        _check(self._lib, self._lib.dsp_comm_size(self.handle, ctypes.byref(out)))
        return out.value

    def barrier(self):
        _check(self._lib, self._lib.dsp_barrier(self.handle))

    def allreduce_sum(self, array):
        """Sums a C-contiguous float32 or float64 array over all ranks, in place; returns it."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise TypeError("allreduce_sum needs a C-contiguous numpy array")
        if not array.flags.writeable:
            raise ValueError("allreduce_sum writes its argument: pass a writeable array")
        fn = {
            np.dtype(np.float32): self._lib.dsp_allreduce_sum_f32,
            np.dtype(np.float64): self._lib.dsp_allreduce_sum_f64,
        }.get(array.dtype)
        if fn is None:
            raise TypeError(f"allreduce_sum takes float32 or float64, not {array.dtype}")
        _check(self._lib, fn(self.handle, array.ctypes.data, array.size))
        return array


class _View:
    """Exposes library memory to numpy without copying, keeping its owner alive."""

    def __init__(self, owner, address, shape, dtype):
        self._owner = owner
        self.__array_interface__ = {
            "data": (address, True),  # read-only
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "version": 3,
        }


class Chunk(_Handle):
    """This rank's part of a chunk directory (collective open). Arrays it returns are read-only
    views of the memory-mapped file and keep it mapped while they live."""

    _free = "dsp_chunk_free"

    def __init__(self, comm, directory):
        super().__init__(comm._lib)
        path = os.fsencode(directory)
        _check(self._lib, self._lib.dsp_chunk_open(comm.handle, path, ctypes.byref(self._ptr)))

    def _query(self, fn, ctype):
        out = ctype()
        _check(self._lib, fn(self.handle, ctypes.byref(out)))
        return out.value

    part = property(lambda s: s._query(s._lib.dsp_chunk_part, ctypes.c_uint32))
    num_parts = property(lambda s: s._query(s._lib.dsp_chunk_num_parts, ctypes.c_uint32))
    num_local_nodes = property(lambda s: s._query(s._lib.dsp_chunk_num_local_nodes, _SIZE))
    num_halo_rows = property(lambda s: s._query(s._lib.dsp_chunk_num_halo_rows, _SIZE))
    num_global_nodes = property(
        lambda s: s._query(s._lib.dsp_chunk_num_global_nodes, ctypes.c_uint64)
    )
    global_offset = property(lambda s: s._query(s._lib.dsp_chunk_global_offset, ctypes.c_uint64))
    num_features = property(lambda s: s._query(s._lib.dsp_chunk_num_features, _SIZE))
    num_classes = property(lambda s: s._query(s._lib.dsp_chunk_num_classes, _SIZE))

    def _array(self, fn, dtype, shape_of):
        data, length = _P(), _SIZE()
        _check(self._lib, fn(self.handle, ctypes.byref(data), ctypes.byref(length)))
        shape = shape_of(length.value)
        if length.value == 0:
            return np.empty(shape, dtype=dtype)
        return np.asarray(_View(self, data.value, shape, dtype))

    @property
    def features(self):
        """n_p x F float32 (DistSpmmError NOT_PRESENT without features)."""
        f = self.num_features
        return self._array(self._lib.dsp_chunk_features, np.float32, lambda n: (n // max(f, 1), f))

    @property
    def labels(self):
        """n_p int32 class ids, -1 for unlabelled nodes."""
        return self._array(self._lib.dsp_chunk_labels, np.int32, lambda n: (n,))

    @property
    def masks(self):
        """n_p uint8 of MASK_TRAIN | MASK_VAL | MASK_TEST bits."""
        return self._array(self._lib.dsp_chunk_masks, np.uint8, lambda n: (n,))

    @property
    def original_ids(self):
        """n_p uint64: each local node's id in the input graph."""
        return self._array(self._lib.dsp_chunk_original_ids, np.uint64, lambda n: (n,))

    def close(self):
        """Unmaps the chunk now. Arrays obtained from it must not be used afterwards; without
        close() the mapping lives until the Chunk and all its arrays are garbage."""
        super().close()


def _rows(array, rows, what):
    """A float32 2-D array with `rows` rows whose rows are contiguous (any row stride):
    returns (array, leading dimension in elements)."""
    a = np.asarray(array)
    if a.dtype != np.float32 or a.ndim != 2 or a.shape[0] != rows:
        raise ValueError(f"{what} must be a float32 array of shape ({rows}, cols), not "
                         f"{a.dtype} {a.shape}")
    cols = a.shape[1]
    if rows <= 1 or cols == 0:
        return np.ascontiguousarray(a), cols
    if a.strides[1] != 4 or a.strides[0] % 4 != 0 or a.strides[0] < 4 * cols:
        a = np.ascontiguousarray(a)
    return a, a.strides[0] // 4


def _bytes_last_call(lib, fn, handle):
    """(sent, received) from a `dsp_*_bytes_last_call` function."""
    sent, received = ctypes.c_uint64(), ctypes.c_uint64()
    _check(lib, fn(handle, ctypes.byref(sent), ctypes.byref(received)))
    return sent.value, received.value


class Spmm(_Handle):
    """The distributed product of one rank: forward Y_p = (Ahat X)_p, backward
    dX_p = (Ahat^T dY)_p, on n_p x cols float32 arrays (collective; `cols` equal on all ranks).
    Inputs may be row-strided views (e.g. column slices); outputs are written in place when
    given (`out=`), else allocated.

    `comm_precision` is the format the rows and partial sums travel in between ranks: "f32"
    (as they are), "bf16" or "f16" (half the bytes; each value that crosses ranks is rounded
    once, within a relative 2**-8 or 2**-11; products and sums stay float32). It applies to
    every collective call, the per-edge products and SDDMM included, and must be the same on
    every rank (DistSpmmError ARGUMENT_MISMATCH on all ranks otherwise; see docs/c-api.md,
    "Message precision")."""

    _free = "dsp_spmm_free"

    def __init__(self, comm, chunk, schedule="halo", comm_precision="f32"):
        super().__init__(comm._lib)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule is 'halo' or 'broadcast', not {schedule!r}")
        if comm_precision not in COMM_PRECISIONS:
            raise ValueError(f"comm_precision is 'f32', 'bf16' or 'f16', not {comm_precision!r}")
        if comm_precision == "f32":
            code = self._lib.dsp_spmm_create(
                comm.handle, chunk.handle, SCHEDULES[schedule], ctypes.byref(self._ptr)
            )
        else:
            code = self._fn("dsp_spmm_create_with_precision")(
                comm.handle,
                chunk.handle,
                SCHEDULES[schedule],
                COMM_PRECISIONS[comm_precision],
                ctypes.byref(self._ptr),
            )
        _check(self._lib, code)
        self.rows = chunk.num_local_nodes

    @property
    def comm_precision(self):
        """The format of the values this operator hands to MPI: "f32", "bf16" or "f16"."""
        if not hasattr(self._lib, "dsp_spmm_comm_precision"):
            return "f32"  # a library before the option: every operator is f32
        out = ctypes.c_int32()
        _check(self._lib, self._lib.dsp_spmm_comm_precision(self.handle, ctypes.byref(out)))
        return next(name for name, code in COMM_PRECISIONS.items() if code == out.value)

    def _call(self, fn, x, out, names):
        x, ldx = _rows(x, self.rows, names[0])
        cols = x.shape[1]
        if out is None:
            out = np.empty((self.rows, cols), dtype=np.float32)
        elif not out.flags.writeable:
            raise ValueError(f"{names[1]} must be writeable")
        y, ldy = _rows(out, self.rows, names[1])
        if y is not out:
            raise ValueError(f"{names[1]} must have contiguous rows (its columns unit-strided)")
        if y.shape[1] != cols:
            raise ValueError(f"{names[1]} has {y.shape[1]} columns, {names[0]} has {cols}")
        _check(self._lib, fn(self.handle, self.rows, cols, x.ctypes.data, ldx, y.ctypes.data, ldy))
        return y

    def forward(self, x, out=None):
        """Y_p = (Ahat X)_p from this rank's rows X_p; returns Y_p."""
        return self._call(self._lib.dsp_spmm_forward, x, out, ("x", "out"))

    def backward(self, dy, out=None):
        """dX_p = (Ahat^T dY)_p from this rank's rows dY_p; returns dX_p."""
        return self._call(self._lib.dsp_spmm_backward, dy, out, ("dy", "out"))

    @property
    def bytes_last_call(self):
        """(sent, received) payload bytes of this rank's last forward/backward call."""
        return _bytes_last_call(self._lib, self._lib.dsp_spmm_bytes_last_call, self.handle)

    # The per-edge operand: one float32 per stored non-zero of this rank's rows of Ahat (the
    # diagonal entries the normalisation added included), in the operator's edge order; `groups`
    # operands (the heads of an attention layer) are `groups` runs of `edge_count` values, a
    # C-contiguous (groups, edge_count) array. Every product below is collective, the edge
    # softmax local; sizes are checked by the library on every rank together.

    def _fn(self, name):
        if not hasattr(self._lib, name):
            what = "the message precision" if name in _PRECISION else "the per-edge calls"
            raise DistSpmmError(
                12,
                f"libdistspmm {version()} has no {name} ({what} came with ABI 0.2.0): "
                "rebuild it (cargo build --release -p distspmm-capi) or point DISTSPMM_LIB "
                "at a newer one",
            )
        return getattr(self._lib, name)

    @property
    def edge_count(self):
        """Values of one group of the per-edge operand: this rank's stored non-zeros."""
        out = _SIZE()
        _check(self._lib, self._fn("dsp_spmm_edge_count")(self.handle, ctypes.byref(out)))
        return out.value

    def edges(self):
        """(rows, sources), two int64 arrays of `edge_count`: the local row (destination) of
        each position of the per-edge operand and the global (renumbered) id of its source.
        Local."""
        n = self.edge_count
        rows, sources = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        fn = self._fn("dsp_spmm_edges")
        _check(self._lib, fn(self.handle, rows.ctypes.data, sources.ctypes.data, n))
        return rows, sources

    def edge_weights(self):
        """float32 `edge_count`: each edge's weight in A (not Ahat): the input's weights
        summed, 1 for an unweighted edge, 0 at a self loop the normalisation added. Local;
        DistSpmmError INVALID_ARGUMENT for chunks written without edge weights."""
        n = self.edge_count
        out = np.empty(n, dtype=np.float32)
        _check(self._lib, self._fn("dsp_spmm_edge_weights")(self.handle, out.ctypes.data, n))
        return out

    def _values_call(self, name, groups, e, x, out, names):
        fn = self._fn(name)
        e = _edge_values(e, names[0])
        x, ldx = _rows(x, self.rows, names[1])
        cols = x.shape[1]
        y, ldy = _rows(_output(out, (self.rows, cols), names[2]), self.rows, names[2])
        code = fn(self.handle, groups, e.ctypes.data, e.size, self.rows, cols, x.ctypes.data,
                  ldx, y.ctypes.data, ldy)
        _check(self._lib, code)
        return y

    def forward_values(self, e, x, groups=1, out=None):
        """Y_i[g] = sum_j e_g[ij] X_j[g] for this rank's rows (X_j[g]: column block g of
        width cols/groups). Collective; returns Y_p."""
        return self._values_call("dsp_spmm_forward_values", groups, e, x, out, ("e", "x", "out"))

    def backward_values(self, e, dy, groups=1, out=None):
        """dX_j[g] = sum_i e_g[ij] dY_i[g] (the transpose of `forward_values`). Collective;
        returns dX_p."""
        return self._values_call(
            "dsp_spmm_backward_values", groups, e, dy, out, ("e", "dy", "out")
        )

    def sddmm(self, u, v, groups=1, out=None):
        """e_g[ij] = <U_i[g], V_j[g]> for every stored (i, j) of this rank's rows: U and V
        are (rows, cols) blocks, the sources' rows of V arriving by the operator's exchange.
        Collective; returns the (groups, edge_count) per-edge values."""
        fn = self._fn("dsp_sddmm")
        u, ldu = _rows(u, self.rows, "u")
        v, ldv = _rows(v, self.rows, "v")
        if u.shape[1] != v.shape[1]:
            raise ValueError(f"u has {u.shape[1]} columns, v has {v.shape[1]}")
        e = _output(out, (groups, self.edge_count), "out", contiguous=True)
        code = fn(self.handle, groups, self.rows, u.shape[1], u.ctypes.data, ldu,
                  v.ctypes.data, ldv, e.ctypes.data, e.size)
        _check(self._lib, code)
        return e

    def sddmm_backward(self, de, u, v, groups=1, du=None, dv=None):
        """The gradients of `sddmm`: dU_i[g] = sum_j dE_g[ij] V_j[g] and
        dV_j[g] = sum_i dE_g[ij] U_i[g]. Collective; returns (dU_p, dV_p)."""
        fn = self._fn("dsp_sddmm_backward")
        de = _edge_values(de, "de")
        u, ldu = _rows(u, self.rows, "u")
        v, ldv = _rows(v, self.rows, "v")
        if u.shape[1] != v.shape[1]:
            raise ValueError(f"u has {u.shape[1]} columns, v has {v.shape[1]}")
        cols = u.shape[1]
        du, lddu = _rows(_output(du, (self.rows, cols), "du"), self.rows, "du")
        dv, lddv = _rows(_output(dv, (self.rows, cols), "dv"), self.rows, "dv")
        code = fn(self.handle, groups, de.ctypes.data, de.size, self.rows, cols,
                  u.ctypes.data, ldu, v.ctypes.data, ldv, du.ctypes.data, lddu,
                  dv.ctypes.data, lddv)
        _check(self._lib, code)
        return du, dv

    def edge_softmax(self, logits, groups=1, negative_slope=1.0, out=None):
        """softmax over each destination row's entries, per group, of LeakyReLU(logits) with
        `negative_slope` (1.0: no activation; GAT uses 0.2). Local; returns the
        (groups, edge_count) coefficients."""
        fn = self._fn("dsp_edge_softmax")
        logits = _edge_values(logits, "logits")
        out = _output(out, logits.shape, "out", contiguous=True)
        code = fn(self.handle, groups, float(negative_slope), logits.ctypes.data,
                  out.ctypes.data, out.size)
        _check(self._lib, code)
        return out

    def edge_softmax_backward(self, logits, out, d_out, groups=1, negative_slope=1.0,
                              d_logits=None):
        """The gradient of `edge_softmax` with respect to its logits, from the logits, its
        result `out` and the gradient `d_out` of that result. Local; returns d_logits."""
        fn = self._fn("dsp_edge_softmax_backward")
        logits = _edge_values(logits, "logits")
        out = _edge_values(out, "out")
        d_out = _edge_values(d_out, "d_out")
        d_logits = _output(d_logits, d_out.shape, "d_logits", contiguous=True)
        code = fn(self.handle, groups, float(negative_slope), logits.ctypes.data,
                  out.ctypes.data, d_out.ctypes.data, d_logits.ctypes.data, d_logits.size)
        _check(self._lib, code)
        return d_logits


def _edge_values(array, what):
    """A per-edge operand as a C-contiguous float32 array (copied only when it is not one);
    its size is the `count` the library checks."""
    a = np.asarray(array)
    if a.dtype != np.float32:
        raise ValueError(f"{what} must be a float32 array of per-edge values, not {a.dtype}")
    return np.ascontiguousarray(a)


def _output(out, shape, what, contiguous=False):
    """`out` when given (written in place: a writeable float32 array of `shape`, C-contiguous
    when `contiguous`, else with contiguous rows), else a new float32 array of `shape`."""
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if not isinstance(out, np.ndarray) or not out.flags.writeable:
        raise ValueError(f"{what} must be a writeable numpy array")
    if out.dtype != np.float32 or out.shape != tuple(shape):
        raise ValueError(
            f"{what} must be float32 of shape {tuple(shape)}, not {out.dtype} {out.shape}"
        )
    if contiguous and not out.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if not contiguous and _rows(out, shape[0], what)[0] is not out:
        raise ValueError(f"{what} must have contiguous rows (its columns unit-strided)")
    return out


def built_with_cuda(lib=None):
    """Whether the loaded library was built with CUDA (`SpmmDevice` also needs a GPU at run
    time)."""
    return bool(load(lib).dsp_built_with_cuda())


class SpmmDevice(_Handle):
    """The distributed product of one rank on GPU memory (`dsp_spmm_create_device`): the same
    products as `Spmm`, on device pointers, queued on a CUDA stream. Collective to create;
    `device` is the CUDA ordinal (-1: the rank's local rank modulo the host's GPUs). Raises
    DistSpmmError with status UNSUPPORTED when the library was built without CUDA or no GPU,
    driver or NCCL library is usable (on every rank).

    Frameworks that own device memory call `forward_ptr` / `backward_ptr` with raw pointers
    (see `distspmm.jittor`); `function_addresses()` gives the C entry points for code that
    calls them from the framework's own compiled operators."""

    _free = "dsp_spmm_device_free"

    def __init__(self, comm, chunk, schedule="halo", device=-1):
        super().__init__(comm._lib)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule is 'halo' or 'broadcast', not {schedule!r}")
        code = self._lib.dsp_spmm_create_device(
            comm.handle, chunk.handle, SCHEDULES[schedule], int(device), ctypes.byref(self._ptr)
        )
        _check(self._lib, code)
        self.rows = chunk.num_local_nodes

    def _call(self, fn, cols, x_ptr, ldx, y_ptr, ldy, stream):
        if ldx < cols or ldy < cols:
            raise ValueError(f"leading dimensions {ldx}, {ldy} must be >= cols = {cols}")
        _check(self._lib, fn(self.handle, self.rows, cols, x_ptr, ldx, y_ptr, ldy, stream))

    def forward_ptr(self, cols, x_ptr, ldx, y_ptr, ldy, stream=None):
        """Queues Y_p = (Ahat X)_p on `stream` (an int cudaStream_t, None: the legacy default
        stream); `x_ptr`/`y_ptr` are device addresses of (rows, cols) row-major blocks."""
        self._call(self._lib.dsp_spmm_device_forward, cols, x_ptr, ldx, y_ptr, ldy, stream)

    def backward_ptr(self, cols, dy_ptr, lddy, dx_ptr, lddx, stream=None):
        """Queues dX_p = (Ahat^T dY)_p on `stream`, as `forward_ptr`."""
        self._call(self._lib.dsp_spmm_device_backward, cols, dy_ptr, lddy, dx_ptr, lddx, stream)

    def function_addresses(self):
        """{"op", "forward", "backward", "last_error"}: the handle and the C functions'
        addresses as ints, for a compiled operator that calls the library directly."""
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        return {
            "op": self.handle.value,
            "forward": addr(self._lib.dsp_spmm_device_forward),
            "backward": addr(self._lib.dsp_spmm_device_backward),
            "last_error": addr(self._lib.dsp_last_error),
        }

    @property
    def bytes_last_call(self):
        """(sent, received) payload bytes of this rank's last forward/backward call."""
        return _bytes_last_call(self._lib, self._lib.dsp_spmm_device_bytes_last_call, self.handle)
