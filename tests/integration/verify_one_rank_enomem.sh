#!/bin/sh
# distdl-verify with an allocation that fails on rank 0 only (issue 7: it printed PASS
# and then hung in mismatched collectives). For every injection point inside the checks,
# every rank must leave with the same verdict, FAIL (exit 1), well within the timeout.
# usage: verify_one_rank_enomem.sh MPIEXEC [mpiexec flags...] -- DISTDL_VERIFY
set -u
launcher=""
while [ "$1" != "--" ]; do launcher="$launcher $1"; shift; done
shift
verify="$1"
case_json='{"op":"linear","dtype":"f64","seed":1,"P_x":{"ranks":[0,1],"shape":[1,2]},"P_y":{"ranks":[0],"shape":[1,1]},"P_w":{"ranks":[0,1],"shape":[1,2]},"x_global_shape":[3,5],"out_features":4}'
# Without injection the case passes.
out=$(timeout 60 $launcher -np 2 "$verify" "$case_json" 2>&1) || { echo "$out"; echo "baseline failed"; exit 1; }
echo "$out" | tail -n 1 | grep -qx PASS || { echo "$out"; echo "baseline did not print PASS"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Four injection runs at a time: each is mostly mpirun idling after the nonzero exits (its
# kill sequence), so one after the other they took 16 x 1.5 s.
for batch in "0 1 2 3" "4 5 6 7" "8 9 10 11" "12 13 14 15"; do
    for n in $batch; do
        (DDL_VERIFY_FAIL_ALLOC="0:$n" timeout 30 $launcher -x DDL_VERIFY_FAIL_ALLOC -np 2 \
             "$verify" "$case_json" >"$tmp/out.$n" 2>&1
         echo $? >"$tmp/rc.$n") &
    done
    wait
done
for n in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
    out=$(cat "$tmp/out.$n")
    rc=$(cat "$tmp/rc.$n")
    if [ "$rc" -eq 124 ]; then
        echo "$out"; echo "n=$n: hang (timeout)"; exit 1
    fi
    if [ "$rc" -ne 1 ] || ! echo "$out" | grep -qx FAIL || echo "$out" | grep -qx PASS; then
        echo "$out"; echo "n=$n: exit $rc, expected FAIL (1) on every rank"; exit 1
    fi
    # Both ranks report the same (rank 0's) failure.
    for r in 0 1; do
        echo "$out" | grep -q "rank $r: .*DDL_ENOMEM" || { echo "$out"; echo "n=$n: rank $r did not report rank 0's ENOMEM"; exit 1; }
    done
done
echo "ok: one-rank allocation failures end with FAIL on every rank"
