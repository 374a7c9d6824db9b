#!/usr/bin/env bash
# The GPU check of distspmm-cuda (issue 8), in two halves because the device machine has
# CUDA, PyTorch's pip CUDA libraries and python3, but no Rust toolchain and no network:
#
#   distspmm-cuda/gpu-check.sh prepare   # here: release-build the GPU tests and the benchmark
#                                        # (features cuda, bench) into distspmm-cuda/gpu-carry/
#   distspmm-cuda/gpu-check.sh run       # on the device machine, with gpu-carry carried:
#                                        # GPU tests (no skipping) + cuSPARSE benchmark
#
# `run` writes gpu-check.log, tests.log, bench.txt and bench.jsonl under $OUT (or
# ./gpu-check-out when OUT is unset) and exits non-zero if a test or the benchmark fails.
# Budget: well under 8 minutes on an H200 (RMAT scale 18 and 20, F = 16, 64, 256).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
carry="$here/gpu-carry"

prepare() {
    local root target
    root="$(cd "$here/.." && pwd)"
    target="${CARGO_TARGET_DIR:-$root/target}"
    rm -rf "$carry"
    mkdir -p "$carry"
    (cd "$root" && "$here/ci-check.sh" --build-only)
    # The integration-test executable path comes from cargo's JSON messages.
    local tests
    tests="$(cd "$root" && cargo test -p distspmm-cuda --features cuda --release --test gpu --no-run \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])
')"
    [ -x "$tests" ] || { echo "gpu-check prepare: could not find the gpu test executable" >&2; exit 1; }
    cp "$tests" "$carry/gpu-tests"
    (cd "$root" && cargo build -p distspmm-cuda --features bench --release --example gpu_bench)
    cp "$target/release/examples/gpu_bench" "$carry/gpu_bench"
    (cd "$root" && git rev-parse HEAD >"$carry/commit" 2>/dev/null || true)
    du -sh "$carry"
    echo "gpu-check prepare: carry distspmm-cuda/gpu-carry and run 'bash distspmm-cuda/gpu-check.sh run'"
}

# Directories of the pip NVIDIA wheels' shared libraries (cuSPARSE, nvJitLink, ...), if any.
pip_cuda_libs() {
    python3 - <<'EOF' 2>/dev/null || true
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
dirs = set()
for base in nvidia.__path__:
    for lib in glob.glob(os.path.join(base, "**", "lib*.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
EOF
}

run() {
    local out="${OUT:-$PWD/gpu-check-out}"
    mkdir -p "$out"
    exec > >(tee "$out/gpu-check.log") 2>&1
    [ -x "$carry/gpu-tests" ] && [ -x "$carry/gpu_bench" ] || {
        echo "gpu-check run: $carry lacks the prepared binaries; run 'gpu-check.sh prepare' and carry distspmm-cuda/gpu-carry" >&2
        exit 1
    }
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(cat "$carry/commit" 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    local libs
    libs="$(pip_cuda_libs)"
    export LD_LIBRARY_PATH="${libs:+$libs:}${LD_LIBRARY_PATH:-}"
    export DISTSPMM_REQUIRE_GPU=1 RUST_BACKTRACE=1

    local status=0
    echo "== GPU tests"
    timeout 240 "$carry/gpu-tests" --test-threads=1 --nocapture 2>&1 | tee "$out/tests.log" || status=1
    echo "== benchmark"
    timeout 300 "$carry/gpu_bench" --scales 18,20 --features 16,64,256 --iters 20 --json "$out/bench.jsonl" \
        2>&1 | tee "$out/bench.txt" || status=1
    echo "== done, status $status"
    return "$status"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
