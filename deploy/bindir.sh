# Sourced by the deploy/run-*.sh scripts (from the source tree's root): sets `bin` to the
# directory holding the built programs. $BUILD_DIR if set, else build-release (the product
# build of deploy/build.sh), else build (the test build of tests/run.sh).
ddl_need="${1:-distdld}"
if [ -n "${BUILD_DIR:-}" ]; then
    bin="$BUILD_DIR/bin"
elif [ -x build-release/bin/"$ddl_need" ]; then
    bin=build-release/bin
else
    bin=build/bin
fi
if [ ! -x "$bin/$ddl_need" ]; then
    echo "$(basename "$0"): $bin/$ddl_need is not built: run bash deploy/build.sh" \
         "(or set BUILD_DIR to a build directory)" >&2
    exit 2
fi
unset ddl_need
