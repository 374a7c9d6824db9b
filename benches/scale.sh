#!/usr/bin/env bash
# The billion-edge pipeline end to end on one machine: `generate rmat`, `partition --parts P`
# (KaMinPar), `inspect`, `plan --chunks`. Prints one JSON line per step with the step's own
# JSON output, its wall seconds and its peak RSS (getrusage of the child). For `partition` read
# its own `output.peak_rss_bytes` instead: it resets the kernel's peak between phases (to report
# each phase's), which leaves getrusage with the last phase's peak only.
#   benches/scale.sh [SCALE (default 25)] [PARTS (default 8)] [WORKDIR (default run/scale)]
# RMAT-24 took 15 GB of RAM and leaves 11.7 GB of files in WORKDIR (graph and chunks; work files
# beside them take up to 8 bytes per edge more while it runs; RMAT-25 needs about 29 GB of RAM,
# docs/performance.md, "Scale"); run it holding the benchmark
# lock (flock /tmp/bench.lock benches/scale.sh). BIN overrides the binary, METHOD the method;
# GENERATE=0 reuses an existing graph file.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SCALE="${1:-25}"
PARTS="${2:-8}"
W="${3:-run/scale}"
BIN="${BIN:-target/release/distspmm}"
METHOD="${METHOD:-kaminpar}"
mkdir -p "$W"
G="$W/rmat$SCALE.npz"
OUT="$W/rmat$SCALE-p$PARTS"

# step NAME CMD...: runs CMD, prints {"step", "seconds", "peak_rss_bytes", "output": <its last
# stdout line as JSON, or null>}; fails the script when CMD fails.
step() {
  python3 - "$@" <<'PY'
import json, resource, subprocess, sys, time
name, cmd = sys.argv[1], sys.argv[2:]
start = time.monotonic()
proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
seconds = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
lines = [l for l in proc.stdout.splitlines() if l.strip()]
try:
    output = json.loads(lines[-1]) if lines else None
except json.JSONDecodeError:
    output = None
print(json.dumps({"step": name, "command": " ".join(cmd), "exit": proc.returncode,
                  "seconds": round(seconds, 2), "peak_rss_bytes": peak, "output": output}),
      flush=True)
sys.exit(proc.returncode)
PY
}

[ "${GENERATE:-1}" = 0 ] && [ -f "$G" ] || step generate "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 --out "$G" --force --json
step partition "$BIN" partition --input "$G" --parts "$PARTS" --out "$OUT" --method "$METHOD" --force --json
step inspect "$BIN" inspect "$OUT" --json
step plan "$BIN" plan --chunks "$OUT" --json
