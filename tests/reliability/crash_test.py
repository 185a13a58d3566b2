#!/usr/bin/python3
"""Crash recovery of distdld (issue 9, item 1), against a real 2-rank daemon.

  crash_test.py --build B --source S --mpiexec M --mpi-flags "..." kill9|window|diskfull

Every scenario compares the training losses a daemon reports with those of one
uninterrupted reference run of the same spec and seed (the engine is deterministic), so a
resume from anything but the exact saved state -- a corrupt, partial or stale checkpoint --
shows up as a different loss at the first step after it.

kill9     SIGKILL to the whole job (mpirun and every rank) at random moments while it trains
          with a checkpoint every 7 steps, 14 times; each restart with --resume must come
          back at a step no older than the newest step it reported durable, and go on with
          the reference losses.
window    SIGKILL inside the checkpoint write (DDL_FAULT names the point: after the staging
          directory, after a shard, after the manifest, after the rename, after `latest`),
          16 times: each point twice, at two of the 1st..3rd checkpoints of the run (the
          survivor ended by mpirun after its default grace or at once, in turn): `latest`
          always names a complete checkpoint (manifest digest and every shard's SHA-256 and
          size verified here, independently of the engine), every step directory it ever
          named is still there and complete, and the restart resumes exactly there.
diskfull  the checkpoint directory on a small tmpfs (or, where mounting is not allowed, a
          file-size limit): once the disk is full a Checkpoint call fails with
          RESOURCE_EXHAUSTED naming the cause, the periodic checkpoints inside Train fail
          without stopping it, training goes on with the reference losses, and the previous
          checkpoint stays intact and loadable; once space is back, checkpoints succeed.
"""
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from ddl_daemon import DaemonHarness, Failure, Skip, kill_job, run_scenarios  # noqa: E402

import grpc  # noqa: E402
import ddld_rpc  # noqa: E402

EVERY = 7                 # --checkpoint-every
SPEC = "lenet5-2.json"
SEED = 20261201           # random moments (printed, so a failure can be replayed)


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-crash-")
        self.ref = None
        self.rpc_protos = None

    def client(self, d):
        c = ddld_rpc.Client(d.address)
        return c

    def daemon(self, ck, name, env=None, extra=(), mpi_flags=()):
        args = ["--model", self.spec(SPEC), "--checkpoint-dir", ck, "--checkpoint-every",
                str(EVERY), "--resume"] + list(extra)
        return self.start(2, args, name, env=env, extra_mpi_flags=mpi_flags)

    def reference(self, steps):
        """The reference run, of at most `steps` steps."""
        self.ref = Reference(self, steps)
        return self.ref


class Reference:
    """Per-step losses of one uninterrupted run (no checkpoints), of at most `limit` steps,
    computed only as far as the checks reach: its daemon stays up (idle, it sleeps) and
    trains on when a record lies beyond the steps it has. Consecutive Train calls continue
    one run, so the losses are those of one long Train (the diskfull scenario relies on the
    same). A kill scenario's job ends well short of its limit: computing the whole limit
    up front cost more than the rest of some scenarios."""

    CHUNK = 64  # steps per Train call of the reference daemon, at least

    def __init__(self, h, limit):
        self.h, self.limit, self.loss = h, limit, {}
        self.d = h.start(2, ["--model", h.spec(SPEC)], "reference")
        self.c = h.client(self.d)

    def upto(self, step):
        """Losses of steps 1..step are known afterwards."""
        if step > self.limit:
            raise Failure("step %d beyond the reference run (%d steps)" % (step, self.limit))
        have = len(self.loss)
        if step <= have:
            return
        n = min(max(step - have, self.CHUNK), self.limit - have)
        recs = [r for r in train(self.c, n) if not r.finished]
        if [r.step for r in recs] != list(range(have + 1, have + n + 1)):
            raise Failure("reference run: %d more steps gave records of steps %s" %
                          (n, [r.step for r in recs]))
        self.loss.update((r.step, r.loss) for r in recs)

    def close(self):
        shutdown(self.c, self.d, checkpoint=False)
        n = len(self.loss)
        print("reference: %d steps (limit %d), loss %.4f -> %.4f" %
              (n, self.limit, self.loss[1], self.loss[n]), flush=True)


def train(c, steps, timeout=600):
    req = c.tr.TrainRequest(steps=steps, progress_every=1)
    return list(c.server_stream("/distdl.v1.Trainer/Train", req, c.tr.TrainProgress,
                                timeout=timeout))


