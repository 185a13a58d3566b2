#!/usr/bin/env bash
# The main job: the distdld daemon on its built-in default (distributed LeNet-5 on 2 ranks,
# deploy/specs/lenet5-2.json, serving Debian's Fashion-MNIST), driven through the distdl
# command-line tool (docs/CLI.md): train for EPOCHS epochs (default 5) with a progress bar,
# report the test accuracy, predict a few test images (when python3-numpy is there to write
# them as .npy), pull the global weights into $OUT_DIR/weights.safetensors and shut the
# daemon down (final checkpoint in $OUT_DIR/checkpoints). Runs the programs of
# $BUILD_DIR/bin if BUILD_DIR is set, else of build-release/bin (deploy/build.sh makes it),
# else of build/bin (the test build of tests/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/bindir.sh distdld
[ -x "$bin/distdl" ] || { echo "run-main.sh: $bin/distdl is not built" >&2; exit 2; }
out="${OUT_DIR:-run}"
epochs="${EPOCHS:-5}"
mkdir -p "$out"
rm -f "$out/distdld.addr"
# odls_base_sigkill_timeout: mpirun's kill sequence after a dead or aborting rank takes about
# twice this (docs/SERVER.md, rank faults), so 10 ends a faulty job in ~20 s; a SIGTERM to
# mpirun still leaves the graceful shutdown 10 s (grace 5 s + the final checkpoint).
flags=(--oversubscribe --mca btl self,vader --mca pml ob1 --mca btl_vader_single_copy_mechanism none
       --mca mpi_yield_when_idle 1 --mca odls_base_sigkill_timeout 10)
if [ "$(id -u)" = 0 ]; then
    flags+=(--allow-run-as-root)
fi
mpirun -np 2 "${flags[@]}" "$bin/distdld" --model deploy/specs/lenet5-2.json \
    --listen 127.0.0.1:0 --address-file "$out/distdld.addr" \
    --checkpoint-dir "$out/checkpoints" >"$out/distdld.log" 2>&1 &
daemon=$!
# If the client fails, stop the daemon too (USR2 to mpirun is the daemon's clean stop).
trap 'kill -USR2 $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true' EXIT
echo "distdld ($bin): mpirun pid $daemon, log $out/distdld.log"
distdl=("$bin/distdl" --address-file "$out/distdld.addr")
# The daemon writes its address file once it serves; give it up to two minutes to start.
"${distdl[@]}" --timeout 120 health >/dev/null
"${distdl[@]}" status
"${distdl[@]}" train --epochs "$epochs"
"${distdl[@]}" eval
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    /usr/bin/python3 - "$out/test-images.npy" <<'PY'
import gzip, sys, numpy as np
with gzip.open("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz") as f:
    x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:8]
np.save(sys.argv[1], x)
PY
    "${distdl[@]}" predict --input "$out/test-images.npy" --output "$out/logits.npy"
fi
"${distdl[@]}" pull --output "$out/weights.safetensors"
"${distdl[@]}" shutdown
trap - EXIT
wait $daemon
echo "distdld exited 0 on every rank; weights in $out/weights.safetensors"
