#!/usr/bin/python3
"""Load and soak of a real 2-rank distdld, driven by build/bin/bench-load.

  load_test.py --build BUILD --source SRC [--mpiexec M] [--mpi-flags "..."] load|soak
               [--np 2] [--seconds D] [--clients N] [--connections C] [--queue Q]
               [--rss-slack-mb X] [--checkpoint] [-- extra bench-load arguments]

Starts `mpirun -np P distdld --model deploy/specs/lenet5-P.json` through the shared harness
(tests/support/ddl_daemon.py), runs bench-load against it with the ranks' pids (it samples
their /proc), then stops the daemon with SIGUSR2 to mpirun and requires every rank to exit
0. bench-load itself asserts the outcomes (see tests/bench/load_rpc.c): load -- only OK or
RESOURCE_EXHAUSTED, bitwise-stable predictions, the daemon healthy and rank 0's fds back
to their count after the clients left; soak -- fds and threads of every rank exactly
constant after the warm-up, RSS drift bounded.

Without --seconds the CI sizes run (load: 100 clients for 15 s; soak: 45 s). The full
sizes: `load --seconds 60` and `soak --seconds 600 --checkpoint` (docs/SERVER.md, "Load and
soak"). Exit status: 0 pass, 1 fail, 7 skip.
"""
import argparse
import os
import shutil
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ddl_daemon import SANITIZER, DaemonHarness, Failure, FMNIST, Skip, add_common_args  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("mode", choices=["load", "soak"])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--seconds", type=float)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--connections", type=int, default=0)
    p.add_argument("--queue", type=int, default=0, help="daemon --queue (0: its default, 64)")
    p.add_argument("--rss-slack-mb", type=float)
    p.add_argument("--checkpoint", action="store_true",
                   help="soak: a Checkpoint every 5th cycle into a temporary directory")
    p.add_argument("extra", nargs="*", help="more bench-load arguments (after --)")
    a = p.parse_args()
    h = DaemonHarness(a, prefix="ddl-load-")
    bench = os.path.join(a.build, "bin", "bench-load")
    if not os.path.exists(h.distdld) or not os.path.exists(bench):
        print("SKIP: distdld or bench-load is not built")
        return 7
    if not os.path.exists(os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz")):
        print("SKIP: no Fashion-MNIST under %s" % FMNIST)
        return 7
    try:
        spec = h.spec("lenet5-%d.json" % a.np)
        if not os.path.exists(spec):
            raise Skip("no spec %s" % spec)
        args = ["--model", spec]
        if a.queue:
            args += ["--queue", str(a.queue)]
        ckpt = None
        if a.mode != "load" and a.checkpoint:
            # Checkpoint directories are confined to the daemon's --checkpoint-dir.
            ckpt = os.path.join(h.work, "ckpt-%s" % a.mode)
            os.makedirs(ckpt)
            args += ["--checkpoint-dir", ckpt]
        d = h.start(a.np, args, a.mode)
        pids = d.rank_pids()
        if sorted(pids.values()) != list(range(a.np)):
            raise Failure("found ranks %s among mpirun's children, expected 0..%d" %
                          (sorted(pids.values()), a.np - 1))
        by_rank = ",".join(str(pid) for pid, _ in sorted(pids.items(), key=lambda kv: kv[1]))
        cmd = [bench, "--address", d.address, "--rank-pids", by_rank]
        if a.mode == "load":
            seconds = a.seconds or 15
            cmd += ["--clients", str(a.clients), "--seconds", str(seconds)]
            if a.connections:
                cmd += ["--connections", str(a.connections)]
            timeout = seconds + 240
        else:
            seconds = a.seconds or 45
            cmd += ["--seconds", str(seconds)]
            if SANITIZER:  # ASan's quarantine grows RSS: reported, not judged
                cmd += ["--rss-slack-mb", "1e9"]
            elif a.rss_slack_mb is not None:
                cmd += ["--rss-slack-mb", str(a.rss_slack_mb)]
            if ckpt is not None:
                cmd += ["--checkpoint-dir", ckpt]
            timeout = seconds + 300
        cmd += a.extra
        h.run(d, cmd + ["load" if a.mode == "load" else "soak"], timeout=timeout)
        # The outside way to stop the job: SIGUSR2 to mpirun, forwarded to every rank.
        os.kill(d.proc.pid, signal.SIGUSR2)
        d.wait_exit()
    except Skip as e:
        print("SKIP: %s" % e, flush=True)
        return 7
    except Failure as e:
        print("FAIL: %s: %s" % (a.mode, e), flush=True)
        return 1
    finally:
        h.cleanup()
    shutil.rmtree(h.work, ignore_errors=True)  # the daemon's log and checkpoints
    print("PASS: %s" % a.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
