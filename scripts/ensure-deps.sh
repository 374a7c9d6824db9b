#!/usr/bin/env bash
# Installs what distspmm needs on a fresh Debian machine, skipping what is already there.
# Sourced by scripts/quickstart.sh and scripts/test.sh; safe to run on its own.
#   DISTSPMM_PY_EXTRAS=1   also install the Python wheels the tests use (numpy, scipy, mpi4py, jittor,
#                          torch, torch_geometric) into the repository's .venv, once: later runs
#                          find them there. PyPI's Linux torch wheel is the CUDA build and pulls
#                          the nvidia-* wheels (5.4 GB of .venv for torch and torch_geometric;
#                          3 min 6 s to install into an empty venv here, docs/pytorch.md); PyPI
#                          has no CPU-only torch. No pip cache: the venv is the cache.
set -euo pipefail

# libptscotch-dev: PT-Scotch 7 with its 64-bit build (scotch-int64/), which distspmm-ptscotch links.
APT_PACKAGES=(libopenmpi-dev openmpi-bin libmetis-dev libtbb-dev libclang-dev clang pkg-config cmake g++ python3-venv libptscotch-dev)

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing Debian packages: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust (https://rustup.rs) and re-run" >&2
  exit 1
fi

# OpenMPI refuses to run as root unless told; our scripts and tests run as root in containers.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/.venv"
if [ "${DISTSPMM_PY_EXTRAS:-0}" = 1 ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  wheels=(numpy scipy mpi4py jittor torch torch_geometric)
  need=()
  for w in "${wheels[@]}"; do
    "$VENV/bin/python" -m pip show -q "$w" >/dev/null 2>&1 || need+=("$w")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    echo "==> installing Python wheels into .venv: ${need[*]}"
    "$VENV/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check "${need[@]}"
  fi
  export PATH="$VENV/bin:$PATH"
  # Jittor compiles its core on the first import (minutes, cached in ~/.cache/jittor): do it
  # here rather than inside a test's timeout. use_mkl=0 keeps it from downloading oneDNN.
  export use_mkl=0
  use_mkl=0 log_silent=1 "$VENV/bin/python" -c "import jittor" >/dev/null
fi
