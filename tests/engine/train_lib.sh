# train_lib.sh: what the distdl-train integration tests share (train_equivalence.sh,
# train_segment.sh, graph_equivalence.sh). Sourced, not run, with the test's arguments:
#   . "$(dirname "$0")/train_lib.sh" dataset BIN_DIR SPEC_DIR DATA_DIR MPIRUN [FLAGS...]
#   . "$(dirname "$0")/train_lib.sh" generated BIN_DIR SPEC_DIR MPIRUN [FLAGS...]
# (dataset: the specs read Fashion-MNIST from DATA_DIR; generated: they make their data).
# Sets bin, specs, data (empty for generated), mpi (an array), py, tool and tmp (a
# directory removed at exit); exits 7, which ctest counts as skipped, when DATA_DIR is
# missing; defines as_f64, fm_subset, train and check_resume. The test runs `set -euo
# pipefail` before it sources this file, so that a train_lib.sh not found stops it.
# A dataset test trains on the first 2048 training and 256 test images of DATA_DIR
# (fm_subset, data=$tmp/fm): every run of these tests stays within the first 10 batches
# of an epoch, and distdl-train's rank 0 reading and unzipping all 70000 images took
# about 1 s of each of its ~20 runs (the full dataset is read by test_session and
# test_idx). The images are the real ones; only the shuffle draws from fewer of them.
# shellcheck disable=SC2034 # specs: used by the tests that source this file
case ${1:-} in
dataset)
    bin=$2 specs=$3 data=$4
    shift 4
    ;;
generated)
    bin=$2 specs=$3 data=
    shift 3
    ;;
*)
    echo "train_lib.sh: the first argument is dataset or generated, not '${1:-}'" >&2
    exit 2
    ;;
esac
mpi=("$@")
# shellcheck disable=SC2034 # used by the tests that source this file
py=/usr/bin/python3
# shellcheck disable=SC2034
tool="$(dirname "${BASH_SOURCE[0]}")/safetensors_tool.py"
if [ -n "$data" ] && [ ! -d "$data" ]; then
    echo "skipped: no dataset at $data (apt-get install dataset-fashion-mnist)"
    exit 7
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# fm_subset SRC DST NTRAIN NTEST: the first NTRAIN training and NTEST test images and
# labels of the IDX directory SRC (files .gz or not), as uncompressed IDX files in DST.
fm_subset() {
    $py "$(dirname "${BASH_SOURCE[0]}")/../support/idx_subset.py" "$@"
}
if [ -n "$data" ]; then
    fm_subset "$data" "$tmp/fm" 2048 256
    data=$tmp/fm
fi

# as_f64 SPEC OUT: the spec with dtype f64, nothing else changed.
as_f64() {
    $py -c 'import json, sys; s = json.load(open(sys.argv[1])); s["dtype"] = "f64"; json.dump(s, open(sys.argv[2], "w"))' "$1" "$2"
}

# train NP ARGS...: distdl-train on NP ranks without evaluation (and --data DATA_DIR for
# the dataset tests).
train() {
    local np=$1 with_data=()
    shift
    if [ -n "$data" ]; then
        with_data=(--data "$data")
    fi
    "${mpi[@]}" -np "$np" "$bin/distdl-train" "${with_data[@]}" --no-eval "$@"
}

# check_resume NAME NP SPEC STEPS STOP EVERY [FULL_LOG FULL_EXPORT]: STEPS steps in one
# run, and the same in a run of STOP steps checkpointing every EVERY then one resumed from
# its last checkpoint, print the same losses at every step and export the same weights,
# bitwise. Files: $tmp/NAME-*. A test that made the uninterrupted run already for another
# check (train NP --model SPEC --max-steps STEPS --print-steps --export FULL_EXPORT
# >FULL_LOG) passes its log and export, and it is not run again.
check_resume() {
    local name=$1 np=$2 spec=$3 steps=$4 stop=$5 every=$6
    local t="$tmp/$name"
    if [ $# -ge 8 ]; then
        cp "$7" "$t-full.log"
        cp "$8" "$t-full.safetensors"
    else
        train "$np" --model "$spec" --max-steps "$steps" --print-steps \
            --export "$t-full.safetensors" >"$t-full.log"
    fi
    train "$np" --model "$spec" --max-steps "$stop" --print-steps \
        --checkpoint-dir "$t-ck" --checkpoint-every "$every" >"$t-part1.log"
    train "$np" --model "$spec" --max-steps "$steps" --print-steps \
        --checkpoint-dir "$t-ck" --resume --export "$t-resumed.safetensors" >"$t-part2.log"
    grep '^step' "$t-full.log" >"$t-a"
    cat "$t-part1.log" "$t-part2.log" | grep '^step' >"$t-b"
    diff "$t-a" "$t-b"
    cmp "$t-full.safetensors" "$t-resumed.safetensors"
}
