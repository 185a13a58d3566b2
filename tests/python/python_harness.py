#!/usr/bin/python3
"""Tests of the Python binding (client/python/distdl_client) and of the example notebook
against real distdld daemons under mpirun (tests/support/ddl_daemon.py).

  python_harness.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] SCENARIO

binding       every Client method on a 2-rank daemon: errors mapped to exceptions, a Train
              generator left early cancels and the daemon serves on, pull -> push gives
              identical results, predict equals the C client's, the context manager closes.
fields        a regression U-Net trained from Python on numpy fields: the screened Poisson
              solution operator (client/python/examples/poisson3d.py) at 16^3 on 2 ranks,
              inline steps with float32 targets, held-out relative L2 error falls, predict
              returns the volume and its error equals Evaluate's; bad targets (a bce target
              out of [0, 1], integer targets, a wrong shape) raise InvalidArgument and change
              nothing.
hdf5          the new user's path: an HDF5 file written with h5py (poisson3d.write_h5), a
              4-rank daemon, the regression U-Net (unet3d-poisson-4 at 16^3) trained from
              Python on the file by name, each rank reading its own box; held-out relative
              L2 error falls, the predicted volumes come back as numpy and match Evaluate;
              a file that does not fit the model is refused and changes nothing.
memcap        the headline at CI size: the regression U-Net at 32^3 under a per-rank memory
              cap of 60 MiB (each rank in a cgroup v1 memory group of its own,
              deploy/memcap.sh). One rank: CreateModel is refused by the memory estimate,
              the estimate and the cap in the message, and under a larger cap its steps
              charge more than 60 MiB (it really does not fit). Four ranks: it trains from an HDF5
              file that no rank reads whole (the daemon's per-rank byte counts are a
              quarter each), the held-out error falls, and every rank's peak charge (the
              group's memory.max_usage_in_bytes) stays under the cap.
notebook      train.py is what sync_script.py makes of train.ipynb; the notebook runs headless
              (jupyter nbconvert --execute, Debian's python3 kernel) on one fresh daemon and
              train.py on another: every cell ran, no errors, figures inline and as PNG files,
              and the two runs have identical records, test accuracy, weights and pixels.
poisson_notebook
              the PDE surrogate notebook (client/python/examples/poisson.ipynb) headless on
              a fresh 4-rank daemon: it writes the screened Poisson data to HDF5 in the
              daemon's data root, trains the U-Net on the file, and every cell ran with no
              error, the loss curve and the slices (true, predicted, error) inline and as
              PNG files, the held-out relative L2 error fell, and the one it computes from
              the predicted arrays equals Evaluate's.
notebook_cli  the notebook's records against the distdl CLI's (`distdl --json train/eval`) on
              a fresh daemon with the same spec and seed. Without build/bin/distdl it prints
              "CLI not built: comparison not run" and fails when DDL_REQUIRE_CLI=1, else skips.

Exit status: 0 pass, 1 fail, 7 skip.
"""
import gc
import json
import math
import os
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
from ddl_daemon import DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402

import numpy as np  # noqa: E402

import distdl_client as dc  # noqa: E402
from distdl_client import fashion_mnist  # noqa: E402

SPEC = "lenet5-2.json"
# The notebook run: steps and progress interval (every record is one step's loss).
NB_STEPS = 120
NB_EVERY = 4


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-python-it-")
        self.examples = os.path.join(a.source, "client", "python", "examples")
        self.py_client_ref = os.path.join(a.build, "tests", "py_client_ref")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        raise Failure(what)


def expect(exc_cls, fn, what, contains=None):
    """Calls fn(), which must raise exc_cls (a message containing `contains`)."""
    try:
        fn()
    except exc_cls as e:
        msg = str(e)
        ok = contains is None or contains in msg
        check(ok, "%s -> %s: %s" % (what, type(e).__name__, msg))
        return e
    except Exception as e:
        raise Failure("%s: expected %s, got %s: %s" % (what, exc_cls.__name__,
                                                      type(e).__name__, e))
    raise Failure("%s: expected %s, nothing was raised" % (what, exc_cls.__name__))


def wait_idle(c, timeout=30):
    """The status once the daemon is idle: a cancelled Train ends on the client at once and
    on the daemon at its next step boundary."""
    end = time.time() + timeout
    while True:
        st = c.status()
        if st.state == "idle" or time.time() > end:
            return st
        time.sleep(0.02)


# ---- binding -------------------------------------------------------------------------------

