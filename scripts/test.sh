#!/usr/bin/env bash
# All of distspmm's checks and tests: formatting, lints, no_std builds, unit + property tests,
# the MPI integration tests (real mpirun), the C ABI and its examples, the CUDA kernel build
# with the ptxas spill check (no GPU needed), and short fuzz runs.
# Installs what it needs on a fresh Debian machine (see scripts/ensure-deps.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export DISTSPMM_PY_EXTRAS=1
# shellcheck source=scripts/ensure-deps.sh
source scripts/ensure-deps.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# One full run gains nothing from incremental caches (gigabytes per feature set); keep the
# target directory within a CI machine's disk. Set CARGO_INCREMENTAL=1 to keep them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { echo; echo "==> $*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "no_std builds"
cargo build -q -p chunk-format --no-default-features
cargo build -q -p distspmm-sparse --no-default-features

step "the preprocessing without KaMinPar (METIS, contiguous, random only)"
cargo test -q -p distspmm-prep --no-default-features --lib partition

step "benchmarks compile and link (cargo bench --no-run, test profile: shares its dependencies with the tests)"
cargo bench -q --no-run -p distspmm-benches --profile test

step "cargo test --workspace (unit, property and mpirun integration tests)"
cargo test --workspace --no-fail-fast

step "CUDA kernels: nvcc build for sm_80/sm_90 + PTX, ptxas spill check, CUDA-feature tests (no GPU needed)"
distspmm-cuda/ci-check.sh

step "fuzz targets: build all, run each for a few seconds on its seed corpus"
cargo fuzz --version >/dev/null 2>&1 || cargo install --locked -q cargo-fuzz
fuzz/ci-smoke.sh 5
