#!/usr/bin/python3
"""Deadlines, cancellation and backpressure (issue 9, item 6), against a 2-rank distdld
with LeNet-5 while a long Train holds the ranks:

  deadline      a Predict and a Step with a 100 ms deadline get DEADLINE_EXCEEDED on time;
                the daemon drops both from its queue at once (GetStatus request_queue_depth,
                dropped_calls) and the Step never runs later (the step counter).
  cancel        1,000 calls of every kind started and cancelled at random moments (queued,
                in flight, mid-stream): afterwards GetStatus active_calls is 0, the queue is
                empty, rank 0's VmRSS growth is bounded, and valid calls succeed.
  backpressure  --queue 64 and 500 concurrent Predicts: 64 are queued and succeed, the rest
                get RESOURCE_EXHAUSTED quickly (p50/p99 reported), VmRSS bounded.
  httpcancel    KServe over HTTP (--http-listen): of two infer requests queued behind the
                Train, the one whose client closes its connection leaves the queue while the
                Train still runs (request_queue_depth, dropped_calls); the one whose client
                stays is answered 200 with its logits once the Train is cancelled.

  deadline_test.py --build B --source S --mpiexec M --mpi-flags F SCENARIO
"""
import faulthandler
import os
import random
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if sys.argv[-1] in ("backpressure", "httpcancel"):
    # gRPC's INFO lines (a GOAWAY received, a keepalive watchdog, a failed connect) in this
    # client's output and in the daemon's log, which a failure prints: one line when all
    # goes well. Set before grpc is imported; the daemon inherits it. (httpcancel: a Train
    # once ended during the wait with its call cancelled, by no cancel of the test's.)
    os.environ.setdefault("GRPC_VERBOSITY", "INFO")
from hostile_common import (HE, TR, Failure, Harness, Raw, cpu_top, f32, percentile,  # noqa
                            rank0_pid, tcp_queues, vm_rss_kb, wait_for)
from ddl_daemon import SANITIZER, run_scenarios  # noqa: E402
import grpc  # noqa: E402

SC = grpc.StatusCode
SAMPLE, BATCH = 784, 64


