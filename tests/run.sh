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
# The fuzz targets' clang build (tests/fuzz/run.sh) now, on every core, rather than inside
# the ctest `fuzz` on one core beside the other tests (there it took ~3 of its ~5 min).
# Without clang it is skipped (the ctest skips too); a failed build is the ctest's failure.
DDL_FUZZ_BUILD="$(cd "$BUILD_DIR" && pwd)/fuzz" DDL_FUZZ_JOBS="$(nproc)" DDL_FUZZ_BUILD_ONLY=1 \
    bash tests/fuzz/run.sh || { rc=$?; [ "$rc" = 7 ] ||
    echo "tests/run.sh: the fuzz build failed ($rc); the ctest fuzz will say why"; }
cd "$BUILD_DIR"
export CTEST_PARALLEL_LEVEL="${CTEST_PARALLEL_LEVEL:-$(nproc)}"
ctest --output-on-failure "$@"
