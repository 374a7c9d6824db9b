#!/usr/bin/env bash
# The GPU check of distspmm-cuda (issue 8), in two halves because the device machine has
# CUDA, PyTorch's pip CUDA libraries and python3, but no Rust toolchain and no network:
#
#   distspmm-cuda/gpu-check.sh prepare   # here: release-build the GPU tests and the benchmark
#                                        # (features cuda, bench) into distspmm-cuda/gpu-carry/
#   distspmm-cuda/gpu-check.sh run       # on the device machine, with gpu-carry carried:
#                                        # GPU tests (no skipping): kernels, edge softmax,
#                                        # training kernels + cuSPARSE benchmark (ALG1/2/3,
#                                        # both dense layouts, the device's copy bandwidth)
#                                        # + dist-comm's NCCL self-test at 2 ranks
#                                        # + the GPU distributed SpMM against the CPU one
#
# `run` writes gpu-check.log, tests.log, train-tests.log, bench.txt, bench.jsonl, nccl.log and
# gpu-spmm.log under $OUT (or ./gpu-check-out when OUT is unset) and exits non-zero if a test
# or the benchmark fails. Budget: under 6 minutes on an H200 (RMAT scale 18 and 20, symmetric
# for CSR and directed for CSC, F = 16, 64, 256; the tests, the NCCL self-test and the
# distributed SpMM tests take seconds; each NCCL launch is stopped after 90 s, each
# distributed SpMM attempt after 150 s).
#
# The distributed SpMM tests (distspmm-op/tests/gpu_spmm.rs, built without MPI) compare
# GpuDistSpmm with the CPU DistSpmm on the same chunks — forward and backward, halo and
# broadcast schedules, F = 1..130 with padded leading dimensions, traffic, reruns, the raw
# path, the per-edge calls, their grouped (multi-head) forms and the edge softmax, and messages
# in bf16 and f16 (the conversion kernels against the CPU's conversions bit for bit, the
# operator against the CPU one in the same precision) — at P = 1 in one process and at P = 2
# as two spawned processes (one NCCL_HOSTID each on a single GPU, as for the self-test).
#
# The NCCL self-test (dist-comm/src/bin/nccl-selftest.rs) runs broadcast, all-reduce and the
# grouped send/receive of the halo exchange on device buffers against host results. It runs
# with `--spawn 2` (no MPI: the program starts its own ranks) and, when the machine has an MPI
# that the MPI build can load, under `mpirun -n 2`. NCCL refuses two ranks on
# one GPU of one host, so on a single GPU each rank gets its own NCCL_HOSTID and NCCL links
# them through sockets (checks correctness, not NCCL's speed).
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
    # The integration-test executables' paths come from cargo's JSON messages: the kernel tests
    # (tests/gpu.rs) and the edge softmax and training kernels (tests/gpu_train.rs).
    local name exe
    for name in gpu gpu_train; do
        exe="$(cd "$root" && cargo test -p distspmm-cuda --features cuda --release --test "$name" --no-run \
            --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])
' "$name")"
        [ -x "$exe" ] || { echo "gpu-check prepare: could not find the $name test executable" >&2; exit 1; }
        cp "$exe" "$carry/${name//_/-}-tests"
    done
    (cd "$root" && cargo build -p distspmm-cuda --features bench --release --example gpu_bench)
    cp "$target/release/examples/gpu_bench" "$carry/gpu_bench"
    # The NCCL self-test twice: without MPI (runs anywhere, `--spawn`) and with it (`mpirun`).
    (cd "$root" && cargo build -p dist-comm --no-default-features --features nccl --release --bin nccl-selftest)
    cp "$target/release/nccl-selftest" "$carry/nccl-selftest"
    (cd "$root" && cargo build -p dist-comm --features nccl --release --bin nccl-selftest)
    cp "$target/release/nccl-selftest" "$carry/nccl-selftest-mpi"
    # The distributed SpMM tests: the test executable, found like the kernel tests above.
    local spmm_tests
    spmm_tests="$(cd "$root" && cargo test -p distspmm-op --features cuda --release \
        --test gpu_spmm --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_spmm":
        print(m["executable"])
')"
    [ -x "$spmm_tests" ] || { echo "gpu-check prepare: could not find the gpu_spmm test executable" >&2; exit 1; }
    cp "$spmm_tests" "$carry/gpu-spmm-tests"
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
    [ -x "$carry/gpu-tests" ] && [ -x "$carry/gpu-train-tests" ] && [ -x "$carry/gpu_bench" ] \
        && [ -x "$carry/nccl-selftest" ] && [ -x "$carry/gpu-spmm-tests" ] || {
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
    echo "== edge softmax and training kernel tests"
    timeout 120 "$carry/gpu-train-tests" --test-threads=1 --nocapture 2>&1 | tee "$out/train-tests.log" \
        || status=1
    echo "== benchmark"
    timeout 300 "$carry/gpu_bench" --scales 18,20 --features 16,64,256 --iters 20 --json "$out/bench.jsonl" \
        2>&1 | tee "$out/bench.txt" || status=1
    echo "== NCCL self-test (2 ranks)"
    nccl_selftest "$out/nccl.log" || status=1
    echo "== distributed SpMM on the GPU vs the CPU operator (P = 1, P = 2 spawned)"
    nccl_try "$out/gpu-spmm.log" "gpu_spmm tests" \
        timeout 150 "$carry/gpu-spmm-tests" --test-threads=1 --nocapture || status=1
    echo "== done, status $status"
    return "$status"
}

# dist-comm's NCCL self-test at 2 ranks: with --spawn (no MPI needed), then under mpirun when
# the MPI build can run here (NcclComm::new over MPI, the production setup). Both ranks share
# GPU 0 when there is only one (a NCCL_HOSTID per rank). A failed run is repeated once with
# NCCL's sockets on the loopback interface. Fails if any launch that ran failed both times.
nccl_selftest() {
    local log="$1" gpus status=0
    [ -x "$carry/nccl-selftest" ] || { echo "nccl-selftest missing from $carry" | tee "$log"; return 1; }
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
    nccl_try "$log" "--spawn 2 ($gpus GPU(s))" \
        timeout 120 "$carry/nccl-selftest" --spawn 2 --timeout 90 || status=1
    if command -v mpirun >/dev/null 2>&1 && [ -x "$carry/nccl-selftest-mpi" ] \
        && ! ldd "$carry/nccl-selftest-mpi" 2>/dev/null | grep -q 'not found'; then
        # shellcheck disable=SC2016  # expanded by the per-rank shell
        nccl_try "$log" "mpirun -n 2 ($gpus GPU(s))" \
            env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 90 \
            mpirun -n 2 --oversubscribe bash -c \
            '[ "${1:-0}" -lt 2 ] && export NCCL_HOSTID="nccl-selftest-rank-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"; exec "$0"' \
            "$carry/nccl-selftest-mpi" "$gpus" || status=1
    else
        echo "-- mpirun: not run (no mpirun, or the MPI build cannot load its MPI library here)" | tee -a "$log"
    fi
    return "$status"
}

# nccl_try LOG LABEL COMMAND...: runs COMMAND, and once more with NCCL_SOCKET_IFNAME=lo if it fails.
nccl_try() {
    local log="$1" label="$2"
    shift 2
    echo "-- $label, NCCL sockets on the default interface" | tee -a "$log"
    "$@" 2>&1 | tee -a "$log" && return 0
    echo "-- $label, NCCL sockets on loopback" | tee -a "$log"
    NCCL_SOCKET_IFNAME=lo "$@" 2>&1 | tee -a "$log"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
