#!/usr/bin/env bash
# Runs the C API tests (capi/tests/c_api.rs: the C99 and C++11 test programs, without MPI and
# under `mpirun -n 2`, the static library, the docs' example) against a libdistspmm built with
# AddressSanitizer (`-Zsanitizer=address`, RUSTC_BOOTSTRAP=1 on the stable toolchain). The C
# and C++ programs are compiled with `-fsanitize=address`, which links the sanitizer runtime
# the instrumented library calls into. Any invalid read or write, use after free or double free
# in the library (or in the programs) fails the test that ran it.
#
# Leak checking is off here: these programs finalise MPI, and OpenMPI, PMIx and hwloc leave
# thousands of allocations behind in components they have unloaded by then (so no suppression
# can name them). The library's own leaks are checked by the `capi_driver` fuzz target, which
# runs every C-API call under AddressSanitizer with LeakSanitizer after each input (MPI's
# set-up happens before the first one). See fuzz/README.md.
#
# Usage: scripts/asan-capi.sh [extra cargo test arguments]
# Builds into target/asan (kept between runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
triple="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
export CARGO_TARGET_DIR="$root/target/asan"
export DISTSPMM_SANITIZER_TARGET="$triple"
export DISTSPMM_TEST_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1"
# `--target` keeps the sanitizer out of build scripts and proc macros, which run on the host.
cargo test -p distspmm-capi --target "$triple" --test c_api "$@"
# The test binary builds the library itself; make sure what it linked was instrumented.
lib="$CARGO_TARGET_DIR/$triple/debug/libdistspmm.so"
reports=$(nm -D "$lib" | grep -c '__asan_report' || true)
if [[ $reports -eq 0 ]]; then
    echo "error: $lib is not instrumented by AddressSanitizer" >&2
    exit 1
fi
echo "C API tests passed under AddressSanitizer ($lib)"
