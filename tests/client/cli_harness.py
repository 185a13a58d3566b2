#!/usr/bin/python3
"""The distdl command-line tool against a real distdld under mpirun (docs/CLI.md).

  cli_harness.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] SCENARIO

Scenarios:
  session  every command through the CLI on a 2-rank daemon; every --json line parses and
           has the documented fields; predict of real test images; pull/push round trip;
           checkpoint, restore latest and restore STEP
  exit     usage errors -> 2, no daemon -> 3, errors of the daemon -> 4, bad local files
           -> 5, each with a message naming the problem and the daemon's step unchanged
  tty      the progress bar under a real terminal (tmux): redrawn in place with '\\r';
           plain lines under a pipe; Ctrl-C typed in the terminal cancels the Train
  sigint   SIGINT mid-train (--json): exit 130, the daemon stopped where the CLI says,
           still serving, and trains on
  unix     a daemon on a unix socket without a model: status, train refused, create, train
  help     --help for the tool and every command exits 0 without contacting anything
  aborted  a push racing a create --replace: ABORTED, exit 6 (retryable), nothing changed,
           and the same push run again succeeds
  volumes  the 3-D U-Nets served (issue 18): the denoising one (mse, dense targets) and the
           segmenting one (a label per voxel), each created at 16^3, trained and evaluated
           on the data its spec generates (no dataset), predict returning the whole output
           [n, C, D, H, W] equal to KServe ModelMetadata's shape, a dataset refused; then
           inline batches from .npy (step, eval --input --targets): FP32/FP64 fields and
           INT64 classes per voxel, the metrics checked against the predicted volume, bad
           targets refused with expected versus got

Exit status: 0 pass, 1 fail, 7 skip (distdld is not built, or tmux is missing for tty).
"""
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ddl_daemon import DaemonHarness, Failure, FMNIST, Skip, free_port, run_scenarios  # noqa: E402

COMMANDS = ["status", "health", "create", "train", "eval", "step", "predict", "pull", "push",
            "checkpoint", "restore", "shutdown"]

# The documented fields of each --json event (docs/CLI.md).
PROGRESS = ["step", "epoch", "batch", "steps_per_epoch", "loss", "accuracy",
            "images_per_second", "done", "total", "epoch_end", "durable", "mse"]
