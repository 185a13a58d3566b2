#!/usr/bin/python3
"""distdld --metrics-listen: the Prometheus endpoint against a real 2-rank daemon.

  metrics_test.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] SCENARIO

scrape: scrapes /metrics, parses the text format strictly (every sample belongs to a
  declared family, histograms cumulative with +Inf == _count), drives RPCs (GetStatus,
  Health, Step, a refused Step, an unknown method, Train with scrapes running meanwhile,
  Checkpoint), scrapes again and checks that each counter moved by exactly what was done:
  steps, images, requests by method and code, checkpoints; primitive bytes grew with sent
  == received summed over ranks; resident memory > 0 on every rank; loss finite and equal
  to GetStatus's. Also 404 elsewhere, 405 for POST, the content type, and that the port is
  closed once the daemon exited 0 after a Shutdown.
bad_listen: a malformed --metrics-listen, a busy port and --metrics-address-file alone
  make every rank exit nonzero together, quickly, with a message naming the problem, and
  the gRPC address is never written (nothing was served).

Exit status: 0 pass, 1 fail, 7 skip (distdld not built, or no python3-grpcio/numpy).
"""
import concurrent.futures
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from ddl_daemon import DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402

try:
    import grpc
    import numpy as np
    import ddld_rpc
except ImportError as e:  # reported as a skip by the scenarios
    grpc = None
    IMPORT_ERROR = str(e)

