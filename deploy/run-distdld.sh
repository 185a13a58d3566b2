#!/usr/bin/env bash
# Starts distdld with distributed LeNet-5 on 4 ranks, serving on 127.0.0.1 (a free port,
# written to $OUT_DIR/distdld.addr), checkpointing into $OUT_DIR/checkpoints and resuming
# from there. Extra arguments go to distdld. Stop it with `kill -USR2 <mpirun pid>`,
# `kill -TERM <rank 0 pid>` (in the "listening on" line) or the Shutdown RPC; `kill -USR1
# <mpirun pid>` checkpoints. SIGTERM to mpirun works too (the sigkill timeout below gives the
# graceful shutdown time before mpirun escalates to SIGKILL), but mpirun then exits 1.
# Programs: $BUILD_DIR/bin, else build-release/bin (deploy/build.sh), else build/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/bindir.sh distdld
out="${OUT_DIR:-run}"
mkdir -p "$out"
# odls_base_sigkill_timeout: mpirun's kill sequence after a dead or aborting rank takes about
# twice this (docs/SERVER.md, rank faults), so 10 ends a faulty job in ~20 s; a SIGTERM to
# mpirun still leaves the graceful shutdown 10 s (grace 5 s + the final checkpoint).
flags=(--oversubscribe --mca btl self,vader --mca pml ob1 --mca btl_vader_single_copy_mechanism none
       --mca mpi_yield_when_idle 1 --mca odls_base_sigkill_timeout 10)
if [ "$(id -u)" = 0 ]; then
    flags+=(--allow-run-as-root)
fi
exec mpirun -np 4 "${flags[@]}" "$bin/distdld" --model deploy/specs/lenet5-4.json \
    --listen 127.0.0.1:0 --address-file "$out/distdld.addr" \
    --checkpoint-dir "$out/checkpoints" --resume "$@"
