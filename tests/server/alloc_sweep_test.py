#!/usr/bin/python3
"""distdld_alloc_sweep: the daemon under injected allocation failures (issue 17, section 1).

  alloc_sweep_test.py --build B --source S --mpiexec M --mpi-flags "..."

Every allocation of server/ goes through ddl_malloc, so the engine's test-only injection
(ddl_alloc_fail_after, armed by DDLD_TEST_ALLOC_FAIL="K[@RANK]" in server/main.c) reaches
the daemon: the K-th ddl_malloc of that rank from the start of the daemon's own set-up
returns NULL, once. A first run without a failure counts rank 0's allocations (N) over
start-up (--model, --token-file, --metrics-listen) and a representative session:

  GetStatus, Step (inline batch), Predict, ModelInfer (typed contents), the same rows
  through KServe v2 over HTTP (--http-listen: POST .../infer with JSON tensors, then GET
  .../stats), PullWeights, PushWeights (the pulled weights back), a /metrics scrape,
  CreateModel (replace), Shutdown.

Then one daemon per K. Every run must end in one of two ways, within RUN_BUDGET s:
  - start-up refused: mpirun exits 2 (DDLD_EXIT_START) without serving, with a log line
    that names the shortage, and no process of the job is left;
  - served: every call ends OK with a correct answer (shapes, finite values, Predict ==
    ModelInfer == HTTP infer on the same rows, the pulled bytes pushed back) or with
    RESOURCE_EXHAUSTED / INTERNAL and a message (HTTP: 429 / 500 with {"error": ...}), a Shutdown (asked again once if it was the one refused)
    ends the job, and mpirun exits 0: every rank left with the same status.
Never a crash, a hang, a sanitizer report or another exit code.

Sampling (a run costs 1-2.5 s and N is over a thousand, so every K would take half an
hour; the budget is ~40 s): two counting runs map rank 0's allocations: S at serving (the
daemon logs it), C after the calls before CreateModel (a run without CreateModel), N in
all. Then K = 1..DENSE (main.c's own start-up), START more K evenly over (DENSE, S]
(auth, --model, the service, metrics), CALLS over (S, C] (the server's request paths,
the point of the sweep; NEAR of them over the first NEAR_SPAN, where the small calls
allocate), CREATE over (C, N] (CreateModel's engine allocations and
Shutdown), and RANK1 on rank 1 (the engine's agreement carries it to rank 0). The
strided K move with the counts, so the sweep lands on other allocations as code changes.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)

try:
    import grpc
    import numpy as np
except ImportError as e:
    print("skip: %s" % e)
    sys.exit(7)
import ddld_rpc  # noqa: E402
from ddl_daemon import Daemon, job_pids  # noqa: E402

DENSE = 5          # K = 1..DENSE: main.c's own start-up allocations
START = 3          # more K spread over the rest of start-up (auth, --model, gRPC, metrics)
CALLS = 10         # K over the calls before CreateModel (the server's paths), of which
NEAR = 6           # ... this many over the first NEAR_SPAN after S: GetStatus, Step,
NEAR_SPAN = 30     # Predict, ModelInfer (PullWeights' and PushWeights' engine gathers follow)
CREATE = 3         # K spread over CreateModel and Shutdown (mostly the engine's)
RANK1 = 1          # K on rank 1, over its whole run
RUN_BUDGET = 45.0  # s, one daemon from mpirun to its exit (a loaded 2-core machine)
TOKEN = "sweep-admin-token-0123456789abcdef"
OK_ERRORS = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL}


class Failure(Exception):
    pass


class Run:
    """One daemon: mpirun -np 2 distdld ... with DDLD_TEST_ALLOC_FAIL=inject."""

    def __init__(self, a, work, inject, name):
        self.dir = tempfile.mkdtemp(prefix=name + "-", dir=work)
        self.addr_file = os.path.join(self.dir, "addr")
        self.maddr = os.path.join(self.dir, "maddr")
        self.haddr = os.path.join(self.dir, "haddr")
        self.log_path = os.path.join(self.dir, "daemon.log")
        tokens = os.path.join(self.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("admin %s\n" % TOKEN)
        os.chmod(tokens, stat.S_IRUSR | stat.S_IWUSR)
        spec = os.path.join(a.source, "deploy", "specs", "lenet5-2.json")
        cmd = [a.mpiexec, "-np", "2"] + shlex.split(a.mpi_flags) + [
            os.path.join(a.build, "bin", "distdld"), "--listen", "127.0.0.1:0",
            "--address-file", self.addr_file, "--model", spec, "--token-file", tokens,
            "--metrics-listen", "127.0.0.1:0", "--metrics-address-file", self.maddr,
            "--http-listen", "127.0.0.1:0", "--http-address-file", self.haddr,
            "--watchdog", "0", "--grace", "1"]
        env = dict(os.environ, DDLD_TEST_ALLOC_FAIL=inject)
        self.log = open(self.log_path, "w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def left(self):
        return RUN_BUDGET - (time.time() - self.t0)

    def wait_address(self):
        """The addresses (gRPC, metrics, HTTP), or None when the daemon exited before
        serving."""
        while self.left() > 0:
            files = (self.addr_file, self.maddr, self.haddr)
            if all(os.path.exists(f) for f in files):
                got = tuple(open(f).read().strip() for f in files)
                if all(got):
                    return got
            if self.proc.poll() is not None:
                return None
            time.sleep(0.02)
        raise Failure("no address and no exit after %.0f s" % RUN_BUDGET)

    def wait_exit(self):
        try:
            return self.proc.wait(timeout=max(self.left(), 1))
        except subprocess.TimeoutExpired:
            raise Failure("the job did not end within %.0f s" % RUN_BUDGET)

    def leftovers(self):
        """Processes of the job still alive 5 s after mpirun exited (their command line
        holds this run's address file)."""
        end = time.time() + 5
        while True:
            pids = job_pids(self)
            if not pids or time.time() > end:
                return pids
            time.sleep(0.05)

    kill = Daemon.kill  # SIGKILL to the job's process group, then reap mpirun


def call(c, fn, *args):
    """(response, None) or (None, (code, details)) for an allowed error; else Failure."""
    try:
        return fn(*args), None
    except grpc.RpcError as e:
        if e.code() not in OK_ERRORS or not e.details():
            raise Failure("%s: %s %r (only RESOURCE_EXHAUSTED or INTERNAL with a message)" %
                          (getattr(fn, "__name__", "call"), e.code(), e.details()))
        return None, (e.code(), e.details())


def http(haddr, method, path, body, t):
    """(status, parsed JSON body) of an HTTP call to the KServe v2 endpoint."""
    req = urllib.request.Request("http://%s%s" % (haddr, path), method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + TOKEN,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=t) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def http_allowed(code, js, what):
    """None for 200; the error for 429 / 500 with a message (the gRPC rule); else Failure."""
    if code == 200:
        return None
    if code not in (429, 500) or not isinstance(js.get("error"), str) or not js["error"]:
        raise Failure("%s: HTTP %d %r (only 429 or 500 with an error message)" % (what, code, js))
    return "%s: HTTP %d %s" % (what, code, js["error"])


def session(addr, maddr, haddr, left, create=True):
    """The representative calls; checks every answer; returns the errors seen."""
    c = ddld_rpc.Client(addr)
    tr, inf = c.tr, c.inf
    md = [("authorization", "Bearer " + TOKEN)]
    t = lambda: max(min(left(), 30), 1)  # noqa: E731

    def unary(path, req, cls):
        f = c.ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=cls.FromString)
        return f(req, timeout=t(), metadata=md)

    def trainer(m, req, resp):
        return unary("/distdl.v1.Trainer/" + m, req, getattr(tr, resp))

    errors = []

    def note(r, err, what):
        if err is not None:
            errors.append("%s: %s %s" % (what, err[0].name, err[1]))
        return r

    st = note(*call(c, trainer, "GetStatus", tr.GetStatusRequest(), "GetStatusResponse"),
              "GetStatus")
    if st is not None and not (st.has_model and st.world_size == 2 and st.batch_size > 0):
        raise Failure("GetStatus: %s" % st)
    B, shp, K = 64, [1, 28, 28], 10
    rs = np.random.RandomState(0)
    x = rs.rand(B, *shp).astype(np.float32)
    y = rs.randint(0, K, size=B).astype(np.int64)
    T = lambda name, a, dt: tr.Tensor(name=name, datatype=dt, shape=list(a.shape),  # noqa: E731
                                      raw=a.tobytes())
    s = note(*call(c, trainer, "Step",
                   tr.StepRequest(batch=tr.Batch(x=T("x", x, "FP32"), labels=T("labels", y, "INT64"))),
                   "StepResponse"), "Step")
    if s is not None and not (s.step == 1 and np.isfinite(s.loss)):
        raise Failure("Step: %s" % s)
    p = note(*call(c, trainer, "Predict", tr.PredictRequest(x=T("x", x[:5], "FP32")),
                   "PredictResponse"), "Predict")
    logits = None
    if p is not None:
        logits = np.frombuffer(p.logits.raw, np.float32).reshape(list(p.logits.shape))
        if logits.shape != (5, K) or not np.all(np.isfinite(logits)):
            raise Failure("Predict: logits of shape %s" % (logits.shape,))
    req = inf.ModelInferRequest(model_name="", id="9")
    ti = req.inputs.add(name="input", datatype="FP32", shape=[5] + shp)
    ti.contents.fp32_contents.extend(x[:5].ravel().tolist())
    ir = note(*call(c, unary, "/inference.GRPCInferenceService/ModelInfer", req,
                    inf.ModelInferResponse), "ModelInfer")
    if ir is not None:
        out = np.frombuffer(ir.raw_output_contents[0], np.float32).reshape(5, K)
        if logits is not None and not np.allclose(out, logits, rtol=1e-5, atol=1e-6):
            raise Failure("ModelInfer and Predict disagree on the same rows")
    code, js = http(haddr, "POST", "/v2/models/lenet5-2/infer",
                    {"id": "h", "inputs": [{"name": "x", "datatype": "FP32", "shape": [5] + shp,
                                            "data": x[:5].ravel().tolist()}]}, t())
    err = http_allowed(code, js, "HTTP infer")
    if err is not None:
        errors.append(err)
    else:
        o = js.get("outputs", [{}])[0]
        out = np.array(o.get("data", []), np.float32)
        if o.get("shape") != [5, K] or out.size != 5 * K or (
                logits is not None and not np.allclose(out.reshape(5, K), logits, rtol=1e-5,
                                                       atol=1e-6)):
            raise Failure("HTTP infer: %r disagrees with Predict on the same rows" % (o,))
    code, js = http(haddr, "GET", "/v2/models/lenet5-2/stats", None, t())
    err = http_allowed(code, js, "HTTP stats")
    if err is not None:
        errors.append(err)
    elif not js.get("model_stats") or js["model_stats"][0].get("name") != "lenet5-2":
        raise Failure("HTTP stats: %r" % (js,))
    weights, order = {}, []
    try:
        f = c.ch.unary_stream("/distdl.v1.Trainer/PullWeights",
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=tr.WeightChunk.FromString)
        for ch in f(tr.PullWeightsRequest(), timeout=t(), metadata=md):
            if ch.first:
                order.append(ch.name)
                weights[ch.name] = [ch.datatype, list(ch.shape), bytearray()]
            weights[order[-1]][2] += ch.data
        for n in order:
            dt, sh, b = weights[n]
            if len(b) != int(np.prod(sh)) * 4:
                raise Failure("PullWeights: %s has %d bytes for shape %s" % (n, len(b), sh))
    except grpc.RpcError as e:
        if e.code() not in OK_ERRORS:
            raise Failure("PullWeights: %s %r" % (e.code(), e.details()))
        errors.append("PullWeights: %s %s" % (e.code().name, e.details()))
        order = []
    if order:
        def chunks():
            for n in order:
                dt, sh, b = weights[n]
                yield tr.WeightChunk(name=n, datatype=dt, shape=sh, offset=0, first=True,
                                     data=bytes(b))
        fs = c.ch.stream_unary("/distdl.v1.Trainer/PushWeights",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=tr.PushWeightsResponse.FromString)
        pr = note(*call(c, lambda: fs(chunks(), timeout=t(), metadata=md)), "PushWeights")
        if pr is not None and pr.tensors != len(order):
            raise Failure("PushWeights: %d tensors, %d pushed" % (pr.tensors, len(order)))
    try:
        with urllib.request.urlopen("http://%s/metrics" % maddr, timeout=t()) as r:
            body = r.read().decode()
        if "distdl_" not in body:
            raise Failure("/metrics: no distdl_ sample")
    except urllib.error.HTTPError as e:
        if e.code != 500:
            raise Failure("/metrics: HTTP %d" % e.code)
        errors.append("/metrics: HTTP 500")
    spec = open(os.path.join(ARGS.source, "deploy", "specs", "lenet5-2.json")).read()
    cm = None if not create else note(*call(c, trainer, "CreateModel",
                    tr.CreateModelRequest(spec_json=spec, replace=True, name="again"),
                    "CreateModelResponse"), "CreateModel")
    if cm is not None and not (cm.name == "again" and cm.num_parameters > 0):
        raise Failure("CreateModel: %s" % cm)
    for attempt in range(2):
        r, err = call(c, trainer, "Shutdown", tr.ShutdownRequest(checkpoint=False),
                      "ShutdownResponse")
        if err is None:
            break
        errors.append("Shutdown: %s %s" % (err[0].name, err[1]))
    else:
        raise Failure("Shutdown refused twice (one allocation fails, once)")
    c.ch.close()
    return errors


