#!/usr/bin/env bash
# Side by side: `distspmm train --model sage|gin|gat` (data mode, P = 1) against the PyTorch
# Geometric peer (pyg_models.py: the same 2-layer models and hyperparameters) on one graph,
# both with the same threads; prints epoch times, peak memory, test accuracy and the ratios.
#
# Hyperparameters (the reference configurations of the models' issue):
#   sage, gin  hidden 64, dropout 0.5, lr 0.01, weight decay 5e-4 on every parameter
#   gat        8 heads × 8 hidden then 1 head (mean), dropout 0.6, attention dropout 0.6,
#              lr 0.005, weight decay 5e-4 on every parameter
# PyG runs both of its paths (edge_index and sparse CSR), each in a fresh process; the faster
# is the peer. Peak memory: PyG's `ru_maxrss` per path (pyg_models.py), distspmm's maximum
# resident set from /usr/bin/time (the train process alone; the partition runs before it).
# Epoch time: the median epoch (one training step plus one evaluation forward), the first
# epoch excluded on both sides.
#
# Raw JSON lines (with the 1-minute load average at each run's end) go to OUT/compare_models.jsonl
# and the table to OUT/compare_models.txt; with --record both are also copied to
# benches/peers/results/compare_models-GRAPH-<UTC time>.{jsonl,txt}.
#
#     .venv/bin/pip install torch torch_geometric numpy
#     cargo build --release -p distspmm-cli
#     flock /tmp/bench.lock benches/peers/compare_models.sh --graph rmat18 --record
#
# Options: --graph cora|rmat18|FILE.npz (default rmat18: RMAT scale 18, edge factor 16, 64
# random features, 8 classes), --models "sage gin gat", --epochs N (default 5 on RMAT-18, 200
# otherwise), --epochs-gat N (default 3 on RMAT-18, else --epochs), --threads T (default 2),
# --seed S (default 0), --paths "edge_index csr", --bin BIN, --python PY, --out DIR, --record.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$ROOT/target/release/distspmm
PY=$ROOT/.venv/bin/python
OUT=$ROOT/target/peers/models
GRAPH=rmat18
MODELS="sage gin gat"
EPOCHS=
EPOCHS_GAT=
THREADS=2
SEED=0
PATHS="edge_index csr"
RECORD=0

die() { echo "compare_models.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case $1 in
    --graph) GRAPH=${2:?--graph needs a value}; shift 2 ;;
    --models) MODELS=${2:?--models needs a value}; shift 2 ;;
    --epochs) EPOCHS=${2:?--epochs needs a value}; shift 2 ;;
    --epochs-gat) EPOCHS_GAT=${2:?--epochs-gat needs a value}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a value}; shift 2 ;;
    --seed) SEED=${2:?--seed needs a value}; shift 2 ;;
    --paths) PATHS=${2:?--paths needs a value}; shift 2 ;;
    --bin) BIN=${2:?--bin needs a value}; shift 2 ;;
    --python) PY=${2:?--python needs a value}; shift 2 ;;
    --out) OUT=${2:?--out needs a value}; shift 2 ;;
    --record) RECORD=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

for m in $MODELS; do
  case $m in sage|gin|gat) ;; *) die "--models takes sage, gin and gat, not $m" ;; esac
done
[ -x "$BIN" ] || die "$BIN not found: cargo build --release -p distspmm-cli"
# The help is read whole first: `grep -q` stops reading at its match, and under pipefail the
# writer's broken pipe would fail the check.
help_text=$("$BIN" train --help 2>&1 || true)
grep -q -- '--model' <<<"$help_text" ||
  die "$BIN train has no --model: rebuild it (cargo build --release -p distspmm-cli)"
[ -x "$PY" ] || die "$PY not found: python3 -m venv .venv && .venv/bin/pip install torch torch_geometric numpy"
[ -x /usr/bin/time ] || die "/usr/bin/time not found (it measures distspmm's peak memory): apt-get install time"

mkdir -p "$OUT"
case $GRAPH in
  cora)
    FILE=$ROOT/../shared/datasets/cora.npz
    : "${EPOCHS:=200}" ;;
  rmat18)
    FILE=$OUT/rmat18.npz
    "$BIN" generate rmat --scale 18 --edge-factor 16 --seed 1 --features 64 --classes 8 \
      --out "$FILE" --force >/dev/null
    : "${EPOCHS:=5}" "${EPOCHS_GAT:=3}" ;;
  *.npz)
    FILE=$GRAPH
    GRAPH=$(basename "$GRAPH" .npz)
    : "${EPOCHS:=200}" ;;
  *) die "--graph takes cora, rmat18 or a .npz file, not $GRAPH" ;;
esac
[ -f "$FILE" ] || die "$FILE not found"
: "${EPOCHS_GAT:=$EPOCHS}"

CHUNKS=$OUT/$GRAPH-p1
"$BIN" partition --input "$FILE" --parts 1 --out "$CHUNKS" --force >/dev/null

