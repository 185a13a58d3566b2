#!/usr/bin/python3
"""KServe v2 over HTTP/REST (--http-listen; issue 17 section 5), against a 2-rank distdld
with LeNet-5, driven with python3-requests and curl, checked against gRPC (python3-grpcio):

  kserve   every endpoint (/v2, health, model metadata and readiness, versions, infer,
           statistics); predictions in JSON (flat and nested data, FP32 and UINT8, several
           samples), with binary tensors in and out, and gRPC's ModelInfer with typed
           outputs, all bit for bit equal to gRPC's raw ModelInfer; the protocol's errors
           for bad JSON, wrong shapes and data, unknown models and versions, wrong methods
           and paths, oversized bodies and bad binary framing, after which the daemon
           answers the same bits; the statistics count exactly the calls made; curl as a
           new user would (the README's line).
  auth     --token-file: no token or a wrong one is 401, a token of the infer role passes;
           bad --http-listen values and a plaintext tokenless non-loopback --http-listen
           stop every rank with exit 2 and the reason.
  tls      --tls-cert/--tls-key/--tls-client-ca: https with a client certificate from the
           CA answers, without one 401; plain http to the TLS port gets no answer.

  http_test.py --build B --source S --mpiexec M --mpi-flags F SCENARIO
"""
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostile_common import TR, Failure, Harness, Raw, f32  # noqa: E402
from ddl_daemon import Skip, run_scenarios  # noqa: E402
import grpc  # noqa: E402

try:
    import requests
except ImportError:  # pragma: no cover
    requests = None

SC = grpc.StatusCode
SAMPLE = 784
INF = "/inference.GRPCInferenceService/"
MODEL = "lenet5-2"


def bits(values):
    return f32(values)


class Fixture:
    def __init__(self, h, name, args=(), scheme="http", session=None):
        if requests is None:
            raise Skip("python3-requests is not installed (apt-get install python3-requests)")
        self.h = h
        self.tr, self.inf = h.tr, h.inf
        hfile = os.path.join(h.work, name + ".http")
        self.d = h.start(2, ["--model", h.spec(MODEL + ".json"), "--http-listen", "127.0.0.1:0",
                             "--http-address-file", hfile] + list(args), name)
        self.base = "%s://%s" % (scheme, open(hfile).read().strip())
        self.s = session or requests.Session()
        # Loopback only, and our own CA: no proxies or CA bundles from the environment.
        self.s.trust_env = False
        self.raw = Raw(self.d.address)

    def get(self, path, **kw):
        return self.s.get(self.base + path, timeout=30, **kw)

    def post(self, path, body, **kw):
        return self.s.post(self.base + path, data=body, timeout=60, **kw)

    def infer_json(self, xs, n, dt="FP32", model=MODEL, nested=False, **extra):
        data = list(xs)
        if nested:
            data = [[[data[s * SAMPLE + r * 28:s * SAMPLE + r * 28 + 28] for r in range(28)]]
                    for s in range(n)]
        req = {"inputs": [{"name": "input", "shape": [n, 1, 28, 28], "datatype": dt,
                           "data": data}]}
        req.update(extra)
        return self.post("/v2/models/%s/infer" % model, json.dumps(req),
                         headers={"Content-Type": "application/json"})

    def grpc_infer(self, xs, n, dt="FP32", typed=False):
        q = self.inf.ModelInferRequest(model_name=MODEL, id="g")
        t = q.inputs.add()
        t.name, t.datatype = "input", dt
        t.shape.extend([n, 1, 28, 28])
        q.raw_input_contents.append(f32(xs) if dt == "FP32" else bytes(xs))
        if typed:
            o = q.outputs.add()
            o.name = "logits"
            o.parameters["binary_data"].bool_param = False
        code, details, resp = self.raw.call(INF + "ModelInfer", q.SerializeToString())
        if code != SC.OK:
            raise Failure("gRPC ModelInfer: %s %s" % (code.name, details))
        r = self.inf.ModelInferResponse.FromString(resp[0])
        if typed:
            if r.raw_output_contents:
                raise Failure("typed outputs were asked for, raw_output_contents came")
            return bits(r.outputs[0].contents.fp32_contents)
        return r.raw_output_contents[0]

    def finish(self):
        self.raw.call(TR + "Shutdown", b"")
        self.raw.close()
        self.d.wait_exit()


