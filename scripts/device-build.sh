#!/bin/sh
# Run ON THE GPU MACHINE, from the repository root: unpack the carried .deps/*.deb into a private
# prefix (never into /), point pkg-config and CMake at it, and build with CUDA.
#   usage: scripts/device-build.sh [build-dir] [extra cmake args...]
#   MUSER_BUILD_TARGETS="muser test_cuda ..." builds only those targets (default: all).
set -eu
BUILD=${1:-build-cuda}
[ $# -gt 0 ] && shift
PREFIX=/opt/muser-deps
if [ ! -d "$PREFIX/usr" ]; then
    mkdir -p "$PREFIX"
    for f in .deps/*.deb; do dpkg -x "$f" "$PREFIX"; done
fi
# The .pc files name /usr (prefix=, includedir=/usr/include/cjson, ...): relocate them. Idempotent.
for pc in "$PREFIX"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    sed -i -e "s|=/usr|=$PREFIX/usr|" -e "s| -I/usr| -I$PREFIX/usr|g" -e "s| -L/usr| -L$PREFIX/usr|g" "$pc"
done
export PKG_CONFIG_PATH="$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig"
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMUSER_DEPS_PREFIX="$PREFIX" -DMUSER_CUDA=ON "$@" >"$BUILD.configure.log" 2>&1 \
    || { cat "$BUILD.configure.log"; exit 1; }
grep -E "CUDA backend" "$BUILD.configure.log" || true
# shellcheck disable=SC2086 # the target list is meant to split
cmake --build "$BUILD" -j "$(nproc)" ${MUSER_BUILD_TARGETS:+--target $MUSER_BUILD_TARGETS} 2>&1 \
    | grep -E "error|warning|Error" || true
test -x "$BUILD/muser"
echo "device-build: ok ($BUILD)"