# ---- the text format, strictly ---------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"(,|$)')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse(text):
    """Returns {family: {"type", "help", "samples": [(name, labels dict, value)]}} or raises
    Failure on anything the Prometheus text format 0.0.4 does not allow."""
    fams, seen = {}, set()
    if not text.endswith("\n"):
        raise Failure("exposition does not end with a newline")
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d: %r" % (n, line)
        if line.startswith("# HELP "):
            parts = line.split(" ", 3)
            if len(parts) < 4:
                raise Failure("HELP without text at " + where)
            f = fams.setdefault(parts[2], {"type": None, "help": None, "samples": []})
            if f["help"] is not None or f["samples"]:
                raise Failure("HELP repeated or after samples at " + where)
            f["help"] = parts[3]
            continue
        if line.startswith("# TYPE "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[3] not in TYPES:
                raise Failure("bad TYPE at " + where)
            f = fams.setdefault(parts[2], {"type": None, "help": None, "samples": []})
            if f["type"] is not None or f["samples"]:
                raise Failure("TYPE repeated or after samples at " + where)
            f["type"] = parts[3]
            continue
        if line.startswith("#") or not line:
            raise Failure("unexpected comment or blank line at " + where)
        m = SAMPLE.match(line)
        if not m:
            raise Failure("malformed sample at " + where)
        name, labels_text, value = m.group(1), m.group(3), m.group(4)
        labels = {}
        if labels_text:
            pos = 0
            while pos < len(labels_text):
                lm = LABEL.match(labels_text, pos)
                if not lm:
                    raise Failure("malformed labels at " + where)
                if lm.group(1) in labels:
                    raise Failure("repeated label at " + where)
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        try:
            v = float(value)
        except ValueError:
            raise Failure("bad value at " + where)
        fam = name
        if name not in fams:
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[:-len(suffix)]
                if name.endswith(suffix) and fams.get(base, {}).get("type") == "histogram":
                    fam = base
        if fam not in fams or fams[fam]["type"] is None or fams[fam]["help"] is None:
            raise Failure("sample of an undeclared family at " + where)
        if fams[fam]["type"] == "histogram" and fam == name:
            raise Failure("histogram sample without _bucket/_sum/_count at " + where)
        if fam == name and fams[fam]["type"] == "counter" and not name.endswith("_total"):
            raise Failure("counter not named *_total at " + where)
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise Failure("duplicate sample at " + where)
        seen.add(key)
        if fams[fam]["type"] == "counter" and (v < 0 or math.isnan(v)):
            raise Failure("negative counter at " + where)
        if name.endswith("_bucket") and "le" not in labels:
            raise Failure("bucket without le at " + where)
        fams[fam]["samples"].append((name, labels, v))
    for fam, f in fams.items():
        if f["type"] == "histogram":
            check_histogram(fam, f["samples"])
    return fams


def check_histogram(fam, samples):
    series = {}
    for name, labels, v in samples:
        key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if name.endswith("_bucket"):
            le = labels["le"]
            s["buckets"].append((math.inf if le == "+Inf" else float(le), v))
        elif name.endswith("_sum"):
            s["sum"] = v
        else:
            s["count"] = v
    for key, s in series.items():
        b = s["buckets"]
        les = [le for le, _ in b]
        if les != sorted(les) or len(set(les)) != len(les):
            raise Failure("%s%s: le not increasing" % (fam, key))
        if not b or b[-1][0] != math.inf:
            raise Failure("%s%s: no +Inf bucket" % (fam, key))
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise Failure("%s%s: buckets not cumulative: %s" % (fam, key, b))
        if s["count"] is None or s["sum"] is None:
            raise Failure("%s%s: _sum or _count missing" % (fam, key))
        if b[-1][1] != s["count"]:
            raise Failure("%s%s: +Inf bucket %g != _count %g" % (fam, key, b[-1][1], s["count"]))
        if s["sum"] < 0:
            raise Failure("%s%s: negative _sum" % (fam, key))


def value(fams, name, **labels):
    """The value of one sample (0 when the family has no such series: counters of calls
    that never happened are left out)."""
    fam = fams.get(name)
    for suffix in ("_bucket", "_sum", "_count"):
        if fam is None and name.endswith(suffix):
            fam = fams.get(name[:-len(suffix)])
    if fam is None:
        raise Failure("family of %s missing" % name)
    for n, lab, v in fam["samples"]:
        if n == name and lab == labels:
            return v
    return 0.0


def hist_count(fams, method, code):
    return value(fams, "distdl_rpc_duration_seconds_count", method=method, code=code)


def scrape(addr, path="/metrics", method="GET"):
    req = urllib.request.Request("http://%s%s" % (addr, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def metrics(addr):
    status, ctype, body = scrape(addr)
    if status != 200:
        raise Failure("GET /metrics: HTTP %d" % status)
    if ctype != "text/plain; version=0.0.4":
        raise Failure("GET /metrics: Content-Type %r" % ctype)
    return parse(body)


# ---- scenarios -------------------------------------------------------------------------------

T = "distdl.v1.Trainer/"
PRIMS = ["broadcast", "sum_reduce", "all_sum_reduce", "repartition", "halo_exchange"]
# What LeNet-5 on 2 ranks (deploy/specs/lenet5-2.json) moves between ranks: the input
# scattered and regathered (repartition), conv halos, and the distributed linear layers'
# broadcasts and sum-reduces. It has no all-sum-reduce.
LENET2_PRIMS = ["broadcast", "sum_reduce", "repartition", "halo_exchange"]


def need_grpc():
    if grpc is None:
        raise Skip("python3-grpcio or python3-numpy missing (%s)" % IMPORT_ERROR)


def sc_scrape(h):
    need_grpc()
    d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--queue", "4",
                    "--checkpoint-dir", os.path.join(h.work, "ckpt"),
                    "--metrics-listen", "127.0.0.1:0",
                    "--metrics-address-file", os.path.join(h.work, "metrics.addr")], "metrics")
    with open(os.path.join(h.work, "metrics.addr")) as f:
        maddr = f.read().strip()
    if not re.match(r"^127\.0\.0\.1:\d+$", maddr) or maddr.endswith(":0"):
        raise Failure("metrics address file holds %r" % maddr)
    print("metrics at http://%s/metrics" % maddr, flush=True)

    m0 = metrics(maddr)
    for fam in ["distdl_steps_total", "distdl_train_loss", "distdl_images_per_second",
                "distdl_images_total", "distdl_rpc_requests_total", "distdl_rpc_duration_seconds",
                "distdl_queue_depth", "distdl_queue_capacity", "distdl_primitive_bytes_total",
                "distdl_process_resident_memory_bytes", "distdl_world_size", "distdl_durable_step",
                "distdl_checkpoints_total", "distdl_uptime_seconds", "distdl_start_time_seconds"]:
        if fam not in m0:
            raise Failure("family %s missing" % fam)
    if value(m0, "distdl_world_size") != 2 or value(m0, "distdl_model_loaded") != 1:
        raise Failure("world size / model loaded wrong")
    if value(m0, "distdl_queue_capacity", queue="requests") != 4:
        raise Failure("request queue capacity is not --queue 4")

    for path, method, want in [("/", "GET", 404), ("/metrics/x", "GET", 404),
                               ("/favicon.ico", "GET", 404), ("/metrics", "POST", 405),
                               ("/metrics", "PUT", 405), ("/metrics", "DELETE", 405)]:
        status, _, _ = scrape(maddr, path, method)
        if status != want:
            raise Failure("%s %s: HTTP %d, expected %d" % (method, path, status, want))
    print("404 elsewhere, 405 for other methods", flush=True)

    c = ddld_rpc.Client(d.address)
    tr = c.tr
    for _ in range(3):
        c.status()
    c.health()
    st = c.status()
    B, shp, K = st.batch_size, list(st.input_shape), st.num_classes
    rs = np.random.RandomState(0)
    x = rs.rand(B, *shp).astype(np.float32)
    y = rs.randint(0, K, size=B).astype(np.int64)

    def tensor(name, a, dt):
        return tr.Tensor(name=name, datatype=dt, shape=list(a.shape), raw=a.tobytes())

    batch = tr.Batch(x=tensor("x", x, "FP32"), labels=tensor("labels", y, "INT64"))
    losses = []
    for _ in range(3):
        losses.append(c.trainer("Step", tr.StepRequest(batch=batch), "StepResponse").loss)
    m1 = metrics(maddr)
    bad = tr.Batch(x=tensor("x", x[:, :, :-1], "FP32"), labels=tensor("labels", y, "INT64"))
    try:
        c.trainer("Step", tr.StepRequest(batch=bad), "StepResponse")
        raise Failure("a Step with a bad shape succeeded")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise Failure("bad Step: %s" % e.code())
    try:
        c.unary("/distdl.v1.Trainer/NoSuchMethod", tr.GetStatusRequest(), tr.GetStatusResponse)
        raise Failure("an unknown method succeeded")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise Failure("unknown method: %s" % e.code())

    # Train with scrapes running meanwhile: every scrape parses, steps never go back, and
    # the stream is undisturbed (its records in order, each where it belongs). A 40-step
    # Train left a ~0.1 s window that the scrapers, unscheduled on a loaded 2-core host,
    # could miss entirely; so the Train is long and cancelled once a scrape has seen it
    # training (60 s limit, a hang detector), and the counters below are checked against
    # the steps it actually ran (the model's step, before and after). Records every EVERY
    # steps, and at each epoch's end; a reader that falls behind the daemon's ring of 16
    # loses some (server/service.c), so they are checked for order and place, not for
    # contiguity. The 10-step Train after it is checked record by record.
    EVERY = 10
    scrapes, errors, stop = [], [], threading.Event()

    def scraper():
        while not stop.is_set():
            try:
                f = metrics(maddr)
                scrapes.append((value(f, "distdl_steps_total"), value(f, "distdl_training")))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))
            time.sleep(0.01)
    threads = [threading.Thread(target=scraper) for _ in range(2)]
    for t in threads:
        t.start()
    step1 = value(m1, "distdl_model_step")
    recs, ended = [], None
    t0 = time.monotonic()
    try:
        it = c.server_stream("/distdl.v1.Trainer/Train",
                             tr.TrainRequest(steps=10000000, progress_every=EVERY),
                             tr.TrainProgress)
        try:
            for r in it:
                recs.append(r)
                if any(training == 1 for _, training in scrapes) or time.monotonic() - t0 > 60:
                    it.cancel()
        except grpc.RpcError as e:
            ended = e.code()
        # The cancel reaches the daemon on its completion-queue thread: 60 s + 120 s are
        # hang detectors (cancel lags up to 14.6 s: tests/python/python_harness.py).
        while time.monotonic() - t0 < 180 and value(metrics(maddr), "distdl_training") != 0:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors:
        raise Failure("scrapes during Train failed: %s" % errors[:3])
    # A Train that ends by itself, for the Train OK request count and its latency: the
    # cancelled one above is counted once, CANCELLED, whether the daemon ended it or its
    # last send failed on the cancelled stream first (server/service.c, died_locked).
    # 10 steps, 11 records: fewer
    # than the ring of 16 holds, so every one must arrive, in order.
    short = list(c.server_stream("/distdl.v1.Trainer/Train", tr.TrainRequest(steps=10),
                                 tr.TrainProgress))
    if [r.done for r in short[:-1]] != list(range(1, 11)) or not short[-1].finished:
        raise Failure("short Train's stream: %s" % [r.done for r in short])
    m_idle = metrics(maddr)
    TRAIN = int(value(m_idle, "distdl_model_step") - step1)  # the steps both Trains ran
    during = [s for s, training in scrapes if training == 1]
    print("%d scrapes during Train, %d while training; cancelled (%s) after %d records, %.2f s; "
          "%d steps run by it and a 10-step Train"
          % (len(scrapes), len(during), ended and ended.name, len(recs), time.monotonic() - t0,
             TRAIN), flush=True)
    if ended != grpc.StatusCode.CANCELLED or value(m_idle, "distdl_training") != 0:
        raise Failure("the cancelled Train ended %s, training %g" %
                      (ended, value(m_idle, "distdl_training")))
    dones = [r.done for r in recs]
    if (not recs or dones != sorted(set(dones)) or recs[-1].done > TRAIN or
            any(r.step != step1 + r.done or r.total != 10000000 or r.finished or
                not (r.done % EVERY == 0 or r.epoch_end) for r in recs)):
        raise Failure("Train stream disturbed: %s" % [(r.step, r.done) for r in recs])
    if len(scrapes) < 3 or not during:
        raise Failure("only %d scrapes during Train (%d while training)" %
                      (len(scrapes), len(during)))
    if not any(value(m1, "distdl_steps_total") < s < value(m1, "distdl_steps_total") + TRAIN
               for s in during):
        print("note: no scrape saw a step count strictly inside the Train", flush=True)

    ck = c.trainer("Checkpoint", tr.CheckpointRequest(), "CheckpointResponse")
    st = c.status()
    m2 = metrics(maddr)

    # Counters moved by exactly what was done.
    steps = value(m2, "distdl_steps_total") - value(m0, "distdl_steps_total")
    if steps != 3 + TRAIN:
        raise Failure("steps_total moved by %g, expected %d" % (steps, 3 + TRAIN))
    if value(m1, "distdl_steps_total") - value(m0, "distdl_steps_total") != 3:
        raise Failure("steps_total after 3 Steps moved by %g" %
                      (value(m1, "distdl_steps_total") - value(m0, "distdl_steps_total")))
    images = value(m2, "distdl_images_total") - value(m0, "distdl_images_total")
    if images != (3 + TRAIN) * B:
        raise Failure("images_total moved by %g, expected %d" % (images, (3 + TRAIN) * B))
    if not value(m2, "distdl_images_per_second") > 0:
        raise Failure("images_per_second is not positive")
    if value(m2, "distdl_model_step") != st.step:
        raise Failure("model_step %g != GetStatus step %d" % (value(m2, "distdl_model_step"), st.step))
    if value(m2, "distdl_durable_step") != ck.step or st.durable_step != ck.step:
        raise Failure("durable_step %g != checkpoint step %d" %
                      (value(m2, "distdl_durable_step"), ck.step))
    if value(m2, "distdl_checkpoints_total") - value(m0, "distdl_checkpoints_total") != 1:
        raise Failure("checkpoints_total did not move by 1")

    # Bytes per step: 0 before the first step, then what docs/SCALING.md derives for the
    # spec (tests/engine/traffic_formula.py), in GetStatus and the gauge alike, and what the
    # primitive counters grew by per step of the Train (plus the labels' MPI_Bcast, which
    # travels outside the counters).
    if value(m0, "distdl_step_bytes") != 0:
        raise Failure("step_bytes before any step: %g" % value(m0, "distdl_step_bytes"))
    sys.path.insert(0, os.path.join(HERE, "..", "engine"))
    import traffic_formula
    spec = json.load(open(h.spec("lenet5-2.json")))
    rows = traffic_formula.table(spec)[0]
    want = sum(f.sum() + b.sum() for _, f, b in rows)
    labels = sum(f.sum() for name, f, _ in rows if name == "labels")
    grown = sum(value(m2, "distdl_primitive_bytes_total", primitive=p, **{"pass": pas},
                      direction="sent") -
                value(m1, "distdl_primitive_bytes_total", primitive=p, **{"pass": pas},
                      direction="sent")
                for p in LENET2_PRIMS for pas in ["forward", "adjoint"])
    if not (st.bytes_per_step == want == value(m2, "distdl_step_bytes") ==
            grown / TRAIN + labels):
        raise Failure("bytes per step: GetStatus %d, gauge %g, counters %g + labels %d, "
                      "formula %d" % (st.bytes_per_step, value(m2, "distdl_step_bytes"),
                                      grown / TRAIN, labels, want))
    print("bytes per step %d: GetStatus, gauge, counters and formula agree" % want, flush=True)
    loss = value(m2, "distdl_train_loss")
    if not math.isfinite(loss) or loss <= 0 or abs(loss - st.last_loss) > 1e-6 * abs(loss):
        raise Failure("train_loss %r (GetStatus says %r)" % (loss, st.last_loss))
    if value(m1, "distdl_train_loss") != np.float64(losses[-1]):
        raise Failure("train_loss after the Steps %r != last Step's loss %r" %
                      (value(m1, "distdl_train_loss"), losses[-1]))

    want = {(T + "GetStatus", "OK"): 5, ("grpc.health.v1.Health/Check", "OK"): 1,
            (T + "Step", "OK"): 3, (T + "Step", "INVALID_ARGUMENT"): 1,
            ("unknown", "UNIMPLEMENTED"): 1, (T + "Train", "OK"): 1,
            (T + "Checkpoint", "OK"): 1, (T + "Train", "CANCELLED"): 1}
    for (meth, code), n in want.items():
        got = (value(m2, "distdl_rpc_requests_total", method=meth, code=code) -
               value(m0, "distdl_rpc_requests_total", method=meth, code=code))
        hist = hist_count(m2, meth, code) - hist_count(m0, meth, code)
        if got != n or hist != n:
            raise Failure("%s %s: requests moved by %g, histogram by %g, expected %d" %
                          (meth, code, got, hist, n))
    for _, lab, v in m2["distdl_rpc_requests_total"]["samples"]:
        key = (lab["method"], lab["code"])
        moved = v - value(m0, "distdl_rpc_requests_total", **lab)
        if key not in want and moved != 0:
            raise Failure("unexpected calls counted: %s %g" % (key, v))
    step_ok = dict(method=T + "Step", code="OK")
    train_sum = value(m2, "distdl_rpc_duration_seconds_sum", method=T + "Train", code="OK")
    step_sum = value(m2, "distdl_rpc_duration_seconds_sum", **step_ok)
    if not (0 < step_sum < 600 and train_sum > step_sum / 3):
        raise Failure("latency sums implausible: 3 Steps %g s, Train of %d steps %g s" %
                      (step_sum, TRAIN, train_sum))
    print("requests and latencies counted by method and code", flush=True)

    # Primitive bytes: grew for what LeNet-5 uses, sent == received summed over ranks.
    for p in PRIMS:
        for pas in ["forward", "adjoint"]:
            s2 = value(m2, "distdl_primitive_bytes_total", primitive=p, **{"pass": pas},
                       direction="sent")
            r2 = value(m2, "distdl_primitive_bytes_total", primitive=p, **{"pass": pas},
                       direction="received")
            s1 = value(m1, "distdl_primitive_bytes_total", primitive=p, **{"pass": pas},
                       direction="sent")
            s0 = value(m0, "distdl_primitive_bytes_total", primitive=p, **{"pass": pas},
                       direction="sent")
            if s2 != r2:
                raise Failure("%s %s: %g bytes sent but %g received over all ranks" %
                              (p, pas, s2, r2))
            if p in LENET2_PRIMS and not (s2 > s1 > s0):
                raise Failure("%s %s bytes did not grow with the steps: %g, %g, %g" %
                              (p, pas, s0, s1, s2))
            print("  %-15s %-8s %12d bytes (after 3 Steps: %d)" % (p, pas, s2, s1), flush=True)
    # Every step runs the same plans on the same batch size, so the Train's TRAIN steps
    # move exactly TRAIN/3 of what the 3 Steps moved.
    for p in LENET2_PRIMS:
        per_step = [(value(mm, "distdl_primitive_bytes_total", primitive=p, **{"pass": "forward"},
                           direction="sent")) for mm in (m0, m1, m2)]
        if (per_step[2] - per_step[1]) * 3 != (per_step[1] - per_step[0]) * TRAIN:
            raise Failure("%s: bytes per step differ between Step and Train: %s" % (p, per_step))
    for r in range(2):
        rss = value(m2, "distdl_process_resident_memory_bytes", rank=str(r))
        if not rss > 1 << 20:
            raise Failure("rank %d resident memory %g" % (r, rss))
    n = value(m2, "distdl_metrics_collections_total")
    cost = value(m2, "distdl_metrics_collect_seconds_total")
    if n < 6:  # CreateModel at start, 3 Steps, Train, Checkpoint: one gather each
        raise Failure("only %g collections" % n)
    print("counter gather: %d collections, %.1f us each on rank 0" % (n, cost / n * 1e6),
          flush=True)

    c.trainer("Shutdown", tr.ShutdownRequest(), "ShutdownResponse")
    # Done with it: close our channel (the daemon's grace is for calls, not idle connections:
    # docs/SERVER.md, "The gRPC teardown").
    c.ch.close()
    d.wait_exit()
    try:
        scrape(maddr)
        raise Failure("metrics still served after the daemon exited")
    except (urllib.error.URLError, ConnectionError):
        pass
    print("port closed after exit", flush=True)


