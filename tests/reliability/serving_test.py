#!/usr/bin/python3
"""Dynamic batching and answers between training steps (issue 17, sections 3 and 4),
against a 2-rank distdld with LeNet-5, driven from Debian's python3-grpcio:

  batching   concurrent Predict and ModelInfer calls of 1 to 5 samples each, with a 30 ms
             --max-queue-delay-us so that they meet: every caller gets exactly the bits the
             same call got alone beforehand (isolation); /metrics shows fewer commands than
             calls (they were joined) and the queue delay; bad calls in the same burst (NaN,
             a wrong shape, an unknown model) are refused with their own error while every
             good call succeeds; a call whose deadline passes while it waits for batch-mates
             gets DEADLINE_EXCEEDED alone and is counted in dropped_calls; --dynamic-batching
             off answers the same bits one command per call.
  train      Predicts sent in a loop during a 200-step Train are answered at step boundaries
             (each within a few steps' time, not after the Train; latency reported; with
             --serve-during-train-share 100, so that every boundary may answer: under the
             default 5 % the count of answers depends on how fast a step is, and trainshare
             tests the budget), and
             the Train's 200 losses are bit for bit those of the same Train with no
             predictions (the model re-created from its spec in between; every per-step
             record delivered to both, and the final mean). An attempt in which the
             predictor was starved (none interleaved, or under steps / 4 calls) is taken
             again (3 in all).
  trainoff   --serve-during-train off: a Predict during a Train waits for the whole Train.
  trainsolo  --dynamic-batching off: calls answered at a Train's step boundaries still run one
             command each, with 4 clients predicting concurrently (share 100, 200 steps:
             under the default 5 % a 40-step Train of 1.8 ms steps left room for one
             interlude on Zen 5).
  trainshare --serve-during-train-share: bad values are refused (exit 2, naming the flag);
             with 4 clients predicting through a 200-step Train, every call is answered and
             the interludes (distdl_inference_interlude_seconds_total) take at most the
             share of the Train's time, plus the last one, at share 1, under a load that
             takes more than that at share 100 (a light load is run again, 3 runs in all).

  serving_test.py --build B --source S --mpiexec M --mpi-flags F SCENARIO
"""
import json
import os
import subprocess
import random
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostile_common import TR, Failure, Harness, Raw, f32, percentile, wait_for  # noqa: E402
from ddl_daemon import run_scenarios  # noqa: E402
import grpc  # noqa: E402

SC = grpc.StatusCode
SAMPLE = 784
INF = "/inference.GRPCInferenceService/"


