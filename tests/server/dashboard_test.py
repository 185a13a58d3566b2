#!/usr/bin/python3
"""distdld's live dashboard (GET /dashboard on --metrics-listen and --http-listen) in Debian's
headless Chromium, its JSON endpoint, and its auth on --http-listen.

  dashboard_test.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] SCENARIO

browser: a 2-rank LeNet-5 daemon with --metrics-listen; `chromium --headless --dump-dom`
  loads /dashboard (which loads Chart.js from the daemon and polls /dashboard.json) with
  Chromium's console on stderr (--enable-logging=stderr):
    - no console message at all from the page (the capture is first checked on a probe page
      that logs an error and throws), and the page's own error box (window errors, failed
      polls) empty; Chart.js loaded (no "missing" banner);
    - while a Train runs (cancelled with Ctrl-C once two page loads saw it), two loads a
      moment apart show more training points the second time than the first, and more
      than none;
    - after the Train and an Evaluate, the figures shown (step, epoch, last loss, state,
      queue depth) equal GetStatus, the loss bit for bit; one evaluation point; a partition
      picture per partition of GetStatus, each box naming the ranks GetStatus lists.
json: /dashboard.json's fields after 50 steps and an evaluation (train records with seq,
  step, loss, accuracy, images_per_s; since=N returns only the newer ones; the evaluation's
  count and the GetStatus step); bad requests get 400 with a reason (unknown parameter,
  non-numeric since), an unknown path 404, a POST 405; /dashboard/chart.js is Debian's file
  byte for byte, and with DDLD_CHARTJS pointing at no file it is a 404 that says what to
  install while the daemon runs and the JSON says chart_js.present false.
auth: the dashboard on --http-listen with --token-file: the page and Chart.js served without
  a token (the same bytes as on --metrics-listen), /dashboard.json 401 without a token, with
  a wrong one or a non-bearer one, 200 with the infer token (the same figures as on
  --metrics-listen), POST 405; in Chromium the page opened as /dashboard#token=T polls and
  shows the step with no console message, and without a token shows the 401 and the way to
  give one; a daemon without --metrics-listen answers /dashboard 404 naming it.
volume: 2-rank daemons of unet3d-2.json (segmentation) and unet3d-denoise-2.json (dense);
  an Evaluate of inline volumes made here (random values; random per-voxel labels or random
  targets) and a Predict of the same volumes: /dashboard.json's "inline" items hold the
  middle depth slice of the targets sent and of Predict's output (argmax per voxel; dense:
  the first channel's values, bit for bit through %.9g) and the input's slice as pixels;
  in Chromium (when installed) each sample shows three canvases captioned input, target and
  prediction under "depth 16 of 32", with no console message; non-finite dense predictions
  (inputs at FP32's limits) are JSON nulls; an Evaluate of the test split gives slices of
  32 x 32 with labels in [0, classes).

Exit status: 0 pass, 1 fail, 7 skip (distdld not built; chromium not installed for browser:
deploy/install-deps.sh installs Debian's `chromium` and `libjs-chart.js`).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from ddl_daemon import FMNIST, DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402

CHARTJS = "/usr/share/javascript/chart.js/chart.min.js"


def get(url, method="GET", timeout=10, headers=None):
    """(status, body) of a request; HTTP errors are answers too."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start(h, name, env_extra=None, args=(), spec="lenet5-2.json"):
    maddr = os.path.join(h.work, name + "-metrics-addr")
    d = h.start(2, ["--model", h.spec(spec), "--metrics-listen", "127.0.0.1:0",
                    "--metrics-address-file", maddr] + list(args), name, env=env_extra)
    for _ in range(100):
        if os.path.exists(maddr) and open(maddr).read().strip():
            break
        time.sleep(0.1)
    return d, "http://" + open(maddr).read().strip()


def chromium():
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p is not None:
            return p
    raise Skip("chromium is not installed (Debian's chromium; deploy/install-deps.sh)")


def load(h, browser, url, budget_ms=2500):
    """The page's DOM after budget_ms of (virtual) time, and its console errors/warnings."""
    prof = os.path.join(h.work, "chromium-profile")
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--user-data-dir=" + prof, "--enable-logging=stderr", "--v=0",
                        "--virtual-time-budget=%d" % budget_ms, "--dump-dom", url],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if r.returncode != 0:
        raise Failure("chromium exited %d: %s" % (r.returncode, r.stderr[-2000:]))
    # Chromium prints the page's console as [..:INFO:CONSOLE:line] "message", source: url,
    # whatever the message's level: the dashboard logs nothing, so any line is a complaint
    console = [l for l in r.stderr.splitlines() if ":CONSOLE" in l]
    return r.stdout, console, console