class Fixture:
    def __init__(self, h, name, queue=64, args=()):
        self.h = h
        self.tr = h.tr
        # The ranks held by a Train are the point here: inference calls wait for it
        # (answers between steps, serving_test.py, are turned off).
        self.d = h.start(2, ["--queue", str(queue), "--model", h.spec("lenet5-2.json"),
                             "--serve-during-train", "off"] + list(args), name)
        self.raw = Raw(self.d.address)
        # The burst channel's connectivity states, for a failure's account of a stall.
        self.t0 = time.perf_counter()
        self.states = []
        self.on_state = lambda st: self.states.append(
            "%s at %.1f s" % (st.name, time.perf_counter() - self.t0))
        self.raw.ch.subscribe(self.on_state)
        # GetStatus on a connection of its own: the test's bursts of Predicts share one
        # HTTP/2 connection, and a Python client starved of CPU beside a busy Train can
        # leave that connection unread for seconds (seen: 1-6 s with CPU hogs beside it,
        # while a loopback capture showed the daemon answering within a millisecond).
        # (Until this session's mend it was not its own: grpcio had given both channels
        # the same connection, see Raw.)
        self.status_raw = Raw(self.d.address, own_connection=True)
        self.pid = rank0_pid(self.d)
        rnd = random.Random(3)
        tr = self.tr
        self.x1 = tr.PredictRequest(x=tr.Tensor(
            datatype="FP32", shape=[1, 1, 28, 28],
            raw=f32([rnd.uniform(-1, 1) for _ in range(SAMPLE)]))).SerializeToString()
        self.batch = tr.Batch(
            x=tr.Tensor(datatype="FP32", shape=[BATCH, 1, 28, 28],
                        raw=f32([rnd.uniform(-1, 1) for _ in range(BATCH * SAMPLE)])),
            labels=tr.Tensor(datatype="INT64", shape=[BATCH],
                             raw=struct.pack("<%dq" % BATCH, *[i % 10 for i in range(BATCH)])))
        self.step_req = tr.StepRequest(batch=self.batch).SerializeToString()
        self.train_call = None
        self.idle = True
        self.train_records = 0

    def status(self):
        code, details, resp = self.status_raw.call(TR + "GetStatus", b"")
        if code != SC.OK:
            raise Failure("GetStatus: %s %s" % (code.name, details))
        return self.tr.GetStatusResponse.FromString(resp[0])

    def start_train(self, every=1):
        """A long Train on the server-side dataset, a record every `every` steps; returns
        once this Train reports progress. How it ended goes to train_end."""
        self.train_call = self.raw.ch.unary_stream(TR + "Train")(
            self.tr.TrainRequest(steps=1000000, progress_every=every).SerializeToString(),
            timeout=600)
        self.train_end = "running"
        first = threading.Event()
        t0 = self.train_t0 = time.perf_counter()

        def consume():
            try:
                for _ in self.train_call:
                    self.train_records += 1
                    first.set()
                self.train_end = "OK after %.1f s" % (time.perf_counter() - t0)
            except grpc.RpcError as e:
                self.train_end = "%s (%s) after %.1f s" % (e.code().name, e.details(),
                                                          time.perf_counter() - t0)
            first.set()
        self.train_thread = threading.Thread(target=consume, daemon=True)
        self.train_thread.start()
        if not first.wait(120) or self.train_end != "running":
            raise Failure("the Train sent no progress: %s" % self.train_end)
        self.idle = False

    def stop_train(self):
        self.train_call.cancel()
        # The waits on the daemon's completion-queue thread in this file are hang detectors
        # of 120 s: beside a 1M-step Train on a loaded 2-core host that thread has been left
        # unscheduled for seconds (cancel lags up to 14.6 s: tests/python/python_harness.py).
        # The states they wait for stay exact.
        self.train_thread.join(120)
        ok = wait_for(lambda: self.status().state == "idle", 120)
        if not ok:
            raise Failure("the Train did not stop after its cancel")
        self.idle = True

    def finish(self):
        self.raw.ch.unsubscribe(self.on_state)
        self.status_raw.close()
        self.raw.call(TR + "Shutdown", b"")
        self.raw.close()
        self.d.wait_exit()


