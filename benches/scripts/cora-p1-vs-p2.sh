#!/usr/bin/env bash
# Cora, P = 1 with 2 threads against P = 2 with 1 thread each, interleaved rounds, each run
# under the benchmark lock, with the load average before it. Same configurations as
# benches/peers/compare_train.py (200 epochs, hidden 16; --bind-to none, btl self,vader).
# Usage: benches/scripts/cora-p1-vs-p2.sh [ROUNDS] [BIN...]   (default 5 rounds, target/release/distspmm)
set -euo pipefail
rounds=${1:-5}; shift || true
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(target/release/distspmm)
cora=${CORA:-../shared/datasets/cora.npz}
W=${W:-/tmp/cora-p1-vs-p2}
mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for p in 1 2; do
  [ -d "$W/cora-p$p" ] || "${bins[0]}" partition --input "$cora" --parts "$p" --out "$W/cora-p$p" --force >/dev/null
done
field() { python3 -c "import json,sys; d=json.loads([l for l in sys.stdin if l.startswith('{')][-1]); print(' '.join(str(round(d[k]*1e3,3)) if k.endswith('seconds') or k.endswith('median') else str(d[k]) for k in sys.argv[1:]))" "$@"; }
keys=(epoch_seconds_median spmm_seconds dense_seconds other_seconds comm_seconds final_loss test_acc)
echo "# round bin P threads load1 | epoch_ms spmm dense other comm | final_loss test_acc"
for r in $(seq 1 "$rounds"); do
  for bin in "${bins[@]}"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$(flock /tmp/bench.lock env RAYON_NUM_THREADS=2 "$bin" train --chunks "$W/cora-p1" --epochs 200 --hidden 16 --json 2>/dev/null | field "${keys[@]}")
    echo "$r $bin 1 2 $load | $out"
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$(flock /tmp/bench.lock mpirun -n 2 --oversubscribe --bind-to none --mca btl self,vader -x RAYON_NUM_THREADS=1 \
      "$bin" train --chunks "$W/cora-p2" --epochs 200 --hidden 16 --json 2>/dev/null | field "${keys[@]}")
    echo "$r $bin 2 1 $load | $out"
  done
done