def text_of(dom, ident):
    m = re.search(r'id="%s"[^>]*>([^<]*)<' % re.escape(ident), dom)
    if m is None:
        raise Failure("the page has no #%s" % ident)
    return m.group(1)


def check_clean(dom, console, bad, when):
    errs = text_of(dom, "errors")
    if bad or errs.strip():
        raise Failure("%s: console errors %s; the page's error box: %r" % (when, bad, errs))
    if 'id="banner" style="display: block' in dom:
        raise Failure("%s: the page says Chart.js is missing" % when)
    if not re.search(r'<body[^>]*data-polls="[1-9]', dom):
        raise Failure("%s: the page never polled /dashboard.json" % when)
    if "<canvas" not in dom or 'id="c-loss"' not in dom:
        raise Failure("%s: no loss chart" % when)


def sc_browser(h):
    browser = chromium()
    # the console capture itself: a page's console.error and uncaught error are seen
    probe = os.path.join(h.work, "probe.html")
    with open(probe, "w") as f:
        f.write('<script>console.error("probe-error"); no_such_function();</script>')
    _, console, _ = load(h, browser, "file://" + probe, 200)
    if not any("probe-error" in l for l in console) or not any("Uncaught" in l for l in console):
        raise Failure("chromium's console is not captured (--enable-logging=stderr): %s" % console)
    d, base = start(h, "dash")
    cli = os.path.join(h.build, "bin", "distdl")
    page = base + "/dashboard"
    dom, console, bad = load(h, browser, page)
    check_clean(dom, console, bad, "idle")
    print("idle: page loaded, %d console lines, none an error" % len(console), flush=True)

    # the curves gain points while a Train runs: a Train far longer than needed, cancelled
    # (Ctrl-C, exit 130) once two page loads saw it, so neither a fast machine (the Train
    # ending first) nor a slow one (Chromium starting slowly) decides the outcome
    train = subprocess.Popen([cli, "train", "--steps", "1000000", "--progress-every", "50"],
                             env=dict(os.environ, DDL_ADDRESS=d.address),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.time() + 90
        while len(seen) < 2 and time.time() < deadline and train.poll() is None:
            dom, console, bad = load(h, browser, page, 1200)
            check_clean(dom, console, bad, "during the Train")
            n = int(text_of(dom, "train-points"))
            state = text_of(dom, "state")
            if state == "training" and n > 0 and (not seen or n > seen[-1]):
                seen.append(n)
            time.sleep(0.3)
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGINT)
        try:
            _, err = train.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            train.kill()
            _, err = train.communicate()
    if train.returncode != 130:
        raise Failure("the Train ended with %s before it was cancelled: %s" % (train.returncode, err))
    if len(seen) < 2:
        raise Failure("the curves did not gain points during the Train (seen %s)" % seen)
    print("during the Train: training points %s" % seen, flush=True)
    h.run(d, [cli, "eval"])

    st = h.raw_get_status(d)
    dom, console, bad = load(h, browser, page)
    check_clean(dom, console, bad, "after the Train")
    shown = {k: text_of(dom, k) for k in ("step", "epoch", "loss", "state", "queue",
                                          "train-points", "eval-points")}
    want = {"step": str(st.step), "epoch": str(st.epoch), "state": st.state,
            "queue": "%d / %d" % (st.request_queue_depth, st.queue_depth), "eval-points": "1"}
    bad = ["%s: shown %r, GetStatus %r" % (k, shown[k], v) for k, v in want.items()
           if shown[k] != v]
    if float(shown["loss"]) != st.last_loss:
        bad.append("loss: shown %r, GetStatus %r" % (shown["loss"], st.last_loss))
    if int(shown["train-points"]) != min(512, st.step):  # DDLD_HIST_TRAIN: the newest records
        bad.append("train points: %s (expected min(512, step %d))" % (shown["train-points"], st.step))
    svgs = re.findall(r'<svg[^>]*class="partition".*?</svg>', dom, re.S)
    if len(svgs) != len(st.partitions):
        bad.append("%d partition pictures for %d partitions" % (len(svgs), len(st.partitions)))
    for svg, p in zip(svgs, st.partitions):
        boxes = [int(x) for x in re.findall(r">rank (\d+)<", svg)]
        if p.name not in svg or boxes != list(p.ranks):
            bad.append("partition %s: boxes %s, GetStatus ranks %s" % (p.name, boxes,
                                                                      list(p.ranks)))
    # a picture per layer, its boxes naming the ranks /dashboard.json gives
    dj = json.loads(get(base + "/dashboard.json")[1])
    lsvgs = re.findall(r'<svg[^>]*class="layer".*?</svg>', dom, re.S)
    if len(lsvgs) != len(dj["model"]["layers"]):
        bad.append("%d layer pictures for %d layers" % (len(lsvgs), len(dj["model"]["layers"])))
    for svg, L in zip(lsvgs, dj["model"]["layers"]):
        if L["name"] not in svg or [int(x) for x in re.findall(r">rank (\d+)<", svg)] != \
                [b["rank"] for b in L["boxes"]]:
            bad.append("layer %s: picture %s" % (L["name"], svg[:300]))
    # the predictions of the evaluation's first samples, as /dashboard.json has them
    sm = dj["samples"]
    caps = re.findall(r'id="sample-(\d+)"[^>]*>label (\d+) / predicted (\d+)<', dom)
    want = [(str(i), str(it["label"]), str(it["predicted"])) for i, it in enumerate(sm["items"])]
    if caps != want or len(want) != 8 or dom.count('class="sample"') != 8:
        bad.append("predictions shown %s, /dashboard.json %s" % (caps, want))
    if bad:
        raise Failure("; ".join(bad))
    print("after the Train: shown %s == GetStatus; %d partition pictures; %d layer pictures; "
          "%d predictions" % (shown, len(svgs), len(lsvgs), len(caps)), flush=True)
    h.raw_close(d)
    h.run(d, [cli, "shutdown", "--no-checkpoint"])
    d.wait_exit()


