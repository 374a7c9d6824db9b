#!/usr/bin/env bash
# Edge cut and partition time of the default method (`auto`) against `--method kaminpar` (the
# default before `auto`), `--method metis` and Debian's gpmetis on the same graph (the one
# `--write-metis-graph` writes, `-seed=S -ufactor=30`): 2-D meshes (benches/scripts/mesh.py),
# RMAT and Cora. One JSON line per run, with the load average at its start.
#   benches/partition-quality.sh [WORKDIR (default run/partition-quality)]
# Environment (an empty list skips): SEEDS (default "1 2 3"); REF_SEEDS, the seeds of the two
# METIS runs (default SEEDS; RMAT_REF_SEEDS, default "1", for RMAT, where they take minutes); MESHES ("512 1024"), MESH_PARTS ("2 8 32"); RMATS
# ("18 20"), RMAT_PARTS ("8 32"); CORA_PARTS ("2 4 8"); BIN (default target/release/distspmm).
# Needs gpmetis (apt-get install metis) and numpy in .venv; Cora is skipped without
# ../shared/datasets/cora.npz. Run it under `flock /tmp/bench.lock`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
W="${1:-run/partition-quality}"
BIN="${BIN:-target/release/distspmm}"
SEEDS="${SEEDS:-1 2 3}"
PY="${PY:-.venv/bin/python}"
mkdir -p "$W"

# ours GRAPH NAME P LABEL SEED [OPTIONS...]: one `partition --json` run, summarised.
ours() {
  local g="$1" name="$2" p="$3" label="$4" seed="$5"; shift 5
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  "$BIN" partition --input "$g" --parts "$p" --out "$W/chunks" --force --json --seed "$seed" "$@" \
    >"$W/out.json"
  python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(json.dumps({"graph": sys.argv[2], "parts": int(sys.argv[3]), "run": sys.argv[4], "seed": int(sys.argv[5]), "method": d["method"], "edge_cut": d["edge_cut"], "max_imbalance": round(d["max_imbalance"], 4), "partition_seconds": round(d["phase_seconds"]["partition"], 3), "seconds": round(d["seconds"], 3), "load_average": float(sys.argv[6])}))' \
    "$W/out.json" "$name" "$p" "$label" "$seed" "$load"
}

# gp GRAPHFILE NAME P SEED: gpmetis's cut and its own partitioning time.
gp() {
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  gpmetis -seed="$4" -ufactor=30 "$1" "$3" >"$W/gp.txt"
  python3 -c 'import json,re,sys; t=open(sys.argv[1]).read(); print(json.dumps({"graph": sys.argv[2], "parts": int(sys.argv[3]), "run": "gpmetis", "seed": int(sys.argv[4]), "edge_cut": int(re.search(r"Edgecut:\s*(\d+)", t).group(1)), "max_imbalance": float(re.search(r"constraint #0:\s*([0-9.]+)", t).group(1)), "partition_seconds": float(re.search(r"Partitioning:\s*([0-9.]+) sec", t).group(1)), "load_average": float(sys.argv[5])}))' \
    "$W/gp.txt" "$2" "$3" "$4" "$load"
}

# compare GRAPH NAME PARTS...: every method at every part count and seed.
compare() {
  local g="$1" name="$2"; shift 2
  "$BIN" partition --input "$g" --parts 1 --out "$W/chunks" --force --json \
    --write-metis-graph "$W/$name.graph" >/dev/null
  for p in "$@"; do
    for s in $SEEDS; do
      ours "$g" "$name" "$p" default "$s"
      ours "$g" "$name" "$p" kaminpar "$s" --method kaminpar
    done
    for s in ${REF_SEEDS-$SEEDS}; do
      ours "$g" "$name" "$p" metis "$s" --method metis
      gp "$W/$name.graph" "$name" "$p" "$s"
    done
  done
}

for m in ${MESHES-512 1024}; do
  [ -f "$W/mesh$m.npz" ] || "$PY" benches/scripts/mesh.py "$m" "$m" "$W/mesh$m.npz"
  compare "$W/mesh$m.npz" "mesh$m" ${MESH_PARTS-2 8 32}
done
CORA=../shared/datasets/cora.npz
if [ -f "$CORA" ]; then
  compare "$CORA" cora ${CORA_PARTS-2 4 8}
fi
for r in ${RMATS-18 20}; do
  [ -f "$W/rmat$r.npz" ] || "$BIN" generate rmat --scale "$r" --edge-factor 16 --seed 1 \
    --out "$W/rmat$r.npz" --json >/dev/null
  REF_SEEDS="${RMAT_REF_SEEDS-1}" compare "$W/rmat$r.npz" "rmat$r" ${RMAT_PARTS-8 32}
done
