#!/usr/bin/env bash
# Peak memory per rank of `distspmm predict` against a training run on the same chunks, side by
# side: generate an RMAT graph with random features, partition it into P parts, train a few
# epochs under `mpirun -n P` (writing a checkpoint), then predict every output at once
# (--logits --probabilities --labels --embeddings 1) from that checkpoint. Each rank's maximum
# resident set comes from /usr/bin/time (written per rank, by OMPI_COMM_WORLD_RANK); the table
# gives both peaks and their ratio per rank. Resident memory includes the chunk's mapped pages,
# which both commands read.
#
#     cargo build --release -p distspmm-cli
#     flock /tmp/bench.lock benches/predict_memory.sh            # RMAT-20, 64 features, P = 4
#
# Options: --scale S (default 20), --features F (default 64), --ranks P (default 4), --model M
# (default gcn), --epochs N (default 2), --threads T per rank (default 1), --bin BIN,
# --out DIR (default target/peers/predict-memory; the graph, chunks, checkpoint and outputs live
# there and are rewritten on every run).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/target/release/distspmm
OUT=$ROOT/target/peers/predict-memory
SCALE=20
FEATURES=64
RANKS=4
MODEL=gcn
EPOCHS=2
THREADS=1

die() { echo "predict_memory.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --scale) SCALE=$2; shift 2 ;;
    --features) FEATURES=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

[ -x "$BIN" ] || die "$BIN not found: cargo build --release -p distspmm-cli"
[ -x /usr/bin/time ] || die "/usr/bin/time not found (it measures the peak memory): apt-get install time"
command -v mpirun >/dev/null || die "mpirun not found: source scripts/ensure-deps.sh"
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RAYON_NUM_THREADS=$THREADS

GRAPH=$OUT/rmat$SCALE-f$FEATURES.npz
if [ ! -f "$GRAPH" ]; then
  "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 --features "$FEATURES" \
    --classes 8 --out "$GRAPH" >/dev/null
fi
"$BIN" partition --input "$GRAPH" --parts "$RANKS" --out "$OUT/chunks-p$RANKS" --force >/dev/null

# Runs `distspmm ARGS` on RANKS ranks, each under /usr/bin/time writing OUT/TAG-rank<r>.kb.
ranks_timed() {
  local tag=$1
  shift
  mpirun -n "$RANKS" --oversubscribe sh -c \
    '/usr/bin/time -f %M -o "$0-rank$OMPI_COMM_WORLD_RANK.kb" "$@"' "$OUT/$tag" "$BIN" "$@"
}

rm -rf "$OUT/checkpoint" "$OUT/predictions"
ranks_timed train train --chunks "$OUT/chunks-p$RANKS" --model "$MODEL" --epochs "$EPOCHS" \
  --checkpoint "$OUT/checkpoint" --json >"$OUT/train.json" 2>"$OUT/train.stderr" ||
  die "train failed: see $OUT/train.stderr"
ranks_timed predict predict --chunks "$OUT/chunks-p$RANKS" --checkpoint "$OUT/checkpoint" \
  --out "$OUT/predictions" --logits --probabilities --labels --embeddings 1 --json \
  >"$OUT/predict.json" 2>"$OUT/predict.stderr" || die "predict failed: see $OUT/predict.stderr"

echo "RMAT-$SCALE, $FEATURES features, $MODEL, P = $RANKS, $THREADS thread(s) per rank;" \
  "$(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| rank | train peak MiB | predict peak MiB | predict / train |"
echo "|---:|---:|---:|---:|"
worst=0
for ((r = 0; r < RANKS; r++)); do
  t=$(tail -n 1 "$OUT/train-rank$r.kb")
  p=$(tail -n 1 "$OUT/predict-rank$r.kb")
  ratio=$(awk -v p="$p" -v t="$t" 'BEGIN { printf "%.3f", p / t }')
  worst=$(awk -v a="$ratio" -v b="$worst" 'BEGIN { print (a > b) ? a : b }')
  echo "| $r | $((t / 1024)) | $((p / 1024)) | $ratio |"
done
echo "largest predict / train ratio over the ranks: $worst"
