"""Python grpcio helpers for talking to distdld in tests (Debian's /usr/bin/python3).

Generates the message classes with `protoc --python_out` into a temporary directory and
loads them by file path (the generated `grpc/health/...` package would otherwise shadow
grpcio's own `grpc` module). Calls go by method path, with no generated service stubs.
"""
import importlib.util
import os
import subprocess
import tempfile

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto")


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_protos():
    out = tempfile.mkdtemp(prefix="ddld-py-")
    files = ["distdl/v1/trainer.proto", "grpc/health/v1/health.proto",
             "inference/grpc_service.proto"]
    subprocess.run(["protoc", "-I" + PROTO, "--python_out=" + out] + files, check=True)
    tr = _load(os.path.join(out, "distdl/v1/trainer_pb2.py"), "ddld_trainer_pb2")
    he = _load(os.path.join(out, "grpc/health/v1/health_pb2.py"), "ddld_health_pb2")
    inf = _load(os.path.join(out, "inference/grpc_service_pb2.py"), "ddld_inference_pb2")
    return tr, he, inf


class Client:
    def __init__(self, target, max_bytes=256 << 20, options=()):
        self.tr, self.he, self.inf = load_protos()
        self.ch = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes)] + list(options))

    def unary(self, path, req, resp_cls, timeout=60):
        f = self.ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def server_stream(self, path, req, resp_cls, timeout=600):
        f = self.ch.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def client_stream(self, path, reqs, resp_cls, timeout=600):
        f = self.ch.stream_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=resp_cls.FromString)
        return f(reqs, timeout=timeout)

    # Trainer
    def trainer(self, method, req, resp_name, **kw):
        return self.unary("/distdl.v1.Trainer/" + method, req, getattr(self.tr, resp_name), **kw)

    def status(self):
        return self.trainer("GetStatus", self.tr.GetStatusRequest(), "GetStatusResponse")

    def health(self, service=""):
        return self.unary("/grpc.health.v1.Health/Check",
                          self.he.HealthCheckRequest(service=service),
                          self.he.HealthCheckResponse)


def wait_address(path, proc, timeout=60):
    import time
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(path):
            return open(path).read().strip()
        if proc.poll() is not None:
            raise RuntimeError("distdld exited with %s before serving" % proc.returncode)
        time.sleep(0.05)
    raise RuntimeError("no address file after %ss" % timeout)
