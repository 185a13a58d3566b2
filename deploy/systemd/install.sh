#!/usr/bin/env bash
# Installs distdld, distdld-run, the example specs and the systemd unit under /opt/distdl
# (the paths distdld.service names). DESTDIR stages the install into another root, as
# packagers do (tests/deploy/systemd_test.py verifies the unit in such a root).
#   sudo deploy/systemd/install.sh            # then: useradd --system distdl (once),
#                                             # systemctl daemon-reload; systemctl enable --now distdld
#   BUILD_DIR=build DESTDIR=/tmp/root deploy/systemd/install.sh
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$src/build}"
root="${DESTDIR:-}"
prefix=/opt/distdl
if [ ! -x "$build/bin/distdld" ]; then
    echo "install.sh: $build/bin/distdld is not built (cmake --build build, or set BUILD_DIR)" >&2
    exit 2
fi
install -Dm755 "$build/bin/distdld" "$root$prefix/bin/distdld"
install -Dm755 "$src/deploy/distdld-run" "$root$prefix/bin/distdld-run"
install -d "$root$prefix/share/distdl/specs" "$root$prefix/share/doc/distdl"
install -m644 "$src"/deploy/specs/*.json "$root$prefix/share/distdl/specs/"
install -m644 "$src/README.md" "$src/docs/SERVER.md" "$root$prefix/share/doc/distdl/"
install -m644 "$src/deploy/README.md" "$root$prefix/share/doc/distdl/DEPLOY.md"
install -Dm644 "$src/deploy/systemd/distdld.service" "$root/etc/systemd/system/distdld.service"
# Keep a site's settings on reinstall.
if [ ! -e "$root/etc/distdl/distdld.env" ]; then
    install -Dm644 "$src/deploy/systemd/distdld.env" "$root/etc/distdl/distdld.env"
fi
echo "installed under ${root:-/}: $prefix/bin/{distdld,distdld-run}, /etc/systemd/system/distdld.service, /etc/distdl/distdld.env"
