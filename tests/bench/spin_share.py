#!/usr/bin/python3
"""spin_share: the share of a training step a rank spends in sched_yield or futex calls,
from a perf record of bench-train-worker (docs/PERFORMANCE.md, "One owner of threads").

    perf record -g -e cpu-clock -F 499 -o spin.data -- \\
        mpirun --mca btl self,vader [--bind-to none] -np P build/bin/bench-train-worker \\
        --model deploy/specs/resnet-P.json --batch 64 --steps 20
    tests/bench/spin_share.py spin.data [SECONDS]

A sample counts as sched_yield (or futex) when its call chain holds that system call; the
total is every sample of the worker's threads (its own name and the pool's "ddl-pool").
With SECONDS (the time the worker prints for its timed steps), only each rank's last
SECONDS of samples count: the steps, without loading, set-up and data reading. Prints the
shares, then the threads with the most samples and their sched_yield share.
"""
import collections
import re
import subprocess
import sys

WORKER_COMMS = ("bench-train-wor", "ddl-pool")  # perf keeps 15 characters of a name
HEADER = re.compile(r"^\s*(\S+)\s+(\d+)/(\d+)\s+([\d.]+):\s*(.*)$")


def read_samples(data):
    """[comm, pid, tid, time, [frames]] for every sample of the record."""
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,ip,sym"],
                          capture_output=True, text=True, check=True).stdout
    samples = []
    for line in text.splitlines():
        m = HEADER.match(line)
        if m and not line.startswith("\t"):
            frames = [m.group(5)] if m.group(5) else []
            samples.append([m.group(1), m.group(2), m.group(3), float(m.group(4)), frames])
        elif line.strip() and samples:
            samples[-1][4].append(line.strip())
    return samples


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    samples = read_samples(sys.argv[1])
    worker = [s for s in samples if s[0] in WORKER_COMMS]
    if len(sys.argv) == 3:
        window = float(sys.argv[2])
        last = collections.defaultdict(float)
        for s in worker:
            last[s[1]] = max(last[s[1]], s[3])
        worker = [s for s in worker if s[3] >= last[s[1]] - window]
        print(f"window: the last {window:.2f} s of each rank (the timed steps)")
    total = max(len(worker), 1)
    kinds = collections.Counter()
    per_thread = collections.Counter()
    yield_thread = collections.Counter()
    for comm, pid, tid, _, frames in worker:
        chain = " ".join(frames)
        per_thread[(pid, tid, comm)] += 1
        if "sched_yield" in chain:
            kinds["sched_yield"] += 1
            yield_thread[(pid, tid, comm)] += 1
        elif "futex" in chain:
            kinds["futex"] += 1
        if "blas_thread_server" in chain or "exec_blas" in chain:
            kinds["OpenBLAS server"] += 1
    print(f"{sys.argv[1]}: {len(worker)} worker samples ({len(samples)} in all)")
    for k in ("sched_yield", "futex", "OpenBLAS server"):
        print(f"  {k:22s} {100.0 * kinds[k] / total:6.2f} %")
    both = kinds["sched_yield"] + kinds["futex"]
    print(f"  {'sched_yield + futex':22s} {100.0 * both / total:6.2f} %")
    for (pid, tid, comm), n in per_thread.most_common(6):
        print(f"  thread {pid}/{tid} {comm:16s} {100.0 * n / total:6.2f} % of samples, "
              f"in sched_yield {100.0 * yield_thread[(pid, tid, comm)] / total:6.2f} %")


if __name__ == "__main__":
    main()
