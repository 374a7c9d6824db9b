#!/usr/bin/env bash
# Two release binaries of distspmm side by side on the operator benchmarks: `bench spmm`
# (RMAT-17, F = 64, 2 threads) and `bench dist` (Cora in 2 parts, F = 64, halo and broadcast,
# 2 ranks × 1 thread), in interleaved rounds (old, new, old, new, …), one JSON line each.
#
# Usage: benches/scripts/side-by-side-ops.sh OLD_BINARY NEW_BINARY [ROUNDS=3] [DATA_DIR=target/side-by-side]
# Run it under `flock /tmp/bench.lock` on a shared machine; the load average is printed.
set -euo pipefail
OLD=${1:?old binary}; NEW=${2:?new binary}; rounds=${3:-3}
D=${4:-target/side-by-side}; mkdir -p "$D"
cora=${CORA:-$(dirname "$0")/../../../shared/datasets/cora.npz}
[ -f "$D/r17.npz" ] || "$OLD" generate rmat --scale 17 --out "$D/r17.npz" >/dev/null
[ -d "$D/cora2" ] || "$OLD" partition --input "$cora" --parts 2 --out "$D/cora2" --force >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "load at start: $(cat /proc/loadavg)"
for round in $(seq "$rounds"); do
  for b in OLD NEW; do
    bin=${!b}
    echo "$b round $round spmm $(RAYON_NUM_THREADS=2 "$bin" bench spmm --input "$D/r17.npz" --features 64 --json | tail -1)"
    for s in halo broadcast; do
      echo "$b round $round dist-$s $(mpirun -n 2 --oversubscribe --mca btl self,vader -x RAYON_NUM_THREADS=1 "$bin" bench dist --chunks "$D/cora2" --features 64 --schedule "$s" --reps 200 --json 2>/dev/null | grep '^{' | tail -1)"
    done
  done
done
echo "load at end: $(cat /proc/loadavg)"
