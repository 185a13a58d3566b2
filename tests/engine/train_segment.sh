#!/usr/bin/env bash
# The shipped 3-D U-Net specs (unet3d-{1,2,4}.json: the volume whole, split [1,1,2,1,1],
# split [1,1,2,2,1]) trained by distdl-train on their generated data, resized to 16^3 by
# editing the input shape (the volume size is a spec parameter), so this takes seconds:
#  1. 1, 2 and 4 ranks give the same losses and global weights after 6 steps: in f64 to
#     1e-8 (the printed 9 digits) and 1e-10 (weights); in f32 to 1e-4. The same for
#     unet3d-2-batch.json (the batch of 2 split over 2 ranks, a volume each). f32 is looser
#     because this ReLU network with max pooling amplifies rounding: on one rank the f32
#     loss already differs from the f64 one by 6e-6 at step 7, and the 1-, 2- and 4-rank
#     f32 runs by up to 1.3e-5 at step 9 (of 10) while their f64 weights agree to 6e-13;
#  2. resuming from a checkpoint continues the same trajectory, bitwise (the generated
#     data is a function of the seed and the sample index, so nothing else is needed):
#     the 2-rank f32 run of 1. against 3 steps checkpointed then resumed to 6;
#  3. a checkpoint of 4 ranks resumes on 1 rank with the weights bitwise equal: the one
#     the 4-rank f32 run of 1. writes at its end;
#  4. --data is refused for a spec that generates its data, and required otherwise. These
#     two run first, in the background beside 1.-3.: after a rank exits non-zero mpirun
#     waits about 2 s before it exits itself (Open MPI 4.1), idle, which was 40% of this
#     test. (Run by hand, outside ctest's own session directory per test, two mpiruns at
#     once can meet the session-directory race of tests/CMakeLists.txt.)
# Usage: train_segment.sh BIN_DIR SPEC_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
# shellcheck source=train_lib.sh
. "$(dirname "$0")/train_lib.sh" generated "$@"
for np in 1 2 4 2-batch; do
    sed 's/"shape": \[1, 32, 32, 32\]/"shape": [1, 16, 16, 16]/' "$specs/unet3d-$np.json" \
        >"$tmp/unet16-$np.json"
    grep -q '"shape": \[1, 16, 16, 16\]' "$tmp/unet16-$np.json"
    sed 's/"dtype": "f32"/"dtype": "f64"/' "$tmp/unet16-$np.json" >"$tmp/unet16d-$np.json"
    grep -q '"dtype": "f64"' "$tmp/unet16d-$np.json"
done

# 4. starts here: refuse NAME ARGS... runs train 1 ARGS..., which must fail; it leaves
# $tmp/NAME.e (its stderr) and $tmp/NAME.accepted if it did not fail.
refuse() {
    local name=$1
    shift
    if train 1 "$@" >"$tmp/$name.o" 2>"$tmp/$name.e"; then
        touch "$tmp/$name.accepted"
    fi
}
refuse synth --model "$tmp/unet16-1.json" --data /nonexistent --max-steps 1 &
refuse_synth=$!
refuse idx --model "$specs/lenet5-1.json" --max-steps 1 &
refuse_idx=$!

echo "== 1. the U-Net on 1, 2 and 4 ranks, and the batch split on 2"
for np in 1 2 4 2-batch; do
    train "${np%-batch}" --model "$tmp/unet16d-$np.json" --max-steps 6 --print-steps \
        --export "$tmp/d$np.safetensors" >"$tmp/dlog$np"
    ck=()
    if [ "$np" = 4 ]; then
        ck=(--checkpoint-dir "$tmp/r4" --checkpoint-on-exit)
    fi
    train "${np%-batch}" --model "$tmp/unet16-$np.json" --max-steps 6 --print-steps \
        --export "$tmp/w$np.safetensors" "${ck[@]}" >"$tmp/log$np"
done
$py "$tool" losses "$tmp/dlog1" "$tmp/dlog2" "$tmp/dlog4" "$tmp/dlog2-batch" --rtol 1e-8
for np in 2 4 2-batch; do
    $py "$tool" compare "$tmp/d$np.safetensors" "$tmp/d1.safetensors" --rtol 1e-10 | tail -1
done
$py "$tool" losses "$tmp/log1" "$tmp/log2" "$tmp/log4" "$tmp/log2-batch" --rtol 1e-4

echo "== 2. resume: the same trajectory, bitwise"
check_resume unet 2 "$tmp/unet16-2.json" 6 3 3 "$tmp/log2" "$tmp/w2.safetensors"
echo "6 steps identical after resume; weights and batch-norm statistics bitwise equal"

echo "== 3. a 4-rank checkpoint on 1 rank"
train 1 --model "$tmp/unet16-1.json" --max-steps 6 --resume-from "$tmp/r4" \
    --export "$tmp/r1.safetensors" >/dev/null
cmp "$tmp/w4.safetensors" "$tmp/r1.safetensors"
echo "weights bitwise equal after 4 -> 1"

echo "== 4. --data and generated data"
wait "$refuse_synth" "$refuse_idx"
if [ -e "$tmp/synth.accepted" ]; then
    echo "--data was accepted for a spec that generates its data"
    exit 1
fi
grep -q 'leave out --data' "$tmp/synth.e"
if [ -e "$tmp/idx.accepted" ]; then
    echo "a spec without generated data ran without --data"
    exit 1
fi
grep -q -- '--data DIR is required' "$tmp/idx.e"
echo "refused: $(head -1 "$tmp/synth.e")"
echo "refused: $(head -1 "$tmp/idx.e")"
echo "4 passed, 0 failed"
