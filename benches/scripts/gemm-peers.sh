#!/usr/bin/env bash
# Side by side: the GCN's dense products on the RMAT-18 training shapes (N = ROWS rows; 64×64
# and 64×8 weights forward, the transposed products of the backward pass) through three GEMMs
# (benches/benches/gemm.rs): the trainer's own routines (`ours`: rayon row blocks, one
# single-threaded matrixmultiply call each), one matrixmultiply call over all rows with its
# `threading` feature, and one call of the `gemm` crate on the rayon pool.
#
#   flock /tmp/bench.lock benches/scripts/gemm-peers.sh      # THREADS=2 ROUNDS=3 REPS=7 ROWS=262144
#
# Every GEMM runs once per round at THREADS threads, the rounds interleaved so that all see the
# same machine; the table gives GFLOP/s (2·n·k·m / median of REPS calls) of the best round
# [median round]. A last run of each at 1 thread checks that its results are bit-identical
# whatever the thread count (FNV-1a hash of the output bits). Raw lines: $OUT/gemm-peers.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."

THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-7}
ROWS=${ROWS:-262144}
OUT=${OUT:-target/peers/gemm}
PYTHON=${PYTHON:-python3}
GEMMS="ours matrixmultiply-threaded gemm"

mkdir -p "$OUT"
bench() { # GEMM THREADS
  MATMUL_NUM_THREADS=$([ "$1" = matrixmultiply-threaded ] && echo "$2" || echo 1) \
    cargo bench -q -p distspmm-benches --features gemm-peers --bench gemm -- \
    --gemm "$1" --threads "$2" --rows "$ROWS" --reps "$REPS"
}
cargo bench -q -p distspmm-benches --features gemm-peers --bench gemm --no-run
LOG=$OUT/gemm-peers.jsonl
: >"$LOG"
echo "load average at the start: $(cat /proc/loadavg)" | tee "$OUT/load.txt" >&2
for round in $(seq "$ROUNDS"); do
  for g in $GEMMS; do
    echo "round $round/$ROUNDS: $g" >&2
    bench "$g" "$THREADS" | sed "s/}\$/, \"round\": $round}/" >>"$LOG"
  done
done
for g in $GEMMS; do
  bench "$g" 1 | sed 's/}$/, "round": 0}/' >>"$LOG"
done
echo "load average at the end: $(cat /proc/loadavg)" | tee -a "$OUT/load.txt" >&2

"$PYTHON" - "$LOG" "$THREADS" "$ROWS" <<'PY'
import json, statistics, sys
log, threads, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = [json.loads(l) for l in open(log)]
gemms = list(dict.fromkeys(r["gemm"] for r in runs))
products = list(dict.fromkeys(r["product"] for r in runs))
print(f"N = {rows} rows, {threads} threads; GFLOP/s of the best round [median round]; "
      "'same' = bit-identical results at 1 and at "
      f"{threads} threads.")
print()
print("| product | " + " | ".join(gemms) + " |")
print("|---|" + "---:|" * len(gemms))
total = {g: [0.0, 0.0] for g in gemms}
for p in products:
    cells = []
    for g in gemms:
        timed = [r for r in runs if r["gemm"] == g and r["product"] == p and r["round"] > 0]
        one = [r for r in runs if r["gemm"] == g and r["product"] == p and r["round"] == 0]
        best = min(r["seconds"] for r in timed)
        med = statistics.median(r["seconds"] for r in timed)
        total[g][0] += best
        total[g][1] += med
        same = "same" if one and all(r["hash"] == one[0]["hash"] for r in timed) else "DIFFERS"
        cells.append(f"{max(r['gflops'] for r in timed):.1f} "
                     f"[{statistics.median(r['gflops'] for r in timed):.1f}], {best * 1e3:.1f} ms, {same}")
    print(f"| {p} | " + " | ".join(cells) + " |")
print("| all five, ms | " + " | ".join(f"{total[g][0] * 1e3:.1f} [{total[g][1] * 1e3:.1f}]" for g in gemms) + " |")
PY