def shutdown(c, d, checkpoint=True):
    c.trainer("Shutdown", c.tr.ShutdownRequest(checkpoint=checkpoint), "ShutdownResponse")
    # Done with it: close our channel (the daemon's grace is for calls, not idle connections:
    # docs/SERVER.md, "The gRPC teardown").
    c.ch.close()
    d.wait_exit()


def check_losses(ref, recs, what):
    """Every step record's loss equals the reference loss of its step, bit for bit (the
    closing record of a Train carries the call's mean loss instead, and is skipped)."""
    steps = [r.step for r in recs if not r.finished]
    if not steps:
        return
    try:
        ref.upto(max(steps))
    except Failure as e:
        raise Failure("%s: %s" % (what, e))
    for r in recs:
        if r.finished:
            continue
        if r.step not in ref.loss:
            raise Failure("%s: step %d is not a step of the reference run" % (what, r.step))
        if r.loss != ref.loss[r.step]:
            raise Failure("%s: step %d loss %.17g, reference %.17g: the resumed state is not "
                          "the saved one" % (what, r.step, r.loss, ref.loss[r.step]))


class Trainer(threading.Thread):
    """Runs Train in the background, keeping every record that arrives before the kill."""

    def __init__(self, c, steps):
        super().__init__(daemon=True)
        self.c, self.steps, self.recs, self.error = c, steps, [], None

    def run(self):
        req = self.c.tr.TrainRequest(steps=self.steps, progress_every=1)
        try:
            for r in self.c.server_stream("/distdl.v1.Trainer/Train", req, self.c.tr.TrainProgress,
                                          timeout=300):
                self.recs.append(r)
        except grpc.RpcError as e:
            self.error = e.code()


# ---- checkpoint verification, independent of the engine ---------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_step_dir(path):
    """A complete checkpoint: manifest.sha256 matches manifest.json, and every shard the
    manifest lists exists with its size and SHA-256. Returns the manifest's step."""
    mpath = os.path.join(path, "manifest.json")
    with open(os.path.join(path, "manifest.sha256")) as f:
        want = f.read().split()[0]
    if sha256_file(mpath) != want:
        raise Failure("%s: manifest.json does not match manifest.sha256" % path)
    with open(mpath) as f:
        m = json.load(f)
    if len(m["shards"]) != m["world_size"]:
        raise Failure("%s: %d shards for world size %d" % (path, len(m["shards"]), m["world_size"]))
    for sh in m["shards"]:
        sp = os.path.join(path, sh["file"])
        if os.path.getsize(sp) != sh["bytes"] or sha256_file(sp) != sh["sha256"]:
            raise Failure("%s: shard %s is not the one the manifest describes" % (path, sh["file"]))
    return m["step"]


def resume_point(ck):
    """Where --resume must start: the step `latest` names (verified complete); without
    `latest` (a crash before the first one was written), the newest step directory that
    verifies (the engine's documented fallback); else 0."""
    s = latest_step(ck)
    if s >= 0:
        return s
    steps = sorted((int(n[5:]) for n in os.listdir(ck) if re.fullmatch(r"step-\d{9}", n))
                   if os.path.isdir(ck) else [], reverse=True)
    for st in steps:
        try:
            return verify_step_dir(os.path.join(ck, "step-%09d" % st))
        except (Failure, OSError, ValueError, KeyError):
            continue
    return 0


def latest_step(ck):
    """The step `latest` names, verified complete; -1 when there is no `latest` yet."""
    lp = os.path.join(ck, "latest")
    if not os.path.exists(lp):
        return -1
    with open(lp) as f:
        name = f.read().strip()
    if not re.fullmatch(r"step-\d{9}", name):
        raise Failure("latest holds %r, not a step directory name" % name)
    step = verify_step_dir(os.path.join(ck, name))
    if step != int(name[5:]):
        raise Failure("%s holds step %d" % (name, step))
    return step


# ---- scenarios ----------------------------------------------------------------------------

