#!/usr/bin/env bash
# valgrind memcheck of the daemon integration test (issue 9 item 5): runs the client
# `lifecycle` scenario (health, create, status, steps, evaluate, predict, pull and push,
# checkpoint and restore, shutdown: tests/client/daemon_harness.py) against a 2-rank
# distdld whose every rank runs under memcheck, and fails if valgrind reports a definite
# leak or a memory error on any rank. Open MPI's own reports are suppressed with the
# suppression file Debian ships with it; nothing of ours is suppressed.
#
#   tests/sanitize/valgrind_daemon.sh [BUILD_DIR]      (default ./build; needs valgrind)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$src/build}" && pwd)"
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed (apt-get install valgrind)"; exit 7; }
logs="$(mktemp -d /tmp/ddl-valgrind-XXXXXX)"
supp=()
for f in /usr/share/openmpi/openmpi-valgrind.supp; do
    [ -f "$f" ] && supp+=(--suppressions="$f")
done
export DDL_DAEMON_WRAPPER="valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite \
--errors-for-leak-kinds=definite --error-exitcode=97 --num-callers=30 ${supp[*]} \
--log-file=$logs/memcheck.%p.log"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mca_base_component_disable_dlclose=1
# Valgrind runs the BLAS start-up self-check too; OpenBLAS needs no re-exec under it.
export DDL_BLAS_AUTO=0 OPENBLAS_NUM_THREADS=1
flags="--oversubscribe --mca btl self,vader --mca pml ob1 --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1"
rc=0
/usr/bin/python3 "$src/tests/client/daemon_harness.py" --build "$build" --source "$src" \
    --mpiexec mpirun --mpi-flags "$flags" lifecycle || rc=$?
echo "memcheck logs: $logs"
for f in "$logs"/memcheck.*.log; do
    summary="$(grep -E "definitely lost:|ERROR SUMMARY:" "$f" | sed 's/^==[0-9]*== *//' | tr '\n' ' ')"
    echo "  $(basename "$f"): $summary"
    if grep -q "definitely lost: [1-9]" "$f" || ! grep -q "ERROR SUMMARY: 0 errors" "$f"; then
        echo "---- $f ----"; cat "$f"; rc=1
    fi
done
[ "$rc" = 0 ] && echo "PASS: no definite leaks and no memory errors on any rank"
exit "$rc"
