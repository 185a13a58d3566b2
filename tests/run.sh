#!/usr/bin/env bash
# Configures, builds (warnings are errors) and runs the whole test suite under ctest.
# Usage: tests/run.sh [extra ctest arguments]   (build directory: $BUILD_DIR or ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDL_WERROR=ON
cmake --build "$BUILD_DIR" -j "$(nproc)"
cd "$BUILD_DIR"
ctest --output-on-failure "$@"
