#!/usr/bin/env bash
# Builds (Release) and runs the whole test suite with ctest. Extra args go to cmake's configure,
# e.g. scripts/test.sh -DKVFS_SANITIZE=address (use BUILD_DIR=build-asan for a separate tree).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j"$(nproc)"