def sc_deadline(h):
    f = Fixture(h, "deadline")
    bad = []
    # A record every 20 steps, as in backpressure_round: a Python client starved of CPU
    # beside the Train falls behind a record per step (~800 a second with LeNet-5) in the
    # connection its calls share. (Stop 49's CI run: the Step's DEADLINE_EXCEEDED reached
    # the client after 22.1 s, with the Train at a record per step.)
    f.start_train(every=20)
    st0 = f.status()
    # The daemon's view, on a connection of its own, every 20 ms while the two calls run:
    # when its dropped_calls counter took each call out of the queue. A late answer then
    # tells the daemon's delay from the client's.
    drops, watching = [], threading.Event()
    t_start = time.perf_counter()

    def watch():
        seen = st0.dropped_calls
        while not watching.is_set():
            try:
                n = f.status().dropped_calls
            except Failure as e:
                drops.append("no GetStatus: %s" % e)
                return
            if n > seen:
                drops.extend(["%.1f ms" % ((time.perf_counter() - t_start) * 1e3)] * (n - seen))
                seen = n
            time.sleep(0.02)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for name, path, payload in [("Predict", TR + "Predict", f.x1), ("Step", TR + "Step", f.step_req)]:
        t0 = time.perf_counter()
        code, details, _ = f.raw.call(path, payload, timeout=0.100)
        dt = time.perf_counter() - t0
        print("%s with a 100 ms deadline during Train (%.1f ms into the test): %s %r after "
              "%.1f ms" % (name, (t0 - t_start) * 1e3, code.name, details, dt * 1e3), flush=True)
        # On time: the deadline is the client's, DEADLINE_EXCEEDED arrives at 100 ms; the
        # margin (400 ms) covers a loaded 2-core machine shared with other builds.
        if code != SC.DEADLINE_EXCEEDED or dt > 0.5:
            bad.append("%s: %s after %.1f ms (the daemon dropped calls at: %s; the Train: %s, "
                       "%d records; the channel's states: %s)" % (
                           name, code.name, dt * 1e3, ", ".join(drops) or "none yet",
                           f.train_end, f.train_records, ", ".join(f.states)))
    # The server dropped both from its queue by itself (gRPC cancels the call at its
    # deadline; the daemon takes the job out of the queue at that moment).
    t0 = time.time()
    wait_for(lambda: len(drops) >= 2 or not watcher.is_alive(), 120, 0.02)
    watching.set()
    watcher.join(30)
    st1 = f.status()
    print("dropped_calls %d -> %d, request_queue_depth %d (%.0f ms after the deadlines); the "
          "daemon's drops seen at %s" % (st0.dropped_calls, st1.dropped_calls,
                                         st1.request_queue_depth, (time.time() - t0) * 1e3,
                                         ", ".join(drops)))
    if st1.dropped_calls < st0.dropped_calls + 2 or st1.request_queue_depth != 0:
        bad.append("queued calls past their deadline not dropped: dropped_calls %d -> %d, queue %d" %
                   (st0.dropped_calls, st1.dropped_calls, st1.request_queue_depth))
    f.stop_train()
    s_after = f.status().step
    time.sleep(1.0)
    s_later = f.status().step
    print("step after the Train stopped: %d, one second later: %d" % (s_after, s_later))
    if s_later != s_after:
        bad.append("the step counter moved from %d to %d after the Train: the expired Step ran" %
                   (s_after, s_later))
    # And a Predict with the same deadline on idle ranks succeeds.
    code, details, _ = f.raw.call(TR + "Predict", f.x1, timeout=5)
    if code != SC.OK:
        bad.append("Predict on idle ranks: %s %s" % (code.name, details))
    f.finish()
    if bad:
        raise Failure("; ".join(bad))


def cancelled_call(f, kind, rnd, delay):
    """Starts one call of `kind` and cancels it after `delay` seconds. Returns the code."""
    ch = f.raw.ch
    if kind in ("Predict", "Step", "Evaluate", "GetStatus", "Health"):
        path, payload = {
            "Predict": (TR + "Predict", f.x1),
            "Step": (TR + "Step", f.step_req),
            "Evaluate": (TR + "Evaluate", f.tr.EvaluateRequest(batch=f.batch).SerializeToString()),
            "GetStatus": (TR + "GetStatus", b""),
            "Health": (HE + "Check", b""),
        }[kind]
        fut = ch.unary_unary(path).future(payload, timeout=30)
        time.sleep(delay)
        fut.cancel()
        try:
            fut.result(timeout=30)
            return SC.OK
        except grpc.FutureCancelledError:
            return SC.CANCELLED
        except grpc.RpcError as e:
            return e.code()
    if kind in ("PullWeights", "Train", "Watch"):
        path, payload = {"PullWeights": (TR + "PullWeights", b""),
                         "Train": (TR + "Train", f.tr.TrainRequest(steps=3).SerializeToString()),
                         "Watch": (HE + "Watch", b"")}[kind]
        call = ch.unary_stream(path)(payload, timeout=30)
        try:
            if f.idle and rnd.random() < 0.5:
                next(call)  # mid-stream (behind a Train the first record would not come)
            time.sleep(delay)
            call.cancel()
            for _ in call:
                pass
            return SC.OK
        except StopIteration:
            return SC.OK
        except grpc.RpcError as e:
            return e.code()
    # Client streams: one message, then cancelled before the stream ends.
    gate = threading.Event()
    if kind == "SubmitBatch":
        first = f.batch.SerializeToString()
        path = TR + "SubmitBatch"
    else:
        first = f.tr.WeightChunk(first=True, name="conv1.weight", datatype="FP32",
                                 shape=[6, 1, 5, 5], data=bytes(64)).SerializeToString()
        path = TR + "PushWeights"

    def gen():
        yield first
        gate.wait(30)
    fut = ch.stream_unary(path).future(gen(), timeout=30)
    time.sleep(delay)
    fut.cancel()
    gate.set()
    try:
        fut.result(timeout=30)
        return SC.OK
    except grpc.FutureCancelledError:
        return SC.CANCELLED
    except grpc.RpcError as e:
        return e.code()


