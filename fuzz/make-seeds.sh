#!/usr/bin/env bash
# Regenerates the binary seed files of the fuzz targets with the project's own CLI:
#   npz_reader/           graphs written by `distspmm generate`
#   manifest_reader/      manifest.json of small chunk directories written by `distspmm partition`
#   partition_map_reader/ the partition.map files of the same directories
# The text seeds (mtx_reader/, metis_reader/, edgelist_reader/) are hand-written and committed;
# sparse_validation/ and capi_driver/ hold fixed pseudo-random bytes (their inputs are structured
# by `arbitrary`).
# chunk_reader/ is maintained by chunk-format's tests (see README.md).
#
# Usage: fuzz/make-seeds.sh [path/to/distspmm]   (default: builds it with cargo)
set -euo pipefail
cd "$(dirname "$0")"
seeds=$PWD/seeds
if [[ $# -ge 1 ]]; then
    distspmm=$1
else
    (cd .. && cargo build -q -p distspmm-cli)
    distspmm=${CARGO_TARGET_DIR:-../target}/debug/distspmm
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$distspmm" generate csbm --nodes 24 --classes 3 --features 4 --avg-degree 3 --seed 5 \
    --out "$seeds/npz_reader/csbm-24.npz" --force >/dev/null
"$distspmm" generate rmat --scale 4 --edge-factor 2 --seed 3 \
    --out "$seeds/npz_reader/rmat-16.npz" --force >/dev/null

distspmm=$(realpath "$distspmm")
cp "$seeds"/npz_reader/*.npz "$work/"
cd "$work" # relative paths keep the manifests' command lines reproducible
partition() { # name graph parts method
    "$distspmm" partition --input "$2" --parts "$3" --method "$4" --out "$1" >/dev/null
    cp "$1/manifest.json" "$seeds/manifest_reader/$1.json"
    cp "$1/partition.map" "$seeds/partition_map_reader/$1.map"
}
partition csbm-2-metis csbm-24.npz 2 metis
partition csbm-3-contiguous csbm-24.npz 3 contiguous
partition rmat-1-random rmat-16.npz 1 random
echo "seeds regenerated under $seeds"