def expect_start_failure(h, args, name, why, timeout=60):
    """Starts the daemon with args; it must exit 2 within timeout without ever writing its
    gRPC address, and its log must contain `why`. Safe to run beside itself (its own
    directory, its report printed in one piece)."""
    work = os.path.join(h.work, name)
    os.makedirs(work)
    addr_file = os.path.join(work, "addr")
    cmd = [h.mpiexec, "-np", "2"] + h.mpi_flags + [
        h.distdld, "--listen", "127.0.0.1:0", "--address-file", addr_file] + args
    report = ["$ " + " ".join(cmd) + "\n"]
    try:
        return start_failure(cmd, addr_file, name, why, timeout, report)
    finally:
        print("".join(report), end="", flush=True)


def start_failure(cmd, addr_file, name, why, timeout, report):
    t0 = time.time()
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure("%s: the daemon did not exit within %d s" % (name, timeout))
    report.append(r.stdout)
    if r.returncode != 2:
        raise Failure("%s: exit %d, expected 2" % (name, r.returncode))
    if why not in r.stdout:
        raise Failure("%s: no %r in the output" % (name, why))
    if os.path.exists(addr_file):
        raise Failure("%s: the gRPC address was written (it served)" % name)
    # Every rank exits 2 by itself: none may be killed by a signal (mpirun would say so).
    if re.search(r"killed|signal", r.stdout, re.I):
        raise Failure("%s: a rank was killed instead of exiting" % name)
    report.append("%s: exit %d after %.1f s\n" % (name, r.returncode, time.time() - t0))
    return r