def sc_binding(h):
    # No daemon: a closed port is UNAVAILABLE, at connect or (timeout 0) at the first call.
    e = expect(dc.Unavailable, lambda: dc.Client("127.0.0.1:1", timeout=0.5),
               "connect to a closed port")
    check(e.code == 14 and e.code_name == "UNAVAILABLE" and "127.0.0.1:1" in e.message,
          "code %d %s, message names the address" % (e.code, e.code_name))
    check(isinstance(e, dc.Retryable) and e.retryable, "UNAVAILABLE is retryable")
    lazy = dc.Client("127.0.0.1:1", timeout=0)
    expect(dc.Unavailable, lazy.status, "GetStatus with no daemon (lazy connect)")
    lazy.close()
    # The retryable codes are the CLI's exit 3 and 6: UNAVAILABLE and ABORTED (a push that
    # raced a CreateModel, tests/client/cli_harness.py aborted); the rest are permanent.
    ab = dc.errors.make(10, "PushWeights: ABORTED: PushWeights: the model was replaced while "
                        "the weights streamed in; push again", "DDL_EREMOTE")
    check(type(ab) is dc.Aborted and isinstance(ab, dc.Retryable) and ab.retryable and
          ab.code_name == "ABORTED" and not ab.local, "ABORTED: Aborted, a Retryable")
    check(dc.RETRYABLE == {10, 14}, "RETRYABLE %r" % (dc.RETRYABLE,))
    for code in set(dc.CODES) - {0, 10, 14}:
        x = dc.errors.make(code, "a failure", "DDL_EREMOTE")
        check(not x.retryable and not isinstance(x, dc.Retryable),
              "%s is permanent" % x.code_name)
    # Options reach ddl_client_options: the C library's own checks answer (local errors).
    e = expect(dc.InvalidArgument, lambda: dc.Client("127.0.0.1:1", token="a\nb"),
               "a token with a line break", contains="token")
    check(e.local and e.code == 3 and e.status == "DDL_EINVAL", "refused locally, DDL_EINVAL")
    expect(dc.InvalidArgument, lambda: dc.Client("127.0.0.1:1", tls_cert="c.pem", tls_key="k.pem"),
           "a client certificate without a CA", contains="tls_ca_file")
    e = expect(dc.DistdlError, lambda: dc.Client("127.0.0.1:1", tls_ca="/nonexistent/ca.pem"),
               "a missing CA file", contains="/nonexistent/ca.pem")
    check(e.local and e.status == "DDL_EIO", "a local file error: %s" % e.status)
    expect(ValueError, lambda: dc.Client(address="a:1", address_file="f"), "address and file")
    expect(FileNotFoundError, lambda: dc.Client(address_file=os.path.join(h.work, "none")),
           "missing address file")

    ck = os.path.join(h.work, "ck")
    d = h.start(2, ["--queue", "4", "--checkpoint-dir", ck], "binding")
    x, y = fashion_mnist.load("train", count=256)
    xb, yb = x[:64], y[:64]

    with dc.Client(d.address, call_timeout=60) as c:
        check(c.health() == "SERVING", "health SERVING")
        check(c.server_live(), "server live")
        check(not c.model_ready() and not c.server_ready(), "no model yet: not ready")
        st = c.status()
        check(not st.has_model and st.state == "idle", "status before a model: %s" % (st,))
        check((st.active_calls, st.request_queue_depth, st.dropped_calls, st.bytes_per_step) ==
              (0, 0, 0, 0), "call accounting before a model: %s" % (st,))
        e = expect(dc.FailedPrecondition, lambda: c.step(xb, yb), "step before a model")
        check(e.code == 9 and not e.local and not e.retryable,
              "FAILED_PRECONDITION from the daemon, permanent")
        expect(dc.InvalidArgument, lambda: c.create('{"name": "x", "layers": 3}'),
               "create with a bad spec")
        expect(FileNotFoundError, lambda: c.create(os.path.join(h.work, "nope.json")),
               "create from a missing file")
        expect(TypeError, lambda: c.create(42), "create with a number")

        info = c.create(h.spec(SPEC))
        check(info.world_size == 2 and info.batch_size == 64 and
              info.input_shape == (1, 28, 28) and info.num_classes == 10 and
              info.num_parameters == 61706, "create from a file: %s" % (info,))
        with open(h.spec(SPEC)) as f:
            spec = json.load(f)
        info = c.create(spec, replace=True)
        check(info.num_parameters == 61706, "create from a dict (replace)")
        expect(dc.FailedPrecondition, lambda: c.create(spec), "create again without replace")
        check(c.model_ready() and c.server_ready(), "ModelReady and ServerReady true")

        # Step: inline, bad shapes and dtypes (nothing changes), submitted batches.
        r = c.step(xb, yb)
        check(r.step == 1 and math.isfinite(r.loss) and 0 <= r.accuracy <= 1,
              "step 1 (uint8 pixels, int64 labels): loss %.4f" % r.loss)
        r = c.step(xb, yb.astype(np.int32))
        check(r.step == 2, "step 2 with int32 labels (converted to int64)")
        e = expect(dc.InvalidArgument, lambda: c.step(x[:64, :, :27, :], yb),
                   "step with x [64, 1, 27, 28]", contains="expected shape")
        check(e.code == 3 and e.code_name == "INVALID_ARGUMENT" and "Step" in e.message,
              "the message names the call and the expected shape")
        expect(dc.InvalidArgument, lambda: c.step(xb, y[:63]), "step with 63 labels for 64")
        expect(TypeError, lambda: c.step(xb.astype(np.float16), yb), "float16 x")
        expect(dc.InvalidArgument, lambda: c.step(xb, yb.astype(np.float32)),
               "float targets for a classifier", contains='expected datatype INT64 (the loss '
               'cross_entropy), got "FP32"')
        expect(ValueError, lambda: c.step(xb), "step with x and no y")
        st, raw = c.status(), h.raw_get_status(d)
        check(st.step == 2, "the bad steps changed nothing (step 2)")
        # After its first step the 2-rank model has a traffic figure, the one GetStatus gives
        # over raw gRPC; the idle daemon has no other call and nothing queued or dropped.
        check(st.bytes_per_step > 0 and st.bytes_per_step == raw.bytes_per_step and
              (st.active_calls, st.request_queue_depth, st.dropped_calls) == (0, 0, 0),
              "call accounting after two steps: %s (raw GetStatus: %s)" % (st, raw))
        xf = ((xb.astype(np.float32) / 255 - 0.2860) / 0.3530)[:, :, ::-1, :]  # not contiguous
        r = c.step(xf, yb)
        check(r.step == 3, "step 3 with a non-contiguous float32 array")
        s = c.submit(xb, yb)
        check(s.accepted == 1 and s.queue_depth == 1, "submit one batch: %s" % (s,))
        s = c.submit_many([(x[64:128], y[64:128]), (x[128:192], y[128:192])])
        check(s.accepted == 2 and s.queue_depth == 3, "submit two batches: %s" % (s,))
        for k in range(3):
            check(c.step().step == 4 + k, "step %d on a submitted batch" % (4 + k))
        expect(dc.FailedPrecondition, lambda: c.step(), "step with the queue empty")

        # Evaluate and predict; the C client (py_client_ref) gives the same logits.
        ev = c.evaluate()
        check(ev.count == 10000 and 0 < ev.accuracy <= 1 and math.isfinite(ev.loss),
              "evaluate the test split: %s" % (ev,))
        evb = c.evaluate(x[192:256], y[192:256])
        check(evb.count == 64, "evaluate inline samples: %s" % (evb,))
        expect(dc.InvalidArgument, lambda: c.evaluate(split="nope"), "evaluate a bad split")
        xt, yt = fashion_mnist.load("test", count=32)
        logits = c.predict(xt)
        check(logits.shape == (32, 10) and logits.dtype == np.float32 and
              logits.flags.owndata, "predict: %s %s" % (logits.shape, logits.dtype))
        u8 = os.path.join(h.work, "x.u8")
        f32 = os.path.join(h.work, "logits.f32")
        xt.tofile(u8)
        h.run(None, [h.py_client_ref, "predict", d.address, u8, "32", f32])
        ref = np.fromfile(f32, dtype=np.float32).reshape(32, 10)
        check(np.array_equal(ref, logits), "predict equals the C client's logits (bitwise)")
        check(np.array_equal(c.infer(xt), logits), "ModelInfer equals Predict")
        expect(dc.InvalidArgument, lambda: c.predict(xt[:, :, :20]), "predict a bad shape")
        results = []

        def predict_many():
            for _ in range(5):
                results.append(np.array_equal(c.predict(xt), logits))
        ts = [threading.Thread(target=predict_many) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        check(len(results) == 15 and all(results),
              "3 threads x 5 predicts on one connection: %d identical" % sum(results))

        # Weights: pull, modify, push; the original back gives identical results.
        w = c.pull_weights()
        check(len(w) == 10 and w["fc3.weight"].shape == (10, 84) and
              sum(a.size for a in w.values()) == 61706, "pull: %d tensors" % len(w))
        z = dict(w)
        z["fc3.weight"] = np.zeros_like(w["fc3.weight"])
        z["fc3.bias"] = np.eye(10, dtype=np.float32)[7]
        p = c.push_weights(z)
        check(p.tensors == 10, "push modified weights: %s" % (p,))
        check((c.predict(xt).argmax(axis=1) == 7).all(), "zero fc3 + one-hot bias: all class 7")
        partial = {k: v for k, v in w.items() if k != "fc1.bias"}
        expect(dc.InvalidArgument, lambda: c.push_weights(partial), "push without fc1.bias")
        check((c.predict(xt).argmax(axis=1) == 7).all(), "the refused push changed nothing")
        c.push_weights(w)
        check(np.array_equal(c.predict(xt), logits), "original weights back: identical logits")
        check(c.evaluate(x[192:256], y[192:256]) == evb, "and identical evaluate")
        wf = os.path.join(h.work, "w.safetensors")
        c.pull_weights(wf)
        back = dc.read_safetensors(wf)
        check(list(back) == list(w) and all(np.array_equal(back[k], w[k]) for k in w),
              "pull to a file = pull to memory")
        c.push_weights(wf)
        check(np.array_equal(c.predict(xt), logits), "push from the file: identical logits")
        w2 = os.path.join(h.work, "w2.safetensors")
        dc.write_safetensors(w2, w)
        check(all(np.array_equal(dc.read_safetensors(w2)[k], w[k]) for k in w),
              "write_safetensors / read_safetensors round trip")

        # Checkpoint and restore.
        cp = c.checkpoint()
        check(cp.durable and cp.step == 6 and cp.path.startswith(ck), "checkpoint: %s" % (cp,))
        c.step(xb, yb)
        check(c.restore() == 6 and c.status().step == 6, "restore the newest checkpoint")
        check(np.array_equal(c.predict(xt), logits), "restored weights: identical logits")
        expect(dc.NotFound, lambda: c.restore(999), "restore a step never written")

        # Train: a full run, then one left early (cancelled); the daemon serves on.
        recs = list(c.train(steps=12, progress_every=4))
        steps = [p.step for p in recs if not p.finished]
        check(steps == [10, 14, 18] and recs[-1].finished and recs[-1].step == 18,
              "train 12 steps, a record every 4: %s + finished" % steps)
        t0 = time.time()
        seen = []
        # A long Train, so that "stopped early" is judged against 20,000 steps, not against
        # how fast the cancel travels on a loaded machine: beside a second suite the daemon
        # ran 251 steps past the break (1.4 s) before it saw it, with 3 CPU hogs beside it
        # up to 1,861 (9 s; the binary before this session's server change too: 1,259, 4.7
        # s), and on the CI host's full suite 3,997 (14.6 s) of a 4,000-step Train. The
        # lag is printed; here it is judged only that the cancel stopped the Train.
        for p in c.train(steps=20000, progress_every=1):
            seen.append(p.step)
            if len(seen) == 3:
                break
        check(threading.active_count() == 1, "break after 3 records: the worker thread joined")
        st = wait_idle(c, timeout=120)
        check(st.state == "idle" and 21 <= st.step < 21 + 20000,
              "cancelled: the daemon stopped at step %d of 20021 (%s, %.1f s)"
              % (st.step, st.state, time.time() - t0))
        r = c.step(xb, yb)
        check(r.step == st.step + 1, "the daemon serves on: step %d" % r.step)
        g = c.train(steps=5, dataset="../etc")
        expect(dc.InvalidArgument, lambda: next(g), "train on a dataset outside the root")
        expect(ValueError, lambda: c.train(steps=3, epochs=1), "train with steps and epochs")
        expect(ValueError, lambda: c.train(), "train with neither")
        # A generator dropped unfinished is closed by the garbage collector: it cancels too.
        g2 = c.train(steps=400, progress_every=1)
        next(g2)
        del g2
        gc.collect()
        check(wait_idle(c).state == "idle" and threading.active_count() == 1,
              "a dropped Train generator cancels and joins")
    check(c.closed, "the context manager closed the connection")
    expect(ValueError, c.status, "a call after close")

    # A Train in progress on another thread is cancelled by close().
    c = dc.Client(d.address)
    first = threading.Event()
    out = {}

    def consume():
        try:
            for p in c.train(steps=400, progress_every=1):
                first.set()
            out["ok"] = True
        except BaseException as e:  # noqa: B902
            out["error"] = e
    t = threading.Thread(target=consume)
    t.start()
    check(first.wait(60), "a Train started on another thread")
    c.close()
    t.join(60)
    check(not t.is_alive() and out.get("ok"), "close() cancelled it and the loop ended: %s"
          % (out,))

    with dc.Client(d.address) as c:
        durable = c.shutdown(checkpoint=True)
        check(durable >= 6, "shutdown with a final checkpoint (durable step %d)" % durable)
    d.wait_exit()


# ---- notebook --------------------------------------------------------------------------------

def jupyter_env(h):
    """Environment for jupyter nbconvert: Debian's tools first on PATH, every Jupyter and
    IPython directory in the test's work directory, and a kernelspec that runs Debian's
    /usr/bin/python3 (whatever else is installed on the machine)."""
    root = os.path.join(h.work, "jupyter")
    kdir = os.path.join(root, "share", "kernels", "distdl-debian-python3")
    os.makedirs(kdir, exist_ok=True)
    with open(os.path.join(kdir, "kernel.json"), "w") as f:
        json.dump({"argv": ["/usr/bin/python3", "-Xfrozen_modules=off", "-m",
                            "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "Python 3 (Debian)", "language": "python",
                   "metadata": {"debugger": False}}, f)
    env = {"PATH": "/usr/bin:/bin:" + os.environ.get("PATH", ""),
           "JUPYTER_PATH": os.path.join(root, "share"),
           "JUPYTER_CONFIG_DIR": os.path.join(root, "config"),
           "JUPYTER_DATA_DIR": os.path.join(root, "data"),
           "JUPYTER_RUNTIME_DIR": os.path.join(root, "runtime"),
           "IPYTHONDIR": os.path.join(root, "ipython"),
           "MPLCONFIGDIR": os.path.join(root, "matplotlib"),
           "PYTHONPATH": "", "MPLBACKEND": ""}
    return env


def nbconvert_command():
    """`jupyter nbconvert` of Debian: /usr/bin/jupyter (packages jupyter-core and
    jupyter-nbconvert), else the same program as a module of Debian's python3."""
    missing = [m for m in ("nbconvert", "nbclient", "ipykernel", "matplotlib")
               if subprocess.run(["/usr/bin/python3", "-c", "import " + m],
                                 stderr=subprocess.DEVNULL).returncode != 0]
    if missing:
        raise Failure("Debian's python3 lacks %s: bash deploy/install-deps.sh (apt-get install "
                      "python3-nbconvert python3-ipykernel python3-matplotlib)"
                      % ", ".join(missing))
    if os.access("/usr/bin/jupyter", os.X_OK) and os.access("/usr/bin/jupyter-nbconvert", os.X_OK):
        return ["/usr/bin/jupyter", "nbconvert"]
    return ["/usr/bin/python3", "-m", "nbconvert"]


def run_env(d, out):
    return {"DDL_ADDRESS": d.address, "DDL_STEPS": str(NB_STEPS),
            "DDL_PROGRESS_EVERY": str(NB_EVERY), "DDL_OUT": out, "DDL_PREDICT": "16"}


def run_notebook(h, name):
    """Executes train.ipynb headless against a fresh daemon; checks the executed notebook
    and its files; returns (records.json, output dir)."""
    nbconvert = nbconvert_command()
    d = h.start(2, ["--model", h.spec(SPEC)], name)
    out = os.path.join(h.work, name)
    env = jupyter_env(h)
    env.update(run_env(d, out))
    execute_notebook(h, nbconvert, "train", out, env, 100, "curves, predictions")
    shutdown(d)
    check_files(out)
    return load_records(out), out


def execute_notebook(h, nbconvert, name, out, env, timeout, figures):
    """Runs examples/NAME.ipynb headless with Debian's kernel into out/NAME.executed.ipynb
    and checks it: every code cell ran, on /usr/bin/python3, no error output, at least two
    inline PNG figures (`figures` says which)."""
    h.run(None, nbconvert + ["--to", "notebook", "--execute",
                 "--ExecutePreprocessor.kernel_name=distdl-debian-python3",
                 "--ExecutePreprocessor.timeout=%d" % timeout, "--output-dir", out,
                 "--output", name + ".executed.ipynb",
                 os.path.join(h.examples, name + ".ipynb")], timeout=timeout + 100,
          env_extra=env)
    with open(os.path.join(out, name + ".executed.ipynb")) as f:
        nb = json.load(f)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    ran = [c.get("execution_count") for c in code]
    check(len(code) >= 6 and all(isinstance(n, int) for n in ran),
          "every code cell ran: execution counts %s" % ran)
    first = "".join("".join(o.get("text", "")) for o in code[0].get("outputs", []))
    check("python /usr/bin/python3," in first, "the kernel is Debian's python3: %s" % first.strip())
    errs = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    check(not errs, "no error outputs%s" % ("" if not errs else ": %s" % errs[0].get("ename")))
    pngs = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    check(len(pngs) >= 2, "%d inline image/png outputs (%s)" % (len(pngs), figures))


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise Failure("%s is not a PNG file" % path)
    return struct.unpack(">II", head[16:24])


def check_files(out):
    for name, min_w, min_h in (("curves.png", 600, 250), ("predictions.png", 600, 250)):
        p = os.path.join(out, name)
        check(os.path.exists(p), "%s written" % name)
        w, hgt = png_size(p)
        size = os.path.getsize(p)
        check(w >= min_w and hgt >= min_h and 10000 < size < 2000000,
              "%s: %d x %d px, %d bytes" % (name, w, hgt, size))
    check(os.path.getsize(os.path.join(out, "weights.safetensors")) > 61706 * 4,
          "weights.safetensors written")


def load_records(out):
    with open(os.path.join(out, "records.json")) as f:
        rec = json.load(f)
    steps = [r["step"] for r in rec["records"] if not r["finished"]]
    want = list(range(NB_EVERY, NB_STEPS + 1, NB_EVERY))
    check(steps == want and rec["records"][-1]["finished"],
          "records: %d per-step records (steps %d..%d every %d) and the finished one"
          % (len(steps), steps[0] if steps else -1, steps[-1] if steps else -1, NB_EVERY))
    first = [r["loss"] for r in rec["records"][:5]]
    last = [r["loss"] for r in rec["records"][-6:-1]]
    check(sum(last) < 0.8 * sum(first), "the loss falls: first %s, last %s" %
          (np.round(first, 3).tolist(), np.round(last, 3).tolist()))
    check(rec["test"]["count"] == 10000 and rec["test"]["accuracy"] > 0.6,
          "test accuracy %.4f" % rec["test"]["accuracy"])
    return rec


def deterministic(records):
    """Progress records without their one timing field."""
    return [{k: v for k, v in r.items() if k != "images_per_second"} for r in records]


def shutdown(d):
    with dc.Client(d.address) as c:
        c.shutdown()
    d.wait_exit()


def pixels(path):
    import matplotlib.image
    return matplotlib.image.imread(path)


def sc_notebook(h):
    h.run(None, ["/usr/bin/python3", os.path.join(h.examples, "sync_script.py"), "--check"])
    nb, nb_out = run_notebook(h, "notebook")
    # The script twin on another fresh daemon: the same run, number for number.
    d = h.start(2, ["--model", h.spec(SPEC)], "script")
    out = os.path.join(h.work, "script")
    env = run_env(d, out)
    env.update({"PYTHONPATH": "", "MPLBACKEND": "Agg"})
    h.run(None, ["/usr/bin/python3", os.path.join(h.examples, "train.py")], timeout=120,
          env_extra=env)
    shutdown(d)
    check_files(out)
    py = load_records(out)
    ra, rb = deterministic(py["records"]), deterministic(nb["records"])
    diff = next((i for i, (u, v) in enumerate(zip(ra, rb)) if u != v), None)
    check(len(ra) == len(rb) and diff is None,
          "train.py's %d progress records equal the notebook's exactly (every field but "
          "images_per_second)%s" % (len(rb), "" if diff is None else
                                    ": first difference %s vs %s" % (ra[diff], rb[diff])))
    check(py["test"] == nb["test"], "same test loss and accuracy: %s" % (nb["test"],))
    check(py["predicted"] == nb["predicted"], "same predictions")
    wa = dc.read_safetensors(os.path.join(out, "weights.safetensors"))
    wb = dc.read_safetensors(os.path.join(nb_out, "weights.safetensors"))
    check(list(wa) == list(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa),
          "same weights (bitwise)")
    for name in ("curves.png", "predictions.png"):
        check(np.array_equal(pixels(os.path.join(out, name)), pixels(os.path.join(nb_out, name))),
              "%s: the same pixels from the notebook and the script" % name)


def volume_spec(h, name, size, **loss):
    """The shipped spec `name` at size^3, with another loss when given."""
    with open(h.spec(name + ".json")) as f:
        spec = json.load(f)
    spec["input"]["shape"] = [1, size, size, size]
    if loss:
        spec["loss"] = dict(spec["loss"], **loss)
    return spec


def sc_fields(h):
    sys.path.insert(0, h.examples)
    import poisson3d
    f, u = poisson3d.make(40, 16, seed=7)
    ftr, utr, fte, ute = f[:32], u[:32], f[32:], u[32:]
    d = h.start(2, [], "fields")
    with dc.Client(d.address, call_timeout=120) as c:
        info = c.create(volume_spec(h, "unet3d-denoise-2", 16, reduction="mean"))
        check(info.input_shape == (1, 16, 16, 16) and info.batch_size == 2,
              "created %r" % (info,))
        e0 = c.evaluate(fte, ute)
        check(e0.count == 8 and e0.mse >= 0 and e0.rel_l2 > 0 and e0.accuracy == -1,
              "held-out before training: %r" % (e0,))
        steps, losses = 0, []
        for epoch in range(5):
            for i in range(0, 32, 2):
                r = c.step(ftr[i:i + 2], utr[i:i + 2])
                steps += 1
                if steps == 1:
                    check(r.step == 1 and r.mse >= 0 and r.accuracy == -1 and
                          math.isfinite(r.loss), "the first step: %r" % (r,))
                losses.append(r.loss)
        check(r.step == steps, "%d steps taken: %r" % (steps, r))
        e1 = c.evaluate(fte, ute)
        first, last = np.mean(losses[:16]), np.mean(losses[-16:])
        print("poisson 16^3 through Python: train loss %.4f -> %.4f over %d steps, held-out "
              "rel L2 %.4f -> %.4f" % (first, last, steps, e0.rel_l2, e1.rel_l2), flush=True)
        check(last < 0.7 * first and e1.rel_l2 < 0.8 * e0.rel_l2,
              "the regression learns: loss %.4f -> %.4f, rel L2 %.4f -> %.4f"
              % (first, last, e0.rel_l2, e1.rel_l2))
        z = c.predict(fte)
        check(isinstance(z, np.ndarray) and z.shape == ute.shape and z.dtype == np.float32,
              "predict returns the volumes %s %s" % (z.shape, z.dtype))
        err = z.astype(np.float64) - ute
        rel = np.linalg.norm(err) / np.linalg.norm(ute)
        check(abs(rel - e1.rel_l2) <= 1e-5 * rel and abs(np.mean(err ** 2) - e1.mse) <= 1e-5 * e1.mse,
              "Evaluate's rel L2 %.7f and mse %.7g are the predicted volume's (%.7f, %.7g)"
              % (e1.rel_l2, e1.mse, rel, np.mean(err ** 2)))
        # float64 and float16 targets are converted; the figures stay.
        e64 = c.evaluate(fte, ute.astype(np.float64))
        check(abs(e64.mse - e1.mse) <= 1e-6 * e1.mse, "float64 targets: %r" % (e64,))
        # Bad targets: InvalidArgument with expected versus got, the step unchanged.
        expect(dc.InvalidArgument, lambda: c.step(ftr[:2], utr[:2, :, :8]), "a wrong shape",
               contains="expected shape [2, 1, 16, 16, 16], got [2, 1, 8, 16, 16]")
        expect(dc.InvalidArgument, lambda: c.step(ftr[:2], np.zeros(2, np.int64)),
               "integer targets for mse", contains="expected datatype FP32 or FP64")
        expect(TypeError, lambda: c.step(ftr[:2], utr[:2].astype(np.complex64)),
               "complex targets", contains="targets must be")
        check(c.status().step == steps, "refused targets changed nothing")
        # A loss with a target range: bce_with_logits takes targets in [0, 1]; the engine's
        # check on rank 0, before any data moves, answers for every rank.
        c.create(volume_spec(h, "unet3d-denoise-2", 16, type="bce_with_logits"), replace=True)
        mask = (utr[:2] > 0).astype(np.float32)
        r = c.step(ftr[:2], mask)
        check(r.step == 1 and 0 <= r.accuracy <= 1, "a bce_with_logits step on a mask: %r" % (r,))
        bad = mask.copy()
        bad[1, 0, 2, 3, 4] = 1.5
        expect(dc.InvalidArgument, lambda: c.step(ftr[:2], bad), "a bce target of 1.5",
               contains="in [0, 1]")
        expect(dc.InvalidArgument, lambda: c.evaluate(ftr[:2], bad), "the same in Evaluate",
               contains="in [0, 1]")
        check(c.status().step == 1 and c.status().state == "idle",
              "the refused bce target changed nothing")
        c.shutdown()
    d.wait_exit()


def sc_hdf5(h):
    import h5py
    sys.path.insert(0, h.examples)
    import poisson3d
    root = os.path.join(h.work, "data")
    os.makedirs(root)
    f, u = poisson3d.make(40, 16, seed=11)
    poisson3d.write_h5(os.path.join(root, "poisson.h5"),
                       {"train": (f[:32], u[:32]), "test": (f[32:], u[32:])})
    small = os.path.join(root, "small.h5")  # 8^3 volumes: not the model's input
    with h5py.File(small, "w") as g:
        g["x"], g["y"] = f[:4, :, :8, :8, :8], u[:4, :, :8, :8, :8]
    d = h.start(4, ["--data-root", root], "hdf5")
    with dc.Client(d.address, call_timeout=300) as c:
        c.create(volume_spec(h, "unet3d-poisson-4", 16))
        e0 = c.evaluate(dataset="poisson.h5")
        check(e0.count == 8 and e0.rel_l2 > 0, "held-out before training: %r" % (e0,))
        recs = list(c.train(epochs=4, dataset="poisson.h5", progress_every=16))
        last = recs[-1]
        check(last.finished and last.step == 64 and last.mse >= 0,
              "4 epochs from the file: %r" % (last,))
        e1 = c.evaluate(dataset="poisson.h5")
        st = c.status()
        check(st.data_dir == "poisson.h5" and st.world_size == 4, "status %r" % (st,))
        print("poisson 16^3 from HDF5 on 4 ranks: held-out rel L2 %.4f -> %.4f after %d steps"
              % (e0.rel_l2, e1.rel_l2, last.step), flush=True)
        check(e1.rel_l2 < 0.8 * e0.rel_l2, "the surrogate learns from the file: rel L2 %.4f -> "
              "%.4f" % (e0.rel_l2, e1.rel_l2))
        z = c.predict(f[32:])
        err = z.astype(np.float64) - u[32:]
        rel = np.linalg.norm(err) / np.linalg.norm(u[32:])
        check(z.shape == (8, 1, 16, 16, 16) and abs(rel - e1.rel_l2) <= 1e-5 * rel,
              "the predicted volumes' rel L2 %.7f is Evaluate's %.7f" % (rel, e1.rel_l2))
        e = expect(dc.InvalidArgument, lambda: c.evaluate(dataset="small.h5"),
                   "a file of 8^3 volumes for a 16^3 model",
                   contains="expected shape [4, 1, 16, 16, 16] (N, then the model's input), "
                            "got [4, 1, 8, 8, 8]")
        expect(dc.NotFound, lambda: list(c.train(steps=1, dataset="none.h5")), "a missing file")
        after = c.status()
        check(after.step == 64 and after.data_dir == "poisson.h5",
              "the refused files changed nothing: %r" % (after,))
        c.shutdown()
    d.wait_exit()


# 60 MiB since a batch norm's input took its output gradient (2026-12-08): the one-rank
# estimate fell to 73.6 MiB (direct kernels) and 65.3 MiB (GEMM), which a 72 MiB cap less
# the daemon's own 5-8 MiB no longer refused reliably. It was 72 MiB once the layers shared
# their scratch (2026-12-06: one rank's two steps charged 82.6-85.9 MiB, four ranks 48.6-54.4
# MiB), and 88 MiB before.
MEMCAP = 60 * 1024 * 1024


def memcap_groups(job):
    root = "/sys/fs/cgroup/memory/distdl-memcap"
    return sorted(os.path.join(root, g) for g in os.listdir(root) if g.startswith(job + "-"))


def group_peak(job):
    """The peak charge of each rank's group of a memcap.sh job, in bytes, rank order."""
    out = []
    for g in memcap_groups(job):
        with open(os.path.join(g, "memory.max_usage_in_bytes")) as fh:
            out.append(int(fh.read()))
    return out


def group_vmhwm(job):
    """Each rank's peak resident set (VmHWM of /proc/PID/status) of a memcap.sh job still
    running, in bytes, rank order (the process in each rank's group)."""
    out = []
    for g in memcap_groups(job):
        with open(os.path.join(g, "cgroup.procs")) as fh:
            pids = [int(x) for x in fh.read().split()]
        hwm = 0
        for pid in pids:
            with open("/proc/%d/status" % pid) as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        out.append(hwm)
    return out


def memcap_run(h, size, cap, n_train, epochs, one_steps=2):
    """The headline (issue 18 item 4) at size^3 under `cap` bytes per rank: one rank
    refused by the estimate; one rank's steps under an 8x cap charging more than `cap`
    (one_steps of them; 0 skips this); four ranks training from an HDF5 file. Returns the
    figures; checks what must hold at any size."""
    if not os.access("/sys/fs/cgroup/memory", os.W_OK):
        raise Skip("no writable cgroup v1 memory controller (root on Debian 12 has one)")
    sys.path.insert(0, h.examples)
    import poisson3d
    root = os.path.join(h.work, "data")
    os.makedirs(root, exist_ok=True)
    f, u = poisson3d.make(n_train + 2, size, seed=3)
    name = "poisson%d.h5" % size
    poisson3d.write_h5(os.path.join(root, name),
                       {"train": (f[:n_train], u[:n_train]), "test": (f[n_train:], u[n_train:])})
    del f, u
    tool = os.path.join(h.source, "deploy", "memcap.sh")
    job = "t%d" % os.getpid()
    spec4 = volume_spec(h, "unet3d-poisson-4", size)
    spec1 = dict(spec4, world_size=1, name="unet3d-poisson-1",
                 partitions={"vol": {"ranks": [0], "shape": [1, 1, 1, 1, 1]}})
    mib = cap / 2 ** 20
    fig = {"size": size, "cap_mib": mib}
    try:
        d = h.start(1, ["--data-root", root], "memcap1", wrapper=[tool, str(cap)],
                    env={"MEMCAP_JOB": job + "a"})
        with dc.Client(d.address, call_timeout=600) as c:
            e = expect(dc.ResourceExhausted, lambda: c.create(spec1),
                       "the %d^3 U-Net on one rank under a %.0f MiB cap" % (size, mib),
                       contains="spec needs an estimated")
            check("cgroup v1" in e.message and "this rank's own" in e.message,
                  "the message names the cap it was measured against")
            fig["refusal"] = e.message
            c.shutdown()
        d.wait_exit()
        if one_steps:
            # It really does not fit: one rank's steps under a cap 8x larger charge more.
            d = h.start(1, ["--data-root", root], "memcap1big", wrapper=[tool, str(8 * cap)],
                        env={"MEMCAP_JOB": job + "c"})
            with dc.Client(d.address, call_timeout=1800) as c:
                c.create(spec1)
                list(c.train(steps=one_steps, dataset=name))
                c.shutdown()
            d.wait_exit()
            one = group_peak(job + "c")[0]
            fig["one_rank_peak_mib"] = one / 2 ** 20
            print("one rank's peak charge for %d steps: %.1f MiB" % (one_steps, one / 2 ** 20),
                  flush=True)
            check(one > cap, "one rank needs more than the cap: %.1f MiB" % (one / 2 ** 20))
        d = h.start(4, ["--data-root", root], "memcap4", wrapper=[tool, str(cap)],
                    env={"MEMCAP_JOB": job + "b"})
        t0 = time.time()
        with dc.Client(d.address, call_timeout=3600) as c:
            c.create(spec4)
            e0 = c.evaluate(dataset=name)
            recs = list(c.train(epochs=epochs, dataset=name, progress_every=8))
            e1 = c.evaluate(dataset=name)
            hwm = group_vmhwm(job + "b")
            c.shutdown()
        d.wait_exit()
        fig["seconds"] = time.time() - t0
        ends = [r.mean_loss for r in recs if r.epoch_end]
        steps = recs[-1].step
        fig.update(steps=steps, epoch_losses=ends, rel_l2=(e0.rel_l2, e1.rel_l2))
        print("%d^3 on 4 ranks under %.0f MiB each: %d steps, epoch mean loss %s, held-out rel "
              "L2 %.4f -> %.4f" % (size, mib, steps, ", ".join("%.4f" % x for x in ends),
                                   e0.rel_l2, e1.rel_l2), flush=True)
        check(steps == epochs * (n_train // 2) and len(ends) == epochs and ends[-1] < ends[0],
              "trains under the cap: epoch losses %s" % (ends,))
        reads = [line for line in d.log_text().splitlines()
                 if "data read from the file per rank (bytes):" in line]
        check(reads, "the daemon logs the bytes each rank read")
        per = [int(x.split()[1]) for x in reads[-1].split("(bytes):")[1].split(",")]
        # The training samples and 2 evaluations of the 2 test samples, x and y float32.
        whole = (steps * 2 + 2 * 2) * size ** 3 * 4 * 2
        fig.update(bytes_per_rank=per, bytes_whole=whole)
        check(len(per) == 4 and sum(per) == whole and all(p == whole // 4 for p in per),
              "every rank read a quarter of each sample (its box), none the file: %s of %d"
              % (per, whole))
        peaks = group_peak(job + "b")
        fig["peak_mib"] = [p / 2 ** 20 for p in peaks]
        fig["vmhwm_mib"] = [p / 2 ** 20 for p in hwm]
        print("per rank, peak charge (MiB): %s; peak RSS (VmHWM, shared pages included, MiB): "
              "%s; cap %.0f MiB" %
              (", ".join("%.1f" % (p / 2 ** 20) for p in peaks),
               ", ".join("%.1f" % (p / 2 ** 20) for p in hwm), mib), flush=True)
        # The cap is on the group's charge (its private memory and page cache). VmHWM also
        # counts the shared pages every process maps (libraries, MPI's shared-memory
        # segments), charged once to whichever group touched them first: informative only.
        check(len(peaks) == 4 and max(peaks) < cap and len(hwm) == 4,
              "every rank's charge stayed under the cap")
    finally:
        for g in memcap_groups(job + "a") + memcap_groups(job + "b") + memcap_groups(job + "c"):
            try:
                os.rmdir(g)
            except OSError:
                pass
    return fig


def sc_memcap(h):
    fig = memcap_run(h, 32, MEMCAP, 16, 4)
    check(fig["epoch_losses"][-1] < 0.5 * fig["epoch_losses"][0] and
          fig["rel_l2"][1] < fig["rel_l2"][0],
          "the loss halves and the held-out error falls: %s, %s" % (fig["epoch_losses"],
                                                                    fig["rel_l2"]))


def sc_poisson_notebook(h):
    nbconvert = nbconvert_command()
    root = os.path.join(h.work, "pde")
    os.makedirs(root)
    d = h.start(4, ["--data-root", root], "poisson-nb")
    out = os.path.join(h.work, "poisson-out")
    env = jupyter_env(h)
    env.update({"DDL_ADDRESS": d.address, "DDL_DATA_ROOT": root, "DDL_OUT": out,
                "DDL_SIZE": "16", "DDL_TRAIN": "32", "DDL_TEST": "8", "DDL_EPOCHS": "4"})
    execute_notebook(h, nbconvert, "poisson", out, env, 200, "loss curve, slices")
    shutdown(d)
    for name in ("loss.png", "slices.png"):
        w, hgt = png_size(os.path.join(out, name))
        check(w >= 300 and hgt >= 200, "%s is a %dx%d PNG" % (name, w, hgt))
    with open(os.path.join(out, "records.json")) as f:
        rec = json.load(f)
    ends = [r["mean_loss"] for r in rec["records"] if r["epoch_end"]]
    b, a = rec["before"]["rel_l2"], rec["after"]["rel_l2"]
    print("poisson notebook: epoch losses %s, held-out rel L2 %.4f -> %.4f, per sample %s"
          % (["%.4f" % x for x in ends], b, a,
             ["%.3f" % x for x in rec["per_sample_rel_l2"]]), flush=True)
    check(len(ends) == 4 and ends[-1] < 0.5 * ends[0] and a < 0.8 * b,
          "the surrogate learns: epoch losses %s, rel L2 %.4f -> %.4f" % (ends, b, a))
    check(abs(rec["rel_l2_from_arrays"] - a) <= 1e-5 * a and rec["after"]["count"] == 8,
          "the error from the predicted arrays %.7f is Evaluate's %.7f"
          % (rec["rel_l2_from_arrays"], a))


def sc_notebook_cli(h):
    cli = os.path.join(h.build, "bin", "distdl")
    if not os.path.exists(cli):
        print("CLI not built: comparison not run (%s is missing)" % cli, flush=True)
        if os.environ.get("DDL_REQUIRE_CLI") == "1":
            raise Failure("DDL_REQUIRE_CLI=1 and the distdl CLI is not built")
        raise Skip("the distdl CLI is not built")
    nb, nb_out = run_notebook(h, "notebook")
    d = h.start(2, ["--model", h.spec(SPEC)], "cli")
    af = ["--address-file", d.addr_file, "--json"]
    text = h.run(d, [cli] + af + ["train", "--steps", str(NB_STEPS), "--progress-every",
                                  str(NB_EVERY)], capture=True, timeout=120)
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    text = h.run(d, [cli] + af + ["eval"], capture=True, timeout=120)
    ev = [json.loads(line) for line in text.splitlines() if line.strip()]
    shutdown(d)
    check(events and events[-1].get("event") == "done", "the CLI's train ends with a done event")
    by_step = {}
    for e in events:
        if e.get("event") == "progress":
            by_step.setdefault(e["step"], e)  # a repeated step (a final record) is not a step's
    cli_recs = [by_step[s] for s in sorted(by_step)]
    nb_recs = [r for r in nb["records"] if not r["finished"]]
    check([r["step"] for r in cli_recs] == [r["step"] for r in nb_recs],
          "the CLI reports the same %d steps" % len(nb_recs))
    worst = 0.0
    for a, b in zip(cli_recs, nb_recs):
        for k in ("loss", "accuracy"):
            worst = max(worst, abs(a[k] - b[k]) / max(1.0, abs(b[k])))
    check(worst <= 1e-6, "per-step loss and accuracy equal the notebook's (worst rel %.2g)" % worst)
    # The figure: the CLI's records drawn by the notebook's plotting code. When the numbers
    # are bitwise the same the pixels must be too.
    exact = all(a[k] == b[k] for a, b in zip(cli_recs, nb_recs) for k in ("loss", "accuracy"))
    from distdl_client import plots
    cli_png = os.path.join(h.work, "cli-curves.png")
    plots.plot_curves(cli_recs, title=nb["model"]).savefig(cli_png, dpi=plots.DPI)
    same = np.array_equal(pixels(cli_png), pixels(os.path.join(nb_out, "curves.png")))
    if exact:
        check(same, "the CLI's curves (%s) have the notebook's pixels" % cli_png)
    else:
        print("note: the CLI prints rounded numbers; its curves %s the notebook's pixels"
              % ("have" if same else "do not have exactly"), flush=True)
    evs = [e for e in ev if e.get("event") == "eval"]
    check(len(evs) == 1 and evs[0]["count"] == nb["test"]["count"] and
          abs(evs[0]["accuracy"] - nb["test"]["accuracy"]) <= 1e-6,
          "test accuracy: CLI %s, notebook %.6f" % (evs[0].get("accuracy") if evs else None,
                                                    nb["test"]["accuracy"]))


if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, {"binding": sc_binding, "fields": sc_fields, "hdf5": sc_hdf5,
                                     "memcap": sc_memcap, "poisson_notebook": sc_poisson_notebook,
                                     "notebook": sc_notebook,
                                     "notebook_cli": sc_notebook_cli}))
