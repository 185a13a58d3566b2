#!/usr/bin/python3
"""Authentication and TLS of a real distdld, through libdistdl-client (auth_client) and
Python grpcio.

Certificates are made with the openssl CLI in a temporary directory: a CA, a server
certificate (SAN localhost and 127.0.0.1), a client certificate, an untrusted CA with its
own client certificate, and a key that matches nothing.

  auth_test.py --build BUILD --source SRC --mpiexec MPIEXEC [--mpi-flags "..."] SCENARIO

Scenarios: tls, mtls, tokens, tls_tokens, listen, badfiles, lifecycle_secure. Exit 0 pass, 1 fail, 7 skip.
"""
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from ddl_daemon import DaemonHarness, Failure, Skip, run_scenarios  # noqa: E402

TOKENS = {
    "admin": "adm-7f3c1e9a5b2d4c6e8a0b1c2d3e4f5a6b",
    "train": "trn-0a1b2c3d4e5f60718293a4b5c6d7e8f9",
    "infer": "inf-99887766554433221100ffeeddccbbaa",
}
WRONG = "zzz-00000000000000000000000000000000"


def sh(*cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise Failure("%s failed:\n%s" % (" ".join(cmd), r.stdout))


class Harness(DaemonHarness):
    def __init__(self, a):
        super().__init__(a, prefix="ddl-auth-it-")
        self.auth_client = os.path.join(a.build, "tests", "auth_client")
        self.certs = None

    def make_certs(self):
        if shutil.which("openssl") is None:
            raise Skip("the openssl CLI is not installed (apt-get install openssl)")
        d = os.path.join(self.work, "certs")
        os.makedirs(d)
        p = lambda n: os.path.join(d, n)  # noqa: E731
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for ca in ("ca", "other-ca"):
            sh("openssl", "req", "-x509", *ec, "-keyout", p(ca + ".key"), "-out", p(ca + ".crt"),
               "-days", "2", "-subj", "/CN=distdl test %s" % ca,
               "-addext", "basicConstraints=critical,CA:TRUE",
               "-addext", "keyUsage=critical,keyCertSign,cRLSign")

        def leaf(name, ca, ext):
            sh("openssl", "req", "-new", *ec, "-keyout", p(name + ".key"), "-out", p(name + ".csr"),
               "-subj", "/CN=" + name)
            with open(p(name + ".ext"), "w") as f:
                f.write(ext)
            sh("openssl", "x509", "-req", "-in", p(name + ".csr"), "-CA", p(ca + ".crt"),
               "-CAkey", p(ca + ".key"), "-CAcreateserial", "-days", "2",
               "-out", p(name + ".crt"), "-extfile", p(name + ".ext"))
            os.chmod(p(name + ".key"), 0o600)

        leaf("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
             "extendedKeyUsage=serverAuth\n")
        leaf("client", "ca", "extendedKeyUsage=clientAuth\n")
        leaf("stranger", "other-ca", "extendedKeyUsage=clientAuth\n")
        sh("openssl", "genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
           "-out", p("lone.key"))
        os.chmod(p("lone.key"), 0o600)
        with open(p("garbage.pem"), "w") as f:
            f.write("this is not PEM\n")
        os.chmod(p("garbage.pem"), 0o600)
        self.certs = d
        return p

    def token_file(self, name, text, mode=0o600):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def tokens(self):
        return self.token_file("tokens", "# distdld tokens: ROLE TOKEN\n" + "".join(
            "%s %s   # %s\n" % (r, t, r) for r, t in TOKENS.items()) + "\n")

    def expect(self, d, *calls, ca=None, cert=None, key=None, server_name=None, token=None,
               address=None):
        env = {"GRPC_VERBOSITY": "NONE"}
        for k, v in (("DDL_TLS_CA", ca), ("DDL_TLS_CERT", cert), ("DDL_TLS_KEY", key),
                     ("DDL_TLS_SERVER_NAME", server_name), ("DDL_TOKEN", token),
                     ("DDL_ADDRESS", address)):
            if v is not None:
                env[k] = v
        saved = {k: os.environ.pop(k) for k in list(os.environ)
                 if k.startswith("DDL_TLS") or k == "DDL_TOKEN"}
        try:
            self.run(d, [self.auth_client] + list(calls), timeout=120, env_extra=env)
        finally:
            os.environ.update(saved)

    def bench(self, d, n=20, **kw):
        env = {"GRPC_VERBOSITY": "NONE"}
        for k, v in (("DDL_TLS_CA", kw.get("ca")), ("DDL_TLS_CERT", kw.get("cert")),
                     ("DDL_TLS_KEY", kw.get("key")), ("DDL_TOKEN", kw.get("token"))):
            if v is not None:
                env[k] = v
        self.run(d, [self.auth_client, "--bench", str(n)], timeout=120, env_extra=env)

    def refused(self, args, want, np=2, listen="127.0.0.1:0", code=2):
        """distdld must exit on every rank with `code`, before serving, saying `want`. Safe
        to run beside itself (refused_all): its own address file, its report printed in one
        piece."""
        addr = os.path.join(tempfile.mkdtemp(prefix="refused-", dir=self.work), "addr")
        cmd = [self.mpiexec, "-np", str(np)] + self.mpi_flags + [
            self.distdld, "--listen", listen, "--address-file", addr] + args
        report = ["$ " + " ".join(cmd)]
        try:
            return self._refused(cmd, addr, want, np, code, report)
        finally:
            print("\n".join(report), flush=True)

    def _refused(self, cmd, addr, want, np, code, report):
        t0 = time.time()
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=60)
        except subprocess.TimeoutExpired:
            raise Failure("distdld did not exit within 60 s (hang)")
        out = r.stdout
        lines = [ln for ln in out.splitlines() if ln.startswith("distdld")]
        report.append("  -> rc %d in %.1f s: %s" % (r.returncode, time.time() - t0,
                                                    " | ".join(lines)[:400]))
        if want not in out:
            report.append(out)
            raise Failure("expected %r in the output" % want)
        if r.returncode != code:
            report.append(out)
            raise Failure("mpirun exited with %d, expected %d" % (r.returncode, code))
        if os.path.exists(addr):
            raise Failure("an address file was written: the daemon served")
        # Every rank exited with the same code (mpirun reports only the first nonzero one,
        # so the workers say it themselves once MPI is up; a refusal from the command line
        # alone happens on every rank before MPI_Init and rank 0 reports it once).
        if "exit %d" % code in out:
            for r in range(1, np):
                if "distdld[%d]: exit %d" % (r, code) not in out:
                    report.append(out)
                    raise Failure("rank %d did not exit with %d" % (r, code))
        if "signal" in out.lower():
            report.append(out)
            raise Failure("a rank was killed instead of exiting")
        return out

    def refused_all(self, cases, jobs=4):
        """refused(args, want) for every (args, want), `jobs` at a time: each is mostly mpirun
        idling after the ranks' nonzero exits. Raises the first failure in the given order."""
        with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
            results = [ex.submit(self.refused, args, want) for args, want in cases]
        for r in results:
            r.result()


