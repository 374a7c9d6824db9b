#!/usr/bin/env bash
# `distspmm partition` with --method kaminpar against --method metis, whole runs side by side
# (load, partition, normalise, halo lists, build and write the chunks), and Cora's edge cut at
# P = 2, 4, 8 against gpmetis's. One JSON line per run.
#   benches/partition-methods.sh [SCALE (default 22)] [PARTS (default 4)] [WORKDIR]
# REPS=n alternates the two methods n times (default 1); BIN overrides the binary. Cora is
# skipped without ../shared/datasets/cora.npz or gpmetis (apt-get install metis).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SCALE="${1:-22}"
PARTS="${2:-4}"
W="${3:-run/partition-methods}"
BIN="${BIN:-target/release/distspmm}"
REPS="${REPS:-1}"
mkdir -p "$W"

# run LABEL CMD...: the command's JSON line plus its label, wall seconds and peak RSS.
run() {
  local label="$1"; shift
  /usr/bin/time -f "%e %M" -o "$W/time" "$@" >"$W/out.json"
  read -r wall kib <"$W/time"
  python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); d.update(run=sys.argv[2], wall_seconds=float(sys.argv[3]), time_peak_rss_bytes=int(sys.argv[4])*1024, load_average=float(open("/proc/loadavg").read().split()[0])); print(json.dumps(d))' \
    "$W/out.json" "$label" "$wall" "$kib"
}

CORA=../shared/datasets/cora.npz
if [ -f "$CORA" ] && command -v gpmetis >/dev/null; then
  for P in 2 4 8; do
    run "cora-p$P-default" "$BIN" partition --input "$CORA" --parts "$P" --out "$W/cora-$P" \
      --write-metis-graph "$W/cora.graph" --force --json
    gpmetis -seed=1 -ufactor=30 "$W/cora.graph" "$P" >"$W/gp.txt"
    python3 -c 'import json,re,sys; t=open(sys.argv[1]).read(); print(json.dumps({"run": "cora-p"+sys.argv[2]+"-gpmetis", "edge_cut": int(re.search(r"Edgecut:\s*(\d+)", t).group(1)), "balance": float(re.search(r"constraint #0:\s*([0-9.]+)", t).group(1))}))' "$W/gp.txt" "$P"
  done
fi

G="$W/rmat$SCALE.npz"
[ -f "$G" ] || "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 --out "$G" --json >/dev/null
for r in $(seq "$REPS"); do
  for m in kaminpar metis; do
    run "rmat$SCALE-p$PARTS-$m-$r" "$BIN" partition --input "$G" --parts "$PARTS" --out "$W/rmat$SCALE-$m" \
      --method "$m" --seed 1 --force --json
  done
done
