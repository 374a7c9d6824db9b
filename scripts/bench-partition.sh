#!/usr/bin/env bash
# Compares `distspmm partition` with Debian's gpmetis (apt package `metis`) on the very same graph:
#  1. edge cut and balance on Cora at P = 2, 4, 8 (same seed, same ufactor);
#  2. wall time and peak memory of the whole pipeline (load .npz + normalise + METIS + write
#     chunks) against gpmetis alone, on RMAT graphs at P = 4.
# The symmetrised graph gpmetis reads is written by `distspmm partition --write-metis-graph`.
#
# Usage: scripts/bench-partition.sh [SCALE...]     (default scales: 18 20; REPS=3 runs each;
#        DISTSPMM_BIN=path uses that binary instead of building the release one)
# Needs: gpmetis, /usr/bin/time, ../shared/datasets/cora.npz (Cora part skipped without it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

REPS="${REPS:-3}"
SCALES=("$@")
[ "${#SCALES[@]}" -gt 0 ] || SCALES=(18 20)
command -v gpmetis >/dev/null || { echo "error: gpmetis not found (apt-get install metis)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }

if [ -n "${DISTSPMM_BIN:-}" ]; then
  BIN="$DISTSPMM_BIN"
else
  cargo build -q --release -p distspmm-cli
  BIN="${CARGO_TARGET_DIR:-target}/release/distspmm"
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# gpmetis's edge cut and balance from its report.
gp_cut() { sed -n 's/.*Edgecut: *\([0-9]*\),.*/\1/p' "$1"; }
gp_balance() { sed -n 's/.*constraint #0: *\([0-9.]*\) .*/\1/p' "$1"; }
calc() { python3 -c "print($1)"; }
json_field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

CORA=../shared/datasets/cora.npz
if [ -f "$CORA" ]; then
  echo "## Cora: edge cut and balance (seed 1, ufactor 30)"
  echo "| P | distspmm edge cut | gpmetis edge cut | distspmm max imbalance | gpmetis balance |"
  echo "|---|---|---|---|---|"
  for P in 2 4 8; do
    line=$("$BIN" partition --input "$CORA" --parts "$P" --out "$WORK/cora-$P" \
      --write-metis-graph "$WORK/cora.graph" --method metis --seed 1 --imbalance 1.03 --json)
    gpmetis -seed=1 -ufactor=30 "$WORK/cora.graph" "$P" >"$WORK/gp-cora-$P.txt"
    printf '| %s | %s | %s | %.3f | %s |\n' "$P" "$(echo "$line" | json_field edge_cut)" \
      "$(gp_cut "$WORK/gp-cora-$P.txt")" "$(echo "$line" | json_field max_imbalance)" \
      "$(gp_balance "$WORK/gp-cora-$P.txt")"
  done
else
  echo "skipping Cora: $CORA not found"
fi

for S in "${SCALES[@]}"; do
  G="$WORK/rmat$S.npz"
  "$BIN" generate rmat --scale "$S" --edge-factor 16 --seed 1 --out "$G" --json >/dev/null
  # The METIS graph once (not timed), then alternate the two programs REPS times.
  "$BIN" partition --input "$G" --parts 4 --out "$WORK/r$S" --write-metis-graph "$WORK/rmat$S.graph" --method metis --json >/dev/null
  echo
  echo "## RMAT scale $S, P = 4 (load average before: $(cut -d' ' -f1 /proc/loadavg))"
  echo "| run | gpmetis wall s | gpmetis CPU s (METIS) | gpmetis peak MiB | distspmm wall s | distspmm CPU s | distspmm peak MiB | wall ratio | edge cut (distspmm / gpmetis) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in $(seq "$REPS"); do
    /usr/bin/time -f "%e %M %U %S" -o "$WORK/gp.time" gpmetis -seed=1 -ufactor=30 "$WORK/rmat$S.graph" 4 >"$WORK/gp.txt"
    /usr/bin/time -f "%e %M %U %S" -o "$WORK/ours.time" "$BIN" partition --input "$G" --parts 4 \
      --out "$WORK/r$S" --method metis --seed 1 --json >"$WORK/ours.json"
    read -r gw gm gu gs <"$WORK/gp.time"
    read -r ow om ou os <"$WORK/ours.time"
    gcpu=$(sed -n 's/.*Partitioning:[[:space:]]*\([0-9.]*\) sec.*/\1/p' "$WORK/gp.txt")
    ocut=$(json_field edge_cut <"$WORK/ours.json")
    gcut=$(gp_cut "$WORK/gp.txt")
    printf '| %s | %s | %.2f (%s) | %d | %s | %.2f | %d | %.2f | %s / %s |\n' "$r" "$gw" \
      "$(calc "$gu + $gs")" "$gcpu" $((gm / 1024)) "$ow" "$(calc "$ou + $os")" \
      $((om / 1024)) "$(calc "$ow / $gw")" "$ocut" "$gcut"
  done
done
