#!/usr/bin/env bash
# valgrind memcheck of the daemon integration test (issue 9 item 5): runs the client
# `valgrind` scenario (tests/client/daemon_harness.py: the hostile requests of `bad` on a
# daemon without a model, then 100 training steps, an evaluation and a shutdown with
# LeNet-5) against 2-rank distdld jobs whose every rank runs under memcheck, and fails if
# valgrind reports a definite leak or a memory error in our code on any rank
# (memcheck_report.py: the innermost frame is ours). What Open MPI, PMIx, gRPC and the
# other system libraries keep for their lifetime is counted, not failed; nothing of ours is
# suppressed.
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
--num-callers=30 ${supp[*]} \
--log-file=$logs/memcheck.%p.log"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mca_base_component_disable_dlclose=1
# Valgrind runs the BLAS start-up self-check too; OpenBLAS needs no re-exec under it.
export DDL_BLAS_AUTO=0 OPENBLAS_NUM_THREADS=1
flags="--oversubscribe --mca btl self,vader --mca pml ob1 --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1"
rc=0
/usr/bin/python3 "$src/tests/client/daemon_harness.py" --build "$build" --source "$src" \
    --mpiexec mpirun --mpi-flags "$flags" valgrind || rc=$?
echo "memcheck logs: $logs"
for f in "$logs"/memcheck.*.log; do
    echo "  $(basename "$f"): $(grep -E "definitely lost:|ERROR SUMMARY:" "$f" | sed 's/^==[0-9]*== *//' | tr '\n' ' ')"
done
/usr/bin/python3 "$here/memcheck_report.py" "$src" "$build" "$logs"/memcheck.*.log || rc=1
[ "$rc" = 0 ] && echo "PASS: no definite leak and no memory error from our code on any rank"
exit "$rc"