FIELDS = {
    "status": ["has_model", "model_name", "world_size", "state", "step", "epoch", "batch",
               "last_loss", "durable_step", "queue_depth", "queue_capacity", "batch_size",
               "input_shape", "num_classes", "datatype", "active_calls",
               "request_queue_depth", "dropped_calls", "bytes_per_step"],
    "health": ["status", "serving"],
    "reachable": ["has_model", "model_name", "state", "step", "waited_seconds"],
    "ready": ["has_model", "model_name", "state", "step", "waited_seconds"],
    "create": ["name", "world_size", "num_parameters", "batch_size", "input_shape",
               "num_classes", "datatype"],
    "progress": PROGRESS,
    "done": ["step", "loss", "accuracy", "mean_loss", "done", "total", "seconds"],
    "cancelled": ["step", "done", "total"],
    "eval": ["split", "count", "loss", "accuracy", "mse", "rel_l2", "fg_iou"],
    "step": ["input", "targets", "step", "loss", "accuracy", "mse", "durable"],
    "predict": ["input", "output", "count", "shape", "dtype", "classes"],
    "pull": ["output", "tensors", "bytes"],
    "push": ["input", "tensors", "bytes"],
    "checkpoint": ["step", "durable", "path"],
    "restore": ["step"],
    "shutdown": ["checkpoint", "durable_step"],
    "error": ["command", "code", "message", "exit"],
}


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-cli-it-")
        self.distdl = os.path.join(a.build, "bin", "distdl")

    def cli(self, d, *args, expect=0, timeout=120, env_extra=None):
        """Runs `distdl ARGS` against daemon d (DDL_ADDRESS; d may be None); requires exit
        code `expect`; returns (stdout, stderr)."""
        env = dict(os.environ)
        env.pop("DDL_ADDRESS", None)
        env.pop("DDL_TOKEN", None)
        if d is not None:
            env["DDL_ADDRESS"] = d.address
        env.setdefault("GRPC_VERBOSITY", "ERROR")
        if env_extra:
            env.update(env_extra)
        argv = [self.distdl] + [str(x) for x in args]
        print("$ " + " ".join(argv), flush=True)
        t0 = time.time()
        try:
            r = subprocess.run(argv, env=env, timeout=timeout, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired:
            raise Failure("distdl %s timed out after %d s" % (args[0], timeout))
        out = r.stdout + ("\n[stderr] " + r.stderr.strip() if r.stderr.strip() else "")
        print(out.rstrip()[-3000:], flush=True)
        print("(%.1f s, exit %d)" % (time.time() - t0, r.returncode), flush=True)
        if r.returncode != expect:
            if d is not None:
                d.dump()
            raise Failure("distdl %s exited with %d, expected %d" %
                          (" ".join(str(x) for x in args), r.returncode, expect))
        return r.stdout, r.stderr

    def js(self, d, *args, expect=0, **kw):
        """Runs `distdl --json ARGS`; every stdout line must be a JSON object with an "event"
        and the documented fields of that event. Returns the list of objects."""
        out, err = self.cli(d, "--json", *args, expect=expect, **kw)
        objs = []
        for line in out.splitlines():
            try:
                o = json.loads(line)
            except ValueError as e:
                raise Failure("--json line does not parse (%s): %r" % (e, line))
            if not isinstance(o, dict) or "event" not in o:
                raise Failure("--json line without an event: %r" % line)
            missing = [k for k in FIELDS.get(o["event"], []) if k not in o]
            if o["event"] not in FIELDS or missing:
                raise Failure("event %r lacks %s: %r" % (o["event"], missing, line))
            objs.append(o)
        if not objs:
            raise Failure("--json %s printed nothing" % args[0])
        return objs

    def rpc(self, d):
        """A raw grpcio client of daemon d (tests/server/ddld_rpc.py), made once."""
        if getattr(self, "_rpc", (None, None))[0] != d.address:
            sys.path.insert(0, os.path.join(self.source, "tests", "server"))
            import ddld_rpc
            self._rpc = (d.address, ddld_rpc.Client(d.address))
        return self._rpc[1]

    def raw_model_metadata(self, d, name):
        """KServe ModelMetadata's output shape for model `name`."""
        c = self.rpc(d)
        r = c.unary("/inference.GRPCInferenceService/ModelMetadata",
                    c.inf.ModelMetadataRequest(name=name), c.inf.ModelMetadataResponse)
        return list(r.outputs[0].shape)

    def raw_step(self, d, x, labels, targets=None):
        """An inline Step of FP32 x and INT64 labels (and FP32 targets when given): (status
        name, details)."""
        import grpc
        c = self.rpc(d)
        b = c.tr.Batch(x=c.tr.Tensor(datatype="FP32", shape=list(x.shape), raw=x.tobytes()),
                       labels=c.tr.Tensor(datatype="INT64", shape=list(labels.shape),
                                          raw=labels.tobytes()))
        if targets is not None:
            b.targets.CopyFrom(c.tr.Tensor(datatype="FP32", shape=list(targets.shape),
                                           raw=targets.astype(np.float32).tobytes()))
        try:
            c.trainer("Step", c.tr.StepRequest(batch=b), "StepResponse")
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details()

    def one(self, d, *args, event=None, **kw):
        objs = self.js(d, *args, **kw)
        if len(objs) != 1:
            raise Failure("expected one JSON object, got %d" % len(objs))
        if event and objs[0]["event"] != event:
            raise Failure("expected event %r, got %r" % (event, objs[0]))
        return objs[0]

    def status(self, d):
        return self.one(d, "status", event="status")


def check(cond, what):
    if not cond:
        raise Failure(what)


def window_means(prog):
    """The mean training loss of each window between progress records. A record's `loss` is
    the loss of the one batch it names, and which of two batches is harder is noise (on
    another CPU's rounding the comparison of two single batches flips); the mean over a
    window of batches is what training moves. A record's `mean_loss` is the running mean of
    this call's steps in the current epoch (the daemon restarts it when it splits a Train for
    a checkpoint), so every record must be in one epoch, with no checkpoint before the last."""
    check(all(not o["epoch_end"] and not o["durable"] for o in prog[:-1]) and
          all(o["epoch"] == prog[0]["epoch"] for o in prog),
          "the progress records span an epoch end or a checkpoint: %r" % prog)
    means, n0, s0 = [], 0, 0.0
    for o in prog:
        n, s = o["done"], o["mean_loss"] * o["done"]
        means.append((s - s0) / (n - n0))
        n0, s0 = n, s
    return means


def test_images(n):
    """The first n Fashion-MNIST test images (uint8 [n, 1, 28, 28]) and labels."""
    with gzip.open(os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(os.path.join(FMNIST, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    return np.ascontiguousarray(x), y.astype(np.int64)


# ---- session ----------------------------------------------------------------------------

def sc_session(h):
    ck = os.path.join(h.work, "ckpt")
    d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--checkpoint-dir", ck], "session")

    check(h.one(d, "health", event="health")["status"] == "SERVING", "health is not SERVING")
    out, _ = h.cli(d, "health")
    check(out.strip() == "SERVING", "health prints %r" % out)
    s = h.status(d)
    check(s["has_model"] and s["world_size"] == 2 and s["step"] == 0, "status %r" % s)
    # Idle, and no step yet: no call but this one, nothing queued or dropped, no traffic.
    check(s["active_calls"] == 0 and s["request_queue_depth"] == 0 and s["dropped_calls"] == 0
          and s["bytes_per_step"] == 0, "call accounting before a step %r" % s)
    out, _ = h.cli(d, "status")
    check("step       0" in out and "[1, 28, 28]" in out, "status text %r" % out)
    check("calls      0 active, 0 queued, 0 dropped\n" in out and
          "traffic    0 bytes per step\n" in out, "status text before a step %r" % out)

    c = h.one(d, "create", h.spec("lenet5-2.json"), "--name", "cli-lenet", "--replace",
              event="create")
    check(c["name"] == "cli-lenet" and c["world_size"] == 2 and c["num_parameters"] > 60000
          and c["input_shape"] == [1, 28, 28] and c["num_classes"] == 10
          and c["batch_size"] == 64, "create %r" % c)
    check(h.status(d)["model_name"] == "cli-lenet", "the created model is not the daemon's")

    # train --steps with a record every 50 steps: 4 progress lines, then done.
    objs = h.js(d, "train", "--steps", 200, "--progress-every", 50)
    prog = [o for o in objs if o["event"] == "progress"]
    check([o["done"] for o in prog] == [50, 100, 150, 200], "progress done %r" %
          [o["done"] for o in prog])
    check(all(o["total"] == 200 and o["steps_per_epoch"] == 937 and o["epoch_end"] is False
              for o in prog), "progress records %r" % prog)
    check(objs[-1]["event"] == "done" and objs[-1]["step"] == 200, "last line %r" % objs[-1])
    check(0 < objs[-1]["mean_loss"] < 2.3, "mean loss %r" % objs[-1]["mean_loss"])
    wm = window_means(prog)
    check(wm[-1] < 0.9 * wm[0] and wm[-1] < 1.2,
          "the mean loss of 50 steps did not fall: %r" % wm)
    s, raw = h.status(d), h.raw_get_status(d)
    check(s["step"] == 200, "status step after train")
    # A 2-rank model after its first step moves bytes between the ranks: what the CLI says
    # is what the daemon says over raw gRPC, and the idle daemon has no call in flight.
    check(s["bytes_per_step"] > 0 and s["bytes_per_step"] == raw.bytes_per_step and
          (s["active_calls"], s["request_queue_depth"], s["dropped_calls"]) ==
          (0, 0, raw.dropped_calls), "status after train %r, raw GetStatus %s" % (s, raw))
    out, _ = h.cli(d, "status")
    check("traffic    %d bytes per step\n" % raw.bytes_per_step in out and
          "calls      0 active, 0 queued, %d dropped\n" % raw.dropped_calls in out,
          "status text after train %r" % out)

    e1 = h.one(d, "eval", event="eval")
    check(e1["split"] == "test" and e1["count"] == 10000 and e1["accuracy"] > 0.6,
          "eval %r" % e1)
    out, _ = h.cli(d, "eval")
    want = "test accuracy %.4f (loss %.4f, 10000 images)" % (e1["accuracy"], e1["loss"])
    check(out.strip() == want, "eval prints %r, expected %r" % (out.strip(), want))

    # predict: real test images written by numpy, as uint8 pixels and as normalised float32
    # (the spec's normalize: mean 0.2860, std 0.3530), and as float64 (refused: FP32 model).
    n = 500
    x, y = test_images(n)
    xin, zout = os.path.join(h.work, "x.npy"), os.path.join(h.work, "logits.npy")
    np.save(xin, x)
    p = h.one(d, "predict", "--input", xin, "--output", zout, event="predict")
    z = np.load(zout)
    check(z.shape == (n, 10) and z.dtype == np.float32, "logits %s %s" % (z.shape, z.dtype))
    check(p["shape"] == [n, 10] and p["count"] == n and p["classes"] == z.argmax(1).tolist(),
          "predict's classes differ from the logits file's argmax")
    acc = float((z.argmax(1) == y).mean())
    print("predict: argmax accuracy %.4f on %d test images (eval: %.4f on 10000)" %
          (acc, n, e1["accuracy"]), flush=True)
    check(acc > 0.6 and abs(acc - e1["accuracy"]) < 0.08, "predict accuracy %.4f" % acc)
    xf = os.path.join(h.work, "xf.npy")
    np.save(xf, ((x.astype(np.float32) / 255.0 - np.float32(0.2860)) / np.float32(0.3530)))
    zf = os.path.join(h.work, "logits-f.npy")
    h.one(d, "predict", "--input", xf, "--output", zf, event="predict")
    check(np.allclose(np.load(zf), z, rtol=1e-4, atol=1e-4), "float32 input != uint8 input")
    out, _ = h.cli(d, "predict", "--input", xin, "--output", zf)
    check(("logits [%d, 10] FP32 written to" % n) in out, "predict text %r" % out)

    # pull, train on (the weights change), push back what was pulled: the same evaluation,
    # to the last bit, and a second pull gives the same file.
    w1, w2 = os.path.join(h.work, "w1.safetensors"), os.path.join(h.work, "w2.safetensors")
    pl = h.one(d, "pull", "--output", w1, event="pull")
    check(pl["tensors"] == 10 and pl["bytes"] == 4 * c["num_parameters"] and
          os.path.getsize(w1) > pl["bytes"], "pull %r" % pl)
    h.js(d, "train", "--steps", 50)
    e2 = h.one(d, "eval", event="eval")
    check(e2["loss"] != e1["loss"], "training did not change the evaluation")
    ps = h.one(d, "push", "--input", w1, event="push")
    check(ps["tensors"] == 10 and ps["bytes"] == pl["bytes"], "push %r" % ps)
    e3 = h.one(d, "eval", event="eval")
    check(e3["loss"] == e1["loss"] and e3["accuracy"] == e1["accuracy"],
          "after pushing the pulled weights: %r, before: %r" % (e3, e1))
    h.cli(d, "pull", "--output", w2)
    with open(w1, "rb") as f1, open(w2, "rb") as f2:
        check(f1.read() == f2.read(), "pull after push differs from the pushed file")

    # checkpoint, train, restore latest; checkpoint again, restore the first by its step.
    k1 = h.one(d, "checkpoint", event="checkpoint")
    s1 = k1["step"]
    check(k1["durable"] is True and s1 == 250 and k1["path"], "checkpoint %r" % k1)
    ek = h.one(d, "eval", event="eval")
    h.js(d, "train", "--steps", 30)
    check(h.status(d)["step"] == s1 + 30, "step after training on")
    r = h.one(d, "restore", "latest", event="restore")
    check(r["step"] == s1 and h.status(d)["step"] == s1, "restore latest %r" % r)
    check(h.one(d, "eval", event="eval")["loss"] == ek["loss"], "restore latest: other weights")
    h.js(d, "train", "--steps", 20)
    # --dir naming the model's own home (a replacement's: models/<name> under the daemon's
    # --checkpoint-dir; the root is the first model's and refused, docs/SERVER.md).
    home = os.path.join(ck, "models", "cli-lenet")
    k2 = h.one(d, "checkpoint", "--dir", home, event="checkpoint")
    check(k2["step"] == s1 + 20 and k2["path"] == os.path.realpath(home),
          "second checkpoint %r" % k2)
    out, _ = h.cli(d, "restore", s1)
    check(out.strip() == "restored step %d" % s1, "restore text %r" % out)
    st = h.status(d)
    check(st["step"] == s1 and st["durable_step"] >= s1, "status after restore %r" % st)
    check(h.one(d, "eval", event="eval")["loss"] == ek["loss"], "restore STEP: other weights")

    sd = h.one(d, "shutdown", event="shutdown")
    check(sd["checkpoint"] is True and sd["durable_step"] >= s1, "shutdown %r" % sd)
    d.wait_exit()


# ---- exit codes -------------------------------------------------------------------------

def sc_exit(h):
    ck = os.path.join(h.work, "ckpt")
    d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--checkpoint-dir", ck], "exit")
    h.js(d, "train", "--steps", 20)
    h.cli(d, "checkpoint")
    before = h.status(d)
    check(before["step"] == 20, "setup step %r" % before)

    def unchanged(what):
        s = h.status(d)
        for k in ("step", "model_name", "durable_step", "last_loss", "state"):
            if s[k] != before[k]:
                raise Failure("%s changed the daemon: %s %r -> %r" % (what, k, before[k], s[k]))

    def expect(code, args, *words, env_extra=None):
        """distdl ARGS exits `code` with a message naming the problem, in text (stderr) and
        in --json (an error object on stdout), and changes nothing on the daemon."""
        _, err = h.cli(d, *args, expect=code, env_extra=env_extra)
        for w in words:
            check(w in err, "the message of %r does not name %r: %r" % (args, w, err))
        objs = h.js(d, *args, expect=code, env_extra=env_extra)
        e = objs[-1]
        check(e["event"] == "error" and e["exit"] == code, "error object %r" % e)
        for w in words:
            check(w in e["message"], "the JSON message of %r does not name %r" % (args, w))
        unchanged(" ".join(str(a) for a in args))
        return e

    # 2: usage errors, found before the daemon is contacted.
    expect(2, ["bogus"], "unknown command", "bogus")
    expect(2, ["status", "--bogus"], "--bogus")
    expect(2, ["--bogus", "status"], "--bogus")
    expect(2, ["predict", "--input"], "--input", "needs an argument")
    expect(2, ["create"], "missing argument")
    expect(2, ["status", "extra"], "unexpected argument", "extra")
    expect(2, ["train", "--steps", "-3"], "--steps", "-3")
    expect(2, ["train", "--steps", "ten"], "--steps", "ten")
    expect(2, ["train", "--epochs", "1", "--steps", "5"], "--epochs", "--steps", "not several")
    expect(2, ["train", "--steps", "5", "--to-step", "40"], "--to-step", "not several")
    expect(2, ["train", "--to-step", "-1"], "--to-step", "-1")
    expect(2, ["train"], "--epochs N, --steps N or --to-step S")
    expect(2, ["eval", "--split", "validation"], "--split", "validation")
    expect(2, ["restore", "abc"], "abc")
    expect(2, ["restore", "--dir", ck], "missing argument")
    expect(2, ["--timeout", "-1", "status"], "--timeout")
    expect(2, ["predict", "--input", "x.npy"], "--output")
    expect(2, ["pull"], "--output")
    expect(2, ["--address", d.address, "--address-file", "f", "status"], "not both")
    expect(2, ["--tls-cert", "c.pem", "status"], "--tls-key")
    e = expect(2, [], "no command")
    check(e["code"] == "USAGE", "usage error code %r" % e)

    # 3: no daemon at the address (a free port; a missing address file).
    port = free_port()
    e = expect(3, ["--address", "127.0.0.1:%d" % port, "--timeout", "1", "status"],
               "127.0.0.1:%d" % port)
    check(e["code"] == "UNAVAILABLE", "unreachable code %r" % e)
    expect(3, ["--address", "127.0.0.1:%d" % port, "--timeout", "1", "train", "--steps", "5"])
    expect(3, ["--address-file", os.path.join(h.work, "no-such-addr"), "--timeout", "0.5",
               "health"], "no-such-addr")
    expect(3, ["--timeout", "1", "status"], env_extra={"DDL_ADDRESS": "127.0.0.1:%d" % port})

    # 4: errors of the daemon; each is refused before it changes anything.
    e = expect(4, ["restore", "999999"], "999999")
    check(e["code"] == "NOT_FOUND", "restore of a missing step: %r" % e)
    e = expect(4, ["create", h.spec("lenet5-2.json")])
    check(e["code"] == "FAILED_PRECONDITION", "create without --replace: %r" % e)
    e = expect(4, ["create", h.spec("lenet5-4.json"), "--replace"], "world")
    check(e["code"] == "INVALID_ARGUMENT", "a 4-rank spec on 2 ranks: %r" % e)
    bad_spec = os.path.join(h.work, "bad-spec.json")
    with open(bad_spec, "w") as f:
        json.dump({"name": "bad", "world_size": 2, "layers": [{"type": "no_such_layer"}]}, f)
    expect(4, ["create", bad_spec, "--replace"])
    x, _ = test_images(3)
    wrong = os.path.join(h.work, "wrong-shape.npy")
    np.save(wrong, x.reshape(3, 28, 28, 1)[:, :27, :27, :].copy())
    e = expect(4, ["predict", "--input", wrong, "--output", os.path.join(h.work, "z.npy")])
    check(e["code"] == "INVALID_ARGUMENT", "predict of a wrong shape: %r" % e)
    check(not os.path.exists(os.path.join(h.work, "z.npy")), "predict wrote a file on error")
    x64 = os.path.join(h.work, "x64.npy")
    np.save(x64, x.astype(np.float64))
    expect(4, ["predict", "--input", x64, "--output", os.path.join(h.work, "z.npy")])
    expect(4, ["eval", "--dataset", "no-such-dataset"], "no-such-dataset")
    expect(4, ["train", "--steps", "5", "--dataset", "no-such-dataset"], "no-such-dataset")
    e = expect(4, ["train", "--to-step", "19"], "--to-step 19", "at step 20", "past it")
    check(e["code"] == "FAILED_PRECONDITION", "train --to-step behind the model: %r" % e)
    # --to-step where the model is: nothing to train (exit 0), nothing changed.
    out, _ = h.cli(d, "train", "--to-step", 20)
    check(out.strip() == "model lenet5-2 is at step 20 already: nothing to train", "to-step text %r" % out)
    done = h.one(d, "train", "--to-step", 20, event="done")
    check(done["step"] == 20 and done["done"] == 0, "to-step where the model is: %r" % done)
    unchanged("train --to-step 20")
    # A complete set with one tensor of the wrong shape: refused as a whole.
    w = os.path.join(h.work, "w.safetensors")
    h.cli(d, "pull", "--output", w)
    bad_w = os.path.join(h.work, "bad.safetensors")
    rewrite_safetensors(w, bad_w)
    e = expect(4, ["push", "--input", bad_w])
    check(e["code"] == "INVALID_ARGUMENT", "push of a wrong shape: %r" % e)

    # 5: local files that cannot be read or written.
    missing = os.path.join(h.work, "missing")
    garbage = os.path.join(h.work, "garbage.txt")
    with open(garbage, "w") as f:
        f.write("this is not a model, an array or a weight file\n")
    truncated = os.path.join(h.work, "truncated.npy")
    np.save(truncated, x)
    with open(truncated, "r+b") as f:
        f.truncate(os.path.getsize(truncated) - 100)
    fortran = os.path.join(h.work, "fortran.npy")
    np.save(fortran, np.asfortranarray(x.astype(np.float32)))
    out_z = os.path.join(h.work, "z.npy")
    expect(5, ["create", missing + ".json"], missing + ".json")
    expect(5, ["create", garbage, "--replace"], garbage, "not JSON")
    expect(5, ["predict", "--input", missing + ".npy", "--output", out_z], missing + ".npy")
    expect(5, ["predict", "--input", garbage, "--output", out_z], garbage, "not a .npy")
    expect(5, ["predict", "--input", truncated, "--output", out_z], truncated,
           "needs 2352 bytes")
    expect(5, ["predict", "--input", fortran, "--output", out_z], "C order")
    expect(5, ["predict", "--input", xin_ok(h, x), "--output", missing + "/z.npy"],
           missing + "/z.npy")
    expect(5, ["push", "--input", missing + ".safetensors"], missing + ".safetensors")
    expect(5, ["push", "--input", garbage], garbage)
    expect(5, ["pull", "--output", missing + "/w.safetensors"], missing + "/w.safetensors")
    expect(5, ["--token-file", missing + ".token", "status"], missing + ".token")
    expect(5, ["--tls-ca", missing + ".pem", "status"], missing + ".pem")
    check(not os.path.exists(out_z), "a failed predict left an output file")

    # Token and TLS options reach the client library. This daemon has no token check, so a
    # token (file, trimmed, or $DDL_TOKEN) is sent and ignored; an empty token file is a file
    # error; TLS towards this plaintext daemon fails to connect.
    tok = os.path.join(h.work, "token")
    with open(tok, "w") as f:
        f.write("# comment\n  s3cret-token-value \nsecond line\n")
    os.chmod(tok, 0o600)
    out, err = h.cli(d, "--token-file", tok, "status")
    check("s3cret" not in out + err, "the token was printed")
    h.cli(d, "status", env_extra={"DDL_TOKEN": "s3cret-token-value"})
    empty = os.path.join(h.work, "empty-token")
    open(empty, "w").close()
    os.chmod(empty, 0o600)
    expect(5, ["--token-file", empty, "status"], empty)
    os.chmod(tok, 0o644)  # readable by others: refused like the daemon's own token file
    expect(5, ["--token-file", tok, "status"], tok)
    if shutil.which("openssl"):
        key, crt = os.path.join(h.work, "k.pem"), os.path.join(h.work, "c.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj",
                        "/CN=localhost", "-keyout", key, "-out", crt, "-days", "1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        expect(3, ["--tls-ca", crt, "--tls-server-name", "localhost", "--timeout", "1",
                   "status"])
        expect(2, ["--tls-cert", crt, "--tls-key", key, "status"], "--tls-ca")

    # Still serving, and a good command works.
    check(h.one(d, "health")["serving"] is True, "not serving after the bad commands")
    h.js(d, "train", "--steps", 5)
    check(h.status(d)["step"] == 25, "the daemon did not train on")
    done = h.js(d, "train", "--to-step", 32)[-1]
    check(done["event"] == "done" and done["step"] == 32 and done["done"] == 7,
          "train --to-step 32 from step 25: %r" % done)
    h.cli(d, "shutdown")
    d.wait_exit()


def xin_ok(h, x):
    p = os.path.join(h.work, "x-ok.npy")
    np.save(p, x)
    return p


def rewrite_safetensors(src, dst):
    """Copies a safetensors file with its first tensor's shape transposed (same bytes, a
    shape the model does not have)."""
    with open(src, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    hdr = json.loads(data[8:8 + n])
    name = sorted(k for k in hdr if k != "__metadata__" and len(hdr[k]["shape"]) >= 2)[0]
    hdr[name]["shape"] = list(reversed(hdr[name]["shape"]))
    text = json.dumps(hdr).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data[8 + n:])


# ---- the progress bar under a terminal --------------------------------------------------

class Tmux:
    """A private tmux server (its own socket) running one command in a 200x50 window."""

    def __init__(self, h, name):
        self.sock = os.path.join(h.work, "tmux-%s.sock" % name)
        self.name = name

    def tmux(self, *args, check=True):
        r = subprocess.run(["tmux", "-S", self.sock] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=30)
        if check and r.returncode != 0:
            raise Failure("tmux %s: %s" % (args[0], r.stderr.strip()))
        return r.stdout

    def start(self, h, script, width=200):
        """Runs a bash script in the window. bash, not sh: when the foreground command
        handles Ctrl-C and exits, bash goes on with the script (dash would die with it)."""
        path = os.path.join(h.work, "%s.sh" % self.name)
        with open(path, "w") as f:
            f.write("export GRPC_VERBOSITY=ERROR\n" + script + "\nsleep 600\n")
        self.tmux("new-session", "-d", "-s", self.name, "-x", str(width), "-y", "50",
                  "bash %s" % path)

    def capture(self):
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def kill(self):
        self.tmux("kill-server", check=False)


def wait_file(path, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        time.sleep(0.1)
    raise Failure("%s: nothing in %s after %d s" % (what, path, timeout))


def sc_tty(h):
    if not shutil.which("tmux"):
        raise Skip("tmux is not installed (apt-get install tmux)")
    d = h.start(2, ["--model", h.spec("lenet5-2.json")], "tty")
    go, rc, raw = (os.path.join(h.work, n) for n in ("go", "rc", "raw.log"))
    # The command waits for `go` so that pipe-pane records its output from the first byte.
    cmd = ("while [ ! -e %s ]; do sleep 0.05; done\n%s --address %s train --steps 400 "
           "--progress-every 100\necho $? > %s" % (go, h.distdl, d.address, rc))
    t = Tmux(h, "bar")
    try:
        t.start(h, cmd)
        t.tmux("pipe-pane", "-o", "-t", "bar", "cat >> %s" % raw)
        open(go, "w").close()
        code = wait_file(rc, 90, "train in tmux")
        time.sleep(0.3)
        screen = t.capture()
    finally:
        t.kill()
    print("---- tmux pane ----\n%s\n---- end of pane ----" % screen.rstrip(), flush=True)
    check(code == "0", "train in tmux exited %s" % code)
    with open(raw, "rb") as f:
        raw_bytes = f.read().decode("utf-8", "replace")
    frames = [f for f in raw_bytes.split("\r") if "img/s" in f]
    print("%d bar frames redrawn with \\r; last: %r" %
          (len(frames), frames[-1] if frames else None), flush=True)
    check(len(frames) >= 3, "the bar was not redrawn in place (%d frames)" % len(frames))
    for f in frames:
        for w in ("step ", "loss ", "acc ", "img/s", "ETA "):
            check(w in f, "bar frame %r lacks %r" % (f, w))
    bars = [l for l in screen.splitlines() if "img/s  ETA" in l]
    check(len(bars) == 1, "the terminal shows %d progress lines, expected one bar" % len(bars))
    check("400/400" in bars[0] and "100%" in bars[0], "final bar %r" % bars[0])
    check("trained 400 steps" in screen, "no summary on the terminal")

    # Under a pipe: plain lines, one per record at --progress-every, no '\r'.
    _, err = h.cli(d, "train", "--steps", 400, "--progress-every", 100)
    check("\r" not in err and "\033" not in err, "control characters under a pipe: %r" % err)
    lines = [l for l in err.splitlines() if l.startswith("step ")]
    check([l.split()[1] for l in lines] == ["500", "600", "700", "800"],
          "plain progress lines %r" % lines)
    check(all("loss " in l and "img/s" in l and "ETA " in l for l in lines), "line %r" % lines)

    # A narrow terminal: the bar shrinks to fit (a wrapped line could not be redrawn with
    # '\r') and keeps step, loss, acc, img/s and ETA.
    rc3 = os.path.join(h.work, "rc3")
    t = Tmux(h, "narrow")
    try:
        t.start(h, "%s --address %s train --steps 200\necho $? > %s" % (h.distdl, d.address, rc3),
                width=72)
        code = wait_file(rc3, 60, "train in a narrow tmux")
        time.sleep(0.3)
        screen = t.capture()
    finally:
        t.kill()
    print("---- tmux pane (72 columns) ----\n%s\n---- end of pane ----" % screen.rstrip(),
          flush=True)
    bars = [l for l in screen.splitlines() if "img/s  ETA" in l]
    check(code == "0" and len(bars) == 1, "narrow terminal: %d bar lines" % len(bars))
    check(len(bars[0].rstrip()) <= 71 and all(w in bars[0] for w in ("step 1000", "loss ",
          "acc ", "img/s", "ETA ", "[")), "narrow bar %r" % bars[0])

    # Ctrl-C typed in the terminal (SIGINT to the foreground process group) cancels.
    rc2 = os.path.join(h.work, "rc2")
    t = Tmux(h, "ctrlc")
    try:
        t.start(h, "%s --address %s train --epochs 50\necho $? > %s" % (h.distdl, d.address, rc2))
        end = time.time() + 60
        while time.time() < end and "img/s" not in t.capture():
            time.sleep(0.1)
        check("img/s" in t.capture(), "no bar in tmux before Ctrl-C")
        t.tmux("send-keys", "-t", "ctrlc", "C-c")
        code = wait_file(rc2, 60, "Ctrl-C in tmux")
        screen = t.capture()
    finally:
        t.kill()
    print("---- tmux pane ----\n%s\n---- end of pane ----" % screen.rstrip(), flush=True)
    check(code == "130", "Ctrl-C: exit %s, expected 130" % code)
    stopped = [l for l in screen.splitlines() if "cancelled; the daemon stopped at step" in l]
    check(stopped, "no cancellation message on the terminal")
    step = int(stopped[0].rsplit(" ", 1)[1])
    check(h.status(d)["step"] == step and h.status(d)["state"] == "idle",
          "the daemon is not idle at step %d" % step)
    h.cli(d, "shutdown")
    d.wait_exit()


# ---- SIGINT -----------------------------------------------------------------------------

def sc_sigint(h):
    d = h.start(2, ["--model", h.spec("lenet5-2.json")], "sigint")
    env = dict(os.environ, GRPC_VERBOSITY="ERROR")
    argv = [h.distdl, "--address", d.address, "--json", "train", "--epochs", "50",
            "--progress-every", "10"]
    print("$ " + " ".join(argv), flush=True)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        end = time.time() + 60
        while time.time() < end:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if json.loads(line)["event"] == "progress" and len(lines) >= 3:
                break
        check(len(lines) >= 3, "no progress before the signal: %r" % lines)
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    print("".join(lines) + rest + err, flush=True)
    print("exit %d, %.2f s after SIGINT" % (p.returncode, time.time() - t0), flush=True)
    check(p.returncode == 130, "SIGINT: exit %d, expected 130" % p.returncode)
    objs = [json.loads(l) for l in (lines + rest.splitlines())]
    last = objs[-1]
    check(last["event"] == "cancelled" and all(k in last for k in FIELDS["cancelled"]),
          "last line %r" % last)
    check(last["done"] < last["total"], "the train was not cut short: %r" % last)
    s = h.status(d)
    check(s["step"] == last["step"] and s["state"] == "idle",
          "status %r after the CLI said it stopped at %d" % (s, last["step"]))
    check(h.one(d, "health")["serving"] is True, "not serving after SIGINT")
    done = h.js(d, "train", "--steps", 10)[-1]
    check(done["event"] == "done" and done["step"] == last["step"] + 10,
          "training after SIGINT: %r" % done)
    # No --checkpoint-dir: shutdown stops the daemon without a final checkpoint.
    sd = h.one(d, "shutdown", event="shutdown")
    check(sd["checkpoint"] is False and sd["durable_step"] == -1, "shutdown %r" % sd)
    d.wait_exit()


# ---- unix socket ------------------------------------------------------------------------

def sc_unix(h):
    """A daemon on --listen unix:PATH started without a model: --address-file names the
    socket, --address unix:PATH dials it; status says there is no model, `wait` finds it
    reachable but `wait --ready` runs out of time (exit 3, naming the missing model), train
    is refused (exit 4), create makes one, `wait --ready` then succeeds, and it trains."""
    sock = os.path.join(h.work, "distdld.sock")
    d = h.start(2, [], "unix", listen="unix:" + sock)
    check(d.address == "unix:" + sock, "address file says %r" % d.address)
    s = h.one(None, "--address-file", d.addr_file, "status", event="status")
    check(s["has_model"] is False and s["world_size"] == 2, "status without a model %r" % s)
    # wait: reachable at once; --ready runs out of time without a model (3, retryable,
    # naming why, after the --timeout and not much later); nothing there at all is 3 too.
    w = h.one(None, "--address-file", d.addr_file, "wait", event="reachable")
    check(w["has_model"] is False and w["waited_seconds"] < 10, "wait %r" % w)
    t0 = time.time()
    e = h.js(None, "--address-file", d.addr_file, "--timeout", 1.5, "wait", "--ready",
             expect=3)[-1]
    check(e["code"] == "UNAVAILABLE" and "no model" in e["message"] and
          1.3 < time.time() - t0 < 10, "wait --ready without a model: %r" % e)
    h.js(None, "--address", "unix:" + sock + ".none", "--timeout", 1, "wait", expect=3)
    out, _ = h.cli(None, "--address", "unix:" + sock, "status")
    check("model      none" in out, "status text without a model %r" % out)
    e = h.js(None, "--address", "unix:" + sock, "train", "--steps", 5, expect=4)[-1]
    check(e["code"] == "FAILED_PRECONDITION", "train without a model: %r" % e)
    out, _ = h.cli(None, "--address", "unix:" + sock, "create", h.spec("lenet5-2.json"))
    check(out.startswith("created model 'lenet5-2': 61706 parameters on 2 ranks"),
          "create prints %r" % out)
    w = h.one(None, "--address", "unix:" + sock, "wait", "--ready", event="ready")
    check(w["has_model"] is True and w["model_name"] == "lenet5-2", "wait --ready %r" % w)
    done = h.js(None, "--address", "unix:" + sock, "train", "--steps", 20)[-1]
    check(done["event"] == "done" and done["step"] == 20, "train over the socket %r" % done)
    h.cli(None, "--address", "unix:" + sock, "shutdown")
    d.wait_exit()


# ---- help -------------------------------------------------------------------------------

def sc_help(h):
    # An address where nothing listens: --help must not try to connect.
    env = {"DDL_ADDRESS": "127.0.0.1:%d" % free_port()}
    for args in (["--help"], ["help"], ["--json", "--help"]):
        out, _ = h.cli(None, *args, env_extra=env, timeout=10)
        check(out.startswith("usage: distdl") and all(c in out for c in COMMANDS) and
              "Exit codes" in out, "global help %r" % out)
    for c in COMMANDS:
        for args in ([c, "--help"], ["help", c], ["--help", c], [c, "--help", "--bogus"]):
            out, _ = h.cli(None, *args, env_extra=env, timeout=10)
            check(out.startswith("usage: distdl [global options] " + c),
                  "%r prints %r" % (args, out[:80]))


# ---- a graph model served ---------------------------------------------------------------

def sc_graph(h):
    """The ResNet-style graph spec (residual adds, fan-out, global pooling) through the
    daemon with the same commands as a chain: create, train, eval, predict, pull/push,
    checkpoint/restore."""
    ck = os.path.join(h.work, "ckpt")
    d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--checkpoint-dir", ck], "graph")
    spec = h.spec("resnet-2.json")
    with open(spec) as f:
        nlayers = len(json.load(f)["layers"])
    c = h.one(d, "create", spec, "--name", "resnet", "--replace", event="create")
    check(c["name"] == "resnet" and c["world_size"] == 2 and c["num_classes"] == 10
          and c["input_shape"] == [1, 28, 28], "create %r" % c)
    objs = h.js(d, "train", "--steps", 40, "--progress-every", 20)
    prog = [o for o in objs if o["event"] == "progress"]
    check([o["done"] for o in prog] == [20, 40] and objs[-1]["event"] == "done",
          "train records %r" % objs)
    wm = window_means(prog)
    check(wm[1] < 0.95 * wm[0] and wm[1] < 2.0,
          "the ResNet's mean loss of 20 steps did not fall: %r" % wm)
    e1 = h.one(d, "eval", event="eval")
    check(e1["count"] == 10000 and e1["accuracy"] > 0.3, "eval after 40 steps %r" % e1)

    n = 300
    x, y = test_images(n)
    xin, zout = os.path.join(h.work, "x.npy"), os.path.join(h.work, "logits.npy")
    np.save(xin, x)
    p = h.one(d, "predict", "--input", xin, "--output", zout, event="predict")
    z = np.load(zout)
    check(z.shape == (n, 10) and np.isfinite(z).all() and p["classes"] == z.argmax(1).tolist(),
          "predict: logits %s, classes vs argmax" % (z.shape,))
    acc = float((z.argmax(1) == y).mean())
    print("resnet-2 through the daemon: eval %.4f on 10000, predict %.4f on %d" %
          (e1["accuracy"], acc, n), flush=True)
    check(abs(acc - e1["accuracy"]) < 0.12, "predict accuracy %.4f vs eval %.4f" %
          (acc, e1["accuracy"]))

    # Pull, train on, push back: the same evaluation to the last bit (every parameter and
    # batch-norm statistic of the graph is in the named state).
    w1 = os.path.join(h.work, "w1.safetensors")
    pl = h.one(d, "pull", "--output", w1, event="pull")
    # Every conv, batch norm (weight, bias, running statistics) and the classifier.
    check(pl["tensors"] > nlayers // 2 and pl["bytes"] >= 4 * c["num_parameters"],
          "pull %r of %d layers" % (pl, nlayers))
    h.js(d, "train", "--steps", 10)
    z2 = os.path.join(h.work, "logits2.npy")
    h.one(d, "predict", "--input", xin, "--output", z2, event="predict")
    check(not np.array_equal(np.load(z2), z), "training changed no prediction")
    h.one(d, "push", "--input", w1, event="push")
    e3 = h.one(d, "eval", event="eval")
    check(e3["loss"] == e1["loss"] and e3["accuracy"] == e1["accuracy"],
          "after pushing the pulled weights %r, before %r" % (e3, e1))
    h.one(d, "predict", "--input", xin, "--output", z2, event="predict")
    check(np.array_equal(np.load(z2), z), "predict after push differs")

    k = h.one(d, "checkpoint", event="checkpoint")
    h.js(d, "train", "--steps", 5)
    r = h.one(d, "restore", "latest", event="restore")
    check(r["step"] == k["step"], "restore %r after checkpoint %r" % (r, k))
    h.one(d, "predict", "--input", xin, "--output", z2, event="predict")
    check(np.array_equal(np.load(z2), z), "predict after restore differs")
    h.one(d, "shutdown", event="shutdown")
    d.wait_exit()


# ---- the 3-D U-Nets served: dense targets and a label per voxel ------------------------------

def sc_volumes(h):
    d = h.start(2, ["--model", h.spec("lenet5-2.json")], "volumes")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 1, 16, 16, 16)).astype(np.float32)
    xin = os.path.join(h.work, "vol.npy")
    np.save(xin, x)
    for name, out_c in (("unet3d-denoise-2", 1), ("unet3d-2", 3)):
        with open(h.spec(name + ".json")) as f:
            spec = json.load(f)
        spec["input"]["shape"] = [1, 16, 16, 16]
        path = os.path.join(h.work, name + "-16.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        c = h.one(d, "create", path, "--replace", event="create")
        check(c["name"] == name and c["input_shape"] == [1, 16, 16, 16], "create %r" % c)
        e0 = h.one(d, "eval", event="eval")
        done = h.js(d, "train", "--steps", 30)[-1]
        check(done["event"] == "done" and done["step"] == 30, "train %r" % done)
        e1 = h.one(d, "eval", event="eval")
        check(e1["count"] == 64 and e1["loss"] < e0["loss"],
              "%s: eval before %r, after 30 steps %r" % (name, e0, e1))
        if out_c == 1:
            check(0 <= e1["mse"] and 0 < e1["rel_l2"] < e0["rel_l2"] and e1["accuracy"] == -1
                  and e1["fg_iou"] == -1, "denoising eval %r (before %r)" % (e1, e0))
        else:
            check(e1["mse"] == -1 and 0 <= e1["accuracy"] <= 1 and -1 <= e1["fg_iou"] <= 1,
                  "segmentation eval %r" % e1)
        zout = os.path.join(h.work, name + "-out.npy")
        p = h.one(d, "predict", "--input", xin, "--output", zout, event="predict")
        z = np.load(zout)
        check(z.shape == (3, out_c, 16, 16, 16) and np.isfinite(z).all() and
              p["shape"] == list(z.shape), "%s: predict %s %r" % (name, z.shape, p))
        meta = h.raw_model_metadata(d, name)
        check(meta == [-1, out_c, 16, 16, 16], "%s: ModelMetadata output shape %r" % (name, meta))
        print("%s through the daemon: eval loss %.4f -> %.4f after 30 steps (%s), predict %s"
              % (name, e0["loss"], e1["loss"],
                 "rel L2 %.3f -> %.3f" % (e0["rel_l2"], e1["rel_l2"]) if out_c == 1
                 else "voxel acc %.3f, fg IoU %.3f" % (e1["accuracy"], e1["fg_iou"]),
                 z.shape), flush=True)
        e = h.js(d, "eval", "--dataset", ".", expect=4)[-1]
        check(e["code"] == "INVALID_ARGUMENT" and "generates its data" in e["message"],
              "a dataset for a generating spec: %r" % e)
        inline_targets(h, d, name, x, z, out_c)
    h.one(d, "shutdown", event="shutdown")
    d.wait_exit()


def inline_targets(h, d, name, x, z, out_c):
    """Inline batches with the targets a volume model learns from, as .npy files through
    `distdl step` and `distdl eval --input --targets`: FP32 (and FP64) fields shaped like
    the output for the denoiser, INT64 classes per voxel for the segmenter. The daemon's
    metrics are checked against the predicted volume z of the same samples, and each bad
    target is refused with expected versus got and changes nothing."""
    rng = np.random.default_rng(5)
    dense = out_c == 1
    if dense:
        t = np.clip(x + 0.1 * rng.standard_normal(x.shape), 0, None).astype(np.float32)
    else:
        t = rng.integers(0, out_c, size=(x.shape[0],) + x.shape[2:]).astype(np.int64)
    xin, tin = (os.path.join(h.work, name + s) for s in ("-x.npy", "-t.npy"))
    np.save(xin, x)
    np.save(tin, t)
    # Evaluate the 3 samples inline: the metrics of the prediction z the client holds.
    e = h.one(d, "eval", "--input", xin, "--targets", tin, event="eval")
    check(e["split"] == "inline" and e["count"] == 3, "inline eval %r" % e)
    if dense:
        err = z.astype(np.float64) - t
        mse, rel = np.mean(err ** 2), np.linalg.norm(err) / np.linalg.norm(t)
        check(abs(e["mse"] - mse) <= 1e-5 * mse and abs(e["rel_l2"] - rel) <= 1e-5 * rel,
              "%s inline eval %r, the prediction gives mse %.8g rel L2 %.8g" % (name, e, mse, rel))
        # FP64 targets for the FP32 model: converted, the same figures.
        t64 = os.path.join(h.work, name + "-t64.npy")
        np.save(t64, t.astype(np.float64))
        e64 = h.one(d, "eval", "--input", xin, "--targets", t64, event="eval")
        check(abs(e64["mse"] - e["mse"]) <= 1e-6 * e["mse"], "FP64 targets %r vs %r" % (e64, e))
    else:
        acc = np.mean(np.argmax(z, axis=1) == t)
        check(abs(e["accuracy"] - acc) <= 1e-9 and -1 <= e["fg_iou"] <= 1 and e["mse"] == -1,
              "%s inline eval %r, the prediction gives voxel accuracy %.6f" % (name, e, acc))
    # One step on the spec's batch (2 samples).
    np.save(xin, x[:2])
    np.save(tin, t[:2])
    before = h.status(d)["step"]
    r = h.one(d, "step", "--input", xin, "--targets", tin, event="step")
    check(r["step"] == before + 1 and np.isfinite(r["loss"]) and
          ((r["mse"] >= 0 and r["accuracy"] == -1) if dense else
           (r["mse"] == -1 and 0 <= r["accuracy"] <= 1)), "%s step %r" % (name, r))
    # Bad targets: refused INVALID_ARGUMENT, expected versus got, the step unchanged.
    bad = []
    if dense:
        tn = t[:2].copy()
        tn[1, 0, 3, 4, 5] = np.nan
        bad = [(tn, "expected finite values, got NaN at element"),
               (t[:2, :, :8], "expected shape [2, 1, 16, 16, 16], got [2, 1, 8, 16, 16]"),
               (np.zeros(2, np.int64), "expected datatype FP32 or FP64 (the loss mse), got "
                                       "\"INT64\"")]
    else:
        to = t[:2].copy()
        to[1, 2, 3, 4] = out_c
        bad = [(to, "expected a class in [0, 3), got 3 (sample 1"),
               (t[:2].astype(np.float32), "expected datatype INT64 (the loss cross_entropy)"),
               (np.zeros(2, np.int64), "expected shape [2, 16, 16, 16], got [2]")]
    for tb, words in bad:
        np.save(tin, tb)
        for cmd in ("step", "eval"):
            f = h.js(d, cmd, "--input", xin, "--targets", tin, expect=4)[-1]
            check(f["code"] == "INVALID_ARGUMENT" and words in f["message"],
                  "%s %s with bad targets: %r (expected %r)" % (name, cmd, f, words))
    check(h.status(d)["step"] == before + 1, "bad targets changed the step")
    # Both targets and labels in one batch (the raw wire): refused.
    st, msg = h.raw_step(d, x[:2], np.zeros(2, np.int64), targets=t[:2])
    check(st == "INVALID_ARGUMENT" and "exactly one of targets and labels" in msg,
          "targets and labels: %s %s" % (st, msg))
    print("%s inline: eval %s, step %d loss %.4f; %d bad targets refused"
          % (name, "mse %.5g rel L2 %.4f" % (e["mse"], e["rel_l2"]) if dense
             else "voxel acc %.4f" % e["accuracy"], r["step"], r["loss"], 2 * len(bad)),
          flush=True)


# ---- a push that races a create: ABORTED, exit 6 --------------------------------------------

def sc_aborted(h):
    """A push whose weights stream in while a `create --replace` waits ahead of it (both
    queued behind a Train): the daemon refuses it ABORTED, distdl exits 6 (retryable, not 4)
    with code ABORTED, nothing is changed (the new model keeps its fresh weights), and the
    same push run again succeeds."""
    spec = h.spec("lenet5-2.json")
    d = h.start(2, ["--model", spec], "aborted")
    fresh, trained, after = (os.path.join(h.work, n + ".safetensors")
                             for n in ("fresh", "trained", "after"))
    h.cli(d, "pull", "--output", fresh)
    h.js(d, "train", "--steps", 5)
    h.cli(d, "pull", "--output", trained)
    with open(fresh, "rb") as f0, open(trained, "rb") as f1:
        check(f0.read() != f1.read(), "5 steps did not change the weights")
    def wait_for(what, cond):
        end = time.time() + 30
        while True:
            st = h.raw_get_status(d)
            if cond(st):
                return
            if time.time() > end:
                raise Failure("waited 30 s for %s: %s" % (what, st))
            time.sleep(0.02)

    env = dict(os.environ, GRPC_VERBOSITY="ERROR", DDL_ADDRESS=d.address)
    env.pop("DDL_TOKEN", None)

    def start(*args):
        argv = [h.distdl] + [str(a) for a in args]
        print("$ " + " ".join(argv) + " &", flush=True)
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)

    for json_mode in (False, True):
        procs = []
        try:
            train = start("train", "--epochs", "50")
            procs.append(train)
            wait_for("the Train", lambda st: st.state == "training")
            create = start("create", spec, "--replace")
            procs.append(create)
            wait_for("the CreateModel to queue", lambda st: st.request_queue_depth == 1)
            push = start(*((["--json"] if json_mode else []) + ["push", "--input", trained]))
            procs.append(push)
            wait_for("the PushWeights to queue", lambda st: st.request_queue_depth == 2)
            train.send_signal(signal.SIGINT)
            outs = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        check(train.returncode == 130, "train: exit %d, expected 130" % train.returncode)
        check(create.returncode == 0, "create --replace: exit %d" % create.returncode)
        out, err = outs[2]
        print("push: exit %d\n%s%s" % (push.returncode, out, err), flush=True)
        check(push.returncode == 6, "a push that raced a create: exit %d, expected 6 (retryable)"
              % push.returncode)
        if json_mode:
            e = json.loads(out.splitlines()[-1])
            check(e["event"] == "error" and e["code"] == "ABORTED" and e["exit"] == 6 and
                  "push again" in e["message"], "the error object %r" % e)
        else:
            check("distdl push:" in err and "ABORTED" in err and "push again" in err,
                  "the message does not say ABORTED / push again: %r" % err)
        s = h.status(d)
        check(s["step"] == 0 and s["state"] == "idle", "after the race: %r" % s)
        h.cli(d, "pull", "--output", after)
        with open(fresh, "rb") as f0, open(after, "rb") as f1:
            check(f0.read() == f1.read(), "the aborted push changed the new model's weights")
        # Retryable: the same command, run again, succeeds.
        h.one(d, "push", "--input", trained, event="push")
        h.cli(d, "pull", "--output", after)
        with open(trained, "rb") as f0, open(after, "rb") as f1:
            check(f0.read() == f1.read(), "the retried push did not apply")
    h.raw_close(d)
    h.cli(d, "shutdown")
    d.wait_exit()


SCENARIOS = {
    "session": sc_session,
    "exit": sc_exit,
    "tty": sc_tty,
    "sigint": sc_sigint,
    "unix": sc_unix,
    "help": sc_help,
    "graph": sc_graph,
    "aborted": sc_aborted,
    "volumes": sc_volumes,
}

if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, SCENARIOS))
