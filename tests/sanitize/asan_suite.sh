#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (issue 9 item 5):
# configures and builds $ASAN_BUILD_DIR (default build-asan) with -DDDL_ASAN=ON
# -DDDL_UBSAN=ON and runs ctest there. Every test then runs with the sanitizer settings of
# CMakeLists.txt (DDL_SAN_TEST_ENV: leaks reported for our code only, see
# tests/support/lsan.supp; any UBSan finding fails). The fuzz test is left out: it builds
# its own clang sanitizer build (tests/fuzz/run.sh). Extra arguments go to ctest.
#
#   tests/sanitize/asan_suite.sh [ctest args, e.g. -L daemon]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${ASAN_BUILD_DIR:-build-asan}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDL_ASAN=ON -DDDL_UBSAN=ON -DDDL_WERROR=ON
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -E '^fuzz' "$@"