def sc_kill9(h, kills=14, per_run=60):
    rng = random.Random(SEED)
    ref = h.reference(kills * per_run + 2 * per_run)
    ck = os.path.join(h.work, "ckpt-kill9")
    durable_seen = -1   # newest step any record reported durable
    step = 0            # where the job is
    t0 = time.time()
    for i in range(kills):
        d = h.daemon(ck, "kill9-%02d" % i)
        c = h.client(d)
        s0 = c.status().step
        disk = latest_step(ck)
        if s0 < durable_seen:
            raise Failure("kill %d: resumed at step %d, but step %d was reported durable" %
                          (i, s0, durable_seen))
        if s0 != resume_point(ck):
            raise Failure("kill %d: resumed at step %d, expected %d (latest names %d)" %
                          (i, s0, resume_point(ck), disk))
        # A kill -9 leaves no final checkpoint: every resume point is a periodic one. (It
        # may lie beyond the last record this client saw: the ranks run ahead of the stream.)
        if s0 % EVERY != 0:
            raise Failure("kill %d: resumed at step %d, not a checkpoint step (every %d)" %
                          (i, s0, EVERY))
        t = Trainer(c, per_run)
        t.start()
        delay = rng.uniform(0.05, 1.2)
        time.sleep(delay)
        kill_job(d)
        t.join(30)
        if t.is_alive():
            raise Failure("kill %d: the client's Train is still waiting 30 s after the kill" % i)
        check_losses(ref, t.recs, "kill %d" % i)
        for r in t.recs:
            if r.durable:
                durable_seen = max(durable_seen, r.step)
        step = t.recs[-1].step if t.recs else s0
        print("kill %2d: resumed at %4d, killed after %.2f s at step %4d (newest durable %4d, "
              "client saw %s)" % (i, s0, delay, step, durable_seen,
                                  t.error.name if t.error else "the end"), flush=True)
    d = h.daemon(ck, "kill9-final")
    c = h.client(d)
    s0 = c.status().step
    if s0 < durable_seen:
        raise Failure("final: resumed at step %d, but step %d was reported durable" %
                      (s0, durable_seen))
    recs = train(c, 2 * EVERY)
    check_losses(ref, recs, "final")
    shutdown(c, d)
    ref.close()
    print("20 kills in %.1f s: every restart resumed at or after the newest durable step, "
          "with the reference losses" % (time.time() - t0), flush=True)


# Once a rank killed itself inside the checkpoint write, mpirun ends the other one: SIGCONT,
# SIGTERM and SIGKILL, odls_base_sigkill_timeout apart (1 s by default), so the survivor may
# still finish a local write (a shard, `latest`) before it blocks on its dead peer; then the
# 2 s are idle. Every point is hit in both crash states: in one pass over the points with the
# default (the survivor finishes what it was writing), in the other with 0 (it is killed as
# soon as mpirun sees the death, 2 s sooner), alternating kill by kill.
QUICK_END = ["--mca", "odls_base_sigkill_timeout", "0"]
WINDOW_POINTS = [("checkpoint.staged", 0), ("checkpoint.staged", 1), ("checkpoint.shard", 0),
                 ("checkpoint.shard", 1), ("checkpoint.manifest", 0), ("checkpoint.publish", 0),
                 ("checkpoint.done", 0), ("checkpoint.done", 1)]


def sc_window(h, kills=16, per_run=4 * EVERY):
    ref = h.reference(kills * per_run + 2 * per_run)
    ck = os.path.join(h.work, "ckpt-window")
    named = []  # every step `latest` has named
    t0 = time.time()
    for i in range(kills):
        site, rank = WINDOW_POINTS[i % len(WINDOW_POINTS)]
        nth = 1 + i % 3  # over 16 kills: each point at two different checkpoints
        before = latest_step(ck)
        want = resume_point(ck)
        quick = (i + i // len(WINDOW_POINTS)) % 2 == 1
        d = h.daemon(ck, "window-%02d" % i, env={"DDL_FAULT": "%s@%d#%d" % (site, rank, nth)},
                     mpi_flags=QUICK_END if quick else ())
        c = h.client(d)
        s0 = c.status().step
        if s0 != want:
            raise Failure("kill %d: resumed at %d, expected %d (latest names %d)" %
                          (i, s0, want, before))
        t = Trainer(c, per_run)
        t.start()
        t.join(120)
        try:
            rc = d.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            d.kill()
            raise Failure("kill %d: the job did not end after %s@%d killed a rank" % (i, site, rank))
        d.log.close()
        if t.is_alive():
            raise Failure("kill %d: the client's Train still waits after the job ended" % i)
        if rc == 0:
            d.dump()
            raise Failure("kill %d: %s@%d#%d never fired (mpirun exit 0)" % (i, site, rank, nth))
        with open(d.log_path) as f:
            if "DDL_FAULT: SIGKILL at %s" % site not in f.read():
                d.dump()
                raise Failure("kill %d: no sign of the injected kill in the log" % i)
        check_losses(ref, t.recs, "kill %d" % i)
        after = latest_step(ck)  # raises unless complete
        if after < before:
            raise Failure("kill %d: latest went back from %d to %d" % (i, before, after))
        if after >= 0 and (not named or named[-1] != after):
            named.append(after)
        for s in named:  # nothing latest ever named was removed or damaged
            verify_step_dir(os.path.join(ck, "step-%09d" % s))
        print("kill %2d at %-20s rank %d, checkpoint #%d%s: latest %4d -> %4d, complete; "
              "mpirun exit %d" % (i, site, rank, nth, ", survivor ended at once" if quick else "",
                                  before, after, rc), flush=True)
    d = h.daemon(ck, "window-final")
    c = h.client(d)
    s0 = c.status().step
    if s0 != resume_point(ck):
        raise Failure("final: resumed at %d, expected %d" % (s0, resume_point(ck)))
    check_losses(ref, train(c, 2 * EVERY), "final")
    shutdown(c, d)
    ref.close()
    print("20 kills inside the checkpoint write in %.1f s: latest always complete, %d steps "
          "it named all intact" % (time.time() - t0, len(named)), flush=True)


def mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "ddl-ckpt", path],
                       stderr=subprocess.PIPE, text=True)
    return r.returncode == 0, r.stderr.strip()


