#!/usr/bin/python3
"""deploy/workflows/Snakefile run by Debian's Snakemake itself (docs/WORKFLOWS.md).

  snakemake_test.py --build BUILD --source SRC --mpiexec M [--mpi-flags "..."] SCENARIO

resume: the workflow twice, each in its own directory, on a 2-rank LeNet-5 trained to step
  1500 with a durable checkpoint every 250 steps.
  - Uninterrupted: every rule output is there (create, train, eval, predictions,
    weights, shutdown), the shutdown's durable step is 1500, no process is left.
  - Killed: while `train` runs and once step 500 is durable, the test SIGKILLs the whole
    daemon (every rank and mpirun: a lost node). `distdl train` fails with exit 3
    (UNAVAILABLE), Snakemake retries the rule (--restart-times 2), the retry's
    `distdld-ctl up` starts a new job with --resume, which serves at a durable step >= 500,
    and `train` goes on to step 1500.
  - The killed run's predictions and pulled weights equal the uninterrupted run's byte for
    byte, its evaluation figures exactly (both runs on this machine and one kernel path:
    bitwise equality holds between runs on the same path), and no process is left.
failure: a spec the daemon refuses (a layer of a kind it does not know): the `create` rule
  fails with the daemon's INVALID_ARGUMENT message in Snakemake's log, each of its
  --restart-times attempts fails the same way, Snakemake exits 1, and the workflow's
  onerror handler leaves no process behind.

Exit status: 0 pass, 1 fail, 7 skip (distdld not built, or no snakemake / numpy).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from ddl_daemon import DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402

STEPS = 1500
EVERY = 250
KILL_AT = 500  # durable step after which the daemon is killed
OUTPUTS = ["create.json", "train.jsonl", "eval.json", "samples.npy", "predictions.npy",
           "weights.safetensors", "shutdown.json"]


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-snakemake-")
        self.snakefile = os.path.join(a.source, "deploy", "workflows", "Snakefile")
        self.ctl = os.path.join(a.source, "deploy", "workflows", "distdld-ctl")

    def need(self):
        if shutil.which("snakemake") is None:
            raise Skip("snakemake is not installed (Debian's snakemake; deploy/install-deps.sh installs it)")
        try:
            import numpy  # noqa: F401  (the `samples` rule)
        except ImportError:
            raise Skip("python3-numpy is not installed")

    def start_workflow(self, name, spec=None, restarts=2):
        d = os.path.join(self.work, name)
        cmd = ["snakemake", "-s", self.snakefile, "--cores", "1", "--directory", d,
               "--restart-times", str(restarts), "--config", "steps=%d" % STEPS,
               "checkpoint_every=%d" % EVERY]
        if spec:
            cmd.append("spec=" + spec)
        env = dict(os.environ, BUILD_DIR=os.path.abspath(self.build))
        log = open(os.path.join(self.work, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             stdin=subprocess.DEVNULL)
        log.close()
        return d, p

    def finish(self, name, p, timeout=300):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise Failure("%s: snakemake still running after %d s\n%s" % (name, timeout, self.log(name)))
        return rc

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def status(self, d):
        """distdl --json status of the workflow's daemon, or None while there is none."""
        r = subprocess.run([self.ctl, "cli", os.path.join(d, "state"), "--timeout", "1", "--json", "status"],
                           capture_output=True, text=True, env=dict(os.environ, BUILD_DIR=self.build))
        if r.returncode != 0:
            return None
        return json.loads(r.stdout.splitlines()[-1])

    def leftovers(self, d):
        """Processes whose command line names the workflow directory (a daemon of it)."""
        r = subprocess.run(["pgrep", "-af", d], capture_output=True, text=True)
        return [line for line in r.stdout.splitlines() if "pgrep" not in line]


def expect_done(h, name, d, rc):
    if rc != 0:
        raise Failure("%s: snakemake exited %d\n%s" % (name, rc, h.log(name)[-6000:]))
    missing = [o for o in OUTPUTS if not os.path.exists(os.path.join(d, "results", o))]
    if missing:
        raise Failure("%s: rule outputs missing: %s" % (name, missing))
    with open(os.path.join(d, "results", "shutdown.json")) as f:
        sd = json.load(f)
    if not sd.get("checkpoint") or sd.get("durable_step") != STEPS:
        raise Failure("%s: shutdown.json %s: expected a final checkpoint at step %d" % (name, sd, STEPS))
    deadline = time.monotonic() + 10
    while h.leftovers(d) and time.monotonic() < deadline:
        time.sleep(0.2)
    if h.leftovers(d):
        raise Failure("%s: processes left behind: %s" % (name, h.leftovers(d)))


