#!/usr/bin/env bash
# Builds the product only, for the main job and for users: distdld, the distdl CLI, distdl-train,
# distdl-verify, libdistdl-client (+ the example clients), configured with -DBUILD_TESTING=OFF
# and without warnings as errors, so a newer compiler's warning cannot stop it (warnings stay
# errors in CI: tests/run.sh builds ./build with -DDDL_WERROR=ON and every test).
# Its own build directory, so that it and tests/run.sh never flip each other's options.
#   bash deploy/build.sh                       # -> build-release/bin, build-release/lib
#   BUILD_DIR=/tmp/b bash deploy/build.sh      # elsewhere (deploy/run-main.sh: same BUILD_DIR)
#   PREFIX=/usr/local bash deploy/build.sh     # and cmake --install into PREFIX (docs/INSTALL.md)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-release}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF -DDDL_WERROR=OFF
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
if [ -n "${PREFIX:-}" ]; then
    cmake --install "$BUILD_DIR" --prefix "$PREFIX"
fi