def fill(path):
    """Fills the file system holding path; returns the filler's name."""
    name = os.path.join(path, "filler")
    with open(name, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return name


def sc_diskfull(h):
    ref = h.reference(20 * EVERY)
    mnt = os.path.join(h.work, "small-disk")
    ok, why = mount_tmpfs(mnt, 32 << 20)
    if not ok:
        if os.geteuid() == 0:
            raise Failure("cannot mount a tmpfs as root: %s" % why)
        raise Skip("mounting a tmpfs needs root here (%s)" % why)
    try:
        diskfull_on(h, ref, os.path.join(mnt, "ck"), mnt)
    finally:
        subprocess.run(["umount", "-l", mnt])


def diskfull_on(h, ref, ck, mnt):
    d = h.daemon(ck, "diskfull")
    c = h.client(d)
    recs = train(c, 2 * EVERY)  # periodic checkpoints at 7 and 14
    check_losses(ref, recs, "before")
    good = latest_step(ck)
    if good != 2 * EVERY:
        raise Failure("latest names %d after %d steps" % (good, 2 * EVERY))
    filler = fill(mnt)
    print("disk full: %s holds %d bytes" % (filler, os.path.getsize(filler)), flush=True)
    recs = train(c, 3)
    check_losses(ref, recs, "disk full")
    t = time.time()
    try:
        c.trainer("Checkpoint", c.tr.CheckpointRequest(), "CheckpointResponse")
        raise Failure("Checkpoint succeeded on a full disk")
    except grpc.RpcError as e:
        ms = (time.time() - t) * 1e3
        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or "No space left" not in e.details():
            raise Failure("Checkpoint on a full disk: %s %s" % (e.code(), e.details()))
        print("Checkpoint on a full disk: %s in %.1f ms: %s" % (e.code().name, ms, e.details()),
              flush=True)
    # Periodic checkpoints (steps 21, 28) fail too, and Train goes on with the right losses.
    recs = train(c, 2 * EVERY)
    check_losses(ref, recs, "train on a full disk")
    if any(r.durable for r in recs):
        raise Failure("a record claims a durable checkpoint on a full disk")
    st = c.status()
    if st.step != 2 * EVERY + 3 + 2 * EVERY or st.durable_step != good:
        raise Failure("status after the failures: step %d durable %d" % (st.step, st.durable_step))
    if latest_step(ck) != good:
        raise Failure("latest moved away from the intact step %d" % good)
    leftovers = [n for n in os.listdir(ck) if n.endswith(".partial") or n.endswith(".tmp")]
    if leftovers:
        raise Failure("failed checkpoints left %s behind" % leftovers)
    os.unlink(filler)
    r = c.trainer("Checkpoint", c.tr.CheckpointRequest(), "CheckpointResponse")
    if not r.durable or r.step != st.step or latest_step(ck) != st.step:
        raise Failure("Checkpoint with space back: %s" % r)
    shutdown(c, d, checkpoint=False)
    # The previous checkpoint was never touched: a daemon restored from it gets the same
    # losses as the reference from there on.
    os.unlink(os.path.join(ck, "latest"))
    import shutil
    shutil.rmtree(os.path.join(ck, "step-%09d" % st.step))
    d = h.daemon(ck, "diskfull-after")
    c = h.client(d)
    if c.status().step != good:
        raise Failure("restart resumed at %d, not at the intact step %d" % (c.status().step, good))
    check_losses(ref, train(c, EVERY), "after")
    shutdown(c, d, checkpoint=False)
    ref.close()
    print("disk full: Checkpoint refused, Train went on, step %d intact and resumable" % good,
          flush=True)


SCENARIOS = {"kill9": sc_kill9, "window": sc_window, "diskfull": sc_diskfull}

if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, SCENARIOS))
