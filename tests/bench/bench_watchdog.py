#!/usr/bin/python3
"""What the watchdog costs: Step RPC latency and Train throughput of distdld with
--watchdog 0 (MPI_THREAD_FUNNELED, no heartbeat thread: the daemon as it was before) and
--watchdog 60 (MPI_THREAD_MULTIPLE + the heartbeat thread), in alternating blocks of the
same run so the machine's load hits both alike.

  bench_watchdog.py --build B --source S --mpiexec M --mpi-flags "..." [--blocks 3]
                    [--steps 40] [--np 2]

Per block: a fresh daemon, 5 warm-up Steps, then --steps Step RPCs with the same inline
batch (median ms), and a Train of 4 x --steps steps (the daemon's own images/s, median of
its progress records). Prints the median over blocks of each and the ratio on/off.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from ddl_daemon import DaemonHarness, add_common_args  # noqa: E402

import ddld_rpc  # noqa: E402

SPECS = {2: "lenet5-2.json", 3: "mlp-3.json", 4: "lenet5-4.json"}


def block(h, np_, watchdog, steps):
    d = h.start(np_, ["--model", h.spec(SPECS[np_]), "--watchdog", str(watchdog)],
                "wd%d" % watchdog)
    c = ddld_rpc.Client(d.address)
    bs = 64
    x = os.urandom(bs * 28 * 28)
    labels = b"".join((i % 10).to_bytes(8, "little") for i in range(bs))
    b = c.tr.Batch(x=c.tr.Tensor(datatype="UINT8", shape=[bs, 1, 28, 28], raw=x),
                   labels=c.tr.Tensor(datatype="INT64", shape=[bs], raw=labels))
    req = c.tr.StepRequest(batch=b)
    times = []
    for i in range(5 + steps):
        t0 = time.perf_counter()
        c.trainer("Step", req, "StepResponse")
        if i >= 5:
            times.append(time.perf_counter() - t0)
    ips = [r.images_per_second for r in c.server_stream(
        "/distdl.v1.Trainer/Train", c.tr.TrainRequest(steps=4 * steps, progress_every=1),
        c.tr.TrainProgress) if not r.finished and r.images_per_second > 0]
    c.trainer("Shutdown", c.tr.ShutdownRequest(), "ShutdownResponse")
    d.wait_exit()
    c.ch.close()
    return statistics.median(times) * 1e3, statistics.median(ips)


def main():
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--np", type=int, default=2)
    a = p.parse_args()
    h = DaemonHarness(a, prefix="ddl-bench-wd-")
    res = {0: [], 60: []}
    try:
        for k in range(a.blocks):
            for wd in ((0, 60) if k % 2 == 0 else (60, 0)):
                ms, ips = block(h, a.np, wd, a.steps)
                res[wd].append((ms, ips))
                print("block %d --watchdog %2d: Step RPC %.2f ms median, Train %.0f img/s" %
                      (k, wd, ms, ips), flush=True)
    finally:
        h.cleanup()
    off_ms = statistics.median(r[0] for r in res[0])
    on_ms = statistics.median(r[0] for r in res[60])
    off_ips = statistics.median(r[1] for r in res[0])
    on_ips = statistics.median(r[1] for r in res[60])
    print("np %d, LeNet-5 batch 64: Step RPC %.2f ms (off) vs %.2f ms (on): ratio %.3f; "
          "Train %.0f vs %.0f img/s: ratio %.3f" %
          (a.np, off_ms, on_ms, on_ms / off_ms, off_ips, on_ips, on_ips / off_ips))


if __name__ == "__main__":
    main()
