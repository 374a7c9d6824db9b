#!/usr/bin/env bash
# Installs libdistspmm (shared + static), include/distspmm.h, a pkg-config file and a CMake
# config package into a prefix:
#   PREFIX/include/distspmm.h
#   PREFIX/lib/libdistspmm.so.X.Y.Z  (+ libdistspmm.so.X -> SONAME, libdistspmm.so -> linker name)
#   PREFIX/lib/libdistspmm.a
#   PREFIX/lib/pkgconfig/distspmm.pc                 (pkg-config --cflags --libs distspmm)
#   PREFIX/lib/cmake/distspmm/distspmmConfig.cmake   (find_package(distspmm) → distspmm::distspmm)
#
# Usage: capi/install.sh --prefix DIR [--from TARGET_PROFILE_DIR]
#   --from  a directory holding libdistspmm.so/.a already built (e.g. target/release);
#           without it, runs `cargo build --release -p distspmm-capi` and uses target/release.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
prefix="" from=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --from) from="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$prefix" ]; then
  echo "error: --prefix DIR is required (see --help)" >&2
  exit 2
fi
if [ -z "$from" ]; then
  (cd "$root" && cargo build --release -p distspmm-capi)
  from="${CARGO_TARGET_DIR:-$root/target}/release"
fi
for f in libdistspmm.so libdistspmm.a; do
  if [ ! -f "$from/$f" ]; then
    echo "error: $from/$f is missing; build it with cargo build -p distspmm-capi" >&2
    exit 1
  fi
done

header="$root/include/distspmm.h"
version_part() { sed -n "s/^#define DSP_VERSION_$1 \([0-9]*\)$/\1/p" "$header"; }
major="$(version_part MAJOR)" minor="$(version_part MINOR)" patch="$(version_part PATCH)"
if [ -z "$major" ] || [ -z "$minor" ] || [ -z "$patch" ]; then
  echo "error: cannot read the DSP_VERSION_* macros from $header" >&2
  exit 1
fi
version="$major.$minor.$patch"

mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
lib="$prefix/lib"
mkdir -p "$prefix/include" "$lib/pkgconfig" "$lib/cmake/distspmm"

install -m 644 "$header" "$prefix/include/distspmm.h"
install -m 755 "$from/libdistspmm.so" "$lib/libdistspmm.so.$version"
ln -sf "libdistspmm.so.$version" "$lib/libdistspmm.so.$major"
ln -sf "libdistspmm.so.$major" "$lib/libdistspmm.so"
install -m 644 "$from/libdistspmm.a" "$lib/libdistspmm.a"

# What a static link needs besides libdistspmm.a (rustc --print native-static-libs, with MPI's
# own link line where mpicc can tell it).
mpi_libs="$(mpicc --showme:link 2>/dev/null || echo -lmpi)"
libs_private="$mpi_libs -lmetis -lgcc_s -lutil -lrt -lpthread -lm -ldl"

sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@LIBS_PRIVATE@|$libs_private|g" \
  "$here/distspmm.pc.in" > "$lib/pkgconfig/distspmm.pc"
sed -e "s|@VERSION@|$version|g" -e "s|@VERSION_MAJOR@|$major|g" -e "s|@LIBS_PRIVATE@|$libs_private|g" \
  "$here/cmake/distspmmConfig.cmake.in" > "$lib/cmake/distspmm/distspmmConfig.cmake"
sed -e "s|@VERSION@|$version|g" -e "s|@VERSION_MAJOR@|$major|g" \
  "$here/cmake/distspmmConfigVersion.cmake.in" > "$lib/cmake/distspmm/distspmmConfigVersion.cmake"

echo "installed distspmm $version into $prefix"