def spec(h):
    return ["--model", h.spec("lenet5-2.json")]


# ---- scenarios --------------------------------------------------------------------------------


def sc_tls(h):
    p = h.make_certs()
    d = h.start(2, spec(h) + ["--tls-cert", p("server.crt"), "--tls-key", p("server.key")], "tls")
    # A plaintext client, a client trusting another CA, and a client expecting another name
    # all fail the handshake (UNAVAILABLE before any call reaches the daemon).
    h.expect(d, "health=UNAVAILABLE", "status=UNAVAILABLE")
    h.expect(d, "health=UNAVAILABLE", ca=p("other-ca.crt"))
    h.expect(d, "health=UNAVAILABLE", ca=p("ca.crt"), server_name="not-this-host.example")
    # The right CA: by IP (SAN 127.0.0.1) and by name (SAN localhost).
    h.expect(d, "health=OK", "status=OK", "predict=OK", "step=OK", ca=p("ca.crt"))
    port = d.address.rsplit(":", 1)[1]
    h.expect(d, "health=OK", "infer=OK", ca=p("ca.crt"), address="localhost:" + port)
    # Python grpcio, as another client stack.
    import grpc
    from ddld_rpc import load_protos
    _, he, _ = load_protos()
    with open(p("ca.crt"), "rb") as f:
        root = f.read()
    ch = grpc.secure_channel(d.address, grpc.ssl_channel_credentials(root_certificates=root))
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=he.HealthCheckResponse.FromString)
    r = check(he.HealthCheckRequest(), timeout=20)
    if r.status != he.HealthCheckResponse.SERVING:
        raise Failure("grpcio over TLS: health %s" % r.status)
    ch.close()
    ch = grpc.insecure_channel(d.address)
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=he.HealthCheckResponse.FromString)
    try:
        check(he.HealthCheckRequest(), timeout=20)
        raise Failure("grpcio plaintext against TLS succeeded")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            raise Failure("grpcio plaintext against TLS: %s, expected UNAVAILABLE" % e.code())
        print("ok   grpcio plaintext -> UNAVAILABLE", flush=True)
    ch.close()
    h.bench(d, ca=p("ca.crt"))
    h.expect(d, "shutdown=OK", ca=p("ca.crt"))
    d.wait_exit()
    # The same daemon in plaintext, for the latency figure's reference.
    d = h.start(2, [], "plain")
    h.bench(d)
    h.expect(d, "shutdown=OK")
    d.wait_exit()


