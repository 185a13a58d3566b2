#!/usr/bin/env bash
# bench-memory: memory per rank of one training step of the 3-D U-Net (deploy/specs/
# unet3d-{1,2,4}.json, the volume whole, split [1,1,2,1,1] and [1,1,2,2,1]) at S^3, batch 1,
# on 1, 2 and 4 ranks: the engine's own bytes (after building, and at the step's peak) and
# the processes' peak resident memory (VmHWM), the largest rank of each run next to the
# 1-rank figure divided by P. docs/MEMORY.md explains the formula.
# Usage: bench-memory [S]   (default 128; a 1-rank step needs about 4 GiB at 128^3)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="@PROJECT_SOURCE_DIR@"
S=${1:-128}
mpi=(@MPIEXEC_EXECUTABLE@ @DDL_MPIEXEC_FLAGS_STR@)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
echo "bench-memory: 3-D U-Net, ${S}^3, batch 1, f32, one training step; $(lscpu | sed -n 's/^Model name: *//p')"
declare -A peak hwm made
for np in 1 2 4; do
    out=$("${mpi[@]}" -np $np "$here/bench-memory-worker" --model "$src/deploy/specs/unet3d-$np.json" \
        --size "$S" --batch 1)
    echo "$out" | tee -a "${BENCH_LOG:-/dev/null}" | grep -v '^max'
    line=$(echo "$out" | grep '^max')
    made[$np]=$(echo "$line" | awk '{print $3}')
    peak[$np]=$(echo "$line" | awk '{print $5}')
    hwm[$np]=$(echo "$line" | awk '{print $7}')
done
echo
printf "%-6s %16s %16s %16s %14s %14s\n" ranks "engine built MiB" "engine peak MiB" "peak RSS MiB" "peak/(1rk/P)" "RSS/(1rk/P)"
for np in 1 2 4; do
    awk -v p=$np -v m="${made[$np]}" -v e="${peak[$np]}" -v h="${hwm[$np]}" -v e1="${peak[1]}" -v h1="${hwm[1]}" \
        'BEGIN { printf "%-6d %16.1f %16.1f %16.1f %14.2f %14.2f\n", p, m, e, h, e / (e1 / p), h / (h1 / p) }'
done
