"""distspmm from Python: ctypes bindings over libdistspmm.so and a Jittor operator.

No compiled extension of its own: the package loads the C library (see `load`) and exposes

- `Comm`, `Chunk`, `Spmm` (numpy in and out, zero-copy chunk data), `SpmmDevice` (device
  pointers, CUDA builds; `built_with_cuda()`), `DistSpmmError`, the mask
  bits `MASK_TRAIN` / `MASK_VAL` / `MASK_TEST`, `load` and `version`;
- `distspmm.jittor` (imported on demand, it needs Jittor): `DistSpmm(op, x)`, the distributed
  aggregation `Ahat X` as a differentiable Jittor operator, `DistGATConv` (PyG's `GATConv`
  parameters) over the per-edge operators, and `communicator()`, which adopts the MPI that
  Jittor initialised under `mpirun`.
- `distspmm.torch` (imported on demand, it needs PyTorch and PyG): `DistSpmm(op, x)` as a
  `torch.autograd.Function`, `DistGCNConv`, `DistSAGEConv`, `DistGINConv`, `DistGATConv` (PyG's
  parameters), the per-edge operators they use (`DistSpmmValues`, `DistSddmm`, `EdgeSoftmax`,
  `edge_weights`), `chunk_data(chunk)` (the chunk as a PyG `Data`) and the gradient sum over
  the ranks (`sync_gradients`).

See docs/jittor.md for the migration from JittorGeometric and examples/jittor/dist_gcn.py for a
distributed GCN trained with it; docs/pytorch.md and examples/torch/gcn.py for PyTorch/PyG.
"""

from . import _capi
from ._capi import *  # noqa: F403 - the bindings are the package's API

__all__ = list(_capi.__all__)
