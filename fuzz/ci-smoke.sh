#!/usr/bin/env bash
# CI smoke test of the fuzz targets: builds all of them (cargo-fuzz, RUSTC_BOOTSTRAP=1 on
# stable) and runs each for SECONDS (default 5) from its committed seed corpus only (nothing is
# written to corpus/). Exits non-zero on a build failure or a finding.
#
# Usage: fuzz/ci-smoke.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")"
source ./targets.sh
seconds=${1:-5}
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: run \`cargo install cargo-fuzz\`" >&2
    exit 1
fi
cargo fuzz build
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in "${FUZZ_TARGETS[@]}"; do
    mkdir -p "$scratch/$t"
    # The scratch directory comes first, so new inputs land there and seeds/ stays untouched.
    if ! cargo fuzz run "$t" "$scratch/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -max_len="${FUZZ_MAX_LEN[$t]}" -timeout=10 \
        >"$scratch/$t.log" 2>&1; then
        tail -n 40 "$scratch/$t.log" >&2
        echo "fuzz target $t failed; reproducer under fuzz/artifacts/$t/" >&2
        exit 1
    fi
    echo "fuzz $t: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$scratch/$t.log" | tail -1)"
done
