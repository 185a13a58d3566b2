#!/usr/bin/env bash
# bench-train: LeNet-5 training throughput (batch 256, f32) of distdl-c at np 1, 2 and 4
# next to PyTorch on the same network and data with the same total thread count,
# measured in the same run. Prints images/s, the ratio distdl-c / PyTorch, and the FLOP
# rate of a step as a fraction of cblas_sgemm measured by the same ranks in the same run,
# then the step's FLOPs per layer.
# Raw worker output goes to $BENCH_LOG when set.
# Usage: bench-train [STEPS]   (from the build directory's bin/; PyTorch from Debian's
# python3-torch: apt-get install python3-torch)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="@PROJECT_SOURCE_DIR@"
steps=${1:-30}
mpi=(@MPIEXEC_EXECUTABLE@ @DDL_MPIEXEC_FLAGS_STR@)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The CPUs this script may run on (its affinity mask, as taskset or a Slurm cgroup set
# it), not nproc, which reports OMP_NUM_THREADS instead when that is set.
cores=$(/usr/bin/python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
rate() { sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p'; }
frac() { sed -n 's/.*sgemm_fraction \([0-9.]*\).*/\1/p'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "bench-train: LeNet-5, batch 256, f32, $steps timed steps, $cores cores (affinity mask)"
t1=$(/usr/bin/python3 "$src/tests/bench/lenet_torch.py" 256 "$steps" 1 | tee -a "${BENCH_LOG:-/dev/null}" | rate)
tn=$(/usr/bin/python3 "$src/tests/bench/lenet_torch.py" 256 "$steps" "$cores" | tee -a "${BENCH_LOG:-/dev/null}" | rate)
for np in 1 2 4; do
    out=$(OPENBLAS_NUM_THREADS=1 "${mpi[@]}" -np $np "$here/bench-train-worker" \
        --model "$src/deploy/specs/lenet5-$np.json" --batch 256 --steps "$steps" | tee -a "${BENCH_LOG:-/dev/null}")
    r=$(rate <<<"$out")
    printf "distdl-c np=%d (1 BLAS thread/rank): %8.1f img/s   PyTorch 1 thread: %8.1f   ratio %s   PyTorch %d threads: %8.1f   ratio %s   FLOP rate %s of sgemm\n" \
        $np "$r" "$t1" "$(div "$r" "$t1")" "$cores" "$tn" "$(div "$r" "$tn")" "$(frac <<<"$out")"
    if [ $np = 1 ]; then
        split=$(sed -n '/^flops per step/,$p' <<<"$out")
    fi
done
if [ "$cores" -gt 1 ]; then
    out=$("${mpi[@]}" --bind-to none -np 1 "$here/bench-train-worker" --model "$src/deploy/specs/lenet5-1.json" \
        --batch 256 --steps "$steps" | tee -a "${BENCH_LOG:-/dev/null}")
    r=$(rate <<<"$out")
    printf "distdl-c np=1 (%d BLAS threads): %8.1f img/s   PyTorch %d threads: %8.1f   ratio %s   FLOP rate %s of sgemm\n" \
        "$cores" "$r" "$cores" "$tn" "$(div "$r" "$tn")" "$(frac <<<"$out")"
fi
# The FLOPs of a step, per layer (from the np 1 run; the count does not depend on np).
echo "$split"
