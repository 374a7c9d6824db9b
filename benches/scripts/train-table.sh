#!/usr/bin/env bash
# Epoch time and bytes per epoch of `distspmm train` for P = 1, 2, 4 and both schedules, on the
# CSBM default graph (200 epochs) and on RMAT-18 with 64 random features and 8 random classes
# (EPOCHS_RMAT epochs, default 20). Prints one tab-separated row per run.
#   benches/scripts/train-table.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
W="${1:-run/train-table}"; mkdir -p "$W"
BIN="${BIN:-target/release/distspmm}"
EPOCHS_RMAT="${EPOCHS_RMAT:-20}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$BIN" generate csbm --seed 7 --out "$W/csbm.npz" --force >/dev/null
"$BIN" generate rmat --scale 18 --edge-factor 16 --seed 1 --features 64 --classes 8 --out "$W/rmat18.npz" --force >/dev/null
printf 'graph\tP\tschedule\tepochs\tepoch_ms_median\tcomm_MB_per_epoch\ttest_acc\n'
for g in csbm rmat18; do
  epochs=200; [ "$g" = rmat18 ] && epochs="$EPOCHS_RMAT"
  for p in 1 2 4; do
    "$BIN" partition --input "$W/$g.npz" --parts "$p" --out "$W/$g-p$p" --force >/dev/null
    threads=$(( $(nproc) / p )); [ "$threads" -ge 1 ] || threads=1
    for s in halo broadcast; do
      [ "$p" = 1 ] && [ "$s" = broadcast ] && continue
      line=$(mpirun -n "$p" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -x RAYON_NUM_THREADS="$threads" \
        "$BIN" train --chunks "$W/$g-p$p" --epochs "$epochs" --schedule "$s" --json 2>/dev/null | tail -1)
      python3 - "$g" "$p" "$s" "$line" <<'PY'
import json, sys
g, p, s, line = sys.argv[1:]
d = json.loads(line)
print(f"{g}\t{p}\t{s}\t{d['epochs']}\t{d['epoch_seconds_median']*1e3:.1f}\t{d['comm_bytes_per_epoch']/1e6:.2f}\t{d['test_acc']:.3f}")
PY
    done
  done
done