KINDS = ["Predict", "Step", "Evaluate", "GetStatus", "Health", "PullWeights", "Train", "Watch",
         "SubmitBatch", "PushWeights"]


def run_cancelled(f, n, seed, threads=16):
    rnd = random.Random(seed)
    plan = [(rnd.choice(KINDS), rnd.uniform(0, 0.03)) for _ in range(n)]
    codes = {}
    lock = threading.Lock()
    it = iter(enumerate(plan))

    def worker():
        r = random.Random(seed * 7 + threading.get_ident() % 1000)
        while True:
            with lock:
                try:
                    i, (kind, delay) = next(it)
                except StopIteration:
                    return
            code = cancelled_call(f, kind, r, delay)
            with lock:
                key = "%s:%s" % (kind, code.name)
                codes[key] = codes.get(key, 0) + 1
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return codes


def cancel_round(f, seed):
    """500 cancelled calls behind a Train (queued), 500 on idle ranks (in flight, mid-stream);
    then the submitted batches they left are consumed. Returns the outcomes."""
    f.start_train()
    codes = run_cancelled(f, 500, seed)
    f.stop_train()
    for k, v in run_cancelled(f, 500, seed + 1).items():
        codes[k] = codes.get(k, 0) + v
    # Batches that SubmitBatch accepted before its cancel stay queued (documented): Step
    # consumes them, so the memory figure is not the queue's contents.
    while f.status().queue_depth > 0:
        f.raw.call(TR + "Step", f.tr.StepRequest().SerializeToString(), timeout=60)
    return codes


def sc_cancel(h):
    f = Fixture(h, "cancel")
    bad = []
    cancel_round(f, 1)  # warm-up: gRPC's and the allocator's caches reach their size
    time.sleep(1)
    # Bounded: 1,000 cancelled calls after a warm-up round leave under 8 MB (measured quiet:
    # 0.2-1.1 MB). A leak grows by its size every round; glibc's per-thread arenas grow once,
    # when a loaded machine makes gRPC start more threads (seen: +9.9 MB in the first
    # measured round at load 8). So a round over the bound is followed by another, up to 3:
    # the test fails only if every one of them grows by 8 MB or more. Leaked calls would
    # also show in active_calls, checked after each round.
    growth = []
    for rnd in range(3):
        rss0 = vm_rss_kb(f.pid)
        st0 = f.status()
        t0 = time.time()
        codes = cancel_round(f, 2 + rnd)
        print("round %d: 1000 cancelled calls in %.1f s; outcomes: %s" %
              (rnd + 1, time.time() - t0, ", ".join("%s %d" % kv for kv in sorted(codes.items()))),
              flush=True)
        settled = wait_for(lambda: f.status().active_calls == 0 and
                           f.status().request_queue_depth == 0, 120, 0.2)
        st1 = f.status()
        time.sleep(1)
        rss1 = vm_rss_kb(f.pid)
        print("after: active_calls %d, request_queue_depth %d, dropped_calls %d -> %d, submitted "
              "batches %d; rank 0 VmRSS %d -> %d kB (%+d)" % (
                  st1.active_calls, st1.request_queue_depth, st0.dropped_calls, st1.dropped_calls,
                  st1.queue_depth, rss0, rss1, rss1 - rss0), flush=True)
        if not settled:
            bad.append("calls still live: active_calls %d, queue %d" % (st1.active_calls,
                                                                        st1.request_queue_depth))
        if st1.dropped_calls <= st0.dropped_calls:
            bad.append("no queued call was dropped (dropped_calls %d)" % st1.dropped_calls)
        growth.append(rss1 - rss0)
        if bad or growth[-1] < 8 * 1024 or SANITIZER:
            break
    if min(growth) >= 8 * 1024 and not SANITIZER:
        bad.append("rank 0's VmRSS grew by %s kB over %d rounds of 1,000 cancelled calls" % (
            growth, len(growth)))
    code, details, _ = f.raw.call(TR + "Predict", f.x1, timeout=30)
    if code != SC.OK:
        bad.append("Predict afterwards: %s %s" % (code.name, details))
    code, details, _ = f.raw.call(TR + "Step", f.step_req, timeout=60)
    if code != SC.OK:
        bad.append("Step afterwards: %s %s" % (code.name, details))
    f.finish()
    if bad:
        raise Failure("; ".join(bad))


