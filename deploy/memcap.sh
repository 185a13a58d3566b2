#!/usr/bin/env bash
# memcap.sh BYTES COMMAND [ARGS...]: runs COMMAND under a memory cap of its own, BYTES
# (suffix K, M or G allowed), in a fresh group of the cgroup v1 memory controller. Under
# mpirun every rank gets its own group and so its own cap, the way a batch system caps
# each task of a job:
#
#   mpirun -np 4 deploy/memcap.sh 1536M build/bin/distdld --model ...
#
# The group is /sys/fs/cgroup/memory/distdl-memcap/<job>-<rank> (<job> from
# MEMCAP_JOB, default the parent's pid; <rank> from OMPI_COMM_WORLD_RANK, default 0).
# Swap is capped too where the kernel accounts it, so the cap is on RAM + swap. The
# engine sees the cap before it allocates (ddl_mem_available reads the group's limit and
# usage), so a model that cannot fit is refused with its estimate; what the group used at
# most stays readable in memory.max_usage_in_bytes until the group is removed (rmdir,
# when its processes have ended). Needs root and a writable v1 memory controller.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: memcap.sh BYTES COMMAND [ARGS...]" >&2; exit 2; }
cap="$1"
shift
case "$cap" in
    *[kK]) bytes=$(( ${cap%?} * 1024 )) ;;
    *[mM]) bytes=$(( ${cap%?} * 1024 * 1024 )) ;;
    *[gG]) bytes=$(( ${cap%?} * 1024 * 1024 * 1024 )) ;;
    *) bytes=$cap ;;
esac
[[ "$bytes" =~ ^[0-9]+$ ]] && [ "$bytes" -gt 0 ] ||
    { echo "memcap.sh: BYTES must be a positive number (K, M, G), got '$cap'" >&2; exit 2; }
root=/sys/fs/cgroup/memory
[ -w "$root" ] || { echo "memcap.sh: $root is not a writable cgroup v1 memory controller" >&2; exit 2; }
group="$root/distdl-memcap/${MEMCAP_JOB:-$PPID}-${OMPI_COMM_WORLD_RANK:-0}"
mkdir -p "$group"
echo "$bytes" > "$group/memory.limit_in_bytes"
if [ -e "$group/memory.memsw.limit_in_bytes" ]; then
    echo "$bytes" > "$group/memory.memsw.limit_in_bytes" 2>/dev/null || true
fi
echo $$ > "$group/cgroup.procs"
exec "$@"
