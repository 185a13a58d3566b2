#!/usr/bin/python3
"""A stand-in for distdld written with Debian's python3-grpcio: it speaks the same protos
with simple, known semantics, so the client library's unary, streaming, cancellation,
token and status paths are tested without MPI.

  mock_daemon.py --proto SRC/proto --gen DIR --address-file F [--token T]

Semantics: one fake model; Step counts steps (loss = 1/step); Train streams one record per
step (10 ms each) and stops when the call is cancelled; PullWeights streams the current
weights ("a" FP32 [1000, 700] = i * 0.5, "b" INT64 [3] = [-1, 0, 7]) in 1 MiB chunks;
PushWeights replaces tensors of the same name; Predict returns one-hot logits of class
i % 10 for sample i; every bad shape is INVALID_ARGUMENT with a message.
"""
import argparse
import os
import struct
import subprocess
import sys
import threading
import time
from concurrent import futures


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--proto", required=True)
    p.add_argument("--gen", required=True)
    p.add_argument("--address-file", required=True)
    p.add_argument("--token")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--client-ca", help="require client certificates signed by this CA (mTLS)")
    a = p.parse_args()
    os.makedirs(a.gen, exist_ok=True)
    subprocess.run(["protoc", "-I" + a.proto, "--python_out=" + a.gen,
                    os.path.join(a.proto, "distdl/v1/trainer.proto")], check=True)
    sys.path.insert(0, a.gen)
    import grpc
    from distdl.v1 import trainer_pb2 as tr

    lock = threading.Lock()
    state = {"step": 0, "cancelled_trains": 0,
             "weights": {"a": ("FP32", [1000, 700], struct.pack("<700000f", *[i * 0.5 for i in range(700000)])),
                         "b": ("INT64", [3], struct.pack("<3q", -1, 0, 7))}}

    def auth(ctx):
        if a.token is None:
            return True
        md = dict(ctx.invocation_metadata())
        if md.get("authorization") != "Bearer " + a.token:
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        return True

    def check_x(ctx, x):
        if x is None or list(x.shape[1:]) != [1, 28, 28] or x.datatype not in ("FP32", "UINT8"):
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      "x: expected [n, 1, 28, 28] FP32/UINT8, got %s %s" %
                      (x.datatype if x else "none", list(x.shape) if x else []))
        n = x.shape[0]
        if len(x.raw) != n * 784 * (4 if x.datatype == "FP32" else 1):
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "x: %d raw bytes for shape %s" %
                      (len(x.raw), list(x.shape)))
        return n

    def get_status(req, ctx):
        auth(ctx)
        with lock:
            return tr.GetStatusResponse(has_model=True, model_name="mock", world_size=3,
                                        step=state["step"], state="idle", batch_size=64,
                                        input_shape=[1, 28, 28], num_classes=10, datatype="FP32",
                                        durable_step=state["cancelled_trains"])

    def step(req, ctx):
        auth(ctx)
        check_x(ctx, req.batch.x if req.HasField("batch") else None)
        with lock:
            state["step"] += 1
            s = state["step"]
        return tr.StepResponse(step=s, loss=1.0 / s, accuracy=0.5)

    def train(req, ctx):
        auth(ctx)
        if req.steps <= 0:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "steps must be > 0")
        done = [False]

        def on_end():
            if not done[0]:
                with lock:
                    state["cancelled_trains"] += 1
        ctx.add_callback(on_end)
        for i in range(req.steps):
            if not ctx.is_active():
                return
            time.sleep(0.01)
            with lock:
                state["step"] += 1
                s = state["step"]
            if i + 1 == req.steps:
                done[0] = True
            yield tr.TrainProgress(step=s, done=i + 1, total=req.steps, loss=1.0 / s,
                                   finished=(i + 1 == req.steps))

    def pull(req, ctx):
        auth(ctx)
        with lock:
            w = dict(state["weights"])
        for name in sorted(w):
            dt, shape, raw = w[name]
            yield tr.WeightChunk(name=name, datatype=dt, shape=shape, offset=0, first=True,
                                 data=raw[:1 << 20])
            for off in range(1 << 20, len(raw), 1 << 20):
                yield tr.WeightChunk(offset=off, data=raw[off:off + (1 << 20)])

    def push(it, ctx):
        auth(ctx)
        got, cur = {}, None
        nbytes = 0
        for ch in it:
            if ch.first:
                cur = ch.name
                got[cur] = [ch.datatype, list(ch.shape), bytearray()]
            if cur is None or ch.offset != len(got[cur][2]):
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "chunk at offset %d" % ch.offset)
            got[cur][2] += ch.data
            nbytes += len(ch.data)
        with lock:
            for k, v in got.items():
                state["weights"][k] = (v[0], v[1], bytes(v[2]))
        return tr.PushWeightsResponse(tensors=len(got), bytes=nbytes)

    def submit(it, ctx):
        auth(ctx)
        n = 0
        for b in it:
            check_x(ctx, b.x)
            n += 1
        return tr.SubmitBatchResponse(accepted=n, queue_depth=n)

    def predict(req, ctx):
        auth(ctx)
        n = check_x(ctx, req.x)
        z = [1.0 if j == i % 10 else 0.0 for i in range(n) for j in range(10)]
        return tr.PredictResponse(logits=tr.Tensor(name="logits", datatype="FP32", shape=[n, 10],
                                                   raw=struct.pack("<%df" % len(z), *z)))

    def evaluate(req, ctx):
        auth(ctx)
        if req.dataset == "missing":
            ctx.abort(grpc.StatusCode.NOT_FOUND, "dataset 'missing' not found")
        return tr.EvaluateResponse(count=10000, loss=0.5, accuracy=0.75)

    def h(kind, fn, req_cls, resp_cls):
        ser = lambda m: m.SerializeToString()
        return kind(fn, request_deserializer=req_cls.FromString, response_serializer=ser)

    handlers = {
        "GetStatus": h(grpc.unary_unary_rpc_method_handler, get_status, tr.GetStatusRequest, tr.GetStatusResponse),
        "Step": h(grpc.unary_unary_rpc_method_handler, step, tr.StepRequest, tr.StepResponse),
        "Train": h(grpc.unary_stream_rpc_method_handler, train, tr.TrainRequest, tr.TrainProgress),
        "PullWeights": h(grpc.unary_stream_rpc_method_handler, pull, tr.PullWeightsRequest, tr.WeightChunk),
        "PushWeights": h(grpc.stream_unary_rpc_method_handler, push, tr.WeightChunk, tr.PushWeightsResponse),
        "SubmitBatch": h(grpc.stream_unary_rpc_method_handler, submit, tr.Batch, tr.SubmitBatchResponse),
        "Predict": h(grpc.unary_unary_rpc_method_handler, predict, tr.PredictRequest, tr.PredictResponse),
        "Evaluate": h(grpc.unary_unary_rpc_method_handler, evaluate, tr.EvaluateRequest, tr.EvaluateResponse),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_receive_message_length", 16 << 20)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("distdl.v1.Trainer", handlers),))
    if a.tls_cert:
        def rd(path):
            with open(path, "rb") as f:
                return f.read()
        creds = grpc.ssl_server_credentials(
            [(rd(a.tls_key), rd(a.tls_cert))],
            root_certificates=rd(a.client_ca) if a.client_ca else None,
            require_client_auth=bool(a.client_ca))
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = a.address_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("127.0.0.1:%d\n" % port)
    os.rename(tmp, a.address_file)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