def backpressure_round(f, n=500):
    """n concurrent Predicts while a Train holds the ranks. Returns (codes, rejection
    latencies in ms, request_queue_depth while full, VmRSS at the peak)."""
    # A record every 20 steps (~25 a second). With one per step (~500 a second) distdld
    # writes records faster than a starved Python client reads them: its answers queue
    # behind them in the one byte stream, and once the client's socket buffer is full the
    # zero window outlasts gRPC's TCP_USER_TIMEOUT (the 20 s keepalive timeout), so the
    # daemon's kernel drops the connection and with it the Train. Shown here with the
    # client stopped for 45 s and tcp_rmem's maximum at 1 MB: its buffer full within 12 s,
    # the daemon's socket gone within 30 s; at one record per 20 steps the buffer held 55 KB
    # after 42 s and the connection lived.
    f.start_train(every=20)
    t_start, t_end, codes = {}, {}, {}
    lock = threading.Lock()
    done = threading.Event()
    fn = f.raw.ch.unary_unary(TR + "Predict")

    def on_done(i):
        def cb(fut):
            t = time.perf_counter()
            try:
                fut.result()
                c = SC.OK
            except grpc.RpcError as e:
                c = e.code()
            with lock:
                t_end[i] = t
                codes[i] = c
                if len(codes) == n:
                    done.set()
        return cb
    futs = []
    for i in range(n):
        t_start[i] = time.perf_counter()
        fut = fn.future(f.x1, timeout=120)
        fut.add_done_callback(on_done(i))
        futs.append(fut)

    def rejected():
        return sum(1 for c in list(codes.values()) if c == SC.RESOURCE_EXHAUSTED)
    # Every rejection arrives while the Train still holds the ranks (it never ends by
    # itself: 1,000,000 steps). Where it stopped if not (three CI runs stalled here on a
    # 2-core Intel host, the third with the burst's connection gone, as above): every 5 s
    # the client's count and the daemon's view on a connection of its own.
    t0, seen = time.perf_counter(), []
    while not wait_for(lambda: rejected() >= n - 64, 5, 0.05):
        st = f.status()
        seen.append("%.0f s: %d refused, %d answered; daemon %s, active_calls %d, queue %d; "
                    "Train %d records, %s" % (time.perf_counter() - t0, rejected(), len(codes),
                                              st.state, st.active_calls, st.request_queue_depth,
                                              f.train_records, f.train_end))
        if time.perf_counter() - t0 < 60:
            continue
        # The kernel's socket queues (which side holds unread bytes), a Predict on another
        # connection, what used the CPU meanwhile and where this client's threads are.
        queues = tcp_queues(int(f.d.address.rsplit(":", 1)[1]))
        t1 = time.perf_counter()
        code, _, _ = f.status_raw.call(TR + "Predict", f.x1, timeout=10)
        probe = "%s after %.0f ms" % (code.name, (time.perf_counter() - t1) * 1e3)
        top = cpu_top(2.0)
        faulthandler.dump_traceback(all_threads=True)
        raise Failure("%d of the %d calls beyond --queue 64 not refused after 60 s; every 5 s:\n  "
                      "%s\na Predict on another connection: %s; sockets: %s; CPU over 2 s: %s; "
                      "the burst channel's states: %s"
                      % (n - 64 - rejected(), n - 64, "\n  ".join(seen), probe, queues, top,
                         ", ".join(f.states)))
    st = f.status()
    rss_peak = vm_rss_kb(f.pid)
    with lock:
        lat = [(t_end[i] - t_start[i]) * 1e3 for i, c in codes.items() if c == SC.RESOURCE_EXHAUSTED]
    f.stop_train()
    done.wait(120)
    return dict(codes), lat, st.request_queue_depth, rss_peak


