#!/usr/bin/env bash
# Training-engine integration tests on real Fashion-MNIST (its first 2048 training images,
# train_lib.sh), driving distdl-train:
#  1. the LeNet-5 spec on 1, 2 and 4 ranks: an f64 copy gives the same loss at each of 10
#     steps (1e-10 relative) and the same global weights after them (1e-9); the shipped f32
#     spec the same losses (1e-5) and weights (||a - b|| / ||b|| over all tensors, 1e-4).
#     Per tensor, f32 weights after 20 Adam steps part by up to 5.5e-5 of the tensor's
#     largest element depending on the kernel path (OpenBLAS Prescott; 8e-6 on the GEMM
#     convolutions): that is rounding, judged by the f64 runs, not a tolerance to tune;
#  2. resume from a checkpoint gives the same trajectory as an uninterrupted run,
#     bitwise (same world size): LeNet-5 on 4 ranks, the f32 run of 1. against 6 steps
#     checkpointed every 3 then resumed to 10; a batch-norm, dropout and SGD-momentum
#     network on 2 ranks, 10 steps against 5 then resumed;
#  3. resharding a checkpoint 4 -> 2 -> 1 ranks keeps the weights bitwise equal (the
#     checkpoint the 4-rank f32 run of 1. writes at its end, step 10), and weights exported
#     on 4 ranks import into 1 and export unchanged;
#  4. a corrupted checkpoint (a copy of 3.'s, one byte of one shard changed) is refused
#     with a message naming the file. It runs in the background beside 2. and 3.: after a
#     rank exits non-zero mpirun waits about 2 s, idle (Open MPI 4.1). (Run by hand,
#     outside ctest's own session directory per test, two mpiruns at once can meet the
#     session-directory race of tests/CMakeLists.txt.)
# Usage: train_equivalence.sh BIN_DIR SPEC_DIR DATA_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
# shellcheck source=train_lib.sh
. "$(dirname "$0")/train_lib.sh" dataset "$@"

echo "== 1. the same spec on 1, 2 and 4 ranks (f64, then the shipped f32)"
for np in 1 2 4; do
    as_f64 "$specs/lenet5-$np.json" "$tmp/f64-$np.json"
    train "$np" --model "$tmp/f64-$np.json" --max-steps 10 --print-steps \
        --export "$tmp/d$np.safetensors" >"$tmp/dlog$np"
    ck=()
    if [ "$np" = 4 ]; then
        ck=(--checkpoint-dir "$tmp/r4" --checkpoint-on-exit)
    fi
    train "$np" --model "$specs/lenet5-$np.json" --max-steps 10 --print-steps \
        --export "$tmp/w$np.safetensors" "${ck[@]}" >"$tmp/log$np"
done
$py "$tool" losses "$tmp/dlog1" "$tmp/dlog2" "$tmp/dlog4" --rtol 1e-10
$py "$tool" compare "$tmp/d2.safetensors" "$tmp/d1.safetensors" --rtol 1e-9 | tail -1
$py "$tool" compare "$tmp/d4.safetensors" "$tmp/d1.safetensors" --rtol 1e-9 | tail -1
$py "$tool" losses "$tmp/log1" "$tmp/log2" "$tmp/log4" --rtol 1e-5
$py "$tool" compare "$tmp/w2.safetensors" "$tmp/w1.safetensors" --model-norm --rtol 1e-4 | tail -1
$py "$tool" compare "$tmp/w4.safetensors" "$tmp/w1.safetensors" --model-norm --rtol 1e-4 | tail -1

# 4. starts here, on a copy of the checkpoint 3. moves.
cp -r "$tmp/r4" "$tmp/bad4"
step=$(cat "$tmp/bad4/latest")
shard="$tmp/bad4/$step/shard-00001.bin"
printf '\xff' | dd of="$shard" bs=1 seek=100 count=1 conv=notrunc status=none
(
    if train 4 --model "$specs/lenet5-4.json" --max-steps 10 --resume-from "$tmp/bad4" \
        >"$tmp/bad.out" 2>"$tmp/bad.err"; then
        touch "$tmp/bad.accepted"
    fi
) &
refuse_bad=$!

echo "== 2. resume from a checkpoint: the same trajectory, bitwise"
check_resume lenet 4 "$specs/lenet5-4.json" 10 6 3 "$tmp/log4" "$tmp/w4.safetensors"
echo "10 steps identical; final weights bitwise equal"
# The same with batch norm (running statistics are checkpointed), dropout and SGD momentum.
check_resume bn 2 "$specs/cnn-bn-2.json" 10 5 5
echo "batch norm + dropout model: 10 steps identical after resume; weights and running statistics bitwise equal"

echo "== 3. reshard 4 -> 2 -> 1 keeps the weights bitwise"
cp "$tmp/w4.safetensors" "$tmp/r4.safetensors"
train 2 --model "$specs/lenet5-2.json" --max-steps 10 --resume-from "$tmp/r4" \
    --checkpoint-dir "$tmp/r2" --checkpoint-on-exit --export "$tmp/r2.safetensors" >/dev/null
train 1 --model "$specs/lenet5-1.json" --max-steps 10 --resume-from "$tmp/r2" \
    --export "$tmp/r1.safetensors" >/dev/null
cmp "$tmp/r4.safetensors" "$tmp/r2.safetensors"
cmp "$tmp/r4.safetensors" "$tmp/r1.safetensors"
echo "weights bitwise equal after 4 -> 2 -> 1"
# Global weights exported on 4 ranks import into 1 rank and export unchanged.
train 1 --model "$specs/lenet5-1.json" --max-steps 0 --import "$tmp/r4.safetensors" \
    --export "$tmp/imported.safetensors" >/dev/null
cmp "$tmp/r4.safetensors" "$tmp/imported.safetensors"
echo "safetensors export (4 ranks) -> import (1 rank) -> export: bitwise equal"

echo "== 4. a corrupted checkpoint is refused"
wait "$refuse_bad"
if [ -e "$tmp/bad.accepted" ]; then
    echo "a corrupted checkpoint was accepted"
    exit 1
fi
grep -q "shard-00001.bin" "$tmp/bad.err"
echo "refused: $(head -1 "$tmp/bad.err")"
echo "4 passed, 0 failed"