def sc_mtls(h):
    p = h.make_certs()
    d = h.start(2, spec(h) + ["--tls-cert", p("server.crt"), "--tls-key", p("server.key"),
                              "--tls-client-ca", p("ca.crt")], "mtls")
    h.expect(d, "health=UNAVAILABLE")                                   # plaintext
    h.expect(d, "health=UNAVAILABLE", "status=UNAVAILABLE", ca=p("ca.crt"))  # no client cert
    h.expect(d, "health=UNAVAILABLE", ca=p("ca.crt"), cert=p("stranger.crt"),
             key=p("stranger.key"))                                     # client cert, other CA
    h.expect(d, "health=UNAVAILABLE", ca=p("other-ca.crt"), cert=p("client.crt"),
             key=p("client.key"))                                       # server not trusted
    h.expect(d, "health=OK", "status=OK", "step=OK", "pull=OK", ca=p("ca.crt"),
             cert=p("client.crt"), key=p("client.key"))
    import grpc
    from ddld_rpc import load_protos
    _, he, _ = load_protos()
    rd = lambda n: open(p(n), "rb").read()  # noqa: E731
    for name, creds, ok in (
            ("grpcio with client cert", grpc.ssl_channel_credentials(
                rd("ca.crt"), rd("client.key"), rd("client.crt")), True),
            ("grpcio without client cert", grpc.ssl_channel_credentials(rd("ca.crt")), False)):
        ch = grpc.secure_channel(d.address, creds)
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=he.HealthCheckResponse.FromString)
        try:
            check(he.HealthCheckRequest(), timeout=20)
            if not ok:
                raise Failure("%s succeeded" % name)
        except grpc.RpcError as e:
            if ok or e.code() != grpc.StatusCode.UNAVAILABLE:
                raise Failure("%s: %s" % (name, e.code()))
        print("ok   %s -> %s" % (name, "OK" if ok else "UNAVAILABLE"), flush=True)
        ch.close()
    h.bench(d, ca=p("ca.crt"), cert=p("client.crt"), key=p("client.key"))
    h.expect(d, "shutdown=OK", ca=p("ca.crt"), cert=p("client.crt"), key=p("client.key"))
    d.wait_exit()


def token_checks(h, d, **tls):
    T = TOKENS
    # Health needs no token; everything else needs a valid one.
    h.expect(d, "health=OK", "status=UNAUTHENTICATED", "live=UNAUTHENTICATED",
             "predict=UNAUTHENTICATED", "step=UNAUTHENTICATED", "push=UNAUTHENTICATED",
             "submit=UNAUTHENTICATED", "shutdown=UNAUTHENTICATED", **tls)
    for bad in (WRONG, T["admin"][:-1], T["admin"] + "x", T["infer"].upper()):
        h.expect(d, "health=OK", "status=UNAUTHENTICATED", "step=UNAUTHENTICATED",
                 "shutdown=UNAUTHENTICATED", token=bad, **tls)
    h.expect(d, "health=OK", "live=OK", "status=OK", "predict=OK", "infer=OK",
             "step=PERMISSION_DENIED", "push=PERMISSION_DENIED", "submit=PERMISSION_DENIED",
             "evaluate=PERMISSION_DENIED", "pull=PERMISSION_DENIED", "create=PERMISSION_DENIED",
             "shutdown=PERMISSION_DENIED", token=T["infer"], **tls)
    h.expect(d, "status=OK", "predict=OK", "step=OK", "submit=OK", "step=OK", "evaluate=OK",
             "pull=OK", "push=PERMISSION_DENIED", "create=PERMISSION_DENIED",
             "shutdown=PERMISSION_DENIED", token=T["train"], **tls)
    h.expect(d, "status=OK", "step=OK", "pushback=OK", "create=INVALID_ARGUMENT", token=T["admin"],
             **tls)