def sc_backpressure(h):
    f = Fixture(h, "backpressure", queue=64)
    bad = []
    n = 500
    backpressure_round(f, n)  # warm-up (also opens the dataset the Train reads)
    time.sleep(0.5)
    rss0 = vm_rss_kb(f.pid)
    # Three measured rounds: what one burst costs (its peak) and whether bursts accumulate.
    # glibc gives each gRPC thread its own arena, so a round may fault in a few MB that later
    # rounds reuse; a per-call leak would grow every round.
    rounds = []
    for _ in range(3):
        codes, lat, depth, rss_peak = backpressure_round(f, n)
        time.sleep(0.5)
        rounds.append((rss_peak, vm_rss_kb(f.pid)))
    rss_peak = max(r[0] for r in rounds)
    rss1 = rounds[-1][1]
    print("rank 0 VmRSS after the warm-up %d kB; after each measured round: %s kB" %
          (rss0, ", ".join("%+d (peak %+d)" % (e - rss0, p - rss0) for p, e in rounds)), flush=True)
    ok = sum(1 for c in codes.values() if c == SC.OK)
    re = sum(1 for c in codes.values() if c == SC.RESOURCE_EXHAUSTED)
    other = sorted({c.name for c in codes.values() if c not in (SC.OK, SC.RESOURCE_EXHAUSTED)})
    print("%d concurrent Predicts with --queue 64 behind a Train: %d OK, %d RESOURCE_EXHAUSTED, "
          "others %s; request_queue_depth %d while full; rejection latency (from issue, one Python "
          "thread issuing) p50 %.1f ms p99 %.1f ms max %.1f ms; rank 0 VmRSS %d -> %d (peak) -> %d kB"
          % (n, ok, re, other, depth, percentile(lat, 50), percentile(lat, 99),
             max(lat) if lat else 0, rss0, rss_peak, rss1), flush=True)
    if len(codes) != n or ok != 64 or re != n - 64 or other:
        bad.append("expected 64 OK and %d RESOURCE_EXHAUSTED of %d, got %d OK, %d RE, %s" %
                   (n - 64, n, ok, re, other))
    if depth != 64:
        bad.append("request_queue_depth %d while full (expected 64)" % depth)
    # Quickly: long before the Train frees the ranks (backpressure_round fails a rejection
    # that waits for it). The figures are taken in Python, so they include the time the one
    # issuing thread holds the GIL (the callbacks wait for it) and any time the client is
    # starved of CPU beside the Train's two busy ranks: 2-50 ms p50 on a quiet machine, 213
    # ms at load average 10, and single stalls of 1-6 s with 2-3 CPU hogs beside the test
    # (Zen 5), during which a loopback capture showed the daemon's answers already sent.
    # Hence a median bound, and a wide one on the slowest.
    if not lat or percentile(lat, 50) > 1000 or max(lat) > 15000:
        bad.append("rejections slow: p50 %.1f ms, max %.1f ms" % (percentile(lat, 50),
                                                                  max(lat) if lat else -1))
    # Bounded: 3 x 500 more concurrent calls after a warm-up round leave under 12 MB in all
    # (measured: 0.1-7 MB), and no burst peaks 16 MB over the baseline.
    if (rss1 - rss0 >= 12 * 1024 or rss_peak - rss0 >= 16 * 1024) and not SANITIZER:
        bad.append("VmRSS grew by %d kB (peak %+d kB)" % (rss1 - rss0, rss_peak - rss0))
    f.finish()
    if bad:
        raise Failure("; ".join(bad))