def read(d, name):
    with open(os.path.join(d, "results", name), "rb") as f:
        return f.read()


def sc_resume(h):
    h.need()
    a, pa = h.start_workflow("uninterrupted")
    expect_done(h, "uninterrupted", a, h.finish("uninterrupted", pa))
    print("uninterrupted run: every output, final checkpoint at %d, nothing left" % STEPS, flush=True)

    b, pb = h.start_workflow("killed")
    killed_at = None
    deadline = time.monotonic() + 240
    while killed_at is None:
        if pb.poll() is not None or time.monotonic() > deadline:
            raise Failure("killed: the workflow ended (%s) before step %d was durable\n%s"
                          % (pb.returncode, KILL_AT, h.log("killed")[-4000:]))
        st = h.status(b)
        if st and st["state"] == "training" and st["durable_step"] >= KILL_AT:
            subprocess.run([h.ctl, "kill", os.path.join(b, "state")], check=True)
            killed_at = st
        else:
            time.sleep(0.05)
    print("killed the daemon at step %d (durable %d), state %s"
          % (killed_at["step"], killed_at["durable_step"], killed_at["state"]), flush=True)
    if killed_at["step"] >= STEPS:
        raise Failure("killed: the kill came after the training ended (%s)" % killed_at)
    rc = h.finish("killed", pb)
    log = h.log("killed")
    expect_done(h, "killed", b, rc)
    if "Trying to restart job" not in log:
        raise Failure("killed: Snakemake did not restart a job\n%s" % log[-6000:])
    if "exit 3: UNAVAILABLE" not in log:
        raise Failure("killed: the failed train did not report the CLI's retryable exit 3\n%s" % log[-6000:])
    with open(os.path.join(b, "state", "distdld.log")) as f:
        dlog = f.read()
    if dlog.count("listening on") != 2:
        raise Failure("killed: expected 2 daemon starts in distdld.log\n%s" % dlog[-4000:])
    with open(os.path.join(b, "results", "train.jsonl")) as f:
        recs = [json.loads(x) for x in f]
    first = recs[0]["step"] - recs[0]["done"]  # where the retried Train began
    if not (KILL_AT <= first <= killed_at["step"]):
        raise Failure("killed: the retried train began at step %d, not at a durable step in [%d, %d]"
                      % (first, KILL_AT, killed_at["step"]))
    if recs[-1]["step"] != STEPS:
        raise Failure("killed: the model ended at step %d, not %d" % (recs[-1]["step"], STEPS))
    print("retried train resumed at step %d and reached %d" % (first, STEPS), flush=True)
    for o in ["predictions.npy", "weights.safetensors", "samples.npy"]:
        if read(a, o) != read(b, o):
            raise Failure("killed: %s differs from the uninterrupted run's" % o)
    ea, eb = json.loads(read(a, "eval.json")), json.loads(read(b, "eval.json"))
    if ea != eb:
        raise Failure("killed: evaluation %s differs from the uninterrupted run's %s" % (eb, ea))
    print("predictions, weights and evaluation (%s) equal the uninterrupted run's" % eb, flush=True)


def sc_failure(h):
    h.need()
    with open(h.spec("lenet5-2.json")) as f:
        spec = json.load(f)
    spec["layers"][0]["type"] = "warp_drive"
    bad = os.path.join(h.work, "bad.json")
    with open(bad, "w") as f:
        json.dump(spec, f)
    d, p = h.start_workflow("failure", spec=bad)
    rc = h.finish("failure", p)
    log = h.log("failure")
    if rc != 1:
        raise Failure("failure: snakemake exited %d, expected 1\n%s" % (rc, log[-6000:]))
    if log.count("distdl create: exit 4: INVALID_ARGUMENT") != 3 or "warp_drive" not in log:
        raise Failure("failure: expected 3 attempts of create refused with INVALID_ARGUMENT naming "
                      "the layer type\n%s" % log[-6000:])
    time.sleep(0.5)
    if h.leftovers(d):
        raise Failure("failure: processes left behind: %s" % h.leftovers(d))
    if os.path.exists(os.path.join(d, "results", "create.json")):
        raise Failure("failure: create.json written for a refused model")
    print("refused spec: 3 attempts, each INVALID_ARGUMENT naming it; exit 1; nothing left", flush=True)


if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, {"resume": sc_resume, "failure": sc_failure}))
