"""distdld start-up and idle behaviour:
- command-line errors, an unreadable --model and a busy port end every rank with exit 2
  (no hang);
- --listen unix:PATH serves and writes unix:PATH to the address file;
- SIGUSR2 to mpirun stops the job gracefully (exit 0);
- idle is idle: a 4-rank daemon with a model loaded uses under 10% of one core in total
  (utime + stime of every rank from /proc over IDLE_SECONDS, default 10), where one rank
  spinning would cost 100%.

usage: cli_idle_test.py MPIEXEC [mpiexec flags...] -- DISTDLD SPEC4
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import grpc  # noqa: F401
except ImportError:
    print("SKIP: python3-grpcio is not installed")
    sys.exit(7)
import ddld_rpc  # noqa: E402


def run_expect(cmd, code, what):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode(errors="replace")
    msg = [l for l in out.splitlines() if l.startswith("distdld")]
    assert p.returncode == code, "%s: exit %d, expected %d\n%s" % (what, p.returncode, code, out)
    print("%s: exit %d after %.1f s: %s" % (what, code, time.time() - t0, msg[:2]))


def start(mpiexec, np_, args, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen([mpiexec[0], "-np", str(np_)] + mpiexec[1:] + args, stdout=log,
                            stderr=subprocess.STDOUT)
    return proc, log


def rank0_pid(log_path):
    for _ in range(200):
        m = re.search(r"listening on \S+ \(pid (\d+)\)", open(log_path).read())
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise AssertionError("no 'listening' line")


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], stdout=subprocess.PIPE)
    return [int(x) for x in out.stdout.split()]


def cpu_ticks(pids):
    total = 0
    for p in pids:
        with open("/proc/%d/stat" % p) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def main():
    sep = sys.argv.index("--")
    mpiexec = sys.argv[1:sep]
    distdld, spec4 = sys.argv[sep + 1], sys.argv[sep + 2]
    tmp = tempfile.mkdtemp(prefix="ddld-cli-")
    base = [mpiexec[0], "-np", "2"] + mpiexec[1:] + [distdld]
    run_expect(base + ["--bogus"], 2, "unknown option")
    run_expect(base + ["--queue", "0"], 2, "bad --queue")
    run_expect(base + ["--resume"], 2, "--resume without --checkpoint-dir")
    run_expect(base + ["--model", os.path.join(tmp, "none.json"), "--listen", "127.0.0.1:0"], 2,
               "missing --model file")
    run_expect(base + ["--model", spec4, "--listen", "127.0.0.1:0"], 2,
               "spec for another world size")

    # A unix socket; then the same port twice (the second must fail, not share it).
    sock = os.path.join(tmp, "s.sock")
    addr_file = os.path.join(tmp, "addr-unix")
    proc, log = start(mpiexec, 2, [distdld, "--listen", "unix:" + sock, "--address-file",
                                   addr_file], os.path.join(tmp, "log-unix"))
    try:
        addr = ddld_rpc.wait_address(addr_file, proc)
        assert addr == "unix:" + sock, addr
        c = ddld_rpc.Client(addr)
        assert c.health().status == c.he.HealthCheckResponse.SERVING
        c.ch.close()
        os.kill(rank0_pid(os.path.join(tmp, "log-unix")), signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()

    # Idle: 4 ranks with a model, measured from /proc.
    addr_file = os.path.join(tmp, "addr4")
    log_path = os.path.join(tmp, "log4")
    proc, log = start(mpiexec, 4, [distdld, "--listen", "127.0.0.1:0", "--address-file",
                                   addr_file, "--model", spec4], log_path)
    try:
        addr = ddld_rpc.wait_address(addr_file, proc)
        run_expect(base + ["--listen", addr], 2, "busy port")
        ranks = children(proc.pid)
        assert len(ranks) == 4, "expected 4 ranks under mpirun, got %s" % ranks
        secs = float(os.environ.get("IDLE_SECONDS", "10"))
        time.sleep(1)
        t0, c0 = time.time(), cpu_ticks(ranks + [proc.pid])
        time.sleep(secs)
        t1, c1 = time.time(), cpu_ticks(ranks + [proc.pid])
        pct = 100.0 * (c1 - c0) / os.sysconf("SC_CLK_TCK") / (t1 - t0)
        print("idle 4-rank daemon: %.2f%% of one core over %.0f s (4 ranks + mpirun)" %
              (pct, t1 - t0))
        # Idle is idle: each worker tests its pending broadcast ~100 times a second (about
        # 0.7% of a core each here); rank 0 and mpirun sleep in poll. Measured 1.9-2.4% in
        # all on a quiet AMD EPYC (a bound of 2% failed there). The cost of a wake-up is
        # the CPU's and the cache's, so a slower or busier machine pays more of it: the
        # bound is 10%, still a tenth of what one rank that spins instead of sleeping
        # costs (a whole core, 100%).
        assert pct < 10.0, "idle daemon uses %.2f%% of a core" % pct
        # SIGUSR2 to mpirun: forwarded to every rank at once; rank 0 shuts down gracefully.
        os.kill(proc.pid, signal.SIGUSR2)
        assert proc.wait(timeout=60) == 0, "mpirun exit %s after SIGUSR2" % proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
