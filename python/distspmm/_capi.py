"""ctypes bindings over libdistspmm.so (the C ABI in include/distspmm.h), with numpy views.

Pure Python: numpy is the only requirement (mpi4py to adopt the host's communicator). Import it
through the package (`from distspmm import Comm, Chunk, Spmm`); this module is its single copy.

    from mpi4py import MPI
    import numpy as np
    from distspmm import Comm, Chunk, Spmm

    comm = Comm(MPI.COMM_WORLD)          # adopts mpi4py's communicator (py2f handle)
    chunk = Chunk(comm, "cora-2")        # this rank's part of a `distspmm partition` directory
    x = chunk.features                   # zero-copy, read-only (n_p x F float32)
    op = Spmm(comm, chunk, "halo")       # or "broadcast"
    y = op.forward(x)                    # Y_p = (Ahat X)_p, collective
    dx = op.backward(np.ones_like(y))    # dX_p = (Ahat^T dY)_p, collective

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
    given (`out=`), else allocated."""

    _free = "dsp_spmm_free"

    def __init__(self, comm, chunk, schedule="halo"):
        super().__init__(comm._lib)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule is 'halo' or 'broadcast', not {schedule!r}")
        code = self._lib.dsp_spmm_create(
            comm.handle, chunk.handle, SCHEDULES[schedule], ctypes.byref(self._ptr)
        )
        _check(self._lib, code)
        self.rows = chunk.num_local_nodes

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