CPU=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
STAMP=$(date -u +%Y-%m-%dT%H%MZ)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
LOG=$OUT/compare_models.jsonl
: > "$LOG"

# Appends a line's context (graph, CPU, commit, load average now) to one JSON object.
tag() {
  "$PY" -c 'import json, sys
extra = json.loads(sys.argv[1])
for line in sys.stdin:
    if line.startswith("{"):
        d = json.loads(line)
        d.update(extra, loadavg=float(open("/proc/loadavg").read().split()[0]))
        print(json.dumps(d))' "$1"
}

for m in $MODELS; do
  if [ "$m" = gat ]; then
    hp=(--hidden 8 --lr 0.005 --dropout 0.6 --weight-decay 5e-4)
    ours_hp=("${hp[@]}" --heads 8 --attn-dropout 0.6)
    pyg_hp=("${hp[@]}" --heads 8 --attn-dropout 0.6)
    epochs=$EPOCHS_GAT
  else
    hp=(--hidden 64 --lr 0.01 --dropout 0.5 --weight-decay 5e-4)
    ours_hp=("${hp[@]}")
    pyg_hp=("${hp[@]}")
    epochs=$EPOCHS
  fi
  extra="{\"graph\": \"$GRAPH\", \"cpu\": \"$CPU\", \"commit\": \"$COMMIT\"}"
  echo "$GRAPH $m: distspmm" >&2
  rss=$(mktemp)
  out=$(env RAYON_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" /usr/bin/time -f %M -o "$rss" \
    "$BIN" train --chunks "$CHUNKS" --model "$m" "${ours_hp[@]}" --epochs "$epochs" \
    --seed "$SEED" --json 2>"$OUT/stderr-distspmm-$m.txt") ||
    die "distspmm train --model $m failed: see $OUT/stderr-distspmm-$m.txt"
  kb=$(tail -n 1 "$rss")
  rm -f "$rss"
  echo "$out" | grep '^{' | tail -n 1 |
    tag "${extra%\}}, \"library\": \"distspmm\", \"model\": \"$m\", \"P\": 1, \"threads\": $THREADS, \"seed\": $SEED, \"peak_rss_bytes\": $((kb * 1024))}" >> "$LOG"
  echo "$GRAPH $m: pyg ($PATHS)" >&2
  # shellcheck disable=SC2086  # PATHS is a list of words
  "$PY" "$ROOT/benches/peers/pyg_models.py" --model "$m" --input "$FILE" "${pyg_hp[@]}" \
    --epochs "$epochs" --threads "$THREADS" --seed "$SEED" --paths $PATHS 2>"$OUT/stderr-pyg-$m.txt" |
    tag "$extra" >> "$LOG" || die "pyg_models.py --model $m failed: see $OUT/stderr-pyg-$m.txt"
done

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" - "$LOG" "$OUT/compare_models.txt" <<EOF
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
lines = [
    "Measured $STAMP, commit $COMMIT, CPU $CPU, $THREADS threads, graph $GRAPH, seed $SEED; "
    "load average (1 / 5 / 15 min) at the start $LOAD_START, at the end $LOAD_END.",
    "Median epoch in seconds; peak resident memory in GB; PyG's peer is its faster path.",
    "",
    "| model | epochs | PyG edge_index s | PyG CSR s | distspmm P=1 s | PyG best / distspmm "
    "| PyG peak GB | distspmm peak GB | distspmm / PyG peak | test acc PyG / distspmm |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]
for m in "$MODELS".split():
    ours = [r for r in rows if r["library"] == "distspmm" and r["model"] == m]
    pyg = {r["path"]: r for r in rows if r["library"] == "pyg" and r["model"] == m}
    if not ours or not pyg:
        continue
    o = ours[0]
    best = min(pyg.values(), key=lambda r: r["epoch_seconds_median"])
    sec = lambda p: f"{pyg[p]['epoch_seconds_median']:.3f}" if p in pyg else "—"
    lines.append(
        f"| {m} | {o['epochs']} | {sec('edge_index')} | {sec('csr')} | {o['epoch_seconds_median']:.3f} "
        f"| **{best['epoch_seconds_median'] / o['epoch_seconds_median']:.1f}×** "
        f"| {best['peak_rss_bytes'] / 1e9:.2f} | {o['peak_rss_bytes'] / 1e9:.2f} "
        f"| {o['peak_rss_bytes'] / best['peak_rss_bytes']:.2f} "
        f"| {best['test_acc']:.3f} / {o['test_acc']:.3f} |")
text = "\n".join(lines)
print(text)
open(sys.argv[2], "w").write(text + "\n")
EOF

if [ "$RECORD" = 1 ]; then
  dest=$ROOT/benches/peers/results/compare_models-$GRAPH-$STAMP
  cp "$LOG" "$dest.jsonl"
  cp "$OUT/compare_models.txt" "$dest.txt"
  echo "recorded $dest.jsonl and $dest.txt" >&2
fi
