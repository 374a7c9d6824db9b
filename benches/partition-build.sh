#!/usr/bin/env bash
# The two chunk builders side by side on one graph: `distspmm partition --build in-memory` and
# `--build bounded`, each under /usr/bin/time -v and the shared bench lock, alternating.
# Prints, per run, the partition --json line and time's wall/CPU/peak RSS.
# Usage: benches/partition-build.sh GRAPH.npz PARTS OUTDIR [ROUNDS] [extra partition options]
set -euo pipefail
graph=$1 parts=$2 out=$3 rounds=${4:-1}
shift $(( $# < 4 ? $# : 4 ))
bin=${DISTSPMM:-target/release/distspmm}
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for build in in-memory bounded; do
    log="$out/time-$build-$round.txt"
    flock /tmp/bench.lock /usr/bin/time -v -o "$log" "$bin" partition --input "$graph" \
      --parts "$parts" --out "$out/chunks-$build" --build "$build" --json --force "$@" \
      > "$out/run-$build-$round.json"
    echo "$build round $round: $(cat "$out/run-$build-$round.json")"
    grep -E "Elapsed|Maximum resident|User time|System time" "$log" | sed 's/^\s*/  /'
  done
done
