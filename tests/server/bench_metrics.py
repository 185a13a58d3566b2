#!/usr/bin/python3
"""What --metrics-listen costs a Step: the same daemon (LeNet-5, 2 ranks) with and without
the metrics endpoint, N Step RPCs each from one Python client, rounds alternated; prints the
median and mean Step time of each, and rank 0's time in the per-command counter gather.

  bench_metrics.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] bench
Environment: BENCH_STEPS (default 300), BENCH_ROUNDS (default 2). On a shared machine
compare the per-round ratio (both daemons of a round run back to back) more than the totals.
"""
import os
import statistics
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from ddl_daemon import DaemonHarness, run_scenarios  # noqa: E402


def steps(h, metrics, n):
    import numpy as np
    import ddld_rpc
    args = ["--model", h.spec("lenet5-2.json")]
    maddr_file = os.path.join(h.work, "m%d.addr" % time.monotonic_ns())
    if metrics:
        args += ["--metrics-listen", "127.0.0.1:0", "--metrics-address-file", maddr_file]
    d = h.start(2, args, "bench")
    c = ddld_rpc.Client(d.address)
    tr = c.tr
    st = c.status()
    rs = np.random.RandomState(0)
    x = rs.rand(st.batch_size, *st.input_shape).astype(np.float32)
    y = rs.randint(0, st.num_classes, size=st.batch_size).astype(np.int64)
    b = tr.Batch(x=tr.Tensor(datatype="FP32", shape=list(x.shape), raw=x.tobytes()),
                 labels=tr.Tensor(datatype="INT64", shape=list(y.shape), raw=y.tobytes()))
    req = tr.StepRequest(batch=b)
    for _ in range(20):  # warm-up
        c.trainer("Step", req, "StepResponse")
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.trainer("Step", req, "StepResponse")
        t.append(time.perf_counter() - t0)
    gather = None
    if metrics:
        text = urllib.request.urlopen("http://%s/metrics" % open(maddr_file).read().strip(),
                                      timeout=10).read().decode()
        v = {l.split()[0]: float(l.split()[1]) for l in text.splitlines()
             if l.startswith("distdl_metrics_")}
        gather = v["distdl_metrics_collect_seconds_total"] / v["distdl_metrics_collections_total"]
    c.trainer("Shutdown", tr.ShutdownRequest(), "ShutdownResponse")
    d.wait_exit()
    return t, gather


def sc_bench(h):
    n = int(os.environ.get("BENCH_STEPS", "300"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    res = {False: [], True: []}
    gathers, ratios = [], []
    for i in range(rounds):
        med = {}
        # Alternate which goes first, so a load that rises or falls over a round hits both.
        for metrics in ((False, True) if i % 2 == 0 else (True, False)):
            t, g = steps(h, metrics, n)
            res[metrics] += t
            med[metrics] = statistics.median(t)
            if g is not None:
                gathers.append(g)
        ratios.append(med[True] / med[False])
        print("round %d: Step median off %.3f ms, on %.3f ms" %
              (i + 1, med[False] * 1e3, med[True] * 1e3), flush=True)
    for metrics in (False, True):
        t = res[metrics]
        print("metrics %-3s: Step median %.3f ms, mean %.3f ms (%d steps)" %
              ("on" if metrics else "off", statistics.median(t) * 1e3,
               statistics.mean(t) * 1e3, len(t)))
    print("on/off ratio of the round medians: median %.3f (min %.3f, max %.3f)" %
          (statistics.median(ratios), min(ratios), max(ratios)))
    print("rank 0 in the counter gather: %.1f us per command (mean of %d daemons; includes "
          "waiting for the slowest rank)" % (statistics.mean(gathers) * 1e6, len(gathers)))


if __name__ == "__main__":
    sys.exit(run_scenarios(DaemonHarness, {"bench": sc_bench}))
