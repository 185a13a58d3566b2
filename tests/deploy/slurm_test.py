"""deploy/slurm/distdld.sbatch under a real one-node Slurm that this test sets up and tears down.

In a temp dir: a munge key, munged (as the munge user, its socket/pid/log there), a slurm.conf
for this host (free ports, linuxproc proctrack, no task plugin: no cgroups needed), slurmctld
-D and slurmd -D. Then `sbatch` the script, wait for rank 0's address in the submit
directory, train through the client, `scancel --batch --signal=USR1` (what --signal=B:USR1@120
does before the time limit: the signal reaches the batch shell only) -> a durable checkpoint,
train more, `scancel` -> the final checkpoint at the last step, the job CANCELLED, no distdld
process left (scenario batch). Scenario timelimit: `--time=1 --signal=B:USR1@45`, so Slurm
itself signals the batch shell before the limit (a checkpoint), and the limit's SIGTERM
leaves the final checkpoint; the job ends TIMEOUT. Scenario requeue: `scontrol requeue`
leaves a final checkpoint and the job's next run resumes from it. Skips (7) only when the Slurm or munge
daemons cannot run here, with the reason.

Every client call goes through deploy_client.run_client (the one switch to the CLI).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from ddl_daemon import DaemonHarness, Failure, Skip, free_port, run_scenarios  # noqa: E402
from deploy_client import run_client  # noqa: E402
from distdld_run_test import our_distdld_pids, expect  # noqa: E402

NEEDED = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol"]


def tail(path, n=2500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError as e:
        return "(%s)" % e


class Slurm:
    """munged + slurmctld + slurmd for this host, all files under `root`."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.munge_dir = os.path.join(root, "munge")
        self.sock = os.path.join(self.munge_dir, "munge.socket")

    def cmd(self, argv, check=True, timeout=30, cwd=None):
        r = subprocess.run(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout, cwd=cwd)
        if check and r.returncode != 0:
            raise Failure("%s exited %d: %s" % (" ".join(argv), r.returncode, r.stdout.strip()))
        return r.stdout

    def start_munge(self):
        keydir = os.path.join(self.root, "munge-key")
        key = os.path.join(keydir, "munge.key")
        os.makedirs(keydir)
        os.makedirs(self.munge_dir)
        subprocess.run(["mungekey", "--create", "--keyfile", key], check=True)
        for d in (keydir, self.munge_dir):
            shutil.chown(d, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        os.chmod(keydir, 0o700)
        os.chmod(key, 0o400)
        os.chmod(self.munge_dir, 0o755)  # the socket's directory: every user reaches it
        log = os.path.join(self.munge_dir, "munged.log")
        r = subprocess.run(["runuser", "-u", "munge", "--", shutil.which("munged"), "--socket", self.sock,
                            "--key-file", key, "--pid-file", os.path.join(self.munge_dir, "munged.pid"),
                            "--log-file", log, "--seed-file", os.path.join(self.munge_dir, "munged.seed")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise Skip("munged cannot start here (exit %d): %s %s" % (r.returncode, r.stdout.strip(), tail(log, 600)))
        enc = subprocess.run(["munge", "-n", "-S", self.sock], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        dec = subprocess.run(["unmunge", "-S", self.sock], input=enc.stdout, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=False)
        if dec.returncode != 0:
            raise Skip("munged runs but a credential does not round-trip: %s" % dec.stderr.decode().strip())
        print("munged up (socket %s)" % self.sock, flush=True)

    def write_conf(self):
        host = socket.gethostname().split(".")[0]
        cpus = os.cpu_count() or 1
        with open("/proc/meminfo") as f:
            mem_mb = int(f.readline().split()[1]) // 1024
        for d in ("state", "spool", "log"):
            os.makedirs(os.path.join(self.root, d))
        r = self.root
        text = """# one-node cluster written by tests/deploy/slurm_test.py
ClusterName=ddltest
SlurmctldHost={host}
SlurmctldPort={p1}
SlurmdPort={p2}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
KillWait=30
NodeName={host} CPUs={cpus} RealMemory={mem} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""".format(host=host, p1=free_port(), p2=free_port(), sock=self.sock, r=r, cpus=cpus,
           mem=max(1, mem_mb * 8 // 10))
        with open(self.conf, "w") as f:
            f.write(text)
        print(text, flush=True)

    def start_daemon(self, name):
        out = open(os.path.join(self.root, "log", name + ".out"), "w")
        p = subprocess.Popen([shutil.which(name), "-D", "-f", self.conf], env=self.env, stdout=out,
                             stderr=subprocess.STDOUT)
        p.name = name
        self.procs.append(p)
        return p

    def start(self):
        self.start_munge()
        self.write_conf()
        ctld = self.start_daemon("slurmctld")
        time.sleep(1)
        slurmd = self.start_daemon("slurmd")
        end = time.time() + 60
        state = ""
        while time.time() < end:
            for p in (ctld, slurmd):
                if p.poll() is not None:
                    raise Skip("%s cannot run here (exit %d); its log:\n%s" %
                               (p.name, p.returncode, tail(os.path.join(self.root, "log", p.name + ".log"))))
            state = self.cmd(["sinfo", "-h", "-o", "%T"], check=False).strip()
            if state == "idle":
                print("slurm up: node idle after %.1f s" % (60 - (end - time.time())), flush=True)
                return
            time.sleep(0.5)
        raise Skip("the node did not become idle within 60 s (sinfo: %r); slurmd log:\n%s\nslurmctld log:\n%s" %
                   (state, tail(os.path.join(self.root, "log", "slurmd.log")),
                    tail(os.path.join(self.root, "log", "slurmctld.log"))))

    def job_state(self, job):
        out = self.cmd(["scontrol", "show", "job", str(job)], check=False)
        for tok in out.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return "?"

    def stop(self):
        if any(p.poll() is None for p in self.procs):
            self.cmd(["scancel", "--full", "--user=root"], check=False)  # nothing left running
        for p in reversed(self.procs):  # slurmd, then slurmctld
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        pidfile = os.path.join(self.munge_dir, "munged.pid")
        if os.path.exists(pidfile):
            with open(pidfile) as f:
                pid = int(f.read().strip())
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print("slurm and munge stopped", flush=True)


class H(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-deploy-slurm-")
        os.chmod(self.work, 0o755)  # munged (user munge) must reach its socket below it
        self.slurm = None

    def cleanup(self):
        if self.slurm:
            self.slurm.stop()
        for pid in our_distdld_pids(self.work):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        super().cleanup()
        if not os.environ.get("DDL_KEEP_TMP"):  # the logs were printed; DDL_KEEP_TMP=1 keeps them
            shutil.rmtree(self.work, ignore_errors=True)


def start_slurm(h):
    missing = [n for n in NEEDED if shutil.which(n) is None]
    if missing:
        raise Skip("not installed: %s (apt-get install slurm-wlm munge)" % " ".join(missing))
    if os.geteuid() != 0:
        raise Skip("needs root: slurmd runs as root here and munged as the munge user")
    h.slurm = s = Slurm(os.path.join(h.work, "slurm"))
    os.makedirs(s.root)
    s.start()
    return s


# Slurm's SIGTERM (scancel, the time limit, a requeue) reaches every process of the job,
# mpirun too: the daemon stops gracefully (final checkpoint) in about a second, but mpirun then
# runs its own kill sequence, 2 x odls_base_sigkill_timeout, on ranks already gone -- 20 s with
# the script's default of 10, once per stop. The batch scenario keeps that default; timelimit
# and requeue (three stops) pass DISTDLD_SIGKILL_TIMEOUT=3: 6 s, still far more than the final
# checkpoint takes.
QUICK_SIGKILL = 3


class Job:
    """deploy/slurm/distdld.sbatch submitted from a fresh submit directory."""

    def __init__(self, h, s, extra=(), sigkill=None):
        """sigkill: DISTDLD_SIGKILL_TIMEOUT for the script (None: its default, 10 s)."""
        self.h, self.s = h, s
        self.script = os.path.join(h.source, "deploy", "slurm", "distdld.sbatch")
        self.submit = os.path.join(h.work, "submit")
        os.makedirs(self.submit)
        self.addr = os.path.join(self.submit, "distdld.addr")
        self.ck = os.path.join(self.submit, "checkpoints")
        # Submitted from `submit`: that is $SLURM_SUBMIT_DIR, where the address file appears.
        export = "ALL,DISTDL_PREFIX=%s,DISTDLD_BIN=%s" % (h.source, h.distdld)
        if sigkill is not None:
            export += ",DISTDLD_SIGKILL_TIMEOUT=%d" % sigkill
        argv = ["sbatch", "--parsable", "--time=10", "--export=" + export] + list(extra)
        if (os.cpu_count() or 1) < 2:
            argv.append("--overcommit")
        print("$ " + " ".join(argv + [self.script]), flush=True)
        self.id = s.cmd(argv + [self.script], cwd=self.submit).strip().split(";")[0]
        self.t0 = time.time()
        print("submitted job %s" % self.id, flush=True)
        self.log = os.path.join(self.submit, "distdld-%s.log" % self.id)

    def wait_serving(self):
        end = time.time() + 120
        while time.time() < end and not os.path.exists(self.addr):
            st = self.s.job_state(self.id)
            if st not in ("PENDING", "RUNNING", "CONFIGURING"):
                raise Failure("job %s is %s before serving; its log:\n%s" % (self.id, st, tail(self.log)))
            time.sleep(0.5)
        if not os.path.exists(self.addr):
            raise Failure("no %s after 120 s; job log:\n%s" % (self.addr, tail(self.log)))
        with open(self.addr) as f:
            served = f.read().strip()
        expect(not served.startswith("0.0.0.0") and ":" in served,
               "rank 0's address %s is in the submit directory, naming this node" % served)
        expect(self.s.job_state(self.id) == "RUNNING", "job %s is RUNNING" % self.id)

    def status(self):
        rc, st = run_client(self.h.build, self.addr, "status")
        if rc != 0 or st is None:
            raise Failure("status failed (exit %d); job log:\n%s" % (rc, tail(self.log)))
        return st

    def train(self, steps):
        rc, _ = run_client(self.h.build, self.addr, "train", steps=steps)
        expect(rc == 0, "trained %d steps through the client" % steps)

    def wait_durable(self, step, timeout):
        end = time.time() + timeout
        while time.time() < end and self.status()["durable_step"] != step:
            time.sleep(0.5)
        return self.status()["durable_step"] == step

    def wait_gone(self, timeout):
        end = time.time() + timeout
        while time.time() < end and self.s.cmd(["squeue", "-h", "-j", self.id], check=False).strip():
            time.sleep(0.5)
        text = tail(self.log, 100000)
        print("---- job log ----\n%s---- end ----" % text, flush=True)
        return text

    def latest(self):
        with open(os.path.join(self.ck, "latest")) as f:
            return f.read().strip()

    def nothing_left(self):
        expect(not os.path.exists(self.addr), "the address file is gone with the job")
        time.sleep(1)
        left = our_distdld_pids(self.h.work)
        expect(not left, "no distdld or mpirun process left (%s)" % left)


def scenario_batch(h):
    script = os.path.join(h.source, "deploy", "slurm", "distdld.sbatch")
    with open(script) as f:
        directives = [l.split(None, 1)[1].strip() for l in f if l.startswith("#SBATCH")]
    expect("--signal=B:USR1@120" in directives and "--requeue" in directives,
           "the script asks for USR1 to the batch shell 120 s before the limit, and --requeue")
    s = start_slurm(h)
    j = Job(h, s)
    j.wait_serving()
    j.train(6)
    s.cmd(["scancel", "--batch", "--signal=USR1", j.id])
    expect(j.wait_durable(6, 30), "USR1 to the batch shell: step 6 is durable")
    j.train(4)
    expect(j.status()["step"] == 10, "at step 10")
    t0 = time.time()
    s.cmd(["scancel", j.id])
    text = j.wait_gone(90)
    print("job %s left the queue %.1f s after scancel" % (j.id, time.time() - t0), flush=True)
    expect(s.job_state(j.id) == "CANCELLED", "job %s is CANCELLED" % j.id)
    expect(j.latest() == "step-000000010", "the final checkpoint %s is latest" % j.latest())
    expect("SIGUSR1: checkpoint now" in text and "SIGTERM: graceful stop" in text,
           "the batch shell trapped USR1 and TERM and forwarded them")
    j.nothing_left()


def scenario_timelimit(h):
    """The real time-limit path: --time=1 with --signal=B:USR1@45 (the script's @120 needs a
    limit of more than 2 minutes): Slurm itself signals the batch shell before the limit,
    the daemon checkpoints, then the limit's SIGTERM brings the final checkpoint."""
    s = start_slurm(h)
    j = Job(h, s, extra=["--time=1", "--signal=B:USR1@45"], sigkill=QUICK_SIGKILL)
    j.wait_serving()
    j.train(5)
    # Slurm sends the signal from its periodic time-limit check: 15-45 s after the start.
    expect(j.wait_durable(5, 75 - (time.time() - j.t0)),
           "Slurm's USR1 before the time limit made step 5 durable (%.0f s after submit)" % (time.time() - j.t0))
    j.train(2)
    text = j.wait_gone(150)
    print("job %s ended %.1f s after submit" % (j.id, time.time() - j.t0), flush=True)
    expect(s.job_state(j.id) == "TIMEOUT", "job %s ended by its time limit (TIMEOUT)" % j.id)
    expect("SIGUSR1: checkpoint now" in text and "SIGTERM: graceful stop" in text,
           "the batch shell got USR1 before the limit and SIGTERM at it")
    expect(j.latest() == "step-000000007", "the final checkpoint %s is latest" % j.latest())
    j.nothing_left()


def scenario_requeue(h):
    """--requeue: `scontrol requeue` stops the job (final checkpoint), Slurm queues it again,
    and the next run resumes from latest. Slurm holds a requeued job back (BeginTime, about
    2 minutes here); the test releases it at once with `scontrol update StartTime=now`."""
    s = start_slurm(h)
    j = Job(h, s, sigkill=QUICK_SIGKILL)
    j.wait_serving()
    j.train(4)
    s.cmd(["scontrol", "requeue", j.id])
    end = time.time() + 90
    while time.time() < end and s.job_state(j.id) != "PENDING":
        time.sleep(0.5)
    expect(s.job_state(j.id) == "PENDING", "requeued: job %s is PENDING again" % j.id)
    expect(j.latest() == "step-000000004", "the requeue's SIGTERM left the final checkpoint %s" % j.latest())
    s.cmd(["scontrol", "update", "JobId=%s" % j.id, "StartTime=now"])
    j.wait_serving()
    st = j.status()
    expect(st["step"] == 4 and st["durable_step"] == 4, "the second run resumed at step %d" % st["step"])
    s.cmd(["scancel", j.id])
    text = j.wait_gone(90)
    expect("restart count 1" in text and "resumed from" in text,
           "the log shows the second run (SLURM_RESTART_COUNT=1) resuming")
    j.nothing_left()


SCENARIOS = {"batch": scenario_batch, "timelimit": scenario_timelimit, "requeue": scenario_requeue}


def all_scenarios(argv):
    """`all`: timelimit, most of whose 90-100 s is waiting for Slurm's time limit, in a
    process of its own beside batch and then requeue, each scenario with its own Slurm
    (munged, slurmctld, slurmd: own ports, files and work directory). What ctest spends on
    the three is then the time limit's wait, not the sum of all three. Exit 1 if any
    failed, 7 if all skipped, else 0; each scenario's output is printed whole, in turn."""
    def start(sc):
        out = tempfile.TemporaryFile("w+")
        return subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv + [sc],
                                stdout=out, stderr=subprocess.STDOUT), out

    t0 = time.time()
    bg = start("timelimit")
    runs = {}
    for sc in ("batch", "requeue"):
        p, out = start(sc)
        runs[sc] = (p.wait(), out, time.time() - t0)
    runs["timelimit"] = (bg[0].wait(), bg[1], time.time() - t0)
    codes = []
    for sc in ("batch", "requeue", "timelimit"):
        rc, out, t = runs[sc]
        out.seek(0)
        print("==== %s: exit %d, ended %.0f s after the start ====" % (sc, rc, t))
        print(out.read(), flush=True)
        out.close()
        codes.append(rc)
    if any(c not in (0, 7) for c in codes):
        return 1
    return 7 if all(c == 7 for c in codes) else 0


if __name__ == "__main__":
    if sys.argv[-1] == "all":
        sys.exit(all_scenarios(sys.argv[1:-1]))
    sys.exit(run_scenarios(H, SCENARIOS))
