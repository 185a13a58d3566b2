#!/usr/bin/env bash
# The main job: the distdld daemon on its built-in default (distributed LeNet-5 on 2 ranks,
# deploy/specs/lenet5-2.json, serving Debian's Fashion-MNIST), driven through the C client:
# ddl_example_train trains for EPOCHS epochs (default 5) with a progress bar, reports the
# test accuracy, predicts a few test images, pulls the global weights into
# $OUT_DIR/weights.safetensors and shuts the daemon down (final checkpoint in
# $OUT_DIR/checkpoints). Expects a build in ./build (tests/run.sh -N makes one).
set -euo pipefail
cd "$(dirname "$0")/.."
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
mpirun -np 2 "${flags[@]}" build/bin/distdld --model deploy/specs/lenet5-2.json \
    --listen 127.0.0.1:0 --address-file "$out/distdld.addr" \
    --checkpoint-dir "$out/checkpoints" >"$out/distdld.log" 2>&1 &
daemon=$!
# If the client fails, stop the daemon too (USR2 to mpirun is the daemon's clean stop).
trap 'kill -USR2 $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true' EXIT
echo "distdld: mpirun pid $daemon, log $out/distdld.log"
build/bin/ddl_example_train --address-file "$out/distdld.addr" --epochs "$epochs" \
    --predict 8 --pull "$out/weights.safetensors" --shutdown
trap - EXIT
wait $daemon
echo "distdld exited 0 on every rank; weights in $out/weights.safetensors"
