#!/usr/bin/env bash
# Runs every fuzz target, one after another, for SECONDS each (default 600), niced, growing
# corpus/<target>/ from seeds/<target>/. Logs go to target/logs/<target>.log; a summary line per
# target (executions, coverage, features, corpus size, finding or not) to target/logs/summary.txt.
# A target that finds a crash is reported (reproducer under artifacts/<target>/) and the others
# still run; the exit status is non-zero if any found one.
#
# Usage: fuzz/run-all.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
source ./targets.sh
seconds=${1:-600}
shift || true
[[ $# -gt 0 ]] && targets=("$@") || targets=("${FUZZ_TARGETS[@]}")
export RUSTC_BOOTSTRAP=1
mkdir -p target/logs
# Build once, then run the binaries (what `cargo fuzz run` does after building), so that
# edits elsewhere in the workspace during a long session do not rebuild or break later targets.
nice -n 10 cargo fuzz build
bin=target/x86_64-unknown-linux-gnu/release
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log=target/logs/$t.log
    start=$(date -u +%FT%TZ)
    status=ok
    nice -n 10 "$bin/$t" -artifact_prefix="artifacts/$t/" "corpus/$t" "seeds/$t" \
        -max_total_time="$seconds" -max_len="${FUZZ_MAX_LEN[$t]}" -timeout=10 \
        -print_final_stats=1 >"$log" 2>&1 || status=FINDING
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
    cov=$(grep -o 'cov: [0-9]*' <<<"$done_line" | grep -o '[0-9]*' || echo '?')
    ft=$(grep -o 'ft: [0-9]*' <<<"$done_line" | grep -o '[0-9]*' || echo '?')
    corp=$(grep -o 'corp: [0-9]*' <<<"$done_line" | grep -o '[0-9]*' || echo '?')
    line="$t start=$start seconds=$seconds execs=$execs cov=$cov ft=$ft corpus=$corp result=$status"
    echo "$line" | tee -a target/logs/summary.txt
    if [[ $status != ok ]]; then
        echo "$t found a crash; see $log and artifacts/$t/" >&2
        found=1
    fi
done
exit "${found:-0}"
