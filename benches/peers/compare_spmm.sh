#!/usr/bin/env bash
# Side by side: distspmm's CPU SpMM (CSR Â·X and CSC Âᵀ·X) against Intel MKL's sparse × dense
# product (sparse_dot_mkl → mkl_sparse_s_mm, CSR) on the same GCN-normalised RMAT graph.
#
#   pip install mkl sparse_dot_mkl scipy numpy      # into the python that PYTHON names
#   benches/peers/compare_spmm.sh                   # SCALE=18 THREADS=2 REPS=10 ROUNDS=3
#
# Every (F, library) run loads the graph itself and reports the median of REPS timed
# repetitions after a warm-up; the runs are interleaved ROUNDS times so that both sides see the
# same machine, and the table shows the best round of each (the least disturbed), with the
# median round in brackets. Raw JSON lines go to $OUT/compare_spmm.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."

SCALE=${SCALE:-18}
THREADS=${THREADS:-2}
REPS=${REPS:-10}
ROUNDS=${ROUNDS:-3}
FEATURES=${FEATURES:-"16 64 256"}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-target/peers}
BIN=${DISTSPMM:-target/release/distspmm}

mkdir -p "$OUT"
if [ -z "${DISTSPMM:-}" ]; then
  cargo build --release --quiet -p distspmm-cli
fi
GRAPH=$OUT/rmat$SCALE.npz
if [ ! -f "$GRAPH" ]; then
  "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 --out "$GRAPH"
fi
LOG=$OUT/compare_spmm.jsonl
: >"$LOG"
for round in $(seq "$ROUNDS"); do
  for f in $FEATURES; do
    echo "round $round/$ROUNDS, F=$f" >&2
    "$PYTHON" benches/peers/mkl_spmm.py --input "$GRAPH" --features "$f" --threads "$THREADS" \
      --reps "$REPS" >>"$LOG"
    "$BIN" bench spmm --input "$GRAPH" --features "$f" --threads "$THREADS" --reps "$REPS" \
      --json >>"$LOG"
    "$BIN" bench spmm --input "$GRAPH" --features "$f" --threads "$THREADS" --reps "$REPS" \
      --transpose --json >>"$LOG"
  done
done

"$PYTHON" - "$LOG" "$SCALE" "$THREADS" <<'PY'
import json, statistics, sys
log, scale, threads = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for line in open(log):
    r = json.loads(line)
    kind = "mkl" if r.get("library") == "mkl" else ("csc" if r["transpose"] else "csr")
    runs.setdefault((kind, r["features"]), []).append(r["gflops"])
first = next(iter(json.loads(l) for l in open(log)))
print(f"RMAT scale {scale} (edge factor 16, seed 1), GCN-normalised: {first['nodes']} nodes, "
      f"{first['nnz']} non-zeros, {threads} threads. GFLOP/s = 2·nnz·F / median time; "
      f"best of {len(runs[('mkl', first['features'])])} rounds [median round].")
print()
print("| F | MKL CSR | distspmm CSR | CSR / MKL | distspmm CSC (Âᵀ·X) | CSC / MKL |")
print("|---:|---:|---:|---:|---:|---:|")
for f in sorted({f for _, f in runs}):
    best = {k: max(runs[(k, f)]) for k in ("mkl", "csr", "csc")}
    med = {k: statistics.median(runs[(k, f)]) for k in ("mkl", "csr", "csc")}
    print(f"| {f} | {best['mkl']:.1f} [{med['mkl']:.1f}] | {best['csr']:.1f} [{med['csr']:.1f}] "
          f"| {best['csr'] / best['mkl']:.2f}× [{med['csr'] / med['mkl']:.2f}×] "
          f"| {best['csc']:.1f} [{med['csc']:.1f}] "
          f"| {best['csc'] / best['mkl']:.2f}× [{med['csc'] / med['mkl']:.2f}×] |")
PY