def sc_bad_listen(h):
    cases = [(["--metrics-listen", bad], "garbage%d" % i, "--metrics-listen: bad value")
             for i, bad in enumerate(["nonsense", "127.0.0.1", "127.0.0.1:99999", "localhost:9090",
                                      "127.0.0.1:-1", "1.2.3:80", "[::1]9090", "127.0.0.1:80x"])]
    cases.append((["--metrics-address-file", os.path.join(h.work, "m")], "address_file_alone",
                  "--metrics-address-file needs --metrics-listen"))
    # Four at a time: each is mostly mpirun idling after the ranks' exits.
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        runs = [ex.submit(expect_start_failure, h, *c) for c in cases]
    for r in runs:
        r.result()
    # A busy port: held by a listening socket of ours while the daemon starts. Rank 0 finds
    # out when it binds (after creating the model), and releases the others with its code.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        r = expect_start_failure(h, ["--model", h.spec("lenet5-2.json"), "--metrics-listen",
                                     "127.0.0.1:%d" % port], "busy", "Address already in use")
        if "exit 2" not in r.stdout:
            raise Failure("busy: rank 0 did not log exit 2")
    finally:
        s.close()


SCENARIOS = {"scrape": sc_scrape, "bad_listen": sc_bad_listen}

if __name__ == "__main__":
    sys.exit(run_scenarios(DaemonHarness, SCENARIOS))
