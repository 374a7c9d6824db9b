#!/usr/bin/env bash
# Side by side: distspmm's CPU SpMM against Intel MKL's inspector-executor sparse x dense
# product (benches/peers/mkl_spmm.c: handle created once, mm hint + optimize before timing,
# preallocated row-major X and Y) on GCN-normalised RMAT graphs:
#   CSR  Y = Â·X   on the symmetrised RMAT (distspmm CSR kernel vs MKL non-transposed);
#   CSC  Y = Âᵀ·X  on a *directed* RMAT (`generate rmat --directed`), whose Â is not symmetric,
#        so its CSC arrays differ from its CSR arrays (on a symmetric Â the CSC kernel would
#        read the CSR arrays again); distspmm's CSC kernel vs the faster of MKL's two ways
#        (transpose op on A's handle, or the CSR of Âᵀ).
#
#   benches/peers/compare_spmm.sh                   # SCALE=18 THREADS=2 REPS=10 ROUNDS=3
# The MKL peer needs the PyPI wheels mkl, mkl-include, numpy and scipy: without PYTHON, the
# script installs whichever are missing into the repository's .venv and uses that python.
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
if [ -z "${PYTHON:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  PYTHON=.venv/bin/python
  need=()
  for w in mkl mkl-include numpy scipy; do
    "$PYTHON" -m pip show -q "$w" >/dev/null 2>&1 || need+=("$w")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    echo "==> installing the MKL peer's wheels into .venv: ${need[*]}" >&2
    "$PYTHON" -m pip install -q --no-cache-dir --disable-pip-version-check "${need[@]}"
  fi
fi
OUT=${OUT:-target/peers}
BIN=${DISTSPMM:-target/release/distspmm}

mkdir -p "$OUT"
if [ -z "${DISTSPMM:-}" ]; then
  cargo build --release --quiet -p distspmm-cli
fi
GRAPH=$OUT/rmat$SCALE.npz
DIRECTED=$OUT/rmat$SCALE-directed.npz
[ -f "$GRAPH" ] || "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 --out "$GRAPH"
[ -f "$DIRECTED" ] || "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 --directed --out "$DIRECTED"
LOG=$OUT/compare_spmm.jsonl
: >"$LOG"
for round in $(seq "$ROUNDS"); do
  for f in $FEATURES; do
    echo "round $round/$ROUNDS, F=$f" >&2
    "$PYTHON" benches/peers/mkl_spmm.py --input "$GRAPH" --features "$f" --threads "$THREADS" \
      --reps "$REPS" --build-dir "$OUT" >>"$LOG"
    "$BIN" bench spmm --input "$GRAPH" --features "$f" --threads "$THREADS" --reps "$REPS" \
      --json >>"$LOG"
    "$PYTHON" benches/peers/mkl_spmm.py --input "$DIRECTED" --features "$f" --threads "$THREADS" \
      --reps "$REPS" --build-dir "$OUT" --transpose >>"$LOG"
    "$BIN" bench spmm --input "$DIRECTED" --features "$f" --threads "$THREADS" --reps "$REPS" \
      --transpose --json >>"$LOG"
  done
done

"$PYTHON" - "$LOG" "$SCALE" "$THREADS" <<'PY'
import json, statistics, sys
log, scale, threads = sys.argv[1], sys.argv[2], sys.argv[3]
runs, shape = {}, {}
for line in open(log):
    r = json.loads(line)
    if r.get("library") == "mkl":
        kind = "mkl_" + r["method"]
    else:
        kind = "csc" if r["transpose"] else "csr"
    runs.setdefault((kind, r["features"]), []).append(r["gflops"])
    shape["directed" if kind in ("csc", "mkl_transpose-op", "mkl_csr-of-transpose") else "sym"] = (r["nodes"], r["nnz"])
rounds = len(next(iter(runs.values())))
print(f"RMAT scale {scale} (edge factor 16, seed 1), GCN-normalised, {threads} threads: symmetrised "
      f"{shape['sym'][0]} nodes / {shape['sym'][1]} non-zeros (CSR rows), directed "
      f"{shape['directed'][0]} nodes / {shape['directed'][1]} non-zeros (CSC rows). GFLOP/s = "
      f"2·nnz·F / median time; best of {rounds} rounds [median round].")
print()
print("| F | MKL A·X | distspmm CSR | CSR / MKL | MKL Aᵀ·X transpose-op | MKL CSR of Aᵀ | distspmm CSC (Âᵀ·X) | CSC / best MKL |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for f in sorted({f for _, f in runs}):
    k = ("mkl_csr", "csr", "mkl_transpose-op", "mkl_csr-of-transpose", "csc")
    best = {x: max(runs[(x, f)]) for x in k}
    med = {x: statistics.median(runs[(x, f)]) for x in k}
    bt = max(best["mkl_transpose-op"], best["mkl_csr-of-transpose"])
    mt = max(med["mkl_transpose-op"], med["mkl_csr-of-transpose"])
    print(f"| {f} | {best['mkl_csr']:.1f} [{med['mkl_csr']:.1f}] | {best['csr']:.1f} [{med['csr']:.1f}] "
          f"| {best['csr'] / best['mkl_csr']:.2f}× [{med['csr'] / med['mkl_csr']:.2f}×] "
          f"| {best['mkl_transpose-op']:.1f} [{med['mkl_transpose-op']:.1f}] "
          f"| {best['mkl_csr-of-transpose']:.1f} [{med['mkl_csr-of-transpose']:.1f}] "
          f"| {best['csc']:.1f} [{med['csc']:.1f}] "
          f"| {best['csc'] / bt:.2f}× [{med['csc'] / mt:.2f}×] |")
PY
