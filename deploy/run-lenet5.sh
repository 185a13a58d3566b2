#!/usr/bin/env bash
# The main job until the daemon lands: distributed LeNet-5 (DistDL's layout) on 4 ranks,
# trained for 5 epochs on Fashion-MNIST, with a checkpoint every epoch and the final
# weights exported as safetensors. Extra arguments go to distdl-train.
# Programs: $BUILD_DIR/bin, else build-release/bin (deploy/build.sh), else build/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/bindir.sh distdl-train
out="${OUT_DIR:-run}"
mkdir -p "$out"
flags=(--oversubscribe --mca btl self,vader --mca pml ob1 --mca btl_vader_single_copy_mechanism none
       --mca mpi_yield_when_idle 1)
if [ "$(id -u)" = 0 ]; then
    flags+=(--allow-run-as-root)
fi
exec mpirun -np 4 "${flags[@]}" "$bin/distdl-train" --model deploy/specs/lenet5-4.json \
    --data /usr/share/datasets/fashion-mnist --epochs 5 \
    --checkpoint-dir "$out/checkpoints" --checkpoint-every 937 \
    --export "$out/lenet5.safetensors" "$@"