def sc_httpcancel(h):
    import json
    import socket
    hfile = os.path.join(h.work, "httpcancel.http")
    f = Fixture(h, "httpcancel", args=["--http-listen", "127.0.0.1:0", "--http-address-file",
                                      hfile])
    host, port = open(hfile).read().strip().rsplit(":", 1)
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28],
                                   "datatype": "FP32", "data": [0.25] * SAMPLE}]}).encode()
    req = (b"POST /v2/models/lenet5-2/infer HTTP/1.1\r\nHost: %s\r\nContent-Type: "
           b"application/json\r\nContent-Length: %d\r\n\r\n" % (host.encode(), len(body))) + body
    f.start_train()
    st0 = f.status()
    gone = socket.create_connection((host, int(port)), timeout=60)
    stays = socket.create_connection((host, int(port)), timeout=60)
    bad = []
    try:
        gone.sendall(req)
        stays.sendall(req)
        if not wait_for(lambda: f.status().request_queue_depth == st0.request_queue_depth + 2,
                        120):
            raise Failure("the two infer requests never waited in the queue: %s" % f.status())
        t0 = time.perf_counter()
        gone.close()
        ok = wait_for(lambda: f.status().dropped_calls == st0.dropped_calls + 1, 120)
        dt = time.perf_counter() - t0
        st = f.status()
        if not ok or st.request_queue_depth != st0.request_queue_depth + 1 or \
                st.state != "training":
            # When the Train ended, and how, tells a close never seen from a Train that
            # ended early (which runs both queued calls before the close).
            bad.append("after one client closed: dropped_calls %d -> %d, queue %d -> %d, "
                       "state %s (expected +1, +1 and still training); the close came %.1f s "
                       "into the Train, the check %.1f s after it; the Train: %s, %d records" % (
                           st0.dropped_calls, st.dropped_calls, st0.request_queue_depth,
                           st.request_queue_depth, st.state, t0 - f.train_t0, dt, f.train_end,
                           f.train_records))
        else:
            print("the closed client's call left the queue %.0f ms after the close, during "
                  "the Train" % (dt * 1e3), flush=True)
        f.stop_train()
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                [l for l in data.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                [0].split(b":")[1]):
            chunk = stays.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, payload = data.partition(b"\r\n\r\n")
        out = json.loads(payload) if head.startswith(b"HTTP/1.1 200") else None
        if out is None or out["outputs"][0]["shape"] != [1, 10]:
            bad.append("the client that stayed: %r" % data[:300])
        st = f.status()
        if st.dropped_calls != st0.dropped_calls + 1 or st.request_queue_depth != 0 or \
                st.active_calls != 0:
            bad.append("at the end: dropped_calls %d (expected %d), queue %d, active %d" % (
                st.dropped_calls, st0.dropped_calls + 1, st.request_queue_depth,
                st.active_calls))
    finally:
        stays.close()
    f.finish()
    if bad:
        raise Failure("; ".join(bad))


if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, {"deadline": sc_deadline, "cancel": sc_cancel,
                                     "backpressure": sc_backpressure,
                                     "httpcancel": sc_httpcancel}))
