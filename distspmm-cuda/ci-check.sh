#!/usr/bin/env bash
# CI hook for distspmm-cuda without a GPU: makes sure nvcc is available (the PyPI wheels,
# pinned to CUDA 13.0 to match the device machines' driver 580), builds the crate with
# `--features cuda` — build.rs compiles kernels/*.cu for sm_80, sm_90 and compute_90 PTX with
# `ptxas -v` and fails on any register spill — then lints it and runs its tests (the GPU tests
# skip with "skipping: no CUDA device") and prints the ptxas register/spill table. The crates
# built on the kernels get the same treatment with their `cuda` features: distspmm-op (the GPU
# distributed SpMM: host-side layout tests, GPU tests that skip) and the C ABI (device-pointer
# entry points).
#
#   distspmm-cuda/ci-check.sh               # install-if-missing, build, clippy, tests
#   distspmm-cuda/ci-check.sh --build-only  # install-if-missing, build
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

have_nvcc() {
    { [ -n "${NVCC:-}" ] && [ -x "$NVCC" ]; } && return 0
    { [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; } && return 0
    command -v nvcc >/dev/null 2>&1 && return 0
    python3 - <<'PY' 2>/dev/null
import os, sys
import nvidia
sys.exit(0 if any(os.path.isfile(os.path.join(p, "cu13", "bin", "nvcc")) for p in nvidia.__path__) else 1)
PY
}

if ! have_nvcc; then
    echo "ci-check: installing nvcc 13.0 from PyPI"
    # nvcc's wheel does not pin its compiler parts (cicc in nvvm, crt headers): pin them all,
    # or pip pairs nvcc 13.0 with a newer nvvm whose PTX the 13.0 ptxas rejects.
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
        "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
        "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
fi

cargo build -p distspmm-cuda --features cuda
[ "${1:-}" = "--build-only" ] && exit 0
cargo clippy -p distspmm-cuda --features cuda --all-targets -- -D warnings
cargo test -p distspmm-cuda --features cuda
cargo test -p distspmm-cuda --features cuda --test gpu ptxas_report -- --nocapture
cargo clippy -p dist-comm --features nccl --all-targets -- -D warnings
cargo clippy -p distspmm-op --features cuda --all-targets -- -D warnings
cargo test -p distspmm-op --features cuda --lib --test gpu_spmm
cargo clippy -p distspmm-capi --features cuda --all-targets -- -D warnings
cargo test -p distspmm-capi --features cuda --lib