def grpcio_headers(d):
    """Header forms libdistdl-client never sends, through grpcio on a plaintext channel."""
    import grpc
    from ddld_rpc import load_protos
    tr, _, _ = load_protos()
    ch = grpc.insecure_channel(d.address)
    status = ch.unary_unary("/distdl.v1.Trainer/GetStatus",
                            request_serializer=lambda m: m.SerializeToString(),
                            response_deserializer=tr.GetStatusResponse.FromString)
    cases = [
        ("Basic scheme", [("authorization", "Basic " + TOKENS["admin"])], "UNAUTHENTICATED"),
        ("no scheme", [("authorization", TOKENS["admin"])], "UNAUTHENTICATED"),
        ("empty bearer", [("authorization", "Bearer ")], "UNAUTHENTICATED"),
        ("two headers", [("authorization", "Bearer " + TOKENS["admin"]),
                         ("authorization", "Bearer " + TOKENS["admin"])], "UNAUTHENTICATED"),
        ("lower-case scheme", [("authorization", "bearer " + TOKENS["infer"])], "OK"),
        ("other header", [("x-token", TOKENS["admin"])], "UNAUTHENTICATED"),
    ]
    for name, md, want in cases:
        try:
            status(tr.GetStatusRequest(), metadata=md, timeout=20)
            got = "OK"
        except grpc.RpcError as e:
            got = e.code().name
            if TOKENS["admin"] in (e.details() or "") or TOKENS["infer"] in (e.details() or ""):
                raise Failure("%s: the reply echoes the token" % name)
        print("%s grpcio %-18s -> %s (expected %s)" % ("ok  " if got == want else "FAIL", name,
                                                         got, want), flush=True)
        if got != want:
            raise Failure("grpcio %s: %s, expected %s" % (name, got, want))
    ch.close()


def check_log(d):
    with open(d.log_path) as f:
        log = f.read()
    if "auth: " not in log:
        raise Failure("DDLD_VERBOSE=1 logged no auth decisions (the token grep would prove nothing)")
    for role, tok in list(TOKENS.items()) + [("wrong", WRONG), ("new admin", NEW_ADMIN)]:
        for piece in (tok, tok[4:20]):
            if piece in log:
                raise Failure("the %s token appears in the daemon log" % role)
    print("ok   no token (nor a 16-character piece of one) in the verbose daemon log "
          "(%d auth lines)" % log.count("auth: "), flush=True)


def with_verbose(fn):
    os.environ["DDLD_VERBOSE"] = "1"
    try:
        return fn()
    finally:
        del os.environ["DDLD_VERBOSE"]


def client_token_files(h, d):
    """ddl_client_read_token_file: the token alone, or a line of the daemon's file."""
    T = TOKENS
    ok = [("bare", "%s\n" % T["infer"], "step=PERMISSION_DENIED"),
          ("commented", "# my token\n\n   %s   # infer\n" % T["infer"], "step=PERMISSION_DENIED"),
          ("role line", "train %s\n" % T["train"], "step=OK")]
    for name, text, call in ok:
        path = h.token_file("client-" + name.replace(" ", "-"), text)
        h.run(d, [h.auth_client, "status=OK", call], timeout=60,
              env_extra={"DDL_TOKEN_FILE": path, "GRPC_VERBOSITY": "NONE"})
    bad = [("world", "%s\n" % T["admin"], 0o644, "accessible to other users (mode 0644)"),
           ("fields", "admin %s x\n" % T["admin"], 0o600, "found 3 fields"),
           ("empty", "# none\n", 0o600, "no token in it")]
    for name, text, mode, want in bad:
        path = h.token_file("client-bad-" + name, text, mode)
        out = h.run(d, [h.auth_client, "status=OK"], timeout=60, capture=True, check=False,
                    env_extra={"DDL_TOKEN_FILE": path})
        if h.last_returncode != 3 or want not in out:
            raise Failure("client token file %s: exit %d, output %r (wanted %r)" %
                          (name, h.last_returncode, out, want))
        if T["admin"] in out:
            raise Failure("the client's error message carries the token")


