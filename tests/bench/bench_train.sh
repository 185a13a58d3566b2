#!/usr/bin/env bash
# bench-train: training throughput of the shipped networks (f32) in distdl-c at np 1 and 2
# next to the same network in PyTorch (tests/bench/torch_train.py, built from the same
# spec) at 1 thread and at all cores, measured in the same run. Prints one row per
# network: images/s (samples/s: volumes for the U-Net), the ratios np 1 / PyTorch 1 thread
# and np 2 / PyTorch all cores (issue 19's targets), and the FLOP rate of a step as a
# fraction of cblas_sgemm measured by the same ranks in the same run; then each network's
# FLOPs per layer (from its np 1 run). PyTorch at all cores runs twice, with OpenMP's
# default wait policy and OMP_WAIT_POLICY=PASSIVE; the faster counts (both are printed).
# Batch: LeNet-5 256, the others their spec's own (VGG and ResNet 64, U-Net 2).
# A network with a NET-P-batch.json spec (the batch split over P ranks, data parallel)
# gets a second row with it in the np P columns, and each row's np P / np 1 speed-up is
# printed below the table.
# Raw worker output goes to $BENCH_LOG when set.
# --rounds R measures every column R times, interleaved (PyTorch, then each distdl-c run,
# then again), and prints each column's median: this machine's speed moves by 20-30 %
# between phases of a few minutes, and one round can put PyTorch in one and distdl-c in
# another.
# Usage: bench-train [--networks lenet5,vgg,resnet,unet3d] [--np 1,2] [--rounds R] [STEPS]
#        (from the build directory's bin/; STEPS timed steps per run, default 20, after 3
#        warm-up steps; PyTorch from Debian's python3-torch: apt-get install python3-torch)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="@PROJECT_SOURCE_DIR@"
networks=lenet5,vgg,resnet,unet3d
nps=1,2
steps=20
rounds=1
while [ $# -gt 0 ]; do
    case "$1" in
        --networks) networks=$2; shift 2 ;;
        --np) nps=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) steps=$1; shift ;;
    esac
