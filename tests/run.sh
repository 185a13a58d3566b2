#!/usr/bin/env bash
# Configures, builds (warnings are errors) and runs the whole test suite under ctest, one test
# per core at a time (CTEST_PARALLEL_LEVEL overrides): most daemon tests spend their time
# waiting, and the properties keep apart what must not overlap (RESOURCE_LOCK distdld: one
# daemon test at a time; RUN_SERIAL: the tests that judge latencies or a watchdog).
# Usage: tests/run.sh [extra ctest arguments]   (build directory: $BUILD_DIR or ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDL_WERROR=ON
cmake --build "$BUILD_DIR" -j "$(nproc)"
cd "$BUILD_DIR"
export CTEST_PARALLEL_LEVEL="${CTEST_PARALLEL_LEVEL:-$(nproc)}"
ctest --output-on-failure "$@"