def expect(r, status, what, contains=None):
    body = r.text
    if r.status_code != status:
        raise Failure("%s: expected HTTP %d, got %d: %s" % (what, status, r.status_code, body[:300]))
    if status >= 300:
        try:
            err = r.json()["error"]
        except (ValueError, KeyError):
            raise Failure("%s: HTTP %d without a JSON {\"error\": ...} body: %r" %
                          (what, status, body[:300]))
        if contains is not None and contains not in err:
            raise Failure("%s: the error %r does not mention %r" % (what, err, contains))
        print("  %-44s %d %s" % (what, status, err[:90]), flush=True)
    return r


def json_logits(r, n):
    j = r.json()
    out = j["outputs"][0]
    if out["name"] != "logits" or out["datatype"] != "FP32" or out["shape"] != [n, 10]:
        raise Failure("infer output header %r" % {k: out[k] for k in out if k != "data"})
    if j["model_name"] != MODEL or j["model_version"] != "1":
        raise Failure("infer answer names %s version %s" % (j["model_name"], j["model_version"]))
    return bits(out["data"])


def sc_kserve(h):
    f = Fixture(h, "kserve", ["--max-message-bytes", "262144"])
    ok_calls, rows = 0, 0
    # Metadata and health.
    meta = expect(f.get("/v2"), 200, "GET /v2").json()
    if meta["name"] != "distdld" or not {"binary_tensor_data", "statistics"} <= set(meta["extensions"]):
        raise Failure("GET /v2: %r" % meta)
    code, _, resp = f.raw.call(INF + "ServerMetadata", b"")
    g = f.inf.ServerMetadataResponse.FromString(resp[0]) if code == SC.OK else None
    if g is None or g.name != meta["name"] or list(g.extensions) != meta["extensions"]:
        raise Failure("gRPC ServerMetadata (%s) differs from GET /v2" % code.name)
    for p in ("/v2/health/live", "/v2/health/ready", "/v2/models/%s/ready" % MODEL,
              "/v2/models/%s/versions/1/ready" % MODEL):
        expect(f.get(p), 200, "GET " + p)
    mm = expect(f.get("/v2/models/" + MODEL), 200, "model metadata").json()
    if (mm["name"] != MODEL or mm["versions"] != ["1"] or
            mm["inputs"][0]["shape"] != [-1, 1, 28, 28] or mm["outputs"][0]["shape"] != [-1, 10]):
        raise Failure("model metadata %r" % mm)
    if expect(f.get("/v2/models/%s/versions/1" % MODEL), 200, "versions/1").json() != mm:
        raise Failure("versions/1 metadata differs")
    if f.s.head(f.base + "/v2/health/ready", timeout=10).status_code != 200:
        raise Failure("HEAD /v2/health/ready is not 200")

    # Predictions: JSON, nested, UINT8, several samples, binary, typed gRPC; all equal gRPC.
    rnd = random.Random(17)
    infer_path = "/v2/models/%s/infer" % MODEL
    for n in (1, 3):
        xs = [rnd.uniform(-1, 1) for _ in range(SAMPLE * n)]
        want = f.grpc_infer(xs, n)
        got = json_logits(expect(f.infer_json(xs, n), 200, "infer FP32 n=%d" % n), n)
        nest = json_logits(expect(f.infer_json(xs, n, nested=True), 200, "nested n=%d" % n), n)
        typed = f.grpc_infer(xs, n, typed=True)
        ok_calls, rows = ok_calls + 4, rows + 4 * n
        for name, b in (("JSON", got), ("nested JSON", nest), ("gRPC typed", typed)):
            if b != want:
                raise Failure("%s logits (n=%d) differ in bits from gRPC's raw ModelInfer" % (name, n))
    px = [rnd.randrange(256) for _ in range(SAMPLE * 2)]
    want8 = f.grpc_infer(px, 2, dt="UINT8")
    if json_logits(expect(f.infer_json(px, 2, dt="UINT8"), 200, "infer UINT8"), 2) != want8:
        raise Failure("UINT8 JSON logits differ from gRPC's")
    ok_calls, rows = ok_calls + 2, rows + 4
    # The numbers as clients print them, in every JSON form the daemon's fast reading of
    # "data" takes (src/format/jdata.c: 9 significant digits, exponents, -0, integers,
    # 17 digits), with white space and line breaks: the same bits as gRPC given the values.
    forms = ["%.9g", "%.17g", "%.3e", "%.6f", "%.0f", "%.9E"]
    xs = [rnd.uniform(-3, 3) * 10 ** rnd.randrange(-7, 3) for _ in range(SAMPLE)]
    xs[:4] = [0.0, -0.0, 1e-45, -2.0]
    texts = [forms[i % len(forms)] % x for i, x in enumerate(xs)]
    body = ('{"inputs" : [ {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32",\n'
            '  "data": [ ' + " ,\n ".join(texts) + ' ] } ] }')
    want = f.grpc_infer([float(t) for t in texts], 1)
    got = json_logits(expect(f.post(infer_path, body, headers={"Content-Type": "application/json"}),
                             200, "infer in every number form"), 1)
    if got != want:
        raise Failure("logits of JSON numbers in every form differ in bits from gRPC's")
    ok_calls, rows = ok_calls + 2, rows + 2
    # binary_tensor_data: the input's bytes after the JSON, the output's after the answer's.
    xs = [rnd.uniform(-1, 1) for _ in range(SAMPLE)]
    head = json.dumps({"id": "bin-1", "inputs": [{"name": "input", "shape": [1, 1, 28, 28],
                                                  "datatype": "FP32",
                                                  "parameters": {"binary_data_size": SAMPLE * 4}}],
                       "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]})
    r = expect(f.post("/v2/models/%s/infer" % MODEL, head.encode() + f32(xs),
                      headers={"Inference-Header-Content-Length": str(len(head)),
                               "Content-Type": "application/octet-stream"}), 200, "binary infer")
    hl = int(r.headers.get("Inference-Header-Content-Length", "-1"))
    if hl <= 0 or r.headers.get("Content-Type") != "application/octet-stream":
        raise Failure("binary answer headers %r" % dict(r.headers))
    j = json.loads(r.content[:hl])
    if j.get("id") != "bin-1" or j["outputs"][0]["parameters"]["binary_data_size"] != 40:
        raise Failure("binary answer header %r" % j)
    if r.content[hl:] != f.grpc_infer(xs, 1):
        raise Failure("binary logits differ from gRPC's")
    ok_calls, rows = ok_calls + 2, rows + 2
    # binary_data_output with a JSON input
    r = expect(f.infer_json(xs, 1, parameters={"binary_data_output": True}), 200,
               "binary_data_output")
    hl = int(r.headers["Inference-Header-Content-Length"])
    if r.content[hl:] != f.grpc_infer(xs, 1):
        raise Failure("binary_data_output logits differ from gRPC's")
    ok_calls, rows = ok_calls + 2, rows + 2

    # The protocol's errors; none of them changes anything.
    infer = "/v2/models/%s/infer" % MODEL
    good = {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.5] * SAMPLE}

    def with_input(**kw):
        t = dict(good)
        t.update(kw)
        return json.dumps({"inputs": [t]})
    expect(f.post(infer, '{"inputs": [{"name": "input"'), 400, "truncated JSON", "malformed JSON")
    expect(f.post(infer, "[1, 2]"), 400, "JSON array", "not a JSON object")
    expect(f.post(infer, '{"inputs": []}'), 400, "no inputs", "inputs")
    expect(f.post(infer, with_input(shape=[1, 1, 28, 27], data=[0.5] * 756)), 400, "wrong shape",
           "shape")
    expect(f.post(infer, with_input(data=[0.5] * 100)), 400, "too little data", "bytes")
    # One number more than the shape declares: the span reader, sized by the shape, declines
    # and the tree path names the count.
    expect(f.post(infer, with_input(data=[0.5] * (SAMPLE + 1))), 400, "too much data", "bytes")
    bad = [0.5] * SAMPLE
    bad[5] = "x"
    expect(f.post(infer, with_input(data=bad)), 400, "a string in data", "data[5]")
    expect(f.post(infer, with_input(datatype="UINT8", data=[300] * SAMPLE)), 400, "UINT8 300",
           "UINT8")
    expect(f.post(infer, with_input(datatype="BYTES")), 400, "BYTES as JSON", "BYTES")
    expect(f.post(infer, with_input(name=5)), 400, "input name not a string", "inputs[0]")
    expect(f.post("/v2/models/nope/infer", json.dumps({"inputs": [good]})), 404, "unknown model",
           "nope")
    expect(f.post("/v2/models/%s/versions/7/infer" % MODEL, json.dumps({"inputs": [good]})), 404,
           "unknown version", "version")
    expect(f.get("/v2/models/nope"), 404, "unknown model metadata", "nope")
    expect(f.get("/v2/models/nope/ready"), 400, "unknown model ready")
    expect(f.get(infer), 405, "GET infer", "POST")
    expect(f.post("/v2/models/" + MODEL, "{}"), 405, "POST metadata", "GET")
    expect(f.get("/v3/models"), 404, "unknown path", "/v2")
    expect(f.post(infer, json.dumps({"inputs": [good]}).encode() + b" " * 300000), 413,
           "body over --max-message-bytes", "--max-message-bytes")
    expect(f.post(infer, head.encode() + f32(xs[:10]),
                  headers={"Inference-Header-Content-Length": str(len(head))}), 400,
           "binary_data_size beyond the body", "binary_data_size")
    expect(f.post(infer, head.encode(), headers={"Inference-Header-Content-Length": "12x"}), 400,
           "bad Inference-Header-Content-Length", "Inference-Header-Content-Length")
    expect(f.post(infer, json.dumps({"inputs": [good], "outputs": [{"name": "probs"}]})), 400,
           "unknown output", "probs")
    expect(f.post(infer, json.dumps({"inputs": [good], "parameters": {"binary_data_output": 1}})),
           400, "binary_data_output not a bool", "binary_data_output")
    fails = 3  # unknown output, unknown model and wrong shape/data reach the service...
    # ...counted below from the statistics' fail count, which must not include parse errors.
    again = json_logits(expect(f.infer_json(xs, 1), 200, "infer after the errors"), 1)
    if again != f.grpc_infer(xs, 1):
        raise Failure("after the errors the logits differ")
    ok_calls, rows = ok_calls + 2, rows + 2

    # Statistics: exactly the calls made (HTTP and gRPC alike run as ModelInfer).
    st = expect(f.get("/v2/models/%s/stats" % MODEL), 200, "stats").json()["model_stats"][0]
    if expect(f.get("/v2/models/stats"), 200, "all stats").json()["model_stats"][0]["name"] != MODEL:
        raise Failure("/v2/models/stats does not list the model")
    succ = st["inference_stats"]["success"]["count"]
    ex = st["execution_count"]
    bsum = sum(b["compute_infer"]["count"] for b in st["batch_stats"])
    print("  stats: success %d fail %d rows %d commands %d (sent %d good calls, %d rows)" %
          (succ, st["inference_stats"]["fail"]["count"], st["inference_count"], ex, ok_calls,
           rows), flush=True)
    if succ != ok_calls or st["inference_count"] != rows or bsum != ex or not 0 < ex <= succ:
        raise Failure("statistics %r do not match the %d calls of %d rows made" % (st, ok_calls, rows))
    if st["inference_stats"]["fail"]["count"] < fails:
        raise Failure("statistics count %d failed calls, at least %d failed in the service" %
                      (st["inference_stats"]["fail"]["count"], fails))
    if st["last_inference"] <= 0 or st["inference_stats"]["compute_infer"]["ns"] <= 0:
        raise Failure("statistics without a last inference or compute time: %r" % st)

    # curl, as the README shows it.
    if shutil.which("curl") is not None:
        body = os.path.join(h.work, "req.json")
        with open(body, "w") as fp:
            json.dump({"inputs": [dict(good, data=xs)]}, fp)
        out = subprocess.run(["curl", "-sS", "--fail-with-body", "-H",
                              "Content-Type: application/json", "--data-binary", "@" + body,
                              f.base + infer], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise Failure("curl: exit %d: %s %s" % (out.returncode, out.stdout, out.stderr))
        if bits(json.loads(out.stdout)["outputs"][0]["data"]) != again:
            raise Failure("curl's logits differ from requests'")
        print("  curl: %s" % out.stdout[:120], flush=True)
    f.finish()


def refused(h, args, want, name):
    cmd = [h.mpiexec, "-np", "2"] + h.mpi_flags + [h.distdld, "--listen", "127.0.0.1:0"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    text = r.stdout + r.stderr
    if r.returncode != 2 or want not in text:
        raise Failure("%s: expected exit 2 naming %r, got %d:\n%s" % (name, want, r.returncode,
                                                                     text[-2000:]))
    print("  refused (exit 2): %s: %s" % (name, [l for l in text.splitlines() if want in l][0][:110]),
          flush=True)


def sc_auth(h):
    refused(h, ["--http-listen", "localhost:80"], "--http-listen: bad value", "a name")
    refused(h, ["--http-listen", "127.0.0.1:70000"], "--http-listen: bad value", "port")
    refused(h, ["--http-address-file", "/tmp/x"], "--http-address-file needs --http-listen",
            "address file alone")
    refused(h, ["--http-listen", "0.0.0.0:0"], "0.0.0.0:0", "plaintext beyond loopback")
    tok_i, tok_a = "infer-" + "i" * 20, "admin-" + "a" * 20
    tf = os.path.join(h.work, "tokens")
    with open(tf, "w") as fp:
        fp.write("infer %s\nadmin %s\n" % (tok_i, tok_a))
    os.chmod(tf, 0o600)
    f = Fixture(h, "auth", ["--token-file", tf])
    expect(f.get("/v2/health/ready"), 401, "no token", "Bearer")
    expect(f.get("/v2/health/ready", headers={"Authorization": "Bearer wrong-token-xxxxxxxxx"}),
           401, "a wrong token", "invalid token")
    expect(f.get("/v2/health/ready", headers={"Authorization": "Basic abc"}), 401,
           "not a bearer token", "Bearer")
    auth = {"Authorization": "Bearer " + tok_i}
    expect(f.get("/v2/health/ready", headers=auth), 200, "infer token: ready")
    xs = [0.25] * SAMPLE
    expect(f.infer_json(xs, 1), 401, "infer without a token")
    f.s.headers.update(auth)
    expect(f.infer_json(xs, 1), 200, "infer with the infer token")
    expect(f.get("/v2/models/%s/stats" % MODEL), 200, "stats with the infer token")
    # Shutdown over gRPC needs the admin token.
    f.raw.ch.unary_unary(TR + "Shutdown")(b"", timeout=30,
                                          metadata=(("authorization", "Bearer " + tok_a),))
    f.raw.close()
    f.d.wait_exit()


def sc_tls(h):
    # The certificates of the gRPC TLS test (a CA, a server and a client certificate, and a
    # client certificate from another CA).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client"))
    from auth_test import Harness as AuthHarness
    p = AuthHarness.make_certs(h)
    s = requests.Session()
    s.verify = p("ca.crt")
    f = Fixture(h, "tls", ["--tls-cert", p("server.crt"), "--tls-key", p("server.key"),
                           "--tls-client-ca", p("ca.crt")], scheme="https", session=s)
    expect(f.get("/v2/health/ready"), 401, "https without a client certificate",
           "client certificate")
    def session(cert):  # a connection of its own per certificate (a pool would reuse one)
        f.s = requests.Session()
        f.s.trust_env, f.s.verify, f.s.cert = False, p("ca.crt"), cert
    session((p("stranger.crt"), p("stranger.key")))
    expect(f.get("/v2/health/ready"), 401, "https with another CA's client certificate",
           "client certificate")
    session((p("client.crt"), p("client.key")))
    expect(f.get("/v2/health/ready"), 200, "https with a client certificate")
    xs = [0.125] * SAMPLE
    r = expect(f.infer_json(xs, 1), 200, "https infer")
    plain = f.base.replace("https://", "http://")
    try:
        ps = requests.Session()
        ps.trust_env = False
        r2 = ps.get(plain + "/v2/health/ready", timeout=10)
        raise Failure("plain http to the TLS port answered %d" % r2.status_code)
    except requests.exceptions.RequestException as e:
        print("  plain http to the TLS port: no answer (%s)" % type(e).__name__, flush=True)
    # gRPC over the same TLS, for the same bits.
    creds = grpc.ssl_channel_credentials(open(p("ca.crt"), "rb").read(),
                                         open(p("client.key"), "rb").read(),
                                         open(p("client.crt"), "rb").read())
    ch = grpc.secure_channel(f.d.address, creds)
    q = f.inf.ModelInferRequest(model_name=MODEL)
    t = q.inputs.add()
    t.name, t.datatype = "input", "FP32"
    t.shape.extend([1, 1, 28, 28])
    q.raw_input_contents.append(f32(xs))
    g = f.inf.ModelInferResponse.FromString(ch.unary_unary(INF + "ModelInfer")(
        q.SerializeToString(), timeout=30))
    if g.raw_output_contents[0] != json_logits(r, 1):
        raise Failure("https logits differ from gRPC-over-TLS logits")
    ch.unary_unary(TR + "Shutdown")(b"", timeout=30)
    ch.close()
    f.raw.close()
    f.d.wait_exit()


if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, {"kserve": sc_kserve, "auth": sc_auth, "tls": sc_tls}))