class Fixture:
    def __init__(self, h, name, args):
        self.h = h
        self.tr, self.inf = h.tr, h.inf
        mfile = os.path.join(h.work, name + ".metrics")
        self.d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--metrics-listen", "127.0.0.1:0",
                             "--metrics-address-file", mfile] + args, name)
        wait_for(lambda: os.path.exists(mfile) and open(mfile).read().strip(), 30)
        self.metrics_addr = open(mfile).read().strip()
        self.raw = Raw(self.d.address)

    def status(self):
        code, details, resp = self.raw.call(TR + "GetStatus", b"")
        if code != SC.OK:
            raise Failure("GetStatus: %s %s" % (code.name, details))
        return self.tr.GetStatusResponse.FromString(resp[0])

    def metrics(self):
        out = {}
        body = urllib.request.urlopen("http://%s/metrics" % self.metrics_addr, timeout=10).read()
        for line in body.decode().splitlines():
            if line.startswith("distdl_inference") and " " in line:
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def predict_req(self, xs):
        return self.tr.PredictRequest(x=self.tr.Tensor(
            datatype="FP32", shape=[len(xs) // SAMPLE, 1, 28, 28], raw=f32(xs))).SerializeToString()

    def infer_req(self, xs, model="lenet5-2"):
        q = self.inf.ModelInferRequest(model_name=model, id="x")
        t = q.inputs.add()
        t.name, t.datatype = "x", "FP32"
        t.shape.extend([len(xs) // SAMPLE, 1, 28, 28])
        q.raw_input_contents.append(f32(xs))
        return q.SerializeToString()

    def call(self, kind, payload, timeout=30):
        path = TR + "Predict" if kind == "p" else INF + "ModelInfer"
        code, details, resp = self.raw.call(path, payload, timeout=timeout)
        if code != SC.OK:
            return code, details, None
        if kind == "p":
            return code, "", self.tr.PredictResponse.FromString(resp[0]).logits.raw
        return code, "", self.inf.ModelInferResponse.FromString(resp[0]).raw_output_contents[0]

    def finish(self):
        self.raw.call(TR + "Shutdown", b"")
        self.raw.close()
        self.d.wait_exit()


def requests_for(f, rnd, n):
    """n good calls: (kind, payload), Predict and ModelInfer alternating, 1-5 samples."""
    out = []
    for i in range(n):
        xs = [rnd.uniform(-1, 1) for _ in range(SAMPLE * rnd.randint(1, 5))]
        out.append(("p", f.predict_req(xs)) if i % 2 == 0 else ("i", f.infer_req(xs)))
    return out


def burst(f, calls, timeout=30):
    """Sends every call at once (one thread each, released together); returns results."""
    res = [None] * len(calls)
    gate = threading.Barrier(len(calls))

    def one(i):
        gate.wait()
        t0 = time.perf_counter()
        r = f.call(calls[i][0], calls[i][1], timeout=calls[i][2] if len(calls[i]) > 2 else timeout)
        res[i] = r + (time.perf_counter() - t0,)
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    return res


def sc_batching(h):
    bad = []
    rnd = random.Random(5)
    f = Fixture(h, "batching", ["--max-queue-delay-us", "30000"])
    good = requests_for(f, rnd, 24)
    alone = [f.call(k, p)[2] for k, p in good]  # one at a time: each its own command
    if any(a is None for a in alone):
        raise Failure("a call alone failed")
    st0 = f.status()
    nan = [rnd.uniform(-1, 1) for _ in range(SAMPLE)]
    nan[17] = float("nan")
    refused = [("p", f.predict_req(nan)),
               ("p", f.tr.PredictRequest(x=f.tr.Tensor(datatype="FP32", shape=[1, 1, 28, 27],
                                                        raw=f32([0.0] * 756))).SerializeToString()),
               ("i", f.infer_req([0.5] * SAMPLE, model="no-such-model"))]
    expect = [SC.INVALID_ARGUMENT, SC.INVALID_ARGUMENT, SC.NOT_FOUND]

    # How many calls join depends on how fast the host lets 27 Python threads issue them
    # into the 30 ms window (CI, beside other tests: 48 calls in 33 commands once): a run
    # with too few joined is taken again, 3 runs in all (until_fed). A daemon that never
    # joins fails all 3; wrong rows or codes fail at once.
    def run_once():
        m0 = f.metrics()
        # Twice: the first burst shows the daemon concurrency, after which the delay applies.
        for rnd_i in range(2):
            res = burst(f, good + refused)
            for i, (code, details, out, dt) in enumerate(res[:len(good)]):
                if code != SC.OK:
                    bad.append("call %d: %s %s" % (i, code.name, details))
                elif out != alone[i]:
                    bad.append("call %d (%s): rows differ from the same call alone" % (i, good[i][0]))
            for j, (code, details, out, dt) in enumerate(res[len(good):]):
                if code != expect[j]:
                    bad.append("bad call %d: %s %r (expected %s)" % (j, code.name, details, expect[j].name))
        m1 = f.metrics()
        cmds = m1["distdl_inference_batch_rows_count"] - m0["distdl_inference_batch_rows_count"]
        calls = (m1["distdl_inference_batch_requests_total"] -
                 m0["distdl_inference_batch_requests_total"])
        rows = m1["distdl_inference_batch_rows_sum"] - m0["distdl_inference_batch_rows_sum"]
        delay = ((m1["distdl_inference_queue_delay_seconds_sum"] -
                  m0["distdl_inference_queue_delay_seconds_sum"]) / max(calls, 1))
        print("2 bursts of %d good + %d bad calls: %d calls answered by %d commands (%.1f calls, "
              "%.1f rows each); mean queue delay %.2f ms; every good call bitwise equal to itself "
              "alone" % (len(good), len(refused), calls, cmds, calls / max(cmds, 1),
                         rows / max(cmds, 1), delay * 1e3), flush=True)
        joined = calls == 2 * len(good) and cmds < calls / 2
        why = None if joined or bad else "%d calls in %d commands, too few joined" % (calls, cmds)
        return (calls, cmds, joined), why
    (calls, cmds, joined), _ = until_fed(run_once)
    if not joined:
        bad.append("%d calls in %d commands: not joined (expected %d calls, under %d commands)" %
                   (calls, cmds, 2 * len(good), len(good)))
    # A deadline that passes while the call waits for batch-mates (the delay is 30 ms and
    # the daemon has seen concurrency): that call alone fails, its batch-mates succeed.
    # The delay applies once the last command answered more than one call (dispatch.c):
    # when the host let the previous command answer a lone call, the deadlined call can be
    # answered at once, OK in under 10 ms, and never meets its deadline. That run measured
    # the host, so it is taken again (until_fed); a daemon that never holds the call for
    # batch-mates comes back OK in all 3 and fails below.
    def deadline_once():
        res = burst(f, [good[0] + (0.010,), good[1], good[2]])
        st1 = f.status()
        print("deadline 10 ms inside a 30 ms batching delay: %s after %.1f ms; the others %s; "
              "dropped_calls %d -> %d" % (res[0][0].name, res[0][3] * 1e3,
                                          [r[0].name for r in res[1:]], st0.dropped_calls,
                                          st1.dropped_calls), flush=True)
        early = res[0][0] == SC.OK and res[0][3] < 0.010
        return res, ("answered in %.1f ms, before its deadline" % (res[0][3] * 1e3)
                     if early else None)
    res, _ = until_fed(deadline_once)
    if res[0][0] != SC.DEADLINE_EXCEEDED or any(r[0] != SC.OK or r[2] != alone[i + 1]
                                                 for i, r in enumerate(res[1:])):
        bad.append("deadline in the batch: %s, others %s" % (res[0][0].name,
                                                              [r[0].name for r in res[1:]]))
    if not wait_for(lambda: f.status().dropped_calls > st0.dropped_calls, 5, 0.05):
        bad.append("the expired call was not counted in dropped_calls")
    f.finish()
    # Batching off: the same bits, one command per call.
    f = Fixture(h, "nobatch", ["--dynamic-batching", "off"])
    m0 = f.metrics()
    res = burst(f, good)
    m1 = f.metrics()
    cmds = m1["distdl_inference_batch_rows_count"] - m0["distdl_inference_batch_rows_count"]
    print("--dynamic-batching off: %d calls, %d commands" % (len(good), cmds), flush=True)
    if any(r[0] != SC.OK or r[2] != alone[i] for i, r in enumerate(res)) or cmds != len(good):
        bad.append("batching off: %d commands for %d calls, or other bits" % (cmds, len(good)))
    f.finish()
    if bad:
        raise Failure("; ".join(bad[:8]))


def train_losses(f, steps):
    """Runs a Train of `steps` steps; returns its per-step records as (done, loss) pairs and
    the final record's (done, mean loss over every step). The daemon may drop a per-step
    record when this reader falls behind (one send in flight, a ring of 16, then the newest
    replaces the last: server/service.c), so the pairs can have gaps; the final record is
    always sent."""
    call = f.raw.ch.unary_stream(TR + "Train")(
        f.tr.TrainRequest(steps=steps, progress_every=1).SerializeToString(), timeout=600)
    pairs, final = [], None
    for r in call:
        rec = f.tr.TrainProgress.FromString(r)
        if rec.finished:
            final = (rec.done, rec.loss)
        else:
            pairs.append((rec.done, rec.loss))
    return pairs, final


# The predictor of sc_train, run as `python3 -c PREDICTOR ADDRESS PATH`: reads the request
# (hex) from stdin, answers "ready" after its first good call, then calls in a closed loop
# until stdin closes, and prints {"calls": [[start, seconds], ...], "err": ...} (start on
# time.perf_counter's clock, CLOCK_MONOTONIC, which the parent shares).
PREDICTOR = r"""
import json, sys, threading, time
import grpc
addr, path = sys.argv[1], sys.argv[2]
req = bytes.fromhex(sys.stdin.readline().strip())
call = grpc.insecure_channel(addr).unary_unary(path)
stop, calls, err = threading.Event(), [], []
def closed():
    sys.stdin.read()
    stop.set()
threading.Thread(target=closed, daemon=True).start()
first = True
while not stop.is_set():
    s = time.perf_counter()
    try:
        call(req, timeout=60)
    except grpc.RpcError as e:
        err.append("%s %s" % (e.code().name, e.details()))
        break
    calls.append([s, time.perf_counter() - s])
    if first:
        print("ready", flush=True)
        first = False
if first:
    print("failed: " + "; ".join(err), flush=True)
print(json.dumps({"calls": calls, "err": "; ".join(err)}), flush=True)
"""


def recreate(f):
    spec = open(f.h.spec("lenet5-2.json")).read()
    code, details, _ = f.raw.call(TR + "CreateModel", f.tr.CreateModelRequest(
        spec_json=spec, replace=True).SerializeToString(), timeout=120)
    if code != SC.OK:
        raise Failure("CreateModel: %s %s" % (code.name, details))


def busy_train(f, x1, steps, quiet, t_quiet):
    """One Train of `steps` steps from the same start as the Train alone (its losses `quiet`,
    its seconds `t_quiet`), with a predictor process calling in a closed loop throughout.
    Returns (failures, starved): starved when the predictor was left without service that
    the host, not the daemon, explains (no interleaved command, or fewer than one call per
    4 steps during the Train) and nothing else failed."""
    bad = []
    recreate(f)
    train_losses(f, 1)
    # The predictor is a process of its own: in one Python process, grpcio's client at
    # times delivered an answer that had reached the socket 30-100 ms late while the same
    # process read the Train's stream (seen on a capture of loopback, Zen 5: the daemon
    # answered within a step), which measured the client, not the boundaries.
    pred = subprocess.Popen([sys.executable, "-c", PREDICTOR, f.d.address, TR + "Predict"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pred.stdin.write(x1.hex() + "\n")
    pred.stdin.flush()
    ready = pred.stdout.readline().strip()
    if ready != "ready":
        pred.kill()
        raise Failure("the predictor process did not start: %r" % ready)
    m0 = f.metrics()
    t0 = time.perf_counter()
    busy = train_losses(f, steps)
    t_busy = time.perf_counter() - t0
    try:
        out, _ = pred.communicate(timeout=60)  # closes its stdin: the predictor stops
    except subprocess.TimeoutExpired:
        pred.kill()
        raise Failure("the predictor process did not stop")
    res = json.loads(out)
    # The calls that started while the Train ran.
    lat = [l for s0, l in res["calls"] if t0 <= s0 < t0 + t_busy]
    m = f.metrics()
    inter = (m.get("distdl_inference_interleaved_total", 0) -
             m0.get("distdl_inference_interleaved_total", 0))
    step_ms = t_quiet / steps * 1e3
    print("Train of %d steps: %.1f ms per step alone, %.1f ms with predictions; %d Predicts "
          "answered during it: p50 %.1f ms, p99 %.1f ms, max %.1f ms; interleaved commands %d"
          % (steps, step_ms, t_busy / steps * 1e3, len(lat), percentile(lat, 50) * 1e3,
             percentile(lat, 99) * 1e3, max(lat or [0]) * 1e3, inter), flush=True)
    if res.get("err"):
        bad.append("a Predict during the Train failed: " + res["err"])
    # The same losses bit for bit. Per-step records a slow reader missed (by design) are
    # not compared; every delivered pair is, and so is the final record's mean over all the
    # Train's steps, which a change at any step would move: together as strong as all 200.
    (qp, qfin), (bp, bfin) = quiet, busy
    qd, bd = dict(qp), dict(bp)
    common = sorted(set(qd) & set(bd))
    diff = [i for i in common if qd[i] != bd[i]]
    order = [d for d, _ in bp] == sorted(set(d for d, _ in bp)) and set(bd) <= set(range(1, steps + 1))
    if diff or bfin != qfin or qfin is None or qfin[0] != steps or not order:
        bad.append("the losses differ with interleaved predictions (%d and %d of %d per-step "
                   "records compared; first differing step %s; final %s vs %s alone; steps in "
                   "order %s)" % (len(common), len(bp), steps, diff[:1], bfin, qfin, order))
    elif len(common) < steps:
        print("  %d of %d per-step records delivered to both runs (a slow reader misses some "
              "by design); those and the final mean compared" % (len(common), steps), flush=True)
    # Answered between steps, not after the Train: many answers, the median within a few
    # steps, none as long as the Train. (Only these: a 2-core host with both ranks busy
    # leaves the caller unscheduled for up to ~0.1 s at times, so the slowest call measures
    # the host's scheduler; a call held to the Train's end would show in all three.)
    p50 = percentile(lat, 50)
    few = (len(lat) < steps / 4 or p50 > max(5 * step_ms / 1e3, 0.010) or
           max(lat or [1e9]) >= t_quiet)
    if few:
        bad.append("%d Predicts during %d steps, median %.1f ms, slowest %.1f ms (Train %.0f ms)"
                   % (len(lat), steps, p50 * 1e3, max(lat or [0]) * 1e3, t_quiet * 1e3))
    if inter < 1:
        bad.append("no interleaved command counted")
    # A predictor process the host left unscheduled makes few calls, or none that meet a
    # boundary (CI: none in a 0.5 s Train; a partial stall leaves some, under steps / 4).
    # A daemon that holds calls to the Train's end shows the same signs in every attempt
    # (one call during the Train, none interleaved), so it still fails.
    starved = inter < 1 or len(lat) < steps / 4
    return bad, starved and len(bad) == few + (inter < 1)


def until_fed(run_once, runs=3):
    """Runs run_once() until it says nothing starved it, `runs` times at most. run_once
    returns (result, why): why None when the run was fed, else what the host left starved,
    and then the run is taken again (the callers share 2 cores with two busy ranks, and a
    caller the host leaves unscheduled measures the host, not the daemon). Anything that
    only the daemon explains is raised by run_once at once. Returns the last (result,
    why): a daemon that starves its callers shows it in every run."""
    for run in range(1, runs + 1):
        res, why = run_once()
        if why is None or run == runs:
            return res, why
        print("  run %d of %d: %s; again" % (run, runs, why), flush=True)


def sc_train(h):
    # 200 steps (0.35-0.6 s): long enough that a call answered within a few steps and
    # one held to the Train's end differ by far more than the hosts' scheduling noise
    # (callers stalled 25-50 ms at times on a 2-core host with both ranks busy).
    steps = 200
    # Share 100: every boundary may answer. Under the default share of 5 % a 1.8 ms step
    # (Zen 5) leaves room for only ~12 interludes in 60 steps, a property of the budget
    # (trainshare's test), not of the boundaries tested here.
    f = Fixture(h, "train", ["--serve-during-train-share", "100"])
    rnd = random.Random(9)
    x1 = f.predict_req([rnd.uniform(-1, 1) for _ in range(SAMPLE)])
    # The same start for every run: a new model, and one step that opens the dataset (a
    # new model's first Train loads it, 0.25-0.3 s of Fashion-MNIST on this project's
    # hosts, during which no step boundary comes; measured here are the boundaries).
    recreate(f)
    train_losses(f, 1)
    t0 = time.perf_counter()
    quiet = train_losses(f, steps)
    t_quiet = time.perf_counter() - t0
    # An attempt in which the predictor was starved (none interleaved, or fewer calls than
    # steps / 4, nothing else wrong) is taken again, up to 3 in all. Seen
    # once on the 2-core CI host: no call started and none was counted in a 0.5 s Train,
    # while trainshare (4 clients) passed there right after; a predictor process left
    # unscheduled measures the host, not the boundaries. A daemon that holds calls to the
    # Train's end fails every attempt alike; any other failure ends the test at once.
    def run_once():
        bad, starved = busy_train(f, x1, steps, quiet, t_quiet)
        return bad, ("the predictor was starved (%s)" % "; ".join(bad)) if starved else None
    bad, _ = until_fed(run_once)
    f.finish()
    if bad:
        raise Failure("; ".join(bad))

def predictors_during_train(f, n, steps, samples=1):
    """n clients predicting `samples` samples in a loop through a Train of `steps` steps;
    every call must succeed. Returns the calls made, the Train's wall time (s) and the
    change of every distdl_inference_* metric."""
    rnd = random.Random(5)
    x1 = f.predict_req([rnd.uniform(-1, 1) for _ in range(SAMPLE * samples)])
    train_losses(f, 1)
    m0 = f.metrics()
    stop, state, count = threading.Event(), {}, [0]

    def predictor():
        while not stop.is_set():
            code, details, _ = f.call("p", x1, timeout=60)
            if code != SC.OK:
                state["err"] = "%s %s" % (code.name, details)
                return
            count[0] += 1
    ths = [threading.Thread(target=predictor) for _ in range(n)]
    for t in ths:
        t.start()
    wait_for(lambda: count[0] >= 2 * n or "err" in state, 30, 0.005)  # all of them calling
    t0 = time.perf_counter()
    train_losses(f, steps)
    t_train = time.perf_counter() - t0
    stop.set()
    for t in ths:
        t.join(60)
    m1 = f.metrics()
    if "err" in state:
        raise Failure("a Predict during the Train failed: " + state["err"])
    # Counters as their change; the gauge of the longest interlude as it is (the Train's).
    return count[0], t_train, {k: m1[k] - (0 if k.endswith("_max_seconds") else m0.get(k, 0))
                               for k in m1}


def sc_trainsolo(h):
    """--dynamic-batching off during a Train: 4 concurrent predictors, and every command
    answered at a step boundary still carries one call."""
    # calls == commands is exact and judged in every run. It needs at least 2 commands at
    # step boundaries to mean anything (where calls could have met), and how many the 4
    # Python callers get there depends on how the host schedules them beside two busy
    # ranks: a run with fewer is taken again, 3 runs in all, as trainshare does. A daemon
    # that joins calls fails the run it does it in; one that never answers between steps
    # fails all 3.
    def run_once():
        f = Fixture(h, "trainsolo", ["--dynamic-batching", "off",
                                     "--serve-during-train-share", "100"])
        _, _, dm = predictors_during_train(f, 4, 200)
        f.finish()
        cmds = dm["distdl_inference_batch_rows_count"]
        calls = dm["distdl_inference_batch_requests_total"]
        inter = dm.get("distdl_inference_interleaved_total", 0)
        print("--dynamic-batching off, 4 predictors during a 200-step Train: %d calls in %d "
              "commands, %d of them at step boundaries" % (calls, cmds, inter), flush=True)
        if calls != cmds:
            raise Failure("with --dynamic-batching off, %d calls ran in %d commands (%d "
                          "interleaved)" % (calls, cmds, inter))
        return inter, None if inter >= 2 else "%d interleaved commands, under 2" % inter
    inter, why = until_fed(run_once)
    if why is not None:
        raise Failure("with --dynamic-batching off, under 2 interleaved commands in each "
                      "of 3 runs (the last: %d)" % inter)


def sc_trainshare(h):
    for bad in ["0", "101", "5%", ""]:
        cmd = ([h.mpiexec, "-np", "2"] + h.mpi_flags +
               [h.distdld, "--listen", "127.0.0.1:0", "--serve-during-train-share", bad])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        want = '--serve-during-train-share: bad value "%s"' % bad
        if r.returncode != 2 or want not in r.stdout + r.stderr:
            raise Failure("--serve-during-train-share %r: expected exit 2 naming it, got %d:\n%s"
                          % (bad, r.returncode, (r.stdout + r.stderr)[-2000:]))
        print("  refused (exit 2): --serve-during-train-share %r" % bad, flush=True)
    # The interludes take at most the share of the Train's time plus the last one (the
    # budget is checked before each), so at most the share plus the longest, which the
    # daemon reports (distdl_inference_interlude_max_seconds): an exact bound, whatever the
    # host. 4 clients of 32 samples each keep share 100 well above share 1's bound, so a
    # budget that did not hold would fail. That share-100 run is the precondition: its
    # load, not the daemon, varies with how the host schedules the 4 Python callers beside
    # two busy ranks (here 6-46 % of the Train: 69 to 820 calls), so a load under share 1's
    # bound is taken again, 3 runs in all, as is a run at either share in which no call was
    # answered between steps (two busy loops beside it starved the callers for a whole
    # Train). A share 100 that served like share 1, or a daemon that held the calls to the
    # Train's end, fails all 3; a budget exceeded fails at once.
    steps, bad, spent = 200, [], {}
    runs = 3
    for share in [100, 1]:
        def run_once():
            f = Fixture(h, "share%d" % share, ["--serve-during-train-share", str(share)])
            calls, t_train, dm = predictors_during_train(f, 4, steps, 32)
            f.finish()
            inter = int(dm.get("distdl_inference_interleaved_total", 0))
            spent[share] = dm.get("distdl_inference_interlude_seconds_total", 0)
            longest = dm.get("distdl_inference_interlude_max_seconds", 0)
            bound = 0.01 * t_train + longest + 1e-4  # 0.1 ms for the metrics' rounding
            print("--serve-during-train-share %d: 4 predictors during a %d-step Train of "
                  "%.0f ms: %d calls, %d interleaved commands taking %.1f ms (%.1f %%, the "
                  "longest %.1f ms; share 1's bound %.1f ms)"
                  % (share, steps, t_train * 1e3, calls, inter, spent[share] * 1e3,
                     100 * spent[share] / t_train, longest * 1e3, bound * 1e3), flush=True)
            if inter < 1 or spent[share] <= 0:
                return (inter, t_train, bound), "no call answered between steps"
            if share == 100 and spent[share] <= bound:
                return (inter, t_train, bound), "the load stayed under share 1's bound"
            return (inter, t_train, bound), None
        (inter, t_train, bound), why = until_fed(run_once, runs)
        none = why == "no call answered between steps"
        light = why == "the load stayed under share 1's bound"
        if none:
            bad.append("share %d: no answer between steps (%d commands, %.1f ms) in %d runs"
                       % (share, inter, spent[share] * 1e3, runs))
        elif light:
            bad.append("share 100 spent %.1f ms, not above share 1's bound (%.1f ms) in %d "
                       "runs: the load does not test the budget"
                       % (spent[share] * 1e3, bound * 1e3, runs))
        if share == 1 and spent[share] > bound:
            bad.append("share 1: interludes took %.1f ms of a %.0f ms Train (bound %.1f ms)"
                       % (spent[share] * 1e3, t_train * 1e3, bound * 1e3))
    if bad:
        raise Failure("; ".join(bad))


def sc_trainoff(h):
    """--serve-during-train off: a Predict sent during a Train waits for the Train's end.
    Judged on the daemon's side, not by two client threads' clocks (which a loaded host
    skews by tens of ms): with the Predict in its hands (active_calls), the daemon runs 300
    more steps (its own step count) without answering it and without an interleaved command
    (/metrics, exact); the Train is then cancelled and the Predict answered."""
    f = Fixture(h, "trainoff", ["--serve-during-train", "off"])
    rnd = random.Random(9)
    x1 = f.predict_req([rnd.uniform(-1, 1) for _ in range(SAMPLE)])
    train_losses(f, 1)
    m0 = f.metrics()
    # A Train far longer than the test (cancelled below), so that the Predict cannot miss it.
    train = f.raw.ch.unary_stream(TR + "Train")(
        f.tr.TrainRequest(steps=1000000, progress_every=1000).SerializeToString(), timeout=600)
    end = {}

    def drain():
        try:
            for _ in train:
                pass
            end["code"] = SC.OK
        except grpc.RpcError as e:
            end["code"] = e.code()
    th = threading.Thread(target=drain)
    th.start()
    try:
        if not wait_for(lambda: f.status().state == "training", 60, 0.01):
            raise Failure("the Train did not start within 60 s")
        base = f.status().active_calls  # the Train
        t_sent = time.perf_counter()
        fut = f.raw.ch.unary_unary(TR + "Predict").future(x1, timeout=300)
        # 60 s and 120 s are hang detectors only.
        if not wait_for(lambda: f.status().active_calls > base, 60, 0.005):
            raise Failure("the Predict did not reach the daemon within 60 s")
        s0 = f.status()
        if not wait_for(lambda: f.status().step >= s0.step + 300, 120, 0.01):
            raise Failure("the Train did not run 300 steps in 120 s")
        s1 = f.status()
        held = not fut.done()
        m1 = f.metrics()
    finally:
        t_cancel = time.perf_counter()
        train.cancel()
        th.join(120)
    try:
        fut.result(timeout=120)
        code = SC.OK
    except grpc.RpcError as e:
        code = e.code()
    t_ans = time.perf_counter()
    inter = (m1.get("distdl_inference_interleaved_total", 0) -
             m0.get("distdl_inference_interleaved_total", 0))
    print("--serve-during-train off: the Predict, in the daemon's hands from step %d, still "
          "unanswered at step %d (%s, %d interleaved commands); answered (%s) %.1f ms after "
          "the Train's cancel, %.0f ms after it was sent; the Train ended %s"
          % (s0.step, s1.step, "held" if held else "ANSWERED", inter, code.name,
             (t_ans - t_cancel) * 1e3, (t_ans - t_sent) * 1e3, end.get("code")), flush=True)
    f.finish()
    if code != SC.OK or not held or inter != 0 or s1.state != "training":
        raise Failure("with --serve-during-train off the Predict was answered during the Train "
                      "(held %s, %d interleaved commands, %s, state %s)"
                      % (held, inter, code.name, s1.state))


if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, {"batching": sc_batching, "train": sc_train,
                                     "trainoff": sc_trainoff, "trainsolo": sc_trainsolo,
                                     "trainshare": sc_trainshare}))
