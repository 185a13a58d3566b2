"""Tests of deploy/distdld-run against a real 2-rank distdld (scenarios, one ctest each):

  restart   train, SIGKILL rank 1: the job fails, the wrapper restarts it with --resume and
            the new daemon starts at the durable step; SIGUSR1 to the wrapper checkpoints;
            SIGTERM to the wrapper: final checkpoint, exit 0, no distdld process left
  exhaust   --max-restarts 1 and two rank kills: the wrapper gives up, exit 1, says why
  shutdown  the Shutdown RPC ends the job with 0: the wrapper exits 0 without a restart
  orphan    kill -9 of the wrapper itself: mpirun gets SIGUSR2 (parent-death signal) and the
            job stops gracefully with a final checkpoint; nothing is left running
  flags     bad command lines exit 2 with a message; the mpirun flags chosen for the host
            (--dry-run); a distdld usage error (its exit 2) is not restarted

Every client call goes through deploy_client.run_client (the one switch to the CLI).
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from ddl_daemon import DaemonHarness, Failure, FMNIST, run_scenarios  # noqa: E402
from deploy_client import run_client  # noqa: E402


def proc_children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def our_distdld_pids(marker):
    """distdld and mpirun processes whose command line names `marker` (this test's temp dir)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd and ("distdld " in cmd or "mpirun" in cmd) and "distdld-run" not in cmd:
                pids.append(int(d))
    return pids


class Wrapper:
    """deploy/distdld-run with a 2-rank LeNet-5 daemon, its log in the test's directory."""

    def __init__(self, h, name, max_restarts, extra=(), wrapper_args=()):
        self.h = h
        self.dir = os.path.join(h.work, name)
        os.makedirs(self.dir)
        self.addr = os.path.join(self.dir, "addr")
        self.ck = os.path.join(self.dir, "ck")
        self.log_path = os.path.join(self.dir, "wrapper.log")
        self.cmd = [h.wrapper, "--np", "2", "--model", h.spec("lenet5-2.json"),
                    "--checkpoint-dir", self.ck, "--address-file", self.addr,
                    "--max-restarts", str(max_restarts), "--mpirun", h.mpiexec,
                    "--distdld", h.distdld] + list(wrapper_args) + [
                    "--", "--data-root", FMNIST] + list(extra)
        print("$ " + " ".join(shlex.quote(c) for c in self.cmd), flush=True)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        h.wrappers.append(self)

    def wait_address(self, timeout=90):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                self.dump()
                raise Failure("distdld-run exited with %d before the daemon served" % self.proc.returncode)
            try:
                with open(self.addr) as f:
                    if f.read().strip():
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        self.dump()
        raise Failure("no address in %s after %d s" % (self.addr, timeout))

    def mpirun_pid(self):
        kids = proc_children(self.proc.pid)
        if len(kids) != 1:
            raise Failure("distdld-run has %d children, expected one mpirun" % len(kids))
        return kids[0]

    def kill_rank(self, rank):
        mpirun = self.mpirun_pid()
        for pid in proc_children(mpirun):
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
                print("kill -9 rank %d (pid %d, mpirun %d)" % (rank, pid, mpirun), flush=True)
                os.kill(pid, signal.SIGKILL)
                return time.time()
        raise Failure("rank %d of mpirun %d not found" % (rank, mpirun))

    def wait_restart(self, n, timeout=120):
        """Waits for the n-th restart's daemon to serve (the wrapper removes the address file)."""
        end = time.time() + timeout
        while time.time() < end:
            # The wrapper removes the address file when a job ends, before "start n+1".
            if ("start %d of" % (n + 1)) in self.text() and os.path.exists(self.addr):
                return self.wait_address(max(1, end - time.time()))
            if self.proc.poll() is not None:
                self.dump()
                raise Failure("distdld-run exited with %d instead of restart %d" % (self.proc.returncode, n))
            time.sleep(0.2)
        self.dump()
        raise Failure("no restart %d within %d s" % (n, timeout))

    def wait_exit(self, timeout=120):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.dump()
            raise Failure("distdld-run still running after %d s" % timeout)
        self.log.close()
        return rc

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def dump(self):
        print("---- distdld-run log ----\n%s---- end ----" % self.text()[-6000:], flush=True)

    def status(self):
        rc, st = run_client(self.h.build, self.addr, "status")
        if rc != 0 or st is None:
            raise Failure("status failed (exit %d)" % rc)
        return st

    def train(self, steps):
        rc, _ = run_client(self.h.build, self.addr, "train", steps=steps)
        if rc != 0:
            self.dump()
            raise Failure("train %d steps failed (exit %d)" % (steps, rc))

    def latest(self):
        with open(os.path.join(self.ck, "latest")) as f:
            return f.read().strip()


class H(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-deploy-run-")
        self.wrapper = os.path.join(a.source, "deploy", "distdld-run")
        self.wrappers = []

    def cleanup(self):
        for w in self.wrappers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGKILL)
                w.proc.wait()
        for pid in our_distdld_pids(self.work):  # the parent-death signal should have done it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        super().cleanup()
        if not os.environ.get("DDL_KEEP_TMP"):  # the logs were printed; DDL_KEEP_TMP=1 keeps them
            shutil.rmtree(self.work, ignore_errors=True)


def expect(cond, what):
    if not cond:
        raise Failure(what)
    print("ok: " + what, flush=True)


def scenario_restart(h):
    w = Wrapper(h, "restart", max_restarts=2, extra=["--checkpoint-every", "5"])
    w.wait_address()
    w.train(12)
    before = w.status()
    expect(before["step"] == 12 and before["durable_step"] == 10,
           "before the kill: step %d, durable step %d (12 and 10 expected)" %
           (before["step"], before["durable_step"]))
    t_kill = w.kill_rank(1)
    w.wait_restart(1)
    print("restarted and serving %.1f s after the kill" % (time.time() - t_kill), flush=True)
    after = w.status()
    expect(after["step"] >= before["durable_step"] and after["step"] == after["durable_step"],
           "the restarted daemon resumed at step %d (durable before the kill: %d)" %
           (after["step"], before["durable_step"]))
    expect("--resume" in w.text().split("start 2 of")[1].split("\n")[0],
           "the restart ran distdld with --resume")
    w.train(3)
    os.kill(w.proc.pid, signal.SIGUSR1)
    end = time.time() + 30
    while time.time() < end and w.status()["durable_step"] != after["step"] + 3:
        time.sleep(0.5)
    expect(w.status()["durable_step"] == after["step"] + 3,
           "SIGUSR1 to the wrapper made step %d durable" % (after["step"] + 3))
    w.train(2)
    final = after["step"] + 5
    pids = our_distdld_pids(h.work)
    expect(len(pids) == 3, "mpirun and 2 ranks run before the stop (%s)" % pids)
    os.kill(w.proc.pid, signal.SIGTERM)
    rc = w.wait_exit(90)
    expect(rc == 0, "SIGTERM to the wrapper: exit %d (0 expected)" % rc)
    expect(w.latest() == "step-%09d" % final, "final checkpoint %s is latest" % w.latest())
    expect("graceful stop" in w.text() and "restart 2 of" not in w.text(),
           "graceful stop logged, no restart after the stop")
    time.sleep(0.5)
    left = our_distdld_pids(h.work)
    expect(not left, "no distdld or mpirun process left (%s)" % left)


def scenario_exhaust(h):
    # After a rank's death mpirun ends the job in 2 x --sigkill-timeout (the wrapper's 5 s
    # default: 10 s idle per kill; restart shows that path): 1 here, the restarts are the point.
    w = Wrapper(h, "exhaust", max_restarts=1, extra=["--checkpoint-every", "2"],
                wrapper_args=["--sigkill-timeout", "1"])
    w.wait_address()
    w.train(4)
    w.kill_rank(1)
    w.wait_restart(1)
    expect(w.status()["step"] == 4, "restart 1 resumed at step 4")
    w.kill_rank(1)
    rc = w.wait_exit(120)
    text = w.text()
    print(text[-1500:])
    expect(rc == 1, "restarts used up: distdld-run exit %d (1 expected)" % rc)
    expect("giving up" in text and "--max-restarts" in text, "it says it gives up and why")
    left = our_distdld_pids(h.work)
    expect(not left, "no distdld or mpirun process left (%s)" % left)


def scenario_shutdown(h):
    w = Wrapper(h, "shutdown", max_restarts=3)
    w.wait_address()
    rc, _ = run_client(h.build, w.addr, "shutdown")
    expect(rc == 0, "Shutdown RPC answered")
    rc = w.wait_exit(90)
    expect(rc == 0, "the wrapper exits %d after a clean shutdown (0 expected)" % rc)
    expect("clean shutdown" in w.text() and "restart 1 of" not in w.text(), "and does not restart")


def scenario_orphan(h):
    w = Wrapper(h, "orphan", max_restarts=3)
    w.wait_address()
    w.train(3)
    mpirun = w.mpirun_pid()
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait()
    print("kill -9 distdld-run (pid %d); its mpirun %d must stop by itself" % (w.proc.pid, mpirun), flush=True)
    end = time.time() + 60
    while time.time() < end and our_distdld_pids(h.work):
        time.sleep(0.2)
    left = our_distdld_pids(h.work)
    expect(not left, "the parent-death SIGUSR2 stopped mpirun and both ranks (left: %s)" % left)
    expect(w.latest() == "step-%09d" % 3, "and the graceful stop wrote the final checkpoint %s" % w.latest())


def run_wrapper(h, args, env_extra=None):
    env = dict(os.environ)
    env.pop("DISTDLD_HOSTFILE", None)
    env.pop("DISTDLD_MPIRUN_FLAGS", None)
    env.update(env_extra or {})
    cmd = [h.wrapper] + args
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    print(r.stdout + r.stderr, end="", flush=True)
    return r


def scenario_flags(h):
    spec = h.spec("lenet5-2.json")
    base = ["--mpirun", h.mpiexec, "--distdld", h.distdld]
    bad = [
        (["--model", spec], "--np"),
        (["--np", "0", "--model", spec], "--np: needs a whole number >= 1"),
        (["--np", "two", "--model", spec], "needs a whole number"),
        (["--np", "2", "--model", "/nonexistent.json"], "no such file"),
        (["--np", "2", "--model", spec, "--max-restarts", "-1"], "--max-restarts"),
        (["--np", "2", "--model", spec, "--bogus"], "unrecognized arguments: --bogus"),
        (["--np", "2", "--model", spec, "stray"], "distdld options go after --"),
        (["--np", "2", "--model", spec, "--", "--resume"], "give --resume to distdld-run"),
        (["--np", "2", "--model", spec, "--resume"], "--resume needs --checkpoint-dir"),
        (["--np", "2", "--model", spec, "--hostfile", "/nonexistent"], "hostfile /nonexistent"),
        (["--np", "2", "--model", spec, "--mpirun", "/nonexistent/mpirun"], "--mpirun /nonexistent/mpirun"),
    ]
    for args, msg in bad:
        r = run_wrapper(h, (base if "--mpirun" not in args else ["--distdld", h.distdld]) + args)
        expect(r.returncode == 2 and msg in r.stderr and not r.stdout,
               "bad flags %s: exit %d, message names '%s'" % (args, r.returncode, msg))
    cores = len(os.sched_getaffinity(0))
    r = run_wrapper(h, base + ["--np", str(cores), "--model", spec, "--dry-run"])
    cmd = r.stdout.split()
    expect(r.returncode == 0 and "--oversubscribe" not in cmd and "self,vader" in cmd,
           "np = cores (%d): one host over shared memory, no --oversubscribe" % cores)
    expect(("--allow-run-as-root" in cmd) == (os.geteuid() == 0), "--allow-run-as-root exactly as root")
    r = run_wrapper(h, base + ["--np", str(cores + 1), "--model", spec, "--checkpoint-dir", h.work,
                               "--resume", "--dry-run", "--", "--checkpoint-every", "7"],
                    env_extra={"DISTDLD_MPIRUN_FLAGS": "--mca foo_bar 1"})
    cmd = r.stdout.split()
    expect(r.returncode == 0 and "--oversubscribe" in cmd and "mpi_yield_when_idle" in cmd,
           "np = cores + 1: --oversubscribe and mpi_yield_when_idle")
    expect(cmd[-3:] == ["--resume", "--checkpoint-every", "7"], "--resume and the options after -- reach distdld")
    expect("foo_bar" in cmd, "$DISTDLD_MPIRUN_FLAGS is appended")
    hostfile = os.path.join(h.work, "hosts")
    with open(hostfile, "w") as f:
        f.write("localhost slots=2\n")
    r = run_wrapper(h, base + ["--np", "2", "--model", spec, "--dry-run"],
                    env_extra={"DISTDLD_HOSTFILE": hostfile})
    cmd = r.stdout.split()
    expect(r.returncode == 0 and cmd[cmd.index("--hostfile") + 1] == hostfile and "self,vader" not in cmd,
           "$DISTDLD_HOSTFILE: --hostfile, no single-host transport")
    # distdld's own usage error: every rank exits 2; restarting cannot help.
    r = run_wrapper(h, base + ["--np", "2", "--model", spec, "--max-restarts", "3", "--", "--queue", "0"])
    expect(r.returncode == 1 and "usage error of distdld" in r.stderr and "restart 1 of" not in r.stderr,
           "a distdld usage error is not restarted: exit %d" % r.returncode)


SCENARIOS = {"restart": scenario_restart, "exhaust": scenario_exhaust,
             "shutdown": scenario_shutdown, "orphan": scenario_orphan, "flags": scenario_flags}

if __name__ == "__main__":
    sys.exit(run_scenarios(H, SCENARIOS))
