"""distdld smoke test: start `mpirun -np N distdld --listen 127.0.0.1:0 --address-file F`,
call Health and GetStatus (and the KServe liveness calls) with grpcio, send SIGTERM to rank 0,
and require a graceful exit 0 of every rank.

usage: smoke.py MPIEXEC [mpiexec flags...] -- DISTDLD NP
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import grpc  # noqa: F401
except ImportError:
    print("SKIP: python3-grpcio is not installed")
    sys.exit(7)
import ddld_rpc  # noqa: E402


def main():
    sep = sys.argv.index("--")
    mpiexec = sys.argv[1:sep]
    distdld, np_ = sys.argv[sep + 1], sys.argv[sep + 2]
    tmp = tempfile.mkdtemp(prefix="ddld-smoke-")
    addr_file = os.path.join(tmp, "addr")
    log_path = os.path.join(tmp, "log")
    log = open(log_path, "w")
    cmd = [mpiexec[0], "-np", np_] + mpiexec[1:] + [
        distdld, "--listen", "127.0.0.1:0", "--address-file", addr_file]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    ok = False
    try:
        addr = ddld_rpc.wait_address(addr_file, proc)
        assert re.fullmatch(r"127\.0\.0\.1:\d+", addr), addr
        c = ddld_rpc.Client(addr)
        h = c.health()
        assert h.status == c.he.HealthCheckResponse.SERVING, h
        h = c.health("distdl.v1.Trainer")
        assert h.status == c.he.HealthCheckResponse.SERVING, h
        try:
            c.health("no.such.Service")
            raise AssertionError("unknown health service accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND, e
        st = c.status()
        assert st.world_size == int(np_) and not st.has_model and st.state == "idle", st
        live = c.unary("/inference.GRPCInferenceService/ServerLive", c.inf.ServerLiveRequest(),
                       c.inf.ServerLiveResponse)
        assert live.live
        ready = c.unary("/inference.GRPCInferenceService/ServerReady",
                        c.inf.ServerReadyRequest(), c.inf.ServerReadyResponse)
        assert not ready.ready  # no model yet
        try:
            c.trainer("Step", c.tr.StepRequest(), "StepResponse")
            raise AssertionError("Step without a model succeeded")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        c.ch.close()
        # Graceful shutdown: SIGTERM to rank 0 (its pid is in the "listening" line).
        log.flush()
        m = None
        for _ in range(100):
            m = re.search(r"listening on \S+ \(pid (\d+)\)", open(log_path).read())
            if m:
                break
            time.sleep(0.05)
        assert m, "no 'listening' line"
        os.kill(int(m.group(1)), signal.SIGTERM)
        rc = proc.wait(timeout=60)
        assert rc == 0, "mpirun exit %d" % rc
        ok = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        print(open(log_path).read())
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