def one(a, work, inject, name, create=True):
    run = Run(a, work, inject, name)
    try:
        got = run.wait_address()
        if got is None:
            rc = run.wait_exit()
            text = run.text()
            if rc != 2 or not re.search(r"out of memory|cannot", text):
                raise Failure("start-up ended with %d without naming the shortage" % rc)
            outcome = "start-up refused (exit 2)"
        else:
            errors = session(got[0], got[1], got[2], run.left, create)
            rc = run.wait_exit()
            if rc != 0:
                raise Failure("mpirun exited %d after the session" % rc)
            outcome = "served, exit 0" + ("; " + "; ".join(errors) if errors else "")
        if run.leftovers():
            raise Failure("processes %s of the job outlived mpirun" % run.leftovers())
        text = run.text()
        if re.search(r"AddressSanitizer|LeakSanitizer|runtime error|Segmentation|Abort", text):
            raise Failure("a sanitizer or crash report in the log")
        return outcome, text
    except Failure as e:
        run.kill()
        print("---- daemon log (%s) ----\n%s---- end ----" % (inject, run.text()[-5000:]))
        raise Failure("DDLD_TEST_ALLOC_FAIL=%s: %s" % (inject, e))
    finally:
        run.kill()
        run.log.close()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for o in ("--build", "--source", "--mpiexec", "--mpi-flags"):
        ap.add_argument(o, required=True)
    ARGS = a = ap.parse_args()
    if not os.path.exists(os.path.join(a.build, "bin", "distdld")):
        print("skip: distdld is not built")
        return 7
    work = tempfile.mkdtemp(prefix="ddl-allocsweep-")
    t0 = time.time()
    outcome, text = one(a, work, "0", "count")
    m = re.search(r"^distdld: alloc-fail test: (\d+) allocations$", text, re.M)
    if not m or outcome != "served, exit 0":
        raise Failure("the counting run: %s, no allocation count of rank 0" % outcome)
    n = int(m.group(1))
    ms = re.search(r"^distdld: alloc-fail test: (\d+) allocations at serving", text, re.M)
    m1 = re.search(r"^distdld\[1\]: alloc-fail test: (\d+) allocations$", text, re.M)
    n1 = int(m1.group(1)) if m1 else 0
    outcome, text = one(a, work, "0", "count-calls", create=False)
    mc = re.search(r"^distdld: alloc-fail test: (\d+) allocations$", text, re.M)
    if not ms or not mc or outcome != "served, exit 0":
        raise Failure("the counting runs: no allocation counts at serving and after the calls")
    s, c = int(ms.group(1)), int(mc.group(1))
    print("rank 0: %d allocations at serving, %d after the calls, %d in all (rank 1: %d)" %
          (s, c, n, n1))
    if not (2 * DENSE < s < c < n) or c - s < CALLS:
        raise Failure("allocation counts out of order: the injection no longer reaches the "
                      "daemon's paths")

    def spread(lo, hi, k):  # k points evenly in (lo, hi]
        return [lo + 1 + (i * (hi - lo)) // k for i in range(k)]

    near = min(c, s + NEAR_SPAN)
    ks = list(range(1, DENSE + 1)) + spread(DENSE, s, START) + spread(s, near, NEAR) + \
        spread(near, c, CALLS - NEAR) + spread(c, n, CREATE)
    injects = ["%d@0" % k for k in sorted(set(ks))]
    injects += ["%d@1" % k for k in spread(0, n1, RANK1 + 1)[1:]]
    kinds, refused_calls = {}, 0
    for inj in injects:
        t1 = time.time()
        outcome, _ = one(a, work, inj, "k" + inj.replace("@", "-r"))
        print("  K=%-10s %5.1f s  %s" % (inj, time.time() - t1, outcome), flush=True)
        kinds[outcome.split(";")[0]] = kinds.get(outcome.split(";")[0], 0) + 1
        refused_calls += ";" in outcome
    print("%d injected failures in %.1f s: %s" %
          (len(injects), time.time() - t0, ", ".join("%s x%d" % kv for kv in kinds.items())))
    if "start-up refused (exit 2)" not in kinds or refused_calls == 0:
        raise Failure("no injected failure refused start-up, or none failed a call: the "
                      "sweep missed the paths it is for")
    shutil.rmtree(work, ignore_errors=True)  # kept on failure, for its logs
    print("PASS")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print("FAIL: %s" % e)
        sys.exit(1)
