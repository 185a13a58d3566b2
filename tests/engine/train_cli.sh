#!/usr/bin/env bash
# distdl-train's command line and its checks before training (issue 7, 1b):
#  -h prints the usage and exits 0; a number out of range is refused (ERANGE), not
#  saturated; unwritable --checkpoint-dir / --export paths are refused before training;
#  a test split that does not fit the model (56x56 images, labels past the classes) is
#  refused; two layers with one name are refused when the model is built.
# Usage: train_cli.sh BIN_DIR SPEC_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
bin=$1 specs=$2
shift 2
mpi=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One rank: once it exited there is nothing for mpirun's kill sequence to wait for (the
# default odls_base_sigkill_timeout sleeps 1 s after a nonzero exit, each time).
run() { "${mpi[@]}" --mca odls_base_sigkill_timeout 0 -np 1 "$bin/distdl-train" "$@"; }
# expect CODE NEEDLE ARGS...: the exit code and a piece of the message.
expect() {
    local code=$1 needle=$2 rc=0
    shift 2
    run "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [ "$rc" != "$code" ] || ! grep -qF -- "$needle" "$tmp/out" "$tmp/err"; then
        echo "FAILED: distdl-train $* -> exit $rc (want $code), output:"
        cat "$tmp/out" "$tmp/err"
        exit 1
    fi
    echo "ok: $needle"
}
# Tiny IDX data: train 64 x 28x28; test splits of another size or with label 10.
/usr/bin/python3 - "$tmp" <<'PY'
import os, struct, sys
root = sys.argv[1]
def split(d, prefix, n, h, w, shift=0):
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, h, w) + bytes((i * 7) % 256 for i in range(n * h * w)))
    with open(f"{d}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + bytes(i % 10 + shift for i in range(n)))
for name, h, shift in (("good", 28, 0), ("big", 56, 0), ("labels", 28, 1)):
    split(f"{root}/{name}", "train", 64, 28, 28)
    split(f"{root}/{name}", "t10k", 10, h, h, shift)
PY
spec=$specs/lenet5-1.json
expect 0 "usage:" -h
expect 0 "usage:" --help
expect 2 "out of range" --model "$spec" --data "$tmp/good" --epochs 99999999999999999999
expect 2 "out of range" --model "$spec" --data "$tmp/good" --max-steps 99999999999999999999
expect 2 "--export" --model "$spec" --data "$tmp/good" --export /nonexistent/dir/w.safetensors
touch "$tmp/file"
expect 2 "--checkpoint-dir" --model "$spec" --data "$tmp/good" --checkpoint-dir "$tmp/file" \
    --checkpoint-on-exit
expect 2 "test samples are [56, 56]" --model "$spec" --data "$tmp/big"
expect 2 "test labels reach 10" --model "$spec" --data "$tmp/labels"
sed 's/"name": "conv2"/"name": "conv1"/' "$spec" >"$tmp/dup.json"
expect 2 "layer names must be unique" --model "$tmp/dup.json" --data "$tmp/good"
# And the good data trains, checkpoints into a new nested directory and exports.
expect 0 "exported weights" --model "$spec" --data "$tmp/good" --epochs 1 \
    --checkpoint-dir "$tmp/ck/a/b" --checkpoint-on-exit --export "$tmp/w.safetensors"
test -f "$tmp/ck/a/b/latest"
echo "all passed"