done
for v in "rounds=$rounds" "STEPS=$steps"; do
    if ! [[ ${v#*=} =~ ^[1-9][0-9]{0,3}$ ]]; then
        echo "bench-train: ${v%%=*} '${v#*=}' must be an integer from 1 to 9999" >&2
        exit 2
    fi
done
mpi=(@MPIEXEC_EXECUTABLE@ @DDL_MPIEXEC_FLAGS_STR@)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The CPUs this script may run on (its affinity mask, as taskset or a Slurm cgroup set
# it), not nproc, which reports OMP_NUM_THREADS instead when that is set.
cores=$(/usr/bin/python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
log="${BENCH_LOG:-/dev/null}"
rate() { sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p'; }
frac() { sed -n 's/.*sgemm_fraction \([0-9.]*\).*/\1/p'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
num() { awk -v a="$1" 'BEGIN { printf(a >= 100 ? "%.0f" : "%.2f", a) }'; } # img/s, 3-4 digits
median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "skipped: no PyTorch for the reference (apt-get install python3-torch)"
    exit 7
fi
IFS=, read -r -a nets <<<"$networks"
IFS=, read -r -a npl <<<"$nps"
echo "bench-train: f32, $steps timed steps per run, $cores cores (affinity mask); distdl-c one" \
     "BLAS thread per rank; ratio: np 1 / PyTorch 1 thread, np >= 2 / PyTorch $cores threads" \
     "(the faster of two OpenMP wait policies, below)"
head="| network | batch | PyTorch 1 thr img/s | PyTorch $cores thr img/s |"
rule="|---|---|---|---|"
for np in "${npl[@]}"; do
    head+=" np $np img/s | ratio | sgemm frac |"
    rule+="---|---|---|"
done
splits=""
notes=""
rows=""
speedups=""
rounds_out=""
for net in "${nets[@]}"; do
    spec1="$src/deploy/specs/$net-1.json"
    if [ ! -f "$spec1" ]; then
        echo "bench-train: no spec $spec1 (networks: lenet5, vgg, resnet, unet3d)" >&2
        exit 2
    fi
    if [ "$net" = lenet5 ]; then
        batch=256
    else
        batch=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["batch_size"])' "$spec1")
    fi
    # Each round measures every column once, in the same order; the table gives each
    # column's median over the rounds (ratios of medians), the lists below every round's.
    declare -A got=() fr=()
    for ((round = 1; round <= rounds; round++)); do
        t1=$(/usr/bin/python3 "$src/tests/bench/torch_train.py" "$spec1" "$batch" "$steps" 1 | tee -a "$log" | rate)
        # All cores: the faster of OpenMP's default wait policy and a passive one. The
        # default spins at its barriers, and on a loaded node (another process on a core) a
        # step then waits for a descheduled thread: measured 5-16x slower than passive
        # (VGG, load 4).
        ta=$(/usr/bin/python3 "$src/tests/bench/torch_train.py" "$spec1" "$batch" "$steps" "$cores" | tee -a "$log" | rate)
        tp=$(OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$src/tests/bench/torch_train.py" "$spec1" \
            "$batch" "$steps" "$cores" | tee -a "$log" | rate)
        got[t1]+="$t1 "
        got[tn]+="$(awk -v a="$ta" -v b="$tp" 'BEGIN { print (a > b ? a : b) }') "
        notes+="$net round $round: PyTorch $cores threads $(num "$ta") img/s with OpenMP's default wait policy, $(num "$tp") with OMP_WAIT_POLICY=PASSIVE"$'\n'
        for variant in "" -batch; do
            for np in "${npl[@]}"; do
                spec="$src/deploy/specs/$net-$np$variant.json"
                if [ ! -f "$spec" ] || { [ "$np" = 1 ] && [ -n "$variant" ]; }; then
                    continue # no spec, or np 1 of a split (the row above has it)
                fi
                out=$(OPENBLAS_NUM_THREADS=1 "${mpi[@]}" -np "$np" "$here/bench-train-worker" \
                    --model "$spec" --batch "$batch" --steps "$steps" | tee -a "$log")
                got[$variant,$np]+="$(rate <<<"$out") "
                fr[$variant,$np]+="$(frac <<<"$out") "
                if [ "$np" = 1 ] && [ "$round" = 1 ]; then
                    splits+="$net, batch $batch: $(sed -n '/^flops per step/,$p' <<<"$out")"$'\n'
                fi
            done
        done
    done
    t1=$(median ${got[t1]})
    tn=$(median ${got[tn]})
    r1=$(median ${got[,1]:-})
    for variant in "" -batch; do
        label=$net
        [ -z "$variant" ] || label="$net, batch split"
        row="| $label | $batch | $(num "$t1") | $(num "$tn") |"
        any=0
        for np in "${npl[@]}"; do
            if [ -z "${got[$variant,$np]:-}" ]; then
                row+=" - | - | - |"
                continue
            fi
            any=1
            r=$(median ${got[$variant,$np]})
            ref=$tn
            [ "$np" != 1 ] || ref=$t1
            row+=" $(num "$r") | $(div "$r" "$ref") | $(median ${fr[$variant,$np]}) |"
            if [ "$np" != 1 ] && [ -n "$r1" ]; then
                speedups+="$label: np $np / np 1 = $(div "$r" "$r1")"$'\n'
            fi
            if [ "$rounds" -gt 1 ]; then
                rounds_out+="$label np $np img/s by round: ${got[$variant,$np]% } (PyTorch: 1 thread ${got[t1]% }; $cores threads ${got[tn]% })"$'\n'
            fi
        done
        [ "$any" = 1 ] || continue
        rows+="$row"$'\n'
        echo "$row" >&2 # progress, while the rest runs
    done
    unset got fr
done
echo "$head"
echo "$rule"
printf "%s" "$rows"
printf "%s" "$speedups"
printf "%s" "$rounds_out"
printf "%s" "$notes"
# The FLOPs of a step, per layer (from the np 1 runs; the count does not depend on np).
printf "%s" "$splits"