NEW_ADMIN = "new-5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"


def wait_log(d, text, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        with open(d.log_path) as f:
            if text in f.read():
                return
        time.sleep(0.05)
    d.dump()
    raise Failure("no %r in the daemon log after %d s" % (text, timeout))


def replace_file(path, text, mode=0o600):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def reload_checks(h, d, tf):
    """SIGHUP to rank 0 reloads --token-file; a bad file keeps the tokens in force."""
    with open(d.log_path) as f:
        m = re.search(r"listening on \S+ \(pid (\d+)\)", f.read())
    pid = int(m.group(1))
    replace_file(tf, "admin %s\ninfer %s\n" % (NEW_ADMIN, TOKENS["infer"]))
    os.kill(pid, signal.SIGHUP)
    wait_log(d, "SIGHUP: --token-file %s reloaded: 2 tokens" % tf)
    h.expect(d, "status=UNAUTHENTICATED", "step=UNAUTHENTICATED", token=TOKENS["train"])
    h.expect(d, "status=UNAUTHENTICATED", token=TOKENS["admin"])
    h.expect(d, "status=OK", "step=PERMISSION_DENIED", token=TOKENS["infer"])
    h.expect(d, "status=OK", "step=OK", token=NEW_ADMIN)
    replace_file(tf, "admin %s\nroot %s\n" % (TOKENS["admin"], TOKENS["train"]))
    os.kill(pid, signal.SIGHUP)
    wait_log(d, "line 2: unknown role \"root\" (admin, train or infer); the 2 tokens loaded "
                "before stay in force")
    replace_file(tf, "admin %s\n" % TOKENS["admin"], 0o644)
    os.kill(pid, signal.SIGHUP)
    wait_log(d, "accessible to other users (mode 0644); it holds secrets: chmod 600 it; the 2 "
                "tokens loaded before stay in force")
    h.expect(d, "status=OK", "step=OK", token=NEW_ADMIN)
    h.expect(d, "status=UNAUTHENTICATED", token=TOKENS["admin"])


def sc_tokens(h):
    tf = h.tokens()
    d = with_verbose(lambda: h.start(2, spec(h) + ["--token-file", tf], "tokens"))
    token_checks(h, d)
    client_token_files(h, d)
    grpcio_headers(d)
    h.bench(d, token=TOKENS["infer"])
    reload_checks(h, d, tf)
    h.expect(d, "shutdown=OK", token=NEW_ADMIN)
    d.wait_exit()
    check_log(d)


def tools_over_tls(h, d, p):
    """The distdl CLI and the Python binding take the same TLS and token options as the C
    library: each reaches a TLS daemon with a token file / token, and the roles hold."""
    cli = os.path.join(h.build, "bin", "distdl")
    base = [cli, "--address", d.address, "--tls-ca", p("ca.crt"), "--json"]
    files = {r: h.token_file("cli-%s.token" % r, "%s %s\n" % (r, t)) for r, t in TOKENS.items()}

    def run(role, args, want):
        r = subprocess.run(base + ["--token-file", files[role]] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        print("$ distdl (%s token) %s -> exit %d" % (role, " ".join(args), r.returncode), flush=True)
        if r.returncode != want:
            raise Failure("distdl %s with a %s token: exit %d, expected %d\n%s" %
                          (" ".join(args), role, r.returncode, want, r.stdout))
        if any(t in r.stdout for t in TOKENS.values()):
            raise Failure("distdl printed a token")
        return r.stdout

    run("infer", ["status"], 0)
    out = run("infer", ["train", "--steps", "1"], 4)
    if "PERMISSION_DENIED" not in out:
        raise Failure("infer token Train: expected PERMISSION_DENIED, got %s" % out)
    run("train", ["train", "--steps", "2"], 0)
    r = subprocess.run(base + ["status"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120, env=dict(os.environ, DDL_TOKEN=WRONG))
    if r.returncode != 4 or "UNAUTHENTICATED" not in r.stdout:
        raise Failure("distdl with a wrong $DDL_TOKEN: exit %d\n%s" % (r.returncode, r.stdout))
    # The Python binding, in its own interpreter (a sanitizer build preloads the ASan
    # runtime there: DDL_ASAN_PRELOAD).
    env = dict(os.environ, DDL_CLIENT_LIB=os.path.join(h.build, "lib", "libdistdl-client.so"),
               PYTHONPATH=os.path.join(h.source, "client", "python"))
    if os.environ.get("DDL_ASAN_PRELOAD"):
        env.update(LD_PRELOAD=os.environ["DDL_ASAN_PRELOAD"], ASAN_OPTIONS="detect_leaks=0")
    script = """
import sys
import distdl_client
addr, ca, infer, wrong = sys.argv[1:5]
with distdl_client.Client(addr, tls_ca=ca, token=infer) as c:
    st = c.status()
    try:
        c.checkpoint()
        sys.exit("Python: an infer token could checkpoint")
    except distdl_client.DistdlError as e:
        if e.code_name != "PERMISSION_DENIED":
            sys.exit("Python: infer token Checkpoint gave %s" % e.code_name)
with distdl_client.Client(addr, tls_ca=ca, token=wrong) as c:
    try:
        c.status()
        sys.exit("Python: a wrong token was admitted")
    except distdl_client.DistdlError as e:
        if e.code_name != "UNAUTHENTICATED":
            sys.exit("Python: wrong token gave %s" % e.code_name)
print(st.step)
"""
    r = subprocess.run(["/usr/bin/python3", "-c", script, d.address, p("ca.crt"),
                        TOKENS["infer"], WRONG], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise Failure("Python binding over TLS with tokens:\n%s" % r.stdout)
    step = int(r.stdout.split()[-1])
    print("CLI and Python over TLS with tokens: roles enforced (status at step %d)" % step,
          flush=True)


def sc_tls_tokens(h):
    # TLS and tokens together, on all interfaces (allowed: neither is missing).
    p = h.make_certs()
    tf = h.tokens()
    d = with_verbose(lambda: h.start(2, spec(h) + [
        "--token-file", tf, "--tls-cert", p("server.crt"), "--tls-key", p("server.key")],
        "tls_tokens", listen="0.0.0.0:0"))
    port = d.address.rsplit(":", 1)[1]
    d.address = "127.0.0.1:" + port
    h.expect(d, "health=UNAVAILABLE", token=TOKENS["admin"])  # plaintext with a valid token
    token_checks(h, d, ca=p("ca.crt"))
    tools_over_tls(h, d, p)
    h.expect(d, "shutdown=OK", token=TOKENS["admin"], ca=p("ca.crt"))
    d.wait_exit()
    check_log(d)


def sc_listen(h):
    for listen in ("0.0.0.0:0", "[::]:0", "10.1.2.3:0", "localhost.example.com:0"):
        h.refused([], "refusing to listen on %s without TLS or tokens" % listen, listen=listen)
    h.refused([], "refusing to listen on 0.0.0.0:0", np=4, listen="0.0.0.0:0")
    # --insecure: told to, it serves on all interfaces.
    d = h.start(2, ["--insecure"], "insecure", listen="0.0.0.0:0")
    d.address = "127.0.0.1:" + d.address.rsplit(":", 1)[1]
    h.expect(d, "health=OK", "status=OK")
    h.expect(d, "shutdown=OK")
    d.wait_exit()
    # Loopback forms need nothing.
    d = h.start(2, [], "loopback6", listen="[::1]:0")
    h.expect(d, "health=OK", "status=OK", "shutdown=OK", address="[::1]:" +
             d.address.rsplit(":", 1)[1])
    d.wait_exit()


def sc_badfiles(h):
    p = h.make_certs()
    good = h.tokens()
    missing = os.path.join(h.work, "no-such-file")
    T = TOKENS
    tls = ["--tls-cert", p("server.crt"), "--tls-key", p("server.key")]
    cases = [
        (["--token-file", missing], "--token-file %s: cannot open: No such file" % missing),
        (["--token-file", h.token_file("t644", "admin %s\n" % T["admin"], 0o644)],
         "accessible to other users (mode 0644)"),
        (["--token-file", h.token_file("t3", "admin %s extra\n" % T["admin"])],
         "line 1: expected \"ROLE TOKEN\", found 3 fields"),
        (["--token-file", h.token_file("trole", "# c\n\nroot %s\n" % T["admin"])],
         "line 3: unknown role \"root\""),
        (["--token-file", h.token_file("tshort", "infer short\n")],
         "line 1: the token has 5 characters"),
        (["--token-file", h.token_file("tempty", "# nothing here\n\n")], "no tokens"),
        (["--token-file", h.token_file("tdup", "admin %s\ninfer %s\n" % (T["admin"], T["admin"]))],
         "line 2: the same token appears twice"),
        (["--token-file", h.token_file("tbin", "admin %s\xe9\n" % T["admin"])],
         "outside visible ASCII"),
        (["--token-file", h.certs], "not a regular file"),
        (["--tls-cert", missing, "--tls-key", p("server.key")],
         "--tls-cert %s: cannot open" % missing),
        (["--tls-cert", p("server.crt"), "--tls-key", p("lone.key")],
         "--tls-key %s: does not match the certificate in --tls-cert %s" %
         (p("lone.key"), p("server.crt"))),
        (["--tls-cert", p("server.crt"), "--tls-key", p("garbage.pem")],
         "--tls-key %s: no unencrypted PEM private key" % p("garbage.pem")),
        (["--tls-cert", p("garbage.pem"), "--tls-key", p("server.key")],
         "--tls-cert %s: no PEM certificate" % p("garbage.pem")),
        (tls + ["--tls-client-ca", p("garbage.pem")],
         "--tls-client-ca %s: no PEM certificate" % p("garbage.pem")),
        (["--tls-cert", p("server.crt")], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", p("ca.crt")], "--tls-client-ca needs --tls-cert and --tls-key"),
    ]
    h.refused_all([(args + ["--model", h.spec("lenet5-2.json")], want) for args, want in cases])
    os.chmod(p("server.key"), 0o644)
    h.refused(tls, "--tls-key %s: accessible to other users (mode 0644)" % p("server.key"))
    os.chmod(p("server.key"), 0o600)
    # 4 ranks: every one leaves with the same code.
    h.refused(["--token-file", missing], "cannot open", np=4)
    # And a good file still starts (the refusals above were about the files).
    d = h.start(2, ["--token-file", good] + tls, "good")
    h.expect(d, "shutdown=OK", ca=p("ca.crt"), token=T["admin"])
    d.wait_exit()


def sc_lifecycle_secure(h):
    """client_test's lifecycle scenario (every RPC, streams both ways, threads, deadlines)
    over mutual TLS with an admin token: the whole client API through the secure path."""
    p = h.make_certs()
    tf = h.tokens()
    ck = os.path.join(h.work, "ckpt-lifecycle-secure")
    os.makedirs(ck, exist_ok=True)
    d = h.start(2, ["--queue", "4", "--max-message-bytes", str(8 << 20), "--token-file", tf,
                    "--tls-cert", p("server.crt"), "--tls-key", p("server.key"),
                    "--tls-client-ca", p("ca.crt"), "--checkpoint-dir", ck], "lifecycle_secure")
    env = {"DDL_TLS_CA": p("ca.crt"), "DDL_TLS_CERT": p("client.crt"),
           "DDL_TLS_KEY": p("client.key"), "DDL_TOKEN": TOKENS["admin"],
           "DDL_CHECKPOINT_DIR": ck}
    client_test = os.path.join(h.build, "tests", "client_test")
    for sc in ("health", "lifecycle", "health", "shutdown"):
        h.run(d, [client_test, sc], timeout=150, env_extra=env)
    d.wait_exit()


SCENARIOS = {"lifecycle_secure": sc_lifecycle_secure, "tls": sc_tls, "mtls": sc_mtls, "tokens": sc_tokens, "tls_tokens": sc_tls_tokens,
             "listen": sc_listen, "badfiles": sc_badfiles}

if __name__ == "__main__":
    sys.exit(run_scenarios(Harness, SCENARIOS))
