#!/usr/bin/env bash
# The main job end to end on the built-in default graph:
#   generate a contextual stochastic block model graph → partition it (KaMinPar) into 2 chunks →
#   mpirun -n 2 distspmm train (2-layer GCN, halo schedule) → prints the accuracy.
# Installs what it needs on a fresh Debian machine (see scripts/ensure-deps.sh).
#   RANKS=4 EPOCHS=100 ./scripts/quickstart.sh   to change the defaults
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/ensure-deps.sh
source scripts/ensure-deps.sh

RANKS="${RANKS:-2}"
EPOCHS="${EPOCHS:-200}"
WORK="${WORK:-run/quickstart}"
mkdir -p "$WORK"

echo "==> building distspmm (release)"
cargo build --release -q -p distspmm-cli
BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/distspmm"

echo "==> generating the default CSBM graph"
"$BIN" generate csbm --seed 7 --out "$WORK/csbm.npz" --force

echo "==> partitioning into $RANKS parts with KaMinPar"
"$BIN" partition --input "$WORK/csbm.npz" --parts "$RANKS" --out "$WORK/chunks" --force

# Share the cores between the ranks: each rank's kernels use this many threads.
THREADS=$(( $(nproc) / RANKS )); [ "$THREADS" -ge 1 ] || THREADS=1

echo "==> training a 2-layer GCN on $RANKS MPI ranks ($THREADS thread(s) each)"
mpirun -n "$RANKS" --oversubscribe --bind-to none -x RAYON_NUM_THREADS="$THREADS" \
  "$BIN" train --chunks "$WORK/chunks" --epochs "$EPOCHS"