def sc_json(h):
    d, base = start(h, "json")
    cli = os.path.join(h.build, "bin", "distdl")
    h.run(d, [cli, "train", "--steps", "50", "--progress-every", "50"])
    h.run(d, [cli, "eval"])
    st = h.raw_get_status(d)
    code, body = get(base + "/dashboard.json")
    if code != 200:
        raise Failure("GET /dashboard.json: %d %r" % (code, body))
    j = json.loads(body)
    bad = []
    for k in ("uptime_seconds", "world_size", "state", "chart_js", "step", "durable_step",
              "epoch", "last_loss", "images_per_s", "steps_total", "images_total",
              "checkpoints_total", "step_bytes", "queue", "ranks", "train_seq", "train",
              "eval_seq", "eval", "samples", "model"):
        if k not in j:
            bad.append("no field %s" % k)
    if bad:
        raise Failure("; ".join(bad))
    if j["step"] != st.step or j["last_loss"] != st.last_loss or j["epoch"] != st.epoch:
        bad.append("step/loss/epoch %s/%r/%s, GetStatus %s/%r/%s" % (
            j["step"], j["last_loss"], j["epoch"], st.step, st.last_loss, st.epoch))
    if j["train_seq"] != 50 or [r["step"] for r in j["train"]] != list(range(1, 51)):
        bad.append("train records: seq %s, steps %s" % (j["train_seq"],
                                                         [r["step"] for r in j["train"]]))
    if j["train"] and j["train"][-1]["loss"] != st.last_loss:
        bad.append("the last record's loss %r != GetStatus %r" % (j["train"][-1]["loss"],
                                                                 st.last_loss))
    for r in j["train"]:
        if set(r) != {"seq", "step", "loss", "accuracy", "images_per_s", "unix_s"} or \
                not 0 <= r["accuracy"] <= 1 or r["images_per_s"] <= 0:
            bad.append("bad train record %s" % r)
            break
    ev = j["eval"]
    if j["eval_seq"] != 1 or len(ev) != 1 or ev[0]["step"] != st.step or \
            ev[0]["count"] != 10000 or not 0 <= ev[0]["accuracy"] <= 1:
        bad.append("eval records %s (seq %s)" % (ev, j["eval_seq"]))
    if len(j["ranks"]) != 2 or any(r["resident_bytes"] <= 0 or r["bytes_sent"] <= 0
                                   for r in j["ranks"]):
        bad.append("ranks %s" % j["ranks"])
    if j["step_bytes"] <= 0 or j["queue"]["requests_capacity"] <= 0:
        bad.append("step_bytes %s, queue %s" % (j["step_bytes"], j["queue"]))
    # the predictions of the evaluation's first 8 test samples: the IDX file's labels and
    # pixels, and the classes `distdl predict` gives for the same images
    import gzip
    import numpy as np
    with gzip.open(os.path.join(FMNIST, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = list(np.frombuffer(f.read(), np.uint8, offset=8)[:8])
    with gzip.open(os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz")) as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:8].copy()
    xin, lout = os.path.join(h.work, "x8.npy"), os.path.join(h.work, "l8.npy")
    np.save(xin, raw)
    h.run(d, [cli, "predict", "--input", xin, "--output", lout])
    pred = list(np.load(lout).argmax(axis=1))
    sm = j["samples"]
    items = sm["items"] if sm else []
    if sm is None or (sm["eval_seq"], sm["split"], sm["channels"], sm["height"], sm["width"]) != \
            (1, "test", 1, 28, 28) or [it["label"] for it in items] != labels or \
            [it["predicted"] for it in items] != pred:
        bad.append("samples %s: labels %s (IDX %s), predicted %s (distdl predict %s)" % (
            sm and {k: v for k, v in sm.items() if k != "items"}, [it["label"] for it in items],
            labels, [it["predicted"] for it in items], pred))
    for it, img in zip(items, raw):
        v = img.reshape(-1).astype(np.float64)
        want_px = np.rint(255 * (v - v.min()) / (v.max() - v.min()))
        if len(it["pixels"]) != 784 or np.abs(np.array(it["pixels"]) - want_px).max() > 1:
            bad.append("the pixels of a sample are not its image")
            break
    # each layer's output boxes: the balanced decomposition of its global shape over its
    # partition's grid (computed here from the sizes alone), tiling the tensor exactly
    with open(h.spec("lenet5-2.json")) as f:
        spec = json.load(f)
    layers = j["model"]["layers"]
    if len(layers) != len(spec["layers"]):
        bad.append("%d layers, the spec has %d" % (len(layers), len(spec["layers"])))
    for L in layers:
        pt = spec["partitions"].get(L["partition"]) if L["partition"] else None
        if pt is None or len(pt["shape"]) != len(L["shape"]):
            bad.append("layer %s: partition %s" % (L["name"], L["partition"]))
            continue
        want_boxes = []
        for pos, r in enumerate(pt["ranks"]):
            coord, rest = [], pos
            for p in reversed(pt["shape"]):
                coord.insert(0, rest % p)
                rest //= p
            first, size = [], []
            for n, p, i in zip(L["shape"], pt["shape"], coord):
                first.append(i * (n // p) + min(i, n % p))
                size.append(n // p + (1 if i < n % p else 0))
            want_boxes.append({"rank": r, "start": first, "size": size})
        if L["boxes"] != want_boxes:
            bad.append("layer %s: boxes %s, expected %s" % (L["name"], L["boxes"], want_boxes))
    conv1 = next((L for L in layers if L["name"] == "conv1"), None)
    if conv1 is None or [b["size"][2] for b in conv1["boxes"]] != [14, 14]:
        bad.append("conv1's boxes %s: expected 14 rows of 28 on each rank" % conv1)
    parts = [(p["name"], p["ranks"], p["shape"]) for p in j["model"]["partitions"]]
    want = [(p.name, list(p.ranks), list(p.shape)) for p in st.partitions]
    if parts != want:
        bad.append("partitions %s, GetStatus %s" % (parts, want))
    if j["chart_js"] != {"path": CHARTJS, "present": os.path.exists(CHARTJS)}:
        bad.append("chart_js %s" % j["chart_js"])
    code, body = get(base + "/dashboard.json?since=45&since_eval=1")
    j2 = json.loads(body)
    if code != 200 or [r["seq"] for r in j2["train"]] != [46, 47, 48, 49, 50] or j2["eval"]:
        bad.append("since=45&since_eval=1: %d, seqs %s, eval %s" % (
            code, [r["seq"] for r in j2["train"]], j2["eval"]))
    for url, method, want_code, want_text in [
            ("/dashboard.json?since=abc", "GET", 400, "not a non-negative decimal integer"),
            ("/dashboard.json?since=-1", "GET", 400, "not a non-negative decimal integer"),
            ("/dashboard.json?step=3", "GET", 400, 'unknown parameter "step"'),
            ("/dashboard.jsonx", "GET", 404, "the dashboard at /dashboard"),
            ("/dashboard", "POST", 405, "method not allowed")]:
        code, body = get(base + url, method)
        if code != want_code or want_text not in body.decode():
            bad.append("%s %s: %d %r (expected %d, %r)" % (method, url, code, body, want_code,
                                                          want_text))
    code, body = get(base + "/dashboard")
    if code != 200 or b"/dashboard.json" not in body or b"/dashboard/chart.js" not in body:
        bad.append("GET /dashboard: %d" % code)
    if os.path.exists(CHARTJS):
        code, body = get(base + "/dashboard/chart.js")
        if code != 200 or body != open(CHARTJS, "rb").read():
            bad.append("GET /dashboard/chart.js: %d, %d bytes (not Debian's file)" %
                       (code, len(body)))
    h.raw_close(d)
    h.run(d, [cli, "shutdown", "--no-checkpoint"])
    d.wait_exit()

    # Chart.js absent: the daemon serves, the script is a 404 that says what to install
    missing = os.path.join(h.work, "no-such-chart.js")
    d, base = start(h, "nochart", {"DDLD_CHARTJS": missing})
    code, body = get(base + "/dashboard/chart.js")
    j = json.loads(get(base + "/dashboard.json")[1])
    if code != 404 or b"libjs-chart.js" not in body or missing.encode() not in body:
        bad.append("chart.js absent: %d %r" % (code, body))
    if j["chart_js"] != {"path": missing, "present": False}:
        bad.append("chart.js absent: chart_js %s" % j["chart_js"])
    h.run(d, [cli, "shutdown", "--no-checkpoint"])
    d.wait_exit()
    if bad:
        raise Failure("; ".join(bad))
    print("/dashboard.json: fields, since, bad requests and the absent Chart.js as documented",
          flush=True)


def sc_auth(h):
    browser = chromium()
    cli = os.path.join(h.build, "bin", "distdl")
    tok_i, tok_a = "infer-" + "i" * 20, "admin-" + "a" * 20
    tf = os.path.join(h.work, "tokens")
    with open(tf, "w") as f:
        f.write("infer %s\nadmin %s\n" % (tok_i, tok_a))
    os.chmod(tf, 0o600)
    admin = {"DDL_TOKEN": tok_a}
    hfile = os.path.join(h.work, "auth.http")
    d, mbase = start(h, "auth", args=["--http-listen", "127.0.0.1:0", "--http-address-file",
                                      hfile, "--token-file", tf])
    hbase = "http://" + open(hfile).read().strip()
    h.run(d, [cli, "train", "--steps", "20", "--progress-every", "20"], env_extra=admin)
    bad = []
    # the page and Chart.js hold no figure of the model: served without a token, the same
    # bytes as on --metrics-listen
    for path in ["/dashboard"] + (["/dashboard/chart.js"] if os.path.exists(CHARTJS) else []):
        code, body = get(hbase + path)
        if code != 200 or body != get(mbase + path)[1]:
            bad.append("GET %s on --http-listen without a token: %d, %d bytes" %
                       (path, code, len(body)))
    # the figures need a token of GetStatus's role (infer or above)
    for headers, want_code, want_text, what in [
            ({}, 401, "Bearer", "no token"),
            ({"Authorization": "Bearer wrong-token-xxxxxxxxxxxx"}, 401, "invalid token",
             "a wrong token"),
            ({"Authorization": "Basic abc"}, 401, "Bearer", "not a bearer token")]:
        code, body = get(hbase + "/dashboard.json", headers=headers)
        if code != want_code or want_text not in body.decode():
            bad.append("/dashboard.json with %s: %d %r" % (what, code, body))
    code, body = get(hbase + "/dashboard.json", headers={"Authorization": "Bearer " + tok_i})
    j = json.loads(body) if code == 200 else {}
    jm = json.loads(get(mbase + "/dashboard.json")[1])
    if code != 200 or [j.get(k) for k in ("step", "last_loss", "train_seq", "model")] != \
            [jm[k] for k in ("step", "last_loss", "train_seq", "model")] or j["step"] != 20:
        bad.append("/dashboard.json with the infer token: %d, step %s (--metrics-listen: %s)" %
                   (code, j.get("step"), jm["step"]))
    code, body = get(hbase + "/dashboard.json", "POST",
                     headers={"Authorization": "Bearer " + tok_i})
    if code != 405:
        bad.append("POST /dashboard.json: %d %r" % (code, body))
    # the page in a browser: with the token in the URL's fragment it polls and shows the
    # figures; without one it says which token it needs
    dom, console, errs = load(h, browser, hbase + "/dashboard#token=" + tok_i)
    check_clean(dom, console, errs, "with the token")
    if text_of(dom, "step") != "20":
        bad.append("the page with the token shows step %r" % text_of(dom, "step"))
    dom, _, _ = load(h, browser, hbase + "/dashboard")
    m = re.search(r'id="banner"[^>]*>([^<]*)<', dom)
    if m is None or "HTTP 401" not in m.group(1) or "#token=" not in m.group(1) or \
            text_of(dom, "step") == "20":
        bad.append("the page without a token: banner %r" % (m and m.group(1)))
    h.run(d, [cli, "shutdown", "--no-checkpoint"], env_extra=admin)
    d.wait_exit()
    # without --metrics-listen nothing collects the figures: the page is not served
    hfile2 = os.path.join(h.work, "plain.http")
    d = h.start(2, ["--model", h.spec("lenet5-2.json"), "--http-listen", "127.0.0.1:0",
                    "--http-address-file", hfile2], "plain")
    code, body = get("http://" + open(hfile2).read().strip() + "/dashboard")
    if code != 404 or b"--metrics-listen" not in body:
        bad.append("GET /dashboard without --metrics-listen: %d %r" % (code, body))
    h.run(d, [cli, "shutdown", "--no-checkpoint"])
    d.wait_exit()
    if bad:
        raise Failure("; ".join(bad))
    print("--http-listen: the page and Chart.js open, /dashboard.json behind the infer token "
          "(401 without), the page polling with the token from its fragment", flush=True)


def sc_volume(h):
    import numpy as np
    import ddld_rpc
    bad = []
    for spec, dense in (("unet3d-2.json", False), ("unet3d-denoise-2.json", True)):
        d, base = start(h, "vol-" + spec[:-5], spec=spec)
        c = ddld_rpc.Client(d.address)
        tr = c.tr
        st = c.status()
        shp, K = list(st.input_shape), st.num_classes
        n, D = 3, shp[1]
        mid = D // 2
        rs = np.random.RandomState(7)
        x = rs.randn(n, *shp).astype(np.float32)

        def tensor(a, dt):
            return tr.Tensor(datatype=dt, shape=list(a.shape), raw=a.tobytes())
        # inline samples made here: random volumes, random per-voxel labels (segmentation) or
        # random targets shaped like the output (dense)
        if dense:
            t = rs.rand(n, 1, *shp[1:]).astype(np.float32)
            batch = tr.Batch(x=tensor(x, "FP32"), targets=tensor(t, "FP32"))
        else:
            t = rs.randint(0, K, size=(n,) + tuple(shp[1:])).astype(np.int64)
            batch = tr.Batch(x=tensor(x, "FP32"), labels=tensor(t, "INT64"))
        ev = c.trainer("Evaluate", tr.EvaluateRequest(batch=batch), "EvaluateResponse")
        pr = c.trainer("Predict", tr.PredictRequest(x=tensor(x, "FP32")), "PredictResponse")
        out = np.frombuffer(pr.logits.raw, np.float32).reshape(list(pr.logits.shape))
        sm = json.loads(get(base + "/dashboard.json")[1])["samples"]
        kind = "dense" if dense else "segmentation"
        items = sm["items"] if sm else []
        if sm is None or (sm["split"], sm["kind"], sm["height"], sm["width"], len(items)) != \
                ("inline", kind, shp[2], shp[3], n) or ev.count != n:
            bad.append("%s inline: samples %s, %d items (expected inline %s %dx%d, %d)" % (
                spec, sm and {k: v for k, v in sm.items() if k != "items"}, len(items), kind,
                shp[2], shp[3], n))
            items = []
        for i, it in enumerate(items):
            # the middle slice of Predict's output (argmax per voxel for segmentation; the
            # first channel's values, which %.9g gives back bit for bit, for dense) and of the
            # targets sent
            if dense:
                want_p, want_t = out[i, 0, mid].ravel(), t[i, 0, mid].ravel()
                got_p = np.array(it["prediction"], np.float32)
                got_t = np.array(it["target"], np.float32)
                same = got_p.tobytes() == want_p.tobytes() and got_t.tobytes() == want_t.tobytes()
            else:
                want_p, want_t = out[i].argmax(axis=0)[mid].ravel(), t[i, mid].ravel()
                same = it["prediction"] == want_p.tolist() and it["target"] == want_t.tolist()
            v = x[i, 0, mid].ravel().astype(np.float64)
            want_px = np.rint(255 * (v - v.min()) / (v.max() - v.min()))
            if not same or it.get("slice") != {"axis": "depth", "index": mid, "of": D} or \
                    "label" in it or np.abs(np.array(it["pixels"]) - want_px).max() > 1:
                bad.append("%s inline sample %d: slice %s; prediction/target %s" % (
                    spec, i, it.get("slice"), "equal" if same else "differ from Predict's"))
                break
        # the page draws input, target and prediction side by side, captioned, with no
        # console message (when Chromium is installed; the JSON checks above stand alone)
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser is not None:
            dom, console, errs = load(h, browser, base + "/dashboard")
            check_clean(dom, console, errs, spec + " after an inline Evaluate")
            figs = re.findall(r'<div class="slice"><canvas width="(\d+)" height="(\d+)">'
                              r'</canvas><span>(\w+)</span></div>', dom)
            caps = re.findall(r'id="sample-\d+"[^>]*>([^<]*)<', dom)
            if figs != [(str(shp[3]), str(shp[2]), w) for _ in range(n)
                        for w in ("input", "target", "prediction")] or \
                    caps != ["depth %d of %d" % (mid, D)] * n:
                bad.append("%s page: slices %s, captions %s" % (spec, figs[:6], caps))

        if dense:
            # inputs at FP32's limits overflow the forward pass: the non-finite predictions
            # are nulls in valid JSON (no NaN or Infinity tokens)
            big = np.full((1,) + x.shape[1:], 3e38, np.float32)
            big[0, 0, :, ::2, :] = -3e38
            c.trainer("Evaluate", tr.EvaluateRequest(batch=tr.Batch(
                x=tensor(big, "FP32"), targets=tensor(t[:1], "FP32"))), "EvaluateResponse")

            def no_constant(name):
                raise Failure("/dashboard.json holds %s" % name)
            sm = json.loads(get(base + "/dashboard.json")[1], parse_constant=no_constant)["samples"]
            if sm["split"] != "inline" or None not in sm["items"][0]["prediction"]:
                bad.append("%s: a non-finite prediction is not null" % spec)

        # an Evaluate of the test split: the first batch's slices, labels in [0, classes)
        c.trainer("Evaluate", tr.EvaluateRequest(split="test"), "EvaluateResponse", timeout=120)
        sm = json.loads(get(base + "/dashboard.json")[1])["samples"]
        items = sm["items"] if sm else []
        hw = shp[2] * shp[3]
        ok = sm is not None and sm["split"] == "test" and len(items) == st.batch_size and all(
            len(it["pixels"]) == hw and len(it["target"]) == hw and len(it["prediction"]) == hw
            and it["slice"] == {"axis": "depth", "index": mid, "of": D} for it in items)
        if ok and not dense:
            ok = all(0 <= v < K for it in items for v in it["target"] + it["prediction"])
        if ok and dense:
            ok = all(isinstance(v, float) or isinstance(v, int)
                     for it in items for v in it["target"] + it["prediction"])
        if not ok:
            bad.append("%s test split: samples %s" % (
                spec, sm and {k: (v if k != "items" else len(v)) for k, v in sm.items()}))
        print("%s: inline slices equal Predict's and the targets sent; the test split's %d "
              "slices of %d x %d" % (spec, len(items), shp[2], shp[3]), flush=True)
        c.ch.close()
        h.run(d, [os.path.join(h.build, "bin", "distdl"), "shutdown", "--no-checkpoint"])
        d.wait_exit()
    if bad:
        raise Failure("; ".join(bad))


if __name__ == "__main__":
    sys.exit(run_scenarios(DaemonHarness, {"browser": sc_browser, "json": sc_json,
                                           "auth": sc_auth, "volume": sc_volume}))
